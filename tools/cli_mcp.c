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
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* context.run: the images of its rich results as image content; png and
 * jpeg are then left out of the JSON text (they travel once). */
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

static json_t *
tools_call(struct gopts *g, sbx_client **c, json_t *params, int *rpc_code, const char **rpc_msg)
{
    const char *name = json_string_value(json_object_get(params, "name"));
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
    json_t *in = json_object_get(params, "arguments");
    if (in && !json_is_object(in))
        return tool_error("VALIDATION_FAILED", "arguments must be an object");
    json_t *args = in ? json_deep_copy(in) : json_object();
    char sandbox[80] = "";
    json_t *sb = json_object_get(args, "sandbox");
    if (op->sandbox) {
        if (!json_is_string(sb) || json_string_length(sb) >= sizeof(sandbox)) {
            json_decref(args);
            return tool_error("VALIDATION_FAILED", "'sandbox' (a sandbox ID) is required");
        }
        snprintf(sandbox, sizeof(sandbox), "%s", json_string_value(sb));
    }
    json_object_del(args, "sandbox");
    char *aj = json_dumps(args, JSON_COMPACT);
    json_decref(args);
    const char *code = NULL;
    char why[512];
    json_t *out = NULL;
    if (!aj) {
        out = tool_error("VALIDATION_FAILED", "arguments could not be encoded");
    } else if (cli_check_call(op->name, op->sandbox ? sandbox : NULL, aj, &code, why,
                              sizeof(why)) != 0) {
        out = tool_error(code, why);
    } else {
        sbx_error err;
        if (!*c && sbx_client_open(c, g->gateway, &err) != 0) {
            out = tool_error(err.code, err.message);
            sbx_error_free(&err);
            *c = NULL;
        } else {
            if (g->timeout_ms > 0)
                sbx_client_set_timeout(*c, g->timeout_ms);
            sbx_reply *rep = NULL;
            if (sbx_call_json(*c, op->name, op->sandbox ? sandbox : NULL, aj, 0, &rep, &err) !=
                0) {
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
                json_t *content = json_array();
                json_array_append_new(content, json_text_without_images(res));
                add_images(content, res);
                out = json_pack("{s:o,s:o,s:b}", "content", content, "structuredContent", res,
                                "isError", 0);
            }
        }
    }
    free(aj);
    return out;
}

/* ---------------------------------------------------------------------------- */
/* JSON-RPC over stdio */

static int
send_msg(json_t *m)
{
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    if (!s)
        return -1;
    size_t n = strlen(s);
    s[n] = '\n'; /* replaces the NUL: written with its length */
    int rc = cli_write_full(STDOUT_FILENO, s, n + 1);
    free(s);
    return rc;
}

static int
send_error(json_t *id, int code, const char *msg)
{
    return send_msg(json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id",
                              id ? id : json_null(), "error", "code", code, "message", msg));
}

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

/* One message; 0 to go on, -1 when stdout is gone. */
static int
handle(struct gopts *g, sbx_client **c, const char *line, size_t len)
{
    json_error_t je;
    json_t *m = json_loadb(line, len, 0, &je);
    if (!m)
        return send_error(NULL, -32700, "Parse error");
    json_t *id = json_object_get(m, "id");
    const char *method = json_string_value(json_object_get(m, "method"));
    const char *ver = json_string_value(json_object_get(m, "jsonrpc"));
    int rc = 0;
    if (!json_is_object(m) || !ver || strcmp(ver, "2.0") ||
        (id && !json_is_string(id) && !json_is_integer(id))) {
        rc = send_error(json_is_object(m) ? id : NULL, -32600, "Invalid Request");
    } else if (!method) {
        /* a response (to nothing we asked): ignored */
    } else if (!id) {
        /* a notification (initialized, cancelled, ...): nothing to answer; requests run
         * one at a time, so a cancellation arrives after its request ended */
    } else {
        json_t *params = json_object_get(m, "params");
        json_t *result = NULL;
        int code = -32601;
        const char *msg = "Method not found";
        if (!strcmp(method, "initialize"))
            result = initialize(params);
        else if (!strcmp(method, "ping"))
            result = json_object();
        else if (!strcmp(method, "tools/list"))
            result = tools_list();
        else if (!strcmp(method, "tools/call"))
            result = tools_call(g, c, params, &code, &msg);
        if (result)
            rc = send_msg(json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id, "result", result));
        else
            rc = send_error(id, code, msg);
    }
    json_decref(m);
    return rc;
}

/* sbx mcp — serve MCP on stdin/stdout until stdin ends. */
int
v_mcp(struct gopts *g, int argc, char **argv)
{
    (void)argv;
    if (argc > 0) {
        fprintf(stderr, "usage: sbx [--gateway URL] [--timeout D] mcp\n");
        return EXIT_USAGE;
    }
    sbx_client *c = NULL;
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
            if (send_error(NULL, -32600, "message too large") != 0)
                break;
            continue;
        }
        if (handle(g, &c, line, (size_t)n) != 0) {
            rc = EXIT_SBX; /* stdout closed */
            break;
        }
    }
    free(line);
    sbx_client_close(c);
    return rc;
}
