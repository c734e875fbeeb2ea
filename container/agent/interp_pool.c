/*
 * interp_pool.c — warm drivers: the Python fork server (driver.py
 * --fork-server, struct zygote) and the per-kind pools of ready drivers
 * (POOL_SIZE), refilled after a driver is taken; the spawning of a driver
 * for a context; and what happens when a driver process dies or is reaped
 * (agent_interp_reaped, called by main.c's SIGCHLD handling).  Called by
 * interp.c; drivers it makes are on the interp's driver list.  One loop
 * thread.
 */
#include "interp_int.h"

/* ---- the Python fork server ---- */

static void
zygote_ready_timeout(sbx_loop *l, void *arg)
{
    struct agent *a = arg;
    (void)l;
    IS(a)->zyg->ready_timer = 0;
    interp_zygote_gone(a, true);
}

/* Hand the waiting Python drivers to the fork server: one message each,
 * their four ends attached.  A full socket waits for EPOLLOUT. */
static void
zygote_flush(struct agent *a)
{
    struct interp *in = IS(a);
    struct zygote *z = in->zyg;
    if (!z || !z->ready)
        return;
    for (struct driver *d = in->drivers; d; d = d->next) {
        if (!d->pending)
            continue;
        char msg[] = "{\"type\":\"fork\"}";
        union {
            char buf[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct iovec iov = {msg, sizeof(msg) - 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                            .msg_controllen = sizeof(u.buf)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(4 * sizeof(int));
        memcpy(CMSG_DATA(cm), d->child, 4 * sizeof(int));
        if (sendmsg(z->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                sbx_loop_modify(a->loop, z->w, EPOLLIN | EPOLLOUT);
                return;
            }
            interp_zygote_gone(a, false);
            return;
        }
        d->pending = false;
        interp_driver_close_child(d);
    }
    sbx_loop_modify(a->loop, z->w, EPOLLIN);
}

static void driver_exited(struct agent *a, pid_t pid, int status);

/* Messages of the fork server: ready, error, and the exit status of the
 * drivers it forked (they are its children). */
static void
zygote_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct agent *a = arg;
    struct interp *in = IS(a);
    (void)l;
    if (ev & EPOLLOUT)
        zygote_flush(a);
    while (in->zyg) {
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            interp_zygote_gone(a, !in->zyg->ready);
            return;
        }
        json_error_t je;
        json_t *j = json_loadb(buf, (size_t)n, 0, &je);
        const char *type = json_string_value(json_object_get(j, "type"));
        json_t *pid = json_object_get(j, "pid"), *st = json_object_get(j, "status");
        if (type && !strcmp(type, "ready") && !in->zyg->ready) {
            in->zyg->ready = true;
            sbx_loop_cancel(a->loop, in->zyg->ready_timer);
            in->zyg->ready_timer = 0;
            json_decref(j);
            zygote_flush(a);
        } else if (type && !strcmp(type, "exit") && json_is_integer(pid) && json_is_integer(st)) {
            driver_exited(a, (pid_t)json_integer_value(pid), (int)json_integer_value(st));
            json_decref(j);
        } else if (type && !strcmp(type, "error")) {
            json_decref(j);
            interp_zygote_gone(a, true);
            return;
        } else {
            json_decref(j);
        }
    }
}

/* Start the fork server with the current sandbox environment. */
static void
zygote_start(struct agent *a)
{
    struct interp *in = IS(a);
    const char *bin, *script;
    int sv[2] = {-1, -1}, nul = -1;
    if (interp_driver_paths(K_PY, &bin, &script, NULL) != 0 ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
        (nul = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
        in->zyg_broken = true;
    } else {
        const char *argv[] = {bin, "-u", script, "--fork-server", NULL};
        char **env = interp_driver_env(a, NULL);
        int keep[] = {sv[1]};
        struct spawn_opts so = {
            .in_fd = nul, .out_fd = nul, .err_fd = nul, .keep_fds = keep, .nkeep = 1,
            .cwd = "/workspace", .env = env, .argv = argv, .new_session = true,
        };
        pid_t pid = agent_spawn(a, &so);
        agent_env_free(env);
        if (pid < 0) {
            in->zyg_broken = true;
        } else {
            struct zygote *z = sbx_xcalloc(1, sizeof(*z));
            z->pid = pid;
            z->fd = sv[0];
            sv[0] = -1;
            z->env_hash = interp_env_hash(a->env);
            sbx_set_nonblock(z->fd, true);
            z->w = sbx_loop_watch(a->loop, z->fd, EPOLLIN, zygote_cb, a);
            z->ready_timer = sbx_loop_timer(a->loop, READY_TIMEOUT_MS, zygote_ready_timeout, a);
            in->zyg = z;
        }
    }
    int all[] = {sv[0], sv[1], nul};
    for (size_t i = 0; i < SBX_ARRAY_LEN(all); i++)
        if (all[i] >= 0)
            close(all[i]);
}

/*
 * The fork server is gone or unwanted: kill it (only it: the drivers it
 * forked are its children but belong to contexts; they are reparented to
 * us).  Drivers still waiting for a fork are started directly.  `broken`
 * (it failed before it was ready): this sandbox starts Python drivers
 * directly from now on.
 */
void
interp_zygote_gone(struct agent *a, bool broken)
{
    struct interp *in = IS(a);
    struct zygote *z = in->zyg;
    if (!z)
        return;
    in->zyg = NULL;
    if (broken)
        in->zyg_broken = true;
    kill(z->pid, SIGKILL);
    sbx_loop_unwatch(a->loop, z->w);
    close(z->fd);
    sbx_loop_cancel(a->loop, z->ready_timer);
    free(z);
    for (struct driver *d = in->drivers, *next; d; d = next) {
        next = d->next;
        _cleanup_err_ sbx_err_t err = NULL;
        if (!d->pending)
            continue;
        d->pending = false;
        if (interp_driver_exec(d, NULL, &err) != 0)
            interp_driver_died(d, sbx_err_msg(err));
    }
}

/* ---- starting drivers ---- */

/* A new driver for a context or the pool: a fork of the fork server for a
 * pooled Python driver (the server is started, or replaced when the sandbox
 * environment changed, as needed), else a process of its own with the
 * context's start-time envVars `over`. */
struct driver *
interp_driver_spawn(struct agent *a, int lang, const msgpack_object *over, sbx_err_t *err)
{
    struct interp *in = IS(a);
    int kind = KIND(lang);
    const char *bin, *script;
    if (interp_driver_paths(kind, &bin, &script, err) != 0)
        return NULL;
    if (kind == K_PY)
        interp_seed_mpl_cache();
    struct driver *d = interp_driver_new(a, kind, lang, err);
    if (!d)
        return NULL;
    uint64_t h = interp_env_hash(a->env);
    d->custom = over != NULL;
    d->env_hash = h;
    if (kind == K_PY && !over && !in->zyg_broken) {
        if (in->zyg && in->zyg->env_hash != h)
            interp_zygote_gone(a, false);
        if (!in->zyg)
            zygote_start(a);
        if (in->zyg) {
            d->pending = true;
            zygote_flush(a);
            return d;
        }
    }
    if (interp_driver_exec(d, over, err) != 0) {
        interp_driver_free(d);
        return NULL;
    }
    return d;
}

/* Whether d may serve a new context of `kind` now. */
static bool
warm_usable(const struct driver *d, int kind, uint64_t h)
{
    return !d->ctx && !d->dead && !d->custom && d->kind == kind && d->env_hash == h;
}

/* Drop warm drivers of `kind` whose environment is stale. */
static void
pool_prune(struct agent *a, int kind, uint64_t h)
{
    for (struct driver *d = IS(a)->drivers, *next; d; d = next) {
        next = d->next;
        if (!d->ctx && !d->dead && d->kind == kind && d->env_hash != h) {
            interp_driver_kill(d);
            d->dead = true;
            interp_driver_free(d);
        }
    }
}

/* The best warm driver for `lang`: ready before starting, warmed for the
 * same language before another, older before younger. */
struct driver *
interp_pool_take(struct agent *a, int lang)
{
    int kind = KIND(lang);
    uint64_t h = interp_env_hash(a->env);
    pool_prune(a, kind, h);
    struct driver *best = NULL;
    for (struct driver *d = IS(a)->drivers; d; d = d->next) {
        if (!warm_usable(d, kind, h))
            continue;
        if (!best || (d->ready != best->ready ? d->ready
                      : (d->lang == lang) != (best->lang == lang) ? d->lang == lang
                                                                  : d->spawned_ms < best->spawned_ms))
            best = d;
    }
    return best;
}

/* Start warm drivers until `lang`'s kind has POOL_SIZE of them. */
static void
pool_fill(struct agent *a, int lang)
{
    int kind = KIND(lang), n = 0;
    uint64_t h = interp_env_hash(a->env);
    pool_prune(a, kind, h);
    for (struct driver *d = IS(a)->drivers; d; d = d->next)
        n += warm_usable(d, kind, h);
    while (n++ < POOL_SIZE[kind])
        if (!interp_driver_spawn(a, lang, NULL, NULL))
            break;
}

static void
refill_cb(sbx_loop *l, void *arg)
{
    struct refill *rf = arg;
    (void)l;
    rf->timer = 0;
    pool_fill(rf->a, rf->lang);
}

/*
 * Refill `lang`'s pool after a driver left it: at once when it is empty (a
 * burst of creations waits for this), else REFILL_DELAY_MS later, so that
 * the start (a fork of a 40 MiB process and its warm-up, or a Node start)
 * does not compete for the CPU with the new context's first cells.
 */
void
interp_pool_refill(struct agent *a, int lang)
{
    struct interp *in = IS(a);
    int kind = KIND(lang), n = 0;
    uint64_t h = interp_env_hash(a->env);
    for (struct driver *d = in->drivers; d; d = d->next)
        n += warm_usable(d, kind, h) && d->ready;
    struct refill *rf = &in->refill[kind];
    if (n == 0) {
        sbx_loop_cancel(a->loop, rf->timer);
        rf->timer = 0;
        pool_fill(a, lang);
    } else if (!rf->timer) {
        rf->a = a;
        rf->lang = lang;
        rf->timer = sbx_loop_timer(a->loop, REFILL_DELAY_MS, refill_cb, rf);
    }
}

void
interp_driver_died(struct driver *d, const char *why)
{
    if (d->dead)
        return;
    d->dead = true;
    struct context *c = d->ctx;
    interp_driver_close(d);
    if (!c) {
        interp_driver_free(d);
        return;
    }
    c->dead = true;
    snprintf(c->dead_why, sizeof(c->dead_why),
             "the context's interpreter exited (%s); delete the context and create a new one", why);
    interp_run_finish(c, "dead");
    c->drv = NULL;
    interp_driver_free(d);
    /* Everything queued behind fails the same way. */
    while (c->q_head) {
        struct run *r = c->q_head;
        c->q_head = r->next;
        c->cur = r;
        interp_run_finish(c, "dead");
    }
    c->q_tail = NULL;
}

/* A driver process ended: reaped by us, or by the fork server that forked
 * it (which sends the status). */
static void
driver_exited(struct agent *a, pid_t pid, int status)
{
    for (struct driver *d = IS(a)->drivers; d; d = d->next) {
        if (d->pid != pid)
            continue;
        /* Events already in the pipe come first. */
        if (d->ev_fd >= 0)
            interp_ev_cb(a->loop, d->ev_fd, EPOLLIN, d);
        if (!d->dead) {
            char why[64];
            snprintf(why, sizeof(why), WIFEXITED(status) ? "exit status %d" : "signal %d",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            interp_driver_died(d, why);
        }
        return;
    }
}

bool
agent_interp_reaped(struct agent *a, pid_t pid, int status)
{
    if (!a->interp || pid <= 0)
        return false;
    struct interp *in = IS(a);
    if (in->zyg && in->zyg->pid == pid) {
        interp_zygote_gone(a, !in->zyg->ready);
        return true;
    }
    for (struct driver *d = in->drivers; d; d = d->next)
        if (d->pid == pid) {
            driver_exited(a, pid, status);
            return true;
        }
    return false;
}
