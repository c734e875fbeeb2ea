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
#include "../../runtime/log.h"
#include "agent.h"

#define MARK_PREFIX "\001SBX"
#define MARK_LEN (4 + 16 + 1) /* prefix + 16 hex + \002 */
#define SIGINT_WAIT_MS 100
#define SYNC_RETRY_MS 250
#define SYNC_GIVE_UP_MS 2000
#define RECENT 8

/* Append a string literal (its length computed by the compiler). */
#define LIT(b, s) sbx_buf_append((b), (s), sizeof(s) - 1)

enum stream { S_OUT = 0, S_ERR = 1 };

struct scmd {
    struct scmd *next;
    struct agent_req *req;
    struct exec_args ea;
};

struct session {
    struct session *next;
    struct agent *a;
    char id[128];
    char **env;          /* environment the shell starts with */
    char *cwd;
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
    int rc;
    struct outcap out[2];
    int64_t start_us;
    unsigned long long start_ticks;
    uint64_t timer, fallback;
    bool timed_out;
    int64_t timeout_ms, sigint_at;
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
    sbx_buf_appendf(b,
                    "\\builtin printf '\\001SBX%%s\\002' %s >&4; "
                    "\\builtin printf '\\001SBX%%s\\002' %s >&5; "
                    "\\builtin printf '%%s %%s\\n' %s %s >&3\n",
                    nonce, nonce, nonce, status_expr);
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
    const char *argv[] = {"/bin/bash", "--norc", "--noprofile", "-i", NULL};
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
    while ((r = read(fd, buf, sizeof(buf))) > 0)
        ;
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
attribute(struct session *s, int i)
{
    sbx_buf *p = &s->pend[i];
    for (;;) {
        char *m = memmem(p->p, p->len, MARK_PREFIX, 4);
        size_t upto = m ? (size_t)(m - p->p) : (p->len > MARK_LEN ? p->len - MARK_LEN : 0);
        if (!m) {
            /* Keep a tail that may be the start of a marker. */
            if (s->cur && !s->mark[i])
                outcap_add(&s->out[i], p->p, upto);
            sbx_buf_consume(p, upto);
            return;
        }
        if (s->cur && !s->mark[i])
            outcap_add(&s->out[i], p->p, upto);
        sbx_buf_consume(p, upto);
        if (p->len < MARK_LEN)
            return; /* partial marker: wait for more */
        if (p->p[MARK_LEN - 1] == '\002' && is_our_nonce(s, p->p + 4, false)) {
            s->mark[i] = true;
            sbx_buf_consume(p, MARK_LEN);
            continue;
        }
        /* Not a marker after all: it is output. */
        if (s->cur && !s->mark[i])
            outcap_add(&s->out[i], p->p, 1);
        sbx_buf_consume(p, 1);
    }
}

static void
read_stream(struct session *s, int i)
{
    char buf[65536];
    for (;;) {
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
    for (;;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0) {
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
    while ((nl = memchr(s->ctl.p, '\n', s->ctl.len)) != NULL) {
        *nl = '\0';
        char nonce[17] = {0};
        int status = 0;
        if (sscanf(s->ctl.p, "%16s %d", nonce, &status) == 2 && strlen(nonce) == 16 &&
            s->cur && is_our_nonce(s, nonce, true) && !s->got_rc) {
            s->got_rc = true;
            s->rc = status;
            /* The markers were written before this line: read them now. */
            read_stream(s, 0);
            read_stream(s, 1);
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
    exec_args_free(&c->ea);
    free(c);
}

static void
reset_cmd_state(struct session *s)
{
    sbx_loop_cancel(s->a->loop, s->timer);
    sbx_loop_cancel(s->a->loop, s->fallback);
    s->timer = s->fallback = 0;
    s->got_rc = s->mark[0] = s->mark[1] = false;
    s->timed_out = false;
    s->sigint_at = 0;
    outcap_free(&s->out[0]);
    outcap_free(&s->out[1]);
}

static void
cmd_complete(struct session *s)
{
    struct scmd *c = s->cur;
    int code = s->timed_out ? 124 : s->rc;
    int64_t dur = (sbx_mono_us() - s->start_us) / 1000;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    /* A status above 128 from the shell means the command died of a signal. */
    exec_encode_result(&e, code, (!s->timed_out && code > 128 && code < 128 + 65) ? code - 128 : 0,
                       s->timed_out, s->timeout_ms, dur, &s->out[0], &s->out[1]);
    sbx_enc_kstr(&e, "sessionId", s->id);
    agent_reply_ok(s->a, c->req, &e);
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
    kill(s->pid, SIGINT);
    send_sync(s);
    s->timer = sbx_loop_timer(s->a->loop, SYNC_RETRY_MS, sync_retry_cb, s);
}

static void
sigint_cb(sbx_loop *l, void *arg)
{
    struct session *s = arg;
    (void)l;
    s->timer = 0;
    if (!s->cur || s->got_rc)
        return;
    /* Still busy after its children died: a loop of builtins.  An
     * interactive bash drops the line on SIGINT; then confirm with a sync. */
    s->sigint_at = sbx_mono_ms();
    kill(s->pid, SIGINT);
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
    agent_kill_tree_since(s->pid, true, NULL, 0, s->start_ticks);
    s->timer = sbx_loop_timer(s->a->loop, SIGINT_WAIT_MS, sigint_cb, s);
}

static void
run_cmd(struct session *s, struct scmd *c)
{
    sbx_buf line;
    sbx_buf_init(&line);
    s->cur = c;
    s->serial++;
    new_nonce(s->a, s->nonce);
    outcap_init(&s->out[0], s->a->cfg.output_cap);
    outcap_init(&s->out[1], s->a->cfg.output_cap);
    s->start_us = sbx_mono_us();
    s->start_ticks = agent_boot_ticks();
    s->timeout_ms = c->ea.timeout_ms ? c->ea.timeout_ms : s->default_timeout_ms;

    LIT(&line, "__sbx_c=");
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
    if (c->ea.cwd) {
        LIT(&line, "__sbx_owd=$PWD; \\builtin cd -- ");
        quote_ansi_c(&line, c->ea.cwd, strlen(c->ea.cwd));
        LIT(&line, " >/dev/null 2>&5 && ");
    }
    LIT(&line, "{ ");
    if (c->ea.env) {
        for (uint32_t i = 0; i < c->ea.env->via.map.size; i++) {
            const msgpack_object_kv *kv = &c->ea.env->via.map.ptr[i];
            sbx_str k;
            sbx_wire_obj_str(&kv->key, &k);
            bool ok = k.n > 0 && !(k.p[0] >= '0' && k.p[0] <= '9');
            for (size_t j = 0; j < k.n; j++) {
                char ch = k.p[j];
                if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                      (ch >= '0' && ch <= '9') || ch == '_'))
                    ok = false;
            }
            /* Names a shell cannot assign are skipped, as bash's own env would. */
            if (!ok || kv->val.type != MSGPACK_OBJECT_STR)
                continue;
            sbx_buf_append(&line, k.p, k.n);
            LIT(&line, "=");
            quote_ansi_c(&line, kv->val.via.str.ptr, kv->val.via.str.size);
            LIT(&line, " ");
        }
    }
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
    agent_reply_werr(s->a, c->req, &w);
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
session_new(struct agent *a, const char *id)
{
    struct session *s = sbx_xcalloc(1, sizeof(*s));
    s->a = a;
    snprintf(s->id, sizeof(s->id), "%s", id);
    s->in_fd = s->ctl_fd = s->junk_fd = s->fd[0] = s->fd[1] = -1;
    s->env = agent_env_merge(a->env, NULL);
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

void
agent_exec_session(struct agent *a, struct agent_req *r, const char *sid)
{
    char why[256];
    struct scmd *c = sbx_xcalloc(1, sizeof(*c));
    int rc = exec_args_parse(r->args, &c->ea, why, sizeof(why));
    if (rc) {
        free(c);
        agent_reply_err(a, r, rc, "%s", why);
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
    c->req = r;
    struct session *s = session_find(a, sid);
    if (!s)
        s = session_new(a, sid);
    if (s->q_tail)
        s->q_tail->next = c;
    else
        s->q_head = c;
    s->q_tail = c;
    session_start_next(s);
}

void
agent_sessions_reaped(struct agent *a, pid_t pid, int status)
{
    for (struct session *s = a->sessions; s; s = s->next) {
        if (s->pid != pid)
            continue;
        s->pid = 0;
        /* Take what the shell wrote before it died. */
        if (s->fd[0] >= 0)
            read_stream(s, 0);
        if (s->fd[1] >= 0)
            read_stream(s, 1);
        close_shell_fds(s);
        struct scmd *c = s->cur;
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
        kill_shell(s);
        close_shell_fds(s);
        reset_cmd_state(s);
        if (s->cur)
            fail_cmd(s, s->cur, SBX_E_INTERRUPTED, -1, "the sandbox is stopping");
        while (s->q_head) {
            struct scmd *c = s->q_head;
            s->q_head = c->next;
            fail_cmd(s, c, SBX_E_INTERRUPTED, -1, "the sandbox is stopping");
        }
        agent_env_free(s->env);
        free(s->cwd);
        sbx_buf_free(&s->inq);
        sbx_buf_free(&s->pend[0]);
        sbx_buf_free(&s->pend[1]);
        sbx_buf_free(&s->ctl);
        free(s);
    }
}
