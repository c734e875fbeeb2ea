/*
 * test_cluster_ws.c — persistent workspaces that follow their sandbox
 * across the cluster (issue 15; docs/persistence.md, "Across the
 * cluster"): a drain moves the workspace image to the partition's new owner
 * (workspace.put, shard to shard) before that owner serves the sandbox; a
 * move cut short by the loss of its source never gives the sandbox an
 * empty workspace; a move the new owner cannot take leaves the partition
 * (and the files) where they were, and a later try completes it; a fork
 * into sandboxes of other nodes gives each the source's files.
 *
 * Each node of the cluster of tests/cluster/cluster_main.c keeps its
 * workspaces under <cluster dir>/s<i>/workspaces/<id>/ (container/workspace.h).
 * Sandbox IDs are unique to the run; the tests leave the cluster converged
 * on nodes 0-2 and destroy their sandboxes.
 */
#include <criterion/criterion.h>
#include <errno.h>
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

/*
 * A fork into sandboxes owned by other nodes (docs/persistence.md, "Fork"):
 * the source's shard sends each copy to its owner's node (workspace.put
 * kind "fork": data extents checked by sha256, the record with the commit),
 * which adopts it.  Each fork has the source's files byte for byte, its
 * image on its owner's disk; a write on any side is on that side only; the
 * source's node keeps no staged copy.  Before, such a fork was refused
 * (FORK_CROSS_SHARD).
 */
Test(cws, fork_into_other_nodes_copies_the_workspace, .timeout = 300)
{
    char src[64], fk[2][64], before[512], out[512], p[600];
    sbx_client *c = gw_client(0);
    id_on("fksrc", 0, src);
    id_on("fkone", 1, fk[0]);
    id_on("fktwo", 2, fk[1]);
    create_persistent(c, src);
    exec_out(c, src,
             "cd /workspace && head -c 5000000 /dev/urandom > big && mkdir d && "
             "echo tree > d/f && sync && echo ok",
             out, sizeof(out));
    cr_assert(strstr(out, "ok"), "writing the files: %s", out);
    const char *sums = "cd /workspace && sha256sum big d/f | sha256sum";
    exec_out(c, src, sums, before, sizeof(before));

    char args[256];
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\",\"%s\"]}", fk[0], fk[1]);
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call_json(c, "sandbox.fork", src, args, 120000, &r, &err);
    cr_assert_eq(rc, 0, "sandbox.fork into nodes 1 and 2: %s %s", rc ? err.code : "",
                 rc ? err.message : "");
    sbx_reply_free(r);
    for (int i = 0; i < 2; i++) {
        out[0] = '\0';
        exec_out(c, fk[i], sums, out, sizeof(out));
        cr_assert_str_eq(out, before, "fork %s has other files than its source", fk[i]);
        ws_path(i + 1, fk[i], "disk.img", p, sizeof(p));
        cr_assert(exists(p), "node %d has no image %s for its fork", i + 1, p);
        snprintf(p, sizeof(p), "%s/s0/backups/forks/%s", cl_env()->dir, fk[i]);
        cr_assert(!exists(p), "the source's node kept the staged copy %s", p);
    }
    /* Independent afterwards. */
    exec_out(c, fk[0], "echo one > /workspace/only && echo ok", out, sizeof(out));
    exec_out(c, src, "echo src > /workspace/mine && echo ok", out, sizeof(out));
    exec_out(c, src, "ls /workspace", out, sizeof(out));
    cr_assert_null(strstr(out, "only"), "the fork's write is in the source: %s", out);
    exec_out(c, fk[1], "ls /workspace", out, sizeof(out));
    cr_assert_null(strstr(out, "only"), "one fork's write is in the other: %s", out);
    cr_assert_null(strstr(out, "mine"), "the source's write is in a fork: %s", out);
    char ids[3][64];
    memcpy(ids[0], src, 64);
    memcpy(ids[1], fk[0], 64);
    memcpy(ids[2], fk[1], 64);
    destroy_all(c, ids, 3);
    sbx_client_close(c);
}

/* A fork whose copy the other node cannot take (a file where its staging
 * directory goes) fails as a whole: the fork on the source's node is not
 * made either and nothing is left staged; with the obstacle gone the same
 * fork succeeds. */
Test(cws, a_fork_another_node_cannot_take_leaves_nothing, .timeout = 300)
{
    char src[64], loc[64], rem[64], out[512], p[600], top[600];
    sbx_client *c = gw_client(0);
    id_on("fxsrc", 0, src);
    id_on("fxloc", 0, loc);
    id_on("fxrem", 1, rem);
    create_persistent(c, src);
    exec_out(c, src, "echo data > /workspace/f && sync && echo ok", out, sizeof(out));
    snprintf(top, sizeof(top), "%s/s1/backups/forks", cl_env()->dir);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "mkdir -p '%s'", top);
    cr_assert_eq(system(cmd), 0);
    snprintf(p, sizeof(p), "%s/%s", top, rem);
    int fd = open(p, O_WRONLY | O_CREAT | O_EXCL, 0600);
    cr_assert_geq(fd, 0, "the obstacle %s", p);
    close(fd);

    char args[256];
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\",\"%s\"]}", loc, rem);
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call_json(c, "sandbox.fork", src, args, 120000, &r, &err);
    cr_assert_neq(rc, 0, "the fork succeeded with node 1's staging blocked");
    cr_log_info("refused: %s %s", err.code, err.message);
    sbx_error_free(&err);
    for (int i = 0; i < 2; i++) {
        const char *id = i ? rem : loc;
        rc = sbx_call_json(c, "status", id, "{}", 30000, &r, &err);
        cr_assert_neq(rc, 0, "fork %s exists after the failed fork", id);
        cr_assert_str_eq(err.code, "SANDBOX_NOT_FOUND", "%s: %s %s", id, err.code, err.message);
        sbx_error_free(&err);
    }
    ws_path(0, loc, "disk.img", p, sizeof(p));
    cr_assert(!exists(p), "the failed fork left %s", p);
    snprintf(p, sizeof(p), "%s/s0/backups/forks/%s", cl_env()->dir, rem);
    cr_assert(!exists(p), "the failed fork left the staged copy %s", p);

    /* (The failed transfer's abort may have removed it already.) */
    snprintf(p, sizeof(p), "%s/%s", top, rem);
    cr_assert(unlink(p) == 0 || errno == ENOENT, "unlink %s: %s", p, strerror(errno));
    rc = sbx_call_json(c, "sandbox.fork", src, args, 120000, &r, &err);
    cr_assert_eq(rc, 0, "the fork once node 1 can take it: %s %s", rc ? err.code : "",
                 rc ? err.message : "");
    sbx_reply_free(r);
    exec_out(c, rem, "cat /workspace/f", out, sizeof(out));
    cr_assert_str_eq(out, "data\n");
    char ids[3][64];
    memcpy(ids[0], src, 64);
    memcpy(ids[1], loc, 64);
    memcpy(ids[2], rem, 64);
    destroy_all(c, ids, 3);
    sbx_client_close(c);
}
