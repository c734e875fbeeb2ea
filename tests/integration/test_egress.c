/*
 * test_egress.c — outbound network of sandboxes (docs/network.md, issue 14):
 * an `egress` sandbox reaches a test host when its policy allows it and is
 * refused when not; a `none` sandbox reaches nothing; the host's addresses,
 * the metadata address, another sandbox and the router are refused whatever
 * the policy; a rule that would open an always-denied range is
 * VALIDATION_FAILED naming the rule; the sandbox's root cannot lift the
 * policy; status counts bytes and connections.
 *
 * The test host is a network namespace this test makes ("<prefix>egr<pid>"),
 * joined to the host by a veth pair ("egh<pid>" on the host side) with a /30
 * of 198.18.0.0/16 (RFC 2544 benchmarking: not private, so an egress policy
 * may open it; test_egress_dns and test_egress_traffic take 198.19.0.0/16 (egress_util.c), so they never meet) and an HTTP-ish server in it on port 8080.  The host side of
 * the veth forwards (net.ipv4.conf.egh<pid>.forwarding, which goes with the
 * veth), so that the replies reach the shard's router.  Everything is removed
 * by name and pid in the fixture's fini; tools/leftovers.sh lists the netns
 * (its name carries the run's prefix) if it is not.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <jansson.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/clirun.h"
#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/imgbuild.h"

#define BODY "hello-from-the-test-host"

static char ns_name[64], host_if[16], host_ip[16], peer_ip[16];
static pid_t server_pid = -1, host_listener_pid = -1;
static int host_port;


/* serve — accept on fd forever, answer each connection with BODY. */
static void __attribute__((noreturn))
serve(int fd)
{
    for (;;) {
        int c = accept(fd, NULL, NULL);
        if (c < 0)
            continue;
        char buf[512];
        (void)!read(c, buf, sizeof(buf));
        const char *r = "HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\n\r\n" BODY "\n";
        (void)!write(c, r, strlen(r));
        /* Close gracefully: unread input at close(2) would reset the
         * connection, and the client could lose the answer. */
        shutdown(c, SHUT_WR);
        struct timeval tv = {.tv_sec = 2};
        setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        while (read(c, buf, sizeof(buf)) > 0)
            ;
        close(c);
    }
}

/* listen_in — a child that listens on addr:port (IPv4, or IPv6 when addr has
 * a ':') in netns path (NULL: ours). */
static pid_t
listen_in(const char *nspath, const char *addr, int port)
{
    int ready[2];
    if (pipe(ready) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(ready[0]);
        /* Ends with the test process, should a failed assertion skip stop_child. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (nspath) {
            int nfd = open(nspath, O_RDONLY | O_CLOEXEC);
            if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
                _exit(1);
        }
        bool v6 = strchr(addr, ':') != NULL; /* an IPv6 address: v6 only */
        int fd = socket(v6 ? AF_INET6 : AF_INET, SOCK_STREAM, 0), one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        struct sockaddr_in6 sa6 = {.sin6_family = AF_INET6, .sin6_port = htons((uint16_t)port)};
        int ok = v6 ? inet_pton(AF_INET6, addr, &sa6.sin6_addr) : inet_pton(AF_INET, addr, &sa.sin_addr);
        if (v6)
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
        if (ok != 1 ||
            (v6 ? bind(fd, (struct sockaddr *)&sa6, sizeof(sa6))
                : bind(fd, (struct sockaddr *)&sa, sizeof(sa))) < 0 ||
            listen(fd, 64) < 0)
            _exit(1);
        (void)!write(ready[1], "r", 1);
        close(ready[1]);
        serve(fd);
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

static void
host_up(void)
{
    int p = (int)getpid();
    uint32_t idx = (uint32_t)p % 16384u; /* a /30 of 198.18.0.0/16 */
    uint32_t base = (198u << 24) | (18u << 16) | (idx << 2);
    snprintf(host_ip, sizeof(host_ip), "%u.%u.%u.%u", base >> 24, (base >> 16) & 255,
             (base >> 8) & 255, (base & 255) + 1);
    snprintf(peer_ip, sizeof(peer_ip), "%u.%u.%u.%u", base >> 24, (base >> 16) & 255,
             (base >> 8) & 255, (base & 255) + 2);
    snprintf(ns_name, sizeof(ns_name), "%segr%d", test_prefix(), p);
    snprintf(host_if, sizeof(host_if), "egh%d", p);
    cr_assert_eq(test_shf("ip netns add %s && ip link add %s type veth peer name eth0 netns %s && "
                    "ip addr add %s/30 dev %s && ip link set %s up && "
                    "ip -n %s addr add %s/30 dev eth0 && ip -n %s link set eth0 up && "
                    "ip -n %s link set lo up && ip -n %s route add default via %s && "
                    "echo 1 > /proc/sys/net/ipv4/conf/%s/forwarding",
                    ns_name, host_if, ns_name, host_ip, host_if, host_if, ns_name, peer_ip,
                    ns_name, ns_name, ns_name, host_ip, host_if),
                 0, "could not make the test host %s", ns_name);
    char path[128];
    snprintf(path, sizeof(path), "/run/netns/%s", ns_name);
    server_pid = listen_in(path, peer_ip, 8080);
    cr_assert_gt(server_pid, 0, "test host server");
    /* A service of the host itself, on every address. */
    host_port = 20000 + p % 20000;
    host_listener_pid = listen_in(NULL, "0.0.0.0", host_port);
    if (host_listener_pid < 0) {
        host_port = 20001 + p % 20000;
        host_listener_pid = listen_in(NULL, "0.0.0.0", host_port);
    }
    cr_assert_gt(host_listener_pid, 0, "host listener");
}

static void
host_down(void)
{
    cli_reap_all();
    stop_child(&server_pid);
    stop_child(&host_listener_pid);
    if (ns_name[0])
        test_shf("ip netns delete %s 2>/dev/null; ip link delete %s 2>/dev/null; true", ns_name,
           host_if);
}

TestSuite(egress, .init = host_up, .fini = host_down, .timeout = 240);

/* create — create id with the given network JSON; the error code or "" */
static void
create(sbx_client *c, const char *id, const char *network_json, char *code, size_t clen,
       char *msg, size_t mlen)
{
    char args[4096];
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

/* fetch — connect from the sandbox to ip:port, send a request, print what
 * comes back; the shell's output (heap) and exit code. */
static char *
fetch(sbx_client *c, const char *id, const char *ip, int port, int *exit_code)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd),
             "timeout 5 bash -c 'exec 3<>/dev/tcp/%s/%d && printf \"GET / HTTP/1.0\\r\\n\\r\\n\" "
             ">&3 && cat <&3' 2>&1",
             ip, port);
    sbx_exec_result r;
    sbx_error err = {0};
    cr_assert_eq(test_sh(c, id, cmd, 30000, &r, &err), 0, "exec in %s: %s", id, err.message);
    char *out = strndup((const char *)r.stdout_data, r.stdout_len);
    *exit_code = r.exit_code;
    sbx_exec_result_free(&r);
    sbx_error_free(&err);
    return out;
}

static void
expect_reaches(sbx_client *c, const char *id, const char *ip, int port)
{
    int ec;
    char *out = fetch(c, id, ip, port, &ec);
    cr_expect(strstr(out, BODY) != NULL, "%s should reach %s:%d: exit %d, %s", id, ip, port, ec,
              out);
    free(out);
}

static void
expect_refused(sbx_client *c, const char *id, const char *ip, int port)
{
    int ec;
    char *out = fetch(c, id, ip, port, &ec);
    cr_expect(ec != 0 && !strstr(out, BODY), "%s must not reach %s:%d: exit %d, %s", id, ip,
              port, ec, out);
    free(out);
}

/* status_network — the "network" object of status, as JSON text (heap). */
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

static void
destroy(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_expect_eq(sbx_call(c, "destroy", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
}

Test(egress, allowed_host_is_reached_and_counted)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-ok");
    char net[256];
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s/32:8080\"]}", peer_ip);
    create_ok(c, id, net);
    expect_reaches(c, id, peer_ip, 8080);
    char *st = status_network(c, id);
    cr_expect(strstr(st, "\"mode\":\"egress\""), "%s", st);
    cr_expect_geq(test_json_int(st, "connections"), 1, "%s", st);
    cr_expect_gt(test_json_int(st, "bytesOut"), 0, "%s", st);
    cr_expect_gt(test_json_int(st, "bytesIn"), (long long)strlen(BODY), "%s", st);
    free(st);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress, not_allowed_is_refused)
{
    sbx_client *c = test_client();
    char net[256];
    /* Allowed elsewhere only; allowed on another port only; allowed but denied. */
    char *a = test_id("egr-other"), *b = test_id("egr-port"), *d = test_id("egr-deny");
    create_ok(c, a, "{\"mode\":\"egress\",\"allow\":[\"203.0.113.0/24\"]}");
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s/32:9\"]}", peer_ip);
    create_ok(c, b, net);
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"0.0.0.0/0\"],\"deny\":[\"%s\"]}",
             peer_ip);
    create_ok(c, d, net);
    expect_refused(c, a, peer_ip, 8080);
    expect_refused(c, b, peer_ip, 8080);
    expect_refused(c, d, peer_ip, 8080);
    char *st = status_network(c, a);
    cr_expect_eq(test_json_int(st, "connections"), 0, "%s", st);
    free(st);
    destroy(c, a);
    destroy(c, b);
    destroy(c, d);
    free(a);
    free(b);
    free(d);
    sbx_client_close(c);
}

Test(egress, none_reaches_nothing)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-none");
    create_ok(c, id, "{\"mode\":\"none\"}");
    expect_refused(c, id, peer_ip, 8080);
    sbx_exec_result r;
    sbx_error err = {0};
    cr_assert_eq(test_sh(c, id, "awk 'NR > 2 {print $1}' /proc/net/dev", 30000, &r, &err), 0,
                 "%s", err.message);
    cr_expect_str_eq(r.stdout_data, "lo:\n", "interfaces: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    char *st = status_network(c, id);
    cr_expect(strstr(st, "\"mode\":\"none\""), "%s", st);
    free(st);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress, always_denied_whatever_the_policy)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-all"), *other = test_id("egr-peer");
    const char *all = "{\"mode\":\"egress\",\"allow\":[\"0.0.0.0/0\",\"10.0.0.0/8\","
                      "\"172.16.0.0/12\",\"192.168.0.0/16\",\"100.64.0.0/10\"]}";
    create_ok(c, id, all);
    create_ok(c, other, all);
    /* The policy does let traffic out: the refusals below are the policy's. */
    expect_reaches(c, id, peer_ip, 8080);
    /* The host: every IPv4 address it has, on a port it serves on all. */
    struct ifaddrs *ifs = NULL;
    cr_assert_eq(getifaddrs(&ifs), 0);
    int n = 0;
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || n >= 6)
            continue;
        char a[INET_ADDRSTRLEN];
        inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, a, sizeof(a));
        if (!strcmp(a, "127.0.0.1"))
            continue;
        expect_refused(c, id, a, host_port);
        n++;
    }
    freeifaddrs(ifs);
    cr_expect_gt(n, 0, "no host address to try");
    /* The host-side address of the test host's own link is the host's too. */
    expect_refused(c, id, host_ip, host_port);
    expect_refused(c, id, "169.254.169.254", 80);
    /* Another sandbox, serving on its address. */
    sbx_exec_result r;
    sbx_error err = {0};
    cr_assert_eq(test_sh(c, other,
                         "python3 -c 'import socket,os\n"
                         "s=socket.socket(); s.bind((\"0.0.0.0\",8080)); s.listen()\n"
                         "if os.fork(): os._exit(0)\n"
                         "while True:\n c,_=s.accept(); c.recv(99); c.sendall(b\"" BODY "\"); "
                         "c.close()' </dev/null >/dev/null 2>&1; ip -o -4 addr show eth0 | "
                         "awk '{print $4}' | cut -d/ -f1",
                         30000, &r, &err),
                 0, "%s", err.message);
    char other_ip[32];
    snprintf(other_ip, sizeof(other_ip), "%.*s", (int)strcspn((char *)r.stdout_data, "\n"),
             (char *)r.stdout_data);
    sbx_exec_result_free(&r);
    cr_expect(other_ip[0], "the other sandbox has no address");
    expect_refused(c, id, other_ip, 8080);
    /* Its gateway (the shard's router). */
    char *st = status_network(c, id);
    const char *p = strstr(st, "\"address\":\"");
    cr_assert_not_null(p, "%s", st);
    unsigned a1, a2, a3, a4;
    cr_assert_eq(sscanf(p + 11, "%u.%u.%u.%u", &a1, &a2, &a3, &a4), 4);
    char gw[32];
    snprintf(gw, sizeof(gw), "%u.%u.%u.%u", a1, a2, a3, a4 - 1);
    expect_refused(c, id, gw, 22);
    free(st);
    destroy(c, id);
    destroy(c, other);
    free(id);
    free(other);
    sbx_client_close(c);
}

Test(egress, rules_that_open_denied_ranges_are_refused)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-bad");
    static const char *const bad[] = {
        "169.254.169.254", "169.254.0.0/16:80", "127.0.0.1:22", "10.88.0.0/24",
        "224.0.0.1",       "not_a_cidr",        "1.2.3.4:0",    "1.2.3.5/24", "fd00:ec2::254",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        char net[256], code[64], msg[512];
        snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s\"]}", bad[i]);
        create(c, id, net, code, sizeof(code), msg, sizeof(msg));
        cr_expect_str_eq(code, "VALIDATION_FAILED", "%s: %s", bad[i], msg);
        cr_expect(strstr(msg, bad[i]) != NULL, "the message names the rule %s: %s", bad[i], msg);
    }
    /* A host address, as a deny-list entry too is fine, as an allow it is not. */
    char net[8192], code[64], msg[512];
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s\"]}", host_ip);
    create(c, id, net, code, sizeof(code), msg, sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "%s: %s", host_ip, msg);
    /* Too large a policy. */
    size_t k = (size_t)snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[");
    for (int i = 0; i < 65; i++)
        k += (size_t)snprintf(net + k, sizeof(net) - k, "%s\"203.0.113.%d\"", i ? "," : "", i);
    snprintf(net + k, sizeof(net) - k, "]}");
    create(c, id, net, code, sizeof(code), msg, sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "65 rules: %s", msg);
    create(c, id, "{\"mode\":\"everything\"}", code, sizeof(code), msg, sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "bad mode: %s", msg);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

Test(egress, sandbox_root_cannot_lift_the_policy)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-root");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"203.0.113.0/24\"]}");
    sbx_exec_result r;
    sbx_error err = {0};
    /* Each attempt must fail; the last line counts the ones that did not. */
    cr_assert_eq(test_sh(c, id,
                         "ok=0; nft flush ruleset 2>/dev/null && ok=$((ok+1)); "
                         "ip addr add 10.88.255.1/32 dev eth0 2>/dev/null && ok=$((ok+1)); "
                         "ip route replace default dev eth0 2>/dev/null && ok=$((ok+1)); "
                         "ip link add d0 type dummy 2>/dev/null && ok=$((ok+1)); "
                         "ip link set eth0 down 2>/dev/null && ok=$((ok+1)); "
                         "unshare -n true 2>/dev/null && ok=$((ok+1)); "
                         "grep CapEff /proc/self/status | awk '{print $2}'; echo $ok",
                         30000, &r, &err),
                 0, "%s", err.message);
    cr_expect(strstr((char *)r.stdout_data, "0000000000000000\n0\n") != NULL,
              "root inside changed its network: %.*s", (int)r.stdout_len, (char *)r.stdout_data);
    sbx_exec_result_free(&r);
    expect_refused(c, id, peer_ip, 8080);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* What a user of the CLI does: sbx create ID --network egress --allow CIDR:PORT;
 * the sandbox reaches the allowed host; a bad rule exits non-zero naming it. */
Test(egress, cli_create_with_a_policy)
{
    char *id = test_id("egr-cli");
    char allow[64];
    snprintf(allow, sizeof(allow), "%s:8080", peer_ip);
    struct cli r = cli_run(test_url(), NULL, 0,
                           (const char *const[]){"create", id, "--network", "egress", "--allow",
                                                 allow, "--deny", "203.0.113.0/24", NULL});
    cr_expect_eq(r.status, 0, "%s: %s %s", r.what, r.o.p, r.e.p);
    cli_free(&r);
    char cmd[256];
    snprintf(cmd, sizeof(cmd),
             "exec 3<>/dev/tcp/%s/8080 && printf 'GET / HTTP/1.0\\r\\n\\r\\n' >&3 && cat <&3",
             peer_ip);
    r = cli_run(test_url(), NULL, 0, (const char *const[]){"exec", id, cmd, NULL});
    cr_expect(strstr(r.o.p, BODY) != NULL, "%s: %s %s", r.what, r.o.p, r.e.p);
    cli_free(&r);
    r = cli_run(test_url(), NULL, 0, (const char *const[]){"status", id, "--json", NULL});
    cr_expect(strstr(r.o.p, "\"egress\"") && strstr(r.o.p, allow), "%s", r.o.p);
    cli_free(&r);
    r = cli_run(test_url(), NULL, 0,
                (const char *const[]){"create", id, "--network", "egress", "--allow",
                                      "169.254.169.254:80", NULL});
    cr_expect_neq(r.status, 0, "%s accepted a metadata rule", r.what);
    cr_expect(strstr(r.e.p, "VALIDATION_FAILED") && strstr(r.e.p, "169.254.169.254:80"),
              "%s: %s", r.what, r.e.p);
    cli_free(&r);
    r = cli_run(test_url(), NULL, 0, (const char *const[]){"destroy", id, NULL});
    cli_free(&r);
    free(id);
}

/* sandbox.configure changes the policy; it applies from the next container. */
Test(egress, configure_applies_at_the_next_start)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-conf");
    create_ok(c, id, "{\"mode\":\"none\"}");
    expect_refused(c, id, peer_ip, 8080);
    char args[256];
    snprintf(args, sizeof(args), "{\"network\":{\"mode\":\"egress\",\"allow\":[\"%s\"]}}",
             peer_ip);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call_json(c, "sandbox.configure", id, args, 30000, &r, &err), 0, "%s",
                 err.message);
    sbx_reply_free(r);
    /* A bad rule through configure: refused, the settings unchanged. */
    cr_expect_neq(sbx_call_json(c, "sandbox.configure", id,
                                "{\"network\":{\"allow\":[\"127.0.0.1\"]}}", 30000, &r, &err),
                  0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s", err.message);
    sbx_error_free(&err);
    /* Still the running container's (none) until it is restarted. */
    expect_refused(c, id, peer_ip, 8080);
    char *st = status_network(c, id);
    cr_expect(strstr(st, "\"mode\":\"egress\"") && !strstr(st, "127.0.0.1"), "%s", st);
    free(st);
    /* Let the container stop for idleness (sleepAfter 1 s); the next
     * operation starts one with the new settings. */
    cr_assert_eq(sbx_call_json(c, "sandbox.configure", id, "{\"sleepAfter\":\"1s\"}", 30000, &r,
                               &err),
                 0, "%s", err.message);
    sbx_reply_free(r);
    bool stopped = false;
    for (int i = 0; i < 150 && !stopped; i++) {
        cr_assert_eq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
        char *json = sbx_reply_json(r, false);
        stopped = strstr(json, "\"state\":\"stopped\"") != NULL;
        free(json);
        sbx_reply_free(r);
        if (!stopped)
            usleep(100 * 1000);
    }
    cr_assert(stopped, "the container did not stop for idleness");
    expect_reaches(c, id, peer_ip, 8080);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* maxConnections: that many connections open at once, the next refused;
 * once one closes, a new one is accepted again. */
Test(egress, connection_limit)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-conn");
    char net[256];
    snprintf(net, sizeof(net),
             "{\"mode\":\"egress\",\"allow\":[\"%s\"],\"maxConnections\":3}", peer_ip);
    create_ok(c, id, net);
    char *st = status_network(c, id);
    cr_expect_eq(test_json_int(st, "maxConnections"), 3, "%s", st);
    free(st);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "python3 -c '\n"
             "import socket\n"
             "def c():\n"
             "    try:\n"
             "        return socket.create_connection((\"%s\", 8080), timeout=5)\n"
             "    except OSError as e:\n"
             "        return None\n"
             "held = [c() for _ in range(3)]\n"
             "fourth = c()\n"
             "held[0].close()\n"
             "import time; time.sleep(0.5)\n"
             "again = c()\n"
             "print(sum(h is not None for h in held), fourth is not None, again is not None)'",
             peer_ip);
    sbx_exec_result r;
    sbx_error err = {0};
    cr_assert_eq(test_sh(c, id, cmd, 60000, &r, &err), 0, "%s", err.message);
    cr_expect_str_eq(r.stdout_data, "3 False True\n", "held, fourth, after a close: %s %s",
                     r.stdout_data, r.stderr_data);
    sbx_exec_result_free(&r);
    /* Out of range: VALIDATION_FAILED. */
    char code[64], msg[512];
    create(c, id, "{\"mode\":\"egress\",\"maxConnections\":0}", code, sizeof(code), msg,
           sizeof(msg));
    cr_expect_str_eq(code, "VALIDATION_FAILED", "%s", msg);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* A running egress sandbox's rules change at once for new connections
 * (issue 14: within 1 s), without a new container. */
Test(egress, policy_change_applies_to_new_connections)
{
    sbx_client *c = test_client();
    char *id = test_id("egr-live");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"203.0.113.0/24\"]}");
    expect_refused(c, id, peer_ip, 8080);
    char *st = status_network(c, id);
    long long pid_before = test_json_int(st, "pid");
    cr_expect_gt(pid_before, 0, "no running container in %s", st);
    free(st);
    char args[256];
    snprintf(args, sizeof(args), "{\"network\":{\"mode\":\"egress\",\"allow\":[\"%s\"]}}",
             peer_ip);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call_json(c, "sandbox.configure", id, args, 30000, &r, &err), 0, "%s",
                 err.message);
    sbx_reply_free(r);
    expect_reaches(c, id, peer_ip, 8080);
    snprintf(args, sizeof(args),
             "{\"network\":{\"mode\":\"egress\",\"allow\":[\"%s\"],\"deny\":[\"%s:8080\"]}}",
             peer_ip, peer_ip);
    cr_assert_eq(sbx_call_json(c, "sandbox.configure", id, args, 30000, &r, &err), 0, "%s",
                 err.message);
    sbx_reply_free(r);
    expect_refused(c, id, peer_ip, 8080);
    /* The same container all along. */
    st = status_network(c, id);
    cr_expect_eq(test_json_int(st, "pid"), pid_before, "a new container was started: %s", st);
    free(st);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
}

/* An image sandbox (docs/images.md) with egress: both its image root and
 * its network (the worker starts the one, then attaches the other; the
 * merge of the two features first left an image sandbox without its
 * network). */
Test(egress, an_image_sandbox_reaches_the_allowed_host)
{
    char work[128], dir[192], layer[192], diff[72], digest[72];
    snprintf(work, sizeof(work), "/tmp/sbx-egr-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    size_t nb = 0;
    struct imgb_entry *base = imgb_base_entries(&nb);
    cr_assert(base, "busybox-static is not installed (tools/deps.sh)");
    snprintf(layer, sizeof(layer), "%s/l0.tar.gz", work);
    cr_assert_eq(imgb_layer(layer, base, nb, true, diff), 0);
    imgb_entries_free(base, nb);
    char *layers[] = {layer};
    const char *diffs[] = {diff};
    snprintf(dir, sizeof(dir), "%s/img", work);
    cr_assert_eq(imgb_layout(dir, layers, diffs, 1, true, NULL, digest), 0);

    sbx_client *c = test_client();
    char args[512];
    snprintf(args, sizeof(args), "{\"path\":\"%s\"}", dir);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call_json(c, "image.import", NULL, args, 120000, &r, &err), 0,
                 "image.import: %s %s", err.code, err.message);
    sbx_reply_free(r);
    char *id = test_id("egr-img");
    snprintf(args, sizeof(args),
             "{\"image\":\"%s\",\"network\":{\"mode\":\"egress\",\"allow\":[\"%s/32:8080\"]}}",
             digest, peer_ip);
    cr_assert_eq(sbx_call_json(c, "create", id, args, 30000, &r, &err), 0, "create: %s %s",
                 err.code, err.message);
    sbx_reply_free(r);
    expect_reaches(c, id, peer_ip, 8080);
    expect_refused(c, id, peer_ip, 8081);
    destroy(c, id);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", digest);
    cr_expect_eq(sbx_call_json(c, "image.rm", NULL, args, 30000, &r, &err), 0, "image.rm: %s",
                 err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
    free(id);
    sbx_client_close(c);
    sbx_rm_rf(work);
}

/* git.checkout over https (issue 14: "gitCheckout over https works when the
 * policy allows the host"): a git server on the test host (a bare
 * repository served over TLS by Python's http.server, git's "dumb" HTTP
 * protocol, with a certificate of a CA made here by tools/sbx-cert), the
 * sandbox trusting that CA (its own git config), allowed the host's port:
 * the checkout succeeds and holds the commit's file; a sandbox allowed only
 * another port gets a GIT_ error by the call's deadline, nothing cloned. */
Test(egress, git_checkout_over_https_when_the_policy_allows)
{
    char dir[128];
    snprintf(dir, sizeof(dir), "/tmp/sbx-egit-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_eq(test_shf("tools/sbx-cert ca %s/pki >/dev/null && "
                    "tools/sbx-cert node %s/pki gitsrv --san IP:%s >/dev/null && "
                    "git init -q --bare %s/srv/repo.git && git init -q %s/w && "
                    "echo served-over-https > %s/w/f && git -C %s/w add f && "
                    "git -C %s/w -c user.email=t@sbx -c user.name=t commit -qm init && "
                    "git -C %s/w push -q %s/srv/repo.git HEAD:refs/heads/main && "
                    "git -C %s/srv/repo.git symbolic-ref HEAD refs/heads/main && "
                    "git -C %s/srv/repo.git update-server-info",
                    dir, dir, peer_ip, dir, dir, dir, dir, dir, dir, dir, dir, dir),
                 0, "could not make the CA or the repository in %s", dir);
    char prog[1024], nspath[128];
    snprintf(prog, sizeof(prog),
             "import http.server, ssl, os\n"
             "os.chdir('%s/srv')\n"
             "ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)\n"
             "ctx.load_cert_chain('%s/pki/gitsrv.pem', '%s/pki/gitsrv.key')\n"
             "class H(http.server.SimpleHTTPRequestHandler):\n"
             "    def log_message(self, *a):\n"
             "        pass\n"
             "s = http.server.ThreadingHTTPServer(('%s', 8443), H)\n"
             "s.socket = ctx.wrap_socket(s.socket, server_side=True)\n"
             "s.serve_forever()\n",
             dir, dir, dir, peer_ip);
    snprintf(nspath, sizeof(nspath), "/run/netns/%s", ns_name);
    pid_t srv = fork();
    cr_assert_geq(srv, 0);
    if (srv == 0) {
        int nfd = open(nspath, O_RDONLY | O_CLOEXEC);
        if (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0)
            _exit(1);
        char log[200];
        snprintf(log, sizeof(log), "%s/server.log", dir);
        int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (lfd >= 0) {
            dup2(lfd, 1);
            dup2(lfd, 2);
        }
        execlp("python3", "python3", "-c", prog, (char *)NULL);
        _exit(127);
    }
    /* The server is up once its port takes a connection (the host reaches
     * the test host over the veth). */
    bool up = false;
    for (int i = 0; i < 400 && !up; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(8443)};
        inet_pton(AF_INET, peer_ip, &sa.sin_addr);
        up = connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
        close(fd);
        if (!up)
            usleep(50 * 1000);
    }
    int st = 0;
    if (!up) {
        test_shf("cat %s/server.log >&2", dir);
        if (waitpid(srv, &st, WNOHANG) != srv) {
            kill(srv, SIGKILL);
            waitpid(srv, &st, 0);
        }
        test_shf("rm -rf %s", dir);
        cr_assert_fail("the test host's https git server did not start (status %d)", st);
    }
    sbx_client *c = test_client();
    char *ok = test_id("egr-git"), *no = test_id("egr-nogit");
    char net[256], ca_path[200], url[128], args[512];
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s/32:8443\"]}", peer_ip);
    create_ok(c, ok, net);
    snprintf(net, sizeof(net), "{\"mode\":\"egress\",\"allow\":[\"%s/32:8080\"]}", peer_ip);
    create_ok(c, no, net);
    snprintf(ca_path, sizeof(ca_path), "%s/pki/ca.pem", dir);
    char *ca = NULL;
    size_t calen;
    cr_assert_eq(sbx_fs_read(ca_path, 65536, &ca, &calen), 0);
    snprintf(url, sizeof(url), "https://%s:8443/repo.git", peer_ip);
    const char *ids[2] = {ok, no};
    int rc[2] = {-1, -1};
    char code[2][64] = {"", ""}, msg[2][512] = {"", ""};
    for (int k = 0; k < 2; k++) {
        json_t *w = json_pack("{s:s,s:s}", "path", "/workspace/ca.pem", "content", ca);
        char *wa = json_dumps(w, JSON_COMPACT);
        json_decref(w);
        sbx_reply *r = NULL;
        sbx_error err = {0};
        cr_assert_eq(sbx_call_json(c, "file.write", ids[k], wa, 30000, &r, &err), 0,
                     "file.write: %s", err.message);
        sbx_reply_free(r);
        free(wa);
        sbx_exec_result x;
        cr_assert_eq(test_sh(c, ids[k], "git config --global http.sslCAInfo /workspace/ca.pem",
                             30000, &x, &err),
                     0);
        sbx_exec_result_free(&x);
        snprintf(args, sizeof(args),
                 "{\"repoUrl\":\"%s\",\"branch\":\"main\",\"targetDir\":\"/workspace/repo\","
                 "\"cloneTimeoutMs\":20000}",
                 url);
        rc[k] = sbx_call_json(c, "git.checkout", ids[k], args, 60000, &r, &err);
        if (rc[k] == 0) {
            sbx_reply_free(r);
        } else {
            snprintf(code[k], sizeof(code[k]), "%s", err.code);
            snprintf(msg[k], sizeof(msg[k]), "%s", err.message);
            sbx_error_free(&err);
        }
    }
    int ec = -1;
    char *out = NULL;
    if (rc[0] == 0) {
        sbx_exec_result x;
        sbx_error err = {0};
        if (test_sh(c, ok, "cat /workspace/repo/f", 30000, &x, &err) == 0) {
            out = strndup((const char *)x.stdout_data, x.stdout_len);
            ec = x.exit_code;
            sbx_exec_result_free(&x);
        }
    }
    if (srv > 0) {
        kill(srv, SIGKILL);
        waitpid(srv, NULL, 0);
    }
    destroy(c, ok);
    destroy(c, no);
    sbx_client_close(c);
    free(ca);
    test_shf("rm -rf %s", dir);
    cr_expect_eq(rc[0], 0, "git.checkout over https of an allowed host: %s %s", code[0], msg[0]);
    cr_expect(ec == 0 && out && !strcmp(out, "served-over-https\n"),
              "the checkout's file: exit %d, %s", ec, out ? out : "(none)");
    cr_expect_neq(rc[1], 0, "git.checkout of a host the policy does not allow succeeded");
    cr_expect(!strncmp(code[1], "GIT_", 4), "a refused host's checkout: %s %s", code[1],
              msg[1]);
    free(out);
    free(ok);
    free(no);
}

/*
 * IPv6: sandboxes have none (docs/network.md §IPv6).  With a policy that
 * allows every IPv4 address, the sandbox has no IPv6 address but loopback's
 * and no IPv6 route; a connect to the test host's IPv6 address (given here,
 * a listener on it), to the cloud metadata address fd00:ec2::254, to every
 * non-link-local IPv6 address of the host (a listener on [::]) and to ::1
 * (the sandbox's own loopback, not the host's) fails, while the test host
 * is reached over IPv4 from the same sandbox.
 */
Test(egress, ipv6_reaches_nothing)
{
    int p = (int)getpid() & 0xffff;
    char h6[64], t6[64], nspath[128];
    snprintf(h6, sizeof(h6), "fd5b:%x::1", p);
    snprintf(t6, sizeof(t6), "fd5b:%x::2", p);
    cr_assert_eq(test_shf("ip addr add %s/64 dev %s nodad && ip -n %s addr add %s/64 dev eth0 nodad",
                    h6, host_if, ns_name, t6),
                 0, "could not give the test host an IPv6 address");
    snprintf(nspath, sizeof(nspath), "/run/netns/%s", ns_name);
    pid_t l6 = listen_in(nspath, t6, 8080), h6l = listen_in(NULL, "::", host_port);
    cr_assert_gt(l6, 0, "IPv6 listener in the test host");
    cr_assert_gt(h6l, 0, "IPv6 listener on the host");
    /* The listeners answer over IPv6 from the host: a failure below is the sandbox's. */
    cr_assert_eq(test_shf("timeout 5 bash -c 'exec 3<>/dev/tcp/%s/8080 && printf \"GET /\\r\\n\\r\\n\" "
                    ">&3 && cat <&3' | grep -q " BODY, t6),
                 0, "the test host's IPv6 listener does not answer the host");

    sbx_client *c = test_client();
    char *id = test_id("egr-v6");
    create_ok(c, id, "{\"mode\":\"egress\",\"allow\":[\"0.0.0.0/0\"]}");
    expect_reaches(c, id, peer_ip, 8080);
    char targets[2048];
    int n = snprintf(targets, sizeof(targets), "%s,8080 fd00:ec2::254,80 ::1,%d", t6, host_port);
    struct ifaddrs *ifs = NULL;
    cr_assert_eq(getifaddrs(&ifs), 0);
    for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
        if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET6)
            continue;
        struct in6_addr *a6 = &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr;
        if (IN6_IS_ADDR_LINKLOCAL(a6) || IN6_IS_ADDR_LOOPBACK(a6))
            continue;
        char a[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, a6, a, sizeof(a));
        if (n > 0 && (size_t)n < sizeof(targets) - 128)
            n += snprintf(targets + n, sizeof(targets) - (size_t)n, " %s,%d", a, host_port);
    }
    freeifaddrs(ifs);
    char cmd[4096];
    snprintf(cmd, sizeof(cmd),
             "ip -6 addr show scope global; ip -6 route show | grep -v '^fe80\\|^multicast\\|^ff00'; "
             "python3 -c 'import socket,sys\n"
             "for t in sys.argv[1:]:\n"
             " h,p=t.rsplit(\",\",1)\n"
             " try:\n"
             "  s=socket.create_connection((h,int(p)),timeout=3); s.close(); print(\"REACHED\",t)\n"
             " except OSError as e: print(\"failed\",t,e)' %s 2>&1",
             targets);
    sbx_exec_result r;
    sbx_error err = {0};
    cr_assert_eq(test_sh(c, id, cmd, 60000, &r, &err), 0, "exec in %s: %s", id, err.message);
    char *out = strndup((const char *)r.stdout_data, r.stdout_len);
    sbx_exec_result_free(&r);
    cr_expect(!strstr(out, "inet6"), "the sandbox has a global IPv6 address: %s", out);
    cr_expect(!strstr(out, "default"), "the sandbox has an IPv6 route: %s", out);
    cr_expect(!strstr(out, "REACHED"), "an IPv6 connect succeeded: %s", out);
    cr_expect(strstr(out, "failed fd00:ec2::254,80") && strstr(out, "failed ::1,"),
              "the connects did not run: %s", out);
    free(out);
    destroy(c, id);
    free(id);
    sbx_client_close(c);
    stop_child(&l6);
    stop_child(&h6l);
    test_shf("ip addr del %s/64 dev %s 2>/dev/null; true", h6, host_if);
}
