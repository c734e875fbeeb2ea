/*
 * cli_mcp.c — `sbx mcp`: a Model Context Protocol server on stdio (issue 17;
 * docs/mcp.md).
 *
 * Transport (MCP 2025-06-18, "Transports", stdio): the client starts `sbx mcp`
 * and writes JSON-RPC 2.0 messages to its stdin, one per line (UTF-8, no
 * embedded newline); the answers go to stdout the same way; stdout carries
 * nothing else (diagnostics go to stderr).  The server speaks the protocol
 * version the client asks for when it is one of mcp_versions, else the
 * newest of them (lifecycle: "Version Negotiation").  Requests are served
 * one at a time, in order; there is no batching (removed in 2025-06-18).
 *
 * Tools: each is one operation of the schema (runtime/ops.yaml) run through
 * the public client API.  Its input JSON Schema is built from the generated
 * copy of the schema the CLI already has (tools/cli_ops_gen.c: each
 * top-level argument's JSON kinds, bounds, length, enum, default and doc),
 * plus `sandbox` for the ops addressed to one.  A result is returned as
 * `structuredContent` (the op's result object) and, per the spec's advice
 * for older clients, as the same JSON in a text block; images a code cell
 * produced (png/jpeg) become MCP image content.  Failures of the operation
 * — bad arguments, a sandbox error, an unreachable gateway — are tool
 * results with isError: true and "CODE: message" (docs/errors.md) as text;
 * JSON-RPC errors are kept for the protocol: -32700 parse error, -32600
 * invalid request, -32601 unknown method, -32602 unknown tool.
 *
 * The gateway is connected on the first tool call, so a client can list the
 * tools without a running daemon.
 *
 * Concurrency: the main thread reads stdin and answers initialize, ping and
 * tools/list itself; each tools/call runs on a thread of its own (at most
 * MCP_MAX_CALLS at once; the client is thread-safe), so a long exec does not
 * hold up the others and a notifications/cancelled naming it is read while
 * it runs.  Answers may come out of order (JSON-RPC matches them by id);
 * each message is written whole under one lock.  exec runs as exec.stream:
 * cancelling it stops the command (stream.cancel, which kills its process
 * tree) and the request gets no answer (MCP "Cancellation"); with a
 * progressToken in the request's _meta, each chunk of its output is sent as
 * notifications/progress while it runs (MCP "Progress").
 */
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../include/sbx/result.h"
#include "cli.h"
#include "cli_ops_gen.h"

/* The protocol versions served, newest first. */
static const char *const mcp_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                           "2024-11-05", NULL};

/* The longest message read (a file.write of 40 MiB travels as JSON text). */
#define MCP_MAX_LINE (64u << 20)

struct mcp_tool {
    const char *name;  /* MCP tool name */
    const char *op;    /* the operation it runs */
    const char *title; /* human-readable */
    const char *desc;  /* what an agent reads to choose it */
};

static const struct mcp_tool tools[] = {
    {"sandbox_create", "create", "Create a sandbox",
     "Create the sandbox now (an isolated Linux container addressed by the ID you choose; any "
     "other tool also creates it on first use). Optional resource limits."},
    {"sandbox_destroy", "destroy", "Destroy a sandbox",
     "Stop the sandbox's container and delete it with its files."},
    {"sandbox_list", "list", "List sandboxes", "All sandboxes of the deployment."},
    {"exec", "exec", "Run a command",
     "Run a shell command (or an argv) in the sandbox and return its exit code, stdout and "
     "stderr. Commands of one session share cwd and environment."},
    {"file_read", "file.read", "Read a file", "Read a file of the sandbox (text, or base64)."},
    {"file_write", "file.write", "Write a file",
     "Write a file in the sandbox (utf-8 text, or base64 with encoding: base64)."},
    {"file_list", "file.list", "List a directory",
     "List a directory of the sandbox, optionally recursively."},
    {"run_code", "context.run", "Run code",
     "Run Python, JavaScript or TypeScript in a persistent interpreter context of the sandbox; "
     "returns printed output, rich results (images come as image content) and any error."},
    {"process_start", "process.start", "Start a background process",
     "Start a long-running process (a server, a watcher) in the sandbox; returns its ID."},
    {"port_expose", "port.expose", "Expose a port",
     "Expose a port a process of the sandbox listens on at a preview URL."},
};
#define NTOOLS (sizeof(tools) / sizeof(tools[0]))

/* ---------------------------------------------------------------------------- */
/* Input schemas from the operation schema. */

static json_t *
kind_types(unsigned k)
{
    json_t *a = json_array();
    if (k & CLI_K_STR)
        json_array_append_new(a, json_string("string"));
    if ((k & CLI_K_INT) && !(k & CLI_K_REAL))
        json_array_append_new(a, json_string("integer"));
    if (k & CLI_K_REAL)
        json_array_append_new(a, json_string("number"));
    if (k & CLI_K_BOOL)
        json_array_append_new(a, json_string("boolean"));
    if (k & CLI_K_OBJECT)
        json_array_append_new(a, json_string("object"));
    if (k & CLI_K_ARRAY)
        json_array_append_new(a, json_string("array"));
    if (json_array_size(a) == 1) {
        json_t *one = json_incref(json_array_get(a, 0));
        json_decref(a);
        return one;
    }
    return a;
}

/* A bound: an integer when it is one (JSON Schema compares numbers, but 0
 * reads better than 0.0). */
static json_t *
number(double v)
{
    return v == (double)(json_int_t)v ? json_integer((json_int_t)v) : json_real(v);
}

/* One argument as a JSON Schema property. */
static json_t *
arg_schema(const struct cli_arg *a)
{
    json_t *p = json_object();
    if (a->kinds)
        json_object_set_new(p, "type", kind_types(a->kinds));
    char desc[512];
    snprintf(desc, sizeof(desc), "%s%s%s%s", a->doc ? a->doc : "", a->unit ? " (" : "",
             a->unit ? a->unit : "", a->unit ? ")" : "");
    json_object_set_new(p, "description", json_string(desc));
    if (a->enums) {
        json_t *e = json_array();
        for (const char *const *v = a->enums; *v; v++)
            json_array_append_new(e, json_string(*v));
        json_object_set_new(p, "enum", e);
    }
    bool numeric = a->kinds & (CLI_K_INT | CLI_K_REAL);
    if (numeric && a->has_min)
        json_object_set_new(p, "minimum", number(a->min));
    if (numeric && a->has_max)
        json_object_set_new(p, "maximum", number(a->max));
    if (a->max_len && a->kinds == CLI_K_STR)
        json_object_set_new(p, "maxLength", json_integer(a->max_len));
    if (a->max_len && a->kinds == CLI_K_ARRAY)
        json_object_set_new(p, "maxItems", json_integer(a->max_len));
    if (a->def) {
        json_t *d = json_loads(a->def, JSON_DECODE_ANY, NULL);
        if (d)
            json_object_set_new(p, "default", d);
    }
    return p;
}

static json_t *
input_schema(const struct cli_op *op)
{
    json_t *props = json_object(), *req = json_array();
    if (op->sandbox) {
        json_object_set_new(
            props, "sandbox",
            json_pack("{s:s,s:s,s:i,s:i,s:s}", "type", "string", "description",
                      "the sandbox ID: 1-63 of a-z, 0-9 and '-', not starting or ending with "
                      "'-' (you choose it; the same ID reaches the same sandbox)",
                      "minLength", 1, "maxLength", 63, "pattern",
                      "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$"));
        json_array_append_new(req, json_string("sandbox"));
    }
    for (unsigned i = 0; i < op->nargs; i++) {
        const struct cli_arg *a = &op->args[i];
        json_object_set_new(props, a->name, arg_schema(a));
        if (a->required)
            json_array_append_new(req, json_string(a->name));
    }
    json_t *s = json_pack("{s:s,s:o}", "type", "object", "properties", props);
    if (json_array_size(req))
        json_object_set_new(s, "required", req);
    else
        json_decref(req);
    return s;
}

static json_t *
tools_list(void)
{
    json_t *arr = json_array();
    for (size_t i = 0; i < NTOOLS; i++) {
        const struct cli_op *op = cli_op_find(tools[i].op);
        if (!op)
            continue; /* not in this build's schema */
        json_t *t = json_pack("{s:s,s:s,s:s,s:o}", "name", tools[i].name, "title", tools[i].title,
                              "description", tools[i].desc, "inputSchema", input_schema(op));
        bool ro = !strcmp(tools[i].op, "file.read") || !strcmp(tools[i].op, "file.list") ||
                  !strcmp(tools[i].op, "list");
        json_object_set_new(t, "annotations",
                            json_pack("{s:b,s:b}", "readOnlyHint", ro, "destructiveHint",
                                      !strcmp(tools[i].op, "destroy")));
        json_array_append_new(arr, t);
    }
    return json_pack("{s:o}", "tools", arr);
}

/* ---------------------------------------------------------------------------- */
/* The server's state, shared by the reader (main thread) and the calls. */

struct call;

struct mcp {
    struct gopts *g;
    pthread_mutex_t mu;   /* everything below, and stdout */
    pthread_cond_t done;  /* a call ended */
    sbx_client *c;        /* opened on the first tool call; owned */
    struct call *calls;   /* running tools/call requests */
    int ncalls;
};

/* One tools/call, run on its own thread.  Owned by that thread; linked in
 * m->calls while it runs (fields marked "mu" are read by the reader). */
struct call {
    struct call *next;
    struct mcp *m;
    json_t *id;            /* the request's id; owned */
    json_t *params;        /* owned */
    char sandbox[80];
    char stream[96];       /* mu: exec's stream once started ("" before) */
    bool cancelled;        /* mu: notifications/cancelled named it */
};

/* Calls running at once; the reader waits for one to end beyond this. */
#define MCP_MAX_CALLS 16

/* Write one message (taken) and a newline, whole, under m->mu; 0, or -1
 * when stdout is gone. */
static int
send_msg(struct mcp *m, json_t *msg)
{
    char *s = json_dumps(msg, JSON_COMPACT);
    json_decref(msg);
    if (!s)
        return -1;
    size_t n = strlen(s);
    s[n] = '\n'; /* replaces the NUL: written with its length */
    pthread_mutex_lock(&m->mu);
    int rc = cli_write_full(STDOUT_FILENO, s, n + 1);
    pthread_mutex_unlock(&m->mu);
    free(s);
    return rc;
}

static int
send_error(struct mcp *m, json_t *id, int code, const char *msg)
{
    return send_msg(m, json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id",
                                 id ? id : json_null(), "error", "code", code, "message", msg));
}

/* The client, opened once (thread-safe: include/sbx/sbx.h); NULL with *err. */
static sbx_client *
client_of(struct mcp *m, sbx_error *err)
{
    pthread_mutex_lock(&m->mu);
    sbx_tls_files tls = cli_tls(m->g);
    if (!m->c && sbx_client_open_tls(&m->c, m->g->gateway, &tls, err) != 0)
        m->c = NULL;
    else if (m->g->timeout_ms > 0)
        sbx_client_set_timeout(m->c, m->g->timeout_ms);
    sbx_client *c = m->c;
    pthread_mutex_unlock(&m->mu);
    return c;
}

/* ---------------------------------------------------------------------------- */
/* tools/call */

static json_t *
text_block(const char *text)
{
    return json_pack("{s:s,s:s}", "type", "text", "text", text);
}

/* A tool result with isError: "CODE: message". */
static json_t *
tool_error(const char *code, const char *msg)
{
    char *t = NULL;
    if (asprintf(&t, "%s: %s", code, msg) < 0)
        return NULL;
    json_t *r = json_pack("{s:[o],s:b}", "content", text_block(t), "isError", 1);
    free(t);
    return r;
}

/* context.run: the images of its rich results as image content. */
static void
add_images(json_t *content, json_t *result)
{
    json_t *results = json_object_get(result, "results");
    size_t i;
    json_t *r;
    json_array_foreach(results, i, r) {
        static const char *const fmt[][2] = {{"png", "image/png"}, {"jpeg", "image/jpeg"}};
        for (size_t k = 0; k < 2; k++) {
            json_t *d = json_object_get(r, fmt[k][0]);
            if (!json_is_string(d))
                continue;
            json_array_append_new(content, json_pack("{s:s,s:O,s:s}", "type", "image", "data", d,
                                                     "mimeType", fmt[k][1]));
        }
    }
}

/* The result as JSON text, with png/jpeg replaced by a note (they travel
 * once, as image content). */
static json_t *
json_text_without_images(json_t *result)
{
    json_t *copy = json_deep_copy(result);
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(copy, "results"), i, r) {
        if (json_object_get(r, "png"))
            json_object_set_new(r, "png", json_string("(an image/png, as image content)"));
        if (json_object_get(r, "jpeg"))
            json_object_set_new(r, "jpeg", json_string("(an image/jpeg, as image content)"));
    }
    char *s = json_dumps(copy, JSON_INDENT(1) | JSON_SORT_KEYS);
    json_decref(copy);
    json_t *b = text_block(s ? s : "{}");
    free(s);
    return b;
}

/* A successful tool result from the operation's result object (taken). */
static json_t *
tool_ok(json_t *res)
{
    json_t *content = json_array();
    json_array_append_new(content, json_text_without_images(res));
    add_images(content, res);
    return json_pack("{s:o,s:o,s:b}", "content", content, "structuredContent", res, "isError", 0);
}

/* A growing byte string (stdout / stderr of a streamed exec). */
struct bytes {
    char *p;
    size_t n;
};

static void
bytes_add(struct bytes *b, const char *p, size_t n)
{
    char *q = realloc(b->p, b->n + n + 1);
    if (!q) {
        fprintf(stderr, "sbx mcp: out of memory\n");
        exit(EXIT_SBX);
    }
    memcpy(q + b->n, p, n);
    b->p = q;
    b->n += n;
    b->p[b->n] = 0;
}

/* exec as exec.stream (same arguments), so that it can be cancelled
 * (stream.cancel) and, with a progressToken, report its output as
 * notifications/progress while it runs.  The result has exec's fields
 * success, exitCode, stdout, stderr. */
static json_t *
run_exec(struct call *k, sbx_client *c, const char *aj)
{
    struct mcp *m = k->m;
    json_t *meta = json_object_get(k->params, "_meta");
    json_t *token = json_object_get(meta, "progressToken");
    sbx_reply *rep = NULL;
    sbx_error err;
    if (sbx_call_json(c, "exec.stream", k->sandbox, aj, 0, &rep, &err) != 0) {
        json_t *r = tool_error(err.code, err.message);
        sbx_error_free(&err);
        return r;
    }
    sbx_view sid = {"", 0};
    sbx_get_str(sbx_reply_result(rep), "streamId", &sid);
    pthread_mutex_lock(&m->mu);
    snprintf(k->stream, sizeof(k->stream), "%.*s", (int)sid.n, sid.p);
    bool cancelled = k->cancelled;
    pthread_mutex_unlock(&m->mu);
    sbx_reply_free(rep);
    if (cancelled) { /* named before its stream was known: stop it here */
        json_t *a = json_pack("{s:s}", "streamId", k->stream);
        char *as = json_dumps(a, JSON_COMPACT);
        json_decref(a);
        if (as && sbx_call_json(c, "stream.cancel", k->sandbox, as, 10000, &rep, &err) == 0)
            sbx_reply_free(rep);
        else if (as)
            sbx_error_free(&err);
        free(as);
        return NULL;
    }
    sbx_stream *s = NULL;
    if (sbx_stream_open(c, k->sandbox, k->stream, 0, &s, &err) != 0) {
        json_t *r = tool_error(err.code, err.message);
        sbx_error_free(&err);
        return r;
    }
    struct bytes out = {0}, errb = {0};
    int exit_code = -1, rc;
    json_t *res = NULL;
    long progress = 0;
    sbx_event ev;
    while ((rc = sbx_stream_next(s, &ev, &err)) == 1) {
        bool is_out = !strcmp(ev.type, "stdout"), is_err = !strcmp(ev.type, "stderr");
        if (is_out || is_err) {
            bytes_add(is_out ? &out : &errb, ev.data, ev.data_len);
            if (token) {
                char *msg = strndup(ev.data, CLI_MIN(ev.data_len, 4096));
                json_t *note = json_pack(
                    "{s:s,s:s,s:{s:O,s:i,s:s}}", "jsonrpc", "2.0", "method",
                    "notifications/progress", "params", "progressToken", token, "progress",
                    ++progress, "message", msg ? msg : "");
                free(msg);
                if (note)
                    send_msg(m, note);
            }
        }
        if (ev.has_exit_code)
            exit_code = ev.exit_code;
        if (!strcmp(ev.type, "error")) {
            const msgpack_object *e = NULL, *ctx;
            sbx_view cd = {"INTERNAL_ERROR", 14}, msg = {"", 0};
            int64_t ec;
            if (sbx_get_map(ev.obj, "error", &e) == 0) {
                sbx_get_str(e, "code", &cd);
                sbx_get_str(e, "message", &msg);
            }
            /* `exit N` in the session: the command's exit code, as a plain exec */
            if (sbx_view_eq(cd, "SESSION_TERMINATED") && sbx_get_map(e, "context", &ctx) == 0 &&
                sbx_get_i64(ctx, "exitCode", &ec) == 0) {
                exit_code = (int)ec;
            } else if (!res) {
                char code[64], text[1024];
                snprintf(code, sizeof(code), "%.*s", (int)cd.n, cd.p);
                snprintf(text, sizeof(text), "%.*s", (int)msg.n, msg.p);
                res = tool_error(code, text);
            }
        }
    }
    if (rc < 0 && !res) {
        res = tool_error(err.code, err.message);
        sbx_error_free(&err);
    }
    sbx_stream_close(s);
    if (!res)
        res = tool_ok(json_pack("{s:b,s:i,s:s%,s:s%}", "success", exit_code == 0, "exitCode",
                                exit_code, "stdout", out.p ? out.p : "", out.n, "stderr",
                                errb.p ? errb.p : "", errb.n));
    free(out.p);
    free(errb.p);
    return res;
}

/* Run a tools/call: its result, or NULL with a JSON-RPC error in
 * *rpc_code / *rpc_msg (or NULL and no error when it was cancelled). */
static json_t *
tools_call(struct call *k, int *rpc_code, const char **rpc_msg)
{
    const char *name = json_string_value(json_object_get(k->params, "name"));
    const struct mcp_tool *t = NULL;
    for (size_t i = 0; name && i < NTOOLS; i++)
        if (!strcmp(tools[i].name, name))
            t = &tools[i];
    const struct cli_op *op = t ? cli_op_find(t->op) : NULL;
    if (!op) {
        *rpc_code = -32602;
        *rpc_msg = "Unknown tool";
        return NULL;
    }
    json_t *in = json_object_get(k->params, "arguments");
    if (in && !json_is_object(in))
        return tool_error("VALIDATION_FAILED", "arguments must be an object");
    json_t *args = in ? json_deep_copy(in) : json_object();
    json_t *sb = json_object_get(args, "sandbox");
    if (op->sandbox) {
        if (!json_is_string(sb) || json_string_length(sb) >= sizeof(k->sandbox)) {
            json_decref(args);
            return tool_error("VALIDATION_FAILED", "'sandbox' (a sandbox ID) is required");
        }
        snprintf(k->sandbox, sizeof(k->sandbox), "%s", json_string_value(sb));
    }
    json_object_del(args, "sandbox");
    char *aj = json_dumps(args, JSON_COMPACT);
    json_decref(args);
    const char *sandbox = op->sandbox ? k->sandbox : NULL;
    const char *code = NULL;
    char why[512];
    json_t *out = NULL;
    sbx_error err;
    sbx_client *c;
    if (!aj) {
        out = tool_error("VALIDATION_FAILED", "arguments could not be encoded");
    } else if (cli_check_call(op->name, sandbox, aj, &code, why, sizeof(why)) != 0) {
        out = tool_error(code, why);
    } else if (!(c = client_of(k->m, &err))) {
        out = tool_error(err.code, err.message);
        sbx_error_free(&err);
    } else if (!strcmp(op->name, "exec")) {
        out = run_exec(k, c, aj);
    } else {
        sbx_reply *rep = NULL;
        if (sbx_call_json(c, op->name, sandbox, aj, 0, &rep, &err) != 0) {
            out = tool_error(err.code, err.message);
            sbx_error_free(&err);
        } else {
            char *rj = sbx_reply_json(rep, false);
            json_t *res = rj ? json_loads(rj, 0, NULL) : NULL;
            free(rj);
            sbx_reply_free(rep);
            if (!json_is_object(res)) {
                json_decref(res);
                res = json_object();
            }
            out = tool_ok(res);
        }
    }
    free(aj);
    return out;
}

static void *
call_main(void *arg)
{
    struct call *k = arg;
    struct mcp *m = k->m;
    int code = 0;
    const char *msg = NULL;
    json_t *res = tools_call(k, &code, &msg);
    pthread_mutex_lock(&m->mu);
    for (struct call **p = &m->calls; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    m->ncalls--;
    bool cancelled = k->cancelled;
    pthread_cond_broadcast(&m->done);
    pthread_mutex_unlock(&m->mu);
    /* A cancelled request gets no answer (MCP "Cancellation"). */
    if (!cancelled && res)
        send_msg(m, json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", k->id, "result", res));
    else if (!cancelled && code)
        send_error(m, k->id, code, msg);
    else
        json_decref(res);
    json_decref(k->id);
    json_decref(k->params);
    free(k);
    return NULL;
}

/* notifications/cancelled: mark the call; stop its command if one runs. */
static void
cancel(struct mcp *m, json_t *params)
{
    json_t *rid = json_object_get(params, "requestId");
    char stream[96] = "", sandbox[80] = "";
    pthread_mutex_lock(&m->mu);
    for (struct call *k = m->calls; rid && k; k = k->next)
        if (json_equal(k->id, rid)) {
            k->cancelled = true;
            snprintf(stream, sizeof(stream), "%s", k->stream);
            snprintf(sandbox, sizeof(sandbox), "%s", k->sandbox);
        }
    sbx_client *c = m->c;
    pthread_mutex_unlock(&m->mu);
    if (!stream[0] || !c)
        return; /* not an exec, or not started yet (run_exec stops it then) */
    json_t *a = json_pack("{s:s}", "streamId", stream);
    char *as = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    sbx_reply *rep = NULL;
    sbx_error err;
    if (as && sbx_call_json(c, "stream.cancel", sandbox, as, 10000, &rep, &err) == 0)
        sbx_reply_free(rep);
    else if (as)
        sbx_error_free(&err);
    free(as);
}

/* ---------------------------------------------------------------------------- */
/* JSON-RPC over stdio */

static json_t *
initialize(json_t *params)
{
    const char *want = json_string_value(json_object_get(params, "protocolVersion"));
    const char *ver = mcp_versions[0];
    for (const char *const *v = mcp_versions; want && *v; v++)
        if (!strcmp(*v, want))
            ver = *v;
    return json_pack("{s:s,s:{s:{s:b}},s:{s:s,s:s,s:s},s:s}", "protocolVersion", ver,
                     "capabilities", "tools", "listChanged", 0, "serverInfo", "name", "sbx",
                     "title", "sbx code-execution sandboxes", "version", "0.1.0", "instructions",
                     "Each tool takes a sandbox ID you choose (e.g. 'task-1'); the sandbox is "
                     "created on first use and keeps its files until sandbox_destroy.");
}

/* Start a tools/call on its own thread (waiting while MCP_MAX_CALLS run). */
static int
start_call(struct mcp *m, json_t *id, json_t *params)
{
    struct call *k = cli_xcalloc(1, sizeof(*k));
    k->m = m;
    /* copies: the call's thread owns them outright */
    k->id = json_deep_copy(id);
    k->params = params ? json_deep_copy(params) : json_object();
    pthread_mutex_lock(&m->mu);
    while (m->ncalls >= MCP_MAX_CALLS)
        pthread_cond_wait(&m->done, &m->mu);
    k->next = m->calls;
    m->calls = k;
    m->ncalls++;
    pthread_mutex_unlock(&m->mu);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, call_main, k);
    pthread_attr_destroy(&at);
    if (rc != 0)
        call_main(k); /* no thread: run it here */
    return 0;
}

/* One message; 0 to go on, -1 when stdout is gone. */
static int
handle(struct mcp *m, const char *line, size_t len)
{
    json_error_t je;
    json_t *msg = json_loadb(line, len, 0, &je);
    if (!msg)
        return send_error(m, NULL, -32700, "Parse error");
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    const char *ver = json_string_value(json_object_get(msg, "jsonrpc"));
    json_t *params = json_object_get(msg, "params");
    int rc = 0;
    if (!json_is_object(msg) || !ver || strcmp(ver, "2.0") ||
        (id && !json_is_string(id) && !json_is_integer(id))) {
        rc = send_error(m, json_is_object(msg) ? id : NULL, -32600, "Invalid Request");
    } else if (!method) {
        /* a response (to nothing we asked): ignored */
    } else if (!id) {
        /* a notification: initialized needs nothing; cancelled stops a call */
        if (!strcmp(method, "notifications/cancelled"))
            cancel(m, params);
    } else if (!strcmp(method, "tools/call")) {
        rc = start_call(m, id, params);
    } else {
        json_t *result = NULL;
        if (!strcmp(method, "initialize"))
            result = initialize(params);
        else if (!strcmp(method, "ping"))
            result = json_object();
        else if (!strcmp(method, "tools/list"))
            result = tools_list();
        if (result)
            rc = send_msg(m, json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result",
                                       result));
        else
            rc = send_error(m, id, -32601, "Method not found");
    }
    json_decref(msg);
    return rc;
}

/* sbx mcp — serve MCP on stdin/stdout until stdin ends (then wait for the
 * calls still running). */
int
v_mcp(struct gopts *g, int argc, char **argv)
{
    (void)argv;
    if (argc > 0) {
        fprintf(stderr, "usage: sbx [--gateway URL] [--timeout D] mcp\n");
        return EXIT_USAGE;
    }
    struct mcp m = {.g = g};
    pthread_mutex_init(&m.mu, NULL);
    pthread_cond_init(&m.done, NULL);
    char *line = NULL;
    size_t cap = 0;
    ssize_t n;
    int rc = 0;
    while ((n = getline(&line, &cap, stdin)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r'))
            n--;
        if (n == 0)
            continue;
        if ((size_t)n > MCP_MAX_LINE) {
            if (send_error(&m, NULL, -32600, "message too large") != 0)
                break;
            continue;
        }
        if (handle(&m, line, (size_t)n) != 0) {
            rc = EXIT_SBX; /* stdout closed */
            break;
        }
    }
    free(line);
    pthread_mutex_lock(&m.mu);
    while (m.ncalls > 0)
        pthread_cond_wait(&m.done, &m.mu);
    pthread_mutex_unlock(&m.mu);
    sbx_client_close(m.c);
    pthread_cond_destroy(&m.done);
    pthread_mutex_destroy(&m.mu);
    return rc;
}
