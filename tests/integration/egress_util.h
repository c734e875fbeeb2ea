/*
 * egress_util.h — what the egress test binaries that share one test host
 * share (test_egress_dns.c: the name policy; test_egress_traffic.c: what
 * flows once a connection is allowed): the test host and its private
 * daemon, made and taken down by each binary's suite, and the small client
 * helpers their tests call.
 *
 * The test host is a network namespace the suite makes
 * ("<prefix><tag><pid>", the tag naming the binary), joined to the host by
 * a veth pair ("e<tag><pid>" on the host side) with a /29 of 198.19.0.0/16
 * (RFC 2544 benchmarking: not private, so a policy may open it; not
 * TEST-NET-1, which some hosts' own networks use — this VM's uplink is
 * 192.0.2.2/24 with its gateway at .1 —, and apart from test_egress's
 * 198.18.0.0/16).  Each binary has its own half of the /16 (the pid picks
 * the /29 within it), so two binaries side by side never share a /29:
 * .1 the host side, .2 .. .5 the test host: dnsmasq on .2:53 answers
 * allowed.test and *.wild.test with .3 and denied.test and other.test with
 * .4, TTL 3 s; an HTTP-ish server on every address, port 8080 and 9090; a
 * bulk server on .3:7000 that sends 20 MB, a sink on :7001; a git
 * repository served over plain ("dumb") HTTP on :8000, as git.test; on :80
 * a server that answers with the request head it got, as api.test (.3,
 * which the daemon's --egress-inject file gives an Authorization header with
 * a secret made per run) and plain.test (.4, no rule); .5 is the daemon's
 * --egress-deny address.  A private `sbxd dev` per test forwards its
 * sandboxes' lookups to that dnsmasq (--dns-upstream).
 *
 * Criterion runs a suite's .init and .fini in each test's own process, so
 * each test has its own test host and daemon (the pid in every name).
 * Everything is removed by name and pid in egress_host_down().
 *
 * The client helpers assert (Criterion): a failure ends the test, and the
 * suite's .fini takes down what it made.
 */
#ifndef SBX_TEST_EGRESS_UTIL_H
#define SBX_TEST_EGRESS_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "../support/harness.h"

/* What the test host's HTTP-ish servers answer (ports 8080 and 9090). */
#define BODY "hello-from-the-dns-test-host"
/* What the bulk server (.3:7000) sends, and what the sink reads. */
#define BULK_BYTES (20 * 1000 * 1000)
/* The sandbox's resolver: SBX_NET_RESOLVER, container/net.h. */
#define RESOLVER "169.254.0.53"

/*
 * The test host's addresses (dotted quads) and its namespace's path
 * (/run/netns/<name>), set by egress_host_up; the secret of this test's
 * --egress-inject rule for api.test; the private daemon (NULL before
 * egress_host_up and after egress_host_down).  Owned by egress_util.c:
 * read them, never free or write them.
 */
extern char ns_path[96], dns_ip[16], ip_ok[16], ip_other[16], ip_deny[16], secret[64];
extern struct testd *live;

/*
 * egress_host_up — make the test host and start its servers, dnsmasq, the
 * git server, the injection rules file and the private daemon (above).
 * tag (1-3 lower-case letters, static storage: it is kept) names this
 * binary's test hosts: the netns "<prefix><tag><pid>", the host's veth
 * "e<tag><pid>", /tmp/sbx-<tag>git-<prefix><pid> and
 * /tmp/sbx-inject-<prefix><tag><pid>.conf; half (0 or 1) is this binary's
 * half of 198.19.0.0/16.  Give each binary its own tag and half.  For a
 * suite's .init (wrapped in a void(void) function).  Errors: a step that
 * fails takes down what the earlier ones made (egress_host_down: Criterion
 * runs no .fini after a failed .init) and then fails the test with the
 * step's name.
 */
void egress_host_up(const char *tag, int half);
/*
 * egress_host_down — undo egress_host_up, whatever part of it was done:
 * stop the daemon (testd_stop: by pid, its directory removed), remove the
 * rules file, SIGKILL and reap dnsmasq, the git server and the servers by
 * pid, remove the repository's directory, delete the netns and the veth.
 * Harmless to call twice.  A suite's .fini.
 */
void egress_host_down(void);

/* stop_child — SIGKILL our child *pid and reap it, if *pid > 0; then
 * *pid = -1.  Never fails. */
void stop_child(pid_t *pid);

/* client — a new client of `live`'s gateway; the caller closes it
 * (sbx_client_close).  Fails the test if it cannot connect. */
sbx_client *client(void);
/* create — create sandbox id with {"network": network_json} (30 s).
 * code and msg (clen and mlen bytes, the caller's) get the error's code
 * and message, or "" both when it was created: it never fails the test. */
void create(sbx_client *c, const char *id, const char *network_json, char *code, size_t clen,
            char *msg, size_t mlen);
/* create_ok — create, and fail the test unless the sandbox was created. */
void create_ok(sbx_client *c, const char *id, const char *network_json);
/* destroy — destroy sandbox id; a failure is an expectation that failed
 * (the test goes on). */
void destroy(sbx_client *c, const char *id);
/* run — a shell command in sandbox id (60 s): its stdout (heap, the
 * caller frees; "" when none) and its exit code in *exit_code.  Fails the
 * test if the exec itself fails. */
char *run(sbx_client *c, const char *id, const char *cmd, int *exit_code);
/* lookup — the sandbox resolves name (getent: its libc, its resolv.conf):
 * the first IPv4 address into addr (len bytes, the caller's), or "" when it
 * got none.  Fails the test only as run() does. */
void lookup(sbx_client *c, const char *id, const char *name, char *addr, size_t len);
/* fetch — connect from the sandbox to host:port (a name or an address),
 * send a request (5 s); whether BODY came back.  Fails the test only as
 * run() does. */
bool fetch(sbx_client *c, const char *id, const char *host, int port);
/* status_network — the sandbox's `status` reply from its "network":
 * member to the end of the JSON text (heap, the caller frees).  Fails the
 * test if status fails or has no network. */
char *status_network(sbx_client *c, const char *id);

#endif
