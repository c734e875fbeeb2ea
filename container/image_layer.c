/*
 * image_layer.c — an overlayfs upper dir written back as an OCI layer (a
 * template's new layer, actors/template.c; docs/images.md "Templates").
 *
 * The inverse of image_unpack.c's whiteout rules (image-spec layer.md,
 * "Whiteouts"; kernel Documentation/filesystems/overlayfs.rst, "whiteouts
 * and opaque directories"):
 *   - a 0/0 character device NAME (overlayfs' whiteout) → an empty regular
 *     file `.wh.NAME`;
 *   - a directory with user.overlay.opaque=y (or trusted.overlay.opaque=y)
 *     → the directory, then an empty `DIR/.wh..wh..opq`;
 *   - owners: the host ids of the sandbox's root and of its image's User
 *     (container/spawn.c maps them) become the ids the sandbox saw.
 *
 * The tree belongs to a sandbox and may change while it is read: every
 * entry is reached with *at() calls from its parent's descriptor, never
 * following a symbolic link (AT_SYMLINK_NOFOLLOW, O_NOFOLLOW), and a file is
 * written only if what was opened is still a regular file or directory.
 * A racing tenant can at worst change what its own layer holds.
 */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/util.h"
#include "image_store.h"

/* Deeper trees are refused rather than recursed into without bound. */
#define LAYER_MAX_DEPTH 128

struct lw {
    struct archive *a;
    const struct sbx_layer_ids *ids;
    sbx_err_t *err;
};

/* A host id of the upper dir as the sandbox saw it. */
static int64_t
inner_id(const struct lw *w, uint32_t host, bool gid)
{
    if (host == w->ids->host_root)
        return 0;
    if (w->ids->host_user && host == w->ids->host_user)
        return gid ? w->ids->user_gid : w->ids->user_uid;
    return host;
}

static int
put_entry(struct lw *w, const char *path, const struct stat *st, mode_t type, const char *link,
          int datafd)
{
    struct archive_entry *e = archive_entry_new();
    int rc = 0;
    archive_entry_set_pathname(e, path);
    archive_entry_set_filetype(e, type);
    archive_entry_set_perm(e, st ? st->st_mode & 07777 : 0644);
    archive_entry_set_uid(e, st ? inner_id(w, st->st_uid, false) : 0);
    archive_entry_set_gid(e, st ? inner_id(w, st->st_gid, true) : 0);
    if (st)
        archive_entry_set_mtime(e, st->st_mtim.tv_sec, st->st_mtim.tv_nsec);
    archive_entry_set_size(e, type == AE_IFREG && st && datafd >= 0 ? st->st_size : 0);
    if (link)
        archive_entry_set_symlink(e, link);
    if (archive_write_header(w->a, e) != ARCHIVE_OK) {
        rc = sbx_err_make(w->err, SBX_E_INTERNAL, "tar %s: %s", path,
                          archive_error_string(w->a));
        goto out;
    }
    if (type == AE_IFREG && datafd >= 0) {
        char buf[65536];
        ssize_t n;
        int64_t left = st->st_size;
        while (left > 0 && (n = read(datafd, buf, (size_t)SBX_MIN((int64_t)sizeof(buf), left))) > 0) {
            if (archive_write_data(w->a, buf, (size_t)n) != n) {
                rc = sbx_err_make(w->err, SBX_E_INTERNAL, "tar %s: %s", path,
                                  archive_error_string(w->a));
                goto out;
            }
            left -= n;
        }
        /* A file that shrank meanwhile is padded by libarchive. */
    }
out:
    archive_entry_free(e);
    return rc;
}

static bool
is_opaque(int fd)
{
    char v[4];
    ssize_t n = fgetxattr(fd, "user.overlay.opaque", v, sizeof(v));
    if (n < 0)
        n = fgetxattr(fd, "trusted.overlay.opaque", v, sizeof(v));
    return n == 1 && v[0] == 'y';
}

static int
walk(struct lw *w, int dfd, const char *prefix, int depth)
{
    if (depth > LAYER_MAX_DEPTH)
        return sbx_err_make(w->err, SBX_E_IMAGE_INVALID,
                            "%s: the writable layer is deeper than %d directories", prefix,
                            LAYER_MAX_DEPTH);
    int rc = 0;
    int dup = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
    DIR *d = dup >= 0 ? fdopendir(dup) : NULL;
    if (!d) {
        if (dup >= 0)
            close(dup);
        return sbx_err_make(w->err, -errno, "read the directory %s", prefix[0] ? prefix : "/");
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (!strcmp(n, ".") || !strcmp(n, ".."))
            continue;
        char path[4096];
        if ((size_t)snprintf(path, sizeof(path), "%s%s", prefix, n) >= sizeof(path) - 2) {
            rc = sbx_err_make(w->err, SBX_E_IMAGE_INVALID, "a path of the layer is too long");
            goto out;
        }
        struct stat st;
        if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* removed meanwhile */
        if (S_ISCHR(st.st_mode) && st.st_rdev == makedev(0, 0)) {
            char wh[4200];
            snprintf(wh, sizeof(wh), "%s.wh.%s", prefix, n);
            if ((rc = put_entry(w, wh, NULL, AE_IFREG, NULL, -1)) != 0)
                goto out;
        } else if (S_ISDIR(st.st_mode)) {
            _cleanup_close_ int sub = openat(dfd, n, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0 || fstat(sub, &st) < 0 || !S_ISDIR(st.st_mode))
                continue; /* replaced meanwhile */
            char dp[4200];
            snprintf(dp, sizeof(dp), "%s/", path);
            if ((rc = put_entry(w, dp, &st, AE_IFDIR, NULL, -1)) != 0)
                goto out;
            if (is_opaque(sub)) {
                char opq[4300];
                snprintf(opq, sizeof(opq), "%s.wh..wh..opq", dp);
                if ((rc = put_entry(w, opq, NULL, AE_IFREG, NULL, -1)) != 0)
                    goto out;
            }
            if ((rc = walk(w, sub, dp, depth + 1)) != 0)
                goto out;
        } else if (S_ISREG(st.st_mode)) {
            _cleanup_close_ int f = openat(dfd, n, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (f < 0 || fstat(f, &st) < 0 || !S_ISREG(st.st_mode))
                continue;
            if ((rc = put_entry(w, path, &st, AE_IFREG, NULL, f)) != 0)
                goto out;
        } else if (S_ISLNK(st.st_mode)) {
            char target[4096];
            ssize_t k = readlinkat(dfd, n, target, sizeof(target) - 1);
            if (k < 0)
                continue;
            target[k] = '\0';
            if ((rc = put_entry(w, path, &st, AE_IFLNK, target, -1)) != 0)
                goto out;
        } else if (S_ISFIFO(st.st_mode)) {
            if ((rc = put_entry(w, path, &st, AE_IFIFO, NULL, -1)) != 0)
                goto out;
        }
        /* Sockets and devices other than whiteouts: left out (the
         * unpacker would skip a device anyway). */
    }
out:
    closedir(d);
    return rc;
}

int
sbx_image_layer_write(int dirfd, const struct sbx_layer_ids *ids, const char *blob,
                      sbx_err_t *err)
{
    struct lw w = {.a = archive_write_new(), .ids = ids, .err = err};
    int rc = 0;
    if (!w.a)
        return sbx_err_make(err, -ENOMEM, "archive_write_new");
    if (archive_write_add_filter_gzip(w.a) != ARCHIVE_OK ||
        archive_write_set_format_pax_restricted(w.a) != ARCHIVE_OK ||
        archive_write_open_filename(w.a, blob) != ARCHIVE_OK) {
        rc = sbx_err_make(err, SBX_E_STORAGE, "write %s: %s", blob, archive_error_string(w.a));
        goto out;
    }
    rc = walk(&w, dirfd, "", 0);
    if (archive_write_close(w.a) != ARCHIVE_OK && rc == 0)
        rc = sbx_err_make(err, SBX_E_STORAGE, "write %s: %s", blob, archive_error_string(w.a));
out:
    archive_write_free(w.a);
    if (rc)
        unlink(blob);
    return rc;
}
