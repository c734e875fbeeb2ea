/*
 * test_interp_edges.c — code contexts at their edges: outputs at their
 * limits (huge output, JSON too deep for a frame, UTF-8 split across writes),
 * promise values, environments, the fresh context pool, Python without
 * IPython, charts, back pressure on a stream, drivers behind a directory the
 * sandbox cannot search.  test_interp.c has the basics (values, outputs,
 * languages, isolation, interrupts, concurrency, failures, streaming);
 * interp_util.h what both share.
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

/* The sandbox's container generation (containers started so far). */
static int64_t
generation(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    int64_t g = -1;
    int rc = sbx_call_json(c, "status", id, "{}", 0, &r, &err);
    if (rc) {
        sbx_error_free(&err);
        return -1;
    }
    const msgpack_object *sb;
    if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0)
        sbx_wire_get_i64(sb, "generation", &g);
    sbx_reply_free(r);
    return g;
}

/* Total bytes of the strings of logs.<which>. */
static size_t
logs_bytes(sbx_reply *r, const char *which)
{
    char *s = joined_logs(r, which);
    size_t n = strlen(s);
    free(s);
    return n;
}

/* A cell printing far more than a frame may carry: the reply keeps the
 * first 16 MiB of each log and 24 MiB of results and says so; the run, the
 * context and the container survive (before the caps, the agent sent a
 * frame over the transport cap and the shard replaced the container). */
Test(interp, huge_output_is_capped_and_everything_survives, .timeout = 300)
{
    sbx_client *c = test_client();
    char *id = test_id("huge");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL, "keep = 'kept'", 0);
    sbx_reply_free(r);
    int64_t gen = generation(c, id);
    cr_assert_gt(gen, 0);
    r = run(c, id, ctx, NULL,
            "import sys\nfrom IPython.display import display, HTML\n"
            "line = 'x' * ((1 << 20) - 1) + '\\n'\n"
            "for i in range(48): sys.stdout.write(line)\n"
            "for i in range(48): sys.stderr.write(line)\n"
            "for i in range(40): display(HTML('<p>' + 'y' * (1 << 20) + '</p>'))\n"
            "'done'",
            200000);
    const msgpack_object *res = sbx_reply_result(r);
    bool tout = false, terr = false, tres = false;
    int64_t nout = 0;
    sbx_wire_get_bool(res, "stdoutTruncated", &tout);
    sbx_wire_get_bool(res, "stderrTruncated", &terr);
    sbx_wire_get_bool(res, "resultsTruncated", &tres);
    sbx_wire_get_i64(res, "stdoutBytes", &nout);
    cr_expect(tout && terr && tres, "truncation flags: stdout %d stderr %d results %d", tout, terr,
              tres);
    cr_expect_eq(nout, 48ll << 20, "stdoutBytes %lld", (long long)nout);
    size_t ko = logs_bytes(r, "stdout"), ke = logs_bytes(r, "stderr");
    cr_expect(ko > (8u << 20) && ko <= (16u << 20), "stdout kept %zu bytes", ko);
    cr_expect(ke > (8u << 20) && ke <= (16u << 20), "stderr kept %zu bytes", ke);
    char *t = main_text(r);
    cr_expect_str_eq(t, "'done'", "the cell's value survives the dropped displays");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "keep", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "'kept'", "the context lost its state");
    free(t);
    sbx_reply_free(r);
    cr_expect_eq(generation(c, id), gen, "the container was replaced");
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* JSON a result cannot carry (deeper than a frame may nest) is left out of
 * that result; the rest of the reply and the container are intact. */
Test(interp, json_too_deep_for_a_frame_is_left_out, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("deep");
    char *ctx = create_ctx(c, id, "python");
    int64_t gen = generation(c, id);
    sbx_reply *r = run(c, id, ctx, NULL,
                       "class Deep:\n"
                       "    def _repr_json_(self):\n"
                       "        v = [1]\n"
                       "        for i in range(40): v = [v]\n"
                       "        return v\n"
                       "print('printed')\nDeep()",
                       0);
    char *o = joined_logs(r, "stdout");
    cr_expect_str_eq(o, "printed\n");
    free(o);
    cr_expect(!has_field(r, "json"), "a 41-level JSON value was sent");
    cr_expect(has_field(r, "text"));
    sbx_reply_free(r);
    cr_expect_eq(generation(c, id), gen, "the container was replaced");
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* fd-level output (subprocesses, os.write) is decoded across reads: a
 * character split over two writes arrives whole; invalid bytes become
 * U+FFFD, and so does a sequence the cell leaves unfinished. */
Test(interp, fd_output_keeps_utf8_across_writes, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("utf8");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL,
                       "import os, time\nb = 'é€😀'.encode()\n"
                       "for i in range(len(b)):\n"
                       "    os.write(1, b[i:i + 1]); time.sleep(0.02)\n"
                       "os.write(1, b'\\n|a\\xffb|\\n'); os.write(2, b'tail\\xe2\\x82')",
                       0);
    char *o = joined_logs(r, "stdout"), *e = joined_logs(r, "stderr");
    cr_expect_str_eq(o, "é€😀\n|a\xef\xbf\xbd" "b|\n");
    cr_expect_str_eq(e, "tail\xef\xbf\xbd");
    free(o);
    free(e);
    sbx_reply_free(r);
    free(ctx);
    ctx = create_ctx(c, id, "javascript");
    r = run(c, id, ctx, NULL,
            "const fs = require('fs');\n"
            "for (const b of Buffer.from('é€\\n')) {\n"
            "  fs.writeSync(1, Buffer.from([b])); Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);\n"
            "}",
            0);
    o = joined_logs(r, "stdout");
    cr_expect_str_eq(o, "é€\n");
    free(o);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* A promise as a JavaScript cell's value is awaited (its value is the
 * result, its rejection the error); a promise kept in a variable is not. */
Test(interp, javascript_awaits_a_promise_value, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("prom");
    char *ctx = create_ctx(c, id, "javascript");
    sbx_reply *r = run(c, id, ctx, NULL, "import(\"fs\").then(m => typeof m.readFileSync)", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "'function'");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "new Promise(res => setTimeout(() => res(6 * 7), 50))", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "42");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "Promise.reject(new RangeError('no'))", 0);
    cr_expect(has_error(r, "RangeError"));
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "({ then(ok) { ok('thenable'); } })", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "'thenable'");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "globalThis.p = new Promise(() => {}); 1", 5000);
    t = main_text(r);
    cr_expect_str_eq(t, "1");
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* createCodeContext's envVars reach the context; a value that is not a
 * string (or nil, which unsets) is VALIDATION_FAILED, not dropped. */
Test(interp, env_vars_are_checked_and_applied, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("envv");
    sbx_reply *r = NULL;
    sbx_error err;
    static const char *const bad[] = {
        "{\"language\":\"python\",\"envVars\":{\"A\":1}}",
        "{\"language\":\"javascript\",\"envVars\":{\"A\":true}}",
        "{\"language\":\"python\",\"envVars\":{\"A\":[\"x\"]}}",
        "{\"language\":\"python\",\"envVars\":{\"A=B\":\"x\"}}",
        "{\"language\":\"python\",\"envVars\":\"A=1\"}",
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        cr_expect_neq(sbx_call_json(c, "context.create", id, bad[i], 60000, &r, &err), 0, "%s",
                      bad[i]);
        cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s", bad[i]);
        sbx_error_free(&err);
    }
    cr_assert_eq(sbx_call_json(c, "context.create", id,
                               "{\"language\":\"python\",\"envVars\":{\"SBX_T\":\"v1\",\"HOME\":null}}",
                               60000, &r, &err),
                 0);
    sbx_str cid;
    cr_assert_eq(sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid), 0);
    char *ctx = sbx_str_dup(cid);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "import os\n(os.environ.get('SBX_T'), os.environ.get('HOME'))", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "('v1', None)");
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* Python contexts are forks of the sandbox's fork server (one parent, not
 * the agent), so back-to-back creations do not each wait for an IPython
 * start; warm drivers and the fork server follow env.set (a context made
 * after it sees the change); envVars read only at an interpreter's start
 * (here PYTHONPATH, SBX_PY_MODE) get a driver started with them. */
Test(interp, contexts_come_from_a_fresh_pool, .timeout = 240)
{
    sbx_client *c = test_client();
    char *id = test_id("pool");
    char *first = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, first, NULL, "import os\nos.getppid()", 0);
    char *ppid = main_text(r);
    sbx_reply_free(r);
    cr_expect_str_neq(ppid, "1", "the driver is the agent's child, not a fork");
    double worst = 0;
    for (int i = 0; i < 3; i++) {
        double t0 = test_now_ms();
        char *ctx = create_ctx(c, id, "python");
        double took = test_now_ms() - t0;
        worst = took > worst ? took : worst;
        /* The fork server's and the fork's warm-up cells left no trace. */
        r = run(c, id, ctx, NULL, "(repr(_), len(In))", 0);
        char *t = main_text(r);
        int64_t count = -1;
        sbx_wire_get_i64(sbx_reply_result(r), "executionCount", &count);
        cr_expect_str_eq(t, "(\"''\", 2)", "context %d is not fresh", i);
        cr_expect_eq(count, 1, "context %d: first executionCount %lld", i, (long long)count);
        free(t);
        sbx_reply_free(r);
        r = run(c, id, ctx, NULL, "import os\nos.getppid()", 0);
        t = main_text(r);
        cr_expect_str_eq(t, ppid, "context %d has another parent", i);
        free(t);
        sbx_reply_free(r);
        free(ctx);
    }
    cr_log_info("back-to-back python context.create: worst %.0f ms", worst);
    cr_expect(worst < 5000, "a back-to-back context.create took %.0f ms", worst);
    /* env.set after the pool and the fork server started */
    sbx_reply *er = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call_json(c, "env.set", id, "{\"vars\":{\"SBX_POOL_T\":\"after\"}}", 0,
                               &er, &err),
                 0, "env.set: %s", err.message);
    sbx_reply_free(er);
    static const char *const langs[] = {"python", "javascript"};
    static const char *const reads[] = {"import os\nos.environ.get('SBX_POOL_T')",
                                        "process.env.SBX_POOL_T"};
    static const char *const want[] = {"'after'", "'after'"};
    for (int i = 0; i < 2; i++) {
        char *ctx = create_ctx(c, id, langs[i]);
        r = run(c, id, ctx, NULL, reads[i], 0);
        char *t = main_text(r);
        cr_expect_str_eq(t, want[i], "%s: a context made after env.set misses it", langs[i]);
        free(t);
        sbx_reply_free(r);
        free(ctx);
    }
    /* PYTHONUNBUFFERED means nothing to a driver's start: a fork of the
     * (new, since env.set) fork server like a plain context, the variable
     * set for the code and its children. */
    char *plain = create_ctx(c, id, "python");
    r = run(c, id, plain, NULL, "import os\nos.getppid()", 0);
    char *ppid2 = main_text(r);
    sbx_reply_free(r);
    cr_assert_eq(sbx_call_json(c, "context.create", id,
                               "{\"language\":\"python\",\"envVars\":{\"PYTHONUNBUFFERED\":\"1\"}}",
                               120000, &er, &err),
                 0, "%s", err.message);
    sbx_str ucid = {"", 0};
    sbx_wire_get_str(sbx_reply_result(er), "contextId", &ucid);
    char *uctx = sbx_str_dup(ucid);
    sbx_reply_free(er);
    r = run(c, id, uctx, NULL, "import os\n(os.getppid(), os.environ['PYTHONUNBUFFERED'])", 0);
    char *ut = main_text(r);
    char want_u[64];
    snprintf(want_u, sizeof(want_u), "(%s, '1')", ppid2);
    cr_expect_str_neq(ppid2, "1");
    cr_expect_str_eq(ut, want_u, "PYTHONUNBUFFERED cost a cold start");
    free(ut);
    sbx_reply_free(r);
    free(uctx);
    free(ppid2);
    free(plain);
    /* start-time envVars */
    cr_assert_eq(sbx_call_json(c, "context.create", id,
                               "{\"language\":\"python\",\"envVars\":{\"PYTHONPATH\":\"/opt/sbx-t\","
                               "\"SBX_PY_MODE\":\"stdlib\"}}",
                               120000, &er, &err),
                 0, "%s", err.message);
    const msgpack_object *cx;
    sbx_str cid = {"", 0}, mode = {"", 0};
    sbx_wire_get_str(sbx_reply_result(er), "contextId", &cid);
    cr_assert_eq(sbx_wire_get_map(sbx_reply_result(er), "context", &cx), 0);
    sbx_wire_get_str(cx, "mode", &mode);
    cr_expect(sbx_str_eq(mode, "stdlib"), "mode %.*s", (int)mode.n, mode.p);
    char *ctx = sbx_str_dup(cid);
    sbx_reply_free(er);
    r = run(c, id, ctx, NULL, "import sys\n'/opt/sbx-t' in sys.path", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "True", "PYTHONPATH did not reach the interpreter's start");
    free(t);
    sbx_reply_free(r);
    free(ctx);
    free(first);
    free(ppid);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* The text of result i (or ""), and whether it has field f. */
static char *
result_text(sbx_reply *r, uint32_t i)
{
    const msgpack_object *arr;
    sbx_str t = {"", 0};
    if (sbx_wire_get_array(sbx_reply_result(r), "results", &arr) == 0 && i < arr->via.array.size)
        sbx_wire_get_str(&arr->via.array.ptr[i], "text", &t);
    return sbx_str_dup(t);
}

static uint32_t
result_count(sbx_reply *r)
{
    const msgpack_object *arr;
    return sbx_wire_get_array(sbx_reply_result(r), "results", &arr) == 0 ? arr->via.array.size : 0;
}

/* Python without IPython (SBX_PY_MODE=stdlib, as on a host without
 * python3-ipython): the same behaviour through the standard-library
 * driver — last expression, ';', state, display(), errors with a
 * traceback, matplotlib figures as PNG and a DataFrame as HTML. */
Test(interp, python_stdlib_mode, .timeout = 240)
{
    sbx_client *c = test_client();
    char *id = test_id("stdlib");
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call_json(c, "context.create", id,
                               "{\"language\":\"python\",\"envVars\":{\"SBX_PY_MODE\":\"stdlib\"}}",
                               120000, &r, &err),
                 0, "%s", err.message);
    const msgpack_object *cx;
    sbx_str cid = {"", 0}, mode = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid);
    cr_assert_eq(sbx_wire_get_map(sbx_reply_result(r), "context", &cx), 0);
    sbx_wire_get_str(cx, "mode", &mode);
    cr_assert(sbx_str_eq(mode, "stdlib"), "mode %.*s", (int)mode.n, mode.p);
    char *ctx = sbx_str_dup(cid);
    sbx_reply_free(r);

    /* the last expression is the value; ';' suppresses it; state persists */
    r = run(c, id, ctx, NULL, "x = 20\nx + 1", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "21");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "x * 2;", 0);
    cr_expect_eq(result_count(r), 0u, "a trailing ';' still gave a result");
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "x * 2  # comment after the value", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "40");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "print('p'); None", 0);
    char *o = joined_logs(r, "stdout");
    cr_expect_str_eq(o, "p\n");
    cr_expect_eq(result_count(r), 0u, "None is not a result");
    free(o);
    sbx_reply_free(r);

    /* display(): each call a result, not the main one, in order */
    r = run(c, id, ctx, NULL,
            "class H:\n    def _repr_html_(self): return '<b>h</b>'\n"
            "display('first', H())\n'last'",
            0);
    cr_expect_eq(result_count(r), 3u);
    t = result_text(r, 0);
    cr_expect_str_eq(t, "'first'");
    free(t);
    cr_expect(has_field(r, "html"), "display(H()) gave no HTML");
    t = main_text(r);
    cr_expect_str_eq(t, "'last'");
    free(t);
    sbx_reply_free(r);

    /* an exception: name, value, a traceback naming the cell's line */
    r = run(c, id, ctx, NULL, "def f(v):\n    return {}[v]\nf('missing')", 0);
    cr_expect(has_error(r, "KeyError"));
    const msgpack_object *e, *tb;
    sbx_str v = {"", 0};
    cr_assert_eq(sbx_wire_get_map(sbx_reply_result(r), "error", &e), 0);
    sbx_wire_get_str(e, "value", &v);
    cr_expect(sbx_str_eq(v, "'missing'"), "value %.*s", (int)v.n, v.p);
    cr_assert_eq(sbx_wire_get_array(e, "traceback", &tb), 0);
    char *j = sbx_reply_json(r, false);
    cr_expect(tb->via.array.size >= 3, "traceback: %s", j);
    /* ... and none of the driver's (driver.py and its package _sbx_driver/) */
    cr_expect(strstr(j, "return {}[v]") && strstr(j, "in f") && !strstr(j, "driver.py") &&
                  !strstr(j, "_sbx_driver"),
              "traceback: %s", j);
    free(j);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "x", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "20", "state lost after an error");
    free(t);
    sbx_reply_free(r);

    /* matplotlib: the figure is a PNG; pandas: a DataFrame is HTML */
    r = run(c, id, ctx, NULL,
            "import matplotlib.pyplot as plt\nplt.plot([1, 2, 3], [1, 4, 9])\nplt.title('sq');", 60000);
    cr_expect(has_field(r, "png"), "matplotlib gave no PNG in stdlib mode");
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "import pandas as pd\npd.DataFrame({'a': [1, 2], 'b': [3, 4]})",
            60000);
    cr_expect(has_field(r, "html"), "a DataFrame gave no HTML in stdlib mode");
    j = sbx_reply_json(r, false);
    cr_expect(strstr(j, "<table") != NULL, "%s", j);
    free(j);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* The `chart` of the first result that has one, as JSON (caller frees), or
 * NULL. */
static char *
first_chart(sbx_reply *r)
{
    const msgpack_object *arr;
    if (sbx_wire_get_array(sbx_reply_result(r), "results", &arr) != 0)
        return NULL;
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *ch = sbx_wire_get(&arr->via.array.ptr[i], "chart");
        if (ch)
            return sbx_json_dump(ch, false);
    }
    return NULL;
}

/* `chart` (the SDK's ChartData) where there is one: a matplotlib figure's
 * type, title, series and labels in both Python modes; Plotly and Vega-Lite
 * bundles mapped as the Cloudflare container maps them (also from
 * JavaScript's display()). */
Test(interp, charts, .timeout = 240)
{
    sbx_client *c = test_client();
    char *id = test_id("chart");
    static const char *const modes[] = {"{\"language\":\"python\"}",
                                        "{\"language\":\"python\",\"envVars\":{\"SBX_PY_MODE\":\"stdlib\"}}"};
    for (int m = 0; m < 2; m++) {
        sbx_reply *r = NULL;
        sbx_error err;
        cr_assert_eq(sbx_call_json(c, "context.create", id, modes[m], 120000, &r, &err), 0, "%s",
                     err.message);
        sbx_str cid = {"", 0};
        sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid);
        char *ctx = sbx_str_dup(cid);
        sbx_reply_free(r);
        r = run(c, id, ctx, NULL,
                "import matplotlib.pyplot as plt\n"
                "plt.plot([1, 2, 3], [1, 4, 9], label='sq'); plt.title('squares'); plt.xlabel('n');",
                60000);
        char *j = first_chart(r);
        cr_expect(j && strstr(j, "\"type\":\"line\"") && strstr(j, "\"title\":\"squares\"") &&
                      strstr(j, "\"y\":[1,4,9]") && strstr(j, "\"label\":\"sq\"") &&
                      strstr(j, "\"library\":\"matplotlib\"") && strstr(j, "\"xLabel\":\"n\""),
                  "mode %d line chart: %s", m, j ? j : "(none)");
        cr_expect(has_field(r, "png"), "the chart replaced the image");
        free(j);
        sbx_reply_free(r);
        r = run(c, id, ctx, NULL, "plt.bar(['a', 'b'], [3, 1]);", 60000);
        j = first_chart(r);
        cr_expect(j && strstr(j, "\"type\":\"bar\"") && strstr(j, "\"x\":[\"a\",\"b\"]") &&
                      strstr(j, "\"y\":[3,1]"),
                  "mode %d bar chart: %s", m, j ? j : "(none)");
        free(j);
        sbx_reply_free(r);
        r = run(c, id, ctx, NULL, "plt.pie([1, 3], labels=['x', 'y']);", 60000);
        j = first_chart(r);
        cr_expect(j && strstr(j, "\"type\":\"pie\"") && strstr(j, "\"value\":0.75"),
                  "mode %d pie chart: %s", m, j ? j : "(none)");
        free(j);
        sbx_reply_free(r);
        /* A result that is not a figure has no chart. */
        r = run(c, id, ctx, NULL, "[1, 2]", 0);
        j = first_chart(r);
        cr_expect(j == NULL, "a list got a chart: %s", j);
        free(j);
        sbx_reply_free(r);
        r = run(c, id, ctx, NULL,
                "display({'application/vnd.plotly.v1+json': {'data': [{'type': 'bar', 'x': ['a'], "
                "'y': [2]}], 'layout': {'title': {'text': 'P'}}}, 'text/plain': 'fig'}, raw=True)",
                0);
        j = first_chart(r);
        cr_expect(j && strstr(j, "\"type\":\"bar\"") && strstr(j, "\"title\":\"P\"") &&
                      strstr(j, "\"library\":\"plotly\"") && strstr(j, "\"y\":[2]"),
                  "mode %d plotly: %s", m, j ? j : "(none)");
        free(j);
        sbx_reply_free(r);
        free(ctx);
    }
    char *ctx = create_ctx(c, id, "javascript");
    sbx_reply *r = run(c, id, ctx, NULL,
                       "display({mark: {type: 'point'}, title: 'V', data: {values: [{a: 1}]}}, "
                       "'application/vnd.vegalite.v5+json')",
                       0);
    char *j = first_chart(r);
    cr_expect(j && strstr(j, "\"type\":\"scatter\"") && strstr(j, "\"title\":\"V\"") &&
                  strstr(j, "\"library\":\"altair\""),
              "vega-lite: %s", j ? j : "(none)");
    free(j);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/* Start a runCodeStream; its stream id into sid. */
static void
start_stream(sbx_client *c, const char *id, const char *ctx, const char *code, int64_t timeout,
             char *sid, size_t sidlen)
{
    sbx_enc e;
    char *args;
    size_t alen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "code", code);
    sbx_enc_kstr(&e, "context", ctx);
    if (timeout)
        sbx_enc_kint(&e, "timeout", timeout);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &args, &alen), 0);
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call(c, "context.runStream", id, args, alen, 60000, NULL, &r, &err);
    free(args);
    cr_assert_eq(rc, 0, "runStream: %s", rc ? err.message : "");
    sbx_str s = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "streamId", &s);
    snprintf(sid, sidlen, "%.*s", (int)s.n, s.p);
    sbx_reply_free(r);
}

/* A streamed cell whose reader is behind is held back (its output waits in
 * the pipes, not in the agent's memory) and loses nothing; a stream nobody
 * reads is released at the run's timeout, so the context goes on. */
Test(interp, a_stream_applies_back_pressure, .timeout = 300)
{
    sbx_client *c = test_client();
    char *id = test_id("bp");
    char *ctx = create_ctx(c, id, "python");
    sbx_reply *r = run(c, id, ctx, NULL, "import sys\nline = 'x' * ((1 << 20) - 1) + '\\n'", 0);
    sbx_reply_free(r);
    sleep(1);
    int64_t m0 = test_memory_bytes(c, id);
    char sid[80];
    start_stream(c, id, ctx, "for i in range(64): sys.stdout.write(line)\n'end'", 0, sid,
                 sizeof(sid));
    sleep(5); /* nobody reads */
    int64_t m1 = test_memory_bytes(c, id);
    cr_expect(m0 > 0 && m1 - m0 < (40ll << 20),
              "an unread stream made the sandbox grow by %lld MiB", (long long)((m1 - m0) >> 20));
    sbx_stream *s;
    sbx_error err;
    cr_assert_eq(sbx_stream_open(c, id, sid, 0, &s, &err), 0);
    sbx_event ev;
    size_t bytes = 0;
    bool complete = false, result = false;
    while (sbx_stream_next(s, &ev, &err) == 1) {
        sbx_str t;
        if (!strcmp(ev.type, "stdout") && sbx_wire_get_str(ev.obj, "text", &t) == 0)
            bytes += t.n;
        result = result || !strcmp(ev.type, "result");
        complete = complete || !strcmp(ev.type, "execution_complete");
    }
    sbx_stream_close(s);
    cr_expect_eq(bytes, (size_t)64 << 20, "the stream lost output: %zu bytes", bytes);
    cr_expect(result && complete);
    /* Abandoned: never read, the run times out, the next run is served. */
    start_stream(c, id, ctx, "for i in range(64): sys.stdout.write(line)", 2000, sid,
                 sizeof(sid));
    double t0 = test_now_ms();
    r = run(c, id, ctx, NULL, "'after'", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "'after'");
    cr_expect(test_now_ms() - t0 < 30000, "the abandoned stream held the context %.0f ms",
              test_now_ms() - t0);
    free(t);
    sbx_reply_free(r);
    /* stream.cancel interrupts the running cell; the context keeps its state. */
    start_stream(c, id, ctx, "import time\nstate = 'kept'\ntime.sleep(100)", 0, sid, sizeof(sid));
    usleep(500 * 1000);
    char cargs[120];
    snprintf(cargs, sizeof(cargs), "{\"streamId\":\"%s\"}", sid);
    t0 = test_now_ms();
    cr_assert_eq(sbx_call_json(c, "stream.cancel", id, cargs, 0, &r, &err), 0);
    sbx_reply_free(r);
    r = run(c, id, ctx, NULL, "state", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "'kept'");
    cr_expect(test_now_ms() - t0 < 10000, "the cancelled cell ran on for %.0f ms",
              test_now_ms() - t0);
    free(t);
    sbx_reply_free(r);
    free(ctx);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}

/*
 * The drivers' directory where the sandbox's host uid cannot search it (a
 * checkout under /root, mode 0700, is the common case): the shard opens it
 * and hands the agent the handle, so contexts work.  The agent used to open
 * the path itself and reported PYTHON_NOT_AVAILABLE.  A private daemon with
 * --interp pointing at a copy of the drivers inside a 0700 directory.
 */
/* What drivers_behind_… made, removed by its .fini even when an assertion
 * ends it early. */
static char priv_dir[] = "/tmp/sbx-interp-XXXXXX";
static struct testd priv_d;
static bool priv_made, priv_started;

static void
priv_cleanup(void)
{
    if (priv_started)
        testd_stop(&priv_d);
    if (priv_made)
        sbx_rm_rf(priv_dir);
}

Test(interp, drivers_behind_a_directory_the_sandbox_cannot_search, .timeout = 240,
     .fini = priv_cleanup)
{
    char *dir = priv_dir;
    cr_assert_not_null(mkdtemp(dir));
    priv_made = true;
    cr_assert_eq(chmod(dir, 0700), 0);
    const char *bin = getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    char cmd[1024], interp[300];
    snprintf(interp, sizeof(interp), "%s/private/interp", dir);
    snprintf(cmd, sizeof(cmd), "mkdir -m 0700 %s/private && cp -a %s/../share/sbx/interp %s", dir,
             bin, interp);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    const char *const extra[] = {"--interp", interp, "--pool", "0", NULL};
    cr_assert_eq(testd_start(&priv_d, 1, extra), 0, "cannot start sbxd with --interp %s", interp);
    priv_started = true;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, priv_d.url, &err), 0, "%s", err.message);
    char *id = test_id("privinterp");
    /* the sandbox itself cannot reach the path */
    sbx_exec_result er;
    char probe[400];
    snprintf(probe, sizeof(probe), "test -r %s/driver.py && echo visible || echo hidden", interp);
    cr_assert_eq(test_sh(c, id, probe, 60000, &er, &err), 0, "%s", err.message);
    cr_expect_str_eq(er.stdout_data, "hidden\n");
    sbx_exec_result_free(&er);
    sbx_reply *r = run(c, id, NULL, "python", "6 * 7", 0);
    char *t = main_text(r);
    cr_expect_str_eq(t, "42");
    free(t);
    sbx_reply_free(r);
    r = run(c, id, NULL, "javascript", "6 * 7", 0);
    t = main_text(r);
    cr_expect_str_eq(t, "42");
    free(t);
    sbx_reply_free(r);
    sbx_destroy(c, id, NULL, NULL);
    free(id);
    sbx_client_close(c);
}
