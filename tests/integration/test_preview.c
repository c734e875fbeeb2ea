/*
 * test_preview.c — preview URLs (docs/http.md "Preview URLs") end to end:
 * a stdlib web app (tests/support/preview_app.py) runs inside a sandbox,
 * its port is exposed through the HTTP API, and requests go to
 * http://{port}-{id}-{token}.localhost:{http port}/ as a browser would send
 * them: proxied headers, redirects, streamed downloads and uploads,
 * WebSocket pass-through, the error answers (INVALID_TOKEN,
 * INVALID_PORT_NUMBER, PORT_ALREADY_EXPOSED, SERVICE_NOT_RESPONDING,
 * STALE_PREVIEW_URL without waking the sandbox), port.list, and a real
 * headless Chromium loading the app's page and talking WebSocket to it.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"
#include "../support/wsclient.h"

/* ---------------------------------------------------------------------------------- */
/* Helpers. */

/* Write the app into the sandbox (once) and start it on `port`. */
static void
app_start(const char *id, int port)
{
    static char *b64;
    if (!b64) {
        char *text;
        size_t n, bl;
        cr_assert_eq(sbx_fs_read("tests/support/preview_app.py", 1 << 20, &text, &n), 0,
                     "cannot read tests/support/preview_app.py (run from the repository root)");
        b64 = sbx_base64_encode(text, n, &bl);
        free(text);
    }
    struct hresp r;
    json_t *j = json_pack("{s:s,s:s,s:s}", "path", "/workspace/app.py", "content", b64,
                          "encoding", "base64");
    char *body = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    apif("POST", body, &r, "/v1/sandboxes/%s/file.write", id);
    free(body);
    assert_status(r, 200, "file.write app.py");
    hresp_free(&r);
    char *b = hfmt("{\"command\":\"python3 /workspace/app.py %d\",\"processId\":\"app-%d\"}", port,
                   port);
    apif("POST", b, &r, "/v1/sandboxes/%s/process.start", id);
    free(b);
    assert_status(r, 200, "process.start app");
    hresp_free(&r);
    b = hfmt("{\"processId\":\"app-%d\",\"port\":%d,\"path\":\"/headers\",\"timeout\":30000}",
             port, port);
    apif("POST", b, &r, "/v1/sandboxes/%s/process.waitForPort", id);
    free(b);
    assert_status(r, 200, "waitForPort");
    cr_assert_eq(jbool(r.json, "ready"), 1, "the app is not ready: %s", r.body);
    hresp_free(&r);
}

/* A preview URL from port.expose. */
struct purl {
    char url[512];   /* http://{port}-{id}-{token}.localhost:{http}/ */
    char host[300];  /* {port}-{id}-{token}.localhost:{http} */
    char token[64];
};

/* port.expose over HTTP; returns the status (the answer in *r, caller frees). */
static long
expose_raw(const char *id, int port, const char *token, struct hresp *r)
{
    char *b = token ? hfmt("{\"port\":%d,\"token\":\"%s\"}", port, token)
                    : hfmt("{\"port\":%d}", port);
    long st = apif("POST", b, r, "/v1/sandboxes/%s/port.expose", id);
    free(b);
    return st;
}

static struct purl
expose(const char *id, int port, const char *token)
{
    struct hresp r;
    expose_raw(id, port, token, &r);
    assert_status(r, 200, "port.expose");
    struct purl p;
    memset(&p, 0, sizeof(p));
    snprintf(p.url, sizeof(p.url), "%s", jstr(r.json, "url"));
    snprintf(p.token, sizeof(p.token), "%s", jstr(r.json, "token"));
    const char *h = strstr(p.url, "://");
    cr_assert(h, "url %s", p.url);
    h += 3;
    snprintf(p.host, sizeof(p.host), "%.*s", (int)strcspn(h, "/"), h);
    /* The documented shape. */
    char want[512];
    snprintf(want, sizeof(want), "http://%d-%s-%s.localhost:%d/", port, id, p.token, http_port());
    cr_expect_str_eq(p.url, want, "preview URL shape");
    cr_expect_eq(jint(r.json, "port"), port);
    hresp_free(&r);
    return p;
}

/* GET a path under a preview URL. */
static long
pget(const struct purl *p, const char *path, const struct hopts *o, struct hresp *r)
{
    char *u = hfmt("http://%s%s", p->host, path);
    long st = http_req("GET", u, o, r);
    free(u);
    return st;
}

/* A preview URL with another host name part. */
static char *
purl_for(int port, const char *id, const char *token, const char *path)
{
    return hfmt("http://%d-%s-%s.localhost:%d%s", port, id, token, http_port(), path);
}

static json_t *
status_of(const char *id)
{
    struct hresp r;
    apif("GET", NULL, &r, "/v1/sandboxes/%s", id);
    assert_status(r, 200, "status");
    json_t *sb = json_incref(jget(r.json, "sandbox"));
    hresp_free(&r);
    return sb;
}

/* ---------------------------------------------------------------------------------- */

Test(preview, get_headers_redirect, .timeout = 120)
{
    char *id = test_id("pv");
    app_start(id, 8080);
    struct purl p = expose(id, 8080, NULL);
    cr_expect_eq(strlen(p.token), 16, "token '%s'", p.token);
    for (const char *t = p.token; *t; t++)
        cr_expect((*t >= 'a' && *t <= 'z') || (*t >= '0' && *t <= '9') || *t == '_',
                  "token '%s' has '%c'", p.token, *t);
    struct hresp r;
    /* The page. */
    pget(&p, "/", NULL, &r);
    assert_status(r, 200, "GET /");
    cr_expect(strstr(r.body, "new WebSocket") != NULL, "page: %.200s", r.body);
    char *ct = hresp_header(&r, "Content-Type");
    cr_expect(ct && !strcmp(ct, "text/html; charset=utf-8"), "Content-Type %s", ct ? ct : "-");
    free(ct);
    hresp_free(&r);

    /* Headers as the upstream sees them. */
    static const char *const h[] = {"X-Custom: kept",
                                    "Connection: keep-alive, X-Hop-Named",
                                    "X-Hop-Named: must-go",
                                    "Keep-Alive: timeout=5",
                                    "TE: trailers",
                                    "Proxy-Authorization: Basic c2VjcmV0",
                                    "Upgrade: h2c",
                                    "X-Forwarded-For: 6.6.6.6",
                                    NULL};
    struct hopts o = {.headers = h};
    pget(&p, "/headers?a=1&b=two", &o, &r);
    assert_status(r, 200, "GET /headers");
    cr_assert(r.json, "headers: %s", r.body);
    char host[64];
    snprintf(host, sizeof(host), "localhost:8080");
    cr_expect_str_eq(jstr(r.json, "host"), host, "upstream Host");
    cr_expect_str_eq(jstr(r.json, "x-forwarded-for"), "127.0.0.1", "X-Forwarded-For: %s", r.body);
    cr_expect_str_eq(jstr(r.json, "x-forwarded-host"), p.host, "X-Forwarded-Host: %s", r.body);
    cr_expect_str_eq(jstr(r.json, "x-forwarded-proto"), "http", "X-Forwarded-Proto: %s", r.body);
    cr_expect_str_eq(jstr(r.json, "x-custom"), "kept", "an end-to-end header was lost: %s", r.body);
    const char *gone[] = {"x-hop-named", "keep-alive", "te", "proxy-authorization", "upgrade"};
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        cr_expect(!jget(r.json, gone[i]), "hop-by-hop header %s reached the upstream: %s", gone[i],
                  r.body);
    cr_expect(!strstr(jstr(r.json, "connection"), "X-Hop"), "Connection forwarded: %s", r.body);
    hresp_free(&r);

    /* A redirect comes back unfollowed. */
    pget(&p, "/redirect", NULL, &r);
    expect_status(r, 302, "GET /redirect");
    char *loc = hresp_header(&r, "Location");
    cr_expect(loc && !strcmp(loc, "/target"), "Location %s", loc ? loc : "-");
    free(loc);
    cr_expect_str_eq(r.body, "moved\n");
    hresp_free(&r);
    /* The upstream's 404 is passed through as is (not an sbx error). */
    pget(&p, "/no-such-page", NULL, &r);
    expect_status(r, 404, "upstream 404");
    cr_expect_str_eq(r.body, "not found\n");
    hresp_free(&r);
    /* Host names are case-insensitive. */
    char *upper = hfmt("http://%d-%s-%s.LOCALHOST:%d/redirect", 8080, id, p.token, http_port());
    http_req("GET", upper, NULL, &r);
    expect_status(r, 302, "upper-case domain");
    hresp_free(&r);
    free(upper);
    hdone(id);
}

Test(preview, streamed_download_and_uploads, .timeout = 120)
{
    char *id = test_id("pvs");
    app_start(id, 8081);
    struct purl p = expose(id, 8081, NULL);
    struct hresp r;
    /* 5 parts written 200 ms apart arrive as written, not all at the end. */
    pget(&p, "/stream", NULL, &r);
    assert_status(r, 200, "GET /stream");
    for (int i = 0; i < 5; i++) {
        char part[16];
        snprintf(part, sizeof(part), "part %d ", i);
        cr_expect(strstr(r.body, part) != NULL, "missing '%s' in %s", part, r.body);
    }
    cr_expect(r.total_ms - r.first_byte_ms > 500,
              "the body was buffered: first byte at %.0f ms, last at %.0f ms", r.first_byte_ms,
              r.total_ms);
    hresp_free(&r);

    /* 3 MB up, with Content-Length and chunked. */
    size_t n = 3 * 1000 * 1000 + 7;
    unsigned char *data = sbx_xmalloc(n);
    uint32_t x = 99;
    for (size_t i = 0; i < n; i++) {
        x = x * 1664525u + 1013904223u;
        data[i] = (unsigned char)(x >> 24);
    }
    char want[65];
    sha256_hex(data, n, want);
    char *u = hfmt("http://%s/upload", p.host);
    static const char *const oct[] = {"Content-Type: application/octet-stream", NULL};
    for (int chunked = 0; chunked < 2; chunked++) {
        struct hopts o = {.headers = oct, .body = data, .body_len = n, .chunked = chunked};
        http_req("POST", u, &o, &r);
        assert_status(r, 200, chunked ? "chunked upload" : "upload with Content-Length");
        cr_expect_str_eq(jstr(r.json, "sha256"), want, "%s upload: %s",
                         chunked ? "chunked" : "sized", r.body);
        cr_expect_eq(jint(r.json, "bytes"), (long long)n, "%s", r.body);
        hresp_free(&r);
    }
    free(u);
    free(data);
    hdone(id);
}

Test(preview, websocket_echo, .timeout = 120)
{
    char *id = test_id("pvw");
    app_start(id, 8082);
    struct purl p = expose(id, 8082, NULL);
    wsc w;
    char err[256];
    int st = wsc_connect(&w, http_port(), p.host, "/ws", NULL, 20000, err, sizeof(err));
    cr_assert_eq(st, 101, "WebSocket upgrade through the preview URL: %d %s %s", st, err,
                 w.body ? w.body : "");
    cr_expect(wsc_accept_ok(&w), "Sec-WebSocket-Accept is wrong: %s", w.head);
    cr_assert_eq(wsc_send(&w, WS_TEXT, "hello through the proxy", 23), 0);
    char *d;
    size_t len;
    int op = wsc_recv(&w, &d, &len, 10000);
    cr_expect_eq(op, WS_TEXT, "opcode %d", op);
    cr_expect_str_eq(d ? d : "", "hello through the proxy");
    free(d);
    /* 200 KB binary, every byte value. */
    size_t n = 200 * 1024;
    char *bin = sbx_xmalloc(n);
    for (size_t i = 0; i < n; i++)
        bin[i] = (char)(i * 7 + i / 256);
    cr_assert_eq(wsc_send(&w, WS_BINARY, bin, n), 0);
    op = wsc_recv(&w, &d, &len, 20000);
    cr_expect_eq(op, WS_BINARY, "opcode %d", op);
    cr_expect_eq(len, n, "echo of %zu bytes came back as %zu", n, len);
    cr_expect(len == n && !memcmp(d, bin, n), "the binary echo differs");
    free(d);
    /* Several messages in a row keep their order. */
    for (int i = 0; i < 20; i++) {
        char m[32];
        snprintf(m, sizeof(m), "msg-%d", i);
        wsc_send(&w, WS_TEXT, m, strlen(m));
    }
    for (int i = 0; i < 20; i++) {
        char m[32];
        snprintf(m, sizeof(m), "msg-%d", i);
        op = wsc_recv(&w, &d, &len, 10000);
        cr_expect(op == WS_TEXT && d && !strcmp(d, m), "message %d: op %d '%s'", i, op,
                  d ? d : "");
        free(d);
    }
    wsc_send_close(&w);
    op = wsc_recv(&w, &d, &len, 10000);
    cr_expect_eq(op, WS_CLOSE, "no close frame back (%d)", op);
    free(d);
    free(bin);
    wsc_close(&w);
    /* A wrong token refuses the upgrade too. */
    char *bad = hfmt("8082-%s-wrongtoken.localhost:%d", id, http_port());
    st = wsc_connect(&w, http_port(), bad, "/ws", NULL, 20000, err, sizeof(err));
    cr_expect_eq(st, 404, "upgrade with a wrong token: %d %s", st, err);
    wsc_close(&w);
    free(bad);
    hdone(id);
}

Test(preview, refusals, .timeout = 120)
{
    char *id = test_id("pvr");
    app_start(id, 8083);
    struct purl p = expose(id, 8083, NULL);
    struct hresp r;
    /* A wrong token, a port not exposed, an unknown sandbox: the same 404. */
    char *u = purl_for(8083, id, "wrongtoken123456", "/headers");
    http_req("GET", u, NULL, &r);
    expect_status(r, 404, "wrong token");
    expect_code(r, "INVALID_TOKEN", "wrong token");
    char *body_wrong = sbx_xstrdup(r.body ? r.body : "");
    hresp_free(&r);
    free(u);
    u = purl_for(8084, id, p.token, "/headers");
    http_req("GET", u, NULL, &r);
    expect_status(r, 404, "port not exposed");
    expect_code(r, "INVALID_TOKEN", "port not exposed");
    cr_expect_str_eq(r.body, body_wrong, "the answers tell the cases apart");
    hresp_free(&r);
    free(u);
    u = purl_for(8083, "no-such-sandbox", p.token, "/headers");
    http_req("GET", u, NULL, &r);
    expect_status(r, 404, "unknown sandbox");
    expect_code(r, "INVALID_TOKEN", "unknown sandbox");
    cr_expect_str_eq(r.body, body_wrong, "the answers tell the cases apart");
    hresp_free(&r);
    free(u);
    free(body_wrong);

    /* Ports outside 1024-65535. */
    int bad_ports[] = {80, 1023, 0, 70000, -1};
    for (size_t i = 0; i < sizeof(bad_ports) / sizeof(bad_ports[0]); i++) {
        expose_raw(id, bad_ports[i], NULL, &r);
        char what[32];
        snprintf(what, sizeof(what), "expose port %d", bad_ports[i]);
        expect_status(r, 400, what);
        expect_code(r, "INVALID_PORT_NUMBER", what);
        hresp_free(&r);
    }
    expose_raw(id, 1024, NULL, &r);
    expect_status(r, 200, "expose port 1024");
    hresp_free(&r);

    /* Custom tokens: reuse by another port is a conflict; re-expose keeps tokens. */
    struct purl c1 = expose(id, 9001, "my_token_1");
    cr_expect_str_eq(c1.token, "my_token_1");
    expose_raw(id, 9002, "my_token_1", &r);
    expect_status(r, 409, "a custom token used by another port");
    expect_code(r, "PORT_ALREADY_EXPOSED", "token reuse");
    hresp_free(&r);
    expose_raw(id, 9003, "Bad-Token", &r);
    expect_status(r, 400, "a token with bad characters");
    hresp_free(&r);
    expose_raw(id, 9003, "seventeen_chars_x", &r);
    expect_status(r, 400, "a 17-character token");
    hresp_free(&r);
    struct purl again = expose(id, 8083, NULL);
    cr_expect_str_eq(again.token, p.token, "re-exposing changed the token");
    cr_expect_str_eq(again.url, p.url);
    pget(&again, "/redirect", NULL, &r);
    expect_status(r, 302, "GET after re-expose");
    hresp_free(&r);

    /* Nothing listens on 9001 (exposed): 502. */
    struct hresp q;
    pget(&c1, "/", NULL, &q);
    expect_status(q, 502, "nothing listening");
    expect_code(q, "SERVICE_NOT_RESPONDING", "nothing listening");
    hresp_free(&q);

    /* port.list: the active URLs. */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/ports", id);
    assert_status(r, 200, "GET ports");
    json_t *ports = jget(r.json, "ports");
    cr_expect_eq(json_array_size(ports), 3, "ports: %s", r.body);
    bool seen = false;
    json_t *e;
    size_t i;
    json_array_foreach(ports, i, e)
    {
        if (jint(e, "port") == 8083) {
            seen = true;
            cr_expect_str_eq(jstr(e, "url"), p.url);
        }
    }
    cr_expect(seen, "8083 not listed: %s", r.body);
    hresp_free(&r);

    /* Unexpose: the URL is refused at once, and no longer listed. */
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/ports/8083", id);
    expect_status(r, 200, "DELETE ports/8083");
    hresp_free(&r);
    pget(&p, "/headers", NULL, &r);
    expect_status(r, 404, "after unexpose");
    expect_code(r, "INVALID_TOKEN", "after unexpose");
    hresp_free(&r);
    apif("POST", "{\"port\":9001}", &r, "/v1/sandboxes/%s/port.unexpose", id);
    expect_status(r, 200, "port.unexpose 9001");
    hresp_free(&r);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/ports", id);
    cr_expect_eq(json_array_size(jget(r.json, "ports")), 1, "ports after unexpose: %s", r.body);
    cr_expect_eq(jint(r.json, "ports.0.port"), 1024, "%s", r.body);
    hresp_free(&r);
    /* Exposing again after unexpose gives a working URL. */
    struct purl p2 = expose(id, 8083, NULL);
    pget(&p2, "/redirect", NULL, &r);
    expect_status(r, 302, "after expose again");
    hresp_free(&r);
    hdone(id);
}

/* Issue 19: port 3000 is an ordinary port (sbx has no control plane in the
 * sandbox: docs/protocol.md §7); a hostname under a --no-preview-host
 * suffix (default workers.dev) is CUSTOM_DOMAIN_REQUIRED (400), as the SDK. */
Test(preview, port_3000_is_exposable_and_workers_dev_needs_a_custom_domain, .timeout = 120)
{
    char *id = test_id("pvcd");
    struct hresp r;
    expose_raw(id, 3000, NULL, &r);
    expect_status(r, 200, "port.expose 3000");
    cr_expect_eq(jint(r.json, "port"), 3000);
    hresp_free(&r);
    static const char *const refused[] = {"x.workers.dev", "A.B.Workers.Dev", "workers.dev",
                                          "x.workers.dev:8443"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(refused); i++) {
        char *b = hfmt("{\"port\":9005,\"hostname\":\"%s\"}", refused[i]);
        apif("POST", b, &r, "/v1/sandboxes/%s/port.expose", id);
        free(b);
        expect_status(r, 400, refused[i]);
        expect_code(r, "CUSTOM_DOMAIN_REQUIRED", refused[i]);
        cr_expect(r.body && strstr(r.body, "custom domain"), "%s: %s", refused[i],
                  r.body ? r.body : "");
        hresp_free(&r);
    }
    /* Only the suffix at a label boundary: myworkers.dev is someone's domain. */
    char *b = hfmt("{\"port\":9006,\"hostname\":\"myworkers.dev\"}");
    apif("POST", b, &r, "/v1/sandboxes/%s/port.expose", id);
    free(b);
    expect_status(r, 200, "myworkers.dev");
    cr_expect(strstr(jstr(r.json, "url"), ".myworkers.dev/") != NULL, "url %s", jstr(r.json, "url"));
    hresp_free(&r);
    /* The refused ones left nothing exposed. */
    apif("GET", NULL, &r, "/v1/sandboxes/%s/ports", id);
    expect_status(r, 200, "ports");
    json_t *ports = json_object_get(r.json, "ports");
    cr_expect_eq(json_array_size(ports), 2, "ports: %s", r.body);
    hresp_free(&r);
    hdone(id);
}

/* A sandbox exposes at most 256 ports at once: the 257th is refused, a
 * re-expose of one it has is not, and unexposing one makes room. */
Test(preview, exposed_ports_are_capped, .timeout = 180)
{
    char *id = test_id("pvcap");
    struct hresp r;
    for (int k = 0; k < 256; k++) {
        expose_raw(id, 20000 + k, NULL, &r);
        if (r.status != 200)
            cr_assert_fail("expose port %d: HTTP %ld %s", 20000 + k, r.status, r.body);
        hresp_free(&r);
    }
    expose_raw(id, 30000, NULL, &r);
    expect_status(r, 400, "the 257th port");
    expect_code(r, "VALIDATION_FAILED", "the 257th port");
    hresp_free(&r);
    expose_raw(id, 20007, NULL, &r);
    expect_status(r, 200, "re-exposing one of the 256");
    hresp_free(&r);
    apif("DELETE", NULL, &r, "/v1/sandboxes/%s/ports/20000", id);
    expect_status(r, 200, "DELETE ports/20000");
    hresp_free(&r);
    expose_raw(id, 30000, NULL, &r);
    expect_status(r, 200, "a port after one was unexposed");
    hresp_free(&r);
    hdone(id);
}

/* Send `req` as it is over TCP to the HTTP front; the whole answer (heap),
 * read until the server closes or 10 s pass. */
static char *
raw_http(const char *req)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)http_port())};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof(a)), 0, "connect");
    struct timeval tv = {10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    cr_assert_eq(sbx_write_full(fd, req, strlen(req)), 0);
    sbx_buf b;
    sbx_buf_init(&b);
    char chunk[4096];
    ssize_t n;
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        sbx_buf_append(&b, chunk, (size_t)n);
    close(fd);
    sbx_buf_append(&b, "", 1);
    return b.p;
}

/*
 * A preview request's target must be a path.  The gateway builds the
 * upstream URL as http://<generation>.<sandbox>:<port><target>, so a target
 * "@5.other-sandbox:8080/x" (which libmicrohttpd passes on) would make the
 * first part a user name and aim the relay at another sandbox's exposed
 * port without its token; an absolute-form target would do the same.  Both
 * are 400 before anything is relayed; the same request with a path works.
 */
Test(preview, a_target_that_is_not_a_path_cannot_reach_another_sandbox, .timeout = 120)
{
    char *victim = test_id("pvv"), *attacker = test_id("pva");
    app_start(victim, 8086);
    struct purl pv = expose(victim, 8086, NULL);
    app_start(attacker, 8087);
    struct purl pa = expose(attacker, 8087, NULL);
    (void)pv;
    json_t *st = status_of(victim);
    long long gen = jint(st, "generation");
    json_decref(st);
    char req[1024];
    snprintf(req, sizeof(req), "GET /headers HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
             pa.host);
    char *ok = raw_http(req);
    cr_expect(!strncmp(ok, "HTTP/1.1 200", 12), "the control request: %.200s", ok);
    free(ok);
    const char *targets[] = {"@%lld.%s:8086/headers", "http://%lld.%s:8086/headers",
                             "//%lld.%s:8086/headers"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(targets); i++) {
        char target[300];
        snprintf(target, sizeof(target), targets[i], gen, victim);
        snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n",
                 target, pa.host);
        char *ans = raw_http(req);
        cr_expect(!strncmp(ans, "HTTP/1.1 400", 12) || !strncmp(ans, "HTTP/1.1 404", 12),
                  "target %s: %.300s", target, ans);
        cr_expect(strstr(ans, "8086") == NULL || strstr(ans, "VALIDATION_FAILED") ||
                      strstr(ans, "ROUTE_NOT_FOUND") || strstr(ans, "INVALID_TOKEN"),
                  "target %s reached something: %.300s", target, ans);
        free(ans);
    }
    hdone(victim);
    hdone(attacker);
}

Test(preview, stale_url_does_not_wake_the_sandbox, .timeout = 120)
{
    char *id = test_id("pvst");
    app_start(id, 8085);
    struct purl p = expose(id, 8085, NULL);
    struct hresp r;
    pget(&p, "/redirect", NULL, &r);
    expect_status(r, 302, "before the restart");
    hresp_free(&r);
    json_t *st = status_of(id);
    long long pid = jint(st, "container.pid");
    long long gen = jint(st, "generation");
    json_decref(st);
    cr_assert_gt(pid, 1, "no container pid");
    /* The agent dies (the container ends unexpectedly). */
    cr_assert_eq(kill((pid_t)pid, SIGKILL), 0, "kill %lld", pid);
    const char *state = "";
    for (int i = 0; i < 200; i++) {
        st = status_of(id);
        state = strcmp(jstr(st, "state"), "stopped") ? "other" : "stopped";
        json_decref(st);
        if (!strcmp(state, "stopped"))
            break;
        tsleep_ms(50);
    }
    cr_assert_str_eq(state, "stopped", "the sandbox did not stop after its agent died");
    pget(&p, "/redirect", NULL, &r);
    expect_status(r, 410, "a URL of a dead container");
    expect_code(r, "STALE_PREVIEW_URL", "stale");
    hresp_free(&r);
    /* A WebSocket to it likewise. */
    wsc w;
    char err[256];
    int ws = wsc_connect(&w, http_port(), p.host, "/ws", NULL, 20000, err, sizeof(err));
    cr_expect_eq(ws, 410, "WebSocket to a stale URL: %d %s", ws, err);
    wsc_close(&w);
    /* Not woken. */
    tsleep_ms(300);
    st = status_of(id);
    cr_expect_str_eq(jstr(st, "state"), "stopped", "a stale preview URL woke the sandbox");
    cr_expect_eq(jint(st, "generation"), gen, "a new container was started");
    json_decref(st);
    apif("GET", NULL, &r, "/v1/sandboxes/%s/ports", id);
    expect_status(r, 200, "ports of a stopped sandbox");
    cr_expect_eq(json_array_size(jget(r.json, "ports")), 0, "inactive URLs listed: %s", r.body);
    hresp_free(&r);
    /* Re-expose: same token, the new container. */
    struct purl p2 = expose(id, 8085, NULL);
    cr_expect_str_eq(p2.url, p.url, "re-expose after a restart changed the URL");
    app_start(id, 8085);
    pget(&p2, "/redirect", NULL, &r);
    expect_status(r, 302, "after re-expose");
    hresp_free(&r);
    st = status_of(id);
    cr_expect_gt(jint(st, "generation"), gen);
    json_decref(st);
    hdone(id);
}

/*
 * Preview cookies are host-only (issue 16 item 5): all preview hosts are
 * names under one domain, so an upstream's `Set-Cookie: …; Domain=localhost`
 * would hand one sandbox's cookie to every other preview.  The front drops
 * Domain (any case and spacing) and keeps the rest.
 */
Test(preview, preview_cookies_are_host_only, .timeout = 120)
{
    char *id = test_id("pvck");
    app_start(id, 8087);
    struct purl p = expose(id, 8087, NULL);
    struct hresp r;
    pget(&p, "/cookie", NULL, &r);
    assert_status(r, 200, "GET /cookie");
    /* The Set-Cookie lines of the head, in order. */
    char got[3][256];
    int n = 0;
    for (const char *l = r.head; l && *l;) {
        size_t len = strcspn(l, "\r\n");
        if (len > 11 && !strncasecmp(l, "Set-Cookie:", 11) && n < 3) {
            const char *v = l + 11;
            while (*v == ' ')
                v++;
            snprintf(got[n++], sizeof(got[0]), "%.*s", (int)(len - (size_t)(v - l)), v);
        }
        l += len;
        l += strspn(l, "\r\n");
    }
    cr_assert_eq(n, 3, "Set-Cookie lines: %d in %s", n, r.head);
    static const char *const want[] = {"a=1; Path=/", "b=2;path=/;HttpOnly", "c=3; SameSite=Lax"};
    for (int i = 0; i < 3; i++) {
        cr_expect_str_eq(got[i], want[i], "cookie %d", i);
        cr_expect(!strcasestr(got[i], "domain"), "a Domain attribute passed: %s", got[i]);
    }
    hresp_free(&r);
    hdone(id);
}

/* ---------------------------------------------------------------------------------- */
/* A real browser. */

static const char *
chromium_path(void)
{
    static const char *const c[] = {"/usr/bin/chromium", "/usr/bin/chromium-browser",
                                    "/usr/bin/google-chrome", NULL};
    for (int i = 0; c[i]; i++)
        if (access(c[i], X_OK) == 0)
            return c[i];
    return NULL;
}

Test(preview, chromium_loads_the_page_and_its_websocket, .timeout = 180)
{
    const char *chrome = chromium_path();
    cr_assert(chrome, "chromium is not installed: run tools/deps.sh (Debian package chromium)");
    char *id = test_id("pvc");
    app_start(id, 8086);
    struct purl p = expose(id, 8086, NULL);
    char profile[] = "/tmp/sbx-chromium-XXXXXX";
    cr_assert(mkdtemp(profile));
    char out[] = "/tmp/sbx-chromium-out-XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    char *dom = NULL;
    size_t n = 0;
    /* Two tries (the first start of a browser on a loaded host can be slow),
     * the second with the old headless mode should the new one misbehave. */
    for (int attempt = 0; attempt < 2; attempt++) {
        char *cmd = hfmt("timeout -k 5 60 %s %s --no-sandbox --disable-gpu "
                         "--no-first-run --no-proxy-server --disable-extensions "
                         "--user-data-dir=%s --virtual-time-budget=8000 --dump-dom '%s' "
                         ">%s 2>%s.err",
                         chrome, attempt ? "--headless=old" : "--headless", profile, p.url,
                         out, out);
        int rc = system(cmd);
        free(cmd);
        free(dom);
        dom = NULL;
        sbx_fs_read(out, 1 << 20, &dom, &n);
        if (rc == 0 && dom && strstr(dom, "echo-ok:"))
            break;
    }
    char *errlog = NULL;
    size_t en;
    char errpath[64];
    snprintf(errpath, sizeof(errpath), "%s.err", out);
    sbx_fs_read(errpath, 1 << 16, &errlog, &en);
    cr_expect(dom && strstr(dom, "<div id=\"echo\">echo-ok:ping-"),
              "the page did not get its WebSocket echo through the preview URL %s;\nDOM: %.600s\n"
              "chromium stderr: %.1500s",
              p.url, dom ? dom : "(none)", errlog ? errlog : "");
    free(errlog);
    free(dom);
    unlink(out);
    unlink(errpath);
    sbx_rm_rf(profile);
    hdone(id);
}

/* One headless Chromium run, ended after secs seconds at most: the DOM of
 * `url` (no single quote in it) after its scripts ran (heap, "" when the
 * browser showed no page, e.g. for a download); *err_out: its stderr (heap). */
static char *
chromium_dom(const char *chrome, const char *url, int secs, char **err_out)
{
    char profile[] = "/tmp/sbx-chromium-XXXXXX";
    cr_assert(mkdtemp(profile));
    char out[] = "/tmp/sbx-chromium-out-XXXXXX";
    int fd = mkstemp(out);
    cr_assert(fd >= 0);
    close(fd);
    char *cmd = hfmt("timeout -k 5 %d %s --headless --no-sandbox --disable-gpu --no-first-run "
                     "--no-proxy-server --disable-extensions --user-data-dir=%s "
                     "--virtual-time-budget=8000 --dump-dom '%s' >%s 2>%s.err",
                     secs, chrome, profile, url, out, out);
    int rc = system(cmd);
    (void)rc;
    free(cmd);
    char *dom = NULL, *errlog = NULL;
    size_t n;
    sbx_fs_read(out, 1 << 20, &dom, &n);
    char errpath[64];
    snprintf(errpath, sizeof(errpath), "%s.err", out);
    sbx_fs_read(errpath, 1 << 16, &errlog, &n);
    unlink(out);
    unlink(errpath);
    sbx_rm_rf(profile);
    *err_out = errlog ? errlog : sbx_xstrdup("");
    return dom ? dom : sbx_xstrdup("");
}

/*
 * Files are never pages (issue 16 item 1), in a real browser: a sandbox's
 * HTML whose script calls the API from the page's own origin (same-origin,
 * so it may send any header) is opened from the raw file route.  The page
 * must not run against the API: the command it posts never runs.  The
 * control: the same browser runs a page's script when it is a page.
 */
Test(preview, a_file_served_by_the_api_cannot_script_the_api, .timeout = 240)
{
    const char *chrome = chromium_path();
    cr_assert(chrome, "chromium is not installed: run tools/deps.sh (Debian package chromium)");
    char *err = NULL;
    char *dom = chromium_dom(chrome, /* the control: a page, which ends at once */
                             "data:text/html,<div id=r>x</div><script>document.getElementById("
                             "\"r\").textContent=\"js-\"+\"ok\"</script>",
                             60, &err);
    cr_assert(strstr(dom, "js-ok"), "control: chromium ran no script: DOM %.300s\nstderr %.1500s",
              dom, err);
    free(dom);
    free(err);

    char *id = test_id("pvfile");
    char *page = hfmt(
        "<!doctype html><div id=r>start</div><script>"
        "fetch('/v1/sandboxes/%s/exec',{method:'POST',headers:{'X-Sbx-Client':'page',"
        "'Content-Type':'application/json'},body:JSON.stringify({command:"
        "'touch /workspace/pwned'})}).then(r=>r.text()).then(t=>{document.getElementById("
        "'r').textContent='fetched:'+t}).catch(e=>{document.getElementById('r').textContent="
        "'blocked:'+e})</script>",
        id);
    char *u = hfmt("%s/v1/sandboxes/%s/files/workspace/p.html", test_http_url(), id);
    struct hopts o = {.body = page, .body_len = strlen(page)};
    struct hresp r;
    http_req("PUT", u, &o, &r);
    assert_status(r, 200, "PUT p.html");
    hresp_free(&r);
    /* The route answers a download, where headless chromium may never
     * exit: 20 s leave a script that would run many times the second or
     * two it needs (a page's fetch starts at its load). */
    dom = chromium_dom(chrome, u, 20, &err);
    struct hresp x;
    apif("POST", "{\"command\":\"test -e /workspace/pwned && echo ran || echo absent\"}", &x,
         "/v1/sandboxes/%s/exec", id);
    assert_status(x, 200, "exec test -e");
    cr_expect_str_eq(jstr(x.json, "stdout"), "absent\n",
                     "the page served by the file route called the API: DOM %.400s", dom);
    cr_expect(!strstr(dom, "fetched:"), "the page's script ran and fetched: %.400s", dom);
    hresp_free(&x);
    free(dom);
    free(err);
    free(page);
    free(u);
    hdone(id);
}
