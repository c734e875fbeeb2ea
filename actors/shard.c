/*
 * shard.c — the shard process: its configuration, its life (sbx_shard_run:
 * open the store, cgroups and spawner, start the workers, serve, stop) and
 * the shard-level operations (list, shard.status).  Its parts:
 * shard_intake.c (requests in), shard_reply.c (replies, deadlines),
 * gate.c (the output gate), idem.c (idempotency), shard_work.c (workers,
 * warm pool), relay.c (preview relay); actor behaviour is in actor.c.
 * sbx_shard_run owns the struct shard; everything but the nng callbacks,
 * the worker and relay threads runs on its loop thread.
 */
#include "shard.h"

#include <curl/curl.h>
#include <errno.h>
#include <nng/nng.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "../container/backup.h"
#include "../container/backup_s3.h"
#include "cluster.h"
#include "shard_int.h"

static const char *const default_etc[] = {
    "alternatives", "ssl", "ca-certificates", "ca-certificates.conf", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "localtime", "timezone", "mime.types", "protocols", "services", "magic",
    "magic.mime", "python3", "python3.11", "matplotlibrc", "fonts", "bash.bashrc", "profile",
    "inputrc", "terminfo", "gitconfig", "os-release", "debian_version", "perl", "xdg", NULL};

static const char *const default_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "USER=root",
    "LANG=C.UTF-8",
    "LC_ALL=C.UTF-8",
    "TERM=xterm-256color",
    "SHELL=/bin/bash",
    "PYTHONUNBUFFERED=1",
    "MPLBACKEND=Agg",
    NULL};

static char **
strv_dup(const char *const *v)
{
    size_t n = 0;
    while (v[n])
        n++;
    char **r = sbx_xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        r[i] = sbx_xstrdup(v[i]);
    return r;
}

/* The sandboxes' CPU weight, in nice-0 processes per online CPU, when
 * conf.cpu_share is -1.  Measured (docs/benchmarks.md, "the sandboxes' CPU
 * weight"): at 1 process in all (the kernel's default) the 50-way warm load
 * had p99 100–140 ms; 4 per CPU roughly halved the tails, 8 per CPU brought
 * p99 to 22–36 ms, while 4 sandboxes spinning on the CPU still left a fifth
 * one's exec p99 at 4–26 ms (a weight of 256 made it 1.6 s). */
#define SHARD_CPU_SHARE_PER_CPU 8

/* Worker threads per online CPU when conf.workers is 0 (at least
 * SHARD_WORKERS_MIN, at most SHARD_WORKERS_MAX).  Measured on 2 CPUs
 * (docs/benchmarks.md, "Bursts" and "Density"): 4 per CPU did not change a
 * 50-create burst's p95 (a burst is CPU-bound: ~8 ms of CPU per sandbox),
 * and with 2,000 sandboxes present it cut the creation rate to 37-47/s
 * against 132/s with 2 workers per shard (more concurrent clones contend
 * for the host's namespace and cgroup locks).  The adaptive pool is what
 * makes bursts fast; a worker per CPU keeps the CPUs busy. */
#define SHARD_WORKERS_PER_CPU 1
#define SHARD_WORKERS_MIN 2
#define SHARD_WORKERS_MAX 64

/* The pool's memory budget when none is given: 1/256 of the node's memory
 * shared by its shards, at least 32 MiB — 48 MiB for each of 2 shards on
 * 24 GiB, 30-37 ready containers of 1.3-1.5 MiB, enough for a shard's part
 * of a burst of 50 (25 +/- 3.5) with the pool's quarter of headroom
 * (docs/benchmarks.md, "Bursts").  Held only after demand like that: the
 * pool's target follows the busiest second of the last --pool-window.  At
 * 1/128 bursts did no better and the refill after one (120 containers)
 * took CPU from the warm sandboxes' execs (the 50-way warm load's p99 went
 * from 25-31 ms to 27-41 ms). */
static uint64_t
shard_pool_memory_auto(int64_t node_shards)
{
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    uint64_t node = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    uint64_t share = node / 256 / (uint64_t)(node_shards > 0 ? node_shards : 1);
    return SBX_MAX(share, 32ull << 20);
}

void
sbx_shard_conf_defaults(struct sbx_shard_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->name = sbx_xstrdup("s0");
    c->listen = sbx_xstrdup("ipc:///var/lib/sbx/s0.sock");
    c->data = sbx_xstrdup("/var/lib/sbx/s0");
    c->agent = NULL; /* sbxd fills in the sbx-agent next to itself */
    c->cgroup = sbx_xstrdup("auto");
    c->uid_base = 1000000000;
    c->uid_count = 65536;
    c->contexts = 1024;
    c->workers = 0; /* SHARD_WORKERS_PER_CPU per online CPU */
    c->pool = 2;
    c->pool_memory = SBX_SHARD_POOL_MEMORY_AUTO;
    c->pool_window = SHARD_POOL_WINDOW * 1000;
    c->memory = 512ull << 20;
    c->pids = 512;
    c->cpu = 1000;
    c->cpu_share = -1;
    c->disk = 1ull << 30;
    c->disk_max = 16ull << 30;
    c->backup_max = SBX_BACKUP_MAX_BYTES;
    c->s3_timeout = 30000;
    c->inodes = 262144;
    c->disk_reserve = 256ull << 20;
    c->node_shards = 1;
    c->output_cap = 32ull << 20;
    c->setup_timeout = 10000;
    c->map_size = SBX_STORE_MAP_DEFAULT;
    c->map_max = SBX_STORE_MAP_MAX_DEFAULT;
    c->sleep_after = 10 * 60 * 1000; /* the SDK's default sleepAfter: 10m */
    c->idem_ttl = 10 * 60 * 1000;
    c->preview_domain = sbx_xstrdup("localhost:7780");
    c->cluster = sbx_xstrdup("default");
    c->network_default = sbx_xstrdup("none");
    c->network_range = sbx_xstrdup("10.88.0.0/16");
    c->lease_ttl = 10000;
    c->snapshot_interval = 300000;
    c->preview_scheme = sbx_xstrdup("http");
    c->etc = strv_dup(default_etc);
    c->env = strv_dup(default_env);
    /* The SDK's rule: a *.workers.dev host has no wildcard certificate
     * for {port}-{id}-{token}.<host> (cloudflare-sandbox-sdk.md §1.3). */
    static const char *const default_no_preview_host[] = {"workers.dev", NULL};
    c->no_preview_host = strv_dup(default_no_preview_host);
}

static void
strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

void
sbx_shard_conf_free(struct sbx_shard_conf *c)
{
    free(c->name);
    free(c->listen);
    free(c->data);
    free(c->agent);
    free(c->interp);
    free(c->cgroup);
    free(c->cgroup_base);
    free(c->relay);
    free(c->relay_secret);
    free(c->preview_domain);
    free(c->preview_scheme);
    free(c->etcd);
    free(c->etcd_ca);
    free(c->etcd_cert);
    free(c->etcd_key);
    free(c->cluster);
    free(c->network_default);
    free(c->network_range);
    free(c->dns_upstream);
    free(c->egress_inject);
    strv_free(c->insecure_registry);
    strv_free(c->egress_deny);
    free(c->advertise);
    free(c->images);
    free(c->backups);
    free(c->backup_store);
    free(c->s3_endpoint);
    free(c->s3_region);
    free(c->s3_credentials);
    free(c->workspace_default);
    free(c->ws_pool);
    free(c->ws_pool_node);
    strv_free(c->etc);
    strv_free(c->env);
    strv_free(c->no_preview_host);
    memset(c, 0, sizeof(*c));
}

/* ------------------------------------------------------------------------------ */
/* Shard-level operations. */

struct list_ctx {
    struct shard *sh;
    sbx_enc *e;
    size_t n;
    bool ids_only; /* {id, memory, cpu, disk} per sandbox (the tenant registry), no actor */
};

static int
list_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct list_ctx *lc = arg;
    char id[64];
    if (kn == 0 || kn >= sizeof(id))
        return 0;
    memcpy(id, k, kn);
    id[kn] = '\0';
    if (!cluster_listable(lc->sh, sbx_place_partition(id, kn)))
        return 0; /* a record this shard holds but does not own */
    if (lc->ids_only) {
        /* The tenant registry's refresh: the ID and the limits the tenant's
         * resource quotas count (docs/security.md §6): memory, cpu, disk
         * (0: unlimited; disk is the writable file system's size). */
        struct sbx_record r;
        bool have = sbx_record_decode(v, vn, &r) == 0;
        sbx_enc_map(lc->e);
        sbx_enc_kstr(lc->e, "id", id);
        if (have) {
            sbx_enc_kint(lc->e, "memory", (int64_t)r.limits.memory);
            sbx_enc_kint(lc->e, "cpu", (int64_t)r.limits.cpu_milli);
            sbx_enc_kint(lc->e, "disk", (int64_t)(r.disk ? r.disk : lc->sh->conf.disk));
            sbx_record_free(&r);
        }
        sbx_enc_end(lc->e);
        lc->n++;
        return 0;
    }
    struct actor *a = actor_get(lc->sh, id, false);
    if (a && a->exists) {
        actor_encode_status(a, lc->e);
        lc->n++;
        return 0;
    }
    struct sbx_record r;
    if (sbx_record_decode(v, vn, &r) != 0)
        return 0;
    sbx_enc_map(lc->e);
    sbx_enc_kstr(lc->e, "id", r.id);
    sbx_enc_kstr(lc->e, "state", "stopped");
    sbx_enc_kint(lc->e, "createdAt", r.created_ms);
    sbx_enc_kint(lc->e, "generation", (int64_t)r.generation);
    sbx_enc_kstr(lc->e, "shard", lc->sh->conf.name);
    sbx_enc_end(lc->e);
    sbx_record_free(&r);
    lc->n++;
    return 0;
}

void
shard_op_list(struct sop *op)
{
    struct shard *sh = op->sh;
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_karray(&e, "sandboxes");
    struct list_ctx lc = {sh, &e, 0, false};
    sbx_wire_get_bool(op->req.args, "idsOnly", &lc.ids_only);
    int rc = sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, list_one, &lc);
    sbx_enc_end(&e);
    sbx_enc_kint(&e, "count", (int64_t)lc.n);
    if (lc.ids_only) {
        /* What a new sandbox gets without limits (the tenant quotas' estimate). */
        sbx_enc_kmap(&e, "defaults");
        sbx_enc_kint(&e, "memory", (int64_t)sh->limits.memory);
        sbx_enc_kint(&e, "cpu", (int64_t)sh->limits.cpu_milli);
        sbx_enc_kint(&e, "disk", (int64_t)sh->conf.disk);
        sbx_enc_end(&e);
    }
    if (rc) {
        sbx_enc_free(&e);
        shard_reply_err(op, SBX_E_STORAGE, "cannot list sandboxes: %s", sbx_err_message(rc));
        return;
    }
    shard_reply_end(op, &e, 0);
}

void
shard_op_status(struct sop *op)
{
    struct shard *sh = op->sh;
    sbx_enc e;
    uint64_t batches, writes, failed;
    sbx_store_stat(sh->store, &batches, &writes, &failed);
    size_t running = 0;
    for (size_t b = 0; b < sh->actors.nbuckets; b++)
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext)
            if (a->cs == C_RUNNING)
                running++;
    shard_reply_begin(op, &e);
    sbx_enc_kmap(&e, "shard");
    sbx_enc_kstr(&e, "name", sh->conf.name);
    sbx_enc_kstr(&e, "listen", sh->conf.listen);
    sbx_enc_kstr(&e, "health", "ok");
    sbx_enc_kint(&e, "pid", getpid());
    sbx_enc_kint(&e, "uptimeMs", sbx_wall_ms() - sh->started_ms);
    sbx_enc_kint(&e, "actors", (int64_t)sh->actors.n);
    sbx_enc_kint(&e, "running", (int64_t)running);
    sbx_enc_kint(&e, "pool", sh->pool.n);
    int img_target = 0;
    sbx_enc_kint(&e, "imagePool", shard_img_pool_count(sh, &img_target));
    sbx_enc_kint(&e, "imagePoolTarget", img_target);
    sbx_enc_kint(&e, "requests", (int64_t)sh->n_requests);
    sbx_enc_kint(&e, "containersStarted", (int64_t)sh->n_started);
    sbx_enc_kint(&e, "containerStartFailures", (int64_t)sh->n_start_failed);
    sbx_enc_kint(&e, "containersDied", (int64_t)sh->n_died);
    sbx_enc_kint(&e, "poolTarget", sh->pool.target);
    sbx_enc_kint(&e, "poolCap", sh->pool.cap);
    sbx_enc_kint(&e, "poolContainerBytes", (int64_t)sh->pool.mem_est);
    sbx_enc_kint(&e, "poolHits", (int64_t)sh->n_pool_hits);
    sbx_enc_kint(&e, "poolMisses", (int64_t)sh->n_pool_misses);
    sbx_enc_kint(&e, "meanStartUs",
                 sh->n_started ? (int64_t)(sh->start_us_total / (int64_t)sh->n_started) : 0);
    sbx_enc_kstr(&e, "cgroups", sbx_cgroups_describe(sh->cgroups));
    sbx_enc_kint(&e, "storeBatches", (int64_t)batches);
    sbx_enc_kint(&e, "storeWrites", (int64_t)writes);
    sbx_enc_kint(&e, "storeFailures", (int64_t)failed);
    sbx_enc_kint(&e, "storeMapBytes", (int64_t)sbx_store_mapsize(sh->store));
    sbx_enc_kmap(&e, "diskGuard");
    sbx_enc_kint(&e, "reserveBytes", (int64_t)sh->conf.disk_reserve);
    sbx_enc_kint(&e, "roomBytes", (int64_t)atomic_load(&sh->dguard.room));
    sbx_enc_kint(&e, "limited", (int64_t)atomic_load(&sh->dguard.limited));
    sbx_enc_kint(&e, "passes", (int64_t)atomic_load(&sh->dguard.passes));
    sbx_enc_kint(&e, "lastPassUs", (int64_t)atomic_load(&sh->dguard.pass_us));
    sbx_enc_kint(&e, "lastPassWorkspaces", (int64_t)atomic_load(&sh->dguard.measured));
    sbx_enc_end(&e);
    sbx_enc_str(&e, "cluster");
    cluster_encode_status(sh, &e);
    sbx_enc_end(&e);
    shard_reply_end(op, &e, 0);
}

/* ------------------------------------------------------------------------------ */

static void
on_signal(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct shard *sh = arg;
    struct signalfd_siginfo si;
    (void)ev;
    while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
            sbx_log_info("shard %s: stopping (signal %u)", sh->conf.name, si.ssi_signo);
            sh->stopping = true;
            sbx_loop_stop(l);
        }
    }
}

/* Fix records left "running" by a shard that did not stop cleanly. */
struct fix_ctx {
    struct shard *sh;
    size_t n;
};

static int
fix_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct fix_ctx *fc = arg;
    struct sbx_record r;
    (void)k;
    (void)kn;
    if (sbx_record_decode(v, vn, &r) != 0)
        return 0;
    if (!strcmp(r.state, "running")) {
        snprintf(r.state, sizeof(r.state), "stopped");
        shard_store_record(fc->sh, &r);
        fc->n++;
    }
    sbx_record_free(&r);
    return 0;
}

/* sbx_ws_sweep's question: does the sandbox have a record here? */
static bool
ws_exists(const char *id, void *arg)
{
    struct shard *sh = arg;
    char *v = NULL;
    size_t vn = 0;
    int rc = sbx_store_get(sh->store, SBX_DB_SANDBOXES, id, strlen(id), &v, &vn);
    free(v);
    return rc != -ENOENT; /* a read error keeps the workspace */
}

static void
stop_cb(sbx_loop *l, void *arg)
{
    (void)arg;
    sbx_loop_stop(l);
}

static void
drain_to_idle(struct shard *sh)
{
    /* Run the loop until every container is stopped. */
    while (sh->work.busy > 0 || sh->pool.inflight > 0) {
        sbx_loop_timer(sh->loop, 20, stop_cb, NULL);
        sbx_loop_run(sh->loop);
    }
}

static void
sweep_cb(sbx_loop *l, void *arg)
{
    struct shard *sh = arg;
    if (sh->stopping)
        return;
    actor_sleep_sweep(sh);
    idem_expire(sh); /* also when no new request comes to push entries out */
    shard_pool_adapt(sh);
    shard_img_pools_adapt(sh);
    shard_disk_guard(sh);
    shard_fork_sweep_soon(sh);
    sbx_loop_timer(l, 1000, sweep_cb, sh);
}

int
sbx_shard_run(const struct sbx_shard_conf *conf)
{
    struct shard *sh = sbx_xcalloc(1, sizeof(*sh));
    char why[512] = "";
    int rc = 0, rv;
    sigset_t set;
    sbx_watch *sigw = NULL;
    int64_t t_stop = 0; /* when the stop of the containers began (sbx_mono_ms) */

    sh->conf = *conf;
    sh->started_ms = sbx_wall_ms();
    sh->limits.memory = conf->memory;
    sh->limits.pids = (uint32_t)conf->pids;
    sh->limits.cpu_milli = (uint32_t)conf->cpu;
    sh->actors.nbuckets = 4096;
    sh->actors.buckets = sbx_xcalloc(sh->actors.nbuckets, sizeof(*sh->actors.buckets));
    sh->idem.nbuckets = 4096;
    sh->idem.buckets = sbx_xcalloc(sh->idem.nbuckets, sizeof(*sh->idem.buckets));
    pthread_mutex_init(&sh->work.mu, NULL);
    pthread_cond_init(&sh->work.cv, NULL);
    pthread_mutex_init(&sh->relay.mu, NULL);
    pthread_cond_init(&sh->relay.cv, NULL);
    sh->relay.fd = sh->relay.stopfd = -1;
    sh->sigfd = -1;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if (conf->workspace_default && strcmp(conf->workspace_default, "ephemeral") &&
        strcmp(conf->workspace_default, "persistent")) {
        sbx_log_error("shard %s: --workspace-default must be ephemeral or persistent, not '%s'",
                      conf->name, conf->workspace_default);
        rc = -EINVAL;
        goto out;
    }
    if (conf->pool_window < 1000 || conf->pool_window > SHARD_POOL_WINDOW * 1000) {
        sbx_log_error("shard %s: --pool-window must be 1s..%ds", conf->name, SHARD_POOL_WINDOW);
        rc = SBX_E_VALIDATION;
        goto out;
    }
    if (conf->node_shards < 1 || conf->node_shards > 1024) {
        sbx_log_error("shard %s: --node-shards must be 1..1024", conf->name);
        rc = SBX_E_VALIDATION;
        goto out;
    }
    if (sh->conf.pool_memory == SBX_SHARD_POOL_MEMORY_AUTO)
        sh->conf.pool_memory = shard_pool_memory_auto(conf->node_shards);
    /* The S3 backup store's settings, checked before anything is set up
     * (container/backup_s3.h). */
    if (conf->backup_store && *conf->backup_store) {
        sbx_err_t berr = NULL;
        struct sbx_s3_conf s3c = {.url = conf->backup_store, .endpoint = conf->s3_endpoint,
                                  .region = conf->s3_region, .cred_file = conf->s3_credentials,
                                  .timeout_ms = conf->s3_timeout};
        if (conf->backup_max > (uint64_t)SBX_S3_MAX_PUT)
            rc = sbx_err_make(&berr, SBX_E_VALIDATION,
                              "--backup-max is at most 5G with an S3 backup store (one PUT)");
        else if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK)
            rc = sbx_err_make(&berr, SBX_E_INTERNAL, "curl_global_init");
        else
            rc = sbx_s3_new(&s3c, &sh->s3, &berr);
        if (rc) {
            sbx_log_error("shard %s: %s", conf->name, sbx_err_msg(berr));
            sbx_err_release(&berr);
            goto out;
        }
        sbx_log_info("shard %s: backups in %s", conf->name, sbx_s3_describe(sh->s3));
    }
    if ((rc = sbx_loop_new(&sh->loop)) != 0) {
        sbx_log_error("shard: event loop: %s", strerror(-rc));
        goto out;
    }
    if ((rc = sbx_store_open(&sh->store, conf->data, conf->map_size, conf->map_max,
                             shard_commit_cb, sh)) != 0) {
        sbx_log_error("shard %s: cannot open the store in %s: %s", conf->name, conf->data,
                  sbx_err_message(rc));
        goto out;
    }
    shard_audit_open(sh);
    char base[256];
    snprintf(base, sizeof(base), "%s", conf->cgroup_base ? conf->cgroup_base : "");
    if (!base[0])
        snprintf(base, sizeof(base), "sbx/%s", conf->name);
    if ((rc = sbx_cgroups_open(&sh->cgroups, conf->cgroup, base, why, sizeof(why))) != 0) {
        sbx_log_error("shard %s: cgroups: %s (%s)", conf->name, why, strerror(-rc));
        goto out;
    }
    {
        /* The sandboxes' weight against the control plane (cgroup.h). */
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        int64_t share = conf->cpu_share >= 0 ? conf->cpu_share
                                             : SHARD_CPU_SHARE_PER_CPU * (ncpu > 0 ? ncpu : 1);
        int src = sbx_cgroups_set_share(sh->cgroups, (unsigned)(share > 4096 ? 4096 : share));
        if (src)
            sbx_log_warn("shard %s: cannot set the sandboxes' CPU weight to %lld processes: %s",
                         conf->name, (long long)share, strerror(-src));
    }
    /* cgroup v2 without the controllers would run every sandbox without a
     * memory, pids or CPU limit (issue 16 item 8): only when asked. */
    if (sbx_cgroups_mode(sh->cgroups) == SBX_CG_V2 && !sbx_cgroups_limited(sh->cgroups) &&
        !conf->allow_unlimited) {
        sbx_log_error("shard %s: cgroups: %s: the memory, pids and cpu controllers are not "
                      "available to this subtree, so sandboxes would run without limits; "
                      "delegate them (systemd Delegate=yes, docs/cluster.md) or pass "
                      "--allow-unlimited",
                      conf->name, sbx_cgroups_describe(sh->cgroups));
        rc = -ENOTSUP;
        goto out;
    }
    struct sbx_spawn_conf sc = {
        .agent_path = conf->agent,
        .cgroups = sh->cgroups,
        .uid_base = (uint32_t)conf->uid_base,
        .uid_count = (uint32_t)conf->uid_count,
        .rw_size = conf->disk,
        .rw_inodes = (uint64_t)conf->inodes,
        .shm_size = SBX_MIN(conf->disk, 64ull << 20),
        .output_cap = conf->output_cap,
        .nofile = 4096,
        .nproc = (uint32_t)SBX_MAX(conf->pids * 2, 64),
        .etc = (const char *const *)conf->etc,
        .env = (const char *const *)conf->env,
        .interp_dir = conf->interp,
        .setup_timeout_ms = (int)conf->setup_timeout,
    };
    if ((rc = sbx_spawner_new(&sh->spawner, &sc, why, sizeof(why))) != 0) {
        sbx_log_error("shard %s: %s", conf->name, why);
        goto out;
    }
    /* The node's image store (docs/images.md): a shard without one still
     * serves host-/usr sandboxes. */
    {
        char idir[4096];
        snprintf(idir, sizeof(idir), "%s", conf->images ? conf->images : "");
        if (!idir[0])
            snprintf(idir, sizeof(idir), "%s/images", conf->data);
        sbx_err_t ierr = NULL;
        if (sbx_image_store_open(idir, &sh->images, &ierr) != 0) {
            sbx_log_warn("shard %s: no image store: %s", conf->name, sbx_err_msg(ierr));
            sh->images = NULL;
        } else if (conf->etcd && *conf->etcd) {
            /* In a cluster, peers fetch images from this node by digest
             * (docs/images.md, "Images in a cluster"). */
            sbx_image_store_keep_blobs(sh->images, true);
        }
        sbx_err_release(&ierr);
    }
    /* The node's backup store (docs/persistence.md, "Backups"). */
    if (conf->backups)
        snprintf(sh->backups, sizeof(sh->backups), "%s", conf->backups);
    else
        snprintf(sh->backups, sizeof(sh->backups), "%s/backups", conf->data);
    {
        sbx_err_t berr = NULL;
        if (sbx_backup_store_init(sh->backups, &berr) != 0) {
            sbx_log_warn("shard %s: no backup store: %s", conf->name, sbx_err_msg(berr));
            sh->backups[0] = '\0';
        }
        sbx_err_release(&berr);
    }
    if (sh->s3 && !sh->backups[0]) {
        sbx_log_error("shard %s: the S3 backup store stages archives in --backups, which is "
                      "not usable (see above)", conf->name);
        rc = SBX_E_VALIDATION;
        goto out;
    }
    if (!conf->network_default || (strcmp(conf->network_default, "none") != 0 &&
                                   strcmp(conf->network_default, "egress") != 0)) {
        sbx_log_error("shard %s: --network-default must be none or egress", conf->name);
        rc = SBX_E_VALIDATION;
        goto out;
    }
    struct sbx_net_conf nc = {.name = conf->name, .range = conf->network_range,
                              .dns_upstream = conf->dns_upstream,
                              .inject_file = conf->egress_inject};
    if ((rc = sbx_net_new(&sh->net, &nc, why, sizeof(why))) != 0) {
        sbx_log_error("shard %s: %s", conf->name, why);
        goto out;
    }
    /* Always denied to sandboxes: the deployment's own addresses (issue 14;
     * docs/network.md, always denied).  An --egress-deny host that does not
     * resolve is an error: the operator named it to be closed. */
    for (char **d = conf->egress_deny; d && *d; d++)
        if (sbx_net_deny_add(sh->net, *d) != 0) {
            sbx_log_error("shard %s: --egress-deny %s: not an IPv4 address or a name that "
                          "resolves (or more than %d addresses)", conf->name, *d,
                          SBX_NET_DENY_MAX);
            rc = SBX_E_VALIDATION;
            goto out;
        }
    const char *own[] = {conf->etcd, conf->listen, conf->advertise, conf->relay};
    for (size_t i = 0; i < SBX_ARRAY_LEN(own); i++)
        if (own[i] && sbx_net_deny_add(sh->net, own[i]) != 0)
            sbx_log_warn("shard %s: could not add every address of %s to the sandboxes' "
                         "always-denied set", conf->name, own[i]);
    /* Not fatal: egress sandboxes try again at their start, and say why. */
    if (!strcmp(conf->network_default, "egress") && sbx_net_prepare(sh->net, why, sizeof(why)))
        sbx_log_warn("shard %s: the egress router is not ready: %s", conf->name, why);
    if ((rc = idem_load(sh)) != 0) {
        sbx_log_error("shard %s: cannot read the idempotency table: %s", conf->name,
                  sbx_err_message(rc));
        goto out;
    }
    struct fix_ctx fc = {sh, 0};
    sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, fix_one, &fc);
    /* Workspaces of sandboxes destroyed while no shard ran, or whose
     * destroy was cut short (docs/persistence.md). */
    char pwhy[512] = "";
    bool node_pool = conf->ws_pool_node && conf->ws_pool_node[0] &&
                     !(conf->ws_pool && !strcmp(conf->ws_pool, "off"));
    /* Its part is named after its data directory (s<i> under `sbxd dev`),
     * which outlives a change of the deployment's --name. */
    const char *part = strrchr(conf->data, '/');
    part = part && part[1] ? part + 1 : conf->data;
    /* A pool of its own from before the node's: its workspaces move into
     * the node's pool first; if that fails the shard keeps using its own
     * (and says why), as before. */
    if (node_pool && (rc = sbx_wspool_absorb(conf->data, conf->ws_pool_node, part, pwhy,
                                             sizeof(pwhy))) != 0) {
        sbx_log_error("shard %s: its workspace pool stays its own: %s", conf->name, pwhy);
        node_pool = false;
    }
    if (node_pool)
        rc = sbx_wspool_attach(conf->data, conf->ws_pool_node, part, &sh->wspool, pwhy,
                               sizeof(pwhy));
    else
        rc = sbx_wspool_open(conf->data, conf->ws_pool, conf->ws_pool_size, &sh->wspool, pwhy,
                             sizeof(pwhy));
    if (rc != 0) {
        sbx_log_error("shard %s: %s", conf->name, pwhy);
        rc = rc == -EINVAL || rc == -EEXIST || rc == -EFBIG ? SBX_E_VALIDATION : rc;
        goto out;
    }
    sbx_wspool_describe(sh->wspool, pwhy, sizeof(pwhy));
    sbx_log_info("shard %s: %s", conf->name, pwhy);
    int swept = sbx_ws_sweep(conf->data, ws_exists, sh);
    if (swept > 0)
        sbx_log_info("shard %s: removed %d workspaces of sandboxes that no longer exist",
                     conf->name, swept);
    shard_fork_sweep(sh);
    sh->fork_swept_ms = sbx_mono_ms();
    if (fc.n)
        sbx_log_info("shard %s: %zu sandboxes were running when the shard last stopped; their "
                 "containers are gone and start again on their next operation",
                 conf->name, fc.n);

    if (conf->workers > 0) {
        sh->work.n = (int)conf->workers;
    } else {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        sh->work.n = (int)SBX_MIN(SBX_MAX(SBX_MAX(cpus, 1) * SHARD_WORKERS_PER_CPU,
                                          SHARD_WORKERS_MIN),
                                  SHARD_WORKERS_MAX);
    }
    sh->work.threads = sbx_xcalloc((size_t)sh->work.n, sizeof(pthread_t));
    for (int i = 0; i < sh->work.n; i++)
        pthread_create(&sh->work.threads[i], NULL, shard_worker_main, sh);

    sh->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    sigw = sbx_loop_watch(sh->loop, sh->sigfd, EPOLLIN, on_signal, sh);

    sbx_err_t lerr = NULL;
    if ((rv = sbx_nng_rep_listen_l(&sh->rep, &sh->listener, conf->listen, conf->sec, &lerr)) !=
        0) {
        sbx_log_error("shard %s: %s", conf->name, sbx_err_msg(lerr));
        rc = sbx_err_release(&lerr);
        sh->stopping = true;
        goto stop;
    }
    sh->nctx = (int)SBX_MAX(conf->contexts, 1);
    sh->ctxs = sbx_xcalloc((size_t)sh->nctx, sizeof(*sh->ctxs));
    for (int i = 0; i < sh->nctx; i++) {
        struct sctx *c = &sh->ctxs[i];
        c->sh = sh;
        nng_aio_alloc(&c->aio, shard_sctx_cb, c);
        nng_ctx_open(&c->ctx, sh->rep);
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
    }
    if ((rc = shard_relay_start(sh)) != 0 || (rc = cluster_start(sh)) != 0) {
        sh->stopping = true;
        goto stop;
    }
    shard_probe_start(sh);
    shard_pool_adapt(sh); /* sets the target, then fills */
    sbx_loop_timer(sh->loop, 1000, sweep_cb, sh);
    sbx_log_info("shard %s: serving on %s (data %s, %s, pool %lld)", conf->name, conf->listen,
             conf->data, sbx_cgroups_describe(sh->cgroups), (long long)conf->pool);
    rc = sbx_loop_run(sh->loop);

stop:
    sh->stopping = true;
    /* A hold the last callback took (gate.c hold_store) ends before the
     * cluster's threads are joined: its replication thread may be waiting
     * for a held write, and the posted release runs only in a later loop. */
    if (sh->store_held) {
        sh->store_held = false;
        sbx_store_release(sh->store);
    }
    shard_probe_stop(sh);
    shard_images_stop(sh);
    shard_relay_stop(sh);
    /* Leave the cluster first (the others take our partitions at once), then
     * run what its threads posted while the store is still open. */
    cluster_stop(sh);
    sbx_loop_timer(sh->loop, 0, stop_cb, NULL);
    sbx_loop_run(sh->loop);
    /* Stop receiving, stop every container, then commit what is queued. */
    for (int i = 0; i < sh->nctx; i++)
        nng_aio_stop(sh->ctxs[i].aio);
    sh->ctx_closed = true;
    t_stop = sbx_mono_ms();
    size_t n_actors = sh->actors.n;
    for (struct pooled *p = sh->pool.head; p; p = p->next)
        sbx_container_kill(&p->c);
    actor_stop_all(sh);
    shard_img_pools_stop(sh);
    while (sh->pool.head) {
        struct pooled *p = sh->pool.head;
        sh->pool.head = p->next;
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_STOP;
        w->c = p->c;
        shard_work_submit(sh, w);
        free(p);
    }
    drain_to_idle(sh);
    sbx_log_info("shard %s: the containers of %zu sandboxes stopped in %lld ms", sh->conf.name,
                 n_actors, (long long)(sbx_mono_ms() - t_stop));
    pthread_mutex_lock(&sh->work.mu);
    sh->work.stop = true;
    pthread_cond_broadcast(&sh->work.cv);
    pthread_mutex_unlock(&sh->work.mu);
    for (int i = 0; i < sh->work.n; i++)
        pthread_join(sh->work.threads[i], NULL);
    for (int i = 0; i < sh->nctx; i++) {
        nng_ctx_close(sh->ctxs[i].ctx);
        nng_aio_free(sh->ctxs[i].aio);
    }
    if (sh->nctx)
        nng_close(sh->rep);
out:
    sh->store_held = false; /* a close ends the hold; the posted release is a no-op */
    if (sh->store)
        sbx_store_close(sh->store);
    if (t_stop)
        sbx_log_info("shard %s: stopped in %lld ms", sh->conf.name,
                     (long long)(sbx_mono_ms() - t_stop));
    if (sh->loop) {
        /* Deliver the last commit notes so no reply memory leaks. */
        sbx_loop_timer(sh->loop, 0, stop_cb, NULL);
        sbx_loop_run(sh->loop);
    }
    actor_free_all(sh);
    cluster_free(sh);
    shard_metrics_free(sh);
    while (sh->held) {
        struct held *h = sh->held;
        sh->held = h->next;
        free(h->buf);
        sop_free(h->op);
        free(h);
    }
    while (sh->pw_head) {
        struct pwrite *w = sh->pw_head;
        sh->pw_head = w->next;
        free(w->img);
        free(w);
    }
    while (sh->rd_head) {
        struct pwrite *w = sh->rd_head;
        sh->rd_head = w->next;
        free(w);
    }
    idem_free_all(sh);
    sbx_net_free(sh->net); /* after every container: their slots are detached */
    sbx_wspool_close(sh->wspool); /* after every container: the kernel drops it with them */
    if (sh->spawner)
        sbx_spawner_free(sh->spawner);
    sbx_image_store_close(sh->images);
    sbx_s3_free(sh->s3);
    if (sh->cgroups)
        sbx_cgroups_close(sh->cgroups);
    /* sbx_loop_free frees only unwatched handles: this one leaked at every
     * clean stop (LeakSanitizer in tests/integration/test_faults.c). */
    if (sh->loop)
        sbx_loop_unwatch(sh->loop, sigw);
    if (sh->sigfd >= 0)
        close(sh->sigfd);
    sbx_loop_free(sh->loop);
    free(sh->ctxs);
    free(sh->work.threads);
    free(sh->actors.buckets);
    free(sh->idem.buckets);
    pthread_mutex_destroy(&sh->work.mu);
    pthread_cond_destroy(&sh->work.cv);
    pthread_mutex_destroy(&sh->relay.mu);
    pthread_cond_destroy(&sh->relay.cv);
    free(sh);
    return rc;
}
