/* image_store.c — the node's image store: open, imports (layout, tarball,
 * pull), list/inspect/rm, garbage collection and sandbox roots; see
 * image_store.h and docs/images.md.  A template's new layer is
 * image_template.c; what the two share, image_store_int.h. */
#include "image_store.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "image_store_int.h"

/* The store-wide lock (flock on <dir>/lock): held by its fd; -1 on error. */
int
imgst_lock(sbx_image_store *st, int op, sbx_err_t *err)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/lock", st->dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "open %s: %s", p, strerror(errno));
    while (flock(fd, op) < 0) {
        if (errno != EINTR) {
            int rc = sbx_err_make(err, SBX_E_STORAGE, "lock %s: %s", p, strerror(errno));
            close(fd);
            return rc;
        }
    }
    return fd;
}

/* flock(fd, op) polled (LOCK_NB, every 50 ms) until deadline (sbx_mono_ms;
 * 0 none) or *cancel (NULL: never): 0, or SBX_E_TIMEOUT with late_msg,
 * SBX_E_SHARD_UNAVAILABLE, or SBX_E_STORAGE naming path.  fd stays the
 * caller's either way. */
static int
flock_until(int fd, int op, const char *path, int64_t deadline, const _Atomic bool *cancel,
            const char *late_msg, sbx_err_t *err)
{
    while (flock(fd, op | LOCK_NB) < 0) {
        if (errno != EWOULDBLOCK && errno != EINTR)
            return sbx_err_make(err, SBX_E_STORAGE, "lock %s: %s", path, strerror(errno));
        if (deadline && sbx_mono_ms() > deadline)
            return sbx_err_make(err, SBX_E_TIMEOUT, "%s", late_msg);
        if (cancel && atomic_load(cancel))
            return sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "the shard is stopping");
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return 0;
}

int
imgst_lock_until(sbx_image_store *st, int op, int64_t deadline, const _Atomic bool *cancel,
                 sbx_err_t *err)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/lock", st->dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "open %s: %s", p, strerror(errno));
    int rc = flock_until(fd, op, p, deadline, cancel,
                         "the image store stayed locked past the deadline (an import, removal "
                         "or collection running)",
                         err);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    return fd;
}

bool
imgst_is_digest(const char *s)
{
    if (strncmp(s, "sha256:", 7) != 0 || strlen(s) != 71)
        return false;
    for (const char *p = s + 7; *p; p++)
        if (!((*p >= '0' && *p <= '9') || (*p >= 'a' && *p <= 'f')))
            return false;
    return true;
}

/* An image name: 1-255 bytes of [A-Za-z0-9._/:@-], not starting with "sha256:". */
bool
imgst_is_name(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > 255 || !strncmp(s, "sha256:", 7))
        return false;
    for (const char *p = s; *p; p++)
        if (!strchr("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/:@-", *p))
            return false;
    return true;
}

int
sbx_image_store_open(const char *dir, sbx_image_store **out, sbx_err_t *err)
{
    char p[4096];
    static const char *const sub[] = {"images", "layers", "use", "tmp", "blobs"};
    if (sbx_mkdir_p(dir, 0700) != 0)
        return sbx_err_make(err, SBX_E_STORAGE, "create the image store %s: %s", dir,
                            strerror(errno));
    for (size_t i = 0; i < SBX_ARRAY_LEN(sub); i++) {
        snprintf(p, sizeof(p), "%s/%s", dir, sub[i]);
        if (mkdir(p, 0700) < 0 && errno != EEXIST)
            return sbx_err_make(err, SBX_E_STORAGE, "mkdir %s: %s", p, strerror(errno));
    }
    /* Root's only: an image may hold what its owner keeps private.  The
     * sandboxes never look the layers up by path: the shard hands each a
     * detached mount of them (container/spawn.c). */
    chmod(dir, 0700);
    sbx_image_store *st = sbx_xcalloc(1, sizeof(*st));
    st->dir = sbx_xstrdup(dir);
    /* What an import interrupted by a crash left (under the lock: another
     * shard's import may be running). */
    int lk = imgst_lock(st, LOCK_EX | LOCK_NB, NULL);
    if (lk >= 0) {
        snprintf(p, sizeof(p), "%s/tmp", dir);
        DIR *d = opendir(p);
        struct dirent *de;
        while (d && (de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            char q[4096 + 256];
            snprintf(q, sizeof(q), "%s/%s", p, de->d_name);
            sbx_rm_rf(q);
        }
        if (d)
            closedir(d);
        close(lk);
    }
    *out = st;
    return 0;
}

void
sbx_image_store_close(sbx_image_store *st)
{
    if (!st)
        return;
    free(st->dir);
    free(st);
}

void
sbx_image_store_keep_blobs(sbx_image_store *st, bool on)
{
    st->keep_blobs = on;
}

const char *
sbx_image_store_dir(const sbx_image_store *st)
{
    return st->dir;
}

/* ------------------------------------------------------------------------------ */
/* Files. */

static int
sha256_file(const char *path, char out[SBX_IMAGE_DIGEST_LEN])
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    struct sha256_ctx h;
    sha256_init(&h);
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0)
        sha256_update(&h, (size_t)n, (const uint8_t *)buf);
    if (n < 0)
        return -errno;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&h, sizeof(d), d);
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
    return 0;
}

/* Write j to path atomically (a temporary file renamed over it). */
static int
json_save(const char *path, json_t *j, sbx_err_t *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    if (json_dump_file(j, tmp, JSON_INDENT(1) | JSON_SORT_KEYS) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return sbx_err_make(err, SBX_E_STORAGE, "write %s: %s", path, strerror(e));
    }
    return 0;
}

static json_t *
names_load(sbx_image_store *st)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/names.json", st->dir);
    json_t *j = json_load_file(p, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        j = json_object();
    }
    return j;
}

static int
names_save(sbx_image_store *st, json_t *names, sbx_err_t *err)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/names.json", st->dir);
    return json_save(p, names, err);
}

/* Write image mdigest's record (unless an identical image is there already)
 * and, with name, point the name at it; a record written here goes again if
 * the name cannot be saved.  Under the store's lock.  0 or a code (*err). */
int
imgst_record_save(sbx_image_store *st, const char *mdigest, json_t *record, const char *name,
                  sbx_err_t *err)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/images/%s.json", st->dir, mdigest + 7);
    struct stat sb;
    bool existed = stat(p, &sb) == 0;
    int rc;
    if (!existed && (rc = json_save(p, record, err)) != 0)
        return rc;
    if (!name)
        return 0;
    _cleanup_json_ json_t *names = names_load(st);
    json_object_set_new(names, name, json_string(mdigest));
    if ((rc = names_save(st, names, err)) != 0 && !existed)
        unlink(p);
    return rc;
}

json_t *
imgst_load(sbx_image_store *st, const char *digest)
{
    char p[4096];
    snprintf(p, sizeof(p), "%s/images/%s.json", st->dir, digest + 7);
    return json_load_file(p, 0, NULL);
}

/* Resolve ref under a lock already held. */
static int
resolve_locked(sbx_image_store *st, const char *ref, char digest[SBX_IMAGE_DIGEST_LEN],
               sbx_err_t *err)
{
    char p[4096];
    struct stat sb;
    if (imgst_is_digest(ref)) {
        snprintf(p, sizeof(p), "%s/images/%s.json", st->dir, ref + 7);
        if (stat(p, &sb) == 0) {
            snprintf(digest, SBX_IMAGE_DIGEST_LEN, "%s", ref);
            return 0;
        }
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "no image %s in this node's store", ref);
    }
    _cleanup_json_ json_t *names = names_load(st);
    const char *d = json_string_value(json_object_get(names, ref));
    if (d && imgst_is_digest(d)) {
        snprintf(digest, SBX_IMAGE_DIGEST_LEN, "%s", d);
        return 0;
    }
    /* A prefix of a digest (12+ hex digits, as `docker images` shows). */
    const char *hex = !strncmp(ref, "sha256:", 7) ? ref + 7 : ref;
    size_t n = strlen(hex);
    if (n >= 12 && n < 64 && strspn(hex, "0123456789abcdef") == n) {
        snprintf(p, sizeof(p), "%s/images", st->dir);
        DIR *dir = opendir(p);
        struct dirent *de;
        int found = 0;
        while (dir && (de = readdir(dir))) {
            if (!strncmp(de->d_name, hex, n) && strlen(de->d_name) == 64 + 5) {
                snprintf(digest, SBX_IMAGE_DIGEST_LEN, "sha256:%.64s", de->d_name);
                found++;
            }
        }
        if (dir)
            closedir(dir);
        if (found == 1)
            return 0;
        if (found > 1)
            return sbx_err_make(err, SBX_E_VALIDATION, "image prefix %s is ambiguous", ref);
    }
    return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "no image named '%s' in this node's store",
                        ref);
}

int
sbx_image_resolve(sbx_image_store *st, const char *ref, char digest[SBX_IMAGE_DIGEST_LEN],
                  sbx_err_t *err)
{
    /* No lock: names.json and images/ change only by rename(2) and
     * unlink(2), so a reader sees the store before or after a change. */
    return resolve_locked(st, ref, digest, err);
}

/* ------------------------------------------------------------------------------ */
/* Import. */

/* A blob of the layout: <layout>/blobs/sha256/<hex>, checked to exist. */
static int
blob_path(const char *layout, const char *digest, char *out, size_t outlen, sbx_err_t *err)
{
    if (!digest || !imgst_is_digest(digest))
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "a descriptor's digest '%s' is not sha256:<64 hex digits>",
                            digest ? digest : "(none)");
    snprintf(out, outlen, "%s/blobs/sha256/%s", layout, digest + 7);
    struct stat sb;
    if (stat(out, &sb) < 0 || !S_ISREG(sb.st_mode))
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "blob %s is missing from the layout",
                            digest);
    return 0;
}

/* Load a JSON blob after checking its digest. */
static int
blob_json(const char *layout, const char *digest, json_t **out, sbx_err_t *err)
{
    char p[4096], got[SBX_IMAGE_DIGEST_LEN];
    int rc = blob_path(layout, digest, p, sizeof(p), err);
    if (rc)
        return rc;
    if ((rc = sha256_file(p, got)) != 0)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "read %s: %s", p, strerror(-rc));
    if (strcmp(got, digest) != 0)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "blob %s has digest %s: tampered or corrupt",
                            digest, got);
    json_error_t je;
    *out = json_load_file(p, 0, &je);
    if (!json_is_object(*out)) {
        json_decref(*out);
        *out = NULL;
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "blob %s is not a JSON object: %s", digest,
                            je.text);
    }
    return 0;
}

/* The manifest to import from the layout's index.json: its first entry, or
 * for an image index that entry's linux/amd64 manifest. */
static int
pick_manifest(const char *layout, char digest[SBX_IMAGE_DIGEST_LEN], json_t **manifest,
              sbx_err_t *err)
{
    char p[4096];
    json_error_t je;
    snprintf(p, sizeof(p), "%s/index.json", layout);
    _cleanup_json_ json_t *index = json_load_file(p, 0, &je);
    if (!json_is_object(index))
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "%s is not an OCI image layout (index.json: %s)", layout, je.text);
    json_t *m = json_array_get(json_object_get(index, "manifests"), 0);
    _cleanup_json_ json_t *outer = NULL; /* an image index m points into */
    for (int depth = 0; depth < 2; depth++) {
        const char *d = json_string_value(json_object_get(m, "digest"));
        json_t *doc = NULL;
        int rc = blob_json(layout, d, &doc, err);
        if (rc)
            return rc;
        json_t *list = json_object_get(doc, "manifests");
        if (!json_is_array(list)) {
            snprintf(digest, SBX_IMAGE_DIGEST_LEN, "%s", d);
            *manifest = doc;
            return 0;
        }
        /* An image index (image-spec image-index.md): its linux/amd64
         * entry, else its first. */
        size_t i;
        json_t *v;
        m = json_array_get(list, 0);
        json_array_foreach(list, i, v) {
            json_t *pl = json_object_get(v, "platform");
            const char *os = json_string_value(json_object_get(pl, "os"));
            const char *arch = json_string_value(json_object_get(pl, "architecture"));
            if (os && arch && !strcmp(os, "linux") && !strcmp(arch, "amd64")) {
                m = v;
                break;
            }
        }
        json_decref(outer);
        outer = doc;
    }
    return sbx_err_make(err, SBX_E_IMAGE_INVALID, "%s: no manifest", layout);
}

static json_t *
strv_json(json_t *src)
{
    json_t *a = json_array();
    size_t i;
    json_t *v;
    json_array_foreach(src, i, v) {
        if (json_is_string(v))
            json_array_append(a, v);
    }
    return a;
}

/* Does any layer hold a shell at bin/sh or usr/bin/sh (file or link)? */
static bool
has_shell(char **dirs, int n)
{
    for (int i = 0; i < n; i++) {
        static const char *const sh[] = {"bin/sh", "usr/bin/sh"};
        for (size_t k = 0; k < SBX_ARRAY_LEN(sh); k++) {
            char p[4200];
            struct stat sb;
            snprintf(p, sizeof(p), "%s/%s", dirs[i], sh[k]);
            if (lstat(p, &sb) == 0 && !S_ISDIR(sb.st_mode) && !S_ISCHR(sb.st_mode))
                return true;
        }
    }
    return false;
}

/* Run argv (skopeo), its output into err on failure: 0 or code.  It is
 * SIGKILLed (and reaped) at deadline (sbx_mono_ms; 0 none) or as soon as
 * *cancel is set (NULL: never): a registry that stops sending mid-layer
 * leaves skopeo waiting for ever (it has no read timeout of its own), and
 * so would a tarball path on a hung file system; then SBX_E_TIMEOUT or
 * SBX_E_SHARD_UNAVAILABLE. */
static int
run_tool(char *const argv[], int code, int64_t deadline, const _Atomic bool *cancel,
         sbx_err_t *err)
{
    int pfd[2];
    if (pipe2(pfd, O_CLOEXEC) < 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0) {
        close(pfd[0]);
        close(pfd[1]);
        return sbx_err_make(err, SBX_E_INTERNAL, "fork: %s", strerror(errno));
    }
    if (pid == 0) {
        dup2(pfd[1], 1);
        dup2(pfd[1], 2);
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(pfd[1]);
    char out[1024];
    size_t n = 0;
    char sink[4096];
    int gave_up = 0; /* SBX_E_TIMEOUT or SBX_E_SHARD_UNAVAILABLE once killed */
    bool eof = false;
    for (;;) {
        int64_t left = deadline ? deadline - sbx_mono_ms() : 500;
        if (deadline && left <= 0)
            gave_up = SBX_E_TIMEOUT;
        else if (cancel && atomic_load(cancel))
            gave_up = SBX_E_SHARD_UNAVAILABLE;
        if (gave_up) {
            kill(pid, SIGKILL);
            break;
        }
        struct pollfd p = {.fd = pfd[0], .events = POLLIN};
        int pr = poll(&p, 1, (int)SBX_MIN(left, (int64_t)500));
        if (pr < 0 && errno != EINTR)
            break; /* killed below */
        if (pr <= 0)
            continue;
        ssize_t r = read(pfd[0], n < sizeof(out) - 1 ? out + n : sink,
                         n < sizeof(out) - 1 ? sizeof(out) - 1 - n : sizeof(sink));
        if (r == 0 || (r < 0 && errno != EINTR)) {
            eof = r == 0;
            break;
        }
        if (r > 0 && n < sizeof(out) - 1)
            n += (size_t)r;
    }
    if (!eof && !gave_up)
        kill(pid, SIGKILL); /* its output broke off: the wait below must not be for ever */
    close(pfd[0]);
    out[n] = '\0';
    while (n && (out[n - 1] == '\n' || out[n - 1] == ' '))
        out[--n] = '\0';
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ; /* ended: EOF on its output, or SIGKILLed just now */
    if (gave_up == SBX_E_TIMEOUT)
        return sbx_err_make(err, SBX_E_TIMEOUT, "%s did not finish in time: stopped", argv[0]);
    if (gave_up)
        return sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "the shard is stopping: %s stopped",
                            argv[0]);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
        return sbx_err_make(err, SBX_E_INTERNAL, "%s is not installed (tools/deps.sh)", argv[0]);
    return sbx_err_make(err, code, "%s failed: %s", argv[0], out);
}

/* Collect garbage under the exclusive lock (the policy is in image_store.h). */
int
imgst_gc_locked(sbx_image_store *st, int *removed)
{
    char p[4096];
    _cleanup_json_ json_t *names = names_load(st);
    _cleanup_json_ json_t *keep = json_object(); /* layer diff_id hex -> true */
    _cleanup_json_ json_t *bkeep = json_object(); /* blob digest hex -> true */
    int n = 0;
    snprintf(p, sizeof(p), "%s/images", st->dir);
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        size_t len = strlen(de->d_name);
        if (len != 64 + 5 || strcmp(de->d_name + 64, ".json") != 0)
            continue;
        char digest[SBX_IMAGE_DIGEST_LEN];
        snprintf(digest, sizeof(digest), "sha256:%.64s", de->d_name);
        bool named = false;
        const char *k;
        json_t *v;
        json_object_foreach(names, k, v) {
            if (json_is_string(v) && !strcmp(json_string_value(v), digest))
                named = true;
        }
        bool drop = false;
        if (!named) {
            char u[4200];
            snprintf(u, sizeof(u), "%s/use/%.64s", st->dir, de->d_name);
            int fd = open(u, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
            if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0) {
                drop = true;
                unlink(u);
            }
            if (fd >= 0)
                close(fd);
        }
        if (drop) {
            char f[4200];
            snprintf(f, sizeof(f), "%s/images/%s", st->dir, de->d_name);
            unlink(f);
            n++;
            continue;
        }
        _cleanup_json_ json_t *img = imgst_load(st, digest);
        size_t i;
        json_t *l;
        json_array_foreach(json_object_get(img, "layers"), i, l) {
            const char *s = json_string_value(l);
            if (s && imgst_is_digest(s))
                json_object_set_new(keep, s + 7, json_true());
        }
        /* The blobs it was imported from (served to peers: image_fetch.c). */
        json_object_set_new(bkeep, digest + 7, json_true());
        const char *cd = json_string_value(json_object_get(img, "configDigest"));
        if (cd && imgst_is_digest(cd))
            json_object_set_new(bkeep, cd + 7, json_true());
        json_array_foreach(json_object_get(img, "layerBlobs"), i, l) {
            const char *s = json_string_value(l);
            if (s && imgst_is_digest(s))
                json_object_set_new(bkeep, s + 7, json_true());
        }
    }
    if (d)
        closedir(d);
    snprintf(p, sizeof(p), "%s/blobs", st->dir);
    d = opendir(p);
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.' || json_object_get(bkeep, de->d_name))
            continue;
        char f[4200];
        snprintf(f, sizeof(f), "%s/blobs/%s", st->dir, de->d_name);
        unlink(f);
    }
    if (d)
        closedir(d);
    snprintf(p, sizeof(p), "%s/layers", st->dir);
    d = opendir(p);
    while (d && (de = readdir(d))) {
        if (de->d_name[0] == '.' || json_object_get(keep, de->d_name))
            continue;
        char f[4200];
        snprintf(f, sizeof(f), "%s/layers/%s", st->dir, de->d_name);
        sbx_rm_rf(f);
    }
    if (d)
        closedir(d);
    if (removed)
        *removed = n;
    return 0;
}

/* Keep layout's verified blob digest in the store's blobs/ (image_fetch.c). */
static int
keep_blob(sbx_image_store *st, const char *layout, const char *digest, sbx_err_t *err)
{
    char src[4096];
    int rc = blob_path(layout, digest, src, sizeof(src), err);
    return rc ? rc : sbx_image_keep_blob(st, src, digest, err);
}

/* Import the OCI layout at layout, under the exclusive lock. */
static int
import_layout(sbx_image_store *st, const char *layout, const char *source, const char *name,
              char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err)
{
    int rc = 0;
    json_t *manifest = NULL, *config = NULL, *record = NULL;
    char *tmpdirs[SBX_IMAGE_MAX_LAYERS] = {NULL};
    char *dirs[SBX_IMAGE_MAX_LAYERS] = {NULL};
    char mdigest[SBX_IMAGE_DIGEST_LEN];
    int nl = 0;

    if ((rc = pick_manifest(layout, mdigest, &manifest, err)) != 0)
        goto out;
    const char *cdigest = json_string_value(json_object_get(json_object_get(manifest, "config"),
                                                            "digest"));
    if ((rc = blob_json(layout, cdigest, &config, err)) != 0)
        goto out;
    json_t *layers = json_object_get(manifest, "layers");
    json_t *diffs = json_object_get(json_object_get(config, "rootfs"), "diff_ids");
    if (!json_is_array(layers) || !json_is_array(diffs) ||
        json_array_size(layers) != json_array_size(diffs) || json_array_size(layers) == 0 ||
        json_array_size(layers) > SBX_IMAGE_MAX_LAYERS) {
        rc = sbx_err_make(err, SBX_E_IMAGE_INVALID,
                          "the manifest's layers and the config's rootfs.diff_ids must be two "
                          "lists of the same length, 1 to %d",
                          SBX_IMAGE_MAX_LAYERS);
        goto out;
    }
    nl = (int)json_array_size(layers);
    /* Verify every layer blob and unpack the ones the store lacks, into tmp/. */
    for (int i = 0; i < nl; i++) {
        const char *ld = json_string_value(json_object_get(json_array_get(layers, i), "digest"));
        const char *diff = json_string_value(json_array_get(diffs, i));
        char bp[4096], comp[SBX_IMAGE_DIGEST_LEN], unc[SBX_IMAGE_DIGEST_LEN];
        if ((rc = blob_path(layout, ld, bp, sizeof(bp), err)) != 0)
            goto out;
        if (!diff || !imgst_is_digest(diff)) {
            rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "diff_id %d is not a sha256 digest", i);
            goto out;
        }
        dirs[i] = sbx_xmalloc(strlen(st->dir) + 80);
        sprintf(dirs[i], "%s/layers/%s", st->dir, diff + 7);
        if ((rc = sbx_image_layer_digests(bp, comp, unc, err)) != 0)
            goto out;
        if (strcmp(comp, ld) != 0 || strcmp(unc, diff) != 0) {
            rc = sbx_err_make(err, SBX_E_IMAGE_INVALID,
                              "layer %d: blob digest %s (manifest says %s), diff_id %s (config "
                              "says %s): tampered or corrupt",
                              i, comp, ld, unc, diff);
            goto out;
        }
        struct stat sb;
        if (stat(dirs[i], &sb) == 0)
            continue; /* shared with an image already here */
        bool dup = false;
        for (int k = 0; k < i; k++)
            dup |= !strcmp(dirs[k], dirs[i]) && tmpdirs[k];
        if (dup)
            continue;
        tmpdirs[i] = sbx_xmalloc(strlen(st->dir) + 40);
        sprintf(tmpdirs[i], "%s/tmp/layer-XXXXXX", st->dir);
        if (!mkdtemp(tmpdirs[i])) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "mkdtemp in %s/tmp: %s", st->dir,
                              strerror(errno));
            free(tmpdirs[i]);
            tmpdirs[i] = NULL;
            goto out;
        }
        chmod(tmpdirs[i], 0755);
        _cleanup_close_ int dfd = open(tmpdirs[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        int skipped = 0;
        if (dfd < 0) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "open %s: %s", tmpdirs[i], strerror(errno));
            goto out;
        }
        if ((rc = sbx_image_unpack(bp, dfd, &skipped, err)) != 0)
            goto out;
        if (skipped)
            sbx_log_info("image %s: layer %s: %d device node(s) left out", mdigest, diff, skipped);
    }
    /* The image must have a shell (the agent's commands run /bin/sh). */
    {
        char *look[SBX_IMAGE_MAX_LAYERS];
        for (int i = 0; i < nl; i++)
            look[i] = tmpdirs[i] ? tmpdirs[i] : dirs[i];
        if (!has_shell(look, nl)) {
            rc = sbx_err_make(err, SBX_E_IMAGE_INVALID,
                              "the image has no /bin/sh: sandboxes run their commands with it");
            goto out;
        }
    }
    /* The record, then the layers into place, then the name. */
    json_t *cc = json_object_get(config, "config");
    json_t *cfg = json_object();
    json_object_set_new(cfg, "env", strv_json(json_object_get(cc, "Env")));
    json_object_set_new(cfg, "entrypoint", strv_json(json_object_get(cc, "Entrypoint")));
    json_object_set_new(cfg, "cmd", strv_json(json_object_get(cc, "Cmd")));
    const char *wd = json_string_value(json_object_get(cc, "WorkingDir"));
    const char *user = json_string_value(json_object_get(cc, "User"));
    json_object_set_new(cfg, "workingDir", json_string(wd ? wd : ""));
    json_object_set_new(cfg, "user", json_string(user ? user : ""));
    json_t *ports = json_array();
    const char *pk;
    json_t *pv;
    json_object_foreach(json_object_get(cc, "ExposedPorts"), pk, pv) {
        json_array_append_new(ports, json_string(pk));
    }
    json_object_set_new(cfg, "exposedPorts", ports);
    record = json_object();
    json_object_set_new(record, "digest", json_string(mdigest));
    json_object_set_new(record, "configDigest", json_string(cdigest));
    json_object_set_new(record, "config", cfg);
    json_t *ll = json_array();
    int64_t size = 0;
    for (int i = 0; i < nl; i++) {
        json_array_append(ll, json_array_get(diffs, i));
        size += json_integer_value(json_object_get(json_array_get(layers, i), "size"));
    }
    json_object_set_new(record, "layers", ll);
    json_t *lb = json_array();
    for (int i = 0; i < nl; i++)
        json_array_append(lb, json_object_get(json_array_get(layers, i), "digest"));
    json_object_set_new(record, "layerBlobs", lb);
    if (st->keep_blobs && ((rc = keep_blob(st, layout, mdigest, err)) != 0 ||
                           (rc = keep_blob(st, layout, cdigest, err)) != 0))
        goto out;
    for (int i = 0; st->keep_blobs && i < nl && rc == 0; i++)
        rc = keep_blob(st, layout,
                       json_string_value(json_object_get(json_array_get(layers, i), "digest")),
                       err);
    if (rc)
        goto out;
    json_object_set_new(record, "size", json_integer(size));
    json_object_set_new(record, "created", json_integer(sbx_wall_ms()));
    json_object_set_new(record, "source", json_string(source));
    for (int i = 0; i < nl; i++) {
        if (tmpdirs[i] && rename(tmpdirs[i], dirs[i]) < 0) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "rename %s: %s", tmpdirs[i], strerror(errno));
            goto out;
        }
        free(tmpdirs[i]);
        tmpdirs[i] = NULL;
    }
    if ((rc = imgst_record_save(st, mdigest, record, name, err)) != 0)
        goto out;
    snprintf(digest, SBX_IMAGE_DIGEST_LEN, "%s", mdigest);
out:
    for (int i = 0; i < SBX_IMAGE_MAX_LAYERS; i++) {
        if (tmpdirs[i])
            sbx_rm_rf(tmpdirs[i]);
        free(tmpdirs[i]);
        free(dirs[i]);
    }
    if (rc)
        imgst_gc_locked(st, NULL); /* layers renamed before a later step failed */
    json_decref(manifest);
    json_decref(config);
    json_decref(record);
    return rc;
}

int
sbx_image_import(sbx_image_store *st, const char *path, const char *name,
                 char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err)
{
    struct stat sb;
    if (name && !imgst_is_name(name))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "image name '%s': 1-255 bytes of [A-Za-z0-9._/:@-], not sha256:…",
                            name);
    if (!path || path[0] != '/')
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "path must be absolute: a path on the server's machine");
    if (stat(path, &sb) < 0)
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "%s: %s (a path on the server's machine)",
                            path, strerror(errno));
    if (!S_ISDIR(sb.st_mode) && !S_ISREG(sb.st_mode))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "%s is neither a directory (an OCI layout) nor a file (a tarball)",
                            path);
    _cleanup_close_ int lk = imgst_lock(st, LOCK_EX, err);
    if (lk < 0)
        return lk;
    if (S_ISDIR(sb.st_mode))
        return import_layout(st, path, path, name, digest, err);
    /* A tarball: skopeo makes a layout of it in tmp/ (docker-archive, as
     * `docker save` and `podman save` write; else an OCI archive). */
    char tmp[4096], dst[4200], src[4200];
    snprintf(tmp, sizeof(tmp), "%s/tmp/archive-XXXXXX", st->dir);
    if (!mkdtemp(tmp))
        return sbx_err_make(err, SBX_E_STORAGE, "mkdtemp: %s", strerror(errno));
    snprintf(dst, sizeof(dst), "oci:%s/oci:img", tmp);
    snprintf(src, sizeof(src), "docker-archive:%s", path);
    char *argv[] = {"skopeo", "copy", "--quiet", src, dst, NULL};
    int64_t until = sbx_mono_ms() + SBX_IMAGE_TOOL_MS;
    int rc = run_tool(argv, SBX_E_IMAGE_INVALID, until, NULL, NULL);
    if (rc && rc != SBX_E_TIMEOUT) {
        snprintf(src, sizeof(src), "oci-archive:%s", path);
        _cleanup_err_ sbx_err_t e2 = NULL;
        rc = run_tool(argv, SBX_E_IMAGE_INVALID, until, NULL, &e2);
        if (rc == SBX_E_TIMEOUT)
            rc = sbx_err_make(err, rc, "skopeo did not convert %s within %d ms", path,
                              SBX_IMAGE_TOOL_MS);
        else if (rc)
            rc = sbx_err_make(err, SBX_E_IMAGE_INVALID,
                              "%s is neither a docker-archive (docker/podman save) nor an OCI "
                              "archive: %s",
                              path, sbx_err_msg(e2));
    } else if (rc) {
        rc = sbx_err_make(err, rc, "skopeo did not convert %s within %d ms", path,
                          SBX_IMAGE_TOOL_MS);
    }
    if (rc == 0) {
        char layout[4200];
        snprintf(layout, sizeof(layout), "%s/oci", tmp);
        rc = import_layout(st, layout, path, name, digest, err);
    }
    sbx_rm_rf(tmp);
    return rc;
}

int
sbx_image_import_layout(sbx_image_store *st, const char *layout, const char *source,
                        char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err)
{
    _cleanup_close_ int lk = imgst_lock(st, LOCK_EX, err);
    if (lk < 0)
        return lk;
    return import_layout(st, layout, source, NULL, digest, err);
}

bool
sbx_image_ref_registry(const char *ref, char *host, size_t n)
{
    const char *slash = ref ? strchr(ref, '/') : NULL;
    if (!slash || slash == ref || slash[1] == '\0')
        return false;
    size_t len = (size_t)(slash - ref);
    bool domain = memchr(ref, '.', len) || memchr(ref, ':', len) ||
                  (len == 9 && !strncmp(ref, "localhost", 9));
    if (!domain || len >= n)
        return false;
    memcpy(host, ref, len);
    host[len] = '\0';
    return true;
}

int
sbx_image_pull(sbx_image_store *st, const char *ref, const char *name, unsigned flags,
               int64_t deadline, const _Atomic bool *cancel, char digest[SBX_IMAGE_DIGEST_LEN],
               sbx_err_t *err)
{
    if (!ref || !imgst_is_name(ref) || ref[0] == '-')
        return sbx_err_make(err, SBX_E_VALIDATION, "image reference '%s' is not valid",
                            ref ? ref : "");
    if (name && !imgst_is_name(name))
        return sbx_err_make(err, SBX_E_VALIDATION, "image name '%s' is not valid", name);
    if ((flags & SBX_IMAGE_PULL_MISSING) &&
        sbx_image_resolve(st, name ? name : ref, digest, NULL) == 0)
        return 0;
    /* One pull of a reference at a time on this node (every thread and
     * shard process of the store): <store>/pulls/<sha-256 of ref, 32 hex>, flock(2)ed
     * for the pull; a pull on demand that waited finds the image then. */
    char lpath[4200];
    snprintf(lpath, sizeof(lpath), "%s/pulls", st->dir);
    if (mkdir(lpath, 0700) < 0 && errno != EEXIST)
        return sbx_err_make(err, SBX_E_STORAGE, "mkdir %s: %s", lpath, strerror(errno));
    uint8_t h[SHA256_DIGEST_SIZE];
    struct sha256_ctx hc;
    sha256_init(&hc);
    sha256_update(&hc, strlen(ref), (const uint8_t *)ref);
    sha256_digest(&hc, sizeof(h), h);
    int off = snprintf(lpath, sizeof(lpath), "%s/pulls/", st->dir);
    for (int i = 0; i < 16; i++)
        off += snprintf(lpath + off, sizeof(lpath) - (size_t)off, "%02x", h[i]);
    _cleanup_close_ int rl = open(lpath, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (rl < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "open %s: %s", lpath, strerror(errno));
    /* Waited for without blocking in flock: the pull holding it is bounded
     * by its own deadline, this one by its own. */
    char late[700];
    snprintf(late, sizeof(late), "another pull of %s did not end before this one's deadline", ref);
    int lrc = flock_until(rl, LOCK_EX, lpath, deadline, cancel, late, err);
    if (lrc < 0)
        return lrc;
    if ((flags & SBX_IMAGE_PULL_MISSING) &&
        sbx_image_resolve(st, name ? name : ref, digest, NULL) == 0)
        return 0; /* the pull this one waited for brought it */
    /* The copy under the shared lock: the sweep of tmp/ at a store's open
     * needs the exclusive one, so it cannot remove this copy's directory. */
    int lk = imgst_lock_until(st, LOCK_SH, deadline, cancel, err);
    if (lk < 0)
        return lk;
    char tmp[4096], dst[4200], src[600];
    snprintf(tmp, sizeof(tmp), "%s/tmp/pull-XXXXXX", st->dir);
    if (!mkdtemp(tmp)) {
        close(lk);
        return sbx_err_make(err, SBX_E_STORAGE, "mkdtemp: %s", strerror(errno));
    }
    snprintf(dst, sizeof(dst), "oci:%s/oci:img", tmp);
    snprintf(src, sizeof(src), "docker://%s", ref);
    char *argv[] = {"skopeo", "copy", "--quiet", "--override-os", "linux", "--override-arch",
                    "amd64", src, dst, NULL, NULL};
    if (flags & SBX_IMAGE_PULL_INSECURE) {
        argv[9] = argv[8];
        argv[8] = argv[7];
        argv[7] = "--src-tls-verify=false";
    }
    int rc = run_tool(argv, SBX_E_IMAGE_NOT_FOUND, deadline, cancel, err);
    close(lk);
    if (rc == 0) {
        /* The import under the exclusive lock.  Between the two, only a
         * store's open could have swept tmp/ (it takes the exclusive lock
         * without waiting): then the layout is gone and the pull fails. */
        lk = imgst_lock_until(st, LOCK_EX, deadline, cancel, err);
        if (lk < 0) {
            rc = lk;
        } else {
            char layout[4200];
            snprintf(layout, sizeof(layout), "%s/oci", tmp);
            if ((flags & SBX_IMAGE_PULL_MISSING) &&
                sbx_image_resolve(st, name ? name : ref, digest, NULL) == 0)
                rc = 0; /* another pull of it ended first */
            else
                rc = import_layout(st, layout, src, name ? name : ref, digest, err);
            close(lk);
        }
    }
    sbx_rm_rf(tmp);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* List, inspect, remove. */

static json_t *
summary(sbx_image_store *st, const char *digest, json_t *names, bool full)
{
    json_t *img = imgst_load(st, digest);
    if (!img)
        return NULL;
    json_t *o = json_object();
    json_object_set_new(o, "digest", json_string(digest));
    json_t *nm = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(names, k, v) {
        if (json_is_string(v) && !strcmp(json_string_value(v), digest))
            json_array_append_new(nm, json_string(k));
    }
    json_object_set_new(o, "names", nm);
    json_object_set_new(o, "layers", json_integer((json_int_t)json_array_size(
                                         json_object_get(img, "layers"))));
    json_object_set(o, "size", json_object_get(img, "size"));
    json_object_set(o, "created", json_object_get(img, "created"));
    if (full) {
        json_object_set(o, "config", json_object_get(img, "config"));
        json_object_set(o, "diffIds", json_object_get(img, "layers"));
        json_object_set(o, "source", json_object_get(img, "source"));
    }
    json_decref(img);
    return o;
}

int
sbx_image_list(sbx_image_store *st, json_t **out, sbx_err_t *err)
{
    _cleanup_close_ int lk = imgst_lock(st, LOCK_SH, err);
    if (lk < 0)
        return lk;
    _cleanup_json_ json_t *names = names_load(st);
    json_t *arr = json_array();
    char p[4096];
    snprintf(p, sizeof(p), "%s/images", st->dir);
    DIR *d = opendir(p);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strlen(de->d_name) != 64 + 5 || strcmp(de->d_name + 64, ".json") != 0)
            continue;
        char digest[SBX_IMAGE_DIGEST_LEN];
        snprintf(digest, sizeof(digest), "sha256:%.64s", de->d_name);
        json_t *o = summary(st, digest, names, false);
        if (o)
            json_array_append_new(arr, o);
    }
    if (d)
        closedir(d);
    *out = arr;
    return 0;
}

int
sbx_image_inspect(sbx_image_store *st, const char *ref, json_t **out, sbx_err_t *err)
{
    _cleanup_close_ int lk = imgst_lock(st, LOCK_SH, err);
    if (lk < 0)
        return lk;
    char digest[SBX_IMAGE_DIGEST_LEN];
    int rc = resolve_locked(st, ref, digest, err);
    if (rc)
        return rc;
    _cleanup_json_ json_t *names = names_load(st);
    *out = summary(st, digest, names, true);
    if (!*out)
        return sbx_err_make(err, SBX_E_STORAGE, "image %s: its record is unreadable", digest);
    return 0;
}

int
sbx_image_rm(sbx_image_store *st, const char *ref, int *removed, sbx_err_t *err)
{
    _cleanup_close_ int lk = imgst_lock(st, LOCK_EX, err);
    if (lk < 0)
        return lk;
    char digest[SBX_IMAGE_DIGEST_LEN];
    int rc = resolve_locked(st, ref, digest, err);
    if (rc)
        return rc;
    _cleanup_json_ json_t *names = names_load(st);
    if (json_object_get(names, ref)) {
        json_object_del(names, ref);
    } else {
        /* By digest: every name of it. */
        const char *k;
        json_t *v;
        void *tmp;
        json_object_foreach_safe(names, tmp, k, v) {
            if (json_is_string(v) && !strcmp(json_string_value(v), digest))
                json_object_del(names, k);
        }
    }
    if ((rc = names_save(st, names, err)) != 0)
        return rc;
    return imgst_gc_locked(st, removed);
}

int
sbx_image_config(sbx_image_store *st, const char *digest, json_t **out, sbx_err_t *err)
{
    _cleanup_json_ json_t *img = imgst_is_digest(digest) ? imgst_load(st, digest) : NULL;
    json_t *cfg = json_object_get(img, "config");
    if (!json_is_object(cfg))
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "no image %s in this node's store",
                            digest);
    *out = json_incref(cfg);
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* A container's root. */

static char **
strv_of(json_t *a)
{
    size_t n = json_array_size(a), k = 0;
    char **v = sbx_xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (s)
            v[k++] = sbx_xstrdup(s);
    }
    return v;
}

int
sbx_image_open_root(sbx_image_store *st, const char *digest, struct sbx_image_root *root,
                    sbx_err_t *err)
{
    memset(root, 0, sizeof(*root));
    root->use_fd = -1;
    if (!imgst_is_digest(digest))
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "'%s' is not an image digest", digest);
    /* No store lock (an import may hold it for long): the use lock first,
     * then the record.  GC deletes an image only while it holds its use
     * file's LOCK_EX, and unlinks that file before the record: so either we
     * lock first and GC leaves the image alone, or its record is gone by the
     * time we read it. */
    char u[4096];
    snprintf(u, sizeof(u), "%s/use/%s", st->dir, digest + 7);
    root->use_fd = open(u, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (root->use_fd < 0 || flock(root->use_fd, LOCK_SH) < 0) {
        int rc = sbx_err_make(err, SBX_E_STORAGE, "lock %s: %s", u, strerror(errno));
        sbx_image_root_free(root);
        return rc;
    }
    _cleanup_json_ json_t *img = imgst_load(st, digest);
    if (!img) {
        sbx_image_root_free(root);
        unlink(u);
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND,
                            "image %s is no longer in this node's store", digest);
    }
    snprintf(root->digest, sizeof(root->digest), "%s", digest);
    json_t *layers = json_object_get(img, "layers");
    size_t n = json_array_size(layers);
    root->layers = sbx_xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++) {
        const char *d = json_string_value(json_array_get(layers, i));
        /* A layer that comes again higher up (Docker's empty layers) is
         * left out below: overlayfs refuses overlapping lower dirs, and the
         * higher copy shadows every path of the lower one anyway. */
        bool again = false;
        for (size_t k = i + 1; k < n && d; k++)
            again |= json_equal(json_array_get(layers, k), json_array_get(layers, i));
        if (again)
            continue;
        root->layers[root->nlayers] = sbx_xmalloc(strlen(st->dir) + 80);
        sprintf(root->layers[root->nlayers++], "%s/layers/%s", st->dir,
                d && imgst_is_digest(d) ? d + 7 : "-");
    }
    json_t *cfg = json_object_get(img, "config");
    root->env = strv_of(json_object_get(cfg, "env"));
    const char *wd = json_string_value(json_object_get(cfg, "workingDir"));
    const char *user = json_string_value(json_object_get(cfg, "user"));
    root->workdir = wd && wd[0] ? sbx_xstrdup(wd) : NULL;
    root->user = user && user[0] ? sbx_xstrdup(user) : NULL;
    int rc = sbx_image_user_resolve(root->layers, root->nlayers, root->user, &root->run_uid,
                                    &root->run_gid, err);
    if (rc) {
        sbx_image_root_free(root);
        return rc;
    }
    /* HOME from /etc/passwd unless the image's Env sets it; the groups. */
    char *home = NULL;
    int left = sbx_image_user_extras(root->layers, root->nlayers, root->user, root->run_uid,
                                     root->run_gid, &home, root->groups, &root->ngroups);
    if (left)
        sbx_log_warn("image %s: its User is in %d more supplementary groups than the %d "
                     "mapped; those are left out", digest, left, SBX_IMAGE_MAX_GROUPS);
    bool has_home = false;
    size_t ne = 0;
    for (char **e = root->env; e && *e; e++, ne++)
        has_home |= !strncmp(*e, "HOME=", 5);
    if (home && !has_home) {
        root->env = sbx_xrealloc(root->env, (ne + 2) * sizeof(char *));
        root->env[ne] = sbx_xmalloc(strlen(home) + 6);
        sprintf(root->env[ne], "HOME=%s", home);
        root->env[ne + 1] = NULL;
    }
    free(home);
    return 0;
}

void
sbx_image_root_free(struct sbx_image_root *root)
{
    if (root->layers)
        for (int i = 0; root->layers[i]; i++)
            free(root->layers[i]);
    free(root->layers);
    if (root->env)
        for (int i = 0; root->env[i]; i++)
            free(root->env[i]);
    free(root->env);
    free(root->workdir);
    free(root->user);
    if (root->use_fd >= 0)
        close(root->use_fd);
    memset(root, 0, sizeof(*root));
    root->use_fd = -1;
}
