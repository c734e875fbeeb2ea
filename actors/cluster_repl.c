/*
 * cluster_repl.c — replication of sandbox record writes to etcd (cluster.h
 * "Ownership rules"; docs/cluster.md): cluster_replicate queues a write
 * (loop), the replication thread waits until the store has decided it and
 * sends the committed ones, in batches, in transactions that compare the
 * partition's owner and epoch and each record's revision (recrev.h), reads
 * back what etcd holds when a transaction's outcome is not known, and posts
 * each outcome to the loop, which opens the output gate (cluster_gate_open)
 * or fails the replies that waited on it.
 *
 * A deleted record leaves a tombstone in etcd — its key with an empty value,
 * under a lease of TOMB_TTL_S — instead of no key: a late copy of the
 * transaction that created the record compares the record's revision with 0
 * ("no such key") and would be applied again after a plain deletion (the
 * key is back to revision 0), bringing a destroyed sandbox back in etcd.
 * The tombstone moves the revision on; etcd removes it when its lease ends,
 * long after any copy of a request can still arrive (the etcd client gives
 * up on a request within seconds).  Loads skip tombstones (cluster_load.c).
 */
#include "cluster.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cview.h"
#include "../runtime/err.h"
#include "../runtime/etcd.h"
#include "../runtime/log.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster_int.h"
#include "recrev.h"
#include "shard_int.h"

#define REPL_BATCH 40 /* records per replication transaction: ≤ 3 compares each (owner
                         and epoch of its partition, the record's own revision), within
                         etcd's --max-txn-ops (128) */
/* Record bytes per replication transaction.  etcd refuses a request over
 * --max-request-bytes (1.5 MiB by default) and values travel base64-encoded
 * in its JSON API (4/3); the largest record (an environment of 1 MiB,
 * actor.c) still fits alone. */
#define REPL_BATCH_BYTES (384u << 10)
#define REPL_ERROR_RETRIES 6 /* retries of a transaction etcd answered with an error */
#define TOMB_TTL_S 600       /* the lease of tombstones, seconds (see the top) */
#define TOMB_LEASE_REUSE_MS 60000 /* one lease serves the tombstones of a minute: each
                                     lives between TOMB_TTL_S - 60 s and TOMB_TTL_S */

/* ------------------------------------------------------------------------------ */
/* Replication to etcd. */

void
cluster_replicate(struct shard *sh, uint64_t seq, const char *id, const void *rec, size_t len)
{
    struct cluster *c = cluster_of(sh);
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
    struct cluster *c = cluster_of(sh);
    if (!c)
        return true;
    return c->outhead == c->nout || c->outstanding[c->outhead] > need;
}

/* The outcomes of one batch (posted to the loop, which frees it). */
struct rdone {
    struct cluster *c;
    size_t n;
    struct rnote r[REPL_BATCH];
};

static void
repl_done(sbx_loop *l, void *arg)
{
    struct rdone *d = arg;
    struct cluster *c = d->c;
    struct shard *sh = c->sh;
    (void)l;
    for (size_t i = 0; i < d->n; i++) {
        /* A write not sent is decided too: its commit failed, and its reply
         * fails by the store's note of that (gate.c commit_loop). */
        if (c->outhead < c->nout && c->outstanding[c->outhead] == d->r[i].seq)
            c->outhead++;
        if (d->r[i].sent && d->r[i].rc) {
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
    shard_forget_replicated_deletes(sh);
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

/* Replication thread: SBX_E_WRONG_OWNER if every record the batch writes
 * is still at the revision its transaction compared, SBX_E_INTERRUPTED if
 * one is not or cannot be read (repl_read_back). */
static int
repl_untouched(struct cluster *c, const struct ritem *batch)
{
    char key[320];
    for (const struct ritem *it = batch; it; it = it->next) {
        int64_t m = 0;
        if (!repl_last(it))
            continue;
        recrev_get(c->revs, it->id, it->epoch, &m);
        struct sbx_etcd_kv *kvs;
        size_t n;
        sbx_cview_rec_key(c->prefix, it->part, it->id, key, sizeof(key));
        if (sbx_etcd_range(c->etcd, key, NULL, &kvs, &n, NULL) != 0)
            return SBX_E_INTERRUPTED;
        int64_t now = n ? kvs[0].mod_revision : 0;
        sbx_etcd_kvs_free(kvs, n);
        if (now != m)
            return SBX_E_INTERRUPTED;
    }
    return SBX_E_WRONG_OWNER;
}

/*
 * Replication thread: after a transaction whose compares failed, read back
 * what etcd holds.  If a partition of the batch is no longer ours at the
 * write's epoch: SBX_E_WRONG_OWNER when every record of the batch is still
 * at the revision the transaction compared (no copy of it was applied, and
 * none can be: the epoch moved on), else SBX_E_INTERRUPTED (a copy may have
 * been applied before the partition moved: the outcome is not known).
 * Else 0 with *again false if every
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
            return repl_untouched(c, batch);
        if (!repl_last(it))
            continue;
        sbx_cview_rec_key(c->prefix, it->part, it->id, key, sizeof(key));
        if ((rc = sbx_etcd_range(c->etcd, key, NULL, &kvs, &n, NULL)) != 0)
            return rc;
        bool applied = it->rec ? n && kvs[0].vlen == it->len && !memcmp(kvs[0].value, it->rec,
                                                                         it->len)
                               : n && kvs[0].vlen == 0; /* its tombstone */
        recrev_set(c->revs, it->id, it->epoch, n ? kvs[0].mod_revision : 0);
        sbx_etcd_kvs_free(kvs, n);
        *again |= !applied;
    }
    return 0;
}

struct ritem *
cluster_repl_committed(sbx_store *st, struct ritem *batch, struct rnote *notes, size_t *n)
{
    /* The store decides in sequence order: waiting for the highest is enough. */
    uint64_t top = 0;
    for (const struct ritem *it = batch; it; it = it->next)
        top = SBX_MAX(top, it->seq);
    if (top)
        sbx_store_wait(st, top);
    struct ritem *keep = NULL, **tail = &keep;
    for (struct ritem *it = batch; it;) {
        struct ritem *next = it->next;
        int rc = sbx_store_wait(st, it->seq); /* decided: does not block */
        struct rnote *r = &notes[(*n)++];
        memset(r, 0, sizeof(*r));
        r->seq = it->seq;
        r->part = it->part;
        r->sent = rc == 0;
        snprintf(r->id, sizeof(r->id), "%s", it->id);
        if (rc == 0) {
            *tail = it;
            tail = &it->next;
        } else {
            /* Never sent: a write answered as failed must not become visible
             * through etcd (after a failover or handoff), nor etcd disagree
             * with this shard's LMDB. */
            sbx_log_debug("cluster: write %llu of %s not replicated: its commit failed (%s)",
                          (unsigned long long)it->seq, it->id, sbx_err_message(rc));
            free(it->rec);
            free(it);
        }
        it = next;
    }
    *tail = NULL;
    return keep;
}

/* Replication thread: the lease to put the batch's tombstones under, in
 * *lease (0 if the batch deletes nothing); a lease granted over
 * TOMB_LEASE_REUSE_MS ago is replaced.  0, or the error of the grant. */
static int
repl_tomb_lease(struct cluster *c, const struct ritem *batch, int64_t *lease)
{
    *lease = 0;
    bool dels = false;
    for (const struct ritem *it = batch; it && !dels; it = it->next)
        dels = !it->rec && repl_last(it);
    if (!dels)
        return 0;
    int64_t now = sbx_mono_ms();
    if (!c->tomb_lease || now - c->tomb_lease_ms > TOMB_LEASE_REUSE_MS) {
        int64_t id = 0;
        int rc = sbx_etcd_lease_grant(c->etcd, TOMB_TTL_S, &id);
        if (rc)
            return rc;
        c->tomb_lease = id;
        c->tomb_lease_ms = now;
    }
    *lease = c->tomb_lease;
    return 0;
}

void *
cluster_repl_main(void *arg)
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
        /* Commit first, then replicate: the batch starts once the store has
         * decided its oldest write, and takes only writes decided by then
         * (waiting for later ones would hold back those ready).  The head
         * stays: only this thread takes from the queue. */
        uint64_t head = c->rq_head->seq;
        pthread_mutex_unlock(&c->rmu);
        sbx_store_wait(sh->store, head);
        uint64_t decided = sbx_store_decided(sh->store);
        pthread_mutex_lock(&c->rmu);
        /* A batch: up to REPL_BATCH records and REPL_BATCH_BYTES of them (one
         * record always goes, alone if it is larger: it fits in a request),
         * each partition at one epoch. */
        struct ritem *batch = c->rq_head, *last = batch;
        size_t n = 1, bytes = batch->len;
        while (last->next && last->next->seq <= decided && n < REPL_BATCH &&
               bytes + last->next->len <= REPL_BATCH_BYTES && !epoch_conflict(batch, last->next)) {
            last = last->next;
            bytes += last->len;
            n++;
        }
        c->rq_head = last->next;
        if (!c->rq_head)
            c->rq_tail = NULL;
        last->next = NULL;
        pthread_mutex_unlock(&c->rmu);
        struct rdone *d = sbx_xcalloc(1, sizeof(*d));
        d->c = c;
        batch = cluster_repl_committed(sh->store, batch, d->r, &d->n);

        /* One transaction: every partition touched is still ours at the epoch
         * its writes were made at (owner and mod_revision of its key, as
         * claims and handoffs compare them: a write delayed past a move of the
         * partition away and back to this shard fails); then the puts and
         * deletes.  Retried while etcd is unreachable and the lease may still
         * be ours. */
        int rc = 0;
        for (int attempt = 0; batch; attempt++) {
            int64_t tomb = 0;
            rc = repl_revs(c, batch);
            if (rc == 0)
                rc = repl_tomb_lease(c, batch, &tomb);
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
                        sbx_etcd_txn_put(t, key, "", 0, tomb); /* its tombstone */
                }
                bool ok = false, again = false;
                int64_t rev = 0;
                rc = sbx_etcd_txn_run(c->etcd, t, &ok, &rev);
                if (rc == 0 && ok) {
                    for (struct ritem *it = batch; it; it = it->next)
                        if (repl_last(it))
                            recrev_set(c->revs, it->id, it->epoch, rev);
                    break;
                }
                if (rc != 0)
                    c->tomb_lease = 0; /* e.g. a lease etcd no longer has: a new one */
                if (rc == 0 && (rc = repl_read_back(c, batch, &again)) == 0 && !again)
                    break; /* applied by an earlier copy of this transaction */
                if (rc == SBX_E_WRONG_OWNER || rc == SBX_E_INTERRUPTED)
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
            if (cluster_fenced(c) || atomic_load(&c->stop) ||
                (rc != SBX_E_SHARD_UNAVAILABLE && attempt >= REPL_ERROR_RETRIES))
                break;
            cluster_nap_ms(SBX_MIN(50 << SBX_MIN(attempt, 4), 500));
        }
        if (rc != 0 && rc != SBX_E_WRONG_OWNER && rc != SBX_E_INTERRUPTED) {
            /* Our LMDB holds writes etcd may lack (or may apply later: a
             * request etcd read before it stalled): stop serving and reload
             * what we own from etcd, the authority, as after a lost lease.
             * The writes' outcome is not known (etcd may have applied
             * them): their replies say so (SHARD_UNAVAILABLE), never that
             * they were undone (the fault test found writes answered
             * STORAGE_ERROR read back). */
            cluster_fence_now(c);
            rc = SBX_E_SHARD_UNAVAILABLE;
        }
        for (size_t i = 0; i < d->n; i++)
            if (d->r[i].sent)
                d->r[i].rc = rc;
        for (struct ritem *it = batch; it;) {
            struct ritem *next = it->next;
            free(it->rec);
            free(it);
            it = next;
        }
        sbx_loop_post(sh->loop, repl_done, d);
    }
    return NULL;
}
