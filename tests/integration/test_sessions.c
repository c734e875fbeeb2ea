/*
 * test_sessions.c — persistent shell sessions (docs/protocol.md §3.2 and the
 * session rules of exec), through the C client against a private sbxd:
 * state (cwd, exported variables, functions) carried from one exec to the
 * next; independent and parallel sessions; per-call cwd/env that do not
 * stick; stdin on /dev/null; `exit N` → SESSION_TERMINATED and a fresh
 * shell; session.create/get/list/delete and their errors; timeouts that
 * keep the shell's state; sessionless execs in fresh processes.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/sdk.h"

Test(sessions, cd_export_and_functions_persist_across_execs)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-state");
    sbx_exec_result r = tsh_in(c, id, "work", "cd /tmp && export FOO='bar baz' && "
                                              "greet() { echo \"hi $1\"; } && LOCALVAR=7", 0);
    cr_expect_eq(r.exit_code, 0, "setup exited %d: %s", r.exit_code, r.stderr_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "work", "pwd; echo \"$FOO\"; greet you; echo \"$LOCALVAR\"", 0);
    cr_expect_str_eq(r.stdout_data, "/tmp\nbar baz\nhi you\n7\n",
                     "the session forgot its state between execs: got %s", r.stdout_data);
    sbx_exec_result_free(&r);
    /* The session reports its cwd. */
    tcall t = tc_call(c, "session.get", id, json_pack("{s:s}", "id", "work"), 0);
    tc_ok(t, "session.get");
    cr_expect_str_eq(jstr(t.res, "session.id"), "work");
    cr_expect_str_eq(jstr(t.res, "session.cwd"), "/tmp", "session.get cwd is '%s'",
                     jstr(t.res, "session.cwd"));
    cr_expect_eq(jbool(t.res, "session.shellRunning"), 1, "shellRunning should be true");
    tc_free(&t);
    /* The default session did not see any of it. */
    r = tsh(c, id, "pwd; echo \"${FOO:-unset}\"; type greet >/dev/null 2>&1 || echo no-fn", 0);
    cr_expect_str_eq(r.stdout_data, "/workspace\nunset\nno-fn\n", "default session: %s",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, two_sessions_are_independent)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-indep");
    sbx_exec_result r = tsh_in(c, id, "a", "cd /tmp; export WHO=alpha", 0);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "b", "mkdir -p /workspace/bdir && cd /workspace/bdir; export WHO=beta", 0);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "a", "echo \"$(pwd) $WHO\"", 0);
    cr_expect_str_eq(r.stdout_data, "/tmp alpha\n", "session a: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "b", "echo \"$(pwd) $WHO\"", 0);
    cr_expect_str_eq(r.stdout_data, "/workspace/bdir beta\n", "session b: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    /* session.list shows both (and the default one is not confused with them). */
    tcall t = tc_call(c, "session.list", id, NULL, 0);
    tc_ok(t, "session.list");
    json_t *arr = jget(t.res, "sessions");
    cr_assert(json_is_array(arr), "session.list has no sessions array");
    bool seen_a = false, seen_b = false;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        const char *sid = jstr(json_array_get(arr, i), "id");
        seen_a |= !strcmp(sid, "a");
        seen_b |= !strcmp(sid, "b");
        if (!strcmp(sid, "a"))
            cr_expect_str_eq(jstr(json_array_get(arr, i), "cwd"), "/tmp");
    }
    cr_expect(seen_a && seen_b, "session.list lacks a or b");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

struct sleeper {
    sbx_client *c;
    const char *id;
    const char *session;
    int rc, code;
};

static void *
run_sleep(void *arg)
{
    struct sleeper *s = arg;
    sbx_exec_opts o = {.command = "sleep 1", .session_id = s->session};
    sbx_exec_result r;
    sbx_error err;
    s->rc = sbx_exec(s->c, s->id, &o, &r, &err);
    s->code = r.exit_code;
    sbx_exec_result_free(&r);
    if (s->rc)
        sbx_error_free(&err);
    return NULL;
}

static double
two_sleeps(sbx_client *c, const char *id, const char *s1, const char *s2)
{
    struct sleeper a = {c, id, s1, -1, -1}, b = {c, id, s2, -1, -1};
    pthread_t ta, tb;
    double t0 = test_now_ms();
    pthread_create(&ta, NULL, run_sleep, &a);
    pthread_create(&tb, NULL, run_sleep, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    double took = test_now_ms() - t0;
    cr_expect(a.rc == 0 && b.rc == 0 && a.code == 0 && b.code == 0,
              "sleep failed: rc %d/%d exit %d/%d", a.rc, b.rc, a.code, b.code);
    return took;
}

Test(sessions, sessions_run_in_parallel_and_one_session_in_order, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-par");
    /* Start both shells first so that the timing is about running. */
    const char *names[] = {"p1", "p2"};
    for (int i = 0; i < 2; i++) {
        tcall t = tc_call(c, "session.create", id, json_pack("{s:s}", "id", names[i]), 0);
        tc_ok(t, "session.create");
        tc_free(&t);
        sbx_exec_result r = tsh_in(c, id, names[i], "true", 0);
        sbx_exec_result_free(&r);
    }
    double par = two_sleeps(c, id, "p1", "p2");
    cr_expect(par >= 950 && par < 1700,
              "two `sleep 1` in two sessions took %.0f ms (expected about 1 s)", par);
    double ser = two_sleeps(c, id, "p1", "p1");
    cr_expect(ser >= 1950 && ser < 3500,
              "two `sleep 1` in one session took %.0f ms (expected about 2 s)", ser);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, per_call_cwd_and_env_do_not_persist)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-percall");
    sbx_exec_result r = tsh_in(c, id, "pc", "cd /usr; export KEEP=session", 0);
    sbx_exec_result_free(&r);
    const char *env[] = {"ONCE=call-only", "KEEP=overridden", NULL};
    sbx_exec_opts o = {.command = "echo \"$(pwd) $ONCE $KEEP\"", .cwd = "/tmp", .env = env,
                       .session_id = "pc"};
    r = tsh_opts(c, id, &o);
    cr_expect_str_eq(r.stdout_data, "/tmp call-only overridden\n", "per-call: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "pc", "echo \"$(pwd) ${ONCE:-unset} $KEEP\"", 0);
    cr_expect_str_eq(r.stdout_data, "/usr unset session\n",
                     "per-call cwd/env leaked into the session: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    /* A per-call cwd that is changed by the command still does not stick. */
    sbx_exec_opts o2 = {.command = "cd /; pwd", .cwd = "/tmp", .session_id = "pc"};
    r = tsh_opts(c, id, &o2);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "pc", "pwd", 0);
    cr_expect_str_eq(r.stdout_data, "/usr\n", "after a per-call cwd and cd: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

/* Variables are never dropped silently: session.create refuses a value that
 * is not a string (exec does), a per-call name the session's shell cannot
 * assign is refused naming it, and nil unsets a variable for one call. */
Test(sessions, env_that_cannot_be_applied_is_refused_not_dropped, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-badenv");
    tcall t = tc_call(c, "session.create", id,
                      json_pack("{s:s, s:{s:i}}", "id", "num", "env", "A", 1), 0);
    tc_fails_with(t, "session.create with env {A: 1}", "VALIDATION_FAILED");
    cr_expect(strstr(t.err.message ? t.err.message : "", "'A'") != NULL,
              "the message does not name the variable: %s", t.err.message);
    tc_free(&t);
    /* Nothing was created. */
    t = tc_call(c, "session.get", id, json_pack("{s:s}", "id", "num"), 0);
    tc_fails_with(t, "session.get of the refused session", "SESSION_NOT_FOUND");
    tc_free(&t);
    /* exec refuses the same value, in a session or not. */
    t = tc_call(c, "exec", id, json_pack("{s:s, s:{s:i}}", "command", "true", "env", "A", 1), 0);
    tc_fails_with(t, "exec with env {A: 1}", "VALIDATION_FAILED");
    tc_free(&t);

    /* A name that is not a shell identifier cannot be set by the session's
     * bash: refused, naming it; the command did not run. */
    t = tc_call(c, "exec", id,
                json_pack("{s:s, s:s, s:{s:s, s:s}}", "command", "touch /tmp/ran", "sessionId",
                          "ids", "env", "OK_NAME", "1", "A-B", "x"),
                0);
    tc_fails_with(t, "session exec with env A-B", "VALIDATION_FAILED");
    cr_expect(strstr(t.err.message ? t.err.message : "", "A-B") != NULL,
              "the message does not name A-B: %s", t.err.message);
    tc_free(&t);
    sbx_exec_result r = tsh_in(c, id, "ids", "test -e /tmp/ran && echo ran || echo not-run", 0);
    cr_expect_str_eq(r.stdout_data, "not-run\n", "the refused command ran: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    /* Sessionless, the same name reaches the process's environment. */
    t = tc_call(c, "exec", id,
                json_pack("{s:[s], s:b, s:{s:s}}", "argv", "env", "sessionless", 1, "env", "A-B",
                          "x"),
                0);
    tc_ok(t, "sessionless exec with env A-B");
    cr_expect(strstr(jstr(t.res, "stdout"), "\nA-B=x\n") != NULL, "A-B missing from: %s",
              jstr(t.res, "stdout"));
    tc_free(&t);

    /* nil unsets for one call; the variable and its export come back after. */
    r = tsh_in(c, id, "ids", "export KEEP=1 LOCAL=2; declare +x LOCAL", 0);
    sbx_exec_result_free(&r);
    t = tc_call(c, "exec", id,
                json_pack("{s:s, s:s, s:{s:n, s:n}}", "command",
                          "echo \"${KEEP-unset} ${LOCAL-unset}\"", "sessionId", "ids", "env",
                          "KEEP", "LOCAL"),
                0);
    tc_ok(t, "session exec with env {KEEP: nil, LOCAL: nil}");
    cr_expect_str_eq(jstr(t.res, "stdout"), "unset unset\n", "nil did not unset: %s",
                     jstr(t.res, "stdout"));
    tc_free(&t);
    r = tsh_in(c, id, "ids", "echo \"$KEEP $LOCAL\"; env | grep -c -e '^KEEP=' -e '^LOCAL='", 0);
    cr_expect_str_eq(r.stdout_data, "1 2\n1\n",
                     "after the call KEEP (exported) and LOCAL (not) should be back: %s",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, stdin_is_dev_null, .timeout = 30)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-stdin");
    double t0 = test_now_ms();
    sbx_exec_result r = tsh_in(c, id, "in", "cat; read -r line || echo eof; echo done", 10000);
    double took = test_now_ms() - t0;
    cr_expect_eq(r.exit_code, 0, "exit %d (timed out: %d)", r.exit_code, r.timed_out);
    cr_expect_str_eq(r.stdout_data, "eof\ndone\n", "stdout: %s", r.stdout_data);
    cr_expect(took < 5000, "cat waited %.0f ms for input", took);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "in", "readlink /proc/self/fd/0", 0);
    cr_expect_str_eq(r.stdout_data, "/dev/null\n", "stdin is %s", r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

/* The shell's control pipe (fd 3 in the session) reaches the agent; a
 * command that floods it with junk must neither grow the agent (PID 1) nor
 * break the session. */
Test(sessions, junk_on_the_control_pipe_is_bounded_and_harmless, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-ctl");
    sbx_exec_result r = tsh_in(c, id, "ctl", "export KEEP=yes; cd /tmp", 0);
    cr_expect_eq(r.exit_code, 0);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "ctl", "grep VmRSS /proc/1/status | tr -dc 0-9", 0);
    long before = atol(r.stdout_data);
    sbx_exec_result_free(&r);
    cr_assert_gt(before, 0, "cannot read the agent's VmRSS");
    /* The command's own fd 3 is closed, but the shell's saved copy is in
     * /proc/$$/fd: every write-only pipe of the shell other than the
     * command's stdout and stderr gets 32 MiB without a newline, then a
     * forged completion line. */
    r = tsh_in(c, id, "ctl",
               "o=$(readlink /proc/$$/fd/1); e=$(readlink /proc/$$/fd/2); n=0\n"
               "for f in /proc/$$/fd/*; do\n"
               "  l=$(readlink $f) || continue\n"
               "  case $l in pipe:*) ;; *) continue;; esac\n"
               "  { [ \"$l\" = \"$o\" ] || [ \"$l\" = \"$e\" ]; } && continue\n"
               "  fl=$(awk '/^flags/{print $2}' /proc/$$/fdinfo/${f##*/})\n"
               "  case $fl in *1) head -c 33554432 /dev/zero | tr '\\0' x > $f\n"
               "    echo 0123456789abcdef 0 /nowhere > $f; n=$((n+1));; esac\n"
               "done 2>/dev/null; echo flooded $n",
               60000);
    cr_expect_eq(r.exit_code, 0, "exit %d: %s", r.exit_code, r.stderr_data);
    int flooded = -1;
    cr_expect_eq(sscanf(r.stdout_data, "flooded %d", &flooded), 1, "%s", r.stdout_data);
    cr_expect_gt(flooded, 0, "no pipe of the shell was found to flood: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "ctl", "echo $KEEP $PWD; grep VmRSS /proc/1/status | tr -dc 0-9", 0);
    char keep[32] = "", pwd[64] = "";
    long after = 0;
    cr_expect_eq(sscanf(r.stdout_data, "%31s %63s %ld", keep, pwd, &after), 3, "%s",
                 r.stdout_data);
    cr_expect_str_eq(keep, "yes");
    cr_expect_str_eq(pwd, "/tmp");
    cr_expect_lt(after - before, 8192, "the agent grew from %ld to %ld kB", before, after);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, exit_terminates_the_session_and_the_next_call_gets_a_fresh_shell)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-exit");
    sbx_exec_result r = tsh_in(c, id, "ex", "export MARK=set; cd /tmp", 0);
    sbx_exec_result_free(&r);
    sbx_exec_opts o = {.command = "echo before; echo oops >&2; exit 3", .session_id = "ex"};
    sbx_error err;
    int rc = sbx_exec(c, id, &o, &r, &err);
    cr_expect_neq(rc, 0, "exit 3 in a session should fail the call");
    cr_expect_str_eq(err.code, "SESSION_TERMINATED", "code %s (%s)", err.code, err.message);
    /* The Cloudflare SDK's phrase, which ported programs match on
     * (/shell exited/ and /exit code:? 3/). */
    cr_expect(err.message && strstr(err.message, "shell exited") &&
                  strstr(err.message, "exit code: 3"),
              "message: %s", err.message ? err.message : "(null)");
    cr_expect_eq(r.exit_code, 3, "res.exit_code is %d", r.exit_code);
    cr_expect_str_eq(r.stdout_data ? r.stdout_data : "(null)", "before\n");
    cr_expect(r.stderr_data && !strncmp(r.stderr_data, "oops\n", 5), "stderr: %s",
              r.stderr_data ? r.stderr_data : "(null)");
    json_error_t je;
    json_t *ctx = err.context_json ? json_loads(err.context_json, 0, &je) : NULL;
    cr_expect(ctx != NULL, "SESSION_TERMINATED has no context");
    if (ctx) {
        cr_expect_eq(jint(ctx, "exitCode"), 3, "context: %s", err.context_json);
        json_decref(ctx);
    }
    sbx_error_free(&err);
    sbx_exec_result_free(&r);
    /* A fresh shell: the variable and the cwd are gone. */
    r = tsh_in(c, id, "ex", "echo \"${MARK:-gone} $(pwd)\"", 0);
    cr_expect_eq(r.exit_code, 0);
    cr_expect_str_eq(r.stdout_data, "gone /workspace\n", "after exit: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, session_terminated_reports_only_what_the_command_printed)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-exitout");
    sbx_exec_result r = tsh_in(c, id, "eo", "true", 0);
    sbx_exec_result_free(&r);
    sbx_exec_opts o = {.command = "echo out; echo err >&2; exit 4", .session_id = "eo"};
    sbx_error err;
    int rc = sbx_exec(c, id, &o, &r, &err);
    cr_expect_str_eq(err.code, "SESSION_TERMINATED", "rc %d code %s", rc, err.code);
    cr_expect_str_eq(r.stdout_data ? r.stdout_data : "(null)", "out\n");
    /* Not bash's own "exit" notice. */
    cr_expect_str_eq(r.stderr_data ? r.stderr_data : "(null)", "err\n",
                     "stderr of a command that ran `exit 4`: '%s'",
                     r.stderr_data ? r.stderr_data : "(null)");
    json_error_t je;
    json_t *ctx = err.context_json ? json_loads(err.context_json, 0, &je) : NULL;
    if (ctx) {
        cr_expect_str_eq(jstr(ctx, "stderr"), "err\n", "context stderr: '%s'",
                         jstr(ctx, "stderr"));
        json_decref(ctx);
    }
    sbx_error_free(&err);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, exit_as_the_first_command_of_a_fresh_shell)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-exit1");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    /* `exit 5` is the first thing the default session's shell ever runs. */
    sbx_exec_opts od = {.command = "exit 5"};
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(c, id, &od, &r, &err);
    cr_expect_neq(rc, 0, "exit 5 should fail the call");
    cr_expect_str_eq(err.code, "SESSION_TERMINATED", "exit 5 in a fresh shell: %s (%s)",
                     err.code, err.message);
    cr_expect_eq(r.exit_code, 5, "res.exit_code is %d", r.exit_code);
    sbx_error_free(&err);
    sbx_exec_result_free(&r);
    r = tsh(c, id, "echo alive", 0);
    cr_expect_str_eq(r.stdout_data, "alive\n");
    sbx_exec_result_free(&r);
    /* The container did not die over it. */
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "restarts"), 0, "the container restarted (lastExit: %s)",
                 jstr(sb, "lastExit"));
    json_decref(sb);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, create_existing_is_session_already_exists)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-dup");
    tcall t = tc_call(c, "session.create", id, json_pack("{s:s}", "id", "dup"), 0);
    tc_ok(t, "session.create");
    cr_expect_eq(jbool(t.res, "success"), 1);
    cr_expect_str_eq(jstr(t.res, "sessionId"), "dup");
    tc_free(&t);
    t = tc_call(c, "session.create", id, json_pack("{s:s}", "id", "dup"), 0);
    tc_fails_with(t, "session.create (again)", "SESSION_ALREADY_EXISTS");
    tc_free(&t);
    /* Without an id one is made up. */
    t = tc_call(c, "session.create", id, json_object(), 0);
    tc_ok(t, "session.create without id");
    cr_expect(strncmp(jstr(t.res, "sessionId"), "session-", 8) == 0, "made-up id '%s'",
              jstr(t.res, "sessionId"));
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, create_honours_cwd_env_and_command_timeout, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-opts");
    tcall t = tc_call(c, "session.create", id,
                      json_pack("{s:s, s:s, s:{s:s, s:s}, s:i}", "id", "opt", "cwd", "/tmp",
                                "env", "APP_MODE", "test", "SPACED", "a b", "commandTimeoutMs",
                                1000),
                      0);
    tc_ok(t, "session.create");
    tc_free(&t);
    sbx_exec_result r = tsh_in(c, id, "opt", "echo \"$(pwd)|$APP_MODE|$SPACED\"", 0);
    cr_expect_str_eq(r.stdout_data, "/tmp|test|a b\n", "session options: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    t = tc_call(c, "session.get", id, json_pack("{s:s}", "id", "opt"), 0);
    tc_ok(t, "session.get");
    cr_expect_eq(jint(t.res, "session.commandTimeoutMs"), 1000);
    tc_free(&t);
    /* commandTimeoutMs is the default timeout of its commands. */
    double t0 = test_now_ms();
    r = tsh_in(c, id, "opt", "sleep 10", 0);
    double took = test_now_ms() - t0;
    cr_expect_eq(r.exit_code, 124, "a command longer than commandTimeoutMs exited %d",
                 r.exit_code);
    cr_expect(r.timed_out, "timedOut not set");
    cr_expect(took < 5000, "took %.0f ms", took);
    sbx_exec_result_free(&r);
    /* Other sessions are not affected. */
    r = tsh(c, id, "sleep 1.5; echo fine", 0);
    cr_expect_eq(r.exit_code, 0, "default session exec exited %d", r.exit_code);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

/* As the Cloudflare SDK: a session whose cwd does not exist is created and
 * starts in $HOME (docs/protocol.md §3.2); session.get says where it is. */
Test(sessions, create_with_a_missing_cwd_starts_in_home, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-nocwd");
    tcall t = tc_call(c, "session.create", id,
                      json_pack("{s:s, s:s}", "id", "lost", "cwd", "/nonexistent"), 0);
    tc_ok(t, "session.create with a missing cwd");
    cr_expect_str_eq(jstr(t.res, "sessionId"), "lost");
    cr_expect_str_eq(jstr(t.res, "session.cwd"), "/root", "cwd reported: %s",
                     jstr(t.res, "session.cwd"));
    tc_free(&t);
    sbx_exec_result r = tsh_in(c, id, "lost",
                               "test \"$(pwd -P)\" = \"$(cd ~ && pwd -P)\" && echo home; "
                               "test -e /nonexistent || echo absent",
                               0);
    cr_expect_eq(r.exit_code, 0);
    cr_expect_str_eq(r.stdout_data, "home\nabsent\n", "in the session: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, delete_kills_its_processes_and_default_cannot_be_deleted, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-del");
    tcall t = tc_call(c, "session.create", id, json_pack("{s:s}", "id", "doomed"), 0);
    tc_ok(t, "session.create");
    tc_free(&t);
    sbx_exec_opts o = {.command = "sleep 1000", .session_id = "doomed"};
    char pid[128];
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &o, "doomed-sleeper", pid, &err), 0,
                 "process.start: %s %s", err.code, err.message);
    t = tc_call(c, "process.get", id, json_pack("{s:s}", "processId", pid), 0);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "running");
    cr_expect_str_eq(jstr(t.res, "process.sessionId"), "doomed");
    tc_free(&t);
    t = tc_call(c, "session.delete", id, json_pack("{s:s}", "id", "doomed"), 0);
    tc_ok(t, "session.delete");
    cr_expect_eq(jbool(t.res, "success"), 1);
    cr_expect_str_eq(jstr(t.res, "sessionId"), "doomed");
    tc_free(&t);
    /* The process is no longer running (allow it a moment to be reaped; the
     * bound is generous because CI machines run other suites beside us). */
    char st[32] = "";
    for (int i = 0; i < 150; i++) {
        t = tc_call(c, "process.get", id, json_pack("{s:s}", "processId", pid), 0);
        tc_ok(t, "process.get");
        snprintf(st, sizeof(st), "%s", jstr(t.res, "process.status"));
        tc_free(&t);
        if (strcmp(st, "running"))
            break;
        tsleep_ms(100);
    }
    cr_expect_str_neq(st, "running", "the session's process survived session.delete");
    /* SIGKILLed processes take a moment to be torn down and reaped. */
    sbx_exec_result r = {0};
    for (int i = 0; i < 100; i++) {
        sbx_exec_result_free(&r);
        r = tsh(c, id, "ps -eo comm= | grep -c '^sleep$' || true", 0);
        if (r.stdout_data && !strcmp(r.stdout_data, "0\n"))
            break;
        tsleep_ms(100);
    }
    cr_expect_str_eq(r.stdout_data, "0\n", "sleep processes left: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    t = tc_call(c, "session.get", id, json_pack("{s:s}", "id", "doomed"), 0);
    tc_fails_with(t, "session.get after delete", "SESSION_NOT_FOUND");
    tc_free(&t);
    t = tc_call(c, "session.delete", id, json_pack("{s:s}", "id", "default"), 0);
    tc_fails_with(t, "session.delete default", "VALIDATION_FAILED");
    tc_free(&t);
    /* The default session still works. */
    r = tsh(c, id, "echo still", 0);
    cr_expect_str_eq(r.stdout_data, "still\n");
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, unknown_session_is_session_not_found)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-unknown");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    tcall t = tc_call(c, "session.get", id, json_pack("{s:s}", "id", "no-such-session"), 0);
    tc_fails_with(t, "session.get", "SESSION_NOT_FOUND");
    tc_free(&t);
    t = tc_call(c, "session.delete", id, json_pack("{s:s}", "id", "no-such-session"), 0);
    tc_fails_with(t, "session.delete", "SESSION_NOT_FOUND");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

static void
timeout_keeps_state(const char *loop_cmd)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-tmo");
    sbx_exec_result r = tsh_in(c, id, "tm", "export KEPT=yes; cd /tmp; keptfn() { echo fn; }", 0);
    sbx_exec_result_free(&r);
    double t0 = test_now_ms();
    r = tsh_in(c, id, "tm", loop_cmd, 500);
    double took = test_now_ms() - t0;
    cr_expect_eq(r.exit_code, 124, "'%s' with timeout 500 exited %d", loop_cmd, r.exit_code);
    cr_expect(r.timed_out, "'%s': timedOut not set", loop_cmd);
    cr_expect_str_eq(r.cause, "TIMEOUT");
    cr_expect(took >= 450 && took < 4000, "'%s' took %.0f ms", loop_cmd, took);
    cr_expect(strstr(r.stderr_data, "Command timed out after 500ms") != NULL,
              "'%s': stderr lacks the timeout note: '%s'", loop_cmd, r.stderr_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "tm", "echo \"$KEPT $(pwd)\"; keptfn", 5000);
    cr_expect_eq(r.exit_code, 0, "after the timeout: exit %d", r.exit_code);
    cr_expect_str_eq(r.stdout_data, "yes /tmp\nfn\n",
                     "the shell lost its state after a timeout of '%s': %s", loop_cmd,
                     r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, timeout_of_a_child_keeps_the_shell_state, .timeout = 60)
{
    timeout_keeps_state("sleep 100");
}

Test(sessions, timeout_of_a_builtin_loop_keeps_the_shell_state, .timeout = 60)
{
    timeout_keeps_state("while :; do :; done");
}

/* What follows the timed-out part of a command line must not run: the whole
 * command is abandoned, as `timeout` is documented to stop "the command". */
static void
timeout_abandons_the_line(const char *first)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-tmo-rest");
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "%s; echo after-timeout; touch /workspace/ran-on", first);
    sbx_exec_result r = tsh_in(c, id, "tr", cmd, 500);
    cr_expect_eq(r.exit_code, 124, "'%s' exited %d", cmd, r.exit_code);
    cr_expect(strstr(r.stdout_data, "after-timeout") == NULL,
              "the rest of the command line ran after '%s' timed out: stdout '%s'", first,
              r.stdout_data);
    sbx_exec_result_free(&r);
    tsleep_ms(300);
    r = tsh_in(c, id, "tr", "test -e /workspace/ran-on && echo ran || echo not-run", 5000);
    cr_expect_str_eq(r.stdout_data, "not-run\n",
                     "a command after the timed-out '%s' ran anyway (touch)", first);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(sessions, timeout_of_a_child_abandons_the_rest_of_the_line, .timeout = 60)
{
    timeout_abandons_the_line("sleep 100");
}

Test(sessions, timeout_of_a_builtin_loop_abandons_the_rest_of_the_line, .timeout = 60)
{
    timeout_abandons_the_line("while :; do :; done");
}

Test(sessions, sessionless_exec_runs_in_a_fresh_process)
{
    sbx_client *c = test_client();
    char *id = test_id("sess-less");
    sbx_exec_opts o = {.command = "export SL=one; cd /tmp; echo \"$SL $$\"", .sessionless = true};
    sbx_exec_result r = tsh_opts(c, id, &o);
    cr_expect(strncmp(r.stdout_data, "one ", 4) == 0, "first: %s", r.stdout_data);
    int pid1 = atoi(r.stdout_data + 4);
    sbx_exec_result_free(&r);
    sbx_exec_opts o2 = {.command = "echo \"${SL:-unset} $(pwd) $$\"", .sessionless = true};
    r = tsh_opts(c, id, &o2);
    cr_expect(strncmp(r.stdout_data, "unset /workspace ", 17) == 0,
              "a sessionless exec saw the previous one's state: %s", r.stdout_data);
    int pid2 = atoi(r.stdout_data + 17);
    cr_expect_neq(pid1, pid2, "the same shell process ran both (pid %d)", pid1);
    sbx_exec_result_free(&r);
    /* Nor does the default session see it. */
    r = tsh(c, id, "echo ${SL:-unset}", 0);
    cr_expect_str_eq(r.stdout_data, "unset\n");
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}
