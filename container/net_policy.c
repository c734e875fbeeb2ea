/*
 * net_policy.c — egress rules: parsing, the always-denied ranges, and the
 * nft text of one sandbox's chains (net.h; docs/network.md §Policy).
 */
#include <arpa/inet.h>
#include <ctype.h>
#include <stdarg.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "net.h"
#include "net_int.h"

#define DEFAULT_RANGE "10.88.0.0/16"

/* Always denied, whatever the policy (E2B's list, images-network-state.md
 * §2.2, plus 0/8 and everything from 224/3): a rule inside one is refused. */
static const char *const always_denied[] = {
    "0.0.0.0/8",      /* "this network" */
    "127.0.0.0/8",    /* loopback (of the router; the host's is reached as its address) */
    "169.254.0.0/16", /* link-local, cloud metadata 169.254.169.254 */
    "224.0.0.0/3",    /* multicast, reserved, broadcast */
};

/* Private ranges: denied unless a rule inside one names it. */
const char *const sbx_net_private[] = {
    "10.0.0.0/8", "100.64.0.0/10", "172.16.0.0/12", "192.168.0.0/16", NULL,
};

static uint32_t
mask_of(uint8_t plen)
{
    return plen == 0 ? 0 : 0xffffffffu << (32 - plen);
}

/* a inside b */
static bool
cidr_within(uint32_t a, uint8_t alen, uint32_t b, uint8_t blen)
{
    return alen >= blen && (a & mask_of(blen)) == b;
}

static int
cidr_parse(const char *text, uint32_t *addr, uint8_t *plen)
{
    char buf[32];
    size_t n = strlen(text);
    if (n == 0 || n >= sizeof(buf))
        return -1;
    memcpy(buf, text, n + 1);
    int len = 32;
    char *slash = strchr(buf, '/');
    if (slash) {
        *slash = '\0';
        char *end;
        long l = strtol(slash + 1, &end, 10);
        if (slash[1] == '\0' || *end || l < 0 || l > 32)
            return -1;
        len = (int)l;
    }
    struct in_addr ia;
    if (inet_pton(AF_INET, buf, &ia) != 1)
        return -1;
    uint32_t a = ntohl(ia.s_addr);
    if (a & ~mask_of((uint8_t)len))
        return -2; /* host bits set */
    *addr = a;
    *plen = (uint8_t)len;
    return 0;
}

int
sbx_net_range_parse(const char *text, uint32_t *base, uint8_t *plen)
{
    if (cidr_parse(text ? text : DEFAULT_RANGE, base, plen) != 0 || *plen < 8 || *plen > 22)
        return SBX_E_VALIDATION;
    return 0;
}

bool
sbx_net_is_private(const struct sbx_net_rule *r)
{
    for (int i = 0; sbx_net_private[i]; i++) {
        uint32_t a;
        uint8_t l;
        cidr_parse(sbx_net_private[i], &a, &l);
        if (cidr_within(r->addr, r->plen, a, l))
            return true;
    }
    return false;
}

/* The rule lies inside an address of this host (getifaddrs: every netns
 * address the shard's process sees; the host's table also drops whatever
 * reaches the host from the router). */
static bool
inside_host_address(const struct sbx_net_rule *r, char *which, size_t wlen)
{
    struct ifaddrs *ifs = NULL, *i;
    bool hit = false;
    if (r->plen != 32 || getifaddrs(&ifs) != 0)
        return false;
    for (i = ifs; i && !hit; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
            continue;
        uint32_t a = ntohl(((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr);
        if (a == r->addr) {
            hit = true;
            snprintf(which, wlen, "an address of this host (%s)", i->ifa_name);
        }
    }
    freeifaddrs(ifs);
    return hit;
}

int
sbx_net_rule_parse(const char *text, const char *range, struct sbx_net_rule *r, char *why,
                   size_t whylen)
{
    char buf[64];
    size_t n = strlen(text);
    memset(r, 0, sizeof(*r));
    if (n == 0 || n >= sizeof(buf)) {
        snprintf(why, whylen, "rule '%.64s': expected CIDR[:PORT], e.g. 203.0.113.0/24:443", text);
        return SBX_E_VALIDATION;
    }
    memcpy(buf, text, n + 1);
    if (strchr(buf, '[') || strchr(buf, ':') != strrchr(buf, ':')) {
        snprintf(why, whylen, "rule '%s': IPv6 rules are not supported yet (sandboxes have IPv4 "
                 "egress only)", text);
        return SBX_E_VALIDATION;
    }
    char *colon = strchr(buf, ':');
    if (colon) {
        *colon = '\0';
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (colon[1] == '\0' || *end || p < 1 || p > 65535) {
            snprintf(why, whylen, "rule '%s': the port must be 1..65535", text);
            return SBX_E_VALIDATION;
        }
        r->port = (uint16_t)p;
    }
    int rc = cidr_parse(buf, &r->addr, &r->plen);
    if (rc) {
        snprintf(why, whylen, rc == -2 ? "rule '%s': the address has bits set beyond the prefix "
                                          "length"
                                        : "rule '%s': expected CIDR[:PORT] with an IPv4 address, "
                                          "e.g. 203.0.113.0/24:443",
                 text);
        return SBX_E_VALIDATION;
    }
    char which[96] = "";
    for (size_t i = 0; i < sizeof(always_denied) / sizeof(always_denied[0]) && !which[0]; i++) {
        uint32_t a;
        uint8_t l;
        cidr_parse(always_denied[i], &a, &l);
        if (cidr_within(r->addr, r->plen, a, l))
            snprintf(which, sizeof(which), "the always-denied range %s", always_denied[i]);
    }
    uint32_t rb;
    uint8_t rl;
    if (!which[0] && sbx_net_range_parse(range, &rb, &rl) == 0 &&
        cidr_within(r->addr, r->plen, rb, rl))
        snprintf(which, sizeof(which), "the sandboxes' range %s (other sandboxes, routers)",
                 range ? range : DEFAULT_RANGE);
    if (!which[0])
        inside_host_address(r, which, sizeof(which));
    if (which[0]) {
        snprintf(why, whylen, "rule '%s' lies inside %s, which no policy can open", text, which);
        return SBX_E_VALIDATION;
    }
    return 0;
}

int
sbx_net_name_parse(const char *text, bool deny, struct sbx_net_name *r, char *why, size_t whylen)
{
    char buf[SBX_NET_NAME_MAX + 8];
    memset(r, 0, sizeof(*r));
    size_t n = strlen(text);
    /* The host part: up to the last ':' (a second ':' is IPv6, not ours). */
    const char *colon = strrchr(text, ':');
    size_t hl = colon ? (size_t)(colon - text) : n;
    if (colon && strchr(text, ':') != colon)
        return 1;
    bool name = false;
    for (size_t i = 0; i < hl; i++)
        if (isalpha((unsigned char)text[i]) || text[i] == '*' || text[i] == '_')
            name = true;
    if (!name)
        return 1;
    if (hl == 0 || hl >= sizeof(buf)) {
        snprintf(why, whylen, "rule '%.64s': a host name has at most 253 bytes", text);
        return SBX_E_VALIDATION;
    }
    memcpy(buf, text, hl);
    buf[hl] = '\0';
    if (hl > 1 && buf[hl - 1] == '.')
        buf[--hl] = '\0';
    if (colon) {
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (colon[1] == '\0' || *end || p < 1 || p > 65535) {
            snprintf(why, whylen, "rule '%s': the port must be 1..65535", text);
            return SBX_E_VALIDATION;
        }
        if (deny) {
            snprintf(why, whylen, "rule '%s': a host-name deny rule takes no port (its name is "
                     "not resolved at all)", text);
            return SBX_E_VALIDATION;
        }
        r->port = (uint16_t)p;
    }
    const char *s = buf;
    if (s[0] == '*') {
        if (s[1] != '.') {
            snprintf(why, whylen, "rule '%s': a wildcard is '*.' and a name (*.example.org)",
                     text);
            return SBX_E_VALIDATION;
        }
        s += 2;
    }
    size_t total = strlen(s);
    if (total == 0 || total > 253) {
        snprintf(why, whylen, "rule '%.64s': expected a host name[:PORT], e.g. example.org:443 or "
                 "*.example.org", text);
        return SBX_E_VALIDATION;
    }
    for (const char *l = s; *l;) {
        size_t len = strcspn(l, ".");
        bool ok = len >= 1 && len <= 63 && l[0] != '-' && l[len - 1] != '-';
        for (size_t i = 0; ok && i < len; i++)
            ok = isalnum((unsigned char)l[i]) || l[i] == '-';
        if (!ok) {
            snprintf(why, whylen, "rule '%.64s': not a host name (labels of 1-63 letters, digits "
                     "and '-', separated by dots; '*.' only in front)", text);
            return SBX_E_VALIDATION;
        }
        l += len + (l[len] == '.');
        if (l[-1] == '.' && !*l) {
            snprintf(why, whylen, "rule '%.64s': not a host name (empty label)", text);
            return SBX_E_VALIDATION;
        }
    }
    for (char *c = buf; *c; c++)
        *c = (char)tolower((unsigned char)*c);
    snprintf(r->name, sizeof(r->name), "%s", buf);
    return 0;
}

bool
sbx_net_name_match(const struct sbx_net_name *r, const char *q)
{
    if (r->name[0] != '*')
        return strcmp(r->name, q) == 0;
    size_t sl = strlen(r->name) - 1, ql = strlen(q); /* ".suffix" */
    return ql > sl && strcmp(q + ql - sl, r->name + 1) == 0;
}

/* ------------------------------------------------------------------------------ */
/* nft text. */

static void
rule_match(char *out, size_t len, const struct sbx_net_rule *r)
{
    struct in_addr ia = {.s_addr = htonl(r->addr)};
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ia, a, sizeof(a));
    if (r->port)
        snprintf(out, len, "ip daddr %s/%u meta l4proto { tcp, udp } th dport %u", a, r->plen,
                 r->port);
    else
        snprintf(out, len, "ip daddr %s/%u", a, r->plen);
}

/* Append printf output to the growing buffer b (heap). */
void
sbx_net_buf_add(struct sbx_net_buf *b, const char *fmt, ...)
{
    va_list ap;
    for (;;) {
        va_start(ap, fmt);
        int n = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
        va_end(ap);
        if (n < 0)
            return;
        if (b->p && b->n + (size_t)n < b->cap) {
            b->n += (size_t)n;
            return;
        }
        b->cap = (b->cap + (size_t)n + 1) * 2;
        char *q = realloc(b->p, b->cap);
        if (!q)
            abort();
        b->p = q;
    }
}

/*
 * The chains of slot k (sandbox address addr).  Order: spoofed source drop;
 * replies accepted; anything but a new IPv4 connection dropped; the
 * always-denied set; deny rules; allow rules inside private ranges; the
 * private set; the other allow rules (or everything when there are none);
 * refused.  "Refused" = TCP reset or ICMP admin-prohibited, so a client
 * fails at once rather than after a timeout.
 */
/* The rules of chain so<k> (address a), in the order above. */
static void
so_rules(struct sbx_net_buf *b, int k, const char *a, const struct sbx_net_policy *p)
{
    char m[128];
    const char *R = "add rule inet sbx so";
    sbx_net_buf_add(b, "%s%d counter name \"o%d\"\n", R, k, k);
    /* A bandwidth limit: the uplink's htb puts the packet in class 1:<k>
     * by its priority (no tc classifier needed; net.c, set_bandwidth). */
    if (p->bandwidth)
        sbx_net_buf_add(b, "%s%d meta priority set 1:%x\n", R, k, k);
    sbx_net_buf_add(b, "%s%d ip saddr != %s drop\n", R, k, a);
    sbx_net_buf_add(b, "%s%d ct state established,related accept\n", R, k);
    sbx_net_buf_add(b, "%s%d ct state != new drop\n", R, k);
    sbx_net_buf_add(b, "%s%d meta nfproto != ipv4 drop\n", R, k);
    sbx_net_buf_add(b, "%s%d ip daddr @hard4 jump refuse\n", R, k);
    for (int i = 0; i < p->ndeny; i++) {
        rule_match(m, sizeof(m), &p->deny[i]);
        sbx_net_buf_add(b, "%s%d %s jump refuse\n", R, k, m);
    }
    /* Connections open at once (conntrack entries through this rule: those
     * that end, or are refused below, leave its list). */
    if (p->max_conns) /* in set cc<k>: one count with the proxy's leg (pi_rules) */
        sbx_net_buf_add(b, "%s%d add @cc%d { ip saddr ct count over %u } jump refuse\n", R, k, k,
                        p->max_conns);
    for (int i = 0; i < p->nallow; i++) {
        if (!sbx_net_is_private(&p->allow[i]))
            continue;
        rule_match(m, sizeof(m), &p->allow[i]);
        sbx_net_buf_add(b, "%s%d %s counter name \"n%d\" accept\n", R, k, m, k);
    }
    sbx_net_buf_add(b, "%s%d ip daddr @priv4 jump refuse\n", R, k);
    /* Addresses the resolver answered for an allowed name (net_dns.c):
     * for every port (set ha<k>) or one (hp<k>), until the pin's timeout. */
    if (p->nallow_names) {
        sbx_net_buf_add(b, "%s%d ip daddr @ha%d counter name \"n%d\" accept\n", R, k, k, k);
        sbx_net_buf_add(b, "%s%d meta l4proto { tcp, udp } ip daddr . th dport @hp%d "
                           "counter name \"n%d\" accept\n", R, k, k, k);
    }
    for (int i = 0; i < p->nallow; i++) {
        if (sbx_net_is_private(&p->allow[i]))
            continue;
        rule_match(m, sizeof(m), &p->allow[i]);
        sbx_net_buf_add(b, "%s%d %s counter name \"n%d\" accept\n", R, k, m, k);
    }
    if (p->nallow == 0 && p->nallow_names == 0)
        sbx_net_buf_add(b, "%s%d counter name \"n%d\" accept\n", R, k, k);
    sbx_net_buf_add(b, "%s%d jump refuse\n", R, k);
}

/* The rules of chain pi<k>: the sandbox's connections the nat chain sent
 * to the injection proxy (net_proxy.c), which reach the router's input
 * hook, not the forward chains: counted as its own (bytes out o<k>, new
 * connections n<k>) and held to the same maxConnections count (set cc<k>,
 * shared with so<k>'s rule: one count, not one per path). */
static void
pi_rules(struct sbx_net_buf *b, int k, const struct sbx_net_policy *p)
{
    const char *R = "add rule inet sbx pi";
    sbx_net_buf_add(b, "%s%d counter name \"o%d\"\n", R, k, k);
    if (p->max_conns)
        sbx_net_buf_add(b, "%s%d ct state new add @cc%d { ip saddr ct count over %u } jump refuse\n",
                        R, k, k, p->max_conns);
    sbx_net_buf_add(b, "%s%d ct state new counter name \"n%d\"\n", R, k, k);
}

void
sbx_net_render_slot(struct sbx_net_buf *b, int k, uint32_t addr, const struct sbx_net_policy *p,
                    bool inject)
{
    struct in_addr ia = {.s_addr = htonl(addr)};
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ia, a, sizeof(a));
    sbx_net_buf_add(b, "add counter inet sbx o%d\nadd counter inet sbx i%d\n"
                       "add counter inet sbx n%d\n", k, k, k);
    sbx_net_buf_add(b, "add set inet sbx cc%d { type ipv4_addr; flags dynamic; }\n", k);
    sbx_net_buf_add(b, "add chain inet sbx so%d\nadd chain inet sbx si%d\n", k, k);
    sbx_net_buf_add(b, "add set inet sbx ha%d { type ipv4_addr; flags timeout; }\n"
                       "add set inet sbx hp%d { type ipv4_addr . inet_service; flags timeout; }\n",
                    k, k);
    so_rules(b, k, a, p);
    sbx_net_buf_add(b, "add rule inet sbx si%d counter name \"i%d\"\n", k, k);
    sbx_net_buf_add(b, "add rule inet sbx si%d ct state established,related accept\n", k);
    sbx_net_buf_add(b, "add rule inet sbx si%d drop\n", k);
    sbx_net_buf_add(b, "add element inet sbx from_sb { \"s%d\" : jump so%d }\n", k, k);
    sbx_net_buf_add(b, "add element inet sbx to_sb { \"s%d\" : jump si%d }\n", k, k);
    if (inject) /* the pairs its resolver answered for an injection host: to the proxy */
        sbx_net_buf_add(b, "add set inet sbx ij%d { type ipv4_addr . inet_service; flags timeout; }\n"
                           "add chain inet sbx pr%d\n"
                           "add rule inet sbx pr%d meta l4proto tcp ip daddr . tcp dport @ij%d"
                           " dnat ip to " SBX_NET_RESOLVER ":80\n"
                           "add element inet sbx pre_sb { \"s%d\" : jump pr%d }\n",
                        k, k, k, k, k, k);
    if (inject) {
        /* Its proxied connections counted as its own (pi_rules); the
         * proxy's answers to it (reply direction of a DNATed connection,
         * leaving through the output hook) in i<k>; the proxy's own
         * upstream connection leaves by up0 and is not counted again. */
        sbx_net_buf_add(b, "add chain inet sbx pi%d\n", k);
        pi_rules(b, k, p);
        sbx_net_buf_add(b, "add chain inet sbx po%d\n"
                           "add rule inet sbx po%d ct direction reply ct status dnat"
                           " counter name \"i%d\"\n"
                           "add element inet sbx pin_sb { \"s%d\" : jump pi%d }\n"
                           "add element inet sbx pout_sb { \"s%d\" : jump po%d }\n",
                        k, k, k, k, k, k, k);
    }
}

void
sbx_net_render_update(struct sbx_net_buf *b, int k, uint32_t addr, const struct sbx_net_policy *p,
                      bool inject)
{
    struct in_addr ia = {.s_addr = htonl(addr)};
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ia, a, sizeof(a));
    /* The pins go with the old rules: a name the new policy no longer
     * allows must not stay reachable until its TTL ends. */
    sbx_net_buf_add(b, "flush chain inet sbx so%d\nflush set inet sbx ha%d\n"
                       "flush set inet sbx hp%d\n", k, k, k);
    if (inject)
        sbx_net_buf_add(b, "flush set inet sbx ij%d\nflush chain inet sbx pi%d\n", k, k);
    so_rules(b, k, a, p);
    if (inject)
        pi_rules(b, k, p);
}

/* The router's table: sets, maps, the forward and input hooks, NAT. */
void
sbx_net_render_router(struct sbx_net_buf *b, const char *range, bool inject)
{
    sbx_net_buf_add(b, "table inet sbx {\n"
                       " set hard4 { type ipv4_addr; flags interval; auto-merge; elements = { ");
    for (size_t i = 0; i < sizeof(always_denied) / sizeof(always_denied[0]); i++)
        sbx_net_buf_add(b, "%s, ", always_denied[i]);
    sbx_net_buf_add(b, "%s", range);
    struct ifaddrs *ifs = NULL;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
                continue;
            char a[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof(a));
            sbx_net_buf_add(b, ", %s", a);
        }
        freeifaddrs(ifs);
    }
    sbx_net_buf_add(b, " } }\n set priv4 { type ipv4_addr; flags interval; elements = { ");
    for (int i = 0; sbx_net_private[i]; i++)
        sbx_net_buf_add(b, "%s%s", i ? ", " : "", sbx_net_private[i]);
    sbx_net_buf_add(b,
                    " } }\n"
                    " map from_sb { type ifname : verdict; }\n"
                    " map to_sb { type ifname : verdict; }\n"
                    " chain refuse { meta l4proto tcp reject with tcp reset;"
                    " reject with icmpx type admin-prohibited; }\n"
                    " chain forward { type filter hook forward priority filter; policy drop;"
                    " iifname vmap @from_sb; oifname vmap @to_sb; }\n"
                    " chain input { type filter hook input priority filter; policy drop;"
                    " iifname \"lo\" accept;%s ct state established,related accept;"
                    " iifname \"s*\" ip daddr " SBX_NET_RESOLVER " udp dport 53 accept;"
                    " iifname \"s*\" ip daddr " SBX_NET_RESOLVER " tcp dport 53 accept;"
                    "%s"
                    " jump refuse; }\n"
                    " chain output { type filter hook output priority filter; policy accept;"
                    " meta nfproto ipv6 drop;%s }\n"
                    " chain post { type nat hook postrouting priority srcnat;"
                    " oifname \"up0\" masquerade; }\n"
                    "%s"
                    "}\n",
                    /* each sandbox's packets to the proxy, established ones too, through
                     * its pi<k> (counters, maxConnections) before they are accepted */
                    inject ? " iifname \"s*\" ip daddr " SBX_NET_RESOLVER " tcp dport 80"
                             " ct status dnat iifname vmap @pin_sb;" : "",
                    /* the proxy's port, for connections the nat chain sent there only */
                    inject ? " iifname \"s*\" ip daddr " SBX_NET_RESOLVER " tcp dport 80"
                             " ct status dnat accept;" : "",
                    /* the proxy's packets to a sandbox: po<k> counts them */
                    inject ? " oifname vmap @pout_sb;" : "",
                    /* Credentials stay outside (net_proxy.c): after the always-denied and
                     * private ranges (left to the forward chain, which refuses them), each
                     * sandbox's pr<k> sends its connections to ij<k>'s pairs to the proxy. */
                    inject ? " map pre_sb { type ifname : verdict; }\n"
                             " map pin_sb { type ifname : verdict; }\n"
                             " map pout_sb { type ifname : verdict; }\n"
                             " chain pre { type nat hook prerouting priority dstnat;"
                             " ip daddr @hard4 return; ip daddr @priv4 return;"
                             " iifname vmap @pre_sb; }\n" : "");
}
