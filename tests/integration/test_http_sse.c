/*
 * test_http_sse.c — the HTTP front (docs/http.md) against a private sbxd,
 * with libcurl as the client: Server-Sent Events (ids, types, the UTF-8
 * split, resume with Last-Event-ID, heartbeats, process logs,
 * STREAM_NOT_FOUND) and the OpenAPI document checked against the routes
 * actually served, and a command cancelled the moment it started (its
 * stream).  test_http.c has the routes, errors, headers and API keys.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"

/* The table of operations itself (runtime/ops.o and ops_gen.o are linked,
 * see the Makefile): the OpenAPI test checks that every operation is served. */
#include "../../runtime/ops.h"

#include "http_util.h"

/* ---------------------------------------------------------------------------------- */
/* Server-Sent Events. */

struct evlist {
    int n, cap;
    struct {
        char id[32];
        bool has_id;
        char event[64];
        char *data;
        json_t *json;
        bool comment;
        double at_ms;
    } *e;
    int stop_after; /* stop after this many events (0: read to the end) */
    int linger_ms;  /* before dropping the connection, stay connected this long */
};

static bool
collect(const struct sse_ev *ev, void *arg)
{
    struct evlist *l = arg;
    if (l->n == l->cap) {
        l->cap = l->cap * 2 + 16;
        l->e = sbx_xrealloc(l->e, (size_t)l->cap * sizeof(*l->e));
    }
    memset(&l->e[l->n], 0, sizeof(l->e[0]));
    snprintf(l->e[l->n].id, sizeof(l->e[0].id), "%s", ev->id);
    l->e[l->n].has_id = ev->has_id;
    snprintf(l->e[l->n].event, sizeof(l->e[0].event), "%s", ev->event);
    l->e[l->n].data = sbx_xstrdup(ev->data ? ev->data : "");
    l->e[l->n].json = ev->json ? json_incref(ev->json) : NULL;
    l->e[l->n].comment = ev->comment;
    l->e[l->n].at_ms = ev->at_ms;
    l->n++;
    if (l->stop_after && !ev->comment) {
        int real = 0;
        for (int i = 0; i < l->n; i++)
            real += !l->e[i].comment;
        if (real >= l->stop_after && l->linger_ms)
            tsleep_ms(l->linger_ms);
        return real < l->stop_after;
    }
    return true;
}

static void
evlist_free(struct evlist *l)
{
    for (int i = 0; i < l->n; i++) {
        free(l->e[i].data);
        if (l->e[i].json)
            json_decref(l->e[i].json);
    }
    free(l->e);
    memset(l, 0, sizeof(*l));
}

/* Check the events of a stream: ids strictly increasing by one from
 * first_id, event == data.type, JSON data.  Returns the last id. */
static long long
check_events(const struct evlist *l, long long first_id, const char *what)
{
    long long prev = first_id - 1;
    for (int i = 0; i < l->n; i++) {
        if (l->e[i].comment)
            continue;
        cr_expect(l->e[i].json != NULL, "%s: event %d data is not JSON: %s", what, i,
                  l->e[i].data);
        cr_expect(l->e[i].has_id, "%s: event %d (%s) has no id", what, i, l->e[i].event);
        long long id = atoll(l->e[i].id);
        cr_expect_eq(id, prev + 1, "%s: event %d has id %lld after %lld (gap or duplicate)", what,
                     i, id, prev);
        prev = id;
        cr_expect_str_eq(l->e[i].event, jstr(l->e[i].json, "type"),
                         "%s: event: %s but data.type %s", what, l->e[i].event,
                         jstr(l->e[i].json, "type"));
        cr_expect_eq(jint(l->e[i].json, "seq"), id, "%s: id %lld, seq %lld", what, id,
                     jint(l->e[i].json, "seq"));
    }
    return prev;
}

/* The concatenated `data` of the stdout events. */
static char *
stdout_of(const struct evlist *l)
{
    sbx_buf b;
    sbx_buf_init(&b);
    for (int i = 0; i < l->n; i++)
        if (!l->e[i].comment && !strcmp(l->e[i].event, "stdout")) {
            const char *d = jstr(l->e[i].json, "data");
            sbx_buf_append(&b, d, strlen(d));
        }
    sbx_buf_append(&b, "", 1);
    return sbx_buf_steal(&b, NULL);
}

static const char *
last_event(const struct evlist *l)
{
    for (int i = l->n - 1; i >= 0; i--)
        if (!l->e[i].comment)
            return l->e[i].event;
    return "";
}

static long
sse_exec(const char *id, const char *cmd, struct evlist *l, struct hresp *r)
{
    char *u = hfmt("%s/v1/sandboxes/%s/exec.stream", test_http_url(), id);
    char *b = body("{s:s}", "command", cmd);
    static const char *const ct[] = {"Content-Type: application/json", NULL};
    struct hopts o = {.headers = ct, .body = b, .body_len = strlen(b), .timeout_ms = 90000};
    long st = sse_req("POST", u, &o, collect, l, r);
    free(b);
    free(u);
    return st;
}

Test(sse, exec_stream_events, .timeout = 120)
{
    char *id = test_id("sse");
    struct evlist l = {0};
    struct hresp r;
    /* A euro sign (3 bytes) and an emoji (4 bytes) split across writes. */
    sse_exec(id,
             "echo one; echo two >&2; printf '\\342\\202'; sleep 0.4; printf '\\254\\n'; "
             "printf '\\360'; sleep 0.4; printf '\\237\\230\\200 end\\n'",
             &l, &r);
    assert_status(r, 200, "exec.stream as SSE");
    cr_expect_str_eq(r.err, "", "the stream broke: %s", r.err);
    char *ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strncmp(ct, "text/event-stream", 17), "Content-Type %s", ct ? ct : "-");
    free(ct);
    char *sid = hresp_header(&r, "X-Sbx-Stream-Id");
    cr_expect(sid && *sid, "no X-Sbx-Stream-Id");
    free(sid);
    cr_assert_gt(l.n, 3, "only %d events", l.n);
    check_events(&l, 1, "exec.stream");
    cr_expect_str_eq(l.e[0].event, "start");
    cr_expect_str_eq(last_event(&l), "complete", "the last event is %s", last_event(&l));
    for (int i = l.n - 1; i >= 0; i--)
        if (!strcmp(l.e[i].event, "complete")) {
            cr_expect_eq(jint(l.e[i].json, "exitCode"), 0, "%s", l.e[i].data);
            break;
        }
    char *out = stdout_of(&l);
    cr_expect_str_eq(out, "one\n\xe2\x82\xac\n\xf0\x9f\x98\x80 end\n", "stdout: %s", out);
    cr_expect(!strstr(out, "\xef\xbf\xbd"), "a split UTF-8 sequence became U+FFFD: %s", out);
    free(out);
    int nout = 0, nerr = 0;
    for (int i = 0; i < l.n; i++) {
        nout += !strcmp(l.e[i].event, "stdout");
        if (!strcmp(l.e[i].event, "stderr")) {
            nerr++;
            cr_expect_str_eq(jstr(l.e[i].json, "data"), "two\n");
        }
    }
    /* The sleeps split the output: the split case really happened. */
    cr_expect_geq(nout, 3, "only %d stdout events: the UTF-8 split was not exercised", nout);
    cr_expect_eq(nerr, 1);
    evlist_free(&l);
    hresp_free(&r);

    /* Without the Accept header: {streamId} as JSON. */
    struct hresp j;
    apif("POST", "{\"command\":\"echo hi\"}", &j, "/v1/sandboxes/%s/exec.stream", id);
    expect_status(j, 200, "exec.stream as JSON");
    cr_expect(strlen(jstr(j.json, "streamId")) > 0, "%s", j.body);
    hresp_free(&j);
    hdone(id);
}

Test(sse, resume_with_last_event_id, .timeout = 120)
{
    char *id = test_id("sseres");
    /* The client takes 6 events, then its connection stays up (unread) for a
     * second and drops: what the front sent meanwhile never reached the client,
     * which resumes after the last event it has. */
    struct evlist a = {.stop_after = 6, .linger_ms = 1000};
    struct hresp r;
    /* 40 numbered lines, each its own event. */
    sse_exec(id, "for i in $(seq 1 40); do echo line $i; sleep 0.05; done", &a, &r);
    assert_status(r, 200, "exec.stream");
    char *sid = hresp_header(&r, "X-Sbx-Stream-Id");
    cr_assert(sid && *sid, "no X-Sbx-Stream-Id");
    hresp_free(&r);
    long long last = check_events(&a, 1, "first part");
    cr_assert_eq(last, 6, "read %lld events before dropping", last);
    /* The command runs on while nobody is connected. */
    tsleep_ms(300);
    struct evlist b = {0};
    char *u = hfmt("%s/v1/sandboxes/%s/streams/%s", test_http_url(), id, sid);
    char lh[64];
    snprintf(lh, sizeof(lh), "Last-Event-ID: %lld", last);
    const char *const h[] = {lh, NULL};
    struct hopts o = {.headers = h, .timeout_ms = 60000};
    sse_req("GET", u, &o, collect, &b, &r);
    assert_status(r, 200, "resume");
    cr_expect_str_eq(r.err, "", "%s", r.err);
    hresp_free(&r);
    cr_assert_gt(b.n, 0);
    check_events(&b, last + 1, "resumed part");
    cr_expect_str_eq(last_event(&b), "complete");
    /* Together: every line once, in order. */
    char *o1 = stdout_of(&a), *o2 = stdout_of(&b);
    char *all = hfmt("%s%s", o1, o2);
    sbx_buf want;
    sbx_buf_init(&want);
    for (int i = 1; i <= 40; i++)
        sbx_buf_appendf(&want, "line %d\n", i);
    sbx_buf_append(&want, "", 1);
    cr_expect_str_eq(all, want.p, "lines lost or repeated across the resume:\n%s", all);
    sbx_buf_free(&want);
    free(all);
    free(o1);
    free(o2);
    evlist_free(&a);
    evlist_free(&b);
    free(u);
    free(sid);
    hdone(id);
}

Test(sse, resume_with_after_parameter, .timeout = 120)
{
    char *id = test_id("sseafter");
    struct hresp r;
    apif("POST", "{\"command\":\"for i in 1 2 3 4 5; do echo n$i; sleep 0.1; done\"}", &r,
         "/v1/sandboxes/%s/exec.stream", id);
    assert_status(r, 200, "exec.stream");
    char *sid = sbx_xstrdup(jstr(r.json, "streamId"));
    hresp_free(&r);
    /* From the beginning, stopping after 3 events. */
    struct evlist a = {.stop_after = 3};
    char *u = hfmt("%s/v1/sandboxes/%s/streams/%s", test_http_url(), id, sid);
    sse_req("GET", u, NULL, collect, &a, &r);
    assert_status(r, 200, "GET stream");
    hresp_free(&r);
    long long last = check_events(&a, 1, "first");
    char *u2 = hfmt("%s?after=%lld", u, last);
    struct evlist b = {0};
    sse_req("GET", u2, NULL, collect, &b, &r);
    assert_status(r, 200, "GET stream ?after");
    hresp_free(&r);
    check_events(&b, last + 1, "after");
    cr_expect_str_eq(last_event(&b), "complete");
    char *o1 = stdout_of(&a), *o2 = stdout_of(&b);
    char *all = hfmt("%s%s", o1, o2);
    cr_expect_str_eq(all, "n1\nn2\nn3\nn4\nn5\n");
    free(all);
    free(o1);
    free(o2);
    evlist_free(&a);
    evlist_free(&b);
    free(u2);
    free(u);
    free(sid);
    hdone(id);
}

Test(sse, heartbeat_during_a_quiet_command, .timeout = 120)
{
    char *id = test_id("ssebeat");
    struct evlist l = {0};
    struct hresp r;
    sse_exec(id, "sleep 17; echo awake", &l, &r);
    assert_status(r, 200, "exec.stream");
    cr_expect_str_eq(r.err, "", "%s", r.err);
    double out_at = -1, ping_at = -1;
    int pings = 0;
    for (int i = 0; i < l.n; i++) {
        if (l.e[i].comment && !strcmp(l.e[i].data, "ping")) {
            pings++;
            if (ping_at < 0)
                ping_at = l.e[i].at_ms;
        }
        if (!strcmp(l.e[i].event, "stdout") && out_at < 0)
            out_at = l.e[i].at_ms;
    }
    cr_expect_gt(pings, 0, "no ': ping' in %d events", l.n);
    cr_expect(ping_at > 0 && ping_at < out_at, "the ping (%.0f ms) came after the output (%.0f ms)",
              ping_at, out_at);
    cr_expect(ping_at > 5000, "a ping after %.0f ms: not a 15 s heartbeat", ping_at);
    cr_expect_leq(pings, 2, "%d pings in 17 s", pings);
    cr_expect_str_eq(last_event(&l), "complete");
    char *out = stdout_of(&l);
    cr_expect_str_eq(out, "awake\n");
    free(out);
    evlist_free(&l);
    hresp_free(&r);
    hdone(id);
}

Test(sse, process_logs, .timeout = 120)
{
    char *id = test_id("sseproc");
    struct hresp r;
    apif("POST",
         "{\"command\":\"for i in 1 2 3 4 5; do echo p$i; sleep 0.1; done; echo e >&2\","
         "\"processId\":\"logger\"}",
         &r, "/v1/sandboxes/%s/process.start", id);
    assert_status(r, 200, "process.start");
    hresp_free(&r);
    struct evlist l = {0};
    char *u = hfmt("%s/v1/sandboxes/%s/streams/proc:logger", test_http_url(), id);
    struct hopts o = {.timeout_ms = 60000};
    sse_req("GET", u, &o, collect, &l, &r);
    assert_status(r, 200, "GET streams/proc:logger");
    cr_expect_str_eq(r.err, "", "%s", r.err);
    hresp_free(&r);
    check_events(&l, 1, "process logs");
    cr_assert_gt(l.n, 1);
    cr_expect_str_eq(l.e[0].event, "process_info", "first event %s", l.e[0].event);
    cr_expect_str_eq(last_event(&l), "exit", "last event %s", last_event(&l));
    char *out = stdout_of(&l);
    cr_expect_str_eq(out, "p1\np2\np3\np4\np5\n");
    free(out);
    for (int i = 0; i < l.n; i++)
        if (!strcmp(l.e[i].event, "exit"))
            cr_expect_eq(jint(l.e[i].json, "exitCode"), 0, "%s", l.e[i].data);
    evlist_free(&l);
    /* A ring stream may be read again from the start by anyone. */
    struct evlist l2 = {0};
    sse_req("GET", u, &o, collect, &l2, &r);
    expect_status(r, 200, "GET streams/proc:logger again");
    hresp_free(&r);
    out = stdout_of(&l2);
    cr_expect_str_eq(out, "p1\np2\np3\np4\np5\n");
    free(out);
    evlist_free(&l2);
    free(u);
    hdone(id);
}

Test(sse, stream_not_found_before_any_event, .timeout = 120)
{
    char *id = test_id("ssenf");
    free(hsh(id, "true"));
    struct evlist l = {0};
    struct hresp r;
    char *u = hfmt("%s/v1/sandboxes/%s/streams/no-such-stream", test_http_url(), id);
    sse_req("GET", u, NULL, collect, &l, &r);
    expect_status(r, 404, "unknown stream");
    expect_code(r, "STREAM_NOT_FOUND", "unknown stream");
    char *ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strncmp(ct, "application/json", 16), "Content-Type %s", ct ? ct : "-");
    free(ct);
    cr_expect_eq(l.n, 0, "%d events before the error", l.n);
    hresp_free(&r);
    free(u);
    /* Process logs of an unknown process likewise. */
    u = hfmt("%s/v1/sandboxes/%s/streams/proc:nobody", test_http_url(), id);
    sse_req("GET", u, NULL, collect, &l, &r);
    expect_status(r, 404, "unknown process stream");
    cr_expect_eq(l.n, 0);
    hresp_free(&r);
    free(u);
    /* Last-Event-ID beyond the stream's end is refused before any event too. */
    apif("POST", "{\"command\":\"sleep 2\"}", &r, "/v1/sandboxes/%s/exec.stream", id);
    char *sid = sbx_xstrdup(jstr(r.json, "streamId"));
    hresp_free(&r);
    u = hfmt("%s/v1/sandboxes/%s/streams/%s", test_http_url(), id, sid);
    const char *const h[] = {"Last-Event-ID: 999", NULL};
    struct hopts o = {.headers = h};
    sse_req("GET", u, &o, collect, &l, &r);
    expect_status(r, 400, "Last-Event-ID beyond the end");
    cr_expect_eq(l.n, 0);
    hresp_free(&r);
    evlist_free(&l);
    free(u);
    free(sid);
    hdone(id);
}

/* Cancelling a command the moment it was started (before its shell ran any of
 * it): the command ends cancelled, the session's shell survives. */
Test(http, cancel_right_after_start, .timeout = 120)
{
    char *id = test_id("hcancel");
    struct hresp r;
    for (int i = 0; i < 6; i++) {
        char *b = hfmt("{\"command\":\"sleep 300\",\"sessionId\":\"fresh%d\"}", i);
        apif("POST", b, &r, "/v1/sandboxes/%s/exec.stream", id);
        free(b);
        assert_status(r, 200, "exec.stream");
        char *sid = sbx_xstrdup(jstr(r.json, "streamId"));
        hresp_free(&r);
        apif("DELETE", NULL, &r, "/v1/sandboxes/%s/streams/%s", id, sid);
        expect_status(r, 200, "DELETE streams/{id}");
        hresp_free(&r);
        struct evlist l = {0};
        char *u = hfmt("%s/v1/sandboxes/%s/streams/%s", test_http_url(), id, sid);
        struct hopts o = {.timeout_ms = 30000};
        sse_req("GET", u, &o, collect, &l, &r);
        expect_status(r, 200, "the cancelled stream");
        hresp_free(&r);
        const char *last = last_event(&l);
        cr_expect_str_eq(last, "complete", "session fresh%d: the stream ended with '%s': %s", i,
                         last, l.n ? l.e[l.n - 1].data : "");
        if (!strcmp(last, "complete"))
            cr_expect_eq(jbool(l.e[l.n - 1].json, "cancelled"), 1, "%s", l.e[l.n - 1].data);
        evlist_free(&l);
        free(u);
        free(sid);
        /* The session's shell is the same one afterwards (no SESSION_TERMINATED). */
        b = hfmt("{\"command\":\"echo alive\",\"sessionId\":\"fresh%d\"}", i);
        apif("POST", b, &r, "/v1/sandboxes/%s/exec", id);
        free(b);
        expect_status(r, 200, "the next command of the session");
        hresp_free(&r);
    }
    hdone(id);
}

/* ---------------------------------------------------------------------------------- */
/* The OpenAPI document. */

/* A plausible value for a path parameter. */
static const char *
param_value(const char *name, const char *sandbox)
{
    if (!strcmp(name, "sandbox"))
        return sandbox;
    if (!strcmp(name, "port"))
        return "8080";
    if (!strcmp(name, "path"))
        return "workspace/openapi-probe.txt";
    if (!strcmp(name, "streamId"))
        return "no-such-stream";
    if (!strcmp(name, "processId"))
        return "no-such-process";
    if (!strcmp(name, "contextId"))
        return "no-such-context";
    return "no-such-thing";
}

static char *
fill_template(const char *tpl, const char *sandbox)
{
    sbx_buf b;
    sbx_buf_init(&b);
    for (const char *p = tpl; *p;) {
        if (*p == '{') {
            const char *e = strchr(p, '}');
            cr_assert(e, "unterminated template %s", tpl);
            char name[64];
            snprintf(name, sizeof(name), "%.*s", (int)(e - p - 1), p + 1);
            const char *v = param_value(name, sandbox);
            sbx_buf_append(&b, v, strlen(v));
            p = e + 1;
        } else {
            sbx_buf_append(&b, p++, 1);
        }
    }
    sbx_buf_append(&b, "", 1);
    return sbx_buf_steal(&b, NULL);
}

Test(openapi, document_matches_the_routes, .timeout = 300)
{
    struct hresp doc;
    api("GET", "/v1/openapi.json", NULL, &doc);
    assert_status(doc, 200, "GET /v1/openapi.json");
    cr_assert(doc.json, "the OpenAPI document is not JSON");
    const char *ver = jstr(doc.json, "openapi");
    cr_expect(!strncmp(ver, "3.", 2), "openapi: '%s'", ver);
    cr_expect(strlen(jstr(doc.json, "info.title")) > 0, "no info.title");
    cr_expect(strlen(jstr(doc.json, "info.version")) > 0, "no info.version");
    json_t *paths = jget(doc.json, "paths");
    cr_assert(json_is_object(paths) && json_object_size(paths) > 10, "paths");

    /* Every operation of the table has its canonical route, and every alias
     * is listed; shard-to-shard operations and the front's own helpers are
     * neither listed nor served. */
    for (const struct sbx_op_def *d = sbx_ops; d->name; d++) {
        char *p = d->flags & (SBX_OP_GLOBAL | SBX_OP_NODE)
                      ? hfmt("/v1/%s", d->name)
                      : hfmt("/v1/sandboxes/{sandbox}/%s", d->name);
        if (d->flags & (SBX_OP_INTERNAL | SBX_OP_FRONT)) {
            cr_expect(!json_object_get(paths, p), "%s is in the document", p);
            char *served = hfmt("/v1/sandboxes/%s/%s", "some-box", d->name);
            struct hresp r;
            api("POST", served, "{}", &r);
            expect_status(r, 404, served);
            expect_code(r, "ROUTE_NOT_FOUND", served);
            hresp_free(&r);
            free(served);
            free(p);
            continue;
        }
        cr_expect(json_is_object(jget(json_object_get(paths, p), "post")),
                  "operation %s has no canonical route POST %s in the document", d->name, p);
        free(p);
        if (!d->http)
            continue;
        char *aliases = sbx_xstrdup(d->http), *save = NULL;
        for (char *a = strtok_r(aliases, "|", &save); a; a = strtok_r(NULL, "|", &save)) {
            char *sp = strchr(a, ' ');
            cr_assert(sp);
            *sp = 0;
            char tpl[256];
            snprintf(tpl, sizeof(tpl), "%s", sp + 1);
            char *colon;
            while ((colon = strstr(tpl, ":int}")))
                memmove(colon, colon + 4, strlen(colon + 4) + 1);
            char m[8];
            snprintf(m, sizeof(m), "%s", a);
            for (char *q = m; *q; q++)
                *q = (char)(*q | 32);
            cr_expect(json_is_object(json_object_get(json_object_get(paths, tpl), m)),
                      "alias %s %s of %s is not in the document", a, tpl, d->name);
        }
        free(aliases);
    }

    /* Every path + method in the document is served (the sandbox is a fresh one). */
    char *sb = test_id("oapi");
    const char *path;
    json_t *item;
    int nreq = 0;
    json_object_foreach(paths, path, item)
    {
        char *filled = fill_template(path, sb);
        char *u = hfmt("%s%s", test_http_url(), filled);
        const char *method;
        json_t *op;
        json_object_foreach(item, method, op)
        {
            char M[8];
            snprintf(M, sizeof(M), "%s", method);
            for (char *q = M; *q; q++)
                *q = (char)(*q & ~32);
            cr_expect(json_is_string(json_object_get(op, "operationId")), "%s %s: no operationId",
                      M, path);
            cr_expect(json_is_object(json_object_get(op, "responses")), "%s %s: no responses", M,
                      path);
            static const char *const ct[] = {"Content-Type: application/json", NULL};
            struct hopts o = {.timeout_ms = 90000};
            if (!strcmp(M, "POST")) {
                o.headers = ct;
                o.body = "{}";
                o.body_len = 2;
            } else if (!strcmp(M, "PUT")) {
                o.body = "probe";
                o.body_len = 5;
            }
            struct hresp r;
            http_req(M, u, &o, &r);
            nreq++;
            cr_expect(r.status >= 100, "%s %s: no answer (%s)", M, filled, r.err);
            cr_expect(strcmp(jstr(r.json, "code"), "ROUTE_NOT_FOUND"),
                      "%s %s is in the document but answers ROUTE_NOT_FOUND (%ld)", M, path,
                      r.status);
            hresp_free(&r);
        }
        /* A method the document does not list for this path is not served. */
        if (!json_object_get(item, "patch")) {
            struct hresp r;
            http_req("PATCH", u, NULL, &r);
            cr_expect_str_eq(jstr(r.json, "code"), "ROUTE_NOT_FOUND",
                             "PATCH %s: %ld %.200s", path, r.status, r.body);
            hresp_free(&r);
        }
        free(u);
        free(filled);
    }
    cr_expect_gt(nreq, 50, "only %d routes probed", nreq);

    /* Paths not in the document are not served. */
    const char *absent[] = {"/v1/nothing", "/v2/health", "/v1/sandboxes/%s/no.such.op",
                            "/v1/sandboxes/%s/files", "/v1/sandboxes/%s/processes/a/b/c",
                            "/v1/sandboxes", "/v1/health/extra", NULL};
    const char *methods[] = {"GET", "POST", "POST", "GET", "GET", "POST", "GET"};
    /* 405 where the path is served for other methods (GET /v1/sandboxes) */
    const long status[] = {404, 404, 404, 404, 404, 405, 404};
    for (int i = 0; absent[i]; i++) {
        char *p = hfmt(absent[i], sb);
        cr_expect(!json_object_get(paths, p) ||
                      !json_object_get(json_object_get(paths, p), "post"),
                  "%s is in the document", p);
        struct hresp r;
        api(methods[i], p, NULL, &r);
        expect_status(r, status[i], p);
        expect_code(r, "ROUTE_NOT_FOUND", p);
        hresp_free(&r);
        free(p);
    }
    hresp_free(&doc);
    hdone(sb);
}
