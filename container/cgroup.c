/* cgroup.c — cgroup v1 and v2 back-ends; see cgroup.h. */
#include "cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

/* v1 hierarchies.  cpuacct is used only where it is mounted apart from cpu
 * (co-mounted, "cpu,cpuacct", its files are in the cpu directory); it is
 * optional: without it CPU usage reads 0.  v2 uses index 0 alone. */
enum { H_MEMORY = 0, H_PIDS, H_CPU, H_CPUACCT, H_N };
static const char *const hnames[H_N] = {"memory", "pids", "cpu", "cpuacct"};

struct sbx_cgroups {
    enum sbx_cg_mode mode;
    char base[256];
    /* v1: <mount of each controller>/<base>; v2: <delegation cgroup>/<base> in v1dir[0] */
    char dir[H_N][512];
    bool have[H_N];
    bool v2_limits;   /* v2 controllers enabled (false on a hybrid host's bare unified tree) */
    bool cpuacct_with_cpu;
    char desc[128];
};

/* ------------------------------------------------------------------------------ */

static int
write_str(const char *dir, const char *file, const char *val)
{
    char p[600];
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    return sbx_fs_write(p, val);
}

static int
write_u64(const char *dir, const char *file, uint64_t v)
{
    char s[32];
    snprintf(s, sizeof(s), "%llu", (unsigned long long)v);
    return write_str(dir, file, s);
}

static uint64_t
read_u64(const char *dir, const char *file)
{
    char p[600], *buf = NULL;
    size_t n;
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    if (sbx_fs_read(p, 4096, &buf, &n) != 0)
        return 0;
    uint64_t v = strtoull(buf, NULL, 10);
    free(buf);
    return v;
}

/* "key value" lines (memory.events, pids.events, memory.oom_control). */
static uint64_t
read_key(const char *dir, const char *file, const char *key)
{
    char p[600], *buf = NULL;
    size_t n, kn = strlen(key);
    uint64_t v = 0;
    snprintf(p, sizeof(p), "%s/%s", dir, file);
    if (sbx_fs_read(p, 65536, &buf, &n) != 0)
        return 0;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!strncmp(line, key, kn) && line[kn] == ' ')
            v = strtoull(line + kn + 1, NULL, 10);
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return v;
}

/* Is pid listed in dir/cgroup.procs? */
static bool
listed_in(const char *dir, pid_t pid)
{
    char p[600], *buf = NULL;
    size_t n;
    bool found = false;
    snprintf(p, sizeof(p), "%s/cgroup.procs", dir);
    if (sbx_fs_read(p, 1 << 20, &buf, &n) != 0)
        return false;
    for (char *s = buf; *s && !found;) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s)
            break;
        found = v == (long)pid;
        s = end;
        while (*s == '\n')
            s++;
    }
    free(buf);
    return found;
}

/*
 * Kill every process listed in dir/cgroup.procs, by pidfd (pidfd_open(2),
 * pidfd_send_signal(2), Linux 5.3): a pid read from the file is opened,
 * then checked to be listed still — so the pidfd names the process in this
 * cgroup, not one that got the pid after it exited — and only then
 * signalled.  Never by name; never a pid that may have been reused.  Where
 * pidfds are missing (ENOSYS) a listed pid is signalled directly.  Returns
 * how many were listed.
 */
static int
kill_procs(const char *dir)
{
    char p[600], *buf = NULL;
    size_t n;
    int count = 0;
    snprintf(p, sizeof(p), "%s/cgroup.procs", dir);
    if (sbx_fs_read(p, 1 << 20, &buf, &n) != 0)
        return 0;
    for (char *s = buf; *s;) {
        char *end;
        long pid = strtol(s, &end, 10);
        if (end == s)
            break;
        if (pid > 0) {
            int pfd = (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
            if (pfd >= 0) {
                if (listed_in(dir, (pid_t)pid))
                    syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0);
                close(pfd);
            } else if (errno == ENOSYS) {
                kill((pid_t)pid, SIGKILL);
            }
            count++;
        }
        s = end;
        while (*s == '\n')
            s++;
    }
    free(buf);
    return count;
}

static void
sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* rmdir a cgroup directory, killing what is inside, retrying for wait_ms. */
static int
remove_cgdir(const char *dir, bool v2, int wait_ms)
{
    int64_t until = sbx_mono_ms() + wait_ms;
    for (int i = 0;; i++) {
        if (rmdir(dir) == 0 || errno == ENOENT)
            return 0;
        if (errno != EBUSY)
            return -errno;
        if (v2 && write_str(dir, "cgroup.kill", "1") == 0) {
            /* v2 ≥ 5.14 */
        } else {
            kill_procs(dir);
        }
        if (sbx_mono_ms() > until)
            return -EBUSY;
        sleep_ms(i < 10 ? 1 : 10);
    }
}

/* How long the sweeps of a close wait, in all hierarchies together, for
 * the processes they killed to be gone (ms): the kernel tears a sandbox
 * down in ~2.5 ms on 2 cores, and 10,000 of them take 25 s
 * (docs/benchmarks.md, "Density").  An open waits less: what an earlier
 * run left has names of its own, so a cgroup still busy then (its
 * processes still dying, or blocked — on a file system frozen for a fork,
 * which the shard thaws later in its start) stays until the close. */
#define SWEEP_WAIT_MS 60000
#define SWEEP_OPEN_WAIT_MS 5000

/* Call fn(sub, arg) for each child cgroup directory `sub` of dir. */
static void
each_child(const char *dir, void (*fn)(const char *sub, void *arg), void *arg)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || de->d_type != DT_DIR)
            continue;
        char sub[600];
        snprintf(sub, sizeof(sub), "%s/%s", dir, de->d_name);
        fn(sub, arg);
    }
    closedir(d);
}

struct tree_walk {
    bool v2;
    int64_t until; /* remove_tree: the sweep's deadline (sbx_mono_ms) */
    bool stuck;    /* remove_tree: a cgroup was still busy at the deadline */
};

/* SIGKILL every process in dir and the cgroups below it (v2: cgroup.kill,
 * which takes the subtree). */
static void
kill_tree(const char *dir, void *arg)
{
    const struct tree_walk *w = arg;
    if (w->v2 && write_str(dir, "cgroup.kill", "1") == 0)
        return;
    kill_procs(dir);
    each_child(dir, kill_tree, arg);
}

/* Remove dir and every cgroup below it, deepest first; each waits for its
 * processes until w->until. */
static void
remove_tree(const char *dir, void *arg)
{
    struct tree_walk *w = arg;
    each_child(dir, remove_tree, arg);
    if (remove_cgdir(dir, w->v2, (int)SBX_MAX(w->until - sbx_mono_ms(), 0)) == -EBUSY)
        w->stuck = true;
}

/* Remove every child cgroup of dir and, if `self`, dir itself: every
 * process in the subtree is killed first, so that they all die together
 * (one after another, a sweep of thousands of sandboxes waited for each in
 * turn), then the directories go, waiting until `until` (sbx_mono_ms) at
 * most; a cgroup still busy then stays (logged). */
static void
sweep(const char *dir, bool v2, bool self, int64_t until)
{
    struct tree_walk w = {.v2 = v2, .until = until};
    kill_tree(dir, &w);
    if (self)
        remove_tree(dir, &w);
    else
        each_child(dir, remove_tree, &w);
    if (w.stuck)
        sbx_log_warn("cgroup %s: a cgroup below it still has processes; left for now", dir);
}

/* ------------------------------------------------------------------------------ */
/* Detection. */

/* Find the v1 mount point of a controller in /proc/self/mountinfo. */
static int
v1_mount(const char *ctrl, char *out, size_t outlen, bool *with_cpuacct)
{
    char *buf = NULL;
    size_t n;
    int rc = -ENOENT;
    if (sbx_fs_read("/proc/self/mountinfo", 1 << 20, &buf, &n) != 0)
        return -EIO;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        /* id parent major:minor root mountpoint opts [optional…] - fstype source superopts */
        char *sep = strstr(line, " - ");
        if (sep) {
            char mnt[512], fstype[64], src[256], sopts[512];
            if (sscanf(line, "%*s %*s %*s %*s %511s", mnt) == 1 &&
                sscanf(sep + 3, "%63s %255s %511s", fstype, src, sopts) == 3 &&
                !strcmp(fstype, "cgroup")) {
                /* super options: rw,memory or rw,cpu,cpuacct */
                char *save, *tok;
                bool hit = false, acct = false;
                for (tok = strtok_r(sopts, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                    if (!strcmp(tok, ctrl))
                        hit = true;
                    if (!strcmp(tok, "cpuacct"))
                        acct = true;
                }
                if (hit) {
                    snprintf(out, outlen, "%s", mnt);
                    if (with_cpuacct)
                        *with_cpuacct = acct;
                    rc = 0;
                    break;
                }
            }
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return rc;
}

static bool
has_word(const char *list, const char *w)
{
    size_t n = strlen(w);
    for (const char *p = list; (p = strstr(p, w)) != NULL; p += n) {
        if ((p == list || p[-1] == ' ') && (p[n] == '\0' || p[n] == ' ' || p[n] == '\n'))
            return true;
    }
    return false;
}

static int
open_v1(sbx_cgroups *cg, char *why, size_t whylen)
{
    int64_t until = sbx_mono_ms() + SWEEP_OPEN_WAIT_MS; /* the sweeps of all hierarchies */
    for (int h = 0; h < H_N; h++) {
        char mnt[512];
        bool acct = false;
        if (h == H_CPUACCT && cg->cpuacct_with_cpu)
            continue;
        if (v1_mount(hnames[h], mnt, sizeof(mnt), &acct) != 0) {
            if (h == H_CPUACCT)
                continue;
            snprintf(why, whylen, "cgroup v1: no hierarchy for the %s controller", hnames[h]);
            return -ENOENT;
        }
        if (h == H_CPU)
            cg->cpuacct_with_cpu = acct;
        snprintf(cg->dir[h], sizeof(cg->dir[h]), "%s/%s", mnt, cg->base);
        int rc = sbx_mkdir_p(cg->dir[h], 0755);
        if (rc) {
            snprintf(why, whylen, "cgroup v1: mkdir %s", cg->dir[h]);
            return rc;
        }
        cg->have[h] = true;
        sweep(cg->dir[h], false, false, until);
    }
    snprintf(cg->desc, sizeof(cg->desc), "v1 (memory, pids, cpu%s) at %s",
             cg->have[H_CPUACCT] || cg->cpuacct_with_cpu ? ", cpuacct" : "", cg->base);
    return 0;
}

static int
v2_mountpoint(char *out, size_t outlen)
{
    struct statfs sf;
    if (statfs("/sys/fs/cgroup", &sf) == 0 && (unsigned long)sf.f_type == CGROUP2_SUPER_MAGIC) {
        snprintf(out, outlen, "/sys/fs/cgroup");
        return 0;
    }
    if (statfs("/sys/fs/cgroup/unified", &sf) == 0 &&
        (unsigned long)sf.f_type == CGROUP2_SUPER_MAGIC) {
        snprintf(out, outlen, "/sys/fs/cgroup/unified");
        return 0;
    }
    return -ENOENT;
}

static int
v2_own_path(char *out, size_t outlen)
{
    char *buf = NULL;
    size_t n;
    int rc = -ENOENT;
    if (sbx_fs_read("/proc/self/cgroup", 65536, &buf, &n) != 0)
        return -EIO;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        if (!strncmp(line, "0::", 3)) {
            snprintf(out, outlen, "%s", line + 3);
            rc = 0;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return rc;
}

/* Move every process of `from` into `to` (a fresh leaf). */
static void
move_procs(const char *from, const char *to)
{
    char p[600], *buf = NULL;
    size_t n;
    snprintf(p, sizeof(p), "%s/cgroup.procs", from);
    if (sbx_fs_read(p, 1 << 20, &buf, &n) != 0)
        return;
    for (char *s = buf; *s;) {
        char *end;
        long pid = strtol(s, &end, 10);
        if (end == s)
            break;
        char v[32];
        snprintf(v, sizeof(v), "%ld", pid);
        write_str(to, "cgroup.procs", v); /* ESRCH: it exited meanwhile */
        s = end;
        while (*s == '\n')
            s++;
    }
    free(buf);
}

static int
enable_controllers(const char *dir)
{
    return write_str(dir, "cgroup.subtree_control", "+memory +pids +cpu");
}

static int
open_v2(sbx_cgroups *cg, char *why, size_t whylen)
{
    char mnt[256], own[512], deleg[800];
    int rc;

    if ((rc = v2_mountpoint(mnt, sizeof(mnt))) != 0) {
        snprintf(why, whylen, "cgroup v2: no cgroup2 file system mounted");
        return rc;
    }
    if ((rc = v2_own_path(own, sizeof(own))) != 0) {
        snprintf(why, whylen, "cgroup v2: cannot read /proc/self/cgroup");
        return rc;
    }
    snprintf(deleg, sizeof(deleg), "%s%s", mnt, !strcmp(own, "/") ? "" : own);
    /* A sibling shard of `sbxd dev` may already have moved us into the leaf. */
    size_t dl = strlen(deleg);
    static const char leaf[] = "/sbx-supervisor";
    if (dl > sizeof(leaf) - 1 && !strcmp(deleg + dl - (sizeof(leaf) - 1), leaf))
        deleg[dl - (sizeof(leaf) - 1)] = '\0';

    char *ctrls = NULL, *sub = NULL, p[900];
    size_t n;
    snprintf(p, sizeof(p), "%s/cgroup.controllers", deleg);
    if (sbx_fs_read(p, 4096, &ctrls, &n) != 0)
        ctrls = sbx_xstrdup("");
    cg->v2_limits = has_word(ctrls, "memory") && has_word(ctrls, "pids") && has_word(ctrls, "cpu");
    free(ctrls);
    if (cg->v2_limits) {
        snprintf(p, sizeof(p), "%s/cgroup.subtree_control", deleg);
        if (sbx_fs_read(p, 4096, &sub, &n) != 0)
            sub = sbx_xstrdup("");
        bool enabled = has_word(sub, "memory") && has_word(sub, "pids") && has_word(sub, "cpu");
        free(sub);
        if (!enabled) {
            /* No internal processes: move them into a leaf, then enable. */
            char leafdir[900];
            snprintf(leafdir, sizeof(leafdir), "%s%s", deleg, leaf);
            if (strcmp(deleg, mnt) != 0) {
                if (mkdir(leafdir, 0755) < 0 && errno != EEXIST) {
                    rc = -errno;
                    snprintf(why, whylen, "cgroup v2: mkdir %s", leafdir);
                    return rc;
                }
                move_procs(deleg, leafdir);
            }
            if ((rc = enable_controllers(deleg)) != 0) {
                snprintf(why, whylen,
                         "cgroup v2: cannot enable memory, pids and cpu in %s (is the "
                         "subtree delegated? run sbxd with Delegate=yes)", deleg);
                return rc;
            }
        }
    }
    /* Create base level by level, enabling controllers on the way down. */
    char path[900];
    snprintf(path, sizeof(path), "%s", deleg);
    char basecopy[256];
    snprintf(basecopy, sizeof(basecopy), "%s", cg->base);
    char *save, *tok;
    for (tok = strtok_r(basecopy, "/", &save); tok; tok = strtok_r(NULL, "/", &save)) {
        size_t l = strlen(path);
        snprintf(path + l, sizeof(path) - l, "/%s", tok);
        if (mkdir(path, 0755) < 0 && errno != EEXIST) {
            rc = -errno;
            snprintf(why, whylen, "cgroup v2: mkdir %s", path);
            return rc;
        }
        if (cg->v2_limits && (rc = enable_controllers(path)) != 0) {
            snprintf(why, whylen, "cgroup v2: enable controllers in %s", path);
            return rc;
        }
    }
    snprintf(cg->dir[0], sizeof(cg->dir[0]), "%s", path);
    cg->have[0] = true;
    sweep(cg->dir[0], true, false, sbx_mono_ms() + SWEEP_OPEN_WAIT_MS);
    snprintf(cg->desc, sizeof(cg->desc), "v2%s at %s", cg->v2_limits ? " (memory, pids, cpu)" :
             " WITHOUT controllers: no limits", path);
    if (!cg->v2_limits)
        sbx_log_warn("cgroup v2 at %s has no memory/pids/cpu controllers: sandboxes run without "
                 "resource limits", path);
    return 0;
}

int
sbx_cgroups_open(sbx_cgroups **out, const char *mode, const char *base, char *why, size_t whylen)
{
    sbx_cgroups *cg = sbx_xcalloc(1, sizeof(*cg));
    int rc = 0;
    snprintf(cg->base, sizeof(cg->base), "%s", base);
    if (!mode || !*mode || !strcmp(mode, "auto")) {
        struct statfs sf;
        if (statfs("/sys/fs/cgroup", &sf) == 0 && (unsigned long)sf.f_type == CGROUP2_SUPER_MAGIC)
            mode = "v2";
        else
            mode = "v1";
    }
    if (!strcmp(mode, "v1")) {
        cg->mode = SBX_CG_V1;
        rc = open_v1(cg, why, whylen);
    } else if (!strcmp(mode, "v2")) {
        cg->mode = SBX_CG_V2;
        rc = open_v2(cg, why, whylen);
    } else if (!strcmp(mode, "none")) {
        cg->mode = SBX_CG_NONE;
        snprintf(cg->desc, sizeof(cg->desc), "none (no resource limits)");
    } else {
        snprintf(why, whylen, "unknown cgroup mode '%s' (auto, v1, v2 or none)", mode);
        rc = -EINVAL;
    }
    if (rc) {
        free(cg);
        return rc;
    }
    *out = cg;
    return 0;
}

void
sbx_cgroups_close(sbx_cgroups *cg)
{
    if (!cg)
        return;
    int64_t until = sbx_mono_ms() + SWEEP_WAIT_MS;
    for (int h = 0; h < H_N; h++) {
        if (!cg->have[h])
            continue;
        sweep(cg->dir[h], cg->mode == SBX_CG_V2, true, until);
        /* Parent levels of base ("sbx") are shared with other shards: only
         * removed when empty. */
        char parent[512];
        snprintf(parent, sizeof(parent), "%s", cg->dir[h]);
        char *slash = strrchr(parent, '/');
        if (slash && strchr(cg->base, '/')) {
            *slash = '\0';
            rmdir(parent);
        }
    }
    free(cg);
}

int
sbx_cgroups_set_share(sbx_cgroups *cg, unsigned procs)
{
    int h = cg->mode == SBX_CG_V1 ? H_CPU : 0;
    if (procs == 0 || cg->mode == SBX_CG_NONE || (cg->mode == SBX_CG_V2 && !cg->v2_limits) ||
        !cg->have[h])
        return 0;
    /* The top directory: dir[h] less what follows the base's first level. */
    char top[512];
    snprintf(top, sizeof(top), "%s", cg->dir[h]);
    const char *rest = strchr(cg->base, '/');
    size_t tl = strlen(top), rl = rest ? strlen(rest) : 0;
    if (rl < tl)
        top[tl - rl] = '\0';
    uint64_t v;
    int rc;
    if (cg->mode == SBX_CG_V1) {
        v = (uint64_t)procs * 1024;
        v = v < 2 ? 2 : v > 262144 ? 262144 : v;
        rc = write_u64(top, "cpu.shares", v);
    } else {
        v = (uint64_t)procs * 100;
        v = v > 10000 ? 10000 : v;
        rc = write_u64(top, "cpu.weight", v);
        /* The shard's leaf beside the tree, when it made one. */
        char leaf[600];
        snprintf(leaf, sizeof(leaf), "%s", top);
        char *slash = strrchr(leaf, '/');
        if (rc == 0 && slash) {
            snprintf(slash, sizeof(leaf) - (size_t)(slash - leaf), "/sbx-supervisor");
            struct stat st;
            if (stat(leaf, &st) == 0)
                rc = write_u64(leaf, "cpu.weight", v);
        }
    }
    return rc;
}

enum sbx_cg_mode
sbx_cgroups_mode(const sbx_cgroups *cg)
{
    return cg->mode;
}

bool
sbx_cgroups_limited(const sbx_cgroups *cg)
{
    return cg->mode == SBX_CG_V1 || (cg->mode == SBX_CG_V2 && cg->v2_limits);
}

const char *
sbx_cgroups_describe(const sbx_cgroups *cg)
{
    return cg->desc;
}

/* ------------------------------------------------------------------------------ */

static void
cgdir(const sbx_cgroups *cg, int h, const sbx_cgroup *c, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s/%s", cg->dir[h], c->name);
}

/*
 * Write lim into c's controllers.  fresh: c was made just now, so its v1
 * pids.max is "max", its cpu.cfs_period_us 100000 and its cpu.cfs_quota_us
 * -1 already (the kernel's defaults for a new cgroup) and only the values
 * that differ are written.  Each write of either cfs file walks every CPU
 * cgroup of the host under a global mutex (kernel/sched/core.c
 * tg_set_cfs_bandwidth → __cfs_schedulable → walk_tg_tree), whatever the
 * value: three writes per new sandbox cost three walks, which grow with
 * the sandboxes present (docs/benchmarks.md, "Density").  0 or -errno.
 */
static int
apply_limits(sbx_cgroups *cg, sbx_cgroup *c, const struct sbx_limits *lim, bool fresh)
{
    char d[600];
    int rc = 0;
    if (cg->mode == SBX_CG_V1) {
        cgdir(cg, H_MEMORY, c, d, sizeof(d));
        if (lim->memory) {
            /* memsw must stay ≥ the memory limit: try both orders. */
            rc = write_u64(d, "memory.limit_in_bytes", lim->memory);
            int r2 = write_u64(d, "memory.memsw.limit_in_bytes", lim->memory);
            if (rc)
                rc = write_u64(d, "memory.limit_in_bytes", lim->memory);
            if (rc)
                return rc;
            (void)r2; /* absent without swap accounting: no swap to escape to then */
            /* TCP socket buffers are charged to a v1 memory cgroup only
             * once it has a kmem.tcp limit (v2 charges them to memory.max):
             * without one a sandbox pins host memory in unread sockets
             * (issue 16 item 6).  A quarter of the memory limit, at least
             * 16 MiB; absent on kernels without v1 kmem accounting. */
            uint64_t tcp = SBX_MAX(lim->memory / 4, (uint64_t)16 << 20);
            int r3 = write_u64(d, "memory.kmem.tcp.limit_in_bytes", tcp);
            if (r3 && r3 != -ENOENT)
                sbx_log_warn("cgroup %s: memory.kmem.tcp.limit_in_bytes: %s", d, strerror(-r3));
        }
        cgdir(cg, H_PIDS, c, d, sizeof(d));
        if (!fresh && (rc = write_str(d, "pids.max", "max")) != 0)
            return rc;
        if (lim->pids && (rc = write_u64(d, "pids.max", lim->pids)) != 0)
            return rc;
        cgdir(cg, H_CPU, c, d, sizeof(d));
        if (!fresh && (rc = write_str(d, "cpu.cfs_period_us", "100000")) != 0)
            return rc;
        if (!fresh)
            rc = write_str(d, "cpu.cfs_quota_us", "-1");
        if (!rc && lim->cpu_milli)
            rc = write_u64(d, "cpu.cfs_quota_us", (uint64_t)lim->cpu_milli * 100);
        return rc;
    }
    if (cg->mode == SBX_CG_V2 && cg->v2_limits) {
        cgdir(cg, 0, c, d, sizeof(d));
        char v[64];
        if (lim->memory)
            snprintf(v, sizeof(v), "%llu", (unsigned long long)lim->memory);
        else
            snprintf(v, sizeof(v), "max");
        if ((rc = write_str(d, "memory.max", v)) != 0)
            return rc;
        write_str(d, "memory.swap.max", "0"); /* absent without swap */
        /* One victim per OOM, chosen by oom_score_adj (tenant processes
         * +500, the agent below): a group kill would end the agent, and
         * the container, with every OOM of the sandbox (issue 16 item 8). */
        write_str(d, "memory.oom.group", "0");
        if (lim->pids)
            snprintf(v, sizeof(v), "%u", lim->pids);
        else
            snprintf(v, sizeof(v), "max");
        if ((rc = write_str(d, "pids.max", v)) != 0)
            return rc;
        if (lim->cpu_milli)
            snprintf(v, sizeof(v), "%u 100000", lim->cpu_milli * 100);
        else
            snprintf(v, sizeof(v), "max 100000");
        rc = write_str(d, "cpu.max", v);
    }
    return rc;
}

int
sbx_cgroup_set_limits(sbx_cgroups *cg, sbx_cgroup *c, const struct sbx_limits *lim)
{
    return apply_limits(cg, c, lim, false);
}

int
sbx_cgroup_create(sbx_cgroups *cg, const char *name, const struct sbx_limits *lim, sbx_cgroup *out)
{
    char d[600];
    int rc = 0;
    memset(out, 0, sizeof(*out));
    snprintf(out->name, sizeof(out->name), "%s", name);
    out->v2_fd = -1;
    if (cg->mode == SBX_CG_NONE)
        return 0;
    out->created = true; /* from here a failure removes what was made */
    for (int h = 0; h < H_N; h++) {
        if (!cg->have[h])
            continue;
        cgdir(cg, h, out, d, sizeof(d));
        if (mkdir(d, 0755) < 0) {
            rc = -errno;
            goto fail;
        }
    }
    if ((rc = apply_limits(cg, out, lim, true)) != 0)
        goto fail;
    if (cg->mode == SBX_CG_V2) {
        cgdir(cg, 0, out, d, sizeof(d));
        out->v2_fd = open(d, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (out->v2_fd < 0) {
            rc = -errno;
            goto fail;
        }
    }
    return 0;
fail:
    sbx_cgroup_destroy(cg, out, 100);
    return rc;
}

int
sbx_cgroup_attach(sbx_cgroups *cg, sbx_cgroup *c, pid_t pid)
{
    char d[600], v[32];
    snprintf(v, sizeof(v), "%d", (int)pid);
    for (int h = 0; h < H_N; h++) {
        if (!cg->have[h])
            continue;
        cgdir(cg, h, c, d, sizeof(d));
        int rc = write_str(d, "cgroup.procs", v);
        if (rc)
            return rc;
    }
    return 0;
}

int
sbx_cgroup_open_tasks(sbx_cgroups *cg, sbx_cgroup *c, int fds[SBX_CG_MAX_HIER], int *n)
{
    _Static_assert(H_N <= SBX_CG_MAX_HIER, "SBX_CG_MAX_HIER is too small");
    char d[600], p[640];
    *n = 0;
    if (cg->mode != SBX_CG_V1)
        return 0;
    for (int h = 0; h < H_N; h++) {
        if (!cg->have[h])
            continue;
        cgdir(cg, h, c, d, sizeof(d));
        snprintf(p, sizeof(p), "%s/tasks", d);
        int fd = open(p, O_WRONLY | O_CLOEXEC);
        if (fd < 0) {
            int rc = -errno;
            while (*n > 0)
                close(fds[--*n]);
            return rc;
        }
        fds[(*n)++] = fd;
    }
    return 0;
}

int
sbx_cgroup_stats(sbx_cgroups *cg, sbx_cgroup *c, struct sbx_cgroup_stats *st)
{
    char d[600];
    memset(st, 0, sizeof(*st));
    if (cg->mode == SBX_CG_V1) {
        cgdir(cg, H_MEMORY, c, d, sizeof(d));
        st->oom_kills = read_key(d, "memory.oom_control", "oom_kill");
        st->memory_current = read_u64(d, "memory.usage_in_bytes");
        st->memory_peak = read_u64(d, "memory.max_usage_in_bytes");
        cgdir(cg, H_PIDS, c, d, sizeof(d));
        st->pids_max_hits = read_key(d, "pids.events", "max");
        st->pids_current = read_u64(d, "pids.current");
        if (cg->cpuacct_with_cpu || cg->have[H_CPUACCT]) {
            cgdir(cg, cg->cpuacct_with_cpu ? H_CPU : H_CPUACCT, c, d, sizeof(d));
            st->cpu_usage_us = read_u64(d, "cpuacct.usage") / 1000;
        }
    } else if (cg->mode == SBX_CG_V2) {
        cgdir(cg, 0, c, d, sizeof(d));
        st->oom_kills = read_key(d, "memory.events", "oom_kill");
        st->memory_current = read_u64(d, "memory.current");
        st->memory_peak = read_u64(d, "memory.peak");
        st->pids_max_hits = read_key(d, "pids.events", "max");
        st->pids_current = read_u64(d, "pids.current");
        st->cpu_usage_us = read_key(d, "cpu.stat", "usage_usec");
    }
    return 0;
}

int
sbx_cgroup_limit_hits(sbx_cgroups *cg, sbx_cgroup *c, struct sbx_cgroup_stats *st)
{
    char d[600];
    memset(st, 0, sizeof(*st));
    if (cg->mode == SBX_CG_NONE)
        return 0;
    bool v1 = cg->mode == SBX_CG_V1;
    cgdir(cg, v1 ? H_MEMORY : 0, c, d, sizeof(d));
    st->oom_kills = read_key(d, v1 ? "memory.oom_control" : "memory.events", "oom_kill");
    cgdir(cg, v1 ? H_PIDS : 0, c, d, sizeof(d));
    st->pids_max_hits = read_key(d, "pids.events", "max");
    return 0;
}

int
sbx_cgroup_destroy(sbx_cgroups *cg, sbx_cgroup *c, int wait_ms)
{
    char d[600];
    int rc = 0;
    if (c->v2_fd >= 0) {
        close(c->v2_fd);
        c->v2_fd = -1;
    }
    if (!c->created || cg->mode == SBX_CG_NONE)
        return 0;
    for (int h = 0; h < H_N; h++) {
        if (!cg->have[h])
            continue;
        cgdir(cg, h, c, d, sizeof(d));
        int r = remove_cgdir(d, cg->mode == SBX_CG_V2, wait_ms);
        if (r && !rc)
            rc = r;
    }
    if (rc == 0)
        c->created = false;
    return rc;
}
