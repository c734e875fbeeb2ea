/*
 * ws_guard.c — the disk guard's pass over running workspaces (ws_guard.h).
 */
#include "ws_guard.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <linux/fsmap.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "../runtime/util.h"

int
sbx_ws_reserved_path(int mnt_fd, char *buf, size_t n)
{
    struct stat st;
    char link[64], target[512];
    if (fstat(mnt_fd, &st) < 0)
        return -errno;
    snprintf(link, sizeof(link), "/sys/dev/block/%u:%u", major(st.st_dev), minor(st.st_dev));
    ssize_t k = readlink(link, target, sizeof(target) - 1);
    if (k < 0)
        return -errno;
    target[k] = '\0';
    const char *name = strrchr(target, '/');
    name = name ? name + 1 : target;
    if ((size_t)snprintf(buf, n, "/sys/fs/ext4/%s/reserved_clusters", name) >= n)
        return -ENAMETOOLONG;
    return access(buf, W_OK) == 0 ? 0 : -errno;
}

/* The number in path, or -errno. */
static int
read_u64(const char *path, uint64_t *v)
{
    char buf[32];
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t k = read(fd, buf, sizeof(buf) - 1);
    int e = errno;
    close(fd);
    if (k <= 0)
        return k < 0 ? -e : -EIO;
    buf[k] = '\0';
    char *end;
    errno = 0;
    unsigned long long x = strtoull(buf, &end, 10);
    if (errno || end == buf)
        return -EIO;
    *v = x;
    return 0;
}

static int
write_u64(const char *path, uint64_t v)
{
    char buf[32];
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int len = snprintf(buf, sizeof(buf), "%llu\n", (unsigned long long)v);
    int rc = write(fd, buf, (size_t)len) == len ? 0 : -errno;
    close(fd);
    return rc;
}

int64_t
sbx_ws_shared_bytes(int fd)
{
    enum { N = 256 };
    size_t sz = sizeof(struct fiemap) + N * sizeof(struct fiemap_extent);
    struct fiemap *fm = sbx_xcalloc(1, sz);
    int64_t shared = 0;
    uint64_t start = 0;
    for (;;) {
        memset(fm, 0, sz);
        fm->fm_start = start;
        fm->fm_length = FIEMAP_MAX_OFFSET - start;
        fm->fm_extent_count = N;
        if (ioctl(fd, FS_IOC_FIEMAP, fm) < 0) {
            shared = -errno;
            break;
        }
        if (fm->fm_mapped_extents == 0)
            break;
        bool last = false;
        for (uint32_t i = 0; i < fm->fm_mapped_extents; i++) {
            const struct fiemap_extent *x = &fm->fm_extents[i];
            if (x->fe_flags & FIEMAP_EXTENT_SHARED)
                shared += (int64_t)x->fe_length;
            last = last || (x->fe_flags & FIEMAP_EXTENT_LAST);
            start = x->fe_logical + x->fe_length;
        }
        if (last)
            break;
    }
    free(fm);
    return shared;
}

static int
cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

uint64_t
sbx_ws_guard_level(const uint64_t *want, size_t n, uint64_t room)
{
    if (n == 0)
        return UINT64_MAX;
    uint64_t *w = sbx_xmalloc(n * sizeof(*w));
    memcpy(w, want, n * sizeof(*w));
    qsort(w, n, sizeof(*w), cmp_u64);
    uint64_t level = UINT64_MAX, left = room;
    /* Ascending: a want under the even share of what is left fits whole;
     * the first that does not sets the level for it and every larger one. */
    for (size_t i = 0; i < n; i++) {
        uint64_t share = left / (n - i);
        if (w[i] > share) {
            level = share;
            break;
        }
        left -= w[i];
    }
    free(w);
    return level;
}

int
sbx_ws_guard_cap(int mnt_fd, uint64_t bytes)
{
    char path[300];
    struct statvfs vs;
    uint64_t resv;
    int rc = sbx_ws_reserved_path(mnt_fd, path, sizeof(path));
    if (rc == 0 && fstatvfs(mnt_fd, &vs) < 0)
        rc = -errno;
    if (rc == 0)
        rc = read_u64(path, &resv);
    if (rc)
        return rc;
    uint64_t bsize = vs.f_frsize ? vs.f_frsize : 4096;
    uint64_t avail = (uint64_t)vs.f_bavail * bsize;
    if (avail <= bytes)
        return 0;
    uint64_t next = resv + (avail - bytes + bsize - 1) / bsize;
    if (next >= (uint64_t)vs.f_blocks) /* the kernel's bound is the whole count; near enough */
        next = vs.f_blocks ? vs.f_blocks - 1 : 0;
    return write_u64(path, next);
}

/* A byte range [start, end) of the image that holds data. */
struct rng {
    uint64_t start, end;
};

/* The ranges of fd's first size bytes that hold data — allocated, or
 * dirty in the page cache — in ascending order (lseek(2) SEEK_DATA /
 * SEEK_HOLE: XFS, ext4, btrfs and tmpfs alike), and their bytes in
 * *total.  *out is the caller's to free.  0, or -errno. */
static int
data_ranges(int fd, uint64_t size, struct rng **out, size_t *n, uint64_t *total)
{
    size_t cap = 16, k = 0;
    uint64_t sum = 0;
    struct rng *r = sbx_xmalloc(cap * sizeof(*r));
    int rc = 0;
    off_t pos = 0;
    while ((uint64_t)pos < size) {
        off_t d = lseek(fd, pos, SEEK_DATA);
        if (d < 0) {
            if (errno != ENXIO) /* ENXIO: no data past pos */
                rc = -errno;
            break;
        }
        off_t h = lseek(fd, d, SEEK_HOLE);
        if (h < 0) {
            rc = -errno;
            break;
        }
        if (k == cap)
            r = sbx_xrealloc(r, (cap *= 2) * sizeof(*r));
        if ((uint64_t)h > size) /* the file grew under the scan */
            h = (off_t)size;
        r[k++] = (struct rng){(uint64_t)d, (uint64_t)h};
        sum += (uint64_t)(h - d);
        pos = h;
    }
    if (rc) {
        free(r);
        return rc;
    }
    *out = r;
    *n = k;
    *total = sum;
    return 0;
}

/* Bytes of [p, p + len) outside the sorted ranges d[0..n). */
static uint64_t
outside(const struct rng *d, size_t n, uint64_t p, uint64_t len)
{
    size_t lo = 0, hi = n; /* the first range ending after p */
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (d[mid].end <= p)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint64_t in = 0, end = p + len;
    for (size_t i = lo; i < n && d[i].start < end; i++) {
        uint64_t a = d[i].start > p ? d[i].start : p, b = d[i].end < end ? d[i].end : end;
        in += b - a;
    }
    return len - in;
}

/* The free space of the ext4 file system mounted at mnt_fd, from
 * FS_IOC_GETFSMAP (ioctl_getfsmap(2); ext4 answers from its in-memory
 * buddy bitmaps, so blocks allocated and not yet written are not free):
 * *free_in_holes = its free bytes over no data of the image (ranges d;
 * the image's byte offsets are ext4's physical offsets: one loop device
 * over the whole file).  Only the records of free
 * space are used: ext4's records of used space have gaps (Linux 6.18: the
 * used end of a block group after its last free extent is not reported),
 * its free records are those of its buddy bitmaps (preallocated blocks
 * and frees not yet committed count as used there, which is the safe
 * side: they may still be written).  0, or -errno (-EOPNOTSUPP/-ENOTTY: a
 * kernel without it; -EPERM: not root; -EIO: the mapping did not move
 * on). */
static int
fsmap_free(int mnt_fd, const struct rng *d, size_t n, uint64_t *free_in_holes)
{
    enum { N = 256 };
    int fd = openat(mnt_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct fsmap_head *h = sbx_xcalloc(1, sizeof(*h) + N * sizeof(struct fsmap));
    h->fmh_count = N;
    h->fmh_keys[1].fmr_device = UINT32_MAX;
    h->fmh_keys[1].fmr_physical = UINT64_MAX;
    h->fmh_keys[1].fmr_owner = UINT64_MAX;
    h->fmh_keys[1].fmr_offset = UINT64_MAX;
    h->fmh_keys[1].fmr_flags = UINT32_MAX;
    int rc = 0;
    uint64_t next = 0; /* where the last batch ended */
    *free_in_holes = 0;
    for (;;) {
        if (ioctl(fd, FS_IOC_GETFSMAP, h) < 0) {
            rc = -errno;
            break;
        }
        if (h->fmh_entries == 0)
            break;
        for (uint32_t i = 0; i < h->fmh_entries; i++) {
            const struct fsmap *r = &h->fmh_recs[i];
            if (r->fmr_owner != FMR_OWN_FREE)
                continue;
            *free_in_holes += outside(d, n, r->fmr_physical, r->fmr_length);
        }
        const struct fsmap *last = &h->fmh_recs[h->fmh_entries - 1];
        if (last->fmr_flags & FMR_OF_LAST)
            break;
        /* The kernel goes on after the last record: it must move on. */
        if (last->fmr_physical + last->fmr_length <= next) {
            rc = -EIO;
            break;
        }
        next = last->fmr_physical + last->fmr_length;
        fsmap_advance(h);
    }
    free(h);
    close(fd);
    return rc;
}

/* What the pass needs of one item, measured. */
struct meas {
    char path[300];   /* its reserved_clusters file, in /sys/fs/ext4/<dev>/ */
    uint64_t bsize;   /* ext4's block (= cluster: the images have no bigalloc) */
    uint64_t blocks;  /* ext4_blocks_count: the image size in blocks (mkfs used it all) */
    uint64_t resv0;   /* ext4's default reservation, in clusters */
    uint64_t resv;    /* the reservation now */
    uint64_t avail;   /* bytes writers could allocate with the default reservation */
};

/* What ext4 holds over holes of the image, measured (ws_guard.h,
 * "held"): its allocated blocks there — the holes less its free space over
 * them — plus its delayed allocations (dirty data without blocks yet),
 * ext4's own count in blocks (Documentation/ABI/testing/sysfs-fs-ext4;
 * not GETFSMAP's free less f_bfree: preallocations and uncommitted frees
 * are free in f_bfree's counter but not in the bitmaps).  0, or -errno
 * when any of it cannot be read (the caller keeps its bound). */
static int
held_measured(const struct sbx_ws_guard_item *it, const struct meas *m, uint64_t size,
              uint64_t *held)
{
    struct rng *d = NULL;
    size_t nd = 0;
    uint64_t data = 0, free_holes = 0, dblocks = 0;
    char dpath[320];
    const char *slash = strrchr(m->path, '/'); /* <dir>/reserved_clusters */
    snprintf(dpath, sizeof(dpath), "%.*s/delayed_allocation_blocks",
             (int)(slash ? slash - m->path : 0), m->path);
    int rc = data_ranges(it->img_fd, size, &d, &nd, &data);
    if (rc == 0)
        rc = fsmap_free(it->mnt_fd, d, nd, &free_holes);
    if (rc == 0)
        rc = read_u64(dpath, &dblocks);
    free(d);
    if (rc)
        return rc;
    uint64_t holes = size > data ? size - data : 0;
    *held = (holes > free_holes ? holes - free_holes : 0) + dblocks * m->bsize;
    return 0;
}

static int
measure(struct sbx_ws_guard_item *it, struct meas *m)
{
    struct statvfs vs;
    struct stat st;
    int rc = sbx_ws_reserved_path(it->mnt_fd, m->path, sizeof(m->path));
    if (rc)
        return rc;
    if (fstatvfs(it->mnt_fd, &vs) < 0 || fstat(it->img_fd, &st) < 0)
        return -errno;
    if ((rc = read_u64(m->path, &m->resv)) != 0)
        return rc;
    m->bsize = vs.f_frsize ? vs.f_frsize : 4096;
    uint64_t size = (uint64_t)st.st_size, alloc = (uint64_t)st.st_blocks * 512;
    m->blocks = size / m->bsize;
    m->resv0 = m->blocks / 50 < 4096 ? m->blocks / 50 : 4096;
    /* Free to writers under ext4's default reservation: f_bfree less it
     * (the images have no root-reserved blocks, mkfs -m 0; f_bavail is
     * clamped at 0 by the kernel, so it cannot be used to undo our own). */
    int64_t avail_blocks = (int64_t)vs.f_bfree - (int64_t)m->resv0;
    m->avail = avail_blocks > 0 ? (uint64_t)avail_blocks * m->bsize : 0;
    uint64_t unbacked = size > alloc ? size - alloc : 0;
    /* Not free in ext4: its metadata, data (dirty data included: f_bfree
     * has it taken off), blocks fallocate(2) reserved unwritten. */
    uint64_t freebytes = (uint64_t)vs.f_bfree * m->bsize;
    uint64_t nonfree = size > freebytes ? size - freebytes : 0;
    /* Held: what ext4 holds over holes of the image, measured.  Without
     * GETFSMAP, bounded by min(unbacked, nonfree), which also counts data
     * already in the image a second time (it is in the host's use too):
     * safe, but a sandbox that wrote much would shrink every share. */
    uint64_t held = unbacked < nonfree ? unbacked : nonfree, h;
    if (held_measured(it, m, size, &h) == 0 && h < held)
        held = h;
    uint64_t shared = 0;
    if (it->reflinks) {
        int64_t s = sbx_ws_shared_bytes(it->img_fd);
        /* No FIEMAP (tmpfs): no extents known to be shared, nor any reflink. */
        if (s < 0 && s != -EOPNOTSUPP && s != -ENOTTY)
            return (int)s;
        shared = s > 0 ? (uint64_t)s : 0;
    }
    it->fixed = held + shared;
    /* With what is held, the image grows by at most its holes. */
    it->want = m->avail < unbacked - held ? m->avail : unbacked - held;
    return 0;
}

int
sbx_ws_guard_pass(struct sbx_ws_guard_item *items, size_t n, uint64_t budget,
                  struct sbx_ws_guard_sum *sum)
{
    struct sbx_ws_guard_sum s = {.level = UINT64_MAX};
    struct meas *m = n ? sbx_xcalloc(n, sizeof(*m)) : NULL;
    uint64_t *want = n ? sbx_xcalloc(n, sizeof(*want)) : NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        struct sbx_ws_guard_item *it = &items[i];
        it->fixed = it->want = it->free_bytes = 0;
        it->limited = false;
        if ((it->rc = measure(it, &m[i])) != 0) {
            s.failed++;
            continue;
        }
        s.fixed += it->fixed;
        s.want += it->want;
        want[k++] = it->want;
    }
    if (s.fixed + s.want > budget)
        s.level = sbx_ws_guard_level(want, k, budget > s.fixed ? budget - s.fixed : 0);
    for (size_t i = 0; i < n; i++) {
        struct sbx_ws_guard_item *it = &items[i];
        if (it->rc)
            continue;
        /* The new reservation: the default, or so much more that writers
         * may allocate only `level` bytes. */
        uint64_t resv = m[i].resv0;
        if (it->want > s.level) {
            uint64_t cut = m[i].avail - s.level; /* avail ≥ want > level */
            resv += (cut + m[i].bsize - 1) / m[i].bsize;
            if (resv >= m[i].blocks) /* the kernel's bound (fs/ext4/sysfs.c) */
                resv = m[i].blocks ? m[i].blocks - 1 : 0;
        }
        if (resv != m[i].resv && (it->rc = write_u64(m[i].path, resv)) != 0) {
            s.failed++; /* as it was: its share stays counted, on the safe side */
            resv = m[i].resv;
        }
        it->limited = resv > m[i].resv0;
        s.limited += it->limited;
        uint64_t avail_blocks = m[i].avail / m[i].bsize + m[i].resv0;
        it->free_bytes = avail_blocks > resv ? (avail_blocks - resv) * m[i].bsize : 0;
    }
    free(m);
    free(want);
    if (sum)
        *sum = s;
    return 0;
}
