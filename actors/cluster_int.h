/*
 * cluster_int.h — what the parts of the cluster module share (cluster.h is
 * its interface; docs/cluster.md tells the story):
 *
 *   cluster.c          membership and lease (lease thread), fencing, the view
 *                      and admission (loop), reconcile and claims (control
 *                      thread), start/stop, cluster.status;
 *   cluster_repl.c     replication of record writes to etcd (replication
 *                      thread) and the output gate's part of it (loop);
 *   cluster_handoff.c  handoff-out (loop: quiesce, read; control thread: copy,
 *                      switch, read-back of a switch of unknown outcome),
 *                      handoff-in (partition.import) and the purge of a set
 *                      of partitions' local records (loop);
 *   cluster_load.c     load-then-serve: records read from etcd (control
 *                      thread) and installed (loop).
 *
 * Threads and locking: struct cluster is owned by the shard (sh->cluster,
 * created by cluster_start, freed by cluster_free on the loop thread once
 * the threads ended).  Each field says which thread owns it or which lock
 * guards it; the threads hand work to the loop only through sbx_loop_post
 * (the posted object then belongs to the loop) and atomics.
 */
#ifndef SBX_CLUSTER_INT_H
#define SBX_CLUSTER_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <time.h>

#include "../runtime/cview.h"
#include "../runtime/etcd.h"
#include "../runtime/loop.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "../container/ws_xfer.h"
#include "../runtime/error.h"
#include "recrev.h"
#include "shard_int.h"

#define TXN_PARTS 60          /* compares and puts per etcd transaction (≤ 128) */

/* One record write to replicate: made by cluster_replicate (loop), owned by
 * the queue (rq_head, under rmu), then by the replication thread, which
 * frees it (and rec) once its transaction is done; cluster_free frees what
 * is left in the queue. */
struct ritem {
    struct ritem *next;
    uint64_t seq;
    uint32_t part;
    int64_t epoch;  /* the partition's epoch when the write was made: etcd applies it
                       only if the partition's key is still at that mod_revision */
    char id[64];
    char *rec;     /* NULL: deletion */
    size_t len;
};

/* Loop-side state of a partition. */
struct lpart {
    int16_t owner;   /* member index (view) */
    int64_t epoch;
    bool mine;       /* the view says this shard owns it */
    bool ready;      /* its records are in the local store */
    int64_t load_epoch; /* a load from etcd was asked for at this epoch (0: none) */
    bool moving;     /* a handoff is under way */
    int64_t imported_ms; /* records arrived by partition.import (0: none) */
    int16_t imported_from;
};

/* The cluster state of a shard (sh->cluster). */
struct cluster {
    struct shard *sh;
    sbx_etcd *etcd;
    sbx_cview *view;
    char prefix[160];
    int64_t ttl_ms;
    int64_t lease;           /* lease thread (cluster_stop once it ended); 0: none */
    char (*denied)[2][256];  /* per member index: the url and relay last added to the
                              * sandboxes' always-denied set (deny_members; its thread) */
    int ndenied;
    /* The deny thread (deny_main): resolves members' names off the control
     * thread, whose reconcile a slow resolver would hold up.  Woken through
     * dcv when dwake is set (both under mu); started with the others. */
    pthread_t deny;
    bool deny_thread;        /* it was started (else the control thread denies inline) */
    pthread_cond_t dcv;
    bool dwake;
    /* Monotonic ms; past it (or 0) the shard admits nothing.  Set by the lease
     * thread when it registers, and moved later by a keep-alive only while it
     * has not passed; set to 0 by anyone who fences (the loop's timer at the
     * deadline, the lease thread when etcd says the lease is gone, the
     * replication thread when etcd lacks our writes): a fence holds until the
     * lease thread registers again. */
    atomic_llong fence_at;
    atomic_bool fence_done;  /* the loop applied the fence of the current fenced spell */
    atomic_bool stop;
    pthread_t ctl, repl, lth;
    bool threads;            /* ctl, repl and lth were started */
    bool stopped;            /* cluster_stop ran */
    pthread_mutex_t mu;      /* wake-ups of the control and lease threads; hjob rendezvous */
    pthread_cond_t cv;       /* the control thread and cluster_handoff's wait */
    pthread_cond_t lcv;      /* the lease thread */
    bool lwake;              /* under mu: lcv was signalled */
    bool dirty;
    uint8_t busy[SBX_PARTITIONS]; /* ctl thread: in a handoff or claim */
    int64_t handed_rev[SBX_PARTITIONS]; /* ctl thread: revision of our switch of the
                                           partition to another shard (0: none) */
    atomic_bool reload_owned; /* set by the lease thread when it fences, taken by the
                                 control thread: reload what we own from etcd */
    /* Set at start and when the lease thread fences; cleared by the control
     * thread once it has moved every partition the view shows ours to a new
     * epoch (rebump, cluster.c).  While set, the loop loads nothing. */
    atomic_bool rebump;
    /* Under mu: partitions the loop asked the control thread to load from
     * etcd, at their epoch (0: none); loads says some are asked. */
    int64_t want_load[SBX_PARTITIONS];
    bool loads;
    int64_t load_next_ms;    /* ctl thread: no load before (monotonic ms; failures back off) */
    int64_t load_backoff_ms; /* ctl thread: the last back-off (0: the last load worked) */
    struct claim *claims;    /* ctl thread: scratch of reconcile (SBX_PARTITIONS; cluster.c) */
    /* Per partition, wall ms: until then a retry of a request id this shard
     * does not know may have run on an earlier owner whose idempotency table
     * it lacks (cluster_in_doubt).  Written by the control thread (claims,
     * rebump) and the loop (imports); read by the loop. */
    _Atomic int64_t doubt_until[SBX_PARTITIONS];
    /* replication queue */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct ritem *rq_head, *rq_tail;
    recrev *revs;            /* replication thread: the records' revisions in etcd */
    int64_t tomb_lease;      /* replication thread: the etcd lease tombstones are put under
                                (0: none granted yet; cluster_repl.c) */
    int64_t tomb_lease_ms;   /* replication thread: when it was granted (sbx_mono_ms) */
    /* loop thread only */
    struct lpart lp[SBX_PARTITIONS];
    bool first_view;
    uint64_t *outstanding;   /* replicated seqs not yet decided (FIFO, ascending) */
    size_t nout, capout, outhead;
    struct hjob *job;        /* the handoff under way (one at a time; cluster_handoff.c) */
    uint64_t fence_timer;    /* fires at fence_at (0: none armed) */
    int me;                  /* my member index (loop's copy) */
    char member_names[SBX_CVIEW_MAX_MEMBERS][64];
    /* ws_snap.c: the snapshot thread (started with the others when
     * conf.snapshot_interval > 0) and the drops it is to send (under mu). */
    pthread_t ws_snap;
    bool ws_snap_thread;
    struct ws_drop *ws_drops;
};

/* cluster_of — the shard's cluster state, or NULL when it is not in a
 * cluster (borrowed: the shard owns it). */
static inline struct cluster *
cluster_of(const struct shard *sh)
{
    return sh->cluster;
}

/* cluster_nap_ms — sleep ms milliseconds (any thread but the loop). */
static inline void
cluster_nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* cluster_fenced — whether the shard must admit nothing now: fence_at is 0
 * or has passed (any thread). */
static inline bool
cluster_fenced(struct cluster *c)
{
    int64_t f = atomic_load(&c->fence_at);
    return f == 0 || sbx_mono_ms() >= f;
}

/* cluster.c — cluster_fence_now: fence at once (any thread; etcd says the
 * lease is gone, or etcd may lack writes we hold): fence_at becomes 0, the
 * loop stops serving (posted) and the lease thread re-registers. */
void cluster_fence_now(struct cluster *c);

/* cluster_repl.c — cluster_repl_main: the replication thread (arg: the
 * struct cluster, borrowed); sends what cluster_replicate queued until
 * c->stop, posting each batch's outcome to the loop.  Returns NULL. */
void *cluster_repl_main(void *arg);

/* The outcome of one write of a replication batch, as it goes to the loop
 * (in sequence order: the order of the output gate's outstanding FIFO). */
struct rnote {
    uint64_t seq;
    int rc;      /* the replication's: 0 also for a write not sent (sent false) */
    bool sent;   /* false: its commit to LMDB failed, so it was never sent to etcd */
    char id[64];
    uint32_t part;
};

/* cluster_repl.c — cluster_repl_committed: replication thread; wait until
 * store st has decided every write of batch (a list of ascending sequence
 * numbers, owned by the caller) and note each one in notes[*n] onwards (in
 * order; *n grows by the batch's length, room for it is the caller's).
 * Returns the batch without the writes whose commit failed (those are
 * freed): only committed writes are sent to etcd (cluster.h, ownership
 * rules); the last committed write of a record then goes as its last one,
 * however a later write of it failed. */
struct ritem *cluster_repl_committed(sbx_store *st, struct ritem *batch, struct rnote *notes,
                                     size_t *n);

/* cluster_handoff.c — cluster_purge_partitions: loop thread; delete the
 * local records (not those in etcd) and the idle actors of the partitions
 * in set (a SBX_PARTITIONS byte map, borrowed). */
void cluster_purge_partitions(struct shard *sh, const uint8_t *set);
/* cluster_handoff.c — cluster_handoff: control thread; hand the n
 * partitions parts[] (owned by this shard at epochs[]; both borrowed) to
 * member tname at nng URL turl (target: its member index).  Blocks until
 * the loop quiesced them (or c->stop), copies their records, switches
 * their owner in etcd, and posts the end to the loop, which drops what was
 * switched away and serves the rest again.  Sets c->handed_rev of what it
 * switched. */
void cluster_handoff(struct cluster *c, int target, const char *tname, const char *turl,
                     const uint32_t *parts, size_t n, const int64_t *epochs);

/* cluster_load.c — cluster_load_wanted: control thread; read from etcd the
 * records of the partitions the loop asked for (want_load) and post them
 * to the loop, which installs those still due and then serves them.  A
 * failed read leaves them unavailable and backs off (load_next_ms). */
void cluster_load_wanted(struct cluster *c);

/*
 * ws_move.c: persistent workspaces that follow their partition
 * (docs/persistence.md, "Across the cluster").
 *
 * cluster_ws_push — blocking (control thread): send the workspace image
 * in src_dir/disk.img of sandbox id to the peer on s (a REQ socket, the
 * caller's) with workspace.put: begin, its data extents in 4 MiB chunks,
 * commit (kind and taken_ms: container/ws_xfer.h).  The image is locked
 * against mounts while it is read.  deadline_ms: monotonic, 0 none.
 * record (reclen bytes, borrowed; NULL for a move or snapshot): a fork's
 * staged copy for the owner of id on another node (actors/fork.c): sent
 * as kind "fork" into the peer's staging directory, with this record
 * beside the image at the commit.
 * *sent: whether there was an image to send (none: 0, nothing sent).
 * Returns 0 or an error code:
 * SBX_E_SHARD_UNAVAILABLE (no answer), SBX_E_TIMEOUT, SBX_E_STORAGE, the
 * peer's refusal (WRONG_OWNER, VALIDATION: a chunk or the digest did not
 * match).  After an error the peer was asked to abort (what it holds of
 * the transfer is never used).
 */
int cluster_ws_push(struct shard *sh, nng_socket s, const char *peer, const char *id,
                    const char *src_dir, enum sbx_ws_kind k, int64_t taken_ms,
                    int64_t deadline_ms, const void *record, size_t reclen, bool *sent,
                    sbx_err_t *err);
/* cluster_ws_fork_discard — blocking, best effort: ask the shard at url to
 * remove the copy of fork id staged there (workspace.put kind "fork",
 * phase abort), for a fork that failed after the copy was sent. */
void cluster_ws_fork_discard(struct shard *sh, const char *url, const char *id);
/* ws_snap.c: ws_snap_main — the snapshot thread's body (arg: the cluster);
 * cluster_ws_snap_free — free the drops not sent (cluster_free). */
void *ws_snap_main(void *arg);
void cluster_ws_snap_free(struct cluster *c);
/* cluster_ws_push_set — blocking (control thread): cluster_ws_push of the
 * workspace of each of ids[0..n) that has one on this shard to the peer
 * (name, url), one after the other over one connection; stops at the first
 * failure (its code).  *moved: how many were sent. */
int cluster_ws_push_set(struct shard *sh, const char *peer, const char *url, char *const *ids,
                        size_t n, int64_t deadline_ms, size_t *moved, sbx_err_t *err);

#endif
