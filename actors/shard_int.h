/*
 * shard_int.h — what shard.c, actor.c and their parts share.  Everything here is owned
 * by the shard's loop thread unless a comment says otherwise.
 */
#ifndef SBX_SHARD_INT_H
#define SBX_SHARD_INT_H

#include <nng/nng.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "../container/image_store.h"
#include "../container/net.h"
#include "../container/spawn.h"
#include "../container/workspace.h"
#include "../container/ws_pool.h"
#include "../runtime/err.h"
#include "../runtime/error.h"
#include "../runtime/frame.h"
#include "../runtime/loop.h"
#include "../runtime/ops.h"
#include "../runtime/place.h"
#include "../runtime/prom.h"
#include "../runtime/store.h"
#include "../runtime/wire.h"
#include "record.h"
#include "shard.h"

struct shard;
struct actor;

/* Idempotency keys are "<request id>\x1f<sandbox>\x1f<op>": a request id
 * reused for another sandbox or operation is another request. */
#define SBX_IDEM_KEY (SBX_WIRE_MAX_ID + 64 + 64 + 3)

/* One nng context of the REP socket: receives a request, later sends its reply. */
struct sctx {
    struct shard *sh;
    nng_ctx ctx;
    nng_aio *aio;
    int state; /* SCTX_RECV, SCTX_WORK, SCTX_SEND */
};
enum { SCTX_RECV = 1, SCTX_WORK, SCTX_SEND };

/* One request being handled. */
struct sop {
    struct sop *next;           /* mailbox or in-flight list */
    struct shard *sh;
    struct actor *actor;
    struct sctx *ctx[4];        /* where to reply (dups of the same request id join) */
    int nctx;
    int64_t ctx_deadline[4];    /* per ctx: when the shard answers REQUEST_TIMEOUT to it
                                 * itself (sbx_mono_ms; shard_deadline), 0: never */
    uint64_t dl_timer;          /* fires at the earliest of them (shard_deadline_arm) */
    nng_msg *msg;               /* owns the request bytes */
    const char *frame;          /* the request frame inside msg (unwrapped) */
    size_t frame_len;
    sbx_msg dec;
    struct sbx_req req;
    const struct sbx_op_def *def;
    char id[SBX_IDEM_KEY];      /* idempotency key: request id, sandbox and op */
    bool transient;             /* a transient error was answered: not to be replayed */
    uint64_t tag;               /* agent request tag when in flight */
    int64_t t0_us;
    struct sbx_cgroup_stats pre;/* cgroup counters when sent to the agent (exec, exec.stream,
                                 * process.start: "cg" for the agent to refine causes) */
    bool have_pre;
    bool container_restarted;   /* first op on a container replacing one that died */
    uint64_t idem_seq;          /* store write of its reply to the idempotency table, or 0 */
    uint64_t idem_need;         /* the write its reply waited on before that one (idem.c) */
    uint64_t intent_seq;        /* store write of its intent entry (idem_intent), or 0 */
    bool idem_pending;          /* its reply's entry is marked pending (idem.c IDEM_PENDING) */
    bool sent;                  /* handed to the agent: it may have run (idem_done) */
    uint64_t wseq;              /* the actor's last store write when op went to the agent:
                                 * its reply fails if that write did (output gate) */
    int code;                   /* the error code its reply carries, 0: success (metrics) */
    char img_digest[72];        /* create by a name this node lacks: the digest a peer
                                 * resolved it to, fetched here (images.c shard_image_resolve) */
    char audit_key[40];         /* route.keyId: the caller's key id (audit.c), "": not audited */
    char tenant[20];            /* route.tenant ("" for the default tenant or none) */
    bool tenant_set;            /* route.tenant was stamped (a gateway with API keys) */
};

/* A reply waiting for the output gate.  It names its sandbox by id, not by
 * actor: an actor that holds nothing else may be freed while its reply waits
 * (op->actor is cleared when the reply is held). */
struct held {
    struct held *next;
    struct sop *op;
    char *buf;
    size_t len;
    uint64_t need;
    uint64_t dep;               /* the actor's write it depends on (need, as given) */
    uint64_t own;               /* op->wseq */
    char sandbox[64];           /* "" for a reply of no sandbox */
};

/* A record write of an actor not yet decided (shard.c, the output gate):
 * sh->pw_head..pw_tail in sequence order.  img is the encoded record
 * written (NULL: a deletion); it becomes the actor's durable image once
 * committed.  Owns img. */
struct pwrite {
    struct pwrite *next;
    uint64_t seq;
    char id[64];
    char *img;
    size_t len;
};

/* The container state of an actor. */
enum cstate { C_NONE = 0, C_STARTING, C_RUNNING, C_STOPPING };

#define ACTOR_OLD_BAD 8 /* earlier failed write ranges an actor remembers */

struct actor {
    struct actor *hnext;
    struct shard *sh;
    char id[64];
    bool exists;                /* a record is (or will be, once committed) in LMDB */
    struct sbx_record rec;
    enum cstate cs;
    struct sbx_container c;
    struct sbx_net_attachment net_att; /* its eth0 into the router while running (egress) */
    sbx_watch *w;
    sbx_frame_reader rd;
    sbx_frame_writer wr;
    uint64_t next_tag;
    struct sop *inflight;       /* sent to the agent, awaiting its reply */
    struct sop *mb_head, *mb_tail; /* mailbox */
    struct sop *gate;           /* the op the input gate is closed for, if any */
    uint64_t last_seq;          /* last LMDB write of this actor (output gate) */
    /* The output gate (shard.c).  durable: the encoded record of the last
     * committed write of the actor (or the one loaded; NULL: none), owned.
     * Writes bad_lo..bad_hi failed to commit, or were made on top of one
     * that failed and are undone with it: a reply that depends on one of
     * them carries bad_code (STORAGE_FULL, STORAGE_ERROR, WRONG_OWNER…).
     * old_bad: the ranges before it (a ring of the last ACTOR_OLD_BAD;
     * n_old_bad counts them all): a reply may still depend on a write of an
     * earlier range when a later one fails (the fill fault's lost write: an
     * exec whose sandbox's creating write failed was acknowledged after a
     * configure of it failed too, when the actor remembered one range).
     * cw_seq: the write the op at the input gate waits for before it goes
     * to the agent (0: none); cwnext links sh->cwait. */
    char *durable;
    size_t durable_len;
    uint64_t bad_lo, bad_hi;
    int bad_code;
    struct {
        uint64_t lo, hi;
        int code;
    } old_bad[ACTOR_OLD_BAD];
    unsigned n_old_bad;
    uint64_t cw_seq;
    struct actor *cwnext;
    bool restore;               /* LMDB may hold an undone write of it (one in bad_lo..
                                 * bad_hi committed, no later one yet) */
    uint64_t restore_timer;     /* the retry of its rewrite (actor_commit_failed), or 0 */
    int64_t last_active_ms;
    int64_t sleep_after_ms;     /* idle time before the container is stopped (0: shard default) */
    bool keep_alive;            /* never stopped for idleness */
    bool died;                  /* its last container ended unexpectedly */
    char last_exit[160];
    /* Its image fetched from a peer for its container (image_fetch.c;
     * `status` imageFetch): 0 none, 1 fetching, 2 fetched, 3 failed; the
     * peer it came from; the failure. */
    int img_fetch;
    char img_from[64];
    char img_why[160];
    uint64_t img_bytes;         /* bytes received (when fetched or failed) */
    struct work *img_work;      /* while fetching: the start's work (its fetch_bytes) */
    bool destroying;
    /* Its partition's records were replaced while it could not be freed
     * (its container still stopping, relays open): it writes nothing to the
     * store, actor_get no longer finds it, and it is freed once idle. */
    bool stale;
    int relays;                 /* preview connections open into the container */
    uint16_t part;              /* partition of the ID (runtime/place.h) */
};

/* Work for the worker threads (container start/stop). */
struct work {
    struct work *next;
    enum { W_START, W_STOP } kind;
    struct shard *sh;
    struct actor *actor;        /* W_START for an actor; NULL for the pool */
    struct sbx_container c;     /* W_STOP: the container; W_START: the result */
    struct sbx_limits lim;
    char image[72];             /* W_START: the image's digest ("" the host's /usr) */
    char ws_dir[1024];          /* W_START: a persistent workspace's directory ("" none) */
    bool ws_must;               /* W_START: its image was made before: absent, it is restored
                                 * from a snapshot or the start fails (never made empty) */
    int64_t ws_snap_ms;         /* W_START: the result: when the snapshot it was restored from
                                 * was taken (ms since the epoch; 0: none restored) */
    struct shard_peers *peers;  /* W_START of an image this node lacks: the peers to fetch it
                                 * from (heap; the worker frees it), else NULL */
    char fetched_from[64];      /* W_START: the peer the image came from ("" none) */
    _Atomic uint64_t fetch_bytes; /* W_START: bytes of it received so far (the worker adds) */
    uint64_t disk;              /* W_START: its size, bytes (a new image's; an existing one keeps its own) */
    bool ws_tmpfs;              /* W_START: an ephemeral workspace of `disk` bytes, not the
                                 * shard's --disk: its own tmpfs (sbx_ws_tmpfs) */
    int rc;
    char why[512];
    bool for_destroy;
    bool net;                   /* W_START: attach c to the router under pol */
    struct sbx_net_policy pol;
    struct sbx_net_attachment att; /* W_START: the result; W_STOP: detached after the stop */
};

struct pooled {
    struct pooled *next;
    struct sbx_container c;
};

/* The worker threads (shard_work.c): two queues of work under their own
 * lock; results come back through sbx_loop_post.  Work for an actor (a
 * request is waiting on it) goes in head/tail, the pool's refills and stops
 * in bg_head/bg_tail, and a worker takes from the first queue while it has
 * work: a refill never delays a waiting request's container. */
struct shard_workers {
    pthread_t *threads;
    int n;
    pthread_mutex_t mu;         /* guards head, tail, bg_head, bg_tail, stop */
    pthread_cond_t cv;
    struct work *head, *tail;
    struct work *bg_head, *bg_tail;
    bool stop;
    int busy;                   /* loop-side count of work items not yet returned */
    int actor_busy;             /* … of which for actors (a request waits on each) */
};

/* The listener's self-probe thread (listen_probe.c). */
struct shard_probe {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* signalled to stop */
    bool stop, started;
};
/* listen_probe.c: shard_probe_start — from the loop thread once the shard
 * listens: a thread that sends the shard a request through its own listen
 * URL every 5 s and, after 3 unanswered in a row, has the loop close the
 * listener and listen again (see the file's header for why).
 * shard_probe_stop — join it (before the loop stops running). */
void shard_probe_start(struct shard *sh);
void shard_probe_stop(struct shard *sh);

/* The seconds of demand the adaptive pool remembers (shard_work.c). */
#define SHARD_POOL_WINDOW 60

/* The asks a demand remembers one by one (the last second's; more in one
 * second than this counts as this many: no pool holds more). */
#define SHARD_DEMAND_RECENT 256

/* Containers asked for over the last SHARD_POOL_WINDOW seconds, as the most
 * asked for within any one second (a sliding 1000 ms, not the calendar
 * second: a burst that straddles a second's boundary counts whole), kept
 * per monotonic second in a ring (the warm pool's and each image pool's
 * demand).  Zeroed: no demand. */
struct shard_demand {
    uint32_t n[SHARD_POOL_WINDOW];   /* most asked for in 1 s ending in second … */
    int64_t sec[SHARD_POOL_WINDOW];  /* … this (monotonic seconds) */
    int64_t recent[SHARD_DEMAND_RECENT]; /* monotonic ms of the last asks, a ring */
    uint32_t head, count;            /* next slot; asks of the last 1000 ms in it */
};
/* shard_work.c: shard_demand_note — one more asked for at now_ms (monotonic
 * ms, never decreasing between calls). */
void shard_demand_note(struct shard_demand *d, int64_t now_ms);
/* shard_work.c: shard_demand_peak — the most asked for within one second
 * (sliding) during the last window_s seconds before now_s (window_s ≤
 * SHARD_POOL_WINDOW). */
uint32_t shard_demand_peak(const struct shard_demand *d, int64_t now_s, int64_t window_s);
/* shard_demand_want — the ready containers a pool wants for that demand:
 * the busiest second plus a quarter of it (a burst's split between the
 * shards, 25 +/- 3.5 of 50 on each of 2, varies from one burst to the
 * next; each create beyond the pool is a container built while its caller
 * waits: docs/benchmarks.md, "Bursts"). */
int64_t shard_demand_want(const struct shard_demand *d, int64_t now_s, int64_t window_s);

/* The warm pool of started containers (shard_work.c; loop thread).  Its
 * size adapts: `target` is the most containers asked for (pool hits and
 * misses) in any one second of the last conf.pool_window (at most
 * SHARD_POOL_WINDOW seconds, the default) plus a quarter of it (a burst's
 * split between shards varies), at
 * least conf.pool and at most `cap`, which is conf.pool_memory divided by
 * what one pooled container holds (`mem_est`, measured from the pooled
 * containers' cgroups).  conf.pool == 0 turns the pool off. */
struct shard_pool {
    struct pooled *head;        /* owned */
    int n, inflight;            /* containers in it; starts under way */
    int target, cap;            /* containers wanted now; the memory budget's limit */
    uint64_t mem_est;           /* bytes one pooled container holds (moving average) */
    struct shard_demand demand; /* containers asked for (hits and misses) */
    int64_t last_take_ms;       /* monotonic time of the last shard_pool_take */
    int64_t armed_ms;           /* when the pending refill timer was first set */
    bool fill_armed;            /* a refill timer is pending (pool_fill_soon) */
};

/* Ready containers per image (image_pool.c; docs/images.md "Pools per
 * image"): each of up to SHARD_IMG_POOLS images keeps started containers
 * while sandboxes of it were created in the last SHARD_IMG_POOL_IDLE_MS —
 * as many as the busiest second of the last SHARD_POOL_WINDOW seconds asked
 * for plus a quarter, at least conf.image_pool, within the pool memory budget — then they
 * stop (and with them their hold on the image: GC may delete it
 * afterwards). */
#define SHARD_IMG_POOLS 8
#define SHARD_IMG_POOL_IDLE_MS 30000
struct img_pool {
    char digest[72];            /* the image; "": a free slot */
    struct pooled *head;        /* owned */
    int n, inflight;            /* containers in it; starts under way */
    int target;                 /* containers wanted now (image_pool.c set_target) */
    struct shard *sh;           /* borrowed: its shard (for its refill timer) */
    int64_t last_ms;            /* monotonic: the last create of a sandbox of it */
    int64_t armed_ms;           /* when its pending refill timer was set; 0: none */
    struct shard_demand demand; /* creates of it */
};

/* Cached replies for retried request ids (idempotency). */
struct idem {
    struct idem *hnext, *lnext;
    char id[SBX_IDEM_KEY];
    struct sop *inflight;       /* while being handled */
    char *reply;                /* once done (NULL if too large to keep, or only in LMDB) */
    size_t len;
    size_t dlen;                /* bytes of its LMDB copy (SBX_DB_IDEM), 0: none */
    int64_t at_ms;              /* recorded, ms since the epoch */
    bool interrupted;           /* an intent with no reply: started, never answered */
};

/* The actors by sandbox ID (actor.c; loop thread): a chained hash table
 * (struct actor's hnext).  Owns the actors. */
struct actor_table {
    struct actor **buckets;
    size_t nbuckets, n;
};

/* The idempotency cache (idem.c; loop thread): entries by key, and in
 * insertion order for expiry.  Owns its entries. */
struct shard_idem {
    struct idem **buckets;
    size_t nbuckets, n;
    struct idem *head, *tail;   /* insertion order, for expiry */
    size_t bytes;               /* of the replies kept in memory */
    size_t dbytes;              /* of their LMDB copies */
};

/* The preview relay server (relay.c): its thread, listening socket and
 * live connections, under its own lock. */
struct shard_relay {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int fd, stopfd;
    pthread_t thread;
    bool running;
    struct shard_relay_conn *conns;
    int nconns;
};

/* The shard's histograms for GET /metrics (metrics.c; loop thread).  ops
 * holds one histogram per (operation, result code) pair answered, made on
 * first use: ops[op id * SHARD_MX_CODES + code slot], slot 0 success, slot
 * 1 + (code - SBX_E__FIRST) an error; a code outside sbx's own counts as
 * INTERNAL_ERROR.  Owns ops and each histogram. */
#define SHARD_MX_CODES (SBX_E__LAST - SBX_E__FIRST + 1)
struct shard_metrics {
    struct sbx_hist **ops;
    struct sbx_hist start;      /* container start time, s (pooled or not) */
};

/* The audit table's bookkeeping (audit.c; loop thread only). */
struct shard_audit {
    uint64_t seq;   /* the last entry's sequence number */
    int64_t count;  /* entries in the table (counted at start, then kept) */
};

/* The disk guard (disk_guard.c; container/ws_guard.h): a pass over the
 * running persistent workspaces on a thread of its own, at most one at a
 * time.  Written by that thread, read by the loop (status). */
struct shard_dguard {
    _Atomic bool busy;          /* a pass is running */
    _Atomic bool engaged;       /* the last pass held some workspace below its want */
    _Atomic uint64_t room;      /* bytes the last pass shared out (this shard's part) */
    _Atomic uint64_t limited;   /* workspaces the last pass held below their want */
    _Atomic uint64_t passes;    /* passes run (each found the host short, or ended a cut) */
    _Atomic uint64_t failed;    /* workspaces the last pass could not measure */
    _Atomic uint64_t pass_us;   /* how long the last pass took (its thread), µs */
    _Atomic uint64_t measured;  /* workspaces the last pass measured */
    _Atomic uint64_t level;     /* the last pass's level (bytes of new data each workspace
                                 * may take; UINT64_MAX: no cut): a workspace mounted
                                 * meanwhile is held to it (shard_work.c) */
};

/* disk_guard.c: called each second by the loop's sweep: when the running
 * persistent workspaces could grow past this shard's part of the free
 * disk, start a pass (container/ws_guard.h) on a thread; never blocks on
 * the workspaces.  Skipped while a pass runs, with --disk-reserve 0, and
 * once the shard stops (img_stop). */
void shard_disk_guard(struct shard *sh);
/* disk_guard.c: may a new persistent workspace (a first start, a fork) be
 * made?  0, or -ENOSPC with the reason in why: the workspace pool is full
 * (sbx_wspool_room), or the free disk under the workspaces is below
 * --disk-reserve, where the guard lets running sandboxes allocate nothing
 * more.  Any thread (statvfs only). */
int shard_disk_admit(struct shard *sh, char *why, size_t whylen);

struct shard {
    struct sbx_shard_conf conf;
    sbx_loop *loop;
    sbx_store *store;
    sbx_cgroups *cgroups;
    sbx_spawner *spawner;
    sbx_net *net;               /* egress networking (container/net.h); thread-safe */
    sbx_wspool *wspool;         /* the workspace pool (container/ws_pool.h), or NULL: the
                                 * workspaces are on the host's file system; thread-safe */
    nng_socket rep;
    nng_listener listener;      /* rep's listener (listen_probe.c may replace it) */
    struct shard_probe probe;   /* listen_probe.c */
    struct sctx *ctxs;
    int nctx;
    int sigfd;
    struct sbx_limits limits;
    int64_t started_ms;
    int64_t fork_swept_ms;      /* monotonic: the last shard_fork_sweep_soon (fork.c) */
    bool stopping;
    bool ctx_closed;            /* replies are no longer sent */

    struct actor_table actors; /* actor.c */

    /* output gate */
    uint64_t decided;           /* every write ≤ this has a result */
    uint64_t store_failures;    /* failed store batches decided (commit_loop) */
    /* Per partition, the last store write of a record of it (put or
     * delete).  Outlives the actors: a destroyed sandbox's actor is freed
     * while its delete may still be uncommitted, and a handoff must not copy
     * the record before that delete is decided (the destroy's tombstone). */
    uint64_t part_seq[SBX_PARTITIONS];
    /* Per partition: the last store write queued before its local records
     * were last replaced (cluster_purge_partitions: a reload from etcd, an
     * import, a handoff away).  Writes up to it belong to an earlier
     * incarnation of the partition's records: their outcomes (a commit or
     * replication that fails late) never touch the actors made since, and
     * their queued images are not what the record is (gate.c, actor.c). */
    uint64_t part_reset_seq[SBX_PARTITIONS];
    struct held *held;
    /* The store is held (sbx_store_hold) from a record write to the end of
     * the loop callback that made it, so the reply's idempotency record,
     * made in that callback, commits with it (gate.c hold_store). */
    bool store_held;
    struct pwrite *pw_head, *pw_tail; /* record writes not yet decided, in order */
    /* In a cluster: deletes committed here whose replication to etcd is not
     * yet decided, oldest first (gate.c shard_unreplicated_delete). */
    struct pwrite *rd_head, *rd_tail;
    struct actor *cwait;        /* actors whose gate op waits for a commit (cw_seq) */

    struct shard_workers work; /* shard_work.c */
    struct shard_pool pool;    /* shard_work.c */

    struct shard_idem idem;    /* idem.c */

    struct shard_relay relay;  /* relay.c */

    sbx_image_store *images;   /* the node's image store (images.c), or NULL */
    char backups[4096];        /* the node's backup store's directory ("": none; backups.c);
                                * with s3, its tmp/ stages archives */
    struct sbx_s3 *s3;         /* owned: the S3 backup store (--backup-store s3://…), or NULL:
                                * the directory is the store (container/backup_s3.h) */
    struct img_pool img_pools[SHARD_IMG_POOLS]; /* image_pool.c */
    _Atomic int img_jobs;      /* image ops running on their threads (images.c) */
    _Atomic bool img_stop;     /* set by shard_images_stop: template builds give up */

    /* cluster membership and ownership (actors/cluster.c), or NULL */
    struct cluster *cluster;

    /* counters for status */
    uint64_t n_requests, n_started, n_start_failed, n_pool_hits, n_pool_misses, n_died;
    int64_t start_us_total;

    struct shard_metrics mx;   /* metrics.c */

    struct shard_audit audit;  /* audit.c */

    struct shard_dguard dguard; /* disk_guard.c */
};

/* metrics.c: count op's answer (code, time since t0_us) in sh->mx; free
 * the histograms; the shard's part of `metrics` (op consumed). */
void shard_metrics_reply(struct sop *op);
void shard_metrics_free(struct shard *sh);
void shard_op_metrics(struct sop *op);

/* audit.c: append op's audit entry once its reply is sent, when the gateway
 * stamped a key id (API keys on) and op changes something; the shard's
 * part of `audit.list` (op consumed); count the table at start. */
void shard_audit_reply(struct sop *op);
void shard_op_audit_list(struct sop *op);
void shard_audit_open(struct shard *sh);

/* shard.c: the shard-level operations list and shard.status (op consumed). */
void shard_op_list(struct sop *op);
void shard_op_status(struct sop *op);
/* images.c: wait until no image op is running on its thread (the shard is
 * stopping; the replies they posted are run by the loop afterwards). */
void shard_images_stop(struct shard *sh);
/* images.c: run fn(arg) on a detached thread counted in img_jobs (so the
 * shard's stop waits for it: fn's last act must be
 * atomic_fetch_sub(&sh->img_jobs, 1)).  0, or -errno from pthread_create
 * (nothing started, the count restored, arg still the caller's). */
int shard_job_start(struct shard *sh, void *(*fn)(void *), void *arg);
/*
 * image_fetch.c: images fetched from peer nodes (docs/images.md, "Images in
 * a cluster").  A snapshot of the peers to ask: the cluster's live members
 * other than this shard, with their nng URLs.
 */
struct shard_peer {
    char name[64];
    char url[256];
};
struct shard_peers {
    int n;
    struct shard_peer p[64]; /* SBX_CVIEW_MAX_MEMBERS */
};
/* shard_peers_snapshot — loop thread: the peers (heap, the caller's; NULL
 * when the shard is not in a cluster), the one named first (may be NULL)
 * placed first. */
struct shard_peers *shard_peers_snapshot(struct shard *sh, const char *first);
/* shard_successor — loop thread: the shard that would own partition part
 * if this one left (rendezvous hashing over the other live, non-draining
 * members: the one a drain or a failover hands it to).  0, or -1 (none). */
int shard_successor(struct shard *sh, uint32_t part, struct shard_peer *out);
/* shard_peer_call — any thread: send op {args} (args_len bytes of an
 * encoded msgpack map) on the REQ socket s and wait up to timeout_ms; on
 * success *out is the decoded answer (its "ok" true), pointing into *buf
 * (heap): the caller frees both (sbx_wire_msg_free, free).  Errors: the
 * peer's answered code with its message, SBX_E_SHARD_UNAVAILABLE when no
 * answer came. */
int shard_peer_call(nng_socket s, const char *op, const char *args, size_t args_len,
                    int64_t timeout_ms, char **buf, size_t *len, sbx_msg *out, sbx_err_t *err);
/* shard_peer_roundtrip — its transport alone: 0 with *reply (nng's, the
 * caller frees it) once any answer came, an error one included;
 * SBX_E_SHARD_UNAVAILABLE when none came by timeout_ms (listen_probe.c
 * needs only that). */
int shard_peer_roundtrip(nng_socket s, const char *op, const char *args, size_t args_len,
                         int64_t timeout_ms, nng_msg **reply, sbx_err_t *err);
/* shard_image_fetch — blocking (a worker or an image job's thread): fetch
 * the image digest from peers in turn (container/image_store.h
 * sbx_image_fetch) until one serves it intact; from receives that peer's
 * name, *bytes (may be NULL) counts what was received as it arrives (an
 * atomic: the loop thread reads it for `status`).  deadline_ms:
 * monotonic, 0 none.  Errors: SBX_E_IMAGE_NOT_FOUND (no peer has it),
 * SBX_E_IMAGE_INVALID (the peers that have it served corrupt blobs),
 * SBX_E_TIMEOUT, SBX_E_SHARD_UNAVAILABLE (stopping), SBX_E_STORAGE. */
int shard_image_fetch(struct shard *sh, const struct shard_peers *peers, const char *digest,
                      int64_t deadline_ms, char from[64], _Atomic uint64_t *bytes,
                      sbx_err_t *err);
/* images.c: shard_image_replicate — loop thread: after a sandbox of image
 * digest was created on partition part, ask the partition's successor to
 * fetch the image (image.fetch) in the background, so that a failover does
 * not find the new owner without it when this node is gone.  Best effort:
 * the outcome is logged. */
void shard_image_replicate(struct shard *sh, const char *digest, uint32_t part);
/* images.c: shard_image_resolve — loop thread, before a `create` op is
 * given to its actor: when its image is a name this node's store lacks,
 * ask the peers for the name (image.inspect; in a cluster), fetch the image
 * by the digest the first one that knows it answers — or, when none does and
 * the name holds its registry's host (sbx_image_ref_registry), pull it from
 * that registry — and then give the op to the actor with op->img_digest set
 * (true: op is the job's now, answered by it on failure: IMAGE_NOT_FOUND
 * with the registry's or skopeo's message).  false: nothing to do. */
bool shard_image_resolve(struct shard *sh, struct sop *op);
/* shard_intake.c: give a sandbox op (admitted, in the idempotency table)
 * to its actor. */
void shard_enqueue(struct shard *sh, struct sop *op);

/* actor_container.c: start the image's start command in a's new container
 * (record "imageConfig".start), if it has one. */
void actor_image_start(struct actor *a);
/* template.c: build the template name from the image from with the steps
 * run (nrun shell strings, each ended after step_ms) — blocking, on an image
 * job's thread (images.c); digest receives the new image's.  Errors: those
 * of sbx_image_add_layer, SBX_E_TEMPLATE_BUILD for a failing step (its output in
 * *err), SBX_E_CONTAINER when the build container fails. */
int shard_template_build(struct shard *sh, const char *name, const char *from, char *const *run,
                         int nrun, int64_t step_ms, char digest[SBX_IMAGE_DIGEST_LEN],
                         sbx_err_t *err);

/* shard_intake.c: the REP contexts' nng callback (nng's threads: moves the
 * message and posts on_request to the loop), and a reply sent on context c
 * (loop thread; buf borrowed; nothing once the socket is closing). */
void shard_sctx_cb(void *arg);
void shard_sctx_send(struct sctx *c, const char *buf, size_t len);

/* shard_work.c: a worker thread's body (arg: the shard); and topping the
 * warm pool up to its target (loop thread). */
void *shard_worker_main(void *arg);
void shard_pool_fill(struct shard *sh);
/* shard_pool_adapt — once a second (loop thread): forget demand older than
 * the window, re-measure what a pooled container holds, recompute target
 * and cap, stop pooled containers above the target, fill up to it. */
void shard_pool_adapt(struct shard *sh);
/* shard_work_submit — queue w (owned by the workers until it comes back to
 * the loop: actor_work_done for an actor's). */
void shard_work_submit(struct shard *sh, struct work *w);
/* shard_pool_take — a warm container into *out (true), or none (false);
 * either way counts one container of demand (hit or miss). */
bool shard_pool_take(struct shard *sh, struct sbx_container *out);

/* image_pool.c (loop thread).  shard_img_pool_take — a ready container of
 * the image digest into *out (true), or none (false); either way the
 * image's pool is (re)filled to conf.image_pool (0: no pools per image). */
bool shard_img_pool_take(struct shard *sh, const char *digest, struct sbx_container *out);
/* shard_img_pool_done — a pool start (w: W_START, no actor, w->image set)
 * came back: into its image's pool, or stopped (w consumed). */
void shard_img_pool_done(struct shard *sh, struct work *w);
/* shard_img_pools_adapt — once a second: stop the pools of images no
 * sandbox was created from for SHARD_IMG_POOL_IDLE_MS. */
void shard_img_pools_adapt(struct shard *sh);
/* shard_img_pools_stop — the shard stops: kill every pooled image
 * container and queue its stop. */
void shard_img_pools_stop(struct shard *sh);
/* shard_img_pool_count — ready image containers (status); *target (may
 * be NULL) the sum of the pools' targets. */
int shard_img_pool_count(const struct shard *sh, int *target);

/* shard_reply.c */
void shard_reply(struct sop *op, char *buf, size_t len, uint64_t need_seq);
/* shard_deliver — send buf (owned, consumed) to op's waiters now, keep it for
 * retries of its request id, and free op. */
void shard_deliver(struct sop *op, char *buf, size_t len);
void shard_reply_err(struct sop *op, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void shard_reply_werr(struct sop *op, sbx_werr *w);
/* shard_reply_begin — initialise `e` with the success envelope of `op`'s reply
 * ({v, id, ok:true, result:{ …), the result map left open for the caller's
 * fields.  shard_reply_end closes both maps and sends the reply as shard_reply
 * does (held until write `need_seq` is decided); it consumes `e`.  An encoder
 * left unbalanced or over its nesting limit answers INTERNAL_ERROR instead, so
 * the caller is answered either way. */
void shard_reply_begin(struct sop *op, sbx_enc *e);
void shard_reply_end(struct sop *op, sbx_enc *e, uint64_t need_seq);
/*
 * Deadlines (docs/protocol.md §2).  A request with timeoutMs T is answered
 * REQUEST_TIMEOUT by the shard itself at shard_deadline(T) after it
 * arrived — before the gateway gives up on the shard (T - 100 ms) and calls
 * it SHARD_UNAVAILABLE, which is for real shard faults.  The agent is asked
 * to have answered agent_margin(T) earlier (the request's "d"), so that its
 * own, more precise answer (exec's timed-out result, a wait's
 * REQUEST_TIMEOUT) is the one the client gets.
 */
int64_t shard_deadline(int64_t timeout_ms);
int64_t shard_agent_margin(int64_t timeout_ms);
/* shard_deadline_arm — (re)arm op's timer for the earliest ctx deadline;
 * at it, if op is in flight at its agent, those ctxs get REQUEST_TIMEOUT
 * (the operation goes on and its reply is kept for retries of the request
 * id).  Cancelled by sop_free. */
void shard_deadline_arm(struct sop *op);
/* shard_op_deadline — the latest deadline among the ctxs still waiting, or
 * 0 if one of them has none (or none waits). */
int64_t shard_op_deadline(const struct sop *op);
/* sop_free — free op (NULL: nothing), its timer, decoded request and message. */
void sop_free(struct sop *op);

/* gate.c (the output gate) */
/* shard_commit_cb — the store's commit callback (sbx_store_commit_fn; arg:
 * the shard): posts the news to the shard's loop. */
void shard_commit_cb(void *arg, uint64_t first, uint64_t last, int rc);
/* shard_deliver_error — answer op (consumed) with code, the failure of a
 * commit its reply depends on (STORAGE_FULL, STORAGE_ERROR, WRONG_OWNER);
 * a retry of its request id runs again. */
void shard_deliver_error(struct sop *op, int code);
/* shard_release_held — let the gate ops whose write is decided go on
 * (shard_commit_wait), then send every held reply whose writes are now
 * decided (committed to LMDB and, in a cluster, replicated), or its
 * failure's code if one of them failed. */
void shard_release_held(struct shard *sh);
/* shard_fail_held — write `seq` of actor `id` failed (replication): mark it
 * and the actor's later writes failed (a->bad_*) and answer code to the
 * held replies that depend on them; `msg` is unused (the code says it). */
void shard_fail_held(struct shard *sh, const char *id, uint64_t seq, int code, const char *msg);
/* shard_commit_wait — a's gate op (a->gate) goes on only once write
 * a->cw_seq is decided: then actor_commit_continue(a) is called (from
 * shard_release_held).  The actor must keep its gate closed meanwhile. */
void shard_commit_wait(struct actor *a);
/* shard_store_delete — queue the deletion of sandbox id's record (and its
 * replication in a cluster); its sequence number, as shard_store_record. */
uint64_t shard_store_delete(struct shard *sh, const char *id);
/* shard_store_record — set r->updated_ms, queue the write of r (encoded) and
 * its replication, and track it for the output gate; its sequence number,
 * or 0 if r could not be encoded (nothing written).  Loop thread only: the
 * store is held until the current loop callback ends, so the reply that
 * callback records (idem_persist, sbx_store_put_with) is committed in the
 * same transaction as the write (shard_store_delete too). */
uint64_t shard_store_record(struct shard *sh, struct sbx_record *r);

/*
 * idem.c: the idempotency table (docs/protocol.md §2 "Idempotency").  Keys
 * are op->id; entries are owned by the shard (loop thread).
 *  - idem_find — the entry of key id, or NULL (borrowed).
 *  - idem_add — a new entry for op, in flight (op borrowed until idem_done).
 *  - idem_remove — drop e and its LMDB copy; idem_free_all drops every
 *    entry from memory only (at exit, the store may be closed).
 *  - idem_expire — drop the oldest finished entries past the TTL
 *    (conf.idem_ttl) or the bounds.
 *  - idem_load — at start-up, before serving: the entries recorded in LMDB
 *    (expired ones deleted).  0 or a store error.
 *  - idem_persist — called with op's reply (buf, len: borrowed) before it
 *    is held: if op changes something, queue its reply to LMDB and return
 *    the write the reply must wait for (the later of need_seq and that one;
 *    need_seq alone for an op with a committed intent, whose retry after a
 *    crash that lost the record is answered OPERATION_INTERRUPTED — that
 *    record is a lazy write, runtime/store.h sbx_store_put_lazy_after);
 *    else need_seq.
 *  - idem_confirm — the reply (buf, len: borrowed) of op is leaving, its
 *    writes decided and replicated: in a cluster, rewrite op's entry without
 *    the pending mark idem_persist gave it (not waited on).
 *  - idem_gate_check — when the reply is about to leave: 0, or the error
 *    of the operation's own write (need_seq above) if that failed in an
 *    earlier batch than the reply's record.
 *  - idem_intent — before op (an agent operation that is not a read, with
 *    a request id) goes to the agent: queue its *intent* (the key, no reply
 *    yet) to LMDB, set op->intent_seq and return that write, which op must
 *    wait for (input gate) before it is sent; 0 if op needs none (not such
 *    an op, or already written).  An intent found with no reply after a
 *    restart, or kept by idem_done, makes the key answer
 *    OPERATION_INTERRUPTED until it expires: the operation may have run.
 *  - idem_done — op answered with buf (owned): keep it as the entry's
 *    reply (returns NULL) or, if op->transient, forget the entry (and its
 *    intent) — unless op->sent with an intent: then the entry stays as an
 *    interrupted one; returns what the caller must free.
 *  - idem_reply — the recorded reply of a finished entry: *buf is e's
 *    (*owned false) or a heap copy from LMDB (*owned true, caller frees);
 *    for an interrupted entry a new OPERATION_INTERRUPTED error reply (heap,
 *    *owned true).  0, -ENOENT (nothing recorded), or a store error.
 */
struct idem *idem_find(struct shard *sh, const char *id);
struct idem *idem_add(struct shard *sh, const char *id, struct sop *op);
void idem_remove(struct shard *sh, struct idem *e);
void idem_free_all(struct shard *sh);
void idem_expire(struct shard *sh);
int idem_load(struct shard *sh);
uint64_t idem_persist(struct sop *op, const char *buf, size_t len, uint64_t need_seq);
uint64_t idem_intent(struct sop *op);
/* idem_ttl_ms — how long a request id is remembered (conf.idem_ttl, else
 * 10 min), ms. */
int64_t idem_ttl_ms(const struct shard *sh);
/* idem_durable_op — whether op's reply goes to LMDB: an operation that
 * changes durable state or runs something in the container (running it
 * twice is not the same as running it once). */
bool idem_durable_op(const struct sop *op);
int idem_gate_check(struct sop *op);
void idem_confirm(struct sop *op, const char *buf, size_t len);
char *idem_done(struct sop *op, char *buf, size_t len);
int idem_reply(struct shard *sh, struct idem *e, char **buf, size_t *len, bool *owned);
/*
 * A handoff carries the recorded replies of the moving partitions'
 * sandboxes, so a late copy of a request that already ran (a retry, a
 * re-send) gets the first answer from the new owner instead of running
 * again (the fault test found a configure applied again after a destroy,
 * and an exec run twice, after a drain):
 *  - idem_export — append [key, value] for each durable entry (LMDB) of a
 *    sandbox in a partition of set (SBX_PARTITIONS flags) to e, an open
 *    array; entries over 64 KiB, and those past 4 MiB in all, stay behind.
 *    Returns how many.  Loop thread.
 *  - idem_import — store and index such an array (arr: borrowed; NULL:
 *    nothing); entries of keys known here already, and malformed ones, are
 *    skipped.  Returns how many were taken.  Loop thread.
 */
size_t idem_export(struct shard *sh, const uint8_t *set, sbx_enc *e);
size_t idem_import(struct shard *sh, const msgpack_object *arr);

/* relay.c: the preview relay server (conf.relay); start before serving,
 * stop after the loop has returned (its last posts run in the final loop run). */
int shard_relay_start(struct shard *sh);
void shard_relay_stop(struct shard *sh);

/* actor.c */
/* actor_port_exposed — whether port is exposed for the running container (ports.c). */
bool actor_port_exposed(struct actor *a, int port);

/* Shared by actor.c and ports.c (loop thread only). */
/* actor_ensure_record — give a a record (created now with limits lim, or
 * the shard's when NULL) if it has none, or none committed yet; queues its
 * write (a->last_seq). */
void actor_ensure_record(struct actor *a, const struct sbx_limits *lim);
/* actor_save_record — queue a write of a's record; a->last_seq is its seq. */
void actor_save_record(struct actor *a);
/* actor_start_container — start a's container (from the pool or a worker);
 * op (not NULL) waits at the input gate and goes on once it is up. */
void actor_start_container(struct actor *a, struct sop *op);
/* actor_merge_map_blob — replace *blob (a msgpack map, heap, may be NULL)
 * with *blob ⊕ vars: string values set, nil removes; the result is a fresh
 * heap blob (the old one is freed). */
void actor_merge_map_blob(char **blob, size_t *len, const msgpack_object *vars);
/* ports.c: sandbox.port.expose / port.unexpose / port.list / preview.resolve
 * (docs/protocol.md); each answers op (consumed). */
void actor_op_port_expose(struct actor *a, struct sop *op);
void actor_op_port_unexpose(struct actor *a, struct sop *op);
void actor_op_port_list(struct actor *a, struct sop *op);
void actor_op_preview_resolve(struct actor *a, struct sop *op);
/*
 * actor_partition_quiesce — for the actors of the partitions in set (a
 * SBX_PARTITIONS byte map): stop the containers of idle ones (as an idle
 * sleep does); with force, interrupt what is in flight or queued first.
 * Returns whether every such actor is quiet (no container, nothing in
 * flight, queued or gated); *max_seq gets the latest store write of a record
 * of those partitions, by these actors or by ones freed since (a destroy).
 */
bool actor_partition_quiesce(struct shard *sh, const uint8_t *set, bool force,
                             uint64_t *max_seq);
/* actor_commit_failed — the actor's write `seq` failed with `code`: mark it
 * and every later write of the actor made so far as failed (a->bad_*), put
 * the record back to its durable image, and rewrite that image if later
 * writes (which carry the failed change) may still commit — or, if one
 * already did (a->restore) and nothing later is queued, once a second from
 * now, again after each failure, until a write of the actor commits. */
void actor_commit_failed(struct actor *a, uint64_t seq, int code);
/* actor_commit_continue — the write a->cw_seq is decided: the op at the
 * gate goes to the agent, or is answered (its commit failed, or no
 * container runs any more), and the gate opens. */
void actor_commit_continue(struct actor *a);
/* actor_write_failed — whether a reply depending on write seq must fail
 * (seq in a->bad_lo..bad_hi or an earlier range still remembered, or, once
 * decided, a write the store failed: sbx_store_failed); never for seq 0.  actor_failed_code — the error of that range, 0 if none. */
bool actor_write_failed(const struct actor *a, uint64_t seq);
int actor_failed_code(const struct actor *a, uint64_t seq);
/* actor_mark_failed — writes of a from seq to its last one failed (or are
 * undone with it), with code: the current range grows, or a new one starts
 * and the current one is kept in old_bad. */
void actor_mark_failed(struct actor *a, uint64_t seq, int code);
/* actor_partition_drop — forget the in-memory actors of set (their records
 * are gone from this shard); busy ones go once their container stopped. */
void actor_partition_drop(struct shard *sh, const uint8_t *set);
/* fork.c: remove copies staged in the node's store (<backups>/forks/) for
 * forks on other shards and not adopted within an hour (a gateway that died
 * between the copy and the adopt); when the shard starts, and every 10
 * minutes after (shard_fork_sweep_soon). */
void shard_fork_sweep(struct shard *sh);
/* fork.c: where a fork's copy for sandbox id is staged on this node,
 * <staging>/<id> (<node pool>/.forks, or <backups>/forks), into buf; 0, or
 * -1 when the shard has no node store or the path does not fit.  Any
 * thread (reads only the shard's settings). */
int shard_fork_stage_dir(const struct shard *sh, const char *id, char *buf, size_t n);
/* fork.c: from the loop's sweep: every 10 minutes, shard_fork_sweep on a
 * thread of its own (counted in img_jobs): copies staged for forks that
 * failed elsewhere (a lost discard, a gateway gone between the copy and
 * the adopt) do not wait for the shard's next start. */
void shard_fork_sweep_soon(struct shard *sh);
/* actor_get — the in-memory actor of sandbox id; with load, a new one if
 * there is none, its record what the sandbox's last queued store write
 * made (sh->pw_head) or else what LMDB holds (a destroy's delete may still
 * be queued after its actor was freed), and its last_seq that write's.
 * NULL: not in memory (!load), or the store could not be read.  The shard
 * owns the actor. */
struct actor *actor_get(struct shard *sh, const char *id, bool load);
/* shard_unreplicated_delete — in a cluster, the write of sandbox id's
 * delete if it is committed in LMDB but its replication to etcd is not
 * decided yet (a reply on the sandbox must wait for it and fail with it),
 * else 0.  Forgets the deletes whose replication is decided. */
uint64_t shard_unreplicated_delete(struct shard *sh, const char *id);
/* shard_forget_replicated_deletes — drop the deletes of sh->rd_head whose
 * replication is decided; called when a replication batch is decided
 * (cluster_repl.c repl_done), so the list holds only what is in flight. */
void shard_forget_replicated_deletes(struct shard *sh);
/* actor_queued_write — the last store write of sandbox id not yet decided
 * (sh->pw_head), or NULL (borrowed). */
const struct pwrite *actor_queued_write(const struct shard *sh, const char *id);
void actor_enqueue(struct actor *a, struct sop *op);
/* actor_inflight — whether op has been sent to its actor's agent and waits
 * for the reply. */
bool actor_inflight(const struct sop *op);
void actor_work_done(struct shard *sh, struct work *w);
void actor_encode_status(struct actor *a, sbx_enc *e);
void actor_stop_all(struct shard *sh);
/* actor_container.c: stop the containers of actors idle for longer than their sleepAfter. */
void actor_sleep_sweep(struct shard *sh);
void actor_free_all(struct shard *sh);

/*
 * Shared by actor.c and its parts (actor_container.c, actor_chan.c,
 * actor_handoff.c); loop thread only.  Ops passed in are consumed (answered
 * or handed on) unless a comment says otherwise.
 */
/* actor.c: run what a's mailbox holds while its input gate is open. */
void actor_pump(struct actor *a);
/* actor.c: the op-dispatch chain — one op of a's mailbox. */
void actor_handle(struct actor *a, struct sop *op);
/* actor.c: free a if it holds nothing (no record, container, work, relay). */
void actor_maybe_free(struct actor *a);
/* actor.c: the lifecycle settings (sleepAfter, keepAlive) from a's record. */
void actor_load_config(struct actor *a);

/* actor_net.c — network settings (docs/network.md).
 * actor_net_check_args: args.network checked (each rule against the
 * always-denied ranges); *blob = a config map {"network": {…}} to merge
 * (heap, caller frees; NULL without args.network).  0 or SBX_E_VALIDATION
 * naming the rule in err. */
int actor_net_check_args(struct shard *sh, const msgpack_object *args, char **blob, size_t *len,
                         sbx_err_t *err);
/* actor_net_egress: the sandbox's mode (record, else the deployment's default) is egress. */
bool actor_net_egress(struct actor *a);
/* actor_net_policy: its rules, parsed again; SBX_E_CONTAINER (why) if one is refused now. */
int actor_net_policy(struct actor *a, struct sbx_net_policy *p, char *why, size_t whylen);
/* actor_net_apply: after a settings change, a running egress container that
 * stays egress gets the new rules now (new connections); a mode change
 * waits for the next container. */
void actor_net_apply(struct actor *a);
/* actor_net_encode_status: "network": {mode, allow, deny[, address, counters]}. */
void actor_net_encode_status(struct actor *a, sbx_enc *e);
/* actor.c: a's sleepAfter in ms (its own, else the shard's). */
int64_t actor_sleep_after(struct actor *a);
/* actor_container.c: answer every op of *list (emptied) with code and msg. */
void actor_fail_list(struct sop **list, int code, const char *msg);
/* actor_container.c: answer a's ops in flight at its agent with code and msg. */
void actor_fail_inflight(struct actor *a, int code, const char *msg);
/* actor_container.c: stop a's container on a worker (a->cs C_STOPPING until
 * actor_work_done); for_destroy: the destroy at the gate then finishes. */
void actor_stop_container(struct actor *a, bool for_destroy);
/* actor_container.c: the agent went away unasked (why: a sentence); its ops
 * in flight fail, the container is stopped, the next op starts a fresh one. */
void actor_container_died(struct actor *a, const char *why);
/* actor_container.c: forget a's record (queueing its deletion) and answer
 * the destroy op. */
void actor_finish_destroy(struct actor *a, struct sop *op);
/* actor_chan.c: send an agent op to a's agent (tagged, in flight until its
 * reply or the container's end). */
void actor_dispatch(struct actor *a, struct sop *op);
/* actor_chan.c: send {t: tag, op, a: args or args_enc (an open map encoder,
 * consumed) or {}} to a's agent, with the deadline and counters of sop when
 * not NULL.  0, SBX_E_INTERNAL, or SBX_E_CONTAINER (the channel broke). */
int actor_agent_send(struct actor *a, const char *op, const msgpack_object *args,
                     sbx_enc *args_enc, uint64_t tag, const struct sop *sop);
/* actor_chan.c: the loop's watcher of a's channel (arg: the actor). */
void actor_on_chan(sbx_loop *l, int fd, uint32_t ev, void *arg);

#endif
