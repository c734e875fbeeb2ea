/*
 * ws_guard.h — the disk guard: running persistent workspaces share out the
 * host's free disk so that their writes end in ENOSPC inside the sandbox,
 * never in I/O errors, and the host file system keeps its reserve
 * (docs/persistence.md, "When the host disk runs short").
 *
 * Why it is needed: a workspace's image is sparse (workspace.h), sized to
 * the sandbox's disk limit, and so is the XFS pool file holding the images
 * (ws_pool.h).  The limits of all sandboxes may add up to more than the
 * host has (thin provisioning, as LVM thin pools and sparse VM disks do).
 * When the host file system under the images fills, the loop device's
 * writes into the image fail and the sandbox's ext4 sees I/O errors (it
 * may remount read-only; the pool's XFS may shut down for every sandbox).
 *
 * What it does: each pass measures, per workspace, how many bytes of host
 * disk its writes could still take, and if the sum is more than the room
 * (the budget: free space less the reserve), lowers what the biggest
 * writers may allocate until the sum fits ("water-filling": each gets
 * min(its want, L) for the largest level L that fits).  The lever is
 * ext4's reserved clusters, /sys/fs/ext4/<dev>/reserved_clusters
 * (Documentation/ABI/testing/sysfs-fs-ext4, fs/ext4/sysfs.c): clusters no
 * ordinary allocation may take.  Raised, they make the file system answer
 * ENOSPC to the sandbox's writes and show the smaller free space in its
 * statfs(2) (`df` inside); lowered back to ext4's own default
 * (min(2 % of the clusters, 4096): fs/ext4/super.c
 * ext4_calculate_resv_clusters) when the host has room again.
 *
 * A workspace's growth on the host (unbacked = the image's holes,
 * st_size − st_blocks×512; nonfree = what ext4 does not count free, the
 * image size less statfs's f_bfree):
 *   held  = what ext4 holds over holes of the image: its allocated blocks
 *           there (its free space from FS_IOC_GETFSMAP, set against the
 *           image's data ranges from lseek(2) SEEK_DATA/SEEK_HOLE) — the
 *           lazily initialised journal and inode tables, blocks
 *           fallocate(2) reserved unwritten, data not yet written back —
 *           plus its delayed allocations (dirty data with no block yet:
 *           /sys/fs/ext4/<dev>/delayed_allocation_blocks).  At most
 *           min(unbacked, nonfree), which is used alone where GETFSMAP is
 *           missing; that bound also counts data already in the image,
 *           whose host blocks are out of the budget already, so it is safe
 *           but shrinks the shares.
 *   fixed = held + shared   what the guard cannot stop, with the extents
 *           the image shares with a fork (FIEMAP_EXTENT_SHARED: a write
 *           there copies them, whatever ext4's free space)
 *   want  = min(avail, unbacked − held)   what new data may take: ext4's
 *           free space without the guard's extra reservation (avail), but
 *           the image grows by its holes at most
 * fixed + want ≤ unbacked + shared, the most the image can grow by.
 *
 * Functions keep no state: a pass reads everything it needs from the
 * kernel.  Run on a thread of its own (a pass over 2,000 workspaces is a
 * few thousand system calls).
 */
#ifndef SBX_WS_GUARD_H
#define SBX_WS_GUARD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One running workspace for a pass. */
struct sbx_ws_guard_item {
    int mnt_fd;           /* borrowed: the workspace's ext4 mount (sbx_ws_mount) */
    int img_fd;           /* borrowed: its image file, open for reading */
    bool reflinks;        /* the image's file system shares extents (the XFS pool): count
                           * the SHARED ones */
    /* Set by the pass: */
    int rc;               /* 0, or -errno: the item was not measured (and left as it was) */
    uint64_t fixed;       /* bytes of host disk it may take that no limit stops (above) */
    uint64_t want;        /* bytes its new data may take without a limit */
    uint64_t free_bytes;  /* what its writers may allocate after the pass (statfs f_bavail) */
    bool limited;         /* its reserved clusters are above ext4's default after the pass */
};

/* What a pass saw and did. */
struct sbx_ws_guard_sum {
    uint64_t fixed;       /* Σ fixed of the items measured */
    uint64_t want;        /* Σ want */
    uint64_t level;       /* the level L (bytes) each want was cut to; UINT64_MAX: none */
    size_t limited;       /* items whose writers are held below their want */
    size_t failed;        /* items not measured (rc < 0) */
};

/*
 * sbx_ws_guard_pass — measure items[0..n) and set each one's reserved
 * clusters so that Σ fixed + Σ (what its writers may still allocate) ≤
 * budget (bytes), or, when Σ fixed + Σ want already fits, give every item
 * ext4's default back.  An item that cannot be measured (its mount or
 * image gone, no ext4 sysfs entry) counts neither way and is left as it
 * was.  Always 0; *sum (may be NULL) gets the totals.
 */
int sbx_ws_guard_pass(struct sbx_ws_guard_item *items, size_t n, uint64_t budget,
                      struct sbx_ws_guard_sum *sum);

/*
 * sbx_ws_guard_cap — hold the ext4 workspace mounted at mnt_fd to at most
 * bytes more of new data now (its reserved clusters raised so that statfs's
 * f_bavail ≤ bytes; never lowered): for a workspace mounted while the host
 * is short, until the next pass measures it.  0, or -errno.
 */
int sbx_ws_guard_cap(int mnt_fd, uint64_t bytes);

/*
 * sbx_ws_guard_level — water-filling: the largest L with Σ min(want[i], L)
 * ≤ room, or UINT64_MAX when Σ want[i] ≤ room (no cut needed).  want is
 * read only; n may be 0 (UINT64_MAX).  O(n log n); allocates a sorted copy
 * (aborts on out-of-memory, as sbx_xmalloc).
 */
uint64_t sbx_ws_guard_level(const uint64_t *want, size_t n, uint64_t room);

/*
 * sbx_ws_shared_bytes — bytes of fd's extents that FIEMAP flags
 * FIEMAP_EXTENT_SHARED (reflinked with another file), or -errno.
 */
int64_t sbx_ws_shared_bytes(int fd);

/*
 * sbx_ws_reserved_path — the ext4 file system mounted at mnt_fd: its
 * reserved_clusters file's path (/sys/fs/ext4/<dev>/reserved_clusters, dev
 * found from the mount's st_dev through /sys/dev/block) into buf.  0, or
 * -errno (-ENOENT: not ext4, or no such device; -EACCES: not writable, not
 * root).
 */
int sbx_ws_reserved_path(int mnt_fd, char *buf, size_t n);

#endif
