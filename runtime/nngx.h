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
#include <stdbool.h>

#include "error.h"

/*
 * Errors: each of these returns 0, or a negative code (sbx_nng_code of the
 * nng error: SBX_E_SHARD_UNAVAILABLE, SBX_E_INTERNAL, …) with *err (err may
 * be NULL) saying what failed and nng's reason ("listen on tcp://…: Address
 * in use"); the socket is then closed.  nng's own codes are positive and
 * never leave this module.
 */

/* sbx_nng_rep_listen — open a REP socket listening on url. */
int sbx_nng_rep_listen(nng_socket *s, const char *url, sbx_err_t *err);
/* sbx_nng_req_dial — open a REQ socket dialing url in the background (the
 * peer may come up later). */
int sbx_nng_req_dial(nng_socket *s, const char *url, sbx_err_t *err);
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
int sbx_nng_req_dial_notify(nng_socket *s, nng_dialer *d, const char *url, nng_pipe_cb cb,
                            void *arg, sbx_err_t *err);
/* sbx_nng_code — the sbx error code (negative) for an nng error (positive) (NNG_ETIMEDOUT →
 * SBX_E_TIMEOUT, connection errors → SBX_E_SHARD_UNAVAILABLE, …). */
int sbx_nng_code(int rv);

#endif
