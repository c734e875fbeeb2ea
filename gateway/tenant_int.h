/*
 * tenant_int.h — what the parts of the tenant registry share (gateway/tenant.h
 * is the interface): tenant.c (registry, snapshots, keys, quotas, rewriting)
 * and tenant_admin.c (the admin ops).  Not a public interface.
 */
#ifndef SBX_TENANT_INT_H
#define SBX_TENANT_INT_H

#include <nettle/sha2.h>
#include <nng/nng.h>
#include <pthread.h>
#include <stdint.h>

#include "../runtime/id.h"
#include "tenant.h"

#define REFRESH_MS 1000      /* the snapshot's period: revocation within 2 s */
#define CALL_TIMEOUT_MS 8000 /* one call of the refresh thread or an admin op */
#define RECENT_MAX 4096      /* creations remembered between two snapshots */
#define RECENT_GRACE_MS 1500 /* how long an admitted creation missing from the
                               * snapshots still counts (tenant.c, refresh) */
#define SYS_PREFIX "sbx--"
#define KEYID_HEX 32         /* hex digits of a key's id: 16 bytes of its SHA-256 */

struct tkey {
    char id[KEYID_HEX + 1];
    char tenant[SBX_TENANT_MAX + 1];
    int scope;
};

#define STREAM_LINGER_MS 3000 /* a stream without a read in flight counts this long after */
#define STREAMS_MAX 4096      /* streams tracked by a gateway (quotas) */
#define RES_UNLIMITED (INT64_MAX / 8) /* a limit of 0 (unlimited), as a tenant's quotas count it */

/* The limits a tenant's resource quotas count, of one sandbox: bytes,
 * millicpus, bytes (RES_UNLIMITED for an unlimited one). */
struct tres {
    int64_t memory, cpu, disk;
};

struct tten {
    char name[SBX_TENANT_MAX + 1];
    int64_t max_sandboxes, rate;
    int64_t sandboxes; /* in the snapshot, plus this gateway's creations since */
    double tokens;     /* the create bucket (this gateway's) */
    int64_t bucket_ms; /* when tokens was last topped up */
    struct tres max;   /* resource quotas (its "sbx--r-" record; 0: none) */
    int64_t max_streams; /* concurrent streams per gateway (0: no quota) */
    struct tres used;  /* the limits of its sandboxes, counted like `sandboxes` */
};

/* A sandbox of the snapshot: its internal ID (first: the array is sorted
 * and searched by it) and its limits. */
struct tsb {
    char *id;
    struct tres res;
};

/* A sandbox this gateway admitted as a creation (quotas). */
struct trecent {
    char id[64];                     /* its internal ID */
    char tenant[SBX_TENANT_MAX + 1];
    int64_t at;                      /* sbx_mono_ms when admitted */
    struct tres res;                 /* the limits it was admitted with */
};

/* A stream a tenant reads through this gateway (maxStreams). */
struct tstream {
    char key[SBX_ID_MAX + 2 + 64];   /* "<internal sandbox ID>/<streamId>" */
    char tenant[SBX_TENANT_MAX + 1];
    int inflight;                    /* stream.read calls not yet answered */
    int64_t last_ms;                 /* sbx_mono_ms of the last answer */
};

struct sbx_tenants {
    pthread_mutex_t mu;         /* everything below but the thread's own */
    pthread_mutex_t refresh_mu; /* one refresh at a time */
    pthread_cond_t cv;
    bool stopping;
    bool thread_started;
    pthread_t thread;
    const char *upstream;
    uint8_t (*admin)[SHA256_DIGEST_SIZE]; /* the key file's keys, hashed */
    size_t nadmin;
    uint8_t sys_hash[SHA256_DIGEST_SIZE];
    char sys_key[2 * 32 + 5];
    struct tkey *keys;
    size_t nkeys;
    struct tten *tens;
    size_t ntens;
    struct tsb *ids; /* sorted by id: every sandbox of the snapshot */
    size_t nids;
    struct tres defaults; /* a new sandbox's limits without its own (the shards' largest) */
    struct tstream *streams; /* STREAMS_MAX */
    size_t nstreams;
    struct trecent *recent; /* this gateway's creations a snapshot may not show yet */
    size_t nrecent;
    bool loaded; /* a snapshot was taken */
    int jobs;    /* admin ops running (sbx_tenants_stop waits for them) */
};

struct sys_conn {
    nng_socket s;
    bool open;
};

/* SHA-256 of p[0..n) into out. */
void tenant_sha256(const void *p, size_t n, uint8_t out[SHA256_DIGEST_SIZE]);
/* p[0..n) as lower-case hex into out[2n + 1]. */
void tenant_hex(const uint8_t *p, size_t n, char *out);
/* A tenant name: 1-16 of [a-z0-9], not "sbx". */
bool tenant_name_ok(sbx_str s);
/* Open / close a connection to the gateway (t->upstream); 0 or a negative code. */
int tenant_sys_open(sbx_tenants *t, struct sys_conn *c);
void tenant_sys_close(struct sys_conn *c);
/*
 * One call with the system token: op on sandbox (may be NULL) with args (map
 * bytes, may be NULL), made for admin key id for_key (may be NULL: the
 * envelope's "for", the audit log's key id).  0 with *buf (the reply's
 * bytes, caller frees) decoded in *m (caller frees with sbx_wire_msg_free,
 * before *buf) and its result in *res; or a negative code (an error reply's
 * code) with msg[] set.
 */
int tenant_sys_call(sbx_tenants *t, struct sys_conn *c, const char *for_key, const char *op,
                    const char *sandbox, const char *args, size_t alen, char **buf, sbx_msg *m,
                    const msgpack_object **res, char *msg, size_t msglen);
/* Take a snapshot (one `list`) and swap it in; 0 or a negative code.  Any thread. */
int tenant_refresh(sbx_tenants *t, struct sys_conn *c);
/* Parse a system record's ID: a tenant's ("sbx--t-<name>-<max>-<rate>") or a
 * key's ("sbx--k<keyid>-<tenant>-<a|t>"); false if it is not one. */
bool tenant_parse_record(const char *id, struct tten *x);
/* Parse a tenant's resource quotas' record
 * ("sbx--r-<name>-<memory MiB>-<millicpus>-<disk MiB>-<streams>") into
 * name[] and x's max and max_streams; false if it is not one. */
bool tenant_parse_res(const char *id, char name[SBX_TENANT_MAX + 1], struct tten *x);
bool tenant_parse_key(const char *id, struct tkey *k);
/* Free n strings and their array. */
void tenant_free_ids(char **ids, size_t n);
/* The snapshot's tenant `name`, or NULL; under t->mu. */
struct tten *tenant_find(sbx_tenants *t, const char *name);

#endif
