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
 * deployment's sandbox range, always denied as a destination. */
void sbx_net_render_router(struct sbx_net_buf *b, const char *range);

/* sbx_net_render_slot — the commands that add slot k's counters o/i/n<k>,
 * chains so<k> (from the sandbox) and si<k> (to it) and map elements. */
void sbx_net_render_slot(struct sbx_net_buf *b, int k, uint32_t addr,
                         const struct sbx_net_policy *p);
/* sbx_net_render_update — chain so<k>'s rules replaced by p's (one batch:
 * flush, then the rules; nft applies it atomically). */
void sbx_net_render_update(struct sbx_net_buf *b, int k, uint32_t addr,
                           const struct sbx_net_policy *p);

/* net_dns.c — the sandboxes' resolver (docs/network.md §Host names).
 * sbx_dns_start: a thread serving SBX_NET_RESOLVER:53/udp from a socket
 * opened in netns router_nsfd, forwarding allowed queries from a socket of
 * the caller's netns to upstream ("A.B.C.D[:PORT]"), pinning the A answers
 * through pin(ctx, nft_cmds) (0 or -errno); a query's source address
 * block + 2k + 1 is slot k's.  *out owned by the caller (sbx_dns_stop).  0 or -errno (why).
 * sbx_dns_set_policy: slot's names from p (NULL: the slot is gone).
 * sbx_dns_pins: as sbx_net_pins. */
struct sbx_dns;
typedef int (*sbx_dns_pin_fn)(void *ctx, const char *nft_cmds);
int sbx_dns_start(struct sbx_dns **out, int router_nsfd, const char *upstream, uint32_t block,
                  sbx_dns_pin_fn pin, void *ctx, char *why, size_t whylen);
void sbx_dns_stop(struct sbx_dns *d);
void sbx_dns_set_policy(struct sbx_dns *d, int slot, const struct sbx_net_policy *p);
int sbx_dns_pins(struct sbx_dns *d, int slot, struct sbx_net_pin *out, int max);

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
