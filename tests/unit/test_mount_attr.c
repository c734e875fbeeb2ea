/*
 * test_mount_attr.c — unit tests for the agent's mount attributes
 * (container/agent/mount_attr.c): agent_mount_attr (mount_setattr(2)) and
 * agent_remount_attr, its fallback for kernels before 5.12, which this
 * kernel would never take on its own.
 *
 * Each test builds, in a child with a mount namespace of its own (the host's
 * mounts untouched; gone with the child), a tree under a fresh tmpfs:
 *
 *   T/top            a bind of T/src on itself (the tree's root mount)
 *   T/top/file       a file bound over a file
 *   T/top/d/nested   a directory bound in a directory …
 *   T/top/d/nested/deeper   … and one more below it
 *   T/top/with space        a mount point whose mountinfo line escapes it
 *   T/top2           a sibling whose path starts like T/top: not below it
 *   T/top/sub        a mount made before T/top was bound: hidden under it,
 *                    not in its tree (its name is below T/top; the
 *                    fallback once remounted by name and failed on it)
 *   T/top/d/nested/deeper is made noexec first: setting attributes keeps
 *                    what a mount has
 *
 * and then checks every mount's options in /proc/self/mountinfo (proc(5))
 * and that writing into the tree fails with EROFS.  Needs root
 * (CAP_SYS_ADMIN for the mount namespace), as the suite runs.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <stddef.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "container/agent/agent.h"

#define ALL (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)

/* The options (field 6) of the mount at mount point mp; "" when not one. */
static void
opts_of(const char *mp, char *out, size_t n)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return;
    char line[4096], want[1024];
    /* mountinfo escapes a space as \040 */
    size_t w = 0;
    for (const char *p = mp; *p && w + 5 < sizeof(want); p++) {
        if (*p == ' ') {
            memcpy(want + w, "\\040", 4);
            w += 4;
        } else {
            want[w++] = *p;
        }
    }
    want[w] = '\0';
    while (fgets(line, sizeof(line), f)) {
        char *save = NULL, *fld[6] = {0};
        char *t = strtok_r(line, " ", &save);
        for (int i = 0; t && i < 6; i++, t = strtok_r(NULL, " ", &save))
            fld[i] = t;
        if (fld[4] && fld[5] && !strcmp(fld[4], want))
            snprintf(out, n, ",%s,", fld[5]); /* the last mount there wins */
    }
    fclose(f);
}

static bool
has(const char *opts, const char *o)
{
    char k[32];
    snprintf(k, sizeof(k), ",%s,", o);
    return strstr(opts, k) != NULL;
}

#define CHECK(cond, ...)                                                                   \
    do {                                                                                   \
        if (!(cond)) {                                                                     \
            dprintf(out, __VA_ARGS__);                                                     \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)

static int
mkfile(const char *p)
{
    int fd = open(p, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* In the child: build the tree under T, set attributes with fn, check.
 * 0, or 1 with the failure written to out. */
static int
child(int out, const char *T, int (*fn)(const char *, uint64_t, bool), bool recursive,
      bool no_setattr)
{
    char p[512], q[512];
    CHECK(unshare(CLONE_NEWNS) == 0, "unshare: %s", strerror(errno));
    CHECK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0, "private: %s", strerror(errno));
    CHECK(mount("tmpfs", T, "tmpfs", 0, "size=1m") == 0, "tmpfs: %s", strerror(errno));
    static const char *const dirs[] = {"src",       "src/d",          "src/d/nested",
                                       "src/d/nested/deeper", "src/with space", "src/sub",
                                       "top",       "top/sub",        "top2",
                                       "other",     "other/deeper",   "spacesrc"};
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", T, dirs[i]);
        CHECK(mkdir(p, 0755) == 0, "mkdir %s: %s", p, strerror(errno));
    }
    snprintf(p, sizeof(p), "%s/src/file", T);
    CHECK(mkfile(p) == 0, "file");
    snprintf(p, sizeof(p), "%s/hostfile", T);
    CHECK(mkfile(p) == 0, "hostfile");
    /* top: src bound; then binds inside it (from, to: under T) */
    static const char *const binds[][2] = {
        {"spacesrc", "top/sub"},  {"src", "top"},           {"hostfile", "top/file"},
        {"other", "top/d/nested"}, {"spacesrc", "top/d/nested/deeper"},
        {"spacesrc", "top/with space"}, {"spacesrc", "top2"},
    };
    for (size_t i = 0; i < sizeof(binds) / sizeof(binds[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", T, binds[i][0]);
        snprintf(q, sizeof(q), "%s/%s", T, binds[i][1]);
        CHECK(mount(p, q, NULL, MS_BIND, NULL) == 0, "bind %s: %s", binds[i][1], strerror(errno));
    }
    snprintf(q, sizeof(q), "%s/top/d/nested/deeper", T);
    CHECK(mount(NULL, q, NULL, MS_REMOUNT | MS_BIND | MS_NOEXEC, NULL) == 0, "noexec: %s",
          strerror(errno));

    if (no_setattr) {
        /* mount_setattr answers ENOSYS, as on a kernel before 5.12 */
        struct sock_filter flt[] = {
            BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
            BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_mount_setattr, 0, 1),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
            BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        };
        struct sock_fprog prog = {.len = sizeof(flt) / sizeof(flt[0]), .filter = flt};
        CHECK(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 &&
                  syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0,
              "seccomp: %s", strerror(errno));
        CHECK(syscall(SYS_mount_setattr, AT_FDCWD, T, 0, NULL, 0) < 0 && errno == ENOSYS,
              "mount_setattr still there");
    }
    snprintf(q, sizeof(q), "%s/top", T);
    int rc = fn(q, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, recursive);
    CHECK(rc == 0, "set attributes: %s", strerror(-rc));

    char o[512];
    static const char *const below[] = {"top/file", "top/d/nested", "top/d/nested/deeper",
                                        "top/with space"};
    opts_of(q, o, sizeof(o));
    CHECK(has(o, "ro") && has(o, "nosuid") && has(o, "nodev"), "top: %s", o);
    for (size_t i = 0; i < sizeof(below) / sizeof(below[0]); i++) {
        snprintf(p, sizeof(p), "%s/%s", T, below[i]);
        opts_of(p, o, sizeof(o));
        CHECK(o[0], "%s is no mount", below[i]);
        if (recursive)
            CHECK(has(o, "ro") && has(o, "nosuid") && has(o, "nodev"), "%s: %s", below[i], o);
        else
            CHECK(has(o, "rw") && !has(o, "nosuid"), "%s changed without recursion: %s", below[i],
                  o);
    }
    snprintf(p, sizeof(p), "%s/top/d/nested/deeper", T);
    opts_of(p, o, sizeof(o));
    CHECK(has(o, "noexec"), "deeper lost its noexec: %s", o);
    snprintf(p, sizeof(p), "%s/top2", T);
    opts_of(p, o, sizeof(o));
    CHECK(has(o, "rw") && !has(o, "nosuid"), "top2, not below top, changed: %s", o);
    snprintf(p, sizeof(p), "%s/top/sub", T);
    opts_of(p, o, sizeof(o));
    CHECK(has(o, "rw") && !has(o, "nosuid"), "the mount hidden under top changed: %s", o);

    /* What a writer sees. */
    snprintf(p, sizeof(p), "%s/top/new", T);
    CHECK(mkfile(p) < 0 && errno == EROFS, "top writable (%s)", strerror(errno));
    snprintf(p, sizeof(p), "%s/top/d/nested/new", T);
    if (recursive)
        CHECK(mkfile(p) < 0 && errno == EROFS, "nested writable (%s)", strerror(errno));
    else
        CHECK(mkfile(p) == 0, "nested not writable without recursion (%s)", strerror(errno));
    return 0;
}

/* Run child() in a forked process; its failure message, if any, fails the test. */
static void
run(int (*fn)(const char *, uint64_t, bool), bool recursive, bool no_setattr)
{
    char T[] = "/tmp/sbx-mntattr-XXXXXX";
    cr_assert_not_null(mkdtemp(T));
    int pfd[2];
    cr_assert_eq(pipe(pfd), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(pfd[0]);
        _exit(child(pfd[1], T, fn, recursive, no_setattr));
    }
    close(pfd[1]);
    char msg[1024] = "";
    ssize_t n = read(pfd[0], msg, sizeof(msg) - 1);
    msg[n > 0 ? n : 0] = '\0';
    close(pfd[0]);
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    rmdir(T); /* the tmpfs went with the child's mount namespace */
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s", msg[0] ? msg : "child died");
}

Test(mount_attr, mount_setattr_reaches_every_mount_below)
{
    run(agent_mount_attr, true, false);
}

Test(mount_attr, the_remount_fallback_reaches_every_mount_below)
{
    run(agent_remount_attr, true, false);
}

/* agent_mount_attr itself takes the fallback where mount_setattr is ENOSYS. */
Test(mount_attr, without_mount_setattr_the_call_falls_back)
{
    run(agent_mount_attr, true, true);
    run(agent_mount_attr, false, true);
}

Test(mount_attr, without_recursion_only_the_top_changes)
{
    run(agent_mount_attr, false, false);
    run(agent_remount_attr, false, false);
}
