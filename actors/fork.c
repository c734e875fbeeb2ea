/*
 * fork.c — sandbox.fork (runtime/ops/fork.yaml; docs/persistence.md, "Fork").
 *
 * An actor op of the source.  On the loop thread: the source must exist
 * with a persistent workspace, every ID of `ids` must be new; the input
 * gates of the source and of every fork are closed on the op (so the
 * source's container is neither started, slept nor destroyed, and no op of
 * a fork runs, until the forks exist).  On a thread of its own
 * (struct fk_job): container/workspace.c copies the source's image into
 * each fork's workspace directory, freezing the source's file system for
 * the copy when it is mounted.  Back on the loop thread: each fork gets a
 * record copied from the source's (image, limits, disk, env, settings,
 * labels; not its ports, state or counters), then the gates open and the
 * reply waits for those records' commit (output gate).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "shard_int.h"

#define FORK_MAX 16

/* A fork under way; owned by its thread, then by fk_done, which frees it. */
struct fk_job {
    struct actor *a;            /* the source (borrowed: its gate keeps it) */
    struct sop *op;
    size_t n;
    char ids[FORK_MAX][64];
    char dirs[FORK_MAX][1024];  /* the forks' workspace directories */
    char src[1024];             /* the source's */
    int mnt_fd;                 /* a duplicate of the source's mount, or -1 (owned) */
    int rc;
    char why[512];
    int64_t copied, frozen_ms, ms;
};

/* Copy the source's record into fork t's (a new sandbox). */
static void
fork_record(struct actor *a, struct actor *t)
{
    struct shard *sh = a->sh;
    sbx_record_free(&t->rec);
    memset(&t->rec, 0, sizeof(t->rec));
    snprintf(t->rec.id, sizeof(t->rec.id), "%s", t->id);
    t->rec.created_ms = sbx_wall_ms();
    snprintf(t->rec.state, sizeof(t->rec.state), "created");
    t->rec.limits = a->rec.limits;
    t->rec.disk = a->rec.disk;
    snprintf(t->rec.image, sizeof(t->rec.image), "%s", a->rec.image);
    t->rec.persistent = true;
    sbx_record_set_blob(&t->rec.env, &t->rec.env_len, a->rec.env, a->rec.env_len);
    sbx_record_set_blob(&t->rec.config, &t->rec.config_len, a->rec.config, a->rec.config_len);
    sbx_record_set_blob(&t->rec.imgcfg, &t->rec.imgcfg_len, a->rec.imgcfg, a->rec.imgcfg_len);
    t->exists = true;
    actor_load_config(t);
    t->last_active_ms = sbx_wall_ms();
    (void)sh;
    actor_save_record(t);
}

/* On the loop thread: records, gates, reply; frees j. */
static void
fk_done(sbx_loop *l, void *arg)
{
    (void)l;
    struct fk_job *j = arg;
    struct actor *a = j->a;
    struct shard *sh = a->sh;
    struct sop *op = j->op;
    uint64_t seq = 0;
    struct actor *t[FORK_MAX];
    for (size_t i = 0; i < j->n; i++) {
        t[i] = actor_get(sh, j->ids[i], false); /* its gate kept it */
        if (t[i] && t[i]->gate == op)
            t[i]->gate = NULL;
    }
    a->gate = NULL;
    if (j->rc == 0) {
        for (size_t i = 0; i < j->n; i++) {
            if (!t[i])
                continue; /* cannot happen: a gated actor is not freed */
            fork_record(a, t[i]);
            if (t[i]->last_seq > seq)
                seq = t[i]->last_seq;
        }
        sbx_log_info("sandbox %s: forked into %zu sandboxes in %lld ms (%lld bytes each, "
                     "frozen %lld ms)", a->id, j->n, (long long)j->ms, (long long)j->copied,
                     (long long)j->frozen_ms);
        sbx_enc e;
        shard_reply_begin(op, &e);
        sbx_enc_kstr(&e, "from", a->id);
        sbx_enc_karray(&e, "ids");
        for (size_t i = 0; i < j->n; i++)
            sbx_enc_str(&e, j->ids[i]);
        sbx_enc_end(&e);
        sbx_enc_kint(&e, "copyMs", j->ms);
        sbx_enc_kint(&e, "copiedBytes", j->copied);
        shard_reply_end(op, &e, seq ? seq : a->last_seq);
    } else {
        sbx_log_error("sandbox %s: fork failed: %s", a->id, j->why);
        shard_reply_err(op, j->rc == -EEXIST ? SBX_E_SANDBOX_EXISTS
                            : j->rc == -ENOSPC ? SBX_E_DISK_FULL
                                               : SBX_E_INTERNAL,
                        "fork of '%s': %s", a->id, j->why);
    }
    for (size_t i = 0; i < j->n; i++)
        if (t[i]) {
            actor_pump(t[i]);
            actor_maybe_free(t[i]);
        }
    if (j->mnt_fd >= 0)
        close(j->mnt_fd);
    free(j);
    actor_pump(a);
}

static void *
fk_thread(void *arg)
{
    struct fk_job *j = arg;
    struct shard *sh = j->a->sh;
    const char *dirs[FORK_MAX];
    for (size_t i = 0; i < j->n; i++)
        dirs[i] = j->dirs[i];
    int64_t t0 = sbx_mono_ms();
    j->rc = sbx_ws_fork(j->src, j->mnt_fd, dirs, j->n, &j->copied, &j->frozen_ms, j->why,
                        sizeof(j->why));
    j->ms = sbx_mono_ms() - t0;
    sbx_loop_post(sh->loop, fk_done, j);
    atomic_fetch_sub(&sh->img_jobs, 1); /* the shard's stop waits for these */
    return NULL;
}

/* Parse and check `ids` into j: 0, or answered. */
static int
fork_ids(struct actor *a, struct sop *op, struct fk_job *j)
{
    struct shard *sh = a->sh;
    const msgpack_object *ids = NULL;
    if (sbx_wire_get_array(op->req.args, "ids", &ids) != 0 || !ids || ids->via.array.size == 0 ||
        ids->via.array.size > FORK_MAX) {
        shard_reply_err(op, SBX_E_VALIDATION, "'ids' must be a list of 1-%d new sandbox IDs",
                        FORK_MAX);
        return -1;
    }
    j->n = ids->via.array.size;
    for (size_t i = 0; i < j->n; i++) {
        sbx_str s;
        char why[160];
        if (sbx_wire_obj_str(&ids->via.array.ptr[i], &s) != 0 ||
            sbx_id_check(s.p, s.n, why, sizeof(why)) != 0 || s.n >= sizeof(j->ids[i])) {
            shard_reply_err(op, SBX_E_VALIDATION, "'ids' item %zu is not a valid sandbox ID", i);
            return -1;
        }
        memcpy(j->ids[i], s.p, s.n);
        j->ids[i][s.n] = '\0';
        for (size_t k = 0; k < i; k++)
            if (!strcmp(j->ids[k], j->ids[i])) {
                shard_reply_err(op, SBX_E_VALIDATION, "'ids' names '%s' twice", j->ids[i]);
                return -1;
            }
        if (!strcmp(j->ids[i], a->id)) {
            shard_reply_err(op, SBX_E_SANDBOX_EXISTS, "cannot fork '%s' into itself", a->id);
            return -1;
        }
        if (sbx_ws_dir(sh->conf.data, j->ids[i], j->dirs[i], sizeof(j->dirs[i])) != 0) {
            shard_reply_err(op, SBX_E_VALIDATION, "the workspace path of '%s' is too long",
                            j->ids[i]);
            return -1;
        }
    }
    /* All new and idle (nothing queued or under way for them), before any
     * gate closes. */
    for (size_t i = 0; i < j->n; i++) {
        struct actor *t = actor_get(sh, j->ids[i], true);
        if (!t) {
            shard_reply_err(op, SBX_E_STORAGE, "cannot read the record of '%s'", j->ids[i]);
            return -1;
        }
        bool busy = t->exists || t->cs != C_NONE || t->gate || t->mb_head || t->inflight ||
                    t->destroying || t->relays > 0;
        if (busy) {
            shard_reply_err(op, SBX_E_SANDBOX_EXISTS, "sandbox '%s' exists already%s",
                            j->ids[i], t->exists ? "" : " (an operation on it is under way)");
            for (size_t k = 0; k <= i; k++)
                if ((t = actor_get(sh, j->ids[k], false)) != NULL)
                    actor_maybe_free(t);
            return -1;
        }
    }
    return 0;
}

void
actor_op_fork(struct actor *a, struct sop *op)
{
    struct shard *sh = a->sh;
    if (!a->exists) {
        shard_reply_err(op, SBX_E_NOT_FOUND, "sandbox '%s' does not exist", a->id);
        return;
    }
    if (!a->rec.persistent) {
        shard_reply_err(op, SBX_E_VALIDATION,
                        "sandbox '%s' has an ephemeral workspace (a tmpfs, nothing on disk): "
                        "only a sandbox created with workspace \"persistent\" can be forked",
                        a->id);
        return;
    }
    struct fk_job *j = sbx_xcalloc(1, sizeof(*j));
    j->a = a;
    j->op = op;
    j->mnt_fd = -1;
    if (fork_ids(a, op, j) != 0) {
        free(j);
        return;
    }
    if (sbx_ws_dir(sh->conf.data, a->id, j->src, sizeof(j->src)) != 0) {
        shard_reply_err(op, SBX_E_VALIDATION, "the workspace path of '%s' is too long", a->id);
        free(j);
        return;
    }
    char img[1100];
    snprintf(img, sizeof(img), "%s/disk.img", j->src);
    if (access(img, F_OK) != 0) {
        /* Never started: its workspace is made (empty) on its first start.
         * Start it, then fork (the op comes back here). */
        actor_start_container(a, op);
        free(j);
        return;
    }
    if (a->cs == C_RUNNING && a->c.ws && a->c.ws_fd >= 0 &&
        (j->mnt_fd = fcntl(a->c.ws_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        shard_reply_err(op, SBX_E_INTERNAL, "dup the workspace's mount: %s", strerror(errno));
        free(j);
        return;
    }
    a->gate = op;
    for (size_t i = 0; i < j->n; i++)
        actor_get(sh, j->ids[i], false)->gate = op;
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    atomic_fetch_add(&sh->img_jobs, 1);
    if (pthread_create(&th, &at, fk_thread, j) != 0) {
        atomic_fetch_sub(&sh->img_jobs, 1);
        j->rc = -EAGAIN;
        snprintf(j->why, sizeof(j->why), "cannot start a thread for the copy");
        fk_done(sh->loop, j);
    }
    pthread_attr_destroy(&at);
}
