/*
 * image_store_int.h — what the image store's own files share
 * (image_store.c: the store, imports, list/rm; image_template.c: a
 * template's new layer).  Not for other modules: they use image_store.h.
 */
#ifndef SBX_IMAGE_STORE_INT_H
#define SBX_IMAGE_STORE_INT_H
#include <jansson.h>
#include <stdbool.h>

#include "../runtime/error.h"
#include "image_store.h"

struct sbx_image_store {
    char *dir;
    bool keep_blobs; /* imports keep their blobs (sbx_image_store_keep_blobs) */
};

/* A JSON value released at the end of its scope. */
static inline void
json_cleanup_(json_t **j)
{
    json_decref(*j);
}
#define _cleanup_json_ __attribute__((cleanup(json_cleanup_)))

/* imgst_lock — take the store-wide lock (flock op on <dir>/lock); its fd,
 * or -1 with err set.  Close the fd to release it. */
int imgst_lock(sbx_image_store *st, int op, sbx_err_t *err);
/* imgst_lock_until — imgst_lock waiting at most until deadline (sbx_mono_ms;
 * 0 none) and while *cancel (NULL: never) is unset: SBX_E_TIMEOUT and
 * SBX_E_SHARD_UNAVAILABLE then (the pull's bounds, sbx_image_pull). */
int imgst_lock_until(sbx_image_store *st, int op, int64_t deadline, const _Atomic bool *cancel,
                     sbx_err_t *err);
/* imgst_is_digest — "sha256:" and 64 lowercase hex digits. */
bool imgst_is_digest(const char *s);
/* imgst_is_name — a valid image name (sbx_image_name_valid's rule). */
bool imgst_is_name(const char *s);
/* imgst_load — the image record of digest (new reference), or NULL. */
json_t *imgst_load(sbx_image_store *st, const char *digest);
/* imgst_record_save — write record as the image mdigest and point name (or
 * NULL) at it, under the store lock; 0 or an error with err set. */
int imgst_record_save(sbx_image_store *st, const char *mdigest, json_t *record, const char *name,
                      sbx_err_t *err);
/* imgst_gc_locked — remove layers no image references (lock held); 0 or
 * an error; *removed counts them. */
int imgst_gc_locked(sbx_image_store *st, int *removed);
#endif
