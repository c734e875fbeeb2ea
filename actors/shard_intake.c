/*
 * shard_intake.c — requests into the shard: the REP socket's nng contexts
 * and the intake of each request (size, msgpack, the gateway's routing
 * wrapper, the envelope, the operation, idempotency, cluster admission)
 * before it goes to its actor's mailbox or to a shard-level operation.
 *
 * Threads: shard_sctx_cb runs on nng's threads and only moves messages and
 * posts to the loop; on_request and shard_sctx_send run on the shard's loop
 * thread.  A request becomes a struct sop (owned by the shard until it is
 * answered: shard_reply*, which free it); a request refused here is
 * answered at once (reply_early) and its sop freed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "ops_gen.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* nng contexts.  Callbacks run on nng's task thread (one per process,
 * tools/nng-build.sh): they only move messages and post to the loop (never
 * block, never wait for nng nor close sockets: actors-cluster.md §1f). */

static void on_request(sbx_loop *l, void *arg);

void
shard_sctx_cb(void *arg)
{
    struct sctx *c = arg;
    int rv = nng_aio_result(c->aio);
    if (c->state == SCTX_SEND) {
        if (rv != 0) {
            nng_msg *m = nng_aio_get_msg(c->aio);
            if (m)
                nng_msg_free(m);
        }
        if (rv == NNG_ECLOSED)
            return;
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    if (c->state != SCTX_RECV)
        return;
    if (rv != 0) {
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            return;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    c->state = SCTX_WORK;
    sbx_loop_post(c->sh->loop, on_request, c);
}

void
shard_sctx_send(struct sctx *c, const char *buf, size_t len)
{
    nng_msg *m;
    if (c->sh->ctx_closed)
        return; /* shutting down: the socket is gone */
    if (nng_msg_alloc(&m, len) != 0) {
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    memcpy(nng_msg_body(m), buf, len);
    nng_aio_set_msg(c->aio, m);
    c->state = SCTX_SEND;
    nng_ctx_send(c->ctx, c->aio);
}

/* ------------------------------------------------------------------------------ */
/* Request intake. */

static void
reply_early(struct sctx *c, sbx_str id, int code, const char *fmt, ...)
{
    char msg[512], *buf;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (sbx_wire_reply_errf(id, code, &buf, &len, "%s", msg) == 0) {
        shard_sctx_send(c, buf, len);
        free(buf);
    }
}

/* Whether sandbox ID `id` is in the namespace of `tenant` ("" the default
 * tenant: IDs without "--"; else "<tenant>--…"), gateway/tenant.h. */
static bool
shard_tenant_owns(const char *tenant, sbx_str id)
{
    size_t tl = strlen(tenant);
    if (!tl) {
        for (size_t i = 0; i + 1 < id.n; i++)
            if (id.p[i] == '-' && id.p[i + 1] == '-')
                return false;
        return true;
    }
    return id.n > tl + 2 && !memcmp(id.p, tenant, tl) && id.p[tl] == '-' && id.p[tl + 1] == '-';
}

static void
on_request(sbx_loop *l, void *arg)
{
    struct sctx *c = arg;
    struct shard *sh = c->sh;
    char why[256];
    (void)l;

    nng_msg *m = nng_aio_get_msg(c->aio);
    sh->n_requests++;
    if (!m) {
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    struct sop *op = sbx_xcalloc(1, sizeof(*op));
    op->sh = sh;
    op->msg = m;
    op->ctx[op->nctx++] = c;
    op->t0_us = sbx_mono_us();
    op->frame = nng_msg_body(m);
    op->frame_len = nng_msg_len(m);
    sbx_str noid = {"", 0};

    if (op->frame_len > SBX_WIRE_MAX_REQUEST) {
        reply_early(c, noid, SBX_E_TOO_LARGE, "request of %zu bytes exceeds the %u-byte limit",
                    op->frame_len, SBX_WIRE_MAX_REQUEST);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    if (sbx_wire_decode(&op->dec, op->frame, op->frame_len, &sbx_wire_limits_request) != 0) {
        reply_early(c, noid, SBX_E_MALFORMED, "the request is not a valid msgpack map");
        op->nctx = 0;
        sop_free(op);
        return;
    }
    /* A request forwarded by a gateway is wrapped: { v, route: {…}, req: bin }. */
    sbx_str inner;
    int64_t route_epoch = 0;
    bool routed = false;
    /* The tenant the gateway stamped (gateway/tenant.h), copied before the
     * outer map is freed; tenant_set false: none (keyless, or the system). */
    char tenant[20] = "";
    bool tenant_set = false;
    if (sbx_wire_get_bin(op->dec.root, "req", &inner) == 0) {
        const msgpack_object *route;
        routed = true;
        if (sbx_wire_get_map(op->dec.root, "route", &route) == 0) {
            sbx_str ts;
            sbx_wire_get_i64(route, "epoch", &route_epoch);
            if (sbx_wire_get_str(route, "tenant", &ts) == 0 && ts.n < sizeof(tenant)) {
                sbx_str_copy(ts, tenant, sizeof(tenant));
                sbx_str_copy(ts, op->tenant, sizeof(op->tenant));
                tenant_set = op->tenant_set = true;
            }
            /* The caller's key id: its changes go to the audit log (audit.c). */
            if (sbx_wire_get_str(route, "keyId", &ts) == 0 && ts.n < sizeof(op->audit_key))
                sbx_str_copy(ts, op->audit_key, sizeof(op->audit_key));
        }
        /* The inner bytes live in the nng message, not in the decoded outer map. */
        sbx_wire_msg_free(&op->dec);
        if (sbx_wire_decode(&op->dec, inner.p, inner.n, &sbx_wire_limits_request) != 0) {
            reply_early(c, noid, SBX_E_MALFORMED, "the forwarded request is not a valid msgpack map");
            op->nctx = 0;
            sop_free(op);
            return;
        }
        op->frame = inner.p;
        op->frame_len = inner.n;
    }
    int rc = sbx_wire_parse_req(op->dec.root, &op->req, why, sizeof(why));
    if (rc) {
        reply_early(c, op->req.id, rc, "%s", why);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    if (op->req.timeout_ms > 0)
        op->ctx_deadline[0] = op->t0_us / 1000 + shard_deadline(op->req.timeout_ms);
    /* The one intake check, the same as the gateway's (runtime/ops.h); an
     * internal op is for peers, not for what a gateway forwards. */
    rc = sbx_op_intake(&op->req, routed, &op->def, why, sizeof(why));
    if (rc) {
        reply_early(c, op->req.id, rc, "%s", why);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    /* Defence in depth: a sandbox outside the stamped tenant's namespace
     * ("<tenant>--<id>"; the default tenant's IDs hold no "--") does not
     * exist for it, whatever the gateway forwarded. */
    if (tenant_set && op->req.sandbox.n && !shard_tenant_owns(tenant, op->req.sandbox)) {
        reply_early(c, op->req.id, SBX_E_NOT_FOUND, "sandbox '%.*s' does not exist",
                    (int)op->req.sandbox.n, op->req.sandbox.p);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    snprintf(op->id, sizeof(op->id), "%.*s\x1f%.*s\x1f%s", (int)op->req.id.n, op->req.id.p,
             (int)SBX_MIN(op->req.sandbox.n, 64), op->req.sandbox.p, op->def->name);

    /* Idempotency: a retry of a request we have seen joins it or gets its reply. */
    struct idem *e = idem_find(sh, op->id);
    if (e) {
        if (e->inflight) {
            if (e->inflight->nctx < (int)SBX_ARRAY_LEN(e->inflight->ctx)) {
                struct sop *first = e->inflight;
                first->ctx_deadline[first->nctx] = op->ctx_deadline[0];
                first->ctx[first->nctx++] = c;
                shard_deadline_arm(first); /* this attempt's deadline is its own */
                op->nctx = 0;
                sop_free(op);
                return;
            }
            /* Every reply slot is taken (a client retrying a long command
             * with a shorter deadline of its own): this attempt must not
             * fall through and run the request a second time
             * (tests/integration/test_faults.c
             * many_concurrent_retries_of_one_request_id_run_it_once). */
            reply_early(c, op->req.id, SBX_E_BUSY,
                        "request '%s' is still being handled and %d attempts already wait for "
                        "its reply; retry later with the same id",
                        op->id, e->inflight->nctx);
            op->nctx = 0;
            sop_free(op);
            return;
        } else {
            char *rbuf;
            size_t rlen;
            bool owned;
            if (idem_reply(sh, e, &rbuf, &rlen, &owned) == 0) {
                shard_sctx_send(c, rbuf, rlen);
                if (owned)
                    free(rbuf);
                op->nctx = 0;
                sop_free(op);
                return;
            }
        }
    }

    /* Ops the shard runs itself (runtime/ops.yaml: internal ops, and its part
     * of the deployment-wide ones; generated table, actors/ops_gen.c). */
    if (shard_ops[op->def->id]) {
        /* A node op (the image store) is a request like a sandbox's: a
         * retry with its id joins it or gets its reply (docs/protocol.md §2). */
        if (!e && (op->def->flags & SBX_OP_NODE))
            idem_add(sh, op->id, op);
        shard_ops[op->def->id](op);
        return;
    }
    if ((rc = sbx_id_check(op->req.sandbox.p, op->req.sandbox.n, why, sizeof(why))) != 0) {
        reply_early(c, op->req.id, rc, "%s", why);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    if (cluster_on(sh)) {
        sbx_werr w;
        uint32_t part = sbx_place_partition(op->req.sandbox.p, op->req.sandbox.n);
        if (cluster_admit(sh, part, route_epoch, &w) != 0) {
            char *buf;
            size_t len;
            if (sbx_wire_reply_err(op->req.id, &w, &buf, &len) == 0) {
                shard_sctx_send(c, buf, len);
                free(buf);
            }
            sbx_werr_free(&w);
            op->nctx = 0;
            sop_free(op);
            return;
        }
        if (!e && op->req.retry && idem_durable_op(op) && cluster_in_doubt(sh, part)) {
            /* A retry of a request that may have run on the partition's
             * earlier owner, whose idempotency table we lack (a failover):
             * its outcome is unknown, and it does not run a second time. */
            reply_early(c, op->req.id, SBX_E_INTERRUPTED,
                        "request '%.*s' is a retry after an unknown outcome, and shard %s took "
                        "over this sandbox's partition less than %lld s ago (a failover or a "
                        "restart): the earlier attempt may have run on its owner before; it "
                        "does not run again (send a new request id to run it anew)",
                        (int)op->req.id.n, op->req.id.p, sh->conf.name,
                        (long long)(idem_ttl_ms(sh) / 1000));
            op->nctx = 0;
            sop_free(op);
            return;
        }
    }
    if (!e)
        idem_add(sh, op->id, op);
    /* A create by an image name this node lacks: the peers resolve it first
     * (docs/images.md, "Images in a cluster"). */
    if (op->def->id == SBX_OPID_CREATE && shard_image_resolve(sh, op))
        return;
    shard_enqueue(sh, op);
}

void
shard_enqueue(struct shard *sh, struct sop *op)
{
    char sid[64];
    sbx_str_copy(op->req.sandbox, sid, sizeof(sid));
    struct actor *a = actor_get(sh, sid, true);
    if (!a) {
        shard_reply_err(op, SBX_E_STORAGE, "cannot load sandbox '%s' from the store", sid);
        return;
    }
    actor_enqueue(a, op);
}
