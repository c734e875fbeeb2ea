/*
 * ops.h — the one table of operations.
 *
 * Every operation of the protocol is declared here once, with where it runs
 * and how it behaves; the gateway validates against it, the shard dispatches
 * with it, the HTTP front (gateway/http.c) derives its routes from it and the
 * CLI's help lists it.  docs/protocol.md documents each entry's arguments and
 * result.  An op the table does not know is UNKNOWN_OPERATION everywhere.
 */
#ifndef SBX_OPS_H
#define SBX_OPS_H

#include <stddef.h>

enum sbx_op_flags {
    SBX_OP_SANDBOX = 1 << 0,   /* addressed to a sandbox: 'sandbox' is required */
    SBX_OP_AGENT = 1 << 1,     /* executed by the agent inside the container */
    SBX_OP_NOCREATE = 1 << 2,  /* never creates the sandbox (getSandbox semantics otherwise) */
    SBX_OP_NOWAKE = 1 << 3,    /* never starts a stopped container */
    SBX_OP_GLOBAL = 1 << 4,    /* about the whole deployment: the gateway fans out to shards */
    SBX_OP_MUTATES = 1 << 5,   /* changes durable state: replied to only after commit */
    SBX_OP_STREAM = 1 << 6,    /* answers {streamId}: over HTTP the reply is that stream as SSE */
    SBX_OP_INTERNAL = 1 << 7,  /* between shards only: gateways refuse it from clients */
    SBX_OP_FRONT = 1 << 8,     /* a helper of the HTTP front (over nng): not an HTTP route */
};

struct sbx_op_def {
    const char *name;
    unsigned flags;
    /* For SBX_OP_AGENT|SBX_OP_NOWAKE ops: the error code answered when the
     * sandbox has no running container (what the op refers to died with it). */
    int idle_code;
    const char *summary;
    /*
     * REST aliases served by the HTTP front besides the canonical route
     * (POST /v1/sandboxes/{sandbox}/<name>, or POST /v1/<name> for a
     * deployment-wide op), as "METHOD /path" separated by "|", or NULL.
     * A path segment {name} becomes the string argument `name`, {name:int}
     * an integer one; {sandbox} is the sandbox ID.  Query parameters become
     * string arguments.  gateway/http.c serves them and lists them in
     * /v1/openapi.json.
     */
    const char *http;
};

/* sbx_op_find — the definition of op (n bytes), or NULL. */
const struct sbx_op_def *sbx_op_find(const char *name, size_t n);

/* sbx_ops — the whole table, NULL-name terminated. */
extern const struct sbx_op_def sbx_ops[];

#endif
