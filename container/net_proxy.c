/*
 * net_proxy.c — credentials stay outside: the deployment's injection rules
 * and the proxy that adds their headers to a sandbox's plain-HTTP requests
 * at the egress point (net_int.h; docs/network.md §Credentials stay
 * outside).
 *
 * The path of a connection: the sandbox resolves a rule's host through its
 * resolver (net_dns.c), which — when the policy lets the sandbox reach that
 * host on the rule's port — puts each answered address with the port in
 * set ij<k>; the router's nat prerouting chain pr<k> sends the sandbox's
 * new TCP connections to those pairs to SBX_NET_RESOLVER:80, this proxy,
 * after the always-denied and private ranges and the deny rules (which
 * leave it to the forward chain, which refuses).  The proxy:
 *
 *  1. reads the request head (at most SBX_HTTP_HEAD_MAX bytes, 10 s) and
 *     parses it strictly (net_http.c); not HTTP: 400, the connection ends;
 *  2. when its Host (one, no port or the connection's) is a rule's host for
 *     the connection's original port, takes out every copy of the rules'
 *     field names the sandbox sent, and adds the rules' values — only if
 *     the sandbox's resolver answered that host with the connection's
 *     original address (a sandbox cannot aim a Host at an address it got
 *     for another name and take the header there), and only for an
 *     origin-form target ("/path": an absolute URI names its own host);
 *     with "Connection: close", so the connection carries one request;
 *  3. connects to the original address and port from the router's netns
 *     (the same route and masquerade as the sandbox's own traffic; its
 *     packets in class 1:<k> of the uplink's htb, the sandbox's bandwidth
 *     limit) and relays both ways until both ends have closed.
 *
 * One thread per connection, at most CONNS_MAX at once (PER_SLOT_MAX per
 * sandbox); more are closed at accept.  The value of a rule is in this
 * process's memory and the file only: never logged, never in argv.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "net.h"
#include "net_int.h"

#define SLOTS 512
#define CONNS_MAX 256
#define PER_SLOT_MAX 64
#define HEAD_MS 10000      /* the request head must arrive within this */
#define CONNECT_MS 10000   /* connecting to the original address */
#define IDLE_MS 300000     /* a relayed connection with no byte either way this long ends */
#define INJECT_FILE_MAX (1 << 20)

/* ------------------------------------------------------------------------------ */
/* The rules. */

void
sbx_inject_free(struct sbx_inject_set *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n; i++)
        if (s->r[i].value) {
            explicit_bzero(s->r[i].value, strlen(s->r[i].value));
            free(s->r[i].value);
        }
    free(s);
}

static bool
is_tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* One line "HOST[:PORT] Name: value" into r; 0 or a reason in why. */
static int
parse_line(char *line, struct sbx_inject *r, char *why, size_t whylen)
{
    char *sp = line + strcspn(line, " \t");
    if (!*sp) {
        snprintf(why, whylen, "expected HOST[:PORT] Name: value");
        return SBX_E_VALIDATION;
    }
    *sp++ = '\0';
    char nwhy[256];
    int rc = sbx_net_name_parse(line, false, &r->host, nwhy, sizeof(nwhy));
    if (rc != 0) {
        snprintf(why, whylen, "%s", rc == 1 ? "the host must be a name (example.org or "
                                              "*.example.org), not an address" : nwhy);
        return SBX_E_VALIDATION;
    }
    sp += strspn(sp, " \t");
    char *colon = strchr(sp, ':');
    size_t nl = colon ? (size_t)(colon - sp) : 0;
    bool ok = nl > 0 && nl < sizeof(r->name);
    for (size_t i = 0; ok && i < nl; i++)
        ok = is_tchar((unsigned char)sp[i]);
    if (!ok) {
        snprintf(why, whylen, "expected a header 'Name: value' after the host (Name: 1-63 "
                 "token characters)");
        return SBX_E_VALIDATION;
    }
    memcpy(r->name, sp, nl);
    r->name[nl] = '\0';
    char *v = colon + 1;
    v += strspn(v, " \t");
    size_t vl = strlen(v);
    while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
        vl--;
    v[vl] = '\0';
    for (size_t i = 0; i < vl; i++)
        if (((unsigned char)v[i] < 0x20 && v[i] != '\t') || v[i] == 0x7f) {
            snprintf(why, whylen, "the value of %s has a control character", r->name);
            return SBX_E_VALIDATION;
        }
    if (vl == 0 || vl >= SBX_INJECT_VALUE_MAX) {
        snprintf(why, whylen, "the value of %s must have 1..%d bytes", r->name,
                 SBX_INJECT_VALUE_MAX - 1);
        return SBX_E_VALIDATION;
    }
    r->value = sbx_xstrdup(v);
    return 0;
}

int
sbx_inject_parse(const char *text, const char *path, struct sbx_inject_set **out, char *why,
                 size_t whylen)
{
    struct sbx_inject_set *s = sbx_xcalloc(1, sizeof(*s));
    char *copy = sbx_xstrdup(text), *save = NULL;
    int rc = 0, lineno = 0;
    for (char *p = copy; p && rc == 0; p = save) {
        save = strchr(p, '\n');
        if (save)
            *save++ = '\0';
        lineno++;
        size_t l = strlen(p);
        if (l && p[l - 1] == '\r')
            p[--l] = '\0';
        p += strspn(p, " \t");
        if (!*p || *p == '#')
            continue;
        char lwhy[320];
        if (s->n == SBX_INJECT_MAX) {
            snprintf(lwhy, sizeof(lwhy), "more than %d rules", SBX_INJECT_MAX);
            rc = SBX_E_VALIDATION;
        } else if ((rc = parse_line(p, &s->r[s->n], lwhy, sizeof(lwhy))) == 0) {
            s->n++;
        }
        if (rc)
            snprintf(why, whylen, "--egress-inject %s, line %d: %s", path, lineno, lwhy);
    }
    explicit_bzero(copy, strlen(text));
    free(copy);
    if (rc) {
        sbx_inject_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

int
sbx_inject_load(const char *path, struct sbx_inject_set **out, char *why, size_t whylen)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        snprintf(why, whylen, "--egress-inject %s: %s", path, strerror(errno));
        return SBX_E_VALIDATION;
    }
    struct stat st;
    int rc = SBX_E_VALIDATION;
    char *text = NULL;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(why, whylen, "--egress-inject %s: not a regular file", path);
    } else if ((st.st_uid != 0 && st.st_uid != geteuid()) || (st.st_mode & 077)) {
        snprintf(why, whylen, "--egress-inject %s: it holds secrets, so it must be owned by "
                 "root or this user and readable by nobody else (chmod 600; it is mode %03o, "
                 "owner uid %u)", path, (unsigned)(st.st_mode & 0777), (unsigned)st.st_uid);
    } else if (st.st_size > INJECT_FILE_MAX) {
        snprintf(why, whylen, "--egress-inject %s: larger than %d bytes", path, INJECT_FILE_MAX);
    } else {
        text = sbx_xcalloc(1, (size_t)st.st_size + 1);
        size_t n = 0;
        while (n < (size_t)st.st_size) {
            ssize_t r = read(fd, text + n, (size_t)st.st_size - n);
            if (r < 0 && errno == EINTR)
                continue;
            if (r <= 0)
                break;
            n += (size_t)r;
        }
        text[n] = '\0';
        rc = sbx_inject_parse(text, path, out, why, whylen);
        explicit_bzero(text, n);
    }
    free(text);
    close(fd);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* The proxy. */

struct sbx_proxy {
    pthread_t th;
    bool started;
    int lfd, wake[2];             /* listening socket; wake[0] readable = stop */
    uint32_t block;
    const struct sbx_inject_set *rules;
    sbx_proxy_resolved_fn resolved;
    void *ctx;
    pthread_mutex_t mu;           /* guards below */
    pthread_cond_t cv;            /* conns went down */
    int conns;
    int per_slot[SLOTS];
};

struct conn {
    struct sbx_proxy *p;
    int fd, slot;
    struct sockaddr_in peer;
};

static void
reply(int fd, const char *status)
{
    char r[160];
    int n = snprintf(r, sizeof(r), "HTTP/1.1 %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                     status);
    (void)!write(fd, r, (size_t)n);
}

/* poll one fd for ev until deadline (mono ms) or the proxy's stop; >0 ready,
 * 0 timeout or stop. */
static int
wait_fd(struct sbx_proxy *p, int fd, short ev, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - sbx_mono_us() / 1000;
        if (left <= 0)
            return 0;
        struct pollfd fds[2] = {{fd, ev, 0}, {p->wake[0], POLLIN, 0}};
        int r = poll(fds, 2, (int)SBX_MIN(left, 1000000));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || fds[1].revents)
            return 0;
        if (r > 0)
            return 1;
    }
}

/* The host of a Host field: lower case, its port (if any) in *port, no
 * trailing dot; false when it is not a plain name[:port]. */
static bool
host_of(const struct sbx_http_field *f, char *out, size_t len, unsigned *port)
{
    size_t n = f->value_len;
    *port = 0;
    const char *c = memchr(f->value, ':', n);
    if (c) {
        size_t pl = n - (size_t)(c - f->value) - 1;
        if (pl == 0 || pl > 5)
            return false;
        for (size_t i = 0; i < pl; i++) {
            if (c[1 + i] < '0' || c[1 + i] > '9')
                return false;
            *port = *port * 10 + (unsigned)(c[1 + i] - '0');
        }
        n = (size_t)(c - f->value);
    }
    if (n && f->value[n - 1] == '.')
        n--;
    if (n == 0 || n >= len)
        return false;
    for (size_t i = 0; i < n; i++) {
        char ch = f->value[i];
        if (ch >= 'A' && ch <= 'Z')
            ch = (char)(ch - 'A' + 'a');
        if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '-' || ch == '.'))
            return false;
        out[i] = ch;
    }
    out[n] = '\0';
    return true;
}

/* connect_to — a TCP socket connected to dst (CONNECT_MS), its packets in
 * htb class 1:<slot>; the fd or -errno. */
static int
connect_to(struct sbx_proxy *p, const struct sockaddr_in *dst, int slot)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    int prio = 0x10000 | slot;
    setsockopt(fd, SOL_SOCKET, SO_PRIORITY, &prio, sizeof(prio));
    int rc = 0;
    if (connect(fd, (const struct sockaddr *)dst, sizeof(*dst)) < 0) {
        rc = -errno;
        if (rc == -EINPROGRESS) {
            rc = -ETIMEDOUT;
            if (wait_fd(p, fd, POLLOUT, sbx_mono_us() / 1000 + CONNECT_MS) > 0) {
                int e = 0;
                socklen_t el = sizeof(e);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el);
                rc = -e;
            }
        }
    }
    if (rc) {
        close(fd);
        return rc;
    }
    return fd;
}

static int
send_all(struct sbx_proxy *p, int fd, const char *b, size_t n)
{
    while (n) {
        ssize_t w = send(fd, b, n, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
            if (wait_fd(p, fd, POLLOUT, sbx_mono_us() / 1000 + IDLE_MS) <= 0)
                return -ETIMEDOUT;
            continue;
        }
        if (w <= 0)
            return -EIO;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* relay — bytes both ways between a and b until both directions ended, an
 * error, IDLE_MS without a byte, or the proxy's stop. */
static void
relay(struct sbx_proxy *p, int a, int b)
{
    int fd[2] = {a, b};
    bool open[2] = {true, true}; /* reading fd[i] (and writing fd[1-i]) goes on */
    char buf[16384];
    while (open[0] || open[1]) {
        struct pollfd fds[3] = {{open[0] ? a : -1, POLLIN, 0}, {open[1] ? b : -1, POLLIN, 0},
                                {p->wake[0], POLLIN, 0}};
        int r = poll(fds, 3, IDLE_MS);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0 || fds[2].revents)
            return;
        for (int i = 0; i < 2; i++) {
            if (!open[i] || !fds[i].revents)
                continue;
            ssize_t n = recv(fd[i], buf, sizeof(buf), MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR))
                continue;
            if (n <= 0) {
                open[i] = false;
                shutdown(fd[1 - i], SHUT_WR);
                if (n < 0)
                    return;
                continue;
            }
            if (send_all(p, fd[1 - i], buf, (size_t)n) != 0)
                return;
        }
    }
}

static void
serve(struct conn *c)
{
    struct sbx_proxy *p = c->p;
    struct sockaddr_in dst;
    socklen_t dl = sizeof(dst);
    if (getsockopt(c->fd, SOL_IP, SO_ORIGINAL_DST, &dst, &dl) != 0 || dst.sin_family != AF_INET)
        return; /* not a connection the nat chain sent: nothing to relay to */
    char *head = sbx_xmalloc(SBX_HTTP_HEAD_MAX);
    struct sbx_http_head *h = sbx_xcalloc(1, sizeof(*h));
    char *out = NULL;
    size_t n = 0, outlen = 0;
    int rc = 0, up = -1;
    int64_t deadline = sbx_mono_us() / 1000 + HEAD_MS;
    while ((rc = sbx_http_head_parse(head, n, h)) == 0) {
        if (n == SBX_HTTP_HEAD_MAX || wait_fd(p, c->fd, POLLIN, deadline) <= 0) {
            rc = n == SBX_HTTP_HEAD_MAX ? -E2BIG : -ETIMEDOUT;
            break;
        }
        ssize_t r = recv(c->fd, head + n, SBX_HTTP_HEAD_MAX - n, MSG_DONTWAIT);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (r <= 0) {
            rc = -ECONNRESET;
            break;
        }
        n += (size_t)r;
    }
    if (rc < 0) {
        if (rc == -EBADMSG)
            reply(c->fd, "400 Bad Request");
        else if (rc == -E2BIG)
            reply(c->fd, "431 Request Header Fields Too Large");
        goto out;
    }
    /* Which rules the request is for: Host's name, the original port. */
    int nhost = 0;
    const struct sbx_http_field *hf = sbx_http_field_get(h, "host", &nhost);
    char host[SBX_NET_NAME_MAX];
    unsigned hport = 0;
    uint16_t port = ntohs(dst.sin_port);
    const char *names[SBX_INJECT_MAX], *values[SBX_INJECT_MAX];
    int nrules = 0;
    if (nhost == 1 && host_of(hf, host, sizeof(host), &hport) && (!hport || hport == port))
        for (int i = 0; i < p->rules->n; i++) {
            const struct sbx_inject *r = &p->rules->r[i];
            if (sbx_inject_port(r) == port && sbx_net_name_match(&r->host, host)) {
                names[nrules] = r->name;
                values[nrules++] = r->value;
            }
        }
    if (nrules) {
        bool resolved = p->resolved(p->ctx, c->slot, ntohl(dst.sin_addr.s_addr), host);
        if (h->target[0] != '/') {
            reply(c->fd, "400 Bad Request");
            goto out;
        }
        /* Not resolved for that host: the sandbox's copies of the rules'
         * fields still go (they never pass from the sandbox), none added. */
        out = sbx_http_rewrite(h, names, values, nrules, resolved, &outlen);
        if (!out) {
            reply(c->fd, errno == E2BIG ? "431 Request Header Fields Too Large"
                                        : "500 Internal Server Error");
            goto out;
        }
        sbx_log_debug("egress proxy: slot %d: %s: %d header(s) %s", c->slot, host, nrules,
                      resolved ? "injected" : "withheld (address not resolved for that host)");
    }
    if ((up = connect_to(p, &dst, c->slot)) < 0) {
        reply(c->fd, "502 Bad Gateway");
        goto out;
    }
    if (out ? send_all(p, up, out, outlen) : send_all(p, up, head, h->head_len))
        goto out;
    if (n > h->head_len && send_all(p, up, head + h->head_len, n - h->head_len))
        goto out;
    if (out)
        explicit_bzero(out, outlen);
    relay(p, c->fd, up);
out:
    if (up >= 0)
        close(up);
    if (out) {
        explicit_bzero(out, outlen);
        free(out);
    }
    free(h);
    free(head);
}

static void *
conn_main(void *arg)
{
    struct conn *c = arg;
    struct sbx_proxy *p = c->p;
    serve(c);
    close(c->fd);
    pthread_mutex_lock(&p->mu);
    p->conns--;
    p->per_slot[c->slot]--;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    free(c);
    return NULL;
}

static void *
accept_main(void *arg)
{
    struct sbx_proxy *p = arg;
    for (;;) {
        struct pollfd fds[2] = {{p->lfd, POLLIN, 0}, {p->wake[0], POLLIN, 0}};
        if (poll(fds, 2, -1) < 0 && errno != EINTR)
            break;
        if (fds[1].revents)
            break;
        if (!fds[0].revents)
            continue;
        struct sockaddr_in peer;
        socklen_t pl = sizeof(peer);
        int fd = accept4(p->lfd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
        if (fd < 0)
            continue;
        uint32_t off = ntohl(peer.sin_addr.s_addr) - p->block;
        int k = (off & 1) && off < 2 * SLOTS ? (int)(off >> 1) : 0;
        pthread_mutex_lock(&p->mu);
        bool ok = k > 0 && p->conns < CONNS_MAX && p->per_slot[k] < PER_SLOT_MAX;
        if (ok) {
            p->conns++;
            p->per_slot[k]++;
        }
        pthread_mutex_unlock(&p->mu);
        if (!ok) {
            close(fd);
            continue;
        }
        struct conn *c = sbx_xcalloc(1, sizeof(*c));
        *c = (struct conn){.p = p, .fd = fd, .slot = k, .peer = peer};
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&at, 256 * 1024);
        pthread_t th;
        if (pthread_create(&th, &at, conn_main, c) != 0) {
            close(fd);
            free(c);
            pthread_mutex_lock(&p->mu);
            p->conns--;
            p->per_slot[k]--;
            pthread_mutex_unlock(&p->mu);
        }
        pthread_attr_destroy(&at);
    }
    return NULL;
}

/* The proxy's threads live in the router's netns: the listening socket, and
 * the connections to the original addresses, are the router's.  This
 * thread enters it for good (a thread's netns is its own; its children
 * inherit it). */
struct start {
    struct sbx_proxy *p;
    int nsfd;
};

static void *
proxy_main(void *arg)
{
    struct start *st = arg;
    struct sbx_proxy *p = st->p;
    int nsfd = st->nsfd;
    free(st);
    if (setns(nsfd, CLONE_NEWNET) != 0) {
        sbx_log_error("egress proxy: cannot enter the router's netns: %s", strerror(errno));
        return NULL;
    }
    return accept_main(p);
}

int
sbx_proxy_start(struct sbx_proxy **out, int router_nsfd, uint32_t block,
                const struct sbx_inject_set *rules, sbx_proxy_resolved_fn resolved, void *ctx,
                char *why, size_t whylen)
{
    struct sbx_proxy *p = sbx_xcalloc(1, sizeof(*p));
    p->lfd = p->wake[0] = p->wake[1] = -1;
    p->block = block;
    p->rules = rules;
    p->resolved = resolved;
    p->ctx = ctx;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    int rc = 0, self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0 || pipe2(p->wake, O_CLOEXEC) < 0) {
        rc = -errno;
        snprintf(why, whylen, "egress proxy: %s", strerror(errno));
        goto fail;
    }
    /* The listening socket, made in the router's netns by this thread. */
    if (setns(router_nsfd, CLONE_NEWNET) == 0) {
        p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        rc = p->lfd < 0 ? -errno : 0;
        if (setns(self, CLONE_NEWNET) != 0) {
            sbx_log_error("egress proxy: cannot return to the shard's netns: %s",
                          strerror(errno));
            abort();
        }
    } else {
        rc = -errno;
    }
    if (rc == 0) {
        int one = 1;
        setsockopt(p->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        setsockopt(p->lfd, IPPROTO_IP, IP_FREEBIND, &one, sizeof(one));
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(80)};
        inet_pton(AF_INET, SBX_NET_RESOLVER, &sa.sin_addr);
        if (bind(p->lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(p->lfd, 128) < 0)
            rc = -errno;
    }
    if (rc) {
        snprintf(why, whylen, "egress proxy socket %s:80 in the router: %s", SBX_NET_RESOLVER,
                 strerror(-rc));
        goto fail;
    }
    struct start *st = sbx_xcalloc(1, sizeof(*st));
    *st = (struct start){p, router_nsfd};
    if ((rc = -pthread_create(&p->th, NULL, proxy_main, st)) != 0) {
        free(st);
        snprintf(why, whylen, "egress proxy thread: %s", strerror(-rc));
        goto fail;
    }
    p->started = true;
    close(self);
    sbx_log_info("egress proxy: %s:80 up, %d injection rule(s)", SBX_NET_RESOLVER, rules->n);
    *out = p;
    return 0;
fail:
    if (self >= 0)
        close(self);
    sbx_proxy_stop(p);
    return rc;
}

void
sbx_proxy_stop(struct sbx_proxy *p)
{
    if (!p)
        return;
    if (p->started) {
        (void)!write(p->wake[1], "x", 1);
        pthread_join(p->th, NULL);
        pthread_mutex_lock(&p->mu);
        while (p->conns > 0)
            pthread_cond_wait(&p->cv, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
    int fds[] = {p->lfd, p->wake[0], p->wake[1]};
    for (size_t i = 0; i < SBX_ARRAY_LEN(fds); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p);
}
