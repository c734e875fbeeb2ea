/*
 * cluster.c — see cluster.h and docs/cluster.md.
 *
 * Lease thread: registers the shard (a lease, the member key under it) and
 * keeps the lease alive every third of the TTL — and does nothing else, so
 * that no handoff, claim or etcd stall elsewhere delays a renewal.  It
 * notes when the lease could expire at the earliest (the send time of the
 * last successful keep-alive plus the TTL it reported); that minus a third
 * of the TTL is fence_at.  The loop enforces fence_at with a timer of its
 * own (fence_check): when it passes, the shard admits nothing, interrupts
 * what is in flight and stops its containers, whatever the other threads
 * are doing.  Only then does the lease thread revoke the lease and register
 * again, and the control thread reloads from etcd what the shard still owns.
 *
 * Control thread, every second or at once when the view changed —
 * reconcile: desired(p) = rendezvous hash over the live, non-draining
 * members; partitions this shard owns but another should are handed off
 * (batches of HANDOFF_BATCH per target); partitions it should own whose
 * owner is dead, or that have no owner, are claimed with a compare-and-swap,
 * and their records are loaded from etcd first.
 *
 * A handoff of partitions P from this shard (A) to B:
 *   loop: mark P moving (requests for P get WRONG_OWNER: the gateway retries),
 *         let in-flight operations finish (HANDOFF_GRACE_MS, then interrupt
 *         them), stop P's containers as an idle sleep would, wait until every
 *         write is decided, read P's records from LMDB;
 *   ctl:  send them to B (partition.import over nng; B commits them before
 *         answering), then switch the owner of each partition in etcd with a
 *         transaction comparing owner and epoch; the new epoch is the key's
 *         new mod_revision;
 *   loop: drop P's actors and local records (on failure: serve P again).
 * Clients see at most a retry; no acknowledged write is lost: it is in B's
 * LMDB before the switch, and in etcd anyway.
 */
#include "cluster.h"

#include <errno.h>
#include <jansson.h>
#include <nng/nng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/cview.h"
#include "../runtime/err.h"
#include "../runtime/etcd.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "recrev.h"
#include "shard_int.h"

#define HANDOFF_BATCH 256
#define HANDOFF_GRACE_MS 10000
#define TXN_PARTS 60          /* compares and puts per etcd transaction (≤ 128) */
#define REPL_BATCH 40 /* records per replication transaction: ≤ 3 compares each (owner
                         and epoch of its partition, the record's own revision), within
                         etcd's --max-txn-ops (128) */
/* Record bytes per replication transaction.  etcd refuses a request over
 * --max-request-bytes (1.5 MiB by default) and values travel base64-encoded
 * in its JSON API (4/3); the largest record (an environment of 1 MiB,
 * actor.c) still fits alone. */
#define REPL_BATCH_BYTES (384u << 10)
#define REPL_ERROR_RETRIES 6 /* retries of a transaction etcd answered with an error */
#define LOAD_BATCH 256  /* partitions per load from etcd */
#define LOAD_PAGE 100   /* records per range request of a load: ≤ 100 of the largest
                           (1.4 MiB in base64) stay under the client's MAX_REPLY */
#define LOAD_BACKOFF_MIN_MS 100
#define LOAD_BACKOFF_MAX_MS 5000
#define IMPORT_TIMEOUT_MS 30000
#define STALE_IMPORT_MS 60000

/* One record write to replicate. */
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

/* A partition to claim from its (dead or absent) owner, as last seen. */
struct claim {
    uint32_t part;
    char owner[64];
    int64_t epoch;
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

/* A handoff's rendezvous between the control thread and the loop. */
struct hjob {
    struct cluster *c;
    uint8_t set[SBX_PARTITIONS];
    int64_t started_ms;
    bool done;
    int rc;
    sbx_enc recs;         /* array of [id, record] */
    size_t nrecs;
    char **ids;           /* the local records, deleted after a switch */
    size_t nids;
    uint64_t timer;
    uint8_t kept[SBX_PARTITIONS]; /* ctl: partitions of set etcd still shows ours after
                                     the switch (served again) */
};

struct cluster {
    struct shard *sh;
    sbx_etcd *etcd;
    sbx_cview *view;
    char prefix[160];
    int64_t ttl_ms;
    int64_t lease;           /* lease thread (cluster_stop once it ended); 0: none */
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
    pthread_cond_t cv;       /* the control thread and handoff()'s wait */
    pthread_cond_t lcv;      /* the lease thread */
    bool lwake;              /* under mu: lcv was signalled */
    bool dirty;
    uint8_t busy[SBX_PARTITIONS]; /* ctl thread: in a handoff or claim */
    int64_t handed_rev[SBX_PARTITIONS]; /* ctl thread: revision of our switch of the
                                           partition to another shard (0: none) */
    atomic_bool reload_owned; /* set by the lease thread when it fences, taken by the
                                 control thread: reload what we own from etcd */
    /* Under mu: partitions the loop asked the control thread to load from
     * etcd, at their epoch (0: none); loads says some are asked. */
    int64_t want_load[SBX_PARTITIONS];
    bool loads;
    int64_t load_next_ms;    /* ctl thread: no load before (monotonic ms; failures back off) */
    int64_t load_backoff_ms; /* ctl thread: the last back-off (0: the last load worked) */
    struct claim *claims;    /* ctl thread: scratch of reconcile (SBX_PARTITIONS) */
    /* replication queue */
    pthread_mutex_t rmu;
    pthread_cond_t rcv;
    struct ritem *rq_head, *rq_tail;
    recrev *revs;            /* replication thread: the records' revisions in etcd */
    /* loop thread only */
    struct lpart lp[SBX_PARTITIONS];
    bool first_view;
    uint64_t *outstanding;   /* replicated seqs not yet decided (FIFO, ascending) */
    size_t nout, capout, outhead;
    struct hjob *job;        /* the handoff under way (one at a time) */
    uint64_t fence_timer;    /* fires at fence_at (0: none armed) */
    int me;                  /* my member index (loop's copy) */
    char member_names[SBX_CVIEW_MAX_MEMBERS][64];
};

static struct cluster *
CL(const struct shard *sh)
{
    return sh->cluster;
}

bool
cluster_on(const struct shard *sh)
{
    return sh->cluster != NULL;
}

static void
nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static bool
fenced(struct cluster *c)
{
    int64_t f = atomic_load(&c->fence_at);
    return f == 0 || sbx_mono_ms() >= f;
}

/* ------------------------------------------------------------------------------ */
/* Loop thread: the view, admission. */

struct vupdate {
    struct cluster *c;
    struct sbx_cpart parts[SBX_PARTITIONS];
    char names[SBX_CVIEW_MAX_MEMBERS][64];
    int nmembers;
    int me;
};

static void purge_partitions(struct shard *sh, const uint8_t *set);

static void
view_apply(sbx_loop *l, void *arg)
{
    struct vupdate *u = arg;
    struct cluster *c = u->c;
    struct shard *sh = c->sh;
    (void)l;
    /* A slot the view gave to another name since the last view (cview.h):
     * an import from its former holder is from no member the view names. */
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        int16_t f = c->lp[p].imported_from;
        if (c->lp[p].imported_ms && f >= 0 && strcmp(c->member_names[f], u->names[f]))
            c->lp[p].imported_from = -1;
    }
    memcpy(c->member_names, u->names, sizeof(u->names));
    c->me = u->me;
    uint8_t stale[SBX_PARTITIONS];
    bool any_stale = false, any_load = false;
    memset(stale, 0, sizeof(stale));
    int64_t *load = sbx_xcalloc(SBX_PARTITIONS, sizeof(int64_t));
    int64_t now = sbx_wall_ms();
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        struct lpart *x = &c->lp[p];
        bool mine = u->me >= 0 && u->parts[p].owner == u->me;
        /* Owned since before this process, or claimed by us: loaded from
         * etcd below (a crash between a claim and its load leaves the local
         * store short; what it holds is not trusted). */
        if (mine && !x->mine && x->imported_ms)
            x->ready = true; /* handed to us: the import is committed */
        if (!mine) {
            x->ready = false;
            x->load_epoch = 0;
            if (x->imported_ms &&
                (u->parts[p].owner != x->imported_from || now - x->imported_ms > STALE_IMPORT_MS)) {
                /* An import whose switch never happened: its records are stale. */
                stale[p] = 1;
                any_stale = true;
                x->imported_ms = 0;
            }
        } else {
            x->imported_ms = 0;
        }
        if (!c->first_view && u->me >= 0 && !mine &&
            (u->parts[p].owner >= 0 || u->parts[p].epoch > 0)) {
            /* Owned by another shard when we start (or by a name the view does
             * not hold: cview.h): what we hold of it is stale. */
            stale[p] = 1;
            any_stale = true;
        }
        x->mine = mine;
        x->owner = u->parts[p].owner;
        x->epoch = u->parts[p].epoch;
        if (mine && !x->ready && !x->moving && x->load_epoch != x->epoch && !fenced(c)) {
            /* Load-then-serve: not admitted until its records came from etcd. */
            x->load_epoch = x->epoch;
            load[p] = x->epoch;
            any_load = true;
        }
    }
    if (any_load) {
        pthread_mutex_lock(&c->mu);
        for (int p = 0; p < SBX_PARTITIONS; p++)
            if (load[p])
                c->want_load[p] = load[p];
        c->loads = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    if (u->me >= 0) {
        c->first_view = true;
        if (any_stale)
            purge_partitions(sh, stale);
    }
    free(load);
    free(u);
}

int
cluster_admit(struct shard *sh, uint32_t part, int64_t epoch, sbx_werr *w)
{
    struct cluster *c = CL(sh);
    if (!c)
        return 0;
    if (fenced(c)) {
        sbx_werr_init(w, SBX_E_SHARD_UNAVAILABLE,
                      "shard %s is not serving: it is not a live member of the cluster (its "
                      "lease is not held)",
                      sh->conf.name);
        return SBX_E_SHARD_UNAVAILABLE;
    }
    struct lpart *x = &c->lp[part % SBX_PARTITIONS];
    const char *why = NULL;
    if (!x->mine)
        why = "is not owned by this shard";
    else if (x->moving)
        why = "is being handed off";
    else if (!x->ready)
        why = "is being loaded";
    else if (epoch && epoch != x->epoch)
        why = "was routed at another epoch";
    if (!why)
        return 0;
    sbx_werr_init(w, SBX_E_WRONG_OWNER, "partition %u %s (shard %s, epoch %lld)", part, why,
                  sh->conf.name, (long long)x->epoch);
    sbx_enc *e = sbx_werr_ctx(w);
    sbx_enc_kint(e, "partition", part);
    sbx_enc_kint(e, "epoch", x->epoch);
    if (x->owner >= 0)
        sbx_enc_kstr(e, "owner", c->member_names[x->owner]);
    sbx_enc_kbool(e, "retry", x->mine);
    return SBX_E_WRONG_OWNER;
}

bool
cluster_listable(struct shard *sh, uint32_t part)
{
    struct cluster *c = CL(sh);
    return !c || (c->lp[part % SBX_PARTITIONS].mine && c->lp[part % SBX_PARTITIONS].ready);
}

/* ------------------------------------------------------------------------------ */
/* Loop thread: local records of a set of partitions. */

struct scan {
    const uint8_t *set;
    sbx_enc *recs;
    size_t nrecs;
    char **ids;
    size_t nids;
};

static int
scan_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct scan *s = arg;
    if (kn == 0 || kn > 63)
        return 0;
    uint32_t p = sbx_place_partition(k, kn);
    if (!s->set[p])
        return 0;
    s->ids = sbx_xrealloc(s->ids, (s->nids + 1) * sizeof(char *));
    s->ids[s->nids++] = sbx_xstrndup(k, kn);
    if (s->recs) {
        sbx_enc_array(s->recs);
        sbx_enc_strn(s->recs, k, kn);
        sbx_enc_bin(s->recs, v, vn);
        sbx_enc_end(s->recs);
        s->nrecs++;
    }
    return 0;
}

/* Delete the local records (not in etcd) and idle actors of a set. */
static void
purge_partitions(struct shard *sh, const uint8_t *set)
{
    struct scan s = {set, NULL, 0, NULL, 0};
    sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, scan_one, &s);
    for (size_t i = 0; i < s.nids; i++) {
        sbx_store_del(sh->store, SBX_DB_SANDBOXES, s.ids[i], strlen(s.ids[i]));
        free(s.ids[i]);
    }
    free(s.ids);
    actor_partition_drop(sh, set);
}

/* ------------------------------------------------------------------------------ */
/* Loop thread: handoff-out. */

static void
job_check(sbx_loop *l, void *arg)
{
    struct cluster *c = arg;
    struct shard *sh = c->sh;
    struct hjob *j = c->job;
    (void)l;
    j->timer = 0;
    bool force = sbx_mono_ms() - j->started_ms > HANDOFF_GRACE_MS;
    uint64_t max_seq = 0;
    bool quiet = actor_partition_quiesce(sh, j->set, force, &max_seq);
    if (!quiet || max_seq > sh->decided || !cluster_gate_open(sh, max_seq)) {
        j->timer = sbx_loop_timer(sh->loop, 20, job_check, c);
        return;
    }
    /* Every write of these actors is decided: read what is committed. */
    struct scan s = {j->set, &j->recs, 0, NULL, 0};
    sbx_enc_init(&j->recs);
    sbx_enc_array(&j->recs);
    sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, scan_one, &s);
    sbx_enc_end(&j->recs);
    j->nrecs = s.nrecs;
    j->ids = s.ids;
    j->nids = s.nids;
    pthread_mutex_lock(&c->mu);
    j->done = true;
    j->rc = 0;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static void
job_begin(sbx_loop *l, void *arg)
{
    struct hjob *j = arg;
    struct cluster *c = j->c;
    (void)l;
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (j->set[p])
            c->lp[p].moving = true;
    c->job = j;
    job_check(l, c);
}

struct jend {
    struct cluster *c;
    struct hjob *j;
    bool ok;
};

static void
job_end(sbx_loop *l, void *arg)
{
    struct jend *e = arg;
    struct cluster *c = e->c;
    struct shard *sh = c->sh;
    struct hjob *j = e->j;
    (void)l;
    if (j->timer)
        sbx_loop_cancel(sh->loop, j->timer);
    uint8_t gone[SBX_PARTITIONS]; /* switched away: no longer ours */
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        gone[p] = e->ok && j->set[p] && !j->kept[p];
        if (!j->set[p])
            continue;
        c->lp[p].moving = false;
        if (gone[p]) {
            c->lp[p].mine = false;
            c->lp[p].ready = false;
        }
    }
    if (e->ok) {
        /* B holds them now: drop ours (local only: etcd's copy is B's). */
        for (size_t i = 0; i < j->nids; i++)
            if (gone[sbx_place_partition(j->ids[i], strlen(j->ids[i]))])
                sbx_store_del(sh->store, SBX_DB_SANDBOXES, j->ids[i], strlen(j->ids[i]));
        actor_partition_drop(sh, gone);
    }
    for (size_t i = 0; i < j->nids; i++)
        free(j->ids[i]);
    free(j->ids);
    sbx_enc_free(&j->recs);
    c->job = NULL;
    free(j);
    free(e);
}

/* ------------------------------------------------------------------------------ */
/* Loop thread: records loaded from etcd (load-then-serve). */

/* Records of partitions read whole from etcd; owned by the loop once posted. */
struct install {
    struct cluster *c;
    int64_t epoch[SBX_PARTITIONS]; /* the epoch each partition was loaded for (0: not in it) */
    uint8_t set[SBX_PARTITIONS];   /* install_apply: those still due (epoch and ask unchanged) */
    struct sbx_etcd_kv *kvs;       /* every record of those partitions */
    size_t n;
    uint64_t last_seq;
};

static void install_check(sbx_loop *l, void *arg);

/* Replace the local records of the partitions still owned at the epoch the
 * load was asked for (a load for a partition that moved since, or that a
 * fence reset, is dropped: the view asks again). */
static void
install_apply(sbx_loop *l, void *arg)
{
    struct install *in = arg;
    struct cluster *c = in->c;
    struct shard *sh = c->sh;
    (void)l;
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        const struct lpart *x = &c->lp[p];
        in->set[p] = in->epoch[p] && x->mine && !x->ready && !x->moving &&
                     x->epoch == in->epoch[p] && x->load_epoch == in->epoch[p];
    }
    purge_partitions(sh, in->set);
    for (size_t i = 0; i < in->n; i++) {
        const char *id = strrchr(in->kvs[i].key, '/');
        if (!id || !id[1])
            continue;
        id++;
        if (!in->set[sbx_place_partition(id, strlen(id))])
            continue;
        in->last_seq = sbx_store_put(sh->store, SBX_DB_SANDBOXES, id, strlen(id),
                                     in->kvs[i].value, in->kvs[i].vlen);
    }
    sbx_etcd_kvs_free(in->kvs, in->n);
    in->kvs = NULL;
    install_check(l, in);
}

/* Once the records are committed: the partitions are served. */
static void
install_check(sbx_loop *l, void *arg)
{
    struct install *in = arg;
    struct cluster *c = in->c;
    struct shard *sh = c->sh;
    if (in->last_seq > sh->decided) {
        sbx_loop_timer(l, 5, install_check, in);
        return;
    }
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        struct lpart *x = &c->lp[p];
        if (in->set[p] && x->mine && x->epoch == in->epoch[p] && x->load_epoch == in->epoch[p])
            x->ready = true;
    }
    free(in);
}

/* ------------------------------------------------------------------------------ */
/* Fencing. */

/* Any thread: wake the lease thread (a fence to act on, or stop). */
static void
lease_wake(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    c->lwake = true;
    pthread_cond_broadcast(&c->lcv);
    pthread_mutex_unlock(&c->mu);
}

/* Loop thread: stop serving. */
static void
fence_apply(struct cluster *c)
{
    struct shard *sh = c->sh;
    uint8_t all[SBX_PARTITIONS];
    memset(all, 1, sizeof(all));
    uint64_t max_seq;
    /* Everything in flight is interrupted; containers stop (their
     * partitions belong to other shards now or soon). */
    actor_partition_quiesce(sh, all, true, &max_seq);
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        c->lp[p].ready = false;
        c->lp[p].mine = false;
        c->lp[p].load_epoch = 0;
    }
    /* After re-joining, what we still own is reloaded from etcd (the
     * control thread's reload_owned): local state is not trusted. */
    c->first_view = true;
}

static void fence_timer_cb(sbx_loop *l, void *arg);

/*
 * Loop thread: enforce fence_at.  Before it, a timer waits for it; once it
 * passed (or is 0), the fence is applied, once per fenced spell, and the
 * lease thread told.  Runs from that timer — so the deadline holds whatever
 * the control and lease threads are blocked on — and whenever another
 * thread registered or fenced (fence_posted).
 */
static void
fence_check(struct cluster *c)
{
    struct shard *sh = c->sh;
    if (c->fence_timer)
        sbx_loop_cancel(sh->loop, c->fence_timer);
    c->fence_timer = 0;
    if (atomic_load(&c->stop))
        return;
    int64_t f = atomic_load(&c->fence_at);
    for (;;) {
        int64_t now = sbx_mono_ms();
        if (f != 0 && now < f) {
            /* A keep-alive moves f on without telling us: the timer then finds
             * it later and waits again.  +1: a timer never fires early. */
            c->fence_timer = sbx_loop_timer(sh->loop, f - now + 1, fence_timer_cb, c);
            return;
        }
        /* Passed: make it stay passed (a keep-alive answered after the
         * deadline must not revive it).  A lost race: the lease thread
         * renewed in time just now, or someone set 0; look again. */
        if (f == 0 || atomic_compare_exchange_strong(&c->fence_at, &f, 0))
            break;
    }
    if (atomic_load(&c->fence_done))
        return;
    sbx_warn("shard %s: fenced: not serving until it holds a lease again", sh->conf.name);
    fence_apply(c);
    atomic_store(&c->fence_done, true);
    lease_wake(c);
}

static void
fence_timer_cb(sbx_loop *l, void *arg)
{
    struct cluster *c = arg;
    (void)l;
    c->fence_timer = 0;
    fence_check(c);
}

static void
fence_posted(sbx_loop *l, void *arg)
{
    (void)l;
    fence_check(arg);
}

/* Any thread: fence at once (etcd says the lease is gone, or etcd may lack
 * writes we hold): the loop stops serving, the lease thread re-registers. */
static void
fence_now(struct cluster *c)
{
    atomic_store(&c->fence_at, 0);
    sbx_loop_post(c->sh->loop, fence_posted, c);
    lease_wake(c);
}

/* ------------------------------------------------------------------------------ */
/* Replication to etcd. */

void
cluster_replicate(struct shard *sh, uint64_t seq, const char *id, const void *rec, size_t len)
{
    struct cluster *c = CL(sh);
    if (!c || !seq)
        return;
    struct ritem *it = sbx_xcalloc(1, sizeof(*it));
    it->seq = seq;
    snprintf(it->id, sizeof(it->id), "%s", id);
    it->part = sbx_place_partition(id, strlen(id));
    /* Writes are made by operations admitted at the view's epoch (or by
     * their actors since): partitions are served only once the view shows
     * them ours and their records are loaded. */
    it->epoch = c->lp[it->part].epoch;
    if (len) {
        it->rec = sbx_xmalloc(len);
        memcpy(it->rec, rec, len);
        it->len = len;
    }
    if (c->nout == c->capout) {
        /* compact then grow the FIFO (outstanding is NULL before the first
         * write: memmove must not see it, even for 0 bytes — UBSan aborts) */
        if (c->outhead) {
            memmove(c->outstanding, c->outstanding + c->outhead,
                    (c->nout - c->outhead) * sizeof(uint64_t));
            c->nout -= c->outhead;
            c->outhead = 0;
        }
        if (c->nout == c->capout) {
            c->capout = c->capout ? c->capout * 2 : 256;
            c->outstanding = sbx_xrealloc(c->outstanding, c->capout * sizeof(uint64_t));
        }
    }
    c->outstanding[c->nout++] = seq;
    pthread_mutex_lock(&c->rmu);
    if (c->rq_tail)
        c->rq_tail->next = it;
    else
        c->rq_head = it;
    c->rq_tail = it;
    pthread_cond_signal(&c->rcv);
    pthread_mutex_unlock(&c->rmu);
}

bool
cluster_gate_open(struct shard *sh, uint64_t need)
{
    struct cluster *c = CL(sh);
    if (!c)
        return true;
    return c->outhead == c->nout || c->outstanding[c->outhead] > need;
}

struct rdone {
    struct cluster *c;
    size_t n;
    struct {
        uint64_t seq;
        int rc;
        char id[64];
        uint32_t part;
    } r[REPL_BATCH];
};

static void
repl_done(sbx_loop *l, void *arg)
{
    struct rdone *d = arg;
    struct cluster *c = d->c;
    struct shard *sh = c->sh;
    (void)l;
    for (size_t i = 0; i < d->n; i++) {
        if (c->outhead < c->nout && c->outstanding[c->outhead] == d->r[i].seq)
            c->outhead++;
        if (d->r[i].rc) {
            /* Not in etcd: the write must not be acknowledged, and this shard
             * no longer owns the partition as far as the cluster goes. */
            shard_fail_held(sh, d->r[i].id, d->r[i].seq, d->r[i].rc,
                            "the write could not be replicated: this shard no longer owns the "
                            "sandbox's partition");
            c->lp[d->r[i].part].ready = false;
        }
    }
    if (c->outhead == c->nout)
        c->outhead = c->nout = 0;
    shard_release_held(sh);
    free(d);
}

/* Whether the batch up to it (excluded) writes its partition at another
 * epoch: a transaction compares each partition once. */
static bool
epoch_conflict(const struct ritem *batch, const struct ritem *it)
{
    for (const struct ritem *o = batch; o != it; o = o->next)
        if (o->part == it->part && o->epoch != it->epoch)
            return true;
    return false;
}

/* Whether it is the batch's last write of its record (a transaction puts a
 * key once: earlier writes of the record in the batch go as the last one). */
static bool
repl_last(const struct ritem *it)
{
    for (const struct ritem *o = it->next; o; o = o->next)
        if (!strcmp(o->id, it->id))
            return false;
    return true;
}

/* Replication thread: the revision in etcd of every record the batch
 * writes, from c->revs or read from etcd (at a partition epoch where it is
 * not known).  0, or the error of the read. */
static int
repl_revs(struct cluster *c, const struct ritem *batch)
{
    char key[320];
    int64_t m;
    for (const struct ritem *it = batch; it; it = it->next) {
        if (!repl_last(it) || recrev_get(c->revs, it->id, it->epoch, &m) == 0)
            continue;
        struct sbx_etcd_kv *kvs;
        size_t n;
        sbx_cview_rec_key(c->prefix, it->part, it->id, key, sizeof(key));
        int rc = sbx_etcd_range(c->etcd, key, NULL, &kvs, &n, NULL);
        if (rc)
            return rc;
        recrev_set(c->revs, it->id, it->epoch, n ? kvs[0].mod_revision : 0);
        sbx_etcd_kvs_free(kvs, n);
    }
    return 0;
}

/*
 * Replication thread: after a transaction whose compares failed, read back
 * what etcd holds.  SBX_E_WRONG_OWNER if a partition of the batch is no
 * longer ours at the write's epoch; else 0 with *again false if every
 * record holds what the batch writes (an earlier copy of this transaction
 * — a re-send to another endpoint, a retry here — was applied), or *again
 * true if some record is at another revision than c->revs said (learnt
 * now: the caller sends the transaction again).  Another error: etcd's.
 */
static int
repl_read_back(struct cluster *c, const struct ritem *batch, bool *again)
{
    struct shard *sh = c->sh;
    char key[320];
    *again = false;
    for (const struct ritem *it = batch; it; it = it->next) {
        struct sbx_etcd_kv *kvs;
        size_t n;
        sbx_cview_part_key(c->prefix, it->part, key, sizeof(key));
        int rc = sbx_etcd_range(c->etcd, key, NULL, &kvs, &n, NULL);
        if (rc)
            return rc;
        bool ours = n && kvs[0].vlen == strlen(sh->conf.name) &&
                    !memcmp(kvs[0].value, sh->conf.name, kvs[0].vlen) &&
                    kvs[0].mod_revision == it->epoch;
        sbx_etcd_kvs_free(kvs, n);
        if (!ours)
            return SBX_E_WRONG_OWNER;
        if (!repl_last(it))
            continue;
        sbx_cview_rec_key(c->prefix, it->part, it->id, key, sizeof(key));
        if ((rc = sbx_etcd_range(c->etcd, key, NULL, &kvs, &n, NULL)) != 0)
            return rc;
        bool applied = it->rec ? n && kvs[0].vlen == it->len && !memcmp(kvs[0].value, it->rec,
                                                                         it->len)
                               : n == 0;
        recrev_set(c->revs, it->id, it->epoch, n ? kvs[0].mod_revision : 0);
        sbx_etcd_kvs_free(kvs, n);
        *again |= !applied;
    }
    return 0;
}

static void *
repl_main(void *arg)
{
    struct cluster *c = arg;
    struct shard *sh = c->sh;
    for (;;) {
        pthread_mutex_lock(&c->rmu);
        while (!c->rq_head && !atomic_load(&c->stop))
            pthread_cond_wait(&c->rcv, &c->rmu);
        if (!c->rq_head) {
            pthread_mutex_unlock(&c->rmu);
            break;
        }
        /* A batch: up to REPL_BATCH records and REPL_BATCH_BYTES of them (one
         * record always goes, alone if it is larger: it fits in a request),
         * each partition at one epoch. */
        struct ritem *batch = c->rq_head, *last = batch;
        size_t n = 1, bytes = batch->len;
        while (last->next && n < REPL_BATCH && bytes + last->next->len <= REPL_BATCH_BYTES &&
               !epoch_conflict(batch, last->next)) {
            last = last->next;
            bytes += last->len;
            n++;
        }
        c->rq_head = last->next;
        if (!c->rq_head)
            c->rq_tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&c->rmu);

        /* One transaction: every partition touched is still ours at the epoch
         * its writes were made at (owner and mod_revision of its key, as
         * claims and handoffs compare them: a write delayed past a move of the
         * partition away and back to this shard fails); then the puts and
         * deletes.  Retried while etcd is unreachable and the lease may still
         * be ours. */
        int rc;
        for (int attempt = 0;; attempt++) {
            rc = repl_revs(c, batch);
            if (rc == 0) {
                sbx_etcd_txn *t = sbx_etcd_txn_new();
                uint8_t seen[SBX_PARTITIONS / 8] = {0};
                char key[320];
                int64_t m = 0;
                for (struct ritem *it = batch; it; it = it->next) {
                    if (!(seen[it->part / 8] & (1u << (it->part % 8)))) {
                        seen[it->part / 8] |= (uint8_t)(1u << (it->part % 8));
                        sbx_cview_part_key(c->prefix, it->part, key, sizeof(key));
                        sbx_etcd_txn_cmp_value(t, key, sh->conf.name, strlen(sh->conf.name));
                        sbx_etcd_txn_cmp_mod(t, key, it->epoch);
                    }
                    /* etcd refuses a key twice in one transaction: a record written
                     * several times in the batch goes once, as its last write. */
                    if (!repl_last(it))
                        continue;
                    sbx_cview_rec_key(c->prefix, it->part, it->id, key, sizeof(key));
                    /* the record is still where our last write left it */
                    recrev_get(c->revs, it->id, it->epoch, &m);
                    sbx_etcd_txn_cmp_mod(t, key, m);
                    if (it->rec)
                        sbx_etcd_txn_put(t, key, it->rec, it->len, 0);
                    else
                        sbx_etcd_txn_del(t, key);
                }
                bool ok = false, again = false;
                int64_t rev = 0;
                rc = sbx_etcd_txn_run(c->etcd, t, &ok, &rev);
                if (rc == 0 && ok) {
                    for (struct ritem *it = batch; it; it = it->next)
                        if (repl_last(it))
                            recrev_set(c->revs, it->id, it->epoch, it->rec ? rev : 0);
                    break;
                }
                if (rc == 0 && (rc = repl_read_back(c, batch, &again)) == 0 && !again)
                    break; /* applied by an earlier copy of this transaction */
                if (rc == SBX_E_WRONG_OWNER)
                    break;
                if (rc == 0)
                    rc = SBX_E_STORAGE; /* revisions learnt: send it again */
            }
            /* Lost connections are retried while the lease may be ours; errors
             * etcd answers ("leader changed", "request timed out", "too many
             * requests": an election or a busy cluster) a few times more, up
             * to ~2 s.  The transaction puts absolute values under a compare
             * of owner and epoch and of each record's revision: a copy that
             * reaches etcd late (a re-send, a retry) fails instead of undoing
             * a newer write, and one applied before its answer was lost is
             * recognised by reading back (repl_read_back). */
            if (fenced(c) || atomic_load(&c->stop) ||
                (rc != SBX_E_SHARD_UNAVAILABLE && attempt >= REPL_ERROR_RETRIES))
                break;
            nap_ms(SBX_MIN(50 << SBX_MIN(attempt, 4), 500));
        }
        if (rc != 0 && rc != SBX_E_WRONG_OWNER) {
            /* Our LMDB holds writes etcd may lack (or may apply later: a
             * request etcd read before it stalled): stop serving and reload
             * what we own from etcd, the authority, as after a lost lease. */
            fence_now(c);
        }
        struct rdone *d = sbx_xcalloc(1, sizeof(*d));
        d->c = c;
        for (struct ritem *it = batch; it;) {
            struct ritem *next = it->next;
            d->r[d->n].seq = it->seq;
            d->r[d->n].rc = rc;
            d->r[d->n].part = it->part;
            snprintf(d->r[d->n].id, sizeof(d->r[0].id), "%s", it->id);
            d->n++;
            free(it->rec);
            free(it);
            it = next;
        }
        sbx_loop_post(sh->loop, repl_done, d);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------ */
/* Control thread. */

static void
view_changed(void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->mu);
    c->dirty = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int
register_member(struct cluster *c)
{
    struct shard *sh = c->sh;
    int64_t lease;
    int64_t t0 = sbx_mono_ms();
    int rc = sbx_etcd_lease_grant(c->etcd, (c->ttl_ms + 999) / 1000, &lease);
    if (rc)
        return rc;
    json_t *j = json_pack("{s:s,s:s,s:I,s:i}", "url",
                          sh->conf.advertise ? sh->conf.advertise : sh->conf.listen, "relay",
                          sh->conf.relay ? sh->conf.relay : "", "startedMs",
                          (json_int_t)sh->started_ms, "pid", (int)getpid());
    char *v = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char key[320];
    snprintf(key, sizeof(key), "%sc/members/%s", c->prefix, sh->conf.name);
    rc = sbx_etcd_put(c->etcd, key, v, strlen(v), lease, NULL);
    free(v);
    if (rc) {
        sbx_etcd_lease_revoke(c->etcd, lease);
        return rc;
    }
    c->lease = lease;
    /* A new spell of serving: its fence is still to be applied; the loop arms
     * its timer for the deadline. */
    atomic_store(&c->fence_done, false);
    atomic_store(&c->fence_at, t0 + c->ttl_ms - c->ttl_ms / 3);
    sbx_loop_post(sh->loop, fence_posted, c);
    sbx_info("shard %s: joined cluster %s (lease %lld, TTL %lld ms)", sh->conf.name,
             sh->conf.cluster, (long long)lease, (long long)c->ttl_ms);
    return 0;
}

/* Post the view to the loop. */
static void
post_view(struct cluster *c)
{
    struct vupdate *u = sbx_xcalloc(1, sizeof(*u));
    u->c = c;
    sbx_cview_lock(c->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    memcpy(u->parts, sbx_cview_parts(c->view), sizeof(u->parts));
    u->me = -1;
    for (int i = 0; i < n; i++) {
        snprintf(u->names[i], sizeof(u->names[i]), "%s", m[i].name);
        if (!strcmp(m[i].name, c->sh->conf.name))
            u->me = i;
    }
    u->nmembers = n;
    sbx_cview_unlock(c->view);
    /* A partition we switched away at a revision the view has not reached
     * (its watch lags, or our switch's answer was lost and read back) is not
     * ours: a view that still says so must not have it loaded and served. */
    for (int p = 0; p < SBX_PARTITIONS && u->me >= 0; p++)
        if (u->parts[p].owner == u->me && u->parts[p].epoch < c->handed_rev[p]) {
            u->parts[p].owner = -1;
            u->parts[p].epoch = c->handed_rev[p];
        }
    sbx_loop_post(c->sh->loop, view_apply, u);
}


/* A claim: ours once the transaction is applied.  The view (which follows
 * etcd) then shows it, and the loop asks for the partitions' records
 * (view_apply, load_wanted): they are served only once loaded.  A claim
 * whose answer is lost (a timeout, a broken connection) but that etcd
 * applied is found the same way, and so is one made by an earlier process
 * that crashed before loading. */
static void
claim_batch(struct cluster *c, struct claim *cl, size_t n)
{
    struct shard *sh = c->sh;
    sbx_etcd_txn *t = sbx_etcd_txn_new();
    char key[320];
    for (size_t i = 0; i < n; i++) {
        sbx_cview_part_key(c->prefix, cl[i].part, key, sizeof(key));
        if (cl[i].owner[0]) {
            sbx_etcd_txn_cmp_value(t, key, cl[i].owner, strlen(cl[i].owner));
            sbx_etcd_txn_cmp_mod(t, key, cl[i].epoch);
        } else if (cl[i].epoch) {
            /* the key names no member the view holds (cview.h: not a shard
             * name, or no slot left): unchanged since we saw it */
            sbx_etcd_txn_cmp_mod(t, key, cl[i].epoch);
        } else {
            sbx_etcd_txn_cmp_create(t, key, 0);
        }
        sbx_etcd_txn_put(t, key, sh->conf.name, strlen(sh->conf.name), 0);
    }
    bool ok = false;
    int rc = sbx_etcd_txn_run(c->etcd, t, &ok, NULL);
    if (rc == 0 && ok)
        sbx_info("shard %s: claimed %zu partition(s); loading their records from etcd",
                 sh->conf.name, n);
    else if (rc)
        sbx_warn("shard %s: claim of %zu partition(s): %s (the view tells whether it was "
                 "applied)",
                 sh->conf.name, n, sbx_err_message(rc));
}

/*
 * Read every record of the partitions parts[0..n) (ascending) from etcd:
 * one range from the first partition's records to the end of the last
 * one's, by pages of LOAD_PAGE records at one revision, keeping those of
 * the set.  0 with *out / *nout (the caller frees them), or the error of
 * the first request that failed (nothing returned: a partition whose
 * records could not all be read is never installed as empty).
 */
static int
load_read(struct cluster *c, const uint32_t *parts, size_t n, const uint8_t *set,
          struct sbx_etcd_kv **out, size_t *nout)
{
    char from[200], last[200], end[200];
    snprintf(from, sizeof(from), "%sr/%04u/", c->prefix, parts[0]);
    snprintf(last, sizeof(last), "%sr/%04u/", c->prefix, parts[n - 1]);
    sbx_etcd_prefix_end(last, end, sizeof(end));
    struct sbx_etcd_kv *kvs = NULL;
    size_t nk = 0;
    int64_t rev = 0;
    bool after = false, more = true;
    char *next = sbx_xstrdup(from);
    int rc = 0;
    while (more) {
        struct sbx_etcd_kv *pg;
        size_t np;
        rc = sbx_etcd_range_page(c->etcd, next, after, end, LOAD_PAGE, rev, &pg, &np, &more,
                                 rev ? NULL : &rev);
        if (rc == 0 && np == 0 && more)
            rc = SBX_E_STORAGE; /* a page whose keys all failed to decode: no progress */
        if (rc)
            break;
        if (np) {
            free(next);
            next = sbx_xstrdup(pg[np - 1].key);
            after = true;
        }
        for (size_t i = 0; i < np; i++) {
            unsigned p = (unsigned)atoi(pg[i].key + strlen(c->prefix) + 2);
            if (p < SBX_PARTITIONS && set[p]) {
                kvs = sbx_xrealloc(kvs, (nk + 1) * sizeof(*kvs));
                kvs[nk++] = pg[i];
            } else {
                free(pg[i].key);
                free(pg[i].value);
            }
        }
        free(pg);
    }
    free(next);
    if (rc) {
        sbx_etcd_kvs_free(kvs, nk);
        return rc;
    }
    *out = kvs;
    *nout = nk;
    return 0;
}

/*
 * Control thread: load what the loop asked for (want_load), LOAD_BATCH
 * partitions at a time, and post each batch to the loop.  A read that
 * fails (etcd unreachable, an error answer, a timeout) leaves its
 * partitions unavailable — not empty: their local records stay — and is
 * tried again after a back-off (LOAD_BACKOFF_MIN_MS doubling to
 * LOAD_BACKOFF_MAX_MS).
 */
static void
load_wanted(struct cluster *c)
{
    struct shard *sh = c->sh;
    while (!atomic_load(&c->stop) && !fenced(c) && sbx_mono_ms() >= c->load_next_ms) {
        struct install *in = sbx_xcalloc(1, sizeof(*in));
        in->c = c;
        uint32_t parts[LOAD_BATCH];
        size_t n = 0;
        pthread_mutex_lock(&c->mu);
        for (int p = 0; p < SBX_PARTITIONS && n < LOAD_BATCH; p++)
            if (c->want_load[p]) {
                in->epoch[p] = c->want_load[p];
                in->set[p] = 1;
                parts[n++] = (uint32_t)p;
            }
        if (!n)
            c->loads = false;
        pthread_mutex_unlock(&c->mu);
        if (!n) {
            free(in);
            return;
        }
        int rc = load_read(c, parts, n, in->set, &in->kvs, &in->n);
        if (rc) {
            c->load_backoff_ms = SBX_MIN(SBX_MAX(c->load_backoff_ms * 2, LOAD_BACKOFF_MIN_MS),
                                         LOAD_BACKOFF_MAX_MS);
            c->load_next_ms = sbx_mono_ms() + c->load_backoff_ms;
            sbx_warn("shard %s: cannot load the records of %zu partition(s) from etcd (%s); "
                     "they stay unavailable, next try in %lld ms",
                     sh->conf.name, n, sbx_err_message(rc), (long long)c->load_backoff_ms);
            free(in);
            return;
        }
        c->load_backoff_ms = 0;
        pthread_mutex_lock(&c->mu);
        for (size_t i = 0; i < n; i++)
            if (c->want_load[parts[i]] == in->epoch[parts[i]])
                c->want_load[parts[i]] = 0;
        pthread_mutex_unlock(&c->mu);
        sbx_info("shard %s: loaded %zu record(s) of %zu partition(s) from etcd", sh->conf.name,
                 in->n, n);
        sbx_loop_post(sh->loop, install_apply, in);
    }
}

/* Send records to B over nng: partition.import. */
static int
send_import(struct cluster *c, const char *url, struct hjob *j)
{
    struct shard *sh = c->sh;
    char *recs;
    size_t rl;
    if (sbx_enc_finish(&j->recs, &recs, &rl) != 0)
        return SBX_E_INTERNAL;
    sbx_enc_init(&j->recs); /* consumed */
    sbx_enc e;
    char id[37];
    sbx_request_id(id);
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstr(&e, "id", id);
    sbx_enc_kstr(&e, "op", "partition.import");
    sbx_enc_kint(&e, "timeoutMs", IMPORT_TIMEOUT_MS);
    sbx_enc_kmap(&e, "args");
    sbx_enc_kstr(&e, "from", sh->conf.name);
    sbx_enc_karray(&e, "partitions");
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (j->set[p])
            sbx_enc_int(&e, p);
    sbx_enc_end(&e);
    sbx_enc_str(&e, "records");
    sbx_enc_raw(&e, recs, rl);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    free(recs);
    char *buf;
    size_t len;
    if (sbx_enc_finish(&e, &buf, &len) != 0)
        return SBX_E_INTERNAL;
    nng_socket s;
    int rv = sbx_nng_req_dial(&s, url);
    if (rv) {
        free(buf);
        return SBX_E_SHARD_UNAVAILABLE;
    }
    nng_aio *aio;
    nng_msg *m;
    int rc = SBX_E_SHARD_UNAVAILABLE;
    if (nng_aio_alloc(&aio, NULL, NULL) == 0) {
        if (nng_msg_alloc(&m, len) == 0) {
            memcpy(nng_msg_body(m), buf, len);
            nng_aio_set_timeout(aio, IMPORT_TIMEOUT_MS);
            nng_aio_set_msg(aio, m);
            nng_send_aio(s, aio);
            nng_aio_wait(aio);
            if (nng_aio_result(aio) != 0) {
                nng_msg_free(m);
            } else {
                nng_recv_aio(s, aio);
                nng_aio_wait(aio);
                if (nng_aio_result(aio) == 0) {
                    nng_msg *r = nng_aio_get_msg(aio);
                    sbx_msg dm;
                    bool ok = false;
                    if (sbx_wire_decode(&dm, nng_msg_body(r), nng_msg_len(r),
                                        &sbx_wire_limits_reply) == 0) {
                        sbx_wire_get_bool(dm.root, "ok", &ok);
                        sbx_wire_msg_free(&dm);
                    }
                    nng_msg_free(r);
                    rc = ok ? 0 : SBX_E_WRONG_OWNER;
                }
            }
        }
        nng_aio_free(aio);
    }
    nng_close(s);
    free(buf);
    return rc;
}

/*
 * After a switch transaction whose outcome is not known (no answer, an
 * error answer, or a failed compare — after a re-send to another endpoint
 * the first copy may have been applied): read the partitions' keys back
 * until etcd answers.  Until then they stay moving (fenced: nothing of
 * them is served).  Marks j->kept for those etcd still shows ours at their
 * epoch; the others are switched away (to tname, or by now elsewhere) and
 * noted in handed_rev.  0, or the error of the last read when the shard
 * stops or fences meanwhile (its fence stops serving them anyway).
 */
static int
switch_read_back(struct cluster *c, struct hjob *j, const uint32_t *parts, size_t n,
                 const int64_t *epochs)
{
    struct shard *sh = c->sh;
    char from[320], last[320], end[320];
    sbx_cview_part_key(c->prefix, parts[0], from, sizeof(from));
    sbx_cview_part_key(c->prefix, parts[n - 1], last, sizeof(last));
    snprintf(end, sizeof(end), "%s", last);
    end[strlen(end) - 1]++; /* just past the last key (4 digits: no carry needed) */
    for (int attempt = 0;; attempt++) {
        struct sbx_etcd_kv *kvs = NULL;
        size_t nk = 0;
        int rc = sbx_etcd_range(c->etcd, from, end, &kvs, &nk, NULL);
        if (rc == 0) {
            for (size_t k = 0; k < n; k++) {
                char key[320];
                sbx_cview_part_key(c->prefix, parts[k], key, sizeof(key));
                const struct sbx_etcd_kv *kv = NULL;
                for (size_t i = 0; i < nk && !kv; i++)
                    if (!strcmp(kvs[i].key, key))
                        kv = &kvs[i];
                if (kv && kv->vlen == strlen(sh->conf.name) &&
                    !memcmp(kv->value, sh->conf.name, kv->vlen) && kv->mod_revision == epochs[k])
                    j->kept[parts[k]] = 1;
                else
                    c->handed_rev[parts[k]] = kv ? kv->mod_revision : 0;
            }
            sbx_etcd_kvs_free(kvs, nk);
            return 0;
        }
        if (atomic_load(&c->stop) || fenced(c))
            return rc;
        if (attempt == 0)
            sbx_warn("shard %s: the switch of %zu partition(s) has an unknown outcome and "
                     "cannot be read back (%s); they serve nothing until it can",
                     sh->conf.name, n, sbx_err_message(rc));
        nap_ms(SBX_MIN(50 << SBX_MIN(attempt, 4), 500));
    }
}

static void
handoff(struct cluster *c, int target, const char *tname, const char *turl, const uint32_t *parts,
        size_t n, const int64_t *epochs)
{
    struct shard *sh = c->sh;
    struct hjob *j = sbx_xcalloc(1, sizeof(*j));
    (void)target;
    for (size_t i = 0; i < n; i++)
        j->set[parts[i]] = 1;
    j->started_ms = sbx_mono_ms();
    j->c = c;
    int64_t t0 = sbx_mono_ms();
    sbx_loop_post(sh->loop, job_begin, j);
    pthread_mutex_lock(&c->mu);
    while (!j->done && !atomic_load(&c->stop))
        pthread_cond_wait(&c->cv, &c->mu);
    pthread_mutex_unlock(&c->mu);
    bool ok = false;
    if (j->done && !fenced(c)) {
        int rc = send_import(c, turl, j);
        if (rc == 0) {
            /* The switch: owner and epoch must be what we saw.  A transaction
             * whose outcome is not known is read back; the partitions it did
             * not move (j->kept) are served again, the others dropped. */
            ok = true;
            char key[320];
            for (size_t i = 0; i < n && ok; i += TXN_PARTS) {
                size_t m = SBX_MIN((size_t)TXN_PARTS, n - i);
                sbx_etcd_txn *t = sbx_etcd_txn_new();
                for (size_t k = i; k < i + m; k++) {
                    sbx_cview_part_key(c->prefix, parts[k], key, sizeof(key));
                    sbx_etcd_txn_cmp_value(t, key, sh->conf.name, strlen(sh->conf.name));
                    sbx_etcd_txn_cmp_mod(t, key, epochs[k]);
                    sbx_etcd_txn_put(t, key, tname, strlen(tname), 0);
                }
                bool okk = false;
                int64_t rev = 0;
                int trc = sbx_etcd_txn_run(c->etcd, t, &okk, &rev);
                if (trc == 0 && okk) {
                    for (size_t k = i; k < i + m; k++)
                        c->handed_rev[parts[k]] = rev;
                } else if (switch_read_back(c, j, parts + i, m, epochs + i) != 0) {
                    ok = false; /* fenced or stopping: the fence stops serving them */
                } else {
                    /* Known now; the batches not sent yet stay ours. */
                    for (size_t k = i + m; k < n; k++)
                        j->kept[parts[k]] = 1;
                    break;
                }
            }
        } else {
            sbx_warn("shard %s: handoff of %zu partition(s) to %s failed: %s", sh->conf.name, n,
                     tname, sbx_err_message(rc));
        }
    }
    if (ok)
        sbx_info("shard %s: handed %zu partition(s) (%zu record(s)) to %s in %lld ms",
                 sh->conf.name, n, j->nrecs, tname, (long long)(sbx_mono_ms() - t0));
    struct jend *je = sbx_xcalloc(1, sizeof(*je));
    je->c = c;
    je->j = j;
    je->ok = ok;
    sbx_loop_post(sh->loop, job_end, je);
}

/* Compare the view with what rendezvous hashing proposes; act on it. */
static void
reconcile(struct cluster *c)
{
    struct shard *sh = c->sh;
    if (fenced(c))
        return;
    sbx_cview_lock(c->view);
    if (!sbx_cview_synced(c->view)) {
        sbx_cview_unlock(c->view);
        return;
    }
    int n;
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    const struct sbx_cpart *parts = sbx_cview_parts(c->view);
    const char *names[SBX_CVIEW_MAX_MEMBERS];
    int idx[SBX_CVIEW_MAX_MEMBERS], nl = 0, me = -1;
    for (int i = 0; i < n; i++) {
        if (!strcmp(m[i].name, sh->conf.name))
            me = i;
        if (m[i].live && !m[i].draining) {
            names[nl] = m[i].name;
            idx[nl++] = i;
        }
    }
    if (me < 0 || !m[me].live || nl == 0) {
        sbx_cview_unlock(c->view);
        return;
    }
    int16_t table[SBX_PARTITIONS];
    sbx_place_table(names, (size_t)nl, table);
    if (atomic_exchange(&c->reload_owned, false)) {
        /* Re-joined after a fence: the loop dropped what it served; the
         * view has it ask for what etcd still says we own, loaded from etcd
         * (our local state may hold writes that never replicated). */
        sbx_cview_unlock(c->view);
        post_view(c);
        return;
    }
    struct claim *claims = c->claims;
    size_t nclaims = 0;
    /* one handoff target per round: the one with the most partitions due */
    int due[SBX_CVIEW_MAX_MEMBERS] = {0};
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        if (c->busy[p])
            continue;
        int want = idx[table[p]];
        int own = parts[p].owner;
        /* Handed off by us at a revision the view has not reached yet: a
         * second handoff would send the target our (now empty) copy, which
         * replaces the records it just imported. */
        if (own == me && parts[p].epoch < c->handed_rev[p])
            continue;
        if (own == me && want != me) {
            due[want]++;
        } else if (want == me && own != me) {
            if (own < 0 || !m[own].live) {
                claims[nclaims].part = (uint32_t)p;
                snprintf(claims[nclaims].owner, sizeof(claims[0].owner), "%s",
                         own < 0 ? "" : m[own].name);
                claims[nclaims].epoch = parts[p].epoch;
                nclaims++;
            }
        }
    }
    int target = -1;
    for (int i = 0; i < n; i++)
        if (due[i] && (target < 0 || due[i] > due[target]))
            target = i;
    uint32_t hparts[HANDOFF_BATCH];
    int64_t hepochs[HANDOFF_BATCH];
    size_t nh = 0;
    char tname[64] = "", turl[256] = "";
    if (target >= 0) {
        snprintf(tname, sizeof(tname), "%s", m[target].name);
        snprintf(turl, sizeof(turl), "%s", m[target].url);
        for (int p = 0; p < SBX_PARTITIONS && nh < HANDOFF_BATCH; p++) {
            if (!c->busy[p] && parts[p].owner == me && idx[table[p]] == target &&
                parts[p].epoch >= c->handed_rev[p]) {
                hparts[nh] = (uint32_t)p;
                hepochs[nh++] = parts[p].epoch;
            }
        }
    }
    sbx_cview_unlock(c->view);

    if (nclaims)
        sbx_info("shard %s: claiming %zu partition(s) without a live owner", sh->conf.name,
                 nclaims);
    for (size_t i = 0; i < nclaims; i += TXN_PARTS / 2)
        claim_batch(c, claims + i, SBX_MIN((size_t)TXN_PARTS / 2, nclaims - i));
    if (nh) {
        for (size_t i = 0; i < nh; i++)
            c->busy[hparts[i]] = 1;
        handoff(c, target, tname, turl, hparts, nh, hepochs);
        for (size_t i = 0; i < nh; i++)
            c->busy[hparts[i]] = 0;
    }
}

/* Lease thread: wait up to ms, or until lease_wake. */
static void
lease_nap(struct cluster *c, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ms = SBX_MAX(ms, 1);
    ts.tv_nsec += (ms % 1000) * 1000000L;
    ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&c->mu);
    while (!c->lwake && !atomic_load(&c->stop))
        if (pthread_cond_timedwait(&c->lcv, &c->mu, &ts) != 0)
            break;
    c->lwake = false;
    pthread_mutex_unlock(&c->mu);
}

static void *
lease_main(void *arg)
{
    struct cluster *c = arg;
    struct shard *sh = c->sh;
    int64_t next = 0; /* the next keep-alive (monotonic ms) */
    while (!atomic_load(&c->stop)) {
        if (fenced(c)) {
            if (c->lease) {
                /* The deadline passed, or another thread fenced: make the
                 * fence hold, have the loop apply it now if its timer has not
                 * yet, and give the lease up. */
                fence_now(c);
                sbx_etcd_lease_revoke(c->etcd, c->lease);
                c->lease = 0;
                atomic_store(&c->reload_owned, true);
            }
            /* Register again only once the loop stopped serving: until then it
             * may hold partitions as ready whose records, after a fence, must
             * come from etcd. */
            if (!atomic_load(&c->fence_done)) {
                lease_nap(c, 20);
                continue;
            }
            if (register_member(c) != 0) {
                lease_nap(c, 500);
                continue;
            }
            next = sbx_mono_ms() + c->ttl_ms / 3;
            continue;
        }
        int64_t now = sbx_mono_ms();
        if (now < next) {
            lease_nap(c, next - now);
            continue;
        }
        int64_t left = 0;
        int rc = sbx_etcd_lease_keepalive(c->etcd, c->lease, &left);
        if (rc == 0 && left > 0) {
            /* Only a deadline still in force moves: one that passed while the
             * keep-alive was under way is a fence already (the loop's timer
             * applies it; this thread sees it at the top), and 0 is one. */
            int64_t f = atomic_load(&c->fence_at);
            if (f != 0 && sbx_mono_ms() < f)
                atomic_compare_exchange_strong(&c->fence_at, &f,
                                               now + left * 1000 - c->ttl_ms / 3);
            next = now + c->ttl_ms / 3;
        } else if (rc == 0) {
            /* The lease is gone: another shard may own our partitions. */
            sbx_warn("shard %s: lost its lease; fencing and re-joining", sh->conf.name);
            fence_now(c);
        } else {
            next = now + 200; /* etcd unreachable: try again soon */
        }
    }
    return NULL;
}

/* Control thread: follow the view, reconcile. */
static void *
ctl_main(void *arg)
{
    struct cluster *c = arg;
    while (!atomic_load(&c->stop)) {
        bool dirty;
        pthread_mutex_lock(&c->mu);
        dirty = c->dirty;
        c->dirty = false;
        pthread_mutex_unlock(&c->mu);
        if (dirty)
            post_view(c);
        reconcile(c);
        load_wanted(c);
        pthread_mutex_lock(&c->mu);
        int64_t wait_ms = 1000; /* less when a load is due sooner */
        if (c->loads && !fenced(c))
            wait_ms = SBX_MIN(SBX_MAX(c->load_next_ms - sbx_mono_ms(), 0), wait_ms);
        if (!c->dirty && !atomic_load(&c->stop) && wait_ms > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (wait_ms % 1000) * 1000000L;
            ts.tv_sec += wait_ms / 1000 + ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------ */

/* Wake every thread of the cluster (to see stop). */
static void
wake_threads(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    c->lwake = true;
    pthread_cond_broadcast(&c->cv);
    pthread_cond_broadcast(&c->lcv);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->rmu);
    pthread_cond_broadcast(&c->rcv);
    pthread_mutex_unlock(&c->rmu);
}

int
cluster_start(struct shard *sh)
{
    if (!sh->conf.etcd || !*sh->conf.etcd)
        return 0;
    if (!sbx_cview_name_ok(sh->conf.name, strlen(sh->conf.name))) {
        /* the view of every node would ignore its member key (cview.h) */
        sbx_error("shard '%s': a cluster shard's name is 1-63 of [A-Za-z0-9._-], starting "
                  "with a letter or digit",
                  sh->conf.name);
        return SBX_E_VALIDATION;
    }
    struct cluster *c = sbx_xcalloc(1, sizeof(*c));
    c->sh = sh;
    c->ttl_ms = sh->conf.lease_ttl > 0 ? sh->conf.lease_ttl : 10000;
    c->claims = sbx_xcalloc(SBX_PARTITIONS, sizeof(struct claim));
    c->revs = recrev_new();
    c->me = -1;
    for (int p = 0; p < SBX_PARTITIONS; p++)
        c->lp[p].owner = -1;
    snprintf(c->prefix, sizeof(c->prefix), "/sbx/%s/",
             sh->conf.cluster && *sh->conf.cluster ? sh->conf.cluster : "default");
    atomic_store(&c->fence_done, true); /* nothing to fence before the first lease */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->lcv, NULL);
    pthread_mutex_init(&c->rmu, NULL);
    pthread_cond_init(&c->rcv, NULL);
    int rc = sbx_etcd_open(&c->etcd, sh->conf.etcd, 3000);
    if (rc) {
        sbx_error("shard %s: bad --etcd '%s'", sh->conf.name, sh->conf.etcd);
        free(c->claims);
        recrev_free(c->revs);
        free(c);
        return rc;
    }
    sh->cluster = c;
    if ((rc = sbx_cview_start(&c->view, c->etcd, c->prefix, view_changed, c)) != 0) {
        sbx_error("shard %s: cannot start the cluster view", sh->conf.name);
        return rc;
    }
    pthread_t *th[] = {&c->repl, &c->lth, &c->ctl};
    void *(*fn[])(void *) = {repl_main, lease_main, ctl_main};
    size_t started = 0;
    while (started < 3 && pthread_create(th[started], NULL, fn[started], c) == 0)
        started++;
    if (started < 3) {
        /* cluster_stop (the caller's stop path) revokes a lease taken meanwhile */
        atomic_store(&c->stop, true);
        wake_threads(c);
        for (size_t i = 0; i < started; i++)
            pthread_join(*th[i], NULL);
        return -EAGAIN;
    }
    c->threads = true;
    return 0;
}

void
cluster_stop(struct shard *sh)
{
    struct cluster *c = CL(sh);
    if (!c || c->stopped)
        return;
    c->stopped = true;
    atomic_store(&c->stop, true);
    wake_threads(c);
    if (c->threads) {
        pthread_join(c->ctl, NULL);
        pthread_join(c->lth, NULL);
        pthread_join(c->repl, NULL);
    }
    /* What the threads posted finds stop set; the deadline's timer goes. */
    sbx_loop_cancel(sh->loop, c->fence_timer);
    c->fence_timer = 0;
    /* Leave at once: revoking the lease deletes our member key, so the
     * others claim our partitions now instead of after the TTL. */
    if (c->lease)
        sbx_etcd_lease_revoke(c->etcd, c->lease);
    c->lease = 0;
    atomic_store(&c->fence_at, 0);
    sbx_cview_stop(c->view);
    c->view = NULL;
}

void
cluster_free(struct shard *sh)
{
    struct cluster *c = CL(sh);
    if (!c)
        return;
    cluster_stop(sh);
    sbx_etcd_close(c->etcd);
    while (c->rq_head) {
        struct ritem *it = c->rq_head;
        c->rq_head = it->next;
        free(it->rec);
        free(it);
    }
    free(c->outstanding);
    free(c->claims);
    recrev_free(c->revs);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->lcv);
    pthread_mutex_destroy(&c->rmu);
    pthread_cond_destroy(&c->rcv);
    free(c);
    sh->cluster = NULL;
}

/* ------------------------------------------------------------------------------ */
/* partition.import {from, partitions: [p…], records: [[id, record]…]} */

void
cluster_op_import(struct sop *op)
{
    struct shard *sh = op->sh;
    struct cluster *c = CL(sh);
    if (!c) {
        shard_reply_err(op, SBX_E_UNKNOWN_OP, "this shard is not in a cluster");
        return;
    }
    const msgpack_object *parts, *recs;
    sbx_str from;
    if (sbx_wire_get_str(op->req.args, "from", &from) != 0 ||
        sbx_wire_get_array(op->req.args, "partitions", &parts) != 0 ||
        sbx_wire_get_array(op->req.args, "records", &recs) != 0) {
        shard_reply_err(op, SBX_E_VALIDATION, "partition.import needs from, partitions, records");
        return;
    }
    char fname[64];
    sbx_str_copy(from, fname, sizeof(fname));
    int16_t fidx = -1;
    for (int i = 0; i < SBX_CVIEW_MAX_MEMBERS; i++)
        if (!strcmp(c->member_names[i], fname))
            fidx = (int16_t)i;
    uint8_t set[SBX_PARTITIONS];
    memset(set, 0, sizeof(set));
    for (uint32_t i = 0; i < parts->via.array.size; i++) {
        const msgpack_object *o = &parts->via.array.ptr[i];
        if (o->type != MSGPACK_OBJECT_POSITIVE_INTEGER || o->via.u64 >= SBX_PARTITIONS) {
            shard_reply_err(op, SBX_E_VALIDATION, "bad partition number");
            return;
        }
        set[o->via.u64] = 1;
    }
    /* Refused (the sender keeps serving them and tries again at its next
     * reconcile) while the import could not be kept:
     *  - before this shard's loop applied a view naming it (a shard that just
     *    joined): that first view purges what it holds of partitions others
     *    own, and with no member names yet the sender is unknown (fidx -1),
     *    so the import would be purged as stale and the partition, once
     *    switched to us, never become ready;
     *  - a partition this shard already owns: the sender's view is behind
     *    (it handed it to us already and proposes it again); replacing our
     *    records with its (empty) copy would drop what we hold. */
    bool refuse = !c->first_view || fidx < 0;
    for (int p = 0; p < SBX_PARTITIONS && !refuse; p++)
        refuse = set[p] && (c->lp[p].mine || c->lp[p].moving);
    if (refuse) {
        shard_reply_err(op, SBX_E_WRONG_OWNER,
                        "partition.import from %s refused: this shard's view of the cluster is "
                        "not current yet",
                        fname);
        return;
    }
    /* What we may hold of these partitions from earlier is replaced. */
    purge_partitions(sh, set);
    uint64_t last = 0;
    size_t n = 0;
    for (uint32_t i = 0; i < recs->via.array.size; i++) {
        const msgpack_object *r = &recs->via.array.ptr[i];
        sbx_str id, val;
        if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 2 ||
            sbx_wire_obj_str(&r->via.array.ptr[0], &id) != 0 || id.n == 0 || id.n > 63 ||
            (r->via.array.ptr[1].type != MSGPACK_OBJECT_BIN &&
             r->via.array.ptr[1].type != MSGPACK_OBJECT_STR))
            continue;
        sbx_wire_obj_str(&r->via.array.ptr[1], &val);
        if (!set[sbx_place_partition(id.p, id.n)])
            continue;
        last = sbx_store_put(sh->store, SBX_DB_SANDBOXES, id.p, id.n, val.p, val.n);
        n++;
    }
    int64_t now = sbx_wall_ms();
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (set[p]) {
            c->lp[p].imported_ms = now;
            c->lp[p].imported_from = fidx;
        }
    sbx_info("shard %s: imported %zu record(s) of %u partition(s) from %s", sh->conf.name, n,
             parts->via.array.size, fname);
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, op->req.id);
    sbx_enc_kint(&e, "records", (int64_t)n);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) == 0)
        shard_reply(op, buf, len, last);
}

void
cluster_encode_status(struct shard *sh, sbx_enc *e)
{
    struct cluster *c = CL(sh);
    sbx_enc_map(e);
    if (!c) {
        sbx_enc_kbool(e, "enabled", false);
        sbx_enc_end(e);
        return;
    }
    int owned = 0, ready = 0, moving = 0;
    int64_t maxep = 0, minep = 0;
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        if (!c->lp[p].mine)
            continue;
        owned++;
        ready += c->lp[p].ready;
        moving += c->lp[p].moving;
        if (c->lp[p].epoch > maxep)
            maxep = c->lp[p].epoch;
        if (!minep || c->lp[p].epoch < minep)
            minep = c->lp[p].epoch;
    }
    int64_t f = atomic_load(&c->fence_at);
    sbx_enc_kbool(e, "enabled", true);
    sbx_enc_kstr(e, "cluster", sh->conf.cluster ? sh->conf.cluster : "default");
    sbx_enc_kbool(e, "fenced", fenced(c));
    sbx_enc_kint(e, "leaseMsLeft", f ? f - sbx_mono_ms() : 0);
    sbx_enc_kint(e, "partitionsOwned", owned);
    sbx_enc_kint(e, "partitionsReady", ready);
    sbx_enc_kint(e, "partitionsMoving", moving);
    sbx_enc_kint(e, "minEpoch", minep);
    sbx_enc_kint(e, "maxEpoch", maxep);
    sbx_enc_kint(e, "replicationPending", (int64_t)(c->nout - c->outhead));
    sbx_enc_end(e);
}
