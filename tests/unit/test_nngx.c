/*
 * test_nngx.c — runtime/nngx.h's transport rules (issue 16): which listens
 * are plaintext on loopback (allowed), which are not (refused unless the
 * operator passed --insecure-plaintext), and an incomplete or unreadable
 * TLS identity refused with VALIDATION_FAILED naming what is wrong.  The
 * handshakes themselves are tested end to end in
 * tests/security/test_transport.c.
 */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <stdio.h>
#include <string.h>
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
round_trip(nng_socket rep, const char *url)
{
    nng_socket req;
    cr_assert_eq(sbx_nng_req_dial(&req, url, NULL, NULL), 0);
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
    cr_expect(round_trip(rep, url), "no round trip before");
    cr_assert_eq(sbx_nng_relisten(rep, &l, url, NULL, &err), 0, "%s", sbx_err_msg(err));
    cr_expect_neq(nng_listener_id(l), nng_listener_id(first), "the listener was not replaced");
    cr_expect(round_trip(rep, url), "no round trip after listening again");
    nng_close(rep);
    unlink(url + strlen("ipc://"));
}
