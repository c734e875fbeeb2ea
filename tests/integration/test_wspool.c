/*
 * test_wspool.c — the workspace pool (docs/persistence.md, "The workspace
 * pool"; container/ws_pool.h): on a data directory without reflinks (the
 * test directories are on the host's ext4) persistent workspaces live in an
 * XFS with reflinks: under `sbxd dev`, as here, one pool for the node,
 * <dev data>/wspool.img, each shard a directory of it (a lone `sbxd shard`
 * makes <data>/wspool.img of its own: tests/cluster).
 *
 * Checks what an operator and a user would: the pool is made and
 * <data>/workspaces reaches into it; a fork shares the source's extents
 * (FIEMAP says SHARED, and the pool file grows by far less than the
 * workspace) and each side's writes stay its own; a destroy gives the
 * space back (the pool file's allocated blocks shrink); a kill -9 of the
 * shard and its restart find the workspace; `sbxd` stopped leaves no loop
 * device backed by the pool and no mount; a full pool refuses a new
 * workspace and a fork with DISK_FULL while a running sandbox goes on;
 * `--ws-pool off` keeps workspaces on the host file system, and a later
 * start with the pool moves them in; a full host file system under the
 * (sparse) pool refuses a new workspace and a fork with DISK_FULL too, and
 * running sandboxes share out what is left of it (the disk guard: ENOSPC
 * inside, never I/O errors); the shards of one `sbxd dev` share one pool,
 * forks across them are reflinks, and a shard's pool of its own from
 * before moves into it.
 *
 * Each test starts its own small daemon (one shard), stopped by the fini.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/shard_of.h"

static struct testd *live;

static void
cleanup(void)
{
    if (live) {
        testd_stop(live);
        free(live);
        live = NULL;
    }
}

TestSuite(wspool, .fini = cleanup, .timeout = 240);

static sbx_client *
start_shards(int shards, const char *const *extra)
{
    live = calloc(1, sizeof(*live));
    cr_assert_eq(testd_start(live, shards, extra), 0, "the daemon did not start");
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    return c;
}

static sbx_client *
start_with(const char *const *extra)
{
    return start_shards(1, extra);
}

static int owner(const char *id);

/* op with JSON args; the result's JSON (heap), or NULL with code[64], msg. */
static char *
call(sbx_client *c, const char *op, const char *id, const char *args, char code[64], char *msg,
     size_t msglen)
{
    sbx_reply *r = NULL;
    sbx_error err;
    code[0] = 0;
    if (sbx_call_json(c, op, id, args, 60000, &r, &err) != 0) {
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

static void
ok(sbx_client *c, const char *op, const char *id, const char *args)
{
    char code[64], msg[512] = "";
    char *j = call(c, op, id, args, code, msg, sizeof(msg));
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

/* Bytes of host disk the file holds (st_blocks), or -1. */
static long long
allocated(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_blocks * 512 : -1;
}

/* Bytes of path's extents that FIEMAP flags SHARED. */
static long long
shared_bytes(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0, "open %s", path);
    long long shared = 0;
    size_t n = 256;
    struct fiemap *fm = calloc(1, sizeof(*fm) + n * sizeof(struct fiemap_extent));
    uint64_t start = 0;
    for (;;) {
        memset(fm, 0, sizeof(*fm));
        fm->fm_start = start;
        fm->fm_length = FIEMAP_MAX_OFFSET - start;
        fm->fm_flags = FIEMAP_FLAG_SYNC;
        fm->fm_extent_count = (uint32_t)n;
        cr_assert_eq(ioctl(fd, FS_IOC_FIEMAP, fm), 0, "FIEMAP %s: %s", path, strerror(errno));
        if (fm->fm_mapped_extents == 0)
            break;
        bool last = false;
        for (uint32_t i = 0; i < fm->fm_mapped_extents; i++) {
            struct fiemap_extent *e = &fm->fm_extents[i];
            if (e->fe_flags & FIEMAP_EXTENT_SHARED)
                shared += (long long)e->fe_length;
            start = e->fe_logical + e->fe_length;
            last = last || (e->fe_flags & FIEMAP_EXTENT_LAST);
        }
        if (last)
            break;
    }
    free(fm);
    close(fd);
    return shared;
}

/* Loop devices whose backing file is path (or was: "path (deleted)"). */
static int
loops_of(const char *path)
{
    glob_t g;
    int n = 0;
    if (glob("/sys/block/loop*/loop/backing_file", 0, NULL, &g) != 0)
        return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "re");
        char line[4096] = "";
        if (f && fgets(line, sizeof(line), f)) {
            line[strcspn(line, "\n")] = '\0';
            n += !strcmp(line, path) ||
                 (!strncmp(line, path, strlen(path)) && !strcmp(line + strlen(path), " (deleted)"));
        }
        if (f)
            fclose(f);
    }
    globfree(&g);
    return n;
}

/* Mounts of this (host) namespace whose mount point or source is under dir. */
static int
mounts_under(const char *dir)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[8192];
    int n = 0;
    while (f && fgets(line, sizeof(line), f))
        n += strstr(line, dir) != NULL;
    if (f)
        fclose(f);
    return n;
}

/* The shard's pid: the supervisor's child. */
static pid_t
shard_pid(void)
{
    return test_child_of(live->pid, -1);
}

Test(wspool, fork_shares_extents_and_destroy_gives_space_back)
{
    sbx_client *c = start_with((const char *const[]){TESTD_SMALL, NULL});
    char pool[512], link[512], node[512], tgt[512], img[600], fimg[600];
    snprintf(pool, sizeof(pool), "%s/wspool.img", live->dir);
    snprintf(link, sizeof(link), "%s/s0/workspaces", live->dir);
    snprintf(node, sizeof(node), "%s/workspaces", live->dir);
    struct stat st;
    cr_assert_eq(stat(pool, &st), 0, "no pool file %s on this ext4 data directory", pool);
    /* The node's pool is the supervisor's mount; the shard's part a
     * directory of it. */
    ssize_t k = readlink(node, tgt, sizeof(tgt) - 1);
    cr_assert_gt(k, 0, "%s is not a link into the pool", node);
    tgt[k] = '\0';
    char want[512];
    snprintf(want, sizeof(want), "/proc/%d/fd/", (int)live->pid);
    cr_assert(!strncmp(tgt, want, strlen(want)), "%s -> %s, not sbxd dev's %s", node, tgt, want);
    k = readlink(link, tgt, sizeof(tgt) - 1);
    cr_assert_gt(k, 0, "%s is not a link into the pool", link);
    tgt[k] = '\0';
    snprintf(want, sizeof(want), "%s/s0", node);
    cr_assert_str_eq(tgt, want, "%s -> %s", link, tgt);

    char *src = test_id("psrc"), *fk = test_id("pfrk");
    ok(c, "create", src, "{\"workspace\":\"persistent\",\"disk\":268435456}");
    int code;
    free(sh(c, src, "head -c 50000000 /dev/urandom > /workspace/r && sync && "
                    "md5sum < /workspace/r > /workspace/sum", &code));
    cr_assert_eq(code, 0);
    snprintf(img, sizeof(img), "%s/%s/disk.img", link, src);
    snprintf(fimg, sizeof(fimg), "%s/%s/disk.img", link, fk);
    cr_assert_gt(allocated(img), 50000000, "the source's image holds %lld bytes", allocated(img));
    long long before = allocated(pool);
    char args[256];
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", fk);
    ok(c, "sandbox.fork", src, args);
    long long grown = allocated(pool) - before;
    long long sh_b = shared_bytes(fimg);
    cr_assert_gt(sh_b, 50000000, "the fork's image shares %lld bytes with its source", sh_b);
    cr_assert_lt(grown, 8 << 20, "the pool file grew by %lld bytes for a fork of 50 MB", grown);

    /* Each side's writes are its own. */
    free(sh(c, fk, "echo fork > /workspace/mine && md5sum < /workspace/r | cmp - /workspace/sum",
            &code));
    cr_assert_eq(code, 0, "the fork's copy of the data differs");
    free(sh(c, src, "echo src > /workspace/theirs", &code));
    char *out = sh(c, src, "ls /workspace/mine /workspace/theirs 2>&1", &code);
    cr_assert(strstr(out, "No such file") && strstr(out, "/workspace/theirs\n"),
              "the source sees: %s", out);
    free(out);
    out = sh(c, fk, "ls /workspace/mine /workspace/theirs 2>&1", &code);
    cr_assert(strstr(out, "No such file") && strstr(out, "/workspace/mine\n"),
              "the fork sees: %s", out);
    free(out);

    /* Both destroyed: the pool file gives the 50 MB back (FITRIM → holes). */
    long long full = allocated(pool);
    ok(c, "destroy", fk, "{}");
    ok(c, "destroy", src, "{}");
    long long now = full;
    for (int i = 0; i < 100 && full - now < 40000000; i++) {
        usleep(100 * 1000);
        now = allocated(pool);
    }
    cr_assert_geq(full - now, 40000000, "the pool file holds %lld bytes after the destroys, "
                  "%lld before", now, full);
    free(src);
    free(fk);
    sbx_client_close(c);
}

Test(wspool, kill9_restart_then_stop_leaves_nothing)
{
    sbx_client *c = start_with((const char *const[]){TESTD_SMALL, NULL});
    char pool[512], data[300];
    snprintf(pool, sizeof(pool), "%s/wspool.img", live->dir);
    snprintf(data, sizeof(data), "%s", live->dir);
    char *id = test_id("pk9");
    ok(c, "create", id, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, id, "echo kept > /workspace/f", &code));
    cr_assert_eq(loops_of(pool), 1, "the pool is not on one loop device");
    pid_t sp = shard_pid();
    cr_assert_gt(sp, 0);
    cr_assert_eq(kill(sp, SIGKILL), 0);
    char *out = sh(c, id, "cat /workspace/f", &code);
    cr_assert_str_eq(out, "kept\n", "after the shard's kill -9: %s", out);
    free(out);
    cr_assert_neq(shard_pid(), sp, "the shard was not restarted");
    cr_assert_eq(loops_of(pool), 1, "after the restart the pool is on %d loop devices",
                 loops_of(pool));
    free(id);
    sbx_client_close(c);

    /* Stopped: no loop device backed by the pool, no mount. */
    testd_stop(live);
    free(live);
    live = NULL;
    int left = 0;
    for (int i = 0; i < 50 && (left = loops_of(pool)) > 0; i++)
        usleep(100 * 1000);
    cr_assert_eq(left, 0, "%d loop devices still back %s", left, pool);
    cr_assert_eq(mounts_under(data), 0, "a mount under %s is left", data);
}

/* The first start of b (a new persistent workspace) and a fork of a into
 * the new ID f both answer DISK_FULL, the start's message naming `what`. */
static void
refused_full(sbx_client *c, const char *a, const char *b, const char *f, const char *what)
{
    sbx_exec_result r;
    sbx_error err;
    cr_assert_neq(test_sh(c, b, "true", 30000, &r, &err), 0, "a new workspace started (%s full)",
                  what);
    cr_assert_str_eq(err.code, "DISK_FULL", "start of a new workspace: %s %s", err.code,
                     err.message);
    cr_assert(strstr(err.message, what), "the message does not name the %s: %s", what,
              err.message);
    sbx_error_free(&err);
    char args[128], cd[64], msg[512] = "";
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", f);
    char *j = call(c, "sandbox.fork", a, args, cd, msg, sizeof(msg));
    cr_assert_null(j, "a fork succeeded (%s full)", what);
    cr_assert_str_eq(cd, "DISK_FULL", "fork: %s %s", cd, msg);
}

Test(wspool, full_pool_refuses_new_workspaces_and_forks)
{
    sbx_client *c =
        start_with((const char *const[]){TESTD_SMALL, "--ws-pool-size", "400M", NULL});
    char link[512], filler[600];
    snprintf(link, sizeof(link), "%s/s0/workspaces", live->dir);
    char *a = test_id("pfa"), *b = test_id("pfb"), *f = test_id("pff");
    ok(c, "create", a, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, a, "echo a > /workspace/f", &code));
    /* Fill the pool to under its reserve (64 MiB) from the host. */
    snprintf(filler, sizeof(filler), "%s/filler", link);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "open %s: %s", filler, strerror(errno));
    off_t sz = 0;
    for (off_t step = 64 << 20; step >= (1 << 20); step /= 2)
        while (fallocate(fd, 0, sz, step) == 0)
            sz += step;
    close(fd);
    cr_assert_gt(sz, 100 << 20, "the filler took only %lld bytes", (long long)sz);

    ok(c, "create", b, "{\"workspace\":\"persistent\"}");
    refused_full(c, a, b, f, "pool");
    sbx_exec_result r;
    sbx_error err;
    /* The running sandbox goes on. */
    char *out = sh(c, a, "cat /workspace/f && echo more >> /workspace/f && echo ok", &code);
    cr_assert_str_eq(out, "a\nok\n", "the running sandbox: %s", out);
    free(out);
    /* Space back (XFS frees the blocks in the background): the new one starts. */
    cr_assert_eq(unlink(filler), 0);
    int rc = -1;
    for (int i = 0; i < 100 && rc != 0; i++) {
        if ((rc = test_sh(c, b, "echo b", 30000, &r, &err)) == 0) {
            cr_assert_str_eq(r.stdout_data, "b\n");
            sbx_exec_result_free(&r);
        } else {
            cr_assert_str_eq(err.code, "DISK_FULL", "%s %s", err.code, err.message);
            sbx_error_free(&err);
            usleep(100 * 1000);
        }
    }
    cr_assert_eq(rc, 0, "the new workspace did not start once the pool had room");
    free(a);
    free(b);
    free(f);
    sbx_client_close(c);
}

static char host_mnt[64];

static void
cleanup_host(void)
{
    cleanup(); /* the daemon first: the pool's loop device and mount go with it */
    if (host_mnt[0]) {
        test_tmpfs_remove(host_mnt);
        host_mnt[0] = 0;
    }
}

/* Fill the test's host file system (host_mnt) with <host_mnt>/filler
 * (fallocate) until `leave` bytes are free; its path into filler. */
static void
fill_host(long long leave, char *filler, size_t n)
{
    snprintf(filler, n, "%s/filler", host_mnt);
    struct statvfs vs;
    cr_assert_eq(statvfs(host_mnt, &vs), 0);
    long long avail = (long long)vs.f_bavail * (long long)vs.f_frsize;
    cr_assert_gt(avail, leave + (60ll << 20), "the tmpfs has only %lld bytes free", avail);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "open %s: %s", filler, strerror(errno));
    cr_assert_eq(fallocate(fd, 0, 0, (off_t)(avail - leave)), 0, "fallocate: %s",
                 strerror(errno));
    close(fd);
}

/* After a refusal: the running sandbox a still reads its file (holding
 * "a"); once the filler is removed, the new workspace b starts. */
static void
goes_on_then_starts(sbx_client *c, const char *a, const char *b, const char *filler)
{
    int code;
    char *out = sh(c, a, "cat /workspace/f", &code);
    cr_assert_str_eq(out, "a\n", "the running sandbox: %s", out);
    free(out);
    cr_assert_eq(unlink(filler), 0);
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(test_sh(c, b, "echo b > /workspace/g && cat /workspace/g", 30000, &r, &err), 0,
                 "the new workspace did not start once the host had room: %s", err.message);
    cr_assert_str_eq(r.stdout_data, "b\n");
    sbx_exec_result_free(&r);
}

/*
 * The pool file is sparse, so the host file system under it can fill while
 * the pool still has room: then a new workspace and a fork are refused
 * with DISK_FULL naming the host file system (before, they were made, and
 * the pool's writes would have failed as I/O errors inside the sandboxes),
 * a running sandbox goes on, and with room back the new one starts.  The
 * data directory is a tmpfs of the test's (test_tmpfs_mount).
 */
Test(wspool, a_full_host_file_system_under_the_pool_refuses_new_workspaces,
     .fini = cleanup_host)
{
    cr_assert_eq(test_tmpfs_mount(host_mnt, sizeof(host_mnt), "wsph", "900m"), 0,
                 "mount tmpfs: %s", strerror(errno));
    sbx_client *c = start_with((const char *const[]){TESTD_SMALL, "--data", host_mnt,
                                                     "--ws-pool", "on", "--ws-pool-size",
                                                     "400M", NULL});
    char *a = test_id("pha"), *b = test_id("phb"), *f = test_id("phf");
    ok(c, "create", a, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, a, "echo a > /workspace/f && sync", &code));
    /* Fill the host file system (the tmpfs) to 40 MiB free; the pool keeps
     * its own free space (about 330 MiB). */
    char filler[128];
    fill_host(40ll << 20, filler, sizeof(filler));

    ok(c, "create", b, "{\"workspace\":\"persistent\"}");
    refused_full(c, a, b, f, "host file system");
    goes_on_then_starts(c, a, b, filler);
    free(a);
    free(b);
    free(f);
    sbx_client_close(c);
}

/* Bytes df shows free in id's /workspace. */
static long long
df_free(sbx_client *c, const char *id)
{
    int code;
    char *out = sh(c, id, "df -B1 --output=avail /workspace | tail -1", &code);
    long long v = atoll(out);
    free(out);
    return v;
}

/* The bytes `head -c 300M` wrote into id's /workspace/big before it
 * stopped; its and the file's fsync's error messages in err (heap). */
static long long
write_big(sbx_client *c, const char *id, char **err)
{
    int code;
    /* sync FILE fsyncs it and says so if the data did not reach the disk. */
    *err = sh(c, id, "head -c 300M /dev/zero 2>&1 >/workspace/big; sync /workspace/big 2>&1",
              &code);
    sbx_exec_result r;
    sbx_error e;
    cr_assert_eq(test_sh(c, id, "stat -c %s /workspace/big", 30000, &r, &e), 0, "%s",
                 e.message);
    long long n = atoll(r.stdout_data);
    sbx_exec_result_free(&r);
    return n;
}

/* A new sandbox ID with prefix p whose owner is shard `shard` of `shards`
 * (any with one shard); heap. */
static char *
id_on_shard(const char *p, int shards, int shard)
{
    for (int k = 0; k < 1000; k++) {
        char *id = test_id(p);
        if (shards == 1 || owner(id) == shard)
            return id;
        free(id);
    }
    cr_assert_fail("no ID of shard %d", shard);
    return NULL;
}

/* The body of the tests below: sandboxes a and b (on shards 0 and 1 when
 * there are two) on a host with 160 MiB free and a 32 MiB reserve. */
static void
short_host(int shards)
{
    /* The pool (sparse) has room for both limits: the host is what is short. */
    cr_assert_eq(test_tmpfs_mount(host_mnt, sizeof(host_mnt), "wspg", "1200m"), 0,
                 "mount tmpfs: %s", strerror(errno));
    sbx_client *c = start_shards(shards, (const char *const[]){
        TESTD_SMALL, "--disk", "256M", "--data", host_mnt, "--ws-pool", "on",
        "--ws-pool-size", "900M", "--disk-reserve", "32M", NULL});
    char *a = id_on_shard("pga", shards, 0), *b = id_on_shard("pgb", shards, 1);
    const char *ids[2] = {a, b};
    int code;
    for (int i = 0; i < 2; i++) {
        ok(c, "create", ids[i], "{\"workspace\":\"persistent\"}");
        free(sh(c, ids[i], "echo kept > /workspace/f && sync", &code));
    }
    /* Leave the host 160 MiB: room for 128 MiB after the reserve, half
     * of one sandbox's limit. */
    char filler[128];
    fill_host(160ll << 20, filler, sizeof(filler));

    /* Within a few passes (one a second) df inside shows the share. */
    long long fa = 0, fb = 0;
    for (int i = 0; i < 100; i++) {
        fa = df_free(c, a);
        fb = df_free(c, b);
        if (fa + fb <= 128ll << 20)
            break;
        usleep(100 * 1000);
    }
    cr_assert_leq(fa + fb, 128ll << 20, "df inside shows %lld + %lld bytes free", fa, fb);

    char *ea = NULL, *eb = NULL;
    long long wa = write_big(c, a, &ea);
    /* Let the guard look again after a's data is in: b's share is now of
     * the room a's data left, and must not count a's data twice (the
     * first bound did, and left b nearly nothing). */
    for (long long prev = fb, now, i = 0; i < 6; i++, prev = now) {
        usleep(1200 * 1000); /* a pass a second */
        if ((now = df_free(c, b)) == prev)
            break;
    }
    long long wb = write_big(c, b, &eb);
    cr_log_info("host short: df showed %lld + %lld KiB free; a wrote %lld KiB, b %lld KiB",
                fa >> 10, fb >> 10, wa >> 10, wb >> 10);
    for (int i = 0; i < 2; i++) {
        const char *e = i ? eb : ea;
        cr_assert(strstr(e, "No space left on device"), "%s: no ENOSPC: %s", ids[i], e);
        cr_assert_null(strstr(e, "Input/output error"), "%s: an I/O error: %s", ids[i], e);
        cr_assert_null(strstr(e, "Read-only file system"), "%s: ext4 went read-only: %s",
                       ids[i], e);
    }
    cr_assert_gt(wb, 16ll << 20, "the second writer got only %lld bytes", wb);
    cr_assert_lt(wa + wb, 160ll << 20, "together they wrote %lld bytes", wa + wb);
    /* Two shards split the room (--node-shards from sbxd dev): neither
     * shard's sandbox takes more than half of it. */
    if (shards == 2)
        cr_assert(wa <= 64ll << 20 && wb <= 64ll << 20,
                  "a shard's sandbox wrote past its half of the room: %lld, %lld", wa, wb);
    struct statvfs vs;
    cr_assert_eq(statvfs(host_mnt, &vs), 0);
    cr_assert_geq((long long)vs.f_bavail * (long long)vs.f_frsize, 16ll << 20,
                  "the host has only %lld bytes free",
                  (long long)vs.f_bavail * (long long)vs.f_frsize);
    free(ea);
    free(eb);

    /* Room again: the limit is lifted, the files are intact. */
    cr_assert_eq(unlink(filler), 0);
    /* Each shard lifts its own limits at its own next pass (once a
     * second, not in step): wait for both sandboxes. */
    for (int i = 0; i < 100; i++) {
        fa = df_free(c, a);
        fb = df_free(c, b);
        if (fa >= 128ll << 20 && fb >= 128ll << 20)
            break;
        usleep(100 * 1000);
    }
    cr_assert_geq(fa, 128ll << 20, "df inside a still shows %lld bytes free", fa);
    cr_assert_geq(fb, 128ll << 20, "df inside b still shows %lld bytes free", fb);
    for (int i = 0; i < 2; i++) {
        char *out = sh(c, ids[i], "cat /workspace/f && echo more > /workspace/g && cat "
                                  "/workspace/g", &code);
        cr_assert_str_eq(out, "kept\nmore\n", "%s after the lift: %s", ids[i], out);
        free(out);
    }
    free(a);
    free(b);
    sbx_client_close(c);
}

/*
 * The disk guard (docs/persistence.md, "When the host disk runs short"):
 * two running sandboxes whose disks (256 MiB each) add up to more than the
 * host file system under the pool has free.  Each writer gets ENOSPC ("No
 * space left on device") after its share, never an I/O error; the second
 * still gets its share after the first wrote all it could; the host keeps
 * free space; the sandboxes' files are intact and they go on writing once
 * the host has room again, when the limits are lifted.  Without the guard
 * (--disk-reserve 0) each wrote 239 MiB into its page cache, the pool's
 * writes failed on the full host, and `sync` found both workspaces'
 * ext4 remounted read-only (its errors=remount-ro after the I/O errors).
 */
Test(wspool, the_host_disk_short_of_the_limits_gives_enospc_inside_not_io_errors,
     .fini = cleanup_host)
{
    short_host(1);
}

/* The same with two shards (under one `sbxd dev`, which passes
 * --node-shards 2): each shard shares out half of the room. */
Test(wspool, two_shards_of_a_node_split_the_room, .fini = cleanup_host)
{
    short_host(2);
}

/*
 * Without a pool (--ws-pool off: sparse images on the host file system) the
 * guard holds too, and a host below --disk-reserve refuses new workspaces
 * and forks with DISK_FULL naming the reserve: a running sandbox's new
 * data gets ENOSPC inside (the room is nil), its files stay readable, and
 * with room back the new workspace starts.
 */
Test(wspool, a_host_below_the_reserve_refuses_new_workspaces_and_new_data,
     .fini = cleanup_host)
{
    cr_assert_eq(test_tmpfs_mount(host_mnt, sizeof(host_mnt), "wspr", "400m"), 0,
                 "mount tmpfs: %s", strerror(errno));
    sbx_client *c = start_with((const char *const[]){TESTD_SMALL, "--data", host_mnt,
                                                     "--ws-pool", "off", "--disk-reserve",
                                                     "128M", NULL});
    char *a = test_id("pra"), *b = test_id("prb"), *f = test_id("prf");
    ok(c, "create", a, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, a, "echo a > /workspace/f && sync", &code));
    char filler[128];
    fill_host(100ll << 20, filler, sizeof(filler));

    ok(c, "create", b, "{\"workspace\":\"persistent\"}");
    refused_full(c, a, b, f, "--disk-reserve");
    /* Within a pass or two, a's new data is refused inside. */
    char *out = NULL;
    for (int i = 0; i < 50; i++) {
        free(out);
        out = sh(c, a, "head -c 8M /dev/zero 2>&1 >/workspace/x; rm -f /workspace/x", &code);
        if (strstr(out, "No space left on device"))
            break;
        usleep(100 * 1000);
    }
    cr_assert(strstr(out, "No space left on device"), "a wrote new data below the reserve: %s",
              out);
    free(out);
    goes_on_then_starts(c, a, b, filler);
    free(a);
    free(b);
    free(f);
    sbx_client_close(c);
}

/* The shard of the 2-shard `live` deployment that owns id (0 or 1). */
static int
owner(const char *id)
{
    return test_shard_of(live->name, 2, id);
}

/*
 * `sbxd dev` makes one pool for the node, <data>/wspool.img, and each shard
 * keeps its workspaces in a directory of it (<data>/s<i>/workspaces links
 * there; no pool per shard): a fork into a sandbox of the OTHER shard is a
 * reflink too (FIEMAP: the fork's image shares the source's extents),
 * adopted by a rename, and each side's writes stay its own.
 */
Test(wspool, one_pool_per_node_and_forks_across_shards_share_extents)
{
    live = calloc(1, sizeof(*live));
    const char *const extra[] = {TESTD_SMALL, "--disk", "256M", NULL};
    cr_assert_eq(testd_start(live, 2, extra), 0, "the daemon did not start");
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    char path[512], want[512], got[512];
    struct stat st;
    snprintf(path, sizeof(path), "%s/wspool.img", live->dir);
    cr_assert_eq(stat(path, &st), 0, "no node pool %s", path);
    for (int i = 0; i < 2; i++) {
        snprintf(path, sizeof(path), "%s/s%d/wspool.img", live->dir, i);
        cr_expect_neq(stat(path, &st), 0, "shard %d has a pool of its own", i);
        snprintf(path, sizeof(path), "%s/s%d/workspaces", live->dir, i);
        snprintf(want, sizeof(want), "%s/workspaces/s%d", live->dir, i);
        ssize_t k = readlink(path, got, sizeof(got) - 1);
        got[k > 0 ? k : 0] = '\0';
        cr_expect_str_eq(got, want, "%s links to '%s'", path, got);
    }
    char *src = test_id("pxs"), *fk = NULL;
    for (int i = 0; i < 1000 && !fk; i++) {
        char *id = test_id("pxf");
        if (owner(id) != owner(src))
            fk = id;
        else
            free(id);
    }
    cr_assert(fk, "no ID on the other shard");
    ok(c, "create", src, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, src,
            "head -c 33554432 /dev/urandom > /workspace/big && echo s > /workspace/f && sync",
            &code));
    char args[160];
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", fk);
    ok(c, "sandbox.fork", src, args);
    snprintf(path, sizeof(path), "%s/s%d/workspaces/%s/disk.img", live->dir, owner(fk), fk);
    long long shared = shared_bytes(path);
    cr_expect_geq(shared, 32ll << 20, "the fork's image on the other shard shares %lld bytes "
                  "with its source (a copy, not a reflink)", shared);
    char *out = sh(c, fk, "cat /workspace/f && echo f > /workspace/f && md5sum < /workspace/big",
                   &code);
    char *out2 = sh(c, src, "cat /workspace/f && md5sum < /workspace/big", &code);
    cr_expect_str_eq(out2, out, "the fork's files differ from its source's: %s / %s", out, out2);
    free(out);
    free(out2);
    out = sh(c, src, "cat /workspace/f", &code);
    cr_expect_str_eq(out, "s\n", "the fork's write reached the source: %s", out);
    free(out);
    ok(c, "destroy", fk, "{}");
    ok(c, "destroy", src, "{}");
    free(src);
    free(fk);
    sbx_client_close(c);
}

Test(wspool, off_keeps_the_host_layout_and_a_pool_takes_it_over)
{
    sbx_client *c = start_with((const char *const[]){TESTD_SMALL, "--ws-pool", "off", NULL});
    char pool[512], dir[512], img[600];
    snprintf(pool, sizeof(pool), "%s/wspool.img", live->dir);
    snprintf(dir, sizeof(dir), "%s/s0/workspaces", live->dir);
    char *id = test_id("pof");
    ok(c, "create", id, "{\"workspace\":\"persistent\"}");
    int code;
    free(sh(c, id, "echo before-pool > /workspace/f", &code));
    struct stat st;
    cr_assert_neq(stat(pool, &st), 0, "--ws-pool off made a pool");
    cr_assert_eq(lstat(dir, &st), 0);
    cr_assert(S_ISDIR(st.st_mode), "%s is not a directory with --ws-pool off", dir);
    snprintf(img, sizeof(img), "%s/%s/disk.img", dir, id);
    cr_assert_eq(stat(img, &st), 0, "no image at %s", img);
    sbx_client_close(c);

    /* The same data with the pool (the default): the workspace is moved in. */
    cr_assert_eq(testd_restart(live, 1, (const char *const[]){TESTD_SMALL, NULL}), 0);
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0);
    cr_assert_eq(stat(pool, &st), 0, "no pool after a start without --ws-pool off");
    cr_assert_eq(lstat(dir, &st), 0);
    cr_assert(S_ISLNK(st.st_mode), "%s is not the pool's link", dir);
    cr_assert_eq(stat(img, &st), 0, "the image is not in the pool: %s", img);
    char *out = sh(c, id, "cat /workspace/f", &code);
    cr_assert_str_eq(out, "before-pool\n", "after the move into the pool: %s", out);
    free(out);
    free(id);
    sbx_client_close(c);
}

/* A persistent sandbox <prefix>-… (its ID into *id, heap) holding
 * /workspace/f of `bytes` random bytes, synced: sha256sum's line (heap). */
static char *
sandbox_with_file(sbx_client *c, const char *prefix, long long bytes, char **id)
{
    char cmd[160];
    int code;
    *id = test_id(prefix);
    ok(c, "create", *id, "{\"workspace\":\"persistent\"}");
    snprintf(cmd, sizeof(cmd),
             "head -c %lld /dev/urandom > /workspace/f && sync && sha256sum /workspace/f", bytes);
    char *sum = sh(c, *id, cmd, &code);
    cr_assert_eq(code, 0, "%s", sum);
    return sum;
}

/*
 * A move into the node's pool is not begun without room for the copies
 * (sbx_wspool_absorb): the host file system under the pools (a tmpfs) has
 * 100 MiB free at the restart, less than the old pool's 100 MB workspace
 * plus the 64 MiB reserve.  The shard keeps its own pool and says why;
 * the sandbox's file is intact and it goes on writing; nothing of it was
 * copied into the node's pool.
 */
Test(wspool, a_pool_move_without_room_keeps_the_shard_pool, .fini = cleanup_host)
{
    cr_assert_eq(test_tmpfs_mount(host_mnt, sizeof(host_mnt), "wspm", "1200m"), 0,
                 "mount tmpfs: %s", strerror(errno));
    sbx_client *c = start_with((const char *const[]){
        TESTD_SMALL, "--disk", "256M", "--data", host_mnt, "--ws-pool-size", "900M",
        "--ws-pool-node=", NULL});
    char old[512], copy[600], filler[128];
    snprintf(old, sizeof(old), "%s/s0/wspool.img", host_mnt);
    char *id;
    int code;
    char *before = sandbox_with_file(c, "pnr", 100000000, &id);
    sbx_client_close(c);
    fill_host(100ll << 20, filler, sizeof(filler));

    /* --disk-reserve 0: the disk guard would hold the sandbox down on a
     * host this full; what is tested here is the move's own check. */
    cr_assert_eq(testd_restart(live, 1, (const char *const[]){
                     TESTD_SMALL, "--disk", "256M", "--data", host_mnt, "--ws-pool-size",
                     "900M", "--disk-reserve", "0", NULL}),
                 0);
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0);
    char *after = sh(c, id, "sha256sum /workspace/f && echo more > /workspace/g && cat "
                            "/workspace/g", &code);
    char want[300];
    snprintf(want, sizeof(want), "%smore\n", before);
    cr_assert_str_eq(after, want, "the sandbox after the refused move");
    struct stat st;
    cr_assert_eq(stat(old, &st), 0, "the shard's own pool %s is gone", old);
    snprintf(copy, sizeof(copy), "%s/workspaces/s0/%s", host_mnt, id);
    cr_assert_neq(stat(copy, &st), 0, "a copy was left in the node's pool: %s", copy);
    char *text = NULL;
    size_t tl = 0;
    cr_assert_eq(sbx_fs_read(live->log, 1 << 22, &text, &tl), 0);
    cr_assert(strstr(text, "its workspace pool stays its own") && strstr(text, "MiB free"),
              "the log does not say why the pool stayed: %s", text);
    free(text);
    free(after);
    free(before);
    free(id);
    sbx_client_close(c);
}

/*
 * A deployment whose shard made a pool of its own (<data>/s0/wspool.img,
 * before `sbxd dev` shared one pool between its shards; here made by
 * giving the shard an empty --ws-pool-node) moves its workspaces into the
 * node's pool at the next start: the file is there, equal by sha256, its
 * image is in the shard's part of the node's pool, the old pool file is
 * gone and no loop device backs it.
 */
Test(wspool, a_shard_pool_from_before_moves_into_the_node_pool)
{
    sbx_client *c = start_with((const char *const[]){TESTD_SMALL, "--ws-pool-node=", NULL});
    char old[512], img[600];
    snprintf(old, sizeof(old), "%s/s0/wspool.img", live->dir);
    char *id;
    int code;
    char *before = sandbox_with_file(c, "pab", 3000000, &id);
    struct stat st;
    cr_assert_eq(stat(old, &st), 0, "the shard made no pool of its own (%s)", old);
    sbx_client_close(c);

    cr_assert_eq(testd_restart(live, 1, (const char *const[]){TESTD_SMALL, NULL}), 0);
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0);
    char *after = sh(c, id, "sha256sum /workspace/f", &code);
    cr_assert_str_eq(after, before, "the file after the move into the node's pool");
    free(after);
    free(before);
    snprintf(img, sizeof(img), "%s/workspaces/s0/%s/disk.img", live->dir, id);
    cr_assert_eq(stat(img, &st), 0, "the image is not in the node's pool: %s", img);
    cr_assert_neq(stat(old, &st), 0, "the shard's own pool %s is still there", old);
    int left = -1;
    for (int i = 0; i < 50 && (left = loops_of(old)) > 0; i++)
        usleep(100 * 1000);
    cr_assert_eq(left, 0, "%d loop devices still back %s", left, old);
    free(id);
    sbx_client_close(c);
}
