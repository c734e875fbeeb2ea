/*
 * http_openapi.c — the OpenAPI document of the HTTP front's routes, served
 * at GET /v1/openapi.json.  Built once at start (sbx_http_start), after
 * http_routes_build, from h->routes: every route with its path parameters,
 * summary and response media types.  The caller owns the returned document.
 */
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "../runtime/ops.h"
#include "http_int.h"

/* ------------------------------------------------------------------------------ */
/* The OpenAPI document. */

json_t *
http_openapi_build(struct sbx_http *h)
{
    json_t *paths = json_object();
    for (size_t i = 0; i < h->nroutes; i++) {
        const struct route *r = &h->routes[i];
        /* OpenAPI path templates: {name} only. */
        char tpl[256] = "";
        json_t *params = json_array();
        for (int j = 0; j < r->nseg; j++) {
            strncat(tpl, "/", sizeof(tpl) - strlen(tpl) - 1);
            if (r->seg[j][0] != '{') {
                strncat(tpl, r->seg[j], sizeof(tpl) - strlen(tpl) - 1);
                continue;
            }
            char name[64];
            snprintf(name, sizeof(name), "%s", r->seg[j] + 1);
            name[strcspn(name, ":*}")] = 0;
            bool is_int = strstr(r->seg[j], ":int") != NULL;
            bool rest = strchr(r->seg[j], '*') != NULL;
            strncat(tpl, "{", sizeof(tpl) - strlen(tpl) - 1);
            strncat(tpl, name, sizeof(tpl) - strlen(tpl) - 1);
            strncat(tpl, "}", sizeof(tpl) - strlen(tpl) - 1);
            json_array_append_new(
                params,
                json_pack("{s:s,s:s,s:b,s:{s:s},s:s}", "name", name, "in", "path", "required", 1,
                          "schema", "type", is_int ? "integer" : "string", "description",
                          !strcmp(name, "sandbox")
                              ? "sandbox ID (1-63 characters, see docs/protocol.md)"
                          : rest ? "absolute path inside the sandbox, slashes included"
                                 : "operation argument of the same name"));
        }
        json_t *item = json_object_get(paths, tpl);
        if (!item) {
            item = json_object();
            json_object_set_new(paths, tpl, item);
        }
        json_t *op = json_object();
        const char *summary = r->op ? r->op->summary : "";
        char opid[128];
        switch (r->kind) {
        case R_HEALTH: summary = "liveness of the HTTP front"; snprintf(opid, sizeof(opid), "health"); break;
        case R_OPENAPI: summary = "this document"; snprintf(opid, sizeof(opid), "openapi"); break;
        case R_STREAM:
            summary = "a stream's events as Server-Sent Events (resume with Last-Event-ID)";
            snprintf(opid, sizeof(opid), "stream.events");
            break;
        case R_FILE_GET: summary = "a file's raw bytes"; snprintf(opid, sizeof(opid), "file.get"); break;
        case R_FILE_PUT:
            summary = "write a file from the raw request body";
            snprintf(opid, sizeof(opid), "file.put");
            break;
        case R_TERMINAL:
            summary = "the session's terminal over WebSocket (docs/http.md)";
            snprintf(opid, sizeof(opid), "terminal");
            break;
        default:
            snprintf(opid, sizeof(opid), "%s%s%s", r->op->name, r->canonical ? "" : ".",
                     r->canonical ? "" : r->method);
            break;
        }
        json_object_set_new(op, "operationId", json_string(opid));
        json_object_set_new(op, "summary", json_string(summary));
        if (json_array_size(params))
            json_object_set_new(op, "parameters", params);
        else
            json_decref(params);
        if (r->kind == R_OP && !strcmp(r->method, "POST"))
            json_object_set_new(op, "requestBody",
                                json_pack("{s:b,s:{s:{s:{s:s,s:b}}}}", "required", 0, "content",
                                          "application/json", "schema", "type", "object",
                                          "additionalProperties", 1));
        json_t *ok_content;
        if (r->kind == R_STREAM || (r->op && (r->op->flags & SBX_OP_STREAM)))
            ok_content = json_pack("{s:{s:{s:s}},s:{s:{s:s}}}", "text/event-stream", "schema",
                                   "type", "string", "application/json", "schema", "type",
                                   "object");
        else if (r->kind == R_FILE_GET)
            ok_content = json_pack("{s:{s:{s:s,s:s}}}", "application/octet-stream", "schema",
                                   "type", "string", "format", "binary");
        else
            ok_content = json_pack("{s:{s:{s:s}}}", "application/json", "schema", "type",
                                   "object");
        json_t *responses = json_pack(
            "{s:{s:s,s:o},s:{s:s,s:{s:{s:{s:s}}}}}", r->kind == R_TERMINAL ? "101" : "200",
            "description", r->kind == R_TERMINAL ? "switching to WebSocket" : "success",
            "content", ok_content, "default", "description", "error (docs/protocol.md §4)",
            "content", "application/json", "schema", "$ref", "#/components/schemas/Error");
        json_object_set_new(op, "responses", responses);
        if (r->kind != R_HEALTH && r->kind != R_OPENAPI)
            json_object_set_new(op, "security", json_pack("[{s:[]}]", "bearer"));
        char m[8];
        snprintf(m, sizeof(m), "%s", r->method);
        for (char *p = m; *p; p++)
            *p = (char)(*p - 'A' + 'a');
        json_object_set_new(item, m, op);
    }
    return json_pack(
        "{s:s,s:{s:s,s:s,s:s},s:o,s:{s:{s:{s:s,s:{s:{s:s},s:{s:s},s:{s:s},s:{s:s}},s:[s,s]}},"
        "s:{s:{s:s,s:s}}}}",
        "openapi", "3.0.3", "info", "title", "sbx HTTP API", "version", "1",
        "description", "Every operation of the sbx protocol (docs/protocol.md) over HTTP/JSON.",
        "paths", paths, "components", "schemas", "Error", "type", "object", "properties",
        "code", "type", "string", "message", "type", "string", "context", "type", "object",
        "httpStatus", "type", "integer", "required", "code", "message", "securitySchemes",
        "bearer", "type", "http", "scheme", "bearer");
}
