/*
 * gateway.h — the stateless front door.
 *
 * Clients speak the nng protocol of docs/protocol.md to a REP socket served
 * by many contexts, so requests proceed concurrently.  For each request the
 * gateway checks the frame (size, msgpack, envelope, operation, sandbox ID)
 * and answers bad input itself; a sandbox operation is then placed —
 * partition = XXH64(id) mod 4096, owner = rendezvous hash over the shards
 * (runtime/place.h) — and forwarded on that shard's REQ socket, wrapped with
 * its routing information; the shard's reply goes back to the client as it
 * is.  Operations about the whole deployment (list, cluster.status) go to
 * every shard and the answers are merged.
 *
 * In a cluster (conf.etcd), the shards and the partition table come from
 * etcd (runtime/cview.h): the gateway follows them with a watch, forwards each
 * request to the partition's owner with (partition, epoch), and when the
 * shard answers WRONG_OWNER — the table moved under the request, nothing
 * ran (one with context ran:true did run, and goes to the client as it is:
 * docs/protocol.md §2) — or the owner is unknown, dead or not connected yet,
 * it waits a little
 * (10 ms doubling to 400 ms) and routes again, within the request's
 * deadline.  Any gateway serves any sandbox; gateways hold no state.
 *
 * A shard with no live connection is answered SHARD_UNAVAILABLE at once; a
 * shard whose connection drops while it holds requests has them answered
 * SHARD_UNAVAILABLE at that moment (they are never silently re-sent, which
 * could run a command twice); a shard that does not answer within the
 * request's deadline (its `timeoutMs`, less 100 ms so the client hears the
 * answer before it gives up; else the gateway default) is answered
 * SHARD_UNAVAILABLE too.  The gateway never waits longer than that.
 */
#ifndef SBX_GATEWAY_H
#define SBX_GATEWAY_H

#include <stdbool.h>
#include <stdint.h>

struct sbx_nng_sec; /* runtime/nngx.h */

struct sbx_gateway_conf {
    char *name;          /* gateway name (status output) */
    char *listen;        /* nng URL for clients, e.g. tcp://127.0.0.1:7700 */
    char **shards;       /* "name=url" entries, NULL-terminated (standalone mode) */
    char *etcd;          /* etcd endpoints: cluster mode (shards come from etcd) */
    char *etcd_ca, *etcd_cert, *etcd_key; /* PEM paths for https:// etcd endpoints (or
                          * NULL): sbx_etcd_set_tls; sbxd defaults them to --tls-* */
    char *cluster;       /* cluster name (etcd prefix /sbx/<cluster>/) */
    int64_t contexts;    /* concurrent client requests */
    int64_t timeout;     /* ms, deadline of requests that carry none */
    /* The HTTP front (gateway/http.h); http NULL or "" = none. */
    char *http;          /* host:port, e.g. 127.0.0.1:7780 */
    char *api_keys;      /* file of bearer keys (required off loopback) */
    char *preview_domain;/* preview URLs are {port}-{id}-{token}.<this> (NULL: any host) */
    char *preview_scheme;/* http or https: the X-Forwarded-Proto given to sandboxes */
    char *relay_secret;  /* shared with the shards' preview relays, or NULL */
    int64_t http_max_body; /* bytes of an HTTP request body */
    int64_t http_per_client; /* HTTP connections per client address (0: 1024) */
    int64_t http_ws_ping;  /* ms: terminal WebSocket keep-alive (sbx_http_conf.ws_ping) */
    bool console;        /* the HTTP front serves the web console under /console/
                          * (sbxd --console; off by default; docs/console.md) */
    bool await_shards;   /* its shards are being started with it (`sbxd dev`): a request
                          * for one that has not connected yet waits for it until the
                          * request's deadline, instead of SHARD_UNAVAILABLE at once */
    const struct sbx_nng_sec *sec; /* borrowed (outlives the gateway): the TLS identity of
                                    * its listen and of its dials to shards; NULL: plaintext
                                    * on loopback/ipc only (runtime/nngx.h) */
};

typedef struct sbx_gateway sbx_gateway;

/* sbx_gateway_start — listen and serve on nng's threads; 0 or a negative code. */
int sbx_gateway_start(sbx_gateway **out, const struct sbx_gateway_conf *conf);
/* sbx_gateway_http_port — the HTTP front's bound port, or 0 without one. */
int sbx_gateway_http_port(const sbx_gateway *gw);
/* sbx_gateway_stop — stop serving, close sockets, free (blocks briefly). */
void sbx_gateway_stop(sbx_gateway *gw);

#endif
