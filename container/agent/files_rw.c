/*
 * files_rw.c — the file operations that read or change files: file.write,
 * file.read, file.readStream (a lossless stream of chunks), file.mkdir,
 * file.delete, file.rename (mv in a fresh process), file.exists and
 * file.list.  Called by main.c's dispatch on the loop thread; every path
 * goes through files.c's path safety.  A readStream's state (struct
 * fstream) is owned by its stream and freed when the stream ends.
 */
#include "files_int.h"
/* ------------------------------------------------------------------------------ */
/* writeFile / readFile. */

static int
encoding_arg(struct agent *a, struct agent_req *r, bool *b64, bool *given)
{
    sbx_str enc;
    *b64 = false;
    *given = false;
    if (sbx_wire_get_str(r->args, "encoding", &enc) != 0)
        return 0;
    *given = true;
    if (sbx_str_eq(enc, "base64"))
        *b64 = true;
    else if (!sbx_str_eq(enc, "utf-8") && !sbx_str_eq(enc, "utf8")) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'encoding' must be \"utf-8\" or \"base64\"");
        return -1;
    }
    return 0;
}

void
agent_op_file_write(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    sbx_str content;
    bool b64, given;
    char *decoded = NULL;
    if (files_path_arg(a, r, "path", path) != 0 || encoding_arg(a, r, &b64, &given) != 0)
        return;
    if (sbx_wire_get_bin(r->args, "content", &content) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'content' (a string or bytes) is required");
        return;
    }
    if (b64) {
        size_t dn;
        if (sbx_base64_decode(content.p, content.n, &decoded, &dn) != 0) {
            agent_reply_err(a, r, SBX_E_VALIDATION,
                            "'content' is not valid base64 (alphabet [A-Za-z0-9+/=])");
            return;
        }
        content.p = decoded;
        content.n = dn;
    }
    /* append: add to the end (large files written in parts) instead of replacing. */
    bool append = false;
    if (files_bool_arg(a, r, r->args, "append", &append) != 0) {
        free(decoded);
        return;
    }
    int rc = files_make_parents(path);
    if (rc) {
        files_reply_path_err(a, r, rc, "file.write", path);
        free(decoded);
        return;
    }
    int fd = files_safe_open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644, false);
    if (fd < 0) {
        files_reply_path_err(a, r, fd, "file.write", path);
        free(decoded);
        return;
    }
    rc = sbx_write_full(fd, content.p, content.n);
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    free(decoded);
    if (rc) {
        files_reply_path_err(a, r, rc, "file.write", path);
        return;
    }
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "path", path);
    sbx_enc_kint(&e, "bytesWritten", (int64_t)content.n);
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, r, &e);
}

void
agent_op_file_read(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    bool b64, given;
    if (files_path_arg(a, r, "path", path) != 0 || encoding_arg(a, r, &b64, &given) != 0)
        return;
    int fd = files_safe_open(path, O_RDONLY, 0, false);
    if (fd < 0) {
        files_reply_path_err(a, r, fd, "file.read", path);
        return;
    }
    struct stat st;
    fstat(fd, &st);
    if ((uint64_t)st.st_size > READ_CAP) {
        close(fd);
        sbx_werr w;
        sbx_werr_init(&w, SBX_E_FILE_TOO_LARGE,
                      "%s is %lld bytes; readFile returns at most %u (use readFileStream)", path,
                      (long long)st.st_size, READ_CAP);
        sbx_enc_kstr(sbx_werr_ctx(&w), "path", path);
        sbx_enc_kint(sbx_werr_ctx(&w), "size", (int64_t)st.st_size);
        agent_reply_werr(a, r, &w);
        sbx_werr_free(&w);
        return;
    }
    sbx_buf b;
    sbx_buf_init(&b);
    sbx_buf_reserve(&b, (size_t)st.st_size);
    sbx_set_nonblock(fd, false);
    int rc = 0;
    for (;;) {
        sbx_buf_reserve(&b, 65536);
        ssize_t n = read(fd, b.p + b.len, b.cap - b.len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            break;
        }
        if (n == 0)
            break;
        b.len += (size_t)n;
        if (b.len > READ_CAP) {
            rc = -EFBIG;
            break;
        }
    }
    close(fd);
    if (rc) {
        files_reply_path_err(a, r, rc, "file.read", path);
        sbx_buf_free(&b);
        return;
    }
    bool binary;
    const char *mime =
        files_mime_of(path, (const unsigned char *)(b.p ? b.p : ""), SBX_MIN(b.len, (size_t)8192),
                      &binary);
    /* Text only if all of it is UTF-8: a text reply is a string, and a
     * string cannot carry other bytes without losing them. */
    if (!binary && sbx_utf8_valid(b.p ? b.p : "", b.len, NULL) != b.len)
        binary = true;
    bool as_b64 = given ? b64 : binary;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "path", path);
    if (as_b64) {
        size_t el;
        char *enc = sbx_base64_encode(b.p ? b.p : "", b.len, &el);
        sbx_enc_kstrn(&e, "content", enc, el);
        free(enc);
    } else {
        sbx_enc_kstrn(&e, "content", b.p ? b.p : "", b.len);
    }
    sbx_enc_kstr(&e, "encoding", as_b64 ? "base64" : "utf-8");
    sbx_enc_kbool(&e, "isBinary", binary);
    sbx_enc_kstr(&e, "mimeType", mime);
    sbx_enc_kint(&e, "size", (int64_t)b.len);
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, r, &e);
    sbx_buf_free(&b);
}

/* ------------------------------------------------------------------------------ */
/* readFileStream: metadata, chunks of ≤ 64 KiB as the reader takes them, complete. */

struct fstream {
    struct stream *st;
    int fd;
    uint64_t sent;
    bool text;          /* chunks are UTF-8 text (else base64) */
    char carry[4];      /* text: the start of a character the last read cut */
    size_t ncarry;
};

/* One chunk event: `data` is a string, UTF-8 text or the base64 of the raw
 * bytes, as `encoding` says (per chunk: a "text" file with a stray invalid
 * byte goes on in base64 rather than losing it). */
static void
fstream_chunk(struct fstream *f, const char *p, size_t n)
{
    sbx_enc *e = stream_begin(f->st, "chunk");
    if (f->text) {
        sbx_enc_kstrn(e, "data", p, n);
        sbx_enc_kstr(e, "encoding", "utf-8");
    } else {
        size_t el;
        char *enc = sbx_base64_encode(p, n, &el);
        sbx_enc_kstrn(e, "data", enc, el);
        free(enc);
        sbx_enc_kstr(e, "encoding", "base64");
    }
    sbx_enc_kint(e, "bytes", (int64_t)n);
    stream_commit(f->st, false);
}

static void fstream_pump(struct fstream *f);

static void
fstream_resume(struct stream *st, void *arg)
{
    (void)st;
    fstream_pump(arg);
}

static void
fstream_cancel(struct stream *st, void *arg)
{
    struct fstream *f = arg;
    sbx_enc *e = stream_begin(st, "error");
    sbx_enc_kmap(e, "error");
    sbx_enc_kstr(e, "code", "OPERATION_INTERRUPTED");
    sbx_enc_kstr(e, "message", "the stream was cancelled");
    sbx_enc_end(e);
    stream_commit(st, true);
    close(f->fd);
    st->ops = NULL;
    stream_unref(st);
    free(f);
}

static const struct stream_ops fstream_ops = {fstream_resume, fstream_cancel};

static void
fstream_pump(struct fstream *f)
{
    struct stream *st = f->st;
    char buf[CHUNK];
    while (!stream_full(st)) {
        ssize_t n = read(f->fd, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n < 0) {
                sbx_enc *e = stream_begin(st, "error");
                sbx_enc_kmap(e, "error");
                sbx_enc_kstr(e, "code", "FILESYSTEM_ERROR");
                sbx_enc_kstr(e, "message", strerror(errno));
                sbx_enc_end(e);
            } else {
                if (f->ncarry) {
                    /* a character cut by the end of the file: its bytes as they are */
                    f->text = false;
                    fstream_chunk(f, f->carry, f->ncarry);
                }
                sbx_enc *e = stream_begin(st, "complete");
                sbx_enc_kint(e, "bytesRead", (int64_t)f->sent);
            }
            stream_commit(st, true);
            close(f->fd);
            st->ops = NULL;
            stream_unref(st);
            free(f);
            return;
        }
        f->sent += (uint64_t)n;
        if (f->text) {
            char tb[CHUNK + 4];
            memcpy(tb, f->carry, f->ncarry);
            memcpy(tb + f->ncarry, buf, (size_t)n);
            size_t total = f->ncarry + (size_t)n, inc = 0;
            size_t ok = sbx_utf8_valid(tb, total, &inc);
            if (ok + inc == total) {
                if (ok)
                    fstream_chunk(f, tb, ok);
                memcpy(f->carry, tb + ok, inc);
                f->ncarry = inc;
                continue;
            }
            /* Not UTF-8 after all: the rest goes as base64, losslessly. */
            if (ok)
                fstream_chunk(f, tb, ok);
            f->text = false;
            f->ncarry = 0;
            fstream_chunk(f, tb + ok, total - ok);
            continue;
        }
        fstream_chunk(f, buf, (size_t)n);
    }
    st->paused = true;
}

void
agent_op_file_read_stream(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES], sid[72];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    int fd = files_safe_open(path, O_RDONLY, 0, false);
    if (fd < 0) {
        files_reply_path_err(a, r, fd, "file.readStream", path);
        return;
    }
    sbx_set_nonblock(fd, false);
    struct stat st;
    fstat(fd, &st);
    unsigned char head[8192];
    ssize_t hn = pread(fd, head, sizeof(head), 0);
    bool binary;
    const char *mime = files_mime_of(path, head, hn > 0 ? (size_t)hn : 0, &binary);
    struct fstream *f = sbx_xcalloc(1, sizeof(*f));
    f->fd = fd;
    f->text = !binary;
    snprintf(sid, sizeof(sid), "file-%llu", (unsigned long long)++a->stream_ctr);
    f->st = stream_new(a, sid, true, 1u << 20, &fstream_ops, f);
    sbx_enc *e = stream_begin(f->st, "metadata");
    sbx_enc_kstr(e, "path", path);
    sbx_enc_kstr(e, "mimeType", mime);
    sbx_enc_kint(e, "size", (int64_t)st.st_size);
    sbx_enc_kbool(e, "isBinary", binary);
    sbx_enc_kstr(e, "encoding", binary ? "base64" : "utf-8");
    stream_commit(f->st, false);
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kstr(&res, "streamId", sid);
    agent_reply_ok(a, r, &res);
    fstream_pump(f);
}

/* ------------------------------------------------------------------------------ */
/* mkdir, delete, rename/move, exists. */

static void
reply_simple(struct agent *a, struct agent_req *r, const char *k1, const char *v1, const char *k2,
             const char *v2)
{
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    if (k1)
        sbx_enc_kstr(&e, k1, v1);
    if (k2)
        sbx_enc_kstr(&e, k2, v2);
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, r, &e);
}

void
agent_op_file_mkdir(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    bool recursive = false;
    if (files_path_arg(a, r, "path", path) != 0 ||
        files_bool_arg(a, r, r->args, "recursive", &recursive))
        return;
    int rc = recursive ? sbx_mkdir_p(path, 0755) : (mkdir(path, 0755) < 0 ? -errno : 0);
    if (rc) {
        files_reply_path_err(a, r, rc, "directory.create", path);
        return;
    }
    reply_simple(a, r, "path", path, NULL, NULL);
}

void
agent_op_file_delete(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    struct stat st;
    if (lstat(path, &st) < 0) {
        files_reply_path_err(a, r, -errno, "file.delete", path);
        return;
    }
    if (S_ISDIR(st.st_mode)) {
        sbx_werr w;
        sbx_werr_init(&w, SBX_E_IS_DIRECTORY,
                      "Cannot delete directory with deleteFile() at '%s'. Use exec('rm -rf "
                      "<path>') instead.", path);
        sbx_enc_kstr(sbx_werr_ctx(&w), "path", path);
        agent_reply_werr(a, r, &w);
        sbx_werr_free(&w);
        return;
    }
    if (unlink(path) < 0) {
        files_reply_path_err(a, r, -errno, "file.delete", path);
        return;
    }
    reply_simple(a, r, "path", path, NULL, NULL);
}

static void
mv_done(struct agent *a, void *arg, int code, bool timed_out, struct outcap *out,
        struct outcap *err)
{
    struct agent_req *r = arg;
    (void)out;
    if (code || timed_out) {
        agent_reply_err(a, r, SBX_E_FILESYSTEM, "move failed: %.*s",
                        (int)SBX_MIN(err->data.len, (size_t)300), err->data.p ? err->data.p : "");
        return;
    }
    sbx_str o = {"", 0}, n = {"", 0};
    if (sbx_wire_get_str(r->args, "oldPath", &o) != 0)
        sbx_wire_get_str(r->args, "sourcePath", &o);
    if (sbx_wire_get_str(r->args, "newPath", &n) != 0)
        sbx_wire_get_str(r->args, "destinationPath", &n);
    char op[PATH_MAX_BYTES], np[PATH_MAX_BYTES];
    sbx_str_copy(o, op, sizeof(op));
    sbx_str_copy(n, np, sizeof(np));
    reply_simple(a, r, "path", op, "newPath", np);
}

/*
 * One end of a rename: `path` itself (not followed, as rename(2) does not
 * follow it) or, for `parent`, the directory it would land in must not be
 * on a file system safe_open refuses, nor be reached through a magic link.
 * Without this the mv(1) fallback across mounts would copy procfs files
 * (its own /proc/self/environ) into the sandbox — nothing its tenant could
 * not read, but not what the file API promises (docs/protocol.md §3.4).
 */
static int
rename_end_ok(const char *path, bool parent)
{
    char dir[PATH_MAX_BYTES];
    snprintf(dir, sizeof(dir), "%s", path);
    if (parent) {
        char *slash = strrchr(dir, '/');
        if (!slash)
            return 0;
        if (slash == dir)
            slash[1] = '\0';
        else
            *slash = '\0';
    }
    int fd = files_openat2_nomagic(dir, O_PATH | (parent ? O_DIRECTORY : O_NOFOLLOW), 0);
    if (fd == -ENOENT && parent)
        return 0; /* created by make_parents, on the file system of its parent */
    if (fd < 0)
        return fd;
    int rc = files_forbidden_fs(fd) ? SBX_E_PERMISSION : 0;
    close(fd);
    return rc;
}

/* renameFile(oldPath, newPath) and moveFile(sourcePath, destinationPath). */
void
agent_op_file_rename(struct agent *a, struct agent_req *r)
{
    char from[PATH_MAX_BYTES], to[PATH_MAX_BYTES];
    bool move = sbx_wire_get(r->args, "sourcePath") != NULL;
    if (files_path_arg(a, r, move ? "sourcePath" : "oldPath", from) != 0 ||
        files_path_arg(a, r, move ? "destinationPath" : "newPath", to) != 0)
        return;
    struct stat st;
    if (lstat(from, &st) < 0) {
        files_reply_path_err(a, r, -errno, "file.move", from);
        return;
    }
    int rc = rename_end_ok(from, false);
    if (rc) {
        files_reply_path_err(a, r, rc, "file.move", from);
        return;
    }
    /* Moving into an existing directory keeps the name, as mv does. */
    struct stat dst;
    if (stat(to, &dst) == 0 && S_ISDIR(dst.st_mode) && !S_ISDIR(st.st_mode)) {
        const char *base = strrchr(from, '/');
        size_t l = strlen(to);
        int n = snprintf(to + l, sizeof(to) - l, "%s", base ? base : "/");
        if (n < 0 || (size_t)n >= sizeof(to) - l) {
            files_reply_path_err(a, r, SBX_E_NAME_TOO_LONG, "file.move", from);
            return;
        }
    }
    if ((rc = rename_end_ok(to, true)) != 0) {
        files_reply_path_err(a, r, rc, "file.move", to);
        return;
    }
    files_make_parents(to);
    if (rename(from, to) == 0) {
        reply_simple(a, r, "path", from, "newPath", to);
        return;
    }
    if (errno != EXDEV) {
        files_reply_path_err(a, r, -errno, "file.move", from);
        return;
    }
    /* Across mounts (/tmp → /workspace): copy and delete, as mv(1) does. */
    const char *argv[] = {"/bin/mv", "-f", "--", from, to, NULL};
    if (agent_run_internal(a, argv, "/", 600000, mv_done, r) != 0)
        files_reply_path_err(a, r, -EIO, "file.move", from);
}

void
agent_op_file_exists(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    struct stat st;
    bool ex = lstat(path, &st) == 0;
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "path", path);
    sbx_enc_kbool(&e, "exists", ex);
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, r, &e);
}

/* ------------------------------------------------------------------------------ */
/* listFiles: the SDK's FileInfo for every entry. */

static void
mode_str(mode_t m, char out[10])
{
    const char *c = "rwxrwxrwx";
    for (int i = 0; i < 9; i++)
        out[i] = (m & (1 << (8 - i))) ? c[i] : '-';
    out[9] = '\0';
}

struct lister {
    sbx_enc *e;
    size_t rootlen;     /* bytes of the listed directory's path in `path` */
    bool recursive, hidden;
    size_t count;
    bool capped;
    sbx_buf path;       /* the current entry's absolute path, NUL-terminated */
};

/*
 * List the directory open at `dfd` (taken over: closed here), whose
 * absolute path is L->path.  Everything below is resolved relative to that
 * fd, never by path again: between safe_open's checks and a second lookup
 * of the path, tenant code can swap the directory for a symlink
 * (renameat2 RENAME_EXCHANGE) and the agent would list whatever the link
 * names — /proc/self resolves to the agent's own /proc/1.  That is the race
 * of CVE-2018-15664 (`docker cp`; ../shared/reference/isolation.md §3 rows
 * 3–4), found here by tests/security/test_escape.c
 * file_api_survives_a_symlink_swap_race.  Subdirectories are opened with
 * O_NOFOLLOW (a single name: no symlink or magic link can be crossed) and
 * not entered when they are on a file system safe_open refuses
 * (files_forbidden_fs): a recursive listing of / lists the `proc` directory but
 * not its content.
 *
 * Paths are built in a growable buffer, so an entry deeper than PATH_MAX
 * (names of 255 bytes, 64 levels down) is reported with its whole path,
 * never a cut one.  The listing stops, with `truncated`, at LIST_MAX
 * entries or LIST_MAX_BYTES of encoded entries — the bound that matters:
 * entries with long paths are several KiB each, and a reply over the
 * shard's frame cap would cost the sandbox its container — and it does not
 * enter directories more than LIST_MAX_DEPTH levels down (also `truncated`).
 */
static void
list_dir(struct lister *L, int dfd, int depth)
{
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    size_t dirlen = L->path.len;
    bool at_root = dirlen == 1; /* "/": no separator to add */
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        if (!L->hidden && de->d_name[0] == '.')
            continue;
        if (L->count >= LIST_MAX) {
            L->capped = true;
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        L->path.len = dirlen;
        if (!at_root)
            sbx_buf_append(&L->path, "/", 1);
        sbx_buf_append(&L->path, de->d_name, strlen(de->d_name) + 1);
        L->path.len--; /* the NUL stays after the bytes */
        const char *full = L->path.p;
        const char *type = S_ISDIR(st.st_mode) ? "directory" : S_ISREG(st.st_mode) ? "file"
                           : S_ISLNK(st.st_mode)                                ? "symlink"
                                                                                : "other";
        char mode[10], ts[40];
        mode_str(st.st_mode, mode);
        sbx_iso8601((int64_t)st.st_mtim.tv_sec * 1000 + st.st_mtim.tv_nsec / 1000000, ts,
                    sizeof(ts));
        const char *rel = full + L->rootlen;
        while (*rel == '/')
            rel++;
        sbx_enc *e = L->e;
        /* The entry's size up front (its strings and ~200 bytes of keys,
         * time, mode and flags): a listing never crosses the bound. */
        size_t need = strlen(de->d_name) + L->path.len + strlen(rel) + 256;
        if (e->len + need > LIST_MAX_BYTES) {
            L->capped = true;
            break;
        }
        sbx_enc_map(e);
        sbx_enc_kstr(e, "name", de->d_name);
        sbx_enc_kstr(e, "absolutePath", full);
        sbx_enc_kstr(e, "relativePath", rel);
        sbx_enc_kstr(e, "type", type);
        sbx_enc_kint(e, "size", (int64_t)st.st_size);
        sbx_enc_kstr(e, "modifiedAt", ts);
        sbx_enc_kstr(e, "mode", mode);
        sbx_enc_kmap(e, "permissions");
        sbx_enc_kbool(e, "readable", faccessat(dirfd(d), de->d_name, R_OK, 0) == 0);
        sbx_enc_kbool(e, "writable", faccessat(dirfd(d), de->d_name, W_OK, 0) == 0);
        sbx_enc_kbool(e, "executable", faccessat(dirfd(d), de->d_name, X_OK, 0) == 0);
        sbx_enc_end(e);
        sbx_enc_end(e);
        L->count++;
        if (L->recursive && S_ISDIR(st.st_mode)) {
            if (depth + 1 >= LIST_MAX_DEPTH) {
                L->capped = true;
                continue;
            }
            int sub = openat(dirfd(d), de->d_name,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub >= 0 && files_forbidden_fs(sub))
                close(sub);
            else if (sub >= 0)
                list_dir(L, sub, depth + 1);
            if (L->capped)
                break;
        }
    }
    L->path.len = dirlen;
    closedir(d);
}

void
agent_op_file_list(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    struct lister L = {0};
    const msgpack_object *opts = NULL;
    sbx_wire_get_map(r->args, "options", &opts);
    const msgpack_object *src = opts ? opts : r->args;
    if (files_bool_arg(a, r, src, "recursive", &L.recursive) ||
        files_bool_arg(a, r, src, "includeHidden", &L.hidden))
        return;
    int fd = files_safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (fd < 0) {
        files_reply_path_err(a, r, fd, "directory.list", path);
        return;
    }
    /* The listed directory's path without trailing slashes ("/" stays). */
    size_t plen = strlen(path);
    while (plen > 1 && path[plen - 1] == '/')
        plen--;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "path", path);
    sbx_enc_karray(&e, "files");
    L.e = &e;
    L.rootlen = plen;
    sbx_buf_init(&L.path);
    sbx_buf_append(&L.path, path, plen);
    list_dir(&L, fd, 0); /* the checked fd, not the path again */
    sbx_buf_free(&L.path);
    sbx_enc_end(&e);
    sbx_enc_kint(&e, "count", (int64_t)L.count);
    if (L.capped)
        sbx_enc_kbool(&e, "truncated", true);
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, r, &e);
}
