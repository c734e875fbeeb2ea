/*
 * relay_int.h — the shard's preview relay (relay.c) inside: one relayed
 * connection, one question to the loop thread, and the handshake thread's
 * body.  Internal to the shard and its tests (tests/fuzz/fuzz_relay.c);
 * the shard itself starts and stops the relay through shard_int.h.
 */
#ifndef SBX_RELAY_INT_H
#define SBX_RELAY_INT_H

#include <stdbool.h>
#include <stdint.h>

struct shard;

/* One relayed connection: listed in sh->relay.conns (under sh->relay.mu)
 * from accept until its thread ends.  Owned by its thread. */
struct shard_relay_conn {
    struct shard_relay_conn *next;
    struct shard *sh;  /* borrowed: the shard outlives its relays */
    int fd;            /* from the gateway; owned */
    int up;            /* into the sandbox, or -1; owned */
};

/* A question for the loop thread (posted with sbx_loop_post, callback on
 * the loop thread), answered under sh->relay.mu.  Reference-counted: the
 * asker and the loop callback each drop one; the last frees it and closes
 * pidfd. */
struct shard_relay_query {
    struct shard *sh;
    char id[64];       /* the sandbox ID asked about (sbx_id_check passed) */
    int port;          /* 1-65535 */
    uint64_t gen;      /* the container generation the preview URL names */
    bool end;          /* not a question: the relay of `id` ended */
    int rc;            /* 0 or a negative SBX_E_* code */
    char why[160];
    int pidfd;         /* on success: a duplicate of the container's pidfd, or -1 */
    bool done;
    bool abandoned;    /* the asker stopped waiting: take nothing */
    int refs;          /* the asker and the loop callback */
};

/* The thread of one relayed connection: the SOCKS5 handshake (RFC 1928 with
 * RFC 1929 authentication against sh->conf.relay_secret, 5 s), the question
 * to the loop thread, the connection into the sandbox, then the copy both
 * ways (runtime/relay.h).  arg is a struct shard_relay_conn already listed
 * in sh->relay.conns; takes it: unlists it, closes its sockets and frees
 * it before returning.  Always returns NULL. */
void *shard_relay_conn_main(void *arg);

#endif
