/* util.c — see util.h. */
#include "util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static void __attribute__((noreturn))
oom(size_t n)
{
    char msg[96];
    int k = snprintf(msg, sizeof(msg), "sbx: out of memory allocating %zu bytes\n", n);
    ssize_t w = write(STDERR_FILENO, msg, (size_t)k);
    (void)w;
    abort();
}

void *
sbx_xmalloc(size_t n)
{
    void *p = malloc(n ? n : 1);
    if (!p)
        oom(n);
    return p;
}

void *
sbx_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p)
        oom(n * sz);
    return p;
}

void *
sbx_xrealloc(void *p, size_t n)
{
    void *q = realloc(p, n ? n : 1);
    if (!q)
        oom(n);
    return q;
}

char *
sbx_xstrdup(const char *s)
{
    return sbx_xstrndup(s, strlen(s));
}

char *
sbx_xstrndup(const char *s, size_t n)
{
    char *p = sbx_xmalloc(n + 1);
    if (n)
        memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

void
sbx_buf_init(sbx_buf *b)
{
    b->p = NULL;
    b->len = b->cap = 0;
}

void
sbx_buf_free(sbx_buf *b)
{
    free(b->p);
    sbx_buf_init(b);
}

void
sbx_buf_reserve(sbx_buf *b, size_t extra)
{
    size_t need = b->len + extra + 1; /* +1 keeps room for a NUL */
    if (need <= b->cap)
        return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap *= 2;
    b->p = sbx_xrealloc(b->p, cap);
    b->cap = cap;
}

void
sbx_buf_append(sbx_buf *b, const void *data, size_t n)
{
    sbx_buf_reserve(b, n);
    if (n)
        memcpy(b->p + b->len, data, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void
sbx_buf_appendf(sbx_buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    sbx_buf_reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void
sbx_buf_consume(sbx_buf *b, size_t n)
{
    if (n >= b->len) {
        b->len = 0;
        return;
    }
    memmove(b->p, b->p + n, b->len - n);
    b->len -= n;
}

char *
sbx_buf_steal(sbx_buf *b, size_t *len)
{
    char *p = b->p;
    if (len)
        *len = b->len;
    if (!p)
        p = sbx_xcalloc(1, 1);
    sbx_buf_init(b);
    return p;
}

int64_t
sbx_mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
sbx_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (ms < 0)
        ms = 0;
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(cv, mu, &ts);
}

int64_t
sbx_mono_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

int64_t
sbx_wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void
sbx_iso8601(int64_t wall_ms, char *out, size_t outlen)
{
    time_t s = (time_t)(wall_ms / 1000);
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, outlen, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, outlen - n, ".%03dZ", (int)(wall_ms % 1000));
}

int
sbx_write_full(int fd, const void *buf, size_t n)
{
    const char *p = buf;
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += w;
        n -= (size_t)w;
    }
    return 0;
}

int
sbx_read_full(int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        if (r == 0)
            return -EPIPE;
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int
sbx_fs_write(const char *path, const char *s)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = sbx_write_full(fd, s, strlen(s));
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    return rc;
}

int
sbx_fs_read(const char *path, size_t max, char **out, size_t *len)
{
    int rc = 0;
    sbx_buf b;
    sbx_buf_init(&b);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    for (;;) {
        sbx_buf_reserve(&b, 4096);
        ssize_t r = read(fd, b.p + b.len, b.cap - b.len - 1);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            goto out;
        }
        if (r == 0)
            break;
        b.len += (size_t)r;
        if (b.len > max) {
            rc = -EFBIG;
            goto out;
        }
    }
    sbx_buf_reserve(&b, 0);
    b.p[b.len] = '\0';
    *out = sbx_buf_steal(&b, len);
out:
    close(fd);
    sbx_buf_free(&b);
    return rc;
}

int
sbx_set_nonblock(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0)
        return -errno;
    fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
    return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

int
sbx_set_cloexec(int fd, bool on)
{
    int fl = fcntl(fd, F_GETFD);
    if (fl < 0)
        return -errno;
    fl = on ? (fl | FD_CLOEXEC) : (fl & ~FD_CLOEXEC);
    return fcntl(fd, F_SETFD, fl) < 0 ? -errno : 0;
}

int
sbx_mkdir_p(const char *path, mode_t mode)
{
    char tmp[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof(tmp))
        return -ENAMETOOLONG;
    memcpy(tmp, path, n + 1);
    for (char *p = tmp + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(tmp, mode) < 0 && errno != EEXIST)
            return -errno;
        *p = '/';
    }
    if (mkdir(tmp, mode) < 0 && errno != EEXIST)
        return -errno;
    return 0;
}

static int
rm_cb(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    int r = (flag == FTW_DP) ? rmdir(path) : unlink(path);
    return (r < 0 && errno != ENOENT) ? -1 : 0;
}

int
sbx_rm_rf(const char *path)
{
    if (nftw(path, rm_cb, 16, FTW_DEPTH | FTW_PHYS | FTW_MOUNT) < 0)
        return errno == ENOENT ? 0 : -errno;
    return 0;
}

int
sbx_random(void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        ssize_t r = getrandom(p, n, 0);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        p += r;
        n -= (size_t)r;
    }
    return 0;
}

int
sbx_parse_size(const char *s, uint64_t *out)
{
    char *end;
    if (*s < '0' || *s > '9') /* strtoull would take "-1" as 2^64 - 1 */
        return -EINVAL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s)
        return -EINVAL;
    uint64_t mul = 1;
    switch (*end) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; end++; break;
    case 'm': case 'M': mul = 1ull << 20; end++; break;
    case 'g': case 'G': mul = 1ull << 30; end++; break;
    default: return -EINVAL;
    }
    if (*end == 'i' || *end == 'I')
        end++;
    if (*end == 'b' || *end == 'B')
        end++;
    if (*end || v > UINT64_MAX / mul)
        return -EINVAL;
    *out = v * mul;
    return 0;
}

int
sbx_parse_duration_ms(const char *s, int64_t *out)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0)
        return -EINVAL;
    int64_t mul;
    if (!strcmp(end, "ms")) mul = 1;
    else if (!strcmp(end, "s") || !*end) mul = 1000; /* a bare number is seconds, as the SDK's sleepAfter */
    else if (!strcmp(end, "m")) mul = 60000;
    else if (!strcmp(end, "h")) mul = 3600000;
    else return -EINVAL;
    if (v > INT64_MAX / mul)
        return -EINVAL;
    *out = v * mul;
    return 0;
}

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *
sbx_base64_encode(const void *p, size_t n, size_t *outlen)
{
    const unsigned char *s = p;
    size_t len = 4 * ((n + 2) / 3);
    char *o = sbx_xmalloc(len + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i += 3) {
        uint32_t v = (uint32_t)s[i] << 16;
        if (i + 1 < n)
            v |= (uint32_t)s[i + 1] << 8;
        if (i + 2 < n)
            v |= s[i + 2];
        o[j++] = b64[(v >> 18) & 63];
        o[j++] = b64[(v >> 12) & 63];
        o[j++] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
        o[j++] = i + 2 < n ? b64[v & 63] : '=';
    }
    o[j] = '\0';
    if (outlen)
        *outlen = j;
    return o;
}

/* The 6-bit value of each byte as a base64 digit (RFC 4648 §4 alphabet), or
 * -1: a table, because branches on the character classes mispredict on
 * random data (9 ms per MiB that way; this is ~1 ms). */
static const signed char b64_values[256] = {
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, 62, -1, -1, -1, 63,
    52, 53, 54, 55, 56, 57, 58, 59, 60, 61, -1, -1, -1, -1, -1, -1,
    -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14,
    15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, -1, -1, -1, -1, -1,
    -1, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40,
    41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
    -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1,
};

int
sbx_base64_decode(const char *s, size_t n, char **out, size_t *outlen)
{
    if (n % 4)
        return -EINVAL;
    unsigned char *o = sbx_xmalloc(n / 4 * 3 + 1);
    size_t j = 0;
    for (size_t i = 0; i < n; i += 4) {
        int v[4];
        for (int k = 0; k < 4; k++) {
            char c = s[i + k];
            int d = b64_values[(unsigned char)c];
            if (d >= 0)
                v[k] = d;
            else if (c == '=' && i + 4 == n && k >= 2)
                v[k] = -1;
            else {
                free(o);
                return -EINVAL;
            }
        }
        if (v[2] < 0 && v[3] >= 0) {
            free(o);
            return -EINVAL;
        }
        uint32_t x = ((uint32_t)v[0] << 18) | ((uint32_t)v[1] << 12) |
                     ((uint32_t)(v[2] < 0 ? 0 : v[2]) << 6) | (uint32_t)(v[3] < 0 ? 0 : v[3]);
        o[j++] = (unsigned char)(x >> 16);
        if (v[2] >= 0)
            o[j++] = (unsigned char)(x >> 8);
        if (v[3] >= 0)
            o[j++] = (unsigned char)x;
    }
    o[j] = '\0';
    *out = (char *)o;
    *outlen = j;
    return 0;
}
