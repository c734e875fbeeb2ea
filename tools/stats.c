/*
 * stats.c — latency samples and nearest-rank percentiles (tools/stats.h).
 */
#include "stats.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/util.h"

double
sbx_stats_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

void
sbx_samples_add(struct sbx_samples *s, double x)
{
    if (s->n == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 256;
        s->v = sbx_xrealloc(s->v, s->cap * sizeof(double));
    }
    s->v[s->n++] = x;
}

void
sbx_samples_free(struct sbx_samples *s)
{
    free(s->v);
    memset(s, 0, sizeof(*s));
}

static int
cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

void
sbx_stats_sort(double *v, size_t n)
{
    if (n > 1)
        qsort(v, n, sizeof(double), cmp_double);
}

double
sbx_stats_pct(const double *sorted, size_t n, double p)
{
    if (n == 0)
        return NAN;
    size_t rank = (size_t)ceil(p / 100.0 * (double)n);
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

struct sbx_summary
sbx_stats_summary(double *v, size_t n)
{
    struct sbx_summary st = {.n = n, .p50 = NAN, .p90 = NAN, .p99 = NAN, .max = NAN, .mean = NAN};
    if (n == 0)
        return st;
    sbx_stats_sort(v, n);
    double sum = 0;
    for (size_t i = 0; i < n; i++)
        sum += v[i];
    st.p50 = sbx_stats_pct(v, n, 50);
    st.p90 = sbx_stats_pct(v, n, 90);
    st.p99 = sbx_stats_pct(v, n, 99);
    st.max = v[n - 1];
    st.mean = sum / (double)n;
    return st;
}

void
sbx_stats_line(const char *what, double *v, size_t n)
{
    if (n == 0) {
        printf("  %-34s n=0\n", what);
        return;
    }
    struct sbx_summary st = sbx_stats_summary(v, n);
    printf("  %-34s n=%-5zu p50 %8.3f  p90 %8.3f  p99 %8.3f  max %8.3f  mean %8.3f ms\n", what,
           n, st.p50, st.p90, st.p99, st.max, st.mean);
}
