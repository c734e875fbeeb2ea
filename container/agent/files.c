/*
 * files.c — the file API (writeFile, readFile, readFileStream, mkdir,
 * deleteFile, renameFile/moveFile, listFiles, exists, watch) and
 * gitCheckout, executed by the agent inside the sandbox.
 *
 * Path safety.  The agent runs inside the sandbox's root, so no path — with
 * `..` or through tenant symlinks — can name a host file.  What it must
 * still refuse are the ways a path can reach the agent itself: magic links
 * (/proc/1/fd/3 is the agent's channel; /proc/self/… while the agent
 * resolves) and procfs files such as /proc/1/mem.  Every open therefore uses
 * openat2(2) with RESOLVE_NO_MAGICLINKS, and the opened file must not live on
 * procfs, sysfs, devpts or be a device, socket or FIFO: only regular files
 * (and directories where one is expected).  A symlink planted by tenant code
 * can thus redirect a file operation only to another file of the sandbox,
 * which the tenant could have written itself anyway.
 *
 * Relative paths resolve against the cwd of the given session (default:
 * the default session), as the SDK resolves them against the session's pwd.
 *
 * This file holds path safety (the helpers every file operation uses to
 * take a path argument and open it, files_int.h); the operations are in
 * files_rw.c, files_watch.c and files_git.c, MIME types in files_mime.c.
 * Called on the agent's loop thread.
 */
#include "files_int.h"
/* ------------------------------------------------------------------------------ */
/* Paths. */

/* The boolean argument `key` of map into *out (left as is when absent or
 * nil); anything else is VALIDATION_FAILED, answered here: a typo such as
 * "append": "yes" must not silently replace a file.  0, or -1 when answered. */
int
files_bool_arg(struct agent *a, struct agent_req *r, const msgpack_object *map, const char *key,
         bool *out)
{
    const msgpack_object *v = map ? sbx_wire_get(map, key) : NULL;
    if (!v || v->type == MSGPACK_OBJECT_NIL)
        return 0;
    if (v->type != MSGPACK_OBJECT_BOOLEAN) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'%s' must be true or false", key);
        return -1;
    }
    *out = v->via.boolean;
    return 0;
}

/* The path argument `key`, made absolute, into out[PATH_MAX_BYTES]. */
int
files_path_arg(struct agent *a, struct agent_req *r, const char *key, char *out)
{
    sbx_str p, sid = SBX_STR("default");
    if (sbx_wire_get_str(r->args, key, &p) != 0 || p.n == 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'%s' (a path) is required", key);
        return -1;
    }
    if (p.n >= PATH_MAX_BYTES - 256 || memchr(p.p, '\0', p.n)) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'%s' must be a path of at most %d bytes without NUL",
                        key, PATH_MAX_BYTES - 256);
        return -1;
    }
    if (p.p[0] == '/') {
        sbx_str_copy(p, out, PATH_MAX_BYTES);
        return 0;
    }
    sbx_wire_get_str(r->args, "sessionId", &sid);
    char sids[128] = "default";
    sbx_str_copy(sid, sids, sizeof(sids));
    const char *base = agent_session_cwd(a, sids);
    if (!base)
        base = "/workspace";
    /* A long cwd and a long relative path can add up past the buffer: that
     * is refused, never cut (a cut path names another file). */
    int n = snprintf(out, PATH_MAX_BYTES, "%s/%.*s", strcmp(base, "/") ? base : "", (int)p.n,
                     p.p);
    if (n < 0 || n >= PATH_MAX_BYTES || base[0] != '/') {
        agent_reply_err(a, r, SBX_E_NAME_TOO_LONG,
                        "'%s' relative to the session's cwd is longer than %d bytes", key,
                        PATH_MAX_BYTES - 1);
        return -1;
    }
    return 0;
}

bool
files_forbidden_fs(int fd)
{
    struct statfs sf;
    if (fstatfs(fd, &sf) < 0)
        return true;
    switch ((unsigned long)sf.f_type) {
    case PROC_SUPER_MAGIC:
    case SYSFS_MAGIC:
    case DEVPTS_SUPER_MAGIC:
    case CGROUP_SUPER_MAGIC:
    case CGROUP2_SUPER_MAGIC:
        return true;
    default:
        return false;
    }
}

/*
 * Open path safely (see the header comment).  want_dir: the result must be
 * a directory; otherwise a regular file.  Returns fd or a negative code.
 */
int
files_openat2_nomagic(const char *path, int flags, mode_t mode)
{
    struct open_how how;
    memset(&how, 0, sizeof(how));
    /* openat2(2) rejects O_PATH combined with anything but O_CLOEXEC,
     * O_DIRECTORY and O_NOFOLLOW, so O_NOCTTY only joins real opens. */
    how.flags = (uint64_t)(flags | O_CLOEXEC | ((flags & O_PATH) ? 0 : O_NOCTTY));
    how.mode = (flags & O_CREAT) ? mode : 0;
    how.resolve = RESOLVE_NO_MAGICLINKS;
    int fd = (int)syscall(SYS_openat2, AT_FDCWD, path, &how, sizeof(how));
    if (fd < 0)
        return errno == ELOOP ? SBX_E_PERMISSION : -errno;
    return fd;
}

/* The type and file-system checks (see the header comment). */
static int
check_fd(int fd, bool want_dir, struct stat *st)
{
    if (fstat(fd, st) < 0 || files_forbidden_fs(fd))
        return SBX_E_PERMISSION;
    if (want_dir ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode)) {
        if (S_ISDIR(st->st_mode))
            return -EISDIR;
        if (want_dir)
            return -ENOTDIR;
        return SBX_E_PERMISSION; /* a device, FIFO or socket */
    }
    return 0;
}

/*
 * Open path safely (see the header comment).  want_dir: the result must be
 * a directory; otherwise a regular file.  Returns fd or a negative code.
 *
 * The path is first resolved to an O_PATH handle and checked; only then is
 * the file opened for real, through that handle, so opening never has side
 * effects on what it refuses (opening a FIFO for writing would block or wake
 * its reader; a device's open could do anything).  A file that does not
 * exist yet is created with O_EXCL, which cannot open a FIFO or device.
 */
int
files_safe_open(const char *path, int flags, mode_t mode, bool want_dir)
{
    struct stat st, st2;
    for (int attempt = 0; attempt < 3; attempt++) {
        int p = files_openat2_nomagic(path, O_PATH, 0);
        if (p < 0) {
            if (p != -ENOENT || !(flags & O_CREAT))
                return p;
            int fd = files_openat2_nomagic(path, flags | O_EXCL, mode);
            if (fd == -EEXIST)
                continue; /* created under us: look again */
            if (fd < 0)
                return fd;
            int rc = check_fd(fd, want_dir, &st);
            if (rc) {
                close(fd);
                return rc;
            }
            return fd;
        }
        int rc = check_fd(p, want_dir, &st);
        if (rc) {
            close(p);
            return rc;
        }
        char self[64];
        snprintf(self, sizeof(self), "/proc/self/fd/%d", p);
        int fd = open(self, (flags & ~(O_CREAT | O_EXCL)) | O_CLOEXEC | O_NOCTTY);
        int e = errno;
        close(p);
        if (fd < 0)
            return -e;
        if (fstat(fd, &st2) < 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino) {
            close(fd);
            return SBX_E_PERMISSION;
        }
        return fd;
    }
    return -EBUSY;
}

void
files_reply_path_err(struct agent *a, struct agent_req *r, int rc, const char *op, const char *path)
{
    sbx_werr w;
    const char *what = rc == SBX_E_PERMISSION
                           ? "refused: not a regular file of the sandbox (devices, /proc, sockets "
                             "and links into the agent are off limits)"
                           : sbx_err_message(rc);
    struct statfs sf;
    if (rc == -ENOENT) {
        sbx_werr_init(&w, rc, "File not found: %s", path);
    } else if ((rc == -ENOSPC || rc == -EDQUOT || rc == SBX_E_DISK_FULL) &&
               statfs("/workspace", &sf) == 0) {
        /* DISK_FULL: the size of the sandbox's writable file system
         * (/workspace, /tmp, /home share it): its disk limit. */
        sbx_werr_init(&w, SBX_E_DISK_FULL,
                      "%s %s: the sandbox's disk is full (its limit: %llu bytes, %llu MiB)", op,
                      path, (unsigned long long)sf.f_blocks * sf.f_bsize,
                      (unsigned long long)sf.f_blocks * sf.f_bsize >> 20);
    } else
        sbx_werr_init(&w, rc, "%s %s: %s", op, path, what);
    sbx_enc_kstr(sbx_werr_ctx(&w), "path", path);
    sbx_enc_kstr(sbx_werr_ctx(&w), "operation", op);
    agent_reply_werr(a, r, &w);
    sbx_werr_free(&w);
}

/* mkdir -p of every parent of path. */
int
files_make_parents(const char *path)
{
    char tmp[PATH_MAX_BYTES];
    snprintf(tmp, sizeof(tmp), "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp)
        return 0;
    *slash = '\0';
    return sbx_mkdir_p(tmp, 0755);
}
