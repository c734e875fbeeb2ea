/*
 * test_nngx.c — runtime/nngx.h's transport rules (issue 16): which listens
 * are plaintext on loopback (allowed), which are not (refused unless the
 * operator passed --insecure-plaintext), and an incomplete or unreadable
 * TLS identity refused with VALIDATION_FAILED naming what is wrong.  The
 * handshakes themselves are tested end to end in
 * tests/security/test_transport.c.  Issue 11: nng 1.5.2's listener that
 * stops accepting after a reset handshake, and sbx_nng_relisten's remedy.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/nngx.h"

Test(nngx, plaintext_listens_are_allowed_on_loopback_and_local_transports_only)
{
    static const char *const ok[] = {
        "tcp://127.0.0.1:7700", "tcp://127.1.2.3:1",    "tcp://localhost:7700",
        "tcp://[::1]:7700",     "tcp4://127.0.0.1:1",   "ws://127.0.0.1:1/x",
        "ipc:///tmp/x.sock",    "inproc://gw",          "abstract://sbx",
    };
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
        sbx_err_t err = NULL;
        cr_expect_eq(sbx_nng_listen_check(ok[i], NULL, &err), 0, "%s: %s", ok[i],
                     sbx_err_msg(err));
        sbx_err_release(&err);
    }
    static const char *const refused[] = {
        "tcp://0.0.0.0:7701",       "tcp://:7701",            "tcp://*:7701",
        "tcp://10.0.0.1:7701",      "tcp://[::]:7701",        "tcp6://[fe80::1]:1",
        "ws://0.0.0.0:1/x",         "tcp://127.0.0.1.evil.example:1", "tcp://128.0.0.1:1",
        "tcp://localhost.evil.example:1", "tls+tcp://0.0.0.0:7701", "tls+tcp://127.0.0.1:7701",
    };
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        sbx_err_t err = NULL;
        int rc = sbx_nng_listen_check(refused[i], NULL, &err);
        cr_expect_eq(rc, SBX_E_VALIDATION, "%s: %d", refused[i], rc);
        cr_expect(strstr(sbx_err_msg(err), refused[i]) != NULL, "%s: %s", refused[i],
                  sbx_err_msg(err));
        sbx_err_release(&err);
    }
    /* The escape hatch lets plaintext through (loudly), never TLS without
     * an identity. */
    sbx_nng_sec insecure = {.insecure_plaintext = true};
    cr_expect_eq(sbx_nng_listen_check("tcp://0.0.0.0:7701", &insecure, NULL), 0);
    cr_expect_eq(sbx_nng_listen_check("tls+tcp://0.0.0.0:7701", &insecure, NULL),
                 SBX_E_VALIDATION);
    cr_expect(sbx_nng_url_is_tls("tls+tcp://h:1") && sbx_nng_url_is_tls("tls+tcp6://[::1]:1"));
    cr_expect(!sbx_nng_url_is_tls("tcp://h:1") && !sbx_nng_url_is_tls("tls+tcpx://h:1"));
}

Test(nngx, an_incomplete_or_unreadable_identity_is_refused)
{
    sbx_nng_sec sec;
    sbx_err_t err = NULL;
    cr_expect_eq(sbx_nng_sec_open(&sec, NULL, NULL, NULL, false, &err), 0, "none at all is fine");
    cr_expect(!sec.server && !sec.client);
    cr_expect_eq(sbx_nng_sec_open(&sec, "/nonexistent/ca.pem", "/nonexistent/n.pem", NULL, false,
                                  &err),
                 SBX_E_VALIDATION);
    cr_expect(strstr(sbx_err_msg(err), "the key is missing") != NULL, "%s", sbx_err_msg(err));
    sbx_err_release(&err);
    cr_expect_eq(sbx_nng_sec_open(&sec, "/nonexistent/ca.pem", "/nonexistent/n.pem",
                                  "/nonexistent/n.key", false, &err),
                 SBX_E_VALIDATION);
    cr_expect(strstr(sbx_err_msg(err), "/nonexistent/n.pem") != NULL, "%s", sbx_err_msg(err));
    cr_expect(!sec.server && !sec.client);
    sbx_err_release(&err);
    /* A revocation list needs an identity to attach to. */
    cr_expect_eq(sbx_nng_sec_add_crl(&sec, "/nonexistent/ca.pem", "/nonexistent/crl.pem", &err),
                 SBX_E_VALIDATION);
    cr_expect(strstr(sbx_err_msg(err), "needs a TLS identity") != NULL, "%s", sbx_err_msg(err));
    sbx_err_release(&err);
    /* Dialing tls+tcp:// without an identity is refused before any connection. */
    nng_socket s;
    cr_expect_eq(sbx_nng_req_dial(&s, "tls+tcp://127.0.0.1:1", NULL, &err), SBX_E_VALIDATION);
    cr_expect(strstr(sbx_err_msg(err), "needs a TLS identity") != NULL, "%s", sbx_err_msg(err));
    sbx_err_release(&err);
}

/* One request over a fresh REQ socket to url, answered by rep's `recv`: true
 * when the echo came back. */
static bool
round_trip(nng_socket rep, const char *url, const sbx_nng_sec *sec)
{
    nng_socket req;
    cr_assert_eq(sbx_nng_req_dial(&req, url, sec, NULL), 0);
    nng_socket_set_ms(req, NNG_OPT_SENDTIMEO, 3000);
    nng_socket_set_ms(req, NNG_OPT_RECVTIMEO, 3000);
    nng_socket_set_ms(rep, NNG_OPT_RECVTIMEO, 3000);
    bool ok = false;
    if (nng_send(req, "ping", 5, 0) == 0) {
        char *buf = NULL;
        size_t n = 0;
        if (nng_recv(rep, &buf, &n, NNG_FLAG_ALLOC) == 0) {
            nng_send(rep, buf, n, NNG_FLAG_ALLOC);
            char *back = NULL;
            size_t bn = 0;
            if (nng_recv(req, &back, &bn, NNG_FLAG_ALLOC) == 0) {
                ok = bn == 5 && !strcmp(back, "ping");
                nng_free(back, bn);
            }
        }
    }
    nng_close(req);
    return ok;
}

/* sbx_nng_relisten (listen_probe.c's remedy): the socket serves again
 * through a new listener on the same address, and the old one is gone. */
Test(nngx, relisten_serves_on_the_same_address)
{
    char url[128];
    snprintf(url, sizeof(url), "ipc:///tmp/sbx-nngx-relisten-%d.sock", (int)getpid());
    nng_socket rep;
    nng_listener l, first;
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_nng_rep_listen_l(&rep, &l, url, NULL, &err), 0, "%s", sbx_err_msg(err));
    first = l;
    cr_expect(round_trip(rep, url, NULL), "no round trip before");
    cr_assert_eq(sbx_nng_relisten(rep, &l, url, NULL, &err), 0, "%s", sbx_err_msg(err));
    cr_expect_neq(nng_listener_id(l), nng_listener_id(first), "the listener was not replaced");
    cr_expect(round_trip(rep, url, NULL), "no round trip after listening again");
    nng_close(rep);
    unlink(url + strlen("ipc://"));
}

/* run tools/sbx-cert with args (NULL-terminated); asserts success. */
static void
sbx_cert(const char *const *args)
{
    const char *argv[8] = {"tools/sbx-cert"};
    int n = 1;
    for (; args[n - 1] && n < 7; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        dup2(fd, 2);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tools/sbx-cert %s failed", args[0]);
}

/* A loopback TCP socket listening on a free port; *port gets the port. */
static int
tcp_listen_any(int *port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0 && listen(fd, 4) == 0 &&
              getsockname(fd, (struct sockaddr *)&a, &len) == 0);
    *port = ntohs(a.sin_port);
    return fd;
}

/* A real ClientHello (the first TLS record a dialer with sec's client
 * identity sends), caught by a plain TCP socket standing in for the server:
 * into buf (n bytes), its length returned. */
static size_t
client_hello(const sbx_nng_sec *sec, unsigned char *buf, size_t n)
{
    int port;
    int lfd = tcp_listen_any(&port);
    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    nng_stream_dialer *d;
    nng_aio *aio;
    cr_assert_eq(nng_stream_dialer_alloc(&d, url), 0);
    cr_assert_eq(nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, sec->client), 0);
    cr_assert_eq(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_aio_set_timeout(aio, 5000);
    nng_stream_dialer_dial(d, aio);
    int fd = accept(lfd, NULL, NULL);
    nng_aio_wait(aio);
    cr_assert(fd >= 0 && nng_aio_result(aio) == 0);
    nng_stream *st = nng_aio_get_output(aio, 0);
    char one = 0;
    nng_iov iov = {.iov_buf = &one, .iov_len = 1};
    nng_aio_set_iov(aio, 1, &iov);
    nng_stream_send(st, aio); /* starts the handshake; never completes */
    size_t got = 0, want = 5;
    while (got < want) {
        ssize_t r = read(fd, buf + got, n - got);
        cr_assert_gt(r, 0, "no ClientHello");
        got += (size_t)r;
        if (got >= 5)
            want = 5 + ((size_t)buf[3] << 8 | buf[4]);
        cr_assert_leq(want, n);
    }
    close(fd);
    close(lfd);
    nng_aio_wait(aio);
    nng_stream_free(st);
    nng_stream_dialer_free(d);
    nng_aio_free(aio);
    return want;
}

/* Issue 11's stalled tls+tcp:// listener, reproduced.  nng 1.5.2's TLS
 * transport reports a handshake/negotiation that failed with NNG_ECLOSED
 * (a peer's reset racing the server's own send: the TCP layer closed the
 * descriptor, the next send got ECLOSED) to the socket's pending accept,
 * and the socket's listener takes ECLOSED for "the listener was closed"
 * and never asks to accept again (src/sp/transport/tls/tls.c:282-288,
 * src/core/listener.c:399-401 at v1.5.2; fixed in nng 1.6.0 by commit
 * 9248ed74, nanomsg/nng#1518).  From then on connections are accepted and
 * negotiated by the transport but never handed to the socket: requests sit
 * unread, exactly as seen in test_claim.  Here: clients that send a
 * ClientHello and reset the connection, in batches, until a real client is
 * no longer served (or 400 of them passed: an nng without the bug); then
 * sbx_nng_relisten (listen_probe.c's remedy) must make the socket serve
 * again on the same address. */
Test(nngx, a_listener_stalled_by_reset_handshakes_serves_again_after_relisten, .timeout = 120)
{
    char dir[] = "/tmp/sbx-nngx-pki-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char ca[128], cert[128], key[128];
    snprintf(ca, sizeof(ca), "%s/ca.pem", dir);
    snprintf(cert, sizeof(cert), "%s/node.pem", dir);
    snprintf(key, sizeof(key), "%s/node.key", dir);
    sbx_cert((const char *[]){"ca", dir, NULL});
    sbx_cert((const char *[]){"node", dir, "node", "--san", "IP:127.0.0.1", NULL});
    sbx_nng_sec sec = {0};
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_nng_sec_open(&sec, ca, cert, key, false, &err), 0, "%s", sbx_err_msg(err));

    int port;
    close(tcp_listen_any(&port)); /* a free port (nng binds it with SO_REUSEADDR) */
    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", port);
    nng_socket rep;
    nng_listener l;
    cr_assert_eq(sbx_nng_rep_listen_l(&rep, &l, url, &sec, &err), 0, "%s", sbx_err_msg(err));
    cr_assert(round_trip(rep, url, &sec), "no round trip before");

    unsigned char hello[4096];
    size_t hn = client_hello(&sec, hello, sizeof(hello));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    unsigned seed = (unsigned)getpid();
    int resets = 0;
    bool stalled = false;
    while (!stalled && resets < 400) {
        for (int i = 0; i < 10; i++, resets++) {
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            cr_assert(fd >= 0);
            if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
                write(fd, hello, hn) == (ssize_t)hn && i % 3)
                usleep((useconds_t)(rand_r(&seed) % 3000)); /* mid-handshake */
            struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* close with a reset */
            setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
            close(fd);
        }
        stalled = !round_trip(rep, url, &sec);
    }
    cr_log_info("nng %s: %s after %d reset handshakes", nng_version(),
                stalled ? "the listener stalled" : "no stall", resets);

    cr_assert_eq(sbx_nng_relisten(rep, &l, url, &sec, &err), 0, "%s", sbx_err_msg(err));
    cr_expect(round_trip(rep, url, &sec), "no round trip after listening again");
    nng_close(rep);
    sbx_nng_sec_close(&sec);
    unlink(ca);
    unlink(cert);
    unlink(key);
    char other[128];
    snprintf(other, sizeof(other), "%s/ca.key", dir);
    unlink(other);
    rmdir(dir);
}
