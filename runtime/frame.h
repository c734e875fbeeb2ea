/*
 * frame.h — length-prefixed frames on a byte stream (the actor ↔ agent
 * channel, a SOCK_STREAM socketpair).  A frame is a 4-byte big-endian length
 * followed by that many bytes of msgpack.  nng frames messages itself; this is
 * only for raw fds.
 *
 * The reader never allocates more than max_frame + 4 bytes for one frame: a
 * peer that announces a larger frame is a protocol error (-EMSGSIZE) and the
 * channel must be closed.
 */
#ifndef SBX_FRAME_H
#define SBX_FRAME_H

#include <stddef.h>
#include <stdint.h>

#include "util.h"

typedef struct sbx_frame_reader {
    sbx_buf buf;
    size_t max_frame;
    size_t off; /* start of unconsumed data in buf */
} sbx_frame_reader;

void sbx_frame_reader_init(sbx_frame_reader *r, size_t max_frame);
void sbx_frame_reader_free(sbx_frame_reader *r);

/*
 * sbx_frame_read — read what the (non-blocking) fd has.  Returns > 0 bytes
 * read, 0 on EOF, -EAGAIN when nothing was available, or -errno.
 */
ssize_t sbx_frame_read(sbx_frame_reader *r, int fd);

/*
 * sbx_frame_next — the next complete frame, if any: *p and *n point into the
 * reader's buffer and stay valid until the next sbx_frame_read/next call.
 * Returns 1 (frame), 0 (need more bytes) or -EMSGSIZE.
 */
int sbx_frame_next(sbx_frame_reader *r, const char **p, size_t *n);

/* A queue of outgoing bytes for a non-blocking fd. */
typedef struct sbx_frame_writer {
    sbx_buf buf;
    size_t off;
} sbx_frame_writer;

void sbx_frame_writer_init(sbx_frame_writer *w);
void sbx_frame_writer_free(sbx_frame_writer *w);
/* sbx_frame_queue — append a frame (header + payload copy). */
void sbx_frame_queue(sbx_frame_writer *w, const void *p, size_t n);
/* sbx_frame_flush — write as much as the fd takes; 1 when empty, 0 when bytes
 * remain (wait for EPOLLOUT), or -errno. */
int sbx_frame_flush(sbx_frame_writer *w, int fd);
/* sbx_frame_pending — bytes not yet written. */
size_t sbx_frame_pending(const sbx_frame_writer *w);

/* Blocking helpers for set-up paths: send/receive exactly one frame. */
int sbx_frame_send_blocking(int fd, const void *p, size_t n);
/* *out is heap-allocated (caller frees); -EMSGSIZE if larger than max. */
int sbx_frame_recv_blocking(int fd, size_t max, char **out, size_t *n);

#endif
