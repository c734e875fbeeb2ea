/*
 * ws_move.c — persistent workspaces that follow their partition
 * (docs/persistence.md, "Across the cluster"; docs/cluster.md, "Handoff"):
 * the receiving side of workspace.put (loop thread; a chunk's write and a
 * commit on a thread of their own) and the sender that a
 * handoff runs on the control thread (cluster_ws_push_set) before it sends
 * the partitions' records: the new owner has every persistent workspace of
 * the partitions, checked by digest and on its disk, before the switch in
 * etcd makes it serve them.  A transfer that fails fails the handoff: the
 * partitions stay with this shard, which serves them again (their
 * workspaces never left), and the handoff is tried again at a later
 * reconcile.  The image formats and checks are container/ws_xfer.h's.
 */
#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../container/workspace.h"
#include "../container/ws_xfer.h"
#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "cluster_int.h"
#include "shard_int.h"

/* Bytes per chunk: far below the frame cap (SBX_WIRE_MAX_FRAME). */
#define WS_CHUNK (4u << 20)
/* How long one workspace.put may take (a chunk's write, a commit's fdatasync). */
#define WS_CALL_MS 30000

/* ------------------------------------------------------------------------------ */
/* workspace.put (loop thread) */

static int
ws_errno_code(int rc)
{
    return rc == -EBADMSG || rc == -ERANGE || rc == -ENOENT ? SBX_E_VALIDATION : SBX_E_STORAGE;
}

/* A data or commit phase, run off the loop (a 4 MiB write and its sha256,
 * a commit's fdatasync): on a thread of its own counted in sh->img_jobs, as
 * the image jobs are (images.c), so a stopping shard waits for it; the
 * reply is posted back to the loop. */
struct put_job {
    struct sop *op;      /* answered by put_done on the loop */
    char dir[1024];
    char id[64];
    enum sbx_ws_kind kind;
    bool commit;
    bool drop;           /* a fork's abort: remove its staged copy (off the loop: it may
                          * be gigabytes) */
    uint64_t off;
    sbx_str data;        /* into op's request, which lives until the reply */
    uint8_t sha[SBX_WS_XFER_SHA];
    int64_t taken;
    char *record;        /* a fork's commit: its record, written beside the image (owned) */
    size_t reclen;
    int rc;
    char why[512];
};

/* A fork's record beside its staged image: <dir>/record.mp, written then
 * renamed (what sandbox.adopt reads, actors/fork.c). */
static int
put_record(const char *dir, const char *rec, size_t len, char *why, size_t whylen)
{
    char tmp[1200], path[1200];
    snprintf(tmp, sizeof(tmp), "%s/record.mp.new", dir);
    snprintf(path, sizeof(path), "%s/record.mp", dir);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int rc = fd < 0 ? -errno : sbx_write_full(fd, rec, len);
    if (rc == 0 && fsync(fd) < 0)
        rc = -errno;
    if (fd >= 0)
        close(fd);
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc)
        snprintf(why, whylen, "write %s: %s", path, strerror(-rc));
    return rc;
}

static void
put_done(sbx_loop *l, void *arg)
{
    struct put_job *j = arg;
    (void)l;
    if (j->rc) {
        shard_reply_err(j->op, ws_errno_code(j->rc), "workspace.put %s of %s: %s",
                        j->commit ? "commit" : "data", j->id, j->why);
    } else {
        sbx_enc e;
        shard_reply_begin(j->op, &e);
        sbx_enc_kstr(&e, "id", j->id);
        shard_reply_end(j->op, &e, 0);
    }
    free(j);
}

static void *
put_thread(void *arg)
{
    struct put_job *j = arg;
    struct shard *sh = j->op->sh;
    if (j->drop) {
        sbx_rm_rf(j->dir);
        sbx_loop_post(sh->loop, put_done, j);
        atomic_fetch_sub(&sh->img_jobs, 1);
        return NULL;
    }
    if (j->commit)
        j->rc = sbx_ws_recv_commit(j->dir, j->kind, j->sha, j->taken, j->why, sizeof(j->why));
    else
        j->rc = sbx_ws_recv_chunk(j->dir, j->kind, j->off, j->data.p, j->data.n, j->sha, j->why,
                                  sizeof(j->why));
    if (j->rc && (j->commit || j->rc != -ENOENT)) /* a chunk without a begin: nothing to clean */
        sbx_ws_recv_abort(j->dir, j->kind);
    if (j->rc == 0 && j->record &&
        (j->rc = put_record(j->dir, j->record, j->reclen, j->why, sizeof(j->why))) != 0)
        sbx_rm_rf(j->dir);
    if (j->rc == 0 && j->commit)
        sbx_log_info("shard %s: workspace of %s received (%s)", sh->conf.name, j->id,
                     j->record ? "fork" : j->kind == SBX_WS_SNAP ? "snapshot" : "move");
    free(j->record);
    j->record = NULL;
    sbx_loop_post(sh->loop, put_done, j); /* j is put_done's now */
    atomic_fetch_sub(&sh->img_jobs, 1);
    return NULL;
}

static void
put_run(struct put_job *j)
{
    struct shard *sh = j->op->sh;
    if (atomic_load(&sh->img_stop) || shard_job_start(sh, put_thread, j) != 0) {
        shard_reply_err(j->op, SBX_E_SHARD_UNAVAILABLE, "workspace.put: no thread (stopping?)");
        free(j->record);
        free(j);
    }
}

void
shard_op_workspace_put(struct sop *op)
{
    struct shard *sh = op->sh;
    struct cluster *c = cluster_of(sh);
    sbx_str id = {0}, phase = {0}, kind = {0}, data = {0}, sha = {0}, digest = {0};
    char sid[64], dir[1024], why[512] = "";
    if (!c) {
        shard_reply_err(op, SBX_E_UNKNOWN_OP, "this shard is not in a cluster");
        return;
    }
    if (sbx_wire_get_str(op->req.args, "id", &id) != 0 ||
        sbx_wire_get_str(op->req.args, "phase", &phase) != 0) {
        shard_reply_err(op, SBX_E_VALIDATION, "workspace.put needs id and phase");
        return;
    }
    /* The ID names a directory: only a valid sandbox ID (no '/', no ".."). */
    if (sbx_id_check(id.p, id.n, why, sizeof(why)) != 0 || id.n >= sizeof(sid)) {
        shard_reply_err(op, SBX_E_VALIDATION, "workspace.put: %s", why);
        return;
    }
    sbx_str_copy(id, sid, sizeof(sid));
    enum sbx_ws_kind k = SBX_WS_MOVE;
    bool fork = false; /* a fork's copy, staged for sandbox.adopt (actors/fork.c) */
    if (sbx_wire_get_str(op->req.args, "kind", &kind) == 0 && kind.n == 8 &&
        !memcmp(kind.p, "snapshot", 8))
        k = SBX_WS_SNAP;
    else if (kind.n == 4 && !memcmp(kind.p, "fork", 4))
        fork = true;
    /* A move into a partition this shard serves would replace a workspace
     * in use: refused (the sender's view is behind, as partition.import
     * refuses it).  A fork's copy is for a sandbox of a partition it serves:
     * else its adopt would never come here. */
    uint32_t p = sbx_place_partition(sid, strlen(sid));
    if (!fork && k == SBX_WS_MOVE && (c->lp[p].mine || c->lp[p].moving)) {
        shard_reply_err(op, SBX_E_WRONG_OWNER,
                        "workspace.put of %s refused: this shard serves its partition", sid);
        return;
    }
    if (fork && (!c->lp[p].mine || c->lp[p].moving)) {
        shard_reply_err(op, SBX_E_WRONG_OWNER,
                        "workspace.put of a fork into %s refused: this shard does not serve "
                        "its partition", sid);
        return;
    }
    if (fork ? shard_fork_stage_dir(sh, sid, dir, sizeof(dir)) != 0
             : sbx_ws_dir(sh->conf.data, sid, dir, sizeof(dir)) != 0) {
        shard_reply_err(op, fork ? SBX_E_FORK_CROSS_SHARD : SBX_E_VALIDATION,
                        fork ? "shard %s has no node store to stage a fork in"
                             : "the workspace's path is too long (shard %s)",
                        sh->conf.name);
        return;
    }
    int rc = 0;
    if (phase.n == 5 && !memcmp(phase.p, "begin", 5)) {
        int64_t size = -1;
        if (sbx_wire_get_i64(op->req.args, "size", &size) != 0 || size < 0 ||
            (uint64_t)size > sh->conf.disk_max) {
            shard_reply_err(op, SBX_E_VALIDATION,
                            "workspace.put begin needs a size of at most --disk-max (%llu bytes)",
                            (unsigned long long)sh->conf.disk_max);
            return;
        }
        /* A fork's copy is a new workspace of this node: admitted as one
         * (the pool's room, --disk-reserve; disk_guard.c). */
        if (fork && shard_disk_admit(sh, why, sizeof(why)) != 0) {
            shard_reply_err(op, SBX_E_DISK_FULL, "workspace.put of a fork into %s: %s", sid, why);
            return;
        }
        rc = sbx_ws_recv_begin(dir, k, (uint64_t)size, why, sizeof(why));
    } else if (phase.n == 4 && !memcmp(phase.p, "data", 4)) {
        int64_t off = -1;
        if (sbx_wire_get_i64(op->req.args, "offset", &off) != 0 || off < 0 ||
            sbx_wire_get_bin(op->req.args, "data", &data) != 0 ||
            sbx_wire_get_bin(op->req.args, "sha", &sha) != 0 || sha.n != SBX_WS_XFER_SHA) {
            shard_reply_err(op, SBX_E_VALIDATION,
                            "workspace.put data needs offset, data and a 32-byte sha");
            return;
        }
        struct put_job *j = sbx_xcalloc(1, sizeof(*j));
        j->op = op;
        snprintf(j->dir, sizeof(j->dir), "%s", dir);
        snprintf(j->id, sizeof(j->id), "%s", sid);
        j->kind = k;
        j->off = (uint64_t)off;
        j->data = data;
        memcpy(j->sha, sha.p, SBX_WS_XFER_SHA);
        put_run(j);
        return;
    } else if (phase.n == 6 && !memcmp(phase.p, "commit", 6)) {
        int64_t taken = 0;
        if (sbx_wire_get_bin(op->req.args, "digest", &digest) != 0 ||
            digest.n != SBX_WS_XFER_SHA) {
            shard_reply_err(op, SBX_E_VALIDATION, "workspace.put commit needs a 32-byte digest");
            return;
        }
        sbx_wire_get_i64(op->req.args, "takenMs", &taken);
        sbx_str rec = {0};
        struct sbx_record r = {0};
        if (fork && (sbx_wire_get_bin(op->req.args, "record", &rec) != 0 ||
                     sbx_record_decode(rec.p, rec.n, &r) != 0)) {
            sbx_rm_rf(dir);
            shard_reply_err(op, SBX_E_VALIDATION, "workspace.put commit of a fork needs its "
                            "record");
            return;
        }
        sbx_record_free(&r);
        struct put_job *j = sbx_xcalloc(1, sizeof(*j));
        j->op = op;
        if (fork) {
            j->record = sbx_xmalloc(rec.n ? rec.n : 1);
            memcpy(j->record, rec.p, rec.n);
            j->reclen = rec.n;
        }
        snprintf(j->dir, sizeof(j->dir), "%s", dir);
        snprintf(j->id, sizeof(j->id), "%s", sid);
        j->kind = k;
        j->commit = true;
        j->taken = taken;
        memcpy(j->sha, digest.p, SBX_WS_XFER_SHA);
        put_run(j);
        return;
    } else if (phase.n == 5 && !memcmp(phase.p, "abort", 5)) {
        if (fork) { /* the staged copy, committed or not */
            struct put_job *j = sbx_xcalloc(1, sizeof(*j));
            j->op = op;
            j->drop = true;
            snprintf(j->dir, sizeof(j->dir), "%s", dir);
            snprintf(j->id, sizeof(j->id), "%s", sid);
            put_run(j);
            return;
        }
        sbx_ws_recv_abort(dir, k);
    } else if (phase.n == 4 && !memcmp(phase.p, "drop", 4) && k == SBX_WS_SNAP) {
        sbx_ws_snap_drop(dir);
    } else {
        shard_reply_err(op, SBX_E_VALIDATION,
                        "phase must be begin, data, commit, abort or (snapshot) drop");
        return;
    }
    if (rc) {
        sbx_ws_recv_abort(dir, k);
        shard_reply_err(op, ws_errno_code(rc), "workspace.put %.*s of %s: %s", (int)phase.n,
                        phase.p, sid, why);
        return;
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kstr(&e, "id", sid);
    shard_reply_end(op, &e, 0);
}

/* ------------------------------------------------------------------------------ */
/* The sender (control thread of a handoff). */

/* One workspace.put call on s: args are {id, phase, kind} plus what add
 * encodes (may be NULL). */
static int
put_call(nng_socket s, const char *id, const char *phase, const char *kind,
         void (*add)(sbx_enc *, const void *), const void *arg, sbx_err_t *err)
{
    sbx_enc a;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "id", id);
    sbx_enc_kstr(&a, "phase", phase);
    sbx_enc_kstr(&a, "kind", kind);
    if (add)
        add(&a, arg);
    sbx_enc_end(&a);
    char *args, *buf = NULL;
    size_t al, bl;
    if (sbx_enc_finish(&a, &args, &al) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode workspace.put");
    sbx_msg m;
    int rc = shard_peer_call(s, "workspace.put", args, al, WS_CALL_MS, &buf, &bl, &m, err);
    free(args);
    if (rc == 0) {
        sbx_wire_msg_free(&m);
        free(buf);
    }
    return rc;
}

struct chunk_args {
    uint64_t off;
    const char *data;
    size_t len;
    const uint8_t *sha;
};

static void
add_size(sbx_enc *e, const void *arg)
{
    sbx_enc_kint(e, "size", (int64_t)*(const uint64_t *)arg);
}

static void
add_chunk(sbx_enc *e, const void *arg)
{
    const struct chunk_args *ca = arg;
    sbx_enc_kint(e, "offset", (int64_t)ca->off);
    sbx_enc_str(e, "data");
    sbx_enc_bin(e, ca->data, ca->len);
    sbx_enc_str(e, "sha");
    sbx_enc_bin(e, ca->sha, SBX_WS_XFER_SHA);
}

struct commit_args {
    const uint8_t *digest;
    int64_t taken_ms;
    const void *record; /* a fork's: its record (sbx_record_encode), or NULL */
    size_t reclen;
};

static void
add_commit(sbx_enc *e, const void *arg)
{
    const struct commit_args *ca = arg;
    sbx_enc_str(e, "digest");
    sbx_enc_bin(e, ca->digest, SBX_WS_XFER_SHA);
    if (ca->taken_ms)
        sbx_enc_kint(e, "takenMs", ca->taken_ms);
    if (ca->record) {
        sbx_enc_str(e, "record");
        sbx_enc_bin(e, ca->record, ca->reclen);
    }
}

int
cluster_ws_push(struct shard *sh, nng_socket s, const char *peer, const char *id,
                const char *src_dir, enum sbx_ws_kind k, int64_t taken_ms, int64_t deadline_ms,
                const void *record, size_t reclen, bool *sent, sbx_err_t *err)
{
    const char *kn = record ? "fork" : k == SBX_WS_SNAP ? "snapshot" : "move";
    struct sbx_ws_src src;
    char why[512] = "";
    *sent = false;
    int rc = sbx_ws_src_open(src_dir, &src, why, sizeof(why));
    if (rc == -ENOENT)
        return 0; /* no workspace image: nothing to send */
    if (rc)
        return sbx_err_make(err, SBX_E_STORAGE, "workspace of %s: %s", id, why);
    int64_t t0 = sbx_mono_ms();
    char *buf = sbx_xmalloc(WS_CHUNK);
    rc = put_call(s, id, "begin", kn, add_size, &src.size, err);
    while (rc == 0) {
        if (atomic_load(&cluster_of(sh)->stop)) {
            rc = sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "the shard is stopping");
            break;
        }
        if (deadline_ms && sbx_mono_ms() > deadline_ms) {
            rc = sbx_err_make(err, SBX_E_TIMEOUT,
                              "workspace of %s: out of time after %llu bytes", id,
                              (unsigned long long)src.sent);
            break;
        }
        uint8_t sha[SBX_WS_XFER_SHA];
        struct chunk_args ca = {.data = buf, .sha = sha};
        rc = sbx_ws_src_next(&src, buf, WS_CHUNK, &ca.off, &ca.len, sha, why, sizeof(why));
        if (rc) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "workspace of %s: %s", id, why);
            break;
        }
        if (ca.len == 0)
            break;
        rc = put_call(s, id, "data", kn, add_chunk, &ca, err);
    }
    if (rc == 0) {
        uint8_t d[SBX_WS_XFER_SHA];
        sbx_ws_src_digest(&src, d);
        struct commit_args ca = {d, taken_ms, record, reclen};
        rc = put_call(s, id, "commit", kn, add_commit, &ca, err);
    }
    *sent = rc == 0;
    if (rc == 0)
        sbx_log_info("shard %s: workspace of %s sent to %s (%s): %llu bytes of a %llu-byte image "
                     "in %llu chunk(s), %lld ms",
                     sh->conf.name, id, peer, kn,
                     (unsigned long long)src.sent, (unsigned long long)src.size,
                     (unsigned long long)src.chunks, (long long)(sbx_mono_ms() - t0));
    else
        put_call(s, id, "abort", kn, NULL, NULL, NULL); /* best effort: the begin cleans anyway */
    free(buf);
    sbx_ws_src_close(&src);
    return rc;
}

void
cluster_ws_fork_discard(struct shard *sh, const char *url, const char *id)
{
    nng_socket s;
    if (sbx_nng_req_dial(&s, url, sh->conf.sec, NULL) != 0)
        return;
    put_call(s, id, "abort", "fork", NULL, NULL, NULL);
    nng_close(s);
}

int
cluster_ws_push_set(struct shard *sh, const char *peer, const char *url, char *const *ids,
                    size_t n, int64_t deadline_ms, size_t *moved, sbx_err_t *err)
{
    nng_socket s;
    bool open = false;
    int rc = 0;
    *moved = 0;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char dir[1024], img[1100];
        if (sbx_ws_dir(sh->conf.data, ids[i], dir, sizeof(dir)) != 0)
            continue;
        snprintf(img, sizeof(img), "%s/disk.img", dir);
        if (access(img, F_OK) != 0)
            continue; /* ephemeral, or never started */
        if (!open) {
            if (sbx_nng_req_dial(&s, url, sh->conf.sec, NULL) != 0)
                return sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "dial %s", url);
            open = true;
        }
        bool sent = false;
        rc = cluster_ws_push(sh, s, peer, ids[i], dir, SBX_WS_MOVE, 0, deadline_ms, NULL, 0,
                             &sent, err);
        if (rc == 0 && sent)
            (*moved)++;
    }
    if (open)
        nng_close(s);
    return rc;
}
