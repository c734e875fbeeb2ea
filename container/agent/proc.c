/*
 * proc.c — background processes: startProcess, listProcesses, getProcess,
 * killProcess, killAllProcesses, getProcessLogs, streamProcessLogs (through
 * stream.c), waitForLog, waitForPort, waitForExit.
 *
 * Semantics follow the Cloudflare Sandbox SDK (reference §1.3, §2.5):
 *  - a process is a fresh process tree (its first process is a child
 *    subreaper and a session leader, so its whole tree can be signalled);
 *    started in a session it inherits that session's cwd and environment
 *    (asked from the session's shell) and dies when the session is deleted;
 *  - statuses: running, completed (exit 0), failed (exit ≠ 0), killed
 *    (killProcess, a timeout, or death by SIGKILL/SIGTERM), error (it could
 *    not start);
 *  - killProcess sends SIGTERM to the whole tree, waits 5 s, then SIGKILL
 *    (exit codes 143 / 137), and answers once the process has ended;
 *  - logs live in a ring stream (the newest 2 MiB): a process printing
 *    forever never grows the agent's memory; streamProcessLogs replays what
 *    is retained, then live output, then an `exit` event;
 *  - waitForLog matches a substring or a POSIX extended regular expression
 *    (regex(7); the SDK takes a JavaScript RegExp) against whole lines of
 *    stdout or stderr, those already written and those to come.
 *
 * This file holds the process table, start, output, end, kill and the
 * queries, called by main.c's dispatch and SIGCHLD handling; the waits
 * are proc_wait.c (proc_int.h).  One loop thread.
 */
#include "proc_int.h"
static void finalize(struct proc *p);

/* ------------------------------------------------------------------------------ */

static struct proc *
proc_find(struct agent *a, const char *id)
{
    for (struct proc *p = a->procs; p; p = p->next)
        if (!strcmp(p->id, id))
            return p;
    return NULL;
}

static void
iso(int64_t ms, char *out, size_t n)
{
    sbx_iso8601(ms, out, n);
}

/* command, and when it is shortened commandTruncated and commandBytes. */
static void
encode_command(struct proc *p, sbx_enc *e)
{
    sbx_enc_kstr(e, "command", p->command ? p->command : "");
    if (p->command_cut) {
        sbx_enc_kbool(e, "commandTruncated", true);
        sbx_enc_kint(e, "commandBytes", (int64_t)p->command_bytes);
    }
}

static void
encode_proc(struct proc *p, sbx_enc *e)
{
    char t[40];
    sbx_enc_map(e);
    sbx_enc_kstr(e, "id", p->id);
    if (p->pid > 0)
        sbx_enc_kint(e, "pid", p->pid);
    encode_command(p, e);
    sbx_enc_kstr(e, "status", p->status);
    iso(p->start_ms, t, sizeof(t));
    sbx_enc_kstr(e, "startTime", t);
    if (p->finished) {
        iso(p->end_ms, t, sizeof(t));
        sbx_enc_kstr(e, "endTime", t);
        sbx_enc_kint(e, "exitCode", p->exit_code);
        sbx_enc_kstr(e, "cause", p->cause);
        if (p->sig)
            sbx_enc_kint(e, "signal", p->sig);
    }
    if (p->session[0])
        sbx_enc_kstr(e, "sessionId", p->session);
    sbx_enc_end(e);
}

/* Free a process that is out of the table, has ended (or never started)
 * and has no waiter; its log stream lives on until read (stream.c). */
static void
proc_release(struct proc *p)
{
    agent_counters_cancel(p->a, p);
    if (p->log)
        stream_unref(p->log);
    free(p->command);
    sbx_buf_free(&p->line[0]);
    sbx_buf_free(&p->line[1]);
    exec_args_free(&p->ea);
    free(p);
}

/* Keep at most MAX_FINISHED finished processes (the oldest go first). */
static void
prune(struct agent *a)
{
    int n = 0;
    for (struct proc *p = a->procs; p; p = p->next)
        if (p->finished && !p->waiters)
            n++;
    while (n > MAX_FINISHED) {
        struct proc **oldest = NULL;
        for (struct proc **pp = &a->procs; *pp; pp = &(*pp)->next)
            if ((*pp)->finished && !(*pp)->waiters &&
                (!oldest || (*pp)->end_ms < (*oldest)->end_ms))
                oldest = pp;
        if (!oldest)
            break;
        struct proc *p = *oldest;
        *oldest = p->next;
        proc_release(p);
        n--;
    }
}

/* ------------------------------------------------------------------------------ */
/* Output. */

static void
close_fd(struct proc *p, int i, bool drain)
{
    if (p->fds[i] < 0)
        return;
    sbx_loop_unwatch(p->a->loop, p->w[i]);
    p->w[i] = NULL;
    if (drain)
        agent_hand_to_drainer(p->a, p->fds[i]);
    else
        close(p->fds[i]);
    p->fds[i] = -1;
}

static bool
read_out(struct proc *p, int i)
{
    char buf[65536];
    for (;;) {
        ssize_t r = read(p->fds[i], buf, sizeof(buf));
        if (r > 0) {
            const char *type = i == 1 ? "stdout" : "stderr";
            stream_data(p->log, type, buf, (size_t)r, "processId", p->id);
            proc_feed_lines(p, i - 1, buf, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return false;
        return true;
    }
}

static void
out_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct proc *p = arg;
    (void)l;
    (void)ev;
    int i = fd == p->fds[1] ? 1 : 2;
    if (read_out(p, i)) {
        close_fd(p, i, false);
        if (p->exited && p->fds[1] < 0 && p->fds[2] < 0)
            finalize(p);
    }
}

/* ------------------------------------------------------------------------------ */
/* Start. */

static int
parse_pid_arg(struct agent *a, struct agent_req *r, char *out, size_t n)
{
    sbx_str id;
    char why[160];
    if (sbx_wire_get_str(r->args, "processId", &id) != 0 && sbx_wire_get_str(r->args, "id", &id) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'processId' is required");
        return -1;
    }
    if (sbx_id_check_name("the process ID", id.p, id.n, 120, why, sizeof(why)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", why);
        return -1;
    }
    sbx_str_copy(id, out, n);
    return 0;
}

static void timeout_cb(sbx_loop *l, void *arg);

/*
 * The process could not start (its cwd is not a directory, the fork failed,
 * its session could not be asked): the start request fails with `code` and
 * the process leaves no entry behind.  That is what a user of the SDK
 * expects: startProcess threw, so there is no Process to list, get, kill or
 * wait for, and its ID — a custom one above all — is free for the corrected
 * call instead of being RESOURCE_BUSY.  Kept as an `error` entry it would
 * also have to invent an exit code for a process that never ran.  Whoever
 * found it while it was starting (a process started in a session waits for
 * the session's queue) is told: its log stream ends with an `error` event,
 * waiters get PROCESS_ERROR.  Then p is freed.
 */
static void
start_failed(struct proc *p, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void
start_failed(struct proc *p, int code, const char *fmt, ...)
{
    struct agent *a = p->a;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    for (struct proc **pp = &a->procs; *pp; pp = &(*pp)->next) {
        if (*pp == p) {
            *pp = p->next;
            break;
        }
    }
    sbx_werr w;
    sbx_werr_init(&w, code, "%s", msg);
    sbx_enc_kstr(sbx_werr_ctx(&w), "processId", p->id);
    sbx_enc *e = stream_begin(p->log, "error");
    sbx_enc_kstr(e, "processId", p->id);
    sbx_enc_str(e, "error");
    sbx_enc_werr(e, &w);
    stream_commit(p->log, true);
    if (p->start_req)
        agent_reply_werr(a, p->start_req, &w);
    p->start_req = NULL;
    sbx_werr_free(&w);
    while (p->waiters)
        proc_waiter_fail(p->waiters, SBX_E_PROCESS, "process %s could not start: %s", p->id, msg);
    proc_release(p);
}

/* Fork the process; env and cwd are final.  On failure p is freed. */
static void
launch(struct proc *p, char **env, const char *cwd)
{
    struct agent *a = p->a;
    struct agent_req *r = p->start_req;
    int po[2] = {-1, -1}, pe[2] = {-1, -1}, devnull = -1;
    p->start_req = NULL;
    struct stat st;
    if (stat(cwd, &st) < 0 || !S_ISDIR(st.st_mode)) {
        p->start_req = r;
        start_failed(p, SBX_E_VALIDATION, "cwd '%s' is not a directory in the sandbox", cwd);
        p = NULL;
        goto out;
    }
    if (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0 ||
        (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
        goto fail;
    const char *sh_argv[] = {"/bin/sh", "-c", p->ea.cmd, NULL};
    struct spawn_opts so = {
        .in_fd = devnull,
        .out_fd = po[1],
        .err_fd = pe[1],
        .cwd = cwd,
        .env = env,
        .argv = p->ea.argv ? (const char *const *)p->ea.argv : sh_argv,
        .subreaper = true,
        .new_session = true,
    };
    pid_t pid = agent_spawn(a, &so);
    if (pid < 0) {
        errno = -pid;
        goto fail;
    }
    p->pid = pid;
    p->start_ms = sbx_wall_ms();
    agent_work_mark(a, p, &p->wmark);
    snprintf(p->status, sizeof(p->status), "running");
    p->fds[1] = po[0];
    p->fds[2] = pe[0];
    po[0] = pe[0] = -1;
    sbx_set_nonblock(p->fds[1], true);
    sbx_set_nonblock(p->fds[2], true);
    p->w[1] = sbx_loop_watch(a->loop, p->fds[1], EPOLLIN, out_cb, p);
    p->w[2] = sbx_loop_watch(a->loop, p->fds[2], EPOLLIN, out_cb, p);
    if (p->timeout_ms > 0)
        p->timeout_timer = sbx_loop_timer(a->loop, p->timeout_ms, timeout_cb, p);
    sbx_enc *e = stream_begin(p->log, "process_info");
    sbx_enc_kstr(e, "processId", p->id);
    encode_command(p, e);
    sbx_enc_kstr(e, "status", "running");
    sbx_enc_kint(e, "pid", pid);
    stream_commit(p->log, false);
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kbool(&res, "success", true);
    sbx_enc_kstr(&res, "processId", p->id);
    sbx_enc_kint(&res, "pid", pid);
    encode_command(p, &res);
    sbx_enc_kstr(&res, "streamId", p->log->id);
    sbx_enc_str(&res, "process");
    encode_proc(p, &res);
    agent_reply_ok(a, r, &res);
    goto out;
fail:
    p->start_req = r;
    start_failed(p, SBX_E_PROCESS, "could not start process %s: %s", p->id, strerror(errno));
    p = NULL;
out:
    for (int i = 0; i < 2; i++) {
        if (po[i] >= 0) close(po[i]);
        if (pe[i] >= 0) close(pe[i]);
    }
    if (devnull >= 0)
        close(devnull);
    if (p)
        exec_args_free(&p->ea);
}

/* The session told us its cwd and environment: "PWD\0K=V\0K=V\0…". */
static void
session_state(struct agent *a, void *arg, int rc, int status, struct outcap *out)
{
    struct proc *p = arg;
    if (rc || status) {
        start_failed(p, SBX_E_PROCESS, "could not read the environment of session '%s'",
                     p->session);
        return;
    }
    const char *d = out->data.p ? out->data.p : "";
    size_t n = out->data.len, off = 0, cnt = 0;
    for (size_t i = 0; i < n; i++)
        if (d[i] == '\0')
            cnt++;
    char **env = sbx_xcalloc(cnt + 1, sizeof(char *));
    char *cwd = NULL;
    size_t k = 0;
    while (off < n) {
        size_t len = strnlen(d + off, n - off);
        if (!cwd)
            cwd = sbx_xstrndup(d + off, len);
        else if (memchr(d + off, '=', len))
            env[k++] = sbx_xstrndup(d + off, len);
        off += len + 1;
    }
    char **merged = agent_env_merge(env, p->ea.env);
    launch(p, merged, p->ea.cwd ? p->ea.cwd : (cwd && *cwd ? cwd : agent_default_cwd(p->a)));
    agent_env_free(merged);
    agent_env_free(env);
    free(cwd);
}

void
agent_op_process_start(struct agent *a, struct agent_req *r)
{
    _cleanup_err_ sbx_err_t err = NULL;
    char why[256], id[128];
    sbx_str s;
    struct proc *p = sbx_xcalloc(1, sizeof(*p));
    int rc = exec_args_parse(r->args, &p->ea, &err);
    if (rc) {
        free(p);
        agent_reply_err(a, r, rc, "%s", sbx_err_msg(err));
        return;
    }
    if (p->ea.has_stdin) {
        exec_args_free(&p->ea);
        free(p);
        agent_reply_err(a, r, SBX_E_VALIDATION, "background processes read /dev/null; "
                                                "'stdin' is for exec");
        return;
    }
    if (sbx_wire_get_str(r->args, "processId", &s) == 0) {
        if (sbx_id_check_name("the process ID", s.p, s.n, 120, why, sizeof(why)) != 0) {
            exec_args_free(&p->ea);
            free(p);
            agent_reply_err(a, r, SBX_E_VALIDATION, "%s", why);
            return;
        }
        sbx_str_copy(s, id, sizeof(id));
        if (proc_find(a, id)) {
            exec_args_free(&p->ea);
            free(p);
            agent_reply_err(a, r, SBX_E_BUSY, "a process with ID '%s' already exists", id);
            return;
        }
    } else {
        do
            snprintf(id, sizeof(id), "proc-%llu", (unsigned long long)++a->stream_ctr);
        while (proc_find(a, id));
    }
    sbx_str sid = {0};
    if (sbx_wire_get_str(r->args, "sessionId", &sid) == 0 &&
        sbx_id_check_name("the session ID", sid.p, sid.n, 120, why, sizeof(why)) != 0) {
        exec_args_free(&p->ea);
        free(p);
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", why);
        return;
    }
    p->a = a;
    p->have_cg = r->have_cg;
    p->cg = r->cg;
    snprintf(p->id, sizeof(p->id), "%s", id);
    if (p->ea.cmd) {
        p->command_bytes = strlen(p->ea.cmd);
        p->command = agent_command_shown(p->ea.cmd, p->command_bytes, &p->command_cut);
    } else {
        sbx_buf cb;
        sbx_buf_init(&cb);
        for (char **q = p->ea.argv; *q; q++) {
            if (q != p->ea.argv)
                sbx_buf_append(&cb, " ", 1);
            size_t n = strlen(*q);
            p->command_bytes += n + (q != p->ea.argv);
            if (cb.len <= AGENT_COMMAND_SHOWN) /* the rest is only counted */
                sbx_buf_append(&cb, *q, SBX_MIN(n, AGENT_COMMAND_SHOWN + 1 - cb.len));
        }
        p->command = agent_command_shown(cb.p ? cb.p : "", cb.len, &p->command_cut);
        sbx_buf_free(&cb);
    }
    if (sid.n)
        sbx_str_copy(sid, p->session, sizeof(p->session));
    p->fds[0] = p->fds[1] = p->fds[2] = -1;
    p->timeout_ms = p->ea.timeout_ms;
    p->start_ms = sbx_wall_ms();
    snprintf(p->status, sizeof(p->status), "starting");
    sbx_buf_init(&p->line[0]);
    sbx_buf_init(&p->line[1]);
    char lid[140];
    snprintf(lid, sizeof(lid), "proc:%s", id);
    p->log = stream_new(a, lid, false, LOG_RING_BYTES, NULL, NULL);
    p->start_req = r;
    p->next = a->procs;
    a->procs = p;
    prune(a);
    if (p->session[0]) {
        agent_session_internal(a, p->session,
                               "\\builtin printf '%s\\0' \"$PWD\"; /usr/bin/env -0",
                               session_state, p);
        return;
    }
    char **env = agent_env_merge(a->env, p->ea.env);
    launch(p, env, p->ea.cwd ? p->ea.cwd : agent_default_cwd(a));
    agent_env_free(env);
}

/* ------------------------------------------------------------------------------ */
/* End of a process. */

static void
finalize(struct proc *p)
{
    struct agent *a = p->a;
    if (p->finished || p->refining)
        return;
    p->finished = true;
    p->end_ms = sbx_wall_ms();
    sbx_loop_cancel(a->loop, p->kill_timer);
    sbx_loop_cancel(a->loop, p->timeout_timer);
    sbx_loop_cancel(a->loop, p->grace_timer);
    p->kill_timer = p->timeout_timer = p->grace_timer = 0;
    /* Lines still open count as lines now. */
    for (int i = 0; i < 2; i++)
        if (p->line[i].len) {
            proc_on_line(p, p->line[i].p, p->line[i].len);
            p->line[i].len = 0;
        }
    char data[96];
    snprintf(data, sizeof(data), "Process %s with exit code %d", p->status, p->exit_code);
    sbx_enc *e = stream_begin(p->log, "exit");
    sbx_enc_kstr(e, "processId", p->id);
    sbx_enc_kint(e, "exitCode", p->exit_code);
    sbx_enc_kstr(e, "status", p->status);
    sbx_enc_kstr(e, "cause", p->cause);
    sbx_enc_kstr(e, "data", data);
    stream_commit(p->log, true);
    /* Answer everyone waiting on this process. */
    while (p->waiters) {
        struct waiter *w = p->waiters;
        if (w->kind == W_EXIT || w->kind == W_KILL) {
            sbx_enc res;
            sbx_enc_init(&res);
            sbx_enc_map(&res);
            sbx_enc_kbool(&res, "success", true);
            sbx_enc_kstr(&res, "processId", p->id);
            sbx_enc_kint(&res, "exitCode", p->exit_code);
            sbx_enc_kstr(&res, "status", p->status);
            if (w->ka) {
                struct killall *ka = w->ka;
                proc_waiter_unlink(w);
                sbx_enc_free(&res);
                proc_waiter_free(a, w);
                if (--ka->remaining == 0) {
                    sbx_enc r2;
                    sbx_enc_init(&r2);
                    sbx_enc_map(&r2);
                    sbx_enc_kbool(&r2, "success", true);
                    sbx_enc_kint(&r2, "killedCount", ka->count);
                    sbx_enc_kint(&r2, "cleanedCount", ka->count);
                    agent_reply_ok(a, ka->req, &r2);
                    free(ka);
                }
                continue;
            }
            proc_waiter_ok(w, &res);
        } else {
            proc_waiter_fail(w, SBX_E_EXITED_BEFORE_READY,
                        "Process exited with code %d before becoming ready", p->exit_code);
        }
    }
    prune(a);
}

static void
grace_cb(sbx_loop *l, void *arg)
{
    struct proc *p = arg;
    (void)l;
    p->grace_timer = 0;
    for (int i = 1; i <= 2; i++)
        if (p->fds[i] >= 0)
            close_fd(p, i, !read_out(p, i));
    finalize(p);
}

static int
says_fork_refused(void *arg, const msgpack_object *ev)
{
    sbx_str data;
    (void)arg;
    return sbx_wire_get_bin(ev, "data", &data) == 0 && agent_fork_refused_in(data.p, data.n);
}

/* The shard's counters for a process that ended on its own with SIGKILL or
 * a failure: OOM_KILLED or PIDS_LIMIT, as for exec (agent_refine_cause) —
 * then its end goes on (finalize: status, the log's exit event, waiters). */
static void
proc_counters(struct agent *a, void *arg, bool ok, const struct agent_counters *now)
{
    struct proc *p = arg;
    (void)a;
    p->refining = false;
    if (ok) {
        const char *c0 = p->sig ? "KILLED" : "EXITED";
        bool blame = agent_work_alone(p->a, p, &p->wmark) ||
                     stream_foreach(p->log, says_fork_refused, NULL) != 0;
        const char *c1 = agent_refine_cause(c0, p->exit_code, p->sig, &p->cg, now, blame);
        if (strcmp(c0, c1))
            snprintf(p->cause, sizeof(p->cause), "%s", c1);
    }
    if (p->fds[1] < 0 && p->fds[2] < 0)
        finalize(p); /* else the output's end or the grace timer does */
}

bool
agent_procs_reaped(struct agent *a, pid_t pid, int status)
{
    for (struct proc *p = a->procs; p; p = p->next) {
        if (p->pid != pid || p->exited)
            continue;
        p->exited = true;
        if (WIFEXITED(status)) {
            p->exit_code = WEXITSTATUS(status);
        } else {
            p->sig = WTERMSIG(status);
            p->exit_code = 128 + p->sig;
        }
        if (p->timed_out) {
            p->exit_code = 124;
            snprintf(p->status, sizeof(p->status), "killed");
            snprintf(p->cause, sizeof(p->cause), "TIMEOUT");
        } else if (p->kill_req || p->sig == SIGKILL || p->sig == SIGTERM ||
                   p->exit_code == 137 || p->exit_code == 143) {
            snprintf(p->status, sizeof(p->status), "killed");
            snprintf(p->cause, sizeof(p->cause), "KILLED");
        } else {
            snprintf(p->status, sizeof(p->status), p->exit_code == 0 ? "completed" : "failed");
            snprintf(p->cause, sizeof(p->cause), p->sig ? "KILLED" : "EXITED");
        }
        /* Ended on its own by SIGKILL (or a shell's 137), or failed: the
         * memory or pids limit may be why; only the shard sees its
         * counters, and the end waits for them. */
        if (p->have_cg && !p->timed_out && !p->kill_req &&
            (p->sig == SIGKILL || (!p->sig && p->exit_code != 0))) {
            p->refining = true;
            agent_counters_ask(a, proc_counters, p);
        }
        for (int i = 1; i <= 2; i++)
            if (p->fds[i] >= 0 && read_out(p, i))
                close_fd(p, i, false);
        if (p->fds[1] >= 0 || p->fds[2] >= 0)
            p->grace_timer = sbx_loop_timer(a->loop, 20, grace_cb, p);
        else
            finalize(p);
        return true;
    }
    return false;
}

/* ------------------------------------------------------------------------------ */
/* Kill. */

static void
kill_timer_cb(sbx_loop *l, void *arg)
{
    struct proc *p = arg;
    (void)l;
    p->kill_timer = 0;
    if (!p->exited)
        agent_kill_tree(p->pid, false, NULL, 0);
}

static void
timeout_cb(sbx_loop *l, void *arg)
{
    struct proc *p = arg;
    (void)l;
    p->timeout_timer = 0;
    if (p->exited)
        return;
    p->timed_out = true;
    agent_kill_tree(p->pid, false, NULL, 0);
}

/* TERM to the whole tree, KILL after the grace (SDK Session.killCommand). */
static void
start_kill(struct proc *p)
{
    if (p->exited || p->kill_req)
        return;
    p->kill_req = true;
    agent_signal_tree(p->pid, SIGTERM, true);
    p->kill_timer = sbx_loop_timer(p->a->loop, KILL_GRACE_MS, kill_timer_cb, p);
}

struct waiter *
proc_add_waiter(struct proc *p, enum wkind kind, struct agent_req *r)
{
    struct waiter *w = sbx_xcalloc(1, sizeof(*w));
    w->p = p;
    w->kind = kind;
    w->req = r;
    w->sock = -1;
    sbx_buf_init(&w->resp);
    w->next = p->waiters;
    p->waiters = w;
    return w;
}

struct proc *
proc_arg(struct agent *a, struct agent_req *r)
{
    char id[128];
    if (parse_pid_arg(a, r, id, sizeof(id)) != 0)
        return NULL;
    struct proc *p = proc_find(a, id);
    if (!p)
        agent_reply_err(a, r, SBX_E_PROCESS_NOT_FOUND, "process '%s' not found", id);
    return p;
}

void
agent_op_process_kill(struct agent *a, struct agent_req *r)
{
    struct proc *p = proc_arg(a, r);
    if (!p)
        return;
    if (p->finished || p->pid <= 0) {
        sbx_enc res;
        sbx_enc_init(&res);
        sbx_enc_map(&res);
        sbx_enc_kbool(&res, "success", true);
        sbx_enc_kstr(&res, "processId", p->id);
        sbx_enc_kint(&res, "exitCode", p->exit_code);
        sbx_enc_kstr(&res, "status", p->status);
        agent_reply_ok(a, r, &res);
        return;
    }
    proc_add_waiter(p, W_KILL, r);
    start_kill(p);
}

void
agent_op_process_kill_all(struct agent *a, struct agent_req *r)
{
    struct killall *ka = sbx_xcalloc(1, sizeof(*ka));
    ka->req = r;
    for (struct proc *p = a->procs; p; p = p->next) {
        if (p->finished || p->pid <= 0)
            continue;
        struct waiter *w = proc_add_waiter(p, W_KILL, NULL);
        w->ka = ka;
        ka->remaining++;
        ka->count++;
        start_kill(p);
    }
    if (ka->remaining == 0) {
        sbx_enc res;
        sbx_enc_init(&res);
        sbx_enc_map(&res);
        sbx_enc_kbool(&res, "success", true);
        sbx_enc_kint(&res, "killedCount", 0);
        sbx_enc_kint(&res, "cleanedCount", 0);
        agent_reply_ok(a, r, &res);
        free(ka);
    }
}

void
agent_procs_kill_session(struct agent *a, const char *sid)
{
    for (struct proc *p = a->procs; p; p = p->next) {
        if (strcmp(p->session, sid) || p->exited || p->pid <= 0)
            continue;
        p->kill_req = true;
        agent_kill_tree(p->pid, false, NULL, 0);
    }
}

/* ------------------------------------------------------------------------------ */
/* Queries. */

void
agent_op_process_list(struct agent *a, struct agent_req *r)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_karray(&e, "processes");
    for (struct proc *p = a->procs; p; p = p->next)
        encode_proc(p, &e);
    sbx_enc_end(&e);
    agent_reply_ok(a, r, &e);
}

void
agent_op_process_get(struct agent *a, struct agent_req *r)
{
    struct proc *p = proc_arg(a, r);
    if (!p)
        return;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_str(&e, "process");
    encode_proc(p, &e);
    agent_reply_ok(a, r, &e);
}

struct logs_ctx {
    sbx_buf out, err;
};

static int
collect(void *arg, const msgpack_object *ev)
{
    struct logs_ctx *lc = arg;
    sbx_str type, data;
    if (sbx_wire_get_str(ev, "type", &type) != 0 || sbx_wire_get_bin(ev, "data", &data) != 0)
        return 0;
    if (sbx_str_eq(type, "stdout"))
        sbx_buf_append(&lc->out, data.p, data.n);
    else if (sbx_str_eq(type, "stderr"))
        sbx_buf_append(&lc->err, data.p, data.n);
    return 0;
}

void
agent_op_process_logs(struct agent *a, struct agent_req *r)
{
    struct proc *p = proc_arg(a, r);
    if (!p)
        return;
    struct logs_ctx lc;
    sbx_buf_init(&lc.out);
    sbx_buf_init(&lc.err);
    stream_foreach(p->log, collect, &lc);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "processId", p->id);
    sbx_enc_kbin(&e, "stdout", lc.out.p ? lc.out.p : "", lc.out.len);
    sbx_enc_kbin(&e, "stderr", lc.err.p ? lc.err.p : "", lc.err.len);
    /* The ring dropped older output once it held more than its size. */
    sbx_enc_kbool(&e, "truncated", p->log->first_seq > 1);
    sbx_enc_kstr(&e, "status", p->status);
    agent_reply_ok(a, r, &e);
    sbx_buf_free(&lc.out);
    sbx_buf_free(&lc.err);
}

bool
agent_procs_running(struct agent *a, const void *self)
{
    for (struct proc *p = a->procs; p; p = p->next)
        if ((const void *)p != self && p->pid > 0 && !p->exited)
            return true;
    return false;
}

void
agent_procs_free(struct agent *a)
{
    while (a->procs) {
        struct proc *p = a->procs;
        a->procs = p->next;
        if (!p->exited && p->pid > 0)
            agent_kill_tree(p->pid, false, NULL, 0);
        while (p->waiters) {
            struct waiter *w = p->waiters;
            p->waiters = w->next;
            if (w->req)
                agent_req_free(w->req);
            if (w->ka) {
                if (--w->ka->remaining == 0) {
                    agent_req_free(w->ka->req);
                    free(w->ka);
                }
            }
            proc_waiter_free(a, w);
        }
        for (int i = 0; i < 3; i++)
            if (p->fds[i] >= 0) {
                sbx_loop_unwatch(a->loop, p->w[i]);
                close(p->fds[i]);
            }
        sbx_loop_cancel(a->loop, p->kill_timer);
        sbx_loop_cancel(a->loop, p->timeout_timer);
        sbx_loop_cancel(a->loop, p->grace_timer);
        if (p->start_req)
            agent_req_free(p->start_req);
        free(p->command);
        sbx_buf_free(&p->line[0]);
        sbx_buf_free(&p->line[1]);
        exec_args_free(&p->ea);
        free(p);
    }
}
