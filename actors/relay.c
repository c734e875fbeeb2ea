/*
 * relay.c — the shard's preview relay (the server side of runtime/relay.h).
 *
 * One accept thread; one thread per relayed connection (preview traffic is
 * interactive and low in count; a thread keeps each relay a plain blocking
 * copy).  For each connection:
 *
 *   1. the SOCKS5 handshake (RFC 1928/1929, runtime/relay.h; 5 s): the
 *      secret, checked in constant time, then CONNECT "<generation>.<id>":port;
 *   2. ask the loop thread, which owns the actors: is this sandbox's
 *      container running at that generation with that port exposed?  If so
 *      take a duplicate of its pidfd and count the relay on the actor (a
 *      sandbox with open relays is not put to sleep);
 *   3. create a socket inside the container's network namespace
 *      (setns(pidfd, CLONE_NEWNET) on this thread only, setns(2) — a socket
 *      keeps the namespace it was created in), return to the host namespace
 *      and connect it to 127.0.0.1:<port>;
 *   4. answer success and copy bytes both ways (runtime/relay.c) until both sides
 *      close or 10 minutes pass without traffic;
 *   5. tell the loop thread the relay ended (activity for sleepAfter).
 *
 * Shutdown closes the listener and shuts down every relayed socket, then
 * waits for the threads.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/relay.h"
#include "../runtime/util.h"
#include "relay_int.h"
#include "shard_int.h"

#define RELAY_IDLE_MS (10 * 60 * 1000)
#define RELAY_MAX_CONNS 1024
/* Relayed connections into one sandbox at most (issue 16 item 4): one
 * tenant's previews cannot take all RELAY_MAX_CONNS of the shard.  Beyond,
 * the handshake fails (the gateway answers 503). */
#define RELAY_PER_SANDBOX 128

static void
rquery_unref(struct shard_relay_query *q)
{
    struct shard *sh = q->sh;
    pthread_mutex_lock(&sh->relay.mu);
    bool last = --q->refs == 0;
    pthread_mutex_unlock(&sh->relay.mu);
    if (last) {
        if (q->pidfd >= 0)
            close(q->pidfd);
        free(q);
    }
}

/* Loop thread: answer a query (or note the end of a relay). */
static void
rquery_cb(sbx_loop *l, void *arg)
{
    struct shard_relay_query *q = arg;
    struct shard *sh = q->sh;
    (void)l;
    pthread_mutex_lock(&sh->relay.mu);
    bool abandoned = q->abandoned;
    pthread_mutex_unlock(&sh->relay.mu);
    struct actor *a = abandoned ? NULL : actor_get(sh, q->id, false);
    int rc = 0;
    char why[160] = "";
    int pidfd = -1;
    if (abandoned) {
        rc = SBX_E_SHARD_UNAVAILABLE;
    } else if (q->end) {
        if (a) {
            if (a->relays > 0)
                a->relays--;
            a->last_active_ms = sbx_wall_ms();
        }
    } else if (!a || a->cs != C_RUNNING || a->rec.generation != q->gen) {
        rc = SBX_E_STALE_PREVIEW;
        snprintf(why, sizeof(why), "the sandbox's container is not the one the URL was issued for");
    } else if (!actor_port_exposed(a, q->port)) {
        rc = SBX_E_INVALID_TOKEN;
        snprintf(why, sizeof(why), "port %d is not exposed", q->port);
    } else if (a->relays >= RELAY_PER_SANDBOX) {
        rc = SBX_E_BUSY;
        snprintf(why, sizeof(why), "%d preview connections are open into the sandbox",
                 a->relays);
    } else {
        pidfd = fcntl(a->c.pidfd, F_DUPFD_CLOEXEC, 0);
        if (pidfd < 0) {
            rc = SBX_E_INTERNAL;
            snprintf(why, sizeof(why), "cannot reference the container: %s", strerror(errno));
        } else {
            a->relays++;
            a->last_active_ms = sbx_wall_ms();
        }
    }
    pthread_mutex_lock(&sh->relay.mu);
    q->rc = rc;
    snprintf(q->why, sizeof(q->why), "%s", why);
    q->pidfd = pidfd;
    q->done = true;
    pthread_cond_broadcast(&sh->relay.cv);
    pthread_mutex_unlock(&sh->relay.mu);
    rquery_unref(q);
}

/* Ask the loop thread; waits at most 5 s.  The query is released by the
 * caller (rquery_unref). */
static struct shard_relay_query *
rquery_ask(struct shard *sh, const char *id, int port, uint64_t gen, bool end)
{
    struct shard_relay_query *q = sbx_xcalloc(1, sizeof(*q));
    q->sh = sh;
    snprintf(q->id, sizeof(q->id), "%s", id);
    q->port = port;
    q->gen = gen;
    q->end = end;
    q->pidfd = -1;
    q->refs = 2;
    q->rc = SBX_E_SHARD_UNAVAILABLE;
    snprintf(q->why, sizeof(q->why), "the shard did not answer");
    sbx_loop_post(sh->loop, rquery_cb, q);
    if (end)
        return q;
    pthread_mutex_lock(&sh->relay.mu);
    int64_t deadline = sbx_mono_ms() + 5000;
    while (!q->done && sbx_mono_ms() < deadline) {
        sbx_cond_wait_ms(&sh->relay.cv, &sh->relay.mu, 100);
    }
    if (!q->done)
        q->abandoned = true;
    pthread_mutex_unlock(&sh->relay.mu);
    return q;
}

/* A TCP socket created in the network namespace of pidfd's process. */
static int
socket_in_netns(int pidfd)
{
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        return -errno;
    int fd = -1, rc = 0;
    if (setns(pidfd, CLONE_NEWNET) < 0) {
        rc = -errno;
        goto out;
    }
    fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        rc = -errno;
    if (setns(self, CLONE_NEWNET) < 0) {
        /* This thread cannot go back: it must not serve anything else. */
        sbx_log_error("relay: cannot return to the host network namespace: %s", strerror(errno));
        abort();
    }
out:
    close(self);
    return fd >= 0 ? fd : rc;
}

static int
connect_timeout(int fd, int port, int ms)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                              .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) == 0)
        return 0;
    if (errno != EINPROGRESS)
        return -errno;
    struct pollfd p = {fd, POLLOUT, 0};
    int n = poll(&p, 1, ms);
    if (n <= 0)
        return n == 0 ? -ETIMEDOUT : -errno;
    int err = 0;
    socklen_t el = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
    return err ? -err : 0;
}

/* got: the password's gn bytes as sent (a NUL in them is not an end). */
static bool
secret_ok(const char *want, const char *got, size_t gn)
{
    if (!want || !*want)
        return true;
    size_t wn = strlen(want);
    unsigned char diff = (unsigned char)(wn != gn);
    for (size_t i = 0; i < wn; i++)
        diff |= (unsigned char)(want[i] ^ (i < gn ? got[i] : 0));
    return diff == 0;
}

/* Read exactly n bytes before the deadline; 0 or -1. */
static int
read_n(int fd, unsigned char *buf, size_t n, int64_t deadline)
{
    size_t got = 0;
    while (got < n) {
        int left = (int)(deadline - sbx_mono_ms());
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0)
            return -1;
        ssize_t r = read(fd, buf + got, n - got);
        if (r <= 0)
            return -1;
        got += (size_t)r;
    }
    return 0;
}

static void
socks_reply(int fd, int rep)
{
    unsigned char b[10] = {5, (unsigned char)rep, 0, 1, 0, 0, 0, 0, 0, 0};
    send(fd, b, sizeof(b), MSG_NOSIGNAL);
}

static int
socks_rep_of(int code)
{
    switch (code) {
    case SBX_E_STALE_PREVIEW: return SBX_SOCKS_HOST_UNREACHABLE;
    case SBX_E_INVALID_TOKEN: return SBX_SOCKS_NOT_ALLOWED;
    default: return SBX_SOCKS_FAIL;
    }
}

void *
shard_relay_conn_main(void *arg)
{
    struct shard_relay_conn *c = arg;
    struct shard *sh = c->sh;
    unsigned char b[512];
    int64_t deadline = sbx_mono_ms() + 5000;
    bool counted = false;
    char id[64] = "";
    int port = 0;
    unsigned long long gen = 0;
    /* 1. greeting: username/password is the only method offered back */
    if (read_n(c->fd, b, 2, deadline) || b[0] != 5 || b[1] == 0 ||
        read_n(c->fd, b + 2, b[1], deadline))
        goto done;
    bool has_up = memchr(b + 2, 2, b[1]) != NULL;
    unsigned char m[2] = {5, has_up ? 2 : 0xff};
    send(c->fd, m, 2, MSG_NOSIGNAL);
    if (!has_up)
        goto done;
    /* RFC 1929: VER ULEN UNAME PLEN PASSWD */
    char pw[256];
    if (read_n(c->fd, b, 2, deadline) || b[0] != 1 || read_n(c->fd, b + 2, b[1] + 1u, deadline))
        goto done;
    size_t ul = b[1], plen = b[2 + ul];
    if (read_n(c->fd, (unsigned char *)pw, plen, deadline))
        goto done;
    pw[plen] = 0;
    bool ok = secret_ok(sh->conf.relay_secret, pw, plen);
    unsigned char ar[2] = {1, ok ? 0 : 1};
    send(c->fd, ar, 2, MSG_NOSIGNAL);
    if (!ok)
        goto done;
    /* request: VER CMD RSV ATYP=3 LEN DOMAIN PORT */
    if (read_n(c->fd, b, 5, deadline) || b[0] != 5)
        goto done;
    if (b[1] != 1 || b[3] != 3) {
        socks_reply(c->fd, 7); /* command / address type not supported */
        goto done;
    }
    size_t dl = b[4];
    char host[256];
    if (read_n(c->fd, (unsigned char *)host, dl, deadline) || read_n(c->fd, b, 2, deadline))
        goto done;
    host[dl] = 0;
    port = (b[0] << 8) | b[1];
    /* "<generation>.<id>" exactly: decimal digits (strtoull alone takes
     * blanks, a sign, and saturates), a dot, a sandbox ID (the dl bytes as
     * sent: a NUL in them is refused, not an end). */
    char *dot = memchr(host, '.', dl), *end = NULL, why[160];
    size_t gl = dot ? (size_t)(dot - host) : 0, il = dot ? dl - gl - 1 : 0;
    errno = 0;
    gen = gl && strspn(host, "0123456789") == gl ? strtoull(host, &end, 10) : 0;
    if (!end || end != dot || errno || port < 1 || il >= sizeof(id) ||
        sbx_id_check(dot + 1, il, why, sizeof(why)) != 0) {
        socks_reply(c->fd, SBX_SOCKS_FAIL);
        goto done;
    }
    memcpy(id, dot + 1, il);
    id[il] = 0;
    /* 2. the loop thread's view of the sandbox */
    struct shard_relay_query *q = rquery_ask(sh, id, port, gen, false);
    pthread_mutex_lock(&sh->relay.mu);
    int rc = q->rc;
    int pidfd = q->pidfd;
    q->pidfd = -1;
    pthread_mutex_unlock(&sh->relay.mu);
    rquery_unref(q);
    if (rc) {
        socks_reply(c->fd, socks_rep_of(rc));
        goto done;
    }
    counted = true;
    /* 3. a socket in the sandbox's network, connected to the port */
    int up = socket_in_netns(pidfd);
    close(pidfd);
    if (up < 0) {
        sbx_log_warn("relay: cannot enter the network of sandbox %s: %s", id, strerror(-up));
        socks_reply(c->fd, SBX_SOCKS_FAIL);
        goto done;
    }
    pthread_mutex_lock(&sh->relay.mu);
    c->up = up;
    pthread_mutex_unlock(&sh->relay.mu);
    rc = connect_timeout(up, port, 5000);
    if (rc) {
        socks_reply(c->fd, rc == -ECONNREFUSED ? SBX_SOCKS_REFUSED : SBX_SOCKS_FAIL);
        goto done;
    }
    int fl = fcntl(up, F_GETFL);
    fcntl(up, F_SETFL, fl & ~O_NONBLOCK);
    socks_reply(c->fd, SBX_SOCKS_OK);
    /* 4. bytes both ways */
    sbx_relay_pump(c->fd, up, NULL, 0, RELAY_IDLE_MS);
done:
    if (counted)
        rquery_unref(rquery_ask(sh, id, 0, 0, true));
    pthread_mutex_lock(&sh->relay.mu);
    for (struct shard_relay_conn **pp = &sh->relay.conns; *pp; pp = &(*pp)->next)
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    sh->relay.nconns--;
    pthread_cond_broadcast(&sh->relay.cv);
    pthread_mutex_unlock(&sh->relay.mu);
    if (c->up >= 0)
        close(c->up);
    close(c->fd);
    free(c);
    return NULL;
}

static void *
accept_main(void *arg)
{
    struct shard *sh = arg;
    for (;;) {
        struct pollfd p[2] = {{sh->relay.fd, POLLIN, 0}, {sh->relay.stopfd, POLLIN, 0}};
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents)
            break;
        int fd = accept4(sh->relay.fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&sh->relay.mu);
        if (sh->relay.nconns >= RELAY_MAX_CONNS) {
            pthread_mutex_unlock(&sh->relay.mu);
            close(fd); /* too many preview connections on this shard */
            continue;
        }
        struct shard_relay_conn *c = sbx_xcalloc(1, sizeof(*c));
        c->sh = sh;
        c->fd = fd;
        c->up = -1;
        c->next = sh->relay.conns;
        sh->relay.conns = c;
        sh->relay.nconns++;
        pthread_mutex_unlock(&sh->relay.mu);
        pthread_t t;
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 * 1024);
        if (pthread_create(&t, &at, shard_relay_conn_main, c) != 0) {
            pthread_mutex_lock(&sh->relay.mu);
            sh->relay.conns = c->next;
            sh->relay.nconns--;
            pthread_mutex_unlock(&sh->relay.mu);
            close(fd);
            free(c);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

int
shard_relay_start(struct shard *sh)
{
    if (!sh->conf.relay || !*sh->conf.relay)
        return 0;
    int fd = sbx_relay_listen(sh->conf.relay);
    if (fd < 0) {
        sbx_log_error("shard %s: cannot listen for preview relays on %s: %s", sh->conf.name,
                  sh->conf.relay, strerror(-fd));
        return fd;
    }
    sh->relay.fd = fd;
    sh->relay.stopfd = eventfd(0, EFD_CLOEXEC);
    if (pthread_create(&sh->relay.thread, NULL, accept_main, sh) != 0) {
        close(sh->relay.fd);
        close(sh->relay.stopfd);
        sh->relay.fd = sh->relay.stopfd = -1;
        return -EAGAIN;
    }
    sh->relay.running = true;
    return 0;
}

void
shard_relay_stop(struct shard *sh)
{
    if (sh->relay.running) {
        uint64_t one = 1;
        ssize_t w = write(sh->relay.stopfd, &one, sizeof(one));
        (void)w;
        pthread_join(sh->relay.thread, NULL);
        sh->relay.running = false;
    }
    /* End every relay: their pumps see EOF and the threads exit. */
    pthread_mutex_lock(&sh->relay.mu);
    for (struct shard_relay_conn *c = sh->relay.conns; c; c = c->next) {
        shutdown(c->fd, SHUT_RDWR);
        if (c->up >= 0)
            shutdown(c->up, SHUT_RDWR);
    }
    int64_t deadline = sbx_mono_ms() + 5000;
    while (sh->relay.nconns > 0 && sbx_mono_ms() < deadline) {
        sbx_cond_wait_ms(&sh->relay.cv, &sh->relay.mu, 50);
    }
    pthread_mutex_unlock(&sh->relay.mu);
    if (sh->relay.fd >= 0)
        close(sh->relay.fd);
    if (sh->relay.stopfd >= 0)
        close(sh->relay.stopfd);
    sh->relay.fd = sh->relay.stopfd = -1;
}
