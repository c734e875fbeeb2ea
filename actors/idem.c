/*
 * idem.c — the idempotency table of a shard (docs/protocol.md §2
 * "Idempotency"): a request id seen again joins its first run or gets the
 * reply of that run, also after the shard restarted.
 *
 * Two layers, one set of entries:
 *  - in memory (struct idem, owned by the shard's loop thread): every
 *    sandbox request admitted, from its arrival (inflight) until TTL,
 *    IDEM_MAX_ENTRIES or IDEM_MAX_BYTES of replies push it out;
 *  - in LMDB (SBX_DB_IDEM): the replies of operations that change something
 *    (idem_durable_op), written through the store's group commit before the
 *    reply leaves (the reply waits at the output gate for that write as for
 *    the operation's own state write), loaded back at start-up.  Key: the
 *    idempotency key (shard_int.h SBX_IDEM_KEY); value: 8 bytes of the
 *    recording time (ms since the epoch, little-endian) then the reply frame.
 *    Removing an entry from memory deletes it from LMDB (the store's writer
 *    applies the delete with its next batch), so the durable table has the
 *    same bounds and TTL.
 *  - an *intent* (same key, value: the recording time then the one byte
 *    IDEM_INTENT) is committed before an agent operation that is not a read
 *    is sent to the agent (idem_intent; the actor's input gate waits for it),
 *    and replaced by the reply when there is one (idem_persist).  Both go
 *    through the store's redo log when they can (runtime/store.h
 *    sbx_store_put_logged): the intent costs one device flush.  An intent
 *    with no reply — the shard was killed, or the container died, while the
 *    operation ran — answers OPERATION_INTERRUPTED to every retry until it
 *    expires: the operation may have run, so it never runs again under that
 *    request id (issue 11, "0 double executions").
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "shard_int.h"

#define IDEM_MAX_ENTRIES 65536
#define IDEM_MAX_BYTES (64u << 20)        /* replies kept in memory */
#define IDEM_MAX_REPLY (8u << 20)         /* largest reply kept in memory */
#define IDEM_MAX_DURABLE_BYTES (64u << 20) /* replies kept in LMDB */
#define IDEM_MAX_DURABLE_REPLY (1u << 20)  /* largest reply kept in LMDB */
#define IDEM_HDR 8                         /* recording time before the reply */
#define IDEM_INTENT 0xc1 /* an intent's value after the time: never a msgpack byte */
/* In a cluster, a reply is recorded before its write is replicated (the
 * record's LMDB write and the reply's go in one batch, replication
 * follows): the top bit of the recording time marks it *pending* until the
 * reply leaves (idem_confirm rewrites it without the mark).  A shard that
 * restarts reloads what it owns from etcd, which may lack that write: a
 * pending entry then answers like an intent (OPERATION_INTERRUPTED), never
 * with a success etcd does not hold (the fault test's lost writes after a
 * kill -9 during a slow replication, retried with the same request id). */
#define IDEM_PENDING (1ull << 63)

int64_t
idem_ttl_ms(const struct shard *sh)
{
    return sh->conf.idem_ttl > 0 ? sh->conf.idem_ttl : 10 * 60 * 1000;
}

static size_t
ihash(struct shard *sh, const char *id)
{
    return (size_t)(XXH64(id, strlen(id), 7) % sh->idem.nbuckets);
}

struct idem *
idem_find(struct shard *sh, const char *id)
{
    for (struct idem *e = sh->idem.buckets[ihash(sh, id)]; e; e = e->hnext)
        if (!strcmp(e->id, id))
            return e;
    return NULL;
}

/* Unlink and free e; with forget, also delete its LMDB copy. */
static void
unlink_entry(struct shard *sh, struct idem *e, bool forget)
{
    struct idem **pp = &sh->idem.buckets[ihash(sh, e->id)];
    while (*pp && *pp != e)
        pp = &(*pp)->hnext;
    if (*pp)
        *pp = e->hnext;
    struct idem **lp = &sh->idem.head;
    struct idem *prev = NULL;
    while (*lp && *lp != e) {
        prev = *lp;
        lp = &(*lp)->lnext;
    }
    if (*lp)
        *lp = e->lnext;
    if (sh->idem.tail == e)
        sh->idem.tail = prev;
    if (forget && e->dlen)
        sbx_store_del(sh->store, SBX_DB_IDEM, e->id, strlen(e->id));
    sh->idem.bytes -= e->len;
    sh->idem.dbytes -= e->dlen;
    sh->idem.n--;
    free(e->reply);
    free(e);
}

void
idem_remove(struct shard *sh, struct idem *e)
{
    unlink_entry(sh, e, true);
}

void
idem_free_all(struct shard *sh)
{
    while (sh->idem.head)
        unlink_entry(sh, sh->idem.head, false);
}

void
idem_expire(struct shard *sh)
{
    int64_t now = sbx_wall_ms();
    while (sh->idem.head && !sh->idem.head->inflight &&
           (sh->idem.n > IDEM_MAX_ENTRIES || sh->idem.bytes > IDEM_MAX_BYTES ||
            sh->idem.dbytes > IDEM_MAX_DURABLE_BYTES || now - sh->idem.head->at_ms > idem_ttl_ms(sh)))
        idem_remove(sh, sh->idem.head);
}

/* Insert e at the tail (entries are kept in recording order). */
static void
link_entry(struct shard *sh, struct idem *e)
{
    size_t b = ihash(sh, e->id);
    e->hnext = sh->idem.buckets[b];
    sh->idem.buckets[b] = e;
    if (sh->idem.tail)
        sh->idem.tail->lnext = e;
    else
        sh->idem.head = e;
    sh->idem.tail = e;
    sh->idem.n++;
}

struct idem *
idem_add(struct shard *sh, const char *id, struct sop *op)
{
    struct idem *e = sbx_xcalloc(1, sizeof(*e));
    snprintf(e->id, sizeof(e->id), "%s", id);
    e->inflight = op;
    e->at_ms = sbx_wall_ms();
    link_entry(sh, e);
    idem_expire(sh);
    return e;
}

/* Whether op's reply goes to LMDB: an operation that changes durable state
 * or runs something in the container. */
bool
idem_durable_op(const struct sop *op)
{
    if (!op->def || !op->id[0])
        return false;
    if (op->def->flags & SBX_OP_MUTATES)
        return !(op->def->flags & SBX_OP_GLOBAL);
    /* An agent op that only reads (runtime/ops.yaml `readonly`) changes
     * nothing when run again: its reply is not worth a store write. */
    return (op->def->flags & SBX_OP_AGENT) && !(op->def->flags & SBX_OP_READONLY);
}

/* An entry's value: the recording time `at` (little-endian, IDEM_HDR bytes)
 * then len bytes of buf (a reply, or the intent byte).  Heap, caller frees. */
static char *
entry_new(uint64_t at, const char *buf, size_t len)
{
    char *v = sbx_xmalloc(IDEM_HDR + len);
    for (int i = 0; i < IDEM_HDR; i++)
        v[i] = (char)(at >> (8 * i));
    memcpy(v + IDEM_HDR, buf, len);
    return v;
}

uint64_t
idem_persist(struct sop *op, const char *buf, size_t len, uint64_t need_seq)
{
    struct shard *sh = op->sh;
    if (op->transient || op->idem_seq || len > IDEM_MAX_DURABLE_REPLY || !idem_durable_op(op))
        return need_seq;
    struct idem *e = idem_find(sh, op->id);
    if (!e || e->inflight != op)
        return need_seq;
    op->idem_pending = cluster_on(sh);
    char *v = entry_new((uint64_t)sbx_wall_ms() | (op->idem_pending ? IDEM_PENDING : 0), buf, len);
    /* Made on top of the operation's write: it fails if that one does.
     * After an intent nothing waits for it (below): it rides with the
     * next commit (the next request's intent, usually) instead of one of
     * its own, within SBX_STORE_LAZY_MS. */
    if (op->intent_seq)
        op->idem_seq = sbx_store_put_lazy_after(sh->store, SBX_DB_IDEM, op->id, strlen(op->id), v,
                                                IDEM_HDR + len, need_seq);
    else /* in one transaction with the operation's write: a crash never
          * keeps the change without the reply its retry must get */
        op->idem_seq = sbx_store_put_with(sh->store, SBX_DB_IDEM, op->id, strlen(op->id), v,
                                          IDEM_HDR + len, need_seq);
    op->idem_need = need_seq;
    sh->idem.dbytes -= e->dlen; /* the intent it replaces, if any */
    e->dlen = IDEM_HDR + len;
    sh->idem.dbytes += e->dlen;
    free(v);
    /* An agent operation's intent is already committed (its input gate
     * waited for it): if this record is lost in a crash, a retry finds the
     * intent and is told OPERATION_INTERRUPTED, never run again — so the
     * reply need not wait for this commit, only for the operation's own
     * write.  Other operations have no intent: their reply waits for the
     * record, or a retry after a crash would run them again. */
    if (op->intent_seq)
        return need_seq;
    return SBX_MAX(need_seq, op->idem_seq);
}

uint64_t
idem_intent(struct sop *op)
{
    struct shard *sh = op->sh;
    if (op->intent_seq || !idem_durable_op(op) || !(op->def->flags & SBX_OP_AGENT))
        return 0;
    struct idem *e = idem_find(sh, op->id);
    if (!e || e->inflight != op)
        return 0;
    const char intent = (char)IDEM_INTENT;
    char *v = entry_new((uint64_t)sbx_wall_ms(), &intent, 1);
    /* Through the store's redo log when it can (one device flush, not
     * LMDB's two): the operation waits for this write before it starts. */
    op->intent_seq =
        sbx_store_put_logged(sh->store, SBX_DB_IDEM, op->id, strlen(op->id), v, IDEM_HDR + 1);
    free(v);
    sh->idem.dbytes -= e->dlen;
    e->dlen = IDEM_HDR + 1;
    sh->idem.dbytes += e->dlen;
    return op->intent_seq;
}

void
idem_confirm(struct sop *op, const char *buf, size_t len)
{
    struct shard *sh = op->sh;
    if (!op->idem_pending || op->transient)
        return;
    op->idem_pending = false;
    struct idem *e = idem_find(sh, op->id);
    if (!e || e->inflight != op || e->dlen != IDEM_HDR + len)
        return;
    /* Not waited on: lost in a crash, the entry stays pending and a retry
     * is told OPERATION_INTERRUPTED — unknown, never wrong. */
    char *v = entry_new((uint64_t)sbx_wall_ms(), buf, len);
    sbx_store_put(sh->store, SBX_DB_IDEM, op->id, strlen(op->id), v, IDEM_HDR + len);
    free(v);
}

int
idem_gate_check(struct sop *op)
{
    if (!op->idem_seq || !op->idem_need)
        return 0;
    /* Both writes are decided (the reply waited for the later one); the
     * store remembers every failed range. */
    int rc = sbx_store_wait(op->sh->store, op->idem_need);
    op->idem_need = 0;
    return rc;
}

char *
idem_done(struct sop *op, char *buf, size_t len)
{
    struct shard *sh = op->sh;
    if (!op->id[0])
        return buf;
    struct idem *e = idem_find(sh, op->id);
    if (!e || e->inflight != op)
        return buf;
    if (op->transient && op->intent_seq && op->sent) {
        /* It reached the agent and may have run (the container died, or
         * its reply's write failed): its intent stays, and retries are
         * told so rather than run it again. */
        e->inflight = NULL;
        e->interrupted = true;
        e->at_ms = sbx_wall_ms();
        return buf;
    }
    if (op->transient) {
        /* A transient failure (unavailable, interrupted, moved, or a write
         * that did not commit) before the operation reached its agent: a
         * retry with the same key must run again, not get this answer — nor
         * a success recorded before it failed.  Its intent goes too. */
        idem_remove(sh, e);
        return buf;
    }
    e->inflight = NULL;
    e->at_ms = sbx_wall_ms();
    if (len <= IDEM_MAX_REPLY) {
        e->reply = buf;
        e->len = len;
        sh->idem.bytes += len;
        buf = NULL;
    }
    return buf;
}

int
idem_reply(struct shard *sh, struct idem *e, char **buf, size_t *len, bool *owned)
{
    *owned = false;
    if (e->interrupted) {
        /* The request id is the key's first field. */
        const char *us = strchr(e->id, '\x1f');
        sbx_str rid = {e->id, us ? (size_t)(us - e->id) : strlen(e->id)};
        const char *opn = us ? strrchr(e->id, '\x1f') + 1 : "";
        int rc = sbx_wire_reply_errf(
            rid, SBX_E_INTERRUPTED, buf, len,
            "request '%.*s' (%s) started before a restart of its shard or sandbox container "
            "and was never answered: it may have partly run, and it is not run again under "
            "this request id; send it with a new request id to run it anew",
            (int)rid.n, rid.p, opn);
        if (rc != 0)
            return rc;
        *owned = true;
        return 0;
    }
    if (e->reply) {
        *buf = e->reply;
        *len = e->len;
        return 0;
    }
    if (!e->dlen)
        return -ENOENT;
    char *v = NULL;
    size_t vn = 0;
    int rc = sbx_store_get(sh->store, SBX_DB_IDEM, e->id, strlen(e->id), &v, &vn);
    if (rc == 0 && vn <= IDEM_HDR)
        rc = -ENOENT;
    if (rc != 0) {
        free(v);
        return rc;
    }
    memmove(v, v + IDEM_HDR, vn - IDEM_HDR);
    *buf = v;
    *len = vn - IDEM_HDR;
    *owned = true;
    return 0;
}

/* Start-up: the entries of the table, oldest first. */
struct load_ctx {
    struct shard *sh;
    struct idem **v;
    size_t n, cap, expired;
    int64_t now;
};

static int
load_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct load_ctx *lc = arg;
    uint64_t at = 0;
    if (vn > IDEM_HDR)
        for (int i = 0; i < IDEM_HDR; i++)
            at |= (uint64_t)(unsigned char)((const char *)v)[i] << (8 * i);
    bool pending = at & IDEM_PENDING;
    at &= ~IDEM_PENDING;
    if (kn == 0 || kn >= SBX_IDEM_KEY)
        return 0; /* never written by this code */
    /* An expired or unreadable entry (at 0) is loaded too: idem_expire
     * deletes it once the walk is over (the store is not written during it). */
    if (lc->now - (int64_t)at > idem_ttl_ms(lc->sh))
        lc->expired++;
    if (lc->n == lc->cap) {
        lc->cap = lc->cap ? lc->cap * 2 : 256;
        lc->v = sbx_xrealloc(lc->v, lc->cap * sizeof(*lc->v));
    }
    struct idem *e = sbx_xcalloc(1, sizeof(*e));
    memcpy(e->id, k, kn);
    e->at_ms = (int64_t)at;
    e->dlen = vn;
    e->interrupted = pending ||
                     (vn == IDEM_HDR + 1 && ((const unsigned char *)v)[IDEM_HDR] == IDEM_INTENT);
    lc->v[lc->n++] = e;
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Handoff: the entries of the sandboxes of moving partitions go with them. */

#define IDEM_EXPORT_MAX_VALUE (64u << 10)   /* larger replies stay behind */
#define IDEM_EXPORT_MAX_BYTES (4u << 20)    /* per partition.import */

struct export_ctx {
    struct shard *sh;
    const uint8_t *set;
    sbx_enc *e;
    size_t n, bytes;
};

/* The partition of the sandbox named by idempotency key k, or -1. */
static int
key_partition(const char *k, size_t kn)
{
    const char *a = memchr(k, '\x1f', kn);
    const char *b = a ? memchr(a + 1, '\x1f', kn - (size_t)(a + 1 - k)) : NULL;
    if (!b || b == a + 1)
        return -1;
    return (int)sbx_place_partition(a + 1, (size_t)(b - a - 1));
}

static int
export_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct export_ctx *x = arg;
    int p = key_partition(k, kn);
    if (p < 0 || !x->set[p] || kn >= SBX_IDEM_KEY || vn <= IDEM_HDR ||
        vn > IDEM_EXPORT_MAX_VALUE || x->bytes + vn > IDEM_EXPORT_MAX_BYTES)
        return 0;
    sbx_enc_array(x->e);
    sbx_enc_strn(x->e, k, kn);
    sbx_enc_bin(x->e, v, vn);
    sbx_enc_end(x->e);
    x->n++;
    x->bytes += vn;
    return 0;
}

size_t
idem_export(struct shard *sh, const uint8_t *set, sbx_enc *e)
{
    struct export_ctx x = {sh, set, e, 0, 0};
    sbx_store_foreach(sh->store, SBX_DB_IDEM, export_one, &x);
    return x.n;
}

size_t
idem_import(struct shard *sh, const msgpack_object *arr)
{
    size_t n = 0;
    for (uint32_t i = 0; arr && i < arr->via.array.size; i++) {
        const msgpack_object *r = &arr->via.array.ptr[i];
        sbx_str k, v;
        if (r->type != MSGPACK_OBJECT_ARRAY || r->via.array.size != 2 ||
            sbx_wire_obj_str(&r->via.array.ptr[0], &k) != 0 ||
            sbx_wire_obj_str(&r->via.array.ptr[1], &v) != 0 || k.n == 0 ||
            k.n >= SBX_IDEM_KEY || v.n <= IDEM_HDR || key_partition(k.p, k.n) < 0)
            continue;
        char key[SBX_IDEM_KEY];
        memcpy(key, k.p, k.n);
        key[k.n] = '\0';
        if (strlen(key) != k.n || idem_find(sh, key))
            continue; /* a NUL inside, or known here already */
        struct load_ctx lc = {.sh = sh, .now = sbx_wall_ms()};
        load_one(&lc, k.p, k.n, v.p, v.n);
        if (lc.n != 1) {
            free(lc.v);
            continue;
        }
        sbx_store_put(sh->store, SBX_DB_IDEM, k.p, k.n, v.p, v.n);
        sh->idem.dbytes += lc.v[0]->dlen;
        link_entry(sh, lc.v[0]);
        free(lc.v);
        n++;
    }
    idem_expire(sh);
    return n;
}

static int
by_time(const void *a, const void *b)
{
    const struct idem *x = *(struct idem *const *)a, *y = *(struct idem *const *)b;
    return (x->at_ms > y->at_ms) - (x->at_ms < y->at_ms);
}

int
idem_load(struct shard *sh)
{
    struct load_ctx lc = {.sh = sh, .now = sbx_wall_ms()};
    int rc = sbx_store_foreach(sh->store, SBX_DB_IDEM, load_one, &lc);
    if (rc == 0) {
        if (lc.n)
            qsort(lc.v, lc.n, sizeof(*lc.v), by_time);
        for (size_t i = 0; i < lc.n; i++) {
            if (idem_find(sh, lc.v[i]->id)) {
                free(lc.v[i]);
                continue;
            }
            sh->idem.dbytes += lc.v[i]->dlen;
            link_entry(sh, lc.v[i]);
        }
        idem_expire(sh);
        if (lc.n || lc.expired)
            sbx_log_info("shard %s: %zu recorded replies of earlier requests kept, %zu expired",
                     sh->conf.name, lc.n - lc.expired, lc.expired);
    } else {
        for (size_t i = 0; i < lc.n; i++)
            free(lc.v[i]);
    }
    free(lc.v);
    return rc;
}
