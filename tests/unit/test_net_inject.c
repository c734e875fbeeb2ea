/*
 * test_net_inject.c — credentials stay outside (container/net_int.h,
 * docs/network.md §Credentials stay outside): the injection rules file
 * (what parses, what is refused, its mode check), the strict request-head
 * parser, the rewrite (the sandbox's copies of a rule's field never pass,
 * the rule's value once, one request per connection) and the nft text that
 * sends a sandbox's connections to the proxy.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../container/net.h"
#include "../../container/net_int.h"
#include "../../runtime/err.h"

Test(net_inject, rules_that_parse)
{
    struct sbx_inject_set *s = NULL;
    char why[512] = "";
    const char *text = "# comment\n"
                       "\n"
                       "api.test Authorization: Bearer s3cr3t  \r\n"
                       "  *.svc.test:8080 X-Api-Key:k1\n"
                       "api.test X-Two: a b\tc\n";
    cr_assert_eq(sbx_inject_parse(text, "f", &s, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(s->n, 3);
    cr_expect_str_eq(s->r[0].host.name, "api.test");
    cr_expect_eq(sbx_inject_port(&s->r[0]), 80);
    cr_expect_str_eq(s->r[0].name, "Authorization");
    cr_expect_str_eq(s->r[0].value, "Bearer s3cr3t");
    cr_expect_str_eq(s->r[1].host.name, "*.svc.test");
    cr_expect_eq(sbx_inject_port(&s->r[1]), 8080);
    cr_expect_str_eq(s->r[1].value, "k1");
    cr_expect_str_eq(s->r[2].value, "a b\tc");
    sbx_inject_free(s);
}

Test(net_inject, bad_rules_name_their_line_never_the_value)
{
    const char *bad[] = {
        "api.test\n",                       /* no header */
        "203.0.113.7 X-Key: v\n",           /* an address, not a name */
        "api.test X Key: v\n",              /* no ':' right after the name */
        "api.test X-Key:\n",                /* empty value */
        "api.test : secretvalue\n",         /* empty name */
        "bad..name X-Key: secretvalue\n",   /* not a host name */
        "api.test:99999 X-Key: secretvalue\n",
        "api.test X-Key: sec\x01retvalue\n", /* a control character */
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sbx_inject_set *s = NULL;
        char text[128], why[512] = "";
        snprintf(text, sizeof(text), "# first\n%s", bad[i]);
        cr_expect_eq(sbx_inject_parse(text, "rules.conf", &s, why, sizeof(why)), SBX_E_VALIDATION,
                     "accepted: %s", bad[i]);
        cr_expect(strstr(why, "rules.conf, line 2"), "%s: %s", bad[i], why);
        cr_expect(!strstr(why, "secretvalue") && !strstr(why, "retvalue"), "the value in: %s",
                  why);
        cr_expect_null(s);
    }
}

Test(net_inject, the_file_must_be_readable_by_nobody_else)
{
    char path[] = "/tmp/sbx-inject-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *text = "api.test X-Key: secretvalue\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    struct sbx_inject_set *s = NULL;
    char why[512] = "";
    cr_assert_eq(chmod(path, 0644), 0);
    cr_expect_eq(sbx_inject_load(path, &s, why, sizeof(why)), SBX_E_VALIDATION);
    cr_expect(strstr(why, "readable by nobody else") && strstr(why, "644"), "%s", why);
    cr_assert_eq(chmod(path, 0600), 0);
    cr_assert_eq(sbx_inject_load(path, &s, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(s->n, 1);
    sbx_inject_free(s);
    unlink(path);
    cr_expect_eq(sbx_inject_load(path, &s, why, sizeof(why)), SBX_E_VALIDATION);
}

Test(net_inject, heads_that_parse)
{
    struct sbx_http_head h;
    const char *req = "GET /v1/x?y=1 HTTP/1.1\r\nHost: API.test\r\nX-A:b  \r\nEmpty:\r\n\r\nBODY";
    int n = sbx_http_head_parse(req, strlen(req), &h);
    cr_assert_eq(n, (int)(strstr(req, "BODY") - req));
    cr_expect_eq(h.method_len, 3);
    cr_expect_eq(h.target_len, strlen("/v1/x?y=1"));
    cr_expect_eq(h.minor, 1);
    cr_assert_eq(h.nfields, 3);
    cr_expect(!strncmp(h.fields[1].value, "b", h.fields[1].value_len) &&
              h.fields[1].value_len == 1);
    cr_expect_eq(h.fields[2].value_len, 0);
    int cnt;
    const struct sbx_http_field *f = sbx_http_field_get(&h, "HOST", &cnt);
    cr_expect(f && cnt == 1 && f->value_len == 8);
    /* Incomplete: 0, at every prefix. */
    for (size_t i = 0; i < (size_t)n; i++)
        cr_expect_eq(sbx_http_head_parse(req, i, &h), 0, "prefix %zu", i);
}

Test(net_inject, heads_that_are_refused)
{
    const char *bad[] = {
        "GET / HTTP/1.1\nHost: a\r\n\r\n",          /* bare LF */
        "GET / HTTP/1.1\r\nHost: a\rX\r\n\r\n",      /* bare CR */
        "GET / HTTP/1.1\r\n Host: a\r\n\r\n",        /* obs-fold */
        "GET / HTTP/1.1\r\nHost : a\r\n\r\n",        /* space before ':' */
        "GET / HTTP/2.0\r\nHost: a\r\n\r\n",         /* not 1.x */
        "GET  / HTTP/1.1\r\nHost: a\r\n\r\n",        /* two spaces */
        "GET / HTTP/1.1\r\nHost: a\x01\r\n\r\n",     /* a control in a value */
        "G(T / HTTP/1.1\r\n\r\n",                    /* not a token */
        "GET / HTTP/1.1\r\nNoColon\r\n\r\n",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sbx_http_head h;
        cr_expect_eq(sbx_http_head_parse(bad[i], strlen(bad[i]), &h), -EBADMSG, "%zu", i);
    }
    /* Too many fields, too long. */
    size_t cap = SBX_HTTP_HEAD_MAX + 64;
    char *big = malloc(cap);
    strcpy(big, "GET / HTTP/1.1\r\n");
    for (int i = 0; i <= SBX_HTTP_FIELDS_MAX; i++)
        strcat(big, "A: b\r\n");
    strcat(big, "\r\n");
    struct sbx_http_head h;
    cr_expect_eq(sbx_http_head_parse(big, strlen(big), &h), -E2BIG);
    memset(big, 'a', 9000);
    memcpy(big, "GET /", 5);
    strcpy(big + 9000, " HTTP/1.1\r\n\r\n");
    cr_expect_eq(sbx_http_head_parse(big, strlen(big), &h), -EBADMSG, "a target over 8 KiB");
    strcpy(big, "GET / HTTP/1.1\r\nX: ");
    memset(big + strlen(big), 'v', SBX_HTTP_HEAD_MAX);
    cr_expect_eq(sbx_http_head_parse(big, SBX_HTTP_HEAD_MAX, &h), -E2BIG);
    free(big);
}

Test(net_inject, rewrite_replaces_the_sandbox_copies)
{
    const char *req = "POST /p HTTP/1.1\r\nHost: api.test\r\nauthorization: stolen?\r\n"
                      "Connection: keep-alive\r\nContent-Length: 2\r\nAUTHORIZATION:x\r\n\r\n";
    struct sbx_http_head h;
    cr_assert_gt(sbx_http_head_parse(req, strlen(req), &h), 0);
    const char *names[] = {"Authorization"}, *values[] = {"Bearer s3cr3t"};
    size_t len = 0;
    char *out = sbx_http_rewrite(&h, names, values, 1, true, &len);
    cr_assert_not_null(out);
    char *s = strndup(out, len);
    cr_expect_str_eq(s, "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2\r\n"
                        "Authorization: Bearer s3cr3t\r\nConnection: close\r\n\r\n");
    /* It parses again, with the value once. */
    struct sbx_http_head h2;
    cr_expect_eq(sbx_http_head_parse(s, len, &h2), (int)len);
    int cnt;
    sbx_http_field_get(&h2, "authorization", &cnt);
    cr_expect_eq(cnt, 1);
    free(out);
    free(s);
    /* Without add: the copies still go, nothing comes in. */
    out = sbx_http_rewrite(&h, names, values, 1, false, &len);
    s = strndup(out, len);
    cr_expect(!strcasestr(s, "authorization") && strstr(s, "Connection: close"), "%s", s);
    free(out);
    free(s);
}

static long
at(const char *hay, const char *needle)
{
    const char *p = strstr(hay, needle);
    return p ? p - hay : -1;
}

Test(net_inject, nft_text)
{
    struct sbx_net_policy *p = calloc(1, sizeof(*p));
    struct sbx_net_buf b = {0};
    sbx_net_render_slot(&b, 9, 0x0a580013u, p, true);
    cr_expect(at(b.p, "add rule inet sbx pr9 meta l4proto tcp ip daddr . tcp dport @ij9 dnat ip "
                      "to 169.254.0.53:80") >= 0, "%s", b.p);
    cr_expect(at(b.p, "add element inet sbx pre_sb { \"s9\" : jump pr9 }") >= 0, "%s", b.p);
    free(b.p);
    struct sbx_net_buf r = {0};
    sbx_net_render_router(&r, "10.88.0.0/16", true);
    long hard = at(r.p, "ip daddr @hard4 return"), priv = at(r.p, "ip daddr @priv4 return"),
         vmap = at(r.p, "iifname vmap @pre_sb");
    cr_expect(hard >= 0 && hard < priv && priv < vmap, "denied ranges before the proxy: %s", r.p);
    cr_expect(at(r.p, "tcp dport 80 ct status dnat accept") >= 0, "%s", r.p);
    free(r.p);
    struct sbx_net_buf r2 = {0};
    sbx_net_render_router(&r2, "10.88.0.0/16", false);
    cr_expect(at(r2.p, "pre_sb") < 0 && at(r2.p, "dport 80") < 0, "%s", r2.p);
    free(r2.p);
    free(p);
}
