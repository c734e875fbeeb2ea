/*
 * test_faults_outages.c — fault injection: what a client sees while a part
 * fails, and what survives.  test_faults.c has (a), the shards SIGKILLed
 * under a stream of writes; faults_util.h what both share.
 *
 *  (b) the agent (PID 1 of a sandbox) is killed: the operation in flight
 *      fails with CONTAINER_UNAVAILABLE at once, the next one runs in a
 *      fresh container and says so (containerRestarted), the one after is
 *      ordinary;
 *  (c) the gateway is killed and restarted while a client retries one
 *      request id: the command (an append to a file) runs exactly once;
 *  (d) the daemon's data directory (a small tmpfs) fills up: writes fail
 *      with STORAGE_FULL, the shard keeps running, writes succeed again
 *      once space is freed, and everything acknowledged is there after a
 *      restart, with a store mdb_stat opens (with a running container:
 *      test_storage.c).
 *  (e) hostile agent frames (an env name with a NUL, environments that
 *      would stop every command) are refused, not fatal.
 *
 * Every process here is one this test started (a child, or a child of the
 * daemon it started, checked through /proc before it is signalled); mounts
 * and directories are removed at the end of each test.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"
#include "faults_util.h"

/* ---------------------------------------------------------------------------------- */
/* (b) The agent dies. */

struct bg_exec {
    pthread_t th;
    const char *id;
    const char *cmd;
    tcall t;
    double ms;
};

static void *
bg_exec_main(void *arg)
{
    struct bg_exec *b = arg;
    sbx_client *c = test_client();
    double t0 = test_now_ms();
    b->t = tc_call(c, "exec", b->id, json_pack("{s:s}", "command", b->cmd), 60000);
    b->ms = test_now_ms() - t0;
    sbx_client_close(c);
    return NULL;
}

/* The host pid of the sandbox's agent, checked to belong to our daemon. */
static pid_t
agent_pid(sbx_client *c, const char *id)
{
    json_t *sb = ts_status(c, id);
    pid_t pid = (pid_t)jint(sb, "container.pid");
    json_decref(sb);
    cr_assert(pid > 1, "no container pid in status");
    const char *dir = getenv("SBX_TEST_DIR");
    cr_assert(dir && *dir, "SBX_TEST_DIR is not set");
    bool ours = false;
    for (pid_t p = test_ppid(pid), k = 0; p > 1 && k < 4; p = test_ppid(p), k++) {
        char cl[1024];
        cmdline_of(p, cl, sizeof(cl));
        if (strstr(cl, dir))
            ours = true;
    }
    cr_assert(ours, "pid %d does not descend from the test's daemon", (int)pid);
    return pid;
}

Test(faults, killed_agent_fails_the_running_op_and_a_fresh_container_serves_the_next)
{
    sbx_client *c = test_client();
    char *id = test_id("fagent");
    char *out = tsh_out(c, id, "echo before > /workspace/mark; echo ok");
    cr_assert_str_eq(out, "ok\n");
    free(out);
    json_t *sb = ts_status(c, id);
    long long restarts0 = jint(sb, "restarts");
    json_decref(sb);
    pid_t pid = agent_pid(c, id);

    /* An operation in flight when the agent dies fails now, not after its 30 s. */
    struct bg_exec b = {.id = id, .cmd = "sleep 30; echo late"};
    pthread_create(&b.th, NULL, bg_exec_main, &b);
    tsleep_ms(500);
    cr_assert_eq(kill(pid, SIGKILL), 0, "kill agent %d", (int)pid);
    pthread_join(b.th, NULL);
    tc_fails_with(b.t, "exec during the kill", "CONTAINER_UNAVAILABLE");
    cr_expect_lt(b.ms, 15000, "the failing exec took %.0f ms", b.ms);
    tc_free(&b.t);

    /* The next operation runs in a fresh container and says so. */
    tcall t = tc_call(c, "exec", id,
                      json_pack("{s:s}", "command", "cat /workspace/mark 2>&1; echo ok"), 0);
    tc_ok(t, "exec after the kill");
    cr_expect_eq(jbool(t.res, "containerRestarted"), 1, "containerRestarted missing");
    sbx_str so = tc_bin(&t, "stdout");
    cr_expect(so.n >= 3 && memmem(so.p, so.n, "ok\n", 3) && !memmem(so.p, so.n, "before", 6),
              "the new container still has the old one's file: %.*s", (int)so.n, so.p);
    tc_free(&t);
    sb = ts_status(c, id);
    cr_expect_gt(jint(sb, "restarts"), restarts0, "restarts did not grow");
    cr_expect_neq(jint(sb, "container.pid"), pid, "same agent pid after the restart");
    cr_expect(strlen(jstr(sb, "lastExit")) > 0, "no lastExit");
    json_decref(sb);

    /* And the one after that is ordinary. */
    t = tc_call(c, "exec", id, json_pack("{s:s}", "command", "echo again"), 0);
    tc_ok(t, "second exec after the kill");
    cr_expect_neq(jbool(t.res, "containerRestarted"), 1, "containerRestarted repeated");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* A session env name with a NUL in it used to make the agent read past a
 * heap block (agent_env_merge; tests/fuzz/fuzz_agent.c found it): the ASan
 * agent aborted, the container died.  Now the name is ignored. */
Test(faults, session_env_name_with_nul_does_not_kill_the_agent)
{
    sbx_client *c = test_client();
    char *id = test_id("fenv");
    char *out = tsh_out(c, id, "echo ok");
    free(out);
    pid_t pid = agent_pid(c, id);
    /* {"id": "s1", "env": {"HOME=/root\0X": "v"}}: the name matches the
     * base entry HOME=/root up to the NUL and is one byte longer. */
    sbx_enc e;
    char *args;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "id", "s1");
    sbx_enc_kmap(&e, "env");
    sbx_enc_strn(&e, "HOME=/root\0X", 12);
    sbx_enc_str(&e, "v");
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &args, &len), 0);
    sbx_reply *r = NULL;
    sbx_error err;
    sbx_call(c, "session.create", id, args, len, 20000, NULL, &r, &err);
    sbx_reply_free(r);
    sbx_error_free(&err);
    free(args);
    sbx_exec_opts o = {.command = "echo $HOME", .session_id = "s1"};
    sbx_exec_result res = tsh_opts(c, id, &o);
    cr_expect_str_eq(res.stdout_data, "/root\n");
    sbx_exec_result_free(&res);
    cr_expect_eq(agent_pid(c, id), pid, "the agent was replaced");
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* (c) Gateway restart during retries of one request id. */

struct gw_call {
    pthread_t th;
    const char *url, *id, *rid;
    char *args;
    size_t args_len;
    int rc;
    char code[48];
};

static int
exec_with_id(sbx_client *c, const char *id, const char *rid, const char *args, size_t len,
             char code[48])
{
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call(c, "exec", id, args, len, 8000, rid, &r, &err);
    snprintf(code, 48, "%s", rc ? err.code : "");
    sbx_error_free(&err);
    sbx_reply_free(r);
    return rc;
}

static void *
gw_call_main(void *arg)
{
    struct gw_call *g = arg;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, g->url, &err) != 0) {
        g->rc = -1;
        snprintf(g->code, sizeof(g->code), "%s", err.code);
        return NULL;
    }
    g->rc = exec_with_id(c, g->id, g->rid, g->args, g->args_len, g->code);
    sbx_client_close(c);
    return NULL;
}

Test(faults, gateway_restart_with_retried_request_id_applies_once, .timeout = 180,
     .fini = cleanup)
{
    static struct cluster cl;
    cluster_start(&cl, 1);
    sbx_client *c = tc_client(cl.gw.url, 20000);
    const char *id = "fgw";
    char *out = tsh_out(c, id, ": > /workspace/log; echo ok");
    cr_assert_str_eq(out, "ok\n");
    free(out);
    /* The gateway dies before, while and after the shard runs the command. */
    static const int delays_ms[] = {0, 5, 50, 200, 450, 700, 1200};
    int n = (int)SBX_ARRAY_LEN(delays_ms);
    for (int i = 0; i < n; i++) {
        char cmd[128], rid[64];
        snprintf(cmd, sizeof(cmd), "sleep 0.4; echo run%d >> /workspace/log; echo done%d", i, i);
        snprintf(rid, sizeof(rid), "fgw-%d-%d", (int)getpid(), i);
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "command", cmd);
        sbx_enc_end(&e);
        struct gw_call g = {.url = cl.gw.url, .id = id, .rid = rid};
        cr_assert_eq(sbx_enc_finish(&e, &g.args, &g.args_len), 0);
        pthread_create(&g.th, NULL, gw_call_main, &g);
        tsleep_ms(delays_ms[i]);
        kill(cl.gw.pid, SIGKILL);
        reap(cl.gw.pid, 10000);
        gw_spawn(&cl);
        cluster_ready(&cl);
        pthread_join(g.th, NULL);
        cr_assert(g.rc == 0 || outage_error(g.code), "attempt %d: %s", i, g.code);
        /* Retry with the same id until it succeeds, then once more. */
        int ok = g.rc == 0, extra = 0;
        double until = test_now_ms() + 30000;
        while (extra < 2 && test_now_ms() < until) {
            char code[48];
            int rc = exec_with_id(c, id, rid, g.args, g.args_len, code);
            cr_assert(rc == 0 || outage_error(code), "retry %d: %s", i, code);
            if (rc == 0 || ok)
                extra++;
            ok |= rc == 0;
            if (rc)
                tsleep_ms(50);
        }
        cr_assert(ok, "attempt %d never succeeded", i);
        free(g.args);
    }
    out = tsh_out(c, id,
                  "sort /workspace/log | uniq -c | awk '{print $1}' | sort -u | tr '\\n' ' '; "
                  "wc -l < /workspace/log");
    char want[32];
    snprintf(want, sizeof(want), "1 %d\n", n);
    cr_expect_str_eq(out, want, "each command must run exactly once (counts, then lines)");
    free(out);
    sbx_client_close(c);
    cluster_stop(&cl, true);
}

/* A client that keeps retrying a long command (its own deadline shorter
 * than the command) piles up attempts with one id at the shard: each one
 * must wait for the first run's reply, however many there are. */
Test(faults, many_concurrent_retries_of_one_request_id_run_it_once)
{
    sbx_client *c = test_client();
    char *id = test_id("fdup");
    char *out = tsh_out(c, id, ": > /workspace/dup; echo ok");
    free(out);
    char rid[64];
    snprintf(rid, sizeof(rid), "fdup-%d", (int)getpid());
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "command", "echo run >> /workspace/dup; sleep 2; echo done");
    sbx_enc_end(&e);
    enum { N = 8 };
    struct gw_call g[N];
    char *args;
    size_t len;
    cr_assert_eq(sbx_enc_finish(&e, &args, &len), 0);
    for (int i = 0; i < N; i++) {
        g[i] = (struct gw_call){.url = test_url(), .id = id, .rid = rid, .args = args,
                                .args_len = len};
        pthread_create(&g[i].th, NULL, gw_call_main, &g[i]);
        tsleep_ms(20);
    }
    int ok = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(g[i].th, NULL);
        ok += g[i].rc == 0;
    }
    free(args);
    out = tsh_out(c, id, "wc -l < /workspace/dup");
    cr_expect_str_eq(out, "1\n", "the command ran more than once for one request id");
    cr_expect_gt(ok, 0, "no attempt succeeded");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

/* Each env.set is valid on its own, but together they could make an
 * environment so large that execve fails (E2BIG) for every command of the
 * sandbox, and the record would keep it across restarts.  The total is
 * bounded: the env.set that would cross the bound is refused. */
Test(faults, env_that_would_stop_every_command_is_refused)
{
    sbx_client *c = test_client();
    char *id = test_id("fenvbig");
    size_t vlen = 120000;
    char *v = sbx_xmalloc(vlen + 1);
    memset(v, 'v', vlen);
    v[vlen] = '\0';
    int refused = -1;
    for (int i = 0; i < 20 && refused < 0; i++) {
        char k[16];
        snprintf(k, sizeof(k), "BIG%d", i);
        tcall t = tc_call(c, "env.set", id, json_pack("{s:{s:s}}", "vars", k, v), 0);
        if (t.rc != 0) {
            tc_fails_with(t, "env.set beyond the bound", "VALIDATION_FAILED");
            refused = i;
        }
        tc_free(&t);
    }
    free(v);
    cr_assert(refused > 0, "no env.set was refused (20 x 120 KB)");
    /* Commands still start, with every accepted variable and not the refused one. */
    char cmd[96];
    snprintf(cmd, sizeof(cmd), "env | grep -c '^BIG'; printenv BIG%d | wc -c", refused);
    char *out = tsh_out(c, id, cmd);
    char want[32];
    snprintf(want, sizeof(want), "%d\n0\n", refused);
    cr_expect_str_eq(out, want, "accepted variables, then the length of the refused one");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* (d) The data directory fills up. */

Test(faults, full_data_directory_gives_storage_full_and_recovers, .timeout = 150,
     .fini = cleanup)
{
    char mnt[64];
    cr_assert_eq(test_tmpfs_mount(mnt, sizeof(mnt), "full", "8m"), 0, "mount tmpfs: %s",
                 strerror(errno));
    snprintf(live_mount, sizeof(live_mount), "%s", mnt);
    static struct testd d;
    const char *const extra[] = {"--data", mnt, "--pool", "0", "--memory", "256M", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start on the tmpfs");
    live_testd = &d;
    sbx_client *c = tc_client(d.url, 30000);
    const char *id = "ffull";
    char code[48], key[32];
    cr_assert_eq(tc_env_fill(c, id, "BEFORE", 10, code), 0, "env.set before: %s", code);
    long long pid = tc_shard_status(c, "pid");

    /* Fill the file system. */
    char filler[300];
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0);
    static char block[65536];
    while (write(fd, block, sizeof(block)) > 0)
        ;
    while (write(fd, block, 512) > 0)
        ;
    close(fd);

    /* Big values need new pages: the commit cannot be written. */
    int acked_full = 0, failed = 0;
    unsigned char acked[40] = {0};
    for (int i = 0; i < 40 && failed < 3; i++) {
        snprintf(key, sizeof(key), "FULL%d", i);
        int rc = tc_env_fill(c, id, key, 60000, code);
        if (rc == 0) {
            acked[i] = 1;
            acked_full++;
        } else {
            cr_assert_str_eq(code, "STORAGE_FULL", "env.set on a full disk: %s", code);
            failed++;
        }
    }
    cr_assert_gt(failed, 0, "no STORAGE_FULL on a full file system");
    cr_expect_gt(tc_shard_status(c, "storeFailures"), 0, "storeFailures not counted");
    cr_assert_eq(tc_shard_status(c, "pid"), pid, "the shard restarted: it crashed");
    /* Reads keep working. */
    tcall t = tc_call(c, "status", id, NULL, 0);
    tc_ok(t, "status on a full disk");
    tc_free(&t);

    /* Space again: writes succeed and are durable. */
    cr_assert_eq(unlink(filler), 0);
    cr_assert_eq(tc_env_fill(c, id, "AFTER", 60000, code), 0, "env.set after freeing space: %s", code);
    cr_assert_eq(testd_restart(&d, 1, extra), 0, "restart on the tmpfs");
    sbx_client_close(c);
    c = tc_client(d.url, 30000);
    char *out = tsh_out(c, id, "env | cut -d= -f1 | grep -E '^(BEFORE|AFTER|FULL[0-9]+)$' | sort");
    cr_expect(strstr(out, "BEFORE\n") && strstr(out, "AFTER\n"), "lost: %s", out);
    for (int i = 0; i < 40; i++) {
        char want[32];
        snprintf(want, sizeof(want), "FULL%d\n", i);
        if (acked[i])
            cr_expect(strstr(out, want) != NULL, "acknowledged %s lost", want);
    }
    free(out);
    sbx_client_close(c);
    char dir[300];
    snprintf(dir, sizeof(dir), "%s/s0", mnt);
    testd_stop(&d);
    live_testd = NULL;
    cr_expect_eq(run("mdb_stat -a %s >/dev/null 2>&1", dir), 0, "mdb_stat cannot read %s", dir);
    cr_expect_eq(umount2(mnt, 0), 0, "umount %s: %s", mnt, strerror(errno));
    rmdir(mnt);
    live_mount[0] = '\0';
    cr_log_info("full disk: %d big writes acknowledged, %d refused", acked_full, failed);
}
