/*
 * test_store.c — unit tests for runtime/store.h, the LMDB metadata store.
 *
 * Covers: put/wait/get/del and increasing sequence numbers; named databases
 * kept apart; durability across close and reopen; the commit callback
 * reporting contiguous ranges that cover every write, in order; group commit
 * under 4 concurrent writer threads; sbx_store_foreach order and early stop;
 * a full map reported as STORAGE_FULL without a crash, with earlier data
 * still readable after reopen; the map growing up to its maximum before
 * writes fail; a write that does not fit failing alone while the writes
 * queued with it are committed; batches bounded in writes and bytes; a
 * write made on top of a failed one (sbx_store_put_after) failing with it;
 * lazy writes committed alone, when waited for, with the next write and at
 * close.
 *
 * Every test works in its own mkdtemp directory under /tmp, removed by the
 * fixture's fini even when an assertion fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/err.h"
#include "runtime/store.h"
#include "runtime/util.h"

#define MAPSIZE (64ull << 20)

static char tmpdir[64];
static sbx_store *st; /* closed by the fini if a test left it open */

static void
setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sbx-test-store-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    st = NULL;
}

static void
teardown(void)
{
    if (st)
        sbx_store_close(st);
    st = NULL;
    if (tmpdir[0]) {
        int rc = sbx_rm_rf(tmpdir);
        cr_expect_eq(rc, 0, "removing %s: %s", tmpdir, strerror(-rc));
        struct stat sb;
        cr_expect_neq(stat(tmpdir, &sb), 0, "%s still exists", tmpdir);
    }
}

TestSuite(store, .init = setup, .fini = teardown, .timeout = 120);

/* The data directory inside the temp dir (exercises "created if missing"). */
static const char *
datadir(void)
{
    static char d[96];
    snprintf(d, sizeof(d), "%s/data", tmpdir);
    return d;
}

/* Open with a map of mapsize bytes that may grow to map_max (0: fixed). */
static void
open_store_max(uint64_t mapsize, uint64_t map_max, sbx_store_commit_fn cb, void *arg)
{
    int rc = sbx_store_open(&st, datadir(), mapsize, map_max, cb, arg);
    cr_assert_eq(rc, 0, "sbx_store_open(%s): %d %s", datadir(), rc, sbx_err_message(rc));
}

static void
open_store(uint64_t mapsize, sbx_store_commit_fn cb, void *arg)
{
    open_store_max(mapsize, 0, cb, arg);
}

static void
close_store(void)
{
    sbx_store_close(st);
    st = NULL;
}

static void
expect_value(int db, const char *key, const void *want, size_t wantn)
{
    char *v = NULL;
    size_t vn = 0;
    int rc = sbx_store_get(st, db, key, strlen(key), &v, &vn);
    cr_assert_eq(rc, 0, "get(%d, %s): %d", db, key, rc);
    cr_expect_eq(vn, wantn, "get(%s): %zu bytes, want %zu", key, vn, wantn);
    if (vn == wantn)
        cr_expect_arr_eq(v, want, wantn, "get(%s): wrong bytes", key);
    cr_expect_eq(v[vn], '\0', "the value is NUL-terminated for convenience");
    free(v);
}

static void
expect_absent(int db, const char *key)
{
    char *v = NULL;
    size_t vn = 0;
    int rc = sbx_store_get(st, db, key, strlen(key), &v, &vn);
    cr_expect_eq(rc, -ENOENT, "get(%d, %s): %d, want -ENOENT", db, key, rc);
    if (rc == 0)
        free(v);
}

static uint64_t
put_str(int db, const char *k, const char *v)
{
    return sbx_store_put(st, db, k, strlen(k), v, strlen(v));
}

/* ---------------------------------------------------------------------------------
 * Basic operations. */

Test(store, put_get_del)
{
    open_store(MAPSIZE, NULL, NULL);
    expect_absent(SBX_DB_SANDBOXES, "user-1");

    uint64_t s1 = put_str(SBX_DB_SANDBOXES, "user-1", "record one");
    cr_assert_gt(s1, 0u, "sequence numbers are > 0");
    cr_assert_eq(sbx_store_wait(st, s1), 0);
    expect_value(SBX_DB_SANDBOXES, "user-1", "record one", 10);

    /* Binary values with NULs, and an empty value. */
    static const char bin[] = {'a', 0, 'b', 0, (char)0xff};
    uint64_t s2 = sbx_store_put(st, SBX_DB_SANDBOXES, "bin", 3, bin, sizeof(bin));
    uint64_t s3 = sbx_store_put(st, SBX_DB_SANDBOXES, "empty", 5, "", 0);
    cr_expect_gt(s2, s1, "sequence numbers increase");
    cr_expect_gt(s3, s2, "sequence numbers increase");
    cr_assert_eq(sbx_store_wait(st, s3), 0);
    cr_assert_eq(sbx_store_wait(st, s2), 0, "waiting for an older write still gives its rc");
    expect_value(SBX_DB_SANDBOXES, "bin", bin, sizeof(bin));
    expect_value(SBX_DB_SANDBOXES, "empty", "", 0);

    /* Overwrite. */
    uint64_t s4 = put_str(SBX_DB_SANDBOXES, "user-1", "v2");
    cr_assert_eq(sbx_store_wait(st, s4), 0);
    expect_value(SBX_DB_SANDBOXES, "user-1", "v2", 2);

    /* Delete, and deleting a missing key is not an error. */
    uint64_t s5 = sbx_store_del(st, SBX_DB_SANDBOXES, "user-1", 6);
    cr_expect_gt(s5, s4);
    cr_assert_eq(sbx_store_wait(st, s5), 0);
    expect_absent(SBX_DB_SANDBOXES, "user-1");
    uint64_t s6 = sbx_store_del(st, SBX_DB_SANDBOXES, "never-written", 13);
    cr_expect_eq(sbx_store_wait(st, s6), 0, "deleting a missing key succeeds");
    expect_value(SBX_DB_SANDBOXES, "bin", bin, sizeof(bin));

    uint64_t batches, writes, failed;
    sbx_store_stat(st, &batches, &writes, &failed);
    cr_expect_eq(writes, 6u, "6 writes were committed");
    cr_expect_geq(batches, 1u);
    cr_expect_leq(batches, writes);
    cr_expect_eq(failed, 0u);
}

Test(store, databases_are_separate)
{
    open_store(MAPSIZE, NULL, NULL);
    put_str(SBX_DB_SANDBOXES, "k", "in sandboxes");
    put_str(SBX_DB_META, "k", "in meta");
    uint64_t s = put_str(SBX_DB_IDEM, "other", "in idem");
    cr_assert_eq(sbx_store_wait(st, s), 0);
    expect_value(SBX_DB_SANDBOXES, "k", "in sandboxes", 12);
    expect_value(SBX_DB_META, "k", "in meta", 7);
    expect_absent(SBX_DB_IDEM, "k");
    expect_absent(SBX_DB_SANDBOXES, "other");
    s = sbx_store_del(st, SBX_DB_META, "k", 1);
    cr_assert_eq(sbx_store_wait(st, s), 0);
    expect_absent(SBX_DB_META, "k");
    expect_value(SBX_DB_SANDBOXES, "k", "in sandboxes", 12);
}

Test(store, data_survives_close_and_reopen)
{
    enum { N = 1000 };
    char k[32], v[64];
    open_store(MAPSIZE, NULL, NULL);
    uint64_t seqs[N];
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "key-%04d", i);
        snprintf(v, sizeof(v), "value %d %d", i, i * 7919);
        seqs[i] = put_str(SBX_DB_SANDBOXES, k, v);
        if (i)
            cr_assert_gt(seqs[i], seqs[i - 1]);
    }
    /* Deleted before the close: must stay deleted. */
    uint64_t d = sbx_store_del(st, SBX_DB_SANDBOXES, "key-0500", 8);
    for (int i = 0; i < N; i++)
        cr_assert_eq(sbx_store_wait(st, seqs[i]), 0, "write %d failed", i);
    cr_assert_eq(sbx_store_wait(st, d), 0);
    close_store();

    open_store(MAPSIZE, NULL, NULL);
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "key-%04d", i);
        if (i == 500) {
            expect_absent(SBX_DB_SANDBOXES, k);
            continue;
        }
        snprintf(v, sizeof(v), "value %d %d", i, i * 7919);
        expect_value(SBX_DB_SANDBOXES, k, v, strlen(v));
    }
    /* Sequence numbers are per open store and still > 0. */
    cr_expect_gt(put_str(SBX_DB_META, "after", "reopen"), 0u);
}

Test(store, close_commits_queued_writes)
{
    enum { N = 300 };
    char k[32];
    open_store(MAPSIZE, NULL, NULL);
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "q%03d", i);
        put_str(SBX_DB_SANDBOXES, k, "x");
    }
    close_store(); /* no wait: close must commit what is queued */
    open_store(MAPSIZE, NULL, NULL);
    for (int i = 0; i < N; i++) {
        snprintf(k, sizeof(k), "q%03d", i);
        expect_value(SBX_DB_SANDBOXES, k, "x", 1);
    }
}

Test(store, open_fails_cleanly_on_a_file)
{
    char path[96];
    snprintf(path, sizeof(path), "%s/file", tmpdir);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fclose(f);
    sbx_store *s = NULL;
    int rc = sbx_store_open(&s, path, MAPSIZE, 0, NULL, NULL);
    cr_expect_lt(rc, 0, "opening a store on a regular file must fail, got %d", rc);
    cr_expect_null(s, "*out is untouched on failure");
}

/* ---------------------------------------------------------------------------------
 * Commit callback and group commit. */

struct ranges {
    pthread_mutex_t mu;
    pthread_t writer;
    bool writer_known, same_thread;
    size_t n, cap;
    struct {
        uint64_t first, last;
        int rc;
    } * r;
};

static void
record_range(void *arg, uint64_t first, uint64_t last, int rc)
{
    struct ranges *g = arg;
    pthread_mutex_lock(&g->mu);
    if (!g->writer_known) {
        g->writer = pthread_self();
        g->writer_known = true;
        g->same_thread = true;
    } else if (!pthread_equal(g->writer, pthread_self())) {
        g->same_thread = false;
    }
    if (g->n == g->cap) {
        g->cap = g->cap ? g->cap * 2 : 64;
        g->r = sbx_xrealloc(g->r, g->cap * sizeof(*g->r));
    }
    g->r[g->n].first = first;
    g->r[g->n].last = last;
    g->r[g->n].rc = rc;
    g->n++;
    pthread_mutex_unlock(&g->mu);
}

/* The ranges must be ordered, contiguous, successful and cover 1..total. */
static void
check_ranges(struct ranges *g, uint64_t total)
{
    uint64_t next = 1;
    cr_assert_gt(g->n, 0u, "the commit callback was never called");
    cr_expect(g->same_thread, "callbacks came from more than one thread");
    cr_expect(!pthread_equal(g->writer, pthread_self()), "callback ran on the caller's thread");
    for (size_t i = 0; i < g->n; i++) {
        cr_assert_eq(g->r[i].first, next, "range %zu starts at %llu, want %llu", i,
                     (unsigned long long)g->r[i].first, (unsigned long long)next);
        cr_assert_geq(g->r[i].last, g->r[i].first, "range %zu is reversed", i);
        cr_expect_eq(g->r[i].rc, 0, "range %zu failed: %d", i, g->r[i].rc);
        next = g->r[i].last + 1;
    }
    cr_assert_eq(next - 1, total, "ranges cover 1..%llu, want 1..%llu",
                 (unsigned long long)(next - 1), (unsigned long long)total);
}

Test(store, commit_callback_covers_every_write_in_order)
{
    struct ranges g = {.mu = PTHREAD_MUTEX_INITIALIZER};
    open_store(MAPSIZE, record_range, &g);
    char k[32];
    uint64_t last = 0;
    for (int i = 0; i < 500; i++) {
        snprintf(k, sizeof(k), "c%d", i);
        uint64_t s = (i % 10 == 9) ? sbx_store_del(st, SBX_DB_META, k, strlen(k))
                                   : put_str(SBX_DB_META, k, "v");
        cr_assert_eq(s, last + 1, "sequence numbers of one store are consecutive");
        last = s;
        if (i % 50 == 0) /* vary the batch sizes */
            cr_assert_eq(sbx_store_wait(st, s), 0);
    }
    cr_assert_eq(sbx_store_wait(st, last), 0);
    close_store(); /* joins the writer: every callback has returned */
    check_ranges(&g, last);
    free(g.r);
}

struct writer_arg {
    int t;
    int n;
    uint64_t seqs[500];
    int rcs[500];
    bool increasing;
};

static void *
writer_thread(void *p)
{
    struct writer_arg *w = p;
    char k[32], v[32];
    w->increasing = true;
    for (int i = 0; i < w->n; i++) {
        snprintf(k, sizeof(k), "t%d-%03d", w->t, i);
        snprintf(v, sizeof(v), "%d:%d", w->t, i);
        w->seqs[i] = sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), v, strlen(v));
        if (i && w->seqs[i] <= w->seqs[i - 1])
            w->increasing = false;
    }
    for (int i = 0; i < w->n; i++)
        w->rcs[i] = sbx_store_wait(st, w->seqs[i]);
    return NULL;
}

Test(store, concurrent_writers_are_group_committed)
{
    enum { T = 4, N = 500 };
    struct ranges g = {.mu = PTHREAD_MUTEX_INITIALIZER};
    static struct writer_arg w[T];
    pthread_t th[T];
    open_store(MAPSIZE, record_range, &g);
    for (int t = 0; t < T; t++) {
        w[t].t = t;
        w[t].n = N;
        cr_assert_eq(pthread_create(&th[t], NULL, writer_thread, &w[t]), 0);
    }
    for (int t = 0; t < T; t++)
        pthread_join(th[t], NULL);

    for (int t = 0; t < T; t++) {
        cr_expect(w[t].increasing, "thread %d saw non-increasing sequence numbers", t);
        for (int i = 0; i < N; i++)
            cr_assert_eq(w[t].rcs[i], 0, "thread %d write %d failed: %d", t, i, w[t].rcs[i]);
    }
    uint64_t batches, writes, failed;
    sbx_store_stat(st, &batches, &writes, &failed);
    cr_expect_eq(writes, (uint64_t)T * N, "writes committed: %llu", (unsigned long long)writes);
    cr_expect_eq(failed, 0u);
    cr_expect_lt(batches, (uint64_t)T * N,
                 "group commit: %llu batches for %d writes", (unsigned long long)batches, T * N);
    cr_log_info("group commit: %llu batches for %d writes", (unsigned long long)batches, T * N);

    char k[32], v[32];
    for (int t = 0; t < T; t++) {
        for (int i = 0; i < N; i++) {
            snprintf(k, sizeof(k), "t%d-%03d", t, i);
            snprintf(v, sizeof(v), "%d:%d", t, i);
            expect_value(SBX_DB_SANDBOXES, k, v, strlen(v));
        }
    }
    close_store();
    check_ranges(&g, (uint64_t)T * N);
    cr_expect_eq(g.n, batches, "one callback per batch");
    free(g.r);
}

/* ---------------------------------------------------------------------------------
 * foreach. */

struct walk {
    int stop_after; /* 0: never */
    int visited;
    char keys[64][16];
    char vals[64][16];
};

static int
walk_cb(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct walk *w = arg;
    if (w->visited < 64) {
        snprintf(w->keys[w->visited], sizeof(w->keys[0]), "%.*s", (int)kn, (const char *)k);
        snprintf(w->vals[w->visited], sizeof(w->vals[0]), "%.*s", (int)vn, (const char *)v);
    }
    w->visited++;
    if (w->stop_after && w->visited == w->stop_after)
        return 42;
    return 0;
}

Test(store, foreach_visits_in_key_order_and_stops)
{
    open_store(MAPSIZE, NULL, NULL);
    struct walk w = {0};
    cr_expect_eq(sbx_store_foreach(st, SBX_DB_SANDBOXES, walk_cb, &w), 0);
    cr_expect_eq(w.visited, 0, "an empty database has nothing to visit");

    /* Inserted out of order; byte order puts "B" < "a" < "aa" < "ab" < "b". */
    static const char *ins[] = {"m", "b", "aa", "z", "a", "ab", "B", "m0", "0"};
    static const char *sorted[] = {"0", "B", "a", "aa", "ab", "b", "m", "m0", "z"};
    uint64_t s = 0;
    for (size_t i = 0; i < SBX_ARRAY_LEN(ins); i++) {
        char v[16];
        snprintf(v, sizeof(v), "v-%s", ins[i]);
        s = put_str(SBX_DB_SANDBOXES, ins[i], v);
    }
    s = put_str(SBX_DB_META, "not-in-sandboxes", "x");
    cr_assert_eq(sbx_store_wait(st, s), 0);

    memset(&w, 0, sizeof(w));
    cr_expect_eq(sbx_store_foreach(st, SBX_DB_SANDBOXES, walk_cb, &w), 0);
    cr_assert_eq(w.visited, (int)SBX_ARRAY_LEN(sorted), "visited %d keys", w.visited);
    for (size_t i = 0; i < SBX_ARRAY_LEN(sorted); i++) {
        cr_expect_str_eq(w.keys[i], sorted[i], "key %zu", i);
        char v[16];
        snprintf(v, sizeof(v), "v-%s", sorted[i]);
        cr_expect_str_eq(w.vals[i], v, "value of %s", sorted[i]);
    }

    memset(&w, 0, sizeof(w));
    w.stop_after = 3;
    cr_expect_eq(sbx_store_foreach(st, SBX_DB_SANDBOXES, walk_cb, &w), 42,
                 "the callback's non-zero value is returned");
    cr_expect_eq(w.visited, 3, "the walk stops at the first non-zero return");
    cr_expect_str_eq(w.keys[2], "a");
}

/* ---------------------------------------------------------------------------------
 * A full map. */

Test(store, full_map_fails_the_batch_and_keeps_earlier_data)
{
    enum { VAL = 8192, MAX = 2000 };
    char *val = sbx_xmalloc(VAL);
    char k[32];
    open_store(1ull << 20, NULL, NULL);
    int committed = 0, rc = 0;
    uint64_t fail_seq = 0;
    for (int i = 0; i < MAX; i++) {
        snprintf(k, sizeof(k), "big-%04d", i);
        memset(val, 'a' + i % 26, VAL);
        uint64_t s = sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), val, VAL);
        rc = sbx_store_wait(st, s);
        if (rc != 0) {
            fail_seq = s;
            break;
        }
        committed++;
    }
    cr_assert_neq(rc, 0, "%d writes of %d bytes never filled a 1 MiB map", MAX, VAL);
    cr_expect_eq(rc, SBX_E_STORAGE_FULL, "a full map is STORAGE_FULL, got %d (%s)", rc,
                 sbx_err_name(rc));
    cr_assert_gt(committed, 10, "only %d writes fit in 1 MiB", committed);

    uint64_t batches, writes, failed;
    sbx_store_stat(st, &batches, &writes, &failed);
    cr_expect_eq(writes, (uint64_t)committed);
    cr_expect_eq(failed, 1u);

    /* The store keeps answering: reads work, more writes keep failing cleanly. */
    snprintf(k, sizeof(k), "big-%04d", 0);
    memset(val, 'a', VAL);
    expect_value(SBX_DB_SANDBOXES, k, val, VAL);
    snprintf(k, sizeof(k), "big-%04d", committed);
    expect_absent(SBX_DB_SANDBOXES, k);
    for (int i = 0; i < 40; i++) {
        snprintf(k, sizeof(k), "more-%02d", i);
        uint64_t s = sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), val, VAL);
        cr_expect_lt(sbx_store_wait(st, s), 0, "write %d into a full map succeeded", i);
    }
    /* A decided write keeps its outcome, however many batches failed since. */
    cr_expect_eq(sbx_store_wait(st, fail_seq), SBX_E_STORAGE_FULL,
                 "the first failed write is still reported as failed after 40 more failures");
    cr_expect_eq(sbx_store_wait(st, 1), 0, "the first write is still reported committed");
    close_store();

    open_store(1ull << 20, NULL, NULL);
    for (int i = 0; i < committed; i++) {
        snprintf(k, sizeof(k), "big-%04d", i);
        memset(val, 'a' + i % 26, VAL);
        expect_value(SBX_DB_SANDBOXES, k, val, VAL);
    }
    snprintf(k, sizeof(k), "big-%04d", committed);
    expect_absent(SBX_DB_SANDBOXES, k);
    free(val);
}

/* ---------------------------------------------------------------------------------
 * Map growth, a write that does not fit, bounded batches.
 *
 * To put several writes into one batch for sure, the test queues them from
 * the commit callback of a first write: the callback runs on the writer
 * thread between two batches, so everything it queues is waiting when the
 * writer takes its next batch. */

struct plan {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool queued, done;
    size_t n;
    const size_t *sizes; /* value size of each planned write */
    uint64_t seq[4096];  /* their sequence numbers */
    struct ranges g;     /* every range the callback reported */
};

static void
plan_cb(void *arg, uint64_t first, uint64_t last, int rc)
{
    struct plan *p = arg;
    record_range(&p->g, first, last, rc);
    pthread_mutex_lock(&p->mu);
    bool go = !p->queued;
    p->queued = true;
    pthread_mutex_unlock(&p->mu);
    if (!go)
        return;
    size_t maxv = 0;
    for (size_t i = 0; i < p->n; i++)
        maxv = SBX_MAX(maxv, p->sizes[i]);
    char *v = sbx_xmalloc(maxv + 1);
    char k[32];
    for (size_t i = 0; i < p->n; i++) {
        snprintf(k, sizeof(k), "plan-%04zu", i);
        memset(v, 'a' + (int)(i % 26), p->sizes[i]);
        p->seq[i] = sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), v, p->sizes[i]);
    }
    free(v);
    pthread_mutex_lock(&p->mu);
    p->done = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
}

/* Write one key so that plan_cb queues the plan, and wait until it has. */
static void
run_plan(struct plan *p)
{
    uint64_t s = put_str(SBX_DB_META, "start", "x");
    cr_assert_eq(sbx_store_wait(st, s), 0);
    pthread_mutex_lock(&p->mu);
    while (!p->done)
        pthread_cond_wait(&p->cv, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

Test(store, map_grows_up_to_its_maximum_then_writes_fail_storage_full)
{
    enum { VAL = 8192, MAX = 4000 };
    char *val = sbx_xmalloc(VAL);
    char k[32];
    open_store_max(1ull << 20, 8ull << 20, NULL, NULL);
    cr_expect_eq(sbx_store_mapsize(st), 1ull << 20);
    int committed = 0, rc = 0;
    for (int i = 0; i < MAX; i++) {
        snprintf(k, sizeof(k), "big-%04d", i);
        memset(val, 'a' + i % 26, VAL);
        rc = sbx_store_wait(st, sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), val, VAL));
        if (rc != 0)
            break;
        committed++;
    }
    cr_assert_eq(rc, SBX_E_STORAGE_FULL, "the last write: %d (%s), want STORAGE_FULL", rc,
                 sbx_err_name(rc));
    /* 1 MiB held ~100 such writes (full_map_fails_the_batch_…); 8 MiB must hold far more. */
    cr_expect_gt(committed, 400, "only %d writes of 8 KiB fit in a map that may grow to 8 MiB",
                 committed);
    cr_expect_eq(sbx_store_mapsize(st), 8ull << 20, "the map is at its maximum: %llu",
                 (unsigned long long)sbx_store_mapsize(st));
    /* Reads keep working, and what was acknowledged is there. */
    for (int i = 0; i < committed; i += 37) {
        snprintf(k, sizeof(k), "big-%04d", i);
        memset(val, 'a' + i % 26, VAL);
        expect_value(SBX_DB_SANDBOXES, k, val, VAL);
    }
    /* Space again (a deletion that fits frees pages): the same kind of write succeeds. */
    for (int i = 0; i < 20; i++) {
        snprintf(k, sizeof(k), "big-%04d", i);
        rc = sbx_store_wait(st, sbx_store_del(st, SBX_DB_SANDBOXES, k, strlen(k)));
        cr_assert_eq(rc, 0, "deleting %s: %d (%s)", k, rc, sbx_err_name(rc));
    }
    snprintf(k, sizeof(k), "after");
    rc = sbx_store_wait(st, sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), val, VAL));
    cr_expect_eq(rc, 0, "a write after space was freed: %d (%s)", rc, sbx_err_name(rc));
    close_store();
    /* Reopened with a smaller configured map: what the file holds is kept. */
    open_store_max(1ull << 20, 8ull << 20, NULL, NULL);
    snprintf(k, sizeof(k), "big-%04d", committed - 1);
    memset(val, 'a' + (committed - 1) % 26, VAL);
    expect_value(SBX_DB_SANDBOXES, k, val, VAL);
    free(val);
}

Test(store, a_write_that_does_not_fit_fails_alone)
{
    /* small, too big for the whole map, small, small: one batch. */
    static const size_t sizes[] = {100, 3u << 20, 200, 300};
    static struct plan p = {.mu = PTHREAD_MUTEX_INITIALIZER,
                            .cv = PTHREAD_COND_INITIALIZER,
                            .g = {.mu = PTHREAD_MUTEX_INITIALIZER}};
    p.n = SBX_ARRAY_LEN(sizes);
    p.sizes = sizes;
    open_store_max(1ull << 20, 2ull << 20, plan_cb, &p);
    run_plan(&p);
    int want[] = {0, SBX_E_STORAGE_FULL, 0, 0};
    for (size_t i = 0; i < p.n; i++) {
        int rc = sbx_store_wait(st, p.seq[i]);
        cr_expect_eq(rc, want[i], "write %zu (%zu bytes): %d (%s), want %s", i, sizes[i], rc,
                     sbx_err_name(rc), want[i] ? "STORAGE_FULL" : "committed");
    }
    char k[32], *v = sbx_xmalloc(400);
    for (size_t i = 0; i < p.n; i++) {
        snprintf(k, sizeof(k), "plan-%04zu", i);
        if (want[i]) {
            expect_absent(SBX_DB_SANDBOXES, k);
            continue;
        }
        memset(v, 'a' + (int)(i % 26), sizes[i]);
        expect_value(SBX_DB_SANDBOXES, k, v, sizes[i]);
    }
    free(v);
    /* Later writes that fit still succeed. */
    cr_expect_eq(sbx_store_wait(st, put_str(SBX_DB_SANDBOXES, "later", "fits")), 0);
    close_store();
    free(p.g.r);
}

/* Issue 11's fill fault: an actor's write fails (the disk is full), and the
 * writes it queued on top of it before it knew — carrying the failed change
 * — must not commit when they fit, else a change answered as failed is
 * read back (after a restart).  Whether the writes share a batch or not,
 * the answer is the same. */
Test(store, a_write_on_top_of_a_failed_one_fails_with_it)
{
    open_store_max(1ull << 20, 2ull << 20, NULL, NULL);
    uint64_t base = put_str(SBX_DB_SANDBOXES, "rec", "v1");
    cr_assert_eq(sbx_store_wait(st, base), 0, "the first value of the record commits");
    size_t big = 3u << 20; /* more than the largest map */
    char *v = sbx_xmalloc(big);
    memset(v, 'b', big);
    uint64_t bad = sbx_store_put_after(st, SBX_DB_SANDBOXES, "rec", 3, v, big, base);
    free(v);
    /* Small enough to fit, but made on top of the one that does not. */
    uint64_t on_bad = sbx_store_put_after(st, SBX_DB_SANDBOXES, "rec", 3, "v3", 2, bad);
    uint64_t on_on = sbx_store_put_after(st, SBX_DB_SANDBOXES, "rec", 3, "v4", 2, on_bad);
    uint64_t del_on = sbx_store_del_after(st, SBX_DB_SANDBOXES, "rec", 3, on_on);
    uint64_t other = sbx_store_put_after(st, SBX_DB_SANDBOXES, "other", 5, "o1", 2, base);
    cr_expect_eq(sbx_store_wait(st, bad), SBX_E_STORAGE_FULL, "the write that does not fit");
    cr_expect_eq(sbx_store_wait(st, on_bad), SBX_E_STORAGE_FULL,
                 "a write on top of a failed one: %s", sbx_err_name(sbx_store_wait(st, on_bad)));
    cr_expect_eq(sbx_store_wait(st, on_on), SBX_E_STORAGE_FULL, "and one on top of that");
    cr_expect_eq(sbx_store_wait(st, del_on), SBX_E_STORAGE_FULL, "and a delete on top of that");
    cr_expect_eq(sbx_store_wait(st, other), 0, "a write on top of a committed one commits");
    expect_value(SBX_DB_SANDBOXES, "rec", "v1", 2);
    expect_value(SBX_DB_SANDBOXES, "other", "o1", 2);
    /* The owner went back to the committed image: its next write is on top
     * of that one, and commits. */
    uint64_t again = sbx_store_put_after(st, SBX_DB_SANDBOXES, "rec", 3, "v5", 2, base);
    cr_expect_eq(sbx_store_wait(st, again), 0, "a rewrite on top of the committed image");
    expect_value(SBX_DB_SANDBOXES, "rec", "v5", 2);
    close_store();
    open_store_max(1ull << 20, 2ull << 20, NULL, NULL);
    expect_value(SBX_DB_SANDBOXES, "rec", "v5", 2);
    close_store();
}

Test(store, batches_are_bounded_in_writes_and_bytes)
{
    /* 1000 small writes, then 12 of 1 MiB: all queued at once. */
    enum { SMALL = 1000, BIG = 12 };
    static size_t sizes[SMALL + BIG];
    static struct plan p = {.mu = PTHREAD_MUTEX_INITIALIZER,
                            .cv = PTHREAD_COND_INITIALIZER,
                            .g = {.mu = PTHREAD_MUTEX_INITIALIZER}};
    for (size_t i = 0; i < SMALL + BIG; i++)
        sizes[i] = i < SMALL ? 16 : 1u << 20;
    p.n = SMALL + BIG;
    p.sizes = sizes;
    open_store_max(MAPSIZE, 0, plan_cb, &p);
    run_plan(&p);
    cr_assert_eq(sbx_store_wait(st, p.seq[p.n - 1]), 0);
    close_store(); /* every callback has returned */
    check_ranges(&p.g, p.seq[p.n - 1]);
    size_t batches_of_plan = 0;
    for (size_t i = 0; i < p.g.n; i++) {
        uint64_t first = p.g.r[i].first, last = p.g.r[i].last;
        if (last < p.seq[0])
            continue;
        batches_of_plan++;
        uint64_t ops = last - first + 1, bytes = 0;
        for (uint64_t q = first; q <= last; q++)
            bytes += strlen("plan-0000") + sizes[q - p.seq[0]];
        cr_expect_leq(ops, (uint64_t)SBX_STORE_BATCH_OPS, "batch %llu..%llu: %llu writes",
                      (unsigned long long)first, (unsigned long long)last,
                      (unsigned long long)ops);
        if (ops > 1)
            cr_expect_leq(bytes, (uint64_t)SBX_STORE_BATCH_BYTES,
                          "batch %llu..%llu: %llu bytes", (unsigned long long)first,
                          (unsigned long long)last, (unsigned long long)bytes);
    }
    cr_expect_geq(batches_of_plan, (size_t)(SMALL / SBX_STORE_BATCH_OPS + BIG / 3),
                  "%zu batches for the queued writes", batches_of_plan);
    free(p.g.r);
}

/* ---------------------------------------------------------------------------------
 * Lazy writes (sbx_store_put_lazy_after): committed with the next batch, by
 * themselves after SBX_STORE_LAZY_MS, when waited for, and at close. */

Test(store, lazy_writes_are_committed_waited_for_or_not)
{
    struct ranges g = {.mu = PTHREAD_MUTEX_INITIALIZER};
    open_store(MAPSIZE, record_range, &g);

    /* Alone, nobody waiting: it commits by itself (polled, not timed). */
    uint64_t l1 = sbx_store_put_lazy_after(st, SBX_DB_IDEM, "lazy-1", 6, "r1", 2, 0);
    cr_assert_gt(l1, 0u);
    for (int i = 0; i < 5000 && sbx_store_decided(st) < l1; i++)
        usleep(1000);
    cr_assert_geq(sbx_store_decided(st), l1, "a lazy write alone was never committed");
    expect_value(SBX_DB_IDEM, "lazy-1", "r1", 2);

    /* Waited for: sbx_store_wait makes it due and gives its rc. */
    uint64_t l2 = sbx_store_put_lazy_after(st, SBX_DB_IDEM, "lazy-2", 6, "r2", 2, l1);
    cr_assert_eq(sbx_store_wait(st, l2), 0);
    expect_value(SBX_DB_IDEM, "lazy-2", "r2", 2);

    /* Followed by an ordinary write: both committed, in order. */
    uint64_t l3 = sbx_store_put_lazy_after(st, SBX_DB_IDEM, "lazy-3", 6, "r3", 2, 0);
    uint64_t w = put_str(SBX_DB_IDEM, "plain", "p");
    cr_assert_gt(w, l3);
    cr_assert_eq(sbx_store_wait(st, w), 0);
    cr_assert_geq(sbx_store_decided(st), l3, "writes are decided in order");
    expect_value(SBX_DB_IDEM, "lazy-3", "r3", 2);
    expect_value(SBX_DB_IDEM, "plain", "p", 1);

    /* Queued at close: committed. */
    sbx_store_put_lazy_after(st, SBX_DB_IDEM, "lazy-4", 6, "r4", 2, 0);
    close_store();
    check_ranges(&g, w + 1);
    free(g.r);
    open_store(MAPSIZE, NULL, NULL);
    expect_value(SBX_DB_IDEM, "lazy-4", "r4", 2);
}

/* ---------------------------------------------------------------------------------
 * Holds and writes committed together (sbx_store_hold, sbx_store_put_with):
 * a shard's state write and the recorded reply of its operation are one
 * transaction, so a crash never keeps the change without the reply its
 * retry must get (a destroy retried after a kill -9 answered "destroyed:
 * false": make faults-smoke, not_linearizable). */

/* Whether some committed range holds both a and b. */
static bool
one_batch(struct ranges *g, uint64_t a, uint64_t b)
{
    bool r = false;
    pthread_mutex_lock(&g->mu);
    for (size_t i = 0; i < g->n; i++)
        if (g->r[i].rc == 0 && g->r[i].first <= a && b <= g->r[i].last)
            r = true;
    pthread_mutex_unlock(&g->mu);
    return r;
}

struct waiter {
    uint64_t seq;
    int rc;
    atomic_bool done;
};

static void *
wait_main(void *arg)
{
    struct waiter *w = arg;
    w->rc = sbx_store_wait(st, w->seq);
    atomic_store(&w->done, true);
    return NULL;
}

Test(store, held_writes_wait_for_the_release_and_commit_with_their_reply)
{
    struct ranges g = {.mu = PTHREAD_MUTEX_INITIALIZER};
    open_store(MAPSIZE, record_range, &g);
    uint64_t w0 = put_str(SBX_DB_SANDBOXES, "before", "x");

    sbx_store_hold(st);
    uint64_t a = sbx_store_del(st, SBX_DB_SANDBOXES, "before", 6); /* a destroy */
    /* Another thread's wait for it (the shard's replication thread) lasts
     * until the release: it does not end the hold. */
    struct waiter wt = {.seq = a};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, wait_main, &wt), 0);
    usleep(50 * 1000); /* the writer, woken by it, has had every chance to take it */
    cr_assert_lt(sbx_store_decided(st), a, "a held write was committed before the release");
    cr_expect(!atomic_load(&wt.done), "another thread's wait ended the hold");
    cr_assert_geq(sbx_store_decided(st), w0, "a write queued before the hold was held too");
    uint64_t b = sbx_store_put_with(st, SBX_DB_IDEM, "req-1", 5, "destroyed", 9, a);
    sbx_store_release(st);
    cr_assert_eq(sbx_store_wait(st, b), 0);
    pthread_join(th, NULL);
    cr_expect_eq(wt.rc, 0);
    expect_absent(SBX_DB_SANDBOXES, "before");
    expect_value(SBX_DB_IDEM, "req-1", "destroyed", 9);

    /* Waiting for a held write ends the hold (no deadlock for its holder). */
    sbx_store_hold(st);
    uint64_t c = put_str(SBX_DB_SANDBOXES, "waited", "w");
    cr_assert_eq(sbx_store_wait(st, c), 0);
    expect_value(SBX_DB_SANDBOXES, "waited", "w", 1);

    /* A close ends it: what was held is committed. */
    sbx_store_hold(st);
    put_str(SBX_DB_SANDBOXES, "at-close", "c");
    close_store(); /* every callback has returned */
    cr_expect(one_batch(&g, a, b), "the delete and its reply's record were committed apart");
    free(g.r);
    open_store(MAPSIZE, NULL, NULL);
    expect_value(SBX_DB_SANDBOXES, "at-close", "c", 1);
}

Test(store, batch_bounds_never_separate_writes_committed_together)
{
    /* 600 pairs queued under one hold: more than a batch takes. */
    enum { PAIRS = 600 };
    static uint64_t sa[PAIRS], sb[PAIRS];
    struct ranges g = {.mu = PTHREAD_MUTEX_INITIALIZER};
    open_store(MAPSIZE, record_range, &g);
    sbx_store_hold(st);
    char k[32];
    for (int i = 0; i < PAIRS; i++) {
        snprintf(k, sizeof(k), "sb-%04d", i);
        sa[i] = put_str(SBX_DB_SANDBOXES, k, "record");
        sb[i] = sbx_store_put_with(st, SBX_DB_IDEM, k, strlen(k), "reply", 5, sa[i]);
    }
    sbx_store_release(st);
    cr_assert_eq(sbx_store_wait(st, sb[PAIRS - 1]), 0);
    close_store(); /* every callback has returned */
    cr_expect_gt(g.n, 1u, "one batch took all %d writes: the bound was not met", 2 * PAIRS);
    for (int i = 0; i < PAIRS; i++)
        cr_expect(one_batch(&g, sa[i], sb[i]), "pair %d (%llu, %llu) was split by a batch bound",
                  i, (unsigned long long)sa[i], (unsigned long long)sb[i]);
    free(g.r);
}

Test(store, writes_committed_together_fit_or_fail_together)
{
    /* A fixed 1 MiB map: a pair whose reply cannot fit fails whole (its
     * state write too, though that one alone would fit); the next pair,
     * which fits, is committed. */
    open_store_max(1u << 20, 0, NULL, NULL);
    size_t big = 2u << 20;
    char *v = sbx_xmalloc(big);
    memset(v, 'r', big);
    sbx_store_hold(st);
    uint64_t a1 = put_str(SBX_DB_SANDBOXES, "s1", "state one");
    uint64_t b1 = sbx_store_put_with(st, SBX_DB_IDEM, "r1", 2, v, big, a1);
    uint64_t a2 = put_str(SBX_DB_SANDBOXES, "s2", "state two");
    uint64_t b2 = sbx_store_put_with(st, SBX_DB_IDEM, "r2", 2, "ok", 2, a2);
    sbx_store_release(st);
    free(v);
    cr_expect_eq(sbx_store_wait(st, b2), 0);
    cr_expect_eq(sbx_store_wait(st, a2), 0);
    cr_expect_eq(sbx_store_wait(st, b1), SBX_E_STORAGE_FULL);
    cr_expect_eq(sbx_store_wait(st, a1), SBX_E_STORAGE_FULL,
                 "the state write was committed without its reply's record");
    expect_absent(SBX_DB_SANDBOXES, "s1");
    expect_absent(SBX_DB_IDEM, "r1");
    expect_value(SBX_DB_SANDBOXES, "s2", "state two", 9);
    expect_value(SBX_DB_IDEM, "r2", "ok", 2);
}
