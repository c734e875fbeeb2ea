/*
 * http_int.h — what the parts of the HTTP front share.  Not a public
 * interface: the HTTP front's own pieces only.
 *
 *   http.c          server lifecycle (start, stop), the access handler (one
 *                   request's phases), JSON and error responses
 *   http_route.c    the route table, matching a request to a route, and the
 *                   operation's arguments from path, query and body
 *   openapi_gen.c   the OpenAPI document (generated from runtime/ops.yaml,
 *                   gateway/openapi_gen.h)
 *   http_auth.c     API keys, bearer check, the keyless browser guard
 *   http_sse.c      a stream as Server-Sent Events (stream.read long polls)
 *   http_call.c     calls to the gateway over nng (asynchronous for the
 *                   access handler, synchronous for worker threads)
 *   preview.c, terminal.c   preview URLs and terminals (worker threads)
 *   console.c       the web console's files under /console/ (--console)
 *   mcp_http.c      MCP over streamable HTTP at /mcp (worker threads)
 *
 * Threads: libmicrohttpd's threads (MHD_OPTION_THREAD_POOL_SIZE) run the
 * access handler, the SSE content reader and the completion callback; nng's
 * threads run only call_cb (http_call.c), which resumes the suspended
 * connection; preview and terminal requests run on their own worker threads.
 * Unless a function says otherwise it runs on an MHD thread and borrows every
 * pointer it is given.
 */
#ifndef SBX_HTTP_INT_H
#define SBX_HTTP_INT_H

#include <jansson.h>
#include <microhttpd.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>

#include "../runtime/cleanup.h"
#include "../runtime/error.h"
#include "../runtime/id.h"
#include "../runtime/ops.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "http.h"

struct preview_req;
struct terminal_state;
struct mcp_front;

#define MAX_SEGS 12
#define CALL_ERROR_REPLY 1
#define SBX_HTTP_KEY_MAX 256 /* bytes of a presented API key */ /* http_call_take: the reply is an error reply (in *m) */

/* ------------------------------------------------------------------------------ */
/* Routes (http_route.c). */

enum route_kind {
    R_OP = 1,     /* an operation of the table (canonical route or alias) */
    R_HEALTH,
    R_OPENAPI,
    R_STREAM,     /* GET …/streams/{streamId}: SSE */
    R_FILE_GET,   /* GET …/files/{path*}: raw bytes */
    R_METRICS,    /* GET /metrics: the `metrics` op's text (Prometheus) */
    R_FILE_PUT,   /* PUT …/files/{path*} */
    R_TERMINAL,   /* GET …/terminal: WebSocket */
    R_URL_TOKEN,  /* POST …/url-token: a short-lived URL token (http_token.c) */
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

struct sbx_http {
    struct sbx_http_conf conf; /* strings below are owned copies */
    char *listen, *upstream, *preview_domain, *relay_secret, *system_key;
    struct MHD_Daemon *d;
    int port;
    nng_socket req;
    /* Contexts of req are opened and closed under its read lock; the socket
     * is closed under its write lock, which sets req_closed: nng 1.5 can
     * panic ("pthread_mutex_unlock: Invalid argument") when a context is
     * closed while its socket closes, and closing the socket closes its
     * contexts anyway (http_ctx_open, http_ctx_close). */
    pthread_rwlock_t req_lk;
    bool req_closed;
    char **keys;               /* API keys, NULL-terminated (NULL: no auth) */
    uint8_t url_key[32];       /* HMAC key of URL tokens (http_token.c), set before MHD starts */
    struct route *routes;
    size_t nroutes;
    char *openapi;             /* the OpenAPI document (JSON text) */
    size_t openapi_len;
    pthread_mutex_t mu;        /* live worker threads (preview, terminal) */
    pthread_cond_t cv;
    int workers;
    struct preview_req *previews;     /* live preview requests (preview.c), under mu */
    struct terminal_state *terminals;  /* live terminals (terminal.c), under mu */
    struct mcp_front *mcp;             /* MCP sessions and calls (mcp_http.c; own lock) */
    atomic_bool stopping;
    atomic_ullong n_requests, n_errors;
};

/* http_ctx_open — open a context of h->req: 0 or an nng error (NNG_ECLOSED
 * once the front is stopping). */
int http_ctx_open(struct sbx_http *h, nng_ctx *ctx);
/* http_ctx_close — close a context http_ctx_open opened (nothing to do once
 * the socket is closed: that closed it). */
void http_ctx_close(struct sbx_http *h, nng_ctx ctx);

/*
 * A synchronous call through the gateway, for worker threads (preview,
 * terminal): op on sandbox with args (msgpack map bytes, may be NULL),
 * waiting at most timeout_ms.  On success returns 0 and *reply is the
 * decoded reply (caller frees with sbx_wire_msg_free then free()); its
 * result map is *result.  On failure returns the negative code and writes
 * the error's code name and message into code[64] / msg[msglen].
 */
struct hreply {
    sbx_msg m;
    char *buf;
    const msgpack_object *result;
};
int http_call_sync(struct sbx_http *h, const char *key, const char *op, const char *sandbox,
                   const char *args, size_t args_len, int64_t timeout_ms, struct hreply *reply,
                   char code[64], char *msg, size_t msglen);
void hreply_free(struct hreply *r);

/* ------------------------------------------------------------------------------ */
/* One API request (behind MHD's con_cls; http.c owns it). */

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
    char key[SBX_HTTP_KEY_MAX + 1]; /* the presented API key ("" without keys): the
                                     * gateway resolves it (gateway/tenant.h) */
    bool retry;           /* X-Sbx-Retry: an earlier attempt of rid may have run */
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

/* ------------------------------------------------------------------------------ */
/* http_route.c */

/* Build h->routes from the table of operations (own routes first, then every
 * op's canonical route and its REST aliases); 0 or -EINVAL.  Freed by
 * http_routes_free. */
int http_routes_build(struct sbx_http *h);
void http_routes_free(struct sbx_http *h);
/* What http_route_match returns when the path exists with other methods. */
extern const struct route http_method_mismatch;
/* Match method + path; fill params (a JSON object of path arguments, which
 * the caller owns) and sandbox[sblen].  Returns a route of h->routes, NULL
 * (no path matches: 404) or &http_method_mismatch (405, allow[allowlen]
 * then lists the methods).  *bad_param: 1 an {int} parameter is not one, 2 a
 * malformed escape, an escaped NUL, or a parameter that is not UTF-8. */
const struct route *http_route_match(struct sbx_http *h, const char *method, const char *url,
                                     json_t *params, char *sandbox, size_t sblen, int *bad_param,
                                     char *allow, size_t allowlen);
/* MHD_OPTION_UNESCAPE_CALLBACK: none (URLs reach the handler as sent). */
size_t http_unescape_none(void *cls, struct MHD_Connection *c, char *s);
/* MHD_get_connection_values iterator: a query argument into the JSON object
 * cls (decoded; the first well-formed occurrence wins; never access_token). */
enum MHD_Result http_query_arg(void *cls, enum MHD_ValueKind kind, const char *key,
                               const char *value);
/* The op's arguments as msgpack map bytes (*args, caller frees): query, then
 * the JSON body over them, then path arguments over both.  May raise
 * hr->timeout_ms for a command's own timeout.  0, or a negative code with
 * *err set (docs/errors.md; err may be NULL). */
int http_build_args(struct hreq *hr, char **args, size_t *alen, sbx_err_t *err);

/* ------------------------------------------------------------------------------ */
/* http_auth.c */

/* Whether ss is a loopback address (127/8, ::1, v4-mapped 127/8). */
bool http_is_loopback(const struct sockaddr_storage *ss);
/* Constant-time: presented equals a configured key (true with no keys). */
bool http_key_ok(struct sbx_http *h, const char *presented);
/* Keyless only: NULL, or why a browser-originated request (or a mutating
 * one without X-Sbx-Client) of `method` is refused. */
const char *http_browser_guard(struct sbx_http *h, struct MHD_Connection *c, const char *method);
/* The request carries a valid key (Authorization: Bearer, ?access_token). */
bool http_authorized(struct sbx_http *h, struct MHD_Connection *c);

/* ------------------------------------------------------------------------------ */
/* URL tokens (http_token.c; docs/http.md, "Tokens in URLs"). */

#define HTTP_URL_TOKEN_TTL_MS 60000     /* a token's life from its minting: the default, */
#define HTTP_URL_TOKEN_MIN_TTL_MS 1000  /* and the range of ?ttlMs= (shorter: one link, one use) */

/* http_url_key_init — set h->url_key (from h->relay_secret, else random). */
void http_url_key_init(struct sbx_http *h);
/* http_url_purpose — the URL-token purpose of a route kind ("terminal",
 * "stream", "file"), or NULL: that route takes no URL token. */
const char *http_url_purpose(int route_kind);
/* http_url_token_mint — a new token for purpose on sandbox sealing key (the
 * caller's API key, "" keyless; borrowed), good for ttl_ms (ms, from
 * HTTP_URL_TOKEN_MIN_TTL_MS to HTTP_URL_TOKEN_TTL_MS), as the JSON answer
 * {token, purpose, sandbox, expiresAt (ms since the epoch), ttlMs} (caller
 * owns it); NULL when purpose is not one of http_url_purpose's, key is
 * longer than SBX_HTTP_KEY_MAX or ttl_ms is out of range (the caller checks
 * ?ttlMs= first, to name what was wrong). */
json_t *http_url_token_mint(const struct sbx_http *h, const char *sandbox, const char *purpose,
                            const char *key, int64_t ttl_ms);
/* http_url_token_ok — whether the request's ?access_token= is an unexpired
 * token minted for the purpose of route_kind on sandbox (GCM tag compared
 * in constant time); if so, the key it seals goes to key_out (else "").
 * Never true for a route without a purpose. */
bool http_url_token_ok(const struct sbx_http *h, struct MHD_Connection *c, int route_kind,
                       const char *sandbox, char key_out[SBX_HTTP_KEY_MAX + 1]);
/* http_presented_key — the API key c presents in its Authorization header
 * (Bearer), copied into out[SBX_HTTP_KEY_MAX + 1] ("" for none or a longer
 * one).  Keys never come from a URL: see http_request_key. */
void http_presented_key(struct MHD_Connection *c, char *out);
/* http_request_key — the key a request to route_kind on sandbox acts with:
 * the header's, else the one sealed in a good URL token for that route and
 * sandbox (http_url_token_ok); into out[SBX_HTTP_KEY_MAX + 1].  Whether
 * there is one. */
bool http_request_key(const struct sbx_http *h, struct MHD_Connection *c, int route_kind,
                      const char *sandbox, char *out);
/* Read the key file at path into h->keys; 0, or a negative code with *err
 * set (docs/errors.md; err may be NULL). */
int http_load_keys(struct sbx_http *h, const char *path, sbx_err_t *err);

/* ------------------------------------------------------------------------------ */
/* http_call.c: calls to the gateway (nng). */

/* A new request state for connection c (owned by MHD's con_cls; freed by
 * hreq_free, which stops any call in flight). */
struct hreq *hreq_new(struct sbx_http *h, struct MHD_Connection *c);
void hreq_free(struct hreq *hr);
/* Start a call: suspend the connection, then send.  On MHD's thread, inside
 * the access handler or the content reader.  0, or a negative code (nothing
 * in flight then, the connection not suspended).  The nng completion resumes
 * the connection. */
int http_call_start(struct hreq *hr, const char *op, const char *args, size_t alen,
                    int64_t timeout, const char *rid);
/* The finished call's reply: 0 with *m decoded (caller frees; result map in
 * *result), CALL_ERROR_REPLY with *m the error reply (caller frees), or a
 * negative code with code/message filled. */
int http_call_take(struct hreq *hr, sbx_msg *m, const msgpack_object **result, char code[64],
                   char *msg, size_t msglen);

/* ------------------------------------------------------------------------------ */
/* http_sse.c */

/* Append a stream.read result to hr->out as SSE blocks. */
void http_sse_result(struct hreq *hr, const msgpack_object *res);
/* Start the next stream.read of hr->stream_id after hr->after. */
int http_sse_read_start(struct hreq *hr);
/* Queue the text/event-stream response whose reader long-polls the stream. */
enum MHD_Result http_sse_queue(struct hreq *hr);

/* http.c: CORS headers when cors (h->keys != NULL). */
void http_add_common_headers(struct MHD_Response *r, bool cors);

/* A JSON error response {code, message, context?, httpStatus} queued on c. */
enum MHD_Result http_queue_error(struct MHD_Connection *c, int status, const char *code,
                                 const char *message);

/* Percent-decode in place ('+' as space with plus); false if malformed. */
bool http_pct_decode(char *s, bool plus);

/* Worker threads register so sbx_http_stop can wait for them. */
void http_worker_enter(struct sbx_http *h);
void http_worker_leave(struct sbx_http *h);

/* preview.c: whether host names a preview URL; then serve the request. */
bool preview_match(struct sbx_http *h, const char *host, int *port, char *id, size_t idlen,
                   char *token, size_t toklen);
enum MHD_Result preview_access(struct sbx_http *h, struct MHD_Connection *c, const char *url,
                               const char *method, const char *upload_data,
                               size_t *upload_data_size, void **con_cls, const char *host);
void preview_completed(void *state);
/* At shutdown: wake and end every preview request / terminal. */
void preview_cancel_all(struct sbx_http *h);
void terminal_cancel_all(struct sbx_http *h);

/* terminal.c: a WebSocket upgrade request for a sandbox's terminal (first
 * call: *con_cls NULL; later calls continue it). */
enum MHD_Result terminal_access(struct sbx_http *h, struct MHD_Connection *c, const char *sandbox,
                                void **con_cls);
void terminal_completed(void *state);

/* console.c: whether url is the console's (/console or /console/…) and the
 * console is on; then serve it (static files, docs/console.md). */
bool console_match(const struct sbx_http *h, const char *url);
enum MHD_Result console_access(struct sbx_http *h, struct MHD_Connection *c, const char *url,
                               const char *method);

/* mcp_http.c (docs/mcp.md, "Streamable HTTP").  mcp_front_new builds
 * h->mcp (the tools/list answer from h->openapi, so after it is set): 0 or
 * SBX_E_INTERNAL; mcp_front_free frees it (once no worker runs).
 * mcp_match: whether url is the MCP endpoint (/mcp).  mcp_access serves a
 * request to it (first call: *con_cls NULL; later calls continue it), after
 * first_call's Host/Origin checks; mcp_completed frees its state. */
int mcp_front_new(struct sbx_http *h);
void mcp_front_free(struct sbx_http *h);
bool mcp_match(const char *url);
enum MHD_Result mcp_access(struct sbx_http *h, struct MHD_Connection *c, const char *method,
                           const char *upload_data, size_t *upload_data_size, void **con_cls);
void mcp_completed(void *state);

/* Kinds of per-connection state behind con_cls (first field of each). */
enum { HS_API = 1, HS_PREVIEW, HS_TERMINAL, HS_MCP };

#endif
