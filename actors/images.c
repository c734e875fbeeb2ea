/*
 * images.c — the shard's part of the image ops (runtime/ops/images.yaml):
 * image.import, image.pull, image.list, image.inspect, image.rm on the
 * node's store (container/image_store.h, docs/images.md).
 *
 * Each op runs on a thread of its own: an import or a pull reads, hashes
 * and unpacks the whole image (seconds for a large one), and even a list
 * waits for the store's flock, which another shard's import may hold; the
 * loop thread must not wait for either.  The thread owns a struct img_job
 * (its arguments copied, its answer encoded) and hands it back to the loop
 * through sbx_loop_post, where img_done replies and frees it.  The shard
 * counts jobs in flight (sh->img_jobs, decremented by the thread once it
 * has posted) and waits for them when it stops (shard_images_stop), so no
 * thread posts to a loop that is gone.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/json.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "shard_int.h"

enum img_kind { IMG_IMPORT, IMG_PULL, IMG_LIST, IMG_INSPECT, IMG_RM };

struct img_job {
    struct sop *op;     /* answered by img_done on the loop thread */
    struct shard *sh;
    enum img_kind kind;
    char *a, *b;        /* path/ref/image, then name (heap or NULL) */
    int code;           /* 0, or the error's code … */
    char *msg;          /* … and its message (heap) */
    json_t *result;     /* the result map's members (owned) */
};

static char *
arg_dup(const msgpack_object *args, const char *key)
{
    sbx_str s;
    if (sbx_wire_get_str(args, key, &s) != 0 || s.n == 0 || memchr(s.p, '\0', s.n))
        return NULL;
    return sbx_str_dup(s);
}

static void
img_done(sbx_loop *l, void *arg)
{
    struct img_job *j = arg;
    (void)l;
    if (j->code) {
        shard_reply_err(j->op, j->code, "%s", j->msg ? j->msg : "image operation failed");
    } else {
        sbx_enc e;
        shard_reply_begin(j->op, &e);
        const char *k;
        json_t *v;
        json_object_foreach(j->result, k, v) {
            sbx_enc_str(&e, k);
            if (sbx_json_to_msgpack(v, &e) != 0)
                sbx_enc_nil(&e);
        }
        shard_reply_end(j->op, &e, 0);
    }
    free(j->a);
    free(j->b);
    free(j->msg);
    json_decref(j->result);
    free(j);
}

/* The result of an import or pull: the digest and what inspect says. */
static int
describe(sbx_image_store *st, const char *digest, json_t *res, sbx_err_t *err)
{
    json_t *img = NULL;
    int rc = sbx_image_inspect(st, digest, &img, err);
    if (rc)
        return rc;
    json_object_set_new(res, "digest", json_string(digest));
    json_object_set_new(res, "image", img);
    return 0;
}

static void *
img_thread(void *arg)
{
    struct img_job *j = arg;
    sbx_image_store *st = j->sh->images;
    _cleanup_err_ sbx_err_t err = NULL;
    char digest[SBX_IMAGE_DIGEST_LEN];
    json_t *list = NULL;
    int removed = 0, rc = 0;
    j->result = json_object();
    switch (j->kind) {
    case IMG_IMPORT:
        rc = sbx_image_import(st, j->a, j->b, digest, &err);
        if (rc == 0) {
            sbx_log_info("image %s imported from %s%s%s", digest, j->a, j->b ? " as " : "",
                         j->b ? j->b : "");
            rc = describe(st, digest, j->result, &err);
        }
        break;
    case IMG_PULL:
        rc = sbx_image_pull(st, j->a, j->b, digest, &err);
        if (rc == 0) {
            sbx_log_info("image %s pulled from %s", digest, j->a);
            rc = describe(st, digest, j->result, &err);
        }
        break;
    case IMG_LIST:
        rc = sbx_image_list(st, &list, &err);
        if (rc == 0)
            json_object_set_new(j->result, "images", list);
        break;
    case IMG_INSPECT:
        rc = sbx_image_resolve(st, j->a, digest, &err);
        if (rc == 0)
            rc = describe(st, digest, j->result, &err);
        break;
    case IMG_RM:
        rc = sbx_image_rm(st, j->a, &removed, &err);
        if (rc == 0) {
            json_object_set_new(j->result, "success", json_true());
            json_object_set_new(j->result, "removed", json_integer(removed));
        }
        break;
    }
    if (rc) {
        j->code = rc;
        j->msg = sbx_xstrdup(sbx_err_msg(err));
    }
    struct shard *sh = j->sh; /* j is img_done's once posted */
    sbx_loop_post(sh->loop, img_done, j);
    atomic_fetch_sub(&sh->img_jobs, 1);
    return NULL;
}

static void
img_start(struct sop *op, enum img_kind kind, const char *ka, const char *kb)
{
    struct shard *sh = op->sh;
    if (!sh->images) {
        shard_reply_err(op, SBX_E_INTERNAL, "shard %s has no image store (see its log)",
                        sh->conf.name);
        return;
    }
    struct img_job *j = sbx_xcalloc(1, sizeof(*j));
    j->op = op;
    j->sh = sh;
    j->kind = kind;
    j->a = ka ? arg_dup(op->req.args, ka) : NULL;
    j->b = kb ? arg_dup(op->req.args, kb) : NULL;
    if (ka && !j->a) {
        shard_reply_err(op, SBX_E_VALIDATION, "'%s' must be a non-empty string", ka);
        free(j->b);
        free(j);
        return;
    }
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&sh->img_jobs, 1);
    if (pthread_create(&t, &at, img_thread, j) != 0) {
        atomic_fetch_sub(&sh->img_jobs, 1);
        shard_reply_err(op, SBX_E_INTERNAL, "cannot start a thread for the image operation");
        free(j->a);
        free(j->b);
        free(j);
    }
    pthread_attr_destroy(&at);
}

void
shard_op_image_import(struct sop *op)
{
    img_start(op, IMG_IMPORT, "path", "name");
}

void
shard_op_image_pull(struct sop *op)
{
    img_start(op, IMG_PULL, "ref", "name");
}

void
shard_op_image_list(struct sop *op)
{
    img_start(op, IMG_LIST, NULL, NULL);
}

void
shard_op_image_inspect(struct sop *op)
{
    img_start(op, IMG_INSPECT, "image", NULL);
}

void
shard_op_image_rm(struct sop *op)
{
    img_start(op, IMG_RM, "image", NULL);
}

void
shard_images_stop(struct shard *sh)
{
    /* Each job ends on its own (an import is bounded by its image); its
     * post is run by the loop run that follows. */
    while (atomic_load(&sh->img_jobs) > 0)
        usleep(10000);
}
