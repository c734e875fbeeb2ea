#!/usr/bin/env python3
"""tools/gitignore_diff.py [N] [SEED] — compare backup.create's gitignore
matcher (container/backup_ignore.c) with git itself on N random trees
(default 1000 each way, from SEED, default 0).

Each tree is a git repository of random files and directories with random
nested .gitignore files and .git/info/exclude lines drawn from PATTERNS;
the files git lists as ignored (`git ls-files --others --ignored
--exclude-standard`) must be exactly those the matcher leaves out, walked
from the top and from a random subdirectory.  Prints the differing trees
(kept under the temporary directory for a look) and exits 1 if any.
Needs cc and git; writes only under a new temporary directory, removed at
the end when nothing differed.  docs/persistence.md, "Backups".
"""
import os
import random
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = ["a", "b", "c.log", "d.o", "keep.log", "node_modules", "build", "x.txt", "tests", "foo"]
PATTERNS = ["*.log", "!keep.log", "node_modules/", "/build", "build/", "*.o", "!d.o", "a/",
            "b/c.log", "**/foo", "a/**/x.txt", "foo/**", "!*.txt", "[ab]", "?.o", "\\#x", "tests",
            "*/x.txt", "!/a", "c*", "/*.log", "!b/", "b/*", "[!a]*", "**/node_modules/**",
            "!**/keep.log", "x.txt/", "*", "!a", "a/b", "**/b/**/c.log", "# comment"]

# The driver: argv[1] the walk's root; stdin "d PATH" / "f PATH" lines in
# walk order; prints the files left out (ignored, or under an ignored dir).
DRIVER = r"""
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include "container/backup_ignore.h"
int main(int argc, char **argv) {
    if (argc != 2 || chdir(argv[1])) return 2;
    sbx_gi *g;
    if (sbx_gi_open(argv[1], &g)) return 3;
    static char line[4096], ign[4096][256];
    int ni = 0;
    while (fgets(line, sizeof line, stdin)) {
        line[strcspn(line, "\n")] = 0;
        const char *p = line + 2;
        int isdir = line[0] == 'd', under = 0;
        for (int i = 0; i < ni && !under; i++) {
            size_t l = strlen(ign[i]);
            under = !strncmp(p, ign[i], l) && p[l] == '/';
        }
        if (under || sbx_gi_ignored(g, p, isdir)) {
            if (!isdir) printf("%s\n", p);
            else if (!under && ni < 4096) snprintf(ign[ni++], 256, "%s", p);
        }
    }
    sbx_gi_free(g);
    return 0;
}
"""


def make_tree(r, root):
    subprocess.run(["git", "init", "-q", root], check=True)
    dirs = [""]
    for _ in range(r.randint(10, 40)):
        parent = r.choice(dirs)
        p = os.path.join(parent, r.choice(NAMES)) if parent else r.choice(NAMES)
        if os.path.lexists(os.path.join(root, p)):
            continue
        if r.random() < 0.4 and p.count("/") < 3:
            os.makedirs(os.path.join(root, p))
            dirs.append(p)
        else:
            with open(os.path.join(root, p), "w") as f:
                f.write("x")
    for d in dirs:
        if r.random() < 0.6:
            with open(os.path.join(root, d, ".gitignore"), "w") as f:
                for _ in range(r.randint(1, 5)):
                    f.write(r.choice(PATTERNS) + "\n")
    if r.random() < 0.5:
        with open(os.path.join(root, ".git/info/exclude"), "a") as f:
            f.write(r.choice(PATTERNS) + "\n")
    return dirs


def walk_lines(root):
    lines = []
    for dp, dn, fn in os.walk(root):
        if ".git" in dn:
            dn.remove(".git")
        rel = os.path.relpath(dp, root)
        for n in sorted(dn):
            lines.append("d " + (n if rel == "." else rel + "/" + n))
        for n in sorted(fn):
            lines.append("f " + (n if rel == "." else rel + "/" + n))
    return "\n".join(lines) + "\n"


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    seed0 = int(sys.argv[2]) if len(sys.argv) > 2 else 0
    tmp = tempfile.mkdtemp(prefix="sbx-gitignore-diff-")
    drv = os.path.join(tmp, "drv")
    with open(drv + ".c", "w") as f:
        f.write(DRIVER)
    subprocess.run(["cc", "-std=c17", "-D_GNU_SOURCE", "-I", REPO, "-o", drv, drv + ".c",
                    os.path.join(REPO, "container/backup_ignore.c")], check=True)
    bad = 0
    for seed in range(seed0, seed0 + n):
        for from_sub in (False, True):
            r = random.Random(seed * 2 + from_sub)
            top = os.path.join(tmp, "t%d%s" % (seed, "s" if from_sub else ""))
            os.makedirs(top)
            dirs = make_tree(r, top)
            subs = [d for d in dirs if d]
            root = os.path.join(top, r.choice(subs)) if from_sub and subs else top
            out = subprocess.run(["git", "-C", root, "ls-files", "-o", "-i", "--exclude-standard",
                                  "-z"], capture_output=True, check=True).stdout.decode()
            git = {x for x in out.split("\0") if x}
            out = subprocess.run([drv, root], input=walk_lines(root), capture_output=True,
                                 text=True, check=True).stdout
            ours = {x for x in out.split("\n") if x}
            if ours != git:
                bad += 1
                print("%s: only git leaves out %s; only sbx %s" %
                      (root, sorted(git - ours), sorted(ours - git)))
            else:
                shutil.rmtree(top)
    print("%d trees, %d differ" % (2 * n, bad))
    if not bad:
        shutil.rmtree(tmp)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
