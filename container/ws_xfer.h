/*
 * ws_xfer.h — moving a persistent workspace's image (container/workspace.h)
 * from one node to another, chunk by chunk (docs/persistence.md, "Across
 * the cluster"; the transport, the internal op workspace.put, is
 * actors/ws_move.c's: this file knows nothing of nng or of the cluster).
 *
 * The sender reads only the image's data extents (SEEK_DATA/SEEK_HOLE: a
 * 1 GiB image holding 30 MiB sends about 30 MiB); each chunk goes with its
 * offset and the sha256 of its bytes; the transfer's digest is the sha256
 * of the sequence of chunk records (offset and length as 8-byte big-endian
 * numbers, then the chunk's sha256).  The receiver writes the chunks into
 * "<dir>/<kind>.in" (sparse: ftruncate to the image's size first), checks
 * each chunk's sha256 as it arrives, appends its record to "<dir>/<kind>.in.sums"
 * and, at the commit, compares the digest of that file with the sender's
 * and renames the image into place ("<dir>/disk.img" for a move,
 * "<dir>/snap.img" for a snapshot).  Until then nothing that a mount uses
 * is touched: a transfer cut short leaves only the ".in" files, which the
 * next begin replaces and an abort (or the shard's sweep) removes.
 *
 * No state is kept between calls (each opens what it needs): the functions
 * are safe on any thread, for different directories at once.  Errors: 0 or
 * -errno, with the reason in why.
 */
#ifndef SBX_WS_XFER_H
#define SBX_WS_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_WS_XFER_SHA 32 /* bytes of a sha256 */

/* What a transfer delivers: the image of a move (its owner changes) or a
 * snapshot (kept beside it for a failover). */
enum sbx_ws_kind { SBX_WS_MOVE, SBX_WS_SNAP };

/* The sender's side: the image open, locked, and where the next chunk starts. */
struct sbx_ws_src {
    int fd;            /* the image (owned; sbx_ws_src_close closes it and its lock) */
    uint64_t size;     /* its apparent size, bytes */
    uint64_t pos;      /* where the next data extent is looked for */
    uint64_t sent;     /* bytes of data read so far */
    uint64_t chunks;   /* chunks read so far */
    void *hash;        /* struct sha256_ctx of the chunk records (heap) */
};

/*
 * sbx_ws_src_open — open <dir>/disk.img for sending and take the flock a
 * mount takes (sbx_ws_mount), waiting up to 5 s for a stopping container's
 * mount to go: the image is not mounted while it is read.  -ENOENT: there
 * is no image (nothing to send).
 */
int sbx_ws_src_open(const char *dir, struct sbx_ws_src *s, char *why, size_t whylen);

/*
 * sbx_ws_src_next — the next chunk of data: up to max bytes read at
 * *offset into buf (caller's, max bytes), *len bytes (0: the end), the
 * chunk's sha256 into sha.  A chunk never spans a hole.
 */
int sbx_ws_src_next(struct sbx_ws_src *s, char *buf, size_t max, uint64_t *offset, size_t *len,
                    uint8_t sha[SBX_WS_XFER_SHA], char *why, size_t whylen);

/* sbx_ws_src_digest — the transfer's digest so far (after the last chunk:
 * what the commit sends). */
void sbx_ws_src_digest(const struct sbx_ws_src *s, uint8_t digest[SBX_WS_XFER_SHA]);

void sbx_ws_src_close(struct sbx_ws_src *s);

/* sbx_ws_recv_begin — a new transfer of an image of size bytes into dir
 * (made, 0700): "<kind>.in" created empty and sparse, any earlier one
 * replaced. */
int sbx_ws_recv_begin(const char *dir, enum sbx_ws_kind kind, uint64_t size, char *why,
                      size_t whylen);

/* sbx_ws_recv_chunk — write len bytes at offset after checking their
 * sha256 against sha (-EBADMSG) and that they lie within the image
 * (-ERANGE); -ENOENT: no transfer begun. */
int sbx_ws_recv_chunk(const char *dir, enum sbx_ws_kind kind, uint64_t offset, const void *data,
                      size_t len, const uint8_t sha[SBX_WS_XFER_SHA], char *why, size_t whylen);

/* sbx_ws_recv_commit — check the transfer's digest (-EBADMSG: a chunk is
 * missing, repeated or out of order), write the image to disk (fdatasync)
 * and rename it into place; for SBX_WS_SNAP, taken_ms (ms since the epoch:
 * when the sender froze the workspace) is kept in "<dir>/snap.time". */
int sbx_ws_recv_commit(const char *dir, enum sbx_ws_kind kind, const uint8_t digest[SBX_WS_XFER_SHA],
                       int64_t taken_ms, char *why, size_t whylen);

/* sbx_ws_recv_abort — remove what a transfer left ("<kind>.in", its sums). */
void sbx_ws_recv_abort(const char *dir, enum sbx_ws_kind kind);

/* sbx_ws_snap_drop — remove the snapshot kept in dir (snap.img, snap.time
 * and a transfer's leftovers), and dir itself if nothing else is in it. */
void sbx_ws_snap_drop(const char *dir);

#endif
