/*
 * disk_guard.c — the shard's disk guard (container/ws_guard.h;
 * docs/persistence.md, "When the host disk runs short").
 *
 * Each second the loop's sweep compares this shard's running persistent
 * workspaces with its part of the free disk:
 *
 *   room = (min(host free, pool free) − --disk-reserve) / --node-shards
 *
 * where host free is that of the file system holding the images (or the
 * pool file) and pool free that of the XFS pool (none without a pool).
 * When the workspaces' sizes add up to no more than the room, nothing can
 * fill the disk; nor can it while the room is at least DG_AHEAD, more than
 * the writes of the second until the next pass can take (the page cache's
 * dirty limit, 20 % of memory by default, and then the disk's speed).
 * Then nothing is done (two statvfs calls and a walk of the actor table).
 * Otherwise — or while an earlier pass still holds some workspace down —
 * a pass runs on a thread: it gets a duplicate of each
 * running workspace's mount (so its file system, and the loop device whose
 * sysfs entry the pass writes, stay the same one while it runs), measures,
 * and shares the room out (sbx_ws_guard_pass).  The thread counts in
 * img_jobs: the shard's stop waits for it (shard_images_stop).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "../container/ws_guard.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "shard_int.h"

/* The room from which the guard shares out (below) or lets every
 * workspace write up to its own limit (at or above: thin provisioning, as
 * before).  Not lower: each workspace's lazily initialised ext4 metadata
 * (a 1 GiB workspace: up to 64 MiB of journal and inode tables) counts as
 * growth the guard cannot stop, so the shares of many sandboxes are
 * small. */
#define DG_AHEAD (8ull << 30)

struct dg_job {
    struct shard *sh;               /* borrowed: outlives the job (img_jobs) */
    uint64_t room;                  /* this shard's part of the free disk */
    uint64_t budget;                /* what the pass shares out: room, or UINT64_MAX */
    size_t n;
    struct sbx_ws_guard_item *items; /* owned, with their mnt_fd (img_fd: opened by the thread) */
    char (*ids)[64]; /* the actors' ids (struct actor id) */
};

/* Bytes free to ordinary writers on the host file system holding the
 * images (or the pool file) and in the pool (UINT64_MAX without one). */
static int
dg_free(struct shard *sh, uint64_t *host, uint64_t *pool)
{
    *pool = UINT64_MAX;
    if (sh->wspool)
        return sbx_wspool_space(sh->wspool, pool, host);
    struct statvfs vs;
    if (statvfs(sh->conf.data, &vs) < 0)
        return -errno;
    *host = (uint64_t)vs.f_bavail * vs.f_frsize;
    return 0;
}

/* This shard's part of the free disk under its workspaces, in bytes. */
static int
dg_room(struct shard *sh, uint64_t *room)
{
    uint64_t host, pool;
    int rc = dg_free(sh, &host, &pool);
    if (rc)
        return rc;
    uint64_t left = host < pool ? host : pool;
    uint64_t r = left > sh->conf.disk_reserve ? left - sh->conf.disk_reserve : 0;
    *room = r / (uint64_t)sh->conf.node_shards;
    return 0;
}

static void
dg_job_free(struct dg_job *j)
{
    for (size_t i = 0; i < j->n; i++) {
        if (j->items[i].mnt_fd >= 0)
            close(j->items[i].mnt_fd);
        if (j->items[i].img_fd >= 0)
            close(j->items[i].img_fd);
    }
    free(j->items);
    free(j->ids);
    free(j);
}

static void *
dg_thread(void *arg)
{
    struct dg_job *j = arg;
    struct shard *sh = j->sh;
    for (size_t i = 0; i < j->n; i++) {
        char dir[4096], img[4200];
        if (sbx_ws_dir(sh->conf.data, j->ids[i], dir, sizeof(dir)) != 0)
            continue;
        snprintf(img, sizeof(img), "%s/disk.img", dir);
        j->items[i].img_fd = open(img, O_RDONLY | O_CLOEXEC);
    }
    /* An image not opened (a destroy under way) is not measured. */
    size_t k = 0;
    for (size_t i = 0; i < j->n; i++) {
        if (j->items[i].img_fd < 0) {
            close(j->items[i].mnt_fd);
            continue;
        }
        if (k != i) {
            j->items[k] = j->items[i];
            memcpy(j->ids[k], j->ids[i], sizeof(j->ids[k]));
        }
        k++;
    }
    j->n = k;
    struct sbx_ws_guard_sum sum;
    int64_t t0 = sbx_mono_us();
    sbx_ws_guard_pass(j->items, j->n, j->budget, &sum);
    atomic_store(&sh->dguard.pass_us, (uint64_t)(sbx_mono_us() - t0));
    atomic_store(&sh->dguard.measured, (uint64_t)(j->n - sum.failed));
    bool was = atomic_load(&sh->dguard.engaged), now = sum.limited > 0;
    if (now && !was)
        sbx_log_warn("shard %s: the host disk is short: %zu of %zu running workspaces held to "
                     "%llu MiB of new data each, so that all fit in %llu MiB (the free disk "
                     "less --disk-reserve %llu MiB, /%lld shards); their writers get ENOSPC "
                     "past it",
                     sh->conf.name, sum.limited, j->n, (unsigned long long)(sum.level >> 20),
                     (unsigned long long)(j->room >> 20),
                     (unsigned long long)(sh->conf.disk_reserve >> 20),
                     (long long)sh->conf.node_shards);
    else if (!now && was)
        sbx_log_info("shard %s: the host disk has room again: the workspaces' limits are lifted",
                     sh->conf.name);
    /* Said when the count changes: such a workspace is not held down. */
    uint64_t before = atomic_exchange(&sh->dguard.failed, (uint64_t)sum.failed);
    if (sum.failed && sum.failed != before)
        sbx_log_warn("shard %s: disk guard: %zu of %zu running workspaces could not be "
                     "measured (their writers are not held down)",
                     sh->conf.name, sum.failed, j->n);
    atomic_store(&sh->dguard.room, j->room);
    atomic_store(&sh->dguard.limited, (uint64_t)sum.limited);
    atomic_store(&sh->dguard.level, now ? sum.level : UINT64_MAX);
    atomic_store(&sh->dguard.engaged, now);
    atomic_fetch_add(&sh->dguard.passes, 1);
    dg_job_free(j);
    atomic_store(&sh->dguard.busy, false);
    atomic_fetch_sub(&sh->img_jobs, 1); /* last: the shard's stop waits for it */
    return NULL;
}

void
shard_disk_guard(struct shard *sh)
{
    if (!sh->conf.disk_reserve || atomic_load(&sh->dguard.busy) || atomic_load(&sh->img_stop))
        return;
    uint64_t room = 0;
    if (dg_room(sh, &room) != 0)
        return;
    size_t n = 0;
    uint64_t total = 0;
    for (size_t b = 0; b < sh->actors.nbuckets; b++)
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext)
            if (a->cs == C_RUNNING && a->c.ws && a->c.ws_fd >= 0 && a->rec.persistent) {
                n++;
                total += a->rec.disk ? a->rec.disk : sh->conf.disk;
            }
    /* Each image grows by at most its size: all of them fit; or the room
     * is ample.  A pass still runs to lift the limits of an earlier one. */
    bool fits = total <= room || room >= DG_AHEAD;
    if (fits && !atomic_load(&sh->dguard.engaged)) {
        atomic_store(&sh->dguard.room, room);
        return;
    }
    /* Shared extents only where there are reflinks: the pool's XFS, or a
     * data directory on XFS or btrfs (FIEMAP over every image is the
     * pass's longest step). */
    struct statfs fs;
    bool reflinks = sh->wspool != NULL ||
                    (statfs(sh->conf.data, &fs) == 0 &&
                     (fs.f_type == XFS_SUPER_MAGIC || fs.f_type == BTRFS_SUPER_MAGIC));
    struct dg_job *j = sbx_xcalloc(1, sizeof(*j));
    j->sh = sh;
    j->room = room;
    j->budget = fits ? UINT64_MAX : room;
    j->items = sbx_xcalloc(n ? n : 1, sizeof(*j->items));
    j->ids = sbx_xcalloc(n ? n : 1, sizeof(*j->ids));
    for (size_t b = 0; b < sh->actors.nbuckets && j->n < n; b++)
        for (struct actor *a = sh->actors.buckets[b]; a && j->n < n; a = a->hnext) {
            if (!(a->cs == C_RUNNING && a->c.ws && a->c.ws_fd >= 0 && a->rec.persistent))
                continue;
            struct sbx_ws_guard_item *it = &j->items[j->n];
            it->img_fd = -1;
            it->reflinks = reflinks;
            if ((it->mnt_fd = fcntl(a->c.ws_fd, F_DUPFD_CLOEXEC, 0)) < 0)
                continue;
            snprintf(j->ids[j->n], sizeof(j->ids[j->n]), "%s", a->id);
            j->n++;
        }
    atomic_store(&sh->dguard.busy, true);
    if (shard_job_start(sh, dg_thread, j) != 0) {
        dg_job_free(j);
        atomic_store(&sh->dguard.busy, false);
    }
}

int
shard_disk_admit(struct shard *sh, char *why, size_t whylen)
{
    int rc = sbx_wspool_room(sh->wspool, why, whylen);
    if (rc || !sh->conf.disk_reserve)
        return rc;
    uint64_t host, pool;
    if (dg_free(sh, &host, &pool) != 0)
        return 0;
    if (host >= sh->conf.disk_reserve && pool >= sh->conf.disk_reserve)
        return 0;
    bool h = host <= pool;
    snprintf(why, whylen,
             "the %s has %llu MiB free, under the %llu MiB (--disk-reserve) the running "
             "sandboxes leave free: no new workspace until there is room",
             h ? "host file system under the workspaces" : "shard's workspace pool",
             (unsigned long long)((h ? host : pool) >> 20),
             (unsigned long long)(sh->conf.disk_reserve >> 20));
    return -ENOSPC;
}
