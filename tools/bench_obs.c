/*
 * sbx-bench-obs — what observability costs: exec throughput with metrics
 * scraped and JSON logs on, against plain text logs and no scraping, in one
 * run (issue 17's floor: ≤ 2 %).
 *
 *   sbx-bench-obs [--seconds S] [--rounds R] [--threads T] [--debug-logs]
 *
 * Starts two private `sbxd dev` (1 shard, pool 2; sbxd from $SBX_BIN, else
 * next to this executable): "off" with --log-format text and nobody reading
 * /metrics, "on" with --log-format json and GET /metrics on its HTTP front
 * every second (15 times Prometheus's default scrape interval).  At the
 * default level (info) an exec writes no log line; --debug-logs starts "on"
 * with SBX_LOG=debug (runtime/log.c), so that it writes its per-request
 * lines (request id, sandbox, op) as JSON: the worst case.  Each round
 * loads both daemons at once for S seconds (default 3): T client threads
 * each (default 8), each thread on a sandbox of its own doing `exec true`
 * back to back; both sides thus see the same load from the rest of the
 * machine, and what "on" costs shows as its smaller share.  R rounds
 * (default 5).
 *
 * What cannot be switched off is measured apart: every answered operation
 * is observed into the shard's latency histogram (actors/metrics.c,
 * sbx_hist_observe) whatever the configuration — there is no "metrics off"
 * to compare with — so its cost is timed here in-process (10 M
 * observations) and set against the CPU time of one exec at the measured
 * throughput.  The gateway's own metrics are counters it keeps anyway.
 *
 * Prints execs/s of each daemon per round and in total, the difference in
 * per cent (of the totals, and the median of the rounds' paired
 * differences, which a load spike in one block moves less), the scrapes
 * (count, p50 time, bytes), and the histogram's cost.
 */
#include <curl/curl.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../include/sbx/sbx.h"
#include "../runtime/prom.h"
#include "../runtime/util.h"
#include "../tests/support/harness.h"
#include "stats.h"

struct side {
    const char *name;
    struct testd d;
    sbx_client *c;
    char http[160];   /* its HTTP front, "http://host:port" */
    double execs;     /* total over the rounds */
    double secs;
};

struct worker {
    struct side *s;
    char id[64];
    double until_ms;
    long n;
    bool failed;
};

static void *
worker_main(void *arg)
{
    struct worker *w = arg;
    sbx_exec_opts o = {.command = "true"};
    sbx_exec_result r;
    sbx_error err;
    while (sbx_stats_now_ms() < w->until_ms) {
        if (sbx_exec(w->s->c, w->id, &o, &r, &err) != 0) {
            fprintf(stderr, "sbx-bench-obs: exec on %s: %s %s\n", w->s->name, err.code,
                    err.message);
            sbx_error_free(&err);
            w->failed = true;
            return NULL;
        }
        sbx_exec_result_free(&r);
        w->n++;
    }
    return NULL;
}

struct scraper {
    const char *url;
    atomic_bool stop;
    struct sbx_samples ms;
    size_t bytes;
    bool failed;
};

static size_t
count_bytes(char *p, size_t s, size_t n, void *arg)
{
    (void)p;
    *(size_t *)arg += s * n;
    return s * n;
}

static void *
scraper_main(void *arg)
{
    struct scraper *x = arg;
    CURL *cu = curl_easy_init();
    if (!cu) {
        x->failed = true;
        return NULL;
    }
    curl_easy_setopt(cu, CURLOPT_URL, x->url);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, count_bytes);
    while (!atomic_load(&x->stop)) {
        size_t n = 0;
        curl_easy_setopt(cu, CURLOPT_WRITEDATA, &n);
        double t0 = sbx_stats_now_ms();
        long status = 0;
        if (curl_easy_perform(cu) != CURLE_OK ||
            (curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status), status != 200)) {
            x->failed = true;
            break;
        }
        sbx_samples_add(&x->ms, sbx_stats_now_ms() - t0);
        x->bytes = n;
        for (int i = 0; i < 20 && !atomic_load(&x->stop); i++)
            usleep(50 * 1000);
    }
    curl_easy_cleanup(cu);
    return NULL;
}

/* One block: T threads on each side at once for secs seconds (the two
 * daemons share the machine's load alike), scraping `on` meanwhile; each
 * side's execs/s into *r_off / *r_on.  0, or -1 when an exec failed. */
static int
block(struct side *off, struct side *on, int threads, int secs, struct scraper *scrape,
      double *r_off, double *r_on)
{
    int nt = 2 * threads;
    struct worker *w = sbx_xcalloc((size_t)nt, sizeof(*w));
    pthread_t *th = sbx_xcalloc((size_t)nt, sizeof(*th));
    pthread_t st;
    if (scrape) {
        atomic_store(&scrape->stop, false);
        pthread_create(&st, NULL, scraper_main, scrape);
    }
    double t0 = sbx_stats_now_ms();
    for (int i = 0; i < nt; i++) {
        w[i].s = i % 2 ? on : off; /* interleaved: neither side starts first */
        snprintf(w[i].id, sizeof(w[i].id), "obs-%s-%d-%d", w[i].s->name, (int)getpid(), i / 2);
        w[i].until_ms = t0 + secs * 1000.0;
        pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    long n[2] = {0, 0};
    bool failed = false;
    for (int i = 0; i < nt; i++) {
        pthread_join(th[i], NULL);
        n[i % 2] += w[i].n;
        failed |= w[i].failed;
    }
    double dt = (sbx_stats_now_ms() - t0) / 1000.0;
    if (scrape) {
        atomic_store(&scrape->stop, true);
        pthread_join(st, NULL);
        failed |= scrape->failed;
    }
    free(w);
    free(th);
    off->execs += (double)n[0];
    on->execs += (double)n[1];
    off->secs += dt;
    on->secs += dt;
    *r_off = (double)n[0] / dt;
    *r_on = (double)n[1] / dt;
    return failed ? -1 : 0;
}

static int
side_start(struct side *s, const char *const *extra)
{
    if (testd_start(&s->d, 1, extra) != 0)
        return -1;
    char path[400], *text = NULL;
    size_t n;
    snprintf(path, sizeof(path), "%s/http.addr", s->d.dir);
    if (sbx_fs_read(path, 256, &text, &n) != 0)
        return -1;
    text[strcspn(text, "\n")] = 0;
    snprintf(s->http, sizeof(s->http), "http://%s", text);
    free(text);
    sbx_error err;
    if (sbx_client_open(&s->c, s->d.url, &err) != 0) {
        sbx_error_free(&err);
        return -1;
    }
    return 0;
}

/* The in-process cost of one histogram observation, in ns. */
static double
observe_ns(void)
{
    struct sbx_hist h;
    memset(&h, 0, sizeof(h));
    const long n = 10000000;
    double t0 = sbx_stats_now_ms();
    for (long i = 0; i < n; i++)
        sbx_hist_observe(&h, sbx_prom_latency_s, sbx_prom_latency_n,
                         (double)(i % 5000) * 1e-6); /* 0-5 ms, as execs are */
    double dt = sbx_stats_now_ms() - t0;
    return dt * 1e6 / (double)n;
}

int
main(int argc, char **argv)
{
    int secs = 3, rounds = 5, threads = 8;
    bool debug = false;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            secs = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--rounds") && i + 1 < argc)
            rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--debug-logs"))
            debug = true;
        else {
            fprintf(stderr, "usage: sbx-bench-obs [--seconds S] [--rounds R] [--threads T] [--debug-logs]\n");
            return 2;
        }
    }
    if (secs < 1 || rounds < 1 || threads < 1 || threads > 256) {
        fprintf(stderr, "sbx-bench-obs: --seconds, --rounds ≥ 1, --threads 1-256\n");
        return 2;
    }
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[sl > 0 ? sl : 0] = 0;
    if (!getenv("SBX_BIN"))
        setenv("SBX_BIN", dirname(self), 1);
    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct side off = {.name = "off"}, on = {.name = "on"};
    static const char *const xoff[] = {"--pool", "2", "--log-format", "text", NULL};
    static const char *const xon[] = {"--pool", "2", "--log-format", "json", NULL};
    int rc = 1;
    char murl[200] = "";
    double *diff = NULL;
    struct scraper sc = {.url = murl};
    int started = side_start(&off, xoff);
    if (started == 0 && debug)
        setenv("SBX_LOG", "debug", 1); /* runtime/log.c: the on daemon only */
    if (started == 0)
        started = side_start(&on, xon);
    unsetenv("SBX_LOG");
    if (started != 0) {
        fprintf(stderr, "sbx-bench-obs: cannot start sbxd (root needed)\n");
        goto out;
    }
    snprintf(murl, sizeof(murl), "%s/metrics", on.http);
    /* Warm-up: every sandbox created and its session started on both. */
    double a, b;
    if (block(&off, &on, threads, 1, NULL, &a, &b) != 0)
        goto out;
    off.execs = off.secs = on.execs = on.secs = 0;
    printf("exec `true` throughput, %d threads on each daemon at once, %d s blocks, "
           "metrics+JSON logs%s on vs off\n",
           threads, secs, debug ? " (debug level)" : "");
    diff = sbx_xcalloc((size_t)rounds, sizeof(double));
    for (int r = 0; r < rounds; r++) {
        if (block(&off, &on, threads, secs, &sc, &a, &b) != 0)
            goto out;
        diff[r] = (a - b) / a * 100.0;
        printf("  round %2d: off %7.0f execs/s, on %7.0f execs/s (%+.2f %%)\n", r + 1, a, b,
               diff[r]);
    }
    struct sbx_summary ds = sbx_stats_summary(diff, (size_t)rounds);
    double toff = off.execs / off.secs, ton = on.execs / on.secs;
    printf("  total: off %.0f execs/s, on %.0f execs/s: on costs %+.2f %%; median of the "
           "rounds %+.2f %% (floor: <= 2 %%; negative: on was faster, i.e. noise)\n",
           toff, ton, (toff - ton) / toff * 100.0, ds.p50);
    struct sbx_summary ss = sbx_stats_summary(sc.ms.v, sc.ms.n);
    printf("  scrapes of the on daemon's /metrics during its blocks: %zu, p50 %.2f ms, "
           "%zu bytes\n",
           sc.ms.n, ss.p50, sc.bytes);
    double ns = observe_ns();
    double per_exec_ns = 2e9 / (toff + ton > 0 ? toff + ton : 1); /* 2 CPUs' time per exec */
    printf("  always on: one latency-histogram observation per operation: %.1f ns in-process "
           "= %.4f %% of the %.0f ns of CPU one exec takes at %.0f execs/s on 2 CPUs\n",
           ns, ns / per_exec_ns * 100.0, per_exec_ns, toff + ton);
    rc = 0;
out:
    free(diff);
    sbx_samples_free(&sc.ms);
    if (off.c)
        sbx_client_close(off.c);
    if (on.c)
        sbx_client_close(on.c);
    testd_stop(&off.d);
    testd_stop(&on.d);
    curl_global_cleanup();
    return rc;
}
