/*
 * cluster_util.c — the cluster test binaries' shared helpers and write load
 * (cluster_util.h).
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../runtime/etcd.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "cluster.h"
#include "cluster_util.h"

const int BASE[3] = {0, 1, 2};

/* ------------------------------------------------------------------------------ */
/* helpers */

void
fail_with_logs(const char *what, const char *why)
{
    cl_print_log_tails(25);
    cr_assert_fail("%s: %s", what, why);
}

/* Wait until the cluster is exactly `set` and everything in it is ready. */
double
converge(const int *set, int n, int gw, const char *what)
{
    char why[512] = "";
    double t = cl_wait_converged(set, n, cl_env()->gw[gw], CONVERGE_MS, why, sizeof(why));
    if (t < 0)
        fail_with_logs(what, why);
    return t;
}

void
no_sanitizer_reports(void)
{
    char first[2048];
    int n = cl_sanitizer_reports(first, sizeof(first));
    cr_expect_eq(n, 0, "%d sanitizer report(s) in the daemons' logs; first:\n%s", n, first);
}

sbx_client *
gw_client(int j)
{
    sbx_client *c = NULL;
    char why[512];
    if (cl_gw_client(j, &c, why, sizeof(why)) != 0)
        cr_assert_fail("%s", why);
    return c;
}

/* A sandbox ID unique to this run: <kind><tag>-<pid>-<k>. */
void
sb_id(char *out, size_t n, const char *kind, int k)
{
    snprintf(out, n, "%s%s-%d-%d", kind, cl_env()->prefix + 1, (int)getpid() % 100000, k);
}

static bool
transient(const char *code)
{
    return !strcmp(code, "SHARD_UNAVAILABLE") || !strcmp(code, "REQUEST_TIMEOUT") ||
           !strcmp(code, "GATEWAY_UNAVAILABLE");
}

/* env.set K=V, retrying transient failures for up to 60 s; 0 or fails the test. */
void
set_var(sbx_client *c, const char *id, const char *k, const char *v)
{
    char args[512];
    snprintf(args, sizeof(args), "{\"vars\":{\"%s\":\"%s\"}}", k, v);
    double until = cl_now_ms() + 60000;
    for (;;) {
        sbx_reply *r = NULL;
        sbx_error err;
        if (sbx_call_json(c, "env.set", id, args, 20000, &r, &err) == 0) {
            sbx_reply_free(r);
            return;
        }
        bool again = transient(err.code) && cl_now_ms() < until;
        if (!again)
            cr_assert_fail("env.set %s on %s: %s %s", k, id, err.code, err.message);
        sbx_error_free(&err);
        cl_sleep_ms(200);
    }
}

/* The output of cmd run in the sandbox, retrying transient failures. */
void
exec_out(sbx_client *c, const char *id, const char *cmd, char *out, size_t n)
{
    sbx_exec_opts o = {.command = cmd, .timeout_ms = 20000};
    double until = cl_now_ms() + 60000;
    for (;;) {
        sbx_exec_result r;
        sbx_error err;
        int rc = sbx_exec(c, id, &o, &r, &err);
        if (rc == 0) {
            snprintf(out, n, "%.*s", (int)r.stdout_len, r.stdout_data ? r.stdout_data : "");
            sbx_exec_result_free(&r);
            return;
        }
        sbx_exec_result_free(&r);
        bool again = transient(err.code) && cl_now_ms() < until;
        if (!again)
            cr_assert_fail("exec '%s' on %s: %s %s", cmd, id, err.code, err.message);
        sbx_error_free(&err);
        cl_sleep_ms(200);
    }
}

/* The value of $k in the sandbox (an exec), retrying transient failures. */
void
get_var(sbx_client *c, const char *id, const char *k, char *out, size_t n)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "printf '%%s' \"$%s\"", k);
    exec_out(c, id, cmd, out, n);
}

void
destroy_all(sbx_client *c, char (*ids)[64], int n)
{
    for (int k = 0; k < n; k++)
        sbx_destroy(c, ids[k], NULL, NULL);
}

/* cluster.drain {shard: node i, drain}. */
void
drain(sbx_client *c, int i, bool on)
{
    char why[512];
    cr_assert_eq(cl_drain(c, i, on, why, sizeof(why)), 0, "%s", why);
}

/* The state every test starts from (whatever an earlier failure left):
 * nodes 0-2 and both gateways running, node 3 stopped, no drain; converged. */
void
restore_base(void)
{
    char r[64];
    for (int i = 0; i < 3; i++) {
        cl_signal("shard", i, SIGCONT); /* fails harmlessly when it is not stopped */
        cr_assert_gt(cl_start("shard", i), 0, "cannot start node %d", i);
    }
    for (int j = 0; j < 2; j++)
        cr_assert_gt(cl_start("gw", j), 0, "cannot start gateway %d", j);
    if (cl_ctl(r, sizeof(r), "pid shard 3") == 0 && atoi(r + 3) > 0) {
        cl_signal("shard", 3, SIGCONT);
        cl_signal("shard", 3, SIGTERM);
        cr_assert_eq(cl_wait_exit("shard", 3, 30000), 0, "node 3 did not stop");
    }
    sbx_client *c = NULL;
    sbx_error err;
    for (int k = 0; k < 100 && sbx_client_open(&c, cl_env()->gw[0], &err) != 0; k++)
        cl_sleep_ms(100);
    cr_assert_not_null(c, "gateway 0 does not answer");
    struct cl_state st;
    if (cl_read_state(&st) == 0)
        for (int i = 0; i < CL_MAX_NODES; i++)
            if (st.draining[i])
                drain(c, i, false);
    sbx_client_close(c);
    converge(BASE, 3, 0, "initial convergence");
}

int
owner_of(const struct cl_state *st, const char *id)
{
    return st->owner[sbx_place_partition(id, strlen(id))];
}

struct load_arg {
    struct load *l;
    int t;
};

static void
load_note_error(struct load *l, const char *code)
{
    pthread_mutex_lock(&l->mu);
    int k;
    for (k = 0; k < l->ncodes; k++)
        if (!strcmp(l->codes[k], code))
            break;
    if (k == l->ncodes && l->ncodes < 16)
        snprintf(l->codes[l->ncodes++], sizeof(l->codes[0]), "%s", code);
    if (k < 16)
        l->code_counts[k]++;
    pthread_mutex_unlock(&l->mu);
}

static void *
load_main(void *arg)
{
    struct load_arg *a = arg;
    struct load *l = a->l;
    while (!atomic_load(&l->stop)) {
        for (int i = a->t; i < l->n && !atomic_load(&l->stop); i += l->nthreads) {
            long long v = atomic_load(&l->attempted[i]) + 1;
            atomic_store(&l->attempted[i], v);
            char args[96];
            snprintf(args, sizeof(args), "{\"vars\":{\"V\":\"%lld\"}}", v);
            double sent = cl_now_ms();
            sbx_reply *r = NULL;
            sbx_error err;
            if (sbx_call_json(l->c, "env.set", l->ids[i], args, 20000, &r, &err) == 0) {
                sbx_reply_free(r);
                atomic_store(&l->acked[i], v);
                atomic_fetch_add(&l->oks, 1);
                double k = atomic_load(&l->kill_ms);
                if (k > 0 && sent >= k && atomic_load(&l->first_ok[i]) == 0)
                    atomic_store(&l->first_ok[i], cl_now_ms() - k);
            } else {
                atomic_fetch_add(&l->errs, 1);
                load_note_error(l, err.code);
                sbx_error_free(&err);
                cl_sleep_ms(20);
            }
        }
    }
    free(a);
    return NULL;
}

/* n sandboxes <kind>…-k; only ones whose partition node owns (-1: any). */
void
load_start(struct load *l, sbx_client *c, const char *kind, int n, int nthreads, int node)
{
    static struct cl_state st;
    memset(l, 0, sizeof(*l));
    pthread_mutex_init(&l->mu, NULL);
    l->c = c;
    l->n = n;
    l->nthreads = nthreads;
    if (node >= 0)
        cr_assert_eq(cl_read_state(&st), 0);
    for (int i = 0, k = 0; i < n; k++) {
        cr_assert_lt(k, 100000, "no sandbox IDs on node %d", node);
        sb_id(l->ids[i], sizeof(l->ids[i]), kind, k);
        if (node < 0 || owner_of(&st, l->ids[i]) == node)
            i++;
    }
    for (int t = 0; t < nthreads; t++) {
        struct load_arg *a = malloc(sizeof(*a));
        a->l = l;
        a->t = t;
        pthread_create(&l->th[t], NULL, load_main, a);
    }
}

void
load_stop(struct load *l)
{
    atomic_store(&l->stop, true);
    for (int t = 0; t < l->nthreads; t++)
        pthread_join(l->th[t], NULL);
}

void
load_errors(struct load *l, char *out, size_t n)
{
    size_t off = 0;
    out[0] = '\0';
    for (int k = 0; k < l->ncodes; k++)
        off += (size_t)snprintf(out + off, n - off, "%s%s x%ld", k ? ", " : "", l->codes[k],
                                l->code_counts[k]);
    if (!l->ncodes)
        snprintf(out, n, "none");
}

/* Every sandbox of the load holds a value in [last acknowledged, last attempted]. */
void
load_verify(struct load *l, sbx_client *c, long long *vals)
{
    for (int i = 0; i < l->n; i++) {
        char got[64];
        get_var(c, l->ids[i], "V", got, sizeof(got));
        long long v = got[0] ? atoll(got) : 0;
        long long acked = atomic_load(&l->acked[i]), att = atomic_load(&l->attempted[i]);
        cr_expect(v >= acked && v <= att,
                  "sandbox %s reads V=%lld; last acknowledged %lld, last attempted %lld%s", l->ids[i],
                  v, acked, att, v < acked ? " (an acknowledged write was lost)" : "");
        if (vals)
            vals[i] = v;
    }
}

/* ------------------------------------------------------------------------------ */
