/*
 * fuzz_preview.c — preview URLs (gateway/preview.c, linked; reached through
 * gateway/preview_int.h): what a client sends and what a sandbox's service
 * answers, which is tenant-controlled.
 *
 *  - preview_match: the Host header, {port}-{id}-{token}.{domain};
 *  - preview_upstream_url: the URL libcurl is given for a request-target;
 *  - preview_collect_header: the client's request headers forwarded upstream;
 *  - preview_on_header: the upstream's response head, line by line as libcurl's
 *    header callback gets it (each line with its line end);
 *  - preview_proxy_ws: the upstream's answer to a WebSocket upgrade, read from a
 *    socketpair standing in for the relay.
 *
 * Input: byte 0 picks the parser, byte 1 is a flag (domain / ws / port),
 * the rest is a host name, a target, "Name: value" lines, or bytes.
 *
 * Properties:
 *  - a host matches iff it is {4-5 digit port}-{id}-{token}.{domain} (the
 *    configured domain, optionally with a port, or any), and then the port
 *    is 1-65535, the ID passes sbx_id_check and the token is 1-63 bytes of
 *    [a-z0-9_];
 *  - a target gives a URL iff it starts with '/', and libcurl reads that
 *    URL's host as "<generation>.<id>", its port as the port, and no user:
 *    no target can point the request at another sandbox;
 *  - forwarded request headers are exactly the client's, less Host,
 *    Content-Length, Expect, X-Forwarded-*, Forwarded, X-Sbx-*, hop-by-hop
 *    fields (Upgrade kept for a WebSocket) and the fields its Connection
 *    header names (options separated by ',' and SP or HTAB, in its first
 *    KiB);
 *  - when a head completes (a line that is only CRLF or LF after a final
 *    status line), its status is that line's three digits (502 when it has
 *    none), and the headers passed on are the head's fields (lines with a
 *    named field) in order less Content-Length, hop-by-hop fields and those
 *    its Connection fields name, each one line without CR or LF;
 *  - a WebSocket answer's head is treated alike (a 101 keeps Upgrade); the
 *    bytes read with it are a prefix of what follows it (a refusal's body);
 *    a head without an end or beyond 64 KiB is a 502.
 */
#include <ctype.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "../../gateway/preview_int.h"

#include "fuzz.h"

static struct sbx_http H;

static void
setup(void)
{
    static bool done;
    if (done)
        return;
    pthread_mutex_init(&H.mu, NULL);
    pthread_cond_init(&H.cv, NULL);
    done = true;
}

static struct preview_req *
fake_preq(void)
{
    return preview_req_new(&H, NULL);
}

/* Whether name (n bytes) is listed in connection (options separated by ','
 * and OWS; the first PREVIEW_CONN_OPTIONS_MAX bytes count) — the reference for
 * hop_by_hop's second half. */
static bool
named_in(const char *connection, const char *name, size_t n)
{
    if (!connection)
        return false;
    char *c = sbx_xstrndup(connection, strnlen(connection, PREVIEW_CONN_OPTIONS_MAX)), *save = NULL;
    bool found = false;
    for (char *t = strtok_r(c, ", \t", &save); t && !found; t = strtok_r(NULL, ", \t", &save))
        found = strlen(t) == n && !strncasecmp(t, name, n);
    free(c);
    return found;
}

static bool
fixed_hop(const char *name, size_t n)
{
    static const char *const hop[] = {"connection", "keep-alive", "proxy-connection", "te",
                                      "trailer", "transfer-encoding", "upgrade",
                                      "proxy-authenticate", "proxy-authorization"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(hop); i++)
        if (strlen(hop[i]) == n && !strncasecmp(name, hop[i], n))
            return true;
    return false;
}

/* ------------------------------------------------------------------------------ */
/* Host names. */

static void
fuzz_host(const char *host, int which)
{
    static const char *const domains[] = {NULL, "localhost:7780", "sbx.example.com"};
    const char *domain = domains[which % 3];
    H.preview_domain = (char *)domain;
    int port = -1;
    char id[SBX_ID_MAX + 2] = "", tok[72] = "";
    bool got = preview_match(&H, host, &port, id, sizeof(id), tok, sizeof(tok));
    H.preview_domain = NULL;

    /* The reference: the shape, piece by piece. */
    bool want = false;
    size_t n = strlen(host);
    char *low = sbx_xstrdup(host);
    for (char *p = low; *p; p++)
        *p = (char)tolower((unsigned char)*p);
    char *dot = strchr(low, '.');
    int wport = 0;
    char *wid = NULL, *wtok = NULL;
    if (n && n < 256 && dot && dot[1]) {
        *dot = 0;
        const char *rest = dot + 1;
        size_t dl = domain ? strlen(domain) : 0;
        bool dom = !domain || !strcasecmp(rest, domain) ||
                   (!strchr(domain, ':') && !strncasecmp(rest, domain, dl) && rest[dl] == ':');
        char *first = strchr(low, '-'), *last = strrchr(low, '-');
        if (dom && first && last > first + 1 && last[1]) {
            size_t pl = (size_t)(first - low), tl = strlen(last + 1);
            bool ok = pl >= 4 && pl <= 5 && tl <= 63;
            for (size_t i = 0; ok && i < pl; i++)
                ok = isdigit((unsigned char)low[i]);
            for (size_t i = 0; ok && i < tl; i++) {
                char c = last[1 + i];
                ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_';
            }
            char why[160];
            *last = 0;
            ok = ok && sbx_id_check(first + 1, strlen(first + 1), why, sizeof(why)) == 0;
            wport = ok ? atoi(low) : 0;
            want = ok && wport >= 1 && wport <= 65535;
            wid = first + 1;
            wtok = last + 1;
        }
    }
    FUZZ_CHECK(got == want, "'%s' %s (domain %s)", host, got ? "matched" : "did not match",
               domain ? domain : "any");
    if (got) {
        char why[160];
        FUZZ_CHECK(port == wport && port >= 1 && port <= 65535, "port %d", port);
        FUZZ_CHECK(!strcmp(id, wid) && sbx_id_check(id, strlen(id), why, sizeof(why)) == 0,
                   "id '%s'", id);
        FUZZ_CHECK(!strcmp(tok, wtok), "token '%s'", tok);
    }
    free(low);
}

/* ------------------------------------------------------------------------------ */
/* The upstream URL: two bytes of generation, the target. */

static void
fuzz_url(const uint8_t *d, size_t n, int port)
{
    if (n < 2)
        return;
    uint64_t gen = (uint64_t)d[0] << 8 | d[1];
    char *target = fuzz_cstr(d + 2, n - 2);
    if (port < 1)
        port = 1;
    static const char id[] = "user-42";
    char *url = preview_upstream_url(gen, id, port, target);
    FUZZ_CHECK(!url == (target[0] != '/'), "target '%s' %s", target,
               url ? "accepted" : "refused");
    if (url) {
        /* libcurl's own reading (the flags curl_easy_perform parses with). */
        CURLU *u = curl_url();
        if (curl_url_set(u, CURLUPART_URL, url, CURLU_GUESS_SCHEME | CURLU_NON_SUPPORT_SCHEME) ==
            CURLUE_OK) {
            char *host = NULL, *pstr = NULL, *user = NULL, want[64];
            snprintf(want, sizeof(want), "%llu.%s", (unsigned long long)gen, id);
            curl_url_get(u, CURLUPART_HOST, &host, 0);
            curl_url_get(u, CURLUPART_PORT, &pstr, 0);
            curl_url_get(u, CURLUPART_USER, &user, 0);
            FUZZ_CHECK(host && !strcmp(host, want), "'%s' reaches host '%s'", url,
                       host ? host : "(none)");
            FUZZ_CHECK(pstr && atoi(pstr) == port, "'%s' reaches port %s", url,
                       pstr ? pstr : "(none)");
            FUZZ_CHECK(!user, "'%s' has a user '%s'", url, user);
            curl_free(host);
            curl_free(pstr);
            curl_free(user);
        }
        curl_url_cleanup(u);
    }
    free(url);
    free(target);
}

/* ------------------------------------------------------------------------------ */
/* Request headers: "Name: value" lines (MHD's pairs: value without leading
 * blanks). */

struct pair {
    char *key, *value;
};

static size_t
pairs_of(char *text, struct pair *p, size_t max)
{
    size_t n = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line && n < max;
         line = strtok_r(NULL, "\n", &save)) {
        char *colon = strchr(line, ':');
        if (!colon || colon == line)
            continue;
        *colon = 0;
        char *v = colon + 1;
        while (*v == ' ' || *v == '\t')
            v++;
        p[n].key = line;
        p[n++].value = v;
    }
    return n;
}

static void
fuzz_request_headers(char *text, bool ws)
{
    struct pair p[64];
    size_t n = pairs_of(text, p, 64);
    const char *connection = NULL;
    for (size_t i = 0; i < n && !connection; i++)
        if (!strcasecmp(p[i].key, "Connection"))
            connection = p[i].value; /* MHD_lookup_connection_value: the first */
    struct preview_req *pr = fake_preq();
    struct preview_hdr_walk w = {pr, connection, ws};
    for (size_t i = 0; i < n; i++)
        preview_collect_header(&w, MHD_HEADER_KIND, p[i].key, p[i].value);
    struct curl_slist *l = pr->req_hdrs;
    for (size_t i = 0; i < n; i++) {
        const char *k = p[i].key;
        size_t kl = strlen(k);
        bool drop = !strcasecmp(k, "Host") || !strcasecmp(k, "Content-Length") ||
                    !strcasecmp(k, "Expect") || !strncasecmp(k, "X-Forwarded-", 12) ||
                    !strcasecmp(k, "Forwarded") || !strncasecmp(k, "X-Sbx-", 6) ||
                    ((fixed_hop(k, kl) || named_in(connection, k, kl)) &&
                     !(ws && !strcasecmp(k, "Upgrade"))) ||
                    kl + 2 + strlen(p[i].value) >= 8192;
        if (drop)
            continue;
        FUZZ_CHECK(l, "'%s' was not forwarded", k);
        char want[8192];
        snprintf(want, sizeof(want), "%s: %s", k, p[i].value);
        FUZZ_CHECK(!strcmp(l->data, want), "forwarded '%s', want '%s'", l->data, want);
        l = l->next;
    }
    FUZZ_CHECK(!l, "'%s' forwarded and not asked for", l->data);
    preview_req_unref(pr);
}

/* ------------------------------------------------------------------------------ */
/* The upstream's head. */

/* The fields a complete head must pass on: lines[from..to) are its lines
 * after the status line, each cut at `cut` bytes by the parser. */
static void
check_head(struct preview_req *pr, char **lines, size_t from, size_t to, bool keep_upgrade,
           size_t cut)
{
    char *conn = NULL;
    for (size_t i = from; i < to; i++) {
        size_t kl = strcspn(lines[i], ":");
        if (lines[i][kl] && kl == 10 && !strncasecmp(lines[i], "Connection", 10))
            preview_add_connection(&conn, lines[i] + kl + 1);
    }
    struct curl_slist *l = pr->resp_hdrs;
    for (size_t i = from; i < to; i++) {
        const char *f = lines[i];
        size_t kl = strcspn(f, ":");
        if (!f[kl] || !kl || kl >= cut || (kl == 14 && !strncasecmp(f, "Content-Length", 14)) ||
            ((fixed_hop(f, kl) || named_in(conn, f, kl)) &&
             !(keep_upgrade && kl == 7 && !strncasecmp(f, "Upgrade", 7))))
            continue;
        FUZZ_CHECK(l, "field '%s' was not passed on", f);
        FUZZ_CHECK(!strncmp(l->data, f, cut) && strlen(l->data) == SBX_MIN(strlen(f), cut),
                   "passed on '%.200s', want '%.200s'", l->data, f);
        l = l->next;
    }
    FUZZ_CHECK(!l, "'%s' passed on and not in the head", l->data);
    for (l = pr->resp_hdrs; l; l = l->next)
        FUZZ_CHECK(!strpbrk(l->data, "\r\n"), "CR or LF in a field");
    free(conn);
}

/* The expected status of a status line (n raw bytes): the three digits
 * after its first space, else 502. */
static int
want_status(const char *line, size_t n)
{
    const char *sp = memchr(line, ' ', n);
    size_t k = sp ? n - (size_t)(sp + 1 - line) : 0;
    int st = 0;
    for (size_t i = 0; i < 3; i++) {
        if (i >= k || !isdigit((unsigned char)sp[1 + i]))
            return 502;
        st = st * 10 + (sp[1 + i] - '0');
    }
    if (k > 3 && isdigit((unsigned char)sp[4]))
        return 502;
    return st >= 100 ? st : 502;
}

static void check_cookie(const char *value);

static void
fuzz_response_head(const uint8_t *d, size_t n)
{
    struct preview_req *pr = fake_preq();
    /* Lines as curl delivers them: each with its LF (an unterminated tail
     * never comes); the reference keeps them without CR/LF, cut at the first
     * CR or LF as preview_on_header does. */
    char **lines = sbx_xcalloc(n + 1, sizeof(*lines));
    size_t nl = 0, status_at = 0;
    int status = 0;
    bool checked = false;
    for (size_t off = 0; off < n;) {
        const uint8_t *lf = memchr(d + off, '\n', n - off);
        if (!lf)
            break;
        size_t len = (size_t)(lf - (d + off)) + 1;
        char *line = fuzz_copy(d + off, len); /* exact: ASan sees over-reads */
        FUZZ_CHECK(preview_on_header(line, 1, len, pr) == len, "line refused");
        bool blank = (len == 2 && line[0] == '\r') || len == 1;
        lines[nl] = fuzz_cstr(line, len);
        lines[nl][strcspn(lines[nl], "\r\n")] = 0;
        if (len >= 5 && !memcmp(line, "HTTP/", 5)) {
            status = want_status(line, len);
            status_at = nl + 1;
            FUZZ_CHECK(pr->status == status, "status %d, want %d", pr->status, status);
        } else if (!checked && blank && pr->head_ready) {
            FUZZ_CHECK(status >= 200 || status == 101, "head %d complete", status);
            check_head(pr, lines, status_at, nl, false, 8191);
            checked = true;
        } else if (!checked) {
            FUZZ_CHECK(!pr->head_ready, "head complete at '%s'", lines[nl]);
        }
        free(line);
        nl++;
        off += len;
    }
    for (size_t i = 0; i < nl; i++) {
        if (!strncasecmp(lines[i], "Set-Cookie:", 11))
            check_cookie(lines[i] + 11);
        free(lines[i]);
    }
    free(lines);
    preview_req_unref(pr);
}

/* preview_cookie_host_only on a Set-Cookie value: the name=value pair is
 * kept, no attribute named Domain is left, every other attribute is kept
 * in order, and a second pass changes nothing. */
static void
check_cookie(const char *value)
{
    char *v = sbx_xstrdup(value);
    size_t n0 = strlen(v), pair = strcspn(v, ";");
    preview_cookie_host_only(v);
    FUZZ_CHECK(strlen(v) <= n0 && !strncmp(v, value, pair), "the pair changed: '%s' -> '%s'",
               value, v);
    size_t kept = 0;
    for (const char *r = value + pair; *r == ';';) {
        size_t seg = 1 + strcspn(r + 1, ";");
        const char *a = r + 1 + strspn(r + 1, " \t");
        size_t an = strcspn(a, "=;");
        while (an && (a[an - 1] == ' ' || a[an - 1] == '\t'))
            an--;
        bool domain = an == 6 && !strncasecmp(a, "Domain", 6);
        if (!domain) {
            FUZZ_CHECK(!strncmp(v + pair + kept, r, seg), "attribute '%.*s' lost in '%s'",
                       (int)seg, r, v);
            kept += seg;
        }
        r += seg;
    }
    FUZZ_CHECK(strlen(v) == pair + kept, "'%s' -> '%s': extra bytes", value, v);
    char *again = sbx_xstrdup(v);
    preview_cookie_host_only(again);
    FUZZ_CHECK(!strcmp(again, v), "not idempotent: '%s' -> '%s'", v, again);
    free(again);
    free(v);
}

/* The answer to a WebSocket upgrade: bytes from the relay. */
static void
fuzz_ws_answer(const uint8_t *d, size_t n)
{
    if (n > (96u << 10))
        return;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    int big = 1 << 20;
    setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    if (sbx_write_full(sv[1], d, n) != 0)
        abort();
    shutdown(sv[1], SHUT_WR);
    struct preview_req *pr = fake_preq();
    snprintf(pr->method, sizeof(pr->method), "GET");
    pr->target = sbx_xstrdup("/ws");
    pr->port = 8080;
    pr->ws = true;
    pr->relay_fd = sv[0];
    pr->cancelled = true; /* no MHD side: a 101 does not wait for the upgrade */
    preview_proxy_ws(pr);
    const char *end = memmem(d, n, "\r\n\r\n", 4);
    size_t hl = end ? (size_t)(end - (const char *)d) + 4 : 0;
    /* The head is read 4 KiB at a time until its end or 64 KiB. */
    if (!end || hl > PREVIEW_HEAD_MAX + 4096)
        FUZZ_CHECK(pr->err_status == 502, "a head of %zu bytes: %d", hl, pr->err_status);
    else if (hl <= PREVIEW_HEAD_MAX)
        FUZZ_CHECK(pr->err_status == 0, "a head of %zu bytes: %d", hl, pr->err_status);
    if (!pr->err_status) {
        FUZZ_CHECK(end, "a head without an end accepted");
        /* The reference: the head's lines as preview_proxy_ws splits them. */
        char *head = fuzz_cstr(d, hl - 4), *save = NULL;
        char **lines = sbx_xcalloc(hl + 1, sizeof(*lines));
        size_t nl = 0;
        for (char *l = strtok_r(head, "\r\n", &save); l; l = strtok_r(NULL, "\r\n", &save))
            lines[nl++] = l;
        size_t l1 = (size_t)((const char *)memmem(d, hl, "\r\n", 2) - (const char *)d);
        FUZZ_CHECK(pr->status == want_status((const char *)d, l1), "status %d for '%.*s'",
                   pr->status, (int)l1, d);
        /* A line without a colon is skipped; the first is the status line. */
        size_t k = 0;
        for (size_t i = 1; i < nl; i++)
            if (strchr(lines[i], ':') > lines[i])
                lines[k++] = lines[i];
        check_head(pr, lines, 0, k, pr->status == 101, SIZE_MAX);
        /* Bytes read along with the head (the rest stays in the socket for
         * the pump; a refusal's body is what came with its head). */
        FUZZ_CHECK(pr->nextra <= n - hl && !memcmp(pr->extra, d + hl, pr->nextra),
                   "bytes after the head");
        if (pr->status != 101)
            FUZZ_CHECK(pr->down.len == pr->nextra && pr->resp_length == (int64_t)pr->nextra &&
                           pr->down_done,
                       "a refusal's body");
        free(lines);
        free(head);
    }
    close(sv[1]);
    preview_req_unref(pr); /* closes sv[0] */
}

/* ------------------------------------------------------------------------------ */

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > (128u << 10))
        return 0;
    setup();
    /* Bounds per parser keep large inputs for the parsers they matter to (a
     * line past 8 KiB, a WebSocket head past 64 KiB). */
    static const size_t max[] = {1024, 16u << 10, 16u << 10, 24u << 10, 128u << 10};
    if (size - 2 > max[data[0] % 5])
        return 0;
    switch (data[0] % 5) {
    case 0: {
        char *s = fuzz_cstr(data + 2, size - 2);
        fuzz_host(s, data[1]);
        free(s);
        break;
    }
    case 1: fuzz_url(data + 2, size - 2, data[1] * 257); break;
    case 2: {
        char *s = fuzz_cstr(data + 2, size - 2);
        fuzz_request_headers(s, data[1] & 1);
        free(s);
        break;
    }
    case 3: fuzz_response_head(data + 2, size - 2); break;
    default: fuzz_ws_answer(data + 2, size - 2); break;
    }
    return 0;
}
