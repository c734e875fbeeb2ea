/*
 * cli_util.c — the libc helpers of the sbx CLI (see cli.h).  The CLI is a
 * client of the public API alone (include/sbx/sbx.h): what it needs beyond
 * that is here, not borrowed from runtime/.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

static void
oom(void)
{
    fprintf(stderr, "sbx: out of memory\n");
    exit(EXIT_SBX);
}

void *
cli_xcalloc(size_t n, size_t sz)
{
    void *p = calloc(n ? n : 1, sz ? sz : 1);
    if (!p)
        oom();
    return p;
}

char *
cli_xstrdup(const char *s)
{
    char *d = strdup(s);
    if (!d)
        oom();
    return d;
}

int
cli_write_full(int fd, const void *buf, size_t n)
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
cli_read_all(int fd, char **out, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *p = cli_xcalloc(1, cap + 1);
    for (;;) {
        if (n == cap) {
            char *q = realloc(p, 2 * cap + 1);
            if (!q)
                oom();
            p = q;
            cap *= 2;
        }
        ssize_t r = read(fd, p + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = -errno;
            free(p);
            return e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
    }
    p[n] = '\0';
    *out = p;
    *len = n;
    return 0;
}

int
cli_parse_size(const char *s, uint64_t *out)
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

int64_t
cli_parse_ms(const char *s)
{
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || v < 0)
        return -1;
    int64_t mul;
    if (!*end) /* a bare number is milliseconds on the command line */
        return v;
    if (!strcmp(end, "ms"))
        mul = 1;
    else if (!strcmp(end, "s"))
        mul = 1000;
    else if (!strcmp(end, "m"))
        mul = 60000;
    else if (!strcmp(end, "h"))
        mul = 3600000;
    else
        return -1;
    if (v > INT64_MAX / mul)
        return -1;
    return v * mul;
}
