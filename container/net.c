/*
 * net.c — the shard's router network namespace and the sandboxes' veths
 * into it (net.h; docs/network.md).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netdb.h>
#include <nftables/libnftables.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "net.h"
#include "net_int.h"

#define BLOCK_PLEN 22
#define SLOTS 512 /* /31s in a /22; slot 0 is the router's uplink */

struct sbx_net {
    pthread_mutex_t mu;        /* guards everything below */
    char name[64];             /* the shard's name */
    char range[32];            /* "A.B.C.D/N" */
    uint32_t range_base;
    uint8_t range_plen;
    bool up;                   /* router made */
    uint32_t block;            /* this shard's /22 (host order) */
    int lockfd;                /* flock on lockpath, -1 */
    char lockpath[96];
    int nsfd;                  /* the router netns, -1 */
    struct nft_ctx *nft;       /* libnftables, its netlink socket in the router netns */
    char nsname[80];           /* "sbx-<name>" under /run/netns */
    char hostif[16];           /* "sbx<hex block>" in the host netns */
    char table[24];            /* host nft table "sbx_<hex block>" */
    bool used[SLOTS];
    pthread_mutex_t tc_mu;     /* one tc run at a time (the first makes up0's htb); guards: */
    uint32_t bw[SLOTS];        /* each slot's bandwidth limit now, Mbit/s (0: none) */
    bool htb;                  /* up0 has its root htb (made by the first limit) */
    char upstream[64];         /* --dns-upstream, "" = the host's resolv.conf */
    struct sbx_dns *dns;       /* the sandboxes' resolver (net_dns.c), once the router is up */
    struct sbx_inject_set *inject; /* --egress-inject's rules (net_proxy.c); NULL: none */
    struct sbx_proxy *proxy;   /* the injecting proxy, once the router is up (with rules) */
    int next;                  /* next slot to try: round robin, so a freed slot's
                                * veth has time to go with its netns */
    struct sbx_net_stats gone; /* counters of detached slots, summed (under mu) */
    uint32_t deny[SBX_NET_DENY_MAX]; /* sbx_net_deny_add's addresses (host order), under mu */
    int ndeny;
};

static const char IP[] = "/usr/sbin/ip";
static const char NFT[] = "/usr/sbin/nft";

/*
 * run — run argv[0] with argv in netns nsfd (-1: ours), input on stdin,
 * stdout+stderr into out (NUL-terminated, truncated).  The child is a fork
 * of a multi-threaded process: it makes only async-signal-safe calls.
 * Returns the exit status (0 = success), or -errno if it could not run.
 */
static int
run(const char *const argv[], int nsfd, const char *input, char *out, size_t outlen)
{
    int in[2] = {-1, -1}, op[2] = {-1, -1};
    if (pipe2(in, O_CLOEXEC) < 0)
        return -errno;
    if (pipe2(op, O_CLOEXEC) < 0) {
        int e = errno;
        close(in[0]);
        close(in[1]);
        return -e;
    }
    pid_t pid = fork();
    if (pid == 0) {
        if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) < 0)
            _exit(126);
        dup2(in[0], 0);
        dup2(op[1], 1);
        dup2(op[1], 2);
        static char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL=C", NULL};
        execve(argv[0], (char *const *)argv, envp);
        _exit(127);
    }
    int rc = pid < 0 ? -errno : 0;
    close(in[0]);
    close(op[1]);
    if (rc == 0 && input)
        sbx_write_full(in[1], input, strlen(input));
    close(in[1]);
    size_t n = 0;
    for (;;) {
        char tmp[512];
        ssize_t r = read(op[0], tmp, sizeof(tmp));
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        size_t k = SBX_MIN((size_t)r, outlen > n + 1 ? outlen - n - 1 : 0);
        memcpy(out + n, tmp, k);
        n += k;
    }
    if (outlen)
        out[n] = '\0';
    close(op[0]);
    if (rc)
        return rc;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -errno;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void
ip4(char *out, size_t len, uint32_t a)
{
    struct in_addr ia = {.s_addr = htonl(a)};
    inet_ntop(AF_INET, &ia, out, (socklen_t)len);
}

/*
 * nft_ctx_in — a libnftables context whose netlink socket lives in netns
 * nsfd: the socket is opened by nft_ctx_new, in the netns of the calling
 * thread, so this thread goes there for the call and comes back (a thread
 * may change its own network namespace; the others are untouched).
 * Output and errors are buffered.  NULL on failure.
 */
static struct nft_ctx *
nft_ctx_in(int nsfd)
{
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        return NULL;
    struct nft_ctx *c = NULL;
    if (setns(nsfd, CLONE_NEWNET) == 0) {
        c = nft_ctx_new(NFT_CTX_DEFAULT);
        if (setns(self, CLONE_NEWNET) != 0) {
            /* This thread would go on in the router's namespace. */
            sbx_log_error("network: cannot return to the shard's network namespace: %s",
                          strerror(errno));
            abort();
        }
    }
    close(self);
    if (c) {
        nft_ctx_buffer_output(c);
        nft_ctx_buffer_error(c);
    }
    return c;
}

/* pin_locked — the resolver's pin callback: nft commands under n->mu. */
static int pin_locked(void *ctx, const char *cmds);

/*
 * Warn when the host's uplink does not forward IPv4: the router's NATed
 * traffic leaves, but the replies coming back on the uplink are dropped
 * (the kernel forwards by the *input* interface's
 * net.ipv4.conf.<if>.forwarding, ip-sysctl.rst), so egress sandboxes reach
 * only hosts behind interfaces that forward — a fresh Debian host has
 * forwarding off everywhere.  sbx does not change it (docs/network.md,
 * "What the host must provide").  The uplinks: the interfaces of the
 * default routes in /proc/net/route.
 */
static void
warn_uplink_forwarding(void)
{
    FILE *f = fopen("/proc/net/route", "re");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        char ifname[32];
        unsigned long dest, mask;
        if (sscanf(line, "%31s %lx %*x %*x %*d %*d %*d %lx", ifname, &dest, &mask) != 3 ||
            dest != 0 || mask != 0)
            continue;
        char path[96], v[8] = "";
        snprintf(path, sizeof(path), "/proc/sys/net/ipv4/conf/%s/forwarding", ifname);
        FILE *s = fopen(path, "re");
        if (!s)
            continue;
        if (fgets(v, sizeof(v), s) && v[0] == '0')
            sbx_log_warn("network: the host's uplink %s does not forward IPv4 "
                         "(net.ipv4.conf.%s.forwarding = 0): egress sandboxes will not reach "
                         "hosts through it until it does (docs/network.md, \"What the host "
                         "must provide\")",
                         ifname, ifname);
        fclose(s);
    }
    fclose(f);
}

/* nft — run commands in the router's table (n->mu held); 0 or -EIO with
 * nft's message in err.  *out (may be NULL) is nft's output, valid until the
 * next call. */
static int
nft(sbx_net *n, const char *cmds, const char **out, char *err, size_t errlen)
{
    int rc = nft_run_cmd_from_buffer(n->nft, cmds);
    const char *o = nft_ctx_get_output_buffer(n->nft);
    const char *e = nft_ctx_get_error_buffer(n->nft);
    if (out)
        *out = o;
    if (err && errlen)
        snprintf(err, errlen, "%s", e ? e : "");
    return rc == 0 ? 0 : -EIO;
}

static int
pin_locked(void *ctx, const char *cmds)
{
    sbx_net *n = ctx;
    char err[512];
    pthread_mutex_lock(&n->mu);
    int rc = nft(n, cmds, NULL, err, sizeof(err));
    pthread_mutex_unlock(&n->mu);
    if (rc)
        sbx_log_warn("network: pinning resolved addresses: %s", err);
    return rc;
}

/* set_bandwidth — slot k's limit to mbps (rtnetlink in the router's netns:
 * a tbf on s<k>, a class 1:<k> of the uplink's htb); 0 or SBX_E_CONTAINER
 * (why).  A detach finds s<k> gone with the sandbox's netns, or going. */
static int
set_bandwidth(sbx_net *n, int k, uint32_t mbps, char *why, size_t whylen)
{
    pthread_mutex_lock(&n->tc_mu);
    int rc = 0, nl = -1;
    const char *step = "";
    uint32_t had = n->bw[k];
    if (had == mbps)
        goto out;
    pthread_mutex_lock(&n->mu);
    int nsfd = n->nsfd;
    pthread_mutex_unlock(&n->mu);
    char ifn[16];
    snprintf(ifn, sizeof(ifn), "s%d", k);
    step = "netlink socket";
    if ((rc = nl = sbx_nl_open_in(nsfd)) < 0)
        goto out;
    int up = sbx_nl_index(nl, "up0"), si = sbx_nl_index(nl, ifn);
    step = "up0";
    if ((rc = up) < 0)
        goto out;
    rc = 0;
    if (had) { /* the class first: s<k>'s qdisc may have gone with it */
        step = "the old class";
        if ((rc = sbx_nl_tc_del(nl, up, true, (uint16_t)k)) != 0 && rc != -ENOENT)
            goto out;
        if (si > 0)
            sbx_nl_tc_del(nl, si, false, 0);
        n->bw[k] = 0;
        rc = 0;
    }
    if (mbps) {
        uint64_t rate = (uint64_t)mbps * 125000u; /* bytes/s */
        /* Burst: 10 ms of the rate, at least 64 KiB (one TSO segment of the
         * veth); queue: 50 ms of it more (tc's "latency 50ms"). */
        uint32_t burst = (uint32_t)SBX_MAX(rate / 100, 65536u);
        uint32_t limit = (uint32_t)(rate / 20 + burst);
        step = ifn;
        if ((rc = si) < 0)
            goto out;
        if (!n->htb) {
            step = "the uplink's htb";
            if ((rc = sbx_nl_htb_root(nl, up)) != 0 && rc != -EEXIST)
                goto out;
            n->htb = true;
        }
        step = "tbf";
        if ((rc = sbx_nl_tbf(nl, si, rate, burst, limit)) != 0)
            goto out;
        step = "htb class";
        if ((rc = sbx_nl_htb_class(nl, up, (uint16_t)k, rate, burst)) != 0)
            goto out;
        n->bw[k] = mbps;
    }
out:
    if (nl >= 0)
        close(nl);
    pthread_mutex_unlock(&n->tc_mu);
    if (rc < 0) {
        snprintf(why, whylen, "bandwidth limit of slot %d: %s: %s", k, step, strerror(-rc));
        return SBX_E_CONTAINER;
    }
    return 0;
}

int
sbx_net_new(sbx_net **out, const struct sbx_net_conf *conf, char *why, size_t whylen)
{
    uint32_t base;
    uint8_t plen;
    if (sbx_net_range_parse(conf->range, &base, &plen) != 0) {
        snprintf(why, whylen, "--network-range '%s': expected an IPv4 CIDR from /8 to /22",
                 conf->range ? conf->range : "");
        return SBX_E_VALIDATION;
    }
    if (strlen(conf->name) > 60) {
        snprintf(why, whylen, "shard name too long for a netns name");
        return SBX_E_VALIDATION;
    }
    sbx_net *n = sbx_xcalloc(1, sizeof(*n));
    pthread_mutex_init(&n->mu, NULL);
    pthread_mutex_init(&n->tc_mu, NULL);
    snprintf(n->name, sizeof(n->name), "%s", conf->name);
    char a[INET_ADDRSTRLEN];
    ip4(a, sizeof(a), base);
    snprintf(n->range, sizeof(n->range), "%s/%u", a, plen);
    n->range_base = base;
    n->range_plen = plen;
    n->lockfd = n->nsfd = -1;
    n->next = 1;
    snprintf(n->upstream, sizeof(n->upstream), "%s", conf->dns_upstream ? conf->dns_upstream : "");
    snprintf(n->nsname, sizeof(n->nsname), "sbx-%s", conf->name);
    if (conf->inject_file && conf->inject_file[0]) {
        int rc = sbx_inject_load(conf->inject_file, &n->inject, why, whylen);
        if (rc) {
            sbx_net_free(n);
            return rc;
        }
    }
    *out = n;
    return 0;
}

/* The proxy asks whether slot k's resolver answered host with addr. */
static bool
resolved_cb(void *ctx, int k, uint32_t addr, const char *host)
{
    sbx_net *n = ctx;
    return sbx_dns_resolved(n->dns, k, addr, host);
}

/* Take the first free /22 block of the range: flock /run/sbx/net-<B>.lock,
 * checking that the file we locked is still the one at the path (a holder
 * that stops unlinks it). */
static int
take_block(sbx_net *n, char *why, size_t whylen)
{
    uint32_t nblocks = 1u << (BLOCK_PLEN - n->range_plen);
    mkdir("/run/sbx", 0755);
    for (uint32_t i = 0; i < nblocks; i++) {
        uint32_t b = n->range_base + (i << (32 - BLOCK_PLEN));
        char a[INET_ADDRSTRLEN], path[96];
        ip4(a, sizeof(a), b);
        snprintf(path, sizeof(path), "/run/sbx/net-%s.lock", a);
        int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            continue;
        struct stat s1, s2;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && fstat(fd, &s1) == 0 && stat(path, &s2) == 0 &&
            s1.st_ino == s2.st_ino) {
            char pid[32];
            int k = snprintf(pid, sizeof(pid), "%d %s\n", (int)getpid(), n->name);
            if (ftruncate(fd, 0) == 0)
                sbx_write_full(fd, pid, (size_t)k);
            n->lockfd = fd;
            n->block = b;
            snprintf(n->lockpath, sizeof(n->lockpath), "%s", path);
            snprintf(n->hostif, sizeof(n->hostif), "sbx%08x", b);
            snprintf(n->table, sizeof(n->table), "sbx_%08x", b);
            return 0;
        }
        close(fd);
    }
    snprintf(why, whylen, "every /22 block of the network range %s is taken by a live shard",
             n->range);
    return SBX_E_CONTAINER;
}

/* Remove what a crashed holder of our block or of our name left. */
static void
remove_stale(sbx_net *n)
{
    char out[256];
    const char *const a1[] = {IP, "netns", "delete", n->nsname, NULL};
    const char *const a2[] = {IP, "link", "delete", n->hostif, NULL};
    const char *const a3[] = {NFT, "delete", "table", "inet", n->table, NULL};
    run(a1, -1, NULL, out, sizeof(out));
    run(a2, -1, NULL, out, sizeof(out));
    run(a3, -1, NULL, out, sizeof(out));
}

static int
router_up(sbx_net *n, char *why, size_t whylen)
{
    char out[1024], cmd[1024], hostaddr[INET_ADDRSTRLEN], upaddr[INET_ADDRSTRLEN], path[128];
    int rc = take_block(n, why, whylen);
    if (rc)
        return rc;
    remove_stale(n);
    ip4(hostaddr, sizeof(hostaddr), n->block);
    ip4(upaddr, sizeof(upaddr), n->block + 1);
    const char *const add[] = {IP, "netns", "add", n->nsname, NULL};
    if ((rc = run(add, -1, NULL, out, sizeof(out))) != 0) {
        snprintf(why, whylen, "ip netns add %s: %s", n->nsname, out);
        goto fail;
    }
    snprintf(path, sizeof(path), "/run/netns/%s", n->nsname);
    n->nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (n->nsfd < 0) {
        snprintf(why, whylen, "open %s: %s", path, strerror(errno));
        goto fail;
    }
    /* Host side: the uplink veth, its /31, no IPv6, forwarding on it only. */
    snprintf(cmd, sizeof(cmd),
             "link add %s type veth peer name up0 netns %s\n"
             "link set %s alias sbx:%s\n"
             "addr add %s/31 dev %s\n"
             "link set %s up\n",
             n->hostif, n->nsname, n->hostif, n->nsname, hostaddr, n->hostif, n->hostif);
    const char *const batch[] = {IP, "-batch", "-", NULL};
    if ((rc = run(batch, -1, cmd, out, sizeof(out))) != 0) {
        snprintf(why, whylen, "host side of the router's uplink: %s", out);
        goto fail;
    }
    char sys[160];
    snprintf(sys, sizeof(sys), "/proc/sys/net/ipv6/conf/%s/disable_ipv6", n->hostif);
    sbx_fs_write(sys, "1");
    snprintf(sys, sizeof(sys), "/proc/sys/net/ipv4/conf/%s/forwarding", n->hostif);
    if ((rc = sbx_fs_write(sys, "1")) != 0) {
        snprintf(why, whylen, "enable forwarding on %s: %s", n->hostif, strerror(-rc));
        goto fail;
    }
    /* The host's table: nothing from the router reaches the host itself
     * (its addresses, whatever they become), and what it forwards leaves
     * with the address of the outgoing interface. */
    snprintf(cmd, sizeof(cmd),
             "table inet %s {\n"
             " comment \"sbx:%s\"\n"
             " chain input { type filter hook input priority filter - 10; iifname \"%s\" drop; }\n"
             " chain post { type nat hook postrouting priority srcnat;"
             " ip saddr %s oifname != \"%s\" masquerade; }\n"
             "}\n",
             n->table, n->nsname, n->hostif, upaddr, n->hostif);
    const char *const nftf[] = {NFT, "-f", "-", NULL};
    if ((rc = run(nftf, -1, cmd, out, sizeof(out))) != 0) {
        snprintf(why, whylen, "host nft table %s: %s", n->table, out);
        goto fail;
    }
    /* Router side. */
    snprintf(cmd, sizeof(cmd),
             "link set lo up\n"
             "addr add " SBX_NET_RESOLVER "/32 dev lo\n"
             "addr add %s/31 dev up0\n"
             "link set up0 up\n"
             "route add default via %s\n",
             upaddr, hostaddr);
    if ((rc = run(batch, n->nsfd, cmd, out, sizeof(out))) != 0) {
        snprintf(why, whylen, "router side of the uplink: %s", out);
        goto fail;
    }
    const char *const sysctl[] = {"/usr/sbin/sysctl", "-q", "-w", "net.ipv4.ip_forward=1",
                                  "net.ipv6.conf.all.disable_ipv6=1",
                                  "net.ipv6.conf.default.disable_ipv6=1",
                                  /* strict: a packet from s<k> must come from slot k's
                                   * address (the resolver trusts its source) */
                                  "net.ipv4.conf.all.rp_filter=1",
                                  "net.ipv4.conf.default.rp_filter=1", NULL};
    if ((rc = run(sysctl, n->nsfd, NULL, out, sizeof(out))) != 0) {
        snprintf(why, whylen, "router sysctls: %s", out);
        goto fail;
    }
    n->nft = nft_ctx_in(n->nsfd);
    if (!n->nft) {
        snprintf(why, whylen, "libnftables context in %s", n->nsname);
        goto fail;
    }
    struct sbx_net_buf b = {0};
    sbx_net_render_router(&b, n->range, n->inject != NULL);
    for (int i = 0; i < n->ndeny; i++) { /* the deployment's own addresses (sbx_net_deny_add) */
        struct in_addr ia = {.s_addr = htonl(n->deny[i])};
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &ia, a, sizeof(a));
        sbx_net_buf_add(&b, "add element inet sbx hard4 { %s }\n", a);
    }
    rc = nft(n, b.p, NULL, out, sizeof(out));
    free(b.p);
    if (rc) {
        snprintf(why, whylen, "router nft table: %s", out);
        goto fail;
    }
    if ((rc = sbx_dns_start(&n->dns, n->nsfd, n->upstream, n->block, n->inject, pin_locked, n,
                            why, whylen)) != 0)
        goto fail;
    if (n->inject && (rc = sbx_proxy_start(&n->proxy, n->nsfd, n->block, n->inject, resolved_cb,
                                           n, why, whylen)) != 0)
        goto fail;
    n->up = true;
    sbx_log_info("network: router %s up, block %s/22, host veth %s, host table inet %s",
                 n->nsname, hostaddr, n->hostif, n->table);
    warn_uplink_forwarding();
    return 0;
fail:
    sbx_log_error("network: router %s: %s", n->nsname, why);
    sbx_proxy_stop(n->proxy);
    n->proxy = NULL;
    sbx_dns_stop(n->dns);
    n->dns = NULL;
    remove_stale(n);
    if (n->nft)
        nft_ctx_free(n->nft);
    n->nft = NULL;
    if (n->nsfd >= 0)
        close(n->nsfd);
    n->nsfd = -1;
    unlink(n->lockpath);
    close(n->lockfd);
    n->lockfd = -1;
    return SBX_E_CONTAINER;
}

int
sbx_net_prepare(sbx_net *n, char *why, size_t whylen)
{
    pthread_mutex_lock(&n->mu);
    int rc = n->up ? 0 : router_up(n, why, whylen);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

void
sbx_net_free(sbx_net *n)
{
    if (!n)
        return;
    if (n->up) {
        sbx_proxy_stop(n->proxy); /* first: it asks the resolver */
        sbx_dns_stop(n->dns);
        remove_stale(n); /* the netns (and with it both veths), the host table */
        nft_ctx_free(n->nft);
        close(n->nsfd);
        sbx_log_info("network: router %s removed", n->nsname);
    }
    if (n->lockfd >= 0) {
        unlink(n->lockpath);
        close(n->lockfd);
    }
    sbx_inject_free(n->inject);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->tc_mu);
    free(n);
}

int
sbx_net_attach(sbx_net *n, pid_t pid, const struct sbx_net_policy *p,
               struct sbx_net_attachment *at, char *why, size_t whylen)
{
    int64_t t0 = sbx_mono_us();
    int rc = 0, k = 0, nsfd = -1;
    memset(at, 0, sizeof(*at));
    pthread_mutex_lock(&n->mu);
    if (!n->up && (rc = router_up(n, why, whylen)) != 0) {
        pthread_mutex_unlock(&n->mu);
        return rc;
    }
    for (int i = 0; i < SLOTS - 1 && !k; i++) {
        int s = 1 + (n->next - 1 + i) % (SLOTS - 1);
        if (!n->used[s])
            k = s;
    }
    if (k) {
        n->used[k] = true;
        n->next = k % (SLOTS - 1) + 1;
    }
    int rnsfd = n->nsfd;
    pthread_mutex_unlock(&n->mu);
    if (!k) {
        snprintf(why, whylen, "no free network slot (%d egress sandboxes on this shard)",
                 SLOTS - 1);
        return SBX_E_CONTAINER;
    }
    at->slot = k;
    at->gw = n->block + 2u * (uint32_t)k;
    at->addr = at->gw + 1;
    char out[1024], a[INET_ADDRSTRLEN], path[64];
    ip4(a, sizeof(a), at->addr);
    /* The chains first: until its map element exists, the new veth's
     * traffic meets the forward chain's policy drop. */
    struct sbx_net_buf b = {0};
    sbx_net_render_slot(&b, k, at->addr, p, n->inject != NULL);
    pthread_mutex_lock(&n->mu);
    rc = nft(n, b.p, NULL, out, sizeof(out));
    pthread_mutex_unlock(&n->mu);
    free(b.p);
    if (rc) {
        snprintf(why, whylen, "nft chain of slot %d: %s", k, out);
        goto fail;
    }
    sbx_dns_set_policy(n->dns, k, p);
    /* The veth, its router end addressed and up, the sandbox end born as
     * eth0 in the sandbox's netns, addressed, up, default route. */
    char ifn[16];
    snprintf(ifn, sizeof(ifn), "s%d", k);
    snprintf(path, sizeof(path), "/proc/%d/ns/net", (int)pid);
    nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0) {
        rc = -errno;
        snprintf(why, whylen, "open %s: %s", path, strerror(errno));
        goto fail;
    }
    int rnl = sbx_nl_open_in(rnsfd), snl = sbx_nl_open_in(nsfd), ri = 0, si = 0;
    const char *step = "netlink sockets";
    rc = rnl < 0 ? rnl : snl < 0 ? snl : 0;
    if (rc == 0 && (step = "veth", rc = sbx_nl_veth(rnl, ifn, "eth0", nsfd)) == -EEXIST) {
        sbx_nl_del(rnl, ifn); /* a previous holder's, not yet gone with its netns */
        rc = sbx_nl_veth(rnl, ifn, "eth0", nsfd);
    }
    if (rc == 0 &&
        (step = "router end", ri = rc = sbx_nl_index(rnl, ifn)) > 0 &&
        (rc = sbx_nl_addr_up(rnl, ri, at->gw, 31)) == 0 &&
        (step = "eth0", si = rc = sbx_nl_index(snl, "eth0")) > 0 &&
        (rc = sbx_nl_addr_up(snl, si, at->addr, 31)) == 0)
        rc = (step = "default route", sbx_nl_default_route(snl, si, at->gw));
    if (rnl >= 0)
        close(rnl);
    if (snl >= 0)
        close(snl);
    close(nsfd);
    if (rc < 0) {
        snprintf(why, whylen, "%s of slot %d (%s): %s", step, k, a, strerror(-rc));
        goto fail;
    }
    if (p->bandwidth && set_bandwidth(n, k, p->bandwidth, why, whylen) != 0)
        goto fail;
    at->attach_us = sbx_mono_us() - t0;
    return 0;
fail:
    sbx_log_error("network: attach pid %d to slot %d: %s", (int)pid, k, why);
    sbx_net_detach(n, k);
    memset(at, 0, sizeof(*at));
    return SBX_E_CONTAINER;
}

int
sbx_net_update(sbx_net *n, int k, uint32_t addr, const struct sbx_net_policy *p, char *why,
               size_t whylen)
{
    if (k <= 0 || k >= SLOTS)
        return -EINVAL;
    struct sbx_net_buf b = {0};
    sbx_net_render_update(&b, k, addr, p, n->inject != NULL);
    /* The resolver's policy first, then the flush of the pins: a pin it
     * makes under the old policy lands before the flush (net_dns.c). */
    sbx_dns_set_policy(n->dns, k, p);
    pthread_mutex_lock(&n->mu);
    int rc = n->nft ? nft(n, b.p, NULL, why, whylen) : -ENOENT;
    pthread_mutex_unlock(&n->mu);
    free(b.p);
    if (rc == 0 && set_bandwidth(n, k, p->bandwidth, why, whylen) != 0)
        rc = -EIO;
    return rc;
}

static int stats_locked(sbx_net *n, int k, struct sbx_net_stats *st);

void
sbx_net_detach(sbx_net *n, int k)
{
    if (k <= 0 || k >= SLOTS)
        return;
    char out[512], cmd[1536];
    /* What the slot counted goes to the totals (sbx_net_totals), read under
     * the same hold of n->mu as the deletion: nothing counted in between is
     * lost. */
    struct sbx_net_stats last;
    pthread_mutex_lock(&n->mu);
    if (stats_locked(n, k, &last) == 0) {
        n->gone.bytes_out += last.bytes_out;
        n->gone.bytes_in += last.bytes_in;
        n->gone.packets_out += last.packets_out;
        n->gone.packets_in += last.packets_in;
        n->gone.connections += last.connections;
    }
    int rnsfd = n->nsfd;
    /* One batch (one nft run); a half-made slot lacks some of these, and a
     * batch with one failing command does nothing: then each on its own.
     * What refers to a counter or set goes before it (the proxy's chains
     * first), else the fallback would leave counters a reused slot shows. */
    cmd[0] = '\0';
    if (n->inject) /* net_proxy.c's */
        snprintf(cmd, sizeof(cmd),
                 "delete element inet sbx pin_sb { \"s%d\" }\n"
                 "delete element inet sbx pout_sb { \"s%d\" }\n"
                 "flush chain inet sbx pi%d\nflush chain inet sbx po%d\n"
                 "delete chain inet sbx pi%d\ndelete chain inet sbx po%d\n",
                 k, k, k, k, k, k);
    size_t l0 = strlen(cmd);
    snprintf(cmd + l0, sizeof(cmd) - l0,
             "delete element inet sbx from_sb { \"s%d\" }\n"
             "delete element inet sbx to_sb { \"s%d\" }\n"
             "flush chain inet sbx so%d\nflush chain inet sbx si%d\n"
             "delete chain inet sbx so%d\ndelete chain inet sbx si%d\n"
             "delete set inet sbx ha%d\ndelete set inet sbx hp%d\n"
             "delete counter inet sbx o%d\ndelete counter inet sbx i%d\n"
             "delete counter inet sbx n%d\ndelete set inet sbx cc%d\n",
             k, k, k, k, k, k, k, k, k, k, k, k);
    if (n->inject) { /* net_proxy.c's */
        size_t l = strlen(cmd);
        snprintf(cmd + l, sizeof(cmd) - l,
                 "delete element inet sbx pre_sb { \"s%d\" }\nflush chain inet sbx pr%d\n"
                 "delete chain inet sbx pr%d\ndelete set inet sbx ij%d\n",
                 k, k, k, k);
    }
    if (nft(n, cmd, NULL, out, sizeof(out)) != 0) {
        char *line = cmd;
        while (*line) {
            char one[128];
            size_t len = strcspn(line, "\n");
            snprintf(one, sizeof(one), "%.*s\n", (int)len, line);
            nft(n, one, NULL, out, sizeof(out));
            line += len + (line[len] == '\n');
        }
    }
    pthread_mutex_unlock(&n->mu);
    /* The veth goes with the sandbox's netns, in the kernel's asynchronous
     * cleanup_net: deleting it here took ~20 ms of RCU grace periods on
     * every destroy.  Slots are handed out round robin, and an attach that
     * still finds the old s<k> deletes it then (sbx_net_attach). */
    (void)rnsfd;
    sbx_dns_set_policy(n->dns, k, NULL);
    char why[256];
    if (set_bandwidth(n, k, 0, why, sizeof(why)) != 0) /* its class on up0 goes first */
        sbx_log_debug("network: detach: %s", why);
    pthread_mutex_lock(&n->tc_mu);
    n->bw[k] = 0;
    pthread_mutex_unlock(&n->tc_mu);
    pthread_mutex_lock(&n->mu);
    n->used[k] = false;
    pthread_mutex_unlock(&n->mu);
}

/* The counters of slot k into *st; n->mu held by the caller.  0, -ENOENT
 * (no router), -EIO (unreadable answer) or nft()'s error. */
static int
stats_locked(sbx_net *n, int k, struct sbx_net_stats *st)
{
    memset(st, 0, sizeof(*st));
    char out[1024], cmd[256];
    snprintf(cmd, sizeof(cmd),
             "list counter inet sbx o%d\nlist counter inet sbx i%d\nlist counter inet sbx n%d\n",
             k, k, k);
    const char *o = NULL;
    int rc = n->nft ? nft(n, cmd, &o, NULL, 0) : -ENOENT;
    snprintf(out, sizeof(out), "%s", o ? o : "");
    if (rc)
        return rc;
    /* "counter oK { packets P bytes B }" three times, in that order. */
    uint64_t v[3][2] = {{0}};
    const char *s = out;
    for (int i = 0; i < 3; i++) {
        s = strstr(s, "packets ");
        if (!s || sscanf(s, "packets %" SCNu64 " bytes %" SCNu64, &v[i][0], &v[i][1]) != 2)
            return -EIO;
        s++;
    }
    st->packets_out = v[0][0];
    st->bytes_out = v[0][1];
    st->packets_in = v[1][0];
    st->bytes_in = v[1][1];
    st->connections = v[2][0];
    return 0;
}

int
sbx_net_stats(sbx_net *n, int k, struct sbx_net_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (k <= 0 || k >= SLOTS)
        return -EINVAL;
    pthread_mutex_lock(&n->mu);
    int rc = stats_locked(n, k, st);
    pthread_mutex_unlock(&n->mu);
    return rc;
}

int
sbx_net_pins(sbx_net *n, int k, struct sbx_net_pin *out, int max)
{
    pthread_mutex_lock(&n->mu);
    struct sbx_dns *d = n->dns;
    pthread_mutex_unlock(&n->mu);
    return sbx_dns_pins(d, k, out, max);
}

/* One host of sbx_net_deny_add's list: "[scheme://]host[:port][/path]". */
static int
deny_one(sbx_net *n, const char *item, size_t len)
{
    char buf[256], host[256];
    if (len == 0)
        return 0;
    if (len >= sizeof(buf))
        return SBX_E_VALIDATION;
    memcpy(buf, item, len);
    buf[len] = '\0';
    const char *h = strstr(buf, "://");
    h = h ? h + 3 : buf;
    if (!strncmp(h, "unix:", 5))
        return 0; /* a preview relay's socket: nothing of the network */
    if (!strncmp(h, "tcp:", 4))
        h += 4; /* a preview relay's "tcp:host:port" */
    if (*h == '[')
        return 0; /* IPv6: sandboxes have none (docs/network.md §IPv6) */
    size_t hl = strcspn(h, ":/");
    if (hl == 0 || hl >= sizeof(host))
        return 0; /* ipc://, a bare path: nothing of the network */
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *slash = strchr(host, '/');
    if (slash)
        *slash = '\0';
    uint32_t a32 = 0;
    struct in_addr lit;
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    int rc = 0;
    if (inet_pton(AF_INET, host, &lit) == 1)
        a32 = ntohl(lit.s_addr);
    else if (!strcmp(host, "localhost"))
        return 0;
    else if (getaddrinfo(host, NULL, &hints, &res) != 0 || !res)
        return SBX_E_VALIDATION;
    pthread_mutex_lock(&n->mu);
    for (struct addrinfo *ai = res;; ai = ai->ai_next) {
        if (res) {
            if (!ai)
                break;
            a32 = ntohl(((struct sockaddr_in *)ai->ai_addr)->sin_addr.s_addr);
        }
        bool have = (a32 >> 24) == 127 || (a32 >> 24) == 0; /* loopback, 0/8: denied already */
        for (int i = 0; i < n->ndeny && !have; i++)
            have = n->deny[i] == a32;
        if (!have && n->ndeny >= SBX_NET_DENY_MAX)
            rc = SBX_E_VALIDATION;
        else if (!have) {
            n->deny[n->ndeny++] = a32;
            if (n->up) {
                char cmd[96], a[INET_ADDRSTRLEN], err[256];
                struct in_addr ia = {.s_addr = htonl(a32)};
                inet_ntop(AF_INET, &ia, a, sizeof(a));
                snprintf(cmd, sizeof(cmd), "add element inet sbx hard4 { %s }\n", a);
                if (nft(n, cmd, NULL, err, sizeof(err)) != 0)
                    rc = SBX_E_CONTAINER;
            }
        }
        if (!res)
            break;
    }
    pthread_mutex_unlock(&n->mu);
    if (res)
        freeaddrinfo(res);
    return rc;
}

int
sbx_net_deny_add(sbx_net *n, const char *list)
{
    int rc = 0;
    if (!n || !list)
        return 0;
    for (const char *p = list; *p;) {
        size_t len = strcspn(p, ", ");
        int r = deny_one(n, p, len);
        if (r && !rc)
            rc = r;
        p += len;
        p += strspn(p, ", ");
    }
    return rc;
}

int
sbx_net_totals(sbx_net *n, struct sbx_net_stats *st)
{
    memset(st, 0, sizeof(*st));
    if (!n)
        return 0;
    pthread_mutex_lock(&n->mu);
    *st = n->gone;
    const char *o = NULL;
    int rc = n->nft ? nft(n, "list counters table inet sbx\n", &o, NULL, 0) : 0;
    /* "counter oK {\n packets P bytes B\n}" per counter: o, i, n of each slot */
    for (const char *s = rc == 0 && o ? strstr(o, "counter ") : NULL; s;
         s = strstr(s + 1, "counter ")) {
        char kind = s[8];
        const char *pk = strstr(s, "packets ");
        uint64_t pkts, bytes;
        if (!pk || (kind != 'o' && kind != 'i' && kind != 'n') ||
            sscanf(pk, "packets %" SCNu64 " bytes %" SCNu64, &pkts, &bytes) != 2)
            continue;
        if (kind == 'o') {
            st->bytes_out += bytes;
            st->packets_out += pkts;
        } else if (kind == 'i') {
            st->bytes_in += bytes;
            st->packets_in += pkts;
        } else {
            st->connections += pkts;
        }
    }
    pthread_mutex_unlock(&n->mu);
    return rc;
}
