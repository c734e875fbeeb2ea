/*
 * images.c — the shard's part of the image ops (runtime/ops/images.yaml):
 * image.import, image.pull, image.list, image.inspect, image.rm on the
 * node's store (container/image_store.h, docs/images.md), and the shard to
 * shard image.blob (serving a kept blob) and image.fetch (fetching an image
 * from the peers, in the background: a job whose op was answered when it
 * was accepted), and the replication of a new sandbox's image to its
 * partition's successor (shard_image_replicate).
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
#include "../runtime/nngx.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "shard_int.h"

enum img_kind {
    IMG_IMPORT,
    IMG_PULL,
    IMG_LIST,
    IMG_INSPECT,
    IMG_RM,
    IMG_TEMPLATE,
    IMG_BLOB,      /* image.blob: a chunk of a kept blob (image_fetch.c) */
    IMG_FETCH,     /* image.fetch: fetch an image from the peers */
    IMG_REPLICATE, /* no op: ask the successor to image.fetch (shard_image_replicate) */
    IMG_RESOLVE,   /* a create's image name: from the peers, then fetched (its op waits) */
};

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
    uint64_t off;       /* blob: first byte, most bytes; then the chunk (heap), the blob's size */
    size_t max, len;
    char *data;
    uint64_t size;
    struct shard_peers *peers; /* fetch: the peers to ask (heap); replicate: [0] the successor */
    char digest[72];    /* resolve: the name's digest */
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
    free(j->data);
    free(j->peers);
    json_decref(j->result);
    free(j);
}

static void resolved(struct img_job *j);

static void
img_done(sbx_loop *l, void *arg)
{
    struct img_job *j = arg;
    (void)l;
    if (j->kind == IMG_RESOLVE && !j->code) {
        resolved(j);
    } else if (!j->op) {
        /* image.fetch in the background, a replication: nobody waits */
    } else if (j->code) {
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
        if (j->kind == IMG_BLOB) {
            sbx_enc_kbin(&e, "data", j->data ? j->data : "", j->len);
            sbx_enc_kint(&e, "size", (int64_t)j->size);
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

/* How long an image.fetch may fetch (the images cross the network). */
#define FETCH_JOB_MS (10 * 60 * 1000)
/* How long, in ms, a pull (image.pull, or a create's pull on demand) may
 * take, the wait for another pull of the same reference included; the
 * shard's stop ends it sooner (img_stop). */
#define PULL_JOB_MS (10 * 60 * 1000)
/* How long the replication waits for the successor to accept image.fetch. */
#define REPLICATE_MS 10000

/* IMG_REPLICATE: image.fetch {digest, from: us} to the successor j->peers->p[0]. */
static int
replicate(struct img_job *j, sbx_err_t *err)
{
    const struct shard_peer *p = &j->peers->p[0];
    nng_socket s;
    if (sbx_nng_req_dial(&s, p->url, j->sh->conf.sec, NULL) != 0)
        return sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "dial %s", p->url);
    sbx_enc a;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "digest", j->a);
    sbx_enc_kstr(&a, "from", j->b); /* this shard's name */
    sbx_enc_end(&a);
    char *args, *buf = NULL;
    size_t al, bl;
    int rc = sbx_enc_finish(&a, &args, &al);
    if (rc == 0) {
        sbx_msg m;
        rc = shard_peer_call(s, "image.fetch", args, al, REPLICATE_MS, &buf, &bl, &m, err);
        free(args);
        if (rc == 0) {
            sbx_log_info("image %s: %s fetches it for the failover of its sandboxes", j->a,
                         p->name);
            sbx_wire_msg_free(&m);
            free(buf);
        }
    }
    nng_close(s);
    return rc;
}

/* The pull flags for ref: insecure for a loopback registry — Docker's
 * default (dockerd(8), "--insecure-registry": 127.0.0.0/8 is insecure
 * unless configured otherwise) — and for the hosts the deployment names
 * (--insecure-registry host[:port], or host for every port). */
static unsigned
pull_flags(const struct shard *sh, const char *ref)
{
    char host[256], bare[256];
    if (!sbx_image_ref_registry(ref, host, sizeof(host)))
        return 0;
    snprintf(bare, sizeof(bare), "%s", host);
    char *colon = bare[0] == '[' ? strstr(bare, "]:") : strrchr(bare, ':');
    if (colon)
        colon[bare[0] == '[' ? 1 : 0] = '\0';
    if (!strcmp(bare, "localhost") || !strncmp(bare, "127.", 4) || !strcmp(bare, "[::1]"))
        return SBX_IMAGE_PULL_INSECURE;
    for (char **r = sh->conf.insecure_registry; r && *r; r++)
        if (!strcmp(*r, host) || !strcmp(*r, bare))
            return SBX_IMAGE_PULL_INSECURE;
    return 0;
}

/* How long a create waits for a peer's answer about an image name. */
#define RESOLVE_ASK_MS 10000

/* IMG_RESOLVE: ask the peers in turn for the name j->a (image.inspect on
 * each: a node op, answered from that node's store); the first that knows
 * it gives the digest, and the image is fetched from it first. */
static int
resolve_name(struct img_job *j, sbx_err_t *err)
{
    sbx_enc a;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "image", j->a);
    sbx_enc_end(&a);
    char *args;
    size_t al;
    if (sbx_enc_finish(&a, &args, &al) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode image.inspect");
    int found = -1;
    char from_host[256];
    for (int i = 0; j->peers && i < j->peers->n && found < 0; i++) {
        nng_socket s;
        if (sbx_nng_req_dial(&s, j->peers->p[i].url, j->sh->conf.sec, NULL) != 0)
            continue;
        char *buf = NULL;
        size_t bl;
        sbx_msg m;
        if (shard_peer_call(s, "image.inspect", args, al, RESOLVE_ASK_MS, &buf, &bl, &m, NULL) ==
            0) {
            const msgpack_object *res = NULL;
            sbx_str d = {0};
            sbx_wire_get_map(m.root, "result", &res);
            if (res && sbx_wire_get_str(res, "digest", &d) == 0 && d.n == 71 &&
                !memcmp(d.p, "sha256:", 7)) {
                sbx_str_copy(d, j->digest, sizeof(j->digest));
                found = i;
            }
            sbx_wire_msg_free(&m);
            free(buf);
        }
        nng_close(s);
    }
    free(args);
    if (found < 0 && sbx_image_ref_registry(j->a, from_host, sizeof(from_host))) {
        /* Nobody here has it, and it names its registry: pulled on demand
         * (docs/images.md, "Pull on demand"); creates of it meanwhile wait
         * for this pull, not another (SBX_IMAGE_PULL_MISSING). */
        sbx_log_info("image %s: not on this node%s; pulling it from %s", j->a,
                     j->peers && j->peers->n ? " nor on a peer" : "", from_host);
        char d[SBX_IMAGE_DIGEST_LEN];
        int rc = sbx_image_pull(j->sh->images, j->a, NULL,
                                SBX_IMAGE_PULL_MISSING | pull_flags(j->sh, j->a),
                                sbx_mono_ms() + PULL_JOB_MS, &j->sh->img_stop, d, err);
        if (rc == 0)
            snprintf(j->digest, sizeof(j->digest), "%s", d);
        return rc;
    }
    if (found < 0)
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND,
                            "no image named '%s' on this node or any live node of the cluster%s",
                            j->a,
                            strchr(j->a, '/') ? ""
                                              : " (a name with its registry, e.g. "
                                                "docker.io/library/python:3.12, is pulled "
                                                "on demand)");
    /* That peer first. */
    struct shard_peer t = j->peers->p[0];
    j->peers->p[0] = j->peers->p[found];
    j->peers->p[found] = t;
    char from[64];
    char have[SBX_IMAGE_DIGEST_LEN];
    if (sbx_image_resolve(j->sh->images, j->digest, have, NULL) == 0)
        return 0; /* here already, by another name or none */
    return shard_image_fetch(j->sh, j->peers, j->digest, sbx_mono_ms() + FETCH_JOB_MS, from, NULL,
                             err);
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
        rc = sbx_image_pull(st, j->a, j->b, pull_flags(j->sh, j->a), sbx_mono_ms() + PULL_JOB_MS,
                            &j->sh->img_stop, digest, &err);
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
    case IMG_BLOB:
        rc = sbx_image_blob_read(st, j->a, j->off, j->max, &j->data, &j->len, &j->size, &err);
        break;
    case IMG_FETCH: {
        /* In the background: image.fetch was answered when it was accepted. */
        char from[64] = "";
        _Atomic uint64_t bytes = 0;
        if (sbx_image_resolve(st, j->a, digest, NULL) != 0 || strcmp(digest, j->a) != 0) {
            rc = shard_image_fetch(j->sh, j->peers, j->a, sbx_mono_ms() + FETCH_JOB_MS, from,
                                   &bytes, &err);
            if (rc)
                sbx_log_warn("image %s: image.fetch failed: %s", j->a, sbx_err_msg(err));
        }
        break;
    }
    case IMG_RESOLVE:
        rc = resolve_name(j, &err);
        break;
    case IMG_REPLICATE:
        if (replicate(j, &err) != 0)
            sbx_log_warn("image %s: its sandboxes' successor %s was not told to fetch it: %s",
                         j->a, j->peers->p[0].name, sbx_err_msg(err));
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
    if (shard_job_start(sh, img_thread, j) != 0) {
        if (op)
            shard_reply_err(op, SBX_E_INTERNAL, "cannot start a thread for the image operation");
        job_free(j);
    }
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

int
shard_job_start(struct shard *sh, void *(*fn)(void *), void *arg)
{
    pthread_t t;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&sh->img_jobs, 1);
    int rc = pthread_create(&t, &at, fn, arg);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        atomic_fetch_sub(&sh->img_jobs, 1);
        return -rc;
    }
    return 0;
}

void
shard_op_image_blob(struct sop *op)
{
    struct img_job *j = img_job_new(op, IMG_BLOB, "digest", NULL);
    if (!j)
        return;
    int64_t off = 0, max = 4 << 20;
    sbx_wire_get_i64(op->req.args, "offset", &off);
    sbx_wire_get_i64(op->req.args, "max", &max);
    j->off = off > 0 ? (uint64_t)off : 0;
    j->max = max > 0 && max <= (16 << 20) ? (size_t)max : (4u << 20);
    img_run(j);
}

void
shard_op_image_fetch(struct sop *op)
{
    struct img_job *j = img_job_new(op, IMG_FETCH, "digest", "from");
    if (!j)
        return;
    if (strlen(j->a) != 71 || strncmp(j->a, "sha256:", 7) ||
        strspn(j->a + 7, "0123456789abcdef") != 64) {
        shard_reply_err(op, SBX_E_VALIDATION, "'digest' must be sha256:<64 hex digits>");
        job_free(j);
        return;
    }
    j->peers = shard_peers_snapshot(op->sh, j->b);
    /* Accepted: answered now, fetched in the background (a job without an
     * op: its outcome is logged), so the asking shard never waits for it. */
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kstr(&e, "digest", j->a);
    sbx_enc_kbool(&e, "accepted", true);
    shard_reply_end(op, &e, 0);
    j->op = NULL;
    img_run(j);
}

void
shard_image_replicate(struct shard *sh, const char *digest, uint32_t part)
{
    struct shard_peer succ;
    if (!sh->images || shard_successor(sh, part, &succ) != 0)
        return;
    struct img_job *j = sbx_xcalloc(1, sizeof(*j));
    j->sh = sh;
    j->kind = IMG_REPLICATE;
    j->a = sbx_xstrdup(digest);
    j->b = sbx_xstrdup(sh->conf.name);
    j->peers = sbx_xcalloc(1, sizeof(*j->peers));
    j->peers->n = 1;
    j->peers->p[0] = succ;
    img_run(j);
}

bool
shard_image_resolve(struct shard *sh, struct sop *op)
{
    sbx_str img;
    char ref[256], have[SBX_IMAGE_DIGEST_LEN];
    char host[256];
    if (!sh->images || sbx_wire_get_str(op->req.args, "image", &img) != 0 || img.n == 0 ||
        sbx_str_copy(img, ref, sizeof(ref)) != 0 || memchr(img.p, '\0', img.n) ||
        !sbx_image_name_valid(ref) || sbx_image_resolve(sh->images, ref, have, NULL) == 0 ||
        (!cluster_on(sh) && !sbx_image_ref_registry(ref, host, sizeof(host))))
        return false; /* the actor answers (single node: IMAGE_NOT_FOUND) */
    char sid[64];
    sbx_str_copy(op->req.sandbox, sid, sizeof(sid));
    struct actor *a = actor_get(sh, sid, true);
    if (!a || a->exists)
        return false; /* an existing sandbox keeps its image: nothing to resolve */
    struct img_job *j = sbx_xcalloc(1, sizeof(*j));
    j->op = op;
    j->sh = sh;
    j->kind = IMG_RESOLVE;
    j->a = sbx_xstrdup(ref);
    j->peers = shard_peers_snapshot(sh, NULL);
    img_run(j);
    return true;
}

/* IMG_RESOLVE done (loop thread): the create goes to its actor with the
 * digest, if this shard still owns the sandbox's partition. */
static void
resolved(struct img_job *j)
{
    struct sop *op = j->op;
    struct shard *sh = j->sh;
    snprintf(op->img_digest, sizeof(op->img_digest), "%s", j->digest);
    if (sh->stopping) {
        shard_reply_err(op, SBX_E_INTERRUPTED, "the shard is stopping");
        return;
    }
    sbx_werr w;
    uint32_t part = sbx_place_partition(op->req.sandbox.p, op->req.sandbox.n);
    if (cluster_admit(sh, part, 0, &w) != 0) {
        shard_reply_werr(op, &w); /* the partition moved meanwhile: the gateway routes again */
        sbx_werr_free(&w);
        return;
    }
    shard_enqueue(sh, op);
}
