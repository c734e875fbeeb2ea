/*
 * cview.h — a process's view of the cluster, kept from etcd.
 *
 * The cluster's authority lives in etcd (actors-cluster.md §0 and §1e), under
 * the prefix "/sbx/<cluster>/":
 *
 *   c/members/<shard>   {"url": nng URL, "relay": preview relay, "startedMs": …}
 *                       bound to the shard's lease: it vanishes when the shard
 *                       stops renewing it (death is declared by lease expiry)
 *   c/parts/<pppp>      the owner shard of partition pppp: exactly 4 decimal
 *                       digits, 0000-4095, as sbx_cview_part_key writes them;
 *                       the key's mod_revision is the partition's epoch
 *   c/drain/<shard>     present while the shard is being drained
 *   r/<pppp>/<id>       a sandbox record (msgpack, actors/record.h), written
 *                       by the owner before it acknowledges (actors/cluster_repl.c)
 *
 * <shard> and the value of a parts/ key are shard names (sbx_cview_name_ok).
 * What does not fit is ignored with a log line, never read leniently: a
 * parts/ key in another spelling ("parts/+12", "parts/ 12", "parts/0012x")
 * names no partition; a members/ or drain/ key with a name that is not a
 * shard name is no member; a parts/ value that is not a shard name (or
 * holds a NUL) leaves the partition without an owner at the key's epoch.
 *
 * A view reads c/ once (range) and then follows it with a watch; when the
 * watch ends (etcd.h: a broken connection, a malformed answer, an HTTP
 * error, a compaction) it reads c/ again, backing off (50 ms doubling to 2 s)
 * while watches end without delivering anything.  After each change the
 * callback runs (on the view's thread; it must not block long).  Gateways
 * route with it; shards decide ownership with it.  Readers take the view's
 * lock to look at members and parts.
 */
#ifndef SBX_CVIEW_H
#define SBX_CVIEW_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "etcd.h"
#include "place.h"

#define SBX_CVIEW_MAX_MEMBERS 64

/*
 * The member table: a slot per name that a members/ key or a partition's
 * owner references, at most SBX_CVIEW_MAX_MEMBERS.  A slot whose name
 * neither has a member key nor owns a partition is freed (name ""), so
 * names of shards that left, and partitions' former owners, never fill the
 * table for good; when it is full anyway, a shard with a members/ key takes
 * the slot of a name only partitions reference (those partitions then have
 * no owner in the view, at their epoch: claimable).  A drain/ key takes no
 * slot.
 */
struct sbx_cmember {
    char name[64];     /* "": a free slot (not live, not draining, no partition) */
    char url[256];     /* "" when the members/ value gives none that fits */
    char relay[256];
    int64_t started_ms;
    uint64_t gen;      /* set anew each time the slot is given to a name (0: never) */
    bool live;         /* its members/ key exists (its lease is alive) */
    bool draining;     /* a drain/ key exists for it */
};

struct sbx_cpart {
    int16_t owner; /* index into members, or -1: no key (epoch 0), or a key whose value
                      names no member the view holds (not a shard name, or the table was
                      full; epoch > 0: a claim compares the key's mod_revision) */
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

/* Under the lock: members[0..n) (n only grows; free slots have name ""),
 * parts[SBX_PARTITIONS], whether the first read is done and the revision
 * the view reflects.  Within one hold of the lock, parts' owners index
 * members consistently.  An index names the same shard for as long as that
 * shard is live or owns a partition (a re-sync keeps it too); a slot freed
 * and given to another name gets another gen, so whoever keeps an index past
 * the lock (a gateway's socket per slot) compares gen (or the name). */
void sbx_cview_lock(sbx_cview *v);
void sbx_cview_unlock(sbx_cview *v);
const struct sbx_cmember *sbx_cview_members(sbx_cview *v, int *n);
const struct sbx_cpart *sbx_cview_parts(sbx_cview *v);
bool sbx_cview_synced(sbx_cview *v);
int64_t sbx_cview_revision(sbx_cview *v);
/* sbx_cview_member — under the lock: the index of the member named name, or -1. */
int sbx_cview_member(sbx_cview *v, const char *name);

/* sbx_cview_name_ok — whether name (n bytes) is a shard name the view takes:
 * 1-63 bytes of [A-Za-z0-9._-], the first a letter or digit (host names fit).
 * A shard refuses to join a cluster under any other (actors/cluster_repl.c). */
bool sbx_cview_name_ok(const char *name, size_t n);

/* Key helpers: "<prefix>c/parts/0042" etc. into out[outlen]. */
void sbx_cview_part_key(const char *prefix, uint32_t part, char *out, size_t outlen);
void sbx_cview_rec_key(const char *prefix, uint32_t part, const char *id, char *out,
                       size_t outlen);

#endif
