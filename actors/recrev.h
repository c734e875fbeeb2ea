/*
 * recrev.h — the revision etcd holds each sandbox record at, as the
 * replication of actors/cluster_repl.c last saw it (issue 11 item 2).
 *
 * A replication transaction compares the record key's mod_revision with
 * the one the shard knows (besides the partition's owner and epoch), so a
 * late copy of an earlier transaction — one re-sent to another endpoint,
 * or retried by the replication thread, whose first copy reaches etcd
 * late — fails instead of overwriting a newer acknowledged write.  A
 * revision is known per partition epoch: at another epoch (the partition
 * moved and came back) it is read from etcd again.  0 stands for "no such
 * key" (etcd compares a missing key's mod_revision as 0).
 *
 * Used by the replication thread only (no locking).  At most
 * RECREV_MAX entries: past that the table starts empty again (its entries
 * are read from etcd again when next needed).
 */
#ifndef SBX_RECREV_H
#define SBX_RECREV_H

#include <stdint.h>

#define RECREV_MAX (1u << 20)

typedef struct recrev recrev;

/* recrev_new — an empty table (never NULL: allocation failure aborts). */
recrev *recrev_new(void);
/* recrev_free — free r (NULL: nothing). */
void recrev_free(recrev *r);
/* recrev_get — 0 with *mod if the revision of record id is known at epoch,
 * else -ENOENT.  id: a sandbox ID (1-63 bytes, NUL-terminated). */
int recrev_get(const recrev *r, const char *id, int64_t epoch, int64_t *mod);
/* recrev_set — the record id is at revision mod (0: absent) at epoch. */
void recrev_set(recrev *r, const char *id, int64_t epoch, int64_t mod);

#endif
