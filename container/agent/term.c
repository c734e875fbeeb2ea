/*
 * term.c — terminals: one pseudo-terminal and interactive shell per session
 * id, shared by every viewer (the Cloudflare SDK's PTY, one per session,
 * cloudflare-sandbox-sdk.md §1.3 and §2.4).
 *
 * terminal.open {sessionId="default", cols=80, rows=24, shell="bash"}
 *     → {streamId, sessionId, pid, created}: starts the shell on a new pty
 *     (its controlling terminal, TERM=xterm-256color, in the session's cwd,
 *     with the sandbox's environment) unless one runs for that session.
 *     The terminal's output is the ring stream `streamId` (the newest 256 KiB
 *     are kept, so a viewer that connects late is replayed the screen's
 *     recent history): events `output {data}` and, last, `exit {code,
 *     signal?}`.
 * terminal.write {sessionId, data} — bytes typed into it (at most 1 MiB
 *     waiting; more is RESOURCE_BUSY).
 * terminal.resize {sessionId, cols, rows} — TIOCSWINSZ; the kernel sends
 *     SIGWINCH to the foreground process group (tty_ioctl(4)).
 * terminal.close {sessionId} — SIGHUP to the shell's session, then SIGKILL
 *     to what is left.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define TERM_RING (256 * 1024)
#define TERM_INQ_MAX (1 << 20)

struct term {
    struct term *next;
    struct agent *a;
    char sid[128];
    pid_t pid;
    int master;
    sbx_watch *w;
    struct stream *st;
    sbx_buf inq;        /* typed bytes the pty did not take yet */
    bool eof;           /* the pty reported EIO/EOF: the shell side is closed */
};

static struct term *
term_find(struct agent *a, const char *sid)
{
    for (struct term *t = a->terms; t; t = t->next)
        if (!strcmp(t->sid, sid))
            return t;
    return NULL;
}

static void
term_unlink_free(struct term *t)
{
    struct agent *a = t->a;
    for (struct term **pp = &a->terms; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    if (t->w)
        sbx_loop_unwatch(a->loop, t->w);
    if (t->master >= 0)
        close(t->master);
    if (t->st)
        stream_unref(t->st);
    sbx_buf_free(&t->inq);
    free(t);
}

static void
term_io(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct term *t = arg;
    (void)l;
    if (ev & EPOLLOUT) {
        while (t->inq.len) {
            ssize_t w = write(fd, t->inq.p, t->inq.len);
            if (w <= 0)
                break;
            sbx_buf_consume(&t->inq, (size_t)w);
        }
        if (!t->inq.len)
            sbx_loop_modify(t->a->loop, t->w, EPOLLIN);
    }
    if (ev & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        char buf[65536];
        for (int i = 0; i < 16; i++) {
            ssize_t r = read(fd, buf, sizeof(buf));
            if (r > 0) {
                stream_data(t->st, "output", buf, (size_t)r, NULL, NULL);
                continue;
            }
            if (r < 0 && errno == EAGAIN)
                break;
            /* EIO: every slave fd is closed (the shell and its children are
             * gone or detached); the exit event comes when it is reaped. */
            t->eof = true;
            sbx_loop_unwatch(t->a->loop, t->w);
            t->w = NULL;
            break;
        }
    }
}

static int
session_arg(struct agent_req *r, char *sid, size_t sidlen, sbx_err_t *err)
{
    sbx_str s = SBX_STR("default");
    int rc = sbx_wire_get_str(r->args, "sessionId", &s);
    if (rc == SBX_E_VALIDATION || s.n == 0 || s.n >= sidlen || memchr(s.p, 0, s.n)) {
        return sbx_err_make(err, SBX_E_VALIDATION, "'sessionId' must be a string of 1-%zu bytes",
                            sidlen - 1);
    }
    sbx_str_copy(s, sid, sidlen);
    return 0;
}

static int
size_args(struct agent_req *r, struct winsize *ws, sbx_err_t *err)
{
    int64_t cols = 80, rows = 24;
    if (sbx_wire_get_i64(r->args, "cols", &cols) == SBX_E_VALIDATION ||
        sbx_wire_get_i64(r->args, "rows", &rows) == SBX_E_VALIDATION || cols < 1 || rows < 1 ||
        cols > 1000 || rows > 1000) {
        return sbx_err_make(err, SBX_E_VALIDATION, "'cols' and 'rows' must be integers of 1-1000");
    }
    memset(ws, 0, sizeof(*ws));
    ws->ws_col = (unsigned short)cols;
    ws->ws_row = (unsigned short)rows;
    return 0;
}

void
agent_op_terminal_open(struct agent *a, struct agent_req *r)
{
    char sid[128], shell[256] = "/bin/bash";
    _cleanup_err_ sbx_err_t err = NULL;
    struct winsize ws;
    int rc;
    if ((rc = session_arg(r, sid, sizeof(sid), &err)) || (rc = size_args(r, &ws, &err))) {
        agent_reply_err(a, r, rc, "%s", sbx_err_msg(err));
        return;
    }
    sbx_str sh;
    if (sbx_wire_get_str(r->args, "shell", &sh) == 0 && sh.n) {
        /* A program name (looked up in PATH) or an absolute path. */
        if (sh.n >= sizeof(shell) - 10 || memchr(sh.p, 0, sh.n) || memchr(sh.p, ' ', sh.n)) {
            agent_reply_err(a, r, SBX_E_VALIDATION, "'shell' must be a program name or path");
            return;
        }
        snprintf(shell, sizeof(shell), "%.*s", (int)sh.n, sh.p);
    }
    struct term *t = term_find(a, sid);
    bool created = false;
    if (!t) {
        int m, s;
        if ((rc = agent_openpty(&m, &s)) != 0) {
            agent_reply_err(a, r, SBX_E_INTERNAL, "cannot open a pseudo-terminal: %s",
                            strerror(-rc));
            return;
        }
        ioctl(m, TIOCSWINSZ, &ws);
        char **env = agent_env_merge(a->env, NULL);
        /* TERM for full-screen programs; the rest is the sandbox's. */
        size_t n = 0;
        while (env[n])
            n++;
        env = sbx_xrealloc(env, (n + 2) * sizeof(char *));
        size_t k = 0;
        for (size_t i = 0; i < n; i++) {
            if (!strncmp(env[i], "TERM=", 5))
                free(env[i]);
            else
                env[k++] = env[i];
        }
        env[k++] = sbx_xstrdup("TERM=xterm-256color");
        env[k] = NULL;
        const char *cwd = agent_session_cwd(a, sid);
        struct stat st;
        if (!cwd || stat(cwd, &st) < 0 || !S_ISDIR(st.st_mode))
            cwd = "/workspace";
        const char *argv[] = {shell, NULL};
        struct spawn_opts so = {
            .in_fd = s,
            .out_fd = s,
            .err_fd = s,
            .cwd = cwd,
            .env = env,
            .argv = argv,
            .subreaper = false,
            .new_session = true,
            .ctty = true,
        };
        pid_t pid = agent_spawn(a, &so);
        close(s);
        agent_env_free(env);
        if (pid < 0) {
            close(m);
            agent_reply_err(a, r, SBX_E_COMMAND, "cannot start %s: %s", shell, strerror((int)-pid));
            return;
        }
        t = sbx_xcalloc(1, sizeof(*t));
        t->a = a;
        snprintf(t->sid, sizeof(t->sid), "%s", sid);
        t->pid = pid;
        t->master = m;
        sbx_buf_init(&t->inq);
        char id[192];
        snprintf(id, sizeof(id), "pty:%s:%llu", sid, (unsigned long long)++a->stream_ctr);
        t->st = stream_new(a, id, false, TERM_RING, NULL, NULL);
        t->w = sbx_loop_watch(a->loop, m, EPOLLIN, term_io, t);
        t->next = a->terms;
        a->terms = t;
        created = true;
    }
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "streamId", t->st->id);
    sbx_enc_kstr(&e, "sessionId", t->sid);
    sbx_enc_kint(&e, "pid", t->pid);
    sbx_enc_kbool(&e, "created", created);
    agent_reply_ok(a, r, &e);
}

static struct term *
term_of(struct agent *a, struct agent_req *r)
{
    char sid[128];
    _cleanup_err_ sbx_err_t err = NULL;
    if (session_arg(r, sid, sizeof(sid), &err) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", sbx_err_msg(err));
        return NULL;
    }
    struct term *t = term_find(a, sid);
    if (!t)
        agent_reply_err(a, r, SBX_E_SESSION_NOT_FOUND,
                        "session '%s' has no terminal (open one with terminal.open)", sid);
    return t;
}

void
agent_op_terminal_write(struct agent *a, struct agent_req *r)
{
    struct term *t = term_of(a, r);
    if (!t)
        return;
    sbx_str d, enc = SBX_STR("");
    char *decoded = NULL;
    if (sbx_wire_get_bin(r->args, "data", &d) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'data' (bytes or a string) is required");
        return;
    }
    sbx_wire_get_str(r->args, "encoding", &enc);
    if (sbx_str_eq(enc, "base64")) {
        size_t dl;
        if (sbx_base64_decode(d.p, d.n, &decoded, &dl) != 0) {
            agent_reply_err(a, r, SBX_E_VALIDATION, "'data' is not valid base64");
            return;
        }
        d.p = decoded;
        d.n = dl;
    }
    if (t->eof) {
        free(decoded);
        agent_reply_err(a, r, SBX_E_SESSION_TERMINATED, "the terminal's shell has exited");
        return;
    }
    if (t->inq.len + d.n > TERM_INQ_MAX) {
        free(decoded);
        agent_reply_err(a, r, SBX_E_BUSY, "the terminal is not reading its input");
        return;
    }
    size_t off = 0;
    if (!t->inq.len) {
        while (off < d.n) {
            ssize_t w = write(t->master, d.p + off, d.n - off);
            if (w <= 0)
                break;
            off += (size_t)w;
        }
    }
    if (off < d.n) {
        sbx_buf_append(&t->inq, d.p + off, d.n - off);
        if (t->w)
            sbx_loop_modify(a->loop, t->w, EPOLLIN | EPOLLOUT);
    }
    size_t written = d.n;
    free(decoded);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kint(&e, "bytes", (int64_t)written);
    agent_reply_ok(a, r, &e);
}

void
agent_op_terminal_resize(struct agent *a, struct agent_req *r)
{
    struct term *t = term_of(a, r);
    if (!t)
        return;
    struct winsize ws;
    _cleanup_err_ sbx_err_t err = NULL;
    if (size_args(r, &ws, &err) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "%s", sbx_err_msg(err));
        return;
    }
    if (ioctl(t->master, TIOCSWINSZ, &ws) < 0) {
        agent_reply_err(a, r, SBX_E_INTERNAL, "TIOCSWINSZ: %s", strerror(errno));
        return;
    }
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kint(&e, "cols", ws.ws_col);
    sbx_enc_kint(&e, "rows", ws.ws_row);
    agent_reply_ok(a, r, &e);
}

static void
term_kill(struct term *t)
{
    /* The shell leads its own session: hang it up like a closed terminal
     * window, then kill what is left of its tree. */
    kill(-t->pid, SIGHUP);
    kill(t->pid, SIGHUP);
    agent_kill_tree(t->pid, false, NULL, 0);
}

void
agent_op_terminal_close(struct agent *a, struct agent_req *r)
{
    struct term *t = term_of(a, r);
    if (!t)
        return;
    term_kill(t);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "sessionId", t->sid);
    agent_reply_ok(a, r, &e);
}

void
agent_term_close_session(struct agent *a, const char *sid)
{
    struct term *t = term_find(a, sid);
    if (t)
        term_kill(t);
}

bool
agent_terms_reaped(struct agent *a, pid_t pid, int status)
{
    for (struct term *t = a->terms; t; t = t->next) {
        if (t->pid != pid)
            continue;
        /* What the shell printed last is still in the pty: deliver it first. */
        if (t->w)
            term_io(a->loop, t->master, EPOLLIN, t);
        sbx_enc *e = stream_begin(t->st, "exit");
        if (WIFSIGNALED(status)) {
            sbx_enc_kint(e, "code", 128 + WTERMSIG(status));
            sbx_enc_kint(e, "signal", WTERMSIG(status));
        } else {
            sbx_enc_kint(e, "code", WEXITSTATUS(status));
        }
        stream_commit(t->st, true);
        term_unlink_free(t);
        return true;
    }
    return false;
}

bool
agent_terms_open(struct agent *a)
{
    for (struct term *t = a->terms; t; t = t->next)
        if (t->pid > 0)
            return true;
    return false;
}

void
agent_terms_free(struct agent *a)
{
    while (a->terms)
        term_unlink_free(a->terms);
}
