/* http.c — see http.h and docs/http.md.  The HTTP front's server
 * lifecycle (sbx_http_start, sbx_http_stop), its access handler and its
 * JSON responses; the other parts are listed in http_int.h.
 *
 * Threads: MHD's threads run access_cb, completed_cb and the content
 * readers; nng's threads only resume connections (http_call.c).  The
 * struct sbx_http is built before the daemon starts and, but for the
 * counters (atomic), stopping (atomic) and the worker list (under mu), is
 * read-only while it serves.
 *
 * One request = one `struct hreq` behind MHD's con_cls.  Its life:
 *
 *   headers ──► route, auth ──► body chunks ──► call the op (suspended) ──►
 *     JSON reply                                   │
 *     or, for a stream: first stream.read (suspended) ──► SSE response whose
 *        content reader pulls more with stream.read (suspended while empty)
 *
 * Suspension rule (MHD_resume_connection on a connection that is not
 * suspended is undefined behaviour): a call is started only after
 * MHD_suspend_connection, under hr->mu, and the nng completion callback
 * resumes exactly once, as its last touch of the request.  So "a call is in
 * flight" and "the connection is suspended" are the same state, and MHD never
 * completes (frees) a request whose call is in flight.
 */
#include "http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/json.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/ops.h"
#include "../runtime/prom.h"
#include "http_int.h"
#include "openapi_gen.h"

#define DEFAULT_MAX_BODY (32 << 20)
#define DEFAULT_TIMEOUT_MS 600000
#define RAW_PUT_MAX (29u << 20)       /* base64 of it fits SBX_WIRE_MAX_REQUEST */

/* ------------------------------------------------------------------------------ */
/* Responses. */

/*
 * CORS (WHATWG Fetch): with API keys, any origin may call with a bearer
 * token (no cookies are involved, so a page learns nothing it could not
 * with the key).  Without keys the front answers no CORS at all — browsers
 * then keep responses from cross-origin pages — and first_call refuses
 * cross-origin requests outright (see http_browser_guard).  `cors` is h->keys
 * != NULL.
 */
void
http_add_common_headers(struct MHD_Response *r, bool cors)
{
    if (!cors)
        return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Expose-Headers",
                            "Content-Type, Last-Event-ID, X-Sbx-Stream-Id");
}

/* Queue a response owning buf (freed either way).  h: whose CORS policy
 * applies (NULL: no CORS headers, for answers not meant for scripts);
 * attachment: the body is a tenant's file (Content-Disposition: attachment). */
static enum MHD_Result
queue_buf(struct sbx_http *h, struct MHD_Connection *c, int status, const char *ctype, char *buf,
          size_t len, bool attachment)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    /* Tenant bytes are never a page of the API's origin (issue 16 item 1):
     * a browser saves a raw file instead of rendering it, never sniffs a
     * type into HTML, and if it renders anyway (a direct navigation some
     * browsers still show) the page runs in an opaque origin with scripts
     * off (CSP sandbox, W3C CSP3 §6.3.2), so it cannot call the API with the
     * front's origin.  Applied to every answer: none of the API's is meant
     * to be shown as a page. */
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    MHD_add_response_header(r, "Content-Security-Policy", "sandbox");
    if (attachment)
        MHD_add_response_header(r, "Content-Disposition", "attachment");
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"sbx\"");
    /* RFC 9110 §10.2.3: when to try again after a 503 (the container is
     * starting, a shard is failing over, the interpreter is not ready). */
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, "Retry-After", "1");
    /* RFC 6585 §4: a tenant's quota (QUOTA_EXCEEDED); the bucket refills
     * within a second (context.retryAfterMs is the precise wait). */
    if (status == 429)
        MHD_add_response_header(r, "Retry-After", "1");
    http_add_common_headers(r, h && h->keys);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

static enum MHD_Result
queue_json(struct sbx_http *h, struct MHD_Connection *c, int status, json_t *j)
{
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return MHD_NO;
    size_t n = strlen(text);
    text = sbx_xrealloc(text, n + 2);
    text[n] = '\n';
    return queue_buf(h, c, status, "application/json", text, n + 1, false);
}

static enum MHD_Result
queue_error(struct sbx_http *h, struct MHD_Connection *c, int status, const char *code,
            const char *message)
{
    return queue_json(h, c, status,
                      json_pack("{s:s,s:s,s:{},s:i}", "code", code, "message", message, "context",
                                "httpStatus", status));
}

enum MHD_Result
http_queue_error(struct MHD_Connection *c, int status, const char *code, const char *message)
{
    return queue_error(NULL, c, status, code, message);
}

/* An error reply from the gateway, as the SDK shapes it. */
static enum MHD_Result
queue_error_reply(struct hreq *hr, const msgpack_object *root)
{
    const msgpack_object *eo = NULL;
    sbx_str code = SBX_STR("INTERNAL_ERROR"), msg = SBX_STR("");
    if (sbx_wire_get_map(root, "error", &eo) == 0) {
        sbx_wire_get_str(eo, "code", &code);
        sbx_wire_get_str(eo, "message", &msg);
    }
    int c = sbx_err_from_name(code.p, code.n);
    int status = sbx_err_http(c);
    const msgpack_object *ctx = eo ? sbx_wire_get(eo, "context") : NULL;
    json_t *jctx = ctx ? sbx_json_from_msgpack(ctx) : NULL;
    json_t *j = json_pack("{s:s%,s:s%,s:o,s:i}", "code", code.p, code.n, "message", msg.p, msg.n,
                          "context", jctx ? jctx : json_object(), "httpStatus", status);
    if (hr->rt && hr->rt->op)
        json_object_set_new(j, "operation", json_string(hr->rt->op->name));
    atomic_fetch_add(&hr->h->n_errors, 1);
    return queue_json(hr->h, hr->c, status, j);
}

static enum MHD_Result
queue_err(struct hreq *hr, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static enum MHD_Result
queue_err(struct hreq *hr, int code, const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    atomic_fetch_add(&hr->h->n_errors, 1);
    return queue_error(hr->h, hr->c, sbx_err_http(code), sbx_err_name(code), msg);
}

/* ------------------------------------------------------------------------------ */
/* The access handler. */

static enum MHD_Result
start_op(struct hreq *hr, const char *op)
{
    _cleanup_err_ sbx_err_t err = NULL;
    char *args = NULL;
    size_t alen = 0;
    int rc = http_build_args(hr, &args, &alen, &err);
    if (rc)
        return queue_err(hr, rc, "%s", sbx_err_msg(err));
    rc = http_call_start(hr, op, args, alen, hr->timeout_ms, hr->rid);
    free(args);
    if (rc)
        return queue_err(hr, rc, "could not send the request: %s", sbx_err_message(rc));
    hr->phase = PH_CALL;
    return MHD_YES;
}

/* take_result — the finished call's successful reply: true with *m decoded
 * (the caller frees it) and *res its result map; false when the call failed,
 * the HTTP error response already queued and its MHD result in *ret. */
static bool
take_result(struct hreq *hr, sbx_msg *m, const msgpack_object **res, enum MHD_Result *ret)
{
    char code[64], msg[256];
    int rc = http_call_take(hr, m, res, code, msg, sizeof(msg));
    if (rc == CALL_ERROR_REPLY) {
        *ret = queue_error_reply(hr, m->root);
        sbx_wire_msg_free(m);
        return false;
    }
    if (rc) {
        *ret = queue_error(hr->h, hr->c, sbx_err_http(rc), code, msg);
        return false;
    }
    return true;
}

/* The op's reply arrived (PH_CALL). */
static enum MHD_Result
finish_op(struct hreq *hr)
{
    sbx_msg m;
    const msgpack_object *res;
    enum MHD_Result ret;
    if (!take_result(hr, &m, &res, &ret))
        return ret;
    if (hr->rt->kind == R_FILE_GET) {
        sbx_str content = SBX_STR(""), mime = SBX_STR("application/octet-stream");
        sbx_wire_get_str(res, "content", &content);
        sbx_wire_get_str(res, "mimeType", &mime);
        char *raw;
        size_t rawlen;
        if (sbx_base64_decode(content.p, content.n, &raw, &rawlen) != 0) {
            sbx_wire_msg_free(&m);
            return queue_err(hr, SBX_E_INTERNAL, "the file's content came back malformed");
        }
        char ctype[128];
        snprintf(ctype, sizeof(ctype), "%.*s", (int)mime.n, mime.p);
        sbx_wire_msg_free(&m);
        return queue_buf(hr->h, hr->c, MHD_HTTP_OK, ctype, raw, rawlen, true);
    }
    if (hr->rt->kind == R_METRICS) {
        sbx_str text = SBX_STR("");
        sbx_wire_get_str(res, "text", &text);
        char *body = sbx_xstrndup(text.p, text.n);
        sbx_wire_msg_free(&m);
        return queue_buf(hr->h, hr->c, MHD_HTTP_OK, SBX_PROM_CONTENT_TYPE, body, text.n, false);
    }
    if (hr->sse) {
        sbx_str sid;
        if (sbx_wire_get_str(res, "streamId", &sid) != 0 || sid.n >= sizeof(hr->stream_id)) {
            sbx_wire_msg_free(&m);
            return queue_err(hr, SBX_E_INTERNAL, "the operation answered no stream");
        }
        snprintf(hr->stream_id, sizeof(hr->stream_id), "%.*s", (int)sid.n, sid.p);
        sbx_wire_msg_free(&m);
        hr->after = 0;
        int rc = http_sse_read_start(hr);
        if (rc)
            return queue_err(hr, rc, "could not read the stream");
        hr->phase = PH_READ1;
        return MHD_YES;
    }
    json_t *j = hr->b64 ? sbx_json_from_msgpack_b64(res) : sbx_json_from_msgpack(res);
    sbx_wire_msg_free(&m);
    if (!j)
        return queue_err(hr, SBX_E_INTERNAL, "the result cannot be expressed in JSON");
    ret = queue_json(hr->h, hr->c, MHD_HTTP_OK, j);
    return ret;
}

/* The first stream.read arrived (PH_READ1): an error is a plain HTTP error;
 * events start the SSE response. */
static enum MHD_Result
finish_read1(struct hreq *hr)
{
    sbx_msg m;
    const msgpack_object *res;
    enum MHD_Result ret;
    if (!take_result(hr, &m, &res, &ret))
        return ret;
    sbx_buf_append(&hr->out, "retry: 1000\n\n", 13);
    http_sse_result(hr, res);
    sbx_wire_msg_free(&m);
    return http_sse_queue(hr);
}

static bool
wants_sse(struct MHD_Connection *c)
{
    const char *acc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    return acc && strstr(acc, "text/event-stream");
}

static enum MHD_Result
first_call(struct sbx_http *h, struct MHD_Connection *c, const char *url, const char *method,
           void **con_cls)
{
    atomic_fetch_add(&h->n_requests, 1);
    if (atomic_load(&h->stopping))
        return http_queue_error(c, 503, "SHARD_UNAVAILABLE", "the gateway is shutting down");
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    int port;
    char pid[SBX_ID_MAX + 2], ptok[72];
    if (host && preview_match(h, host, &port, pid, sizeof(pid), ptok, sizeof(ptok)))
        return preview_access(h, c, url, method, NULL, NULL, con_cls, host);

    /* MCP (mcp_http.c): the Host and Origin checks here, its own for the body. */
    if (mcp_match(url) && strcmp(method, "OPTIONS")) {
        const char *bad = http_browser_guard(h, c, "GET");
        if (bad)
            return queue_error(h, c, MHD_HTTP_FORBIDDEN, "PERMISSION_DENIED", bad);
        size_t none = 0;
        return mcp_access(h, c, method, NULL, &none, con_cls);
    }
    const char *refused = http_browser_guard(h, c, method);
    if (refused)
        return queue_error(h, c, MHD_HTTP_FORBIDDEN, "PERMISSION_DENIED", refused);
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        http_add_common_headers(r, h->keys != NULL);
        MHD_add_response_header(r, "Access-Control-Allow-Methods",
                                "GET, POST, PUT, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, Idempotency-Key, Last-Event-ID, "
                                "X-Sbx-Binary, X-Sbx-Client, X-Sbx-Retry, X-Sbx-Timeout-Ms, "
                                "Mcp-Session-Id, MCP-Protocol-Version");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (console_match(h, url))
        return console_access(h, c, url, method);

    struct hreq *hr = hreq_new(h, c);
    *con_cls = hr;
    int bad = 0;
    char allow[64];
    const struct route *rt = http_route_match(h, method, url, hr->params, hr->sandbox,
                                              sizeof(hr->sandbox), &bad, allow, sizeof(allow));
    if (rt == &http_method_mismatch) {
        /* RFC 9110 §15.5.6: 405 with the methods the path is served for. */
        char msg[256];
        snprintf(msg, sizeof(msg), "%s is not served for %s (allowed: %s; see /v1/openapi.json)",
                 method, url, allow);
        json_t *j = json_pack("{s:s,s:s,s:{},s:i}", "code", "ROUTE_NOT_FOUND", "message", msg,
                              "context", "httpStatus", 405);
        char *text = j ? json_dumps(j, JSON_COMPACT) : NULL;
        json_decref(j);
        if (!text)
            return MHD_NO;
        struct MHD_Response *r =
            MHD_create_response_from_buffer(strlen(text), text, MHD_RESPMEM_MUST_FREE);
        if (!r) {
            free(text);
            return MHD_NO;
        }
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Allow", allow);
        http_add_common_headers(r, h->keys != NULL);
        atomic_fetch_add(&h->n_errors, 1);
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_METHOD_NOT_ALLOWED, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!rt)
        return queue_err(hr, SBX_E_ROUTE_NOT_FOUND, "no route %s %s (see /v1/openapi.json)", method,
                         url);
    hr->rt = rt;
    if (rt->kind == R_HEALTH)
        return queue_json(h, c, MHD_HTTP_OK, json_pack("{s:b}", "ok", 1));
    if (rt->kind == R_OPENAPI)
        return queue_buf(h, c, MHD_HTTP_OK, "application/json",
                         sbx_xstrndup(h->openapi, h->openapi_len), h->openapi_len, false);
    if (h->keys && !http_request_key(h, c, rt->kind, hr->sandbox, hr->key))
        return queue_err(hr, SBX_E_UNAUTHORIZED,
                         "a valid API key is required: Authorization: Bearer <key> (in a URL "
                         "only ?access_token=<token> of POST …/url-token, for its sandbox and "
                         "purpose, for its ttlMs: 60 s by default)");
    if (bad)
        return queue_err(hr, SBX_E_VALIDATION,
                         bad == 2 ? "the path %s holds a malformed or NUL percent-escape, or "
                                    "a parameter that is not UTF-8"
                                  : "a path parameter of %s must be an integer",
                         url);
    if (hr->sandbox[0]) {
        char why[160];
        if (sbx_id_check(hr->sandbox, strlen(hr->sandbox), why, sizeof(why)) != 0)
            return queue_err(hr, SBX_E_VALIDATION, "%s", why);
    }
    if (rt->kind == R_URL_TOKEN) {
        const char *purpose = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "purpose");
        const char *ttl = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "ttlMs");
        long long ttl_ms = HTTP_URL_TOKEN_TTL_MS;
        if (ttl) {
            char *end = NULL;
            errno = 0;
            ttl_ms = strtoll(ttl, &end, 10);
            if (errno || !isdigit((unsigned char)ttl[0]) || *end ||
                ttl_ms < HTTP_URL_TOKEN_MIN_TTL_MS ||
                ttl_ms > HTTP_URL_TOKEN_TTL_MS)
                return queue_err(hr, SBX_E_VALIDATION,
                                 "?ttlMs= must be a whole number of ms from %d to %d",
                                 HTTP_URL_TOKEN_MIN_TTL_MS, HTTP_URL_TOKEN_TTL_MS);
        }
        json_t *j = http_url_token_mint(h, hr->sandbox, purpose, hr->key, ttl_ms);
        if (!j)
            return queue_err(hr, SBX_E_VALIDATION,
                             "?purpose= must be terminal, stream or file (the route the token "
                             "is for)");
        return queue_json(h, c, MHD_HTTP_OK, j);
    }
    if (rt->kind == R_TERMINAL) {
        *con_cls = NULL;
        char sb[SBX_ID_MAX + 2];
        snprintf(sb, sizeof(sb), "%s", hr->sandbox);
        hreq_free(hr);
        return terminal_access(h, c, sb, con_cls);
    }
    const char *len = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    if (len && strtoull(len, NULL, 10) > (unsigned long long)h->conf.max_body)
        return queue_err(hr, SBX_E_TOO_LARGE, "the body exceeds the %lld-byte limit",
                         (long long)h->conf.max_body);
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, http_query_arg, hr->query);
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    if (key) {
        if (!*key || strlen(key) > SBX_WIRE_MAX_ID)
            return queue_err(hr, SBX_E_VALIDATION, "Idempotency-Key must be 1-%d bytes",
                             SBX_WIRE_MAX_ID);
        snprintf(hr->rid, sizeof(hr->rid), "%s", key);
    }
    /* A retry after an attempt of unknown outcome (docs/http.md): passed on
     * as the envelope's `retry`. */
    const char *retry = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Sbx-Retry");
    if (retry) {
        if (strcmp(retry, "1") && strcmp(retry, "0"))
            return queue_err(hr, SBX_E_VALIDATION, "X-Sbx-Retry must be 1 or 0");
        hr->retry = !strcmp(retry, "1") && key;
    }
    hr->timeout_ms = h->conf.timeout;
    /* The caller's own deadline (docs/http.md): the gateway then answers
     * SHARD_UNAVAILABLE before the caller gives up, not 600 s later. */
    const char *tmo = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Sbx-Timeout-Ms");
    if (tmo) {
        char *end = NULL;
        errno = 0;
        long long v = strtoll(tmo, &end, 10);
        if (errno || end == tmo || *end || v < 1 ||
            v > SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS)
            return queue_err(hr, SBX_E_VALIDATION,
                             "X-Sbx-Timeout-Ms must be a whole number of ms from 1 to %lld",
                             SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS);
        hr->timeout_ms = v;
    }
    const char *bin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Sbx-Binary");
    hr->b64 = bin && !strcasecmp(bin, "base64");
    hr->sse = rt->kind == R_STREAM ||
              (rt->op && (rt->op->flags & SBX_OP_STREAM) && wants_sse(c));
    return MHD_YES;
}

static enum MHD_Result
access_cb(void *cls, struct MHD_Connection *c, const char *url, const char *method,
          const char *version, const char *upload_data, size_t *upload_data_size, void **con_cls)
{
    struct sbx_http *h = cls;
    (void)version;
    if (!*con_cls)
        return first_call(h, c, url, method, con_cls);
    int kind = *(int *)*con_cls;
    if (kind == HS_PREVIEW)
        return preview_access(h, c, url, method, upload_data, upload_data_size, con_cls, NULL);
    if (kind == HS_TERMINAL) {
        *upload_data_size = 0;
        return terminal_access(h, c, NULL, con_cls);
    }
    if (kind == HS_MCP)
        return mcp_access(h, c, method, upload_data, upload_data_size, con_cls);
    struct hreq *hr = *con_cls;
    if (*upload_data_size) {
        if (hr->body.len + *upload_data_size > (size_t)h->conf.max_body)
            hr->too_large = true;
        else
            sbx_buf_append(&hr->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    switch (hr->phase) {
    case PH_BODY:
        if (hr->too_large)
            return queue_err(hr, SBX_E_TOO_LARGE, "the body exceeds the %lld-byte limit",
                             (long long)h->conf.max_body);
        if (atomic_load(&h->stopping))
            return queue_err(hr, SBX_E_SHARD_UNAVAILABLE, "the gateway is shutting down");
        if (hr->rt->kind == R_STREAM) {
            const char *sid = json_string_value(json_object_get(hr->params, "streamId"));
            snprintf(hr->stream_id, sizeof(hr->stream_id), "%s", sid ? sid : "");
            const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
            const char *after = json_string_value(json_object_get(hr->query, "after"));
            const char *v = last ? last : after ? after : json_string_value(json_object_get(
                                                              hr->query, "lastEventId"));
            hr->after = v ? strtoull(v, NULL, 10) : 0;
            int rc = http_sse_read_start(hr);
            if (rc)
                return queue_err(hr, rc, "could not read the stream");
            hr->phase = PH_READ1;
            return MHD_YES;
        }
        if (hr->rt->kind == R_FILE_GET) {
            json_object_set_new(hr->params, "encoding", json_string("base64"));
            return start_op(hr, "file.read");
        }
        if (hr->rt->kind == R_METRICS)
            return start_op(hr, "metrics");
        if (hr->rt->kind == R_FILE_PUT) {
            if (hr->body.len > RAW_PUT_MAX)
                return queue_err(hr, SBX_E_TOO_LARGE,
                                 "a raw file upload is at most %u bytes (it travels base64 in "
                                 "one request); write larger files in parts with file.write "
                                 "append",
                                 RAW_PUT_MAX);
            size_t n;
            char *b64 = sbx_base64_encode(hr->body.p ? hr->body.p : "", hr->body.len, &n);
            json_object_set_new(hr->params, "content", json_stringn(b64, n));
            json_object_set_new(hr->params, "encoding", json_string("base64"));
            free(b64);
            hr->body.len = 0;
            return start_op(hr, "file.write");
        }
        return start_op(hr, hr->rt->op->name);
    case PH_CALL:
        return finish_op(hr);
    case PH_READ1:
        return finish_read1(hr);
    default:
        return MHD_YES;
    }
}

static void
completed_cb(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode t)
{
    (void)cls;
    (void)c;
    (void)t;
    if (!*con_cls)
        return;
    int kind = *(int *)*con_cls;
    if (kind == HS_PREVIEW)
        preview_completed(*con_cls);
    else if (kind == HS_TERMINAL)
        terminal_completed(*con_cls);
    else if (kind == HS_MCP)
        mcp_completed(*con_cls);
    else
        hreq_free(*con_cls);
    *con_cls = NULL;
}

/* ------------------------------------------------------------------------------ */
/* Worker threads (preview, terminal) register so sbx_http_stop waits for them. */

void
http_worker_enter(struct sbx_http *h)
{
    pthread_mutex_lock(&h->mu);
    h->workers++;
    pthread_mutex_unlock(&h->mu);
}

void
http_worker_leave(struct sbx_http *h)
{
    pthread_mutex_lock(&h->mu);
    h->workers--;
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
}

/* ------------------------------------------------------------------------------ */
/* Start and stop. */

static int
parse_listen(const char *s, struct sockaddr_storage *ss, socklen_t *sl)
{
    char host[128];
    const char *colon = strrchr(s, ':');
    if (!colon || colon == s)
        return -EINVAL;
    size_t hl = (size_t)(colon - s);
    if (hl >= sizeof(host))
        return -EINVAL;
    memcpy(host, s, hl);
    host[hl] = 0;
    char *end;
    long port = strtol(colon + 1, &end, 10);
    if (*end || port < 0 || port > 65535)
        return -EINVAL;
    memset(ss, 0, sizeof(*ss));
    if (host[0] == '[' && host[hl - 1] == ']') {
        host[hl - 1] = 0;
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
        a->sin6_family = AF_INET6;
        a->sin6_port = htons((uint16_t)port);
        if (inet_pton(AF_INET6, host + 1, &a->sin6_addr) != 1)
            return -EINVAL;
        *sl = sizeof(*a);
        return 0;
    }
    struct sockaddr_in *a = (struct sockaddr_in *)ss;
    a->sin_family = AF_INET;
    a->sin_port = htons((uint16_t)port);
    if (!strcmp(host, "localhost"))
        snprintf(host, sizeof(host), "127.0.0.1");
    if (inet_pton(AF_INET, host, &a->sin_addr) != 1)
        return -EINVAL;
    *sl = sizeof(*a);
    return 0;
}

static void
http_free(struct sbx_http *h)
{
    if (h->keys) {
        for (char **k = h->keys; *k; k++) {
            memset(*k, 0, strlen(*k));
            free(*k);
        }
        free(h->keys);
    }
    http_routes_free(h);
    mcp_front_free(h);
    free(h->openapi);
    free(h->listen);
    free(h->upstream);
    free(h->preview_domain);
    free(h->relay_secret);
    free(h->system_key);
    pthread_mutex_destroy(&h->mu);
    pthread_rwlock_destroy(&h->req_lk);
    pthread_cond_destroy(&h->cv);
    free(h);
}

int
sbx_http_start(sbx_http **out, const struct sbx_http_conf *conf, sbx_err_t *err)
{
    struct sbx_http *h = sbx_xcalloc(1, sizeof(*h));
    int rc = 0;
    pthread_mutex_init(&h->mu, NULL);
    pthread_rwlock_init(&h->req_lk, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->conf = *conf;
    h->listen = sbx_xstrdup(conf->listen);
    h->upstream = sbx_xstrdup(conf->upstream);
    h->preview_domain = conf->preview_domain && *conf->preview_domain
                            ? sbx_xstrdup(conf->preview_domain)
                            : NULL;
    h->relay_secret = conf->relay_secret ? sbx_xstrdup(conf->relay_secret) : NULL;
    h->system_key = conf->system_key ? sbx_xstrdup(conf->system_key) : NULL;
    if (h->conf.max_body <= 0)
        h->conf.max_body = DEFAULT_MAX_BODY;
    if (h->conf.timeout <= 0)
        h->conf.timeout = DEFAULT_TIMEOUT_MS;

    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_listen(h->listen, &ss, &sl) != 0) {
        rc = sbx_err_make(err, SBX_E_VALIDATION,
                          "cannot parse the HTTP address '%s' (want host:port)", h->listen);
        goto fail;
    }
    if (conf->api_keys && *conf->api_keys && (rc = http_load_keys(h, conf->api_keys, err)))
        goto fail;
    http_url_key_init(h);
    if (!h->keys && !http_is_loopback(&ss)) {
        rc = sbx_err_make(err, -EPERM,
                          "refusing to serve HTTP on %s without API keys: give --api-keys FILE, "
                          "or listen on a loopback address",
                          h->listen);
        goto fail;
    }
    if ((rc = http_routes_build(h)) != 0) {
        sbx_err_make(err, rc, "the table of operations declares a malformed HTTP alias");
        goto fail;
    }
    /* The document generated from runtime/ops.yaml (gateway/openapi_gen.h). */
    h->openapi = sbx_xstrndup(sbx_openapi_json, sbx_openapi_json_len);
    h->openapi_len = sbx_openapi_json_len;
    if ((rc = mcp_front_new(h)) != 0) {
        sbx_err_make(err, rc, "cannot build the MCP tool list from the OpenAPI document");
        goto fail;
    }
    if ((rc = sbx_nng_req_dial(&h->req, h->upstream, NULL, err)) != 0) {
        sbx_err_prefix(err, "cannot reach the gateway at %s", h->upstream);
        goto fail;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_EPOLL_LINUX_ONLY |
                     MHD_ALLOW_SUSPEND_RESUME | MHD_ALLOW_UPGRADE | MHD_USE_ERROR_LOG;
    if (ss.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    h->d = MHD_start_daemon(flags, 0, NULL, NULL, access_cb, h, MHD_OPTION_SOCK_ADDR,
                            (struct sockaddr *)&ss, MHD_OPTION_NOTIFY_COMPLETED, completed_cb, h,
                            MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120,
                            MHD_OPTION_CONNECTION_LIMIT, (unsigned)4096,
                            MHD_OPTION_PER_IP_CONNECTION_LIMIT,
                            (unsigned)(h->conf.per_client > 0 ? h->conf.per_client : 1024),
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2,
                            MHD_OPTION_UNESCAPE_CALLBACK, http_unescape_none, NULL, MHD_OPTION_END);
    if (!h->d) {
        nng_close(h->req);
        rc = sbx_err_make(err, -EADDRINUSE, "cannot listen for HTTP on %s", h->listen);
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(h->d, MHD_DAEMON_INFO_BIND_PORT);
    h->port = di ? di->port : 0;
    *out = h;
    return 0;
fail:
    http_free(h);
    return rc;
}

void
sbx_http_counters(const sbx_http *h, uint64_t *requests, uint64_t *errors)
{
    *requests = atomic_load(&((sbx_http *)h)->n_requests);
    *errors = atomic_load(&((sbx_http *)h)->n_errors);
}

int
sbx_http_port(const sbx_http *h)
{
    return h->port;
}

void
sbx_http_stop(sbx_http *h)
{
    if (!h)
        return;
    atomic_store(&h->stopping, true);
    MHD_quiesce_daemon(h->d);
    /* Closing the socket fails every call in flight: each completion resumes
     * its connection, so none is suspended when the daemon stops. */
    pthread_rwlock_wrlock(&h->req_lk);
    nng_close(h->req);
    h->req_closed = true;
    pthread_rwlock_unlock(&h->req_lk);
    preview_cancel_all(h);
    terminal_cancel_all(h);
    pthread_mutex_lock(&h->mu);
    for (int i = 0; i < 100 && h->workers > 0; i++) {
        sbx_cond_wait_ms(&h->cv, &h->mu, 50);
    }
    pthread_mutex_unlock(&h->mu);
    usleep(50 * 1000);
    MHD_stop_daemon(h->d);
    http_free(h);
}
