/*
 * test_isolation.c — what a program inside a sandbox can see and do, checked
 * from inside real sandboxes.  The deeper adversarial suite (escape
 * attempts, seccomp probes) lives in tests/security/.
 */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/wire.h"
#include "../support/harness.h"

static sbx_exec_result
sh(sbx_client *c, const char *id, const char *cmd, int64_t timeout)
{
    sbx_exec_result r;
    sbx_error err;
    int rc = test_sh(c, id, cmd, timeout, &r, &err);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "exec '%s' failed: %s %s", cmd, err.code, err.message);
    return r;
}

static int64_t
status_field(sbx_client *c, const char *id, const char *field)
{
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    const msgpack_object *sb, *ct;
    int64_t v = -1;
    if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0 &&
        sbx_wire_get_map(sb, "container", &ct) == 0)
        sbx_wire_get_i64(ct, field, &v);
    sbx_reply_free(r);
    return v;
}

Test(isolation, pid1_is_the_agent_and_no_host_process_is_visible)
{
    sbx_client *c = test_client();
    char *id = test_id("pid");
    sbx_exec_result r = sh(c, id, "cat /proc/1/comm", 0);
    cr_expect_str_eq(r.stdout_data, "sbx-agent\n");
    sbx_exec_result_free(&r);
    /* Every visible process belongs to the sandbox: the agent, the session
     * shell and this command's own processes — a handful, no sbxd. */
    r = sh(c, id, "for p in /proc/[0-9]*; do cat $p/comm; done 2>/dev/null | sort | uniq -c", 0);
    cr_expect(strstr(r.stdout_data, "sbxd") == NULL, "host processes visible:\n%s", r.stdout_data);
    cr_expect(strstr(r.stdout_data, "systemd") == NULL && strstr(r.stdout_data, "init\n") == NULL,
              "host processes visible:\n%s", r.stdout_data);
    sbx_exec_result_free(&r);
    r = sh(c, id, "ls -d /proc/[0-9]* | wc -l", 0);
    cr_expect(atoi(r.stdout_data) <= 8, "%d processes visible", atoi(r.stdout_data));
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(isolation, hostname_is_not_the_hosts)
{
    sbx_client *c = test_client();
    char *id = test_id("uts");
    char host[256] = "";
    gethostname(host, sizeof(host));
    sbx_exec_result r = sh(c, id, "hostname", 0);
    cr_expect(r.stdout_len > 1);
    char expect[300];
    snprintf(expect, sizeof(expect), "%s\n", host);
    cr_expect_str_neq(r.stdout_data, expect);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(isolation, only_loopback_exists)
{
    sbx_client *c = test_client();
    char *id = test_id("net");
    sbx_exec_result r = sh(c, id, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", 0);
    cr_expect_str_eq(r.stdout_data, "lo\n");
    sbx_exec_result_free(&r);
    /* Loopback works inside. */
    r = sh(c, id,
           "python3 -c \"import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); s.listen(); "
           "c=socket.create_connection(s.getsockname()); print('lo-ok')\"",
           20000);
    cr_expect_str_eq(r.stdout_data, "lo-ok\n", "stderr: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(isolation, system_directories_are_read_only)
{
    sbx_client *c = test_client();
    char *id = test_id("ro");
    sbx_exec_result r =
        sh(c, id,
           "for d in /usr /usr/bin /etc /bin /lib /; do touch $d/sbx-probe 2>/dev/null && "
           "echo \"wrote $d\"; done; echo checked",
           0);
    cr_expect_str_eq(r.stdout_data, "checked\n");
    sbx_exec_result_free(&r);
    r = sh(c, id, "touch /usr/x", 0);
    cr_expect_neq(r.exit_code, 0);
    cr_expect(strstr(r.stderr_data, "Read-only file system") != NULL, "%s", r.stderr_data);
    sbx_exec_result_free(&r);
    /* …and the writable ones are writable. */
    r = sh(c, id, "for d in /workspace /tmp /home /root; do echo x > $d/f && echo ok; done", 0);
    cr_expect_str_eq(r.stdout_data, "ok\nok\nok\nok\n", "stderr: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* Whether the device "major:minor" dev is that of a mount of the host's
 * (this test's) mount table. */
static bool
host_has_dev(const char *dev)
{
    FILE *f = fopen("/proc/self/mountinfo", "r");
    cr_assert(f != NULL);
    char *line = NULL;
    size_t cap = 0;
    bool found = false;
    while (!found && getline(&line, &cap, f) > 0) {
        char d[32];
        found = sscanf(line, "%*s %*s %31s", d) == 1 && !strcmp(d, dev);
    }
    free(line);
    fclose(f);
    return found;
}

/* The file systems a sandbox makes of its own (issue 18, density): the
 * devices of its mount table that the host's has not.  The writable tmpfs
 * (which also holds the read-only root, /run and /dev/shm), devpts, proc
 * and mqueue: 4, where there were 7.  Every superblock costs each memory
 * cgroup on the host a slot in its shrinker map (docs/benchmarks.md,
 * "Density"). */
Test(isolation, a_sandbox_makes_at_most_four_file_systems)
{
    sbx_client *c = test_client();
    char *id = test_id("sbs");
    sbx_exec_result r = sh(c, id, "cut -d' ' -f3 /proc/self/mountinfo | sort -u", 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.stderr_data);
    int own = 0;
    char list[512] = "";
    for (char *save = NULL, *dev = strtok_r(r.stdout_data, "\n", &save); dev;
         dev = strtok_r(NULL, "\n", &save)) {
        if (host_has_dev(dev))
            continue;
        own++;
        strncat(list, dev, sizeof(list) - strlen(list) - 2);
        strcat(list, " ");
    }
    cr_expect(own >= 3 && own <= 4, "%d file systems of the sandbox's own: %s", own, list);
    sbx_exec_result_free(&r);
    /* The root, /run and /dev/shm are on the writable file system. */
    r = sh(c, id, "stat -c %d / /workspace /tmp /home /run /dev/shm | sort -u | wc -l", 0);
    cr_expect_str_eq(r.stdout_data, "1\n", "stderr: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(isolation, no_capabilities_no_new_privs_seccomp_on)
{
    sbx_client *c = test_client();
    char *id = test_id("caps");
    sbx_exec_result r =
        sh(c, id, "grep -E '^(CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' "
                  "/proc/self/status | tr -s '\\t' ' '",
           0);
    cr_expect_str_eq(r.stdout_data,
                     "CapInh: 0000000000000000\nCapPrm: 0000000000000000\n"
                     "CapEff: 0000000000000000\nCapBnd: 0000000000000000\n"
                     "CapAmb: 0000000000000000\nNoNewPrivs: 1\nSeccomp: 2\n");
    sbx_exec_result_free(&r);
    /* The agent's memory, environment and fds are out of reach (listing the
     * fd numbers is allowed by procfs; opening or resolving them is not). */
    r = sh(c, id, "cat /proc/1/environ >/dev/null 2>&1 && echo environ; "
                  "readlink /proc/1/fd/3 >/dev/null 2>&1 && echo readlink; "
                  "cat /proc/1/fd/3 </dev/null >/dev/null 2>&1 && echo open-fd; "
                  "head -c1 /proc/1/mem >/dev/null 2>&1 && echo mem; "
                  "readlink /proc/1/exe >/dev/null 2>&1 && echo exe; echo end",
           0);
    cr_expect_str_eq(r.stdout_data, "end\n");
    sbx_exec_result_free(&r);
    /* No new namespaces. */
    r = sh(c, id, "unshare -U true 2>&1; echo rc=$?", 0);
    cr_expect(strstr(r.stdout_data, "rc=0") == NULL, "unshare worked: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(isolation, memory_limit_kills_with_137, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("oom");
    char *other = test_id("bystander");
    /* The daemon under test runs with --memory 256M. */
    sbx_exec_result r = sh(c, id,
                           "python3 -c 'b = bytearray(1024 * 1024 * 1024); print(len(b))'", 60000);
    cr_expect_eq(r.exit_code, 137, "exit %d, stderr %s", r.exit_code, r.stderr_data);
    cr_expect_str_eq(r.cause, "OOM_KILLED");
    sbx_exec_result_free(&r);
    /* The sandbox, the daemon and other sandboxes are fine. */
    r = sh(c, id, "echo alive", 0);
    cr_expect_str_eq(r.stdout_data, "alive\n");
    sbx_exec_result_free(&r);
    r = sh(c, other, "echo fine", 0);
    cr_expect_str_eq(r.stdout_data, "fine\n");
    sbx_exec_result_free(&r);
    cr_expect(status_field(c, id, "oomKills") >= 1);
    sbx_destroy(c, id, NULL, NULL);
    sbx_destroy(c, other, NULL, NULL);
    free(id);
    free(other);
    sbx_client_close(c);
}

Test(isolation, fork_bomb_is_stopped_by_the_pids_limit, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("bomb");
    char *other = test_id("calm");
    sbx_exec_result r = sh(c, other, "echo before", 0);
    sbx_exec_result_free(&r);
    /* The bomb outlives the bash that starts it; the timeout kills the whole
     * tree, bomb included (the command's process is a child subreaper). */
    sbx_exec_opts o = {.command = "bash -c ':(){ :|:& };:'; sleep 100", .timeout_ms = 3000,
                       .sessionless = true};
    sbx_error err;
    double t0 = test_now_ms();
    cr_assert_eq(sbx_exec(c, id, &o, &r, &err), 0, "%s %s", err.code, err.message);
    cr_expect(test_now_ms() - t0 < 30000);
    cr_expect_eq(r.exit_code, 124);
    sbx_exec_result_free(&r);
    /* The limit was hit, the bomb is gone, the sandbox still works. */
    cr_expect(status_field(c, id, "pidsLimitHits") > 0);
    int64_t pids = 0;
    for (int i = 0; i < 100; i++) {
        pids = status_field(c, id, "pids");
        if (pids >= 0 && pids < 10)
            break;
        usleep(100 * 1000);
    }
    cr_expect(pids < 10, "%lld processes left after the bomb", (long long)pids);
    r = sh(c, id, "echo recovered", 10000);
    cr_expect_str_eq(r.stdout_data, "recovered\n");
    sbx_exec_result_free(&r);
    r = sh(c, other, "echo after", 0);
    cr_expect_str_eq(r.stdout_data, "after\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, id, NULL, NULL);
    sbx_destroy(c, other, NULL, NULL);
    free(id);
    free(other);
    sbx_client_close(c);
}

Test(isolation, sandboxes_do_not_see_each_other)
{
    sbx_client *c = test_client();
    char *a = test_id("tenant-a"), *b = test_id("tenant-b");
    sbx_exec_result r = sh(c, a, "echo secret > /workspace/secret; sleep 30 &", 0);
    sbx_exec_result_free(&r);
    r = sh(c, b, "cat /workspace/secret 2>/dev/null || echo no-file; "
                 "pgrep -x sleep >/dev/null && echo sees-sleep || echo no-sleep",
           0);
    cr_expect_str_eq(r.stdout_data, "no-file\nno-sleep\n");
    sbx_exec_result_free(&r);
    sbx_destroy(c, a, NULL, NULL);
    sbx_destroy(c, b, NULL, NULL);
    free(a);
    free(b);
    sbx_client_close(c);
}
