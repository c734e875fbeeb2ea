/* store.c — LMDB environment with a group-committing writer thread; see store.h. */
#include "store.h"

#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "err.h"
#include "log.h"
#include "store_log.h"
#include "util.h"

struct wop {
    struct wop *next;
    uint64_t seq;
    uint64_t after; /* the write it was made on top of (sbx_store_put_after), or 0 */
    bool with;      /* committed in one transaction with `after` (sbx_store_put_with) */
    bool lazy;      /* sbx_store_put_lazy_after */
    bool logged;    /* sbx_store_put_logged */
    int rc;         /* commit_batch: its failure, if decided before its batch ran */
    int db;
    bool del;
    size_t kn, vn;
    char data[]; /* key then value */
};

struct sbx_store {
    MDB_env *env;
    char *dir; /* the data directory (a full file system: full_fs) */
    MDB_dbi dbi[SBX_DB__N];
    /* Read transactions hold it shared; the writer takes it exclusively to
     * grow the map (mdb_env_set_mapsize remaps: no transaction may be open). */
    pthread_rwlock_t maplock;
    uint64_t mapsize, map_max; /* mapsize: written by the writer under maplock */
    pthread_t writer;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* writer waits for work */
    pthread_cond_t donecv;  /* sbx_store_wait waits for decisions */
    struct wop *head, *tail;
    uint64_t next_seq;
    /* Lazy writes (sbx_store_put_lazy_after) wake no one: the queue is
     * committed once it holds a write ≤ urgent (any other write, or one
     * someone waits for), or at lazy_due (CLOCK_MONOTONIC ms; 0: no lazy
     * write queued since the queue was last empty). */
    uint64_t urgent;
    int64_t lazy_due;
    /* sbx_store_hold: writes with seq >= hold_from wait in the queue until
     * sbx_store_release (0: no hold). */
    uint64_t hold_from;
    pthread_t holder; /* the thread that took the hold (its waits end it) */
    uint64_t decided;       /* all writes ≤ decided have a result */
    /* Every failed range (adjacent ones with the same rc merged), so
     * sbx_store_wait reports a failure however long ago it was decided. */
    struct { uint64_t first, last; int rc; } *fails;
    size_t nfails, capfails;
    bool stopping;
    sbx_store_commit_fn cb;
    void *cbarg;
    uint64_t n_batches, n_writes, n_failed, n_logged;
    /* The redo log (store_log.h): a batch of logged and lazy writes is
     * committed by one group of it (one flush) instead of an LMDB
     * transaction (two), and applied to LMDB later.  `log` (NULL: none),
     * `pass`, `rotate` and the pending list are the writer's; the rest is
     * under mu. */
    sbx_slog *log;
    uint64_t pass;               /* the log's current pass (store_log.h), as in META */
    bool rotate;                 /* a flush of the log failed: the next transaction replaces the pass */
    struct wop *pend, *pend_tail; /* committed through the log, not yet in LMDB, in order */
    size_t pend_db[SBX_DB__N];   /* … how many of them per database (readers wait) */
    int64_t pend_due;            /* CLOCK_MONOTONIC ms by which to apply them; 0: none */
    int64_t apply_ms;            /* sbx_store_set_log_delay */
    bool apply_req;              /* a reader (or a half-full log) wants them applied now */
    uint64_t apply_fails;        /* failed applies so far; apply_rc: the last one's code */
    int apply_rc;
    /* under mu: time of each batch's commit (s) and its writes (metrics) */
    struct sbx_hist h_commit, h_batch;
};

static const char *const dbnames[SBX_DB__N] = {"sandboxes", "meta", "idem", "audit"};

static int
mdb_to_rc(int rc)
{
    if (rc == 0)
        return 0;
    if (rc == ENOSPC || rc == EDQUOT || rc == MDB_MAP_FULL)
        return SBX_E_STORAGE_FULL;
    if (rc > 0 && rc < 4096)
        return -rc;
    return SBX_E_STORAGE;
}

static void
decide(sbx_store *s, uint64_t first, uint64_t last, int rc)
{
    pthread_mutex_lock(&s->mu);
    s->decided = last;
    if (rc != 0) {
        if (s->nfails && s->fails[s->nfails - 1].last + 1 == first &&
            s->fails[s->nfails - 1].rc == rc) {
            s->fails[s->nfails - 1].last = last;
        } else {
            if (s->nfails == s->capfails) {
                s->capfails = s->capfails ? s->capfails * 2 : 16;
                s->fails = sbx_xrealloc(s->fails, s->capfails * sizeof(*s->fails));
            }
            s->fails[s->nfails].first = first;
            s->fails[s->nfails].last = last;
            s->fails[s->nfails].rc = rc;
            s->nfails++;
        }
        s->n_failed++;
    } else {
        s->n_batches++;
        s->n_writes += last - first + 1;
    }
    pthread_cond_broadcast(&s->donecv);
    pthread_mutex_unlock(&s->mu);
    if (s->cb)
        s->cb(s->cbarg, first, last, rc);
}

/* Whether the file system of the data directory is (nearly) full: LMDB
 * answers a short write of its pages — what a full tmpfs gives — with EIO,
 * not ENOSPC (mdb.c mdb_page_flush, "short write, filesystem full?"). */
static bool
full_fs(const sbx_store *s, size_t bytes)
{
    struct statvfs v;
    if (statvfs(s->dir, &v) != 0)
        return false;
    return (uint64_t)v.f_bavail * v.f_frsize < 2 * (uint64_t)bytes + (1u << 20);
}

/* One write into txn: an MDB_* code (a delete of a missing key is 0). */
static int
put_one(sbx_store *s, MDB_txn *txn, int db, bool del, const void *k, size_t kn, const void *v,
        size_t vn)
{
    MDB_val key = {kn, (void *)k};
    if (del) {
        int rc = mdb_del(txn, s->dbi[db], &key, NULL);
        return rc == MDB_NOTFOUND ? 0 : rc;
    }
    MDB_val val = {vn, (void *)v};
    return mdb_put(txn, s->dbi[db], &key, &val, 0);
}

/* The META entry holding the redo log's current pass (store_log.h): 8
 * bytes, little-endian. */
#define PASS_KEY "store.log_pass"

/* A new pass: random (getrandom(2)); never 0 (no pass recorded) nor old. */
static uint64_t
new_pass(uint64_t old)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof(v), 0) != (ssize_t)sizeof(v)) /* not before boot's entropy */
        v = XXH3_64bits_withSeed(&old, sizeof(old), (uint64_t)sbx_mono_us() ^ (uint64_t)getpid());
    if (!v || v == old)
        v = old + 1;
    return v ? v : 1;
}

static int
put_pass(sbx_store *s, MDB_txn *txn, uint64_t pass)
{
    char v[8];
    for (int i = 0; i < 8; i++)
        v[i] = (char)(pass >> (8 * i));
    return put_one(s, txn, SBX_DB_META, false, PASS_KEY, sizeof(PASS_KEY) - 1, v, 8);
}

/* Free the writes of the list *head (to its end); *head becomes NULL. */
static void
free_list(struct wop **head)
{
    while (*head) {
        struct wop *o = *head;
        *head = o->next;
        free(o);
    }
}

/* The writes of the log now in LMDB: forget them, and start the log again. */
static void
pend_applied(sbx_store *s)
{
    free_list(&s->pend);
    s->pend_tail = NULL;
    sbx_slog_reset(s->log);
    pthread_mutex_lock(&s->mu);
    memset(s->pend_db, 0, sizeof(s->pend_db));
    s->pend_due = 0;
    s->apply_req = false;
    pthread_cond_broadcast(&s->donecv); /* readers waiting for them (settle) */
    pthread_mutex_unlock(&s->mu);
}

/* Write the first n ops of the list in one transaction, leaving out those
 * already failed (o->rc), after the writes committed through the redo log
 * and not yet applied (they come first: a write reaches LMDB only after
 * every earlier one): 0 or a negative code (mdb_to_rc); *map_full says
 * whether LMDB's answer was MDB_MAP_FULL (then the map may grow and the
 * batch be retried). */
static int
apply_batch(sbx_store *s, struct wop *ops, size_t n, bool *map_full)
{
    MDB_txn *txn;
    size_t bytes = 0;
    struct wop *pend = s->pend;
    /* With the log's writes, the log's pass changes in the same
     * transaction: its groups never check out again (store_log.h). */
    bool turn = pend || s->rotate;
    uint64_t pass = turn ? new_pass(s->pass) : s->pass;
    int rc = mdb_txn_begin(s->env, NULL, 0, &txn);
    if (rc)
        goto out;
    for (struct wop *o = pend; o && !rc; o = o->next) {
        bytes += o->kn + o->vn;
        rc = put_one(s, txn, o->db, o->del, o->data, o->kn, o->data + o->kn, o->vn);
    }
    if (turn && !rc)
        rc = put_pass(s, txn, pass);
    for (struct wop *o = ops; o && n > 0 && !rc; o = o->next, n--) {
        if (o->rc)
            continue;
        bytes += o->kn + o->vn;
        rc = put_one(s, txn, o->db, o->del, o->data, o->kn, o->data + o->kn, o->vn);
    }
    if (rc) {
        mdb_txn_abort(txn);
        goto out;
    }
    rc = mdb_txn_commit(txn); /* frees txn whatever it returns */
    if (rc == 0 && turn) {
        s->pass = pass;
        s->rotate = false;
        if (pend)
            pend_applied(s);
    }
out:
    *map_full = rc == MDB_MAP_FULL;
    if (rc == EIO && full_fs(s, bytes))
        rc = ENOSPC;
    return mdb_to_rc(rc);
}

/* Double the map (up to map_max): 0, or SBX_E_STORAGE_FULL if it is at its
 * maximum or cannot be remapped.  Only the writer calls it, between
 * transactions. */
static int
grow_map(sbx_store *s)
{
    uint64_t cur = s->mapsize;
    uint64_t want = cur > s->map_max / 2 ? s->map_max : cur * 2;
    if (want <= cur)
        return SBX_E_STORAGE_FULL;
    pthread_rwlock_wrlock(&s->maplock);
    int rc = mdb_env_set_mapsize(s->env, want);
    if (rc == 0)
        s->mapsize = want;
    pthread_rwlock_unlock(&s->maplock);
    if (rc) {
        sbx_log_error("store: growing the map to %llu bytes failed: %s", (unsigned long long)want,
                  mdb_strerror(rc));
        return SBX_E_STORAGE_FULL;
    }
    sbx_log_info("store: map grown from %llu to %llu bytes (at most %llu)", (unsigned long long)cur,
             (unsigned long long)want, (unsigned long long)s->map_max);
    return 0;
}

/* apply_batch, growing the map while it is what is full: 0 or a negative
 * code. */
static int
apply_growing(sbx_store *s, struct wop *ops, size_t n)
{
    bool map_full;
    int rc;
    while ((rc = apply_batch(s, ops, n, &map_full)) != 0 && map_full && grow_map(s) == 0)
        ;
    return rc;
}

/* The log's pending writes alone, in a transaction of their own: 0, or the
 * failure — told to the readers waiting for them (settle), and tried again
 * later (not sooner than 100 ms: a full store is not retried in a loop). */
static int
apply_pending(sbx_store *s)
{
    int rc = apply_growing(s, NULL, 0);
    if (rc) {
        pthread_mutex_lock(&s->mu);
        s->apply_fails++;
        s->apply_rc = rc;
        s->apply_req = false;
        s->pend_due = sbx_mono_ms() + SBX_MAX(s->apply_ms, 100);
        pthread_cond_broadcast(&s->donecv);
        pthread_mutex_unlock(&s->mu);
    }
    return rc;
}

/* The code write seq failed with, or 0 (committed, or not decided). */
static int
failed_rc(sbx_store *s, uint64_t seq)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    /* Ranges are in order (decisions are): the last one at or before seq. */
    size_t lo = 0, hi = s->nfails;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->fails[mid].first <= seq)
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo > 0 && seq <= s->fails[lo - 1].last)
        rc = s->fails[lo - 1].rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

/* The failure of the write o was made on top of, if that one failed:
 * decided already, or earlier in this batch (ops..o). */
static int
after_failed(sbx_store *s, const struct wop *ops, const struct wop *o)
{
    if (!o->after)
        return 0;
    if (o->after >= ops->seq) {
        for (const struct wop *p = ops; p != o; p = p->next)
            if (p->seq == o->after)
                return p->rc;
        return 0;
    }
    return failed_rc(s, o->after);
}

/* Before writes are answered as failed while s->rotate is set (an append's
 * flush failed, store_log.h): the failed group may be whole on disk under the
 * current pass, and would be replayed after a power loss — writes answered
 * as failed becoming durable.  The pass is replaced first, with the log's
 * pending writes (it can only go with them: their groups are under it).
 * If even that cannot commit, the process stops before it answers
 * (fail-stop, as PostgreSQL does when an fsync fails: data_sync_retry):
 * writes never answered may be replayed or not at the next open. */
static void
fence_failed_group(sbx_store *s)
{
    int rc = apply_growing(s, NULL, 0);
    if (rc == 0 && !s->rotate)
        return;
    sbx_log_error("store: a flush of the redo log failed and LMDB cannot replace its pass (%s): "
                  "stopping before answering its writes (they may be replayed at the next open)",
                  sbx_err_message(rc));
    abort();
}

/* Report the decisions of the n ops: rc for those not failed before,
 * each run of one outcome as one range, in order. */
static void
report(sbx_store *s, struct wop *ops, size_t n, int rc)
{
    struct wop *o = ops;
    if (s->rotate) {
        bool failed = false;
        for (size_t i = 0; i < n && !failed; i++, o = o->next)
            failed = rc || o->rc;
        if (failed)
            fence_failed_group(s);
        o = ops;
    }
    while (n > 0) {
        uint64_t first = o->seq, last = o->seq;
        int r = o->rc ? o->rc : rc;
        for (o = o->next, n--; n > 0 && (o->rc ? o->rc : rc) == r; o = o->next, n--)
            last = o->seq;
        if (r)
            sbx_log_error("store: writes %llu..%llu failed: %s", (unsigned long long)first,
                      (unsigned long long)last, sbx_err_message(r));
        decide(s, first, last, r);
    }
}

/* Whether o must go in the batch that starts at first: it is to be committed
 * with a write of that batch (sbx_store_put_with). */
static bool
joins(const struct wop *first, const struct wop *o)
{
    return o->with && o->after >= first->seq;
}

/* Commit a batch of n ops and report it.  A write made on top of one that
 * failed fails too, and is left out (store.h: a failed change never
 * becomes durable through a later write).  A batch that does not fit is
 * retried one write per transaction, so that only the writes that do not
 * fit fail and the others are committed. */
static void
commit_batch(sbx_store *s, struct wop *ops, size_t n)
{
    int64_t t0 = sbx_mono_us();
    size_t live = 0;
    uint64_t last = ops->seq;
    struct wop *o = ops;
    for (size_t i = 0; i < n; i++, o = o->next) {
        o->rc = after_failed(s, ops, o);
        live += !o->rc;
        last = o->seq;
    }
    bool had_pend = s->pend != NULL;
    int rc = live || had_pend ? apply_growing(s, ops, n) : 0;
    if (rc && had_pend && s->pend) {
        /* The log's writes do not fail with a write of this batch that
         * does not fit: alone first, then the batch.  If they cannot be
         * applied, no write after them is (a write reaches LMDB only after
         * every earlier one): the batch fails with their code. */
        int prc = apply_pending(s);
        rc = prc ? prc : apply_growing(s, ops, n);
    }
    pthread_mutex_lock(&s->mu);
    sbx_hist_observe(&s->h_commit, sbx_prom_latency_s, sbx_prom_latency_n,
                     (double)(sbx_mono_us() - t0) / 1e6);
    sbx_hist_observe(&s->h_batch, sbx_prom_batch_sizes, sbx_prom_batch_n, (double)n);
    pthread_mutex_unlock(&s->mu);
    if (rc == SBX_E_STORAGE_FULL && live > 1 && !s->pend) {
        sbx_log_warn("store: batch %llu..%llu does not fit; committing its writes one by one",
                 (unsigned long long)ops->seq, (unsigned long long)last);
        /* One write per transaction — with the writes to be committed
         * with it (sbx_store_put_with): they fit or fail together. */
        o = ops;
        for (size_t i = 0; i < n;) {
            size_t k = 1;
            for (const struct wop *p = o->next; i + k < n && joins(o, p); p = p->next)
                k++;
            /* Decided in order: an earlier failure of this batch is known. */
            size_t glive = 0;
            struct wop *m = o;
            for (size_t j = 0; j < k; j++, m = m->next) {
                int r = after_failed(s, o, m);
                m->rc = m->rc ? m->rc : r;
                glive += !m->rc;
            }
            int r = glive ? apply_growing(s, o, k) : 0;
            m = o;
            for (size_t j = 0; j < k; j++, m = m->next)
                m->rc = m->rc ? m->rc : r;
            report(s, o, k, 0);
            o = m;
            i += k;
        }
        return;
    }
    report(s, ops, n, rc);
}

/* Whether the batch of n ops goes to the redo log: it holds a logged
 * write, every write is logged or lazy, small, a put on its own (not one
 * to be committed with another: sbx_store_put_with), and the group fits. */
static bool
log_takes(sbx_store *s, const struct wop *ops, size_t n)
{
    bool any = false;
    size_t bytes = SBX_SLOG_HDR;
    for (const struct wop *o = ops; n > 0; o = o->next, n--) {
        if (o->del || o->with || !(o->logged || o->lazy) || o->kn == 0 ||
            o->kn > (size_t)mdb_env_get_maxkeysize(s->env) ||
            o->kn + o->vn > SBX_STORE_LOG_MAX_WRITE)
            return false; /* (a key LMDB refuses fails in its transaction, as before) */
        any = any || o->logged;
        bytes += sbx_slog_entry_bytes(o->kn, o->vn);
    }
    return any && bytes <= sbx_slog_room(s->log);
}

/* Commit a batch log_takes accepted with one group of the redo log and
 * report it; its writes wait in the pending list for their LMDB
 * transaction (they are freed then).  0, or the log's failure: nothing
 * was reported, and the caller commits the batch through LMDB. */
static int
log_batch(sbx_store *s, struct wop *ops, size_t n)
{
    int64_t t0 = sbx_mono_us();
    size_t live[SBX_DB__N] = {0}, nlive = 0;
    sbx_slog_begin(s->log);
    struct wop *o = ops;
    for (size_t i = 0; i < n; i++, o = o->next) {
        o->rc = after_failed(s, ops, o);
        if (o->rc)
            continue;
        sbx_slog_add(s->log, o->seq, o->db, o->del, o->data, o->kn, o->data + o->kn, o->vn);
        live[o->db]++;
        nlive++;
    }
    if (nlive) {
        bool whole = false;
        int rc = sbx_slog_append(s->log, s->pass, &whole);
        if (rc) {
            sbx_log_error("store: writing the redo log failed (%s); writes go through LMDB alone",
                          strerror(-rc));
            s->rotate = whole; /* the group may be whole on disk: its pass goes */
            return rc;
        }
    }
    /* Counted before they are decided: a reader that sees a write decided
     * also sees it pending, and waits for its LMDB transaction (settle). */
    pthread_mutex_lock(&s->mu);
    for (int d = 0; d < SBX_DB__N; d++)
        s->pend_db[d] += live[d];
    if (nlive && !s->pend_due)
        s->pend_due = sbx_mono_ms() + s->apply_ms;
    if (sbx_slog_used(s->log) > SBX_SLOG_BYTES / 2)
        s->apply_req = true; /* room for the next groups */
    s->n_logged += nlive > 0;
    sbx_hist_observe(&s->h_commit, sbx_prom_latency_s, sbx_prom_latency_n,
                     (double)(sbx_mono_us() - t0) / 1e6);
    sbx_hist_observe(&s->h_batch, sbx_prom_batch_sizes, sbx_prom_batch_n, (double)n);
    pthread_mutex_unlock(&s->mu);
    report(s, ops, n, 0);
    o = ops;
    for (size_t i = 0; i < n; i++) {
        struct wop *next = o->next;
        if (o->rc) {
            free(o);
        } else {
            o->next = NULL;
            if (s->pend_tail)
                s->pend_tail->next = o;
            else
                s->pend = o;
            s->pend_tail = o;
        }
        o = next;
    }
    return 0;
}

/* Commit a batch of n ops taken from the queue, through the redo log when
 * it takes them and the pending writes are not due, else through LMDB;
 * frees or keeps (pending) the ops. */
static void
run_batch(sbx_store *s, struct wop *ops, size_t n, bool apply)
{
    if (!apply && s->log && log_takes(s, ops, n) && log_batch(s, ops, n) == 0)
        return;
    commit_batch(s, ops, n);
    while (n-- > 0) {
        struct wop *next = ops->next;
        free(ops);
        ops = next;
    }
}

/* Under mu: whether the pending writes are to be applied now. */
static bool
apply_due(const sbx_store *s)
{
    return s->pend_due && (s->apply_req || s->stopping || sbx_mono_ms() >= s->pend_due);
}

/* Under mu: whether write o waits for a release (sbx_store_hold). */
static bool
held(const sbx_store *s, const struct wop *o)
{
    return s->hold_from && o->seq >= s->hold_from && !s->stopping;
}

/* Under mu: whether the writer should take the queue now. */
static bool
queue_due(sbx_store *s)
{
    if (!s->head || held(s, s->head))
        return false;
    return s->stopping || s->urgent >= s->head->seq || sbx_mono_ms() >= s->lazy_due;
}


/* Open: the writes of the redo log's current pass, which LMDB lacks. */
struct replay {
    sbx_store *s;
    MDB_txn *txn;
    size_t n;
    int rc; /* replay_one's failure: an MDB code */
};

static int
replay_one(void *arg, const struct sbx_slog_entry *e)
{
    struct replay *r = arg;
    if (e->db < 0 || e->db >= SBX_DB__N) {
        r->rc = MDB_CORRUPTED; /* a good checksum over a bad entry: not written by this code */
        return -1;
    }
    r->rc = put_one(r->s, r->txn, e->db, e->del, e->k, e->kn, e->v, e->vn);
    r->n++;
    return r->rc ? -1 : 0;
}

/* Open the redo log, apply to LMDB the writes of its current pass (groups
 * committed before a crash, not yet applied) and start a new pass, in one
 * transaction (store_log.h).  0 or a negative code (the open fails: the
 * log holds acknowledged writes LMDB cannot take).  A store whose
 * transaction does not fit with nothing to replay goes on without a log
 * (s->log NULL; every write through LMDB). */
static int
log_open(sbx_store *s)
{
    int rc = sbx_slog_open(&s->log, s->dir);
    if (rc) {
        sbx_log_error("store: %s/redo.log: %s", s->dir, strerror(-rc));
        return rc;
    }
    struct replay r;
    uint64_t pass = 0;
    for (;;) {
        r = (struct replay){.s = s};
        rc = mdb_txn_begin(s->env, NULL, 0, &r.txn);
        if (rc)
            break;
        MDB_val k = {sizeof(PASS_KEY) - 1, PASS_KEY}, v;
        uint64_t cur = 0;
        rc = mdb_get(r.txn, s->dbi[SBX_DB_META], &k, &v);
        if (rc == 0 && v.mv_size != 8)
            rc = MDB_CORRUPTED;
        if (rc && rc != MDB_NOTFOUND) {
            mdb_txn_abort(r.txn);
            break;
        }
        for (int i = 0; rc == 0 && i < 8; i++)
            cur |= (uint64_t)((unsigned char *)v.mv_data)[i] << (8 * i);
        /* No pass recorded (a new store, or one from before the log):
         * nothing in the file is this store's. */
        if (cur && sbx_slog_scan(s->log, cur, replay_one, &r) != 0) {
            mdb_txn_abort(r.txn);
            rc = r.rc;
        } else {
            pass = new_pass(cur);
            rc = put_pass(s, r.txn, pass);
            if (rc)
                mdb_txn_abort(r.txn);
            else
                rc = mdb_txn_commit(r.txn);
        }
        if (rc == MDB_MAP_FULL && grow_map(s) == 0)
            continue;
        if (rc == EIO && full_fs(s, 1u << 16))
            rc = ENOSPC; /* a full tmpfs, as in apply_batch */
        break;
    }
    if (rc == 0) {
        s->pass = pass;
        sbx_slog_reset(s->log);
        if (r.n)
            sbx_log_warn("store: %zu writes replayed from the redo log (committed before a crash)",
                         r.n);
        return 0;
    }
    if (r.n == 0 && mdb_to_rc(rc) == SBX_E_STORAGE_FULL) {
        sbx_log_warn("store: no room to start the redo log (%s): every write goes through LMDB",
                     mdb_strerror(rc));
        sbx_slog_close(s->log);
        s->log = NULL;
        return 0;
    }
    sbx_log_error("store: replaying the redo log (%zu writes): %s", r.n, mdb_strerror(rc));
    return mdb_to_rc(rc);
}

static void *
writer_main(void *arg)
{
    sbx_store *s = arg;
    for (;;) {
        pthread_mutex_lock(&s->mu);
        while (!queue_due(s) && !apply_due(s) && !s->stopping) {
            /* Lazy writes only (until one is due), or writes of the log
             * to apply (by pend_due); or nothing: a write, a release or a
             * reader wakes us. */
            int64_t due = s->head && !held(s, s->head) ? s->lazy_due : 0;
            if (s->pend_due && (!due || s->pend_due < due))
                due = s->pend_due;
            if (!due) {
                pthread_cond_wait(&s->cv, &s->mu);
                continue;
            }
            struct timespec ts = {.tv_sec = due / 1000, .tv_nsec = (long)(due % 1000) * 1000000L};
            pthread_cond_timedwait(&s->cv, &s->mu, &ts);
        }
        /* Pending writes due are applied with the batch's transaction, or
         * alone when there is none. */
        bool apply = apply_due(s);
        /* Take a bounded prefix of the queue (store.h), never a held write,
         * never a write without the ones to be committed with it; the
         * rest waits.  (Woken to apply the log's writes, a lazy head not
         * due yet goes too: into the same transaction.) */
        struct wop *ops = s->head && !held(s, s->head) ? s->head : NULL, *end = ops;
        size_t n = 0, bytes = 0;
        while (end && !held(s, end) &&
               ((n < SBX_STORE_BATCH_OPS &&
                 (n == 0 || bytes + end->kn + end->vn <= SBX_STORE_BATCH_BYTES)) ||
                joins(ops, end))) {
            bytes += end->kn + end->vn;
            n++;
            end = end->next;
        }
        if (ops) {
            s->head = end;
            if (!end) {
                s->tail = NULL;
                s->lazy_due = 0;
            }
        }
        bool stop = s->stopping;
        pthread_mutex_unlock(&s->mu);
        if (ops) {
            run_batch(s, ops, n, apply);
        } else if (apply && s->pend) {
            if (apply_pending(s) != 0 && stop)
                break; /* they stay in the log: the next open replays them */
        } else if (stop) {
            break;
        }
    }
    return NULL;
}

int
sbx_store_open(sbx_store **out, const char *dir, uint64_t mapsize, uint64_t map_max,
               sbx_store_commit_fn cb, void *cbarg)
{
    int rc;
    MDB_txn *txn = NULL;
    sbx_store *s = sbx_xcalloc(1, sizeof(*s));
    s->dir = sbx_xstrdup(dir);

    rc = sbx_mkdir_p(dir, 0700);
    if (rc)
        goto fail;
    if ((rc = mdb_env_create(&s->env)) != 0)
        goto fail_mdb;
    if ((rc = mdb_env_set_mapsize(s->env, mapsize)) != 0)
        goto fail_mdb;
    if ((rc = mdb_env_set_maxdbs(s->env, 8)) != 0)
        goto fail_mdb;
    if ((rc = mdb_env_set_maxreaders(s->env, 256)) != 0)
        goto fail_mdb;
    if ((rc = mdb_env_open(s->env, dir, MDB_NOTLS, 0600)) != 0)
        goto fail_mdb;
    /* LMDB opens its data file without O_CLOEXEC (it leaves the choice to
     * the caller); no child of this process may inherit the store. */
    int dfd;
    if (mdb_env_get_fd(s->env, &dfd) == 0 && fcntl(dfd, F_SETFD, FD_CLOEXEC) != 0) {
        rc = errno ? errno : EIO;
        goto fail_mdb;
    }
    int dead = 0;
    mdb_reader_check(s->env, &dead);
    if ((rc = mdb_txn_begin(s->env, NULL, 0, &txn)) != 0)
        goto fail_mdb;
    for (int i = 0; i < SBX_DB__N; i++) {
        if ((rc = mdb_dbi_open(txn, dbnames[i], MDB_CREATE, &s->dbi[i])) != 0)
            goto fail_mdb;
    }
    if ((rc = mdb_txn_commit(txn)) != 0) {
        txn = NULL;
        goto fail_mdb;
    }
    txn = NULL;
    MDB_envinfo info;
    if ((rc = mdb_env_info(s->env, &info)) != 0)
        goto fail_mdb;
    s->mapsize = info.me_mapsize; /* at least what the file already uses */
    s->map_max = map_max > s->mapsize ? map_max : s->mapsize;
    pthread_rwlock_init(&s->maplock, NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* lazy_due */
    pthread_cond_init(&s->cv, &ca);
    pthread_condattr_destroy(&ca);
    pthread_cond_init(&s->donecv, NULL);
    s->apply_ms = SBX_STORE_LOG_DELAY_MS;
    if ((rc = log_open(s)) != 0)
        goto fail;
    s->next_seq = 1;
    s->cb = cb;
    s->cbarg = cbarg;
    if ((rc = pthread_create(&s->writer, NULL, writer_main, s)) != 0) {
        rc = -rc;
        goto fail;
    }
    *out = s;
    return 0;
fail_mdb:
    sbx_log_error("store: %s: %s", dir, mdb_strerror(rc));
    rc = mdb_to_rc(rc);
fail:
    sbx_slog_close(s->log);
    if (txn)
        mdb_txn_abort(txn);
    if (s->env)
        mdb_env_close(s->env);
    free(s->dir);
    free(s);
    return rc;
}

void
sbx_store_close(sbx_store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->mu);
    s->stopping = true;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->writer, NULL);
    sbx_slog_close(s->log); /* what it holds is in LMDB, or replayed at the next open */
    free_list(&s->pend); /* an apply failed at the close: they stay in the log */
    mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->maplock);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    pthread_cond_destroy(&s->donecv);
    free(s->fails);
    free(s->dir);
    free(s);
}

/* Before a read of db: the writes of db committed through the redo log
 * are applied to LMDB first (the writer is asked, and waited for), so a
 * read sees every write decided before it.  0, or the failure of that
 * apply. */
static int
settle(sbx_store *s, int db)
{
    int rc = 0;
    pthread_mutex_lock(&s->mu);
    uint64_t fails = s->apply_fails;
    while (s->pend_db[db] && s->apply_fails == fails) {
        s->apply_req = true; /* again: writes logged since the last apply */
        pthread_cond_signal(&s->cv);
        pthread_cond_wait(&s->donecv, &s->mu);
    }
    if (s->pend_db[db])
        rc = s->apply_rc;
    pthread_mutex_unlock(&s->mu);
    return rc;
}

int
sbx_store_get(sbx_store *s, int db, const void *k, size_t kn, char **val, size_t *vn)
{
    MDB_txn *txn;
    int rc = settle(s, db);
    if (rc)
        return rc;
    pthread_rwlock_rdlock(&s->maplock);
    rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc) {
        pthread_rwlock_unlock(&s->maplock);
        return mdb_to_rc(rc);
    }
    MDB_val key = {kn, (void *)k}, v;
    rc = mdb_get(txn, s->dbi[db], &key, &v);
    if (rc == 0) {
        *val = sbx_xstrndup(v.mv_data, v.mv_size);
        *vn = v.mv_size;
    }
    mdb_txn_abort(txn);
    pthread_rwlock_unlock(&s->maplock);
    if (rc == MDB_NOTFOUND)
        return -ENOENT;
    return mdb_to_rc(rc);
}

int
sbx_store_foreach(sbx_store *s, int db,
                  int (*fn)(void *arg, const void *k, size_t kn, const void *v, size_t vn),
                  void *arg)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    int rc = settle(s, db);
    if (rc)
        return rc;
    pthread_rwlock_rdlock(&s->maplock);
    rc = mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn);
    if (rc) {
        pthread_rwlock_unlock(&s->maplock);
        return mdb_to_rc(rc);
    }
    rc = mdb_cursor_open(txn, s->dbi[db], &cur);
    if (rc) {
        mdb_txn_abort(txn);
        pthread_rwlock_unlock(&s->maplock);
        return mdb_to_rc(rc);
    }
    MDB_val k, v;
    int r = 0;
    for (rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0;
         rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        r = fn(arg, k.mv_data, k.mv_size, v.mv_data, v.mv_size);
        if (r)
            break;
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    pthread_rwlock_unlock(&s->maplock);
    if (r)
        return r;
    return rc == MDB_NOTFOUND ? 0 : mdb_to_rc(rc);
}

static uint64_t
enqueue(sbx_store *s, int db, bool del, const void *k, size_t kn, const void *v, size_t vn,
        uint64_t after, bool lazy, bool with, bool logged)
{
    struct wop *o = sbx_xmalloc(sizeof(*o) + kn + vn);
    o->next = NULL;
    o->after = after;
    o->with = with && after;
    o->lazy = lazy;
    o->logged = logged;
    o->rc = 0;
    o->db = db;
    o->del = del;
    o->kn = kn;
    o->vn = vn;
    memcpy(o->data, k, kn);
    if (vn)
        memcpy(o->data + kn, v, vn);
    pthread_mutex_lock(&s->mu);
    uint64_t seq = o->seq = s->next_seq++; /* o may be freed by the writer once unlocked */
    if (s->tail)
        s->tail->next = o;
    else
        s->head = o;
    s->tail = o;
    bool wake = false;
    if (!lazy) {
        s->urgent = seq;
        wake = true;
    } else if (!s->lazy_due) {
        s->lazy_due = sbx_mono_ms() + SBX_STORE_LAZY_MS; /* the writer sees it at its next wake-up */
        wake = true;
    }
    pthread_mutex_unlock(&s->mu);
    /* Signalled after the unlock: woken under s->mu, the writer would run
     * at once, block on the mutex and need a second wake-up (two context
     * switches more per write, seen in a scheduler trace).  It re-checks
     * its queue under s->mu, so no wake-up is lost.  s is still alive here
     * because no call may overlap sbx_store_close (store.h): the shard
     * queues writes and closes the store on its loop thread. */
    if (wake)
        pthread_cond_signal(&s->cv);
    return seq;
}

uint64_t
sbx_store_put(sbx_store *s, int db, const void *k, size_t kn, const void *v, size_t vn)
{
    return enqueue(s, db, false, k, kn, v, vn, 0, false, false, false);
}

uint64_t
sbx_store_put_after(sbx_store *s, int db, const void *k, size_t kn, const void *v, size_t vn,
                    uint64_t after)
{
    return enqueue(s, db, false, k, kn, v, vn, after, false, false, false);
}

uint64_t
sbx_store_put_with(sbx_store *s, int db, const void *k, size_t kn, const void *v, size_t vn,
                   uint64_t with)
{
    return enqueue(s, db, false, k, kn, v, vn, with, false, true, false);
}

void
sbx_store_hold(sbx_store *s)
{
    pthread_mutex_lock(&s->mu);
    if (!s->hold_from) {
        s->hold_from = s->next_seq;
        s->holder = pthread_self();
    }
    pthread_mutex_unlock(&s->mu);
}

void
sbx_store_release(sbx_store *s)
{
    pthread_mutex_lock(&s->mu);
    bool wake = s->hold_from != 0;
    s->hold_from = 0;
    pthread_mutex_unlock(&s->mu);
    if (wake) /* after the unlock, as in enqueue */
        pthread_cond_signal(&s->cv);
}

uint64_t
sbx_store_put_lazy_after(sbx_store *s, int db, const void *k, size_t kn, const void *v,
                         size_t vn, uint64_t after)
{
    return enqueue(s, db, false, k, kn, v, vn, after, true, false, false);
}

uint64_t
sbx_store_put_logged(sbx_store *s, int db, const void *k, size_t kn, const void *v, size_t vn)
{
    return enqueue(s, db, false, k, kn, v, vn, 0, false, false, true);
}

void
sbx_store_set_log_delay(sbx_store *s, int64_t ms)
{
    pthread_mutex_lock(&s->mu);
    s->apply_ms = ms > 0 ? ms : 0;
    if (s->pend_due) /* the writes pending now wait for the new delay */
        s->pend_due = sbx_mono_ms() + s->apply_ms;
    pthread_cond_signal(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

uint64_t
sbx_store_last_seq(sbx_store *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t seq = s->next_seq - 1;
    pthread_mutex_unlock(&s->mu);
    return seq;
}

uint64_t
sbx_store_del(sbx_store *s, int db, const void *k, size_t kn)
{
    return enqueue(s, db, true, k, kn, NULL, 0, 0, false, false, false);
}

uint64_t
sbx_store_del_after(sbx_store *s, int db, const void *k, size_t kn, uint64_t after)
{
    return enqueue(s, db, true, k, kn, NULL, 0, after, false, false, false);
}

int
sbx_store_wait(sbx_store *s, uint64_t seq)
{
    pthread_mutex_lock(&s->mu);
    if (s->hold_from && seq >= s->hold_from && pthread_equal(s->holder, pthread_self())) {
        /* Its holder waiting for a held write ends the hold (store.h);
         * another thread waits for the release (the shard's replication
         * thread waits for every write it sends). */
        s->hold_from = 0;
        pthread_cond_signal(&s->cv);
    }
    if (s->decided < seq && s->urgent < seq) {
        /* A lazy write someone waits for is due now. */
        s->urgent = seq;
        pthread_cond_signal(&s->cv);
    }
    while (s->decided < seq)
        pthread_cond_wait(&s->donecv, &s->mu);
    pthread_mutex_unlock(&s->mu);
    /* A binary search of the failed ranges (the replication thread asks
     * for every write it sends; a long-full disk leaves many ranges). */
    return failed_rc(s, seq);
}

int
sbx_store_failed(sbx_store *s, uint64_t seq)
{
    return seq ? failed_rc(s, seq) : 0;
}

uint64_t
sbx_store_decided(sbx_store *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t seq = s->decided;
    pthread_mutex_unlock(&s->mu);
    return seq;
}

void
sbx_store_stat(sbx_store *s, uint64_t *batches, uint64_t *writes, uint64_t *failed)
{
    pthread_mutex_lock(&s->mu);
    *batches = s->n_batches;
    *writes = s->n_writes;
    *failed = s->n_failed;
    pthread_mutex_unlock(&s->mu);
}

uint64_t
sbx_store_logged(sbx_store *s)
{
    pthread_mutex_lock(&s->mu);
    uint64_t n = s->n_logged;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void
sbx_store_hists(sbx_store *s, struct sbx_hist *commit, struct sbx_hist *batch)
{
    pthread_mutex_lock(&s->mu);
    *commit = s->h_commit;
    *batch = s->h_batch;
    pthread_mutex_unlock(&s->mu);
}

uint64_t
sbx_store_mapsize(sbx_store *s)
{
    pthread_rwlock_rdlock(&s->maplock);
    uint64_t v = s->mapsize;
    pthread_rwlock_unlock(&s->maplock);
    return v;
}
