/*
 * cgroup.h — per-sandbox resource limits on cgroup v1 and v2.
 *
 * Layout.  Every shard owns one subtree, `<base>` below; each sandbox gets
 * one cgroup in it, named after the container's serial number:
 *   v1: /sys/fs/cgroup/{memory,pids,cpu}/<base>/<name>   (three hierarchies,
 *       found through /proc/self/mountinfo, wherever they are mounted)
 *   v2: <the shard's own cgroup>/<base>/<name>.  The "no internal
 *       processes" rule means controllers can only be enabled below a cgroup
 *       without processes, so at start-up the shard moves the processes of
 *       its own cgroup into a leaf `<own>/sbx-supervisor` (nsjail does the
 *       same, cgroup2.cc moveSelfIntoChildCgroup) and enables
 *       +memory +pids +cpu top-down.  Under systemd run sbxd with
 *       Delegate=yes (docs/cluster.md has the unit).
 *
 * Files written (cgroups(7), Documentation/admin-guide/cgroup-v{1,2}):
 *   memory  v1 memory.limit_in_bytes = memory.memsw.limit_in_bytes (no swap
 *           escape), v2 memory.max, memory.swap.max = 0, memory.oom.group = 0
 *           (the OOM killer takes one process, a tenant's before the agent,
 *           as on v1; 1 killed the agent with every OOM)
 *   pids    pids.max (both)
 *   cpu     v1 cpu.cfs_period_us/cpu.cfs_quota_us, v2 cpu.max "quota period"
 * Counters read for exit causes: v1 memory.oom_control "oom_kill N" and
 * pids.events "max N"; v2 memory.events "oom_kill N" and pids.events.
 *
 * Mode "none" (config cgroup=none) creates nothing and enforces nothing; it
 * exists for hosts without delegation and is refused by `sbxd` unless asked
 * for explicitly, since then memory, pids and CPU are unlimited.
 */
#ifndef SBX_CGROUP_H
#define SBX_CGROUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

enum sbx_cg_mode { SBX_CG_NONE = 0, SBX_CG_V1, SBX_CG_V2 };

struct sbx_limits {
    uint64_t memory;   /* bytes; 0 = unlimited */
    uint32_t pids;     /* processes; 0 = unlimited */
    uint32_t cpu_milli;/* thousandths of a CPU (1000 = one full CPU); 0 = unlimited */
};

typedef struct sbx_cgroups sbx_cgroups;

/*
 * sbx_cgroups_open — detect (mode "auto") or use the given mode, create the
 * base subtree `base` (e.g. "sbx/dev-s0") and remove leftovers of an
 * earlier run of the same shard: every process still in them is SIGKILLed
 * first, then the cgroups are removed as those processes are gone, within
 * 5 s for all hierarchies (one still busy then stays, until the close).
 * On success the caller owns *out.  0 or -errno with the reason in why.
 */
int sbx_cgroups_open(sbx_cgroups **out, const char *mode, const char *base, char *why,
                     size_t whylen);
/* sbx_cgroups_close — remove the base subtree (sandbox cgroups first) the
 * same way, within 60 s, and free cg. */
void sbx_cgroups_close(sbx_cgroups *cg);
/*
 * sbx_cgroups_set_share — give all sandboxes of the host together the CPU
 * weight of `procs` ordinary (nice 0) processes, in the top directory of the
 * base ("sbx", shared by the host's shards, which all write the same value
 * unless configured apart: the last writer wins).
 *
 * Why: the CPU controller schedules a cgroup as one entity.  Left at the
 * kernel's default, every sandbox of the host together weighs as much as
 * ONE thread of the shard or of any other process, so under load the
 * sandboxes queue behind the control plane, and the kernel serves that
 * queue unfairly between their cgroups: a 50-way closed loop of `exec true`
 * on 2 CPUs had p99 100–140 ms and max 300–600 ms, every sandbox seeing
 * some call over 100 ms (docs/benchmarks.md, "the sandboxes' CPU weight").
 * Too large a weight starves the shard instead: with 256 processes' worth,
 * four sandboxes spinning on the CPU made a fifth one's `exec true` take
 * p50 215 ms.  The default (8 per online CPU) is measured between both.
 *
 * Files (Documentation/admin-guide/cgroup-v1/cfs / cgroup-v2 "cpu"):
 *   v1  cpu.shares = procs × 1024 (clamped to 2..262144)
 *   v2  cpu.weight = procs × 100 (clamped to 1..10000), on the tree and on
 *       the shard's own leaf `sbx-supervisor` alike, so that the sandboxes
 *       can never hold the control plane below half the CPU.  Not measured:
 *       no cgroup v2 host was at hand (this machine is v1 hybrid).
 * procs 0 leaves the kernel's default.  Mode none: nothing to do.
 * 0 or -errno (the weight is then what it was; the caller logs and goes on).
 */
int sbx_cgroups_set_share(sbx_cgroups *cg, unsigned procs);
enum sbx_cg_mode sbx_cgroups_mode(const sbx_cgroups *cg);
/* sbx_cgroups_limited — whether sandbox cgroups get memory, pids and CPU
 * limits: always on v1 (a missing hierarchy fails the open), never in mode
 * none, on v2 only when those controllers are available to the subtree. */
bool sbx_cgroups_limited(const sbx_cgroups *cg);
/* sbx_cgroups_describe — "v1 (memory,pids,cpu)" etc., static until close. */
const char *sbx_cgroups_describe(const sbx_cgroups *cg);

/* One sandbox's cgroup. */
typedef struct sbx_cgroup {
    char name[64];
    int v2_fd;      /* O_PATH|O_DIRECTORY fd of the v2 cgroup, for CLONE_INTO_CGROUP; -1 on v1 */
    bool created;
} sbx_cgroup;

/* sbx_cgroup_create — create cgroup `name` with limits; 0 or -errno. */
int sbx_cgroup_create(sbx_cgroups *cg, const char *name, const struct sbx_limits *lim,
                      sbx_cgroup *out);
/* sbx_cgroup_set_limits — change the limits of an existing cgroup. */
int sbx_cgroup_set_limits(sbx_cgroups *cg, sbx_cgroup *c, const struct sbx_limits *lim);
/* sbx_cgroup_attach — move process `pid` into the cgroup (every hierarchy). */
int sbx_cgroup_attach(sbx_cgroups *cg, sbx_cgroup *c, pid_t pid);

/* The most hierarchies a cgroup spans (v1: memory, pids, cpu, cpuacct). */
#define SBX_CG_MAX_HIER 4

/*
 * sbx_cgroup_open_tasks — on cgroup v1, open the `tasks` file of the
 * cgroup in every hierarchy (O_WRONLY|O_CLOEXEC) into fds[0..*n), for a
 * freshly cloned, single-threaded child to join the cgroup itself by
 * writing "0" to each before it execs (spawn.c).  Why: writing another
 * process's pid to cgroup.procs takes the kernel's global
 * cgroup_threadgroup_rwsem for writing, which waits for an RCU grace period
 * (6–18 ms measured on this kind of host, docs/benchmarks.md "Bursts");
 * a thread moving itself through `tasks` skips that lock (Linux 6.0,
 * "cgroup: Optimize single thread migration"; older kernels take it as
 * before).  The permission check uses the opener's credentials (the
 * shard's), so the child needs none of its own.  Not v2 (its child is born
 * in its cgroup with CLONE_INTO_CGROUP) nor mode none: *n = 0 there.  The
 * fds are the caller's to close.  0 or -errno (nothing left open).
 */
int sbx_cgroup_open_tasks(sbx_cgroups *cg, sbx_cgroup *c, int fds[SBX_CG_MAX_HIER], int *n);

struct sbx_cgroup_stats {
    uint64_t oom_kills;      /* processes killed by the OOM killer in this cgroup */
    uint64_t pids_max_hits;  /* forks refused by pids.max */
    uint64_t memory_current; /* bytes */
    uint64_t memory_peak;    /* bytes (v1 max_usage_in_bytes, v2 memory.peak when present) */
    uint64_t pids_current;
    uint64_t cpu_usage_us;
};
/* sbx_cgroup_stats — read the counters (missing files read as 0); 0 or -errno. */
int sbx_cgroup_stats(sbx_cgroups *cg, sbx_cgroup *c, struct sbx_cgroup_stats *st);
/* sbx_cgroup_limit_hits — only st->oom_kills and st->pids_max_hits (the rest
 * zeroed): two file reads instead of six, for what an exec reads before it
 * starts and when it ends (actors/actor_chan.c); 0 or -errno. */
int sbx_cgroup_limit_hits(sbx_cgroups *cg, sbx_cgroup *c, struct sbx_cgroup_stats *st);

/*
 * sbx_cgroup_destroy — remove the cgroup.  Any process still inside is sent
 * SIGKILL (v2 cgroup.kill when present) and removal is retried for up to
 * `wait_ms`.  Returns 0, or -EBUSY if processes would not go away.
 */
int sbx_cgroup_destroy(sbx_cgroups *cg, sbx_cgroup *c, int wait_ms);

#endif
