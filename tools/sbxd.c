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
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "../actors/shard.h"
#include "../container/backup.h"
#include "../container/cgroup.h"
#include "../gateway/gateway.h"
#include "../runtime/config.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/util.h"
#include "hostlock.h"
#include "sbxd_cmd.h"


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
         "is down when the deployment stops, or that it killed for not stopping within "
         "--stop-timeout"},
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
        sbxd_tls_opts_free(&tls);
        return 2;
    }
    free(rest);
    int frc = sbxd_set_log_format(log_format, "sbxd shard");
    free(log_format);
    if (frc) {
        free(relay_secret_file);
        sbx_shard_conf_free(&c);
        sbxd_tls_opts_free(&tls);
        return frc;
    }
    int lrc = sbxd_load_secret(relay_secret_file, &c.relay_secret, "sbxd shard");
    free(relay_secret_file);
    if (lrc) {
        sbx_shard_conf_free(&c);
        sbxd_tls_opts_free(&tls);
        return 2;
    }
    /* A relay on TCP without a secret would let anyone who can reach the
     * port into every exposed port of every sandbox, token or not. */
    if (!help && c.relay && !strncmp(c.relay, "tcp:", 4) && (!c.relay_secret || !*c.relay_secret)) {
        fprintf(stderr, "sbxd shard: --relay %s needs --relay-secret-file (or --relay-secret): "
                        "a TCP relay without a secret serves anyone who reaches it\n",
                c.relay);
        sbx_shard_conf_free(&c);
        sbxd_tls_opts_free(&tls);
        return 2;
    }
    if (help) {
        sbx_config_usage(opts, "sbxd shard", "Run one shard node.");
        sbx_shard_conf_free(&c);
        sbxd_tls_opts_free(&tls);
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
    sbxd_raise_nofile();
    check_pty_capacity();
    /* A listen the transport rules refuse stops the shard here, status 2,
     * before it takes any lock (a sweep serves nothing).  The signals
     * sbx_shard_run waits for are blocked first (sbxd_tls_open). */
    sigset_t tset;
    sigemptyset(&tset);
    sigaddset(&tset, SIGTERM);
    sigaddset(&tset, SIGINT);
    sigprocmask(SIG_BLOCK, &tset, NULL);
    etcd_tls_defaults(c.etcd, &c.etcd_ca, &c.etcd_cert, &c.etcd_key, &tls);
    int trc = sweep ? 0 : sbxd_tls_open(&tls, &sec, c.listen);
    sbxd_tls_opts_free(&tls);
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
    if (sbxd_load_secret(relay_secret_file, &c.relay_secret, "sbxd gateway")) {
        rc = 2;
        goto out;
    }
    if (help) {
        sbx_config_usage(opts, "sbxd gateway", "Run one gateway node.");
        goto out;
    }
    sbx_log_init("sbxd gateway", -1);
    sbxd_raise_nofile();
    if ((rc = sbxd_set_log_format(log_format, "sbxd gateway")) != 0)
        goto out;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    etcd_tls_defaults(c.etcd, &c.etcd_ca, &c.etcd_cert, &c.etcd_key, &tls);
    if ((rc = sbxd_tls_open(&tls, &sec, c.listen)) != 0)
        goto out;
    c.sec = &sec;
    sbx_gateway *gw;
    if (sbx_gateway_start(&gw, &c) != 0) {
        rc = 1;
        goto out;
    }
    sbxd_wait_signal(&set);
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
    sbxd_tls_opts_free(&tls);
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
        return sbxd_cmd_dev(argc, argv);
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
