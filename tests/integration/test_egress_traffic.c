/*
 * test_egress_traffic.c — what flows once an egress sandbox's connection
 * is allowed (docs/network.md §Bandwidth, §Credentials stay outside; issue
 * 14): bandwidth within 10 % of the limit; a git checkout from a named host; the
 * header the deployment's --egress-inject rules add (it arrives, the
 * secret stays outside the sandbox, the policy still decides, its cost in
 * figures); proxied connections counted and held to maxConnections;
 * addresses the deployment denies (--egress-deny) stay closed.
 *
 * The test host (the netns "<prefix>trf<pid>" with dnsmasq and servers)
 * and the private daemon per test: egress_util.h.  The host-name rules
 * themselves: test_egress_dns.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "egress_util.h"

/* This binary's test hosts: "trf" in their names, the high half of 198.19.0.0/16. */
static void
suite_up(void)
{
    egress_host_up("trf", 1);
}

TestSuite(egress_traffic, .init = suite_up, .fini = egress_host_down, .timeout = 240);

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

Test(egress_traffic, bandwidth_limit_holds_within_ten_percent)
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

Test(egress_traffic, git_checkout_reaches_a_named_host)
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

Test(egress_traffic, injected_header_arrives_and_the_secret_stays_outside)
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
Test(egress_traffic, proxied_connections_are_counted_and_capped)
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
Test(egress_traffic, deployment_denied_addresses_stay_closed)
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

Test(egress_traffic, injection_keeps_the_policy)
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

/* Figures, not assertions: the time of a plain-HTTP request from a sandbox
 * after its name is resolved (curl's time_total less time_namelookup:
 * connect, request, answer), through the injecting proxy (api.test) and
 * straight (plain.test), 40 each, p50 / p90. */
Test(egress_traffic, injection_round_trip_figures)
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
