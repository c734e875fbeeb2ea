/* error.c — the error object; see error.h. */
#include "error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct sbx_err_s {
    int code;
    bool is_static;
    char *msg;
};

/* What *err gets when no memory is left for an object: one per code is
 * not possible statically, so the code travels in the return value and this
 * object's message says why there is no more. */
static const struct sbx_err_s oom_err = {SBX_E_INTERNAL, true, (char *)"out of memory"};

static char *
vfmt(const char *fmt, va_list ap)
{
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        return NULL;
    return s;
}

int
sbx_err_make(sbx_err_t *err, int code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    code = sbx_err_makev(err, code, fmt, ap);
    va_end(ap);
    return code;
}

int
sbx_err_makev(sbx_err_t *err, int code, const char *fmt, va_list ap)
{
    if (code >= 0)
        code = SBX_E_INTERNAL;
    if (!err)
        return code;
    sbx_err_release(err);
    char *m = vfmt(fmt, ap);
    if (m && code > -4096) {
        char *full = NULL;
        if (asprintf(&full, "%s: %s", m, strerror(-code)) >= 0) {
            free(m);
            m = full;
        }
    }
    struct sbx_err_s *e = m ? malloc(sizeof(*e)) : NULL;
    if (!e) {
        free(m);
        *err = (sbx_err_t)&oom_err;
        return code;
    }
    *e = (struct sbx_err_s){.code = code, .msg = m};
    *err = e;
    return code;
}

int
sbx_err_prefix(sbx_err_t *err, const char *fmt, ...)
{
    if (!err || !*err)
        return SBX_E_INTERNAL;
    struct sbx_err_s *e = *err;
    if (e->is_static)
        return e->code;
    va_list ap;
    va_start(ap, fmt);
    char *p = vfmt(fmt, ap);
    va_end(ap);
    char *full = NULL;
    if (p && asprintf(&full, "%s: %s", p, e->msg) >= 0) {
        free(e->msg);
        e->msg = full;
    }
    free(p);
    return e->code;
}

int
sbx_err_code(const struct sbx_err_s *err)
{
    return err ? err->code : 0;
}

const char *
sbx_err_msg(const struct sbx_err_s *err)
{
    return err ? err->msg : "";
}

int
sbx_err_release(sbx_err_t *err)
{
    if (!err || !*err)
        return 0;
    struct sbx_err_s *e = *err;
    int code = e->code;
    if (!e->is_static) {
        free(e->msg);
        free(e);
    }
    *err = NULL;
    return code;
}
