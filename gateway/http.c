/* http.c — see http.h and docs/http.md.
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
#include "http_int.h"
#include "openapi_gen.h"

#define DEFAULT_MAX_BODY (32 << 20)
#define DEFAULT_TIMEOUT_MS 600000
#define SSE_WAIT_MS 15000           /* long-poll length = heartbeat period */
#define SSE_READ_BYTES (1 << 20)
#define RAW_PUT_MAX (29u << 20)       /* base64 of it fits SBX_WIRE_MAX_REQUEST */
#define MAX_SEGS 12
#define CALL_ERROR_REPLY 1           /* call_take: the reply is an error reply (in *m) */

/* ------------------------------------------------------------------------------ */
/* Routes. */

enum route_kind {
    R_OP = 1,     /* an operation of the table (canonical route or alias) */
    R_HEALTH,
    R_OPENAPI,
    R_STREAM,     /* GET …/streams/{streamId}: SSE */
    R_FILE_GET,   /* GET …/files/{path*}: raw bytes */
    R_FILE_PUT,   /* PUT …/files/{path*} */
    R_TERMINAL,   /* GET …/terminal: WebSocket */
};

struct route {
    const char *method;
    int kind;
    const struct sbx_op_def *op;
    int nseg;
    char *seg[MAX_SEGS]; /* literal, or "{name}", "{name:int}", "{name*}" (rest) */
    char *path;          /* the template as written (OpenAPI key) */
    bool canonical;
};

static int
route_add(struct sbx_http *h, const char *method, const char *path, int kind,
          const struct sbx_op_def *op, bool canonical)
{
    h->routes = sbx_xrealloc(h->routes, (h->nroutes + 1) * sizeof(*h->routes));
    struct route *r = &h->routes[h->nroutes];
    memset(r, 0, sizeof(*r));
    r->method = method;
    r->kind = kind;
    r->op = op;
    r->canonical = canonical;
    r->path = sbx_xstrdup(path);
    char *copy = sbx_xstrdup(path), *save = NULL;
    for (char *s = strtok_r(copy, "/", &save); s; s = strtok_r(NULL, "/", &save)) {
        if (r->nseg == MAX_SEGS) {
            free(copy);
            return -EINVAL;
        }
        r->seg[r->nseg++] = sbx_xstrdup(s);
    }
    free(copy);
    h->nroutes++;
    return 0;
}

static void
routes_free(struct sbx_http *h)
{
    for (size_t i = 0; i < h->nroutes; i++) {
        for (int j = 0; j < h->routes[i].nseg; j++)
            free(h->routes[i].seg[j]);
        free(h->routes[i].path);
    }
    free(h->routes);
}

/* Build the route list: own routes first, then every op's canonical route
 * and its aliases. */
static int
routes_build(struct sbx_http *h)
{
    int rc = 0;
    rc |= route_add(h, "GET", "/v1/health", R_HEALTH, NULL, false);
    rc |= route_add(h, "GET", "/v1/openapi.json", R_OPENAPI, NULL, false);
    rc |= route_add(h, "GET", "/v1/sandboxes/{sandbox}/streams/{streamId}", R_STREAM, NULL, false);
    rc |= route_add(h, "GET", "/v1/sandboxes/{sandbox}/files/{path*}", R_FILE_GET, NULL, false);
    rc |= route_add(h, "PUT", "/v1/sandboxes/{sandbox}/files/{path*}", R_FILE_PUT, NULL, false);
    rc |= route_add(h, "GET", "/v1/sandboxes/{sandbox}/terminal", R_TERMINAL, NULL, false);
    for (const struct sbx_op_def *d = sbx_ops; d->name; d++) {
        char path[160];
        /* Shard-to-shard operations and the front's own helpers are not
         * routes (nor in /v1/openapi.json, which lists the routes). */
        if (d->flags & (SBX_OP_INTERNAL | SBX_OP_FRONT))
            continue;
        if (d->flags & SBX_OP_GLOBAL)
            snprintf(path, sizeof(path), "/v1/%s", d->name);
        else
            snprintf(path, sizeof(path), "/v1/sandboxes/{sandbox}/%s", d->name);
        rc |= route_add(h, "POST", path, R_OP, d, true);
        if (!d->http)
            continue;
        char *aliases = sbx_xstrdup(d->http), *save = NULL;
        for (char *a = strtok_r(aliases, "|", &save); a; a = strtok_r(NULL, "|", &save)) {
            char *sp = strchr(a, ' ');
            if (!sp) {
                rc = -EINVAL;
                continue;
            }
            *sp = 0;
            const char *m = !strcmp(a, "GET")      ? "GET"
                            : !strcmp(a, "PUT")    ? "PUT"
                            : !strcmp(a, "DELETE") ? "DELETE"
                            : !strcmp(a, "POST")   ? "POST"
                                                   : NULL;
            if (!m) {
                rc = -EINVAL;
                continue;
            }
            rc |= route_add(h, m, sp + 1, R_OP, d, false);
        }
        free(aliases);
    }
    return rc ? -EINVAL : 0;
}

static int
hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decode s in place (RFC 3986 §2.1); with plus, '+' is a space
 * (query strings, HTML form encoding).  Returns false on a malformed escape
 * (anything but '%' and two hex digits) or a decoded NUL. */
bool
http_pct_decode(char *s, bool plus)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '%') {
            int hi = hex_digit(r[1]);
            int lo = hi >= 0 ? hex_digit(r[2]) : -1; /* r[2] exists: r[1] is not NUL */
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return false;
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = plus && *r == '+' ? ' ' : *r;
        }
    }
    *w = 0;
    return true;
}

/* MHD's unescaper: none.  URLs reach the handler as sent, so a preview URL
 * is forwarded byte for byte and API paths are split before decoding (an
 * encoded '/' stays inside its segment). */
static size_t
unescape_none(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

/* Match method + path; fill params (a JSON object of path arguments) and
 * the sandbox ID.  Returns the route, NULL (no path matches: 404), or
 * &method_mismatch when the path exists with other methods (405).
 * *bad_param: 1 an {int} parameter is not one, 2 a malformed escape, an
 * escaped NUL, or a parameter that is not UTF-8 (JSON cannot carry it, and
 * a dropped path parameter would let a body or query argument of the same
 * name stand in for it). */
static const struct route method_mismatch;

/* route_match also fills allow[] ("GET, POST", for a 405's Allow header)
 * with the methods the path is served for.  HEAD matches a GET route
 * (RFC 9110 §9.3.2: the same answer without its body; MHD drops it). */
static const struct route *
route_match(struct sbx_http *h, const char *method, const char *url, json_t *params,
            char *sandbox, size_t sblen, int *bad_param, char *allow, size_t allowlen)
{
    *bad_param = 0;
    allow[0] = '\0';
    if (!strcmp(method, "HEAD"))
        method = "GET";
    char *copy = sbx_xstrdup(url), *save = NULL;
    char *segs[MAX_SEGS + 1];
    int n = 0;
    char *rest_at[MAX_SEGS + 1];
    for (char *s = strtok_r(copy, "/", &save); s && n <= MAX_SEGS; s = strtok_r(NULL, "/", &save)) {
        rest_at[n] = (char *)url + (s - copy);
        segs[n++] = s;
    }
    for (int i = 0; i < n; i++)
        if (!http_pct_decode(segs[i], false))
            *bad_param = 2;
    const struct route *found = NULL;
    bool path_exists = false;
    for (size_t i = 0; i < h->nroutes && !found; i++) {
        const struct route *r = &h->routes[i];
        bool rest = r->nseg > 0 && strstr(r->seg[r->nseg - 1], "*}") != NULL;
        if (rest ? n < r->nseg : n != r->nseg)
            continue;
        bool ok = true;
        for (int j = 0; j < r->nseg && ok; j++)
            if (r->seg[j][0] != '{' && strcmp(r->seg[j], segs[j]))
                ok = false;
        if (!ok)
            continue;
        path_exists = true;
        if (strcmp(r->method, method)) {
            if (!strstr(allow, r->method)) {
                size_t al = strlen(allow);
                snprintf(allow + al, allowlen - al, "%s%s", al ? ", " : "", r->method);
            }
            continue;
        }
        found = r;
        for (int j = 0; j < r->nseg; j++) {
            if (r->seg[j][0] != '{')
                continue;
            char name[64];
            snprintf(name, sizeof(name), "%s", r->seg[j] + 1);
            char *end = strchr(name, '}');
            if (end)
                *end = 0;
            char *colon = strchr(name, ':');
            char *star = strchr(name, '*');
            if (star) {
                *star = 0;
                /* The rest of the URL, slashes included, as an absolute path
                 * (whole: the agent judges its length). */
                char *path = sbx_xmalloc(strlen(rest_at[j]) + 2);
                path[0] = '/';
                strcpy(path + 1, rest_at[j]);
                json_t *v = http_pct_decode(path, false) ? json_string(path) : NULL;
                if (!v)
                    *bad_param = 2;
                json_object_set_new(params, name, v);
                free(path);
                break;
            }
            if (colon) {
                *colon = 0;
                char *e;
                errno = 0;
                long long v = strtoll(segs[j], &e, 10);
                if ((*e || errno) && !*bad_param)
                    *bad_param = 1; /* a malformed escape (2) is the first thing to say */
                json_object_set_new(params, name, json_integer(v));
            } else if (!strcmp(name, "sandbox")) {
                snprintf(sandbox, sblen, "%s", segs[j]);
            } else {
                json_t *v = json_string(segs[j]);
                if (!v)
                    *bad_param = 2;
                json_object_set_new(params, name, v);
            }
        }
    }
    free(copy);
    if (!found && path_exists)
        return &method_mismatch;
    return found;
}

/* ------------------------------------------------------------------------------ */
/* Requests. */

enum { PH_BODY = 0, PH_CALL, PH_READ1, PH_STREAMING };
enum { C_IDLE = 0, C_SEND, C_RECV, C_DONE };

struct hreq {
    int kind; /* HS_API */
    struct sbx_http *h;
    struct MHD_Connection *c;
    const struct route *rt;
    char sandbox[SBX_ID_MAX + 2];
    json_t *params;       /* path arguments (and ones the front adds): they win */
    json_t *query;        /* query arguments: the body wins over them */
    sbx_buf body;
    bool too_large;
    bool sse;
    bool b64;             /* X-Sbx-Binary: base64 — bytes as base64, not UTF-8 text */
    char rid[SBX_WIRE_MAX_ID + 1];
    int64_t timeout_ms;
    int phase;
    /* the call in flight */
    pthread_mutex_t mu;
    bool suspended;
    bool ctx_open;
    nng_ctx ctx;
    nng_aio *aio;
    int cstate;
    nng_msg *reply;
    int rv;
    /* SSE */
    char stream_id[128];
    uint64_t after;
    bool done;
    sbx_buf out;
    size_t out_off;
    char carry[2][4];
    size_t ncarry[2];
};

static void call_cb(void *arg);

static struct hreq *
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

static void
hreq_free(struct hreq *hr)
{
    if (hr->aio) {
        nng_aio_stop(hr->aio);
        nng_aio_free(hr->aio);
    }
    if (hr->ctx_open)
        nng_ctx_close(hr->ctx);
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
envelope(const char *op, const char *sandbox, const char *args, size_t alen, int64_t timeout,
         const char *rid, char **out, size_t *outlen)
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
static int
call_start(struct hreq *hr, const char *op, const char *args, size_t alen, int64_t timeout,
           const char *rid)
{
    struct sbx_http *h = hr->h;
    char *buf;
    size_t len;
    int rc = envelope(op, hr->sandbox, args, alen, timeout, rid, &buf, &len);
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
        if (nng_ctx_open(&hr->ctx, h->req) != 0) {
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
static int
call_take(struct hreq *hr, sbx_msg *m, const msgpack_object **result, char code[64], char *msg,
          size_t msglen)
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
/* Responses. */

/*
 * CORS (WHATWG Fetch): with API keys, any origin may call with a bearer
 * token (no cookies are involved, so a page learns nothing it could not
 * with the key).  Without keys the front answers no CORS at all — browsers
 * then keep responses from cross-origin pages — and first_call refuses
 * cross-origin requests outright (see browser_guard).  `cors` is h->keys
 * != NULL.
 */
static void
add_common_headers(struct MHD_Response *r, bool cors)
{
    if (!cors)
        return;
    MHD_add_response_header(r, "Access-Control-Allow-Origin", "*");
    MHD_add_response_header(r, "Access-Control-Expose-Headers",
                            "Content-Type, Last-Event-ID, X-Sbx-Stream-Id");
}

/* Queue a response owning buf (freed either way).  h: whose CORS policy
 * applies (NULL: no CORS headers, for answers not meant for scripts). */
static enum MHD_Result
queue_buf(struct sbx_http *h, struct MHD_Connection *c, int status, const char *ctype, char *buf,
          size_t len)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, buf, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(buf);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", ctype);
    MHD_add_response_header(r, "Cache-Control", "no-store");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"sbx\"");
    /* RFC 9110 §10.2.3: when to try again after a 503 (the container is
     * starting, a shard is failing over, the interpreter is not ready). */
    if (status == MHD_HTTP_SERVICE_UNAVAILABLE)
        MHD_add_response_header(r, "Retry-After", "1");
    add_common_headers(r, h && h->keys);
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
    return queue_buf(h, c, status, "application/json", text, n + 1);
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
/* Server-Sent Events (WHATWG HTML §9.2). */


/* Whether an event's type can be its SSE event name: a field value ends at
 * CR or LF (WHATWG HTML §9.2.6), so anything else could add lines (an `id:`
 * that moves the client's Last-Event-ID, whole events). */
static bool
sse_name_ok(sbx_str t)
{
    if (t.n == 0 || t.n > 64)
        return false;
    for (size_t i = 0; i < t.n; i++) {
        char c = t.p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

static void
sse_event(struct hreq *hr, const msgpack_object *ev)
{
    if (ev->type != MSGPACK_OBJECT_MAP)
        return; /* an event is a map (clients read its data as an object) */
    json_t *j = sbx_json_from_msgpack(ev);
    if (!j)
        return;
    int64_t seq = 0;
    sbx_wire_get_i64(ev, "seq", &seq);
    sbx_str type = SBX_STR("message"), data;
    sbx_wire_get_str(ev, "type", &type);
    if (!sse_name_ok(type))
        type = SBX_STR("message"); /* the data's JSON still has it */
    int which = sbx_str_eq(type, "stdout") || sbx_str_eq(type, "output") ? 0
                : sbx_str_eq(type, "stderr")                            ? 1
                                                                        : -1;
    if (which >= 0 && hr->b64 && sbx_wire_get_bin(ev, "data", &data) == 0) {
        size_t l;
        char *enc = sbx_base64_encode(data.p, data.n, &l);
        json_object_set_new(j, "data", json_stringn(enc, l));
        json_object_set_new(j, "encoding", json_string("base64"));
        free(enc);
    } else if (which >= 0 && sbx_wire_get_bin(ev, "data", &data) == 0) {
        /* Output bytes become a JSON string: keep a UTF-8 sequence that an
         * event boundary split whole for the next event. */
        sbx_buf b;
        sbx_buf_init(&b);
        sbx_buf_append(&b, hr->carry[which], hr->ncarry[which]);
        sbx_buf_append(&b, data.p, data.n);
        size_t keep = sbx_utf8_complete_prefix(b.p, b.len);
        hr->ncarry[which] = b.len - keep;
        memcpy(hr->carry[which], b.p + keep, hr->ncarry[which]);
        size_t sl;
        char *s = sbx_utf8_sanitize(b.p, keep, &sl);
        json_object_set_new(j, "data", json_stringn(s, sl));
        free(s);
        sbx_buf_free(&b);
    }
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return;
    sbx_buf_appendf(&hr->out, "id: %lld\nevent: %.*s\ndata: %s\n\n", (long long)seq,
                    (int)type.n, type.p, text);
    free(text);
    if (seq > 0)
        hr->after = (uint64_t)seq;
}

/* Append a stream.read result to the SSE buffer. */
static void
sse_result(struct hreq *hr, const msgpack_object *res)
{
    const msgpack_object *evs = NULL;
    bool done = false;
    int64_t missed = 0;
    sbx_wire_get_bool(res, "done", &done);
    if (sbx_wire_get_i64(res, "missed", &missed) == 0 && missed > 0)
        sbx_buf_appendf(&hr->out, "event: gap\ndata: {\"type\":\"gap\",\"missed\":%lld}\n\n",
                        (long long)missed);
    if (sbx_wire_get_array(res, "events", &evs) == 0)
        for (uint32_t i = 0; i < evs->via.array.size; i++)
            sse_event(hr, &evs->via.array.ptr[i]);
    if ((!evs || evs->via.array.size == 0) && !done)
        sbx_buf_append(&hr->out, ": ping\n\n", 8);
    int64_t next = 0;
    if (sbx_wire_get_i64(res, "next", &next) == 0 && next > 0 && (uint64_t)next > hr->after)
        hr->after = (uint64_t)next;
    if (done)
        hr->done = true;
}

static void
sse_error(struct hreq *hr, const char *code, const char *msg)
{
    json_t *j = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "code", code, "message",
                          msg);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    sbx_buf_appendf(&hr->out, "event: error\ndata: %s\n\n", text ? text : "{}");
    free(text);
    hr->done = true;
}

static int
read_start(struct hreq *hr)
{
    sbx_enc e;
    char *args;
    size_t alen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "streamId", hr->stream_id);
    sbx_enc_kint(&e, "after", (int64_t)hr->after);
    sbx_enc_kint(&e, "waitMs", SSE_WAIT_MS);
    sbx_enc_kint(&e, "maxBytes", SSE_READ_BYTES);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &args, &alen) != 0)
        return SBX_E_INTERNAL;
    /* Reads are retried with the same `after` by design; a fresh id each. */
    int rc = call_start(hr, "stream.read", args, alen, SSE_WAIT_MS + 10000, NULL);
    free(args);
    return rc;
}

/* Consume the finished stream.read into the buffer (or an error event). */
static void
read_take(struct hreq *hr)
{
    sbx_msg m;
    const msgpack_object *res;
    char code[64], msg[256];
    int rc = call_take(hr, &m, &res, code, msg, sizeof(msg));
    if (rc == CALL_ERROR_REPLY) {
        const msgpack_object *eo = NULL;
        sbx_str c = SBX_STR("INTERNAL_ERROR"), t = SBX_STR("");
        if (sbx_wire_get_map(m.root, "error", &eo) == 0) {
            sbx_wire_get_str(eo, "code", &c);
            sbx_wire_get_str(eo, "message", &t);
        }
        snprintf(code, sizeof(code), "%.*s", (int)c.n, c.p);
        snprintf(msg, sizeof(msg), "%.*s", (int)t.n, t.p);
        sbx_wire_msg_free(&m);
        sse_error(hr, code, msg);
        return;
    }
    if (rc) {
        sse_error(hr, code, msg);
        return;
    }
    sse_result(hr, res);
    sbx_wire_msg_free(&m);
}

static ssize_t
sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct hreq *hr = cls;
    (void)pos;
    if (hr->cstate == C_DONE)
        read_take(hr);
    if (hr->out_off < hr->out.len) {
        size_t n = SBX_MIN(max, hr->out.len - hr->out_off);
        memcpy(buf, hr->out.p + hr->out_off, n);
        hr->out_off += n;
        if (hr->out_off == hr->out.len) {
            hr->out.len = 0;
            hr->out_off = 0;
        }
        return (ssize_t)n;
    }
    if (hr->done || atomic_load(&hr->h->stopping))
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (read_start(hr) != 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    return 0;
}

static enum MHD_Result
queue_sse(struct hreq *hr)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, sse_reader, hr, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    MHD_add_response_header(r, "X-Sbx-Stream-Id", hr->stream_id);
    add_common_headers(r, hr->h->keys != NULL);
    hr->phase = PH_STREAMING;
    enum MHD_Result ret = MHD_queue_response(hr->c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* ------------------------------------------------------------------------------ */
/* The access handler. */

static bool
is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* Constant-time comparison of a presented key with each configured key. */
static bool
key_ok(struct sbx_http *h, const char *presented)
{
    if (!h->keys)
        return true;
    if (!presented)
        return false;
    size_t pn = strlen(presented);
    bool ok = false;
    for (char **k = h->keys; *k; k++) {
        size_t kn = strlen(*k);
        unsigned char diff = (unsigned char)(kn != pn);
        for (size_t i = 0; i < kn; i++)
            diff |= (unsigned char)((*k)[i] ^ (i < pn ? presented[i] : 0));
        ok |= diff == 0;
    }
    return ok;
}

/*
 * Whether host[0..n) (a Host header's name, or an Origin's host, without
 * the port) names this machine's loopback: "localhost", an IPv4 address in
 * 127.0.0.0/8, or "[::1]".  A subdomain of localhost is not: preview URLs
 * live there, and their pages are tenant content.
 */
static bool
loopback_name(const char *host, size_t n)
{
    if (n == 9 && !strncasecmp(host, "localhost", 9))
        return true;
    if (n == 5 && !strncmp(host, "[::1]", 5))
        return true;
    char buf[16];
    if (n < 9 || n >= sizeof(buf))
        return false;
    memcpy(buf, host, n);
    buf[n] = '\0';
    struct in_addr a;
    return inet_pton(AF_INET, buf, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* The name part of "name[:port]" ("[v6]:port" keeps its brackets). */
static size_t
host_name_len(const char *hp)
{
    if (hp[0] == '[') {
        const char *e = strchr(hp, ']');
        return e ? (size_t)(e - hp) + 1 : strlen(hp);
    }
    const char *colon = strchr(hp, ':');
    return colon ? (size_t)(colon - hp) : strlen(hp);
}

/*
 * browser_guard — without API keys the front trusts whoever reaches its
 * loopback socket, and a browser on this machine reaches it for any page it
 * shows.  So, keyless only: a request whose Host is not a loopback name is
 * refused (DNS rebinding: a page of evil.example re-resolved to 127.0.0.1
 * still sends Host: evil.example), and so is one whose Origin is not a
 * loopback origin (a cross-site form or fetch; a preview page on
 * *.localhost is tenant code and counts as cross-site).  Clients that are
 * not browsers send no Origin.  Returns NULL, or why the request is refused.
 */
static const char *
browser_guard(struct sbx_http *h, struct MHD_Connection *c)
{
    if (h->keys)
        return NULL;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (host && !loopback_name(host, host_name_len(host)))
        return "without API keys the HTTP front answers only requests addressed to a loopback "
               "name (localhost, 127.0.0.1, [::1]); configure --api-keys to serve others";
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (!origin)
        return NULL;
    const char *hp = !strncmp(origin, "http://", 7)    ? origin + 7
                     : !strncmp(origin, "https://", 8) ? origin + 8
                                                       : NULL;
    if (!hp || !loopback_name(hp, host_name_len(hp)))
        return "without API keys the HTTP front refuses cross-origin requests from browsers; "
               "configure --api-keys to call it from a web page";
    return NULL;
}

static bool
authorized(struct sbx_http *h, struct MHD_Connection *c)
{
    if (!h->keys)
        return true;
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    if (auth && !strncasecmp(auth, "Bearer ", 7))
        return key_ok(h, auth + 7);
    return key_ok(h, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token"));
}

static bool
json_utf8_ok(const char *v)
{
    json_t *j = json_string(v);
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

static enum MHD_Result
query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    json_t *params = cls;
    (void)kind;
    char *k = sbx_xstrdup(key), *v = sbx_xstrdup(value ? value : "");
    if (http_pct_decode(k, true) && http_pct_decode(v, true) && strcmp(k, "access_token") &&
        !json_object_get(params, k) && json_utf8_ok(v))
        json_object_set_new(params, k, json_string(v));
    free(k);
    free(v);
    return MHD_YES;
}

/* The op's arguments: query arguments, then the JSON body object over them,
 * then path arguments over both (the route the client chose). */
static int
build_args(struct hreq *hr, char **args, size_t *alen, char *why, size_t whylen)
{
    json_t *obj;
    if (hr->body.len) {
        json_error_t je;
        obj = json_loadb(hr->body.p, hr->body.len, JSON_REJECT_DUPLICATES, &je);
        if (!obj) {
            snprintf(why, whylen, "the body is not valid JSON: %s (line %d, column %d)", je.text,
                     je.line, je.column);
            return SBX_E_MALFORMED;
        }
        if (!json_is_object(obj)) {
            json_decref(obj);
            snprintf(why, whylen, "the body must be a JSON object of the operation's arguments");
            return SBX_E_MALFORMED;
        }
    } else {
        obj = json_object();
    }
    json_object_update_missing(obj, hr->query);
    json_object_update(obj, hr->params);
    sbx_enc e;
    sbx_enc_init(&e);
    int rc = sbx_json_to_msgpack(obj, &e);
    /* A command's own timeout extends the request's deadline (capped: the
     * gateway refuses a timeout past SBX_WIRE_MAX_DURATION_MS anyway, and
     * the sum must not overflow). */
    json_t *t = json_object_get(obj, "timeout");
    if (json_is_integer(t) && json_integer_value(t) > 0)
        hr->timeout_ms = SBX_MAX(
            hr->timeout_ms, SBX_MIN(json_integer_value(t), SBX_WIRE_MAX_DURATION_MS) + 30000);
    json_decref(obj);
    if (rc) {
        sbx_enc_free(&e);
        snprintf(why, whylen, "the body holds a value the protocol cannot carry");
        return rc;
    }
    if (sbx_enc_finish(&e, args, alen) != 0) {
        snprintf(why, whylen, "cannot encode the arguments");
        return SBX_E_INTERNAL;
    }
    return 0;
}

static enum MHD_Result
start_op(struct hreq *hr, const char *op)
{
    char *args = NULL, why[256];
    size_t alen = 0;
    int rc = build_args(hr, &args, &alen, why, sizeof(why));
    if (rc)
        return queue_err(hr, rc, "%s", why);
    rc = call_start(hr, op, args, alen, hr->timeout_ms, hr->rid);
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
    int rc = call_take(hr, m, res, code, msg, sizeof(msg));
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
        return queue_buf(hr->h, hr->c, MHD_HTTP_OK, ctype, raw, rawlen);
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
        int rc = read_start(hr);
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
    sse_result(hr, res);
    sbx_wire_msg_free(&m);
    return queue_sse(hr);
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

    const char *refused = browser_guard(h, c);
    if (refused)
        return queue_error(h, c, MHD_HTTP_FORBIDDEN, "PERMISSION_DENIED", refused);
    if (!strcmp(method, "OPTIONS")) {
        struct MHD_Response *r = MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT);
        add_common_headers(r, h->keys != NULL);
        MHD_add_response_header(r, "Access-Control-Allow-Methods",
                                "GET, POST, PUT, DELETE, OPTIONS");
        MHD_add_response_header(r, "Access-Control-Allow-Headers",
                                "Authorization, Content-Type, Idempotency-Key, Last-Event-ID, "
                                "X-Sbx-Binary, X-Sbx-Timeout-Ms");
        MHD_add_response_header(r, "Access-Control-Max-Age", "600");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
        MHD_destroy_response(r);
        return ret;
    }

    struct hreq *hr = hreq_new(h, c);
    *con_cls = hr;
    int bad = 0;
    char allow[64];
    const struct route *rt = route_match(h, method, url, hr->params, hr->sandbox,
                                         sizeof(hr->sandbox), &bad, allow, sizeof(allow));
    if (rt == &method_mismatch) {
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
        add_common_headers(r, h->keys != NULL);
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
                         sbx_xstrndup(h->openapi, h->openapi_len), h->openapi_len);
    if (!authorized(h, c))
        return queue_err(hr, SBX_E_UNAUTHORIZED,
                         "a valid API key is required: Authorization: Bearer <key> (or "
                         "?access_token=<key>)");
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
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, query_arg, hr->query);
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
    if (key) {
        if (!*key || strlen(key) > SBX_WIRE_MAX_ID)
            return queue_err(hr, SBX_E_VALIDATION, "Idempotency-Key must be 1-%d bytes",
                             SBX_WIRE_MAX_ID);
        snprintf(hr->rid, sizeof(hr->rid), "%s", key);
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
            int rc = read_start(hr);
            if (rc)
                return queue_err(hr, rc, "could not read the stream");
            hr->phase = PH_READ1;
            return MHD_YES;
        }
        if (hr->rt->kind == R_FILE_GET) {
            json_object_set_new(hr->params, "encoding", json_string("base64"));
            return start_op(hr, "file.read");
        }
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
    else
        hreq_free(*con_cls);
    *con_cls = NULL;
}

/* ------------------------------------------------------------------------------ */
/* Synchronous calls for worker threads. */

int
http_call_sync(struct sbx_http *h, const char *op, const char *sandbox, const char *args,
               size_t args_len, int64_t timeout_ms, struct hreply *reply, char code[64],
               char *msg, size_t msglen)
{
    memset(reply, 0, sizeof(*reply));
    char *buf;
    size_t len;
    if (envelope(op, sandbox, args, args_len, timeout_ms, NULL, &buf, &len) != 0) {
        snprintf(code, 64, "INTERNAL_ERROR");
        snprintf(msg, msglen, "cannot encode the request");
        return SBX_E_INTERNAL;
    }
    nng_ctx ctx;
    nng_msg *m = NULL;
    nng_aio *aio = NULL;
    int rv = nng_ctx_open(&ctx, h->req);
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
        nng_ctx_close(ctx);
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

static int
load_keys(struct sbx_http *h, const char *path, char *why, size_t whylen)
{
    char *text;
    size_t n;
    int rc = sbx_fs_read(path, 1 << 20, &text, &n);
    if (rc) {
        snprintf(why, whylen, "cannot read the API key file %s: %s", path, strerror(-rc));
        return rc;
    }
    size_t count = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        while (*line == ' ' || *line == '\t')
            line++;
        size_t l = strlen(line);
        while (l && (line[l - 1] == ' ' || line[l - 1] == '\t' || line[l - 1] == '\r'))
            line[--l] = 0;
        if (!l || line[0] == '#')
            continue;
        if (l < 16) {
            snprintf(why, whylen, "API keys must be at least 16 characters (%s)", path);
            free(text);
            return -EINVAL;
        }
        h->keys = sbx_xrealloc(h->keys, (count + 2) * sizeof(char *));
        h->keys[count++] = sbx_xstrdup(line);
        h->keys[count] = NULL;
    }
    free(text);
    if (!count) {
        snprintf(why, whylen, "the API key file %s holds no key", path);
        return -EINVAL;
    }
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
    routes_free(h);
    free(h->openapi);
    free(h->listen);
    free(h->upstream);
    free(h->preview_domain);
    free(h->relay_secret);
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    free(h);
}

int
sbx_http_start(sbx_http **out, const struct sbx_http_conf *conf, char *why, size_t whylen)
{
    struct sbx_http *h = sbx_xcalloc(1, sizeof(*h));
    int rc = 0;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    h->conf = *conf;
    h->listen = sbx_xstrdup(conf->listen);
    h->upstream = sbx_xstrdup(conf->upstream);
    h->preview_domain = conf->preview_domain && *conf->preview_domain
                            ? sbx_xstrdup(conf->preview_domain)
                            : NULL;
    h->relay_secret = conf->relay_secret ? sbx_xstrdup(conf->relay_secret) : NULL;
    if (h->conf.max_body <= 0)
        h->conf.max_body = DEFAULT_MAX_BODY;
    if (h->conf.timeout <= 0)
        h->conf.timeout = DEFAULT_TIMEOUT_MS;

    struct sockaddr_storage ss;
    socklen_t sl;
    if (parse_listen(h->listen, &ss, &sl) != 0) {
        snprintf(why, whylen, "cannot parse the HTTP address '%s' (want host:port)", h->listen);
        rc = -EINVAL;
        goto fail;
    }
    if (conf->api_keys && *conf->api_keys && (rc = load_keys(h, conf->api_keys, why, whylen)))
        goto fail;
    if (!h->keys && !is_loopback(&ss)) {
        snprintf(why, whylen,
                 "refusing to serve HTTP on %s without API keys: give --api-keys FILE, or "
                 "listen on a loopback address",
                 h->listen);
        rc = -EPERM;
        goto fail;
    }
    if ((rc = routes_build(h)) != 0) {
        snprintf(why, whylen, "the table of operations declares a malformed HTTP alias");
        goto fail;
    }
    /* The document generated from runtime/ops.yaml (gateway/openapi_gen.h). */
    h->openapi = sbx_xstrndup(sbx_openapi_json, sbx_openapi_json_len);
    h->openapi_len = sbx_openapi_json_len;
    if ((rc = sbx_nng_req_dial(&h->req, h->upstream)) != 0) {
        snprintf(why, whylen, "cannot reach the gateway at %s: %s", h->upstream, nng_strerror(rc));
        rc = -EIO;
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
                            MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)(128 * 1024),
                            MHD_OPTION_THREAD_POOL_SIZE, (unsigned)2,
                            MHD_OPTION_UNESCAPE_CALLBACK, unescape_none, NULL, MHD_OPTION_END);
    if (!h->d) {
        snprintf(why, whylen, "cannot listen for HTTP on %s (address in use?)", h->listen);
        nng_close(h->req);
        rc = -EADDRINUSE;
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
    nng_close(h->req);
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
