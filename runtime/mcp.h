/*
 * mcp.h — what the two Model Context Protocol servers share (issue 17;
 * docs/mcp.md): `sbx mcp` on stdio (tools/cli_mcp.c) and MCP over
 * streamable HTTP on the gateway's HTTP front (gateway/mcp_http.c).
 *
 * Pure JSON (jansson) with no state and no I/O, so both layers may link it
 * (runtime/ knows no layer above it): the tool table (which operation each
 * tool runs, its title and description), the protocol versions and the
 * initialize result, the shape of tool results (structuredContent + a text
 * block, images as image content, errors as isError: true with "CODE:
 * message"), and the JSON-RPC messages.  Each server builds a tool's input
 * JSON Schema from its own generated copy of runtime/ops.yaml (the CLI's
 * tools/cli_ops_gen.c, the front's OpenAPI document) and adds
 * sbx_mcp_sandbox_schema() for the ops addressed to a sandbox.
 *
 * Ownership: "taken" arguments are consumed (json_decref'd) even on
 * failure; every json_t returned is a new reference the caller owns; NULL
 * only when out of memory.
 */
#ifndef SBX_MCP_H
#define SBX_MCP_H

#include <jansson.h>
#include <stddef.h>

struct sbx_mcp_tool {
    const char *name;  /* MCP tool name */
    const char *op;    /* the operation it runs (runtime/ops.yaml) */
    const char *title; /* human-readable */
    const char *desc;  /* what an agent reads to choose it */
};

/* sbx_mcp_tools — every tool, sbx_mcp_ntools of them, in listing order. */
extern const struct sbx_mcp_tool sbx_mcp_tools[];
extern const size_t sbx_mcp_ntools;

/* sbx_mcp_tool_find — the tool called name (may be NULL), or NULL. */
const struct sbx_mcp_tool *sbx_mcp_tool_find(const char *name);

/* sbx_mcp_version — the protocol version to speak when the client asks for
 * want (may be NULL): want when served ("2025-11-25", "2025-06-18",
 * "2025-03-26", "2024-11-05"), else the newest (MCP lifecycle, "Version
 * Negotiation").  A static string. */
const char *sbx_mcp_version(const char *want);

/* sbx_mcp_initialize — the result of `initialize` for its params (borrowed;
 * may be NULL): version, capabilities {tools}, serverInfo, instructions. */
json_t *sbx_mcp_initialize(const json_t *params);

/* sbx_mcp_sandbox_schema — the JSON Schema of the `sandbox` argument every
 * tool of a sandbox op takes (an ID of docs/protocol.md §1). */
json_t *sbx_mcp_sandbox_schema(void);

/* sbx_mcp_tool_entry — one entry of tools/list: name, title, description,
 * inputSchema (taken) and annotations (readOnlyHint, destructiveHint). */
json_t *sbx_mcp_tool_entry(const struct sbx_mcp_tool *t, json_t *input_schema);

/* sbx_mcp_tool_error — a tool result with isError: true and the text
 * "code: msg" (code: sbx's stable error code, docs/errors.md). */
json_t *sbx_mcp_tool_error(const char *code, const char *msg);

/* sbx_mcp_tool_ok — a successful tool result from the operation's result
 * object (taken): structuredContent, the same JSON as a text block, and the
 * png/jpeg rich results of a code cell as image content (left out of the
 * text). */
json_t *sbx_mcp_tool_ok(json_t *res);

/* sbx_mcp_exec_result — exec's result fields {success, exitCode, stdout,
 * stderr} from a streamed exec's collected output (borrowed; n bytes each,
 * NULL for none). */
json_t *sbx_mcp_exec_result(int exit_code, const char *out, size_t nout, const char *err,
                            size_t nerr);

/* sbx_mcp_result — the JSON-RPC response {jsonrpc, id, result}; id borrowed,
 * result taken. */
json_t *sbx_mcp_result(const json_t *id, json_t *result);

/* sbx_mcp_error — the JSON-RPC error response for id (borrowed; NULL for
 * null): -32700 parse error, -32600 invalid request, -32601 unknown method,
 * -32602 invalid params (an unknown tool). */
json_t *sbx_mcp_error(const json_t *id, int code, const char *msg);

/* sbx_mcp_progress — notifications/progress for token (borrowed): progress
 * n and, as its message, the first 4 KiB of data[0..len) (an exec's output
 * chunk, MCP "Progress"). */
json_t *sbx_mcp_progress(const json_t *token, long n, const char *data, size_t len);

#endif
