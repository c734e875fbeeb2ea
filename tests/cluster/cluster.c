/* cluster.c — see cluster.h: main()'s side (cl_setup forks the supervisor of
 * cluster_sup.c, cl_teardown) and the tests' control calls (the environment,
 * node names, start/signal/wait through the supervisor's socket).
 * cluster_state.c has the queries. */
#include "cluster.h"

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
#include "../../runtime/nngx.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "cluster_int.h"

double
cl_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

void
cl_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ---- main() side ------------------------------------------------------------- */

static pid_t sup_pid;
static int sup_to, sup_from; /* pipes: to the supervisor, from it */

static int
read_line(int fd, char *buf, size_t len)
{
    size_t n = 0;
    while (n < len - 1) {
        ssize_t r = read(fd, buf + n, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        if (buf[n] == '\n')
            break;
        n++;
    }
    buf[n] = '\0';
    return (int)n;
}

int
cl_setup(const struct cl_opts *o)
{
    if (geteuid() != 0) {
        fprintf(stderr, "cluster: must run as root (network namespaces, cgroups)\n");
        return -1;
    }
    if (access("/usr/bin/etcd", X_OK) != 0) {
        fprintf(stderr, "cluster: /usr/bin/etcd is missing (tools/deps.sh installs etcd-server)\n");
        return -1;
    }
    int a[2], b[2];
    if (pipe2(a, O_CLOEXEC) != 0 || pipe2(b, O_CLOEXEC) != 0)
        return -1;
    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        close(a[1]);
        close(b[0]);
        sup_main(o, b[1], a[0]);
    }
    close(a[0]);
    close(b[1]);
    sup_pid = pid;
    sup_to = a[1];
    sup_from = b[0];
    char line[4096];
    read_line(sup_from, line, sizeof(line));
    if (strncmp(line, "ok ", 3) != 0) {
        fprintf(stderr, "cluster: setup failed (%s)\n", line[0] ? line : "supervisor died");
        close(sup_to);
        waitpid(sup_pid, NULL, 0);
        sup_pid = 0;
        return -1;
    }
    char *save = NULL;
    for (char *t = strtok_r(line + 3, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        char *eq = strchr(t, '=');
        if (!eq)
            continue;
        *eq = '\0';
        setenv(t, eq + 1, 1);
    }
    return 0;
}

int
cl_teardown(bool keep_logs)
{
    if (sup_pid <= 0)
        return 0;
    if (keep_logs)
        sbx_write_full(sup_to, "k", 1);
    close(sup_to);
    char line[128] = "";
    read_line(sup_from, line, sizeof(line));
    int st;
    while (waitpid(sup_pid, &st, 0) < 0 && errno == EINTR) {
    }
    sup_pid = 0;
    int reports = 0;
    if (sscanf(line, "done %d", &reports) != 1)
        reports = 0;
    return reports;
}

/* ================================================================================ */
/* Test side.                                                                       */
/* ================================================================================ */

static struct cl_env E;
static bool E_loaded;

static void
envcpy(char *dst, size_t n, const char *key)
{
    const char *v = getenv(key);
    snprintf(dst, n, "%s", v ? v : "");
}

const struct cl_env *
cl_env(void)
{
    if (E_loaded)
        return &E;
    envcpy(E.ctl, sizeof(E.ctl), "SBXC_CTL");
    envcpy(E.dir, sizeof(E.dir), "SBXC_DIR");
    envcpy(E.etcd, sizeof(E.etcd), "SBXC_ETCD");
    envcpy(E.cluster, sizeof(E.cluster), "SBXC_CLUSTER");
    envcpy(E.prefix, sizeof(E.prefix), "SBXC_PREFIX");
    envcpy(E.net, sizeof(E.net), "SBXC_NET");
    envcpy(E.secret, sizeof(E.secret), "SBXC_SECRET");
    envcpy(E.gw[0], sizeof(E.gw[0]), "SBXC_GW0");
    envcpy(E.gw[1], sizeof(E.gw[1]), "SBXC_GW1");
    const char *h0 = getenv("SBXC_HTTP0"), *h1 = getenv("SBXC_HTTP1"), *nn = getenv("SBXC_NODES");
    E.gw_http[0] = h0 ? atoi(h0) : 0;
    E.gw_http[1] = h1 ? atoi(h1) : 0;
    E.nodes = nn ? atoi(nn) : 0;
    E_loaded = true;
    return &E;
}

void
cl_node_name(int i, char *out, size_t outlen)
{
    snprintf(out, outlen, "%s-s%d", cl_env()->prefix, i);
}

void
cl_node_url(int i, char *out, size_t outlen)
{
    snprintf(out, outlen, "tls+tcp://%s.%d:%d", cl_env()->net, 11 + i, NODE_PORT);
}

int
cl_dial(nng_socket s, const char *url)
{
    char ca[320], cert[320], key[320];
    snprintf(ca, sizeof(ca), "%s/pki/ca.pem", cl_env()->dir);
    snprintf(cert, sizeof(cert), "%s/pki/client.pem", cl_env()->dir);
    snprintf(key, sizeof(key), "%s/pki/client.key", cl_env()->dir);
    sbx_nng_sec sec;
    sbx_err_t err = NULL;
    int rc = sbx_nng_sec_open(&sec, ca, cert, key, false, &err);
    if (rc == 0)
        rc = sbx_nng_dial(s, url, &sec, NULL, 0, &err); /* the dialer holds the config */
    if (rc)
        fprintf(stderr, "cl_dial: %s\n", sbx_err_msg(err));
    sbx_err_release(&err);
    sbx_nng_sec_close(&sec);
    return rc;
}

int
cl_node_index(const char *name)
{
    const char *p = cl_env()->prefix;
    size_t pl = strlen(p);
    if (strncmp(name, p, pl) || strncmp(name + pl, "-s", 2))
        return -1;
    char *end;
    long i = strtol(name + pl + 2, &end, 10);
    if (*end || end == name + pl + 2 || i < 0 || i >= CL_MAX_NODES)
        return -1;
    return (int)i;
}

int
cl_ctl(char *reply, size_t rlen, const char *fmt, ...)
{
    char cmd[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof(cmd) - 1, fmt, ap);
    va_end(ap);
    strcat(cmd, "\n");
    char dummy[256];
    if (!reply) {
        reply = dummy;
        rlen = sizeof(dummy);
    }
    snprintf(reply, rlen, "err no supervisor");
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    snprintf(un.sun_path, sizeof(un.sun_path), "%s", cl_env()->ctl);
    if (fd < 0 || connect(fd, (struct sockaddr *)&un, sizeof(un)) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    sbx_write_full(fd, cmd, strlen(cmd));
    read_line(fd, reply, rlen);
    close(fd);
    return strncmp(reply, "ok", 2) == 0 ? 0 : -1;
}

pid_t
cl_start(const char *kind, int i)
{
    char r[128];
    if (cl_ctl(r, sizeof(r), "start %s %d", kind, i) != 0)
        return -1;
    return (pid_t)atoi(r + 3);
}

pid_t
cl_start_via(int i, const char *via)
{
    char r[128];
    if (cl_ctl(r, sizeof(r), "start shard %d via %s", i, via) != 0)
        return -1;
    return (pid_t)atoi(r + 3);
}

int
cl_signal(const char *kind, int i, int sig)
{
    return cl_ctl(NULL, 0, "signal %s %d %d", kind, i, sig);
}

int
cl_wait_exit(const char *kind, int i, int timeout_ms)
{
    return cl_ctl(NULL, 0, "wait %s %d %d", kind, i, timeout_ms);
}
