/*
 * fuzz_egress_head.c — what a sandbox sends the egress point's injecting
 * proxy (container/net_http.c, net_proxy.c; reached through
 * container/net_int.h): the request head, and the deployment's injection
 * rules file.
 *
 * Input: byte 0 picks the parser (even: a request head; odd: a rules file),
 * the rest is the text.
 *
 * Properties:
 *  - a head parse returns 0 (incomplete), -EBADMSG, -E2BIG or the head's
 *    length n ≤ the input's, SBX_HTTP_HEAD_MAX at most, ending in
 *    CRLF CRLF; then the method is 1-16 token characters, the target 1-8192
 *    visible ASCII bytes, each field name token characters and no value has
 *    CR, LF or NUL; the first n bytes alone parse to n again;
 *  - its rewrite with an injected Authorization parses again to its whole
 *    length, with exactly one Authorization field (the injected value),
 *    exactly one Connection field ("close"), no Keep-Alive, TE, Upgrade or
 *    Proxy-Connection, and every other field of the original in order;
 *  - a rules file parses, or fails with a reason naming its line; each
 *    accepted rule has a token header name and a non-empty value without
 *    CR, LF or NUL.
 */
#include <errno.h>
#include <strings.h>

#include "../../container/net_int.h"
#include "fuzz.h"

static bool
tok(const char *s, size_t n)
{
    if (n == 0)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              (c && strchr("!#$%&'*+-.^_`|~", c))))
            return false;
    }
    return true;
}

static bool
named(const struct sbx_http_field *f, const char *name)
{
    return f->name_len == strlen(name) && strncasecmp(f->name, name, f->name_len) == 0;
}

static void
head(const char *buf, size_t n)
{
    static struct sbx_http_head h, h2;
    int rc = sbx_http_head_parse(buf, n, &h);
    FUZZ_CHECK(rc == 0 || rc == -EBADMSG || rc == -E2BIG || rc > 0, "rc %d", rc);
    if (rc <= 0)
        return;
    size_t len = (size_t)rc;
    FUZZ_CHECK(len <= n && len <= SBX_HTTP_HEAD_MAX && len >= 4 &&
                   memcmp(buf + len - 4, "\r\n\r\n", 4) == 0,
               "head length %zu of %zu", len, n);
    FUZZ_CHECK(h.method_len >= 1 && h.method_len <= 16 && tok(h.method, h.method_len), "method");
    FUZZ_CHECK(h.target_len >= 1 && h.target_len <= 8192, "target");
    for (size_t i = 0; i < h.target_len; i++)
        FUZZ_CHECK(h.target[i] > 0x20 && h.target[i] < 0x7f, "target byte");
    for (int i = 0; i < h.nfields; i++) {
        FUZZ_CHECK(tok(h.fields[i].name, h.fields[i].name_len), "field name");
        for (size_t j = 0; j < h.fields[i].value_len; j++) {
            char c = h.fields[i].value[j];
            FUZZ_CHECK(c != '\r' && c != '\n' && c != '\0', "value byte");
        }
    }
    char *exact = fuzz_copy(buf, len);
    FUZZ_CHECK(sbx_http_head_parse(exact, len, &h2) == rc, "the head alone");
    free(exact);
    const char *names[] = {"Authorization"}, *values[] = {"Bearer injected"};
    size_t olen = 0;
    errno = 0;
    char *out = sbx_http_rewrite(&h, names, values, 1, true, &olen);
    if (!out) {
        /* Refused only when the rewrite would not parse (too many fields or
         * bytes); anything else is an allocation failure. */
        FUZZ_CHECK(errno == E2BIG, "rewrite");
        return;
    }
    FUZZ_CHECK(sbx_http_head_parse(out, olen, &h2) == (int)olen, "the rewrite parses");
    int nauth = 0, nconn = 0, k = 0;
    for (int i = 0; i < h2.nfields; i++) {
        const struct sbx_http_field *f = &h2.fields[i];
        if (named(f, "authorization")) {
            nauth++;
            FUZZ_CHECK(f->value_len == 15 && !memcmp(f->value, "Bearer injected", 15), "value");
            continue;
        }
        if (named(f, "connection")) {
            nconn++;
            FUZZ_CHECK(f->value_len == 5 && !memcmp(f->value, "close", 5), "connection");
            continue;
        }
        FUZZ_CHECK(!named(f, "keep-alive") && !named(f, "te") && !named(f, "upgrade") &&
                       !named(f, "proxy-connection"),
                   "a hop-by-hop field passed");
        /* The next original field that is kept. */
        while (k < h.nfields &&
               (named(&h.fields[k], "authorization") || named(&h.fields[k], "connection") ||
                named(&h.fields[k], "keep-alive") || named(&h.fields[k], "te") ||
                named(&h.fields[k], "upgrade") || named(&h.fields[k], "proxy-connection")))
            k++;
        FUZZ_CHECK(k < h.nfields && f->name_len == h.fields[k].name_len &&
                       !memcmp(f->name, h.fields[k].name, f->name_len) &&
                       f->value_len == h.fields[k].value_len &&
                       !memcmp(f->value, h.fields[k].value, f->value_len),
                   "field %d is not the original's", i);
        k++;
    }
    FUZZ_CHECK(nauth == 1 && nconn == 1, "authorization %d connection %d", nauth, nconn);
    free(out);
}

static void
rules(const char *text)
{
    struct sbx_inject_set *s = NULL;
    char why[512] = "";
    int rc = sbx_inject_parse(text, "f", &s, why, sizeof(why));
    if (rc) {
        FUZZ_CHECK(s == NULL && strstr(why, "line "), "failure without its line: %s", why);
        return;
    }
    for (int i = 0; i < s->n; i++) {
        FUZZ_CHECK(tok(s->r[i].name, strlen(s->r[i].name)), "rule name");
        FUZZ_CHECK(s->r[i].value[0] && !strpbrk(s->r[i].value, "\r\n"), "rule value");
    }
    sbx_inject_free(s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    if (data[0] & 1) {
        char *t = malloc(size);
        if (!t)
            abort();
        memcpy(t, data + 1, size - 1);
        t[size - 1] = '\0';
        rules(t);
        free(t);
    } else {
        char *b = fuzz_copy(data + 1, size - 1);
        head(b, size - 1);
        free(b);
    }
    return 0;
}
