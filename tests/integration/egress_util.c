/*
 * egress_util.c — the egress test binaries' shared test host, private
 * daemon and client helpers (egress_util.h).
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "egress_util.h"

char ns_path[96], dns_ip[16], ip_ok[16], ip_other[16], ip_deny[16], secret[64];
struct testd *live;
static char ns_name[64], host_if[16], host_ip[16];
static pid_t dnsmasq_pid = -1, srv_pids[8], bulk_pid = -1, git_pid = -1;
static char git_dir[128], inject_path[128];
static int nsrv;

enum mode { M_BODY, M_BULK, M_SINK, M_ECHO };

/* serve — accept on fd forever: answer BODY, send BULK_BYTES of zeros, or
 * read until the client's end (then close). */
static void __attribute__((noreturn))
serve(int fd, enum mode mode)
{
    static char zeros[65536];
    for (;;) {
        int c = accept(fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[512];
        if (mode == M_ECHO) { /* the request head back, as the body */
            char head[8192];
            size_t n = 0;
            while (n < sizeof(head) - 1) {
                ssize_t r = read(c, head + n, sizeof(head) - 1 - n);
                if (r <= 0)
                    break;
                n += (size_t)r;
                head[n] = '\0';
                if (strstr(head, "\r\n\r\n"))
                    break;
            }
            const char *r = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n";
            (void)!write(c, r, strlen(r));
            (void)!write(c, head, n);
            close(c);
            continue;
        }
        if (mode == M_SINK) {
            while (read(c, zeros, sizeof(zeros)) > 0)
                ;
            close(c);
            continue;
        }
        if (mode == M_BULK) {
            for (size_t sent = 0; sent < BULK_BYTES;) {
                ssize_t w = write(c, zeros, SBX_MIN(sizeof(zeros), BULK_BYTES - sent));
                if (w <= 0)
                    break;
                sent += (size_t)w;
            }
        } else {
            (void)!read(c, buf, sizeof(buf));
            const char *r = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" BODY "\n";
            (void)!write(c, r, strlen(r));
        }
        shutdown(c, SHUT_WR);
        struct timeval tv = {.tv_sec = 2};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        while (read(c, buf, sizeof(buf)) > 0)
            ;
        close(c);
    }
}

/* In a forked child that will run a daemon of the test host: enter the test
 * host's network namespace (exit 126 if that fails) and silence its
 * standard output and error. */
static void
daemon_child_enter(void)
{
    int nfd = open(ns_path, O_RDONLY | O_CLOEXEC);
    if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
        _exit(126);
    int devnull = open("/dev/null", O_WRONLY);
    dup2(devnull, 1);
    dup2(devnull, 2);
}

/* listen_ns — a child listening on 0.0.0.0:port in the test host. */
static pid_t
listen_ns(int port, enum mode mode)
{
    int ready[2];
    if (pipe(ready) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        int nfd = open(ns_path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
            _exit(1);
        int fd = socket(AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0)
            _exit(1);
        (void)!write(ready[1], "r", 1);
        close(ready[1]);
        serve(fd, mode);
    }
    close(ready[1]);
    char c;
    ssize_t n = read(ready[0], &c, 1);
    close(ready[0]);
    if (n != 1) {
        if (pid > 0)
            waitpid(pid, NULL, 0);
        return -1;
    }
    return pid;
}

void
stop_child(pid_t *pid)
{
    if (*pid > 0) {
        kill(*pid, SIGKILL);
        waitpid(*pid, NULL, 0);
    }
    *pid = -1;
}

/* dns_ready — dnsmasq answers allowed.test from the host (5 s). */
static bool
dns_ready(void)
{
    for (int i = 0; i < 50; i++) {
        if (test_shf("python3 -c \"import socket,sys\n"
               "q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00"
               "\\x07allowed\\x04test\\x00\\x00\\x01\\x00\\x01'\n"
               "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(0.2)\n"
               "s.sendto(q,('%s',53)); r=s.recv(512); sys.exit(0 if r[3]&15==0 else 1)\" "
               "2>/dev/null",
               dns_ip) == 0)
            return true;
        usleep(100 * 1000);
    }
    return false;
}

/* Criterion runs no .fini after a failed .init: a failed set-up step takes
 * down what the earlier steps made (its dnsmasq, servers, netns, veth)
 * before it fails, so nothing of the test is left on the host. */
#define up_assert(cond, ...)                                                             \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            egress_host_down();                                                          \
            cr_assert(false, __VA_ARGS__);                                               \
        }                                                                                \
    } while (0)
#define up_assert_eq(a, b, ...) up_assert((a) == (b), __VA_ARGS__)
#define up_assert_gt(a, b, ...) up_assert((a) > (b), "set-up step")

void
egress_host_up(const char *tag, int half)
{
    int p = (int)getpid();
    /* A /29 of this binary's half of 198.19.0.0/16. */
    unsigned idx = (half ? 4096u : 0u) + (unsigned)p % 4096u;
    unsigned hi = idx * 8 / 256, lo = idx * 8 % 256;
    snprintf(host_ip, sizeof(host_ip), "198.19.%u.%u", hi, lo + 1);
    snprintf(dns_ip, sizeof(dns_ip), "198.19.%u.%u", hi, lo + 2);
    snprintf(ip_ok, sizeof(ip_ok), "198.19.%u.%u", hi, lo + 3);
    snprintf(ip_other, sizeof(ip_other), "198.19.%u.%u", hi, lo + 4);
    snprintf(ip_deny, sizeof(ip_deny), "198.19.%u.%u", hi, lo + 5); /* --egress-deny */
    snprintf(ns_name, sizeof(ns_name), "%s%s%d", test_prefix(), tag, p);
    snprintf(ns_path, sizeof(ns_path), "/run/netns/%s", ns_name);
    snprintf(host_if, sizeof(host_if), "e%s%d", tag, p);
    up_assert_eq(test_shf("ip netns add %s && ip link add %s type veth peer name eth0 netns %s && "
                    "ip addr add %s/29 dev %s && ip link set %s up && "
                    "ip -n %s addr add %s/29 dev eth0 && ip -n %s addr add %s/29 dev eth0 && "
                    "ip -n %s addr add %s/29 dev eth0 && ip -n %s link set eth0 up && "
                    "ip -n %s link set lo up && ip -n %s route add default via %s && "
                    "echo 1 > /proc/sys/net/ipv4/conf/%s/forwarding",
                    ns_name, host_if, ns_name, host_ip, host_if, host_if, ns_name, dns_ip,
                    ns_name, ip_ok, ns_name, ip_other, ns_name, ns_name, ns_name, host_ip,
                    host_if),
                 0, "could not make the test host %s", ns_name);
    up_assert_eq(test_shf("ip -n %s addr add %s/29 dev eth0", ns_name, ip_deny), 0,
                 "could not add %s", ip_deny);
    int ports[] = {8080, 9090};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ports); i++) {
        srv_pids[nsrv] = listen_ns(ports[i], M_BODY);
        up_assert_gt(srv_pids[nsrv++], 0, "test host server on %d", ports[i]);
    }
    bulk_pid = listen_ns(7000, M_BULK);
    up_assert_gt(bulk_pid, 0, "bulk server");
    srv_pids[nsrv] = listen_ns(7001, M_SINK);
    up_assert_gt(srv_pids[nsrv++], 0, "sink server");
    srv_pids[nsrv] = listen_ns(80, M_ECHO);
    up_assert_gt(srv_pids[nsrv++], 0, "echo server");
    /* dnsmasq in the test host, in the foreground, answering only its
     * --address names (TTL 3 s), no upstream of its own. */
    char a1[96], a2[96], a3[96], a4[96], a5[96], a6[96], a7[96], la[64];
    /* allowed.test has an AAAA record upstream too (aaaa_answers_are_empty). */
    const char *a8 = "--address=/allowed.test/fd5b::5";
    snprintf(a6, sizeof(a6), "--address=/api.test/%s", ip_ok);
    snprintf(a7, sizeof(a7), "--address=/plain.test/%s", ip_other);
    snprintf(a5, sizeof(a5), "--address=/git.test/%s", ip_ok);
    snprintf(a1, sizeof(a1), "--address=/allowed.test/%s", ip_ok);
    snprintf(a2, sizeof(a2), "--address=/wild.test/%s", ip_ok);
    snprintf(a3, sizeof(a3), "--address=/denied.test/%s", ip_other);
    snprintf(a4, sizeof(a4), "--address=/other.test/%s", ip_other);
    snprintf(la, sizeof(la), "--listen-address=%s", dns_ip);
    dnsmasq_pid = fork();
    if (dnsmasq_pid == 0) {
        daemon_child_enter();
        execl("/usr/sbin/dnsmasq", "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
              "--no-resolv", "--no-hosts", "--bind-interfaces", la, "--user=root",
              "--pid-file=", "--local-ttl=3", a1, a2, a3, a4, a5, a6, a7, a8, (char *)NULL);
        _exit(127);
    }
    up_assert_gt(dnsmasq_pid, 0);
    up_assert(dns_ready(), "dnsmasq in %s does not answer", ns_name);
    /* A bare repository with one commit, served as static files. */
    snprintf(git_dir, sizeof(git_dir), "/tmp/sbx-%sgit-%s%d", tag, test_prefix(), p);
    up_assert_eq(test_shf("set -e; rm -rf %s; mkdir -p %s/w; cd %s/w; git init -q -b main; "
                    "echo hello-over-git > README; git add README; "
                    "git -c user.name=t -c user.email=t@t commit -q -m one; "
                    "git clone -q --bare . ../repo.git; cd ../repo.git; git update-server-info",
                    git_dir, git_dir, git_dir),
                 0, "the test repository");
    git_pid = fork();
    if (git_pid == 0) {
        daemon_child_enter();
        /* socketserver, not http.server's HTTPServer: that one looks its
         * own address up (getfqdn), with no resolver in the test host. */
        char py[512];
        snprintf(py, sizeof(py),
                 "import functools, http.server, socketserver\n"
                 "h = functools.partial(http.server.SimpleHTTPRequestHandler, directory='%s')\n"
                 "socketserver.TCPServer(('%s', 8000), h).serve_forever()\n",
                 git_dir, ip_ok);
        execl("/usr/bin/python3", "python3", "-c", py, (char *)NULL);
        _exit(127);
    }
    up_assert_gt(git_pid, 0);
    /* The injection rules: a secret of this run, in a file only root reads. */
    snprintf(secret, sizeof(secret), "sbxsecret-%d-%08x", p, (unsigned)arc4random());
    snprintf(inject_path, sizeof(inject_path), "/tmp/sbx-inject-%s%s%d.conf", test_prefix(), tag,
             p);
    int ifd = open(inject_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    up_assert(ifd >= 0, "%s", inject_path);
    char rules[256];
    int rl = snprintf(rules, sizeof(rules), "# egress_util.c\napi.test Authorization: Bearer %s\n",
                      secret);
    up_assert_eq(write(ifd, rules, (size_t)rl), rl, "%s", inject_path);
    close(ifd);
    /* A private daemon whose sandboxes' resolver forwards to that dnsmasq. */
    live = sbx_xcalloc(1, sizeof(*live));
    const char *const extra[] = {TESTD_SMALL, "--dns-upstream", dns_ip, "--egress-inject",
                                 inject_path, "--egress-deny", ip_deny, NULL};
    up_assert_eq(testd_start(live, 1, extra), 0, "the daemon did not start");
}

void
egress_host_down(void)
{
    if (live) {
        testd_stop(live);
        free(live);
        live = NULL;
    }
    if (inject_path[0])
        unlink(inject_path);
    stop_child(&dnsmasq_pid);
    stop_child(&git_pid);
    if (git_dir[0])
        test_shf("rm -rf %s", git_dir);
    stop_child(&bulk_pid);
    for (int i = 0; i < nsrv; i++)
        stop_child(&srv_pids[i]);
    if (ns_name[0])
        test_shf("ip netns delete %s 2>/dev/null; ip link delete %s 2>/dev/null; true", ns_name,
           host_if);
}

sbx_client *
client(void)
{
    sbx_client *c = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    return c;
}

void
create(sbx_client *c, const char *id, const char *network_json, char *code, size_t clen,
       char *msg, size_t mlen)
{
    char args[8192];
    snprintf(args, sizeof(args), "{\"network\":%s}", network_json);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    int rc = sbx_call_json(c, "create", id, args, 30000, &r, &err);
    snprintf(code, clen, "%s", rc == 0 ? "" : err.code);
    snprintf(msg, mlen, "%s", rc == 0 ? "" : err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
}

void
create_ok(sbx_client *c, const char *id, const char *network_json)
{
    char code[64], msg[512];
    create(c, id, network_json, code, sizeof(code), msg, sizeof(msg));
    cr_assert_str_eq(code, "", "create %s %s: %s", id, network_json, msg);
}

void
destroy(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_expect_eq(sbx_call(c, "destroy", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
}

/* run — a shell command in the sandbox: its stdout (heap) and exit code. */
char *
run(sbx_client *c, const char *id, const char *cmd, int *exit_code)
{
    sbx_exec_result r;
    sbx_error err = {0};
    cr_assert_eq(test_sh(c, id, cmd, 60000, &r, &err), 0, "exec in %s: %s", id, err.message);
    char *out = strndup((const char *)r.stdout_data, r.stdout_len);
    *exit_code = r.exit_code;
    sbx_exec_result_free(&r);
    sbx_error_free(&err);
    return out;
}

/* lookup — the sandbox resolves name (getent: its libc, its resolv.conf);
 * the address, or "" when it got none. */
void
lookup(sbx_client *c, const char *id, const char *name, char *addr, size_t len)
{
    char cmd[256];
    snprintf(cmd, sizeof(cmd), "getent ahostsv4 %s | awk 'NR==1 {print $1}'", name);
    int ec;
    char *out = run(c, id, cmd, &ec);
    snprintf(addr, len, "%.*s", (int)strcspn(out, "\n"), out);
    free(out);
}

/* fetch — connect from the sandbox to host:port (a name or an address),
 * send a request; whether BODY came back. */
bool
fetch(sbx_client *c, const char *id, const char *host, int port)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d && printf \"GET / HTTP/1.0\\r\\n\\r\\n\" "
             ">&3 && cat <&3' 2>&1",
             host, port);
    int ec;
    char *out = run(c, id, cmd, &ec);
    bool ok = strstr(out, BODY) != NULL;
    free(out);
    return ok;
}

char *
status_network(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    char *json = sbx_reply_json(r, false);
    sbx_reply_free(r);
    char *n = strstr(json, "\"network\":");
    cr_assert_not_null(n, "status without network: %s", json);
    char *out = strdup(n);
    free(json);
    return out;
}
