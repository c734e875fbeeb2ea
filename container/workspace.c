/*
 * workspace.c — persistent workspaces on per-sandbox ext4 images
 * (workspace.h; design and measurements in docs/persistence.md).
 */
#include "workspace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <linux/loop.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/util.h"

extern char **environ;

int
sbx_ws_dir(const char *data, const char *id, char *buf, size_t n)
{
    int k = snprintf(buf, n, "%s/workspaces/%s", data, id);
    return k < 0 || (size_t)k >= n ? -ENAMETOOLONG : 0;
}

/* mkfs.ext4 on path: no reserved blocks (the sandbox gets its whole
 * limit), the inode count asked for, tables and journal left for lazy
 * initialisation (the file stays sparse; the mount says noinit_itable).
 * ext4's inode tables are preallocated (256 bytes an inode): the count is
 * at most one per 8 KiB of the size (tmpfs's nr_inodes only caps). */
static int
ws_mkfs(const char *path, uint64_t size, uint64_t inodes, char *why, size_t whylen)
{
    char n[32];
    if (inodes > size / 8192)
        inodes = size / 8192;
    if (inodes < 1024)
        inodes = 1024;
    snprintf(n, sizeof(n), "%llu", (unsigned long long)inodes);
    char *argv[] = {"mkfs.ext4", "-q", "-F", "-m", "0", "-N", n, "-E",
                    "lazy_itable_init=1,lazy_journal_init=1,root_owner=0:0",
                    (char *)path, NULL};
    return sbx_ws_run_tool(argv, "e2fsprogs", SBX_WS_TOOL_MS, why, whylen);
}

/* Wait for pidfd to become readable (the process ended) for at most ms:
 * 1 ended, 0 not by then, or -errno. */
static int
ws_pidfd_wait(int pidfd, int64_t ms)
{
    int64_t until = sbx_mono_ms() + ms;
    for (;;) {
        int64_t left = until - sbx_mono_ms();
        struct pollfd p = {pidfd, POLLIN, 0};
        int n = poll(&p, 1, (int)SBX_MAX(left, (int64_t)0));
        if (n > 0)
            return 1;
        if (n == 0)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

int
sbx_ws_run_tool(char *const argv[], const char *package, int64_t timeout_ms, char *why,
                size_t whylen)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc) {
        snprintf(why, whylen, "run %s (%s): %s", argv[0], package, strerror(rc));
        return -rc;
    }
    /* Bounded (a hung disk or kernel can keep mkfs forever): a pidfd polled
     * until the deadline, then SIGKILL and 5 s more for it to die; one that
     * does not (uninterruptible sleep) is left unreaped, logged. */
    int pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (pidfd >= 0) {
        int ended = ws_pidfd_wait(pidfd, timeout_ms);
        if (ended == 0) {
            syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
            ended = ws_pidfd_wait(pidfd, 5000);
            close(pidfd);
            if (ended == 1)
                while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
                    ;
            else
                sbx_log_warn("workspace: %s (pid %d) did not die after SIGKILL; left unreaped",
                             argv[0], (int)pid);
            snprintf(why, whylen, "%s did not end within %lld ms (killed)", argv[0],
                     (long long)timeout_ms);
            return -ETIMEDOUT;
        }
        close(pidfd);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) {
            rc = -errno;
            snprintf(why, whylen, "wait for %s: %s", argv[0], strerror(-rc));
            return rc;
        }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        int n = snprintf(why, whylen, "%s", argv[0]);
        for (int i = 1; argv[i] && n >= 0 && (size_t)n < whylen; i++)
            n += snprintf(why + n, whylen - (size_t)n, " %s", argv[i]);
        if (n >= 0 && (size_t)n < whylen)
            snprintf(why + n, whylen - (size_t)n, " failed (status %d)", st);
        return -EIO;
    }
    return 0;
}

/* Create dir/disk.img as a formatted sparse file of size bytes (written
 * under a temporary name, renamed when complete). */
static int
ws_create(const char *dir, const char *img, uint64_t size, uint64_t inodes, char *why,
          size_t whylen)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s/disk.img.new", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || ftruncate(fd, (off_t)size) < 0) {
        int e = errno;
        snprintf(why, whylen, "create %s: %s", tmp, strerror(e));
        if (fd >= 0)
            close(fd);
        return -e;
    }
    close(fd);
    int rc = ws_mkfs(tmp, size, inodes, why, whylen);
    if (rc == 0 && rename(tmp, img) < 0) {
        rc = -errno;
        snprintf(why, whylen, "rename %s: %s", tmp, strerror(errno));
    }
    if (rc)
        unlink(tmp);
    return rc;
}

int
sbx_ws_loop(int imgfd, const char *img, int *loopfd, char *dev, size_t devlen, char *why,
        size_t whylen)
{
    int ctl = open("/dev/loop-control", O_RDWR | O_CLOEXEC);
    if (ctl < 0) {
        int e = errno;
        snprintf(why, whylen, "open /dev/loop-control: %s", strerror(e));
        return -e;
    }
    int rc = -EBUSY;
    /* Another process may take the free device between the two calls. */
    for (int tries = 0; tries < 32 && rc == -EBUSY; tries++) {
        int n = ioctl(ctl, LOOP_CTL_GET_FREE);
        if (n < 0) {
            rc = -errno;
            snprintf(why, whylen, "no free loop device: %s", strerror(errno));
            break;
        }
        snprintf(dev, devlen, "/dev/loop%d", n);
        int fd = open(dev, O_RDWR | O_CLOEXEC);
        if (fd < 0) {
            rc = errno == ENOENT ? -EBUSY : -errno; /* ENOENT: its node is not there yet */
            if (rc != -EBUSY)
                snprintf(why, whylen, "open %s: %s", dev, strerror(-rc));
            continue;
        }
        struct loop_config cfg;
        memset(&cfg, 0, sizeof(cfg));
        cfg.fd = (uint32_t)imgfd;
        cfg.info.lo_flags = LO_FLAGS_AUTOCLEAR;
        snprintf((char *)cfg.info.lo_file_name, sizeof(cfg.info.lo_file_name), "%s", img);
        if (ioctl(fd, LOOP_CONFIGURE, &cfg) == 0) {
            *loopfd = fd;
            rc = 0;
            break;
        }
        rc = -errno;
        close(fd);
        if (rc != -EBUSY)
            snprintf(why, whylen, "LOOP_CONFIGURE %s: %s", dev, strerror(-rc));
    }
    if (rc == -EBUSY)
        snprintf(why, whylen, "no loop device could be configured (busy)");
    close(ctl);
    return rc;
}

#ifndef FIFREEZE /* <linux/fs.h>, which clashes with <sys/mount.h> */
#define FIFREEZE _IOWR('X', 119, int)
#define FITHAW _IOWR('X', 120, int)
#endif

/* Calls fn(rdev of /dev/loopN, arg) for each loop device whose backing
 * file is on the file system fsdev (and is inode ino, unless ino is 0),
 * asked of each device (LOOP_GET_STATUS64: the backing file's device and
 * inode; paths in /sys/block/loopN/loop/backing_file are ambiguous for
 * files of a detached mount such as the workspace pool's). */
static void
ws_loops_backed_by(dev_t fsdev, ino_t ino, void (*fn)(dev_t, void *), void *arg)
{
    glob_t g;
    if (glob("/dev/loop[0-9]*", 0, NULL, &g) != 0)
        return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        int fd = open(g.gl_pathv[i], O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        struct loop_info64 li;
        struct stat st;
        if (fd < 0)
            continue;
        if (ioctl(fd, LOOP_GET_STATUS64, &li) == 0 && fstat(fd, &st) == 0 &&
            li.lo_device == (uint64_t)fsdev && (ino == 0 || li.lo_inode == (uint64_t)ino))
            fn(st.st_rdev, arg);
        close(fd);
    }
    globfree(&g);
}

/* fn for ws_loops_backed_by: FITHAW the file system on loop device rdev
 * through a process that has it mounted (/proc/<pid>/root<mount point>);
 * *(int *)arg counts the thaws. */
static void
ws_thaw_dev(dev_t rdev, void *arg)
{
    char dev[32];
    snprintf(dev, sizeof(dev), "%u:%u", major(rdev), minor(rdev));
    DIR *d = opendir("/proc");
    bool thawed = false;
    struct dirent *de;
    while (!thawed && d && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        char p[300], line[8192];
        snprintf(p, sizeof(p), "/proc/%s/mountinfo", de->d_name);
        FILE *f = fopen(p, "re");
        while (f && !thawed && fgets(line, sizeof(line), f)) {
            /* id parent major:minor root mount-point … */
            char mm[32], mp[4096];
            if (sscanf(line, "%*s %*s %31s %*s %4095s", mm, mp) != 2 || strcmp(mm, dev) != 0)
                continue;
            char path[4500];
            snprintf(path, sizeof(path), "/proc/%s/root%s", de->d_name, mp);
            int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (fd >= 0 && ioctl(fd, FITHAW, 0) == 0)
                thawed = true;
            if (fd >= 0)
                close(fd);
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    if (thawed)
        (*(int *)arg)++;
}

int
sbx_ws_thaw_backed_by(dev_t fsdev, ino_t ino)
{
    int n = 0;
    ws_loops_backed_by(fsdev, ino, ws_thaw_dev, &n);
    return n;
}

/* fn for ws_loops_backed_by: the device's number into *(dev_t *)arg. */
static void
ws_rdev(dev_t rdev, void *arg)
{
    *(dev_t *)arg = rdev;
}

dev_t
sbx_ws_loop_of(dev_t fsdev, ino_t ino)
{
    dev_t r = 0;
    ws_loops_backed_by(fsdev, ino, ws_rdev, &r);
    return r;
}

/*
 * A previous mount of img that does not go away may be frozen: a shard
 * killed during a fork's copy (sbx_ws_fork) leaves the file system frozen,
 * the container's writers blocked in the kernel where their SIGKILL cannot
 * end them, so the mount, the loop device and the image's lock stay.  Find
 * the mount through a process that has it and thaw it: the writers then
 * die, and the rest goes as usual.  Returns whether one was thawed.
 */
static bool
ws_thaw_stale(int imgfd, const char *img)
{
    struct stat st;
    if (fstat(imgfd, &st) != 0 || sbx_ws_thaw_backed_by(st.st_dev, st.st_ino) == 0)
        return false;
    sbx_log_warn("workspace %s was left frozen (a fork cut short): thawed it", img);
    return true;
}

int
sbx_ws_mount(const char *dir, uint64_t size, uint64_t inodes, int *mnt_fd, bool *created,
             char *why, size_t whylen)
{
    char img[4200];
    int imgfd = -1, rc = 0;
    *mnt_fd = -1;
    *created = false;
    if ((rc = sbx_mkdir_p(dir, 0700)) != 0) {
        snprintf(why, whylen, "mkdir %s: %s", dir, strerror(-rc));
        return rc;
    }
    snprintf(img, sizeof(img), "%s/disk.img", dir);
    if (access(img, F_OK) < 0) {
        if ((rc = ws_create(dir, img, size, inodes, why, whylen)) != 0)
            return rc;
        *created = true;
    }
    imgfd = open(img, O_RDWR | O_CLOEXEC);
    if (imgfd < 0) {
        rc = -errno;
        snprintf(why, whylen, "open %s: %s", img, strerror(errno));
        goto out;
    }
    /* One mount at a time: the previous container's loop device keeps this
     * lock (on its open file) until the kernel has let the mount go. */
    for (int i = 0; flock(imgfd, LOCK_EX | LOCK_NB) < 0; i++) {
        if (errno != EWOULDBLOCK || i >= 1000) {
            rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
            snprintf(why, whylen, "the workspace %s is still in use", dir);
            goto out;
        }
        if (i == 40) /* 200 ms: more than a container's teardown takes */
            ws_thaw_stale(imgfd, img);
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
    rc = sbx_ws_mount_loop(imgfd, img, "ext4", "noinit_itable", mnt_fd, why, whylen);
out:
    if (imgfd >= 0)
        close(imgfd); /* the loop device holds the file (and its lock) */
    return rc;
}

int
sbx_ws_mount_loop(int fd, const char *name, const char *fstype, const char *flag, int *mnt,
                  char *why, size_t whylen)
{
    char dev[64];
    int loopfd = -1, fs = -1;
    *mnt = -1;
    int rc = sbx_ws_loop(fd, name, &loopfd, dev, sizeof(dev), why, whylen);
    if (rc)
        return rc;
    fs = fsopen(fstype, FSOPEN_CLOEXEC);
    if (fs < 0 || fsconfig(fs, FSCONFIG_SET_STRING, "source", dev, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_FLAG, flag, NULL, 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0) {
        rc = -errno;
        snprintf(why, whylen, "mount %s (%s on %s): %s", name, fstype, dev, strerror(-rc));
        goto out;
    }
    *mnt = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (*mnt < 0) {
        rc = -errno;
        snprintf(why, whylen, "fsmount %s: %s", name, strerror(-rc));
    }
out:
    if (fs >= 0)
        close(fs);
    close(loopfd); /* the mount holds the device now; AUTOCLEAR after it */
    return rc;
}

/* Copy the data extents of in (size bytes) to out at the same offsets
 * (out is already size bytes long, all hole); *copied adds the bytes. */
/* pread/pwrite of up to n bytes at off, 1 MiB at a time: bytes copied,
 * or -1 with errno. */
static ssize_t
ws_copy_buf(int in, off_t off, int out, size_t n)
{
    size_t bs = 1 << 20;
    char *buf = malloc(bs);
    ssize_t done = 0;
    if (!buf)
        return -1;
    while ((size_t)done < n) {
        ssize_t k = pread(in, buf, SBX_MIN(bs, n - (size_t)done), off + done);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        ssize_t w = 0;
        while (w < k) {
            ssize_t m = pwrite(out, buf + w, (size_t)(k - w), off + done + w);
            if (m < 0 && errno == EINTR)
                continue;
            if (m <= 0)
                break;
            w += m;
        }
        if (w < k)
            break;
        done += k;
    }
    free(buf);
    return done > 0 ? done : -1;
}

int
sbx_ws_copy_sparse(int in, int out, off_t size, int64_t *copied)
{
    off_t pos = 0;
    while (pos < size) {
        off_t data = lseek(in, pos, SEEK_DATA);
        if (data < 0)
            return errno == ENXIO ? 0 : -errno; /* ENXIO: no data past pos */
        off_t hole = lseek(in, data, SEEK_HOLE);
        if (hole < 0)
            return -errno;
        loff_t ip = data, op = data;
        while (ip < hole) {
            ssize_t k = copy_file_range(in, &ip, out, &op, (size_t)(hole - ip), 0);
            if (k < 0 && errno == EINTR)
                continue;
            if (k < 0 && errno == EXDEV) {
                /* Between two file systems of different types (the host's
                 * and the workspace pool: Linux ≥ 5.19 refuses): by hand. */
                if ((k = ws_copy_buf(in, ip, out, (size_t)(hole - ip))) > 0) {
                    ip += k;
                    op += k;
                }
            }
            if (k < 0)
                return -errno;
            if (k == 0)
                return -EIO; /* the source shrank under us */
            *copied += k;
        }
        pos = hole;
    }
    return 0;
}

int
sbx_ws_tmpfs(uint64_t size, uint64_t inodes, int *mnt_fd, char *why, size_t whylen)
{
    int rc = 0;
    char n[32];
    *mnt_fd = -1;
    int fs = fsopen("tmpfs", FSOPEN_CLOEXEC);
    if (fs < 0) {
        rc = -errno;
        snprintf(why, whylen, "fsopen tmpfs: %s", strerror(errno));
        goto out;
    }
    snprintf(n, sizeof(n), "%llu", (unsigned long long)size);
    if (fsconfig(fs, FSCONFIG_SET_STRING, "size", n, 0) < 0)
        goto fail;
    snprintf(n, sizeof(n), "%llu", (unsigned long long)inodes);
    if (fsconfig(fs, FSCONFIG_SET_STRING, "nr_inodes", n, 0) < 0 ||
        fsconfig(fs, FSCONFIG_SET_STRING, "mode", "0755", 0) < 0 ||
        fsconfig(fs, FSCONFIG_CMD_CREATE, NULL, NULL, 0) < 0)
        goto fail;
    *mnt_fd = fsmount(fs, FSMOUNT_CLOEXEC, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
    if (*mnt_fd >= 0)
        goto out;
fail:
    rc = -errno;
    snprintf(why, whylen, "mount the workspace's tmpfs (size=%llu): %s",
             (unsigned long long)size, strerror(errno));
out:
    if (fs >= 0)
        close(fs);
    return rc;
}

/* One fork: dst/disk.img.fork from in, renamed to dst/disk.img. */
static int
ws_fork_one(int in, off_t size, const char *dst, int64_t *copied, char *why, size_t whylen)
{
    char tmp[4200], img[4200];
    int rc = sbx_mkdir_p(dst, 0700);
    if (rc) {
        snprintf(why, whylen, "mkdir %s: %s", dst, strerror(-rc));
        return rc;
    }
    snprintf(tmp, sizeof(tmp), "%s/disk.img.fork", dst);
    snprintf(img, sizeof(img), "%s/disk.img", dst);
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (out < 0 || ftruncate(out, size) < 0) {
        rc = -errno;
        snprintf(why, whylen, "create %s: %s", tmp, strerror(-rc));
        goto out;
    }
    *copied = 0;
    if ((rc = sbx_ws_copy_sparse(in, out, size, copied)) != 0) {
        snprintf(why, whylen, "copy the workspace image to %s: %s", tmp, strerror(-rc));
        goto out;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, img, RENAME_NOREPLACE) < 0) {
        rc = -errno;
        snprintf(why, whylen, "rename %s: %s", tmp, strerror(-rc));
    }
out:
    if (out >= 0)
        close(out);
    if (rc)
        unlink(tmp);
    return rc;
}

int
sbx_ws_fork(const char *src_dir, int src_mnt_fd, const char *const *dst_dirs, size_t n,
            int64_t *copied, int64_t *frozen_ms, char *why, size_t whylen)
{
    char img[4200];
    int in = -1, root = -1, rc = 0;
    bool frozen = false;
    size_t made = 0;
    *copied = 0;
    *frozen_ms = 0;
    snprintf(img, sizeof(img), "%s/disk.img", src_dir);
    in = open(img, O_RDONLY | O_CLOEXEC);
    if (in < 0) {
        rc = -errno;
        snprintf(why, whylen, "open %s: %s", img, strerror(-rc));
        goto out;
    }
    if (src_mnt_fd >= 0) {
        root = openat(src_mnt_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (root < 0 || ioctl(root, FIFREEZE, 0) < 0) {
            rc = -errno;
            snprintf(why, whylen, "freeze the workspace %s: %s", src_dir, strerror(-rc));
            goto out;
        }
        frozen = true;
    } else {
        /* Not mounted: hold the lock a mount takes (sbx_ws_mount). */
        for (int i = 0; flock(in, LOCK_EX | LOCK_NB) < 0; i++) {
            if (errno != EWOULDBLOCK || i >= 1000) {
                rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
                snprintf(why, whylen, "the workspace %s is still in use", src_dir);
                goto out;
            }
            nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
        }
    }
    struct stat st;
    if (fstat(in, &st) < 0) {
        rc = -errno;
        snprintf(why, whylen, "stat %s: %s", img, strerror(-rc));
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        char first[4200];
        struct stat dst;
        snprintf(first, sizeof(first), "%s/disk.img", dst_dirs[i]);
        if (stat(first, &dst) == 0) {
            rc = -EEXIST;
            snprintf(why, whylen, "%s exists already", first);
            goto out;
        }
    }
    int64_t t0 = sbx_mono_ms();
    for (; made < n; made++) {
        int src = in;
        char first[4200];
        if (made > 0) {
            /* The source is thawed: the other forks copy the first. */
            snprintf(first, sizeof(first), "%s/disk.img", dst_dirs[0]);
            if ((src = open(first, O_RDONLY | O_CLOEXEC)) < 0) {
                rc = -errno;
                snprintf(why, whylen, "open %s: %s", first, strerror(-rc));
                goto out;
            }
        }
        rc = ws_fork_one(src, st.st_size, dst_dirs[made], copied, why, whylen);
        if (src != in)
            close(src);
        if (rc) {
            rmdir(dst_dirs[made]); /* only if empty: never another's image */
            goto out;
        }
        if (made == 0 && frozen) {
            frozen = false;
            *frozen_ms = sbx_mono_ms() - t0;
            if (ioctl(root, FITHAW, 0) < 0) {
                rc = -errno;
                snprintf(why, whylen, "thaw the workspace %s: %s", src_dir, strerror(-rc));
                made++;
                goto out;
            }
        }
    }
out:
    if (frozen && ioctl(root, FITHAW, 0) < 0 && rc == 0) {
        rc = -errno;
        snprintf(why, whylen, "thaw the workspace %s: %s", src_dir, strerror(-rc));
    }
    if (rc)
        for (size_t i = 0; i < made; i++)
            sbx_rm_rf(dst_dirs[i]);
    if (root >= 0)
        close(root);
    if (in >= 0)
        close(in); /* and its flock */
    return rc;
}

int
sbx_ws_import(const char *img, const char *dir, char *why, size_t whylen)
{
    char dst[4200], tmp[4200];
    int in = -1, out = -1, rc = sbx_mkdir_p(dir, 0700);
    if (rc) {
        snprintf(why, whylen, "mkdir %s: %s", dir, strerror(-rc));
        return rc;
    }
    snprintf(dst, sizeof(dst), "%s/disk.img", dir);
    snprintf(tmp, sizeof(tmp), "%s/disk.img.fork", dir);
    if (renameat2(AT_FDCWD, img, AT_FDCWD, dst, RENAME_NOREPLACE) == 0)
        return 0;
    if (errno != EXDEV) {
        rc = -errno;
        snprintf(why, whylen, "rename %s to %s: %s", img, dst, strerror(-rc));
        return rc;
    }
    struct stat st;
    int64_t copied = 0;
    if ((in = open(img, O_RDONLY | O_CLOEXEC)) < 0 || fstat(in, &st) < 0 ||
        (out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 ||
        ftruncate(out, st.st_size) < 0) {
        rc = -errno;
        snprintf(why, whylen, "copy %s to %s: %s", img, tmp, strerror(-rc));
        goto out;
    }
    if ((rc = sbx_ws_copy_sparse(in, out, st.st_size, &copied)) != 0 ||
        (fsync(out) < 0 && (rc = -errno))) {
        snprintf(why, whylen, "copy %s to %s: %s", img, tmp, strerror(-rc));
        goto out;
    }
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, dst, RENAME_NOREPLACE) < 0) {
        rc = -errno;
        snprintf(why, whylen, "rename %s: %s", tmp, strerror(-rc));
        goto out;
    }
    unlink(img);
out:
    if (in >= 0)
        close(in);
    if (out >= 0)
        close(out);
    if (rc && out >= 0)
        unlink(tmp);
    return rc;
}

int
sbx_ws_remove(const char *dir)
{
    int rc = sbx_rm_rf(dir);
    return rc == -ENOENT ? 0 : rc;
}

int64_t
sbx_ws_allocated(const char *dir)
{
    char img[4200];
    struct stat st;
    snprintf(img, sizeof(img), "%s/disk.img", dir);
    if (stat(img, &st) < 0)
        return -errno;
    return (int64_t)st.st_blocks * 512;
}

int
sbx_ws_sweep(const char *data, bool (*exists)(const char *id, void *arg), void *arg)
{
    char top[4200];
    snprintf(top, sizeof(top), "%s/workspaces", data);
    DIR *d = opendir(top);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        if (exists(de->d_name, arg))
            continue;
        char dir[4200], img[4300], snap[4300];
        /* Only a snapshot another node sent (ws_xfer.h): its sandbox's
         * record is on that node; kept for a failover. */
        snprintf(img, sizeof(img), "%s/%s/disk.img", top, de->d_name);
        snprintf(snap, sizeof(snap), "%s/%s/snap.img", top, de->d_name);
        if (access(img, F_OK) != 0 && access(snap, F_OK) == 0)
            continue;
        if (sbx_ws_dir(data, de->d_name, dir, sizeof(dir)) == 0 && sbx_ws_remove(dir) == 0)
            n++;
    }
    closedir(d);
    return n;
}
