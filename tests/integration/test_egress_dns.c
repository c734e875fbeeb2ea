/*
 * test_egress_dns.c — host-name rules of egress sandboxes (docs/network.md
 * §Host names; issue 14): an allowed name resolves through the sandbox's
 * resolver and connects; a denied or unlisted name gets no answer and its
 * address, learned out of band, is refused; a pin ends with the TTL or a
 * policy change; `*.suffix` rules; asking another resolver gains nothing;
 * bad rules named in VALIDATION_FAILED; DNS over TCP; failover between
 * upstreams; empty AAAA answers; the lookup's round trip (figures).
 *
 * The test host (the netns "<prefix>dns<pid>" with dnsmasq and servers)
 * and the private daemon per test: egress_util.h.  What flows once a
 * connection is allowed (header injection, counting, bandwidth):
 * test_egress_traffic.c.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "egress_util.h"

/* This binary's test hosts: "dns" in their names, the low half of 198.19.0.0/16. */
static void
suite_up(void)
{
    egress_host_up("dns", 0);
}

TestSuite(egress_dns, .init = suite_up, .fini = egress_host_down, .timeout = 240);

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
