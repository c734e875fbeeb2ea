/* cluster_state.c — the cluster harness's queries: the state as etcd and the
 * gateways see it, convergence, the sanitizer reports and tails of the logs,
 * the CPU time of a process tree (see cluster.h). */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/etcd.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "cluster_int.h"

static int
count_reports(const char *path, char *out, size_t outlen)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(path, 64u << 20, &buf, &n) != 0)
        return 0;
    static const char *const pats[] = {"ERROR: AddressSanitizer", "ERROR: LeakSanitizer",
                                       "runtime error:", "WARNING: ThreadSanitizer", NULL};
    int count = 0;
    for (int k = 0; pats[k]; k++) {
        for (char *p = strstr(buf, pats[k]); p; p = strstr(p + 1, pats[k])) {
            if (count == 0 && out && outlen) {
                char *start = p;
                while (start > buf && start[-1] != '\n')
                    start--;
                snprintf(out, outlen, "%s: %.*s", path, (int)SBX_MIN((size_t)1500, n - (size_t)(start - buf)),
                         start);
            }
            count++;
        }
    }
    free(buf);
    return count;
}

int
scan_dir_reports(const char *dir, char *out, size_t outlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return 0;
    int count = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".log") || !strcmp(de->d_name, "setup.log") ||
            !strcmp(de->d_name, "etcd.log"))
            continue;
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        count += count_reports(path, count ? NULL : out, outlen);
    }
    closedir(d);
    return count;
}

static void
print_tail(const char *path, int lines)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(path, 64u << 20, &buf, &n) != 0)
        return;
    size_t off = n;
    int seen = 0;
    while (off > 0) {
        if (buf[off - 1] == '\n' && ++seen > lines)
            break;
        off--;
    }
    fprintf(stderr, "---- %s (last %d lines) ----\n%s---- end ----\n", path, lines, buf + off);
    free(buf);
}

void
tails_of_dir(const char *dir, int lines)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t l = strlen(de->d_name);
        if (l < 5 || strcmp(de->d_name + l - 4, ".log"))
            continue;
        char path[600];
        snprintf(path, sizeof(path), "%s/%s", dir, de->d_name);
        print_tail(path, lines);
    }
    closedir(d);
}

int
cl_read_state(struct cl_state *st)
{
    const struct cl_env *e = cl_env();
    memset(st, 0, sizeof(*st));
    for (int p = 0; p < SBX_PARTITIONS; p++)
        st->owner[p] = -1;
    sbx_etcd *etcd;
    if (sbx_etcd_open(&etcd, e->etcd, 5000) != 0)
        return -1;
    char pfx[128], end[128];
    snprintf(pfx, sizeof(pfx), "/sbx/%s/c/", e->cluster);
    sbx_etcd_prefix_end(pfx, end, sizeof(end));
    struct sbx_etcd_kv *kvs = NULL;
    size_t n = 0;
    int rc = sbx_etcd_range(etcd, pfx, end, &kvs, &n, NULL);
    sbx_etcd_close(etcd);
    if (rc)
        return -1;
    size_t pl = strlen(pfx);
    for (size_t k = 0; k < n; k++) {
        const char *key = kvs[k].key + pl;
        if (!strncmp(key, "members/", 8)) {
            int i = cl_node_index(key + 8);
            if (i >= 0) {
                st->live[i] = true;
                st->lease[i] = kvs[k].lease;
            }
        } else if (!strncmp(key, "drain/", 6)) {
            int i = cl_node_index(key + 6);
            if (i >= 0)
                st->draining[i] = true;
        } else if (!strncmp(key, "parts/", 6)) {
            int p = atoi(key + 6);
            if (p < 0 || p >= SBX_PARTITIONS)
                continue;
            int i = cl_node_index(kvs[k].value);
            st->owner[p] = (int8_t)(i >= 0 ? i : -2);
            st->epoch[p] = kvs[k].mod_revision;
            if (i >= 0)
                st->count[i]++;
        }
    }
    sbx_etcd_kvs_free(kvs, n);
    return 0;
}

bool
cl_converged(const int *set, int n, const char *gw_url, char *why, size_t wl)
{
    struct cl_state st;
    if (cl_read_state(&st) != 0) {
        snprintf(why, wl, "etcd unreachable");
        return false;
    }
    bool in[CL_MAX_NODES] = {0};
    char names[CL_MAX_NODES][64];
    const char *np[CL_MAX_NODES];
    for (int k = 0; k < n; k++) {
        in[set[k]] = true;
        cl_node_name(set[k], names[k], sizeof(names[k]));
        np[k] = names[k];
    }
    for (int i = 0; i < CL_MAX_NODES; i++) {
        if (!in[i] && st.live[i] && st.draining[i] && st.count[i] == 0)
            continue; /* drained: still a member, but out of the table */
        if (st.live[i] != in[i]) {
            snprintf(why, wl, "node %d is %s", i, st.live[i] ? "still live" : "not live");
            return false;
        }
        if (in[i] && st.draining[i]) {
            snprintf(why, wl, "node %d is draining", i);
            return false;
        }
    }
    int16_t table[SBX_PARTITIONS];
    sbx_place_table(np, (size_t)n, table);
    int wrong = 0, first = -1;
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (st.owner[p] != set[table[p]]) {
            if (first < 0)
                first = p;
            wrong++;
        }
    if (wrong) {
        snprintf(why, wl, "%d partition(s) not at their owner yet (e.g. %d: %d, wants %d)", wrong,
                 first, st.owner[first], set[table[first]]);
        return false;
    }
    /* Every shard of the set: what it owns, ready, nothing moving. */
    sbx_client *c;
    sbx_error err;
    if (sbx_client_open(&c, gw_url, &err) != 0) {
        snprintf(why, wl, "gateway %s: %s", gw_url, err.code);
        sbx_error_free(&err);
        return false;
    }
    sbx_reply *r = NULL;
    int rc = sbx_call(c, "cluster.status", NULL, NULL, 0, 5000, NULL, &r, &err);
    sbx_client_close(c);
    if (rc) {
        snprintf(why, wl, "cluster.status: %s %s", err.code, err.message);
        sbx_error_free(&err);
        return false;
    }
    char *js = sbx_reply_json(r, false);
    sbx_reply_free(r);
    json_error_t je;
    json_t *j = js ? json_loads(js, 0, &je) : NULL;
    free(js);
    bool ok = j != NULL;
    bool seen[CL_MAX_NODES] = {0};
    json_t *shards = json_object_get(j, "shards");
    size_t k;
    json_t *s;
    json_array_foreach(shards, k, s) {
        const char *name = json_string_value(json_object_get(s, "name"));
        int i = name ? cl_node_index(name) : -1;
        if (i < 0 || !in[i])
            continue;
        json_t *cs = json_object_get(json_object_get(s, "status"), "cluster");
        const char *health = json_string_value(json_object_get(s, "health"));
        long owned = (long)json_integer_value(json_object_get(cs, "partitionsOwned"));
        long ready = (long)json_integer_value(json_object_get(cs, "partitionsReady"));
        long moving = (long)json_integer_value(json_object_get(cs, "partitionsMoving"));
        bool fenced = json_is_true(json_object_get(cs, "fenced"));
        if (!health || strcmp(health, "ok")) {
            snprintf(why, wl, "node %d is %s through the gateway", i, health ? health : "?");
            ok = false;
            break;
        }
        if (fenced || owned != st.count[i] || ready != owned || moving) {
            snprintf(why, wl, "node %d: fenced %d, owns %ld (etcd: %d), ready %ld, moving %ld", i,
                     fenced, owned, st.count[i], ready, moving);
            ok = false;
            break;
        }
        seen[i] = true;
    }
    for (int q = 0; q < n && ok; q++)
        if (!seen[set[q]]) {
            snprintf(why, wl, "the gateway does not list node %d", set[q]);
            ok = false;
        }
    if (ok) {
        json_t *cl = json_object_get(j, "cluster");
        long unowned = (long)json_integer_value(json_object_get(cl, "partitionsWithoutLiveOwner"));
        if (unowned) {
            snprintf(why, wl, "the gateway sees %ld partition(s) without a live owner", unowned);
            ok = false;
        }
    }
    json_decref(j);
    return ok;
}

double
cl_wait_converged(const int *set, int n, const char *gw_url, int timeout_ms, char *why, size_t wl)
{
    double t0 = cl_now_ms();
    for (;;) {
        if (cl_converged(set, n, gw_url, why, wl))
            return cl_now_ms() - t0;
        if (cl_now_ms() - t0 > timeout_ms)
            return -1;
        cl_sleep_ms(150);
    }
}

int
cl_sanitizer_reports(char *out, size_t outlen)
{
    if (out && outlen)
        out[0] = '\0';
    return scan_dir_reports(cl_env()->dir, out, outlen);
}

void
cl_print_log_tails(int lines)
{
    tails_of_dir(cl_env()->dir, lines);
}

/* ---- CPU of a process tree ------------------------------------------------------ */

static bool
proc_stat(pid_t pid, pid_t *ppid, double *self_ms, double *children_ms)
{
    char path[64], buf[2048];
    snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return false;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return false;
    buf[n] = '\0';
    char *rp = strrchr(buf, ')');
    if (!rp)
        return false;
    /* after "pid (comm)": state ppid pgrp session tty tpgid flags minflt cminflt majflt
     * cmajflt utime stime cutime cstime */
    char state;
    int pp;
    unsigned long ut, st;
    long cut, cst;
    if (sscanf(rp + 2, "%c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu %ld %ld", &state, &pp,
               &ut, &st, &cut, &cst) != 6)
        return false;
    double tick = (double)sysconf(_SC_CLK_TCK);
    *ppid = pp;
    *self_ms = (double)(ut + st) * 1000.0 / tick;
    *children_ms = (double)(cut + cst) * 1000.0 / tick;
    return true;
}

double
cl_proc_cpu_ms(pid_t root)
{
    /* utime+stime of root and of every live descendant, plus what each of
     * them collected from its reaped children (cutime+cstime). */
    size_t cap = 4096, n = 0;
    pid_t *pids = sbx_xcalloc(cap, sizeof(pid_t));
    pid_t *ppids = sbx_xcalloc(cap, sizeof(pid_t));
    double *cpu = sbx_xcalloc(cap, sizeof(double));
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        pid_t pid = (pid_t)atoi(de->d_name), pp;
        double self, ch;
        if (!proc_stat(pid, &pp, &self, &ch))
            continue;
        if (n == cap) {
            cap *= 2;
            pids = sbx_xrealloc(pids, cap * sizeof(pid_t));
            ppids = sbx_xrealloc(ppids, cap * sizeof(pid_t));
            cpu = sbx_xrealloc(cpu, cap * sizeof(double));
        }
        pids[n] = pid;
        ppids[n] = pp;
        cpu[n] = self + ch;
        n++;
    }
    if (d)
        closedir(d);
    /* mark the tree: repeat until no change (the tree is shallow) */
    bool *in = sbx_xcalloc(n ? n : 1, sizeof(bool));
    for (size_t k = 0; k < n; k++)
        in[k] = pids[k] == root;
    for (bool changed = true; changed;) {
        changed = false;
        for (size_t k = 0; k < n; k++) {
            if (in[k])
                continue;
            for (size_t q = 0; q < n; q++)
                if (in[q] && pids[q] == ppids[k]) {
                    in[k] = changed = true;
                    break;
                }
        }
    }
    double total = 0;
    for (size_t k = 0; k < n; k++)
        if (in[k])
            total += cpu[k];
    free(in);
    free(pids);
    free(ppids);
    free(cpu);
    return total;
}
