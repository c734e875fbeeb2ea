/*
 * client.c — the C client library; see include/sbx/sbx.h (the API) and
 * include/sbx/result.h.  Built with -fvisibility=hidden: only what those
 * headers declare with SBX_API leaves libsbx.
 */
#include "../include/sbx/sbx.h"

#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cleanup.h"
#include "err.h"
#include "error.h"
#include "id.h"
#include "json.h"
#include "nngx.h"
#include "util.h"
#include "wire.h"

struct sbx_client {
    nng_socket sock;
    int64_t timeout_ms;
    sbx_nng_sec sec; /* the TLS identity (owned references), or none */
    char *key; /* $SBX_API_KEY at open, sent in every request's "key"; or NULL */
};

struct sbx_reply {
    nng_msg *msg;
    sbx_msg dec;
    const msgpack_object *result;
};

static const msgpack_object empty_map = {.type = MSGPACK_OBJECT_MAP};

static inline void
reply_cleanup(sbx_reply **r)
{
    sbx_reply_free(*r);
}
/* _cleanup_reply_ — sbx_reply_free a reply when it goes out of scope. */
#define _cleanup_reply_ __attribute__((cleanup(reply_cleanup)))

void
sbx_error_free(sbx_error *err)
{
    if (!err)
        return;
    free(err->context_json);
    err->context_json = NULL;
}

/*
 * Errors.  Inside the library a failure is an sbx_err_t (runtime/error.h,
 * docs/errors.md); a public function hands its caller the public form,
 * sbx_error, through export_err, the one place where the two meet.  Two
 * client-side failures have wire names that no code of err.h carries (sbx.h,
 * Errors): they travel as these private codes and leave as their names with
 * the public code given.  Errors a reply carries (the gateway's or a
 * shard's) are copied as they came (call).
 */
#define E_GATEWAY_UNAVAILABLE (SBX_E__LAST + 1) /* leaves as SBX_E_SHARD_UNAVAILABLE */
#define E_INVALID_RESPONSE (SBX_E__LAST + 2)    /* leaves as SBX_E_MALFORMED */

/* export_err — fill out (may be NULL) from *e, release *e; the public code. */
static int
export_err(sbx_error *out, sbx_err_t *e)
{
    int code = sbx_err_code(*e);
    const char *name = sbx_err_name(code);
    if (code == E_GATEWAY_UNAVAILABLE) {
        name = "GATEWAY_UNAVAILABLE";
        code = SBX_E_SHARD_UNAVAILABLE;
    } else if (code == E_INVALID_RESPONSE) {
        name = "INVALID_RESPONSE";
        code = SBX_E_MALFORMED;
    }
    if (out) {
        snprintf(out->code, sizeof(out->code), "%s", name);
        snprintf(out->message, sizeof(out->message), "%s", sbx_err_msg(*e));
        out->context_json = NULL;
    }
    sbx_err_release(e);
    return code;
}

/* fail — a failure found at the API boundary: make the object, export it. */
static int
fail(sbx_error *out, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int
fail(sbx_error *out, int code, const char *fmt, ...)
{
    sbx_err_t e = NULL;
    va_list ap;
    va_start(ap, fmt);
    sbx_err_makev(&e, code, fmt, ap);
    va_end(ap);
    return export_err(out, &e);
}

static void
clear_err(sbx_error *err)
{
    if (err) {
        err->code[0] = err->message[0] = '\0';
        err->context_json = NULL;
    }
}

int
sbx_client_open(sbx_client **out, const char *url, sbx_error *err)
{
    return sbx_client_open_tls(out, url, NULL, err);
}

int
sbx_client_open_tls(sbx_client **out, const char *url, const sbx_tls_files *tls, sbx_error *err)
{
    int rv;
    sbx_err_t e = NULL;
    clear_err(err);
    if (!url || !*url)
        url = getenv("SBX_GATEWAY");
    if (!url || !*url)
        url = SBX_DEFAULT_GATEWAY;
    sbx_client *c = sbx_xcalloc(1, sizeof(*c));
    c->timeout_ms = 300000;
    const char *t = getenv("SBX_TIMEOUT_MS");
    if (t && atoll(t) > 0)
        c->timeout_ms = atoll(t);
    sbx_tls_files env = {getenv("SBX_TLS_CA"), getenv("SBX_TLS_CERT"), getenv("SBX_TLS_KEY")};
    if (!tls)
        tls = &env;
    /* Loaded for tls+tcp:// only: a plain or ipc:// gateway needs none. */
    if (sbx_nng_url_is_tls(url) &&
        sbx_nng_sec_open(&c->sec, tls->ca, tls->cert, tls->key, false, &e) != 0) {
        free(c);
        return export_err(err, &e);
    }
    const char *k = getenv("SBX_API_KEY");
    if (k && *k)
        c->key = sbx_xstrdup(k);
    if ((rv = nng_req0_open(&c->sock)) != 0)
        goto fail;
    nng_socket_set_size(c->sock, NNG_OPT_RECVMAXSZ, SBX_WIRE_MAX_FRAME);
    /* The library never re-sends on its own: a retry is an explicit call
     * with the same request id. */
    nng_socket_set_ms(c->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMINT, 10);
    nng_socket_set_ms(c->sock, NNG_OPT_RECONNMAXT, 1000);
    /* A synchronous dial: a refused handshake fails here, at once. */
    if (sbx_nng_dial(c->sock, url, &c->sec, NULL, 0, &e) != 0) {
        nng_close(c->sock);
        sbx_nng_sec_close(&c->sec);
        free(c->key);
        free(c);
        if (sbx_err_code(e) == SBX_E_VALIDATION)
            return export_err(err, &e);
        sbx_err_t g = NULL;
        sbx_err_make(&g, E_GATEWAY_UNAVAILABLE, "cannot reach the sbx gateway: %s (is sbxd running%s?)",
                     sbx_err_msg(e), sbx_nng_url_is_tls(url) ? ", with a certificate of this CA" : "");
        sbx_err_release(&e);
        return export_err(err, &g);
    }
    *out = c;
    return 0;
fail:
    sbx_nng_sec_close(&c->sec);
    free(c->key);
    free(c);
    return fail(err, E_GATEWAY_UNAVAILABLE,
                "cannot reach the sbx gateway at %s: %s (is sbxd running?)", url,
                nng_strerror(rv));
}

void
sbx_client_close(sbx_client *c)
{
    if (!c)
        return;
    nng_close(c->sock);
    sbx_nng_sec_close(&c->sec);
    free(c->key);
    free(c);
}

void
sbx_client_set_timeout(sbx_client *c, int64_t ms)
{
    if (ms > 0)
        c->timeout_ms = ms;
}

static inline void
aio_cleanup(nng_aio **aio)
{
    if (*aio)
        nng_aio_free(*aio);
}

static inline void
ctx_cleanup(nng_ctx *ctx)
{
    if (nng_ctx_id(*ctx) > 0)
        nng_ctx_close(*ctx);
}

/* roundtrip — one request/reply on a context of its own (concurrent calls
 * do not interfere), each wait bounded by what is left of timeout_ms.  0
 * with *reply (the caller's), or a negative code with *e set. */
static int
roundtrip(sbx_client *c, const char *buf, size_t len, int64_t timeout_ms, nng_msg **reply,
          sbx_err_t *e)
{
    __attribute__((cleanup(ctx_cleanup))) nng_ctx ctx = NNG_CTX_INITIALIZER;
    __attribute__((cleanup(aio_cleanup))) nng_aio *aio = NULL;
    nng_msg *m = NULL;
    int rv;
    if ((rv = nng_ctx_open(&ctx, c->sock)) != 0)
        return sbx_err_make(e, SBX_E_INTERNAL, "nng_ctx_open: %s", nng_strerror(rv));
    if (nng_aio_alloc(&aio, NULL, NULL) != 0 || nng_msg_alloc(&m, len) != 0)
        return sbx_err_make(e, -ENOMEM, "a request of %zu bytes", len);
    memcpy(nng_msg_body(m), buf, len);
    int64_t deadline = sbx_mono_ms() + timeout_ms;
    nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
    nng_aio_set_msg(aio, m);
    nng_ctx_send(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        nng_msg_free(m); /* not sent: still ours */
        if (rv == NNG_ETIMEDOUT)
            return sbx_err_make(e, E_GATEWAY_UNAVAILABLE,
                                "the gateway did not accept the request within %lld ms",
                                (long long)timeout_ms);
        return sbx_err_make(e, E_GATEWAY_UNAVAILABLE, "sending to the gateway failed: %s",
                            nng_strerror(rv));
    }
    int64_t left = deadline - sbx_mono_ms();
    nng_aio_set_timeout(aio, (nng_duration)(left > 1 ? left : 1));
    nng_ctx_recv(ctx, aio);
    nng_aio_wait(aio);
    if ((rv = nng_aio_result(aio)) != 0) {
        if (rv == NNG_ETIMEDOUT)
            return sbx_err_make(e, SBX_E_TIMEOUT, "no reply within the deadline of %lld ms",
                                (long long)timeout_ms);
        return sbx_err_make(e, E_GATEWAY_UNAVAILABLE, "receiving from the gateway failed: %s",
                            nng_strerror(rv));
    }
    *reply = nng_aio_get_msg(aio);
    return 0;
}

/* The body of sbx_call; with keep_err, an error reply is also returned in
 * *out (result = the error map) so callers can read its context. */
static int
call(sbx_client *c, const char *op, const char *sandbox, const void *args, size_t args_len,
     int64_t timeout_ms, const char *request_id, sbx_reply **out, sbx_error *err, bool keep_err)
{
    char id[37];
    sbx_enc e;
    _cleanup_free_ char *buf = NULL;
    size_t len;
    nng_msg *reply = NULL;
    int rc;

    clear_err(err);
    if (timeout_ms <= 0)
        timeout_ms = c->timeout_ms;
    /* No wait longer than a gateway accepts (runtime/wire.h): nng's
     * durations are 32-bit, and a longer deadline would wrap. */
    if (timeout_ms > SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS)
        timeout_ms = SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS;
    if (request_id && *request_id)
        snprintf(id, sizeof(id), "%s", request_id);
    else
        sbx_request_id(id);
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstr(&e, "id", id);
    sbx_enc_kstr(&e, "op", op);
    if (sandbox)
        sbx_enc_kstr(&e, "sandbox", sandbox);
    sbx_enc_kint(&e, "timeoutMs", timeout_ms);
    if (c->key)
        sbx_enc_kstr(&e, "key", c->key);
    if (args && args_len) {
        sbx_enc_str(&e, "args");
        sbx_enc_raw(&e, args, args_len);
    }
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) != 0)
        return fail(err, SBX_E_INTERNAL, "cannot encode the request");
    if (len > SBX_WIRE_MAX_REQUEST)
        return fail(err, SBX_E_TOO_LARGE, "request of %zu bytes exceeds the %u-byte limit", len,
                    SBX_WIRE_MAX_REQUEST);
    sbx_err_t rt = NULL;
    if ((rc = roundtrip(c, buf, len, timeout_ms, &reply, &rt)) != 0)
        return export_err(err, &rt);
    sbx_reply *r = sbx_xcalloc(1, sizeof(*r));
    r->msg = reply;
    if (sbx_wire_decode(&r->dec, nng_msg_body(reply), nng_msg_len(reply), &sbx_wire_limits_reply)) {
        nng_msg_free(reply);
        free(r);
        /* The request was fine; the reply is not: a client-side name. */
        return fail(err, E_INVALID_RESPONSE, "the gateway sent a reply that is not a valid frame");
    }
    bool ok = false;
    sbx_wire_get_bool(r->dec.root, "ok", &ok);
    if (!ok) {
        const msgpack_object *eo = NULL;
        sbx_str code = {"INTERNAL_ERROR", 14}, msg = {"", 0};
        if (sbx_wire_get_map(r->dec.root, "error", &eo) == 0) {
            sbx_wire_get_str(eo, "code", &code);
            sbx_wire_get_str(eo, "message", &msg);
        }
        rc = sbx_err_from_name(code.p, code.n);
        if (err) {
            snprintf(err->code, sizeof(err->code), "%.*s", (int)code.n, code.p);
            snprintf(err->message, sizeof(err->message), "%.*s", (int)msg.n, msg.p);
            const msgpack_object *ctx = eo ? sbx_wire_get(eo, "context") : NULL;
            err->context_json = ctx ? sbx_json_dump(ctx, false) : NULL;
        }
        if (keep_err && eo) {
            r->result = eo;
            *out = r;
        } else {
            sbx_reply_free(r);
        }
        return rc;
    }
    if (sbx_wire_get_map(r->dec.root, "result", &r->result) != 0)
        r->result = &empty_map;
    *out = r;
    return 0;
}

int
sbx_call(sbx_client *c, const char *op, const char *sandbox, const void *args, size_t args_len,
         int64_t timeout_ms, const char *request_id, sbx_reply **out, sbx_error *err)
{
    return call(c, op, sandbox, args, args_len, timeout_ms, request_id, out, err, false);
}

int
sbx_call_json(sbx_client *c, const char *op, const char *sandbox, const char *args_json,
              int64_t timeout_ms, sbx_reply **out, sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen = 0;
    clear_err(err);
    if (args_json && *args_json) {
        json_error_t je;
        json_t *j = json_loads(args_json, JSON_DECODE_ANY, &je);
        if (!j || !json_is_object(j)) {
            if (j)
                json_decref(j);
            return fail(err, SBX_E_VALIDATION, "arguments must be a JSON object: %s",
                        j ? "not an object" : je.text);
        }
        sbx_enc e;
        sbx_enc_init(&e);
        int rc = sbx_json_to_msgpack(j, &e);
        json_decref(j);
        if (rc || sbx_enc_finish(&e, &args, &alen) != 0) {
            sbx_enc_free(&e);
            return fail(err, SBX_E_VALIDATION, "arguments cannot be encoded");
        }
    }
    return sbx_call(c, op, sandbox, args, alen, timeout_ms, NULL, out, err);
}

const msgpack_object *
sbx_reply_result(const sbx_reply *r)
{
    return r->result;
}

char *
sbx_reply_json(const sbx_reply *r, bool pretty)
{
    return sbx_json_dump(r->result, pretty);
}

void
sbx_reply_free(sbx_reply *r)
{
    if (!r)
        return;
    sbx_wire_msg_free(&r->dec);
    nng_msg_free(r->msg);
    free(r);
}

/* ------------------------------------------------------------------------------ */

static void
copy_bytes(const msgpack_object *res, const char *key, char **out, size_t *len)
{
    sbx_str s = {"", 0};
    sbx_wire_get_bin(res, key, &s);
    *out = sbx_xstrndup(s.p ? s.p : "", s.n);
    *len = s.n;
}

/* encode_exec_args — the exec arguments of o as one encoded msgpack map
 * (plus an optional processId for process.start) in *args (heap, the
 * caller's); 0, or a negative code with *e set. */
static int
encode_exec_args(const sbx_exec_opts *o, const char *process_id, char **args, size_t *alen,
                 sbx_err_t *e)
{
    sbx_enc enc;
    if ((!o->command) == (!o->argv))
        return sbx_err_make(e, SBX_E_VALIDATION, "give exactly one of command and argv");
    sbx_enc_init(&enc);
    sbx_enc_map(&enc);
    if (process_id)
        sbx_enc_kstr(&enc, "processId", process_id);
    if (o->command)
        sbx_enc_kstr(&enc, "command", o->command);
    if (o->argv) {
        sbx_enc_karray(&enc, "argv");
        for (const char *const *p = o->argv; *p; p++)
            sbx_enc_str(&enc, *p);
        sbx_enc_end(&enc);
    }
    if (o->cwd)
        sbx_enc_kstr(&enc, "cwd", o->cwd);
    if (o->env && o->env[0]) {
        sbx_enc_kmap(&enc, "env");
        for (const char *const *p = o->env; *p; p++) {
            const char *eq = strchr(*p, '=');
            if (!eq || eq == *p) {
                sbx_enc_free(&enc);
                return sbx_err_make(e, SBX_E_VALIDATION,
                                    "env entry '%s' is not NAME=VALUE (env maps names to values, "
                                    "as the SDK's; a bare name is not inherited)",
                                    *p);
            }
            sbx_enc_strn(&enc, *p, (size_t)(eq - *p));
            sbx_enc_str(&enc, eq + 1);
        }
        sbx_enc_end(&enc);
    }
    if (o->timeout_ms > 0)
        sbx_enc_kint(&enc, "timeout", o->timeout_ms);
    if (o->session_id)
        sbx_enc_kstr(&enc, "sessionId", o->session_id);
    if (o->sessionless)
        sbx_enc_kbool(&enc, "sessionless", true);
    if (o->has_stdin || o->stdin_data)
        sbx_enc_kbin(&enc, "stdin", o->stdin_data ? o->stdin_data : "", o->stdin_len);
    sbx_enc_end(&enc);
    if (sbx_enc_finish(&enc, args, alen) != 0)
        return sbx_err_make(e, SBX_E_INTERNAL, "cannot encode exec arguments");
    return 0;
}

/* The deadline of an exec call: the command's timeout + 30 s (sbx.h); 0 (the
 * client's default) without one.  call() caps the sum; a timeout past 24 h
 * is the gateway's to refuse. */
static int64_t
exec_deadline(const sbx_exec_opts *o)
{
    return o->timeout_ms > 0 ? SBX_MIN(o->timeout_ms, SBX_WIRE_MAX_DURATION_MS) + 30000 : 0;
}

int
sbx_exec(sbx_client *c, const char *sandbox, const sbx_exec_opts *o, sbx_exec_result *res,
         sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen;
    _cleanup_reply_ sbx_reply *r = NULL;
    memset(res, 0, sizeof(*res));
    clear_err(err);
    sbx_err_t e = NULL;
    if (encode_exec_args(o, NULL, &args, &alen, &e) != 0)
        return export_err(err, &e);
    int rc = call(c, "exec", sandbox, args, alen, exec_deadline(o), NULL, &r, err, true);
    if (rc) {
        /* SESSION_TERMINATED: the shell exited under the command; its exit
         * code and what it printed first are in the error's context. */
        const msgpack_object *ctx = r ? sbx_wire_get(sbx_reply_result(r), "context") : NULL;
        int64_t code;
        if (ctx && sbx_wire_get_i64(ctx, "exitCode", &code) == 0) {
            res->exit_code = (int)code;
            copy_bytes(ctx, "stdout", &res->stdout_data, &res->stdout_len);
            copy_bytes(ctx, "stderr", &res->stderr_data, &res->stderr_len);
            snprintf(res->cause, sizeof(res->cause), "EXITED");
        }
        return rc;
    }
    const msgpack_object *res_o = sbx_reply_result(r);
    int64_t v = 0;
    sbx_wire_get_bool(res_o, "success", &res->success);
    if (sbx_wire_get_i64(res_o, "exitCode", &v) == 0)
        res->exit_code = (int)v;
    if (sbx_wire_get_i64(res_o, "signal", &v) == 0)
        res->signal = (int)v;
    copy_bytes(res_o, "stdout", &res->stdout_data, &res->stdout_len);
    copy_bytes(res_o, "stderr", &res->stderr_data, &res->stderr_len);
    sbx_wire_get_bool(res_o, "stdoutTruncated", &res->stdout_truncated);
    sbx_wire_get_bool(res_o, "stderrTruncated", &res->stderr_truncated);
    if (sbx_wire_get_i64(res_o, "stdoutBytes", &v) == 0)
        res->stdout_bytes = (uint64_t)v;
    if (sbx_wire_get_i64(res_o, "stderrBytes", &v) == 0)
        res->stderr_bytes = (uint64_t)v;
    if (sbx_wire_get_i64(res_o, "duration", &v) == 0)
        res->duration_ms = v;
    sbx_wire_get_bool(res_o, "timedOut", &res->timed_out);
    sbx_str cause;
    if (sbx_wire_get_str(res_o, "cause", &cause) == 0)
        sbx_str_copy(cause, res->cause, sizeof(res->cause));
    return 0;
}

void
sbx_exec_result_free(sbx_exec_result *r)
{
    free(r->stdout_data);
    free(r->stderr_data);
    r->stdout_data = r->stderr_data = NULL;
}

int
sbx_destroy(sbx_client *c, const char *sandbox, bool *destroyed, sbx_error *err)
{
    _cleanup_reply_ sbx_reply *r = NULL;
    int rc = sbx_call(c, "destroy", sandbox, NULL, 0, 0, NULL, &r, err);
    if (rc)
        return rc;
    bool d = false;
    sbx_wire_get_bool(sbx_reply_result(r), "destroyed", &d);
    if (destroyed)
        *destroyed = d;
    return 0;
}

int
sbx_ping(sbx_client *c, const char *sandbox, sbx_error *err)
{
    _cleanup_reply_ sbx_reply *r = NULL;
    int rc = sbx_call(c, "ping", sandbox, NULL, 0, 0, NULL, &r, err);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* Streams. */

#define STREAM_WAIT_MS 25000
#define STREAM_RETRY_MS 30000
/* The deadline of one stream.read: its long poll plus a margin. */
#define STREAM_CALL_MS (STREAM_WAIT_MS + 10000)

struct sbx_stream {
    sbx_client *c;
    char *sandbox;
    char id[80];
    uint64_t after;     /* last sequence delivered to the caller */
    sbx_reply *batch;   /* the current read's reply */
    const msgpack_object *events;
    uint32_t idx;
    bool done;          /* the server said the stream ended */
};

static sbx_stream *
stream_alloc(sbx_client *c, const char *sandbox, const char *id, uint64_t after)
{
    sbx_stream *s = sbx_xcalloc(1, sizeof(*s));
    s->c = c;
    s->sandbox = sbx_xstrdup(sandbox);
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->after = after;
    return s;
}

int
sbx_exec_stream(sbx_client *c, const char *sandbox, const sbx_exec_opts *o, sbx_stream **out,
                sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen;
    _cleanup_reply_ sbx_reply *r = NULL;
    clear_err(err);
    sbx_err_t e = NULL;
    if (encode_exec_args(o, NULL, &args, &alen, &e) != 0)
        return export_err(err, &e);
    int rc = sbx_call(c, "exec.stream", sandbox, args, alen, 0, NULL, &r, err);
    if (rc)
        return rc;
    sbx_str id = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "streamId", &id);
    char sid[80];
    sbx_str_copy(id, sid, sizeof(sid));
    *out = stream_alloc(c, sandbox, sid, 0);
    return 0;
}

int
sbx_stream_open(sbx_client *c, const char *sandbox, const char *stream_id, uint64_t after,
                sbx_stream **out, sbx_error *err)
{
    clear_err(err);
    if (!stream_id || !*stream_id || strlen(stream_id) >= 72)
        return fail(err, SBX_E_VALIDATION, "a stream ID of 1-71 bytes is required");
    *out = stream_alloc(c, sandbox, stream_id, after);
    return 0;
}

const char *
sbx_stream_id(const sbx_stream *s)
{
    return s->id;
}

uint64_t
sbx_stream_last(const sbx_stream *s)
{
    return s->after;
}

static bool
transient(const sbx_error *e)
{
    return !strcmp(e->code, "SHARD_UNAVAILABLE") || !strcmp(e->code, "REQUEST_TIMEOUT") ||
           !strcmp(e->code, "GATEWAY_UNAVAILABLE");
}

static int
stream_fetch(sbx_stream *s, sbx_error *err)
{
    /* One bound for the whole fetch, retries included (sbx.h): no attempt
     * runs past it, and its long poll ends 10 s before its own deadline. */
    int64_t until = sbx_mono_ms() + STREAM_RETRY_MS + 10000;
    for (int attempt = 0;; attempt++) {
        sbx_enc e;
        _cleanup_free_ char *args = NULL;
        size_t alen;
        int64_t call_ms = SBX_MIN((int64_t)STREAM_CALL_MS, until - sbx_mono_ms());
        if (call_ms < 1)
            call_ms = 1;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "streamId", s->id);
        sbx_enc_kint(&e, "after", (int64_t)s->after);
        sbx_enc_kint(&e, "waitMs", SBX_MAX(call_ms - 10000, (int64_t)0));
        sbx_enc_end(&e);
        sbx_enc_finish(&e, &args, &alen);
        sbx_reply *r = NULL;
        int rc = sbx_call(s->c, "stream.read", s->sandbox, args, alen, call_ms, NULL, &r, err);
        if (rc == 0) {
            sbx_reply_free(s->batch);
            s->batch = r;
            s->idx = 0;
            s->events = NULL;
            sbx_wire_get_array(sbx_reply_result(r), "events", &s->events);
            sbx_wire_get_bool(sbx_reply_result(r), "done", &s->done);
            return 0;
        }
        if (!err || !transient(err) || sbx_mono_ms() + 1000 > until)
            return rc;
        sbx_error_free(err);
        struct timespec ts = {0, (long)SBX_MIN(100 * (attempt + 1), 1000) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

int
sbx_stream_next(sbx_stream *s, sbx_event *ev, sbx_error *err)
{
    clear_err(err);
    for (;;) {
        if (s->events && s->idx < s->events->via.array.size) {
            const msgpack_object *o = &s->events->via.array.ptr[s->idx++];
            int64_t seq = 0, code = 0;
            sbx_str type = {"", 0}, data = {"", 0};
            sbx_wire_get_i64(o, "seq", &seq);
            if ((uint64_t)seq <= s->after)
                continue; /* already delivered (a retried read) */
            memset(ev, 0, sizeof(*ev));
            ev->seq = (uint64_t)seq;
            sbx_wire_get_str(o, "type", &type);
            snprintf(ev->type, sizeof(ev->type), "%.*s", (int)type.n, type.p);
            if (sbx_wire_get_bin(o, "data", &data) == 0) {
                ev->data = data.p;
                ev->data_len = data.n;
            }
            if (sbx_wire_get_i64(o, "exitCode", &code) == 0) {
                ev->has_exit_code = true;
                ev->exit_code = (int)code;
            }
            ev->obj = o;
            s->after = (uint64_t)seq;
            return 1;
        }
        if (s->done)
            return 0;
        int rc = stream_fetch(s, err);
        if (rc)
            return rc;
    }
}

int
sbx_stream_cancel(sbx_stream *s, sbx_error *err)
{
    sbx_enc e;
    _cleanup_free_ char *args = NULL;
    size_t alen;
    _cleanup_reply_ sbx_reply *r = NULL;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "streamId", s->id);
    sbx_enc_end(&e);
    sbx_enc_finish(&e, &args, &alen);
    int rc = sbx_call(s->c, "stream.cancel", s->sandbox, args, alen, 0, NULL, &r, err);
    return rc;
}

void
sbx_stream_close(sbx_stream *s)
{
    if (!s)
        return;
    sbx_reply_free(s->batch);
    free(s->sandbox);
    free(s);
}

/* ------------------------------------------------------------------------------ */
/* Typed helpers. */

static int
call_enc(sbx_client *c, const char *op, const char *sandbox, sbx_enc *e, sbx_reply **r,
         sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen;
    sbx_enc_end(e);
    if (sbx_enc_finish(e, &args, &alen) != 0)
        return fail(err, SBX_E_INTERNAL, "cannot encode arguments");
    int rc = sbx_call(c, op, sandbox, args, alen, 0, NULL, r, err);
    return rc;
}

int
sbx_write_file(sbx_client *c, const char *sandbox, const char *path, const void *data, size_t len,
               sbx_error *err)
{
    sbx_enc e;
    _cleanup_reply_ sbx_reply *r = NULL;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "path", path);
    sbx_enc_kbin(&e, "content", data, len);
    int rc = call_enc(c, "file.write", sandbox, &e, &r, err);
    return rc;
}

int
sbx_read_file(sbx_client *c, const char *sandbox, const char *path, char **data, size_t *len,
              char mime[64], sbx_error *err)
{
    sbx_enc e;
    _cleanup_reply_ sbx_reply *r = NULL;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "path", path);
    int rc = call_enc(c, "file.read", sandbox, &e, &r, err);
    if (rc)
        return rc;
    const msgpack_object *res = sbx_reply_result(r);
    sbx_str content = {"", 0}, enc = {"", 0}, m = {"", 0};
    sbx_wire_get_bin(res, "content", &content);
    sbx_wire_get_str(res, "encoding", &enc);
    sbx_wire_get_str(res, "mimeType", &m);
    if (mime)
        snprintf(mime, 64, "%.*s", (int)m.n, m.p);
    if (sbx_str_eq(enc, "base64")) {
        if (sbx_base64_decode(content.p, content.n, data, len) != 0) {
            return fail(err, SBX_E_MALFORMED, "the file content is not valid base64");
        }
    } else {
        *data = sbx_xstrndup(content.p, content.n);
        *len = content.n;
    }
    return 0;
}

int
sbx_set_env(sbx_client *c, const char *sandbox, const char *const *vars, sbx_error *err)
{
    sbx_enc e;
    _cleanup_reply_ sbx_reply *r = NULL;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kmap(&e, "vars");
    for (const char *const *p = vars; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        sbx_enc_strn(&e, *p, eq ? (size_t)(eq - *p) : strlen(*p));
        if (eq)
            sbx_enc_str(&e, eq + 1);
        else
            sbx_enc_nil(&e);
    }
    sbx_enc_end(&e);
    int rc = call_enc(c, "env.set", sandbox, &e, &r, err);
    return rc;
}

int
sbx_process_start(sbx_client *c, const char *sandbox, const sbx_exec_opts *o,
                  const char *process_id, char id[128], sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen;
    _cleanup_reply_ sbx_reply *r = NULL;
    clear_err(err);
    sbx_err_t e = NULL;
    if (encode_exec_args(o, process_id, &args, &alen, &e) != 0)
        return export_err(err, &e);
    int rc = sbx_call(c, "process.start", sandbox, args, alen, 0, NULL, &r, err);
    if (rc)
        return rc;
    sbx_str pid = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "processId", &pid);
    snprintf(id, 128, "%.*s", (int)pid.n, pid.p);
    return 0;
}

int
sbx_process_kill(sbx_client *c, const char *sandbox, const char *process_id, int *exit_code,
                 sbx_error *err)
{
    sbx_enc e;
    _cleanup_reply_ sbx_reply *r = NULL;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "processId", process_id);
    int rc = call_enc(c, "process.kill", sandbox, &e, &r, err);
    if (rc)
        return rc;
    int64_t code = 0;
    sbx_wire_get_i64(sbx_reply_result(r), "exitCode", &code);
    if (exit_code)
        *exit_code = (int)code;
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* sbx_exec_reply: the exec reply itself, arguments encoded as sbx_exec's. */

int
sbx_exec_reply(sbx_client *c, const char *sandbox, const sbx_exec_opts *o, sbx_reply **out,
               sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen;
    *out = NULL;
    clear_err(err);
    sbx_err_t e = NULL;
    if (encode_exec_args(o, NULL, &args, &alen, &e) != 0)
        return export_err(err, &e);
    return call(c, "exec", sandbox, args, alen, exec_deadline(o), NULL, out, err, false);
}

/* ------------------------------------------------------------------------------ */
/* The argument builder: an sbx_enc whose root map is open. */

struct sbx_args {
    sbx_enc e;
    bool bad_json; /* a kjson text that did not parse (sbx_enc tracks the rest) */
    bool sent;     /* sbx_call_args closed and sent it */
};

sbx_args *
sbx_args_new(void)
{
    sbx_args *a = sbx_xcalloc(1, sizeof(*a));
    sbx_enc_init(&a->e);
    sbx_enc_map(&a->e);
    return a;
}

void
sbx_args_free(sbx_args *a)
{
    if (!a)
        return;
    sbx_enc_free(&a->e);
    free(a);
}

void
sbx_args_kstr(sbx_args *a, const char *k, const char *v)
{
    sbx_enc_kstr(&a->e, k, v);
}

void
sbx_args_kstrn(sbx_args *a, const char *k, const char *v, size_t n)
{
    sbx_enc_kstrn(&a->e, k, v, n);
}

void
sbx_args_kint(sbx_args *a, const char *k, int64_t v)
{
    sbx_enc_kint(&a->e, k, v);
}

void
sbx_args_kbool(sbx_args *a, const char *k, bool v)
{
    sbx_enc_kbool(&a->e, k, v);
}

void
sbx_args_kbin(sbx_args *a, const char *k, const void *p, size_t n)
{
    sbx_enc_kbin(&a->e, k, p, n);
}

void
sbx_args_kmap(sbx_args *a, const char *k)
{
    sbx_enc_kmap(&a->e, k);
}

void
sbx_args_karray(sbx_args *a, const char *k)
{
    sbx_enc_karray(&a->e, k);
}

void
sbx_args_end(sbx_args *a)
{
    sbx_enc_end(&a->e);
}

void
sbx_args_str(sbx_args *a, const char *v)
{
    sbx_enc_str(&a->e, v);
}

void
sbx_args_strn(sbx_args *a, const char *v, size_t n)
{
    sbx_enc_strn(&a->e, v, n);
}

void
sbx_args_int(sbx_args *a, int64_t v)
{
    sbx_enc_int(&a->e, v);
}

void
sbx_args_bool(sbx_args *a, bool v)
{
    sbx_enc_bool(&a->e, v);
}

void
sbx_args_nil(sbx_args *a)
{
    sbx_enc_nil(&a->e);
}

void
sbx_args_knil(sbx_args *a, const char *k)
{
    sbx_enc_str(&a->e, k);
    sbx_enc_nil(&a->e);
}

void
sbx_args_kjson(sbx_args *a, const char *k, const char *json)
{
    json_error_t je;
    json_t *j = json_loads(json ? json : "", JSON_DECODE_ANY, &je);
    sbx_enc_str(&a->e, k);
    if (!j || sbx_json_to_msgpack(j, &a->e) != 0) {
        a->bad_json = true;
        sbx_enc_nil(&a->e); /* keep the map's shape; the call is refused anyway */
    }
    json_decref(j);
}

int
sbx_call_args(sbx_client *c, const char *op, const char *sandbox, sbx_args *a,
              int64_t timeout_ms, sbx_reply **out, sbx_error *err)
{
    _cleanup_free_ char *args = NULL;
    size_t alen = 0;
    clear_err(err);
    if (a) {
        if (a->sent)
            return fail(err, SBX_E_VALIDATION, "these arguments were already sent");
        a->sent = true;
        if (a->bad_json)
            return fail(err, SBX_E_VALIDATION, "an argument is not valid JSON");
        sbx_enc_end(&a->e);
        if (sbx_enc_finish(&a->e, &args, &alen) != 0)
            return fail(err, SBX_E_VALIDATION,
                        "the arguments are not one well-formed map (unbalanced "
                        "sbx_args_kmap/karray and sbx_args_end?)");
    }
    return sbx_call(c, op, sandbox, args, alen, timeout_ms, NULL, out, err);
}

/* ------------------------------------------------------------------------------ */
/* Result accessors (include/sbx/result.h): the wire module's, exported. */

const msgpack_object *
sbx_get(const msgpack_object *map, const char *key)
{
    return sbx_wire_get(map, key);
}

static int
get_view(int rc, sbx_str s, sbx_view *out)
{
    if (rc == 0)
        *out = (sbx_view){s.p, s.n};
    return rc;
}

int
sbx_get_str(const msgpack_object *map, const char *key, sbx_view *out)
{
    sbx_str s;
    return get_view(sbx_wire_get_str(map, key, &s), s, out);
}

int
sbx_get_bytes(const msgpack_object *map, const char *key, sbx_view *out)
{
    sbx_str s;
    return get_view(sbx_wire_get_bin(map, key, &s), s, out);
}

int
sbx_get_i64(const msgpack_object *map, const char *key, int64_t *out)
{
    return sbx_wire_get_i64(map, key, out);
}

int
sbx_get_bool(const msgpack_object *map, const char *key, bool *out)
{
    return sbx_wire_get_bool(map, key, out);
}

int
sbx_get_map(const msgpack_object *map, const char *key, const msgpack_object **out)
{
    return sbx_wire_get_map(map, key, out);
}

int
sbx_get_array(const msgpack_object *map, const char *key, const msgpack_object **out)
{
    return sbx_wire_get_array(map, key, out);
}

int
sbx_value_str(const msgpack_object *o, sbx_view *out)
{
    sbx_str s;
    return get_view(sbx_wire_obj_str(o, &s), s, out);
}

bool
sbx_view_eq(sbx_view v, const char *s)
{
    return sbx_str_eq((sbx_str){v.p, v.n}, s);
}

char *
sbx_value_json(const msgpack_object *o, bool pretty)
{
    return sbx_json_dump(o, pretty);
}

int
sbx_base64_to_bytes(const char *text, size_t n, char **out, size_t *len)
{
    return sbx_base64_decode(text, n, out, len) == 0 ? 0 : SBX_E_VALIDATION;
}
