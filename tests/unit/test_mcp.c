/*
 * test_mcp.c — unit tests of MCP: the shapes both servers share
 * (runtime/mcp.c) and the front's streamable-HTTP endpoint
 * (gateway/mcp_http.c; docs/mcp.md) up to the point where a tool would reach
 * the gateway: sessions, the tool list and its input schemas (from the
 * OpenAPI document, $refs inlined), the protocol errors, GET 405, the
 * keyless Origin and Content-Type rules, DELETE.
 *
 * No gateway: the front (sbx_http_start on 127.0.0.1 port 0) dials a REP
 * socket of this file that never answers, and none of these requests may
 * reach it.  Tool calls against a real daemon, with the official SDK, are
 * tests/mcp/.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "gateway/http.h"
#include "runtime/mcp.h"
#include "runtime/util.h"

static nng_socket rep;
static sbx_http *front;
static char base[64];

static void
start(void)
{
    static int n;
    char url[96];
    snprintf(url, sizeof(url), "inproc://sbx-test-mcp-%d-%d", (int)getpid(), ++n);
    cr_assert_eq(nng_rep0_open(&rep), 0);
    cr_assert_eq(nng_listen(rep, url, NULL, 0), 0);
    struct sbx_http_conf hc = {.listen = "127.0.0.1:0", .upstream = url, .timeout = 2000};
    sbx_err_t err = NULL;
    int rc = sbx_http_start(&front, &hc, &err);
    cr_assert_eq(rc, 0, "sbx_http_start: %s", sbx_err_msg(err));
    snprintf(base, sizeof(base), "http://127.0.0.1:%d/mcp", sbx_http_port(front));
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void
stop(void)
{
    if (front)
        sbx_http_stop(front);
    front = NULL;
    nng_close(rep);
    curl_global_cleanup();
}

struct resp {
    long status;
    char sid[64];
    sbx_buf body;
};

static size_t
append_cb(char *p, size_t sz, size_t n, void *arg)
{
    sbx_buf_append(arg, p, sz * n);
    return sz * n;
}

static size_t
header_cb(char *p, size_t sz, size_t n, void *arg)
{
    struct resp *r = arg;
    if (sz * n > 15 && !strncasecmp(p, "Mcp-Session-Id:", 15))
        sscanf(p + 15, " %63[0-9a-f]", r->sid);
    return sz * n;
}

/* One request: method, body (NULL: none), up to two extra headers. */
static struct resp
req(const char *method, const char *body, const char *h1, const char *h2)
{
    struct resp r = {0};
    CURL *c = curl_easy_init();
    cr_assert_not_null(c);
    curl_easy_setopt(c, CURLOPT_URL, base);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    if (body)
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    struct curl_slist *h = NULL;
    if (h1)
        h = curl_slist_append(h, h1);
    if (h2)
        h = curl_slist_append(h, h2);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode cc = curl_easy_perform(c);
    cr_assert_eq(cc, CURLE_OK, "%s: %s", method, curl_easy_strerror(cc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    sbx_buf_append(&r.body, "", 1);
    return r;
}

#define JSON "Content-Type: application/json"
#define INIT                                                                                  \
    "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"initialize\",\"params\":{\"protocolVersion\":" \
    "\"2025-03-26\",\"capabilities\":{},\"clientInfo\":{\"name\":\"t\",\"version\":\"1\"}}}"

/* The JSON body of r (caller decrefs). */
static json_t *
body(struct resp *r)
{
    json_t *j = json_loads(r->body.p, 0, NULL);
    cr_assert_not_null(j, "not JSON: %s", r->body.p);
    return j;
}

/* No request reached the gateway. */
static void
expect_no_call(void)
{
    nng_msg *m;
    int rc = nng_recvmsg(rep, &m, NNG_FLAG_NONBLOCK);
    if (rc == 0)
        nng_msg_free(m);
    cr_assert_eq(rc, NNG_EAGAIN, "a request reached the gateway");
}

Test(mcp_shapes, versions_tools_results)
{
    cr_assert_str_eq(sbx_mcp_version("2025-03-26"), "2025-03-26");
    cr_assert_str_eq(sbx_mcp_version("1999-01-01"), "2025-11-25");
    cr_assert_str_eq(sbx_mcp_version(NULL), "2025-11-25");
    cr_assert_str_eq(sbx_mcp_tool_find("run_code")->op, "context.run");
    cr_assert_null(sbx_mcp_tool_find("nope"));
    json_t *e = sbx_mcp_tool_error("FILE_NOT_FOUND", "no /x");
    cr_assert(json_is_true(json_object_get(e, "isError")));
    cr_assert_str_eq(json_string_value(json_object_get(
                         json_array_get(json_object_get(e, "content"), 0), "text")),
                     "FILE_NOT_FOUND: no /x");
    json_decref(e);
    /* A png rich result: image content, not repeated in the text. */
    json_t *ok = sbx_mcp_tool_ok(json_pack("{s:[{s:s}]}", "results", "png", "iVBORw0KGgo="));
    json_t *content = json_object_get(ok, "content");
    cr_assert_eq(json_array_size(content), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(content, 1), "mimeType")),
                     "image/png");
    cr_assert_null(strstr(json_string_value(json_object_get(json_array_get(content, 0), "text")),
                          "iVBORw0KGgo="));
    json_decref(ok);
    /* Progress: at most 4 KiB, never cut inside a UTF-8 character. */
    char big[5000];
    memset(big, 'a', sizeof(big));
    memcpy(big + 4094, "\xc3\xa9\xc3\xa9", 4); /* é straddles byte 4096 */
    json_t *tok = json_integer(7);
    json_t *p = sbx_mcp_progress(tok, 1, big, sizeof(big));
    cr_assert_not_null(p);
    const char *m = json_string_value(json_object_get(json_object_get(p, "params"), "message"));
    cr_assert_eq(strlen(m), 4096);
    json_decref(p);
    json_decref(tok);
}

Test(mcp_http, session_tools_and_errors, .init = start, .fini = stop)
{
    struct resp r = req("POST", INIT, JSON, NULL);
    cr_assert_eq(r.status, 200, "%s", r.body.p);
    cr_assert_eq(strlen(r.sid), 32, "a session ID: '%s'", r.sid);
    json_t *j = body(&r);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "result"),
                                                       "protocolVersion")),
                     "2025-03-26");
    json_decref(j);
    char sidh[96];
    snprintf(sidh, sizeof(sidh), "Mcp-Session-Id: %s", r.sid);
    sbx_buf_free(&r.body);

    /* tools/list: exec's schema from ExecArgs, env's $ref inlined, sandbox added. */
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"tools/list\"}", JSON, sidh);
    cr_assert_eq(r.status, 200);
    cr_assert_null(strstr(r.body.p, "$ref"), "every $ref is inlined");
    j = body(&r);
    json_t *tools = json_object_get(json_object_get(j, "result"), "tools");
    cr_assert_eq(json_array_size(tools), sbx_mcp_ntools);
    json_t *exec = NULL, *list = NULL, *t;
    size_t i;
    json_array_foreach(tools, i, t) {
        const char *n = json_string_value(json_object_get(t, "name"));
        if (!strcmp(n, "exec"))
            exec = json_object_get(t, "inputSchema");
        if (!strcmp(n, "sandbox_list"))
            list = json_object_get(t, "inputSchema");
    }
    cr_assert_not_null(exec);
    json_t *props = json_object_get(exec, "properties");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(props, "command"), "type")),
                     "string");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(props, "env"), "type")),
                     "object");
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(props, "sandbox"),
                                                    "maxLength")),
                 63);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(exec, "required"), 0)),
                     "sandbox");
    cr_assert_null(json_object_get(json_object_get(list, "properties"), "sandbox"),
                   "list is deployment-wide: no sandbox argument");
    json_decref(j);
    sbx_buf_free(&r.body);

    /* ping; an unknown method; a notification (202, no body); a batch. */
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"id\":\"p\",\"method\":\"ping\"}", JSON, sidh);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(strstr(r.body.p, "\"result\":{}"), "%s", r.body.p);
    sbx_buf_free(&r.body);
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"id\":3,\"method\":\"nope\"}", JSON, sidh);
    cr_assert_not_null(strstr(r.body.p, "-32601"), "%s", r.body.p);
    sbx_buf_free(&r.body);
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}", JSON, sidh);
    cr_assert_eq(r.status, 202);
    cr_assert_eq(r.body.len, 1); /* the NUL req added */
    sbx_buf_free(&r.body);
    r = req("POST", "[" INIT "]", JSON, sidh);
    cr_assert_eq(r.status, 400);
    cr_assert_not_null(strstr(r.body.p, "-32600"), "%s", r.body.p);
    sbx_buf_free(&r.body);
    r = req("POST", "{not json", JSON, sidh);
    cr_assert_eq(r.status, 400);
    cr_assert_not_null(strstr(r.body.p, "-32700"), "%s", r.body.p);
    sbx_buf_free(&r.body);
    /* An unknown tool never reaches the gateway: -32602 (as SSE is not asked, JSON). */
    r = req("POST",
            "{\"jsonrpc\":\"2.0\",\"id\":4,\"method\":\"tools/call\",\"params\":{\"name\":\"x\"}}",
            JSON, sidh);
    cr_assert_eq(r.status, 200);
    cr_assert_not_null(strstr(r.body.p, "-32602"), "%s", r.body.p);
    sbx_buf_free(&r.body);
    /* ... nor does a bad sandbox ID: a tool error. */
    r = req("POST",
            "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"tools/call\",\"params\":{\"name\":"
            "\"exec\",\"arguments\":{\"sandbox\":\"Bad_Id\",\"command\":\"true\"}}}",
            JSON, sidh);
    cr_assert_not_null(strstr(r.body.p, "\"isError\":true"), "%s", r.body.p);
    cr_assert_not_null(strstr(r.body.p, "VALIDATION_FAILED"), "%s", r.body.p);
    sbx_buf_free(&r.body);

    /* Without the session, with an unknown one; DELETE ends it. */
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"ping\"}", JSON, NULL);
    cr_assert_eq(r.status, 400);
    sbx_buf_free(&r.body);
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"id\":6,\"method\":\"ping\"}", JSON,
            "Mcp-Session-Id: 00000000000000000000000000000000");
    cr_assert_eq(r.status, 404);
    sbx_buf_free(&r.body);
    r = req("DELETE", NULL, sidh, NULL);
    cr_assert_eq(r.status, 204);
    sbx_buf_free(&r.body);
    r = req("POST", "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"ping\"}", JSON, sidh);
    cr_assert_eq(r.status, 404, "an ended session is unknown");
    sbx_buf_free(&r.body);
    expect_no_call();
}

Test(mcp_http, transport_rules, .init = start, .fini = stop)
{
    struct resp r = req("GET", NULL, NULL, NULL);
    cr_assert_eq(r.status, 405, "no server-initiated stream");
    sbx_buf_free(&r.body);
    r = req("PUT", INIT, JSON, NULL);
    cr_assert_eq(r.status, 405);
    sbx_buf_free(&r.body);
    /* Keyless: a foreign Origin (DNS rebinding, a cross-site page), a foreign
     * Host, and a body a page could send without a pre-flight are refused. */
    r = req("POST", INIT, JSON, "Origin: http://evil.example");
    cr_assert_eq(r.status, 403);
    sbx_buf_free(&r.body);
    r = req("POST", INIT, JSON, "Host: evil.example");
    cr_assert_eq(r.status, 403);
    sbx_buf_free(&r.body);
    r = req("POST", INIT, "Content-Type: text/plain", NULL);
    cr_assert_eq(r.status, 415);
    sbx_buf_free(&r.body);
    /* A loopback page's Origin passes. */
    r = req("POST", INIT, JSON, "Origin: http://localhost:3000");
    cr_assert_eq(r.status, 200);
    sbx_buf_free(&r.body);
    expect_no_call();
}
