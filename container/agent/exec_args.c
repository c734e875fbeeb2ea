/*
 * exec_args.c — the shape of a command, shared by every way of running one
 * (exec.c, session*.c, proc*.c): its arguments (exec_args_parse), its
 * output kept up to a cap (struct outcap), the fields of its result, and
 * why it ended (agent_refine_cause with the shard's cgroup counters and
 * agent_work_mark).  Declared in agent.h; called on the loop thread.
 */
#include <ctype.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/err.h"
#include "agent.h"

void
outcap_init(struct outcap *o, uint64_t cap)
{
    sbx_buf_init(&o->data);
    o->total = 0;
    o->cap = cap;
    o->truncated = false;
}

void
outcap_add(struct outcap *o, const char *p, size_t n)
{
    o->total += n;
    if (o->data.len >= o->cap) {
        if (n)
            o->truncated = true;
        return;
    }
    size_t room = (size_t)(o->cap - o->data.len);
    if (n > room) {
        o->truncated = true;
        n = room;
    }
    sbx_buf_append(&o->data, p, n);
}

void
outcap_free(struct outcap *o)
{
    sbx_buf_free(&o->data);
}

/* ------------------------------------------------------------------------------ */
/* Arguments. */

void
exec_args_free(struct exec_args *ea)
{
    free(ea->cmd);
    if (ea->argv) {
        for (char **p = ea->argv; *p; p++)
            free(*p);
        free(ea->argv);
    }
    free(ea->cwd);
    free(ea->stdin_data);
    memset(ea, 0, sizeof(*ea));
}

int
exec_args_parse(const msgpack_object *args, struct exec_args *ea, sbx_err_t *err)
{
    sbx_str s;
    const msgpack_object *arr;
    int rc;

    memset(ea, 0, sizeof(*ea));
    rc = sbx_wire_get_array(args, "argv", &arr);
    if (rc == 0) {
        if (arr->via.array.size == 0 || arr->via.array.size > 4096) {
            sbx_err_make(err, SBX_E_VALIDATION, "argv must have 1-4096 elements");
            return SBX_E_VALIDATION;
        }
        ea->argv = sbx_xcalloc(arr->via.array.size + 1, sizeof(char *));
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) != 0 || memchr(s.p, '\0', s.n)) {
                sbx_err_make(err, SBX_E_VALIDATION,
                             "argv[%u] must be a string without NUL bytes", i);
                exec_args_free(ea);
                return SBX_E_VALIDATION;
            }
            ea->argv[i] = sbx_str_dup(s);
        }
        if (ea->argv[0][0] == '\0') {
            sbx_err_make(err, SBX_E_VALIDATION, "argv[0] must not be empty");
            exec_args_free(ea);
            return SBX_E_VALIDATION;
        }
    } else if (rc == -ENOENT) {
        rc = sbx_wire_get_str(args, "command", &s);
        if (rc != 0 || s.n == 0) {
            sbx_err_make(err, SBX_E_VALIDATION,
                         "'command' (a non-empty string) or 'argv' is required");
            return SBX_E_VALIDATION;
        }
        if (memchr(s.p, '\0', s.n)) {
            sbx_err_make(err, SBX_E_VALIDATION, "'command' must not contain NUL bytes");
            return SBX_E_VALIDATION;
        }
        ea->cmd = sbx_str_dup(s);
    } else {
        sbx_err_make(err, SBX_E_VALIDATION, "'argv' must be an array of strings");
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_str(args, "cwd", &s);
    if (rc == 0) {
        if (s.n == 0 || s.n > 4096 || memchr(s.p, '\0', s.n)) {
            sbx_err_make(err, SBX_E_VALIDATION, "'cwd' must be a path of 1-4096 bytes");
            exec_args_free(ea);
            return SBX_E_VALIDATION;
        }
        ea->cwd = sbx_str_dup(s);
    } else if (rc != -ENOENT) {
        sbx_err_make(err, SBX_E_VALIDATION, "'cwd' must be a string");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_map(args, "env", &ea->env);
    if (rc == SBX_E_VALIDATION) {
        sbx_err_make(err, SBX_E_VALIDATION, "'env' must be a map of strings");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    if (agent_env_check(ea->env, false, err) != 0) {
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_i64(args, "timeout", &ea->timeout_ms);
    if (rc == SBX_E_VALIDATION || ea->timeout_ms < 0) {
        sbx_err_make(err, SBX_E_VALIDATION,
                     "'timeout' must be a non-negative number of milliseconds");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_bin(args, "stdin", &s);
    sbx_str enc = SBX_STR("");
    sbx_wire_get_str(args, "stdinEncoding", &enc);
    if (rc == 0 && sbx_str_eq(enc, "base64")) {
        /* JSON clients (the HTTP API) send bytes that are not UTF-8 this way. */
        if (sbx_base64_decode(s.p, s.n, &ea->stdin_data, &ea->stdin_len) != 0) {
            sbx_err_make(err, SBX_E_VALIDATION,
                         "'stdin' is not valid base64 (stdinEncoding: base64)");
            exec_args_free(ea);
            return SBX_E_VALIDATION;
        }
        ea->has_stdin = true;
    } else if (rc == 0) {
        ea->has_stdin = true;
        ea->stdin_data = sbx_xstrndup(s.p, s.n);
        ea->stdin_len = s.n;
    } else if (rc != -ENOENT) {
        sbx_err_make(err, SBX_E_VALIDATION, "'stdin' must be bytes or a string");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Results. */

void
exec_encode_result(sbx_enc *e, int exit_code, int sig, bool timed_out, int64_t timeout_ms,
                   int64_t duration_ms, struct outcap *out, struct outcap *err, const char *cause,
                   bool by_deadline)
{
    if (timed_out) {
        char note[128];
        int n = snprintf(note, sizeof(note), "%sCommand timed out after %lldms%s\n",
                         (err->data.len && err->data.p[err->data.len - 1] != '\n') ? "\n" : "",
                         (long long)timeout_ms, by_deadline ? " (the request's deadline)" : "");
        /* The note is always kept, even past the cap. */
        sbx_buf_append(&err->data, note, (size_t)n);
    }
    sbx_enc_kbool(e, "success", exit_code == 0 && !timed_out);
    sbx_enc_kint(e, "exitCode", exit_code);
    sbx_enc_kbin(e, "stdout", out->data.p ? out->data.p : "", out->data.len);
    sbx_enc_kbin(e, "stderr", err->data.p ? err->data.p : "", err->data.len);
    sbx_enc_kbool(e, "stdoutTruncated", out->truncated);
    sbx_enc_kbool(e, "stderrTruncated", err->truncated);
    sbx_enc_kint(e, "stdoutBytes", (int64_t)out->total);
    sbx_enc_kint(e, "stderrBytes", (int64_t)err->total);
    sbx_enc_kint(e, "duration", duration_ms);
    sbx_enc_kbool(e, "timedOut", timed_out);
    if (timed_out && by_deadline)
        sbx_enc_kbool(e, "deadlineExceeded", true);
    if (sig)
        sbx_enc_kint(e, "signal", sig);
    sbx_enc_kstr(e, "cause", cause ? cause : timed_out ? "TIMEOUT" : sig ? "KILLED" : "EXITED");
}

int64_t
agent_bound_timeout(const struct agent_req *r, int64_t timeout_ms, bool *by_deadline)
{
    *by_deadline = false;
    if (!r || !r->deadline_ms)
        return timeout_ms;
    int64_t left = SBX_MAX(r->deadline_ms - sbx_mono_ms(), (int64_t)1);
    if (timeout_ms && timeout_ms <= left)
        return timeout_ms;
    *by_deadline = true;
    return left;
}

/* ------------------------------------------------------------------------------ */
/* Why a command ended. */

void
agent_work_mark(struct agent *a, const void *self, struct work_mark *m)
{
    m->starts = ++a->work_starts;
    m->others = agent_others_running(a, self);
}

bool
agent_work_alone(struct agent *a, const void *self, const struct work_mark *m)
{
    return !m->others && a->work_starts == m->starts && !agent_others_running(a, self);
}

/* Case-insensitive search of needle (lower case) in n bytes of p. */
static bool
icase_has(const char *p, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; p && i + k <= n; i++) {
        size_t j = 0;
        while (j < k && (char)tolower((unsigned char)p[i + j]) == needle[j])
            j++;
        if (j == k)
            return true;
    }
    return false;
}

bool
agent_fork_refused_in(const char *p, size_t n)
{
    /* bash "fork: retry: Resource temporarily unavailable", dash "Cannot
     * fork", Python's BlockingIOError, Go's "resource temporarily
     * unavailable", Node's "spawn EAGAIN". */
    static const char *const says[] = {"resource temporarily unavailable", "cannot fork",
                                       "can't fork", "eagain"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(says); i++)
        if (icase_has(p, n, says[i]))
            return true;
    return false;
}

const char *
agent_refine_cause(const char *cause, int exit_code, int sig, const struct agent_counters *before,
                   const struct agent_counters *after, bool blame_pids)
{
    bool oom = after->oom_kills > before->oom_kills;
    /* SIGKILL with the OOM killer at work; a shell reports its child's
     * SIGKILL as exit 137 (128 + 9). */
    if (!strcmp(cause, "KILLED") && sig == SIGKILL && oom)
        return "OOM_KILLED";
    if (!strcmp(cause, "EXITED") && exit_code == 137 && oom)
        return "OOM_KILLED";
    if (!strcmp(cause, "EXITED") && exit_code != 0 && after->pids_hits > before->pids_hits &&
        blame_pids)
        return "PIDS_LIMIT";
    return cause;
}
