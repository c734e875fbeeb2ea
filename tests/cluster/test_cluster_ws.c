/*
 * test_cluster_ws.c — persistent workspaces that follow their sandbox
 * across the cluster (issue 15; docs/persistence.md, "Across the
 * cluster"): a drain moves the workspace image to the partition's new owner
 * (workspace.put, shard to shard) before that owner serves the sandbox; a
 * move cut short by the loss of its source never gives the sandbox an
 * empty workspace; a move the new owner cannot take leaves the partition
 * (and the files) where they were, and a later try completes it.
 *
 * Each node of the cluster of tests/cluster/cluster_main.c keeps its
 * workspaces under <cluster dir>/s<i>/workspaces/<id>/ (container/workspace.h).
 * Sandbox IDs are unique to the run; the tests leave the cluster converged
 * on nodes 0-2 and destroy their sandboxes.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cluster.h"
#include "cluster_util.h"
#include "ws_common.h"

/* No snapshots here (test_cluster_ws_snap.c has them): a move cut short
 * must find no copy on the new owner. */
const char *const cl_shard_extra[] = {"--snapshot-interval", "0", NULL};

TestSuite(cws, .init = restore_base);

/* Files written before a drain are on the new owner after it, byte for
 * byte (sha256 of random data, a directory tree); the old owner keeps no
 * copy. */
Test(cws, drain_moves_the_workspace, .timeout = 300)
{
    char id[64], before[512], after[512], p[600];
    int a = 1;
    sbx_client *c = gw_client(0);
    id_on("wsdrain", a, id);
    create_persistent(c, id);
    const char *sums = "cd /workspace && sha256sum big d/*/f | sha256sum && ls -R d | wc -l";
    exec_out(c, id,
             "mkdir -p /workspace/d && cd /workspace && "
             "head -c 20000000 /dev/urandom > big && "
             "for i in 1 2 3 4 5 6 7 8; do mkdir d/$i && head -c $((i * 1000)) /dev/urandom > d/$i/f; "
             "done && sync && echo ok",
             before, sizeof(before));
    cr_assert(strstr(before, "ok"), "writing the files: %s", before);
    exec_out(c, id, sums, before, sizeof(before));
    int succ = successor(id, a);
    ws_path(a, id, "disk.img", p, sizeof(p));
    cr_assert(exists(p), "node %d has no workspace image %s before the drain", a, p);
    drain(c, a, true);
    struct cl_state st;
    wait_drained(a, &st);
    int owner = owner_of(&st, id);
    cr_assert_eq(owner, succ, "the partition went to node %d, not %d", owner, succ);
    /* The image is on the new owner before it serves the sandbox. */
    ws_path(owner, id, "disk.img", p, sizeof(p));
    cr_assert(exists(p), "node %d has no workspace image %s after the drain", owner, p);
    ws_path(a, id, "disk.img", p, sizeof(p));
    cr_assert(!exists(p), "the drained node %d still has %s", a, p);
    after[0] = '\0';
    exec_out(c, id, sums, after, sizeof(after));
    cr_assert_str_eq(after, before, "the files differ after the drain");
    /* And it keeps working there: a write after the move. */
    exec_out(c, id, "echo later > /workspace/later && cat /workspace/later", after,
             sizeof(after));
    cr_assert_str_eq(after, "later\n");
    sbx_destroy(c, id, NULL, NULL);
    ws_path(owner, id, "disk.img", p, sizeof(p));
    cr_assert(!exists(p), "destroy left %s", p);
    drain(c, a, false);
    sbx_client_close(c);
    restore_base();
}

/* The source of a move dies in the middle of it (SIGKILL as the new
 * owner's partial image appears): the partition fails over to that node,
 * which must not serve the sandbox with an empty workspace — it answers an
 * error naming the lost workspace (or, if the kill came after the commit,
 * the whole files); when the dead node comes back and gets its partition
 * back, the files are there again. */
Test(cws, source_killed_mid_move_never_gives_an_empty_workspace, .timeout = 300)
{
    char id[64], before[512], after[512], p[600];
    int a = 2;
    sbx_client *c = gw_client(0);
    id_on("wskill", a, id);
    create_persistent(c, id);
    /* Big enough for the move to take a while (random: nothing to skip). */
    exec_out(c, id, "head -c 100000000 /dev/urandom > /workspace/big && sync && "
                    "sha256sum /workspace/big",
             before, sizeof(before));
    cr_assert(strlen(before) > 64, "writing the file: %s", before);
    int succ = successor(id, a);
    char partial[600];
    ws_path(succ, id, "disk.img.in", partial, sizeof(partial));
    drain(c, a, true);
    double until = cl_now_ms() + 60000;
    while (!exists(partial)) {
        cr_assert_lt(cl_now_ms(), until, "node %d never began to receive the workspace", succ);
        usleep(1000);
    }
    cr_assert_eq(cl_signal("shard", a, SIGKILL), 0);
    cr_assert_eq(cl_wait_exit("shard", a, 30000), 0);
    int idx[2], k = 0;
    for (int i = 0; i < 3; i++)
        if (i != a)
            idx[k++] = i;
    converge(idx, 2, 0, "after the kill");
    ws_path(succ, id, "disk.img", p, sizeof(p));
    bool complete = exists(p);
    sbx_exec_opts o = {.command = "sha256sum /workspace/big", .timeout_ms = 20000};
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(c, id, &o, &r, &err);
    if (complete) {
        /* The kill came after the commit: the whole image is there. */
        cr_assert_eq(rc, 0, "%s %s", rc ? err.code : "", rc ? err.message : "");
        cr_assert_eq(r.exit_code, 0, "the file is missing after a completed move: %.*s",
                     (int)r.stderr_len, r.stderr_data);
        cr_assert(!strncmp(r.stdout_data, before, 64), "%s vs %s", r.stdout_data, before);
        fprintf(stderr, "cws: the kill came after the move's commit\n");
    } else {
        cr_assert_neq(rc, 0, "the sandbox ran with a workspace that never arrived: exit %d %.*s",
                      r.exit_code, (int)r.stdout_len, r.stdout_data ? r.stdout_data : "");
        cr_assert(strstr(err.message, "workspace is not on this node"), "%s %s", err.code,
                  err.message);
        sbx_error_free(&err);
    }
    sbx_exec_result_free(&r);
    /* Node a comes back and takes its partition back (rendezvous): its
     * workspace never left it. */
    restore_base();
    if (!complete) {
        after[0] = '\0';
        exec_out(c, id, "sha256sum /workspace/big", after, sizeof(after));
        cr_assert_str_eq(after, before, "the files differ once node %d is back", a);
    }
    sbx_destroy(c, id, NULL, NULL);
    sbx_client_close(c);
}

/* The new owner cannot store the workspace (a file where its directory
 * goes): the handoff fails, the partition stays on the draining node,
 * which serves the sandbox with its files; once the obstacle is gone the
 * drain's next try moves it. */
Test(cws, failed_move_keeps_the_partition_until_a_retry_succeeds, .timeout = 300)
{
    char id[64], before[512], after[512], p[600], top[600];
    int a = 0;
    sbx_client *c = gw_client(0);
    id_on("wsblock", a, id);
    create_persistent(c, id);
    const char *sum = "cd /workspace && sha256sum f";
    exec_out(c, id, "head -c 2000000 /dev/urandom > /workspace/f && sync && echo ok", before,
             sizeof(before));
    exec_out(c, id, sum, before, sizeof(before));
    int succ = successor(id, a);
    snprintf(top, sizeof(top), "%s/s%d/workspaces", cl_env()->dir, succ);
    mkdir(top, 0700);
    snprintf(p, sizeof(p), "%s/%s", top, id);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0, "the obstacle %s", p);
    close(fd);
    drain(c, a, true);
    /* A few handoff attempts' worth of time: none can complete. */
    cl_sleep_ms(6000);
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    cr_assert_eq(owner_of(&st, id), a, "the partition left node %d without its workspace", a);
    after[0] = '\0';
    exec_out(c, id, sum, after, sizeof(after));
    cr_assert_str_eq(after, before, "node %d serves the sandbox with other files", a);
    cr_assert_eq(unlink(p), 0);
    wait_drained(a, &st);
    cr_assert_eq(owner_of(&st, id), succ);
    after[0] = '\0';
    exec_out(c, id, sum, after, sizeof(after));
    cr_assert_str_eq(after, before, "the files differ after the retried move");
    sbx_destroy(c, id, NULL, NULL);
    drain(c, a, false);
    sbx_client_close(c);
    restore_base();
}
