/*
 * test_http.c — the HTTP front (docs/http.md) against a private sbxd, with
 * libcurl as the client: canonical routes and REST aliases, the error shape
 * and status map, body limits, Idempotency-Key, raw files, query and
 * percent-encoded path arguments, CORS, API keys.  test_http_sse.c has
 * Server-Sent Events, cancelling, and the OpenAPI document; http_util.h
 * what both share.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"

#include "http_util.h"

/* ---------------------------------------------------------------------------------- */
/* Helpers. */

/* The HTTP address of another daemon (from its http.addr). */
static char *
daemon_http_url(const struct testd *d)
{
    char path[512], *text = NULL;
    size_t n;
    snprintf(path, sizeof(path), "%s/http.addr", d->dir);
    cr_assert_eq(sbx_fs_read(path, 256, &text, &n), 0, "no %s", path);
    text[strcspn(text, "\n")] = 0;
    char *u = hfmt("http://%s", text);
    free(text);
    return u;
}

/* ---------------------------------------------------------------------------------- */
/* Routes. */

Test(http, exec_on_the_canonical_route, .timeout = 120)
{
    char *id = test_id("hexec");
    struct hresp r;
    apif("POST", "{\"command\":\"echo out; echo err >&2; (exit 3)\"}", &r,
         "/v1/sandboxes/%s/exec", id);
    assert_status(r, 200, "POST exec");
    char *ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strncmp(ct, "application/json", 16), "Content-Type %s", ct ? ct : "(none)");
    free(ct);
    cr_expect_eq(jint(r.json, "exitCode"), 3, "exitCode: %s", r.body);
    cr_expect_eq(jbool(r.json, "success"), 0);
    cr_expect_str_eq(jstr(r.json, "stdout"), "out\n");
    cr_expect_str_eq(jstr(r.json, "stderr"), "err\n");
    hresp_free(&r);

    /* An argv, env and cwd as JSON. */
    apif("POST", "{\"argv\":[\"sh\",\"-c\",\"echo $A:$PWD\"],\"env\":{\"A\":\"x y\"},\"cwd\":\"/tmp\"}",
         &r, "/v1/sandboxes/%s/exec", id);
    assert_status(r, 200, "POST exec argv");
    cr_expect_str_eq(jstr(r.json, "stdout"), "x y:/tmp\n");
    hresp_free(&r);

    /* A deployment-wide operation on its canonical route. */
    api("POST", "/v1/list", NULL, &r);
    assert_status(r, 200, "POST /v1/list");
    bool found = false;
    json_t *sb;
    size_t i;
    json_array_foreach(jget(r.json, "sandboxes"), i, sb) found |= !strcmp(jstr(sb, "id"), id);
    cr_expect(found, "list does not show %s: %.300s", id, r.body);
    hresp_free(&r);
    api("GET", "/v1/health", NULL, &r);
    expect_status(r, 200, "GET /v1/health");
    cr_expect_eq(jbool(r.json, "ok"), 1, "health: %s", r.body);
    hresp_free(&r);
    hdone(id);
}

Test(http, rest_aliases, .timeout = 120)
{
    char *id = test_id("halias");
    struct hresp r;
    /* PUT creates, a second PUT finds it. */
    apif("PUT", NULL, &r, "/v1/sandboxes/%s", id);
    assert_status(r, 200, "PUT sandbox");
    cr_expect_eq(jbool(r.json, "created"), 1, "PUT: %s", r.body);
    hresp_free(&r);
    apif("PUT", NULL, &r, "/v1/sandboxes/%s", id);
    expect_status(r, 200, "PUT sandbox again");
    cr_expect_eq(jbool(r.json, "created"), 0, "second PUT: %s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s", id);
    expect_status(r, 200, "GET sandbox");
    cr_expect_str_eq(jstr(r.json, "sandbox.id"), id);
    hresp_free(&r);
    api("GET", "/v1/sandboxes", NULL, &r);
    expect_status(r, 200, "GET /v1/sandboxes");
    cr_expect(strstr(r.body, id) != NULL, "list lacks %s", id);
    hresp_free(&r);
    api("GET", "/v1/cluster", NULL, &r);
    expect_status(r, 200, "GET /v1/cluster");
    cr_expect_eq(json_array_size(jget(r.json, "shards")), 2, "cluster: %.300s", r.body);
    hresp_free(&r);

    /* Processes. */
    apif("POST", "{\"command\":\"echo started; sleep 300\",\"processId\":\"p1\"}", &r,
         "/v1/sandboxes/%s/process.start", id);
    assert_status(r, 200, "process.start");
    hresp_free(&r);
    struct hresp w;
    apif("POST", "{\"processId\":\"p1\",\"pattern\":\"started\",\"timeout\":20000}", &w,
         "/v1/sandboxes/%s/process.waitForLog", id);
    expect_status(w, 200, "waitForLog");
    hresp_free(&w);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes", id);
    expect_status(r, 200, "GET processes");
    cr_expect_str_eq(jstr(r.json, "processes.0.id"), "p1", "processes: %.300s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes/p1", id);
    expect_status(r, 200, "GET processes/p1");
    cr_expect_str_eq(jstr(r.json, "process.status"), "running", "%.300s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes/p1/logs", id);
    expect_status(r, 200, "GET processes/p1/logs");
    cr_expect_str_eq(jstr(r.json, "stdout"), "started\n", "logs: %.300s", r.body);
    hresp_free(&r);
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/processes/p1", id);
    expect_status(r, 200, "DELETE processes/p1");
    cr_expect_str_eq(jstr(r.json, "status"), "killed", "kill: %.300s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes/nope", id);
    expect_status(r, 404, "GET processes/nope");
    expect_code(r, "PROCESS_NOT_FOUND", "GET processes/nope");
    hresp_free(&r);

    /* Sessions. */
    apif("POST", "{\"id\":\"s1\",\"cwd\":\"/tmp\"}", &r, "/v1/sandboxes/%s/session.create", id);
    expect_status(r, 200, "session.create");
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/sessions", id);
    expect_status(r, 200, "GET sessions");
    cr_expect(strstr(r.body, "\"s1\"") != NULL, "sessions: %.300s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/sessions/s1", id);
    expect_status(r, 200, "GET sessions/s1");
    cr_expect_str_eq(jstr(r.json, "session.cwd"), "/tmp", "%.300s", r.body);
    hresp_free(&r);
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/sessions/s1", id);
    expect_status(r, 200, "DELETE sessions/s1");
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/sessions/s1", id);
    expect_status(r, 404, "GET deleted session");
    expect_code(r, "SESSION_NOT_FOUND", "GET deleted session");
    hresp_free(&r);

    /* DELETE …/processes kills them all. */
    apif("POST", "{\"command\":\"sleep 300\",\"processId\":\"p2\"}", &r,
         "/v1/sandboxes/%s/process.start", id);
    expect_status(r, 200, "process.start p2");
    hresp_free(&r);
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/processes", id);
    expect_status(r, 200, "DELETE processes");
    cr_expect_eq(jint(r.json, "killedCount"), 1, "killAll: %.300s", r.body);
    hresp_free(&r);
    /* DELETE …/streams/{streamId} cancels a command's stream (once the command
     * runs: cancel_right_after_start covers a cancel that comes sooner). */
    apif("POST", "{\"command\":\"echo go; sleep 300\"}", &r, "/v1/sandboxes/%s/exec.stream", id);
    expect_status(r, 200, "exec.stream");
    char *sid = sbx_xstrdup(jstr(r.json, "streamId"));
    hresp_free(&r);
    bool started = false;
    long long seen = 0;
    for (int i = 0; i < 10 && !started; i++) {
        char *rd = hfmt("{\"streamId\":\"%s\",\"waitMs\":20000,\"after\":%lld}", sid, seen);
        apif("POST", rd, &r, "/v1/sandboxes/%s/stream.read", id);
        free(rd);
        started = strstr(r.body ? r.body : "", "\"data\":\"go\\n\"") != NULL;
        seen = jint_or(r.json, "next", seen);
        hresp_free(&r);
    }
    cr_expect(started, "the command did not print 'go'");
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/streams/%s", id, sid);
    expect_status(r, 200, "DELETE streams/{id}");
    hresp_free(&r);
    bool cancelled = false, done = false;
    long long after = seen;
    for (int i = 0; i < 10 && !done; i++) {
        char *rd = hfmt("{\"streamId\":\"%s\",\"waitMs\":20000,\"after\":%lld}", sid, after);
        apif("POST", rd, &r, "/v1/sandboxes/%s/stream.read", id);
        free(rd);
        expect_status(r, 200, "stream.read");
        json_t *ev;
        size_t k;
        json_array_foreach(jget(r.json, "events"), k, ev) if (!strcmp(jstr(ev, "type"), "complete"))
            cancelled = jbool(ev, "cancelled") == 1;
        done = jbool(r.json, "done") == 1 || r.status != 200;
        after = jint_or(r.json, "next", after);
        hresp_free(&r);
    }
    cr_expect(cancelled, "the stream was not cancelled by DELETE");
    free(sid);

    /* Contexts and ports (empty lists). */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/contexts", id);
    expect_status(r, 200, "GET contexts");
    cr_expect(json_is_array(jget(r.json, "contexts")), "contexts: %.300s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/ports", id);
    expect_status(r, 200, "GET ports");
    hresp_free(&r);

    /* DELETE destroys; then the sandbox is unknown. */
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s", id);
    expect_status(r, 200, "DELETE sandbox");
    cr_expect_eq(jbool(r.json, "destroyed"), 1, "%.300s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s", id);
    expect_status(r, 404, "GET destroyed sandbox");
    expect_code(r, "SANDBOX_NOT_FOUND", "GET destroyed sandbox");
    hresp_free(&r);
    free(id);
}

/* ---------------------------------------------------------------------------------- */
/* Errors. */

Test(http, error_shape_and_status_map, .timeout = 120)
{
    char *id = test_id("herr");
    struct hresp r;
    apif("POST", "{\"path\":\"/nope/missing.txt\"}", &r, "/v1/sandboxes/%s/file.read", id);
    expect_status(r, 404, "file.read of a missing file");
    char *ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strncmp(ct, "application/json", 16), "error Content-Type %s", ct ? ct : "-");
    free(ct);
    expect_code(r, "FILE_NOT_FOUND", "file.read");
    cr_expect(strlen(jstr(r.json, "message")) > 0, "no message: %s", r.body);
    cr_expect_eq(jint(r.json, "httpStatus"), 404, "httpStatus: %s", r.body);
    cr_expect_str_eq(jstr(r.json, "operation"), "file.read", "operation: %s", r.body);
    cr_expect(json_is_object(jget(r.json, "context")), "context: %s", r.body);
    cr_expect_str_eq(jstr(r.json, "context.path"), "/nope/missing.txt", "context: %s", r.body);
    hresp_free(&r);

    /* Another code, another status: a command that ends its session's shell. */
    apif("POST", "{\"command\":\"echo bye; exit 3\"}", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 410, "exit 3 in a session");
    expect_code(r, "SESSION_TERMINATED", "exit 3");
    cr_expect_eq(jint(r.json, "context.exitCode"), 3, "%s", r.body);
    cr_expect_str_eq(jstr(r.json, "operation"), "exec");
    hresp_free(&r);

    /* Routes that do not exist; a known path with the wrong method. */
    api("GET", "/v1/nothing/here", NULL, &r);
    expect_status(r, 404, "unknown route");
    expect_code(r, "ROUTE_NOT_FOUND", "unknown route");
    cr_expect_eq(jint(r.json, "httpStatus"), 404);
    hresp_free(&r);
    apif("POST", NULL, &r, "/v1/sandboxes/%s/no.such.op", id);
    expect_status(r, 404, "unknown op");
    expect_code(r, "ROUTE_NOT_FOUND", "unknown op");
    hresp_free(&r);
    /* A known path with another method: 405 and the methods it has
     * (RFC 9110 §15.5.6). */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 405, "GET on a POST route");
    expect_code(r, "ROUTE_NOT_FOUND", "GET on a POST route");
    char *allow = hresp_header(&r, "Allow");
    cr_expect(allow && !strcmp(allow, "POST"), "Allow: %s", allow ? allow : "-");
    free(allow);
    hresp_free(&r);
    apif("PATCH", NULL, &r, "/v1/sandboxes/%s", id);
    expect_status(r, 405, "PATCH sandbox");
    allow = hresp_header(&r, "Allow");
    cr_expect(allow && strstr(allow, "PUT") && strstr(allow, "DELETE"), "Allow: %s",
              allow ? allow : "-");
    free(allow);
    hresp_free(&r);
    /* HEAD is served wherever GET is, without a body. */
    api("HEAD", "/v1/health", NULL, &r);
    expect_status(r, 200, "HEAD /v1/health");
    cr_expect_eq(r.len, 0, "HEAD answered a body of %zu bytes", r.len);
    hresp_free(&r);

    /* Bodies that are not an object of arguments. */
    apif("POST", "{\"command\": \"echo\"", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 400, "truncated JSON");
    expect_code(r, "MALFORMED_REQUEST", "truncated JSON");
    hresp_free(&r);
    apif("POST", "not json at all", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 400, "not JSON");
    expect_code(r, "MALFORMED_REQUEST", "not JSON");
    hresp_free(&r);
    apif("POST", "[\"echo hi\"]", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 400, "an array body");
    expect_code(r, "MALFORMED_REQUEST", "an array body");
    hresp_free(&r);
    apif("POST", "\"echo hi\"", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 400, "a string body");
    hresp_free(&r);

    /* Invalid sandbox IDs. */
    api("POST", "/v1/sandboxes/Bad_ID!/exec", "{\"command\":\"true\"}", &r);
    expect_status(r, 400, "bad sandbox ID");
    expect_code(r, "VALIDATION_FAILED", "bad sandbox ID");
    hresp_free(&r);
    api("GET", "/v1/sandboxes/-leading", NULL, &r);
    expect_status(r, 400, "leading '-'");
    expect_code(r, "VALIDATION_FAILED", "leading '-'");
    hresp_free(&r);
    api("GET", "/v1/sandboxes/a%00b", NULL, &r);
    expect_status(r, 400, "NUL escape");
    hresp_free(&r);
    /* A missing argument. */
    apif("POST", "{}", &r, "/v1/sandboxes/%s/exec", id);
    expect_status(r, 400, "exec without command");
    expect_code(r, "VALIDATION_FAILED", "exec without command");
    hresp_free(&r);
    hdone(id);
}

Test(http, body_over_the_limit_is_413, .timeout = 120)
{
    struct testd d;
    static const char *const extra[] = {"--http-max-body", "1K", "--pool", "0", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "cannot start a second sbxd");
    char *base = daemon_http_url(&d);
    char *id = test_id("hlim");
    char *path = hfmt("/v1/sandboxes/%s/status", id);
    /* Exactly 1024 bytes pass the limit (the sandbox is unknown: 404). */
    char big[1026];
    memset(big, ' ', sizeof(big));
    memcpy(big, "{\"x\":\"", 6);
    big[1024 - 2] = '"';
    big[1024 - 1] = '}';
    big[1024] = 0;
    struct hresp r;
    api_at(base, "POST", path, big, &r);
    expect_status(r, 404, "a body of exactly the limit");
    expect_code(r, "SANDBOX_NOT_FOUND", "a body of exactly the limit");
    hresp_free(&r);
    /* One more byte is 413, with Content-Length… */
    memcpy(big, "{\"x\":\"", 6);
    big[1024 - 2] = ' ';
    big[1024 - 1] = '"';
    big[1024] = '}';
    big[1025] = 0;
    api_at(base, "POST", path, big, &r);
    expect_status(r, 413, "limit + 1 bytes");
    expect_code(r, "REQUEST_TOO_LARGE", "limit + 1 bytes");
    cr_expect_eq(jint(r.json, "httpStatus"), 413);
    hresp_free(&r);
    /* …and chunked, where nothing announces the size. */
    char *u = hfmt("%s%s", base, path);
    char *large = sbx_xmalloc(64 * 1024);
    memset(large, ' ', 64 * 1024);
    large[0] = '{';
    large[64 * 1024 - 1] = '}';
    static const char *const ct[] = {"Content-Type: application/json", NULL};
    struct hopts o = {.headers = ct, .body = large, .body_len = 64 * 1024, .chunked = true};
    http_req("POST", u, &o, &r);
    expect_status(r, 413, "64 KiB chunked");
    expect_code(r, "REQUEST_TOO_LARGE", "64 KiB chunked");
    hresp_free(&r);
    /* A raw file PUT is a body too. */
    char *fu = hfmt("%s/v1/sandboxes/%s/files/workspace/big.bin", base, id);
    struct hopts o2 = {.body = large, .body_len = 4096};
    http_req("PUT", fu, &o2, &r);
    expect_status(r, 413, "4 KiB file PUT");
    hresp_free(&r);
    /* The front still serves after refusing. */
    api_at(base, "GET", "/v1/health", NULL, &r);
    expect_status(r, 200, "health after 413s");
    hresp_free(&r);
    free(fu);
    free(large);
    free(u);
    free(path);
    free(id);
    free(base);
    testd_stop(&d);
}

/* ---------------------------------------------------------------------------------- */
/* Headers. */

Test(http, idempotency_key_runs_once, .timeout = 120)
{
    char *id = test_id("hidem");
    char key[64], h1[100];
    snprintf(key, sizeof(key), "k-%d-append", (int)getpid());
    snprintf(h1, sizeof(h1), "Idempotency-Key: %s", key);
    const char *const hdrs[] = {"Content-Type: application/json", h1, NULL};
    const char *cmd = "{\"command\":\"echo x >> /workspace/log; wc -l < /workspace/log; date +%s%N\"}";
    char *u = hfmt("%s/v1/sandboxes/%s/exec", test_http_url(), id);
    struct hopts o = {.headers = hdrs, .body = cmd, .body_len = strlen(cmd)};
    struct hresp a, b;
    http_req("POST", u, &o, &a);
    assert_status(a, 200, "first exec with the key");
    http_req("POST", u, &o, &b);
    assert_status(b, 200, "second exec with the key");
    cr_expect_eq(a.len, b.len);
    cr_expect(a.len == b.len && !memcmp(a.body, b.body, a.len),
              "a retried request got another reply:\n%s\n%s", a.body, b.body);
    cr_expect(!strncmp(jstr(a.json, "stdout"), "1\n", 2), "first: %s", a.body);
    hresp_free(&a);
    hresp_free(&b);
    char *n = hsh(id, "wc -l < /workspace/log");
    cr_expect_str_eq(n, "1\n", "the command ran %s times", n);
    free(n);
    /* Another key runs again. */
    snprintf(h1, sizeof(h1), "Idempotency-Key: %s-2", key);
    http_req("POST", u, &o, &a);
    expect_status(a, 200, "exec with another key");
    cr_expect(!strncmp(jstr(a.json, "stdout"), "2\n", 2), "other key: %s", a.body);
    hresp_free(&a);
    /* X-Sbx-Retry (an earlier attempt had an unknown outcome): a known key
     * gets its recorded reply; outside a cluster no shard took the sandbox
     * over from another, so a key it never saw runs (docs/http.md). */
    char h3[110];
    snprintf(h3, sizeof(h3), "Idempotency-Key: %s-3", key);
    const char *const hdrs3[] = {"Content-Type: application/json", h3, "X-Sbx-Retry: 1", NULL};
    struct hopts o3 = {.headers = hdrs3, .body = cmd, .body_len = strlen(cmd)};
    http_req("POST", u, &o3, &a);
    expect_status(a, 200, "a marked retry of a key the shard never saw");
    cr_expect(!strncmp(jstr(a.json, "stdout"), "3\n", 2), "marked retry: %s", a.body);
    http_req("POST", u, &o3, &b);
    expect_status(b, 200, "a marked retry of a key the shard knows");
    cr_expect(a.len == b.len && !memcmp(a.body, b.body, a.len),
              "a marked retry got another reply:\n%s\n%s", a.body, b.body);
    hresp_free(&a);
    hresp_free(&b);
    const char *const hdrs4[] = {"Content-Type: application/json", h3, "X-Sbx-Retry: yes", NULL};
    struct hopts o4 = {.headers = hdrs4, .body = cmd, .body_len = strlen(cmd)};
    http_req("POST", u, &o4, &a);
    expect_status(a, 400, "X-Sbx-Retry: yes");
    cr_expect_str_eq(jstr(a.json, "code"), "VALIDATION_FAILED");
    hresp_free(&a);
    /* A key over 64 bytes is refused. */
    char longkey[120];
    snprintf(longkey, sizeof(longkey), "Idempotency-Key: %065d", 7);
    const char *const hdrs2[] = {"Content-Type: application/json", longkey, NULL};
    struct hopts o2 = {.headers = hdrs2, .body = cmd, .body_len = strlen(cmd)};
    http_req("POST", u, &o2, &a);
    expect_status(a, 400, "a 65-byte key");
    hresp_free(&a);
    n = hsh(id, "wc -l < /workspace/log");
    cr_expect_str_eq(n, "3\n");
    free(n);
    free(u);
    hdone(id);
}

Test(http, raw_files_round_trip, .timeout = 120)
{
    char *id = test_id("hfile");
    /* Every byte value, then a stretch of pseudo-random bytes. */
    size_t n = 256 + 100000;
    unsigned char *data = sbx_xmalloc(n);
    for (size_t i = 0; i < 256; i++)
        data[i] = (unsigned char)i;
    uint32_t x = 12345;
    for (size_t i = 256; i < n; i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (unsigned char)(x >> 16);
    }
    char *u = hfmt("%s/v1/sandboxes/%s/files/workspace/sub/dir/blob.dat", test_http_url(), id);
    static const char *const oct[] = {"Content-Type: application/octet-stream", NULL};
    struct hopts o = {.headers = oct, .body = data, .body_len = n};
    struct hresp r;
    http_req("PUT", u, &o, &r);
    assert_status(r, 200, "PUT file");
    cr_expect_eq(jint(r.json, "bytesWritten"), (long long)n, "%s", r.body);
    hresp_free(&r);
    http_req("GET", u, NULL, &r);
    assert_status(r, 200, "GET file");
    cr_expect_eq(r.len, n, "got %zu bytes back, wrote %zu", r.len, n);
    cr_expect(r.len == n && !memcmp(r.body, data, n), "the bytes differ");
    char *ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strcmp(ct, "application/octet-stream"), "Content-Type %s", ct ? ct : "-");
    free(ct);
    hresp_free(&r);
    /* The same bytes seen from inside. */
    char *sum = hsh(id, "sha256sum /workspace/sub/dir/blob.dat | cut -c1-64");
    char want[65];
    sha256_hex(data, n, want);
    cr_expect(!strncmp(sum, want, 64), "sha256 inside %s, want %s", sum, want);
    free(sum);
    free(u);

    /* A PNG is served as one; a text file as text; an empty body writes an empty file. */
    u = hfmt("%s/v1/sandboxes/%s/files/workspace/pic", test_http_url(), id);
    static const char png[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR";
    struct hopts op = {.headers = oct, .body = png, .body_len = sizeof(png) - 1};
    http_req("PUT", u, &op, &r);
    expect_status(r, 200, "PUT png");
    hresp_free(&r);
    http_req("GET", u, NULL, &r);
    expect_status(r, 200, "GET png");
    ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strcmp(ct, "image/png"), "png Content-Type %s", ct ? ct : "-");
    free(ct);
    cr_expect_eq(r.len, sizeof(png) - 1);
    hresp_free(&r);
    free(u);
    u = hfmt("%s/v1/sandboxes/%s/files/workspace/empty.txt", test_http_url(), id);
    struct hopts oe = {.headers = oct, .body = "", .body_len = 0};
    http_req("PUT", u, &oe, &r);
    expect_status(r, 200, "PUT empty");
    hresp_free(&r);
    http_req("GET", u, NULL, &r);
    expect_status(r, 200, "GET empty");
    cr_expect_eq(r.len, 0);
    ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strncmp(ct, "text/plain", 10), "txt Content-Type %s", ct ? ct : "-");
    free(ct);
    hresp_free(&r);
    free(u);
    /* Missing → 404 FILE_NOT_FOUND as JSON. */
    u = hfmt("%s/v1/sandboxes/%s/files/workspace/none", test_http_url(), id);
    http_req("GET", u, NULL, &r);
    expect_status(r, 404, "GET missing file");
    expect_code(r, "FILE_NOT_FOUND", "GET missing file");
    hresp_free(&r);
    free(u);
    free(data);
    hdone(id);
}

Test(http, query_parameters_become_arguments, .timeout = 120)
{
    char *id = test_id("hquery");
    free(hsh(id, "mkdir -p '/workspace/a b' && printf q-content > '/workspace/a b/q+1.txt' && "
                 "printf body-content > /workspace/body.txt"));
    struct hresp r;
    /* Percent escapes and '+' as a space in the query string. */
    apif("POST", NULL, &r, "/v1/sandboxes/%s/file.read?path=%%2Fworkspace%%2Fa+b%%2Fq%%2B1.txt", id);
    expect_status(r, 200, "file.read by query");
    cr_expect_str_eq(jstr(r.json, "content"), "q-content", "%s", r.body);
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/sessions?x=1", id);
    expect_status(r, 200, "an unused query argument");
    hresp_free(&r);
    /* The body wins over the query string (docs/http.md). */
    apif("POST", "{\"path\":\"/workspace/body.txt\"}", &r,
         "/v1/sandboxes/%s/file.read?path=/workspace/a%%20b/q%%2B1.txt", id);
    expect_status(r, 200, "body and query");
    cr_expect_str_eq(jstr(r.json, "content"), "body-content",
                     "the query argument won over the body: %s", r.body);
    hresp_free(&r);
    /* A path parameter wins over the query string. */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes/nope?processId=other", id);
    expect_status(r, 404, "path param vs query");
    cr_expect(strstr(jstr(r.json, "message"), "'nope'") != NULL, "%s", r.body);
    hresp_free(&r);
    hdone(id);
}

Test(http, percent_encoded_path_segments, .timeout = 120)
{
    char *id = test_id("hpct");
    /* "/workspace/dir with space/héllo wörld €.txt" */
    const char *enc = "workspace/dir%20with%20space/h%C3%A9llo%20w%C3%B6rld%20%E2%82%AC.txt";
    const char *raw = "/workspace/dir with space/h\xc3\xa9llo w\xc3\xb6rld \xe2\x82\xac.txt";
    char *u = hfmt("%s/v1/sandboxes/%s/files/%s", test_http_url(), id, enc);
    struct hopts o = {.body = "unicode ok\n", .body_len = 11};
    struct hresp r;
    http_req("PUT", u, &o, &r);
    assert_status(r, 200, "PUT encoded path");
    cr_expect_str_eq(jstr(r.json, "path"), raw, "%s", r.body);
    hresp_free(&r);
    char *cmd = hfmt("cat '%s'", raw);
    char *out = hsh(id, cmd);
    cr_expect_str_eq(out, "unicode ok\n");
    free(out);
    free(cmd);
    http_req("GET", u, NULL, &r);
    expect_status(r, 200, "GET encoded path");
    cr_expect_str_eq(r.body, "unicode ok\n");
    hresp_free(&r);
    free(u);
    /* An encoded '/' stays inside its segment: a process ID "a/b" reaches
     * process.get (which refuses the character), not a missing route. */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes/a%%2Fb", id);
    expect_status(r, 400, "encoded slash");
    expect_code(r, "VALIDATION_FAILED", "encoded slash");
    cr_expect_str_eq(jstr(r.json, "operation"), "process.get", "%s", r.body);
    hresp_free(&r);
    /* An encoded character in a process ID arrives decoded. */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/processes/my%%2Eproc", id);
    expect_status(r, 404, "encoded '.'");
    cr_expect(strstr(jstr(r.json, "message"), "'my.proc'") != NULL, "%s", r.body);
    hresp_free(&r);
    /* A malformed escape is a 400, not a crash or a 404. */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/files/workspace/bad%%zz", id);
    expect_status(r, 400, "malformed escape");
    expect_code(r, "VALIDATION_FAILED", "malformed escape");
    hresp_free(&r);
    hdone(id);
}

/*
 * Without API keys (the default, loopback only) the front is not for
 * browsers of other origins: a cross-site request (a form post or fetch
 * from any page the developer has open, or from a sandbox's own preview
 * page on *.localhost) and a request addressed to a non-loopback name (DNS
 * rebinding) are refused with 403 before they reach a sandbox, and no
 * answer carries CORS headers.  Loopback origins and names work.
 */
Test(http, keyless_front_refuses_cross_origin_and_foreign_hosts, .timeout = 60)
{
    char *id = test_id("cors");
    char *u = hfmt("%s/v1/sandboxes/%s/exec", test_http_url(), id);
    static const char *const origins[] = {"Origin: http://example.test",
                                          "Origin: http://8080-some-box-tok.localhost:7780",
                                          "Origin: null", NULL};
    for (int i = 0; origins[i]; i++) {
        const char *h[] = {origins[i], "Content-Type: text/plain", NULL};
        const char *body = "{\"command\":\"echo pwned\"}";
        struct hopts o = {.headers = h, .body = body, .body_len = strlen(body)};
        struct hresp r;
        http_req("POST", u, &o, &r);
        expect_status(r, 403, origins[i]);
        expect_code(r, "PERMISSION_DENIED", origins[i]);
        char *ao = hresp_header(&r, "Access-Control-Allow-Origin");
        cr_expect(ao == NULL, "%s: Allow-Origin %s", origins[i], ao);
        free(ao);
        hresp_free(&r);
        /* …and its preflight gets no CORS grant either. */
        const char *hp[] = {origins[i], "Access-Control-Request-Method: POST", NULL};
        struct hopts op = {.headers = hp};
        http_req("OPTIONS", u, &op, &r);
        ao = hresp_header(&r, "Access-Control-Allow-Origin");
        cr_expect(ao == NULL, "%s: preflight Allow-Origin %s", origins[i], ao);
        free(ao);
        hresp_free(&r);
    }
    static const char *const hosts[] = {"Host: evil.example", "Host: evil.example:7780",
                                        "Host: 8080.localhost.evil.example", NULL};
    for (int i = 0; hosts[i]; i++) {
        const char *h[] = {hosts[i], NULL};
        struct hopts o = {.headers = h};
        struct hresp r;
        char *ul = hfmt("%s/v1/list", test_http_url());
        http_req("GET", ul, &o, &r);
        expect_status(r, 403, hosts[i]);
        hresp_free(&r);
        free(ul);
    }
    /* Loopback origins and names are this machine: served. */
    char *lo = hfmt("Origin: http://localhost:%d", http_port());
    char *lh = hfmt("Host: localhost:%d", http_port());
    const char *ok[][3] = {{lo, "Content-Type: application/json", NULL},
                           {lh, "Content-Type: application/json", NULL},
                           {"Origin: http://127.0.0.1", "Content-Type: application/json", NULL}};
    for (size_t i = 0; i < 3; i++) {
        const char *body = "{\"command\":\"echo fine\"}";
        struct hopts o = {.headers = ok[i], .body = body, .body_len = strlen(body)};
        struct hresp r;
        http_req("POST", u, &o, &r);
        expect_status(r, 200, ok[i][0]);
        cr_expect_str_eq(jstr(r.json, "stdout"), "fine\n", "%s", r.body);
        hresp_free(&r);
    }
    free(lo);
    free(lh);
    free(u);
    hdone(id);
}

/*
 * Files are never pages (issue 16 item 1): a tenant's HTML served by the raw
 * file route is a download (Content-Disposition: attachment), never sniffed
 * (nosniff), and sandboxed if shown anyway (CSP sandbox: opaque origin, no
 * script).  Keyless, a mutating request without X-Sbx-Client is refused
 * before it reaches the sandbox — also from a loopback origin on another
 * port, which the Origin check lets through, and also with no Origin at all
 * (a browser that sends none on a form POST).
 */
Test(http, files_are_downloads_and_keyless_writes_need_a_custom_header, .timeout = 120)
{
    char *id = test_id("hpage");
    char *u = hfmt("%s/v1/sandboxes/%s/files/workspace/p.html", test_http_url(), id);
    static const char page[] = "<!doctype html><script>fetch('/v1/list')</script><p>hi</p>";
    struct hopts o = {.body = page, .body_len = sizeof(page) - 1};
    struct hresp r;
    http_req("PUT", u, &o, &r);
    assert_status(r, 200, "PUT p.html");
    hresp_free(&r);
    for (int head = 0; head < 2; head++) {
        http_req(head ? "HEAD" : "GET", u, NULL, &r);
        expect_status(r, 200, head ? "HEAD p.html" : "GET p.html");
        cr_expect(head || (r.len == sizeof(page) - 1 && !memcmp(r.body, page, r.len)),
                  "the file's bytes changed: %s", r.body);
        char *cd = hresp_header(&r, "Content-Disposition");
        char *ns = hresp_header(&r, "X-Content-Type-Options");
        char *csp = hresp_header(&r, "Content-Security-Policy");
        cr_expect(cd && !strncmp(cd, "attachment", 10), "Content-Disposition %s", cd ? cd : "-");
        cr_expect(ns && !strcasecmp(ns, "nosniff"), "X-Content-Type-Options %s", ns ? ns : "-");
        cr_expect(csp && !strcmp(csp, "sandbox"), "Content-Security-Policy %s", csp ? csp : "-");
        free(cd);
        free(ns);
        free(csp);
        hresp_free(&r);
    }
    /* Mutating calls without X-Sbx-Client: refused, and nothing ran. */
    char *lo = hfmt("Origin: http://localhost:%d", http_port() == 1 ? 2 : 1);
    const char *const bare[][3] = {{"X-Sbx-Client:", "Content-Type: text/plain", NULL},
                                   {"X-Sbx-Client:", lo, NULL},
                                   {"X-Sbx-Client;", "Content-Type: text/plain", NULL}};
    for (size_t i = 0; i < 3; i++) {
        const char *b = "{\"command\":\"touch /workspace/csrf\"}";
        struct hopts ob = {.headers = bare[i], .body = b, .body_len = strlen(b)};
        char *ue = hfmt("%s/v1/sandboxes/%s/exec", test_http_url(), id);
        http_req("POST", ue, &ob, &r);
        expect_status(r, 403, bare[i][1]);
        expect_code(r, "PERMISSION_DENIED", bare[i][1]);
        cr_expect(r.body && strstr(r.body, "X-Sbx-Client"), "the refusal does not say why: %s",
                  r.body);
        hresp_free(&r);
        free(ue);
        struct hopts op = {.headers = bare[i], .body = "x", .body_len = 1};
        http_req("PUT", u, &op, &r);
        expect_status(r, 403, "PUT without X-Sbx-Client");
        hresp_free(&r);
        char *ud = hfmt("%s/v1/sandboxes/%s", test_http_url(), id);
        struct hopts od = {.headers = bare[i]};
        http_req("DELETE", ud, &od, &r);
        expect_status(r, 403, "DELETE without X-Sbx-Client");
        hresp_free(&r);
        free(ud);
    }
    free(lo);
    char *out = hsh(id, "test -e /workspace/csrf && echo ran || echo absent; cat /workspace/p.html");
    cr_expect(!strncmp(out, "absent\n", 7) && !strcmp(out + 7, page),
              "a refused request ran or wrote: %s", out);
    free(out);
    /* Reads need no header (a page can read nothing cross-origin anyway). */
    const char *const get[] = {"X-Sbx-Client:", NULL};
    struct hopts og = {.headers = get};
    http_req("GET", u, &og, &r);
    expect_status(r, 200, "GET without X-Sbx-Client");
    hresp_free(&r);
    free(u);
    hdone(id);
}

/* ---------------------------------------------------------------------------------- */
/* API keys. */

Test(http, api_keys, .timeout = 120)
{
    char keyfile[] = "/tmp/sbx-keys-XXXXXX";
    int fd = mkstemp(keyfile);
    cr_assert(fd >= 0);
    const char *text = "# test keys\nkey-one-0123456789abcdef\n\n  key-two-0123456789abcdef  \n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct testd d;
    const char *const extra[] = {"--api-keys", keyfile, "--pool", "0", NULL};
    /* With keys, nng requests need one too (docs/security.md §6): the
     * harness's readiness check sends the library's $SBX_API_KEY. */
    setenv("SBX_API_KEY", "key-one-0123456789abcdef", 1);
    int started = testd_start(&d, 1, extra);
    unsetenv("SBX_API_KEY");
    cr_assert_eq(started, 0, "cannot start sbxd with --api-keys");
    char *base = daemon_http_url(&d);
    char *u = hfmt("%s/v1/cluster", base);
    struct hresp r;
    /* No key. */
    http_req("GET", u, NULL, &r);
    expect_status(r, 401, "no key");
    expect_code(r, "UNAUTHORIZED", "no key");
    char *wa = hresp_header(&r, "WWW-Authenticate");
    cr_expect(wa && !strncmp(wa, "Bearer", 6), "WWW-Authenticate %s", wa ? wa : "-");
    free(wa);
    hresp_free(&r);
    /* A wrong key; a prefix of a right one; a right one with another scheme. */
    const char *bad[] = {"Authorization: Bearer key-one-0123456789abcdeX",
                         "Authorization: Bearer key-one-0123456789abcde",
                         "Authorization: Bearer key-one-0123456789abcdef0",
                         "Authorization: Basic key-one-0123456789abcdef", NULL};
    for (int i = 0; bad[i]; i++) {
        const char *h[] = {bad[i], NULL};
        struct hopts o = {.headers = h};
        http_req("GET", u, &o, &r);
        expect_status(r, 401, bad[i]);
        hresp_free(&r);
    }
    /* Both keys of the file work. */
    const char *good[] = {"Authorization: Bearer key-one-0123456789abcdef",
                          "Authorization: Bearer key-two-0123456789abcdef", NULL};
    for (int i = 0; good[i]; i++) {
        const char *h[] = {good[i], NULL};
        struct hopts o = {.headers = h};
        http_req("GET", u, &o, &r);
        expect_status(r, 200, good[i]);
        cr_expect(json_is_array(jget(r.json, "shards")), "%.200s", r.body);
        hresp_free(&r);
    }
    /* With keys, any origin may call with a bearer token: preflights and
     * answers (errors too) carry Access-Control-Allow-Origin: *. */
    {
        const char *h[] = {"Origin: http://example.test", "Access-Control-Request-Method: POST",
                           "Access-Control-Request-Headers: content-type, idempotency-key", NULL};
        struct hopts o = {.headers = h};
        http_req("OPTIONS", u, &o, &r);
        cr_expect(r.status == 204 || r.status == 200, "preflight status %ld", r.status);
        char *ao = hresp_header(&r, "Access-Control-Allow-Origin");
        char *am = hresp_header(&r, "Access-Control-Allow-Methods");
        char *ah = hresp_header(&r, "Access-Control-Allow-Headers");
        cr_expect(ao && !strcmp(ao, "*"), "Allow-Origin %s", ao ? ao : "-");
        cr_expect(am && strstr(am, "POST") && strstr(am, "DELETE"), "Allow-Methods %s",
                  am ? am : "-");
        cr_expect(ah && strcasestr(ah, "content-type") && strcasestr(ah, "idempotency-key") &&
                      strcasestr(ah, "authorization") && strcasestr(ah, "last-event-id"),
                  "Allow-Headers %s", ah ? ah : "-");
        free(ao);
        free(am);
        free(ah);
        hresp_free(&r);
        const char *h2[] = {"Origin: http://example.test", good[0], NULL};
        struct hopts o2 = {.headers = h2};
        http_req("GET", u, &o2, &r);
        expect_status(r, 200, "cross-origin with a key");
        ao = hresp_header(&r, "Access-Control-Allow-Origin");
        cr_expect(ao && !strcmp(ao, "*"), "answer Allow-Origin %s", ao ? ao : "-");
        free(ao);
        hresp_free(&r);
        const char *h3[] = {"Origin: http://example.test", NULL};
        struct hopts o3 = {.headers = h3};
        http_req("GET", u, &o3, &r);
        expect_status(r, 401, "cross-origin without a key");
        ao = hresp_header(&r, "Access-Control-Allow-Origin");
        cr_expect(ao && !strcmp(ao, "*"), "error answer Allow-Origin %s", ao ? ao : "-");
        free(ao);
        hresp_free(&r);
    }
    /* A key never works in a URL (issue 16: keys in URLs end up in logs,
     * history and Referer headers); ?access_token= takes only URL tokens
     * (url_tokens_are_bound_to_one_sandbox_one_purpose_and_their_lifetime). */
    char *ut = hfmt("%s?access_token=key-two-0123456789abcdef", u);
    http_req("GET", ut, NULL, &r);
    expect_status(r, 401, "a raw API key in ?access_token=");
    hresp_free(&r);
    free(ut);
    ut = hfmt("%s?access_token=wrong-0123456789abcdef", u);
    http_req("GET", ut, NULL, &r);
    expect_status(r, 401, "wrong access_token");
    hresp_free(&r);
    free(ut);
    /* Sandbox routes and streams are guarded too. */
    char *us = hfmt("%s/v1/sandboxes/some-box/streams/x", base);
    http_req("GET", us, NULL, &r);
    expect_status(r, 401, "stream without a key");
    hresp_free(&r);
    free(us);
    /* The terminal too. */
    us = hfmt("%s/v1/sandboxes/some-box/terminal", base);
    http_req("GET", us, NULL, &r);
    expect_status(r, 401, "terminal without a key");
    hresp_free(&r);
    free(us);
    /* Preview URLs need no key (their token is the credential): a wrong token is
     * INVALID_TOKEN, not UNAUTHORIZED. */
    us = hfmt("http://8080-some-box-sometoken.localhost:%s/", strrchr(base, ':') + 1);
    http_req("GET", us, NULL, &r);
    expect_status(r, 404, "preview URL without a key");
    expect_code(r, "INVALID_TOKEN", "preview URL without a key");
    hresp_free(&r);
    free(us);
    /* health and openapi need no key. */
    char *uh = hfmt("%s/v1/health", base);
    http_req("GET", uh, NULL, &r);
    expect_status(r, 200, "health without a key");
    hresp_free(&r);
    free(uh);
    uh = hfmt("%s/v1/openapi.json", base);
    http_req("GET", uh, NULL, &r);
    expect_status(r, 200, "openapi without a key");
    hresp_free(&r);
    free(uh);
    free(u);
    free(base);
    testd_stop(&d);
    unlink(keyfile);
}

/* URL tokens (issue 16; docs/http.md, "Tokens in URLs"): minted with a key
 * in the header, good for one sandbox and one purpose (terminal, stream,
 * file) for their ttlMs (60 s, or less when asked), never elsewhere; a raw
 * key in the URL is refused. */
Test(http, url_tokens_are_bound_to_one_sandbox_one_purpose_and_their_lifetime, .timeout = 200)
{
    char keyfile[] = "/tmp/sbx-keys-XXXXXX";
    int fd = mkstemp(keyfile);
    cr_assert(fd >= 0);
    const char *text = "key-one-0123456789abcdef\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct testd d;
    const char *const extra[] = {"--api-keys", keyfile, "--pool", "0", NULL};
    /* With keys, nng requests carry one too (docs/security.md §6): the
     * readiness check and the client below send $SBX_API_KEY. */
    setenv("SBX_API_KEY", "key-one-0123456789abcdef", 1);
    int started = testd_start(&d, 1, extra);
    cr_assert_eq(started, 0, "cannot start sbxd with --api-keys");
    char *base = daemon_http_url(&d);
    /* Two sandboxes with a file each (over nng, with the key). */
    sbx_client *c = NULL;
    sbx_error err;
    int opened = sbx_client_open(&c, d.url, &err);
    unsetenv("SBX_API_KEY");
    cr_assert_eq(opened, 0, "%s", err.message);
    char *x = test_id("utx"), *y = test_id("uty");
    const char *ids[] = {x, y};
    for (int i = 0; i < 2; i++) {
        sbx_reply *rep = NULL;
        cr_assert_eq(sbx_call_json(c, "create", ids[i], "{}", 60000, &rep, &err), 0, "create: %s",
                     err.message);
        sbx_reply_free(rep);
        cr_assert_eq(sbx_write_file(c, ids[i], "/workspace/t.txt", ids[i], strlen(ids[i]), &err),
                     0, "write: %s", err.message);
    }
    const char *key[] = {"Authorization: Bearer key-one-0123456789abcdef", NULL};
    struct hopts ok = {.headers = key};
    struct hresp r;
    /* Minting needs the key, and a purpose of the three. */
    char *mu = hfmt("%s/v1/sandboxes/%s/url-token?purpose=file", base, x);
    http_req("POST", mu, NULL, &r);
    expect_status(r, 401, "minting without a key");
    hresp_free(&r);
    char *bad = hfmt("%s/v1/sandboxes/%s/url-token?purpose=exec", base, x);
    http_req("POST", bad, &ok, &r);
    expect_status(r, 400, "minting for an unknown purpose");
    hresp_free(&r);
    free(bad);
    http_req("POST", mu, &ok, &r);
    expect_status(r, 200, "minting a file token");
    char *tok = strdup(jstr(r.json, "token"));
    cr_expect_str_eq(jstr(r.json, "purpose"), "file");
    cr_expect_str_eq(jstr(r.json, "sandbox"), x);
    json_int_t exp = json_integer_value(jget(r.json, "expiresAt"));
    cr_expect(exp > sbx_wall_ms() + 55000 && exp <= sbx_wall_ms() + 60000, "expiresAt %lld",
              (long long)exp);
    cr_expect_eq(json_integer_value(jget(r.json, "ttlMs")), 60000, "the default life");
    cr_expect(!strstr(tok, "key-one"), "the token holds the key: %s", tok);
    hresp_free(&r);
    free(mu);
    mu = hfmt("%s/v1/sandboxes/%s/url-token?purpose=terminal", base, x);
    http_req("POST", mu, &ok, &r);
    expect_status(r, 200, "minting a terminal token");
    char *ttok = strdup(jstr(r.json, "token"));
    hresp_free(&r);
    free(mu);

    /* The file token reads X's file, without any header. */
    char *fx = hfmt("%s/v1/sandboxes/%s/files/workspace/t.txt?access_token=%s", base, x, tok);
    http_req("GET", fx, NULL, &r);
    expect_status(r, 200, "X's file with X's file token");
    cr_expect(r.body && !strcmp(r.body, x), "body %.80s", r.body ? r.body : "");
    hresp_free(&r);
    /* Not Y's file. */
    char *fy = hfmt("%s/v1/sandboxes/%s/files/workspace/t.txt?access_token=%s", base, y, tok);
    http_req("GET", fy, NULL, &r);
    expect_status(r, 401, "Y's file with X's token");
    cr_expect(!r.body || !strstr(r.body, y), "Y's content leaked");
    hresp_free(&r);
    /* Not another purpose of X: its terminal, its streams, its operations. */
    const char *others[] = {"terminal", "streams/abc", "exec", NULL};
    for (int i = 0; others[i]; i++) {
        char *o = hfmt("%s/v1/sandboxes/%s/%s?access_token=%s", base, x, others[i], tok);
        http_req(i == 2 ? "POST" : "GET", o, NULL, &r);
        expect_status(r, 401, others[i]);
        hresp_free(&r);
        free(o);
    }
    /* A terminal token does not read files; nor does a tampered file token. */
    char *ft = hfmt("%s/v1/sandboxes/%s/files/workspace/t.txt?access_token=%s", base, x, ttok);
    http_req("GET", ft, NULL, &r);
    expect_status(r, 401, "X's file with X's terminal token");
    hresp_free(&r);
    free(ft);
    char *forged = strdup(tok);
    char *dot = strchr(forged, '.');
    dot[1] = dot[1] == '9' ? '8' : '9'; /* a later expiry, same MAC */
    ft = hfmt("%s/v1/sandboxes/%s/files/workspace/t.txt?access_token=%s", base, x, forged);
    http_req("GET", ft, NULL, &r);
    expect_status(r, 401, "a token whose expiry was changed");
    hresp_free(&r);
    free(ft);
    free(forged);
    /* A raw key in the URL: refused on every route. */
    char *fk = hfmt("%s/v1/sandboxes/%s/files/workspace/t.txt?access_token=key-one-"
                    "0123456789abcdef",
                    base, x);
    http_req("GET", fk, NULL, &r);
    expect_status(r, 401, "a raw key in the URL");
    hresp_free(&r);
    free(fk);
    /* A shorter life on request, within 1-60 s; after it, the token is
     * refused where it worked, while the 60 s one still opens the file. */
    const char *badttl[] = {"999", "60001", "5s", "", "+2000", "%202000", NULL};
    for (int i = 0; badttl[i]; i++) {
        char *m = hfmt("%s/v1/sandboxes/%s/url-token?purpose=file&ttlMs=%s", base, x, badttl[i]);
        http_req("POST", m, &ok, &r);
        expect_status(r, 400, badttl[i]);
        expect_code(r, "VALIDATION_FAILED", badttl[i]);
        hresp_free(&r);
        free(m);
    }
    const int goodttl[] = {1000, 60000};
    for (int i = 0; i < 2; i++) {
        char *m = hfmt("%s/v1/sandboxes/%s/url-token?purpose=file&ttlMs=%d", base, x, goodttl[i]);
        http_req("POST", m, &ok, &r);
        expect_status(r, 200, "a bound of ttlMs");
        cr_expect_eq(json_integer_value(jget(r.json, "ttlMs")), goodttl[i]);
        hresp_free(&r);
        free(m);
    }
    mu = hfmt("%s/v1/sandboxes/%s/url-token?purpose=file&ttlMs=3000", base, x);
    http_req("POST", mu, &ok, &r);
    expect_status(r, 200, "minting a 3 s file token");
    char *stok = strdup(jstr(r.json, "token"));
    json_int_t sexp = json_integer_value(jget(r.json, "expiresAt"));
    cr_expect_eq(json_integer_value(jget(r.json, "ttlMs")), 3000);
    cr_expect(sexp > sbx_wall_ms() && sexp <= sbx_wall_ms() + 3000, "expiresAt %lld",
              (long long)sexp);
    hresp_free(&r);
    free(mu);
    char *fs = hfmt("%s/v1/sandboxes/%s/files/workspace/t.txt?access_token=%s", base, x, stok);
    http_req("GET", fs, NULL, &r);
    expect_status(r, 200, "X's file with the 3 s token, within its life");
    hresp_free(&r);
    while (sbx_wall_ms() <= sexp + 100)
        usleep(50 * 1000);
    http_req("GET", fs, NULL, &r);
    expect_status(r, 401, "X's file with the 3 s token after its expiry");
    hresp_free(&r);
    http_req("GET", fx, NULL, &r);
    expect_status(r, 200, "X's file with the 60 s token, still in its life");
    hresp_free(&r);
    free(fs);
    free(stok);

    free(fx);
    free(fy);
    free(tok);
    free(ttok);
    for (int i = 0; i < 2; i++) {
        bool gone;
        sbx_destroy(c, ids[i], &gone, &err);
    }
    sbx_client_close(c);
    free(x);
    free(y);
    free(base);
    testd_stop(&d);
    unlink(keyfile);
}

/* Start `sbxd dev` with these arguments and wait (≤ 20 s) for it to exit:
 * returns its exit status, or -1 if it kept running (then it is stopped). */
static int
run_sbxd_expecting_exit(const char *const *args, char *log, size_t loglen)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/tmp/sbx-test-%sXXXXXX", test_prefix());
    cr_assert(mkdtemp(dir));
    char logpath[300], sbxd[512], url[300], name[64];
    snprintf(logpath, sizeof(logpath), "%s/sbxd.log", dir);
    const char *bin = getenv("SBX_BIN");
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin && *bin ? bin : "build/asan/bin");
    snprintf(url, sizeof(url), "ipc://%s/gw.sock", dir);
    snprintf(name, sizeof(name), "t%s", strrchr(dir, '-') + 1);
    for (char *p = name; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
        else if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
            *p = 'x';
    const char *argv[32] = {sbxd, "dev", "--data", dir, "--listen", url, "--name", name,
                            "--shards", "1", "--pool", "0"};
    int n = 12;
    for (int i = 0; args[i] && n < 31; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv(sbxd, (char *const *)argv);
        _exit(127);
    }
    int st = 0, ret = -1;
    double until = test_now_ms() + 20000;
    while (test_now_ms() < until) {
        if (waitpid(pid, &st, WNOHANG) == pid) {
            ret = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
            break;
        }
        usleep(50 * 1000);
    }
    if (ret == -1) {
        kill(pid, SIGTERM);
        waitpid(pid, &st, 0);
    }
    char *text = NULL;
    size_t tl;
    log[0] = 0;
    if (sbx_fs_read(logpath, 1 << 16, &text, &tl) == 0) {
        snprintf(log, loglen, "%s", text);
        free(text);
    }
    sbx_rm_rf(dir);
    return ret;
}

Test(http, non_loopback_without_keys_is_refused, .timeout = 90)
{
    char log[4096];
    static const char *const args[] = {"--http", "0.0.0.0:0", NULL};
    int rc = run_sbxd_expecting_exit(args, log, sizeof(log));
    cr_expect(rc > 0, "sbxd dev --http 0.0.0.0:0 without keys %s (log: %s)",
              rc == -1 ? "kept running" : "exited 0", log);
    cr_expect(strstr(log, "api-keys") || strstr(log, "API key"),
              "the refusal does not say why: %s", log);
    /* A key file with a short key is refused too. */
    char keyfile[] = "/tmp/sbx-keys-XXXXXX";
    int fd = mkstemp(keyfile);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, "short\n", 6), 6);
    close(fd);
    const char *const args2[] = {"--api-keys", keyfile, NULL};
    rc = run_sbxd_expecting_exit(args2, log, sizeof(log));
    cr_expect(rc > 0, "a 5-character API key was accepted (%d; log: %s)", rc, log);
    unlink(keyfile);
}
