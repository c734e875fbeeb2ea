/*
 * test_http_routes.c — unit tests of the HTTP front's routing (gateway/
 * http.h; docs/http.md): which operation a method and path become, the path
 * parameters it carries, 405 for a path served with other methods, 404
 * ROUTE_NOT_FOUND for no route.
 *
 * No gateway, shard or container: the front (sbx_http_start, on 127.0.0.1
 * port 0) is pointed at a fake gateway of this file — an nng REP socket on a
 * unique inproc:// address, served by a thread — which answers every request
 * with the envelope it received, as the result {op, sandbox, args}.  So each
 * check is what a client of the REST API sees (libcurl), and what the
 * gateway would have been asked.  A refused request must not reach the
 * gateway at all: the fake counts what it receives.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <jansson.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gateway/http.h"
#include "runtime/json.h"
#include "runtime/nngx.h"
#include "runtime/util.h"
#include "runtime/wire.h"

/* The fake gateway: owned by the test, served by its thread until stop. */
struct fakegw {
    nng_socket rep;
    pthread_t th;
    atomic_int requests; /* envelopes received */
    char url[96];
};

/* Answer each request {v, id, op, sandbox?, args?} with
 * {v, id, ok: true, result: {op, sandbox, args}}. */
static void *
fakegw_main(void *arg)
{
    struct fakegw *g = arg;
    for (;;) {
        nng_msg *m;
        if (nng_recvmsg(g->rep, &m, 0) != 0)
            return NULL; /* closed */
        atomic_fetch_add(&g->requests, 1);
        sbx_msg req;
        if (sbx_wire_decode(&req, nng_msg_body(m), nng_msg_len(m), &sbx_wire_limits_request) != 0) {
            nng_msg_free(m);
            continue; /* no reply: the test sees a timeout */
        }
        sbx_str id = {"", 0}, op = {"", 0}, sandbox = {"", 0};
        sbx_wire_get_str(req.root, "id", &id);
        sbx_wire_get_str(req.root, "op", &op);
        sbx_wire_get_str(req.root, "sandbox", &sandbox);
        const msgpack_object *args = sbx_wire_get(req.root, "args");
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
        sbx_enc_kstrn(&e, "id", id.p, id.n);
        sbx_enc_kbool(&e, "ok", true);
        sbx_enc_kmap(&e, "result");
        sbx_enc_kstrn(&e, "op", op.p, op.n);
        sbx_enc_kstrn(&e, "sandbox", sandbox.p, sandbox.n);
        sbx_enc_str(&e, "args");
        if (args)
            sbx_enc_obj(&e, args);
        else
            sbx_enc_nil(&e);
        sbx_enc_end(&e);
        sbx_enc_end(&e);
        char *buf;
        size_t len;
        int rc = sbx_enc_finish(&e, &buf, &len);
        sbx_wire_msg_free(&req);
        nng_msg_free(m);
        if (rc != 0)
            continue;
        nng_send(g->rep, buf, len, 0);
        free(buf);
    }
}

static struct fakegw gw;
static sbx_http *front;
static char base[64];

static void
setup(void)
{
    static int n;
    snprintf(gw.url, sizeof(gw.url), "inproc://sbx-test-http-routes-%d-%d", (int)getpid(), ++n);
    atomic_store(&gw.requests, 0);
    cr_assert_eq(nng_rep0_open(&gw.rep), 0);
    cr_assert_eq(nng_listen(gw.rep, gw.url, NULL, 0), 0);
    cr_assert_eq(pthread_create(&gw.th, NULL, fakegw_main, &gw), 0);
    struct sbx_http_conf hc = {
        .listen = "127.0.0.1:0",
        .upstream = gw.url,
        .timeout = 5000,
    };
    sbx_err_t err = NULL;
    int rc = sbx_http_start(&front, &hc, &err);
    cr_assert_eq(rc, 0, "sbx_http_start: %s", sbx_err_msg(err));
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", sbx_http_port(front));
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void
teardown(void)
{
    if (front)
        sbx_http_stop(front);
    front = NULL;
    nng_close(gw.rep); /* ends the thread's receive */
    pthread_join(gw.th, NULL);
    curl_global_cleanup();
}

TestSuite(http_routes, .init = setup, .fini = teardown);

/* One HTTP exchange as a client sees it. */
struct resp {
    long status;
    json_t *body;      /* the JSON body, or NULL */
    char allow[128];   /* the Allow header ("" if none) */
};

static size_t
body_cb(char *p, size_t sz, size_t n, void *arg)
{
    sbx_buf *b = arg;
    sbx_buf_append(b, p, sz * n);
    return sz * n;
}

static size_t
header_cb(char *p, size_t sz, size_t n, void *arg)
{
    struct resp *r = arg;
    size_t len = sz * n;
    if (len > 6 && !strncasecmp(p, "Allow:", 6)) {
        const char *v = p + 6;
        while (*v == ' ')
            v++;
        size_t vl = len - (size_t)(v - p);
        while (vl && (v[vl - 1] == '\r' || v[vl - 1] == '\n'))
            vl--;
        snprintf(r->allow, sizeof(r->allow), "%.*s", (int)vl, v);
    }
    return len;
}

/* http — METHOD path (with base) and an optional JSON body; the caller
 * frees r->body with json_decref. */
static struct resp
http(const char *method, const char *path, const char *body)
{
    struct resp r = {0};
    sbx_buf b = {0};
    char url[512];
    snprintf(url, sizeof(url), "%s%s", base, path);
    CURL *c = curl_easy_init();
    cr_assert_not_null(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, body_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &b);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, header_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    /* What the keyless front requires of mutating requests (docs/http.md). */
    struct curl_slist *h = curl_slist_append(NULL, "X-Sbx-Client: test_http_routes");
    if (body) {
        h = curl_slist_append(h, "Content-Type: application/json");
        curl_easy_setopt(c, CURLOPT_POSTFIELDS, body);
    }
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode cc = curl_easy_perform(c);
    cr_assert_eq(cc, CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(cc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    if (b.len)
        r.body = json_loadb(b.p, b.len, 0, NULL);
    sbx_buf_free(&b);
    return r;
}

/* expect_op — METHOD path reached the gateway as op on sandbox (NULL: none);
 * returns the args it carried (borrowed from r->body). */
static json_t *
expect_op(struct resp *r, const char *method, const char *path, const char *op,
          const char *sandbox)
{
    cr_assert_eq(r->status, 200, "%s %s: HTTP %ld", method, path, r->status);
    cr_assert_not_null(r->body, "%s %s: no JSON body", method, path);
    cr_expect_str_eq(json_string_value(json_object_get(r->body, "op")), op, "%s %s", method, path);
    cr_expect_str_eq(json_string_value(json_object_get(r->body, "sandbox")), sandbox ? sandbox : "",
                     "%s %s", method, path);
    return json_object_get(r->body, "args");
}

/* expect_refused — an error response with status and code, not forwarded. */
static void
expect_refused(struct resp *r, const char *what, long status, const char *code)
{
    cr_expect_eq(r->status, status, "%s: HTTP %ld, expected %ld", what, r->status, status);
    cr_assert_not_null(r->body, "%s: the error has no JSON body", what);
    cr_expect_str_eq(json_string_value(json_object_get(r->body, "code")), code, "%s", what);
    cr_expect_eq(json_integer_value(json_object_get(r->body, "httpStatus")), status,
                 "%s: httpStatus in the body", what);
    cr_expect_eq(atomic_load(&gw.requests), 0, "%s: a refused request reached the gateway", what);
}

Test(http_routes, canonical_route_carries_op_sandbox_and_body_arguments)
{
    struct resp r = http("POST", "/v1/sandboxes/sb-1/exec", "{\"command\":\"ls -l\",\"timeout\":5}");
    json_t *args = expect_op(&r, "POST", "/v1/sandboxes/sb-1/exec", "exec", "sb-1");
    cr_expect_str_eq(json_string_value(json_object_get(args, "command")), "ls -l");
    cr_expect_eq(json_integer_value(json_object_get(args, "timeout")), 5);
    cr_expect_eq(atomic_load(&gw.requests), 1);
    json_decref(r.body);
}

Test(http_routes, rest_aliases_map_to_their_operations)
{
    static const struct {
        const char *method, *path, *op, *sandbox;
    } cases[] = {
        {"GET", "/v1/sandboxes/sb-2", "status", "sb-2"},
        {"DELETE", "/v1/sandboxes/sb-2", "destroy", "sb-2"},
        {"GET", "/v1/sandboxes", "list", NULL},
        {"POST", "/v1/list", "list", NULL},
        {"GET", "/v1/sandboxes/sb-2/processes", "process.list", "sb-2"},
        {"GET", "/v1/sandboxes/sb-2/sessions", "session.list", "sb-2"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct resp r = http(cases[i].method, cases[i].path, NULL);
        expect_op(&r, cases[i].method, cases[i].path, cases[i].op, cases[i].sandbox);
        json_decref(r.body);
    }
    cr_expect_eq(atomic_load(&gw.requests), (int)(sizeof(cases) / sizeof(cases[0])));
}

Test(http_routes, path_parameters_are_percent_decoded_and_typed)
{
    struct resp r = http("GET", "/v1/sandboxes/sb-3/processes/web%20server", NULL);
    json_t *args = expect_op(&r, "GET", "…/processes/web%20server", "process.get", "sb-3");
    cr_expect_str_eq(json_string_value(json_object_get(args, "processId")), "web server");
    json_decref(r.body);

    /* {port:int}: an integer argument, not a string. */
    r = http("DELETE", "/v1/sandboxes/sb-3/ports/8080", NULL);
    args = expect_op(&r, "DELETE", "…/ports/8080", "port.unexpose", "sb-3");
    json_t *port = json_object_get(args, "port");
    cr_expect(json_is_integer(port) && json_integer_value(port) == 8080, "port is not the integer 8080");
    json_decref(r.body);

    /* A path parameter wins over the same name in the body; the body's
     * other fields are kept. */
    r = http("DELETE", "/v1/sandboxes/sb-3/processes/p1", "{\"processId\":\"p2\",\"x\":1}");
    args = expect_op(&r, "DELETE", "…/processes/p1", "process.kill", "sb-3");
    cr_expect_str_eq(json_string_value(json_object_get(args, "processId")), "p1");
    cr_expect_eq(json_integer_value(json_object_get(args, "x")), 1);
    json_decref(r.body);
}

Test(http_routes, a_non_integer_integer_parameter_is_a_validation_error)
{
    struct resp r = http("DELETE", "/v1/sandboxes/sb-4/ports/80x", NULL);
    expect_refused(&r, "DELETE …/ports/80x", 400, "VALIDATION_FAILED");
    json_decref(r.body);
}

Test(http_routes, a_bad_sandbox_id_in_the_path_is_refused_before_the_gateway)
{
    struct resp r = http("POST", "/v1/sandboxes/Not%20An%20ID!/exec", "{\"command\":\"true\"}");
    expect_refused(&r, "POST …/Not An ID!/exec", 400, "VALIDATION_FAILED");
    json_decref(r.body);
}

Test(http_routes, a_path_served_for_other_methods_is_405_with_allow)
{
    struct resp r = http("PUT", "/v1/sandboxes/sb-5/exec", "{}");
    expect_refused(&r, "PUT …/exec", 405, "ROUTE_NOT_FOUND");
    cr_expect_str_eq(r.allow, "POST");
    json_decref(r.body);

    r = http("DELETE", "/v1/health", NULL);
    expect_refused(&r, "DELETE /v1/health", 405, "ROUTE_NOT_FOUND");
    cr_expect_str_eq(r.allow, "GET");
    json_decref(r.body);

    /* Several methods: each named once. */
    r = http("POST", "/v1/sandboxes/sb-5", NULL);
    cr_expect_eq(r.status, 405, "POST /v1/sandboxes/{id}: HTTP %ld", r.status);
    cr_expect(strstr(r.allow, "GET") && strstr(r.allow, "DELETE") && strstr(r.allow, "PUT"),
              "Allow: %s", r.allow);
    cr_expect_eq(strstr(r.allow, "GET"), strrchr(r.allow, 'G'), "GET named twice: %s", r.allow);
    json_decref(r.body);
}

Test(http_routes, no_route_is_404_route_not_found)
{
    static const char *const paths[] = {
        "/v1/nothing-here",
        "/v1/sandboxes/sb-6/no.such.op",
        "/v2/sandboxes/sb-6/exec",
        "/v1/sandboxes/sb-6/exec/extra",
        "/",
    };
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        struct resp r = http("POST", paths[i], "{}");
        expect_refused(&r, paths[i], 404, "ROUTE_NOT_FOUND");
        json_decref(r.body);
    }
}

Test(http_routes, health_and_openapi_are_answered_by_the_front_itself)
{
    struct resp r = http("GET", "/v1/health", NULL);
    cr_expect_eq(r.status, 200);
    cr_expect(json_is_true(json_object_get(r.body, "ok")));
    json_decref(r.body);
    r = http("GET", "/v1/openapi.json", NULL);
    cr_expect_eq(r.status, 200);
    json_t *paths = json_object_get(r.body, "paths");
    cr_expect(json_is_object(json_object_get(paths, "/v1/sandboxes/{sandbox}/exec")),
              "the OpenAPI document lists no exec route");
    json_decref(r.body);
    cr_expect_eq(atomic_load(&gw.requests), 0, "health or openapi went to the gateway");
}
