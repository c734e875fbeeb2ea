/*
 * audit.c — the shard's audit log (issue 16; docs/security.md §6): an
 * append-only table of who changed what, for deployments with API keys.
 *
 * An entry is written for each operation that changes something (`mutates`,
 * or an agent op that is not `readonly`: the same set the idempotency table
 * records, docs/protocol.md §2) once its reply has been sent, when the
 * gateway stamped the caller's key id into the route (it does only with API
 * keys: keyless deployments write nothing).  Refusals at intake (a bad
 * envelope, a quota, a key) never reach a shard and are not in it.
 *
 * Key: the wall time in ms and a per-shard sequence number, both 8 bytes
 * big-endian, so the table reads in time order.  Value: a msgpack map
 * {at (ms since the epoch), keyId, tenant, op, sandbox (the internal ID),
 * requestId, result ("ok" or the error code)}.  It is written through the
 * store's writer like every other write (the group commit: no fsync of its
 * own), not replicated, and not carried by a handoff: each shard keeps the
 * entries of the operations it ran.
 *
 * Retention: at most AUDIT_MAX entries and AUDIT_AGE_MS of age per shard;
 * each append deletes up to AUDIT_TRIM of the oldest entries beyond either
 * bound, so the table converges to the bound without a sweep.
 */
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/store.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "shard_int.h"

#define AUDIT_MAX 100000                          /* entries per shard */
#define AUDIT_AGE_MS (30LL * 24 * 3600 * 1000)    /* 30 days */
#define AUDIT_TRIM 8                              /* deletions per append at most */
#define AUDIT_LIST_MAX 1000                       /* entries per audit.list answer */

static void
put_be64(uint8_t *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (uint8_t)v;
}

static uint64_t
get_be64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | p[i];
    return v;
}

struct count_ctx {
    int64_t n;
    uint64_t last_seq;
};

static int
count_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct count_ctx *c = arg;
    (void)v;
    (void)vn;
    c->n++;
    if (kn == 16 && get_be64((const uint8_t *)k + 8) > c->last_seq)
        c->last_seq = get_be64((const uint8_t *)k + 8);
    return 0;
}

void
shard_audit_open(struct shard *sh)
{
    struct count_ctx c = {0, 0};
    sbx_store_foreach(sh->store, SBX_DB_AUDIT, count_one, &c);
    sh->audit.count = c.n;
    sh->audit.seq = c.last_seq;
}

/* The oldest keys to delete: beyond the count or the age. */
struct trim_ctx {
    int64_t excess;
    int64_t cutoff_ms;
    uint8_t keys[AUDIT_TRIM][16];
    int n;
};

static int
trim_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct trim_ctx *t = arg;
    (void)v;
    (void)vn;
    if (kn != 16 || t->n >= AUDIT_TRIM)
        return 1;
    if (t->excess <= t->n && (int64_t)get_be64(k) >= t->cutoff_ms)
        return 1; /* in bounds: everything after it is newer */
    memcpy(t->keys[t->n++], k, 16);
    return 0;
}

static bool
audited_op(const struct sbx_op_def *def)
{
    if (def->flags & SBX_OP_MUTATES)
        return true;
    return (def->flags & SBX_OP_AGENT) && !(def->flags & SBX_OP_READONLY);
}

void
shard_audit_reply(struct sop *op)
{
    struct shard *sh = op->sh;
    if (!op->audit_key[0] || !op->def || !audited_op(op->def))
        return;
    int64_t now = sbx_wall_ms();
    uint8_t key[16];
    put_be64(key, (uint64_t)now);
    put_be64(key + 8, ++sh->audit.seq);
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "at", now);
    sbx_enc_kstr(&e, "keyId", op->audit_key);
    sbx_enc_kstr(&e, "tenant", op->tenant);
    sbx_enc_kstr(&e, "op", op->def->name);
    sbx_enc_kstrn(&e, "sandbox", op->req.sandbox.p, op->req.sandbox.n);
    sbx_enc_kstrn(&e, "requestId", op->req.id.p, op->req.id.n);
    sbx_enc_kstr(&e, "result", op->code ? sbx_err_name(op->code) : "ok");
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) != 0)
        return;
    sbx_store_put(sh->store, SBX_DB_AUDIT, key, sizeof(key), buf, len);
    free(buf);
    sh->audit.count++;
    struct trim_ctx t = {.excess = sh->audit.count - AUDIT_MAX, .cutoff_ms = now - AUDIT_AGE_MS};
    sbx_store_foreach(sh->store, SBX_DB_AUDIT, trim_one, &t);
    for (int i = 0; i < t.n; i++) {
        sbx_store_del(sh->store, SBX_DB_AUDIT, t.keys[i], 16);
        sh->audit.count--;
    }
}

/* audit.list's walk: the entries at or after `since` of `tenant` (NULL:
 * any), at most `limit` of the newest. */
struct list_ctx {
    int64_t since;
    sbx_str tenant;
    int64_t limit;
    char **vals;
    size_t *lens;
    int64_t n, head; /* a ring of the last `limit` matches */
};

static int
list_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct list_ctx *l = arg;
    if (kn != 16 || (int64_t)get_be64(k) < l->since)
        return 0;
    if (l->tenant.n) {
        sbx_msg m;
        sbx_str t = {"", 0};
        bool match = false;
        if (sbx_wire_decode(&m, v, vn, &sbx_wire_limits_reply) == 0) {
            match = sbx_wire_get_str(m.root, "tenant", &t) == 0 && t.n == l->tenant.n &&
                    !memcmp(t.p, l->tenant.p, t.n);
            sbx_wire_msg_free(&m);
        }
        if (!match)
            return 0;
    }
    int64_t slot = l->n < l->limit ? l->n : l->head;
    free(l->vals[slot]);
    l->vals[slot] = sbx_xmalloc(vn);
    memcpy(l->vals[slot], v, vn);
    l->lens[slot] = vn;
    if (l->n < l->limit)
        l->n++;
    else
        l->head = (l->head + 1) % l->limit;
    return 0;
}

void
shard_op_audit_list(struct sop *op)
{
    struct shard *sh = op->sh;
    struct list_ctx l = {.since = 0, .limit = 100};
    sbx_wire_get_i64(op->req.args, "since", &l.since);
    sbx_wire_get_i64(op->req.args, "limit", &l.limit);
    sbx_wire_get_str(op->req.args, "tenant", &l.tenant);
    l.limit = SBX_MAX(1, SBX_MIN(l.limit, AUDIT_LIST_MAX));
    l.vals = sbx_xcalloc((size_t)l.limit, sizeof(char *));
    l.lens = sbx_xcalloc((size_t)l.limit, sizeof(size_t));
    int rc = sbx_store_foreach(sh->store, SBX_DB_AUDIT, list_one, &l);
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_karray(&e, "entries");
    for (int64_t i = 0; i < l.n; i++) {
        int64_t slot = l.n < l.limit ? i : (l.head + i) % l.limit;
        sbx_enc_raw(&e, l.vals[slot], l.lens[slot]);
    }
    sbx_enc_end(&e);
    for (int64_t i = 0; i < l.limit; i++)
        free(l.vals[i]);
    free(l.vals);
    free(l.lens);
    if (rc) {
        sbx_enc_free(&e);
        shard_reply_err(op, SBX_E_STORAGE, "cannot read the audit log: %s", sbx_err_message(rc));
        return;
    }
    shard_reply_end(op, &e, 0);
}
