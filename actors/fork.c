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
 *
 * Forks owned by other shards of the node (`stage`, set by the gateway's
 * gateway/gw_fork.c, never by a client): their copies are made the same way
 * into the node's staging directory (stage_top: <node pool>/.forks/<id>/
 * when the shards of `sbxd dev` share its workspace pool, where the copy is
 * a reflink; else <backups>/forks/<id>/, the node's store directory) with
 * their record beside (record.mp); the owner's sandbox.adopt
 * (actor_op_adopt, below) moves them into its workspaces.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/wire.h"
#include "cluster.h"
#include "cluster_int.h"
#include "shard_int.h"

#define FORK_MAX 16
/* How often a running shard sweeps stale staged forks (shard_fork_sweep_soon). */
#define FORK_SWEEP_MS (10 * 60 * 1000)

/* The node's staging directory for forks into other shards' sandboxes, into
 * buf: on the node's workspace pool when the shard has a part of one
 * (container/ws_pool.h sbx_wspool_stage_dir), else <backups>/forks.  0, or
 * -1 when the shard has neither (no node store). */
static int
stage_top(const struct shard *sh, char *buf, size_t n)
{
    sbx_wspool_stage_dir(sh->wspool, buf, n);
    if (buf[0])
        return 0;
    if (!sh->backups[0])
        return -1;
    int k = snprintf(buf, n, "%s/forks", sh->backups);
    return k > 0 && (size_t)k < n ? 0 : -1;
}

int
shard_fork_stage_dir(const struct shard *sh, const char *id, char *buf, size_t n)
{
    char top[4200];
    if (stage_top(sh, top, sizeof(top)) != 0)
        return -1;
    int k = snprintf(buf, n, "%s/%s", top, id);
    return k > 0 && (size_t)k < n ? 0 : -1;
}

/* A fork under way; owned by its thread, then by fk_done, which frees it. */
struct fk_job {
    struct actor *a;            /* the source (borrowed: its gate keeps it) */
    struct sop *op;
    size_t n;
    char ids[FORK_MAX][64];
    bool staged[FORK_MAX];      /* owned by another shard: copied to its staging directory
                                 * (stage_top: the node pool's .forks, or <backups>/forks) */
    /* In a cluster, a staged fork is owned by a shard of another node: its
     * copy and record are sent there (workspace.put kind "fork") from the
     * thread, and the local stage removed. */
    bool push[FORK_MAX];
    bool pushed[FORK_MAX];
    struct shard_peer to[FORK_MAX]; /* … its owner */
    char *rec[FORK_MAX];        /* … its record, encoded on the loop (owned) */
    size_t reclen[FORK_MAX];
    int64_t deadline;           /* monotonic ms: the request's */
    int code;                   /* the reply's code for a failed push (0: from rc) */
    char dirs[FORK_MAX][1024];  /* the forks' workspace directories */
    char src[1024];             /* the source's */
    int mnt_fd;                 /* a duplicate of the source's mount, or -1 (owned) */
    int rc;
    char why[512];
    int64_t copied, frozen_ms, ms;
};

/* r (freed first) := the record of a new fork `id` of source a. */
static void
fork_fill(const struct actor *a, const char *id, struct sbx_record *r)
{
    sbx_record_free(r);
    memset(r, 0, sizeof(*r));
    snprintf(r->id, sizeof(r->id), "%s", id);
    r->created_ms = sbx_wall_ms();
    snprintf(r->state, sizeof(r->state), "created");
    r->limits = a->rec.limits;
    r->disk = a->rec.disk;
    snprintf(r->image, sizeof(r->image), "%s", a->rec.image);
    r->persistent = true;
    sbx_record_set_blob(&r->env, &r->env_len, a->rec.env, a->rec.env_len);
    sbx_record_set_blob(&r->config, &r->config_len, a->rec.config, a->rec.config_len);
    sbx_record_set_blob(&r->imgcfg, &r->imgcfg_len, a->rec.imgcfg, a->rec.imgcfg_len);
}

/* Make t (a new sandbox) exist with rec (consumed). */
static void
fork_adopt_record(struct actor *t, struct sbx_record *rec)
{
    sbx_record_free(&t->rec);
    t->rec = *rec;
    memset(rec, 0, sizeof(*rec));
    snprintf(t->rec.id, sizeof(t->rec.id), "%s", t->id);
    t->exists = true;
    actor_load_config(t);
    t->last_active_ms = sbx_wall_ms();
    actor_save_record(t);
}

/* A staged fork's record: <dir>/record.mp (written then renamed). */
static int
stage_record(const struct actor *a, const char *id, const char *dir)
{
    struct sbx_record r = {0};
    char *buf = NULL, tmp[1200], path[1200];
    size_t len = 0;
    fork_fill(a, id, &r);
    int rc = sbx_record_encode(&r, &buf, &len);
    sbx_record_free(&r);
    if (rc)
        return -ENOMEM;
    snprintf(tmp, sizeof(tmp), "%s/record.mp.new", dir);
    snprintf(path, sizeof(path), "%s/record.mp", dir);
    FILE *f = fopen(tmp, "we");
    if (!f || fwrite(buf, 1, len, f) != len || fclose(f) != 0) {
        rc = -errno;
        f = NULL;
    } else if (rename(tmp, path) != 0) {
        rc = -errno;
    }
    free(buf);
    return rc;
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
        t[i] = j->staged[i] ? NULL : actor_get(sh, j->ids[i], false); /* its gate kept it */
        if (t[i] && t[i]->gate == op)
            t[i]->gate = NULL;
    }
    a->gate = NULL;
    for (size_t i = 0; j->rc == 0 && i < j->n; i++)
        if (j->staged[i] && !j->pushed[i] &&
            (j->rc = stage_record(a, j->ids[i], j->dirs[i])) != 0) {
            snprintf(j->why, sizeof(j->why), "write the staged record of '%s': %s", j->ids[i],
                     strerror(-j->rc));
            for (size_t k = 0; k < j->n; k++)
                sbx_rm_rf(j->dirs[k]); /* every image was made by this fork */
        }
    if (j->rc == 0) {
        for (size_t i = 0; i < j->n; i++) {
            if (j->staged[i] || !t[i])
                continue; /* !t[i] cannot happen: a gated actor is not freed */
            struct sbx_record r = {0};
            fork_fill(a, t[i]->id, &r);
            fork_adopt_record(t[i], &r);
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
        sbx_enc_karray(&e, "staged");
        for (size_t i = 0; i < j->n; i++)
            if (j->staged[i])
                sbx_enc_str(&e, j->ids[i]);
        sbx_enc_end(&e);
        shard_reply_end(op, &e, seq ? seq : a->last_seq);
    } else {
        sbx_log_error("sandbox %s: fork failed: %s", a->id, j->why);
        shard_reply_err(op, j->code                ? j->code
                            : j->rc == -EEXIST ? SBX_E_SANDBOX_EXISTS
                            : j->rc == -ENOSPC ? SBX_E_DISK_FULL
                                               : SBX_E_INTERNAL,
                        "fork of '%s': %s", a->id, j->why);
    }
    for (size_t i = 0; i < j->n; i++)
        free(j->rec[i]);
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

/* On the fork's thread, the copies made: send each fork staged for another
 * node to its owner (workspace.put kind "fork": the image's data extents,
 * then its record with the commit; actors/ws_move.c), then remove the local
 * stage — unless the owner committed into this very directory (nodes
 * sharing one --backups directory: the image is then another file).  A
 * failure removes every copy this fork made here and asks the owners that
 * took theirs to remove them (best effort: a copy whose discard is lost
 * is removed by that shard's sweep of staged copies older than an hour,
 * shard_fork_sweep_soon): nothing of the fork is left, as for any failed
 * fork.  The pushes
 * stop 5 s before the request's deadline, so that the answer reaches the
 * gateway in time. */
static void
fk_push(struct fk_job *j)
{
    struct shard *sh = j->a->sh;
    size_t failed = j->n;
    for (size_t i = 0; i < j->n && failed == j->n; i++) {
        if (!j->push[i])
            continue;
        nng_socket s;
        sbx_err_t err = NULL;
        bool sent = false;
        char img[1100];
        struct stat st0, st1;
        snprintf(img, sizeof(img), "%s/disk.img", j->dirs[i]);
        bool had = stat(img, &st0) == 0;
        int rc = sbx_nng_req_dial(&s, j->to[i].url, sh->conf.sec, &err);
        if (rc == 0) {
            rc = cluster_ws_push(sh, s, j->to[i].name, j->ids[i], j->dirs[i], SBX_WS_MOVE, 0,
                                 j->deadline - 5000, j->rec[i], j->reclen[i], &sent, &err);
            nng_close(s);
        } else {
            rc = SBX_E_SHARD_UNAVAILABLE;
        }
        if (rc == 0 && !sent)
            rc = sbx_err_make(&err, SBX_E_INTERNAL, "the staged copy has no image");
        if (rc == 0) {
            bool same = had && stat(img, &st1) == 0 &&
                        (st1.st_dev != st0.st_dev || st1.st_ino != st0.st_ino);
            if (!same)
                sbx_rm_rf(j->dirs[i]);
            j->pushed[i] = true;
            continue;
        }
        failed = i;
        /* A view behind the gateway's: the fork is refused, a retry finds
         * the owners again. */
        j->code = rc == SBX_E_WRONG_OWNER ? SBX_E_FORK_CROSS_SHARD : rc;
        j->rc = -EIO;
        snprintf(j->why, sizeof(j->why), "send the copy of fork '%s' to its owner %s (%s): %s",
                 j->ids[i], j->to[i].name, j->to[i].url,
                 err ? sbx_err_msg(err) : "cannot dial it");
        sbx_err_release(&err);
    }
    if (failed == j->n)
        return;
    for (size_t i = 0; i < j->n; i++) {
        if (j->pushed[i])
            cluster_ws_fork_discard(sh, j->to[i].url, j->ids[i]);
        else
            sbx_rm_rf(j->dirs[i]);
        j->pushed[i] = false;
    }
}

static void *
fk_thread(void *arg)
{
    struct fk_job *j = arg;
    struct shard *sh = j->a->sh;
    const char *dirs[FORK_MAX];
    for (size_t i = 0; i < j->n; i++) {
        dirs[i] = j->dirs[i];
        if (j->staged[i])
            sbx_rm_rf(j->dirs[i]); /* a stale stage of an earlier fork that failed */
    }
    int64_t t0 = sbx_mono_ms();
    /* A full workspace pool (ws_pool.h), or a disk below --disk-reserve,
     * takes no more forks: DISK_FULL. */
    j->rc = shard_disk_admit(sh, j->why, sizeof(j->why));
    if (j->rc == 0)
        j->rc = sbx_ws_fork(j->src, j->mnt_fd, dirs, j->n, &j->copied, &j->frozen_ms, j->why,
                            sizeof(j->why));
    if (j->rc == 0)
        fk_push(j);
    j->ms = sbx_mono_ms() - t0;
    sbx_loop_post(sh->loop, fk_done, j);
    atomic_fetch_sub(&sh->img_jobs, 1); /* the shard's stop waits for these */
    return NULL;
}

/* In a cluster: the live shard of another node that owns id's partition in
 * this shard's view, into out; -1 if none (this shard, or no such member). */
static int
owner_peer(struct shard *sh, const char *id, struct shard_peer *out)
{
    struct cluster *c = cluster_of(sh);
    int o = c->lp[sbx_place_partition(id, strlen(id))].owner, n, rc = -1;
    if (o < 0 || o == c->me)
        return -1;
    sbx_cview_lock(c->view);
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    if (o < n && m[o].name[0] && m[o].url[0] && m[o].live &&
        strcmp(m[o].name, sh->conf.name) != 0) {
        snprintf(out->name, sizeof(out->name), "%s", m[o].name);
        snprintf(out->url, sizeof(out->url), "%s", m[o].url);
        rc = 0;
    }
    sbx_cview_unlock(c->view);
    return rc;
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
    const msgpack_object *stage = NULL;
    if (sbx_wire_get_array(op->req.args, "stage", &stage) == SBX_E_VALIDATION) {
        shard_reply_err(op, SBX_E_VALIDATION, "'stage' must be a list of IDs of 'ids'");
        return -1;
    }
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
        for (uint32_t k = 0; stage && k < stage->via.array.size; k++) {
            sbx_str st;
            if (sbx_wire_obj_str(&stage->via.array.ptr[k], &st) == 0 && st.n == s.n &&
                !memcmp(st.p, s.p, s.n))
                j->staged[i] = true;
        }
        if (j->staged[i] && cluster_on(sh)) {
            if (owner_peer(sh, j->ids[i], &j->to[i]) != 0) {
                shard_reply_err(op, SBX_E_FORK_CROSS_SHARD,
                                "fork '%s': shard %s does not see another node owning its "
                                "partition now (the cluster's view is changing: retry)",
                                j->ids[i], sh->conf.name);
                return -1;
            }
            j->push[i] = true;
        }
        if (j->staged[i]) {
            char top[4200];
            int k = stage_top(sh, top, sizeof(top)) == 0
                        ? snprintf(j->dirs[i], sizeof(j->dirs[i]), "%s/%s", top, j->ids[i])
                        : -1;
            if (k < 0 || (size_t)k >= sizeof(j->dirs[i])) {
                shard_reply_err(op, SBX_E_FORK_CROSS_SHARD,
                                "fork '%s' belongs to another shard, and shard %s has no node "
                                "store to stage its copy in", j->ids[i], sh->conf.name);
                return -1;
            }
        } else if (sbx_ws_dir(sh->conf.data, j->ids[i], j->dirs[i], sizeof(j->dirs[i])) != 0) {
            shard_reply_err(op, SBX_E_VALIDATION, "the workspace path of '%s' is too long",
                            j->ids[i]);
            return -1;
        }
    }
    /* All new and idle (nothing queued or under way for them), before any
     * gate closes. */
    for (size_t i = 0; i < j->n; i++) {
        if (j->staged[i])
            continue; /* its owner checks (sandbox.adopt) */
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
                if (!j->staged[k] && (t = actor_get(sh, j->ids[k], false)) != NULL)
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
    if (fork_ids(a, op, j) != 0) {
        free(j);
        return;
    }
    j->deadline = op->ctx_deadline[0] ? op->ctx_deadline[0] : sbx_mono_ms() + 120000;
    for (size_t i = 0; i < j->n; i++) {
        if (!j->push[i])
            continue;
        struct sbx_record r = {0};
        fork_fill(a, j->ids[i], &r);
        int rc = sbx_record_encode(&r, &j->rec[i], &j->reclen[i]);
        sbx_record_free(&r);
        if (rc) {
            for (size_t k = 0; k < i; k++)
                free(j->rec[k]);
            shard_reply_err(op, SBX_E_INTERNAL, "encode the record of fork '%s'", j->ids[i]);
            free(j);
            return;
        }
    }
    if (a->cs == C_RUNNING && a->c.ws && a->c.ws_fd >= 0 &&
        (j->mnt_fd = fcntl(a->c.ws_fd, F_DUPFD_CLOEXEC, 0)) < 0) {
        shard_reply_err(op, SBX_E_INTERNAL, "dup the workspace's mount: %s", strerror(errno));
        for (size_t i = 0; i < j->n; i++)
            free(j->rec[i]);
        free(j);
        return;
    }
    a->gate = op;
    for (size_t i = 0; i < j->n; i++)
        if (!j->staged[i])
            actor_get(sh, j->ids[i], false)->gate = op;
    if (shard_job_start(sh, fk_thread, j) != 0) {
        j->rc = -EAGAIN;
        snprintf(j->why, sizeof(j->why), "cannot start a thread for the copy");
        fk_done(sh->loop, j);
    }
}

/* An adopt's move of its staged image into the workspace (actor_op_adopt). */
struct ad_job {
    struct actor *a;
    struct sop *op;
    struct sbx_record r; /* the staged record (owned) */
    char stage[4200], img[4300], ws[1024];
    int rc;
    char why[512];
    bool async; /* ran on a thread: ad_done reopens the gate and pumps */
};

/* The move itself: a rename, or a copy into the pool (blocking). */
static void
ad_work(struct ad_job *j)
{
    struct shard *sh = j->a->sh;
    j->rc = shard_disk_admit(sh, j->why, sizeof(j->why));
    if (j->rc == 0)
        j->rc = sbx_ws_import(j->img, j->ws, j->why, sizeof(j->why));
}

/* On the loop thread: the record and the reply; frees j. */
static void
ad_done(sbx_loop *l, void *arg)
{
    (void)l;
    struct ad_job *j = arg;
    struct actor *a = j->a;
    if (a->gate == j->op)
        a->gate = NULL;
    if (j->rc) {
        shard_reply_err(j->op, j->rc == -EEXIST ? SBX_E_SANDBOX_EXISTS
                               : j->rc == -ENOSPC ? SBX_E_DISK_FULL
                                                  : SBX_E_INTERNAL,
                        "adopt the fork '%s' staged in %s: %s", a->id, j->stage,
                        j->why[0] ? j->why : strerror(-j->rc));
        if (j->rc != -EEXIST)
            sbx_rm_rf(j->stage);
        sbx_record_free(&j->r);
    } else {
        sbx_rm_rf(j->stage);
        j->r.created_ms = sbx_wall_ms();
        fork_adopt_record(a, &j->r);
        sbx_log_info("sandbox %s: adopted the fork staged for it", a->id);
        sbx_enc e;
        shard_reply_begin(j->op, &e);
        sbx_enc_kbool(&e, "success", true);
        sbx_enc_kstr(&e, "id", a->id);
        shard_reply_end(j->op, &e, a->last_seq);
    }
    bool async = j->async;
    free(j);
    if (async)
        actor_pump(a);
    actor_maybe_free(a);
}

static void *
ad_thread(void *arg)
{
    struct ad_job *j = arg;
    struct shard *sh = j->a->sh;
    ad_work(j);
    sbx_loop_post(sh->loop, ad_done, j);
    atomic_fetch_sub(&sh->img_jobs, 1); /* the shard's stop waits for these */
    return NULL;
}

/*
 * sandbox.adopt (internal, from the gateway's cross-shard fork): make this
 * new sandbox from the copy a fork staged for it in the node's staging
 * directory (stage_top), <top>/<id>/{disk.img, record.mp}: the image is
 * renamed into its workspace directory (same node, same file system: the
 * node's shared workspace pool, or the data directories and the store of
 * `sbxd dev`, under one directory) or, when this shard's workspaces are in
 * a pool of its own (container/ws_pool.h) and the stage is not, copied
 * there on a thread of its own (~30 ms per 100 MB here; the sandbox's gate
 * closed meanwhile), the record written.
 * With `discard`, the staged copy is removed instead (the fork failed
 * elsewhere).  SANDBOX_EXISTS (and the stage removed) if the sandbox
 * exists; FORK_CROSS_SHARD if there is no staged copy (another node).
 */
void
actor_op_adopt(struct actor *a, struct sop *op)
{
    struct shard *sh = a->sh;
    char stage[4200], top[4200], img[4300], rec[4300];
    bool discard = false;
    sbx_wire_get_bool(op->req.args, "discard", &discard);
    if (stage_top(sh, top, sizeof(top)) != 0 ||
        snprintf(stage, sizeof(stage), "%s/%s", top, a->id) >= (int)sizeof(stage)) {
        shard_reply_err(op, SBX_E_FORK_CROSS_SHARD, "shard %s has no node store", sh->conf.name);
        return;
    }
    snprintf(img, sizeof(img), "%s/disk.img", stage);
    snprintf(rec, sizeof(rec), "%s/record.mp", stage);
    if (discard || a->exists || a->cs != C_NONE || a->destroying || a->gate) {
        sbx_rm_rf(stage);
        if (discard) {
            sbx_enc e;
            shard_reply_begin(op, &e);
            sbx_enc_kbool(&e, "success", true);
            shard_reply_end(op, &e, 0);
        } else {
            shard_reply_err(op, SBX_E_SANDBOX_EXISTS, "sandbox '%s' exists already", a->id);
        }
        actor_maybe_free(a);
        return;
    }
    char *buf = NULL;
    size_t len = 0;
    struct sbx_record r = {0};
    if (sbx_fs_read(rec, 1 << 20, &buf, &len) != 0 || sbx_record_decode(buf, len, &r) != 0) {
        free(buf);
        shard_reply_err(op, SBX_E_FORK_CROSS_SHARD,
                        "no copy of fork '%s' is staged in this node's store (%s): its source "
                        "is on another node", a->id, stage);
        actor_maybe_free(a);
        return;
    }
    free(buf);
    struct ad_job *j = sbx_xcalloc(1, sizeof(*j));
    j->a = a;
    j->op = op;
    j->r = r;
    snprintf(j->stage, sizeof(j->stage), "%s", stage);
    snprintf(j->img, sizeof(j->img), "%s", img);
    if (sbx_ws_dir(sh->conf.data, a->id, j->ws, sizeof(j->ws)) != 0) {
        j->rc = -ENAMETOOLONG;
        ad_done(sh->loop, j);
        return;
    }
    sbx_wspool_stage_dir(sh->wspool, top, sizeof(top));
    if (!sh->wspool || top[0]) { /* a rename (the stage is on the pool, or both on the host) */
        ad_work(j);
        ad_done(sh->loop, j);
        return;
    }
    /* A copy into the pool: on a thread, the sandbox's gate closed. */
    a->gate = op;
    j->async = true;
    if (shard_job_start(sh, ad_thread, j) != 0) {
        j->rc = -EAGAIN;
        j->async = false;
        snprintf(j->why, sizeof(j->why), "cannot start a thread for the copy");
        ad_done(sh->loop, j);
    }
}

void
shard_fork_sweep(struct shard *sh)
{
    char top[4200];
    if (stage_top(sh, top, sizeof(top)) != 0)
        return;
    DIR *d = opendir(top);
    if (!d)
        return;
    struct dirent *de;
    time_t now = time(NULL);
    while ((de = readdir(d)) != NULL) {
        char p[4500];
        struct stat st;
        if (de->d_name[0] == '.' ||
            snprintf(p, sizeof(p), "%s/%s", top, de->d_name) >= (int)sizeof(p) ||
            stat(p, &st) != 0 || now - st.st_mtime < 3600)
            continue;
        if (sbx_rm_rf(p) == 0)
            sbx_log_info("shard %s: removed the stale staged fork %s", sh->conf.name, p);
    }
    closedir(d);
}

static void *
fork_sweep_thread(void *arg)
{
    struct shard *sh = arg;
    shard_fork_sweep(sh);
    atomic_fetch_sub(&sh->img_jobs, 1); /* the shard's stop waits for it */
    return NULL;
}

void
shard_fork_sweep_soon(struct shard *sh)
{
    int64_t now = sbx_mono_ms();
    if (now - sh->fork_swept_ms < FORK_SWEEP_MS || atomic_load(&sh->img_stop))
        return;
    sh->fork_swept_ms = now;
    shard_job_start(sh, fork_sweep_thread, sh); /* not started: tried again in 10 minutes */
}
