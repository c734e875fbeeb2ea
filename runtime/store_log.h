/*
 * store_log.h — the store's redo log (internal to runtime/store.c).
 *
 * Why: an LMDB commit makes two device flushes — the data pages, then the
 * meta page that points at them (mdb.c mdb_txn_commit: mdb_env_sync, then
 * mdb_env_write_meta through the O_DSYNC descriptor) — because the meta
 * page must never reach the disk before what it points at.  A small write
 * that must be durable before something happens (an agent operation's
 * intent, actors/idem.c) pays both, about 0.17 ms on this host's disk
 * (docs/benchmarks.md, "hand-overs on the request path").  A record that
 * checks itself needs no such order: one write and one flush.  The log
 * holds such writes until the store applies them to LMDB with a later
 * transaction, which also replaces the log's *pass* (below, kept in META
 * "store.log_pass"): the groups written so far never check out again.
 * After a crash the store replays the groups of the current pass.
 *
 * The file: `<dir>/redo.log`, SBX_SLOG_BYTES long, written full of zeros
 * when created (so an append overwrites allocated blocks, and fdatasync(2)
 * has no block allocation to journal: ext4 flushes the data alone).  It is
 * a sequence of *groups* from offset 0, each one pwrite(2) and one
 * fdatasync(2); all integers little-endian:
 *
 *     0  u32 magic  SBX_SLOG_MAGIC
 *     4  u32 len    bytes of the group, header included, a multiple of 8
 *     8  u64 first  sequence number of the group's first write
 *    16  u64 last   … and of its last
 *    24  u64 sum    XXH3_64bits_withSeed (libxxhash) of bytes [32, len),
 *                   seeded with XXH3_64bits_withSeed of bytes [0, 24)
 *                   seeded with the pass (below)
 *    32  entries, each: u8 db, u8 flags (bit 0: delete), u16 key bytes,
 *        u32 value bytes, u64 seq, the key, the value, zero padding to 8.
 *
 * A *pass* is the run of groups written from offset 0 after the store
 * last made LMDB hold everything: a random 64-bit number (getrandom(2))
 * that the store keeps in LMDB and replaces, in the same transaction,
 * whenever LMDB takes the log's writes (then the next group goes to
 * offset 0 again) — and at every open.  Only the groups of the current
 * pass check out, so the groups of earlier passes, still on disk after the
 * new pass's last group, never do: nor do bytes inside them that look like
 * a group (a recorded reply holds what a sandbox printed), since whoever
 * wrote them cannot know the pass.  A reader takes groups from offset 0
 * while each is whole (magic, bounds, checksum) and its first sequence
 * number is above the previous group's last: a torn append fails its
 * checksum and ends the scan.  The file is the store's (0600); the checksum
 * finds torn and foreign bytes, it is not a signature.  Not thread-safe:
 * the store's writer thread owns the log.
 */
#ifndef SBX_STORE_LOG_H
#define SBX_STORE_LOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_SLOG_BYTES (1u << 20) /* the file's size */
#define SBX_SLOG_MAGIC 0x4c584253u /* "SBXL" */
#define SBX_SLOG_HDR 32
#define SBX_SLOG_ENTRY 16 /* an entry's fixed part */

typedef struct sbx_slog sbx_slog;

/* One write read back by sbx_slog_scan; k and v point into the log's
 * buffer, valid during the callback only. */
struct sbx_slog_entry {
    uint64_t seq;
    int db;
    bool del;
    const void *k, *v;
    size_t kn, vn;
};

/*
 * sbx_slog_open — open `<dir>/redo.log`, creating it (0600, zero-filled to
 * SBX_SLOG_BYTES, then fsync of the file and of dir) or extending a shorter
 * one the same way, and read it into memory for sbx_slog_scan.  A file
 * system without room for that (ENOSPC, EDQUOT) gives a log that can be
 * scanned and takes no group (sbx_slog_broken).  0 or -errno; on success
 * the caller owns *out (sbx_slog_close).
 */
int sbx_slog_open(sbx_slog **out, const char *dir);

/*
 * sbx_slog_scan — call fn for every entry of the groups of pass `pass` read
 * at open (see above), in order; a group's entries only once the whole
 * group checked out.  fn returns 0 to go on; anything else stops the scan
 * and is returned (the end of the valid groups returns 0).  May be called
 * again (the store retries its replay after growing its map); not after
 * sbx_slog_reset, which drops the copy read at open.
 */
int sbx_slog_scan(sbx_slog *l, uint64_t pass,
                  int (*fn)(void *arg, const struct sbx_slog_entry *e), void *arg);

/* sbx_slog_room — bytes a group may still take before the end of the file. */
size_t sbx_slog_room(const sbx_slog *l);

/* sbx_slog_entry_bytes — what an entry of kn + vn bytes adds to a group. */
size_t sbx_slog_entry_bytes(size_t kn, size_t vn);

/*
 * sbx_slog_begin / sbx_slog_add / sbx_slog_append — build a group in the
 * log's buffer (begin drops an unfinished one) and write it, checksummed
 * for pass `pass`, after the last one with a single pwrite(2) then
 * fdatasync(2).  append returns 0 (the group is durable), -ENOSPC if it
 * does not fit in sbx_slog_room (nothing written), or -errno of the write
 * or the flush: the log is then broken (sbx_slog_broken) and takes no more
 * groups — after a failed fdatasync the page cache's state is unknown
 * (fsync(2), "Linux 4.13 and later").  *whole says whether every byte of
 * the group was written (only the flush failed): then it may be whole on
 * disk, and its magic is zeroed (not flushed: a restart without a power
 * loss does not find the group); the store replaces the pass with its
 * next LMDB transaction, the one that commits the batch instead.  If that
 * transaction fails too, the store replaces the pass alone before it
 * answers the writes as failed, and stops the process (abort(3)) if it
 * cannot: the group never replays writes answered as failed (store.c
 * fence_failed_group).  A group not written whole (a failed or short
 * pwrite) fails its checksum and needs none of this.  Keys are < 64 KiB.
 */
void sbx_slog_begin(sbx_slog *l);
void sbx_slog_add(sbx_slog *l, uint64_t seq, int db, bool del, const void *k, size_t kn,
                  const void *v, size_t vn);
int sbx_slog_append(sbx_slog *l, uint64_t pass, bool *whole);

/* sbx_slog_broken — whether an append failed (above). */
bool sbx_slog_broken(const sbx_slog *l);

/* sbx_slog_reset — the next group goes to offset 0 again: call it once a
 * durable LMDB transaction holds every group written (store.c), and once
 * after the scan at open. */
void sbx_slog_reset(sbx_slog *l);

/* sbx_slog_used — bytes of groups written since the last reset. */
size_t sbx_slog_used(const sbx_slog *l);

/* sbx_slog_close — close the file and free l (NULL: nothing). */
void sbx_slog_close(sbx_slog *l);

#endif
