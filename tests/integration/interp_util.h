/*
 * interp_util.h — what the code-context test binaries (test_interp.c,
 * test_interp_edges.c) share: running a cell and reading its reply.  Every
 * function asserts (Criterion) instead of returning an error.
 */
#ifndef SBX_TEST_INTERP_UTIL_H
#define SBX_TEST_INTERP_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include "../support/harness.h"

/* Run code in context ctx (lang: its language) of sandbox id with a deadline
 * in ms, and return the reply (caller sbx_reply_free's; asserting success of
 * the call itself). */
sbx_reply *run(sbx_client *c, const char *id, const char *ctx, const char *lang, const char *code,
               int64_t timeout);

/* The text/plain of the main result, or "" (heap, caller frees). */
char *main_text(sbx_reply *r);

/* The strings of logs.<which> ("stdout", "stderr") joined (heap, caller frees). */
char *joined_logs(sbx_reply *r, const char *which);

/* Whether the reply carries an error named `name`. */
bool has_error(sbx_reply *r, const char *name);

/* Whether any result carries field `f` (png, html, …). */
bool has_field(sbx_reply *r, const char *f);

/* context.create of language lang in sandbox id: the context id (heap,
 * caller frees). */
char *create_ctx(sbx_client *c, const char *id, const char *lang);

#endif
