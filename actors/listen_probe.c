/*
 * listen_probe.c — the shard checks that its own listener still takes
 * requests, and listens again when it does not (issue 11: a dead listener
 * must not stall a deployment).
 *
 * Seen in the cluster tests (test_claim, a shard restarted while the
 * machine was loaded): the restarted shard's tls+tcp:// listener accepted
 * TCP connections but never read from them — the peers' partition.import
 * and a client's request sat unread in the kernel's receive queues
 * (CLOSE-WAIT once the peers gave up), while the shard's loop was idle,
 * every REP context was waiting to receive and not one request had
 * arrived; every handoff to it failed ("sent, no answer") and the cluster
 * never converged.
 *
 * The cause is nng 1.5.2's (Debian bookworm's) TLS transport: when a
 * connection's TLS handshake or SP header exchange fails with NNG_ECLOSED
 * — a peer that resets the connection while the listener is sending to it
 * (a peer giving up on a slow, just restarted shard) makes the TCP layer
 * close the descriptor and the next send fail so — tlstran_pipe_nego_cb
 * passes ECLOSED to the socket's pending accept (src/sp/transport/tls/
 * tls.c:282-288 at v1.5.2), and the socket's listener takes ECLOSED for
 * "this listener was closed" and never accepts again (src/core/listener.c:
 * 399-401).  The transport keeps accepting and negotiating; the negotiated
 * pipes wait forever for an accept, their requests unread.  Fixed upstream
 * in nng 1.6.0 (commit 9248ed74, nanomsg/nng#1518: ECLOSED becomes
 * ECONNSHUT there); tcp:// and ipc:// have the same flaw in 1.5.2.
 *
 * sbx now links nng 1.5.2 with that fix (tools/nng/0001-*.patch, built by
 * tools/nng-build.sh; docs/cluster.md, "The patched nng"): the stall no
 * longer happens (tests/unit/test_nngx.c and tests/security/test_transport.c
 * storm the listeners with ClientHellos reset mid-handshake; against Debian's
 * libnng1 the unit test's listener stalls within tens of them).  The probe
 * stays as defence in depth: a listener that stops taking requests for a
 * reason not known yet (or an sbx built against an unpatched nng) is still
 * noticed and replaced, at the cost of one request every 5 s.
 * sbx_nng_relisten itself is tested by test_nngx
 * relisten_serves_on_the_same_address.
 *
 * A thread sends the shard one request through its own listen URL every
 * PROBE_INTERVAL_MS, as a peer does (a REQ socket with the shard's own TLS
 * identity; cluster.status, whose answer — an error one included — proves
 * the listener works).  After PROBE_FAILURES probes in a row got no answer
 * within PROBE_TIMEOUT_MS it asks the loop to close the listener and
 * listen again (sbx_nng_relisten: the socket, its contexts and what it
 * dialed stay), with an error line.  A listen on a wildcard address is
 * probed through loopback.
 */
#include <nng/nng.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/util.h"
#include "shard_int.h"

#define PROBE_INTERVAL_MS 5000
#define PROBE_TIMEOUT_MS 3000
#define PROBE_FAILURES 3

/* The URL this shard reaches its own listener at: url with a wildcard host
 * (0.0.0.0, [::], none) replaced by loopback. */
static void
self_url(const char *url, char *out, size_t n)
{
    const char *h = strstr(url, "://");
    if (!h) {
        snprintf(out, n, "%s", url);
        return;
    }
    h += 3;
    int pre = (int)(h - url);
    if (!strncmp(h, "0.0.0.0:", 8))
        snprintf(out, n, "%.*s127.0.0.1:%s", pre, url, h + 8);
    else if (!strncmp(h, "[::]:", 5))
        snprintf(out, n, "%.*s[::1]:%s", pre, url, h + 5);
    else if (h[0] == ':')
        snprintf(out, n, "%.*s127.0.0.1%s", pre, url, h);
    else
        snprintf(out, n, "%s", url);
}

/* One probe: true when an answer (any) came back in time. */
static bool
probe_once(const char *url, const sbx_nng_sec *sec)
{
    nng_socket s;
    if (sbx_nng_req_dial(&s, url, sec, NULL) != 0)
        return false;
    nng_msg *reply = NULL;
    static const char empty_map[] = "\x80"; /* msgpack {} */
    bool ok = shard_peer_roundtrip(s, "cluster.status", empty_map, 1, PROBE_TIMEOUT_MS, &reply,
                                   NULL) == 0;
    if (reply)
        nng_msg_free(reply);
    nng_close(s);
    return ok;
}

/* Loop thread: listen again (the probe thread asked). */
static void
relisten_cb(sbx_loop *l, void *arg)
{
    struct shard *sh = arg;
    (void)l;
    if (sh->stopping || sh->ctx_closed)
        return;
    _cleanup_err_ sbx_err_t err = NULL;
    if (sbx_nng_relisten(sh->rep, &sh->listener, sh->conf.listen, sh->conf.sec, &err) != 0)
        sbx_log_error("shard %s: %s", sh->conf.name, sbx_err_msg(err));
    else
        sbx_log_warn("shard %s: listening on %s again", sh->conf.name, sh->conf.listen);
}

static void *
probe_main(void *arg)
{
    struct shard *sh = arg;
    struct shard_probe *p = &sh->probe;
    char url[600];
    self_url(sh->conf.listen, url, sizeof(url));
    int fails = 0;
    pthread_mutex_lock(&p->mu);
    while (!p->stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += PROBE_INTERVAL_MS / 1000;
        pthread_cond_timedwait(&p->cv, &p->mu, &ts);
        if (p->stop)
            break;
        pthread_mutex_unlock(&p->mu);
        bool ok = probe_once(url, sh->conf.sec);
        pthread_mutex_lock(&p->mu);
        if (ok) {
            fails = 0;
            continue;
        }
        if (++fails < PROBE_FAILURES || p->stop)
            continue;
        sbx_log_error("shard %s: its listener %s answered none of %d requests sent to it "
                      "(%d s apart, %d s each); closing it and listening again",
                      sh->conf.name, sh->conf.listen, fails, PROBE_INTERVAL_MS / 1000,
                      PROBE_TIMEOUT_MS / 1000);
        fails = 0;
        sbx_loop_post(sh->loop, relisten_cb, sh);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

void
shard_probe_start(struct shard *sh)
{
    struct shard_probe *p = &sh->probe;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->stop = false;
    p->started = pthread_create(&p->thread, NULL, probe_main, sh) == 0;
}

void
shard_probe_stop(struct shard *sh)
{
    struct shard_probe *p = &sh->probe;
    if (!p->started)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    pthread_join(p->thread, NULL);
    p->started = false;
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
}
