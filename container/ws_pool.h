/*
 * ws_pool.h — the shard's workspace pool: an XFS file system with reflinks
 * under the persistent workspaces when the host's file system has none
 * (docs/persistence.md, "The workspace pool").
 *
 *   <data>/wspool.img    sparse file, formatted `mkfs.xfs -m reflink=1`
 *                        (xfsprogs) when the pool is first made
 *   <data>/workspaces    a symbolic link to /proc/<shard pid>/fd/<n>: the
 *                        pool's root, a *detached* mount (fsmount(2)) the
 *                        shard holds open as descriptor n
 *
 * The pool is mounted nowhere: the file system is reached only through the
 * shard's descriptor (the link resolves through /proc's magic link into
 * it, for the shard, its helpers and root on the host alike), so every
 * path <data>/workspaces/<id>/disk.img works unchanged (workspace.h,
 * fork.c, ws_move.c, ws_snap.c, ws_xfer.c).  The loop device under it is
 * attached with LO_FLAGS_AUTOCLEAR.  When the shard's process ends — a
 * stop or a kill -9 — its descriptor goes; when the last sandbox image of
 * the pool is unmounted too (its containers die with the shard) the kernel
 * drops the file system and frees the loop device: nothing to unmount,
 * nothing left attached.  An exclusive flock(2) on the pool file's open
 * file, which the loop device keeps, makes a restarted shard wait for that
 * (one mount of the pool at a time; XFS refuses a second mount of its UUID
 * anyway).  The link stays behind a stopped shard, dangling; the next start
 * replaces it before anything uses it.
 *
 * The pool is mounted with `discard` and trimmed after destroys: the
 * extents XFS frees (a destroyed workspace's image) become holes of the
 * pool file, so the host gets the space back.  Functions run on the
 * shard's main thread at start and stop, except sbx_wspool_room and
 * sbx_wspool_trim_soon (any thread); the trims run on a thread of the pool.
 */
#ifndef SBX_WS_POOL_H
#define SBX_WS_POOL_H

#include <stddef.h>
#include <stdint.h>

/* Free space below which a new workspace or a fork is refused (bytes). */
#define SBX_WSPOOL_RESERVE (64ull << 20)
/* The smallest pool (mkfs.xfs refuses file systems under 300 MB). */
#define SBX_WSPOOL_MIN (320ull << 20)

typedef struct sbx_wspool sbx_wspool;

/*
 * sbx_wspool_open — decide and set up the pool for the shard whose data
 * directory is data.  mode: "auto" (NULL: the same) makes the pool when
 * FICLONE between two files of <data>/workspaces fails (EOPNOTSUPP, EXDEV,
 * EINVAL, ENOTTY, EPERM: no reflinks there), "on" always, "off" never.  A
 * pool file made before is always used ("off" with one present is
 * -EEXIST: its workspaces would be hidden).  size: bytes of a new pool
 * file (0: the free space of data's file system; at least SBX_WSPOOL_MIN,
 * else -EFBIG — "auto" with size 0 then keeps the workspaces on the host
 * file system, as when mkfs.xfs, loop devices or XFS are missing); an
 * existing pool keeps its size.  Workspaces found as
 * directories of <data>/workspaces on the host file system are moved into
 * the pool (copied sparse, synced, then removed; a start cut short
 * resumes).  Waits up to 10 s for a previous incarnation's mount of the
 * pool to go.  *out: the pool (the caller owns it: sbx_wspool_close), or
 * NULL when there is none (workspaces stay on the host file system).
 * 0 or -errno with the reason in why.
 */
int sbx_wspool_open(const char *data, const char *mode, uint64_t size, sbx_wspool **out,
                    char *why, size_t whylen);

/*
 * sbx_wspool_attach — the shard's part of a node's pool (`sbxd dev` makes
 * one pool for all its shards, sbx_wspool_open on its own data directory,
 * and passes each shard its root `node`, i.e. <dev data>/workspaces): the
 * directory <node>/<name> (made 0700; the shard passes its data directory's
 * name, s<i>), and <data>/workspaces a symbolic link
 * to it.  One file system for the node's workspaces, so a fork into
 * another shard's sandbox is a reflink and its adoption a rename (fork.c).
 * Workspaces found as directories of <data>/workspaces on the host file
 * system are moved in, as by sbx_wspool_open.  The node's pool file is
 * <node>/../wspool.img (what sbx_wspool_room checks the host file system
 * of).  The supervisor holds the mount; the shard holds only a descriptor
 * of its directory.  *out as for sbx_wspool_open; 0 or -errno with why.
 */
int sbx_wspool_attach(const char *data, const char *node, const char *name, sbx_wspool **out,
                      char *why, size_t whylen);

/*
 * sbx_wspool_absorb — a shard that had a pool of its own (<data>/wspool.img,
 * made before `sbxd dev` shared one pool between its shards) and is now
 * given the node's: mount its pool, copy each workspace directory into
 * <node>/<name> (its part of the node's pool: sparse, each file synced and
 * renamed into place, then the pool synced), and only then remove
 * <data>/wspool.img.  Not begun (-ENOSPC) unless the node's pool and the
 * host file system under <data> both have room for the copies plus 64 MiB.
 * A failure, or a crash, leaves the old pool whole: the copies made are
 * removed (after a crash, the next call copies again over them).  Entries
 * of the old pool that are no workspace (staged forks, strays) go with it,
 * with a warning.  0 with nothing to do (no <data>/wspool.img) or done;
 * else -errno with why (the caller keeps using its own pool).  Blocking
 * (copies the images); at the shard's start, before the attach.
 */
int sbx_wspool_absorb(const char *data, const char *node, const char *name, char *why,
                      size_t whylen);

/* sbx_wspool_stage_dir — where a fork stages its copy for another shard of
 * this node: <node>/.forks for an attached pool (on the pool: the copy is a
 * reflink, the adoption a rename), else "" (the caller uses the node's
 * store).  Written to buf; NULL: "". */
void sbx_wspool_stage_dir(const sbx_wspool *p, char *buf, size_t n);

/* sbx_wspool_close — remove the link, close the pool's
 * descriptor (the kernel drops the mount once no image of it is in use).
 * NULL is a no-op. */
void sbx_wspool_close(sbx_wspool *p);

/* sbx_wspool_room — 0 if the pool has at least SBX_WSPOOL_RESERVE bytes
 * free, and so has the host file system holding the (sparse) pool file;
 * else -ENOSPC with the free bytes and which of the two is full in why;
 * NULL: 0. */
int sbx_wspool_room(sbx_wspool *p, char *why, size_t whylen);

/* sbx_wspool_space — the bytes free to ordinary writers (statvfs(3)
 * f_bavail × f_frsize) in the pool (*pool) and on the host file system
 * holding the (sparse) pool file (*host), for the disk guard
 * (container/ws_guard.h).  0, or -errno; thread-safe. */
int sbx_wspool_space(sbx_wspool *p, uint64_t *pool, uint64_t *host);

/* sbx_wspool_trim_soon — after a destroy: FITRIM the pool 1 s and 5 s
 * later on the pool's own thread (coalesced; the loop device turns the
 * discards into holes of the pool file, which gives the host its space
 * back).  Never blocks; NULL: a no-op. */
void sbx_wspool_trim_soon(sbx_wspool *p);

/* sbx_wspool_describe — "xfs pool <file> (<size> MiB, <free> MiB free)" or
 * "no pool (host file system)" into buf, for the shard's start-up log. */
void sbx_wspool_describe(sbx_wspool *p, char *buf, size_t n);

#endif
