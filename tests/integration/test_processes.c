/*
 * test_processes.c — background processes (docs/protocol.md §3.3) through
 * the C client against a private sbxd: process.start/list/get and their
 * fields, custom and duplicate process IDs, waitForLog (substring, regex
 * with groups, output written before and after the call, timeout, early
 * exit), waitForPort (HTTP and TCP), waitForExit, process.kill of a whole
 * tree (SIGTERM → 143, SIGKILL after 5 s → 137), killAll, logs with stdout
 * and stderr apart, the bounded log ring of a process printing forever, the
 * statuses completed/failed/killed, PROCESS_NOT_FOUND.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/sdk.h"

/* start — process.start with a shell command (and optional ID); asserts. */
static void
start(sbx_client *c, const char *id, const char *cmd, const char *pid_in, char out[128])
{
    sbx_exec_opts o = {.command = cmd};
    sbx_error err;
    int rc = sbx_process_start(c, id, &o, pid_in, out, &err);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s %s", err.code, err.message);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "process.start '%s': %s", cmd, msg);
    cr_assert(out[0], "process.start returned no processId");
}

/* pcall — a process.* op with {processId: pid} plus extra fields (JSON object, stolen). */
static tcall
pcall(sbx_client *c, const char *id, const char *op, const char *pid, json_t *extra)
{
    json_t *a = extra ? extra : json_object();
    json_object_set_new(a, "processId", json_string(pid));
    return tc_call(c, op, id, a, 0);
}

/* count_sleeps — how many `sleep` processes run in the sandbox. */
static int
count_sleeps(sbx_client *c, const char *id)
{
    sbx_exec_opts o = {.command = "ps -eo comm= | grep -c '^sleep$' || true", .sessionless = true};
    sbx_exec_result r = tsh_opts(c, id, &o);
    int n = atoi(r.stdout_data);
    sbx_exec_result_free(&r);
    return n;
}

Test(processes, start_list_and_get_report_the_fields, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-fields");
    tcall t = tc_call(c, "process.start", id, json_pack("{s:s}", "command", "sleep 1000"), 0);
    tc_ok(t, "process.start");
    char pid[128];
    snprintf(pid, sizeof(pid), "%s", jstr(t.res, "processId"));
    cr_expect(pid[0], "no processId");
    cr_expect_eq(jbool(t.res, "success"), 1);
    cr_expect_gt(jint(t.res, "pid"), 0, "pid %lld", jint(t.res, "pid"));
    cr_expect_str_eq(jstr(t.res, "command"), "sleep 1000");
    char sid[160];
    snprintf(sid, sizeof(sid), "proc:%s", pid);
    cr_expect_str_eq(jstr(t.res, "streamId"), sid);
    cr_expect_str_eq(jstr(t.res, "process.status"), "running");
    long long ospid = jint(t.res, "pid");
    tc_free(&t);

    t = tc_call(c, "process.list", id, NULL, 0);
    tc_ok(t, "process.list");
    json_t *arr = jget(t.res, "processes");
    cr_assert(json_is_array(arr), "process.list has no processes array");
    bool found = false;
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!strcmp(jstr(json_array_get(arr, i), "id"), pid)) {
            found = true;
            cr_expect_str_eq(jstr(json_array_get(arr, i), "status"), "running");
        }
    cr_expect(found, "process.list does not list %s", pid);
    tc_free(&t);

    t = pcall(c, id, "process.get", pid, NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.id"), pid);
    cr_expect_eq(jint(t.res, "process.pid"), ospid);
    cr_expect_str_eq(jstr(t.res, "process.command"), "sleep 1000");
    cr_expect_str_eq(jstr(t.res, "process.status"), "running");
    const char *st = jstr(t.res, "process.startTime");
    /* ISO 8601: 2026-01-02T03:04:05.678Z */
    cr_expect(strlen(st) >= 20 && st[4] == '-' && st[10] == 'T', "startTime '%s' is not ISO 8601",
              st);
    cr_expect(jget(t.res, "process.exitCode") == NULL ||
                  json_is_null(jget(t.res, "process.exitCode")),
              "a running process has an exitCode");
    tc_free(&t);
    /* The pid is a live process of the sandbox (the shell running the command, or
     * the command itself), and its tree holds the sleep. */
    char cmd[384];
    /* The shell may not have exec'd the sleep yet when process.start answers
     * (a loaded host): wait for it, up to 5 s, inside the sandbox. */
    snprintf(cmd, sizeof(cmd),
             "kill -0 %lld && echo alive; for i in $(seq 50); do "
             "ps -eo comm= | grep -q '^sleep$' && break; sleep 0.1; done; "
             "ps -eo comm= | grep -c '^sleep$'",
             ospid);
    sbx_exec_result r = tsh(c, id, cmd, 0);
    cr_expect_str_eq(r.stdout_data, "alive\n1\n", "pid %lld: %s", ospid, r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, custom_id_works_and_a_duplicate_is_resource_busy)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-ids");
    char pid[128];
    start(c, id, "sleep 1000", "web-1.a_B", pid);
    cr_expect_str_eq(pid, "web-1.a_B");
    tcall t = pcall(c, id, "process.get", "web-1.a_B", NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "running");
    tc_free(&t);
    t = tc_call(c, "process.start", id,
                json_pack("{s:s, s:s}", "command", "sleep 1", "processId", "web-1.a_B"), 0);
    tc_fails_with(t, "process.start with an existing processId", "RESOURCE_BUSY");
    tc_free(&t);
    t = tc_call(c, "process.start", id,
                json_pack("{s:s, s:s}", "command", "sleep 1", "processId", "bad id/../x"), 0);
    tc_fails_with(t, "process.start with an invalid processId", "VALIDATION_FAILED");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, wait_for_log_finds_lines_written_before_and_after, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-log");
    char pid[128];
    start(c, id, "echo early-line; sleep 1.5; echo 'late line' >&2; sleep 1000", NULL, pid);
    tsleep_ms(500);
    tcall t = pcall(c, id, "process.waitForLog", pid,
                    json_pack("{s:s, s:i}", "pattern", "early", "timeout", 10000));
    tc_ok(t, "waitForLog early");
    cr_expect_str_eq(jstr(t.res, "line"), "early-line");
    tc_free(&t);
    double t0 = test_now_ms();
    t = pcall(c, id, "process.waitForLog", pid,
              json_pack("{s:s, s:i}", "pattern", "late", "timeout", 10000));
    double took = test_now_ms() - t0;
    tc_ok(t, "waitForLog late (stderr)");
    cr_expect_str_eq(jstr(t.res, "line"), "late line");
    cr_expect(took > 300, "the late line was found after %.0f ms, before it was written", took);
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, wait_for_log_regex_reports_groups, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-regex");
    char pid[128];
    start(c, id, "echo noise; echo 'server listening on port 8123 (pid 42)'; sleep 1000", NULL,
          pid);
    tcall t = pcall(c, id, "process.waitForLog", pid,
                    json_pack("{s:s, s:b, s:i}", "pattern",
                              "port ([0-9]+) \\(pid ([0-9]+)\\)", "regex", 1, "timeout", 10000));
    tc_ok(t, "waitForLog regex");
    cr_expect_str_eq(jstr(t.res, "line"), "server listening on port 8123 (pid 42)");
    json_t *m = jget(t.res, "match");
    cr_assert(json_is_array(m), "no match array");
    cr_expect_eq(json_array_size(m), 3, "match has %zu entries", json_array_size(m));
    cr_expect_str_eq(jstr(m, "0"), "port 8123 (pid 42)");
    cr_expect_str_eq(jstr(m, "1"), "8123");
    cr_expect_str_eq(jstr(m, "2"), "42");
    tc_free(&t);
    /* A regex that is not valid is a validation error. */
    t = pcall(c, id, "process.waitForLog", pid,
              json_pack("{s:s, s:b, s:i}", "pattern", "(unclosed", "regex", 1, "timeout", 1000));
    tc_fails_with(t, "waitForLog with a bad regex", "VALIDATION_FAILED");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, wait_for_log_timeout_and_early_exit, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-logerr");
    char pid[128];
    start(c, id, "echo hello; sleep 1000", NULL, pid);
    double t0 = test_now_ms();
    tcall t = pcall(c, id, "process.waitForLog", pid,
                    json_pack("{s:s, s:i}", "pattern", "never-printed", "timeout", 700));
    double took = test_now_ms() - t0;
    tc_fails_with(t, "waitForLog of a line that never comes", "PROCESS_READY_TIMEOUT");
    cr_expect(took >= 650 && took < 5000, "the 700 ms timeout fired after %.0f ms", took);
    tc_free(&t);
    char pid2[128];
    start(c, id, "echo something; sleep 0.5; exit 2", NULL, pid2);
    t0 = test_now_ms();
    t = pcall(c, id, "process.waitForLog", pid2,
              json_pack("{s:s, s:i}", "pattern", "never-printed", "timeout", 20000));
    took = test_now_ms() - t0;
    tc_fails_with(t, "waitForLog on a process that exits", "PROCESS_EXITED_BEFORE_READY");
    cr_expect(took < 5000, "waitForLog noticed the exit after %.0f ms", took);
    tc_free(&t);
    /* Already exited before the call: the same error at once. */
    t = pcall(c, id, "process.waitForLog", pid2,
              json_pack("{s:s, s:i}", "pattern", "never-printed", "timeout", 20000));
    tc_fails_with(t, "waitForLog on an exited process", "PROCESS_EXITED_BEFORE_READY");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, wait_for_port_http_and_tcp, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-port");
    char pid[128], cmd[512];
    start(c, id, "mkdir -p /tmp/www && cd /tmp/www && echo hi > index.html && "
                 "exec python3 -m http.server 8765 --bind 127.0.0.1", NULL, pid);
    tcall t = pcall(c, id, "process.waitForPort", pid,
                    json_pack("{s:i, s:i}", "port", 8765, "timeout", 30000));
    tc_ok(t, "waitForPort http");
    cr_expect_eq(jbool(t.res, "ready"), 1);
    cr_expect_eq(jint(t.res, "port"), 8765);
    cr_expect_eq(jint(t.res, "statusCode"), 200, "statusCode %lld", jint(t.res, "statusCode"));
    tc_free(&t);
    /* An explicit status, and a status range a 404 falls into. */
    t = pcall(c, id, "process.waitForPort", pid,
              json_pack("{s:i, s:s, s:i, s:i}", "port", 8765, "path", "/index.html", "status", 200,
                        "timeout", 10000));
    tc_ok(t, "waitForPort status 200");
    cr_expect_eq(jint(t.res, "statusCode"), 200);
    tc_free(&t);
    t = pcall(c, id, "process.waitForPort", pid,
              json_pack("{s:i, s:s, s:i, s:i, s:i}", "port", 8765, "path", "/missing",
                        "statusMin", 400, "statusMax", 404, "timeout", 10000));
    tc_ok(t, "waitForPort statusMin 400 statusMax 404 on a 404 path");
    cr_expect_eq(jint(t.res, "statusCode"), 404);
    tc_free(&t);
    /* A path that answers 404 does not satisfy the default 200-399. */
    t = pcall(c, id, "process.waitForPort", pid,
              json_pack("{s:i, s:s, s:i}", "port", 8765, "path", "/missing", "timeout", 1500));
    tc_fails_with(t, "waitForPort of a 404 path", "PROCESS_READY_TIMEOUT");
    tc_free(&t);
    /* TCP mode: a plain listener that never speaks HTTP. */
    char pid2[128];
    snprintf(cmd, sizeof(cmd),
             "exec python3 -c 'import socket,time\n"
             "time.sleep(0.5)\n"
             "s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
             "s.bind((\"127.0.0.1\", 8766)); s.listen(5); time.sleep(1000)'");
    start(c, id, cmd, NULL, pid2);
    t = pcall(c, id, "process.waitForPort", pid2,
              json_pack("{s:i, s:s, s:i}", "port", 8766, "mode", "tcp", "timeout", 30000));
    tc_ok(t, "waitForPort tcp");
    cr_expect_eq(jbool(t.res, "ready"), 1);
    cr_expect_eq(jint(t.res, "port"), 8766);
    tc_free(&t);
    /* A port nobody listens on times out. */
    t = pcall(c, id, "process.waitForPort", pid2,
              json_pack("{s:i, s:s, s:i}", "port", 8767, "mode", "tcp", "timeout", 1000));
    tc_fails_with(t, "waitForPort of a closed port", "PROCESS_READY_TIMEOUT");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, wait_for_exit_reports_code_and_status, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-exit");
    char ok[128], bad[128], slow[128];
    start(c, id, "sleep 0.3; exit 0", NULL, ok);
    start(c, id, "sleep 0.3; exit 5", NULL, bad);
    start(c, id, "sleep 1000", NULL, slow);
    tcall t = pcall(c, id, "process.waitForExit", ok, json_pack("{s:i}", "timeout", 20000));
    tc_ok(t, "waitForExit ok");
    cr_expect_eq(jint(t.res, "exitCode"), 0);
    cr_expect_str_eq(jstr(t.res, "status"), "completed");
    tc_free(&t);
    t = pcall(c, id, "process.waitForExit", bad, json_pack("{s:i}", "timeout", 20000));
    tc_ok(t, "waitForExit bad");
    cr_expect_eq(jint(t.res, "exitCode"), 5);
    cr_expect_str_eq(jstr(t.res, "status"), "failed");
    tc_free(&t);
    double t0 = test_now_ms();
    t = pcall(c, id, "process.waitForExit", slow, json_pack("{s:i}", "timeout", 700));
    double took = test_now_ms() - t0;
    tc_fails_with(t, "waitForExit of a process that keeps running", "REQUEST_TIMEOUT");
    cr_expect(took < 5000, "took %.0f ms", took);
    tc_free(&t);
    /* process.get agrees, with an end time. */
    t = pcall(c, id, "process.get", bad, NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "failed");
    cr_expect_eq(jint(t.res, "process.exitCode"), 5);
    cr_expect(jstr(t.res, "process.endTime")[0], "a finished process has no endTime");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, kill_ends_the_whole_tree_with_143, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-kill");
    char pid[128];
    start(c, id, "sh -c 'sleep 1000 & sleep 1000'", NULL, pid);
    for (int i = 0; i < 50 && count_sleeps(c, id) < 2; i++)
        tsleep_ms(100);
    cr_expect_eq(count_sleeps(c, id), 2, "the tree did not start two sleeps");
    double t0 = test_now_ms();
    tcall t = pcall(c, id, "process.kill", pid, NULL);
    double took = test_now_ms() - t0;
    tc_ok(t, "process.kill");
    cr_expect_eq(jint(t.res, "exitCode"), 143, "exitCode %lld", jint(t.res, "exitCode"));
    cr_expect_str_eq(jstr(t.res, "status"), "killed");
    cr_expect(took < 4000, "kill of a tree that obeys SIGTERM took %.0f ms", took);
    tc_free(&t);
    t = pcall(c, id, "process.get", pid, NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "killed");
    cr_expect_eq(jint(t.res, "process.exitCode"), 143);
    tc_free(&t);
    int left = count_sleeps(c, id);
    cr_expect_eq(left, 0, "%d sleep processes survived process.kill", left);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, a_process_ignoring_sigterm_is_killed_with_137, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-term");
    char pid[128];
    start(c, id, "exec bash -c 'trap \"\" TERM; echo armed; sleep 1000'", NULL, pid);
    tcall t = pcall(c, id, "process.waitForLog", pid,
                    json_pack("{s:s, s:i}", "pattern", "armed", "timeout", 10000));
    tc_ok(t, "waitForLog armed");
    tc_free(&t);
    double t0 = test_now_ms();
    int code = -1;
    sbx_error err;
    int rc = sbx_process_kill(c, id, pid, &code, &err);
    double took = test_now_ms() - t0;
    cr_assert_eq(rc, 0, "process.kill: %s %s", err.code, err.message);
    cr_expect_eq(code, 137, "exit code %d", code);
    cr_expect(took >= 4500 && took < 9000, "SIGKILL came after %.0f ms (expected ~5 s)", took);
    t = pcall(c, id, "process.get", pid, NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "killed");
    tc_free(&t);
    cr_expect_eq(count_sleeps(c, id), 0, "sleep processes survived");
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, kill_all_returns_the_count, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-killall");
    char p[3][128], done[128];
    for (int i = 0; i < 3; i++)
        start(c, id, "sleep 1000", NULL, p[i]);
    start(c, id, "true", NULL, done);
    tcall t = pcall(c, id, "process.waitForExit", done, json_pack("{s:i}", "timeout", 10000));
    tc_free(&t);
    t = tc_call(c, "process.killAll", id, NULL, 0);
    tc_ok(t, "process.killAll");
    cr_expect_eq(jint(t.res, "killedCount"), 3, "killedCount %lld", jint(t.res, "killedCount"));
    tc_free(&t);
    for (int i = 0; i < 3; i++) {
        t = pcall(c, id, "process.get", p[i], NULL);
        tc_ok(t, "process.get");
        cr_expect_str_eq(jstr(t.res, "process.status"), "killed", "%s is %s", p[i],
                         jstr(t.res, "process.status"));
        tc_free(&t);
    }
    cr_expect_eq(count_sleeps(c, id), 0);
    t = tc_call(c, "process.killAll", id, NULL, 0);
    tc_ok(t, "process.killAll (nothing left)");
    cr_expect_eq(jint(t.res, "killedCount"), 0);
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, logs_keep_stdout_and_stderr_apart, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-logs");
    char pid[128];
    start(c, id, "echo out1; echo err1 >&2; echo out2; printf 'no newline' >&2", NULL, pid);
    tcall t = pcall(c, id, "process.waitForExit", pid, json_pack("{s:i}", "timeout", 10000));
    tc_ok(t, "waitForExit");
    tc_free(&t);
    t = pcall(c, id, "process.logs", pid, NULL);
    tc_ok(t, "process.logs");
    sbx_str out = tc_bin(&t, "stdout"), er = tc_bin(&t, "stderr");
    cr_expect(out.n == 10 && !memcmp(out.p, "out1\nout2\n", 10), "stdout: %.*s", (int)out.n,
              out.p);
    cr_expect(er.n == 15 && !memcmp(er.p, "err1\nno newline", 15), "stderr: %.*s", (int)er.n,
              er.p);
    cr_expect_eq(jbool(t.res, "truncated"), 0);
    cr_expect_str_eq(jstr(t.res, "status"), "completed");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, a_process_printing_forever_keeps_memory_bounded, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-yes");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    long long before = ts_memory(c, id);
    char pid[128];
    start(c, id, "yes 'a line of output that repeats forever'", NULL, pid);
    long long peak = 0;
    for (int i = 0; i < 12; i++) {
        tsleep_ms(333);
        long long m = ts_memory(c, id);
        if (m > peak)
            peak = m;
    }
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "restarts"), 0,
                 "the container died while `yes` ran (lastExit: %s; memoryBytes peaked at %lld)",
                 jstr(sb, "lastExit"), peak);
    json_decref(sb);
    cr_expect(peak > 0, "no memoryBytes in status");
    cr_expect(peak < (100LL << 20), "memoryBytes reached %lld (before: %lld) while `yes` ran",
              peak, before);
    tcall t = pcall(c, id, "process.get", pid, NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "running");
    tc_free(&t);
    t = pcall(c, id, "process.logs", pid, NULL);
    tc_ok(t, "process.logs");
    cr_expect_eq(jbool(t.res, "truncated"), 1, "logs of `yes` after 4 s are not truncated");
    sbx_str out = tc_bin(&t, "stdout");
    cr_expect(out.n > 0 && out.n <= (2u << 20) + 65536, "logs hold %zu bytes", out.n);
    tc_free(&t);
    int code = 0;
    cr_expect_eq(sbx_process_kill(c, id, pid, &code, NULL), 0);
    cr_expect_eq(code, 143);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, statuses_completed_failed_killed_in_the_list, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-status");
    char ok[128], bad[128], sig[128], killed[128];
    start(c, id, "exit 0", "st-ok", ok);
    start(c, id, "exit 7", "st-bad", bad);
    start(c, id, "kill -TERM $$; sleep 5", "st-sig", sig);
    start(c, id, "sleep 1000", "st-killed", killed);
    cr_assert_eq(sbx_process_kill(c, id, killed, NULL, NULL), 0);
    const char *ids[] = {ok, bad, sig};
    for (int i = 0; i < 3; i++) {
        tcall t = pcall(c, id, "process.waitForExit", ids[i], json_pack("{s:i}", "timeout", 10000));
        tc_ok(t, "waitForExit");
        tc_free(&t);
    }
    tcall t = tc_call(c, "process.list", id, NULL, 0);
    tc_ok(t, "process.list");
    json_t *arr = jget(t.res, "processes");
    struct {
        const char *id, *status;
        int code;
    } want[] = {{"st-ok", "completed", 0},
                {"st-bad", "failed", 7},
                {"st-sig", "killed", 143},
                {"st-killed", "killed", 143}};
    for (int w = 0; w < 4; w++) {
        bool found = false;
        for (size_t i = 0; i < json_array_size(arr); i++) {
            json_t *p = json_array_get(arr, i);
            if (strcmp(jstr(p, "id"), want[w].id))
                continue;
            found = true;
            cr_expect_str_eq(jstr(p, "status"), want[w].status, "%s: status %s, expected %s",
                             want[w].id, jstr(p, "status"), want[w].status);
            cr_expect_eq(jint(p, "exitCode"), want[w].code, "%s: exitCode %lld, expected %d",
                         want[w].id, jint(p, "exitCode"), want[w].code);
        }
        cr_expect(found, "%s not listed", want[w].id);
    }
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, unknown_process_is_process_not_found)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-unknown");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    const char *ops[] = {"process.get", "process.kill", "process.logs", "process.waitForExit",
                         "process.waitForLog"};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        tcall t = pcall(c, id, ops[i], "no-such-process",
                        json_pack("{s:s, s:i}", "pattern", "x", "timeout", 1000));
        tc_fails_with(t, ops[i], "PROCESS_NOT_FOUND");
        tc_free(&t);
    }
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, started_in_a_session_it_inherits_cwd_and_env, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-sess");
    sbx_exec_result r = tsh_in(c, id, "ps", "cd /tmp && export FROM_SESSION=yes", 0);
    sbx_exec_result_free(&r);
    sbx_exec_opts o = {.command = "echo \"$(pwd) $FROM_SESSION\"", .session_id = "ps"};
    char pid[128];
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &o, NULL, pid, &err), 0, "%s", err.message);
    tcall t = pcall(c, id, "process.waitForExit", pid, json_pack("{s:i}", "timeout", 10000));
    tc_ok(t, "waitForExit");
    tc_free(&t);
    t = pcall(c, id, "process.logs", pid, NULL);
    tc_ok(t, "process.logs");
    cr_expect_str_eq(jstr(t.res, "stdout"), "/tmp yes\n", "a session's process ran with: %s",
                     jstr(t.res, "stdout"));
    tc_free(&t);
    /* Without a session: /workspace and no session variables. */
    sbx_exec_opts o2 = {.command = "echo \"$(pwd) ${FROM_SESSION:-unset}\""};
    cr_assert_eq(sbx_process_start(c, id, &o2, NULL, pid, &err), 0, "%s", err.message);
    t = pcall(c, id, "process.waitForExit", pid, json_pack("{s:i}", "timeout", 10000));
    tc_free(&t);
    t = pcall(c, id, "process.logs", pid, NULL);
    tc_ok(t, "process.logs");
    cr_expect_str_eq(jstr(t.res, "stdout"), "/workspace unset\n", "%s", jstr(t.res, "stdout"));
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(processes, a_process_timeout_kills_it, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-tmo");
    sbx_exec_opts o = {.command = "sh -c 'sleep 1000 & sleep 1000'", .timeout_ms = 800};
    char pid[128];
    sbx_error err;
    double t0 = test_now_ms();
    cr_assert_eq(sbx_process_start(c, id, &o, NULL, pid, &err), 0, "%s", err.message);
    tcall t = pcall(c, id, "process.waitForExit", pid, json_pack("{s:i}", "timeout", 10000));
    double took = test_now_ms() - t0;
    tc_ok(t, "waitForExit");
    cr_expect_str_eq(jstr(t.res, "status"), "killed", "a timed-out process is %s",
                     jstr(t.res, "status"));
    cr_expect(took >= 700 && took < 4000, "the 800 ms timeout ended it after %.0f ms", took);
    tc_free(&t);
    cr_expect_eq(count_sleeps(c, id), 0, "the tree of a timed-out process survived");
    tdone(c, id);
    sbx_client_close(c);
}

/* A process that cannot start leaves nothing behind: start fails, the ID is
 * not listed (nor gettable, nor waitable: it never ran, there is no exit code
 * to report), and the ID is free for the corrected call. */
Test(processes, a_process_that_cannot_start_leaves_no_entry, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-nostart");
    tcall t = tc_call(c, "process.start", id,
                      json_pack("{s:s, s:s, s:s}", "command", "true", "processId", "bad", "cwd",
                                "/nonexist"),
                      0);
    tc_fails_with(t, "process.start with a missing cwd", "VALIDATION_FAILED");
    tc_free(&t);
    t = tc_call(c, "process.list", id, NULL, 0);
    tc_ok(t, "process.list");
    json_t *arr = jget(t.res, "processes");
    for (size_t i = 0; i < json_array_size(arr); i++)
        cr_expect_str_neq(jstr(json_array_get(arr, i), "id"), "bad",
                          "the failed process is listed: status %s, exitCode %lld, cause '%s'",
                          jstr(json_array_get(arr, i), "status"),
                          jint(json_array_get(arr, i), "exitCode"),
                          jstr(json_array_get(arr, i), "cause"));
    tc_free(&t);
    const char *ops[] = {"process.get", "process.waitForExit", "process.logs"};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        t = pcall(c, id, ops[i], "bad", json_pack("{s:i}", "timeout", 2000));
        tc_fails_with(t, ops[i], "PROCESS_NOT_FOUND");
        tc_free(&t);
    }
    /* Its log stream does not hang a reader: it is gone, or ended. */
    t = tc_call(c, "stream.read", id,
                json_pack("{s:s, s:i, s:i}", "streamId", "proc:bad", "after", 0, "waitMs", 3000),
                10000);
    if (t.rc == 0)
        cr_expect_eq(jbool(t.res, "done"), 1, "the failed process's stream is not done");
    else
        tc_fails_with(t, "stream.read proc:bad", "STREAM_NOT_FOUND");
    tc_free(&t);
    /* The ID is free again. */
    t = tc_call(c, "process.start", id,
                json_pack("{s:s, s:s, s:s}", "command", "echo again", "processId", "bad", "cwd",
                          "/tmp"),
                0);
    tc_ok(t, "process.start with the same ID and a good cwd");
    tc_free(&t);
    t = pcall(c, id, "process.waitForExit", "bad", json_pack("{s:i}", "timeout", 10000));
    tc_ok(t, "waitForExit");
    cr_expect_eq(jint(t.res, "exitCode"), 0);
    cr_expect_str_eq(jstr(t.res, "status"), "completed");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

struct start_arg {
    const char *sandbox;
    tcall t;
};

static void *
start_in_busy_session(void *arg)
{
    struct start_arg *s = arg;
    sbx_client *c = test_client();
    s->t = tc_call(c, "process.start", s->sandbox,
                   json_pack("{s:s, s:s, s:s, s:s}", "command", "true", "processId", "late",
                             "sessionId", "busy", "cwd", "/nonexist"),
                   0);
    sbx_client_close(c);
    return NULL;
}

/* A process started in a busy session is `starting` until the session's
 * queue reaches it; whoever waits on it or reads its logs meanwhile learns
 * that it could not start, instead of waiting forever. */
Test(processes, waiters_on_a_process_that_cannot_start_are_told, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-nostart-w");
    /* Keep session "busy" busy for 3 s (a stream answers at once). */
    tcall t = tc_call(c, "exec.stream", id,
                      json_pack("{s:s, s:s}", "command", "sleep 3", "sessionId", "busy"), 0);
    tc_ok(t, "exec.stream");
    tc_free(&t);
    struct start_arg sa = {.sandbox = id};
    pthread_t th;
    pthread_create(&th, NULL, start_in_busy_session, &sa);
    /* Wait until it is listed as starting. */
    bool seen = false;
    for (int i = 0; i < 100 && !seen; i++) {
        t = pcall(c, id, "process.get", "late", NULL);
        seen = t.rc == 0;
        if (seen)
            cr_expect_str_eq(jstr(t.res, "process.status"), "starting");
        tc_free(&t);
        if (!seen)
            tsleep_ms(20);
    }
    cr_assert(seen, "the process never showed up as starting");
    double t0 = test_now_ms();
    t = pcall(c, id, "process.waitForExit", "late", json_pack("{s:i}", "timeout", 20000));
    tc_fails_with(t, "waitForExit of a process that cannot start", "PROCESS_ERROR");
    cr_expect(test_now_ms() - t0 < 10000, "waitForExit took %.0f ms", test_now_ms() - t0);
    tc_free(&t);
    pthread_join(th, NULL);
    tc_fails_with(sa.t, "process.start in the busy session", "VALIDATION_FAILED");
    tc_free(&sa.t);
    /* Its stream ended with an error event. */
    t = tc_call(c, "stream.read", id,
                json_pack("{s:s, s:i, s:i}", "streamId", "proc:late", "after", 0, "waitMs", 3000),
                10000);
    tc_ok(t, "stream.read proc:late");
    cr_expect_eq(jbool(t.res, "done"), 1, "the stream of a process that could not start is "
                                          "not done");
    json_t *evs = jget(t.res, "events");
    json_t *last = json_array_get(evs, json_array_size(evs) - 1);
    cr_expect_str_eq(jstr(last, "type"), "error");
    cr_expect_str_eq(jstr(last, "error.code"), "VALIDATION_FAILED");
    tc_free(&t);
    t = pcall(c, id, "process.get", "late", NULL);
    tc_fails_with(t, "process.get after the failed start", "PROCESS_NOT_FOUND");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* Listings show a command's first 4 KiB: three processes with 30 MB
 * commands made process.list larger than any reply frame, and the shard
 * replaced the container for it. */
Test(processes, long_commands_are_shown_shortened, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-longcmd");
    sbx_exec_result r = tsh(c, id, "echo keep > /workspace/marker", 0);
    sbx_exec_result_free(&r);
    size_t n = 30u << 20;
    char *cmd = malloc(n + 1);
    cr_assert(cmd);
    memcpy(cmd, "echo ", 5);
    memset(cmd + 5, 'x', n - 5);
    cmd[n] = '\0';
    /* A multi-byte character straddles the 4 KiB cut: it is left out whole. */
    memcpy(cmd + 4095, "\xc3\xa9", 2);
    for (int i = 0; i < 3; i++) {
        char pid[16];
        snprintf(pid, sizeof(pid), "long-%d", i);
        json_t *a = json_pack("{s:s, s:s}", "command", cmd, "processId", pid);
        tcall t = tc_call(c, "process.start", id, a, 60000);
        tc_ok(t, "process.start with a 30 MB command");
        cr_expect_eq(strlen(jstr(t.res, "command")), 4095, "start echoes %zu bytes of command",
                     strlen(jstr(t.res, "command")));
        cr_expect_eq(jbool(t.res, "commandTruncated"), 1);
        tc_free(&t);
    }
    free(cmd);
    tcall t = tc_call(c, "process.list", id, NULL, 60000);
    tc_ok(t, "process.list");
    json_t *arr = jget(t.res, "processes");
    cr_expect_eq(json_array_size(arr), 3);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *p = json_array_get(arr, i);
        cr_expect_eq(strlen(jstr(p, "command")), 4095, "%s: %zu bytes of command", jstr(p, "id"),
                     strlen(jstr(p, "command")));
        cr_expect(!strncmp(jstr(p, "command"), "echo xxx", 8), "%s: command %.20s", jstr(p, "id"),
                  jstr(p, "command"));
        cr_expect_eq(jbool(p, "commandTruncated"), 1);
        cr_expect_eq(jint(p, "commandBytes"), (long long)n);
    }
    tc_free(&t);
    t = pcall(c, id, "process.get", "long-1", NULL);
    tc_ok(t, "process.get");
    cr_expect_eq(strlen(jstr(t.res, "process.command")), 4095);
    tc_free(&t);
    /* The same container: nothing was lost. */
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "restarts"), 0, "the container was replaced");
    json_decref(sb);
    r = tsh(c, id, "cat /workspace/marker", 0);
    cr_expect_str_eq(r.stdout_data, "keep\n", "/workspace lost its files");
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

/* ended_with — waitForExit of pid, then its `process` from process.get and
 * the cause in its log stream's exit event; asserts what was expected. */
static void
expect_ended(sbx_client *c, const char *id, const char *pid, const char *status, int code,
             const char *cause)
{
    tcall t = pcall(c, id, "process.waitForExit", pid, json_pack("{s:i}", "timeout", 60000));
    tc_ok(t, "waitForExit");
    cr_expect_eq(jint(t.res, "exitCode"), code, "%s: exit %lld", pid, jint(t.res, "exitCode"));
    cr_expect_str_eq(jstr(t.res, "status"), status, "%s: status", pid);
    tc_free(&t);
    t = pcall(c, id, "process.get", pid, NULL);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.cause"), cause, "%s: process.get cause", pid);
    tc_free(&t);
    t = tc_call(c, "process.list", id, NULL, 0);
    tc_ok(t, "process.list");
    json_t *arr = jget(t.res, "processes");
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!strcmp(jstr(json_array_get(arr, i), "id"), pid))
            cr_expect_str_eq(jstr(json_array_get(arr, i), "cause"), cause,
                             "%s: process.list cause", pid);
    tc_free(&t);
    char sid[160];
    snprintf(sid, sizeof(sid), "proc:%s", pid);
    t = tc_call(c, "stream.read", id,
                json_pack("{s:s, s:i, s:i}", "streamId", sid, "after", 0, "waitMs", 5000), 15000);
    tc_ok(t, "stream.read");
    json_t *evs = jget(t.res, "events");
    json_t *last = json_array_get(evs, json_array_size(evs) - 1);
    cr_expect_str_eq(jstr(last, "type"), "exit");
    cr_expect_str_eq(jstr(last, "cause"), cause, "%s: the exit event's cause", pid);
    tc_free(&t);
}

/* A background process ended by the sandbox's OOM killer says so, as exec
 * does (it said KILLED): in waitForExit's status, process.get and .list,
 * and its log stream's exit event; one that kills itself stays KILLED. */
Test(processes, an_oom_killed_process_reports_oom_killed, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-oom");
    char pid[128];
    start(c, id, "python3 -c 'b = bytearray(2 * 1024 ** 3)'", "oom", pid);
    expect_ended(c, id, "oom", "killed", 137, "OOM_KILLED");
    /* Started through a shell that reports its child's SIGKILL as 137. */
    start(c, id, "python3 -c 'b = bytearray(2 * 1024 ** 3)'; exit $?", "oom-sh", pid);
    expect_ended(c, id, "oom-sh", "killed", 137, "OOM_KILLED");
    start(c, id, "kill -KILL $$", "self", pid);
    expect_ended(c, id, "self", "killed", 137, "KILLED");
    tdone(c, id);
    sbx_client_close(c);
}

/* A background process that fails because its forks are refused by the
 * pids limit reports PIDS_LIMIT. */
Test(processes, a_process_stopped_by_the_pids_limit_reports_pids_limit, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-pids");
    char pid[128];
    start(c, id, TEST_FORK_UNTIL_REFUSED_PY, "bomb", pid);
    expect_ended(c, id, "bomb", "failed", 3, "PIDS_LIMIT");
    tdone(c, id);
    sbx_client_close(c);
}

/* A wait without a `timeout` is bounded by the request's deadline: it is
 * answered REQUEST_TIMEOUT by the sandbox (it was SHARD_UNAVAILABLE from the
 * gateway, about a healthy shard), and the abandoned waiters do not stay
 * behind to keep the operation in flight and the sandbox from sleeping. */
Test(processes, waits_end_at_the_request_deadline_and_the_sandbox_can_sleep, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("proc-deadline");
    tcall t = tc_call(c, "sandbox.configure", id, json_pack("{s:s}", "sleepAfter", "2s"), 0);
    tc_ok(t, "sandbox.configure");
    tc_free(&t);
    char pid[128];
    start(c, id, "sleep 1000", "sleeper", pid);
    json_t *waits[] = {
        json_pack("{s:s}", "processId", "sleeper"),
        json_pack("{s:s, s:s}", "processId", "sleeper", "pattern", "never printed"),
        json_pack("{s:s, s:i, s:s}", "processId", "sleeper", "port", 9999, "mode", "tcp"),
    };
    const char *ops[] = {"process.waitForExit", "process.waitForLog", "process.waitForPort"};
    for (int i = 0; i < 3; i++) {
        double t0 = test_now_ms();
        t = tc_call(c, ops[i], id, waits[i], 1500);
        double took = test_now_ms() - t0;
        tc_fails_with(t, ops[i], "REQUEST_TIMEOUT");
        cr_expect(t.err.context_json && strstr(t.err.context_json, "\"sandboxId\""),
                  "%s: not the sandbox's answer (%s: %s)", ops[i], t.err.message,
                  t.err.context_json ? t.err.context_json : "no context");
        cr_expect(took < 1500, "%s answered after %.0f ms", ops[i], took);
        tc_free(&t);
    }
    /* Nothing is left in flight: idle for its sleepAfter, the container stops. */
    tsleep_ms(4500);
    json_t *sb = ts_status(c, id);
    if (strcmp(jstr(sb, "state"), "stopped")) {
        json_decref(sb);
        tsleep_ms(3500);
        sb = ts_status(c, id);
    }
    cr_expect_str_eq(jstr(sb, "state"), "stopped", "the sandbox did not sleep: %s",
                     jstr(sb, "state"));
    json_decref(sb);
    tdone(c, id);
    sbx_client_close(c);
}
