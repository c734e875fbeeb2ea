/*
 * ws_pool.c — the shard's XFS workspace pool (ws_pool.h; design and
 * measurements in docs/persistence.md, "The workspace pool").
 */
#include "ws_pool.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/util.h"
#include "workspace.h"

struct sbx_wspool {
    char file[4200];   /* <data>/wspool.img */
    char link[4200];   /* <data>/workspaces */
    char target[4300]; /* what the link names: /proc/<pid>/fd/<mnt>, or <node>/<name> */
    int mnt;           /* the pool's detached mount (owned) */
    uint64_t size;     /* bytes of the pool file */
    char node[4200];   /* attached (sbx_wspool_attach): the node pool's root; "" if ours */
    pthread_t trimmer; /* FITRIM after destroys (pool_trimmer) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int64_t due[2];    /* under mu: when the next two trims are due (mono ms; 0: none) */
    bool stop;         /* under mu */
};

/* 0: reflinks work in dir; 1: they do not (the errors FICLONE gives on a
 * file system without them); else -errno. */
static int
pool_probe(const char *dir, char *why, size_t whylen)
{
    char a[4300], b[4300], blk[4096];
    int fa = -1, fb = -1, rc = 0;
    snprintf(a, sizeof(a), "%s/.reflink-probe-%d-a", dir, (int)getpid());
    snprintf(b, sizeof(b), "%s/.reflink-probe-%d-b", dir, (int)getpid());
    memset(blk, 'x', sizeof(blk));
    if ((fa = open(a, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 ||
        (fb = open(b, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 ||
        sbx_write_full(fa, blk, sizeof(blk)) != 0 || fsync(fa) < 0) {
        rc = -errno;
        snprintf(why, whylen, "probe reflinks in %s: %s", dir, strerror(-rc));
        goto out;
    }
    if (ioctl(fb, FICLONE, fa) < 0) {
        int e = errno;
        if (e == EOPNOTSUPP || e == EXDEV || e == EINVAL || e == ENOTTY || e == EPERM) {
            rc = 1;
        } else {
            rc = -e;
            snprintf(why, whylen, "probe reflinks in %s (FICLONE): %s", dir, strerror(e));
        }
    }
out:
    if (fa >= 0)
        close(fa);
    if (fb >= 0)
        close(fb);
    unlink(a);
    unlink(b);
    return rc;
}

/* mkfs.xfs with reflinks on file (-K: no discard of the sparse file). */
static int
pool_mkfs(const char *file, char *why, size_t whylen)
{
    char *argv[] = {"mkfs.xfs", "-q", "-f", "-K", "-m", "reflink=1", (char *)file, NULL};
    return sbx_ws_run_tool(argv, "xfsprogs, tools/deps.sh", SBX_WS_TOOL_MS, why, whylen);
}

/* Make the pool file: sparse, size bytes (0: data's free space), formatted
 * as <file>.new and renamed when complete. */
static int
pool_make(const char *data, const char *file, uint64_t size, char *why, size_t whylen)
{
    char tmp[4300];
    struct statvfs vs;
    if (size == 0) {
        if (statvfs(data, &vs) < 0) {
            int e = errno;
            snprintf(why, whylen, "statvfs %s: %s", data, strerror(e));
            return -e;
        }
        size = (uint64_t)vs.f_bavail * vs.f_frsize;
    }
    size &= ~((1ull << 20) - 1);
    if (size < SBX_WSPOOL_MIN) {
        snprintf(why, whylen, "the workspace pool would be %llu MiB, under the %llu MiB XFS "
                 "needs (--ws-pool-size, or free space on %s)",
                 (unsigned long long)(size >> 20), SBX_WSPOOL_MIN >> 20, data);
        return -EFBIG;
    }
    snprintf(tmp, sizeof(tmp), "%s.new", file);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        snprintf(why, whylen, "create %s: %s", tmp, strerror(e));
        if (fd >= 0)
            close(fd);
        unlink(tmp);
        return -e;
    }
    close(fd);
    int rc = pool_mkfs(tmp, why, whylen);
    if (rc == 0 && rename(tmp, file) < 0) {
        rc = -errno;
        snprintf(why, whylen, "rename %s: %s", tmp, strerror(-rc));
    }
    if (rc)
        unlink(tmp);
    return rc;
}

/* Lock the pool file open at fd: a previous incarnation's loop device keeps
 * the lock until the kernel has let its mount go (its sandboxes' images
 * unmounted).  After 200 ms, thaw what a fork cut short left frozen on it
 * (workspace.h, sbx_ws_thaw_backed_by). */
static int
pool_lock(int fd, const char *file, char *why, size_t whylen)
{
    for (int i = 0; flock(fd, LOCK_EX | LOCK_NB) < 0; i++) {
        if (errno != EWOULDBLOCK || i >= 2000) {
            int rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
            snprintf(why, whylen, "the workspace pool %s is still in use (a previous shard's "
                     "sandboxes)", file);
            return rc;
        }
        struct stat st;
        dev_t old;
        if (i == 40 && fstat(fd, &st) == 0 && (old = sbx_ws_loop_of(st.st_dev, st.st_ino)) != 0 &&
            sbx_ws_thaw_backed_by(old, 0) > 0)
            sbx_log_warn("workspace pool %s: thawed a workspace left frozen (a fork cut short)",
                         file);
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
    return 0;
}

/* Attach and mount the pool file open (and locked) at fd: *mnt a detached
 * XFS mount, nosuid, nodev, with `discard`: XFS discards each extent it
 * frees (a destroyed workspace's image, a fork's blocks no longer shared)
 * once the free is committed, and the loop device turns the discard into a
 * hole of the pool file — the host gets the space back.  (A FITRIM after a
 * destroy came too early: the image's blocks are freed only when its loop
 * device lets the file go and XFS has inactivated the inode, both later.) */
static int
pool_mount(int fd, const char *file, int *mnt, char *why, size_t whylen)
{
    char name[4200];
    snprintf(name, sizeof(name), "the workspace pool %s", file);
    return sbx_ws_mount_loop(fd, name, "xfs", "discard", mnt, why, whylen);
}

/* Copy the regular file name of dir src into dir dst of the pool (a
 * sparse copy, synced, written as <name>.mig and renamed). */
static int
pool_copy_file(int src, int dst, const char *name)
{
    char tmp[300];
    int in = -1, out = -1, rc = 0;
    struct stat st;
    int64_t copied = 0;
    snprintf(tmp, sizeof(tmp), "%s.mig", name);
    if ((in = openat(src, name, O_RDONLY | O_CLOEXEC)) < 0 || fstat(in, &st) < 0 ||
        (out = openat(dst, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 ||
        ftruncate(out, st.st_size) < 0) {
        rc = -errno;
        goto out;
    }
    if ((rc = sbx_ws_copy_sparse(in, out, st.st_size, &copied)) != 0)
        goto out;
    if (fsync(out) < 0 || renameat(dst, tmp, dst, name) < 0)
        rc = -errno;
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    return rc;
}

/* Move the workspaces found in the host directory top into the pool: each
 * <id>/ directory's regular files are copied, synced, then <id>/ removed.
 * A start cut short finds the rest still in top and copies them again.
 * Then top itself goes (a stray file: top is renamed aside, with a
 * warning).  With copy_only (top is another pool's root, dropped whole by
 * the caller once everything is copied) nothing of top is removed.
 * Returns how many were moved (copied), or -errno. */
static int
pool_migrate(const char *top, int mnt, bool copy_only, char *why, size_t whylen)
{
    DIR *d = opendir(top);
    int n = 0, rc = 0;
    if (!d)
        return errno == ENOENT ? 0 : -errno;
    struct dirent *de;
    while (rc == 0 && (de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || de->d_type != DT_DIR)
            continue;
        int src = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC), dst = -1;
        if (src < 0 || ((mkdirat(mnt, de->d_name, 0700) < 0 && errno != EEXIST)) ||
            (dst = openat(mnt, de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
            rc = -errno;
            snprintf(why, whylen, "move the workspace %s/%s into the pool: %s", top, de->d_name,
                     strerror(-rc));
        }
        int sfd = rc == 0 ? dup(src) : -1;
        DIR *sd = sfd >= 0 ? fdopendir(sfd) : NULL;
        if (rc == 0 && !sd) {
            rc = -errno;
            snprintf(why, whylen, "read %s/%s: %s", top, de->d_name, strerror(-rc));
            if (sfd >= 0)
                close(sfd);
        }
        struct dirent *fe;
        while (sd && rc == 0 && (fe = readdir(sd)) != NULL) {
            if (fe->d_type != DT_REG)
                continue;
            if ((rc = pool_copy_file(src, dst, fe->d_name)) != 0)
                snprintf(why, whylen, "move %s/%s/%s into the pool: %s", top, de->d_name,
                         fe->d_name, strerror(-rc));
        }
        if (sd)
            closedir(sd);
        if (src >= 0)
            close(src);
        if (dst >= 0) {
            if (rc == 0)
                syncfs(dst);
            close(dst);
        }
        if (rc == 0 && copy_only) {
            n++;
        } else if (rc == 0) {
            char p[4500];
            snprintf(p, sizeof(p), "%s/%s", top, de->d_name);
            if ((rc = sbx_rm_rf(p)) != 0)
                snprintf(why, whylen, "remove %s after its move into the pool: %s", p,
                         strerror(-rc));
            n++;
        }
    }
    closedir(d);
    if (rc || copy_only)
        return rc ? rc : n;
    if (rmdir(top) < 0 && errno != ENOENT) {
        char aside[4300];
        snprintf(aside, sizeof(aside), "%s.host-%lld", top, (long long)time(NULL));
        if (rename(top, aside) < 0) {
            rc = -errno;
            snprintf(why, whylen, "%s is not empty after the move into the pool: %s", top,
                     strerror(-rc));
            return rc;
        }
        sbx_log_warn("workspace pool: %s held files that are no workspace; kept as %s", top,
                     aside);
    }
    return n;
}

/*
 * The trimmer: a destroy asks for two FITRIMs of the whole pool, 1 s and
 * 5 s later (the destroys of a burst share them).  The image's blocks are
 * freed only once its loop device has let the file go (its container's
 * mount torn down) and XFS has inactivated the inode, both after the
 * unlink; a trim before that finds them still in use (seen: the pool file
 * kept them).  FITRIM forces the XFS log, so the mount's `discard` also
 * sends what was freed since; XFS's own log worker would do that within
 * 30 s anyway.
 */
static void *
pool_trimmer(void *arg)
{
    sbx_wspool *p = arg;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        int64_t now = sbx_mono_ms(), next = 0;
        int which = -1;
        for (int i = 0; i < 2; i++)
            if (p->due[i] && (!next || p->due[i] < next)) {
                next = p->due[i];
                which = i;
            }
        if (which < 0) {
            pthread_cond_wait(&p->cv, &p->mu);
            continue;
        }
        if (next > now) {
            sbx_cond_wait_ms(&p->cv, &p->mu, next - now);
            continue;
        }
        p->due[which] = 0;
        pthread_mutex_unlock(&p->mu);
        struct fstrim_range r = {.start = 0, .len = UINT64_MAX, .minlen = 0};
        int64_t t0 = sbx_mono_ms();
        int root = openat(p->mnt, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0 || ioctl(root, FITRIM, &r) < 0)
            sbx_log_warn("workspace pool %s: FITRIM: %s", p->file, strerror(errno));
        else if (sbx_mono_ms() - t0 > 1000)
            sbx_log_info("workspace pool %s: FITRIM took %lld ms", p->file,
                         (long long)(sbx_mono_ms() - t0));
        if (root >= 0)
            close(root);
        pthread_mutex_lock(&p->mu);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void
sbx_wspool_trim_soon(sbx_wspool *p)
{
    if (!p)
        return;
    int64_t now = sbx_mono_ms();
    pthread_mutex_lock(&p->mu);
    if (!p->due[0])
        p->due[0] = now + 1000;
    p->due[1] = now + 5000;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Point the link at p->target (written as <link>.new and renamed over any
 * stale link). */
static int
pool_link(sbx_wspool *p, char *why, size_t whylen)
{
    char tmp[4300];
    snprintf(tmp, sizeof(tmp), "%s.new", p->link);
    unlink(tmp);
    if (symlink(p->target, tmp) < 0 || rename(tmp, p->link) < 0) {
        int e = errno;
        snprintf(why, whylen, "link %s to the pool (%s): %s", p->link, p->target, strerror(e));
        unlink(tmp);
        return -e;
    }
    return 0;
}

/* A pool handle before its open or attach (the caller owns it). */
static sbx_wspool *
pool_new(void)
{
    sbx_wspool *p = sbx_xcalloc(1, sizeof(*p));
    p->mnt = -1;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    return p;
}

/* Free a handle whose open or attach failed (no trimmer started); NULL: no-op. */
static void
pool_discard(sbx_wspool *p)
{
    if (!p)
        return;
    if (p->mnt >= 0)
        close(p->mnt);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

/* The last steps of an open or attach, p->mnt and p->target set: the
 * workspaces still on the host file system (<data>/workspaces a directory)
 * moved into p->mnt, the link, the trimmer.  0 or -errno with why. */
static int
pool_finish(sbx_wspool *p, char *why, size_t whylen)
{
    struct stat st;
    int rc;
    if (lstat(p->link, &st) == 0 && S_ISDIR(st.st_mode)) {
        int moved = pool_migrate(p->link, p->mnt, false, why, whylen);
        if (moved < 0)
            return moved;
        if (moved > 0)
            sbx_log_info("workspace pool %s: moved %d workspaces into %s from the host file "
                         "system", p->file, moved, p->target);
    }
    if ((rc = pool_link(p, why, whylen)) != 0)
        return rc;
    if ((rc = pthread_create(&p->trimmer, NULL, pool_trimmer, p)) != 0) {
        snprintf(why, whylen, "start the pool's trimmer: %s", strerror(rc));
        unlink(p->link);
        return -rc;
    }
    return 0;
}

int
sbx_wspool_open(const char *data, const char *mode, uint64_t size, sbx_wspool **out, char *why,
                size_t whylen)
{
    sbx_wspool *p = pool_new();
    int fd = -1, rc = 0;
    struct stat st;
    *out = NULL;
    snprintf(p->file, sizeof(p->file), "%s/wspool.img", data);
    snprintf(p->link, sizeof(p->link), "%s/workspaces", data);
    bool made = false; /* the pool file is this start's */
    if (!mode)
        mode = "auto";
    if (strcmp(mode, "auto") && strcmp(mode, "on") && strcmp(mode, "off")) {
        snprintf(why, whylen, "--ws-pool must be auto, on or off, not '%s'", mode);
        rc = -EINVAL;
        goto out;
    }
    bool exists = stat(p->file, &st) == 0;
    if (!exists && !strcmp(mode, "off"))
        goto out; /* today's layout: images on the host file system */
    if (exists && !strcmp(mode, "off")) {
        snprintf(why, whylen, "the workspaces are in the pool %s: --ws-pool off would hide "
                 "them (move them out by hand first)", p->file);
        rc = -EEXIST;
        goto out;
    }
    if (!exists) {
        bool islink = lstat(p->link, &st) == 0 && S_ISLNK(st.st_mode);
        if (islink)
            unlink(p->link); /* a link without its pool file: nothing behind it */
        if (!strcmp(mode, "auto")) {
            if ((rc = sbx_mkdir_p(p->link, 0700)) != 0) {
                snprintf(why, whylen, "mkdir %s: %s", p->link, strerror(-rc));
                goto out;
            }
            if ((rc = pool_probe(p->link, why, whylen)) <= 0)
                goto out; /* 0: reflinks here, no pool needed */
            rc = 0;
        }
        if ((rc = pool_make(data, p->file, size, why, whylen)) != 0) {
            /* auto: no mkfs.xfs (xfsprogs), or too little free space for an
             * XFS (a small data directory, such as a test's tmpfs). */
            if (!strcmp(mode, "auto") && (rc == -ENOENT || (rc == -EFBIG && size == 0))) {
                sbx_log_warn("workspace pool not made, workspaces stay on the host file "
                             "system (forks copy their data): %s", why);
                rc = 0;
            }
            goto out;
        }
        made = true;
        sbx_log_info("workspace pool %s made (xfs, reflink=1): the file system of %s has no "
                     "reflinks", p->file, data);
    }
    if ((fd = open(p->file, O_RDWR | O_CLOEXEC)) < 0 || fstat(fd, &st) < 0) {
        rc = -errno;
        snprintf(why, whylen, "open %s: %s", p->file, strerror(-rc));
        goto out;
    }
    p->size = (uint64_t)st.st_size;
    if ((rc = pool_lock(fd, p->file, why, whylen)) == 0)
        rc = pool_mount(fd, p->file, &p->mnt, why, whylen);
    if (rc == 0 && fchmodat(p->mnt, ".", 0700, 0) < 0) { /* root's, as <data>/workspaces */
        rc = -errno;
        snprintf(why, whylen, "chmod the workspace pool's root: %s", strerror(-rc));
        goto out;
    }
    if (rc != 0) {
        /* auto, and the pool is new: a host where it cannot be mounted (no
         * loop devices or no XFS in the kernel, no privilege for them, no
         * fsopen(2)/fsmount(2): Linux < 5.2, or valgrind 3.19, which lacks
         * them — `make valgrind`) keeps the workspaces where they are, as
         * before the pool, and says so. */
        if (made && !strcmp(mode, "auto") &&
            (rc == -EPERM || rc == -EACCES || rc == -ENOENT || rc == -ENODEV || rc == -ENXIO ||
             rc == -ENOSYS || rc == -EOPNOTSUPP)) {
            sbx_log_warn("workspace pool not usable here, workspaces stay on the host file "
                         "system (forks copy their data): %s", why);
            unlink(p->file);
            rc = 0;
        }
        goto out;
    }
    /* Workspaces on the host file system (made before the pool): moved in. */
    snprintf(p->target, sizeof(p->target), "/proc/%d/fd/%d", (int)getpid(), p->mnt);
    if ((rc = pool_finish(p, why, whylen)) != 0)
        goto out;
    *out = p;
    p = NULL;
out:
    if (fd >= 0)
        close(fd); /* the loop device holds the file (and its lock) */
    pool_discard(p);
    return rc;
}

int
sbx_wspool_attach(const char *data, const char *node, const char *name, sbx_wspool **out,
                  char *why, size_t whylen)
{
    sbx_wspool *p = pool_new();
    struct stat st;
    int rc = 0;
    *out = NULL;
    snprintf(p->node, sizeof(p->node), "%s", node);
    snprintf(p->link, sizeof(p->link), "%s/workspaces", data);
    char dir[4300], top[4300];
    snprintf(top, sizeof(top), "%s", node);
    char *slash = strrchr(top, '/');
    if (slash)
        *slash = '\0';
    snprintf(p->file, sizeof(p->file), "%s/wspool.img", slash ? top : ".");
    if (snprintf(dir, sizeof(dir), "%s/%s", node, name) >= (int)sizeof(p->target)) {
        snprintf(why, whylen, "the node pool's path %s/%s is too long", node, name);
        rc = -ENAMETOOLONG;
        goto out;
    }
    snprintf(p->target, sizeof(p->target), "%s", dir);
    if (stat(p->file, &st) < 0) {
        rc = -errno;
        snprintf(why, whylen, "the node's workspace pool %s: %s", p->file, strerror(-rc));
        goto out;
    }
    p->size = (uint64_t)st.st_size;
    if ((mkdir(dir, 0700) < 0 && errno != EEXIST) ||
        (p->mnt = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "the shard's directory %s in the node's pool: %s", dir,
                 strerror(-rc));
        goto out;
    }
    if ((rc = pool_finish(p, why, whylen)) != 0)
        goto out;
    *out = p;
    p = NULL;
out:
    pool_discard(p);
    return rc;
}

/* Bytes of host disk the workspace files under top hold (st_blocks of the
 * regular files of each <id>/ directory, as pool_migrate copies them:
 * shared extents count once per file); stray entries (not a directory, or
 * a dot name) counted in *strays. */
static uint64_t
pool_tree_bytes(const char *top, int *strays)
{
    uint64_t n = 0;
    *strays = 0;
    DIR *d = opendir(top);
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (de->d_name[0] == '.' || de->d_type != DT_DIR) {
            (*strays)++;
            continue;
        }
        int sd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        DIR *s2 = sd >= 0 ? fdopendir(sd) : NULL;
        struct dirent *fe;
        struct stat st;
        while (s2 && (fe = readdir(s2)) != NULL)
            if (fe->d_type == DT_REG && fstatat(dirfd(s2), fe->d_name, &st, 0) == 0)
                n += (uint64_t)st.st_blocks * 512;
        if (s2)
            closedir(s2);
        else if (sd >= 0)
            close(sd);
    }
    closedir(d);
    return n;
}

/* Remove from dst (a directory of the node's pool) the <id>/ directories
 * that top (the old pool's root) has: the copies of an absorb that failed. */
static void
pool_unmigrate(const char *top, const char *dst)
{
    DIR *d = opendir(top);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char p[8600];
        if (de->d_name[0] == '.' || de->d_type != DT_DIR)
            continue;
        snprintf(p, sizeof(p), "%s/%s", dst, de->d_name);
        sbx_rm_rf(p);
    }
    closedir(d);
}

int
sbx_wspool_absorb(const char *data, const char *node, const char *name, char *why,
                  size_t whylen)
{
    char file[4200], dir[4300], top[64];
    int fd = -1, own = -1, dst = -1, rc = 0, strays = 0;
    bool copying = false;
    struct stat st;
    struct statvfs pv, hv;
    snprintf(file, sizeof(file), "%s/wspool.img", data);
    if (stat(file, &st) < 0) {
        if (errno == ENOENT)
            return 0;
        rc = -errno;
        snprintf(why, whylen, "stat %s: %s", file, strerror(-rc));
        return rc;
    }
    if (snprintf(dir, sizeof(dir), "%s/%s", node, name) >= (int)sizeof(dir)) {
        snprintf(why, whylen, "the node pool's path %s/%s is too long", node, name);
        return -ENAMETOOLONG;
    }
    if ((fd = open(file, O_RDWR | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "open %s: %s", file, strerror(-rc));
        goto out;
    }
    if ((rc = pool_lock(fd, file, why, whylen)) != 0 ||
        (rc = pool_mount(fd, file, &own, why, whylen)) != 0)
        goto out;
    if ((mkdir(dir, 0700) < 0 && errno != EEXIST) ||
        (dst = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "the shard's directory %s in the node's pool: %s", dir,
                 strerror(-rc));
        goto out;
    }
    snprintf(top, sizeof(top), "/proc/self/fd/%d", own);
    /* Room for the copies, in the node's pool and on the host under it
     * (the old pool's space comes back only when it is removed at the end),
     * with the pool's reserve to spare: else the move is not begun. */
    uint64_t need = pool_tree_bytes(top, &strays) + SBX_WSPOOL_RESERVE;
    if (fstatvfs(dst, &pv) < 0 || statvfs(data, &hv) < 0) {
        rc = -errno;
        snprintf(why, whylen, "statvfs of the node's pool or of %s: %s", data, strerror(-rc));
        goto out;
    }
    uint64_t pfree = (uint64_t)pv.f_bavail * pv.f_frsize,
             hfree = (uint64_t)hv.f_bavail * hv.f_frsize;
    if (pfree < need || hfree < need) {
        rc = -ENOSPC;
        snprintf(why, whylen, "moving the workspaces of %s needs %llu MiB free; the node's pool "
                 "has %llu MiB, the host file system %llu MiB", file,
                 (unsigned long long)(need >> 20), (unsigned long long)(pfree >> 20),
                 (unsigned long long)(hfree >> 20));
        goto out;
    }
    /* Every workspace copied and synced before anything of the old pool
     * goes: a failure removes the copies and leaves the old pool whole. */
    copying = true;
    int moved = pool_migrate(top, dst, true, why, whylen);
    if (moved < 0) {
        rc = moved;
        goto out;
    }
    if (syncfs(dst) < 0) {
        rc = -errno;
        snprintf(why, whylen, "sync the node's pool: %s", strerror(-rc));
        goto out;
    }
    copying = false;
    if (strays)
        sbx_log_warn("workspace pool %s: %d entries that are no workspace (or staged forks) "
                     "are dropped with it", file, strays);
    close(own);
    own = -1;
    if (unlink(file) < 0) {
        rc = -errno;
        snprintf(why, whylen, "remove %s after its move into the node's pool: %s", file,
                 strerror(-rc));
        goto out;
    }
    sbx_log_info("workspace pool %s: moved %d workspaces into the node's pool (%s), and "
                 "removed it", file, moved, dir);
out:
    if (copying)
        pool_unmigrate(top, dir);
    if (dst >= 0)
        close(dst);
    if (own >= 0)
        close(own); /* the kernel drops the mount, AUTOCLEAR the loop device */
    if (fd >= 0)
        close(fd);
    return rc;
}

void
sbx_wspool_stage_dir(const sbx_wspool *p, char *buf, size_t n)
{
    if (!p || !p->node[0])
        snprintf(buf, n, "%s", "");
    else
        snprintf(buf, n, "%s/.forks", p->node);
}

void
sbx_wspool_close(sbx_wspool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_signal(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->trimmer, NULL);
    /* Only our own link: another incarnation may have replaced it. */
    char cur[4300];
    ssize_t k = readlink(p->link, cur, sizeof(cur) - 1);
    if (k > 0 && (cur[k] = '\0', !strcmp(cur, p->target)))
        unlink(p->link);
    close(p->mnt);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    free(p);
}

int
sbx_wspool_room(sbx_wspool *p, char *why, size_t whylen)
{
    struct statvfs vs;
    if (!p || fstatvfs(p->mnt, &vs) < 0)
        return 0;
    uint64_t avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    if (avail < SBX_WSPOOL_RESERVE) {
        snprintf(why, whylen, "the shard's workspace pool %s is full: %llu MiB free of %llu MiB, "
                 "under the %llu MiB a new workspace needs",
                 p->file, (unsigned long long)(avail >> 20),
                 (unsigned long long)(((uint64_t)vs.f_blocks * vs.f_frsize) >> 20),
                 SBX_WSPOOL_RESERVE >> 20);
        return -ENOSPC;
    }
    /* The pool file is sparse: the host file system under it must have the
     * room too, or the pool's writes would fail there (as I/O errors inside
     * the sandboxes).  A new workspace or fork is refused before that. */
    if (statvfs(p->file, &vs) < 0)
        return 0;
    avail = (uint64_t)vs.f_bavail * vs.f_frsize;
    if (avail >= SBX_WSPOOL_RESERVE)
        return 0;
    snprintf(why, whylen, "the host file system under the workspace pool %s is full: %llu MiB "
             "free, under the %llu MiB a new workspace needs",
             p->file, (unsigned long long)(avail >> 20), SBX_WSPOOL_RESERVE >> 20);
    return -ENOSPC;
}

int
sbx_wspool_space(sbx_wspool *p, uint64_t *pool, uint64_t *host)
{
    struct statvfs vs;
    if (fstatvfs(p->mnt, &vs) < 0)
        return -errno;
    *pool = (uint64_t)vs.f_bavail * vs.f_frsize;
    if (statvfs(p->file, &vs) < 0)
        return -errno;
    *host = (uint64_t)vs.f_bavail * vs.f_frsize;
    return 0;
}

void
sbx_wspool_describe(sbx_wspool *p, char *buf, size_t n)
{
    struct statvfs vs;
    if (!p) {
        snprintf(buf, n, "workspaces on the host file system");
        return;
    }
    uint64_t avail = fstatvfs(p->mnt, &vs) == 0 ? (uint64_t)vs.f_bavail * vs.f_frsize : 0;
    snprintf(buf, n, "workspace pool %s (xfs, %llu MiB, %llu MiB free; %s%s)", p->file,
             (unsigned long long)(p->size >> 20), (unsigned long long)(avail >> 20),
             p->node[0] ? "the node's, this shard's part " : "", p->target);
}
