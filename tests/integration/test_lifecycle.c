/*
 * test_lifecycle.c — documented lifecycle behaviour, as a user sees it:
 * concurrent destroys (docs/protocol.md "destroy"), sleepAfter and keepAlive
 * (§3.6, `sandbox.configure`), the bound on concurrent retries of one
 * request id (§2 "Idempotency"), a process-log reader that fell behind the
 * ring (§3.1, `missed`), and `file.write` with `append` (§3.4).
 *
 * sleepAfter is counted from the last operation that is activity; `status`
 * and the lists are not (the schema's `observe` flag, docs/schema.md), which
 * observing_is_not_activity checks.  The shard checks for idle sandboxes
 * once a second.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

/* The idle window of the sleep tests: sleepAfter 2 s + the once-a-second
 * check + slack for a loaded machine. */
#define SLEEP_AFTER "2s"
#define IDLE_WAIT_MS 6000

/* state, container pid and generation of a sandbox (status). */
struct st {
    char state[16];
    long long pid, gen;
};

static struct st
state_of(sbx_client *c, const char *id)
{
    json_t *sb = ts_status(c, id);
    struct st s;
    snprintf(s.state, sizeof(s.state), "%s", jstr(sb, "state"));
    s.pid = jint(sb, "container.pid");
    s.gen = jint(sb, "generation");
    json_decref(sb);
    return s;
}

static void
configure(sbx_client *c, const char *id, json_t *args)
{
    tcall t = tc_call(c, "sandbox.configure", id, args, 0);
    tc_ok(t, "sandbox.configure");
    tc_free(&t);
}

/* A stopped sandbox is "stopping" for as long as its container takes to go. */
static bool
asleep(const struct st *s)
{
    return !strcmp(s->state, "stopped") || !strcmp(s->state, "stopping");
}

/* ---------------------------------------------------------------------------------- */
/* destroy */

struct destroyer {
    pthread_t th;
    const char *id;
    pthread_barrier_t *go;
    int rc;
    bool destroyed;
    char code[48];
};

static void *
destroy_main(void *arg)
{
    struct destroyer *d = arg;
    sbx_client *c = test_client();
    sbx_error err;
    pthread_barrier_wait(d->go);
    d->rc = sbx_destroy(c, d->id, &d->destroyed, &err);
    if (d->rc) {
        snprintf(d->code, sizeof(d->code), "%s", err.code);
        sbx_error_free(&err);
    }
    sbx_client_close(c);
    return NULL;
}

Test(lifecycle, four_concurrent_destroys_report_destroyed_exactly_once)
{
    sbx_client *c = test_client();
    char *id = test_id("ddd");
    char *out = tsh_out(c, id, "echo up");
    cr_assert_str_eq(out, "up\n");
    free(out);
    enum { N = 4 };
    struct destroyer d[N];
    pthread_barrier_t go;
    pthread_barrier_init(&go, NULL, N);
    for (int i = 0; i < N; i++) {
        d[i] = (struct destroyer){.id = id, .go = &go};
        pthread_create(&d[i].th, NULL, destroy_main, &d[i]);
    }
    int yes = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(d[i].th, NULL);
        cr_expect_eq(d[i].rc, 0, "destroy %d failed: %s", i, d[i].code);
        yes += d[i].rc == 0 && d[i].destroyed;
    }
    pthread_barrier_destroy(&go);
    cr_expect_eq(yes, 1, "%d of %d concurrent destroys reported destroyed: true", yes, N);
    /* Gone: status does not create it again. */
    tcall t = tc_call(c, "status", id, NULL, 0);
    tc_fails_with(t, "status after destroy", "SANDBOX_NOT_FOUND");
    tc_free(&t);
    free(id);
    sbx_client_close(c);
}

struct runner {
    pthread_t th;
    const char *id, *cmd;
    int rc;
    char code[48];
    double took_ms;
};

static void *
run_main(void *arg)
{
    struct runner *r = arg;
    sbx_client *c = test_client();
    sbx_exec_result res;
    sbx_error err;
    double t0 = test_now_ms();
    r->rc = test_sh(c, r->id, r->cmd, 0, &res, &err);
    r->took_ms = test_now_ms() - t0;
    if (r->rc) {
        snprintf(r->code, sizeof(r->code), "%s", err.code);
        sbx_error_free(&err);
    }
    sbx_exec_result_free(&res);
    sbx_client_close(c);
    return NULL;
}

/* file.exists of path, polled for up to timeout_ms. */
static bool
wait_file(sbx_client *c, const char *id, const char *path, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    bool found = false;
    while (!found && test_now_ms() < until) {
        tcall t = tc_call(c, "file.exists", id, json_pack("{s:s}", "path", path), 0);
        found = t.rc == 0 && jbool(t.res, "exists") == 1;
        tc_free(&t);
        if (!found)
            tsleep_ms(50);
    }
    return found;
}

Test(lifecycle, an_exec_in_flight_during_destroy_is_interrupted)
{
    sbx_client *c = test_client();
    char *id = test_id("dint");
    struct runner r = {.id = id, .cmd = "touch /tmp/started; sleep 30"};
    pthread_create(&r.th, NULL, run_main, &r);
    cr_assert(wait_file(c, id, "/tmp/started", 20000), "the command never started");
    bool destroyed = false;
    sbx_error err;
    cr_assert_eq(sbx_destroy(c, id, &destroyed, &err), 0, "destroy: %s", err.message);
    cr_expect(destroyed, "destroy of a running sandbox said destroyed: false");
    pthread_join(r.th, NULL);
    cr_expect_neq(r.rc, 0, "the exec finished normally through a destroy");
    cr_expect_str_eq(r.code, "OPERATION_INTERRUPTED", "the exec got '%s'", r.code);
    cr_expect(r.took_ms < 15000, "the exec answered after %.0f ms, not at the destroy", r.took_ms);
    /* What comes next is a new sandbox: nothing of the old one is left. */
    char *out = tsh_out(c, id, "test -e /tmp/started && echo old || echo fresh");
    cr_expect_str_eq(out, "fresh\n");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* sleepAfter and keepAlive */

Test(lifecycle, a_running_command_counts_as_activity_and_idleness_then_stops_the_container,
     .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("slexec");
    configure(c, id, json_pack("{s:s}", "sleepAfter", SLEEP_AFTER));
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    struct st before = state_of(c, id);
    cr_assert_str_eq(before.state, "running");
    /* Twice sleepAfter with nothing but the command itself (its timeout
     * bounds the wait should the command's container go from under it). */
    sbx_exec_result r = tsh(c, id, "sleep 4; echo finished", 20000);
    cr_expect_eq(r.exit_code, 0);
    cr_expect_str_eq(r.stdout_data, "finished\n");
    sbx_exec_result_free(&r);
    struct st after = state_of(c, id);
    cr_expect_str_eq(after.state, "running");
    cr_expect_eq(after.pid, before.pid, "the container changed under a running command");
    cr_expect_eq(after.gen, before.gen);
    /* Idle now: stopped, and the next operation starts a fresh container. */
    tsleep_ms(IDLE_WAIT_MS);
    struct st idle = state_of(c, id);
    cr_expect(asleep(&idle), "still %s %d ms after the last operation (sleepAfter %s)",
              idle.state, IDLE_WAIT_MS, SLEEP_AFTER);
    char *out = tsh_out(c, id, "echo again");
    cr_expect_str_eq(out, "again\n");
    free(out);
    cr_expect_eq(state_of(c, id).gen, before.gen + 1, "no fresh container after the sleep");
    tdone(c, id);
    sbx_client_close(c);
}

/* Issue 19: a program polling a sandbox's state (status, process, session,
 * port and context lists every 500 ms) does not keep it awake; once it is
 * stopped, the lists answer empty without starting it again. */
Test(lifecycle, observing_is_not_activity, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("observe");
    configure(c, id, json_pack("{s:s}", "sleepAfter", SLEEP_AFTER));
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    static const char *const lists[] = {"process.list", "session.list", "port.list",
                                        "context.list"};
    double t0 = test_now_ms();
    struct st s = state_of(c, id);
    cr_assert_str_eq(s.state, "running");
    long long gen = s.gen;
    /* Bound: sleepAfter 2 s + the once-a-second check + much slack. */
    while (!asleep(&s) && test_now_ms() - t0 < 20000) {
        for (size_t i = 0; i < SBX_ARRAY_LEN(lists); i++) {
            tcall t = tc_call(c, lists[i], id, json_object(), 0);
            tc_ok(t, lists[i]);
            tc_free(&t);
        }
        tsleep_ms(500);
        s = state_of(c, id);
    }
    cr_expect(asleep(&s), "still %s after %.0f ms of polling (sleepAfter %s)", s.state,
              test_now_ms() - t0, SLEEP_AFTER);
    /* Stopped: the lists are empty and did not start a container. */
    tsleep_ms(1500);
    for (size_t i = 0; i < SBX_ARRAY_LEN(lists); i++) {
        tcall t = tc_call(c, lists[i], id, json_object(), 0);
        tc_ok(t, lists[i]);
        const char *key = !strcmp(lists[i], "process.list")   ? "processes"
                          : !strcmp(lists[i], "session.list") ? "sessions"
                          : !strcmp(lists[i], "port.list")    ? "ports"
                                                              : "contexts";
        json_t *arr = json_object_get(t.res, key);
        cr_expect(json_is_array(arr) && json_array_size(arr) == 0,
                  "%s of a stopped sandbox is not an empty '%s'", lists[i], key);
        tc_free(&t);
    }
    s = state_of(c, id);
    cr_expect(asleep(&s), "a list woke the sandbox: %s", s.state);
    cr_expect_eq(s.gen, gen, "a list started a new container");
    tdone(c, id);
    sbx_client_close(c);
}

Test(lifecycle, an_open_log_stream_counts_as_activity, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("slstream");
    configure(c, id, json_pack("{s:s}", "sleepAfter", SLEEP_AFTER));
    char pid[128], sid[160];
    sbx_exec_opts o = {.command = "sleep 600"};
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &o, NULL, pid, &err), 0, "%s", err.message);
    snprintf(sid, sizeof(sid), "proc:%s", pid);
    struct st before = state_of(c, id);
    cr_assert_str_eq(before.state, "running");
    /* A reader of a quiet process: long polls of 3 s, 9 s in all, nothing else. */
    long long after = 0;
    for (int i = 0; i < 4; i++) {
        double t0 = test_now_ms();
        tcall t = tc_call(c, "stream.read", id,
                          json_pack("{s:s,s:I,s:i}", "streamId", sid, "after", after, "waitMs",
                                    3000), 10000);
        tc_ok(t, "stream.read");
        after = jint_or(t.res, "next", after);
        cr_expect_neq(jbool(t.res, "done"), 1, "the stream of a running process ended");
        if (i > 0)
            cr_expect(test_now_ms() - t0 > 2500, "a heartbeat came after %.0f ms",
                      test_now_ms() - t0);
        tc_free(&t);
    }
    struct st after_st = state_of(c, id);
    cr_expect_str_eq(after_st.state, "running", "the container stopped under an open stream");
    cr_expect_eq(after_st.pid, before.pid, "the container changed under an open stream");
    /* A running background process alone is no activity: it stops. */
    tsleep_ms(IDLE_WAIT_MS);
    struct st idle = state_of(c, id);
    cr_expect(asleep(&idle), "still %s %d ms after the stream was closed", idle.state,
              IDLE_WAIT_MS);
    tdone(c, id);
    sbx_client_close(c);
}

Test(lifecycle, a_sandbox_created_again_after_destroy_has_the_default_settings)
{
    sbx_client *c = test_client();
    char *id = test_id("again");
    tcall t = tc_call(c, "sandbox.configure", id,
                      json_pack("{s:s,s:b}", "sleepAfter", "7s", "keepAlive", 1), 0);
    tc_ok(t, "sandbox.configure");
    tc_free(&t);
    json_t *before = ts_status(c, id);
    cr_expect_eq(jint(before, "sleepAfter"), 7000);
    json_decref(before);
    cr_assert_eq(sbx_destroy(c, id, NULL, NULL), 0);
    /* A new sandbox under the same ID: nothing of the destroyed one's. */
    char *out = tsh_out(c, id, "echo new");
    cr_expect_str_eq(out, "new\n");
    free(out);
    json_t *after = ts_status(c, id);
    cr_expect_eq(jint(after, "sleepAfter"), 600000,
                 "the destroyed sandbox's sleepAfter came back: %lld",
                 (long long)jint(after, "sleepAfter"));
    cr_expect_eq(jbool(after, "keepAlive"), 0, "the destroyed sandbox's keepAlive came back");
    json_decref(after);
    tdone(c, id);
    sbx_client_close(c);
}

Test(lifecycle, keep_alive_keeps_an_idle_sandbox_running_until_it_is_turned_off,
     .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("keep");
    tcall t = tc_call(c, "sandbox.configure", id,
                      json_pack("{s:s,s:b}", "sleepAfter", SLEEP_AFTER, "keepAlive", 1), 0);
    tc_ok(t, "sandbox.configure");
    cr_expect_eq(jint(t.res, "sleepAfter"), 2000);
    cr_expect_eq(jbool(t.res, "keepAlive"), 1);
    tc_free(&t);
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    struct st before = state_of(c, id);
    tsleep_ms(IDLE_WAIT_MS);
    struct st kept = state_of(c, id);
    cr_expect_str_eq(kept.state, "running", "keepAlive: stopped after %d ms idle", IDLE_WAIT_MS);
    cr_expect_eq(kept.pid, before.pid, "keepAlive: the container changed");
    /* Off again (sleepAfter stays): the sandbox sleeps like any other. */
    t = tc_call(c, "sandbox.configure", id, json_pack("{s:b}", "keepAlive", 0), 0);
    tc_ok(t, "sandbox.configure");
    cr_expect_eq(jint(t.res, "sleepAfter"), 2000);
    cr_expect_eq(jbool(t.res, "keepAlive"), 0);
    tc_free(&t);
    tsleep_ms(IDLE_WAIT_MS);
    struct st idle = state_of(c, id);
    cr_expect(asleep(&idle), "still %s %d ms after keepAlive was turned off", idle.state,
              IDLE_WAIT_MS);
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* Retries of one request id */

struct attempt {
    pthread_t th;
    const char *id, *rid;
    const char *args;
    size_t len;
    int rc;
    char code[48], out[64];
    double took_ms;
};

static void *
attempt_main(void *arg)
{
    struct attempt *a = arg;
    sbx_client *c = test_client();
    sbx_reply *r = NULL;
    sbx_error err;
    double t0 = test_now_ms();
    a->rc = sbx_call(c, "exec", a->id, a->args, a->len, 30000, a->rid, &r, &err);
    a->took_ms = test_now_ms() - t0;
    if (a->rc == 0) {
        sbx_str s = {"", 0};
        sbx_wire_get_bin(sbx_reply_result(r), "stdout", &s);
        sbx_str_copy(s, a->out, sizeof(a->out));
        sbx_reply_free(r);
    } else {
        snprintf(a->code, sizeof(a->code), "%s", err.code);
        sbx_error_free(&err);
    }
    sbx_client_close(c);
    return NULL;
}

Test(lifecycle, the_fifth_concurrent_attempt_of_one_request_id_is_resource_busy, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("busy");
    char *out = tsh_out(c, id, ": > /workspace/runs; echo ok");
    free(out);
    char rid[64];
    snprintf(rid, sizeof(rid), "busy-%d", (int)getpid());
    sbx_enc e;
    char *args;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "command", "echo run >> /workspace/runs; sleep 5; echo done");
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &args, &len), 0);
    /* Five attempts with one id while the first runs: four wait for its
     * reply, one more is refused at once. */
    enum { N = 5 };
    struct attempt a[N];
    for (int i = 0; i < N; i++) {
        a[i] = (struct attempt){.id = id, .rid = rid, .args = args, .len = len};
        pthread_create(&a[i].th, NULL, attempt_main, &a[i]);
        tsleep_ms(200);
    }
    int done = 0, busy = 0;
    for (int i = 0; i < N; i++) {
        pthread_join(a[i].th, NULL);
        if (a[i].rc == 0) {
            cr_expect_str_eq(a[i].out, "done\n", "attempt %d", i);
            done++;
        } else {
            cr_expect_str_eq(a[i].code, "RESOURCE_BUSY", "attempt %d failed with %s", i,
                             a[i].code);
            cr_expect(a[i].took_ms < 3000, "RESOURCE_BUSY came after %.0f ms, not at once",
                      a[i].took_ms);
            busy += !strcmp(a[i].code, "RESOURCE_BUSY");
        }
    }
    cr_expect_eq(done, 4, "%d attempts got the command's reply, expected 4", done);
    cr_expect_eq(busy, 1, "%d attempts got RESOURCE_BUSY, expected 1", busy);
    /* "Retry later with the same id": the reply of the one run, not a second run. */
    struct attempt late = {.id = id, .rid = rid, .args = args, .len = len};
    attempt_main(&late);
    cr_expect_eq(late.rc, 0, "the later retry failed: %s", late.code);
    cr_expect_str_eq(late.out, "done\n");
    free(args);
    out = tsh_out(c, id, "wc -l < /workspace/runs");
    cr_expect_str_eq(out, "1\n", "the command ran more than once for one request id");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* A process-log reader behind the ring */

/* keep_tail — the last cap-1 bytes of what was seen so far, d[0..n) last. */
static void
keep_tail(char *tail, size_t cap, const char *d, size_t n)
{
    char tmp[64];
    snprintf(tmp, sizeof(tmp), "%s%s", tail, n > cap - 1 ? d + n - (cap - 1) : d);
    size_t tl = strlen(tmp);
    snprintf(tail, cap, "%s", tl > cap - 1 ? tmp + tl - (cap - 1) : tmp);
}

/* One stream.read of proc:<pid> after `after` (long poll up to 10 s). */
static tcall
read_logs(sbx_client *c, const char *id, const char *sid, long long after)
{
    tcall t = tc_call(c, "stream.read", id,
                      json_pack("{s:s,s:I,s:i,s:i}", "streamId", sid, "after", after, "waitMs",
                                10000, "maxBytes", 1 << 20),
                      30000);
    tc_ok(t, "stream.read");
    return t;
}

Test(lifecycle, a_log_reader_behind_the_ring_is_told_how_many_events_it_missed, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("missed");
    char pid[128], sid[160];
    /* One line, then (when told) 6 MiB in one go: three times the 2 MiB ring. */
    sbx_exec_opts o = {.command = "echo first; while [ ! -e /tmp/go ]; do sleep 0.05; done; "
                                  "head -c 6291456 /dev/zero | tr '\\0' x; echo; echo last"};
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &o, NULL, pid, &err), 0, "%s", err.message);
    snprintf(sid, sizeof(sid), "proc:%s", pid);
    /* The reader has seen everything so far, "first" included. */
    long long after = 0;
    bool first = false;
    for (int i = 0; i < 20 && !first; i++) {
        tcall t = read_logs(c, id, sid, after);
        cr_expect_eq(jint_or(t.res, "missed", 0), 0, "a reader that kept up missed events");
        json_t *evs = jget(t.res, "events");
        for (size_t k = 0; k < json_array_size(evs); k++)
            first |= !strcmp(jstr(json_array_get(evs, k), "data"), "first\n");
        after = jint_or(t.res, "next", after);
        tc_free(&t);
    }
    cr_assert(first, "'first' never came");
    /* Then it falls behind: the process writes 6 MiB and ends unread. */
    char *out = tsh_out(c, id, "touch /tmp/go");
    free(out);
    tcall w = tc_call(c, "process.waitForExit", id,
                      json_pack("{s:s,s:i}", "processId", pid, "timeout", 60000), 70000);
    tc_ok(w, "process.waitForExit");
    cr_expect_eq(jint(w.res, "exitCode"), 0);
    tc_free(&w);
    /* Its next read says how many events it will not see, and goes on right
     * after them; reading on ends with the tail of the output and the exit. */
    tcall t = read_logs(c, id, sid, after);
    long long missed = jint_or(t.res, "missed", 0);
    long long seq0 = jint(t.res, "events.0.seq");
    cr_expect_gt(missed, 0, "a reader 6 MiB behind a 2 MiB ring was not told it missed events");
    cr_expect_eq(seq0, after + missed + 1,
                 "after %lld with %lld missed, the first event is %lld", after, missed, seq0);
    size_t bytes = 0;
    char tail[16] = "", last_type[32] = "";
    bool done = false;
    for (int i = 0; i < 200 && !done; i++) {
        if (i > 0) {
            tc_free(&t);
            t = read_logs(c, id, sid, after);
            cr_expect_eq(jint_or(t.res, "missed", 0), 0, "missed again at read %d", i);
        }
        json_t *evs = jget(t.res, "events");
        for (size_t k = 0; k < json_array_size(evs); k++) {
            json_t *ev = json_array_get(evs, k);
            const char *d = jstr(ev, "data");
            size_t n = strlen(d);
            snprintf(last_type, sizeof(last_type), "%s", jstr(ev, "type"));
            if (!strcmp(last_type, "stdout")) {
                bytes += n;
                keep_tail(tail, sizeof(tail), d, n);
            }
        }
        after = jint_or(t.res, "next", after);
        done = jbool(t.res, "done") == 1;
    }
    tc_free(&t);
    cr_expect(done, "the stream never ended");
    cr_expect_str_eq(last_type, "exit", "the last event is %s", last_type);
    cr_expect(bytes > 0 && bytes <= (2u << 20), "%zu bytes of stdout after the gap (ring 2 MiB)",
              bytes);
    size_t tl = strlen(tail);
    cr_expect(tl >= 7 && !strcmp(tail + tl - 7, "x\nlast\n"), "the output ends with '%s'",
              tail);
    tdone(c, id);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------------- */
/* file.write with append */

static void
write_file(sbx_client *c, const char *id, json_t *args, long long want_bytes)
{
    tcall t = tc_call(c, "file.write", id, args, 0);
    tc_ok(t, "file.write");
    cr_expect_eq(jint(t.res, "bytesWritten"), want_bytes);
    tc_free(&t);
}

static char *
read_text(sbx_client *c, const char *id, const char *path)
{
    char *data = NULL;
    size_t n;
    sbx_error err;
    cr_assert_eq(sbx_read_file(c, id, path, &data, &n, NULL, &err), 0, "read %s: %s", path,
                 err.message);
    return data;
}

Test(lifecycle, file_write_with_append_adds_to_the_end)
{
    sbx_client *c = test_client();
    char *id = test_id("append");
    const char *f = "/workspace/log.txt";
    write_file(c, id, json_pack("{s:s,s:s}", "path", f, "content", "one\n"), 4);
    write_file(c, id, json_pack("{s:s,s:s,s:b}", "path", f, "content", "two\n", "append", 1), 4);
    /* base64 appends the decoded bytes. */
    write_file(c, id,
               json_pack("{s:s,s:s,s:s,s:b}", "path", f, "content", "dGhyZWUK", "encoding",
                         "base64", "append", 1),
               6);
    char *text = read_text(c, id, f);
    cr_expect_str_eq(text, "one\ntwo\nthree\n");
    free(text);
    /* Without append (or append: false) the file is replaced. */
    write_file(c, id, json_pack("{s:s,s:s,s:b}", "path", f, "content", "fresh\n", "append", 0),
               6);
    text = read_text(c, id, f);
    cr_expect_str_eq(text, "fresh\n");
    free(text);
    /* Appending to a file that does not exist creates it, parents included;
     * relative paths resolve against the session's cwd (/workspace). */
    write_file(c, id, json_pack("{s:s,s:s,s:b}", "path", "new/dir/part", "content", "a", "append",
                                1),
               1);
    write_file(c, id, json_pack("{s:s,s:s,s:b}", "path", "new/dir/part", "content", "b", "append",
                                1),
               1);
    text = read_text(c, id, "/workspace/new/dir/part");
    cr_expect_str_eq(text, "ab");
    free(text);
    /* A large file written in parts (as docs/http.md suggests): 3 × 1 MiB. */
    size_t part = 1u << 20;
    char *buf = sbx_xmalloc(part + 1);
    for (int i = 0; i < 3; i++) {
        memset(buf, 'a' + i, part);
        buf[part] = '\0';
        write_file(c, id,
                   json_pack("{s:s,s:s,s:b}", "path", "big", "content", buf, "append", i > 0),
                   (long long)part);
    }
    free(buf);
    char *out = tsh_out(c, id, "wc -c < big; head -c 1 big; tail -c 1 big; "
                               "tr -d a < big | tr -d b | tr -d c | wc -c");
    cr_expect_str_eq(out, "3145728\nac0\n", "size, first and last byte, other bytes");
    free(out);
    /* A flag that is not a boolean is refused, and the file is untouched
     * (it used to be read as false: "append": "yes" replaced the file). */
    static const char *const notbool[] = {"{\"path\":\"big\",\"content\":\"x\",\"append\":\"yes\"}",
                                          "{\"path\":\"big\",\"content\":\"x\",\"append\":1}"};
    for (size_t i = 0; i < 2; i++) {
        sbx_reply *rep = NULL;
        sbx_error err;
        cr_expect_neq(sbx_call_json(c, "file.write", id, notbool[i], 0, &rep, &err), 0,
                      "%s was accepted", notbool[i]);
        cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s: %s", notbool[i], err.message);
        sbx_reply_free(rep);
        sbx_error_free(&err);
    }
    out = tsh_out(c, id, "wc -c < big; ls new/ 2>&1");
    cr_expect_str_eq(out, "3145728\ndir\n", "the refused writes changed something");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}
