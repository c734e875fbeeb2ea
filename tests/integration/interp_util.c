/*
 * interp_util.c — the code-context tests' shared helpers (interp_util.h).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../runtime/json.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "../support/harness.h"
#include "interp_util.h"

/* Run code and return the reply (asserting success of the call itself). */
sbx_reply *
run(sbx_client *c, const char *id, const char *ctx, const char *lang, const char *code,
    int64_t timeout)
{
    sbx_enc e;
    char *args;
    size_t alen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "code", code);
    if (ctx)
        sbx_enc_kstr(&e, "context", ctx);
    if (lang)
        sbx_enc_kstr(&e, "language", lang);
    if (timeout)
        sbx_enc_kint(&e, "timeout", timeout);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &args, &alen), 0);
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call(c, "context.run", id, args, alen, 120000, NULL, &r, &err);
    free(args);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "context.run failed: %s %s", err.code, err.message);
    return r;
}

/* The text/plain of the main result, or "" (static buffer per call site: copy). */
char *
main_text(sbx_reply *r)
{
    const msgpack_object *arr;
    if (sbx_wire_get_array(sbx_reply_result(r), "results", &arr) != 0)
        return sbx_xstrdup("");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        bool main = false;
        sbx_str t;
        sbx_wire_get_bool(&arr->via.array.ptr[i], "isMainResult", &main);
        if (main && sbx_wire_get_str(&arr->via.array.ptr[i], "text", &t) == 0)
            return sbx_str_dup(t);
    }
    return sbx_xstrdup("");
}

char *
joined_logs(sbx_reply *r, const char *which)
{
    const msgpack_object *logs, *arr;
    sbx_buf b;
    sbx_buf_init(&b);
    if (sbx_wire_get_map(sbx_reply_result(r), "logs", &logs) == 0 &&
        sbx_wire_get_array(logs, which, &arr) == 0)
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            sbx_str s;
            if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) == 0)
                sbx_buf_append(&b, s.p, s.n);
        }
    return sbx_buf_steal(&b, NULL);
}

bool
has_error(sbx_reply *r, const char *name)
{
    const msgpack_object *e;
    sbx_str n = {"", 0};
    if (sbx_wire_get_map(sbx_reply_result(r), "error", &e) != 0)
        return false;
    sbx_wire_get_str(e, "name", &n);
    return !name || sbx_str_eq(n, name);
}

/* Whether any result carries field `f` (png, html, …). */
bool
has_field(sbx_reply *r, const char *f)
{
    const msgpack_object *arr;
    if (sbx_wire_get_array(sbx_reply_result(r), "results", &arr) != 0)
        return false;
    for (uint32_t i = 0; i < arr->via.array.size; i++)
        if (sbx_wire_get(&arr->via.array.ptr[i], f))
            return true;
    return false;
}

char *
create_ctx(sbx_client *c, const char *id, const char *lang)
{
    char args[128];
    snprintf(args, sizeof(args), "{\"language\":\"%s\"}", lang);
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call_json(c, "context.create", id, args, 120000, &r, &err);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "context.create %s: %s %s", lang, err.code, err.message);
    sbx_str cid = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid);
    char *s = sbx_str_dup(cid);
    sbx_reply_free(r);
    return s;
}
