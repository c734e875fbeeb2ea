/*
 * test_egress_dns.c — host-name rules and bandwidth limits of egress
 * sandboxes (docs/network.md §Host names, §Bandwidth; issue 14): an allowed
 * name resolves through the sandbox's resolver and connects; a denied or
 * unlisted name gets no answer and its address, learned out of band, is
 * refused; a pin ends with the TTL; `*.suffix` rules; asking another
 * resolver gains nothing; bandwidth within 10 %; bad rules named in
 * VALIDATION_FAILED.
 *
 * The test host is a network namespace this test makes ("<prefix>dns<pid>"),
 * joined to the host by a veth pair ("edh<pid>" on the host side) with a /29
 * of 198.19.0.0/16 (RFC 2544 benchmarking: not private, so a policy may open
 * it; not TEST-NET-1, which some hosts' own networks use — this VM's uplink
 * is 192.0.2.2/24 with its gateway at .1 —, and apart from test_egress's
 * 198.18.0.0/16):
 * .1 the host side, .2 .. .4 the test host: dnsmasq on .2:53 answers
 * allowed.test and *.wild.test with .3 and denied.test and other.test with
 * .4, TTL 3 s; an HTTP-ish server on every address, port 8080 and 9090; a
 * bulk server on .3:7000 that sends 20 MB, a sink on :7001; a git
 * repository served over plain ("dumb") HTTP on :8000, as git.test; on :80
 * a server that answers with the request head it got, as api.test (.3,
 * which the daemon's --egress-inject file gives an Authorization header with
 * a secret made per run) and plain.test (.4, no rule).  A private `sbxd dev` per run
 * forwards its sandboxes' lookups to that dnsmasq (--dns-upstream).
 * Everything is removed by name and pid in the suite's fini.
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

#define BODY "hello-from-the-dns-test-host"
#define BULK_BYTES (20 * 1000 * 1000)
#define RESOLVER "169.254.0.53" /* SBX_NET_RESOLVER, container/net.h */

static char ns_name[64], ns_path[96], host_if[16], host_ip[16], dns_ip[16], ip_ok[16],
    ip_other[16], ip_deny[16];
static pid_t dnsmasq_pid = -1, srv_pids[8], bulk_pid = -1, git_pid = -1;
static char git_dir[128], inject_path[128], secret[64];
static int nsrv;
static struct testd *live;

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

static void
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

static void suite_down(void);
/* Criterion runs no .fini after a failed .init: a failed set-up step takes
 * down what the earlier steps made (its dnsmasq, servers, netns, veth)
 * before it fails, so nothing of the test is left on the host. */
#define up_assert(cond, ...)                                                             \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            suite_down();                                                                \
            cr_assert(false, __VA_ARGS__);                                               \
        }                                                                                \
    } while (0)
#define up_assert_eq(a, b, ...) up_assert((a) == (b), __VA_ARGS__)
#define up_assert_gt(a, b, ...) up_assert((a) > (b), "set-up step")

static void
suite_up(void)
{
    int p = (int)getpid();
    unsigned idx = (unsigned)p % 8192u; /* a /29 of 198.19.0.0/16 */
    unsigned hi = idx * 8 / 256, lo = idx * 8 % 256;
    snprintf(host_ip, sizeof(host_ip), "198.19.%u.%u", hi, lo + 1);
    snprintf(dns_ip, sizeof(dns_ip), "198.19.%u.%u", hi, lo + 2);
    snprintf(ip_ok, sizeof(ip_ok), "198.19.%u.%u", hi, lo + 3);
    snprintf(ip_other, sizeof(ip_other), "198.19.%u.%u", hi, lo + 4);
    snprintf(ip_deny, sizeof(ip_deny), "198.19.%u.%u", hi, lo + 5); /* --egress-deny */
    snprintf(ns_name, sizeof(ns_name), "%sdns%d", test_prefix(), p);
    snprintf(ns_path, sizeof(ns_path), "/run/netns/%s", ns_name);
    snprintf(host_if, sizeof(host_if), "edh%d", p);
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
        int nfd = open(ns_path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
            _exit(126);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
        execl("/usr/sbin/dnsmasq", "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null",
              "--no-resolv", "--no-hosts", "--bind-interfaces", la, "--user=root",
              "--pid-file=", "--local-ttl=3", a1, a2, a3, a4, a5, a6, a7, a8, (char *)NULL);
        _exit(127);
    }
    up_assert_gt(dnsmasq_pid, 0);
    up_assert(dns_ready(), "dnsmasq in %s does not answer", ns_name);
    /* A bare repository with one commit, served as static files. */
    snprintf(git_dir, sizeof(git_dir), "/tmp/sbx-dnsgit-%s%d", test_prefix(), p);
    up_assert_eq(test_shf("set -e; rm -rf %s; mkdir -p %s/w; cd %s/w; git init -q -b main; "
                    "echo hello-over-git > README; git add README; "
                    "git -c user.name=t -c user.email=t@t commit -q -m one; "
                    "git clone -q --bare . ../repo.git; cd ../repo.git; git update-server-info",
                    git_dir, git_dir, git_dir),
                 0, "the test repository");
    git_pid = fork();
    if (git_pid == 0) {
        int nfd = open(ns_path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
            _exit(126);
        int devnull = open("/dev/null", O_WRONLY);
        dup2(devnull, 1);
        dup2(devnull, 2);
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
    snprintf(inject_path, sizeof(inject_path), "/tmp/sbx-inject-%s%d.conf", test_prefix(), p);
    int ifd = open(inject_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    up_assert(ifd >= 0, "%s", inject_path);
    char rules[256];
    int rl = snprintf(rules, sizeof(rules), "# test_egress_dns\napi.test Authorization: Bearer %s\n",
                      secret);
    up_assert_eq(write(ifd, rules, (size_t)rl), rl, "%s", inject_path);
    close(ifd);
    /* A private daemon whose sandboxes' resolver forwards to that dnsmasq. */
    live = sbx_xcalloc(1, sizeof(*live));
    const char *const extra[] = {TESTD_SMALL, "--dns-upstream", dns_ip, "--egress-inject",
                                 inject_path, "--egress-deny", ip_deny, NULL};
    up_assert_eq(testd_start(live, 1, extra), 0, "the daemon did not start");
}

static void
suite_down(void)
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

TestSuite(egress_dns, .init = suite_up, .fini = suite_down, .timeout = 240);

static sbx_client *
client(void)
{
    sbx_client *c = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    return c;
}

static void
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

static void
create_ok(sbx_client *c, const char *id, const char *network_json)
{
    char code[64], msg[512];
    create(c, id, network_json, code, sizeof(code), msg, sizeof(msg));
    cr_assert_str_eq(code, "", "create %s %s: %s", id, network_json, msg);
}

static void
destroy(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_expect_eq(sbx_call(c, "destroy", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
}

/* run — a shell command in the sandbox: its stdout (heap) and exit code. */
static char *
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
static void
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
static bool
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

static char *
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

Test(egress_dns, allowed_name_resolves_and_connects)
{
    sbx_client *c = client();
    char *id = test_id("dns-ok");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test:8080\"]}");
    char a[64];
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_ok, "allowed.test resolved to '%s'", a);
    cr_expect(fetch(c, id, "allowed.test", 8080), "allowed.test:8080 not reached");
    /* The rule's port only. */
    cr_expect(!fetch(c, id, ip_ok, 9090), "allowed.test:9090 reached");
    char *st = status_network(c, id);
    cr_expect(strstr(st, "\"allow\":[\"allowed.test:8080\"]"), "%s", st);
    cr_expect(strstr(st, "\"name\":\"allowed.test\"") && strstr(st, ip_ok),
              "status shows the pinned name: %s", st);
    free(st);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, denied_and_unlisted_names_get_no_answer_and_their_address_is_refused)
{
    sbx_client *c = client();
    char *id = test_id("dns-deny"), *open = test_id("dns-open");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test\"],\"deny\":[\"denied.test\"]}");
    /* No allow rule at all: every public address is open, but a denied
     * name still gets no answer. */
    create_ok(c, open, "{\"mode\":\"egress\",\"deny\":[\"denied.test\"]}");
    char a[64];
    lookup(c, id, "denied.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "denied.test resolved to %s", a);
    lookup(c, id, "other.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "unlisted other.test resolved to %s", a);
    lookup(c, open, "denied.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "denied.test resolved to %s (no allow rules)", a);
    lookup(c, open, "other.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_other, "other.test (no allow rules) resolved to '%s'", a);
    /* The resolver's answer says REFUSED (rcode 5). */
    int ec;
    char *out = run(c, id,
                    "python3 -c \"import socket\n"
                    "q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00"
                    "\\x06denied\\x04test\\x00\\x00\\x01\\x00\\x01'\n"
                    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3)\n"
                    "s.sendto(q,('" RESOLVER "',53)); r=s.recv(512); print('rcode', r[3]&15)\"",
                    &ec);
    cr_expect(strstr(out, "rcode 5"), "the resolver's answer for denied.test: %s", out);
    free(out);
    /* Their address, learned out of band, stays refused; the allowed one
     * is reached (after a lookup: the pin). */
    cr_expect(!fetch(c, id, ip_other, 8080), "%s reached", ip_other);
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_ok);
    cr_expect(fetch(c, id, "allowed.test", 9090), "allowed.test (every port) not reached");
    destroy(c, id);
    destroy(c, open);
    free(id);
    free(open);
    sbx_client_close(c);
}

Test(egress_dns, an_unresolved_address_is_refused_and_a_pin_ends_with_its_ttl)
{
    sbx_client *c = client();
    char *id = test_id("dns-ttl");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test:8080\"]}");
    /* Before any lookup, its address is not open. */
    cr_expect(!fetch(c, id, ip_ok, 8080), "%s reached before a lookup", ip_ok);
    char a[64];
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_ok);
    cr_expect(fetch(c, id, ip_ok, 8080), "not reached after the lookup");
    /* TTL 3 s: 6 s later the pin is gone. */
    sleep(6);
    cr_expect(!fetch(c, id, ip_ok, 8080), "%s still reached after its TTL", ip_ok);
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect(fetch(c, id, ip_ok, 8080), "not reached after a new lookup");
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, a_policy_change_drops_the_pins_at_once)
{
    sbx_client *c = client();
    char *id = test_id("dns-conf");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test:8080\"]}");
    char a[64];
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_ok);
    cr_expect(fetch(c, id, ip_ok, 8080), "not reached after the lookup");
    /* Now only other.test: allowed.test's pin (3 s) goes with the old rules. */
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_expect_eq(sbx_call_json(c, "sandbox.configure", id,
                               "{\"network\":{\"mode\":\"egress\","
                               "\"allow\":[\"other.test:8080\"]}}",
                               30000, &r, &err),
                 0, "%s", err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
    cr_expect(!fetch(c, id, ip_ok, 8080), "%s still reached after configure", ip_ok);
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "allowed.test resolved to %s after configure", a);
    lookup(c, id, "other.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_other);
    cr_expect(fetch(c, id, "other.test", 8080), "other.test not reached");
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, wildcard_rules_match_names_below_only)
{
    sbx_client *c = client();
    char *id = test_id("dns-wild");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"*.wild.test\"]}");
    char a[64];
    lookup(c, id, "wild.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "wild.test (the apex) resolved to %s", a);
    lookup(c, id, "a.b.wild.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_ok, "a.b.wild.test resolved to '%s'", a);
    cr_expect(fetch(c, id, "x.wild.test", 9090), "x.wild.test:9090 not reached");
    lookup(c, id, "allowed.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "allowed.test resolved to %s", a);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, another_resolver_gains_nothing)
{
    sbx_client *c = client();
    char *id = test_id("dns-root");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test\"]}");
    int ec;
    /* resolv.conf cannot be changed (a read-only root), and asking the
     * upstream server directly is a connection the policy refuses. */
    char *out = run(c, id, "echo nameserver 198.18.255.9 > /etc/resolv.conf && echo written", &ec);
    cr_expect(!strstr(out, "written"), "resolv.conf was rewritten");
    free(out);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "python3 -c \"import socket\n"
             "q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00"
             "\\x05other\\x04test\\x00\\x00\\x01\\x00\\x01'\n"
             "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(2)\n"
             "try:\n s.sendto(q,('%s',53)); r=s.recv(512); print('answer', len(r))\n"
             "except OSError as e: print('no answer', e)\"",
             dns_ip);
    out = run(c, id, cmd, &ec);
    cr_expect(strstr(out, "no answer"), "the upstream answered the sandbox directly: %s", out);
    free(out);
    /* Whatever it learned, the address stays refused. */
    cr_expect(!fetch(c, id, ip_other, 8080), "%s reached", ip_other);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, bad_rules_are_named)
{
    sbx_client *c = client();
    char *id = test_id("dns-bad");
    static const char *const bad[] = {"bad..name", "*example.org", "-x.test", "*.",
                                      "a.test:0",  "x_y.test",     "a.*.test", "a.test:99999"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        char net[512], code[64], msg[512];
        snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s\"]}", bad[i]);
        create(c, id, net, code, sizeof(code), msg, sizeof(msg));
        cr_expect_str_eq(code, "VALIDATION_FAILED", "%s: %s", bad[i], msg);
        cr_expect(strstr(msg, bad[i]) != NULL, "the message names the rule %s: %s", bad[i], msg);
    }
    char code[64], msg[512];
    create(c, id, "{\"mode\":\"egress\",\"deny\":[\"x.test:443\"]}", code, sizeof(code), msg,
           sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "deny with a port: %s", msg);
    cr_expect(strstr(msg, "network.deny[0]") && strstr(msg, "x.test:443"), "%s", msg);
    create(c, id, "{\"mode\":\"egress\",\"bandwidth\":0}", code, sizeof(code), msg, sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "bandwidth 0: %s", msg);
    create(c, id, "{\"mode\":\"egress\",\"bandwidth\":100001}", code, sizeof(code), msg,
           sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "bandwidth 100001: %s", msg);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* transfer — seconds the sandbox took to read BULK_BYTES from ip_ok:7000
 * (up: to send them to ip_ok:7001 until the server read them all), or -1. */
static double
transfer(sbx_client *c, const char *id, bool up)
{
    char cmd[1024];
    if (up)
        snprintf(cmd, sizeof(cmd),
                 "python3 -c \"import socket,time\n"
                 "s=socket.create_connection(('%s',7001)); t=time.monotonic(); b=bytes(1<<16)\n"
                 "n=0\nwhile n < %d:\n n+=s.send(b[:min(len(b),%d-n)])\n"
                 "s.shutdown(socket.SHUT_WR); s.recv(1)\n"
                 "print(n, time.monotonic()-t)\"",
                 ip_ok, BULK_BYTES, BULK_BYTES);
    else
        snprintf(cmd, sizeof(cmd),
                 "python3 -c \"import socket,time\n"
                 "s=socket.create_connection(('%s',7000)); t=time.monotonic(); n=0\n"
                 "while True:\n b=s.recv(1<<20)\n if not b: break\n n+=len(b)\n"
                 "print(n, time.monotonic()-t)\"",
                 ip_ok);
    int ec;
    char *out = run(c, id, cmd, &ec);
    long long n = 0;
    double t = -1;
    if (sscanf(out, "%lld %lf", &n, &t) != 2 || n != BULK_BYTES)
        t = -1;
    cr_expect_gt(t, 0, "%s: exit %d, %s", up ? "upload" : "download", ec, out);
    free(out);
    return t;
}

Test(egress_dns, bandwidth_limit_holds_within_ten_percent)
{
    sbx_client *c = client();
    char *id = test_id("dns-bw"), *free_id = test_id("dns-nobw");
    char net[256];
    int ec;
    /* The unlimited one first: the shard's first egress sandbox also waits
     * for its router, which is not the limit's cost. */
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s\"]}", ip_ok);
    create_ok(c, free_id, net);
    free(run(c, free_id, "true", &ec));
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s\"],\"bandwidth\":80}", ip_ok);
    create_ok(c, id, net);
    free(run(c, id, "true", &ec));
    /* Goodput: TCP payload bits per second; the limit counts IP + Ethernet
     * headers too (~4.4 % of full 1514-byte frames). */
    for (int up = 0; up < 2; up++) {
        double t = transfer(c, id, up), t0 = transfer(c, free_id, up);
        double mbps = BULK_BYTES * 8.0 / t / 1e6;
        fprintf(stderr, "egress_dns: 20 MB %s: %.1f Mbit/s with a limit of 80, %.1f Mbit/s "
                "without\n", up ? "upload" : "download", mbps, BULK_BYTES * 8.0 / t0 / 1e6);
        cr_expect(mbps >= 72 && mbps <= 88, "%s: %.1f Mbit/s with a limit of 80",
                  up ? "upload" : "download", mbps);
    }
    char *st = status_network(c, id), *st0 = status_network(c, free_id);
    cr_expect_eq(test_json_int(st, "bandwidth"), 80, "%s", st);
    fprintf(stderr, "egress_dns: attach with a bandwidth limit %lld us, without %lld us (which "
            "includes making the router if it was the shard's first egress sandbox)\n",
            test_json_int(st, "attachUs"), test_json_int(st0, "attachUs"));
    free(st);
    free(st0);
    /* configure lifts the limit of the running container. */
    snprintf(net, sizeof(net), "{\"network\":{\"mode\":\"egress\",\"allow\":[\"%s\"]}}", ip_ok);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_expect_eq(sbx_call_json(c, "sandbox.configure", id, net, 30000, &r, &err), 0, "%s",
                 err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
    double t = transfer(c, id, false);
    fprintf(stderr, "egress_dns: after configure without a limit: %.1f Mbit/s\n",
            BULK_BYTES * 8.0 / t / 1e6);
    cr_expect_gt(BULK_BYTES * 8.0 / t / 1e6, 100, "the limit stayed after configure");
    destroy(c, id);
    destroy(c, free_id);
    free(id);
    free(free_id);
    sbx_client_close(c);
}

Test(egress_dns, lookup_round_trip_figures)
{
    /* Figures, not assertions: the added round trip of the sandbox's
     * resolver (forward + nft pin) against the host asking dnsmasq. */
    sbx_client *c = client();
    char *id = test_id("dns-rt");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test\"]}");
    const char *py = "python3 -c \"import socket,time\n"
                     "q=b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00"
                     "\\x07allowed\\x04test\\x00\\x00\\x01\\x00\\x01'\n"
                     "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(3)\n"
                     "ts=[]\n"
                     "for i in range(200):\n t=time.monotonic(); s.sendto(q,('%s',53)); "
                     "s.recv(512); ts.append(time.monotonic()-t)\n"
                     "ts.sort(); print('%%.3f %%.3f' %% (ts[100]*1e3, ts[180]*1e3))\"";
    char cmd[1024];
    snprintf(cmd, sizeof(cmd), py, RESOLVER);
    int ec;
    char *out = run(c, id, cmd, &ec);
    double p50 = 0, p90 = 0;
    cr_expect_eq(sscanf(out, "%lf %lf", &p50, &p90), 2, "%s", out);
    free(out);
    snprintf(cmd, sizeof(cmd), py, dns_ip);
    char hcmd[1200];
    snprintf(hcmd, sizeof(hcmd), "%s > /tmp/sbx-dnsrt-%d 2>&1", cmd, (int)getpid());
    test_shf("%s", hcmd);
    char path[64], *h = NULL;
    size_t hn;
    snprintf(path, sizeof(path), "/tmp/sbx-dnsrt-%d", (int)getpid());
    sbx_fs_read(path, 4096, &h, &hn);
    unlink(path);
    fprintf(stderr, "egress_dns: A lookup round trip p50/p90: sandbox via its resolver %.3f / "
            "%.3f ms; host to dnsmasq directly %s", p50, p90, h ? h : "?\n");
    free(h);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, git_checkout_reaches_a_named_host)
{
    sbx_client *c = client();
    char *id = test_id("dns-git");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"git.test:8000\"]}");
    int ec;
    /* CA certificates are there for https remotes (the host's /etc/ssl). */
    char *out = run(c, id, "test -r /etc/ssl/certs/ca-certificates.crt && echo certs", &ec);
    cr_expect(strstr(out, "certs"), "no /etc/ssl/certs/ca-certificates.crt: %s", out);
    free(out);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    int rc = -1;
    for (int i = 0; i < 20 && rc != 0; i++) { /* the HTTP server may still be starting */
        sbx_reply_free(r);
        r = NULL;
        sbx_error_free(&err);
        rc = sbx_call_json(c, "git.checkout", id,
                           "{\"repoUrl\":\"http://git.test:8000/repo.git\","
                           "\"targetDir\":\"/workspace/repo\"}",
                           60000, &r, &err);
        if (rc)
            usleep(250 * 1000);
    }
    cr_expect_eq(rc, 0, "git.checkout: %s %s", err.code, err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
    out = run(c, id, "cat /workspace/repo/README", &ec);
    cr_expect(strstr(out, "hello-over-git"), "README: %s", out);
    free(out);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* curl_in — plain-HTTP GET of url from the sandbox, with extra curl
 * arguments; what came back (the echo server's body: the head it got). */
static char *
curl_in(sbx_client *c, const char *id, const char *args, const char *url)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "curl -sS --max-time 5 %s %s 2>&1", args, url);
    int ec;
    return run(c, id, cmd, &ec);
}

Test(egress_dns, injected_header_arrives_and_the_secret_stays_outside)
{
    sbx_client *c = client();
    char *id = test_id("inj");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"api.test:80\",\"plain.test:80\"]}");
    char auth[128];
    snprintf(auth, sizeof(auth), "Authorization: Bearer %s", secret);
    /* The rule's host: the header arrives, the sandbox's own never does. */
    char *out = curl_in(c, id, "-H 'Authorization: Bearer forged' -H 'authorization: x2'",
                        "http://api.test/v1/echo");
    cr_expect(strstr(out, "GET /v1/echo HTTP/1.1") && strstr(out, auth),
              "the injected header did not arrive: %s", out);
    cr_expect(!strstr(out, "forged") && !strstr(out, "x2"),
              "the sandbox's header was forwarded: %s", out);
    cr_expect(strstr(out, "Connection: close"), "%s", out);
    free(out);
    /* An absolute-form target names its own host: refused, nothing sent. */
    out = curl_in(c, id, "-i --request-target http://evil.test/x", "http://api.test/");
    cr_expect(strstr(out, "HTTP/1.1 400") && !strstr(out, secret) && !strstr(out, "Host:"),
              "an absolute-form request to a rule's host: %s", out);
    free(out);
    /* A host without a rule: nothing added, its own header as it was. */
    out = curl_in(c, id, "-H 'Authorization: mine'", "http://plain.test/");
    cr_expect(strstr(out, "Authorization: mine") && !strstr(out, secret),
              "plain.test (no rule): %s", out);
    free(out);
    /* The rule's Host aimed at an address the resolver gave for another
     * name: nothing added. */
    out = curl_in(c, id, "", "http://plain.test/"); /* pins its address */
    free(out);
    char res[96];
    snprintf(res, sizeof(res), "--resolve api.test:80:%s", ip_other);
    out = curl_in(c, id, res, "http://api.test/");
    cr_expect(strstr(out, "Host: api.test") && !strstr(out, secret),
              "the header went to another name's address: %s", out);
    free(out);
    /* The secret exists nowhere in the sandbox: its environment, the
     * environ and cmdline of each of its processes, its files (all of /
     * but /proc, /sys, /dev and the host's read-only /usr, which no sandbox
     * or deployment writes to).  The needle is given reversed, so the
     * searching process's own cmdline does not hold it. */
    char rev[64];
    size_t sl = strlen(secret);
    for (size_t i = 0; i < sl; i++)
        rev[i] = secret[sl - 1 - i];
    rev[sl] = '\0';
    char cmd[2048];
    snprintf(cmd, sizeof(cmd),
             "python3 -c \"\n"
             "import os, sys, glob\n"
             "s = sys.argv[1][::-1].encode()\n"
             "hits, n = [], 0\n"
             "if any(s in (k + '=' + v).encode() for k, v in os.environ.items()): hits.append('env')\n"
             "for f in glob.glob('/proc/[0-9]*/environ') + glob.glob('/proc/[0-9]*/cmdline'):\n"
             "    try:\n"
             "        n += 1\n"
             "        if s in open(f, 'rb').read(): hits.append(f)\n"
             "    except OSError: pass\n"
             "for root, dirs, files in os.walk('/'):\n"
             "    if root == '/': dirs[:] = [d for d in dirs if d not in ('proc', 'sys', 'dev', 'usr')]\n"
             "    for name in files:\n"
             "        p = os.path.join(root, name)\n"
             "        try:\n"
             "            if os.path.islink(p) or not os.path.isfile(p): continue\n"
             "            n += 1\n"
             "            if s in open(p, 'rb').read(1 << 24): hits.append(p)\n"
             "        except OSError: pass\n"
             "print('HITS', hits, 'SCANNED', n)\n"
             "\" %s",
             rev);
    int ec;
    out = run(c, id, cmd, &ec);
    cr_expect(strstr(out, "HITS [] SCANNED"), "the secret is visible in the sandbox: %s", out);
    int scanned = 0;
    char *sc = strstr(out, "SCANNED ");
    if (sc)
        scanned = atoi(sc + 8);
    cr_expect_gt(scanned, 20, "the search read too little to mean anything: %s", out);
    free(out);
    /* Nor in the daemon's log. */
    char *log = NULL;
    size_t loglen = 0;
    cr_assert_eq(sbx_fs_read(live->log, 64 << 20, &log, &loglen), 0, "%s", live->log);
    cr_expect(!memmem(log, loglen, secret, strlen(secret)), "the secret is in %s", live->log);
    free(log);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* metric_sum — the sum over shards of the samples of metric whose labels
 * hold `label` (e.g. direction="out"), from the `metrics` op; -1 if none. */
static double
metric_sum(sbx_client *c, const char *metric, const char *label)
{
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call_json(c, "metrics", NULL, "{}", 30000, &r, &err), 0, "metrics: %s",
                 err.message);
    char *json = sbx_reply_json(r, false);
    sbx_reply_free(r);
    double sum = -1;
    size_t ml = strlen(metric);
    for (const char *p = strstr(json, metric); p; p = strstr(p + 1, metric)) {
        if (p[ml] != '{')
            continue;
        const char *end = strstr(p, "}");
        const char *l = strstr(p, label);
        if (!end || !l || l > end)
            continue;
        sum = (sum < 0 ? 0 : sum) + strtod(end + 1, NULL);
    }
    free(json);
    return sum;
}

/* Connections the router sends to the injection proxy are the sandbox's
 * own: counted in status (connections, bytes both ways) and held to its
 * maxConnections, one count with its direct connections (issue 14). */
Test(egress_dns, proxied_connections_are_counted_and_capped)
{
    sbx_client *c = client();
    char *id = test_id("inj-cnt");
    create_ok(c, id,
              "{\"mode\":\"egress\",\"allow\":[\"api.test:80\",\"allowed.test:8080\"],"
              "\"maxConnections\":3}");
    int ec;
    free(run(c, id, "true", &ec)); /* its container and counters are there */
    char *st = status_network(c, id);
    long long in0 = test_json_int(st, "bytesIn"), out0 = test_json_int(st, "bytesOut"),
              n0 = test_json_int(st, "connections");
    cr_assert(in0 >= 0 && out0 >= 0 && n0 >= 0, "no counters before: %s", st);
    free(st);
    double mout0 = metric_sum(c, "sbx_egress_bytes_total", "direction=\\\"out\\\"");
    double min0 = metric_sum(c, "sbx_egress_bytes_total", "direction=\\\"in\\\"");
    cr_assert(mout0 >= 0 && min0 >= 0, "no sbx_egress_bytes_total in the metrics");
    /* A 6,000-byte header goes out and comes back (the echo server returns
     * the head it got), through the proxy. */
    char *out = curl_in(c, id, "-H \"X-Pad: $(head -c 6000 /dev/zero | tr '\\0' p)\"",
                        "http://api.test/v1/echo");
    cr_expect(strstr(out, "X-Pad: ppp") && strstr(out, "Authorization: Bearer "),
              "the proxied request: %.300s", out);
    free(out);
    st = status_network(c, id);
    cr_expect_geq(test_json_int(st, "bytesOut") - out0, 6000, "bytes out of a proxied request: %s", st);
    cr_expect_geq(test_json_int(st, "bytesIn") - in0, 6000, "bytes in of a proxied answer: %s", st);
    cr_expect_geq(test_json_int(st, "connections") - n0, 1, "the proxied connection: %s", st);
    free(st);
    /* The shard's usage counters (/metrics) saw them too. */
    cr_expect_geq(metric_sum(c, "sbx_egress_bytes_total", "direction=\\\"out\\\"") - mout0, 6000,
                  "sbx_egress_bytes_total out");
    cr_expect_geq(metric_sum(c, "sbx_egress_bytes_total", "direction=\\\"in\\\"") - min0, 6000,
                  "sbx_egress_bytes_total in");
    /* maxConnections 3: two held through the proxy and one direct fill it;
     * a fourth, by either path, is refused; after a close one opens again. */
    char a[64];
    lookup(c, id, "api.test", a, sizeof(a));
    char b[64];
    lookup(c, id, "allowed.test", b, sizeof(b));
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "python3 -c '\n"
             "import socket, time\n"
             "def c(h, p):\n"
             "    try:\n"
             "        return socket.create_connection((h, p), timeout=5)\n"
             "    except OSError:\n"
             "        return None\n"
             "held = [c(\"%s\", 80), c(\"%s\", 80), c(\"%s\", 8080)]\n"
             "fourth_proxy = c(\"%s\", 80)\n"
             "fourth_direct = c(\"%s\", 8080)\n"
             "held[0].close()\n"
             "time.sleep(0.5)\n"
             "again = c(\"%s\", 80)\n"
             "print(sum(h is not None for h in held), fourth_proxy is not None,"
             " fourth_direct is not None, again is not None)'",
             a, a, b, a, b, a);
    out = run(c, id, cmd, &ec);
    cr_expect_str_eq(out, "3 False False True\n",
                     "held (2 proxied, 1 direct), a 4th proxied, a 4th direct, one after a close: "
                     "%s", out);
    free(out);
    /* Usage is cumulative: what a container counted stays after it goes. */
    double mout1 = metric_sum(c, "sbx_egress_bytes_total", "direction=\\\"out\\\"");
    destroy(c, id);
    cr_expect_geq(metric_sum(c, "sbx_egress_bytes_total", "direction=\\\"out\\\"") - mout1, 0,
                  "sbx_egress_bytes_total fell when the sandbox went");
    free(id);
    sbx_client_close(c);
}

/* An address the deployment names always denied (--egress-deny; the
 * cluster's members and etcd join the same set) is refused whatever the
 * policy: under a rule that covers it and under one that names it; the
 * same test host's other address stays reachable (issue 14). */
Test(egress_dns, deployment_denied_addresses_stay_closed)
{
    cr_assert_eq(test_shf("curl -s --max-time 5 http://%s:8080/ | grep -q %s", ip_deny, BODY), 0,
                 "the host does not reach %s itself: the test proves nothing", ip_deny);
    sbx_client *c = client();
    char *id = test_id("deny");
    char net[256];
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"198.19.0.0/16\",\"%s/32:8080\"]}",
             ip_deny);
    create_ok(c, id, net);
    cr_expect(fetch(c, id, ip_ok, 8080), "%s:8080 (allowed) was not reached", ip_ok);
    cr_expect(!fetch(c, id, ip_deny, 8080), "%s:8080 (--egress-deny) was reached", ip_deny);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress_dns, injection_keeps_the_policy)
{
    sbx_client *c = client();
    char *id = test_id("inj-no");
    /* api.test is not allowed: no answer, and its address is refused (no
     * header goes anywhere). */
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"plain.test:80\"]}");
    char a[64];
    lookup(c, id, "api.test", a, sizeof(a));
    cr_expect_str_eq(a, "", "api.test resolved to %s", a);
    char res[96];
    snprintf(res, sizeof(res), "--resolve api.test:80:%s", ip_ok);
    char *out = curl_in(c, id, res, "http://api.test/");
    cr_expect(!strstr(out, "HTTP/1") && !strstr(out, secret) && !strstr(out, "Host:"),
              "a host the policy does not allow was reached: %s", out);
    free(out);
    /* Allowed on another port only (443): port 80 is not opened by the
     * rule, through the proxy or not. */
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call_json(c, "sandbox.configure", id,
                               "{\"network\":{\"mode\":\"egress\",\"allow\":[\"api.test:443\"]}}",
                               30000, &r, &err),
                 0, "configure: %s", err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
    lookup(c, id, "api.test", a, sizeof(a));
    cr_expect_str_eq(a, ip_ok);
    out = curl_in(c, id, "", "http://api.test/");
    cr_expect(!strstr(out, secret) && !strstr(out, "Host:"), "port 80 reached: %s", out);
    free(out);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* ask_tcp — the sandbox asks its resolver (or addr) for name's A record
 * over TCP (RFC 7766 framing), in Python: "rcode R addr A" (A the first
 * address, or "-"). */
static char *
ask_tcp(sbx_client *c, const char *id, const char *name)
{
    char cmd[1536];
    snprintf(cmd, sizeof(cmd),
             "python3 -c \"\n"
             "import socket, struct, sys\n"
             "n = sys.argv[1]\n"
             "q = b'\\x12\\x34\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00' + "
             "b''.join(bytes([len(l)]) + l.encode() for l in n.split('.')) + b'\\x00\\x00\\x01\\x00\\x01'\n"
             "s = socket.create_connection(('" RESOLVER "', 53), timeout=8)\n"
             "s.sendall(struct.pack('!H', len(q)) + q)\n"
             "def rd(k):\n"
             "    b = b''\n"
             "    while len(b) < k:\n"
             "        x = s.recv(k - len(b))\n"
             "        if not x: raise SystemExit('closed')\n"
             "        b += x\n"
             "    return b\n"
             "r = rd(struct.unpack('!H', rd(2))[0])\n"
             "a = '-'\n"
             "if struct.unpack('!H', r[6:8])[0] > 0 and r[-6:-4] == b'\\x00\\x04': a = socket.inet_ntoa(r[-4:])\n"
             "print('rcode', r[3] & 15, 'addr', a, 'id', r[0:2].hex())\n"
             "\" %s 2>&1",
             name);
    int ec;
    return run(c, id, cmd, &ec);
}

Test(egress_dns, dns_over_tcp_answers_and_pins)
{
    sbx_client *c = client();
    char *id = test_id("dns-tcp");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test:8080\"]}");
    cr_expect(!fetch(c, id, ip_ok, 8080), "%s reached before a lookup", ip_ok);
    char *out = ask_tcp(c, id, "allowed.test");
    char want[96];
    snprintf(want, sizeof(want), "rcode 0 addr %s id 1234", ip_ok);
    cr_expect(strstr(out, want), "over TCP: %s", out);
    free(out);
    /* The TCP answer pinned the address as a UDP one does. */
    cr_expect(fetch(c, id, ip_ok, 8080), "not reached after a lookup over TCP");
    out = ask_tcp(c, id, "other.test");
    cr_expect(strstr(out, "rcode 5 addr -"), "an unlisted name over TCP: %s", out);
    free(out);
    /* glibc's own client over TCP (RES_OPTIONS=use-vc). */
    int ec;
    out = run(c, id, "RES_OPTIONS=use-vc getent ahostsv4 allowed.test | awk 'NR==1 {print $1}'",
              &ec);
    cr_expect(!strncmp(out, ip_ok, strlen(ip_ok)), "use-vc lookup: '%s'", out);
    free(out);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* servfail_ns — a child in the test host answering every UDP query on
 * addr:port with SERVFAIL. */
static pid_t
servfail_ns(const char *addr, int port)
{
    pid_t pid = fork();
    if (pid == 0) {
        int nfd = open(ns_path, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
            _exit(126);
        char py[512];
        snprintf(py, sizeof(py),
                 "import socket\n"
                 "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
                 "s.bind(('%s', %d))\n"
                 "while True:\n"
                 "    q, a = s.recvfrom(4096)\n"
                 "    r = bytearray(q); r[2] |= 0x80; r[3] = (r[3] & 0xf0) | 2\n"
                 "    s.sendto(bytes(r), a)\n",
                 addr, port);
        execl("/usr/bin/python3", "python3", "-c", py, (char *)NULL);
        _exit(127);
    }
    return pid;
}

Test(egress_dns, upstream_failover)
{
    /* A daemon whose first upstream answers SERVFAIL, whose second is
     * silent (nothing listens there), and whose third is the dnsmasq. */
    pid_t sf = servfail_ns(ip_other, 5300);
    cr_assert_gt(sf, 0);
    usleep(300 * 1000);
    char ups[128];
    snprintf(ups, sizeof(ups), "%s:5300,%s:5353,%s", ip_other, ip_ok, dns_ip);
    struct testd *d2 = sbx_xcalloc(1, sizeof(*d2));
    const char *const extra[] = {TESTD_SMALL, "--dns-upstream", ups, NULL};
    int started = testd_start(d2, 1, extra);
    sbx_client *c = NULL;
    sbx_error err = {0};
    char *id = test_id("dns-fo");
    if (started == 0 && sbx_client_open(&c, d2->url, &err) == 0) {
        create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test:8080\"]}");
        char a[64];
        lookup(c, id, "allowed.test", a, sizeof(a));
        cr_expect_str_eq(a, ip_ok, "over UDP past a SERVFAIL and a silent upstream: '%s'", a);
        cr_expect(fetch(c, id, "allowed.test", 8080), "allowed.test:8080 not reached");
        char *out = ask_tcp(c, id, "wild.test");
        cr_expect(strstr(out, "rcode 5"), "wild.test is not allowed: %s", out);
        free(out);
        out = ask_tcp(c, id, "allowed.test");
        char want[64];
        snprintf(want, sizeof(want), "rcode 0 addr %s", ip_ok);
        cr_expect(strstr(out, want), "over TCP past the failing upstreams: %s", out);
        free(out);
        destroy(c, id);
        sbx_client_close(c);
    } else {
        cr_expect(false, "the second daemon: %s", started ? "did not start" : err.message);
    }
    sbx_error_free(&err);
    free(id);
    testd_stop(d2);
    free(d2);
    stop_child(&sf);
}

/* Figures, not assertions: the time of a plain-HTTP request from a sandbox
 * after its name is resolved (curl's time_total less time_namelookup:
 * connect, request, answer), through the injecting proxy (api.test) and
 * straight (plain.test), 40 each, p50 / p90. */
Test(egress_dns, injection_round_trip_figures)
{
    sbx_client *c = client();
    char *id = test_id("inj-fig");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"api.test:80\",\"plain.test:80\"]}");
    const char *hosts[] = {"api.test", "plain.test"};
    double p50[2] = {0}, p90[2] = {0};
    for (int h = 0; h < 2; h++) {
        char cmd[512];
        snprintf(cmd, sizeof(cmd),
                 "for i in $(seq 40); do curl -s -o /dev/null -w '%%{time_total} "
                 "%%{time_namelookup}\\n' http://%s/; done | awk '{printf \"%%.3f\\n\", "
                 "($1 - $2) * 1000}' | sort -n | awk '{v[NR]=$1} END {print v[int(NR*0.5)], "
                 "v[int(NR*0.9)]}'",
                 hosts[h]);
        int ec;
        char *out = run(c, id, cmd, &ec);
        cr_expect_eq(sscanf(out, "%lf %lf", &p50[h], &p90[h]), 2, "%s: %s", hosts[h], out);
        free(out);
    }
    fprintf(stderr,
            "egress_dns: plain-HTTP request after lookup p50/p90: through the injecting proxy "
            "%.3f / %.3f ms; straight %.3f / %.3f ms\n",
            p50[0], p90[0], p50[1], p90[1]);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/*
 * IPv6: an allowed name's AAAA query gets an empty answer (sandboxes have no
 * IPv6; docs/network.md §IPv6), while its A query answers, in one sandbox.
 */
Test(egress_dns, aaaa_answers_are_empty)
{
    sbx_client *c = client();
    char *id = test_id("dns-v6");
    /* Upstream has an AAAA record for it: an empty answer below is sbx's. */
    cr_assert_eq(test_shf("python3 -c \"import socket,sys\n"
                    "q=b'\\x12\\x35\\x01\\x00\\x00\\x01\\x00\\x00\\x00\\x00\\x00\\x00"
                    "\\x07allowed\\x04test\\x00\\x00\\x1c\\x00\\x01'\n"
                    "s=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); s.settimeout(2)\n"
                    "s.sendto(q,('%s',53)); r=s.recv(512); sys.exit(0 if r[7] > 0 else 1)\" ",
                    dns_ip),
                 0, "the test's dnsmasq has no AAAA record for allowed.test");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"allowed.test:8080\"]}");
    int ec;
    char *out = run(c, id,
                    "python3 -c 'import socket\n"
                    "for f in (socket.AF_INET, socket.AF_INET6):\n"
                    " try: print(f.name, sorted({a[4][0] for a in socket.getaddrinfo("
                    "\"allowed.test\", 8080, f)}))\n"
                    " except socket.gaierror as e: print(f.name, \"none\", e)' 2>&1",
                    &ec);
    char want[128];
    snprintf(want, sizeof(want), "AF_INET ['%s']", ip_ok);
    cr_expect(strstr(out, want), "the A answer: %s", out);
    cr_expect(strstr(out, "AF_INET6 none"), "an AAAA answer: %s", out);
    free(out);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}
