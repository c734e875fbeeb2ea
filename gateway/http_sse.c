/*
 * http_sse.c — a stream as Server-Sent Events (WHATWG HTML §9.2).
 *
 * The response's content reader (sse_reader, on MHD's thread) hands out
 * hr->out; when it is empty it starts the next stream.read long poll
 * (http_call_start suspends the connection; the nng completion resumes it)
 * and the next call of the reader turns the finished read into SSE blocks.
 * Output bytes become JSON strings, a UTF-8 sequence split between events
 * carried whole to the next (hr->carry), or base64 with X-Sbx-Binary.  All
 * state lives in the request (struct hreq), which the access handler owns.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/json.h"
#include "http_int.h"

#define SSE_WAIT_MS 15000           /* long-poll length = heartbeat period */
#define SSE_READ_BYTES (1 << 20)

/* ------------------------------------------------------------------------------ */
/* Server-Sent Events (WHATWG HTML §9.2). */


/* Whether an event's type can be its SSE event name: a field value ends at
 * CR or LF (WHATWG HTML §9.2.6), so anything else could add lines (an `id:`
 * that moves the client's Last-Event-ID, whole events). */
static bool
sse_name_ok(sbx_str t)
{
    if (t.n == 0 || t.n > 64)
        return false;
    for (size_t i = 0; i < t.n; i++) {
        char c = t.p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '.' || c == '-'))
            return false;
    }
    return true;
}

static void
sse_event(struct hreq *hr, const msgpack_object *ev)
{
    if (ev->type != MSGPACK_OBJECT_MAP)
        return; /* an event is a map (clients read its data as an object) */
    json_t *j = sbx_json_from_msgpack(ev);
    if (!j)
        return;
    int64_t seq = 0;
    sbx_wire_get_i64(ev, "seq", &seq);
    sbx_str type = SBX_STR("message"), data;
    sbx_wire_get_str(ev, "type", &type);
    if (!sse_name_ok(type))
        type = SBX_STR("message"); /* the data's JSON still has it */
    int which = sbx_str_eq(type, "stdout") || sbx_str_eq(type, "output") ? 0
                : sbx_str_eq(type, "stderr")                            ? 1
                                                                        : -1;
    if (which >= 0 && hr->b64 && sbx_wire_get_bin(ev, "data", &data) == 0) {
        size_t l;
        char *enc = sbx_base64_encode(data.p, data.n, &l);
        json_object_set_new(j, "data", json_stringn(enc, l));
        json_object_set_new(j, "encoding", json_string("base64"));
        free(enc);
    } else if (which >= 0 && sbx_wire_get_bin(ev, "data", &data) == 0) {
        /* Output bytes become a JSON string: keep a UTF-8 sequence that an
         * event boundary split whole for the next event. */
        sbx_buf b;
        sbx_buf_init(&b);
        sbx_buf_append(&b, hr->carry[which], hr->ncarry[which]);
        sbx_buf_append(&b, data.p, data.n);
        size_t keep = sbx_utf8_complete_prefix(b.p, b.len);
        hr->ncarry[which] = b.len - keep;
        memcpy(hr->carry[which], b.p + keep, hr->ncarry[which]);
        size_t sl;
        char *s = sbx_utf8_sanitize(b.p, keep, &sl);
        json_object_set_new(j, "data", json_stringn(s, sl));
        free(s);
        sbx_buf_free(&b);
    }
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!text)
        return;
    sbx_buf_appendf(&hr->out, "id: %lld\nevent: %.*s\ndata: %s\n\n", (long long)seq,
                    (int)type.n, type.p, text);
    free(text);
    if (seq > 0)
        hr->after = (uint64_t)seq;
}

/* Append a stream.read result to the SSE buffer. */
void
http_sse_result(struct hreq *hr, const msgpack_object *res)
{
    const msgpack_object *evs = NULL;
    bool done = false;
    int64_t missed = 0;
    sbx_wire_get_bool(res, "done", &done);
    if (sbx_wire_get_i64(res, "missed", &missed) == 0 && missed > 0)
        sbx_buf_appendf(&hr->out, "event: gap\ndata: {\"type\":\"gap\",\"missed\":%lld}\n\n",
                        (long long)missed);
    if (sbx_wire_get_array(res, "events", &evs) == 0)
        for (uint32_t i = 0; i < evs->via.array.size; i++)
            sse_event(hr, &evs->via.array.ptr[i]);
    if ((!evs || evs->via.array.size == 0) && !done)
        sbx_buf_append(&hr->out, ": ping\n\n", 8);
    int64_t next = 0;
    if (sbx_wire_get_i64(res, "next", &next) == 0 && next > 0 && (uint64_t)next > hr->after)
        hr->after = (uint64_t)next;
    if (done)
        hr->done = true;
}

static void
sse_error(struct hreq *hr, const char *code, const char *msg)
{
    json_t *j = json_pack("{s:s,s:{s:s,s:s}}", "type", "error", "error", "code", code, "message",
                          msg);
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    sbx_buf_appendf(&hr->out, "event: error\ndata: %s\n\n", text ? text : "{}");
    free(text);
    hr->done = true;
}

int
http_sse_read_start(struct hreq *hr)
{
    sbx_enc e;
    char *args;
    size_t alen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "streamId", hr->stream_id);
    sbx_enc_kint(&e, "after", (int64_t)hr->after);
    sbx_enc_kint(&e, "waitMs", SSE_WAIT_MS);
    sbx_enc_kint(&e, "maxBytes", SSE_READ_BYTES);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &args, &alen) != 0)
        return SBX_E_INTERNAL;
    /* Reads are retried with the same `after` by design; a fresh id each. */
    int rc = http_call_start(hr, "stream.read", args, alen, SSE_WAIT_MS + 10000, NULL);
    free(args);
    return rc;
}

/* Consume the finished stream.read into the buffer (or an error event). */
static void
read_take(struct hreq *hr)
{
    sbx_msg m;
    const msgpack_object *res;
    char code[64], msg[256];
    int rc = http_call_take(hr, &m, &res, code, msg, sizeof(msg));
    if (rc == CALL_ERROR_REPLY) {
        const msgpack_object *eo = NULL;
        sbx_str c = SBX_STR("INTERNAL_ERROR"), t = SBX_STR("");
        if (sbx_wire_get_map(m.root, "error", &eo) == 0) {
            sbx_wire_get_str(eo, "code", &c);
            sbx_wire_get_str(eo, "message", &t);
        }
        snprintf(code, sizeof(code), "%.*s", (int)c.n, c.p);
        snprintf(msg, sizeof(msg), "%.*s", (int)t.n, t.p);
        sbx_wire_msg_free(&m);
        sse_error(hr, code, msg);
        return;
    }
    if (rc) {
        sse_error(hr, code, msg);
        return;
    }
    http_sse_result(hr, res);
    sbx_wire_msg_free(&m);
}

static ssize_t
sse_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct hreq *hr = cls;
    (void)pos;
    if (hr->cstate == C_DONE)
        read_take(hr);
    if (hr->out_off < hr->out.len) {
        size_t n = SBX_MIN(max, hr->out.len - hr->out_off);
        memcpy(buf, hr->out.p + hr->out_off, n);
        hr->out_off += n;
        if (hr->out_off == hr->out.len) {
            hr->out.len = 0;
            hr->out_off = 0;
        }
        return (ssize_t)n;
    }
    if (hr->done || atomic_load(&hr->h->stopping))
        return MHD_CONTENT_READER_END_OF_STREAM;
    if (http_sse_read_start(hr) != 0)
        return MHD_CONTENT_READER_END_WITH_ERROR;
    return 0;
}

enum MHD_Result
http_sse_queue(struct hreq *hr)
{
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024, sse_reader, hr, NULL);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Content-Type", "text/event-stream; charset=utf-8");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    MHD_add_response_header(r, "X-Sbx-Stream-Id", hr->stream_id);
    http_add_common_headers(r, hr->h->keys != NULL);
    hr->phase = PH_STREAMING;
    enum MHD_Result ret = MHD_queue_response(hr->c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}
