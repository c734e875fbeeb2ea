/*
 * faults_util.c — the fault-injection tests' shared helpers and supervised
 * cluster (faults_util.h).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"
#include "faults_util.h"

/* ---------------------------------------------------------------------------------- */
/* Small helpers. */

unsigned
seed_from_env(void)
{
    const char *s = getenv("SBX_FAULT_SEED");
    unsigned seed = s && *s ? (unsigned)strtoul(s, NULL, 10) : (unsigned)(time(NULL) ^ getpid());
    cr_log_info("seed %u (SBX_FAULT_SEED=%u replays it)", seed, seed);
    return seed;
}

const char *
bin_dir(void)
{
    const char *b = getenv("SBX_BIN");
    return b && *b ? b : "build/asan/bin";
}

/* Run a shell command line of our own (mdb_stat & co.); its exit status. */
int
run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
int
run(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd), fmt, ap);
    va_end(ap);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

/* The "Entries:" of one named database, from mdb_stat; -1 on failure. */
long
mdb_entries(const char *dir, const char *db)
{
    char cmd[600], line[256];
    long n = -1;
    snprintf(cmd, sizeof(cmd), "mdb_stat -s %s %s 2>&1", db, dir);
    FILE *f = popen(cmd, "r");
    if (!f)
        return -1;
    while (fgets(line, sizeof(line), f))
        if (sscanf(line, " Entries: %ld", &n) == 1)
            break;
    if (pclose(f) != 0)
        n = -1;
    return n;
}

/* Wait for our child pid to end (it was SIGKILLed or SIGTERMed). */
void
reap(pid_t pid, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    int st;
    while (waitpid(pid, &st, WNOHANG) == 0) {
        if (test_now_ms() > until) {
            kill(pid, SIGKILL);
            waitpid(pid, &st, 0);
            return;
        }
        tsleep_ms(5);
    }
}

/* /proc/<pid>/cmdline with NULs as spaces ("" if gone). */
void
cmdline_of(pid_t pid, char *out, size_t n)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t k = read(fd, out, n - 1);
    close(fd);
    if (k <= 0)
        return;
    for (ssize_t i = 0; i < k; i++)
        if (!out[i])
            out[i] = ' ';
    out[k] = '\0';
}

/*
 * The children of `parent` (every thread's /proc/<pid>/task/<tid>/children)
 * whose command line contains `needle`; up to max pids in out.  This is how
 * the shards of an `sbxd dev` are found: never by name.
 */
int
children_matching(pid_t parent, const char *needle, pid_t *out, int max)
{
    char dir[64];
    snprintf(dir, sizeof(dir), "/proc/%d/task", (int)parent);
    DIR *d = opendir(dir);
    int n = 0;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL && n < max) {
        if (de->d_name[0] == '.')
            continue;
        char path[128], *buf = NULL;
        size_t len;
        snprintf(path, sizeof(path), "%s/%s/children", dir, de->d_name);
        if (sbx_fs_read(path, 1 << 16, &buf, &len) != 0)
            continue;
        char *save = NULL;
        for (char *t = strtok_r(buf, " \n", &save); t && n < max;
             t = strtok_r(NULL, " \n", &save)) {
            char cl[1024];
            pid_t pid = (pid_t)atoi(t);
            cmdline_of(pid, cl, sizeof(cl));
            if (strstr(cl, needle))
                out[n++] = pid;
        }
        free(buf);
    }
    closedir(d);
    return n;
}

/* An error a client may see while a shard or gateway is down. */
bool
outage_error(const char *code)
{
    return !strcmp(code, "SHARD_UNAVAILABLE") || !strcmp(code, "GATEWAY_UNAVAILABLE") ||
           !strcmp(code, "REQUEST_TIMEOUT") || !strcmp(code, "OPERATION_INTERRUPTED");
}

/* ---------------------------------------------------------------------------------- */

/*
 * What a failed assertion would leave behind (it leaves the test function
 * at once): the cluster, a daemon, a mount.  Each test that makes one names
 * it here and `.fini = cleanup` undoes whatever is still there.
 */
struct cluster *live_cluster;
struct testd *live_testd;
char live_mount[64];

pid_t
spawn_argv(const char *log, const char *const *argv)
{
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork");
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        /* A test process that dies takes its daemons with it. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    return pid;
}

void
shard_spawn(struct cluster *c, int i)
{
    char sbxd[512];
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin_dir());
    struct node *n = &c->shard[i];
    char name[80], listen[340], data[340], uid[48];
    snprintf(name, sizeof(name), "--name=%s", n->name);
    snprintf(listen, sizeof(listen), "--listen=%s", n->url);
    snprintf(data, sizeof(data), "--data=%s", n->data);
    snprintf(uid, sizeof(uid), "--uid-base=%s", n->uid);
    const char *argv[] = {sbxd, "shard", name, listen, data, uid, "--pool", "0", "--memory",
                          "256M", "--pids", "128", "--disk", "64M", NULL};
    n->pid = spawn_argv(c->log, argv);
}

void
gw_spawn(struct cluster *c)
{
    char sbxd[512], listen[340];
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin_dir());
    snprintf(listen, sizeof(listen), "--listen=%s", c->gw.url);
    const char *argv[16] = {sbxd, "gateway", "--name", c->gw.name, listen};
    int k = 5;
    for (int i = 0; i < c->nshards; i++) {
        argv[k++] = "--shard";
        argv[k++] = c->gw_shards[i];
    }
    argv[k] = NULL;
    c->gw.pid = spawn_argv(c->log, argv);
}

void
cluster_print_log(const struct cluster *c)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(c->log, 1 << 20, &buf, &n) == 0) {
        fprintf(stderr, "---- cluster log (%s) ----\n%s\n---- end ----\n", c->log, buf);
        free(buf);
    }
}

/* For a failure message: does each process answer on its own? */
void
cluster_diagnose(const struct cluster *c)
{
    for (int i = -1; i < c->nshards; i++) {
        const struct node *n = i < 0 ? &c->gw : &c->shard[i];
        sbx_client *cl = NULL;
        sbx_reply *r = NULL;
        sbx_error err = {0};
        int rc = sbx_client_open(&cl, n->url, &err);
        if (rc == 0)
            rc = sbx_call(cl, "cluster.status", NULL, NULL, 0, 3000, NULL, &r, &err);
        char *js = rc == 0 ? sbx_reply_json(r, false) : NULL;
        fprintf(stderr, "diagnose: %s (pid %d, %s): %s %s\n", n->name, (int)n->pid,
                n->pid > 0 && kill(n->pid, 0) == 0 ? "alive" : "gone", rc ? err.code : "answers",
                rc ? err.message : js);
        free(js);
        sbx_reply_free(r);
        sbx_error_free(&err);
        sbx_client_close(cl);
    }
}

void
cluster_ready(struct cluster *c)
{
    if (testd_wait_ready(c->gw.url, 30000) != 0) {
        cluster_print_log(c);
        cluster_diagnose(c);
        cr_assert_fail("the cluster did not become ready");
    }
}

void
cluster_start(struct cluster *c, int nshards)
{
    memset(c, 0, sizeof(*c));
    snprintf(c->dir, sizeof(c->dir), "/tmp/sbx-faults-%sXXXXXX", test_prefix());
    cr_assert(mkdtemp(c->dir) != NULL, "mkdtemp");
    live_cluster = c;
    /* Shard and cgroup names derive from the directory: unique per run. */
    snprintf(c->name, sizeof(c->name), "f%s", strrchr(c->dir, '-') + 1);
    for (char *p = c->name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
            *p = (*p >= 'A' && *p <= 'Z') ? (char)(*p - 'A' + 'a') : 'x';
    snprintf(c->log, sizeof(c->log), "%s/cluster.log", c->dir);
    c->nshards = nshards;
    /* Host uids of our own, away from the ranges of `sbxd dev` daemons. */
    unsigned base = 1500000000u + (unsigned)(getpid() % 4000) * 4u * 65536u;
    char dir[256], name[32];
    snprintf(dir, sizeof(dir), "%s", c->dir);
    snprintf(name, sizeof(name), "%s", c->name);
    for (int i = 0; i < nshards; i++) {
        struct node *n = &c->shard[i];
        snprintf(n->name, sizeof(n->name), "%s-s%d", name, i);
        snprintf(n->url, sizeof(n->url), "ipc://%s/s%d.sock", dir, i);
        snprintf(n->data, sizeof(n->data), "%s/s%d", dir, i);
        snprintf(n->uid, sizeof(n->uid), "%u", base + (unsigned)i * 65536u);
        snprintf(c->gw_shards[i], sizeof(c->gw_shards[i]), "%s-s%d=ipc://%s/s%d.sock", name, i,
                 dir, i);
        shard_spawn(c, i);
    }
    snprintf(c->gw.name, sizeof(c->gw.name), "%s-gw", name);
    snprintf(c->gw.url, sizeof(c->gw.url), "ipc://%s/gw.sock", dir);
    gw_spawn(c);
    cluster_ready(c);
}

/* SIGTERM everything (gateway first), wait, keep the data unless told. */
void
cluster_stop(struct cluster *c, bool remove)
{
    struct node *all[5];
    int n = 0;
    all[n++] = &c->gw;
    for (int i = 0; i < c->nshards; i++)
        all[n++] = &c->shard[i];
    for (int i = 0; i < n; i++)
        if (all[i]->pid > 0)
            kill(all[i]->pid, SIGTERM);
    for (int i = 0; i < n; i++) {
        if (all[i]->pid > 0)
            reap(all[i]->pid, 20000);
        all[i]->pid = 0;
    }
    if (remove && c->dir[0] && !getenv("SBX_KEEP_TEST_DATA"))
        sbx_rm_rf(c->dir);
    if (remove)
        live_cluster = NULL;
}

void cluster_stop(struct cluster *c, bool remove);

void
cleanup(void)
{
    if (live_cluster)
        cluster_stop(live_cluster, true);
    if (live_testd && live_testd->pid > 0)
        testd_stop(live_testd);
    test_tmpfs_remove(live_mount);
    live_cluster = NULL;
    live_testd = NULL;
    live_mount[0] = '\0';
}

/* ---------------------------------------------------------------------------------- */
/* (a) Acknowledged writes under SIGKILL. */
