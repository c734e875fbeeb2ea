/*
 * interp_driver.c — the driver protocol of code contexts: one driver process
 * (container/interp/driver.py or driver.js), the requests written to its
 * fd 3, the JSON event lines read from its fd 4 (Jupyter iopub vocabulary:
 * stream, display_data, execute_result, error, done) and its fd-level
 * output on fd 1/2, with the back-pressure of a streamed run; starting,
 * closing and killing a driver.  Called by interp.c (runs) and
 * interp_pool.c (spawning); a driver is owned by the interp's driver list
 * and freed by interp_driver_free.  One loop thread.
 */
#include "interp_int.h"

/* ------------------------------------------------------------------------------ */
/* The driver's pipes. */

void
interp_req_pump(struct driver *d)
{
    size_t off = 0;
    while (off < d->reqq.len) {
        ssize_t w = write(d->req_fd, d->reqq.p + off, d->reqq.len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        off += (size_t)w;
    }
    sbx_buf_consume(&d->reqq, off);
    sbx_loop_modify(d->a->loop, d->w_req, d->reqq.len ? EPOLLOUT : 0);
}

static void
req_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    (void)l;
    (void)fd;
    (void)ev;
    interp_req_pump(arg);
}

/*
 * Back-pressure of a streamed run, as for exec streams: when its lossless
 * stream holds its cap of unread events, the driver's pipes are not read
 * (the cell blocks on its next write) until the reader catches up (resume).
 * A run that timed out or whose stream was cancelled is `released`: its
 * pipes are read again, so the interrupt lands and the context survives a
 * reader that went away, and its events past the cap are dropped (counted
 * in execution_complete's droppedEvents) — the agent's memory stays bounded
 * either way.
 */
static bool
stream_blocks(struct driver *d)
{
    struct run *r = d->ctx ? d->ctx->cur : NULL;
    if (!r || !r->stream || r->released || !stream_full(r->stream))
        return false;
    r->stream->paused = true;
    d->paused = true;
    sbx_watch *ws[] = {d->w_ev, d->w_out, d->w_err};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ws); i++)
        if (ws[i])
            sbx_loop_modify(d->a->loop, ws[i], 0);
    return true;
}

/* Read the driver's pipes again (a pipe at EOF turns itself off again). */
void
interp_driver_unpause(struct driver *d)
{
    if (!d || !d->paused)
        return;
    d->paused = false;
    sbx_watch *ws[] = {d->w_ev, d->w_out, d->w_err};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ws); i++)
        if (ws[i])
            sbx_loop_modify(d->a->loop, ws[i], EPOLLIN);
}

/* Whether a streamed run may add an event: not when it was released and
 * its stream is full (the event is counted as dropped). */
static bool
stream_room(struct run *r)
{
    if (r->released && stream_full(r->stream)) {
        r->dropped++;
        return false;
    }
    return true;
}

/* One piece of stdout or stderr text (valid UTF-8) for the running cell:
 * an event of the stream, or kept for the reply. */
static void
run_log(struct run *r, bool isout, const char *p, size_t n)
{
    if (!n)
        return;
    if (r->stream) {
        if (!stream_room(r))
            return;
        sbx_enc *e = stream_begin(r->stream, isout ? "stdout" : "stderr");
        sbx_enc_kstrn(e, "text", p, n);
        stream_commit(r->stream, false);
    } else {
        interp_logacc_add(&r->logs[isout ? 0 : 1], p, n);
    }
}

/* fd-level bytes p[0..n) of one pipe, after what the last read left over:
 * the complete characters go to the cell (invalid bytes as U+FFFD), an
 * incomplete last one waits for the next read; with `flush` (the cell is
 * over) it goes too, as one U+FFFD (as a decoder reports a truncated
 * sequence). */
static void
fdout_text(struct driver *d, struct run *r, int which, const char *p, size_t n, bool flush)
{
    char buf[4 + 65536];
    size_t len = d->ncarry[which];
    memcpy(buf, d->carry[which], len);
    memcpy(buf + len, p, n);
    len += n;
    size_t keep = sbx_utf8_complete_prefix(buf, len);
    d->ncarry[which] = flush || !r ? 0 : len - keep; /* idle: output between cells is dropped */
    memcpy(d->carry[which], buf + keep, d->ncarry[which]);
    if (!r)
        return;
    size_t sl;
    char *s = sbx_utf8_sanitize(buf, keep, &sl);
    run_log(r, which == 0, s, sl);
    free(s);
    if (flush && keep < len)
        run_log(r, which == 0, "\xef\xbf\xbd", 3);
}

/* fd-level output of the driver (subprocesses, C extensions): logs of the
 * running cell, or dropped when idle. */
static void
fdout_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct driver *d = arg;
    char buf[65536];
    (void)ev;
    while (!stream_blocks(d)) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) {
            struct context *c = d->ctx;
            struct run *r = c && c->cur && !c->cur->is_init ? c->cur : NULL;
            fdout_text(d, r, fd == d->out_fd ? 0 : 1, buf, (size_t)n, false);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            sbx_watch **w = fd == d->out_fd ? &d->w_out : &d->w_err;
            sbx_loop_modify(l, *w, 0);
        }
        return;
    }
}

/* At the end of a cell: what the pipes hold now belongs to it, and so does
 * an unfinished character. */
static void
drain_fdout(struct driver *d)
{
    if (d->out_fd >= 0)
        fdout_cb(d->a->loop, d->out_fd, EPOLLIN, d);
    if (d->err_fd >= 0)
        fdout_cb(d->a->loop, d->err_fd, EPOLLIN, d);
    struct context *c = d->ctx;
    struct run *r = c && c->cur && !c->cur->is_init ? c->cur : NULL;
    for (int i = 0; i < 2; i++)
        if (d->ncarry[i])
            fdout_text(d, r, i, "", 0, true);
}

/* One event line from the driver. */
static void
on_event(struct driver *d, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    if (!type)
        return;
    if (!strcmp(type, "ready")) {
        if (d->ready)
            return; /* only the driver's first line: a cell could write more */
        if (d->pid <= 0) {
            /* A fork: its pid is known from here on (it cannot have run
             * user code yet).  Never one of ours to signal by mistake. */
            json_t *pid = json_object_get(ev, "pid");
            pid_t p = json_is_integer(pid) ? (pid_t)json_integer_value(pid) : 0;
            if (p <= 1 || p == getpid()) {
                interp_driver_died(d, "its ready line named no valid pid");
                return;
            }
            d->pid = p;
        }
        d->ready = true;
        const char *mode = json_string_value(json_object_get(ev, "mode"));
        snprintf(d->mode, sizeof(d->mode), "%s", mode ? mode : "");
        sbx_loop_cancel(d->a->loop, d->ready_timer);
        d->ready_timer = 0;
        if (d->ctx)
            interp_run_next(d->ctx);
        return;
    }
    struct context *c = d->ctx;
    struct run *r = c ? c->cur : NULL;
    const char *id = json_string_value(json_object_get(ev, "id"));
    if (!r || !id || strcmp(id, r->rid))
        return; /* stale (a cell we gave up on) */
    if (!strcmp(type, "done")) {
        json_t *ec = json_object_get(ev, "execution_count");
        if (json_is_integer(ec))
            r->exec_count = (int)json_integer_value(ec);
        const char *st = json_string_value(json_object_get(ev, "status"));
        drain_fdout(d);
        interp_run_finish(c, st ? st : "ok");
        return;
    }
    if (r->is_init) {
        if (!strcmp(type, "error")) {
            r->has_error = true;
            sbx_enc_init(&r->error);
            sbx_enc_map(&r->error);
            const char *ev2 = json_string_value(json_object_get(ev, "evalue"));
            sbx_enc_kstr(&r->error, "value", ev2 ? ev2 : "");
        }
        return;
    }
    if (!strcmp(type, "stream")) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        json_t *t = json_object_get(ev, "text");
        if (json_is_string(t))
            run_log(r, !name || strcmp(name, "stderr") != 0, json_string_value(t),
                    json_string_length(t));
        return;
    }
    if (!strcmp(type, "display_data") || !strcmp(type, "execute_result")) {
        json_t *data = json_object_get(ev, "data");
        if (!json_is_object(data))
            return;
        json_t *chart = json_object_get(ev, "chart");
        bool main_result = !strcmp(type, "execute_result");
        if (r->stream) {
            if (!stream_room(r))
                return;
            sbx_enc *e = stream_begin(r->stream, "result");
            sbx_enc_str(e, "result");
            interp_encode_result(e, data, chart, main_result, false);
            stream_commit(r->stream, false);
        } else {
            interp_run_add_result(r, data, chart, main_result);
        }
        return;
    }
    if (!strcmp(type, "error")) {
        const char *ename = json_string_value(json_object_get(ev, "ename"));
        json_t *evalue = json_object_get(ev, "evalue"), *tb = json_object_get(ev, "traceback");
        sbx_enc *e;
        if (r->stream) {
            if (!stream_room(r))
                return;
            e = stream_begin(r->stream, "error");
        } else {
            if (r->has_error)
                sbx_enc_free(&r->error);
            r->has_error = true;
            sbx_enc_init(&r->error);
            sbx_enc_map(&r->error);
            e = &r->error;
        }
        interp_encode_error_fields(e, ename, evalue, tb);
        if (r->stream)
            stream_commit(r->stream, false);
    }
}

/* The event pipe closed EOF_GRACE_MS ago and the driver has not been
 * reaped: it lives on without a way to talk; kill it. */
static void
eof_grace(sbx_loop *l, void *arg)
{
    struct driver *d = arg;
    (void)l;
    d->eof_timer = 0;
    interp_driver_kill(d);
    interp_driver_died(d, "it closed its event pipe");
}

void
interp_ev_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct driver *d = arg;
    char buf[65536];
    (void)l;
    (void)ev;
    while (!stream_blocks(d)) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) {
            sbx_buf_append(&d->evbuf, buf, (size_t)n);
            char *nl;
            while (d->evbuf.len && (nl = memchr(d->evbuf.p, '\n', d->evbuf.len)) != NULL) {
                size_t len = (size_t)(nl - d->evbuf.p);
                json_error_t je;
                json_t *j = json_loadb(d->evbuf.p, len, 0, &je);
                sbx_buf_consume(&d->evbuf, len + 1);
                if (j) {
                    on_event(d, j);
                    json_decref(j);
                    if (d->dead)
                        return;
                }
            }
            if (d->evbuf.len > EVENT_LINE_MAX) {
                interp_driver_died(d, "it sent an event line over 64 MiB");
                return;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        /* The driver is exiting, most likely: its exit status tells the
         * user more than the pipe does, so wait a little for the reap. */
        sbx_loop_modify(d->a->loop, d->w_ev, 0);
        if (d->pid > 0) {
            if (!d->eof_timer)
                d->eof_timer = sbx_loop_timer(d->a->loop, EOF_GRACE_MS, eof_grace, d);
            return;
        }
        interp_driver_died(d, "its event pipe closed");
        return;
    }
}

/* ------------------------------------------------------------------------------ */
/* Drivers. */

void
interp_driver_close_child(struct driver *d)
{
    for (int i = 0; i < 4; i++) {
        if (d->child[i] >= 0)
            close(d->child[i]);
        d->child[i] = -1;
    }
}

void
interp_driver_close(struct driver *d)
{
    struct agent *a = d->a;
    sbx_watch **ws[] = {&d->w_req, &d->w_ev, &d->w_out, &d->w_err};
    int *fds[] = {&d->req_fd, &d->ev_fd, &d->out_fd, &d->err_fd};
    for (size_t i = 0; i < 4; i++) {
        if (*ws[i])
            sbx_loop_unwatch(a->loop, *ws[i]);
        *ws[i] = NULL;
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
    interp_driver_close_child(d);
    d->pending = false;
    sbx_loop_cancel(a->loop, d->ready_timer);
    sbx_loop_cancel(a->loop, d->eof_timer);
    d->ready_timer = d->eof_timer = 0;
}

void
interp_driver_free(struct driver *d)
{
    struct interp *in = IS(d->a);
    for (struct driver **pp = &in->drivers; *pp; pp = &(*pp)->next) {
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    }
    interp_driver_close(d);
    sbx_buf_free(&d->evbuf);
    sbx_buf_free(&d->reqq);
    free(d);
}

/* Kill the driver and what it started.  A fork whose `ready` has not come
 * has no pid yet: closing its pipes (interp_driver_close) ends it (EOF on fd 3). */
void
interp_driver_kill(struct driver *d)
{
    if (d->pid > 0 && !d->dead)
        agent_kill_tree(d->pid, false, NULL, 0);
}

static void
ready_timeout(sbx_loop *l, void *arg)
{
    struct driver *d = arg;
    (void)l;
    d->ready_timer = 0;
    interp_driver_kill(d);
    interp_driver_died(d, "it did not start within 30 s");
}

/* Seed matplotlib's cache directory with the font list built at install
 * time (tools/install-interp.sh): the first `import matplotlib` in a sandbox
 * then takes 0.5 s instead of 1.1 s. */
void
interp_seed_mpl_cache(void)
{
    static const char src[] = INTERP_DIR "/mplcache/fontlist-v330.json";
    static const char dst[] = "/tmp/.sbx-matplotlib/fontlist-v330.json";
    char *buf = NULL;
    size_t n;
    if (access(dst, F_OK) == 0 || sbx_fs_read(src, 16u << 20, &buf, &n) != 0)
        return;
    mkdir("/tmp/.sbx-matplotlib", 0755);
    int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        sbx_write_full(fd, buf, n);
        close(fd);
    }
    free(buf);
}

/* FNV-1a of the sandbox environment: what a warm driver or the fork server
 * started with, compared when it is about to serve a context. */
uint64_t
interp_env_hash(char *const *env)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (char *const *p = env; p && *p; p++)
        for (const unsigned char *c = (const unsigned char *)*p;; c++) {
            h = (h ^ *c) * 0x100000001b3ull;
            if (!*c)
                break;
        }
    return h;
}

/* Whether a context's envVars must be in the interpreter's environment at
 * its start (read once by the interpreter, the dynamic loader or libc):
 * such a context gets a driver of its own, started with them, instead of a
 * warm one that `init` could only tell afterwards. */
bool
interp_env_needs_start(int kind, const msgpack_object *env)
{
    static const char *const any[] = {"LD_", "MALLOC_", "GLIBC_TUNABLES"};
    static const char *const py[] = {"PYTHON", "SBX_PY_"};
    static const char *const node[] = {"NODE_", "UV_"};
    /* Start-time settings a driver has no use for (it runs -u, writes no
     * bytecode and has its own stdout): set by `init` for its children. */
    static const char *const idle[] = {"PYTHONUNBUFFERED", "PYTHONIOENCODING",
                                       "PYTHONDONTWRITEBYTECODE"};
    for (uint32_t i = 0; env && i < env->via.map.size; i++) {
        sbx_str k;
        bool skip = false;
        if (sbx_wire_obj_str(&env->via.map.ptr[i].key, &k) != 0)
            continue;
        for (size_t j = 0; j < SBX_ARRAY_LEN(idle); j++)
            skip = skip || sbx_str_eq(k, idle[j]);
        if (skip)
            continue;
        const char *const *sets[] = {any, kind == K_PY ? py : node};
        size_t lens[] = {SBX_ARRAY_LEN(any), kind == K_PY ? SBX_ARRAY_LEN(py) : SBX_ARRAY_LEN(node)};
        for (size_t s = 0; s < 2; s++)
            for (size_t j = 0; j < lens[s]; j++) {
                size_t pl = strlen(sets[s][j]);
                if (k.n >= pl && !memcmp(k.p, sets[s][j], pl))
                    return true;
            }
    }
    return false;
}

/* The interpreter and driver of a kind, or why not (the host lacks them:
 * SBX_E_PYTHON_NA or SBX_E_JAVASCRIPT_NA in *err). */
int
interp_driver_paths(int kind, const char **bin, const char **script, sbx_err_t *err)
{
    static const char *const nodes[] = {"/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"};
    struct stat st;
    *script = kind == K_PY ? INTERP_DIR "/driver.py" : INTERP_DIR "/driver.js";
    *bin = NULL;
    int na = kind == K_PY ? SBX_E_PYTHON_NA : SBX_E_JAVASCRIPT_NA;
    if (stat(*script, &st) < 0)
        return sbx_err_make(err, na, "the interpreter driver %s is not installed", *script);
    if (kind == K_PY) {
        if (access("/usr/bin/python3", X_OK) == 0)
            *bin = "/usr/bin/python3";
    } else {
        for (size_t i = 0; i < SBX_ARRAY_LEN(nodes) && !*bin; i++)
            if (access(nodes[i], X_OK) == 0)
                *bin = nodes[i];
    }
    if (!*bin)
        return sbx_err_make(err, na,
                            "%s is not installed in the sandbox (its /usr: the host's, or its "
                            "image's)",
                            kind == K_PY ? "python3" : "node");
    return 0;
}

/* The environment of an interpreter: the sandbox's, the context's own
 * overrides (NULL for a pooled driver), and defaults they do not set. */
char **
interp_driver_env(struct agent *a, const msgpack_object *over)
{
    static const char *const extra[] = {"NODE_NO_WARNINGS=1", "PYTHONDONTWRITEBYTECODE=1",
                                        "MPLCONFIGDIR=/tmp/.sbx-matplotlib"};
    char **env = agent_env_merge(a->env, over);
    size_t n = 0;
    while (env[n])
        n++;
    env = sbx_xrealloc(env, (n + SBX_ARRAY_LEN(extra) + 1) * sizeof(char *));
    for (size_t i = 0; i < SBX_ARRAY_LEN(extra); i++) {
        size_t kl = (size_t)(strchr(extra[i], '=') - extra[i]);
        bool have = false;
        for (size_t k = 0; k < n && !have; k++)
            have = !strncmp(env[k], extra[i], kl + 1);
        if (!have)
            env[n++] = sbx_xstrdup(extra[i]);
    }
    env[n] = NULL;
    return env;
}

/* A driver with its pipes, not started: our ends are watched, its ends wait
 * in d->child for driver_exec or the fork server. */
struct driver *
interp_driver_new(struct agent *a, int kind, int lang, sbx_err_t *err)
{
    int p[4][2];
    int n = 0;
    for (; n < 4; n++)
        if (pipe2(p[n], O_CLOEXEC) < 0)
            break;
    if (n < 4) {
        sbx_err_make(err, -errno, "pipe");
        for (int i = 0; i < n; i++) {
            close(p[i][0]);
            close(p[i][1]);
        }
        return NULL;
    }
    struct driver *d = sbx_xcalloc(1, sizeof(*d));
    d->a = a;
    d->kind = kind;
    d->lang = lang;
    d->spawned_ms = sbx_mono_ms();
    /* requests: we write; events, stdout, stderr: we read */
    d->req_fd = p[0][1];
    d->child[0] = p[0][0];
    d->ev_fd = p[1][0];
    d->child[1] = p[1][1];
    d->out_fd = p[2][0];
    d->child[2] = p[2][1];
    d->err_fd = p[3][0];
    d->child[3] = p[3][1];
    int fds[] = {d->req_fd, d->ev_fd, d->out_fd, d->err_fd};
    for (size_t i = 0; i < 4; i++)
        sbx_set_nonblock(fds[i], true);
    sbx_buf_init(&d->evbuf);
    sbx_buf_init(&d->reqq);
    d->w_req = sbx_loop_watch(a->loop, d->req_fd, 0, req_cb, d);
    d->w_ev = sbx_loop_watch(a->loop, d->ev_fd, EPOLLIN, interp_ev_cb, d);
    d->w_out = sbx_loop_watch(a->loop, d->out_fd, EPOLLIN, fdout_cb, d);
    d->w_err = sbx_loop_watch(a->loop, d->err_fd, EPOLLIN, fdout_cb, d);
    d->ready_timer = sbx_loop_timer(a->loop, READY_TIMEOUT_MS, ready_timeout, d);
    struct interp *in = IS(a);
    d->next = in->drivers;
    in->drivers = d;
    return d;
}

/* Start d as a process of its own (execve), with the context's overrides. */
int
interp_driver_exec(struct driver *d, const msgpack_object *over, sbx_err_t *err)
{
    const char *bin, *script;
    int rc = interp_driver_paths(d->kind, &bin, &script, err);
    if (rc != 0)
        return rc;
    int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul < 0)
        return sbx_err_make(err, -errno, "/dev/null");
    const char *argv_py[] = {bin, "-u", script, NULL};
    const char *argv_js[] = {bin, script, d->lang == L_TS ? "typescript" : "javascript", NULL};
    char **env = interp_driver_env(d->a, over);
    int keep[] = {d->child[0], d->child[1]};
    struct spawn_opts so = {
        .in_fd = nul,
        .out_fd = d->child[2],
        .err_fd = d->child[3],
        .keep_fds = keep,
        .nkeep = 2,
        .cwd = "/workspace",
        .env = env,
        .argv = d->kind == K_PY ? argv_py : argv_js,
        .subreaper = true,
        .new_session = true,
    };
    pid_t pid = agent_spawn(d->a, &so);
    agent_env_free(env);
    close(nul);
    interp_driver_close_child(d);
    if (pid < 0)
        return sbx_err_make(err, (int)pid, "could not start the interpreter");
    d->pid = pid;
    return 0;
}
