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
    sbx_net_render_slot(&b, 7, 0x0a58000fu, &p, false);
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
    sbx_net_render_slot(&b2, 3, 0x0a580007u, &p, false);
    cr_expect(at(b2.p, "so3 counter name \"n3\" accept") > at(b2.p, "so3 ip daddr @priv4"), "%s",
              b2.p);
    free(b2.p);
}

Test(net_policy, host_name_rules)
{
    struct sbx_net_name n;
    char why[256];
    cr_assert_eq(sbx_net_name_parse("Example.ORG.:443", false, &n, why, sizeof(why)), 0, "%s",
                 why);
    cr_expect_str_eq(n.name, "example.org");
    cr_expect_eq(n.port, 443);
    cr_assert_eq(sbx_net_name_parse("*.cdn.example.org", false, &n, why, sizeof(why)), 0, "%s",
                 why);
    cr_expect_eq(n.port, 0);
    cr_expect(sbx_net_name_match(&n, "a.cdn.example.org"));
    cr_expect(sbx_net_name_match(&n, "b.a.cdn.example.org"));
    cr_expect(!sbx_net_name_match(&n, "cdn.example.org"), "the apex is not below itself");
    cr_expect(!sbx_net_name_match(&n, "xcdn.example.org"));
    cr_assert_eq(sbx_net_name_parse("registry.npmjs.org", true, &n, why, sizeof(why)), 0);
    cr_expect(sbx_net_name_match(&n, "registry.npmjs.org"));
    cr_expect(!sbx_net_name_match(&n, "x.registry.npmjs.org"));
    /* Addresses are not names: the CIDR parser takes them. */
    cr_expect_eq(sbx_net_name_parse("203.0.113.0/24:443", false, &n, why, sizeof(why)), 1);
    cr_expect_eq(sbx_net_name_parse("fd00:ec2::254", false, &n, why, sizeof(why)), 1);
    static const char *const bad[] = {"bad..name", "*example.org", "-x.test", "*.", "a.test:0",
                                      "x_y.test", "a.*.test", "a.test:", "x-.test"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        cr_expect_eq(sbx_net_name_parse(bad[i], false, &n, why, sizeof(why)), SBX_E_VALIDATION,
                     "'%s' accepted", bad[i]);
        cr_expect(strstr(why, bad[i]) != NULL, "'%s': %s", bad[i], why);
    }
    cr_expect_eq(sbx_net_name_parse("x.test:443", true, &n, why, sizeof(why)), SBX_E_VALIDATION,
                 "a deny name with a port");
}

Test(net_policy, pinned_sets_after_the_private_drop)
{
    struct sbx_net_policy *p = calloc(1, sizeof(*p));
    char why[256];
    cr_assert_eq(sbx_net_name_parse("example.org:443", false, &p->allow_names[p->nallow_names++],
                                    why, sizeof(why)), 0);
    struct sbx_net_buf b = {0};
    sbx_net_render_slot(&b, 5, 0x0a58000bu, p, false);
    long sets = at(b.p, "add set inet sbx hp5 { type ipv4_addr . inet_service; flags timeout; }");
    long priv = at(b.p, "so5 ip daddr @priv4 jump refuse");
    long ha = at(b.p, "so5 ip daddr @ha5 counter");
    long hp = at(b.p, "so5 meta l4proto { tcp, udp } ip daddr . th dport @hp5 counter");
    long last = at(b.p, "so5 jump refuse");
    cr_expect(sets >= 0 && priv < ha && ha < hp && hp < last, "%s", b.p);
    cr_expect(at(b.p, "meta priority set") < 0, "no limit, no class: %s", b.p);
    /* Names only: not "everything public". */
    cr_expect(at(b.p, "so5 counter name \"n5\" accept") < 0, "%s", b.p);
    free(b.p);
    p->bandwidth = 80;
    struct sbx_net_buf b2 = {0};
    sbx_net_render_slot(&b2, 300, 0x0a58000bu, p, false);
    cr_expect(at(b2.p, "so300 meta priority set 1:12c") >= 0, "%s", b2.p);
    free(b2.p);
    free(p);
}
