/*
 * gw_fork.c — sandbox.fork whose IDs are owned by several shards, of one
 * node or, in a cluster, of several (gw_fork.h; docs/persistence.md,
 * "Fork").
 *
 * On a thread of its own, with blocking calls to the shards (each on a new
 * nng context of the shard's REQ socket, sent as a peer's request: not
 * wrapped in a route):
 *  1. the source's shard: sandbox.fork {ids, stage: the IDs of other
 *     shards}: it creates its own forks and stages the others' copies and
 *     records in the node's store (actors/fork.c) — in a cluster, in the
 *     store of each owner's node, sent there by workspace.put;
 *  2. each other owner: sandbox.adopt, addressed to its fork's ID: the
 *     staged copy becomes that sandbox;
 *  3. if an adopt fails: the forks made so far are destroyed, the copies
 *     not yet adopted discarded (sandbox.adopt {discard}), and the client
 *     gets the failing adopt's error: nothing of the fork is left.
 * The reply to the client is {from, ids, copyMs, copiedBytes} as from one
 * shard.  The request's other envelope fields are passed on unchanged.
 */
#include "gw_fork.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"

struct fk_call {
    char *buf;    /* the reply's bytes (owned) */
    sbx_msg m;    /* decoded from buf */
    bool ok;      /* "ok": true */
    int code;     /* when !ok: its code */
    char msg[512];
};

static void
call_free(struct fk_call *c)
{
    if (c->buf) {
        sbx_wire_msg_free(&c->m);
        free(c->buf);
    }
    memset(c, 0, sizeof(*c));
}

/* Encode the request {orig's envelope, id, op, sandbox, args} (args: the
 * encoder's open map, filled by the caller) — begun here, finished by
 * req_end. */
static void
req_begin(sbx_enc *e, const struct gw_fork_plan *p, const char *suffix, const char *op,
          const char *sandbox)
{
    char id[SBX_WIRE_MAX_ID + 64];
    snprintf(id, sizeof(id), "%s/%s", p->req_id, suffix);
    sbx_enc_init(e);
    sbx_enc_map(e);
    const msgpack_object *root = p->orig.root;
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object_kv *kv = &root->via.map.ptr[i];
        sbx_str k;
        if (sbx_wire_obj_str(&kv->key, &k) != 0)
            continue;
        static const char *const own[] = {"id", "op", "sandbox", "args"};
        bool skip = false;
        for (size_t n = 0; n < SBX_ARRAY_LEN(own); n++)
            skip |= k.n == strlen(own[n]) && !memcmp(k.p, own[n], k.n);
        if (!skip) {
            sbx_enc_obj(e, &kv->key);
            sbx_enc_obj(e, &kv->val);
        }
    }
    sbx_enc_kstr(e, "id", id);
    sbx_enc_kstr(e, "op", op);
    sbx_enc_kstr(e, "sandbox", sandbox);
    sbx_enc_kmap(e, "args");
}

/* Send e's request (closing its maps) to sock and wait for the reply. */
static void
req_call(sbx_enc *e, nng_socket sock, int64_t deadline, struct fk_call *c)
{
    char *buf = NULL;
    size_t len = 0;
    nng_ctx ctx;
    nng_msg *m = NULL;
    memset(c, 0, sizeof(*c));
    c->code = SBX_E_SHARD_UNAVAILABLE;
    sbx_enc_end(e); /* args */
    sbx_enc_end(e); /* the request */
    int64_t left = deadline - sbx_mono_ms();
    if (sbx_enc_finish(e, &buf, &len) != 0) {
        c->code = SBX_E_INTERNAL;
        snprintf(c->msg, sizeof(c->msg), "encode a request of the fork");
        return;
    }
    if (left < 1) {
        free(buf);
        c->code = SBX_E_TIMEOUT;
        snprintf(c->msg, sizeof(c->msg), "the fork's deadline passed");
        return;
    }
    nng_aio *aio = NULL;
    int rv = nng_aio_alloc(&aio, NULL, NULL);
    if (rv == 0 && (rv = nng_ctx_open(&ctx, sock)) == 0) {
        nng_aio_set_timeout(aio, (nng_duration)left);
        if ((rv = nng_msg_alloc(&m, len)) == 0) {
            memcpy(nng_msg_body(m), buf, len);
            nng_aio_set_msg(aio, m);
            nng_ctx_send(ctx, aio);
            nng_aio_wait(aio);
            if ((rv = nng_aio_result(aio)) != 0)
                nng_msg_free(m); /* not sent: still ours */
            m = NULL;
        }
        if (rv == 0) {
            nng_ctx_recv(ctx, aio);
            nng_aio_wait(aio);
            if ((rv = nng_aio_result(aio)) == 0)
                m = nng_aio_get_msg(aio);
        }
        nng_ctx_close(ctx);
    }
    if (aio)
        nng_aio_free(aio);
    free(buf);
    if (rv != 0) {
        snprintf(c->msg, sizeof(c->msg), "a shard did not answer the fork: %s", nng_strerror(rv));
        return;
    }
    c->buf = sbx_xmalloc(nng_msg_len(m));
    memcpy(c->buf, nng_msg_body(m), nng_msg_len(m));
    size_t n = nng_msg_len(m);
    nng_msg_free(m);
    if (sbx_wire_decode(&c->m, c->buf, n, &sbx_wire_limits_reply) != 0) {
        free(c->buf);
        c->buf = NULL;
        c->code = SBX_E_INTERNAL;
        snprintf(c->msg, sizeof(c->msg), "a shard's reply to the fork is not a valid frame");
        return;
    }
    sbx_wire_get_bool(c->m.root, "ok", &c->ok);
    const msgpack_object *err = NULL;
    sbx_str s;
    if (!c->ok && sbx_wire_get_map(c->m.root, "error", &err) == 0) {
        if (sbx_wire_get_str(err, "code", &s) == 0)
            c->code = sbx_err_from_name(s.p, s.n);
        if (sbx_wire_get_str(err, "message", &s) == 0)
            snprintf(c->msg, sizeof(c->msg), "%.*s", (int)s.n, s.p);
    }
}

/* Destroy fork id (the rollback); errors are logged. */
static void
undo_fork(const struct gw_fork_plan *p, size_t i, bool adopted, int64_t deadline)
{
    sbx_enc e;
    struct fk_call c;
    char sfx[96];
    snprintf(sfx, sizeof(sfx), "undo-%zu", i);
    req_begin(&e, p, sfx, adopted ? "destroy" : "sandbox.adopt", p->ids[i]);
    if (!adopted)
        sbx_enc_kbool(&e, "discard", true);
    req_call(&e, p->sock[i], deadline, &c);
    if (!c.ok)
        sbx_log_warn("fork of %s: undoing %s failed: %s", p->from, p->ids[i], c.msg);
    call_free(&c);
}

static void *
fork_main(void *arg)
{
    struct gw_fork_plan *p = arg;
    int64_t deadline = sbx_mono_ms() + p->timeout_ms;
    char *out = NULL;
    size_t outlen = 0;
    sbx_str rid = {p->req_id, strlen(p->req_id)};
    struct fk_call src;
    sbx_enc e;
    req_begin(&e, p, "fork", "sandbox.fork", p->from);
    sbx_enc_karray(&e, "ids");
    for (size_t i = 0; i < p->n; i++)
        sbx_enc_str(&e, p->ids[i]);
    sbx_enc_end(&e);
    sbx_enc_karray(&e, "stage");
    for (size_t i = 0; i < p->n; i++)
        if (p->remote[i])
            sbx_enc_str(&e, p->ids[i]);
    sbx_enc_end(&e);
    req_call(&e, p->src_sock, deadline, &src);
    if (!src.ok) {
        sbx_wire_reply_errf(rid, src.code, &out, &outlen, "%s", src.msg);
        goto out;
    }
    size_t adopted = 0, failed = p->n;
    struct fk_call c = {0};
    for (size_t i = 0; i < p->n; i++) {
        if (!p->remote[i])
            continue;
        char sfx[96];
        snprintf(sfx, sizeof(sfx), "adopt-%zu", i);
        req_begin(&e, p, sfx, "sandbox.adopt", p->ids[i]);
        req_call(&e, p->sock[i], deadline, &c);
        if (!c.ok) {
            failed = i;
            break;
        }
        call_free(&c);
        adopted++;
    }
    if (failed < p->n) {
        /* Nothing of the fork stays: the local forks and the adopted ones
         * are destroyed, the copies not adopted yet discarded. */
        sbx_log_warn("fork of %s into %s failed (%s): undoing it", p->from, p->ids[failed],
                     c.msg);
        for (size_t i = 0; i < p->n; i++) {
            if (i == failed)
                continue;
            if (!p->remote[i])
                undo_fork(p, i, true, deadline);
            else
                undo_fork(p, i, i < failed, deadline);
        }
        sbx_wire_reply_errf(rid, c.code, &out, &outlen, "fork '%s': %s", p->ids[failed], c.msg);
        call_free(&c);
        goto out;
    }
    const msgpack_object *res = NULL;
    int64_t ms = 0, bytes = 0;
    if (sbx_wire_get_map(src.m.root, "result", &res) == 0) {
        sbx_wire_get_i64(res, "copyMs", &ms);
        sbx_wire_get_i64(res, "copiedBytes", &bytes);
    }
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, rid);
    sbx_enc_kstr(&e, "from", p->from);
    sbx_enc_karray(&e, "ids");
    for (size_t i = 0; i < p->n; i++)
        sbx_enc_str(&e, p->ids[i]);
    sbx_enc_end(&e);
    sbx_enc_kint(&e, "copyMs", ms);
    sbx_enc_kint(&e, "copiedBytes", bytes);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &out, &outlen) != 0)
        sbx_wire_reply_errf(rid, SBX_E_INTERNAL, &out, &outlen, "encode the fork's answer");
    sbx_log_info("fork of %s into %zu sandboxes, %zu of them on other shards", p->from, p->n,
                 adopted);
out:
    call_free(&src);
    p->done(p->arg, out, outlen);
    free(out);
    sbx_wire_msg_free(&p->orig);
    free(p->body);
    free(p);
    return NULL;
}

int
gw_fork_plan(const msgpack_object *args, int src, int (*owner)(void *arg, uint32_t part),
             void *arg, struct gw_fork_plan **out, char *why, size_t whylen)
{
    const msgpack_object *ids = NULL;
    *out = NULL;
    if (sbx_wire_get(args, "stage"))
        return snprintf(why, whylen, "'stage' is set by the gateway, not by a client"),
               SBX_E_VALIDATION;
    if (sbx_wire_get_array(args, "ids", &ids) != 0 || !ids || ids->via.array.size > GW_FORK_MAX ||
        src < 0)
        return 0;
    struct gw_fork_plan *p = sbx_xcalloc(1, sizeof(*p));
    bool cross = false;
    p->n = ids->via.array.size;
    for (size_t i = 0; i < p->n; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&ids->via.array.ptr[i], &s) != 0 || s.n == 0 || s.n > 63) {
            free(p);
            return 0;
        }
        memcpy(p->ids[i], s.p, s.n);
        p->slot[i] = owner(arg, sbx_place_partition(s.p, s.n));
        if (p->slot[i] < 0) {
            free(p);
            return 0; /* no owner now: the source's shard answers, or the retry does */
        }
        p->remote[i] = p->slot[i] != src;
        cross |= p->remote[i];
    }
    if (!cross) {
        free(p);
        return 0;
    }
    *out = p;
    return 1;
}

int
gw_fork_start(struct gw_fork_plan *p)
{
    /* The request's own envelope, passed on to the shards. */
    if (sbx_wire_decode(&p->orig, p->body, p->blen, &sbx_wire_limits_request) != 0) {
        free(p->body);
        free(p);
        return SBX_E_MALFORMED;
    }
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &at, fork_main, p);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        sbx_wire_msg_free(&p->orig);
        free(p->body);
        free(p);
        return SBX_E_INTERNAL;
    }
    return 0;
}
