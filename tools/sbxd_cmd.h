/*
 * sbxd_cmd.h — what the commands of sbxd share (tools/sbxd.c: main, `sbxd
 * shard`, `sbxd gateway`; tools/sbxd_dev.c: `sbxd dev`; tools/sbxd_common.c:
 * the helpers below).  Not a library: sbxd only.
 *
 * The option tables are macros so that `sbxd dev` takes exactly the shard's
 * and the gateway's options and passes them on (runtime/config.h: struct
 * sbx_opt, SBX_OPT_*).  The helpers log through runtime/log.h and print
 * usage errors on stderr; their return values are the commands' exit
 * statuses where stated (0 ok, 1 start-up failed, 2 usage).
 */
#ifndef SBXD_CMD_H
#define SBXD_CMD_H

#include <signal.h>
#include <stdbool.h>
#include <stdint.h>

#include "../runtime/nngx.h"

#define DEFAULT_LISTEN "tcp://127.0.0.1:7700"
#define DEFAULT_HTTP "127.0.0.1:7780"

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
        {"pool-memory", SBX_OPT_SIZE, &(c)->pool_memory,                                      \
         "memory budget of the pool (default: 1/256 of the node's memory over its shards, "   \
         "at least 32M; 0: the pool stays at --pool)"},                                      \
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
        {"disk-reserve", SBX_OPT_SIZE, &(c)->disk_reserve,                                    \
         "host disk the running persistent workspaces leave free: past it their writes "      \
         "get ENOSPC, shared out among them (256M; 0: no guard)"},                            \
        {"node-shards", SBX_OPT_INT, &(c)->node_shards,                                       \
         "shards of this node sharing its disk (set by sbxd dev): each guards its share"},    \
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

/* The HTTP front's options (gateway and dev). */
#define GATEWAY_HTTP_OPTS(g)                                                                  \
    {"http", SBX_OPT_STR, &(g)->http, "HTTP front address host:port (\"\" for none)"},        \
        {"api-keys", SBX_OPT_STR, &(g)->api_keys,                                             \
         "file of HTTP API keys, one per line (required unless --http is loopback)"},        \
        {"http-max-body", SBX_OPT_SIZE, &(g)->http_max_body, "largest HTTP request body"},   \
        {"http-per-client", SBX_OPT_INT, &(g)->http_per_client,                               \
         "HTTP connections per client address (default 1024; raise it behind a proxy)"},      \
        {"http-ws-ping", SBX_OPT_MS, &(g)->http_ws_ping,                                      \
         "ping a terminal WebSocket silent this long; close it when silent 3 times as long (30s)"}, \
        {"console", SBX_OPT_BOOL, &(g)->console,                                              \
         "serve the web console at http://<--http>/console/ (off by default; docs/console.md)"}


/* sbxd_cmd_dev — `sbxd dev` (tools/sbxd_dev.c): argv as main's, argv[1]
 * "dev"; the exit status (header of tools/sbxd.c). */
int sbxd_cmd_dev(int argc, char **argv);

/* sbxd_raise_nofile — the soft RLIMIT_NOFILE raised to the hard limit; a
 * warning when that is below what a shard of 10,000 sandboxes needs. */
void sbxd_raise_nofile(void);

/* sbxd_load_secret — --relay-secret-file: *secret (heap, replaced) := the
 * file's first 4 KiB, trailing blanks cut, at least 16 characters; file
 * NULL or "": nothing.  0, or 1 after printing why (prefixed with who). */
int sbxd_load_secret(const char *file, char **secret, const char *who);

/* sbxd_tls_opts_free — free t's strings (t itself is the caller's). */
void sbxd_tls_opts_free(struct tls_opts *t);

/* sbxd_tls_open — load t into *sec (sbx_nng_sec_close it) and check that
 * listen may be served with it; 0, or 2 with the reason logged (*sec then
 * holds nothing).  Its first nng call starts nng's threads: the caller
 * blocks the signals it waits for before (a SIGTERM that such a thread
 * takes kills the process; a SIGCHLD it takes is lost). */
int sbxd_tls_open(const struct tls_opts *t, sbx_nng_sec *sec, const char *listen);

/* sbxd_set_log_format — apply --log-format ("text", "json" or NULL); 0, or
 * 2 with the reason printed (prefixed with cmd). */
int sbxd_set_log_format(const char *log_format, const char *cmd);

/* sbxd_wait_signal — the next of the blocked signals in set (sigwaitinfo,
 * EINTR retried), or -errno. */
int sbxd_wait_signal(const sigset_t *set);

/* sbxd_wait_signal_until — the same for at most timeout_ms (< 0: no bound):
 * the signal, 0 when the time ran out, or -errno. */
int sbxd_wait_signal_until(const sigset_t *set, int64_t timeout_ms);

#endif
