/* gateway.c — see gateway.h.  Everything runs in nng aio callbacks: no
 * callback blocks, and sockets are only closed from sbx_gateway_stop. */
#include "gateway.h"

#include <errno.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/ops.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "http.h"


struct sbx_gateway;
struct gctx;

struct gshard {
    struct sbx_gateway *gw;
    int idx;
    char name[64];
    char url[256];
    nng_socket sock;
    atomic_int pipes;
};

enum { F_IDLE = 0, F_SEND, F_RECV };

struct gfwd {
    struct gctx *g;
    struct gshard *s;
    nng_ctx ctx;
    nng_aio *aio;
    int state;
    int64_t deadline;
    nng_msg *reply;
    int rv;
};

enum { G_RECV = 1, G_WORK, G_SEND };

struct gctx {
    struct sbx_gateway *gw;
    nng_ctx ctx;
    nng_aio *aio;
    int state;
    struct gfwd *fwd;     /* one per shard */
    pthread_mutex_t mu;   /* fan-out bookkeeping */
    int pending;
    bool fanout;          /* list / cluster.status: merge every shard's answer */
    char id[SBX_WIRE_MAX_ID + 1];
    char op[64];
};

struct sbx_gateway {
    struct sbx_gateway_conf conf;
    nng_socket sock;
    struct gshard *shards;
    int nshards;
    const char **names;
    int16_t table[SBX_PARTITIONS];
    struct gctx *ctxs;
    int nctx;
    atomic_ullong n_requests, n_errors;
    int64_t started_ms;
    sbx_http *http;
    char inproc[96];
};

/* ------------------------------------------------------------------------------ */

static void
client_send(struct gctx *g, nng_msg *m)
{
    nng_aio_set_msg(g->aio, m);
    g->state = G_SEND;
    nng_ctx_send(g->ctx, g->aio);
}

static void
client_send_bytes(struct gctx *g, const char *buf, size_t len)
{
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0) {
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
        return;
    }
    memcpy(nng_msg_body(m), buf, len);
    client_send(g, m);
}

static void
client_err(struct gctx *g, int code, const char *fmt, ...)
{
    char msg[512], *buf;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    atomic_fetch_add(&g->gw->n_errors, 1);
    sbx_str id = {g->id, strlen(g->id)};
    sbx_werr w;
    sbx_werr_init(&w, code, "%s", msg);
    if (g->op[0])
        sbx_enc_kstr(sbx_werr_ctx(&w), "operation", g->op);
    if (sbx_wire_reply_err(id, &w, &buf, &len) == 0) {
        client_send_bytes(g, buf, len);
        free(buf);
    } else {
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
    }
    sbx_werr_free(&w);
}

/* ------------------------------------------------------------------------------ */
/* Fan-out (list, cluster.status). */

static void
merge_and_reply(struct gctx *g)
{
    struct sbx_gateway *gw = g->gw;
    bool is_list = !strcmp(g->op, "list");
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_str id = {g->id, strlen(g->id)};
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, id);
    if (is_list) {
        size_t count = 0;
        sbx_enc_karray(&e, "sandboxes");
        for (int i = 0; i < gw->nshards; i++) {
            struct gfwd *f = &g->fwd[i];
            if (!f->reply)
                continue;
            sbx_msg m;
            if (sbx_wire_decode(&m, nng_msg_body(f->reply), nng_msg_len(f->reply),
                                &sbx_wire_limits_reply) == 0) {
                const msgpack_object *r, *arr;
                if (sbx_wire_get_map(m.root, "result", &r) == 0 &&
                    sbx_wire_get_array(r, "sandboxes", &arr) == 0) {
                    for (uint32_t k = 0; k < arr->via.array.size; k++) {
                        sbx_enc_obj(&e, &arr->via.array.ptr[k]);
                        count++;
                    }
                }
                sbx_wire_msg_free(&m);
            }
        }
        sbx_enc_end(&e);
        sbx_enc_kint(&e, "count", (int64_t)count);
    } else {
        sbx_enc_kmap(&e, "gateway");
        sbx_enc_kstr(&e, "name", gw->conf.name);
        sbx_enc_kstr(&e, "listen", gw->conf.listen);
        sbx_enc_kint(&e, "uptimeMs", sbx_wall_ms() - gw->started_ms);
        sbx_enc_kint(&e, "requests", (int64_t)atomic_load(&gw->n_requests));
        sbx_enc_kint(&e, "errors", (int64_t)atomic_load(&gw->n_errors));
        sbx_enc_kint(&e, "partitions", SBX_PARTITIONS);
        sbx_enc_end(&e);
    }
    sbx_enc_karray(&e, "shards");
    for (int i = 0; i < gw->nshards; i++) {
        struct gfwd *f = &g->fwd[i];
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "name", f->s->name);
        sbx_enc_kstr(&e, "url", f->s->url);
        sbx_enc_kbool(&e, "connected", atomic_load(&f->s->pipes) > 0);
        if (!is_list) {
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
    if (sbx_enc_finish(&e, &buf, &len) == 0) {
        client_send_bytes(g, buf, len);
        free(buf);
    } else {
        client_err(g, SBX_E_INTERNAL, "could not encode the merged reply");
    }
}

/* ------------------------------------------------------------------------------ */
/* Forwarding. */

static void
fwd_done(struct gfwd *f, nng_msg *reply, int rv)
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
            merge_and_reply(g);
        return;
    }
    if (reply) {
        client_send(g, reply);
        return;
    }
    if (rv == NNG_ETIMEDOUT)
        client_err(g, SBX_E_SHARD_UNAVAILABLE,
                   "shard %s did not answer before the request's deadline", f->s->name);
    else
        client_err(g, SBX_E_SHARD_UNAVAILABLE, "shard %s is unavailable (%s)", f->s->name,
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
            fwd_done(f, NULL, rv);
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
            fwd_done(f, NULL, rv);
            return;
        }
        fwd_done(f, nng_aio_get_msg(f->aio), 0);
    }
}

/* Start forwarding `body` to shard s; the caller counted it in g->pending. */
static void
forward(struct gctx *g, struct gshard *s, const char *body, size_t len, uint32_t part,
        int64_t timeout_ms)
{
    struct gfwd *f = &g->fwd[s->idx];
    if (atomic_load(&s->pipes) <= 0) {
        fwd_done(f, NULL, NNG_ECONNREFUSED);
        return;
    }
    sbx_enc e;
    char *buf;
    size_t blen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kmap(&e, "route");
    sbx_enc_kint(&e, "partition", part);
    sbx_enc_kint(&e, "epoch", 0);
    sbx_enc_kstr(&e, "gateway", g->gw->conf.name);
    sbx_enc_end(&e);
    sbx_enc_kbin(&e, "req", body, len);
    sbx_enc_end(&e);
    nng_msg *m;
    if (sbx_enc_finish(&e, &buf, &blen) != 0 || nng_msg_alloc(&m, blen) != 0) {
        fwd_done(f, NULL, NNG_ENOMEM);
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

/* A shard connection went away: fail what it was holding, now. */
static void
pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
    struct gshard *s = arg;
    (void)p;
    if (ev == NNG_PIPE_EV_ADD_POST) {
        atomic_fetch_add(&s->pipes, 1);
        return;
    }
    if (ev != NNG_PIPE_EV_REM_POST)
        return;
    atomic_fetch_sub(&s->pipes, 1);
    struct sbx_gateway *gw = s->gw;
    for (int i = 0; i < gw->nctx; i++) {
        struct gfwd *f = &gw->ctxs[i].fwd[s->idx];
        if (f->state != F_IDLE)
            nng_aio_cancel(f->aio);
    }
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
    g->fanout = false;
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
    const struct sbx_op_def *def = sbx_op_find(req.op.p, req.op.n);
    if (!def) {
        snprintf(why, sizeof(why), "unknown operation '%.*s'", (int)SBX_MIN(req.op.n, 64),
                 req.op.p);
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, SBX_E_UNKNOWN_OP, "%s", why);
        return;
    }
    snprintf(g->op, sizeof(g->op), "%s", def->name);
    /* Answer a little before the client's own deadline, so it hears why. */
    int64_t timeout = gw->conf.timeout;
    if (req.timeout_ms > 0)
        timeout = req.timeout_ms > 1000 ? req.timeout_ms - 100 : req.timeout_ms * 9 / 10 + 1;
    if (def->flags & SBX_OP_GLOBAL) {
        sbx_wire_msg_free(&dec);
        g->fanout = true;
        pthread_mutex_lock(&g->mu);
        g->pending = gw->nshards;
        pthread_mutex_unlock(&g->mu);
        for (int i = 0; i < gw->nshards; i++) {
            /* The shards answer "cluster.status" with their own status. */
            forward(g, &gw->shards[i], body, len, 0, timeout);
        }
        nng_msg_free(m);
        return;
    }
    if (req.sandbox.n == 0) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, SBX_E_VALIDATION, "operation '%s' needs a 'sandbox' ID", def->name);
        return;
    }
    if ((rc = sbx_id_check(req.sandbox.p, req.sandbox.n, why, sizeof(why))) != 0) {
        sbx_wire_msg_free(&dec);
        nng_msg_free(m);
        client_err(g, rc, "%s", why);
        return;
    }
    uint32_t part = sbx_place_partition(req.sandbox.p, req.sandbox.n);
    struct gshard *s = &gw->shards[gw->table[part]];
    sbx_wire_msg_free(&dec);
    forward(g, s, body, len, part, timeout);
    nng_msg_free(m);
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
    for (char **p = conf->shards; p && *p; p++)
        gw->nshards++;
    if (gw->nshards == 0) {
        sbx_error("gateway: no shards configured");
        free(gw);
        return SBX_E_VALIDATION;
    }
    gw->shards = sbx_xcalloc((size_t)gw->nshards, sizeof(*gw->shards));
    gw->names = sbx_xcalloc((size_t)gw->nshards, sizeof(char *));
    for (int i = 0; i < gw->nshards; i++) {
        struct gshard *s = &gw->shards[i];
        const char *spec = conf->shards[i], *eq = strchr(spec, '=');
        s->gw = gw;
        s->idx = i;
        if (!eq || eq == spec) {
            sbx_error("gateway: shard '%s' must be given as name=url", spec);
            rv = SBX_E_VALIDATION;
            goto fail;
        }
        snprintf(s->name, sizeof(s->name), "%.*s", (int)(eq - spec), spec);
        snprintf(s->url, sizeof(s->url), "%s", eq + 1);
        gw->names[i] = s->name;
        if ((rv = sbx_nng_req_dial(&s->sock, s->url)) != 0) {
            sbx_error("gateway: shard %s at %s: %s", s->name, s->url, nng_strerror(rv));
            rv = sbx_nng_code(rv);
            goto fail;
        }
        nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, pipe_cb, s);
        nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, pipe_cb, s);
    }
    sbx_place_table(gw->names, (size_t)gw->nshards, gw->table);
    gw->nctx = (int)SBX_MAX(conf->contexts, 1);
    gw->ctxs = sbx_xcalloc((size_t)gw->nctx, sizeof(*gw->ctxs));
    for (int i = 0; i < gw->nctx; i++) {
        struct gctx *g = &gw->ctxs[i];
        g->gw = gw;
        pthread_mutex_init(&g->mu, NULL);
        g->fwd = sbx_xcalloc((size_t)gw->nshards, sizeof(*g->fwd));
        for (int k = 0; k < gw->nshards; k++) {
            struct gfwd *f = &g->fwd[k];
            f->g = g;
            f->s = &gw->shards[k];
            if ((rv = nng_ctx_open(&f->ctx, f->s->sock)) != 0 ||
                (rv = nng_aio_alloc(&f->aio, fwd_cb, f)) != 0) {
                rv = sbx_nng_code(rv);
                goto fail;
            }
        }
    }
    if ((rv = sbx_nng_rep_listen(&gw->sock, conf->listen)) != 0) {
        sbx_error("gateway: cannot listen on %s: %s", conf->listen, nng_strerror(rv));
        rv = sbx_nng_code(rv);
        goto fail;
    }
    for (int i = 0; i < gw->nctx; i++) {
        struct gctx *g = &gw->ctxs[i];
        nng_aio_alloc(&g->aio, gctx_cb, g);
        nng_ctx_open(&g->ctx, gw->sock);
        g->state = G_RECV;
        nng_ctx_recv(g->ctx, g->aio);
    }
    if (conf->http && *conf->http) {
        /* The HTTP front calls the gateway through an in-process transport. */
        snprintf(gw->inproc, sizeof(gw->inproc), "inproc://sbx-gateway-%p", (void *)gw);
        if ((rv = nng_listen(gw->sock, gw->inproc, NULL, 0)) != 0) {
            sbx_error("gateway: cannot listen on %s: %s", gw->inproc, nng_strerror(rv));
            rv = sbx_nng_code(rv);
            goto fail;
        }
        struct sbx_http_conf hc = {
            .listen = conf->http,
            .upstream = gw->inproc,
            .api_keys = conf->api_keys,
            .preview_domain = conf->preview_domain,
            .preview_scheme = conf->preview_scheme,
            .relay_secret = conf->relay_secret,
            .max_body = conf->http_max_body,
            .timeout = conf->timeout,
        };
        char why[256];
        if ((rv = sbx_http_start(&gw->http, &hc, why, sizeof(why))) != 0) {
            sbx_error("gateway: %s", why);
            goto fail;
        }
        sbx_info("gateway %s: HTTP on %s", conf->name, conf->http);
    }
    sbx_info("gateway %s: serving on %s, %d shard(s)", conf->name, conf->listen, gw->nshards);
    *out = gw;
    return 0;
fail:
    sbx_gateway_stop(gw);
    return rv;
}

void
sbx_gateway_stop(sbx_gateway *gw)
{
    if (!gw)
        return;
    /* The HTTP front first: it calls into the sockets below. */
    if (gw->http)
        sbx_http_stop(gw->http);
    /* Stop every aio first, then close, then free (nng shutdown order). */
    for (int i = 0; gw->ctxs && i < gw->nctx; i++) {
        if (gw->ctxs[i].aio)
            nng_aio_stop(gw->ctxs[i].aio);
        for (int k = 0; gw->ctxs[i].fwd && k < gw->nshards; k++)
            if (gw->ctxs[i].fwd[k].aio)
                nng_aio_stop(gw->ctxs[i].fwd[k].aio);
    }
    if (nng_socket_id(gw->sock) > 0)
        nng_close(gw->sock);
    for (int k = 0; k < gw->nshards; k++)
        if (nng_socket_id(gw->shards[k].sock) > 0)
            nng_close(gw->shards[k].sock);
    for (int i = 0; gw->ctxs && i < gw->nctx; i++) {
        struct gctx *g = &gw->ctxs[i];
        if (g->aio)
            nng_aio_free(g->aio);
        for (int k = 0; g->fwd && k < gw->nshards; k++) {
            if (g->fwd[k].aio)
                nng_aio_free(g->fwd[k].aio);
            if (g->fwd[k].reply)
                nng_msg_free(g->fwd[k].reply);
        }
        free(g->fwd);
        pthread_mutex_destroy(&g->mu);
    }
    free(gw->ctxs);
    free(gw->shards);
    free(gw->names);
    free(gw);
}

int
sbx_gateway_http_port(const sbx_gateway *gw)
{
    return gw->http ? sbx_http_port(gw->http) : 0;
}
