/*
 * error.h — the error object of sbx: a negative code with a message that
 * says what failed and on what ("listen on tcp://127.0.0.1:7700: Address in
 * use"), built where the failure happens and prefixed with context as it
 * propagates (crun's libcrun_error_t; docs/errors.md is the convention).
 *
 *     int
 *     open_thing(const char *path, sbx_err_t *err)
 *     {
 *         _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
 *         if (fd < 0)
 *             return sbx_err_make(err, -errno, "open `%s`", path);
 *         …
 *     }
 *
 *     sbx_err_t err = NULL;                     // no error yet
 *     if ((rc = open_thing(p, &err)) < 0) {     // rc == sbx_err_code(err)
 *         sbx_err_prefix(&err, "load config");  // "load config: open `x`: No such file…"
 *         sbx_log_error("%s", sbx_err_msg(err));
 *         sbx_err_release(&err);                // or `_cleanup_err_ sbx_err_t err = NULL;`
 *     }
 *
 * Rules.  A function that takes `sbx_err_t *err` returns 0 or a negative code
 * (runtime/err.h: -errno or SBX_E_*), and on failure has set *err (when err
 * is not NULL) to an object whose code is that return value; on success it
 * leaves *err alone.  Whoever holds a set *err owns it: release it, pass it
 * up (return its code), or replace it (sbx_err_make releases the old one).
 * Messages name the object ("open `%s`"), not the code: the code's wire
 * name travels beside it (sbx_err_name).  Objects are not shared between
 * threads; the functions are otherwise thread-safe (no global state).
 */
#ifndef SBX_ERROR_H
#define SBX_ERROR_H

#include <stdarg.h>

#include "err.h"

typedef struct sbx_err_s *sbx_err_t;

/*
 * sbx_err_make — set *err (err may be NULL: only the code is returned) to a
 * new object with `code` (negative; a non-negative code becomes
 * SBX_E_INTERNAL) and the printf-formatted message; an object already in
 * *err is released first.  When code is -errno, ": <strerror>" is appended
 * (crun's libcrun_make_error).  Returns the code.  Out of memory: *err is
 * set to a static object (SBX_E_INTERNAL, "out of memory") that
 * sbx_err_release knows; sbx_err_msg never returns NULL.
 */
int sbx_err_make(sbx_err_t *err, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* sbx_err_makev — sbx_err_make with a va_list. */
int sbx_err_makev(sbx_err_t *err, int code, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));

/*
 * sbx_err_prefix — put "<formatted>: " before the message of *err (the
 * caller's context: "shard s0: cannot open its store: …").  Returns the
 * object's code; with err NULL or *err NULL it returns SBX_E_INTERNAL and
 * does nothing (a bug in the caller, which should not call it without an
 * error).
 */
int sbx_err_prefix(sbx_err_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* sbx_err_code / sbx_err_msg — the code and message of err (static or owned
 * by err; valid until it is released); 0 and "" for a NULL err. */
int sbx_err_code(const struct sbx_err_s *err);
const char *sbx_err_msg(const struct sbx_err_s *err);

/* sbx_err_release — free *err (may be NULL) and set it to NULL; returns the
 * code it held (0 when none): `return sbx_err_release(&e)` after logging. */
int sbx_err_release(sbx_err_t *err);

/* _cleanup_err_ — release an sbx_err_t when it goes out of scope. */
#define _cleanup_err_ __attribute__((cleanup(sbx_err_release)))

#endif
