/*
 * test_streams.c — streamed exec output and stream reads (docs/protocol.md
 * §3.1) through the C client against a private sbxd: event order and
 * content (start, stdout/stderr chunks, complete), live delivery, resuming
 * from a sequence number with a second handle, idempotent raw stream.read,
 * back-pressure on a 50 MB producer whose reader pauses, stream.cancel,
 * the process log stream `proc:<id>` (replay, live output, exit) and
 * STREAM_NOT_FOUND.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

/* open_stream — exec.stream with a shell command in the default session. */
static sbx_stream *
open_stream(sbx_client *c, const char *id, const char *cmd)
{
    sbx_exec_opts o = {.command = cmd};
    sbx_stream *s = NULL;
    sbx_error err;
    int rc = sbx_exec_stream(c, id, &o, &s, &err);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s %s", err.code, err.message);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "exec.stream '%s': %s", cmd, msg);
    cr_assert(sbx_stream_id(s)[0], "exec.stream returned no streamId");
    return s;
}

/* next — sbx_stream_next that asserts on errors; 1 or 0 at the end. */
static int
next(sbx_stream *s, sbx_event *ev)
{
    sbx_error err;
    int rc = sbx_stream_next(s, ev, &err);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s %s", err.code, err.message);
    if (rc < 0)
        sbx_error_free(&err);
    cr_assert_geq(rc, 0, "stream.read of %s failed: %s", sbx_stream_id(s), msg);
    return rc;
}

/* Field readers on a raw event map. */
static bool
ev_bool(const sbx_event *ev, const char *key)
{
    bool v = false;
    sbx_wire_get_bool(ev->obj, key, &v);
    return v;
}

static sbx_str
ev_str(const sbx_event *ev, const char *key)
{
    sbx_str v = {"", 0};
    sbx_wire_get_str(ev->obj, key, &v);
    return v;
}

/* Everything a stream produced, gathered by drain(). */
struct drained {
    sbx_buf out, err;
    uint64_t first_seq, last_seq, count;
    bool seq_contiguous, saw_complete, complete_last, saw_start, start_first;
    int exit_code;
    bool cancelled;
    char last_type[32];
};

static void
drained_free(struct drained *d)
{
    sbx_buf_free(&d->out);
    sbx_buf_free(&d->err);
}

/* drain — read s to its end, checking sequence numbers as it goes. */
static void
drain(sbx_stream *s, struct drained *d)
{
    sbx_event ev;
    memset(d, 0, sizeof(*d));
    sbx_buf_init(&d->out);
    sbx_buf_init(&d->err);
    d->seq_contiguous = true;
    d->exit_code = -1;
    uint64_t prev = sbx_stream_last(s);
    while (next(s, &ev) == 1) {
        if (d->count == 0)
            d->first_seq = ev.seq;
        if (ev.seq != prev + 1)
            d->seq_contiguous = false;
        prev = ev.seq;
        d->last_seq = ev.seq;
        if (!strcmp(ev.type, "start")) {
            d->saw_start = true;
            d->start_first = d->count == 0;
        } else if (!strcmp(ev.type, "stdout")) {
            cr_expect_leq(ev.data_len, 65536u, "a stdout event of %zu bytes", ev.data_len);
            sbx_buf_append(&d->out, ev.data, ev.data_len);
        } else if (!strcmp(ev.type, "stderr")) {
            sbx_buf_append(&d->err, ev.data, ev.data_len);
        } else if (!strcmp(ev.type, "complete")) {
            d->saw_complete = true;
            d->exit_code = ev.has_exit_code ? ev.exit_code : -1;
            d->cancelled = ev_bool(&ev, "cancelled");
        }
        snprintf(d->last_type, sizeof(d->last_type), "%s", ev.type);
        d->count++;
    }
    d->complete_last = !strcmp(d->last_type, "complete");
}

Test(streams, events_arrive_in_order_with_the_exact_output, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-order");
    sbx_stream *s = open_stream(c, id, "printf 'alpha\\nbeta\\n'; echo 'to err' >&2; sleep 0.2; "
                                       "printf gamma; echo more-err >&2; (exit 3)");
    struct drained d;
    drain(s, &d);
    cr_expect(d.saw_start && d.start_first, "the first event is not `start`");
    cr_expect_eq(d.first_seq, 1, "the first seq is %llu", (unsigned long long)d.first_seq);
    cr_expect(d.seq_contiguous, "sequence numbers are not 1, 2, 3, …");
    cr_expect(d.complete_last, "the last event is %s, not complete", d.last_type);
    cr_expect_eq(d.exit_code, 3, "complete has exitCode %d", d.exit_code);
    cr_expect(d.out.len == 16 && !memcmp(d.out.p, "alpha\nbeta\ngamma", 16),
              "stdout events concatenate to '%.*s'", (int)d.out.len, d.out.p);
    cr_expect(d.err.len == 16 && !memcmp(d.err.p, "to err\nmore-err\n", 16),
              "stderr events concatenate to '%.*s'", (int)d.err.len, d.err.p);
    drained_free(&d);
    sbx_stream_close(s);
    /* The complete event of a successful command. */
    s = open_stream(c, id, "echo ok");
    sbx_event ev;
    bool success = false;
    int code = -1;
    while (next(s, &ev) == 1)
        if (!strcmp(ev.type, "complete")) {
            success = ev_bool(&ev, "success");
            code = ev.exit_code;
        }
    cr_expect(success && code == 0, "complete: success %d exitCode %d", success, code);
    sbx_stream_close(s);
    tdone(c, id);
    sbx_client_close(c);
}

Test(streams, exit_in_the_session_ends_the_stream_with_an_error_event, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-exit");
    sbx_exec_result r = tsh(c, id, "echo warm", 0);
    sbx_exec_result_free(&r);
    sbx_stream *s = open_stream(c, id, "echo bye; exit 3");
    sbx_event ev;
    char last[32] = "";
    sbx_str code = {"", 0};
    char codebuf[48] = "";
    while (next(s, &ev) == 1) {
        snprintf(last, sizeof(last), "%s", ev.type);
        const msgpack_object *e;
        if (!strcmp(ev.type, "error") && sbx_wire_get_map(ev.obj, "error", &e) == 0 &&
            sbx_wire_get_str(e, "code", &code) == 0)
            sbx_str_copy(code, codebuf, sizeof(codebuf));
    }
    cr_expect_str_eq(last, "error", "the stream of `exit 3` ended with %s", last);
    cr_expect_str_eq(codebuf, "SESSION_TERMINATED");
    sbx_stream_close(s);
    r = tsh(c, id, "echo fresh", 0);
    cr_expect_str_eq(r.stdout_data, "fresh\n");
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(streams, output_arrives_live, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-live");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    double t0 = test_now_ms();
    sbx_stream *s = open_stream(c, id, "echo first; sleep 2; echo second");
    sbx_event ev;
    double first = -1, second = -1, done = -1;
    while (next(s, &ev) == 1) {
        double now = test_now_ms() - t0;
        if (!strcmp(ev.type, "stdout")) {
            if (ev.data_len >= 6 && !memcmp(ev.data, "first", 5) && first < 0)
                first = now;
            if (memmem(ev.data, ev.data_len, "second", 6))
                second = now;
        }
        if (!strcmp(ev.type, "complete"))
            done = now;
    }
    cr_expect(first >= 0 && first < 1500,
              "the first line arrived after %.0f ms (it was printed at once)", first);
    cr_expect(second >= 1900, "the second line arrived after %.0f ms", second);
    cr_expect(done >= 1900, "complete after %.0f ms", done);
    sbx_stream_close(s);
    tdone(c, id);
    sbx_client_close(c);
}

Test(streams, a_second_handle_resumes_after_k_without_loss_or_repeat, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-resume");
    sbx_stream *a = open_stream(c, id, "for i in $(seq 1 40); do echo line$i; sleep 0.02; done");
    sbx_buf got;
    sbx_buf_init(&got);
    sbx_event ev;
    const uint64_t k = 8;
    while (sbx_stream_last(a) < k && next(a, &ev) == 1)
        if (!strcmp(ev.type, "stdout"))
            sbx_buf_append(&got, ev.data, ev.data_len);
    cr_assert_eq(sbx_stream_last(a), k, "the first handle stopped at %llu",
                 (unsigned long long)sbx_stream_last(a));
    char sid[80];
    snprintf(sid, sizeof(sid), "%s", sbx_stream_id(a));
    sbx_stream_close(a);
    /* A new handle, as after a lost reply or another gateway. */
    sbx_stream *b = NULL;
    sbx_error err;
    cr_assert_eq(sbx_stream_open(c, id, sid, k, &b, &err), 0, "%s", err.message);
    struct drained d;
    drain(b, &d);
    cr_expect_eq(d.first_seq, k + 1, "the second handle started at seq %llu",
                 (unsigned long long)d.first_seq);
    cr_expect(d.seq_contiguous, "events were lost or repeated");
    cr_expect(d.complete_last && d.exit_code == 0, "ended with %s exit %d", d.last_type,
              d.exit_code);
    sbx_buf_append(&got, d.out.p, d.out.len);
    sbx_buf expect;
    sbx_buf_init(&expect);
    for (int i = 1; i <= 40; i++)
        sbx_buf_appendf(&expect, "line%d\n", i);
    cr_expect(got.len == expect.len && !memcmp(got.p, expect.p, got.len),
              "the output read through two handles differs:\n%.*s", (int)got.len, got.p);
    sbx_buf_free(&expect);
    sbx_buf_free(&got);
    drained_free(&d);
    sbx_stream_close(b);
    tdone(c, id);
    sbx_client_close(c);
}

/* read_raw — one stream.read; asserts success. */
static tcall
read_raw(sbx_client *c, const char *id, const char *sid, long long after, int wait_ms)
{
    tcall t = tc_call(c, "stream.read", id,
                      json_pack("{s:s, s:I, s:i}", "streamId", sid, "after", after, "waitMs",
                                wait_ms),
                      0);
    return t;
}

static const msgpack_object *
raw_events(const tcall *t)
{
    const msgpack_object *arr = NULL;
    if (t->rep)
        sbx_wire_get_array(sbx_reply_result(t->rep), "events", &arr);
    return arr;
}

Test(streams, raw_stream_read_with_the_same_after_is_idempotent, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-idem");
    sbx_stream *s = open_stream(c, id, "seq 1 3000; echo err-line >&2; sleep 1.5; echo tail");
    char sid[80];
    snprintf(sid, sizeof(sid), "%s", sbx_stream_id(s));
    tsleep_ms(700); /* everything but the tail is out */
    tcall t1 = read_raw(c, id, sid, 0, 1000);
    tc_ok(t1, "stream.read after 0");
    tcall t2 = read_raw(c, id, sid, 0, 1000);
    tc_ok(t2, "stream.read after 0 (again)");
    const msgpack_object *e1 = raw_events(&t1), *e2 = raw_events(&t2);
    cr_assert(e1 && e2, "stream.read has no events array");
    cr_expect_gt(e1->via.array.size, 1, "only %u events", e1->via.array.size);
    cr_expect_eq(e1->via.array.size, e2->via.array.size, "%u events, then %u",
                 e1->via.array.size, e2->via.array.size);
    for (uint32_t i = 0; i < e1->via.array.size && i < e2->via.array.size; i++) {
        const msgpack_object *a = &e1->via.array.ptr[i], *b = &e2->via.array.ptr[i];
        int64_t sa = -1, sb = -2;
        sbx_str ta = {"", 0}, tb = {"", 0}, da = {"", 0}, db = {"", 0};
        sbx_wire_get_i64(a, "seq", &sa);
        sbx_wire_get_i64(b, "seq", &sb);
        sbx_wire_get_str(a, "type", &ta);
        sbx_wire_get_str(b, "type", &tb);
        sbx_wire_get_bin(a, "data", &da);
        sbx_wire_get_bin(b, "data", &db);
        cr_expect_eq(sa, (int64_t)i + 1, "event %u has seq %lld", i, (long long)sa);
        cr_expect(sa == sb && ta.n == tb.n && !memcmp(ta.p, tb.p, ta.n) && da.n == db.n &&
                      (da.n == 0 || !memcmp(da.p, db.p, da.n)),
                  "event %u differs between the two reads", i);
    }
    long long next1 = jint(t1.res, "next"), next2 = jint(t2.res, "next");
    cr_expect_eq(next1, next2, "next %lld then %lld", next1, next2);
    cr_expect_eq(next1, (long long)e1->via.array.size, "next %lld for %u events", next1,
                 e1->via.array.size);
    cr_expect_eq(jbool(t1.res, "done"), 0, "done before the command ended");
    cr_expect_str_eq(jstr(t1.res, "streamId"), sid);
    tc_free(&t2);
    /* Reading from the middle returns the tail of the same events. */
    if (e1->via.array.size > 2) {
        t2 = read_raw(c, id, sid, 2, 1000);
        tc_ok(t2, "stream.read after 2");
        const msgpack_object *e3 = raw_events(&t2);
        int64_t s0 = -1;
        if (e3 && e3->via.array.size)
            sbx_wire_get_i64(&e3->via.array.ptr[0], "seq", &s0);
        cr_expect_eq(s0, 3, "after=2 starts at seq %lld", (long long)s0);
        tc_free(&t2);
    }
    /* after beyond the last event is a validation error. */
    t2 = read_raw(c, id, sid, 1000000, 100);
    tc_fails_with(t2, "stream.read after 1000000", "VALIDATION_FAILED");
    tc_free(&t2);
    /* The rest of the stream continues where the raw reads left off. */
    sbx_stream *rest = NULL;
    cr_assert_eq(sbx_stream_open(c, id, sid, (uint64_t)next1, &rest, NULL), 0);
    struct drained d;
    drain(rest, &d);
    cr_expect(d.seq_contiguous && d.first_seq == (uint64_t)next1 + 1, "resumed at %llu",
              (unsigned long long)d.first_seq);
    cr_expect(d.complete_last, "ended with %s", d.last_type);
    cr_expect(memmem(d.out.p ? d.out.p : "", d.out.len, "tail\n", 5) != NULL, "no tail");
    drained_free(&d);
    sbx_stream_close(rest);
    tc_free(&t1);
    sbx_stream_close(s);
    tdone(c, id);
    sbx_client_close(c);
}

/* check_seq — compare data with the output of `seq 1 N`, continuing from
 * (*n, *off): the current number and the offset inside its text. */
static bool
check_seq(const char *p, size_t len, unsigned *n, size_t *off)
{
    char cur[16];
    int k = snprintf(cur, sizeof(cur), "%u\n", *n);
    for (size_t i = 0; i < len; i++) {
        if (p[i] != cur[*off])
            return false;
        if (++*off == (size_t)k) {
            ++*n;
            *off = 0;
            k = snprintf(cur, sizeof(cur), "%u\n", *n);
        }
    }
    return true;
}

Test(streams, back_pressure_bounds_memory_and_loses_nothing, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-bp");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    long long before = ts_memory(c, id);
    const size_t total = 50000000;
    sbx_stream *s = open_stream(c, id, "seq 1 10000000 | head -c 50000000");
    sbx_event ev;
    cr_assert_eq(next(s, &ev), 1);
    cr_expect_str_eq(ev.type, "start");
    /* The reader pauses for 3 s; the command must wait for it. */
    long long peak = before;
    for (int i = 0; i < 6; i++) {
        tsleep_ms(500);
        long long m = ts_memory(c, id);
        if (m > peak)
            peak = m;
    }
    cr_expect(peak - before < (20LL << 20),
              "memoryBytes grew by %lld bytes (from %lld to %lld) while the reader paused",
              peak - before, before, peak);
    /* The producer is blocked, not finished. */
    sbx_exec_opts po = {.command = "ps -eo comm= | grep -c '^head$' || true", .sessionless = true};
    sbx_exec_result r = tsh_opts(c, id, &po);
    cr_expect_str_eq(r.stdout_data, "1\n", "head is not running any more during the pause: %s",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    /* Now everything arrives, intact and in order. */
    size_t got = 0;
    unsigned n = 1;
    size_t off = 0;
    bool same = true, complete = false, contiguous = true;
    uint64_t prev = ev.seq;
    int code = -1;
    while (next(s, &ev) == 1) {
        if (ev.seq != prev + 1)
            contiguous = false;
        prev = ev.seq;
        if (!strcmp(ev.type, "stdout")) {
            if (same && !check_seq(ev.data, ev.data_len, &n, &off)) {
                same = false;
                cr_expect(false, "the output differs from seq's near byte %zu", got);
            }
            got += ev.data_len;
        } else if (!strcmp(ev.type, "complete")) {
            complete = true;
            code = ev.exit_code;
        }
    }
    cr_expect_eq(got, total, "received %zu of %zu bytes", got, total);
    cr_expect(same, "content differs");
    cr_expect(contiguous, "sequence numbers have gaps");
    cr_expect(complete && code == 0, "complete %d exit %d", complete, code);
    sbx_stream_close(s);
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "restarts"), 0, "the container died (lastExit: %s)",
                 jstr(sb, "lastExit"));
    json_decref(sb);
    tdone(c, id);
    sbx_client_close(c);
}

Test(streams, cancel_ends_the_command_and_the_sandbox_stays_healthy, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-cancel");
    sbx_stream *s = open_stream(c, id, "echo started; sleep 100; echo never");
    sbx_event ev;
    bool started = false;
    while (!started && next(s, &ev) == 1)
        started = !strcmp(ev.type, "stdout") && memmem(ev.data, ev.data_len, "started", 7);
    cr_assert(started, "the command never printed `started`");
    double t0 = test_now_ms();
    sbx_error err;
    cr_assert_eq(sbx_stream_cancel(s, &err), 0, "stream.cancel: %s %s", err.code, err.message);
    struct drained d;
    drain(s, &d);
    double took = test_now_ms() - t0;
    cr_expect(d.complete_last, "the stream ended with %s, not complete", d.last_type);
    cr_expect(d.cancelled || d.exit_code == 130, "complete: cancelled %d, exitCode %d",
              d.cancelled, d.exit_code);
    cr_expect_eq(d.exit_code, 130, "exitCode %d after cancel", d.exit_code);
    cr_expect(memmem(d.out.p ? d.out.p : "", d.out.len, "never", 5) == NULL,
              "the command went on after the cancel");
    cr_expect(took < 5000, "the stream ended %.0f ms after the cancel", took);
    drained_free(&d);
    sbx_stream_close(s);
    /* The sandbox (and its default session) keep working; the sleep is gone. */
    sbx_exec_result r = tsh(c, id, "echo next; ps -eo comm= | grep -c '^sleep$' || true", 10000);
    cr_expect_eq(r.exit_code, 0);
    cr_expect_str_eq(r.stdout_data, "next\n0\n", "after the cancel: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(streams, process_log_stream_replays_then_follows_then_exits, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-proc");
    sbx_exec_opts o = {.command = "echo one; echo two >&2; sleep 2; echo three; exit 4"};
    char pid[128], sid[160];
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &o, "logger", pid, &err), 0, "%s", err.message);
    snprintf(sid, sizeof(sid), "proc:%s", pid);
    tsleep_ms(500);
    double t0 = test_now_ms();
    sbx_stream *s = NULL;
    cr_assert_eq(sbx_stream_open(c, id, sid, 0, &s, &err), 0, "%s", err.message);
    sbx_event ev;
    sbx_buf out, er;
    sbx_buf_init(&out);
    sbx_buf_init(&er);
    double t_one = -1, t_three = -1;
    bool info = false, exited = false, exit_last = false;
    int code = -1;
    char status[32] = "";
    while (next(s, &ev) == 1) {
        double now = test_now_ms() - t0;
        exit_last = false;
        if (!strcmp(ev.type, "process_info")) {
            info = true;
            sbx_str p = ev_str(&ev, "processId");
            cr_expect(sbx_str_eq(p, pid), "process_info for %.*s", (int)p.n, p.p);
        } else if (!strcmp(ev.type, "stdout")) {
            sbx_buf_append(&out, ev.data, ev.data_len);
            if (memmem(ev.data, ev.data_len, "one", 3) && t_one < 0)
                t_one = now;
            if (memmem(ev.data, ev.data_len, "three", 5))
                t_three = now;
        } else if (!strcmp(ev.type, "stderr")) {
            sbx_buf_append(&er, ev.data, ev.data_len);
        } else if (!strcmp(ev.type, "exit")) {
            exited = exit_last = true;
            code = ev.has_exit_code ? ev.exit_code : -1;
            sbx_str st = ev_str(&ev, "status");
            snprintf(status, sizeof(status), "%.*s", (int)st.n, st.p);
        }
    }
    cr_expect(info, "no process_info event");
    cr_expect(out.len == 10 && !memcmp(out.p, "one\nthree\n", 10), "stdout: %.*s", (int)out.len,
              out.p);
    cr_expect(er.len == 4 && !memcmp(er.p, "two\n", 4), "stderr: %.*s", (int)er.len, er.p);
    cr_expect(t_one >= 0 && t_one < 1000, "the replayed line came after %.0f ms", t_one);
    cr_expect(t_three > 1000, "`three` (printed ~2 s after start) came after %.0f ms", t_three);
    cr_expect(exited && exit_last, "no exit event at the end");
    cr_expect_eq(code, 4, "exit event exitCode %d", code);
    cr_expect_str_eq(status, "failed");
    sbx_stream_close(s);
    /* Any number of readers: a second one replays the same. */
    cr_assert_eq(sbx_stream_open(c, id, sid, 0, &s, &err), 0);
    sbx_buf out2;
    sbx_buf_init(&out2);
    while (next(s, &ev) == 1)
        if (!strcmp(ev.type, "stdout"))
            sbx_buf_append(&out2, ev.data, ev.data_len);
    cr_expect(out2.len == out.len && !memcmp(out2.p, out.p, out.len), "second reader: %.*s",
              (int)out2.len, out2.p);
    sbx_stream_close(s);
    sbx_buf_free(&out);
    sbx_buf_free(&out2);
    sbx_buf_free(&er);
    tdone(c, id);
    sbx_client_close(c);
}

Test(streams, unknown_stream_is_stream_not_found)
{
    sbx_client *c = test_client();
    char *id = test_id("strm-unknown");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    tcall t = read_raw(c, id, "no-such-stream", 0, 100);
    tc_fails_with(t, "stream.read", "STREAM_NOT_FOUND");
    tc_free(&t);
    t = tc_call(c, "stream.cancel", id, json_pack("{s:s}", "streamId", "no-such-stream"), 0);
    tc_fails_with(t, "stream.cancel", "STREAM_NOT_FOUND");
    tc_free(&t);
    t = read_raw(c, id, "proc:no-such-process", 0, 100);
    tc_fails_with(t, "stream.read proc:", "STREAM_NOT_FOUND");
    tc_free(&t);
    /* Through the library's stream handle as well. */
    sbx_stream *s = NULL;
    sbx_error err;
    cr_assert_eq(sbx_stream_open(c, id, "no-such-stream", 0, &s, &err), 0);
    sbx_event ev;
    int rc = sbx_stream_next(s, &ev, &err);
    cr_expect_lt(rc, 0, "sbx_stream_next on an unknown stream returned %d", rc);
    cr_expect_str_eq(err.code, "STREAM_NOT_FOUND");
    sbx_error_free(&err);
    sbx_stream_close(s);
    tdone(c, id);
    sbx_client_close(c);
}
