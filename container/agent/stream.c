/* stream.c — sequenced event streams; see stream.h. */
#include "stream.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/err.h"
#include "../../runtime/log.h"

#define READ_MAX_DEFAULT (4u << 20)
#define READ_MAX_LIMIT (16u << 20)
#define WAIT_DEFAULT_MS 25000
#define WAIT_LIMIT_MS 60000
#define IDLE_DROP_MS (5 * 60 * 1000) /* an ended stream nobody reads */
#define REPLAY_BYTES (256u << 10)    /* acknowledged events kept for resumes */

struct sev {
    struct sev *next;
    uint64_t seq;
    size_t len;
    char data[];
};

struct sreader {
    struct sreader *next;
    struct stream *st;
    struct agent_req *req;
    uint64_t after;
    size_t max;
    uint64_t timer;
};


struct stream *
stream_find(struct agent *a, const char *id)
{
    for (struct stream *st = a->streams.list; st; st = st->next)
        if (!strcmp(st->id, id))
            return st;
    return NULL;
}

struct stream *
stream_new(struct agent *a, const char *id, bool lossless, size_t cap,
           const struct stream_ops *ops, void *arg)
{
    struct stream *st = sbx_xcalloc(1, sizeof(*st));
    st->a = a;
    snprintf(st->id, sizeof(st->id), "%s", id);
    st->lossless = lossless;
    st->cap = cap;
    st->ops = ops;
    st->arg = arg;
    st->next_seq = 1;
    st->first_seq = 1;
    st->refs = 1;
    st->last_read_ms = sbx_mono_ms();
    st->next = a->streams.list;
    a->streams.list = st;
    return st;
}

void
stream_ref(struct stream *st)
{
    st->refs++;
}

static void
free_events(struct stream *st)
{
    while (st->head) {
        struct sev *e = st->head;
        st->head = e->next;
        free(e);
    }
    st->tail = NULL;
    st->bytes = 0;
}

static void
stream_destroy(struct stream *st)
{
    struct agent *a = st->a;
    for (struct stream **pp = &a->streams.list; *pp; pp = &(*pp)->next) {
        if (*pp == st) {
            *pp = st->next;
            break;
        }
    }
    free_events(st);
    free(st);
}

void
stream_unref(struct stream *st)
{
    if (--st->refs > 0)
        return;
    /* Nobody produces any more.  A stream that was never going to end
     * (producer gone without a terminal event) is ended here. */
    if (!st->done) {
        sbx_enc *e = stream_begin(st, "error");
        sbx_enc_kmap(e, "error");
        sbx_enc_kstr(e, "code", "INTERNAL_ERROR");
        sbx_enc_kstr(e, "message", "the stream's producer went away");
        sbx_enc_end(e);
        stream_commit(st, true);
    }
    st->ops = NULL;
    /* Freed by agent_streams_gc once consumed or idle. */
}

bool
stream_full(const struct stream *st)
{
    return st->lossless && st->bytes >= st->cap;
}

sbx_enc *
stream_begin(struct stream *st, const char *type)
{
    /* The agent is single-threaded and builds one event at a time, in the
     * scratch encoder it owns. */
    struct agent *a = st->a;
    if (a->streams.ev_open)
        sbx_enc_free(&a->streams.ev_enc);
    a->streams.ev_stream = st;
    a->streams.ev_open = true;
    sbx_enc_init(&a->streams.ev_enc);
    sbx_enc_map(&a->streams.ev_enc);
    sbx_enc_str(&a->streams.ev_enc, "seq");
    sbx_enc_uint(&a->streams.ev_enc, st->next_seq);
    sbx_enc_kstr(&a->streams.ev_enc, "type", type);
    sbx_enc_kint(&a->streams.ev_enc, "timestamp", sbx_wall_ms());
    return &a->streams.ev_enc;
}

static void serve(struct sreader *r);

void
stream_commit(struct stream *st, bool terminal)
{
    struct agent *a = st->a;
    char *buf;
    size_t len;
    if (!a->streams.ev_open || a->streams.ev_stream != st)
        return;
    a->streams.ev_open = false;
    sbx_enc_end(&a->streams.ev_enc);
    if (sbx_enc_finish(&a->streams.ev_enc, &buf, &len) != 0)
        return;
    struct sev *e = sbx_xmalloc(sizeof(*e) + len);
    e->next = NULL;
    e->seq = st->next_seq++;
    e->len = len;
    memcpy(e->data, buf, len);
    free(buf);
    if (st->tail)
        st->tail->next = e;
    else
        st->head = e;
    st->tail = e;
    st->bytes += len;
    if (terminal)
        st->done = true;
    if (!st->lossless) {
        /* Ring: keep the newest cap bytes (always the newest event). */
        while (st->bytes > st->cap && st->head != st->tail) {
            struct sev *old = st->head;
            st->head = old->next;
            st->bytes -= old->len;
            st->first_seq = st->head->seq;
            free(old);
        }
    }
    /* Wake the readers waiting for this. */
    struct sreader *r = st->readers;
    st->readers = NULL;
    while (r) {
        struct sreader *n = r->next;
        r->next = NULL;
        serve(r);
        r = n;
    }
}

void
stream_data(struct stream *st, const char *type, const char *p, size_t n, const char *extra_key,
            const char *extra_val)
{
    /* Large outputs are cut into events of at most 64 KiB. */
    size_t off = 0;
    do {
        size_t k = SBX_MIN(n - off, (size_t)65536);
        sbx_enc *e = stream_begin(st, type);
        sbx_enc_kbin(e, "data", p + off, k);
        if (extra_key)
            sbx_enc_kstr(e, extra_key, extra_val);
        stream_commit(st, false);
        off += k;
    } while (off < n);
}

int
stream_foreach(struct stream *st, int (*fn)(void *arg, const msgpack_object *ev), void *arg)
{
    for (struct sev *e = st->head; e; e = e->next) {
        sbx_msg m;
        if (sbx_wire_decode(&m, e->data, e->len, &sbx_wire_limits_reply) != 0)
            continue;
        int rc = fn(arg, m.root);
        sbx_wire_msg_free(&m);
        if (rc)
            return rc;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Reading. */

static void
ack(struct stream *st, uint64_t after)
{
    if (!st->lossless || after <= st->acked)
        return;
    /* Acknowledged events move from the back-pressure count to the replay
     * tail; the tail keeps the newest REPLAY_BYTES of them. */
    for (struct sev *e = st->head; e && e->seq <= after; e = e->next) {
        if (e->seq > st->acked) {
            st->bytes -= e->len;
            st->replay_bytes += e->len;
        }
    }
    st->acked = after;
    while (st->head && st->head->seq <= st->acked && st->replay_bytes > REPLAY_BYTES) {
        struct sev *e = st->head;
        st->head = e->next;
        st->replay_bytes -= e->len;
        free(e);
    }
    if (!st->head)
        st->tail = NULL;
    st->first_seq = st->head ? st->head->seq : st->next_seq;
    if (st->paused && st->bytes < st->cap / 2) {
        st->paused = false;
        if (st->ops && st->ops->resume)
            st->ops->resume(st, st->arg);
    }
}

static void
reply_events(struct sreader *r, bool timed_out)
{
    struct stream *st = r->st;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "streamId", st->id);
    uint64_t last = r->after;
    size_t bytes = 0;
    /* Events the reader never saw may be gone: a ring dropped them, or a
     * reconnecting reader is further back than the replay tail. */
    if (r->after + 1 < st->first_seq)
        sbx_enc_kint(&e, "missed", (int64_t)(st->first_seq - r->after - 1));
    sbx_enc_karray(&e, "events");
    for (struct sev *ev = st->head; ev; ev = ev->next) {
        if (ev->seq <= r->after)
            continue;
        if (bytes && bytes + ev->len > r->max)
            break;
        sbx_enc_raw(&e, ev->data, ev->len);
        bytes += ev->len;
        last = ev->seq;
    }
    sbx_enc_end(&e);
    bool done = st->done && last + 1 == st->next_seq;
    sbx_enc_kbool(&e, "done", done);
    sbx_enc_kint(&e, "next", (int64_t)last);
    (void)timed_out;
    agent_reply_ok(st->a, r->req, &e);
}

static bool
has_news(struct stream *st, uint64_t after)
{
    return st->tail && st->tail->seq > after;
}

static void
reader_timeout(sbx_loop *l, void *arg)
{
    struct sreader *r = arg;
    struct stream *st = r->st;
    (void)l;
    r->timer = 0;
    for (struct sreader **pp = &st->readers; *pp; pp = &(*pp)->next) {
        if (*pp == r) {
            *pp = r->next;
            break;
        }
    }
    reply_events(r, true);
    free(r);
}

static void
serve(struct sreader *r)
{
    struct stream *st = r->st;
    sbx_loop_cancel(st->a->loop, r->timer);
    reply_events(r, false);
    free(r);
}

void
agent_op_stream_read(struct agent *a, struct agent_req *req)
{
    sbx_str id;
    int64_t after = 0, max = READ_MAX_DEFAULT, wait = WAIT_DEFAULT_MS;
    if (sbx_wire_get_str(req->args, "streamId", &id) != 0 || id.n == 0 || id.n >= 72) {
        agent_reply_err(a, req, SBX_E_VALIDATION, "'streamId' is required");
        return;
    }
    if (sbx_wire_get_i64(req->args, "after", &after) == SBX_E_VALIDATION || after < 0 ||
        sbx_wire_get_i64(req->args, "maxBytes", &max) == SBX_E_VALIDATION || max <= 0 ||
        sbx_wire_get_i64(req->args, "waitMs", &wait) == SBX_E_VALIDATION || wait < 0) {
        agent_reply_err(a, req, SBX_E_VALIDATION,
                        "'after', 'maxBytes' and 'waitMs' must be non-negative integers");
        return;
    }
    char sid[72];
    sbx_str_copy(id, sid, sizeof(sid));
    struct stream *st = stream_find(a, sid);
    if (!st) {
        agent_reply_err(a, req, SBX_E_STREAM_NOT_FOUND, "no stream '%s' in this sandbox", sid);
        return;
    }
    if ((uint64_t)after >= st->next_seq) {
        agent_reply_err(a, req, SBX_E_VALIDATION,
                        "'after' (%lld) is beyond the last event of the stream (%llu)",
                        (long long)after, (unsigned long long)(st->next_seq - 1));
        return;
    }
    st->last_read_ms = sbx_mono_ms();
    ack(st, (uint64_t)after);
    struct sreader *r = sbx_xcalloc(1, sizeof(*r));
    r->st = st;
    r->req = req;
    r->after = (uint64_t)after;
    r->max = (size_t)SBX_MIN(max, (int64_t)READ_MAX_LIMIT);
    if (has_news(st, r->after) || st->done || wait == 0) {
        serve(r);
        return;
    }
    if (st->lossless) {
        /* One reader at a time: a newer read supersedes an older one. */
        while (st->readers) {
            struct sreader *old = st->readers;
            st->readers = old->next;
            old->next = NULL;
            serve(old);
        }
    }
    /* The long poll ends before the request's deadline: an empty answer
     * (the heartbeat) rather than none. */
    wait = SBX_MIN(wait, (int64_t)WAIT_LIMIT_MS);
    if (req->deadline_ms)
        wait = SBX_MAX(SBX_MIN(wait, req->deadline_ms - sbx_mono_ms()), (int64_t)0);
    r->timer = sbx_loop_timer(a->loop, wait, reader_timeout, r);
    r->next = st->readers;
    st->readers = r;
}

void
agent_op_stream_cancel(struct agent *a, struct agent_req *req)
{
    sbx_str id;
    char sid[72];
    if (sbx_wire_get_str(req->args, "streamId", &id) != 0 || sbx_str_copy(id, sid, sizeof(sid))) {
        agent_reply_err(a, req, SBX_E_VALIDATION, "'streamId' is required");
        return;
    }
    struct stream *st = stream_find(a, sid);
    if (!st) {
        agent_reply_err(a, req, SBX_E_STREAM_NOT_FOUND, "no stream '%s' in this sandbox", sid);
        return;
    }
    bool was_done = st->done;
    if (!st->done && st->ops && st->ops->cancel)
        st->ops->cancel(st, st->arg);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "streamId", sid);
    sbx_enc_kbool(&e, "cancelled", !was_done);
    agent_reply_ok(a, req, &e);
}

void
agent_streams_gc(struct agent *a)
{
    int64_t now = sbx_mono_ms();
    struct stream *st = a->streams.list;
    while (st) {
        struct stream *n = st->next;
        bool consumed = st->lossless ? st->acked + 1 >= st->next_seq : false;
        if (st->refs <= 0 && !st->readers &&
            (consumed || now - st->last_read_ms > IDLE_DROP_MS))
            stream_destroy(st);
        st = n;
    }
}

void
agent_streams_free(struct agent *a)
{
    while (a->streams.list) {
        struct stream *st = a->streams.list;
        while (st->readers) {
            struct sreader *r = st->readers;
            st->readers = r->next;
            sbx_loop_cancel(a->loop, r->timer);
            agent_req_free(r->req);
            free(r);
        }
        stream_destroy(st);
    }
}
