/*
 * http_call.c — the HTTP front's calls to the gateway over nng (REQ
 * contexts on h->req, dialled to conf.upstream).
 *
 * Asynchronous calls serve the access handler: http_call_start suspends the
 * MHD connection and sends; call_cb, on nng's threads, receives and resumes
 * the connection exactly once, as its last touch of the request (see the
 * suspension rule in http.c); http_call_take then decodes the reply on
 * MHD's thread.  Synchronous calls (http_call_sync) serve worker threads
 * (preview, terminal) and block the calling thread.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/nngx.h"
#include "http_int.h"

static void call_cb(void *arg);

struct hreq *
hreq_new(struct sbx_http *h, struct MHD_Connection *c)
{
    struct hreq *hr = sbx_xcalloc(1, sizeof(*hr));
    hr->kind = HS_API;
    hr->h = h;
    hr->c = c;
    hr->params = json_object();
    hr->query = json_object();
    sbx_buf_init(&hr->body);
    sbx_buf_init(&hr->out);
    pthread_mutex_init(&hr->mu, NULL);
    return hr;
}

int
http_ctx_open(struct sbx_http *h, nng_ctx *ctx)
{
    pthread_rwlock_rdlock(&h->req_lk);
    int rv = h->req_closed ? NNG_ECLOSED : nng_ctx_open(ctx, h->req);
    pthread_rwlock_unlock(&h->req_lk);
    return rv;
}

void
http_ctx_close(struct sbx_http *h, nng_ctx ctx)
{
    pthread_rwlock_rdlock(&h->req_lk);
    if (!h->req_closed)
        nng_ctx_close(ctx);
    pthread_rwlock_unlock(&h->req_lk);
}

void
hreq_free(struct hreq *hr)
{
    if (hr->aio) {
        nng_aio_stop(hr->aio);
        nng_aio_free(hr->aio);
    }
    if (hr->ctx_open)
        http_ctx_close(hr->h, hr->ctx);
    if (hr->reply)
        nng_msg_free(hr->reply);
    json_decref(hr->params);
    json_decref(hr->query);
    sbx_buf_free(&hr->body);
    sbx_buf_free(&hr->out);
    pthread_mutex_destroy(&hr->mu);
    free(hr);
}

/* Encode a request envelope; caller frees *out. */
static int
envelope(const char *key, const char *op, const char *sandbox, const char *args, size_t alen,
         int64_t timeout, const char *rid, bool retry, char **out, size_t *outlen)
{
    char id[37];
    if (!rid || !*rid) {
        sbx_request_id(id);
        rid = id;
    }
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstr(&e, "id", rid);
    sbx_enc_kstr(&e, "op", op);
    if (sandbox && *sandbox)
        sbx_enc_kstr(&e, "sandbox", sandbox);
    sbx_enc_kint(&e, "timeoutMs", timeout);
    if (retry)
        sbx_enc_kbool(&e, "retry", true);
    if (key && *key)
        sbx_enc_kstr(&e, "key", key); /* the gateway resolves it (gateway/tenant.h) */
    if (args && alen) {
        sbx_enc_str(&e, "args");
        sbx_enc_raw(&e, args, alen);
    }
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, out, outlen);
}

/*
 * Start a call: suspend the connection, then send.  Must run on MHD's thread
 * inside the access handler or the content reader.  Returns 0, or a negative
 * code (nothing in flight then, the connection not suspended).
 */
int
http_call_start(struct hreq *hr, const char *op, const char *args, size_t alen, int64_t timeout,
                const char *rid)
{
    struct sbx_http *h = hr->h;
    char *buf;
    size_t len;
    int rc = envelope(hr->key, op, hr->sandbox, args, alen, timeout, rid, hr->retry, &buf, &len);
    if (rc)
        return SBX_E_INTERNAL;
    if (len > SBX_WIRE_MAX_REQUEST) {
        free(buf);
        return SBX_E_TOO_LARGE;
    }
    if (!hr->aio && nng_aio_alloc(&hr->aio, call_cb, hr) != 0) {
        free(buf);
        return SBX_E_INTERNAL;
    }
    if (!hr->ctx_open) {
        if (http_ctx_open(h, &hr->ctx) != 0) {
            free(buf);
            return SBX_E_INTERNAL;
        }
        hr->ctx_open = true;
    }
    nng_msg *m;
    if (nng_msg_alloc(&m, len) != 0) {
        free(buf);
        return SBX_E_INTERNAL;
    }
    memcpy(nng_msg_body(m), buf, len);
    free(buf);
    if (hr->reply) {
        nng_msg_free(hr->reply);
        hr->reply = NULL;
    }
    pthread_mutex_lock(&hr->mu);
    hr->suspended = true;
    MHD_suspend_connection(hr->c);
    hr->cstate = C_SEND;
    hr->rv = 0;
    nng_aio_set_timeout(hr->aio, (nng_duration)SBX_MIN(
                                     timeout + 2000, SBX_WIRE_MAX_DURATION_MS +
                                                         SBX_WIRE_DEADLINE_SLACK_MS));
    nng_aio_set_msg(hr->aio, m);
    nng_ctx_send(hr->ctx, hr->aio);
    pthread_mutex_unlock(&hr->mu);
    return 0;
}

/* nng completion (nng's thread): on to the receive, or done → resume. */
static void
call_cb(void *arg)
{
    struct hreq *hr = arg;
    pthread_mutex_lock(&hr->mu);
    int rv = nng_aio_result(hr->aio);
    if (hr->cstate == C_SEND) {
        if (rv != 0) {
            nng_msg_free(nng_aio_get_msg(hr->aio));
            nng_aio_set_msg(hr->aio, NULL);
        } else {
            hr->cstate = C_RECV;
            nng_ctx_recv(hr->ctx, hr->aio);
            pthread_mutex_unlock(&hr->mu);
            return;
        }
    } else if (hr->cstate == C_RECV && rv == 0) {
        hr->reply = nng_aio_get_msg(hr->aio);
        nng_aio_set_msg(hr->aio, NULL);
    }
    hr->rv = rv;
    hr->cstate = C_DONE;
    if (hr->suspended) {
        hr->suspended = false;
        MHD_resume_connection(hr->c);
    }
    pthread_mutex_unlock(&hr->mu);
}

/* The finished call's reply: 0 with *m decoded (result map in *result), or
 * a negative code with code/message filled. */
int
http_call_take(struct hreq *hr, sbx_msg *m, const msgpack_object **result, char code[64],
               char *msg, size_t msglen)
{
    hr->cstate = C_IDLE;
    if (hr->rv != 0 || !hr->reply) {
        int c = sbx_nng_code(hr->rv);
        snprintf(code, 64, "%s", sbx_err_name(c));
        snprintf(msg, msglen, "the gateway did not answer: %s", nng_strerror(hr->rv));
        return c;
    }
    if (sbx_wire_decode(m, nng_msg_body(hr->reply), nng_msg_len(hr->reply),
                        &sbx_wire_limits_reply) != 0) {
        snprintf(code, 64, "MALFORMED_REQUEST");
        snprintf(msg, msglen, "the gateway sent a malformed reply");
        return SBX_E_MALFORMED;
    }
    bool ok = false;
    sbx_wire_get_bool(m->root, "ok", &ok);
    if (!ok)
        return CALL_ERROR_REPLY;
    static const msgpack_object empty = {.type = MSGPACK_OBJECT_MAP};
    if (sbx_wire_get_map(m->root, "result", result) != 0)
        *result = &empty;
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Synchronous calls for worker threads. */

int
http_call_sync(struct sbx_http *h, const char *key, const char *op, const char *sandbox,
               const char *args, size_t args_len, int64_t timeout_ms, struct hreply *reply,
               char code[64], char *msg, size_t msglen)
{
    memset(reply, 0, sizeof(*reply));
    char *buf;
    size_t len;
    if (envelope(key, op, sandbox, args, args_len, timeout_ms, NULL, false, &buf, &len) != 0) {
        snprintf(code, 64, "INTERNAL_ERROR");
        snprintf(msg, msglen, "cannot encode the request");
        return SBX_E_INTERNAL;
    }
    nng_ctx ctx;
    nng_msg *m = NULL;
    nng_aio *aio = NULL;
    int rv = http_ctx_open(h, &ctx);
    if (rv == 0) {
        rv = nng_aio_alloc(&aio, NULL, NULL);
        if (rv == 0)
            rv = nng_msg_alloc(&m, len);
        if (rv == 0) {
            memcpy(nng_msg_body(m), buf, len);
            nng_aio_set_timeout(aio, (nng_duration)(timeout_ms + 2000));
            nng_aio_set_msg(aio, m);
            nng_ctx_send(ctx, aio);
            nng_aio_wait(aio);
            rv = nng_aio_result(aio);
            if (rv != 0)
                nng_msg_free(m);
            m = NULL;
            if (rv == 0) {
                nng_ctx_recv(ctx, aio);
                nng_aio_wait(aio);
                rv = nng_aio_result(aio);
                if (rv == 0)
                    m = nng_aio_get_msg(aio);
            }
        }
        if (aio)
            nng_aio_free(aio);
        http_ctx_close(h, ctx);
    }
    free(buf);
    if (rv != 0) {
        int c = sbx_nng_code(rv);
        snprintf(code, 64, "%s", sbx_err_name(c));
        snprintf(msg, msglen, "the gateway did not answer: %s", nng_strerror(rv));
        return c;
    }
    reply->buf = sbx_xmalloc(nng_msg_len(m));
    memcpy(reply->buf, nng_msg_body(m), nng_msg_len(m));
    size_t rl = nng_msg_len(m);
    nng_msg_free(m);
    if (sbx_wire_decode(&reply->m, reply->buf, rl, &sbx_wire_limits_reply) != 0) {
        free(reply->buf);
        reply->buf = NULL;
        snprintf(code, 64, "INTERNAL_ERROR");
        snprintf(msg, msglen, "the gateway sent a malformed reply");
        return SBX_E_INTERNAL;
    }
    bool ok = false;
    sbx_wire_get_bool(reply->m.root, "ok", &ok);
    if (!ok) {
        const msgpack_object *eo = NULL;
        sbx_str c = SBX_STR("INTERNAL_ERROR"), t = SBX_STR("");
        if (sbx_wire_get_map(reply->m.root, "error", &eo) == 0) {
            sbx_wire_get_str(eo, "code", &c);
            sbx_wire_get_str(eo, "message", &t);
        }
        snprintf(code, 64, "%.*s", (int)c.n, c.p);
        snprintf(msg, msglen, "%.*s", (int)t.n, t.p);
        hreply_free(reply);
        return sbx_err_from_name(code, strlen(code)); /* c points into the freed reply */
    }
    static const msgpack_object empty = {.type = MSGPACK_OBJECT_MAP};
    if (sbx_wire_get_map(reply->m.root, "result", &reply->result) != 0)
        reply->result = &empty;
    return 0;
}

void
hreply_free(struct hreply *r)
{
    if (r->buf) {
        sbx_wire_msg_free(&r->m);
        free(r->buf);
    }
    memset(r, 0, sizeof(*r));
}
