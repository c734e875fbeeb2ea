/*
 * session_cmd.c — commands in a session: the line sent for each (env, cwd,
 * markers), completion with the shard's cgroup counters for the cause of a
 * failure, timeout and interrupt (kill what the command started, SIGINT,
 * a sync line), streamed commands with back-pressure, and starting the next
 * queued command.  Called by session.c and session_shell.c on the loop
 * thread; a command (struct scmd) is owned by its session.
 */
#include "session_int.h"
/* ------------------------------------------------------------------------------ */
/* Commands. */

void
session_scmd_free(struct scmd *c)
{
    if (c->stream) {
        c->stream->ops = NULL;
        stream_unref(c->stream);
    }
    exec_args_free(&c->ea);
    free(c);
}

void
session_reset_cmd_state(struct session *s)
{
    if (s->asked && !s->answered)
        agent_counters_cancel(s->a, s);
    s->asked = s->answered = false;
    s->cause = NULL;
    sbx_loop_cancel(s->a->loop, s->timer);
    sbx_loop_cancel(s->a->loop, s->fallback);
    s->timer = s->fallback = 0;
    s->got_rc = s->mark[0] = s->mark[1] = false;
    s->err_bol = true;
    s->timed_out = false;
    s->sigint_at = 0;
    outcap_free(&s->out[0]);
    outcap_free(&s->out[1]);
}

/* The shard's counters for a command that failed: its cause, then its end. */
static void
cmd_counters(struct agent *a, void *arg, bool ok, const struct agent_counters *now)
{
    struct session *s = arg;
    (void)a;
    s->answered = true;
    if (!s->cur)
        return;
    int code = s->rc;
    int sig = (code > 128 && code < 128 + 65) ? code - 128 : 0;
    if (ok) {
        bool blame = agent_work_alone(s->a, s->cur, &s->wmark) ||
                     agent_fork_refused_in(s->out[0].data.p, s->out[0].data.len) ||
                     agent_fork_refused_in(s->out[1].data.p, s->out[1].data.len);
        const char *c0 = sig ? "KILLED" : "EXITED";
        const char *c1 = agent_refine_cause(c0, code, sig, &s->cur->cg, now, blame);
        if (strcmp(c0, c1))
            s->cause = c1;
    }
    session_cmd_complete(s);
}

void
session_cmd_complete(struct session *s)
{
    struct scmd *c = s->cur;
    int code = s->timed_out ? 124 : c->cancelled ? 130 : s->rc;
    int64_t dur = (sbx_mono_us() - s->start_us) / 1000;
    /* A status above 128 from the shell means the command died of a signal. */
    int sig = (!s->timed_out && code > 128 && code < 128 + 65) ? code - 128 : 0;
    /* A command that failed may have met the sandbox's memory or pids
     * limit: only the shard sees those counters.  The session waits for
     * them before it goes on (the command has ended; its shell is idle). */
    if (s->asked && !s->answered)
        return;
    if (!s->asked && c->have_cg && (c->req || c->stream) && !s->timed_out && !c->cancelled &&
        code != 0) {
        s->asked = true;
        agent_counters_ask(s->a, cmd_counters, s);
        return;
    }
    if (c->stream) {
        if (s->timed_out) {
            char note[96];
            int n = snprintf(note, sizeof(note), "Command timed out after %lldms\n",
                             (long long)s->timeout_ms);
            stream_data(c->stream, "stderr", note, (size_t)n, NULL, NULL);
        }
        sbx_enc *e = stream_begin(c->stream, "complete");
        exec_encode_complete(e, code, sig, s->timed_out, c->cancelled, s->timeout_ms, dur,
                             s->cause);
        sbx_enc_kstr(e, "sessionId", s->id);
        stream_commit(c->stream, true);
        session_pause_streams(s, false);
    } else if (c->done) {
        c->done(s->a, c->done_arg, 0, code, &s->out[0]);
    } else {
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        exec_encode_result(&e, code, sig, s->timed_out, s->timeout_ms, dur, &s->out[0],
                           &s->out[1], s->cause, s->by_deadline);
        sbx_enc_kstr(&e, "sessionId", s->id);
        agent_reply_ok(s->a, c->req, &e);
    }
    s->cur = NULL;
    session_scmd_free(c);
    session_reset_cmd_state(s);
    session_start_next(s);
}

static void
sync_retry_cb(sbx_loop *l, void *arg);

static void
send_sync(struct session *s)
{
    unsigned i = s->nrecent++ % RECENT;
    session_new_nonce(s->a, s->recent[i].n);
    s->recent[i].serial = s->serial;
    sbx_buf line;
    sbx_buf_init(&line);
    session_append_markers(&line, s->recent[i].n, "130");
    session_send_line(s, &line);
    sbx_buf_free(&line);
}

static void abort_line(struct session *s);

static void
sync_retry_cb(sbx_loop *l, void *arg)
{
    struct session *s = arg;
    (void)l;
    s->timer = 0;
    if (!s->cur || s->got_rc)
        return;
    if (sbx_mono_ms() - s->sigint_at > SYNC_GIVE_UP_MS) {
        /* The command ignores SIGINT (trap '' INT; a loop): the shell cannot
         * be saved.  Kill it; reaping ends the call as a timeout and the next
         * call gets a fresh shell. */
        session_kill_shell(s);
        return;
    }
    /* Again: the first try may have come before bash read the line (the
     * abort signal was still ignored then) or while it read the sync line. */
    abort_line(s);
    send_sync(s);
    s->timer = sbx_loop_timer(s->a->loop, SYNC_RETRY_MS, sync_retry_cb, s);
}

/*
 * Stop the running command and make the shell drop the rest of its line.
 * bash here runs without job control, so a SIGINT that reaches it while it
 * waits for a child is taken as "the child handled it" unless the child died
 * of SIGINT too (bash's wait-and-cooperative-exit rule, jobs.c wait_for), and
 * the line would go on.  So: freeze bash (SIGSTOP) so it cannot start the next
 * part of the line, kill every process the command started (they are newer
 * than the command), queue SESSION_ABORT_SIG, whose trap (armed by every line,
 * see run_cmd) runs as soon as bash is back from its wait and sends bash a
 * SIGINT of its own: an interactive bash then abandons the line it is
 * executing, loops of builtins included.  SIGCONT lets it go on.  A sync line
 * then confirms the shell is back at its prompt, state intact; the retries
 * send plain SIGINTs and cover a signal that landed while bash was reading
 * the sync line.
 */
static void
abort_line(struct session *s)
{
    kill(s->pid, SIGSTOP);
    agent_kill_tree_since(s->pid, true, NULL, 0, s->start_ticks);
    kill(s->pid, SESSION_ABORT_SIG);
    kill(s->pid, SIGCONT);
}

static void
interrupt_cmd(struct session *s)
{
    s->sigint_at = sbx_mono_ms();
    abort_line(s);
    send_sync(s);
    s->timer = sbx_loop_timer(s->a->loop, SYNC_RETRY_MS, sync_retry_cb, s);
}

static void
timeout_cb(sbx_loop *l, void *arg)
{
    struct session *s = arg;
    (void)l;
    s->timer = 0;
    if (!s->cur || s->got_rc)
        return;
    s->timed_out = true;
    interrupt_cmd(s);
}

/* A streamed command's reader cancelled: stop it as a timeout would. */
static void
cmd_stream_cancel(struct stream *st, void *arg)
{
    struct session *s = arg;
    if (!s->cur || s->cur->stream != st || s->got_rc)
        return;
    s->cur->cancelled = true;
    sbx_loop_cancel(s->a->loop, s->timer);
    s->timer = 0;
    session_pause_streams(s, false);
    interrupt_cmd(s);
}

static void
cmd_stream_resume(struct stream *st, void *arg)
{
    struct session *s = arg;
    (void)st;
    session_pause_streams(s, false);
}

const struct stream_ops session_cmd_stream_ops = {cmd_stream_resume, cmd_stream_cancel};

void
session_run_cmd(struct session *s, struct scmd *c)
{
    sbx_buf line;
    sbx_buf_init(&line);
    s->cur = c;
    s->used = s->used || !c->done;
    s->err_bol = true;
    s->serial++;
    session_new_nonce(s->a, s->nonce);
    outcap_init(&s->out[0], s->a->cfg.output_cap);
    outcap_init(&s->out[1], s->a->cfg.output_cap);
    s->start_us = sbx_mono_us();
    s->start_ticks = agent_boot_ticks();
    agent_work_mark(s->a, c, &s->wmark);
    s->timeout_ms = c->ea.timeout_ms ? c->ea.timeout_ms : s->default_timeout_ms;
    /* Stopped as by a timeout at the request's deadline at the latest: the
     * caller hears what it printed, and the session is free for the next
     * command instead of busy with one nobody waits for. */
    s->by_deadline = false;
    if (c->deadline_ms) {
        int64_t left = SBX_MAX(c->deadline_ms - sbx_mono_ms(), (int64_t)1);
        if (!s->timeout_ms || left < s->timeout_ms) {
            s->timeout_ms = left;
            s->by_deadline = true;
        }
    }
    if (c->stream) {
        const char *cmd = c->ea.cmd ? c->ea.cmd : c->ea.argv[0];
        bool cut;
        char *shown = agent_command_shown(cmd, strlen(cmd), &cut);
        sbx_enc *e = stream_begin(c->stream, "start");
        sbx_enc_kstr(e, "command", shown);
        if (cut)
            sbx_enc_kbool(e, "commandTruncated", true);
        free(shown);
        sbx_enc_kstr(e, "sessionId", s->id);
        stream_commit(c->stream, false);
    }

    /* Arm the abort trap (interrupt_cmd) for this line; bash keeps $? across
     * a trap, and the signal is one no program of the tenant's is sent. */
    sbx_buf_appendf(&line, "\\builtin trap '\\builtin kill -INT $$' %d; __sbx_c=",
                    SESSION_ABORT_SIG);
    if (c->ea.argv) {
        sbx_buf words;
        sbx_buf_init(&words);
        for (char **p = c->ea.argv; *p; p++) {
            if (p != c->ea.argv)
                sbx_buf_append(&words, " ", 1);
            session_quote_ansi_c(&words, *p, strlen(*p));
        }
        session_quote_ansi_c(&line, words.p, words.len);
        sbx_buf_free(&words);
    } else {
        session_quote_ansi_c(&line, c->ea.cmd, strlen(c->ea.cmd));
    }
    LIT(&line, "; ");
    size_t cwd_at = line.len;
    if (c->ea.cwd) {
        LIT(&line, "__sbx_owd=$PWD; \\builtin cd -- ");
        session_quote_ansi_c(&line, c->ea.cwd, strlen(c->ea.cwd));
        LIT(&line, " >/dev/null 2>&5 && ");
    }
    /* Per-call env (the SDK's exec env: "per-command, not kept"): exported
     * for the command and its children, then each variable gets back its
     * value and export session_attribute (bash's ${K@a}), or is unset again. */
    sbx_buf restore;
    sbx_buf_init(&restore);
    if (c->ea.env) {
        sbx_buf pre;
        sbx_buf_init(&pre);
        for (uint32_t i = 0; i < c->ea.env->via.map.size; i++) {
            const msgpack_object_kv *kv = &c->ea.env->via.map.ptr[i];
            sbx_str k;
            /* Names are shell identifiers (checked in agent_exec_session);
             * nil unsets the variable for this call, as in a fresh process. */
            if (sbx_wire_obj_str(&kv->key, &k) != 0)
                continue;
            int kn = (int)k.n;
            sbx_buf_appendf(&pre, "__sbx_s_%.*s=${%.*s+1}; __sbx_v_%.*s=${%.*s-}; "
                                  "__sbx_a_%.*s=${%.*s@a}; ",
                            kn, k.p, kn, k.p, kn, k.p, kn, k.p, kn, k.p, kn, k.p);
            if (kv->val.type == MSGPACK_OBJECT_STR) {
                sbx_buf_appendf(&pre, "\\builtin export %.*s=", kn, k.p);
                session_quote_ansi_c(&pre, kv->val.via.str.ptr, kv->val.via.str.size);
                LIT(&pre, "; ");
            } else {
                sbx_buf_appendf(&pre, "\\builtin unset %.*s; ", kn, k.p);
            }
            sbx_buf_appendf(&restore,
                            "if \\builtin test -n \"$__sbx_s_%.*s\"; then %.*s=$__sbx_v_%.*s; "
                            "case $__sbx_a_%.*s in *x*) \\builtin export %.*s;; "
                            "*) \\builtin export -n %.*s;; esac; "
                            "else \\builtin unset %.*s; fi; \\builtin unset __sbx_s_%.*s "
                            "__sbx_v_%.*s __sbx_a_%.*s; ",
                            kn, k.p, kn, k.p, kn, k.p, kn, k.p, kn, k.p, kn, k.p, kn, k.p, kn,
                            k.p, kn, k.p, kn, k.p);
        }
        /* The exports go before the cd: `cd X && { … }` must not skip them. */
        size_t at = cwd_at;
        sbx_buf tail;
        sbx_buf_init(&tail);
        sbx_buf_append(&tail, line.p + at, line.len - at);
        line.len = at;
        sbx_buf_append(&line, pre.p ? pre.p : "", pre.len);
        sbx_buf_append(&line, tail.p ? tail.p : "", tail.len);
        sbx_buf_free(&tail);
        sbx_buf_free(&pre);
    }
    LIT(&line, "{ ");
    if (c->ea.has_stdin) {
        /* Session commands read stdin from a private file written just
         * before; the line removes it afterwards. */
        char path[64];
        snprintf(path, sizeof(path), "/run/sbx-stdin-%s", s->nonce);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd >= 0) {
            sbx_write_full(fd, c->ea.stdin_data, c->ea.stdin_len);
            close(fd);
        }
        sbx_buf_appendf(&line, "\\builtin eval \"$__sbx_c\"; } <%s >&4 2>&5 3>&- 4>&- 5>&-; "
                               "__sbx_rc=$?; \\builtin command rm -f %s; ",
                        path, path);
    } else {
        LIT(&line, "\\builtin eval \"$__sbx_c\"; } </dev/null >&4 2>&5 3>&- 4>&- 5>&-; "
                              "__sbx_rc=$?; ");
    }
    if (c->ea.cwd)
        LIT(&line, "\\builtin cd -- \"$__sbx_owd\" >/dev/null 2>&1; ");
    sbx_buf_append(&line, restore.p ? restore.p : "", restore.len);
    sbx_buf_free(&restore);
    LIT(&line, "\\builtin unset __sbx_c; ");
    session_append_markers(&line, s->nonce, "\"$__sbx_rc\"");
    session_send_line(s, &line);
    sbx_buf_free(&line);
    if (s->timeout_ms > 0)
        s->timer = sbx_loop_timer(s->a->loop, s->timeout_ms, timeout_cb, s);
}

void
session_fail_cmd(struct session *s, struct scmd *c, int code, int exit_status, const char *msg)
{
    sbx_werr w;
    sbx_werr_init(&w, code, "%s", msg);
    sbx_enc_kstr(sbx_werr_ctx(&w), "sessionId", s->id);
    if (exit_status >= 0) {
        /* The shell died under the command (`exit N`): what it printed first
         * is still the caller's, and the code is its exit code. */
        sbx_enc_kint(sbx_werr_ctx(&w), "exitCode", exit_status);
        sbx_enc_kbin(sbx_werr_ctx(&w), "stdout", s->out[0].data.p ? s->out[0].data.p : "",
                     s->out[0].data.len);
        sbx_enc_kbin(sbx_werr_ctx(&w), "stderr", s->out[1].data.p ? s->out[1].data.p : "",
                     s->out[1].data.len);
    }
    if (c->stream) {
        sbx_enc *e = stream_begin(c->stream, "error");
        sbx_enc_str(e, "error");
        sbx_enc_werr(e, &w);
        stream_commit(c->stream, true);
    } else if (c->done) {
        c->done(s->a, c->done_arg, code, exit_status, &s->out[0]);
    } else if (c->req) {
        agent_reply_werr(s->a, c->req, &w);
    }
    sbx_werr_free(&w);
    session_scmd_free(c);
}

void
session_start_next(struct session *s)
{
    while (!s->cur && s->q_head) {
        if (s->pid == 0) {
            int rc = session_start_shell(s);
            if (rc) {
                struct scmd *c = s->q_head;
                s->q_head = c->next;
                if (!s->q_head)
                    s->q_tail = NULL;
                char msg[200];
                /* ENOSPC comes from posix_openpt only: every pseudo-terminal
                 * the host allows outside its initial devpts instance
                 * (kernel.pty.max - kernel.pty.reserve, 3,072 by default) is
                 * in use, one per running shell of every sandbox
                 * (docs/benchmarks.md, "Density"). */
                snprintf(msg, sizeof(msg), "could not start the session shell: %s",
                         rc == -ENOSPC ? "no pseudo-terminal left on the host (kernel.pty.max "
                                         "less kernel.pty.reserve are in use)"
                                       : strerror(-rc));
                session_fail_cmd(s, c, SBX_E_COMMAND, -1, msg);
                continue;
            }
        }
        struct scmd *c = s->q_head;
        s->q_head = c->next;
        if (!s->q_head)
            s->q_tail = NULL;
        if (c->deadline_ms && c->deadline_ms <= sbx_mono_ms()) {
            /* It waited behind other commands past its request's deadline:
             * the shard has answered REQUEST_TIMEOUT, and it must not run
             * now that nobody hears of it. */
            session_fail_cmd(s, c, SBX_E_TIMEOUT, -1,
                     "the command waited for the session past the request's deadline; it "
                     "did not run");
            continue;
        }
        session_run_cmd(s, c);
    }
}

void
session_kill_shell(struct session *s)
{
    if (s->pid > 0) {
        agent_kill_tree(s->pid, true, NULL, 0);
        kill(s->pid, SIGKILL);
    }
}
