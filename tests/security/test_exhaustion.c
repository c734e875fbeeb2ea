/*
 * test_exhaustion.c — resource exhaustion from inside a sandbox (issue 7,
 * part 2): a fork bomb, a memory bomb, a full disk, no inodes left, CPU
 * spinning, a command that never ends, `kill -9 -1`.  Each must be
 * contained to its sandbox and reported with its cause (the exec result's
 * cause/timedOut, status oomKills/pidsLimitHits/lastExit), while
 *
 *  - another sandbox (the bystander) keeps answering exec quickly — a thread
 *    runs `echo` in it every 100 ms for the whole attack and records the
 *    slowest answer;
 *  - the host keeps working — this process (on the host) can still fork,
 *    and the daemon answers cluster.status;
 *  - the attacked sandbox works again afterwards.
 *
 * The daemon under test runs with --memory 256M --pids 128 --disk 256M and
 * the default --cpu 1000 (tests/support/itest_main.c).  The scenarios take
 * a lock so they run one at a time even under `--jobs 2`: each measures the
 * bystander's latency against its own attack only.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

/* The slowest answer the bystander may give during an attack.  An idle exec
 * takes ~10-30 ms here (ASan build); the margin covers a loaded 2-core VM. */
#define BYSTANDER_MAX_MS 1500.0

/* ---------------------------------------------------------------------------------- */
/* One attack at a time. */

static int
serial_lock(void)
{
    const char *dir = getenv("SBX_TEST_DIR");
    char p[512];
    snprintf(p, sizeof(p), "%s/exhaustion.lock", dir ? dir : "/tmp");
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert(fd >= 0);
    cr_assert_eq(flock(fd, LOCK_EX), 0);
    return fd;
}

/* ---------------------------------------------------------------------------------- */
/* The bystander: another sandbox, asked `echo ok` every 100 ms. */

struct bystander {
    pthread_t th;
    sbx_client *c;
    char *id;
    atomic_bool stop;
    atomic_int runs;
    int failures;
    double max_ms;
    char last_error[256];
};

static void *
bystander_main(void *arg)
{
    struct bystander *b = arg;
    while (!atomic_load(&b->stop)) {
        sbx_exec_opts o = {.command = "echo ok", .sessionless = true, .timeout_ms = 20000};
        sbx_exec_result r;
        sbx_error err;
        double t0 = test_now_ms();
        int rc = sbx_exec(b->c, b->id, &o, &r, &err);
        double ms = test_now_ms() - t0;
        b->runs++;
        if (ms > b->max_ms)
            b->max_ms = ms;
        if (rc != 0 || r.exit_code != 0 || strcmp(r.stdout_data ? r.stdout_data : "", "ok\n")) {
            b->failures++;
            snprintf(b->last_error, sizeof(b->last_error), "rc %d %s %s exit %d", rc,
                     rc ? err.code : "", rc ? err.message : "", r.exit_code);
            if (rc)
                sbx_error_free(&err);
        }
        sbx_exec_result_free(&r);
        usleep(100 * 1000);
    }
    return NULL;
}

/* bystander_start — create the bystander sandbox, check it answers, start
 * asking it. */
static void
bystander_start(struct bystander *b)
{
    memset(b, 0, sizeof(*b));
    b->c = test_client();
    b->id = test_id("bystander");
    sbx_exec_result r = tsh(b->c, b->id, "echo ok", 30000);
    cr_assert_str_eq(r.stdout_data, "ok\n");
    sbx_exec_result_free(&r);
    cr_assert_eq(pthread_create(&b->th, NULL, bystander_main, b), 0);
    /* The attack starts once the bystander is being asked. */
    for (int i = 0; i < 100 && atomic_load(&b->runs) == 0; i++)
        tsleep_ms(20);
}

/* bystander_stop — stop asking; it must have answered every time, quickly. */
static void
bystander_stop(struct bystander *b, const char *attack)
{
    tsleep_ms(250); /* at least one answer after the attack */
    atomic_store(&b->stop, true);
    pthread_join(b->th, NULL);
    cr_log_info("%s: the bystander answered %d execs, slowest %.0f ms", attack,
                atomic_load(&b->runs), b->max_ms);
    cr_expect(b->runs >= 2, "%s: the bystander ran only %d execs", attack, b->runs);
    cr_expect_eq(b->failures, 0, "%s: %d bystander execs failed (last: %s)", attack, b->failures,
                 b->last_error);
    cr_expect(b->max_ms < BYSTANDER_MAX_MS, "%s: the bystander took %.0f ms to answer", attack,
              b->max_ms);
    tdone(b->c, b->id);
    sbx_client_close(b->c);
}

/* ---------------------------------------------------------------------------------- */
/* The host. */

/* host_ok — this host process can fork, and the daemon answers. */
static void
host_ok(sbx_client *c, const char *attack)
{
    pid_t p = fork();
    cr_assert(p >= 0, "%s: the host cannot fork", attack);
    if (p == 0)
        _exit(7);
    int st;
    cr_expect(waitpid(p, &st, 0) == p && WIFEXITED(st) && WEXITSTATUS(st) == 7);
    tcall t = tc_call(c, "cluster.status", NULL, NULL, 10000);
    tc_ok(t, "cluster.status");
    size_t i;
    json_t *s;
    json_array_foreach(jget(t.res, "shards"), i, s)
        cr_expect_str_eq(jstr(s, "health"), "ok", "%s: shard %s is %s", attack, jstr(s, "name"),
                         jstr(s, "health"));
    tc_free(&t);
}

/* ---------------------------------------------------------------------------------- */
/* Helpers. */

static sbx_exec_result
run(sbx_client *c, const char *id, const char *cmd, int64_t timeout_ms, bool sessionless)
{
    sbx_exec_opts o = {.command = cmd, .timeout_ms = timeout_ms, .sessionless = sessionless};
    return tsh_opts(c, id, &o);
}

/* works_again — the attacked sandbox answers a fresh command. */
static void
works_again(sbx_client *c, const char *id, const char *attack)
{
    sbx_exec_result r = run(c, id, "echo recovered", 30000, false);
    cr_expect_str_eq(r.stdout_data, "recovered\n", "%s: after the attack: exit %d, %s", attack,
                     r.exit_code, r.stderr_data);
    sbx_exec_result_free(&r);
}

/* create_with_memory — create `id` with its own memory limit. */
static void
create_with_memory(sbx_client *c, const char *id, long long bytes)
{
    tcall t = tc_call(c, "create", id,
                      json_pack("{s:{s:I}}", "limits", "memory", (json_int_t)bytes), 30000);
    tc_ok(t, "create");
    tc_free(&t);
}

static long long
status_int(sbx_client *c, const char *id, const char *path)
{
    json_t *sb = ts_status(c, id);
    long long v = jint(sb, path);
    json_decref(sb);
    return v;
}

/* wait_pids_below — the sandbox's process count falls under n (10 s). */
static long long
wait_pids_below(sbx_client *c, const char *id, long long n)
{
    long long pids = -1;
    for (int i = 0; i < 100; i++) {
        pids = status_int(c, id, "container.pids");
        if (pids >= 0 && pids < n)
            break;
        tsleep_ms(100);
    }
    return pids;
}

#define ATTACK(prefix)                                                                       \
    int lock_ = serial_lock();                                                               \
    sbx_client *c = test_client();                                                           \
    char *id = test_id(prefix);                                                              \
    struct bystander by
#define ATTACK_DONE(name)                                                                    \
    do {                                                                                     \
        host_ok(c, name);                                                                    \
        works_again(c, id, name);                                                            \
        tdone(c, id);                                                                        \
        sbx_client_close(c);                                                                 \
        close(lock_);                                                                        \
    } while (0)

/* ---------------------------------------------------------------------------------- */

Test(exhaustion, fork_bomb_hits_the_pids_limit, .timeout = 240)
{
    ATTACK("forkbomb");
    free(tsh_out(c, id, "true"));
    bystander_start(&by);
    /* 1. A bomb that gives up: every fork until EAGAIN, then exit 3.  Its
     *    children block on a pipe and leave when it exits. */
    sbx_exec_result r =
        run(c, id, TEST_FORK_UNTIL_REFUSED_PY, 60000, true);
    cr_expect_eq(r.exit_code, 3, "exit %d: %s %s", r.exit_code, r.stdout_data, r.stderr_data);
    cr_expect_str_eq(r.cause, "PIDS_LIMIT");
    cr_expect(strstr(r.stdout_data, " 11\n") != NULL, "fork did not fail with EAGAIN: %s",
              r.stdout_data);
    int forks = atoi(r.stdout_data);
    cr_expect(forks > 50 && forks < 128, "%d forks under pids.max 128", forks);
    sbx_exec_result_free(&r);
    long long hits = status_int(c, id, "container.pidsLimitHits");
    cr_expect(hits > 0, "pidsLimitHits %lld", hits);
    host_ok(c, "fork bomb (finite)");
    /* 2. The classic bomb, which never gives up: the timeout kills its whole
     *    tree (the command's process is a child subreaper). */
    r = run(c, id, "bash -c ':(){ :|:& };:'; sleep 100", 4000, true);
    cr_expect_eq(r.exit_code, 124);
    cr_expect(r.timed_out);
    cr_expect_str_eq(r.cause, "TIMEOUT");
    sbx_exec_result_free(&r);
    cr_expect(status_int(c, id, "container.pidsLimitHits") > hits, "the bomb never hit the limit");
    long long pids = wait_pids_below(c, id, 10);
    cr_expect(pids < 10, "%lld processes left after the bomb", pids);
    bystander_stop(&by, "fork bomb");
    ATTACK_DONE("fork bomb");
}

Test(exhaustion, memory_bomb_is_oom_killed_at_the_limit, .timeout = 240)
{
    ATTACK("membomb");
    free(tsh_out(c, id, "true"));
    bystander_start(&by);
    long long before = status_int(c, id, "container.oomKills");
    sbx_exec_result r = run(c, id,
                            "python3 -c 'b = []\nwhile True: b.append(bytearray(16 << 20))'",
                            60000, false);
    cr_expect_eq(r.exit_code, 137, "exit %d, stderr %s", r.exit_code, r.stderr_data);
    cr_expect_eq(r.signal, 9);
    cr_expect_str_eq(r.cause, "OOM_KILLED");
    sbx_exec_result_free(&r);
    json_t *sb = ts_status(c, id);
    cr_expect(jint(sb, "container.oomKills") > before, "oomKills %lld",
              jint(sb, "container.oomKills"));
    /* The cgroup held it: the peak never passed the limit (256 MiB). */
    cr_expect(jint(sb, "container.memoryPeakBytes") <= jint(sb, "limits.memory"),
              "peak %lld > limit %lld", jint(sb, "container.memoryPeakBytes"),
              jint(sb, "limits.memory"));
    cr_expect(jint(sb, "limits.memory") == 256ll << 20);
    /* The agent was not the victim. */
    cr_expect_eq(jint(sb, "restarts"), 0, "lastExit: %s", jstr(sb, "lastExit"));
    json_decref(sb);
    bystander_stop(&by, "memory bomb");
    ATTACK_DONE("memory bomb");
}

Test(exhaustion, full_disk_is_enospc_at_the_disk_cap, .timeout = 240)
{
    ATTACK("disk");
    /* Memory above the disk cap: tmpfs pages are charged to the sandbox's
     * memory cgroup, so with memory <= disk the memory limit would bind
     * first (the next test). */
    create_with_memory(c, id, 1ll << 30);
    bystander_start(&by);
    sbx_exec_result r = run(c, id,
                            "df -B1 --output=size /workspace | tail -1; "
                            "out=$(dd if=/dev/zero of=/workspace/big bs=1M count=400 2>&1); "
                            "echo dd=$?; echo \"$out\" | head -1; "
                            "dd if=/dev/zero of=/tmp/more bs=1M count=1 2>&1 | head -1; "
                            "df -B1 --output=used,avail /workspace | tail -1",
                            60000, false);
    char *nl = strchr(r.stdout_data, '\n');
    cr_assert(nl != NULL, "%s", r.stdout_data);
    cr_expect_eq(atoll(r.stdout_data), 256ll << 20, "/workspace size: %s", r.stdout_data);
    cr_expect(strstr(r.stdout_data, "No space left on device") != NULL, "%s", r.stdout_data);
    cr_expect(strstr(r.stdout_data, "dd=1\n") != NULL, "%s", r.stdout_data);
    /* /workspace, /tmp and /home share the one quota. */
    cr_expect(strstr(r.stdout_data, "'/tmp/more': No space left on device") != NULL,
              "/tmp is not under the same cap: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    /* /dev/shm and /run are directories of the same writable tmpfs
     * (container/agent/setup.c setup_rw_root): the one cap holds them too,
     * so with /workspace full they are full. */
    r = run(c, id,
            "for f in /dev/shm/x /run/x; do dd if=/dev/zero of=$f bs=1M count=1 2>&1 | "
            "grep -c 'No space'; done; df -B1 --output=size /dev/shm /run | tail -2 | tr -d ' '",
            60000, false);
    cr_expect_str_eq(r.stdout_data, "1\n1\n268435456\n268435456\n", "%s", r.stdout_data);
    sbx_exec_result_free(&r);
    /* Filled alone, /dev/shm stops at that cap (not above), and then
     * /workspace is full. */
    r = run(c, id,
            "rm -f /workspace/big /tmp/more /dev/shm/x /run/x; "
            "dd if=/dev/zero of=/dev/shm/x bs=1M count=400 2>&1 | grep -c 'No space'; "
            "stat -c %s /dev/shm/x; "
            "dd if=/dev/zero of=/workspace/y bs=1M count=1 2>&1 | grep -c 'No space'",
            60000, false);
    long long shm = -1;
    int full_shm = -1, full_ws = -1;
    cr_expect_eq(sscanf(r.stdout_data, "%d %lld %d", &full_shm, &shm, &full_ws), 3, "%s",
                 r.stdout_data);
    cr_expect_eq(full_shm, 1, "/dev/shm was not filled to ENOSPC: %s", r.stdout_data);
    cr_expect(shm > (200ll << 20) && shm <= (256ll << 20), "/dev/shm took %lld bytes", shm);
    cr_expect_eq(full_ws, 1, "/workspace had room beside a full /dev/shm: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "container.oomKills"), 0);
    cr_expect_eq(jint(sb, "restarts"), 0);
    json_decref(sb);
    /* Space is given back on delete. */
    r = run(c, id, "rm -f /workspace/big /tmp/more /dev/shm/x /run/x /workspace/y && "
                   "dd if=/dev/zero of=/workspace/f bs=1M count=8 2>/dev/null && echo written",
            60000, false);
    cr_expect_str_eq(r.stdout_data, "written\n", "%s", r.stderr_data);
    sbx_exec_result_free(&r);
    bystander_stop(&by, "full disk");
    ATTACK_DONE("full disk");
}

Test(exhaustion, filling_tmpfs_past_the_memory_limit_is_contained, .timeout = 240)
{
    ATTACK("tmpfsoom");
    free(tsh_out(c, id, "true"));
    bystander_start(&by);
    /* --disk 256M = --memory 256M: the files reach the memory limit first.
     * Their pages cannot be reclaimed (no swap), so the OOM killer picks a
     * process — possibly the agent itself, which ends the container (docs/
     * security.md, limits).  Either way it stays in the sandbox and is
     * reported. */
    /* dd as the command's own process (an argv, no shell): the shard
     * refines the cause to OOM_KILLED only for a main process SIGKILLed
     * while the cgroup's oom_kill count rose (container/agent/exec.c agent_refine_cause);
     * behind `sh -c` it would see the shell's plain exit 137. */
    const char *argv[] = {"dd", "if=/dev/zero", "of=/workspace/big", "bs=1M", "count=400", NULL};
    sbx_exec_opts o = {.argv = argv, .timeout_ms = 60000, .sessionless = true};
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(c, id, &o, &r, &err);
    if (rc == 0) {
        cr_log_info("dd: exit %d cause %s", r.exit_code, r.cause);
        cr_expect(r.exit_code != 0, "dd wrote 400 MiB into a 256 MiB sandbox");
        cr_expect(!strcmp(r.cause, "OOM_KILLED") || strstr(r.stderr_data, "No space"),
                  "cause %s, stderr %s", r.cause, r.stderr_data);
    } else {
        cr_log_info("dd: %s (%s)", err.code, err.message);
        cr_expect_str_eq(err.code, "CONTAINER_UNAVAILABLE", "%s", err.message);
        sbx_error_free(&err);
    }
    sbx_exec_result_free(&r);
    /* The file's pages still fill the memory cgroup: free them (file.delete
     * starts no process), then the sandbox works again.  The OOM killer may
     * have picked the default session's shell (tenant processes run at
     * oom_score_adj +500, the agent at 0): its next command reports that
     * once (SESSION_TERMINATED, the SDK's semantics) and starts a fresh one. */
    tcall del = tc_call(c, "file.delete", id, json_pack("{s:s}", "path", "/workspace/big"), 0);
    tc_free(&del);
    sbx_exec_opts again = {.command = "true"};
    if (sbx_exec(c, id, &again, &r, &err) != 0) {
        cr_expect(!strcmp(err.code, "SESSION_TERMINATED") || !strcmp(err.code, "CONTAINER_UNAVAILABLE"),
                  "after the OOM: %s %s", err.code, err.message);
        sbx_error_free(&err);
    } else {
        sbx_exec_result_free(&r);
    }
    /* Reported: an OOM kill in this container, or the container's end with
     * its cause. */
    free(tsh_out(c, id, "true"));
    json_t *sb = ts_status(c, id);
    cr_expect(jint(sb, "container.oomKills") > 0 ||
                  (jint(sb, "restarts") > 0 && strstr(jstr(sb, "lastExit"), "memory")),
              "not reported: oomKills %lld, restarts %lld, lastExit '%s'",
              jint(sb, "container.oomKills"), jint(sb, "restarts"), jstr(sb, "lastExit"));
    json_decref(sb);
    bystander_stop(&by, "tmpfs past the memory limit");
    ATTACK_DONE("tmpfs past the memory limit");
}

Test(exhaustion, no_inodes_left_is_enospc_at_the_inode_cap, .timeout = 240)
{
    ATTACK("inodes");
    /* 262144 empty files cost ~250 MiB of kernel memory, charged to the
     * sandbox: give it room so the inode cap binds first. */
    create_with_memory(c, id, 1ll << 30);
    bystander_start(&by);
    sbx_exec_result r = run(c, id,
                            "python3 -c \"import errno, os\n"
                            "os.mkdir('/workspace/i')\n"
                            "n = 0\n"
                            "try:\n"
                            "    while True:\n"
                            "        os.close(os.open('/workspace/i/%d' % n, os.O_CREAT | os.O_WRONLY));"
                            " n += 1\n"
                            "except OSError as e:\n"
                            "    print(n, errno.errorcode[e.errno])\"; "
                            "df --output=itotal,iavail /workspace | tail -1 | tr -s ' '; "
                            "mkdir /tmp/d 2>&1 | grep -c 'No space'",
                            120000, false);
    int n = atoi(r.stdout_data);
    cr_expect(n > 200000 && n < 262144, "%d files: %s", n, r.stdout_data);
    cr_expect(strstr(r.stdout_data, " ENOSPC\n") != NULL, "%s %s", r.stdout_data, r.stderr_data);
    cr_expect(strstr(r.stdout_data, "262144 0\n") != NULL, "df -i: %s", r.stdout_data);
    cr_expect(strstr(r.stdout_data, "\n1\n") != NULL, "/tmp shares the inode cap: %s",
              r.stdout_data);
    sbx_exec_result_free(&r);
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "container.oomKills"), 0);
    json_decref(sb);
    /* Commands still run with no inode left… */
    r = run(c, id, "echo still-running", 30000, true);
    cr_expect_str_eq(r.stdout_data, "still-running\n");
    sbx_exec_result_free(&r);
    /* …and inodes come back. */
    r = run(c, id, "rm -rf /workspace/i && touch /workspace/new && echo freed", 120000, false);
    cr_expect_str_eq(r.stdout_data, "freed\n", "%s", r.stderr_data);
    sbx_exec_result_free(&r);
    bystander_stop(&by, "no inodes");
    ATTACK_DONE("no inodes");
}

/* cpu_cgroup_dir — the directory of the cpu cgroup of host pid `pid` in
 * the host's cgroupfs (v1 "N:cpu,…:/path", v2 "0::/path") into out; *v2
 * says which.  0, or -1 if not found.  Independent of what the daemon
 * reports. */
static int
cpu_cgroup_dir(long long pid, char *out, size_t outlen, bool *v2)
{
    char p[128], line[1024], mnt[512] = "", rel[512] = "";
    snprintf(p, sizeof(p), "/proc/%lld/cgroup", pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    *v2 = false;
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\n")] = '\0';
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            continue;
        *c2 = '\0';
        char ctrls[256];
        snprintf(ctrls, sizeof(ctrls), ",%s,", c1 + 1);
        if (strstr(ctrls, ",cpu,")) {
            snprintf(rel, sizeof(rel), "%s", c2 + 1);
            *v2 = false;
            break;
        }
        if (!strcmp(line, "0") && c1[1] == '\0') {
            snprintf(rel, sizeof(rel), "%s", c2 + 1);
            *v2 = true;
        }
    }
    fclose(f);
    /* The mount point of that hierarchy. */
    f = fopen("/proc/self/mountinfo", "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f)) {
        char m[512], fstype[64], src[256], sopts[512];
        char *sep = strstr(line, " - ");
        if (!sep || sscanf(line, "%*s %*s %*s %*s %511s", m) != 1 ||
            sscanf(sep + 3, "%63s %255s %511s", fstype, src, sopts) != 3)
            continue;
        char so[520];
        snprintf(so, sizeof(so), ",%s,", sopts);
        if ((!*v2 && !strcmp(fstype, "cgroup") && strstr(so, ",cpu,")) ||
            (*v2 && !strcmp(fstype, "cgroup2"))) {
            snprintf(mnt, sizeof(mnt), "%s", m);
            break;
        }
    }
    fclose(f);
    if (!mnt[0] || !rel[0])
        return -1;
    snprintf(out, outlen, "%s%s", mnt, rel);
    return 0;
}

/* The first line of file dir/name into out (newline cut); 0 or -1. */
static int
read_line_of(const char *dir, const char *name, char *out, size_t outlen)
{
    char p[1200];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    int rc = fgets(out, (int)outlen, f) ? 0 : -1;
    fclose(f);
    out[strcspn(out, "\n")] = '\0';
    return rc;
}

/* cpu_throttled — nr_throttled of the cpu cgroup of host pid `pid`; -1 if
 * not found. */
static long long
cpu_throttled(long long pid)
{
    char dir[1100], line[256];
    bool v2;
    if (cpu_cgroup_dir(pid, dir, sizeof(dir), &v2) != 0)
        return -1;
    char stat[1200];
    snprintf(stat, sizeof(stat), "%s/cpu.stat", dir);
    FILE *f = fopen(stat, "r");
    if (!f)
        return -1;
    long long v = -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "nr_throttled %lld", &v) == 1)
            break;
    fclose(f);
    return v;
}

/* A sandbox of the daemon's defaults (1000 millicpus here) runs under a
 * quota of one CPU per 100 ms period, read on the host from its cgroup:
 * the shard writes only what differs from a new cgroup's defaults
 * (container/cgroup.c apply_limits), so this checks the quota that write
 * leaves.  Its enforcement is the next test's. */
Test(exhaustion, a_new_sandbox_has_the_default_cpu_quota)
{
    sbx_client *c = test_client();
    char *id = test_id("quota");
    free(tsh_out(c, id, "true"));
    long long agent = status_int(c, id, "container.pid");
    char dir[1100], v[128] = "", period[128] = "";
    bool v2;
    cr_assert_eq(cpu_cgroup_dir(agent, dir, sizeof(dir), &v2), 0,
                 "no cpu cgroup for the agent (pid %lld)", agent);
    if (v2) {
        cr_assert_eq(read_line_of(dir, "cpu.max", v, sizeof(v)), 0, "%s/cpu.max", dir);
        cr_expect_str_eq(v, "100000 100000", "cpu.max of a default sandbox");
    } else {
        cr_assert_eq(read_line_of(dir, "cpu.cfs_quota_us", v, sizeof(v)), 0, "%s", dir);
        cr_assert_eq(read_line_of(dir, "cpu.cfs_period_us", period, sizeof(period)), 0);
        cr_expect_str_eq(v, "100000", "cpu.cfs_quota_us of a default sandbox");
        cr_expect_str_eq(period, "100000", "cpu.cfs_period_us of a default sandbox");
    }
    tdone(c, id);
    sbx_client_close(c);
}

Test(exhaustion, cpu_spinning_is_held_to_the_cpu_limit, .timeout = 240)
{
    ATTACK("cpu");
    /* A fifth of a CPU: well below what four spinners get on this host even
     * when other work keeps its two cores busy, so the quota shows. */
    tcall t = tc_call(c, "create", id, json_pack("{s:{s:i}}", "limits", "cpu", 200), 30000);
    tc_ok(t, "create");
    tc_free(&t);
    free(tsh_out(c, id, "true"));
    long long agent = status_int(c, id, "container.pid");
    long long thr0 = cpu_throttled(agent);
    cr_assert(thr0 >= 0, "cannot read the sandbox's cpu.stat on the host (agent pid %lld)", agent);
    bystander_start(&by);
    /* 1. Four spinners on a 2-core host for 3 s under 0.2 CPU: the CPU
     *    time they got, from the kernel's accounting of the children
     *    (times(2)), is a fifth of the wall time.  Without the quota they
     *    would take up to both cores; on this host they got ~0.7 even with
     *    two other processes spinning. */
    sbx_exec_result r = run(c, id,
                            "python3 -c \"import os, time\n"
                            "t0 = time.time()\n"
                            "for i in range(4):\n"
                            "    if os.fork() == 0:\n"
                            "        while time.time() < t0 + 3: pass\n"
                            "        os._exit(0)\n"
                            "for i in range(4): os.wait()\n"
                            "t = os.times()\n"
                            "print(t.children_user + t.children_system, time.time() - t0)\"",
                            60000, true);
    double cpu = 0, wall = 0;
    cr_assert_eq(sscanf(r.stdout_data, "%lf %lf", &cpu, &wall), 2, "%s %s", r.stdout_data,
                 r.stderr_data);
    sbx_exec_result_free(&r);
    cr_log_info("cpu: %.2f s of CPU in %.2f s (%.2f CPUs)", cpu, wall, cpu / wall);
    cr_expect(cpu / wall < 0.3, "%.2f CPUs used under a 0.2-CPU limit", cpu / wall);
    long long thr1 = cpu_throttled(agent);
    cr_expect(thr1 > thr0, "the cgroup was never throttled (nr_throttled %lld -> %lld)", thr0,
              thr1);
    /* What the daemon reports (container.cpuUsageUs, from cpuacct.usage on
     * v1 — co-mounted with cpu or not — or cpu.stat on v2) covers at least
     * the CPU time the children measured themselves. */
    long long used_us = status_int(c, id, "container.cpuUsageUs");
    cr_log_info("cpuUsageUs reported: %lld", used_us);
    cr_expect(used_us >= (long long)(cpu * 1e6 * 0.9), "cpuUsageUs %lld < the %.2f s measured",
              used_us, cpu);
    /* 2. Spinning forever: killed at the timeout, tree and all. */
    r = run(c, id, "for i in 1 2 3 4; do (while :; do :; done) & done; wait", 2000, true);
    cr_expect_eq(r.exit_code, 124);
    cr_expect(r.timed_out);
    cr_expect_str_eq(r.cause, "TIMEOUT");
    cr_expect(strstr(r.stderr_data, "timed out") != NULL, "stderr: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    long long pids = wait_pids_below(c, id, 5);
    cr_expect(pids < 5, "%lld processes left after the timeout", pids);
    bystander_stop(&by, "cpu spin");
    ATTACK_DONE("cpu spin");
}

Test(exhaustion, a_command_that_never_ends_is_killed_at_its_timeout, .timeout = 240)
{
    ATTACK("forever");
    free(tsh_out(c, id, "cd /tmp && X=kept"));
    bystander_start(&by);
    /* In the session: it ignores SIGTERM and SIGINT and leaves a grandchild
     * behind; the kill reaches the whole tree anyway.  (The traps are set in
     * a child bash: set in the session's own shell they would also break
     * that session's command protocol, which interrupts with SIGINT.) */
    double t0 = test_now_ms();
    sbx_exec_result r = run(c, id,
                            "bash -c \"trap '' TERM INT HUP; (sleep 1001 &); sleep infinity\"",
                            1500, false);
    double ms = test_now_ms() - t0;
    cr_expect_eq(r.exit_code, 124);
    cr_expect(r.timed_out);
    cr_expect_str_eq(r.cause, "TIMEOUT");
    cr_expect(strstr(r.stderr_data, "Command timed out after 1500ms") != NULL, "stderr: %s",
              r.stderr_data);
    cr_expect(ms >= 1400 && ms < 10000, "took %.0f ms", ms);
    sbx_exec_result_free(&r);
    /* The session keeps its state. */
    char *s = tsh_out(c, id, "echo $PWD $X");
    cr_expect_str_eq(s, "/tmp kept\n");
    free(s);
    /* Sessionless, the same. */
    t0 = test_now_ms();
    r = run(c, id, "(sleep 1002 &); exec sleep infinity", 1000, true);
    cr_expect_eq(r.exit_code, 124);
    cr_expect_str_eq(r.cause, "TIMEOUT");
    cr_expect(test_now_ms() - t0 < 10000);
    sbx_exec_result_free(&r);
    /* Nothing of either is left. */
    tsleep_ms(300);
    s = tsh_out(c, id, "pgrep -f 'sleep 100[12]' || echo none");
    cr_expect_str_eq(s, "none\n", "left behind: %s", s);
    free(s);
    bystander_stop(&by, "endless command");
    ATTACK_DONE("endless command");
}

Test(exhaustion, kill_minus_one_inside_stays_inside, .timeout = 240)
{
    ATTACK("killall");
    /* A host process of ours, which the sandbox must not reach. */
    pid_t victim = fork();
    cr_assert(victim >= 0);
    if (victim == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with this test, whatever happens */
        pause();
        _exit(0);
    }
    free(tsh_out(c, id, "sleep 1000 >/dev/null 2>&1 &"));
    sbx_exec_opts po = {.command = "sleep 1003"};
    char pid[128];
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &po, "long", pid, &err), 0, "%s", err.message);
    json_t *sb = ts_status(c, id);
    long long agent = jint(sb, "container.pid");
    json_decref(sb);
    bystander_start(&by);
    /* kill(-1, SIGKILL): every process the caller may signal except PID 1
     * and itself — in a pid namespace, only the sandbox's own. */
    sbx_exec_opts o = {.command = "kill -9 -1; echo survived", .timeout_ms = 20000};
    sbx_exec_result r;
    int rc = sbx_exec(c, id, &o, &r, &err);
    /* The session's shell was among the victims: SESSION_TERMINATED, or the
     * kill's own output if the shell outlived it. */
    if (rc) {
        cr_log_info("kill -9 -1 in the session: %s", err.code);
        cr_expect(!strcmp(err.code, "SESSION_TERMINATED"), "%s %s", err.code, err.message);
        sbx_error_free(&err);
    }
    sbx_exec_result_free(&r);
    sbx_exec_opts o2 = {.command = "kill -9 -1; echo survived", .timeout_ms = 20000,
                        .sessionless = true};
    r = tsh_opts(c, id, &o2);
    cr_expect_str_eq(r.stdout_data, "survived\n");
    sbx_exec_result_free(&r);
    /* The background process died with the rest and is reported so. */
    tcall t = tc_call(c, "process.get", id, json_pack("{s:s}", "processId", "long"), 0);
    tc_ok(t, "process.get");
    cr_expect_str_eq(jstr(t.res, "process.status"), "killed", "%s",
                     json_dumps(t.res, JSON_COMPACT));
    tc_free(&t);
    /* The agent itself is untouched; the host process too. */
    sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "container.pid"), agent, "the agent was replaced");
    cr_expect_eq(jint(sb, "restarts"), 0);
    json_decref(sb);
    cr_expect_eq(kill(victim, 0), 0, "the host process is gone");
    int st;
    cr_expect_eq(waitpid(victim, &st, WNOHANG), 0, "the host process ended");
    kill(victim, SIGKILL);
    waitpid(victim, &st, 0);
    char *s = tsh_out(c, id, "pgrep -f 'sleep 100[03]' || echo none");
    cr_expect_str_eq(s, "none\n");
    free(s);
    bystander_stop(&by, "kill -9 -1");
    ATTACK_DONE("kill -9 -1");
}
