/*
 * gateway_int.h — what the parts of the gateway share (gateway/gateway.h is
 * the interface): gateway.c (intake, routing, forwarding, lifecycle) and
 * gw_merge.c (the merged answers of fanned-out ops).  Not a public interface.
 */
#ifndef SBX_GATEWAY_INT_H
#define SBX_GATEWAY_INT_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "../runtime/cview.h"
#include "../runtime/etcd.h"
#include "../runtime/id.h"
#include "../runtime/place.h"
#include "../runtime/wire.h"
#include "gateway.h"
#include "http.h"
#include "tenant.h"

#define MAX_SLOTS SBX_CVIEW_MAX_MEMBERS
#define RETRY_MIN_MS 10
#define RETRY_MAX_MS 400

struct sbx_gateway;
struct gctx;

struct gshard {
    struct sbx_gateway *gw;
    int idx;
    char name[64];        /* in a cluster, rewritten under gw->slot_mu when the slot is given */
    char url[256];        /* to another shard: read them elsewhere through slot_label() */
    nng_socket sock;
    nng_dialer dialer;    /* set by slot_open; replaced by the view thread only */
    uint64_t gen;         /* the view member's gen the slot dials (view thread) */
    atomic_bool open;
    atomic_int pipes;
    atomic_bool ever;     /* it was connected once: the shard has started */
};

enum { F_IDLE = 0, F_SEND, F_RECV, F_SLEEP };

struct gfwd {
    struct gctx *g;
    struct gshard *s;
    bool ctx_open;
    nng_ctx ctx;
    nng_aio *aio;
    int state;
    int64_t deadline;
    nng_msg *reply;
    int rv;
};

enum { G_RECV = 1, G_WORK, G_SEND };

struct gctx {
    struct sbx_gateway *gw;
    nng_ctx ctx;
    nng_aio *aio;
    int state;
    struct gfwd fwd[MAX_SLOTS];
    pthread_mutex_t mu;   /* fan-out bookkeeping */
    int pending;
    bool fanout;          /* list / cluster.status: merge every shard's answer */
    bool in_fanout[MAX_SLOTS];
    char id[SBX_WIRE_MAX_ID + 1];
    char op[64];
    int op_id;            /* enum sbx_op_id of op; -1 before the intake found it */
    /* a routed request, kept for retries (cluster mode) */
    char *body;
    size_t blen;
    uint32_t part;
    int64_t deadline;     /* monotonic ms */
    int attempts;
    bool delivered;       /* an attempt reached a shard and may have run there */
    nng_aio *sleep;       /* back-off timer */
    int last_slot;
    /* tenancy (gw->tenants): who sent it, and its sandbox outside / inside */
    bool tenanted;
    size_t limit;         /* audit.list: the most entries of the merged answer */
    struct sbx_principal who;
    char ext_id[SBX_ID_MAX + 1], int_id[SBX_ID_MAX + 1];
    /* a stream.read counted against its tenant's maxStreams ("<int_id>/<streamId>";
     * "" none): released when its answer goes out (client_send) */
    char stream_key[SBX_ID_MAX + 2 + 64];
};

struct sbx_gateway {
    struct sbx_gateway_conf conf;
    nng_socket sock;
    struct gshard shards[MAX_SLOTS];
    int nshards;          /* slots in use */
    int16_t table[SBX_PARTITIONS]; /* standalone */
    struct gctx *ctxs;
    int nctx;
    atomic_ullong n_requests, n_errors, n_retries;
    int64_t started_ms;
    sbx_http *http;
    char inproc[96];
    /* cluster mode */
    sbx_etcd *etcd;
    sbx_cview *view;
    char prefix[160];
    pthread_mutex_t slot_mu; /* opening slots */
    sbx_tenants *tenants;    /* with API keys: the tenant registry (gateway/tenant.h) */
};

/* Whether gw follows a cluster (etcd) rather than a fixed set of shards. */
bool gw_clustered(const struct sbx_gateway *gw);
/* Answer g with these bytes (copied) / with an error of code (gateway.c client_err). */
void gw_client_send_bytes(struct gctx *g, const char *buf, size_t len);
void gw_client_err(struct gctx *g, int code, const char *msg);
void gw_client_errf(struct gctx *g, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Free g's kept request (its routing is over). */
void gw_request_done(struct gctx *g);
/* A slot's shard name and URL, read under the slot lock (url may be NULL). */
void gw_slot_label(struct gshard *s, char name[64], char url[256]);
/* gw_tenant.c: whether op id is one of the tenant/key admin ops. */
bool gw_is_admin_op(int id);
/*
 * gw_tenant_gate (gw_tenant.c) — the intake's tenancy step (only with API
 * keys): resolve the request's key to g->who, refuse what its scope may not
 * do, put its sandbox (and a sandbox.fork's `ids`) into its tenant's
 * namespace (g->ext_id → g->int_id) and check the quotas.  0: go on with
 * *body (the request re-encoded without its key, with internal IDs; caller
 * frees); 1: g was answered.
 */
int gw_tenant_gate(struct gctx *g, const struct sbx_req *req, const msgpack_object *root,
                   const struct sbx_op_def *def, char **body, size_t *blen);
/* gw_merge.c: answer a fanned-out op from every shard's reply in g->fwd[]
 * (the replies are freed). */
void gw_merge_and_reply(struct gctx *g);

#endif
