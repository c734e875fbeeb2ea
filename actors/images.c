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

enum img_kind { IMG_IMPORT, IMG_PULL, IMG_LIST, IMG_INSPECT, IMG_RM, IMG_TEMPLATE };

struct img_job {
    struct sop *op;     /* answered by img_done on the loop thread */
    struct shard *sh;
    enum img_kind kind;
    char *a, *b;        /* path/ref/image, then name (heap or NULL); template: name, from */
    char **run;         /* template: the steps (heap, NULL-terminated) */
    int nrun;
    int64_t step_ms;    /* template: each step's timeout */
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
job_free(struct img_job *j)
{
    free(j->a);
    free(j->b);
    for (int i = 0; i < j->nrun; i++)
        free(j->run[i]);
    free(j->run);
    free(j->msg);
    json_decref(j->result);
    free(j);
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
    job_free(j);
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
    case IMG_TEMPLATE:
        rc = shard_template_build(j->sh, j->a, j->b, j->run, j->nrun, j->step_ms, digest, &err);
        if (rc == 0) {
            sbx_log_info("image %s built as template %s from %s (%d steps)", digest, j->a, j->b,
                         j->nrun);
            rc = describe(st, digest, j->result, &err);
        }
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

static struct img_job *
img_job_new(struct sop *op, enum img_kind kind, const char *ka, const char *kb)
{
    struct shard *sh = op->sh;
    if (!sh->images) {
        shard_reply_err(op, SBX_E_INTERNAL, "shard %s has no image store (see its log)",
                        sh->conf.name);
        return NULL;
    }
    struct img_job *j = sbx_xcalloc(1, sizeof(*j));
    j->op = op;
    j->sh = sh;
    j->kind = kind;
    j->a = ka ? arg_dup(op->req.args, ka) : NULL;
    j->b = kb ? arg_dup(op->req.args, kb) : NULL;
    const char *missing = ka && !j->a ? ka : kb && kind == IMG_TEMPLATE && !j->b ? kb : NULL;
    if (missing) {
        shard_reply_err(op, SBX_E_VALIDATION, "'%s' must be a non-empty string", missing);
        job_free(j);
        return NULL;
    }
    return j;
}

/* Run j on a thread of its own (it answers j->op). */
static void
img_run(struct img_job *j)
{
    struct sop *op = j->op;
    struct shard *sh = j->sh;
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&sh->img_jobs, 1);
    if (pthread_create(&t, &at, img_thread, j) != 0) {
        atomic_fetch_sub(&sh->img_jobs, 1);
        shard_reply_err(op, SBX_E_INTERNAL, "cannot start a thread for the image operation");
        job_free(j);
    }
    pthread_attr_destroy(&at);
}

static void
img_start(struct sop *op, enum img_kind kind, const char *ka, const char *kb)
{
    struct img_job *j = img_job_new(op, kind, ka, kb);
    if (j)
        img_run(j);
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
shard_op_template_build(struct sop *op)
{
    struct img_job *j = img_job_new(op, IMG_TEMPLATE, "name", "from");
    if (!j)
        return;
    const msgpack_object *run = NULL;
    int64_t ms = 600000;
    sbx_wire_get_i64(op->req.args, "stepTimeout", &ms);
    j->step_ms = ms;
    if (sbx_wire_get_array(op->req.args, "run", &run) != 0 || !run || run->via.array.size == 0) {
        shard_reply_err(op, SBX_E_VALIDATION, "'run' must be a list of 1 to 64 shell strings");
        job_free(j);
        return;
    }
    j->run = sbx_xcalloc(run->via.array.size + 1, sizeof(char *));
    for (uint32_t i = 0; i < run->via.array.size; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&run->via.array.ptr[i], &s) != 0 || s.n == 0 ||
            memchr(s.p, '\0', s.n)) {
            shard_reply_err(op, SBX_E_VALIDATION, "'run' item %u must be a non-empty string", i);
            job_free(j);
            return;
        }
        j->run[j->nrun++] = sbx_str_dup(s);
    }
    img_run(j);
}

void
shard_images_stop(struct shard *sh)
{
    /* Each job ends on its own (an import is bounded by its image; a
     * template build gives up within a second of img_stop); its post is run
     * by the loop run that follows. */
    atomic_store(&sh->img_stop, true);
    while (atomic_load(&sh->img_jobs) > 0)
        usleep(10000);
}
