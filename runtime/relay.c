/* relay.c — see relay.h. */
#include "relay.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "err.h"
#include "util.h"

/* Resolve "unix:/p" or "tcp:host:port" into a socket address. */
static int
relay_addr(const char *addr, struct sockaddr_storage *ss, socklen_t *sl)
{
    memset(ss, 0, sizeof(*ss));
    if (!strncmp(addr, "unix:", 5)) {
        struct sockaddr_un *u = (struct sockaddr_un *)ss;
        if (strlen(addr + 5) >= sizeof(u->sun_path) || !addr[5])
            return -ENAMETOOLONG;
        u->sun_family = AF_UNIX;
        strcpy(u->sun_path, addr + 5);
        *sl = sizeof(*u);
        return 0;
    }
    if (strncmp(addr, "tcp:", 4))
        return -EINVAL;
    char host[256];
    const char *colon = strrchr(addr + 4, ':');
    if (!colon || (size_t)(colon - (addr + 4)) >= sizeof(host))
        return -EINVAL;
    memcpy(host, addr + 4, (size_t)(colon - (addr + 4)));
    host[colon - (addr + 4)] = 0;
    if (host[0] == '[') {
        memmove(host, host + 1, strlen(host));
        host[strcspn(host, "]")] = 0;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res;
    if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
        return -EINVAL;
    memcpy(ss, res->ai_addr, res->ai_addrlen);
    *sl = res->ai_addrlen;
    freeaddrinfo(res);
    return 0;
}

int
sbx_relay_listen(const char *addr)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int rc = relay_addr(addr, &ss, &sl);
    if (rc)
        return rc;
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    if (ss.ss_family == AF_UNIX) {
        unlink(((struct sockaddr_un *)&ss)->sun_path);
    } else {
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    }
    if (bind(fd, (struct sockaddr *)&ss, sl) < 0 || listen(fd, 256) < 0) {
        rc = -errno;
        close(fd);
        return rc;
    }
    if (ss.ss_family == AF_UNIX)
        chmod(((struct sockaddr_un *)&ss)->sun_path, 0600);
    return fd;
}

/* Wait for fd to be ready for events until the deadline; 0 or -ETIMEDOUT. */
static int
wait_fd(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - sbx_mono_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, (int)left);
        if (n > 0)
            return 0;
        if (n < 0 && errno != EINTR)
            return -errno;
    }
}

void
sbx_relay_proxy_url(const char *addr, char *out, size_t outlen)
{
    if (!strncmp(addr, "unix:", 5))
        snprintf(out, outlen, "socks5h://localhost%s", addr + 5);
    else if (!strncmp(addr, "tcp:", 4))
        snprintf(out, outlen, "socks5h://%s", addr + 4);
    else
        snprintf(out, outlen, "%s", addr);
}

/* Exactly n bytes, before the deadline; 0 or a negative errno. */
static int
io_full(int fd, void *buf, size_t n, bool wr, int64_t deadline)
{
    size_t off = 0;
    while (off < n) {
        ssize_t r = wr ? send(fd, (char *)buf + off, n - off, MSG_NOSIGNAL)
                       : recv(fd, (char *)buf + off, n - off, 0);
        if (r > 0) {
            off += (size_t)r;
            continue;
        }
        if (r == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN)
            return -errno;
        int rc = wait_fd(fd, wr ? POLLOUT : POLLIN, deadline);
        if (rc)
            return rc;
    }
    return 0;
}

int
sbx_relay_connect(const char *addr, const char *secret, const char *sandbox, int port,
                  uint64_t generation, int timeout_ms, char code[64], char *msg, size_t msglen)
{
    struct sockaddr_storage ss;
    socklen_t sl;
    int64_t deadline = sbx_mono_ms() + timeout_ms;
    int fd = -1, rc = relay_addr(addr, &ss, &sl);
    snprintf(code, 64, "SHARD_UNAVAILABLE");
    if (rc) {
        snprintf(msg, msglen, "the shard's relay address '%s' is invalid", addr);
        return SBX_E_SHARD_UNAVAILABLE;
    }
    fd = socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        goto io_err;
    if (connect(fd, (struct sockaddr *)&ss, sl) < 0) {
        if (errno != EINPROGRESS)
            goto io_err;
        if ((rc = wait_fd(fd, POLLOUT, deadline)) != 0) {
            errno = -rc;
            goto io_err;
        }
        int err = 0;
        socklen_t el = sizeof(err);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el);
        if (err) {
            errno = err;
            goto io_err;
        }
    }
    if (ss.ss_family != AF_UNIX) {
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    }
    /* RFC 1928 §3: greeting, offering username/password (RFC 1929). */
    unsigned char b[600];
    b[0] = 5;
    b[1] = 1;
    b[2] = 2;
    if ((rc = io_full(fd, b, 3, true, deadline)) || (rc = io_full(fd, b, 2, false, deadline))) {
        errno = -rc;
        goto io_err;
    }
    if (b[0] != 5 || b[1] != 2) {
        errno = EPROTO;
        goto io_err;
    }
    const char *pw = secret && *secret ? secret : "-";
    size_t pl = strlen(pw);
    if (pl > 255)
        pl = 255;
    b[0] = 1;
    b[1] = 3;
    memcpy(b + 2, "sbx", 3);
    b[5] = (unsigned char)pl;
    memcpy(b + 6, pw, pl);
    if ((rc = io_full(fd, b, 6 + pl, true, deadline)) || (rc = io_full(fd, b, 2, false, deadline))) {
        errno = -rc;
        goto io_err;
    }
    if (b[1] != 0) {
        snprintf(code, 64, "UNAUTHORIZED");
        snprintf(msg, msglen, "the shard's relay refused the relay secret");
        close(fd);
        return SBX_E_UNAUTHORIZED;
    }
    /* §4: CONNECT to the domain "<generation>.<sandbox>". */
    char host[256];
    int hl = snprintf(host, sizeof(host), "%llu.%s", (unsigned long long)generation, sandbox);
    if (hl <= 0 || hl > 255) {
        snprintf(msg, msglen, "the sandbox ID is too long for a relay request");
        close(fd);
        return SBX_E_VALIDATION;
    }
    b[0] = 5;
    b[1] = 1;
    b[2] = 0;
    b[3] = 3;
    b[4] = (unsigned char)hl;
    memcpy(b + 5, host, (size_t)hl);
    b[5 + hl] = (unsigned char)(port >> 8);
    b[6 + hl] = (unsigned char)port;
    if ((rc = io_full(fd, b, 7 + (size_t)hl, true, deadline)) ||
        (rc = io_full(fd, b, 10, false, deadline))) {
        errno = -rc;
        goto io_err;
    }
    if (b[1] != SBX_SOCKS_OK) {
        int c = b[1] == SBX_SOCKS_HOST_UNREACHABLE ? SBX_E_STALE_PREVIEW
                : b[1] == SBX_SOCKS_REFUSED        ? SBX_E_SERVICE_NOT_RESPONDING
                : b[1] == SBX_SOCKS_NOT_ALLOWED    ? SBX_E_UNAUTHORIZED
                                                   : SBX_E_SHARD_UNAVAILABLE;
        snprintf(code, 64, "%s", sbx_err_name(c));
        if (c == SBX_E_SERVICE_NOT_RESPONDING)
            snprintf(msg, msglen, "nothing is listening on port %d in the sandbox (yet)", port);
        else if (c == SBX_E_STALE_PREVIEW)
            snprintf(msg, msglen, "Preview URL is stale because the sandbox runtime is not active");
        else
            snprintf(msg, msglen, "the shard's relay could not connect (SOCKS reply %d)", b[1]);
        close(fd);
        return c;
    }
    /* Blocking from here on: the callers relay with poll(2). */
    int fl = fcntl(fd, F_GETFL);
    fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
    return fd;
io_err:
    snprintf(msg, msglen, "cannot reach the shard's relay at %s: %s", addr, strerror(errno));
    if (fd >= 0)
        close(fd);
    return SBX_E_SHARD_UNAVAILABLE;
}

/* One direction of a pump: a buffer from src to dst. */
struct dir {
    int src, dst;
    char buf[65536];
    size_t off, len;
    bool eof;  /* src ended */
    bool shut; /* dst has been shut down for writing */
};

int
sbx_relay_pump(int a, int b, const char *pre, size_t npre, int64_t idle_ms)
{
    struct dir *d = sbx_xcalloc(2, sizeof(*d));
    d[0].src = a;
    d[0].dst = b;
    d[1].src = b;
    d[1].dst = a;
    int rc = 0;
    /* Every send is MSG_DONTWAIT (the fds may be blocking): a blocking send
     * of a whole buffer waits until all of it fits, so a peer that accepts
     * and never reads (a stalled or hostile service in a sandbox) held the
     * thread for ever and idle_ms was never checked again. */
    int64_t last = sbx_mono_ms();
    for (size_t off = 0; off < npre;) {
        ssize_t w = send(b, pre + off, npre - off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && errno == EAGAIN) {
            int64_t left = idle_ms > 0 ? idle_ms - (sbx_mono_ms() - last) : 1 << 30;
            if (left <= 0) {
                rc = -ETIMEDOUT;
                goto out;
            }
            struct pollfd p = {b, POLLOUT, 0};
            poll(&p, 1, (int)SBX_MIN(left, 1 << 30));
            continue;
        }
        if (w <= 0) {
            rc = w < 0 ? -errno : -EPIPE;
            goto out;
        }
        off += (size_t)w;
        last = sbx_mono_ms();
    }
    while (!(d[0].shut && d[1].shut)) {
        struct pollfd p[4];
        int np = 0, idx[4];
        for (int i = 0; i < 2; i++) {
            if (d[i].len == d[i].off && !d[i].eof) {
                p[np] = (struct pollfd){d[i].src, POLLIN, 0};
                idx[np++] = i;
            } else if (d[i].len > d[i].off) {
                p[np] = (struct pollfd){d[i].dst, POLLOUT, 0};
                idx[np++] = 2 + i;
            }
        }
        if (np == 0)
            break;
        int timeout = -1;
        if (idle_ms > 0) {
            int64_t left = idle_ms - (sbx_mono_ms() - last);
            if (left <= 0) {
                rc = -ETIMEDOUT;
                break;
            }
            timeout = (int)SBX_MIN(left, 1 << 30);
        }
        int n = poll(p, (nfds_t)np, timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            break;
        }
        if (n == 0)
            continue;
        for (int k = 0; k < np; k++) {
            if (!p[k].revents)
                continue;
            struct dir *x = &d[idx[k] % 2];
            if (idx[k] < 2) {
                ssize_t r = read(x->src, x->buf, sizeof(x->buf));
                if (r < 0 && (errno == EINTR || errno == EAGAIN))
                    continue;
                if (r <= 0) {
                    x->eof = true;
                } else {
                    x->off = 0;
                    x->len = (size_t)r;
                    last = sbx_mono_ms();
                }
            } else {
                ssize_t w = send(x->dst, x->buf + x->off, x->len - x->off,
                                 MSG_NOSIGNAL | MSG_DONTWAIT);
                if (w < 0 && (errno == EINTR || errno == EAGAIN))
                    continue;
                if (w <= 0) {
                    /* The reader went away: this direction is over. */
                    x->eof = true;
                    x->off = x->len = 0;
                } else {
                    x->off += (size_t)w;
                    last = sbx_mono_ms();
                    if (x->off == x->len)
                        x->off = x->len = 0;
                }
            }
        }
        for (int i = 0; i < 2; i++) {
            if (d[i].eof && d[i].len == d[i].off && !d[i].shut) {
                shutdown(d[i].dst, SHUT_WR);
                d[i].shut = true;
            }
        }
    }
out:
    free(d);
    return rc;
}
