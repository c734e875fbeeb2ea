/*
 * test_cli.c — the `sbx` command-line tool (tools/sbx.c, tools/cli_sdk.c)
 * run as a child process against a private sbxd, checked the way a user
 * would check it: what it prints on stdout and stderr and its exit status.
 * exec (output, the command's exit code, 124 on timeout, --env, --cwd,
 * --stream, --stdin, `-- CMD ARGS`, --json), sessions, files (binary round
 * trips, ls, mkdir -p, mv, rm, FILE_NOT_FOUND, paths that try to leave the
 * sandbox), background processes (start, ps, wait, logs, kill), the code
 * interpreter, watch against a concurrent exec, env, configure, create,
 * status, list, ping, call, destroy; usage errors (exit 2) and an
 * unreachable gateway (exit 125).
 *
 * Every CLI run has a deadline: a CLI that hangs is killed and fails the
 * test.  The suite's .fini destroys the sandboxes a test made and reaps
 * the CLI processes it left running, even after a failed assertion.
 */
#include <criterion/criterion.h>
#include <nettle/sha2.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/clirun.h"
#include "../support/sdk.h"

/* ---------------------------------------------------------------------------------- */
/* what the tests leave behind: sandboxes and CLI processes */

static char *sandboxes[16];
static int nsandboxes;

/* new_id — a unique sandbox ID, destroyed by the suite's .fini whatever happens. */
static const char *
new_id(const char *prefix)
{
    cr_assert_lt(nsandboxes, (int)SBX_ARRAY_LEN(sandboxes));
    sandboxes[nsandboxes] = test_id(prefix);
    return sandboxes[nsandboxes++];
}

/* cleanup — the suite's .fini: reap the CLIs still running, destroy the sandboxes. */
static void
cleanup(void)
{
    cli_reap_all();
    if (nsandboxes == 0)
        return;
    sbx_client *c = test_client();
    for (int i = 0; i < nsandboxes; i++) {
        sbx_destroy(c, sandboxes[i], NULL, NULL);
        free(sandboxes[i]);
    }
    nsandboxes = 0;
    sbx_client_close(c);
}

TestSuite(cli, .fini = cleanup);

/* ---------------------------------------------------------------------------------- */

/* destroy — `sbx destroy ID`, which must work. */
static void
destroy(const char *id)
{
    struct cli r = sbx("destroy", id);
    char want[160];
    snprintf(want, sizeof(want), "%s: destroyed\n", id);
    expect_status(r, 0);
    expect_out(r, want);
    cli_free(&r);
}

/* ---------------------------------------------------------------------------------- */
/* exec */

Test(cli, exec_prints_output_and_exits_with_the_command_code, .timeout = 120)
{
    const char *id = new_id("cli-exec");
    struct cli r = sbx("exec", id, "echo out; echo err >&2; exit 3");
    expect_status(r, 3);
    expect_out(r, "out\n");
    expect_err(r, "err\n");
    cli_free(&r);
    /* `exit` ended the session's shell; the next command gets a fresh one. */
    r = sbx("exec", id, "echo after");
    expect_status(r, 0);
    expect_out(r, "after\n");
    expect_err(r, "");
    cli_free(&r);
    r = sbx("exec", id, "--sessionless", "echo x; exit 7");
    expect_status(r, 7);
    expect_out(r, "x\n");
    cli_free(&r);
    r = sbx("exec", id, "false");
    expect_status(r, 1);
    cli_free(&r);
    /* Killed by a signal: 128+N. */
    r = sbx("exec", id, "--sessionless", "kill -9 $$");
    expect_status(r, 137);
    cli_free(&r);

    /* --env and --cwd apply to this command only. */
    r = sbx("exec", id, "--env", "A=1", "--env", "B=x y", "--cwd", "/tmp",
            "echo \"$A|$B\"; pwd");
    expect_status(r, 0);
    expect_out(r, "1|x y\n/tmp\n");
    cli_free(&r);
    r = sbx("exec", id, "echo \"[$A]\"; pwd");
    expect_out(r, "[]\n/workspace\n");
    cli_free(&r);

    /* `-- CMD ARGS`: an argv, no shell. */
    r = sbx("exec", id, "--", "printf", "%s|", "a", "b c", "$HOME", "'q'");
    expect_status(r, 0);
    expect_out(r, "a|b c|$HOME|'q'|");
    cli_free(&r);
    r = sbx("exec", id, "--", "sh", "-c", "exit 42");
    expect_status(r, 42);
    cli_free(&r);

    /* --timeout: 124, the session survives. */
    double t0 = test_now_ms();
    r = sbx("exec", id, "--timeout", "1s", "echo started; sleep 60");
    expect_status(r, 124);
    expect_out(r, "started\n");
    expect_err_has(r, "timed out");
    cr_expect_lt(test_now_ms() - t0, 30000, "a 1 s timeout took %.0f ms", test_now_ms() - t0);
    cli_free(&r);
    r = sbx("exec", id, "--timeout", "500", "sleep 60");
    expect_status(r, 124);
    cli_free(&r);
    r = sbx("exec", id, "echo alive");
    expect_out(r, "alive\n");
    cli_free(&r);
    destroy(id);
}

/* --env has one encoding, the library's (sbx_exec_opts.env), whichever way
 * the result is printed: NAME=VALUE sets NAME for this command; an entry
 * without a name and '=' is VALIDATION_FAILED before anything runs (exit
 * 125), where `--json exec` used to drop it silently. */
Test(cli, exec_env_is_the_same_with_and_without_json, .timeout = 120)
{
    const char *id = new_id("cli-env1");
    struct cli r = sbx("exec", id, "--env", "FOO=bar", "echo \"[$FOO]\"");
    expect_status(r, 0);
    expect_out(r, "[bar]\n");
    cli_free(&r);
    r = sbx("--json", "exec", id, "--env", "FOO=bar", "echo \"[$FOO]\"");
    expect_status(r, 0);
    json_t *j = json_of(&r);
    cr_expect_str_eq(json_string_value(json_object_get(j, "stdout")), "[bar]\n", "%s", r.o.p);
    json_decref(j);
    cli_free(&r);
    const char *bad[] = {"FOO", "=bar"};
    for (size_t b = 0; b < SBX_ARRAY_LEN(bad); b++)
        for (int json = 0; json < 2; json++) {
            const char *const plain[] = {"exec", id, "--env", bad[b], "echo ran", NULL};
            const char *const js[] = {"--json", "exec", id, "--env", bad[b], "echo ran", NULL};
            r = cli_run(test_url(), NULL, 0, json ? js : plain);
            expect_status(r, 125);
            expect_err_has(r, "sbx: VALIDATION_FAILED: ");
            expect_err_has(r, bad[b]);
            expect_out(r, "");
            cli_free(&r);
        }
}

Test(cli, exec_stdin_and_stream, .timeout = 120)
{
    const char *id = new_id("cli-stream");
    /* --stdin passes bytes through unchanged: every byte value. */
    char bytes[256];
    for (int i = 0; i < 256; i++)
        bytes[i] = (char)i;
    struct cli r = sbx_in(bytes, sizeof(bytes), "exec", id, "--stdin", "cat");
    expect_status(r, 0);
    cr_expect(r.o.len == sizeof(bytes) && !memcmp(r.o.p, bytes, sizeof(bytes)),
              "stdin came back as %zu different bytes", r.o.len);
    cli_free(&r);
    r = sbx_in("one\ntwo\n", 8, "exec", id, "--stdin", "--sessionless", "wc -l");
    expect_out(r, "2\n");
    cli_free(&r);

    /* --stream prints the output and exits with the command's code. */
    r = sbx("exec", id, "--stream", "--sessionless", "echo s1; sleep 0.3; echo s2 >&2; exit 6");
    expect_status(r, 6);
    expect_out(r, "s1\n");
    expect_err(r, "s2\n");
    cli_free(&r);
    /* `exit N` in a session ends its shell (SESSION_TERMINATED): still the
     * command's code, as without --stream. */
    r = sbx("exec", id, "--stream", "echo s1; sleep 0.3; echo s2 >&2; exit 5");
    expect_status(r, 5);
    expect_out(r, "s1\n");
    /* bash's own "exit" announcement is not the command's output */
    expect_err(r, "s2\n");
    cli_free(&r);
    /* …but a command that prints the line "exit" itself keeps it. */
    r = sbx("exec", id, "--stream", "echo exit >&2; printf 'x\\nexit\\n' >&2");
    expect_status(r, 0);
    expect_err(r, "exit\nx\nexit\n");
    cli_free(&r);
    r = sbx("exec", id, "--stream", "--", "sh", "-c", "echo argv; exit 9");
    expect_status(r, 9);
    expect_out(r, "argv\n");
    cli_free(&r);
    r = sbx("exec", id, "--stream", "--timeout", "1s", "echo a; sleep 60");
    expect_status(r, 124);
    expect_out(r, "a\n");
    cli_free(&r);
    r = sbx_in(bytes, sizeof(bytes), "exec", id, "--stream", "--stdin", "wc -c");
    expect_status(r, 0);
    expect_out(r, "256\n");
    cli_free(&r);

    /* --json: the result map, and still the command's exit code. */
    r = sbx("--json", "exec", id, "--sessionless", "echo j; echo k >&2; exit 2");
    expect_status(r, 2);
    json_t *j = json_of(&r);
    cr_expect_eq(jint(j, "exitCode"), 2);
    cr_expect_eq(jbool(j, "success"), 0);
    cr_expect_str_eq(jstr(j, "stdout"), "j\n");
    cr_expect_str_eq(jstr(j, "stderr"), "k\n");
    json_decref(j);
    cli_free(&r);
    r = sbx("--json", "exec", id, "echo before-exit; exit 4");
    expect_status(r, 4);
    j = json_of(&r);
    cr_expect_eq(jint(j, "exitCode"), 4);
    cr_expect_str_eq(jstr(j, "stdout"), "before-exit\n");
    /* a script can tell the shell's exit from an ordinary `exit 4` */
    cr_expect_str_eq(jstr(j, "error"), "SESSION_TERMINATED", "%s", r.o.p);
    json_decref(j);
    cli_free(&r);
    r = sbx("--json", "exec", id, "--stream", "--sessionless", "echo ev; exit 3");
    expect_status(r, 3);
    j = json_lines(&r);
    size_t n = json_array_size(j);
    cr_expect_geq(n, 3, "%zu events: %s", n, r.o.p);
    cr_expect_str_eq(jstr(j, "0.type"), "start");
    json_t *last = json_array_get(j, n - 1);
    cr_expect_str_eq(jstr(last, "type"), "complete");
    cr_expect_eq(jint(last, "exitCode"), 3);
    json_decref(j);
    cli_free(&r);
    destroy(id);
}

/* ---------------------------------------------------------------------------------- */
/* sessions */

Test(cli, sessions_keep_cwd_and_variables, .timeout = 120)
{
    const char *id = new_id("cli-sess");
    struct cli r = sbx("session", "create", id, "s1");
    expect_status(r, 0);
    expect_out(r, "s1 /workspace\n");
    cli_free(&r);
    r = sbx("session", "create", id, "s1");
    expect_fails(r, "SESSION_ALREADY_EXISTS");
    cli_free(&r);

    run_ok("exec", id, "--session", "s1", "cd /tmp && export FOO=bar && f() { echo fn; }");
    r = sbx("exec", id, "--session", "s1", "pwd; echo $FOO; f");
    expect_status(r, 0);
    expect_out(r, "/tmp\nbar\nfn\n");
    cli_free(&r);
    /* The default session is another shell. */
    r = sbx("exec", id, "pwd; echo \"[$FOO]\"");
    expect_out(r, "/workspace\n[]\n");
    cli_free(&r);

    run_ok("session", "create", id, "s2", "--cwd", "/home", "--env", "K=v w");
    r = sbx("exec", id, "--session", "s2", "pwd; echo \"$K\"");
    expect_out(r, "/home\nv w\n");
    cli_free(&r);

    r = sbx("session", "list", id);
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "SESSION", 7), "no header: %s", r.o.p);
    expect_out_has(r, "\ns1 ");
    expect_out_has(r, "\ns2 ");
    cli_free(&r);
    r = sbx("--json", "session", "list", id);
    expect_status(r, 0);
    json_t *j = json_of(&r), *arr = jget(j, "sessions");
    cr_assert(json_is_array(arr), "no sessions array: %s", r.o.p);
    bool found = false;
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!strcmp(jstr(json_array_get(arr, i), "id"), "s1")) {
            found = true;
            cr_expect_str_eq(jstr(json_array_get(arr, i), "cwd"), "/tmp");
        }
    cr_expect(found, "session list has no s1: %s", r.o.p);
    json_decref(j);
    cli_free(&r);

    r = sbx("session", "get", id, "s1");
    expect_status(r, 0);
    expect_out(r, "s1 /tmp\n");
    cli_free(&r);
    run_ok("session", "delete", id, "s1");
    r = sbx("session", "list", id);
    expect_out_lacks(r, "\ns1 ");
    cli_free(&r);
    r = sbx("session", "delete", id, "s1");
    expect_fails(r, "SESSION_NOT_FOUND");
    cli_free(&r);
    destroy(id);
}

/* ---------------------------------------------------------------------------------- */
/* files */

Test(cli, write_and_read_round_trip_bytes, .timeout = 120)
{
    const char *id = new_id("cli-files");
    /* From stdin: every byte value, NUL and invalid UTF-8 included. */
    char bytes[512];
    for (int i = 0; i < 512; i++)
        bytes[i] = (char)(255 - i % 256);
    struct cli r = sbx_in(bytes, sizeof(bytes), "write", id, "/workspace/bin.dat");
    expect_status(r, 0);
    expect_out(r, "");
    cli_free(&r);
    r = sbx("read", id, "/workspace/bin.dat");
    expect_status(r, 0);
    cr_expect(r.o.len == sizeof(bytes) && !memcmp(r.o.p, bytes, sizeof(bytes)),
              "read back %zu bytes that differ from the 512 written", r.o.len);
    cli_free(&r);
    r = sbx("exec", id, "--sessionless", "wc -c < /workspace/bin.dat; od -An -tx1 -N3 bin.dat");
    expect_out(r, "512\n ff fe fd\n");
    cli_free(&r);

    /* --content, a relative path (the session's cwd), Unicode. */
    const char *text = "héllo wörld ✓ — ☃\n";
    run_ok("write", id, "notes/u.txt", "--content", text);
    r = sbx("read", id, "/workspace/notes/u.txt");
    expect_status(r, 0);
    expect_out(r, text);
    cli_free(&r);
    /* A file past file.read's 32 MiB cap still reads in full: sbx read
     * streams it.  Text and binary mixed: the stream switches to base64 at
     * the first byte that is not UTF-8. */
    r = sbx("exec", id, "--sessionless",
            "{ head -c 20000000 /dev/zero | tr '\\0' a; head -c 20000000 /dev/urandom; } "
            "> /workspace/big && sha256sum < /workspace/big | cut -c1-64");
    expect_status(r, 0);
    char want[65] = "";
    snprintf(want, sizeof(want), "%.64s", r.o.p ? r.o.p : "");
    cli_free(&r);
    r = sbx("read", id, "/workspace/big");
    expect_status(r, 0);
    cr_expect_eq(r.o.len, 40000000u, "read %zu bytes of 40000000", r.o.len);
    {
        uint8_t d[SHA256_DIGEST_SIZE];
        struct sha256_ctx h;
        sha256_init(&h);
        sha256_update(&h, r.o.len, (const uint8_t *)r.o.p);
        sha256_digest(&h, sizeof(d), d);
        char hex[65];
        for (int i = 0; i < 32; i++)
            snprintf(hex + 2 * i, 3, "%02x", d[i]);
        cr_expect_str_eq(hex, want, "the bytes read back differ");
    }
    cli_free(&r);
    run_ok("exec", id, "rm /workspace/big");
    /* An empty stdin writes an empty file. */
    run_ok("write", id, "/workspace/empty");
    r = sbx("read", id, "/workspace/empty");
    expect_status(r, 0);
    cr_expect_eq(r.o.len, 0);
    cli_free(&r);

    r = sbx("ls", id);
    expect_status(r, 0);
    expect_out_has(r, " 512 bin.dat\n");
    expect_out_has(r, " notes/\n");
    cli_free(&r);

    run_ok("mkdir", id, "/workspace/a/b/c", "-p");
    r = sbx("mkdir", id, "/workspace/x/y");
    expect_status(r, 1);
    cli_free(&r);
    run_ok("mv", id, "/workspace/notes/u.txt", "/workspace/a/b/c/moved.txt");
    r = sbx("ls", id, "/workspace/a", "-r");
    expect_status(r, 0);
    expect_out_has(r, " b/\n");
    expect_out_has(r, " b/c/\n");
    expect_out_has(r, " b/c/moved.txt\n");
    cli_free(&r);
    r = sbx("read", id, "/workspace/a/b/c/moved.txt");
    expect_out(r, text);
    cli_free(&r);
    r = sbx("read", id, "/workspace/notes/u.txt");
    expect_fails(r, "FILE_NOT_FOUND");
    cli_free(&r);
    /* Hidden files only with -a. */
    run_ok("write", id, "/workspace/.hidden", "--content", "h");
    r = sbx("ls", id, "/workspace");
    expect_out_lacks(r, ".hidden");
    cli_free(&r);
    r = sbx("ls", id, "/workspace", "-a");
    expect_out_has(r, " .hidden\n");
    cli_free(&r);

    run_ok("rm", id, "/workspace/a/b/c/moved.txt");
    r = sbx("exec", id, "test -e /workspace/a/b/c/moved.txt && echo still || echo gone");
    expect_out(r, "gone\n");
    cli_free(&r);
    r = sbx("rm", id, "/workspace/a/b/c/moved.txt");
    expect_fails(r, "FILE_NOT_FOUND");
    cli_free(&r);
    r = sbx("rm", id, "/workspace/a");
    expect_fails(r, "IS_DIRECTORY");
    cli_free(&r);
    destroy(id);
}

Test(cli, missing_files_and_paths_that_try_to_leave_the_sandbox, .timeout = 120)
{
    const char *id = new_id("cli-paths");
    struct cli r = sbx("read", id, "/workspace/no-such-file");
    expect_fails(r, "FILE_NOT_FOUND");
    cli_free(&r);

    /* Paths resolve inside the sandbox (docs/protocol.md §3.4): `..` above
     * / stays at the sandbox's /, so this is its /etc/passwd... */
    struct cli inside = sbx("exec", id, "cat /etc/passwd");
    expect_status(inside, 0);
    r = sbx("read", id, "/workspace/../../../../etc/passwd");
    expect_status(r, 0);
    cr_expect_str_eq(r.o.p, inside.o.p, "read through .. differs from the sandbox's /etc/passwd");
    cli_free(&r);
    cli_free(&inside);
    /* ...which has no /etc/shadow, though the host has one. */
    if (access("/etc/shadow", F_OK) == 0) {
        r = sbx("read", id, "../../../etc/shadow");
        expect_fails(r, "FILE_NOT_FOUND");
        cli_free(&r);
    }
    /* A write through `..` lands in the sandbox's /tmp, not the host's. */
    char host[96], rel[128];
    snprintf(host, sizeof(host), "/tmp/sbx-cli-escape-%d", (int)getpid());
    snprintf(rel, sizeof(rel), "../../..%s", host);
    unlink(host);
    run_ok("write", id, rel, "--content", "escaped?");
    r = sbx("exec", id, "--", "cat", host);
    expect_status(r, 0);
    expect_out(r, "escaped?");
    cli_free(&r);
    cr_expect_neq(access(host, F_OK), 0, "the write through .. reached the host's %s", host);
    unlink(host);
    /* procfs is off limits; the system directories are read-only. */
    r = sbx("read", id, "/proc/self/environ");
    expect_fails(r, "PERMISSION_DENIED");
    cli_free(&r);
    r = sbx("write", id, "/etc/evil", "--content", "x");
    expect_fails(r, "READ_ONLY");
    cli_free(&r);
    destroy(id);
}

/* ---------------------------------------------------------------------------------- */
/* background processes */

Test(cli, background_processes, .timeout = 120)
{
    const char *id = new_id("cli-proc");
    struct cli r = sbx("start", id, "echo ready-now; echo to-err >&2; sleep 1000");
    assert_status(r, 0);
    char pid[128];
    snprintf(pid, sizeof(pid), "%.*s", (int)strcspn(r.o.p, "\n"), r.o.p);
    cr_assert(pid[0] && !strchr(pid, ' '), "start printed '%s'", r.o.p);
    cli_free(&r);

    r = sbx("ps", id);
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "ID", 2), "no header: %s", r.o.p);
    {
        char *line = strstr(r.o.p, pid);
        cr_expect(line && strstr(line, "running") && strstr(line, "sleep 1000"),
                  "ps does not list %s running:\n%s", pid, r.o.p);
    }
    cli_free(&r);

    r = sbx("wait", id, pid, "--log", "ready", "--timeout", "30s");
    expect_status(r, 0);
    expect_out(r, "ready-now\n");
    cli_free(&r);
    r = sbx("wait", id, pid, "--log", "never-printed", "--timeout", "300");
    expect_fails(r, "PROCESS_READY_TIMEOUT");
    cli_free(&r);
    r = sbx("logs", id, pid);
    expect_status(r, 0);
    expect_out(r, "ready-now\n");
    expect_err(r, "to-err\n");
    cli_free(&r);

    r = sbx("kill", id, pid);
    expect_status(r, 0);
    char want[200];
    snprintf(want, sizeof(want), "%s: killed (exit 143)\n", pid);
    expect_out(r, want);
    cli_free(&r);
    /* wait --exit exits with the process's code, as a shell's wait does */
    r = sbx("wait", id, pid, "--exit", "--timeout", "30s");
    expect_status(r, 143);
    expect_out(r, "exited 143\n");
    cli_free(&r);
    r = sbx("ps", id);
    {
        char *line = strstr(r.o.p, pid);
        cr_expect(line && strstr(line, "killed") && strstr(line, "143"),
                  "ps does not list %s killed:\n%s", pid, r.o.p);
    }
    cli_free(&r);

    /* A chosen ID, an argv, --env and --cwd; logs -f follows to the end and
     * exits with the process's code. */
    r = sbx("start", id, "--id", "job1", "--env", "X=y", "--cwd", "/tmp", "--", "sh", "-c",
            "echo \"$X $(pwd)\"; sleep 0.5; echo done; exit 3");
    expect_status(r, 0);
    expect_out(r, "job1\n");
    cli_free(&r);
    r = sbx("logs", id, "job1", "-f");
    expect_status(r, 3);
    expect_out(r, "y /tmp\ndone\n");
    cli_free(&r);
    r = sbx("--json", "wait", id, "job1", "--exit");
    expect_status(r, 3);
    json_t *j = json_of(&r);
    cr_expect_eq(jint(j, "exitCode"), 3);
    cr_expect_str_eq(jstr(j, "status"), "failed");
    json_decref(j);
    cli_free(&r);
    r = sbx("--json", "start", id, "sleep 1000");
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect(jstr(j, "processId")[0], "no processId: %s", r.o.p);
    json_decref(j);
    cli_free(&r);
    r = sbx("kill", id, "--all");
    expect_status(r, 0);
    expect_out(r, "1 process(es) killed\n");
    cli_free(&r);
    r = sbx("logs", id, "no-such-process");
    expect_fails(r, "PROCESS_NOT_FOUND");
    cli_free(&r);
    destroy(id);
}

/* ---------------------------------------------------------------------------------- */
/* code interpreter */

Test(cli, code_runs_python_with_persistent_contexts, .timeout = 120)
{
    const char *id = new_id("cli-code");
    struct cli r = sbx("code", id, "1+1");
    expect_status(r, 0);
    expect_out(r, "2\n");
    cli_free(&r);

    r = sbx("context", "create", id, "--lang", "python");
    assert_status(r, 0);
    char ctx[128];
    snprintf(ctx, sizeof(ctx), "%.*s", (int)strcspn(r.o.p, "\n"), r.o.p);
    cr_assert(ctx[0], "context create printed nothing");
    cli_free(&r);
    run_ok("code", id, "--context", ctx, "x = 41");
    r = sbx("code", id, "--context", ctx, "print('x is', x); x + 1");
    expect_status(r, 0);
    expect_out(r, "x is 41\n42\n");
    cli_free(&r);
    r = sbx("code", id, "--stream", "--context", ctx,
            "for i in range(3):\n    print('tick', i, flush=True)\nx * 2");
    expect_status(r, 0);
    expect_out(r, "tick 0\ntick 1\ntick 2\n82\n");
    cli_free(&r);
    /* A file, and an exception on stderr. */
    char path[96];
    snprintf(path, sizeof(path), "/tmp/sbx-cli-code-%d.py", (int)getpid());
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("y = 6 * 7\ny\n", f);
    fclose(f);
    r = sbx("code", id, "--context", ctx, "-f", path);
    unlink(path);
    expect_status(r, 0);
    expect_out(r, "42\n");
    cli_free(&r);
    /* Code that raises: the traceback on stderr and exit 1, streamed or not. */
    r = sbx("code", id, "--context", ctx, "1/0");
    expect_status(r, 1);
    expect_err_has(r, "ZeroDivisionError");
    cli_free(&r);
    r = sbx("code", id, "--stream", "--context", ctx, "print('before')\n1/0");
    expect_status(r, 1);
    expect_out(r, "before\n");
    expect_err_has(r, "ZeroDivisionError");
    cli_free(&r);
    r = sbx("--json", "code", id, "--context", ctx, "x");
    expect_status(r, 0);
    json_t *j = json_of(&r);
    cr_expect_str_eq(jstr(j, "results.0.text"), "41");
    cr_expect_str_eq(jstr(j, "contextId"), ctx);
    json_decref(j);
    cli_free(&r);

    r = sbx("contexts", id);
    expect_status(r, 0);
    expect_out_has(r, ctx);
    expect_out_has(r, "python");
    cli_free(&r);
    run_ok("context", "delete", id, ctx);
    r = sbx("contexts", id);
    expect_out_lacks(r, ctx);
    cli_free(&r);
    r = sbx("code", id, "--context", ctx, "x");
    expect_fails(r, "CONTEXT_NOT_FOUND");
    cli_free(&r);

    r = sbx("code", id, "--lang", "cobol", "DISPLAY 'HI'.");
    expect_fails(r, "VALIDATION_FAILED");
    cli_free(&r);
    r = sbx("context", "create", id, "--lang", "cobol");
    expect_fails(r, "VALIDATION_FAILED");
    cli_free(&r);
    destroy(id);
}

/* ---------------------------------------------------------------------------------- */
/* watch */

Test(cli, watch_prints_changes_made_by_another_exec, .timeout = 120)
{
    const char *id = new_id("cli-watch");
    run_ok("mkdir", id, "/workspace/w", "-p");
    struct cli w;
    cli_spawn(&w, test_url(), NULL, 0, (const char *const[]){"watch", id, "/workspace/w", NULL});
    /* Nothing says when the watch is in place: make new files until one shows. */
    char line[160] = "";
    bool seen = false;
    for (int i = 0; i < 60 && !seen; i++) {
        char cmd[128];
        snprintf(cmd, sizeof(cmd), "echo %d > /workspace/w/f%d.txt", i, i);
        run_ok("exec", id, "--sessionless", cmd);
        cli_pump(&w, 300);
        for (int k = 0; k <= i && !seen; k++) {
            char path[64];
            snprintf(path, sizeof(path), "/workspace/w/f%d.txt", k);
            snprintf(line, sizeof(line), "%-10s %s", "create", path);
            seen = has_line(w.o.p, line);
        }
        cr_assert(w.out >= 0, "watch ended early: %s %s", w.o.p, w.e.p);
    }
    cr_expect(seen, "watch printed no create:\n%s\nstderr: %s", w.o.p, w.e.p);
    /* A rename and a delete. */
    run_ok("exec", id, "--sessionless", "mv /workspace/w/f0.txt /workspace/w/g.txt && "
                                        "rm /workspace/w/g.txt");
    bool moved = false;
    for (int i = 0; i < 50 && !moved; i++) {
        cli_pump(&w, 200);
        moved = has_line(w.o.p, "delete     /workspace/w/g.txt");
    }
    cr_expect(has_line(w.o.p, "move_to    /workspace/w/g.txt"), "no move_to:\n%s", w.o.p);
    cr_expect(moved, "no delete:\n%s", w.o.p);
    kill(w.pid, SIGTERM);
    cli_finish(&w, 20000);
    expect_status(w, 128 + SIGTERM);
    expect_err(w, "");
    cli_free(&w);

    /* --json: one event per line, beginning with `watching`. */
    cli_spawn(&w, test_url(), NULL, 0,
              (const char *const[]){"--json", "watch", id, "/workspace/w", NULL});
    for (int i = 0; i < 100 && !strstr(w.o.p ? w.o.p : "", "\"watching\""); i++)
        cli_pump(&w, 200);
    run_ok("exec", id, "--sessionless", "touch /workspace/w/j.txt");
    for (int i = 0; i < 50 && !strstr(w.o.p, "/workspace/w/j.txt\""); i++)
        cli_pump(&w, 200);
    kill(w.pid, SIGTERM);
    cli_finish(&w, 20000);
    json_t *ev = json_lines(&w);
    cr_expect_str_eq(jstr(ev, "0.type"), "watching", "%s", w.o.p);
    bool created = false;
    for (size_t i = 0; i < json_array_size(ev); i++) {
        json_t *e = json_array_get(ev, i);
        if (!strcmp(jstr(e, "type"), "event") && !strcmp(jstr(e, "eventType"), "create") &&
            !strcmp(jstr(e, "path"), "/workspace/w/j.txt"))
            created = true;
    }
    cr_expect(created, "no create event for j.txt:\n%s", w.o.p);
    json_decref(ev);
    cli_free(&w);
    destroy(id);
}

/* ---------------------------------------------------------------------------------- */
/* env, configure, lifecycle */

/* `sbx changes ID PATH [--since V]` (file.checkChanges): "STATUS VERSION". */
Test(cli, changes_reports_a_version_and_what_happened_since, .timeout = 120)
{
    const char *id = new_id("cli-chg");
    run_ok("mkdir", id, "/workspace/c", "-p");
    struct cli r = sbx("changes", id, "/workspace/c");
    expect_status(r, 0);
    char ver[128] = "";
    cr_expect_eq(sscanf(r.o.p, "unchanged %127s", ver), 1, "first: %s", r.o.p);
    cli_free(&r);
    run_ok("exec", id, "--sessionless", "touch /workspace/c/new");
    r = sbx("changes", id, "/workspace/c", "--since", ver);
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "changed watch-", 14), "after a touch: %s", r.o.p);
    cli_free(&r);
    r = sbx("--json", "changes", id, "/workspace/c", "--since", "nonsense");
    expect_status(r, 1);
    cr_expect(strstr(r.o.p, "VALIDATION_FAILED") || strstr(r.e.p, "VALIDATION_FAILED"),
              "bad since: %s %s", r.o.p, r.e.p);
    cli_free(&r);
    destroy(id);
}

Test(cli, env_and_configure, .timeout = 120)
{
    const char *id = new_id("cli-env");
    struct cli r = sbx("env", id, "A1=one", "B1=two words");
    expect_status(r, 0);
    expect_out(r, "");
    cli_free(&r);
    r = sbx("exec", id, "--sessionless", "echo \"$A1/$B1\"");
    expect_out(r, "one/two words\n");
    cli_free(&r);
    r = sbx("exec", id, "echo \"$A1/$B1\"");
    expect_out(r, "one/two words\n");
    cli_free(&r);
    r = sbx("env", id, "-u", "A1", "C1=3");
    expect_status(r, 0);
    cli_free(&r);
    r = sbx("exec", id, "--sessionless", "echo \"[$A1]/$B1/$C1\"");
    expect_out(r, "[]/two words/3\n");
    cli_free(&r);
    r = sbx("--json", "env", id, "D1=4");
    expect_status(r, 0);
    json_t *j = json_of(&r);
    cr_expect_eq(jbool(j, "success"), 1);
    json_decref(j);
    cli_free(&r);

    r = sbx("configure", id, "--sleep-after", "5m", "--keep-alive", "on");
    expect_status(r, 0);
    expect_out(r, "sleepAfter 300s, keepAlive on\n");
    cli_free(&r);
    r = sbx("--json", "configure", id, "--keep-alive", "off");
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect_eq(jint(j, "sleepAfter"), 300000);
    cr_expect_eq(jbool(j, "keepAlive"), 0);
    json_decref(j);
    cli_free(&r);
    /* `status ID` prints the sandbox as JSON. */
    r = sbx("status", id);
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect_str_eq(jstr(j, "id"), id);
    cr_expect_eq(jint(j, "sleepAfter"), 300000);
    cr_expect_eq(jbool(j, "keepAlive"), 0);
    json_decref(j);
    cli_free(&r);
    r = sbx("configure", id, "--sleep-after", "forever");
    expect_fails(r, "VALIDATION_FAILED");
    cli_free(&r);
    destroy(id);
}

Test(cli, create_status_list_ping_call_and_destroy, .timeout = 120)
{
    const char *id = new_id("cli-life");
    struct cli r = sbx("create", id, "--memory", "128M", "--pids", "64");
    expect_status(r, 0);
    expect_out(r, "created\n");
    cli_free(&r);
    r = sbx("create", id);
    expect_status(r, 0);
    expect_out(r, "already existed\n");
    cli_free(&r);
    r = sbx("ping", id);
    expect_status(r, 0);
    expect_out(r, "ok\n");
    cli_free(&r);
    r = sbx("--json", "status", id);
    expect_status(r, 0);
    json_t *j = json_of(&r);
    cr_expect_str_eq(jstr(j, "sandbox.id"), id);
    cr_expect_str_eq(jstr(j, "sandbox.state"), "running");
    cr_expect_eq(jint(j, "sandbox.limits.memory"), 128ll << 20);
    cr_expect_eq(jint(j, "sandbox.limits.pids"), 64);
    json_decref(j);
    cli_free(&r);

    r = sbx("list");
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "ID ", 3), "no header: %s", r.o.p);
    {
        char want[128];
        snprintf(want, sizeof(want), "\n%s ", id);
        expect_out_has(r, want);
    }
    cli_free(&r);
    r = sbx("--json", "list");
    expect_status(r, 0);
    j = json_of(&r);
    json_t *arr = jget(j, "sandboxes");
    bool listed = false;
    for (size_t i = 0; i < json_array_size(arr); i++)
        if (!strcmp(jstr(json_array_get(arr, i), "id"), id))
            listed = true;
    cr_expect(listed, "list --json lacks %s", id);
    json_decref(j);
    cli_free(&r);

    /* The deployment: gateway and shards. */
    r = sbx("status");
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "gateway ", 8), "status: %s", r.o.p);
    expect_out_has(r, "\nSHARD ");
    cli_free(&r);
    r = sbx("--json", "status");
    expect_status(r, 0);
    j = json_of(&r);
    arr = jget(j, "shards");
    cr_expect_eq(json_array_size(arr), 2, "%s", r.o.p);
    for (size_t i = 0; i < json_array_size(arr); i++)
        cr_expect_str_eq(jstr(json_array_get(arr, i), "health"), "ok");
    json_decref(j);
    cli_free(&r);

    /* call: any operation, its result as JSON. */
    r = sbx("call", "exec", id, "{\"command\":\"echo via-call; exit 2\",\"sessionless\":true}");
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect_str_eq(jstr(j, "stdout"), "via-call\n");
    cr_expect_eq(jint(j, "exitCode"), 2);
    json_decref(j);
    cli_free(&r);
    r = sbx("call", "file.exists", id, "{\"path\":\"/etc/passwd\"}");
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect_eq(jbool(j, "exists"), 1);
    json_decref(j);
    cli_free(&r);
    r = sbx("call", "cluster.status", "-");
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect_eq(json_array_size(jget(j, "shards")), 2);
    json_decref(j);
    cli_free(&r);
    r = sbx("call", "launch.missiles", id, "{}");
    expect_fails(r, "UNKNOWN_OPERATION");
    cli_free(&r);
    r = sbx("call", "exec", id, "{not json");
    cr_expect_neq(r.status, 0, "call with bad JSON succeeded");
    expect_err_has(r, "VALIDATION_FAILED");
    cli_free(&r);

    /* destroy is idempotent. */
    destroy(id);
    char want[160];
    snprintf(want, sizeof(want), "%s: did not exist\n", id);
    r = sbx("destroy", id);
    expect_status(r, 0);
    expect_out(r, want);
    cli_free(&r);
    r = sbx("--json", "destroy", id);
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect_eq(jbool(j, "destroyed"), 0);
    cr_expect_str_eq(jstr(j, "id"), id);
    json_decref(j);
    cli_free(&r);
    r = sbx("status", id);
    expect_fails(r, "SANDBOX_NOT_FOUND");
    cli_free(&r);
    r = sbx("list");
    {
        char gone[128];
        snprintf(gone, sizeof(gone), "\n%s ", id);
        expect_out_lacks(r, gone);
    }
    cli_free(&r);
}

/* ---------------------------------------------------------------------------------- */
/* exit statuses of sbx itself */

Test(cli, usage_errors_exit_2_and_reach_nothing, .timeout = 120)
{
    const char *id = new_id("cli-usage");
    const char *const *bad[] = {
        (const char *const[]){NULL},
        (const char *const[]){"frobnicate", NULL},
        (const char *const[]){"--timeout", "soon", "list", NULL},
        (const char *const[]){"exec", NULL},
        (const char *const[]){"exec", id, NULL},
        (const char *const[]){"exec", id, "--", NULL},
        (const char *const[]){"exec", id, "--bogus", "echo", NULL},
        (const char *const[]){"exec", id, "--timeout", "abc", "echo", NULL},
        (const char *const[]){"exec", id, "echo", "two", NULL},
        (const char *const[]){"create", NULL},
        (const char *const[]){"create", id, "--memory", "lots", NULL},
        (const char *const[]){"create", id, "--memory", NULL},
        (const char *const[]){"create", id, "--cores", "2", NULL},
        (const char *const[]){"session", "frob", id, NULL},
        (const char *const[]){"session", "delete", id, NULL},
        (const char *const[]){"start", id, NULL},
        (const char *const[]){"start", id, "--bogus", "sleep 1", NULL},
        (const char *const[]){"wait", id, "p1", NULL},
        (const char *const[]){"wait", id, "p1", "--exit", "--log", "x", NULL},
        (const char *const[]){"kill", id, NULL},
        (const char *const[]){"logs", id, NULL},
        (const char *const[]){"logs", id, "p1", "extra", NULL},
        (const char *const[]){"read", id, NULL},
        (const char *const[]){"write", id, NULL},
        (const char *const[]){"mkdir", id, NULL},
        (const char *const[]){"mkdir", id, "/workspace/a", "/workspace/b", NULL},
        (const char *const[]){"rm", id, NULL},
        (const char *const[]){"mv", id, "/workspace/a", NULL},
        (const char *const[]){"ls", id, "/workspace", "extra", NULL},
        (const char *const[]){"watch", id, NULL},
        (const char *const[]){"env", id, NULL},
        (const char *const[]){"env", id, "=x", NULL},
        (const char *const[]){"configure", id, "--bogus", NULL},
        (const char *const[]){"code", id, NULL},
        (const char *const[]){"code", id, "--timeout", "abc", "1", NULL},
        (const char *const[]){"context", "frob", id, NULL},
        (const char *const[]){"ping", NULL},
        (const char *const[]){"destroy", NULL},
        (const char *const[]){"call", NULL},
        (const char *const[]){"cluster", "frob", NULL},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        struct cli r = cli_run(test_url(), NULL, 0, bad[i]);
        expect_status(r, 2);
        /* Told why (with no verb at all, the help on stdout). */
        cr_expect(r.e.len > 0 || (i == 0 && strstr(r.o.p, "usage: sbx")),
                  "%s: exit 2 without a word on stderr", r.what);
        cli_free(&r);
    }
    /* None of them reached the sandbox. */
    struct cli r = sbx("status", id);
    expect_fails(r, "SANDBOX_NOT_FOUND");
    cli_free(&r);
    /* Help is not an error. */
    r = sbx("--help");
    expect_status(r, 0);
    expect_out_has(r, "usage: sbx");
    expect_out_has(r, "exit status");
    cli_free(&r);
    r = sbx("exec", "--help");
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "usage: sbx exec ID", 18), "%s", r.o.p);
    cli_free(&r);
}

Test(cli, an_unreachable_gateway_exits_125, .timeout = 120)
{
    char gw[128];
    snprintf(gw, sizeof(gw), "ipc:///tmp/sbx-cli-nowhere-%d/gw.sock", (int)getpid());
    const char *const *verbs[] = {
        (const char *const[]){"exec", "nobody", "echo hi", NULL},
        (const char *const[]){"exec", "nobody", "--stream", "echo hi", NULL},
        (const char *const[]){"--json", "exec", "nobody", "echo hi", NULL},
        (const char *const[]){"list", NULL},
        (const char *const[]){"status", NULL},
        (const char *const[]){"read", "nobody", "/etc/passwd", NULL},
        (const char *const[]){"write", "nobody", "/workspace/f", "--content", "x", NULL},
        (const char *const[]){"session", "list", "nobody", NULL},
        (const char *const[]){"start", "nobody", "sleep 1", NULL},
        (const char *const[]){"logs", "nobody", "p1", "-f", NULL},
        (const char *const[]){"watch", "nobody", "/workspace", NULL},
        (const char *const[]){"code", "nobody", "--stream", "1", NULL},
        (const char *const[]){"destroy", "nobody", NULL},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(verbs); i++) {
        struct cli r = cli_run(gw, NULL, 0, verbs[i]);
        expect_status(r, 125);
        expect_err_has(r, "GATEWAY_UNAVAILABLE");
        expect_out(r, "");
        cli_free(&r);
    }
    struct cli r = cli_run("tcp://127.0.0.1:1", NULL, 0, (const char *const[]){"list", NULL});
    expect_status(r, 125);
    expect_err_has(r, "GATEWAY_UNAVAILABLE");
    cli_free(&r);
    /* Without --gateway: $SBX_GATEWAY. */
    setenv("SBX_GATEWAY", gw, 1);
    r = cli_run(NULL, NULL, 0, (const char *const[]){"list", NULL});
    expect_status(r, 125);
    expect_err_has(r, gw);
    cli_free(&r);
    setenv("SBX_GATEWAY", test_url(), 1);
    r = cli_run(NULL, NULL, 0, (const char *const[]){"status", NULL});
    expect_status(r, 0);
    cr_expect(!strncmp(r.o.p, "gateway ", 8), "status via $SBX_GATEWAY: %s", r.o.p);
    cli_free(&r);
    unsetenv("SBX_GATEWAY");
}
