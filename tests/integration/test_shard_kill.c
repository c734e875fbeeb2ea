/*
 * test_shard_kill.c — a SIGKILLed shard leaves nothing behind and never
 * takes its deployment down (issue 11, "process hygiene").
 *
 * A shard clones one child per container (container/spawn.c).  Until its
 * exec that child holds every descriptor of the shard — LMDB, the host locks
 * in /run/sbx, the shard's end of other containers' channels — so one that
 * outlives the shard keeps the next incarnation from taking its locks and
 * keeps agents of the dead shard running.  This test SIGKILLs the shards of
 * a private `sbxd dev` at random moments while a client creates sandboxes
 * one after another and each shard refills its warm pool (so kills land at
 * every step of container creation), and checks:
 *   - after each kill, within a bound, no process of the killed incarnation
 *     is left (a process of the deployment — a shard's clone or an agent —
 *     whose parent is no live shard of it);
 *   - the deployment stays up, and a sandbox answers again afterwards;
 *   - after the deployment stops: no process, cgroup, mount or host lock of
 *     it remains.
 * The number of kills is $SBX_SHARD_KILLS (default 25; `make faults` runs
 * 200).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/harness.h"

/* Read a small /proc file into buf (NULs of cmdline become spaces); 0 or -1. */
static int
proc_read(pid_t pid, const char *file, char *buf, size_t len)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
    FILE *f = fopen(path, "re");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, len - 1, f);
    fclose(f);
    for (size_t i = 0; i + 1 < n; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    buf[n] = '\0';
    return 0;
}

static pid_t
proc_ppid(pid_t pid)
{
    char st[512];
    if (proc_read(pid, "stat", st, sizeof(st)) != 0)
        return -1;
    char *rp = strrchr(st, ')');
    int ppid = -1;
    if (!rp || sscanf(rp + 2, "%*c %d", &ppid) != 1)
        return -1;
    return ppid;
}

/* Is pid a process of deployment `name`: a shard or a shard's clone (its
 * command line names "--name=<name>-s"), or an agent (PID 1 of a sandbox)
 * in one of the deployment's cgroups ("/sbx/<name>-s" in /proc/PID/cgroup)?
 * The processes inside a sandbox are not counted: the kernel kills them
 * with their agent (pid_namespaces(7)). */
static bool
of_deployment(pid_t pid, const char *name)
{
    char buf[4096], key[96];
    snprintf(key, sizeof(key), "--name=%s-s", name);
    if (proc_read(pid, "cmdline", buf, sizeof(buf)) == 0 && strstr(buf, key))
        return true;
    if (proc_read(pid, "comm", buf, sizeof(buf)) != 0 || strcmp(buf, "sbx-agent\n") != 0)
        return false;
    snprintf(key, sizeof(key), "/sbx/%s-s", name);
    return proc_read(pid, "cgroup", buf, sizeof(buf)) == 0 && strstr(buf, key);
}

/* The live shards of the dev supervisor `dev`: its children. */
static int
live_shards(pid_t dev, pid_t *out, int max)
{
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL && n < max) {
        pid_t p = (pid_t)atoi(de->d_name);
        if (p > 0 && proc_ppid(p) == dev)
            out[n++] = p;
    }
    if (d)
        closedir(d);
    return n;
}

/*
 * leftovers — processes of the deployment whose parent is neither the
 * supervisor nor a live shard (so: of a dead incarnation).  Writes up to
 * `max` of them to out; returns how many there are.
 */
static int
leftovers(pid_t dev, const char *name, pid_t *out, int max)
{
    pid_t live[16];
    int nlive = dev > 0 ? live_shards(dev, live, 16) : 0;
    int n = 0;
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        pid_t p = (pid_t)atoi(de->d_name);
        if (p <= 0 || p == dev || !of_deployment(p, name))
            continue;
        pid_t pp = proc_ppid(p);
        bool parented = pp == dev && dev > 0;
        for (int i = 0; i < nlive && !parented; i++)
            parented = pp == live[i];
        if (pp < 0 || parented)
            continue;
        if (n < max)
            out[n] = p;
        n++;
    }
    if (d)
        closedir(d);
    return n;
}

struct creator {
    const char *url;
    atomic_bool stop;
    atomic_int ok, failed;
};

/* Create sandboxes one after another (exec `true` on new IDs). */
static void *
creator_main(void *arg)
{
    struct creator *cr = arg;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, cr->url, &err) != 0) {
        sbx_error_free(&err);
        return NULL;
    }
    for (int i = 0; !atomic_load(&cr->stop); i++) {
        char id[64];
        snprintf(id, sizeof(id), "k%d-%d", (int)getpid(), i);
        sbx_exec_result r;
        if (test_sh(c, id, "true", 5000, &r, &err) == 0) {
            atomic_fetch_add(&cr->ok, 1);
            sbx_exec_result_free(&r);
        } else {
            atomic_fetch_add(&cr->failed, 1);
            sbx_error_free(&err);
            usleep(20 * 1000); /* SHARD_UNAVAILABLE comes at once while a shard is down */
        }
    }
    sbx_client_close(c);
    return NULL;
}

/* Is any cgroup directory of the deployment left in a v1 hierarchy or v2? */
static bool
cgroups_left(const char *name, char *which, size_t wlen)
{
    DIR *root = opendir("/sys/fs/cgroup");
    struct dirent *h;
    bool left = false;
    char prefix[80];
    snprintf(prefix, sizeof(prefix), "%s-s", name);
    while (root && !left && (h = readdir(root)) != NULL) {
        if (h->d_name[0] == '.')
            continue;
        static const char *const subs[] = {"sbx", "unified/sbx", ""};
        for (size_t k = 0; k < 3 && !left; k++) {
            char dir[512];
            snprintf(dir, sizeof(dir), "/sys/fs/cgroup/%s/%s", h->d_name, subs[k]);
            DIR *d = opendir(dir);
            struct dirent *e;
            while (d && (e = readdir(d)) != NULL) {
                if (!strncmp(e->d_name, prefix, strlen(prefix))) {
                    snprintf(which, wlen, "%s/%s", dir, e->d_name);
                    left = true;
                    break;
                }
            }
            if (d)
                closedir(d);
        }
    }
    if (root)
        closedir(root);
    return left;
}

static unsigned
rnd(unsigned *seed, unsigned n)
{
    *seed = *seed * 1103515245u + 12345u;
    return (*seed >> 16) % n;
}

/* The test's deployment, stopped by cleanup() also when an assertion ends
 * the test early; `stopped` once the test stopped it itself. */
static struct testd d;
static bool stopped;

/* Stop the deployment, then SIGKILL by pid whatever of it is still left
 * (what a failing run found), so a failure leaves the host clean too. */
static void
cleanup(void)
{
    if (!stopped && d.pid > 0)
        testd_stop(&d);
    pid_t left[64];
    int n = leftovers(0, d.name, left, 64);
    for (int i = 0; i < n && i < 64; i++)
        kill(left[i], SIGKILL);
}

Test(shard_kill, random_kills_leave_nothing_and_keep_the_deployment, .timeout = 900,
     .fini = cleanup)
{
    int kills = getenv("SBX_SHARD_KILLS") ? atoi(getenv("SBX_SHARD_KILLS")) : 25;
    static const char *const extra[] = {"--pool", "2", NULL};
    cr_assert_eq(testd_start(&d, 2, extra), 0);
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    fprintf(stderr, "shard_kill: %d kills, seed %u, deployment %s\n", kills, seed, d.name);

    struct creator cr = {.url = d.url};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, creator_main, &cr), 0);
    int done = 0, worst_ms = 0;
    /* Until `kills` shards were killed (a victim may exit by itself between
     * the look-up and the kill: then another try, at most 2 × kills). */
    for (int k = 0; done < kills && k < 2 * kills; k++) {
        pid_t live[16];
        int n = 0;
        /* The supervisor restarts with back-off: wait for a shard to kill. */
        for (int w = 0; w < 200 && (n = live_shards(d.pid, live, 16)) == 0; w++)
            usleep(50 * 1000);
        cr_assert_gt(n, 0, "no shard came back after kill %d (see %s)", k, d.log);
        /* A random moment: shards spend most of their early life creating
         * their pool's containers, and the creator adds its own. */
        usleep(rnd(&seed, 300) * 1000);
        pid_t victim = live[rnd(&seed, (unsigned)n)];
        if (kill(victim, SIGKILL) != 0)
            continue;
        done++;
        /* Nothing of the dead incarnation may survive it for long. */
        double t0 = test_now_ms();
        pid_t left[8];
        int nl;
        while ((nl = leftovers(d.pid, d.name, left, 8)) > 0 && test_now_ms() - t0 < 5000)
            usleep(20 * 1000);
        int took = (int)(test_now_ms() - t0);
        worst_ms = took > worst_ms ? took : worst_ms;
        if (nl > 0) {
            char cmd[4096] = "";
            proc_read(left[0], "cmdline", cmd, sizeof(cmd));
            cr_assert_fail("kill %d of shard %d: %d process(es) of it left after 5 s, e.g. pid "
                           "%d (parent %d): %s", k, (int)victim, nl, (int)left[0],
                           (int)proc_ppid(left[0]), cmd);
        }
        cr_assert(kill(d.pid, 0) == 0, "the deployment stopped after kill %d (see %s)", k, d.log);
    }
    atomic_store(&cr.stop, true);
    pthread_join(th, NULL);
    fprintf(stderr, "shard_kill: %d kills done; creates ok %d, failed %d; leftovers gone within "
            "%d ms at worst\n", done, atomic_load(&cr.ok), atomic_load(&cr.failed), worst_ms);
    cr_expect_gt(atomic_load(&cr.ok), 0, "no sandbox was created during the run");

    /* Service is back: a sandbox answers within the supervisor's back-off
     * (at most 5 s) plus a shard's start. */
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    bool back = false;
    double t0 = test_now_ms();
    while (!back && test_now_ms() - t0 < 15000) {
        sbx_exec_result r;
        if (test_sh(c, "after-kills", "echo back", 3000, &r, &err) == 0) {
            back = r.stdout_data && !strcmp(r.stdout_data, "back\n");
            sbx_exec_result_free(&r);
        } else {
            sbx_error_free(&err);
            usleep(100 * 1000);
        }
    }
    cr_expect(back, "no sandbox answered within 15 s of the last kill");
    sbx_client_close(c);

    /* Stopped: nothing of the deployment is left on the host. */
    char name[64], dir[256];
    snprintf(name, sizeof(name), "%s", d.name);
    snprintf(dir, sizeof(dir), "%s", d.dir);
    testd_stop(&d);
    stopped = true;
    pid_t left[8];
    int nl = 0;
    for (int w = 0; w < 100 && (nl = leftovers(0, name, left, 8)) > 0; w++)
        usleep(50 * 1000);
    cr_expect_eq(nl, 0, "%d process(es) of the deployment left after it stopped (pid %d)", nl,
                 nl ? (int)left[0] : 0);
    char which[600];
    cr_expect(!cgroups_left(name, which, sizeof(which)), "cgroup left: %s", which);
    char mounts[1 << 16];
    FILE *f = fopen("/proc/self/mountinfo", "re");
    size_t mn = f ? fread(mounts, 1, sizeof(mounts) - 1, f) : 0;
    if (f)
        fclose(f);
    mounts[mn] = '\0';
    cr_expect(!strstr(mounts, dir), "a mount under %s is left", dir);
    DIR *ld = opendir("/run/sbx");
    struct dirent *e;
    while (ld && (e = readdir(ld)) != NULL)
        cr_expect(!strstr(e->d_name, name), "host lock file left: /run/sbx/%s", e->d_name);
    if (ld)
        closedir(ld);
}
