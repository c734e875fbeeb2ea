/*
 * sbx-bench-density — many idle sandboxes on one node: memory per sandbox,
 * creation rate as sandboxes accumulate, every one still answering, and the
 * time the daemon takes to stop with them all.
 *
 *   sbx-bench-density [--count N] [--clients P] [--shards S] [--pool K]
 *                     [--window W] [--memory M] [--settle S] [--workers T]
 *                     [--image PATH] [--workspace persistent|ephemeral]
 *
 * Starts a private `sbxd dev --shards S --pool K --sleep-after 1h` (and
 * --memory M, --workers T when given) in a
 * fresh temporary directory (tests/support/harness.c; sbxd from $SBX_BIN,
 * else next to this executable; root needed), then:
 *
 *   baseline   host memory in use (MemTotal - MemAvailable, /proc/meminfo)
 *              and the PSS (/proc/PID/smaps_rollup) of sbxd and all its
 *              descendants, once the shards' pools are full.
 *   create     N new sandboxes (default 1000), each by a `ping` (which
 *              starts its container and checks its agent answers), from P
 *              client threads (default 8) sharing one client.  Creates/s of
 *              the first W completions (default 500) and of the last W:
 *              W / (time of completion W - start) and W / (time of the last
 *              completion - time of completion N-W).  And the mean
 *              shard-side container start (status container.startUs) of
 *              the first W sandboxes and of the last W.
 *   idle       S seconds (default 25) after creation (no command run yet:
 *              the agent ends a default-session shell nobody used 10-20 s
 *              after bind, container/agent/agent.h) and again after every
 *              sandbox answered one `exec true` in its default session:
 *              per sandbox, (a) the PSS of the daemon's whole process tree
 *              (gateway, shards, agents, shells; shared pages split) minus
 *              the baseline's, (b) host memory in use minus the baseline's
 *              (all of the kernel's share too, and noisy: anything else on
 *              the host moves it), (c) the sum of the sandboxes' cgroup
 *              usage (`status` container.memoryBytes).  And the PSS per
 *              agent and per other process of a sandbox, and the slab
 *              caches (/proc/slabinfo) that grew most per sandbox.
 *   exec       each sandbox, one `exec true` (default session); failures
 *              are counted and make the exit status 1.
 *   stop       SIGTERM to sbxd, timed until waitpid returns; then how many
 *              of the agents seen before are still alive (must be 0).
 *
 * With --image PATH (an OCI layout or `docker save` tarball, as `sbx image
 * import` takes), the image is imported first and every sandbox is created
 * from it (`create {image}` instead of `ping`); with --workspace, each
 * sandbox's workspace is that kind (docs/persistence.md).  Then, after the
 * exec phase, the disk the deployment's data directory takes (allocated
 * blocks, st_blocks, each inode once) in all, in its image store (the
 * image's unpacked layers) and in the sandboxes' workspace images — issue
 * 13's "1,000 sandboxes share the image's layers" check.
 *
 * Figures are printed on stdout.  Limits to watch for large N: the host's
 * pid_max (one agent per sandbox, plus a shell once a command ran), open
 * files of the shard (two per container: channel and pidfd) and the uid
 * range (--uid-count, 65536 per shard by default).
 *
 * Exit status 0 when every call succeeded, 1 otherwise, 2 on usage errors.
 */
#include <dirent.h>
#include <errno.h>
#include <fts.h>
#include <sys/stat.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../include/sbx/sbx.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "../tests/support/harness.h"
#include "stats.h"

struct opts {
    long count, clients, shards, pool, window, settle, workers; /* workers < 0: sbxd's */
    const char *memory;
    const char *image;     /* --image: a path to import, or NULL */
    const char *workspace; /* --workspace: persistent | ephemeral, or NULL (sbxd's) */
};

/* ------------------------------------------------------------------------------ */
/* Host figures. */

/* /proc/meminfo in KiB: in use (MemTotal - MemAvailable) and the kernel's
 * shares that grow with sandboxes. */
struct host_mem {
    long used, slab, sunreclaim, pagetables, kstack, shmem;
};

static void
host_mem(struct host_mem *h)
{
    long total = -1, avail = -1, v;
    *h = (struct host_mem){-1, -1, -1, -1, -1, -1};
    FILE *f = fopen("/proc/meminfo", "re");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemTotal: %ld kB", &v) == 1)
            total = v;
        else if (sscanf(line, "MemAvailable: %ld kB", &v) == 1)
            avail = v;
        else if (sscanf(line, "Slab: %ld kB", &v) == 1)
            h->slab = v;
        else if (sscanf(line, "SUnreclaim: %ld kB", &v) == 1)
            h->sunreclaim = v;
        else if (sscanf(line, "PageTables: %ld kB", &v) == 1)
            h->pagetables = v;
        else if (sscanf(line, "KernelStack: %ld kB", &v) == 1)
            h->kstack = v;
        else if (sscanf(line, "Shmem: %ld kB", &v) == 1)
            h->shmem = v;
    }
    fclose(f);
    h->used = total >= 0 && avail >= 0 ? total - avail : -1;
}

/* /proc/slabinfo: each cache's size in KiB (objects × object size), to
 * name where the slab growth per sandbox goes.  At most SLABS_MAX caches;
 * n = 0 when the file cannot be read (not root, no SLUB stats). */
#define SLABS_MAX 1024
struct slabs {
    int n;
    char name[SLABS_MAX][40];
    long kib[SLABS_MAX];
};

static void
slabs_read(struct slabs *sl)
{
    sl->n = 0;
    FILE *f = fopen("/proc/slabinfo", "re");
    if (!f)
        return;
    char line[512];
    while (sl->n < SLABS_MAX && fgets(line, sizeof(line), f)) {
        long active, num, size;
        if (sscanf(line, "%39s %ld %ld %ld", sl->name[sl->n], &active, &num, &size) == 4)
            sl->kib[sl->n++] = num * size / 1024;
    }
    fclose(f);
}

/* The 6 caches that grew most from s0 to s1, per sandbox. */
static void
slabs_report(const struct slabs *s0, const struct slabs *s1, long n)
{
    if (!s0->n || !s1->n)
        return;
    long grow[SLABS_MAX];
    for (int i = 0; i < s1->n; i++) {
        grow[i] = s1->kib[i];
        for (int j = 0; j < s0->n; j++)
            if (!strcmp(s0->name[j], s1->name[i])) {
                grow[i] -= s0->kib[j];
                break;
            }
    }
    printf("    slab caches that grew most, per sandbox (kmalloc-1k: mostly the memory "
           "cgroups' shrinker maps):");
    for (int k = 0; k < 6; k++) {
        int best = -1;
        for (int i = 0; i < s1->n; i++)
            if (grow[i] > 0 && (best < 0 || grow[i] > grow[best]))
                best = i;
        if (best < 0)
            break;
        printf("%s %s %.1f KiB", k ? "," : "", s1->name[best], (double)grow[best] / (double)n);
        grow[best] = 0;
    }
    printf("\n");
}

static pid_t
proc_ppid(pid_t pid, char *comm, size_t n)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t len = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[len] = '\0';
    char *l = strchr(buf, '('), *r = strrchr(buf, ')');
    if (!l || !r || r < l)
        return -1;
    snprintf(comm, n, "%.*s", (int)(r - l - 1), l + 1);
    int ppid = -1;
    if (sscanf(r + 1, " %*c %d", &ppid) != 1)
        return -1;
    return ppid;
}

static long
proc_pss_kib(pid_t pid)
{
    char path[64], line[256];
    snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
    FILE *f = fopen(path, "re");
    if (!f)
        return 0;
    long v = 0, pss = 0;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, "Pss: %ld kB", &v) == 1)
            pss = v;
    fclose(f);
    return pss;
}

struct tree {
    long pss_kib, agent_pss_kib, other_pss_kib; /* other: processes under agents */
    long nprocs, nagents, nother;
    pid_t *agents;                              /* owned */
};

/* The PSS of root and every descendant.  Each process of a sandbox is a
 * descendant of its agent (PID 1 there), each agent of a shard. */
static void
tree_measure(pid_t root, struct tree *t)
{
    memset(t, 0, sizeof(*t));
    size_t cap = 0, n = 0;
    struct ent {
        pid_t pid, ppid;
        bool agent;
    } *e = NULL;
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char *end;
        long p = strtol(de->d_name, &end, 10);
        if (*end || p <= 0)
            continue;
        char comm[64];
        pid_t pp = proc_ppid((pid_t)p, comm, sizeof(comm));
        if (pp < 0)
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 4096;
            e = sbx_xrealloc(e, cap * sizeof(*e));
        }
        e[n++] = (struct ent){(pid_t)p, pp, !strcmp(comm, "sbx-agent")};
    }
    if (d)
        closedir(d);
    /* in[i]: 0 outside, 1 daemon process, 2 agent, 3 under an agent; found
     * by walking up the parents (pid order is not tree order). */
    long pid_max = 4194304;
    FILE *pm = fopen("/proc/sys/kernel/pid_max", "re");
    if (pm) {
        if (fscanf(pm, "%ld", &pid_max) != 1)
            pid_max = 4194304;
        fclose(pm);
    }
    long *at = sbx_xcalloc((size_t)pid_max + 1, sizeof(long)); /* pid -> index + 1 */
    for (size_t i = 0; i < n; i++)
        if (e[i].pid <= pid_max)
            at[e[i].pid] = (long)i + 1;
    unsigned char *in = sbx_xcalloc(n ? n : 1, 1);
    for (size_t i = 0; i < n; i++) {
        /* the chain of ancestors up to root (or to none) */
        unsigned char v = 0;
        bool under_agent = false, is_agent_child = e[i].agent;
        pid_t p = e[i].pid;
        for (int depth = 0; depth < 64 && p > 0 && p <= pid_max && at[p]; depth++) {
            const struct ent *x = &e[at[p] - 1];
            if (x->pid == root) {
                v = 1;
                break;
            }
            if (x->agent && x->pid != e[i].pid)
                under_agent = true;
            p = x->ppid;
        }
        if (v)
            in[i] = under_agent ? 3 : is_agent_child ? 2 : 1;
    }
    free(at);
    t->agents = sbx_xcalloc(n ? n : 1, sizeof(pid_t));
    for (size_t i = 0; i < n; i++) {
        if (!in[i])
            continue;
        long k = proc_pss_kib(e[i].pid);
        t->pss_kib += k;
        t->nprocs++;
        if (in[i] == 2) {
            t->agent_pss_kib += k;
            t->agents[t->nagents++] = e[i].pid;
        } else if (in[i] == 3) {
            t->other_pss_kib += k;
            t->nother++;
        }
    }
    free(in);
    free(e);
}

/* ------------------------------------------------------------------------------ */
/* Client threads. */

struct run {
    sbx_client *c;
    const char *prefix;
    long n;
    bool exec;              /* exec true instead of ping */
    const char *create;     /* JSON args of a `create` instead of ping, or NULL */
    atomic_long next;       /* next index to take */
    atomic_long done;       /* completions so far */
    atomic_long failed;
    double t0;
    double *finish;         /* [n] completion times, in completion order */
    pthread_mutex_t mu;
};

static void *
client_main(void *arg)
{
    struct run *r = arg;
    for (;;) {
        long i = atomic_fetch_add(&r->next, 1);
        if (i >= r->n)
            break;
        char id[64];
        snprintf(id, sizeof(id), "%s-%ld", r->prefix, i);
        sbx_error err;
        int rc;
        if (r->exec) {
            sbx_exec_opts o = {.command = "true"};
            sbx_exec_result res;
            rc = sbx_exec(r->c, id, &o, &res, &err);
            if (rc == 0) {
                rc = res.exit_code == 0 ? 0 : -1;
                sbx_exec_result_free(&res);
            }
        } else if (r->create) {
            sbx_reply *rep = NULL;
            rc = sbx_call_json(r->c, "create", id, r->create, 120000, &rep, &err);
            sbx_reply_free(rep);
        } else {
            rc = sbx_ping(r->c, id, &err);
        }
        if (rc != 0) {
            if (atomic_fetch_add(&r->failed, 1) < 5)
                fprintf(stderr, "sbx-bench-density: %s %s: %s %s\n", r->exec ? "exec" : "ping",
                        id, rc == -1 ? "exit" : err.code, rc == -1 ? "not 0" : err.message);
            if (rc != -1)
                sbx_error_free(&err);
        }
        double t = sbx_stats_now_ms();
        pthread_mutex_lock(&r->mu);
        r->finish[atomic_fetch_add(&r->done, 1)] = t;
        pthread_mutex_unlock(&r->mu);
    }
    return NULL;
}

/* Run op on every sandbox from P threads; 0 or the number of failures. */
static long
run_all(sbx_client *c, const char *prefix, long n, long clients, bool exec, const char *create,
        double *t0, double *finish)
{
    struct run r = {.c = c, .prefix = prefix, .n = n, .exec = exec, .create = create,
                    .finish = finish};
    pthread_mutex_init(&r.mu, NULL);
    pthread_t *th = sbx_xcalloc((size_t)clients, sizeof(*th));
    *t0 = sbx_stats_now_ms();
    for (long i = 0; i < clients; i++)
        pthread_create(&th[i], NULL, client_main, &r);
    for (long i = 0; i < clients; i++)
        pthread_join(th[i], NULL);
    free(th);
    pthread_mutex_destroy(&r.mu);
    return atomic_load(&r.failed);
}

/* Sum of container.memoryBytes over the sandboxes, in KiB; and, when
 * start_us is not NULL, each container's shard-side start time
 * (container.startUs; 0 when absent). */
static long
cgroup_sum_kib(sbx_client *c, const char *prefix, long n, long *missing, int64_t *start_us)
{
    int64_t sum = 0;
    *missing = 0;
    for (long i = 0; i < n; i++) {
        char id[64];
        snprintf(id, sizeof(id), "%s-%ld", prefix, i);
        sbx_reply *r = NULL;
        sbx_error err;
        int64_t v = -1, su = 0;
        if (sbx_call_json(c, "status", id, "{}", 30000, &r, &err) == 0) {
            const msgpack_object *sb, *ct;
            if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0 &&
                sbx_wire_get_map(sb, "container", &ct) == 0) {
                sbx_wire_get_i64(ct, "memoryBytes", &v);
                sbx_wire_get_i64(ct, "startUs", &su);
            }
            sbx_reply_free(r);
        } else {
            sbx_error_free(&err);
        }
        if (v < 0)
            (*missing)++;
        else
            sum += v;
        if (start_us)
            start_us[i] = su;
    }
    return (long)(sum / 1024);
}

static double
mean_ms(const int64_t *us, long from, long to)
{
    double s = 0;
    long k = 0;
    for (long i = from; i < to; i++)
        if (us[i] > 0) {
            s += (double)us[i];
            k++;
        }
    return k ? s / (double)k / 1000.0 : 0.0;
}

static void
report_idle(const char *state, const struct tree *base, const struct tree *t,
            const struct host_mem *h0, const struct host_mem *h1, long cg_kib, long cg_missing,
            long n)
{
    printf("idle sandboxes, %s (%ld sandboxes, %ld processes in the daemon's tree)\n", state, n,
           t->nprocs);
    printf("  PSS of the daemon's tree - baseline   %8.1f MiB  = %.3f MiB per sandbox\n",
           (double)(t->pss_kib - base->pss_kib) / 1024.0,
           (double)(t->pss_kib - base->pss_kib) / 1024.0 / (double)n);
    printf("    of which agents                     %8.1f MiB  (%ld agents, %.0f KiB each)\n",
           (double)t->agent_pss_kib / 1024.0, t->nagents,
           t->nagents ? (double)t->agent_pss_kib / (double)t->nagents : 0.0);
    printf("    of which under agents (shells…)     %8.1f MiB  (%ld processes, %.0f KiB each)\n",
           (double)t->other_pss_kib / 1024.0, t->nother,
           t->nother ? (double)t->other_pss_kib / (double)t->nother : 0.0);
    long rest = (t->pss_kib - t->agent_pss_kib - t->other_pss_kib) -
                (base->pss_kib - base->agent_pss_kib - base->other_pss_kib);
    printf("    growth of gateway + shards          %8.1f MiB  (%.1f KiB per sandbox)\n",
           (double)rest / 1024.0, (double)rest / (double)n);
    printf("  host memory in use - baseline         %8.1f MiB  = %.3f MiB per sandbox (noisy)\n",
           (double)(h1->used - h0->used) / 1024.0,
           (double)(h1->used - h0->used) / 1024.0 / (double)n);
    printf("    per sandbox: slab %.0f KiB (unreclaimable %.0f), page tables %.0f KiB, kernel "
           "stacks %.0f KiB, shmem/tmpfs %.0f KiB\n",
           (double)(h1->slab - h0->slab) / (double)n,
           (double)(h1->sunreclaim - h0->sunreclaim) / (double)n,
           (double)(h1->pagetables - h0->pagetables) / (double)n,
           (double)(h1->kstack - h0->kstack) / (double)n,
           (double)(h1->shmem - h0->shmem) / (double)n);
    long kern = (h1->slab - h0->slab) + (h1->pagetables - h0->pagetables) +
                (h1->kstack - h0->kstack);
    printf("  PSS growth + kernel growth (slab, page tables, stacks): %.3f MiB per sandbox\n",
           (double)(t->pss_kib - base->pss_kib + kern) / 1024.0 / (double)n);
    printf("  sandbox cgroups (memoryBytes sum)     %8.1f MiB  = %.3f MiB per sandbox%s\n",
           (double)cg_kib / 1024.0, (double)cg_kib / 1024.0 / (double)(n - cg_missing),
           cg_missing ? " (some without a figure)" : "");
}

static double
rate(const double *finish, long from, long to, double t_from)
{
    /* completions (from, to] over the time since t_from */
    double dt = finish[to - 1] - t_from;
    return dt > 0 ? (double)(to - from) / (dt / 1000.0) : 0.0;
}

/* ------------------------------------------------------------------------------ */
/* Disk. */

/* Allocated bytes (st_blocks × 512) under a directory, each inode once
 * (hard links of the layers' files count once), split by where the path
 * lies; mounts below are not crossed. */
struct disk {
    long long all, images, workspaces;
};

/* Whether (dev, ino) was met before; else remember it.  0 seen before, 1
 * new, -1 out of memory. */
static int
inode_first(struct stat *st, struct stat **seen, size_t *n, size_t *cap)
{
    for (size_t i = 0; i < *n; i++)
        if ((*seen)[i].st_ino == st->st_ino && (*seen)[i].st_dev == st->st_dev)
            return 0;
    if (*n == *cap) {
        size_t nc = *cap ? 2 * *cap : 1024;
        struct stat *m = realloc(*seen, nc * sizeof(**seen));
        if (!m)
            return -1;
        *seen = m;
        *cap = nc;
    }
    (*seen)[(*n)++] = *st;
    return 1;
}

/* Walk dir with fts(3); 0 or -1. */
static int
disk_measure(const char *dir, struct disk *d)
{
    *d = (struct disk){0};
    char *paths[] = {(char *)dir, NULL};
    FTS *f = fts_open(paths, FTS_PHYSICAL | FTS_XDEV | FTS_NOCHDIR, NULL);
    if (!f)
        return -1;
    struct stat *seen = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    for (FTSENT *e; (e = fts_read(f)) != NULL;) {
        if (e->fts_info == FTS_DP || e->fts_info == FTS_NS || e->fts_info == FTS_DNR ||
            e->fts_info == FTS_ERR)
            continue;
        struct stat *st = e->fts_statp;
        if (st->st_nlink > 1 && !S_ISDIR(st->st_mode)) {
            int first = inode_first(st, &seen, &n, &cap);
            if (first < 0) {
                rc = -1;
                break;
            }
            if (!first)
                continue;
        }
        long long b = (long long)st->st_blocks * 512;
        d->all += b;
        if (strstr(e->fts_path, "/images/"))
            d->images += b;
        /* The images, or the shard's workspace pool that holds them
         * (<data>/wspool.img; <data>/workspaces is then a link into it,
         * not followed here: docs/persistence.md, "The workspace pool"). */
        if (strstr(e->fts_path, "/workspaces/") || !strcmp(e->fts_name, "wspool.img"))
            d->workspaces += b;
    }
    free(seen);
    fts_close(f);
    return rc;
}

/* ------------------------------------------------------------------------------ */

static int
parse_args(int argc, char **argv, struct opts *o)
{
    *o = (struct opts){.count = 1000, .clients = 8, .shards = 2, .pool = -1, .window = 500,
                     .settle = 25, .workers = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long *dst = !strcmp(a, "--count")     ? &o->count
                    : !strcmp(a, "--clients") ? &o->clients
                    : !strcmp(a, "--shards")  ? &o->shards
                    : !strcmp(a, "--pool")    ? &o->pool
                    : !strcmp(a, "--window")  ? &o->window
                    : !strcmp(a, "--settle")  ? &o->settle
                    : !strcmp(a, "--workers") ? &o->workers
                                              : NULL;
        if (!strcmp(a, "--memory") && v) {
            o->memory = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--image") && v) {
            o->image = v;
            i++;
            continue;
        }
        if (!strcmp(a, "--workspace") && v &&
            (!strcmp(v, "persistent") || !strcmp(v, "ephemeral"))) {
            o->workspace = v;
            i++;
            continue;
        }
        char *end;
        if (!dst || !v || (*dst = strtol(v, &end, 10), *end) || *dst < 0) {
            fprintf(stderr, "usage: sbx-bench-density [--count N] [--clients P] [--shards S] "
                            "[--pool K] [--window W] [--memory M] [--settle S] [--workers T] "
                            "[--image PATH] [--workspace persistent|ephemeral]\n");
            return -1;
        }
        i++;
    }
    if (o->count < 2 || o->clients < 1 || o->shards < 1) {
        fprintf(stderr, "sbx-bench-density: --count ≥ 2, --clients ≥ 1, --shards ≥ 1\n");
        return -1;
    }
    if (o->window * 2 > o->count)
        o->window = o->count / 2;
    return 0;
}

int
main(int argc, char **argv)
{
    struct opts o;
    if (parse_args(argc, argv, &o) != 0)
        return 2;
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[sl > 0 ? sl : 0] = 0;
    if (!getenv("SBX_BIN"))
        setenv("SBX_BIN", dirname(self), 1);

    char pool[24];
    snprintf(pool, sizeof(pool), "%ld", o.pool);
    const char *extra[16];
    int ne = 0;
    extra[ne++] = "--sleep-after";
    extra[ne++] = "1h";
    if (o.pool >= 0) {
        extra[ne++] = "--pool";
        extra[ne++] = pool;
    }
    char workers[24];
    snprintf(workers, sizeof(workers), "%ld", o.workers);
    if (o.workers >= 0) {
        extra[ne++] = "--workers";
        extra[ne++] = workers;
    }
    if (o.memory) {
        extra[ne++] = "--memory";
        extra[ne++] = o.memory;
    }
    extra[ne] = NULL;
    struct testd d;
    if (testd_start(&d, (int)o.shards, extra) != 0) {
        fprintf(stderr, "sbx-bench-density: cannot start sbxd (root needed)\n");
        return 1;
    }
    int rc = 1;
    sbx_client *c = NULL;
    sbx_error err;
    double *finish = sbx_xcalloc((size_t)o.count, sizeof(double));
    struct tree base = {0}, t1 = {0}, t2 = {0};
    struct slabs *slab0 = NULL, *slab1 = NULL; /* owned; freed at out */
    long failed = 0;
    char prefix[32];
    snprintf(prefix, sizeof(prefix), "dens%d", (int)getpid());
    if (sbx_client_open(&c, d.url, &err) != 0) {
        fprintf(stderr, "sbx-bench-density: %s %s\n", err.code, err.message);
        sbx_error_free(&err);
        goto out;
    }
    sbx_client_set_timeout(c, 120000);
    printf("sbx-bench-density: %ld sandboxes, %ld client threads, %ld shards, pool %s, "
           "workers %s\n", o.count, o.clients, o.shards, o.pool >= 0 ? pool : "(sbxd's default)",
           o.workers >= 0 ? workers : "(sbxd's default)");
    /* Let the pools fill before the baseline. */
    sleep(2);
    tree_measure(d.pid, &base);
    struct host_mem host0, host1, host2;
    host_mem(&host0);
    slab0 = sbx_xcalloc(1, sizeof(*slab0));
    slab1 = sbx_xcalloc(1, sizeof(*slab1));
    slabs_read(slab0);

    /* --image / --workspace: sandboxes made by `create` with them. */
    char image_name[64], create_args[256];
    const char *create = NULL;
    snprintf(image_name, sizeof(image_name), "bench-density-%d", (int)getpid());
    if (o.image) {
        char args[PATH_MAX + 128];
        sbx_reply *ir = NULL;
        snprintf(args, sizeof(args), "{\"path\":\"%s\",\"name\":\"%s\"}", o.image, image_name);
        double i0 = sbx_stats_now_ms();
        if (sbx_call_json(c, "image.import", NULL, args, 600000, &ir, &err) != 0) {
            fprintf(stderr, "sbx-bench-density: image.import %s: %s %s\n", o.image, err.code,
                    err.message);
            sbx_error_free(&err);
            goto out;
        }
        sbx_reply_free(ir);
        printf("image.import %s  %.1f ms\n", o.image, sbx_stats_now_ms() - i0);
    }
    if (o.image || o.workspace) {
        int k = snprintf(create_args, sizeof(create_args), "{");
        if (o.image)
            k += snprintf(create_args + k, sizeof(create_args) - (size_t)k, "\"image\":\"%s\"%s",
                          image_name, o.workspace ? "," : "");
        if (o.workspace)
            k += snprintf(create_args + k, sizeof(create_args) - (size_t)k,
                          "\"workspace\":\"%s\"", o.workspace);
        snprintf(create_args + k, sizeof(create_args) - (size_t)k, "}");
        create = create_args;
    }
    struct disk disk0 = {0};
    disk_measure(d.dir, &disk0);

    double t0;
    failed += run_all(c, prefix, o.count, o.clients, false, create, &t0, finish);
    double total_s = (finish[o.count - 1] - t0) / 1000.0;
    long w = o.window;
    if (create)
        printf("create %s\n", create);
    else
        printf("create (ping on a new ID)\n");
    printf("  all %ld                          %8.1f creates/s (%.2f s)\n", o.count,
           (double)o.count / total_s, total_s);
    printf("  first %ld                        %8.1f creates/s\n", w, rate(finish, 0, w, t0));
    printf("  last %ld (with %ld present)   %8.1f creates/s\n", w, o.count - w,
           rate(finish, o.count - w, o.count, finish[o.count - w - 1]));

    sleep((unsigned)o.settle); /* pool refills, unused shells end, then quiet */
    tree_measure(d.pid, &t1);
    host_mem(&host1);
    slabs_read(slab1);
    long missing;
    int64_t *start_us = sbx_xcalloc((size_t)o.count, sizeof(int64_t));
    long cg1 = cgroup_sum_kib(c, prefix, o.count, &missing, start_us);
    /* Sandbox i was created about when i others were present (IDs are
     * taken in order; a pooled container was started shortly before). */
    printf("  shard-side container start (startUs), mean: first %ld %.2f ms, last %ld %.2f ms\n",
           w, mean_ms(start_us, 0, w), w, mean_ms(start_us, o.count - w, o.count));
    free(start_us);
    report_idle("after creation (no command run yet)", &base, &t1, &host0, &host1, cg1, missing,
                o.count);
    slabs_report(slab0, slab1, o.count);

    long efail = run_all(c, prefix, o.count, o.clients, true, NULL, &t0, finish);
    printf("exec true on each (default session)  %ld of %ld answered, %.1f execs/s\n",
           o.count - efail, o.count, (double)o.count / ((finish[o.count - 1] - t0) / 1000.0));
    failed += efail;
    sleep(2);
    tree_measure(d.pid, &t2);
    host_mem(&host2);
    slabs_read(slab1);
    long cg2 = cgroup_sum_kib(c, prefix, o.count, &missing, NULL);
    report_idle("after one exec each (default session shell started)", &base, &t2, &host0, &host2,
                cg2, missing, o.count);
    slabs_report(slab0, slab1, o.count);
    struct disk disk1 = {0};
    if (disk_measure(d.dir, &disk1) == 0)
        printf("disk (allocated, data directory %s): before the sandboxes %.1f MiB (image store "
               "%.1f MiB); with %ld: %.1f MiB — image store %.1f MiB, workspaces %.1f MiB "
               "(%.1f KiB per sandbox)\n",
               d.dir, disk0.all / 1048576.0, disk0.images / 1048576.0, o.count,
               disk1.all / 1048576.0, disk1.images / 1048576.0, disk1.workspaces / 1048576.0,
               disk1.workspaces / 1024.0 / (double)o.count);

    sbx_client_close(c);
    c = NULL;
    double s0 = sbx_stats_now_ms();
    kill(d.pid, SIGTERM);
    int st;
    while (waitpid(d.pid, &st, 0) < 0 && errno == EINTR)
        ;
    double stop_ms = sbx_stats_now_ms() - s0;
    d.pid = 0;
    long alive = 0;
    for (long i = 0; i < t2.nagents; i++) {
        char comm[64];
        if (proc_ppid(t2.agents[i], comm, sizeof(comm)) >= 0 && !strcmp(comm, "sbx-agent"))
            alive++;
    }
    printf("stop: sbxd with %ld running sandboxes  %8.0f ms (exit status %d); agents left: %ld\n",
           o.count, stop_ms, WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), alive);
    if (alive)
        failed++;
    rc = failed ? 1 : 0;
out:
    if (c)
        sbx_client_close(c);
    testd_stop(&d);
    free(base.agents);
    free(t1.agents);
    free(t2.agents);
    free(slab0);
    free(slab1);
    free(finish);
    return rc;
}
