/*
 * bench.h — what the phases of sbx-bench share across its files
 * (tools/bench.c: options, the private daemon, the sequential phases;
 * tools/bench_burst.c: the burst phase).  Not a library: sbx-bench only.
 */
#ifndef SBX_TOOLS_BENCH_H
#define SBX_TOOLS_BENCH_H

#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "../include/sbx/sbx.h"

/* The shards' counters summed over one cluster.status (each shard's
 * `status`: containersStarted, poolHits, meanStartUs × containersStarted,
 * pool). */
struct bench_totals {
    int nshards;
    bool all_ok;        /* every shard answered with health "ok" */
    int64_t started, pool_hits, start_us_total, pool;
    int64_t pool_target; /* the shards' poolTarget summed */
    char cgroups[160];  /* the first shard's cgroup mode */
};

/* bench_cluster_totals — one cluster.status call on c; 0, or -1 with *err
 * filled (the caller frees it). */
int bench_cluster_totals(sbx_client *c, struct bench_totals *t, sbx_error *err);

/* bench_wait_pool_settled — until the shards' pools hold their targets and
 * have not changed for 300 ms (at most 10 s): a burst then meets the pools
 * a quiet spell would leave. */
void bench_wait_pool_settled(sbx_client *c);

/* bench_exec_true — one `exec true` on sandbox id (default session unless
 * sessionless), timed from the call to its result: 0 and *ms, or -1 with
 * *err filled (a non-zero exit counts as a failure, code EXIT_STATUS). */
int bench_exec_true(sbx_client *c, const char *id, bool sessionless, double *ms, sbx_error *err);

/* bench_find_bwrap — the first executable bwrap in $PATH, written to
 * out[0..n) and returned; NULL when there is none. */
const char *bench_find_bwrap(char *out, size_t n);

/* bench_bwrap_once — fork, exec and wait for `bwrap --unshare-all
 * --ro-bind /usr /usr … true`; *ms from fork to waitpid.  Its exit status,
 * or -1 when fork or waitpid failed.  Safe to call from several threads. */
int bench_bwrap_once(const char *bwrap, double *ms);

/* The burst phase (bench_burst.c). */
struct bench_burst_conf {
    const char *url;        /* the gateway each client thread connects to */
    const char *tag;        /* prefix of this run's sandbox IDs */
    const long *sizes;      /* burst sizes N (concurrent creates), nsizes of them */
    size_t nsizes;
    long rounds;            /* bursts per size; the summary is their median */
    long idle;              /* idle sandboxes created (and left running) first */
    const char *image;      /* NULL: host-/usr sandboxes; else each create names this
                             * image ({"image": …}), timed from the create */
    FILE *out;              /* human-readable lines */
    volatile sig_atomic_t *interrupted; /* set by the signal handler: stop early */
};

/*
 * bench_burst_run — the burst phase: `idle` sandboxes created first (8
 * client threads; their creation rate printed), then for every size N,
 * `rounds` times: N threads, each with its own client connected before the
 * start, released together, each timing `exec true` on a new sandbox ID
 * (create → first result; with `image`, an explicit create {image} first,
 * and the rows are labelled "image"); the shards' counters before and after give the
 * containers started and their mean shard-side build time; then N threads
 * each running bwrap … true once, released together.  Every sandbox it
 * created is destroyed before it returns.  c is a client for cluster.status
 * (borrowed).  *json (owned by the caller) gets the figures.  Returns the
 * number of failed calls.
 */
size_t bench_burst_run(sbx_client *c, const struct bench_burst_conf *bc, json_t **json);

/* The image phase (bench_image.c): import path (a layout or tarball on this
 * machine), then n cold starts (create → first `exec true`) of its sandboxes
 * alternated with n of host-/usr sandboxes, IDs prefixed with tag; then,
 * when bursts is not NULL, its bursts with sandboxes of the image (no idle
 * ones); figures printed to out; the image is removed afterwards.  Returns
 * the number of failed calls. */
size_t bench_image_run(sbx_client *c, const char *path, long n, const char *tag, FILE *out,
                       volatile sig_atomic_t *interrupted, const struct bench_burst_conf *bursts);

/* The wake-up phase (bench_workspace.c): n wake-ups (stopped by sleepAfter
 * → first `exec true`) of a sandbox with a persistent 100 MB workspace,
 * alternated with n of an ephemeral one; figures printed to out; both
 * destroyed afterwards.  Returns the number of failed calls. */
size_t bench_workspace_run(sbx_client *c, long n, const char *tag, FILE *out,
                           volatile sig_atomic_t *interrupted);

/* The fork phase (bench_workspace.c): n forks, one at a time, of a running
 * sandbox with a persistent 100 MB workspace, each destroyed after; the
 * client's round trip of sandbox.fork and the shard's copyMs printed to
 * out.  Returns the number of failed calls. */
size_t bench_fork_run(sbx_client *c, long n, const char *tag, FILE *out,
                      volatile sig_atomic_t *interrupted);

#endif
