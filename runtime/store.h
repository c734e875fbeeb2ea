/*
 * store.h — the LMDB metadata store of a shard (or of any sbxd process).
 *
 * Rules we rely on (lmdb.h 0.9.24 "Caveats"; actors-cluster.md §1g):
 *  - one environment per process, opened once (opening the same file twice in
 *    a process breaks its fcntl locks);
 *  - MDB_NOTLS, so a read transaction may be used by whichever thread runs
 *    the code, and reader slots are tied to transactions, not threads;
 *  - exactly one writer: a dedicated thread drains a queue of puts and
 *    deletes into one transaction per batch (group commit), so N concurrent
 *    actor writes cost one fsync;
 *  - no transaction is ever held across container or network I/O;
 *  - a batch is bounded: at most SBX_STORE_BATCH_OPS writes and, beyond its
 *    first write, at most SBX_STORE_BATCH_BYTES of keys and values, so one
 *    transaction (and its dirty pages in memory) stays small however much
 *    is queued (beyond them only the writes to be committed with one of its
 *    writes: sbx_store_put_with);
 *  - the map starts at `mapsize` (sparse on disk) and grows: a batch that
 *    meets MDB_MAP_FULL is aborted, the map is doubled (up to `map_max`,
 *    mdb_env_set_mapsize, with no read transaction open: readers hold a
 *    shared lock the growth takes exclusively) and the batch retried;
 *  - a write that still cannot be committed because the map is at its
 *    maximum or the file system is full (ENOSPC, EDQUOT) fails with
 *    SBX_E_STORAGE_FULL — alone: the writes of its batch are retried one per
 *    transaction, so the ones that fit are committed; reads keep working
 *    (but a read waits for the redo log's writes of its database, below, and
 *    fails with their code while they do not fit — as every later write
 *    that goes to LMDB does: none reaches LMDB before them);
 *    LMDB's EIO for a short write of its pages (a full tmpfs) counts as a
 *    full file system when the data directory has (nearly) no space left;
 *  - writes that must be atomic are committed together (sbx_store_put_with,
 *    sbx_store_hold below);
 *  - a write made on top of another (sbx_store_put_after) fails, with that
 *    one's code, when that one failed: what a failed write changed never
 *    becomes durable through a later write queued before the failure was
 *    known (issue 11, the output gate's undo; docs/protocol.md §4.1).
 *
 * Durability contract (the output gate): a write's sequence number is
 * "committed" only after mdb_txn_commit() returned 0 with the default sync
 * mode, or after the group of the redo log holding it was written and
 * fdatasync(2) returned 0 (sbx_store_put_logged below; runtime/store_log.h);
 * callers reply to clients only after that (the output gate, actors/shard.h).
 * A write committed through the log reaches LMDB in order with the others
 * (before any later write; a read waits for it), and an open after a crash
 * replays it.
 */
#ifndef SBX_STORE_H
#define SBX_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "prom.h"

typedef struct sbx_store sbx_store;

/* Named databases. */
enum sbx_db {
    SBX_DB_SANDBOXES = 0, /* sandbox ID → msgpack sandbox record (actors/record.h) */
    SBX_DB_META,          /* process metadata (schema version, shard name, …) */
    SBX_DB_IDEM,          /* request id → cached reply of a state-changing op */
    SBX_DB_AUDIT,         /* time + sequence → audit entry (actors/audit.c) */
    SBX_DB__N
};

/* Bounds of one group-commit transaction (see the rules above). */
#define SBX_STORE_BATCH_OPS 256
#define SBX_STORE_BATCH_BYTES (4u << 20)

/* The redo log takes writes of at most SBX_STORE_LOG_MAX_WRITE bytes (key
 * plus value), and keeps them at most SBX_STORE_LOG_DELAY_MS (default of
 * sbx_store_set_log_delay) before they go to LMDB. */
#define SBX_STORE_LOG_MAX_WRITE 4096
#define SBX_STORE_LOG_DELAY_MS 10

/* Default map sizes of a shard (sbxd --map-size / --map-max). */
#define SBX_STORE_MAP_DEFAULT (1ull << 30)
#define SBX_STORE_MAP_MAX_DEFAULT (64ull << 30)

/*
 * Called on the writer thread after each batch, in sequence order: writes
 * with sequence numbers first..last were committed (rc == 0) or all failed
 * (rc < 0: SBX_E_STORAGE_FULL, -errno or SBX_E_STORAGE).  A batch whose
 * writes had different outcomes is reported as several ranges.  Must not
 * block (it may queue writes) nor read the store (a read may wait for this
 * thread: sbx_store_get); the shard posts to its loop from here.
 */
typedef void (*sbx_store_commit_fn)(void *arg, uint64_t first, uint64_t last, int rc);

/*
 * sbx_store_open — open (creating) the environment in directory `dir`
 * (created 0700 if missing) with a map of `mapsize` bytes (at least what
 * the file already uses) that may grow up to `map_max` bytes (0 or less
 * than mapsize: no growth), open its redo log (`dir`/redo.log, 1 MiB,
 * created full of zeros) and apply to LMDB the writes it holds that LMDB
 * lacks (committed before a crash), and start the writer thread.  `cb`
 * may be NULL.  0 or a negative code: -errno of the log's file, or
 * SBX_E_STORAGE_FULL / SBX_E_STORAGE when the log holds writes LMDB cannot
 * take (the map at `map_max`, the file system full: the open fails rather
 * than lose them).  With nothing to replay and no room to record the log's
 * new pass the store opens without a log (every write through LMDB).  On
 * success the caller owns *out and must sbx_store_close it.
 *
 * A data directory written by this store must be closed cleanly (or opened
 * once by this code again) before an older build without the log opens it:
 * that one would not replay the log's writes.
 */
int sbx_store_open(sbx_store **out, const char *dir, uint64_t mapsize, uint64_t map_max,
                   sbx_store_commit_fn cb, void *cbarg);

/* sbx_store_close — commit what is queued, stop the writer, close the env.
 * No other call on s may overlap it or follow it (s is freed). */
void sbx_store_close(sbx_store *s);

/*
 * sbx_store_get — copy the value of key k in db into a heap buffer the
 * caller frees (*val, NUL-terminated for convenience; *vn excludes the NUL).
 * Returns 0, -ENOENT, or SBX_E_STORAGE.  Sees committed data only, and
 * every write of db decided before the call: writes of db still only in
 * the redo log are applied first (it waits for the writer; it fails with
 * that apply's code, SBX_E_STORAGE_FULL say, if they cannot be).
 */
int sbx_store_get(sbx_store *s, int db, const void *k, size_t kn, char **val, size_t *vn);

/*
 * sbx_store_foreach — call fn for every key/value of db in key order, inside
 * one read transaction (fn must not block or call back into the store).  The
 * views are valid only during the call.  fn returns 0 to go on, anything else
 * stops the walk and is returned.  Sees what sbx_store_get sees (waits for
 * the redo log's writes of db in the same way).
 */
int sbx_store_foreach(sbx_store *s, int db,
                      int (*fn)(void *arg, const void *k, size_t kn, const void *v, size_t vn),
                      void *arg);

/*
 * sbx_store_put / sbx_store_del — queue a write for the next batch and
 * return its sequence number (> 0, increasing).  Keys are ≤ 511 bytes
 * (MDB_MAXKEYSIZE); values of any size.  The data is copied.  Thread-safe.
 */
uint64_t sbx_store_put(sbx_store *s, int db, const void *k, size_t kn, const void *v, size_t vn);
uint64_t sbx_store_del(sbx_store *s, int db, const void *k, size_t kn);

/* sbx_store_last_seq — the sequence number of the last write queued so far
 * (0 before the first).  Thread-safe. */
uint64_t sbx_store_last_seq(sbx_store *s);

/*
 * sbx_store_put_after / sbx_store_del_after — the same, for a write made
 * on top of write `after` (its sequence number; 0: none): if `after`
 * failed, this write is not applied and fails with after's code.  `after`
 * must be an earlier sequence number of this store.
 */
uint64_t sbx_store_put_after(sbx_store *s, int db, const void *k, size_t kn, const void *v,
                             size_t vn, uint64_t after);
uint64_t sbx_store_del_after(sbx_store *s, int db, const void *k, size_t kn, uint64_t after);

/*
 * sbx_store_put_with — sbx_store_put_after for a write that must be
 * committed in the same transaction as write `with` whenever both are
 * still queued when the writer takes a batch: the batch's bounds never
 * separate them, and a batch that does not fit is retried with them
 * together (they fit or fail together).  With a hold (below) around both,
 * neither is taken before the other is queued.  Its use: a state change
 * and its recorded reply in the idempotency table (actors/idem.c), so a
 * crash never leaves the change without the reply a retry must get (a
 * destroy answered `destroyed: false` on its retry: the fault test's
 * not_linearizable).  Thread-safe.
 */
uint64_t sbx_store_put_with(sbx_store *s, int db, const void *k, size_t kn, const void *v,
                            size_t vn, uint64_t with);

/*
 * sbx_store_hold / sbx_store_release — the writes queued from the hold on
 * (by any thread) stay in the queue until the release; writes queued
 * before it are committed as usual.  A hold is not counted: a second hold
 * is a no-op, one release ends it.  A close, and an sbx_store_wait for a
 * held write by the thread that took the hold (it needs the write decided:
 * no deadlock), end it too; other threads' waits last until the release.
 * The holder must release it soon (the shard holds from a state write to
 * the end of the loop callback that made it: actors/gate.c
 * shard_store_record).  Thread-safe.
 */
void sbx_store_hold(sbx_store *s);
void sbx_store_release(sbx_store *s);

/*
 * sbx_store_put_lazy_after — sbx_store_put_after for a write nobody needs
 * committed soon (an agent operation's recorded reply, whose intent is
 * already committed: actors/idem.c idem_persist).  It wakes no writer: it
 * goes with the next batch another write (or an sbx_store_wait for it)
 * starts, and at the latest SBX_STORE_LAZY_MS after it was queued.  Its
 * sequence number is decided in order with the others as usual; a
 * sbx_store_wait for it (or a later one) makes it due at once.  So one
 * sandbox's requests one after another cost one commit each (a request's
 * intent carries the previous reply), not two.  Thread-safe.
 */
#define SBX_STORE_LAZY_MS 5
uint64_t sbx_store_put_lazy_after(sbx_store *s, int db, const void *k, size_t kn, const void *v,
                                  size_t vn, uint64_t after);

/*
 * sbx_store_put_logged — sbx_store_put for a small write that something
 * waits for before it can go on (an agent operation's intent:
 * actors/idem.c idem_intent).  The batch it is taken in is committed by
 * one group of the redo log — one write and one device flush, where an
 * LMDB commit makes two — when every write of the batch is logged or lazy
 * (sbx_store_put_lazy_after), a put, not one to be committed with another
 * (sbx_store_put_with), with a key of 1..511 bytes (LMDB's maximum) and at
 * most SBX_STORE_LOG_MAX_WRITE bytes of key and value; when the log has
 * room for it (it has not failed: a failed append sends every later write
 * to LMDB); and when the log's earlier writes are not due for LMDB (then
 * they go together).  It is applied to LMDB within the log delay (below),
 * with the next LMDB transaction, or when a read of its database needs it.
 * Any other batch goes to LMDB as usual.  A batch whose append fails is
 * committed through LMDB instead; if that fails too, it is answered as
 * failed only once the log's pass is replaced, and the process stops
 * (abort(3)) before answering when not even that commits — a write
 * answered as failed is never replayed (runtime/store_log.h).  Thread-safe.
 */
uint64_t sbx_store_put_logged(sbx_store *s, int db, const void *k, size_t kn, const void *v,
                              size_t vn);

/* sbx_store_set_log_delay — how long, in ms, writes committed through the
 * redo log may wait before their LMDB transaction (default
 * SBX_STORE_LOG_DELAY_MS; sooner when the log is half full).  Longer means
 * fewer LMDB commits and later reads waiting for one; the tests set it
 * long to find the writes in the log after a crash.  Thread-safe. */
void sbx_store_set_log_delay(sbx_store *s, int64_t ms);

/* sbx_store_logged — how many batches were committed through the redo log
 * (each with at least one write committed: they count in sbx_store_stat's
 * batches too).  Thread-safe. */
uint64_t sbx_store_logged(sbx_store *s);

/* sbx_store_wait — block until write `seq` is decided; returns its rc (0, or
 * the failure code the callback reported for it). */
int sbx_store_wait(sbx_store *s, uint64_t seq);

/* sbx_store_failed — the failure code of write `seq` if it is decided and
 * failed, else 0 (committed, or not decided yet).  Never blocks on the
 * writer and never ends a hold (unlike sbx_store_wait); every failed range
 * is remembered for the store's lifetime, so it answers for writes decided
 * long ago.  Thread-safe. */
int sbx_store_failed(sbx_store *s, uint64_t seq);

/* sbx_store_decided — the highest sequence number up to which every write
 * is decided (writes are decided in order; 0 before the first).  Does not
 * block on the writer.  Thread-safe. */
uint64_t sbx_store_decided(sbx_store *s);

/* sbx_store_stat — counters for `sbx status`: batches and writes committed,
 * failed ranges (see the callback). */
void sbx_store_stat(sbx_store *s, uint64_t *batches, uint64_t *writes, uint64_t *failed);

/* sbx_store_hists — copies of the histograms of the batches committed
 * (tried: a failed batch counts too): the commit's time in seconds, from
 * taking the batch to its transaction's end (sbx_prom_latency_s bounds), and
 * its writes (sbx_prom_batch_sizes bounds).  Thread-safe. */
void sbx_store_hists(sbx_store *s, struct sbx_hist *commit, struct sbx_hist *batch);

/* sbx_store_mapsize — the map's current size in bytes (grows, see above). */
uint64_t sbx_store_mapsize(sbx_store *s);

#endif
