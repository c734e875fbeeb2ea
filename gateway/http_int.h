/*
 * http_int.h — what gateway/http.c shares with preview.c and terminal.c.
 * Not a public interface: the HTTP front's own pieces only.
 */
#ifndef SBX_HTTP_INT_H
#define SBX_HTTP_INT_H

#include <microhttpd.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "http.h"

struct preq;
struct tstate;

struct sbx_http {
    struct sbx_http_conf conf; /* strings below are owned copies */
    char *listen, *upstream, *preview_domain, *relay_secret;
    struct MHD_Daemon *d;
    int port;
    nng_socket req;
    char **keys;               /* API keys, NULL-terminated (NULL: no auth) */
    struct route *routes;
    size_t nroutes;
    char *openapi;             /* the OpenAPI document (JSON text) */
    size_t openapi_len;
    pthread_mutex_t mu;        /* live worker threads (preview, terminal) */
    pthread_cond_t cv;
    int workers;
    struct preq *previews;     /* live preview requests (preview.c), under mu */
    struct tstate *terminals;  /* live terminals (terminal.c), under mu */
    atomic_bool stopping;
    atomic_ullong n_requests, n_errors;
};

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
int http_call_sync(struct sbx_http *h, const char *op, const char *sandbox, const char *args,
                   size_t args_len, int64_t timeout_ms, struct hreply *reply, char code[64],
                   char *msg, size_t msglen);
void hreply_free(struct hreply *r);

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

/* Kinds of per-connection state behind con_cls (first field of each). */
enum { HS_API = 1, HS_PREVIEW, HS_TERMINAL };

#endif
