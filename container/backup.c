/*
 * backup.c — a sandbox directory's archive, made and extracted inside the
 * sandbox's namespaces, and the node's content-addressed backup store.
 * See backup.h and docs/persistence.md, "Backups".
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <jansson.h>
#include <nettle/sha2.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/util.h"
#include "backup.h"
#include "backup_ignore.h"

/* ------------------------------------------------------------------------------ */
/* The child: inside the sandbox's namespaces. */

/* What a child reports on its pipe: a code and a message. */
struct child_msg {
    int code;
    char msg[512];
};

static int
child_fail(int pfd, int code, const char *fmt, ...)
{
    struct child_msg m = {.code = code};
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(m.msg, sizeof(m.msg), fmt, ap);
    va_end(ap);
    ssize_t w = write(pfd, &m, sizeof(m));
    (void)w;
    return 1;
}

/* Join the sandbox of agent pid: its user and mount namespaces, its root,
 * uid/gid 0 there.  The descriptors were opened by the parent, the shard
 * (pid parent), whose death ends this process. */
static int
child_enter(int userns, int mntns, int rootfd, int pfd, pid_t parent)
{
    if (setns(userns, CLONE_NEWUSER) != 0)
        return child_fail(pfd, SBX_E_INTERNAL, "setns(user): %s", strerror(errno));
    if (setns(mntns, CLONE_NEWNS) != 0)
        return child_fail(pfd, SBX_E_INTERNAL, "setns(mnt): %s", strerror(errno));
    if (fchdir(rootfd) != 0 || chroot(".") != 0 || chdir("/") != 0)
        return child_fail(pfd, SBX_E_INTERNAL, "chroot to the sandbox's root: %s",
                          strerror(errno));
    if (setgroups(0, NULL) != 0 || setresgid(0, 0, 0) != 0 || setresuid(0, 0, 0) != 0)
        return child_fail(pfd, SBX_E_INTERNAL, "become the sandbox's root: %s", strerror(errno));
    /* The change of credentials cleared the parent-death signal (prctl(2)):
     * armed again, then a parent that died meanwhile is seen (adopted by
     * init, or by a subreaper: either way not the shard). */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        return child_fail(pfd, SBX_E_INTERNAL, "the shard is gone");
    return 0;
}

static int
dir_code(int e)
{
    return e == ENOTDIR ? -ENOTDIR : e == ENOENT ? -ENOENT : SBX_E_INTERNAL;
}

/* The path of a walked entry relative to the walk's root ("./a/b" → "a/b";
 * "." → ""). */
static const char *
rel_path(struct archive_entry *e)
{
    const char *p = archive_entry_pathname(e);
    if (!p)
        return "";
    if (p[0] == '.' && p[1] == '\0')
        return "";
    if (p[0] == '.' && p[1] == '/')
        p += 2;
    return p;
}

static int
child_pack(const char *dir, char *const *excludes, size_t nex, bool gitignore, int out_fd, int pfd)
{
    struct stat st;
    if (stat(dir, &st) != 0)
        return child_fail(pfd, dir_code(errno), "%s", dir);
    if (!S_ISDIR(st.st_mode))
        return child_fail(pfd, -ENOTDIR, "%s: not a directory", dir);
    if (chdir(dir) != 0)
        return child_fail(pfd, dir_code(errno), "%s", dir);
    struct archive *disk = archive_read_disk_new();
    struct archive *out = archive_write_new();
    struct archive *match = archive_match_new();
    struct archive_entry *e = archive_entry_new();
    char *buf = malloc(1 << 16);
    sbx_gi *gi = NULL;
    int rc = 0;
    if (!disk || !out || !match || !e || !buf || (gitignore && sbx_gi_open(dir, &gi) != 0)) {
        rc = child_fail(pfd, SBX_E_INTERNAL, "out of memory");
        goto out;
    }
    for (size_t i = 0; i < nex; i++)
        if (archive_match_exclude_pattern(match, excludes[i]) != ARCHIVE_OK) {
            rc = child_fail(pfd, SBX_E_VALIDATION, "exclude '%s': %s", excludes[i],
                            archive_error_string(match));
            goto out;
        }
    archive_read_disk_set_symlink_physical(disk);
    archive_read_disk_set_behavior(disk, ARCHIVE_READDISK_NO_TRAVERSE_MOUNTS |
                                             ARCHIVE_READDISK_NO_XATTR |
                                             ARCHIVE_READDISK_NO_FFLAGS);
    archive_read_disk_set_matching(disk, match, NULL, NULL);
    archive_write_set_format_pax_restricted(out);
    if (archive_write_add_filter_zstd(out) != ARCHIVE_OK ||
        archive_write_open_fd(out, out_fd) != ARCHIVE_OK) {
        rc = child_fail(pfd, SBX_E_INTERNAL, "archive: %s", archive_error_string(out));
        goto out;
    }
    if (archive_read_disk_open(disk, ".") != ARCHIVE_OK) {
        rc = child_fail(pfd, SBX_E_INTERNAL, "%s: %s", dir, archive_error_string(disk));
        goto out;
    }
    for (;;) {
        archive_entry_clear(e);
        int r = archive_read_next_header2(disk, e);
        if (r == ARCHIVE_EOF)
            break;
        if (r < ARCHIVE_WARN) {
            rc = child_fail(pfd, SBX_E_INTERNAL, "%s: %s", dir, archive_error_string(disk));
            goto out;
        }
        /* An ignored directory is neither stored nor entered. */
        if (gi && sbx_gi_ignored(gi, rel_path(e), archive_entry_filetype(e) == AE_IFDIR))
            continue;
        archive_read_disk_descend(disk);
        if (archive_write_header(out, e) < ARCHIVE_WARN)
            goto werr;
        if (archive_entry_filetype(e) != AE_IFREG || archive_entry_size(e) == 0)
            continue;
        /* O_NONBLOCK, then a regular file or nothing: the sandbox runs while
         * it is packed, and a FIFO put in the file's place after the walk's
         * lstat would block this open (or the read) for as long as the
         * sandbox likes, its input gate closed behind the backup.  What is
         * no longer a regular file is stored as zeros of the header's size
         * (a file changed during the backup). */
        int fd = open(archive_entry_sourcepath(e), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
        struct stat fst;
        if (fd >= 0 && (fstat(fd, &fst) != 0 || !S_ISREG(fst.st_mode))) {
            close(fd);
            continue;
        }
        if (fd < 0) {
            rc = child_fail(pfd, SBX_E_INTERNAL, "%s/%s: %s", dir, archive_entry_pathname(e),
                            strerror(errno));
            goto out;
        }
        /* Exactly the size in the header: a file that grows or shrinks
         * meanwhile is cut or padded with zeros by libarchive. */
        int64_t left = archive_entry_size(e);
        ssize_t n;
        while (left > 0 && (n = read(fd, buf, 1 << 16)) > 0) {
            if (n > left)
                n = (ssize_t)left;
            if (archive_write_data(out, buf, (size_t)n) < 0) {
                close(fd);
                goto werr;
            }
            left -= n;
        }
        close(fd);
    }
    if (archive_write_close(out) != ARCHIVE_OK)
        goto werr;
    goto out;
werr:
    rc = child_fail(pfd, archive_errno(out) == EFBIG || errno == EFBIG ? SBX_E_BACKUP_TOO_LARGE
                                                                       : SBX_E_INTERNAL,
                    "write the archive: %s", archive_error_string(out));
out:
    sbx_gi_free(gi);
    free(buf);
    archive_entry_free(e);
    archive_match_free(match);
    archive_read_free(disk);
    archive_write_free(out);
    return rc;
}

static int
rm_cb(const char *path, const struct stat *st, int flag, struct FTW *f)
{
    (void)st;
    (void)flag;
    (void)f;
    /* EBUSY: a mount point under the dir stays (its file system is not ours
     * to empty). */
    return remove(path) == 0 || errno == ENOENT || errno == EBUSY ? 0 : -1;
}

/* Remove path and everything under it (not entering other mounts). */
static int
rm_tree(const char *path)
{
    return nftw(path, rm_cb, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
}

/* In the cwd (the target dir): remove every entry but `keep`, then move
 * every entry of `keep` here and remove it, giving the dir its mode. */
static int
swap_in(const char *keep)
{
    DIR *d = opendir(".");
    if (!d)
        return -1;
    struct dirent *de;
    int rc = 0;
    while (rc == 0 && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..") && strcmp(de->d_name, keep))
            rc = rm_tree(de->d_name);
    closedir(d);
    if (rc != 0 || !(d = opendir(keep)))
        return -1;
    while (rc == 0 && (de = readdir(d)))
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            rc = renameat(dirfd(d), de->d_name, AT_FDCWD, de->d_name);
    closedir(d);
    struct stat st;
    if (rc == 0 && stat(keep, &st) == 0)
        chmod(".", st.st_mode & 07777);
    return rc == 0 ? rmdir(keep) : -1;
}

static int
mkdir_p(const char *dir)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s", dir);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = '\0';
            if (mkdir(p, 0755) != 0 && errno != EEXIST)
                return -1;
            *s = '/';
        }
    return mkdir(p, 0755) != 0 && errno != EEXIST ? -1 : 0;
}

/* DISK_FULL for name, with the size of the file system of the working
 * directory (the sandbox's disk limit). */
static int
disk_full(int pfd, const char *name)
{
    struct statfs sf;
    unsigned long long size = statfs(".", &sf) == 0 ? (unsigned long long)sf.f_blocks * sf.f_bsize
                                                    : 0;
    return child_fail(pfd, SBX_E_DISK_FULL,
                      "%s: the sandbox's disk is full (its limit: %llu bytes, %llu MiB); "
                      "nothing was restored", name, size, size >> 20);
}

/* The last step of w failed for want of space (a warning to libarchive). */
static bool
out_of_space(struct archive *w)
{
    return archive_errno(w) == ENOSPC || archive_errno(w) == EDQUOT;
}

/* A write into the sandbox failed (libarchive's disk writer w, entry
 * name): DISK_FULL when it is out of space, else -EIO. */
static int
write_fail(int pfd, struct archive *w, const char *name)
{
    int e = archive_errno(w);
    if (e == ENOSPC || e == EDQUOT)
        return disk_full(pfd, name);
    return child_fail(pfd, -EIO, "%s: %s", name, archive_error_string(w));
}

/* The name of the directory a restore extracts into (mkdtemp's template):
 * `.sbx-restore-` and 6 characters. */
#define RESTORE_PREFIX ".sbx-restore-"
#define RESTORE_NAME_LEN (sizeof(RESTORE_PREFIX) - 1 + 6)

/* Remove the directories named like a restore's extraction directly in d
 * (left by a restore whose shard was killed); nothing else is touched. */
static void
sweep_leftovers(const char *d)
{
    DIR *dd = opendir(d);
    if (!dd)
        return;
    struct dirent *de;
    struct stat st;
    while ((de = readdir(dd))) {
        if (strlen(de->d_name) != RESTORE_NAME_LEN ||
            strncmp(de->d_name, RESTORE_PREFIX, sizeof(RESTORE_PREFIX) - 1) != 0 ||
            fstatat(dirfd(dd), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
            continue;
        char p[4200];
        snprintf(p, sizeof(p), "%s/%s", strcmp(d, "/") ? d : "", de->d_name);
        rm_tree(p);
    }
    closedir(dd);
}

static int
child_unpack(int in_fd, const char *dir, const char *sweep, int pfd)
{
    struct stat st;
    if (sweep && *sweep)
        sweep_leftovers(sweep);
    sweep_leftovers(dir);
    if (mkdir_p(dir) != 0 || stat(dir, &st) != 0) {
        if (errno == ENOSPC || errno == EDQUOT)
            return disk_full(pfd, dir);
        return child_fail(pfd, errno == ENOTDIR ? -ENOTDIR : SBX_E_INTERNAL, "%s: %s", dir,
                          strerror(errno));
    }
    if (!S_ISDIR(st.st_mode))
        return child_fail(pfd, -ENOTDIR, "%s: not a directory", dir);
    /* Extracted into a new dir inside it first: an archive that fails half
     * way leaves the dir as it was.  Then its content goes (not other file
     * systems mounted under it) and the new entries move up. */
    char tmp[] = RESTORE_PREFIX "XXXXXX";
    if (chdir(dir) != 0 || !mkdtemp(tmp) || chdir(tmp) != 0) {
        if (errno == ENOSPC || errno == EDQUOT)
            return disk_full(pfd, dir);
        return child_fail(pfd, -EIO, "%s: %s", dir, strerror(errno));
    }
    struct archive *in = archive_read_new();
    struct archive *disk = archive_write_disk_new();
    int rc = 0;
    if (!in || !disk) {
        rc = child_fail(pfd, SBX_E_INTERNAL, "out of memory");
        goto out;
    }
    archive_read_support_filter_zstd(in);
    archive_read_support_format_tar(in);
    archive_write_disk_set_options(
        disk, ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS | ARCHIVE_EXTRACT_SECURE_NODOTDOT |
                  ARCHIVE_EXTRACT_SECURE_SYMLINKS | ARCHIVE_EXTRACT_PERM | ARCHIVE_EXTRACT_TIME |
                  ARCHIVE_EXTRACT_OWNER);
    if (archive_read_open_fd(in, in_fd, 1 << 16) != ARCHIVE_OK) {
        rc = child_fail(pfd, -EIO, "read the archive: %s", archive_error_string(in));
        goto out;
    }
    struct archive_entry *e;
    int r;
    while ((r = archive_read_next_header(in, &e)) == ARCHIVE_OK) {
        if (archive_write_header(disk, e) < ARCHIVE_WARN || out_of_space(disk)) {
            rc = write_fail(pfd, disk, archive_entry_pathname(e));
            goto out;
        }
        const void *b;
        size_t len;
        la_int64_t off;
        while ((r = archive_read_data_block(in, &b, &len, &off)) == ARCHIVE_OK)
            /* Not only < ARCHIVE_WARN: libarchive answers a failed write(2)
             * (ENOSPC: the rest of the file missing) with ARCHIVE_WARN. */
            if (archive_write_data_block(disk, b, len, off) != ARCHIVE_OK) {
                rc = write_fail(pfd, disk, archive_entry_pathname(e));
                goto out;
            }
        if (r != ARCHIVE_EOF) {
            rc = child_fail(pfd, -EIO, "read the archive: %s", archive_error_string(in));
            goto out;
        }
        if (archive_write_finish_entry(disk) < ARCHIVE_WARN || out_of_space(disk)) {
            rc = write_fail(pfd, disk, archive_entry_pathname(e));
            goto out;
        }
    }
    if (r != ARCHIVE_EOF)
        rc = child_fail(pfd, -EIO, "read the archive: %s", archive_error_string(in));
    else if (archive_write_close(disk) != ARCHIVE_OK)
        rc = write_fail(pfd, disk, dir);
out:
    archive_read_free(in);
    archive_write_free(disk);
    if (chdir("..") != 0)
        return rc ? rc : child_fail(pfd, -EIO, "%s: %s", dir, strerror(errno));
    if (rc) {
        rm_tree(tmp);
        return rc;
    }
    if (swap_in(tmp) != 0)
        return child_fail(pfd, -EIO, "replace the content of %s: %s", dir, strerror(errno));
    return 0;
}

int
sbx_backup_ns_open(pid_t pid, sbx_cgroups *cg, sbx_cgroup *c, struct sbx_backup_ns *ns,
                   sbx_err_t *err)
{
    char p[64];
    ns->ntasks = 0;
    if (cg && c && sbx_cgroup_open_tasks(cg, c, ns->tasks, &ns->ntasks) != 0)
        ns->ntasks = 0; /* not charged to the sandbox, but done */
    snprintf(p, sizeof(p), "/proc/%d/ns/user", (int)pid);
    ns->userns = open(p, O_RDONLY | O_CLOEXEC);
    snprintf(p, sizeof(p), "/proc/%d/ns/mnt", (int)pid);
    ns->mntns = open(p, O_RDONLY | O_CLOEXEC);
    snprintf(p, sizeof(p), "/proc/%d/root", (int)pid);
    ns->rootfd = open(p, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (ns->userns < 0 || ns->mntns < 0 || ns->rootfd < 0) {
        int e = errno;
        sbx_backup_ns_close(ns);
        return sbx_err_make(err, SBX_E_INTERNAL, "the sandbox's namespaces (pid %d): %s",
                            (int)pid, strerror(e));
    }
    return 0;
}

void
sbx_backup_ns_close(struct sbx_backup_ns *ns)
{
    int *fds[] = {&ns->userns, &ns->mntns, &ns->rootfd};
    for (size_t i = 0; i < 3; i++) {
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
    while (ns->ntasks > 0)
        close(ns->tasks[--ns->ntasks]);
}

/* The descriptors of a child re-executed as `sbxd backup-child`
 * (sbx_backup_child_main): 3..7, in this order. */
enum { CHILD_USERNS = 3, CHILD_MNTNS, CHILD_ROOT, CHILD_PIPE, CHILD_DATA, CHILD_NFDS = 5 };

/*
 * The pack or unpack runs in a new program image, not in the forked copy of
 * the shard: the shard has many threads, and a fork's child may only call
 * async-signal-safe functions until it execs (fork(2), signal-safety(7)) —
 * libarchive's path, locale and user-name lookups and malloc take locks
 * that another thread may have held at the fork, and such a child waited
 * forever on one (seen: a restore that never answered, the actor's input
 * gate closed behind it).  So the child only joins the sandbox's cgroup,
 * sets its limits, moves its descriptors to 3..7 and execs the shard's own
 * binary (/proc/self/exe, the image that is running even if the file was
 * replaced) as `sbxd backup-child pack PID DIR gitignore|- [EXCLUDE…]` or
 * `sbxd backup-child unpack PID DIR SWEEP`, everything
 * it needs prepared before the fork.
 */
/* Fork a child that enters the sandbox of ns and runs pack (in_fd < 0) or
 * unpack; wait for it and turn its report into the return code. */
static int
run_child(const struct sbx_backup_ns *ns, const char *dir, char *const *excludes, size_t nex,
          bool gitignore, int out_fd, int in_fd, const char *sweep, int64_t max_bytes,
          sbx_err_t *err)
{
    int pp[2];
    if (nex > SBX_BACKUP_MAX_EXCLUDES)
        return sbx_err_make(err, SBX_E_VALIDATION, "at most %d excludes",
                            SBX_BACKUP_MAX_EXCLUDES);
    const char *argv[SBX_BACKUP_MAX_EXCLUDES + 7];
    char parent[24];
    snprintf(parent, sizeof(parent), "%d", (int)getpid());
    size_t ac = 0;
    argv[ac++] = "sbxd";
    argv[ac++] = "backup-child";
    argv[ac++] = in_fd < 0 ? "pack" : "unpack";
    argv[ac++] = parent;
    argv[ac++] = dir;
    /* pack: "gitignore" or "-", then the excludes; unpack: the dir to sweep
     * ("" for none) */
    argv[ac++] = in_fd < 0 ? (gitignore ? "gitignore" : "-") : (sweep ? sweep : "");
    for (size_t i = 0; i < nex; i++)
        argv[ac++] = excludes[i];
    argv[ac] = NULL;
    const int from[CHILD_NFDS] = {ns->userns, ns->mntns, ns->rootfd, -1,
                                  in_fd < 0 ? out_fd : in_fd};
    if (pipe2(pp, O_CLOEXEC) != 0)
        return sbx_err_make(err, -errno, "pipe");
    pid_t c = fork();
    if (c < 0) {
        int e = errno;
        close(pp[0]);
        close(pp[1]);
        return sbx_err_make(err, -e, "fork");
    }
    if (c == 0) {
        /* Only async-signal-safe calls from here to the exec. */
        /* Gone with the shard (its thread forked it and waits for it). */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGXFSZ, SIG_IGN); /* kept across the exec: a write past the cap fails */
        /* Into the sandbox's cgroup (a thread moving itself: spawn.c says
         * why); a full pids limit leaves it in the shard's. */
        for (int i = 0; i < ns->ntasks; i++) {
            ssize_t w = write(ns->tasks[i], "0", 1);
            (void)w;
        }
        if (in_fd < 0) {
            struct rlimit rl = {(rlim_t)max_bytes, (rlim_t)max_bytes};
            setrlimit(RLIMIT_FSIZE, &rl);
        }
        /* To 3..7: copies above them first (one of the originals may be
         * 3..7), then into place (dup2 clears close-on-exec). */
        int tmp[CHILD_NFDS];
        for (int i = 0; i < CHILD_NFDS; i++)
            if ((tmp[i] = fcntl(i == CHILD_PIPE - 3 ? pp[1] : from[i], F_DUPFD_CLOEXEC, 16)) < 0)
                _exit(126);
        for (int i = 0; i < CHILD_NFDS; i++)
            if (dup2(tmp[i], 3 + i) < 0)
                _exit(126);
        execve("/proc/self/exe", (char *const *)argv, environ);
        struct child_msg m = {.code = SBX_E_INTERNAL, .msg = "cannot run the backup's program"};
        ssize_t w = write(CHILD_PIPE, &m, sizeof(m));
        (void)w;
        _exit(127);
    }
    close(pp[1]);
    struct child_msg m = {0};
    ssize_t n = read(pp[0], &m, sizeof(m));
    close(pp[0]);
    int ws = 0;
    while (waitpid(c, &ws, 0) < 0 && errno == EINTR)
        ;
    if (n == (ssize_t)sizeof(m))
        return sbx_err_make(err, m.code, "%s", m.msg);
    if (!WIFEXITED(ws) || WEXITSTATUS(ws) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "the backup's process ended with status 0x%x",
                            ws);
    return 0;
}

_Noreturn void
sbx_backup_child_main(int argc, char **argv)
{
    /* argv: sbxd backup-child pack PID DIR gitignore|- [EXCLUDE…]
     *       sbxd backup-child unpack PID DIR SWEEP     (PID: the shard's) */
    int r = 1;
    char *end = NULL;
    long parent = argc >= 6 ? strtol(argv[3], &end, 10) : 0;
    bool pack = argc >= 6 && !strcmp(argv[2], "pack");
    if (argc < 6 || (!pack && (strcmp(argv[2], "unpack") != 0 || argc != 6)) || !end || *end ||
        parent <= 0)
        r = child_fail(CHILD_PIPE, SBX_E_INTERNAL, "backup-child: bad arguments");
    else if ((r = child_enter(CHILD_USERNS, CHILD_MNTNS, CHILD_ROOT, CHILD_PIPE,
                              (pid_t)parent)) == 0)
        r = pack ? child_pack(argv[4], argv + 6, (size_t)(argc - 6),
                              !strcmp(argv[5], "gitignore"), CHILD_DATA, CHILD_PIPE)
                 : child_unpack(CHILD_DATA, argv[4], argv[5], CHILD_PIPE);
    /* _exit: no atexit handlers (a leak check of what libarchive keeps). */
    _exit(r);
}

int
sbx_backup_pack(const struct sbx_backup_ns *ns, const char *dir, char *const *excludes, size_t nex,
                bool gitignore, int out_fd, int64_t max_bytes, sbx_err_t *err)
{
    return run_child(ns, dir, excludes, nex, gitignore, out_fd, -1, NULL, max_bytes, err);
}

int
sbx_backup_unpack(const struct sbx_backup_ns *ns, int in_fd, const char *dir, const char *sweep,
                  sbx_err_t *err)
{
    return run_child(ns, dir, NULL, 0, false, -1, in_fd, sweep, 0, err);
}

int
sbx_backup_digest(int fd, char *out, size_t outlen, int64_t *size)
{
    struct sha256_ctx h;
    sha256_init(&h);
    _cleanup_free_ char *buf = malloc(1 << 16);
    if (!buf)
        return -ENOMEM;
    int64_t total = 0;
    ssize_t n;
    off_t off = 0;
    while ((n = pread(fd, buf, 1 << 16, off)) > 0) {
        sha256_update(&h, (size_t)n, (const uint8_t *)buf);
        off += n;
        total += n;
    }
    if (n < 0)
        return -errno;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&h, sizeof(d), d);
    if (outlen < 7 + 2 * SHA256_DIGEST_SIZE + 1)
        return -ENOSPC;
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
    *size = total;
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* The store. */

static int
store_lock(const char *root)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/lock", root);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int
sbx_backup_store_init(const char *root, sbx_err_t *err)
{
    const char *subs[] = {"", "/blobs", "/index", "/tmp", "/restoring"};
    char p[4200];
    for (size_t i = 0; i < sizeof(subs) / sizeof(subs[0]); i++) {
        snprintf(p, sizeof(p), "%s%s", root, subs[i]);
        if (mkdir(p, 0700) != 0 && errno != EEXIST)
            return sbx_err_make(err, -errno, "mkdir %s", p);
    }
    return 0;
}

int
sbx_backup_id_valid(const char *id)
{
    if (strlen(id) != 27 || strncmp(id, "bk_", 3) != 0)
        return 0;
    for (const char *s = id + 3; *s; s++)
        if (!((*s >= '0' && *s <= '9') || (*s >= 'a' && *s <= 'f')))
            return 0;
    return 1;
}

static void
blob_path(const char *root, const char *digest, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s/blobs/%s.tar.zst", root, digest + 7);
}

static void
info_from_json(const char *id, json_t *j, struct sbx_backup_info *info)
{
    char keep[sizeof(info->id)]; /* id may be info->id */
    snprintf(keep, sizeof(keep), "%s", id);
    memset(info, 0, sizeof(*info));
    memcpy(info->id, keep, sizeof(keep));
    const char *s;
    if ((s = json_string_value(json_object_get(j, "name"))))
        snprintf(info->name, sizeof(info->name), "%s", s);
    if ((s = json_string_value(json_object_get(j, "sandbox"))))
        snprintf(info->sandbox, sizeof(info->sandbox), "%s", s);
    if ((s = json_string_value(json_object_get(j, "dir"))))
        snprintf(info->dir, sizeof(info->dir), "%s", s);
    if ((s = json_string_value(json_object_get(j, "digest"))))
        snprintf(info->digest, sizeof(info->digest), "%s", s);
    info->size = json_integer_value(json_object_get(j, "size"));
    info->created_ms = json_integer_value(json_object_get(j, "created"));
    info->expires_ms = json_integer_value(json_object_get(j, "expires"));
}

int
sbx_backup_info_parse(const char *id, const char *text, size_t len,
                      struct sbx_backup_info *info)
{
    json_error_t je;
    json_t *j = json_loadb(text, len, 0, &je);
    if (!j || !json_is_object(j)) {
        json_decref(j);
        return SBX_E_STORAGE;
    }
    info_from_json(id, j, info);
    json_decref(j);
    return strlen(info->digest) == 71 ? 0 : SBX_E_STORAGE;
}

char *
sbx_backup_info_json(const struct sbx_backup_info *info)
{
    json_t *j = json_pack("{s:s,s:s,s:s,s:s,s:s,s:I,s:I,s:I}", "id", info->id, "name", info->name,
                          "sandbox", info->sandbox, "dir", info->dir, "digest", info->digest,
                          "size", (json_int_t)info->size, "created",
                          (json_int_t)info->created_ms, "expires", (json_int_t)info->expires_ms);
    char *out = j ? json_dumps(j, JSON_COMPACT) : NULL;
    json_decref(j);
    return out;
}

int
sbx_backup_new_id(char id[32])
{
    uint8_t r[12];
    if (sbx_random(r, sizeof(r)) != 0)
        return SBX_E_INTERNAL;
    memcpy(id, "bk_", 3);
    for (int i = 0; i < 12; i++)
        snprintf(id + 3 + 2 * i, 3, "%02x", r[i]);
    return 0;
}

static int
read_entry(const char *root, const char *id, struct sbx_backup_info *info)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/index/%s.json", root, id);
    json_error_t je;
    json_t *j = json_load_file(p, 0, &je);
    if (!j)
        return access(p, F_OK) == 0 ? SBX_E_STORAGE : SBX_E_BACKUP_NOT_FOUND;
    info_from_json(id, j, info);
    json_decref(j);
    return strlen(info->digest) == 71 ? 0 : SBX_E_STORAGE;
}

/* Is another backup than `id` made of the blob `digest`? (lock held) */
static int
blob_used(const char *root, const char *id, const char *digest)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/index", root);
    DIR *d = opendir(p);
    if (!d)
        return 1;
    struct dirent *de;
    int used = 0;
    while (!used && (de = readdir(d))) {
        char bid[32];
        size_t n = strlen(de->d_name);
        if (n != 32 || strcmp(de->d_name + 27, ".json") != 0)
            continue;
        memcpy(bid, de->d_name, 27);
        bid[27] = '\0';
        struct sbx_backup_info o;
        if (strcmp(bid, id) != 0 && read_entry(root, bid, &o) == 0 &&
            strcmp(o.digest, digest) == 0)
            used = 1;
    }
    closedir(d);
    return used;
}

/* Remove backup id's entry, and its blob if unused (lock held). */
static int
remove_entry(const char *root, const struct sbx_backup_info *info)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/index/%s.json", root, info->id);
    if (unlink(p) != 0)
        return -errno;
    if (!blob_used(root, info->id, info->digest)) {
        blob_path(root, info->digest, p, sizeof(p));
        unlink(p);
    }
    return 0;
}

/* Files of tmp/ untouched this long are a create's that its shard did not
 * finish (killed): a running create writes its archive continuously. */
#define TMP_STALE_S 3600

static void
sweep_tmp(const char *root)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/tmp", root);
    DIR *d = opendir(p);
    if (!d)
        return;
    time_t now = time(NULL);
    struct dirent *de;
    struct stat st;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.' && fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            S_ISREG(st.st_mode) && now - st.st_mtime > TMP_STALE_S)
            unlinkat(dirfd(d), de->d_name, 0);
    closedir(d);
}

/* Collect expired backups and stale files of tmp/, and fill *out (if not
 * NULL) with the other backups (lock held). */
static int
scan(const char *root, struct sbx_backup_info **out, size_t *n)
{
    char p[4200];
    sweep_tmp(root);
    snprintf(p, sizeof(p), "%s/index", root);
    DIR *d = opendir(p);
    if (!d)
        return -errno;
    int64_t now = sbx_wall_ms();
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        char id[32];
        if (strlen(de->d_name) != 32 || strcmp(de->d_name + 27, ".json") != 0)
            continue;
        memcpy(id, de->d_name, 27);
        id[27] = '\0';
        struct sbx_backup_info info;
        if (read_entry(root, id, &info) != 0)
            continue;
        if (info.expires_ms <= now) {
            remove_entry(root, &info);
            continue;
        }
        if (!out)
            continue;
        if (*n == cap) {
            cap = cap ? cap * 2 : 16;
            *out = sbx_xrealloc(*out, cap * sizeof(**out));
        }
        (*out)[(*n)++] = info;
    }
    closedir(d);
    return 0;
}

/* fsync(2) the file or directory at path.  0 or -errno. */
static int
sync_path(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

/* Write text to path (new, mode 0600) and fsync it.  0 or -errno. */
static int
write_synced(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    int rc = sbx_write_full(fd, text, strlen(text));
    if (rc == 0 && fsync(fd) != 0)
        rc = -errno;
    close(fd);
    return rc;
}

/* Durability (docs/persistence.md, "The store"): each file is fsynced
 * before its rename and its directory after it (rename(2) alone orders
 * nothing against a power cut), blob before entry, so an acknowledged
 * create's entry and blob are both on disk and an entry never names a
 * blob that a crash lost. */
int
sbx_backup_store_add(const char *root, const char *tmp_path, struct sbx_backup_info *info,
                     sbx_err_t *err)
{
    if (sbx_backup_new_id(info->id) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "getrandom");
    _cleanup_close_ int lk = store_lock(root);
    if (lk < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "lock the backup store: %s", strerror(-lk));
    scan(root, NULL, NULL);
    char bp[4200], ip[4200], tp[4200], dp[4200];
    int rc;
    blob_path(root, info->digest, bp, sizeof(bp));
    /* An existing blob was synced by the create that stored it. */
    if (access(bp, F_OK) == 0) {
        unlink(tmp_path);
    } else {
        snprintf(dp, sizeof(dp), "%s/blobs", root);
        if ((rc = sync_path(tmp_path)) != 0 || (rc = rename(tmp_path, bp) != 0 ? -errno : 0) ||
            (rc = sync_path(dp)) != 0)
            return sbx_err_make(err, SBX_E_STORAGE, "store the archive: %s", strerror(-rc));
    }
    _cleanup_free_ char *text = sbx_backup_info_json(info);
    snprintf(tp, sizeof(tp), "%s/tmp/%s.json", root, info->id);
    snprintf(ip, sizeof(ip), "%s/index/%s.json", root, info->id);
    snprintf(dp, sizeof(dp), "%s/index", root);
    rc = text ? write_synced(tp, text) : -ENOMEM;
    if (rc == 0 && rename(tp, ip) != 0)
        rc = -errno;
    if (rc != 0) {
        unlink(tp);
        if (!blob_used(root, info->id, info->digest))
            unlink(bp);
        return sbx_err_make(err, SBX_E_STORAGE, "write the backup's index entry: %s",
                            strerror(-rc));
    }
    /* The entry is in place; only its directory's sync can still fail, and
     * an answer of failure then would leave a backup the caller never
     * heard of: the entry is taken back. */
    if ((rc = sync_path(dp)) != 0) {
        unlink(ip);
        if (!blob_used(root, info->id, info->digest))
            unlink(bp);
        return sbx_err_make(err, SBX_E_STORAGE, "sync the backup store's index: %s",
                            strerror(-rc));
    }
    return 0;
}

int
sbx_backup_store_open(const char *root, const char *id, struct sbx_backup_info *info, int *fd,
                      sbx_err_t *err)
{
    if (!sbx_backup_id_valid(id))
        return sbx_err_make(err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
    _cleanup_close_ int lk = store_lock(root);
    if (lk < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "lock the backup store: %s", strerror(-lk));
    int rc = read_entry(root, id, info);
    if (rc == SBX_E_BACKUP_NOT_FOUND)
        return sbx_err_make(err, rc, "no backup '%s'", id);
    if (rc != 0)
        return sbx_err_make(err, rc, "backup '%s': unreadable index entry", id);
    if (info->expires_ms <= sbx_wall_ms())
        return sbx_err_make(err, SBX_E_BACKUP_EXPIRED, "backup '%s' expired", id);
    char bp[4200];
    blob_path(root, info->digest, bp, sizeof(bp));
    *fd = open(bp, O_RDONLY | O_CLOEXEC);
    if (*fd < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "backup '%s': its archive: %s", id,
                            strerror(errno));
    return 0;
}

int
sbx_backup_store_list(const char *root, struct sbx_backup_info **out, size_t *n, sbx_err_t *err)
{
    *out = NULL;
    *n = 0;
    _cleanup_close_ int lk = store_lock(root);
    if (lk < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "lock the backup store: %s", strerror(-lk));
    int rc = scan(root, out, n);
    if (rc != 0)
        return sbx_err_make(err, SBX_E_STORAGE, "read the backup store: %s", strerror(-rc));
    return 0;
}

int
sbx_backup_store_delete(const char *root, const char *id, sbx_err_t *err)
{
    if (!sbx_backup_id_valid(id))
        return sbx_err_make(err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
    _cleanup_close_ int lk = store_lock(root);
    if (lk < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "lock the backup store: %s", strerror(-lk));
    struct sbx_backup_info info;
    int rc = read_entry(root, id, &info);
    if (rc != 0)
        return sbx_err_make(err, rc, "no backup '%s'", id);
    rc = remove_entry(root, &info);
    if (rc != 0)
        return sbx_err_make(err, SBX_E_STORAGE, "delete backup '%s': %s", id, strerror(-rc));
    return 0;
}

/* The note of sandbox's restore in root/restoring/, into p; false if the
 * ID is unfit for a file name. */
static bool
restore_note(const char *root, const char *sandbox, char *p, size_t plen)
{
    if (!sandbox[0] || sandbox[0] == '.' || strchr(sandbox, '/'))
        return false;
    snprintf(p, plen, "%s/restoring/%s", root, sandbox);
    return true;
}

int
sbx_backup_restore_begin(const char *root, const char *sandbox, const char *dir, char *prev,
                         size_t prevlen)
{
    char p[4200];
    prev[0] = '\0';
    if (!restore_note(root, sandbox, p, sizeof(p)))
        return 0;
    char *text = NULL;
    size_t len = 0;
    if (sbx_fs_read(p, 8192, &text, &len) == 0 && len < prevlen && text[0] == '/' &&
        !memchr(text, '\0', len)) {
        memcpy(prev, text, len);
        prev[len] = '\0';
    }
    free(text);
    /* Written whole (mkdir of restoring/ for a store made before it). */
    char d[4200];
    snprintf(d, sizeof(d), "%s/restoring", root);
    if (mkdir(d, 0700) != 0 && errno != EEXIST)
        return -errno;
    return write_synced(p, dir);
}

void
sbx_backup_restore_end(const char *root, const char *sandbox)
{
    char p[4200];
    if (restore_note(root, sandbox, p, sizeof(p)))
        unlink(p);
}
