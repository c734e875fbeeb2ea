/*
 * session_shell.c — the shell protocol of sessions: ANSI-C quoting of what
 * travels on bash's input line, the nonce and markers that end a command,
 * starting the bash process with its stdout/stderr/control pipes, and
 * reading them — output attributed to the running command up to the
 * marker, and the control pipe's "<nonce> <status> <cwd>" lines that
 * complete it.  Called by session_cmd.c and session.c on the loop thread;
 * the pipes and watches belong to the session (struct session).
 */
#include "session_int.h"
static void session_pump(struct session *s);

/* ------------------------------------------------------------------------------ */

void
session_quote_ansi_c(sbx_buf *b, const char *s, size_t n)
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

void
session_new_nonce(struct agent *a, char out[17])
{
    unsigned char r[8];
    if (sbx_random(r, sizeof(r)) != 0) {
        uint64_t c = ++a->sessions.nonce_ctr ^ (uint64_t)sbx_mono_us();
        memcpy(r, &c, sizeof(r));
    }
    for (int i = 0; i < 8; i++)
        snprintf(out + 2 * i, 3, "%02x", r[i]);
}

void
session_send_line(struct session *s, const sbx_buf *line)
{
    sbx_buf_append(&s->inq, line->p, line->len);
    session_pump(s);
}

void
session_append_markers(sbx_buf *b, const char *nonce, const char *status_expr)
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

void
session_close_shell_fds(struct session *s)
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
static void junk_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);
static void in_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);

int
session_start_shell(struct session *s)
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
    const char *cwd = s->cwd ? s->cwd : agent_default_cwd(a);
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
    s->w_ctl = sbx_loop_watch(a->loop, s->ctl_fd, EPOLLIN, session_ctl_cb, s);
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
    session_send_line(s, &init);
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
void
session_emit(struct session *s, int i, const char *p, size_t n)
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
bool
session_ends_with_exit_line(const struct session *s, const sbx_buf *p)
{
    if (p->len < 5 || memcmp(p->p + p->len - 5, "exit\n", 5) != 0)
        return false;
    return p->len == 5 ? s->err_bol : p->p[p->len - 6] == '\n';
}

void
session_attribute(struct session *s, int i)
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
            if (i == 1 && upto == p->len && session_ends_with_exit_line(s, p))
                upto -= 5;
            session_emit(s, i, p->p, upto);
            sbx_buf_consume(p, upto);
            return;
        }
        session_emit(s, i, p->p, upto);
        sbx_buf_consume(p, upto);
        if (p->len < MARK_LEN)
            return; /* partial marker: wait for more */
        if (p->p[MARK_LEN - 1] == '\002' && is_our_nonce(s, p->p + 4, false)) {
            s->mark[i] = true;
            sbx_buf_consume(p, MARK_LEN);
            continue;
        }
        /* Not a marker after all: it is output. */
        session_emit(s, i, p->p, 1);
        sbx_buf_consume(p, 1);
    }
}

void
session_pause_streams(struct session *s, bool pause)
{
    for (int k = 0; k < 2; k++)
        if (s->w[k])
            sbx_loop_modify(s->a->loop, s->w[k], pause ? 0 : EPOLLIN);
}

void
session_read_stream_x(struct session *s, int i, bool force)
{
    char buf[65536];
    for (;;) {
        if (!force && s->cur && s->cur->stream && stream_full(s->cur->stream)) {
            /* The reader is behind: stop reading, the command blocks. */
            s->cur->stream->paused = true;
            session_pause_streams(s, true);
            return;
        }
        ssize_t r = read(s->fd[i], buf, sizeof(buf));
        if (r > 0) {
            sbx_buf_append(&s->pend[i], buf, (size_t)r);
            session_attribute(s, i);
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
    session_read_stream_x(s, i, false);
}

static void
maybe_complete(struct session *s)
{
    if (s->cur && s->got_rc && s->mark[0] && s->mark[1])
        session_cmd_complete(s);
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

void
session_ctl_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
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
            session_read_stream_x(s, 0, true);
            session_read_stream_x(s, 1, true);
            if (!(s->mark[0] && s->mark[1]))
                s->fallback = sbx_loop_timer(s->a->loop, 100, fallback_cb, s);
        }
        sbx_buf_consume(&s->ctl, (size_t)(nl - s->ctl.p) + 1);
    }
    maybe_complete(s);
}
