/*
 * sdk.h — header-only helpers for the integration tests of the SDK-style
 * surface (sessions, processes, streams, files, watch, git, env): generic
 * calls with JSON arguments and JSON results (jansson), dotted-path access
 * to result fields, status fields, exec wrappers that assert.
 *
 * Everything is `static inline` so a test file uses what it needs without
 * unused-function warnings, and no Makefile change is needed (only
 * harness.c is linked into the test binaries).
 */
#ifndef SBX_TEST_SDK_H
#define SBX_TEST_SDK_H

#include <criterion/criterion.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/wire.h"
#include "harness.h"

/* One call of any operation.  On success `res` is the result as JSON (bin
 * fields become strings, invalid UTF-8 replaced) and `rep` the raw reply
 * (for bin fields); on failure `err` holds the code and `ctx` the context. */
typedef struct tcall {
    int rc;
    sbx_error err;
    json_t *res;
    json_t *ctx;
    sbx_reply *rep;
} tcall;

/* tc_call — call `op` on sandbox `sb` (NULL for deployment-wide ops) with
 * `args` (a JSON object, stolen; NULL for none) and a deadline (0: the
 * client's default). */
static inline tcall
tc_call(sbx_client *c, const char *op, const char *sb, json_t *args, int64_t timeout_ms)
{
    tcall t;
    memset(&t, 0, sizeof(t));
    char *text = args ? json_dumps(args, JSON_COMPACT) : NULL;
    if (args)
        json_decref(args);
    t.rc = sbx_call_json(c, op, sb, text, timeout_ms, &t.rep, &t.err);
    free(text);
    if (t.rc == 0) {
        char *js = sbx_reply_json(t.rep, false);
        json_error_t je;
        t.res = js ? json_loads(js, 0, &je) : NULL;
        free(js);
        if (!t.res)
            t.res = json_object();
    } else {
        t.rep = NULL;
        if (t.err.context_json) {
            json_error_t je;
            t.ctx = json_loads(t.err.context_json, 0, &je);
        }
        if (!t.ctx)
            t.ctx = json_object();
    }
    return t;
}

static inline void
tc_free(tcall *t)
{
    if (t->res)
        json_decref(t->res);
    if (t->ctx)
        json_decref(t->ctx);
    sbx_reply_free(t->rep);
    sbx_error_free(&t->err);
    memset(t, 0, sizeof(*t));
}

/* jget — the value at a dotted path ("process.status"; array elements by
 * number: "events.0.type"), or NULL. */
static inline json_t *
jget(json_t *j, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof(buf), "%s", path);
    char *save = NULL;
    for (char *k = strtok_r(buf, ".", &save); k && j; k = strtok_r(NULL, ".", &save)) {
        if (json_is_array(j)) {
            char *end;
            long i = strtol(k, &end, 10);
            j = *end ? NULL : json_array_get(j, (size_t)i);
        } else {
            j = json_object_get(j, k);
        }
    }
    return j;
}

/* jstr — the string at path, or "" (never NULL). */
static inline const char *
jstr(json_t *j, const char *path)
{
    const char *s = json_string_value(jget(j, path));
    return s ? s : "";
}

/* jint — the integer at path, or `dflt`. */
static inline long long
jint_or(json_t *j, const char *path, long long dflt)
{
    json_t *v = jget(j, path);
    if (json_is_integer(v))
        return json_integer_value(v);
    if (json_is_real(v))
        return (long long)json_real_value(v);
    return dflt;
}
#define jint(j, path) jint_or((j), (path), -1)

/* A fork bomb that gives up: it forks until fork fails (the pids limit),
 * prints how many children it made and the errno, and exits 3; the
 * children block on a pipe and leave when it exits. */
#define TEST_FORK_UNTIL_REFUSED_PY                                                           \
    "python3 -c \"import os, sys\n"                                                         \
    "r, w = os.pipe()\n"                                                                     \
    "n = 0\n"                                                                                \
    "while True:\n"                                                                          \
    "    try:\n"                                                                             \
    "        pid = os.fork()\n"                                                              \
    "    except OSError as e:\n"                                                             \
    "        print(n, e.errno); sys.exit(3)\n"                                               \
    "    if pid == 0:\n"                                                                     \
    "        os.close(w); os.read(r, 1); os._exit(0)\n"                                      \
    "    n += 1\""

/* jbool — the boolean at path: 1, 0, or -1 when absent or not a boolean. */
static inline int
jbool(json_t *j, const char *path)
{
    json_t *v = jget(j, path);
    return json_is_boolean(v) ? json_is_true(v) : -1;
}

/* tc_bin — a bin (or str) field of the raw result at a top-level key. */
static inline sbx_str
tc_bin(const tcall *t, const char *key)
{
    sbx_str s = {"", 0};
    if (t->rep)
        sbx_wire_get_bin(sbx_reply_result(t->rep), key, &s);
    return s;
}

/* tc_ok — assert that the call succeeded (message names the op). */
#define tc_ok(t, op)                                                                           \
    cr_assert_eq((t).rc, 0, "%s failed: %s %s (context %s)", (op), (t).err.code,             \
                 (t).err.message, (t).err.context_json ? (t).err.context_json : "-")

/* tc_client — a client for url (caller closes it) whose calls have a
 * deadline of timeout_ms by default; fails the test if it cannot open. */
static inline sbx_client *
tc_client(const char *url, int64_t timeout_ms)
{
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, url, &err), 0, "client: %s %s", err.code, err.message);
    sbx_client_set_timeout(c, timeout_ms);
    return c;
}

/* tc_env_fill — env.set k to vlen bytes of 'x' on sandbox id: 0, or
 * non-zero with the error's code in code (48 bytes; "" on success). */
static inline int
tc_env_fill(sbx_client *c, const char *id, const char *k, size_t vlen, char code[48])
{
    char *v = malloc(vlen + 1);
    cr_assert_not_null(v);
    memset(v, 'x', vlen);
    v[vlen] = '\0';
    json_t *a = json_pack("{s:{s:s}}", "vars", k, v);
    free(v);
    tcall t = tc_call(c, "env.set", id, a, 0);
    int rc = t.rc;
    snprintf(code, 48, "%s", rc ? t.err.code : "");
    tc_free(&t);
    return rc;
}

/* tc_shard_status — field of the first shard's status in cluster.status
 * (shards.0.status.<field>, an integer; -1 when absent); fails the test if
 * cluster.status fails. */
static inline long long
tc_shard_status(sbx_client *c, const char *field)
{
    tcall t = tc_call(c, "cluster.status", NULL, NULL, 0);
    tc_ok(t, "cluster.status");
    char path[64];
    snprintf(path, sizeof(path), "shards.0.status.%s", field);
    long long v = jint(t.res, path);
    tc_free(&t);
    return v;
}

/* tc_fails_with — assert that the call failed with `code`. */
#define tc_fails_with(t, op, want)                                                              \
    do {                                                                                       \
        cr_expect_neq((t).rc, 0, "%s succeeded, expected %s", (op), (want));                   \
        cr_expect_str_eq((t).err.code, (want), "%s: error %s (%s), expected %s", (op),        \
                         (t).err.code, (t).err.message, (want));                               \
    } while (0)

/* ---------------------------------------------------------------------------------- */
/* exec wrappers */

/* tsh_opts — sbx_exec that asserts the call itself worked. */
static inline sbx_exec_result
tsh_opts(sbx_client *c, const char *id, const sbx_exec_opts *o)
{
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(c, id, o, &r, &err);
    if (rc) {
        char msg[600];
        snprintf(msg, sizeof(msg), "%s %s", err.code, err.message);
        sbx_error_free(&err);
        sbx_exec_result_free(&r);
        cr_assert_fail("exec '%s' failed: %s", o->command ? o->command : "(argv)", msg);
    }
    return r;
}

/* tsh — run a shell string in the default session. */
static inline sbx_exec_result
tsh(sbx_client *c, const char *id, const char *cmd, int64_t timeout_ms)
{
    sbx_exec_opts o = {.command = cmd, .timeout_ms = timeout_ms};
    return tsh_opts(c, id, &o);
}

/* tsh_in — run a shell string in session `sess`. */
static inline sbx_exec_result
tsh_in(sbx_client *c, const char *id, const char *sess, const char *cmd, int64_t timeout_ms)
{
    sbx_exec_opts o = {.command = cmd, .timeout_ms = timeout_ms, .session_id = sess};
    return tsh_opts(c, id, &o);
}

/* tsh_out — run cmd (default session) and return its stdout (heap). */
static inline char *
tsh_out(sbx_client *c, const char *id, const char *cmd)
{
    sbx_exec_result r = tsh(c, id, cmd, 60000);
    char *s = r.stdout_data;
    r.stdout_data = NULL;
    sbx_exec_result_free(&r);
    return s ? s : strdup("");
}

/* ---------------------------------------------------------------------------------- */
/* status */

/* ts_status — the sandbox map of `status` as JSON (caller json_decref's). */
static inline json_t *
ts_status(sbx_client *c, const char *id)
{
    tcall t = tc_call(c, "status", id, NULL, 0);
    tc_ok(t, "status");
    json_t *sb = json_incref(jget(t.res, "sandbox"));
    tc_free(&t);
    cr_assert(sb != NULL, "status has no sandbox map");
    return sb;
}

/* ts_memory — the container's memoryBytes (-1 when not running). */
static inline long long
ts_memory(sbx_client *c, const char *id)
{
    json_t *sb = ts_status(c, id);
    long long v = jint(sb, "container.memoryBytes");
    json_decref(sb);
    return v;
}

/* ---------------------------------------------------------------------------------- */
/* lifecycle */

/* tdone — destroy the sandbox and free its ID. */
static inline void
tdone(sbx_client *c, char *id)
{
    sbx_destroy(c, id, NULL, NULL);
    free(id);
}

/* tsleep_ms — sleep for ms milliseconds. */
static inline void
tsleep_ms(int ms)
{
    usleep((useconds_t)ms * 1000);
}

#endif
