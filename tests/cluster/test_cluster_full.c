/*
 * test_cluster_full.c — a cluster shard whose data directory fills up
 * (issue 11, the replicate-before-commit gap; docs/cluster.md, ownership
 * rules): a write the shard answers STORAGE_FULL must never reach etcd, so
 * no node that takes the partition over shows it.
 *
 * Runs on the cluster of tests/cluster/cluster_main.c (3 nodes, lease TTL
 * 2 s).  Node 2's data directory becomes a tmpfs mounted over its usual
 * one (the test's own, unmounted at the end and by the fini after a failed
 * assertion, with node 2 killed first); node 2 then runs on its usual
 * directory again.  Sandbox IDs are unique to the run.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "../../runtime/etcd.h"
#include "../../runtime/place.h"
#include "../../runtime/util.h"
#include "cluster.h"
#include "cluster_util.h"

/* cl_pick_id, failing the test when there is no such ID. */
static uint32_t
pick_id(const struct cl_state *st, const char *kind, int a, const int *set, int n, int b,
        char *id, size_t il)
{
    int p = cl_pick_id(st, kind, a, set, n, b, id, il);
    cr_assert_geq(p, 0, "no sandbox ID on node %d that node %d would take", a, b);
    return (uint32_t)p;
}

/* Whether etcd's record at key holds the bytes s (it must exist). */
static bool
etcd_record_has(const char *key, const char *s)
{
    sbx_etcd *etcd;
    cr_assert_eq(sbx_etcd_open(&etcd, cl_env()->etcd, 5000), 0);
    struct sbx_etcd_kv *kvs = NULL;
    size_t n = 0;
    cr_assert_eq(sbx_etcd_range(etcd, key, NULL, &kvs, &n, NULL), 0);
    sbx_etcd_close(etcd);
    cr_assert_eq(n, 1, "no record at %s in etcd", key);
    bool has = memmem(kvs[0].value, kvs[0].vlen, s, strlen(s)) != NULL;
    sbx_etcd_kvs_free(kvs, n);
    return has;
}

/* ------------------------------------------------------------------------------ */
/* Node 2's data directory on a tmpfs that fills up. */

#define FULL_NODE 2
#define FULL_VARS 12        /* env.set attempts: 12 x 60 KB stays under the environment's bound */
#define FULL_VALUE 60000    /* bytes per value: every write grows the record by new pages */

static char full_mnt[320]; /* the tmpfs mounted on node y's data directory, "" when none */

/* Also after a failed assertion: node y stopped, its tmpfs unmounted (its
 * usual data directory is back for the next test's restore_base). */
static void
full_cleanup(void)
{
    if (!full_mnt[0])
        return;
    cl_signal("shard", FULL_NODE, SIGKILL);
    cl_wait_exit("shard", FULL_NODE, 30000);
    umount2(full_mnt, MNT_DETACH);
    full_mnt[0] = '\0';
}

/* Fill the file system at mnt with <mnt>/filler (it goes with the mount). */
static void
full_fill(const char *mnt)
{
    char filler[400];
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0, "%s: %s", filler, strerror(errno));
    static char block[65536];
    while (write(fd, block, sizeof(block)) > 0)
        ;
    while (write(fd, block, 512) > 0)
        ;
    close(fd);
}

/* One call through c (borrowed), 20 s: 0 with the reply's JSON result in
 * *out (caller frees; may be NULL), or -1 with the error code in code. */
static int
full_call(sbx_client *c, const char *op, const char *id, const char *args, char **out,
         char *code, size_t cl)
{
    sbx_reply *r = NULL;
    sbx_error err;
    if (sbx_call_json(c, op, id, args, 20000, &r, &err) != 0) {
        snprintf(code, cl, "%s", err.code);
        sbx_error_free(&err);
        return -1;
    }
    code[0] = '\0';
    if (out)
        *out = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return 0;
}

/* The value F<i> of this run: a unique mark, then padding. */
static char *
full_value(int i, char mark[48])
{
    snprintf(mark, 48, "fullv%02d-%d-", i, (int)getpid());
    char *v = sbx_xmalloc(FULL_VALUE + 1);
    memset(v, 'x', FULL_VALUE);
    memcpy(v, mark, strlen(mark));
    v[FULL_VALUE] = '\0';
    return v;
}

/* Issue 11, the replicate-before-commit gap: node y's data directory
 * is an 8 MiB tmpfs that the test fills; env.set of 60 KB values and
 * configures of sleepAfter go on until writes answer STORAGE_FULL, then a
 * destroy of another sandbox is tried.  etcd must hold every acknowledged
 * value and none of the refused ones; after y is killed, the node that
 * claims the partition loads the records from etcd and must show exactly
 * the acknowledged state (status's sleepAfter, the sandbox's environment;
 * the destroyed sandbox exists iff its destroy was refused).  Before the
 * kill, space is freed and a write of a third sandbox of y acknowledged:
 * replications go in order, so whatever y was to send of the refused
 * writes has reached etcd by then.  Before the fix, the replication thread
 * sent each write to etcd as soon as it was queued for LMDB, whether or
 * not its commit then failed: a write answered STORAGE_FULL was in etcd
 * and became visible after the failover ("failed_write_visible"). */
Test(cluster, a_write_whose_commit_failed_never_reaches_etcd, .timeout = 300,
     .fini = full_cleanup)
{
    restore_base();
    const int y = FULL_NODE, to = 0;
    /* y restarts on an empty tmpfs: it claims its partitions back from etcd. */
    cr_assert_eq(cl_signal("shard", y, SIGTERM), 0);
    cr_assert_eq(cl_wait_exit("shard", y, 30000), 0, "node %d did not stop", y);
    snprintf(full_mnt, sizeof(full_mnt), "%s/s%d", cl_env()->dir, y);
    cr_assert_eq(mount("tmpfs", full_mnt, "tmpfs", MS_NOSUID | MS_NODEV, "size=8m,mode=0700"), 0,
                 "mount a tmpfs on %s: %s", full_mnt, strerror(errno));
    cr_assert_gt(cl_start("shard", y), 0);
    converge(BASE, 3, 0, "node 2 re-joined on a tmpfs");

    sbx_client *c = gw_client(0);
    static struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    const int rest[2] = {0, 1};
    char id[64], code[64], key[256], mark[FULL_VARS][48];
    uint32_t part = pick_id(&st, "full", y, rest, 2, to, id, sizeof(id));
    char other[64], victim[64];
    pick_id(&st, "fullo", y, rest, 2, to, other, sizeof(other));
    uint32_t vpart = pick_id(&st, "fullv", y, rest, 2, to, victim, sizeof(victim));
    set_var(c, id, "H", "acknowledged");
    set_var(c, victim, "H", "acknowledged");
    cr_assert_eq(full_call(c, "sandbox.configure", id, "{\"sleepAfter\":600}", NULL, code,
                          sizeof(code)), 0, "configure before the disk is full: %s", code);
    long long sleep_acked = 600;

    full_fill(full_mnt);
    /* Writes until one is refused; none after it (a later acknowledged
     * write of the record would replace whatever etcd got). */
    bool acked[FULL_VARS] = {0}, cfg_refused = false;
    int tried = 0, nacked = 0;
    const char *refused_op = NULL;
    for (int i = 0; i < FULL_VARS && !refused_op; i++) {
        char *v = full_value(i, mark[i]);
        size_t alen = FULL_VALUE + 64;
        char *args = sbx_xmalloc(alen);
        snprintf(args, alen, "{\"vars\":{\"F%d\":\"%s\"}}", i, v);
        free(v);
        int rc = full_call(c, "env.set", id, args, NULL, code, sizeof(code));
        free(args);
        tried++;
        if (rc == 0) {
            acked[i] = true;
            nacked++;
        } else {
            cr_assert_str_eq(code, "STORAGE_FULL", "env.set F%d on a full disk: %s", i, code);
            refused_op = "env.set";
            break;
        }
        /* A register write through configure, read back through status. */
        char cfg[64];
        snprintf(cfg, sizeof(cfg), "{\"sleepAfter\":%d}", 1000 + i);
        if (full_call(c, "sandbox.configure", id, cfg, NULL, code, sizeof(code)) == 0) {
            sleep_acked = 1000 + i;
            nacked++;
        } else {
            cr_assert_str_eq(code, "STORAGE_FULL", "configure on a full disk: %s", code);
            refused_op = "configure";
            cfg_refused = true;
        }
    }
    cr_assert_not_null(refused_op, "no write was refused: %d env.set of %d bytes on a full 8 MiB "
                                   "tmpfs were acknowledged", FULL_VARS, FULL_VALUE);
    /* A destroy on the full disk: if its delete is refused, the sandbox
     * must still exist after the failover (etcd keeps its record). */
    int drc = full_call(c, "destroy", victim, NULL, NULL, code, sizeof(code));
    if (drc)
        cr_assert_str_eq(code, "STORAGE_FULL", "destroy on a full disk: %s", code);

    /* Room again, and a write of another sandbox of y acknowledged: y's
     * replications are in order, so whatever it was to send of the refused
     * write has reached etcd by now. */
    char filler[400];
    snprintf(filler, sizeof(filler), "%s/filler", full_mnt);
    cr_assert_eq(unlink(filler), 0, "%s: %s", filler, strerror(errno));
    set_var(c, other, "G", "after");

    /* Failover: the partition's new owner loads the record from etcd. */
    cr_assert_eq(cl_signal("shard", y, SIGKILL), 0);
    cr_assert_eq(cl_wait_exit("shard", y, 30000), 0, "node %d did not die", y);
    converge(rest, 2, 0, "node 2 killed");
    cr_assert_eq(cl_read_state(&st), 0);
    cr_assert_eq(st.owner[part], to, "partition %u went to node %d, not %d", part, st.owner[part],
                 to);
    /* etcd holds exactly the acknowledged values (y is dead: what it sent
     * is there, and a late copy fails its compare of the old epoch). */
    snprintf(key, sizeof(key), "/sbx/%s/r/%04u/%s", cl_env()->cluster, part, id);
    int in_etcd_refused = 0;
    for (int i = 0; i < tried; i++) {
        bool has = etcd_record_has(key, mark[i]);
        in_etcd_refused += !acked[i] && has;
        cr_expect(acked[i] ? has : !has, "etcd's record %s F%d, whose env.set was %s",
                  has ? "holds" : "lacks", i, acked[i] ? "acknowledged" : "refused (STORAGE_FULL)");
    }

    char vkey[256];
    snprintf(vkey, sizeof(vkey), "/sbx/%s/r/%04u/%s", cl_env()->cluster, vpart, victim);
    sbx_etcd *etcd;
    cr_assert_eq(sbx_etcd_open(&etcd, cl_env()->etcd, 5000), 0);
    struct sbx_etcd_kv *kvs = NULL;
    size_t nkv = 0;
    cr_assert_eq(sbx_etcd_range(etcd, vkey, NULL, &kvs, &nkv, NULL), 0);
    /* A destroy leaves a tombstone (an empty value): not a live record. */
    bool vlive = nkv == 1 && kvs[0].vlen > 0;
    sbx_etcd_kvs_free(kvs, nkv);
    sbx_etcd_close(etcd);
    cr_expect_eq(vlive, drc != 0, "etcd %s the record of %s, whose destroy was %s",
                 vlive ? "holds" : "lacks", victim,
                 drc ? "refused (STORAGE_FULL)" : "acknowledged");
    char *js = NULL;
    double until = cl_now_ms() + 60000;
    while (full_call(c, "status", id, NULL, &js, code, sizeof(code)) != 0) {
        cr_assert(cl_now_ms() < until, "status of %s after the failover: %s", id, code);
        cl_sleep_ms(200);
    }
    json_error_t je;
    json_t *j = js ? json_loads(js, 0, &je) : NULL;
    free(js);
    cr_assert_not_null(j, "status's result is not JSON");
    long long sleep_ms = (long long)json_integer_value(
        json_object_get(json_object_get(j, "sandbox"), "sleepAfter"));
    json_decref(j);
    int env_refused = 0;
    for (int i = 0; i < tried; i++) {
        char got[80], k[16];
        snprintf(k, sizeof(k), "F%d", i);
        get_var(c, id, k, got, sizeof(got));
        bool has = !strncmp(got, mark[i], strlen(mark[i]));
        env_refused += !acked[i] && has;
        cr_expect(acked[i] ? has : got[0] == '\0', "after the failover, F%d='%.40s' (its env.set "
                  "was %s)", i, got, acked[i] ? "acknowledged" : "refused (STORAGE_FULL)");
    }
    cr_log_info("full: %d write(s) acknowledged on the full disk, then %s refused; etcd held %d "
                "refused value(s); after the failover to node %d: sleepAfter %lld ms "
                "(acknowledged %lld s%s), %d refused variable(s) in the sandbox",
                nacked, refused_op, in_etcd_refused, to, sleep_ms,
                sleep_acked, cfg_refused ? ", a later one refused" : "", env_refused);
    cr_expect_eq(sleep_ms, sleep_acked * 1000,
                 "status's sleepAfter after the failover is not the last acknowledged value");
    /* The destroyed sandbox: gone iff its destroy was acknowledged. */
    int vrc;
    until = cl_now_ms() + 60000;
    while ((vrc = full_call(c, "status", victim, NULL, NULL, code, sizeof(code))) != 0 &&
           strcmp(code, "SANDBOX_NOT_FOUND")) {
        cr_assert(cl_now_ms() < until, "status of %s after the failover: %s", victim, code);
        cl_sleep_ms(200);
    }
    cr_log_info("full: destroy on the full disk %s; after the failover, status of it: %s",
                drc ? "refused" : "acknowledged", vrc ? code : "ok");
    cr_expect_eq(vrc == 0, drc != 0, "after the failover the sandbox whose destroy was %s %s",
                 drc ? "refused" : "acknowledged", vrc ? "is gone" : "exists");

    sbx_destroy(c, id, NULL, NULL);
    sbx_destroy(c, other, NULL, NULL);
    sbx_destroy(c, victim, NULL, NULL);
    sbx_client_close(c);
    umount2(full_mnt, MNT_DETACH);
    full_mnt[0] = '\0';
    cr_assert_gt(cl_start("shard", y), 0);
    converge(BASE, 3, 0, "node 2 back on its data directory");
}
