/*
 * terminal.c — a session's terminal over WebSocket (RFC 6455):
 *
 *   GET /v1/sandboxes/{sandbox}/terminal?session=S&cols=80&rows=24&shell=bash
 *
 * The protocol is the Cloudflare SDK's PTY socket (cloudflare-sandbox-sdk.md
 * §2.4): on open the server sends what the terminal printed lately (its last
 * 256 KiB, binary frames) then the text frame {"type":"ready"}; terminal
 * output goes out as binary frames; the client's binary frames are
 * keystrokes; its text frames are JSON control messages
 * {"type":"resize","cols":N,"rows":N}; the server reports
 * {"type":"exit","code":N} and {"type":"error","message":…} as text frames.
 * A request that is not a WebSocket upgrade gets 426.  Several viewers may
 * share one terminal: each reads the terminal's output stream (pty:<session>,
 * a ring in the agent) with its own cursor.
 *
 * Framing is wslay's (Debian libwslay); the handshake's SHA-1 is nettle's.
 * Per connection: the thread that owns the socket and the wslay context, and
 * a reader thread long-polling the output stream into a queue it signals
 * through an eventfd.
 *
 * Back-pressure: a viewer that reads slowly (or not at all) must not grow
 * the gateway.  The reader thread stops polling while QUEUE_CAP bytes wait
 * in its queue, and the WebSocket thread hands frames to wslay only while
 * less than WSLAY_CAP bytes are queued there; so a connection holds at most
 * about QUEUE_CAP + WSLAY_CAP + one read (1 MiB) of output.  What the
 * terminal prints meanwhile stays in the agent's ring (bounded); a viewer
 * that falls further behind than the ring skips what was overwritten, as a
 * terminal reconnecting after the replay window would.
 */
#include <errno.h>
#include <jansson.h>
#include <linux/sockios.h>
#include <nettle/sha1.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>
#include <wslay/wslay.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/json.h"
#include "../runtime/log.h"
#include "http_int.h"
#include "terminal_int.h"

#define WS_GUID "258EAFA5-E914-47DA-95CA-C5AB0DC85B11" /* RFC 6455 §1.3 */
#define POLL_WAIT_MS 5000
#define MAX_IN_MSG (1 << 20)
#define QUEUE_CAP (1u << 20)   /* bytes waiting for the WebSocket thread */
#define WSLAY_CAP (1u << 20)   /* bytes queued in wslay, not yet on the socket */

static void
ts_unref(struct terminal_state *t)
{
    pthread_mutex_lock(&t->mu);
    bool last = --t->refs == 0;
    pthread_mutex_unlock(&t->mu);
    if (!last)
        return;
    struct sbx_http *h = t->h;
    pthread_mutex_lock(&h->mu);
    for (struct terminal_state **pp = &h->terminals; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    pthread_mutex_unlock(&h->mu);
    while (t->q_head) {
        struct terminal_outmsg *m = t->q_head;
        t->q_head = m->next;
        free(m);
    }
    if (t->evfd >= 0)
        close(t->evfd);
    pthread_mutex_destroy(&t->mu);
    pthread_cond_destroy(&t->cv);
    free(t);
}

static void
wake_conn(struct terminal_state *t)
{
    if (t->suspended && !t->cancelled) {
        t->suspended = false;
        MHD_resume_connection(t->c);
    }
}

/* Under t->mu: queue a frame for the WebSocket thread. */
static void
push(struct terminal_state *t, uint8_t opcode, const char *p, size_t n)
{
    struct terminal_outmsg *m = sbx_xmalloc(sizeof(*m) + n);
    m->next = NULL;
    m->opcode = opcode;
    m->len = n;
    memcpy(m->data, p, n);
    t->q_bytes += n;
    if (t->q_tail)
        t->q_tail->next = m;
    else
        t->q_head = m;
    t->q_tail = m;
    uint64_t one = 1;
    ssize_t w = write(t->evfd, &one, sizeof(one));
    (void)w;
}

/* {"type":"error","code":…,"message":…} for an error from a call: code and
 * msg are copied from a reply (anything; cut to their buffers, perhaps
 * inside a UTF-8 sequence), and json_pack refuses what is not UTF-8. */
static json_t *
error_json(const char *code, const char *msg)
{
    size_t cl, ml;
    char *c = sbx_utf8_sanitize(code, strlen(code), &cl);
    char *m = sbx_utf8_sanitize(msg, strlen(msg), &ml);
    json_t *j = json_pack("{s:s,s:s%,s:s%}", "type", "error", "code", c, cl, "message", m, ml);
    free(c);
    free(m);
    return j;
}

static void
push_json(struct terminal_state *t, json_t *j)
{
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!s)
        return;
    pthread_mutex_lock(&t->mu);
    push(t, WSLAY_TEXT_FRAME, s, strlen(s));
    pthread_mutex_unlock(&t->mu);
    free(s);
}

/* ------------------------------------------------------------------------------ */
/* Calls to the sandbox. */

static int
call(struct terminal_state *t, const char *op, sbx_enc *e, int64_t timeout, struct hreply *rep,
     char code[64], char *msg, size_t msglen)
{
    char *args;
    size_t alen;
    sbx_enc_end(e);
    if (sbx_enc_finish(e, &args, &alen) != 0) {
        snprintf(code, 64, "INTERNAL_ERROR");
        snprintf(msg, msglen, "cannot encode the request");
        return SBX_E_INTERNAL;
    }
    int rc = http_call_sync(t->h, t->key, op, t->sandbox, args, alen, timeout, rep, code, msg, msglen);
    free(args);
    return rc;
}

/* The reader thread: the terminal's output stream, into the queue. */
static void *
reader_main(void *arg)
{
    struct terminal_state *t = arg;
    uint64_t after = 0;
    bool ready_sent = false;
    for (;;) {
        /* Back-pressure: no new read while the viewer has not taken what
         * is queued (the WebSocket thread signals cv as it drains). */
        pthread_mutex_lock(&t->mu);
        while (t->q_bytes >= QUEUE_CAP && !t->stop)
            pthread_cond_wait(&t->cv, &t->mu);
        bool stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (stop)
            break;
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "streamId", t->stream_id);
        sbx_enc_kint(&e, "after", (int64_t)after);
        sbx_enc_kint(&e, "waitMs", ready_sent ? POLL_WAIT_MS : 0);
        sbx_enc_kint(&e, "maxBytes", 1 << 20);
        struct hreply rep;
        char code[64], msg[256];
        int rc = call(t, "stream.read", &e, POLL_WAIT_MS + 10000, &rep, code, msg, sizeof(msg));
        if (rc) {
            push_json(t, error_json(code, msg));
            break;
        }
        const msgpack_object *evs = NULL;
        bool done = false;
        int64_t next = 0;
        sbx_wire_get_bool(rep.result, "done", &done);
        sbx_wire_get_i64(rep.result, "next", &next);
        if (sbx_wire_get_array(rep.result, "events", &evs) == 0) {
            for (uint32_t i = 0; i < evs->via.array.size; i++) {
                const msgpack_object *ev = &evs->via.array.ptr[i];
                sbx_str type = SBX_STR(""), data;
                sbx_wire_get_str(ev, "type", &type);
                if (sbx_str_eq(type, "output") && sbx_wire_get_bin(ev, "data", &data) == 0) {
                    pthread_mutex_lock(&t->mu);
                    push(t, WSLAY_BINARY_FRAME, data.p, data.n);
                    pthread_mutex_unlock(&t->mu);
                } else if (sbx_str_eq(type, "exit")) {
                    int64_t codev = 0, sig = 0;
                    sbx_wire_get_i64(ev, "code", &codev);
                    json_t *j = json_pack("{s:s,s:I}", "type", "exit", "code", (json_int_t)codev);
                    if (sbx_wire_get_i64(ev, "signal", &sig) == 0 && sig > 0)
                        json_object_set_new(j, "signal", json_integer(sig));
                    push_json(t, j);
                }
            }
        }
        hreply_free(&rep);
        if (next > 0 && (uint64_t)next > after)
            after = (uint64_t)next;
        if (!ready_sent) {
            push_json(t, json_pack("{s:s}", "type", "ready"));
            ready_sent = true;
        }
        if (done)
            break;
    }
    pthread_mutex_lock(&t->mu);
    t->reader_done = true;
    uint64_t one = 1;
    ssize_t w = write(t->evfd, &one, sizeof(one));
    (void)w;
    pthread_mutex_unlock(&t->mu);
    struct sbx_http *h = t->h; /* t may be freed by the unref */
    ts_unref(t);
    http_worker_leave(h);
    return NULL;
}

/* ------------------------------------------------------------------------------ */
/* wslay callbacks (the WebSocket thread). */

static ssize_t
ws_recv(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *ud)
{
    struct terminal_state *t = ud;
    (void)flags;
    ssize_t r = recv(t->sock, buf, len, MSG_DONTWAIT);
    if (r > 0)
        t->rx_ms = sbx_mono_ms();
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    if (r <= 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    return r;
}

static ssize_t
ws_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *ud)
{
    struct terminal_state *t = ud;
    (void)flags;
    ssize_t w = send(t->sock, data, len, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
        return -1;
    }
    if (w < 0) {
        wslay_event_set_error(ctx, WSLAY_ERR_CALLBACK_FAILURE);
        return -1;
    }
    return w;
}

static void
ws_error(struct terminal_state *t, wslay_event_context_ptr ctx, const char *code, const char *msg)
{
    json_t *j = error_json(code, msg);
    char *s = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    struct wslay_event_msg m = {WSLAY_TEXT_FRAME, (const uint8_t *)s, strlen(s)};
    wslay_event_queue_msg(ctx, &m);
    free(s);
}

void
terminal_ws_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                void *ud)
{
    struct terminal_state *t = ud;
    if (arg->opcode == WSLAY_BINARY_FRAME) {
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "sessionId", t->session);
        sbx_enc_kbin(&e, "data", arg->msg, arg->msg_length);
        struct hreply rep;
        char code[64], msg[256];
        if (call(t, "terminal.write", &e, 10000, &rep, code, msg, sizeof(msg)) == 0)
            hreply_free(&rep);
        else
            ws_error(t, ctx, code, msg);
        return;
    }
    if (arg->opcode != WSLAY_TEXT_FRAME)
        return;
    json_error_t je;
    json_t *j = json_loadb((const char *)arg->msg, arg->msg_length, 0, &je);
    const char *type = json_string_value(json_object_get(j, "type"));
    if (type && !strcmp(type, "resize")) {
        json_int_t cols = json_integer_value(json_object_get(j, "cols"));
        json_int_t rows = json_integer_value(json_object_get(j, "rows"));
        if (cols <= 0 || rows <= 0 || cols > 1000 || rows > 1000) {
            ws_error(t, ctx, "VALIDATION_FAILED", "resize needs cols and rows of 1-1000");
        } else {
            sbx_enc e;
            sbx_enc_init(&e);
            sbx_enc_map(&e);
            sbx_enc_kstr(&e, "sessionId", t->session);
            sbx_enc_kint(&e, "cols", cols);
            sbx_enc_kint(&e, "rows", rows);
            struct hreply rep;
            char code[64], msg[256];
            if (call(t, "terminal.resize", &e, 10000, &rep, code, msg, sizeof(msg)) == 0)
                hreply_free(&rep);
            else
                ws_error(t, ctx, code, msg);
        }
    } else {
        ws_error(t, ctx, "VALIDATION_FAILED",
                 "text frames are JSON control messages: {\"type\":\"resize\",\"cols\":N,\"rows\":N}");
    }
    json_decref(j);
}

static void
ws_loop(struct terminal_state *t)
{
    struct wslay_event_callbacks cb = {ws_recv, ws_send, NULL, NULL, NULL, NULL, terminal_ws_msg};
    wslay_event_context_ptr ctx;
    if (wslay_event_context_server_init(&ctx, &cb, t) != 0)
        return;
    wslay_event_config_set_max_recv_msg_length(ctx, MAX_IN_MSG);
    bool reader_done = false, closing = false, close_queued = false;
    /* Keep-alive: a client silent for `ping` ms is pinged, once per `ping`
     * ms; silent for 3 × ping, it is gone (a closed laptop, a dropped NAT
     * entry: nothing tells TCP while nothing is sent) and the terminal ends,
     * freeing its thread and its stream — its reads count as the sandbox's
     * activity and would keep it from ever sleeping. */
    int64_t ping = t->h->conf.ws_ping > 0 ? t->h->conf.ws_ping : 30000, pinged = 0;
    t->rx_ms = sbx_mono_ms();
    int unacked = 0; /* bytes sent, not yet acknowledged by the client's TCP, at the last look */
    while (wslay_event_want_read(ctx) || wslay_event_want_write(ctx)) {
        int64_t now = sbx_mono_ms();
        /* Fewer unacknowledged bytes than last time (SIOCOUTQ, tcp(7)): the
         * client's end took some (a viewer reading a flood slowly answers a
         * ping late, behind megabytes of output, but acknowledges all along). */
        int q;
        if (ioctl(t->sock, SIOCOUTQ, &q) == 0) {
            if (q < unacked)
                t->rx_ms = now;
            unacked = q;
        }
        if (now - t->rx_ms >= 3 * ping) {
            sbx_log_info("terminal of %s: nothing from the client for %lld ms; closing",
                         t->sandbox, (long long)(now - t->rx_ms));
            break;
        }
        if (now - t->rx_ms >= ping && now - pinged >= ping && !closing) {
            struct wslay_event_msg pm = {WSLAY_PING, NULL, 0};
            wslay_event_queue_msg(ctx, &pm);
            pinged = now;
        }
        /* Until the next ping (none once closing), at most until it is gone. */
        int64_t wait = 3 * ping - (now - t->rx_ms);
        if (!closing)
            wait = SBX_MIN(wait, ping - (now - SBX_MAX(t->rx_ms, pinged)));
        struct pollfd p[2] = {{t->sock, POLLIN, 0}, {t->evfd, POLLIN, 0}};
        if (wslay_event_want_write(ctx))
            p[0].events |= POLLOUT;
        /* Frames left in our queue that wslay has room for now: do not
         * sleep (the reader is held by back-pressure and will not signal). */
        pthread_mutex_lock(&t->mu);
        bool more = t->q_head && wslay_event_get_queued_msg_length(ctx) < WSLAY_CAP;
        pthread_mutex_unlock(&t->mu);
        if (poll(p, 2, more ? 0 : (int)SBX_MAX(wait, (int64_t)1)) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (p[1].revents) {
            uint64_t v;
            ssize_t r = read(t->evfd, &v, sizeof(v));
            (void)r;
        }
        /* Hand queued frames to wslay while it holds less than WSLAY_CAP;
         * the rest waits for the socket to drain (POLLOUT above). */
        pthread_mutex_lock(&t->mu);
        bool drained = false;
        while (t->q_head && wslay_event_get_queued_msg_length(ctx) < WSLAY_CAP) {
            struct terminal_outmsg *m = t->q_head;
            t->q_head = m->next;
            t->q_bytes -= m->len;
            struct wslay_event_msg wm = {m->opcode, (const uint8_t *)m->data, m->len};
            wslay_event_queue_msg(ctx, &wm);
            free(m);
            drained = true;
        }
        if (!t->q_head)
            t->q_tail = NULL;
        if (drained)
            pthread_cond_broadcast(&t->cv);
        /* Close once the reader is done and all it queued has gone to wslay. */
        reader_done = t->reader_done && !t->q_head;
        bool stop = t->stop;
        pthread_mutex_unlock(&t->mu);
        if (reader_done || stop)
            closing = true;
        if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) && wslay_event_recv(ctx) != 0)
            break;
        if (wslay_event_want_write(ctx) && wslay_event_send(ctx) != 0)
            break;
        /* wslay sends control frames ahead of queued messages: close only
         * once everything before it (the exit status) is out. */
        if (closing && !close_queued && wslay_event_get_queued_msg_count(ctx) == 0) {
            wslay_event_queue_close(ctx, WSLAY_CODE_NORMAL_CLOSURE, NULL, 0);
            close_queued = true;
            if (wslay_event_send(ctx) != 0)
                break;
        }
    }
    wslay_event_context_free(ctx);
}

/* The opener, then the WebSocket thread. */
static void *
main_thread(void *arg)
{
    struct terminal_state *t = arg;
    struct sbx_http *h = t->h;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "sessionId", t->session);
    sbx_enc_kint(&e, "cols", t->cols);
    sbx_enc_kint(&e, "rows", t->rows);
    if (t->shell[0])
        sbx_enc_kstr(&e, "shell", t->shell);
    struct hreply rep;
    char code[64], msg[256];
    int rc = call(t, "terminal.open", &e, 60000, &rep, code, msg, sizeof(msg));
    pthread_mutex_lock(&t->mu);
    if (rc) {
        t->err_status = sbx_err_http(rc);
        snprintf(t->err_code, sizeof(t->err_code), "%s", code);
        snprintf(t->err_msg, sizeof(t->err_msg), "%s", msg);
    } else {
        sbx_str sid = SBX_STR("");
        sbx_wire_get_str(rep.result, "streamId", &sid);
        snprintf(t->stream_id, sizeof(t->stream_id), "%.*s", (int)sid.n, sid.p);
        hreply_free(&rep);
        t->opened = true;
    }
    wake_conn(t);
    while (t->opened && !t->upgraded && !t->cancelled)
        pthread_cond_wait(&t->cv, &t->mu);
    bool go = t->upgraded;
    pthread_mutex_unlock(&t->mu);
    if (go) {
        pthread_t rt;
        pthread_mutex_lock(&t->mu);
        t->refs++;
        pthread_mutex_unlock(&t->mu);
        http_worker_enter(h);
        if (pthread_create(&rt, NULL, reader_main, t) == 0) {
            pthread_detach(rt);
            ws_loop(t);
        } else {
            ts_unref(t);
            http_worker_leave(h);
        }
        pthread_mutex_lock(&t->mu);
        t->stop = true;
        pthread_cond_broadcast(&t->cv); /* a reader held by back-pressure */
        pthread_mutex_unlock(&t->mu);
        MHD_upgrade_action(t->urh, MHD_UPGRADE_ACTION_CLOSE);
    }
    ts_unref(t);
    http_worker_leave(h);
    return NULL;
}

/* ------------------------------------------------------------------------------ */
/* MHD's side. */

static void
upgraded_cb(void *cls, struct MHD_Connection *c, void *con_cls, const char *extra_in,
            size_t extra_in_size, MHD_socket sock, struct MHD_UpgradeResponseHandle *urh)
{
    struct terminal_state *t = cls;
    (void)c;
    (void)con_cls;
    (void)extra_in;
    (void)extra_in_size; /* a client may not send frames before the 101 (RFC 6455 §4.1) */
    pthread_mutex_lock(&t->mu);
    t->sock = sock;
    t->urh = urh;
    t->upgraded = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
}

static enum MHD_Result
queue_upgrade(struct terminal_state *t)
{
    t->queued = true;
    if (t->err_status)
        return http_queue_error(t->c, t->err_status, t->err_code, t->err_msg);
    struct MHD_Response *r = MHD_create_response_for_upgrade(upgraded_cb, t);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, "Upgrade", "websocket");
    MHD_add_response_header(r, "Sec-WebSocket-Accept", t->accept);
    enum MHD_Result ret = MHD_queue_response(t->c, MHD_HTTP_SWITCHING_PROTOCOLS, r);
    MHD_destroy_response(r);
    return ret;
}

/* A percent-decoded query argument into out[outlen]; false if it is
 * malformed or does not fit. */
static bool
text_arg(const char *v, char *out, size_t outlen)
{
    char *d = sbx_xstrdup(v);
    bool ok = http_pct_decode(d, true) && strlen(d) < outlen;
    if (ok)
        memcpy(out, d, strlen(d) + 1);
    free(d);
    return ok;
}

/* A terminal dimension: decimal 1-1000 (the agent's range), dflt when
 * absent, -1 when malformed. */
static int
dim_arg(const char *v, int dflt)
{
    if (!v)
        return dflt;
    char *e;
    errno = 0;
    long n = strtol(v, &e, 10);
    return *v >= '0' && *v <= '9' && !*e && !errno && n >= 1 && n <= 1000 ? (int)n : -1;
}

/*
 * terminal_args — the query arguments as sent (the front's unescaper is the
 * identity; NULL: absent) into t: session ("default"), shell (""), cols
 * (80) and rows (24).  0, or -1 with why[whylen] naming the argument: a
 * session or shell that does not decode or fit is refused, not cut (a cut
 * name is another session, a cut path another program).
 */
int
terminal_args(struct terminal_state *t, const char *session, const char *shell,
              const char *cols, const char *rows, char *why, size_t whylen)
{
    if (!text_arg(session ? session : "default", t->session, sizeof(t->session)) ||
        !t->session[0]) {
        snprintf(why, whylen, "'session' must be 1-%zu bytes, percent-encoded",
                 sizeof(t->session) - 1);
        return -1;
    }
    if (!text_arg(shell ? shell : "", t->shell, sizeof(t->shell))) {
        snprintf(why, whylen, "'shell' must be at most %zu bytes, percent-encoded",
                 sizeof(t->shell) - 1);
        return -1;
    }
    t->cols = dim_arg(cols, 80);
    t->rows = dim_arg(rows, 24);
    if (t->cols < 0 || t->rows < 0) {
        snprintf(why, whylen, "'cols' and 'rows' must be integers of 1-1000");
        return -1;
    }
    return 0;
}

enum MHD_Result
terminal_access(struct sbx_http *h, struct MHD_Connection *c, const char *sandbox, void **con_cls)
{
    if (*con_cls) {
        struct terminal_state *t = *con_cls;
        enum MHD_Result ret = MHD_YES;
        pthread_mutex_lock(&t->mu);
        if (!t->queued && (t->opened || t->err_status))
            ret = queue_upgrade(t);
        else if (!t->queued) {
            t->suspended = true;
            MHD_suspend_connection(c);
        }
        pthread_mutex_unlock(&t->mu);
        return ret;
    }
    const char *up = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Upgrade");
    const char *conn = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Connection");
    const char *key = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-WebSocket-Key");
    const char *ver = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Sec-WebSocket-Version");
    if (!up || !strcasestr(up, "websocket") || !conn || !strcasestr(conn, "upgrade") || !key) {
        struct MHD_Response *r = MHD_create_response_from_buffer(
            strlen("terminal() requires a WebSocket upgrade request\n"),
            "terminal() requires a WebSocket upgrade request\n", MHD_RESPMEM_PERSISTENT);
        MHD_add_response_header(r, "Upgrade", "websocket");
        MHD_add_response_header(r, "Content-Type", "text/plain");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_UPGRADE_REQUIRED, r);
        MHD_destroy_response(r);
        return ret;
    }
    if (!ver || strcmp(ver, "13"))
        return http_queue_error(c, 400, "VALIDATION_FAILED", "Sec-WebSocket-Version must be 13");
    const char *session = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "session");
    if (!session)
        session = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "sessionId");
    struct terminal_state *t = sbx_xcalloc(1, sizeof(*t));
    char why[160];
    if (terminal_args(t, session, MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "shell"),
                      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "cols"),
                      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "rows"), why,
                      sizeof(why)) != 0) {
        free(t);
        return http_queue_error(c, 400, "VALIDATION_FAILED", why);
    }
    t->kind = HS_TERMINAL;
    t->h = h;
    t->c = c;
    t->refs = 2;
    t->sock = -1;
    t->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    pthread_mutex_init(&t->mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    snprintf(t->sandbox, sizeof(t->sandbox), "%s", sandbox);
    if (h->keys)
        http_request_key(h, c, R_TERMINAL, sandbox, t->key); /* http.c checked there is one */
    /* Sec-WebSocket-Accept = base64(SHA-1(key + GUID)) (RFC 6455 §4.2.2). */
    struct sha1_ctx sc;
    uint8_t dig[SHA1_DIGEST_SIZE];
    sha1_init(&sc);
    sha1_update(&sc, strlen(key), (const uint8_t *)key);
    sha1_update(&sc, strlen(WS_GUID), (const uint8_t *)WS_GUID);
    sha1_digest(&sc, sizeof(dig), dig);
    size_t bl;
    char *b64 = sbx_base64_encode(dig, sizeof(dig), &bl);
    snprintf(t->accept, sizeof(t->accept), "%s", b64);
    free(b64);
    *con_cls = t;
    pthread_mutex_lock(&h->mu);
    t->next = h->terminals;
    h->terminals = t;
    pthread_mutex_unlock(&h->mu);
    http_worker_enter(h);
    pthread_t th;
    if (t->evfd < 0 || pthread_create(&th, NULL, main_thread, t) != 0) {
        t->refs--;
        http_worker_leave(h);
        return http_queue_error(c, 503, "RESOURCE_BUSY", "cannot serve another terminal now");
    }
    pthread_detach(th);
    return MHD_YES;
}

void
terminal_completed(void *state)
{
    struct terminal_state *t = state;
    pthread_mutex_lock(&t->mu);
    t->cancelled = true;
    t->suspended = false;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    ts_unref(t);
}

void
terminal_cancel_all(struct sbx_http *h)
{
    pthread_mutex_lock(&h->mu);
    for (struct terminal_state *t = h->terminals; t; t = t->next) {
        pthread_mutex_lock(&t->mu);
        if (t->suspended) {
            t->suspended = false;
            MHD_resume_connection(t->c);
        }
        t->cancelled = true;
        t->stop = true;
        pthread_cond_broadcast(&t->cv);
        uint64_t one = 1;
        ssize_t w = write(t->evfd, &one, sizeof(one));
        (void)w;
        if (t->sock >= 0)
            shutdown(t->sock, SHUT_RDWR);
        pthread_mutex_unlock(&t->mu);
    }
    pthread_mutex_unlock(&h->mu);
}
