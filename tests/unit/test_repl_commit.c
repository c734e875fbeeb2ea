/*
 * test_repl_commit.c — unit tests for the replication thread's first step
 * (actors/cluster_repl.c cluster_repl_committed; cluster.h ownership
 * rules): a batch of record writes goes to etcd only once the store has
 * decided each of them, and only the ones whose LMDB commit succeeded.
 *
 * Over a real store with a 1 MiB map that cannot grow, a 2 MiB value does
 * not fit (STORAGE_FULL).  Covers: a failed later write of a record does
 * not hide its earlier committed write in the same batch (that one is what
 * is sent), a delete made on top of a failed write fails with it and is
 * not sent (etcd keeps the record, as LMDB does), every write of the batch
 * is noted in order (the output gate's FIFO advances) with `sent` saying
 * which ones go, and a batch whose writes all failed sends nothing.  The
 * writes are queued right before the call, which waits for the store's
 * decisions.
 *
 * Each test works in its own mkdtemp directory, removed by the fini even
 * when an assertion fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "actors/cluster_int.h"
#include "runtime/err.h"
#include "runtime/store.h"
#include "runtime/util.h"

static char tmpdir[64];
static sbx_store *st;

static void
setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sbx-test-replc-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    char dir[96];
    snprintf(dir, sizeof(dir), "%s/data", tmpdir);
    int rc = sbx_store_open(&st, dir, 1ull << 20, 0, NULL, NULL);
    cr_assert_eq(rc, 0, "sbx_store_open: %s", sbx_err_message(rc));
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
    }
}

/* A write of the batch as cluster_replicate makes it (rec copied; NULL: a
 * deletion), appended at *tail. */
static struct ritem **
add(struct ritem **tail, uint64_t seq, const char *id, const char *rec)
{
    struct ritem *it = sbx_xcalloc(1, sizeof(*it));
    it->seq = seq;
    snprintf(it->id, sizeof(it->id), "%s", id);
    if (rec) {
        it->len = strlen(rec);
        it->rec = sbx_xmalloc(it->len);
        memcpy(it->rec, rec, it->len);
    }
    *tail = it;
    return &it->next;
}

static void
free_list(struct ritem *it)
{
    while (it) {
        struct ritem *next = it->next;
        free(it->rec);
        free(it);
        it = next;
    }
}

TestSuite(repl_commit, .init = setup, .fini = teardown, .timeout = 60);

Test(repl_commit, only_committed_writes_are_sent_and_a_record_keeps_its_last_committed_one)
{
    size_t bign = 2u << 20;
    char *big = sbx_xmalloc(bign);
    memset(big, 'x', bign);
    /* A: committed, then a write that does not fit, then a delete made on
     * top of that one; B: committed twice; C: a delete that commits. */
    uint64_t s1 = sbx_store_put(st, SBX_DB_SANDBOXES, "A", 1, "a1", 2);
    uint64_t s2 = sbx_store_put(st, SBX_DB_SANDBOXES, "A", 1, big, bign);
    uint64_t s3 = sbx_store_put(st, SBX_DB_SANDBOXES, "B", 1, "b1", 2);
    uint64_t s4 = sbx_store_del_after(st, SBX_DB_SANDBOXES, "A", 1, s2);
    uint64_t s5 = sbx_store_put_after(st, SBX_DB_SANDBOXES, "B", 1, "b2", 2, s3);
    uint64_t s6 = sbx_store_del(st, SBX_DB_SANDBOXES, "C", 1);
    free(big);
    struct ritem *batch = NULL, **tail = &batch;
    tail = add(tail, s1, "A", "a1");
    tail = add(tail, s2, "A", "big");
    tail = add(tail, s3, "B", "b1");
    tail = add(tail, s4, "A", NULL);
    tail = add(tail, s5, "B", "b2");
    add(tail, s6, "C", NULL);

    struct rnote notes[8];
    size_t n = 0;
    struct ritem *sent = cluster_repl_committed(st, batch, notes, &n);
    cr_expect_geq(sbx_store_decided(st), s6, "the batch's writes are not all decided after it");

    /* Every write noted, in order; sent says which ones go to etcd. */
    const uint64_t seqs[6] = {s1, s2, s3, s4, s5, s6};
    const bool want_sent[6] = {true, false, true, false, true, true};
    cr_assert_eq(n, 6, "%zu notes for a batch of 6 writes", n);
    for (size_t i = 0; i < 6; i++) {
        cr_expect_eq(notes[i].seq, seqs[i], "note %zu is write %llu, not %llu", i,
                     (unsigned long long)notes[i].seq, (unsigned long long)seqs[i]);
        cr_expect_eq(notes[i].sent, want_sent[i], "write %llu (%s): sent %d, its commit %s",
                     (unsigned long long)seqs[i], notes[i].id, notes[i].sent,
                     sbx_err_message(sbx_store_wait(st, seqs[i])));
        cr_expect_eq(notes[i].rc, 0, "note %zu carries rc %d before any replication", i,
                     notes[i].rc);
    }
    cr_expect_eq(sbx_store_wait(st, s2), SBX_E_STORAGE_FULL, "the 2 MiB write did not fail");
    cr_expect_eq(sbx_store_wait(st, s4), SBX_E_STORAGE_FULL,
                 "the delete made on top of the failed write did not fail with it");

    /* What is sent: A's last committed write (a1, not the failed value nor
     * the failed delete), B's two writes, C's delete — in order. */
    const uint64_t want[4] = {s1, s3, s5, s6};
    size_t k = 0;
    for (const struct ritem *it = sent; it; it = it->next, k++) {
        cr_assert_lt(k, 4, "more than 4 writes left to send");
        cr_expect_eq(it->seq, want[k], "write %zu to send is %llu, not %llu", k,
                     (unsigned long long)it->seq, (unsigned long long)want[k]);
    }
    cr_expect_eq(k, 4, "%zu writes left to send, not 4", k);
    cr_expect(sent && !strcmp(sent->id, "A") && sent->len == 2 && !memcmp(sent->rec, "a1", 2),
              "A's committed write is not the one sent");
    /* LMDB agrees: A holds a1 (what etcd gets), C is absent. */
    char *v = NULL;
    size_t vn = 0;
    cr_assert_eq(sbx_store_get(st, SBX_DB_SANDBOXES, "A", 1, &v, &vn), 0);
    cr_expect(vn == 2 && !memcmp(v, "a1", 2), "LMDB holds %zu bytes for A, not a1", vn);
    free(v);
    free_list(sent);
}

Test(repl_commit, a_batch_whose_writes_all_failed_sends_nothing)
{
    size_t bign = 2u << 20;
    char *big = sbx_xmalloc(bign);
    memset(big, 'y', bign);
    uint64_t s1 = sbx_store_put(st, SBX_DB_SANDBOXES, "D", 1, big, bign);
    uint64_t s2 = sbx_store_del_after(st, SBX_DB_SANDBOXES, "D", 1, s1);
    free(big);
    struct ritem *batch = NULL;
    add(add(&batch, s1, "D", "big"), s2, "D", NULL);
    struct rnote notes[4];
    size_t n = 0;
    struct ritem *sent = cluster_repl_committed(st, batch, notes, &n);
    cr_expect_null(sent, "a write whose commit failed is to be sent");
    cr_assert_eq(n, 2);
    cr_expect(!notes[0].sent && !notes[1].sent, "failed writes noted as sent");
    cr_expect(notes[0].seq == s1 && notes[1].seq == s2, "notes out of order");
    free_list(sent);
}
