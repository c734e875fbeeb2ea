/* ops.c — the table of operations; see ops.h and docs/protocol.md. */
#include "ops.h"

#include <string.h>

#include "err.h"

#define S SBX_OP_SANDBOX
#define A SBX_OP_AGENT
#define NC SBX_OP_NOCREATE
#define NW SBX_OP_NOWAKE
#define G SBX_OP_GLOBAL
#define M SBX_OP_MUTATES
#define ST SBX_OP_STREAM

const struct sbx_op_def sbx_ops[] = {
    /* commands */
    {"exec", S | A, 0, "run a shell string or an argv in the sandbox and return its output", NULL},
    {"exec.stream", S | A | ST, 0, "run a command; its output comes as stream events", NULL},
    {"stream.read", S | A | NC | NW, SBX_E_STREAM_NOT_FOUND,
     "events of a stream after a sequence number (long poll)", NULL},
    {"stream.cancel", S | A | NC | NW, SBX_E_STREAM_NOT_FOUND,
     "cancel a stream (stops its command or watch)",
     "DELETE /v1/sandboxes/{sandbox}/streams/{streamId}"},
    /* sessions */
    {"session.create", S | A, 0, "create a session: a persistent shell with its own cwd and env",
     NULL},
    {"session.get", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND, "describe a session",
     "GET /v1/sandboxes/{sandbox}/sessions/{id}"},
    {"session.list", S | A | NC, 0, "the sessions of the sandbox",
     "GET /v1/sandboxes/{sandbox}/sessions"},
    {"session.delete", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND,
     "end a session's shell and its processes", "DELETE /v1/sandboxes/{sandbox}/sessions/{id}"},
    /* background processes */
    {"process.start", S | A, 0, "start a background process", NULL},
    {"process.list", S | A | NC, 0, "the processes of the sandbox",
     "GET /v1/sandboxes/{sandbox}/processes"},
    {"process.get", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND, "describe a process",
     "GET /v1/sandboxes/{sandbox}/processes/{processId}"},
    {"process.kill", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND,
     "SIGTERM the process tree, SIGKILL after 5 s",
     "DELETE /v1/sandboxes/{sandbox}/processes/{processId}"},
    {"process.killAll", S | A | NC, 0, "kill every process", "DELETE /v1/sandboxes/{sandbox}/processes"},
    {"process.logs", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND, "a process's retained output",
     "GET /v1/sandboxes/{sandbox}/processes/{processId}/logs"},
    {"process.waitForLog", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND,
     "wait for a line matching a string or regex", NULL},
    {"process.waitForPort", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND,
     "wait until a port answers (HTTP or TCP)", NULL},
    {"process.waitForExit", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND, "wait for a process to end",
     NULL},
    /* files */
    {"file.write", S | A, 0, "write a file (utf-8 or base64)", NULL},
    {"file.read", S | A, 0, "read a file (text or base64, MIME type detected)", NULL},
    {"file.readStream", S | A | ST, 0, "read a file as a stream of chunks", NULL},
    {"file.mkdir", S | A, 0, "create a directory", NULL},
    {"file.delete", S | A, 0, "delete a file (not a directory)", NULL},
    {"file.rename", S | A, 0, "rename a file or directory", NULL},
    {"file.move", S | A, 0, "move a file or directory", NULL},
    {"file.list", S | A, 0, "list a directory (optionally recursive)", NULL},
    {"file.exists", S | A, 0, "whether a path exists", NULL},
    {"file.watch", S | A | ST, 0, "watch a directory; changes come as stream events", NULL},
    {"git.checkout", S | A, 0, "clone a git repository into the sandbox", NULL},
    /* code interpreter */
    {"context.create", S | A, 0, "create a Python, JavaScript or TypeScript code context", NULL},
    {"context.run", S | A, 0, "run code in a context (or the language's default one)", NULL},
    {"context.runStream", S | A | ST, 0, "run code; outputs come as stream events as produced",
     NULL},
    {"context.list", S | A | NC, 0, "the code contexts of the sandbox",
     "GET /v1/sandboxes/{sandbox}/contexts"},
    {"context.delete", S | A | NC | NW, SBX_E_CONTEXT_NOT_FOUND, "delete a code context",
     "DELETE /v1/sandboxes/{sandbox}/contexts/{contextId}"},
    /* terminals */
    {"terminal.open", S | A, 0,
     "open (or join) the pseudo-terminal of a session; its output is stream pty:<session>", NULL},
    {"terminal.write", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND, "type bytes into a terminal",
     NULL},
    {"terminal.resize", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND, "set a terminal's size", NULL},
    {"terminal.close", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND,
     "end a terminal's shell (every viewer sees it exit)", NULL},
    /* preview URLs */
    {"port.expose", S | M, 0, "expose a port of the sandbox at a preview URL", NULL},
    {"port.unexpose", S | NC | NW | M, 0, "withdraw a port's preview URL",
     "DELETE /v1/sandboxes/{sandbox}/ports/{port:int}"},
    {"port.list", S | NC | NW, 0, "the ports exposed for the current container",
     "GET /v1/sandboxes/{sandbox}/ports"},
    {"preview.resolve", S | NC | NW | SBX_OP_FRONT, 0,
     "check a preview URL's port and token; where to relay it (used by the HTTP front)", NULL},
    /* lifecycle and configuration */
    {"ping", S | A, 0, "start the sandbox if needed and check its agent", NULL},
    {"env.set", S | M, 0, "set or unset sandbox environment variables", NULL},
    {"sandbox.configure", S | M, 0, "set sleepAfter and keepAlive", NULL},
    {"create", S | M, 0, "create the sandbox now (it is also created by its first operation)",
     "PUT /v1/sandboxes/{sandbox}"},
    {"destroy", S | NC | NW | M, 0, "stop the sandbox's container and delete its metadata",
     "DELETE /v1/sandboxes/{sandbox}"},
    {"status", S | NC | NW, 0, "state, limits and resource use of a sandbox",
     "GET /v1/sandboxes/{sandbox}"},
    {"list", G, 0, "all sandboxes of the deployment", "GET /v1/sandboxes"},
    {"cluster.status", G, 0, "gateway and shard health", "GET /v1/cluster"},
    {"cluster.drain", G | M, 0,
     "drain a shard (its partitions move to the others) or end a drain", NULL},
    /* between shards */
    {"partition.import", SBX_OP_INTERNAL, 0,
     "handoff: the records of partitions moving to this shard (shard to shard)", NULL},
    {NULL, 0, 0, NULL, NULL},
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
