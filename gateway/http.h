/*
 * http.h — the gateway's HTTP/JSON front (libmicrohttpd).
 *
 * Every operation of the nng protocol (runtime/ops.h) is served as REST +
 * JSON from the one table of operations, so the two APIs cannot drift:
 *
 *   POST /v1/sandboxes/{sandbox}/{op}   body = the op's arguments (JSON object)
 *   POST /v1/{op}                       deployment-wide ops (list, cluster.status)
 *   plus the REST aliases each table entry declares (GET /v1/sandboxes/{sandbox}, …)
 *
 * and a few routes of its own: GET /v1/health, GET /metrics (the `metrics`
 * operation's text as Prometheus reads it), GET /v1/openapi.json (the
 * OpenAPI 3 document generated from the same table), GET|PUT
 * /v1/sandboxes/{sandbox}/files/{path} (raw bytes), GET
 * /v1/sandboxes/{sandbox}/streams/{streamId} (a stream as Server-Sent
 * Events, resumable with Last-Event-ID), GET /v1/sandboxes/{sandbox}/terminal
 * (WebSocket, gateway/terminal.c) and, by Host header, preview URLs
 * (gateway/preview.c).  docs/http.md is the reference.
 *
 * Requests become nng requests to the gateway (conf.upstream, normally an
 * inproc:// address of the gateway in the same process): the connection is
 * suspended while the shard and the sandbox work (MHD_suspend_connection)
 * and resumed from the nng completion callback, so one server thread serves
 * every connection and a long command holds no thread.
 *
 * Errors: status = the SDK's status map (runtime/err.h), body
 * {code, message, context, httpStatus, operation}.  Authentication: bearer
 * API keys (Authorization: Bearer K, or ?access_token=K for browsers'
 * EventSource and WebSocket, RFC 6750 §2.3) from conf.api_keys; with no key
 * the front refuses to listen on anything but a loopback address.
 */
#ifndef SBX_HTTP_H
#define SBX_HTTP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/error.h"

struct sbx_http_conf {
    const char *listen;         /* "host:port" (IPv4 or [IPv6]); port 0 = any free port */
    const char *upstream;       /* nng URL of the gateway (inproc://…) */
    const char *api_keys;       /* file with one key per line ('#' comments), or NULL */
    const char *preview_domain; /* preview URLs are {port}-{id}-{token}.<this>; NULL: any host */
    const char *preview_scheme; /* "https" where the deployment terminates TLS, else http */
    const char *relay_secret;   /* shared with the shards' preview relays (cluster mode), or NULL */
    int64_t max_body;           /* bytes of a request body (0: 32 MiB) */
    int64_t timeout;            /* ms: deadline of a request that names none (0: 600 000) */
    int64_t per_client;         /* connections from one client address (0: 1024 of the 4096
                                 * in all), so that one client cannot hold them all */
    const char *system_key;     /* with API keys: the gateway's system token (gateway/tenant.h),
                                 * for preview lookups, which carry no caller's key; or NULL */
    bool console;               /* serve the web console under /console/ (docs/console.md) */
    int64_t ws_ping;            /* ms: a terminal WebSocket whose client has shown no sign
                                 * of life (no bytes from it, none of ours acknowledged) for this
                                 * long is pinged, once per this long (RFC 6455 §5.5.2;
                                 * browsers pong by themselves), and closed once silent for
                                 * 3 times this — a client gone without a close (0: 30 000) */
};

typedef struct sbx_http sbx_http;

/*
 * sbx_http_start — bind and serve on libmicrohttpd's thread.  On failure
 * returns a negative code (-EPERM: a non-loopback address and no API keys;
 * -EADDRINUSE: cannot listen; SBX_E_VALIDATION: a bad address or key file;
 * a -errno of the key file; the nng dial's code) and sets *err (err may be
 * NULL; runtime/error.h, docs/errors.md).  *out is owned by the caller and
 * released with sbx_http_stop.
 */
int sbx_http_start(sbx_http **out, const struct sbx_http_conf *conf, sbx_err_t *err);
/* sbx_http_port — the TCP port actually bound (useful with port 0). */
int sbx_http_port(const sbx_http *h);
/* sbx_http_counters — requests the front served and those answered with an
 * error, since it started (for the gateway's metrics).  Thread-safe. */
void sbx_http_counters(const sbx_http *h, uint64_t *requests, uint64_t *errors);
/* sbx_http_stop — finish in-flight calls, close every connection, free. */
void sbx_http_stop(sbx_http *h);

#endif
