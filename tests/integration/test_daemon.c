/*
 * test_daemon.c — the daemon as a whole: metadata that survives a restart,
 * bad input answered with the right code while the daemon keeps serving,
 * and shards that are dead or too slow answered SHARD_UNAVAILABLE in time;
 * a shard that does not stop in time killed and what it left removed.
 * Tests that restart or stop processes use daemons of their own.
 */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/wire.h"
#include "../support/harness.h"

/* Send raw bytes on a fresh REQ socket; return the reply (caller frees) or NULL. */
static nng_msg *
raw_call(const char *url, const void *buf, size_t len, int timeout_ms)
{
    nng_socket s;
    nng_msg *m = NULL, *reply = NULL;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, 128u << 20);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, timeout_ms);
    nng_socket_set_ms(s, NNG_OPT_SENDTIMEO, timeout_ms);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    cr_assert_eq(nng_dial(s, url, NULL, 0), 0);
    cr_assert_eq(nng_msg_alloc(&m, len), 0);
    memcpy(nng_msg_body(m), buf, len);
    if (nng_sendmsg(s, m, 0) != 0)
        nng_msg_free(m);
    else if (nng_recvmsg(s, &reply, 0) != 0)
        reply = NULL;
    nng_close(s);
    return reply;
}

/* The error code of a reply, as a string in out ("" if ok). */
static void
reply_code(nng_msg *reply, char *out, size_t outlen)
{
    sbx_msg m;
    out[0] = '\0';
    cr_assert_not_null(reply, "no reply");
    cr_assert_eq(sbx_wire_decode(&m, nng_msg_body(reply), nng_msg_len(reply),
                                 &sbx_wire_limits_reply), 0, "malformed reply");
    bool ok = true;
    sbx_wire_get_bool(m.root, "ok", &ok);
    if (!ok) {
        const msgpack_object *e;
        sbx_str code = {"", 0};
        if (sbx_wire_get_map(m.root, "error", &e) == 0)
            sbx_wire_get_str(e, "code", &code);
        snprintf(out, outlen, "%.*s", (int)code.n, code.p);
    }
    sbx_wire_msg_free(&m);
    nng_msg_free(reply);
}

static void
request_bytes(const char *op, const char *sandbox, int version, char **buf, size_t *len)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", version);
    sbx_enc_kstr(&e, "id", "raw-request-1");
    sbx_enc_kstr(&e, "op", op);
    if (sandbox)
        sbx_enc_kstr(&e, "sandbox", sandbox);
    sbx_enc_kmap(&e, "args");
    sbx_enc_kstr(&e, "command", "echo hi");
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, buf, len), 0);
}

static void
expect_code(const char *url, const void *buf, size_t len, const char *code)
{
    char got[64];
    reply_code(raw_call(url, buf, len, 10000), got, sizeof(got));
    cr_expect_str_eq(got, code);
}

static void
expect_serving(const char *url)
{
    char *buf;
    size_t len;
    char got[64];
    request_bytes("exec", "still-serving", 1, &buf, &len);
    reply_code(raw_call(url, buf, len, 30000), got, sizeof(got));
    cr_expect_str_eq(got, "", "a valid request failed afterwards: %s", got);
    free(buf);
}

Test(daemon, bad_input_gets_the_right_code_and_the_daemon_keeps_serving, .timeout = 120)
{
    const char *url = test_url();
    char *buf;
    size_t len;

    /* Not msgpack at all. */
    static const char junk[] = "GET / HTTP/1.1\r\n\r\n";
    expect_code(url, junk, sizeof(junk) - 1, "MALFORMED_REQUEST");
    expect_serving(url);
    /* A hostile header: an array claiming 2^26 elements in five bytes. */
    static const unsigned char bomb[] = {0xdd, 0x04, 0x00, 0x00, 0x00};
    expect_code(url, bomb, sizeof(bomb), "MALFORMED_REQUEST");
    /* Valid msgpack, but not a request. */
    static const unsigned char notmap[] = {0x93, 0x01, 0x02, 0x03};
    expect_code(url, notmap, sizeof(notmap), "MALFORMED_REQUEST");
    /* Unknown operation, invalid sandbox IDs, wrong protocol version. */
    request_bytes("launch-missiles", "x", 1, &buf, &len);
    expect_code(url, buf, len, "UNKNOWN_OPERATION");
    free(buf);
    static const char *const bad_ids[] = {"Upper", "-lead", "trail-", "has_underscore", "",
                                          "a-very-long-id-that-goes-on-and-on-past-the-limit-of-63-characters"};
    for (size_t i = 0; i < sizeof(bad_ids) / sizeof(bad_ids[0]); i++) {
        request_bytes("exec", bad_ids[i], 1, &buf, &len);
        expect_code(url, buf, len, bad_ids[i][0] ? "VALIDATION_FAILED" : "VALIDATION_FAILED");
        free(buf);
    }
    request_bytes("exec", "ok-id", 99, &buf, &len);
    expect_code(url, buf, len, "UNSUPPORTED_VERSION");
    free(buf);
    expect_serving(url);

    /* An oversized frame under the transport cap: a clean REQUEST_TOO_LARGE. */
    size_t big = SBX_WIRE_MAX_REQUEST + 1024;
    char *huge = calloc(1, big);
    cr_assert_not_null(huge);
    huge[0] = (char)0xc6; /* bin32 header (the contents do not matter) */
    expect_code(url, huge, big, "REQUEST_TOO_LARGE");
    free(huge);
    /* Above the transport cap nng drops the connection: no reply, no crash. */
    big = SBX_WIRE_MAX_FRAME + 1024;
    huge = calloc(1, big);
    cr_assert_not_null(huge);
    nng_msg *r = raw_call(url, huge, big, 3000);
    cr_expect_null(r, "a frame above the cap got a reply");
    if (r)
        nng_msg_free(r);
    free(huge);
    expect_serving(url);
}

static char *
find_shard_of(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    const msgpack_object *sb;
    sbx_str shard = {"", 0};
    cr_assert_eq(sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb), 0);
    sbx_wire_get_str(sb, "shard", &shard);
    char *s = sbx_str_dup(shard);
    sbx_reply_free(r);
    return s;
}

static pid_t
shard_pid(sbx_client *c, const char *name)
{
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call(c, "cluster.status", NULL, NULL, 0, 0, NULL, &r, &err), 0);
    const msgpack_object *arr;
    pid_t pid = 0;
    cr_assert_eq(sbx_wire_get_array(sbx_reply_result(r), "shards", &arr), 0);
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *s = &arr->via.array.ptr[i], *st;
        sbx_str n = {"", 0};
        sbx_wire_get_str(s, "name", &n);
        int64_t p = 0;
        if (sbx_str_eq(n, name) && sbx_wire_get_map(s, "status", &st) == 0 &&
            sbx_wire_get_i64(st, "pid", &p) == 0)
            pid = (pid_t)p;
    }
    sbx_reply_free(r);
    return pid;
}

Test(daemon, metadata_survives_a_restart, .timeout = 180)
{
    struct testd d;
    cr_assert_eq(testd_start(&d, 2, NULL), 0);
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    const char *ids[] = {"keep-me-one", "keep-me-two", "keep-me-three"};
    for (int i = 0; i < 3; i++) {
        sbx_exec_result r;
        cr_assert_eq(test_sh(c, ids[i], "echo hi", 0, &r, &err), 0, "%s", err.message);
        sbx_exec_result_free(&r);
    }
    sbx_client_close(c);
    cr_assert_eq(testd_restart(&d, 2, NULL), 0);
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    sbx_reply *r = NULL;
    cr_assert_eq(sbx_call(c, "list", NULL, NULL, 0, 0, NULL, &r, &err), 0);
    char *json = sbx_reply_json(r, false);
    for (int i = 0; i < 3; i++)
        cr_expect(strstr(json, ids[i]) != NULL, "%s missing after restart: %s", ids[i], json);
    cr_expect(strstr(json, "\"state\":\"stopped\"") != NULL);
    free(json);
    sbx_reply_free(r);
    /* It works again, in a new container (generation 2). */
    sbx_exec_result er;
    cr_assert_eq(test_sh(c, ids[0], "echo back", 0, &er, &err), 0);
    cr_expect_str_eq(er.stdout_data, "back\n");
    sbx_exec_result_free(&er);
    cr_assert_eq(sbx_call(c, "status", ids[0], NULL, 0, 0, NULL, &r, &err), 0);
    const msgpack_object *sb;
    int64_t gen = 0;
    sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb);
    sbx_wire_get_i64(sb, "generation", &gen);
    cr_expect_eq(gen, 2);
    sbx_reply_free(r);
    sbx_client_close(c);
    testd_stop(&d);
}

Test(daemon, a_dead_or_stopped_shard_gives_shard_unavailable_in_time, .timeout = 180)
{
    struct testd d;
    cr_assert_eq(testd_start(&d, 2, NULL), 0);
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    sbx_exec_result r;
    cr_assert_eq(test_sh(c, "victim", "echo hi", 0, &r, &err), 0);
    sbx_exec_result_free(&r);
    char *shard = find_shard_of(c, "victim");
    pid_t pid = shard_pid(c, shard);
    cr_assert_gt(pid, 0);

    /* A stopped (slow) shard: answered SHARD_UNAVAILABLE within the deadline. */
    kill(pid, SIGSTOP);
    sbx_reply *rep = NULL;
    double t0 = test_now_ms();
    int rc = sbx_call(c, "ping", "victim", NULL, 0, 1500, NULL, &rep, &err);
    double took = test_now_ms() - t0;
    kill(pid, SIGCONT);
    cr_expect_neq(rc, 0);
    cr_expect_str_eq(err.code, "SHARD_UNAVAILABLE", "%s: %s", err.code, err.message);
    cr_expect(took < 1600, "answered after %.0f ms (deadline 1500)", took);
    sbx_error_free(&err);

    /* A dead shard: never a hang; the dev supervisor brings it back and the
     * sandbox answers again with its metadata intact. */
    kill(pid, SIGKILL);
    t0 = test_now_ms();
    rc = sbx_call(c, "ping", "victim", NULL, 0, 5000, NULL, &rep, &err);
    took = test_now_ms() - t0;
    cr_expect(rc == 0 || !strcmp(err.code, "SHARD_UNAVAILABLE"), "%s", err.code);
    cr_expect(took < 5100, "took %.0f ms", took);
    if (rc == 0)
        sbx_reply_free(rep);
    else
        sbx_error_free(&err);
    /* Bounded in wall-clock time, not only in tries: with the deployment
     * gone each try would wait out its whole deadline. */
    bool back = false;
    double until = test_now_ms() + 30000;
    for (int i = 0; i < 100 && !back && test_now_ms() < until; i++) {
        if (test_sh(c, "victim", "echo back", 2000, &r, &err) == 0) {
            back = !strcmp(r.stdout_data, "back\n");
            sbx_exec_result_free(&r);
        } else {
            sbx_error_free(&err);
            usleep(100 * 1000);
        }
    }
    cr_expect(back, "the sandbox did not answer again after its shard was restarted");
    free(shard);
    sbx_client_close(c);
    testd_stop(&d);
}

/* The cgroup directories of shard `shard` (pid spid; sbx/<shard>, the
 * default subtree) in each hierarchy of this host that has one: v1's
 * memory, pids, cpu and cpuacct; on v2, under the cgroup the shard was
 * started in (its own, less the "/sbx-supervisor" leaf it moves to: as
 * test_deploy.c reads it).  Fills dirs (n entries of 300 bytes); returns
 * how many paths it wrote. */
static int
shard_cgroup_dirs(const char *shard, pid_t spid, char dirs[][300], int n)
{
    struct statfs sf;
    int k = 0;
    if (statfs("/sys/fs/cgroup", &sf) == 0 && (unsigned long)sf.f_type == 0x63677270UL) {
        char p[64], line[512] = "";
        snprintf(p, sizeof(p), "/proc/%d/cgroup", (int)spid);
        FILE *f = fopen(p, "r");
        cr_assert_not_null(f, "%s: %s", p, strerror(errno));
        while (fgets(line, sizeof(line), f) && strncmp(line, "0::", 3) != 0)
            ;
        fclose(f);
        cr_assert_eq(strncmp(line, "0::", 3), 0, "no v2 line in %s", p);
        char *own = line + 3;
        own[strcspn(own, "\n")] = '\0';
        char *leaf = strstr(own, "/sbx-supervisor");
        if (leaf && !leaf[15])
            *leaf = '\0';
        snprintf(dirs[k++], 300, "/sys/fs/cgroup%s/sbx/%s", !strcmp(own, "/") ? "" : own, shard);
        return k;
    }
    const char *h[] = {"memory", "pids", "cpu", "cpuacct"};
    for (int i = 0; i < 4 && k < n; i++)
        snprintf(dirs[k++], 300, "/sys/fs/cgroup/%s/sbx/%s", h[i], shard);
    return k;
}

/* pidfds (pidfd_open(2)) of the processes in the sandbox cgroups under dir
 * (one level down: a sandbox's cgroup each), at most n; how many. */
static int
pidfds_under(const char *dir, int *fds, int n)
{
    char cmd[400];
    snprintf(cmd, sizeof(cmd), "cat %s/*/cgroup.procs 2>/dev/null", dir);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    int k = 0;
    long pid;
    while (k < n && fscanf(f, "%ld", &pid) == 1) {
        int fd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
        if (fd >= 0)
            fds[k++] = fd;
    }
    pclose(f);
    return k;
}

/* A one-shard daemon with --stop-timeout 1s and n sandboxes, each running
 * cmd (an exec that returns: background what must stay); the shard's name
 * (shard[128]) and pid. */
static pid_t
start_one_shard(struct testd *d, int n, const char *prefix, const char *cmd, char shard[128])
{
    const char *extra[] = {TESTD_SMALL, "--stop-timeout", "1s", NULL};
    cr_assert_eq(testd_start(d, 1, extra), 0);
    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d->url, &err), 0);
    sbx_exec_result r;
    for (int i = 0; i < n; i++) {
        char id[32];
        snprintf(id, sizeof(id), "%s-%d", prefix, i);
        cr_assert_eq(test_sh(c, id, cmd, 0, &r, &err), 0, "%s", err.message);
        sbx_exec_result_free(&r);
    }
    snprintf(shard, 128, "%s-s0", d->name);
    pid_t spid = shard_pid(c, shard);
    sbx_client_close(c);
    cr_assert_gt(spid, 0);
    cr_assert_eq(test_ppid(spid), d->pid, "shard pid %d is not the daemon's child", (int)spid);
    return spid;
}

/* A shard that does not stop within --stop-timeout (here it is SIGSTOPped:
 * a shard stuck, or one with more sandboxes than it can stop in time) is
 * killed, and a sweep removes what it left: its sandboxes' processes are
 * gone and its cgroups removed when `sbxd dev` has exited. */
Test(daemon, a_shard_that_does_not_stop_in_time_is_killed_and_swept, .timeout = 120)
{
    struct testd d;
    char shard[128];
    pid_t spid = start_one_shard(&d, 3, "stuck", "sleep 1000 & echo started", shard);
    char dirs[4][300];
    int ndirs = shard_cgroup_dirs(shard, spid, dirs, 4);
    int fds[64];
    int nfds = pidfds_under(dirs[0], fds, 64);
    cr_assert_geq(nfds, 6, "%d processes in %s, want the 3 agents and their sleeps", nfds, dirs[0]);

    kill(spid, SIGSTOP);
    kill(d.pid, SIGTERM);
    int st = 0;
    double until = test_now_ms() + 60000;
    pid_t w;
    while ((w = waitpid(d.pid, &st, WNOHANG)) == 0 && test_now_ms() < until)
        usleep(20 * 1000);
    if (w == 0) {
        kill(spid, SIGCONT);
        for (int i = 0; i < nfds; i++)
            close(fds[i]);
        testd_stop(&d); /* by pid: SIGKILL after 20 s, the directory removed */
        cr_assert_fail("sbxd dev did not exit within 60 s");
    } else {
        d.pid = 0; /* reaped: testd_stop must not signal the number again */
    }
    cr_expect(WIFEXITED(st), "sbxd dev ended by signal %d", WIFSIGNALED(st) ? WTERMSIG(st) : 0);
    int alive = 0;
    for (int i = 0; i < nfds; i++) {
        struct pollfd p = {.fd = fds[i], .events = POLLIN};
        /* Readable once the process has exited (a process leaves its
         * cgroup a moment before it becomes a zombie: 1 s of grace). */
        if (poll(&p, 1, 1000) == 0) {
            alive++;
            syscall(SYS_pidfd_send_signal, fds[i], SIGKILL, NULL, 0); /* ours: no leftover */
            poll(&p, 1, 5000);
        }
        close(fds[i]);
    }
    cr_expect_eq(alive, 0, "%d of the sandboxes' %d processes outlived the deployment", alive,
                 nfds);
    for (int i = 0; i < ndirs; i++) {
        struct stat sb;
        bool gone = stat(dirs[i], &sb) != 0 && errno == ENOENT;
        cr_expect(gone, "%s is still there", dirs[i]);
        if (!gone) { /* removed here, so that a failure leaves nothing on the host */
            char cmd[400];
            snprintf(cmd, sizeof(cmd), "find %s -depth -type d -exec rmdir {} + 2>/dev/null",
                     dirs[i]);
            (void)!system(cmd);
        }
    }
    testd_stop(&d);
}

/* Write text to the file dir/name; 0 or -errno. */
static int
put(const char *dir, const char *name, const char *text)
{
    char p[400];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    FILE *f = fopen(p, "we");
    if (!f)
        return -errno;
    int rc = fputs(text, f) < 0 ? -EIO : 0;
    if (fclose(f) != 0 && !rc)
        rc = -errno;
    return rc;
}

/* Whether a cgroup v1 freezer hierarchy is mounted at /sys/fs/cgroup/freezer
 * (CGROUP_SUPER_MAGIC). */
static bool
have_v1_freezer(void)
{
    struct statfs sf;
    return statfs("/sys/fs/cgroup/freezer", &sf) == 0 && (unsigned long)sf.f_type == 0x27e0ebUL;
}

/* Put pid in a new cgroup v1 freezer (frz[300]: its directory, to thaw and
 * remove) and freeze it; state[32] gets the freezer's state after up to 5 s
 * ("FROZEN" when it worked).  Asserts only before anything is frozen. */
static void
freeze(pid_t pid, char frz[300], char state[32])
{
    char pid_s[32], p[400];
    state[0] = '\0';
    snprintf(frz, 300, "/sys/fs/cgroup/freezer/sbx-test-%s%d", test_prefix(), (int)getpid());
    cr_assert_eq(mkdir(frz, 0755), 0, "mkdir %s: %s", frz, strerror(errno));
    snprintf(pid_s, sizeof(pid_s), "%d", (int)pid);
    bool frozen = put(frz, "cgroup.procs", pid_s) == 0 && put(frz, "freezer.state", "FROZEN") == 0;
    for (int i = 0; frozen && i < 250 && strcmp(state, "FROZEN") != 0; i++) {
        usleep(20 * 1000);
        snprintf(p, sizeof(p), "%s/freezer.state", frz);
        FILE *f = fopen(p, "re");
        if (f) {
            if (!fgets(state, 32, f))
                state[0] = '\0';
            state[strcspn(state, "\n")] = '\0';
            fclose(f);
        }
    }
}

/* A shard that cannot die does not hang the stop.  A process in
 * uninterruptible sleep (a hung disk, NFS) takes SIGKILL only when it
 * wakes; here the shard is put in a frozen cgroup v1 freezer, where a
 * fatal signal waits until the cgroup is thawed (cgroup-v1/freezer-subsystem
 * in the kernel's docs; v2's cgroup.freeze lets SIGKILL through, so the
 * test needs v1's).  `sbxd dev` must exit on its own: the stop timeout
 * (1 s), then 10 s for the SIGKILL to work, then status 1 with the
 * shard named in its log.  Until the fix it waited in waitpid forever.
 * The test then thaws the shard (it dies of the pending SIGKILL) and runs
 * the shard's sweep itself, so that nothing is left. */
Test(daemon, a_shard_that_cannot_die_does_not_hang_the_stop, .timeout = 150)
{
    if (!have_v1_freezer())
        cr_skip_test("no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer");
    struct testd d;
    char shard[128];
    pid_t spid = start_one_shard(&d, 1, "frozen", "echo started", shard);
    /* The shard's command line, for its sweep at the end. */
    char cmdline[4096], p[400];
    snprintf(p, sizeof(p), "/proc/%d/cmdline", (int)spid);
    FILE *f = fopen(p, "re");
    cr_assert_not_null(f);
    size_t cl = fread(cmdline, 1, sizeof(cmdline) - 1, f);
    fclose(f);
    cr_assert(cl > 0 && cl < sizeof(cmdline) - 1, "%s: %zu bytes", p, cl);
    char dirs[4][300];
    int ndirs = shard_cgroup_dirs(shard, spid, dirs, 4);
    int sfd = (int)syscall(SYS_pidfd_open, spid, 0);
    cr_assert_geq(sfd, 0, "pidfd_open %d: %s", (int)spid, strerror(errno));

    char frz[300], pid_s[32], state[32];
    snprintf(pid_s, sizeof(pid_s), "%d", (int)spid);
    freeze(spid, frz, state);
    int st = 0;
    pid_t w = 0;
    double t0 = test_now_ms(), took = 0;
    if (!strcmp(state, "FROZEN")) {
        kill(d.pid, SIGTERM);
        while ((w = waitpid(d.pid, &st, WNOHANG)) == 0 && test_now_ms() - t0 < 60000)
            usleep(20 * 1000);
        took = test_now_ms() - t0;
        if (w == d.pid)
            d.pid = 0; /* reaped: testd_stop must not signal the number again */
    }
    /* Thawed whatever happened: the shard dies of its pending SIGKILL (or of
     * testd_stop's, which follows a hung daemon). */
    put(frz, "freezer.state", "THAWED");
    bool stopped = w != 0;
    if (!stopped)
        testd_stop(&d);
    struct pollfd pf = {.fd = sfd, .events = POLLIN};
    if (poll(&pf, 1, 10000) == 0) {
        syscall(SYS_pidfd_send_signal, sfd, SIGKILL, NULL, 0);
        poll(&pf, 1, 10000);
    }
    close(sfd);
    rmdir(frz);
    cr_assert_str_eq(state, "FROZEN", "the freezer did not freeze the shard");
    cr_assert(stopped, "sbxd dev did not exit within 60 s of SIGTERM");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1,
              "sbxd dev ended with %s %d after %.0f ms, want status 1",
              WIFEXITED(st) ? "status" : "signal", WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st),
              took);
    snprintf(p, sizeof(p), "cat %s", d.log);
    char cmd[1200], line[1024];
    bool said = false;
    if ((f = popen(p, "r")) != NULL) {
        while (fgets(line, sizeof(line), f))
            if (strstr(line, "did not die within") && strstr(line, pid_s))
                said = true;
        pclose(f);
    }
    cr_expect(said, "the log does not name shard pid %s as one that did not die (%s)", pid_s,
              d.log);

    /* The shard's sweep: what a restart of the deployment would do. */
    const char *bin = getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    size_t n = (size_t)snprintf(cmd, sizeof(cmd), "'%s/sbxd'", bin);
    for (const char *a = cmdline + strlen(cmdline) + 1; a < cmdline + cl && n < sizeof(cmd);
         a += strlen(a) + 1)
        n += (size_t)snprintf(cmd + n, sizeof(cmd) - n, " '%s'", a);
    cr_assert_lt(n + 40, sizeof(cmd));
    snprintf(cmd + n, sizeof(cmd) - n, " --sweep >/dev/null 2>&1");
    int swept = -1;
    for (int i = 0; i < 25 && swept != 0; i++) { /* status 2 while its agents still die */
        swept = system(cmd);
        swept = WIFEXITED(swept) ? WEXITSTATUS(swept) : -1;
        if (swept == 2)
            usleep(200 * 1000);
    }
    cr_expect_eq(swept, 0, "the sweep of the shard: status %d (%s)", swept, cmd);
    for (int i = 0; i < ndirs; i++) {
        struct stat sb;
        if (stat(dirs[i], &sb) == 0) {
            snprintf(cmd, sizeof(cmd), "find %s -depth -type d -exec rmdir {} + 2>/dev/null",
                     dirs[i]);
            (void)!system(cmd);
            cr_expect(0, "%s was left after the sweep", dirs[i]);
        }
    }
    testd_stop(&d);
}

/* The host pid of a process named comm in a cgroup under dir (one level
 * down), or 0. */
static pid_t
pid_named_under(const char *dir, const char *comm)
{
    char cmd[500];
    snprintf(cmd, sizeof(cmd), "for p in $(cat %s/*/cgroup.procs 2>/dev/null); do "
             "[ \"$(cat /proc/$p/comm 2>/dev/null)\" = %s ] && echo $p; done", dir, comm);
    FILE *f = popen(cmd, "r");
    long pid = 0;
    if (f) {
        if (fscanf(f, "%ld", &pid) != 1)
            pid = 0;
        pclose(f);
    }
    return (pid_t)pid;
}

/* A container that cannot be reaped (a process of it in uninterruptible
 * sleep: here a frozen cgroup v1 freezer, where SIGKILL waits for the thaw)
 * does not take the shard's worker with it: the destroy answers within
 * ~10 s, the shard goes on starting and stopping other containers (two
 * workers on this machine: two such stops held every start), and once the
 * process can die the container's cgroup is removed at the next stop.
 * Until the fix the destroy never answered. */
Test(daemon, a_container_that_cannot_be_reaped_does_not_hold_the_shard, .timeout = 180)
{
    if (!have_v1_freezer())
        cr_skip_test("no cgroup v1 freezer hierarchy at /sys/fs/cgroup/freezer");
    struct testd d;
    char shard[128];
    pid_t spid = start_one_shard(&d, 1, "unreaped", "sleep 1000 & echo started", shard);
    char dirs[4][300];
    int ndirs = shard_cgroup_dirs(shard, spid, dirs, 4);
    cr_assert_geq(ndirs, 1);
    pid_t sleeper = pid_named_under(dirs[0], "sleep");
    cr_assert_gt(sleeper, 0, "no sleep in %s", dirs[0]);
    /* The container's cgroup (the sleeper's, in the first hierarchy). */
    char cgdir[400] = "", p[400], line[512];
    snprintf(p, sizeof(p), "/proc/%d/cgroup", (int)sleeper);
    FILE *f = fopen(p, "re");
    cr_assert_not_null(f);
    const char *want = strstr(dirs[0], "/sbx/");
    while (fgets(line, sizeof(line), f)) {
        char *c = strstr(line, "/sbx/");
        if (want && c && strstr(line, shard)) {
            c[strcspn(c, "\n")] = '\0';
            snprintf(cgdir, sizeof(cgdir), "%.*s%s", (int)(want - dirs[0]), dirs[0], c);
            break;
        }
    }
    fclose(f);
    cr_assert(cgdir[0], "the sleeper's cgroup under %s", dirs[0]);

    sbx_client *c;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0); /* before the freeze: no assert until
                                                         * the thaw */
    char frz[300], pid_s[32], state[32];
    snprintf(pid_s, sizeof(pid_s), "%d", (int)sleeper);
    freeze(sleeper, frz, state);
    int rc = -1, rc2 = -1;
    double took = 0;
    sbx_exec_result r = {0};
    if (!strcmp(state, "FROZEN")) {
        double t0 = test_now_ms();
        sbx_reply *rep = NULL;
        rc = sbx_call(c, "destroy", "unreaped-0", NULL, 0, 40000, NULL, &rep, &err);
        took = test_now_ms() - t0;
        if (rc == 0)
            sbx_reply_free(rep);
        else
            sbx_error_free(&err);
        /* The shard goes on: a new sandbox starts and answers. */
        rc2 = test_sh(c, "after-0", "echo fine", 30000, &r, &err);
        if (rc2 != 0)
            sbx_error_free(&err);
    }
    put(frz, "freezer.state", "THAWED"); /* the sleeper dies of its pending SIGKILL */
    for (int i = 0; i < 100 && rmdir(frz) != 0 && errno == EBUSY; i++)
        usleep(50 * 1000); /* empty once it has died */
    cr_assert_str_eq(state, "FROZEN", "the freezer did not freeze the sleeper");
    cr_expect_eq(rc, 0, "the destroy of the unreapable sandbox did not answer ok (%.0f ms)", took);
    cr_expect(took < 30000, "the destroy took %.0f ms", took);
    cr_expect_eq(rc2, 0, "a new sandbox did not start after it");
    cr_expect(rc2 != 0 || (r.stdout_data && !strcmp(r.stdout_data, "fine\n")), "got %s",
              r.stdout_data ? r.stdout_data : "-");
    sbx_exec_result_free(&r);
    /* Ended now; its cgroup goes at the next stop (this destroy's). */
    struct stat sb;
    bool gone = false;
    for (int i = 0; i < 50 && !gone; i++) {
        usleep(100 * 1000);
        sbx_reply *rep = NULL;
        if (i % 10 == 0 && sbx_call(c, "destroy", "after-0", NULL, 0, 30000, NULL, &rep, &err) == 0)
            sbx_reply_free(rep);
        else if (i % 10 == 0)
            sbx_error_free(&err);
        if (i % 10 == 0) { /* one more container to stop, for the next round */
            if (test_sh(c, "after-0", "true", 30000, &r, &err) == 0)
                sbx_exec_result_free(&r);
            else
                sbx_error_free(&err);
        }
        gone = stat(cgdir, &sb) != 0 && errno == ENOENT;
    }
    cr_expect(gone, "%s is still there after the process could die", cgdir);
    sbx_client_close(c);
    testd_stop(&d);
}

Test(daemon, a_shard_nobody_runs_is_unavailable_at_once, .timeout = 60)
{
    /* A lone gateway whose only shard does not exist. */
    char dir[] = "/tmp/sbx-gw-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char url[300], shard[300], sbxd[300];
    snprintf(url, sizeof(url), "ipc://%s/gw.sock", dir);
    snprintf(shard, sizeof(shard), "ghost=ipc://%s/nobody.sock", dir);
    const char *bin = getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin);
    pid_t pid = fork();
    if (pid == 0) {
        execl(sbxd, sbxd, "gateway", "--listen", url, "--shard", shard, (char *)NULL);
        _exit(127);
    }
    sbx_client *c = NULL;
    sbx_error err;
    for (int i = 0; i < 100 && sbx_client_open(&c, url, &err) != 0; i++)
        usleep(50 * 1000);
    cr_assert_not_null(c);
    sbx_reply *rep = NULL;
    double t0 = test_now_ms();
    int rc = sbx_call(c, "ping", "anyone", NULL, 0, 10000, NULL, &rep, &err);
    double took = test_now_ms() - t0;
    cr_expect_neq(rc, 0);
    cr_expect_str_eq(err.code, "SHARD_UNAVAILABLE");
    cr_expect(took < 1000, "took %.0f ms", took);
    sbx_error_free(&err);
    sbx_client_close(c);
    kill(pid, SIGTERM);
    waitpid(pid, NULL, 0);
    char cmd[350];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* A shard with a TCP preview relay and no relay secret would admit anyone
 * who reaches the port into every exposed port: it refuses to start
 * (exit 2, the usage-error status) and says why, before it creates anything. */
Test(daemon, a_tcp_relay_without_a_secret_is_refused, .timeout = 30)
{
    char dir[] = "/tmp/sbx-relay-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char data[300], cmd[900];
    snprintf(data, sizeof(data), "%s/data", dir);
    const char *bin = getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    snprintf(cmd, sizeof(cmd),
             "%s/sbxd shard --name lonely --listen ipc://%s/s.sock --data %s "
             "--relay tcp:127.0.0.1:1 2>&1",
             bin, dir, data);
    FILE *f = popen(cmd, "r");
    cr_assert_not_null(f);
    char out[1024] = "";
    size_t n = fread(out, 1, sizeof(out) - 1, f);
    out[n] = '\0';
    int st = pclose(f);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %#x: %s", st, out);
    cr_expect(strstr(out, "relay-secret") != NULL, "no reason given: %s", out);
    cr_expect(access(data, F_OK) != 0, "the refused shard created its data directory");
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    cr_expect_eq(system(cmd), 0);
}

/* Durations past 24 h (runtime/wire.h SBX_WIRE_MAX_DURATION_MS) are refused
 * at the gateway with VALIDATION_FAILED, at once: a 2^31 ms timeout used to
 * wrap nng's 32-bit duration into an instant SHARD_UNAVAILABLE, and a 2^63
 * one the agent's deadline into an instant "timed out". */
Test(daemon, out_of_range_durations_are_refused, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("dur");
    static const char *const bad[] = {
        "{\"command\":\"echo hi\",\"timeout\":2147483000}",
        "{\"command\":\"echo hi\",\"timeout\":9223372036854775000}",
        "{\"command\":\"echo hi\",\"timeout\":-5}",
        "{\"command\":\"echo hi\",\"timeout\":\"soon\"}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        sbx_reply *r = NULL;
        sbx_error err;
        double t0 = test_now_ms();
        int rc = sbx_call_json(c, "exec", id, bad[i], 0, &r, &err);
        cr_expect_neq(rc, 0, "%s was accepted", bad[i]);
        if (rc == 0)
            sbx_reply_free(r);
        else
            cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s: %s %s", bad[i], err.code,
                             err.message);
        cr_expect(test_now_ms() - t0 < 5000, "%s took %.0f ms", bad[i], test_now_ms() - t0);
        sbx_error_free(&err);
    }
    /* 24 h itself is fine, and so is a session's commandTimeoutMs of 1 h. */
    sbx_reply *r = NULL;
    sbx_error err;
    cr_expect_eq(sbx_call_json(c, "exec", id, "{\"command\":\"echo hi\",\"timeout\":86400000}", 0,
                               &r, &err),
                 0, "%s %s", err.code, err.message);
    sbx_reply_free(r);
    r = NULL;
    cr_expect_eq(sbx_call_json(c, "session.create", id,
                               "{\"id\":\"s1\",\"commandTimeoutMs\":3600000}", 0, &r, &err),
                 0, "%s %s", err.code, err.message);
    sbx_reply_free(r);
    r = NULL;
    cr_expect_neq(sbx_call_json(c, "session.create", id,
                                "{\"id\":\"s2\",\"commandTimeoutMs\":99999999999}", 0, &r, &err),
                  0, "a 3-year commandTimeoutMs was accepted");
    sbx_reply_free(r);
    sbx_error_free(&err);
    cr_expect_eq(sbx_destroy(c, id, NULL, &err), 0, "destroy: %s", err.code);
    free(id);
    sbx_client_close(c);
}
