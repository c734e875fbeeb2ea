/*
 * workspace.h — persistent workspaces (docs/persistence.md): the writable
 * state of a sandbox created with `workspace: "persistent"` on the shard's
 * disk, in one sparse ext4 file-system image per sandbox:
 *
 *   <dir> = <shard data>/workspaces/<sandbox id>/  (<shard data>/workspaces
 *           is the link into the shard's XFS workspace pool where the data
 *           directory has no reflinks: ws_pool.h; the paths are the same)
 *   <dir>/disk.img   the ext4 image, sized to the sandbox's disk limit
 *                    (mkfs.ext4 on first use; the kernel enforces the size:
 *                    a write past it is ENOSPC inside, and the host file
 *                    never grows beyond it)
 *
 * The shard (root in the host's namespaces) attaches the image to a free
 * loop device (LOOP_CONFIGURE with LO_FLAGS_AUTOCLEAR) and mounts it as a
 * detached mount (fsopen/fsmount: no mount point on the host, nothing to
 * unmount); container/spawn.c idmaps that mount to the child's user
 * namespace and hands it to the agent, which puts /workspace, /tmp, /home
 * (and an image's overlay upper and work dirs) on it instead of a tmpfs.
 * When the container and the shard's descriptors are gone the kernel drops
 * the mount and AUTOCLEAR frees the loop device: a kill -9 of the shard
 * leaves neither.  An exclusive flock(2) on the image file's open file,
 * which the loop device keeps, guarantees one mount of an image at a time.
 *
 * Functions run on the shard's worker threads (mount, remove) or loop
 * thread (usage, sweep); they keep no state.  Errors: 0 or -errno with the
 * reason in why.
 */
#ifndef SBX_WORKSPACE_H
#define SBX_WORKSPACE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* sbx_ws_dir — "<data>/workspaces/<id>" into buf; -ENAMETOOLONG if it does
 * not fit. */
int sbx_ws_dir(const char *data, const char *id, char *buf, size_t n);

/*
 * sbx_ws_mount — make dir's image (size bytes, inodes inodes; created with
 * mkfs.ext4 when absent, sparse) and mount it: *mnt_fd gets a detached
 * mount (fsmount(2), MOUNT_ATTR_NOSUID|NODEV; the caller owns and closes
 * it).  Waits up to 5 s for a previous mount of the same image to go (its
 * container's teardown).  *created tells whether the image is new.
 */
int sbx_ws_mount(const char *dir, uint64_t size, uint64_t inodes, int *mnt_fd, bool *created,
                 char *why, size_t whylen);

/*
 * sbx_ws_tmpfs — an ephemeral workspace of its own size: a tmpfs of size
 * bytes and at most inodes inodes (mode 0755), as a detached mount like
 * sbx_ws_mount's (*mnt_fd, MOUNT_ATTR_NOSUID|NODEV; the caller owns and
 * closes it; with the last reference, the kernel frees its pages).  For a
 * create whose `disk` differs from the shard's --disk (docs/persistence.md,
 * "Ephemeral workspaces"): the agent's own tmpfs has the shard's size.
 * 0 or -errno with the reason in why.
 */
int sbx_ws_tmpfs(uint64_t size, uint64_t inodes, int *mnt_fd, char *why, size_t whylen);

/*
 * sbx_ws_fork — copy the image of the workspace at src_dir into each of
 * dst_dirs[0..n) (made, mode 0700; each must hold no image yet: -EEXIST),
 * consistent as of one instant (docs/persistence.md, "Fork"):
 *  - src_mnt_fd ≥ 0 (borrowed): the source is mounted (its container runs);
 *    its file system is frozen (FIFREEZE: dirty data and the journal are
 *    written to the image, writers block) while the image is copied to
 *    dst_dirs[0], then thawed; the other forks are copied from that one;
 *  - src_mnt_fd < 0: the source is not mounted; the image's flock (the one
 *    sbx_ws_mount takes) is held for the copy, so it is not mounted meanwhile.
 * The copy is copy_file_range(2) of the image's data extents only
 * (SEEK_DATA/SEEK_HOLE): each fork is as sparse as the source.  Each is
 * written as disk.img.fork and renamed to disk.img with RENAME_NOREPLACE.
 * On failure no fork's directory is left.  *copied: bytes copied per fork;
 * *frozen_ms: how long the source was frozen (0 if it was not mounted).
 * Runs on a worker thread (blocking).  0 or -errno with the reason in why.
 */
int sbx_ws_fork(const char *src_dir, int src_mnt_fd, const char *const *dst_dirs, size_t n,
                int64_t *copied, int64_t *frozen_ms, char *why, size_t whylen);

/* sbx_ws_remove — delete dir and its image (destroy); 0 if there was none. */
int sbx_ws_remove(const char *dir);

/*
 * sbx_ws_run_tool — run argv[0] (searched in PATH) with argv, its stdin and
 * stdout on /dev/null (stderr inherited: the shard's log), and wait for it
 * at most timeout_ms (ms): 0 if it exited 0, else a negative code with the
 * reason in why (the command line and its wait status, or why it could not
 * run; `package` names what provides the program, for that message);
 * -ETIMEDOUT if it was still running at the deadline (it is SIGKILLed, and
 * reaped if it dies within 5 s).  For mkfs.ext4 and mkfs.xfs (ws_pool.c),
 * with SBX_WS_TOOL_MS.
 */
#define SBX_WS_TOOL_MS 120000 /* mkfs of a sparse image: well under a second, a pool's seconds */
int sbx_ws_run_tool(char *const argv[], const char *package, int64_t timeout_ms, char *why,
                    size_t whylen);

/* sbx_ws_allocated — bytes of host disk dir's image holds (st_blocks), or
 * -errno (-ENOENT: none yet). */
int64_t sbx_ws_allocated(const char *dir);

/*
 * sbx_ws_sweep — remove every workspace under <data>/workspaces whose
 * sandbox no longer exists (exists(id, arg) false): a shard does this when
 * it starts.  A directory that holds only a snapshot (snap.img, sent by
 * another node: container/ws_xfer.h) is kept.  Returns how many were removed.
 */
int sbx_ws_sweep(const char *data, bool (*exists)(const char *id, void *arg), void *arg);

/* sbx_ws_loop — attach the file open at imgfd (named img, for the device's
 * lo_file_name) to a free loop device with LO_FLAGS_AUTOCLEAR (freed on its
 * last close); *loopfd (the caller owns and closes it) and the device's
 * path into dev.  0 or -errno with the reason in why. */
int sbx_ws_loop(int imgfd, const char *img, int *loopfd, char *dev, size_t devlen, char *why,
                size_t whylen);

/* sbx_ws_mount_loop — attach the file open at fd (named name, for messages
 * and lo_file_name) to a loop device (sbx_ws_loop) and mount the fstype file
 * system on it with the one flag option `flag`, nosuid and nodev, as a
 * detached mount (fsopen(2)/fsmount(2)): *mnt (the caller owns it; -1 on
 * failure).  The loop device is freed (AUTOCLEAR) once the mount goes.  0 or
 * -errno with the reason in why (ENOSYS where the new mount API is missing).
 * For the workspace images (ext4) and the workspace pool (xfs, ws_pool.c). */
int sbx_ws_mount_loop(int fd, const char *name, const char *fstype, const char *flag, int *mnt,
                      char *why, size_t whylen);

/* sbx_ws_copy_sparse — copy_file_range(2) of the data extents of in (size
 * bytes; SEEK_DATA/SEEK_HOLE) to the same offsets of out: out stays as
 * sparse as in, and shares in's extents where the file system has
 * reflinks.  *copied grows by the bytes copied.  0 or -errno. */
int sbx_ws_copy_sparse(int in, int out, off_t size, int64_t *copied);

/* sbx_ws_loop_of — the device number of a loop device whose backing file
 * is inode ino of the file system fsdev, or 0 if none. */
dev_t sbx_ws_loop_of(dev_t fsdev, ino_t ino);

/* sbx_ws_thaw_backed_by — FITHAW each mounted file system on a loop device
 * whose backing file is on fsdev (inode ino; 0: any): what a fork cut short
 * by a kill of its shard leaves frozen (docs/persistence.md, "Fork").
 * Returns how many were thawed. */
int sbx_ws_thaw_backed_by(dev_t fsdev, ino_t ino);

/*
 * sbx_ws_import — make img (a fork's image staged elsewhere: fork.c) the
 * image of the workspace dir (made, mode 0700): renamed when both are on
 * one file system, else copied sparse (the workspace pool is a file
 * system of its own: ws_pool.h) to disk.img.fork, synced and renamed;
 * then img is removed.  -EEXIST if dir holds an image already.  Blocking
 * (a copy: ~1 GB/s).  0 or -errno with the reason in why.
 */
int sbx_ws_import(const char *img, const char *dir, char *why, size_t whylen);

#endif
