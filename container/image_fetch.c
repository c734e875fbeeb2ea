/*
 * image_fetch.c — serving the blobs an image was imported from, and
 * fetching an image by digest from another node (image_store.h,
 * docs/images.md "Images in a cluster").
 *
 * The fetch writes what it receives into an OCI layout under the store's
 * tmp/ (image-spec image-layout.md: oci-layout, index.json, blobs/sha256/),
 * checks each blob's sha256 as it completes — a peer serving a corrupt or
 * tampered blob is refused before anything is unpacked — and then imports
 * the layout with sbx_image_import_layout, which verifies every digest
 * again and unpacks with the import's rules.  The transport is the
 * caller's (get), so this file knows nothing of nng or of the cluster.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "image_store.h"

/* Largest manifest or config the fetch accepts (they are a few KiB). */
#define FETCH_JSON_MAX (4u << 20)

static bool
digest_ok(const char *s)
{
    if (!s || strncmp(s, "sha256:", 7) != 0 || strlen(s) != 71)
        return false;
    return strspn(s + 7, "0123456789abcdef") == 64;
}

int
sbx_image_blob_read(sbx_image_store *st, const char *digest, uint64_t offset, size_t max,
                    char **data, size_t *len, uint64_t *size, sbx_err_t *err)
{
    *data = NULL;
    *len = 0;
    *size = 0;
    if (!digest_ok(digest))
        return sbx_err_make(err, SBX_E_VALIDATION, "'%s' is not sha256:<64 hex digits>",
                            digest ? digest : "");
    char p[4200];
    snprintf(p, sizeof(p), "%s/blobs/%s", sbx_image_store_dir(st), digest + 7);
    _cleanup_close_ int fd = open(p, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    struct stat sb;
    if (fd < 0 || fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode))
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "this node keeps no blob %s", digest);
    *size = (uint64_t)sb.st_size;
    if (offset >= *size)
        return 0;
    size_t want = *size - offset < max ? (size_t)(*size - offset) : max;
    char *buf = sbx_xmalloc(want ? want : 1);
    size_t got = 0;
    while (got < want) {
        ssize_t n = pread(fd, buf + got, want - got, (off_t)(offset + got));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            free(buf);
            return sbx_err_make(err, SBX_E_STORAGE, "read %s: %s", p,
                                n < 0 ? strerror(errno) : "short file");
        }
        got += (size_t)n;
    }
    *data = buf;
    *len = got;
    return 0;
}

int
sbx_image_keep_blob(sbx_image_store *st, const char *src, const char *digest, sbx_err_t *err)
{
    char dst[4200], tmp[4200], own[4200];
    const char *dir = sbx_image_store_dir(st);
    snprintf(dst, sizeof(dst), "%s/blobs/%s", dir, digest + 7);
    struct stat sb;
    if (stat(dst, &sb) == 0)
        return 0;
    snprintf(own, sizeof(own), "%s/tmp/", dir);
    if (!strncmp(src, own, strlen(own)) && link(src, dst) == 0)
        return 0;
    snprintf(tmp, sizeof(tmp), "%s/tmp/blob-XXXXXX", dir);
    _cleanup_close_ int out = mkostemp(tmp, O_CLOEXEC);
    _cleanup_close_ int in = open(src, O_RDONLY | O_CLOEXEC);
    int rc = 0;
    if (out < 0 || in < 0)
        rc = sbx_err_make(err, SBX_E_STORAGE, "keep blob %s: %s", digest, strerror(errno));
    char buf[65536];
    ssize_t n = 0;
    while (rc == 0 && (n = read(in, buf, sizeof(buf))) > 0)
        if (sbx_write_full(out, buf, (size_t)n) != 0)
            n = -1;
    if (rc == 0 && (n < 0 || fsync(out) < 0 || rename(tmp, dst) < 0))
        rc = sbx_err_make(err, SBX_E_STORAGE, "keep blob %s: %s", digest, strerror(errno));
    if (rc && out >= 0)
        unlink(tmp);
    return rc;
}

/* One blob through get into <layout>/blobs/sha256/<hex>, its digest checked. */
static int
fetch_blob(const char *layout, const char *digest, sbx_image_blob_fn get, void *arg, size_t chunk,
           int64_t deadline_ms, uint64_t *bytes, sbx_err_t *err)
{
    if (!digest_ok(digest))
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "a descriptor's digest '%s' is not "
                                                      "sha256:<64 hex digits>",
                            digest ? digest : "(none)");
    char p[4200];
    snprintf(p, sizeof(p), "%s/blobs/sha256/%s", layout, digest + 7);
    struct stat sb;
    if (stat(p, &sb) == 0)
        return 0; /* the manifest names it twice (Docker's empty layers) */
    _cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return sbx_err_make(err, SBX_E_STORAGE, "create %s: %s", p, strerror(errno));
    struct sha256_ctx h;
    sha256_init(&h);
    uint64_t off = 0, size = 0;
    do {
        if (deadline_ms && sbx_mono_ms() > deadline_ms)
            return sbx_err_make(err, SBX_E_TIMEOUT, "fetching blob %s: out of time at %llu bytes",
                                digest, (unsigned long long)off);
        char *data = NULL;
        size_t len = 0;
        int rc = get(arg, digest, off, chunk, &data, &len, &size, err);
        if (rc)
            return rc;
        if (len == 0 && off < size) {
            free(data);
            return sbx_err_make(err, SBX_E_IMAGE_INVALID, "blob %s: the source sent nothing at "
                                                          "offset %llu of %llu",
                                digest, (unsigned long long)off, (unsigned long long)size);
        }
        sha256_update(&h, len, (const uint8_t *)data);
        rc = len ? sbx_write_full(fd, data, len) : 0;
        free(data);
        if (rc)
            return sbx_err_make(err, SBX_E_STORAGE, "write %s: %s", p, strerror(errno));
        off += len;
        if (bytes)
            *bytes += len;
    } while (off < size);
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&h, sizeof(d), d);
    char got[SBX_IMAGE_DIGEST_LEN] = "sha256:";
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(got + 7 + 2 * i, 3, "%02x", d[i]);
    if (strcmp(got, digest) != 0)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "blob %s: tampered or corrupt (received: %s)", digest, got);
    return 0;
}

/* A fetched JSON blob of the layout. */
static json_t *
load_blob_json(const char *layout, const char *digest)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/blobs/sha256/%s", layout, digest + 7);
    struct stat sb;
    if (stat(p, &sb) < 0 || (uint64_t)sb.st_size > FETCH_JSON_MAX)
        return NULL;
    json_t *j = json_load_file(p, 0, NULL);
    if (!json_is_object(j)) {
        json_decref(j);
        return NULL;
    }
    return j;
}

static int
fetch_into(const char *layout, const char *digest, sbx_image_blob_fn get, void *arg, size_t chunk,
           int64_t deadline_ms, uint64_t *bytes, sbx_err_t *err)
{
    char p[4200];
    snprintf(p, sizeof(p), "%s/blobs/sha256", layout);
    if (sbx_mkdir_p(p, 0700) != 0)
        return sbx_err_make(err, SBX_E_STORAGE, "mkdir %s: %s", p, strerror(errno));
    int rc = fetch_blob(layout, digest, get, arg, chunk, deadline_ms, bytes, err);
    if (rc)
        return rc;
    json_t *m = load_blob_json(layout, digest);
    json_t *cfg = json_object_get(m, "config");
    json_t *layers = json_object_get(m, "layers");
    if (!json_is_object(cfg) || !json_is_array(layers) || json_array_size(layers) == 0 ||
        json_array_size(layers) > SBX_IMAGE_MAX_LAYERS) {
        json_decref(m);
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "%s is not an image manifest with a "
                                                      "config and 1 to %d layers",
                            digest, SBX_IMAGE_MAX_LAYERS);
    }
    rc = fetch_blob(layout, json_string_value(json_object_get(cfg, "digest")), get, arg, chunk,
                    deadline_ms, bytes, err);
    size_t i;
    json_t *l;
    json_array_foreach(layers, i, l) {
        if (rc)
            break;
        rc = fetch_blob(layout, json_string_value(json_object_get(l, "digest")), get, arg, chunk,
                        deadline_ms, bytes, err);
    }
    const char *mt = json_string_value(json_object_get(m, "mediaType"));
    json_t *index = NULL;
    if (rc == 0) {
        /* The layout's index: that one manifest (image-spec image-layout.md). */
        snprintf(p, sizeof(p), "%s/blobs/sha256/%s", layout, digest + 7);
        struct stat sb;
        stat(p, &sb);
        index = json_pack("{s:i, s:[{s:s, s:s, s:I}]}", "schemaVersion", 2, "manifests",
                          "mediaType", mt ? mt : "application/vnd.oci.image.manifest.v1+json",
                          "digest", digest, "size", (json_int_t)sb.st_size);
        snprintf(p, sizeof(p), "%s/index.json", layout);
        if (!index || json_dump_file(index, p, 0) != 0)
            rc = sbx_err_make(err, SBX_E_STORAGE, "write %s", p);
        snprintf(p, sizeof(p), "%s/oci-layout", layout);
        json_t *ol = json_pack("{s:s}", "imageLayoutVersion", "1.0.0");
        if (rc == 0 && (!ol || json_dump_file(ol, p, 0) != 0))
            rc = sbx_err_make(err, SBX_E_STORAGE, "write %s", p);
        json_decref(ol);
    }
    json_decref(index);
    json_decref(m);
    return rc;
}

int
sbx_image_fetch(sbx_image_store *st, const char *digest, sbx_image_blob_fn get, void *arg,
                size_t chunk, int64_t deadline_ms, const char *source, uint64_t *bytes,
                sbx_err_t *err)
{
    if (!digest_ok(digest))
        return sbx_err_make(err, SBX_E_VALIDATION, "'%s' is not sha256:<64 hex digits>",
                            digest ? digest : "");
    char layout[4200];
    snprintf(layout, sizeof(layout), "%s/tmp/fetch-XXXXXX", sbx_image_store_dir(st));
    if (!mkdtemp(layout))
        return sbx_err_make(err, SBX_E_STORAGE, "mkdtemp %s: %s", layout, strerror(errno));
    int rc = fetch_into(layout, digest, get, arg, chunk ? chunk : (1u << 20), deadline_ms, bytes,
                        err);
    char got[SBX_IMAGE_DIGEST_LEN];
    if (rc == 0)
        rc = sbx_image_import_layout(st, layout, source, got, err);
    if (rc == 0 && strcmp(got, digest) != 0) /* cannot be: the index names digest */
        rc = sbx_err_make(err, SBX_E_INTERNAL, "fetched %s but imported %s", digest, got);
    sbx_rm_rf(layout);
    return rc;
}
