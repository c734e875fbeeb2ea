/*
 * cview.h — a process's view of the cluster, kept from etcd.
 *
 * The cluster's authority lives in etcd (actors-cluster.md §0 and §1e), under
 * the prefix "/sbx/<cluster>/":
 *
 *   c/members/<shard>   {"url": nng URL, "relay": preview relay, "startedMs": …}
 *                       bound to the shard's lease: it vanishes when the shard
 *                       stops renewing it (death is declared by lease expiry)
 *   c/parts/<pppp>      the owner shard of partition pppp (4 decimal digits);
 *                       the key's mod_revision is the partition's epoch
 *   c/drain/<shard>     present while the shard is being drained
 *   r/<pppp>/<id>       a sandbox record (msgpack, actors/record.h), written
 *                       by the owner before it acknowledges (actors/cluster.c)
 *
 * A view reads c/ once (range) and then follows it with a watch; after each
 * change the callback runs (on the view's thread; it must not block long).
 * Gateways route with it; shards decide ownership with it.  Readers take the
 * view's lock to look at members and parts.
 */
#ifndef SBX_CVIEW_H
#define SBX_CVIEW_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "etcd.h"
#include "place.h"

#define SBX_CVIEW_MAX_MEMBERS 64

struct sbx_cmember {
    char name[64];
    char url[256];
    char relay[256];
    int64_t started_ms;
    bool live;     /* its members/ key exists (its lease is alive) */
    bool draining; /* a drain/ key exists for it */
};

struct sbx_cpart {
    int16_t owner; /* index into members, or -1: no owner yet */
    int64_t epoch; /* mod_revision of the partition's key (0: no key) */
};

typedef struct sbx_cview sbx_cview;
typedef void (*sbx_cview_fn)(void *arg);

/*
 * sbx_cview_start — read the cluster state under prefix ("/sbx/<cluster>/")
 * and follow it on a thread of its own; fn(arg) (may be NULL) after each
 * change.  The etcd client is borrowed (the caller closes it after
 * sbx_cview_stop).  0 or a negative code.
 */
int sbx_cview_start(sbx_cview **out, sbx_etcd *etcd, const char *prefix, sbx_cview_fn fn,
                    void *arg);
void sbx_cview_stop(sbx_cview *v);

/* Under the lock: members[0..n) (indexes never change; dead ones stay with
 * live = false), parts[SBX_PARTITIONS], whether the first read is done and
 * the revision the view reflects. */
void sbx_cview_lock(sbx_cview *v);
void sbx_cview_unlock(sbx_cview *v);
const struct sbx_cmember *sbx_cview_members(sbx_cview *v, int *n);
const struct sbx_cpart *sbx_cview_parts(sbx_cview *v);
bool sbx_cview_synced(sbx_cview *v);
int64_t sbx_cview_revision(sbx_cview *v);
/* sbx_cview_member — index of name (interning it if new, not live), or -1 when full. */
int sbx_cview_member(sbx_cview *v, const char *name);

/* Key helpers: "<prefix>c/parts/0042" etc. into out[outlen]. */
void sbx_cview_part_key(const char *prefix, uint32_t part, char *out, size_t outlen);
void sbx_cview_rec_key(const char *prefix, uint32_t part, const char *id, char *out,
                       size_t outlen);

#endif
