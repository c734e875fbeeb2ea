/*
 * gw_merge.c — the gateway's answers to fanned-out operations: every shard's
 * replies merged (list, cluster.status, metrics, audit.list).  Runs on the
 * nng thread of the last shard reply (gateway.c fwd_done).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/ops.h"
#include "../runtime/prom.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "gateway_int.h"
#include "gw_metrics.h"
#include "tenant.h"

/* ------------------------------------------------------------------------------ */
/* Fan-out (list, cluster.status). */

static void
encode_cluster(struct sbx_gateway *gw, sbx_enc *e)
{
    sbx_enc_kmap(e, "cluster");
    sbx_enc_kstr(e, "name", gw->conf.cluster ? gw->conf.cluster : "default");
    sbx_enc_kstr(e, "etcd", gw->conf.etcd);
    sbx_cview_lock(gw->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(gw->view, &n);
    const struct sbx_cpart *parts = sbx_cview_parts(gw->view);
    sbx_enc_kbool(e, "synced", sbx_cview_synced(gw->view));
    sbx_enc_kint(e, "revision", sbx_cview_revision(gw->view));
    int unowned = 0;
    for (int p = 0; p < SBX_PARTITIONS; p++)
        unowned += parts[p].owner < 0 || !m[parts[p].owner].live;
    sbx_enc_kint(e, "partitionsWithoutLiveOwner", unowned);
    sbx_enc_karray(e, "members");
    for (int i = 0; i < n; i++) {
        int cnt = 0;
        int64_t minep = 0, maxep = 0;
        for (int p = 0; p < SBX_PARTITIONS; p++) {
            if (parts[p].owner != i)
                continue;
            cnt++;
            if (parts[p].epoch > maxep)
                maxep = parts[p].epoch;
            if (!minep || parts[p].epoch < minep)
                minep = parts[p].epoch;
        }
        if (!m[i].live && !cnt)
            continue;
        sbx_enc_map(e);
        sbx_enc_kstr(e, "name", m[i].name);
        sbx_enc_kstr(e, "url", m[i].url);
        sbx_enc_kbool(e, "live", m[i].live);
        sbx_enc_kbool(e, "draining", m[i].draining);
        sbx_enc_kint(e, "partitions", cnt);
        sbx_enc_kint(e, "minEpoch", minep);
        sbx_enc_kint(e, "maxEpoch", maxep);
        sbx_enc_end(e);
    }
    sbx_enc_end(e);
    sbx_cview_unlock(gw->view);
    sbx_enc_end(e);
}

/* `metrics`: the gateway's own families, then every shard's merged in
 * (docs/operations.md, "Metrics"); answered as {text}. */
static void
merge_metrics(struct gctx *g)
{
    struct sbx_gateway *gw = g->gw;
    sbx_prom p;
    struct gw_counters gc = {
        .gateway = gw->conf.name,
        .requests = atomic_load(&gw->n_requests),
        .errors = atomic_load(&gw->n_errors),
        .retries = atomic_load(&gw->n_retries),
        .uptime_s = (double)(sbx_wall_ms() - gw->started_ms) / 1000,
        .http = gw->http != NULL,
        .clustered = gw_clustered(gw),
    };
    if (gw->http)
        sbx_http_counters(gw->http, &gc.http_requests, &gc.http_errors);
    sbx_prom_init(&p);
    gw_metrics_gateway(&p, &gc);
    if (gw->tenants)
        sbx_tenants_metrics(gw->tenants, &p);
    for (int i = 0; i < gw->nshards; i++) {
        struct gfwd *f = &g->fwd[i];
        if (!g->in_fanout[i])
            continue;
        char sname[64], surl[256];
        gw_slot_label(f->s, sname, surl);
        int parts = -1;
        if (!gw_clustered(gw)) {
            parts = 0;
            for (int k = 0; k < SBX_PARTITIONS; k++)
                parts += gw->table[k] == i;
        }
        gw_metrics_shard(&p, sname, atomic_load(&f->s->pipes) > 0 && f->reply && !f->rv, parts,
                         f->reply ? nng_msg_body(f->reply) : NULL,
                         f->reply ? nng_msg_len(f->reply) : 0);
        if (f->reply) {
            nng_msg_free(f->reply);
            f->reply = NULL;
        }
    }
    sbx_buf text;
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_str id = {g->id, strlen(g->id)};
    sbx_buf_init(&text);
    sbx_prom_render(&p, &text);
    sbx_prom_free(&p);
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, id);
    sbx_enc_kstrn(&e, "text", text.p ? text.p : "", text.len);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_buf_free(&text);
    gw_request_done(g);
    if (sbx_enc_finish(&e, &buf, &len) == 0) {
        gw_client_send_bytes(g, buf, len);
        free(buf);
    } else {
        gw_client_err(g, SBX_E_INTERNAL, "could not encode the metrics");
    }
}

/* audit.list: every shard's entries in time order, the newest `limit`. */
struct audit_item {
    int64_t at;
    const msgpack_object *o;
};

static int
cmp_audit(const void *a, const void *b)
{
    int64_t x = ((const struct audit_item *)a)->at, y = ((const struct audit_item *)b)->at;
    return x < y ? -1 : x > y;
}

static void
merge_audit(struct gctx *g)
{
    struct sbx_gateway *gw = g->gw;
    sbx_msg ms[MAX_SLOTS];
    bool have[MAX_SLOTS] = {false};
    struct audit_item *items = NULL;
    size_t n = 0;
    for (int i = 0; i < gw->nshards; i++) {
        struct gfwd *f = &g->fwd[i];
        const msgpack_object *r, *arr;
        if (!g->in_fanout[i] || !f->reply ||
            sbx_wire_decode(&ms[i], nng_msg_body(f->reply), nng_msg_len(f->reply),
                            &sbx_wire_limits_reply) != 0)
            continue;
        have[i] = true;
        if (sbx_wire_get_map(ms[i].root, "result", &r) != 0 ||
            sbx_wire_get_array(r, "entries", &arr) != 0)
            continue;
        items = sbx_xrealloc(items, (n + arr->via.array.size + 1) * sizeof(*items));
        for (uint32_t k = 0; k < arr->via.array.size; k++) {
            items[n].o = &arr->via.array.ptr[k];
            items[n].at = 0;
            if (items[n].o->type == MSGPACK_OBJECT_MAP)
                sbx_wire_get_i64(items[n].o, "at", &items[n].at);
            n++;
        }
    }
    if (n)
        qsort(items, n, sizeof(*items), cmp_audit);
    size_t from = n > g->limit ? n - g->limit : 0;
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){g->id, strlen(g->id)});
    sbx_enc_karray(&e, "entries");
    for (size_t i = from; i < n; i++)
        sbx_enc_obj(&e, items[i].o);
    sbx_enc_end(&e);
    sbx_enc_kint(&e, "count", (int64_t)(n - from));
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    free(items);
    for (int i = 0; i < MAX_SLOTS; i++) {
        if (have[i])
            sbx_wire_msg_free(&ms[i]);
        if (g->fwd[i].reply) {
            nng_msg_free(g->fwd[i].reply);
            g->fwd[i].reply = NULL;
        }
    }
    gw_request_done(g);
    if (sbx_enc_finish(&e, &buf, &len) == 0) {
        gw_client_send_bytes(g, buf, len);
        free(buf);
    } else {
        gw_client_err(g, SBX_E_INTERNAL, "could not encode the merged audit log");
    }
}

void
gw_merge_and_reply(struct gctx *g)
{
    struct sbx_gateway *gw = g->gw;
    bool is_list = g->op_id == SBX_OPID_LIST;
    if (g->op_id == SBX_OPID_METRICS) {
        merge_metrics(g);
        return;
    }
    if (g->op_id == SBX_OPID_AUDIT_LIST) {
        merge_audit(g);
        return;
    }
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_str id = {g->id, strlen(g->id)};
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, id);
    if (is_list) {
        size_t count = 0;
        /* idsOnly: each shard's defaults, the largest of each kept (the
         * tenant registry's estimate of a new sandbox, docs/security.md §6). */
        int64_t defs[3] = {-1, -1, -1};
        static const char *const defk[3] = {"memory", "cpu", "disk"};
        sbx_enc_karray(&e, "sandboxes");
        for (int i = 0; i < gw->nshards; i++) {
            struct gfwd *f = &g->fwd[i];
            if (!g->in_fanout[i] || !f->reply)
                continue;
            sbx_msg m;
            if (sbx_wire_decode(&m, nng_msg_body(f->reply), nng_msg_len(f->reply),
                                &sbx_wire_limits_reply) == 0) {
                const msgpack_object *r, *arr, *dm;
                if (sbx_wire_get_map(m.root, "result", &r) == 0 &&
                    sbx_wire_get_map(r, "defaults", &dm) == 0)
                    for (int d = 0; d < 3; d++) {
                        int64_t v;
                        if (sbx_wire_get_i64(dm, defk[d], &v) == 0 && v > defs[d])
                            defs[d] = v;
                    }
                if (sbx_wire_get_map(m.root, "result", &r) == 0 &&
                    sbx_wire_get_array(r, "sandboxes", &arr) == 0) {
                    for (uint32_t k = 0; k < arr->via.array.size; k++) {
                        const msgpack_object *it = &arr->via.array.ptr[k];
                        sbx_str sid = {"", 0};
                        if (g->tenanted) {
                            /* Only the caller's own sandboxes, under their own IDs. */
                            sbx_wire_get_str(it, "id", &sid);
                            if (!sbx_tenants_owns(&g->who, sid))
                                continue;
                            sbx_tenants_enc_obj(&e, &g->who, it);
                        } else {
                            sbx_enc_obj(&e, it);
                        }
                        count++;
                    }
                }
                sbx_wire_msg_free(&m);
            }
        }
        sbx_enc_end(&e);
        sbx_enc_kint(&e, "count", (int64_t)count);
        if (defs[0] >= 0) {
            sbx_enc_kmap(&e, "defaults");
            for (int d = 0; d < 3; d++)
                sbx_enc_kint(&e, defk[d], defs[d]);
            sbx_enc_end(&e);
        }
    } else {
        sbx_enc_kmap(&e, "gateway");
        sbx_enc_kstr(&e, "name", gw->conf.name);
        sbx_enc_kstr(&e, "listen", gw->conf.listen);
        sbx_enc_kint(&e, "uptimeMs", sbx_wall_ms() - gw->started_ms);
        sbx_enc_kint(&e, "requests", (int64_t)atomic_load(&gw->n_requests));
        sbx_enc_kint(&e, "errors", (int64_t)atomic_load(&gw->n_errors));
        sbx_enc_kint(&e, "retries", (int64_t)atomic_load(&gw->n_retries));
        sbx_enc_kint(&e, "partitions", SBX_PARTITIONS);
        sbx_enc_end(&e);
        if (gw_clustered(gw))
            encode_cluster(gw, &e);
    }
    sbx_enc_karray(&e, "shards");
    for (int i = 0; i < gw->nshards; i++) {
        struct gfwd *f = &g->fwd[i];
        if (!g->in_fanout[i])
            continue;
        char sname[64], surl[256];
        gw_slot_label(f->s, sname, surl);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "name", sname);
        sbx_enc_kstr(&e, "url", surl);
        sbx_enc_kbool(&e, "connected", atomic_load(&f->s->pipes) > 0);
        if (!is_list && !gw_clustered(gw)) {
            int parts = 0;
            for (int p = 0; p < SBX_PARTITIONS; p++)
                parts += gw->table[p] == i;
            sbx_enc_kint(&e, "partitions", parts);
        }
        bool ok = false;
        if (f->reply) {
            sbx_msg m;
            if (sbx_wire_decode(&m, nng_msg_body(f->reply), nng_msg_len(f->reply),
                                &sbx_wire_limits_reply) == 0) {
                const msgpack_object *r, *st;
                sbx_wire_get_bool(m.root, "ok", &ok);
                if (!is_list && sbx_wire_get_map(m.root, "result", &r) == 0 &&
                    sbx_wire_get_map(r, "shard", &st) == 0) {
                    sbx_enc_str(&e, "status");
                    sbx_enc_obj(&e, st);
                }
                sbx_wire_msg_free(&m);
            }
        }
        sbx_enc_kstr(&e, "health", ok ? "ok" : "unavailable");
        if (!ok)
            sbx_enc_kstr(&e, "error",
                         f->rv ? nng_strerror(f->rv) : "the shard answered with an error");
        sbx_enc_end(&e);
        if (f->reply) {
            nng_msg_free(f->reply);
            f->reply = NULL;
        }
    }
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    gw_request_done(g);
    if (sbx_enc_finish(&e, &buf, &len) == 0) {
        gw_client_send_bytes(g, buf, len);
        free(buf);
    } else {
        gw_client_err(g, SBX_E_INTERNAL, "could not encode the merged reply");
    }
}

