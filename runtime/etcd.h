/*
 * etcd.h — a small client for etcd's v3 API through its JSON gateway
 * (etcd 3.4, Debian etcd-server; there is no C client package), over libcurl
 * with jansson.  Keys and values are base64 on the wire; here they are
 * plain bytes.  Every call is blocking, thread-safe (each call uses its own
 * curl handle) and bounded by the client's timeout.
 *
 * What sbx uses (actors-cluster.md §1e): leases with keep-alive (a shard's
 * membership), transactions with compare-and-swap (partition ownership; the
 * epoch of a partition is the mod_revision of its key), ranges (the
 * partition table, metadata of a partition) and watches (gateways and
 * shards follow the table).  Endpoints: "http://host:port[,http://…]"; a
 * failing endpoint is skipped for the next.
 *
 * Errors: SBX_E_SHARD_UNAVAILABLE when no endpoint answers (the message
 * names it), SBX_E_STORAGE for an error answer from etcd.
 */
#ifndef SBX_ETCD_H
#define SBX_ETCD_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct sbx_etcd sbx_etcd;

struct sbx_etcd_kv {
    char *key;           /* NUL-terminated copy; a key holding a NUL is refused, never cut
                            (a range leaves it out, a watch ends: SBX_E_STORAGE) */
    char *value;         /* NUL-terminated copy (values may hold NULs: use vlen) */
    size_t vlen;
    int64_t create_revision, mod_revision, version, lease;
};

/* sbx_etcd_open — a client for the endpoints; timeout_ms per call (0: 5000). */
int sbx_etcd_open(sbx_etcd **out, const char *endpoints, int64_t timeout_ms);
void sbx_etcd_close(sbx_etcd *e);
/* sbx_etcd_set_tls — for https:// endpoints: ca (PEM path; NULL: the
 * system's CAs) is what etcd's server certificate must chain to, its name
 * checked against the endpoint's host (curl's CURLOPT_SSL_VERIFYHOST 2);
 * cert and key (PEM paths, both or neither) are presented as this client's
 * certificate, for an etcd run with --client-cert-auth (etcd's "Transport
 * security model", etcd.io/docs/v3.4/op-guide/security).  Copies the paths;
 * call before the client is used from other threads.  A TLS failure shows
 * as SBX_E_SHARD_UNAVAILABLE on the call and a warning naming curl's
 * reason. */
void sbx_etcd_set_tls(sbx_etcd *e, const char *ca, const char *cert, const char *key);
/* sbx_etcd_insecure_endpoint — the first endpoint of the list that is
 * plain http:// to a host other than loopback (127.0.0.0/8, localhost,
 * [::1]), copied into out (n bytes); false when there is none.  The shard
 * and gateway warn about it: membership and ownership would cross the
 * network unauthenticated. */
bool sbx_etcd_insecure_endpoint(const char *endpoints, char *out, size_t n);
/* sbx_etcd_kvs_free — free what sbx_etcd_range returned. */
void sbx_etcd_kvs_free(struct sbx_etcd_kv *kvs, size_t n);

/*
 * sbx_etcd_range — the keys from key to range_end (exclusive; NULL: key
 * alone; "\0"-style prefix ends come from sbx_etcd_prefix_end).  *kvs is a
 * heap array the caller frees with sbx_etcd_kvs_free; *revision (may be
 * NULL) is the store revision the answer reflects.  A kv that does not
 * decode (bad base64, a key with a NUL) is left out, with a log line.
 */
int sbx_etcd_range(sbx_etcd *e, const char *key, const char *range_end, struct sbx_etcd_kv **kvs,
                   size_t *n, int64_t *revision);
/*
 * sbx_etcd_range_page — one page of a range: like sbx_etcd_range, from key
 * (after: from the first key after it, to go on from a page's last key) to
 * range_end, at most limit keys (0: all), read at store revision at (0: the
 * latest; pass the first page's *revision to read every page of one range at
 * the same revision: etcd then answers SBX_E_STORAGE once it is compacted).
 * *more (may be NULL) says whether keys beyond this page remain.  A whole
 * range in one answer can exceed what etcd or this client accept
 * (MAX_REPLY): read large ranges by pages.
 */
int sbx_etcd_range_page(sbx_etcd *e, const char *key, bool after, const char *range_end,
                        int64_t limit, int64_t at, struct sbx_etcd_kv **kvs, size_t *n, bool *more,
                        int64_t *revision);
/* sbx_etcd_prefix_end — the range end covering every key with prefix p (out ≥ strlen(p)+1). */
void sbx_etcd_prefix_end(const char *p, char *out, size_t outlen);

/* sbx_etcd_put — set key to value (vlen bytes) under lease (0: none); *revision may be NULL. */
int sbx_etcd_put(sbx_etcd *e, const char *key, const void *value, size_t vlen, int64_t lease,
                 int64_t *revision);
/* sbx_etcd_delete — delete key (or the range to range_end). */
int sbx_etcd_delete(sbx_etcd *e, const char *key, const char *range_end);

/* Leases.  grant: *id; keepalive: *ttl_left = seconds left (0: the lease is
 * gone, e.g. it expired); revoke deletes its keys. */
int sbx_etcd_lease_grant(sbx_etcd *e, int64_t ttl_s, int64_t *id);
int sbx_etcd_lease_keepalive(sbx_etcd *e, int64_t id, int64_t *ttl_left);
int sbx_etcd_lease_revoke(sbx_etcd *e, int64_t id);

/*
 * Transactions (etcd's Txn: if every compare holds, run the success ops,
 * else the failure ops; atomically).  Build with sbx_etcd_txn_new, add
 * compares and ops, run with sbx_etcd_txn_run (which frees it).
 * *succeeded says which branch ran; *revision the revision after it.
 */
typedef struct sbx_etcd_txn sbx_etcd_txn;
sbx_etcd_txn *sbx_etcd_txn_new(void);
/* compare: key's value == v (vlen bytes) */
void sbx_etcd_txn_cmp_value(sbx_etcd_txn *t, const char *key, const void *v, size_t vlen);
/* compare: key's mod_revision == rev (rev 0 with create: the key does not exist) */
void sbx_etcd_txn_cmp_mod(sbx_etcd_txn *t, const char *key, int64_t rev);
void sbx_etcd_txn_cmp_create(sbx_etcd_txn *t, const char *key, int64_t rev);
/* success ops */
void sbx_etcd_txn_put(sbx_etcd_txn *t, const char *key, const void *v, size_t vlen, int64_t lease);
void sbx_etcd_txn_del(sbx_etcd_txn *t, const char *key);
/* ops in the txn so far (etcd's --max-txn-ops, default 128, bounds each list) */
size_t sbx_etcd_txn_size(const sbx_etcd_txn *t);
int sbx_etcd_txn_run(sbx_etcd *e, sbx_etcd_txn *t, bool *succeeded, int64_t *revision);

/*
 * sbx_etcd_watch — follow every change of the keys from key to range_end
 * from revision start (0: from now), calling fn(arg, put, kv, revision) for
 * each event (put false: a deletion; kv->value empty) in order.  Blocks
 * until fn returns non-zero, *stop becomes true (checked at least every
 * 500 ms), or the stream ends; returns 0 if stopped, else a negative code
 * after which the caller re-syncs with a range and watches again (some
 * changes may have been missed):
 *  - SBX_E_STORAGE: etcd's answer cannot be followed — an HTTP status other
 *    than 200, a malformed object (one that does not parse; one that stops
 *    parsing before its last bytes is malformed before it ends), an event
 *    that does not decode, an {"error"} object (each with a log line), a
 *    canceled or compacted watch;
 *  - SBX_E_SHARD_UNAVAILABLE: the connection failed (the next call tries the
 *    next endpoint) or the stream ended;
 *  - SBX_E_INTERNAL: no curl handle.
 * The stream is read in time and memory linear in its length (etcd.c).
 */
typedef int (*sbx_etcd_watch_fn)(void *arg, bool put, const struct sbx_etcd_kv *kv,
                                 int64_t revision);
int sbx_etcd_watch(sbx_etcd *e, const char *key, const char *range_end, int64_t start,
                   sbx_etcd_watch_fn fn, void *arg, const atomic_bool *stop);

#endif
