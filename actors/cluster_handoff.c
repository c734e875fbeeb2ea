/*
 * cluster_handoff.c — handing partitions from shard to shard (cluster.h;
 * docs/cluster.md "Handoff"): handoff-out (the loop's quiesce and read of
 * the records, the control thread's copy, switch in etcd and read-back of
 * a switch whose outcome is not known), handoff-in (partition.import), and
 * the purge of a set of partitions' local records.
 *
 * A handoff of partitions P from this shard (A) to B:
 *   loop: mark P moving (requests for P get WRONG_OWNER: the gateway retries),
 *         let in-flight operations finish (HANDOFF_GRACE_MS, then interrupt
 *         them), stop P's containers as an idle sleep would, wait until every
 *         write is decided, read P's records from LMDB;
 *   ctl:  send P's persistent workspaces to B (workspace.put, ws_move.c;
 *         a failure ends the handoff here), send the records to B
 *         (partition.import over nng; B commits them before answering), then switch the owner of each partition in etcd with a
 *         transaction comparing owner and epoch; the new epoch is the key's
 *         new mod_revision;
 *   loop: drop P's actors and local records (on failure: serve P again).
 * Clients see at most a retry; no acknowledged write is lost: it is in B's
 * LMDB before the switch, and in etcd anyway.
 */
#include "cluster.h"

#include <nng/nng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../container/workspace.h"
#include "../runtime/cview.h"
#include "../runtime/err.h"
#include "../runtime/etcd.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster_int.h"
#include "shard_int.h"

#define HANDOFF_GRACE_MS 10000
#define IMPORT_TIMEOUT_MS 30000
/* The most the workspaces of one handoff may take to move (ws_move.c): past
 * it the handoff fails and the partitions stay (docs/persistence.md). */
#define WS_MOVE_MS 300000

/* A handoff's rendezvous between the control thread and the loop. */
struct hjob {
    struct cluster *c;
    uint8_t set[SBX_PARTITIONS];
    int64_t started_ms;
    bool done;
    int rc;
    sbx_enc recs;         /* array of [id, record] */
    sbx_enc idem;         /* array of [idempotency key, entry] (idem_export) */
    size_t nrecs;
    char **ids;           /* the local records, deleted after a switch */
    size_t nids;
    uint64_t timer;
    uint8_t kept[SBX_PARTITIONS]; /* ctl: partitions of set etcd still shows ours after
                                     the switch (served again) */
    uint8_t skipped[SBX_PARTITIONS]; /* loop: asked for but not handed off: their records
                                        are not loaded (job_begin) */
};

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
void
cluster_purge_partitions(struct shard *sh, const uint8_t *set)
{
    struct scan s = {set, NULL, 0, NULL, 0};
    uint64_t reset = sbx_store_last_seq(sh->store);
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (set[p])
            sh->part_reset_seq[p] = reset;
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
    sbx_enc_init(&j->idem);
    sbx_enc_array(&j->idem);
    idem_export(sh, j->set, &j->idem);
    sbx_enc_end(&j->idem);
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
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        if (!j->set[p])
            continue;
        if (!c->lp[p].ready) {
            /* Its records are not (or no longer) in LMDB: it was claimed
             * and its load from etcd is pending or failed, or a fence
             * reset it.  A copy from LMDB would hand B an empty or stale
             * partition over acknowledged records in etcd (the fault test
             * found sandboxes gone after such a handoff); it stays ours and
             * moves at a later reconcile, once loaded. */
            j->set[p] = 0;
            j->skipped[p] = 1;
            continue;
        }
        c->lp[p].moving = true;
    }
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
            if (gone[sbx_place_partition(j->ids[i], strlen(j->ids[i]))]) {
                sbx_store_del(sh->store, SBX_DB_SANDBOXES, j->ids[i], strlen(j->ids[i]));
                /* Its workspace is B's now (cluster_ws_push_set): ours goes. */
                char wd[1024];
                if (sbx_ws_dir(sh->conf.data, j->ids[i], wd, sizeof(wd)) == 0)
                    sbx_ws_remove(wd);
            }
        actor_partition_drop(sh, gone);
    }
    for (size_t i = 0; i < j->nids; i++)
        free(j->ids[i]);
    free(j->ids);
    sbx_enc_free(&j->recs);
    sbx_enc_free(&j->idem);
    c->job = NULL;
    free(j);
    free(e);
}

/* ------------------------------------------------------------------------------ */
/* Control thread: handoff-out (copy, switch). */

/* Send records to B over nng: partition.import. */
static int
send_import(struct cluster *c, const char *url, struct hjob *j)
{
    struct shard *sh = c->sh;
    char *recs;
    size_t rl;
    char *idm;
    size_t il;
    if (sbx_enc_finish(&j->recs, &recs, &rl) != 0)
        return SBX_E_INTERNAL;
    sbx_enc_init(&j->recs); /* consumed */
    if (sbx_enc_finish(&j->idem, &idm, &il) != 0) {
        free(recs);
        return SBX_E_INTERNAL;
    }
    sbx_enc_init(&j->idem);
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
    sbx_enc_str(&e, "idem");
    sbx_enc_raw(&e, idm, il);
    /* The doubt windows go along (cluster_in_doubt): requests an owner
     * before us ran are in neither table. */
    sbx_enc_karray(&e, "doubt");
    int64_t now = sbx_wall_ms();
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        int64_t until = atomic_load(&c->doubt_until[p]);
        if (j->set[p] && until > now) {
            sbx_enc_array(&e);
            sbx_enc_int(&e, p);
            sbx_enc_int(&e, until);
            sbx_enc_end(&e);
        }
    }
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    free(recs);
    free(idm);
    char *buf;
    size_t len;
    if (sbx_enc_finish(&e, &buf, &len) != 0)
        return SBX_E_INTERNAL;
    nng_socket s;
    int rv = sbx_nng_req_dial(&s, url, sh->conf.sec, NULL);
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
                /* Which step failed and how, for the "handoff … failed"
                 * line that follows (a timeout here: no connection was
                 * made to the new owner in IMPORT_TIMEOUT_MS). */
                sbx_log_warn("shard %s: partition.import to %s not sent: %s", sh->conf.name,
                             url, nng_strerror(nng_aio_result(aio)));
                nng_msg_free(m);
            } else {
                nng_recv_aio(s, aio);
                nng_aio_wait(aio);
                if (nng_aio_result(aio) != 0)
                    sbx_log_warn("shard %s: partition.import to %s sent, no answer: %s",
                                 sh->conf.name, url, nng_strerror(nng_aio_result(aio)));
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
        if (atomic_load(&c->stop) || cluster_fenced(c))
            return rc;
        if (attempt == 0)
            sbx_log_warn("shard %s: the switch of %zu partition(s) has an unknown outcome and "
                     "cannot be read back (%s); they serve nothing until it can",
                     sh->conf.name, n, sbx_err_message(rc));
        cluster_nap_ms(SBX_MIN(50 << SBX_MIN(attempt, 4), 500));
    }
}

void
cluster_handoff(struct cluster *c, int target, const char *tname, const char *turl,
                const uint32_t *parts, size_t n, const int64_t *epochs)
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
    /* Only the partitions the loop took (job_begin skips those not loaded). */
    uint32_t *hp = sbx_xcalloc(n ? n : 1, sizeof(*hp));
    int64_t *he = sbx_xcalloc(n ? n : 1, sizeof(*he));
    size_t nn = 0;
    for (size_t i = 0; i < n; i++)
        if (j->set[parts[i]]) {
            hp[nn] = parts[i];
            he[nn++] = epochs[i];
        }
    parts = hp;
    epochs = he;
    n = nn;
    if (n && j->done && !cluster_fenced(c)) {
        /* The persistent workspaces first (ws_move.c): B has each one on
         * its disk, checked, before its records — and so before the switch
         * makes B serve them.  Their containers are stopped (job_check). */
        size_t moved = 0;
        _cleanup_err_ sbx_err_t werr = NULL;
        int64_t tw = sbx_mono_ms();
        int rc = cluster_ws_push_set(sh, tname, turl, j->ids, j->nids, tw + WS_MOVE_MS, &moved,
                                     &werr);
        if (rc)
            sbx_log_warn("shard %s: handoff of %zu partition(s) to %s: a workspace could not "
                         "move (%s): they stay here",
                         sh->conf.name, n, tname, sbx_err_msg(werr));
        else if (moved)
            sbx_log_info("shard %s: moved %zu workspace(s) to %s in %lld ms", sh->conf.name, moved,
                         tname, (long long)(sbx_mono_ms() - tw));
        if (rc == 0)
            rc = send_import(c, turl, j);
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
        } else if (!werr) {
            sbx_log_warn("shard %s: handoff of %zu partition(s) to %s failed: %s", sh->conf.name, n,
                     tname, sbx_err_message(rc));
        }
    }
    if (ok)
        sbx_log_info("shard %s: handed %zu partition(s) (%zu record(s)) to %s in %lld ms",
                 sh->conf.name, n, j->nrecs, tname, (long long)(sbx_mono_ms() - t0));
    free(hp);
    free(he);
    struct jend *je = sbx_xcalloc(1, sizeof(*je));
    je->c = c;
    je->j = j;
    je->ok = ok;
    sbx_loop_post(sh->loop, job_end, je);
}

/* ------------------------------------------------------------------------------ */
/* partition.import {from, partitions: [p…], records: [[id, record]…]} */

void
cluster_op_import(struct sop *op)
{
    struct shard *sh = op->sh;
    struct cluster *c = cluster_of(sh);
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
    cluster_purge_partitions(sh, set);
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
    /* The recorded replies of their sandboxes (optional: an older sender
     * has none). */
    const msgpack_object *idm = NULL;
    if (sbx_wire_get_array(op->req.args, "idem", &idm) != 0)
        idm = NULL;
    size_t ni = idem_import(sh, idm);
    /* The sender's doubt windows (optional: [[partition, until ms]…]). */
    const msgpack_object *dbt = NULL;
    if (sbx_wire_get_array(op->req.args, "doubt", &dbt) == 0) {
        for (uint32_t i = 0; i < dbt->via.array.size; i++) {
            const msgpack_object *d = &dbt->via.array.ptr[i];
            if (d->type != MSGPACK_OBJECT_ARRAY || d->via.array.size != 2 ||
                d->via.array.ptr[0].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                d->via.array.ptr[1].type != MSGPACK_OBJECT_POSITIVE_INTEGER ||
                d->via.array.ptr[0].via.u64 >= SBX_PARTITIONS ||
                !set[d->via.array.ptr[0].via.u64])
                continue;
            uint32_t p = (uint32_t)d->via.array.ptr[0].via.u64;
            int64_t until = (int64_t)SBX_MIN(d->via.array.ptr[1].via.u64, (uint64_t)INT64_MAX);
            if (until > atomic_load(&c->doubt_until[p]))
                atomic_store(&c->doubt_until[p], until);
        }
    }
    int64_t now = sbx_wall_ms();
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (set[p]) {
            c->lp[p].imported_ms = now;
            c->lp[p].imported_from = fidx;
        }
    sbx_log_info("shard %s: imported %zu record(s) and %zu recorded repl%s of %u partition(s) "
                 "from %s",
                 sh->conf.name, n, ni, ni == 1 ? "y" : "ies", parts->via.array.size, fname);
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
