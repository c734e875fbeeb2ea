/*
 * cluster_util.h — what the cluster test binaries (test_cluster_churn.c,
 * test_cluster_edges.c) share: convergence waits, gateway clients, sandbox
 * variables read and written with retries, drains, the base state every test
 * starts from, and a write load that records what was acknowledged.  Every
 * function asserts (Criterion) instead of returning an error.
 */
#ifndef SBX_TEST_CLUSTER_UTIL_H
#define SBX_TEST_CLUSTER_UTIL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "cluster.h"

#define CONVERGE_MS 90000

/* Nodes 0-2: the cluster every test starts from. */
extern const int BASE[3];

void fail_with_logs(const char *what, const char *why);
/* Wait until the cluster is exactly `set` and everything in it is ready. */
double converge(const int *set, int n, int gw, const char *what);
void no_sanitizer_reports(void);
/* A client of gateway j (caller closes). */
sbx_client *gw_client(int j);
/* A sandbox ID unique to this run: <kind><tag>-<pid>-<k>. */
void sb_id(char *out, size_t n, const char *kind, int k);
/* env.set K=V, retrying transient failures for up to 60 s; 0 or fails the test. */
void set_var(sbx_client *c, const char *id, const char *k, const char *v);
/* The output of cmd run in the sandbox, retrying transient failures. */
void exec_out(sbx_client *c, const char *id, const char *cmd, char *out, size_t n);
/* The value of $k in the sandbox (an exec), retrying transient failures. */
void get_var(sbx_client *c, const char *id, const char *k, char *out, size_t n);
void destroy_all(sbx_client *c, char (*ids)[64], int n);
/* cluster.drain {shard: node i, drain}. */
void drain(sbx_client *c, int i, bool on);
/* The state every test starts from (whatever an earlier failure left):
 * nodes 0-2 and both gateways running, node 3 stopped, no drain; converged. */
void restore_base(void);
/* The node index owning the sandbox's partition in st. */
int owner_of(const struct cl_state *st, const char *id);

/* A write load: threads doing env.set V=<n> with increasing n per sandbox,
 * retrying on errors, recording the last value acknowledged and attempted. */

#define LOAD_MAX 64
#define LOAD_THREADS_MAX 8

struct load {
    sbx_client *c;
    int n, nthreads;
    char ids[LOAD_MAX][64];
    atomic_bool stop;
    atomic_llong attempted[LOAD_MAX], acked[LOAD_MAX];
    atomic_long oks, errs;
    /* failover: the kill's time, which sandboxes were on the victim, and the
     * time of the first success of a request sent after the kill */
    _Atomic double kill_ms;
    bool victim[LOAD_MAX];
    _Atomic double first_ok[LOAD_MAX];
    pthread_mutex_t mu;
    char codes[16][48];
    long code_counts[16];
    int ncodes;
    pthread_t th[LOAD_THREADS_MAX];
};

/* n sandboxes <kind>…-k; only ones whose partition node owns (-1: any). */
void load_start(struct load *l, sbx_client *c, const char *kind, int n, int nthreads, int node);
void load_stop(struct load *l);
void load_errors(struct load *l, char *out, size_t n);
/* Every sandbox of the load holds a value in [last acknowledged, last attempted]. */
void load_verify(struct load *l, sbx_client *c, long long *vals);

#endif
