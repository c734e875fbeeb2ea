/*
 * mcp.c — see mcp.h: the tool table and the JSON shapes both MCP servers
 * (stdio: tools/cli_mcp.c; streamable HTTP: gateway/mcp_http.c) answer.
 * Specification: modelcontextprotocol.io/specification/2025-06-18 (server
 * "Tools", basic "Lifecycle", utilities "Progress").
 */
#include "mcp.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The protocol versions served, newest first. */
static const char *const mcp_versions[] = {"2025-11-25", "2025-06-18", "2025-03-26",
                                           "2024-11-05", NULL};

const struct sbx_mcp_tool sbx_mcp_tools[] = {
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
const size_t sbx_mcp_ntools = sizeof(sbx_mcp_tools) / sizeof(sbx_mcp_tools[0]);

const struct sbx_mcp_tool *
sbx_mcp_tool_find(const char *name)
{
    for (size_t i = 0; name && i < sbx_mcp_ntools; i++)
        if (!strcmp(sbx_mcp_tools[i].name, name))
            return &sbx_mcp_tools[i];
    return NULL;
}

const char *
sbx_mcp_version(const char *want)
{
    for (const char *const *v = mcp_versions; want && *v; v++)
        if (!strcmp(*v, want))
            return *v;
    return mcp_versions[0];
}

json_t *
sbx_mcp_initialize(const json_t *params)
{
    const char *want = json_string_value(json_object_get(params, "protocolVersion"));
    return json_pack("{s:s,s:{s:{s:b}},s:{s:s,s:s,s:s},s:s}", "protocolVersion",
                     sbx_mcp_version(want), "capabilities", "tools", "listChanged", 0,
                     "serverInfo", "name", "sbx", "title", "sbx code-execution sandboxes",
                     "version", "0.1.0", "instructions",
                     "Each tool takes a sandbox ID you choose (e.g. 'task-1'); the sandbox is "
                     "created on first use and keeps its files until sandbox_destroy.");
}

json_t *
sbx_mcp_sandbox_schema(void)
{
    return json_pack("{s:s,s:s,s:i,s:i,s:s}", "type", "string", "description",
                     "the sandbox ID: 1-63 of a-z, 0-9 and '-', not starting or ending with "
                     "'-' (you choose it; the same ID reaches the same sandbox)",
                     "minLength", 1, "maxLength", 63, "pattern",
                     "^[a-z0-9]([a-z0-9-]*[a-z0-9])?$");
}

json_t *
sbx_mcp_tool_entry(const struct sbx_mcp_tool *t, json_t *input_schema)
{
    json_t *e = json_pack("{s:s,s:s,s:s,s:o}", "name", t->name, "title", t->title,
                          "description", t->desc, "inputSchema", input_schema);
    if (!e)
        return NULL;
    bool ro = !strcmp(t->op, "file.read") || !strcmp(t->op, "file.list") || !strcmp(t->op, "list");
    json_object_set_new(e, "annotations", json_pack("{s:b,s:b}", "readOnlyHint", ro,
                                                    "destructiveHint", !strcmp(t->op, "destroy")));
    return e;
}

static json_t *
text_block(const char *text)
{
    return json_pack("{s:s,s:s}", "type", "text", "text", text);
}

json_t *
sbx_mcp_tool_error(const char *code, const char *msg)
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
add_images(json_t *content, const json_t *result)
{
    static const char *const fmt[][2] = {{"png", "image/png"}, {"jpeg", "image/jpeg"}};
    size_t i;
    json_t *r;
    json_array_foreach(json_object_get(result, "results"), i, r) {
        for (size_t k = 0; k < 2; k++) {
            json_t *d = json_object_get(r, fmt[k][0]);
            if (json_is_string(d))
                json_array_append_new(content, json_pack("{s:s,s:O,s:s}", "type", "image",
                                                         "data", d, "mimeType", fmt[k][1]));
        }
    }
}

/* The result as JSON text, with png/jpeg replaced by a note (they travel
 * once, as image content). */
static json_t *
json_text_without_images(const json_t *result)
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

json_t *
sbx_mcp_tool_ok(json_t *res)
{
    json_t *content = json_array();
    json_array_append_new(content, json_text_without_images(res));
    add_images(content, res);
    return json_pack("{s:o,s:o,s:b}", "content", content, "structuredContent", res, "isError", 0);
}

json_t *
sbx_mcp_exec_result(int exit_code, const char *out, size_t nout, const char *err, size_t nerr)
{
    return json_pack("{s:b,s:i,s:s%,s:s%}", "success", exit_code == 0, "exitCode", exit_code,
                     "stdout", out ? out : "", out ? nout : 0, "stderr", err ? err : "",
                     err ? nerr : 0);
}

json_t *
sbx_mcp_result(const json_t *id, json_t *result)
{
    return json_pack("{s:s,s:O,s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "result",
                     result);
}

json_t *
sbx_mcp_error(const json_t *id, int code, const char *msg)
{
    return json_pack("{s:s,s:O,s:{s:i,s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(),
                     "error", "code", code, "message", msg);
}

json_t *
sbx_mcp_progress(const json_t *token, long n, const char *data, size_t len)
{
    if (len > 4096) { /* cut at a character boundary */
        len = 4096;
        while (len > 0 && ((unsigned char)data[len] & 0xC0) == 0x80)
            len--;
    }
    json_t *msg = json_stringn(data, len);
    if (!msg)
        msg = json_string("(output that is not UTF-8)");
    return json_pack("{s:s,s:s,s:{s:O,s:i,s:o}}", "jsonrpc", "2.0", "method",
                     "notifications/progress", "params", "progressToken", token, "progress", n,
                     "message", msg);
}
