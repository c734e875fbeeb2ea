/*
 * test_density.c — what an idle sandbox keeps and how a shard with many
 * stops (issue 18, density; figures in docs/benchmarks.md "Density"):
 *
 *   - the default session's shell, started while the container waited in
 *     the pool, ends when no command ran in it for AGENT_SHELL_UNUSED_MS
 *     after bind (container/agent/agent.h); the next command starts a
 *     shell that has the sandbox's environment, including env.set made
 *     before, and the default cwd.  A shell that ran a command is kept,
 *     with its state.
 *   - stopping the daemon ends the containers of every running sandbox
 *     (they are all killed first, then reaped: actors/actor.c
 *     actor_stop_all).
 *   - sbxd and its shards raise their soft descriptor limit to the hard
 *     one (tools/sbxd.c raise_nofile: a shard keeps 2 per sandbox, at 4096
 *     and above), so a sandbox still starts when sbxd was started with the
 *     usual soft limit of 1024.
 *
 * Each test starts a daemon of its own (the pool of 1 gives the prestarted
 * shell; the last test stops its daemon).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "../support/harness.h"
#include "../support/sdk.h"

static const char *const DAEMON_ARGS[] = {"--pool", "1", "--memory", "256M", "--pids", "128",
                                          "--disk", "64M", NULL};

static bool
shell_running(sbx_client *c, const char *id)
{
    tcall t = tc_call(c, "session.get", id, json_pack("{s:s}", "id", "default"), 0);
    tc_ok(t, "session.get");
    bool on = jbool(t.res, "session.shellRunning");
    tc_free(&t);
    return on;
}

Test(density, an_unused_default_shell_ends_and_the_next_command_starts_one, .timeout = 120)
{
    struct testd d;
    cr_assert_eq(testd_start(&d, 1, DAEMON_ARGS), 0);
    sbx_client *c = tc_client(d.url, 0);
    char *idle = test_id("dens-idle");
    char *used = test_id("dens-used");
    /* Both from the pool, their default shells already running. */
    double t0 = test_now_ms();
    tcall t = tc_call(c, "ping", idle, NULL, 0);
    tc_ok(t, "ping");
    tc_free(&t);
    const char *vars[] = {"DENS_VAR=from env.set", NULL};
    sbx_error err;
    cr_assert_eq(sbx_set_env(c, idle, vars, &err), 0, "env.set: %s", err.message);
    sbx_exec_result r = tsh(c, used, "cd /tmp && KEPT=yes", 0);
    cr_expect_eq(r.exit_code, 0);
    sbx_exec_result_free(&r);
    /* (Unless this machine is so slow that the 10 s went by already.) */
    bool on = shell_running(c, idle);
    cr_expect(on || test_now_ms() - t0 > 9000, "the prestarted default shell should run at first");
    /* Ended 10-20 s after bind (the agent's 10 s timer); allow 40 s. */
    double until = test_now_ms() + 40000;
    while (shell_running(c, idle) && test_now_ms() < until)
        tsleep_ms(500);
    cr_expect(!shell_running(c, idle), "the unused default shell is still running after 40 s");
    cr_expect(shell_running(c, used), "a default shell that ran a command must be kept");
    /* The next command starts a shell like the one that ended. */
    r = tsh(c, idle, "echo \"$DENS_VAR\"; pwd", 0);
    cr_expect_eq(r.exit_code, 0, "%s", r.stderr_data);
    cr_expect_str_eq(r.stdout_data, "from env.set\n/workspace\n", "fresh shell: %s",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    cr_expect(shell_running(c, idle), "the command should have started a shell");
    /* The used one kept its state. */
    r = tsh(c, used, "echo \"$KEPT\"; pwd", 0);
    cr_expect_str_eq(r.stdout_data, "yes\n/tmp\n", "kept shell: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, idle);
    tdone(c, used);
    sbx_client_close(c);
    testd_stop(&d);
}

Test(density, stopping_the_daemon_ends_every_container, .timeout = 180)
{
    enum { N = 24 };
    struct testd d;
    cr_assert_eq(testd_start(&d, 2, DAEMON_ARGS), 0);
    sbx_client *c = tc_client(d.url, 0);
    pid_t pids[N];
    for (int i = 0; i < N; i++) {
        char *id = test_id("dens-stop");
        sbx_exec_result r = tsh(c, id, "sleep 1000 & echo started", 0);
        cr_expect_str_eq(r.stdout_data, "started\n");
        sbx_exec_result_free(&r);
        json_t *st = ts_status(c, id);
        pids[i] = (pid_t)jint(st, "container.pid");
        json_decref(st);
        cr_assert_gt(pids[i], 1, "no container pid for %s", id);
        free(id);
    }
    sbx_client_close(c);
    testd_stop(&d); /* SIGTERM by pid, waits for sbxd */
    for (int i = 0; i < N; i++) {
        char path[64], comm[32] = "";
        snprintf(path, sizeof(path), "/proc/%d/comm", (int)pids[i]);
        FILE *f = fopen(path, "re");
        if (f) {
            if (!fgets(comm, sizeof(comm), f))
                comm[0] = '\0';
            fclose(f);
        }
        cr_expect(strncmp(comm, "sbx-agent", 9) != 0, "agent %d outlived its daemon",
                  (int)pids[i]);
    }
}

/* The soft and hard "Max open files" of a process (/proc/PID/limits); 0, or
 * -1 if it cannot be read.  "unlimited" reads as -1 in either. */
static int
proc_nofile(pid_t pid, long long *soft, long long *hard)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/limits", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    int rc = -1;
    while (fgets(line, sizeof(line), f)) {
        char s[32], h[32];
        if (sscanf(line, "Max open files %31s %31s", s, h) == 2) {
            *soft = strcmp(s, "unlimited") ? atoll(s) : -1;
            *hard = strcmp(h, "unlimited") ? atoll(h) : -1;
            rc = 0;
            break;
        }
    }
    fclose(f);
    return rc;
}

Test(density, the_daemon_raises_its_descriptor_limit, .timeout = 120)
{
    /* This test's process only (Criterion runs each test in its own): the
     * daemon inherits a soft limit of 1024 under a higher hard one. */
    struct rlimit rl;
    cr_assert_eq(getrlimit(RLIMIT_NOFILE, &rl), 0);
    if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max <= 1024)
        cr_skip_test("hard RLIMIT_NOFILE %llu: nothing to raise",
                     (unsigned long long)rl.rlim_max);
    rl.rlim_cur = 1024;
    cr_assert_eq(setrlimit(RLIMIT_NOFILE, &rl), 0);
    struct testd d;
    cr_assert_eq(testd_start(&d, 1, DAEMON_ARGS), 0);
    /* sbxd dev and its processes (the shard, started as children). */
    pid_t procs[8];
    int n = 0;
    procs[n++] = d.pid;
    DIR *dir = opendir("/proc");
    cr_assert_not_null(dir);
    struct dirent *de;
    while ((de = readdir(dir)) != NULL && n < 8) {
        pid_t pid = (pid_t)atoi(de->d_name);
        char path[64], buf[512];
        if (pid <= 0)
            continue;
        snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
        FILE *f = fopen(path, "re");
        if (!f)
            continue;
        size_t k = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        buf[k] = '\0';
        char *rp = strrchr(buf, ')');
        int ppid = 0;
        if (rp && sscanf(rp + 1, " %*c %d", &ppid) == 1 && ppid == (int)d.pid)
            procs[n++] = pid;
    }
    closedir(dir);
    cr_expect_geq(n, 2, "no shard process under sbxd %d", (int)d.pid);
    for (int i = 0; i < n; i++) {
        long long soft = 0, hard = 0;
        if (proc_nofile(procs[i], &soft, &hard) != 0)
            continue; /* exited meanwhile */
        cr_expect_eq(soft, hard, "process %d of sbxd: soft RLIMIT_NOFILE %lld, hard %lld",
                     (int)procs[i], soft, hard);
        cr_expect(soft == -1 || soft > 1024, "process %d: soft limit %lld not raised",
                  (int)procs[i], soft);
    }
    /* And a sandbox runs. */
    sbx_client *c = tc_client(d.url, 0);
    char *id = test_id("dens-nofile");
    sbx_exec_result r = tsh(c, id, "echo ok", 0);
    cr_expect_str_eq(r.stdout_data, "ok\n");
    sbx_exec_result_free(&r);
    free(id);
    sbx_client_close(c);
    testd_stop(&d);
}
