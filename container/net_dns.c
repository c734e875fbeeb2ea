/*
 * net_dns.c — the resolver the egress sandboxes are given, and the pinning
 * of its answers (net_int.h; docs/network.md §Host names).
 *
 * One thread per shard router.  It reads queries on SBX_NET_RESOLVER:53/udp,
 * a socket opened inside the router's netns (the address is on the router's
 * lo; every sandbox reaches it through its default route, and the router's
 * input chain accepts it from sandbox interfaces only).  A query's source
 * address names its slot (the router's strict rp_filter drops a packet whose
 * source is not the sandbox's behind that veth).  For slot k and name q:
 *
 *   q matches a deny name rule                      -> REFUSED
 *   k has no allow rule at all (every public address
 *   is open to it anyway)                           -> forwarded, nothing pinned
 *   q matches an allow name rule                    -> forwarded; AAAA: empty answer
 *   otherwise                                       -> REFUSED
 *
 * REFUSED, not NXDOMAIN: it is a policy answer, not a statement that the
 * name does not exist, and stub resolvers do not cache it negatively (a
 * configure that allows the name works at the next lookup).
 *
 * Forwarded queries go to the upstream resolver from a socket of the
 * shard's own netns, with a fresh random id; an answer is taken only from
 * the upstream's address, with a pending id and the same question.  Each A
 * record of the answer is added to slot k's nft sets (ha<k>: every port,
 * hp<k>: address . port, one element per matching rule's port) with a
 * timeout of its TTL bounded to PIN_MIN_S..PIN_MAX_S, and its TTL in the
 * answer is rewritten to that timeout, so the sandbox never holds an
 * address longer than it is pinned.  The answer is sent only after the nft
 * batch returned; if it fails the sandbox gets SERVFAIL.  A pin already in
 * force for longer is left alone (two names on one CDN address).
 *
 * The DNS wire format is read and written with libldns (NLnet Labs, Debian
 * libldns-dev): a complete, maintained parser with name decompression and
 * bounds checks, and its packet writer re-encodes the rewritten answer.
 * c-ares, the other candidate, is a stub resolver library: it parses A
 * answers but cannot write a packet back.
 *
 * Over UDP and TCP (RFC 7766): a TCP connection gets a thread of its own
 * (at most TCP_CONNS_MAX), its queries are forwarded over TCP, so an answer
 * the upstream truncated over UDP reaches the sandbox whole when it asks
 * again over TCP.  Upstreams: up to UPS_MAX, in order; a query goes to the
 * current one, and to the next one it has not tried when that one answers
 * SERVFAIL or is silent for TRY_MS (a silent one also makes the next the
 * current for later queries); SERVFAIL when every one failed.
 *
 * IPv4 only.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ldns/ldns.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/util.h"
#include "net.h"
#include "net_int.h"

#define SLOTS 512
#define PENDING 256
#define PENDING_MS 5000  /* a forwarded query unanswered this long is forgotten */
#define PIN_MIN_S 2      /* shortest pin (a TTL of 0 or 1 becomes 2 s) */
#define PIN_MAX_S 3600   /* longest pin (a longer TTL is cut to 1 h, in the answer too) */
#define PINS_MAX 1024    /* addresses pinned at once per slot; beyond, SERVFAIL */
#define RECENT 16
#define UPS_MAX 4        /* upstream resolvers (--dns-upstream A,B,...) */
#define TRY_MS 1500      /* an upstream silent this long: the next one */
#define TCP_CONNS_MAX 32 /* DNS-over-TCP connections at once (one thread each) */
#define TCP_SLOT_MAX 4   /* ... of one sandbox */
#define TCP_IDLE_MS 10000

struct pin_ent {
    uint32_t addr;
    uint16_t port;       /* 0: set ha<k> */
    int64_t expires_ms;
};

/* An answer for an injection rule's host: its address is in ij<k> until
 * expires_ms (net_proxy.c). */
struct inj_ent {
    uint32_t addr;
    int64_t expires_ms;
    char name[SBX_NET_NAME_MAX];
};
#define INJ_MAX 64       /* per slot; the oldest goes first */

struct dns_slot {
    bool used;
    bool open;                   /* no allow rule: every public address is open */
    int na, nd;
    struct sbx_net_name *names;  /* na allow then nd deny (heap) */
    struct pin_ent *pins;        /* heap, npins of cap */
    int npins, cap;
    struct sbx_net_pin recent[RECENT];
    int nrecent, head;
    int ndeny;                   /* the policy's CIDR deny rules (heap) */
    struct sbx_net_rule *deny;
    struct inj_ent *inj;         /* answers for injection hosts (heap), ninj of INJ_MAX */
    int ninj;
};

struct pending {
    bool used;
    uint16_t id, client_id;
    struct sockaddr_in client;
    int slot;
    int64_t deadline_ms;
    char qname[SBX_NET_NAME_MAX];
    uint16_t qtype;
    int up;                      /* the upstream asked now */
    unsigned tried;              /* bit i: upstream i was asked */
    int64_t try_deadline_ms;     /* its answer is due by then */
    uint8_t q[1232];             /* the query as the sandbox sent it (id rewritten) */
    size_t qlen;
};

/* Where an answer goes: a sandbox's UDP address, or its TCP connection. */
struct dest {
    int tcp_fd;                  /* -1: UDP to `to` */
    struct sockaddr_in to;
};

struct sbx_dns {
    pthread_t th;
    bool started;
    int dfd, ufd, tfd, wake[2];  /* UDP :53, UDP to upstreams, TCP :53, stop */
    int nup;                     /* upstreams, in order of preference */
    struct sockaddr_in ups[UPS_MAX];
    atomic_int cur;              /* the upstream queries start at (the last that answered) */
    pthread_mutex_t tcp_mu;      /* guards tcp_conns, tcp_slot */
    pthread_cond_t tcp_cv;
    int tcp_conns;
    uint8_t tcp_slot[SLOTS];
    uint32_t block;
    sbx_dns_pin_fn pin;
    void *ctx;
    const struct sbx_inject_set *inject; /* borrowed; NULL: no injection rules */
    pthread_mutex_t mu;          /* guards slots */
    struct dns_slot slots[SLOTS];
    struct pending pend[PENDING]; /* the thread's own */
};

static int
parse_addr_port(const char *text, struct sockaddr_in *sa)
{
    char buf[64];
    snprintf(buf, sizeof(buf), "%s", text);
    memset(sa, 0, sizeof(*sa));
    sa->sin_family = AF_INET;
    sa->sin_port = htons(53);
    char *colon = strchr(buf, ':');
    if (colon) {
        *colon = '\0';
        long p = strtol(colon + 1, NULL, 10);
        if (p < 1 || p > 65535)
            return -EINVAL;
        sa->sin_port = htons((uint16_t)p);
    }
    return inet_pton(AF_INET, buf, &sa->sin_addr) == 1 ? 0 : -EINVAL;
}

/* The host's first IPv4 nameserver (/etc/resolv.conf), or -ENOENT. */
static int
host_nameserver(struct sockaddr_in *sa)
{
    FILE *f = fopen("/etc/resolv.conf", "re");
    if (!f)
        return -ENOENT;
    char line[256], a[64];
    int rc = -ENOENT;
    while (rc && fgets(line, sizeof(line), f))
        if (sscanf(line, " nameserver %63s", a) == 1 && !strchr(a, ':') &&
            parse_addr_port(a, sa) == 0)
            rc = 0;
    fclose(f);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* Replies. */

static int io_full(struct sbx_dns *d, int fd, bool rd, uint8_t *b, size_t n, int64_t deadline);

/* send_pkt — p to its destination: a datagram, or over TCP with its
 * two-byte length (RFC 1035 §4.2.2). */
static void
send_pkt(struct sbx_dns *d, ldns_pkt *p, const struct dest *to)
{
    uint8_t *wire = NULL;
    size_t len = 0;
    if (ldns_pkt2wire(&wire, p, &len) != LDNS_STATUS_OK)
        return;
    if (to->tcp_fd >= 0) {
        uint8_t hdr[2] = {(uint8_t)(len >> 8), (uint8_t)len};
        int64_t deadline = sbx_mono_us() / 1000 + TCP_IDLE_MS;
        if (len <= 65535 && io_full(d, to->tcp_fd, false, hdr, 2, deadline) == 0)
            io_full(d, to->tcp_fd, false, wire, len, deadline);
    } else {
        sendto(d->dfd, wire, len, 0, (const struct sockaddr *)&to->to, sizeof(to->to));
    }
    free(wire);
}

/* Answer packet q (borrowed, turned into the answer) with rcode and what it holds. */
static void
answer_empty(struct sbx_dns *d, ldns_pkt *q, ldns_pkt_rcode rcode, const struct dest *to)
{
    ldns_pkt_set_qr(q, true);
    ldns_pkt_set_ra(q, true);
    ldns_pkt_set_aa(q, false);
    ldns_pkt_set_rcode(q, (uint8_t)rcode);
    send_pkt(d, q, to);
}

/* The question's name (lower case, no trailing dot) and type; -1 if not one
 * plain query. */
static int
question(ldns_pkt *p, char *name, size_t len, uint16_t *type)
{
    if (ldns_pkt_get_opcode(p) != LDNS_PACKET_QUERY || ldns_pkt_qdcount(p) != 1)
        return -1;
    ldns_rr *rr = ldns_rr_list_rr(ldns_pkt_question(p), 0);
    if (!rr)
        return -1;
    char *s = ldns_rdf2str(ldns_rr_owner(rr));
    if (!s)
        return -1;
    size_t n = strlen(s);
    if (n > 1 && s[n - 1] == '.')
        s[--n] = '\0';
    for (char *c = s; *c; c++)
        if (*c >= 'A' && *c <= 'Z')
            *c = (char)(*c - 'A' + 'a');
    int rc = n < len ? 0 : -1;
    snprintf(name, len, "%s", s);
    free(s);
    *type = (uint16_t)ldns_rr_get_type(rr);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* Policy per slot. */

enum verdict { V_REFUSE, V_OPEN, V_PIN };

/* decide_locked — what slot k's policy says of name q (d->mu held). */
static enum verdict
decide_locked(struct sbx_dns *d, int k, const char *q)
{
    enum verdict v = V_REFUSE;
    struct dns_slot *s = &d->slots[k];
    if (s->used) {
        bool denied = false, allowed = false;
        for (int i = 0; i < s->nd && !denied; i++)
            denied = sbx_net_name_match(&s->names[s->na + i], q);
        for (int i = 0; i < s->na && !allowed; i++)
            allowed = sbx_net_name_match(&s->names[i], q);
        v = denied ? V_REFUSE : s->open ? V_OPEN : allowed ? V_PIN : V_REFUSE;
    }
    return v;
}

static enum verdict
decide(struct sbx_dns *d, int k, const char *q)
{
    pthread_mutex_lock(&d->mu);
    enum verdict v = decide_locked(d, k, q);
    pthread_mutex_unlock(&d->mu);
    return v;
}

void
sbx_dns_set_policy(struct sbx_dns *d, int k, const struct sbx_net_policy *p)
{
    if (!d || k <= 0 || k >= SLOTS)
        return;
    pthread_mutex_lock(&d->mu);
    struct dns_slot *s = &d->slots[k];
    free(s->names);
    free(s->pins);
    free(s->deny);
    free(s->inj);
    memset(s, 0, sizeof(*s)); /* a new policy flushed the sets: no pin is left */
    if (p) {
        s->used = true;
        s->open = p->nallow == 0 && p->nallow_names == 0;
        s->na = p->nallow_names;
        s->nd = p->ndeny_names;
        s->names = sbx_xcalloc((size_t)(s->na + s->nd) + 1, sizeof(*s->names));
        memcpy(s->names, p->allow_names, (size_t)s->na * sizeof(*s->names));
        memcpy(s->names + s->na, p->deny_names, (size_t)s->nd * sizeof(*s->names));
        s->ndeny = p->ndeny;
        s->deny = sbx_xcalloc((size_t)p->ndeny + 1, sizeof(*s->deny));
        memcpy(s->deny, p->deny, (size_t)p->ndeny * sizeof(*s->deny));
    }
    pthread_mutex_unlock(&d->mu);
}

int
sbx_dns_pins(struct sbx_dns *d, int k, struct sbx_net_pin *out, int max)
{
    if (!d || k <= 0 || k >= SLOTS)
        return 0;
    int n = 0;
    int64_t now = sbx_wall_ms();
    pthread_mutex_lock(&d->mu);
    struct dns_slot *s = &d->slots[k];
    for (int i = 0; i < s->nrecent && n < max; i++) {
        const struct sbx_net_pin *p = &s->recent[(s->head - 1 - i + RECENT) % RECENT];
        if (p->expires_ms > now)
            out[n++] = *p;
    }
    pthread_mutex_unlock(&d->mu);
    return n;
}

/*
 * pin_cmds — the nft commands pinning addr (ttl s) for slot k's rules that
 * match name, into b; remembered in the slot's table (d->mu held).  A pin
 * with at least half of ttl (and PIN_MIN_S) left is kept as it is, with no
 * nft command: *eff is then the TTL the answer may carry, the shortest
 * time any of its pins has left.  Returns the number of elements added, or
 * -ENOSPC when the slot has PINS_MAX pins.
 */
static int
pin_cmds(struct sbx_dns *d, int k, const char *name, uint32_t addr, uint32_t ttl,
         uint32_t *eff, struct sbx_net_buf *b)
{
    *eff = ttl;
    struct dns_slot *s = &d->slots[k];
    int64_t now = sbx_wall_ms(), exp = now + (int64_t)ttl * 1000;
    /* Forget pins that have ended. */
    int j = 0;
    for (int i = 0; i < s->npins; i++)
        if (s->pins[i].expires_ms > now)
            s->pins[j++] = s->pins[i];
    s->npins = j;
    struct in_addr ia = {.s_addr = htonl(addr)};
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &ia, a, sizeof(a));
    int added = 0;
    for (int r = 0; r < s->na; r++) {
        const struct sbx_net_name *rule = &s->names[r];
        if (!sbx_net_name_match(rule, name))
            continue;
        struct pin_ent *e = NULL;
        for (int i = 0; i < s->npins && !e; i++)
            if (s->pins[i].addr == addr && s->pins[i].port == rule->port)
                e = &s->pins[i];
        int64_t keep = (int64_t)(ttl / 2 > PIN_MIN_S ? ttl / 2 : PIN_MIN_S) * 1000;
        if (e && e->expires_ms - now >= keep) { /* pinned long enough already */
            uint32_t left = (uint32_t)((e->expires_ms - now) / 1000);
            if (left < *eff)
                *eff = left;
            continue;
        }
        if (!e) {
            if (s->npins >= PINS_MAX)
                return -ENOSPC;
            if (s->npins == s->cap) {
                s->cap = s->cap ? s->cap * 2 : 16;
                s->pins = realloc(s->pins, (size_t)s->cap * sizeof(*s->pins));
                if (!s->pins)
                    abort();
            }
            e = &s->pins[s->npins++];
            e->addr = addr;
            e->port = rule->port;
        }
        e->expires_ms = exp;
        /* add (a no-op if present), delete, add with the timeout: one batch,
         * so the element is never absent; nft 1.0.6 cannot refresh a
         * timeout in place. */
        char el[64];
        if (rule->port)
            snprintf(el, sizeof(el), "%s . %u", a, rule->port);
        else
            snprintf(el, sizeof(el), "%s", a);
        const char *set = rule->port ? "hp" : "ha";
        sbx_net_buf_add(b,
                        "add element inet sbx %s%d { %s }\n"
                        "delete element inet sbx %s%d { %s }\n"
                        "add element inet sbx %s%d { %s timeout %us }\n",
                        set, k, el, set, k, el, set, k, el, ttl);
        added++;
    }
    struct sbx_net_pin *rp = &s->recent[s->head];
    snprintf(rp->name, sizeof(rp->name), "%s", name);
    rp->addr = addr;
    rp->expires_ms = exp;
    s->head = (s->head + 1) % RECENT;
    if (s->nrecent < RECENT)
        s->nrecent++;
    return added;
}

/*
 * inject_cmds — for each injection rule whose host matches name, whose port
 * slot k's policy lets the sandbox reach at that name (no allow rule at
 * all, or an allow name rule for every port or that one) and whose address
 * no CIDR deny rule covers: addr . port into set ij<k> for ttl seconds, and
 * remembered for sbx_dns_resolved (d->mu held).  The always-denied and
 * private ranges are left to the forward chain by the nat chain itself.
 */
static void
inject_cmds(struct sbx_dns *d, int k, const char *name, uint32_t addr, uint32_t ttl,
            struct sbx_net_buf *b)
{
    struct dns_slot *s = &d->slots[k];
    bool any = false;
    for (int i = 0; d->inject && i < d->inject->n; i++) {
        const struct sbx_inject *r = &d->inject->r[i];
        uint16_t port = sbx_inject_port(r);
        if (!sbx_net_name_match(&r->host, name))
            continue;
        bool ok = s->open;
        for (int j = 0; j < s->na && !ok; j++)
            ok = sbx_net_name_match(&s->names[j], name) &&
                 (s->names[j].port == 0 || s->names[j].port == port);
        for (int j = 0; j < s->ndeny && ok; j++) {
            const struct sbx_net_rule *dr = &s->deny[j];
            uint32_t m = dr->plen ? 0xffffffffu << (32 - dr->plen) : 0;
            ok = !((addr & m) == dr->addr && (dr->port == 0 || dr->port == port));
        }
        if (!ok)
            continue;
        struct in_addr ia = {.s_addr = htonl(addr)};
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &ia, a, sizeof(a));
        sbx_net_buf_add(b,
                        "add element inet sbx ij%d { %s . %u }\n"
                        "delete element inet sbx ij%d { %s . %u }\n"
                        "add element inet sbx ij%d { %s . %u timeout %us }\n",
                        k, a, port, k, a, port, k, a, port, ttl);
        any = true;
    }
    if (!any)
        return;
    int64_t now = sbx_wall_ms();
    struct inj_ent *e = NULL;
    if (!s->inj)
        s->inj = sbx_xcalloc(INJ_MAX, sizeof(*s->inj));
    for (int i = 0; i < s->ninj && !e; i++)
        if (s->inj[i].addr == addr && !strcmp(s->inj[i].name, name))
            e = &s->inj[i];
    for (int i = 0; i < s->ninj && !e; i++) /* an ended one */
        if (s->inj[i].expires_ms <= now)
            e = &s->inj[i];
    if (!e && s->ninj < INJ_MAX)
        e = &s->inj[s->ninj++];
    if (!e) { /* full: the one that ends first */
        e = &s->inj[0];
        for (int i = 1; i < s->ninj; i++)
            if (s->inj[i].expires_ms < e->expires_ms)
                e = &s->inj[i];
    }
    e->addr = addr;
    e->expires_ms = now + (int64_t)ttl * 1000;
    snprintf(e->name, sizeof(e->name), "%s", name);
}

bool
sbx_dns_resolved(struct sbx_dns *d, int k, uint32_t addr, const char *host)
{
    if (!d || k <= 0 || k >= SLOTS)
        return false;
    bool hit = false;
    int64_t now = sbx_wall_ms();
    pthread_mutex_lock(&d->mu);
    struct dns_slot *s = &d->slots[k];
    for (int i = 0; i < s->ninj && !hit; i++)
        hit = s->inj[i].addr == addr && s->inj[i].expires_ms > now && !strcmp(s->inj[i].name, host);
    pthread_mutex_unlock(&d->mu);
    return hit;
}

/* ------------------------------------------------------------------------------ */
/* The thread. */

/* slot_of — the slot whose sandbox has address src (host order), or 0. */
static int
slot_of(struct sbx_dns *d, uint32_t src)
{
    uint32_t off = src - d->block;
    return (off & 1) && off < 2 * SLOTS ? (int)(off >> 1) : 0;
}

/*
 * local_answer — the answers the resolver gives by itself for query q from
 * slot k: FORMERR (not one plain question), REFUSED (the policy), an empty
 * AAAA answer (IPv4 only), SERVFAIL (no upstream).  true when it answered
 * (to); else the question is in name and *type, to be forwarded.
 */
static bool
local_answer(struct sbx_dns *d, ldns_pkt *q, int k, char *name, size_t len, uint16_t *type,
             const struct dest *to)
{
    if (question(q, name, len, type) != 0) {
        answer_empty(d, q, LDNS_RCODE_FORMERR, to);
        return true;
    }
    enum verdict v = k ? decide(d, k, name) : V_REFUSE;
    if (v == V_REFUSE) {
        sbx_log_debug("dns: slot %d: %s refused", k, name);
        answer_empty(d, q, LDNS_RCODE_REFUSED, to);
        return true;
    }
    if (*type == LDNS_RR_TYPE_AAAA) { /* IPv4 only: the name has no address we route */
        answer_empty(d, q, LDNS_RCODE_NOERROR, to);
        return true;
    }
    if (d->nup == 0) {
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, to);
        return true;
    }
    return false;
}

/*
 * settle — answer a (the upstream's, for slot k's question qname, already
 * checked) to the sandbox: the policy decided again, the A records pinned
 * and their TTLs cut to the pins, then sent with the client's id; REFUSED
 * or SERVFAIL instead when the policy changed meanwhile or pinning failed.
 * The policy may have changed while the query was out.  d->mu is held from
 * this decision until the pins are in nft: sbx_net_update sets the new
 * policy here before it flushes the sets, so a pin made under the old
 * policy is flushed with it (lock order: d->mu, then the net's).
 */
static void
settle(struct sbx_dns *d, ldns_pkt *a, int k, const char *qname, uint16_t client_id,
       const struct dest *to)
{
    pthread_mutex_lock(&d->mu);
    enum verdict v = decide_locked(d, k, qname);
    ldns_pkt_set_id(a, client_id);
    if (v == V_REFUSE) {
        pthread_mutex_unlock(&d->mu);
        ldns_rr_list_deep_free(ldns_pkt_answer(a));
        ldns_pkt_set_answer(a, ldns_rr_list_new());
        ldns_pkt_set_ancount(a, 0);
        answer_empty(d, a, LDNS_RCODE_REFUSED, to);
        return;
    }
    struct sbx_net_buf b = {0};
    int rc = 0;
    ldns_rr_list *ans = ldns_pkt_answer(a);
    for (size_t i = 0; i < ldns_rr_list_rr_count(ans) && rc >= 0; i++) {
        ldns_rr *rr = ldns_rr_list_rr(ans, i);
        if (ldns_rr_get_type(rr) != LDNS_RR_TYPE_A || ldns_rr_rd_count(rr) != 1 ||
            ldns_rdf_size(ldns_rr_rdf(rr, 0)) != 4)
            continue;
        uint32_t ttl = ldns_rr_ttl(rr);
        ttl = ttl < PIN_MIN_S ? PIN_MIN_S : ttl > PIN_MAX_S ? PIN_MAX_S : ttl;
        uint32_t addr, eff = ttl;
        memcpy(&addr, ldns_rdf_data(ldns_rr_rdf(rr, 0)), 4);
        if (v == V_PIN) {
            rc = pin_cmds(d, k, qname, ntohl(addr), ttl, &eff, &b);
            ldns_rr_set_ttl(rr, eff);
        }
        if (rc >= 0 && d->inject)
            inject_cmds(d, k, qname, ntohl(addr), ttl, &b);
    }
    if (rc >= 0 && b.p)
        rc = d->pin(d->ctx, b.p);
    pthread_mutex_unlock(&d->mu);
    free(b.p);
    if (rc < 0) {
        sbx_log_warn("dns: slot %d: %s: pinning its addresses failed (%s): SERVFAIL", k, qname,
                     strerror(-rc));
        answer_empty(d, a, LDNS_RCODE_SERVFAIL, to);
        return;
    }
    send_pkt(d, a, to);
}

/* fresh_id — an id no pending UDP query has (the thread's own table). */
static uint16_t
fresh_id(struct sbx_dns *d, int64_t now)
{
    uint16_t id;
    bool dup;
    do {
        id = (uint16_t)arc4random();
        dup = false;
        for (int i = 0; i < PENDING && !dup; i++)
            dup = d->pend[i].used && d->pend[i].deadline_ms >= now && d->pend[i].id == id;
    } while (dup);
    return id;
}

/* send_up — pending p's query to upstream i (UDP), with a fresh id; its try
 * ends in TRY_MS.  0 or -errno. */
static int
send_up(struct sbx_dns *d, struct pending *p, int i, int64_t now)
{
    p->id = fresh_id(d, now);
    p->up = i;
    p->tried |= 1u << i;
    p->try_deadline_ms = now + TRY_MS;
    p->q[0] = (uint8_t)(p->id >> 8);
    p->q[1] = (uint8_t)p->id;
    return sendto(d->ufd, p->q, p->qlen, 0, (struct sockaddr *)&d->ups[i], sizeof(d->ups[i])) < 0
               ? -errno
               : 0;
}

/* next_up — the next upstream after i that p has not tried, or -1. */
static int
next_up(struct sbx_dns *d, const struct pending *p, int i)
{
    for (int j = 1; j < d->nup; j++) {
        int n = (i + j) % d->nup;
        if (!(p->tried & (1u << n)))
            return n;
    }
    return -1;
}

static void
on_query(struct sbx_dns *d, const uint8_t *buf, size_t len, const struct sockaddr_in *from)
{
    int k = slot_of(d, ntohl(from->sin_addr.s_addr));
    struct dest to = {.tcp_fd = -1, .to = *from};
    ldns_pkt *q = NULL;
    if (len < 12 || ldns_wire2pkt(&q, buf, len) != LDNS_STATUS_OK)
        return; /* not DNS: no answer */
    if (ldns_pkt_qr(q))
        goto out;
    char name[SBX_NET_NAME_MAX];
    uint16_t type;
    if (local_answer(d, q, k, name, sizeof(name), &type, &to))
        goto out;
    int64_t now = sbx_wall_ms();
    struct pending *p = NULL;
    for (int i = 0; i < PENDING && !p; i++)
        if (!d->pend[i].used || d->pend[i].deadline_ms < now)
            p = &d->pend[i];
    if (!p || len > sizeof(p->q)) {
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, &to);
        goto out;
    }
    *p = (struct pending){.used = true, .client_id = ldns_pkt_id(q), .client = *from,
                          .slot = k, .deadline_ms = now + PENDING_MS, .qtype = type,
                          .qlen = len};
    snprintf(p->qname, sizeof(p->qname), "%s", name);
    memcpy(p->q, buf, len);
    int i = atomic_load(&d->cur);
    while (i >= 0 && send_up(d, p, i, now) != 0)
        i = next_up(d, p, i);
    if (i < 0) {
        p->used = false;
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, &to);
    }
out:
    ldns_pkt_free(q);
}

/* fail_over — pending p's upstream did not answer in time, or answered
 * SERVFAIL: ask the next one it has not tried (the next queries start
 * there too), or answer SERVFAIL when none is left. */
static void
fail_over(struct sbx_dns *d, struct pending *p, bool timeout, int64_t now)
{
    int i = next_up(d, p, p->up);
    char a[INET_ADDRSTRLEN];
    inet_ntop(AF_INET, &d->ups[p->up].sin_addr, a, sizeof(a));
    sbx_log_debug("dns: upstream %s:%u %s for %s%s", a, ntohs(d->ups[p->up].sin_port),
                  timeout ? "did not answer" : "answered SERVFAIL", p->qname,
                  i >= 0 ? ": the next one" : "");
    if (timeout && i >= 0) /* later queries start at the next one */
        atomic_compare_exchange_strong(&d->cur, &(int){p->up}, i);
    while (i >= 0 && send_up(d, p, i, now) != 0)
        i = next_up(d, p, i);
    if (i >= 0)
        return;
    p->used = false;
    ldns_pkt *q = NULL;
    if (ldns_wire2pkt(&q, p->q, p->qlen) == LDNS_STATUS_OK) {
        struct dest to = {.tcp_fd = -1, .to = p->client};
        ldns_pkt_set_id(q, p->client_id);
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, &to);
    }
    ldns_pkt_free(q);
}

static void
on_answer(struct sbx_dns *d, const uint8_t *buf, size_t len, const struct sockaddr_in *from)
{
    int from_up = -1;
    for (int i = 0; i < d->nup && from_up < 0; i++)
        if (from->sin_addr.s_addr == d->ups[i].sin_addr.s_addr &&
            from->sin_port == d->ups[i].sin_port)
            from_up = i;
    if (from_up < 0 || len < 12)
        return;
    uint16_t id = (uint16_t)(buf[0] << 8 | buf[1]);
    int64_t now = sbx_wall_ms();
    struct pending *p = NULL;
    for (int i = 0; i < PENDING && !p; i++)
        if (d->pend[i].used && d->pend[i].id == id && d->pend[i].up == from_up &&
            d->pend[i].deadline_ms >= now)
            p = &d->pend[i];
    ldns_pkt *a = NULL;
    char name[SBX_NET_NAME_MAX];
    uint16_t type;
    if (!p || ldns_wire2pkt(&a, buf, len) != LDNS_STATUS_OK)
        return;
    if (!ldns_pkt_qr(a) || question(a, name, sizeof(name), &type) != 0 ||
        strcmp(name, p->qname) != 0 || type != p->qtype)
        goto out; /* not the answer to that question: wait for the real one */
    if (ldns_pkt_get_rcode(a) == LDNS_RCODE_SERVFAIL && next_up(d, p, p->up) >= 0) {
        fail_over(d, p, false, now);
        goto out;
    }
    p->used = false;
    struct dest to = {.tcp_fd = -1, .to = p->client};
    settle(d, a, p->slot, p->qname, p->client_id, &to);
out:
    ldns_pkt_free(a);
}

/* expire — pending queries whose try ended: the next upstream. */
static void
expire(struct sbx_dns *d)
{
    int64_t now = sbx_wall_ms();
    for (int i = 0; i < PENDING; i++) {
        struct pending *p = &d->pend[i];
        if (p->used && p->deadline_ms < now)
            p->used = false; /* the client has long given up */
        else if (p->used && p->try_deadline_ms < now)
            fail_over(d, p, true, now);
    }
}

/* ------------------------------------------------------------------------------ */
/* DNS over TCP (RFC 7766): one thread per connection, queries in turn, each
 * forwarded over TCP to the upstreams in order from the current one. */

struct tcp_conn {
    struct sbx_dns *d;
    int fd, slot;
};

/* io_full — read (rd) or write n bytes on fd within deadline (mono ms) or
 * until the resolver stops; 0 or -1. */
static int
io_full(struct sbx_dns *d, int fd, bool rd, uint8_t *b, size_t n, int64_t deadline)
{
    while (n) {
        int64_t left = deadline - sbx_mono_us() / 1000;
        struct pollfd fds[2] = {{fd, rd ? POLLIN : POLLOUT, 0}, {d->wake[0], POLLIN, 0}};
        if (left <= 0 || poll(fds, 2, (int)left) <= 0 || fds[1].revents)
            return -1;
        ssize_t r = rd ? recv(fd, b, n, MSG_DONTWAIT) : send(fd, b, n, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r < 0 && (errno == EAGAIN || errno == EINTR))
            continue;
        if (r <= 0)
            return -1;
        b += r;
        n -= (size_t)r;
    }
    return 0;
}

/* tcp_ask — query q (len bytes, its id already fresh) to upstream i over
 * TCP; the answer (heap, *alen) or NULL. */
static uint8_t *
tcp_ask(struct sbx_dns *d, int i, const uint8_t *q, size_t len, size_t *alen)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return NULL;
    uint8_t *a = NULL;
    int64_t deadline = sbx_mono_us() / 1000 + TRY_MS * 2;
    uint8_t hdr[2] = {(uint8_t)(len >> 8), (uint8_t)len};
    if (connect(fd, (struct sockaddr *)&d->ups[i], sizeof(d->ups[i])) < 0 &&
        errno != EINPROGRESS)
        goto out;
    if (io_full(d, fd, false, hdr, 2, deadline) || io_full(d, fd, false, (uint8_t *)q, len,
                                                           deadline) ||
        io_full(d, fd, true, hdr, 2, deadline))
        goto out;
    *alen = (size_t)(hdr[0] << 8 | hdr[1]);
    a = sbx_xmalloc(*alen + 1);
    if (*alen < 12 || io_full(d, fd, true, a, *alen, deadline)) {
        free(a);
        a = NULL;
    }
out:
    close(fd);
    return a;
}

static void
tcp_query(struct tcp_conn *c, uint8_t *buf, size_t len)
{
    struct sbx_dns *d = c->d;
    struct dest to = {.tcp_fd = c->fd};
    ldns_pkt *q = NULL, *a = NULL;
    if (len < 12 || ldns_wire2pkt(&q, buf, len) != LDNS_STATUS_OK)
        return;
    char name[SBX_NET_NAME_MAX], aname[SBX_NET_NAME_MAX];
    uint16_t type, atype;
    if (ldns_pkt_qr(q) || local_answer(d, q, c->slot, name, sizeof(name), &type, &to))
        goto out;
    uint16_t client_id = ldns_pkt_id(q), id = (uint16_t)arc4random();
    buf[0] = (uint8_t)(id >> 8);
    buf[1] = (uint8_t)id;
    int start = atomic_load(&d->cur);
    for (int j = 0; j < d->nup && !a; j++) {
        int i = (start + j) % d->nup;
        size_t alen = 0;
        uint8_t *ab = tcp_ask(d, i, buf, len, &alen);
        if (ab && ldns_wire2pkt(&a, ab, alen) == LDNS_STATUS_OK &&
            !(ldns_pkt_qr(a) && ldns_pkt_id(a) == id &&
              question(a, aname, sizeof(aname), &atype) == 0 && !strcmp(aname, name) &&
              atype == type &&
              (ldns_pkt_get_rcode(a) != LDNS_RCODE_SERVFAIL || j == d->nup - 1))) {
            ldns_pkt_free(a); /* not the answer, or SERVFAIL with another upstream left */
            a = NULL;
        }
        free(ab);
    }
    if (!a) {
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, &to);
        goto out;
    }
    settle(d, a, c->slot, name, client_id, &to);
out:
    ldns_pkt_free(a);
    ldns_pkt_free(q);
}

static void *
tcp_main(void *arg)
{
    struct tcp_conn *c = arg;
    struct sbx_dns *d = c->d;
    uint8_t *buf = sbx_xmalloc(65536);
    for (;;) {
        uint8_t hdr[2];
        int64_t deadline = sbx_mono_us() / 1000 + TCP_IDLE_MS;
        if (io_full(d, c->fd, true, hdr, 2, deadline))
            break;
        size_t len = (size_t)(hdr[0] << 8 | hdr[1]);
        if (io_full(d, c->fd, true, buf, len, deadline))
            break;
        tcp_query(c, buf, len);
    }
    free(buf);
    close(c->fd);
    pthread_mutex_lock(&d->tcp_mu);
    d->tcp_conns--;
    d->tcp_slot[c->slot]--;
    pthread_cond_broadcast(&d->tcp_cv);
    pthread_mutex_unlock(&d->tcp_mu);
    free(c);
    return NULL;
}

static void
on_tcp_accept(struct sbx_dns *d)
{
    struct sockaddr_in peer;
    socklen_t pl = sizeof(peer);
    int fd = accept4(d->tfd, (struct sockaddr *)&peer, &pl, SOCK_CLOEXEC);
    if (fd < 0)
        return;
    int k = slot_of(d, ntohl(peer.sin_addr.s_addr));
    pthread_mutex_lock(&d->tcp_mu);
    bool ok = k > 0 && d->tcp_conns < TCP_CONNS_MAX && d->tcp_slot[k] < TCP_SLOT_MAX;
    if (ok) {
        d->tcp_conns++;
        d->tcp_slot[k]++;
    }
    pthread_mutex_unlock(&d->tcp_mu);
    if (!ok) {
        close(fd);
        return;
    }
    struct tcp_conn *c = sbx_xcalloc(1, sizeof(*c));
    *c = (struct tcp_conn){.d = d, .fd = fd, .slot = k};
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&at, 256 * 1024);
    pthread_t th;
    if (pthread_create(&th, &at, tcp_main, c) != 0) {
        close(fd);
        free(c);
        pthread_mutex_lock(&d->tcp_mu);
        d->tcp_conns--;
        d->tcp_slot[k]--;
        pthread_mutex_unlock(&d->tcp_mu);
    }
    pthread_attr_destroy(&at);
}

static void *
dns_main(void *arg)
{
    struct sbx_dns *d = arg;
    uint8_t buf[4096];
    for (;;) {
        struct pollfd fds[4] = {{d->dfd, POLLIN, 0}, {d->ufd, POLLIN, 0}, {d->tfd, POLLIN, 0},
                                {d->wake[0], POLLIN, 0}};
        bool pending = false;
        for (int i = 0; i < PENDING && !pending; i++)
            pending = d->pend[i].used;
        if (poll(fds, 4, pending ? 100 : -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[3].revents)
            break;
        if (fds[2].revents)
            on_tcp_accept(d);
        for (int i = 0; i < 2; i++) {
            if (!fds[i].revents)
                continue;
            struct sockaddr_in from;
            socklen_t fl = sizeof(from);
            ssize_t n = recvfrom(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT,
                                 (struct sockaddr *)&from, &fl);
            if (n <= 0 || fl != sizeof(from) || from.sin_family != AF_INET)
                continue;
            if (i == 0)
                on_query(d, buf, (size_t)n, &from);
            else
                on_answer(d, buf, (size_t)n, &from);
        }
        if (pending)
            expire(d);
    }
    return NULL;
}

/* A UDP or TCP (listening) socket of netns nsfd bound to
 * SBX_NET_RESOLVER:53 (IP_FREEBIND: the address may come to lo after). */
static int
listen_in(int nsfd, int type)
{
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        return -errno;
    int fd = -1, e = 0;
    if (setns(nsfd, CLONE_NEWNET) == 0) {
        fd = socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        e = fd < 0 ? errno : 0;
        if (setns(self, CLONE_NEWNET) != 0) {
            sbx_log_error("dns: cannot return to the shard's network namespace: %s",
                          strerror(errno));
            abort();
        }
    } else {
        e = errno;
    }
    close(self);
    if (fd < 0)
        return -e;
    int one = 1;
    setsockopt(fd, IPPROTO_IP, IP_FREEBIND, &one, sizeof(one));
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(53)};
    inet_pton(AF_INET, SBX_NET_RESOLVER, &sa.sin_addr);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
        e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int
sbx_dns_start(struct sbx_dns **out, int router_nsfd, const char *upstream, uint32_t block,
              const struct sbx_inject_set *inject, sbx_dns_pin_fn pin, void *ctx, char *why,
              size_t whylen)
{
    struct sbx_dns *d = sbx_xcalloc(1, sizeof(*d));
    d->inject = inject && inject->n ? inject : NULL;
    d->dfd = d->ufd = d->tfd = d->wake[0] = d->wake[1] = -1;
    d->block = block;
    d->pin = pin;
    d->ctx = ctx;
    pthread_mutex_init(&d->mu, NULL);
    pthread_mutex_init(&d->tcp_mu, NULL);
    pthread_cond_init(&d->tcp_cv, NULL);
    int rc = 0;
    if (upstream && upstream[0]) { /* "A.B.C.D[:PORT][,…]", in order of preference */
        char list[256];
        snprintf(list, sizeof(list), "%s", upstream);
        char *save = NULL;
        for (char *t = strtok_r(list, ",", &save); t && rc == 0; t = strtok_r(NULL, ",", &save)) {
            t += strspn(t, " ");
            if (d->nup == UPS_MAX || parse_addr_port(t, &d->ups[d->nup++]) != 0)
                rc = -EINVAL;
        }
        if (rc || d->nup == 0 || strlen(upstream) >= sizeof(list)) {
            snprintf(why, whylen, "--dns-upstream '%s': expected A.B.C.D[:PORT], or up to %d "
                     "of them separated by ',' (tried in that order)", upstream, UPS_MAX);
            rc = -EINVAL;
            goto fail;
        }
    } else if (host_nameserver(&d->ups[0]) == 0) {
        d->nup = 1;
    } else {
        sbx_log_warn("dns: no IPv4 nameserver in /etc/resolv.conf and no --dns-upstream: "
                     "sandboxes' lookups of allowed names will fail (SERVFAIL)");
    }
    if ((d->dfd = listen_in(router_nsfd, SOCK_DGRAM)) < 0 ||
        (d->tfd = listen_in(router_nsfd, SOCK_STREAM)) < 0 || listen(d->tfd, 64) < 0) {
        rc = d->dfd < 0 ? d->dfd : d->tfd < 0 ? d->tfd : -errno;
        snprintf(why, whylen, "resolver socket %s:53 in the router: %s", SBX_NET_RESOLVER,
                 strerror(-rc));
        goto fail;
    }
    d->ufd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (d->ufd < 0 || pipe2(d->wake, O_CLOEXEC) < 0) {
        rc = -errno;
        snprintf(why, whylen, "resolver sockets: %s", strerror(errno));
        goto fail;
    }
    if ((rc = -pthread_create(&d->th, NULL, dns_main, d)) != 0) {
        snprintf(why, whylen, "resolver thread: %s", strerror(-rc));
        goto fail;
    }
    d->started = true;
    char up[INET_ADDRSTRLEN] = "none";
    if (d->nup)
        inet_ntop(AF_INET, &d->ups[0].sin_addr, up, sizeof(up));
    sbx_log_info("dns: resolver %s:53 (UDP, TCP) up, upstream %s:%u%s", SBX_NET_RESOLVER, up,
                 ntohs(d->ups[0].sin_port), d->nup > 1 ? " and others after it" : "");
    *out = d;
    return 0;
fail:
    sbx_dns_stop(d);
    return rc;
}

void
sbx_dns_stop(struct sbx_dns *d)
{
    if (!d)
        return;
    if (d->started) {
        (void)!write(d->wake[1], "x", 1);
        pthread_join(d->th, NULL);
        pthread_mutex_lock(&d->tcp_mu); /* the TCP connections' threads see wake too */
        while (d->tcp_conns > 0)
            pthread_cond_wait(&d->tcp_cv, &d->tcp_mu);
        pthread_mutex_unlock(&d->tcp_mu);
    }
    int fds[] = {d->dfd, d->ufd, d->tfd, d->wake[0], d->wake[1]};
    for (size_t i = 0; i < SBX_ARRAY_LEN(fds); i++)
        if (fds[i] >= 0)
            close(fds[i]);
    for (int k = 0; k < SLOTS; k++) {
        free(d->slots[k].names);
        free(d->slots[k].pins);
        free(d->slots[k].deny);
        free(d->slots[k].inj);
    }
    pthread_mutex_destroy(&d->mu);
    pthread_mutex_destroy(&d->tcp_mu);
    pthread_cond_destroy(&d->tcp_cv);
    free(d);
}
