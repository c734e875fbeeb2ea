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
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/id.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define MARK_PREFIX "\001SBX"
#define MARK_LEN (4 + 16 + 1) /* prefix + 16 hex + \002 */
#define SYNC_RETRY_MS 250
#define SYNC_GIVE_UP_MS 2000
/* Reserved in sessions: the signal whose trap aborts the running line.
 * SIGURG because its default action is to be ignored (signal(7)): one that
 * reaches bash before the line's trap is set (a cancel racing the start of
 * a command) does nothing, and the retries deliver it again once the trap
 * is there; bash's children get it at its default, ignored, too. */
#define SESSION_ABORT_SIG SIGURG
#define RECENT 8
/* A control line: nonce, status and the working directory, which can be
 * longer than PATH_MAX (a shell reaches any depth one `cd` at a time); one
 * of more than CWD_SHOWN_MAX bytes is sent as "?" (append_markers). */
#define CWD_SHOWN_MAX 65536
#define CTL_LINE_MAX (64 + CWD_SHOWN_MAX)

/* Append a string literal (its length computed by the compiler). */
#define LIT(b, s) sbx_buf_append((b), (s), sizeof(s) - 1)


struct scmd {
    struct scmd *next;
    struct agent_req *req;      /* answered at the end (plain exec), or NULL */
    struct stream *stream;      /* streamed exec: output as events, or NULL */
    session_done_fn done;       /* internal command: called at the end, or NULL */
    void *done_arg;
    bool cancelled;
    struct exec_args ea;
    bool have_cg;               /* the request's cgroup counters (agent_refine_cause) */
    struct agent_counters cg;
    int64_t deadline_ms;        /* the request's deadline (plain exec), 0: none */
};

struct session {
    struct session *next;
    struct agent *a;
    char id[128];
    char **env;          /* environment the shell starts with */
    char *cwd;           /* directory the shell starts in */
    char *pwd;           /* the shell's cwd after its last command (heap) */
    bool pwd_unknown;    /* that cwd was too long to be reported */
    int64_t default_timeout_ms;
    /* the running shell (pid 0 when there is none) */
    pid_t pid;
    int in_fd, ctl_fd, junk_fd, fd[2];
    sbx_watch *w_in, *w_ctl, *w_junk, *w[2];
    sbx_buf inq;         /* bytes for bash's stdin not yet written */
    sbx_buf pend[2];     /* stream bytes not yet attributed (may hold a partial marker) */
    sbx_buf ctl;         /* control pipe bytes up to a newline */
    /* the queue; `cur` is running */
    struct scmd *q_head, *q_tail, *cur;
    char nonce[17];
    uint64_t serial;       /* of the running command */
    /* Sync nonces sent after a SIGINT: their markers are stripped from the
     * streams whenever they turn up; their status line only ends the command
     * they were sent for. */
    struct {
        char n[17];
        uint64_t serial;
    } recent[RECENT];
    unsigned nrecent;
    bool got_rc, mark[2];
    bool err_bol;        /* the command's stderr so far is empty or ends in a newline */
    int rc;
    struct outcap out[2];
    int64_t start_us;
    unsigned long long start_ticks;
    uint64_t timer, fallback;
    bool timed_out;
    int64_t timeout_ms, sigint_at;
    /* The running command's cause: what else ran (agent_work_mark) and the
     * shard's counters, which its end waits for when it failed. */
    struct work_mark wmark;
    bool asked, answered;
    const char *cause;
    bool by_deadline;    /* its timeout is the request's deadline */
};

static void session_start_next(struct session *s);
static void session_pump(struct session *s);

/* ------------------------------------------------------------------------------ */

static void
quote_ansi_c(sbx_buf *b, const char *s, size_t n)
{
    static const char hex[] = "0123456789abcdef";
    sbx_buf_append(b, "$'", 2);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '\\' || c == '\'') {
            char e[2] = {'\\', (char)c};
            sbx_buf_append(b, e, 2);
        } else if (c >= 0x20 && c < 0x7f) {
            sbx_buf_append(b, (const char *)&c, 1);
        } else {
            char e[4] = {'\\', 'x', hex[c >> 4], hex[c & 15]};
            sbx_buf_append(b, e, 4);
        }
    }
    sbx_buf_append(b, "'", 1);
}

static void
new_nonce(struct agent *a, char out[17])
{
    unsigned char r[8];
    if (sbx_random(r, sizeof(r)) != 0) {
        uint64_t c = ++a->nonce_ctr ^ (uint64_t)sbx_mono_us();
        memcpy(r, &c, sizeof(r));
    }
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
}

static void
send_line(struct session *s, const sbx_buf *line)
{
    sbx_buf_append(&s->inq, line->p, line->len);
    session_pump(s);
}

static void
append_markers(sbx_buf *b, const char *nonce, const char *status_expr)
{
    /* Markers on both streams, then "nonce status cwd" on the control pipe:
     * the shell's cwd rides along, so relative paths of file operations can
     * be resolved against it without asking the shell. */
    sbx_buf_appendf(b,
                    "\\builtin printf '\\001SBX%%s\\002' %s >&4; "
                    "\\builtin printf '\\001SBX%%s\\002' %s >&5; "
                    "\\builtin test ${#PWD} -le %d && __sbx_w=$PWD || __sbx_w='?'; "
                    "\\builtin printf '%%s %%s %%s\\n' %s %s \"$__sbx_w\" >&3; "
                    "\\builtin unset __sbx_w\n",
                    nonce, nonce, CWD_SHOWN_MAX, nonce, status_expr);
}

/* ------------------------------------------------------------------------------ */
/* The shell process. */

static void
close_shell_fds(struct session *s)
{
    struct agent *a = s->a;
    sbx_loop_unwatch(a->loop, s->w_in);
    sbx_loop_unwatch(a->loop, s->w_ctl);
    sbx_loop_unwatch(a->loop, s->w_junk);
    sbx_loop_unwatch(a->loop, s->w[0]);
    sbx_loop_unwatch(a->loop, s->w[1]);
    s->w_in = s->w_ctl = s->w_junk = s->w[0] = s->w[1] = NULL;
    int *fds[] = {&s->in_fd, &s->ctl_fd, &s->junk_fd, &s->fd[0], &s->fd[1]};
    for (size_t i = 0; i < SBX_ARRAY_LEN(fds); i++) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
    s->inq.len = 0;
    s->pend[0].len = s->pend[1].len = 0;
    s->ctl.len = 0;
}

static void stream_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);
static void ctl_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);
static void junk_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);
static void in_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);

static int
start_shell(struct session *s)
{
    struct agent *a = s->a;
    int pin[2] = {-1, -1}, pctl[2] = {-1, -1}, pjunk[2] = {-1, -1};
    int po[2] = {-1, -1}, pe[2] = {-1, -1};
    int rc = 0;

    if (pipe2(pin, O_CLOEXEC) < 0 || pipe2(pctl, O_CLOEXEC) < 0 || pipe2(po, O_CLOEXEC) < 0 ||
        pipe2(pe, O_CLOEXEC) < 0) {
        rc = -errno;
        goto out;
    }
    /* bash's own stdout/stderr (prompts, job notices) go to a pseudo-terminal
     * we drain: an interactive bash calls tcsetattr on its stderr whenever a
     * child dies of a signal and complains into the command's stderr when
     * that fd is not a terminal.  The pty is never made its controlling tty. */
    if ((rc = agent_openpty(&pjunk[0], &pjunk[1])) != 0)
        goto out;
    const char *cwd = s->cwd ? s->cwd : "/workspace";
    struct stat st;
    if (stat(cwd, &st) < 0 || !S_ISDIR(st.st_mode))
        cwd = "/workspace";
    /* --noediting: no readline; with it bash polls its input twice per byte
     * read (1,136 system calls per `exec true` against 94 without). */
    const char *argv[] = {"/bin/bash", "--norc", "--noprofile", "--noediting", "-i", NULL};
    int keep[] = {pctl[1], po[1], pe[1]}; /* → fds 3, 4, 5 */
    struct spawn_opts so = {
        .in_fd = pin[0],
        .out_fd = pjunk[1],
        .err_fd = pjunk[1],
        .keep_fds = keep,
        .nkeep = 3,
        .cwd = cwd,
        .env = s->env,
        .argv = argv,
        .subreaper = true,
        .new_session = true,
    };
    pid_t pid = agent_spawn(a, &so);
    if (pid < 0) {
        rc = (int)pid;
        goto out;
    }
    s->pid = pid;
    s->in_fd = pin[1];
    pin[1] = -1;
    s->ctl_fd = pctl[0];
    pctl[0] = -1;
    s->junk_fd = pjunk[0];
    pjunk[0] = -1;
    s->fd[0] = po[0];
    po[0] = -1;
    s->fd[1] = pe[0];
    pe[0] = -1;
    int mine[] = {s->in_fd, s->ctl_fd, s->junk_fd, s->fd[0], s->fd[1]};
    for (size_t i = 0; i < SBX_ARRAY_LEN(mine); i++)
        sbx_set_nonblock(mine[i], true);
    s->w_ctl = sbx_loop_watch(a->loop, s->ctl_fd, EPOLLIN, ctl_cb, s);
    s->w_junk = sbx_loop_watch(a->loop, s->junk_fd, EPOLLIN, junk_cb, s);
    s->w[0] = sbx_loop_watch(a->loop, s->fd[0], EPOLLIN, stream_cb, s);
    s->w[1] = sbx_loop_watch(a->loop, s->fd[1], EPOLLIN, stream_cb, s);
    s->w_in = sbx_loop_watch(a->loop, s->in_fd, 0, in_cb, s);
    /* Quiet, predictable interactive shell.  Builtins are called through
     * `\builtin` everywhere so user aliases and functions cannot shadow them. */
    sbx_buf init;
    sbx_buf_init(&init);
    sbx_buf_appendf(&init, "PS1=; PS2=; PS0=; PS4=; PROMPT_COMMAND=; \\builtin set +m +H +o history; "
                           "\\builtin unset HISTFILE; \\builtin shopt -u checkwinsize 2>/dev/null\n");
    send_line(s, &init);
    sbx_buf_free(&init);
out:
    for (int i = 0; i < 2; i++) {
        if (pin[i] >= 0) close(pin[i]);
        if (pctl[i] >= 0) close(pctl[i]);
        if (pjunk[i] >= 0) close(pjunk[i]);
        if (po[i] >= 0) close(po[i]);
        if (pe[i] >= 0) close(pe[i]);
    }
    return rc;
}

static void
in_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    (void)l;
    (void)fd;
    (void)ev;
    session_pump(arg);
}

static void
session_pump(struct session *s)
{
    if (s->in_fd < 0)
        return;
    size_t off = 0;
    while (off < s->inq.len) {
        ssize_t w = write(s->in_fd, s->inq.p + off, s->inq.len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break; /* EAGAIN: wait for EPOLLOUT; EPIPE: the shell is gone, reaping tells */
        }
        off += (size_t)w;
    }
    sbx_buf_consume(&s->inq, off);
    sbx_loop_modify(s->a->loop, s->w_in, s->inq.len ? EPOLLOUT : 0);
}

static void
junk_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct session *s = arg;
    char buf[4096];
    ssize_t r;
    (void)ev;
    /* Discarded, at most 64 KiB per wake-up: a tenant writing to the shell's
     * terminal without end must not hold the loop (level-triggered: the rest
     * wakes us again). */
    size_t total = 0;
    while (total < 65536 && (r = read(fd, buf, sizeof(buf))) > 0)
        total += (size_t)r;
    if (total >= 65536)
        return;
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR))
        sbx_loop_modify(l, s->w_junk, 0); /* EIO: the shell closed the pty; reaping follows */
}

/* ------------------------------------------------------------------------------ */
/* Output attribution. */

/* Whether n is the running command's nonce or one of its syncs
 * (for_status), or any nonce of ours at all (markers). */
static bool
is_our_nonce(const struct session *s, const char *n, bool for_status)
{
    if (s->cur && !memcmp(n, s->nonce, 16))
        return true;
    unsigned k = s->nrecent < RECENT ? s->nrecent : RECENT;
    for (unsigned i = 0; i < k; i++) {
        if (memcmp(n, s->recent[i].n, 16))
            continue;
        if (!for_status || (s->cur && s->recent[i].serial == s->serial))
            return true;
    }
    return false;
}

/* Move bytes of stream i from pend into the running command's output, up to
 * its marker.  Without a running command the bytes (background jobs of
 * earlier commands) are dropped. */
static void
emit(struct session *s, int i, const char *p, size_t n)
{
    if (!n || !s->cur || s->mark[i])
        return;
    if (i == 1)
        s->err_bol = p[n - 1] == '\n';
    if (s->cur->stream)
        stream_data(s->cur->stream, i == 0 ? "stdout" : "stderr", p, n, NULL, NULL);
    else
        outcap_add(&s->out[i], p, n);
}

/* Whether the held stderr bytes `p` end in the line "exit\n". */
static bool
ends_with_exit_line(const struct session *s, const sbx_buf *p)
{
    if (p->len < 5 || memcmp(p->p + p->len - 5, "exit\n", 5) != 0)
        return false;
    return p->len == 5 ? s->err_bol : p->p[p->len - 6] == '\n';
}

static void
attribute(struct session *s, int i)
{
    sbx_buf *p = &s->pend[i];
    for (;;) {
        char *m = memmem(p->p, p->len, MARK_PREFIX, 4);
        size_t upto;
        if (m) {
            upto = (size_t)(m - p->p);
        } else {
            /* Only a tail that could begin a marker (from a \001 on) waits
             * for more bytes; everything before it is output now. */
            upto = p->len;
            size_t from = p->len > MARK_LEN ? p->len - MARK_LEN : 0;
            for (size_t k = p->len; k > from; k--) {
                if (p->p[k - 1] == '\001') {
                    upto = k - 1;
                    break;
                }
            }
        }
        if (!m) {
            /* A line "exit" ending stderr may be bash's own announcement
             * of the exit builtin: held back until more output or the
             * command's marker shows it is the command's
             * (agent_sessions_reaped drops it if the shell died). */
            if (i == 1 && upto == p->len && ends_with_exit_line(s, p))
                upto -= 5;
            emit(s, i, p->p, upto);
            sbx_buf_consume(p, upto);
            return;
        }
        emit(s, i, p->p, upto);
        sbx_buf_consume(p, upto);
        if (p->len < MARK_LEN)
            return; /* partial marker: wait for more */
        if (p->p[MARK_LEN - 1] == '\002' && is_our_nonce(s, p->p + 4, false)) {
            s->mark[i] = true;
            sbx_buf_consume(p, MARK_LEN);
            continue;
        }
        /* Not a marker after all: it is output. */
        emit(s, i, p->p, 1);
        sbx_buf_consume(p, 1);
    }
}

static void
pause_streams(struct session *s, bool pause)
{
    for (int k = 0; k < 2; k++)
        if (s->w[k])
            sbx_loop_modify(s->a->loop, s->w[k], pause ? 0 : EPOLLIN);
}

static void
read_stream_x(struct session *s, int i, bool force)
{
    char buf[65536];
    for (;;) {
        if (!force && s->cur && s->cur->stream && stream_full(s->cur->stream)) {
            /* The reader is behind: stop reading, the command blocks. */
            s->cur->stream->paused = true;
            pause_streams(s, true);
            return;
        }
        ssize_t r = read(s->fd[i], buf, sizeof(buf));
        if (r > 0) {
            sbx_buf_append(&s->pend[i], buf, (size_t)r);
            attribute(s, i);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        return; /* EAGAIN, or EOF (the shell died; reaping handles it) */
    }
}

static void
read_stream(struct session *s, int i)
{
    read_stream_x(s, i, false);
}

static void cmd_complete(struct session *s);

static void
maybe_complete(struct session *s)
{
    if (s->cur && s->got_rc && s->mark[0] && s->mark[1])
        cmd_complete(s);
}

static void
stream_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct session *s = arg;
    (void)l;
    int i = (fd == s->fd[0]) ? 0 : 1;
    read_stream(s, i);
    if (ev & (EPOLLHUP | EPOLLERR)) {
        sbx_loop_modify(s->a->loop, s->w[i], 0);
    }
    maybe_complete(s);
}

static void
fallback_cb(sbx_loop *l, void *arg)
{
    struct session *s = arg;
    (void)l;
    s->fallback = 0;
    /* The command closed or moved fds 4/5 of the shell itself; complete with
     * what arrived. */
    s->mark[0] = s->mark[1] = true;
    maybe_complete(s);
}

static void
ctl_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct session *s = arg;
    char buf[512];
    (void)l;
    (void)ev;
    /* The pipe is writable by anything the tenant runs in the shell (fd 3):
     * read at most 64 KiB per wake-up so a writer that never stops cannot
     * hold the loop, and keep no more than CTL_LINE_MAX bytes of a line (our
     * lines are a nonce, a status and a path); a longer one is junk and is
     * dropped. */
    for (size_t total = 0; total < 65536;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0) {
            total += (size_t)r;
            if (s->ctl.len + (size_t)r > CTL_LINE_MAX && !memchr(buf, '\n', (size_t)r)) {
                s->ctl.len = 0; /* a line too long to be ours */
                continue;
            }
            sbx_buf_append(&s->ctl, buf, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r == 0)
            sbx_loop_modify(s->a->loop, s->w_ctl, 0);
        break;
    }
    char *nl;
    while (s->ctl.len && (nl = memchr(s->ctl.p, '\n', s->ctl.len)) != NULL) {
        *nl = '\0';
        char nonce[17] = {0};
        int status = 0, used = 0;
        if (sscanf(s->ctl.p, "%16s %d %n", nonce, &status, &used) == 2 && strlen(nonce) == 16 &&
            s->cur && is_our_nonce(s, nonce, true) && !s->got_rc) {
            s->got_rc = true;
            s->rc = status;
            if (used > 0 && s->ctl.p[used] == '/') {
                free(s->pwd);
                s->pwd = sbx_xstrdup(s->ctl.p + used);
                s->pwd_unknown = false;
            } else if (used > 0 && s->ctl.p[used] == '?') {
                s->pwd_unknown = true; /* longer than CWD_SHOWN_MAX */
            }
            /* The markers were written before this line: read them now,
             * past a stream's cap if need be (the command has ended). */
            read_stream_x(s, 0, true);
            read_stream_x(s, 1, true);
            if (!(s->mark[0] && s->mark[1]))
                s->fallback = sbx_loop_timer(s->a->loop, 100, fallback_cb, s);
        }
        sbx_buf_consume(&s->ctl, (size_t)(nl - s->ctl.p) + 1);
    }
    maybe_complete(s);
}

/* ------------------------------------------------------------------------------ */
/* Commands. */

static void
scmd_free(struct scmd *c)
{
    if (c->stream) {
        c->stream->ops = NULL;
        stream_unref(c->stream);
    }
    exec_args_free(&c->ea);
    free(c);
}

static void
reset_cmd_state(struct session *s)
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
    cmd_complete(s);
}

static void
cmd_complete(struct session *s)
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
        pause_streams(s, false);
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
    scmd_free(c);
    reset_cmd_state(s);
    session_start_next(s);
}

static void
sync_retry_cb(sbx_loop *l, void *arg);

static void
send_sync(struct session *s)
{
    unsigned i = s->nrecent++ % RECENT;
    new_nonce(s->a, s->recent[i].n);
    s->recent[i].serial = s->serial;
    sbx_buf line;
    sbx_buf_init(&line);
    append_markers(&line, s->recent[i].n, "130");
    send_line(s, &line);
    sbx_buf_free(&line);
}

static void kill_shell(struct session *s);
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
        kill_shell(s);
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
    pause_streams(s, false);
    interrupt_cmd(s);
}

static void
cmd_stream_resume(struct stream *st, void *arg)
{
    struct session *s = arg;
    (void)st;
    pause_streams(s, false);
}

static const struct stream_ops cmd_stream_ops = {cmd_stream_resume, cmd_stream_cancel};

static void
run_cmd(struct session *s, struct scmd *c)
{
    sbx_buf line;
    sbx_buf_init(&line);
    s->cur = c;
    s->err_bol = true;
    s->serial++;
    new_nonce(s->a, s->nonce);
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
            quote_ansi_c(&words, *p, strlen(*p));
        }
        quote_ansi_c(&line, words.p, words.len);
        sbx_buf_free(&words);
    } else {
        quote_ansi_c(&line, c->ea.cmd, strlen(c->ea.cmd));
    }
    LIT(&line, "; ");
    size_t cwd_at = line.len;
    if (c->ea.cwd) {
        LIT(&line, "__sbx_owd=$PWD; \\builtin cd -- ");
        quote_ansi_c(&line, c->ea.cwd, strlen(c->ea.cwd));
        LIT(&line, " >/dev/null 2>&5 && ");
    }
    /* Per-call env (the SDK's exec env: "per-command, not kept"): exported
     * for the command and its children, then each variable gets back its
     * value and export attribute (bash's ${K@a}), or is unset again. */
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
                quote_ansi_c(&pre, kv->val.via.str.ptr, kv->val.via.str.size);
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
    append_markers(&line, s->nonce, "\"$__sbx_rc\"");
    send_line(s, &line);
    sbx_buf_free(&line);
    if (s->timeout_ms > 0)
        s->timer = sbx_loop_timer(s->a->loop, s->timeout_ms, timeout_cb, s);
}

static void
fail_cmd(struct session *s, struct scmd *c, int code, int exit_status, const char *msg)
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
    scmd_free(c);
}

static void
session_start_next(struct session *s)
{
    while (!s->cur && s->q_head) {
        if (s->pid == 0) {
            int rc = start_shell(s);
            if (rc) {
                struct scmd *c = s->q_head;
                s->q_head = c->next;
                if (!s->q_head)
                    s->q_tail = NULL;
                char msg[160];
                snprintf(msg, sizeof(msg), "could not start the session shell: %s",
                         strerror(-rc));
                fail_cmd(s, c, SBX_E_COMMAND, -1, msg);
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
            fail_cmd(s, c, SBX_E_TIMEOUT, -1,
                     "the command waited for the session past the request's deadline; it "
                     "did not run");
            continue;
        }
        run_cmd(s, c);
    }
}

static void
kill_shell(struct session *s)
{
    if (s->pid > 0) {
        agent_kill_tree(s->pid, true, NULL, 0);
        kill(s->pid, SIGKILL);
    }
}

/* ------------------------------------------------------------------------------ */

static struct session *
session_find(struct agent *a, const char *id)
{
    for (struct session *s = a->sessions; s; s = s->next)
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
    s->next = a->sessions;
    a->sessions = s;
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
    char why[256];
    struct scmd *c = sbx_xcalloc(1, sizeof(*c));
    int rc = exec_args_parse(r->args, &c->ea, why, sizeof(why));
    if (rc) {
        free(c);
        agent_reply_err(a, r, rc, "%s", why);
        return;
    }
    /* Per-call variables are assigned by the session's shell (run_cmd): a
     * name it cannot assign is refused rather than dropped. */
    if (agent_env_check(c->ea.env, true, why, sizeof(why)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", why);
        scmd_free(c);
        return;
    }
    if (c->ea.cwd) {
        struct stat st;
        if (stat(c->ea.cwd, &st) < 0 || !S_ISDIR(st.st_mode)) {
            agent_reply_err(a, r, SBX_E_VALIDATION, "cwd '%s' is not a directory in the sandbox",
                            c->ea.cwd);
            scmd_free(c);
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
        c->stream = stream_new(a, stid, true, 1u << 20, &cmd_stream_ops, s);
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
    for (struct session *s = a->sessions; s; s = s->next)
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
    char why[256];
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
    if (agent_env_check(env, false, why, sizeof(why)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", why);
        return;
    }
    char *cwds = cwd.n ? sbx_str_dup(cwd) : NULL;
    if (cwds) {
        struct stat st;
        if (stat(cwds, &st) < 0 || !S_ISDIR(st.st_mode)) {
            agent_reply_err(a, r, SBX_E_VALIDATION, "cwd '%s' is not a directory in the sandbox",
                            cwds);
            free(cwds);
            return;
        }
    }
    struct session *s = session_new(a, id, env, cwds, tmo);
    free(cwds);
    /* Start the shell now, so the first command does not pay for it. */
    if (start_shell(s) != 0)
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
    for (struct session *s = a->sessions; s; s = s->next)
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
    kill_shell(s);
    if (s->pid > 0) {
        /* Reap it here so no callback sees the freed session. */
        int st;
        waitpid(s->pid, &st, 0);
        s->pid = 0;
    }
    close_shell_fds(s);
    if (s->cur) {
        struct scmd *c = s->cur;
        s->cur = NULL;
        fail_cmd(s, c, code, -1, why);
    }
    reset_cmd_state(s);
    while (s->q_head) {
        struct scmd *c = s->q_head;
        s->q_head = c->next;
        fail_cmd(s, c, code, -1, why);
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
    for (struct session **pp = &a->sessions; *pp; pp = &(*pp)->next) {
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
    if (s->pid == 0 && start_shell(s) != 0)
        sbx_log_warn("agent: the default session's shell could not be started early");
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
            quote_ansi_c(&cmd, v.p, v.n);
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
    for (struct session *s = a->sessions; s; s = s->next) {
        if (s->pid != pid)
            continue;
        s->pid = 0;
        /* Take what the shell wrote before it died; no marker will come, so
         * a held-back tail is output too. */
        for (int i = 0; i < 2; i++) {
            if (s->fd[i] >= 0)
                read_stream_x(s, i, true);
            /* An interactive bash announces `exit` on its stderr, which was
             * the command's at that moment: not the command's output. */
            if (i == 1 && s->cur && !s->timed_out && ends_with_exit_line(s, &s->pend[1]))
                s->pend[1].len -= 5;
            emit(s, i, s->pend[i].p, s->pend[i].len);
            s->pend[i].len = 0;
        }
        close_shell_fds(s);
        struct scmd *c = s->cur;
        if (c && s->asked && !s->answered) {
            /* The command had ended and waits for its cause: it ends now,
             * as it is; the shell's death is the next command's news. */
            agent_counters_cancel(a, s);
            s->answered = true;
            cmd_complete(s);
            return;
        }
        if (c) {
            s->cur = NULL;
            if (s->timed_out && !s->got_rc) {
                /* We killed the shell to end a timed-out command. */
                s->cur = c;
                s->got_rc = s->mark[0] = s->mark[1] = true;
                cmd_complete(s);
                return;
            }
            int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            char msg[320];
            snprintf(msg, sizeof(msg),
                     "the shell of session '%s' exited (exit code %d); the next command "
                     "starts a fresh shell", s->id, code);
            fail_cmd(s, c, SBX_E_SESSION_TERMINATED, code, msg);
            reset_cmd_state(s);
        }
        session_start_next(s);
        return;
    }
}

void
agent_sessions_free(struct agent *a)
{
    while (a->sessions) {
        struct session *s = a->sessions;
        a->sessions = s->next;
        session_kill(s, SBX_E_INTERRUPTED, "the sandbox is stopping");
        session_free(s);
    }
}
