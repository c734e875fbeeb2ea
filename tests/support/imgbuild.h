/*
 * imgbuild.h — build OCI image layouts offline for the image tests
 * (tests/unit/test_images.c, tests/integration/test_images.c), with
 * libarchive and nettle: no registry, no docker.
 *
 * A layer is a list of entries written into a tar (gzip-compressed when
 * asked, as registries serve them); imgb_layout then writes the layout
 * (image-spec image-layout.md): oci-layout, index.json, and the blobs —
 * each layer, the config (rootfs.diff_ids = the sha256 of each layer's
 * uncompressed tar) and the manifest — under blobs/sha256/<hex>.
 */
#ifndef SBX_TEST_IMGBUILD_H
#define SBX_TEST_IMGBUILD_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

struct imgb_entry {
    char type;          /* 'f' file (data), 'F' a copy of the host file `data`,
                         * 'd' directory, 'l' symlink to `data`, 'h' hard link to `data`,
                         * 'c' character device 1/3 (a device node) */
    const char *path;   /* as written in the tar (may be unsafe on purpose) */
    const char *data;
    mode_t mode;        /* permission bits; 0: 0644 for files, 0755 for dirs */
};

/* imgb_layer — write the entries as a tar at path (gzip when gz).  diff_id
 * receives "sha256:<hex>" of the uncompressed tar.  0 or -1. */
int imgb_layer(const char *path, const struct imgb_entry *e, size_t n, bool gz,
               char diff_id[72]);

/* imgb_layout — a layout at dir (created) from the layer tars (bottom
 * first); config_extra is JSON members of the config's "config" object
 * (e.g. "\"Env\":[\"A=1\"]"), or NULL.  digest receives the manifest's
 * digest.  0 or -1. */
int imgb_layout(const char *dir, char *const *layers, const char *const *diff_ids, int n,
                bool gz, const char *config_extra, char digest[72]);

/* imgb_base_entries — entries of a small root file system made of the
 * host's bash and its libraries (ldd) and busybox-static's applets (cat,
 * ls, id, …, sh): *n entries, the caller frees the array and its strings
 * with imgb_entries_free.  NULL when busybox is not installed. */
struct imgb_entry *imgb_base_entries(size_t *n);
void imgb_entries_free(struct imgb_entry *e, size_t n);

#endif
