/*
 * exec.c — commands run as fresh processes (exec, exec.stream and internal
 * jobs); what sessions and background processes share with them is in
 * exec_args.c (arguments, output capture, result shape, exit causes) and
 * proctree.c (spawning, the process-tree kill).
 *
 * A fresh command (the SDK's "sessionless" mode) is `/bin/sh -c CMD` or an
 * argv, started by fork+exec from this single-threaded PID 1 with stdout and
 * stderr on two pipes.  The child is made a child subreaper
 * (prctl(2) PR_SET_CHILD_SUBREAPER) and the leader of a new session, so
 * every process it starts stays in its subtree even when a middle process
 * exits: a timeout can then kill the whole tree by walking /proc, as the
 * SDK's process kill does, without missing double-forked children.
 *
 * The reply is sent when the command's own process has exited and its
 * output has been drained.  Background children that keep the pipes open
 * (`server &`) do not delay it: after a short grace the pipes are handed to
 * a drainer that discards what they write until they close, so such
 * children never block on a full pipe nor die of SIGPIPE.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define DRAIN_GRACE_MS 20
/* ------------------------------------------------------------------------------ */
/* Fresh-process jobs: plain exec, exec streams, internal jobs. */

struct job {
    struct job *next;
    struct agent *a;
    struct agent_req *req;   /* answered at the end (plain exec), or NULL */
    struct stream *stream;   /* exec stream: output as events, or NULL */
    job_done_fn done;        /* internal job: called at the end, or NULL */
    void *done_arg;
    pid_t pid;
    int fds[3];              /* our ends: stdin (write), stdout, stderr (read); -1 when closed */
    sbx_watch *w[3];
    struct outcap out, err;
    char *in_data;
    size_t in_len, in_off;
    char *command;           /* for the stream's start event (agent_command_shown) */
    bool command_cut;
    int64_t start_us, timeout_ms;
    uint64_t timer, grace;
    bool exited, timed_out, cancelled, paused;
    int status;
    /* Its cause: the request's cgroup counters and what else ran
     * (agent_refine_cause); the end waits for the shard's counters. */
    bool have_cg, asked, answered;
    struct agent_counters cg;
    struct work_mark mark;
    const char *cause;       /* refined, or NULL */
    bool by_deadline;        /* its timeout is the request's deadline */
};

bool
agent_others_running(struct agent *a, const void *self)
{
    for (struct job *j = a->jobs; j; j = j->next)
        if ((const void *)j != self && !j->exited)
            return true;
    return agent_procs_running(a, self) || agent_sessions_busy(a, self) ||
           agent_interp_busy(a) || agent_terms_open(a);
}

/* Pipes handed over after the end: read and discard until EOF. */
struct drain {
    int fd;
    sbx_watch *w;
};

static void
drain_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct drain *d = arg;
    char buf[65536];
    (void)ev;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0)
            continue;
        if (r < 0 && (errno == EINTR))
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        break; /* EOF or error */
    }
    sbx_loop_unwatch(l, d->w);
    close(d->fd);
    free(d);
}

void
agent_hand_to_drainer(struct agent *a, int fd)
{
    struct drain *d = sbx_xmalloc(sizeof(*d));
    d->fd = fd;
    d->w = sbx_loop_watch(a->loop, fd, EPOLLIN, drain_cb, d);
}

static void
job_close_fd(struct job *j, int i, bool drain)
{
    if (j->fds[i] < 0)
        return;
    sbx_loop_unwatch(j->a->loop, j->w[i]);
    j->w[i] = NULL;
    if (drain)
        agent_hand_to_drainer(j->a, j->fds[i]);
    else
        close(j->fds[i]);
    j->fds[i] = -1;
}

/* Read what a pipe has now; returns true at EOF.  A stream that is full
 * stops the reading (back-pressure) unless `force`. */
static bool
job_read(struct job *j, int i, bool force)
{
    char buf[65536];
    for (;;) {
        if (j->stream && !force && stream_full(j->stream)) {
            j->stream->paused = true;
            j->paused = true;
            for (int k = 1; k <= 2; k++)
                if (j->w[k])
                    sbx_loop_modify(j->a->loop, j->w[k], 0);
            return false;
        }
        ssize_t r = read(j->fds[i], buf, sizeof(buf));
        if (r > 0) {
            if (j->stream)
                stream_data(j->stream, i == 1 ? "stdout" : "stderr", buf, (size_t)r, NULL, NULL);
            else
                outcap_add(i == 1 ? &j->out : &j->err, buf, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return false;
        return true;
    }
}

static void job_finish(struct job *j);

static void
job_maybe_finish(struct job *j)
{
    if (j->exited && j->fds[1] < 0 && j->fds[2] < 0)
        job_finish(j);
}

static void
job_io_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct job *j = arg;
    (void)l;
    (void)ev;
    int i = (fd == j->fds[1]) ? 1 : 2;
    if (job_read(j, i, false)) {
        job_close_fd(j, i, false);
        job_maybe_finish(j);
    }
}

static void
job_stream_resume(struct stream *st, void *arg)
{
    struct job *j = arg;
    (void)st;
    j->paused = false;
    for (int k = 1; k <= 2; k++)
        if (j->w[k])
            sbx_loop_modify(j->a->loop, j->w[k], EPOLLIN);
}

static void
job_kill(struct job *j)
{
    agent_kill_tree(j->pid, false, NULL, 0);
}

static void
job_stream_cancel(struct stream *st, void *arg)
{
    struct job *j = arg;
    (void)st;
    if (j->exited)
        return;
    j->cancelled = true;
    job_kill(j);
}

static const struct stream_ops job_stream_ops = {job_stream_resume, job_stream_cancel};

static void
job_stdin_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct job *j = arg;
    (void)l;
    (void)ev;
    while (j->in_off < j->in_len) {
        ssize_t w = write(fd, j->in_data + j->in_off, j->in_len - j->in_off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return;
            break; /* EPIPE: the command does not read its stdin */
        }
        j->in_off += (size_t)w;
    }
    job_close_fd(j, 0, false);
}

static void
job_timeout_cb(sbx_loop *l, void *arg)
{
    struct job *j = arg;
    (void)l;
    j->timer = 0;
    if (j->exited)
        return;
    j->timed_out = true;
    job_kill(j);
}

static void
job_grace_cb(sbx_loop *l, void *arg)
{
    struct job *j = arg;
    (void)l;
    j->grace = 0;
    for (int i = 1; i <= 2; i++) {
        if (j->fds[i] >= 0) {
            bool eof = job_read(j, i, true);
            job_close_fd(j, i, !eof);
        }
    }
    job_maybe_finish(j);
}

static void
job_unlink(struct agent *a, struct job *j)
{
    for (struct job **pp = &a->jobs; *pp; pp = &(*pp)->next) {
        if (*pp == j) {
            *pp = j->next;
            return;
        }
    }
}

void
exec_encode_complete(sbx_enc *e, int exit_code, int sig, bool timed_out, bool cancelled,
                     int64_t timeout_ms, int64_t duration_ms, const char *cause)
{
    sbx_enc_kint(e, "exitCode", exit_code);
    sbx_enc_kbool(e, "success", exit_code == 0 && !timed_out && !cancelled);
    sbx_enc_kint(e, "duration", duration_ms);
    sbx_enc_kbool(e, "timedOut", timed_out);
    if (timed_out)
        sbx_enc_kint(e, "timeout", timeout_ms);
    if (cancelled)
        sbx_enc_kbool(e, "cancelled", true);
    if (sig)
        sbx_enc_kint(e, "signal", sig);
    sbx_enc_kstr(e, "cause", cause                ? cause
                             : timed_out          ? "TIMEOUT"
                             : (sig || cancelled) ? "KILLED"
                                                  : "EXITED");
}

static void
job_free(struct job *j)
{
    agent_counters_cancel(j->a, j);
    outcap_free(&j->out);
    outcap_free(&j->err);
    free(j->in_data);
    free(j->command);
    free(j);
}

static void job_finish(struct job *j);

/* The shard's counters for a job that ended: its cause, then its end. */
static void
job_counters(struct agent *a, void *arg, bool ok, const struct agent_counters *now)
{
    struct job *j = arg;
    int sig = WIFEXITED(j->status) ? 0 : WTERMSIG(j->status);
    int code = sig ? 128 + sig : WEXITSTATUS(j->status);
    (void)a;
    j->answered = true;
    if (ok) {
        bool blame = agent_work_alone(j->a, j, &j->mark) ||
                     agent_fork_refused_in(j->out.data.p, j->out.data.len) ||
                     agent_fork_refused_in(j->err.data.p, j->err.data.len);
        const char *c = agent_refine_cause(sig ? "KILLED" : "EXITED", code, sig, &j->cg, now, blame);
        if (strcmp(c, sig ? "KILLED" : "EXITED"))
            j->cause = c;
    }
    job_finish(j);
}

static void
job_finish(struct job *j)
{
    struct agent *a = j->a;
    int code, sig = 0;
    if (WIFEXITED(j->status)) {
        code = WEXITSTATUS(j->status);
    } else {
        sig = WTERMSIG(j->status);
        code = 128 + sig;
    }
    /* A command that failed or was SIGKILLed on its own may have met the
     * sandbox's memory or pids limit: only the shard sees those counters.
     * The end waits for them (the job stays in the list, exited, until). */
    if (j->asked && !j->answered)
        return;
    if (!j->asked && j->have_cg && (j->req || j->stream) && !j->timed_out && !j->cancelled &&
        (sig == SIGKILL || (!sig && code != 0))) {
        j->asked = true;
        agent_counters_ask(a, job_counters, j);
        return;
    }
    if (j->timed_out)
        code = 124;
    int64_t dur = (sbx_mono_us() - j->start_us) / 1000;
    sbx_loop_cancel(a->loop, j->timer);
    sbx_loop_cancel(a->loop, j->grace);
    job_close_fd(j, 0, false);
    job_unlink(a, j);
    if (j->stream) {
        if (j->timed_out) {
            char note[96];
            int n = snprintf(note, sizeof(note), "Command timed out after %lldms\n",
                             (long long)j->timeout_ms);
            stream_data(j->stream, "stderr", note, (size_t)n, NULL, NULL);
        }
        sbx_enc *e = stream_begin(j->stream, "complete");
        exec_encode_complete(e, code, j->timed_out ? 0 : sig, j->timed_out, j->cancelled,
                             j->timeout_ms, dur, j->cause);
        stream_commit(j->stream, true);
        j->stream->ops = NULL;
        stream_unref(j->stream);
    } else if (j->done) {
        j->done(a, j->done_arg, code, j->timed_out, &j->out, &j->err);
    } else if (j->req) {
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        exec_encode_result(&e, code, j->timed_out ? 0 : sig, j->timed_out, j->timeout_ms, dur,
                           &j->out, &j->err, j->cause, j->by_deadline);
        agent_reply_ok(a, j->req, &e);
    }
    job_free(j);
}

void
agent_job_reaped(struct agent *a, pid_t pid, int status)
{
    for (struct job *j = a->jobs; j; j = j->next) {
        if (j->pid != pid || j->exited)
            continue;
        j->exited = true;
        j->status = status;
        /* What the process wrote is in the pipes already; take it now (past
         * a stream's cap: the process is gone, nothing more will come), and
         * give its children a moment to close their copies. */
        for (int i = 1; i <= 2; i++) {
            if (j->fds[i] >= 0 && job_read(j, i, true))
                job_close_fd(j, i, false);
        }
        if (j->fds[1] >= 0 || j->fds[2] >= 0)
            j->grace = sbx_loop_timer(a->loop, DRAIN_GRACE_MS, job_grace_cb, j);
        job_maybe_finish(j);
        return;
    }
}

/* Start a job for args; on success the job owns req and is running. */
static int
job_start(struct agent *a, struct exec_args *ea, struct job **out, sbx_err_t *err)
{
    int p_in[2] = {-1, -1}, p_out[2] = {-1, -1}, p_err[2] = {-1, -1};
    int devnull = -1, rc = 0;
    char **env = NULL;
    struct job *j = NULL;

    const char *cwd = ea->cwd ? ea->cwd : agent_default_cwd(a);
    struct stat st;
    if (stat(cwd, &st) < 0 || !S_ISDIR(st.st_mode)) {
        return sbx_err_make(err, SBX_E_VALIDATION, "cwd '%s' is not a directory in the sandbox",
                            cwd);
    }
    if (pipe2(p_out, O_CLOEXEC) < 0 || pipe2(p_err, O_CLOEXEC) < 0 ||
        (ea->has_stdin && pipe2(p_in, O_CLOEXEC) < 0) ||
        (!ea->has_stdin && (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)) {
        rc = sbx_err_make(err, -errno, "could not start the command");
        goto out;
    }
    env = agent_env_merge(a->env, ea->env);
    const char *sh_argv[] = {"/bin/sh", "-c", ea->cmd, NULL};
    struct spawn_opts so = {
        .in_fd = ea->has_stdin ? p_in[0] : devnull,
        .out_fd = p_out[1],
        .err_fd = p_err[1],
        .cwd = cwd,
        .env = env,
        .argv = ea->argv ? (const char *const *)ea->argv : sh_argv,
        .subreaper = true,
        .new_session = true,
    };
    j = sbx_xcalloc(1, sizeof(*j));
    j->start_us = sbx_mono_us();
    pid_t pid = agent_spawn(a, &so);
    if (pid < 0) {
        rc = sbx_err_make(err, (int)pid, "could not start the command");
        free(j);
        j = NULL;
        goto out;
    }
    j->a = a;
    j->pid = pid;
    agent_work_mark(a, j, &j->mark);
    j->timeout_ms = ea->timeout_ms;
    const char *shown = ea->cmd ? ea->cmd : (ea->argv ? ea->argv[0] : "");
    j->command = agent_command_shown(shown, strlen(shown), &j->command_cut);
    outcap_init(&j->out, a->cfg.output_cap);
    outcap_init(&j->err, a->cfg.output_cap);
    j->fds[0] = -1;
    j->fds[1] = p_out[0];
    j->fds[2] = p_err[0];
    p_out[0] = p_err[0] = -1;
    sbx_set_nonblock(j->fds[1], true);
    sbx_set_nonblock(j->fds[2], true);
    j->w[1] = sbx_loop_watch(a->loop, j->fds[1], EPOLLIN, job_io_cb, j);
    j->w[2] = sbx_loop_watch(a->loop, j->fds[2], EPOLLIN, job_io_cb, j);
    if (ea->has_stdin) {
        j->fds[0] = p_in[1];
        p_in[1] = -1;
        j->in_data = ea->stdin_data;
        j->in_len = ea->stdin_len;
        ea->stdin_data = NULL;
        sbx_set_nonblock(j->fds[0], true);
        j->w[0] = sbx_loop_watch(a->loop, j->fds[0], EPOLLOUT, job_stdin_cb, j);
    }
    if (ea->timeout_ms > 0)
        j->timer = sbx_loop_timer(a->loop, ea->timeout_ms, job_timeout_cb, j);
    j->next = a->jobs;
    a->jobs = j;
    *out = j;
out:
    for (int i = 0; i < 2; i++) {
        if (p_in[i] >= 0) close(p_in[i]);
        if (p_out[i] >= 0) close(p_out[i]);
        if (p_err[i] >= 0) close(p_err[i]);
    }
    if (devnull >= 0)
        close(devnull);
    agent_env_free(env);
    return rc ? rc : 0;
}

void
agent_exec_fresh(struct agent *a, struct agent_req *r)
{
    struct exec_args ea;
    _cleanup_err_ sbx_err_t err = NULL;
    struct job *j;
    bool by_deadline = false;
    int rc = exec_args_parse(r->args, &ea, &err);
    /* Killed as by a timeout at the request's deadline at the latest: the
     * caller hears what it printed, and nothing runs on unheard. */
    if (rc == 0)
        ea.timeout_ms = agent_bound_timeout(r, ea.timeout_ms, &by_deadline);
    if (rc == 0)
        rc = job_start(a, &ea, &j, &err);
    if (rc) {
        agent_reply_err(a, r, rc == SBX_E_VALIDATION ? rc : SBX_E_COMMAND, "%s",
                        sbx_err_msg(err));
    } else {
        j->req = r;
        j->have_cg = r->have_cg;
        j->cg = r->cg;
        j->by_deadline = by_deadline;
    }
    exec_args_free(&ea);
}

void
agent_exec_fresh_stream(struct agent *a, struct agent_req *r)
{
    struct exec_args ea;
    _cleanup_err_ sbx_err_t err = NULL;
    char sid[72];
    struct job *j;
    int rc = exec_args_parse(r->args, &ea, &err);
    if (rc == 0)
        rc = job_start(a, &ea, &j, &err);
    if (rc) {
        agent_reply_err(a, r, rc == SBX_E_VALIDATION ? rc : SBX_E_COMMAND, "%s",
                        sbx_err_msg(err));
        exec_args_free(&ea);
        return;
    }
    snprintf(sid, sizeof(sid), "exec-%llu", (unsigned long long)++a->stream_ctr);
    j->have_cg = r->have_cg;
    j->cg = r->cg;
    j->stream = stream_new(a, sid, true, 1u << 20, &job_stream_ops, j);
    sbx_enc *e = stream_begin(j->stream, "start");
    sbx_enc_kstr(e, "command", j->command);
    if (j->command_cut)
        sbx_enc_kbool(e, "commandTruncated", true);
    sbx_enc_kint(e, "pid", j->pid);
    stream_commit(j->stream, false);
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kstr(&res, "streamId", sid);
    agent_reply_ok(a, r, &res);
    exec_args_free(&ea);
}

int
agent_run_internal(struct agent *a, const char *const *argv, const char *cwd, int64_t timeout_ms,
                   job_done_fn done, void *arg)
{
    struct exec_args ea;
    _cleanup_err_ sbx_err_t err = NULL;
    struct job *j;
    memset(&ea, 0, sizeof(ea));
    size_t n = 0;
    while (argv[n])
        n++;
    ea.argv = sbx_xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        ea.argv[i] = sbx_xstrdup(argv[i]);
    ea.cwd = cwd ? sbx_xstrdup(cwd) : NULL;
    ea.timeout_ms = timeout_ms;
    int rc = job_start(a, &ea, &j, &err);
    if (rc == 0) {
        j->done = done;
        j->done_arg = arg;
    }
    exec_args_free(&ea);
    return rc;
}
