/*
 * net.h — outbound network for sandboxes (mode `egress`), under a policy
 * enforced outside the sandbox.  The design, the address plan and the
 * measurements are in docs/network.md; in short:
 *
 *   sandbox netns                 router netns "sbx-<shard>"           host netns
 *   eth0 A=B+2k+1/31  ──veth──  s<k> B+2k/31                          sbx<hex(B)> B/31
 *        default via B+2k         nft table inet sbx: per-sandbox        nft table inet
 *                                 chains, counters, always-deny sets,    sbx_<hex(B)>:
 *                                 masquerade on up0 B+1/31 ──veth──────  input drop from the
 *                                                                        router, masquerade out
 *
 * B is the shard's block: a /22 of the deployment's range (--network-range,
 * default 10.88.0.0/16), taken with a flock on /run/sbx/net-<B>.lock so no
 * two live shards of this host share one (deployments side by side
 * included); slot 0 is the router's uplink, slots 1..511 sandboxes.  The
 * router netns, its uplink and the host table are made on the first egress
 * sandbox (sbx_net_attach) and removed by sbx_net_free; a crashed shard's
 * are removed by the next holder of the block's lock or of its name.
 * Nothing else of the host changes: the one host sysctl written is
 * net.ipv4.conf.<our veth>.forwarding, which goes with the veth.
 *
 * The policy lives in the router's nft table, where the sandbox's root has
 * no capability: sbx-agent drops every capability, and the sandbox's user
 * namespace owns only its own netns.  IPv4 only: sandboxes get no IPv6
 * address or route, and the router drops every IPv6 packet.
 *
 * Making the router runs `ip`, `nft` and `sysctl` as children (fork, setns
 * into the router's netns, execve; never a shell), once per shard.  A
 * sandbox's attach, detach and counters run in-process: rtnetlink
 * (net_link.c) over sockets opened from inside the router's and the
 * sandbox's netns, and libnftables with its socket in the router's netns.
 * Thread-safe: every function may be called from any thread.
 */
#ifndef SBX_NET_H
#define SBX_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SBX_NET_MAX_RULES 64 /* per list (allow, deny), CIDR and host-name rules together */
#define SBX_NET_NAME_MAX 254 /* a host-name rule's name, with its NUL */
#define SBX_NET_BW_MAX 100000 /* Mbit/s: the largest bandwidth limit */
/* The resolver every sandbox is given (/etc/resolv.conf): an address of the
 * router's lo, reached through each sandbox's default route (net_dns.c). */
#define SBX_NET_RESOLVER "169.254.0.53"

/* One rule: an IPv4 CIDR and an optional TCP/UDP port (0 = every port). */
struct sbx_net_rule {
    uint32_t addr;  /* network, host byte order, host bits zero */
    uint8_t plen;   /* prefix length 0..32 */
    uint16_t port;  /* destination port, 0 = any */
};

/* One host-name rule: "example.org" (that name) or "*.example.org" (every
 * name below it, not the name itself), lower case, no trailing dot; an
 * optional TCP/UDP port (0 = every port; deny rules have none). */
struct sbx_net_name {
    char name[SBX_NET_NAME_MAX];
    uint16_t port;
};

/* A sandbox's policy (docs/network.md §Policy).  With no allow rule (CIDR or
 * name) an egress sandbox may reach every public address; with some, only
 * those: a CIDR rule's addresses, and the addresses the sandbox's resolver
 * answered for an allowed name, until their TTL ends (net_dns.c). */
struct sbx_net_policy {
    int nallow, ndeny;
    int nallow_names, ndeny_names;
    uint32_t max_conns;     /* outbound connections open at once; 0 = no limit */
    uint32_t bandwidth;     /* Mbit/s each way (10^6 bit/s); 0 = no limit */
    struct sbx_net_rule allow[SBX_NET_MAX_RULES];
    struct sbx_net_rule deny[SBX_NET_MAX_RULES];
    struct sbx_net_name allow_names[SBX_NET_MAX_RULES];
    struct sbx_net_name deny_names[SBX_NET_MAX_RULES];
};

/*
 * sbx_net_rule_parse — parse "CIDR[:PORT]" ("198.51.100.0/24:443",
 * "203.0.113.7", "0.0.0.0/0") into *r and check it against the
 * always-denied ranges (range: the deployment's range, or NULL for the
 * default).  A rule inside an always-denied range (loopback, link-local and
 * metadata, 0/8, multicast and reserved, the sandbox range, a host address)
 * could only open it and is refused; a wider rule is fine, the denied part
 * stays denied.  IPv6 rules are refused in this version.  0, or
 * SBX_E_VALIDATION with the reason (naming the rule) in why.
 */
int sbx_net_rule_parse(const char *text, const char *range, struct sbx_net_rule *r, char *why,
                       size_t whylen);

/*
 * sbx_net_name_parse — if text is a host-name rule, "NAME[:PORT]" or
 * "*.NAME[:PORT]" (a host part with a letter or a '*'), parse it into *r:
 * labels of 1..63 bytes of [A-Za-z0-9-] not starting or ending with '-', at
 * most 253 bytes, lower-cased, a trailing dot dropped; with deny, no port.
 * Returns 1 when text is not a host-name rule (parse it as CIDR[:PORT]),
 * 0 when it is one, SBX_E_VALIDATION (reason naming the rule in why) when it
 * looks like one but is not valid.
 */
int sbx_net_name_parse(const char *text, bool deny, struct sbx_net_name *r, char *why,
                       size_t whylen);

/* sbx_net_name_match — whether host name q (lower case, no trailing dot)
 * matches rule r: equal to r's name, or below the suffix of a "*." rule. */
bool sbx_net_name_match(const struct sbx_net_name *r, const char *q);

/* sbx_net_range_parse — "A.B.C.D/N" with 8 <= N <= 22 (at least one /22
 * block) into base/plen.  0 or SBX_E_VALIDATION. */
int sbx_net_range_parse(const char *text, uint32_t *base, uint8_t *plen);

typedef struct sbx_net sbx_net;

struct sbx_net_conf {
    const char *name;   /* the shard's name: router netns "sbx-<name>" */
    const char *range;  /* IPv4 range the shard's /22 block comes from */
    const char *dns_upstream; /* "A.B.C.D[:PORT]" (or up to 4, ',' between them, tried in
                               * order: failover on SERVFAIL or silence): where the
                               * sandboxes' resolver forwards
                               * the queries it allows; NULL: the first IPv4 nameserver
                               * of the host's /etc/resolv.conf (read when the router is
                               * made) */
    const char *inject_file;  /* --egress-inject: the file of header injection rules
                               * (docs/network.md §Credentials stay outside); NULL: none */
};

/* sbx_net_new — remember the configuration and read the injection rules;
 * nothing on the host changes until the first attach.  *out owned by the
 * caller (sbx_net_free).  0 or SBX_E_VALIDATION (bad range, an injection
 * file that is unreadable, readable by others or has a bad rule; reason in
 * why, never a header's value). */
int sbx_net_new(sbx_net **out, const struct sbx_net_conf *conf, char *why, size_t whylen);

/* At most this many addresses are added by sbx_net_deny_add. */
#define SBX_NET_DENY_MAX 256

/*
 * sbx_net_deny_add — addresses of the deployment itself that no sandbox
 * may reach whatever its policy (issue 14's always-denied list: the
 * cluster's and etcd's addresses): `list` is hosts or URLs separated by
 * ',' or ' ' ("[scheme://]host[:port][/path]", e.g. the --etcd endpoints,
 * a peer's advertised tls+tcp:// URL, --egress-deny's entries).  Each host
 * (an IPv4 literal, or a name resolved now with getaddrinfo, AF_INET: all
 * its addresses) joins the router's always-denied set hard4 — at once when
 * the router is up, else when it is made.  Loopback, ipc:// and IPv6 hosts
 * are skipped (denied already: sandboxes reach neither).  Thread-safe.
 * 0; SBX_E_VALIDATION when a name does not resolve or the list would pass
 * SBX_NET_DENY_MAX (the others are still added); SBX_E_CONTAINER when nft
 * refused the addition.
 */
int sbx_net_deny_add(sbx_net *n, const char *list);

/* sbx_net_prepare — make the router now (a deployment whose default mode is
 * egress: its first sandbox then does not wait ~50 ms for it).  0 or
 * SBX_E_CONTAINER (reason in why). */
int sbx_net_prepare(sbx_net *n, char *why, size_t whylen);

/* sbx_net_free — remove the router netns (with its veths), the host table
 * and the block's lock, if they were made; free.  NULL is fine. */
void sbx_net_free(sbx_net *n);

/* What a sandbox's attachment is: its slot and addresses (host order). */
struct sbx_net_attachment {
    int slot;            /* 1..511; 0 = not attached */
    uint32_t addr, gw;   /* the sandbox's eth0 and its gateway (the router) */
    int64_t attach_us;   /* time sbx_net_attach took */
};

/*
 * sbx_net_attach — give the container whose PID 1 is `pid` (host pid) an
 * eth0 into the router under policy p: veth, addresses, default route,
 * nft chain, its resolver's names (net_dns.c) and, with p->bandwidth, its
 * limit (tc).  Makes the router first if needed.  On success *at is filled;
 * the caller must call sbx_net_detach(at->slot) when the container stops.
 * 0 or a negative code (SBX_E_CONTAINER, reason in why).
 */
int sbx_net_attach(sbx_net *n, pid_t pid, const struct sbx_net_policy *p,
                   struct sbx_net_attachment *at, char *why, size_t whylen);

/* sbx_net_update — replace the policy of attached slot (address addr) by p,
 * atomically: new connections meet the new rules at once, established ones
 * go on (the maxConnections count starts again); the pinned addresses of
 * its names are dropped (looked up again under the new names) and its
 * bandwidth limit set to p's.  0 or -EIO (why). */
int sbx_net_update(sbx_net *n, int slot, uint32_t addr, const struct sbx_net_policy *p,
                   char *why, size_t whylen);

/* sbx_net_detach — remove slot's chains and counters and free the slot; call
 * after the container is dead.  Its veth goes with the sandbox's netns (the
 * kernel's asynchronous cleanup).  Harmless on slot 0. */
void sbx_net_detach(sbx_net *n, int slot);

struct sbx_net_stats {
    uint64_t bytes_out, bytes_in;    /* IP bytes from / to the sandbox through the router */
    uint64_t packets_out, packets_in;
    uint64_t connections;            /* new connections the policy accepted */
};

/* sbx_net_stats — slot's nft counters (libnftables, ~0.5 ms here).  0 or -errno. */
int sbx_net_stats(sbx_net *n, int slot, struct sbx_net_stats *st);

/* sbx_net_totals — the shard's egress usage since it started: every
 * slot's counters (as sbx_net_stats) summed, those of containers gone
 * (added at their detach) and those attached now (one nft listing of the
 * table).  Cumulative, for /metrics.  0, or -errno (st then holds the gone
 * part). */
int sbx_net_totals(sbx_net *n, struct sbx_net_stats *st);

/* A name the resolver answered for a slot, and the address it pinned. */
struct sbx_net_pin {
    char name[SBX_NET_NAME_MAX];
    uint32_t addr;        /* host order */
    int64_t expires_ms;   /* wall clock (ms since the epoch) when the pin goes */
};

/* sbx_net_pins — the slot's most recent pins still in force, newest first,
 * at most max into out (caller's array); returns how many (0 when none or
 * no resolver).  The resolver remembers the last 16 per slot. */
int sbx_net_pins(sbx_net *n, int slot, struct sbx_net_pin *out, int max);

#endif
