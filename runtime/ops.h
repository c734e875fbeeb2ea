/*
 * ops.h — the table of operations and the one intake check of a request.
 *
 * Every operation of the protocol is declared once, in runtime/ops.yaml
 * (docs/schema.md); tools/gen_ops.py generates the table sbx_ops[] and each
 * op's argument specs (runtime/ops_gen.c, enum sbx_op_id in ops_gen.h) and
 * the shard's and agent's dispatch tables from it.  Gateways and shards
 * check a request with sbx_op_intake (the same rules at both), the shard
 * dispatches with it, the HTTP front (gateway/http.c) derives its routes from
 * it.  An op the table does not know is UNKNOWN_OPERATION everywhere.
 */
#ifndef SBX_OPS_H
#define SBX_OPS_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ops_gen.h"

struct sbx_req;

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
    SBX_OP_READONLY = 1 << 9,  /* an agent op that only reads: running it again changes
                                * nothing, so its reply is not written to the store */
    SBX_OP_OBSERVE = 1 << 10,  /* looks at the sandbox without using it: not activity for
                                * sleepAfter (polling it lets the sandbox sleep) */
    SBX_OP_NODE = 1 << 11,     /* about one node (its image store, docs/images.md): the gateway
                                * sends it to one shard, the owner of partition 0 */
};

/* The msgpack kinds an argument accepts (a bit set). */
enum sbx_arg_kind {
    SBX_ARG_STR = 1 << 0,
    SBX_ARG_BIN = 1 << 1,
    SBX_ARG_INT = 1 << 2,   /* any msgpack integer, or a float with an integral value */
    SBX_ARG_FLOAT = 1 << 3,
    SBX_ARG_BOOL = 1 << 4,
    SBX_ARG_MAP = 1 << 5,
    SBX_ARG_ARRAY = 1 << 6,
};

/* One top-level argument of an op, as runtime/ops.yaml declares it. */
struct sbx_arg {
    const char *name;
    unsigned kinds;            /* enum sbx_arg_kind bits */
    bool required;             /* nil counts as absent */
    bool has_min, has_max;
    double min, max;           /* inclusive bounds of a number, in `unit` */
    uint32_t max_len;          /* most bytes of a string, items of an array, entries of
                                * a map; 0: no bound */
    const char *const *enums;  /* the allowed strings (NULL-terminated), or NULL */
    const char *type;          /* for messages: "an integer", "a string or an array" */
    const char *unit;          /* "ms", "bytes", "s", … or NULL */
    int code;                  /* the error when its check fails; 0: SBX_E_VALIDATION */
};

struct sbx_op_def {
    const char *name;
    enum sbx_op_id id;
    unsigned flags;
    /* For SBX_OP_AGENT|SBX_OP_NOWAKE ops: the error code answered when the
     * sandbox has no running container (what the op refers to died with it). */
    int idle_code;
    /* ... or, when set, the success answered then instead: {success: true,
     * <idle_empty>: []} (a list op: a stopped sandbox has none of them). */
    const char *idle_empty;
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
    const struct sbx_arg *args; /* nargs entries; unknown arguments are ignored */
    unsigned nargs;
};

/* sbx_op_find — the definition of op (n bytes), or NULL. */
const struct sbx_op_def *sbx_op_find(const char *name, size_t n);

/* sbx_ops — the whole table, NULL-name terminated, in enum sbx_op_id order. */
extern const struct sbx_op_def sbx_ops[];

/*
 * sbx_op_check_args — check `args` (a msgpack map; NULL counts as empty)
 * against the argument specs of `def`: every required argument present, and
 * each declared one present of an accepted kind, within min/max, max_len and
 * enum.  Unknown arguments are ignored (docs/schema.md).  Returns 0, or
 * SBX_E_VALIDATION (or the argument's own `code`, e.g. SBX_E_INVALID_PORT)
 * with a message naming the argument in why[whylen].
 */
int sbx_op_check_args(const struct sbx_op_def *def, const msgpack_object *args, char *why,
                      size_t whylen);

/*
 * sbx_op_intake — the checks of a parsed request (runtime/wire.h
 * sbx_wire_parse_req) that gateways and shards share, in this order:
 *   the op exists (SBX_E_UNKNOWN_OP), and is not SBX_OP_INTERNAL when
 *   `from_client` (SBX_E_UNKNOWN_OP: internal ops are not for clients);
 *   a SBX_OP_SANDBOX op has a 'sandbox' (SBX_E_VALIDATION);
 *   `timeoutMs` is at most SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS,
 *   and the duration arguments every op shares ('timeout', 'commandTimeoutMs',
 *   'cloneTimeoutMs', 'interval') are 0 .. SBX_WIRE_MAX_DURATION_MS
 *   (SBX_E_VALIDATION);
 *   sbx_op_check_args.
 * *def is set as soon as the op is known (NULL before), so a caller can name
 * the op in its error reply.  Returns 0 or the negative code, with why[whylen].
 */
int sbx_op_intake(const struct sbx_req *req, bool from_client, const struct sbx_op_def **def,
                  char *why, size_t whylen);

#endif
