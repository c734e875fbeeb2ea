/* wsclient.c — see wsclient.h. */
#include "wsclient.h"

#include <arpa/inet.h>
#include <errno.h>
#include <nettle/sha1.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"

#define GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

static int64_t
mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
ws_accept_for(const char *key, char out[32])
{
    struct sha1_ctx c;
    uint8_t d[SHA1_DIGEST_SIZE];
    sha1_init(&c);
    sha1_update(&c, strlen(key), (const uint8_t *)key);
    sha1_update(&c, strlen(GUID), (const uint8_t *)GUID);
    sha1_digest(&c, sizeof(d), d);
    size_t n;
    char *b = sbx_base64_encode(d, sizeof(d), &n);
    snprintf(out, 32, "%s", b);
    free(b);
}

/* Read more bytes into w->rbuf, waiting until the deadline. 1, 0 (EOF), -1 (timeout), -2. */
static int
fill(wsc *w, int64_t deadline)
{
    struct pollfd p = {w->fd, POLLIN, 0};
    int left = (int)(deadline - mono_ms());
    if (left < 0)
        left = 0;
    int pr = poll(&p, 1, left);
    if (pr == 0)
        return -1;
    if (pr < 0)
        return -2;
    if (w->rcap - w->rlen < 65536) {
        w->rcap = w->rcap * 2 + 65536;
        w->rbuf = sbx_xrealloc(w->rbuf, w->rcap);
    }
    ssize_t r = recv(w->fd, w->rbuf + w->rlen, w->rcap - w->rlen, 0);
    if (r < 0)
        return errno == EINTR || errno == EAGAIN ? 1 : -2;
    if (r == 0)
        return 0;
    w->rlen += (size_t)r;
    return 1;
}

static void
consume(wsc *w, size_t n)
{
    memmove(w->rbuf, w->rbuf + n, w->rlen - n);
    w->rlen -= n;
}

int
wsc_connect(wsc *w, int port, const char *host, const char *path, const char *const *extra,
            int timeout_ms, char *err, size_t errlen)
{
    memset(w, 0, sizeof(*w));
    w->close_code = -1;
    w->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (w->fd < 0 || connect(w->fd, (struct sockaddr *)&a, sizeof(a)) != 0) {
        snprintf(err, errlen, "connect 127.0.0.1:%d: %s", port, strerror(errno));
        return -1;
    }
    int one = 1;
    setsockopt(w->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    uint8_t nonce[16];
    sbx_random(nonce, sizeof(nonce));
    size_t kl;
    char *k = sbx_base64_encode(nonce, sizeof(nonce), &kl);
    snprintf(w->key, sizeof(w->key), "%s", k);
    free(k);
    sbx_buf req;
    sbx_buf_init(&req);
    sbx_buf_appendf(&req,
                    "GET %s HTTP/1.1\r\nHost: %s\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                    "Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\n",
                    path, host, w->key);
    for (int i = 0; extra && extra[i]; i++)
        sbx_buf_appendf(&req, "%s\r\n", extra[i]);
    sbx_buf_append(&req, "\r\n", 2);
    int rc = sbx_write_full(w->fd, req.p, req.len);
    sbx_buf_free(&req);
    if (rc != 0) {
        snprintf(err, errlen, "cannot send the handshake");
        return -1;
    }
    int64_t deadline = mono_ms() + timeout_ms;
    char *end;
    while (!(end = w->rbuf ? memmem(w->rbuf, w->rlen, "\r\n\r\n", 4) : NULL)) {
        int f = fill(w, deadline);
        if (f <= 0) {
            snprintf(err, errlen, "%s before the handshake's answer (%zu bytes)",
                     f == -1 ? "timeout" : "connection closed", w->rlen);
            return -1;
        }
    }
    size_t hl = (size_t)(end - w->rbuf) + 4;
    w->head = sbx_xstrndup(w->rbuf, hl);
    consume(w, hl);
    const char *sp = strchr(w->head, ' ');
    w->status = sp ? atoi(sp + 1) : -1;
    if (w->status != 101) {
        /* A refusal: its body (by Content-Length, or until EOF). */
        char *cl = wsc_header(w, "Content-Length");
        size_t want = cl ? (size_t)strtoull(cl, NULL, 10) : (size_t)-1;
        free(cl);
        while (w->rlen < want && fill(w, deadline) > 0)
            ;
        w->body = sbx_xstrndup(w->rbuf ? w->rbuf : "", w->rlen < want ? w->rlen : want);
    }
    return w->status;
}

char *
wsc_header(const wsc *w, const char *name)
{
    size_t nl = strlen(name);
    const char *p = w->head ? strstr(w->head, "\r\n") : NULL;
    while (p && p[2]) {
        p += 2;
        const char *eol = strstr(p, "\r\n");
        size_t ll = eol ? (size_t)(eol - p) : strlen(p);
        if (ll > nl && p[nl] == ':' && !strncasecmp(p, name, nl)) {
            const char *v = p + nl + 1;
            while (*v == ' ')
                v++;
            return sbx_xstrndup(v, ll - (size_t)(v - p));
        }
        p = eol;
    }
    return NULL;
}

bool
wsc_accept_ok(const wsc *w)
{
    char want[32];
    ws_accept_for(w->key, want);
    char *got = wsc_header(w, "Sec-WebSocket-Accept");
    bool ok = got && !strcmp(got, want);
    free(got);
    return ok;
}

int
wsc_send(wsc *w, int opcode, const void *p, size_t n)
{
    uint8_t hdr[14];
    size_t hl = 0;
    hdr[hl++] = (uint8_t)(0x80 | opcode);
    if (n < 126) {
        hdr[hl++] = (uint8_t)(0x80 | n);
    } else if (n < 65536) {
        hdr[hl++] = 0x80 | 126;
        hdr[hl++] = (uint8_t)(n >> 8);
        hdr[hl++] = (uint8_t)n;
    } else {
        hdr[hl++] = 0x80 | 127;
        for (int i = 7; i >= 0; i--)
            hdr[hl++] = (uint8_t)((uint64_t)n >> (8 * i));
    }
    uint8_t mask[4];
    sbx_random(mask, 4);
    memcpy(hdr + hl, mask, 4);
    hl += 4;
    uint8_t *buf = sbx_xmalloc(hl + n);
    memcpy(buf, hdr, hl);
    for (size_t i = 0; i < n; i++)
        buf[hl + i] = ((const uint8_t *)p)[i] ^ mask[i % 4];
    /* send(MSG_NOSIGNAL): a pong to a server that has closed the connection
     * fails with EPIPE instead of killing the test with SIGPIPE. */
    int rc = 0;
    for (size_t off = 0; off < hl + n && rc == 0;) {
        ssize_t k = send(w->fd, buf + off, hl + n - off, MSG_NOSIGNAL);
        if (k > 0)
            off += (size_t)k;
        else if (!(k < 0 && errno == EINTR))
            rc = -1;
    }
    free(buf);
    return rc;
}

/* One frame. 1 (got it), -1 timeout, -2 ended. */
static int
read_frame(wsc *w, int64_t deadline, bool *fin, int *op, char **data, size_t *len)
{
    for (;;) {
        if (w->rlen >= 2) {
            const uint8_t *b = (const uint8_t *)w->rbuf;
            size_t hl = 2;
            uint64_t n = b[1] & 127;
            bool masked = b[1] & 128;
            if (n == 126)
                hl += 2;
            else if (n == 127)
                hl += 8;
            if (masked)
                hl += 4;
            if (w->rlen >= hl) {
                if (n == 126)
                    n = (uint64_t)b[2] << 8 | b[3];
                else if (n == 127) {
                    n = 0;
                    for (int i = 0; i < 8; i++)
                        n = n << 8 | b[2 + i];
                }
                if (w->rlen >= hl + n) {
                    *fin = b[0] & 0x80;
                    *op = b[0] & 15;
                    *data = sbx_xmalloc(n + 1);
                    memcpy(*data, w->rbuf + hl, n);
                    if (masked)
                        for (uint64_t i = 0; i < n; i++)
                            (*data)[i] ^= w->rbuf[hl - 4 + i % 4];
                    (*data)[n] = 0;
                    *len = n;
                    consume(w, hl + n);
                    return 1;
                }
            }
        }
        int f = fill(w, deadline);
        if (f == -1)
            return -1;
        if (f <= 0)
            return -2;
    }
}

int
wsc_recv(wsc *w, char **data, size_t *len, int timeout_ms)
{
    int64_t deadline = mono_ms() + timeout_ms;
    sbx_buf msg;
    sbx_buf_init(&msg);
    int mop = -1;
    *data = NULL;
    *len = 0;
    for (;;) {
        bool fin;
        int op;
        char *d;
        size_t n;
        int rc = read_frame(w, deadline, &fin, &op, &d, &n);
        if (rc < 0) {
            sbx_buf_free(&msg);
            return rc;
        }
        if (op == WS_PING) {
            wsc_send(w, WS_PONG, d, n);
            free(d);
            continue;
        }
        if (op == WS_PONG) {
            free(d);
            continue;
        }
        if (op == WS_CLOSE) {
            w->close_code = n >= 2 ? ((uint8_t)d[0] << 8 | (uint8_t)d[1]) : 1005;
            sbx_buf_free(&msg);
            *data = d;
            *len = n;
            return WS_CLOSE;
        }
        if (op != WS_CONT)
            mop = op;
        sbx_buf_append(&msg, d, n);
        free(d);
        if (fin) {
            sbx_buf_append(&msg, "", 1);
            *len = msg.len - 1;
            *data = sbx_buf_steal(&msg, NULL);
            return mop;
        }
    }
}

void
wsc_send_close(wsc *w)
{
    uint8_t code[2] = {1000 >> 8, 1000 & 255};
    wsc_send(w, WS_CLOSE, code, 2);
}

void
wsc_close(wsc *w)
{
    if (w->fd > 0)
        close(w->fd);
    free(w->head);
    free(w->body);
    free(w->rbuf);
    memset(w, 0, sizeof(*w));
    w->fd = -1;
}
