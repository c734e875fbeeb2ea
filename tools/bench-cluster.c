/*
 * sbx-bench-cluster — horizontal scaling of an sbx cluster on one machine.
 *
 *   sbx-bench-cluster [--seconds S] [--clients C] [--nodes N] [--writes] [--keep]
 *
 * Builds the multi-host cluster of tests/cluster/cluster.h (shard nodes in
 * network namespaces on a private bridge, etcd on the bridge, one gateway in
 * the root namespace; binaries from $SBX_BIN, else the directory of this
 * executable — the release build with `make bench-cluster`), then:
 *
 *   scale     with 1, 2, … N shard nodes (each step a node joins): the same
 *             offered load — C client threads sharing one client, each
 *             running `exec true` on its own sandbox (C distinct sandboxes,
 *             warmed first) in a closed loop for S seconds.  Execs/s and
 *             p50/p99 latency (client side, ms), and per node: the execs it
 *             served (its sandboxes, from the partition table), the CPU time
 *             of its sbxd and everything under it (containers: agent, shell,
 *             `true`), from /proc (utime+stime, with what reaped children
 *             left in cutime+cstime), and execs per CPU-second.  The
 *             gateway's, etcd's and the client's CPU are reported too.
 *   join      for each join: partitions moved to the new node, moved between
 *             the others (must be 0: rendezvous hashing), time from starting
 *             the node to a converged cluster (every partition at its owner,
 *             ready on it).
 *   leave     node N drained (`cluster.drain`): partitions moved off it and
 *             the time until it owns none and the rest have converged.
 *   failover  with N-1 nodes under the same load, node 1 is SIGKILLed:
 *             time from the kill to the first successful exec (sent after the
 *             kill) on a sandbox whose partition was on it, and until every
 *             one of them has answered (each needs a new container on its new
 *             node); lease TTL 2 s.
 *
 * --writes: each client runs `env.set V=<n>` instead (a record write, no
 * container: committed to the node's LMDB, then replicated to etcd before
 * the reply) — the write path's throughput and latency ("execs" are then
 * writes).
 *
 * All processes share this machine's cores: see the notes printed at the end
 * (and docs/benchmarks.md, "Cluster scaling") for how the figures extrapolate
 * to one node per machine.  Must run as root.  Exit status 0, or 1 when the
 * cluster could not be built or a phase failed.
 */
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../runtime/util.h"
#include "../tests/cluster/cluster.h"
#include "stats.h"

#define MAX_CLIENTS 256

static int seconds = 10, nclients = 64, max_nodes = 4;
static bool writes; /* --writes: env.set instead of exec */

struct client {
    int k;
    char id[64];
    double *lat;
    size_t n, cap;
    long errors;
    char last_err[96];
    double first_ok_after; /* failover: ms after the kill of the first success sent after it */
};

static struct client cl[MAX_CLIENTS];
static sbx_client *C;
static atomic_bool stop_flag;
static _Atomic double kill_at;

static int
exec_true(const char *id, char *errbuf, size_t el)
{
    if (writes) {
        static atomic_long seq;
        char args[96];
        snprintf(args, sizeof(args), "{\"vars\":{\"V\":\"%ld\"}}", atomic_fetch_add(&seq, 1));
        sbx_reply *rep = NULL;
        sbx_error err;
        int rc = sbx_call_json(C, "env.set", id, args, 30000, &rep, &err);
        sbx_reply_free(rep);
        if (rc) {
            snprintf(errbuf, el, "%s %s", err.code, err.message);
            sbx_error_free(&err);
        }
        return rc;
    }
    sbx_exec_opts o = {.command = "true", .timeout_ms = 30000};
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(C, id, &o, &r, &err);
    sbx_exec_result_free(&r);
    if (rc) {
        snprintf(errbuf, el, "%s %s", err.code, err.message);
        sbx_error_free(&err);
    }
    return rc;
}

static void *
client_main(void *arg)
{
    struct client *c = arg;
    while (!atomic_load(&stop_flag)) {
        double t0 = cl_now_ms();
        char e[96];
        if (exec_true(c->id, e, sizeof(e)) == 0) {
            double t1 = cl_now_ms();
            if (c->n == c->cap) {
                c->cap = c->cap ? c->cap * 2 : 4096;
                c->lat = realloc(c->lat, c->cap * sizeof(double));
            }
            c->lat[c->n++] = t1 - t0;
            double k = atomic_load(&kill_at);
            if (k > 0 && t0 >= k && c->first_ok_after == 0)
                c->first_ok_after = t1 - k;
        } else {
            c->errors++;
            snprintf(c->last_err, sizeof(c->last_err), "%s", e);
            cl_sleep_ms(20);
        }
    }
    return NULL;
}

static pthread_t th[MAX_CLIENTS];

static void
run_clients_start(void)
{
    atomic_store(&stop_flag, false);
    for (int k = 0; k < nclients; k++) {
        cl[k].n = 0;
        cl[k].errors = 0;
        cl[k].first_ok_after = 0;
        pthread_create(&th[k], NULL, client_main, &cl[k]);
    }
}

static void
run_clients_stop(void)
{
    atomic_store(&stop_flag, true);
    for (int k = 0; k < nclients; k++)
        pthread_join(th[k], NULL);
}

static pid_t
pid_of(const char *kind, int i)
{
    char r[64];
    if (cl_ctl(r, sizeof(r), "pid %s %d", kind, i) != 0)
        return 0;
    return (pid_t)atoi(r + 3);
}

static double
self_cpu_ms(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000.0 +
           (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1000.0;
}

/* Warm every sandbox: a successful exec on each (containers start where needed). */
static int
warm_all(void)
{
    for (int k = 0; k < nclients; k++) {
        char e[96];
        int tries = 0;
        while (exec_true(cl[k].id, e, sizeof(e)) != 0) {
            if (++tries > 50) {
                fprintf(stderr, "bench-cluster: %s does not answer: %s\n", cl[k].id, e);
                return -1;
            }
            cl_sleep_ms(200);
        }
    }
    return 0;
}

struct row {
    int nodes;
    double execs_s, p50, p99;
    long errors;
    double node_cpu_s[CL_MAX_NODES];
    long node_execs[CL_MAX_NODES];
    int node_sandboxes[CL_MAX_NODES];
    double gw_cpu_s, etcd_cpu_s, client_cpu_s;
};

static int
measure(int nodes, struct row *row)
{
    struct cl_state st;
    if (cl_read_state(&st) != 0)
        return -1;
    pid_t sp[CL_MAX_NODES], gp = pid_of("gw", 0), ep = pid_of("etcd", 0);
    double c0[CL_MAX_NODES], g0, e0, s0;
    for (int i = 0; i < nodes; i++) {
        sp[i] = pid_of("shard", i);
        c0[i] = cl_proc_cpu_ms(sp[i]);
    }
    g0 = cl_proc_cpu_ms(gp);
    e0 = cl_proc_cpu_ms(ep);
    s0 = self_cpu_ms();
    double t0 = cl_now_ms();
    run_clients_start();
    cl_sleep_ms(seconds * 1000);
    run_clients_stop();
    double el = (cl_now_ms() - t0) / 1000.0;
    memset(row, 0, sizeof(*row));
    row->nodes = nodes;
    for (int i = 0; i < nodes; i++)
        row->node_cpu_s[i] = (cl_proc_cpu_ms(sp[i]) - c0[i]) / 1000.0;
    row->gw_cpu_s = (cl_proc_cpu_ms(gp) - g0) / 1000.0;
    row->etcd_cpu_s = (cl_proc_cpu_ms(ep) - e0) / 1000.0;
    row->client_cpu_s = (self_cpu_ms() - s0) / 1000.0;
    size_t total = 0;
    for (int k = 0; k < nclients; k++) {
        total += cl[k].n;
        row->errors += cl[k].errors;
        int o = st.owner[sbx_place_partition(cl[k].id, strlen(cl[k].id))];
        if (o >= 0 && o < CL_MAX_NODES) {
            row->node_execs[o] += (long)cl[k].n;
            row->node_sandboxes[o]++;
        }
        if (cl[k].errors)
            fprintf(stderr, "  %s: %ld errors, last: %s\n", cl[k].id, cl[k].errors, cl[k].last_err);
    }
    double *all = sbx_xmalloc((total ? total : 1) * sizeof(double));
    size_t n = 0;
    for (int k = 0; k < nclients; k++) {
        memcpy(all + n, cl[k].lat, cl[k].n * sizeof(double));
        n += cl[k].n;
    }
    struct sbx_summary sum = sbx_stats_summary(all, n);
    row->execs_s = (double)n / el;
    row->p50 = sum.p50;
    row->p99 = sum.p99;
    free(all);
    return 0;
}

static void
print_row(const struct row *r)
{
    double ncpu = 0;
    long nex = 0;
    for (int i = 0; i < r->nodes; i++) {
        ncpu += r->node_cpu_s[i];
        nex += r->node_execs[i];
    }
    printf("%5d  %8.0f  %6.2f  %6.2f  %6ld  %9.1f  %9.0f  %8.1f  %7.1f  %7.1f\n", r->nodes,
           r->execs_s, r->p50, r->p99, r->errors, ncpu, ncpu > 0 ? (double)nex / ncpu : 0,
           r->gw_cpu_s, r->etcd_cpu_s, r->client_cpu_s);
    for (int i = 0; i < r->nodes; i++)
        printf("         node %d: %2d sandboxes, %6ld execs (%4.1f %%), %5.1f CPU-s, %6.0f execs per "
               "CPU-s\n",
               i, r->node_sandboxes[i], r->node_execs[i],
               nex ? 100.0 * (double)r->node_execs[i] / (double)nex : 0, r->node_cpu_s[i],
               r->node_cpu_s[i] > 0 ? (double)r->node_execs[i] / r->node_cpu_s[i] : 0);
}

static const char *
bindir_default(void)
{
    static char dir[PATH_MAX];
    const char *e = getenv("SBX_BIN");
    if (e && *e)
        return e;
    ssize_t n = readlink("/proc/self/exe", dir, sizeof(dir) - 1);
    if (n <= 0)
        return "bin";
    dir[n] = '\0';
    return dirname(dir);
}

int
main(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seconds") && i + 1 < argc)
            seconds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--clients") && i + 1 < argc)
            nclients = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--nodes") && i + 1 < argc)
            max_nodes = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--writes"))
            writes = true;
        else if (!strcmp(argv[i], "--keep"))
            setenv("SBX_KEEP_TEST_DATA", "1", 1);
        else {
            fprintf(stderr, "usage: sbx-bench-cluster [--seconds S] [--clients C] [--nodes N] "
                            "[--writes] [--keep]\n");
            return 2;
        }
    }
    if (seconds < 1 || nclients < 1 || nclients > MAX_CLIENTS || max_nodes < 2 ||
        max_nodes > CL_MAX_NODES) {
        fprintf(stderr, "sbx-bench-cluster: --clients 1-%d, --nodes 2-%d\n", MAX_CLIENTS,
                CL_MAX_NODES);
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    const char *const extra[] = {NULL};
    struct cl_opts o = {.bindir = bindir_default(), .nodes = 1, .gateways = 1, .pool = 1,
                        .shard_extra = extra};
    double t0 = cl_now_ms();
    if (cl_setup(&o) != 0)
        return 1;
    int rc = 1;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    double load1 = 0;
    FILE *lf = fopen("/proc/loadavg", "r");
    if (lf) {
        if (fscanf(lf, "%lf", &load1) != 1)
            load1 = 0;
        fclose(lf);
    }
    printf("sbx-bench-cluster: %d client threads, `%s` on %d distinct sandboxes, %d s per "
           "step; %ld CPUs shared by everything (load average %.2f at the start); cluster up in "
           "%.1f s (binaries %s)\n",
           nclients, writes ? "env.set V=<n>" : "exec true", nclients, seconds, ncpu, load1,
           (cl_now_ms() - t0) / 1000, o.bindir);
    sbx_error oerr;
    if (sbx_client_open(&C, cl_env()->gw[0], &oerr) != 0) {
        fprintf(stderr, "bench-cluster: cannot reach the gateway: %s\n", oerr.message);
        goto out;
    }
    sbx_client_set_timeout(C, 60000);
    for (int k = 0; k < nclients; k++) {
        cl[k].k = k;
        snprintf(cl[k].id, sizeof(cl[k].id), "b%s-%d-%d", cl_env()->prefix + 1, (int)getpid() % 100000, k);
    }
    struct row rows[CL_MAX_NODES];
    struct {
        int to_new, between;
        double ms;
    } joins[CL_MAX_NODES] = {{0}};
    int set[CL_MAX_NODES];
    char why[512];
    for (int n = 1; n <= max_nodes; n++) {
        for (int i = 0; i < n; i++)
            set[i] = i;
        if (n > 1) {
            struct cl_state before, after;
            cl_read_state(&before);
            double j0 = cl_now_ms();
            if (cl_start("shard", n - 1) <= 0) {
                fprintf(stderr, "bench-cluster: cannot start node %d\n", n - 1);
                goto out;
            }
            if (cl_wait_converged(set, n, cl_env()->gw[0], 120000, why, sizeof(why)) < 0) {
                fprintf(stderr, "bench-cluster: no convergence with %d nodes: %s\n", n, why);
                goto out;
            }
            joins[n - 1].ms = cl_now_ms() - j0;
            cl_read_state(&after);
            for (int p = 0; p < SBX_PARTITIONS; p++) {
                if (after.owner[p] == n - 1)
                    joins[n - 1].to_new++;
                else if (after.owner[p] != before.owner[p])
                    joins[n - 1].between++;
            }
        }
        if (warm_all() != 0)
            goto out;
        if (measure(n, &rows[n - 1]) != 0)
            goto out;
        if (n == 1)
            printf("\nnodes  execs/s  p50 ms  p99 ms  errors  node CPU-s  execs/CPU-s  gw CPU-s  "
                   "etcd CPU-s  client CPU-s\n");
        print_row(&rows[n - 1]);
        fflush(stdout);
    }

    printf("\njoins (rendezvous hashing over 4096 partitions):\n");
    for (int n = 2; n <= max_nodes; n++)
        printf("  %d -> %d nodes: %4d partitions (%4.1f %%) moved to the new node, %d between "
               "the others; converged %.0f ms after the node started\n",
               n - 1, n, joins[n - 1].to_new, 100.0 * joins[n - 1].to_new / SBX_PARTITIONS,
               joins[n - 1].between, joins[n - 1].ms);

    /* Leave: drain the last node. */
    {
        struct cl_state before, after;
        cl_read_state(&before);
        int leaving = max_nodes - 1;
        char name[64], args[160];
        cl_node_name(leaving, name, sizeof(name));
        snprintf(args, sizeof(args), "{\"shard\":\"%s\",\"drain\":true}", name);
        sbx_reply *r = NULL;
        sbx_error e;
        double d0 = cl_now_ms();
        if (sbx_call_json(C, "cluster.drain", NULL, args, 10000, &r, &e) != 0) {
            fprintf(stderr, "bench-cluster: cluster.drain: %s %s\n", e.code, e.message);
            goto out;
        }
        sbx_reply_free(r);
        if (cl_wait_converged(set, max_nodes - 1, cl_env()->gw[0], 120000, why, sizeof(why)) <
            0) {
            fprintf(stderr, "bench-cluster: the drain did not converge: %s\n", why);
            goto out;
        }
        double dms = cl_now_ms() - d0;
        cl_read_state(&after);
        int moved = 0, between = 0;
        for (int p = 0; p < SBX_PARTITIONS; p++) {
            if (before.owner[p] == leaving)
                moved++;
            else if (after.owner[p] != before.owner[p])
                between++;
        }
        printf("\nleave: node %d drained: %d partitions (%.1f %%) moved off it (%d between the "
               "others) in %.0f ms\n",
               leaving, moved, 100.0 * moved / SBX_PARTITIONS, between, dms);
        cl_signal("shard", leaving, SIGTERM);
        cl_wait_exit("shard", leaving, 30000);
        snprintf(args, sizeof(args), "{\"shard\":\"%s\",\"drain\":false}", name);
        if (sbx_call_json(C, "cluster.drain", NULL, args, 10000, &r, &e) == 0)
            sbx_reply_free(r);
        else
            sbx_error_free(&e);
        if (cl_wait_converged(set, max_nodes - 1, cl_env()->gw[0], 120000, why, sizeof(why)) <
            0) {
            fprintf(stderr, "bench-cluster: no convergence after the leave: %s\n", why);
            goto out;
        }
    }

    /* Failover: SIGKILL node 1 under load. */
    {
        int victim = 1, nodes = max_nodes - 1;
        struct cl_state st;
        cl_read_state(&st);
        bool on[MAX_CLIENTS];
        int non = 0;
        for (int k = 0; k < nclients; k++) {
            on[k] = st.owner[sbx_place_partition(cl[k].id, strlen(cl[k].id))] == victim;
            non += on[k];
        }
        if (warm_all() != 0)
            goto out;
        atomic_store(&kill_at, 0);
        run_clients_start();
        cl_sleep_ms(2000);
        double k0 = cl_now_ms();
        atomic_store(&kill_at, k0);
        cl_signal("shard", victim, SIGKILL);
        double all = -1;
        while (cl_now_ms() - k0 < 60000) {
            int done = 0;
            double worst = 0;
            for (int k = 0; k < nclients; k++)
                if (on[k] && cl[k].first_ok_after > 0) {
                    done++;
                    worst = fmax(worst, cl[k].first_ok_after);
                }
            if (done == non) {
                all = worst;
                break;
            }
            cl_sleep_ms(20);
        }
        run_clients_stop();
        double first = -1;
        long errs = 0;
        for (int k = 0; k < nclients; k++) {
            errs += cl[k].errors;
            if (on[k] && cl[k].first_ok_after > 0 && (first < 0 || cl[k].first_ok_after < first))
                first = cl[k].first_ok_after;
        }
        printf("\nfailover: node %d of %d SIGKILLed under load (%d of %d sandboxes on it, lease TTL "
               "2 s): first of them answered %.0f ms after the kill, all of them after %.0f ms; "
               "client errors during the run: %ld (the kill drops the requests in flight on it: "
               "SHARD_UNAVAILABLE)\n",
               victim, nodes, non, nclients, first, all, errs);
        if (all < 0)
            goto out;
    }

    printf("\nHow to read this (every process above shares the same %ld CPUs):\n"
           "  * Total execs/s cannot grow with nodes here: nodes, gateway, etcd and the client\n"
           "    compete for the same cores.  What a node costs is its CPU time (sbxd + its\n"
           "    containers); 'execs/CPU-s' is what one node delivers per second of one core.\n"
           "  * A warm exec touches only the sandbox's node (etcd is not on the path; records\n"
           "    change only when a container starts or stops), so with one node per machine of\n"
           "    K cores, a node serves about K x execs/CPU-s (if CPU-bound), and N nodes about\n"
           "    N times that: the partition table spreads sandboxes evenly (see the shares).\n"
           "  * The gateway tier is stateless and scales out separately: its cost per exec is\n"
           "    gw CPU-s / (execs/s x seconds); likewise the client's.\n",
           ncpu);
    rc = 0;
out:
    if (C)
        sbx_client_close(C);
    int reports = cl_teardown(rc != 0);
    for (int k = 0; k < nclients; k++)
        free(cl[k].lat);
    return rc || reports ? 1 : 0;
}
