/*
 * test_interp.c — code contexts: Python, JavaScript and TypeScript with
 * rich outputs, persistence, isolation, interrupts, streaming, failures.
 * test_interp_edges.c has outputs at their limits, environments, the context
 * pool, Python without IPython, charts, back pressure and drivers behind a
 * closed directory; interp_util.h what both share.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../runtime/json.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "../support/harness.h"
#include "interp_util.h"

Test(interp, python_values_state_output_errors, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("py");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL, "1+1", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "2");
    free(t);
    sbx_reply_free(r);
    /* state persists; a trailing ';' suppresses the value */
    r = run(c, id, ctx, NULL, "x = 21\nx * 2;", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "x * 2", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "42");
    free(t);
    sbx_reply_free(r);
    /* print and stderr go to logs, apart */
    r = run(c, id, ctx, NULL, "import sys, os\nprint('out-line')\nprint('err-line', file=sys.stderr)\n"
                              "os.system('echo from-subprocess')", 0);
    char *o = joined_logs(r, "stdout"), *e = joined_logs(r, "stderr");
    cr_expect(strstr(o, "out-line\n") && strstr(o, "from-subprocess\n"), "stdout: %s", o);
    cr_expect(strstr(e, "err-line\n") != NULL, "stderr: %s", e);
    cr_expect(strstr(o, "err-line") == NULL);
    free(o);
    free(e);
    sbx_reply_free(r);
    /* errors: name, value, traceback */
    r = run(c, id, ctx, NULL, "1/0", 0);
    cr_expect(has_error(r, "ZeroDivisionError"));
    char *j = sbx_reply_json(r, false);
    cr_expect(strstr(j, "division by zero") != NULL, "%s", j);
    free(j);
    sbx_reply_free(r);
    /* the context survives its errors */
    r = run(c, id, ctx, NULL, "x", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "21");
    free(t);
    sbx_reply_free(r);
    /* top-level await */
    r = run(c, id, ctx, NULL, "import asyncio\nawait asyncio.sleep(0.01)\n5", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "5");
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(interp, python_rich_outputs, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("rich");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL,
                       "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\n"
                       "plt.title('squares');",
                       60000);
    cr_expect(has_field(r, "png"), "matplotlib gave no PNG");
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})", 60000);
    cr_expect(has_field(r, "html"), "a DataFrame gave no HTML");
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL,
            "class Fancy:\n    def _repr_html_(self): return '<b>fancy</b>'\n"
            "    def _repr_svg_(self): return '<svg></svg>'\nFancy()", 0);
    cr_expect(has_field(r, "html") && has_field(r, "svg"));
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "from IPython.display import display, HTML\n"
                              "display(HTML('<i>a</i>'))\ndisplay({'k': 1})", 0);
    const msgpack_object *arr;
    cr_assert_eq(sbx_wire_get_array(sbx_reply_result(r), "results", &arr), 0);
    cr_expect_eq(arr->via.array.size, 2u, "two display() calls, %u results", arr->via.array.size);
    cr_expect(has_field(r, "html"));
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(interp, javascript_and_typescript, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("js");
    char *ctx = create_ctx(c, id, "javascript");
    sbx_reply *r = run(c, id, ctx, NULL, "const a = 1; a + 1", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "2");
    free(t);
    sbx_reply_free(r);
    /* a top-level const can be declared again; state persists */
    r = run(c, id, ctx, NULL, "const a = 5; a * 2", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "10");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "const v = await Promise.resolve(41); console.log('hi'); v + 1", 0);
    t = main_text(r);
    char *o = joined_logs(r, "stdout");
    cr_expect_str_eq(t, "42");
    cr_expect_str_eq(o, "hi\n");
    free(t);
    free(o);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "v", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "41");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "null.x", 0);
    cr_expect(has_error(r, "TypeError"));
    sbx_reply_free(r);
    free(ctx);
    ctx = create_ctx(c, id, "typescript");
    r = run(c, id, ctx, NULL,
            "interface P { x: number }\nenum E { A = 3 }\nfunction f<T>(v: T): T { return v; }\n"
            "const p: P = { x: f<number>(4) };\np.x * E.A",
            0);
    t = main_text(r);
    cr_expect_str_eq(t, "12", "typescript gave '%s'", t);
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(interp, unknown_context_and_language)
{
    sbx_client *c = test_client();
    char *id = test_id("unk");
    sbx_reply *r = NULL;
    sbx_error err;
    cr_expect_neq(sbx_call_json(c, "context.run", id, "{\"code\":\"1\",\"context\":\"nope\"}", 0,
                                &r, &err), 0);
    cr_expect_str_eq(err.code, "CONTEXT_NOT_FOUND");
    sbx_error_free(&err);
    cr_expect_neq(sbx_call_json(c, "context.create", id, "{\"language\":\"cobol\"}", 0, &r, &err), 0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    sbx_error_free(&err);
    /* A run without a context names its language: an unknown one is refused
     * too (not run in some default context). */
    cr_expect_neq(sbx_call_json(c, "context.run", id, "{\"code\":\"1\",\"language\":\"cobol\"}", 0,
                                &r, &err),
                  0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    cr_expect(strstr(err.message, "cobol") != NULL, "%s", err.message);
    sbx_error_free(&err);
    cr_expect_neq(sbx_call_json(c, "context.runStream", id,
                                "{\"code\":\"1\",\"language\":\"cobol\"}", 0, &r, &err),
                  0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    sbx_error_free(&err);
    cr_assert_eq(sbx_call_json(c, "context.list", id, "{}", 0, &r, &err), 0);
    const msgpack_object *arr;
    cr_assert_eq(sbx_wire_get_array(sbx_reply_result(r), "contexts", &arr), 0);
    cr_expect_eq(arr->via.array.size, 0u, "a refused run created a context");
    sbx_reply_free(r);
    cr_expect_neq(sbx_call_json(c, "context.delete", id, "{\"contextId\":\"nope\"}", 0, &r, &err), 0);
    cr_expect_str_eq(err.code, "CONTEXT_NOT_FOUND");
    sbx_error_free(&err);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(interp, timeout_interrupts_and_the_context_survives, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("intr");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL, "keep = 'still here'", 0);
    sbx_reply_free(r);
    static const char *const cells[] = {"while True: pass", "import time\ntime.sleep(100)"};
    for (size_t i = 0; i < 2; i++) {
        double t0 = test_now_ms();
        r = run(c, id, ctx, NULL, cells[i], 1000);
        double took = test_now_ms() - t0;
        bool to = false;
        sbx_wire_get_bool(sbx_reply_result(r), "timedOut", &to);
        cr_expect(to, "cell %zu not reported as timed out", i);
        cr_expect(has_error(r, "KeyboardInterrupt"), "cell %zu: no KeyboardInterrupt", i);
        cr_expect(took < 10000, "cell %zu took %.0f ms", i, took);
        sbx_reply_free(r);
    }
    r = run(c, id, ctx, NULL, "keep", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "'still here'");
    free(t);
    sbx_reply_free(r);
    /* JavaScript too: a sync loop and a promise that never settles. */
    free(ctx);
    ctx = create_ctx(c, id, "javascript");
    r = run(c, id, ctx, NULL, "globalThis.keep = 7", 0);
    sbx_reply_free(r);
    static const char *const jcells[] = {"while (true) {}", "await new Promise(() => {})"};
    for (size_t i = 0; i < 2; i++) {
        r = run(c, id, ctx, NULL, jcells[i], 1000);
        bool to = false;
        sbx_wire_get_bool(sbx_reply_result(r), "timedOut", &to);
        cr_expect(to, "js cell %zu not reported as timed out", i);
        cr_expect(has_error(r, NULL), "js cell %zu: no error", i);
        sbx_reply_free(r);
    }
    r = run(c, id, ctx, NULL, "keep", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "7");
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* Two contexts of one language share nothing: a global set in one is
 * unknown in the other, for every language. */
Test(interp, contexts_are_isolated, .timeout = 120)
{
    static const struct {
        const char *lang, *set, *get, *err;
    } cases[] = {
        {"python", "secret = 1", "secret", "NameError"},
        {"javascript", "let secret = 1", "secret", "ReferenceError"},
        {"typescript", "const secret: number = 1", "secret", "ReferenceError"},
    };
    sbx_client *c = test_client();
    char *id = test_id("iso");
    for (size_t i = 0; i < SBX_ARRAY_LEN(cases); i++) {
        char *a = create_ctx(c, id, cases[i].lang), *b = create_ctx(c, id, cases[i].lang);
        sbx_reply *r = run(c, id, a, NULL, cases[i].set, 0);
        cr_expect(!has_error(r, NULL), "%s: setting failed", cases[i].lang);
        sbx_reply_free(r);
        r = run(c, id, a, NULL, cases[i].get, 0);
        char *t = main_text(r);
        cr_expect_str_eq(t, "1", "%s: context a lost its own variable", cases[i].lang);
        free(t);
        sbx_reply_free(r);
        r = run(c, id, b, NULL, cases[i].get, 0);
        cr_expect(has_error(r, cases[i].err), "%s: context b sees context a's variable",
                  cases[i].lang);
        sbx_reply_free(r);
        free(a);
        free(b);
    }
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

struct par {
    sbx_client *c;
    const char *id, *ctx;
    int i;
    char *text;
};

/* Each cell records when it started and ended (the context's monotonic
 * clock) around a sleep: runs that overlapped would show it. */
static void *
par_run(void *arg)
{
    struct par *p = arg;
    char code[192];
    snprintf(code, sizeof(code),
             "import time\nt0 = time.monotonic()\ntime.sleep(0.2)\n"
             "spans.append((t0, time.monotonic(), %d))\n%d",
             p->i, p->i);
    sbx_reply *r = run(p->c, p->id, p->ctx, NULL, code, 0);
    p->text = main_text(r);
    sbx_reply_free(r);
    return NULL;
}

/* Five runs sent at once on one context: each gets its own value back, all
 * five ran (none lost), and one at a time: sorted by start, each started
 * after the previous one ended. */
Test(interp, concurrent_runs_on_one_context_are_serialized, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("ser");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL, "spans = []", 0);
    sbx_reply_free(r);
    struct par p[5];
    pthread_t th[5];
    for (int i = 0; i < 5; i++) {
        p[i] = (struct par){c, id, ctx, i, NULL};
        pthread_create(&th[i], NULL, par_run, &p[i]);
    }
    for (int i = 0; i < 5; i++) {
        pthread_join(th[i], NULL);
        char want[8];
        snprintf(want, sizeof(want), "%d", i);
        cr_expect_str_eq(p[i].text, want);
        free(p[i].text);
    }
    r = run(c, id, ctx, NULL,
            "s = sorted(spans)\n"
            "(len(s), sorted(x[2] for x in s), all(a[1] <= b[0] for a, b in zip(s, s[1:])))",
            0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "(5, [0, 1, 2, 3, 4], True)", "count, cells, no overlap: %s", t);
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* How many contexts context.list shows with this ID, and the state of the
 * last one ("" when it has none). */
static int
ctx_listed(sbx_client *c, const char *id, const char *ctx, char *state, size_t statelen)
{
    sbx_reply *r = NULL;
    sbx_error err;
    int n = 0;
    state[0] = 0;
    if (sbx_call_json(c, "context.list", id, "{}", 0, &r, &err) != 0) {
        sbx_error_free(&err);
        return -1;
    }
    const msgpack_object *arr;
    if (sbx_wire_get_array(sbx_reply_result(r), "contexts", &arr) == 0)
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            sbx_str cid = {"", 0}, st = {"", 0};
            sbx_wire_get_str(&arr->via.array.ptr[i], "id", &cid);
            if (!sbx_str_eq(cid, ctx))
                continue;
            n++;
            sbx_wire_get_str(&arr->via.array.ptr[i], "state", &st);
            snprintf(state, statelen, "%.*s", (int)st.n, st.p);
        }
    sbx_reply_free(r);
    return n;
}

/* The run during which the driver dies, and every later run on that
 * context, fail with CODE_EXECUTION_ERROR saying to recreate it (the
 * context's state is gone; docs/protocol.md §3.7 and §4 say so); the list
 * shows it dead; deleted and created again, it works.  A dead default
 * context is replaced on its next use, not listed twice. */
Test(interp, a_dead_driver_is_reported_and_the_context_can_be_recreated, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("dead");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = NULL;
    sbx_error err;
    char args[256], state[32];
    snprintf(args, sizeof(args), "{\"code\":\"import os\\nos._exit(3)\",\"context\":\"%s\"}", ctx);
    int rc = sbx_call_json(c, "context.run", id, args, 60000, &r, &err);
    cr_expect_neq(rc, 0);
    cr_expect_str_eq(err.code, "CODE_EXECUTION_ERROR");
    cr_expect(strstr(err.message, "exit status 3") && strstr(err.message, "create a new"), "%s",
              err.message);
    sbx_error_free(&err);
    for (int i = 0; i < 2; i++) {
        snprintf(args, sizeof(args), "{\"code\":\"1\",\"context\":\"%s\"}", ctx);
        cr_expect_neq(sbx_call_json(c, i ? "context.runStream" : "context.run", id, args, 60000,
                                    &r, &err),
                      0);
        cr_expect_str_eq(err.code, "CODE_EXECUTION_ERROR", "run %d on a dead context", i);
        cr_expect(strstr(err.message, "create a new") != NULL, "%s", err.message);
        sbx_error_free(&err);
    }
    cr_expect_eq(ctx_listed(c, id, ctx, state, sizeof(state)), 1);
    cr_expect_str_eq(state, "dead");
    snprintf(args, sizeof(args), "{\"contextId\":\"%s\"}", ctx);
    cr_expect_eq(sbx_call_json(c, "context.delete", id, args, 0, &r, &err), 0);
    sbx_reply_free(r);
    cr_expect_eq(ctx_listed(c, id, ctx, state, sizeof(state)), 0);
    free(ctx);
    ctx = create_ctx(c, id, "python");
    r = run(c, id, ctx, NULL, "'alive'", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "'alive'");
    free(t);
    sbx_reply_free(r);
    free(ctx);
    /* The default context: killed, then used again by language. */
    cr_expect_neq(sbx_call_json(c, "context.run", id,
                                "{\"code\":\"import os\\nos._exit(4)\",\"language\":\"python\"}",
                                60000, &r, &err),
                  0);
    cr_expect_str_eq(err.code, "CODE_EXECUTION_ERROR");
    sbx_error_free(&err);
    r = run(c, id, NULL, "python", "'replaced'", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "'replaced'");
    free(t);
    sbx_reply_free(r);
    cr_expect_eq(ctx_listed(c, id, "default-python", state, sizeof(state)), 1);
    cr_expect_str_eq(state, "");
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

Test(interp, output_is_streamed_as_produced, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("strm");
    char *ctx = create_ctx(c, id, "python");
    char args[256];
    snprintf(args, sizeof(args),
             "{\"code\":\"import time\\nprint('first', flush=True)\\ntime.sleep(2)\\nprint('second')\\n3\","
             "\"context\":\"%s\"}", ctx);
    sbx_reply *r = NULL;
    sbx_error err;
    double t0 = test_now_ms();
    cr_assert_eq(sbx_call_json(c, "context.runStream", id, args, 0, &r, &err), 0);
    sbx_str sid = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "streamId", &sid);
    char sids[80];
    sbx_str_copy(sid, sids, sizeof(sids));
    sbx_reply_free(r);
    sbx_stream *s;
    cr_assert_eq(sbx_stream_open(c, id, sids, 0, &s, &err), 0);
    sbx_event ev;
    double first_at = -1;
    bool saw_result = false, saw_complete = false;
    sbx_buf out;
    sbx_buf_init(&out);
    while (sbx_stream_next(s, &ev, &err) == 1) {
        sbx_str t;
        if (!strcmp(ev.type, "stdout") && sbx_wire_get_str(ev.obj, "text", &t) == 0) {
            if (first_at < 0)
                first_at = test_now_ms() - t0;
            sbx_buf_append(&out, t.p, t.n);
        }
        if (!strcmp(ev.type, "result"))
            saw_result = true;
        if (!strcmp(ev.type, "execution_complete"))
            saw_complete = true;
    }
    cr_expect(first_at >= 0 && first_at < 1800, "first output after %.0f ms", first_at);
    cr_expect_str_eq(out.p ? out.p : "", "first\nsecond\n");
    cr_expect(saw_result && saw_complete);
    sbx_buf_free(&out);
    sbx_stream_close(s);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}
