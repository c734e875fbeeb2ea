/*
 * net_link.c — the few rtnetlink requests a sandbox's attachment needs
 * (net_int.h): a veth pair whose peer is born in another netns, an IPv4
 * address, link up, a default route; and a bandwidth limit's qdiscs.  In-process: running `ip` for them cost
 * two fork+execs (~2 ms each here) per egress cold start (docs/network.md).
 * Requests are synchronous (NLM_F_ACK), one socket per caller: no state
 * shared between threads.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/if_link.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <linux/veth.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "net_int.h"

#define NL_BUF 1024

struct nlreq {
    union {
        struct nlmsghdr h;
        char buf[NL_BUF];
    };
};

static struct rtattr *
put(struct nlreq *r, unsigned short type, const void *data, size_t len)
{
    size_t at = NLMSG_ALIGN(r->h.nlmsg_len);
    struct rtattr *a = (struct rtattr *)(r->buf + at);
    if (at + RTA_SPACE(len) > sizeof(*r))
        abort(); /* our own requests are small and fixed: a bug */
    a->rta_type = type;
    a->rta_len = (unsigned short)RTA_LENGTH(len);
    if (len)
        memcpy(RTA_DATA(a), data, len);
    r->h.nlmsg_len = (uint32_t)(at + RTA_SPACE(len));
    return a;
}

static void
nest_end(struct nlreq *r, struct rtattr *a)
{
    a->rta_len = (unsigned short)(r->buf + r->h.nlmsg_len - (char *)a);
}

static void
init(struct nlreq *r, uint16_t type, uint16_t flags, const void *hdr, size_t hlen)
{
    memset(r, 0, sizeof(*r));
    r->h.nlmsg_type = type;
    r->h.nlmsg_flags = (uint16_t)(NLM_F_REQUEST | NLM_F_ACK | flags);
    r->h.nlmsg_len = (uint32_t)NLMSG_LENGTH(hlen);
    memcpy(NLMSG_DATA(&r->h), hdr, hlen);
}

/* Send r and read until its ACK: 0 or the kernel's -errno.  A RTM_NEWLINK
 * answer (to RTM_GETLINK) leaves its index in *index. */
static int
talk(int fd, struct nlreq *r, int *index)
{
    static const uint32_t seq0 = 1;
    r->h.nlmsg_seq = seq0;
    if (send(fd, r, r->h.nlmsg_len, 0) < 0)
        return -errno;
    char buf[8192];
    for (;;) {
        ssize_t n = recv(fd, buf, sizeof(buf), 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; NLMSG_OK(h, (size_t)n);
             h = NLMSG_NEXT(h, n)) {
            if (h->nlmsg_type == RTM_NEWLINK && index)
                *index = ((struct ifinfomsg *)NLMSG_DATA(h))->ifi_index;
            if (h->nlmsg_type == NLMSG_ERROR)
                return ((struct nlmsgerr *)NLMSG_DATA(h))->error;
        }
    }
}

int
sbx_nl_open_in(int nsfd)
{
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        return -errno;
    int fd = -1;
    if (setns(nsfd, CLONE_NEWNET) == 0) {
        fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
        if (fd < 0)
            fd = -errno;
        if (setns(self, CLONE_NEWNET) != 0) {
            /* This thread would go on in another namespace. */
            sbx_log_error("network: cannot return to the shard's network namespace: %s",
                          strerror(errno));
            abort();
        }
    } else {
        fd = -errno;
    }
    close(self);
    return fd;
}

int
sbx_nl_veth(int nl, const char *name, const char *peer, int peer_nsfd)
{
    struct nlreq r;
    struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC};
    init(&r, RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, &ifi, sizeof(ifi));
    put(&r, IFLA_IFNAME, name, strlen(name) + 1);
    struct rtattr *li = put(&r, IFLA_LINKINFO, NULL, 0);
    put(&r, IFLA_INFO_KIND, "veth", 5);
    struct rtattr *data = put(&r, IFLA_INFO_DATA, NULL, 0);
    struct rtattr *pe = put(&r, VETH_INFO_PEER, &ifi, sizeof(ifi));
    put(&r, IFLA_IFNAME, peer, strlen(peer) + 1);
    uint32_t fd = (uint32_t)peer_nsfd;
    put(&r, IFLA_NET_NS_FD, &fd, sizeof(fd));
    nest_end(&r, pe);
    nest_end(&r, data);
    nest_end(&r, li);
    return talk(nl, &r, NULL);
}

int
sbx_nl_index(int nl, const char *name)
{
    struct nlreq r;
    struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC};
    init(&r, RTM_GETLINK, 0, &ifi, sizeof(ifi));
    put(&r, IFLA_IFNAME, name, strlen(name) + 1);
    int index = 0;
    int rc = talk(nl, &r, &index);
    return rc ? rc : index > 0 ? index : -ENODEV;
}

int
sbx_nl_addr_up(int nl, int index, uint32_t addr, uint8_t plen)
{
    struct nlreq r;
    struct ifaddrmsg ifa = {.ifa_family = AF_INET, .ifa_prefixlen = plen,
                            .ifa_scope = RT_SCOPE_UNIVERSE, .ifa_index = (uint32_t)index};
    init(&r, RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, &ifa, sizeof(ifa));
    uint32_t be = htonl(addr);
    put(&r, IFA_LOCAL, &be, 4);
    put(&r, IFA_ADDRESS, &be, 4);
    int rc = talk(nl, &r, NULL);
    if (rc)
        return rc;
    struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC, .ifi_index = index, .ifi_flags = IFF_UP,
                            .ifi_change = IFF_UP};
    init(&r, RTM_NEWLINK, 0, &ifi, sizeof(ifi));
    return talk(nl, &r, NULL);
}

int
sbx_nl_default_route(int nl, int index, uint32_t gw)
{
    struct nlreq r;
    struct rtmsg rt = {.rtm_family = AF_INET, .rtm_table = RT_TABLE_MAIN,
                       .rtm_protocol = RTPROT_BOOT, .rtm_scope = RT_SCOPE_UNIVERSE,
                       .rtm_type = RTN_UNICAST};
    init(&r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, &rt, sizeof(rt));
    uint32_t be = htonl(gw), oif = (uint32_t)index;
    put(&r, RTA_GATEWAY, &be, 4);
    put(&r, RTA_OIF, &oif, 4);
    return talk(nl, &r, NULL);
}

int
sbx_nl_del(int nl, const char *name)
{
    struct nlreq r;
    struct ifinfomsg ifi = {.ifi_family = AF_UNSPEC};
    init(&r, RTM_DELLINK, 0, &ifi, sizeof(ifi));
    put(&r, IFLA_IFNAME, name, strlen(name) + 1);
    return talk(nl, &r, NULL);
}

/* ------------------------------------------------------------------------------ */
/* Traffic control: what `tc` would send for a bandwidth limit (~4 ms a run
 * of it here, fork and exec; docs/network.md §Bandwidth). */

#define ROOT_HANDLE 0x00010000u /* 1: */

static void
ratespec(struct tc_ratespec *r, uint64_t rate)
{
    memset(r, 0, sizeof(*r));
    r->linklayer = TC_LINKLAYER_ETHERNET; /* no rate table: the kernel computes */
    r->rate = rate >= 0xffffffffu ? 0xffffffffu : (uint32_t)rate;
}

/* The time to send bytes at rate bytes/s, in psched ticks (64 ns). */
static uint32_t
ticks(uint64_t bytes, uint64_t rate)
{
    uint64_t ns = bytes * 1000000000ull / (rate ? rate : 1);
    uint64_t t = ns >> 6;
    return t > 0xffffffffu ? 0xffffffffu : (uint32_t)t;
}

int
sbx_nl_tbf(int nl, int index, uint64_t rate, uint32_t burst, uint32_t limit)
{
    struct nlreq r;
    struct tcmsg tcm = {.tcm_family = AF_UNSPEC, .tcm_ifindex = index,
                        .tcm_handle = ROOT_HANDLE, .tcm_parent = TC_H_ROOT};
    init(&r, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, &tcm, sizeof(tcm));
    put(&r, TCA_KIND, "tbf", 4);
    struct rtattr *o = put(&r, TCA_OPTIONS, NULL, 0);
    struct tc_tbf_qopt q = {.limit = limit, .buffer = ticks(burst, rate)};
    ratespec(&q.rate, rate);
    put(&r, TCA_TBF_PARMS, &q, sizeof(q));
    if (rate >= 0xffffffffu)
        put(&r, TCA_TBF_RATE64, &rate, sizeof(rate));
    put(&r, TCA_TBF_BURST, &burst, sizeof(burst));
    nest_end(&r, o);
    return talk(nl, &r, NULL);
}

int
sbx_nl_htb_root(int nl, int index)
{
    struct nlreq r;
    struct tcmsg tcm = {.tcm_family = AF_UNSPEC, .tcm_ifindex = index,
                        .tcm_handle = ROOT_HANDLE, .tcm_parent = TC_H_ROOT};
    init(&r, RTM_NEWQDISC, NLM_F_CREATE | NLM_F_EXCL, &tcm, sizeof(tcm));
    put(&r, TCA_KIND, "htb", 4);
    struct rtattr *o = put(&r, TCA_OPTIONS, NULL, 0);
    /* version 3; default class 0: unclassified packets go out unshaped */
    struct tc_htb_glob g = {.version = 3, .rate2quantum = 10, .defcls = 0};
    put(&r, TCA_HTB_INIT, &g, sizeof(g));
    nest_end(&r, o);
    return talk(nl, &r, NULL);
}

int
sbx_nl_htb_class(int nl, int index, uint16_t minor, uint64_t rate, uint32_t burst)
{
    struct nlreq r;
    struct tcmsg tcm = {.tcm_family = AF_UNSPEC, .tcm_ifindex = index,
                        .tcm_handle = ROOT_HANDLE | minor, .tcm_parent = ROOT_HANDLE};
    init(&r, RTM_NEWTCLASS, NLM_F_CREATE | NLM_F_EXCL, &tcm, sizeof(tcm));
    put(&r, TCA_KIND, "htb", 4);
    struct rtattr *o = put(&r, TCA_OPTIONS, NULL, 0);
    struct tc_htb_opt h = {.buffer = ticks(burst, rate), .cbuffer = ticks(burst, rate),
                           .quantum = 65536};
    ratespec(&h.rate, rate);
    ratespec(&h.ceil, rate);
    put(&r, TCA_HTB_PARMS, &h, sizeof(h));
    if (rate >= 0xffffffffu) {
        put(&r, TCA_HTB_RATE64, &rate, sizeof(rate));
        put(&r, TCA_HTB_CEIL64, &rate, sizeof(rate));
    }
    nest_end(&r, o);
    return talk(nl, &r, NULL);
}

int
sbx_nl_tc_del(int nl, int index, bool cls, uint16_t minor)
{
    struct nlreq r;
    struct tcmsg tcm = {.tcm_family = AF_UNSPEC, .tcm_ifindex = index};
    if (cls)
        tcm.tcm_handle = ROOT_HANDLE | minor;
    else
        tcm.tcm_parent = TC_H_ROOT;
    init(&r, cls ? RTM_DELTCLASS : RTM_DELQDISC, 0, &tcm, sizeof(tcm));
    return talk(nl, &r, NULL);
}
