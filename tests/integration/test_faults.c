/*
 * test_faults.c — fault injection: what survives a crash, and what a
 * client sees while it happens.  This binary: (a) below; test_faults_outages.c
 * has (b)-(d) and the hostile agent frames; faults_util.h what both share.
 *
 *  (a) a shard process is SIGKILLed at random moments during a stream of
 *      acknowledged writes (create, destroy, env.set, sandbox.configure —
 *      the operations whose effect is committed to LMDB before the reply),
 *      50 times: after every restart each acknowledged write is there, the
 *      store opens cleanly (mdb_stat while the shard is down) and the
 *      record count matches at the end (mdb_stat after a clean stop).
 *      Run on a cluster the test supervises itself (`sbxd shard` processes
 *      and an `sbxd gateway`), because sbxd dev's supervisor backs off for
 *      5 s after a few quick deaths; a second test does a few kills under
 *      `sbxd dev` to cover its supervisor, finding the shards among the
 *      children of the dev process;
 *  (b) the agent (PID 1 of a sandbox) is killed: the operation in flight
 *      fails with CONTAINER_UNAVAILABLE at once, the next one runs in a
 *      fresh container and says so (containerRestarted), the one after is
 *      ordinary;
 *  (c) the gateway is killed and restarted while a client retries one
 *      request id: the command (an append to a file) runs exactly once;
 *  (d) the daemon's data directory (a small tmpfs) fills up: writes fail
 *      with STORAGE_FULL, the shard keeps running, writes succeed again
 *      once space is freed, and everything acknowledged is there after a
 *      restart, with a store mdb_stat opens (with a running container:
 *      test_storage.c).
 *
 * Every process here is one this test started (a child, or a child of the
 * daemon it started, checked through /proc before it is signalled); mounts
 * and directories are removed at the end of each test.  SBX_FAULT_KILLS
 * changes the number of kills of (a); SBX_FAULT_SEED replays a schedule.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"
#include "faults_util.h"

/* ---------------------------------------------------------------------------------- */
/* (a) Acknowledged writes under SIGKILL. */

#define MAX_CREATED 4096
#define MAX_ENV 2000 /* below the 4096 variables a sandbox environment may hold */

enum exist { E_NONE = 0, E_YES, E_NO, E_MAYBE_YES, E_MAYBE_NO };

struct created {
    char id[64];
    enum exist st;
};

/* What one writer knows: which of its writes were acknowledged. */
struct ledger {
    char home[64];                 /* the sandbox its env.set and configure go to */
    long cfg_acked, cfg_sent;      /* sleepAfter seconds: last acknowledged, last sent */
    int env_next;                  /* env.set K<i> sent for i < env_next */
    unsigned char env[MAX_ENV];    /* 0 not sent, 1 acknowledged, 2 outcome unknown */
    struct created made[MAX_CREATED];
    int nmade;
    int acked, unknown;            /* counts */
};

struct killer;

struct writer {
    pthread_t th;
    int idx;
    struct killer *k;
    struct ledger L;
    char url[320];
    unsigned seed;
    char failure[512];             /* an unexpected error, if any */
};

struct killer {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    bool pause, stop;
    int paused;                    /* writers waiting */
    int nwriters;
};

/* Between operations: wait while the main thread restarts and verifies. */
static bool
writer_checkpoint(struct writer *w, bool after_outage)
{
    struct killer *k = w->k;
    bool go;
    pthread_mutex_lock(&k->mu);
    if (after_outage) {
        /* Do not hammer a dead shard: wait until the main thread pauses us. */
        double until = test_now_ms() + 30000;
        while (!k->pause && !k->stop && test_now_ms() < until) {
            pthread_mutex_unlock(&k->mu);
            tsleep_ms(5);
            pthread_mutex_lock(&k->mu);
        }
    }
    if (k->pause) {
        k->paused++;
        pthread_cond_broadcast(&k->cv);
        while (k->pause && !k->stop)
            pthread_cond_wait(&k->cv, &k->mu);
        k->paused--;
    }
    go = !k->stop;
    pthread_mutex_unlock(&k->mu);
    return go;
}

/* Classify a failed call: outage (outcome unknown) or a test failure. */
static bool
writer_failed(struct writer *w, const char *op, tcall *t)
{
    if (outage_error(t->err.code))
        return true;
    snprintf(w->failure, sizeof(w->failure), "%s failed unexpectedly: %s %s", op, t->err.code,
             t->err.message);
    return false;
}

static void *
writer_main(void *arg)
{
    struct writer *w = arg;
    struct ledger *L = &w->L;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, w->url, &err) != 0) {
        snprintf(w->failure, sizeof(w->failure), "client: %s", err.message);
        return NULL;
    }
    sbx_client_set_timeout(c, 15000);
    bool outage = false;
    while (!w->failure[0] && writer_checkpoint(w, outage)) {
        outage = false;
        unsigned r = (unsigned)rand_r(&w->seed) % 100;
        if (r < 40) {
            /* sandbox.configure: an increasing sleepAfter, readable through status. */
            long v = ++L->cfg_sent;
            json_t *a = json_pack("{s:I}", "sleepAfter", (json_int_t)v);
            tcall t = tc_call(c, "sandbox.configure", L->home, a, 0);
            if (t.rc == 0) {
                L->cfg_acked = v;
                L->acked++;
            } else if (writer_failed(w, "sandbox.configure", &t)) {
                outage = true;
                L->unknown++;
            }
            tc_free(&t);
        } else if (r < 70 && L->env_next < MAX_ENV) {
            int i = L->env_next++;
            char k[32], v[32];
            snprintf(k, sizeof(k), "K%d", i);
            snprintf(v, sizeof(v), "v%d", i);
            json_t *a = json_pack("{s:{s:s}}", "vars", k, v);
            tcall t = tc_call(c, "env.set", L->home, a, 0);
            if (t.rc == 0) {
                L->env[i] = 1;
                L->acked++;
            } else if (writer_failed(w, "env.set", &t)) {
                L->env[i] = 2;
                outage = true;
                L->unknown++;
            }
            tc_free(&t);
        } else if (r < 90 && L->nmade < MAX_CREATED) {
            struct created *m = &L->made[L->nmade++];
            snprintf(m->id, sizeof(m->id), "fw%d-%d-%d", w->idx, (int)getpid(), L->nmade);
            tcall t = tc_call(c, "create", m->id, NULL, 0);
            if (t.rc == 0) {
                m->st = E_YES;
                L->acked++;
            } else if (writer_failed(w, "create", &t)) {
                m->st = E_MAYBE_YES;
                outage = true;
                L->unknown++;
            }
            tc_free(&t);
        } else {
            /* destroy one that is known to exist */
            int pick = -1;
            for (int tries = 0; tries < 8 && L->nmade; tries++) {
                int j = (int)((unsigned)rand_r(&w->seed) % (unsigned)L->nmade);
                if (L->made[j].st == E_YES) {
                    pick = j;
                    break;
                }
            }
            if (pick < 0)
                continue;
            struct created *m = &L->made[pick];
            tcall t = tc_call(c, "destroy", m->id, NULL, 0);
            if (t.rc == 0) {
                m->st = E_NO;
                L->acked++;
            } else if (writer_failed(w, "destroy", &t)) {
                m->st = E_MAYBE_NO;
                outage = true;
                L->unknown++;
            }
            tc_free(&t);
        }
    }
    sbx_client_close(c);
    return NULL;
}

static void
pause_writers(struct killer *k)
{
    pthread_mutex_lock(&k->mu);
    k->pause = true;
    pthread_cond_broadcast(&k->cv);
    while (k->paused < k->nwriters)
        pthread_cond_wait(&k->cv, &k->mu);
    pthread_mutex_unlock(&k->mu);
}

static void
resume_writers(struct killer *k, bool stop)
{
    pthread_mutex_lock(&k->mu);
    k->pause = false;
    k->stop = stop;
    pthread_cond_broadcast(&k->cv);
    pthread_mutex_unlock(&k->mu);
}

/*
 * With the writers paused and the shards up again: every acknowledged write
 * is visible, and what was in doubt is resolved to what the store now says
 * (durable from here on: nothing but the store survived the restart).
 * Returns how many records should exist.
 */
static long
verify_ledgers(sbx_client *c, struct writer *ws, int nw, int round)
{
    /* One `list` (it reads every record of every shard) for existence. */
    tcall t = tc_call(c, "list", NULL, NULL, 0);
    cr_assert_eq(t.rc, 0, "round %d: list: %s %s", round, t.err.code, t.err.message);
    json_t *arr = jget(t.res, "sandboxes");
    long exist = 0;
    for (int wi = 0; wi < nw; wi++) {
        struct ledger *L = &ws[wi].L;
        tcall st = tc_call(c, "status", L->home, NULL, 0);
        cr_assert_eq(st.rc, 0, "round %d: status of %s: %s %s", round, L->home, st.err.code,
                     st.err.message);
        long got = (long)(jint(st.res, "sandbox.sleepAfter") / 1000);
        cr_assert(got >= L->cfg_acked && got <= L->cfg_sent,
                  "round %d: %s has sleepAfter %lds; acknowledged %ld, last sent %ld", round,
                  L->home, got, L->cfg_acked, L->cfg_sent);
        L->cfg_acked = L->cfg_sent = got;
        tc_free(&st);
        exist++;
        for (int i = 0; i < L->nmade; i++) {
            struct created *m = &L->made[i];
            if (m->st == E_NONE)
                continue;
            bool there = false;
            for (size_t k = 0; k < json_array_size(arr) && !there; k++)
                there = !strcmp(jstr(json_array_get(arr, k), "id"), m->id);
            if (m->st == E_YES)
                cr_assert(there, "round %d: the acknowledged create of %s was lost", round, m->id);
            if (m->st == E_NO)
                cr_assert(!there, "round %d: the acknowledged destroy of %s was undone", round,
                          m->id);
            m->st = there ? E_YES : E_NO;
            exist += there;
        }
    }
    cr_assert_eq((long)json_array_size(arr), exist, "round %d: %zu sandboxes listed, %ld known",
                 round, json_array_size(arr), exist);
    tc_free(&t);
    return exist;
}

/* Every acknowledged env.set of each writer, read back inside its sandbox. */
static void
verify_env(sbx_client *c, struct writer *ws, int nw)
{
    for (int wi = 0; wi < nw; wi++) {
        struct ledger *L = &ws[wi].L;
        char *out = tsh_out(c, L->home, "env");
        /* Lines "K<i>=v<i>": look for "\nK=V\n" in "\n" + out + "\n". */
        size_t n = strlen(out);
        char *buf = sbx_xmalloc(n + 3);
        buf[0] = '\n';
        memcpy(buf + 1, out, n);
        buf[n + 1] = '\n';
        buf[n + 2] = '\0';
        int seen = 0;
        for (int i = 0; i < L->env_next; i++) {
            char want[48];
            snprintf(want, sizeof(want), "\nK%d=v%d\n", i, i);
            bool there = strstr(buf, want) != NULL;
            if (L->env[i] == 1)
                cr_assert(there, "the acknowledged env.set K%d of %s was lost", i, L->home);
            seen += there;
        }
        free(buf);
        cr_log_info("%s: %d env vars set, %d of them found", L->home, L->env_next, seen);
        free(out);
    }
}

/*
 * Kill and restart shards `kills` times under a stream of writes.  `kill_one`
 * SIGKILLs one shard and returns once it is gone, `restart` brings it back;
 * `data` of the killed shard is checked with mdb_stat while it is down.
 */
struct target {
    const char *url;
    void *ctx;
    int nshards;
    /* SIGKILL shard i; return its data directory (for mdb_stat) in data. */
    void (*kill_one)(void *ctx, int i, char *data, size_t n);
    void (*restart)(void *ctx, int i);
};

static void
kill_loop(struct target *tg, int kills, int nwriters)
{
    unsigned seed = seed_from_env();
    struct killer k = {.nwriters = nwriters};
    pthread_mutex_init(&k.mu, NULL);
    pthread_cond_init(&k.cv, NULL);
    struct writer *ws = sbx_xcalloc((size_t)nwriters, sizeof(*ws));
    sbx_client *c = tc_client(tg->url, 20000);
    for (int i = 0; i < nwriters; i++) {
        struct writer *w = &ws[i];
        w->idx = i;
        w->k = &k;
        w->seed = seed + (unsigned)i * 7919u;
        snprintf(w->url, sizeof(w->url), "%s", tg->url);
        snprintf(w->L.home, sizeof(w->L.home), "fh%d-%d", i, (int)getpid());
        w->L.cfg_acked = w->L.cfg_sent = 60;
        json_t *a = json_pack("{s:I}", "sleepAfter", (json_int_t)60);
        tcall t = tc_call(c, "sandbox.configure", w->L.home, a, 0);
        tc_ok(t, "sandbox.configure");
        tc_free(&t);
        pthread_create(&w->th, NULL, writer_main, w);
    }
    double t0 = test_now_ms();
    for (int round = 1; round <= kills; round++) {
        /* Let the writers run for a random while, then kill a random shard. */
        tsleep_ms(20 + (int)((unsigned)rand_r(&seed) % 500));
        int victim = (int)((unsigned)rand_r(&seed) % (unsigned)tg->nshards);
        char data[400];
        tg->kill_one(tg->ctx, victim, data, sizeof(data));
        pause_writers(&k);
        for (int i = 0; i < nwriters; i++)
            cr_assert(!ws[i].failure[0], "round %d: writer %d: %s", round, i, ws[i].failure);
        /* The store of the dead shard opens cleanly, as LMDB promises after a crash. */
        cr_assert_eq(run("mdb_stat -a %s >/dev/null 2>&1", data), 0,
                     "round %d: mdb_stat cannot read %s after the kill", round, data);
        tg->restart(tg->ctx, victim);
        cr_assert_eq(testd_wait_ready(tg->url, 30000), 0, "round %d: no restart", round);
        verify_ledgers(c, ws, nwriters, round);
        resume_writers(&k, false);
    }
    pause_writers(&k);
    resume_writers(&k, true);
    int acked = 0, unknown = 0;
    for (int i = 0; i < nwriters; i++) {
        pthread_join(ws[i].th, NULL);
        cr_assert(!ws[i].failure[0], "writer %d: %s", i, ws[i].failure);
        acked += ws[i].L.acked;
        unknown += ws[i].L.unknown;
    }
    long exist = verify_ledgers(c, ws, nwriters, kills + 1);
    verify_env(c, ws, nwriters);
    cr_log_info("%d kills in %.1f s: %d writes acknowledged, %d in flight at a kill, %ld "
                "sandboxes exist",
                kills, (test_now_ms() - t0) / 1000, acked, unknown, exist);
    cr_expect(acked > kills, "too few writes acknowledged (%d) to mean anything", acked);
    sbx_client_close(c);
    free(ws);
    pthread_mutex_destroy(&k.mu);
    pthread_cond_destroy(&k.cv);
}

static void
cluster_kill_one(void *ctx, int i, char *data, size_t n)
{
    struct cluster *c = ctx;
    kill(c->shard[i].pid, SIGKILL);
    reap(c->shard[i].pid, 10000);
    c->shard[i].pid = 0;
    snprintf(data, n, "%s", c->shard[i].data);
}

static void
cluster_restart_one(void *ctx, int i)
{
    shard_spawn(ctx, i);
}

static int
env_int(const char *name, int dflt)
{
    const char *s = getenv(name);
    return s && *s ? atoi(s) : dflt;
}

Test(faults, shard_sigkill_loses_no_acknowledged_write, .timeout = 220, .fini = cleanup)
{
    static struct cluster cl;
    cluster_start(&cl, 2);
    struct target tg = {cl.gw.url, &cl, 2, cluster_kill_one, cluster_restart_one};
    kill_loop(&tg, env_int("SBX_FAULT_KILLS", 50), 2);
    /* Stop cleanly; the records on disk are exactly the sandboxes that exist. */
    sbx_client *c = tc_client(cl.gw.url, 20000);
    tcall t = tc_call(c, "list", NULL, NULL, 0);
    tc_ok(t, "list");
    long listed = jint(t.res, "count");
    tc_free(&t);
    sbx_client_close(c);
    cluster_stop(&cl, false);
    long on_disk = 0;
    for (int i = 0; i < cl.nshards; i++) {
        long n = mdb_entries(cl.shard[i].data, "sandboxes");
        cr_assert(n >= 0, "mdb_stat cannot read %s after a clean stop", cl.shard[i].data);
        on_disk += n;
    }
    cr_expect_eq(on_disk, listed, "%ld records on disk, %ld sandboxes listed", on_disk, listed);
    if (!getenv("SBX_KEEP_TEST_DATA"))
        sbx_rm_rf(cl.dir);
    live_cluster = NULL;
}

/* The same under `sbxd dev`, whose supervisor restarts the shard. */
struct devctx {
    struct testd *d;
    pid_t old;
};

static void
dev_kill_one(void *ctx, int i, char *data, size_t n)
{
    struct devctx *dc = ctx;
    char needle[128];
    snprintf(needle, sizeof(needle), "--name=%s-s%d ", dc->d->name, i);
    pid_t pids[4];
    cr_assert_eq(children_matching(dc->d->pid, needle, pids, 4), 1,
                 "shard %d is not a child of sbxd dev %d", i, (int)dc->d->pid);
    dc->old = pids[0];
    kill(pids[0], SIGKILL);
    /* Not our child: wait until the supervisor reaped it. */
    double until = test_now_ms() + 10000;
    while (kill(pids[0], 0) == 0 && test_now_ms() < until)
        tsleep_ms(5);
    snprintf(data, n, "%s/s%d", dc->d->dir, i);
}

static void
dev_restart_one(void *ctx, int i)
{
    struct devctx *dc = ctx;
    char needle[128];
    snprintf(needle, sizeof(needle), "--name=%s-s%d ", dc->d->name, i);
    pid_t pids[4];
    double until = test_now_ms() + 15000;
    while (test_now_ms() < until) {
        if (children_matching(dc->d->pid, needle, pids, 4) == 1 && pids[0] != dc->old)
            return;
        tsleep_ms(10);
    }
    cr_assert_fail("sbxd dev did not restart shard %d", i);
}

Test(faults, sbxd_dev_restarts_a_killed_shard_without_losing_writes, .timeout = 120,
     .fini = cleanup)
{
    static struct testd d;
    static const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_start(&d, 2, extra), 0, "sbxd dev did not start");
    live_testd = &d;
    struct devctx dc = {&d, 0};
    struct target tg = {d.url, &dc, 2, dev_kill_one, dev_restart_one};
    /* Few enough that the supervisor's back-off stays under a second. */
    kill_loop(&tg, 5, 2);
    testd_stop(&d);
    live_testd = NULL;
}
