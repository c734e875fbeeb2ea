/*
 * preview_int.h — a preview request's state and the parsers of what a
 * client sends and a sandbox's service answers (preview.c).  Internal to
 * the HTTP front and its tests (tests/fuzz/fuzz_preview.c); the front
 * reaches previews through preview_match / preview_access /
 * preview_completed / preview_cancel_all (http_int.h).
 */
#ifndef SBX_PREVIEW_INT_H
#define SBX_PREVIEW_INT_H

#include <curl/curl.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/id.h"
#include "../runtime/util.h"
#include "http_int.h"

#define PREVIEW_HEAD_MAX (64 * 1024)     /* bytes of an upstream WebSocket answer's head */
#define PREVIEW_CONN_OPTIONS_MAX 1024    /* bytes of Connection options honoured (hop-by-hop) */
/* Fairness between tenants (issue 16 item 4; docs/http.md "Preview URLs").
 * Preview requests in progress on this front, counted before a worker
 * thread or an upstream connection is spent: at most PREVIEW_PER_SANDBOX
 * for one sandbox and PREVIEW_PER_CLIENT from one client address; beyond,
 * 503 RESOURCE_BUSY with Retry-After.  Upstream reads: an HTTP exchange
 * whose upstream sends no response head for PREVIEW_HEAD_TIMEOUT_MS after
 * the last byte either way is answered 504 REQUEST_TIMEOUT (as a WebSocket
 * upgrade's head, 30 s); a response body silent for PREVIEW_IDLE_MS is cut
 * (its relay then closes, and the sandbox may sleep again). */
#define PREVIEW_PER_SANDBOX 64
#define PREVIEW_PER_CLIENT 256
#define PREVIEW_HEAD_TIMEOUT_MS 30000
#define PREVIEW_IDLE_MS (5 * 60 * 1000)

/* One preview request.  Reference-counted (refs; under mu): the MHD
 * connection and the worker thread each hold one; the last drop
 * (preview_req_unref) unlists it from h->previews and frees it and
 * everything it owns.  The request fields are set on MHD's thread before
 * the worker starts; the rest is under mu. */
struct preview_req {
    int kind; /* HS_PREVIEW */
    struct sbx_http *h;            /* borrowed: the front outlives its requests */
    struct MHD_Connection *c;      /* borrowed; NULL in the fuzz target */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                      /* the connection and the worker */
    bool suspended;
    bool cancelled;                /* the connection is gone or the server stops */
    /* the request */
    char method[16];
    char *target;                  /* path?query as the client sent it; owned */
    char sandbox[SBX_ID_MAX + 2];
    int port;
    char token[72];
    char host[256];
    char client_ip[64];
    bool ws;
    struct curl_slist *req_hdrs;   /* forwarded request headers; owned */
    int64_t content_length;        /* -1: unknown (chunked) */
    int64_t last_io_ms;            /* sbx_mono_ms() of the last upstream byte either way
                                    * (the worker's start at first); under mu */
    int timed_out;                 /* 1: no head in time, 2: the body went idle; worker only */
    bool has_body;
    /* upload: client → upstream */
    sbx_buf up;
    size_t up_off;
    bool up_done;
    bool up_full;                  /* the connection was suspended for space */
    /* response: upstream → client */
    bool head_ready;
    int status;
    struct curl_slist *resp_hdrs;  /* owned */
    char *resp_conn;               /* the upstream's Connection options (its fields are
                                      hop-by-hop); owned */
    int64_t resp_length;           /* -1: unknown */
    bool queued;
    sbx_buf down;
    size_t down_off;
    bool down_done, down_err;
    /* an error answered instead of the upstream's response */
    int err_status;
    char err_code[64];
    char err_msg[320];
    /* WebSocket */
    int relay_fd;                  /* owned, or -1 */
    struct MHD_UpgradeResponseHandle *urh;
    int client_sock;
    bool upgraded;
    char *extra;                   /* upstream bytes read past its head; owned */
    size_t nextra;
    struct preview_req *next;      /* h->previews */
};

/* What preview_collect_header is given (MHD_get_connection_values' cls). */
struct preview_hdr_walk {
    struct preview_req *pr;        /* borrowed: its req_hdrs grows */
    const char *connection;        /* the client's Connection header, or NULL */
    bool ws;                       /* a WebSocket handshake: Upgrade is kept */
};

/* A new preview request of connection c (NULL in the fuzz target), one
 * reference held; not yet listed in h->previews (the caller lists it,
 * under h->mu).  Never NULL (aborts when out of memory). */
struct preview_req *preview_req_new(struct sbx_http *h, struct MHD_Connection *c);

/* Drop one reference; the last frees pr (closes relay_fd). */
void preview_req_unref(struct preview_req *pr);

/* MHD's header iterator (cls: a struct preview_hdr_walk): appends
 * "Key: value" to w->pr->req_hdrs unless the field is Host,
 * Content-Length, Expect, X-Forwarded-*, Forwarded, X-Sbx-*, hop-by-hop
 * (RFC 9110 §7.6.1: fixed ones and those Connection names; Upgrade kept for
 * a WebSocket) or longer than 8 KiB.  Always MHD_YES.  Borrows key and value. */
enum MHD_Result preview_collect_header(void *cls, enum MHD_ValueKind kind, const char *key,
                                       const char *value);

/* Append a Connection field's value to the options seen so far (*acc:
 * owned, NULL at first; replaced by a new allocation), up to what the
 * hop-by-hop check reads (PREVIEW_CONN_OPTIONS_MAX). */
void preview_add_connection(char **acc, const char *value);

/* libcurl's header callback (cls: the preview_req), on the worker thread:
 * one line of the upstream's head (with its line end; not NUL-terminated),
 * the status lines of interim heads included.  Sets pr->status (502 for a
 * status line without three digits), collects the fields to pass on in
 * pr->resp_hdrs (less Content-Length and hop-by-hop ones) and sets
 * pr->head_ready at the end of a final head.  Returns size * nmemb, or 0 when
 * the request was cancelled (libcurl then aborts). */
size_t preview_on_header(char *p, size_t size, size_t nmemb, void *cls);

/* preview_cookie_host_only — a Set-Cookie value as a preview's upstream sent
 * it, rewritten in place (it only shrinks) without its Domain attributes
 * (RFC 6265 §5.2.3, any case, any spacing), so the browser keeps the cookie
 * for the exact preview host only: every preview host is a name under one
 * domain, and a `Domain=` of it would send one sandbox's cookie to all
 * others (issue 16 item 5).  Other attributes and the name=value pair are
 * kept byte for byte. */
void preview_cookie_host_only(char *v);

/* The upstream URL of a request: the relay is a SOCKS5 proxy whose
 * destination "<gen>.<sandbox>" names the container (runtime/relay.h), then
 * the port and the target as the client sent it.  NULL unless the target is
 * in origin form (RFC 9112 §3.2.1: it starts with '/').  The caller frees it. */
char *preview_upstream_url(uint64_t gen, const char *sandbox, int port, const char *target);

/* The worker's WebSocket pass-through: writes the handshake to pr->relay_fd,
 * reads the answer's head (at most PREVIEW_HEAD_MAX bytes, else 502) into
 * pr->status / pr->resp_hdrs and the bytes read past it into pr->extra; a
 * 101 is then pumped both ways once MHD upgrades the connection (not when
 * pr->cancelled), any other answer is passed on as a response with its
 * body.  Errors set pr->err_status. */
void preview_proxy_ws(struct preview_req *pr);

#endif
