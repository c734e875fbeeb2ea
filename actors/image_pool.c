/*
 * image_pool.c — ready containers per image (struct img_pool in
 * shard_int.h; docs/images.md "Pools per image").  The warm pool of
 * shard_work.c holds host-/usr containers; a sandbox of an image takes one
 * of its image's own pool instead.  A pool exists for an image while
 * sandboxes of it are created: the first create of an image makes its pool
 * (taking the least recently used slot when all SHARD_IMG_POOLS are in
 * use), every create refills it to conf.image_pool, and a pool without a
 * create for SHARD_IMG_POOL_IDLE_MS is stopped.  Pooled containers hold
 * their image's use lock like any container of it, so GC keeps an image
 * while its pool does.  Loop thread only; the containers start and stop on
 * the workers (struct work with no actor and the image's digest).
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

static void
fill(struct shard *sh, struct img_pool *p)
{
    while (!sh->stopping && p->n + p->inflight < sh->conf.image_pool) {
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_START;
        w->lim = sh->limits;
        snprintf(w->image, sizeof(w->image), "%s", p->digest);
        p->inflight++;
        shard_work_submit(sh, w);
    }
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
    }
    p->last_ms = sbx_mono_ms();
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
    fill(sh, p);
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
        if (p->digest[0] && now - p->last_ms > SHARD_IMG_POOL_IDLE_MS)
            drain(sh, p);
    }
}

void
shard_img_pools_stop(struct shard *sh)
{
    for (int i = 0; i < SHARD_IMG_POOLS; i++)
        drain(sh, &sh->img_pools[i]);
}

int
shard_img_pool_count(const struct shard *sh)
{
    int n = 0;
    for (int i = 0; i < SHARD_IMG_POOLS; i++)
        n += sh->img_pools[i].n;
    return n;
}
