/*
 * tlstest.h — helpers of the TLS tests (tests/unit/test_nngx.c,
 * tests/security/test_transport.c): a throwaway PKI made with tools/sbx-cert,
 * a real ClientHello captured from an nng dialer, and storms of connections
 * that send it and reset mid-handshake (issue 11: the reset handshakes that
 * stalled nng 1.5.2's listeners; docs/cluster.md note 12).
 *
 * Failures assert (Criterion): these run inside a test only.  Run from the
 * tree's root (tools/sbx-cert is found by its relative path).
 */
#ifndef SBX_TESTS_TLSTEST_H
#define SBX_TESTS_TLSTEST_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdbool.h>
#include <stddef.h>

/* A test PKI: the deployment CA in ca/ (ca.pem, ca.key) with the node
 * certificates tlstest_pki_make was asked for (<name>.pem, <name>.key, each
 * with the SAN IP:127.0.0.1), and another CA in other/ with the node "evil". */
struct tlstest_pki {
    char dir[256];   /* /tmp/sbx-tls-<tag>XXXXXX, removed by tlstest_pki_remove */
    char ca[320];    /* <dir>/ca: the deployment CA's directory */
    char other[320]; /* <dir>/other: another CA's directory */
};

/* tlstest_sbx_cert — run tools/sbx-cert with args (NULL-terminated, at most
 * 14); asserts that it exited 0.  Its standard output is discarded. */
void tlstest_sbx_cert(const char *const *args);

/* tlstest_pki_make — make p: a fresh directory tagged tag (letters, borrowed)
 * and the CAs; nodes (NULL-terminated, borrowed) are the deployment CA's node
 * certificates.  tlstest_pki_remove(p) removes it all (p->dir "" is a no-op). */
void tlstest_pki_make(struct tlstest_pki *p, const char *tag, const char *const *nodes);
void tlstest_pki_remove(struct tlstest_pki *p);

/* tlstest_pem — "<dir>/<name>.<ext>" in a static ring of 16 buffers (valid
 * until 16 later calls; tests are single-threaded). */
const char *tlstest_pem(const char *dir, const char *name, const char *ext);

/* tlstest_client_hello — the first TLS record a tls+tcp:// dialer with the
 * client config cfg (borrowed) sends, caught by a plain loopback TCP socket
 * standing in for the server: into buf (n bytes); its length returned. */
size_t tlstest_client_hello(nng_tls_config *cfg, unsigned char *buf, size_t n);

/* tlstest_reset_storm — count connections to 127.0.0.1:port that each send
 * hello (hn bytes) and close with a reset (SO_LINGER 0): one in three at once,
 * the others after 0-3 ms (mid-handshake: the server is answering), drawn
 * from *seed (rand_r).  Connections refused or failed are counted too. */
void tlstest_reset_storm(int port, const unsigned char *hello, size_t hn, int count,
                         unsigned *seed);

#endif
