/*
 * cli_mcp.c — `sbx mcp`: a Model Context Protocol server on stdio (issue 17;
 * docs/mcp.md).
 *
 * Transport (MCP 2025-06-18, "Transports", stdio): the client starts `sbx mcp`
 * and writes JSON-RPC 2.0 messages to its stdin, one per line (UTF-8, no
 * embedded newline); the answers go to stdout the same way; stdout carries
 * nothing else (diagnostics go to stderr).  The server speaks the protocol
 * version the client asks for when it is one it serves (runtime/mcp.h), else the
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
#include "../runtime/mcp.h"
#include "cli.h"
#include "cli_ops_gen.h"

/* The longest message read (a file.write of 40 MiB travels as JSON text). */
#define MCP_MAX_LINE (64u << 20)

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
        json_object_set_new(props, "sandbox", sbx_mcp_sandbox_schema());
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
    for (size_t i = 0; i < sbx_mcp_ntools; i++) {
        const struct cli_op *op = cli_op_find(sbx_mcp_tools[i].op);
        if (op) /* else not in this build's schema */
            json_array_append_new(arr, sbx_mcp_tool_entry(&sbx_mcp_tools[i], input_schema(op)));
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
    return send_msg(m, sbx_mcp_error(id, code, msg));
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
        json_t *r = sbx_mcp_tool_error(err.code, err.message);
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
        json_t *r = sbx_mcp_tool_error(err.code, err.message);
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
                json_t *note = sbx_mcp_progress(token, ++progress, ev.data, ev.data_len);
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
                res = sbx_mcp_tool_error(code, text);
            }
        }
    }
    if (rc < 0 && !res) {
        res = sbx_mcp_tool_error(err.code, err.message);
        sbx_error_free(&err);
    }
    sbx_stream_close(s);
    if (!res)
        res = sbx_mcp_tool_ok(sbx_mcp_exec_result(exit_code, out.p, out.n, errb.p, errb.n));
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
    const struct sbx_mcp_tool *t = sbx_mcp_tool_find(name);
    const struct cli_op *op = t ? cli_op_find(t->op) : NULL;
    if (!op) {
        *rpc_code = -32602;
        *rpc_msg = "Unknown tool";
        return NULL;
    }
    json_t *in = json_object_get(k->params, "arguments");
    if (in && !json_is_object(in))
        return sbx_mcp_tool_error("VALIDATION_FAILED", "arguments must be an object");
    json_t *args = in ? json_deep_copy(in) : json_object();
    json_t *sb = json_object_get(args, "sandbox");
    if (op->sandbox) {
        if (!json_is_string(sb) || json_string_length(sb) >= sizeof(k->sandbox)) {
            json_decref(args);
            return sbx_mcp_tool_error("VALIDATION_FAILED", "'sandbox' (a sandbox ID) is required");
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
        out = sbx_mcp_tool_error("VALIDATION_FAILED", "arguments could not be encoded");
    } else if (cli_check_call(op->name, sandbox, aj, &code, why, sizeof(why)) != 0) {
        out = sbx_mcp_tool_error(code, why);
    } else if (!(c = client_of(k->m, &err))) {
        out = sbx_mcp_tool_error(err.code, err.message);
        sbx_error_free(&err);
    } else if (!strcmp(op->name, "exec")) {
        out = run_exec(k, c, aj);
    } else {
        sbx_reply *rep = NULL;
        if (sbx_call_json(c, op->name, sandbox, aj, 0, &rep, &err) != 0) {
            out = sbx_mcp_tool_error(err.code, err.message);
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
            out = sbx_mcp_tool_ok(res);
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
        send_msg(m, sbx_mcp_result(k->id, res));
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
            result = sbx_mcp_initialize(params);
        else if (!strcmp(method, "ping"))
            result = json_object();
        else if (!strcmp(method, "tools/list"))
            result = tools_list();
        if (result)
            rc = send_msg(m, sbx_mcp_result(id, result));
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
