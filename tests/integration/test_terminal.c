/*
 * test_terminal.c — a session's terminal over WebSocket (docs/http.md
 * "Terminal"), driven by a small RFC 6455 client (tests/support/wsclient):
 * 426 for a plain request, the handshake, replay then {"type":"ready"},
 * keystrokes and output, resize, several viewers of one terminal (a late
 * one is replayed what it missed), {"type":"exit","code":N} then a close
 * frame, the same terminal through plain HTTP operations, and
 * session.delete ending it.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"
#include "../support/wsclient.h"

/* ---------------------------------------------------------------------------------- */
/* Helpers. */

/* A viewer: the socket, the output it saw, the text frames it got. */
struct viewer {
    wsc w;
    sbx_buf out;         /* binary frames, concatenated */
    size_t ready_at;     /* out.len when {"type":"ready"} came; (size_t)-1 before */
    json_t *texts;       /* every text frame, parsed (array) */
    bool closed;         /* a close frame came */
    int close_code;
};

static void
v_open(struct viewer *v, const char *id, const char *query)
{
    memset(v, 0, sizeof(*v));
    sbx_buf_init(&v->out);
    v->ready_at = (size_t)-1;
    v->texts = json_array();
    char host[64], err[256];
    snprintf(host, sizeof(host), "127.0.0.1:%d", http_port());
    char *path = hfmt("/v1/sandboxes/%s/terminal%s", id, query ? query : "");
    int st = wsc_connect(&v->w, http_port(), host, path, NULL, 60000, err, sizeof(err));
    cr_assert_eq(st, 101, "terminal upgrade %s: %d %s %s", path, st, err,
                 v->w.body ? v->w.body : "");
    cr_expect(wsc_accept_ok(&v->w), "Sec-WebSocket-Accept is wrong: %s", v->w.head);
    free(path);
}

static void
v_close(struct viewer *v)
{
    wsc_close(&v->w);
    sbx_buf_free(&v->out);
    json_decref(v->texts);
}

/* Read one message into the viewer. Returns the opcode, -1 timeout, -2 end. */
static int
v_read(struct viewer *v, int timeout_ms)
{
    char *d;
    size_t n;
    int op = wsc_recv(&v->w, &d, &n, timeout_ms);
    if (op == WS_BINARY) {
        sbx_buf_append(&v->out, d, n);
    } else if (op == WS_TEXT) {
        json_error_t je;
        json_t *j = json_loads(d, 0, &je);
        cr_expect(j != NULL, "a text frame that is not JSON: %s", d);
        if (j) {
            if (!strcmp(jstr(j, "type"), "ready") && v->ready_at == (size_t)-1)
                v->ready_at = v->out.len;
            json_array_append_new(v->texts, j);
        }
    } else if (op == WS_CLOSE) {
        v->closed = true;
        v->close_code = v->w.close_code;
    }
    free(d);
    return op;
}

/* The output so far, NUL-terminated (a view into v->out). */
static const char *
v_text(struct viewer *v)
{
    sbx_buf_reserve(&v->out, 1);
    v->out.p[v->out.len] = 0;
    return v->out.p;
}

/* Read until the output holds `needle` (after offset `from`), or timeout. */
static bool
v_wait_for(struct viewer *v, const char *needle, size_t from, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    for (;;) {
        const char *t = v_text(v);
        if (v->out.len >= from && strstr(t + from, needle))
            return true;
        int left = (int)(until - test_now_ms());
        if (left <= 0)
            return false;
        int op = v_read(v, left);
        if (op < 0 || op == WS_CLOSE)
            return strstr(v_text(v) + (v->out.len >= from ? from : v->out.len), needle) != NULL;
    }
}

static bool
v_wait_ready(struct viewer *v, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    while (v->ready_at == (size_t)-1) {
        int left = (int)(until - test_now_ms());
        if (left <= 0)
            return false;
        int op = v_read(v, left);
        if (op < 0 || op == WS_CLOSE)
            return false;
    }
    return true;
}

/* The first text frame of a type, or NULL. */
static json_t *
v_text_of(struct viewer *v, const char *type)
{
    size_t i;
    json_t *j;
    json_array_foreach(v->texts, i, j) if (!strcmp(jstr(j, "type"), type)) return j;
    return NULL;
}

static void
v_type(struct viewer *v, const char *keys)
{
    cr_assert_eq(wsc_send(&v->w, WS_BINARY, keys, strlen(keys)), 0, "cannot send keystrokes");
}

static void
v_control(struct viewer *v, const char *json)
{
    cr_assert_eq(wsc_send(&v->w, WS_TEXT, json, strlen(json)), 0, "cannot send a control frame");
}

/* Read until the server's close frame (or the end), collecting everything. */
static void
v_drain_to_close(struct viewer *v, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    while (!v->closed) {
        int left = (int)(until - test_now_ms());
        if (left <= 0)
            return;
        int op = v_read(v, left);
        if (op < 0)
            return;
    }
}

/* ---------------------------------------------------------------------------------- */

Test(terminal, accept_value_of_the_client_helper)
{
    /* RFC 6455 §1.3's worked example: the helper the other tests trust. */
    char acc[32];
    ws_accept_for("dGhlIHNhbXBsZSBub25jZQ==", acc);
    cr_assert_str_eq(acc, "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
}

Test(terminal, plain_request_is_426_and_bad_handshakes_are_refused, .timeout = 60)
{
    char *id = test_id("tplain");
    struct hresp r;
    apif("GET", NULL, &r, "/v1/sandboxes/%s/terminal", id);
    expect_status(r, 426, "a plain GET of the terminal");
    char *up = hresp_header(&r, "Upgrade");
    cr_expect(up && !strcasecmp(up, "websocket"), "426 without Upgrade: websocket (%s)",
              up ? up : "-");
    free(up);
    hresp_free(&r);
    /* A WebSocket version other than 13. */
    static const char *const v8[] = {"Upgrade: websocket", "Connection: Upgrade",
                                     "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
                                     "Sec-WebSocket-Version: 8", NULL};
    char *u = hfmt("%s/v1/sandboxes/%s/terminal", test_http_url(), id);
    struct hopts o = {.headers = v8, .timeout_ms = 20000};
    http_req("GET", u, &o, &r);
    expect_status(r, 400, "Sec-WebSocket-Version: 8");
    hresp_free(&r);
    free(u);
    wsc w;
    char err[256], host[64];
    snprintf(host, sizeof(host), "127.0.0.1:%d", http_port());
    /* An invalid sandbox ID. */
    int st = wsc_connect(&w, http_port(), host, "/v1/sandboxes/Bad_ID/terminal", NULL, 20000, err,
                     sizeof(err));
    cr_expect_eq(st, 400, "terminal of an invalid sandbox ID: %d %s", st, err);
    wsc_close(&w);
    hdone(id);
}

Test(terminal, type_resize_and_exit, .timeout = 120)
{
    char *id = test_id("tterm");
    struct viewer a;
    v_open(&a, id, "?session=main&cols=80&rows=24");
    cr_assert(v_wait_ready(&a, 30000), "no {\"type\":\"ready\"} (texts %s)",
              json_dumps(a.texts, JSON_COMPACT));
    /* The first text frame is ready (nothing before it but replayed output). */
    cr_expect_str_eq(jstr(json_array_get(a.texts, 0), "type"), "ready");
    size_t mark = a.out.len;
    v_type(&a, "echo $((6*7))\n");
    cr_expect(v_wait_for(&a, "42\r\n", mark, 20000), "no 42 in the output: %s", v_text(&a) + mark);
    /* The terminal's size, then a resize. */
    mark = a.out.len;
    v_type(&a, "stty size\n");
    cr_expect(v_wait_for(&a, "24 80\r\n", mark, 20000), "initial size: %s", v_text(&a) + mark);
    v_control(&a, "{\"type\":\"resize\",\"cols\":100,\"rows\":33}");
    mark = a.out.len;
    v_type(&a, "stty size; echo TERM=$TERM\n");
    cr_expect(v_wait_for(&a, "TERM=xterm-256color\r\n", mark, 20000), "TERM: %s",
              v_text(&a) + mark);
    cr_expect(strstr(v_text(&a) + mark, "33 100\r\n") != NULL, "after resize: %s",
              v_text(&a) + mark);
    /* A bad resize and a text frame that is no control message: error frames,
     * the terminal goes on. */
    size_t ntexts = json_array_size(a.texts);
    v_control(&a, "{\"type\":\"resize\",\"cols\":0,\"rows\":5000}");
    v_control(&a, "not json");
    mark = a.out.len;
    v_type(&a, "echo still-$((1+1))\n");
    cr_expect(v_wait_for(&a, "still-2\r\n", mark, 20000), "after errors: %s", v_text(&a) + mark);
    for (int i = 0; i < 20 && json_array_size(a.texts) < ntexts + 2; i++)
        v_read(&a, 500);
    int nerr = 0;
    for (size_t i = ntexts; i < json_array_size(a.texts); i++)
        if (!strcmp(jstr(json_array_get(a.texts, i), "type"), "error")) {
            nerr++;
            cr_expect(strlen(jstr(json_array_get(a.texts, i), "message")) > 0);
        }
    cr_expect_eq(nerr, 2, "error frames: %s", json_dumps(a.texts, JSON_COMPACT));
    /* exit 3: {"type":"exit","code":3}, then a close frame. */
    v_type(&a, "exit 3\n");
    v_drain_to_close(&a, 30000);
    json_t *ex = v_text_of(&a, "exit");
    cr_expect(ex != NULL, "no exit message: %s", json_dumps(a.texts, JSON_COMPACT));
    cr_expect_eq(jint(ex, "code"), 3, "exit: %s", ex ? json_dumps(ex, JSON_COMPACT) : "-");
    cr_expect(a.closed, "no close frame after the exit");
    cr_expect_eq(a.close_code, 1000, "close code %d", a.close_code);
    /* The exit message is the last text frame. */
    json_t *last = json_array_get(a.texts, json_array_size(a.texts) - 1);
    cr_expect_str_eq(jstr(last, "type"), "exit");
    v_close(&a);
    hdone(id);
}

Test(terminal, viewers_share_one_terminal, .timeout = 120)
{
    char *id = test_id("tshare");
    struct viewer a, b, c;
    v_open(&a, id, "?session=shared");
    cr_assert(v_wait_ready(&a, 30000), "viewer A: no ready");
    v_type(&a, "echo first-$((20+1))\n");
    cr_assert(v_wait_for(&a, "first-21\r\n", 0, 20000), "A: %s", v_text(&a));
    /* B joins: it is replayed what was printed before, then ready. */
    v_open(&b, id, "?session=shared");
    cr_assert(v_wait_ready(&b, 30000), "viewer B: no ready");
    const char *bt = v_text(&b);
    char *hit = strstr(bt, "first-21\r\n");
    cr_expect(hit != NULL && (size_t)(hit - bt) < b.ready_at,
              "B was not replayed the earlier output before ready: %s", bt);
    /* Both see what either types. */
    size_t ma = a.out.len, mb = b.out.len;
    v_type(&b, "echo from-b-$((3*3))\n");
    cr_expect(v_wait_for(&b, "from-b-9\r\n", mb, 20000), "B: %s", v_text(&b) + mb);
    cr_expect(v_wait_for(&a, "from-b-9\r\n", ma, 20000), "A did not see B's command: %s",
              v_text(&a) + ma);
    ma = a.out.len;
    mb = b.out.len;
    v_type(&a, "echo from-a-$((4*4))\n");
    cr_expect(v_wait_for(&a, "from-a-16\r\n", ma, 20000), "A: %s", v_text(&a) + ma);
    cr_expect(v_wait_for(&b, "from-a-16\r\n", mb, 20000), "B did not see A's command: %s",
              v_text(&b) + mb);
    /* A leaves; the terminal lives on for B; C comes late and gets the history. */
    v_close(&a);
    mb = b.out.len;
    v_type(&b, "echo after-a-left\n");
    cr_expect(v_wait_for(&b, "after-a-left\r\n", mb, 20000), "B: %s", v_text(&b) + mb);
    v_open(&c, id, "?session=shared");
    cr_assert(v_wait_ready(&c, 30000), "viewer C: no ready");
    const char *ct = v_text(&c);
    const char *want[] = {"first-21\r\n", "from-b-9\r\n", "from-a-16\r\n", "after-a-left\r\n"};
    for (size_t i = 0; i < 4; i++) {
        char *h = strstr(ct, want[i]);
        cr_expect(h && (size_t)(h - ct) < c.ready_at, "C's replay lacks %s: %s", want[i], ct);
    }
    /* Another session is another terminal. */
    struct viewer o;
    v_open(&o, id, "?session=other");
    cr_assert(v_wait_ready(&o, 30000), "other session: no ready");
    cr_expect(!strstr(v_text(&o), "first-21"), "another session's terminal shows this one's output");
    /* The shell exits: every viewer gets the exit and a close. */
    v_type(&c, "exit 5\n");
    v_drain_to_close(&b, 30000);
    v_drain_to_close(&c, 30000);
    cr_expect_eq(jint(v_text_of(&b, "exit"), "code"), 5, "B: %s", json_dumps(b.texts, JSON_COMPACT));
    cr_expect_eq(jint(v_text_of(&c, "exit"), "code"), 5, "C: %s", json_dumps(c.texts, JSON_COMPACT));
    cr_expect(b.closed && c.closed, "no close frames (B %d, C %d)", b.closed, c.closed);
    /* The other session's terminal is unaffected. */
    size_t mo = o.out.len;
    v_type(&o, "echo other-alive\n");
    cr_expect(v_wait_for(&o, "other-alive\r\n", mo, 20000), "other: %s", v_text(&o) + mo);
    v_close(&b);
    v_close(&c);
    v_close(&o);
    hdone(id);
}

/* Collect a terminal's output stream over SSE until a needle shows up. */
struct term_sse {
    sbx_buf out;
    const char *needle;
    bool exit_seen;
    long long exit_code;
};

static bool
term_cb(const struct sse_ev *ev, void *arg)
{
    struct term_sse *t = arg;
    if (ev->comment || !ev->json)
        return true;
    if (!strcmp(ev->event, "output")) {
        const char *d = jstr(ev->json, "data");
        sbx_buf_append(&t->out, d, strlen(d));
        sbx_buf_reserve(&t->out, 1);
        t->out.p[t->out.len] = 0;
        if (t->needle && strstr(t->out.p, t->needle))
            return false;
    } else if (!strcmp(ev->event, "exit")) {
        t->exit_seen = true;
        t->exit_code = jint(ev->json, "code");
    }
    return true;
}

Test(terminal, plain_http_operations, .timeout = 120)
{
    char *id = test_id("thttp");
    struct hresp r;
    apif("POST", "{\"sessionId\":\"h1\",\"cols\":120,\"rows\":40}", &r,
         "/v1/sandboxes/%s/terminal.open", id);
    assert_status(r, 200, "terminal.open");
    char *sid = sbx_xstrdup(jstr(r.json, "streamId"));
    cr_assert(*sid, "terminal.open returned no streamId: %s", r.body);
    hresp_free(&r);
    apif("POST", "{\"sessionId\":\"h1\",\"data\":\"stty size; echo via-http-$((2*3))\\n\"}", &r,
         "/v1/sandboxes/%s/terminal.write", id);
    expect_status(r, 200, "terminal.write");
    hresp_free(&r);
    char *u = hfmt("%s/v1/sandboxes/%s/streams/%s", test_http_url(), id, sid);
    struct term_sse t = {.needle = "via-http-6\r\n"};
    sbx_buf_init(&t.out);
    struct hopts o = {.timeout_ms = 30000};
    sse_req("GET", u, &o, term_cb, &t, &r);
    expect_status(r, 200, "the terminal's stream as SSE");
    hresp_free(&r);
    sbx_buf_append(&t.out, "", 1);
    cr_expect(strstr(t.out.p, "via-http-6\r\n") != NULL, "output: %s", t.out.p);
    cr_expect(strstr(t.out.p, "40 120\r\n") != NULL, "size from terminal.open: %s", t.out.p);
    /* A WebSocket viewer of the same terminal sees the same history. */
    struct viewer v;
    v_open(&v, id, "?session=h1");
    cr_assert(v_wait_ready(&v, 30000));
    cr_expect(strstr(v_text(&v), "via-http-6\r\n") != NULL, "WS replay: %s", v_text(&v));
    /* terminal.resize through HTTP, seen by the shell. */
    apif("POST", "{\"sessionId\":\"h1\",\"cols\":90,\"rows\":30}", &r,
         "/v1/sandboxes/%s/terminal.resize", id);
    expect_status(r, 200, "terminal.resize");
    hresp_free(&r);
    size_t mark = v.out.len;
    v_type(&v, "stty size\n");
    cr_expect(v_wait_for(&v, "30 90\r\n", mark, 20000), "after terminal.resize: %s",
              v_text(&v) + mark);
    /* terminal.close: the viewer sees the shell end. */
    apif("POST", "{\"sessionId\":\"h1\"}", &r, "/v1/sandboxes/%s/terminal.close", id);
    expect_status(r, 200, "terminal.close");
    hresp_free(&r);
    v_drain_to_close(&v, 30000);
    cr_expect(v_text_of(&v, "exit") != NULL, "no exit after terminal.close: %s",
              json_dumps(v.texts, JSON_COMPACT));
    cr_expect(v.closed, "no close frame after terminal.close");
    v_close(&v);
    /* Writing to it now fails. */
    apif("POST", "{\"sessionId\":\"h1\",\"data\":\"x\"}", &r, "/v1/sandboxes/%s/terminal.write",
         id);
    cr_expect(r.status >= 400, "terminal.write after close: %ld %s", r.status, r.body);
    hresp_free(&r);
    /* An unknown session's terminal. */
    apif("POST", "{\"sessionId\":\"never\",\"data\":\"x\"}", &r,
         "/v1/sandboxes/%s/terminal.write", id);
    expect_status(r, 404, "terminal.write of an unknown session");
    hresp_free(&r);
    sbx_buf_free(&t.out);
    free(u);
    free(sid);
    hdone(id);
}

Test(terminal, session_delete_ends_the_terminal, .timeout = 120)
{
    char *id = test_id("tsdel");
    struct hresp r;
    apif("POST", "{\"id\":\"doomed\"}", &r, "/v1/sandboxes/%s/session.create", id);
    assert_status(r, 200, "session.create");
    hresp_free(&r);
    struct viewer v;
    v_open(&v, id, "?session=doomed");
    cr_assert(v_wait_ready(&v, 30000));
    size_t mark = v.out.len;
    v_type(&v, "pwd; echo alive\n");
    cr_expect(v_wait_for(&v, "alive\r\n", mark, 20000), "%s", v_text(&v) + mark);
    double t0 = test_now_ms();
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/sessions/doomed", id);
    expect_status(r, 200, "DELETE the session");
    hresp_free(&r);
    v_drain_to_close(&v, 30000);
    cr_expect(v_text_of(&v, "exit") != NULL, "no exit message after session.delete: %s",
              json_dumps(v.texts, JSON_COMPACT));
    cr_expect(v.closed, "the WebSocket stayed open after session.delete");
    cr_expect_lt(test_now_ms() - t0, 15000, "the terminal took %.0f ms to end",
                 test_now_ms() - t0);
    v_close(&v);
    /* The default session (and the sandbox) are fine. */
    apif("POST", "{\"command\":\"echo ok\"}", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 200, "exec after");
    cr_expect_str_eq(jstr(r.json, "stdout"), "ok\n");
    hresp_free(&r);
    hdone(id);
}

/* VmRSS in KiB of the `sbxd dev` process of this test binary (the gateway
 * and its HTTP front live there): the process whose command line names
 * $SBX_TEST_DIR and "dev".  Read only, never signalled. */
static long
dev_rss_kib(void)
{
    const char *dir = getenv("SBX_TEST_DIR");
    cr_assert(dir && *dir, "SBX_TEST_DIR is not set");
    DIR *d = opendir("/proc");
    cr_assert(d);
    long rss = -1;
    struct dirent *de;
    while (rss < 0 && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        char path[64], cl[2048];
        snprintf(path, sizeof(path), "/proc/%s/cmdline", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(cl, 1, sizeof(cl) - 1, f);
        fclose(f);
        cl[n] = '\0';
        bool dev = false, ours = false;
        for (size_t i = 0; i < n; i += strlen(cl + i) + 1) {
            dev |= !strcmp(cl + i, "dev");
            ours |= strstr(cl + i, dir) != NULL;
        }
        if (!dev || !ours)
            continue;
        snprintf(path, sizeof(path), "/proc/%s/status", de->d_name);
        f = fopen(path, "r");
        char line[256];
        while (f && fgets(line, sizeof(line), f))
            if (sscanf(line, "VmRSS: %ld", &rss) == 1)
                break;
        if (f)
            fclose(f);
    }
    closedir(d);
    cr_assert_geq(rss, 0, "no sbxd dev process for %s", dir);
    return rss;
}

/*
 * A viewer that stops reading while the terminal prints as fast as it can
 * does not grow the gateway: the reader holds off at its queue's cap
 * (gateway/terminal.c, back-pressure).  Unbounded, the gateway grew by
 * ~670 MB in 18 s here.  Afterwards the viewer reads again and the terminal
 * answers.
 */
Test(terminal, a_viewer_that_does_not_read_does_not_grow_the_gateway, .timeout = 180)
{
    char *id = test_id("tslow");
    struct viewer a;
    v_open(&a, id, "?session=main&cols=80&rows=24");
    cr_assert(v_wait_ready(&a, 30000), "no ready");
    long before = dev_rss_kib();
    v_type(&a, "yes 0123456789abcdefghijklmnopqrstuvwxyz\n");
    sleep(10);
    long after = dev_rss_kib();
    cr_expect_lt(after - before, 64 * 1024,
                 "the gateway grew by %ld KiB while a viewer did not read", after - before);
    /* Ctrl-C, then drain what is queued until the prompt answers again. */
    v_type(&a, "\003");
    size_t mark = a.out.len;
    v_type(&a, "echo back-$((40+2))\n");
    cr_expect(v_wait_for(&a, "back-42\r\n", mark, 60000), "the terminal did not answer after the flood");
    v_close(&a);
    hdone(id);
}

/* A viewer of the terminal of a private daemon whose HTTP front is on port. */
static void
v_open_port(struct viewer *v, int port, const char *id, const char *query)
{
    memset(v, 0, sizeof(*v));
    sbx_buf_init(&v->out);
    v->ready_at = (size_t)-1;
    v->texts = json_array();
    char host[64], err[256], path[256];
    snprintf(host, sizeof(host), "127.0.0.1:%d", port);
    snprintf(path, sizeof(path), "/v1/sandboxes/%s/terminal%s", id, query);
    int st = wsc_connect(&v->w, port, host, path, NULL, 60000, err, sizeof(err));
    cr_assert_eq(st, 101, "terminal upgrade %s: %d %s", path, st, err);
}

/* A client gone without a close (a closed laptop, a dropped NAT entry: TCP
 * hears nothing while nothing is sent) does not keep its terminal — a
 * gateway thread, a stream, and reads that count as the sandbox's activity,
 * so that it never sleeps — for ever.  The gateway pings a client silent for
 * --http-ws-ping (500 ms here) and closes the connection after 3 × that without a
 * frame back; a client that answers pings (browsers do by themselves) keeps
 * its terminal however long it types nothing. */
Test(terminal, a_gone_client_is_closed_and_a_silent_live_one_kept, .timeout = 120)
{
    struct testd d;
    const char *extra[] = {TESTD_SMALL, "--http-ws-ping", "500ms", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0);
    char p[400], *addr = NULL;
    size_t n;
    snprintf(p, sizeof(p), "%s/http.addr", d.dir);
    cr_assert_eq(sbx_fs_read(p, 256, &addr, &n), 0, "no %s", p);
    int port = atoi(strrchr(addr, ':') + 1);
    free(addr);
    struct viewer live, gone;
    v_open_port(&live, port, "wsping", "?session=live");
    cr_assert(v_wait_ready(&live, 30000), "live: no ready");
    v_open_port(&gone, port, "wsping", "?session=gone");
    cr_assert(v_wait_ready(&gone, 30000), "gone: no ready");
    /* 4 s: 8 ping intervals.  live reads (and so answers pings); gone does
     * not read at all. */
    double until = test_now_ms() + 4000;
    int op = -1;
    while (test_now_ms() < until && (op = v_read(&live, 200)) != -2 && op != WS_CLOSE)
        ;
    cr_expect(op != -2 && op != WS_CLOSE, "the live client's terminal ended (%d)", op);
    size_t mark = live.out.len;
    v_type(&live, "echo still-$((40+2))\n");
    cr_expect(v_wait_for(&live, "still-42\r\n", mark, 20000), "live: %s", v_text(&live) + mark);
    /* gone's connection was closed meanwhile: what it holds, then the end. */
    until = test_now_ms() + 5000;
    while (test_now_ms() < until && (op = v_read(&gone, 500)) != -2 && op != WS_CLOSE)
        ;
    cr_expect(op == -2 || op == WS_CLOSE,
              "the gone client's connection is still open 4 s after it went silent (%d)", op);
    v_close(&live);
    v_close(&gone);
    testd_stop(&d);
}
