/*
 * eproxy.h — a loopback-style HTTP proxy in front of etcd for the cluster
 * tests: a shard node started with it as its first etcd endpoint
 * (cl_start_via) talks to etcd through it, and the test injects faults into
 * that node's etcd traffic alone:
 *  - fail_ranges: /v3/kv/range requests whose key starts with a prefix get
 *    an error answer (HTTP 503 and an etcd-style {"error"} object), as from
 *    an etcd that cannot serve them; the node's client does not switch
 *    endpoints on an answer, so every such read fails while it is on;
 *  - drop_reply: the first /v3/kv/txn that puts a given key to a given value
 *    is forwarded to etcd (which applies it) but its answer never reaches
 *    the node — a transaction whose outcome the node cannot know; from then
 *    on, if freeze_watch is set, the node's watch streams get nothing more
 *    (its view of the cluster stays where it was) until ep_freeze(false);
 *  - hold: the first /v3/kv/txn that puts a given key is kept here,
 *    unanswered (the node's client gives up after its timeout and re-sends
 *    it to etcd directly, its next endpoint), until ep_release sends it to
 *    etcd — a copy that reaches etcd late, as after a long network stall;
 *  - refuse: every /v3/kv/txn that puts a given key gets an error answer
 *    (as fail_ranges: the node does not switch endpoints, and takes the
 *    write as not done) and never reaches etcd — but the first one is kept,
 *    as by hold, until ep_release sends it to etcd: an etcd that answers
 *    "request timed out" and applies the request later.
 * Everything else is forwarded unchanged.  The proxy listens on etcd's own
 * address (the bridge of the cluster's namespaces), on a free port.
 *
 * One eproxy per test; its threads end at ep_stop.  Failing calls assert
 * (Criterion).
 */
#ifndef SBX_TEST_EPROXY_H
#define SBX_TEST_EPROXY_H

#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

struct eproxy {
    int lfd;
    char url[64];            /* http://IP:PORT, for cl_start_via */
    struct sockaddr_in etcd;
    pthread_mutex_t mu;
    char fail_prefix[256];   /* under mu: ranges to fail ("" none) */
    char drop_key[256];      /* under mu: the txn put whose answer to drop ("" none) */
    char drop_val[64];
    bool freeze_on_drop;
    char hold_key[256];      /* under mu: the txn put to hold ("" none) */
    char refuse_key[256];    /* under mu: the txn puts to refuse ("" none) */
    char *held;              /* under mu: the request held (Connection: close) */
    size_t held_len;
    atomic_int ranges_failed;   /* range requests answered with an error */
    atomic_int txns_refused;    /* txn requests answered with an error (refuse) */
    atomic_bool dropped;        /* the txn's answer was dropped */
    atomic_bool frozen;         /* watch streams get nothing */
    atomic_bool stop;
    atomic_int conns;           /* connection threads running */
    pthread_t acc;
};

/* ep_start — listen and forward (p is the caller's, zeroed here). */
void ep_start(struct eproxy *p);
/* ep_fail_ranges — fail the ranges whose key starts with prefix (NULL: stop). */
void ep_fail_ranges(struct eproxy *p, const char *prefix);
/* ep_drop_reply — drop the answer of the first txn putting key = val; with
 * freeze, freeze the watch streams at that moment. */
void ep_drop_reply(struct eproxy *p, const char *key, const char *val, bool freeze);
/* ep_hold — hold the first txn putting key. */
void ep_hold(struct eproxy *p, const char *key);
/* ep_refuse — refuse every txn putting key (NULL: stop), keeping the first
 * for ep_release (unless a request is held already). */
void ep_refuse(struct eproxy *p, const char *key);
/* ep_holds — whether a request is held. */
bool ep_holds(struct eproxy *p);
/* ep_release — send the held request to etcd: 0 with *succeeded (its
 * compares held and its puts were applied), or -1 (no answer). */
int ep_release(struct eproxy *p, bool *succeeded);
/* ep_freeze — freeze (or release) the watch streams. */
void ep_freeze(struct eproxy *p, bool on);
/* ep_stop — stop accepting, end every connection, free. */
void ep_stop(struct eproxy *p);

#endif
