/*
 * http_util.c — the HTTP front tests' shared helpers (http_util.h).
 */
#include <criterion/criterion.h>
#include <stdarg.h>
#include <stdlib.h>

#include "../../runtime/util.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"
#include "http_util.h"

/* A JSON body from a jansson pack format. */
char *
body(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    json_error_t je;
    json_t *j = json_vpack_ex(&je, 0, fmt, ap);
    va_end(ap);
    cr_assert(j, "bad pack format %s: %s", fmt, je.text);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return s;
}

/* exec over HTTP: the stdout of a shell string (asserts exit 0). */
char *
hsh(const char *id, const char *cmd)
{
    struct hresp r;
    char *b = body("{s:s}", "command", cmd);
    apif("POST", b, &r, "/v1/sandboxes/%s/exec", id);
    free(b);
    assert_status(r, 200, cmd);
    cr_assert_eq(jint(r.json, "exitCode"), 0, "'%s' exited %lld: %s", cmd,
                 jint(r.json, "exitCode"), jstr(r.json, "stderr"));
    char *out = sbx_xstrdup(jstr(r.json, "stdout"));
    hresp_free(&r);
    return out;
}
