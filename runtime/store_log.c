/* store_log.c — the store's redo log; format and rules in store_log.h. */
#include "store_log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "util.h"

struct sbx_slog {
    int fd;
    size_t off;       /* where the next group goes */
    bool broken;      /* an append failed: no more groups */
    char *img;        /* the file as read at open, until sbx_slog_scan */
    size_t imgn;
    char *buf;        /* the group being built (sbx_slog_begin/add) */
    size_t n, cap;
    uint64_t first, last;
    size_t count;
};

/* v as `bytes` little-endian bytes at p, and back. */
static void
put_le(char *p, uint64_t v, int bytes)
{
    for (int i = 0; i < bytes; i++)
        p[i] = (char)(v >> (8 * i));
}

static uint64_t
get_le(const char *p, int bytes)
{
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++)
        v |= (uint64_t)(unsigned char)p[i] << (8 * i);
    return v;
}

/* The checksum of a group of len bytes at g in pass `pass`: its header
 * before the sum, then its entries (store_log.h). */
static uint64_t
group_sum(const char *g, size_t len, uint64_t pass)
{
    return XXH3_64bits_withSeed(g + SBX_SLOG_HDR, len - SBX_SLOG_HDR,
                                XXH3_64bits_withSeed(g, 24, pass));
}

/* Write zeros over [from, SBX_SLOG_BYTES) of fd, then flush it. */
static int
zero_fill(int fd, size_t from)
{
    static const char zeros[65536];
    while (from < SBX_SLOG_BYTES) {
        size_t n = SBX_SLOG_BYTES - from < sizeof(zeros) ? SBX_SLOG_BYTES - from : sizeof(zeros);
        ssize_t w = pwrite(fd, zeros, n, (off_t)from);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return w < 0 ? -errno : -EIO;
        from += (size_t)w;
    }
    return fsync(fd) == 0 ? 0 : -errno;
}

int
sbx_slog_open(sbx_slog **out, const char *dir)
{
    int rc = 0;
    sbx_slog *l = sbx_xcalloc(1, sizeof(*l));
    l->fd = -1;
    char path[4096];
    int dfd = -1;
    if ((size_t)snprintf(path, sizeof(path), "%s/redo.log", dir) >= sizeof(path)) {
        rc = -ENAMETOOLONG;
        goto out;
    }
    l->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (l->fd < 0) {
        rc = -errno;
        goto out;
    }
    struct stat sb;
    if (fstat(l->fd, &sb) != 0) {
        rc = -errno;
        goto out;
    }
    size_t have = (size_t)sb.st_size < SBX_SLOG_BYTES ? (size_t)sb.st_size : SBX_SLOG_BYTES;
    l->img = sbx_xmalloc(have ? have : 1);
    for (size_t got = 0; got < have;) {
        ssize_t r = pread(l->fd, l->img + got, have - got, (off_t)got);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -errno : -EIO;
            goto out;
        }
        got += (size_t)r;
    }
    l->imgn = have;
    if ((size_t)sb.st_size < SBX_SLOG_BYTES) {
        /* New (or cut short): allocate every block now, and make the file's
         * name durable too (fsync(2): the directory needs its own). */
        rc = zero_fill(l->fd, have);
        if (rc == -ENOSPC || rc == -EDQUOT) {
            /* No room for the log: what was read can still be replayed,
             * and nothing more is appended (the store goes through LMDB). */
            l->broken = true;
            rc = 0;
            goto out;
        }
        if (rc != 0)
            goto out;
        dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd < 0 || fsync(dfd) != 0) {
            rc = -errno;
            goto out;
        }
    }
out:
    if (dfd >= 0)
        close(dfd);
    if (rc != 0) {
        sbx_slog_close(l);
        return rc;
    }
    *out = l;
    return 0;
}

/* The entry at p of group g (n bytes), checked to lie inside it with a
 * sequence number in [lo, hi]: 0, or -1. */
static int
entry_at(const char *g, size_t n, size_t p, uint64_t lo, uint64_t hi, struct sbx_slog_entry *e)
{
    if (n - p < SBX_SLOG_ENTRY)
        return -1;
    e->db = (unsigned char)g[p];
    e->del = g[p + 1] & 1;
    e->kn = (size_t)get_le(g + p + 2, 2);
    e->vn = (size_t)get_le(g + p + 4, 4);
    e->seq = get_le(g + p + 8, 8);
    if (sbx_slog_entry_bytes(e->kn, e->vn) > n - p || e->seq < lo || e->seq > hi)
        return -1;
    e->k = g + p + SBX_SLOG_ENTRY;
    e->v = g + p + SBX_SLOG_ENTRY + e->kn;
    return 0;
}

/* Whether the group at off of the image is one of pass `pass` that
 * follows a group whose last write was prev: whole, in bounds, its entries
 * inside it with rising sequence numbers.  *len gets its size. */
static bool
group_ok(const sbx_slog *l, size_t off, uint64_t pass, uint64_t prev, size_t *len)
{
    const char *g = l->img + off;
    if (l->imgn - off < SBX_SLOG_HDR || get_le(g, 4) != SBX_SLOG_MAGIC)
        return false;
    size_t n = (size_t)get_le(g + 4, 4);
    uint64_t first = get_le(g + 8, 8), last = get_le(g + 16, 8);
    if (n < SBX_SLOG_HDR || n % 8 || n > l->imgn - off || first > last || first <= prev ||
        group_sum(g, n, pass) != get_le(g + 24, 8))
        return false;
    /* A good checksum over bad entries: written by other code. */
    uint64_t seq = first - 1;
    for (size_t p = SBX_SLOG_HDR; p < n;) {
        struct sbx_slog_entry e;
        if (entry_at(g, n, p, seq + 1, last, &e) != 0)
            return false;
        seq = e.seq;
        p += sbx_slog_entry_bytes(e.kn, e.vn);
    }
    *len = n;
    return true;
}

int
sbx_slog_scan(sbx_slog *l, uint64_t pass,
              int (*fn)(void *arg, const struct sbx_slog_entry *e), void *arg)
{
    uint64_t prev = 0;
    size_t len = 0;
    for (size_t off = 0; off < l->imgn && group_ok(l, off, pass, prev, &len); off += len) {
        const char *g = l->img + off;
        uint64_t last = get_le(g + 16, 8);
        for (size_t p = SBX_SLOG_HDR; p < len;) {
            struct sbx_slog_entry e;
            entry_at(g, len, p, 0, last, &e); /* checked by group_ok */
            p += sbx_slog_entry_bytes(e.kn, e.vn);
            int rc = fn(arg, &e);
            if (rc)
                return rc;
        }
        prev = last;
    }
    return 0;
}

size_t
sbx_slog_room(const sbx_slog *l)
{
    return l->broken ? 0 : SBX_SLOG_BYTES - l->off;
}

size_t
sbx_slog_entry_bytes(size_t kn, size_t vn)
{
    return (SBX_SLOG_ENTRY + kn + vn + 7) & ~(size_t)7;
}

void
sbx_slog_begin(sbx_slog *l)
{
    l->n = SBX_SLOG_HDR;
    l->count = 0;
    if (l->cap < l->n) {
        l->cap = 4096;
        l->buf = sbx_xrealloc(l->buf, l->cap);
    }
    memset(l->buf, 0, SBX_SLOG_HDR);
}

void
sbx_slog_add(sbx_slog *l, uint64_t seq, int db, bool del, const void *k, size_t kn,
             const void *v, size_t vn)
{
    size_t eb = sbx_slog_entry_bytes(kn, vn);
    if (l->n + eb > l->cap) {
        while (l->n + eb > l->cap)
            l->cap *= 2;
        l->buf = sbx_xrealloc(l->buf, l->cap);
    }
    char *p = l->buf + l->n;
    memset(p, 0, eb);
    p[0] = (char)db;
    p[1] = del ? 1 : 0;
    put_le(p + 2, kn, 2);
    put_le(p + 4, vn, 4);
    put_le(p + 8, seq, 8);
    memcpy(p + SBX_SLOG_ENTRY, k, kn);
    if (vn)
        memcpy(p + SBX_SLOG_ENTRY + kn, v, vn);
    if (l->count++ == 0)
        l->first = seq;
    l->last = seq;
    l->n += eb;
}

int
sbx_slog_append(sbx_slog *l, uint64_t pass, bool *whole)
{
    *whole = false;
    if (l->broken)
        return -EIO;
    if (l->n > sbx_slog_room(l))
        return -ENOSPC;
    char *g = l->buf;
    put_le(g, SBX_SLOG_MAGIC, 4);
    put_le(g + 4, l->n, 4);
    put_le(g + 8, l->first, 8);
    put_le(g + 16, l->last, 8);
    put_le(g + 24, group_sum(g, l->n, pass), 8);
    int rc = 0;
    for (size_t done = 0; done < l->n;) {
        ssize_t w = pwrite(l->fd, g + done, l->n - done, (off_t)(l->off + done));
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0) {
            rc = w < 0 ? -errno : -EIO;
            break;
        }
        done += (size_t)w;
    }
    if (rc == 0) {
        *whole = true; /* in the page cache whole: on disk, maybe */
        if (fdatasync(l->fd) != 0)
            rc = -errno;
    }
    if (rc != 0) {
        /* Best effort, not flushed: a restart without a power loss must
         * not find the group whole in the page cache (store_log.h). */
        static const char zero[4];
        if (pwrite(l->fd, zero, sizeof(zero), (off_t)l->off) < 0) {
            /* nothing more to try: the store replaces the pass */
        }
        l->broken = true;
        return rc;
    }
    l->off += l->n;
    return 0;
}

bool
sbx_slog_broken(const sbx_slog *l)
{
    return l->broken;
}

void
sbx_slog_reset(sbx_slog *l)
{
    l->off = 0;
    free(l->img); /* read at open: scanned by now */
    l->img = NULL;
    l->imgn = 0;
}

size_t
sbx_slog_used(const sbx_slog *l)
{
    return l->off;
}

void
sbx_slog_close(sbx_slog *l)
{
    if (!l)
        return;
    if (l->fd >= 0)
        close(l->fd);
    free(l->img);
    free(l->buf);
    free(l);
}
