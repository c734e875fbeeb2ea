/* ops.c — the table of operations; see ops.h and docs/protocol.md. */
#include "ops.h"

#include <string.h>

const struct sbx_op_def sbx_ops[] = {
    {"exec", SBX_OP_SANDBOX | SBX_OP_AGENT,
     "run a shell string or an argv in the sandbox and return its output"},
    {"ping", SBX_OP_SANDBOX | SBX_OP_AGENT, "start the sandbox if needed and check its agent"},
    {"create", SBX_OP_SANDBOX | SBX_OP_MUTATES,
     "create the sandbox now (it is also created by its first operation)"},
    {"destroy", SBX_OP_SANDBOX | SBX_OP_NOCREATE | SBX_OP_NOWAKE | SBX_OP_MUTATES,
     "stop the sandbox's container and delete its metadata (idempotent)"},
    {"status", SBX_OP_SANDBOX | SBX_OP_NOCREATE | SBX_OP_NOWAKE,
     "state, limits and resource use of a sandbox"},
    {"list", SBX_OP_GLOBAL, "all sandboxes of the deployment"},
    {"cluster.status", SBX_OP_GLOBAL, "gateway and shard health"},
    {NULL, 0, NULL},
};

const struct sbx_op_def *
sbx_op_find(const char *name, size_t n)
{
    for (const struct sbx_op_def *d = sbx_ops; d->name; d++) {
        if (strlen(d->name) == n && memcmp(d->name, name, n) == 0)
            return d;
    }
    return NULL;
}
