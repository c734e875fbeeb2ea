/*
 * test_tombstone.c — an acknowledged destroy is never undone by a handoff
 * (issue 11 item 3).  Destroys run while a node joins and leaves again, on
 * sandboxes whose partitions move: a destroy whose delete was still
 * uncommitted when the handoff copied the partition's records used to hand
 * the old record (its env) to the new owner, where the sandbox was back.
 *
 * Clients loop over fresh sandboxes of the moving partitions: env.set
 * MARK=old (the record), an exec (a running container, so the destroy has to
 * stop it first), destroy.  After the membership changes, every sandbox whose
 * destroy was acknowledged (and that nothing touched after it) must not
 * exist: `status` answers SANDBOX_NOT_FOUND.  The race is a timing one, so
 * the test repeats the join and the drain a few times under the load.
 *
 * Runs on the cluster of tests/cluster/cluster_main.c (3 nodes, node 3 free
 * to join); leaves it as it found it (node 3 stopped, converged).  Sandbox
 * IDs are unique to the run.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "cluster.h"

#define CONVERGE_MS 90000
#define MAXSB 4096
#define NLOOP 4

static const int BASE[3] = {0, 1, 2};
static const int FOUR[4] = {0, 1, 2, 3};

static void
converge(const int *set, int n, const char *what)
{
    char why[512] = "";
    if (cl_wait_converged(set, n, cl_env()->gw[0], CONVERGE_MS, why, sizeof(why)) < 0) {
        cl_print_log_tails(25);
        cr_assert_fail("%s: %s", what, why);
    }
}

static sbx_client *
gw_client(void)
{
    sbx_client *c = NULL;
    char why[512];
    if (cl_gw_client(0, &c, why, sizeof(why)) != 0)
        cr_assert_fail("%s", why);
    return c;
}

static void
drain(sbx_client *c, int i, bool on)
{
    char why[512];
    cr_assert_eq(cl_drain(c, i, on, why, sizeof(why)), 0, "%s", why);
}

/* What the loops did to each sandbox. */
struct load {
    atomic_int next;       /* next index into ids */
    atomic_bool stop;
    int n;
    char (*ids)[64];
    atomic_int acked[MAXSB]; /* 1: its destroy was acknowledged */
    atomic_int destroys, errors;
};

static int
call(sbx_client *c, const char *op, const char *id, const char *json)
{
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call_json(c, op, id, json, 20000, &r, &err);
    sbx_reply_free(r);
    sbx_error_free(&err);
    return rc;
}

static void *
loop_main(void *arg)
{
    struct load *L = arg;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, cl_env()->gw[0], &err) != 0)
        return NULL;
    while (!atomic_load(&L->stop)) {
        int k = atomic_fetch_add(&L->next, 1);
        if (k >= L->n)
            break;
        const char *id = L->ids[k];
        if (call(c, "env.set", id, "{\"vars\":{\"MARK\":\"old\"}}") != 0 ||
            call(c, "exec", id, "{\"command\":\"true\"}") != 0) {
            atomic_fetch_add(&L->errors, 1);
            continue;
        }
        if (call(c, "destroy", id, NULL) == 0) {
            atomic_store(&L->acked[k], 1);
            atomic_fetch_add(&L->destroys, 1);
        } else {
            atomic_fetch_add(&L->errors, 1);
        }
    }
    sbx_client_close(c);
    return NULL;
}

Test(tombstone, destroy_during_handoff_never_resurrects_the_sandbox, .timeout = 600)
{
    converge(BASE, 3, "initial convergence");
    /* Sandboxes whose partitions move when node 3 joins (and back when it
     * leaves). */
    static int16_t table4[SBX_PARTITIONS];
    cl_place_table(FOUR, 4, table4);
    static char ids[MAXSB][64];
    static struct load L;
    int n = 0;
    for (int k = 0; n < MAXSB; k++) {
        char id[64];
        snprintf(id, sizeof(id), "ts%s-%d-%d", cl_env()->prefix + 1, (int)getpid() % 100000, k);
        if (table4[sbx_place_partition(id, strlen(id))] == 3)
            snprintf(ids[n++], sizeof(ids[0]), "%s", id);
    }
    L.ids = ids;
    L.n = n;
    pthread_t th[NLOOP];
    for (int t = 0; t < NLOOP; t++)
        pthread_create(&th[t], NULL, loop_main, &L);

    sbx_client *c = gw_client();
    enum { ROUNDS = 4 };
    for (int round = 0; round < ROUNDS; round++) {
        cl_sleep_ms(500);
        cr_assert_gt(cl_start("shard", 3), 0, "cannot start node 3");
        converge(FOUR, 4, "node 3 joined");
        cl_sleep_ms(500);
        drain(c, 3, true);
        converge(BASE, 3, "node 3 drained");
        cl_signal("shard", 3, SIGTERM);
        cr_assert_eq(cl_wait_exit("shard", 3, 30000), 0, "node 3 did not stop");
        drain(c, 3, false);
        converge(BASE, 3, "node 3 stopped");
    }
    atomic_store(&L.stop, true);
    for (int t = 0; t < NLOOP; t++)
        pthread_join(th[t], NULL);

    /* Every acknowledged destroy holds: the sandbox, its env with it, is gone. */
    int checked = 0, back = 0;
    char first[64] = "";
    for (int k = 0; k < L.n && k < atomic_load(&L.next); k++) {
        if (!atomic_load(&L.acked[k]))
            continue;
        sbx_reply *r = NULL;
        sbx_error err;
        int rc = sbx_call_json(c, "status", ids[k], NULL, 20000, &r, &err);
        checked++;
        if (rc == 0 || strcmp(err.code, "SANDBOX_NOT_FOUND") != 0) {
            if (rc == 0 && !first[0])
                snprintf(first, sizeof(first), "%s", ids[k]);
            back += rc == 0;
            cr_expect(rc == 0 || strcmp(err.code, "SANDBOX_NOT_FOUND") == 0,
                      "status of destroyed %s: %s %s", ids[k], err.code, err.message);
        }
        sbx_reply_free(r);
        sbx_error_free(&err);
    }
    cr_log_info("%d rounds: %d destroys acknowledged (%d checked), %d other failures, %d "
                "sandboxes back after their destroy",
                ROUNDS, atomic_load(&L.destroys), checked, atomic_load(&L.errors), back);
    cr_expect_gt(checked, 20, "too few destroys acknowledged (%d) to mean anything", checked);
    cr_expect_eq(back, 0, "%d acknowledged destroys were undone by a handoff (first: %s)", back,
                 first);
    sbx_client_close(c);
}
