/*
 * nngx.h — nng helpers: every socket sbx opens goes through here so that
 * each one gets NNG_OPT_RECVMAXSZ = SBX_WIRE_MAX_FRAME (nng's default is
 * unlimited, actors-cluster.md §1f), bounded reconnect back-off and, on REQ
 * sockets, no timer-driven resend (retries are the client's decision and
 * carry the same request id, so the shard can deduplicate them).
 */
#ifndef SBX_NNGX_H
#define SBX_NNGX_H

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>
#include <stdbool.h>

#include "error.h"

/*
 * Errors: each of these returns 0, or a negative code (sbx_nng_code of the
 * nng error: SBX_E_SHARD_UNAVAILABLE, SBX_E_INTERNAL, …) with *err (err may
 * be NULL) saying what failed and nng's reason ("listen on tcp://…: Address
 * in use"); the socket is then closed.  nng's own codes are positive and
 * never leave this module.
 */

/*
 * Transport security (docs/security.md, "Transports").  A node's TLS
 * identity is the deployment CA, its own certificate and its private key
 * (PEM files, e.g. from tools/sbx-cert).  On a tls+tcp:// URL both ends
 * present a certificate and both verify the other's against the CA
 * (NNG_TLS_AUTH_MODE_REQUIRED, listeners and dialers alike): any holder of
 * a certificate the deployment CA signed is a peer, nobody else gets
 * through the handshake.  Host names are not checked (nodes move between
 * addresses; the CA is the deployment's own).
 *
 * Listens are checked by sbx_nng_listen_check: plaintext (tcp://, ws://, …)
 * only on loopback addresses, unless the operator passed
 * --insecure-plaintext; ipc://, inproc:// and abstract:// are local and
 * always allowed.
 */
typedef struct sbx_nng_sec {
    nng_tls_config *server;  /* owned reference, for listeners; NULL: no TLS identity */
    nng_tls_config *client;  /* owned reference, for dialers; NULL: no TLS identity */
    bool insecure_plaintext; /* plain listens on any address (loud in the logs) */
} sbx_nng_sec;

/* sbx_nng_sec_open — load ca, cert and key (paths of PEM files; all three
 * or none: NULL or "" each) into *sec.  0, or SBX_E_VALIDATION with *err
 * naming the file nng or mbedTLS refused. */
int sbx_nng_sec_open(sbx_nng_sec *sec, const char *ca, const char *cert, const char *key,
                     bool insecure_plaintext, sbx_err_t *err);
/* sbx_nng_sec_add_crl — make sec refuse peers whose certificate the
 * revocation list crl (PEM file, e.g. from `tools/sbx-cert revoke`) names:
 * nng_tls_config_ca_chain with ca (the same PEM file as given to
 * sbx_nng_sec_open) and the CRL, on both of sec's configs, before any
 * endpoint uses them.  mbedTLS then also refuses every peer once the CRL is
 * past its nextUpdate (re-issue it in time: `sbx-cert crl`).  0, or
 * SBX_E_VALIDATION with *err naming the file that could not be read or
 * parsed; sec without an identity: SBX_E_VALIDATION. */
int sbx_nng_sec_add_crl(sbx_nng_sec *sec, const char *ca, const char *crl, sbx_err_t *err);
/* sbx_nng_sec_close — drop sec's references (endpoints keep their own). */
void sbx_nng_sec_close(sbx_nng_sec *sec);
/* sbx_nng_listen_check — 0 if url may be listened on with sec (may be
 * NULL: no identity, no escape hatch); else SBX_E_VALIDATION with *err
 * saying why (plaintext on a non-loopback address; tls+tcp:// without an
 * identity). */
int sbx_nng_listen_check(const char *url, const sbx_nng_sec *sec, sbx_err_t *err);
/* sbx_nng_url_is_tls — whether url's scheme is tls+tcp, tls+tcp4 or tls+tcp6. */
bool sbx_nng_url_is_tls(const char *url);

/* sbx_nng_rep_listen — open a REP socket listening on url (sbx_nng_listen_check
 * first; sec borrowed, may be NULL). */
int sbx_nng_rep_listen(nng_socket *s, const char *url, const sbx_nng_sec *sec, sbx_err_t *err);
/* sbx_nng_rep_listen_l — the same, *l (may be NULL) receiving the listener
 * (for sbx_nng_relisten). */
int sbx_nng_rep_listen_l(nng_socket *s, nng_listener *l, const char *url,
                         const sbx_nng_sec *sec, sbx_err_t *err);
/* sbx_nng_relisten — close listener *l of socket s (its pipes and the
 * connections it accepted close with it) and listen on url again with sec,
 * *l then the new listener: a listener that stopped taking connections
 * comes back without a restart (the socket, its contexts and its dialed
 * pipes stay).  0 or a negative code with *err. */
int sbx_nng_relisten(nng_socket s, nng_listener *l, const char *url, const sbx_nng_sec *sec,
                     sbx_err_t *err);
/* sbx_nng_req_dial — open a REQ socket dialing url in the background (the
 * peer may come up later); a tls+tcp:// url is dialed with sec's identity
 * (borrowed; NULL or without one: SBX_E_VALIDATION). */
int sbx_nng_req_dial(nng_socket *s, const char *url, const sbx_nng_sec *sec, sbx_err_t *err);
/* sbx_nng_dial — start a dialer on the open socket s for url, with sec's
 * identity on tls+tcp:// (as sbx_nng_req_dial); flags as nng_dial's.  *d
 * (d may be NULL) is the dialer.  0 or a negative code with *err. */
int sbx_nng_dial(nng_socket s, const char *url, const sbx_nng_sec *sec, nng_dialer *d, int flags,
                 sbx_err_t *err);
/* sbx_nng_req_dial_notify — the same, with cb registered for the pipe
 * events ADD_PRE and REM_POST *before* the dial starts.  These two come in
 * pairs: nng fires REM_POST for every pipe whose ADD_PRE ran, also one
 * closed before its ADD_POST (a peer killed just after it accepted —
 * counting ADD_POST then lost one for good, and a gateway saw a restarted
 * shard as unreachable forever: the fault test's fill run; nng
 * src/core/socket.c nni_pipe_run_cb, p_cbs).  A caller that
 * counts connections must use it: registered after sbx_nng_req_dial, the
 * ADD_PRE of a peer that is already up can fire first and be missed, and
 * the count stays 0 for good (a restarted gateway never saw its shards;
 * tests/integration/test_faults.c gateway_restart_...).  *d (d may be NULL)
 * is the dialer: closing it and dialing another URL on the socket points
 * the socket elsewhere without closing it (a gateway's slot the cluster
 * view gave to another shard). */
int sbx_nng_req_dial_notify(nng_socket *s, nng_dialer *d, const char *url,
                            const sbx_nng_sec *sec, nng_pipe_cb cb, void *arg, sbx_err_t *err);
/* sbx_nng_code — the sbx error code (negative) for an nng error (positive) (NNG_ETIMEDOUT →
 * SBX_E_TIMEOUT, connection errors → SBX_E_SHARD_UNAVAILABLE, …). */
int sbx_nng_code(int rv);

#endif
