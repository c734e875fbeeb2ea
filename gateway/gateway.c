/* gateway.c — see gateway.h (the tenancy step is gw_tenant.c, fan-out
 * merges gw_merge.c, cross-shard forks gw_fork.c).  Everything runs in nng aio callbacks: no
 * callback blocks, and sockets are only closed from sbx_gateway_stop (or, in
 * a cluster, replaced by the view thread; a slot's socket is never closed
 * while the gateway runs, only re-dialed).  nng runs the callbacks on one
 * task thread (tools/nng-build.sh), so a callback that waited for nng
 * (nng_close, nng_aio_stop/wait/free, nng_send/nng_recv) would deadlock,
 * and so would one that took a lock held by a thread waiting for nng.
 *
 * Shards occupy slots.  Standalone: slot i is the i-th configured shard and
 * the partition table is the rendezvous hash over them, fixed.  In a cluster:
 * slot i is member i of the etcd view and the table is etcd's, read under the
 * view's lock for each request.  The view may give a slot that no shard
 * holds any more to another (runtime/cview.h: a new gen); the slot's socket
 * then dials the new shard's address instead (its dialer is replaced). */
#include "gateway.h"
#include "gw_fork.h"

#include <errno.h>
#include <jansson.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cleanup.h"
#include "../runtime/cview.h"
#include "../runtime/err.h"
#include "../runtime/etcd.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/ops.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "gw_metrics.h"
#include "http.h"
#include "tenant.h"

#include "gateway_int.h"

static bool
clustered(const struct sbx_gateway *gw)
{
    return gw->view != NULL;
}

/* ------------------------------------------------------------------------------ */

/* A counted stream.read of g is answered (tenant quotas, maxStreams). */
static void
stream_release(struct gctx *g)
{
    if (g->stream_key[0] && g->gw->tenants)
        sbx_tenants_stream_leave(g->gw->tenants, g->stream_key);
    g->stream_key[0] = '\0';
}

static void
client_send(struct gctx *g, nng_msg *m)
{
    stream_release(g);
    nng_aio_set_msg(g->aio, m);
    g->state = G_SEND;
    nng_ctx_send(g->ctx, g->aio);
}

static void
client_send_bytes(struct gctx *g, const char *buf, size_t len)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0) {
        stream_release(g);
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
        return;
    }
    memcpy(nng_msg_body(m), buf, len);
    client_send(g, m);
}

static void
client_err(struct gctx *g, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Answer g with an error of code.  unsent: no attempt of this request
 * reached a shard, so nothing of it ran; the error says so with context
 * `ran: false` (docs/protocol.md "Retries"), and a client's retry of it is
 * not one of unknown outcome. */
static void client_err_ran(struct gctx *g, bool unsent, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

static void
client_err_ran(struct gctx *g, bool unsent, int code, const char *fmt, va_list ap)
{
    char msg[512], *buf;
    size_t len;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    atomic_fetch_add(&g->gw->n_errors, 1);
    struct sbx_log_req lr = {g->id, strlen(g->id), NULL, 0, g->op, strlen(g->op)};
    sbx_log_req_debug(&lr, "gateway answered %s: %s", sbx_err_name(code), msg);
    sbx_str id = {g->id, strlen(g->id)};
    sbx_werr w;
    sbx_werr_init(&w, code, "%s", msg);
    if (g->op[0])
        sbx_enc_kstr(sbx_werr_ctx(&w), "operation", g->op);
    if (unsent)
        sbx_enc_kbool(sbx_werr_ctx(&w), "ran", false);
    if (sbx_wire_reply_err(id, &w, &buf, &len) == 0) {
        client_send_bytes(g, buf, len);
        free(buf);
    } else {
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
    }
    sbx_werr_free(&w);
}

static void
client_err(struct gctx *g, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_err_ran(g, false, code, fmt, ap);
    va_end(ap);
}

/* client_err, saying `ran: false` when unsent (no attempt of the request
 * was delivered to a shard). */
static void client_err_unsent(struct gctx *g, bool unsent, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
client_err_unsent(struct gctx *g, bool unsent, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_err_ran(g, unsent, code, fmt, ap);
    va_end(ap);
}

static void
request_done(struct gctx *g)
{
    free(g->body);
    g->body = NULL;
    g->blen = 0;
}

/* ------------------------------------------------------------------------------ */
/* Slots. */

static void pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg);

/* Open slot i's socket to url, for the view member of gen (0: standalone
 * start-up), on the view thread or before any other thread runs; the slot
 * is labelled and published under slot_mu, the socket opened and dialed
 * without it: a failed open's nng_close waits for nng's task threads, one
 * of which may be in slot_label waiting for slot_mu. */
static int
slot_open(struct sbx_gateway *gw, int i, const char *name, const char *url, uint64_t gen,
          sbx_err_t *err)
{
    struct gshard *s = &gw->shards[i];
    s->gw = gw; /* fixed for the slot; read by pipe_cb */
    s->idx = i;
    /* The pipe callbacks go in before the dial starts, so the connection
     * count never misses a peer that is already up. */
    nng_socket sock;
    nng_dialer dialer;
    int rv = sbx_nng_req_dial_notify(&sock, &dialer, url, gw->conf.sec, pipe_cb, s, err);
    if (rv)
        return rv;
    pthread_mutex_lock(&gw->slot_mu);
    s->gen = gen;
    snprintf(s->name, sizeof(s->name), "%s", name);
    snprintf(s->url, sizeof(s->url), "%s", url);
    s->sock = sock;
    s->dialer = dialer;
    if (i >= gw->nshards) /* before open: a fan-out that sees the slot open counts it */
        gw->nshards = i + 1;
    atomic_store(&s->open, true);
    pthread_mutex_unlock(&gw->slot_mu);
    return 0;
}

/* A copy of slot s's name and url (either may be NULL), which a cluster's
 * view thread may rewrite. */
static void
slot_label(struct gshard *s, char name[64], char url[256])
{
    pthread_mutex_lock(&s->gw->slot_mu);
    if (name)
        snprintf(name, 64, "%s", s->name);
    if (url)
        snprintf(url, 256, "%s", s->url);
    pthread_mutex_unlock(&s->gw->slot_mu);
}

/* The helpers above, for the gateway's other parts (gateway_int.h). */
bool
gw_clustered(const struct sbx_gateway *gw)
{
    return clustered(gw);
}

void
gw_client_send_bytes(struct gctx *g, const char *buf, size_t len)
{
    client_send_bytes(g, buf, len);
}

void
gw_client_err(struct gctx *g, int code, const char *msg)
{
    client_err(g, code, "%s", msg);
}

void
gw_client_errf(struct gctx *g, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    client_err_ran(g, false, code, fmt, ap);
    va_end(ap);
}

void
gw_request_done(struct gctx *g)
{
    request_done(g);
}

void
gw_slot_label(struct gshard *s, char name[64], char url[256])
{
    slot_label(s, name, url);
}

/* The view changed: open sockets for new members, and point slots the view
 * gave to another shard (another gen) at it: the old dialer goes, with its
 * connections (what was in flight on them fails, as when a shard drops),
 * and the socket dials the new address.  A member that changed address
 * under the same slot keeps its socket, which redials the old address. */
static void
view_changed(void *arg)
{
    struct sbx_gateway *gw = arg;
    struct {
        int idx;
        uint64_t gen;
        char name[64], url[256], was[64];
        bool redial;
        nng_dialer old;
    } to_open[MAX_SLOTS];
    int nt = 0;
    sbx_cview_lock(gw->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(gw->view, &n);
    for (int i = 0; i < n && i < MAX_SLOTS; i++) {
        if (m[i].live && m[i].url[0] &&
            (!atomic_load(&gw->shards[i].open) || gw->shards[i].gen != m[i].gen)) {
            to_open[nt].idx = i;
            to_open[nt].gen = m[i].gen;
            to_open[nt].redial = false;
            snprintf(to_open[nt].name, sizeof(to_open[nt].name), "%s", m[i].name);
            snprintf(to_open[nt].url, sizeof(to_open[nt].url), "%s", m[i].url);
            nt++;
        }
    }
    sbx_cview_unlock(gw->view);
    pthread_mutex_lock(&gw->slot_mu);
    for (int k = 0; k < nt; k++) {
        struct gshard *s = &gw->shards[to_open[k].idx];
        if (atomic_load(&s->open)) {
            /* relabelled here, re-dialed below without the lock (the gen and
             * the dialer are the view thread's own) */
            to_open[k].redial = true;
            to_open[k].old = s->dialer;
            memcpy(to_open[k].was, s->name, sizeof(to_open[k].was));
            s->gen = to_open[k].gen;
            snprintf(s->name, sizeof(s->name), "%s", to_open[k].name);
            snprintf(s->url, sizeof(s->url), "%s", to_open[k].url);
        }
    }
    pthread_mutex_unlock(&gw->slot_mu);
    for (int k = 0; k < nt; k++) {
        if (!to_open[k].redial) {
            sbx_err_t derr = NULL;
            int rv = slot_open(gw, to_open[k].idx, to_open[k].name, to_open[k].url,
                               to_open[k].gen, &derr);
            if (rv)
                sbx_log_warn("gateway: shard %s: %s", to_open[k].name, sbx_err_msg(derr));
            else
                sbx_log_info("gateway %s: shard %s joined (%s)", gw->conf.name,
                             to_open[k].name, to_open[k].url);
            sbx_err_release(&derr);
            continue;
        }
        struct gshard *s = &gw->shards[to_open[k].idx];
        nng_dialer_close(to_open[k].old);
        sbx_err_t derr = NULL;
        int rv = sbx_nng_dial(s->sock, to_open[k].url, gw->conf.sec, &s->dialer,
                              NNG_FLAG_NONBLOCK, &derr);
        if (rv) {
            s->gen = 0; /* tried again at the next change */
            sbx_log_warn("gateway: cannot dial shard %s: %s", to_open[k].name, sbx_err_msg(derr));
            sbx_err_release(&derr);
        } else {
            sbx_log_info("gateway %s: shard %s joined (%s) in the slot of %s", gw->conf.name,
                     to_open[k].name, to_open[k].url, to_open[k].was);
        }
    }
}

/* A shard connection went away: fail what it was holding, now. */
static void
pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct gshard *s = arg;
    (void)p;
    if (ev == NNG_PIPE_EV_ADD_PRE) { /* paired with REM_POST: runtime/nngx.h */
        atomic_fetch_add(&s->pipes, 1);
        atomic_store(&s->ever, true);
        return;
    }
    if (ev != NNG_PIPE_EV_REM_POST)
        return;
    atomic_fetch_sub(&s->pipes, 1);
    struct sbx_gateway *gw = s->gw;
    for (int i = 0; i < gw->nctx; i++) {
        struct gfwd *f = &gw->ctxs[i].fwd[s->idx];
        if (f->state == F_SEND || f->state == F_RECV)
            nng_aio_cancel(f->aio);
    }
}

/* ------------------------------------------------------------------------------ */
/* Forwarding. */

static void route_and_forward(struct gctx *g);

/* Whether a reply is WRONG_OWNER for a request the shard did not run.  One
 * with context.ran true came from a write that failed after the operation
 * ran (its replication was refused): re-sending it would run it twice. */
static bool
is_wrong_owner(nng_msg *reply)
{
    sbx_msg m;
    bool ok = true, wrong = false, ran = false;
    if (sbx_wire_decode(&m, nng_msg_body(reply), nng_msg_len(reply), &sbx_wire_limits_reply) != 0)
        return false;
    sbx_wire_get_bool(m.root, "ok", &ok);
    const msgpack_object *eo, *ctx;
    sbx_str code;
    if (!ok && sbx_wire_get_map(m.root, "error", &eo) == 0 &&
        sbx_wire_get_str(eo, "code", &code) == 0) {
        if (sbx_wire_get_map(eo, "context", &ctx) == 0)
            sbx_wire_get_bool(ctx, "ran", &ran);
        wrong = sbx_str_eq(code, "WRONG_OWNER") && !ran;
    }
    sbx_wire_msg_free(&m);
    return wrong;
}

/* Try again later if there is time; false if not.  The callers say when:
 * in a cluster (the table is moving), or for a shard that never connected
 * yet (still starting: `sbxd dev` answers before its shards are up). */
static bool
retry_later(struct gctx *g)
{
    int64_t left = g->deadline - sbx_mono_ms();
    int64_t wait = SBX_MIN((int64_t)RETRY_MIN_MS << SBX_MIN(g->attempts, 6), RETRY_MAX_MS);
    if (!g->body || left <= wait + 50)
        return false;
    g->attempts++;
    atomic_fetch_add(&g->gw->n_retries, 1);
    nng_sleep_aio((nng_duration)wait, g->sleep);
    return true;
}

static void
sleep_cb(void *arg)
{
    struct gctx *g = arg;
    if (nng_aio_result(g->sleep) != 0) {
        request_done(g);
        client_err_unsent(g, !g->delivered, SBX_E_SHARD_UNAVAILABLE, "the gateway is stopping");
        return;
    }
    route_and_forward(g);
}

static void
fwd_done(struct gfwd *f, nng_msg *reply, int rv, bool sent)
{
    struct gctx *g = f->g;
    f->state = F_IDLE;
    if (g->fanout) {
        pthread_mutex_lock(&g->mu);
        f->reply = reply;
        f->rv = rv;
        int left = --g->pending;
        pthread_mutex_unlock(&g->mu);
        if (left == 0)
            gw_merge_and_reply(g);
        return;
    }
    if (reply && clustered(g->gw) && is_wrong_owner(reply) && retry_later(g)) {
        nng_msg_free(reply);
        return;
    }
    /* Not sent at all (no connection): nothing ran, so a retry is safe — in
     * a cluster, or while a shard `sbxd dev` is starting has not connected
     * yet (a fresh-clone CI run: `sbx exec` right after `sbxd dev` answered
     * got SHARD_UNAVAILABLE "Connection refused").  A shard that was up and
     * went away, or one nobody starts, is answered at once outside a
     * cluster (a supervisor restarts it; the SDKs retry). */
    if (!reply && !sent &&
        (clustered(g->gw) || (g->gw->conf.await_shards && !atomic_load(&f->s->ever))) &&
        retry_later(g))
        return;
    if (sent)
        g->delivered = true;
    request_done(g);
    if (reply && g->tenanted && g->who.scope != SBX_SCOPE_SYSTEM && g->who.tenant[0]) {
        /* The tenant's IDs as it named them, never "<tenant>--<id>". */
        char *buf;
        size_t blen;
        if (sbx_tenants_rewrite(&g->who, nng_msg_body(reply), nng_msg_len(reply), g->int_id,
                                g->ext_id, &buf, &blen) == 0) {
            nng_msg_free(reply);
            client_send_bytes(g, buf, blen);
            free(buf);
            return;
        }
    }
    if (reply) {
        client_send(g, reply);
        return;
    }
    char sname[64];
    slot_label(f->s, sname, NULL);
    if (rv == NNG_ETIMEDOUT)
        client_err_unsent(g, !g->delivered, SBX_E_SHARD_UNAVAILABLE,
                          "shard %s did not answer before the request's deadline", sname);
    else
        client_err_unsent(g, !g->delivered, SBX_E_SHARD_UNAVAILABLE,
                          "shard %s is unavailable (%s)", sname,
                          rv == NNG_ECANCELED ? "its connection dropped during the request"
                                              : nng_strerror(rv));
}

static void
fwd_cb(void *arg)
{
    struct gfwd *f = arg;
    int rv = nng_aio_result(f->aio);
    if (f->state == F_SEND) {
        if (rv != 0) {
            nng_msg *m = nng_aio_get_msg(f->aio);
            if (m)
                nng_msg_free(m);
            fwd_done(f, NULL, rv, false);
            return;
        }
        int64_t left = f->deadline - sbx_mono_ms();
        if (left < 1)
            left = 1;
        f->state = F_RECV;
        nng_aio_set_timeout(f->aio, (nng_duration)left);
        nng_ctx_recv(f->ctx, f->aio);
        return;
    }
    if (f->state == F_RECV) {
        if (rv != 0) {
            fwd_done(f, NULL, rv, true);
            return;
        }
        fwd_done(f, nng_aio_get_msg(f->aio), 0, true);
    }
}

/* Start forwarding `body` to slot s; the caller counted it in g->pending. */
static void
forward(struct gctx *g, struct gshard *s, const char *body, size_t len, uint32_t part,
        int64_t epoch, int64_t timeout_ms)
{
    struct gfwd *f = &g->fwd[s->idx];
    f->s = s;
    if (!atomic_load(&s->open) || atomic_load(&s->pipes) <= 0) {
        fwd_done(f, NULL, NNG_ECONNREFUSED, false);
        return;
    }
    /* The aio and context of a slot are made on first use. */
    if (!f->aio && nng_aio_alloc(&f->aio, fwd_cb, f) != 0) {
        f->aio = NULL;
        fwd_done(f, NULL, NNG_ENOMEM, false);
        return;
    }
    if (!f->ctx_open) {
        if (nng_ctx_open(&f->ctx, s->sock) != 0) {
            fwd_done(f, NULL, NNG_ENOMEM, false);
            return;
        }
        f->ctx_open = true;
    }
    sbx_enc e;
    char *buf;
    size_t blen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kmap(&e, "route");
    sbx_enc_kint(&e, "partition", part);
    sbx_enc_kint(&e, "epoch", epoch);
    sbx_enc_kstr(&e, "gateway", g->gw->conf.name);
    if (g->tenanted && g->who.scope != SBX_SCOPE_SYSTEM)
        sbx_enc_kstr(&e, "tenant", g->who.tenant); /* the shard checks the namespace */
    if (g->tenanted)
        sbx_enc_kstr(&e, "keyId", g->who.key_id); /* for the shard's audit log */
    sbx_enc_end(&e);
    sbx_enc_kbin(&e, "req", body, len);
    sbx_enc_end(&e);
    nng_msg *m;
    if (sbx_enc_finish(&e, &buf, &blen) != 0 || nng_msg_alloc(&m, blen) != 0) {
        fwd_done(f, NULL, NNG_ENOMEM, false);
        return;
    }
    memcpy(nng_msg_body(m), buf, blen);
    free(buf);
    f->deadline = sbx_mono_ms() + timeout_ms;
    f->state = F_SEND;
    nng_aio_set_msg(f->aio, m);
    nng_aio_set_timeout(f->aio, (nng_duration)timeout_ms);
    nng_ctx_send(f->ctx, f->aio);
}

/* The owner (shard slot) of partition part now, or -1. */
static int
part_owner(struct sbx_gateway *gw, uint32_t part)
{
    if (!clustered(gw))
        return gw->table[part];
    sbx_cview_lock(gw->view);
    int owner = sbx_cview_parts(gw->view)[part].owner;
    sbx_cview_unlock(gw->view);
    return owner;
}

static void
fork_done(void *arg, const char *reply, size_t len)
{
    struct gctx *g = arg;
    char *buf = NULL;
    size_t blen;
    if (reply && g->tenanted && g->who.scope != SBX_SCOPE_SYSTEM && g->who.tenant[0] &&
        sbx_tenants_rewrite(&g->who, reply, len, g->int_id, g->ext_id, &buf, &blen) == 0) {
        /* The tenant's IDs as it named them (fwd_done does the same). */
        client_send_bytes(g, buf, blen);
        free(buf);
    } else if (reply) {
        client_send_bytes(g, reply, len);
    } else {
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
    }
}

/*
 * sandbox.fork (runtime/ops/fork.yaml) whose IDs are owned by other shards
 * than the source's: gw_fork.c runs it (the shards of one node, or of
 * several nodes in a cluster).  True if g was answered or
 * handed on; false: every fork is the source's shard's, route as usual.
 */
static int
fork_owner(void *arg, uint32_t part)
{
    return part_owner(arg, part);
}

static bool
fork_route(struct gctx *g, const struct sbx_req *req, const char *body, size_t len)
{
    struct sbx_gateway *gw = g->gw;
    char why[256];
    int src = part_owner(gw, g->part);
    struct gw_fork_plan *p = NULL;
    /* With tenants the body was re-encoded with internal IDs (gw_tenant.c):
     * the forks are placed by those, not by the IDs the tenant named. */
    sbx_msg dec;
    struct sbx_req ireq;
    const msgpack_object *args = req->args;
    bool decoded = false;
    if (g->tenanted && sbx_wire_decode(&dec, body, len, &sbx_wire_limits_request) == 0) {
        decoded = true;
        if (sbx_wire_parse_req(dec.root, &ireq, why, sizeof(why)) == 0)
            args = ireq.args;
    }
    int rc = gw_fork_plan(args, src, fork_owner, gw, &p, why, sizeof(why));
    if (decoded)
        sbx_wire_msg_free(&dec);
    if (rc == 0)
        return false; /* the source's shard makes every fork */
    if (rc < 0) {
        client_err(g, rc, "%s", why);
        return true;
    }
    for (size_t i = 0; i < p->n; i++)
        p->sock[i] = gw->shards[p->slot[i]].sock;
    snprintf(p->req_id, sizeof(p->req_id), "%s", g->id);
    if (g->int_id[0])
        snprintf(p->from, sizeof(p->from), "%s", g->int_id);
    else
        sbx_str_copy(req->sandbox, p->from, sizeof(p->from));
    p->timeout_ms = SBX_MAX(g->deadline - sbx_mono_ms(), 1);
    p->src_sock = gw->shards[src].sock;
    p->body = sbx_xmalloc(len);
    memcpy(p->body, body, len);
    p->blen = len;
    p->done = fork_done;
    p->arg = g;
    if ((rc = gw_fork_start(p)) != 0)
        client_err(g, rc, "cannot start the fork");
    return true;
}

/* Route g's request by the current table and forward it. */
static void
route_and_forward(struct gctx *g)
{
    struct sbx_gateway *gw = g->gw;
    int64_t timeout = g->deadline - sbx_mono_ms();
    if (timeout < 1)
        timeout = 1;
    if (!clustered(gw)) {
        forward(g, &gw->shards[gw->table[g->part]], g->body, g->blen, g->part, 0, timeout);
        return;
    }
    sbx_cview_lock(gw->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(gw->view, &n);
    struct sbx_cpart pt = sbx_cview_parts(gw->view)[g->part];
    bool live = pt.owner >= 0 && pt.owner < MAX_SLOTS && m[pt.owner].live;
    sbx_cview_unlock(gw->view);
    if (!live || !atomic_load(&gw->shards[pt.owner].open)) {
        /* No live owner yet (a shard died and the table is moving). */
        if (retry_later(g))
            return;
        request_done(g);
        client_err_unsent(g, !g->delivered, SBX_E_SHARD_UNAVAILABLE,
                          "partition %u has no live shard (the cluster is reassigning it)",
                          g->part);
        return;
    }
    g->last_slot = pt.owner;
    forward(g, &gw->shards[pt.owner], g->body, g->blen, g->part, pt.epoch, timeout);
}

/* ------------------------------------------------------------------------------ */
/* cluster.drain {shard, drain = true}: a key in etcd the shards follow. */

struct drain_job {
    struct gctx *g;
    char shard[64];
    bool drain;
};

static void *
drain_main(void *arg)
{
    struct drain_job *j = arg;
    struct gctx *g = j->g;
    struct sbx_gateway *gw = g->gw;
    char key[320];
    snprintf(key, sizeof(key), "%sc/drain/%s", gw->prefix, j->shard);
    int rc = j->drain ? sbx_etcd_put(gw->etcd, key, "1", 1, 0, NULL)
                      : sbx_etcd_delete(gw->etcd, key, NULL);
    if (rc) {
        client_err(g, rc, "cannot record the drain in etcd: %s", sbx_err_message(rc));
    } else {
        sbx_enc e;
        char *buf;
        size_t len;
        sbx_str id = {g->id, strlen(g->id)};
        sbx_enc_init(&e);
        sbx_enc_reply_ok(&e, id);
        sbx_enc_kbool(&e, "success", true);
        sbx_enc_kstr(&e, "shard", j->shard);
        sbx_enc_kbool(&e, "draining", j->drain);
        sbx_enc_end(&e);
        sbx_enc_end(&e);
        if (sbx_enc_finish(&e, &buf, &len) == 0) {
            client_send_bytes(g, buf, len);
            free(buf);
        }
        sbx_log_info("gateway %s: shard %s %s", gw->conf.name, j->shard,
                 j->drain ? "is draining" : "is no longer draining");
    }
    free(j);
    return NULL;
}

static void
op_drain(struct gctx *g, const struct sbx_req *req)
{
    struct sbx_gateway *gw = g->gw;
    if (!clustered(gw)) {
        client_err(g, SBX_E_VALIDATION,
                   "cluster.drain needs a cluster (sbxd gateway --etcd …); this deployment has "
                   "a fixed set of shards");
        return;
    }
    sbx_str shard;
    bool drain = true;
    if (sbx_wire_get_str(req->args, "shard", &shard) != 0 || shard.n == 0 || shard.n > 63 ||
        sbx_wire_get_bool(req->args, "drain", &drain) == SBX_E_VALIDATION) {
        client_err(g, SBX_E_VALIDATION, "cluster.drain needs 'shard' (a name) and 'drain' (bool)");
        return;
    }
    struct drain_job *j = sbx_xcalloc(1, sizeof(*j));
    j->g = g;
    sbx_str_copy(shard, j->shard, sizeof(j->shard));
    j->drain = drain;
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&t, &at, drain_main, j) != 0) {
        free(j);
        client_err(g, SBX_E_INTERNAL, "cannot start the drain request");
    }
    pthread_attr_destroy(&at);
}


/* ------------------------------------------------------------------------------ */
/* Client requests. */

static void
handle(struct gctx *g, nng_msg *m)
{
    struct sbx_gateway *gw = g->gw;
    const char *body = nng_msg_body(m);
    size_t len = nng_msg_len(m);
    char why[256];
    sbx_msg dec;
    struct sbx_req req;

    g->id[0] = g->op[0] = '\0';
    g->op_id = -1;
    g->fanout = false;
    g->attempts = 0;
    g->delivered = false;
    g->tenanted = false;
    stream_release(g);
    g->ext_id[0] = g->int_id[0] = '\0';
    _cleanup_free_ char *tbody = NULL; /* the request as the shards get it (tenancy) */
    if (len > SBX_WIRE_MAX_REQUEST) {
        nng_msg_free(m);
        client_err(g, SBX_E_TOO_LARGE, "request of %zu bytes exceeds the %u-byte limit", len,
                   SBX_WIRE_MAX_REQUEST);
        return;
    }
    if (sbx_wire_decode(&dec, body, len, &sbx_wire_limits_request) != 0) {
        nng_msg_free(m);
        client_err(g, SBX_E_MALFORMED, "the request is not a valid msgpack map");
        return;
    }
    int rc = sbx_wire_parse_req(dec.root, &req, why, sizeof(why));
    if (req.id.n && req.id.n <= SBX_WIRE_MAX_ID)
        sbx_str_copy(req.id, g->id, sizeof(g->id));
    if (rc) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, rc, "%s", why);
        return;
    }
    /* The one intake check, the same as the shard's (runtime/ops.h). */
    const struct sbx_op_def *def;
    rc = sbx_op_intake(&req, true, &def, why, sizeof(why));
    if (def) {
        snprintf(g->op, sizeof(g->op), "%s", def->name);
        g->op_id = (int)def->id;
    }
    if (rc) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, rc, "%s", why);
        return;
    }
    /* Answer a little before the client's own deadline, so it hears why. */
    int64_t timeout = gw->conf.timeout;
    if (req.timeout_ms > 0)
        timeout = req.timeout_ms > 1000 ? req.timeout_ms - 100 : req.timeout_ms * 9 / 10 + 1;
    g->deadline = sbx_mono_ms() + timeout;
    if (!gw->tenants && gw_is_admin_op((int)def->id)) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, SBX_E_VALIDATION,
                   "%s needs a deployment with API keys (sbxd --api-keys): without keys there "
                   "are no tenants (docs/security.md §6)",
                   def->name);
        return;
    }
    if (gw->tenants) {
        if (gw_tenant_gate(g, &req, dec.root, def, &tbody, &len) != 0) {
            sbx_wire_msg_free(&dec);
            nng_msg_free(m);
            return;
        }
        body = tbody;
    }
    if (def->id == SBX_OPID_CLUSTER_DRAIN) {
        op_drain(g, &req);
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        return;
    }
    if (def->id == SBX_OPID_AUDIT_LIST) {
        int64_t lim = 100;
        sbx_wire_get_i64(req.args, "limit", &lim);
        g->limit = (size_t)SBX_MAX(1, SBX_MIN(lim, 1000));
    }
    if (def->flags & SBX_OP_GLOBAL) {
        struct sbx_log_req lr = {req.id.p, req.id.n, NULL, 0, def->name, strlen(def->name)};
        sbx_log_req_debug(&lr, "gateway fans it out to every shard");
        sbx_wire_msg_free(&dec);
        g->fanout = true;
        bool live[MAX_SLOTS] = {false};
        int cnt = 0;
        if (clustered(gw)) {
            sbx_cview_lock(gw->view);
            int n;
            const struct sbx_cmember *mm = sbx_cview_members(gw->view, &n);
            for (int i = 0; i < n && i < MAX_SLOTS; i++)
                live[i] = mm[i].live && atomic_load(&gw->shards[i].open);
            sbx_cview_unlock(gw->view);
        } else {
            for (int i = 0; i < gw->nshards; i++)
                live[i] = true;
        }
        for (int i = 0; i < MAX_SLOTS; i++) {
            g->in_fanout[i] = live[i];
            cnt += live[i];
        }
        if (cnt == 0) {
            g->fanout = false;
            nng_msg_free(m);
            if (def->id == SBX_OPID_LIST)
                client_err(g, SBX_E_SHARD_UNAVAILABLE, "no shard is live");
            else
                gw_merge_and_reply(g); /* the gateway's own status, no shard */
            return;
        }
        pthread_mutex_lock(&g->mu);
        g->pending = cnt;
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; i < MAX_SLOTS; i++)
            if (live[i])
                forward(g, &gw->shards[i], body, len, 0, 0, timeout);
        nng_msg_free(m);
        return;
    }
    if (def->flags & SBX_OP_NODE) {
        /* A node's own op (its image store): one shard of the node runs it.
         * The store is shared by the shards of one node (`sbxd dev`), so the
         * owner of partition 0 serves it; in a cluster of several nodes that
         * is one node's store (docs/images.md). */
        g->part = 0;
    } else if ((rc = sbx_id_check(req.sandbox.p, req.sandbox.n, why, sizeof(why))) != 0) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, rc, "%s", why);
        return;
    } else if (g->int_id[0]) {
        g->part = sbx_place_partition(g->int_id, strlen(g->int_id));
    } else {
        g->part = sbx_place_partition(req.sandbox.p, req.sandbox.n);
    }
    if (def->id == SBX_OPID_SANDBOX_FORK && fork_route(g, &req, body, len)) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        return;
    }
    struct sbx_log_req lr = {req.id.p, req.id.n, req.sandbox.p, req.sandbox.n, def->name,
                             strlen(def->name)};
    sbx_log_req_debug(&lr, "gateway routes it (partition %u)", g->part);
    sbx_wire_msg_free(&dec);
    g->body = sbx_xmalloc(len);
    memcpy(g->body, body, len);
    g->blen = len;
    nng_msg_free(m);
    route_and_forward(g);
}

static void
gctx_cb(void *arg)
{
    struct gctx *g = arg;
    int rv = nng_aio_result(g->aio);
    if (g->state == G_SEND) {
        if (rv != 0) {
            nng_msg *m = nng_aio_get_msg(g->aio);
            if (m)
                nng_msg_free(m);
        }
        if (rv == NNG_ECLOSED)
            return;
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
        return;
    }
    if (g->state != G_RECV)
        return;
    if (rv != 0) {
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            return;
        nng_ctx_recv(g->ctx, g->aio);
        return;
    }
    g->state = G_WORK;
    atomic_fetch_add(&g->gw->n_requests, 1);
    handle(g, nng_aio_get_msg(g->aio));
}

/* ------------------------------------------------------------------------------ */

int
sbx_gateway_start(sbx_gateway **out, const struct sbx_gateway_conf *conf)
{
    int rv;
    sbx_gateway *gw = sbx_xcalloc(1, sizeof(*gw));
    gw->conf = *conf;
    gw->started_ms = sbx_wall_ms();
    pthread_mutex_init(&gw->slot_mu, NULL);
    bool cluster = conf->etcd && *conf->etcd;
    if (!cluster) {
        int n = 0;
        for (char **p = conf->shards; p && *p; p++)
            n++;
        if (n == 0 || n > MAX_SLOTS) {
            sbx_log_error("gateway: give 1-%d shards (--shard name=url), or --etcd for a cluster",
                      MAX_SLOTS);
            pthread_mutex_destroy(&gw->slot_mu);
            free(gw);
            return SBX_E_VALIDATION;
        }
        const char *names[MAX_SLOTS];
        for (int i = 0; i < n; i++) {
            const char *spec = conf->shards[i], *eq = strchr(spec, '=');
            if (!eq || eq == spec || eq - spec >= 64) {
                sbx_log_error("gateway: shard '%s' must be given as name=url", spec);
                rv = SBX_E_VALIDATION;
                goto fail;
            }
            char name[64];
            snprintf(name, sizeof(name), "%.*s", (int)(eq - spec), spec);
            sbx_err_t derr = NULL;
            if ((rv = slot_open(gw, i, name, eq + 1, 0, &derr)) != 0) {
                sbx_log_error("gateway: shard %s: %s", name, sbx_err_msg(derr));
                sbx_err_release(&derr);
                goto fail;
            }
            names[i] = gw->shards[i].name;
        }
        sbx_place_table(names, (size_t)n, gw->table);
    }
    gw->nctx = (int)SBX_MAX(conf->contexts, 1);
    gw->ctxs = sbx_xcalloc((size_t)gw->nctx, sizeof(*gw->ctxs));
    for (int i = 0; i < gw->nctx; i++) {
        struct gctx *g = &gw->ctxs[i];
        g->gw = gw;
        pthread_mutex_init(&g->mu, NULL);
        if ((rv = nng_aio_alloc(&g->sleep, sleep_cb, g)) != 0) {
            rv = sbx_nng_code(rv);
            goto fail;
        }
        for (int k = 0; k < MAX_SLOTS; k++) {
            g->fwd[k].g = g;
            g->fwd[k].s = &gw->shards[k];
        }
    }
    if (cluster) {
        snprintf(gw->prefix, sizeof(gw->prefix), "/sbx/%s/",
                 conf->cluster && *conf->cluster ? conf->cluster : "default");
        char plain[256];
        if (sbx_etcd_insecure_endpoint(conf->etcd, plain, sizeof(plain)))
            sbx_log_warn("gateway: etcd at %s is plain HTTP off loopback: whoever reaches it "
                         "can redirect this gateway's requests (use https:// with "
                         "--etcd-ca/--etcd-cert/--etcd-key; docs/security.md, Transports)",
                         plain);
        if ((rv = sbx_etcd_open(&gw->etcd, conf->etcd, 3000)) == 0)
            sbx_etcd_set_tls(gw->etcd, conf->etcd_ca, conf->etcd_cert, conf->etcd_key);
        if (rv != 0 ||
            (rv = sbx_cview_start(&gw->view, gw->etcd, gw->prefix, view_changed, gw)) != 0) {
            sbx_log_error("gateway: cannot follow the cluster in etcd at %s", conf->etcd);
            goto fail;
        }
    }
    sbx_err_t lerr = NULL;
    if ((rv = sbx_nng_rep_listen(&gw->sock, conf->listen, conf->sec, &lerr)) != 0) {
        sbx_log_error("gateway: %s", sbx_err_msg(lerr));
        sbx_err_release(&lerr);
        goto fail;
    }
    for (int i = 0; i < gw->nctx; i++) {
        struct gctx *g = &gw->ctxs[i];
        nng_aio_alloc(&g->aio, gctx_cb, g);
        nng_ctx_open(&g->ctx, gw->sock);
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
    }
    bool keyed = conf->api_keys && *conf->api_keys;
    if ((conf->http && *conf->http) || keyed) {
        /* The HTTP front and the tenant registry call the gateway through an
         * in-process transport. */
        snprintf(gw->inproc, sizeof(gw->inproc), "inproc://sbx-gateway-%p", (void *)gw);
        if ((rv = nng_listen(gw->sock, gw->inproc, NULL, 0)) != 0) {
            sbx_log_error("gateway: cannot listen on %s: %s", gw->inproc, nng_strerror(rv));
            rv = sbx_nng_code(rv);
            goto fail;
        }
    }
    if (keyed) {
        _cleanup_err_ sbx_err_t terr = NULL;
        if ((rv = sbx_tenants_start(&gw->tenants, conf->api_keys, gw->inproc, &terr)) != 0) {
            sbx_log_error("gateway: %s", sbx_err_msg(terr));
            goto fail;
        }
    }
    if (conf->http && *conf->http) {
        struct sbx_http_conf hc = {
            .listen = conf->http,
            .upstream = gw->inproc,
            .api_keys = conf->api_keys,
            .preview_domain = conf->preview_domain,
            .preview_scheme = conf->preview_scheme,
            .relay_secret = conf->relay_secret,
            .max_body = conf->http_max_body,
            .timeout = conf->timeout,
            .per_client = conf->http_per_client,
            .ws_ping = conf->http_ws_ping,
            .system_key = gw->tenants ? sbx_tenants_system_key(gw->tenants) : NULL,
            .console = conf->console,
        };
        _cleanup_err_ sbx_err_t herr = NULL;
        if ((rv = sbx_http_start(&gw->http, &hc, &herr)) != 0) {
            sbx_log_error("gateway: %s", sbx_err_msg(herr));
            goto fail;
        }
        sbx_log_info("gateway %s: HTTP on %s%s", conf->name, conf->http,
                     conf->console ? ", web console at /console/" : "");
    } else if (conf->console) {
        sbx_log_warn("gateway %s: --console needs the HTTP front (--http): no console", conf->name);
    }
    if (cluster)
        sbx_log_info("gateway %s: serving on %s, cluster '%s' from etcd at %s", conf->name,
                 conf->listen, conf->cluster ? conf->cluster : "default", conf->etcd);
    else
        sbx_log_info("gateway %s: serving on %s, %d shard(s)", conf->name, conf->listen,
                 gw->nshards);
    *out = gw;
    return 0;
fail:
    sbx_gateway_stop(gw);
    return rv;
}

int
sbx_gateway_http_port(const sbx_gateway *gw)
{
    return gw->http ? sbx_http_port(gw->http) : 0;
}

void
sbx_gateway_stop(sbx_gateway *gw)
{
    if (!gw)
        return;
    /* The HTTP front first: it calls into the sockets below. */
    if (gw->http)
        sbx_http_stop(gw->http);
    /* Then the registry, whose thread calls the gateway too. */
    sbx_tenants_stop(gw->tenants);
    gw->tenants = NULL;
    /* No new slots from here on. */
    if (gw->view)
        sbx_cview_stop(gw->view);
    /* Stop every aio first, then close, then free (nng shutdown order). */
    for (int i = 0; gw->ctxs && i < gw->nctx; i++) {
        if (gw->ctxs[i].aio)
            nng_aio_stop(gw->ctxs[i].aio);
        if (gw->ctxs[i].sleep)
            nng_aio_stop(gw->ctxs[i].sleep);
        for (int k = 0; k < MAX_SLOTS; k++)
            if (gw->ctxs[i].fwd[k].aio)
                nng_aio_stop(gw->ctxs[i].fwd[k].aio);
    }
    if (nng_socket_id(gw->sock) > 0)
        nng_close(gw->sock);
    for (int k = 0; k < MAX_SLOTS; k++)
        if (atomic_load(&gw->shards[k].open))
            nng_close(gw->shards[k].sock);
    for (int i = 0; gw->ctxs && i < gw->nctx; i++) {
        struct gctx *g = &gw->ctxs[i];
        if (g->aio)
            nng_aio_free(g->aio);
        if (g->sleep)
            nng_aio_free(g->sleep);
        for (int k = 0; k < MAX_SLOTS; k++) {
            if (g->fwd[k].aio)
                nng_aio_free(g->fwd[k].aio);
            if (g->fwd[k].reply)
                nng_msg_free(g->fwd[k].reply);
        }
        free(g->body);
        pthread_mutex_destroy(&g->mu);
    }
    if (gw->etcd)
        sbx_etcd_close(gw->etcd);
    free(gw->ctxs);
    pthread_mutex_destroy(&gw->slot_mu);
    free(gw);
}
