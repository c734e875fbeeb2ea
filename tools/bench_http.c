/*
 * sbx-bench-http — the HTTP front against the nng path, in one run.
 *
 *   sbx-bench-http [--runs N]
 *
 * Starts a private `sbxd dev` with its HTTP front on a free port (sbxd from
 * $SBX_BIN, else next to this executable) and measures, on one running
 * sandbox, from the client (CLOCK_MONOTONIC, milliseconds):
 *
 *   exec over nng        sbx_exec `true` in the default session (the C client
 *                        library, msgpack over nng to the gateway)
 *   exec over HTTP       POST /v1/sandboxes/{id}/exec {"command":"true"} with
 *                        libcurl on one kept-alive connection (JSON both ways)
 *   SSE first event      POST …/exec.stream with Accept: text/event-stream for
 *                        `echo hi`: from sending the request to the first
 *                        `event:` line of the response (the stream's start)
 *   SSE first output     … to the first `event: stdout` (the command ran)
 *   MCP exec over HTTP   POST /mcp tools/call of the `exec` tool {"sandbox": id,
 *                        "command": "true"} in one MCP session (streamable
 *                        HTTP, docs/mcp.md), answered as application/json, on
 *                        one kept-alive connection; the answer is checked to
 *                        be a tool result without isError.  Each is followed
 *                        by the same exec over nng, so that both see the same
 *                        load: "MCP minus nng, per pair" is the overhead
 *                        (issue 17's floor: p50 ≤ 2 ms)
 *
 * N runs each (default 1000; the SSE ones N/4) after 50 warm-up runs.
 */
#include <curl/curl.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "../include/sbx/sbx.h"
#include "../runtime/util.h"
#include "../tests/support/harness.h"
#include "stats.h"

static size_t
sink(char *p, size_t s, size_t n, void *arg)
{
    (void)p;
    (void)arg;
    return s * n;
}

struct sse {
    double t0, first_event, first_stdout;
    sbx_buf b;
};

static size_t
sse_data(char *p, size_t s, size_t n, void *arg)
{
    struct sse *x = arg;
    sbx_buf_append(&x->b, p, s * n);
    if (!x->first_event && memmem(x->b.p, x->b.len, "event:", 6))
        x->first_event = sbx_stats_now_ms() - x->t0;
    if (!x->first_stdout && memmem(x->b.p, x->b.len, "event: stdout", 13))
        x->first_stdout = sbx_stats_now_ms() - x->t0;
    return s * n;
}

/* The MCP session ID from initialize's response headers. */
static size_t
mcp_header(char *p, size_t s, size_t n, void *arg)
{
    char *sid = arg;
    size_t len = s * n;
    if (len > 15 && !strncasecmp(p, "Mcp-Session-Id:", 15)) {
        const char *v = p + 15;
        while (*v == ' ')
            v++;
        size_t k = strcspn(v, "\r\n");
        snprintf(sid, 64, "%.*s", (int)SBX_MIN(k, 63), v);
    }
    return len;
}

static size_t
keep(char *p, size_t s, size_t n, void *arg)
{
    sbx_buf_append(arg, p, s * n);
    return s * n;
}

/* MCP exec round trips over streamable HTTP into ms[runs] (after 50 warm-up
 * ones), each followed by the same exec over nng into nng[runs] (so the two
 * see the same load: the paired difference is the MCP overhead); 0, or -1
 * with the reason printed. */
static int
mcp_runs(CURL *cu, const char *base, const char *id, sbx_client *c, double *ms, double *nng,
         int runs)
{
    char url[256], sid[64] = "", hsid[96], body[256];
    snprintf(url, sizeof(url), "%s/mcp", base);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "Accept: application/json, text/event-stream");
    sbx_buf b;
    sbx_buf_init(&b);
    int rc = -1;
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, keep);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(cu, CURLOPT_HEADERFUNCTION, mcp_header);
    curl_easy_setopt(cu, CURLOPT_HEADERDATA, (void *)sid);
    curl_easy_setopt(cu, CURLOPT_POSTFIELDS,
                     "{\"jsonrpc\":\"2.0\",\"id\":0,\"method\":\"initialize\",\"params\":{"
                     "\"protocolVersion\":\"2025-06-18\",\"capabilities\":{},\"clientInfo\":{"
                     "\"name\":\"sbx-bench-http\",\"version\":\"1\"}}}");
    if (curl_easy_perform(cu) != CURLE_OK || !sid[0]) {
        fprintf(stderr, "sbx-bench-http: MCP initialize failed\n");
        goto out;
    }
    snprintf(hsid, sizeof(hsid), "Mcp-Session-Id: %s", sid);
    h = curl_slist_append(h, hsid);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    for (int i = 0; i < 50 + runs; i++) {
        snprintf(body, sizeof(body),
                 "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"tools/call\",\"params\":{"
                 "\"name\":\"exec\",\"arguments\":{\"sandbox\":\"%s\",\"command\":\"true\"}}}",
                 i + 1, id);
        curl_easy_setopt(cu, CURLOPT_POSTFIELDS, body);
        b.len = 0;
        double t0 = sbx_stats_now_ms();
        long status = 0;
        if (curl_easy_perform(cu) != CURLE_OK ||
            (curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status), status != 200) ||
            !memmem(b.p, b.len, "\"isError\":false", sizeof("\"isError\":false") - 1)) {
            fprintf(stderr, "sbx-bench-http: MCP exec failed (status %ld): %.*s\n", status,
                    (int)SBX_MIN(b.len, 300), b.p ? b.p : "");
            goto out;
        }
        double t1 = sbx_stats_now_ms();
        sbx_exec_opts o = {.command = "true"};
        sbx_exec_result r;
        sbx_error err;
        if (sbx_exec(c, id, &o, &r, &err) != 0) {
            fprintf(stderr, "sbx-bench-http: exec: %s %s\n", err.code, err.message);
            sbx_error_free(&err);
            goto out;
        }
        sbx_exec_result_free(&r);
        if (i >= 50) {
            ms[i - 50] = t1 - t0;
            nng[i - 50] = sbx_stats_now_ms() - t1;
        }
    }
    rc = 0;
out:
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, NULL);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, NULL);
    curl_easy_setopt(cu, CURLOPT_HEADERFUNCTION, NULL); /* both: else headers go to WRITEFUNCTION */
    curl_easy_setopt(cu, CURLOPT_HEADERDATA, NULL);
    curl_slist_free_all(h);
    sbx_buf_free(&b);
    return rc;
}

int
main(int argc, char **argv)
{
    int runs = 1000;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: sbx-bench-http [--runs N]\n");
            return 2;
        }
    }
    if (runs < 4)
        runs = 4;
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[sl > 0 ? sl : 0] = 0;
    if (!getenv("SBX_BIN"))
        setenv("SBX_BIN", dirname(self), 1);
    struct testd d;
    static const char *const extra[] = {"--pool", "1", NULL}; /* the harness adds --http 127.0.0.1:0 */
    if (testd_start(&d, 1, extra) != 0) {
        fprintf(stderr, "sbx-bench-http: cannot start sbxd (root needed)\n");
        return 1;
    }
    setenv("SBX_TEST_DIR", d.dir, 1);
    const char *base = test_http_url();
    int rc = 1;
    sbx_client *c = NULL;
    sbx_error err;
    CURL *cu = curl_easy_init();
    if (sbx_client_open(&c, d.url, &err) != 0 || !cu)
        goto out;
    char id[64];
    snprintf(id, sizeof(id), "bench-http-%d", (int)getpid());
    sbx_exec_opts o = {.command = "true"};
    sbx_exec_result r;
    double *nng = sbx_xcalloc((size_t)runs, sizeof(double));
    double *http = sbx_xcalloc((size_t)runs, sizeof(double));
    int ns = runs / 4;
    double *ev = sbx_xcalloc((size_t)ns, sizeof(double));
    double *out = sbx_xcalloc((size_t)ns, sizeof(double));
    double *mcp = sbx_xcalloc((size_t)runs, sizeof(double));
    double *nng2 = sbx_xcalloc((size_t)runs, sizeof(double));
    double *pair = sbx_xcalloc((size_t)runs, sizeof(double));
    for (int i = 0; i < 50 + runs; i++) {
        double t0 = sbx_stats_now_ms();
        if (sbx_exec(c, id, &o, &r, &err) != 0) {
            fprintf(stderr, "sbx-bench-http: exec: %s %s\n", err.code, err.message);
            goto out;
        }
        if (i >= 50)
            nng[i - 50] = sbx_stats_now_ms() - t0;
        sbx_exec_result_free(&r);
    }
    char url[256];
    snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec", base, id);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    h = curl_slist_append(h, "X-Sbx-Client: sbx-bench-http"); /* keyless front, docs/http.md */
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(cu, CURLOPT_TCP_NODELAY, 1L);
    for (int i = 0; i < 50 + runs; i++) {
        curl_easy_setopt(cu, CURLOPT_URL, url);
        curl_easy_setopt(cu, CURLOPT_POSTFIELDS, "{\"command\":\"true\"}");
        double t0 = sbx_stats_now_ms();
        long status = 0;
        if (curl_easy_perform(cu) != CURLE_OK ||
            (curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status), status != 200)) {
            fprintf(stderr, "sbx-bench-http: HTTP exec failed (status %ld)\n", status);
            goto out;
        }
        if (i >= 50)
            http[i - 50] = sbx_stats_now_ms() - t0;
    }
    snprintf(url, sizeof(url), "%s/v1/sandboxes/%s/exec.stream", base, id);
    struct curl_slist *hs = curl_slist_append(NULL, "Content-Type: application/json");
    hs = curl_slist_append(hs, "Accept: text/event-stream");
    hs = curl_slist_append(hs, "X-Sbx-Client: sbx-bench-http");
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, hs);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, sse_data);
    for (int i = 0; i < 10 + ns; i++) {
        struct sse x = {0};
        sbx_buf_init(&x.b);
        curl_easy_setopt(cu, CURLOPT_URL, url);
        curl_easy_setopt(cu, CURLOPT_POSTFIELDS, "{\"command\":\"echo hi\"}");
        curl_easy_setopt(cu, CURLOPT_WRITEDATA, &x);
        x.t0 = sbx_stats_now_ms();
        CURLcode cr = curl_easy_perform(cu);
        sbx_buf_free(&x.b);
        if (cr != CURLE_OK || !x.first_stdout) {
            fprintf(stderr, "sbx-bench-http: SSE exec failed\n");
            goto out;
        }
        if (i >= 10) {
            ev[i - 10] = x.first_event;
            out[i - 10] = x.first_stdout;
        }
    }
    curl_slist_free_all(h);
    curl_slist_free_all(hs);
    if (mcp_runs(cu, base, id, c, mcp, nng2, runs) != 0)
        goto out;
    sbx_destroy(c, id, NULL, NULL);
    printf("HTTP front vs nng, `exec true` on one running sandbox (default session)\n");
    sbx_stats_line("exec over nng (libsbx)", nng, (size_t)runs);
    sbx_stats_line("exec over HTTP (keep-alive)", http, (size_t)runs);
    printf("Server-Sent Events, exec.stream `echo hi`\n");
    sbx_stats_line("SSE first event (start)", ev, (size_t)ns);
    sbx_stats_line("SSE first stdout event", out, (size_t)ns);
    for (int i = 0; i < runs; i++)
        pair[i] = mcp[i] - nng2[i];
    printf("MCP over streamable HTTP, tools/call exec `true` (application/json answer), each "
           "followed by the same exec over nng\n");
    sbx_stats_line("MCP exec over HTTP (keep-alive)", mcp, (size_t)runs);
    sbx_stats_line("exec over nng, paired", nng2, (size_t)runs);
    sbx_stats_line("MCP minus nng, per pair", pair, (size_t)runs);
    printf("(floor: an MCP exec <= 2 ms above the same exec over nng: the pairs' p50)\n");
    rc = 0;
out:
    if (cu)
        curl_easy_cleanup(cu);
    if (c)
        sbx_client_close(c);
    testd_stop(&d);
    return rc;
}
