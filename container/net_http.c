/*
 * net_http.c — the strict HTTP/1.x request-head parser and rewriter of the
 * egress point's header injection (net_int.h; docs/network.md §Credentials
 * stay outside).
 *
 * Why a hand parser: Debian packages no maintained request parser for C
 * (libhttp-parser 2.9 is nodejs/http-parser, archived upstream in favour of
 * llhttp, which Debian does not package; libmicrohttpd is a server).  The
 * proxy needs only the head, which it holds whole in one buffer, so the
 * parser is a single pass over RFC 9112's grammar, narrowed: whatever it
 * does not understand is refused (the proxy answers 400), never guessed at.
 * tests/fuzz/fuzz_egress_head.c fuzzes it.
 *
 *   request-line = method SP request-target SP HTTP-version CRLF
 *   method       = 1*16 tchar
 *   target       = 1*8192 (%x21-7E)
 *   HTTP-version = "HTTP/1.0" / "HTTP/1.1"
 *   field-line   = field-name ":" OWS field-value OWS CRLF
 *   field-name   = 1*256 tchar
 *   field-value  = *( %x21-7E / %x80-FF / SP / HTAB )
 *
 * Refused: a bare LF, a CR not followed by LF, NUL and other controls, a
 * line folded onto the previous one (obs-fold), a space before the colon,
 * more than SBX_HTTP_FIELDS_MAX fields, a head over SBX_HTTP_HEAD_MAX.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "net_int.h"

static bool
tchar(unsigned char c)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The end of the line that starts at p (the CR of its CRLF), or NULL when
 * the buffer ends first; *bad when a line has a bare CR or LF. */
static const char *
line_end(const char *p, const char *end, bool *bad)
{
    for (const char *q = p; q < end; q++) {
        if (*q == '\n') {
            *bad = true;
            return NULL;
        }
        if (*q == '\r') {
            if (q + 1 == end)
                return NULL;
            if (q[1] != '\n')
                *bad = true;
            return *bad ? NULL : q;
        }
    }
    return NULL;
}

int
sbx_http_head_parse(const char *buf, size_t len, struct sbx_http_head *h)
{
    memset(h, 0, sizeof(*h));
    const char *p = buf, *end = buf + (len > SBX_HTTP_HEAD_MAX ? SBX_HTTP_HEAD_MAX : len);
    bool bad = false;
    const char *e = line_end(p, end, &bad);
    if (!e)
        return bad ? -EBADMSG : len >= SBX_HTTP_HEAD_MAX ? -E2BIG : 0;
    /* The request line. */
    const char *s = p;
    while (s < e && tchar((unsigned char)*s))
        s++;
    if (s == p || s - p > 16 || s == e || *s != ' ')
        return -EBADMSG;
    h->method = p;
    h->method_len = (size_t)(s - p);
    const char *t = ++s;
    while (s < e && (unsigned char)*s > 0x20 && (unsigned char)*s < 0x7f)
        s++;
    if (s == t || s - t > 8192 || s == e || *s != ' ')
        return -EBADMSG;
    h->target = t;
    h->target_len = (size_t)(s - t);
    s++;
    if (e - s != 8 || memcmp(s, "HTTP/1.", 7) != 0 || (s[7] != '0' && s[7] != '1'))
        return -EBADMSG;
    h->minor = s[7] - '0';
    p = e + 2;
    /* The fields, up to the empty line. */
    for (;;) {
        if ((e = line_end(p, end, &bad)) == NULL)
            return bad ? -EBADMSG : len >= SBX_HTTP_HEAD_MAX ? -E2BIG : 0;
        if (e == p)
            break;
        if (h->nfields == SBX_HTTP_FIELDS_MAX)
            return -E2BIG;
        s = p;
        while (s < e && tchar((unsigned char)*s))
            s++;
        if (s == p || s - p > 256 || s == e || *s != ':')
            return -EBADMSG; /* obs-fold, space before ':', no ':' */
        struct sbx_http_field *f = &h->fields[h->nfields++];
        f->name = p;
        f->name_len = (size_t)(s - p);
        s++;
        while (s < e && (*s == ' ' || *s == '\t'))
            s++;
        const char *v = s, *ve = e;
        for (; s < e; s++)
            if (((unsigned char)*s < 0x20 && *s != '\t') || *s == 0x7f)
                return -EBADMSG;
        while (ve > v && (ve[-1] == ' ' || ve[-1] == '\t'))
            ve--;
        f->value = v;
        f->value_len = (size_t)(ve - v);
        p = e + 2;
    }
    h->head_len = (size_t)(e + 2 - buf);
    return (int)h->head_len;
}

const struct sbx_http_field *
sbx_http_field_get(const struct sbx_http_head *h, const char *name, int *count)
{
    const struct sbx_http_field *first = NULL;
    size_t n = strlen(name);
    *count = 0;
    for (int i = 0; i < h->nfields; i++)
        if (h->fields[i].name_len == n && strncasecmp(h->fields[i].name, name, n) == 0) {
            if (!first)
                first = &h->fields[i];
            (*count)++;
        }
    return first;
}

/* Fields the proxy never passes on from the sandbox when it injects: the
 * hop-by-hop ones it replaces by "Connection: close". */
static const char *const hop[] = {"connection", "keep-alive", "proxy-connection", "te",
                                  "upgrade", NULL};

static void
put(char **o, const char *s, size_t n)
{
    memcpy(*o, s, n);
    *o += n;
}

char *
sbx_http_rewrite(const struct sbx_http_head *h, const char *const *names,
                 const char *const *values, int n, bool add, size_t *outlen)
{
    size_t cap = h->head_len + (size_t)h->nfields + 32; /* "name:v" becomes "name: v" */
    for (int i = 0; i < n; i++)
        cap += strlen(names[i]) + strlen(values[i]) + 4;
    char *out = malloc(cap), *o = out;
    if (!out)
        return NULL;
    /* The request line as it was: it ends where the first field starts. */
    const char *first = h->nfields ? h->fields[0].name : h->target + h->target_len + 11;
    put(&o, h->method, (size_t)(first - h->method));
    for (int i = 0; i < h->nfields; i++) {
        const struct sbx_http_field *f = &h->fields[i];
        bool drop = false;
        for (int j = 0; hop[j] && !drop; j++)
            drop = f->name_len == strlen(hop[j]) && !strncasecmp(f->name, hop[j], f->name_len);
        for (int j = 0; j < n && !drop; j++)
            drop = f->name_len == strlen(names[j]) && !strncasecmp(f->name, names[j], f->name_len);
        if (drop)
            continue;
        put(&o, f->name, f->name_len);
        put(&o, ": ", 2);
        put(&o, f->value, f->value_len);
        put(&o, "\r\n", 2);
    }
    for (int j = 0; j < n && add; j++) {
        put(&o, names[j], strlen(names[j]));
        put(&o, ": ", 2);
        put(&o, values[j], strlen(values[j]));
        put(&o, "\r\n", 2);
    }
    put(&o, "Connection: close\r\n\r\n", 21);
    *outlen = (size_t)(o - out);
    /* What this parser refuses the upstream gets neither: a head at the
     * limits grows by the added fields and a space per field (fuzz_egress_head
     * found one of 100 fields whose rewrite no longer parsed). */
    int nout = 1;
    for (const char *q = out; q + 1 < o; q++)
        nout += q[0] == '\r' && q[1] == '\n';
    nout -= 3; /* the request line's, Connection's and the blank line's ends */
    if (*outlen > SBX_HTTP_HEAD_MAX || nout > SBX_HTTP_FIELDS_MAX) {
        explicit_bzero(out, *outlen);
        free(out);
        errno = E2BIG;
        return NULL;
    }
    return out;
}
