/*
 * shard.h — a shard node: hosts one actor per sandbox ID it owns.
 *
 * A shard serves the nng protocol of docs/protocol.md on a REP socket with
 * many contexts (nng_ctx(5)), so requests are received concurrently; all of
 * them are then handled on one event-loop thread that owns every actor, so
 * actor state needs no locks.  Blocking work runs elsewhere: container
 * start/stop on worker threads, LMDB commits on the store's writer thread.
 *
 * Actors (actors/actor.c) are the Durable Object of a sandbox:
 *  - input gate: an actor takes its operations from its mailbox one at a
 *    time in arrival order; a lifecycle step (container start, destroy)
 *    closes the gate until it is done, so later operations wait and then see
 *    its effect;
 *  - operations for the container are delivered to the agent in that same
 *    order, then the gate opens again: a long command does not hold up the
 *    next operation (the agent orders commands within a session) and never
 *    holds up other sandboxes;
 *  - output gate: a reply is sent only after every metadata write the actor
 *    made before it has been committed to LMDB (group commit), as a Durable
 *    Object holds outgoing messages until its storage writes are durable.
 */
#ifndef SBX_SHARD_H
#define SBX_SHARD_H

#include <stdbool.h>
#include <stdint.h>

#include "../container/cgroup.h"

struct sbx_nng_sec; /* runtime/nngx.h */

/* sbx_shard_conf.pool_memory's default: sized from the node's memory when
 * the shard starts (actors/shard.c shard_pool_memory_auto). */
#define SBX_SHARD_POOL_MEMORY_AUTO UINT64_MAX

struct sbx_shard_conf {
    char *name;           /* shard name: unique in the deployment, [a-z0-9-] */
    char *listen;         /* nng URL, e.g. ipc:///var/lib/sbx/s0.sock or tcp://0.0.0.0:7701 */
    char *data;           /* directory: LMDB environment and shard files */
    uint64_t map_size;    /* bytes: initial LMDB map (sparse; runtime/store.h) */
    uint64_t map_max;     /* bytes: the map grows up to this, then writes fail STORAGE_FULL */
    char *agent;          /* path of the sbx-agent binary */
    char *interp;         /* directory of the interpreter drivers (code contexts) */
    char *cgroup;         /* auto | v1 | v2 | none */
    char *cgroup_base;    /* subtree under the cgroup roots, default sbx/<name> */
    bool allow_unlimited; /* cgroup v2 without the memory/pids/cpu controllers: run
                           * sandboxes without limits instead of refusing to start */
    int64_t uid_base;     /* first host uid given to sandboxes */
    int64_t uid_count;    /* host uids available (= max live containers) */
    int64_t contexts;     /* concurrent requests received (nng contexts) */
    int64_t workers;      /* threads that start and stop containers; 0 (the default) =
                           * SHARD_WORKERS_PER_CPU per online CPU, at least
                           * SHARD_WORKERS_MIN (shard.c) */
    int64_t pool;         /* ready containers kept for new sandboxes at least (0 = no pool);
                           * more while demand is high (shard_int.h, struct shard_pool) */
    uint64_t pool_memory; /* bytes the pool's ready containers may hold beyond `pool`
                           * (default SBX_SHARD_POOL_MEMORY_AUTO: 1/256 of the node's
                           * memory over node_shards, at least 32 MiB; 0 = the pool
                           * stays at `pool`) */
    int64_t pool_window;  /* ms of demand the pool's target follows: 1 s to
                           * SHARD_POOL_WINDOW s, whole seconds (default 60 s) */
    uint64_t memory;      /* default memory limit per sandbox, bytes */
    int64_t pids;         /* default pids limit per sandbox */
    int64_t cpu;          /* default CPU limit per sandbox, millicpus */
    int64_t cpu_share;    /* CPU weight of all the host's sandboxes together, in nice-0
                           * processes (container/cgroup.h sbx_cgroups_set_share);
                           * -1 (the default) = SHARD_CPU_SHARE_PER_CPU per online
                           * CPU, 0 = the kernel's default (one process's worth) */
    uint64_t disk;        /* bytes of /workspace + /tmp + /home */
    int64_t inodes;       /* inodes of the same */
    uint64_t disk_max;    /* bytes: the largest `disk` a create may ask for (persistent workspaces) */
    uint64_t output_cap;  /* bytes of stdout (and of stderr) kept per exec */
    int64_t setup_timeout;/* ms a container may take to start */
    int64_t sleep_after;  /* ms of inactivity before a sandbox's container is stopped */
    char *relay;          /* preview relay address: unix:/path or tcp:host:port (NULL: none) */
    char *relay_secret;   /* required of relay clients (tcp relays in a cluster), or NULL */
    char *preview_domain; /* default host of preview URLs: {port}-{id}-{token}.<this> */
    char *preview_scheme; /* http or https (where the deployment terminates TLS) */
    char **no_preview_host; /* host suffixes that cannot carry wildcard preview URLs: an
                             * exposePort hostname equal to one or ending in ".<one>" is
                             * CUSTOM_DOMAIN_REQUIRED (default workers.dev, as the SDK) */
    char *etcd;           /* etcd endpoints (http://h:p[,…]): cluster mode; NULL = standalone */
    char *etcd_ca, *etcd_cert, *etcd_key; /* PEM paths for https:// etcd endpoints (or
                           * NULL): sbx_etcd_set_tls; sbxd defaults them to --tls-* */
    char *cluster;        /* cluster name: etcd keys live under /sbx/<cluster>/ */
    char *advertise;      /* nng URL other nodes reach this shard at (default: listen) */
    int64_t lease_ttl;    /* ms: membership lease; a shard unable to renew it stops serving */
    int64_t snapshot_interval; /* ms between snapshots of the persistent workspaces this shard
                                * owns, pushed to each partition's successor (cluster only;
                                * 0: none; default 5 min; docs/persistence.md) */
    int64_t idem_ttl;     /* ms a request id's recorded reply is kept (docs/protocol.md §2) */
    char **etc;           /* /etc entries bound read-only into sandboxes */
    char **env;           /* base environment of sandboxes, "K=V" */
    char *images;         /* the node's image store (docs/images.md); NULL: <data>/images */
    char *backups;        /* the node's backup store (docs/persistence.md); NULL: <data>/backups */
    uint64_t backup_max;  /* bytes: the largest compressed archive of a backup (BACKUP_TOO_LARGE) */
    char *backup_store;   /* s3://bucket[/prefix]: the backups in S3 (docs/persistence.md, "The
                           * S3 store"); NULL: the directory `backups` */
    char *s3_endpoint;    /* http(s)://host[:port] of the S3 service; NULL: AWS's of s3_region */
    char *s3_region;      /* SigV4's region (NULL: us-east-1) */
    char *s3_credentials; /* file of AWS_ACCESS_KEY_ID=…/AWS_SECRET_ACCESS_KEY=… lines (mode
                           * 600); NULL: those variables of sbxd's environment */
    int64_t s3_timeout;   /* ms: each S3 call's deadline, retries included (30000) */
        int64_t image_pool;   /* ready containers kept at least per image in demand (0: no
                           * image pools; they adapt above it: image_pool.c) */
    char *network_default;/* none | egress: the mode of sandboxes that do not choose one */
    char *network_range;  /* IPv4 range of sandbox addresses, /8../22 (docs/network.md) */
    char *dns_upstream;   /* A.B.C.D[:PORT][,…] (up to 4, failover in order) the sandboxes'
                           * resolver forwards to; NULL: the host's /etc/resolv.conf
                           * (docs/network.md §Host names) */
    char *egress_inject;  /* file of header injection rules for plain-HTTP egress (mode 600;
                           * docs/network.md §Credentials stay outside); NULL: none */
    char **egress_deny;   /* --egress-deny: hosts (IPv4 addresses or names) no sandbox may reach
                           * whatever its policy, besides the deployment's own (etcd, its
                           * listen/advertise/relay, the cluster's members): sbx_net_deny_add */
    char **insecure_registry; /* registry hosts ("host[:port]") pulled from over plain HTTP
                               * or an unverified certificate, besides loopback ones
                               * (docs/images.md, "Pull") */
    char *workspace_default; /* "ephemeral" (default) or "persistent": a create that names no
                              * `workspace` gets this (docs/persistence.md) */
    char *ws_pool;        /* auto (NULL: the same) | on | off: persistent workspaces in an XFS
                           * pool <data>/wspool.img when <data>/workspaces has no reflinks
                           * (container/ws_pool.h; docs/persistence.md, "The workspace pool") */
    uint64_t ws_pool_size; /* bytes of a new pool file (sparse); 0: the free space of the
                            * data directory's file system when the pool is made */
    char *ws_pool_node;   /* the root of the node's pool that `sbxd dev` made for all its
                           * shards (<dev data>/workspaces), or NULL: this shard's part is
                           * <it>/<data's last component> (sbx_wspool_attach; s<i>),
                           * unless the shard has a pool of its own (<data>/wspool.img)
                           * or --ws-pool off */
    uint64_t disk_reserve; /* bytes the disk guard keeps free on the host file system under
                            * the workspaces and in their pool: running persistent
                            * workspaces share out the rest (container/ws_guard.h;
                            * docs/persistence.md, "When the host disk runs short");
                            * 0: no guard */
    int64_t node_shards;  /* shards of this node drawing on that disk (`sbxd dev` sets its
                           * count): each shares out 1/node_shards of the room; default 1 */
    const struct sbx_nng_sec *sec; /* borrowed (sbxd's, outlives the shard): the TLS identity
                                    * of its listen and its dials to other shards, and whether
                                    * plaintext may listen off loopback; NULL: plaintext on
                                    * loopback/ipc only (runtime/nngx.h) */
};

/* sbx_shard_conf_defaults — fill with defaults (heap strings; see sbxd). */
void sbx_shard_conf_defaults(struct sbx_shard_conf *c);
void sbx_shard_conf_free(struct sbx_shard_conf *c);

/*
 * sbx_shard_run — serve until SIGTERM or SIGINT, then stop every container
 * and return 0; or return a negative code if start-up failed (reason
 * logged).  Blocks those signals in the calling thread first: call it from
 * main() before any other thread exists.
 */
int sbx_shard_run(const struct sbx_shard_conf *c);

#endif
