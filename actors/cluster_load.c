/*
 * cluster_load.c — load-then-serve (docs/cluster.md): a partition this
 * shard comes to own (a claim, a restart, a re-join after a fence) is
 * served only once its records were read whole from etcd (control thread)
 * and installed in the local store in their place (loop).
 */
#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/etcd.h"
#include "../runtime/log.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster_int.h"
#include "shard_int.h"

#define LOAD_BATCH 256  /* partitions per load from etcd */
#define LOAD_PAGE 100   /* records per range request of a load: ≤ 100 of the largest
                           (1.4 MiB in base64) stay under the client's MAX_REPLY */
#define LOAD_BACKOFF_MIN_MS 100
#define LOAD_BACKOFF_MAX_MS 5000

/* ------------------------------------------------------------------------------ */
/* Loop thread: records loaded from etcd (load-then-serve). */

/* Records of partitions read whole from etcd; owned by the loop once posted. */
struct install {
    struct cluster *c;
    int64_t epoch[SBX_PARTITIONS]; /* the epoch each partition was loaded for (0: not in it) */
    uint8_t set[SBX_PARTITIONS];   /* install_apply: those still due (epoch and ask unchanged) */
    struct sbx_etcd_kv *kvs;       /* every record of those partitions */
    size_t n;
    uint64_t last_seq;
};

static void install_check(sbx_loop *l, void *arg);

/* Replace the local records of the partitions still owned at the epoch the
 * load was asked for (a load for a partition that moved since, or that a
 * fence reset, is dropped: the view asks again). */
static void
install_apply(sbx_loop *l, void *arg)
{
    struct install *in = arg;
    struct cluster *c = in->c;
    struct shard *sh = c->sh;
    (void)l;
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        const struct lpart *x = &c->lp[p];
        in->set[p] = in->epoch[p] && x->mine && !x->ready && !x->moving &&
                     x->epoch == in->epoch[p] && x->load_epoch == in->epoch[p];
    }
    cluster_purge_partitions(sh, in->set);
    for (size_t i = 0; i < in->n; i++) {
        const char *id = strrchr(in->kvs[i].key, '/');
        if (!id || !id[1])
            continue;
        id++;
        /* a tombstone (an empty value: cluster_repl.c) is no record */
        if (!in->kvs[i].vlen || !in->set[sbx_place_partition(id, strlen(id))])
            continue;
        in->last_seq = sbx_store_put(sh->store, SBX_DB_SANDBOXES, id, strlen(id),
                                     in->kvs[i].value, in->kvs[i].vlen);
    }
    sbx_etcd_kvs_free(in->kvs, in->n);
    in->kvs = NULL;
    install_check(l, in);
}

/* Once the records are committed: the partitions are served. */
static void
install_check(sbx_loop *l, void *arg)
{
    struct install *in = arg;
    struct cluster *c = in->c;
    struct shard *sh = c->sh;
    if (in->last_seq > sh->decided) {
        sbx_loop_timer(l, 5, install_check, in);
        return;
    }
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        struct lpart *x = &c->lp[p];
        if (in->set[p] && x->mine && x->epoch == in->epoch[p] && x->load_epoch == in->epoch[p])
            x->ready = true;
    }
    free(in);
}

/* ------------------------------------------------------------------------------ */
/* Control thread: records read from etcd. */

/*
 * Read every record of the partitions parts[0..n) (ascending) from etcd:
 * one range from the first partition's records to the end of the last
 * one's, by pages of LOAD_PAGE records at one revision, keeping those of
 * the set.  0 with *out / *nout (the caller frees them), or the error of
 * the first request that failed (nothing returned: a partition whose
 * records could not all be read is never installed as empty).
 */
static int
load_read(struct cluster *c, const uint32_t *parts, size_t n, const uint8_t *set,
          struct sbx_etcd_kv **out, size_t *nout)
{
    char from[200], last[200], end[200];
    snprintf(from, sizeof(from), "%sr/%04u/", c->prefix, parts[0]);
    snprintf(last, sizeof(last), "%sr/%04u/", c->prefix, parts[n - 1]);
    sbx_etcd_prefix_end(last, end, sizeof(end));
    struct sbx_etcd_kv *kvs = NULL;
    size_t nk = 0;
    int64_t rev = 0;
    bool after = false, more = true;
    char *next = sbx_xstrdup(from);
    int rc = 0;
    while (more) {
        struct sbx_etcd_kv *pg;
        size_t np;
        rc = sbx_etcd_range_page(c->etcd, next, after, end, LOAD_PAGE, rev, &pg, &np, &more,
                                 rev ? NULL : &rev);
        if (rc == 0 && np == 0 && more)
            rc = SBX_E_STORAGE; /* a page whose keys all failed to decode: no progress */
        if (rc)
            break;
        if (np) {
            free(next);
            next = sbx_xstrdup(pg[np - 1].key);
            after = true;
        }
        for (size_t i = 0; i < np; i++) {
            unsigned p = (unsigned)atoi(pg[i].key + strlen(c->prefix) + 2);
            if (p < SBX_PARTITIONS && set[p]) {
                kvs = sbx_xrealloc(kvs, (nk + 1) * sizeof(*kvs));
                kvs[nk++] = pg[i];
            } else {
                free(pg[i].key);
                free(pg[i].value);
            }
        }
        free(pg);
    }
    free(next);
    if (rc) {
        sbx_etcd_kvs_free(kvs, nk);
        return rc;
    }
    *out = kvs;
    *nout = nk;
    return 0;
}

/*
 * Control thread: load what the loop asked for (want_load), LOAD_BATCH
 * partitions at a time, and post each batch to the loop.  A read that
 * fails (etcd unreachable, an error answer, a timeout) leaves its
 * partitions unavailable — not empty: their local records stay — and is
 * tried again after a back-off (LOAD_BACKOFF_MIN_MS doubling to
 * LOAD_BACKOFF_MAX_MS).
 */
void
cluster_load_wanted(struct cluster *c)
{
    struct shard *sh = c->sh;
    while (!atomic_load(&c->stop) && !cluster_fenced(c) && sbx_mono_ms() >= c->load_next_ms) {
        struct install *in = sbx_xcalloc(1, sizeof(*in));
        in->c = c;
        uint32_t parts[LOAD_BATCH];
        size_t n = 0;
        pthread_mutex_lock(&c->mu);
        for (int p = 0; p < SBX_PARTITIONS && n < LOAD_BATCH; p++)
            if (c->want_load[p]) {
                in->epoch[p] = c->want_load[p];
                in->set[p] = 1;
                parts[n++] = (uint32_t)p;
            }
        if (!n)
            c->loads = false;
        pthread_mutex_unlock(&c->mu);
        if (!n) {
            free(in);
            return;
        }
        int rc = load_read(c, parts, n, in->set, &in->kvs, &in->n);
        if (rc) {
            c->load_backoff_ms = SBX_MIN(SBX_MAX(c->load_backoff_ms * 2, LOAD_BACKOFF_MIN_MS),
                                         LOAD_BACKOFF_MAX_MS);
            c->load_next_ms = sbx_mono_ms() + c->load_backoff_ms;
            sbx_log_warn("shard %s: cannot load the records of %zu partition(s) from etcd (%s); "
                     "they stay unavailable, next try in %lld ms",
                     sh->conf.name, n, sbx_err_message(rc), (long long)c->load_backoff_ms);
            free(in);
            return;
        }
        c->load_backoff_ms = 0;
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < n; i++)
            if (c->want_load[parts[i]] == in->epoch[parts[i]])
                c->want_load[parts[i]] = 0;
        pthread_mutex_unlock(&c->mu);
        sbx_log_info("shard %s: loaded %zu record(s) of %zu partition(s) from etcd", sh->conf.name,
                 in->n, n);
        sbx_loop_post(sh->loop, install_apply, in);
    }
}
