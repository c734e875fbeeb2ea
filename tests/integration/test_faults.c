/*
 * test_faults.c — fault injection: what survives a crash, and what a
 * client sees while it happens.
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

/* ---------------------------------------------------------------------------------- */
/* Small helpers. */

static unsigned
seed_from_env(void)
{
    const char *s = getenv("SBX_FAULT_SEED");
    unsigned seed = s && *s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)(time(NULL) ^ getpid());
    cr_log_info("seed %u (SBX_FAULT_SEED=%u replays it)", seed, seed);
    return seed;
}

static const char *
bin_dir(void)
{
    const char *b = getenv("SBX_BIN");
    return b && *b ? b : "build/asan/bin";
}

/* Run a shell command line of our own (mdb_stat & co.); its exit status. */
static int
run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int
run(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The "Entries:" of one named database, from mdb_stat; -1 on failure. */
static long
mdb_entries(const char *dir, const char *db)
{
    char cmd[600], line[256];
    long n = -1;
    snprintf(cmd, sizeof(cmd), "mdb_stat -s %s %s 2>&1", db, dir);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, " Entries: %ld", &n) == 1)
            break;
    if (pclose(f) != 0)
        n = -1;
    return n;
}

/* Wait for our child pid to end (it was SIGKILLed or SIGTERMed). */
static void
reap(pid_t pid, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (test_now_ms() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return;
        }
        tsleep_ms(5);
    }
}

/* /proc/<pid>/cmdline with NULs as spaces ("" if gone). */
static void
cmdline_of(pid_t pid, char *out, size_t n)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t k = read(fd, out, n - 1);
    close(fd);
    if (k <= 0)
        return;
    for (ssize_t i = 0; i < k; i++)
        if (!out[i])
            out[i] = ' ';
    out[k] = '\0';
}

/*
 * The children of `parent` (every thread's /proc/<pid>/task/<tid>/children)
 * whose command line contains `needle`; up to max pids in out.  This is how
 * the shards of an `sbxd dev` are found: never by name.
 */
static int
children_matching(pid_t parent, const char *needle, pid_t *out, int max)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)parent);
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < max) {
        if (de->d_name[0] == '.')
            continue;
        char path[128], *buf = NULL;
        size_t len;
        snprintf(path, sizeof(path), "%s/%s/children", dir, de->d_name);
        if (sbx_fs_read(path, 1 << 16, &buf, &len) != 0)
            continue;
        char *save = NULL;
        for (char *t = strtok_r(buf, " \n", &save); t && n < max;
             t = strtok_r(NULL, " \n", &save)) {
            char cl[1024];
            pid_t pid = (pid_t)atoi(t);
            cmdline_of(pid, cl, sizeof(cl));
            if (strstr(cl, needle))
                out[n++] = pid;
        }
        free(buf);
    }
    closedir(d);
    return n;
}

/* An error a client may see while a shard or gateway is down. */
static bool
outage_error(const char *code)
{
    return !strcmp(code, "SHARD_UNAVAILABLE") || !strcmp(code, "GATEWAY_UNAVAILABLE") ||
           !strcmp(code, "REQUEST_TIMEOUT") || !strcmp(code, "OPERATION_INTERRUPTED");
}

/* ---------------------------------------------------------------------------------- */
/* A cluster the test supervises: N `sbxd shard` + one `sbxd gateway`. */

struct node {
    pid_t pid;
    char name[64];
    char url[320];
    char data[320];
    char uid[32];
};

struct cluster {
    char dir[256];
    char name[32];
    char log[320];
    int nshards;
    struct node shard[4];
    struct node gw;
    char gw_shards[4][400];
};

/*
 * What a failed assertion would leave behind (it leaves the test function
 * at once): the cluster, a daemon, a mount.  Each test that makes one names
 * it here and `.fini = cleanup` undoes whatever is still there.
 */
static struct cluster *live_cluster;
static struct testd *live_testd;
static char live_mount[64];

static pid_t
spawn_argv(const char *log, const char *const *argv)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* A test process that dies takes its daemons with it. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

static void
shard_spawn(struct cluster *c, int i)
{
    char sbxd[512];
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin_dir());
    struct node *n = &c->shard[i];
    char name[80], listen[340], data[340], uid[48];
    snprintf(name, sizeof(name), "--name=%s", n->name);
    snprintf(listen, sizeof(listen), "--listen=%s", n->url);
    snprintf(data, sizeof(data), "--data=%s", n->data);
    snprintf(uid, sizeof(uid), "--uid-base=%s", n->uid);
    const char *argv[] = {sbxd, "shard", name, listen, data, uid, "--pool", "0", "--memory",
                          "256M", "--pids", "128", "--disk", "64M", NULL};
    n->pid = spawn_argv(c->log, argv);
}

static void
gw_spawn(struct cluster *c)
{
    char sbxd[512], listen[340];
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin_dir());
    snprintf(listen, sizeof(listen), "--listen=%s", c->gw.url);
    const char *argv[16] = {sbxd, "gateway", "--name", c->gw.name, listen};
    int k = 5;
    for (int i = 0; i < c->nshards; i++) {
        argv[k++] = "--shard";
        argv[k++] = c->gw_shards[i];
    }
    argv[k] = NULL;
    c->gw.pid = spawn_argv(c->log, argv);
}

static void
cluster_print_log(const struct cluster *c)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(c->log, 1 << 20, &buf, &n) == 0) {
        fprintf(stderr, "---- cluster log (%s) ----\n%s\n---- end ----\n", c->log, buf);
        free(buf);
    }
}

/* For a failure message: does each process answer on its own? */
static void
cluster_diagnose(const struct cluster *c)
{
    for (int i = -1; i < c->nshards; i++) {
        const struct node *n = i < 0 ? &c->gw : &c->shard[i];
        sbx_client *cl = NULL;
        sbx_reply *r = NULL;
        sbx_error err = {0};
        int rc = sbx_client_open(&cl, n->url, &err);
        if (rc == 0)
            rc = sbx_call(cl, "cluster.status", NULL, NULL, 0, 3000, NULL, &r, &err);
        char *js = rc == 0 ? sbx_reply_json(r, false) : NULL;
        fprintf(stderr, "diagnose: %s (pid %d, %s): %s %s\n", n->name, (int)n->pid,
                n->pid > 0 && kill(n->pid, 0) == 0 ? "alive" : "gone", rc ? err.code : "answers",
                rc ? err.message : js);
        free(js);
        sbx_reply_free(r);
        sbx_error_free(&err);
        sbx_client_close(cl);
    }
}

static void
cluster_ready(struct cluster *c)
{
    if (testd_wait_ready(c->gw.url, 30000) != 0) {
        cluster_print_log(c);
        cluster_diagnose(c);
        cr_assert_fail("the cluster did not become ready");
    }
}

static void
cluster_start(struct cluster *c, int nshards)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "/tmp/sbx-faults-%sXXXXXX", test_prefix());
    cr_assert(mkdtemp(c->dir) != NULL, "mkdtemp");
    live_cluster = c;
    /* Shard and cgroup names derive from the directory: unique per run. */
    snprintf(c->name, sizeof(c->name), "f%s", strrchr(c->dir, '-') + 1);
    for (char *p = c->name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
            *p = (*p >= 'A' && *p <= 'Z') ? (char)(*p - 'A' + 'a') : 'x';
    snprintf(c->log, sizeof(c->log), "%s/cluster.log", c->dir);
    c->nshards = nshards;
    /* Host uids of our own, away from the ranges of `sbxd dev` daemons. */
    unsigned base = 1500000000u + (unsigned)(getpid() % 4000) * 4u * 65536u;
    char dir[256], name[32];
    snprintf(dir, sizeof(dir), "%s", c->dir);
    snprintf(name, sizeof(name), "%s", c->name);
    for (int i = 0; i < nshards; i++) {
        struct node *n = &c->shard[i];
        snprintf(n->name, sizeof(n->name), "%s-s%d", name, i);
        snprintf(n->url, sizeof(n->url), "ipc://%s/s%d.sock", dir, i);
        snprintf(n->data, sizeof(n->data), "%s/s%d", dir, i);
        snprintf(n->uid, sizeof(n->uid), "%u", base + (unsigned)i * 65536u);
        snprintf(c->gw_shards[i], sizeof(c->gw_shards[i]), "%s-s%d=ipc://%s/s%d.sock", name, i,
                 dir, i);
        shard_spawn(c, i);
    }
    snprintf(c->gw.name, sizeof(c->gw.name), "%s-gw", name);
    snprintf(c->gw.url, sizeof(c->gw.url), "ipc://%s/gw.sock", dir);
    gw_spawn(c);
    cluster_ready(c);
}

/* SIGTERM everything (gateway first), wait, keep the data unless told. */
static void
cluster_stop(struct cluster *c, bool remove)
{
    struct node *all[5];
    int n = 0;
    all[n++] = &c->gw;
    for (int i = 0; i < c->nshards; i++)
        all[n++] = &c->shard[i];
    for (int i = 0; i < n; i++)
        if (all[i]->pid > 0)
            kill(all[i]->pid, SIGTERM);
    for (int i = 0; i < n; i++) {
        if (all[i]->pid > 0)
            reap(all[i]->pid, 20000);
        all[i]->pid = 0;
    }
    if (remove && c->dir[0] && !getenv("SBX_KEEP_TEST_DATA"))
        sbx_rm_rf(c->dir);
    if (remove)
        live_cluster = NULL;
}

static void cluster_stop(struct cluster *c, bool remove);

static void
cleanup(void)
{
    if (live_cluster)
        cluster_stop(live_cluster, true);
    if (live_testd && live_testd->pid > 0)
        testd_stop(live_testd);
    test_tmpfs_remove(live_mount);
    live_cluster = NULL;
    live_testd = NULL;
    live_mount[0] = '\0';
}

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

/* ---------------------------------------------------------------------------------- */
/* (b) The agent dies. */

struct bg_exec {
    pthread_t th;
    const char *id;
    const char *cmd;
    tcall t;
    double ms;
};

static void *
bg_exec_main(void *arg)
{
    struct bg_exec *b = arg;
    sbx_client *c = test_client();
    double t0 = test_now_ms();
    b->t = tc_call(c, "exec", b->id, json_pack("{s:s}", "command", b->cmd), 60000);
    b->ms = test_now_ms() - t0;
    sbx_client_close(c);
    return NULL;
}

/* The host pid of the sandbox's agent, checked to belong to our daemon. */
static pid_t
agent_pid(sbx_client *c, const char *id)
{
    json_t *sb = ts_status(c, id);
    pid_t pid = (pid_t)jint(sb, "container.pid");
    json_decref(sb);
    cr_assert(pid > 1, "no container pid in status");
    const char *dir = getenv("SBX_TEST_DIR");
    cr_assert(dir && *dir, "SBX_TEST_DIR is not set");
    bool ours = false;
    for (pid_t p = test_ppid(pid), k = 0; p > 1 && k < 4; p = test_ppid(p), k++) {
        char cl[1024];
        cmdline_of(p, cl, sizeof(cl));
        if (strstr(cl, dir))
            ours = true;
    }
    cr_assert(ours, "pid %d does not descend from the test's daemon", (int)pid);
    return pid;
}

Test(faults, killed_agent_fails_the_running_op_and_a_fresh_container_serves_the_next)
{
    sbx_client *c = test_client();
    char *id = test_id("fagent");
    char *out = tsh_out(c, id, "echo before > /workspace/mark; echo ok");
    cr_assert_str_eq(out, "ok\n");
    free(out);
    json_t *sb = ts_status(c, id);
    long long restarts0 = jint(sb, "restarts");
    json_decref(sb);
    pid_t pid = agent_pid(c, id);

    /* An operation in flight when the agent dies fails now, not after its 30 s. */
    struct bg_exec b = {.id = id, .cmd = "sleep 30; echo late"};
    pthread_create(&b.th, NULL, bg_exec_main, &b);
    tsleep_ms(500);
    cr_assert_eq(kill(pid, SIGKILL), 0, "kill agent %d", (int)pid);
    pthread_join(b.th, NULL);
    tc_fails_with(b.t, "exec during the kill", "CONTAINER_UNAVAILABLE");
    cr_expect_lt(b.ms, 15000, "the failing exec took %.0f ms", b.ms);
    tc_free(&b.t);

    /* The next operation runs in a fresh container and says so. */
    tcall t = tc_call(c, "exec", id,
                      json_pack("{s:s}", "command", "cat /workspace/mark 2>&1; echo ok"), 0);
    tc_ok(t, "exec after the kill");
    cr_expect_eq(jbool(t.res, "containerRestarted"), 1, "containerRestarted missing");
    sbx_str so = tc_bin(&t, "stdout");
    cr_expect(so.n >= 3 && memmem(so.p, so.n, "ok\n", 3) && !memmem(so.p, so.n, "before", 6),
              "the new container still has the old one's file: %.*s", (int)so.n, so.p);
    tc_free(&t);
    sb = ts_status(c, id);
    cr_expect_gt(jint(sb, "restarts"), restarts0, "restarts did not grow");
    cr_expect_neq(jint(sb, "container.pid"), pid, "same agent pid after the restart");
    cr_expect(strlen(jstr(sb, "lastExit")) > 0, "no lastExit");
    json_decref(sb);

    /* And the one after that is ordinary. */
    t = tc_call(c, "exec", id, json_pack("{s:s}", "command", "echo again"), 0);
    tc_ok(t, "second exec after the kill");
    cr_expect_neq(jbool(t.res, "containerRestarted"), 1, "containerRestarted repeated");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* A session env name with a NUL in it used to make the agent read past a
 * heap block (agent_env_merge; tests/fuzz/fuzz_agent.c found it): the ASan
 * agent aborted, the container died.  Now the name is ignored. */
Test(faults, session_env_name_with_nul_does_not_kill_the_agent)
{
    sbx_client *c = test_client();
    char *id = test_id("fenv");
    char *out = tsh_out(c, id, "echo ok");
    free(out);
    pid_t pid = agent_pid(c, id);
    /* {"id": "s1", "env": {"HOME=/root\0X": "v"}}: the name matches the
     * base entry HOME=/root up to the NUL and is one byte longer. */
    sbx_enc e;
    char *args;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "id", "s1");
    sbx_enc_kmap(&e, "env");
    sbx_enc_strn(&e, "HOME=/root\0X", 12);
    sbx_enc_str(&e, "v");
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &args, &len), 0);
    sbx_reply *r = NULL;
    sbx_error err;
    sbx_call(c, "session.create", id, args, len, 20000, NULL, &r, &err);
    sbx_reply_free(r);
    sbx_error_free(&err);
    free(args);
    sbx_exec_opts o = {.command = "echo $HOME", .session_id = "s1"};
    sbx_exec_result res = tsh_opts(c, id, &o);
    cr_expect_str_eq(res.stdout_data, "/root\n");
    sbx_exec_result_free(&res);
    cr_expect_eq(agent_pid(c, id), pid, "the agent was replaced");
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* (c) Gateway restart during retries of one request id. */

struct gw_call {
    pthread_t th;
    const char *url, *id, *rid;
    char *args;
    size_t args_len;
    int rc;
    char code[48];
};

static int
exec_with_id(sbx_client *c, const char *id, const char *rid, const char *args, size_t len,
             char code[48])
{
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call(c, "exec", id, args, len, 8000, rid, &r, &err);
    snprintf(code, 48, "%s", rc ? err.code : "");
    sbx_error_free(&err);
    sbx_reply_free(r);
    return rc;
}

static void *
gw_call_main(void *arg)
{
    struct gw_call *g = arg;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, g->url, &err) != 0) {
        g->rc = -1;
        snprintf(g->code, sizeof(g->code), "%s", err.code);
        return NULL;
    }
    g->rc = exec_with_id(c, g->id, g->rid, g->args, g->args_len, g->code);
    sbx_client_close(c);
    return NULL;
}

Test(faults, gateway_restart_with_retried_request_id_applies_once, .timeout = 180,
     .fini = cleanup)
{
    static struct cluster cl;
    cluster_start(&cl, 1);
    sbx_client *c = tc_client(cl.gw.url, 20000);
    const char *id = "fgw";
    char *out = tsh_out(c, id, ": > /workspace/log; echo ok");
    cr_assert_str_eq(out, "ok\n");
    free(out);
    /* The gateway dies before, while and after the shard runs the command. */
    static const int delays_ms[] = {0, 5, 50, 200, 450, 700, 1200};
    int n = (int)SBX_ARRAY_LEN(delays_ms);
    for (int i = 0; i < n; i++) {
        char cmd[128], rid[64];
        snprintf(cmd, sizeof(cmd), "sleep 0.4; echo run%d >> /workspace/log; echo done%d", i, i);
        snprintf(rid, sizeof(rid), "fgw-%d-%d", (int)getpid(), i);
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "command", cmd);
        sbx_enc_end(&e);
        struct gw_call g = {.url = cl.gw.url, .id = id, .rid = rid};
        cr_assert_eq(sbx_enc_finish(&e, &g.args, &g.args_len), 0);
        pthread_create(&g.th, NULL, gw_call_main, &g);
        tsleep_ms(delays_ms[i]);
        kill(cl.gw.pid, SIGKILL);
        reap(cl.gw.pid, 10000);
        gw_spawn(&cl);
        cluster_ready(&cl);
        pthread_join(g.th, NULL);
        cr_assert(g.rc == 0 || outage_error(g.code), "attempt %d: %s", i, g.code);
        /* Retry with the same id until it succeeds, then once more. */
        int ok = g.rc == 0, extra = 0;
        double until = test_now_ms() + 30000;
        while (extra < 2 && test_now_ms() < until) {
            char code[48];
            int rc = exec_with_id(c, id, rid, g.args, g.args_len, code);
            cr_assert(rc == 0 || outage_error(code), "retry %d: %s", i, code);
            if (rc == 0 || ok)
                extra++;
            ok |= rc == 0;
            if (rc)
                tsleep_ms(50);
        }
        cr_assert(ok, "attempt %d never succeeded", i);
        free(g.args);
    }
    out = tsh_out(c, id,
                  "sort /workspace/log | uniq -c | awk '{print $1}' | sort -u | tr '\\n' ' '; "
                  "wc -l < /workspace/log");
    char want[32];
    snprintf(want, sizeof(want), "1 %d\n", n);
    cr_expect_str_eq(out, want, "each command must run exactly once (counts, then lines)");
    free(out);
    sbx_client_close(c);
    cluster_stop(&cl, true);
}

/* A client that keeps retrying a long command (its own deadline shorter
 * than the command) piles up attempts with one id at the shard: each one
 * must wait for the first run's reply, however many there are. */
Test(faults, many_concurrent_retries_of_one_request_id_run_it_once)
{
    sbx_client *c = test_client();
    char *id = test_id("fdup");
    char *out = tsh_out(c, id, ": > /workspace/dup; echo ok");
    free(out);
    char rid[64];
    snprintf(rid, sizeof(rid), "fdup-%d", (int)getpid());
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "command", "echo run >> /workspace/dup; sleep 2; echo done");
    sbx_enc_end(&e);
    enum { N = 8 };
    struct gw_call g[N];
    char *args;
    size_t len;
    cr_assert_eq(sbx_enc_finish(&e, &args, &len), 0);
    for (int i = 0; i < N; i++) {
        g[i] = (struct gw_call){.url = test_url(), .id = id, .rid = rid, .args = args,
                                .args_len = len};
        pthread_create(&g[i].th, NULL, gw_call_main, &g[i]);
        tsleep_ms(20);
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(g[i].th, NULL);
        ok += g[i].rc == 0;
    }
    free(args);
    out = tsh_out(c, id, "wc -l < /workspace/dup");
    cr_expect_str_eq(out, "1\n", "the command ran more than once for one request id");
    cr_expect_gt(ok, 0, "no attempt succeeded");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

/* Each env.set is valid on its own, but together they could make an
 * environment so large that execve fails (E2BIG) for every command of the
 * sandbox, and the record would keep it across restarts.  The total is
 * bounded: the env.set that would cross the bound is refused. */
Test(faults, env_that_would_stop_every_command_is_refused)
{
    sbx_client *c = test_client();
    char *id = test_id("fenvbig");
    size_t vlen = 120000;
    char *v = sbx_xmalloc(vlen + 1);
    memset(v, 'v', vlen);
    v[vlen] = '\0';
    int refused = -1;
    for (int i = 0; i < 20 && refused < 0; i++) {
        char k[16];
        snprintf(k, sizeof(k), "BIG%d", i);
        tcall t = tc_call(c, "env.set", id, json_pack("{s:{s:s}}", "vars", k, v), 0);
        if (t.rc != 0) {
            tc_fails_with(t, "env.set beyond the bound", "VALIDATION_FAILED");
            refused = i;
        }
        tc_free(&t);
    }
    free(v);
    cr_assert(refused > 0, "no env.set was refused (20 x 120 KB)");
    /* Commands still start, with every accepted variable and not the refused one. */
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "env | grep -c '^BIG'; printenv BIG%d | wc -c", refused);
    char *out = tsh_out(c, id, cmd);
    char want[32];
    snprintf(want, sizeof(want), "%d\n0\n", refused);
    cr_expect_str_eq(out, want, "accepted variables, then the length of the refused one");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* (d) The data directory fills up. */

Test(faults, full_data_directory_gives_storage_full_and_recovers, .timeout = 150,
     .fini = cleanup)
{
    char mnt[64];
    cr_assert_eq(test_tmpfs_mount(mnt, sizeof(mnt), "full", "8m"), 0, "mount tmpfs: %s",
                 strerror(errno));
    snprintf(live_mount, sizeof(live_mount), "%s", mnt);
    static struct testd d;
    const char *const extra[] = {"--data", mnt, "--pool", "0", "--memory", "256M", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start on the tmpfs");
    live_testd = &d;
    sbx_client *c = tc_client(d.url, 30000);
    const char *id = "ffull";
    char code[48], key[32];
    cr_assert_eq(tc_env_fill(c, id, "BEFORE", 10, code), 0, "env.set before: %s", code);
    long long pid = tc_shard_status(c, "pid");

    /* Fill the file system. */
    char filler[300];
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0);
    static char block[65536];
    while (write(fd, block, sizeof(block)) > 0)
        ;
    while (write(fd, block, 512) > 0)
        ;
    close(fd);

    /* Big values need new pages: the commit cannot be written. */
    int acked_full = 0, failed = 0;
    unsigned char acked[40] = {0};
    for (int i = 0; i < 40 && failed < 3; i++) {
        snprintf(key, sizeof(key), "FULL%d", i);
        int rc = tc_env_fill(c, id, key, 60000, code);
        if (rc == 0) {
            acked[i] = 1;
            acked_full++;
        } else {
            cr_assert_str_eq(code, "STORAGE_FULL", "env.set on a full disk: %s", code);
            failed++;
        }
    }
    cr_assert_gt(failed, 0, "no STORAGE_FULL on a full file system");
    cr_expect_gt(tc_shard_status(c, "storeFailures"), 0, "storeFailures not counted");
    cr_assert_eq(tc_shard_status(c, "pid"), pid, "the shard restarted: it crashed");
    /* Reads keep working. */
    tcall t = tc_call(c, "status", id, NULL, 0);
    tc_ok(t, "status on a full disk");
    tc_free(&t);

    /* Space again: writes succeed and are durable. */
    cr_assert_eq(unlink(filler), 0);
    cr_assert_eq(tc_env_fill(c, id, "AFTER", 60000, code), 0, "env.set after freeing space: %s", code);
    cr_assert_eq(testd_restart(&d, 1, extra), 0, "restart on the tmpfs");
    sbx_client_close(c);
    c = tc_client(d.url, 30000);
    char *out = tsh_out(c, id, "env | cut -d= -f1 | grep -E '^(BEFORE|AFTER|FULL[0-9]+)$' | sort");
    cr_expect(strstr(out, "BEFORE\n") && strstr(out, "AFTER\n"), "lost: %s", out);
    for (int i = 0; i < 40; i++) {
        char want[32];
        snprintf(want, sizeof(want), "FULL%d\n", i);
        if (acked[i])
            cr_expect(strstr(out, want) != NULL, "acknowledged %s lost", want);
    }
    free(out);
    sbx_client_close(c);
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/s0", mnt);
    testd_stop(&d);
    live_testd = NULL;
    cr_expect_eq(run("mdb_stat -a %s >/dev/null 2>&1", dir), 0, "mdb_stat cannot read %s", dir);
    cr_expect_eq(umount2(mnt, 0), 0, "umount %s: %s", mnt, strerror(errno));
    rmdir(mnt);
    live_mount[0] = '\0';
    cr_log_info("full disk: %d big writes acknowledged, %d refused", acked_full, failed);
}
