/*
 * preview.c — preview URLs: http://{port}-{sandbox}-{token}.{domain}/… is
 * proxied to 127.0.0.1:{port} inside the sandbox.
 *
 * Routing and checks (the Cloudflare SDK's proxyToSandbox and
 * proxyPreviewRequest, cloudflare-sandbox-sdk.md §3.3): the Host header's
 * first label is split at its first and last '-' into port, sandbox ID and
 * token; the shard checks the token in constant time against LMDB and
 * whether the port is exposed for the container now running
 * (preview.resolve: 404 INVALID_TOKEN, 410 STALE_PREVIEW_URL, which never
 * wakes a stopped sandbox).  The bytes then go through the shard's relay
 * (runtime/relay.h) into the sandbox's network namespace.
 *
 * Proxying (interpreter-sessions-streaming.md §4.2, RFC 9110 §7.6.1): one
 * worker thread per request speaks HTTP/1.1 to the upstream with libcurl,
 * the relay being its SOCKS5 proxy; bodies stream both
 * ways through bounded buffers — a full buffer suspends the MHD connection
 * or blocks curl's callback, so a slow side slows the other instead of
 * growing memory; redirects are passed back, not followed; hop-by-hop
 * headers are removed both ways; X-Forwarded-For/-Host/-Proto are added;
 * the upstream sees Host: localhost:{port} (dev servers check it).
 * WebSocket upgrades are passed through: the worker writes the request head
 * itself, reads the upstream's answer, and on 101 hands both sockets to a
 * raw byte relay (frames are never parsed, so extensions stay end to end).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/relay.h"
#include "http_int.h"
#include "preview_int.h"

#define BUF_HIGH (1 << 20)        /* bytes buffered per direction before back-pressure */
#define WS_IDLE_MS (30 * 60 * 1000)

/* ------------------------------------------------------------------------------ */
/* Host names. */

bool
preview_match(struct sbx_http *h, const char *host, int *port, char *id, size_t idlen,
              char *token, size_t toklen)
{
    char buf[256];
    size_t n = strlen(host);
    if (n == 0 || n >= sizeof(buf))
        return false;
    for (size_t i = 0; i <= n; i++)
        buf[i] = (char)tolower((unsigned char)host[i]);
    char *dot = strchr(buf, '.');
    if (!dot || !dot[1])
        return false;
    *dot = 0;
    const char *rest = dot + 1;
    if (h->preview_domain) {
        const char *d = h->preview_domain;
        size_t dl = strlen(d);
        bool same = !strcasecmp(rest, d);
        /* A domain configured without a port matches on any port. */
        if (!same && !strchr(d, ':') && !strncasecmp(rest, d, dl) && rest[dl] == ':')
            same = true;
        if (!same)
            return false;
    }
    char *first = strchr(buf, '-'), *last = strrchr(buf, '-');
    if (!first || first == last || first == buf || !last[1])
        return false;
    size_t pl = (size_t)(first - buf);
    if (pl < 4 || pl > 5)
        return false;
    for (size_t i = 0; i < pl; i++)
        if (!isdigit((unsigned char)buf[i]))
            return false;
    size_t tl = strlen(last + 1);
    if (tl > 63 || tl >= toklen)
        return false;
    for (size_t i = 0; i < tl; i++) {
        char c = last[1 + i];
        if (!(islower((unsigned char)c) || isdigit((unsigned char)c) || c == '_'))
            return false;
    }
    /* The ID: what the gateway would accept (a name that is not one is not a
     * preview URL, like a port out of range). */
    size_t il = (size_t)(last - first - 1);
    char why[160];
    if (il == 0 || il >= idlen || sbx_id_check(first + 1, il, why, sizeof(why)) != 0)
        return false;
    *port = atoi(buf);
    memcpy(id, first + 1, il);
    id[il] = 0;
    memcpy(token, last + 1, tl + 1);
    return *port >= 1 && *port <= 65535;
}

/* ------------------------------------------------------------------------------ */
/* Life of a request. */

void
preview_req_unref(struct preview_req *pr)
{
    pthread_mutex_lock(&pr->mu);
    bool last = --pr->refs == 0;
    pthread_mutex_unlock(&pr->mu);
    if (!last)
        return;
    struct sbx_http *h = pr->h;
    pthread_mutex_lock(&h->mu);
    for (struct preview_req **pp = &h->previews; *pp; pp = &(*pp)->next)
        if (*pp == pr) {
            *pp = pr->next;
            break;
        }
    pthread_mutex_unlock(&h->mu);
    curl_slist_free_all(pr->req_hdrs);
    curl_slist_free_all(pr->resp_hdrs);
    free(pr->resp_conn);
    sbx_buf_free(&pr->up);
    sbx_buf_free(&pr->down);
    free(pr->target);
    free(pr->extra);
    if (pr->relay_fd >= 0)
        close(pr->relay_fd);
    pthread_mutex_destroy(&pr->mu);
    pthread_cond_destroy(&pr->cv);
    free(pr);
}

/* Under pr->mu: let MHD go on with the connection if it waits for us. */
static void
wake_conn(struct preview_req *pr)
{
    if (pr->suspended && !pr->cancelled) {
        pr->suspended = false;
        MHD_resume_connection(pr->c);
    }
}

/* Under pr->mu, on MHD's thread: park the connection until the worker calls. */
static void
park_conn(struct preview_req *pr)
{
    pr->suspended = true;
    MHD_suspend_connection(pr->c);
}

/* Worker: end the request with an error response (if nothing was sent yet). */
static void
fail(struct preview_req *pr, int status, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
fail(struct preview_req *pr, int status, const char *code, const char *fmt, ...)
{
    va_list ap;
    pthread_mutex_lock(&pr->mu);
    if (!pr->head_ready) {
        pr->err_status = status;
        snprintf(pr->err_code, sizeof(pr->err_code), "%s", code);
        va_start(ap, fmt);
        vsnprintf(pr->err_msg, sizeof(pr->err_msg), fmt, ap);
        va_end(ap);
    } else {
        pr->down_err = true;
    }
    pr->down_done = true;
    wake_conn(pr);
    pthread_cond_broadcast(&pr->cv);
    pthread_mutex_unlock(&pr->mu);
}

/* ------------------------------------------------------------------------------ */
/* Headers (RFC 9110 §7.6.1: hop-by-hop fields are not forwarded). */

static bool
hop_by_hop(const char *name, size_t n, const char *connection)
{
    static const char *const fixed[] = {"connection", "keep-alive", "proxy-connection", "te",
                                        "trailer", "transfer-encoding", "upgrade",
                                        "proxy-authenticate", "proxy-authorization"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(fixed); i++)
        if (strlen(fixed[i]) == n && !strncasecmp(name, fixed[i], n))
            return true;
    /* …and every field the Connection header names, in its first
     * PREVIEW_CONN_OPTIONS_MAX bytes: a real one is a few options long, and every
     * field of a head is checked against it (a longer one would make a
     * head's cost quadratic in its size). */
    if (connection) {
        const char *p = connection, *end = p + strnlen(p, PREVIEW_CONN_OPTIONS_MAX);
        while (p < end) {
            while (p < end && (*p == ' ' || *p == '\t' || *p == ',')) /* OWS: SP or HTAB */
                p++;
            const char *e = p;
            while (e < end && *e != ',' && *e != ' ' && *e != '\t')
                e++;
            if (e > p && (size_t)(e - p) == n && !strncasecmp(p, name, n))
                return true;
            p = e;
        }
    }
    return false;
}

enum MHD_Result
preview_collect_header(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct preview_hdr_walk *w = cls;
    (void)kind;
    size_t n = strlen(key);
    if (!strcasecmp(key, "Host") || !strcasecmp(key, "Content-Length") ||
        !strcasecmp(key, "Expect") || !strncasecmp(key, "X-Forwarded-", 12) ||
        !strcasecmp(key, "Forwarded") || !strncasecmp(key, "X-Sbx-", 6))
        return MHD_YES;
    if (hop_by_hop(key, n, w->connection)) {
        /* A WebSocket handshake keeps its Upgrade (the head is written by hand). */
        if (!(w->ws && !strcasecmp(key, "Upgrade")))
            return MHD_YES;
    }
    char line[8192];
    if ((size_t)snprintf(line, sizeof(line), "%s: %s", key, value ? value : "") >= sizeof(line))
        return MHD_YES;
    w->pr->req_hdrs = curl_slist_append(w->pr->req_hdrs, line);
    return MHD_YES;
}

/* Rebuild the query string: MHD hands the path and the arguments apart (the
 * front installs an identity unescaper, so both are as the client sent them). */
struct query_walk {
    sbx_buf *b;
    bool first;
};

static enum MHD_Result
collect_query(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct query_walk *q = cls;
    (void)kind;
    sbx_buf_append(q->b, q->first ? "?" : "&", 1);
    q->first = false;
    sbx_buf_append(q->b, key, strlen(key));
    if (value) {
        sbx_buf_append(q->b, "=", 1);
        sbx_buf_append(q->b, value, strlen(value));
    }
    return MHD_YES;
}

/* ------------------------------------------------------------------------------ */
/* The worker: curl callbacks. */

/* Drop the hop-by-hop fields of an upstream head from l: the fixed ones and
 * those its Connection options name (RFC 9110 §7.6.1; they can come before
 * the Connection field, so this runs once the head is complete).  A 101
 * keeps its Upgrade (MHD sends it with its own Connection: Upgrade). */
static struct curl_slist *
drop_hop_by_hop(struct curl_slist *l, const char *connection, bool keep_upgrade)
{
    struct curl_slist *out = NULL;
    for (struct curl_slist *i = l; i; i = i->next) {
        size_t kl = strcspn(i->data, ":");
        if (!hop_by_hop(i->data, kl, connection) ||
            (keep_upgrade && kl == 7 && !strncasecmp(i->data, "Upgrade", 7)))
            out = curl_slist_append(out, i->data);
    }
    curl_slist_free_all(l);
    return out;
}

/* Append a Connection field's value to the options seen so far (*acc), up
 * to what hop_by_hop reads. */
void
preview_add_connection(char **acc, const char *value)
{
    size_t ol = *acc ? strlen(*acc) : 0, vl = strnlen(value, PREVIEW_CONN_OPTIONS_MAX);
    if (ol >= PREVIEW_CONN_OPTIONS_MAX)
        return;
    char *c = sbx_xmalloc(ol + vl + 2);
    snprintf(c, ol + vl + 2, "%s,%s", *acc ? *acc : "", value);
    free(*acc);
    *acc = c;
}

/* A status code: three digits (RFC 9112 §4), else -1. */
static int
status_code(const char *p, size_t n)
{
    if (n < 3 || !isdigit((unsigned char)p[0]) || !isdigit((unsigned char)p[1]) ||
        !isdigit((unsigned char)p[2]) || (n > 3 && isdigit((unsigned char)p[3])))
        return -1;
    return (p[0] - '0') * 100 + (p[1] - '0') * 10 + (p[2] - '0');
}

void
preview_cookie_host_only(char *v)
{
    char *w = strchr(v, ';'), *r = w;
    if (!w)
        return;
    while (*r == ';') {
        const char *end = strchr(r + 1, ';');
        size_t seg = end ? (size_t)(end - r) : strlen(r);
        const char *a = r + 1;
        while (*a == ' ' || *a == '\t')
            a++;
        size_t an = strcspn(a, "=;");
        while (an && (a[an - 1] == ' ' || a[an - 1] == '\t'))
            an--;
        if (!(an == 6 && !strncasecmp(a, "Domain", 6))) {
            memmove(w, r, seg);
            w += seg;
        }
        r += seg;
    }
    *w = 0;
}

/* curl's header callback: one line of the upstream's head (with its line
 * end; not NUL-terminated), the status lines of interim heads included. */
size_t
preview_on_header(char *p, size_t size, size_t nmemb, void *cls)
{
    struct preview_req *pr = cls;
    size_t n = size * nmemb;
    pthread_mutex_lock(&pr->mu);
    if (pr->cancelled) {
        pthread_mutex_unlock(&pr->mu);
        return 0;
    }
    pr->last_io_ms = sbx_mono_ms();
    if (n >= 5 && !strncmp(p, "HTTP/", 5)) {
        /* A status line: a new head (interim 1xx heads are dropped). */
        const char *sp = memchr(p, ' ', n);
        int st = sp ? status_code(sp + 1, n - (size_t)(sp + 1 - p)) : -1;
        pr->status = st >= 100 ? st : 502;
        curl_slist_free_all(pr->resp_hdrs);
        pr->resp_hdrs = NULL;
        free(pr->resp_conn);
        pr->resp_conn = NULL;
        pr->resp_length = -1;
    } else if ((n == 2 && p[0] == '\r' && p[1] == '\n') || (n == 1 && p[0] == '\n')) {
        /* The blank line: the head is complete unless it was interim. */
        if (pr->status >= 200 || pr->status == 101) {
            pr->resp_hdrs = drop_hop_by_hop(pr->resp_hdrs, pr->resp_conn, false);
            pr->head_ready = true;
            wake_conn(pr);
        }
    } else {
        char line[8192];
        size_t l = SBX_MIN(n, sizeof(line) - 1);
        memcpy(line, p, l);
        line[l] = 0;
        line[strcspn(line, "\r\n")] = 0;
        char *colon = strchr(line, ':');
        if (colon && colon > line) { /* a field has a name (RFC 9110 §5.1) */
            size_t kl = (size_t)(colon - line);
            if (kl == 14 && !strncasecmp(line, "Content-Length", 14)) {
                pr->resp_length = strtoll(colon + 1, NULL, 10);
            } else if (kl == 10 && !strncasecmp(line, "Connection", 10)) {
                preview_add_connection(&pr->resp_conn, colon + 1);
            } else if (!hop_by_hop(line, kl, NULL)) {
                pr->resp_hdrs = curl_slist_append(pr->resp_hdrs, line);
            }
        }
    }
    pthread_mutex_unlock(&pr->mu);
    return n;
}

static size_t
on_body(char *p, size_t size, size_t nmemb, void *cls)
{
    struct preview_req *pr = cls;
    size_t n = size * nmemb;
    pthread_mutex_lock(&pr->mu);
    while (!pr->cancelled && pr->down.len - pr->down_off > BUF_HIGH)
        pthread_cond_wait(&pr->cv, &pr->mu);
    if (pr->cancelled) {
        pthread_mutex_unlock(&pr->mu);
        return 0;
    }
    if (pr->down_off && pr->down_off == pr->down.len) {
        pr->down.len = 0;
        pr->down_off = 0;
    }
    sbx_buf_append(&pr->down, p, n);
    pr->last_io_ms = sbx_mono_ms();
    wake_conn(pr);
    pthread_mutex_unlock(&pr->mu);
    return n;
}

static size_t
on_upload(char *p, size_t size, size_t nmemb, void *cls)
{
    struct preview_req *pr = cls;
    size_t max = size * nmemb;
    pthread_mutex_lock(&pr->mu);
    while (!pr->cancelled && pr->up_off == pr->up.len && !pr->up_done) {
        if (pr->up_full) {
            pr->up_full = false;
            wake_conn(pr);
        }
        pthread_cond_wait(&pr->cv, &pr->mu);
    }
    if (pr->cancelled) {
        pthread_mutex_unlock(&pr->mu);
        return CURL_READFUNC_ABORT;
    }
    size_t n = SBX_MIN(max, pr->up.len - pr->up_off);
    memcpy(p, pr->up.p + pr->up_off, n);
    pr->up_off += n;
    pr->last_io_ms = sbx_mono_ms();
    if (pr->up_off == pr->up.len) {
        pr->up.len = 0;
        pr->up_off = 0;
    }
    if (pr->up_full) {
        pr->up_full = false;
        wake_conn(pr);
    }
    pthread_mutex_unlock(&pr->mu);
    return n;
}

/*
 * The upstream URL of a request: the relay is a SOCKS5 proxy whose
 * destination "<generation>.<id>" names the container (runtime/relay.h),
 * then the port and the target as the client sent it (the upstream sees
 * Host: localhost:<port>).  NULL unless the target is in origin form (RFC
 * 9112 §3.2.1: it starts with '/'): anything else continues the authority —
 * "@<gen>.<other-id>:<port>/" makes ours a user name and sends the request
 * to another sandbox, past its token.  The caller frees it.
 */
char *
preview_upstream_url(uint64_t gen, const char *sandbox, int port, const char *target)
{
    if (target[0] != '/')
        return NULL;
    sbx_buf b;
    sbx_buf_init(&b);
    sbx_buf_appendf(&b, "http://%llu.%s:%d%s", (unsigned long long)gen, sandbox, port, target);
    return sbx_buf_steal(&b, NULL);
}

/* curl's progress callback (about once a second, also while the upstream
 * is silent): abort an exchange whose upstream sent no head for
 * PREVIEW_HEAD_TIMEOUT_MS, or whose body went idle for PREVIEW_IDLE_MS,
 * since the last byte either way (preview_int.h). */
static int
on_progress(void *cls, curl_off_t dltotal, curl_off_t dlnow, curl_off_t ultotal, curl_off_t ulnow)
{
    struct preview_req *pr = cls;
    (void)dltotal;
    (void)dlnow;
    (void)ultotal;
    (void)ulnow;
    pthread_mutex_lock(&pr->mu);
    int64_t quiet = sbx_mono_ms() - pr->last_io_ms;
    bool head = pr->head_ready, cancelled = pr->cancelled;
    pthread_mutex_unlock(&pr->mu);
    if (!head && quiet > PREVIEW_HEAD_TIMEOUT_MS)
        pr->timed_out = 1;
    else if (head && quiet > PREVIEW_IDLE_MS)
        pr->timed_out = 2;
    return cancelled || pr->timed_out;
}

static void
proxy_http(struct preview_req *pr, const char *relay, uint64_t gen)
{
    char *url = preview_upstream_url(gen, pr->sandbox, pr->port, pr->target);
    CURL *cu = url ? curl_easy_init() : NULL;
    if (!cu) {
        free(url);
        fail(pr, 500, "INTERNAL_ERROR", "cannot create an HTTP client");
        return;
    }
    char proxy[300];
    sbx_relay_proxy_url(relay, proxy, sizeof(proxy));
    char fwd[512];
    struct curl_slist *hdrs = pr->req_hdrs;
    pr->req_hdrs = NULL;
    snprintf(fwd, sizeof(fwd), "Host: localhost:%d", pr->port);
    hdrs = curl_slist_append(hdrs, fwd);
    snprintf(fwd, sizeof(fwd), "X-Forwarded-For: %s", pr->client_ip);
    hdrs = curl_slist_append(hdrs, fwd);
    snprintf(fwd, sizeof(fwd), "X-Forwarded-Host: %s", pr->host);
    hdrs = curl_slist_append(hdrs, fwd);
    snprintf(fwd, sizeof(fwd), "X-Forwarded-Proto: %s",
             pr->h->conf.preview_scheme && !strcmp(pr->h->conf.preview_scheme, "https") ? "https"
                                                                                    : "http");
    hdrs = curl_slist_append(hdrs, fwd);
    hdrs = curl_slist_append(hdrs, "Expect:"); /* no 100-continue round trip */
    if (pr->has_body && pr->content_length < 0)
        hdrs = curl_slist_append(hdrs, "Transfer-Encoding: chunked");
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_DISALLOW_USERNAME_IN_URL, 1L); /* see preview_upstream_url */
    curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cu, CURLOPT_HTTP_VERSION, (long)CURL_HTTP_VERSION_1_1);
    curl_easy_setopt(cu, CURLOPT_FOLLOWLOCATION, 0L);
    curl_easy_setopt(cu, CURLOPT_HTTP_CONTENT_DECODING, 0L);
    curl_easy_setopt(cu, CURLOPT_HTTP_TRANSFER_DECODING, 1L);
    curl_easy_setopt(cu, CURLOPT_PROTOCOLS_STR, "http");
    curl_easy_setopt(cu, CURLOPT_PROXY, proxy);
    curl_easy_setopt(cu, CURLOPT_PROXYUSERNAME, "sbx");
    curl_easy_setopt(cu, CURLOPT_PROXYPASSWORD,
                     pr->h->relay_secret && *pr->h->relay_secret ? pr->h->relay_secret : "-");
    curl_easy_setopt(cu, CURLOPT_SOCKS5_AUTH, (long)CURLAUTH_BASIC);
    curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT_MS, 10000L);
    curl_easy_setopt(cu, CURLOPT_FORBID_REUSE, 1L);
    curl_easy_setopt(cu, CURLOPT_HEADERFUNCTION, preview_on_header);
    curl_easy_setopt(cu, CURLOPT_HEADERDATA, pr);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, pr);
    curl_easy_setopt(cu, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(cu, CURLOPT_XFERINFOFUNCTION, on_progress);
    curl_easy_setopt(cu, CURLOPT_XFERINFODATA, pr);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, hdrs);
    curl_easy_setopt(cu, CURLOPT_CUSTOMREQUEST, pr->method);
    if (!strcmp(pr->method, "HEAD"))
        curl_easy_setopt(cu, CURLOPT_NOBODY, 1L);
    if (pr->has_body) {
        curl_easy_setopt(cu, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(cu, CURLOPT_READFUNCTION, on_upload);
        curl_easy_setopt(cu, CURLOPT_READDATA, pr);
        if (pr->content_length >= 0)
            curl_easy_setopt(cu, CURLOPT_INFILESIZE_LARGE, (curl_off_t)pr->content_length);
    }
    pthread_mutex_lock(&pr->mu);
    pr->last_io_ms = sbx_mono_ms();
    pthread_mutex_unlock(&pr->mu);
    CURLcode rc = curl_easy_perform(cu);
    long pxerr = 0;
    curl_easy_getinfo(cu, CURLINFO_PROXY_ERROR, &pxerr);
    curl_easy_cleanup(cu);
    curl_slist_free_all(hdrs);
    free(url);
    if (rc == CURLE_PROXY && pxerr == CURLPX_REPLY_CONNECTION_REFUSED) {
        fail(pr, 502, "SERVICE_NOT_RESPONDING",
             "nothing is listening on port %d in the sandbox (yet)", pr->port);
        return;
    }
    if (rc == CURLE_PROXY && pxerr == CURLPX_REPLY_HOST_UNREACHABLE) {
        fail(pr, 410, "STALE_PREVIEW_URL",
             "Preview URL is stale because the sandbox runtime is not active");
        return;
    }
    if (rc == CURLE_COULDNT_RESOLVE_PROXY || rc == CURLE_COULDNT_CONNECT || rc == CURLE_PROXY) {
        fail(pr, 503, "SHARD_UNAVAILABLE", "cannot relay to the sandbox's shard: %s",
             curl_easy_strerror(rc));
        return;
    }
    if (rc == CURLE_ABORTED_BY_CALLBACK && pr->timed_out) {
        if (pr->timed_out == 1)
            fail(pr, 504, "REQUEST_TIMEOUT",
                 "the service on port %d sent no response head within %d s", pr->port,
                 PREVIEW_HEAD_TIMEOUT_MS / 1000);
        else
            fail(pr, 504, "REQUEST_TIMEOUT", "the service on port %d went silent for %d s",
                 pr->port, PREVIEW_IDLE_MS / 1000);
        return;
    }
    if (rc != CURLE_OK) {
        fail(pr, 502, "SERVICE_NOT_RESPONDING", "the service on port %d failed: %s", pr->port,
             curl_easy_strerror(rc));
        return;
    }
    pthread_mutex_lock(&pr->mu);
    pr->head_ready = true;
    pr->down_done = true;
    wake_conn(pr);
    pthread_mutex_unlock(&pr->mu);
}

/* ------------------------------------------------------------------------------ */
/* The worker: WebSocket pass-through. */

void
preview_proxy_ws(struct preview_req *pr)
{
    sbx_buf head;
    sbx_buf_init(&head);
    sbx_buf_appendf(&head, "%s %s HTTP/1.1\r\nHost: localhost:%d\r\nConnection: Upgrade\r\n",
                    pr->method, pr->target, pr->port);
    for (struct curl_slist *l = pr->req_hdrs; l; l = l->next)
        sbx_buf_appendf(&head, "%s\r\n", l->data);
    sbx_buf_appendf(&head, "X-Forwarded-For: %s\r\nX-Forwarded-Host: %s\r\n\r\n", pr->client_ip,
                    pr->host);
    int fd = pr->relay_fd;
    if (sbx_write_full(fd, head.p, head.len) != 0) {
        sbx_buf_free(&head);
        fail(pr, 502, "SERVICE_NOT_RESPONDING", "the service on port %d closed the connection",
             pr->port);
        return;
    }
    /* The answer's head. */
    head.len = 0;
    char *end = NULL;
    int64_t deadline = sbx_mono_ms() + 30000;
    while (!end) {
        if (head.len >= PREVIEW_HEAD_MAX) {
            sbx_buf_free(&head);
            fail(pr, 502, "SERVICE_NOT_RESPONDING", "the upstream's answer head is too large");
            return;
        }
        struct pollfd p = {fd, POLLIN, 0};
        int left = (int)(deadline - sbx_mono_ms());
        if (left <= 0 || poll(&p, 1, left) <= 0) {
            sbx_buf_free(&head);
            fail(pr, 504, "REQUEST_TIMEOUT", "the service on port %d did not answer the upgrade",
                 pr->port);
            return;
        }
        sbx_buf_reserve(&head, 4096);
        ssize_t r = read(fd, head.p + head.len, 4096);
        if (r <= 0) {
            sbx_buf_free(&head);
            fail(pr, 502, "SERVICE_NOT_RESPONDING", "the service on port %d closed the connection",
                 pr->port);
            return;
        }
        head.len += (size_t)r;
        end = memmem(head.p, head.len, "\r\n\r\n", 4);
    }
    size_t hl = (size_t)(end - head.p) + 4;
    pthread_mutex_lock(&pr->mu);
    pr->nextra = head.len - hl;
    pr->extra = sbx_xmalloc(pr->nextra + 1);
    memcpy(pr->extra, head.p + hl, pr->nextra);
    size_t l1 = (size_t)((char *)memmem(head.p, hl, "\r\n", 2) - head.p); /* the status line */
    const char *sp = memchr(head.p, ' ', l1);
    int st = sp ? status_code(sp + 1, l1 - (size_t)(sp + 1 - head.p)) : -1;
    pr->status = st >= 100 ? st : 502;
    char *save = NULL, *conn = NULL;
    head.p[hl - 4] = 0;
    char *line = strtok_r(head.p, "\r\n", &save); /* status line */
    while ((line = strtok_r(NULL, "\r\n", &save))) {
        char *colon = strchr(line, ':');
        if (!colon || colon == line)
            continue; /* not a field */
        size_t kl = (size_t)(colon - line);
        if (kl == 10 && !strncasecmp(line, "Connection", 10)) {
            preview_add_connection(&conn, colon + 1); /* MHD writes Connection: Upgrade itself */
            continue;
        }
        if (kl == 14 && !strncasecmp(line, "Content-Length", 14)) {
            pr->resp_length = strtoll(colon + 1, NULL, 10);
            continue;
        }
        pr->resp_hdrs = curl_slist_append(pr->resp_hdrs, line);
    }
    pr->resp_hdrs = drop_hop_by_hop(pr->resp_hdrs, conn, pr->status == 101);
    free(conn);
    sbx_buf_free(&head);
    if (pr->status != 101) {
        /* Refused: its answer (head, and the bytes of body we have) goes back. */
        sbx_buf_append(&pr->down, pr->extra, pr->nextra);
        pr->resp_length = (int64_t)pr->nextra;
        pr->head_ready = true;
        pr->down_done = true;
        wake_conn(pr);
        pthread_mutex_unlock(&pr->mu);
        return;
    }
    pr->head_ready = true;
    wake_conn(pr);
    /* Wait for MHD to switch the client's connection. */
    while (!pr->upgraded && !pr->cancelled)
        pthread_cond_wait(&pr->cv, &pr->mu);
    bool go = pr->upgraded;
    pthread_mutex_unlock(&pr->mu);
    if (!go)
        return;
    sbx_relay_pump(fd, pr->client_sock, pr->extra, pr->nextra, WS_IDLE_MS);
    MHD_upgrade_action(pr->urh, MHD_UPGRADE_ACTION_CLOSE);
}

static void
upgraded_cb(void *cls, struct MHD_Connection *c, void *con_cls, const char *extra_in,
            size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
    struct preview_req *pr = cls;
    (void)c;
    (void)con_cls;
    pthread_mutex_lock(&pr->mu);
    pr->client_sock = sock;
    pr->urh = urh;
    pr->upgraded = true;
    /* Bytes the client sent right after its handshake belong upstream. */
    if (extra_in_size && pr->relay_fd >= 0)
        send(pr->relay_fd, extra_in, extra_in_size, MSG_NOSIGNAL);
    pthread_cond_broadcast(&pr->cv);
    pthread_mutex_unlock(&pr->mu);
}

static void *
worker_main(void *arg)
{
    struct preview_req *pr = arg;
    struct sbx_http *h = pr->h;
    char code[64], msg[256];
    /* 1. the shard checks the URL */
    sbx_enc e;
    char *args;
    size_t alen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "port", pr->port);
    sbx_enc_kstr(&e, "token", pr->token);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &args, &alen) != 0) {
        fail(pr, 500, "INTERNAL_ERROR", "cannot encode the request");
        goto out;
    }
    struct hreply rep;
    int rc = http_call_sync(h, h->system_key, "preview.resolve", pr->sandbox, args, alen, 10000, &rep, code,
                            msg, sizeof(msg));
    free(args);
    if (rc) {
        /* An unknown sandbox is an invalid URL: nothing tells it apart. */
        if (rc == SBX_E_NOT_FOUND || rc == SBX_E_VALIDATION) {
            rc = SBX_E_INVALID_TOKEN;
            snprintf(code, sizeof(code), "INVALID_TOKEN");
            snprintf(msg, sizeof(msg), "Access denied: Invalid token or port not exposed");
        }
        fail(pr, sbx_err_http(rc), code, "%s", msg);
        goto out;
    }
    int64_t gen = 0;
    sbx_str relay = {"", 0};
    sbx_wire_get_i64(rep.result, "generation", &gen);
    sbx_wire_get_str(rep.result, "relay", &relay);
    char raddr[256];
    snprintf(raddr, sizeof(raddr), "%.*s", (int)relay.n, relay.p);
    hreply_free(&rep);
    if (!raddr[0]) {
        fail(pr, 503, "SHARD_UNAVAILABLE", "the sandbox's shard has no preview relay configured");
        goto out;
    }
    /* 2. the exchange, through the shard's relay into the sandbox */
    if (!pr->ws) {
        proxy_http(pr, raddr, (uint64_t)gen);
        goto out;
    }
    int fd = sbx_relay_connect(raddr, h->relay_secret, pr->sandbox, pr->port, (uint64_t)gen,
                               10000, code, msg, sizeof(msg));
    if (fd < 0) {
        fail(pr, sbx_err_http(fd), code, "%s", msg);
        goto out;
    }
    pthread_mutex_lock(&pr->mu);
    if (pr->cancelled) {
        pthread_mutex_unlock(&pr->mu);
        close(fd);
        goto out;
    }
    pr->relay_fd = fd;
    pthread_mutex_unlock(&pr->mu);
    preview_proxy_ws(pr);
out:
    preview_req_unref(pr);
    http_worker_leave(h);
    return NULL;
}

/* ------------------------------------------------------------------------------ */
/* MHD's side. */

static ssize_t
reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct preview_req *pr = cls;
    (void)pos;
    pthread_mutex_lock(&pr->mu);
    ssize_t ret;
    if (pr->down_off < pr->down.len) {
        size_t n = SBX_MIN(max, pr->down.len - pr->down_off);
        memcpy(buf, pr->down.p + pr->down_off, n);
        pr->down_off += n;
        pthread_cond_broadcast(&pr->cv); /* space for curl's callback */
        ret = (ssize_t)n;
    } else if (pr->down_done || pr->cancelled) {
        ret = pr->down_err || pr->cancelled ? MHD_CONTENT_READER_END_WITH_ERROR
                                            : MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        park_conn(pr);
        ret = 0;
    }
    pthread_mutex_unlock(&pr->mu);
    return ret;
}

/* Under pr->mu: queue the upstream's response (or the error). */
static enum MHD_Result
queue_response(struct preview_req *pr)
{
    pr->queued = true;
    if (pr->err_status) {
        int st = pr->err_status;
        json_t *j = json_pack("{s:s,s:s,s:s,s:{},s:i}", "error", pr->err_msg, "code",
                              pr->err_code, "message", pr->err_msg, "context", "httpStatus", st);
        char *text = json_dumps(j, JSON_COMPACT);
        json_decref(j);
        struct MHD_Response *r = MHD_create_response_from_buffer(
            strlen(text), text, MHD_RESPMEM_MUST_FREE);
        MHD_add_response_header(r, "Content-Type", "application/json");
        MHD_add_response_header(r, "Cache-Control", "no-store");
        enum MHD_Result ret = MHD_queue_response(pr->c, (unsigned)st, r);
        MHD_destroy_response(r);
        return ret;
    }
    struct MHD_Response *r;
    unsigned status = (unsigned)pr->status;
    if (pr->ws && pr->status == 101) {
        r = MHD_create_response_for_upgrade(upgraded_cb, pr);
    } else {
        uint64_t size = pr->resp_length >= 0 ? (uint64_t)pr->resp_length : MHD_SIZE_UNKNOWN;
        if (!strcmp(pr->method, "HEAD") || status == 204 || status == 304)
            size = pr->resp_length >= 0 ? (uint64_t)pr->resp_length : 0;
        r = MHD_create_response_from_callback(size, 64 * 1024, reader, pr, NULL);
    }
    if (!r)
        return MHD_NO;
    for (struct curl_slist *l = pr->resp_hdrs; l; l = l->next) {
        char *colon = strchr(l->data, ':');
        if (!colon)
            continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        if (!strcasecmp(l->data, "Set-Cookie"))
            preview_cookie_host_only(v);
        MHD_add_response_header(r, l->data, v);
        *colon = ':';
    }
    enum MHD_Result ret = MHD_queue_response(pr->c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A new preview request of connection c (NULL in the fuzz target), one
 * reference held; freed through its reference count. */
struct preview_req *
preview_req_new(struct sbx_http *h, struct MHD_Connection *c)
{
    struct preview_req *pr = sbx_xcalloc(1, sizeof(*pr));
    pr->kind = HS_PREVIEW;
    pr->h = h;
    pr->c = c;
    pr->refs = 1;
    pr->relay_fd = -1;
    pr->client_sock = -1;
    pr->content_length = -1;
    pr->resp_length = -1;
    pthread_mutex_init(&pr->mu, NULL);
    pthread_cond_init(&pr->cv, NULL);
    sbx_buf_init(&pr->up);
    sbx_buf_init(&pr->down);
    return pr;
}

static enum MHD_Result
start(struct sbx_http *h, struct MHD_Connection *c, const char *url, const char *method,
      void **con_cls, const char *host)
{
    /* MHD passes any request-target on (absolute form, "*", "@host/…"):
     * only a path can follow the upstream's authority (preview_upstream_url). */
    if (url[0] != '/')
        return http_queue_error(c, 400, "VALIDATION_FAILED",
                                "a preview request's target must be a path (origin form)");
    struct preview_req *pr = preview_req_new(h, c);
    *con_cls = pr;
    preview_match(h, host, &pr->port, pr->sandbox, sizeof(pr->sandbox), pr->token,
                  sizeof(pr->token));
    snprintf(pr->method, sizeof(pr->method), "%s", method);
    snprintf(pr->host, sizeof(pr->host), "%s", host);
    sbx_buf t;
    sbx_buf_init(&t);
    sbx_buf_append(&t, url, strlen(url));
    struct query_walk qw = {&t, true};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, collect_query, &qw);
    sbx_buf_append(&t, "", 1);
    pr->target = sbx_buf_steal(&t, NULL);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr) {
        struct sockaddr *sa = ci->client_addr;
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)sa)->sin_addr, pr->client_ip,
                      sizeof(pr->client_ip));
        else if (sa->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)sa)->sin6_addr, pr->client_ip,
                      sizeof(pr->client_ip));
    }
    const char *connection = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Connection");
    const char *upgrade = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Upgrade");
    pr->ws = upgrade && strcasestr(upgrade, "websocket") && connection &&
             strcasestr(connection, "upgrade");
    struct preview_hdr_walk w = {pr, connection, pr->ws};
    MHD_get_connection_values(c, MHD_HEADER_KIND, preview_collect_header, &w);
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
    const char *te = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Transfer-Encoding");
    if (cl)
        pr->content_length = strtoll(cl, NULL, 10);
    pr->has_body = (cl && pr->content_length > 0) || (te && strcasestr(te, "chunked"));
    if (!pr->has_body)
        pr->content_length = -1;

    /* Caps, before a thread or an upstream connection is spent
     * (preview_int.h): one sandbox's stalled service, or one client, cannot
     * take every worker from the others. */
    int same_sandbox = 0, same_client = 0;
    pthread_mutex_lock(&h->mu);
    for (const struct preview_req *o = h->previews; o; o = o->next) {
        same_sandbox += !strcmp(o->sandbox, pr->sandbox);
        same_client += !strcmp(o->client_ip, pr->client_ip);
    }
    bool over = same_sandbox >= PREVIEW_PER_SANDBOX || same_client >= PREVIEW_PER_CLIENT;
    if (!over) {
        pr->next = h->previews;
        h->previews = pr;
    }
    pthread_mutex_unlock(&h->mu);
    if (over)
        return http_queue_error(c, 503, "RESOURCE_BUSY",
                                same_sandbox >= PREVIEW_PER_SANDBOX
                                    ? "too many preview requests in progress for this sandbox"
                                    : "too many preview requests in progress from this client");
    pr->refs++;
    http_worker_enter(h);
    pthread_t t2;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 512 * 1024);
    int rc = pthread_create(&t2, &at, worker_main, pr);
    pthread_attr_destroy(&at);
    if (rc != 0) {
        pr->refs--;
        http_worker_leave(h);
        return http_queue_error(c, 503, "RESOURCE_BUSY", "too many preview requests");
    }
    return MHD_YES;
}

enum MHD_Result
preview_access(struct sbx_http *h, struct MHD_Connection *c, const char *url,
               const char *method, const char *upload_data, size_t *upload_data_size,
               void **con_cls, const char *host)
{
    if (!*con_cls)
        return start(h, c, url, method, con_cls, host);
    struct preview_req *pr = *con_cls;
    enum MHD_Result ret = MHD_YES;
    pthread_mutex_lock(&pr->mu);
    if (upload_data_size && *upload_data_size) {
        if (pr->err_status || pr->cancelled) {
            *upload_data_size = 0; /* the answer is known: drop the body */
        } else if (pr->up.len - pr->up_off >= BUF_HIGH) {
            pr->up_full = true;
            park_conn(pr); /* resumed when curl has taken some */
        } else {
            sbx_buf_append(&pr->up, upload_data, *upload_data_size);
            *upload_data_size = 0;
            pthread_cond_broadcast(&pr->cv);
        }
        pthread_mutex_unlock(&pr->mu);
        return MHD_YES;
    }
    if (!pr->up_done) {
        pr->up_done = true;
        pthread_cond_broadcast(&pr->cv);
    }
    if (!pr->queued && (pr->err_status || pr->head_ready))
        ret = queue_response(pr);
    else if (!pr->queued)
        park_conn(pr);
    pthread_mutex_unlock(&pr->mu);
    return ret;
}

void
preview_completed(void *state)
{
    struct preview_req *pr = state;
    pthread_mutex_lock(&pr->mu);
    pr->cancelled = true;
    pr->suspended = false;
    pthread_cond_broadcast(&pr->cv);
    if (pr->relay_fd >= 0 && !pr->upgraded)
        shutdown(pr->relay_fd, SHUT_RDWR);
    pthread_mutex_unlock(&pr->mu);
    preview_req_unref(pr);
}

void
preview_cancel_all(struct sbx_http *h)
{
    pthread_mutex_lock(&h->mu);
    for (struct preview_req *pr = h->previews; pr; pr = pr->next) {
        pthread_mutex_lock(&pr->mu);
        if (pr->suspended) {
            pr->suspended = false;
            MHD_resume_connection(pr->c);
        }
        pr->cancelled = true;
        pthread_cond_broadcast(&pr->cv);
        if (pr->relay_fd >= 0)
            shutdown(pr->relay_fd, SHUT_RDWR);
        if (pr->client_sock >= 0)
            shutdown(pr->client_sock, SHUT_RDWR);
        pthread_mutex_unlock(&pr->mu);
    }
    pthread_mutex_unlock(&h->mu);
}
