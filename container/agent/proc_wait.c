/*
 * proc_wait.c — waiting on background processes: a waiter (struct waiter)
 * is a request answered when its condition holds — the process exits
 * (process.waitExit), a whole line of its output matches a substring or
 * regular expression (process.waitLog, history first), or a port accepts
 * TCP connections or answers HTTP (process.waitPort) — or fails when the
 * process ends first or its timeout passes.  Called by main.c's dispatch
 * and by proc.c as lines arrive and processes end; one loop thread.
 */
#include "proc_int.h"
/* ------------------------------------------------------------------------------ */
/* Waiters. */

void
proc_waiter_unlink(struct waiter *w)
{
    struct proc *p = w->p;
    for (struct waiter **pp = &p->waiters; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
}

void
proc_waiter_free(struct agent *a, struct waiter *w)
{
    sbx_loop_cancel(a->loop, w->timer);
    sbx_loop_cancel(a->loop, w->poll_timer);
    if (w->w)
        sbx_loop_unwatch(a->loop, w->w);
    if (w->sock >= 0)
        close(w->sock);
    if (w->is_regex)
        regfree(&w->re);
    free(w->pattern);
    free(w->path);
    sbx_buf_free(&w->resp);
    free(w);
}

/* End a waiter with an error (it is unlinked and freed). */
void
proc_waiter_fail(struct waiter *w, int code, const char *fmt, ...)
{
    struct agent *a = w->p->a;
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    proc_waiter_unlink(w);
    sbx_werr e;
    sbx_werr_init(&e, code, "%s", msg);
    sbx_enc_kstr(sbx_werr_ctx(&e), "processId", w->p->id);
    if (w->p->finished)
        sbx_enc_kint(sbx_werr_ctx(&e), "exitCode", w->p->exit_code);
    agent_reply_werr(a, w->req, &e);
    sbx_werr_free(&e);
    proc_waiter_free(a, w);
}

void
proc_waiter_ok(struct waiter *w, sbx_enc *res)
{
    struct agent *a = w->p->a;
    proc_waiter_unlink(w);
    agent_reply_ok(a, w->req, res);
    proc_waiter_free(a, w);
}

static const char *
condition(struct waiter *w, char *buf, size_t n)
{
    if (w->kind == W_LOG)
        snprintf(buf, n, "%s \"%.*s\"", w->is_regex ? "regex" : "log line containing",
                 (int)SBX_MIN(w->plen, (size_t)200), w->pattern);
    else if (w->kind == W_PORT)
        snprintf(buf, n, "port %d (%s%s)", w->port, w->http ? "HTTP " : "TCP",
                 w->http ? w->path : "");
    else
        snprintf(buf, n, "exit");
    return buf;
}

static void
waiter_timeout(sbx_loop *l, void *arg)
{
    struct waiter *w = arg;
    char c[300];
    (void)l;
    w->timer = 0;
    if (w->by_deadline) {
        /* Nobody waits for the answer any more: the shard has told the
         * client (docs/protocol.md §2), and a waiter left here would keep
         * the operation in flight and the sandbox from sleeping. */
        if (w->kind == W_EXIT)
            proc_waiter_fail(w, SBX_E_TIMEOUT,
                        "process %s was still running at the request's deadline", w->p->id);
        else
            proc_waiter_fail(w, SBX_E_TIMEOUT,
                        "process %s was not ready at the request's deadline; waiting for: %s",
                        w->p->id, condition(w, c, sizeof(c)));
        return;
    }
    if (w->kind == W_EXIT)
        proc_waiter_fail(w, SBX_E_TIMEOUT, "process %s still running after %lldms", w->p->id,
                    (long long)w->timeout_ms);
    else
        proc_waiter_fail(w, SBX_E_READY_TIMEOUT,
                    "Process did not become ready within %lldms. Waiting for: %s",
                    (long long)w->timeout_ms, condition(w, c, sizeof(c)));
}

/* The waiter's timer: its `timeout`, or the request's deadline when that
 * comes first (or there is no timeout). */
static void
waiter_arm(struct agent *a, struct waiter *w)
{
    int64_t t = w->timeout_ms;
    if (w->req && w->req->deadline_ms) {
        int64_t left = SBX_MAX(w->req->deadline_ms - sbx_mono_ms(), (int64_t)0);
        if (!t || left < t) {
            t = left;
            w->by_deadline = true;
        }
    }
    if (t || w->by_deadline)
        w->timer = sbx_loop_timer(a->loop, t, waiter_timeout, w);
}

/* ------------------------------------------------------------------------------ */
/* Log lines. */

/* Does line (n bytes) satisfy w?  On a match, fills res and returns true. */
static bool
line_matches(struct waiter *w, const char *line, size_t n, sbx_enc *res)
{
    if (!w->is_regex) {
        if (!memmem(line, n, w->pattern, w->plen))
            return false;
        sbx_enc_init(res);
        sbx_enc_map(res);
        sbx_enc_kstrn(res, "line", line, n);
        return true;
    }
    char *z = sbx_xstrndup(line, n);
    regmatch_t m[10];
    bool ok = regexec(&w->re, z, 10, m, 0) == 0;
    if (ok) {
        sbx_enc_init(res);
        sbx_enc_map(res);
        sbx_enc_kstrn(res, "line", line, n);
        sbx_enc_karray(res, "match");
        for (int i = 0; i < 10 && m[i].rm_so >= 0; i++)
            sbx_enc_strn(res, z + m[i].rm_so, (size_t)(m[i].rm_eo - m[i].rm_so));
        sbx_enc_end(res);
    }
    free(z);
    return ok;
}

/* A complete line arrived on stream i: try every log waiter. */
void
proc_on_line(struct proc *p, const char *line, size_t n)
{
    if (n && line[n - 1] == '\r')
        n--;
    struct waiter *w = p->waiters;
    while (w) {
        struct waiter *next = w->next;
        sbx_enc res;
        if (w->kind == W_LOG && line_matches(w, line, n, &res))
            proc_waiter_ok(w, &res);
        w = next;
    }
}

void
proc_feed_lines(struct proc *p, int i, const char *data, size_t n)
{
    sbx_buf *b = &p->line[i];
    while (n) {
        const char *nl = memchr(data, '\n', n);
        size_t k = nl ? (size_t)(nl - data) : n;
        if (b->len + k > LINE_MAX_BYTES)
            k = LINE_MAX_BYTES > b->len ? LINE_MAX_BYTES - b->len : 0;
        sbx_buf_append(b, data, k);
        if (nl) {
            proc_on_line(p, b->p ? b->p : "", b->len);
            b->len = 0;
            size_t used = (size_t)(nl - data) + 1;
            data += used;
            n -= used;
        } else {
            data += n;
            n = 0;
        }
    }
}

/* ------------------------------------------------------------------------------ */
/* waitForExit / waitForLog. */

static int64_t
timeout_arg(struct agent_req *r)
{
    int64_t t = 0;
    if (sbx_wire_get_i64(r->args, "timeout", &t) != 0 || t < 0)
        t = 0;
    return t;
}

void
agent_op_process_wait_exit(struct agent *a, struct agent_req *r)
{
    struct proc *p = proc_arg(a, r);
    if (!p)
        return;
    if (p->finished) {
        sbx_enc res;
        sbx_enc_init(&res);
        sbx_enc_map(&res);
        sbx_enc_kstr(&res, "processId", p->id);
        sbx_enc_kint(&res, "exitCode", p->exit_code);
        sbx_enc_kstr(&res, "status", p->status);
        agent_reply_ok(a, r, &res);
        return;
    }
    struct waiter *w = proc_add_waiter(p, W_EXIT, r);
    w->timeout_ms = timeout_arg(r);
    waiter_arm(a, w);
}

struct hist {
    struct waiter *w;
    sbx_buf line[2];
    sbx_enc res;
    bool found;
};

static int
scan_history(void *arg, const msgpack_object *ev)
{
    struct hist *h = arg;
    sbx_str type, data;
    if (sbx_wire_get_str(ev, "type", &type) != 0 || sbx_wire_get_bin(ev, "data", &data) != 0)
        return 0;
    int i = sbx_str_eq(type, "stdout") ? 0 : sbx_str_eq(type, "stderr") ? 1 : -1;
    if (i < 0)
        return 0;
    const char *d = data.p;
    size_t n = data.n;
    while (n) {
        const char *nl = memchr(d, '\n', n);
        size_t k = nl ? (size_t)(nl - d) : n;
        sbx_buf_append(&h->line[i], d, k);
        if (!nl)
            break;
        size_t ln = h->line[i].len;
        if (ln && h->line[i].p[ln - 1] == '\r')
            ln--;
        if (line_matches(h->w, h->line[i].p ? h->line[i].p : "", ln, &h->res)) {
            h->found = true;
            return 1;
        }
        h->line[i].len = 0;
        d += k + 1;
        n -= k + 1;
    }
    return 0;
}

void
agent_op_process_wait_log(struct agent *a, struct agent_req *r)
{
    struct proc *p = proc_arg(a, r);
    if (!p)
        return;
    sbx_str pat;
    bool is_regex = false;
    if (sbx_wire_get_str(r->args, "pattern", &pat) != 0 || pat.n == 0 || pat.n > 4096) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'pattern' (1-4096 bytes) is required");
        return;
    }
    sbx_wire_get_bool(r->args, "regex", &is_regex);
    struct waiter *w = proc_add_waiter(p, W_LOG, r);
    w->pattern = sbx_str_dup(pat);
    w->plen = pat.n;
    w->timeout_ms = timeout_arg(r);
    if (is_regex) {
        int rc = regcomp(&w->re, w->pattern, REG_EXTENDED);
        if (rc) {
            char msg[200];
            regerror(rc, &w->re, msg, sizeof(msg));
            proc_waiter_unlink(w);
            w->req = NULL;
            proc_waiter_free(a, w);
            agent_reply_err(a, r, SBX_E_VALIDATION, "invalid regular expression: %s", msg);
            return;
        }
        w->is_regex = true;
    }
    /* Lines written before the call count: scan what the ring holds, then
     * the lines still open. */
    struct hist h = {.w = w};
    sbx_buf_init(&h.line[0]);
    sbx_buf_init(&h.line[1]);
    stream_foreach(p->log, scan_history, &h);
    for (int i = 0; i < 2 && !h.found; i++)
        if (h.line[i].len && line_matches(w, h.line[i].p, h.line[i].len, &h.res))
            h.found = true;
    sbx_buf_free(&h.line[0]);
    sbx_buf_free(&h.line[1]);
    if (h.found) {
        proc_waiter_ok(w, &h.res);
        return;
    }
    if (p->finished) {
        proc_waiter_fail(w, SBX_E_EXITED_BEFORE_READY,
                    "Process exited with code %d before becoming ready", p->exit_code);
        return;
    }
    waiter_arm(a, w);
}

/* ------------------------------------------------------------------------------ */
/* waitForPort: TCP connect or HTTP GET to 127.0.0.1:port, every `interval`. */

static void port_poll(sbx_loop *l, void *arg);

static void
port_retry(struct waiter *w)
{
    struct agent *a = w->p->a;
    if (w->w) {
        sbx_loop_unwatch(a->loop, w->w);
        w->w = NULL;
    }
    if (w->sock >= 0) {
        close(w->sock);
        w->sock = -1;
    }
    w->resp.len = 0;
    w->sent = false;
    w->poll_timer = sbx_loop_timer(a->loop, w->interval, port_poll, w);
}

static void
port_ready(struct waiter *w, int status)
{
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kbool(&res, "ready", true);
    sbx_enc_kint(&res, "port", w->port);
    if (status)
        sbx_enc_kint(&res, "statusCode", status);
    proc_waiter_ok(w, &res);
}

static void
port_io(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct waiter *w = arg;
    (void)l;
    if (!w->sent) {
        int err = 0;
        socklen_t len = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err || (ev & (EPOLLERR | EPOLLHUP))) {
            port_retry(w);
            return;
        }
        if (!w->http) {
            port_ready(w, 0);
            return;
        }
        char req[2200];
        int n = snprintf(req, sizeof(req),
                         "GET %s HTTP/1.1\r\nHost: localhost:%d\r\nUser-Agent: sbx-agent\r\n"
                         "Connection: close\r\n\r\n",
                         w->path, w->port);
        if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
            port_retry(w);
            return;
        }
        w->sent = true;
        sbx_loop_modify(w->p->a->loop, w->w, EPOLLIN);
        return;
    }
    char buf[512];
    ssize_t r = recv(fd, buf, sizeof(buf), 0);
    if (r > 0 && w->resp.len < 4096)
        sbx_buf_append(&w->resp, buf, (size_t)r);
    char *eol = w->resp.p ? memchr(w->resp.p, '\n', w->resp.len) : NULL;
    if (eol || r <= 0) {
        int status = 0;
        if (w->resp.p && sscanf(w->resp.p, "HTTP/%*s %d", &status) == 1 && status >= w->smin &&
            status <= w->smax) {
            port_ready(w, status);
            return;
        }
        if (r < 0 && errno == EAGAIN)
            return;
        port_retry(w);
    }
}

static void
port_poll(sbx_loop *l, void *arg)
{
    struct waiter *w = arg;
    w->poll_timer = 0;
    int s = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
        w->poll_timer = sbx_loop_timer(l, w->interval, port_poll, w);
        return;
    }
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)w->port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
        close(s);
        w->poll_timer = sbx_loop_timer(l, w->interval, port_poll, w);
        return;
    }
    w->sock = s;
    w->w = sbx_loop_watch(l, s, EPOLLOUT, port_io, w);
}

void
agent_op_process_wait_port(struct agent *a, struct agent_req *r)
{
    struct proc *p = proc_arg(a, r);
    if (!p)
        return;
    int64_t port = 0, v;
    sbx_str mode = SBX_STR("http"), path = SBX_STR("/");
    if (sbx_wire_get_i64(r->args, "port", &port) != 0 || port < 1 || port > 65535) {
        agent_reply_err(a, r, SBX_E_INVALID_PORT, "'port' must be 1-65535");
        return;
    }
    sbx_wire_get_str(r->args, "mode", &mode);
    if (!sbx_str_eq(mode, "http") && !sbx_str_eq(mode, "tcp")) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'mode' must be \"http\" or \"tcp\"");
        return;
    }
    sbx_wire_get_str(r->args, "path", &path);
    if (path.n == 0 || path.n > 2000 || path.p[0] != '/' || memchr(path.p, '\r', path.n) ||
        memchr(path.p, '\n', path.n) || memchr(path.p, ' ', path.n)) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'path' must be an absolute URL path");
        return;
    }
    struct waiter *w = proc_add_waiter(p, W_PORT, r);
    w->port = (int)port;
    w->http = sbx_str_eq(mode, "http");
    w->path = sbx_str_dup(path);
    w->smin = 200;
    w->smax = 399;
    if (sbx_wire_get_i64(r->args, "status", &v) == 0)
        w->smin = w->smax = (int)v;
    if (sbx_wire_get_i64(r->args, "statusMin", &v) == 0)
        w->smin = (int)v;
    if (sbx_wire_get_i64(r->args, "statusMax", &v) == 0)
        w->smax = (int)v;
    w->interval = 500;
    if (sbx_wire_get_i64(r->args, "interval", &v) == 0 && v >= 10 && v <= 60000)
        w->interval = v;
    w->timeout_ms = timeout_arg(r);
    if (p->finished) {
        proc_waiter_fail(w, SBX_E_EXITED_BEFORE_READY,
                    "Process exited with code %d before becoming ready", p->exit_code);
        return;
    }
    waiter_arm(a, w);
    w->poll_timer = sbx_loop_timer(a->loop, 0, port_poll, w);
}
