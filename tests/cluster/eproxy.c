/*
 * eproxy.c — see eproxy.h.  One thread accepts; one thread per connection
 * reads the node's requests whole (header block and Content-Length body),
 * decides on each, and copies etcd's answers back.  curl sends one request
 * at a time on a connection and waits for its answer, so an answer made up
 * here never overtakes one from etcd.
 */
#include "eproxy.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <jansson.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "cluster.h"

struct epconn {
    struct eproxy *p;
    int cfd, efd;
    bool watch;   /* its first request was a watch */
    bool swallow; /* an answer was dropped: nothing more goes back to the node */
};

/* The value of header `name` in the header block h (hl bytes, request line
 * first), or NULL; *vl its length. */
static const char *
hdr(const char *h, size_t hl, const char *name, size_t *vl)
{
    size_t nl = strlen(name);
    const char *end = h + hl, *line = memchr(h, '\n', hl);
    while (line && ++line < end) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        size_t n = (size_t)((eol ? eol : end) - line);
        if (n > nl && line[nl] == ':' && !strncasecmp(line, name, nl)) {
            const char *v = line + nl + 1;
            while (v < line + n && *v == ' ')
                v++;
            *vl = (size_t)(line + n - v);
            if (*vl && v[*vl - 1] == '\r')
                (*vl)--;
            return v;
        }
        line = eol;
    }
    return NULL;
}

/* The request without its Expect header (answered here), with `extra`
 * (header lines ending in CRLF) added; heap, *ol bytes. */
static char *
rebuild(const char *h, size_t hl, const char *b, size_t bl, const char *extra, size_t *ol)
{
    char *o = malloc(hl + strlen(extra) + bl + 8);
    size_t n = 0;
    const char *line = h, *end = h + hl;
    while (line < end) {
        const char *eol = memchr(line, '\n', (size_t)(end - line));
        const char *next = eol ? eol + 1 : end;
        if (strncasecmp(line, "Expect:", 7) != 0) {
            memcpy(o + n, line, (size_t)(next - line));
            n += (size_t)(next - line);
        }
        line = next;
    }
    memcpy(o + n, extra, strlen(extra));
    n += strlen(extra);
    memcpy(o + n, "\r\n", 2);
    n += 2;
    memcpy(o + n, b, bl);
    *ol = n + bl;
    return o;
}

/* Whether base64 string s decodes to bytes starting with pfx (whole: equal). */
static bool
b64_is(const char *s, const char *pfx, bool whole)
{
    char *d = NULL;
    size_t dl = 0;
    if (!s || sbx_base64_decode(s, strlen(s), &d, &dl) != 0)
        return false;
    size_t pl = strlen(pfx);
    bool r = whole ? dl == pl && !memcmp(d, pfx, pl) : dl >= pl && !memcmp(d, pfx, pl);
    free(d);
    return r;
}

enum verdict { FORWARD, FAIL, DROP, HOLD, REFUSE };

static enum verdict
judge(struct eproxy *p, const char *path, const char *body, size_t bl)
{
    enum verdict v = FORWARD;
    json_error_t je;
    json_t *j = json_loadb(body, bl, 0, &je);
    pthread_mutex_lock(&p->mu);
    if (j && p->fail_prefix[0] && !strcmp(path, "/v3/kv/range") &&
        b64_is(json_string_value(json_object_get(j, "key")), p->fail_prefix, false))
        v = FAIL;
    if (j && (p->drop_key[0] || p->hold_key[0] || p->refuse_key[0]) &&
        !strcmp(path, "/v3/kv/txn")) {
        size_t i;
        json_t *op;
        json_array_foreach(json_object_get(j, "success"), i, op)
        {
            json_t *put = json_object_get(op, "request_put");
            if (put && p->hold_key[0] && !p->held &&
                b64_is(json_string_value(json_object_get(put, "key")), p->hold_key, true))
                v = HOLD;
            if (put && p->refuse_key[0] &&
                b64_is(json_string_value(json_object_get(put, "key")), p->refuse_key, true))
                v = REFUSE;
            if (put && b64_is(json_string_value(json_object_get(put, "key")), p->drop_key, true) &&
                b64_is(json_string_value(json_object_get(put, "value")), p->drop_val, true))
                v = DROP;
        }
        if (v == HOLD)
            p->hold_key[0] = '\0';
        if (v == DROP) {
            p->drop_key[0] = '\0';
            atomic_store(&p->dropped, true);
            if (p->freeze_on_drop)
                atomic_store(&p->frozen, true);
        }
    }
    pthread_mutex_unlock(&p->mu);
    json_decref(j);
    return v;
}

static void *
conn_main(void *arg)
{
    struct epconn *pc = arg;
    struct eproxy *p = pc->p;
    char *in = NULL, buf[65536];
    size_t inl = 0;
    bool sent100 = false, first = true;
    while (!atomic_load(&p->stop)) {
        bool hold = pc->watch && atomic_load(&p->frozen);
        struct pollfd f[2] = {{pc->cfd, POLLIN, 0}, {hold ? -1 : pc->efd, POLLIN, 0}};
        if (poll(f, 2, 100) <= 0)
            continue;
        if (f[1].revents) {
            ssize_t r = read(pc->efd, buf, sizeof(buf));
            if (r <= 0 || (!pc->swallow && sbx_write_full(pc->cfd, buf, (size_t)r) != 0))
                break;
        }
        if (!f[0].revents)
            continue;
        ssize_t r = read(pc->cfd, buf, sizeof(buf));
        if (r <= 0)
            break;
        in = realloc(in, inl + (size_t)r);
        memcpy(in + inl, buf, (size_t)r);
        inl += (size_t)r;
        for (;;) {
            const char *he = memmem(in, inl, "\r\n\r\n", 4);
            if (!he)
                break;
            size_t hl = (size_t)(he - in) + 2, vl = 0, cl = 0;
            const char *v = hdr(in, hl, "Content-Length", &vl);
            if (v)
                cl = strtoull(v, NULL, 10);
            size_t total = hl + 2 + cl;
            if (inl < total) {
                if (!sent100 && hdr(in, hl, "Expect", &vl)) {
                    const char *cont = "HTTP/1.1 100 Continue\r\n\r\n";
                    sbx_write_full(pc->cfd, cont, strlen(cont));
                    sent100 = true;
                }
                break;
            }
            char path[64] = "";
            sscanf(in, "POST %63s ", path);
            if (first)
                pc->watch = !strcmp(path, "/v3/watch");
            first = false;
            const char *body = in + hl + 2;
            enum verdict vd = judge(p, path, body, cl);
            if (vd == HOLD || vd == REFUSE) {
                size_t ol;
                char *o = rebuild(in, hl, body, cl, "Connection: close\r\n", &ol);
                pthread_mutex_lock(&p->mu);
                if (!p->held) {
                    p->held = o;
                    p->held_len = ol;
                    o = NULL;
                }
                pthread_mutex_unlock(&p->mu);
                free(o);
            }
            if (vd == FAIL || vd == REFUSE) {
                const char *e = "{\"error\":\"injected by the test's etcd proxy\",\"code\":14}";
                char resp[256];
                int n = snprintf(resp, sizeof(resp),
                                 "HTTP/1.1 503 Service Unavailable\r\nContent-Type: "
                                 "application/json\r\nContent-Length: %zu\r\n\r\n%s",
                                 strlen(e), e);
                atomic_fetch_add(vd == FAIL ? &p->ranges_failed : &p->txns_refused, 1);
                if (sbx_write_full(pc->cfd, resp, (size_t)n) != 0)
                    goto out;
            } else if (vd != HOLD) {
                if (vd == DROP) {
                    /* The watch threads see the freeze (they poll every 100
                     * ms) before etcd can send them the change. */
                    pc->swallow = true;
                    cl_sleep_ms(300);
                }
                size_t ol;
                char *o = rebuild(in, hl, body, cl, "", &ol);
                int wr = sbx_write_full(pc->efd, o, ol);
                free(o);
                if (wr != 0)
                    goto out;
            }
            memmove(in, in + total, inl - total);
            inl -= total;
            sent100 = false;
        }
    }
out:
    free(in);
    close(pc->cfd);
    close(pc->efd);
    atomic_fetch_sub(&p->conns, 1);
    free(pc);
    return NULL;
}

static void *
accept_main(void *arg)
{
    struct eproxy *p = arg;
    while (!atomic_load(&p->stop)) {
        struct pollfd f = {p->lfd, POLLIN, 0};
        if (poll(&f, 1, 200) <= 0)
            continue;
        int cfd = accept4(p->lfd, NULL, NULL, SOCK_CLOEXEC);
        if (cfd < 0)
            continue;
        int efd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (efd < 0 || connect(efd, (struct sockaddr *)&p->etcd, sizeof(p->etcd)) != 0) {
            if (efd >= 0)
                close(efd);
            close(cfd);
            continue;
        }
        struct epconn *pc = calloc(1, sizeof(*pc));
        pc->p = p;
        pc->cfd = cfd;
        pc->efd = efd;
        pthread_t th;
        atomic_fetch_add(&p->conns, 1);
        if (pthread_create(&th, NULL, conn_main, pc) != 0) {
            atomic_fetch_sub(&p->conns, 1);
            close(cfd);
            close(efd);
            free(pc);
            continue;
        }
        pthread_detach(th);
    }
    return NULL;
}

void
ep_start(struct eproxy *p)
{
    memset(p, 0, sizeof(*p));
    pthread_mutex_init(&p->mu, NULL);
    char ip[64];
    int port = 0;
    cr_assert_eq(sscanf(cl_env()->etcd, "http://%63[0-9.]:%d", ip, &port), 2, "etcd at %s",
                 cl_env()->etcd);
    p->etcd.sin_family = AF_INET;
    p->etcd.sin_port = htons((uint16_t)port);
    inet_pton(AF_INET, ip, &p->etcd.sin_addr);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr = p->etcd.sin_addr;
    socklen_t al = sizeof(a);
    p->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(p->lfd, 0);
    cr_assert_eq(bind(p->lfd, (struct sockaddr *)&a, sizeof(a)), 0, "proxy bind %s", ip);
    cr_assert_eq(listen(p->lfd, 64), 0);
    getsockname(p->lfd, (struct sockaddr *)&a, &al);
    snprintf(p->url, sizeof(p->url), "http://%s:%d", ip, (int)ntohs(a.sin_port));
    cr_assert_eq(pthread_create(&p->acc, NULL, accept_main, p), 0);
}

void
ep_fail_ranges(struct eproxy *p, const char *prefix)
{
    pthread_mutex_lock(&p->mu);
    snprintf(p->fail_prefix, sizeof(p->fail_prefix), "%s", prefix ? prefix : "");
    pthread_mutex_unlock(&p->mu);
}

void
ep_drop_reply(struct eproxy *p, const char *key, const char *val, bool freeze)
{
    pthread_mutex_lock(&p->mu);
    snprintf(p->drop_key, sizeof(p->drop_key), "%s", key);
    snprintf(p->drop_val, sizeof(p->drop_val), "%s", val);
    p->freeze_on_drop = freeze;
    pthread_mutex_unlock(&p->mu);
}

void
ep_hold(struct eproxy *p, const char *key)
{
    pthread_mutex_lock(&p->mu);
    snprintf(p->hold_key, sizeof(p->hold_key), "%s", key);
    pthread_mutex_unlock(&p->mu);
}

void
ep_refuse(struct eproxy *p, const char *key)
{
    pthread_mutex_lock(&p->mu);
    snprintf(p->refuse_key, sizeof(p->refuse_key), "%s", key ? key : "");
    pthread_mutex_unlock(&p->mu);
}

bool
ep_holds(struct eproxy *p)
{
    pthread_mutex_lock(&p->mu);
    bool h = p->held != NULL;
    pthread_mutex_unlock(&p->mu);
    return h;
}

int
ep_release(struct eproxy *p, bool *succeeded)
{
    pthread_mutex_lock(&p->mu);
    char *req = p->held;
    size_t rl = p->held_len;
    p->held = NULL;
    pthread_mutex_unlock(&p->mu);
    if (!req)
        return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, (struct sockaddr *)&p->etcd, sizeof(p->etcd)) != 0 ||
        sbx_write_full(fd, req, rl) != 0) {
        if (fd >= 0)
            close(fd);
        free(req);
        return -1;
    }
    free(req);
    char resp[8192];
    size_t n = 0;
    double until = cl_now_ms() + 10000;
    while (n < sizeof(resp) - 1 && cl_now_ms() < until) {
        struct pollfd f = {fd, POLLIN, 0};
        if (poll(&f, 1, 200) <= 0)
            continue;
        ssize_t r = read(fd, resp + n, sizeof(resp) - 1 - n);
        if (r <= 0)
            break; /* Connection: close: the whole answer */
        n += (size_t)r;
    }
    close(fd);
    resp[n] = '\0';
    if (strncmp(resp, "HTTP/1.1 200", 12) != 0 || !strstr(resp, "\"header\""))
        return -1;
    /* etcd's JSON leaves false booleans out */
    *succeeded = strstr(resp, "\"succeeded\":true") != NULL;
    return 0;
}

void
ep_freeze(struct eproxy *p, bool on)
{
    atomic_store(&p->frozen, on);
}

void
ep_stop(struct eproxy *p)
{
    atomic_store(&p->stop, true);
    pthread_join(p->acc, NULL);
    for (int k = 0; k < 100 && atomic_load(&p->conns) > 0; k++)
        cl_sleep_ms(50);
    close(p->lfd);
    free(p->held);
    p->held = NULL;
    pthread_mutex_destroy(&p->mu);
}
