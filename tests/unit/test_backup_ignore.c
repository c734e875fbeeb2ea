/*
 * test_backup_ignore.c — git's ignore rules as backup.create's `gitignore`
 * applies them (container/backup_ignore.h; gitignore(5)).
 *
 * The matcher against gitignore(5)'s own examples (`*`, `?`, classes, `**`
 * at the start, middle and end, `\` quoting), and the rules of a real tree
 * on disk: nested .gitignore files, negation, directory-only patterns,
 * anchored patterns, .git/info/exclude, a parent repository's .gitignore
 * seen from a walk of a subdirectory, a re-include under an ignored
 * directory that git refuses too, a walk of a directory the repository
 * ignores (everything in it is), and `.git` never ignored.  Where git is
 * installed the tree's answers are compared with `git check-ignore`'s.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../container/backup_ignore.h"
#include "../../runtime/util.h"

Test(backup_ignore, wildmatch)
{
    struct {
        const char *pat, *path;
        bool want;
    } cases[] = {
        {"*.log", "a.log", true},
        {"*.log", "a.logx", false},
        {"*.log", "d/a.log", false}, /* '*' never crosses '/' */
        {"a?c", "abc", true},
        {"a?c", "a/c", false},
        {"[a-c]x", "bx", true},
        {"[!a-c]x", "bx", false},
        {"[^a-c]x", "dx", true},
        {"[[:digit:]]*", "7up", true},
        {"[[:digit:]]*", "up", false},
        {"[]]", "]", true},
        {"[abc", "a", false}, /* malformed: no match */
        {"\\*", "*", true},
        {"\\*", "a", false},
        {"\\!keep", "!keep", true},
        {"**/foo", "foo", true},
        {"**/foo", "a/b/foo", true},
        {"**/foo/bar", "x/foo/bar", true},
        {"abc/**", "abc/x/y", true},
        {"abc/**", "abc", false},
        {"a/**/b", "a/b", true},
        {"a/**/b", "a/x/y/b", true},
        {"a/**/b", "a/x/y/c", false},
        {"a**b", "axxb", true}, /* not between slashes: a plain '*' */
        {"a**b", "ax/xb", false},
        {"doc/frotz", "doc/frotz", true},
        {"doc/frotz", "a/doc/frotz", false},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_expect_eq(sbx_gi_wildmatch(cases[i].pat, cases[i].path), cases[i].want,
                     "wildmatch('%s', '%s') should be %d", cases[i].pat, cases[i].path,
                     cases[i].want);
}

static char top[64];

static void
put(const char *rel, const char *text)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/%s", top, rel);
    char *sl = strrchr(p, '/');
    *sl = '\0';
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", p);
    cr_assert_eq(system(cmd), 0);
    *sl = '/';
    FILE *f = fopen(p, "w");
    cr_assert(f, "%s", p);
    fputs(text, f);
    fclose(f);
}

static void
setup(void)
{
    snprintf(top, sizeof(top), "/tmp/sbx-gi-XXXXXX");
    cr_assert_not_null(mkdtemp(top));
}

static void
teardown(void)
{
    sbx_rm_rf(top);
}

/* The repository of the tests: a .git dir (info/exclude), nested ignores. */
static void
make_repo(void)
{
    put(".git/info/exclude", "# local\n*.tmp\n");
    put(".git/HEAD", "ref: refs/heads/main\n");
    put(".gitignore", "*.log\n!keep.log\nnode_modules/\n/rootonly\nbuild/\nsub/gen/\n"
                      "trailing-space\\ \n\\#hash\n");
    put("sub/.gitignore", "!x.log\n*.o\nout\n");
    put("sub/deeper/.gitignore", "!*.o\n");
    put("build/.gitignore", "!keep\n");
}

struct want {
    const char *rel;
    bool dir, ignored;
};

static const struct want repo_wants[] = {
    {"a.log", false, true},
    {"keep.log", false, false},
    {"sub/a.log", false, true},
    {"sub/x.log", false, false},       /* a deeper file's negation wins */
    {"sub/keep.log", false, false},
    {"node_modules", true, true},
    {"sub/node_modules", true, true},
    {"node_modules", false, false},    /* a file: the pattern is for directories */
    {"rootonly", false, true},
    {"sub/rootonly", false, false},    /* anchored to the root's .gitignore */
    {"sub/gen", true, true},           /* a pattern with a '/' in the middle */
    {"sub/a.o", false, true},
    {"sub/deeper/a.o", false, false},
    {"sub/out", true, true},
    {"sub/out", false, true},
    {"out", false, false},             /* sub's pattern does not reach up */
    {"x.tmp", false, true},            /* .git/info/exclude */
    {"sub/x.tmp", false, true},
    {"trailing-space ", false, true},  /* "\ " keeps the space */
    {"#hash", false, true},
    {".gitignore", false, false},
    {".git", true, false},             /* never */
    {".git/x.log", false, false},
    {"src/main.c", false, false},
};

static void
check(const char *root, const struct want *w, size_t n)
{
    sbx_gi *g = NULL;
    cr_assert_eq(sbx_gi_open(root, &g), 0);
    for (size_t i = 0; i < n; i++)
        cr_expect_eq(sbx_gi_ignored(g, w[i].rel, w[i].dir), w[i].ignored,
                     "%s%s: ignored should be %d", w[i].rel, w[i].dir ? "/" : "", w[i].ignored);
    sbx_gi_free(g);
}

Test(backup_ignore, a_repository, .init = setup, .fini = teardown)
{
    make_repo();
    cr_assert_eq(chdir(top), 0);
    check(top, repo_wants, sizeof(repo_wants) / sizeof(repo_wants[0]));
    /* The same answers in another order (not depth-first). */
    sbx_gi *g = NULL;
    cr_assert_eq(sbx_gi_open(top, &g), 0);
    cr_expect(!sbx_gi_ignored(g, "sub/deeper/a.o", false));
    cr_expect(sbx_gi_ignored(g, "a.log", false));
    cr_expect(sbx_gi_ignored(g, "sub/a.o", false));
    cr_expect(!sbx_gi_ignored(g, "sub/deeper/a.o", false));
    sbx_gi_free(g);

    /* git itself agrees, where it is installed (paths that exist). */
    if (system("git --version >/dev/null 2>&1") != 0)
        return;
    put("sub/deeper/a.o", "");
    put("sub/a.o", "");
    put("sub/x.log", "");
    put("a.log", "");
    put("keep.log", "");
    put("x.tmp", "");
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "cd %s && rm -rf .git && git init -q . && printf '*.tmp\\n' > .git/info/exclude && "
             "git check-ignore -q sub/a.o && git check-ignore -q a.log && "
             "git check-ignore -q x.tmp && ! git check-ignore -q sub/deeper/a.o && "
             "! git check-ignore -q sub/x.log && ! git check-ignore -q keep.log",
             top);
    cr_expect_eq(system(cmd), 0, "git check-ignore disagrees: %s", cmd);
}

/* A walk of a subdirectory of a repository sees the .gitignore files above
 * it (relative to their own directories) and the repository's exclude. */
Test(backup_ignore, a_subdirectory_of_a_repository, .init = setup, .fini = teardown)
{
    make_repo();
    put("sub/gen/x.c", "");
    char root[128];
    snprintf(root, sizeof(root), "%s/sub", top);
    cr_assert_eq(chdir(root), 0);
    const struct want w[] = {
        {"gen", true, true},  /* the root's "sub/gen/" */
        {"a.log", false, true},
        {"x.log", false, false},
        {"x.tmp", false, true},
        {"deeper/a.o", false, false},
        {"a.o", false, true},
        {"rootonly", false, false},
        {"c.txt", false, false},
    };
    check(root, w, sizeof(w) / sizeof(w[0]));
}

/* A walk of a directory that the repository ignores (or one under it):
 * git ignores everything there, whatever its own .gitignore says. */
Test(backup_ignore, an_ignored_directory_of_a_repository, .init = setup, .fini = teardown)
{
    make_repo();
    put("build/sub/.gitignore", "!*\n");
    put("build/sub/x.c", "");
    put("src/kept/.gitignore", "*.c\n");
    char root[128];
    snprintf(root, sizeof(root), "%s/build/sub", top);
    cr_assert_eq(chdir(root), 0);
    const struct want w[] = {
        {"x.c", false, true},
        {"d", true, true},
        {".gitignore", false, true},
    };
    check(root, w, sizeof(w) / sizeof(w[0]));
    /* A directory that is not ignored is walked by the usual rules. */
    snprintf(root, sizeof(root), "%s/src/kept", top);
    cr_assert_eq(chdir(root), 0);
    const struct want w2[] = {
        {"x.c", false, true},
        {"x.h", false, false},
        {"y.log", false, true},
    };
    check(root, w2, sizeof(w2) / sizeof(w2[0]));
}

/* Without a repository the walk's root is the top: its .gitignore files
 * apply, an ancestor's do not. */
Test(backup_ignore, no_repository, .init = setup, .fini = teardown)
{
    put(".gitignore", "*.log\n");
    put("plain/.gitignore", "dist/\n!b.log\n");
    char root[128];
    snprintf(root, sizeof(root), "%s/plain", top);
    cr_assert_eq(chdir(root), 0);
    const struct want w[] = {
        {"dist", true, true},
        {"a.log", false, false}, /* the parent's *.log is not the tree's */
        {"b.log", false, false},
        {"x/dist", true, true},
    };
    check(root, w, sizeof(w) / sizeof(w[0]));
}
