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
 * IPv4 only; UDP only (an answer the upstream truncates reaches the sandbox
 * truncated, and its retry over TCP is refused by the router).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ldns/ldns.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
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
};

struct sbx_dns {
    pthread_t th;
    bool started;
    int dfd, ufd, wake[2];
    bool have_up;
    struct sockaddr_in up;
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

static void
send_pkt(struct sbx_dns *d, ldns_pkt *p, const struct sockaddr_in *to)
{
    uint8_t *wire = NULL;
    size_t len = 0;
    if (ldns_pkt2wire(&wire, p, &len) == LDNS_STATUS_OK)
        sendto(d->dfd, wire, len, 0, (const struct sockaddr *)to, sizeof(*to));
    free(wire);
}

/* Answer packet q (borrowed, turned into the answer) with rcode and what it holds. */
static void
answer_empty(struct sbx_dns *d, ldns_pkt *q, ldns_pkt_rcode rcode, const struct sockaddr_in *to)
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

static void
on_query(struct sbx_dns *d, const uint8_t *buf, size_t len, const struct sockaddr_in *from)
{
    uint32_t src = ntohl(from->sin_addr.s_addr);
    uint32_t off = src - d->block;
    int k = (off & 1) && off < 2 * SLOTS ? (int)(off >> 1) : 0;
    ldns_pkt *q = NULL;
    if (len < 12 || ldns_wire2pkt(&q, buf, len) != LDNS_STATUS_OK)
        return; /* not DNS: no answer */
    if (ldns_pkt_qr(q))
        goto out;
    char name[SBX_NET_NAME_MAX];
    uint16_t type;
    if (question(q, name, sizeof(name), &type) != 0) {
        answer_empty(d, q, LDNS_RCODE_FORMERR, from);
        goto out;
    }
    enum verdict v = k ? decide(d, k, name) : V_REFUSE;
    if (v == V_REFUSE) {
        sbx_log_debug("dns: slot %d: %s refused", k, name);
        answer_empty(d, q, LDNS_RCODE_REFUSED, from);
        goto out;
    }
    if (type == LDNS_RR_TYPE_AAAA) { /* IPv4 only: the name has no address we route */
        answer_empty(d, q, LDNS_RCODE_NOERROR, from);
        goto out;
    }
    if (!d->have_up) {
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, from);
        goto out;
    }
    int64_t now = sbx_wall_ms();
    struct pending *p = NULL;
    for (int i = 0; i < PENDING && !p; i++)
        if (!d->pend[i].used || d->pend[i].deadline_ms < now)
            p = &d->pend[i];
    if (!p) {
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, from);
        goto out;
    }
    uint16_t id;
    bool dup;
    do { /* an id no other pending query has */
        id = (uint16_t)arc4random();
        dup = false;
        for (int i = 0; i < PENDING && !dup; i++)
            dup = d->pend[i].used && d->pend[i].deadline_ms >= now && d->pend[i].id == id;
    } while (dup);
    *p = (struct pending){.used = true, .id = id, .client_id = ldns_pkt_id(q), .client = *from,
                          .slot = k, .deadline_ms = now + PENDING_MS, .qtype = type};
    snprintf(p->qname, sizeof(p->qname), "%s", name);
    uint8_t fwd[4096];
    memcpy(fwd, buf, SBX_MIN(len, sizeof(fwd)));
    fwd[0] = (uint8_t)(id >> 8);
    fwd[1] = (uint8_t)id;
    if (sendto(d->ufd, fwd, SBX_MIN(len, sizeof(fwd)), 0, (struct sockaddr *)&d->up,
               sizeof(d->up)) < 0) {
        p->used = false;
        answer_empty(d, q, LDNS_RCODE_SERVFAIL, from);
    }
out:
    ldns_pkt_free(q);
}

static void
on_answer(struct sbx_dns *d, const uint8_t *buf, size_t len, const struct sockaddr_in *from)
{
    if (from->sin_addr.s_addr != d->up.sin_addr.s_addr || from->sin_port != d->up.sin_port ||
        len < 12)
        return;
    uint16_t id = (uint16_t)(buf[0] << 8 | buf[1]);
    int64_t now = sbx_wall_ms();
    struct pending *p = NULL;
    for (int i = 0; i < PENDING && !p; i++)
        if (d->pend[i].used && d->pend[i].id == id && d->pend[i].deadline_ms >= now)
            p = &d->pend[i];
    ldns_pkt *a = NULL;
    char name[SBX_NET_NAME_MAX];
    uint16_t type;
    if (!p || ldns_wire2pkt(&a, buf, len) != LDNS_STATUS_OK)
        return;
    if (!ldns_pkt_qr(a) || question(a, name, sizeof(name), &type) != 0 ||
        strcmp(name, p->qname) != 0 || type != p->qtype)
        goto out; /* not the answer to that question: wait for the real one */
    p->used = false;
    /* The policy may have changed while the query was out.  d->mu is held
     * from this decision until the pins are in nft: sbx_net_update sets the
     * new policy here before it flushes the sets, so a pin made under the
     * old policy is flushed with it (lock order: d->mu, then the net's). */
    pthread_mutex_lock(&d->mu);
    enum verdict v = decide_locked(d, p->slot, p->qname);
    ldns_pkt_set_id(a, p->client_id);
    if (v == V_REFUSE) {
        pthread_mutex_unlock(&d->mu);
        ldns_rr_list_deep_free(ldns_pkt_answer(a));
        ldns_pkt_set_answer(a, ldns_rr_list_new());
        ldns_pkt_set_ancount(a, 0);
        answer_empty(d, a, LDNS_RCODE_REFUSED, &p->client);
        goto out;
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
            rc = pin_cmds(d, p->slot, p->qname, ntohl(addr), ttl, &eff, &b);
            ldns_rr_set_ttl(rr, eff);
        }
        if (rc >= 0 && d->inject)
            inject_cmds(d, p->slot, p->qname, ntohl(addr), ttl, &b);
    }
    if (rc >= 0 && b.p)
        rc = d->pin(d->ctx, b.p);
    pthread_mutex_unlock(&d->mu);
    free(b.p);
    if (rc < 0) {
        sbx_log_warn("dns: slot %d: %s: pinning its addresses failed (%s): SERVFAIL", p->slot,
                     p->qname, strerror(-rc));
        answer_empty(d, a, LDNS_RCODE_SERVFAIL, &p->client);
        goto out;
    }
    send_pkt(d, a, &p->client);
out:
    ldns_pkt_free(a);
}

static void *
dns_main(void *arg)
{
    struct sbx_dns *d = arg;
    uint8_t buf[4096];
    for (;;) {
        struct pollfd fds[3] = {{d->dfd, POLLIN, 0}, {d->ufd, POLLIN, 0}, {d->wake[0], POLLIN, 0}};
        if (poll(fds, 3, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (fds[2].revents)
            break;
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
    }
    return NULL;
}

/* A UDP socket of netns nsfd bound to SBX_NET_RESOLVER:53 (IP_FREEBIND: the
 * address may come to lo after). */
static int
listen_in(int nsfd)
{
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        return -errno;
    int fd = -1, e = 0;
    if (setns(nsfd, CLONE_NEWNET) == 0) {
        fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
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
    d->dfd = d->ufd = d->wake[0] = d->wake[1] = -1;
    d->block = block;
    d->pin = pin;
    d->ctx = ctx;
    pthread_mutex_init(&d->mu, NULL);
    int rc = 0;
    if (upstream && upstream[0]) {
        if (parse_addr_port(upstream, &d->up) != 0) {
            snprintf(why, whylen, "--dns-upstream '%s': expected A.B.C.D[:PORT]", upstream);
            rc = -EINVAL;
            goto fail;
        }
        d->have_up = true;
    } else if (host_nameserver(&d->up) == 0) {
        d->have_up = true;
    } else {
        sbx_log_warn("dns: no IPv4 nameserver in /etc/resolv.conf and no --dns-upstream: "
                     "sandboxes' lookups of allowed names will fail (SERVFAIL)");
    }
    if ((d->dfd = listen_in(router_nsfd)) < 0) {
        rc = d->dfd;
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
    if (d->have_up)
        inet_ntop(AF_INET, &d->up.sin_addr, up, sizeof(up));
    sbx_log_info("dns: resolver %s:53 up, upstream %s:%u", SBX_NET_RESOLVER, up,
                 ntohs(d->up.sin_port));
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
    }
    int fds[] = {d->dfd, d->ufd, d->wake[0], d->wake[1]};
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
    free(d);
}
