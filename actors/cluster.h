/*
 * cluster.h — a shard in a cluster (sbxd shard --etcd …): membership,
 * partition ownership with epochs, self-fencing, handoff, failover and the
 * replication of sandbox records to etcd.  docs/cluster.md tells the story;
 * runtime/cview.h lists the etcd keys.
 *
 * Threads: a lease thread (registration and keep-alive, nothing else: no
 * handoff or claim can delay a renewal), a control thread (reconciling
 * ownership, handoffs and claims) and a replication thread (record writes to
 * etcd); they talk to the shard's loop thread only through sbx_loop_post and
 * atomics.  The loop owns the self-fence deadline (a timer of its own) and
 * every partition's state.  The functions below run on the loop thread
 * unless they say otherwise.
 *
 * Ownership rules:
 *  - a partition's owner and epoch are its etcd key's value and mod_revision;
 *    rendezvous hashing over the live, non-draining shards only proposes;
 *  - a request is admitted only if this shard owns its partition, at the epoch
 *    the gateway routed it with, the partition's records are installed
 *    (ready) and no handoff of it is under way; else WRONG_OWNER carrying
 *    {partition, epoch, owner} (the gateway re-routes and retries);
 *  - a shard whose lease may have expired (it could not renew it in time)
 *    admits nothing (self-fencing) before anyone else can take over;
 *  - a record write goes to etcd only after its LMDB commit succeeded (the
 *    replication thread waits for the store's decision; a write whose commit
 *    failed is never sent, so etcd holds no change answered as failed);
 *  - a reply to a state change leaves only after the record is committed to
 *    LMDB *and* to etcd by a transaction that compares the partition's owner
 *    with this shard and its epoch with the one the write was made at: an
 *    old owner cannot acknowledge a write after losing the partition, even if
 *    it was paused through its lease's expiry, and a write delayed past the
 *    partition's leaving and coming back is not applied either.
 */
#ifndef SBX_CLUSTER_H
#define SBX_CLUSTER_H

#include <stdbool.h>
#include <stdint.h>

#include "../runtime/wire.h"

struct shard;
struct sop;

/* cluster_start — join the cluster if the shard is configured with etcd
 * (conf.etcd); 0 (also when not configured) or a negative code. */
int cluster_start(struct shard *sh);
/* cluster_stop — leave: stop the threads, revoke the lease (others take
 * over at once).  Call after the loop stopped serving; then run the loop once
 * more (what the threads posted) and cluster_free. */
void cluster_stop(struct shard *sh);
void cluster_free(struct shard *sh);
bool cluster_on(const struct shard *sh);

/* Persistent workspaces across the cluster (actors/ws_snap.c,
 * docs/persistence.md "Across the cluster"), loop thread:
 * cluster_ws_snap_forget — sandbox id was destroyed: the partition's
 * successor is asked (in the background) to drop the snapshot of its
 * workspace it keeps; nothing outside a cluster or without snapshots.
 * cluster_ws_status — add to status's open `workspace` map what this node
 * knows of id's snapshots: snapshotTakenMs, snapshotAgeMs, snapshotOn (the
 * last snapshot sent off this node: the recovery point if it is lost) and
 * restoredFromSnapshot {takenMs, restoredMs, ageMs} (the workspace came
 * back from a snapshot after a failover; ageMs: what was lost, at most). */
void cluster_ws_snap_forget(struct shard *sh, const char *id);
void cluster_ws_status(struct shard *sh, const char *id, sbx_enc *e);

/*
 * cluster_admit — may a request for `part`, routed at `epoch` (0: not given),
 * run here?  0, or an error code with the error's context written into w
 * (the caller replies with it).
 */
int cluster_admit(struct shard *sh, uint32_t part, int64_t epoch, sbx_werr *w);
/*
 * cluster_in_doubt — whether a retry (the envelope's `retry`: an earlier
 * attempt had an unknown outcome) of a request id this shard does not know
 * may have run on an earlier owner of `part`: the partition came to this
 * shard other than by a handoff (a claim from a dead or absent owner, or a
 * restart: its idempotency table stayed with that owner or may lack the
 * entries of an owner before) less than the idempotency TTL ago, or came by
 * a handoff from a shard for which it was so.  The caller answers such a
 * retry of an operation that changes something OPERATION_INTERRUPTED rather
 * than run it a second time.  Loop thread; false outside a cluster.
 */
bool cluster_in_doubt(struct shard *sh, uint32_t part);
/* cluster_listable — whether records of part belong in `list` answers. */
bool cluster_listable(struct shard *sh, uint32_t part);

/* cluster_replicate — a record write (len 0: deletion) with store sequence
 * seq by actor id must reach etcd before replies that depend on it; it is
 * sent once its commit succeeded, never if it failed (the rules above).
 * Copies rec (len bytes); id is a NUL-terminated sandbox ID (borrowed). */
void cluster_replicate(struct shard *sh, uint64_t seq, const char *id, const void *rec,
                       size_t len);
/* cluster_gate_open — whether every replicated write ≤ need is decided. */
bool cluster_gate_open(struct shard *sh, uint64_t need);

/* The shard-to-shard operation partition.import (handoff-in). */
void cluster_op_import(struct sop *op);
/* cluster_metrics — the cluster's metrics of the shard into p (metrics.c):
 * partitions owned and moving, whether the etcd lease is held (not fenced)
 * and the ms it has left; nothing when the shard is not clustered.  Loop thread. */
struct sbx_prom;
void cluster_metrics(struct shard *sh, struct sbx_prom *p);
/* cluster.status: this shard's view of the cluster, as a map value. */
void cluster_encode_status(struct shard *sh, sbx_enc *e);

#endif
