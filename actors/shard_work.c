/*
 * shard_work.c — the shard's worker threads, which start and stop
 * containers off the loop thread, and the warm pool of started containers.
 *
 * Threads: shard_worker_main runs on each worker thread and takes work from
 * the queue (sh->work, under its own lock); results come back to the loop
 * thread through sbx_loop_post (work_done_loop), which hands an actor's
 * work to actor_work_done and keeps pool containers.  Everything else here
 * runs on the loop thread.  A struct work is owned by the queue, then the
 * worker, then whoever it is handed back to (actor_work_done frees it).
 */
#include <pthread.h>
#include <stdlib.h>

#include "../runtime/log.h"
#include "../runtime/util.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* Workers: container start and stop, off the loop thread. */

static void work_done_loop(sbx_loop *l, void *arg);

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
            w->rc = sbx_container_start(sh->spawner, &w->lim, &w->c, w->why, sizeof(w->why));
        } else {
            sbx_container_stop(sh->spawner, &w->c);
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
    if (w->kind == W_START) {
        if (w->rc == 0) {
            sh->n_started++;
            sh->start_us_total += w->c.start_us;
        } else {
            sh->n_start_failed++;
            sbx_log_error("container start failed: %s", w->why);
        }
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
    while (!sh->stopping && sh->pool.n + sh->pool.inflight < sh->conf.pool) {
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_START;
        w->lim = sh->limits;
        sh->pool.inflight++;
        shard_work_submit(sh, w);
    }
}

bool
shard_pool_take(struct shard *sh, struct sbx_container *out)
{
    if (!sh->pool.head)
        return false;
    struct pooled *p = sh->pool.head;
    sh->pool.head = p->next;
    sh->pool.n--;
    *out = p->c;
    free(p);
    sh->n_pool_hits++;
    shard_pool_fill(sh);
    return true;
}

