/*
 * test_net_policy.c — egress rules (container/net.h, docs/network.md §Policy):
 * what parses, what an always-denied range refuses, and the order of a
 * sandbox's nft chain (deny before allow, private allows before the private
 * drop, no allow rule = everything public).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../container/net.h"
#include "../../container/net_int.h"
#include "../../runtime/err.h"

static int
parse(const char *text, struct sbx_net_rule *r, char *why, size_t n)
{
    return sbx_net_rule_parse(text, NULL, r, why, n);
}

Test(net_policy, rules_that_parse)
{
    struct sbx_net_rule r;
    char why[256];
    cr_assert_eq(parse("203.0.113.0/24:443", &r, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(r.addr, 0xcb007100u);
    cr_expect_eq(r.plen, 24);
    cr_expect_eq(r.port, 443);
    cr_assert_eq(parse("198.51.100.7", &r, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(r.plen, 32);
    cr_expect_eq(r.port, 0);
    cr_assert_eq(parse("0.0.0.0/0", &r, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(r.plen, 0);
    /* Private ranges may be named (that is how they are opened). */
    cr_assert_eq(parse("10.1.2.0/24:5432", &r, why, sizeof(why)), 0, "%s", why);
    cr_expect(sbx_net_is_private(&r));
    cr_assert_eq(parse("8.8.8.8:53", &r, why, sizeof(why)), 0, "%s", why);
    cr_expect(!sbx_net_is_private(&r));
}

Test(net_policy, refused_rules_name_themselves)
{
    static const char *const bad[] = {
        "169.254.169.254",  "169.254.0.0/16",  "127.0.0.1:8080", "0.0.0.0/8",
        "224.0.0.251",      "255.255.255.255", "10.88.3.7",      "10.88.0.0/16",
        "fd00:ec2::254",    "[::1]:80",        "1.2.3.4:0",      "1.2.3.4:65536",
        "1.2.3.5/24",       "1.2.3.4/33",      "example.org",    "",
        "1.2.3.4:",         "1.2.3.4/",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct sbx_net_rule r;
        char why[256] = "";
        cr_expect_eq(parse(bad[i], &r, why, sizeof(why)), SBX_E_VALIDATION, "'%s' accepted",
                     bad[i]);
        if (bad[i][0])
            cr_expect(strstr(why, bad[i]) != NULL, "'%s': %s", bad[i], why);
    }
    /* The sandbox range is the deployment's. */
    struct sbx_net_rule r;
    char why[256];
    cr_expect_eq(sbx_net_rule_parse("10.88.3.7", "10.200.0.0/16", &r, why, sizeof(why)), 0, "%s",
                 why);
    cr_expect_eq(sbx_net_rule_parse("10.200.9.0/24", "10.200.0.0/16", &r, why, sizeof(why)),
                 SBX_E_VALIDATION);
}

Test(net_policy, ranges)
{
    uint32_t b;
    uint8_t l;
    cr_expect_eq(sbx_net_range_parse("10.88.0.0/16", &b, &l), 0);
    cr_expect_eq(l, 16);
    cr_expect_eq(sbx_net_range_parse(NULL, &b, &l), 0); /* the default */
    cr_expect_eq(sbx_net_range_parse("10.88.0.0/23", &b, &l), SBX_E_VALIDATION);
    cr_expect_eq(sbx_net_range_parse("10.0.0.0/7", &b, &l), SBX_E_VALIDATION);
    cr_expect_eq(sbx_net_range_parse("10.88.0.1/16", &b, &l), SBX_E_VALIDATION);
}

/* The position of needle in hay, or -1. */
static long
at(const char *hay, const char *needle)
{
    const char *p = strstr(hay, needle);
    return p ? p - hay : -1;
}

Test(net_policy, chain_order)
{
    struct sbx_net_policy p;
    memset(&p, 0, sizeof(p));
    char why[256];
    cr_assert_eq(parse("0.0.0.0/0", &p.allow[p.nallow++], why, sizeof(why)), 0);
    cr_assert_eq(parse("10.1.0.0/16:5432", &p.allow[p.nallow++], why, sizeof(why)), 0);
    cr_assert_eq(parse("203.0.113.9", &p.deny[p.ndeny++], why, sizeof(why)), 0);
    struct sbx_net_buf b = {0};
    sbx_net_render_slot(&b, 7, 0x0a58000fu, &p);
    cr_assert_not_null(b.p);
    long spoof = at(b.p, "so7 ip saddr != 10.88.0.15 drop");
    long hard = at(b.p, "so7 ip daddr @hard4 jump refuse");
    long deny = at(b.p, "so7 ip daddr 203.0.113.9/32 jump refuse");
    long privok = at(b.p, "so7 ip daddr 10.1.0.0/16 meta l4proto { tcp, udp } th dport 5432");
    long priv = at(b.p, "so7 ip daddr @priv4 jump refuse");
    long all = at(b.p, "so7 ip daddr 0.0.0.0/0 counter");
    long last = at(b.p, "so7 jump refuse");
    cr_expect(spoof >= 0 && spoof < hard && hard < deny && deny < privok && privok < priv &&
                  priv < all && all < last,
              "order: spoof %ld hard %ld deny %ld privok %ld priv %ld all %ld last %ld\n%s", spoof,
              hard, deny, privok, priv, all, last, b.p);
    cr_expect(at(b.p, "add element inet sbx from_sb { \"s7\" : jump so7 }") >= 0, "%s", b.p);
    free(b.p);
    /* No allow rule: everything that is left is accepted. */
    memset(&p, 0, sizeof(p));
    struct sbx_net_buf b2 = {0};
    sbx_net_render_slot(&b2, 3, 0x0a580007u, &p);
    cr_expect(at(b2.p, "so3 counter name \"n3\" accept") > at(b2.p, "so3 ip daddr @priv4"), "%s",
              b2.p);
    free(b2.p);
}
