/*
 * test_gate.c — unit tests for the shard's output gate (actors/gate.c,
 * docs/protocol.md §4.1) over a real store with a 1 MiB map that cannot
 * grow.
 *
 * Covers: a failed write N followed by a write N+1 of the same sandbox
 * made before N's failure was known, which would fit: both count as failed
 * (their replies carry STORAGE_FULL), N+1 is not committed either (the
 * store fails a write made on top of a failed one: sbx_store_put_after),
 * the record goes back to the last committed image and LMDB never holds
 * N+1; a write made after the failure is acknowledged normally; after a
 * failed last write, a read waits for nothing and carries no failure; when
 * the rewrite of the acknowledged record fails too (the store is full),
 * LMDB still holds the acknowledged record, never the undone one.
 *
 * Why N+1 must fail too: it is made on top of N's change (an env.set merges
 * into the record N's op left in memory), and before this rule the failure
 * reloaded the record from LMDB, so whether N+1's change survived in
 * memory depended on whether N+1 had committed by then — an acknowledged
 * N+1 could be erased by the next write.  That race is not reproducible on
 * demand; this test checks the rule that removes it.
 *
 * A reply's record in the idempotency table (idem.c) is a store write of its
 * own, made after the operation's: when only that write fails (the reply
 * does not fit; a failed record write of the actor made after the op's
 * committed one spans it), the operation's committed change is answered
 * as done, not as STORAGE_FULL (issue 11; the fault test's
 * failed_write_visible: a value answered as failed and read back later).
 *
 * The test drives one actor's record writes the way the actor does
 * (shard_store_record, a->last_seq) and runs the shard's loop itself to
 * deliver the store's commit notes.  Each test works in its own mkdtemp
 * directory, removed by the fixture's fini even when an assertion fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "actors/shard_int.h"
#include "runtime/err.h"
#include "runtime/loop.h"
#include "runtime/store.h"
#include "runtime/util.h"
#include "runtime/wire.h"

static char tmpdir[64];
static struct shard *sh; /* torn down by the fini */

static void
setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sbx-test-gate-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    sh = sbx_xcalloc(1, sizeof(*sh));
    cr_assert_eq(sbx_loop_new(&sh->loop), 0);
    sh->actors.nbuckets = 64;
    sh->actors.buckets = sbx_xcalloc(sh->actors.nbuckets, sizeof(*sh->actors.buckets));
    sh->idem.nbuckets = 64;
    sh->idem.buckets = sbx_xcalloc(sh->idem.nbuckets, sizeof(*sh->idem.buckets));
    char dir[96];
    snprintf(dir, sizeof(dir), "%s/data", tmpdir);
    int rc = sbx_store_open(&sh->store, dir, 1ull << 20, 0, shard_commit_cb, sh);
    cr_assert_eq(rc, 0, "sbx_store_open: %s", sbx_err_message(rc));
}

static void
stop_cb(sbx_loop *l, void *arg)
{
    (void)arg;
    sbx_loop_stop(l);
}

/* Run the shard's loop for a moment: the commit notes posted so far are handled. */
static void
drain(void)
{
    sbx_loop_timer(sh->loop, 50, stop_cb, NULL);
    sbx_loop_run(sh->loop);
}

static void
teardown(void)
{
    if (sh) {
        sh->store_held = false; /* as the shard does: the posted release is a no-op */
        if (sh->store)
            sbx_store_close(sh->store);
        drain(); /* the last notes: their memory */
        actor_free_all(sh);
        while (sh->held) {
            struct held *h = sh->held;
            sh->held = h->next;
            free(h->buf);
            sop_free(h->op);
            free(h);
        }
        idem_free_all(sh);
        free(sh->idem.buckets);
        while (sh->pw_head) {
            struct pwrite *w = sh->pw_head;
            sh->pw_head = w->next;
            free(w->img);
            free(w);
        }
        sbx_loop_free(sh->loop);
        free(sh->actors.buckets);
        free(sh);
        sh = NULL;
    }
    if (tmpdir[0]) {
        int rc = sbx_rm_rf(tmpdir);
        cr_expect_eq(rc, 0, "removing %s: %s", tmpdir, strerror(-rc));
    }
}

TestSuite(gate, .init = setup, .fini = teardown, .timeout = 60);

/* The env blob {k: vlen bytes of 'x'} (heap, caller frees). */
static char *
env_blob(const char *k, size_t vlen, size_t *len)
{
    char *v = sbx_xmalloc(vlen);
    memset(v, 'x', vlen);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstrn(&e, k, v, vlen);
    sbx_enc_end(&e);
    char *buf;
    cr_assert_eq(sbx_enc_finish(&e, &buf, len), 0);
    free(v);
    return buf;
}

/* What an op does: change the actor's env, write the record. */
static uint64_t
write_env(struct actor *a, const char *k, size_t vlen)
{
    size_t len;
    char *blob = env_blob(k, vlen, &len);
    free(a->rec.env);
    a->rec.env = blob;
    a->rec.env_len = len;
    a->last_seq = shard_store_record(sh, &a->rec);
    cr_assert_gt(a->last_seq, 0u);
    return a->last_seq;
}

/* Whether env (a msgpack map blob) is exactly {k: vlen bytes}; *what
 * describes it. */
static bool
env_is(const char *env, size_t env_len, const char *k, size_t vlen, char *what, size_t whatlen)
{
    sbx_msg m;
    snprintf(what, whatlen, "none");
    if (!env || sbx_wire_decode(&m, env, env_len, &sbx_wire_limits_request) != 0)
        return false;
    bool ok = m.root->type == MSGPACK_OBJECT_MAP && m.root->via.map.size == 1;
    sbx_str key = {"", 0}, val = {"", 0};
    if (ok) {
        sbx_wire_obj_str(&m.root->via.map.ptr[0].key, &key);
        sbx_wire_obj_str(&m.root->via.map.ptr[0].val, &val);
    }
    snprintf(what, whatlen, "{%.*s: %zu bytes} (%u keys)", (int)key.n, key.p, val.n,
             m.root->type == MSGPACK_OBJECT_MAP ? m.root->via.map.size : 0);
    sbx_wire_msg_free(&m);
    return ok && sbx_str_eq(key, k) && val.n == vlen;
}

static void
expect_env(const char *where, const char *env, size_t env_len, const char *k, size_t vlen)
{
    char what[128];
    cr_expect(env_is(env, env_len, k, vlen, what, sizeof(what)),
              "%s: the environment is %s, want {%s: %zu bytes}", where, what, k, vlen);
}

/* Whether LMDB's record of id has exactly the environment {k: vlen bytes}. */
static bool
stored_env_is(const char *id, const char *k, size_t vlen)
{
    char *val = NULL, what[128];
    size_t vn = 0;
    struct sbx_record r;
    bool is = false;
    if (sbx_store_get(sh->store, SBX_DB_SANDBOXES, id, strlen(id), &val, &vn) != 0)
        return false;
    if (sbx_record_decode(val, vn, &r) == 0) {
        is = env_is(r.env, r.env_len, k, vlen, what, sizeof(what));
        sbx_record_free(&r);
    }
    free(val);
    return is;
}

static void
expect_stored_env(const char *id, const char *k, size_t vlen)
{
    char *val = NULL;
    size_t vn = 0;
    cr_assert_eq(sbx_store_get(sh->store, SBX_DB_SANDBOXES, id, strlen(id), &val, &vn), 0);
    struct sbx_record r;
    cr_assert_eq(sbx_record_decode(val, vn, &r), 0);
    expect_env("in LMDB", r.env, r.env_len, k, vlen);
    sbx_record_free(&r);
    free(val);
}

Test(gate, a_later_write_made_on_top_of_a_failed_one_is_undone_with_it)
{
    struct actor *a = actor_get(sh, "gate-a", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");

    /* Acknowledged: {A}. */
    uint64_t s1 = write_env(a, "A", 10);
    cr_assert_eq(sbx_store_wait(sh->store, s1), 0);
    drain();
    cr_expect(!actor_write_failed(a, s1), "the committed write counts as failed");

    /* N: {BIG} does not fit the map.  N+1: {B} (BIG unset, B set), made
     * before N's failure is known (the loop has not run), would fit: it is
     * not committed either (before sbx_store_put_after it was, and a crash
     * before the rewrite below left it in LMDB — issue 11's fill fault). */
    uint64_t n = write_env(a, "BIG", 2u << 20);
    uint64_t n1 = write_env(a, "B", 10);
    cr_assert_eq(sbx_store_wait(sh->store, n), SBX_E_STORAGE_FULL);
    cr_expect_eq(sbx_store_wait(sh->store, n1), SBX_E_STORAGE_FULL,
                 "N+1, made on top of the failed N, was committed");
    expect_stored_env(a->id, "A", 10);
    drain();

    /* Both are failed for the client: N+1 was made on top of N. */
    cr_expect(actor_write_failed(a, n), "the write that did not fit is not failed");
    cr_expect(actor_write_failed(a, n1), "the write made before the failure was known is "
                                         "acknowledged");
    cr_expect_eq(a->bad_code, SBX_E_STORAGE_FULL, "code %d (%s)", a->bad_code,
                 sbx_err_name(a->bad_code));
    /* The actor is back at the last acknowledged record, not at LMDB's N+1. */
    expect_env("in memory", a->rec.env, a->rec.env_len, "A", 10);
    /* ... and writes it again, so N+1 does not stay in LMDB. */
    uint64_t w = a->last_seq;
    cr_assert_gt(w, n1, "no rewrite of the acknowledged record after an undone write committed");
    cr_assert_eq(sbx_store_wait(sh->store, w), 0);
    drain();
    expect_stored_env(a->id, "A", 10);
    cr_expect(!actor_write_failed(a, w), "the rewrite counts as failed");

    /* A write made after the failure is an ordinary one. */
    uint64_t s5 = write_env(a, "C", 10);
    cr_assert_eq(sbx_store_wait(sh->store, s5), 0);
    drain();
    cr_expect(!actor_write_failed(a, s5), "a write after the failure counts as failed");
    expect_stored_env(a->id, "C", 10);
    struct sbx_record r;
    cr_assert_eq(sbx_record_decode(a->durable, a->durable_len, &r), 0);
    expect_env("the durable image", r.env, r.env_len, "C", 10);
    sbx_record_free(&r);
}

Test(gate, a_failed_last_write_leaves_reads_on_the_acknowledged_one)
{
    struct actor *a = actor_get(sh, "gate-b", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
    uint64_t s1 = write_env(a, "A", 10);
    cr_assert_eq(sbx_store_wait(sh->store, s1), 0);
    drain();
    uint64_t n = write_env(a, "BIG", 2u << 20);
    cr_assert_eq(sbx_store_wait(sh->store, n), SBX_E_STORAGE_FULL);
    drain();
    cr_expect(actor_write_failed(a, n));
    expect_env("in memory", a->rec.env, a->rec.env_len, "A", 10);
    /* A read's reply waits for a->last_seq: it must not be the failed write. */
    cr_expect(!actor_write_failed(a, a->last_seq),
              "a read after the failure would carry the failure (last_seq %llu)",
              (unsigned long long)a->last_seq);
    cr_expect_leq(a->last_seq, sh->decided, "a read after the failure would wait");
    expect_stored_env(a->id, "A", 10);
}

/* Run the loop for ms. */
static void
run_for(int64_t ms)
{
    sbx_loop_timer(sh->loop, ms, stop_cb, NULL);
    sbx_loop_run(sh->loop);
}

Test(gate, a_failed_rewrite_leaves_the_acknowledged_record_in_lmdb)
{
    struct actor *a = actor_get(sh, "gate-c", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
    /* Acknowledged: {A: 100 KB}, a record the rewrite needs room for. */
    uint64_t s1 = write_env(a, "A", 100000);
    cr_assert_eq(sbx_store_wait(sh->store, s1), 0);
    drain();

    /* N fails, N+1 (small, on top of N) fails with it; then another key
     * fills the map, so that the rewrite of {A} queued when N's failure is
     * handled fails. */
    uint64_t n = write_env(a, "BIG", 2u << 20);
    uint64_t n1 = write_env(a, "B", 10);
    cr_assert_eq(sbx_store_wait(sh->store, n), SBX_E_STORAGE_FULL);
    cr_expect_eq(sbx_store_wait(sh->store, n1), SBX_E_STORAGE_FULL,
                 "N+1, made on top of the failed N, was committed");
    /* Values of 4 KiB until one does not fit, then of 256 and 16 bytes. */
    static const size_t sizes[] = {4096, 256, 16};
    static char val[4096];
    char k[32];
    int filled = 0;
    for (size_t z = 0; z < SBX_ARRAY_LEN(sizes); z++) {
        for (;;) {
            cr_assert_lt(filled, 20000, "the map never filled");
            snprintf(k, sizeof(k), "fill-%05d", filled);
            uint64_t s = sbx_store_put(sh->store, SBX_DB_META, k, strlen(k), val, sizes[z]);
            if (sbx_store_wait(sh->store, s) != 0)
                break;
            filled++;
        }
    }
    drain();
    uint64_t w = a->last_seq > n1 ? a->last_seq : 0;
    cr_assert_gt(w, 0u, "no rewrite of the acknowledged record after N+1 was undone");
    cr_assert_lt(sbx_store_wait(sh->store, w), 0, "the rewrite fitted: the scenario needs it "
                                                  "to fail");
    drain();
    /* The undone write never reached LMDB: the acknowledged record is there. */
    expect_stored_env(a->id, "A", 100000);

    /* Space again: LMDB and memory hold the acknowledged record. */
    for (int i = 0; i < filled; i++) {
        snprintf(k, sizeof(k), "fill-%05d", i);
        sbx_store_wait(sh->store, sbx_store_del(sh->store, SBX_DB_META, k, strlen(k)));
    }
    for (int i = 0; i < 300 && !stored_env_is(a->id, "A", 100000); i++)
        run_for(100); /* the retry comes once a second; a loaded machine may take longer */
    expect_stored_env(a->id, "A", 100000);
    expect_env("in memory", a->rec.env, a->rec.env_len, "A", 100000);
}

/* An op of sandbox a answering configure, admitted to the idempotency
 * table as the shard does (heap; its reply frees it). */
static struct sop *
configure_op(struct actor *a, const char *rid)
{
    struct sop *op = sbx_xcalloc(1, sizeof(*op));
    op->sh = sh;
    op->actor = a;
    op->def = sbx_op_find("sandbox.configure", strlen("sandbox.configure"));
    cr_assert_not_null(op->def);
    op->req.id = (sbx_str){rid, strlen(rid)};
    op->req.op = (sbx_str){"sandbox.configure", strlen("sandbox.configure")};
    op->req.sandbox = (sbx_str){a->id, strlen(a->id)};
    snprintf(op->id, sizeof(op->id), "%s\x1f%s\x1fsandbox.configure", rid, a->id);
    idem_add(sh, op->id, op);
    return op;
}

/* A success reply of n bytes (heap). */
static char *
ok_reply(const char *rid, size_t n, size_t *len)
{
    char *buf = sbx_xmalloc(n);
    memset(buf, 0x90, n); /* what it holds does not matter here */
    (void)rid;
    *len = n;
    return buf;
}

/* Whether the reply recorded for key id is the success of n bytes (an
 * error reply removes the entry: a retry runs again). */
static void
expect_answered_ok(const char *id, size_t n)
{
    struct idem *e = idem_find(sh, id);
    cr_expect_null(sh->held, "the reply is still held");
    cr_assert_not_null(e, "the committed configure was answered with an error (its entry "
                          "was dropped as a transient failure's)");
    cr_expect(!e->inflight, "the op was not answered");
    cr_expect(!e->interrupted);
    cr_expect_eq(e->len, n, "the answer is %zu bytes, not the success's %zu", e->len, n);
}

Test(gate, a_reply_whose_idempotency_record_does_not_fit_fails_the_write_with_it)
{
    struct actor *a = actor_get(sh, "gate-d", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
    /* 300 KB of the 1 MiB map in use. */
    uint64_t s0 = write_env(a, "A", 300000);
    cr_assert_eq(sbx_store_wait(sh->store, s0), 0);
    drain();

    /* The op's write (small) would fit; its reply of ~1 MB does not.  They
     * are one transaction (sbx_store_put_with): both fail, the op is
     * answered STORAGE_FULL, and nothing of it stays — neither the change
     * (read back later, it would be a write answered as failed that took
     * effect: the fault test's failed_write_visible) nor a reply. */
    struct sop *op = configure_op(a, "req-d");
    uint64_t s1 = write_env(a, "B", 10);
    size_t len;
    char *buf = ok_reply("req-d", 1000000, &len);
    shard_reply(op, buf, len, s1);
    uint64_t i = op->idem_seq; /* op is freed once answered */
    cr_assert_gt(i, s1, "the reply was not recorded in the idempotency table");
    cr_assert_eq(sbx_store_wait(sh->store, i), SBX_E_STORAGE_FULL,
                 "the reply's record fitted: the scenario needs it to fail");
    cr_assert_eq(sbx_store_wait(sh->store, s1), SBX_E_STORAGE_FULL,
                 "the op's write was committed without its reply's record");
    drain();
    cr_expect_null(sh->held, "the reply is still held");
    cr_expect_null(idem_find(sh, "req-d\x1fgate-d\x1fsandbox.configure"),
                   "a failed op's answer was kept: its retry would not run it");
    expect_stored_env(a->id, "A", 300000);
    expect_env("in memory", a->rec.env, a->rec.env_len, "A", 300000);
}

Test(gate, a_failed_later_write_spanning_the_reply_record_leaves_the_committed_op_answered)
{
    struct actor *a = actor_get(sh, "gate-e", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
    /* The op's write commits; then a write N that does not fit is made
     * before the op's reply, whose idempotency record (small, fits) comes
     * after N in the store, and another write N+1 after that. */
    struct sop *op = configure_op(a, "req-e");
    uint64_t s1 = write_env(a, "A", 10);
    cr_assert_eq(sbx_store_wait(sh->store, s1), 0);
    uint64_t n = write_env(a, "BIG", 2u << 20);
    size_t len;
    char *buf = ok_reply("req-e", 64, &len);
    shard_reply(op, buf, len, s1);
    /* N+1, made on top of N before its failure is known: undone with it,
     * so the failed range of the actor spans the reply's record. */
    uint64_t n1 = write_env(a, "C", 10);
    cr_assert_gt(n1, op->idem_seq);
    cr_assert_eq(sbx_store_wait(sh->store, n), SBX_E_STORAGE_FULL);
    drain();
    cr_expect(actor_write_failed(a, n));
    expect_answered_ok("req-e\x1fgate-e\x1fsandbox.configure", len);
    /* The undo keeps the op's value: the acknowledged record. */
    expect_env("in memory", a->rec.env, a->rec.env_len, "A", 10);
}

Test(gate, a_failed_write_of_a_sandbox_with_no_committed_record_drops_its_settings)
{
    /* A sandbox whose creating write failed (the disk was full) while its
     * container started: it stays, with no durable image.  A configure
     * made then fails too; its value must not be read back. */
    struct actor *a = actor_get(sh, "gate-f", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "running");
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "sleepAfter", 5000);
    sbx_enc_end(&e);
    char *cfg;
    size_t cfg_len;
    cr_assert_eq(sbx_enc_finish(&e, &cfg, &cfg_len), 0);
    a->rec.config = cfg;
    a->rec.config_len = cfg_len;
    a->sleep_after_ms = 5000;
    a->cs = C_RUNNING; /* the container's state only: none is started here */
    uint64_t n = write_env(a, "BIG", 2u << 20);
    cr_assert_eq(sbx_store_wait(sh->store, n), SBX_E_STORAGE_FULL);
    drain();
    a->cs = C_NONE;
    cr_expect(actor_write_failed(a, n));
    cr_expect(a->exists, "the sandbox with a running container is gone");
    cr_expect_null(a->rec.config, "the failed configure's settings are still in the record");
    cr_expect_eq(a->sleep_after_ms, 0, "sleepAfter %lld ms of a failed write is still in effect",
                 (long long)a->sleep_after_ms);
    cr_expect_null(a->rec.env, "the failed write's environment is still in the record");
}

Test(gate, a_create_answered_for_a_sandbox_with_no_committed_record_waits_for_one)
{
    /* A sandbox that exists in memory only: its creating write failed
     * (the disk was full) while its container started.  A create then
     * answers "exists": that answer must mean a committed record, which a
     * restart finds. */
    struct actor *a = actor_get(sh, "gate-g", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "created");
    struct sop *op = configure_op(a, "req-g");
    op->def = sbx_op_find("create", strlen("create"));
    op->req.op = (sbx_str){"create", strlen("create")};
    snprintf(op->id, sizeof(op->id), "req-g\x1fgate-g\x1f" "create");
    idem_find(sh, "req-g\x1fgate-g\x1fsandbox.configure")->inflight = NULL;
    idem_add(sh, op->id, op);
    static const msgpack_object no_args = {.type = MSGPACK_OBJECT_MAP};
    op->req.args = &no_args;
    actor_enqueue(a, op);
    for (int i = 0; i < 100 && sh->held; i++)
        run_for(50);
    struct idem *e = idem_find(sh, "req-g\x1fgate-g\x1f" "create");
    cr_assert_not_null(e, "the create failed");
    cr_assert_null(e->inflight, "the create was not answered");
    char *val = NULL;
    size_t vn = 0;
    cr_expect_eq(sbx_store_get(sh->store, SBX_DB_SANDBOXES, a->id, strlen(a->id), &val, &vn), 0,
                 "the sandbox answered as existing has no record in the store");
    free(val);
}

Test(gate, a_status_answered_for_a_sandbox_with_no_committed_record_waits_for_one)
{
    /* A sandbox that exists in memory only: its creating write failed
     * (the disk was full) while its container started.  A status then
     * answers "exists": that answer must mean a committed record, which a
     * restart finds. */
    struct actor *a = actor_get(sh, "gate-h", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "created");
    struct sop *op = configure_op(a, "req-h");
    op->def = sbx_op_find("status", strlen("status"));
    op->req.op = (sbx_str){"status", strlen("status")};
    snprintf(op->id, sizeof(op->id), "req-h\x1fgate-h\x1f" "status");
    idem_find(sh, "req-h\x1fgate-h\x1fsandbox.configure")->inflight = NULL;
    idem_add(sh, op->id, op);
    static const msgpack_object no_args = {.type = MSGPACK_OBJECT_MAP};
    op->req.args = &no_args;
    actor_enqueue(a, op);
    for (int i = 0; i < 100 && sh->held; i++)
        run_for(50);
    struct idem *e = idem_find(sh, "req-h\x1fgate-h\x1f" "status");
    cr_assert_not_null(e, "the status failed");
    cr_assert_null(e->inflight, "the status was not answered");
    char *val = NULL;
    size_t vn = 0;
    cr_expect_eq(sbx_store_get(sh->store, SBX_DB_SANDBOXES, a->id, strlen(a->id), &val, &vn), 0,
                 "the sandbox answered as existing has no record in the store");
    free(val);
}

/* A state write and the recorded reply of its operation go to LMDB in one
 * transaction, however long the shard takes between them within its loop
 * callback: a crash in between would keep the change and lose the reply,
 * and the retry would run again (make faults-smoke found a destroy retried
 * after a kill -9 answered "destroyed: false"). */
Test(gate, a_state_write_and_its_recorded_reply_commit_in_one_transaction)
{
    struct actor *a = actor_get(sh, "gate-h", true);
    cr_assert_not_null(a);
    a->exists = true;
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
    uint64_t b0, w0, f0;
    sbx_store_stat(sh->store, &b0, &w0, &f0);

    struct sop *op = configure_op(a, "req-h");
    uint64_t s1 = write_env(a, "A", 10);
    usleep(30 * 1000); /* the rest of the callback: the writer could take s1 alone */
    cr_assert_lt(sbx_store_decided(sh->store), s1,
                 "the state write was committed before its reply was recorded");
    size_t len;
    char *buf = ok_reply("req-h", 64, &len);
    shard_reply(op, buf, len, s1);
    uint64_t i = op->idem_seq;
    cr_assert_gt(i, s1, "the reply was not recorded in the idempotency table");
    drain(); /* the callback "ends": the store is released */
    cr_assert_eq(sbx_store_wait(sh->store, i), 0);
    uint64_t b1, w1, f1;
    sbx_store_stat(sh->store, &b1, &w1, &f1);
    cr_expect_eq(b1 - b0, 1u, "the write and its reply took %llu batches",
                 (unsigned long long)(b1 - b0));
    cr_expect_eq(w1 - w0, 2u);
    expect_answered_ok("req-h\x1fgate-h\x1fsandbox.configure", len);
    expect_stored_env(a->id, "A", 10);
}
