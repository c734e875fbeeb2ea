/*
 * gw_fork.h — the gateway's part of a sandbox.fork whose IDs are owned by
 * several shards of one node (runtime/ops/fork.yaml; docs/persistence.md,
 * "Fork"; the steps are in gw_fork.c).
 */
#ifndef SBX_GW_FORK_H
#define SBX_GW_FORK_H

#include <nng/nng.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/wire.h"

#define GW_FORK_MAX 16

/* What gw_fork_start needs; heap, owned by it from the call on. */
struct gw_fork_plan {
    char req_id[SBX_WIRE_MAX_ID + 1]; /* the client's request id */
    char from[64];                    /* the source */
    int64_t timeout_ms;               /* the request's time left */
    nng_socket src_sock;              /* the source's shard (borrowed: the gateway's) */
    size_t n;
    char ids[GW_FORK_MAX][64];
    nng_socket sock[GW_FORK_MAX];     /* each fork's owner (borrowed) */
    bool remote[GW_FORK_MAX];         /* owned by another shard than the source's */
    char *body;                       /* the client's request bytes (owned) */
    size_t blen;
    sbx_msg orig;                     /* decoded from body (gw_fork_start) */
    /* done(arg, reply, len): the reply frame for the client (borrowed for
     * the call), from the fork's thread, exactly once. */
    void (*done)(void *arg, const char *reply, size_t len);
    void *arg;
};

/* gw_fork_start — run the fork on a thread of its own; 0, or a code (p
 * freed, done not called). */
int gw_fork_start(struct gw_fork_plan *p);

#endif
