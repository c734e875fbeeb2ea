/*
 * test_deploy.c — deployments side by side on one host (tools/hostlock.c, host
 * locks): a second `sbxd dev` with a name in use refuses to start (exit 2)
 * and the first one's sandboxes keep running; a shard whose cgroup subtree
 * is, contains or lies inside a live shard's refuses too; the lock of a
 * SIGKILLed process does not block the next start.
 *
 * `--no-preview-host` replaces the hosts port.expose refuses with
 * CUSTOM_DOMAIN_REQUIRED (issue 19; docs/protocol.md §7).
 *
 * Each test starts daemons and shards of its own, under names no other
 * test uses, and stops them by pid.  Shards started on their own run with
 * `--cgroup none --pool 0`: they create no cgroup and no container, so even
 * a broken lock could not sweep anything of anyone.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

static const char *
bindir(void)
{
    const char *b = getenv("SBX_BIN");
    return b && *b ? b : "build/asan/bin";
}

/* Start sbxd with argv (argv[0] is replaced by the binary's path), its
 * output appended to `log`; dies with the test process. */
static pid_t
sbxd_spawn(const char *const *argv, const char *log)
{
    char path[512];
    const char *av[48];
    int n = 0;
    snprintf(path, sizeof(path), "%s/sbxd", bindir());
    av[n++] = path;
    for (int i = 1; argv[i] && n < 47; i++)
        av[n++] = argv[i];
    av[n] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv(path, (char *const *)av);
        _exit(127);
    }
    return pid;
}

/* Wait up to timeout_ms for child `pid`; its wait status, or -1 if it was
 * still running (it is then SIGTERMed, then SIGKILLed, and reaped). */
static int
wait_exit(pid_t pid, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    int st = 0;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (test_now_ms() > until) {
            kill(pid, SIGTERM);
            double hard = test_now_ms() + 20000;
            while (waitpid(pid, &st, WNOHANG) == 0) {
                if (test_now_ms() > hard) {
                    kill(pid, SIGKILL);
                    waitpid(pid, &st, 0);
                    break;
                }
                usleep(20 * 1000);
            }
            return -1;
        }
        usleep(20 * 1000);
    }
    return st;
}

/* Stop child `pid` with SIGTERM; its wait status (-1 if it had to be killed). */
static int
stop_child(pid_t pid)
{
    kill(pid, SIGTERM);
    return wait_exit(pid, 20000);
}

static char *
slurp(const char *path)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(path, 1 << 20, &buf, &n) != 0)
        return strdup("");
    return buf;
}

/* Wait until `log` says the shard serves (30 s); false if it exited or never did. */
static bool
shard_serving(pid_t pid, const char *log)
{
    double until = test_now_ms() + 30000;
    while (test_now_ms() < until) {
        char *text = slurp(log);
        bool up = strstr(text, "serving on") != NULL;
        free(text);
        if (up)
            return true;
        if (waitpid(pid, NULL, WNOHANG) != 0)
            return false;
        usleep(50 * 1000);
    }
    return false;
}

/* A fresh temporary directory (caller removes it with sbx_rm_rf). */
static void
tmpdir(char *out, size_t n)
{
    snprintf(out, n, "/tmp/sbx-deploy-%sXXXXXX", test_prefix());
    cr_assert(mkdtemp(out) != NULL, "mkdtemp");
}

/* A name of our own from the directory: "dp" and its random suffix, lower-case. */
static void
name_from(const char *dir, char *out, size_t n)
{
    snprintf(out, n, "dp%s", strrchr(dir, '-') + 1);
    for (char *p = out; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
        else if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
            *p = 'x';
}

/* Run `sbxd shard` with extra arguments in dir (data and socket named
 * after tag) to the end; its exit status, and its log in *text. */
static int
shard_refusal(const char *dir, const char *tag, const char *const *extra, char **text)
{
    char data[320], listen[340], log[320];
    snprintf(data, sizeof(data), "--data=%s/%s", dir, tag);
    snprintf(listen, sizeof(listen), "--listen=ipc://%s/%s.sock", dir, tag);
    snprintf(log, sizeof(log), "%s/%s.log", dir, tag);
    const char *argv[24] = {"sbxd", "shard", data, listen, "--cgroup", "none", "--pool", "0"};
    int n = 8;
    for (int i = 0; extra[i] && n < 23; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    int st = wait_exit(sbxd_spawn(argv, log), 30000);
    *text = slurp(log);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* The sandbox's container pid and generation (status). */
static void
container_of(sbx_client *c, const char *id, long long *pid, long long *gen)
{
    json_t *sb = ts_status(c, id);
    cr_assert_str_eq(jstr(sb, "state"), "running", "sandbox %s is %s", id, jstr(sb, "state"));
    *pid = jint(sb, "container.pid");
    *gen = jint(sb, "generation");
    json_decref(sb);
}

Test(deploy, a_second_deployment_of_a_name_in_use_refuses_and_the_first_keeps_running,
     .timeout = 180)
{
    static const char *const extra[] = {"--pool", "1", "--memory", "256M", "--pids", "128",
                                        "--disk", "64M", NULL};
    struct testd a;
    cr_assert_eq(testd_start(&a, 2, extra), 0, "the first sbxd dev did not start");
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, a.url, &err), 0);

    /* One sandbox on each shard: the second deployment's shards would each
     * have swept the subtree of the first's shard of the same name. */
    char *ids[2] = {NULL, NULL}, shards[2][64] = {"", ""};
    for (int i = 0; i < 64 && !ids[1]; i++) {
        char *id = test_id("dep");
        tcall t = tc_call(c, "create", id, NULL, 0);
        tc_ok(t, "create");
        const char *sh = jstr(t.res, "sandbox.shard");
        int k = !ids[0] ? 0 : strcmp(sh, shards[0]) ? 1 : -1;
        if (k >= 0) {
            ids[k] = id;
            snprintf(shards[k], sizeof(shards[k]), "%s", sh);
        } else {
            tdone(c, id);
        }
        tc_free(&t);
    }
    cr_assert(ids[1] != NULL, "no ID of 64 landed on the second shard");
    long long pid[2], gen[2];
    char proc[2][128];
    for (int k = 0; k < 2; k++) {
        sbx_exec_result r = tsh(c, ids[k], "echo alive > /workspace/mark", 30000);
        cr_assert_eq(r.exit_code, 0);
        sbx_exec_result_free(&r);
        sbx_exec_opts o = {.command = "sleep 600"};
        cr_assert_eq(sbx_process_start(c, ids[k], &o, NULL, proc[k], &err), 0, "%s", err.message);
        container_of(c, ids[k], &pid[k], &gen[k]);
    }

    /* The second one: its own data, sockets and HTTP port; the same name. */
    char dir[256], data[300], listen[320], log[320];
    tmpdir(dir, sizeof(dir));
    snprintf(data, sizeof(data), "--data=%s/data", dir);
    snprintf(listen, sizeof(listen), "--listen=ipc://%s/gw.sock", dir);
    snprintf(log, sizeof(log), "%s/sbxd.log", dir);
    const char *argv[] = {"sbxd", "dev", data, listen, "--name", a.name, "--shards", "2",
                          "--http", "127.0.0.1:0", "--pool", "1", "--memory", "256M",
                          "--pids", "128", "--disk", "64M", NULL};
    double t0 = test_now_ms();
    int st = wait_exit(sbxd_spawn(argv, log), 30000);
    double took = test_now_ms() - t0;
    char *text = slurp(log);
    cr_expect(st >= 0, "a second `sbxd dev --name %s` ran on for 30 s:\n%s", a.name, text);
    cr_expect(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 2,
              "the second sbxd dev ended with wait status %#x, expected exit 2:\n%s", st, text);
    cr_expect(took < 10000, "the refusal took %.0f ms", took);
    /* A clear error that names the holder. */
    char want[64];
    snprintf(want, sizeof(want), "(pid %d)", (int)a.pid);
    cr_expect(strstr(text, a.name) && strstr(text, "live deployment") && strstr(text, want),
              "the refusal should name deployment %s and its pid %d:\n%s", a.name, (int)a.pid,
              text);
    free(text);
    /* It stopped before touching anything: no shard data, no HTTP address. */
    struct stat sst;
    char path[400];
    snprintf(path, sizeof(path), "%s/data/s0", dir);
    cr_expect(stat(path, &sst) != 0, "the refused deployment started a shard (%s exists)", path);
    snprintf(path, sizeof(path), "%s/data/http.addr", dir);
    cr_expect(stat(path, &sst) != 0, "the refused deployment started its gateway");
    sbx_rm_rf(dir);

    /* The first deployment's sandboxes: the same containers, their files and
     * processes intact, and they still serve. */
    for (int k = 0; k < 2; k++) {
        long long p2, g2;
        container_of(c, ids[k], &p2, &g2);
        cr_expect_eq(p2, pid[k], "sandbox %s (shard %s): container pid %lld, was %lld", ids[k],
                     shards[k], p2, pid[k]);
        cr_expect_eq(g2, gen[k], "sandbox %s: generation %lld, was %lld", ids[k], g2, gen[k]);
        char *out = tsh_out(c, ids[k], "cat /workspace/mark");
        cr_expect_str_eq(out, "alive\n", "sandbox %s lost /workspace/mark", ids[k]);
        free(out);
        json_t *args = json_pack("{s:s}", "processId", proc[k]);
        tcall t = tc_call(c, "process.get", ids[k], args, 0);
        tc_ok(t, "process.get");
        cr_expect_str_eq(jstr(t.res, "process.status"), "running",
                         "sandbox %s: its background process is %s", ids[k],
                         jstr(t.res, "process.status"));
        tc_free(&t);
        tdone(c, ids[k]);
    }
    sbx_client_close(c);
    testd_stop(&a);
}

Test(deploy, a_shard_refuses_a_cgroup_subtree_that_is_or_nests_with_a_live_ones, .timeout = 180)
{
    char dir[256], name[64];
    tmpdir(dir, sizeof(dir));
    name_from(dir, name, sizeof(name));
    /* P holds sbx/<name> (its default subtree); R holds <name>-outer/inner. */
    char pname[80], plog[320], pdata[320], plisten[340];
    snprintf(pname, sizeof(pname), "--name=%s", name);
    snprintf(plog, sizeof(plog), "%s/p.log", dir);
    snprintf(pdata, sizeof(pdata), "--data=%s/p", dir);
    snprintf(plisten, sizeof(plisten), "--listen=ipc://%s/p.sock", dir);
    const char *pargv[] = {"sbxd", "shard", pname, pdata, plisten, "--cgroup", "none",
                           "--pool", "0", NULL};
    pid_t p = sbxd_spawn(pargv, plog);
    cr_assert(shard_serving(p, plog), "shard P did not start");
    char rname[80], rbase[120], rlog[320], rdata[320], rlisten[340];
    snprintf(rname, sizeof(rname), "--name=%s-r", name);
    snprintf(rbase, sizeof(rbase), "--cgroup-base=%s-outer/inner", name);
    snprintf(rlog, sizeof(rlog), "%s/r.log", dir);
    snprintf(rdata, sizeof(rdata), "--data=%s/r", dir);
    snprintf(rlisten, sizeof(rlisten), "--listen=ipc://%s/r.sock", dir);
    const char *rargv[] = {"sbxd", "shard", rname, rbase, rdata, rlisten, "--cgroup", "none",
                           "--pool", "0", NULL};
    pid_t r = sbxd_spawn(rargv, rlog);
    cr_assert(shard_serving(r, rlog), "shard R did not start");

    char ppid[32], rpid[32], other[80], b1[140], b2[140], b3[140], b4[140];
    snprintf(ppid, sizeof(ppid), "(pid %d)", (int)p);
    snprintf(rpid, sizeof(rpid), "(pid %d)", (int)r);
    snprintf(other, sizeof(other), "--name=%s-q", name);
    snprintf(b1, sizeof(b1), "--cgroup-base=/sbx//%s/", name);   /* P's, spelled otherwise */
    snprintf(b2, sizeof(b2), "--cgroup-base=sbx/%s/inner", name); /* inside P's */
    snprintf(b3, sizeof(b3), "--cgroup-base=%s-outer", name);     /* contains R's */
    snprintf(b4, sizeof(b4), "--cgroup-base=sbx/../%s", name);    /* not a subtree of its own */
    static const char *const frag[] = {"the cgroup subtree of a live shard",
                                       "the cgroup subtree of a live shard",
                                       "lies inside", "or contains one"};
    const char *const cases[][3] = {
        {pname, NULL}, {other, b1, NULL}, {other, b2, NULL}, {other, b3, NULL}};
    const char *const holder[] = {ppid, ppid, ppid, rpid};
    for (size_t i = 0; i < 4; i++) {
        char tag[16], *text;
        snprintf(tag, sizeof(tag), "q%zu", i);
        int code = shard_refusal(dir, tag, cases[i], &text);
        cr_expect_eq(code, 2, "case %zu (%s %s): exit %d, expected 2:\n%s", i, cases[i][0],
                     cases[i][1] ? cases[i][1] : "", code, text);
        cr_expect(strstr(text, frag[i]) && strstr(text, holder[i]),
                  "case %zu: the refusal should say '%s' and name %s:\n%s", i, frag[i],
                  holder[i], text);
        free(text);
    }
    char *text;
    const char *const dotdot[] = {other, b4, NULL};
    cr_expect_eq(shard_refusal(dir, "q4", dotdot, &text), 2, "'..' in --cgroup-base:\n%s", text);
    cr_expect(strstr(text, "without '.' or '..'"), "%s", text);
    free(text);
    /* P's data directory under another name and subtree: one LMDB
     * environment has one live shard. */
    char samedata[340], b5[140];
    snprintf(samedata, sizeof(samedata), "--data=%s/p", dir);
    snprintf(b5, sizeof(b5), "--cgroup-base=%s-elsewhere", name);
    const char *const sd[] = {other, b5, samedata, NULL};
    cr_expect_eq(shard_refusal(dir, "q5", sd, &text), 2, "P's --data:\n%s", text);
    cr_expect(strstr(text, "in use by a live shard") && strstr(text, ppid),
              "the refusal should name the data directory's holder %s:\n%s", ppid, text);
    free(text);

    /* Both still serve, and once P stops its name is free again. */
    cr_expect_eq(waitpid(p, NULL, WNOHANG), 0, "shard P ended");
    cr_expect_eq(waitpid(r, NULL, WNOHANG), 0, "shard R ended");
    int st = stop_child(p);
    cr_expect(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "shard P: wait status %#x", st);
    char p2log[320];
    snprintf(p2log, sizeof(p2log), "%s/p2.log", dir);
    pid_t p2 = sbxd_spawn(pargv, p2log);
    cr_expect(shard_serving(p2, p2log), "a shard named %s did not start after P stopped", name);
    stop_child(p2);
    stop_child(r);
    /* A shard removes its own lock file when it stops, but not its
     * ancestors' (shared with others, as sbx/ is): R's <name>-outer is ours
     * alone, and gone with this test. */
    char outer[300];
    snprintf(outer, sizeof(outer), "/run/sbx/cgroup.%s-outer.lock", name);
    cr_expect_eq(unlink(outer), 0, "no lock file %s of R's ancestor", outer);
    sbx_rm_rf(dir);
}

/* The pids of the deployment's shard processes (cluster.status). */
static int
shard_pids(sbx_client *c, pid_t *out, int max)
{
    tcall t = tc_call(c, "cluster.status", NULL, NULL, 0);
    tc_ok(t, "cluster.status");
    json_t *arr = jget(t.res, "shards");
    int n = 0;
    for (size_t i = 0; i < json_array_size(arr) && n < max; i++) {
        long long pid = jint(json_array_get(arr, i), "status.pid");
        if (pid > 0)
            out[n++] = (pid_t)pid;
    }
    tc_free(&t);
    return n;
}

Test(deploy, the_lock_of_a_killed_deployment_does_not_block_the_next, .timeout = 180)
{
    /* The shards of a SIGKILLed sbxd dev become our children, to be waited for. */
    cr_assert_eq(prctl(PR_SET_CHILD_SUBREAPER, 1), 0);
    char dir[256], name[64], data[300], listen[320], url[320], log[320];
    tmpdir(dir, sizeof(dir));
    name_from(dir, name, sizeof(name));
    snprintf(data, sizeof(data), "--data=%s/data", dir);
    snprintf(url, sizeof(url), "ipc://%s/gw.sock", dir);
    snprintf(listen, sizeof(listen), "--listen=%s", url);
    snprintf(log, sizeof(log), "%s/sbxd.log", dir);
    const char *argv[] = {"sbxd", "dev", data, listen, "--name", name, "--shards", "2",
                          "--http", "127.0.0.1:0", "--pool", "0", "--memory", "256M",
                          "--pids", "128", "--disk", "64M", NULL};
    pid_t d1 = sbxd_spawn(argv, log);
    cr_assert_eq(testd_wait_ready(url, 30000), 0, "sbxd dev did not start");
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, url, &err), 0);
    char *id = test_id("stale");
    char *out = tsh_out(c, id, "echo one");
    cr_expect_str_eq(out, "one\n");
    free(out);
    pid_t kids[8];
    int nkids = shard_pids(c, kids, 8);
    cr_assert_eq(nkids, 2, "cluster.status lists %d shard pids", nkids);

    /* SIGKILL: no clean-up, the lock file stays with a dead pid in it; the
     * shards follow (SIGTERM at their parent's death) and are waited for. */
    kill(d1, SIGKILL);
    waitpid(d1, NULL, 0);
    for (int i = 0; i < nkids; i++) {
        int st = wait_exit(kids[i], 30000);
        cr_expect(st >= 0, "shard %d did not stop after sbxd dev was killed", (int)kids[i]);
    }
    char lock[300];
    snprintf(lock, sizeof(lock), "/run/sbx/deploy.%s.lock", name);
    struct stat sst;
    cr_expect_eq(stat(lock, &sst), 0, "no stale lock file %s left by the killed daemon", lock);

    /* The next start of the same name, on the same data: it comes up and the
     * sandbox is there. */
    pid_t d2 = sbxd_spawn(argv, log);
    cr_assert_eq(testd_wait_ready(url, 30000), 0, "sbxd dev did not start after a SIGKILLed "
                 "one of the same name:\n%s", slurp(log));
    sbx_client_close(c);
    cr_assert_eq(sbx_client_open(&c, url, &err), 0);
    out = tsh_out(c, id, "echo two");
    cr_expect_str_eq(out, "two\n");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
    int st = stop_child(d2);
    cr_expect(st >= 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0, "sbxd dev: wait status %#x", st);
    /* A clean stop removes the file. */
    cr_expect_neq(stat(lock, &sst), 0, "%s outlived a clean stop", lock);
    sbx_rm_rf(dir);
}

/* A deployment names the hosts that cannot carry wildcard preview URLs; the
 * list replaces the default (workers.dev). */
Test(deploy, no_preview_host_replaces_the_refused_preview_hosts, .timeout = 120)
{
    static const char *const extra[] = {"--pool", "0", "--no-preview-host", "example.org",
                                        "--no-preview-host=internal.test", NULL};
    struct testd d;
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start");
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    char *id = test_id("noph");
    static const char *const refused[] = {"example.org", "a.b.example.org", "x.internal.test"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(refused); i++) {
        tcall t = tc_call(c, "port.expose", id,
                          json_pack("{s:i, s:s}", "port", 8080, "hostname", refused[i]), 0);
        tc_fails_with(t, refused[i], "CUSTOM_DOMAIN_REQUIRED");
        tc_free(&t);
    }
    /* Not a listed suffix at a label boundary, or the default no longer listed. */
    static const char *const allowed[] = {"notexample.org", "x.workers.dev"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(allowed); i++) {
        tcall t = tc_call(c, "port.expose", id,
                          json_pack("{s:i, s:s}", "port", 8081 + (int)i, "hostname", allowed[i]),
                          0);
        tc_ok(t, allowed[i]);
        cr_expect(strstr(jstr(t.res, "url"), allowed[i]) != NULL, "url %s", jstr(t.res, "url"));
        tc_free(&t);
    }
    tdone(c, id);
    sbx_client_close(c);
    testd_stop(&d);
}

/* A standalone shard named <name>-<tag> in dir with extra arguments,
 * serving (asserted); its pid. */
static pid_t
shard_up(const char *dir, const char *name, const char *tag, const char *const *extra)
{
    char nm[96], data[320], listen[340], log[320];
    snprintf(nm, sizeof(nm), "--name=%s-%s", name, tag);
    snprintf(data, sizeof(data), "--data=%s/%s", dir, tag);
    snprintf(listen, sizeof(listen), "--listen=ipc://%s/%s.sock", dir, tag);
    snprintf(log, sizeof(log), "%s/%s.log", dir, tag);
    const char *argv[24] = {"sbxd", "shard", nm, data, listen, "--cgroup", "none", "--pool", "0"};
    int n = 9;
    for (int i = 0; extra && extra[i] && n < 23; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t p = sbxd_spawn(argv, log);
    char *text = NULL;
    bool up = shard_serving(p, log);
    if (!up)
        text = slurp(log);
    cr_assert(up, "shard %s did not start:\n%s", tag, text ? text : "");
    return p;
}

/* The host uid range a shard's log says it took ("host uids A-B"). */
static void
uids_of(const char *dir, const char *tag, long long *lo, long long *hi)
{
    char log[320];
    snprintf(log, sizeof(log), "%s/%s.log", dir, tag);
    char *text = slurp(log);
    const char *p = strstr(text, "host uids ");
    cr_assert(p && sscanf(p, "host uids %lld-%lld", lo, hi) == 2, "no uid range in %s:\n%s",
              log, text);
    free(text);
}

/*
 * Host uid ranges are locked per host like names and cgroups (issue 16 item
 * 10): a shard whose --uid-base range overlaps a live shard's refuses to
 * start (exit 2, naming the holder), an adjacent range is fine, a shard
 * without --uid-base takes a free range of its own (before, every such
 * shard took 1000000000…), and a SIGKILLed shard's range is free again.
 */
Test(deploy, shards_refuse_host_uid_ranges_that_overlap_a_live_ones, .timeout = 180)
{
    char dir[256], name[64];
    tmpdir(dir, sizeof(dir));
    name_from(dir, name, sizeof(name));
    /* A range of our own, high above what `sbxd dev` and the other tests use. */
    long long b = 3900000000ll + (long long)(getpid() % 100000) * 1000;
    char pb[40], qb[40], rb[40];
    snprintf(pb, sizeof(pb), "--uid-base=%lld", b);
    snprintf(qb, sizeof(qb), "--uid-base=%lld", b + 50);
    snprintf(rb, sizeof(rb), "--uid-base=%lld", b + 100);
    const char *const pargs[] = {pb, "--uid-count", "100", NULL};
    pid_t p = shard_up(dir, name, "p", pargs);
    char ppid[32], qname[96];
    snprintf(ppid, sizeof(ppid), "(pid %d)", (int)p);
    snprintf(qname, sizeof(qname), "--name=%s-q", name);
    const char *const qargs[] = {qname, qb, "--uid-count", "100", NULL};
    char *text;
    int code = shard_refusal(dir, "q", qargs, &text);
    cr_expect_eq(code, 2, "a shard on uids %lld-%lld beside one on %lld-%lld: exit %d:\n%s",
                 b + 50, b + 149, b, b + 99, code, text);
    cr_expect(strstr(text, "overlap") && strstr(text, ppid),
              "the refusal should say 'overlap' and name %s:\n%s", ppid, text);
    free(text);
    /* Adjacent is disjoint. */
    const char *const rargs[] = {rb, "--uid-count", "100", NULL};
    pid_t r = shard_up(dir, name, "r", rargs);
    /* Two shards without --uid-base: free ranges, disjoint from each other
     * and from P's and R's. */
    pid_t s1 = shard_up(dir, name, "s1", NULL), s2 = shard_up(dir, name, "s2", NULL);
    long long lo1, hi1, lo2, hi2;
    uids_of(dir, "s1", &lo1, &hi1);
    uids_of(dir, "s2", &lo2, &hi2);
    cr_expect(hi1 < lo2 || hi2 < lo1, "two shards without --uid-base share uids: %lld-%lld and "
              "%lld-%lld", lo1, hi1, lo2, hi2);
    for (int i = 0; i < 2; i++) {
        long long lo = i ? lo2 : lo1, hi = i ? hi2 : hi1;
        cr_expect(hi < b || lo > b + 199, "a free range %lld-%lld overlaps P's or R's", lo, hi);
    }
    /* A killed shard's range is free again (R, which Q's range overlaps too,
     * stopped first). */
    stop_child(r);
    kill(p, SIGKILL);
    waitpid(p, NULL, 0);
    /* A killed shard leaves its cgroup subtree's lock file (unheld: the next
     * shard of that name takes it over); no later shard is named so here. */
    char plock[300];
    snprintf(plock, sizeof(plock), "/run/sbx/cgroup.sbx%%2F%s-p.lock", name);
    cr_expect_eq(unlink(plock), 0, "no lock file %s of the killed shard", plock);
    pid_t q = shard_up(dir, name, "q2", qargs + 1);
    stop_child(q);
    stop_child(s1);
    stop_child(s2);
    sbx_rm_rf(dir);
}

/* The cgroup v2 mount's root controllers ("" when there is no v2 mount). */
static char *
v2_root_controllers(void)
{
    static const char *const at[] = {"/sys/fs/cgroup/cgroup.controllers",
                                     "/sys/fs/cgroup/unified/cgroup.controllers", NULL};
    for (int i = 0; at[i]; i++)
        if (access(at[i], R_OK) == 0)
            return slurp(at[i]);
    return strdup("");
}

/*
 * cgroup v2 without the memory, pids and cpu controllers (issue 16 item 8):
 * a shard refuses to start instead of running every sandbox without limits
 * (before: a warning, then no limits), unless the operator passes
 * --allow-unlimited.  This host's bare unified tree (cgroup v1 hybrid) has
 * none; on a host whose v2 root has all three the refusal cannot be
 * provoked and the test says so.
 */
Test(deploy, cgroup_v2_without_controllers_is_refused_unless_allowed, .timeout = 120)
{
    char *ctrls = v2_root_controllers();
    struct stat st;
    bool has_v2 = stat("/sys/fs/cgroup/unified", &st) == 0 ||
                  access("/sys/fs/cgroup/cgroup.controllers", R_OK) == 0;
    bool all = strstr(ctrls, "memory") && strstr(ctrls, "pids") && strstr(ctrls, "cpu");
    free(ctrls);
    if (!has_v2 || all)
        cr_skip_test("this host's cgroup v2 tree %s: a subtree without controllers cannot be "
                     "provoked here",
                     has_v2 ? "has memory, pids and cpu" : "does not exist");
    char dir[256], name[64];
    tmpdir(dir, sizeof(dir));
    name_from(dir, name, sizeof(name));
    char nm[96];
    snprintf(nm, sizeof(nm), "--name=%s-v2", name);
    const char *const args[] = {nm, "--cgroup", "v2", NULL};
    char *text;
    int code = shard_refusal(dir, "v2", args, &text);
    cr_expect(code > 0, "a shard on a cgroup v2 tree without controllers: exit %d:\n%s", code,
              text);
    cr_expect(strstr(text, "--allow-unlimited") && strstr(text, "without limits"),
              "the refusal should say why and name --allow-unlimited:\n%s", text);
    free(text);
    const char *const allowed[] = {"--cgroup", "v2", "--allow-unlimited", NULL};
    pid_t p = shard_up(dir, name, "v2ok", allowed);
    int s = stop_child(p);
    cr_expect(s >= 0 && WIFEXITED(s) && WEXITSTATUS(s) == 0, "the allowed shard: status %#x", s);
    sbx_rm_rf(dir);
}

/* The CPU weight file of a shard's top cgroup directory `top` (the first
 * level of its --cgroup-base): v1 <cpu mount>/<top>/cpu.shares, v2
 * <the shard's delegation cgroup>/<top>/cpu.weight.  "" when neither. */
static void
weight_file(pid_t shard, const char *top, char *out, size_t n)
{
    struct stat st;
    out[0] = '\0';
    if (stat("/sys/fs/cgroup/cpu/cpu.shares", &st) == 0) {
        snprintf(out, n, "/sys/fs/cgroup/cpu/%s/cpu.shares", top);
        return;
    }
    char p[64], *text;
    snprintf(p, sizeof(p), "/proc/%d/cgroup", (int)shard);
    if (!(text = slurp(p)))
        return;
    char *own = strstr(text, "0::");
    if (own) {
        own += 3;
        own[strcspn(own, "\n")] = '\0';
        char *leaf = strstr(own, "/sbx-supervisor");
        if (leaf && !leaf[15])
            *leaf = '\0';
        snprintf(out, n, "/sys/fs/cgroup%s/%s/cpu.weight", !strcmp(own, "/") ? "" : own, top);
    }
    free(text);
}

/*
 * The sandboxes' CPU weight (container/cgroup.h sbx_cgroups_set_share):
 * a shard gives the top directory of its cgroup subtree the weight of
 * --sandbox-cpu-share nice-0 processes (v1 × 1024 in cpu.shares, v2 × 100 in
 * cpu.weight), 8 per online CPU by default, and 0 leaves the kernel's.
 * Each shard here has a top directory of its own, so no other test's
 * sandboxes see these weights; each is gone once its shard stops.
 */
Test(deploy, the_sandboxes_cpu_weight_follows_sandbox_cpu_share, .timeout = 180)
{
    char dir[256], name[64];
    tmpdir(dir, sizeof(dir));
    name_from(dir, name, sizeof(name));
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    struct stat st;
    bool v1 = stat("/sys/fs/cgroup/cpu/cpu.shares", &st) == 0;
    long long unit = v1 ? 1024 : 100, cap = v1 ? 262144 : 10000;
    long long dflt = 8 * ncpu * unit > cap ? cap : 8 * ncpu * unit;
    const struct {
        const char *share; /* NULL: the default */
        long long want;
    } cases[] = {{NULL, dflt}, {"3", 3 * unit}, {"0", v1 ? 1024 : 100}};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        char tag[16], top[96], base[140];
        snprintf(tag, sizeof(tag), "cw%zu", i);
        snprintf(top, sizeof(top), "%s-%s", name, tag);
        snprintf(base, sizeof(base), "--cgroup-base=%s/s", top);
        const char *args[] = {"--cgroup", "auto", base, "--sandbox-cpu-share", cases[i].share,
                              NULL};
        if (!cases[i].share)
            args[3] = NULL;
        pid_t p = shard_up(dir, name, tag, args);
        char file[700];
        weight_file(p, top, file, sizeof(file));
        char *text = file[0] ? slurp(file) : NULL;
        long long got = text ? atoll(text) : -1;
        free(text);
        cr_expect_eq(got, cases[i].want, "--sandbox-cpu-share %s: %s holds %lld, expected %lld",
                     cases[i].share ? cases[i].share : "(default)", file, got, cases[i].want);
        int s = stop_child(p);
        cr_expect(s >= 0 && WIFEXITED(s) && WEXITSTATUS(s) == 0, "shard %s: status %#x", tag, s);
        char *slash = strrchr(file, '/');
        if (slash) {
            *slash = '\0';
            cr_expect_neq(stat(file, &st), 0, "%s is left after its shard stopped", file);
        }
        char lock[300];
        snprintf(lock, sizeof(lock), "/run/sbx/cgroup.%s.lock", top);
        unlink(lock); /* the ancestor's lock file, ours alone (see above) */
    }
    sbx_rm_rf(dir);
}
