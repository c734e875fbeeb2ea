/*
 * image_pool.c — ready containers per image (struct img_pool in
 * shard_int.h; docs/images.md "Pools per image").  The warm pool of
 * shard_work.c holds host-/usr containers; a sandbox of an image takes one
 * of its image's pool instead.  A pool exists for an image while
 * sandboxes of it are created: the first create of an image makes its pool
 * (taking the least recently used slot when all SHARD_IMG_POOLS are in
 * use), and a pool without a create for SHARD_IMG_POOL_IDLE_MS is stopped.
 *
 * Its size adapts as the host-/usr pool's does (shard_work.c): the target
 * is the busiest second of creates of that image, plus a quarter
 * (shard_demand_want), in the last conf.pool_window (SHARD_POOL_WINDOW seconds by default), at least conf.image_pool (the configured
 * minimum, kept even past the budget), and all image pools together at most
 * what conf.pool_memory holds of containers of the size measured in them.
 * Refills wait until creates of the image pause for IMG_REFILL_QUIET_MS (at
 * most IMG_REFILL_MAX_WAIT_MS), so a burst's own container starts go first;
 * above the target (demand went quiet) the surplus is stopped once a
 * second.  Pooled containers hold their image's use lock like any container
 * of it, so GC keeps an image while its pool does.  Loop thread only; the
 * containers start and stop on the workers (struct work with no actor and
 * the image's digest).
 */
#include <stdlib.h>
#include <string.h>

#include "../runtime/util.h"
#include "shard_int.h"

static void
drain(struct shard *sh, struct img_pool *p)
{
    while (p->head) {
        struct pooled *q = p->head;
        p->head = q->next;
        sbx_container_kill(&q->c);
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_STOP;
        w->c = q->c;
        shard_work_submit(sh, w);
        free(q);
    }
    p->n = 0;
    p->inflight = 0; /* their starts come back to no pool and are stopped */
    p->target = 0;
    p->armed_ms = 0; /* a pending refill timer finds the slot changed */
    p->digest[0] = '\0';
}

static struct img_pool *
find(struct shard *sh, const char *digest)
{
    for (int i = 0; i < SHARD_IMG_POOLS; i++)
        if (!strcmp(sh->img_pools[i].digest, digest))
            return &sh->img_pools[i];
    return NULL;
}

/* What one pooled image container is assumed to hold until one is
 * measured (as the host-/usr pool's guess, shard_work.c). */
#define IMG_MEM_GUESS (2u << 20)
/* Never more ready containers than this per image, whatever the budget. */
#define IMG_POOL_HARD_MAX 64
#define IMG_REFILL_QUIET_MS 50
#define IMG_REFILL_MAX_WAIT_MS 1000

/* The memory estimate of one image container: the host pool's measured one
 * (the same agent and shell; the image's files are page cache shared by
 * all), else the guess. */
static uint64_t
mem_est(const struct shard *sh)
{
    return sh->pool.mem_est ? sh->pool.mem_est : IMG_MEM_GUESS;
}

static void
set_target(struct shard *sh, struct img_pool *p, int64_t now_s)
{
    /* The budget left to this pool: what conf.pool_memory holds, less what
     * the other image pools hold or start. */
    int64_t cap = (int64_t)(sh->conf.pool_memory / mem_est(sh));
    for (int i = 0; i < SHARD_IMG_POOLS; i++) {
        const struct img_pool *q = &sh->img_pools[i];
        if (q != p && q->digest[0])
            cap -= q->n + q->inflight;
    }
    int64_t want = SBX_MAX(shard_demand_want(&p->demand, now_s, sh->conf.pool_window / 1000),
                           (int64_t)sh->conf.image_pool);
    want = SBX_MIN(want, SBX_MIN(cap, (int64_t)IMG_POOL_HARD_MAX));
    p->target = (int)SBX_MAX(want, (int64_t)sh->conf.image_pool);
}

static void
fill(struct shard *sh, struct img_pool *p)
{
    while (!sh->stopping && p->n + p->inflight < p->target) {
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_START;
        w->lim = sh->limits;
        snprintf(w->image, sizeof(w->image), "%s", p->digest);
        p->inflight++;
        shard_work_submit(sh, w);
    }
}

/* A refill once creates of the image pause (see the top of this file).
 * arg: the pool's slot (it lives as long as the shard); a slot drained
 * meanwhile has armed_ms 0 and is left alone. */
static void
fill_cb(sbx_loop *l, void *arg)
{
    struct img_pool *p = arg;
    struct shard *sh = p->sh;
    if (!p->armed_ms || !p->digest[0])
        return;
    int64_t now = sbx_mono_ms();
    int64_t quiet = now - p->last_ms;
    bool busy = quiet < IMG_REFILL_QUIET_MS || sh->work.actor_busy > 0;
    if (busy && !sh->stopping && now - p->armed_ms < IMG_REFILL_MAX_WAIT_MS) {
        sbx_loop_timer(l, quiet < IMG_REFILL_QUIET_MS ? IMG_REFILL_QUIET_MS - quiet : 20,
                       fill_cb, p);
        return;
    }
    p->armed_ms = 0;
    fill(sh, p);
}

static void
fill_soon(struct shard *sh, struct img_pool *p)
{
    if (p->armed_ms)
        return;
    p->sh = sh;
    p->armed_ms = sbx_mono_ms();
    sbx_loop_timer(sh->loop, IMG_REFILL_QUIET_MS, fill_cb, p);
}

bool
shard_img_pool_take(struct shard *sh, const char *digest, struct sbx_container *out)
{
    if (sh->conf.image_pool <= 0 || !digest[0])
        return false;
    struct img_pool *p = find(sh, digest);
    if (!p) {
        struct img_pool *lru = NULL;
        for (int i = 0; i < SHARD_IMG_POOLS && !p; i++) {
            struct img_pool *q = &sh->img_pools[i];
            if (!q->digest[0])
                p = q;
            else if (!lru || q->last_ms < lru->last_ms)
                lru = q;
        }
        if (!p) {
            drain(sh, lru);
            p = lru;
        }
        snprintf(p->digest, sizeof(p->digest), "%s", digest);
        memset(&p->demand, 0, sizeof(p->demand));
        p->armed_ms = 0;
    }
    p->last_ms = sbx_mono_ms();
    int64_t now_s = p->last_ms / 1000;
    shard_demand_note(&p->demand, p->last_ms);
    set_target(sh, p, now_s);
    bool hit = false;
    if (p->head) {
        struct pooled *q = p->head;
        p->head = q->next;
        p->n--;
        *out = q->c;
        free(q);
        sh->n_pool_hits++;
        hit = true;
    } else {
        sh->n_pool_misses++;
    }
    fill_soon(sh, p);
    return hit;
}

void
shard_img_pool_done(struct shard *sh, struct work *w)
{
    struct img_pool *p = find(sh, w->image);
    if (p && p->inflight > 0)
        p->inflight--;
    if (w->rc == 0 && p && !sh->stopping) {
        struct pooled *q = sbx_xmalloc(sizeof(*q));
        q->c = w->c;
        q->next = p->head;
        p->head = q;
        p->n++;
        free(w);
        return;
    }
    if (w->rc == 0) {
        w->kind = W_STOP; /* its pool is gone, or the shard stops */
        shard_work_submit(sh, w);
        return;
    }
    free(w);
}

void
shard_img_pools_adapt(struct shard *sh)
{
    int64_t now = sbx_mono_ms();
    for (int i = 0; i < SHARD_IMG_POOLS; i++) {
        struct img_pool *p = &sh->img_pools[i];
        if (!p->digest[0])
            continue;
        if (now - p->last_ms > SHARD_IMG_POOL_IDLE_MS) {
            drain(sh, p);
            continue;
        }
        /* The window moved on: a burst's surplus stops, in the background. */
        set_target(sh, p, now / 1000);
        while (!sh->stopping && p->head && p->n > p->target) {
            struct pooled *q = p->head;
            p->head = q->next;
            p->n--;
            sbx_container_kill(&q->c);
            struct work *w = sbx_xcalloc(1, sizeof(*w));
            w->kind = W_STOP;
            w->c = q->c;
            free(q);
            shard_work_submit(sh, w);
        }
    }
}

void
shard_img_pools_stop(struct shard *sh)
{
    for (int i = 0; i < SHARD_IMG_POOLS; i++)
        drain(sh, &sh->img_pools[i]);
}

int
shard_img_pool_count(const struct shard *sh, int *target)
{
    int n = 0, t = 0;
    for (int i = 0; i < SHARD_IMG_POOLS; i++) {
        n += sh->img_pools[i].n;
        t += sh->img_pools[i].digest[0] ? sh->img_pools[i].target : 0;
    }
    if (target)
        *target = t;
    return n;
}
