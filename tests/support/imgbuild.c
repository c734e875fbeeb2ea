/* imgbuild.c — OCI layouts for the image tests; see imgbuild.h. */
#include "imgbuild.h"

#include <archive.h>
#include <archive_entry.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <nettle/sha2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static void
hexd(struct sha256_ctx *h, char out[72])
{
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(h, sizeof(d), d);
    memcpy(out, "sha256:", 7);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(out + 7 + 2 * i, 3, "%02x", d[i]);
}

static int
sha_file(const char *path, char out[72], long *size)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -1;
    struct sha256_ctx h;
    sha256_init(&h);
    char buf[65536];
    size_t n;
    long total = 0;
    while ((n = fread(buf, 1, sizeof(buf), f)) > 0) {
        sha256_update(&h, n, (const uint8_t *)buf);
        total += (long)n;
    }
    fclose(f);
    hexd(&h, out);
    if (size)
        *size = total;
    return 0;
}

static char *
slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *p = malloc((size_t)n + 1);
    if (fread(p, 1, (size_t)n, f) != (size_t)n) {
        free(p);
        fclose(f);
        return NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return p;
}

static int
write_entries(struct archive *a, const struct imgb_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *ae = archive_entry_new();
        archive_entry_set_pathname(ae, e[i].path);
        archive_entry_set_mtime(ae, 1700000000, 0);
        archive_entry_set_uid(ae, 0);
        archive_entry_set_gid(ae, 0);
        char *data = NULL;
        size_t len = 0;
        switch (e[i].type) {
        case 'F':
            data = slurp(e[i].data, &len);
            if (!data) {
                archive_entry_free(ae);
                return -1;
            }
            /* fall through */
        case 'f':
            if (e[i].type == 'f') {
                len = e[i].data ? strlen(e[i].data) : 0;
                data = len ? strdup(e[i].data) : NULL;
            }
            archive_entry_set_filetype(ae, AE_IFREG);
            archive_entry_set_perm(ae, e[i].mode ? e[i].mode : 0644);
            archive_entry_set_size(ae, (la_int64_t)len);
            break;
        case 'd':
            archive_entry_set_filetype(ae, AE_IFDIR);
            archive_entry_set_perm(ae, e[i].mode ? e[i].mode : 0755);
            break;
        case 'l':
            archive_entry_set_filetype(ae, AE_IFLNK);
            archive_entry_set_perm(ae, 0777);
            archive_entry_set_symlink(ae, e[i].data);
            break;
        case 'h':
            archive_entry_set_filetype(ae, AE_IFREG);
            archive_entry_set_perm(ae, 0644);
            archive_entry_set_hardlink(ae, e[i].data);
            break;
        case 'c':
            archive_entry_set_filetype(ae, AE_IFCHR);
            archive_entry_set_perm(ae, 0666);
            archive_entry_set_rdevmajor(ae, 1);
            archive_entry_set_rdevminor(ae, 3);
            break;
        }
        int rc = archive_write_header(a, ae);
        if (rc == ARCHIVE_OK && len)
            rc = archive_write_data(a, data, len) == (la_ssize_t)len ? ARCHIVE_OK : ARCHIVE_FATAL;
        free(data);
        archive_entry_free(ae);
        if (rc != ARCHIVE_OK)
            return -1;
    }
    return 0;
}

static int
tar_to(const char *path, const struct imgb_entry *e, size_t n, bool gz)
{
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    if (gz) {
        archive_write_add_filter_gzip(a);
        archive_write_set_filter_option(a, "gzip", "timestamp", NULL);
    }
    int rc = archive_write_open_filename(a, path) == ARCHIVE_OK ? write_entries(a, e, n) : -1;
    if (archive_write_close(a) != ARCHIVE_OK)
        rc = -1;
    archive_write_free(a);
    return rc;
}

int
imgb_layer(const char *path, const struct imgb_entry *e, size_t n, bool gz, char diff_id[72])
{
    char raw[PATH_MAX];
    snprintf(raw, sizeof(raw), "%s.raw", path);
    if (tar_to(raw, e, n, false) != 0 || sha_file(raw, diff_id, NULL) != 0)
        return -1;
    if (!gz)
        return rename(raw, path);
    unlink(raw);
    return tar_to(path, e, n, true);
}

static int
put_blob(const char *dir, const char *src_or_null, const char *text, char digest[72], long *size)
{
    char tmp[PATH_MAX], dst[PATH_MAX];
    snprintf(tmp, sizeof(tmp), "%s/blobs/sha256/tmp", dir);
    if (text) {
        FILE *f = fopen(tmp, "wb");
        if (!f)
            return -1;
        fputs(text, f);
        fclose(f);
    } else {
        char cmd[3 * PATH_MAX];
        snprintf(cmd, sizeof(cmd), "cp '%s' '%s'", src_or_null, tmp);
        if (system(cmd) != 0)
            return -1;
    }
    if (sha_file(tmp, digest, size) != 0)
        return -1;
    snprintf(dst, sizeof(dst), "%s/blobs/sha256/%s", dir, digest + 7);
    return rename(tmp, dst);
}

int
imgb_layout(const char *dir, char *const *layers, const char *const *diff_ids, int n, bool gz,
            const char *config_extra, char digest[72])
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "mkdir -p '%s/blobs/sha256'", dir);
    if (system(p) != 0)
        return -1;
    snprintf(p, sizeof(p), "%s/oci-layout", dir);
    FILE *f = fopen(p, "w");
    if (!f)
        return -1;
    fputs("{\"imageLayoutVersion\":\"1.0.0\"}", f);
    fclose(f);
    char ldig[64][72];
    long lsize[64];
    for (int i = 0; i < n; i++)
        if (put_blob(dir, layers[i], NULL, ldig[i], &lsize[i]) != 0)
            return -1;
    char cfg[16384];
    size_t o = (size_t)snprintf(cfg, sizeof(cfg),
                                "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{%s},"
                                "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[",
                                config_extra ? config_extra : "");
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(cfg + o, sizeof(cfg) - o, "%s\"%s\"", i ? "," : "", diff_ids[i]);
    snprintf(cfg + o, sizeof(cfg) - o, "]}}");
    char cdig[72];
    long csize;
    if (put_blob(dir, NULL, cfg, cdig, &csize) != 0)
        return -1;
    char man[16384];
    o = (size_t)snprintf(man, sizeof(man),
                         "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest."
                         "v1+json\",\"config\":{\"mediaType\":\"application/vnd.oci.image.config."
                         "v1+json\",\"digest\":\"%s\",\"size\":%ld},\"layers\":[",
                         cdig, csize);
    for (int i = 0; i < n; i++)
        o += (size_t)snprintf(man + o, sizeof(man) - o,
                              "%s{\"mediaType\":\"application/vnd.oci.image.layer.v1.tar%s\","
                              "\"digest\":\"%s\",\"size\":%ld}",
                              i ? "," : "", gz ? "+gzip" : "", ldig[i], lsize[i]);
    snprintf(man + o, sizeof(man) - o, "]}");
    long msize;
    if (put_blob(dir, NULL, man, digest, &msize) != 0)
        return -1;
    snprintf(p, sizeof(p), "%s/index.json", dir);
    f = fopen(p, "w");
    if (!f)
        return -1;
    fprintf(f,
            "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":\"application/vnd.oci.image."
            "manifest.v1+json\",\"digest\":\"%s\",\"size\":%ld}]}",
            digest, msize);
    fclose(f);
    return 0;
}

struct imgb_entry *
imgb_base_entries(size_t *n)
{
    if (access("/bin/busybox", X_OK) != 0)
        return NULL;
    static const char *const dirs[] = {"bin", "lib", "lib/x86_64-linux-gnu", "lib64", "etc",
                                       "usr", "usr/bin", "root", "tmp"};
    static const char *const applets[] = {"sh", "cat", "ls", "id", "echo", "rm", "touch",
                                          "mkdir", "env", "pwd", "stat", "sleep", "test",
                                          "head", "wc", "mknod", "ln", "readlink", "true", "timeout"};
    static const char *const libs[] = {"/lib/x86_64-linux-gnu/libtinfo.so.6",
                                       "/lib/x86_64-linux-gnu/libc.so.6",
                                       "/lib64/ld-linux-x86-64.so.2"};
    size_t cap = 64, k = 0;
    struct imgb_entry *e = calloc(cap, sizeof(*e));
    for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
        e[k++] = (struct imgb_entry){'d', strdup(dirs[i]), NULL, dirs[i][0] == 't' ? 01777 : 0};
    e[k++] = (struct imgb_entry){'F', strdup("bin/busybox"), strdup("/bin/busybox"), 0755};
    e[k++] = (struct imgb_entry){'F', strdup("bin/bash"), strdup("/bin/bash"), 0755};
    for (size_t i = 0; i < sizeof(applets) / sizeof(applets[0]); i++) {
        char p[64];
        snprintf(p, sizeof(p), "bin/%s", applets[i]);
        e[k++] = (struct imgb_entry){'l', strdup(p), strdup("busybox"), 0};
    }
    for (size_t i = 0; i < sizeof(libs) / sizeof(libs[0]); i++) {
        char real[PATH_MAX];
        if (!realpath(libs[i], real)) {
            imgb_entries_free(e, k);
            return NULL;
        }
        e[k++] = (struct imgb_entry){'F', strdup(libs[i] + 1), strdup(real), 0755};
    }
    *n = k;
    return e;
}

void
imgb_entries_free(struct imgb_entry *e, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free((char *)e[i].path);
        free((char *)e[i].data);
    }
    free(e);
}
