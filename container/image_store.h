/*
 * image_store.h — the node's store of OCI images (docs/images.md).
 *
 * One directory per node (default `<data>/images`; `sbxd dev` gives every
 * shard the same one), mode 0700, laid out as:
 *
 *   lock                   flock(2): LOCK_EX for import, pull, rm and GC;
 *                          readers of names.json and images/ take LOCK_SH
 *   names.json             {"name:tag": "sha256:<manifest digest>", …}
 *   images/<hex>.json      one image: manifest digest, its config (Env,
 *                          WorkingDir, User, Entrypoint, Cmd, ExposedPorts),
 *                          its layers by diff_id (bottom first), size
 *   layers/<hex>/          one unpacked layer, named by its diff_id (the
 *                          sha256 of the uncompressed tar), shared by every
 *                          image that has it; an overlayfs lower dir as is
 *                          (whiteouts as 0/0 character devices, opaque
 *                          directories as user.overlay.opaque=y)
 *   use/<hex>              one per image: a running sandbox of that image
 *                          holds a LOCK_SH on it; GC removes an image only
 *                          while it can take LOCK_EX|LOCK_NB on it
 *   blobs/<hex>            the blobs each image was imported from (manifest,
 *                          config, compressed layers), served to peers that
 *                          fetch the image by digest (image_fetch.c); GC
 *                          removes those no image references
 *   tmp/                   imports and fetches in progress (removed at open
 *                          and on error)
 *
 * Every blob is verified against its sha256 digest (manifest, config, each
 * layer's compressed blob and its diff_id) before anything is unpacked, and
 * layers are unpacked into tmp/ and renamed into layers/ only when the whole
 * image is good: an import that fails leaves nothing.  The unpack rules
 * (paths, links, whiteouts, devices, set-uid bits) are in image_unpack.c.
 *
 * Thread-safety: every function may be called from any thread; two
 * processes (shards) may share a store (the flock serialises the writers;
 * sbx_image_resolve and sbx_image_open_root take no store lock, so a
 * sandbox start never waits behind an import).
 * Errors: SBX_E_IMAGE_NOT_FOUND, SBX_E_IMAGE_INVALID (corrupt or unsafe
 * input, digest mismatch, no /bin/sh), SBX_E_VALIDATION (a bad name or
 * path), SBX_E_STORAGE (the store's own files), SBX_E_INTERNAL; *err says
 * which file and why.
 */
#ifndef SBX_IMAGE_STORE_H
#define SBX_IMAGE_STORE_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/error.h"

/* "sha256:" and 64 hex digits, NUL. */
#define SBX_IMAGE_DIGEST_LEN 72
/* Most layers an image may have (overlayfs stacks up to 500; one message of
 * SCM_RIGHTS carries at most 253 descriptors). */
#define SBX_IMAGE_MAX_LAYERS 128

typedef struct sbx_image_store sbx_image_store;

/* sbx_image_store_open — open (creating it, mode 0700) the store at dir and
 * remove what an interrupted import left in tmp/.  *out is the caller's, to
 * free with sbx_image_store_close.  dir is copied. */
int sbx_image_store_open(const char *dir, sbx_image_store **out, sbx_err_t *err);
void sbx_image_store_close(sbx_image_store *st);
const char *sbx_image_store_dir(const sbx_image_store *st);
/* sbx_image_store_keep_blobs — whether imports from now on keep the blobs
 * they import (blobs/, served to peers: sbx_image_blob_read).  Off by
 * default: a single node has nobody to serve them to, and they cost the
 * image's compressed size once more; a shard in a cluster turns it on
 * before serving.  Call before the store is shared with other threads. */
void sbx_image_store_keep_blobs(sbx_image_store *st, bool on);

/*
 * sbx_image_import — import the image at path, a file or directory of the
 * machine the store is on:
 *   - an OCI image layout directory (image-spec image-layout.md): its
 *     index.json's first manifest (an image index: its linux/amd64 entry);
 *   - a `docker save` / `podman save` tarball (docker-archive) or an OCI
 *     archive: converted to a layout in tmp/ by `skopeo copy` first.
 * name ("repo:tag"; NULL: none) then names it (a name already given to
 * another image moves to this one).  digest receives the manifest digest.
 * SBX_E_VALIDATION (a name, a relative path, a path that is neither a
 * directory nor a regular file: a FIFO would block the conversion),
 * SBX_E_IMAGE_NOT_FOUND (no such path), SBX_E_IMAGE_INVALID,
 * SBX_E_STORAGE, SBX_E_TIMEOUT (skopeo's conversion of a tarball ran past
 * SBX_IMAGE_TOOL_MS: stopped).  Only the conversion is bounded: reading a
 * layout directory on a hung file system still waits with it.
 */
int sbx_image_import(sbx_image_store *st, const char *path, const char *name,
                     char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err);

/* Flags of sbx_image_pull. */
#define SBX_IMAGE_PULL_MISSING 1u  /* when the store already has an image of that
                                    * name, its digest, no pull (a create's pull on
                                    * demand: concurrent creates of one new image
                                    * pull it once) */
#define SBX_IMAGE_PULL_INSECURE 2u /* the registry may answer plain HTTP or with a
                                    * certificate that does not verify (skopeo
                                    * --src-tls-verify=false) */

/* SBX_IMAGE_TOOL_MS — how long, in ms, sbx_image_import lets skopeo
 * convert a tarball before it stops it (SBX_E_TIMEOUT): a path on a hung
 * file system never ends otherwise, the store's exclusive lock held. */
#define SBX_IMAGE_TOOL_MS (10 * 60 * 1000)

/* sbx_image_pull — `skopeo copy docker://ref oci:…` then import; name
 * defaults to ref.  The registry must be reachable from this machine.
 * The copy runs under the store's shared lock (image sandboxes start and
 * other pulls go on meanwhile; an import, rm or GC waits), the import of its
 * layout under the exclusive one.  One pull of a reference at a time on the
 * node: a pull of a reference being pulled waits for that one.
 * deadline (sbx_mono_ms; 0 none) bounds the wait and the copy, and *cancel
 * (NULL: never) set ends them early: skopeo has no read timeout, so a
 * registry that stops sending mid-layer would hold it for ever.
 * SBX_E_VALIDATION (ref), the registry's refusal or an unreachable registry
 * SBX_E_IMAGE_NOT_FOUND (skopeo's message in err), SBX_E_IMAGE_INVALID (what
 * it sent), SBX_E_STORAGE, SBX_E_TIMEOUT (the deadline passed: skopeo is
 * stopped, nothing is imported), SBX_E_SHARD_UNAVAILABLE (cancelled). */
int sbx_image_pull(sbx_image_store *st, const char *ref, const char *name, unsigned flags,
                   int64_t deadline, const _Atomic bool *cancel,
                   char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err);

/* sbx_image_ref_registry — whether ref names an image in a registry by its
 * host: a '/' follows a first component that is a domain (holds '.' or ':',
 * or is "localhost"), the rule of the distribution reference grammar Docker
 * and containers/image follow (github.com/distribution/reference,
 * normalize.go splitDockerDomain).  Short names ("python:3.12") are not:
 * which registry they mean is a host's setting (containers-registries.conf(5),
 * short-name-mode), not sbx's to guess.  The host (with its port) is copied
 * into host (n bytes) when it is one. */
bool sbx_image_ref_registry(const char *ref, char *host, size_t n);

/* sbx_image_resolve — ref (a name, "sha256:<hex>", or a unique prefix of
 * at least 12 hex digits) to its manifest digest.  SBX_E_IMAGE_NOT_FOUND. */
int sbx_image_resolve(sbx_image_store *st, const char *ref, char digest[SBX_IMAGE_DIGEST_LEN],
                      sbx_err_t *err);

/* sbx_image_list — a new JSON array (the caller's) of every image:
 * {digest, names[], layers, size, created}. */
int sbx_image_list(sbx_image_store *st, json_t **out, sbx_err_t *err);

/* sbx_image_inspect — a new JSON object (the caller's): the list's fields
 * plus config {env[], workingDir, user, entrypoint[], cmd[], exposedPorts[]}
 * and layers[] (diff_ids, bottom first). */
int sbx_image_inspect(sbx_image_store *st, const char *ref, json_t **out, sbx_err_t *err);

/*
 * sbx_image_rm — remove a name (ref is a name) or every name of an image
 * (ref is a digest), then collect garbage: an image with no name left is
 * deleted unless a running sandbox uses it (its use/ lock is held: it is
 * deleted by a later rm or import once free), and a layer no image
 * references any more is deleted.  *removed: images deleted now.
 */
int sbx_image_rm(sbx_image_store *st, const char *ref, int *removed, sbx_err_t *err);

/* sbx_image_config — a new JSON object (the caller's): the config the
 * store keeps of the image of digest {env, workingDir, user, entrypoint[],
 * cmd[], exposedPorts[]}.  No store lock (as sbx_image_resolve): a small
 * file read.  SBX_E_IMAGE_NOT_FOUND. */
int sbx_image_config(sbx_image_store *st, const char *digest, json_t **out, sbx_err_t *err);

/* What a container of an image needs (sbx_image_open_root). */
struct sbx_image_root {
    char digest[SBX_IMAGE_DIGEST_LEN];
    char **layers;     /* host paths of the layer dirs, bottom first, NULL-terminated;
                        * a layer the image repeats appears once, at its highest place */
    int nlayers;
    char **env;        /* the image config's Env "K=V", NULL-terminated */
    char *workdir;     /* WorkingDir or NULL */
    char *user;        /* User or NULL */
    uint32_t run_uid;  /* User resolved (sbx_image_user_resolve): the ids commands run as */
    uint32_t run_gid;  /* inside the sandbox; 0:0 (root) when the image names no User */
    uint32_t groups[8];/* the User's supplementary groups (sbx_image_user_extras) */
    int ngroups;       /* SBX_IMAGE_MAX_GROUPS at most */
    int use_fd;        /* holds LOCK_SH on use/<hex> while the container lives; -1: none */
};

/* sbx_image_open_root — fill *root for the image of digest and take its
 * use lock (GC leaves it alone until sbx_image_root_free).  Owned by the
 * caller.  SBX_E_IMAGE_INVALID when its User names no user of the image. */
int sbx_image_open_root(sbx_image_store *st, const char *digest, struct sbx_image_root *root,
                        sbx_err_t *err);
/* sbx_image_root_free — free *root and release its use lock.  Idempotent
 * on a zeroed root with use_fd -1. */
void sbx_image_root_free(struct sbx_image_root *root);

/*
 * sbx_image_import_layout — import the OCI layout directory layout (as
 * sbx_image_import, with no name), recording source as where it came from
 * ("peer <shard>").  For image_fetch.c: the layout it assembled in tmp/.
 */
int sbx_image_import_layout(sbx_image_store *st, const char *layout, const char *source,
                            char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err);

/*
 * Fetching an image from a peer node (image_fetch.c; docs/images.md,
 * "Images in a cluster").  The store keeps the blobs an image was imported
 * from — its manifest, its config and its compressed layers — under
 * blobs/<hex> (the layers' unpacked trees are not byte-for-byte a tar
 * again), so a node that has an image can serve it by digest.
 *
 * sbx_image_blob_read — up to max bytes of the kept blob digest from
 * offset: *data (heap, the caller's; NULL when *len is 0), *len, *size the
 * blob's whole size.  SBX_E_IMAGE_NOT_FOUND when the store keeps no such
 * blob (no such image here, or one imported before blobs were kept, or a
 * template's: see docs/images.md), SBX_E_VALIDATION for a malformed digest.
 */
int sbx_image_blob_read(sbx_image_store *st, const char *digest, uint64_t offset, size_t max,
                        char **data, size_t *len, uint64_t *size, sbx_err_t *err);

/* sbx_image_keep_blob — the import's step (under the store's exclusive
 * lock): keep the verified blob at src as blobs/<hex of digest>, unless
 * kept already — hard-linked when src is in the store's own tmp/ (a
 * tarball, a pull, a fetch), else copied (a user's layout file must not
 * share an inode with the store).  0 or SBX_E_STORAGE. */
int sbx_image_keep_blob(sbx_image_store *st, const char *src, const char *digest, sbx_err_t *err);

/* A source of blobs for sbx_image_fetch: up to max bytes of blob digest
 * from offset into *data (heap, the fetch's), *len and *size as
 * sbx_image_blob_read.  0 or a negative code with *err. */
typedef int (*sbx_image_blob_fn)(void *arg, const char *digest, uint64_t offset, size_t max,
                                 char **data, size_t *len, uint64_t *size, sbx_err_t *err);

/*
 * sbx_image_fetch — fetch the image of manifest digest through get(arg, …)
 * and import it: the manifest, its config and its layer blobs are written
 * into a layout under tmp/ chunk by chunk (chunk bytes per call), each
 * checked against its digest as it completes, then imported exactly as
 * `image.import` of a layout (every digest verified again, layers unpacked
 * with the same rules).  source names where it came from.  Nothing is left
 * of a fetch that fails: the layout is removed, the import cleans up as
 * always.  *bytes (may be NULL) counts what was received.  Stops with
 * SBX_E_DEADLINE once the monotonic clock passes deadline_ms (0: none).
 * Errors: get's (SBX_E_IMAGE_NOT_FOUND: the source lacks it), IMAGE_INVALID
 * (a blob whose digest is not what was asked: tampered or corrupt, or a
 * manifest that is not an image manifest), SBX_E_STORAGE, SBX_E_DEADLINE.
 */
int sbx_image_fetch(sbx_image_store *st, const char *digest, sbx_image_blob_fn get, void *arg,
                    size_t chunk, int64_t deadline_ms, const char *source, uint64_t *bytes,
                    sbx_err_t *err);

/* image_unpack.c: unpack one layer blob (a tar, gzip, zstd, bzip2 or xz
 * compressed or not) into the empty directory dirfd, with the OCI rules
 * (whiteouts → overlayfs whiteouts; paths confined to dirfd).  The blob's
 * digests are not checked here (sbx_image_layer_digests).  *skipped counts
 * device nodes left out.  SBX_E_IMAGE_INVALID for an unsafe or corrupt
 * entry, with *err naming it. */
int sbx_image_unpack(const char *blob, int dirfd, int *skipped, sbx_err_t *err);
/* image_unpack.c: the sha256 of the file at blob (compressed) and of its
 * decompressed stream (diff_id), as "sha256:<hex>". */
int sbx_image_layer_digests(const char *blob, char compressed[SBX_IMAGE_DIGEST_LEN],
                            char uncompressed[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err);

/* sbx_image_name_valid — name is a name an image may be given (1-255 bytes
 * of [A-Za-z0-9._/:@-], not "sha256:…"). */
bool sbx_image_name_valid(const char *name);

/*
 * sbx_image_add_layer — a template (docs/images.md, "Templates"): add to the
 * store an image made of base's layers (base: a manifest digest) plus the
 * layer blob (a tar, compressed or not, with OCI whiteouts; unpacked with
 * the import's rules), with base's config, a new rootfs.diff_ids and a
 * history entry created_by; name it name (moved if another image had it).
 * digest receives the new image's manifest digest.  blob is left in place
 * (the caller's).  Errors as an import; nothing is left of a failed one.
 */
int sbx_image_add_layer(sbx_image_store *st, const char *base, const char *blob, const char *name,
                        const char *created_by, char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err);

/*
 * image_user.c: sbx_image_user_resolve — the image config's User ("user",
 * "uid", "user:group", "uid:gid", … — image-spec config.md) as *uid and *gid,
 * names looked up in the image's /etc/passwd and /etc/group as its layers
 * (host directories, bottom first) hold them; the gid defaults to the
 * user's primary group (0 for a uid /etc/passwd does not list).  An empty
 * or NULL user is 0:0.  SBX_E_IMAGE_INVALID for a name it cannot find.
 */
int sbx_image_user_resolve(char *const *layers, int nlayers, const char *user, uint32_t *uid,
                           uint32_t *gid, sbx_err_t *err);

/*
 * image_user.c: sbx_image_user_extras — for the User resolved to uid:gid,
 * what runc also applies (libcontainer/user GetExecUser): *home, the home
 * directory of uid's /etc/passwd line (heap, the caller's; NULL: none or not
 * absolute), and, when user names no group, groups[0..*ngroups): the gids of
 * the /etc/group lines that list the user's name, other than gid, in file
 * order, at most SBX_IMAGE_MAX_GROUPS.  Nothing for an empty user or a uid
 * /etc/passwd does not list.  Returns how many groups were left out past
 * the limit (0 normally).
 */
#define SBX_IMAGE_MAX_GROUPS 8
int sbx_image_user_extras(char *const *layers, int nlayers, const char *user, uint32_t uid,
                          uint32_t gid, char **home, uint32_t *groups, int *ngroups);

/*
 * image_layer.c: sbx_image_layer_write — write the overlayfs upper dir
 * dirfd (a readable directory fd) as an OCI layer to the new file blob, a
 * gzip-compressed tar: overlay whiteouts (0/0 character devices) become
 * `.wh.NAME` entries, opaque directories (user.overlay.opaque or
 * trusted.overlay.opaque = y) get a `.wh..wh..opq` entry (image-spec
 * layer.md, "Whiteouts"); owners are written as the sandbox saw them
 * (ids: host id → id inside).  Never follows a symbolic link (the tree is a
 * sandbox's).  Hard links are written as separate files; sockets and other
 * devices are left out.
 */
struct sbx_layer_ids {
    uint32_t host_root;                 /* the sandbox's root: 0:0 in the layer */
    uint32_t host_user;                 /* an image's User (0: none) … */
    uint32_t user_uid, user_gid;        /* … as its uid and gid in the layer */
};
int sbx_image_layer_write(int dirfd, const struct sbx_layer_ids *ids, const char *blob,
                          sbx_err_t *err);

#endif
