/*
 * prom.h — Prometheus metrics: fixed-bucket histograms and a renderer of the
 * text exposition format, version 0.0.4
 * (https://prometheus.io/docs/instrumenting/exposition_formats/, "Text-based
 * format").
 *
 * A sbx_prom is a set of metric families in the order they were first named.
 * Samples are appended to their family's body, so a family's lines stay
 * together and its "# HELP" / "# TYPE" lines are written once, however many
 * sources (the gateway, each shard) add samples to it: the gateway merges
 * the shards' families into its own with sbx_prom_add_raw (docs/operations.md,
 * "Metrics").  Escaping follows the spec: in HELP text `\` and newline
 * become `\\` and `\n`; in a label value `\`, `"` and newline become `\\`,
 * `\"` and `\n`.  Metric names match [a-zA-Z_:][a-zA-Z0-9_:]*, label names
 * [a-zA-Z_][a-zA-Z0-9_]*.
 *
 * Not thread-safe: one owner builds and renders a sbx_prom.  Histograms
 * (struct sbx_hist) are plain counters; their owner serialises updates.
 */
#ifndef SBX_PROM_H
#define SBX_PROM_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

/* Most buckets a histogram has (the +Inf bucket is implied, not counted). */
#define SBX_HIST_MAX 16

/* Bucket bounds (upper, inclusive, ascending) shared by the histograms:
 * latencies in seconds from 100 µs to 30 s, and batch sizes in writes.
 * Read-only. */
extern const double sbx_prom_latency_s[];
extern const int sbx_prom_latency_n;
extern const double sbx_prom_batch_sizes[];
extern const int sbx_prom_batch_n;

/* A histogram with the bounds its owner passes to every call: counts[i]
 * holds the observations ≤ bounds[i] and above bounds[i-1] (not cumulative;
 * the renderer accumulates), count all of them, sum their total.
 * Zero-initialise. */
struct sbx_hist {
    uint64_t counts[SBX_HIST_MAX];
    uint64_t count;
    double sum;
};

/* sbx_hist_observe — count value v (bounds[0..nb), nb ≤ SBX_HIST_MAX). */
void sbx_hist_observe(struct sbx_hist *h, const double *bounds, int nb, double v);

struct sbx_prom_family;

/* A set of families.  Zero-initialise or sbx_prom_init; sbx_prom_free
 * releases it. */
typedef struct sbx_prom {
    struct sbx_prom_family *fam;
    size_t n, cap;
} sbx_prom;

void sbx_prom_init(sbx_prom *p);
void sbx_prom_free(sbx_prom *p);

/*
 * sbx_prom_family — declare family `name` of `type` ("counter", "gauge",
 * "histogram", "untyped") with `help` (any text: escaped here).  A
 * counter's name ends in "_total" and its samples carry that name (suffix
 * ""): the 0.0.4 parsers group samples by their exact name, so a family
 * "x" with samples "x_total" would read as two families.  Declaring
 * an existing family again is allowed when the type is the same (the first
 * help stays).  Returns 0, -EINVAL for a malformed name or unknown type, or
 * -EEXIST when the family exists with another type.
 */
int sbx_prom_family(sbx_prom *p, const char *name, const char *type, const char *help);

/*
 * sbx_prom_labels — render label pairs into out[n] as `k1="v1",k2="v2"`
 * (no braces), escaping values; the arguments are (key, value) pairs ended
 * by a NULL key.  Returns 0, -EINVAL for a malformed label name, or
 * -ENOSPC when out is too small (out then holds "").
 */
int sbx_prom_labels(char *out, size_t n, ...) __attribute__((sentinel));

/*
 * sbx_prom_add — one sample of family `family` (declared before: -ENOENT
 * otherwise): the line `family<suffix>{labels} value`, suffix "" or e.g.
 * "_total"; labels from sbx_prom_labels, or NULL/"" for none.
 * Values print as %.15g when that reads back exactly, else %.17g; +Inf,
 * -Inf or NaN.
 */
int sbx_prom_add(sbx_prom *p, const char *family, const char *suffix, const char *labels,
                 double value);

/*
 * sbx_prom_add_hist — the `_bucket` lines (cumulative, `le` added after
 * labels, ending with le="+Inf"), `_sum` and `_count` of h for family (a
 * histogram).  0, or -ENOENT as sbx_prom_add.
 */
int sbx_prom_add_hist(sbx_prom *p, const char *family, const char *labels,
                      const double *bounds, int nb, const struct sbx_hist *h);

/*
 * sbx_prom_add_raw — append sample lines already rendered (body[0..len),
 * whole lines ending in '\n') to family name, declaring it as
 * sbx_prom_family does: how the gateway merges what the shards sent.
 * Returns what sbx_prom_family returns; -EINVAL when body does not end
 * with a newline.
 */
int sbx_prom_add_raw(sbx_prom *p, const char *name, const char *type, const char *help,
                     const char *body, size_t len);

/* sbx_prom_get — family i (0 ≤ i < p->n): its name, type, help (raw, not
 * escaped) and body; pointers into p, valid until p changes. */
void sbx_prom_get(const sbx_prom *p, size_t i, const char **name, const char **type,
                  const char **help, const char **body, size_t *len);

/* sbx_prom_render — append the whole exposition (every family: HELP, TYPE,
 * samples) to out. */
void sbx_prom_render(const sbx_prom *p, sbx_buf *out);

/* The Content-Type of the rendering (the spec's). */
#define SBX_PROM_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

#endif
