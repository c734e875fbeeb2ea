/*
 * test_idem.c — exactly-once retries (issue 11 item 6): a request re-sent
 * with its request id after the shard that ran it was SIGKILLed and
 * restarted gets the reply of its first run; the operation does not run
 * again — nor does one the kill interrupted mid-run (it is answered
 * OPERATION_INTERRUPTED).
 *
 * Each test starts its own one-shard `sbxd dev` (unique name, own temporary
 * directory), kills only the shard process it finds as a child of that
 * daemon (checked through /proc), and stops the daemon in .fini.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"

static struct testd *live_testd;

static void
cleanup(void)
{
    if (live_testd && live_testd->pid > 0)
        testd_stop(live_testd);
    live_testd = NULL;
}

/* The pid of the deployment's only shard, from cluster.status (0 if it is
 * not up). */
static pid_t
shard_pid(sbx_client *c)
{
    tcall t = tc_call(c, "cluster.status", NULL, NULL, 5000);
    pid_t pid = t.rc == 0 ? (pid_t)jint_or(t.res, "shards.0.status.pid", 0) : 0;
    tc_free(&t);
    return pid;
}

/* exec `cmd` in sandbox id with request id rid, timeout ms; the call's rc,
 * and its stdout in out (heap, caller frees) on success, else the error code
 * in code. */
static int
exec_rid_ms(sbx_client *c, const char *id, const char *rid, const char *cmd, int64_t ms,
            char **out, char code[48])
{
    sbx_enc e;
    char *args;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "command", cmd);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &args, &len), 0);
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call(c, "exec", id, args, len, ms, rid, &r, &err);
    free(args);
    *out = NULL;
    code[0] = '\0';
    if (rc == 0) {
        sbx_str so = {"", 0};
        sbx_wire_get_bin(sbx_reply_result(r), "stdout", &so);
        *out = sbx_xstrndup(so.p, so.n);
    } else {
        snprintf(code, 48, "%s", err.code);
    }
    sbx_error_free(&err);
    sbx_reply_free(r);
    return rc;
}

static int
exec_rid(sbx_client *c, const char *id, const char *rid, const char *cmd, char **out,
         char code[48])
{
    return exec_rid_ms(c, id, rid, cmd, 30000, out, code);
}

/* SIGKILL the daemon's shard and wait until its supervisor runs a new one
 * that answers. */
static void
kill_shard_and_wait(struct testd *d, sbx_client *c)
{
    pid_t old = shard_pid(c);
    cr_assert_gt(old, 1, "no shard pid in cluster.status");
    cr_assert_eq(test_ppid(old), d->pid, "shard %d is not a child of our sbxd dev %d", (int)old,
                 (int)d->pid);
    cr_assert_eq(kill(old, SIGKILL), 0, "kill shard %d", (int)old);
    double until = test_now_ms() + 60000;
    pid_t now = 0;
    while (test_now_ms() < until) {
        now = shard_pid(c);
        if (now > 1 && now != old)
            break;
        tsleep_ms(100);
    }
    cr_assert(now > 1 && now != old, "sbxd dev did not restart its shard (was %d)", (int)old);
    cr_assert_eq(testd_wait_ready(d->url, 30000), 0, "the restarted shard is not ready");
}

Test(idem, retry_after_a_shard_restart_gets_the_first_reply_and_runs_nothing, .timeout = 180,
     .fini = cleanup)
{
    static struct testd d;
    static const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start");
    live_testd = &d;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0, "client: %s", err.message);

    char id[64], rid[64], code[48];
    snprintf(id, sizeof(id), "idem-%d", (int)getpid());
    snprintf(rid, sizeof(rid), "idem-rid-%d", (int)getpid());
    /* Every run prints a fresh random value: a second run could not repeat it. */
    const char *cmd = "cat /proc/sys/kernel/random/uuid";
    char *first = NULL;
    cr_assert_eq(exec_rid(c, id, rid, cmd, &first, code), 0, "first exec: %s", code);
    cr_assert_eq(strlen(first), 37, "not a uuid: '%s'", first);

    /* Within one shard life the retry gets the recorded reply (as before). */
    char *again = NULL;
    cr_assert_eq(exec_rid(c, id, rid, cmd, &again, code), 0, "retry: %s", code);
    cr_expect_str_eq(again, first, "the retry ran the command again");
    free(again);
    /* An exec's reply leaves before its recorded copy commits (its intent is
     * already durable: docs/protocol.md §2), so a kill in the next fraction
     * of a millisecond would leave only the intent and make the retry below
     * OPERATION_INTERRUPTED.  The store commits in order, so once a later
     * agent operation has started (its own intent committed) the first
     * reply's record is on disk: that is the case this test is about. */
    char rid_later[80], *later = NULL;
    snprintf(rid_later, sizeof(rid_later), "%s-later", rid);
    cr_assert_eq(exec_rid(c, id, rid_later, "true", &later, code), 0, "later exec: %s", code);
    free(later);

    kill_shard_and_wait(&d, c);

    /* After the restart the sandbox's container is gone (no container
     * survives its shard); the retry gets the first run's output and does
     * not start one to run the command again. */
    char *after = NULL;
    int rc = exec_rid(c, id, rid, cmd, &after, code);
    cr_assert_eq(rc, 0, "retry after the restart: %s", code);
    cr_expect_str_eq(after, first, "the retry after the shard restart ran the command again");
    free(after);
    tcall t = tc_call(c, "status", id, NULL, 10000);
    tc_ok(t, "status");
    cr_expect_str_neq(jstr(t.res, "state"), "running",
                      "the retry started the sandbox's container again");
    tc_free(&t);

    /* Another request id is another request: it runs. */
    char rid2[80], *other = NULL;
    snprintf(rid2, sizeof(rid2), "%s-b", rid);
    cr_assert_eq(exec_rid(c, id, rid2, cmd, &other, code), 0, "new request: %s", code);
    cr_expect_str_neq(other, first, "a new request id got an old reply");
    free(other);
    free(first);

    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
}

/* The recorded reply is kept for --idem-ttl, then it goes (docs/protocol.md
 * §2): the same request id runs again. */
Test(idem, a_recorded_reply_expires_after_the_ttl, .timeout = 120, .fini = cleanup)
{
    static struct testd d;
    static const char *const extra[] = {TESTD_SMALL, "--idem-ttl", "1s", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start");
    live_testd = &d;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0, "client: %s", err.message);
    char id[64], rid[64], code[48];
    snprintf(id, sizeof(id), "idemttl-%d", (int)getpid());
    snprintf(rid, sizeof(rid), "idemttl-rid-%d", (int)getpid());
    const char *cmd = "cat /proc/sys/kernel/random/uuid";
    char *first = NULL, *later = NULL;
    cr_assert_eq(exec_rid(c, id, rid, cmd, &first, code), 0, "first exec: %s", code);
    /* TTL 1 s; the shard sweeps every second. */
    tsleep_ms(3500);
    cr_assert_eq(exec_rid(c, id, rid, cmd, &later, code), 0, "exec after the TTL: %s", code);
    cr_expect_str_neq(later, first, "the reply was still recorded 3.5 s after a 1 s TTL");
    free(first);
    free(later);
    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
}

/* Host processes whose argv[0] is mark (a command run as `exec -a mark`):
 * how many are alive now. */
static int
count_marked(const char *mark)
{
    DIR *d = opendir("/proc");
    cr_assert_not_null(d, "opendir /proc");
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char path[300], *buf = NULL;
        size_t len;
        snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
        if (sbx_fs_read(path, 4096, &buf, &len) != 0)
            continue;
        if (len > strlen(mark) && !memcmp(buf, mark, strlen(mark) + 1))
            n++;
        free(buf);
    }
    closedir(d);
    return n;
}

struct bg_exec {
    const char *url, *id, *rid, *cmd;
    int64_t ms;
    int rc;
    char code[48];
    _Atomic int done;
};

/* The first attempt, on its own client: it is in flight when the shard dies. */
static void *
bg_exec_run(void *arg)
{
    struct bg_exec *b = arg;
    sbx_client *c = NULL;
    sbx_error err;
    b->rc = -1;
    if (sbx_client_open(&c, b->url, &err) != 0) {
        snprintf(b->code, sizeof(b->code), "%s", err.code);
        sbx_error_free(&err);
        return NULL;
    }
    char *out = NULL;
    b->rc = exec_rid_ms(c, b->id, b->rid, b->cmd, b->ms, &out, b->code);
    free(out);
    sbx_client_close(c);
    b->done = 1;
    return NULL;
}

/* issue 11 "0 double executions": an exec running in its container when the
 * shard is SIGKILLed is not run again by a retry of its request id after the
 * restart; the retry (and every later one) gets OPERATION_INTERRUPTED, and a
 * new request id runs the command. */
Test(idem, a_retry_of_an_exec_the_shard_crash_interrupted_does_not_run_it_again,
     .timeout = 240, .fini = cleanup)
{
    static struct testd d;
    static const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start");
    live_testd = &d;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0, "client: %s", err.message);

    char id[64], rid[64], mark[80], cmd[200], code[48];
    snprintf(id, sizeof(id), "idemint-%d", (int)getpid());
    snprintf(rid, sizeof(rid), "idemint-rid-%d", (int)getpid());
    snprintf(mark, sizeof(mark), "sbxmark-%s", rid);
    snprintf(cmd, sizeof(cmd), "/bin/bash -c 'exec -a %s sleep 30'", mark);
    char *out = NULL;
    cr_assert_eq(exec_rid(c, id, "idemint-warm", "true", &out, code), 0, "warm-up: %s", code);
    free(out);

    struct bg_exec b = {.url = d.url, .id = id, .rid = rid, .cmd = cmd, .ms = 60000};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, bg_exec_run, &b), 0);
    double until = test_now_ms() + 30000;
    while (count_marked(mark) == 0 && test_now_ms() < until)
        tsleep_ms(20);
    cr_assert_eq(count_marked(mark), 1, "the first attempt's command is not running");

    kill_shard_and_wait(&d, c);
    pthread_join(th, NULL);
    cr_expect_neq(b.rc, 0, "the first attempt got a success although its shard died");
    until = test_now_ms() + 10000;
    while (count_marked(mark) > 0 && test_now_ms() < until)
        tsleep_ms(50);
    cr_assert_eq(count_marked(mark), 0, "the first run outlived its shard");

    /* The retry: not run again (its command would show up under its
     * marker while the retry waits), but answered, and the same again on a
     * second retry. */
    for (int i = 0; i < 2; i++) {
        struct bg_exec r = {.url = d.url, .id = id, .rid = rid, .cmd = cmd, .ms = 10000};
        cr_assert_eq(pthread_create(&th, NULL, bg_exec_run, &r), 0);
        int seen = 0;
        while (!r.done) {
            seen += count_marked(mark);
            tsleep_ms(20);
        }
        pthread_join(th, NULL);
        cr_expect_eq(seen, 0, "retry %d ran the interrupted command again", i + 1);
        cr_assert_neq(r.rc, 0, "retry %d of the interrupted exec succeeded", i + 1);
        cr_assert_str_eq(r.code, "OPERATION_INTERRUPTED", "retry %d answered %s", i + 1, r.code);
    }

    /* A new request id runs it anew. */
    char rid2[80];
    snprintf(rid2, sizeof(rid2), "%s-b", rid);
    cr_assert_eq(exec_rid(c, id, rid2, "echo anew", &out, code), 0, "new request: %s", code);
    cr_expect_str_eq(out, "anew\n");
    free(out);

    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
}
