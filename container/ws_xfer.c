/*
 * ws_xfer.c — a persistent workspace's image sent and received in chunks
 * of its data extents, checksummed (ws_xfer.h; docs/persistence.md).
 */
#include "ws_xfer.h"

#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/util.h"

static const char *
kind_name(enum sbx_ws_kind k)
{
    return k == SBX_WS_SNAP ? "snap.img" : "disk.img";
}

/* One chunk's record in the transfer's digest: offset, length, sha256. */
static void
record(uint8_t rec[16 + SBX_WS_XFER_SHA], uint64_t off, uint64_t len,
       const uint8_t sha[SBX_WS_XFER_SHA])
{
    for (int i = 0; i < 8; i++) {
        rec[i] = (uint8_t)(off >> (56 - 8 * i));
        rec[8 + i] = (uint8_t)(len >> (56 - 8 * i));
    }
    memcpy(rec + 16, sha, SBX_WS_XFER_SHA);
}

int
sbx_ws_src_open(const char *dir, struct sbx_ws_src *s, char *why, size_t whylen)
{
    char img[4200];
    memset(s, 0, sizeof(*s));
    s->fd = -1;
    snprintf(img, sizeof(img), "%s/disk.img", dir);
    int fd = open(img, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        snprintf(why, whylen, "open %s: %s", img, strerror(e));
        return -e;
    }
    /* Not mounted while it is read: the lock sbx_ws_mount takes. */
    for (int i = 0; flock(fd, LOCK_EX | LOCK_NB) < 0; i++) {
        if (errno != EWOULDBLOCK || i >= 1000) {
            int e = errno == EWOULDBLOCK ? EBUSY : errno;
            snprintf(why, whylen, "the workspace %s is still in use", dir);
            close(fd);
            return -e;
        }
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        int e = errno;
        snprintf(why, whylen, "stat %s: %s", img, strerror(e));
        close(fd);
        return -e;
    }
    s->fd = fd;
    s->size = (uint64_t)st.st_size;
    struct sha256_ctx *h = sbx_xmalloc(sizeof(*h));
    sha256_init(h);
    s->hash = h;
    return 0;
}

int
sbx_ws_src_next(struct sbx_ws_src *s, char *buf, size_t max, uint64_t *offset, size_t *len,
                uint8_t sha[SBX_WS_XFER_SHA], char *why, size_t whylen)
{
    *len = 0;
    *offset = s->pos;
    if (s->pos >= s->size)
        return 0;
    off_t data = lseek(s->fd, (off_t)s->pos, SEEK_DATA);
    if (data < 0) {
        if (errno == ENXIO) { /* no data past pos */
            s->pos = s->size;
            return 0;
        }
        snprintf(why, whylen, "SEEK_DATA: %s", strerror(errno));
        return -errno;
    }
    off_t hole = lseek(s->fd, data, SEEK_HOLE);
    if (hole < 0) {
        snprintf(why, whylen, "SEEK_HOLE: %s", strerror(errno));
        return -errno;
    }
    size_t want = (size_t)SBX_MIN((uint64_t)(hole - data), (uint64_t)max);
    size_t got = 0;
    while (got < want) {
        ssize_t n = pread(s->fd, buf + got, want - got, data + (off_t)got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            snprintf(why, whylen, "read the workspace image: %s",
                     n < 0 ? strerror(errno) : "it shrank");
            return n < 0 ? -errno : -EIO;
        }
        got += (size_t)n;
    }
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, got, (const uint8_t *)buf);
    sha256_digest(&c, SBX_WS_XFER_SHA, sha);
    uint8_t rec[16 + SBX_WS_XFER_SHA];
    record(rec, (uint64_t)data, got, sha);
    sha256_update(s->hash, sizeof(rec), rec);
    *offset = (uint64_t)data;
    *len = got;
    s->pos = (uint64_t)data + got;
    s->sent += got;
    s->chunks++;
    return 0;
}

void
sbx_ws_src_digest(const struct sbx_ws_src *s, uint8_t digest[SBX_WS_XFER_SHA])
{
    struct sha256_ctx c = *(const struct sha256_ctx *)s->hash; /* digest resets the context */
    sha256_digest(&c, SBX_WS_XFER_SHA, digest);
}

void
sbx_ws_src_close(struct sbx_ws_src *s)
{
    if (s->fd >= 0)
        close(s->fd); /* and its lock */
    s->fd = -1;
    free(s->hash);
    s->hash = NULL;
}

/* "<dir>/<kind>.in" and its sums file. */
static void
in_paths(const char *dir, enum sbx_ws_kind kind, char img[4200], char sums[4200])
{
    snprintf(img, 4200, "%s/%s.in", dir, kind_name(kind));
    snprintf(sums, 4200, "%s/%s.in.sums", dir, kind_name(kind));
}

int
sbx_ws_recv_begin(const char *dir, enum sbx_ws_kind kind, uint64_t size, char *why, size_t whylen)
{
    char img[4200], sums[4200];
    int rc = sbx_mkdir_p(dir, 0700);
    if (rc) {
        snprintf(why, whylen, "mkdir %s: %s", dir, strerror(-rc));
        return rc;
    }
    in_paths(dir, kind, img, sums);
    int fd = open(img, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int sf = fd < 0 ? -1 : open(sums, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    rc = 0;
    if (fd < 0 || sf < 0 || ftruncate(fd, (off_t)size) < 0) {
        rc = -errno;
        snprintf(why, whylen, "create %s: %s", img, strerror(-rc));
    }
    if (fd >= 0)
        close(fd);
    if (sf >= 0)
        close(sf);
    if (rc)
        sbx_ws_recv_abort(dir, kind);
    return rc;
}

int
sbx_ws_recv_chunk(const char *dir, enum sbx_ws_kind kind, uint64_t offset, const void *data,
                  size_t len, const uint8_t sha[SBX_WS_XFER_SHA], char *why, size_t whylen)
{
    char img[4200], sums[4200];
    in_paths(dir, kind, img, sums);
    int fd = -1, sf = -1, rc = 0;
    struct stat st;
    fd = open(img, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) < 0 || (sf = open(sums, O_WRONLY | O_APPEND | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "no transfer of %s begun (%s)", img, strerror(-rc));
        goto out;
    }
    if (offset > (uint64_t)st.st_size || len > (uint64_t)st.st_size - offset) {
        rc = -ERANGE;
        snprintf(why, whylen, "a chunk at %llu (+%zu) past the image's %lld bytes",
                 (unsigned long long)offset, len, (long long)st.st_size);
        goto out;
    }
    uint8_t got[SBX_WS_XFER_SHA];
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, len, data);
    sha256_digest(&c, sizeof(got), got);
    if (memcmp(got, sha, sizeof(got)) != 0) {
        rc = -EBADMSG;
        snprintf(why, whylen, "the chunk at %llu does not match its sha256",
                 (unsigned long long)offset);
        goto out;
    }
    size_t done = 0;
    while (done < len) {
        ssize_t n = pwrite(fd, (const char *)data + done, len - done, (off_t)(offset + done));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            snprintf(why, whylen, "write %s: %s", img, strerror(-rc));
            goto out;
        }
        done += (size_t)n;
    }
    uint8_t rec[16 + SBX_WS_XFER_SHA];
    record(rec, offset, len, sha);
    if (sbx_write_full(sf, rec, sizeof(rec)) != 0) {
        rc = -errno;
        snprintf(why, whylen, "write %s: %s", sums, strerror(-rc));
    }
out:
    if (fd >= 0)
        close(fd);
    if (sf >= 0)
        close(sf);
    return rc;
}

int
sbx_ws_recv_commit(const char *dir, enum sbx_ws_kind kind, const uint8_t digest[SBX_WS_XFER_SHA],
                   int64_t taken_ms, char *why, size_t whylen)
{
    char img[4200], sums[4200], dst[4200];
    in_paths(dir, kind, img, sums);
    snprintf(dst, sizeof(dst), "%s/%s", dir, kind_name(kind));
    int fd = -1, sf = -1, rc = 0;
    if ((sf = open(sums, O_RDONLY | O_CLOEXEC)) < 0 || (fd = open(img, O_WRONLY | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "no transfer of %s begun (%s)", img, strerror(-rc));
        goto out;
    }
    struct sha256_ctx c;
    sha256_init(&c);
    char buf[65536];
    ssize_t n;
    while ((n = read(sf, buf, sizeof(buf))) > 0)
        sha256_update(&c, (size_t)n, (const uint8_t *)buf);
    if (n < 0) {
        rc = -errno;
        snprintf(why, whylen, "read %s: %s", sums, strerror(-rc));
        goto out;
    }
    uint8_t got[SBX_WS_XFER_SHA];
    sha256_digest(&c, sizeof(got), got);
    if (memcmp(got, digest, sizeof(got)) != 0) {
        rc = -EBADMSG;
        snprintf(why, whylen, "the transfer's digest does not match: a chunk is missing, "
                              "repeated or out of order");
        goto out;
    }
    if (fdatasync(fd) < 0) {
        rc = -errno;
        snprintf(why, whylen, "fdatasync %s: %s", img, strerror(-rc));
        goto out;
    }
    if (kind == SBX_WS_SNAP) {
        char tp[4200], tt[4200], v[32];
        snprintf(tp, sizeof(tp), "%s/snap.time", dir);
        snprintf(tt, sizeof(tt), "%s/snap.time.in", dir);
        int k = snprintf(v, sizeof(v), "%lld\n", (long long)taken_ms);
        int tf = open(tt, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (tf < 0 || sbx_write_full(tf, v, (size_t)k) != 0 || rename(tt, tp) < 0) {
            rc = -errno;
            snprintf(why, whylen, "write %s: %s", tp, strerror(-rc));
        }
        if (tf >= 0)
            close(tf);
        if (rc)
            goto out;
    }
    if (rename(img, dst) < 0) {
        rc = -errno;
        snprintf(why, whylen, "rename %s: %s", img, strerror(-rc));
        goto out;
    }
    int d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        fsync(d); /* the rename is durable before the sender is told */
        close(d);
    }
out:
    if (fd >= 0)
        close(fd);
    if (sf >= 0)
        close(sf);
    if (rc == 0)
        unlink(sums);
    return rc;
}

void
sbx_ws_snap_drop(const char *dir)
{
    char p[4200];
    sbx_ws_recv_abort(dir, SBX_WS_SNAP);
    snprintf(p, sizeof(p), "%s/snap.img", dir);
    unlink(p);
    snprintf(p, sizeof(p), "%s/snap.time", dir);
    unlink(p);
    rmdir(dir); /* only if empty: never a live workspace */
}

void
sbx_ws_recv_abort(const char *dir, enum sbx_ws_kind kind)
{
    char img[4200], sums[4200];
    in_paths(dir, kind, img, sums);
    unlink(img);
    unlink(sums);
}
