/*
 * session.c — persistent shell sessions: one bash per session, so `cd`,
 * `export`, variables and functions carry over from one exec to the next.
 *
 * Design (cf. the SDK's packages/sandbox-container/src/session.ts, and
 * ../shared/reference/interpreter-sessions-streaming.md on persistent
 * shells):
 *
 *  - bash runs as `bash --norc --noprofile -i` with its stdin on a pipe from
 *    us.  Interactive mode matters for one thing: on SIGINT an interactive
 *    shell abandons the command line it is running — even a loop of
 *    builtins — and reads the next one, keeping all of its state.  That is
 *    how a timed-out command is stopped while the shell survives (the SDK
 *    leaves the command running and the session stuck).  Prompts, history
 *    and job control are switched off.
 *  - bash is a child subreaper, so everything a command starts stays in its
 *    subtree; fds 4 and 5 of bash are the session's stdout and stderr pipes
 *    and fd 3 the control pipe.
 *  - each command is sent as one line.  The command text travels in an
 *    ANSI-C quoted string ($'…', every unusual byte as \xHH) and runs through
 *    `eval` inside `{ …; } </dev/null >&4 2>&5 3>&- 4>&- 5>&-`, so no quoting
 *    or syntax error in it can swallow what follows, stdin is /dev/null
 *    (`cat` returns at once) and the command never holds the control pipe.
 *    Per-call env rides as assignments on the eval (temporary and
 *    exported), per-call cwd as a cd that is undone afterwards.
 *  - after the command the line prints a marker with a fresh random nonce on
 *    fds 4 and 5, then "nonce status" on fd 3.  Output before the marker
 *    belongs to the command; a line on fd 3 completes it.
 *  - `exit N` kills the shell: the call fails with SESSION_TERMINATED and the
 *    next call starts a fresh shell, as the SDK does.
 *  - on timeout every process the command started (descendants of bash
 *    newer than the command) is killed, then bash gets SIGINT if it is still
 *    busy in a builtin loop, and a sync line confirms it is back at its
 *    prompt; the call ends with exit code 124 and the note on stderr.
 *
 * This file holds the session table and the session.* operations (called
 * by main.c's dispatch; proc.c, files.c and term.c use its cwd and internal
 * commands);
 * the shell protocol is session_shell.c, commands session_cmd.c
 * (session_int.h).  One loop thread.
 */
#include "session_int.h"

/* ------------------------------------------------------------------------------ */

static struct session *
session_find(struct agent *a, const char *id)
{
    for (struct session *s = a->sessions.list; s; s = s->next)
        if (!strcmp(s->id, id))
            return s;
    return NULL;
}

static struct session *
session_new(struct agent *a, const char *id, const msgpack_object *env, const char *cwd,
            int64_t timeout_ms)
{
    struct session *s = sbx_xcalloc(1, sizeof(*s));
    s->a = a;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->in_fd = s->ctl_fd = s->junk_fd = s->fd[0] = s->fd[1] = -1;
    s->env = agent_env_merge(a->env, env);
    s->cwd = cwd ? sbx_xstrdup(cwd) : NULL;
    s->default_timeout_ms = timeout_ms;
    sbx_buf_init(&s->inq);
    sbx_buf_init(&s->pend[0]);
    sbx_buf_init(&s->pend[1]);
    sbx_buf_init(&s->ctl);
    outcap_init(&s->out[0], 0);
    outcap_init(&s->out[1], 0);
    s->next = a->sessions.list;
    a->sessions.list = s;
    return s;
}

static void
enqueue(struct session *s, struct scmd *c)
{
    if (s->q_tail)
        s->q_tail->next = c;
    else
        s->q_head = c;
    s->q_tail = c;
    session_start_next(s);
}

void
agent_exec_session(struct agent *a, struct agent_req *r, const char *sid, bool stream)
{
    _cleanup_err_ sbx_err_t err = NULL;
    struct scmd *c = sbx_xcalloc(1, sizeof(*c));
    int rc = exec_args_parse(r->args, &c->ea, &err);
    if (rc) {
        free(c);
        agent_reply_err(a, r, rc, "%s", sbx_err_msg(err));
        return;
    }
    /* Per-call variables are assigned by the session's shell (session_run_cmd): a
     * name it cannot assign is refused rather than dropped. */
    if (agent_env_check(c->ea.env, true, &err) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", sbx_err_msg(err));
        session_scmd_free(c);
        return;
    }
    if (c->ea.cwd) {
        struct stat st;
        if (stat(c->ea.cwd, &st) < 0 || !S_ISDIR(st.st_mode)) {
            agent_reply_err(a, r, SBX_E_VALIDATION, "cwd '%s' is not a directory in the sandbox",
                            c->ea.cwd);
            session_scmd_free(c);
            return;
        }
    }
    struct session *s = session_find(a, sid);
    if (!s)
        s = session_new(a, sid, NULL, NULL, 0);
    c->have_cg = r->have_cg;
    c->cg = r->cg;
    if (stream) {
        char stid[72];
        snprintf(stid, sizeof(stid), "exec-%llu", (unsigned long long)++a->stream_ctr);
        c->stream = stream_new(a, stid, true, 1u << 20, &session_cmd_stream_ops, s);
        sbx_enc res;
        sbx_enc_init(&res);
        sbx_enc_map(&res);
        sbx_enc_kstr(&res, "streamId", stid);
        sbx_enc_kstr(&res, "sessionId", s->id);
        agent_reply_ok(a, r, &res);
    } else {
        c->req = r;
        c->deadline_ms = r->deadline_ms;
    }
    enqueue(s, c);
}

void
agent_session_internal(struct agent *a, const char *sid, const char *cmd, session_done_fn done,
                       void *arg)
{
    struct session *s = session_find(a, sid);
    if (!s)
        s = session_new(a, sid, NULL, NULL, 0);
    struct scmd *c = sbx_xcalloc(1, sizeof(*c));
    c->ea.cmd = sbx_xstrdup(cmd);
    c->done = done;
    c->done_arg = arg;
    enqueue(s, c);
}

const char *
agent_session_cwd(struct agent *a, const char *sid)
{
    struct session *s = session_find(a, sid);
    if (!s)
        return NULL;
    return s->pwd_unknown ? "" : s->pwd ? s->pwd : s->cwd;
}

bool
agent_sessions_busy(struct agent *a, const void *self)
{
    for (struct session *s = a->sessions.list; s; s = s->next)
        if (s->cur && (const void *)s->cur != self)
            return true;
    return false;
}

/* Encode a session's description as the current value of e. */
static void
encode_session(struct session *s, sbx_enc *e)
{
    sbx_enc_map(e);
    sbx_enc_kstr(e, "id", s->id);
    sbx_enc_kstr(e, "cwd", s->pwd_unknown ? "" : s->pwd ? s->pwd : s->cwd ? s->cwd : "/workspace");
    sbx_enc_kbool(e, "shellRunning", s->pid > 0);
    sbx_enc_kbool(e, "busy", s->cur != NULL);
    int queued = 0;
    for (struct scmd *c = s->q_head; c; c = c->next)
        queued++;
    sbx_enc_kint(e, "queued", queued);
    if (s->default_timeout_ms)
        sbx_enc_kint(e, "commandTimeoutMs", s->default_timeout_ms);
    sbx_enc_end(e);
}

static int
session_id_arg(struct agent *a, struct agent_req *r, char *out, size_t outlen, bool required)
{
    sbx_str id;
    int rc = sbx_wire_get_str(r->args, "id", &id);
    if (rc == -ENOENT)
        rc = sbx_wire_get_str(r->args, "sessionId", &id);
    if (rc == -ENOENT && !required) {
        snprintf(out, outlen, "session-%lld", (long long)sbx_wall_ms());
        return 0;
    }
    char why[128];
    if (rc != 0 || sbx_id_check_name("the session ID", id.p, id.n, 120, why, sizeof(why)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s",
                        rc ? "'id' (the session ID) must be a string" : why);
        return -1;
    }
    sbx_str_copy(id, out, outlen);
    return 0;
}

void
agent_op_session_create(struct agent *a, struct agent_req *r)
{
    char id[128];
    if (session_id_arg(a, r, id, sizeof(id), false) != 0)
        return;
    if (session_find(a, id)) {
        agent_reply_err(a, r, SBX_E_SESSION_EXISTS, "session '%s' already exists", id);
        return;
    }
    const msgpack_object *env = NULL;
    sbx_str cwd = {0};
    int64_t tmo = 0;
    _cleanup_err_ sbx_err_t err = NULL;
    if (sbx_wire_get_map(r->args, "env", &env) == SBX_E_VALIDATION ||
        sbx_wire_get_str(r->args, "cwd", &cwd) == SBX_E_VALIDATION ||
        sbx_wire_get_i64(r->args, "commandTimeoutMs", &tmo) == SBX_E_VALIDATION || tmo < 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION,
                        "'env' must be a map, 'cwd' a string, 'commandTimeoutMs' a number");
        return;
    }
    /* The same rules as exec's env (the session's bash hands names it cannot
     * assign on to its children, so any name goes); a value that is not a
     * string was dropped silently before. */
    if (agent_env_check(env, false, &err) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", sbx_err_msg(err));
        return;
    }
    char *cwds = cwd.n ? sbx_str_dup(cwd) : NULL;
    struct session *s = session_new(a, id, env, cwds, tmo);
    struct stat st;
    if (cwds && (stat(cwds, &st) < 0 || !S_ISDIR(st.st_mode))) {
        /* As the Cloudflare SDK: a cwd that is not a directory starts the
         * session in $HOME (the session's, else /root); session.cwd says
         * where it is (docs/protocol.md §3.2). */
        const char *home = "/root";
        for (char **e = s->env; e && *e; e++)
            if (!strncmp(*e, "HOME=", 5) && (*e)[5] == '/')
                home = *e + 5;
        sbx_log_debug("session %s: cwd '%s' is not a directory, starting in %s", id, cwds, home);
        free(s->cwd);
        s->cwd = sbx_xstrdup(home);
    }
    free(cwds);
    /* Start the shell now, so the first command does not pay for it. */
    if (session_start_shell(s) != 0)
        s->pid = 0;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "sessionId", s->id);
    sbx_enc_str(&e, "session");
    encode_session(s, &e);
    agent_reply_ok(a, r, &e);
}

void
agent_op_session_get(struct agent *a, struct agent_req *r)
{
    char id[128];
    if (session_id_arg(a, r, id, sizeof(id), true) != 0)
        return;
    struct session *s = session_find(a, id);
    if (!s) {
        agent_reply_err(a, r, SBX_E_SESSION_NOT_FOUND, "session '%s' not found", id);
        return;
    }
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "session");
    encode_session(s, &e);
    agent_reply_ok(a, r, &e);
}

void
agent_op_session_list(struct agent *a, struct agent_req *r)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_karray(&e, "sessions");
    for (struct session *s = a->sessions.list; s; s = s->next)
        encode_session(s, &e);
    sbx_enc_end(&e);
    agent_reply_ok(a, r, &e);
}

static void
session_free(struct session *s)
{
    agent_env_free(s->env);
    free(s->cwd);
    free(s->pwd);
    sbx_buf_free(&s->inq);
    sbx_buf_free(&s->pend[0]);
    sbx_buf_free(&s->pend[1]);
    sbx_buf_free(&s->ctl);
    outcap_free(&s->out[0]);
    outcap_free(&s->out[1]);
    free(s);
}

/* Kill the shell and everything it started; fail what is queued. */
static void
session_kill(struct session *s, int code, const char *why)
{
    struct agent *a = s->a;
    agent_procs_kill_session(a, s->id);
    agent_term_close_session(a, s->id);
    session_kill_shell(s);
    if (s->pid > 0) {
        /* Reap it here so no callback sees the freed session. */
        int st;
        waitpid(s->pid, &st, 0);
        s->pid = 0;
    }
    session_close_shell_fds(s);
    if (s->cur) {
        struct scmd *c = s->cur;
        s->cur = NULL;
        session_fail_cmd(s, c, code, -1, why);
    }
    session_reset_cmd_state(s);
    while (s->q_head) {
        struct scmd *c = s->q_head;
        s->q_head = c->next;
        session_fail_cmd(s, c, code, -1, why);
    }
    s->q_tail = NULL;
}

void
agent_op_session_delete(struct agent *a, struct agent_req *r)
{
    char id[128];
    if (session_id_arg(a, r, id, sizeof(id), true) != 0)
        return;
    if (!strcmp(id, "default")) {
        agent_reply_err(a, r, SBX_E_VALIDATION,
                        "cannot delete the default session; destroy the sandbox instead");
        return;
    }
    struct session *s = session_find(a, id);
    if (!s) {
        agent_reply_err(a, r, SBX_E_SESSION_NOT_FOUND, "session '%s' not found", id);
        return;
    }
    for (struct session **pp = &a->sessions.list; *pp; pp = &(*pp)->next) {
        if (*pp == s) {
            *pp = s->next;
            break;
        }
    }
    session_kill(s, SBX_E_INTERRUPTED, "the session was deleted");
    session_free(s);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "sessionId", id);
    agent_reply_ok(a, r, &e);
}

static void
env_applied(struct agent *a, void *arg, int rc, int status, struct outcap *out)
{
    (void)a;
    (void)arg;
    (void)out;
    if (rc || status)
        sbx_log_warn("agent: applying environment changes to the default session failed (%d/%d)",
                 rc, status);
}

void
agent_session_prestart(struct agent *a)
{
    /* The default session's shell, started while the container waits in
     * the pool: a sandbox's first command then finds bash already up (its
     * start-up is most of a cold start).  bind's env reaches it through
     * agent_session_apply_env, queued before any command. */
    struct session *s = session_find(a, "default");
    if (!s)
        s = session_new(a, "default", NULL, NULL, 0);
    if (s->pid == 0 && session_start_shell(s) != 0)
        sbx_log_warn("agent: the default session's shell could not be started early");
}

void
agent_sessions_trim(struct agent *a)
{
    struct session *s = session_find(a, "default");
    if (!s || s->used || s->pid <= 0 || s->cur || s->q_head || !a->bound ||
        sbx_mono_ms() - a->bound_ms < AGENT_SHELL_UNUSED_MS)
        return;
    /* Nothing of it to keep: its env is s->env (agent_session_apply_env
     * keeps that equal to a->env), its cwd the session's start cwd. */
    session_kill_shell(s);
    int st;
    while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR)
        ;
    s->pid = 0;
    session_close_shell_fds(s);
    session_reset_cmd_state(s);
}

void
agent_session_apply_env(struct agent *a, const msgpack_object *vars)
{
    struct session *s = session_find(a, "default");
    if (!s)
        return; /* it will start from a->env */
    sbx_buf cmd;
    sbx_buf_init(&cmd);
    for (uint32_t i = 0; i < vars->via.map.size; i++) {
        const msgpack_object_kv *kv = &vars->via.map.ptr[i];
        sbx_str k, v;
        if (sbx_wire_obj_str(&kv->key, &k) != 0)
            continue;
        bool ok = k.n > 0 && !(k.p[0] >= '0' && k.p[0] <= '9');
        for (size_t j = 0; j < k.n; j++) {
            char ch = k.p[j];
            if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_'))
                ok = false;
        }
        if (!ok)
            continue;
        if (sbx_wire_obj_str(&kv->val, &v) == 0) {
            sbx_buf_append(&cmd, "export ", 7);
            sbx_buf_append(&cmd, k.p, k.n);
            sbx_buf_append(&cmd, "=", 1);
            session_quote_ansi_c(&cmd, v.p, v.n);
        } else {
            sbx_buf_append(&cmd, "unset ", 6);
            sbx_buf_append(&cmd, k.p, k.n);
        }
        sbx_buf_append(&cmd, "; ", 2);
    }
    if (cmd.len)
        agent_session_internal(a, "default", cmd.p, env_applied, NULL);
    sbx_buf_free(&cmd);
    /* Sessions created later start from a->env (already updated). */
    agent_env_free(s->env);
    s->env = agent_env_merge(a->env, NULL);
}

void
agent_sessions_reaped(struct agent *a, pid_t pid, int status)
{
    for (struct session *s = a->sessions.list; s; s = s->next) {
        if (s->pid != pid)
            continue;
        s->pid = 0;
        /* Take what the shell wrote before it died; no marker will come, so
         * a held-back tail is output too. */
        for (int i = 0; i < 2; i++) {
            if (s->fd[i] >= 0)
                session_read_stream_x(s, i, true);
            /* An interactive bash announces `exit` on its stderr, which was
             * the command's at that moment: not the command's output. */
            if (i == 1 && s->cur && !s->timed_out && session_ends_with_exit_line(s, &s->pend[1]))
                s->pend[1].len -= 5;
            session_emit(s, i, s->pend[i].p, s->pend[i].len);
            s->pend[i].len = 0;
        }
        session_close_shell_fds(s);
        struct scmd *c = s->cur;
        if (c && s->asked && !s->answered) {
            /* The command had ended and waits for its cause: it ends now,
             * as it is; the shell's death is the next command's news. */
            agent_counters_cancel(a, s);
            s->answered = true;
            session_cmd_complete(s);
            return;
        }
        if (c) {
            s->cur = NULL;
            if (s->timed_out && !s->got_rc) {
                /* We killed the shell to end a timed-out command. */
                s->cur = c;
                s->got_rc = s->mark[0] = s->mark[1] = true;
                session_cmd_complete(s);
                return;
            }
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            char msg[320];
            /* "shell exited … exit code: N": the Cloudflare SDK's phrase, which
             * ported programs match on (issue 19). */
            snprintf(msg, sizeof(msg),
                     "shell exited (exit code: %d) in session '%s'; the next command "
                     "starts a fresh shell", code, s->id);
            session_fail_cmd(s, c, SBX_E_SESSION_TERMINATED, code, msg);
            session_reset_cmd_state(s);
        }
        session_start_next(s);
        return;
    }
}

void
agent_sessions_free(struct agent *a)
{
    while (a->sessions.list) {
        struct session *s = a->sessions.list;
        a->sessions.list = s->next;
        session_kill(s, SBX_E_INTERRUPTED, "the sandbox is stopping");
        session_free(s);
    }
}
