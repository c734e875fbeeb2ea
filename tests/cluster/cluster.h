/*
 * cluster.h — a multi-host sbx cluster on one machine, for the tests in
 * tests/cluster/ (and tools/bench-cluster.c).
 *
 * Each "host" is a network namespace with a veth pair to a bridge of its own
 * (a random 10.[100-250].x.0/24; the bridge holds .1, node i holds .(11+i);
 * each node's veth forwards IPv4, so its egress sandboxes reach the bridge).
 * etcd listens on the bridge's address (random free ports), every shard node
 * runs `sbxd shard` inside its namespace, listening on tcp://NODEIP:7701 with
 * a tcp relay on :7790 and a relay secret, lease TTL 2 s, distinct host uid
 * ranges (above those `sbxd dev` picks) and names <prefix>-s<i>; the gateways (`sbxd gateway --etcd …`) run in the
 * root namespace on 127.0.0.1.  Binaries come from $SBX_BIN (default
 * build/asan/bin).
 *
 * Processes: a test binary's main() forks a supervisor process that builds
 * all this, owns every process it starts (their parent: it reaps them, and
 * Criterion's runner, which waits on all of its children, never sees them),
 * serves commands from the tests on a unix socket (start, signal, wait a
 * node or a gateway) and tears everything down — processes, cgroups of its
 * shards, namespaces, veths, bridge, etcd data, temporary directory — when
 * main() tells it to, when main() dies (its pipe closes) or on SIGINT/SIGTERM.
 * Shards are started with nsenter-like setns(2) rather than `ip netns exec`:
 * the latter remounts /sys, which hides /sys/fs/cgroup from sbxd.
 *
 * Tests read the cluster's coordinates from the environment (SBXC_*), set by
 * main() before Criterion runs them (each test runs in a process of its own).
 */
#ifndef SBX_TEST_CLUSTER_H
#define SBX_TEST_CLUSTER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <nng/nng.h>
#include <sys/types.h>

#include "../../runtime/place.h"
#include "../../include/sbx/sbx.h"

#define CL_MAX_NODES 4
#define CL_MAX_GWS 2

/* How the supervisor builds the cluster. */
struct cl_opts {
    const char *bindir;  /* sbxd's directory (NULL: $SBX_BIN or build/asan/bin) */
    int nodes;           /* shard nodes started at setup (≤ CL_MAX_NODES; the rest can join) */
    int gateways;        /* gateways started at setup (≤ CL_MAX_GWS) */
    int pool;            /* --pool of each shard */
    const char *const *shard_extra; /* more `sbxd shard` arguments (NULL-terminated) or NULL */
};

/* The cluster as the tests see it (from the environment). */
struct cl_env {
    char ctl[256];         /* the supervisor's command socket */
    char dir[256];         /* temporary directory: logs s<i>.log, g<j>.log, etcd.log */
    char etcd[128];        /* http://IP:PORT */
    char cluster[32];      /* cluster name (etcd prefix /sbx/<cluster>/) */
    char prefix[32];       /* shard names are <prefix>-s<i> */
    char net[16];          /* "10.B.C": node i is 10.B.C.(11+i) */
    char secret[64];       /* relay secret */
    char gw[CL_MAX_GWS][128]; /* gateway URLs */
    int gw_http[CL_MAX_GWS];  /* their HTTP front ports */
    int nodes;             /* shard nodes started at setup */
};

/* ---- main() side ---------------------------------------------------------------- */

/* The `sbxd shard` arguments cluster_main.c adds for every node
 * (NULL-terminated): a weak empty list there; a test binary that needs
 * others defines this (e.g. test_cluster_ws_snap.c: --snapshot-interval). */
extern const char *const cl_shard_extra[];

/*
 * cl_setup — fork the supervisor, build the cluster and wait until it has
 * converged (every partition owned by its rendezvous owner and ready);
 * export SBXC_* for the tests.  0, or -1 (the reason is printed).
 */
int cl_setup(const struct cl_opts *o);
/* cl_teardown — have the supervisor tear everything down and wait for it;
 * keep_logs (e.g. a test failed) keeps the daemons' logs in SBXC_DIR (they
 * are kept anyway with SBX_KEEP_TEST_DATA or when a sanitizer reported).
 * Returns the number of sanitizer reports found in the daemons' logs. */
int cl_teardown(bool keep_logs);

/* ---- test side ------------------------------------------------------------------ */

const struct cl_env *cl_env(void);
void cl_node_name(int i, char *out, size_t outlen);
void cl_node_url(int i, char *out, size_t outlen);
/* cl_dial — dial url (synchronously) on s with the cluster's client
 * identity (<dir>/pki/client.*, signed by the cluster's CA): node URLs are
 * tls+tcp:// (docs/security.md, Transports).  0 or a negative code. */
int cl_dial(nng_socket s, const char *url);
/* cl_node_index — i for "<prefix>-s<i>", else -1. */
int cl_node_index(const char *name);

/* cl_ctl — one command to the supervisor ("start shard 3", "signal gw 0 9",
 * "wait shard 1 20000", "pid shard 2"); its reply ("ok …" / "err …") in
 * reply.  0 if the reply is "ok". */
int cl_ctl(char *reply, size_t rlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
pid_t cl_start(const char *kind, int i);              /* kind "shard" or "gw"; pid or -1 */
/* cl_start_via — start shard node i (if it is not running) with `via` as
 * the first of its etcd endpoints (a test's proxy) and etcd itself second:
 * it talks to etcd through via until a call through it fails.  A later
 * cl_start of the stopped node drops via.  pid or -1. */
pid_t cl_start_via(int i, const char *via);
int cl_signal(const char *kind, int i, int sig);
int cl_wait_exit(const char *kind, int i, int timeout_ms); /* 0: exited (reaped) */

/* The cluster's state in etcd. */
struct cl_state {
    int8_t owner[SBX_PARTITIONS];  /* node index, -1 none, -2 a name not of this cluster */
    int64_t epoch[SBX_PARTITIONS];
    bool live[CL_MAX_NODES];
    int64_t lease[CL_MAX_NODES];   /* the lease of its member key (0: not live); a node that
                                      fenced itself re-joins under a new one */
    bool draining[CL_MAX_NODES];
    int count[CL_MAX_NODES];       /* partitions owned */
};
int cl_read_state(struct cl_state *st);

/*
 * cl_converged — whether the cluster is exactly `set` (n node indexes): those
 * members live, none draining, no other (but a drained one: live, draining,
 * owning nothing); every partition owned by its
 * rendezvous owner over the set (runtime/place.h); every shard of the set
 * (asked through the gateway at gw_url) owning what etcd says, all of it
 * ready, nothing moving.  On false, why says what is not there yet.
 */
bool cl_converged(const int *set, int n, const char *gw_url, char *why, size_t wl);
/* cl_wait_converged — poll cl_converged; elapsed ms, or -1 after timeout_ms. */
double cl_wait_converged(const int *set, int n, const char *gw_url, int timeout_ms, char *why,
                         size_t wl);

/* cl_sanitizer_reports — count ASan/UBSan/LSan reports in the daemons' logs;
 * the first one's opening lines go to out (may be NULL). */
int cl_sanitizer_reports(char *out, size_t outlen);
/* cl_print_log_tails — the last `lines` lines of every log, to stderr. */
void cl_print_log_tails(int lines);

/*
 * Requests through a gateway (tests/cluster/cluster_client.c).
 *
 * cl_gw_client — a client of gateway j (0 ≤ j < CL_MAX_GWS): 0 with *out
 * (owned by the caller: sbx_client_close), or -1 with *out NULL and why
 * saying which gateway and the client's error code and message.
 * cl_drain — cluster.drain {shard: node i's name, drain: on} through c
 * (borrowed), 10 s timeout: 0, or -1 with the request and the error code and
 * message in why (docs/cluster.md, cluster.drain).
 */
int cl_gw_client(int j, sbx_client **out, char *why, size_t wl);
int cl_drain(sbx_client *c, int i, bool on, char *why, size_t wl);
/* cl_place_table — the placement over nodes set[0..n) (n ≤ CL_MAX_NODES),
 * by their names (cl_node_name): table[p] is the index into set of
 * partition p's rendezvous owner (runtime/place.h, sbx_place_table). */
void cl_place_table(const int *set, int n, int16_t table[SBX_PARTITIONS]);
/* cl_owner_among — the node (an element of set) that rendezvous hashing
 * gives partition p among nodes set[0..n). */
int cl_owner_among(const int *set, int n, uint32_t p);
/* cl_pick_id — write to id (il bytes) a sandbox ID unique to this run,
 * <kind><prefix>-<pid>-<k>, whose partition node a owns in st and node b
 * would own among set[0..n); its partition, or -1 if none of 5,000 tries. */
int cl_pick_id(const struct cl_state *st, const char *kind, int a, const int *set, int n,
               int b, char *id, size_t il);

double cl_now_ms(void);
void cl_sleep_ms(int ms);

/* Per-process CPU time (utime+stime, ms) of pid and its descendants
 * (from /proc; used by the benchmark). */
double cl_proc_cpu_ms(pid_t pid);

#endif
