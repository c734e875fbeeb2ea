/*
 * bench_burst.c — sbx-bench's burst phase (bench.h): N sandboxes created at
 * once by N client threads, beside N bwrap … true started at once, with M
 * idle sandboxes present or not.
 *
 * Threads: every client thread owns its sbx_client (opened before the
 * barrier, so connecting is not timed) and its samples; the main thread
 * merges them after pthread_join.  Nothing is shared but the barrier and
 * the read-only configuration.
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../runtime/util.h"
#include "bench.h"
#include "stats.h"

#define FILL_THREADS 8 /* client threads that create and destroy the idle sandboxes */
#define MAX_ROUNDS 16

/* ------------------------------------------------------------------------------ */
/* Many sandboxes, created or destroyed by a few threads (not timed per call). */

enum fill_op { FILL_CREATE, FILL_DESTROY };

struct fill {
    const struct bench_burst_conf *bc;
    const char *kind;       /* ID infix */
    long count;
    enum fill_op op;
    atomic_long next;       /* the next index to take */
    atomic_size_t failures;
};

static void *
fill_main(void *arg)
{
    struct fill *f = arg;
    sbx_client *c = NULL;
    sbx_error err;
    char id[96];
    if (sbx_client_open(&c, f->bc->url, &err) != 0) {
        sbx_error_free(&err);
        atomic_fetch_add(&f->failures, 1);
        return NULL;
    }
    sbx_client_set_timeout(c, 120000);
    for (long i; (i = atomic_fetch_add(&f->next, 1)) < f->count && !*f->bc->interrupted;) {
        double ms;
        snprintf(id, sizeof(id), "%s-%s%ld", f->bc->tag, f->kind, i);
        int rc = f->op == FILL_CREATE ? bench_exec_true(c, id, false, &ms, &err)
                                      : sbx_destroy(c, id, NULL, &err);
        if (rc != 0) {
            if (atomic_fetch_add(&f->failures, 1) < 3)
                fprintf(f->bc->out, "  %s: %s: %s\n", id, err.code, err.message);
            sbx_error_free(&err);
        }
    }
    sbx_client_close(c);
    return NULL;
}

/* fill_run — op on IDs <tag>-<kind>0 … <kind>(count-1) from FILL_THREADS
 * threads; the failures, and *seconds the whole took. */
static size_t
fill_run(const struct bench_burst_conf *bc, const char *kind, long count, enum fill_op op,
         double *seconds)
{
    struct fill f = {.bc = bc, .kind = kind, .count = count, .op = op};
    pthread_t t[FILL_THREADS];
    int started = 0;
    double t0 = sbx_stats_now_ms();
    atomic_init(&f.next, 0);
    atomic_init(&f.failures, 0);
    for (int i = 0; i < FILL_THREADS; i++)
        if (pthread_create(&t[started], NULL, fill_main, &f) == 0)
            started++;
    for (int i = 0; i < started; i++)
        pthread_join(t[i], NULL);
    *seconds = (sbx_stats_now_ms() - t0) / 1000.0;
    return started ? atomic_load(&f.failures) : (size_t)count;
}

/* ------------------------------------------------------------------------------ */
/* One burst. */

struct burster {
    pthread_t thread;
    const struct bench_burst_conf *bc;
    pthread_barrier_t *ready, *go;
    sbx_client *c;          /* owned; NULL for a bwrap burster */
    const char *bwrap;      /* the bwrap path for a bwrap burster */
    char id[96];
    double ms;
    bool ok;
};

static void *
burster_main(void *arg)
{
    struct burster *b = arg;
    sbx_error err;
    pthread_barrier_wait(b->ready);
    pthread_barrier_wait(b->go);
    if (b->c && b->bc->image) {
        char args[512];
        sbx_reply *r = NULL;
        snprintf(args, sizeof(args), "{\"image\":\"%s\"}", b->bc->image);
        double t0 = sbx_stats_now_ms(), ex;
        b->ok = sbx_call_json(b->c, "create", b->id, args, 120000, &r, &err) == 0 &&
                bench_exec_true(b->c, b->id, false, &ex, &err) == 0;
        sbx_reply_free(r);
        b->ms = sbx_stats_now_ms() - t0;
        if (!b->ok) {
            fprintf(b->bc->out, "  %s: %s: %s\n", b->id, err.code, err.message);
            sbx_error_free(&err);
        }
    } else if (b->c) {
        b->ok = bench_exec_true(b->c, b->id, false, &b->ms, &err) == 0;
        if (!b->ok) {
            fprintf(b->bc->out, "  %s: %s: %s\n", b->id, err.code, err.message);
            sbx_error_free(&err);
        }
    } else {
        b->ok = bench_bwrap_once(b->bwrap, &b->ms) == 0;
    }
    return NULL;
}

/* The figures of one burst: latencies sorted in v[0..n). */
struct burst_fig {
    double p50, p95, p99, max, mean;
    size_t n, failures;
    double build_ms;        /* shard-side mean container build (sbx bursts; NAN if unknown) */
    int64_t started, pool_hits;
    int64_t pool_before, target_before; /* ready containers and their target at the start */
    bool have_totals;       /* started, pool_hits and the pool are known */
};

static void
fig_from(struct burst_fig *f, struct sbx_samples *s)
{
    struct sbx_summary sum = sbx_stats_summary(s->v, s->n);
    f->n = s->n;
    f->p50 = sum.p50;
    f->p95 = sbx_stats_pct(s->v, s->n, 95);
    f->p99 = sum.p99;
    f->max = sum.max;
    f->mean = sum.mean;
}

/* burst — n threads released together; with bwrap each runs it once, else
 * each runs `exec true` on a new ID <tag>-b<n>r<round>-<i>, which is
 * destroyed afterwards. */
static void
burst(sbx_client *c, const struct bench_burst_conf *bc, long n, long round, const char *bwrap,
      struct burst_fig *fig)
{
    struct burster *b = sbx_xcalloc((size_t)n, sizeof(*b));
    pthread_barrier_t ready, go;
    struct bench_totals before = {0}, after = {0};
    struct sbx_samples s = {0};
    sbx_error err;
    bool have_totals = false;
    long started = 0;

    memset(fig, 0, sizeof(*fig));
    fig->build_ms = NAN;
    for (long i = 0; i < n; i++) {
        b[i].bc = bc;
        b[i].bwrap = bwrap;
        snprintf(b[i].id, sizeof(b[i].id), "%s-b%ldr%ld-%ld", bc->tag, n, round, i);
        if (!bwrap) {
            if (sbx_client_open(&b[i].c, bc->url, &err) != 0) {
                fprintf(bc->out, "  client %ld: %s: %s\n", i, err.code, err.message);
                sbx_error_free(&err);
                n = i; /* burst with the clients we have */
                break;
            }
            sbx_client_set_timeout(b[i].c, 120000);
        }
    }
    if (!bwrap) {
        bench_wait_pool_settled(c);
        have_totals = bench_cluster_totals(c, &before, &err) == 0;
        if (!have_totals)
            sbx_error_free(&err);
    }
    pthread_barrier_init(&ready, NULL, (unsigned)n + 1);
    pthread_barrier_init(&go, NULL, (unsigned)n + 1);
    for (long i = 0; i < n; i++) {
        b[i].ready = &ready;
        b[i].go = &go;
        if (pthread_create(&b[i].thread, NULL, burster_main, &b[i]) != 0) {
            fprintf(stderr, "sbx-bench: pthread_create failed\n");
            abort(); /* the barriers count on every thread */
        }
        started++;
    }
    pthread_barrier_wait(&ready);
    pthread_barrier_wait(&go);
    for (long i = 0; i < started; i++) {
        pthread_join(b[i].thread, NULL);
        if (b[i].ok)
            sbx_samples_add(&s, b[i].ms);
        else
            fig->failures++;
    }
    pthread_barrier_destroy(&ready);
    pthread_barrier_destroy(&go);
    if (have_totals && bench_cluster_totals(c, &after, &err) == 0) {
        fig->have_totals = true;
        fig->started = after.started - before.started;
        fig->pool_hits = after.pool_hits - before.pool_hits;
        fig->pool_before = before.pool;
        fig->target_before = before.pool_target;
        if (fig->started > 0)
            fig->build_ms = (double)(after.start_us_total - before.start_us_total) /
                            (double)fig->started / 1000.0;
    } else if (have_totals) {
        sbx_error_free(&err);
    }
    fig_from(fig, &s);
    sbx_samples_free(&s);
    for (long i = 0; i < n; i++) {
        if (!b[i].c)
            continue;
        if (sbx_destroy(b[i].c, b[i].id, NULL, &err) != 0) {
            fprintf(bc->out, "  destroy %s: %s: %s\n", b[i].id, err.code, err.message);
            sbx_error_free(&err);
            fig->failures++;
        }
        sbx_client_close(b[i].c);
    }
    free(b);
}

static double
median(double *v, size_t n)
{
    sbx_stats_sort(v, n);
    return n ? v[(n - 1) / 2] : NAN;
}

static json_t *
jnum(double x)
{
    return isnan(x) ? json_null() : json_real(round(x * 1000.0) / 1000.0);
}

static void
print_fig(FILE *out, const char *what, long round, const struct burst_fig *f)
{
    fprintf(out, "  %-6s round %ld: n=%-4zu p50 %7.2f  p95 %7.2f  p99 %7.2f  max %7.2f ms", what,
            round, f->n, f->p50, f->p95, f->p99, f->max);
    if (f->have_totals)
        fprintf(out, "  | shard: pool %lld/%lld ready, %lld started, %lld pool hits",
                (long long)f->pool_before, (long long)f->target_before, (long long)f->started,
                (long long)f->pool_hits);
    if (!isnan(f->build_ms))
        fprintf(out, ", mean build %.2f ms", f->build_ms);
    if (f->failures)
        fprintf(out, "  FAILED %zu", f->failures);
    fprintf(out, "\n");
    fflush(out);
}

/* The medians over rounds of one kind (sbx or bwrap) of one size. */
static json_t *
summarise(FILE *out, const char *what, const struct burst_fig *f, long rounds)
{
    double p50[MAX_ROUNDS], p95[MAX_ROUNDS], p99[MAX_ROUNDS], mx[MAX_ROUNDS], bl[MAX_ROUNDS];
    size_t nb = 0;
    json_t *runs = json_array();
    for (long r = 0; r < rounds; r++) {
        p50[r] = f[r].p50;
        p95[r] = f[r].p95;
        p99[r] = f[r].p99;
        mx[r] = f[r].max;
        if (!isnan(f[r].build_ms))
            bl[nb++] = f[r].build_ms;
        json_array_append_new(
            runs, json_pack("{s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:I, s:I, s:I}", "n",
                            (json_int_t)f[r].n, "p50_ms", jnum(f[r].p50), "p95_ms",
                            jnum(f[r].p95), "p99_ms", jnum(f[r].p99), "max_ms", jnum(f[r].max),
                            "mean_ms", jnum(f[r].mean), "shardMeanBuildMs", jnum(f[r].build_ms),
                            "containersStarted", (json_int_t)f[r].started, "poolHits",
                            (json_int_t)f[r].pool_hits, "failures", (json_int_t)f[r].failures));
    }
    double m50 = median(p50, (size_t)rounds), m95 = median(p95, (size_t)rounds),
           m99 = median(p99, (size_t)rounds), mmx = median(mx, (size_t)rounds),
           mbl = median(bl, nb);
    fprintf(out, "  %-6s median:  p50 %7.2f  p95 %7.2f  p99 %7.2f  max %7.2f ms", what, m50, m95,
            m99, mmx);
    if (nb)
        fprintf(out, "  | mean build %.2f ms", mbl);
    fprintf(out, "\n");
    return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "p50_ms", jnum(m50), "p95_ms", jnum(m95),
                     "p99_ms", jnum(m99), "max_ms", jnum(mmx), "shardMeanBuildMs", jnum(mbl),
                     "rounds", runs);
}

size_t
bench_burst_run(sbx_client *c, const struct bench_burst_conf *bc, json_t **json)
{
    size_t failures = 0;
    long rounds = bc->rounds < 1 ? 1 : bc->rounds > MAX_ROUNDS ? MAX_ROUNDS : bc->rounds;
    char path[4096];
    const char *bwrap = bench_find_bwrap(path, sizeof(path));
    json_t *sizes = json_array();
    struct burst_fig sf[MAX_ROUNDS], bf[MAX_ROUNDS];
    double idle_s = 0;

    const char *what = bc->image ? "image" : "sbx";
    fprintf(bc->out, "\nburst: N concurrent creates%s%s (one client and thread each; create → "
                     "first `exec true` result), %ld idle sandboxes present, %ld rounds per N\n",
            bc->image ? " of image " : "", bc->image ? bc->image : "", bc->idle, rounds);
    if (bc->idle > 0) {
        size_t f = fill_run(bc, "idle", bc->idle, FILL_CREATE, &idle_s);
        failures += f;
        fprintf(bc->out, "  %ld idle sandboxes created in %.1f s (%.0f/s, %d client threads)%s\n",
                bc->idle, idle_s, idle_s > 0 ? (double)bc->idle / idle_s : 0.0, FILL_THREADS,
                f ? "  FAILED some" : "");
    }
    for (size_t k = 0; k < bc->nsizes && !*bc->interrupted; k++) {
        long n = bc->sizes[k];
        long done = 0;
        for (long r = 0; r < rounds && !*bc->interrupted; r++, done++) {
            burst(c, bc, n, r, NULL, &sf[r]);
            print_fig(bc->out, what, r, &sf[r]);
            failures += sf[r].failures;
            if (bwrap) {
                burst(c, bc, n, r, bwrap, &bf[r]);
                print_fig(bc->out, "bwrap", r, &bf[r]);
            }
        }
        if (!done)
            break;
        fprintf(bc->out, "  N=%ld, medians of %ld rounds:\n", n, done);
        json_t *row = json_pack("{s:I, s:I, s:o}", "n", (json_int_t)n, "idle",
                                (json_int_t)bc->idle, what, summarise(bc->out, what, sf, done));
        if (bwrap)
            json_object_set_new(row, "bwrap", summarise(bc->out, "bwrap", bf, done));
        json_array_append_new(sizes, row);
    }
    if (!bwrap)
        fprintf(bc->out, "  bwrap not found in $PATH: no bwrap bursts\n");
    if (bc->idle > 0) {
        double s;
        failures += fill_run(bc, "idle", bc->idle, FILL_DESTROY, &s);
    }
    *json = json_pack("{s:I, s:o, s:o, s:o}", "idle", (json_int_t)bc->idle, "idleCreateSeconds",
                      jnum(idle_s), "bwrap", bwrap ? json_string(bwrap) : json_null(), "sizes",
                      sizes);
    return failures;
}
