/* cluster_sup.c — the cluster harness's supervisor process: network namespaces,
 * the bridge, etcd, the shard and gateway processes, cgroup sweeps, the control
 * socket and the teardown (see cluster.h, "Processes"). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/etcd.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "../support/hostlocks.h"
#include "cluster_int.h"

/* ================================================================================ */
/* The supervisor.                                                                  */
/* ================================================================================ */

struct proc {
    pid_t pid;      /* 0: not running */
    int status;     /* last wait status */
    bool exited;
};

static struct sup {
    struct cl_opts o;
    char bindir[512];
    char tag[8];             /* 4 hex digits: every name derives from it */
    char dir[256];
    char net[16];
    char bridge[16];
    char ns[CL_MAX_NODES][32];
    char veth_host[CL_MAX_NODES][16];
    char veth_node[CL_MAX_NODES][16];
    bool made_bridge;
    bool made_ns[CL_MAX_NODES];
    char prefix[32], cluster[32], secret[64];
    unsigned uid_slot;       /* uid bases: UID_BASE + (uid_slot*4 + i) * 65536 */
    int etcd_cport, etcd_pport;
    char etcd_url[128];
    struct proc etcd;
    struct proc shard[CL_MAX_NODES];
    char etcd_via[CL_MAX_NODES][128]; /* an etcd endpoint node i tries first ("" none) */
    struct proc gw[CL_MAX_GWS];
    int gw_port[CL_MAX_GWS], gw_http[CL_MAX_GWS];
    int ctl_fd;              /* listening unix socket */
    char ctl_path[300];
    int from_main;           /* EOF: main is done or gone */
    bool keep_logs;
} S;

static volatile sig_atomic_t sup_stop;

static void
sup_on_signal(int sig)
{
    (void)sig;
    sup_stop = 1;
}

static void
slog(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cluster[%s]: ", S.tag);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* $SBX_TEST_PREFIX if it is 1-8 lower-case letters and digits, else "" (the
 * environment owns it).  tools/run-tests.sh sets it per run: it goes into
 * the names of what the cluster creates on the host (shard names, so their
 * cgroups and locks; the network namespaces; the directory) so that
 * tools/leftovers.sh can tell this run's leftovers from other runs'. */
static const char *
run_prefix(void)
{
    const char *p = getenv("SBX_TEST_PREFIX");
    if (!p || strlen(p) > 8)
        return "";
    for (const char *c = p; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
            return "";
    return p;
}

/* Run a command to completion, its output to the setup log; exit status or -1. */
static int
run(const char *const *argv)
{
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        char log[320];
        snprintf(log, sizeof(log), "%s/setup.log", S.dir);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        execvp(argv[0], (char *const *)argv);
        _exit(127);
    }
    int st;
    while (waitpid(pid, &st, 0) < 0) {
        if (errno != EINTR)
            return -1;
    }
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

#define RUN(...)                                                                              \
    ({                                                                                        \
        const char *const _a[] = {__VA_ARGS__, NULL};                                         \
        run(_a);                                                                              \
    })

/* make_pki — the deployment's TLS identities in <dir>/pki (tools/sbx-cert,
 * openssl): ca.pem, s<i>.pem/.key per shard node (every one that may
 * join, not only those started at setup), g<j> per gateway and
 * "client" for the tests' direct dials (cl_dial).  Shards listen on
 * tls+tcp:// (docs/security.md, Transports), so gateway → shard and
 * shard ↔ shard traffic of every cluster test is mutual TLS.  0 or -1. */
static int
make_pki(void)
{
    /* $SBX_CERT_TOOL, else the tree's: from the working directory, or
     * from the binaries' (build/<flavor>/bin or bin). */
    char cands[4][600], pki[300];
    const char *env = getenv("SBX_CERT_TOOL");
    snprintf(cands[0], sizeof(cands[0]), "%s", env && *env ? env : "");
    snprintf(cands[1], sizeof(cands[1]), "tools/sbx-cert");
    snprintf(cands[2], sizeof(cands[2]), "%s/../../../tools/sbx-cert", S.bindir);
    snprintf(cands[3], sizeof(cands[3]), "%s/../tools/sbx-cert", S.bindir);
    const char *tool = NULL;
    for (int k = 0; k < 4 && !tool; k++)
        if (cands[k][0] && access(cands[k], X_OK) == 0)
            tool = cands[k];
    if (!tool) {
        slog("tools/sbx-cert not found (set SBX_CERT_TOOL)");
        return -1;
    }
    snprintf(pki, sizeof(pki), "%s/pki", S.dir);
    if (RUN(tool, "ca", pki) != 0)
        return -1;
    for (int i = 0; i < CL_MAX_NODES + CL_MAX_GWS + 1; i++) {
        char name[16];
        if (i < CL_MAX_NODES)
            snprintf(name, sizeof(name), "s%d", i);
        else if (i < CL_MAX_NODES + CL_MAX_GWS)
            snprintf(name, sizeof(name), "g%d", i - CL_MAX_NODES);
        else
            snprintf(name, sizeof(name), "client");
        if (RUN(tool, "node", pki, name) != 0)
            return -1;
    }
    return 0;
}

/* tls_args — the --tls-* arguments of node `name` into argv at *n. */
static void
tls_args(const char **argv, int *n, const char *name, char bufs[3][320])
{
    snprintf(bufs[0], 320, "%s/pki/ca.pem", S.dir);
    snprintf(bufs[1], 320, "%s/pki/%s.pem", S.dir, name);
    snprintf(bufs[2], 320, "%s/pki/%s.key", S.dir, name);
    argv[(*n)++] = "--tls-ca";
    argv[(*n)++] = bufs[0];
    argv[(*n)++] = "--tls-cert";
    argv[(*n)++] = bufs[1];
    argv[(*n)++] = "--tls-key";
    argv[(*n)++] = bufs[2];
}

/* A random /24 in 10.[100-250].x.0 that no route of this host overlaps. */
static int
pick_subnet(void)
{
    for (int attempt = 0; attempt < 200; attempt++) {
        unsigned b = 100 + (unsigned)(random() % 151), c = (unsigned)(random() % 256);
        uint32_t cand = (10u << 24) | (b << 16) | (c << 8), cmask = 0xffffff00u;
        bool clash = false;
        FILE *f = fopen("/proc/net/route", "r");
        char line[512];
        if (f && fgets(line, sizeof(line), f)) {
            while (fgets(line, sizeof(line), f)) {
                char ifn[64];
                unsigned dst, gw, flags, refc, use, metric, mask;
                if (sscanf(line, "%63s %x %x %x %u %u %u %x", ifn, &dst, &gw, &flags, &refc,
                           &use, &metric, &mask) != 8)
                    continue;
                uint32_t d = ntohl(dst), m = ntohl(mask);
                if (m == 0)
                    continue; /* the default route */
                uint32_t common = m & cmask;
                if ((d & common) == (cand & common))
                    clash = true;
            }
        }
        if (f)
            fclose(f);
        if (!clash) {
            snprintf(S.net, sizeof(S.net), "10.%u.%u", b, c);
            return 0;
        }
    }
    return -1;
}

/* A port that is free now on addr (TCP). */
static int
free_port(const char *addr, int avoid)
{
    for (int attempt = 0; attempt < 500; attempt++) {
        int port = 20000 + (int)(random() % 40000);
        if (port == avoid || port == avoid + 1 || port + 1 == avoid)
            continue;
        bool ok = true;
        for (int k = 0; k < 2 && ok; k++) { /* the port and the next one */
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)(port + k))};
            inet_pton(AF_INET, addr, &sa.sin_addr);
            if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
                ok = false;
            if (fd >= 0)
                close(fd);
        }
        if (ok)
            return port;
    }
    return -1;
}

/* Fork and exec argv with output appended to log; in netns ns (NULL: here). */
static pid_t
spawn(const char *ns, const char *log, char *const *argv)
{
    int nsfd = -1;
    if (ns) {
        char path[128];
        snprintf(path, sizeof(path), "/run/netns/%s", ns);
        nsfd = open(path, O_RDONLY | O_CLOEXEC);
        if (nsfd < 0) {
            slog("cannot open %s: %s", path, strerror(errno));
            return -1;
        }
    }
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
        signal(SIGHUP, SIG_DFL);
        signal(SIGPIPE, SIG_DFL);
        /* If the supervisor dies, so does what it started (sbxd stops cleanly). */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (nsfd >= 0 && setns(nsfd, CLONE_NEWNET) != 0)
            _exit(126);
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int nul = open("/dev/null", O_RDONLY);
        if (nul >= 0)
            dup2(nul, 0);
        execv(argv[0], argv);
        _exit(127);
    }
    if (nsfd >= 0)
        close(nsfd);
    return pid;
}

static void
reap(struct proc *p)
{
    if (p->pid <= 0)
        return;
    int st;
    pid_t r = waitpid(p->pid, &st, WNOHANG);
    if (r == p->pid) {
        p->status = st;
        p->exited = true;
        p->pid = 0;
    } else if (r < 0 && errno == ECHILD) {
        p->exited = true;
        p->pid = 0;
    }
}

static void
reap_all(void)
{
    reap(&S.etcd);
    for (int i = 0; i < CL_MAX_NODES; i++)
        reap(&S.shard[i]);
    for (int i = 0; i < CL_MAX_GWS; i++)
        reap(&S.gw[i]);
}

/* Wait until p exits, up to ms; SIGKILL then if kill_after. 0 if it exited. */
static int
wait_proc(struct proc *p, int ms, bool kill_after)
{
    double until = cl_now_ms() + ms;
    while (p->pid > 0) {
        reap(p);
        if (p->pid <= 0)
            break;
        if (cl_now_ms() > until) {
            if (!kill_after)
                return -1;
            kill(p->pid, SIGCONT);
            kill(p->pid, SIGKILL);
            int st;
            waitpid(p->pid, &st, 0);
            p->status = st;
            p->exited = true;
            p->pid = 0;
            return -1;
        }
        cl_sleep_ms(10);
    }
    return 0;
}

static int
start_shard(int i)
{
    if (S.shard[i].pid > 0)
        return 0;
    char name[64], listen[64], data[320], uid[32], relay[64], log[320], pool[16], etcd[300];
    char node[16], tls[3][320];
    snprintf(name, sizeof(name), "%s-s%d", S.prefix, i);
    if (S.etcd_via[i][0])
        snprintf(etcd, sizeof(etcd), "%s,%s", S.etcd_via[i], S.etcd_url);
    else
        snprintf(etcd, sizeof(etcd), "%s", S.etcd_url);
    snprintf(listen, sizeof(listen), "tls+tcp://%s.%d:%d", S.net, 11 + i, NODE_PORT);
    snprintf(relay, sizeof(relay), "tcp:%s.%d:%d", S.net, 11 + i, RELAY_PORT);
    snprintf(data, sizeof(data), "%s/s%d", S.dir, i);
    mkdir(data, 0700);
    snprintf(uid, sizeof(uid), "%u", UID_BASE + (S.uid_slot * 4u + (unsigned)i) * 65536u);
    snprintf(log, sizeof(log), "%s/s%d.log", S.dir, i);
    snprintf(pool, sizeof(pool), "%d", S.o.pool);
    char sbxd[600];
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", S.bindir);
    const char *argv[64] = {sbxd, "shard", "--name", name, "--listen", listen, "--data", data,
                            "--uid-base", uid, "--etcd", etcd, "--cluster", S.cluster,
                            "--lease-ttl", "2s", "--relay", relay, "--relay-secret", S.secret,
                            "--pool", pool, "--memory", "256M", "--pids", "128", "--disk",
                            "256M"};
    int n = 0;
    while (argv[n])
        n++;
    snprintf(node, sizeof(node), "s%d", i);
    tls_args(argv, &n, node, tls);
    for (int k = 0; S.o.shard_extra && S.o.shard_extra[k] && n < 62; k++)
        argv[n++] = S.o.shard_extra[k];
    argv[n] = NULL;
    pid_t pid = spawn(S.ns[i], log, (char *const *)argv);
    if (pid < 0)
        return -1;
    S.shard[i] = (struct proc){.pid = pid};
    return 0;
}

static int
start_gw(int j)
{
    if (S.gw[j].pid > 0)
        return 0;
    char name[64], listen[64], http[64], log[320], sbxd[600], node[16], tls[3][320];
    snprintf(name, sizeof(name), "%s-g%d", S.prefix, j);
    snprintf(listen, sizeof(listen), "tcp://127.0.0.1:%d", S.gw_port[j]);
    snprintf(http, sizeof(http), "127.0.0.1:%d", S.gw_http[j]);
    snprintf(log, sizeof(log), "%s/g%d.log", S.dir, j);
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", S.bindir);
    const char *argv[32] = {sbxd, "gateway", "--name", name, "--listen", listen, "--etcd",
                            S.etcd_url, "--cluster", S.cluster, "--http", http, "--relay-secret",
                            S.secret};
    int n = 0;
    while (argv[n])
        n++;
    snprintf(node, sizeof(node), "g%d", j);
    tls_args(argv, &n, node, tls);
    argv[n] = NULL;
    pid_t pid = spawn(NULL, log, (char *const *)argv);
    if (pid < 0)
        return -1;
    S.gw[j] = (struct proc){.pid = pid};
    return 0;
}

static int
start_etcd(void)
{
    char ip[32], name[32], ddir[320], curl[96], purl[96], init[160], log[320];
    snprintf(ip, sizeof(ip), "%s.1", S.net);
    for (int attempt = 0; attempt < 5; attempt++) {
        S.etcd_cport = free_port(ip, 0);
        S.etcd_pport = S.etcd_cport + 1;
        if (S.etcd_cport < 0)
            return -1;
        snprintf(name, sizeof(name), "e%s", S.tag);
        snprintf(ddir, sizeof(ddir), "%s/etcd", S.dir);
        snprintf(curl, sizeof(curl), "http://%s:%d", ip, S.etcd_cport);
        snprintf(purl, sizeof(purl), "http://%s:%d", ip, S.etcd_pport);
        snprintf(init, sizeof(init), "%s=%s", name, purl);
        snprintf(log, sizeof(log), "%s/etcd.log", S.dir);
        snprintf(S.etcd_url, sizeof(S.etcd_url), "%s", curl);
        const char *argv[] = {"/usr/bin/etcd", "--name", name, "--data-dir", ddir,
                              "--listen-client-urls", curl, "--advertise-client-urls", curl,
                              "--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
                              "--initial-cluster", init, "--initial-cluster-state", "new",
                              "--initial-cluster-token", name, NULL};
        pid_t pid = spawn(NULL, log, (char *const *)argv);
        if (pid < 0)
            return -1;
        S.etcd = (struct proc){.pid = pid};
        sbx_etcd *e = NULL;
        sbx_etcd_open(&e, S.etcd_url, 1000);
        double until = cl_now_ms() + 15000;
        while (cl_now_ms() < until && S.etcd.pid > 0) {
            struct sbx_etcd_kv *kvs;
            size_t n;
            if (sbx_etcd_range(e, "/health", NULL, &kvs, &n, NULL) == 0) {
                sbx_etcd_kvs_free(kvs, n);
                sbx_etcd_close(e);
                return 0;
            }
            cl_sleep_ms(100);
            reap(&S.etcd);
        }
        sbx_etcd_close(e);
        /* a port taken in between, or etcd too slow: try other ports */
        if (S.etcd.pid > 0) {
            kill(S.etcd.pid, SIGKILL);
            wait_proc(&S.etcd, 5000, true);
        }
        char rmd[330];
        snprintf(rmd, sizeof(rmd), "%s/etcd", S.dir);
        sbx_rm_rf(rmd);
        slog("etcd did not come up on %s; retrying", S.etcd_url);
    }
    return -1;
}

static int
make_network(void)
{
    char addr[32];
    snprintf(S.bridge, sizeof(S.bridge), "sbxb%s", S.tag);
    if (RUN("ip", "link", "add", S.bridge, "type", "bridge") != 0)
        return -1;
    S.made_bridge = true;
    snprintf(addr, sizeof(addr), "%s.1/24", S.net);
    if (RUN("ip", "addr", "add", addr, "dev", S.bridge) != 0 ||
        RUN("ip", "link", "set", S.bridge, "up") != 0)
        return -1;
    for (int i = 0; i < CL_MAX_NODES; i++) {
        snprintf(S.ns[i], sizeof(S.ns[i]), "sbx%s%sn%d", run_prefix(), S.tag, i);
        snprintf(S.veth_host[i], sizeof(S.veth_host[i]), "sx%sh%d", S.tag, i);
        snprintf(S.veth_node[i], sizeof(S.veth_node[i]), "sx%sc%d", S.tag, i);
        if (RUN("ip", "netns", "add", S.ns[i]) != 0)
            return -1;
        S.made_ns[i] = true;
        snprintf(addr, sizeof(addr), "%s.%d/24", S.net, 11 + i);
        if (RUN("ip", "link", "add", S.veth_host[i], "type", "veth", "peer", "name",
                S.veth_node[i]) != 0 ||
            RUN("ip", "link", "set", S.veth_node[i], "netns", S.ns[i]) != 0 ||
            RUN("ip", "link", "set", S.veth_host[i], "master", S.bridge, "up") != 0 ||
            RUN("ip", "-n", S.ns[i], "addr", "add", addr, "dev", S.veth_node[i]) != 0 ||
            RUN("ip", "-n", S.ns[i], "link", "set", S.veth_node[i], "up") != 0 ||
            RUN("ip", "-n", S.ns[i], "link", "set", "lo", "up") != 0)
            return -1;
        /* The node's uplink forwards, as a host of egress sandboxes must
         * (docs/network.md, "What the host must provide"): else the replies
         * to its sandboxes' connections across the bridge are dropped. */
        char fwd[96];
        snprintf(fwd, sizeof(fwd), "net.ipv4.conf.%s.forwarding=1", S.veth_node[i]);
        if (RUN("ip", "netns", "exec", S.ns[i], "sysctl", "-q", "-w", fwd) != 0)
            return -1;
    }
    return 0;
}

/* Remove a shard's cgroups (every controller), killing what is left in them. */
static void
sweep_cgroup_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || de->d_type != DT_DIR)
            continue;
        char sub[800];
        snprintf(sub, sizeof(sub), "%s/%s", dir, de->d_name);
        sweep_cgroup_dir(sub);
    }
    closedir(d);
    for (int attempt = 0; attempt < 100; attempt++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return;
        char procs[820];
        snprintf(procs, sizeof(procs), "%s/cgroup.procs", dir);
        FILE *f = fopen(procs, "r");
        if (f) {
            long pid;
            while (fscanf(f, "%ld", &pid) == 1)
                if (pid > 0)
                    kill((pid_t)pid, SIGKILL);
            fclose(f);
        }
        cl_sleep_ms(20);
    }
}

static void
sweep_cgroups(void)
{
    const char *roots[] = {"/sys/fs/cgroup", "/sys/fs/cgroup/unified"};
    for (size_t r = 0; r < 2; r++) {
        DIR *d = opendir(roots[r]);
        if (!d)
            continue;
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (de->d_name[0] == '.')
                continue;
            for (int i = 0; i < CL_MAX_NODES; i++) {
                char dir[600];
                /* v1: <root>/<controller>/sbx/<name>; v2: <root>/sbx/<name> */
                snprintf(dir, sizeof(dir), "%s/%s/sbx/%s-s%d", roots[r], de->d_name, S.prefix, i);
                sweep_cgroup_dir(dir);
            }
        }
        closedir(d);
        for (int i = 0; i < CL_MAX_NODES; i++) {
            char dir[600];
            snprintf(dir, sizeof(dir), "%s/sbx/%s-s%d", roots[r], S.prefix, i);
            sweep_cgroup_dir(dir);
        }
    }
}

/* Everything this run created goes, whatever state it is in. */
static int
sup_teardown(void)
{
    double t0 = cl_now_ms();
    for (int i = 0; i < CL_MAX_NODES; i++)
        if (S.shard[i].pid > 0) {
            kill(S.shard[i].pid, SIGCONT);
            kill(S.shard[i].pid, SIGTERM);
        }
    for (int j = 0; j < CL_MAX_GWS; j++)
        if (S.gw[j].pid > 0)
            kill(S.gw[j].pid, SIGTERM);
    for (int i = 0; i < CL_MAX_NODES; i++)
        if (wait_proc(&S.shard[i], 30000, true) != 0)
            slog("shard %d did not stop in 30 s: killed", i);
    for (int j = 0; j < CL_MAX_GWS; j++)
        if (wait_proc(&S.gw[j], 15000, true) != 0)
            slog("gateway %d did not stop in 15 s: killed", j);
    if (S.etcd.pid > 0) {
        kill(S.etcd.pid, SIGTERM);
        wait_proc(&S.etcd, 10000, true);
    }
    if (S.prefix[0]) {
        sweep_cgroups();
        /* the host-lock files of shards killed and not restarted */
        test_hostlocks_sweep(S.prefix);
    }
    for (int i = 0; i < CL_MAX_NODES; i++) {
        if (S.made_ns[i])
            RUN("ip", "netns", "del", S.ns[i]);
        if (S.veth_host[i][0])
            RUN("ip", "link", "del", S.veth_host[i]); /* usually gone with its peer */
    }
    if (S.made_bridge)
        RUN("ip", "link", "del", S.bridge);
    int reports = 0;
    char first[2048] = "";
    if (S.dir[0]) {
        reports = scan_dir_reports(S.dir, first, sizeof(first));
        if (reports) {
            fprintf(stderr, "cluster[%s]: %d sanitizer report(s) in the daemons' logs; first:\n%s\n",
                    S.tag, reports, first);
        }
        if (getenv("SBX_KEEP_TEST_DATA") || reports || S.keep_logs) {
            /* keep the logs, drop the bulk */
            char p[400];
            snprintf(p, sizeof(p), "%s/etcd", S.dir);
            sbx_rm_rf(p);
            for (int i = 0; i < CL_MAX_NODES; i++) {
                snprintf(p, sizeof(p), "%s/s%d", S.dir, i);
                sbx_rm_rf(p);
            }
            unlink(S.ctl_path);
            slog("logs kept in %s", S.dir);
        } else {
            sbx_rm_rf(S.dir);
        }
    }
    slog("torn down in %.1f s", (cl_now_ms() - t0) / 1000);
    return reports;
}

static struct proc *
proc_of(const char *kind, int i)
{
    if (!strcmp(kind, "shard") && i >= 0 && i < CL_MAX_NODES)
        return &S.shard[i];
    if (!strcmp(kind, "gw") && i >= 0 && i < CL_MAX_GWS)
        return &S.gw[i];
    if (!strcmp(kind, "etcd"))
        return &S.etcd;
    return NULL;
}

static void
handle_cmd(int fd)
{
    char buf[256];
    size_t n = 0;
    struct pollfd p = {fd, POLLIN, 0};
    while (n < sizeof(buf) - 1 && poll(&p, 1, 5000) == 1) {
        ssize_t r = read(fd, buf + n, sizeof(buf) - 1 - n);
        if (r <= 0)
            break;
        n += (size_t)r;
        if (memchr(buf, '\n', n))
            break;
    }
    buf[n] = '\0';
    char verb[16] = "", kind[16] = "", reply[320];
    int i = -1, arg = 0;
    int k = sscanf(buf, "%15s %15s %d %d", verb, kind, &i, &arg);
    struct proc *pr = k >= 2 ? proc_of(kind, i) : NULL;
    reap_all();
    if (!pr) {
        snprintf(reply, 256, "err bad command: %.200s", buf);
    } else if (!strcmp(verb, "start")) {
        if (!strcmp(kind, "shard") && pr->pid <= 0) {
            /* "start shard I [via URL]": the endpoint it tries first, until it stops */
            char via[128] = "";
            sscanf(buf, "%*s %*s %*d via %127s", via);
            snprintf(S.etcd_via[i], sizeof(S.etcd_via[i]), "%s", via);
        }
        int rc = !strcmp(kind, "shard") ? start_shard(i) : !strcmp(kind, "gw") ? start_gw(i) : -1;
        if (rc == 0)
            snprintf(reply, sizeof(reply), "ok %d", (int)pr->pid);
        else
            snprintf(reply, sizeof(reply), "err cannot start");
    } else if (!strcmp(verb, "signal") && k == 4) {
        if (pr->pid <= 0)
            snprintf(reply, sizeof(reply), "err not running");
        else if (kill(pr->pid, arg) != 0)
            snprintf(reply, sizeof(reply), "err kill: %s", strerror(errno));
        else
            snprintf(reply, sizeof(reply), "ok %d", (int)pr->pid);
    } else if (!strcmp(verb, "wait") && k == 4) {
        if (wait_proc(pr, arg, false) == 0)
            snprintf(reply, sizeof(reply), "ok %d", pr->status);
        else
            snprintf(reply, sizeof(reply), "err still running");
    } else if (!strcmp(verb, "pid")) {
        snprintf(reply, sizeof(reply), "ok %d", (int)pr->pid);
    } else {
        snprintf(reply, 256, "err bad command: %.200s", buf);
    }
    strcat(reply, "\n");
    sbx_write_full(fd, reply, strlen(reply));
}

static void
sup_serve(void)
{
    while (!sup_stop) {
        struct pollfd p[2] = {{S.ctl_fd, POLLIN, 0}, {S.from_main, POLLIN, 0}};
        int r = poll(p, 2, 200);
        reap_all();
        if (r < 0 && errno != EINTR)
            break;
        if (r <= 0)
            continue;
        if (p[1].revents) {
            char c;
            if (read(S.from_main, &c, 1) <= 0)
                break; /* main is done (or gone) */
            if (c == 'k')
                S.keep_logs = true; /* a test failed: keep the logs */
        }
        if (p[0].revents & POLLIN) {
            int fd = accept4(S.ctl_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) {
                handle_cmd(fd);
                close(fd);
            }
        }
    }
}

/* The supervisor's life: build, report, serve, tear down. */
void __attribute__((noreturn))
sup_main(const struct cl_opts *o, int to_main, int from_main)
{
    struct sigaction sa = {.sa_handler = sup_on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    S.o = *o;
    S.from_main = from_main;
    srandom((unsigned)(getpid() ^ (int)(cl_now_ms() * 1000)));
    const char *b = o->bindir ? o->bindir : getenv("SBX_BIN");
    if (!b || !*b)
        b = "build/asan/bin";
    if (!realpath(b, S.bindir))
        snprintf(S.bindir, sizeof(S.bindir), "%s", b);
    snprintf(S.dir, sizeof(S.dir), "/tmp/sbx-cluster-%sXXXXXX", run_prefix());
    char msg[2048];
    double t0 = cl_now_ms();
    const char *fail = NULL;
    if (!mkdtemp(S.dir)) {
        S.dir[0] = '\0';
        fail = "mkdtemp";
        goto out;
    }
    chmod(S.dir, 0755);
    /* The tag: 4 hex digits, unique among the runs on this host (the bridge
     * name is the lock: `ip link add` fails if another run holds it). */
    for (int attempt = 0;; attempt++) {
        snprintf(S.tag, sizeof(S.tag), "%04lx", random() & 0xffff);
        char br[32];
        snprintf(br, sizeof(br), "/sys/class/net/sbxb%s", S.tag);
        if (access(br, F_OK) != 0)
            break;
        if (attempt > 50) {
            fail = "no free bridge name";
            goto out;
        }
    }
    snprintf(S.prefix, sizeof(S.prefix), "k%s%s", run_prefix(), S.tag);
    snprintf(S.cluster, sizeof(S.cluster), "c%s", S.tag);
    snprintf(S.secret, sizeof(S.secret), "relay-%s-%08lx", S.tag, random());
    S.uid_slot = (unsigned)(strtoul(S.tag, NULL, 16) % 256);
    if (pick_subnet() != 0) {
        fail = "no free subnet";
        goto out;
    }
    if (make_network() != 0) {
        fail = "cannot build the network (ip link/netns; see setup.log)";
        goto out;
    }
    if (start_etcd() != 0) {
        fail = "cannot start etcd";
        goto out;
    }
    if (make_pki() != 0) {
        fail = "cannot make the TLS identities (tools/sbx-cert, openssl; see setup.log)";
        goto out;
    }
    for (int j = 0; j < CL_MAX_GWS; j++) {
        S.gw_port[j] = free_port("127.0.0.1", 0);
        S.gw_http[j] = free_port("127.0.0.1", S.gw_port[j]);
    }
    for (int i = 0; i < o->nodes; i++)
        if (start_shard(i) != 0) {
            fail = "cannot start a shard";
            goto out;
        }
    for (int j = 0; j < o->gateways; j++)
        if (start_gw(j) != 0) {
            fail = "cannot start a gateway";
            goto out;
        }
    /* The command socket. */
    snprintf(S.ctl_path, sizeof(S.ctl_path), "%s/ctl.sock", S.dir);
    S.ctl_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof(un.sun_path), "%s", S.ctl_path);
    if (S.ctl_fd < 0 || bind(S.ctl_fd, (struct sockaddr *)&un, sizeof(un)) != 0 ||
        listen(S.ctl_fd, 16) != 0) {
        fail = "cannot listen on the command socket";
        goto out;
    }
    /* Export for this process's own convergence check (same as the tests). */
    char v[64];
    setenv("SBXC_CTL", S.ctl_path, 1);
    setenv("SBXC_DIR", S.dir, 1);
    setenv("SBXC_ETCD", S.etcd_url, 1);
    setenv("SBXC_CLUSTER", S.cluster, 1);
    setenv("SBXC_PREFIX", S.prefix, 1);
    setenv("SBXC_NET", S.net, 1);
    setenv("SBXC_SECRET", S.secret, 1);
    for (int j = 0; j < CL_MAX_GWS; j++) {
        char k1[16], v1[64];
        snprintf(k1, sizeof(k1), "SBXC_GW%d", j);
        snprintf(v1, sizeof(v1), "tcp://127.0.0.1:%d", S.gw_port[j]);
        setenv(k1, v1, 1);
        snprintf(k1, sizeof(k1), "SBXC_HTTP%d", j);
        snprintf(v1, sizeof(v1), "%d", S.gw_http[j]);
        setenv(k1, v1, 1);
    }
    snprintf(v, sizeof(v), "%d", o->nodes);
    setenv("SBXC_NODES", v, 1);
    {
        int set[CL_MAX_NODES];
        for (int i = 0; i < o->nodes; i++)
            set[i] = i;
        char why[512] = "";
        char gw0[64];
        snprintf(gw0, sizeof(gw0), "tcp://127.0.0.1:%d", S.gw_port[0]);
        double until = cl_now_ms() + 90000;
        while (!cl_converged(set, o->nodes, gw0, why, sizeof(why))) {
            reap_all();
            for (int i = 0; i < o->nodes && !fail; i++)
                if (S.shard[i].exited)
                    fail = "a shard exited during setup";
            for (int j = 0; j < o->gateways && !fail; j++)
                if (S.gw[j].exited)
                    fail = "a gateway exited during setup";
            if (!fail && cl_now_ms() > until)
                fail = "no convergence";
            if (fail) {
                slog("the cluster did not converge: %s", why);
                goto out;
            }
            cl_sleep_ms(150);
        }
    }
    snprintf(msg, sizeof(msg),
             "ok SBXC_CTL=%s SBXC_DIR=%s SBXC_ETCD=%s SBXC_CLUSTER=%s SBXC_PREFIX=%s SBXC_NET=%s "
             "SBXC_SECRET=%s SBXC_GW0=tcp://127.0.0.1:%d SBXC_GW1=tcp://127.0.0.1:%d "
             "SBXC_HTTP0=%d SBXC_HTTP1=%d SBXC_NODES=%d\n",
             S.ctl_path, S.dir, S.etcd_url, S.cluster, S.prefix, S.net, S.secret, S.gw_port[0],
             S.gw_port[1], S.gw_http[0], S.gw_http[1], o->nodes);
    slog("%d shard nodes in netns sbx%s%sn* on %s.0/24, etcd %s, gateways :%d :%d, up in %.1f s "
         "(binaries %s, data %s)",
         o->nodes, run_prefix(), S.tag, S.net, S.etcd_url, S.gw_port[0], S.gw_port[1],
         (cl_now_ms() - t0) / 1000, S.bindir, S.dir);
    sbx_write_full(to_main, msg, strlen(msg));
    sup_serve();
    close(S.ctl_fd);
    int reports = sup_teardown();
    char r[32];
    snprintf(r, sizeof(r), "done %d\n", reports);
    sbx_write_full(to_main, r, strlen(r));
    _exit(0);
out:
    slog("setup failed: %s", fail);
    if (S.dir[0])
        tails_of_dir(S.dir, 30);
    snprintf(msg, sizeof(msg), "fail %s\n", fail);
    sup_teardown();
    sbx_write_full(to_main, msg, strlen(msg));
    _exit(1);
}
