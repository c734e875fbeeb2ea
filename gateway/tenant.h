/*
 * tenant.h — tenants, their API keys and quotas, as the gateway applies them
 * (issue 16; the model is docs/security.md §6).
 *
 * On only when the gateway has API keys (--api-keys): the keys of that file
 * are admin keys of the *default* tenant (name "", the namespace of every
 * sandbox ID without "--", i.e. what existed before tenants), so a
 * deployment keeps working.  Without keys there is no registry and nothing
 * here runs: keyless mode is one implicit tenant, as before.
 *
 * Keys.  A key made by key.create is 32 random bytes (getrandom), shown once
 * as "sbx_" + 64 hex digits.  Only SHA-256 of it is kept: a key of 256
 * random bits cannot be guessed from its hash by trying candidates, so a
 * slow KDF (which protects low-entropy passwords) would add cost and nothing
 * else.  Its id is the first 16 bytes of that hash in hex.
 *
 * Registry.  It lives on the shards, as *system records*: sandbox records
 * whose IDs begin with "sbx--" (a namespace no client can name: a tenant's
 * IDs are "<tenant>--<id>" and "sbx" is no tenant name; the default
 * tenant's IDs hold no "--"):
 *   sbx--t-<tenant>-<maxSandboxes>-<createsPerSecond>   a tenant
 *   sbx--r-<tenant>-<memory MiB>-<millicpus>-<disk MiB>-<streams>
 *                                                       its resource quotas (0: none)
 *   sbx--k<keyid>-<tenant>-<a|t>                        a key (admin | tenant scope)
 * made by `sandbox.labels` (a record, no container) and removed by
 * `destroy`, so they get the shards' LMDB durability, replication and
 * handoff like any sandbox, and every gateway of a cluster sees them.  Each
 * gateway reads them with one `list` every second (a refresh thread) and
 * answers from that snapshot: a revoked key stops working on every gateway
 * within 2 s (at once on the gateway that revoked it).
 *
 * Threads: sbx_tenants_resolve/admit/rewrite run on nng's threads, under
 * the registry's mutex; the refresh thread and the admin ops' threads call
 * the gateway over its inproc listener with the *system token* (random per
 * gateway process, never leaves it), which the gateway serves unrestricted.
 */
#ifndef SBX_TENANT_H
#define SBX_TENANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/error.h"
#include "../runtime/prom.h"
#include "../runtime/wire.h"

#define SBX_TENANT_MAX 16 /* bytes of a tenant name: [a-z0-9] */

enum sbx_scope {
    SBX_SCOPE_NONE = 0,
    SBX_SCOPE_TENANT, /* uses its tenant's sandboxes */
    SBX_SCOPE_ADMIN,  /* also manages tenants and keys, and the deployment's ops */
    SBX_SCOPE_SYSTEM, /* the gateway itself (system token): no namespace */
};

/* Who sent a request: the scope and tenant of its key. */
struct sbx_principal {
    int scope;                        /* enum sbx_scope */
    char tenant[SBX_TENANT_MAX + 1];  /* "" = the default tenant */
    char key_id[40];                  /* the key's id (16 bytes of its SHA-256 in hex), or
                                       * "system" (for the audit log) */
};

typedef struct sbx_tenants sbx_tenants;

/*
 * sbx_tenants_start — load the admin key file (one key per line, '#'
 * comments, each at least 16 bytes; only their SHA-256 is kept) and start
 * the refresh thread, which calls the gateway at `upstream` (its inproc
 * URL, borrowed: must outlive the registry).  0, or a negative code with
 * *err set.  *out is owned by the caller (sbx_tenants_stop).
 */
int sbx_tenants_start(sbx_tenants **out, const char *key_file, const char *upstream,
                      sbx_err_t *err);
/* sbx_tenants_stop — stop the refresh thread and free (NULL is fine). */
void sbx_tenants_stop(sbx_tenants *t);
/* sbx_tenants_metrics — add to p, for GET /metrics (admin keys only: it
 * names every tenant; docs/operations.md "Metrics"), one sample per tenant
 * (label tenant; as many as there are tenants) of the gauges
 * sbx_tenant_sandboxes (its sandboxes: the registry's last snapshot plus
 * this gateway's creations since) and sbx_tenant_max_sandboxes (its
 * quota). */
void sbx_tenants_metrics(sbx_tenants *t, sbx_prom *p);
/* sbx_tenants_system_key — the system token (owned by t) for in-process
 * callers: the HTTP front's preview lookups. */
const char *sbx_tenants_system_key(const sbx_tenants *t);

/* sbx_tenants_resolve — the principal of a presented key (key.n == 0: none);
 * 0 or SBX_E_UNAUTHORIZED. */
int sbx_tenants_resolve(sbx_tenants *t, sbx_str key, struct sbx_principal *p);

/*
 * sbx_tenants_map_id — the internal sandbox ID of p's `id` into out[64]:
 * "<tenant>--<id>", or id itself for the default tenant and the system.
 * SBX_E_VALIDATION (why[]) when it does not fit in 63 bytes or when the
 * default tenant names an ID with "--" (reserved for tenants).
 */
int sbx_tenants_map_id(const struct sbx_principal *p, sbx_str id, char out[64], char *why,
                       size_t whylen);
/* sbx_tenants_owns — whether internal ID `id` is in p's namespace. */
bool sbx_tenants_owns(const struct sbx_principal *p, sbx_str id);

/* The limits a creation asks for: memory (bytes), cpu (millicpus), disk
 * (bytes); 0 = the shards' default.  like: the internal ID whose limits the
 * new sandbox copies (a fork's source), or NULL; it wins over the rest. */
struct sbx_tenant_ask {
    int64_t memory, cpu, disk;
    const char *like;
};

/* Why a quota refused: its name (the tenant record's field, e.g.
 * "maxMemoryBytes"; static), what the tenant has (-1: a sandbox of it is
 * unlimited) and may have, and when to try again (ms; 0: not until the
 * tenant frees some, no Retry-After). */
struct sbx_quota_miss {
    const char *quota;
    int64_t used, limit, retry_ms;
};

/*
 * sbx_tenants_admit — the quota check of an op on internal ID `id` of p's
 * tenant that may create it (`creates`: the op is not `nocreate`).  An ID
 * the last snapshot or this gateway has seen is no creation; a new one
 * takes a token of the tenant's bucket (createsPerSecond, capacity twice
 * that, per gateway) and must fit under maxSandboxes, and the sum of the
 * *limits* (ask; a limit of 0, unlimited, fits no quota) of the tenant's
 * sandboxes and the new one under maxMemoryBytes, maxCpus and maxDiskBytes
 * (each counted from the snapshot plus this gateway's creations since;
 * docs/security.md §6).  0, or SBX_E_QUOTA_EXCEEDED with *miss and why[]
 * set.  ask may be NULL (the defaults).  The default tenant and the system
 * have no quotas.
 */
int sbx_tenants_admit(sbx_tenants *t, const struct sbx_principal *p, const char *id,
                      bool creates, const struct sbx_tenant_ask *ask,
                      struct sbx_quota_miss *miss, char *why, size_t whylen);

/*
 * sbx_tenants_stream_enter — count a stream.read of p's tenant on stream
 * `key` ("<internal sandbox ID>/<streamId>", copied) against its
 * maxStreams: a stream counts while a read of it is in flight and for
 * STREAM_LINGER_MS (3 s) after its last one (SSE and terminals read again
 * at once), per gateway.  A stream already counted always passes; a new
 * one (or, with key NULL, an op that starts one: `stream` ops) is refused
 * at the quota: SBX_E_QUOTA_EXCEEDED with *miss and why[].  0 with
 * *counted (call sbx_tenants_stream_leave(key) when its answer goes out)
 * or nothing counted (no quota, or key NULL).
 */
int sbx_tenants_stream_enter(sbx_tenants *t, const struct sbx_principal *p, const char *key,
                             bool *counted, struct sbx_quota_miss *miss, char *why,
                             size_t whylen);
/* sbx_tenants_stream_leave — a counted stream.read of `key` was answered. */
void sbx_tenants_stream_leave(sbx_tenants *t, const char *key);

/*
 * sbx_tenants_rewrite — re-encode a shard's reply for p: string values of
 * the keys sandboxId, sandbox and id that are in p's namespace lose the
 * "<tenant>--" prefix; in error messages every occurrence of `internal` is
 * replaced by `external` (both may be NULL: no replacement).  0 with
 * *out and *outlen (caller frees), or -ENOMEM / SBX_E_MALFORMED.
 */
int sbx_tenants_rewrite(const struct sbx_principal *p, const void *reply, size_t len,
                        const char *internal, const char *external, char **out,
                        size_t *outlen);
/* sbx_tenants_enc_obj — encode o into e with the ID rewriting above (no
 * message replacement): an item of a merged `list`. */
void sbx_tenants_enc_obj(sbx_enc *e, const struct sbx_principal *p, const msgpack_object *o);

/* sbx_tenants_reencode_ids — as sbx_tenants_reencode, and each ID of the
 * args' `ids` array (sandbox.fork's new sandboxes, runtime/ops/fork.yaml)
 * put into p's namespace like the request's own sandbox: a tenant forks
 * only into its own IDs.  0 with *out (caller frees), SBX_E_VALIDATION
 * with why[] (an ID that is not valid or does not fit), or -ENOMEM. */
int sbx_tenants_reencode_ids(const msgpack_object *root, const struct sbx_principal *p,
                             const char *sandbox, char **out, size_t *outlen, char *why,
                             size_t whylen);
/* sbx_tenants_reencode — request map `root` again without its "key" and,
 * when sandbox is not NULL, with "sandbox" replaced by it.  0 with *out
 * (caller frees), or -ENOMEM. */
int sbx_tenants_reencode(const msgpack_object *root, const char *sandbox, char **out,
                         size_t *outlen);

/*
 * sbx_tenants_admin — run admin op `op_id` (tenant.* / key.*) with its
 * args (msgpack map bytes, copied) for request id `rid` on a thread of its
 * own; done(arg, reply, len) is called there once with the encoded reply
 * (borrowed for the call).  Its changes to the registry are made with the
 * system token on behalf of `caller_key_id` (the envelope's "for", which the
 * gateway honours from the system token only), so the audit log names the
 * admin.  0, or -ENOMEM when no thread could start (done is not called then).
 */
int sbx_tenants_admin(sbx_tenants *t, int op_id, const char *rid, const char *caller_key_id,
                      const void *args, size_t alen,
                      void (*done)(void *arg, const char *reply, size_t len), void *arg);

#endif
