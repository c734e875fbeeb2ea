/*
 * httpc.h — a small HTTP client for the tests of the HTTP front (libcurl):
 * one-shot requests with the whole answer in memory, and a Server-Sent
 * Events reader that hands each event to a callback as it arrives.
 *
 * Host names under ".localhost" (preview URLs) are resolved to 127.0.0.1
 * by the helper itself (CURLOPT_RESOLVE), as a browser would.
 */
#ifndef SBX_TEST_HTTPC_H
#define SBX_TEST_HTTPC_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct hresp {
    long status;      /* 0: the transfer failed (see err) */
    char *body;       /* NUL-terminated (binary bodies: use len) */
    size_t len;
    char *head;       /* the response head, "Name: value\r\n" lines */
    json_t *json;     /* the body parsed as JSON, or NULL */
    char err[256];    /* curl's error when status == 0 */
    double first_byte_ms, total_ms; /* from the start of the request */
};

/* Options of one request (all optional). */
struct hopts {
    const char *const *headers; /* "Name: value", NULL-terminated; X-Sbx-Client: sbx-tests
                                 * is added unless one is given ("X-Sbx-Client:" for none,
                                 * "X-Sbx-Client;" for an empty one) */
    const void *body;           /* request body (PUT/POST) */
    size_t body_len;
    bool chunked;               /* send the body with Transfer-Encoding: chunked */
    long timeout_ms;            /* default 60 000 */
    bool http10;
};

/* http_req — method url → resp (always filled; free with hresp_free).
 * Returns the status (0 on a transport failure). */
long http_req(const char *method, const char *url, const struct hopts *o, struct hresp *r);
/* http_json — a request whose body is the JSON text `json` (may be NULL). */
long http_json(const char *method, const char *url, const char *json, struct hresp *r);
void hresp_free(struct hresp *r);
/* hresp_header — the value of the first header `name` (case-insensitive), heap,
 * or NULL. */
char *hresp_header(const struct hresp *r, const char *name);

/* One Server-Sent Event. */
struct sse_ev {
    char id[32];
    bool has_id;
    char event[64];
    char *data;       /* the data lines joined by '\n' */
    json_t *json;     /* data parsed as JSON, or NULL */
    bool comment;     /* a comment line (": ping"), data = its text */
    double at_ms;     /* arrival, ms since the request started */
};

/* Return false to stop reading (the connection is dropped). */
typedef bool (*sse_cb)(const struct sse_ev *ev, void *arg);

/* sse_get — `method url` with Accept: text/event-stream, feeding every event
 * (and comment) to cb until it returns false or the response ends.  When
 * the answer is not 200 its body is left in r->body.  Returns the status. */
long sse_req(const char *method, const char *url, const struct hopts *o, sse_cb cb, void *arg,
             struct hresp *r);

/* Printf into a heap string. */
char *hfmt(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* sha256 of bytes, as 64 hex digits + NUL. */
void sha256_hex(const void *p, size_t n, char out[65]);

#endif
