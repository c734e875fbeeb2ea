/*
 * stats.h — latency samples and their summaries, shared by the benchmarks
 * and the soak (tools/bench*.c, tools/soak.c).
 *
 * Percentiles are nearest-rank (the smallest sample with at least p % of
 * the samples at or below it), as docs/benchmarks.md states; all times are
 * milliseconds from CLOCK_MONOTONIC.
 */
#ifndef SBX_TOOLS_STATS_H
#define SBX_TOOLS_STATS_H

#include <stddef.h>

/* A growable set of samples (ms).  Zero-initialise; sbx_samples_free
 * releases v.  Not thread-safe: one set per thread, merged afterwards. */
struct sbx_samples {
    double *v;
    size_t n, cap;
};

/* A summary of n samples; every figure is NAN when n == 0. */
struct sbx_summary {
    size_t n;
    double p50, p90, p99, max, mean;
};

/* sbx_stats_now_ms — CLOCK_MONOTONIC in milliseconds (fractional). */
double sbx_stats_now_ms(void);

/* sbx_samples_add — append x; grows v (aborts on out-of-memory, as
 * sbx_xrealloc). */
void sbx_samples_add(struct sbx_samples *s, double x);

/* sbx_samples_free — release v and zero the set. */
void sbx_samples_free(struct sbx_samples *s);

/* sbx_stats_sort — sort v[0..n) ascending in place. */
void sbx_stats_sort(double *v, size_t n);

/* sbx_stats_pct — the nearest-rank p-th percentile (p in percent, 0–100)
 * of sorted[0..n); NAN when n == 0. */
double sbx_stats_pct(const double *sorted, size_t n, double p);

/* sbx_stats_summary — sort v[0..n) in place and summarise it. */
struct sbx_summary sbx_stats_summary(double *v, size_t n);

/* sbx_stats_line — sort v[0..n) and print one line:
 * "  WHAT  n=N  p50 …  p90 …  p99 …  max …  mean … ms" (nothing but the
 * label and n when n == 0). */
void sbx_stats_line(const char *what, double *v, size_t n);

#endif
