/*
 * openapi_gen.h — the OpenAPI 3.1 document of the HTTP API, built in.
 *
 * gateway/openapi_gen.c is generated from runtime/ops.yaml by
 * tools/gen_ops.py (tools/gen/out_openapi.py) together with
 * gateway/openapi.json, which holds the same bytes; `make gen-check` fails
 * when either is stale.  gateway/http.c serves it at GET /v1/openapi.json.
 */
#ifndef SBX_OPENAPI_GEN_H
#define SBX_OPENAPI_GEN_H

#include <stddef.h>

/* The document: UTF-8 JSON text, NUL-terminated, static (never freed). */
extern const char sbx_openapi_json[];
/* Its length in bytes, without the NUL. */
extern const size_t sbx_openapi_json_len;

#endif
