/*
 * metrics.c — the shard's part of GET /metrics (the `metrics` operation,
 * runtime/ops/cluster.yaml; docs/operations.md "Metrics").
 *
 * The gateway fans `metrics` out to every shard as it does cluster.status;
 * each shard answers {families: [[name, type, help, sample lines], ...]},
 * every sample labelled shard="<name>", and the gateway merges the families
 * into one exposition (runtime/prom.h sbx_prom_add_raw).  Label values are
 * bounded sets: shard names, operation names of the schema, error code names,
 * record and container states — never a sandbox ID.
 *
 * Each answer is also a debug log line naming the request (its id, sandbox
 * and operation: runtime/log.h sbx_log_req), so a request id leads from the
 * gateway's lines to the shard's.
 *
 * Everything here runs on the shard's loop thread, which owns sh->mx; the
 * store's histograms are copied under its lock (sbx_store_hists), the relay
 * count under the relay's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/log.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "shard_int.h"

void
shard_metrics_reply(struct sop *op)
{
    struct shard *sh = op->sh;
    if (!op->def || !op->t0_us)
        return;
    int slot = 0;
    if (op->code) {
        int c = op->code >= SBX_E__FIRST && op->code < SBX_E__LAST ? op->code : SBX_E_INTERNAL;
        slot = 1 + (c - SBX_E__FIRST);
    }
    if (!sh->mx.ops)
        sh->mx.ops = sbx_xcalloc((size_t)SBX_OPID__COUNT * SHARD_MX_CODES, sizeof(*sh->mx.ops));
    struct sbx_hist **h = &sh->mx.ops[(size_t)op->def->id * SHARD_MX_CODES + (size_t)slot];
    if (!*h)
        *h = sbx_xcalloc(1, sizeof(**h));
    int64_t us = sbx_mono_us() - op->t0_us;
    sbx_hist_observe(*h, sbx_prom_latency_s, sbx_prom_latency_n, (double)us / 1e6);
    struct sbx_log_req lr = {op->req.id.p,      op->req.id.n, op->req.sandbox.p,
                             op->req.sandbox.n, op->req.op.p, op->req.op.n};
    sbx_log_req_debug(&lr, "shard %s answered %s in %.3f ms", sh->conf.name,
                      op->code ? sbx_err_name(op->code) : "OK", (double)us / 1000);
}

void
shard_metrics_free(struct shard *sh)
{
    if (!sh->mx.ops)
        return;
    for (size_t i = 0; i < (size_t)SBX_OPID__COUNT * SHARD_MX_CODES; i++)
        free(sh->mx.ops[i]);
    free(sh->mx.ops);
    sh->mx.ops = NULL;
}

/* Records by state (the state the record holds: what `status` answers). */
struct by_state {
    char state[8][16];
    uint64_t n[8];
    int k;
    uint64_t other;
};

static int
count_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct by_state *bs = arg;
    struct sbx_record r;
    (void)k;
    (void)kn;
    if (sbx_record_decode(v, vn, &r) != 0)
        return 0;
    int i = 0;
    while (i < bs->k && strcmp(bs->state[i], r.state))
        i++;
    if (i == bs->k && bs->k < 8)
        snprintf(bs->state[bs->k++], sizeof(bs->state[0]), "%s", r.state);
    if (i < bs->k)
        bs->n[i]++;
    else
        bs->other++;
    sbx_record_free(&r);
    return 0;
}

/* Declare family name and add one sample with the shard's label (plus one
 * more pair when k is not NULL). */
static void
one(sbx_prom *p, const char *shard, const char *name, const char *type, const char *help,
    const char *suffix, const char *k, const char *v, double value)
{
    char l[256];
    sbx_prom_family(p, name, type, help);
    if (sbx_prom_labels(l, sizeof(l), "shard", shard, k, v, NULL) == 0)
        sbx_prom_add(p, name, suffix, l, value);
}

static void
collect(struct shard *sh, sbx_prom *p)
{
    const char *sn = sh->conf.name;
    char l[256];

    struct by_state bs = {0};
    sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, count_one, &bs);
    sbx_prom_family(p, "sbx_sandboxes", "gauge",
                    "sandboxes whose record the shard holds, by the record's state");
    for (int i = 0; i < bs.k; i++)
        one(p, sn, "sbx_sandboxes", "gauge", "", "", "state", bs.state[i], (double)bs.n[i]);
    if (bs.other)
        one(p, sn, "sbx_sandboxes", "gauge", "", "", "state", "other", (double)bs.other);

    static const char *const cs_name[] = {"none", "starting", "running", "stopping"};
    uint64_t cs[4] = {0};
    for (size_t b = 0; b < sh->actors.nbuckets; b++)
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext)
            cs[a->cs & 3]++;
    for (int i = 1; i < 4; i++)
        one(p, sn, "sbx_containers", "gauge",
            "containers of the shard's sandboxes by state (warm pool not included)", "", "state",
            cs_name[i], (double)cs[i]);
    one(p, sn, "sbx_actors", "gauge", "sandboxes held in memory (an actor each)", "", NULL,
        NULL, (double)sh->actors.n);

    one(p, sn, "sbx_shard_requests_total", "counter", "requests the shard received", "", NULL,
        NULL, (double)sh->n_requests);
    sbx_prom_family(p, "sbx_operation_duration_seconds", "histogram",
                    "time from a request's arrival at the shard to its reply (after the output "
                    "gate), by operation and result code (OK or the error's code)");
    for (int op = 0; sh->mx.ops && op < SBX_OPID__COUNT; op++)
        for (int slot = 0; slot < SHARD_MX_CODES; slot++) {
            const struct sbx_hist *h = sh->mx.ops[(size_t)op * SHARD_MX_CODES + (size_t)slot];
            if (!h)
                continue;
            const char *code = slot ? sbx_err_name(SBX_E__FIRST + slot - 1) : "OK";
            if (sbx_prom_labels(l, sizeof(l), "shard", sn, "op", sbx_ops[op].name, "code", code,
                                NULL) == 0)
                sbx_prom_add_hist(p, "sbx_operation_duration_seconds", l, sbx_prom_latency_s,
                                  sbx_prom_latency_n, h);
        }

    sbx_prom_family(p, "sbx_container_start_seconds", "histogram",
                    "time to set up a container (namespaces, root, agent ready), pooled or not");
    if (sbx_prom_labels(l, sizeof(l), "shard", sn, NULL) == 0)
        sbx_prom_add_hist(p, "sbx_container_start_seconds", l, sbx_prom_latency_s,
                          sbx_prom_latency_n, &sh->mx.start);
    one(p, sn, "sbx_container_starts_total", "counter", "container starts by outcome", "",
        "result", "ok", (double)sh->n_started);
    one(p, sn, "sbx_container_starts_total", "counter", "", "", "result", "failed",
        (double)sh->n_start_failed);
    one(p, sn, "sbx_container_deaths_total", "counter", "containers that died unasked", "",
        NULL, NULL, (double)sh->n_died);

    one(p, sn, "sbx_pool_size", "gauge", "warm containers in the pool", "", NULL, NULL,
        sh->pool.n);
    one(p, sn, "sbx_pool_target", "gauge", "warm containers the pool aims for", "", NULL, NULL,
        sh->pool.target);
    one(p, sn, "sbx_pool_takes_total", "counter",
        "container starts asked of the pool: hit (a warm one) or miss", "", "result", "hit",
        (double)sh->n_pool_hits);
    one(p, sn, "sbx_pool_takes_total", "counter", "", "", "result", "miss",
        (double)sh->n_pool_misses);

    uint64_t batches, writes, failed;
    struct sbx_hist hc, hb;
    sbx_store_stat(sh->store, &batches, &writes, &failed);
    sbx_store_hists(sh->store, &hc, &hb);
    one(p, sn, "sbx_lmdb_commits_total", "counter", "LMDB write batches by outcome", "", "result",
        "ok", (double)batches);
    one(p, sn, "sbx_lmdb_commits_total", "counter", "", "", "result", "failed", (double)failed);
    one(p, sn, "sbx_lmdb_writes_total", "counter", "record writes committed", "", NULL, NULL,
        (double)writes);
    one(p, sn, "sbx_lmdb_log_commits_total", "counter",
        "write batches committed through the store's redo log (one flush), counted in "
        "sbx_lmdb_commits_total too",
        "", NULL, NULL, (double)sbx_store_logged(sh->store));
    one(p, sn, "sbx_lmdb_map_bytes", "gauge", "size of the LMDB map", "", NULL, NULL,
        (double)sbx_store_mapsize(sh->store));
    sbx_prom_family(p, "sbx_lmdb_commit_seconds", "histogram",
                    "time of one group commit (a batch's transaction)");
    sbx_prom_family(p, "sbx_lmdb_batch_writes", "histogram", "writes per group commit");
    if (sbx_prom_labels(l, sizeof(l), "shard", sn, NULL) == 0) {
        sbx_prom_add_hist(p, "sbx_lmdb_commit_seconds", l, sbx_prom_latency_s, sbx_prom_latency_n,
                          &hc);
        sbx_prom_add_hist(p, "sbx_lmdb_batch_writes", l, sbx_prom_batch_sizes, sbx_prom_batch_n,
                          &hb);
    }

    struct sbx_net_stats ns;
    if (sh->net && sbx_net_totals(sh->net, &ns) == 0) { /* docs/network.md, usage */
        one(p, sn, "sbx_egress_bytes_total", "counter",
            "IP bytes of egress sandboxes through the router, since the shard started", "",
            "direction", "out", (double)ns.bytes_out);
        one(p, sn, "sbx_egress_bytes_total", "counter", "", "", "direction", "in",
            (double)ns.bytes_in);
        one(p, sn, "sbx_egress_connections_total", "counter",
            "new outbound connections the policy accepted, since the shard started", "", NULL,
            NULL, (double)ns.connections);
    }

    pthread_mutex_lock(&sh->relay.mu);
    int relays = sh->relay.nconns;
    pthread_mutex_unlock(&sh->relay.mu);
    one(p, sn, "sbx_relay_connections", "gauge",
        "open relay connections (preview URLs and terminals) into the shard's sandboxes", "",
        NULL, NULL, relays);

    cluster_metrics(sh, p);
}

void
shard_op_metrics(struct sop *op)
{
    struct shard *sh = op->sh;
    sbx_prom p;
    sbx_enc e;
    sbx_prom_init(&p);
    collect(sh, &p);
    shard_reply_begin(op, &e);
    sbx_enc_karray(&e, "families");
    for (size_t i = 0; i < p.n; i++) {
        const char *name, *type, *help, *body;
        size_t len;
        sbx_prom_get(&p, i, &name, &type, &help, &body, &len);
        sbx_enc_array(&e);
        sbx_enc_str(&e, name);
        sbx_enc_str(&e, type);
        sbx_enc_str(&e, help);
        sbx_enc_strn(&e, body, len);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    sbx_prom_free(&p);
    shard_reply_end(op, &e, 0);
}
