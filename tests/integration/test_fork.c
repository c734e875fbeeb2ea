/*
 * test_fork.c — sandbox.fork, DISK_FULL and the per-sandbox disk size
 * (docs/persistence.md, "Fork" and "Disk size and DISK_FULL"; issue 15).
 *
 * Checks what a user would:
 *  - a fork sees the source's files: a git repository with history built
 *    in the source has the same sha256 of every file and the same log in
 *    each fork; writes in a fork are invisible to the source and to the
 *    other fork, and the source's later writes are invisible to the forks;
 *    the forks survive the shard's kill -9 and the source's destroy;
 *  - a fork of a source whose process keeps appending lines is consistent:
 *    its image is fsck-clean before its first start, and every line of the
 *    file is complete;
 *  - a fork to an existing ID is SANDBOX_EXISTS (and nothing is created),
 *    of an unknown source SANDBOX_NOT_FOUND, of an ephemeral source
 *    VALIDATION_FAILED; with two shards, a fork owned by the other shard
 *    is made too (staged by the source's shard, adopted by its owner), and
 *    one into an existing sandbox of the other shard is SANDBOX_EXISTS with
 *    the same call's other fork undone and no staged copy left;
 *  - DISK_FULL: file.write into a full workspace answers DISK_FULL with the
 *    limit in its message, over nng and over HTTP (507), file.mkdir too,
 *    and a neighbour still writes;
 *  - `disk` in create sizes the workspace (status limitBytes, df inside,
 *    a write past it fails), past --disk-max or without a persistent
 *    workspace it is VALIDATION_FAILED.
 *
 * The fork tests start their own daemon (two shards, --disk 64M); the
 * DISK_FULL tests use the test binary's daemon (tests/support/itest_main.c).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/loop.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/shard_of.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"

static struct testd *live;
static char frozen_img[600]; /* the image of a file system a test froze: thawed by the fini */
static struct stat frozen_st; /* its stat (the path may not resolve once its shard is gone) */

static void mounted_path(const struct stat *img, char *out, size_t n);

#ifndef FIFREEZE
#define FIFREEZE _IOWR('X', 119, int)
#define FITHAW _IOWR('X', 120, int)
#endif

static void
cleanup(void)
{
    if (frozen_img[0]) {
        /* Through whichever process has it mounted now. */
        char path[4500];
        mounted_path(&frozen_st, path, sizeof(path));
        int fd = path[0] ? open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
        if (fd >= 0) {
            ioctl(fd, FITHAW, 0);
            close(fd);
        }
        frozen_img[0] = '\0';
    }
    if (live) {
        testd_stop(live);
        free(live);
        live = NULL;
    }
}

TestSuite(fork, .fini = cleanup, .timeout = 300);

/* A private daemon of two shards; a client of it. */
static sbx_client *
start(void)
{
    const char *const extra[] = {TESTD_SMALL, NULL};
    live = calloc(1, sizeof(*live));
    cr_assert_eq(testd_start(live, 2, extra), 0, "the daemon did not start");
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    return c;
}

/* op with JSON args; the result's JSON (heap), or NULL with code[64] and msg. */
static char *
call_msg(sbx_client *c, const char *op, const char *id, const char *args, char code[64],
         char *msg, size_t msglen)
{
    sbx_reply *r = NULL;
    sbx_error err;
    code[0] = 0;
    if (sbx_call_json(c, op, id, args, 120000, &r, &err) != 0) {
        snprintf(code, 64, "%s", err.code);
        if (msg)
            snprintf(msg, msglen, "%s", err.message);
        sbx_error_free(&err);
        return NULL;
    }
    char *j = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return j;
}

static char *
call(sbx_client *c, const char *op, const char *id, const char *args, char code[64])
{
    return call_msg(c, op, id, args, code, NULL, 0);
}

static void
ok(sbx_client *c, const char *op, const char *id, const char *args)
{
    char code[64], msg[512] = "";
    char *j = call_msg(c, op, id, args, code, msg, sizeof(msg));
    cr_assert(j, "%s %s %s: %s %s", op, id, args, code, msg);
    free(j);
}

/* Run cmd; its stdout (heap), exit code in *code.  Retries while the
 * shard is away (after its kill) for up to 60 s. */
static char *
sh(sbx_client *c, const char *id, const char *cmd, int *code)
{
    char why[768];
    char *out = test_sh_out(c, id, cmd, 60000, code, why, sizeof(why));
    cr_assert(out, "%s", why);
    return out;
}

/* The shard of the 2-shard `live` deployment that owns id (0 or 1). */
static int
owner(const char *id)
{
    return test_shard_of(live->name, 2, id);
}

/* A new ID owned by shard `want` (same == true) or by the other one. */
static char *
id_on(const char *prefix, int src_shard, bool same)
{
    for (int i = 0; i < 1000; i++) {
        char *id = test_id(prefix);
        if ((owner(id) == src_shard) == same)
            return id;
        free(id);
    }
    cr_assert_fail("no ID found on the wanted shard");
    return NULL;
}

/* The checksums of every file of the repository and its log, as seen in id. */
#define TREE_SUMS                                                                                 \
    "cd /workspace/repo && find . -type f | LC_ALL=C sort | xargs sha256sum && "                \
    "git log --format='%H %s' && git status --porcelain | wc -l"

Test(fork, copies_the_workspace_and_forks_are_independent)
{
    sbx_client *c = start();
    char *src = test_id("fks");
    int s = owner(src);
    /* One fork on the source's shard, one on the other (staged and adopted). */
    char *f1 = id_on("fka", s, true), *f2 = id_on("fkb", s, false);
    ok(c, "create", src, "{\"workspace\":\"persistent\"}");
    int code;
    /* A real tree: a git repository with history and a binary file. */
    char *out = sh(c, src,
                   "(mkdir -p /workspace/repo && cd /workspace/repo && git init -q && "
                   "git config user.email t@t && git config user.name t && "
                   "for i in 1 2 3 4 5; do seq $i 5000 > f$i.txt && mkdir -p d$i && "
                   "head -c 200000 /dev/urandom > d$i/blob && git add -A && git commit -qm c$i "
                   "|| exit 1; done)",
                   &code);
    cr_assert_eq(code, 0, "building the repository: %s", out);
    free(out);
    char *want = sh(c, src, TREE_SUMS, &code);
    cr_assert_eq(code, 0);
    cr_assert(strstr(want, " c5\n") && strstr(want, "./d3/blob"), "the tree: %s", want);

    char args[256], cd[64], msg[512] = "";
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\",\"%s\"]}", f1, f2);
    char *res = call_msg(c, "sandbox.fork", src, args, cd, msg, sizeof(msg));
    cr_assert(res, "sandbox.fork: %s %s", cd, msg);
    cr_assert(strstr(res, f1) && strstr(res, f2), "the answer: %s", res);
    free(res);

    /* Each fork: the same files, the same history, persistent, its own image. */
    const char *forks[] = {f1, f2};
    for (int i = 0; i < 2; i++) {
        char *got = sh(c, forks[i], TREE_SUMS, &code);
        cr_assert_eq(code, 0);
        cr_assert_str_eq(got, want, "fork %s differs from its source", forks[i]);
        free(got);
        char *st = call(c, "status", forks[i], "{}", cd);
        cr_assert(st && strstr(st, "\"mode\":\"persistent\""), "status: %s", st ? st : cd);
        free(st);
        char img[512];
        struct stat sb;
        snprintf(img, sizeof(img), "%s/s%d/workspaces/%s/disk.img", live->dir, owner(forks[i]),
                 forks[i]);
        cr_assert_eq(stat(img, &sb), 0, "no image at %s", img);
    }

    /* Independent: a write in a fork is seen neither by the source nor by
     * the other fork; the source's by neither fork. */
    free(sh(c, f1, "echo one > /workspace/repo/only-f1 && cd /workspace/repo && "
                   "echo changed >> f1.txt && git commit -qam in-f1", &code));
    cr_assert_eq(code, 0);
    free(sh(c, src, "echo src > /workspace/repo/only-src", &code));
    out = sh(c, src, "ls /workspace/repo/only-f1 2>&1; git -C /workspace/repo log -1 --format=%s",
             &code);
    cr_assert(strstr(out, "No such file") && strstr(out, "c5\n"), "the source sees: %s", out);
    free(out);
    out = sh(c, f2, "ls /workspace/repo/only-f1 /workspace/repo/only-src 2>&1 | grep -c 'No such'",
             &code);
    cr_assert_str_eq(out, "2\n", "the second fork sees the others' files");
    free(out);
    out = sh(c, f1, "ls /workspace/repo/only-src 2>&1; git -C /workspace/repo log -1 --format=%s",
             &code);
    cr_assert(strstr(out, "No such file") && strstr(out, "in-f1\n"), "the fork sees: %s", out);
    free(out);

    /* The forks survive the source's destroy and a kill -9 of the shard. */
    ok(c, "destroy", src, "{}");
    pid_t sp0 = test_child_of(live->pid, -1);
    pid_t sp1 = test_child_of(live->pid, sp0);
    cr_assert(sp0 > 0 && sp1 > 0, "no shard processes");
    cr_assert_eq(kill(sp0, SIGKILL), 0);
    cr_assert_eq(kill(sp1, SIGKILL), 0);
    char *got = sh(c, f2, TREE_SUMS, &code);
    cr_assert_str_eq(got, want, "the fork after its source's destroy and the shards' kill -9");
    free(got);
    out = sh(c, f1, "cat /workspace/repo/only-f1", &code);
    cr_assert_str_eq(out, "one\n");
    free(out);
    free(want);
    ok(c, "destroy", f1, "{}");
    ok(c, "destroy", f2, "{}");
    free(src);
    free(f1);
    free(f2);
    sbx_client_close(c);
}

Test(fork, busy_source_is_consistent)
{
    sbx_client *c = start();
    char *src = test_id("fbs");
    int s = owner(src);
    char *f = id_on("fbf", s, true);
    ok(c, "create", src, "{\"workspace\":\"persistent\"}");
    int code;
    /* A writer that never stops: numbered lines of 100 bytes, and 1 MB files. */
    free(sh(c, src,
            "nohup sh -c 'i=0; while :; do i=$((i+1)); "
            "printf \"%099d\\n\" $i >> /workspace/log; "
            "[ $((i % 50)) = 0 ] && head -c 1000000 /dev/zero > /workspace/chunk.$((i % 7)); "
            "done' >/dev/null 2>&1 & sleep 1; echo started",
            &code));
    cr_assert_eq(code, 0);
    char args[128], cd[64], msg[512] = "";
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", f);
    char *res = call_msg(c, "sandbox.fork", src, args, cd, msg, sizeof(msg));
    cr_assert(res, "sandbox.fork: %s %s", cd, msg);
    free(res);
    /* Before the fork's first start: its image is a clean file system. */
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "e2fsck -fn %s/s%d/workspaces/%s/disk.img >/dev/null 2>&1",
             live->dir, s, f);
    int st = system(cmd);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "e2fsck -fn of the fork's image: %d", st);
    /* Every line complete, and numbered without a gap. */
    char *out = sh(c, f,
                   "awk 'length($0) != 99 || $0 + 0 != NR { bad++ } END { print NR, bad + 0 }' "
                   "/workspace/log",
                   &code);
    long lines = 0, bad = -1;
    cr_assert_eq(sscanf(out, "%ld %ld", &lines, &bad), 2, "awk said: %s", out);
    cr_assert_gt(lines, 0, "the fork's log is empty");
    cr_assert_eq(bad, 0, "%ld of %ld lines are torn or missing in the fork", bad, lines);
    free(out);
    /* The source still runs its writer after the fork (it was not stopped). */
    out = sh(c, src, "a=$(wc -l < /workspace/log); sleep 0.5; b=$(wc -l < /workspace/log); "
                     "[ $b -gt $a ] && echo growing", &code);
    cr_assert_str_eq(out, "growing\n", "the source's writer stopped");
    free(out);
    ok(c, "destroy", src, "{}");
    ok(c, "destroy", f, "{}");
    free(src);
    free(f);
    sbx_client_close(c);
}

Test(fork, errors)
{
    sbx_client *c = start();
    char *src = test_id("fes");
    int s = owner(src);
    char *taken = id_on("fet", s, true), *fresh = id_on("fef", s, true);
    char *eph = id_on("fee", s, true);
    ok(c, "create", src, "{\"workspace\":\"persistent\"}");
    ok(c, "create", taken, "{}");
    ok(c, "create", eph, "{\"workspace\":\"ephemeral\"}");
    int code;
    free(sh(c, src, "echo s > /workspace/f", &code));
    char args[256], cd[64];

    /* An existing ID: SANDBOX_EXISTS, and nothing is created. */
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\",\"%s\"]}", fresh, taken);
    char *j = call(c, "sandbox.fork", src, args, cd);
    cr_assert_null(j, "fork into an existing sandbox: %s", j);
    cr_assert_str_eq(cd, "SANDBOX_EXISTS");
    j = call(c, "status", fresh, "{}", cd);
    cr_assert_null(j, "a fork was created anyway: %s", j);
    cr_assert_str_eq(cd, "SANDBOX_NOT_FOUND");

    /* An unknown source. */
    char *ghost = id_on("feg", s, true);
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", fresh);
    j = call(c, "sandbox.fork", ghost, args, cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "SANDBOX_NOT_FOUND");

    /* An ephemeral source. */
    j = call(c, "sandbox.fork", eph, args, cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "VALIDATION_FAILED");

    /* No ids, or the source itself. */
    j = call(c, "sandbox.fork", src, "{\"ids\":[]}", cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "VALIDATION_FAILED");

    /* An existing ID on the other shard: SANDBOX_EXISTS from its owner,
     * and the fork of the same call on the source's shard is undone. */
    char *taken2 = id_on("feu", s, false);
    ok(c, "create", taken2, "{}");
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\",\"%s\"]}", fresh, taken2);
    j = call(c, "sandbox.fork", src, args, cd);
    cr_assert_null(j, "fork into an existing sandbox of the other shard: %s", j);
    cr_assert_str_eq(cd, "SANDBOX_EXISTS");
    j = call(c, "status", fresh, "{}", cd);
    cr_assert_null(j, "the fork on the source's shard was not undone: %s", j);
    cr_assert_str_eq(cd, "SANDBOX_NOT_FOUND");
    /* No staged copy left where forks stage them: the node's pool
     * (<data>/workspaces/.forks) or, without one, the node's store. */
    char stage[512];
    struct stat sb;
    static const char *const tops[] = {"workspaces/.forks", "backups/forks"};
    for (int i = 0; i < 2; i++) {
        snprintf(stage, sizeof(stage), "%s/%s/%s", live->dir, tops[i], taken2);
        cr_assert_neq(stat(stage, &sb), 0, "a staged copy is left at %s", stage);
    }
    /* 'stage' is the gateway's argument. */
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"],\"stage\":[\"%s\"]}", fresh, fresh);
    j = call(c, "sandbox.fork", src, args, cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "VALIDATION_FAILED");

    /* A sleeping source (not mounted) forks too. */
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", fresh);
    ok(c, "sandbox.fork", src, args);
    char *out = sh(c, fresh, "cat /workspace/f", &code);
    cr_assert_str_eq(out, "s\n");
    free(out);
    /* Twice the same fork: it exists now. */
    j = call(c, "sandbox.fork", src, args, cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "SANDBOX_EXISTS");

    /* A source never started (no image yet): started, then forked. */
    char *nw = id_on("fen", s, true), *nwf = id_on("fenf", s, true);
    ok(c, "create", nw, "{\"workspace\":\"persistent\"}");
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", nwf);
    ok(c, "sandbox.fork", nw, args);
    out = sh(c, nwf, "ls -A /workspace | wc -l", &code);
    cr_assert_str_eq(out, "0\n", "the fork of a new sandbox");
    free(out);

    const char *all[] = {src, taken, fresh, eph, taken2, nw, nwf};
    for (int i = 0; i < 7; i++)
        ok(c, "destroy", all[i], "{}");
    free(nw);
    free(nwf);
    free(taken2);
    free(src);
    free(taken);
    free(fresh);
    free(eph);
    free(ghost);
    sbx_client_close(c);
}

/* Path, through a process that has it mounted, of the file system on the
 * loop device backed by the image whose stat is *img ("" if none):
 * /proc/<pid>/root<mount point>.  The loop device is found by the backing
 * file's device and inode (LOOP_GET_STATUS64): in the workspace pool the
 * backing file's path in /sys says only "/<id>/disk.img". */
static void
mounted_path(const struct stat *img, char *out, size_t n)
{
    glob_t g;
    char dev[32] = "";
    out[0] = '\0';
    if (glob("/dev/loop[0-9]*", 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; !dev[0] && i < g.gl_pathc; i++) {
        int fd = open(g.gl_pathv[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        struct loop_info64 li;
        struct stat st;
        if (fd >= 0 && ioctl(fd, LOOP_GET_STATUS64, &li) == 0 && fstat(fd, &st) == 0 &&
            li.lo_device == (uint64_t)img->st_dev && li.lo_inode == (uint64_t)img->st_ino)
            snprintf(dev, sizeof(dev), "%u:%u", major(st.st_rdev), minor(st.st_rdev));
        if (fd >= 0)
            close(fd);
    }
    globfree(&g);
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (dev[0] && !out[0] && d && (de = readdir(d)) != NULL) {
        char p[300], line[8192], mm[32], mp[4096];
        snprintf(p, sizeof(p), "/proc/%s/mountinfo", de->d_name);
        FILE *f = fopen(p, "re");
        while (f && !out[0] && fgets(line, sizeof(line), f))
            if (sscanf(line, "%*s %*s %31s %*s %4095s", mm, mp) == 2 && !strcmp(mm, dev))
                snprintf(out, n, "/proc/%s/root%s", de->d_name, mp);
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
}

/* A shard killed while a source is frozen for a fork's copy (simulated:
 * the test freezes it, then kills the shards): the source's writer is
 * blocked in the kernel, where SIGKILL cannot end it, so its container,
 * mount and loop device stay; the restarted shard thaws the orphaned mount
 * and the sandbox works again with its files. */
Test(fork, shard_killed_while_the_source_is_frozen)
{
    sbx_client *c = start();
    char *src = test_id("fzs");
    ok(c, "create", src, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, src, "echo before > /workspace/f && nohup sh -c 'while :; do echo x >> "
                    "/workspace/log; done' >/dev/null 2>&1 & echo started", &code));
    char frozen[4500];
    snprintf(frozen_img, sizeof(frozen_img), "%s/s%d/workspaces/%s/disk.img", live->dir,
             owner(src), src);
    cr_assert_eq(stat(frozen_img, &frozen_st), 0, "stat %s", frozen_img);
    mounted_path(&frozen_st, frozen, sizeof(frozen));
    cr_assert(frozen[0], "no mount of %s found", frozen_img);
    int fd = open(frozen, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s", frozen);
    cr_assert_eq(ioctl(fd, FIFREEZE, 0), 0, "FIFREEZE %s", frozen);
    close(fd);
    usleep(200 * 1000); /* the writer blocks */
    pid_t sp0 = test_child_of(live->pid, -1), sp1 = test_child_of(live->pid, sp0);
    cr_assert(sp0 > 0 && sp1 > 0);
    cr_assert_eq(kill(sp0, SIGKILL), 0);
    cr_assert_eq(kill(sp1, SIGKILL), 0);
    char *out = sh(c, src, "cat /workspace/f", &code);
    cr_assert_str_eq(out, "before\n", "the sandbox after its shard's restart");
    free(out);
    frozen_img[0] = '\0'; /* thawed by the shard */
    ok(c, "destroy", src, "{}");
    free(src);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* DISK_FULL and the disk size, on the test binary's daemon. */

Test(fork, disk_full_and_disk_size)
{
    sbx_client *c = test_client();
    char *a = test_id("dfa"), *b = test_id("dfb");
    char cd[64], msg[512] = "";
    ok(c, "create", a, "{\"workspace\":\"persistent\",\"disk\":33554432}");
    ok(c, "create", b, "{\"workspace\":\"persistent\",\"disk\":33554432}");
    char *st = call(c, "status", a, "{}", cd);
    cr_assert(st && strstr(st, "\"limitBytes\":33554432"), "status: %s", st ? st : cd);
    free(st);
    int code;
    /* A backup of 20 MB of random bytes, made in b, for the restore below. */
    free(sh(c, b, "mkdir -p /workspace/bk && head -c 20000000 /dev/urandom > /workspace/bk/r",
            &code));
    cr_assert_eq(code, 0);
    char *bk = call_msg(c, "backup.create", b, "{\"dir\":\"/workspace/bk\",\"ttl\":600}", cd,
                        msg, sizeof(msg));
    cr_assert(bk, "backup.create: %s %s", cd, msg);
    char bkid[64] = "";
    const char *bp = strstr(bk, "\"id\":\"");
    cr_assert(bp && sscanf(bp + 6, "%63[^\"]", bkid) == 1, "backup: %s", bk);
    free(bk);
    /* The file system inside is that size (ext4 keeps a little of it). */
    char *out = sh(c, a, "df -k /workspace | awk 'NR==2 { print $2 }'", &code);
    long kb = atol(out);
    cr_assert(kb > 24 * 1024 && kb <= 32 * 1024, "df says %ld KiB for a 32 MiB disk", kb);
    free(out);
    /* Fill it: 48 MB do not fit. */
    out = sh(c, a, "dd if=/dev/zero of=/workspace/big bs=1M count=48 2>&1; echo rc=$?", &code);
    cr_assert(strstr(out, "No space left on device") && !strstr(out, "rc=0"), "dd: %s", out);
    free(out);

    /* nng: file.write and file.mkdir answer DISK_FULL with the limit. */
    char *j = call_msg(c, "file.write", a,
                       "{\"path\":\"/workspace/more.txt\",\"content\":\"0123456789012345678901234"
                       "567890123456789012345678901234567890123456789\"}",
                       cd, msg, sizeof(msg));
    if (j) {
        /* A small write may still fit in a partly filled block: fill on. */
        free(j);
        free(sh(c, a, "i=0; while [ $i -lt 4000 ] && echo x > /workspace/f$i 2>/dev/null; do "
                      "i=$((i+1)); done; true", &code));
        j = call_msg(c, "file.write", a, "{\"path\":\"/workspace/more2.txt\",\"content\":\"abc\"}",
                     cd, msg, sizeof(msg));
    }
    cr_assert_null(j, "a write into a full disk succeeded");
    cr_assert_str_eq(cd, "DISK_FULL", "file.write: %s %s", cd, msg);
    cr_assert(strstr(msg, "limit"), "the message names no limit: %s", msg);
    j = call_msg(c, "file.mkdir", a, "{\"path\":\"/workspace/newdir/sub\",\"recursive\":true}",
                 cd, msg, sizeof(msg));
    if (j == NULL)
        cr_assert_str_eq(cd, "DISK_FULL", "file.mkdir: %s %s", cd, msg);
    free(j);

    /* HTTP: 507 and the code. */
    struct hresp r;
    apif("POST", "{\"path\":\"/workspace/http.txt\",\"content\":\"hello from http\"}", &r,
         "/v1/sandboxes/%s/file.write", a);
    expect_status(r, 507, "file.write over HTTP into a full disk");
    expect_code(r, "DISK_FULL", "file.write over HTTP");
    hresp_free(&r);

    /* The fork's REST alias (the full sandbox forks: its copy is on the host's disk). */
    char *f = test_id("dff");
    char fj[160];
    snprintf(fj, sizeof(fj), "{\"ids\":[\"%s\"]}", f);
    apif("POST", fj, &r, "/v1/sandboxes/%s/fork", a);
    expect_status(r, 200, "POST /v1/sandboxes/{id}/fork");
    hresp_free(&r);
    out = sh(c, f, "ls /workspace/big && df -k /workspace | awk 'NR==2 { print $2 }'", &code);
    cr_assert(strstr(out, "/workspace/big"), "the fork: %s", out);
    free(out);
    ok(c, "destroy", f, "{}");
    free(f);

    /* The neighbour is unaffected. */
    ok(c, "file.write", b, "{\"path\":\"/workspace/ok.txt\",\"content\":\"fine\"}");
    out = sh(c, b, "cat /workspace/ok.txt", &code);
    cr_assert_str_eq(out, "fine");
    free(out);

    /* backup.restore of 20 MB into the same directory: DISK_FULL, nothing
     * restored — once when even its directory cannot be made, once with
     * ~12 MB free (the archive's data does not fit). */
    char rargs[160];
    snprintf(rargs, sizeof(rargs), "{\"id\":\"%s\",\"dir\":\"/workspace/restored\"}", bkid);
    j = call_msg(c, "backup.restore", a, rargs, cd, msg, sizeof(msg));
    cr_assert_null(j, "a restore of 20 MB into a full disk succeeded");
    cr_assert_str_eq(cd, "DISK_FULL", "backup.restore: %s %s", cd, msg);
    cr_assert(strstr(msg, "limit"), "the message names no limit: %s", msg);
    free(sh(c, a, "truncate -s 16M /workspace/big && rm -f /workspace/f*", &code));
    j = call_msg(c, "backup.restore", a, rargs, cd, msg, sizeof(msg));
    if (j) {
        free(j);
        out = sh(c, a, "df -k /workspace; ls -ls /workspace/restored", &code);
        cr_assert_fail("a restore of 20 MB into 12 MB succeeded: %s", out);
    }
    cr_assert_str_eq(cd, "DISK_FULL", "backup.restore: %s %s", cd, msg);
    out = sh(c, a, "ls -A /workspace/restored | wc -l", &code);
    cr_assert_str_eq(out, "0\n", "something was restored");
    free(out);

    /* Past the deployment's maximum, persistent or ephemeral (an ephemeral
     * workspace's disk sizes its tmpfs: test_workspace.c ephemeral_disk). */
    char *d = test_id("dfd");
    j = call(c, "create", d, "{\"workspace\":\"persistent\",\"disk\":1099511627776}", cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "VALIDATION_FAILED");
    j = call(c, "create", d, "{\"workspace\":\"ephemeral\",\"disk\":1099511627776}", cd);
    cr_assert_null(j);
    cr_assert_str_eq(cd, "VALIDATION_FAILED");
    ok(c, "destroy", a, "{}");
    ok(c, "destroy", b, "{}");
    free(a);
    free(b);
    free(d);
    sbx_client_close(c);
}
