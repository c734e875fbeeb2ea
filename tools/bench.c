/*
 * sbx-bench — latency and throughput figures of an sbx deployment.
 *
 *   sbx-bench [--gateway URL] [--cold N] [--warm N] [--parallel N]
 *             [--seconds S] [--pool N] [--burst N[,N…]] [--rounds R]
 *             [--idle M] [--image PATH [--image-starts N]] [--json]
 *
 * By default sbx-bench starts its own private daemon,
 *
 *   sbxd dev --data DIR --listen ipc://DIR/gw.sock --name benchXXXXXX --shards 2 [--pool N]
 *
 * in a fresh mkdtemp directory DIR (sbxd is taken from $SBX_BIN, else from
 * the directory of this executable), waits until `cluster.status` answers
 * with every shard healthy, runs the phases below, then stops the daemon
 * with SIGTERM (by pid) and removes DIR.  sbxd must therefore run as root.
 *
 * Options:
 *   --gateway URL  use an existing deployment instead of a private daemon
 *                  (sandbox IDs are unique to this run; all are destroyed)
 *   --cold N       cold starts to time (default 200)
 *   --warm N       warm session execs to time (default 2000); N/4 sessionless
 *   --parallel N   sandboxes and client threads of the throughput phase (50)
 *                  (--cold/--warm/--parallel 0 skip that phase)
 *   --seconds S    length of the throughput phase in seconds (default 10)
 *   --pool N       passed to `sbxd dev` as --pool N (default: sbxd's own)
 *   --sbxd-arg A   one more argument for the private `sbxd dev` (repeat, up
 *                  to 8; e.g. --sbxd-arg --sandbox-cpu-share --sbxd-arg 0),
 *                  for runs of one client against differently set daemons
 *   --burst LIST   burst sizes, comma-separated (e.g. 50,200); the burst
 *                  phase runs only when given (tools/bench_burst.c)
 *   --rounds R     bursts per size (default 3); medians are printed
 *   --idle M       idle sandboxes created before the bursts (default 0)
 *   --image PATH   an image to import (a layout or tarball on this machine), then
 *                  N cold starts of its sandboxes beside N host-/usr ones
 *                  (--image-starts, default 50; tools/bench_image.c); with
 *                  --burst also the bursts with sandboxes of the image
 *   --workspace-wake N  N wake-ups of a slept sandbox with a persistent 100 MB
 *                  workspace beside N of an ephemeral one (tools/bench_workspace.c)
 *   --fork N       N forks of a running sandbox with a persistent 100 MB
 *                  workspace (sandbox.fork; tools/bench_workspace.c)
 *   --json         print a JSON summary on stdout; the human-readable lines
 *                  then go to stderr
 *
 * Figures (all latencies in milliseconds, from CLOCK_MONOTONIC on the client
 * side, i.e. they include the client library, the gateway hop and the shard
 * hop; percentiles are nearest-rank over the sorted samples):
 *
 *   machine        kernel (uname), online CPUs, cgroup mode (the "cgroups"
 *                  field of the first shard's cluster.status), sbxd binary
 *                  and its modification time.
 *   bwrap baseline `bwrap --unshare-all --ro-bind /usr /usr … --proc /proc
 *                  --dev /dev true`, 200 runs (after 5 untimed ones), each
 *                  timed from fork() to waitpid() returning; p50/p99.
 *   cold start     per new sandbox ID, from sending its first `exec true`
 *                  (default session) to receiving the result: placement,
 *                  sandbox creation, metadata commit, container start (or a
 *                  pool take), session shell start and the command itself.
 *                  Sequential; p50/p90/p99/max/mean.  Each sandbox is then
 *                  destroyed; sbx_destroy is timed separately (p50/p99).
 *                  The shards' counters give the pool hits and the mean
 *                  shard-side container start time during the phase.
 *   warm exec      one sandbox, `exec true` in the default session, N calls
 *                  after 50 warm-up calls; and sessionless (a fresh process
 *                  per call) N/4 calls after 50 warm-up calls.
 *                  p50/p90/p99/max/mean each.  Then a 1 MiB file round
 *                  trip: sbx_write_file of 1 MiB of random bytes followed by
 *                  sbx_read_file of it (checked equal), N/20 times (at least
 *                  20) after 5 warm-up trips; and MiB/s of the pair.
 *   throughput     P sandboxes created and warmed first, then P threads
 *                  sharing one sbx_client, each running `exec true` on its
 *                  own sandbox in a loop for S seconds.  Total completed
 *                  execs / elapsed seconds (execs/s), and p50/p99 latency
 *                  of the calls under that load; then the spread between
 *                  the sandboxes: the range of their p50s and of their
 *                  maxima, and how many had a max over 100 ms, for all
 *                  and per shard (printed only, not in --json).
 *   burst          (only with --burst) M idle sandboxes created first by 8
 *                  client threads (their creation rate printed); then per
 *                  size N, R rounds of: N client threads, one sbx_client
 *                  each, connected before a barrier releases them together,
 *                  each timing `exec true` on a new sandbox ID (create →
 *                  first result); the shards' counters before and after
 *                  give the containers started (pool refills included),
 *                  pool hits and the mean shard-side build time (meanStartUs
 *                  of status: clone to the agent's "ready", on a worker
 *                  thread); then N threads each running the bwrap baseline
 *                  command once, released together.  p50/p95/p99/max per
 *                  round and their medians over the rounds.
 *   ratio          cold start p50 / bwrap p50 ("sbx cold start = 0.8x bwrap").
 *
 * Exit status: 0 when every phase ran without a failed call, 1 when a call
 * failed or the daemon could not be started, 2 on usage errors.
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../include/sbx/sbx.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "bench.h"
#include "stats.h"

#define WARMUP_CALLS 50
#define BWRAP_RUNS 200
#define BWRAP_WARMUP 5
#define READY_TIMEOUT_MS 30000
#define STOP_TIMEOUT_MS 20000

struct opts {
    const char *gateway; /* NULL: start a private daemon */
    long cold, warm, parallel, seconds, pool; /* pool < 0: sbxd's default */
    long bursts[8], rounds, idle;             /* --burst sizes (0-terminated) */
    size_t nbursts;
    bool json;
    const char *image;   /* --image PATH: the image phase (bench_image.c) */
    long image_starts;
    long ws_wake;        /* --workspace-wake N: the wake-up phase (bench_workspace.c) */
    long forks;          /* --fork N: the fork phase (bench_workspace.c) */
    const char *sbxd_args[8]; /* --sbxd-arg: appended to the private daemon's arguments */
    size_t nsbxd_args;
};

/* ------------------------------------------------------------------------------ */
/* Signals. */

static volatile sig_atomic_t interrupted;

static void
on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

/* ------------------------------------------------------------------------------ */
/* Results and output. */

struct results {
    char date[40];
    char kernel[320];
    long cpus;
    char cgroups[160];
    char sbxd[PATH_MAX + 48]; /* path and build time */
    char gateway[PATH_MAX + 16];
    long pool; /* -1: default */

    bool have_bwrap;
    char bwrap_note[PATH_MAX + 96];
    struct sbx_summary bwrap;

    struct sbx_summary cold, destroy;
    size_t cold_failures;
    int64_t cold_containers, cold_pool_hits;
    double cold_mean_start_ms;

    struct sbx_summary warm, sessionless, file_rt;
    size_t warm_failures;

    struct sbx_summary load;
    double execs_per_s, load_seconds;
    size_t load_execs, load_failures;

    json_t *burst; /* bench_burst_run's figures (owned), or NULL */
    size_t burst_failures;
};

static FILE *human; /* stdout, or stderr with --json */

static void
say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void
say(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vfprintf(human, fmt, ap);
    va_end(ap);
    fflush(human);
}

static void
say_stats(const char *label, const struct sbx_summary *s)
{
    if (!s->n) {
        say("  %-34s no samples\n", label);
        return;
    }
    say("  %-34s n=%-5zu p50 %7.3f  p90 %7.3f  p99 %7.3f  max %8.3f  mean %7.3f ms\n", label,
        s->n, s->p50, s->p90, s->p99, s->max, s->mean);
}

/* A JSON number, or null for NAN. */
static json_t *
jnum(double x)
{
    return isnan(x) ? json_null() : json_real(round(x * 1000.0) / 1000.0);
}

static json_t *
jstats(const struct sbx_summary *s)
{
    return json_pack("{s:I, s:o, s:o, s:o, s:o, s:o}", "n", (json_int_t)s->n, "p50_ms",
                     jnum(s->p50), "p90_ms", jnum(s->p90), "p99_ms", jnum(s->p99), "max_ms",
                     jnum(s->max), "mean_ms", jnum(s->mean));
}

static void
print_error(const char *what, const sbx_error *err)
{
    say("  %s: %s: %s\n", what, err->code[0] ? err->code : "ERROR", err->message);
}

/* ------------------------------------------------------------------------------ */
/* The private daemon. */

struct daemon {
    pid_t pid;
    char dir[PATH_MAX];
    char url[PATH_MAX + 16];
    char name[64];
    char log[PATH_MAX + 16];
    char sbxd[PATH_MAX];
};

static int
find_sbxd(char *out, size_t n)
{
    const char *b = getenv("SBX_BIN");
    if (b && *b) {
        snprintf(out, n, "%s/sbxd", b);
    } else {
        char self[PATH_MAX];
        ssize_t k = readlink("/proc/self/exe", self, sizeof(self) - 1);
        if (k <= 0)
            return -1;
        self[k] = '\0';
        snprintf(out, n, "%s/sbxd", dirname(self));
    }
    return access(out, X_OK) == 0 ? 0 : -1;
}

static void
print_log_tail(const struct daemon *d)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(d->log, 64u << 20, &buf, &n) != 0)
        return;
    const char *p = n > 4096 ? buf + n - 4096 : buf;
    fprintf(stderr, "---- sbxd log (%s, tail) ----\n%s---- end ----\n", d->log, p);
    free(buf);
}

/* bench_cluster_totals — one cluster.status: shard health and summed counters. */
int
bench_cluster_totals(sbx_client *c, struct bench_totals *t, sbx_error *err)
{
    sbx_reply *r = NULL;
    memset(t, 0, sizeof(*t));
    if (sbx_call(c, "cluster.status", NULL, NULL, 0, 5000, NULL, &r, err) != 0)
        return -1;
    const msgpack_object *arr;
    t->all_ok = true;
    if (sbx_wire_get_array(sbx_reply_result(r), "shards", &arr) == 0) {
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            const msgpack_object *sh = &arr->via.array.ptr[i], *st;
            sbx_str h = {"", 0}, cg = {"", 0};
            int64_t started = 0, hits = 0, mean_us = 0, pool = 0, target = 0;
            t->nshards++;
            sbx_wire_get_str(sh, "health", &h);
            if (!sbx_str_eq(h, "ok"))
                t->all_ok = false;
            if (sbx_wire_get_map(sh, "status", &st) != 0)
                continue;
            sbx_wire_get_i64(st, "containersStarted", &started);
            sbx_wire_get_i64(st, "poolHits", &hits);
            sbx_wire_get_i64(st, "meanStartUs", &mean_us);
            sbx_wire_get_i64(st, "pool", &pool);
            sbx_wire_get_i64(st, "poolTarget", &target);
            t->started += started;
            t->pool_hits += hits;
            t->start_us_total += mean_us * started;
            t->pool += pool;
            t->pool_target += target;
            if (!t->cgroups[0] && sbx_wire_get_str(st, "cgroups", &cg) == 0)
                snprintf(t->cgroups, sizeof(t->cgroups), "%.*s", (int)cg.n, cg.p);
        }
    }
    if (t->nshards == 0)
        t->all_ok = false;
    sbx_reply_free(r);
    return 0;
}

/* wait_ready — until cluster.status shows every shard healthy (or the daemon died). */
static int
wait_ready(const char *url, pid_t pid, int timeout_ms)
{
    double until = sbx_stats_now_ms() + timeout_ms;
    while (sbx_stats_now_ms() < until && !interrupted) {
        if (pid > 0 && waitpid(pid, NULL, WNOHANG) == pid)
            return -1;
        sbx_client *c = NULL;
        sbx_error err;
        if (sbx_client_open(&c, url, &err) == 0) {
            struct bench_totals t;
            int rc = bench_cluster_totals(c, &t, &err);
            if (rc != 0)
                sbx_error_free(&err);
            sbx_client_close(c);
            if (rc == 0 && t.all_ok)
                return 0;
        } else {
            sbx_error_free(&err);
        }
        usleep(50 * 1000);
    }
    return -1;
}

static int
daemon_start(struct daemon *d, long pool, const char *const *extra, size_t nextra)
{
    if (find_sbxd(d->sbxd, sizeof(d->sbxd)) != 0) {
        fprintf(stderr, "sbx-bench: no executable sbxd at %s (set $SBX_BIN)\n", d->sbxd);
        return -1;
    }
    snprintf(d->dir, sizeof(d->dir), "/tmp/sbx-bench-XXXXXX");
    if (!mkdtemp(d->dir)) {
        fprintf(stderr, "sbx-bench: mkdtemp: %s\n", strerror(errno));
        d->dir[0] = '\0';
        return -1;
    }
    /* Shard and cgroup names derive from the name: unique per run. */
    snprintf(d->name, sizeof(d->name), "bench%s", strrchr(d->dir, '-') + 1);
    for (char *p = d->name; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
        else if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
            *p = 'x';
    snprintf(d->url, sizeof(d->url), "ipc://%s/gw.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/sbxd.log", d->dir);
    char npool[32];
    snprintf(npool, sizeof(npool), "%ld", pool);
    /* --http "": no HTTP front, whose default port other deployments on the
     * machine may hold; the benchmark speaks nng only. */
    const char *argv[32] = {d->sbxd, "dev",   "--data", d->dir, "--listen", d->url,
                            "--name", d->name, "--http", "",     "--shards", "2"};
    size_t argc = 12;
    if (pool >= 0) {
        argv[argc++] = "--pool";
        argv[argc++] = npool;
    }
    for (size_t i = 0; i < nextra && argc < 31; i++)
        argv[argc++] = extra[i];
    argv[argc] = NULL;
    pid_t pid = fork();
    if (pid < 0) {
        fprintf(stderr, "sbx-bench: fork: %s\n", strerror(errno));
        return -1;
    }
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setpgid(0, 0);                  /* ^C reaches sbx-bench, which stops sbxd itself */
        prctl(PR_SET_PDEATHSIG, SIGTERM); /* and should sbx-bench die, sbxd stops too */
        execv(d->sbxd, (char *const *)argv);
        _exit(127);
    }
    d->pid = pid;
    if (wait_ready(d->url, d->pid, READY_TIMEOUT_MS) != 0) {
        fprintf(stderr, "sbx-bench: the private sbxd did not become ready\n");
        print_log_tail(d);
        return -1;
    }
    return 0;
}

static void
daemon_stop(struct daemon *d)
{
    if (d->pid > 0) {
        int st = 0;
        kill(d->pid, SIGTERM);
        double until = sbx_stats_now_ms() + STOP_TIMEOUT_MS;
        pid_t r;
        while ((r = waitpid(d->pid, &st, WNOHANG)) == 0) {
            if (sbx_stats_now_ms() > until) {
                fprintf(stderr, "sbx-bench: sbxd %d did not stop in %d s; killing it\n",
                        (int)d->pid, STOP_TIMEOUT_MS / 1000);
                kill(d->pid, SIGKILL);
                waitpid(d->pid, &st, 0);
                break;
            }
            usleep(10 * 1000);
        }
        if (r == d->pid && !(WIFEXITED(st) && WEXITSTATUS(st) == 0)) {
            fprintf(stderr, "sbx-bench: sbxd exited abnormally\n");
            print_log_tail(d);
        }
        d->pid = 0;
    }
    if (d->dir[0] && !getenv("SBX_KEEP_BENCH_DATA"))
        sbx_rm_rf(d->dir);
    d->dir[0] = '\0';
}

/* ------------------------------------------------------------------------------ */
/* Helpers shared by the phases. */

static char run_tag[32]; /* "bench-<pid>-<hex>": prefix of this run's sandbox IDs */

static void
make_id(char *out, size_t n, const char *kind, long i)
{
    snprintf(out, n, "%s-%s%ld", run_tag, kind, i);
}

/* bench_exec_true — one timed `exec true`; 0 and *ms, or -1 with err filled. */
int
bench_exec_true(sbx_client *c, const char *id, bool sessionless, double *ms, sbx_error *err)
{
    sbx_exec_opts o = {.command = "true", .sessionless = sessionless};
    sbx_exec_result r;
    double t0 = sbx_stats_now_ms();
    int rc = sbx_exec(c, id, &o, &r, err);
    *ms = sbx_stats_now_ms() - t0;
    if (rc == 0 && r.exit_code != 0) {
        snprintf(err->code, sizeof(err->code), "EXIT_STATUS");
        snprintf(err->message, sizeof(err->message), "`true` exited with %d (%s)", r.exit_code,
                 r.cause);
        err->context_json = NULL;
        rc = -1;
    }
    sbx_exec_result_free(&r);
    return rc == 0 ? 0 : -1;
}

static void
destroy_quiet(sbx_client *c, const char *id)
{
    sbx_error err;
    if (sbx_destroy(c, id, NULL, &err) != 0) {
        print_error(id, &err);
        sbx_error_free(&err);
    }
}

/* ------------------------------------------------------------------------------ */
/* Phases. */

static void
phase_context(sbx_client *c, const struct opts *o, const struct daemon *d, struct results *res)
{
    struct utsname u;
    struct bench_totals t;
    sbx_error err;
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(res->date, sizeof(res->date), "%Y-%m-%dT%H:%M:%SZ", &tm);
    if (uname(&u) == 0)
        snprintf(res->kernel, sizeof(res->kernel), "%s %s %s %s", u.sysname, u.release,
                 u.version, u.machine);
    res->cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (bench_cluster_totals(c, &t, &err) == 0) {
        snprintf(res->cgroups, sizeof(res->cgroups), "%s", t.cgroups);
    } else {
        print_error("cluster.status", &err);
        sbx_error_free(&err);
    }
    struct stat sb;
    char built[40] = "";
    if (!o->gateway && stat(d->sbxd, &sb) == 0) {
        gmtime_r(&sb.st_mtime, &tm);
        strftime(built, sizeof(built), " (built %Y-%m-%dT%H:%M:%SZ)", &tm);
    }
    snprintf(res->sbxd, sizeof(res->sbxd), "%s%s", o->gateway ? "(existing deployment)" : d->sbxd,
             built);
    snprintf(res->gateway, sizeof(res->gateway), "%s", o->gateway ? o->gateway : d->url);
    res->pool = o->gateway ? -1 : o->pool;
    say("sbx-bench  %s\n", res->date);
    say("machine    %s, %ld CPUs\n", res->kernel, res->cpus);
    say("cgroups    %s\n", res->cgroups[0] ? res->cgroups : "(unknown)");
    say("sbxd       %s\n", res->sbxd);
    if (o->gateway)
        say("gateway    %s\n", res->gateway);
    else if (o->pool >= 0)
        say("gateway    %s (private `sbxd dev --shards 2 --pool %ld`)\n", res->gateway,
            o->pool);
    else
        say("gateway    %s (private `sbxd dev --shards 2`, default pool)\n", res->gateway);
    if (!o->gateway && o->nsbxd_args) {
        say("sbxd args ");
        for (size_t i = 0; i < o->nsbxd_args; i++)
            say(" %s", o->sbxd_args[i]);
        say("\n");
    }
}

/* bench_wait_pool_settled — before timing cold starts, let the warm pools fill:
 * until they hold their targets and stop changing for 300 ms (max 10 s). */
void
bench_wait_pool_settled(sbx_client *c)
{
    int64_t last = -1;
    double stable_since = sbx_stats_now_ms(), until = sbx_stats_now_ms() + 10000;
    while (sbx_stats_now_ms() < until && !interrupted) {
        struct bench_totals t;
        sbx_error err;
        if (bench_cluster_totals(c, &t, &err) != 0) {
            sbx_error_free(&err);
            return;
        }
        if (t.pool != last) {
            last = t.pool;
            stable_since = sbx_stats_now_ms();
        } else if (t.pool >= t.pool_target && sbx_stats_now_ms() - stable_since >= 300) {
            return;
        }
        usleep(50 * 1000);
    }
}

const char *
bench_find_bwrap(char *out, size_t n)
{
    const char *path = getenv("PATH");
    char *dup = sbx_xstrdup(path && *path ? path : "/usr/local/bin:/usr/bin:/bin");
    const char *found = NULL;
    for (char *save = NULL, *dir = strtok_r(dup, ":", &save); dir;
         dir = strtok_r(NULL, ":", &save)) {
        snprintf(out, n, "%s/bwrap", dir);
        if (access(out, X_OK) == 0) {
            found = out;
            break;
        }
    }
    free(dup);
    return found;
}

/* bench_bwrap_once — fork/exec/waitpid of the bwrap command; its exit status or -1. */
int
bench_bwrap_once(const char *bwrap, double *ms)
{
    const char *argv[] = {bwrap,    "--unshare-all", "--ro-bind", "/usr",   "/usr",  "--symlink",
                          "usr/lib64", "/lib64",     "--symlink", "usr/lib", "/lib", "--symlink",
                          "usr/bin", "/bin",         "--proc",    "/proc",  "--dev", "/dev",
                          "true",    NULL};
    double t0 = sbx_stats_now_ms();
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open("/dev/null", O_RDWR);
        if (fd >= 0) {
            dup2(fd, 0);
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execv(bwrap, (char *const *)argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    *ms = sbx_stats_now_ms() - t0;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void
phase_baseline(struct results *res)
{
    char path[PATH_MAX];
    const char *bwrap = bench_find_bwrap(path, sizeof(path));
    say("\nbaseline: bwrap --unshare-all … true (fork/exec/waitpid)\n");
    if (!bwrap) {
        snprintf(res->bwrap_note, sizeof(res->bwrap_note), "bwrap not found in $PATH");
        say("  %s: baseline and ratio skipped\n", res->bwrap_note);
        return;
    }
    struct sbx_samples s = {0};
    double ms;
    for (int i = 0; i < BWRAP_WARMUP + BWRAP_RUNS && !interrupted; i++) {
        int st = bench_bwrap_once(bwrap, &ms);
        if (st != 0) {
            snprintf(res->bwrap_note, sizeof(res->bwrap_note),
                     "%s failed (exit status %d): baseline and ratio skipped", bwrap, st);
            say("  %s\n", res->bwrap_note);
            sbx_samples_free(&s);
            return;
        }
        if (i >= BWRAP_WARMUP)
            sbx_samples_add(&s, ms);
    }
    res->have_bwrap = true;
    snprintf(res->bwrap_note, sizeof(res->bwrap_note), "%s", bwrap);
    res->bwrap = sbx_stats_summary(s.v, s.n);
    say_stats("bwrap true", &res->bwrap);
    sbx_samples_free(&s);
}

static void
phase_cold(sbx_client *c, const struct opts *o, struct results *res)
{
    struct sbx_samples cold = {0}, destroy = {0};
    struct bench_totals before, after;
    sbx_error err;
    bool have_totals;
    char id[80];

    say("\ncold start: first `exec true` on %ld new sandbox IDs, sequential\n", o->cold);
    bench_wait_pool_settled(c);
    have_totals = bench_cluster_totals(c, &before, &err) == 0;
    if (!have_totals)
        sbx_error_free(&err);
    for (long i = 0; i < o->cold && !interrupted; i++) {
        double ms;
        make_id(id, sizeof(id), "c", i);
        if (bench_exec_true(c, id, false, &ms, &err) == 0) {
            sbx_samples_add(&cold, ms);
        } else {
            if (res->cold_failures++ < 5)
                print_error(id, &err);
            sbx_error_free(&err);
        }
        double t0 = sbx_stats_now_ms();
        if (sbx_destroy(c, id, NULL, &err) == 0) {
            sbx_samples_add(&destroy, sbx_stats_now_ms() - t0);
        } else {
            if (res->cold_failures++ < 5)
                print_error(id, &err);
            sbx_error_free(&err);
        }
    }
    if (have_totals && bench_cluster_totals(c, &after, &err) == 0) {
        res->cold_containers = after.started - before.started;
        res->cold_pool_hits = after.pool_hits - before.pool_hits;
        if (res->cold_containers > 0)
            res->cold_mean_start_ms = (double)(after.start_us_total - before.start_us_total) /
                                      (double)res->cold_containers / 1000.0;
    } else if (have_totals) {
        sbx_error_free(&err);
    }
    res->cold = sbx_stats_summary(cold.v, cold.n);
    res->destroy = sbx_stats_summary(destroy.v, destroy.n);
    say_stats("cold start (exec true, new ID)", &res->cold);
    say_stats("sbx_destroy", &res->destroy);
    say("  shard side: %lld pool hits for %zu sandboxes; %lld containers started "
        "(pool refills included), mean start %.2f ms\n",
        (long long)res->cold_pool_hits, res->cold.n, (long long)res->cold_containers,
        res->cold_mean_start_ms);
    if (res->cold_failures)
        say("  FAILED calls: %zu\n", res->cold_failures);
    sbx_samples_free(&cold);
    sbx_samples_free(&destroy);
}

/* time_execs — `warmup` untimed then `n` timed `exec true` calls on one sandbox. */
static struct sbx_summary
time_execs(sbx_client *c, const char *id, bool sessionless, long warmup, long n,
           size_t *failures)
{
    struct sbx_samples s = {0};
    sbx_error err;
    for (long i = 0; i < warmup + n && !interrupted; i++) {
        double ms;
        if (bench_exec_true(c, id, sessionless, &ms, &err) != 0) {
            if ((*failures)++ < 5)
                print_error(id, &err);
            sbx_error_free(&err);
            continue;
        }
        if (i >= warmup)
            sbx_samples_add(&s, ms);
    }
    struct sbx_summary st = sbx_stats_summary(s.v, s.n);
    sbx_samples_free(&s);
    return st;
}

/* time_file_round_trips — `warmup` untimed then `n` timed pairs of a 1 MiB
 * sbx_write_file and its sbx_read_file; a read that differs counts as a
 * failure. */
static struct sbx_summary
time_file_round_trips(sbx_client *c, const char *id, long warmup, long n, size_t *failures)
{
    enum { SIZE = 1 << 20 };
    struct sbx_samples s = {0};
    sbx_error err;
    unsigned char *data = sbx_xmalloc(SIZE);
    unsigned seed = (unsigned)getpid();
    for (size_t i = 0; i < SIZE; i++)
        data[i] = (unsigned char)(rand_r(&seed) >> 7);
    for (long i = 0; i < warmup + n && !interrupted; i++) {
        char *back = NULL;
        size_t len = 0;
        double t0 = sbx_stats_now_ms();
        if (sbx_write_file(c, id, "/workspace/bench-1mib.bin", data, SIZE, &err) != 0 ||
            sbx_read_file(c, id, "/workspace/bench-1mib.bin", &back, &len, NULL, &err) != 0) {
            if ((*failures)++ < 5)
                print_error(id, &err);
            sbx_error_free(&err);
            continue;
        }
        double ms = sbx_stats_now_ms() - t0;
        if (len != SIZE || memcmp(back, data, SIZE) != 0) {
            if ((*failures)++ < 5)
                say("  %s: the file read back (%zu bytes) differs from the one written\n", id,
                    len);
        } else if (i >= warmup) {
            sbx_samples_add(&s, ms);
        }
        free(back);
    }
    free(data);
    struct sbx_summary st = sbx_stats_summary(s.v, s.n);
    sbx_samples_free(&s);
    return st;
}

static void
phase_warm(sbx_client *c, const struct opts *o, struct results *res)
{
    char id[80];
    make_id(id, sizeof(id), "w", 0);
    say("\nwarm exec: `exec true` on one running sandbox (%d warm-up calls first)\n",
        WARMUP_CALLS);
    res->warm = time_execs(c, id, false, WARMUP_CALLS, o->warm, &res->warm_failures);
    say_stats("session (default)", &res->warm);
    res->sessionless =
        time_execs(c, id, true, WARMUP_CALLS, o->warm / 4, &res->warm_failures);
    say_stats("sessionless (fresh process)", &res->sessionless);
    res->file_rt = time_file_round_trips(c, id, 5, o->warm / 20 > 20 ? o->warm / 20 : 20,
                                         &res->warm_failures);
    say_stats("1 MiB write + read", &res->file_rt);
    if (res->file_rt.n)
        say("  %.0f MiB/s moved (2 MiB per round trip at p50)\n", 2.0 / (res->file_rt.p50 / 1000.0));
    if (res->warm_failures)
        say("  FAILED calls: %zu\n", res->warm_failures);
    destroy_quiet(c, id);
}

struct worker {
    pthread_t thread;
    sbx_client *c;
    char id[80];
    pthread_barrier_t *ready, *go;
    const double *deadline;
    struct sbx_samples lat;
    struct sbx_summary sum; /* of lat, after the join */
    size_t failures;
    double end_ms;
};

/* spread_line — one line of say_spread: the workers of `shard` (NULL: all;
 * shards[i] names worker i's) with samples. */
static void
spread_line(const struct worker *w, char (*shards)[64], size_t n, const char *shard)
{
    double p50_lo = 0, p50_hi = 0, max_lo = 0, max_hi = 0;
    size_t over100 = 0, measured = 0;
    for (size_t i = 0; i < n; i++) {
        if (!w[i].sum.n || (shard && strcmp(shards[i], shard) != 0))
            continue;
        if (!measured++ || w[i].sum.p50 < p50_lo)
            p50_lo = w[i].sum.p50;
        if (measured == 1 || w[i].sum.max < max_lo)
            max_lo = w[i].sum.max;
        if (w[i].sum.p50 > p50_hi)
            p50_hi = w[i].sum.p50;
        if (w[i].sum.max > max_hi)
            max_hi = w[i].sum.max;
        over100 += w[i].sum.max > 100.0;
    }
    if (measured)
        say("  %s%s (%zu): p50 %.1f-%.1f ms, max %.1f-%.1f ms; %zu with a max over 100 ms\n",
            shard ? "  on shard " : "per sandbox", shard ? shard : "", measured, p50_lo, p50_hi,
            max_lo, max_hi, over100);
}

/* say_spread — the spread between the sandboxes of the throughput phase, all
 * of them and then per shard (each sandbox's shard from its `status`):
 * whether the tail is every sandbox's (a stall of the whole path) or some
 * sandboxes' or one shard's (unfairness).  Sandboxes whose status fails are
 * left out of the per-shard lines. */
static void
say_spread(sbx_client *c, const struct worker *w, size_t n)
{
    char(*shards)[64] = sbx_xcalloc(n ? n : 1, sizeof(*shards));
    spread_line(w, shards, n, NULL);
    for (size_t i = 0; i < n; i++) {
        sbx_reply *r = NULL;
        sbx_error err;
        const msgpack_object *sb;
        sbx_str name = {"", 0};
        if (sbx_call(c, "status", w[i].id, NULL, 0, 5000, NULL, &r, &err) != 0) {
            sbx_error_free(&err);
            continue;
        }
        if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0)
            sbx_wire_get_str(sb, "shard", &name);
        snprintf(shards[i], sizeof(shards[i]), "%.*s", (int)name.n, name.p);
        sbx_reply_free(r);
    }
    for (size_t i = 0; i < n; i++) {
        bool seen = !shards[i][0];
        for (size_t k = 0; k < i && !seen; k++)
            seen = !strcmp(shards[k], shards[i]);
        if (!seen)
            spread_line(w, shards, n, shards[i]);
    }
    free(shards);
}

static void *
worker_main(void *arg)
{
    struct worker *w = arg;
    sbx_error err;
    pthread_barrier_wait(w->ready);
    pthread_barrier_wait(w->go); /* the main thread has set *deadline in between */
    while (sbx_stats_now_ms() < *w->deadline && !interrupted) {
        double ms;
        if (bench_exec_true(w->c, w->id, false, &ms, &err) == 0) {
            sbx_samples_add(&w->lat, ms);
        } else {
            w->failures++;
            sbx_error_free(&err);
        }
    }
    w->end_ms = sbx_stats_now_ms();
    return NULL;
}

static void
phase_throughput(sbx_client *c, const struct opts *o, struct results *res)
{
    size_t p = (size_t)o->parallel;
    struct worker *w = sbx_xcalloc(p, sizeof(*w));
    pthread_barrier_t ready, go;
    double deadline = 0, start;
    sbx_error err;
    size_t started = 0;

    say("\nthroughput: %zu sandboxes, %zu client threads (one shared client), %ld s of "
        "`exec true`\n",
        p, p, o->seconds);
    /* Create and warm every sandbox first (not timed). */
    for (size_t i = 0; i < p && !interrupted; i++) {
        make_id(w[i].id, sizeof(w[i].id), "t", (long)i);
        for (int k = 0; k < 5; k++) {
            double ms;
            if (bench_exec_true(c, w[i].id, false, &ms, &err) != 0) {
                if (res->load_failures++ < 5)
                    print_error(w[i].id, &err);
                sbx_error_free(&err);
            }
        }
    }
    pthread_barrier_init(&ready, NULL, (unsigned)p + 1);
    pthread_barrier_init(&go, NULL, (unsigned)p + 1);
    for (size_t i = 0; i < p; i++) {
        w[i].c = c;
        w[i].ready = &ready;
        w[i].go = &go;
        w[i].deadline = &deadline;
        if (pthread_create(&w[i].thread, NULL, worker_main, &w[i]) != 0) {
            fprintf(stderr, "sbx-bench: pthread_create failed\n");
            abort(); /* the barriers count on every thread */
        }
        started++;
    }
    pthread_barrier_wait(&ready);
    start = sbx_stats_now_ms();
    deadline = start + (double)o->seconds * 1000.0;
    pthread_barrier_wait(&go);
    struct sbx_samples all = {0};
    double end = start;
    for (size_t i = 0; i < started; i++) {
        pthread_join(w[i].thread, NULL);
        w[i].sum = sbx_stats_summary(w[i].lat.v, w[i].lat.n);
        for (size_t k = 0; k < w[i].lat.n; k++)
            sbx_samples_add(&all, w[i].lat.v[k]);
        res->load_failures += w[i].failures;
        if (w[i].end_ms > end)
            end = w[i].end_ms;
        sbx_samples_free(&w[i].lat);
    }
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    res->load_execs = all.n;
    res->load_seconds = (end - start) / 1000.0;
    res->execs_per_s = res->load_seconds > 0 ? (double)all.n / res->load_seconds : 0;
    res->load = sbx_stats_summary(all.v, all.n);
    say("  %.0f execs/s total (%zu execs in %.2f s)\n", res->execs_per_s, res->load_execs,
        res->load_seconds);
    say_stats("latency under load", &res->load);
    say_spread(c, w, started);
    if (res->load_failures)
        say("  FAILED calls: %zu\n", res->load_failures);
    sbx_samples_free(&all);
    for (size_t i = 0; i < p; i++)
        if (w[i].id[0])
            destroy_quiet(c, w[i].id);
    free(w);
}

static void
report_ratio(const struct results *res)
{
    say("\n");
    if (res->have_bwrap && res->cold.n && res->bwrap.p50 > 0)
        say("sbx cold start = %.1fx bwrap (p50 %.2f ms vs %.2f ms)\n",
            res->cold.p50 / res->bwrap.p50, res->cold.p50, res->bwrap.p50);
    else
        say("sbx cold start vs bwrap: no ratio (%s)\n",
            res->bwrap_note[0] ? res->bwrap_note : "no cold-start samples");
}

static void
report_json(const struct opts *o, const struct results *res, int argc, char **argv)
{
    json_t *cmd = json_array();
    for (int i = 0; i < argc; i++)
        json_array_append_new(cmd, json_string(argv[i]));
    json_t *bw = json_pack("{s:b, s:s}", "available", res->have_bwrap, "note", res->bwrap_note);
    if (res->have_bwrap)
        json_object_update_new(bw, json_pack("{s:o}", "latency", jstats(&res->bwrap)));
    json_t *ratio = res->have_bwrap && res->cold.n && res->bwrap.p50 > 0
                        ? jnum(res->cold.p50 / res->bwrap.p50)
                        : json_null();
    json_t *root = json_pack(
        "{s:s, s:o, s:{s:s, s:I, s:s, s:s, s:s, s:o},"
        " s:o,"
        " s:{s:o, s:o, s:I, s:I, s:I, s:o},"
        " s:{s:o, s:o, s:o, s:I},"
        " s:{s:I, s:I, s:I, s:o, s:o, s:I, s:o},"
        " s:o}",
        "date", res->date, "command", cmd,
        "machine", "kernel", res->kernel, "cpus", (json_int_t)res->cpus, "cgroups", res->cgroups,
        "sbxd", res->sbxd, "gateway", res->gateway, "pool",
        res->pool >= 0 ? json_integer(res->pool) : json_null(),
        "bwrap", bw,
        "cold", "latency", jstats(&res->cold), "destroy", jstats(&res->destroy), "failures",
        (json_int_t)res->cold_failures, "poolHits", (json_int_t)res->cold_pool_hits,
        "containersStarted", (json_int_t)res->cold_containers, "shardMeanStartMs",
        jnum(res->cold_mean_start_ms),
        "warm", "session", jstats(&res->warm), "sessionless", jstats(&res->sessionless),
        "fileRoundTrip1MiB", jstats(&res->file_rt),
        "failures", (json_int_t)res->warm_failures,
        "throughput", "sandboxes", (json_int_t)o->parallel, "threads", (json_int_t)o->parallel,
        "execs", (json_int_t)res->load_execs, "seconds", jnum(res->load_seconds),
        "execsPerSecond", jnum(res->execs_per_s), "failures", (json_int_t)res->load_failures,
        "latency", jstats(&res->load),
        "coldOverBwrapP50", ratio);
    if (root && res->burst)
        json_object_set(root, "burst", res->burst);
    if (!root) {
        fprintf(stderr, "sbx-bench: cannot build the JSON summary\n");
        return;
    }
    char *s = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(10));
    if (s) {
        printf("%s\n", s);
        free(s);
    }
    json_decref(root);
}

/* ------------------------------------------------------------------------------ */

static void
usage(FILE *f)
{
    fprintf(f, "usage: sbx-bench [--gateway URL] [--cold N] [--warm N] [--parallel N]\n"
               "                 [--seconds S] [--pool N] [--burst N[,N...]] [--rounds R]\n"
               "                 [--idle M] [--image PATH [--image-starts N]] [--workspace-wake N] [--fork N]\n"
               "                 [--sbxd-arg ARG]... [--json]\n"
               "Starts a private `sbxd dev` unless --gateway is given; see the header of\n"
               "tools/bench.c for what each figure measures.\n");
}

static int
parse_long(const char *s, long min, long *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < min)
        return -1;
    *out = v;
    return 0;
}

static int
parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){
        .cold = 200, .warm = 2000, .parallel = 50, .seconds = 10, .pool = -1, .rounds = 3};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *num = NULL, min = 1;
        if (!strcmp(a, "--json")) {
            o->json = true;
            continue;
        }
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--gateway") && v) {
            o->gateway = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--sbxd-arg") && v && o->nsbxd_args < 8) {
            o->sbxd_args[o->nsbxd_args++] = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--image") && v) {
            o->image = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--burst") && v) {
            char *dup = sbx_xstrdup(v);
            int bad = 0;
            for (char *save = NULL, *t = strtok_r(dup, ",", &save); t;
                 t = strtok_r(NULL, ",", &save)) {
                long n;
                if (o->nbursts == sizeof(o->bursts) / sizeof(o->bursts[0]) ||
                    parse_long(t, 1, &n) != 0 || n > 4096)
                    bad = 1;
                else
                    o->bursts[o->nbursts++] = n;
            }
            free(dup);
            if (bad || !o->nbursts) {
                fprintf(stderr, "sbx-bench: --burst takes up to 8 sizes 1-4096, "
                                "comma-separated (got '%s')\n", v);
                return -1;
            }
            i++;
            continue;
        }
        if (!strcmp(a, "--cold"))
            num = &o->cold, min = 0;
        else if (!strcmp(a, "--warm"))
            num = &o->warm, min = 0;
        else if (!strcmp(a, "--parallel"))
            num = &o->parallel, min = 0;
        else if (!strcmp(a, "--seconds"))
            num = &o->seconds;
        else if (!strcmp(a, "--pool"))
            num = &o->pool, min = 0;
        else if (!strcmp(a, "--rounds"))
            num = &o->rounds;
        else if (!strcmp(a, "--idle"))
            num = &o->idle, min = 0;
        else if (!strcmp(a, "--image-starts"))
            num = &o->image_starts;
        else if (!strcmp(a, "--workspace-wake"))
            num = &o->ws_wake, min = 0;
        else if (!strcmp(a, "--fork"))
            num = &o->forks, min = 0;
        if (!num || !v || parse_long(v, min, num) != 0) {
            fprintf(stderr, "sbx-bench: bad or incomplete option '%s'\n", a);
            usage(stderr);
            return -1;
        }
        i++;
    }
    if (o->gateway && o->pool >= 0)
        fprintf(stderr, "sbx-bench: --pool is ignored with --gateway\n");
    return 0;
}

int
main(int argc, char **argv)
{
    struct opts o;
    struct daemon d = {0};
    struct results res = {0};
    sbx_client *c = NULL;
    sbx_error err;
    int rc = 0;

    if (parse_args(argc, argv, &o) != 0)
        return 2;
    human = o.json ? stderr : stdout;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    unsigned char rnd[3] = {0};
    sbx_random(rnd, sizeof(rnd));
    snprintf(run_tag, sizeof(run_tag), "bench-%d-%02x%02x%02x", (int)getpid(), rnd[0], rnd[1],
             rnd[2]);

    if (!o.gateway && daemon_start(&d, o.pool, o.sbxd_args, o.nsbxd_args) != 0) {
        daemon_stop(&d);
        return 1;
    }
    const char *url = o.gateway ? o.gateway : d.url;
    if (o.gateway && wait_ready(url, 0, 5000) != 0) {
        fprintf(stderr, "sbx-bench: %s does not answer cluster.status with every shard "
                        "healthy\n", url);
        return 1;
    }
    if (sbx_client_open(&c, url, &err) != 0) {
        fprintf(stderr, "sbx-bench: %s: %s\n", err.code, err.message);
        sbx_error_free(&err);
        daemon_stop(&d);
        return 1;
    }
    sbx_client_set_timeout(c, 60000);

    phase_context(c, &o, &d, &res);
    if (!interrupted)
        phase_baseline(&res);
    if (!interrupted && o.cold > 0)
        phase_cold(c, &o, &res);
    if (!interrupted && o.warm > 0)
        phase_warm(c, &o, &res);
    if (!interrupted && o.parallel > 0)
        phase_throughput(c, &o, &res);
    struct bench_burst_conf bc = {.url = url, .tag = run_tag, .sizes = o.bursts,
                                  .nsizes = o.nbursts, .rounds = o.rounds, .idle = o.idle,
                                  .out = human, .interrupted = &interrupted};
    if (!interrupted && o.nbursts > 0)
        res.burst_failures = bench_burst_run(c, &bc, &res.burst);
    size_t image_failures = 0;
    if (!interrupted && o.image)
        image_failures = bench_image_run(c, o.image, o.image_starts > 0 ? o.image_starts : 50,
                                         run_tag, human, &interrupted,
                                         o.nbursts > 0 ? &bc : NULL);
    if (!interrupted && o.ws_wake > 0)
        image_failures += bench_workspace_run(c, o.ws_wake, run_tag, human, &interrupted);
    if (!interrupted && o.forks > 0)
        image_failures += bench_fork_run(c, o.forks, run_tag, human, &interrupted);
    report_ratio(&res);
    if (o.json)
        report_json(&o, &res, argc, argv);

    if (interrupted) {
        fprintf(stderr, "sbx-bench: interrupted\n");
        rc = 1;
    }
    if (res.cold_failures || res.warm_failures || res.load_failures || res.burst_failures ||
        image_failures)
        rc = 1;
    json_decref(res.burst);
    sbx_client_close(c);
    if (!o.gateway)
        daemon_stop(&d);
    return rc;
}
