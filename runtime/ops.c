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

const struct sbx_op_def sbx_ops[] = {
    /* commands */
    {"exec", S | A, 0, "run a shell string or an argv in the sandbox and return its output"},
    {"exec.stream", S | A, 0, "run a command; its output comes as stream events"},
    {"stream.read", S | A | NC | NW, SBX_E_STREAM_NOT_FOUND,
     "events of a stream after a sequence number (long poll)"},
    {"stream.cancel", S | A | NC | NW, SBX_E_STREAM_NOT_FOUND,
     "cancel a stream (stops its command or watch)"},
    /* sessions */
    {"session.create", S | A, 0, "create a session: a persistent shell with its own cwd and env"},
    {"session.get", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND, "describe a session"},
    {"session.list", S | A | NC, 0, "the sessions of the sandbox"},
    {"session.delete", S | A | NC | NW, SBX_E_SESSION_NOT_FOUND,
     "end a session's shell and its processes"},
    /* background processes */
    {"process.start", S | A, 0, "start a background process"},
    {"process.list", S | A | NC, 0, "the processes of the sandbox"},
    {"process.get", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND, "describe a process"},
    {"process.kill", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND,
     "SIGTERM the process tree, SIGKILL after 5 s"},
    {"process.killAll", S | A | NC, 0, "kill every process"},
    {"process.logs", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND, "a process's retained output"},
    {"process.waitForLog", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND,
     "wait for a line matching a string or regex"},
    {"process.waitForPort", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND,
     "wait until a port answers (HTTP or TCP)"},
    {"process.waitForExit", S | A | NC | NW, SBX_E_PROCESS_NOT_FOUND, "wait for a process to end"},
    /* files */
    {"file.write", S | A, 0, "write a file (utf-8 or base64)"},
    {"file.read", S | A, 0, "read a file (text or base64, MIME type detected)"},
    {"file.readStream", S | A, 0, "read a file as a stream of chunks"},
    {"file.mkdir", S | A, 0, "create a directory"},
    {"file.delete", S | A, 0, "delete a file (not a directory)"},
    {"file.rename", S | A, 0, "rename a file or directory"},
    {"file.move", S | A, 0, "move a file or directory"},
    {"file.list", S | A, 0, "list a directory (optionally recursive)"},
    {"file.exists", S | A, 0, "whether a path exists"},
    {"file.watch", S | A, 0, "watch a directory; changes come as stream events"},
    {"git.checkout", S | A, 0, "clone a git repository into the sandbox"},
    /* code interpreter */
    {"context.create", S | A, 0, "create a Python, JavaScript or TypeScript code context"},
    {"context.run", S | A, 0, "run code in a context (or the language's default one)"},
    {"context.runStream", S | A, 0, "run code; outputs come as stream events as produced"},
    {"context.list", S | A | NC, 0, "the code contexts of the sandbox"},
    {"context.delete", S | A | NC | NW, SBX_E_CONTEXT_NOT_FOUND, "delete a code context"},
    /* lifecycle and configuration */
    {"ping", S | A, 0, "start the sandbox if needed and check its agent"},
    {"env.set", S | M, 0, "set or unset sandbox environment variables"},
    {"sandbox.configure", S | M, 0, "set sleepAfter and keepAlive"},
    {"create", S | M, 0, "create the sandbox now (it is also created by its first operation)"},
    {"destroy", S | NC | NW | M, 0, "stop the sandbox's container and delete its metadata"},
    {"status", S | NC | NW, 0, "state, limits and resource use of a sandbox"},
    {"list", G, 0, "all sandboxes of the deployment"},
    {"cluster.status", G, 0, "gateway and shard health"},
    {NULL, 0, 0, NULL},
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
