/*
 * test_console.c — unit tests of the web console's files on the HTTP front
 * (gateway/console.c; docs/console.md): served under /console/ only when the
 * front runs with conf.console, with their Content-Type, the strict
 * Content-Security-Policy and nosniff; /console redirects to /console/;
 * unknown files are 404, other methods 405; the files need no key while the
 * API still does; keyless, the browser guard (a loopback Host) applies.
 *
 * No gateway, shard or container: the front (sbx_http_start on 127.0.0.1
 * port 0) dials a REP socket of this file that never answers, and no
 * request for the console may reach it (it counts none).  The browser test
 * of the pages themselves is tests/console/.
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
#include "runtime/util.h"

static nng_socket rep;
static sbx_http *front;
static char base[64];
static char keyfile[64];

#define KEY "console-unit-test-key-0123456789"

/* Start the front: console on or off, keys or none. */
static void
start(bool console, bool keys)
{
    static int n;
    char url[96];
    snprintf(url, sizeof(url), "inproc://sbx-test-console-%d-%d", (int)getpid(), ++n);
    cr_assert_eq(nng_rep0_open(&rep), 0);
    cr_assert_eq(nng_listen(rep, url, NULL, 0), 0);
    keyfile[0] = '\0';
    if (keys) {
        snprintf(keyfile, sizeof(keyfile), "/tmp/sbx-test-console-XXXXXX");
        int fd = mkstemp(keyfile);
        cr_assert(fd >= 0);
        cr_assert_eq(write(fd, KEY "\n", sizeof(KEY)), (ssize_t)sizeof(KEY));
        close(fd);
    }
    struct sbx_http_conf hc = {
        .listen = "127.0.0.1:0",
        .upstream = url,
        .api_keys = keys ? keyfile : NULL,
        .timeout = 2000,
        .console = console,
    };
    sbx_err_t err = NULL;
    int rc = sbx_http_start(&front, &hc, &err);
    cr_assert_eq(rc, 0, "sbx_http_start: %s", sbx_err_msg(err));
    snprintf(base, sizeof(base), "http://127.0.0.1:%d", sbx_http_port(front));
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void
stop(void)
{
    if (front)
        sbx_http_stop(front);
    front = NULL;
    nng_close(rep);
    if (keyfile[0])
        unlink(keyfile);
    curl_global_cleanup();
}

/* No request reached the gateway. */
static void
expect_no_call(void)
{
    nng_msg *m;
    int rc = nng_recvmsg(rep, &m, NNG_FLAG_NONBLOCK);
    if (rc == 0)
        nng_msg_free(m);
    cr_assert_eq(rc, NNG_EAGAIN, "a console request reached the gateway");
}

/* One exchange as a client sees it: status, the header block, the body. */
struct resp {
    long status;
    sbx_buf headers;
    sbx_buf body;
};

static size_t
append_cb(char *p, size_t sz, size_t n, void *arg)
{
    sbx_buf_append(arg, p, sz * n);
    return sz * n;
}

static struct resp
http(const char *method, const char *path, const char *extra_header)
{
    struct resp r = {0};
    char url[256];
    snprintf(url, sizeof(url), "%s%s", base, path);
    CURL *c = curl_easy_init();
    cr_assert_not_null(c);
    curl_easy_setopt(c, CURLOPT_URL, url);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
    else
        curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, append_cb);
    curl_easy_setopt(c, CURLOPT_WRITEDATA, &r.body);
    curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, append_cb);
    curl_easy_setopt(c, CURLOPT_HEADERDATA, &r.headers);
    curl_easy_setopt(c, CURLOPT_TIMEOUT, 10L);
    struct curl_slist *h = curl_slist_append(NULL, "X-Sbx-Client: test_console");
    if (extra_header)
        h = curl_slist_append(h, extra_header);
    curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
    CURLcode cc = curl_easy_perform(c);
    cr_assert_eq(cc, CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(cc));
    curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(h);
    curl_easy_cleanup(c);
    sbx_buf_append(&r.headers, "", 1); /* NUL-terminate both */
    sbx_buf_append(&r.body, "", 1);
    return r;
}

static void
resp_free(struct resp *r)
{
    sbx_buf_free(&r->headers);
    sbx_buf_free(&r->body);
}

/* The value of header name in r ("" if absent), into out[outlen]. */
static const char *
header(struct resp *r, const char *name, char *out, size_t outlen)
{
    out[0] = '\0';
    size_t nl = strlen(name);
    for (const char *line = r->headers.p; line && *line;) {
        const char *end = strstr(line, "\r\n");
        size_t len = end ? (size_t)(end - line) : strlen(line);
        if (len > nl && !strncasecmp(line, name, nl) && line[nl] == ':') {
            const char *v = line + nl + 1;
            while (*v == ' ')
                v++;
            snprintf(out, outlen, "%.*s", (int)(len - (size_t)(v - line)), v);
        }
        line = end ? end + 2 : line + len;
    }
    return out;
}

/* r is the console's file of this Content-Type, with the console's headers. */
static void
expect_file(struct resp *r, const char *ctype)
{
    char v[512];
    cr_assert_eq(r->status, 200);
    cr_assert_str_eq(header(r, "Content-Type", v, sizeof(v)), ctype);
    cr_assert_str_eq(header(r, "X-Content-Type-Options", v, sizeof(v)), "nosniff");
    header(r, "Content-Security-Policy", v, sizeof(v));
    cr_assert(strstr(v, "default-src 'none'") && strstr(v, "script-src 'self';") &&
                  strstr(v, "connect-src 'self'") && strstr(v, "frame-ancestors 'none'") &&
                  !strstr(v, "unsafe-eval") && !strstr(v, "script-src 'self' 'unsafe-inline'"),
              "a strict policy: %s", v);
}

Test(console, off_by_default_is_404)
{
    start(false, false);
    struct resp r = http("GET", "/console/", NULL);
    cr_assert_eq(r.status, 404);
    cr_assert(strstr(r.body.p, "\"ROUTE_NOT_FOUND\""), "%s", r.body.p);
    resp_free(&r);
    r = http("GET", "/console/app.js", NULL);
    cr_assert_eq(r.status, 404);
    resp_free(&r);
    expect_no_call();
    stop();
}

Test(console, serves_its_files_with_a_strict_policy)
{
    start(true, false);
    struct resp r = http("GET", "/console/", NULL);
    expect_file(&r, "text/html; charset=utf-8");
    cr_assert(!strncasecmp(r.body.p, "<!doctype html>", 15), "%.60s", r.body.p);
    cr_assert(strstr(r.body.p, "src=\"app.js\"") && strstr(r.body.p, "href=\"app.css\""));
    resp_free(&r);

    r = http("GET", "/console/app.js", NULL);
    expect_file(&r, "text/javascript; charset=utf-8");
    cr_assert_gt(r.body.len, 10000, "the bundle (with xterm.js) is %zu bytes", r.body.len);
    cr_assert(strstr(r.body.p, "sbx.console.key"), "the console's own code is in the bundle");
    resp_free(&r);

    r = http("GET", "/console/app.css", NULL);
    expect_file(&r, "text/css; charset=utf-8");
    cr_assert(strstr(r.body.p, ".xterm"), "xterm's styles are appended");
    resp_free(&r);

    r = http("HEAD", "/console/app.js", NULL);
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    expect_no_call();
    stop();
}

Test(console, redirects_404s_and_405s)
{
    char v[256];
    start(true, false);
    struct resp r = http("GET", "/console", NULL);
    cr_assert_eq(r.status, 308);
    cr_assert_str_eq(header(&r, "Location", v, sizeof(v)), "/console/");
    resp_free(&r);

    r = http("GET", "/console/nope.js", NULL);
    cr_assert_eq(r.status, 404);
    cr_assert(strstr(r.body.p, "\"ROUTE_NOT_FOUND\""));
    resp_free(&r);

    r = http("GET", "/consolex", NULL); /* not the console: the API's 404 */
    cr_assert_eq(r.status, 404);
    resp_free(&r);

    r = http("POST", "/console/", NULL);
    cr_assert_eq(r.status, 405);
    cr_assert_str_eq(header(&r, "Allow", v, sizeof(v)), "GET, HEAD");
    resp_free(&r);
    expect_no_call();
    stop();
}

Test(console, files_need_no_key_the_api_does)
{
    start(true, true);
    struct resp r = http("GET", "/console/", NULL);
    expect_file(&r, "text/html; charset=utf-8");
    resp_free(&r);
    r = http("GET", "/v1/sandboxes", NULL);
    cr_assert_eq(r.status, 401, "the API still wants the key");
    resp_free(&r);
    expect_no_call();
    stop();
}

Test(console, keyless_answers_only_loopback_hosts)
{
    start(true, false);
    struct resp r = http("GET", "/console/", "Host: evil.example");
    cr_assert_eq(r.status, 403, "DNS rebinding: a page of another name reaching 127.0.0.1");
    resp_free(&r);
    r = http("GET", "/console/", "Host: localhost");
    cr_assert_eq(r.status, 200);
    resp_free(&r);
    stop();
}
