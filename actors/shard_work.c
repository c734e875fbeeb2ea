/*
 * shard_work.c — the shard's worker threads, which start and stop
 * containers off the loop thread, and the warm pool of started containers,
 * whose size follows the recent demand within a memory budget (struct
 * shard_pool in shard_int.h) and which is refilled once a burst is over.
 *
 * Threads: shard_worker_main runs on each worker thread and takes work from
 * the queue (sh->work, under its own lock); results come back to the loop
 * thread through sbx_loop_post (work_done_loop), which hands an actor's
 * work to actor_work_done and keeps pool containers.  Everything else here
 * runs on the loop thread.  A struct work is owned by the queue, then the
 * worker, then whoever it is handed back to (actor_work_done frees it).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "../container/ws_guard.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* Workers: container start and stop, off the loop thread. */

static void work_done_loop(sbx_loop *l, void *arg);

/* How long a container start may spend fetching its image from peers. */
#define START_FETCH_MS (10 * 60 * 1000)

/*
 * Before a persistent workspace is mounted: an image made before (the
 * record's wsMade) that is not on this node — its partition came here by a
 * failover, or a handoff that did not bring it — is restored from the
 * snapshot the sandbox's earlier owner pushed here (<dir>/snap.img,
 * taken at <dir>/snap.time; docs/persistence.md, "Across the cluster"),
 * else the start fails: sbx_ws_mount would make an empty one.
 */
/* A workspace mounted while the disk guard holds the running ones down
 * (disk_guard.c) is held to the same level at once, not at the next pass
 * a second later (container/ws_guard.h sbx_ws_guard_cap) — but to no less
 * than 8 MiB: the agent's set-up makes directories in a new workspace, and
 * the level may be stale (the next pass lifts or sets it). */
#define WS_HOLD_FLOOR (8ull << 20)
static void
ws_hold(struct shard *sh, int mnt_fd)
{
    if (!atomic_load(&sh->dguard.engaged))
        return;
    uint64_t level = atomic_load(&sh->dguard.level);
    sbx_ws_guard_cap(mnt_fd, level > WS_HOLD_FLOOR ? level : WS_HOLD_FLOOR);
}

static int
ws_present(struct shard *sh, struct work *w)
{
    char img[1100], snap[1100], tp[1100];
    snprintf(img, sizeof(img), "%s/disk.img", w->ws_dir);
    if (access(img, F_OK) == 0)
        return 0;
    /* A new image: refused if the workspace pool is full (ws_pool.h) or the
     * disk under it is below --disk-reserve (disk_guard.c). */
    if (!w->ws_must)
        return shard_disk_admit(sh, w->why, sizeof(w->why)) ? SBX_E_DISK_FULL : 0;
    snprintf(snap, sizeof(snap), "%s/snap.img", w->ws_dir);
    snprintf(tp, sizeof(tp), "%s/snap.time", w->ws_dir);
    FILE *f = fopen(tp, "re");
    long long t = 0;
    if (f) {
        if (fscanf(f, "%lld", &t) != 1)
            t = 0;
        fclose(f);
    }
    if (t > 0 && rename(snap, img) == 0) {
        w->ws_snap_ms = t;
        /* For status: when the snapshot was taken and restored (ws_snap.c). */
        char rp[1100];
        snprintf(rp, sizeof(rp), "%s/restored.time", w->ws_dir);
        if ((f = fopen(rp, "we")) != NULL) {
            fprintf(f, "%lld %lld\n", t, (long long)sbx_wall_ms());
            fclose(f);
        }
        unlink(tp);
        sbx_log_warn("workspace %s: restored from the snapshot taken %lld ms ago", w->ws_dir,
                     (long long)(sbx_wall_ms() - t));
        return 0;
    }
    snprintf(w->why, sizeof(w->why),
             "the sandbox's workspace is not on this node and no snapshot of it reached this "
             "node (its previous node was lost, or a move of it failed; docs/persistence.md): "
             "its files are lost unless that node comes back");
    return -ENOENT;
}

/* A container of an image (docs/images.md): its root from the store, its
 * use lock held by the container until it stops (container/spawn.h). */
static int
start_image(struct shard *sh, struct work *w)
{
    struct sbx_image_root root;
    _cleanup_err_ sbx_err_t err = NULL;
    if (!sh->images) {
        snprintf(w->why, sizeof(w->why), "this shard has no image store");
        return SBX_E_IMAGE_NOT_FOUND;
    }
    int rc = sbx_image_open_root(sh->images, w->image, &root, &err);
    if (rc == SBX_E_IMAGE_NOT_FOUND && w->peers) {
        /* The image is not on this node (a handoff, a failover, a create by
         * digest elsewhere): fetch it from a peer first (docs/images.md,
         * "Images in a cluster").  The request waiting for this start gets
         * REQUEST_TIMEOUT at its deadline; the fetch goes on, and a retry
         * finds the image here. */
        sbx_err_release(&err);
        rc = shard_image_fetch(sh, w->peers, w->image, sbx_mono_ms() + START_FETCH_MS,
                               w->fetched_from, &w->fetch_bytes, &err);
        if (rc == 0)
            rc = sbx_image_open_root(sh->images, w->image, &root, &err);
    }
    free(w->peers);
    w->peers = NULL;
    if (rc) {
        snprintf(w->why, sizeof(w->why), "%s", sbx_err_msg(err));
        return rc;
    }
    if (w->ws_dir[0] || w->ws_tmpfs) {
        int fd;
        bool created;
        rc = w->ws_tmpfs ? 0 : ws_present(sh, w);
        if (rc == 0)
            rc = w->ws_tmpfs ? sbx_ws_tmpfs(w->disk, (uint64_t)sh->conf.inodes, &fd, w->why,
                                            sizeof(w->why))
                             : sbx_ws_mount(w->ws_dir, w->disk, (uint64_t)sh->conf.inodes, &fd,
                                            &created, w->why, sizeof(w->why));
        if (rc == 0 && !w->ws_tmpfs)
            ws_hold(sh, fd);
        if (rc == 0)
            rc = sbx_container_start_ws(sh->spawner, &w->lim, &root, fd, &w->c, w->why,
                                        sizeof(w->why));
    } else {
        rc = sbx_container_start_image(sh->spawner, &w->lim, &root, &w->c, w->why,
                                       sizeof(w->why));
    }
    sbx_image_root_free(&root);
    return rc;
}

/* A host-/usr container with a persistent workspace, or an ephemeral one of
 * its own size (container/workspace.h). */
static int
start_ws(struct shard *sh, struct work *w)
{
    int fd;
    bool created;
    int rc = w->ws_tmpfs ? 0 : ws_present(sh, w);
    if (rc == 0)
        rc = w->ws_tmpfs ? sbx_ws_tmpfs(w->disk, (uint64_t)sh->conf.inodes, &fd, w->why,
                                        sizeof(w->why))
                         : sbx_ws_mount(w->ws_dir, w->disk, (uint64_t)sh->conf.inodes, &fd,
                                        &created, w->why, sizeof(w->why));
    if (rc == 0 && !w->ws_tmpfs)
        ws_hold(sh, fd);
    if (rc == 0)
        rc = sbx_container_start_ws(sh->spawner, &w->lim, NULL, fd, &w->c, w->why,
                                    sizeof(w->why));
    return rc;
}

void *
shard_worker_main(void *arg)
{
    struct shard *sh = arg;
    for (;;) {
        pthread_mutex_lock(&sh->work.mu);
        while (!sh->work.head && !sh->work.bg_head && !sh->work.stop)
            pthread_cond_wait(&sh->work.cv, &sh->work.mu);
        if (!sh->work.head && !sh->work.bg_head && sh->work.stop) {
            pthread_mutex_unlock(&sh->work.mu);
            break;
        }
        struct work *w;
        if (sh->work.head) {
            w = sh->work.head;
            sh->work.head = w->next;
            if (!sh->work.head)
                sh->work.tail = NULL;
        } else {
            w = sh->work.bg_head;
            sh->work.bg_head = w->next;
            if (!sh->work.bg_head)
                sh->work.bg_tail = NULL;
        }
        pthread_mutex_unlock(&sh->work.mu);
        if (w->kind == W_START) {
            /* An image sandbox's root (docs/images.md) and a persistent
             * workspace (docs/persistence.md), then an egress sandbox's
             * network (docs/network.md): any of them, all or none. */
            w->rc = w->image[0]  ? start_image(sh, w)
                    : w->ws_dir[0] || w->ws_tmpfs ? start_ws(sh, w)
                                   : sbx_container_start(sh->spawner, &w->lim, &w->c, w->why,
                                                         sizeof(w->why));
            if (w->rc == 0 && w->net) {
                w->rc = sbx_net_attach(sh->net, w->c.pid, &w->pol, &w->att, w->why,
                                       sizeof(w->why));
                if (w->rc)
                    sbx_container_stop(sh->spawner, &w->c);
            }
        } else {
            sbx_container_stop(sh->spawner, &w->c);
            sbx_net_detach(sh->net, w->att.slot); /* after: no packet from it any more */
            w->rc = 0;
        }
        sbx_loop_post(sh->loop, work_done_loop, w);
    }
    return NULL;
}

void
shard_work_submit(struct shard *sh, struct work *w)
{
    w->sh = sh;
    w->next = NULL;
    sh->work.busy++;
    if (w->actor)
        sh->work.actor_busy++;
    /* An actor's work has a request waiting on it; the pool's does not. */
    struct work **head = w->actor ? &sh->work.head : &sh->work.bg_head;
    struct work **tail = w->actor ? &sh->work.tail : &sh->work.bg_tail;
    pthread_mutex_lock(&sh->work.mu);
    if (*tail)
        (*tail)->next = w;
    else
        *head = w;
    *tail = w;
    pthread_cond_signal(&sh->work.cv);
    pthread_mutex_unlock(&sh->work.mu);
}

static void
work_done_loop(sbx_loop *l, void *arg)
{
    struct work *w = arg;
    struct shard *sh = w->sh;
    (void)l;
    sh->work.busy--;
    if (w->actor)
        sh->work.actor_busy--;
    if (w->kind == W_START) {
        if (w->rc == 0) {
            sh->n_started++;
            sh->start_us_total += w->c.start_us;
            sbx_hist_observe(&sh->mx.start, sbx_prom_latency_s, sbx_prom_latency_n,
                             (double)w->c.start_us / 1e6);
        } else {
            sh->n_start_failed++;
            sbx_log_error("container start failed: %s", w->why);
        }
    }
    if (w->kind == W_START && !w->actor && w->image[0]) {
        shard_img_pool_done(sh, w); /* a container of an image's pool (image_pool.c) */
        return;
    }
    if (w->kind == W_START && !w->actor) {
        /* A pool container. */
        sh->pool.inflight--;
        if (w->rc == 0) {
            if (sh->stopping) {
                w->kind = W_STOP;
                shard_work_submit(sh, w);
                return;
            }
            struct pooled *p = sbx_xmalloc(sizeof(*p));
            p->c = w->c;
            p->next = sh->pool.head;
            sh->pool.head = p;
            sh->pool.n++;
            free(w);
            shard_pool_fill(sh);
        } else {
            free(w);
        }
        return;
    }
    if (w->kind == W_STOP && !w->actor) {
        free(w);
        return;
    }
    actor_work_done(sh, w);
}

void
shard_pool_fill(struct shard *sh)
{
    while (!sh->stopping && sh->pool.n + sh->pool.inflight < sh->pool.target) {
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_START;
        w->lim = sh->limits;
        sh->pool.inflight++;
        shard_work_submit(sh, w);
    }
}

/* ------------------------------------------------------------------------------ */
/* The adaptive pool's size (struct shard_pool in shard_int.h). */

/* What one pooled container is assumed to hold until one is measured: an
 * idle agent and its session shell (about 1.5 MiB each measured, issue 18),
 * rounded up. */
#define POOL_MEM_GUESS (2u << 20)
/* Never more ready containers than this per shard, whatever the budget. */
#define POOL_HARD_MAX 256

void
shard_demand_note(struct shard_demand *d, int64_t now_ms)
{
    /* The last second's asks: drop the older ones, add this one. */
    while (d->count > 0 &&
           now_ms - d->recent[(d->head + SHARD_DEMAND_RECENT - d->count) % SHARD_DEMAND_RECENT] >=
               1000)
        d->count--;
    d->recent[d->head] = now_ms;
    d->head = (d->head + 1) % SHARD_DEMAND_RECENT;
    if (d->count < SHARD_DEMAND_RECENT)
        d->count++;
    int64_t now_s = now_ms / 1000;
    int i = (int)(now_s % SHARD_POOL_WINDOW);
    if (d->sec[i] != now_s) {
        d->sec[i] = now_s;
        d->n[i] = 0;
    }
    if (d->count > d->n[i])
        d->n[i] = d->count;
}

uint32_t
shard_demand_peak(const struct shard_demand *d, int64_t now_s, int64_t window_s)
{
    uint32_t peak = 0;
    for (int i = 0; i < SHARD_POOL_WINDOW; i++)
        if (now_s - d->sec[i] < window_s && d->n[i] > peak)
            peak = d->n[i];
    return peak;
}

int64_t
shard_demand_want(const struct shard_demand *d, int64_t now_s, int64_t window_s)
{
    int64_t peak = shard_demand_peak(d, now_s, window_s);
    return peak + (peak + 3) / 4;
}

static void
pool_set_target(struct shard *sh, int64_t now_s)
{
    struct shard_pool *p = &sh->pool;
    if (!p->mem_est)
        p->mem_est = POOL_MEM_GUESS;
    uint64_t cap = sh->conf.pool_memory / p->mem_est;
    p->cap = (int)SBX_MIN(cap, (uint64_t)POOL_HARD_MAX);
    if (sh->conf.pool <= 0) {
        p->target = 0;
        return;
    }
    int64_t want = SBX_MAX(shard_demand_want(&p->demand, now_s, sh->conf.pool_window / 1000),
                           sh->conf.pool);
    /* The configured minimum holds even past the budget: it was asked for. */
    p->target = (int)SBX_MAX(SBX_MIN(want, (int64_t)p->cap), sh->conf.pool);
}

static void
pool_note_demand(struct shard *sh)
{
    int64_t now_ms = sbx_mono_ms();
    shard_demand_note(&sh->pool.demand, now_ms);
    pool_set_target(sh, now_ms / 1000);
}

void
shard_pool_adapt(struct shard *sh)
{
    struct shard_pool *p = &sh->pool;
    /* What a ready container holds: the mean over a few pooled ones (their
     * cgroups' memory; the rest of the pool is alike). */
    uint64_t sum = 0, n = 0;
    for (struct pooled *q = p->head; q && n < 4; q = q->next) {
        struct sbx_cgroup_stats st;
        if (sbx_container_stats(sh->spawner, &q->c, &st) == 0 && st.memory_current > 0) {
            sum += st.memory_current;
            n++;
        }
    }
    if (n)
        p->mem_est = p->mem_est ? (p->mem_est * 3 + sum / n) / 4 : sum / n;
    pool_set_target(sh, sbx_mono_ms() / 1000);
    /* Above the target (demand went quiet): stop the surplus, in the
     * background. */
    while (!sh->stopping && p->head && p->n > p->target) {
        struct pooled *q = p->head;
        p->head = q->next;
        p->n--;
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_STOP;
        w->c = q->c;
        free(q);
        shard_work_submit(sh, w);
    }
    /* Below it: a pending refill timer fills when the burst is over. */
    if (!p->fill_armed)
        shard_pool_fill(sh);
}

/* Refills wait until no container has been asked for during
 * POOL_REFILL_QUIET_MS and no actor's container start is under way:
 * building one takes CPU that the requests of a burst need for their own
 * (their containers, binding the agent, the first command), so the pool is
 * topped up after the burst rather than during it.  Under a steady stream
 * of creates there is no pause: the refill goes ahead anyway once it has
 * waited POOL_REFILL_MAX_WAIT_MS. */
#define POOL_REFILL_QUIET_MS 50
#define POOL_REFILL_MAX_WAIT_MS 1000

static void
pool_fill_cb(sbx_loop *l, void *arg)
{
    struct shard *sh = arg;
    int64_t now = sbx_mono_ms();
    int64_t quiet = now - sh->pool.last_take_ms;
    bool busy = quiet < POOL_REFILL_QUIET_MS || sh->work.actor_busy > 0;
    if (busy && !sh->stopping && now - sh->pool.armed_ms < POOL_REFILL_MAX_WAIT_MS) {
        int64_t d = quiet < POOL_REFILL_QUIET_MS ? POOL_REFILL_QUIET_MS - quiet : 20;
        sbx_loop_timer(l, d, pool_fill_cb, sh);
        return;
    }
    sh->pool.fill_armed = false;
    shard_pool_fill(sh);
}

static void
pool_fill_soon(struct shard *sh)
{
    sh->pool.last_take_ms = sbx_mono_ms();
    if (!sh->pool.fill_armed) {
        sh->pool.fill_armed = true;
        sh->pool.armed_ms = sh->pool.last_take_ms;
        sbx_loop_timer(sh->loop, POOL_REFILL_QUIET_MS, pool_fill_cb, sh);
    }
}

bool
shard_pool_take(struct shard *sh, struct sbx_container *out)
{
    pool_note_demand(sh);
    pool_fill_soon(sh);
    if (!sh->pool.head) {
        sh->n_pool_misses++;
        return false;
    }
    struct pooled *p = sh->pool.head;
    sh->pool.head = p->next;
    sh->pool.n--;
    *out = p->c;
    free(p);
    sh->n_pool_hits++;
    return true;
}

