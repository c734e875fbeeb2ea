/* httpc.c — see httpc.h. */
#include "httpc.h"

#include <curl/curl.h>
#include <nettle/sha2.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "../../runtime/util.h"

static pthread_once_t once = PTHREAD_ONCE_INIT;

static void
init_curl(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static double
now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

char *
hfmt(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char *s = NULL;
    if (vasprintf(&s, fmt, ap) < 0)
        abort();
    va_end(ap);
    return s;
}

void
sha256_hex(const void *p, size_t n, char out[65])
{
    struct sha256_ctx c;
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_init(&c);
    sha256_update(&c, n, p);
    sha256_digest(&c, sizeof(d), d);
    for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

struct xfer {
    struct hresp *r;
    sbx_buf body, head, sse;
    double t0;
    /* upload */
    const char *up;
    size_t up_len, up_off;
    /* SSE */
    sse_cb cb;
    void *arg;
    bool stopped;
    struct sse_ev ev;
    sbx_buf data;
    bool have_data;
};

static size_t
on_head(char *p, size_t size, size_t n, void *cls)
{
    struct xfer *x = cls;
    size_t len = size * n;
    if (len >= 5 && !strncmp(p, "HTTP/", 5))
        x->head.len = 0; /* a new head (after an interim 1xx) */
    sbx_buf_append(&x->head, p, len);
    return len;
}

static void
ev_reset(struct xfer *x)
{
    memset(&x->ev, 0, sizeof(x->ev));
    x->data.len = 0;
    x->have_data = false;
}

/* Dispatch the event being built (WHATWG HTML §9.2.6). */
static bool
ev_dispatch(struct xfer *x)
{
    if (!x->have_data && !x->ev.has_id && !x->ev.event[0]) {
        ev_reset(x);
        return true;
    }
    sbx_buf_append(&x->data, "", 1);
    x->ev.data = x->data.p;
    json_error_t je;
    x->ev.json = x->have_data ? json_loads(x->data.p, 0, &je) : NULL;
    x->ev.at_ms = now_ms() - x->t0;
    bool go = x->cb(&x->ev, x->arg);
    if (x->ev.json)
        json_decref(x->ev.json);
    ev_reset(x);
    return go;
}

/* One line (without its terminator) of an event stream. */
static bool
sse_line(struct xfer *x, char *line)
{
    if (!*line)
        return ev_dispatch(x);
    if (*line == ':') {
        struct sse_ev c;
        memset(&c, 0, sizeof(c));
        c.comment = true;
        c.data = line + 1 + (line[1] == ' ');
        c.at_ms = now_ms() - x->t0;
        return x->cb(&c, x->arg);
    }
    char *colon = strchr(line, ':');
    const char *v = "";
    if (colon) {
        *colon = 0;
        v = colon + 1;
        if (*v == ' ')
            v++;
    }
    if (!strcmp(line, "id")) {
        snprintf(x->ev.id, sizeof(x->ev.id), "%s", v);
        x->ev.has_id = true;
    } else if (!strcmp(line, "event")) {
        snprintf(x->ev.event, sizeof(x->ev.event), "%s", v);
    } else if (!strcmp(line, "data")) {
        if (x->have_data)
            sbx_buf_append(&x->data, "\n", 1);
        sbx_buf_append(&x->data, v, strlen(v));
        x->have_data = true;
    }
    return true;
}

static size_t
on_body(char *p, size_t size, size_t n, void *cls)
{
    struct xfer *x = cls;
    size_t len = size * n;
    if (!x->r->first_byte_ms)
        x->r->first_byte_ms = now_ms() - x->t0;
    if (!x->cb || x->stopped) {
        sbx_buf_append(&x->body, p, len);
        return len;
    }
    /* SSE: only for a 200 answer (errors are JSON bodies). */
    const char *h = x->head.p ? x->head.p : "";
    bool ok = x->head.len > 12 && !strncmp(h + 9, "200", 3);
    if (!ok) {
        sbx_buf_append(&x->body, p, len);
        return len;
    }
    sbx_buf_append(&x->sse, p, len);
    for (;;) {
        char *s = x->sse.p;
        size_t l = x->sse.len;
        char *nl = memchr(s, '\n', l);
        char *cr = memchr(s, '\r', l);
        char *end = nl && (!cr || nl < cr) ? nl : cr;
        if (!end)
            break;
        /* "\r" at the very end may be the first half of "\r\n". */
        if (end == cr && (size_t)(cr - s) + 1 == l)
            break;
        size_t skip = (end == cr && cr[1] == '\n') ? 2 : 1;
        *end = 0;
        char *line = sbx_xstrdup(s);
        sbx_buf_consume(&x->sse, (size_t)(end - s) + skip);
        bool go = sse_line(x, line);
        free(line);
        if (!go) {
            x->stopped = true;
            return 0; /* abort the transfer */
        }
    }
    return len;
}

static size_t
on_read(char *p, size_t size, size_t n, void *cls)
{
    struct xfer *x = cls;
    size_t max = size * n;
    size_t k = x->up_len - x->up_off;
    if (k > max)
        k = max;
    /* Small pieces, so a chunked body really comes in many chunks. */
    if (k > 65536)
        k = 65536;
    memcpy(p, x->up + x->up_off, k);
    x->up_off += k;
    return k;
}

static long
perform(const char *method, const char *url, const struct hopts *o, sse_cb cb, void *arg,
        struct hresp *r)
{
    static const struct hopts none;
    if (!o)
        o = &none;
    pthread_once(&once, init_curl);
    memset(r, 0, sizeof(*r));
    struct xfer x;
    memset(&x, 0, sizeof(x));
    x.r = r;
    x.cb = cb;
    x.arg = arg;
    sbx_buf_init(&x.body);
    sbx_buf_init(&x.head);
    sbx_buf_init(&x.sse);
    sbx_buf_init(&x.data);
    CURL *cu = curl_easy_init();
    struct curl_slist *hdrs = NULL, *resolve = NULL;
    bool client = false;
    for (int i = 0; o->headers && o->headers[i]; i++) {
        hdrs = curl_slist_append(hdrs, o->headers[i]);
        client |= !strncasecmp(o->headers[i], "X-Sbx-Client", 12) &&
                  (o->headers[i][12] == ':' || o->headers[i][12] == ';');
    }
    /* What the keyless front requires of mutating requests (docs/http.md);
     * "X-Sbx-Client:" among o->headers sends none, "X-Sbx-Client;" an empty one
     * (curl's syntax). */
    if (!client)
        hdrs = curl_slist_append(hdrs, "X-Sbx-Client: sbx-tests");
    hdrs = curl_slist_append(hdrs, "Expect:");
    if (cb)
        hdrs = curl_slist_append(hdrs, "Accept: text/event-stream");
    /* http://NAME.localhost:PORT/ → 127.0.0.1 */
    const char *hs = strstr(url, "://");
    if (hs) {
        hs += 3;
        const char *he = hs + strcspn(hs, ":/");
        const char *loc = ".localhost";
        size_t hl = (size_t)(he - hs), ll = strlen(loc);
        if (hl > ll && !strncasecmp(he - ll, loc, ll) && *he == ':') {
            int port = atoi(he + 1);
            char entry[512];
            snprintf(entry, sizeof(entry), "%.*s:%d:127.0.0.1", (int)hl, hs, port);
            resolve = curl_slist_append(resolve, entry);
            curl_easy_setopt(cu, CURLOPT_RESOLVE, resolve);
        }
    }
    char errbuf[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cu, CURLOPT_NOPROXY, "*");
    curl_easy_setopt(cu, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(cu, CURLOPT_TIMEOUT_MS, o->timeout_ms ? o->timeout_ms : 60000L);
    curl_easy_setopt(cu, CURLOPT_HEADERFUNCTION, on_head);
    curl_easy_setopt(cu, CURLOPT_HEADERDATA, &x);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, &x);
    curl_easy_setopt(cu, CURLOPT_HTTP_VERSION,
                     o->http10 ? (long)CURL_HTTP_VERSION_1_0 : (long)CURL_HTTP_VERSION_1_1);
    if (!strcmp(method, "HEAD"))
        curl_easy_setopt(cu, CURLOPT_NOBODY, 1L);
    if (o->body || o->chunked) {
        if (o->chunked) {
            x.up = o->body;
            x.up_len = o->body_len;
            curl_easy_setopt(cu, CURLOPT_POST, 1L);
            curl_easy_setopt(cu, CURLOPT_READFUNCTION, on_read);
            curl_easy_setopt(cu, CURLOPT_READDATA, &x);
            hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
        } else {
            curl_easy_setopt(cu, CURLOPT_POSTFIELDS, o->body);
            curl_easy_setopt(cu, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)o->body_len);
        }
    }
    curl_easy_setopt(cu, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, hdrs);
    x.t0 = now_ms();
    CURLcode rc = curl_easy_perform(cu);
    r->total_ms = now_ms() - x.t0;
    curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &r->status);
    /* A transfer that broke after the head keeps its status; err says why. */
    if (rc != CURLE_OK && !(x.stopped && rc == CURLE_WRITE_ERROR))
        snprintf(r->err, sizeof(r->err), "%s: %s", curl_easy_strerror(rc), errbuf);
    curl_easy_cleanup(cu);
    curl_slist_free_all(hdrs);
    curl_slist_free_all(resolve);
    sbx_buf_append(&x.body, "", 1);
    r->len = x.body.len - 1;
    r->body = sbx_buf_steal(&x.body, NULL);
    sbx_buf_append(&x.head, "", 1);
    r->head = sbx_buf_steal(&x.head, NULL);
    json_error_t je;
    r->json = r->len ? json_loadb(r->body, r->len, 0, &je) : NULL;
    sbx_buf_free(&x.sse);
    sbx_buf_free(&x.data);
    return r->status;
}

long
http_req(const char *method, const char *url, const struct hopts *o, struct hresp *r)
{
    return perform(method, url, o, NULL, NULL, r);
}

long
http_json(const char *method, const char *url, const char *json, struct hresp *r)
{
    static const char *const ct[] = {"Content-Type: application/json", NULL};
    struct hopts o = {.headers = ct, .body = json, .body_len = json ? strlen(json) : 0};
    return perform(method, url, json ? &o : NULL, NULL, NULL, r);
}

long
sse_req(const char *method, const char *url, const struct hopts *o, sse_cb cb, void *arg,
        struct hresp *r)
{
    return perform(method, url, o, cb, arg, r);
}

void
hresp_free(struct hresp *r)
{
    free(r->body);
    free(r->head);
    if (r->json)
        json_decref(r->json);
    memset(r, 0, sizeof(*r));
}

char *
hresp_header(const struct hresp *r, const char *name)
{
    size_t nl = strlen(name);
    const char *p = r->head;
    while (p && *p) {
        const char *eol = strstr(p, "\r\n");
        size_t ll = eol ? (size_t)(eol - p) : strlen(p);
        if (ll > nl && p[nl] == ':' && !strncasecmp(p, name, nl)) {
            const char *v = p + nl + 1;
            while (*v == ' ' || *v == '\t')
                v++;
            size_t vl = ll - (size_t)(v - p);
            while (vl && (v[vl - 1] == ' ' || v[vl - 1] == '\t'))
                vl--;
            return sbx_xstrndup(v, vl);
        }
        p = eol ? eol + 2 : p + ll;
    }
    return NULL;
}
