/*
 * test_destroy_queued.c — a destroyed sandbox stays destroyed (issue 11: "0
 * resurrections"): a request that reaches the shard while the destroy's
 * delete is still queued for LMDB must not load the record back from the
 * store, which holds committed writes only.
 *
 * The test starts its own one-shard `sbxd dev` (unique name, own temporary
 * directory, stopped in .fini) and holds the write lock of the shard's LMDB
 * environment (a write transaction opened from this process) to keep the
 * delete queued for as long as it needs, without timing luck.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <lmdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"

static struct testd *live_testd;
static MDB_env *live_env;
static MDB_txn *live_txn;

static void
cleanup(void)
{
    if (live_txn)
        mdb_txn_abort(live_txn);
    live_txn = NULL;
    if (live_env)
        mdb_env_close(live_env);
    live_env = NULL;
    if (live_testd && live_testd->pid > 0)
        testd_stop(live_testd);
    live_testd = NULL;
}

/* One call from a thread of its own (c is the thread's while it runs). */
struct bg_call {
    pthread_t th;
    sbx_client *c;
    const char *op;
    const char *id;
    tcall t;
    atomic_bool done;
};

static void *
bg_call_main(void *arg)
{
    struct bg_call *b = arg;
    b->t = tc_call(b->c, b->op, b->id, NULL, 30000);
    atomic_store(&b->done, true);
    return NULL;
}

Test(tombstone, a_request_during_a_destroys_commit_does_not_bring_the_sandbox_back,
     .timeout = 120, .fini = cleanup)
{
    static struct testd d;
    static const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start");
    live_testd = &d;
    sbx_client *c = NULL, *c2 = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0, "client: %s", err.message);
    cr_assert_eq(sbx_client_open(&c2, d.url, &err), 0, "client: %s", err.message);

    char id[64];
    snprintf(id, sizeof(id), "tomb-%d", (int)getpid());
    tcall t = tc_call(c, "sandbox.configure", id, json_pack("{s:s}", "sleepAfter", "7s"), 0);
    tc_ok(t, "sandbox.configure");
    tc_free(&t);
    /* A running container: its destroy stops it first (the actor goes once
     * the container is gone). */
    char *out = tsh_out(c, id, "echo up");
    cr_assert_str_eq(out, "up\n");
    free(out);
    json_t *sb = ts_status(c, id);
    pid_t agent = (pid_t)jint(sb, "container.pid");
    cr_assert_eq(jint(sb, "sleepAfter"), 7000);
    json_decref(sb);
    cr_assert_gt(agent, 1, "no container pid in status");

    /* Hold the shard's LMDB write lock: the destroy's delete stays queued. */
    char dir[400];
    snprintf(dir, sizeof(dir), "%s/s0", d.dir);
    cr_assert_eq(mdb_env_create(&live_env), 0);
    cr_assert_eq(mdb_env_set_maxdbs(live_env, 8), 0);
    cr_assert_eq(mdb_env_open(live_env, dir, MDB_NOTLS, 0600), 0, "open %s", dir);
    cr_assert_eq(mdb_txn_begin(live_env, NULL, 0, &live_txn), 0, "write transaction");

    struct bg_call b = {.c = c2, .op = "destroy", .id = id};
    cr_assert_eq(pthread_create(&b.th, NULL, bg_call_main, &b), 0);
    /* The container is gone (its agent reaped; then its cgroup goes and the
     * shard's loop learns it): the shard has handled the destroy, all but
     * the commit of its delete. */
    double until = test_now_ms() + 30000;
    while (test_now_ms() < until && !(kill(agent, 0) != 0 && errno == ESRCH))
        tsleep_ms(20);
    cr_assert(kill(agent, 0) != 0 && errno == ESRCH, "the agent %d is still there", (int)agent);
    tsleep_ms(500);

    /* A request now, while the delete is queued.  Before the fix it loaded
     * the record back from LMDB at once, and the sandbox outlived its
     * acknowledged destroy; now it waits for the delete.  Whichever: the
     * lock goes when it is answered, or after 2 s. */
    struct bg_call s = {.c = c, .op = "status", .id = id};
    cr_assert_eq(pthread_create(&s.th, NULL, bg_call_main, &s), 0);
    until = test_now_ms() + 2000;
    while (test_now_ms() < until && !atomic_load(&s.done))
        tsleep_ms(10);

    mdb_txn_abort(live_txn);
    live_txn = NULL;
    pthread_join(b.th, NULL);
    tc_ok(b.t, "destroy");
    cr_expect_eq(jbool(b.t.res, "destroyed"), 1, "the destroy found no sandbox");
    tc_free(&b.t);
    pthread_join(s.th, NULL);
    /* Concurrent with the destroy: either answer is possible; not a record
     * that outlives it (below). */
    tc_free(&s.t);

    /* What the user checks: after the acknowledged destroy, it is gone. */
    t = tc_call(c, "status", id, NULL, 10000);
    cr_expect_neq(t.rc, 0, "status after the destroy: the sandbox is back (sleepAfter %lld)",
                  t.rc == 0 ? (long long)jint(t.res, "sandbox.sleepAfter") : 0LL);
    if (t.rc != 0)
        cr_expect_str_eq(t.err.code, "SANDBOX_NOT_FOUND");
    tc_free(&t);

    mdb_env_close(live_env);
    live_env = NULL;
    sbx_client_close(c2);
    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
}
