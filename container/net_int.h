/*
 * net_int.h — internal to container/net*.c: the nft text builders of
 * net_policy.c used by net.c.
 */
#ifndef SBX_NET_INT_H
#define SBX_NET_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net.h"

/* A growing text buffer (heap p, owned by whoever made it; free(p)). */
struct sbx_net_buf {
    char *p;
    size_t n, cap;
};

/* sbx_net_buf_add — append printf output (aborts on OOM, like sbx_xmalloc). */
void sbx_net_buf_add(struct sbx_net_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The private ranges (NULL-terminated) and whether a rule lies inside one. */
extern const char *const sbx_net_private[];
bool sbx_net_is_private(const struct sbx_net_rule *r);

/* sbx_net_render_router — the router's table (`nft -f` text); range is the
 * deployment's sandbox range, always denied as a destination; with inject,
 * the nat prerouting chain and map pre_sb (net_proxy.c). */
void sbx_net_render_router(struct sbx_net_buf *b, const char *range, bool inject);

/* sbx_net_render_slot — the commands that add slot k's counters o/i/n<k>,
 * chains so<k> (from the sandbox) and si<k> (to it) and map elements; with
 * inject (the deployment has injection rules), set ij<k> and nat chain
 * pr<k>, which sends its TCP connections to ij<k>'s pairs to the proxy. */
void sbx_net_render_slot(struct sbx_net_buf *b, int k, uint32_t addr,
                         const struct sbx_net_policy *p, bool inject);
/* sbx_net_render_update — chain so<k>'s rules replaced by p's (one batch:
 * flush, then the rules; nft applies it atomically); with inject, ij<k>
 * flushed too. */
void sbx_net_render_update(struct sbx_net_buf *b, int k, uint32_t addr,
                           const struct sbx_net_policy *p, bool inject);

/* ------------------------------------------------------------------------------ */
/* Credentials stay outside (docs/network.md §Credentials stay outside). */

#define SBX_INJECT_MAX 64        /* rules in the deployment's file */
#define SBX_INJECT_VALUE_MAX 4096 /* bytes of one header value */

/* One rule of the deployment's injection file: requests over plain HTTP to
 * host (port, 80 when the rule names none) get header name: value. */
struct sbx_inject {
    struct sbx_net_name host;    /* exact name or "*.suffix"; port 0 = 80 */
    char name[64];               /* header field name (tchar) */
    char *value;                 /* heap, wiped and freed by sbx_inject_free */
};
struct sbx_inject_set {
    int n;
    struct sbx_inject r[SBX_INJECT_MAX];
};

/* sbx_inject_load — read the rules from path: a regular file owned by root
 * or this process's user, readable by nobody else (mode & 077 == 0), lines
 * "HOST[:PORT] Name: value", '#' comments and blank lines skipped.  *out
 * owned by the caller (sbx_inject_free).  0, or SBX_E_VALIDATION with the
 * file and line in why (never the value). */
int sbx_inject_load(const char *path, struct sbx_inject_set **out, char *why, size_t whylen);
/* sbx_inject_parse — the same from text (no file checks; path names it in why). */
int sbx_inject_parse(const char *text, const char *path, struct sbx_inject_set **out, char *why,
                     size_t whylen);
void sbx_inject_free(struct sbx_inject_set *s);
/* sbx_inject_port — a rule's port (80 when it names none). */
static inline uint16_t
sbx_inject_port(const struct sbx_inject *r)
{
    return r->host.port ? r->host.port : 80;
}

/* net_http.c — the request head.  Pointers point into the parsed buffer. */
#define SBX_HTTP_HEAD_MAX 16384
#define SBX_HTTP_FIELDS_MAX 100
struct sbx_http_field {
    const char *name, *value;
    size_t name_len, value_len;  /* value without its leading and trailing OWS */
};
struct sbx_http_head {
    const char *method, *target;
    size_t method_len, target_len;
    int minor;                   /* HTTP/1.<minor>: 0 or 1 */
    int nfields;
    struct sbx_http_field fields[SBX_HTTP_FIELDS_MAX];
    size_t head_len;             /* bytes up to and with the empty line's CRLF */
};
/* sbx_http_head_parse — parse the head at the start of buf[0..len) (its
 * grammar: net_http.c).  Returns head_len (> 0), 0 when the head is not
 * complete yet, -EBADMSG when it is not one, -E2BIG when it has more than
 * SBX_HTTP_FIELDS_MAX fields or does not end in SBX_HTTP_HEAD_MAX bytes. */
int sbx_http_head_parse(const char *buf, size_t len, struct sbx_http_head *h);
/* sbx_http_field_get — the first field named name (no case), and how many
 * there are in *count; NULL when none. */
const struct sbx_http_field *sbx_http_field_get(const struct sbx_http_head *h, const char *name,
                                                int *count);
/* sbx_http_rewrite — h's head with every field named in names[0..n) and
 * every hop-by-hop field (Connection, Keep-Alive, Proxy-Connection, TE,
 * Upgrade) left out, then (with add) names[i]: values[i] for each i, then
 * "Connection: close" (one request per connection: a later request on it
 * would pass unparsed).  Heap (caller frees), length in *outlen; NULL on
 * OOM, or with errno E2BIG when the result would exceed what
 * sbx_http_head_parse accepts (SBX_HTTP_FIELDS_MAX fields, SBX_HTTP_HEAD_MAX
 * bytes). */
char *sbx_http_rewrite(const struct sbx_http_head *h, const char *const *names,
                       const char *const *values, int n, bool add, size_t *outlen);

/* net_proxy.c — the injecting proxy: a thread of the shard serving
 * SBX_NET_RESOLVER:80/tcp in the router netns, where the router's nat chain
 * sends a sandbox's connections to (address, port) pairs its resolver
 * answered for an injection rule's host (set ij<k>).  It reads the request
 * head, and when its Host is a rule's host that slot k's resolver answered
 * with the connection's original address (resolved()), replaces the rule's
 * headers; then relays to the original address from the router.
 * sbx_proxy_start: *out owned by the caller (sbx_proxy_stop, which waits
 * for the connections' threads).  rules borrowed, outlive the proxy.
 * 0 or -errno (why). */
struct sbx_proxy;
typedef bool (*sbx_proxy_resolved_fn)(void *ctx, int slot, uint32_t addr, const char *host);
int sbx_proxy_start(struct sbx_proxy **out, int router_nsfd, uint32_t block,
                    const struct sbx_inject_set *rules, sbx_proxy_resolved_fn resolved,
                    void *ctx, char *why, size_t whylen);
void sbx_proxy_stop(struct sbx_proxy *p);

/* net_dns.c — the sandboxes' resolver (docs/network.md §Host names).
 * sbx_dns_start: a thread serving SBX_NET_RESOLVER:53 over UDP and TCP from
 * sockets opened in netns router_nsfd, forwarding allowed queries from
 * sockets of the caller's netns to upstream ("A.B.C.D[:PORT]", or up to 4
 * separated by ',', the next tried on SERVFAIL or 1.5 s of silence; NULL or
 * "": the host's first IPv4 nameserver), pinning the A answers
 * through pin(ctx, nft_cmds) (0 or -errno); a query's source address
 * block + 2k + 1 is slot k's; for names of inject's rules (NULL: none) that
 * the policy lets reach the rule's port, the A answers also go to set ij<k>
 * (the proxy's).  *out owned by the caller (sbx_dns_stop).  0 or -errno (why).
 * sbx_dns_set_policy: slot's names from p (NULL: the slot is gone).
 * sbx_dns_pins: as sbx_net_pins. */
struct sbx_dns;
typedef int (*sbx_dns_pin_fn)(void *ctx, const char *nft_cmds);
int sbx_dns_start(struct sbx_dns **out, int router_nsfd, const char *upstream, uint32_t block,
                  const struct sbx_inject_set *inject, sbx_dns_pin_fn pin, void *ctx,
                  char *why, size_t whylen);
void sbx_dns_stop(struct sbx_dns *d);
void sbx_dns_set_policy(struct sbx_dns *d, int slot, const struct sbx_net_policy *p);
int sbx_dns_pins(struct sbx_dns *d, int slot, struct sbx_net_pin *out, int max);
/* sbx_dns_resolved: whether the resolver answered host (lower case) with
 * addr (host order) to slot k for an injection rule, and that answer's TTL
 * has not ended (its entry in set ij<k>). */
bool sbx_dns_resolved(struct sbx_dns *d, int slot, uint32_t addr, const char *host);

/* net_link.c — rtnetlink.  Every function returns 0 (or an index) or -errno.
 * sbx_nl_open_in: a NETLINK_ROUTE socket (CLOEXEC, caller closes) in netns
 * nsfd, made by this thread from inside it (it comes back at once).
 * sbx_nl_veth: a veth pair `name` here and `peer` born in netns peer_nsfd.
 * sbx_nl_index: the index of interface `name`.
 * sbx_nl_addr_up: address addr/plen (host order) on index, and link up.
 * sbx_nl_default_route: default via gw (host order) out of index.
 * sbx_nl_del: delete interface `name` (with its veth peer). */
int sbx_nl_open_in(int nsfd);
int sbx_nl_veth(int nl, const char *name, const char *peer, int peer_nsfd);
int sbx_nl_index(int nl, const char *name);
int sbx_nl_addr_up(int nl, int index, uint32_t addr, uint8_t plen);
int sbx_nl_default_route(int nl, int index, uint32_t gw);
int sbx_nl_del(int nl, const char *name);
/* Traffic control (what `tc` would send).  sbx_nl_tbf: a tbf root qdisc 1:
 * on index, rate bytes/s, burst and limit bytes.  sbx_nl_htb_root: an htb
 * root qdisc 1: whose unclassified packets pass unshaped.  sbx_nl_htb_class:
 * its class 1:minor, rate = ceiling bytes/s, burst bytes.  sbx_nl_tc_del:
 * delete class 1:minor (cls) or the root qdisc. */
int sbx_nl_tbf(int nl, int index, uint64_t rate, uint32_t burst, uint32_t limit);
int sbx_nl_htb_root(int nl, int index);
int sbx_nl_htb_class(int nl, int index, uint16_t minor, uint64_t rate, uint32_t burst);
int sbx_nl_tc_del(int nl, int index, bool cls, uint16_t minor);

#endif
