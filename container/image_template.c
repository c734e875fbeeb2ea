/*
 * image_template.c — a template's new layer added to the store as a new
 * image (sbx_image_add_layer, image_store.h; actors/template.c;
 * docs/images.md "Templates").
 */
#include <errno.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/util.h"
#include "image_store_int.h"


static void
sha256_mem(const char *p, size_t n, char out[SBX_IMAGE_DIGEST_LEN])
{
    struct sha256_ctx h;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&h);
    sha256_update(&h, n, (const uint8_t *)p);
    sha256_digest(&h, sizeof(d), d);
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
}

/* The digest of a JSON document as written compactly with sorted keys. */
static int
json_digest(json_t *j, char out[SBX_IMAGE_DIGEST_LEN], size_t *len)
{
    char *s = json_dumps(j, JSON_COMPACT | JSON_SORT_KEYS);
    if (!s)
        return SBX_E_INTERNAL;
    *len = strlen(s);
    sha256_mem(s, *len, out);
    free(s);
    return 0;
}

/* Keep the bytes text (len) in the store's blobs/ under digest, through a
 * file in tmp/ (sbx_image_keep_blob links it). */
static int
keep_text(sbx_image_store *st, const char *text, size_t len, const char *digest, sbx_err_t *err)
{
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s/tmp/tblob-XXXXXX", st->dir);
    _cleanup_close_ int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0 || sbx_write_full(fd, text, len) != 0 || fsync(fd) < 0) {
        int rc = sbx_err_make(err, SBX_E_STORAGE, "keep blob %s: %s", digest, strerror(errno));
        if (fd >= 0)
            unlink(tmp);
        return rc;
    }
    int rc = sbx_image_keep_blob(st, tmp, digest, err);
    unlink(tmp);
    return rc;
}

/* The layer descriptors of the manifest of base (a digest), read from the
 * blobs kept for peers (a new reference, the caller's); NULL when the store
 * keeps no blobs or not these (an image imported before it kept them, or a
 * template of one). */
static json_t *
base_descriptors(sbx_image_store *st, const char *base, json_t *blayers)
{
    if (!st->keep_blobs)
        return NULL;
    char p[4200], *text = NULL;
    size_t n;
    snprintf(p, sizeof(p), "%s/blobs/%s", st->dir, base + 7);
    if (sbx_fs_read(p, 4 << 20, &text, &n) != 0)
        return NULL;
    json_t *m = json_loadb(text, n, 0, NULL);
    free(text);
    json_t *ls = json_incref(json_object_get(m, "layers"));
    json_decref(m);
    if (!json_is_array(ls) || json_array_size(ls) != json_array_size(blayers)) {
        json_decref(ls);
        return NULL;
    }
    size_t i;
    json_t *d;
    json_array_foreach(ls, i, d) {
        const char *dg = json_string_value(json_object_get(d, "digest"));
        struct stat sb;
        snprintf(p, sizeof(p), "%s/blobs/%s", st->dir, dg && imgst_is_digest(dg) ? dg + 7 : "-");
        if (!dg || !imgst_is_digest(dg) || stat(p, &sb) != 0) {
            json_decref(ls);
            return NULL;
        }
    }
    return ls;
}

bool
sbx_image_name_valid(const char *name)
{
    return name && imgst_is_name(name);
}

int
sbx_image_add_layer(sbx_image_store *st, const char *base, const char *blob, const char *name,
                    const char *created_by, char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err)
{
    if (!name || !imgst_is_name(name))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "image name '%s': 1-255 bytes of [A-Za-z0-9._/:@-], not sha256:…",
                            name ? name : "");
    _cleanup_close_ int lk = imgst_lock(st, LOCK_EX, err);
    if (lk < 0)
        return lk;
    int rc = 0;
    char *tmpdir = NULL;
    json_t *rec = NULL, *config = NULL, *manifest = NULL, *bdesc = NULL;
    _cleanup_json_ json_t *brec = imgst_is_digest(base) ? imgst_load(st, base) : NULL;
    json_t *blayers = json_object_get(brec, "layers");
    if (!json_is_array(blayers)) {
        rc = sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "no image %s in this node's store "
                          "(removed during the build?)", base);
        goto out;
    }
    if (json_array_size(blayers) + 1 > SBX_IMAGE_MAX_LAYERS) {
        rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "image %s has %zu layers: a template of it "
                          "would exceed %d", base, json_array_size(blayers), SBX_IMAGE_MAX_LAYERS);
        goto out;
    }
    char comp[SBX_IMAGE_DIGEST_LEN], diff[SBX_IMAGE_DIGEST_LEN], ldir[4200];
    if ((rc = sbx_image_layer_digests(blob, comp, diff, err)) != 0)
        goto out;
    snprintf(ldir, sizeof(ldir), "%s/layers/%s", st->dir, diff + 7);
    struct stat sb;
    if (stat(ldir, &sb) != 0) {
        /* Unpacked with the import's rules (image_unpack.c), into tmp/ first. */
        tmpdir = sbx_xmalloc(strlen(st->dir) + 40);
        sprintf(tmpdir, "%s/tmp/layer-XXXXXX", st->dir);
        if (!mkdtemp(tmpdir)) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "mkdtemp in %s/tmp: %s", st->dir,
                              strerror(errno));
            free(tmpdir);
            tmpdir = NULL;
            goto out;
        }
        chmod(tmpdir, 0755);
        _cleanup_close_ int dfd = open(tmpdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        int skipped = 0;
        if (dfd < 0) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "open %s: %s", tmpdir, strerror(errno));
            goto out;
        }
        if ((rc = sbx_image_unpack(blob, dfd, &skipped, err)) != 0)
            goto out;
    }
    /* An OCI config and manifest for the new image (image-spec config.md,
     * manifest.md): the base's config, its diff_ids plus the new one, and a
     * history entry; layers described by diff_id (the store keeps layers
     * unpacked, not the base's compressed blobs).  Their digests name the
     * image as an import's do. */
    json_t *bcfg = json_object_get(brec, "config");
    json_t *cc = json_object();
    json_object_set(cc, "Env", json_object_get(bcfg, "env"));
    json_object_set(cc, "Entrypoint", json_object_get(bcfg, "entrypoint"));
    json_object_set(cc, "Cmd", json_object_get(bcfg, "cmd"));
    json_object_set(cc, "WorkingDir", json_object_get(bcfg, "workingDir"));
    json_object_set(cc, "User", json_object_get(bcfg, "user"));
    json_t *ports = json_object();
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(bcfg, "exposedPorts"), i, v) {
        if (json_is_string(v))
            json_object_set_new(ports, json_string_value(v), json_object());
    }
    json_object_set_new(cc, "ExposedPorts", ports);
    json_t *diffs = json_deep_copy(blayers);
    json_array_append_new(diffs, json_string(diff));
    json_t *hist = json_array();
    json_array_append_new(hist, json_pack("{s:s, s:s}", "created_by", created_by ? created_by : "",
                                          "comment", "sbx template build"));
    config = json_pack("{s:s, s:s, s:o, s:{s:s, s:o}, s:o}", "architecture", "amd64", "os",
                       "linux", "config", cc, "rootfs", "type", "layers", "diff_ids", diffs,
                       "history", hist);
    char cdigest[SBX_IMAGE_DIGEST_LEN], mdigest[SBX_IMAGE_DIGEST_LEN];
    size_t clen = 0, mlen = 0;
    if (!config || (rc = json_digest(config, cdigest, &clen)) != 0) {
        rc = sbx_err_make(err, SBX_E_INTERNAL, "encode the template's config");
        goto out;
    }
    /* In a cluster the store keeps the blobs peers fetch an image by
     * (image_fetch.c): the template's manifest then names the base's
     * compressed layer blobs and the new layer's blob, which are kept with
     * its config and manifest, so a node that lacks the template fetches it
     * like any image (a handoff, a failover).  Else the layers are named by
     * diff_id: this node alone can serve its sandboxes. */
    bdesc = base_descriptors(st, base, blayers);
    json_t *mlayers = json_array();
    if (bdesc) {
        json_array_foreach(bdesc, i, v)
            json_array_append(mlayers, v);
        unsigned char magic[2] = {0};
        _cleanup_close_ int bfd = open(blob, O_RDONLY | O_CLOEXEC);
        bool gz = bfd >= 0 && read(bfd, magic, 2) == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
        json_array_append_new(
            mlayers, json_pack("{s:s, s:s, s:I}", "mediaType",
                               gz ? "application/vnd.oci.image.layer.v1.tar+gzip"
                                  : "application/vnd.oci.image.layer.v1.tar",
                               "digest", comp, "size",
                               (json_int_t)(stat(blob, &sb) == 0 ? sb.st_size : 0)));
    } else {
        json_array_foreach(diffs, i, v) {
            json_array_append_new(mlayers, json_pack("{s:s, s:O}", "mediaType",
                                                     "application/vnd.oci.image.layer.v1.tar",
                                                     "digest", v));
        }
    }
    manifest = json_pack("{s:i, s:s, s:{s:s, s:s, s:I}, s:o}", "schemaVersion", 2, "mediaType",
                         "application/vnd.oci.image.manifest.v1+json", "config", "mediaType",
                         "application/vnd.oci.image.config.v1+json", "digest", cdigest, "size",
                         (json_int_t)clen, "layers", mlayers);
    if (!manifest || (rc = json_digest(manifest, mdigest, &mlen)) != 0) {
        rc = sbx_err_make(err, SBX_E_INTERNAL, "encode the template's manifest");
        goto out;
    }
    char src[200];
    snprintf(src, sizeof(src), "template of %s", base);
    rec = json_object();
    json_object_set_new(rec, "digest", json_string(mdigest));
    json_object_set_new(rec, "configDigest", json_string(cdigest));
    json_object_set(rec, "config", bcfg);
    json_object_set(rec, "layers", diffs);
    json_object_set_new(rec, "size", json_integer(json_integer_value(json_object_get(brec, "size")) +
                                                  (json_int_t)(stat(blob, &sb) == 0 ? sb.st_size : 0)));
    json_object_set_new(rec, "created", json_integer(sbx_wall_ms()));
    json_object_set_new(rec, "source", json_string(src));
    json_object_set(rec, "history", hist);
    if (bdesc) {
        json_t *lb = json_array();
        json_array_foreach(mlayers, i, v)
            json_array_append(lb, json_object_get(v, "digest"));
        json_object_set_new(rec, "layerBlobs", lb);
        char *ctext = json_dumps(config, JSON_COMPACT | JSON_SORT_KEYS);
        char *mtext = json_dumps(manifest, JSON_COMPACT | JSON_SORT_KEYS);
        if (!ctext || !mtext)
            rc = sbx_err_make(err, SBX_E_INTERNAL, "encode the template's blobs");
        if (rc == 0)
            rc = keep_text(st, ctext, strlen(ctext), cdigest, err);
        if (rc == 0)
            rc = keep_text(st, mtext, strlen(mtext), mdigest, err);
        if (rc == 0)
            rc = sbx_image_keep_blob(st, blob, comp, err);
        free(ctext);
        free(mtext);
        if (rc)
            goto out;
    }
    if (tmpdir) {
        if (rename(tmpdir, ldir) < 0) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "rename %s: %s", tmpdir, strerror(errno));
            goto out;
        }
        free(tmpdir);
        tmpdir = NULL;
    }
    if ((rc = imgst_record_save(st, mdigest, rec, name, err)) != 0)
        goto out;
    snprintf(digest, SBX_IMAGE_DIGEST_LEN, "%s", mdigest);
out:
    if (tmpdir) {
        sbx_rm_rf(tmpdir);
        free(tmpdir);
    }
    if (rc)
        imgst_gc_locked(st, NULL);
    json_decref(rec);
    json_decref(config);
    json_decref(manifest);
    json_decref(bdesc);
    return rc;
}
