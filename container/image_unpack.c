/*
 * image_unpack.c — unpack one OCI layer into a directory overlayfs can use
 * as a lower dir, and compute a layer blob's digests.  See image_store.h.
 *
 * The rules (docs/images.md, "Unpacking"):
 *  - Paths: "./" components are dropped; an absolute path, or any ".."
 *    component, is refused (IMAGE_INVALID), as is every path whose parent
 *    would resolve outside the layer: parents are opened with openat2(2)
 *    RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS from the layer's directory, so
 *    an absolute symlink or a ".." symlink in the path fails (EXDEV) instead
 *    of being followed.  The last component is never followed: every entry
 *    is made with an *at() call on its parent's descriptor, O_NOFOLLOW /
 *    AT_SYMLINK_NOFOLLOW.  Hard links must name an entry inside the layer
 *    (resolved the same way).
 *  - Whiteouts (OCI image-spec layer.md, "Whiteouts"): `.wh.NAME` becomes
 *    the overlayfs whiteout for NAME, a character device 0/0; the opaque
 *    marker `.wh..wh..opq` sets user.overlay.opaque=y on its directory
 *    (Documentation/filesystems/overlayfs.rst, "whiteouts and opaque
 *    directories" and "User xattr": the sandbox mounts its overlay with
 *    `userxattr`, from inside its user namespace).  Extended attributes of
 *    the tar are not extracted, so a layer cannot carry overlay xattrs of
 *    its own (redirects, metacopy).
 *  - Devices: character and block devices are skipped (counted): the
 *    sandbox's mounts are nodev anyway, and a layer needs none.  FIFOs are
 *    kept.
 *  - Set-uid and set-gid bits are kept, as shipped: inside a sandbox they
 *    grant nothing (every process has no_new_privs, prctl(2): "set-user-ID
 *    and set-group-ID mode bits … are not honored", and the root overlay is
 *    mounted nosuid), and the host never runs these files.
 *  - Owners are the tar's numeric uid/gid (the layer is the image's file
 *    system as is); the sandbox sees them through an idmapped mount
 *    (docs/images.md, "Ownership").
 */
#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/util.h"
#include "image_store.h"

#define WH_PREFIX ".wh."
#define WH_OPAQUE ".wh..wh..opq"
#define OPAQUE_XATTR "user.overlay.opaque"

/* ------------------------------------------------------------------------------ */
/* Digests. */

static void
hex_digest(struct sha256_ctx *h, char out[SBX_IMAGE_DIGEST_LEN])
{
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(h, sizeof(d), d);
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
}

/* A libarchive read callback that hashes the bytes it hands over. */
struct hashing_reader {
    int fd;
    struct sha256_ctx h;
    char buf[65536];
};

static la_ssize_t
hashing_read(struct archive *a, void *arg, const void **out)
{
    struct hashing_reader *r = arg;
    ssize_t n;
    do
        n = read(r->fd, r->buf, sizeof(r->buf));
    while (n < 0 && errno == EINTR);
    if (n < 0) {
        archive_set_error(a, errno, "read");
        return -1;
    }
    sha256_update(&r->h, (size_t)n, (const uint8_t *)r->buf);
    *out = r->buf;
    return n;
}

int
sbx_image_layer_digests(const char *blob, char compressed[SBX_IMAGE_DIGEST_LEN],
                        char uncompressed[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err)
{
    int rc = 0;
    struct hashing_reader *r = sbx_xcalloc(1, sizeof(*r));
    struct archive *a = archive_read_new();
    struct sha256_ctx du;
    r->fd = open(blob, O_RDONLY | O_CLOEXEC);
    if (r->fd < 0) {
        rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "open layer blob %s: %s", blob,
                          strerror(errno));
        goto out;
    }
    sha256_init(&r->h);
    sha256_init(&du);
    /* The "raw" format: the decompressed stream itself, whatever the filter. */
    archive_read_support_filter_all(a);
    archive_read_support_format_raw(a);
    struct archive_entry *e;
    if (archive_read_open(a, r, NULL, hashing_read, NULL) != ARCHIVE_OK ||
        archive_read_next_header(a, &e) != ARCHIVE_OK) {
        rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer blob %s: %s", blob,
                          archive_error_string(a) ? archive_error_string(a) : "unreadable");
        goto out;
    }
    for (;;) {
        const void *p;
        size_t n;
        la_int64_t off;
        int x = archive_read_data_block(a, &p, &n, &off);
        if (x == ARCHIVE_EOF)
            break;
        if (x != ARCHIVE_OK) {
            rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer blob %s: %s", blob,
                              archive_error_string(a) ? archive_error_string(a) : "corrupt");
            goto out;
        }
        sha256_update(&du, n, p);
    }
    /* Bytes after the compressed stream still belong to the blob. */
    ssize_t n;
    while ((n = read(r->fd, r->buf, sizeof(r->buf))) > 0)
        sha256_update(&r->h, (size_t)n, (const uint8_t *)r->buf);
    hex_digest(&r->h, compressed);
    hex_digest(&du, uncompressed);
out:
    archive_read_free(a);
    if (r->fd >= 0)
        close(r->fd);
    free(r);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* Paths. */

/* Normalise an entry's path into out: "./" and empty components dropped;
 * absolute paths and ".." refused.  "" (the layer's root) is allowed. */
static int
clean_path(const char *in, char *out, size_t outlen)
{
    if (in[0] == '/')
        return -EXDEV;
    size_t o = 0;
    const char *p = in;
    while (*p) {
        const char *s = strchr(p, '/');
        size_t n = s ? (size_t)(s - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.')
            return -EXDEV;
        if (n && !(n == 1 && p[0] == '.')) {
            if (o + n + 2 > outlen)
                return -ENAMETOOLONG;
            if (o)
                out[o++] = '/';
            memcpy(out + o, p, n);
            o += n;
        }
        p += n;
        if (*p == '/')
            p++;
    }
    out[o] = '\0';
    return 0;
}

static int
open_beneath(int root, const char *path, int flags)
{
    struct open_how how = {.flags = (uint64_t)(flags | O_CLOEXEC),
                           .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, root, path[0] ? path : ".", &how, sizeof(how));
    return fd < 0 ? -errno : fd;
}

/* Open the directory `dir` (a clean path) under root, creating missing
 * components (mode 0755, owned by root: a later entry sets its own). */
static int
open_dir(int root, const char *dir)
{
    int fd = open_beneath(root, dir, O_PATH | O_DIRECTORY);
    if (fd != -ENOENT)
        return fd;
    char buf[4096];
    snprintf(buf, sizeof(buf), "%s", dir);
    char *slash = strrchr(buf, '/');
    int pfd;
    const char *name = buf;
    if (slash) {
        *slash = '\0';
        name = slash + 1;
        pfd = open_dir(root, buf);
    } else {
        pfd = open_beneath(root, "", O_PATH | O_DIRECTORY);
    }
    if (pfd < 0)
        return pfd;
    int rc = mkdirat(pfd, name, 0755) == 0 || errno == EEXIST ? 0 : -errno;
    close(pfd);
    if (rc)
        return rc;
    return open_beneath(root, dir, O_PATH | O_DIRECTORY);
}

/* Remove whatever is at pfd/name (a directory with its contents). */
static int
remove_at(int pfd, const char *name)
{
    struct stat st;
    if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
        return errno == ENOENT ? 0 : -errno;
    if (!S_ISDIR(st.st_mode))
        return unlinkat(pfd, name, 0) == 0 ? 0 : -errno;
    char path[64];
    int d = openat(pfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (d < 0)
        return -errno;
    snprintf(path, sizeof(path), "/proc/self/fd/%d", d);
    char real[4096];
    ssize_t n = readlink(path, real, sizeof(real) - 1);
    close(d);
    if (n <= 0)
        return -EIO;
    real[n] = '\0';
    return sbx_rm_rf(real);
}

/* ------------------------------------------------------------------------------ */
/* Entries. */

struct unpack {
    struct archive *a;
    int root;
    int skipped;
    const char *blob;
};

static int
write_data(struct unpack *u, int fd, const char *path, sbx_err_t *err)
{
    for (;;) {
        const void *p;
        size_t n;
        la_int64_t off;
        int x = archive_read_data_block(u->a, &p, &n, &off);
        if (x == ARCHIVE_EOF)
            return 0;
        if (x != ARCHIVE_OK)
            return sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer %s: %s: %s", u->blob, path,
                                archive_error_string(u->a) ? archive_error_string(u->a)
                                                           : "corrupt data");
        while (n > 0) {
            ssize_t w = pwrite(fd, p, n, off);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                return sbx_err_make(err, SBX_E_STORAGE, "write %s: %s", path, strerror(errno));
            p = (const char *)p + w;
            n -= (size_t)w;
            off += w;
        }
    }
}

static int
entry_one(struct unpack *u, struct archive_entry *e, sbx_err_t *err)
{
    char path[4096], dir[4096];
    const char *raw = archive_entry_pathname(e);
    if (!raw)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer %s: an entry without a path",
                            u->blob);
    int rc = clean_path(raw, path, sizeof(path));
    if (rc)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "layer %s: unsafe path '%s' (absolute, or with '..')", u->blob, raw);
    if (!path[0])
        return 0; /* "./": the layer's root itself */
    char *slash = strrchr(path, '/');
    const char *name = slash ? slash + 1 : path;
    if (slash)
        snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
    else
        dir[0] = '\0';
    _cleanup_close_ int pfd = open_dir(u->root, dir);
    if (pfd < 0)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "layer %s: '%s': its directory does not resolve inside the layer "
                            "(%s)",
                            u->blob, raw, strerror(-pfd));

    /* Whiteouts (image-spec layer.md). */
    if (!strncmp(name, WH_PREFIX, strlen(WH_PREFIX))) {
        if (!strcmp(name, WH_OPAQUE)) {
            _cleanup_close_ int d = openat(pfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (d < 0 || fsetxattr(d, OPAQUE_XATTR, "y", 1, 0) < 0)
                return sbx_err_make(err, SBX_E_STORAGE, "mark %s opaque: %s",
                                    dir[0] ? dir : "/", strerror(errno));
            return 0;
        }
        const char *hidden = name + strlen(WH_PREFIX);
        if (!hidden[0] || !strcmp(hidden, ".") || !strcmp(hidden, ".."))
            return sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer %s: bad whiteout '%s'",
                                u->blob, raw);
        if ((rc = remove_at(pfd, hidden)) != 0 ||
            (mknodat(pfd, hidden, S_IFCHR | 0, makedev(0, 0)) < 0 && (rc = -errno)))
            return sbx_err_make(err, SBX_E_STORAGE, "whiteout %s: %s", raw, strerror(-rc));
        return 0;
    }

    mode_t type = archive_entry_filetype(e);
    mode_t perm = archive_entry_perm(e) & 07777;
    uid_t uid = (uid_t)archive_entry_uid(e);
    gid_t gid = (gid_t)archive_entry_gid(e);
    const char *hl = archive_entry_hardlink(e);
    struct stat st;
    bool exists = fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0;

    if (hl) {
        char target[4096];
        if (clean_path(hl, target, sizeof(target)) != 0 || !target[0])
            return sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer %s: unsafe link target '%s'",
                                u->blob, hl);
        _cleanup_close_ int t = open_beneath(u->root, target, O_PATH | O_NOFOLLOW);
        if (t < 0)
            return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                                "layer %s: hard link '%s' to '%s': not inside the layer (%s)",
                                u->blob, raw, hl, strerror(-t));
        if (exists && (rc = remove_at(pfd, name)) != 0)
            return sbx_err_make(err, SBX_E_STORAGE, "replace %s: %s", raw, strerror(-rc));
        if (linkat(t, "", pfd, name, AT_EMPTY_PATH) < 0)
            return sbx_err_make(err, SBX_E_STORAGE, "link %s: %s", raw, strerror(errno));
        return 0;
    }
    if (type == AE_IFDIR) {
        if (exists && !S_ISDIR(st.st_mode) && (rc = remove_at(pfd, name)) != 0)
            return sbx_err_make(err, SBX_E_STORAGE, "replace %s: %s", raw, strerror(-rc));
        if (mkdirat(pfd, name, 0700) < 0 && errno != EEXIST)
            return sbx_err_make(err, SBX_E_STORAGE, "mkdir %s: %s", raw, strerror(errno));
    } else {
        if (exists && (rc = remove_at(pfd, name)) != 0)
            return sbx_err_make(err, SBX_E_STORAGE, "replace %s: %s", raw, strerror(-rc));
        if (type == AE_IFREG) {
            _cleanup_close_ int fd =
                openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
            if (fd < 0)
                return sbx_err_make(err, SBX_E_STORAGE, "create %s: %s", raw, strerror(errno));
            if ((rc = write_data(u, fd, raw, err)) != 0)
                return rc;
            /* chown first: it clears the set-uid bits fchmod then sets. */
            if (fchown(fd, uid, gid) < 0 || fchmod(fd, perm) < 0)
                return sbx_err_make(err, SBX_E_STORAGE, "own %s: %s", raw, strerror(errno));
        } else if (type == AE_IFLNK) {
            const char *t = archive_entry_symlink(e);
            if (!t || symlinkat(t, pfd, name) < 0)
                return sbx_err_make(err, SBX_E_STORAGE, "symlink %s: %s", raw,
                                    t ? strerror(errno) : "no target");
        } else if (type == AE_IFIFO) {
            if (mknodat(pfd, name, S_IFIFO | 0600, 0) < 0)
                return sbx_err_make(err, SBX_E_STORAGE, "mkfifo %s: %s", raw, strerror(errno));
        } else {
            /* Character and block devices, sockets: left out. */
            u->skipped++;
            return 0;
        }
    }
    if (fchownat(pfd, name, uid, gid, AT_SYMLINK_NOFOLLOW) < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "chown %s: %s", raw, strerror(errno));
    if (type != AE_IFLNK && fchmodat(pfd, name, perm, 0) < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "chmod %s: %s", raw, strerror(errno));
    if (type != AE_IFDIR) {
        struct timespec ts[2] = {{archive_entry_mtime(e), archive_entry_mtime_nsec(e)},
                                 {archive_entry_mtime(e), archive_entry_mtime_nsec(e)}};
        utimensat(pfd, name, ts, AT_SYMLINK_NOFOLLOW); /* best effort */
    }
    return 0;
}

int
sbx_image_unpack(const char *blob, int dirfd, int *skipped, sbx_err_t *err)
{
    int rc = 0;
    struct unpack u = {.a = archive_read_new(), .root = dirfd, .blob = blob};
    archive_read_support_filter_all(u.a);
    archive_read_support_format_tar(u.a);
    archive_read_support_format_gnutar(u.a);
    if (archive_read_open_filename(u.a, blob, 65536) != ARCHIVE_OK) {
        rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer %s: %s", blob,
                          archive_error_string(u.a) ? archive_error_string(u.a) : "unreadable");
        goto out;
    }
    for (;;) {
        struct archive_entry *e;
        int x = archive_read_next_header(u.a, &e);
        if (x == ARCHIVE_EOF)
            break;
        if (x != ARCHIVE_OK && x != ARCHIVE_WARN) {
            rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "layer %s: not a valid tar: %s", blob,
                              archive_error_string(u.a) ? archive_error_string(u.a) : "corrupt");
            goto out;
        }
        if ((rc = entry_one(&u, e, err)) != 0)
            goto out;
    }
    if (skipped)
        *skipped = u.skipped;
out:
    archive_read_free(u.a);
    return rc;
}
