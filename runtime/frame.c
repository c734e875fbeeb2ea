/* frame.c — see frame.h. */
#include "frame.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void
sbx_frame_reader_init(sbx_frame_reader *r, size_t max_frame)
{
    sbx_buf_init(&r->buf);
    r->max_frame = max_frame;
    r->off = 0;
}

void
sbx_frame_reader_free(sbx_frame_reader *r)
{
    sbx_buf_free(&r->buf);
    r->off = 0;
}

ssize_t
sbx_frame_read(sbx_frame_reader *r, int fd)
{
    if (r->off > 0) {
        sbx_buf_consume(&r->buf, r->off);
        r->off = 0;
    }
    sbx_buf_reserve(&r->buf, 65536);
    for (;;) {
        ssize_t n = read(fd, r->buf.p + r->buf.len, r->buf.cap - r->buf.len - 1);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return errno == EWOULDBLOCK ? -EAGAIN : -errno;
        }
        r->buf.len += (size_t)n;
        return n;
    }
}

int
sbx_frame_next(sbx_frame_reader *r, const char **p, size_t *n)
{
    size_t avail = r->buf.len - r->off;
    if (avail < 4)
        return 0;
    const unsigned char *h = (const unsigned char *)r->buf.p + r->off;
    size_t len = ((size_t)h[0] << 24) | ((size_t)h[1] << 16) | ((size_t)h[2] << 8) | h[3];
    if (len > r->max_frame)
        return -EMSGSIZE;
    if (avail < 4 + len) {
        /* Make room for the whole frame in one go. */
        sbx_buf_reserve(&r->buf, 4 + len - avail);
        return 0;
    }
    *p = r->buf.p + r->off + 4;
    *n = len;
    r->off += 4 + len;
    return 1;
}

void
sbx_frame_writer_init(sbx_frame_writer *w)
{
    sbx_buf_init(&w->buf);
    w->off = 0;
}

void
sbx_frame_writer_free(sbx_frame_writer *w)
{
    sbx_buf_free(&w->buf);
    w->off = 0;
}

void
sbx_frame_queue(sbx_frame_writer *w, const void *p, size_t n)
{
    unsigned char h[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n};
    if (w->off > 0 && w->off == w->buf.len) {
        w->buf.len = 0;
        w->off = 0;
    }
    sbx_buf_append(&w->buf, h, 4);
    sbx_buf_append(&w->buf, p, n);
}

int
sbx_frame_flush(sbx_frame_writer *w, int fd)
{
    while (w->off < w->buf.len) {
        ssize_t k = send(fd, w->buf.p + w->off, w->buf.len - w->off, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                break;
            return -errno;
        }
        w->off += (size_t)k;
    }
    if (w->off == w->buf.len) {
        w->buf.len = 0;
        w->off = 0;
        if (w->buf.cap > (1u << 20))
            sbx_buf_free(&w->buf); /* give back the memory of a big reply */
        return 1;
    }
    if (w->off > (1u << 20)) {
        sbx_buf_consume(&w->buf, w->off);
        w->off = 0;
    }
    return 0;
}

size_t
sbx_frame_pending(const sbx_frame_writer *w)
{
    return w->buf.len - w->off;
}

int
sbx_frame_send_blocking(int fd, const void *p, size_t n)
{
    unsigned char h[4] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                          (unsigned char)(n >> 8), (unsigned char)n};
    int rc = sbx_write_full(fd, h, 4);
    if (rc == 0)
        rc = sbx_write_full(fd, p, n);
    return rc;
}

int
sbx_frame_recv_blocking(int fd, size_t max, char **out, size_t *n)
{
    unsigned char h[4];
    int rc = sbx_read_full(fd, h, 4);
    if (rc)
        return rc;
    size_t len = ((size_t)h[0] << 24) | ((size_t)h[1] << 16) | ((size_t)h[2] << 8) | h[3];
    if (len > max)
        return -EMSGSIZE;
    char *p = sbx_xmalloc(len + 1);
    rc = sbx_read_full(fd, p, len);
    if (rc) {
        free(p);
        return rc;
    }
    p[len] = '\0';
    *out = p;
    *n = len;
    return 0;
}
