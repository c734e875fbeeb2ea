/*
 * fake_spawn.c — the scripted agents behind container/spawn.h for unit tests
 * (fake_spawn.h says what they answer).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "fake_spawn.h"
#include "runtime/frame.h"
#include "runtime/util.h"
#include "runtime/wire.h"

/* One container: its agent's thread and what it received (under sp->mu). */
struct fagent {
    struct fagent *next;
    sbx_spawner *sp;
    uint64_t serial;
    int fd;              /* the agent's end (owned by the thread) */
    pthread_t th;
    char ops[1024];
};

struct sbx_spawner {
    pthread_mutex_t mu;
    uint64_t next_serial;
    int starts, stops;
    struct fagent *agents; /* every container started, newest first */
};

/* The shard's spawner while one exists: how the test finds it.  Test-double
 * state, written only by sbx_spawner_new/free. */
static pthread_mutex_t cur_mu = PTHREAD_MUTEX_INITIALIZER;
static sbx_spawner *cur;

sbx_spawner *
fake_spawn_current(void)
{
    pthread_mutex_lock(&cur_mu);
    sbx_spawner *sp = cur;
    pthread_mutex_unlock(&cur_mu);
    return sp;
}

int
sbx_spawner_new(sbx_spawner **out, const struct sbx_spawn_conf *conf, char *why, size_t whylen)
{
    (void)conf;
    (void)why;
    (void)whylen;
    sbx_spawner *sp = sbx_xcalloc(1, sizeof(*sp));
    pthread_mutex_init(&sp->mu, NULL);
    pthread_mutex_lock(&cur_mu);
    cur = sp;
    pthread_mutex_unlock(&cur_mu);
    *out = sp;
    return 0;
}

void
sbx_spawner_free(sbx_spawner *sp)
{
    pthread_mutex_lock(&cur_mu);
    if (cur == sp)
        cur = NULL;
    pthread_mutex_unlock(&cur_mu);
    while (sp->agents) {
        struct fagent *a = sp->agents;
        sp->agents = a->next;
        free(a);
    }
    pthread_mutex_destroy(&sp->mu);
    free(sp);
}

static void
note_op(struct fagent *a, sbx_str op)
{
    pthread_mutex_lock(&a->sp->mu);
    size_t n = strlen(a->ops);
    snprintf(a->ops + n, sizeof(a->ops) - n, "%s%.*s", n ? " " : "", (int)op.n, op.p);
    pthread_mutex_unlock(&a->sp->mu);
}

/* Send {t, ok: true, r: {…}} (the caller filled r's fields into e, left open)
 * and consume e. */
static int
send_enc(int fd, sbx_enc *e)
{
    char *buf;
    size_t len;
    if (sbx_enc_finish(e, &buf, &len) != 0)
        return -EINVAL;
    int rc = sbx_frame_send_blocking(fd, buf, len);
    free(buf);
    return rc;
}

static void *
agent_main(void *arg)
{
    struct fagent *a = arg;
    for (;;) {
        char *buf = NULL;
        size_t len = 0;
        if (sbx_frame_recv_blocking(a->fd, SBX_WIRE_MAX_FRAME, &buf, &len) != 0)
            break; /* the shard closed the channel */
        sbx_msg m;
        if (sbx_wire_decode(&m, buf, len, &sbx_wire_limits_request) != 0) {
            free(buf);
            break;
        }
        int64_t tag = 0;
        sbx_str op = {"", 0}, cmd = {"", 0};
        const msgpack_object *args = NULL;
        sbx_wire_get_i64(m.root, "t", &tag);
        sbx_wire_get_str(m.root, "op", &op);
        if (sbx_wire_get_map(m.root, "a", &args) == 0)
            sbx_wire_get_str(args, "command", &cmd);
        note_op(a, op);
        bool die = false, answer = tag > 0;
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kint(&e, "t", tag);
        if (sbx_str_eq(op, "exec") && sbx_str_eq(cmd, "die")) {
            die = true;
        } else if (sbx_str_eq(op, "exec") && sbx_str_eq(cmd, "hang")) {
            answer = false;
        } else if (sbx_str_eq(op, "exec") && cmd.n > 6 && !memcmp(cmd.p, "sleep:", 6)) {
            char ms[16];
            snprintf(ms, sizeof(ms), "%.*s", (int)SBX_MIN(cmd.n - 6, sizeof(ms) - 1), cmd.p + 6);
            struct timespec ts = {atoi(ms) / 1000, (long)(atoi(ms) % 1000) * 1000000L};
            nanosleep(&ts, NULL);
            sbx_enc_kbool(&e, "ok", true);
            sbx_enc_kmap(&e, "r");
            sbx_enc_kint(&e, "exitCode", 0);
            sbx_enc_kstrn(&e, "stdout", cmd.p, cmd.n);
            sbx_enc_kint(&e, "agent", (int64_t)a->serial);
            sbx_enc_end(&e);
        } else if (sbx_str_eq(op, "exec") && sbx_str_eq(cmd, "busy")) {
            sbx_enc_kbool(&e, "ok", false);
            sbx_enc_kmap(&e, "e");
            sbx_enc_kstr(&e, "code", "RESOURCE_BUSY");
            sbx_enc_kstr(&e, "message", "a process with ID 'x' already exists");
            sbx_enc_end(&e);
        } else if (sbx_str_eq(op, "exec") && sbx_str_eq(cmd, "fail")) {
            sbx_enc_kbool(&e, "ok", false);
            sbx_enc_kmap(&e, "e");
            sbx_enc_kstr(&e, "code", "FILE_NOT_FOUND");
            sbx_enc_kstr(&e, "message", "no such file: /nope");
            sbx_enc_kmap(&e, "context");
            sbx_enc_kstr(&e, "path", "/nope");
            sbx_enc_end(&e);
            sbx_enc_end(&e);
        } else {
            sbx_enc_kbool(&e, "ok", true);
            sbx_enc_kmap(&e, "r");
            if (sbx_str_eq(op, "exec")) {
                sbx_enc_kint(&e, "exitCode", 0);
                sbx_enc_kstrn(&e, "stdout", cmd.p, cmd.n);
            } else {
                sbx_enc_kstrn(&e, "op", op.p, op.n);
            }
            sbx_enc_kint(&e, "agent", (int64_t)a->serial);
            sbx_enc_end(&e);
        }
        sbx_enc_end(&e);
        sbx_wire_msg_free(&m);
        free(buf);
        if (die) {
            sbx_enc_free(&e);
            break;
        }
        if (!answer) {
            sbx_enc_free(&e);
            continue;
        }
        if (send_enc(a->fd, &e) != 0)
            break;
    }
    /* A crashed agent's end goes away at once; a stopped one's too. */
    shutdown(a->fd, SHUT_RDWR);
    return NULL;
}

int
sbx_container_start(sbx_spawner *sp, const struct sbx_limits *lim, struct sbx_container *c,
                    char *why, size_t whylen)
{
    (void)lim;
    int sv[2];
    memset(c, 0, sizeof(*c));
    c->chan = c->pidfd = -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
        snprintf(why, whylen, "socketpair: %s", strerror(errno));
        return -errno;
    }
    struct fagent *a = sbx_xcalloc(1, sizeof(*a));
    a->sp = sp;
    a->fd = sv[1];
    pthread_mutex_lock(&sp->mu);
    a->serial = ++sp->next_serial;
    sp->starts++;
    a->next = sp->agents;
    sp->agents = a;
    pthread_mutex_unlock(&sp->mu);
    if (pthread_create(&a->th, NULL, agent_main, a) != 0) {
        snprintf(why, whylen, "pthread_create failed");
        close(sv[0]);
        close(sv[1]);
        a->fd = -1;
        return -EAGAIN;
    }
    c->serial = a->serial;
    c->pid = getpid(); /* no process of its own: a live container has a pid */
    c->chan = sv[0];
    c->uid = 1000;
    c->start_us = 1;
    return 0;
}

/* Image sandboxes are not scripted here: a fake container like the others. */
int
sbx_container_start_image(sbx_spawner *sp, const struct sbx_limits *lim,
                          const struct sbx_image_root *img, struct sbx_container *c, char *why,
                          size_t whylen)
{
    (void)img;
    return sbx_container_start(sp, lim, c, why, whylen);
}

/* Persistent workspaces neither: the mount is closed, the container fake. */
int
sbx_container_start_ws(sbx_spawner *sp, const struct sbx_limits *lim,
                       const struct sbx_image_root *img, int ws_fd, struct sbx_container *c,
                       char *why, size_t whylen)
{
    (void)img;
    close(ws_fd);
    return sbx_container_start(sp, lim, c, why, whylen);
}

void
sbx_container_stop(sbx_spawner *sp, struct sbx_container *c)
{
    if (c->pid <= 0)
        return; /* zeroed or stopped */
    if (c->chan >= 0)
        close(c->chan); /* the agent reads EOF and ends */
    pthread_mutex_lock(&sp->mu);
    struct fagent *a = sp->agents;
    while (a && a->serial != c->serial)
        a = a->next;
    sp->stops++;
    pthread_mutex_unlock(&sp->mu);
    if (a && a->fd >= 0) {
        pthread_join(a->th, NULL);
        close(a->fd);
        a->fd = -1;
    }
    c->pid = 0;
    c->chan = -1;
}

void
sbx_container_kill(const struct sbx_container *c)
{
    (void)c; /* a scripted agent ends when sbx_container_stop closes its channel */
}

int
sbx_container_stats(sbx_spawner *sp, struct sbx_container *c, struct sbx_cgroup_stats *st)
{
    (void)sp;
    (void)c;
    (void)st;
    return -ENOSYS;
}

int
sbx_container_limit_hits(sbx_spawner *sp, struct sbx_container *c, struct sbx_cgroup_stats *st)
{
    return sbx_container_stats(sp, c, st);
}

int
sbx_container_set_limits(sbx_spawner *sp, struct sbx_container *c, const struct sbx_limits *lim)
{
    (void)sp;
    (void)c;
    (void)lim;
    return 0;
}

int
fake_spawn_starts(sbx_spawner *sp)
{
    pthread_mutex_lock(&sp->mu);
    int n = sp->starts;
    pthread_mutex_unlock(&sp->mu);
    return n;
}

int
fake_spawn_stops(sbx_spawner *sp)
{
    pthread_mutex_lock(&sp->mu);
    int n = sp->stops;
    pthread_mutex_unlock(&sp->mu);
    return n;
}

bool
fake_spawn_ops(sbx_spawner *sp, int n, char *buf, size_t len)
{
    bool found = false;
    pthread_mutex_lock(&sp->mu);
    for (struct fagent *a = sp->agents; a; a = a->next) {
        if (a->serial == (uint64_t)n) {
            snprintf(buf, len, "%s", a->ops);
            found = true;
        }
    }
    pthread_mutex_unlock(&sp->mu);
    return found;
}
