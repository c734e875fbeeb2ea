/*
 * sbx-bench-bystander — what one tenant's exhaustion attacks cost the
 * others: the API latency of a bystander sandbox, idle and while another
 * sandbox runs each attack of issue 16's items 4 and 6 (floor: p99 within
 * 2× of idle).
 *
 *   sbx-bench-bystander [--calls N] [--flood F] [--sockets S] [--procs P]
 *                       [--burners B] [--phases LIST] [--sbxd-arg ARG]...
 *
 * Starts a private `sbxd dev` (2 shards; tests/support/harness.c; sbxd from
 * $SBX_BIN, else next to this executable; root needed) and a bystander
 * sandbox, warmed by one command.  Each phase then times N (default 300)
 * sequential calls of the bystander, alternating `exec true` over nng and
 * `GET /v1/health` on the HTTP front (each call's wall time, client side):
 *
 *   idle       nothing else runs.
 *   preview    (item 4) an attacker sandbox serves a port that accepts
 *              every connection and never answers, exposed at a preview
 *              URL; F (default 4500, more than the front's 4,096
 *              connections) connections from 127.0.0.2 each send it one
 *              preview request and stay open for the whole phase.
 *   sockets    (item 6) an attacker sandbox's P processes (default 8)
 *              each open S (default 256) loopback TCP connections to
 *              itself and S AF_UNIX socket pairs and write into them until
 *              every buffer is full, never reading, and hold them.
 *   cpu        B attacker sandboxes (default 4) each run two processes
 *              that spin on the CPU (each sandbox capped at its CPU limit,
 *              1 CPU by default), so sandboxes ask for more CPU than the
 *              host has: the shard's own threads must still get theirs.
 *
 * --phases picks phases (comma-separated: preview,sockets,cpu; default all;
 * idle always runs first).  --sbxd-arg adds one argument to the private
 * `sbxd dev` (repeat, up to 8), e.g. --sbxd-arg --sandbox-cpu-share
 * --sbxd-arg 0.
 * Prints, per phase, p50/p99/max (ms) and p99 against idle's.  Exit status
 * 0 when every bystander call succeeded, 1 otherwise, 2 on usage errors.
 * The machine's load moves the figures: run it on a quiet host, and read
 * the ratios within one run.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include "../include/sbx/sbx.h"

#include "../runtime/util.h"
#include "../tests/support/harness.h"
#include "stats.h"

struct opts {
    long calls, flood, sockets, procs, burners;
    const char *phases; /* comma-separated, NULL = all */
    const char *sbxd_args[10]; /* --sbxd-arg, then the fixed ones, NULL-terminated */
    size_t nsbxd_args;
};

/* Whether phase `name` was asked for. */
static bool
want(const struct opts *o, const char *name)
{
    if (!o->phases)
        return true;
    size_t n = strlen(name);
    for (const char *p = o->phases; *p;) {
        size_t len = strcspn(p, ",");
        if (len == n && !strncmp(p, name, n))
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

/* An op with JSON args; the result (heap JSON) or NULL with the error printed. */
static json_t *
op(sbx_client *c, const char *name, const char *id, const char *args)
{
    sbx_reply *r = NULL;
    sbx_error err;
    if (sbx_call_json(c, name, id, args, 60000, &r, &err) != 0) {
        fprintf(stderr, "sbx-bench-bystander: %s %s: %s %s\n", name, id ? id : "", err.code,
                err.message);
        sbx_error_free(&err);
        return NULL;
    }
    char *text = sbx_reply_json(r, false);
    sbx_reply_free(r);
    json_t *j = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    return j;
}

/* Write prog to /workspace/<name>.py in id and start it as process name. */
static int
start_program(sbx_client *c, const char *id, const char *name, const char *prog)
{
    json_t *a = json_pack("{s:s+,s:s}", "path", "/workspace/", name, "content", prog);
    char *args = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    json_t *r = op(c, "file.write", id, args);
    free(args);
    if (!r)
        return -1;
    json_decref(r);
    a = json_pack("{s:s+,s:s}", "command", "python3 /workspace/", name, "processId", name);
    args = json_dumps(a, JSON_COMPACT);
    json_decref(a);
    r = op(c, "process.start", id, args);
    free(args);
    if (!r)
        return -1;
    json_decref(r);
    return 0;
}

/* GET /v1/health on the front at 127.0.0.1:port over a new connection; 0 on a 200. */
static int
health(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int rc = -1;
    if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0) {
        static const char req[] = "GET /v1/health HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                  "Connection: close\r\n\r\n";
        char buf[64];
        if (send(fd, req, sizeof(req) - 1, MSG_NOSIGNAL) == (ssize_t)sizeof(req) - 1) {
            struct timeval tv = {.tv_sec = 30};
            setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
            ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
            if (n >= 12 && !strncmp(buf, "HTTP/1.1 200", 12))
                rc = 0;
        }
    }
    if (fd >= 0)
        close(fd);
    return rc;
}

/* One phase: N calls of the bystander, their times in v (N doubles). */
static long
measure(sbx_client *c, const char *id, int http_port, long n, double *v)
{
    long failed = 0;
    for (long i = 0; i < n; i++) {
        double t0 = sbx_stats_now_ms();
        int rc;
        if (i % 2 == 0) {
            sbx_exec_opts o = {.command = "true"};
            sbx_exec_result r;
            sbx_error err;
            rc = sbx_exec(c, id, &o, &r, &err);
            if (rc == 0)
                sbx_exec_result_free(&r);
            else
                sbx_error_free(&err);
        } else {
            rc = health(http_port);
        }
        v[i] = sbx_stats_now_ms() - t0;
        failed += rc != 0;
    }
    return failed;
}

/* A connection from 127.0.0.2 to the front carrying one request for host. */
static int
flood_conn(int http_port, const char *host)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)http_port);
    char req[512];
    int n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host);
    if (bind(fd, (struct sockaddr *)&src, sizeof(src)) != 0 ||
        connect(fd, (struct sockaddr *)&dst, sizeof(dst)) != 0 ||
        send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    return fd;
}

static void
report(const char *phase, double *v, long n, double idle_p99, long failed)
{
    struct sbx_summary s = sbx_stats_summary(v, (size_t)n);
    printf("%-8s  calls %5ld  p50 %7.2f ms  p99 %7.2f ms  max %8.2f ms  p99/idle %5.2f  "
           "failed %ld\n",
           phase, n, s.p50, s.p99, s.max, idle_p99 > 0 ? s.p99 / idle_p99 : 1.0, failed);
    fflush(stdout);
}

static const char STALL_PY[] =
    "import socket\n"
    "s = socket.socket()\n"
    "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', 8090))\n"
    "s.listen(4096)\n"
    "held = []\n"
    "while True:\n"
    "    held.append(s.accept()[0])\n";

/* Two processes spinning on the CPU. */
static const char SPIN_PY[] =
    "import os\n"
    "os.fork()\n"
    "while True:\n"
    "    pass\n";

/* %ld: connections per process, %ld: processes. */
static const char SOCKS_PY[] =
    "import os, socket, time\n"
    "N, P = %ld, %ld\n"
    "srv = socket.socket(); srv.bind(('127.0.0.1', 0)); srv.listen(4096)\n"
    "port = srv.getsockname()[1]\n"
    "def fill(s):\n"
    "    s.setblocking(False)\n"
    "    b = b'x' * 65536\n"
    "    try:\n"
    "        while True:\n"
    "            s.send(b)\n"
    "    except OSError:\n"
    "        pass\n"
    "for _ in range(P - 1):\n"
    "    if os.fork() == 0:\n"
    "        break\n"
    "held = []\n"
    "for i in range(N):\n"
    "    try:\n"
    "        c = socket.create_connection(('127.0.0.1', port))\n"
    "        held.append(c); held.append(srv.accept()[0]); fill(c)\n"
    "        a, b = socket.socketpair(); held += [a, b]; fill(a)\n"
    "    except OSError:\n"
    "        break\n"
    "open('/tmp/ready-%%d' %% os.getpid(), 'w').close()\n"
    "while True:\n"
    "    time.sleep(60)\n";

int
main(int argc, char **argv)
{
    struct opts o = {.calls = 300, .flood = 4500, .sockets = 256, .procs = 8, .burners = 4};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--phases") && i + 1 < argc) {
            o.phases = argv[++i];
            continue;
        }
        if (!strcmp(argv[i], "--sbxd-arg") && i + 1 < argc && o.nsbxd_args < 8) {
            o.sbxd_args[o.nsbxd_args++] = argv[++i];
            continue;
        }
        long *dst = !strcmp(argv[i], "--calls")     ? &o.calls
                    : !strcmp(argv[i], "--burners") ? &o.burners
                    : !strcmp(argv[i], "--flood")   ? &o.flood
                    : !strcmp(argv[i], "--sockets") ? &o.sockets
                    : !strcmp(argv[i], "--procs")   ? &o.procs
                                                    : NULL;
        if (!dst || i + 1 >= argc || (*dst = strtol(argv[++i], NULL, 10)) <= 0) {
            fprintf(stderr, "usage: sbx-bench-bystander [--calls N] [--flood F] [--sockets S] "
                            "[--procs P] [--burners B] [--phases preview,sockets,cpu] "
                            "[--sbxd-arg ARG]...\n");
            return 2;
        }
    }
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
    if ((rlim_t)o.flood + 256 > rl.rlim_cur)
        o.flood = (long)rl.rlim_cur - 256;

    static struct testd d;
    o.sbxd_args[o.nsbxd_args] = NULL;
    const char *const extra[] = {"--sleep-after", "1h", o.sbxd_args[0], o.sbxd_args[1],
                                 o.sbxd_args[2], o.sbxd_args[3], o.sbxd_args[4],
                                 o.sbxd_args[5], o.sbxd_args[6], o.sbxd_args[7], NULL};
    if (testd_start(&d, 2, extra) != 0) {
        fprintf(stderr, "sbx-bench-bystander: cannot start sbxd dev (root? $SBX_BIN?)\n");
        return 1;
    }
    int rc = 1;
    char path[512], *addr = NULL;
    size_t alen;
    snprintf(path, sizeof(path), "%s/http.addr", d.dir);
    int http_port = 0;
    if (sbx_fs_read(path, 256, &addr, &alen) == 0) {
        const char *colon = strrchr(addr, ':');
        http_port = colon ? atoi(colon + 1) : 0;
    }
    free(addr);
    sbx_client *c = NULL;
    sbx_error err;
    double *v = calloc((size_t)o.calls, sizeof(double));
    int *fds = calloc((size_t)o.flood, sizeof(int));
    char by[64], atk[64], atk2[64];
    snprintf(by, sizeof(by), "bystander-%d", (int)getpid());
    snprintf(atk, sizeof(atk), "attacker-%d", (int)getpid());
    snprintf(atk2, sizeof(atk2), "attacker2-%d", (int)getpid());
    if (!http_port || !v || !fds || sbx_client_open(&c, d.url, &err) != 0) {
        fprintf(stderr, "sbx-bench-bystander: no client or HTTP front\n");
        goto out;
    }
    printf("sbx-bench-bystander: %ld calls per phase (exec true over nng and GET /v1/health, "
           "alternating), flood %ld connections, %ld x %ld sockets\n",
           o.calls, o.flood, o.procs, o.sockets);
    long failed = measure(c, by, http_port, 10, v); /* warm: container, shell, connections */
    failed = measure(c, by, http_port, o.calls, v);
    struct sbx_summary idle = sbx_stats_summary(v, (size_t)o.calls);
    report("idle", v, o.calls, idle.p99, failed);
    long all_failed = failed;

    /* Item 4: a preview flood at a service that never answers. */
    if (want(&o, "preview")) {
        if (start_program(c, atk, "stall.py", STALL_PY) != 0)
            goto out;
        json_t *w = op(c, "process.waitForPort", atk,
                       "{\"processId\":\"stall.py\",\"port\":8090,\"mode\":\"tcp\","
                       "\"timeout\":30000}");
        json_t *e = w ? op(c, "port.expose", atk, "{\"port\":8090}") : NULL;
        json_decref(w);
        const char *url = e ? json_string_value(json_object_get(e, "url")) : NULL;
        const char *h = url ? strstr(url, "://") : NULL;
        if (!h) {
            json_decref(e);
            goto out;
        }
        char host[256];
        snprintf(host, sizeof(host), "%.*s", (int)strcspn(h + 3, "/"), h + 3);
        json_decref(e);
        long opened = 0;
        double f0 = sbx_stats_now_ms();
        for (long i = 0; i < o.flood; i++) {
            fds[i] = flood_conn(http_port, host);
            opened += fds[i] >= 0;
        }
        printf("preview flood: %ld of %ld connections opened in %.0f ms\n", opened, o.flood,
               sbx_stats_now_ms() - f0);
        failed = measure(c, by, http_port, o.calls, v);
        report("preview", v, o.calls, idle.p99, failed);
        all_failed += failed;
        for (long i = 0; i < o.flood; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        json_decref(op(c, "destroy", atk, "{}"));
    }

    /* Item 6: socket buffers filled and held. */
    if (want(&o, "sockets")) {
        char prog[2048];
        snprintf(prog, sizeof(prog), SOCKS_PY, o.sockets, o.procs);
        if (start_program(c, atk2, "socks.py", prog) != 0)
            goto out;
        double s0 = sbx_stats_now_ms();
        bool ready = false;
        char check[128];
        snprintf(check, sizeof(check), "test $(ls /tmp | grep -c ready-) -ge %ld", o.procs);
        while (!ready && sbx_stats_now_ms() - s0 < 120000) {
            sbx_exec_opts xo = {.command = check};
            sbx_exec_result r;
            if (sbx_exec(c, atk2, &xo, &r, &err) == 0) {
                ready = r.exit_code == 0;
                sbx_exec_result_free(&r);
            } else {
                sbx_error_free(&err);
            }
            if (!ready)
                usleep(200 * 1000);
        }
        printf("socket buffers: %s after %.0f ms\n", ready ? "all processes filled theirs"
                                                           : "not all processes filled theirs",
               sbx_stats_now_ms() - s0);
        failed = measure(c, by, http_port, o.calls, v);
        report("sockets", v, o.calls, idle.p99, failed);
        all_failed += failed;
        json_decref(op(c, "destroy", atk2, "{}"));
    }

    /* CPU: more spinning processes than the host has CPUs. */
    if (want(&o, "cpu")) {
        char name[64];
        long started = 0;
        for (long k = 0; k < o.burners; k++) {
            snprintf(name, sizeof(name), "burner%ld-%d", k, (int)getpid());
            started += start_program(c, name, "spin.py", SPIN_PY) == 0;
        }
        printf("cpu: %ld of %ld sandboxes spinning (2 processes each)\n", started, o.burners);
        usleep(500 * 1000); /* the spinners past their start-up */
        failed = measure(c, by, http_port, o.calls, v);
        report("cpu", v, o.calls, idle.p99, failed);
        all_failed += failed;
        for (long k = 0; k < o.burners; k++) {
            snprintf(name, sizeof(name), "burner%ld-%d", k, (int)getpid());
            json_decref(op(c, "destroy", name, "{}"));
        }
    }
    json_decref(op(c, "destroy", by, "{}"));
    rc = all_failed ? 1 : 0;
out:
    if (c)
        sbx_client_close(c);
    free(v);
    free(fds);
    testd_stop(&d);
    return rc;
}
