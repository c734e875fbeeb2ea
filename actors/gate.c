/*
 * gate.c — the shard's output gate: which store writes are decided, which
 * failed, and which replies may go (shard_int.h; docs/protocol.md §4.1).
 *
 * Every record write of an actor is noted (struct pwrite) until the store's
 * writer reports it decided.  A committed write becomes the actor's durable
 * image; a failed one marks itself and the actor's later writes failed and
 * puts the record back to that image (actor_commit_failed).  A reply waits
 * (struct held) until every write it depends on is decided — committed to
 * LMDB or the store's redo log (runtime/store.h) and, in a cluster,
 * replicated — and carries the failure's code if
 * one of them failed.  Runs on the shard's loop thread, except
 * shard_commit_cb (the store's writer thread).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "shard_int.h"

struct commit_note {
    struct shard *sh;
    uint64_t first, last;
    int rc;
};

static void commit_loop(sbx_loop *l, void *arg);

void
shard_commit_cb(void *arg, uint64_t first, uint64_t last, int rc)
{
    struct shard *sh = arg;
    struct commit_note *n = sbx_xmalloc(sizeof(*n));
    n->sh = sh;
    n->first = first;
    n->last = last;
    n->rc = rc;
    sbx_loop_post(sh->loop, commit_loop, n);
}

/* The message of a reply whose commit failed with code. */
static void
commit_failure_msg(int code, char *msg, size_t n)
{
    switch (code) {
    case SBX_E_STORAGE_FULL:
        snprintf(msg, n, "the change could not be committed: the shard's metadata store is full "
                         "(its map is at --map-max, or the file system of its data directory is "
                         "full); the sandbox keeps its last acknowledged state");
        break;
    case SBX_E_WRONG_OWNER:
        snprintf(msg, n, "the write could not be replicated: this shard no longer owns the "
                         "sandbox's partition");
        break;
    case SBX_E_SHARD_UNAVAILABLE:
        snprintf(msg, n, "the write's replication to etcd has an unknown outcome (etcd did not "
                         "answer, or kept refusing): it may or may not take effect; the shard "
                         "stops serving until it has reloaded from etcd — read the state back, "
                         "or retry with the same request id");
        break;
    case SBX_E_INTERRUPTED:
        snprintf(msg, n, "the write's replication has an unknown outcome (the sandbox's "
                         "partition moved to another shard meanwhile): it may or may not have "
                         "taken effect — read the state back, or retry with the same request id");
        break;
    default:
        snprintf(msg, n, "the change could not be committed (%s); the sandbox keeps its last "
                         "acknowledged state", sbx_err_message(code));
        break;
    }
}

void
shard_deliver_error(struct sop *op, int code)
{
    op->transient = true; /* not committed: a retry must run again */
    op->code = code;
    sbx_werr w;
    char msg[256];
    commit_failure_msg(code, msg, sizeof(msg));
    sbx_werr_init(&w, code, "%s", msg);
    /* The operation ran (its change is undone): a gateway must not re-send
     * it as it does a WRONG_OWNER that ran nothing (docs/protocol.md §2). */
    sbx_enc_kbool(sbx_werr_ctx(&w), "ran", true);
    if (op->req.sandbox.n)
        sbx_enc_kstrn(sbx_werr_ctx(&w), "sandboxId", op->req.sandbox.p, op->req.sandbox.n);
    if (op->req.op.n)
        sbx_enc_kstrn(sbx_werr_ctx(&w), "operation", op->req.op.p, op->req.op.n);
    char *buf;
    size_t len;
    if (sbx_wire_reply_err(op->req.id, &w, &buf, &len) == 0)
        shard_deliver(op, buf, len);
    else
        sop_free(op);
    sbx_werr_free(&w);
}

/* Whether held reply h depends on a write of its actor that failed. */
static bool
held_failed(struct shard *sh, const struct held *h, int *code)
{
    /* Not h->need: it is h->dep, or the later write of the reply to the
     * idempotency table, which is no write of the actor (a failed range of
     * the actor may span it, and the operation's own write committed). */
    struct actor *a = h->sandbox[0] ? actor_get(sh, h->sandbox, false) : NULL;
    if (!a || !(actor_write_failed(a, h->dep) || actor_write_failed(a, h->own)))
        return false;
    *code = actor_write_failed(a, h->dep) ? actor_failed_code(a, h->dep)
                                          : actor_failed_code(a, h->own);
    return true;
}

void
shard_commit_wait(struct actor *a)
{
    a->cwnext = a->sh->cwait;
    a->sh->cwait = a;
}

/* The gate ops whose write is decided go on (actor_commit_continue). */
static void
continue_waiting(struct shard *sh)
{
    struct actor *ready = NULL, **pp = &sh->cwait;
    while (*pp) {
        struct actor *a = *pp;
        if (a->cw_seq > sh->decided || !cluster_gate_open(sh, a->cw_seq)) {
            pp = &a->cwnext;
            continue;
        }
        *pp = a->cwnext;
        a->cwnext = ready;
        ready = a;
    }
    /* Continuing may queue further waits: the list is detached first. */
    while (ready) {
        struct actor *a = ready;
        ready = a->cwnext;
        a->cwnext = NULL;
        actor_commit_continue(a);
    }
}

void
shard_release_held(struct shard *sh)
{
    continue_waiting(sh);
    struct held **pp = &sh->held;
    while (*pp) {
        struct held *h = *pp;
        int code;
        if (held_failed(sh, h, &code)) {
            *pp = h->next;
            free(h->buf);
            shard_deliver_error(h->op, code);
            free(h);
            continue;
        }
        if (h->need > sh->decided || !cluster_gate_open(sh, h->need)) {
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        shard_deliver(h->op, h->buf, h->len);
        free(h);
    }
}

void
shard_fail_held(struct shard *sh, const char *id, uint64_t seq, int code, const char *msg)
{
    (void)msg; /* the code says it: commit_failure_msg */
    /* Every write of the actor from seq on was made on top of the one that
     * failed: the replies that depend on them fail, in flight ones too. */
    struct actor *a = actor_get(sh, id, false);
    uint64_t reset = sh->part_reset_seq[sbx_place_partition(id, strlen(id))];
    if (a && seq <= reset)
        a = NULL; /* its partition's records were replaced since: see below */
    if (a && !actor_write_failed(a, seq))
        actor_mark_failed(a, seq, code);
    struct held **pp = &sh->held;
    while (*pp) {
        struct held *h = *pp;
        /* h->need is not looked at: see held_failed.  A write made before
         * the partition's records were replaced fails only the replies of
         * that incarnation, not those of writes made on the reloaded ones. */
        if ((h->dep < seq && h->own < seq) || strcmp(h->sandbox, id) ||
            (seq <= reset && (h->dep > reset || h->own > reset))) {
            pp = &h->next;
            continue;
        }
        *pp = h->next;
        free(h->buf);
        shard_deliver_error(h->op, code);
        free(h);
    }
}

/* The record writes first..last are decided (rc): each actor's durable
 * image moves on, or its record goes back to it (actor_commit_failed). */
static void
settle_writes(struct shard *sh, uint64_t first, uint64_t last, int rc)
{
    while (sh->pw_head && sh->pw_head->seq <= last) {
        struct pwrite *w = sh->pw_head;
        sh->pw_head = w->next;
        if (!sh->pw_head)
            sh->pw_tail = NULL;
        struct actor *a = w->seq >= first ? actor_get(sh, w->id, false) : NULL;
        if (a && w->seq <= sh->part_reset_seq[a->part])
            a = NULL; /* an earlier incarnation's write (shard_int.h part_reset_seq) */
        if (a && rc != 0) {
            actor_commit_failed(a, w->seq, rc);
        } else if (a && actor_write_failed(a, w->seq)) {
            a->restore = true; /* an undone write is in LMDB until a later one commits */
        } else if (a) {
            free(a->durable);
            a->durable = w->img;
            a->durable_len = w->len;
            w->img = NULL;
            a->restore = false;
        }
        if (!w->img && rc == 0 && cluster_on(sh)) {
            /* A committed delete: kept until its replication is decided
             * (shard_unreplicated_delete). */
            w->next = NULL;
            if (sh->rd_tail)
                sh->rd_tail->next = w;
            else
                sh->rd_head = w;
            sh->rd_tail = w;
            continue;
        }
        free(w->img);
        free(w);
    }
}

void
shard_forget_replicated_deletes(struct shard *sh)
{
    /* Replication is in write order: the decided ones are at the head. */
    while (sh->rd_head && cluster_gate_open(sh, sh->rd_head->seq)) {
        struct pwrite *w = sh->rd_head;
        sh->rd_head = w->next;
        if (!sh->rd_head)
            sh->rd_tail = NULL;
        free(w);
    }
}

uint64_t
shard_unreplicated_delete(struct shard *sh, const char *id)
{
    shard_forget_replicated_deletes(sh);
    uint64_t seq = 0;
    for (const struct pwrite *w = sh->rd_head; w; w = w->next)
        if (!strcmp(w->id, id))
            seq = w->seq;
    return seq;
}

static void
commit_loop(sbx_loop *l, void *arg)
{
    struct commit_note *n = arg;
    struct shard *sh = n->sh;
    (void)l;
    int code = n->rc == SBX_E_STORAGE_FULL ? SBX_E_STORAGE_FULL : SBX_E_STORAGE;
    settle_writes(sh, n->first, n->last, n->rc ? code : 0);
    if (n->rc != 0) {
        sh->store_failures++;
        /* Replies of writes with no actor (any more) in the range. */
        struct held **pp = &sh->held;
        while (*pp) {
            struct held *h = *pp;
            if (h->need < n->first || h->need > n->last) {
                pp = &h->next;
                continue;
            }
            if (h->need == h->op->idem_seq && h->dep < n->first && h->own < n->first) {
                /* Only the reply's record in the idempotency table failed:
                 * the operation's write is another one (committed, or
                 * judged by its own note and idem_gate_check), so the reply
                 * stands and waits for that write alone.  The reply stays
                 * in memory (idem_done); a retry after a restart finds the
                 * op's intent, if any, or nothing. */
                h->need = SBX_MAX(h->dep, h->own);
                pp = &h->next;
                continue;
            }
            *pp = h->next;
            free(h->buf);
            shard_deliver_error(h->op, code);
            free(h);
        }
    }
    if (n->last > sh->decided)
        sh->decided = n->last;
    shard_release_held(sh);
    free(n);
}

/* Note a record write of sandbox id for settle_writes; takes img. */
static void
track_write(struct shard *sh, uint64_t seq, const char *id, char *img, size_t len)
{
    struct pwrite *w = sbx_xcalloc(1, sizeof(*w));
    w->seq = seq;
    snprintf(w->id, sizeof(w->id), "%s", id);
    w->img = img;
    w->len = len;
    if (sh->pw_tail)
        sh->pw_tail->next = w;
    else
        sh->pw_head = w;
    sh->pw_tail = w;
}

/* The write sandbox id's next record write is made on top of: its last
 * one not yet decided, unless that one is known to have failed (the record
 * went back to its durable image: actor_commit_failed), else 0.  The store
 * fails the next write if this one fails (sbx_store_put_after): a change
 * answered as failed never becomes durable through a later write of the
 * actor queued before the failure was known (issue 11's fill fault). */
static uint64_t
write_base(struct shard *sh, const char *id)
{
    uint64_t seq = 0;
    for (const struct pwrite *w = sh->pw_head; w; w = w->next)
        if (!strcmp(w->id, id))
            seq = w->seq;
    struct actor *a = seq ? actor_get(sh, id, false) : NULL;
    return a && actor_write_failed(a, seq) ? 0 : seq;
}

static void
release_store(sbx_loop *l, void *arg)
{
    struct shard *sh = arg;
    (void)l;
    if (!sh->store_held)
        return; /* the store was closed meanwhile (shard.c clears the flag first) */
    sh->store_held = false;
    sbx_store_release(sh->store);
}

/* Hold the store until the current loop callback has ended (a posted
 * callback runs after it): a state write and the recorded reply of its
 * operation, made later in the same callback, are then taken by one batch
 * and committed together (idem_persist uses sbx_store_put_with).  Without
 * it the writer could commit the write alone, and a crash before the
 * reply's record left a change whose retry runs again: a destroy retried
 * after a kill -9 answered `destroyed: false` (make faults-smoke,
 * not_linearizable). */
static void
hold_store(struct shard *sh)
{
    if (sh->store_held)
        return;
    sh->store_held = true;
    sbx_store_hold(sh->store);
    sbx_loop_post(sh->loop, release_store, sh);
}

uint64_t
shard_store_record(struct shard *sh, struct sbx_record *r)
{
    char *buf;
    size_t len;
    r->updated_ms = sbx_wall_ms();
    if (sbx_record_encode(r, &buf, &len) != 0)
        return 0;
    hold_store(sh);
    uint64_t seq = sbx_store_put_after(sh->store, SBX_DB_SANDBOXES, r->id, strlen(r->id), buf,
                                       len, write_base(sh, r->id));
    sh->part_seq[sbx_place_partition(r->id, strlen(r->id))] = seq;
    cluster_replicate(sh, seq, r->id, buf, len);
    track_write(sh, seq, r->id, buf, len);
    return seq;
}

uint64_t
shard_store_delete(struct shard *sh, const char *id)
{
    hold_store(sh);
    uint64_t seq = sbx_store_del_after(sh->store, SBX_DB_SANDBOXES, id, strlen(id),
                                       write_base(sh, id));
    /* The destroy's tombstone: a handoff waits for it (actor_partition_quiesce);
     * kept per partition because the actor may be freed before it commits. */
    sh->part_seq[sbx_place_partition(id, strlen(id))] = seq;
    cluster_replicate(sh, seq, id, NULL, 0);
    track_write(sh, seq, id, NULL, 0);
    return seq;
}
