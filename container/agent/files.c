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
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/json.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define READ_CAP (32u << 20) /* readFile limit, as the SDK's */
#define CHUNK (64u << 10)    /* readFileStream chunk */
#define LIST_MAX 100000
#define LIST_MAX_BYTES (32u << 20) /* encoded FileInfo entries in one listing */
#define LIST_MAX_DEPTH 64          /* directory levels a recursive listing enters */
#define PATH_MAX_BYTES 4096

/* ------------------------------------------------------------------------------ */
/* Paths. */

/* The boolean argument `key` of map into *out (left as is when absent or
 * nil); anything else is VALIDATION_FAILED, answered here: a typo such as
 * "append": "yes" must not silently replace a file.  0, or -1 when answered. */
static int
bool_arg(struct agent *a, struct agent_req *r, const msgpack_object *map, const char *key,
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
static int
path_arg(struct agent *a, struct agent_req *r, const char *key, char *out)
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

static bool
forbidden_fs(int fd)
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
static int
openat2_nomagic(const char *path, int flags, mode_t mode)
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
    if (fstat(fd, st) < 0 || forbidden_fs(fd))
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
static int
safe_open(const char *path, int flags, mode_t mode, bool want_dir)
{
    struct stat st, st2;
    for (int attempt = 0; attempt < 3; attempt++) {
        int p = openat2_nomagic(path, O_PATH, 0);
        if (p < 0) {
            if (p != -ENOENT || !(flags & O_CREAT))
                return p;
            int fd = openat2_nomagic(path, flags | O_EXCL, mode);
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

static void
reply_path_err(struct agent *a, struct agent_req *r, int rc, const char *op, const char *path)
{
    sbx_werr w;
    const char *what = rc == SBX_E_PERMISSION
                           ? "refused: not a regular file of the sandbox (devices, /proc, sockets "
                             "and links into the agent are off limits)"
                           : sbx_err_message(rc);
    if (rc == -ENOENT)
        sbx_werr_init(&w, rc, "File not found: %s", path);
    else
        sbx_werr_init(&w, rc, "%s %s: %s", op, path, what);
    sbx_enc_kstr(sbx_werr_ctx(&w), "path", path);
    sbx_enc_kstr(sbx_werr_ctx(&w), "operation", op);
    agent_reply_werr(a, r, &w);
    sbx_werr_free(&w);
}

/* mkdir -p of every parent of path. */
static int
make_parents(const char *path)
{
    char tmp[PATH_MAX_BYTES];
    snprintf(tmp, sizeof(tmp), "%s", path);
    char *slash = strrchr(tmp, '/');
    if (!slash || slash == tmp)
        return 0;
    *slash = '\0';
    return sbx_mkdir_p(tmp, 0755);
}

/* ------------------------------------------------------------------------------ */
/* MIME types: by extension (the table the SDK gets from Bun), then sniffed. */

static const struct {
    const char *ext, *mime;
} mimes[] = {
    {"txt", "text/plain"}, {"md", "text/markdown"}, {"html", "text/html"}, {"htm", "text/html"},
    {"css", "text/css"}, {"csv", "text/csv"}, {"tsv", "text/tab-separated-values"},
    {"js", "text/javascript"}, {"mjs", "text/javascript"}, {"cjs", "text/javascript"},
    {"ts", "text/x-typescript"}, {"tsx", "text/x-typescript"}, {"jsx", "text/javascript"},
    {"json", "application/json"}, {"xml", "application/xml"}, {"yaml", "application/yaml"},
    {"yml", "application/yaml"}, {"toml", "application/toml"}, {"py", "text/x-python"},
    {"sh", "application/x-sh"}, {"c", "text/x-c"}, {"h", "text/x-c"}, {"cpp", "text/x-c++"},
    {"rs", "text/x-rust"}, {"go", "text/x-go"}, {"java", "text/x-java"}, {"rb", "text/x-ruby"},
    {"svg", "image/svg+xml"}, {"png", "image/png"}, {"jpg", "image/jpeg"}, {"jpeg", "image/jpeg"},
    {"gif", "image/gif"}, {"webp", "image/webp"}, {"ico", "image/x-icon"}, {"bmp", "image/bmp"},
    {"pdf", "application/pdf"}, {"zip", "application/zip"}, {"gz", "application/gzip"},
    {"tar", "application/x-tar"}, {"wasm", "application/wasm"}, {"mp3", "audio/mpeg"},
    {"wav", "audio/wav"}, {"mp4", "video/mp4"}, {"webm", "video/webm"}, {"woff", "font/woff"},
    {"woff2", "font/woff2"}, {"ttf", "font/ttf"}, {"ipynb", "application/x-ipynb+json"},
    {"log", "text/plain"}, {"ini", "text/plain"}, {"cfg", "text/plain"}, {"conf", "text/plain"},
};

static bool
valid_utf8(const unsigned char *p, size_t n)
{
    for (size_t i = 0; i < n;) {
        unsigned char c = p[i];
        if (c == 0)
            return false;
        size_t k = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3
                             : (c & 0xf8) == 0xf0 ? 4 : 0;
        if (!k || (k > 1 && c < 0xc2) || i + k > n) {
            /* A truncated sequence at the end of a sample is fine. */
            return k && i + k > n && n >= 4096;
        }
        for (size_t j = 1; j < k; j++)
            if ((p[i + j] & 0xc0) != 0x80)
                return false;
        i += k;
    }
    return true;
}

static const char *
mime_of(const char *path, const unsigned char *head, size_t n, bool *binary)
{
    *binary = !valid_utf8(head, n);
    if (n >= 8 && !memcmp(head, "\x89PNG\r\n\x1a\n", 8))
        return "image/png";
    if (n >= 3 && !memcmp(head, "\xff\xd8\xff", 3))
        return "image/jpeg";
    if (n >= 4 && !memcmp(head, "GIF8", 4))
        return "image/gif";
    if (n >= 4 && !memcmp(head, "%PDF", 4))
        return "application/pdf";
    if (n >= 4 && !memcmp(head, "PK\x03\x04", 4))
        return "application/zip";
    if (n >= 2 && !memcmp(head, "\x1f\x8b", 2))
        return "application/gzip";
    if (n >= 4 && !memcmp(head, "\x7f" "ELF", 4))
        return "application/x-executable";
    const char *dot = strrchr(path, '.'), *slash = strrchr(path, '/');
    if (dot && (!slash || dot > slash)) {
        for (size_t i = 0; i < SBX_ARRAY_LEN(mimes); i++)
            if (!strcasecmp(dot + 1, mimes[i].ext))
                return mimes[i].mime;
    }
    return *binary ? "application/octet-stream" : "text/plain";
}

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
    if (path_arg(a, r, "path", path) != 0 || encoding_arg(a, r, &b64, &given) != 0)
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
    if (bool_arg(a, r, r->args, "append", &append) != 0) {
        free(decoded);
        return;
    }
    int rc = make_parents(path);
    if (rc) {
        reply_path_err(a, r, rc, "file.write", path);
        free(decoded);
        return;
    }
    int fd = safe_open(path, O_WRONLY | O_CREAT | (append ? O_APPEND : O_TRUNC), 0644, false);
    if (fd < 0) {
        reply_path_err(a, r, fd, "file.write", path);
        free(decoded);
        return;
    }
    rc = sbx_write_full(fd, content.p, content.n);
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    free(decoded);
    if (rc) {
        reply_path_err(a, r, rc, "file.write", path);
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
    if (path_arg(a, r, "path", path) != 0 || encoding_arg(a, r, &b64, &given) != 0)
        return;
    int fd = safe_open(path, O_RDONLY, 0, false);
    if (fd < 0) {
        reply_path_err(a, r, fd, "file.read", path);
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
        reply_path_err(a, r, rc, "file.read", path);
        sbx_buf_free(&b);
        return;
    }
    bool binary;
    const char *mime =
        mime_of(path, (const unsigned char *)(b.p ? b.p : ""), SBX_MIN(b.len, (size_t)8192), &binary);
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
    if (path_arg(a, r, "path", path) != 0)
        return;
    int fd = safe_open(path, O_RDONLY, 0, false);
    if (fd < 0) {
        reply_path_err(a, r, fd, "file.readStream", path);
        return;
    }
    sbx_set_nonblock(fd, false);
    struct stat st;
    fstat(fd, &st);
    unsigned char head[8192];
    ssize_t hn = pread(fd, head, sizeof(head), 0);
    bool binary;
    const char *mime = mime_of(path, head, hn > 0 ? (size_t)hn : 0, &binary);
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
    if (path_arg(a, r, "path", path) != 0 || bool_arg(a, r, r->args, "recursive", &recursive))
        return;
    int rc = recursive ? sbx_mkdir_p(path, 0755) : (mkdir(path, 0755) < 0 ? -errno : 0);
    if (rc) {
        reply_path_err(a, r, rc, "directory.create", path);
        return;
    }
    reply_simple(a, r, "path", path, NULL, NULL);
}

void
agent_op_file_delete(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    if (path_arg(a, r, "path", path) != 0)
        return;
    struct stat st;
    if (lstat(path, &st) < 0) {
        reply_path_err(a, r, -errno, "file.delete", path);
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
        reply_path_err(a, r, -errno, "file.delete", path);
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
    int fd = openat2_nomagic(dir, O_PATH | (parent ? O_DIRECTORY : O_NOFOLLOW), 0);
    if (fd == -ENOENT && parent)
        return 0; /* created by make_parents, on the file system of its parent */
    if (fd < 0)
        return fd;
    int rc = forbidden_fs(fd) ? SBX_E_PERMISSION : 0;
    close(fd);
    return rc;
}

/* renameFile(oldPath, newPath) and moveFile(sourcePath, destinationPath). */
void
agent_op_file_rename(struct agent *a, struct agent_req *r)
{
    char from[PATH_MAX_BYTES], to[PATH_MAX_BYTES];
    bool move = sbx_wire_get(r->args, "sourcePath") != NULL;
    if (path_arg(a, r, move ? "sourcePath" : "oldPath", from) != 0 ||
        path_arg(a, r, move ? "destinationPath" : "newPath", to) != 0)
        return;
    struct stat st;
    if (lstat(from, &st) < 0) {
        reply_path_err(a, r, -errno, "file.move", from);
        return;
    }
    int rc = rename_end_ok(from, false);
    if (rc) {
        reply_path_err(a, r, rc, "file.move", from);
        return;
    }
    /* Moving into an existing directory keeps the name, as mv does. */
    struct stat dst;
    if (stat(to, &dst) == 0 && S_ISDIR(dst.st_mode) && !S_ISDIR(st.st_mode)) {
        const char *base = strrchr(from, '/');
        size_t l = strlen(to);
        int n = snprintf(to + l, sizeof(to) - l, "%s", base ? base : "/");
        if (n < 0 || (size_t)n >= sizeof(to) - l) {
            reply_path_err(a, r, SBX_E_NAME_TOO_LONG, "file.move", from);
            return;
        }
    }
    if ((rc = rename_end_ok(to, true)) != 0) {
        reply_path_err(a, r, rc, "file.move", to);
        return;
    }
    make_parents(to);
    if (rename(from, to) == 0) {
        reply_simple(a, r, "path", from, "newPath", to);
        return;
    }
    if (errno != EXDEV) {
        reply_path_err(a, r, -errno, "file.move", from);
        return;
    }
    /* Across mounts (/tmp → /workspace): copy and delete, as mv(1) does. */
    const char *argv[] = {"/bin/mv", "-f", "--", from, to, NULL};
    if (agent_run_internal(a, argv, "/", 600000, mv_done, r) != 0)
        reply_path_err(a, r, -EIO, "file.move", from);
}

void
agent_op_file_exists(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    if (path_arg(a, r, "path", path) != 0)
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
 * (forbidden_fs): a recursive listing of / lists the `proc` directory but
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
            if (sub >= 0 && forbidden_fs(sub))
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
    if (path_arg(a, r, "path", path) != 0)
        return;
    struct lister L = {0};
    const msgpack_object *opts = NULL;
    sbx_wire_get_map(r->args, "options", &opts);
    const msgpack_object *src = opts ? opts : r->args;
    if (bool_arg(a, r, src, "recursive", &L.recursive) ||
        bool_arg(a, r, src, "includeHidden", &L.hidden))
        return;
    int fd = safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (fd < 0) {
        reply_path_err(a, r, fd, "directory.list", path);
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

/* ------------------------------------------------------------------------------ */
/* watch: inotify(7) events as a lossless stream. */

struct wdir {
    int wd;
    char *path;
};

struct watch {
    struct watch *next;
    struct agent *a;
    struct stream *st;
    int fd;
    sbx_watch *w;
    bool recursive;
    char **include, **exclude;
    struct wdir *dirs;
    size_t ndirs, capdirs;
    char root[PATH_MAX_BYTES];
};

static char **
patterns(const msgpack_object *args, const char *key, bool *bad)
{
    const msgpack_object *arr = NULL;
    int rc = sbx_wire_get_array(args, key, &arr);
    if (rc == -ENOENT)
        return NULL;
    if (rc || arr->via.array.size > 256) {
        *bad = true;
        return NULL;
    }
    char **v = sbx_xcalloc(arr->via.array.size + 1, sizeof(char *));
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) != 0 || s.n == 0 || s.n > 512) {
            *bad = true;
            v[i] = NULL;
            agent_env_free(v);
            return NULL;
        }
        v[i] = sbx_str_dup(s);
    }
    return v;
}

/* A pattern matches a path if it matches the whole relative path or any
 * of its components (fnmatch(3) globs: "*.log", ".git", "src/x.c"). */
static bool
matches_any(char **pats, const char *rel)
{
    bool hit = false;
    for (char **p = pats; p && *p && !hit; p++) {
        if (fnmatch(*p, rel, 0) == 0) {
            hit = true;
            break;
        }
        char *tmp = sbx_xstrdup(rel); /* whole: a path may be deeper than PATH_MAX */
        char *save, *tok;
        for (tok = strtok_r(tmp, "/", &save); tok && !hit; tok = strtok_r(NULL, "/", &save))
            hit = fnmatch(*p, tok, 0) == 0;
        free(tmp);
    }
    return hit;
}

/* rel_path — `full` (a path under the watch's root) relative to the root,
 * without a leading '/': "" for the root itself.  Works for root "/" too. */
static const char *
rel_path(const struct watch *w, const char *full)
{
    const char *rel = full + strlen(w->root);
    while (*rel == '/')
        rel++;
    return rel;
}

static bool
wanted(struct watch *w, const char *full)
{
    const char *rel = rel_path(w, full);
    if (!*rel)
        return true;
    if (w->exclude && matches_any(w->exclude, rel))
        return false;
    if (w->include && !matches_any(w->include, rel))
        return false;
    return true;
}

/*
 * Watch the directory open at `dfd` (taken over: closed here), whose path is
 * `path`, and with `recursive` its subdirectories.  As list_dir: the watch
 * is put on the checked fd itself (inotify_add_watch follows our own
 * /proc/self/fd/N to that directory) and subdirectories are opened relative
 * to it with O_NOFOLLOW and skipped on forbidden file systems, so a tenant
 * swapping a directory for a symlink mid-walk cannot make the agent watch
 * procfs (tests/security/test_escape.c file_api_survives_a_symlink_swap_race).
 */
static void
add_dir_fd(struct watch *w, int dfd, const char *path, int depth)
{
    char self[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", dfd);
    int wd = inotify_add_watch(w->fd, self,
                               IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM |
                                   IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_ONLYDIR);
    if (wd < 0) {
        close(dfd);
        return;
    }
    if (w->ndirs == w->capdirs) {
        w->capdirs = w->capdirs ? w->capdirs * 2 : 16;
        w->dirs = sbx_xrealloc(w->dirs, w->capdirs * sizeof(*w->dirs));
    }
    w->dirs[w->ndirs].wd = wd;
    w->dirs[w->ndirs].path = sbx_xstrdup(path);
    w->ndirs++;
    if (!w->recursive || depth > 32) {
        close(dfd);
        return;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_type != DT_DIR || !strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        /* On the heap: a tree deeper than PATH_MAX keeps whole paths. */
        sbx_buf sub;
        sbx_buf_init(&sub);
        sbx_buf_appendf(&sub, "%s/%s", strcmp(path, "/") ? path : "", de->d_name);
        if (w->exclude && matches_any(w->exclude, rel_path(w, sub.p))) {
            sbx_buf_free(&sub);
            continue;
        }
        int sfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sfd >= 0 && forbidden_fs(sfd))
            close(sfd);
        else if (sfd >= 0)
            add_dir_fd(w, sfd, sub.p, depth + 1);
        sbx_buf_free(&sub);
    }
    closedir(d);
}

/* A directory that appeared under the watch, resolved like any path. */
static void
add_dir(struct watch *w, const char *path, int depth)
{
    int dfd = safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (dfd >= 0)
        add_dir_fd(w, dfd, path, depth);
}

static const char *
dir_of(struct watch *w, int wd)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd)
            return w->dirs[i].path;
    return NULL;
}

static void
watch_free(struct watch *w)
{
    struct agent *a = w->a;
    for (struct watch **pp = &a->watches; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    if (w->w)
        sbx_loop_unwatch(a->loop, w->w);
    close(w->fd);
    for (size_t i = 0; i < w->ndirs; i++)
        free(w->dirs[i].path);
    free(w->dirs);
    agent_env_free(w->include);
    agent_env_free(w->exclude);
    free(w);
}

static void
watch_stop(struct watch *w, const char *reason)
{
    sbx_enc *e = stream_begin(w->st, "stopped");
    sbx_enc_kstr(e, "reason", reason);
    stream_commit(w->st, true);
    w->st->ops = NULL;
    stream_unref(w->st);
    watch_free(w);
}

static void
watch_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct watch *w = arg;
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    (void)l;
    (void)ev;
    for (;;) {
        if (stream_full(w->st)) {
            /* The reader is behind: leave events in the kernel's queue. */
            w->st->paused = true;
            sbx_loop_modify(w->a->loop, w->w, 0);
            return;
        }
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            return;
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ie = (struct inotify_event *)p;
            p += sizeof(*ie) + ie->len;
            if (ie->mask & IN_Q_OVERFLOW) {
                sbx_enc *e = stream_begin(w->st, "error");
                sbx_enc_kstr(e, "error", "inotify queue overflow: events were lost");
                stream_commit(w->st, false);
                continue;
            }
            const char *dir = dir_of(w, ie->wd);
            if (!dir)
                continue;
            if ((ie->mask & IN_DELETE_SELF) && !strcmp(dir, w->root)) {
                watch_stop(w, "the watched path was deleted");
                return;
            }
            if (!ie->len)
                continue;
            /* On the heap: events deeper than PATH_MAX keep whole paths
             * (add_dir cannot open such a directory by path: the kernel
             * refuses it, so it is not watched). */
            sbx_buf fb;
            sbx_buf_init(&fb);
            sbx_buf_appendf(&fb, "%s/%s", strcmp(dir, "/") ? dir : "", ie->name);
            const char *full = fb.p;
            bool isdir = ie->mask & IN_ISDIR;
            if (isdir && (ie->mask & (IN_CREATE | IN_MOVED_TO)) && w->recursive)
                add_dir(w, full, 1);
            if (!wanted(w, full)) {
                sbx_buf_free(&fb);
                continue;
            }
            const char *type = (ie->mask & IN_CREATE)        ? "create"
                               : (ie->mask & IN_DELETE)      ? "delete"
                               : (ie->mask & IN_MOVED_FROM)  ? "move_from"
                               : (ie->mask & IN_MOVED_TO)    ? "move_to"
                               : (ie->mask & IN_ATTRIB)      ? "attrib"
                               : (ie->mask & IN_CLOSE_WRITE) ? "modify"
                               : (ie->mask & IN_MODIFY)      ? "modify"
                                                             : NULL;
            if (type) {
                sbx_enc *e = stream_begin(w->st, "event");
                sbx_enc_kstr(e, "eventType", type);
                sbx_enc_kstr(e, "path", full);
                sbx_enc_kbool(e, "isDirectory", isdir);
                stream_commit(w->st, false);
            }
            sbx_buf_free(&fb);
        }
    }
}

static void
watch_resume(struct stream *st, void *arg)
{
    struct watch *w = arg;
    (void)st;
    sbx_loop_modify(w->a->loop, w->w, EPOLLIN);
}

static void
watch_cancel(struct stream *st, void *arg)
{
    (void)st;
    watch_stop(arg, "cancelled");
}

static const struct stream_ops watch_ops = {watch_resume, watch_cancel};

void
agent_op_file_watch(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES], sid[72];
    if (path_arg(a, r, "path", path) != 0)
        return;
    bool recursive = true;
    if (bool_arg(a, r, r->args, "recursive", &recursive) != 0)
        return;
    int dfd = safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (dfd < 0) {
        reply_path_err(a, r, dfd, "watch", path);
        return;
    }
    bool bad = false;
    struct watch *w = sbx_xcalloc(1, sizeof(*w));
    w->a = a;
    w->recursive = recursive;
    w->include = patterns(r->args, "include", &bad);
    w->exclude = patterns(r->args, "exclude", &bad);
    if (!bad && w->include && w->exclude) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_VALIDATION, "'include' and 'exclude' cannot be combined");
        return;
    }
    if (bad) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_VALIDATION, "'include' and 'exclude' are arrays of glob strings");
        return;
    }
    if (!w->include && !w->exclude && !sbx_wire_get(r->args, "exclude")) {
        static const char *const defaults[] = {".git", "node_modules", ".DS_Store", NULL};
        w->exclude = sbx_xcalloc(4, sizeof(char *));
        for (int i = 0; defaults[i]; i++)
            w->exclude[i] = sbx_xstrdup(defaults[i]);
    }
    snprintf(w->root, sizeof(w->root), "%s", path);
    size_t rl = strlen(w->root);
    while (rl > 1 && w->root[rl - 1] == '/')
        w->root[--rl] = '\0';
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_WATCH_START, "inotify_init1: %s", strerror(errno));
        return;
    }
    add_dir_fd(w, dfd, w->root, 0); /* the checked fd, not the path again */
    snprintf(sid, sizeof(sid), "watch-%llu", (unsigned long long)++a->stream_ctr);
    w->st = stream_new(a, sid, true, 1u << 20, &watch_ops, w);
    w->w = sbx_loop_watch(a->loop, w->fd, EPOLLIN, watch_cb, w);
    w->next = a->watches;
    a->watches = w;
    sbx_enc *e = stream_begin(w->st, "watching");
    sbx_enc_kstr(e, "path", w->root);
    sbx_enc_kstr(e, "watchId", sid);
    stream_commit(w->st, false);
    /* Answer after the watch is in place: no event after this is missed. */
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kstr(&res, "streamId", sid);
    sbx_enc_kstr(&res, "watchId", sid);
    sbx_enc_kstr(&res, "path", w->root);
    sbx_enc_kint(&res, "directories", (int64_t)w->ndirs);
    agent_reply_ok(a, r, &res);
}

void
agent_watches_free(struct agent *a)
{
    while (a->watches) {
        struct watch *w = a->watches;
        w->st->ops = NULL;
        stream_unref(w->st);
        watch_free(w);
    }
}

/* ------------------------------------------------------------------------------ */
/* gitCheckout: git clone in a fresh process; errors classified as the SDK's. */

struct gitop {
    struct agent_req *req;
    char url[2100];
    char dir[PATH_MAX_BYTES];
    char branch[256];
    int phase; /* 0 clone, 1 rev-parse */
};

static int
classify(const char *err)
{
    if (strcasestr(err, "not found") || strcasestr(err, "does not appear to be a git repository") ||
        strcasestr(err, "does not exist"))
        return strcasestr(err, "branch") ? SBX_E_GIT_BRANCH_NOT_FOUND : SBX_E_GIT_REPO_NOT_FOUND;
    if (strcasestr(err, "Authentication failed") || strcasestr(err, "could not read Username") ||
        strcasestr(err, "Permission denied (publickey"))
        return SBX_E_GIT_AUTH;
    if (strcasestr(err, "Could not resolve host") || strcasestr(err, "unable to access") ||
        strcasestr(err, "Connection refused") || strcasestr(err, "timed out"))
        return SBX_E_GIT_NETWORK;
    return SBX_E_GIT_CLONE;
}

static void
git_done(struct agent *a, void *arg, int code, bool timed_out, struct outcap *out,
         struct outcap *err)
{
    struct gitop *g = arg;
    char errtxt[600];
    snprintf(errtxt, sizeof(errtxt), "%.*s", (int)SBX_MIN(err->data.len, sizeof(errtxt) - 1),
             err->data.p ? err->data.p : "");
    if (g->phase == 0) {
        if (code || timed_out) {
            int c = timed_out ? SBX_E_GIT_CLONE : classify(errtxt);
            sbx_werr w;
            sbx_werr_init(&w, c, "git clone of %s failed%s: %s", g->url,
                          timed_out ? " (timed out)" : "", errtxt);
            sbx_enc_kstr(sbx_werr_ctx(&w), "repoUrl", g->url);
            sbx_enc_kint(sbx_werr_ctx(&w), "exitCode", code);
            agent_reply_werr(a, g->req, &w);
            sbx_werr_free(&w);
            free(g);
            return;
        }
        g->phase = 1;
        const char *argv[] = {"git", "-C", g->dir, "rev-parse", "--abbrev-ref", "HEAD", NULL};
        if (agent_run_internal(a, argv, "/", 30000, git_done, g) == 0)
            return;
        code = 0;
    }
    /* phase 1: the branch actually checked out */
    char branch[256] = "";
    if (code == 0 && out->data.len) {
        snprintf(branch, sizeof(branch), "%.*s", (int)SBX_MIN(out->data.len, sizeof(branch) - 1),
                 out->data.p);
        char *nl = strchr(branch, '\n');
        if (nl)
            *nl = '\0';
    }
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "repoUrl", g->url);
    sbx_enc_kstr(&e, "branch", branch[0] ? branch : g->branch);
    sbx_enc_kstr(&e, "targetDir", g->dir);
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, g->req, &e);
    free(g);
}

void
agent_op_git_checkout(struct agent *a, struct agent_req *r)
{
    sbx_str url, br = {0};
    int64_t depth = 0, tmo = 600000;
    if (sbx_wire_get_str(r->args, "repoUrl", &url) != 0 || url.n == 0 || url.n > 2048 ||
        memchr(url.p, '\0', url.n) || url.p[0] == '-') {
        agent_reply_err(a, r, SBX_E_INVALID_GIT_URL, "'repoUrl' must be a URL of 1-2048 bytes");
        return;
    }
    static const char *const schemes[] = {"https://", "http://", "git://", "ssh://", "file://"};
    bool ok = false;
    for (size_t i = 0; i < SBX_ARRAY_LEN(schemes); i++)
        if (url.n > strlen(schemes[i]) && !strncmp(url.p, schemes[i], strlen(schemes[i])))
            ok = true;
    if (!ok && memchr(url.p, '@', url.n) && memchr(url.p, ':', url.n))
        ok = true; /* scp-like user@host:path */
    if (!ok || memchr(url.p, ' ', url.n) || memchr(url.p, '\n', url.n)) {
        agent_reply_err(a, r, SBX_E_INVALID_GIT_URL, "'%.*s' is not a git URL (https, http, git, "
                        "ssh, file or user@host:path)", (int)SBX_MIN(url.n, (size_t)200), url.p);
        return;
    }
    if (sbx_wire_get_str(r->args, "branch", &br) == 0 &&
        (br.n == 0 || br.n > 250 || br.p[0] == '-' || memchr(br.p, ' ', br.n))) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'branch' is not a valid branch name");
        return;
    }
    if (sbx_wire_get_i64(r->args, "depth", &depth) == SBX_E_VALIDATION || depth < 0 ||
        depth > 1000000) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'depth' must be a positive number");
        return;
    }
    sbx_wire_get_i64(r->args, "cloneTimeoutMs", &tmo);
    struct gitop *g = sbx_xcalloc(1, sizeof(*g));
    g->req = r;
    sbx_str_copy(url, g->url, sizeof(g->url));
    if (br.n)
        sbx_str_copy(br, g->branch, sizeof(g->branch));
    if (sbx_wire_get(r->args, "targetDir")) {
        if (path_arg(a, r, "targetDir", g->dir) != 0) {
            free(g);
            return;
        }
    } else {
        /* /workspace/<repository name>, as the SDK does. */
        char name[256];
        const char *slash = strrchr(g->url, '/');
        const char *colon = strrchr(g->url, ':');
        const char *start = slash ? slash + 1 : colon ? colon + 1 : g->url;
        snprintf(name, sizeof(name), "%s", start);
        size_t nl = strlen(name);
        if (nl > 4 && !strcmp(name + nl - 4, ".git"))
            name[nl - 4] = '\0';
        if (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
            snprintf(name, sizeof(name), "repo");
        snprintf(g->dir, sizeof(g->dir), "/workspace/%s", name);
    }
    char dstr[32];
    snprintf(dstr, sizeof(dstr), "--depth=%lld", (long long)depth);
    const char *argv[12];
    int n = 0;
    argv[n++] = "git";
    argv[n++] = "-c";
    argv[n++] = "credential.interactive=never";
    argv[n++] = "clone";
    argv[n++] = "--quiet";
    if (depth > 0)
        argv[n++] = dstr;
    if (g->branch[0]) {
        argv[n++] = "--branch";
        argv[n++] = g->branch;
    }
    argv[n++] = "--";
    argv[n++] = g->url;
    argv[n++] = g->dir;
    argv[n] = NULL;
    make_parents(g->dir);
    if (agent_run_internal(a, argv, "/workspace", tmo > 0 ? tmo : 600000, git_done, g) != 0) {
        agent_reply_err(a, r, SBX_E_GIT_CLONE, "could not start git: %s", strerror(errno));
        free(g);
    }
}
