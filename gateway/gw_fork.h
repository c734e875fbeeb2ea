/*
 * gw_fork.h — the gateway's part of a sandbox.fork whose IDs are owned by
 * several shards, of one node or of a cluster (runtime/ops/fork.yaml;
 * docs/persistence.md, "Fork"; the steps are in gw_fork.c).
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
    int slot[GW_FORK_MAX];            /* each fork's owner: the gateway's shard slot */
    nng_socket sock[GW_FORK_MAX];     /* … and its socket (borrowed) */
    bool remote[GW_FORK_MAX];         /* owned by another shard than the source's */
    char *body;                       /* the client's request bytes (owned) */
    size_t blen;
    sbx_msg orig;                     /* decoded from body (gw_fork_start) */
    /* done(arg, reply, len): the reply frame for the client (borrowed for
     * the call), from the fork's thread, exactly once. */
    void (*done)(void *arg, const char *reply, size_t len);
    void *arg;
};

/*
 * gw_fork_plan — look at a client's sandbox.fork args (borrowed) whose
 * source's shard is slot src; owner(arg, partition) gives a partition's
 * slot (or -1).  Returns 0: every fork is the source's shard's (route the
 * request as usual); 1: *out gets a new plan (ids, remote, slot filled;
 * the caller fills the rest, then gw_fork_start); or a code with the reason
 * in why: `stage` from a client (VALIDATION_FAILED).  Malformed `ids` give 0: the
 * shard answers them.
 */
int gw_fork_plan(const msgpack_object *args, int src, int (*owner)(void *arg, uint32_t part),
                 void *arg, struct gw_fork_plan **out, char *why, size_t whylen);

/* gw_fork_start — run the fork on a thread of its own; 0, or a code (p
 * freed, done not called). */
int gw_fork_start(struct gw_fork_plan *p);

#endif
