/*
 * sbxd — the sbx daemon.
 *
 *   sbxd dev      [options]   the embedded single-node default: a gateway on
 *                             tcp://127.0.0.1:7700 plus N shard processes
 *                             (default 2) with their data under --data
 *   sbxd shard    [options]   one shard node (actors + containers + LMDB)
 *   sbxd gateway  [options]   one gateway node (stateless front door)
 *
 * `sbxd <command> --help` lists each command's options.  Every option can
 * also come from the environment (SBX_<NAME>) or a `--config FILE`.
 * sbxd must run as root: it creates namespaces, cgroups and mounts.
 * SIGTERM or SIGINT stops it cleanly (containers are stopped, metadata is
 * committed); exit status 0, or 1 when start-up failed, 2 on usage errors
 * and when another live process on the host holds the deployment's name or
 * the shard's cgroup subtree (host locks, below).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "../actors/shard.h"
#include "../container/backup.h"
#include "../container/cgroup.h"
#include "../container/ws_pool.h"
#include "../gateway/gateway.h"
#include "../runtime/config.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/util.h"
#include "hostlock.h"

#define DEFAULT_LISTEN "tcp://127.0.0.1:7700"
#define DEFAULT_HTTP "127.0.0.1:7780"

static char *
interp_dir_default(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return NULL;
    self[n] = '\0';
    char buf[PATH_MAX + 32], real[PATH_MAX];
    snprintf(buf, sizeof(buf), "%s/../share/sbx/interp", dirname(self));
    if (!realpath(buf, real))
        return NULL;
    return sbx_xstrdup(real);
}

/* The agent: next to sbxd (the build tree), else ../libexec/sbx/ from it
 * (an install); the first path when neither exists (the error names it). */
static char *
agent_next_to_self(void)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0)
        return sbx_xstrdup("sbx-agent");
    self[n] = '\0';
    char buf[PATH_MAX + 32];
    const char *dir = dirname(self);
    snprintf(buf, sizeof(buf), "%s/sbx-agent", dir);
    if (access(buf, X_OK) == 0)
        return sbx_xstrdup(buf);
    /* An install (make install): PREFIX/bin/sbxd, PREFIX/libexec/sbx/sbx-agent. */
    char alt[PATH_MAX + 32];
    snprintf(alt, sizeof(alt), "%s/../libexec/sbx/sbx-agent", dir);
    return sbx_xstrdup(access(alt, X_OK) == 0 ? alt : buf);
}

/* raise_nofile — the soft RLIMIT_NOFILE raised to the hard limit, once at
 * start-up.  A shard keeps 2 descriptors per running sandbox (channel,
 * pidfd) and more for image and workspace sandboxes, at 4096 and above
 * (container/spawn.c, fd_high); a gateway one per client connection (the
 * HTTP front takes up to 4096).  The usual soft limit, 1024, would stop a
 * shard near 500 sandboxes with EMFILE; 10,000 idle sandboxes per node
 * (docs/benchmarks.md, "Density") need about 4096 + 2 per sandbox in each
 * shard.  The hard limit is the administrator's (systemd LimitNOFILE=); it
 * is only read here, and a warning names it when it is below 4096 + 2 *
 * 10,000 / 2.  Nothing here uses select(2) (the HTTP front polls with
 * epoll), and every child process the daemon starts sets its own limits
 * (container/spawn_child.c). */
static void
raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            sbx_log_warn("RLIMIT_NOFILE not raised from %llu: %s", (unsigned long long)was,
                         strerror(errno));
            return;
        }
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 4096 + 10000)
        sbx_log_warn("RLIMIT_NOFILE is %llu (hard limit): a shard needs about 4096 + 2 "
                     "per running sandbox",
                     (unsigned long long)rl.rlim_cur);
}

/* check_pty_capacity — a note in the log when the host caps the sandboxes that can
 * run a shell at once below 10,000.  Every session's shell holds one
 * pseudo-terminal of its sandbox's devpts instance (container/agent/
 * session_shell.c), and the kernel allows kernel.pty.max - kernel.pty.reserve
 * of them (3,072 by default) across all non-initial instances of the host:
 * past that, a command in a session fails with "no pseudo-terminal left on
 * the host".  A host-wide setting, the administrator's (sysctl
 * kernel.pty.max, up to 1048576); it is only read here. */
static void
check_pty_capacity(void)
{
    long v[2] = {-1, -1};
    const char *f[2] = {"/proc/sys/kernel/pty/max", "/proc/sys/kernel/pty/reserve"};
    for (int i = 0; i < 2; i++) {
        char *text;
        size_t n;
        if (sbx_fs_read(f[i], 64, &text, &n) != 0)
            return;
        v[i] = strtol(text, NULL, 10);
        free(text);
    }
    if (v[0] - v[1] < 10000)
        sbx_log_info("at most %ld sandboxes of this host can run a session shell at once "
                     "(kernel.pty.max %ld less kernel.pty.reserve %ld); raise kernel.pty.max "
                     "for more",
                     v[0] - v[1], v[0], v[1]);
}

/* --relay-secret-file: the secret from a file (not on the command line,
 * where every local user can read it in ps).  0, or 1 after printing why. */
static int
load_secret(const char *file, char **secret, const char *who)
{
    if (!file || !*file)
        return 0;
    char *text;
    size_t n;
    int rc = sbx_fs_read(file, 4096, &text, &n);
    if (rc) {
        fprintf(stderr, "%s: cannot read %s: %s\n", who, file, strerror(-rc));
        return 1;
    }
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
        text[--n] = 0;
    if (n < 16) {
        fprintf(stderr, "%s: the relay secret in %s must be at least 16 characters\n", who,
                file);
        free(text);
        return 1;
    }
    free(*secret);
    *secret = text;
    return 0;
}

/* cgroup_base_normalize — the subtree as its components joined by single
 * '/' (none leading or trailing), so that spellings of one subtree take one
 * lock; "." and ".." are refused (a sweep must stay inside sbx's own
 * subtree).  0 or -EINVAL. */
static int
cgroup_base_normalize(const char *in, char *out, size_t outlen)
{
    size_t k = 0;
    int rc = 0;
    out[0] = '\0';
    for (const char *p = in; *p && !rc;) {
        size_t n = strcspn(p, "/");
        if ((n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            rc = -EINVAL;
        else if (n > 0 && k + (k > 0) + n + 1 > outlen)
            rc = -EINVAL;
        else if (n > 0)
            k += (size_t)snprintf(out + k, outlen - k, "%s%.*s", k ? "/" : "", (int)n, p);
        p += n;
        while (*p == '/')
            p++;
    }
    return rc ? rc : k ? 0 : -EINVAL;
}

/* --log-format, which every command takes (`sbxd dev` passes it on to its
 * shards with the shard options); read into a local `log_format`. */
#define LOG_FORMAT_OPT                                                                        \
    {"log-format", SBX_OPT_STR, &log_format,                                                  \
     "log lines as text or json (one object per line: docs/operations.md)"}

/* The transport security options of every command (docs/security.md,
 * Transports); `sbxd dev` passes them on to its shards. */
struct tls_opts {
    char *ca, *cert, *key; /* PEM file paths (heap), or NULL */
    char *crl;             /* PEM revocation list (heap), or NULL */
    bool insecure;         /* --insecure-plaintext */
};
#define TLS_OPTS(t)                                                                           \
    {"tls-ca", SBX_OPT_STR, &(t)->ca,                                                         \
     "PEM file of the deployment CA: tls+tcp:// peers must present a certificate it signed"}, \
        {"tls-cert", SBX_OPT_STR, &(t)->cert,                                                 \
         "PEM file of this node's certificate (signed by --tls-ca; tools/sbx-cert)"},        \
        {"tls-key", SBX_OPT_STR, &(t)->key, "PEM file of this node's private key"},          \
        {"tls-crl", SBX_OPT_STR, &(t)->crl,                                                   \
         "PEM revocation list of the CA (tools/sbx-cert revoke): peers it names are refused"}, \
        {"insecure-plaintext", SBX_OPT_BOOL, &(t)->insecure,                                  \
         "INSECURE: allow plain tcp:// listens on non-loopback addresses (anyone who reaches " \
         "them controls every sandbox)"}

/* The etcd client's TLS (https:// endpoints; runtime/etcd.h sbx_etcd_set_tls). */
#define ETCD_TLS_OPTS(ca, cert, key)                                                          \
    {"etcd-ca", SBX_OPT_STR, ca,                                                              \
     "PEM file of the CA etcd's certificate chains to (https:// --etcd; default --tls-ca)"},  \
        {"etcd-cert", SBX_OPT_STR, cert,                                                      \
         "PEM file of the client certificate shown to etcd (default --tls-cert)"},           \
        {"etcd-key", SBX_OPT_STR, key, "PEM file of its key (default --tls-key)"}

/* For https:// etcd endpoints, the etcd TLS paths not given default to the
 * node's --tls-* ones (one deployment CA for nng and etcd). */
static void
etcd_tls_defaults(const char *etcd, char **ca, char **cert, char **key, const struct tls_opts *t)
{
    if (!etcd || !strstr(etcd, "https://"))
        return;
    if (!*ca && t->ca)
        *ca = sbx_xstrdup(t->ca);
    if (!*cert && !*key && t->cert && t->key) {
        *cert = sbx_xstrdup(t->cert);
        *key = sbx_xstrdup(t->key);
    }
}

static void
tls_opts_free(struct tls_opts *t)
{
    free(t->ca);
    free(t->cert);
    free(t->key);
    free(t->crl);
}

/* tls_open — load t into *sec (sbx_nng_sec_close it) and check that listen
 * may be served with it; 0, or 2 with the reason logged (*sec then holds
 * nothing).  Its first nng call starts nng's threads: the caller blocks the
 * signals it waits for before (a SIGTERM that such a thread takes kills
 * the process; a SIGCHLD it takes is lost). */
static int
tls_open(const struct tls_opts *t, sbx_nng_sec *sec, const char *listen)
{
    sbx_err_t err = NULL;
    int rc = sbx_nng_sec_open(sec, t->ca, t->cert, t->key, t->insecure, &err);
    if (!rc && t->crl && *t->crl && (rc = sbx_nng_sec_add_crl(sec, t->ca, t->crl, &err)) != 0)
        sbx_nng_sec_close(sec);
    if (!rc && (rc = sbx_nng_listen_check(listen, sec, &err)) != 0)
        sbx_nng_sec_close(sec);
    if (rc) {
        sbx_log_error("%s", sbx_err_msg(err));
        sbx_err_release(&err);
        return 2;
    }
    return 0;
}

/* Apply --log-format; 0, or 2 with the reason printed. */
static int
set_log_format(const char *log_format, const char *cmd)
{
    if (sbx_log_set_format(log_format) == 0)
        return 0;
    fprintf(stderr, "%s: --log-format must be text or json, not '%s'\n", cmd, log_format);
    return 2;
}

/* The options a shard takes; `sbxd dev` takes them too and passes them on. */
#define SHARD_OPTS(c)                                                                         \
    {"agent", SBX_OPT_STR, &(c)->agent, "path of sbx-agent (default: next to sbxd, or ../libexec/sbx/)"},         \
        {"interp", SBX_OPT_STR, &(c)->interp,                                                 \
         "interpreter drivers directory (default: ../share/sbx/interp from sbxd)"},           \
        {"cgroup", SBX_OPT_STR, &(c)->cgroup, "cgroup mode: auto, v1, v2 or none"},           \
        {"allow-unlimited", SBX_OPT_BOOL, &(c)->allow_unlimited,                              \
         "run sandboxes without limits where cgroup v2 lacks memory/pids/cpu (else refuse)"}, \
        {"uid-base", SBX_OPT_INT, &(c)->uid_base,                                            \
         "first host uid mapped into sandboxes (default: the first free range from "          \
         "1000000000; ranges are locked per host)"},                                          \
        {"uid-count", SBX_OPT_INT, &(c)->uid_count, "host uids available (max live sandboxes)"}, \
        {"contexts", SBX_OPT_INT, &(c)->contexts, "requests received concurrently"},          \
        {"workers", SBX_OPT_INT, &(c)->workers, "container start/stop threads (0: 1/CPU, at least 2)"},   \
        {"pool", SBX_OPT_INT, &(c)->pool, "ready containers kept at least (0: none)"},        \
        {"pool-memory", SBX_OPT_SIZE, &(c)->pool_memory, "memory budget of the pool"},        \
        {"pool-window", SBX_OPT_MS, &(c)->pool_window,                                       \
         "demand the pools follow: their busiest second in this window (1s..60s, default 60s)"}, \
        {"memory", SBX_OPT_SIZE, &(c)->memory, "memory limit per sandbox (e.g. 512M)"},       \
        {"pids", SBX_OPT_INT, &(c)->pids, "process limit per sandbox"},                       \
        {"cpu", SBX_OPT_INT, &(c)->cpu, "CPU limit per sandbox, millicpus (1000 = 1 CPU)"},   \
        {"sandbox-cpu-share", SBX_OPT_INT, &(c)->cpu_share,                                   \
         "CPU weight of all sandboxes together, in nice-0 processes (default 8 per CPU; "     \
         "0: the kernel's, one process)"},                                                    \
        {"disk", SBX_OPT_SIZE, &(c)->disk, "size of /workspace+/tmp+/home per sandbox"},      \
        {"inodes", SBX_OPT_INT, &(c)->inodes, "inodes of /workspace+/tmp+/home"},             \
        {"disk-max", SBX_OPT_SIZE, &(c)->disk_max,                                            \
         "largest `disk` a create may ask for (16G; more: VALIDATION_FAILED)"},              \
        {"output-cap", SBX_OPT_SIZE, &(c)->output_cap, "bytes kept per output stream of an exec"}, \
        {"setup-timeout", SBX_OPT_MS, &(c)->setup_timeout, "longest container start-up"},     \
        {"map-size", SBX_OPT_SIZE, &(c)->map_size, "initial metadata store map (1G)"},      \
        {"map-max", SBX_OPT_SIZE, &(c)->map_max,                                              \
         "largest metadata store map; beyond, writes fail STORAGE_FULL (64G)"},              \
        {"sleep-after", SBX_OPT_MS, &(c)->sleep_after, "idle time before a container stops (10m)"}, \
        {"idem-ttl", SBX_OPT_MS, &(c)->idem_ttl,                                               \
         "how long a request id's recorded reply is kept for retries (10m)"},                \
        {"etc", SBX_OPT_LIST, &(c)->etc, "/etc entry bound read-only into sandboxes (repeat)"}, \
        {"env", SBX_OPT_LIST, &(c)->env, "base environment entry K=V of sandboxes (repeat)"}, \
        {"images", SBX_OPT_STR, &(c)->images,                                                 \
         "the node's image store (default <data>/images; dev: one for all shards)"},          \
        {"backups", SBX_OPT_STR, &(c)->backups,                                               \
         "the node's backup store (default <data>/backups; dev: one for all shards)"},        \
        {"backup-max", SBX_OPT_SIZE, &(c)->backup_max,                                        \
         "the largest compressed archive of a backup (1G; more: BACKUP_TOO_LARGE)"},          \
        {"backup-store", SBX_OPT_STR, &(c)->backup_store,                                     \
         "s3://bucket[/prefix]: keep backups in an S3-compatible store (default: the "       \
         "directory --backups; docs/persistence.md)"},                                       \
        {"s3-endpoint", SBX_OPT_STR, &(c)->s3_endpoint,                                       \
         "http(s)://host[:port] of the S3 service (default: AWS's of --s3-region)"},         \
        {"s3-region", SBX_OPT_STR, &(c)->s3_region, "the S3 region SigV4 signs for (us-east-1)"}, \
        {"s3-credentials", SBX_OPT_STR, &(c)->s3_credentials,                                 \
         "file of AWS_ACCESS_KEY_ID=/AWS_SECRET_ACCESS_KEY= lines, mode 600 (default: "      \
         "those environment variables)"},                                                    \
        {"s3-timeout", SBX_OPT_MS, &(c)->s3_timeout,                                          \
         "deadline of each S3 call, retries included (30s)"},                                \
        {"image-pool", SBX_OPT_INT, &(c)->image_pool,                                         \
         "ready containers kept at least per image sandboxes are being created from; more "  \
         "follow its busiest second of creates, within --pool-memory (0: no image pools)"},      \
        {"network-default", SBX_OPT_STR, &(c)->network_default,                               \
         "network mode of sandboxes that choose none: none (loopback only) or egress"},       \
        {"network-range", SBX_OPT_STR, &(c)->network_range,                                   \
         "IPv4 range of sandbox addresses, one /22 per shard (10.88.0.0/16)"},                \
        {"dns-upstream", SBX_OPT_STR, &(c)->dns_upstream,                                     \
         "A.B.C.D[:PORT][,…] (up to 4, the next on SERVFAIL or silence): where egress "       \
         "sandboxes' resolver forwards allowed names (default: the host's first IPv4 "        \
         "nameserver)"},                                                                      \
        {"egress-inject", SBX_OPT_STR, &(c)->egress_inject,                                   \
         "file of rules 'HOST[:PORT] Name: value' (mode 600): headers the egress point adds "  \
         "to sandboxes' plain-HTTP requests to HOST, the secret never inside"},              \
        {"egress-deny", SBX_OPT_LIST, &(c)->egress_deny,                                       \
         "host or IPv4 address no egress sandbox may reach whatever its policy (repeat; "     \
         "etcd, this node's and the cluster members' addresses always are)"},                 \
        {"insecure-registry", SBX_OPT_LIST, &(c)->insecure_registry,                          \
         "registry host[:port] pulled from over plain HTTP or an unverified certificate "     \
         "(repeat; loopback registries always are, as Docker's default)"},                    \
        {"workspace-default", SBX_OPT_STR, &(c)->workspace_default,                           \
         "workspace of a sandbox created without one: ephemeral (tmpfs) or persistent "      \
         "(kept on disk, docs/persistence.md)"},                                            \
        {"ws-pool", SBX_OPT_STR, &(c)->ws_pool,                                               \
         "persistent workspaces in an XFS pool <data>/wspool.img (reflinks: fast forks): "   \
         "auto (when <data>/workspaces has no reflinks), on, or off (images on the host "    \
         "file system; refused once a pool exists)"},                                        \
        {"ws-pool-node", SBX_OPT_STR, &(c)->ws_pool_node,                                     \
         "the node's workspace pool this shard takes a part of (set by sbxd dev)"},          \
        {"ws-pool-size", SBX_OPT_SIZE, &(c)->ws_pool_size,                                    \
         "size of a new workspace pool, sparse (default: the data file system's free space; " \
         "at least 320M)"},                                                                  \
        {"preview-domain", SBX_OPT_STR, &(c)->preview_domain,                                 \
         "host of preview URLs: {port}-{id}-{token}.<this> (dev: localhost:<http port>)"},   \
        {"preview-scheme", SBX_OPT_STR, &(c)->preview_scheme,                                 \
         "scheme of preview URLs: http, or https behind a TLS terminator"},                  \
        {"no-preview-host", SBX_OPT_LIST, &(c)->no_preview_host,                              \
         "host suffix exposePort refuses with CUSTOM_DOMAIN_REQUIRED: no wildcard preview "  \
         "URLs under it (repeat; replaces the default workers.dev)"},                        \
        {"relay-secret-file", SBX_OPT_STR, &relay_secret_file,                                 \
         "file holding the relay secret (preferred to --relay-secret)"},                     \
        {"relay-secret", SBX_OPT_STR, &(c)->relay_secret,                                     \
         "secret gateways must present to preview relays (tcp relays)"},                     \
        LOG_FORMAT_OPT

static int
cmd_shard(int argc, char **argv)
{
    struct sbx_shard_conf c;
    bool help = false, sweep = false;
    char **rest = NULL, why[256];
    char *relay_secret_file = NULL;
    char *log_format = NULL;
    struct tls_opts tls = {0};
    sbx_nng_sec sec = {0};
    sbx_shard_conf_defaults(&c);
    /* --etc/--env given on the command line replace the defaults. */
    struct sbx_opt opts[] = {
        {"name", SBX_OPT_STR, &c.name,
         "shard name, unique in the deployment and (with its cgroup subtree) on the host"},
        {"listen", SBX_OPT_STR, &c.listen, "nng URL to serve on"},
        {"data", SBX_OPT_STR, &c.data, "data directory (LMDB)"},
        {"cgroup-base", SBX_OPT_STR, &c.cgroup_base,
         "cgroup subtree (default sbx/<name>); one live shard per subtree on a host"},
        {"relay", SBX_OPT_STR, &c.relay,
         "preview relay address: unix:/path or tcp:host:port (gateways connect to it)"},
        {"etcd", SBX_OPT_STR, &c.etcd,
         "etcd endpoints http(s)://host:port[,…]: join a cluster (docs/cluster.md)"},
        {"cluster", SBX_OPT_STR, &c.cluster, "cluster name (etcd keys under /sbx/<name>/)"},
        {"advertise", SBX_OPT_STR, &c.advertise,
         "nng URL gateways and shards reach this shard at (default: --listen)"},
        ETCD_TLS_OPTS(&c.etcd_ca, &c.etcd_cert, &c.etcd_key),
        {"lease-ttl", SBX_OPT_MS, &c.lease_ttl,
         "membership lease; unrenewed for this long, the shard stops serving (10s)"},
        {"snapshot-interval", SBX_OPT_MS, &c.snapshot_interval,
         "how often the persistent workspaces a cluster shard owns are snapshotted to each "
         "partition's successor, for a failover (5m; 0: never; docs/persistence.md)"},
        SHARD_OPTS(&c),
        TLS_OPTS(&tls),
        {"sweep", SBX_OPT_BOOL, &sweep,
         "take this shard's locks, remove what an earlier incarnation of it left (every "
         "process and cgroup of its subtree) and exit 0; `sbxd dev` runs it for a shard that "
         "is down when the deployment stops"},
        {"help", SBX_OPT_BOOL, &help, "show this help"},
        {NULL, 0, NULL, NULL},
    };
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "--etc", 5)) {
            sbx_strv_free(c.etc);
            c.etc = NULL;
            break;
        }
    }
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "--env", 5)) {
            sbx_strv_free(c.env);
            c.env = NULL;
            break;
        }
    }
    for (int i = 2; i < argc; i++) {
        if (!strncmp(argv[i], "--no-preview-host", 17)) {
            sbx_strv_free(c.no_preview_host);
            c.no_preview_host = NULL;
            break;
        }
    }
    if (sbx_config_parse(opts, argc, argv, 2, &rest, why, sizeof(why)) != 0) {
        fprintf(stderr, "sbxd shard: %s\n", why);
        sbx_shard_conf_free(&c);
        free(relay_secret_file);
        free(log_format);
        tls_opts_free(&tls);
        return 2;
    }
    free(rest);
    int frc = set_log_format(log_format, "sbxd shard");
    free(log_format);
    if (frc) {
        free(relay_secret_file);
        sbx_shard_conf_free(&c);
        tls_opts_free(&tls);
        return frc;
    }
    int lrc = load_secret(relay_secret_file, &c.relay_secret, "sbxd shard");
    free(relay_secret_file);
    if (lrc) {
        sbx_shard_conf_free(&c);
        tls_opts_free(&tls);
        return 2;
    }
    /* A relay on TCP without a secret would let anyone who can reach the
     * port into every exposed port of every sandbox, token or not. */
    if (!help && c.relay && !strncmp(c.relay, "tcp:", 4) && (!c.relay_secret || !*c.relay_secret)) {
        fprintf(stderr, "sbxd shard: --relay %s needs --relay-secret-file (or --relay-secret): "
                        "a TCP relay without a secret serves anyone who reaches it\n",
                c.relay);
        sbx_shard_conf_free(&c);
        tls_opts_free(&tls);
        return 2;
    }
    if (help) {
        sbx_config_usage(opts, "sbxd shard", "Run one shard node.");
        sbx_shard_conf_free(&c);
        tls_opts_free(&tls);
        return 0;
    }
    if (!c.agent)
        c.agent = agent_next_to_self();
    if (!c.interp)
        c.interp = interp_dir_default();
    if (!c.etc)
        c.etc = sbx_xcalloc(1, sizeof(char *));
    if (!c.env)
        c.env = sbx_xcalloc(1, sizeof(char *));
    if (!c.no_preview_host)
        c.no_preview_host = sbx_xcalloc(1, sizeof(char *));
    char tag[64];
    snprintf(tag, sizeof(tag), "sbxd shard %s", c.name);
    sbx_log_init(tag, -1);
    raise_nofile();
    check_pty_capacity();
    /* A listen the transport rules refuse stops the shard here, status 2,
     * before it takes any lock (a sweep serves nothing).  The signals
     * sbx_shard_run waits for are blocked first (tls_open). */
    sigset_t tset;
    sigemptyset(&tset);
    sigaddset(&tset, SIGTERM);
    sigaddset(&tset, SIGINT);
    sigprocmask(SIG_BLOCK, &tset, NULL);
    etcd_tls_defaults(c.etcd, &c.etcd_ca, &c.etcd_cert, &c.etcd_key, &tls);
    int trc = sweep ? 0 : tls_open(&tls, &sec, c.listen);
    tls_opts_free(&tls);
    if (trc) {
        sbx_shard_conf_free(&c);
        return trc;
    }
    c.sec = &sec;
    /* The subtree the shard will sweep, spelled one way, locked before the
     * shard touches it (host locks, above); the shard uses it as given. */
    char base[256], fallback[256];
    struct hostlock hl;
    snprintf(fallback, sizeof(fallback), "sbx/%s", c.name);
    if (cgroup_base_normalize(c.cgroup_base && *c.cgroup_base ? c.cgroup_base : fallback, base,
                              sizeof(base)) != 0) {
        sbx_log_error("the cgroup subtree '%s' must be a relative path without '.' or '..' "
                  "(at most %zu bytes)", c.cgroup_base && *c.cgroup_base ? c.cgroup_base : fallback,
                  sizeof(base) - 1);
        sbx_shard_conf_free(&c);
        sbx_nng_sec_close(&sec);
        return 2;
    }
    free(c.cgroup_base);
    c.cgroup_base = sbx_xstrdup(base);
    char lwhy[1024];
    int rc = hostlock_take(&hl, "cgroup", base, true, "the cgroup subtree of a live shard on "
                           "this host", lwhy, sizeof(lwhy));
    if (rc) {
        sbx_log_error("cannot take cgroup subtree %s: %s%s", base, lwhy,
                  rc == -EBUSY ? ". Its sweep at start-up would kill that shard's sandboxes: "
                                 "give this shard another --name or --cgroup-base"
                               : "");
        sbx_shard_conf_free(&c);
        sbx_nng_sec_close(&sec);
        return rc == -EBUSY ? 2 : 1;
    }
    /* One live shard per data directory too: two shards of different names
     * on one LMDB environment would each think they own every record in it
     * (and each sweep the other's containers from its actors). */
    int dfd = -1;
    pid_t dholder = 0;
    char dpath[PATH_MAX];
    if (!c.data || snprintf(dpath, sizeof(dpath), "%s/shard.lock", c.data) >= (int)sizeof(dpath))
        rc = -ENAMETOOLONG;
    else if ((rc = sbx_mkdir_p(c.data, 0700)) == 0)
        rc = lock_take(dpath, true, &dfd, &dholder);
    if (rc) {
        if (rc == -EBUSY)
            sbx_log_error("the data directory %s is in use by a live shard (pid %d): give this "
                      "shard its own --data",
                      c.data, (int)dholder);
        else
            sbx_log_error("cannot lock the data directory %s: %s", c.data ? c.data : "(none)",
                      strerror(-rc));
        hostlock_release(&hl);
        sbx_shard_conf_free(&c);
        sbx_nng_sec_close(&sec);
        return rc == -EBUSY ? 2 : 1;
    }
    /* Host uids, locked like names and cgroups (uid_range_lock); without
     * --uid-base, the first free range.  A sweep hands out none. */
    struct hostlock ul = {.n = 0};
    bool uid_given = false;
    for (int k = 2; k < argc; k++)
        uid_given |= !strncmp(argv[k], "--uid-base", 10);
    if (!sweep && (rc = uid_range_lock(&ul, &c.uid_base, c.uid_count, !uid_given, lwhy,
                                       sizeof(lwhy))) != 0) {
        sbx_log_error("%s%s", lwhy,
                  rc == -EBUSY ? ": give this shard a --uid-base range of its own (or none: "
                                 "it then takes a free one)"
                               : "");
        close(dfd);
        hostlock_release(&hl);
        sbx_shard_conf_free(&c);
        sbx_nng_sec_close(&sec);
        return rc == -EBUSY ? 2 : 1;
    }
    if (!sweep)
        sbx_log_info("host uids %lld-%lld", (long long)c.uid_base,
                     (long long)(c.uid_base + c.uid_count - 1));
    if (sweep) {
        /* What sbx_shard_run does first and last, with nothing between:
         * sbx_cgroups_open kills what is left in the subtree (by pidfd) and
         * removes its cgroups, sbx_cgroups_close removes the subtree. */
        sbx_cgroups *cg = NULL;
        char cwhy[256];
        rc = sbx_cgroups_open(&cg, c.cgroup, base, cwhy, sizeof(cwhy));
        if (rc)
            sbx_log_error("sweep of cgroup subtree %s: %s (%s)", base, cwhy, strerror(-rc));
        sbx_cgroups_close(cg);
    } else {
        rc = sbx_shard_run(&c);
    }
    close(dfd); /* the file stays: it is the directory's, not a host-wide name */
    hostlock_release(&ul);
    hostlock_release(&hl);
    sbx_shard_conf_free(&c);
    sbx_nng_sec_close(&sec);
    return rc ? 1 : 0;
}

static int
wait_signal(const sigset_t *set)
{
    for (;;) {
        int sig = sigwaitinfo(set, NULL);
        if (sig > 0)
            return sig;
        if (errno != EINTR)
            return -errno;
    }
}

/* wait_signal_until — like wait_signal, for at most timeout_ms (< 0: no
 * bound): the signal, 0 when the time ran out, or -errno. */
static int
wait_signal_until(const sigset_t *set, int64_t timeout_ms)
{
    if (timeout_ms < 0)
        return wait_signal(set);
    int64_t until = sbx_mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = until - sbx_mono_ms();
        if (left < 0)
            left = 0;
        struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000L};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0)
            return sig;
        if (errno == EAGAIN)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}

/* The HTTP front's options (gateway and dev). */
#define GATEWAY_HTTP_OPTS(g)                                                                  \
    {"http", SBX_OPT_STR, &(g)->http, "HTTP front address host:port (\"\" for none)"},        \
        {"api-keys", SBX_OPT_STR, &(g)->api_keys,                                             \
         "file of HTTP API keys, one per line (required unless --http is loopback)"},        \
        {"http-max-body", SBX_OPT_SIZE, &(g)->http_max_body, "largest HTTP request body"},   \
        {"http-per-client", SBX_OPT_INT, &(g)->http_per_client,                               \
         "HTTP connections per client address (default 1024; raise it behind a proxy)"},      \
        {"console", SBX_OPT_BOOL, &(g)->console,                                              \
         "serve the web console at http://<--http>/console/ (off by default; docs/console.md)"}

static int
cmd_gateway(int argc, char **argv)
{
    struct sbx_gateway_conf c = {0};
    bool help = false;
    char **rest = NULL, why[256];
    char *relay_secret_file = NULL;
    char *log_format = NULL;
    struct tls_opts tls = {0};
    sbx_nng_sec sec = {0};
    c.name = sbx_xstrdup("gw");
    c.listen = sbx_xstrdup(DEFAULT_LISTEN);
    c.contexts = 1024;
    c.timeout = 600000;
    struct sbx_opt opts[] = {
        {"name", SBX_OPT_STR, &c.name, "gateway name"},
        {"listen", SBX_OPT_STR, &c.listen, "nng URL for clients"},
        {"shard", SBX_OPT_LIST, &c.shards, "a shard as name=url (repeat for each)"},
        {"etcd", SBX_OPT_STR, &c.etcd,
         "etcd endpoints http(s)://host:port[,…]: shards and partitions come from the cluster"},
        {"cluster", SBX_OPT_STR, &c.cluster, "cluster name (etcd keys under /sbx/<name>/)"},
        ETCD_TLS_OPTS(&c.etcd_ca, &c.etcd_cert, &c.etcd_key),
        {"contexts", SBX_OPT_INT, &c.contexts, "client requests handled concurrently"},
        {"timeout", SBX_OPT_MS, &c.timeout, "deadline of requests that carry none"},
        GATEWAY_HTTP_OPTS(&c),
        {"preview-domain", SBX_OPT_STR, &c.preview_domain,
         "host of preview URLs (Host headers {port}-{id}-{token}.<this> are proxied)"},
        {"preview-scheme", SBX_OPT_STR, &c.preview_scheme, "http, or https behind TLS"},
        {"relay-secret", SBX_OPT_STR, &c.relay_secret, "secret of the shards' preview relays"},
        {"relay-secret-file", SBX_OPT_STR, &relay_secret_file,
         "file holding the relay secret (preferred to --relay-secret)"},
        TLS_OPTS(&tls),
        LOG_FORMAT_OPT,
        {"help", SBX_OPT_BOOL, &help, "show this help"},
        {NULL, 0, NULL, NULL},
    };
    int rc = 0;
    if (sbx_config_parse(opts, argc, argv, 2, &rest, why, sizeof(why)) != 0) {
        fprintf(stderr, "sbxd gateway: %s\n", why);
        rc = 2;
        goto out;
    }
    if (load_secret(relay_secret_file, &c.relay_secret, "sbxd gateway")) {
        rc = 2;
        goto out;
    }
    if (help) {
        sbx_config_usage(opts, "sbxd gateway", "Run one gateway node.");
        goto out;
    }
    sbx_log_init("sbxd gateway", -1);
    raise_nofile();
    if ((rc = set_log_format(log_format, "sbxd gateway")) != 0)
        goto out;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    etcd_tls_defaults(c.etcd, &c.etcd_ca, &c.etcd_cert, &c.etcd_key, &tls);
    if ((rc = tls_open(&tls, &sec, c.listen)) != 0)
        goto out;
    c.sec = &sec;
    sbx_gateway *gw;
    if (sbx_gateway_start(&gw, &c) != 0) {
        rc = 1;
        goto out;
    }
    wait_signal(&set);
    sbx_gateway_stop(gw);
out:
    free(rest);
    free(c.name);
    free(c.listen);
    free(c.http);
    free(c.api_keys);
    free(c.preview_domain);
    free(c.preview_scheme);
    free(c.relay_secret);
    free(c.etcd);
    free(c.etcd_ca);
    free(c.etcd_cert);
    free(c.etcd_key);
    free(c.cluster);
    free(relay_secret_file);
    free(log_format);
    sbx_strv_free(c.shards);
    tls_opts_free(&tls);
    sbx_nng_sec_close(&sec);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* dev: gateway in this process, shards as children. */

struct child {
    pid_t pid;              /* 0 while not running */
    char **argv;
    int64_t started_ms;
    int64_t restart_at_ms;  /* when pid is 0: the monotonic time of the next start, 0 none */
    int restarts;           /* consecutive restarts that were up < 10 s */
    bool ever_restarted;
};

/* dev_restart_delay_ms — the back-off before the n-th consecutive restart
 * (n ≥ 1) of a shard: 100 ms, doubling, at most 5000 ms. */
static int
dev_restart_delay_ms(int n)
{
    int d = 100;
    for (int k = 1; k < n && d < 5000; k++)
        d *= 2;
    return d < 5000 ? d : 5000;
}

static pid_t
spawn_child(char **argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", argv);
        perror("sbxd dev: exec");
        _exit(127);
    }
    return pid;
}

static void
argv_add(char ***v, size_t *n, const char *s)
{
    *v = sbx_xrealloc(*v, (*n + 2) * sizeof(char *));
    (*v)[(*n)++] = sbx_xstrdup(s);
    (*v)[*n] = NULL;
}

static int
cmd_dev(int argc, char **argv)
{
    struct sbx_shard_conf c;
    char *data = sbx_xstrdup("/var/lib/sbx/dev");
    char *listen = sbx_xstrdup(DEFAULT_LISTEN);
    char *name = sbx_xstrdup("dev");
    int64_t nshards = 2;
    struct sbx_gateway_conf gc = {.contexts = 1024, .timeout = 600000};
    struct tls_opts tls = {0};
    sbx_nng_sec sec = {0};
    gc.http = sbx_xstrdup(DEFAULT_HTTP);
    bool help = false;
    char **rest = NULL, why[256];
    char *relay_secret_file = NULL;
    char *log_format = NULL;
    sbx_shard_conf_defaults(&c);
    sbx_strv_free(c.etc);
    sbx_strv_free(c.env);
    c.etc = c.env = NULL;
    free(c.agent);
    c.agent = NULL;
    /* Only options given explicitly are passed on to the shards. */
    struct sbx_opt opts[] = {
        {"data", SBX_OPT_STR, &data, "data directory (one sub-directory per shard)"},
        {"listen", SBX_OPT_STR, &listen, "nng URL of the gateway"},
        {"name", SBX_OPT_STR, &name,
         "deployment name: prefix of shard names, cgroups and host uids; one live "
         "deployment per name on a host"},
        {"shards", SBX_OPT_INT, &nshards, "number of shard processes"},
        GATEWAY_HTTP_OPTS(&gc),
        SHARD_OPTS(&c),
        TLS_OPTS(&tls),
        {"help", SBX_OPT_BOOL, &help, "show this help"},
        {NULL, 0, NULL, NULL},
    };
    int rc = 0;
    struct child *kids = NULL;
    sbx_wspool *node_pool = NULL; /* the shards' shared workspace pool (ws_pool.h), if made */
    sbx_gateway *gw = NULL;
    struct hostlock dlock = {.n = 0};
    char **shard_specs = NULL;
    size_t nspecs = 0;

    if (sbx_config_parse(opts, argc, argv, 2, &rest, why, sizeof(why)) != 0) {
        fprintf(stderr, "sbxd dev: %s\n", why);
        rc = 2;
        goto out;
    }
    if (load_secret(relay_secret_file, &c.relay_secret, "sbxd dev")) {
        rc = 2;
        goto out;
    }
    if (help) {
        sbx_config_usage(opts, "sbxd dev",
                         "Run the embedded single-node default: a gateway and N shards.");
        goto out;
    }
    if (nshards < 1 || nshards > 64) {
        fprintf(stderr, "sbxd dev: --shards must be 1..64\n");
        rc = 2;
        goto out;
    }
    sbx_log_init("sbxd dev", -1);
    raise_nofile();
    if ((rc = set_log_format(log_format, "sbxd dev")) != 0)
        goto out;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* The gateway's listen is checked here; the shards (on ipc://) get the
     * TLS options with the other shard options. */
    if ((rc = tls_open(&tls, &sec, listen)) != 0)
        goto out;
    gc.sec = &sec;
    if (geteuid() != 0) {
        sbx_log_error("sbxd must run as root (it creates namespaces, cgroups and mounts)");
        rc = 1;
        goto out;
    }
    /* One live deployment per name on the host, before anything is touched
     * (host locks, above); each shard then locks its own cgroup subtree. */
    char lwhy[1024];
    int lrc = hostlock_take(&dlock, "deploy", name, false, "the name of a live deployment on "
                            "this host", lwhy, sizeof(lwhy));
    if (lrc == -EBUSY) {
        sbx_log_error("%s. A second deployment of one name would share its cgroups (and kill its "
                  "sandboxes) and its host uids: stop that one, or give this one another --name",
                  lwhy);
        rc = 2;
        goto out;
    }
    if (lrc) {
        sbx_log_error("cannot lock deployment '%s': %s", name, lwhy);
        rc = 1;
        goto out;
    }
    if (sbx_mkdir_p(data, 0700) != 0) {
        sbx_log_error("cannot create the data directory %s", data);
        rc = 1;
        goto out;
    }
    char absdata[PATH_MAX];
    if (!realpath(data, absdata)) {
        sbx_log_error("cannot resolve %s", data);
        rc = 1;
        goto out;
    }

    /* The gateway first: it dials the shards in the background, and its HTTP
     * port (maybe picked by the kernel) names the preview domain. */
    for (int i = 0; i < nshards; i++) {
        char buf[PATH_MAX + 64];
        snprintf(buf, sizeof(buf), "%s-s%d=ipc://%s/s%d.sock", name, i, absdata, i);
        argv_add(&shard_specs, &nspecs, buf);
    }
    gc.name = name;
    gc.listen = listen;
    gc.shards = shard_specs;
    gc.await_shards = true; /* started below, after the gateway answers */
    gc.preview_domain = c.preview_domain;
    gc.preview_scheme = c.preview_scheme;
    gc.relay_secret = c.relay_secret;
    bool domain_given = false;
    for (int k = 2; k < argc; k++)
        if (!strncmp(argv[k], "--preview-domain", 16))
            domain_given = true;
    if (!domain_given)
        gc.preview_domain = NULL; /* set below from the bound port */
    if (sbx_gateway_start(&gw, &gc) != 0) {
        rc = 1;
        goto stop;
    }
    char preview_domain[300];
    int http_port = sbx_gateway_http_port(gw);
    if (domain_given)
        snprintf(preview_domain, sizeof(preview_domain), "%s", c.preview_domain);
    else
        snprintf(preview_domain, sizeof(preview_domain), "localhost:%d", http_port ? http_port : 7780);
    if (http_port) {
        /* Where clients (and the tests) find the HTTP front. */
        char path[PATH_MAX + 16], addr[300];
        snprintf(path, sizeof(path), "%s/http.addr", absdata);
        const char *colon = strrchr(gc.http, ':');
        snprintf(addr, sizeof(addr), "%.*s:%d\n", colon ? (int)(colon - gc.http) : 0, gc.http,
                 http_port);
        FILE *f = fopen(path, "we");
        if (f) {
            fputs(addr, f);
            fclose(f);
        }
        sbx_log_info("HTTP API on http://%.*s:%d, preview URLs http://{port}-{id}-{token}.%s/",
                 colon ? (int)(colon - gc.http) : 0, gc.http, http_port, preview_domain);
    }
    /* Host uids: an explicit --uid-base, split among the shards; else each
     * shard locks a free range of its own (uid_range_lock), so deployments
     * side by side on one host never hand out the same host uids. */
    int64_t uid_base = c.uid_base;
    bool uid_given = false;
    for (int k = 2; k < argc; k++)
        if (!strncmp(argv[k], "--uid-base", 10))
            uid_given = true;
    /* One workspace pool for the node (container/ws_pool.h), made and held
     * here, each shard a directory of it (sbx_wspool_attach): a fork into
     * another shard's sandbox is then a reflink and a rename, not a copy
     * (docs/persistence.md, "The workspace pool").  Not when a shard already
     * has a pool of its own (a deployment made before): those stay, and so
     * do the shards' own rules when the node pool is not made (reflinks on
     * the host file system, --ws-pool off, no XFS here). */
    char node_arg[PATH_MAX + 32] = "";
    bool own_pools = false;
    for (int i = 0; i < nshards; i++) {
        char f[PATH_MAX + 32];
        struct stat pst;
        snprintf(f, sizeof(f), "%s/s%d/wspool.img", absdata, i);
        own_pools = own_pools || stat(f, &pst) == 0;
    }
    if (!own_pools && !(c.ws_pool && !strcmp(c.ws_pool, "off"))) {
        char pwhy[512];
        int prc = sbx_wspool_open(absdata, c.ws_pool, c.ws_pool_size, &node_pool, pwhy,
                                  sizeof(pwhy));
        if (prc) {
            sbx_log_warn("the node's workspace pool: %s; each shard decides for itself", pwhy);
        } else if (node_pool) {
            sbx_wspool_describe(node_pool, pwhy, sizeof(pwhy));
            sbx_log_info("the node's %s", pwhy);
            snprintf(node_arg, sizeof(node_arg), "--ws-pool-node=%s/workspaces", absdata);
        }
    }
    kids = sbx_xcalloc((size_t)nshards, sizeof(*kids));
    for (int i = 0; i < nshards; i++) {
        char buf[PATH_MAX + 64];
        size_t n = 0;
        char **av = NULL;
        argv_add(&av, &n, "sbxd");
        argv_add(&av, &n, "shard");
        snprintf(buf, sizeof(buf), "--name=%s-s%d", name, i);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--listen=ipc://%s/s%d.sock", absdata, i);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--data=%s/s%d", absdata, i);
        argv_add(&av, &n, buf);
        /* One image store for the node, shared by its shards (docs/images.md);
         * an --images given below replaces it. */
        snprintf(buf, sizeof(buf), "--images=%s/images", absdata);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--backups=%s/backups", absdata);
        argv_add(&av, &n, buf);
        /* Distinct host uid ranges per shard: from --uid-base when given,
         * else each shard takes a free range itself (uid_range_lock). */
        snprintf(buf, sizeof(buf), "--uid-base=%lld", (long long)(uid_base + i * c.uid_count));
        if (uid_given)
            argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--relay=unix:%s/s%d.relay", absdata, i);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--preview-domain=%s", preview_domain);
        argv_add(&av, &n, buf);
        if (node_arg[0])
            argv_add(&av, &n, node_arg);
        /* Pass on every shard option the user gave. */
        for (int k = 2; k < argc; k++) {
            const char *a = argv[k];
            if (strncmp(a, "--", 2) != 0)
                continue;
            static const char *const mine[] = {"--data",     "--listen",   "--name",
                                               "--shards",   "--help",     "--config",
                                               "--uid-base", "--http",     "--api-keys",
                                               "--preview-domain", "--console"};
            bool skip = false;
            for (size_t j = 0; j < SBX_ARRAY_LEN(mine); j++)
                if (!strncmp(a, mine[j], strlen(mine[j])))
                    skip = true;
            if (skip) {
                if (!strchr(a, '=') && k + 1 < argc && strncmp(argv[k + 1], "--", 2) != 0)
                    k++;
                continue;
            }
            argv_add(&av, &n, a);
            if (!strchr(a, '=') && k + 1 < argc && strncmp(argv[k + 1], "--", 2) != 0)
                argv_add(&av, &n, argv[++k]);
        }
        kids[i].argv = av;
        kids[i].pid = spawn_child(av);
        kids[i].started_ms = sbx_mono_ms();
    }
    sbx_log_info("ready: gateway on %s, %lld shard(s), data in %s", listen, (long long)nshards,
             absdata);
    for (;;) {
        /* Restarts are scheduled, not slept through: the supervisor keeps
         * answering SIGTERM and reaping other shards meanwhile. */
        int64_t now = sbx_mono_ms(), next = INT64_MAX;
        for (int i = 0; i < nshards; i++) {
            if (kids[i].pid == 0 && kids[i].restart_at_ms > 0 && kids[i].restart_at_ms <= now) {
                kids[i].pid = spawn_child(kids[i].argv);
                kids[i].started_ms = sbx_mono_ms();
                kids[i].restart_at_ms = 0;
            }
            if (kids[i].pid == 0 && kids[i].restart_at_ms > 0 && kids[i].restart_at_ms < next)
                next = kids[i].restart_at_ms;
        }
        int64_t wait_ms = next == INT64_MAX ? -1 : next - sbx_mono_ms();
        int sig = wait_signal_until(&set, wait_ms < 0 && next != INT64_MAX ? 0 : wait_ms);
        if (sig == 0)
            continue; /* a restart is due */
        if (sig == SIGCHLD) {
            int st;
            pid_t pid;
            while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
                for (int i = 0; i < nshards; i++) {
                    if (kids[i].pid != pid)
                        continue;
                    kids[i].pid = 0;
                    int64_t up = sbx_mono_ms() - kids[i].started_ms;
                    /* Status 2 from a shard's first start: it refused its
                     * options or its cgroup subtree (held by a live shard of
                     * another deployment); starting it again would only be
                     * refused again, so the deployment stops.  Status 2 on a
                     * restart is different: the previous incarnation's
                     * processes may still be on their way out (a SIGKILLed
                     * shard's children die with it, asynchronously) and hold
                     * its locks for a moment.  One slow shard never stops a
                     * healthy deployment: it is retried with back-off. */
                    if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && !kids[i].ever_restarted) {
                        sbx_log_error("shard %d refused to start (status 2, its reason is above); "
                                  "stopping", i);
                        rc = 2;
                        continue;
                    }
                    /* Supervise: restart a shard that died, with back-off
                     * (100 ms doubling to 5 s; reset after 10 s up). */
                    kids[i].restarts = up > 10000 ? 0 : kids[i].restarts + 1;
                    int delay = dev_restart_delay_ms(kids[i].restarts);
                    sbx_log_warn("shard %d (pid %d) exited (%s %d); restarting in %d ms", i, (int)pid,
                             WIFEXITED(st) ? "status" : "signal",
                             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), delay);
                    kids[i].restart_at_ms = sbx_mono_ms() + delay;
                    kids[i].ever_restarted = true;
                }
            }
            if (rc == 2)
                break;
            continue;
        }
        sbx_log_info("stopping (signal %d)", sig);
        break;
    }
stop:
    sbx_gateway_stop(gw);
    for (int i = 0; kids && i < nshards; i++) {
        if (kids[i].pid > 0) {
            kill(kids[i].pid, SIGTERM);
        } else if (kids[i].restart_at_ms > 0) {
            /* Down, waiting for its restart: nobody would remove what its
             * last incarnation left (cgroups, its lock file), so a sweep
             * with its own options does, under its locks. */
            size_t n = 0;
            char **av = NULL;
            for (char **a = kids[i].argv; *a; a++)
                argv_add(&av, &n, *a);
            argv_add(&av, &n, "--sweep");
            kids[i].pid = spawn_child(av);
            sbx_strv_free(av);
        }
    }
    /* Give shards time to stop their containers and commit. */
    int64_t until = sbx_mono_ms() + 15000;
    for (int i = 0; kids && i < nshards; i++) {
        while (kids[i].pid > 0) {
            int st;
            pid_t r = waitpid(kids[i].pid, &st, WNOHANG);
            if (r == kids[i].pid || (r < 0 && errno == ECHILD))
                break;
            if (sbx_mono_ms() > until) {
                kill(kids[i].pid, SIGKILL);
                waitpid(kids[i].pid, &st, 0);
                break;
            }
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
    }
out:
    /* After the shards: their containers' images held the pool's mount too. */
    sbx_wspool_close(node_pool);
    /* Released only now: every shard has stopped (or was killed) by here. */
    hostlock_release(&dlock);
    for (int i = 0; kids && i < nshards; i++)
        sbx_strv_free(kids[i].argv);
    free(kids);
    sbx_strv_free(shard_specs);
    free(rest);
    free(data);
    free(listen);
    free(name);
    free(gc.http);
    free(gc.api_keys);
    free(relay_secret_file);
    free(log_format);
    sbx_shard_conf_free(&c);
    tls_opts_free(&tls);
    sbx_nng_sec_close(&sec);
    return rc;
}

static void
usage(void)
{
    printf("usage: sbxd <command> [options]\n\n"
           "  dev       the embedded single-node default: gateway on %s + shards\n"
           "  shard     one shard node (actors, containers, LMDB metadata)\n"
           "  gateway   one gateway node (routes sandbox IDs to shards)\n\n"
           "`sbxd <command> --help` lists the options of a command.\n",
           DEFAULT_LISTEN);
}

int
main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage();
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "dev"))
        return cmd_dev(argc, argv);
    /* Not for people: a shard's backup child (container/backup.h). */
    if (!strcmp(argv[1], "backup-child"))
        sbx_backup_child_main(argc, argv);
    /* nng frees closed sockets' endpoints and pipes on its reaper thread
     * after nng_close returns; nng_fini waits for it, so a leak check at
     * exit (LeakSanitizer, valgrind) sees only real leaks. */
    if (!strcmp(argv[1], "shard")) {
        int rc = cmd_shard(argc, argv);
        nng_fini();
        return rc;
    }
    if (!strcmp(argv[1], "gateway")) {
        int rc = cmd_gateway(argc, argv);
        nng_fini();
        return rc;
    }
    fprintf(stderr, "sbxd: unknown command '%s'\n", argv[1]);
    usage();
    return 2;
}
