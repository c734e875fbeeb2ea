/*
 * test_exec.c — exec through the full path: client → gateway → shard →
 * actor → agent → process, against a private sbxd (tests/support).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/wire.h"
#include "../support/harness.h"
#include "../support/sdk.h"

static sbx_exec_result
sh(sbx_client *c, const char *id, const char *cmd, int64_t timeout)
{
    sbx_exec_result r;
    sbx_error err;
    int rc = test_sh(c, id, cmd, timeout, &r, &err);
    cr_assert_eq(rc, 0, "exec '%s' failed: %s %s", cmd, err.code, err.message);
    return r;
}

Test(exec, exit_codes_are_returned)
{
    sbx_client *c = test_client();
    char *id = test_id("codes");
    static const struct {
        const char *cmd;
        int code;
    } cases[] = {{"true", 0}, {"false", 1}, {"(exit 3)", 3}, {"no-such-command-anywhere", 127}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        sbx_exec_result r = sh(c, id, cases[i].cmd, 0);
        cr_expect_eq(r.exit_code, cases[i].code, "'%s' exited %d, expected %d", cases[i].cmd,
                     r.exit_code, cases[i].code);
        cr_expect_eq(r.success, cases[i].code == 0);
        sbx_exec_result_free(&r);
    }
    /* The same codes from fresh processes (sessionless) and from an argv. */
    sbx_exec_opts o = {.command = "exit 3", .sessionless = true};
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(sbx_exec(c, id, &o, &r, &err), 0);
    cr_expect_eq(r.exit_code, 3);
    sbx_exec_result_free(&r);
    const char *argv[] = {"no-such-binary", NULL};
    sbx_exec_opts o2 = {.argv = argv, .sessionless = true};
    cr_assert_eq(sbx_exec(c, id, &o2, &r, &err), 0);
    cr_expect_eq(r.exit_code, 127);
    cr_expect(strstr(r.stderr_data, "no-such-binary") != NULL);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(exec, stdout_and_stderr_are_kept_apart)
{
    sbx_client *c = test_client();
    char *id = test_id("streams");
    sbx_exec_result r = sh(c, id, "echo to-out; echo to-err >&2; echo more-out", 0);
    cr_expect_str_eq(r.stdout_data, "to-out\nmore-out\n");
    cr_expect_str_eq(r.stderr_data, "to-err\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(exec, twenty_megabytes_of_output_arrive_intact, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("big");
    /* 20,000,000 bytes of a non-repeating pattern: line numbers. */
    sbx_exec_result r =
        sh(c, id, "seq 1 3000000 | head -c 20000000; seq 1 3 >&2", 0);
    cr_assert_eq(r.exit_code, 0);
    cr_assert_eq(r.stdout_len, 20000000u, "got %zu bytes", r.stdout_len);
    cr_expect(!r.stdout_truncated);
    cr_expect_str_eq(r.stderr_data, "1\n2\n3\n");
    /* Check the content: it must be exactly what seq prints. */
    char expect[32];
    size_t off = 0;
    bool same = true;
    for (unsigned n = 1; off < r.stdout_len && same; n++) {
        int k = snprintf(expect, sizeof(expect), "%u\n", n);
        size_t m = (size_t)k < r.stdout_len - off ? (size_t)k : r.stdout_len - off;
        same = memcmp(r.stdout_data + off, expect, m) == 0;
        off += m;
    }
    cr_expect(same, "the output differs from seq's at byte %zu", off);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(exec, timeout_kills_the_process_tree, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("timeout");
    /* The container is started first: its start-up is not the command's
     * time (the check below allows 2 s past the deadline). */
    sbx_error perr;
    cr_assert_eq(sbx_ping(c, id, &perr), 0, "ping: %s", perr.message);
    /* Both sessionless and in the default session. */
    for (int mode = 0; mode < 2; mode++) {
        sbx_exec_opts o = {.command = "sh -c 'sleep 100 & sleep 100'", .timeout_ms = 1000,
                           .sessionless = mode == 0};
        sbx_exec_result r;
        sbx_error err;
        double t0 = test_now_ms();
        cr_assert_eq(sbx_exec(c, id, &o, &r, &err), 0, "%s", err.message);
        double took = test_now_ms() - t0;
        cr_expect_eq(r.exit_code, 124, "mode %d: exit %d", mode, r.exit_code);
        cr_expect(r.timed_out);
        cr_expect_str_eq(r.cause, "TIMEOUT");
        cr_expect(strstr(r.stderr_data, "timed out") != NULL, "stderr: %s", r.stderr_data);
        cr_expect(took >= 1000 && took < 3000, "mode %d took %.0f ms", mode, took);
        sbx_exec_result_free(&r);
        /* Nothing of the tree is left. */
        r = sh(c, id, "ps -eo comm= | grep -c '^sleep$' || true", 0);
        cr_expect_str_eq(r.stdout_data, "0\n", "mode %d: sleep processes left: %s", mode,
                         r.stdout_data);
        sbx_exec_result_free(&r);
    }
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(exec, per_call_env_and_cwd)
{
    sbx_client *c = test_client();
    char *id = test_id("envcwd");
    const char *env[] = {"GREETING=hello world", "EMPTY=", NULL};
    sbx_exec_opts o = {.command = "echo \"$GREETING|$EMPTY|$(pwd)\"", .env = env, .cwd = "/tmp"};
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(sbx_exec(c, id, &o, &r, &err), 0, "%s", err.message);
    cr_expect_str_eq(r.stdout_data, "hello world||/tmp\n");
    sbx_exec_result_free(&r);
    /* They apply to that call only. */
    r = sh(c, id, "echo \"${GREETING:-unset}|$(pwd)\"", 0);
    cr_expect_str_eq(r.stdout_data, "unset|/workspace\n");
    sbx_exec_result_free(&r);
    /* A cwd that does not exist is an error, not a silent fallback. */
    sbx_exec_opts bad = {.command = "true", .cwd = "/no/such/dir"};
    cr_expect_neq(sbx_exec(c, id, &bad, &r, &err), 0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    sbx_error_free(&err);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

struct par {
    sbx_client *c;
    char *id;
    int rc, code;
};

static void *
run_sleep(void *arg)
{
    struct par *p = arg;
    sbx_exec_result r;
    sbx_error err;
    p->rc = test_sh(p->c, p->id, "sleep 1", 0, &r, &err);
    if (p->rc == 0) {
        p->code = r.exit_code;
        sbx_exec_result_free(&r);
    }
    return NULL;
}

Test(exec, ten_sandboxes_run_in_parallel, .timeout = 120)
{
    sbx_client *c = test_client();
    struct par p[10];
    pthread_t th[10];
    /* Create them first so the measurement is about running, not starting. */
    for (int i = 0; i < 10; i++) {
        p[i].c = c;
        p[i].id = test_id("par");
        cr_assert_eq(sbx_ping(c, p[i].id, NULL), 0);
    }
    double t0 = test_now_ms();
    for (int i = 0; i < 10; i++)
        pthread_create(&th[i], NULL, run_sleep, &p[i]);
    for (int i = 0; i < 10; i++)
        pthread_join(th[i], NULL);
    double took = test_now_ms() - t0;
    for (int i = 0; i < 10; i++) {
        cr_expect_eq(p[i].rc, 0);
        cr_expect_eq(p[i].code, 0);
        sbx_destroy(c, p[i].id, NULL, NULL);
        free(p[i].id);
    }
    /* Serially this takes ten seconds; in parallel about one. */
    cr_expect(took < 5000, "10 x sleep 1 took %.0f ms", took);
    sbx_client_close(c);
}

struct ordered {
    sbx_client *c;
    const char *id;
    const char *cmd;
};

static void *
run_cmd(void *arg)
{
    struct ordered *o = arg;
    sbx_exec_result r;
    sbx_error err;
    if (test_sh(o->c, o->id, o->cmd, 0, &r, &err) == 0)
        sbx_exec_result_free(&r);
    return NULL;
}

Test(exec, execs_on_one_sandbox_keep_their_order)
{
    sbx_client *c = test_client();
    char *id = test_id("order");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    /* The first is slow; the second, sent while it runs, must still come after. */
    struct ordered a = {c, id, "sleep 0.5; echo first >> /workspace/log"};
    struct ordered b = {c, id, "echo second >> /workspace/log"};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, run_cmd, &a);
    usleep(100 * 1000);
    pthread_create(&tb, NULL, run_cmd, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    sbx_exec_result r = sh(c, id, "cat /workspace/log", 0);
    cr_expect_str_eq(r.stdout_data, "first\nsecond\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* The shard that owns sandbox `id`, as its record says: `create` makes the
 * record (no container) and answers with the sandbox's status.  Caller frees. */
static char *
shard_of(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    const msgpack_object *sb;
    sbx_str shard = {"", 0};
    cr_assert_eq(sbx_call(c, "create", id, NULL, 0, 0, NULL, &r, &err), 0, "create %s: %s %s", id,
                 err.code, err.message);
    cr_assert_eq(sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb), 0);
    cr_assert_eq(sbx_wire_get_str(sb, "shard", &shard), 0);
    char *s = sbx_str_dup(shard);
    sbx_reply_free(r);
    return s;
}

Test(exec, a_long_command_does_not_stall_other_sandboxes, .timeout = 60)
{
    sbx_client *c = test_client();
    /* Both on one shard (one loop, one store): random IDs would often land
     * on different shards and prove nothing about the shard itself.  IDs on
     * the other shard are destroyed as they are found. */
    char *slow = test_id("slow"), *fast = NULL;
    char *want = shard_of(c, slow);
    for (int i = 0; i < 64 && !fast; i++) {
        char *cand = test_id("fast");
        char *got = shard_of(c, cand);
        if (!strcmp(got, want)) {
            fast = cand;
        } else {
            sbx_destroy(c, cand, NULL, NULL);
            free(cand);
        }
        free(got);
    }
    cr_assert(fast != NULL, "no ID of 64 landed on shard %s", want);
    /* Both containers up first, so what runs is the command, not a start. */
    cr_assert_eq(sbx_ping(c, slow, NULL), 0);
    cr_assert_eq(sbx_ping(c, fast, NULL), 0);
    struct ordered a = {c, slow, "sleep 3"};
    pthread_t t;
    pthread_create(&t, NULL, run_cmd, &a);
    usleep(300 * 1000);
    double t0 = test_now_ms();
    sbx_exec_result r = sh(c, fast, "echo quick", 0);
    double took = test_now_ms() - t0;
    cr_expect_str_eq(r.stdout_data, "quick\n");
    cr_expect(took < 1000, "a quick exec waited %.0f ms behind another sandbox of shard %s", took,
              want);
    sbx_exec_result_free(&r);
    pthread_join(t, NULL);
    sbx_destroy(c, slow, NULL, NULL);
    sbx_destroy(c, fast, NULL, NULL);
    free(want);
    free(slow);
    free(fast);
    sbx_client_close(c);
}

Test(exec, argv_and_stdin)
{
    sbx_client *c = test_client();
    char *id = test_id("argv");
    /* Arguments arrive exactly, quotes and all, without a shell. */
    const char *argv[] = {"printf", "%s|", "a b", "'q'", "$HOME", NULL};
    sbx_exec_opts o = {.argv = argv};
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(sbx_exec(c, id, &o, &r, &err), 0);
    cr_expect_str_eq(r.stdout_data, "a b|'q'|$HOME|");
    sbx_exec_result_free(&r);
    sbx_exec_opts o2 = {.command = "tr a-z A-Z", .stdin_data = "hello\n", .stdin_len = 6,
                        .has_stdin = true};
    cr_assert_eq(sbx_exec(c, id, &o2, &r, &err), 0);
    cr_expect_str_eq(r.stdout_data, "HELLO\n");
    sbx_exec_result_free(&r);
    /* Without stdin data, stdin is /dev/null: cat returns at once. */
    r = sh(c, id, "cat; echo done", 5000);
    cr_expect_str_eq(r.stdout_data, "done\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(exec, real_programs_run)
{
    sbx_client *c = test_client();
    char *id = test_id("progs");
    sbx_exec_result r = sh(c, id,
                           "python3 -c 'import sys; print(sum(range(10)), sys.version_info[0])'; "
                           "node -e 'console.log([1,2,3].map(x => x * 2).join(\",\"))'; "
                           "git init -q /tmp/repo && git -C /tmp/repo status --short && echo git-ok",
                           60000);
    cr_expect_eq(r.exit_code, 0, "stderr: %s", r.stderr_data);
    cr_expect_str_eq(r.stdout_data, "45 3\n2,4,6\ngit-ok\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(exec, destroy_removes_the_sandbox)
{
    sbx_client *c = test_client();
    char *id = test_id("destroy");
    sbx_exec_result r = sh(c, id, "echo data > /workspace/f", 0);
    sbx_exec_result_free(&r);
    bool destroyed = false;
    cr_assert_eq(sbx_destroy(c, id, &destroyed, NULL), 0);
    cr_expect(destroyed);
    cr_assert_eq(sbx_destroy(c, id, &destroyed, NULL), 0, "destroy is idempotent");
    cr_expect(!destroyed);
    sbx_reply *rep = NULL;
    sbx_error err;
    cr_expect_neq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &rep, &err), 0);
    cr_expect_str_eq(err.code, "SANDBOX_NOT_FOUND");
    sbx_error_free(&err);
    /* The next use starts from nothing: the file is gone. */
    r = sh(c, id, "cat /workspace/f 2>/dev/null || echo gone", 0);
    cr_expect_str_eq(r.stdout_data, "gone\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* restarts_of — the sandbox's `restarts` (containers that ended unexpectedly). */
static int64_t
restarts_of(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0, "status: %s",
                 err.message);
    const msgpack_object *sb;
    int64_t n = -1;
    if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0)
        sbx_wire_get_i64(sb, "restarts", &n);
    sbx_reply_free(r);
    return n;
}

/* A result larger than a reply frame can carry is RESULT_TOO_LARGE, from the
 * agent, before it is sent: the shard would take the oversized frame for an
 * attack and replace the container (and /workspace with it).  With an
 * output cap of 40 MiB per stream, stdout and stderr of one exec add up to
 * more than the 72 MiB transport cap. */
Test(exec, a_result_too_large_for_a_reply_is_an_error_not_a_restart, .timeout = 240)
{
    struct testd d;
    static const char *const extra[] = {"--pool", "1", "--memory", "1G", "--output-cap", "40M",
                                        NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0);
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    const char *id = "big-result";
    sbx_exec_result r = sh(c, id, "echo keep > /workspace/marker", 0);
    sbx_exec_result_free(&r);
    const char *big = "head -c 40000000 /dev/zero; head -c 40000000 /dev/zero >&2";
    for (int sessionless = 0; sessionless < 2; sessionless++) {
        sbx_exec_opts o = {.command = big, .sessionless = sessionless};
        int rc = sbx_exec(c, id, &o, &r, &err);
        cr_expect_neq(rc, 0, "an exec with 80 MB of output succeeded (sessionless %d)",
                      sessionless);
        if (rc) {
            cr_expect_str_eq(err.code, "RESULT_TOO_LARGE", "sessionless %d: %s %s", sessionless,
                             err.code, err.message);
            cr_expect(err.context_json && strstr(err.context_json, "\"operation\":\"exec\""),
                      "context %s", err.context_json ? err.context_json : "-");
            sbx_error_free(&err);
        } else {
            sbx_exec_result_free(&r);
        }
        /* The same container, with its files, still serves. */
        cr_expect_eq(restarts_of(c, id), 0, "the container was replaced (sessionless %d)",
                     sessionless);
        r = sh(c, id, "cat /workspace/marker", 0);
        cr_expect_str_eq(r.stdout_data, "keep\n", "/workspace lost its files");
        sbx_exec_result_free(&r);
    }
    /* Under the cap the output arrives. */
    r = sh(c, id, "head -c 40000000 /dev/zero | wc -c; head -c 30000000 /dev/zero", 0);
    cr_expect_eq(r.exit_code, 0);
    cr_expect_eq(r.stdout_len, 9 + 30000000u, "stdout of %zu bytes", r.stdout_len);
    sbx_exec_result_free(&r);
    sbx_client_close(c);
    testd_stop(&d);
}

/* stream_last — read stream sid of sandbox id until it is done (60 s at
 * most); the last event as JSON (caller json_decref's), or NULL. */
static json_t *
stream_last(sbx_client *c, const char *id, const char *sid)
{
    long long after = 0;
    json_t *last = NULL;
    for (int i = 0; i < 60; i++) {
        tcall t = tc_call(c, "stream.read", id,
                          json_pack("{s:s, s:I, s:i}", "streamId", sid, "after",
                                    (json_int_t)after, "waitMs", 1000),
                          10000);
        tc_ok(t, "stream.read");
        json_t *evs = jget(t.res, "events");
        if (json_array_size(evs)) {
            if (last)
                json_decref(last);
            last = json_incref(json_array_get(evs, json_array_size(evs) - 1));
            after = jint(t.res, "next");
        }
        bool done = jbool(t.res, "done") == 1;
        tc_free(&t);
        if (done)
            break;
    }
    return last;
}

/* The complete event of an exec stream killed by the OOM killer says
 * OOM_KILLED, as exec's result does (it said KILLED), sessionless or not. */
Test(exec, a_streamed_command_killed_by_the_oom_killer_says_so, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("exec-oom-stream");
    for (int sessionless = 0; sessionless < 2; sessionless++) {
        tcall t = tc_call(c, "exec.stream", id,
                          json_pack("{s:s, s:b}", "command",
                                    "python3 -c 'b = bytearray(2 * 1024 ** 3)'", "sessionless",
                                    sessionless),
                          0);
        tc_ok(t, "exec.stream");
        char sid[80];
        snprintf(sid, sizeof(sid), "%s", jstr(t.res, "streamId"));
        tc_free(&t);
        json_t *last = stream_last(c, id, sid);
        cr_assert(last != NULL, "no events");
        cr_expect_str_eq(jstr(last, "type"), "complete");
        cr_expect_eq(jint(last, "exitCode"), 137);
        cr_expect_str_eq(jstr(last, "cause"), "OOM_KILLED", "sessionless %d: cause %s",
                         sessionless, jstr(last, "cause"));
        json_decref(last);
    }
    tdone(c, id);
    sbx_client_close(c);
}

/* The pids-limit counter is the whole sandbox's: a command that fails while
 * another process hits the limit is not PIDS_LIMIT (it was), unless its own
 * output says a fork was refused. */
Test(exec, pids_limit_is_blamed_only_on_the_command_that_hit_it, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("exec-pids-other");
    /* In the background, for 30 s: fork until refused, then keep trying
     * (each attempt refused) every 10 ms. */
    tcall t = tc_call(c, "process.start", id,
                      json_pack("{s:s, s:s}", "processId", "bomb", "command",
                                "python3 -c \"import os, time\n"
                                "end = time.time() + 30\n"
                                "try:\n"
                                "    while True:\n"
                                "        if os.fork() == 0:\n"
                                "            time.sleep(60); os._exit(0)\n"
                                "except OSError:\n"
                                "    pass\n"
                                "while time.time() < end:\n"
                                "    try:\n"
                                "        pid = os.fork()\n"
                                "        if pid == 0:\n"
                                "            os._exit(0)\n"
                                "        os.waitpid(pid, 0)\n"
                                "    except OSError:\n"
                                "        pass\n"
                                "    time.sleep(0.01)\""),
                      0);
    tc_ok(t, "process.start");
    tc_free(&t);
    long long hits = 0;
    for (int i = 0; i < 400 && hits <= 0; i++) {
        json_t *sb = ts_status(c, id);
        hits = jint(sb, "container.pidsLimitHits");
        json_decref(sb);
        if (hits <= 0)
            tsleep_ms(50);
    }
    cr_assert_gt(hits, 0, "the background process never hit the pids limit");
    tsleep_ms(200);
    /* Builtins only (nothing to fork), failing after 1.5 s of the others'
     * refused forks. */
    sbx_exec_result r = tsh(c, id, "SECONDS=0; while ((SECONDS < 2)); do :; done; false", 30000);
    cr_expect_eq(r.exit_code, 1);
    cr_expect_str_eq(r.cause, "EXITED", "a command that forked nothing is blamed: %s", r.cause);
    sbx_exec_result_free(&r);
    json_t *sb = ts_status(c, id);
    cr_expect_gt(jint(sb, "container.pidsLimitHits"), hits, "no fork was refused meanwhile");
    json_decref(sb);
    /* One whose output says its fork was refused is. */
    r = tsh(c, id,
            "SECONDS=0; while ((SECONDS < 2)); do :; done; "
            "echo 'bash: fork: retry: Resource temporarily unavailable' >&2; false",
            30000);
    cr_expect_eq(r.exit_code, 1);
    cr_expect_str_eq(r.cause, "PIDS_LIMIT", "cause %s", r.cause);
    sbx_exec_result_free(&r);
    t = tc_call(c, "process.kill", id, json_pack("{s:s}", "processId", "bomb"), 0);
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* A command without a timeout is stopped at the request's deadline, as a
 * timeout would stop it: the caller gets its result (it got
 * SHARD_UNAVAILABLE from the gateway) and the session is free at once (it
 * stayed busy with a command nobody waited for). */
Test(exec, a_command_ends_at_the_request_deadline_and_the_session_goes_on, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("exec-deadline");
    for (int sessionless = 0; sessionless < 2; sessionless++) {
        double t0 = test_now_ms();
        tcall t = tc_call(c, "exec", id,
                          json_pack("{s:s, s:b}", "command", "echo started; sleep 600",
                                    "sessionless", sessionless),
                          2500);
        double took = test_now_ms() - t0;
        tc_ok(t, "exec past its deadline");
        cr_expect_eq(jint(t.res, "exitCode"), 124, "sessionless %d", sessionless);
        cr_expect_eq(jbool(t.res, "timedOut"), 1);
        cr_expect_eq(jbool(t.res, "deadlineExceeded"), 1);
        cr_expect_str_eq(jstr(t.res, "cause"), "TIMEOUT");
        cr_expect_str_eq(jstr(t.res, "stdout"), "started\n");
        cr_expect(strstr(jstr(t.res, "stderr"), "the request's deadline") != NULL, "stderr: %s",
                  jstr(t.res, "stderr"));
        cr_expect(took < 2500, "answered after %.0f ms", took);
        tc_free(&t);
        /* The session takes the next command at once; nothing is left. */
        t0 = test_now_ms();
        t = tc_call(c, "exec", id,
                    json_pack("{s:s}", "command", "ps -eo comm= | grep -c '^sleep$' || true"),
                    5000);
        tc_ok(t, "the next exec");
        cr_expect_str_eq(jstr(t.res, "stdout"), "0\n", "sleep 600 still runs");
        cr_expect(test_now_ms() - t0 < 5000);
        tc_free(&t);
    }
    tdone(c, id);
    sbx_client_close(c);
}

/* A command queued in a busy session past its deadline is answered
 * REQUEST_TIMEOUT by the shard (it was SHARD_UNAVAILABLE from the gateway),
 * and it does not run later, when nobody hears of it. */
Test(exec, a_command_queued_past_its_deadline_never_runs, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("exec-queued");
    tcall t = tc_call(c, "exec.stream", id,
                      json_pack("{s:s, s:s}", "command", "sleep 3", "sessionId", "q"), 0);
    tc_ok(t, "exec.stream");
    tc_free(&t);
    double t0 = test_now_ms();
    t = tc_call(c, "exec", id, json_pack("{s:s, s:s}", "command", "touch /tmp/late", "sessionId", "q"),
                1500);
    double took = test_now_ms() - t0;
    tc_fails_with(t, "exec queued behind sleep 3", "REQUEST_TIMEOUT");
    cr_expect(t.err.context_json && strstr(t.err.context_json, "\"sandboxId\""),
              "not the shard's answer: %s (%s)", t.err.message,
              t.err.context_json ? t.err.context_json : "no context");
    cr_expect(took < 1500, "answered after %.0f ms", took);
    tc_free(&t);
    tsleep_ms(3000);
    sbx_exec_result r = tsh(c, id, "test -e /tmp/late && echo ran || echo not-run", 10000);
    cr_expect_str_eq(r.stdout_data, "not-run\n", "the abandoned command ran");
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}
