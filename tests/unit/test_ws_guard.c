/*
 * test_ws_guard.c — the disk guard's pass (container/ws_guard.h): the
 * water-filling level, and on real workspaces (an ext4 image on a loop
 * device, mounted detached as the shard does) that a pass with a small
 * budget makes writers inside get ENOSPC after their share, shows the
 * smaller free space in statfs, and that a pass with room gives ext4's
 * default reservation back.  The mount tests run as root (loop devices,
 * mounts; skipped without); each
 * test's mounts go with its descriptors, its files with its directory.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../container/workspace.h"
#include "../../container/ws_guard.h"
#include "../../runtime/util.h"

TestSuite(ws_guard, .timeout = 120);

Test(ws_guard, the_level_cuts_only_the_largest_wants)
{
    const uint64_t a[] = {100, 100};
    cr_assert_eq(sbx_ws_guard_level(a, 2, 200), UINT64_MAX, "everything fits: no cut");
    cr_assert_eq(sbx_ws_guard_level(a, 2, 100), 50);
    const uint64_t b[] = {100, 10, 100};
    /* 10 fits whole; the two of 100 share the remaining 100. */
    cr_assert_eq(sbx_ws_guard_level(b, 3, 110), 50);
    cr_assert_eq(sbx_ws_guard_level(b, 3, 0), 0);
    const uint64_t c[] = {5, 7, 1000};
    cr_assert_eq(sbx_ws_guard_level(c, 3, 112), 100);
    cr_assert_eq(sbx_ws_guard_level(NULL, 0, 0), UINT64_MAX);
}

static char tmp[64];

static void
rm_tmp(void)
{
    if (tmp[0])
        sbx_rm_rf(tmp);
    tmp[0] = 0;
}

/* tmp := a new directory of this test's (mkdtemp(3)), removed by rm_tmp. */
static void
make_tmp(void)
{
    snprintf(tmp, sizeof(tmp), "/tmp/sbx-wsguard-XXXXXX");
    cr_assert(mkdtemp(tmp), "mkdtemp: %s", strerror(errno));
}

/* The mount tests need root and loop devices (the unit tier runs as root
 * in `make test`; elsewhere they say why they skip). */
static void
need_root(void)
{
    if (geteuid() != 0 || access("/dev/loop-control", W_OK) != 0)
        cr_skip_test("needs root and /dev/loop-control (real ext4 workspaces)");
}

/* A workspace of size bytes in <tmp>/<name>: its mount and image (read). */
static void
workspace(const char *name, uint64_t size, int *mnt, int *img)
{
    char dir[256], path[300], why[512] = "";
    bool created;
    snprintf(dir, sizeof(dir), "%s/%s", tmp, name);
    cr_assert_eq(sbx_ws_mount(dir, size, 4096, mnt, &created, why, sizeof(why)), 0, "%s", why);
    snprintf(path, sizeof(path), "%s/disk.img", dir);
    *img = open(path, O_RDONLY | O_CLOEXEC);
    cr_assert_geq(*img, 0, "open %s: %s", path, strerror(errno));
}

/* The tests of one workspace: root, tmp, and a 128 MiB workspace "a" in it. */
static void
one_workspace(struct sbx_ws_guard_item *it)
{
    need_root();
    make_tmp();
    memset(it, 0, sizeof(*it));
    workspace("a", 128ull << 20, &it->mnt_fd, &it->img_fd);
}

/* Write zeros to <mnt>/name until an error: the bytes written, errno in *err. */
static uint64_t
fill(int mnt, const char *name, int *err)
{
    static char buf[1 << 20];
    int fd = openat(mnt, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "create %s: %s", name, strerror(errno));
    uint64_t n = 0;
    *err = 0;
    for (;;) {
        ssize_t k = write(fd, buf, sizeof(buf));
        if (k <= 0) {
            *err = k < 0 ? errno : ENOSPC;
            break;
        }
        n += (uint64_t)k;
    }
    if (fsync(fd) < 0 && !*err)
        *err = errno;
    close(fd);
    return n;
}

static uint64_t
resv(int mnt)
{
    char path[300], buf[32] = "";
    cr_assert_eq(sbx_ws_reserved_path(mnt, path, sizeof(path)), 0);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s: %s", path, strerror(errno));
    cr_assert(fgets(buf, sizeof(buf), f));
    fclose(f);
    return strtoull(buf, NULL, 10);
}

Test(ws_guard, a_short_budget_is_shared_out_and_writers_get_enospc, .fini = rm_tmp)
{
    need_root();
    make_tmp();
    struct sbx_ws_guard_item it[2];
    memset(it, 0, sizeof(it));
    workspace("a", 128ull << 20, &it[0].mnt_fd, &it[0].img_fd);
    workspace("b", 128ull << 20, &it[1].mnt_fd, &it[1].img_fd);
    uint64_t r0 = resv(it[0].mnt_fd);

    /* Room for far less than the two could write. */
    const uint64_t budget = 64ull << 20;
    struct sbx_ws_guard_sum sum;
    cr_assert_eq(sbx_ws_guard_pass(it, 2, budget, &sum), 0);
    cr_assert_eq(sum.failed, 0, "a workspace was not measured: rc %d %d", it[0].rc, it[1].rc);
    cr_assert_eq(sum.limited, 2, "both should be held down, %zu were", sum.limited);
    cr_assert_lt(sum.level, budget / 2 + 1, "level %llu", (unsigned long long)sum.level);
    cr_assert_gt(resv(it[0].mnt_fd), r0, "the reservation was not raised");
    struct statfs sf;
    cr_assert_eq(fstatfs(it[0].mnt_fd, &sf), 0);
    uint64_t shown = (uint64_t)sf.f_bavail * (uint64_t)sf.f_bsize;
    cr_assert_leq(shown, sum.level + 4096, "statfs shows %llu free, over the level %llu",
                  (unsigned long long)shown, (unsigned long long)sum.level);
    cr_assert_eq(shown, it[0].free_bytes);

    /* Each writer gets ENOSPC after its share; together within the budget. */
    int ea, eb;
    uint64_t wa = fill(it[0].mnt_fd, "big", &ea), wb = fill(it[1].mnt_fd, "big", &eb);
    cr_log_info("budget %llu MiB: fixed %llu KiB, level %llu KiB; a wrote %llu KiB, b %llu KiB",
                (unsigned long long)(budget >> 20), (unsigned long long)(sum.fixed >> 10),
                (unsigned long long)(sum.level >> 10), (unsigned long long)(wa >> 10),
                (unsigned long long)(wb >> 10));
    cr_assert_eq(ea, ENOSPC, "a: %s", strerror(ea));
    cr_assert_eq(eb, ENOSPC, "b: %s", strerror(eb));
    cr_assert_leq(wa, sum.level, "a wrote %llu, over its share %llu", (unsigned long long)wa,
                  (unsigned long long)sum.level);
    cr_assert_gt(wa, sum.level / 2, "a wrote only %llu of its share %llu",
                 (unsigned long long)wa, (unsigned long long)sum.level);
    cr_assert_gt(wb, sum.level / 2, "b wrote only %llu", (unsigned long long)wb);
    cr_assert_leq(sum.fixed + wa + wb, budget, "fixed %llu + %llu + %llu > budget",
                  (unsigned long long)sum.fixed, (unsigned long long)wa,
                  (unsigned long long)wb);

    /* Room again: ext4's default back, and the writer goes on. */
    cr_assert_eq(sbx_ws_guard_pass(it, 2, 1ull << 40, &sum), 0);
    cr_assert_eq(sum.limited, 0);
    cr_assert_eq(resv(it[0].mnt_fd), r0, "the default reservation was not given back");
    cr_assert_eq(fstatfs(it[0].mnt_fd, &sf), 0);
    cr_assert_gt((uint64_t)sf.f_bavail * sf.f_bsize, 64ull << 20, "free after the lift: %llu",
                 (unsigned long long)sf.f_bavail * sf.f_bsize);
    for (int i = 0; i < 2; i++) {
        close(it[i].mnt_fd);
        close(it[i].img_fd);
    }
}

/* A sandbox cannot get past a cut by reserving blocks first: blocks it
 * fallocate(2)d (unwritten, still holes in the image) count as growth the
 * guard cannot stop, and the image grows by no more than the budget when it
 * writes them and then everything it may. */
Test(ws_guard, blocks_fallocated_before_a_cut_count_against_the_budget, .fini = rm_tmp)
{
    struct sbx_ws_guard_item it;
    one_workspace(&it);
    int fd = openat(it.mnt_fd, "pre", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(fallocate(fd, 0, 0, 40 << 20), 0, "fallocate: %s", strerror(errno));
    cr_assert_eq(fsync(fd), 0);
    struct stat st0, st1;
    cr_assert_eq(fstat(it.img_fd, &st0), 0);

    const uint64_t budget = 48ull << 20;
    struct sbx_ws_guard_sum sum;
    cr_assert_eq(sbx_ws_guard_pass(&it, 1, budget, &sum), 0);
    cr_assert_eq(it.rc, 0);
    cr_assert_geq(sum.fixed, 40ull << 20, "the fallocated blocks were not counted: fixed %llu",
                  (unsigned long long)sum.fixed);
    /* Write the reserved blocks (no new ext4 allocation), then all it may. */
    static char buf[1 << 20];
    memset(buf, 'x', sizeof(buf));
    for (int i = 0; i < 40; i++)
        cr_assert_eq(pwrite(fd, buf, sizeof(buf), (off_t)i << 20), (ssize_t)sizeof(buf),
                     "write into the reserved blocks: %s", strerror(errno));
    cr_assert_eq(fsync(fd), 0);
    close(fd);
    int e;
    fill(it.mnt_fd, "big", &e);
    cr_assert_eq(e, ENOSPC, "%s", strerror(e));
    cr_assert_eq(fstat(it.img_fd, &st1), 0);
    uint64_t grew = (uint64_t)(st1.st_blocks - st0.st_blocks) * 512;
    cr_log_info("fixed %llu KiB; the image grew by %llu KiB (budget %llu KiB)",
                (unsigned long long)(sum.fixed >> 10), (unsigned long long)(grew >> 10),
                (unsigned long long)(budget >> 10));
    cr_assert_leq(grew, budget, "the image grew by %llu bytes, over the budget",
                  (unsigned long long)grew);
    close(it.mnt_fd);
    close(it.img_fd);
}

/* Bytes of the image allocated on its host file system (st_blocks). */
static uint64_t
img_alloc(int img)
{
    struct stat st;
    cr_assert_eq(fstat(img, &st), 0);
    return (uint64_t)st.st_blocks * 512;
}

/* Write n MiB of 'x' to <mnt>/name; with fsync when sync. */
static void
put(int mnt, const char *name, int mib, bool sync)
{
    static char buf[1 << 20];
    memset(buf, 'x', sizeof(buf));
    int fd = openat(mnt, name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "create %s: %s", name, strerror(errno));
    for (int i = 0; i < mib; i++)
        cr_assert_eq(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf), "write: %s",
                     strerror(errno));
    cr_assert(!sync || fsync(fd) == 0, "fsync: %s", strerror(errno));
    close(fd);
}

/*
 * Data counts once.  Data already in the image takes the host's disk (it
 * is out of the budget's free space) and must not count again as growth
 * to come: with the first bound (min(holes, what ext4 does not have
 * free)) a sandbox that had written 47 MiB held 47 MiB more of the room,
 * and the next pass left its neighbour nearly nothing (stop 30's CI,
 * test_wspool).  Dirty data not yet in the image still counts, once: it
 * is either held or in the image when the pass looks.
 */
Test(ws_guard, data_already_in_the_image_is_not_counted_again, .fini = rm_tmp)
{
    struct sbx_ws_guard_item it;
    one_workspace(&it);
    struct sbx_ws_guard_sum sum;
    cr_assert_eq(sbx_ws_guard_pass(&it, 1, 1ull << 40, &sum), 0);
    cr_assert_eq(it.rc, 0);
    uint64_t f0 = it.fixed, a0 = img_alloc(it.img_fd);

    put(it.mnt_fd, "synced", 40, true);
    cr_assert_eq(sbx_ws_guard_pass(&it, 1, 1ull << 40, &sum), 0);
    uint64_t f1 = it.fixed, a1 = img_alloc(it.img_fd);
    cr_log_info("fixed %llu KiB fresh, %llu KiB after 40 MiB synced (the image took %llu KiB)",
                (unsigned long long)(f0 >> 10), (unsigned long long)(f1 >> 10),
                (unsigned long long)((a1 - a0) >> 10));
    cr_assert_geq(a1 - a0, 40ull << 20, "the synced data is not in the image");
    cr_assert_lt(f1, f0 + (4ull << 20), "synced data counted again: fixed %llu, was %llu",
                 (unsigned long long)f1, (unsigned long long)f0);

    put(it.mnt_fd, "dirty", 20, false);
    cr_assert_eq(sbx_ws_guard_pass(&it, 1, 1ull << 40, &sum), 0);
    uint64_t f2 = it.fixed, a2 = img_alloc(it.img_fd);
    cr_log_info("after 20 MiB unsynced: fixed %llu KiB, the image took %llu KiB more",
                (unsigned long long)(f2 >> 10), (unsigned long long)((a2 - a1) >> 10));
    cr_assert_geq(f2 + a2, f1 + a1 + (20ull << 20) - (1ull << 20),
                  "dirty data counted neither as held nor in the image: fixed %llu, image "
                  "+%llu", (unsigned long long)f2, (unsigned long long)(a2 - a1));
    /* …and not twice (a margin for ext4's preallocation and metadata). */
    cr_assert_leq(f2 + a2, f1 + a1 + (30ull << 20),
                  "dirty data counted twice: fixed %llu, image +%llu", (unsigned long long)f2,
                  (unsigned long long)(a2 - a1));

    /* Deleted, then written again at once: the blocks freed are over data
     * of the image (ext4 reuses them or not; either way the new data is
     * held or in the image, and no more). */
    cr_assert_eq(unlinkat(it.mnt_fd, "synced", 0), 0);
    put(it.mnt_fd, "again", 30, false);
    cr_assert_eq(sbx_ws_guard_pass(&it, 1, 1ull << 40, &sum), 0);
    uint64_t f3 = it.fixed, a3 = img_alloc(it.img_fd);
    cr_log_info("after a delete and 30 MiB unsynced: fixed %llu KiB, the image took %llu KiB "
                "more", (unsigned long long)(f3 >> 10), (unsigned long long)((a3 - a2) >> 10));
    cr_assert_geq(f3 + a3, f2 + a2, "fixed %llu + image %llu fell", (unsigned long long)f3,
                  (unsigned long long)a3);
    close(it.mnt_fd);
    close(it.img_fd);
}

/* A workspace mounted while the others are held down is held to the same
 * level at once (sbx_ws_guard_cap), and a cap never raises free space. */
Test(ws_guard, a_cap_holds_a_new_mount_to_the_level, .fini = rm_tmp)
{
    need_root();
    make_tmp();
    int mnt, img;
    workspace("a", 64ull << 20, &mnt, &img);
    uint64_t r0 = resv(mnt);
    cr_assert_eq(sbx_ws_guard_cap(mnt, 10ull << 20), 0);
    struct statfs sf;
    cr_assert_eq(fstatfs(mnt, &sf), 0);
    cr_assert_leq((uint64_t)sf.f_bavail * sf.f_bsize, 10ull << 20);
    uint64_t r1 = resv(mnt);
    cr_assert_gt(r1, r0);
    cr_assert_eq(sbx_ws_guard_cap(mnt, 40ull << 20), 0);
    cr_assert_eq(resv(mnt), r1, "a larger cap lowered the reservation");
    int e;
    uint64_t w = fill(mnt, "big", &e);
    cr_assert_eq(e, ENOSPC, "%s", strerror(e));
    cr_assert_leq(w, 10ull << 20, "wrote %llu bytes past a 10 MiB cap", (unsigned long long)w);
    close(mnt);
    close(img);
}

Test(ws_guard, a_gone_mount_is_not_measured)
{
    struct sbx_ws_guard_item it = {.mnt_fd = -1, .img_fd = -1};
    struct sbx_ws_guard_sum sum;
    cr_assert_eq(sbx_ws_guard_pass(&it, 1, 0, &sum), 0);
    cr_assert_eq(sum.failed, 1);
    cr_assert_lt(it.rc, 0);
    cr_assert_eq(sum.limited, 0);
}

/* sbx_ws_run_tool (mkfs.ext4, mkfs.xfs) is bounded: a tool still running at
 * its deadline is killed and the call answers -ETIMEDOUT, not never (a hung
 * disk kept a shard's workspace creation waiting forever before). */
Test(ws_tool, a_tool_still_running_at_its_deadline_is_killed)
{
    char why[256] = "";
    char *slow[] = {"sleep", "30", NULL};
    int64_t t0 = sbx_mono_ms();
    int rc = sbx_ws_run_tool(slow, "coreutils", 300, why, sizeof(why));
    int64_t took = sbx_mono_ms() - t0;
    cr_assert_eq(rc, -ETIMEDOUT, "rc %d: %s", rc, why);
    cr_expect(took >= 300 && took < 5000, "answered after %lld ms", (long long)took);
    cr_expect(strstr(why, "sleep did not end within 300 ms"), "why: %s", why);
    /* It was reaped: no child of this process is left, zombie or not. */
    cr_expect_eq(waitpid(-1, NULL, WNOHANG), -1, "a child is left");

    char *ok[] = {"true", NULL}, *bad[] = {"false", NULL};
    cr_expect_eq(sbx_ws_run_tool(ok, "coreutils", 5000, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(sbx_ws_run_tool(bad, "coreutils", 5000, why, sizeof(why)), -EIO);
    cr_expect(strstr(why, "false failed"), "why: %s", why);
}
