/*
 * stream.h — sequenced event streams inside the agent.
 *
 * A stream is an ordered list of events (each a msgpack map carrying its
 * `seq`, 1, 2, 3, …) that clients pull with `stream.read {streamId, after}`:
 * the reply holds the events with seq > after, or waits (long poll) until
 * there are some, the stream ends, or `waitMs` passes.  A client that loses
 * a reply and asks again with the same `after` gets the same events: nothing
 * is lost or repeated (docs/protocol.md §streams).
 *
 * Two retention policies:
 *  - lossless (execStream, readFileStream, watch): events stay until a read
 *    with a larger `after` acknowledges them, and the last 256 KiB of
 *    acknowledged ones a little longer: a reader whose connection dropped
 *    with events in flight (the HTTP front acknowledges what it has written,
 *    not what the client has read) resumes from its own last event.  When
 *    `cap` bytes are waiting
 *    the producer is paused (its pipe is no longer read, so the command
 *    blocks on write): a slow reader applies back-pressure, buffers never
 *    grow past the cap.
 *  - ring (background-process logs): the newest `cap` bytes are kept, older
 *    events are dropped; a process printing forever never exhausts memory,
 *    and a reader that falls behind is told how many events it missed.
 * Several readers may read a ring stream at once; a lossless stream has one
 * reader (its acknowledgements drive the producer).
 */
#ifndef SBX_AGENT_STREAM_H
#define SBX_AGENT_STREAM_H

#include <stdbool.h>
#include <stdint.h>

#include "agent.h"

struct stream;

struct stream_ops {
    /* The producer may go on (space freed after a pause). */
    void (*resume)(struct stream *st, void *arg);
    /* A client cancelled the stream (stream.cancel). */
    void (*cancel)(struct stream *st, void *arg);
};

struct stream {
    struct stream *next;
    struct agent *a;
    char id[72];
    bool lossless;
    bool done;              /* the terminal event is in */
    bool paused;            /* lossless producer waiting for space */
    uint64_t next_seq;      /* seq of the next event */
    uint64_t first_seq;     /* seq of the oldest retained event */
    uint64_t acked;         /* lossless: highest seq acknowledged */
    size_t cap, bytes;      /* bytes: of events not yet acknowledged (lossless) or kept (ring) */
    size_t replay_bytes;    /* lossless: acknowledged events kept for a reader that reconnects */
    struct sev *head, *tail;
    struct sreader *readers;/* long polls waiting */
    const struct stream_ops *ops;
    void *arg;
    int64_t last_read_ms;
    int refs;               /* owners: producer, process table, … */
};

/*
 * stream_new — create and register a stream named id (copied).  The caller
 * holds one reference; stream_unref drops it, and the stream goes away when
 * no reference is left and no reader waits.
 */
struct stream *stream_new(struct agent *a, const char *id, bool lossless, size_t cap,
                          const struct stream_ops *ops, void *arg);
void stream_ref(struct stream *st);
void stream_unref(struct stream *st);
struct stream *stream_find(struct agent *a, const char *id);

/*
 * stream_begin / stream_commit — append one event: stream_begin opens the
 * event map (seq and type are written) and returns the encoder to add fields
 * to; stream_commit closes it and wakes readers.  `terminal` marks the last
 * event of the stream.
 */
sbx_enc *stream_begin(struct stream *st, const char *type);
void stream_commit(struct stream *st, bool terminal);
/* stream_data — shorthand: a stdout/stderr event with `data` (bin). */
void stream_data(struct stream *st, const char *type, const char *p, size_t n,
                 const char *extra_key, const char *extra_val);
/* stream_full — lossless stream at its cap: the producer should pause. */
bool stream_full(const struct stream *st);

/* Visit retained events in order (for logs and log matching); fn gets the
 * decoded event map; returning non-zero stops. */
int stream_foreach(struct stream *st, int (*fn)(void *arg, const msgpack_object *ev), void *arg);

/* Agent operations: stream.read, stream.cancel. */
void agent_op_stream_read(struct agent *a, struct agent_req *r);
void agent_op_stream_cancel(struct agent *a, struct agent_req *r);
/* Drop streams that ended and were not read for a while (called by a timer). */
void agent_streams_gc(struct agent *a);
void agent_streams_free(struct agent *a);

#endif
