/*
 * interp.c — code contexts: persistent Python, JavaScript and TypeScript
 * interpreters with rich outputs (the SDK's createCodeContext, runCode,
 * runCodeStream, listCodeContexts, deleteCodeContext).
 *
 * A context is one driver process (container/interp/driver.py or
 * driver.js) whose memory is the context's state.  The agent talks to it
 * over two pipes — requests on the driver's fd 3, events on its fd 4, JSON
 * lines in the Jupyter iopub vocabulary (stream, display_data,
 * execute_result, error, done) — and reads the driver's own fd 1/2, where
 * only fd-level output lands (subprocesses, C extensions).  Keeping the
 * protocol off stdout is what lets print() and os.system() both reach the
 * caller intact (interpreter-sessions-streaming.md §1.7).
 *
 * Runs on one context are queued and executed one at a time in arrival
 * order; contexts are separate processes, so they neither share state nor
 * wait for each other.  Output is forwarded as it is produced: runCodeStream
 * delivers events during the cell (the SDK buffers a whole cell), with
 * back-pressure (stream_blocks); runCode keeps what fits one reply frame
 * (RUN_LOG_CAP and the caps after it), so no cell can make the agent send
 * a frame the shard refuses, or hold more than that in memory.  A timeout
 * sends SIGINT (KeyboardInterrupt / breakOnSigint): the cell ends with an
 * error and the context keeps its state; if the driver does not finish the
 * cell within a grace period it is killed and the context reports that it
 * is dead and must be recreated.  Warm drivers are kept ready per kind
 * (Python forks of a fork server; Node processes), so creating a context
 * costs an `init` message, not a start (see POOL_SIZE).
 */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/json.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define INTERP_DIR "/opt/sbx"
#define READY_TIMEOUT_MS 30000
#define INTERRUPT_GRACE_MS 2000
#define EOF_GRACE_MS 500
#define REFILL_DELAY_MS 100
#define EVENT_LINE_MAX (64u << 20)

/*
 * What one non-streamed run keeps for its reply.  The reply is one frame,
 * and a frame over SBX_WIRE_MAX_FRAME (72 MiB) or over the reply limits of
 * sbx_wire_limits_reply (8 Mi objects, 24 levels) makes the shard replace
 * the container; the agent also holds the reply two or three times while it
 * encodes it, in the sandbox's own memory.  So: each log keeps its first
 * RUN_LOG_CAP bytes (or the shard's --output-cap if smaller) in at most
 * RUN_LOG_ENTRIES chunks (later chunks are appended to the last one);
 * results keep RUN_RESULTS_CAP encoded bytes and RUN_OBJECTS_CAP objects, of
 * which display outputs may use all but RUN_MAIN_RESERVE (the cell's value
 * comes last and should survive a flood of displays); a result that does
 * not fit is replaced by a stand-in with the start of its text, or dropped
 * when even that does not fit; the error keeps ERROR_VALUE_CAP bytes of its
 * value and ERROR_TB_CAP bytes of traceback.  Worst case about 51 MiB and
 * 4.2 Mi objects.  Flags in the reply say what was cut.
 */
#define RUN_LOG_CAP (16u << 20)
#define RUN_LOG_ENTRIES 65536u
#define RUN_RESULTS_CAP (16u << 20)
#define RUN_OBJECTS_CAP (4u << 20)
#define RUN_MAIN_RESERVE (1u << 20)
#define RUN_RESULTS_MAX 4096
#define STANDIN_TEXT (64u << 10)
#define ERROR_VALUE_CAP (1u << 20)
#define ERROR_TB_CAP (2u << 20)
#define ERROR_TB_LINES 1000u
/* A JSON value (application/json, chart) deeper or larger than this is
 * left out of its result: nested in a reply (and in a stream.read reply,
 * two levels deeper) it must stay within the 24 levels of the reply limits,
 * and one value must not use up the object budget. */
/* Unread bytes a runCodeStream holds before the cell is held back. */
#define STREAM_CAP (8u << 20)
#define JSON_MAX_DEPTH 16
#define JSON_MAX_VALUES (256u << 10)

enum { L_PY = 0, L_JS, L_TS, L_N };
static const char *const lang_names[L_N] = {"python", "javascript", "typescript"};

/*
 * Driver kinds: Python, and Node for JavaScript and TypeScript (a Node
 * driver learns its language from `init`).  Each kind keeps POOL_SIZE warm
 * drivers — started, ready, owned by no context — so that creating a
 * context is an `init` round trip; the pool is refilled as soon as a driver
 * is taken (and after a context's own driver started), never when a warm
 * driver dies (no restart loop).  Python drivers are forks of one fork
 * server per sandbox environment (driver.py --fork-server: IPython imported
 * once, forks share its memory copy-on-write): a fork is ready in
 * milliseconds where a start takes a quarter of a second, and costs a few
 * MiB of its own instead of ~40 MiB.  Node cannot fork, so its warm driver
 * costs a whole process (~45 MiB, ~55 with TypeScript's sucrase loaded):
 * one is kept.  Warm drivers hold the sandbox environment of their start;
 * when env.set changes it, they (and the fork server) are replaced.
 */
enum { K_PY = 0, K_NODE, K_N };
#define KIND(lang) ((lang) == L_PY ? K_PY : K_NODE)
static const int POOL_SIZE[K_N] = {2, 2};

struct run;
struct context;

/* One log of a non-streamed run: chunks kept back to back up to a cap. */
struct logacc {
    sbx_buf text;
    uint32_t *lens;          /* length of each chunk */
    size_t n, alloc;
    size_t cap;              /* bytes kept at most */
    uint64_t total;          /* bytes the cell wrote, kept or not */
    bool truncated;
};

struct driver {
    struct driver *next;
    struct agent *a;
    int kind;                /* K_PY, K_NODE */
    int lang;                /* the language it was started or warmed for */
    pid_t pid;               /* 0 for a fork until its `ready` says */
    int req_fd, ev_fd, out_fd, err_fd;
    int child[4];            /* its ends (requests, events, stdout, stderr) until it starts */
    bool pending;            /* waiting for the fork server */
    bool paused;             /* its pipes are not read: a streamed run's reader is behind */
    bool custom;             /* started with the context's own envVars: never pooled */
    uint64_t env_hash;       /* of the sandbox environment it started with */
    sbx_watch *w_req, *w_ev, *w_out, *w_err;
    sbx_buf evbuf, reqq;
    /* fd-level output is UTF-8 decoded across reads: the bytes of a
     * character a read cut in two wait here for the next read (0 = out). */
    char carry[2][4];
    size_t ncarry[2];
    bool ready, dead;
    char mode[16];
    struct context *ctx;     /* NULL while warm */
    int64_t spawned_ms;
    uint64_t ready_timer, eof_timer;
};

struct run {
    struct run *next;
    struct context *ctx;
    struct agent_req *req;   /* runCode: answered at the end; NULL when streamed */
    struct stream *stream;   /* runCodeStream */
    struct agent_req *init_req; /* context.create waiting for init */
    bool is_init;
    char rid[32];
    char *payload;           /* the JSON request line */
    int64_t timeout_ms;
    uint64_t timer, kill_timer;
    bool interrupted, sent;
    bool released;           /* streamed: timed out or cancelled, no more back-pressure */
    uint64_t dropped;        /* streamed: events dropped after the release (stream full) */
    int64_t start_us;
    /* accumulated for runCode (the caps are above) */
    sbx_enc results;
    int nresults;
    size_t res_objects;
    bool res_truncated;
    struct logacc logs[2];   /* stdout, stderr */
    bool has_error;
    sbx_enc error;
    int exec_count;
};

struct context {
    struct context *next;
    struct agent *a;
    char id[64];
    int lang;
    char cwd[1024];
    int64_t created_ms, last_ms;
    struct driver *drv;
    struct run *q_head, *q_tail, *cur;
    bool dead;
    char dead_why[200];
};

/* The Python fork server (see driver.py fork_server()). */
struct zygote {
    pid_t pid;
    int fd;                  /* our end of its SOCK_SEQPACKET control socket */
    sbx_watch *w;
    bool ready;
    uint64_t env_hash, ready_timer;
};

/* A deferred refill of one kind's pool (see pool_refill). */
struct refill {
    struct agent *a;
    int lang;
    uint64_t timer;
};

/* Per-agent interpreter state hangs off the agent. */
struct interp {
    struct driver *drivers;  /* every driver: warm ones have no ctx */
    struct context *contexts;
    struct refill refill[K_N];
    struct zygote *zyg;
    bool zyg_broken;         /* it failed before ready: start drivers directly */
    uint64_t ctr;
};

static struct interp *
IS(struct agent *a)
{
    if (!a->interp)
        a->interp = sbx_xcalloc(1, sizeof(struct interp));
    return a->interp;
}

static void run_next(struct context *c);
static void run_finish(struct context *c, const char *status);
static void driver_died(struct driver *d, const char *why);
static void ctx_destroy(struct context *c);
static void driver_kill(struct driver *d);
static void zygote_gone(struct agent *a, bool broken);

/* ------------------------------------------------------------------------------ */
/* Languages. */

static int
lang_of(sbx_str s)
{
    if (sbx_str_eq(s, "python") || sbx_str_eq(s, "python3") || sbx_str_eq(s, "py"))
        return L_PY;
    if (sbx_str_eq(s, "javascript") || sbx_str_eq(s, "js") || sbx_str_eq(s, "node"))
        return L_JS;
    if (sbx_str_eq(s, "typescript") || sbx_str_eq(s, "ts"))
        return L_TS;
    return -1;
}

/* ------------------------------------------------------------------------------ */
/* The driver's pipes. */

static void
req_pump(struct driver *d)
{
    size_t off = 0;
    while (off < d->reqq.len) {
        ssize_t w = write(d->req_fd, d->reqq.p + off, d->reqq.len - off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        off += (size_t)w;
    }
    sbx_buf_consume(&d->reqq, off);
    sbx_loop_modify(d->a->loop, d->w_req, d->reqq.len ? EPOLLOUT : 0);
}

static void
req_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    (void)l;
    (void)fd;
    (void)ev;
    req_pump(arg);
}

/* ------------------------------------------------------------------------------ */
/* Text of the cell's logs. */


static void
logacc_init(struct logacc *l, size_t cap)
{
    memset(l, 0, sizeof(*l));
    sbx_buf_init(&l->text);
    l->cap = cap;
}

static void
logacc_free(struct logacc *l)
{
    sbx_buf_free(&l->text);
    free(l->lens);
    l->lens = NULL;
    l->n = l->alloc = 0;
}

/* Keep what fits of one chunk (valid UTF-8); past RUN_LOG_ENTRIES chunks the
 * text joins the last chunk, so the entry count stays bounded. */
static void
logacc_add(struct logacc *l, const char *p, size_t n)
{
    l->total += n;
    if (n > l->cap - l->text.len) {
        l->truncated = true;
        n = sbx_utf8_complete_prefix(p, l->cap - l->text.len);
    }
    if (!n)
        return;
    sbx_buf_append(&l->text, p, n);
    if (l->n == RUN_LOG_ENTRIES) {
        l->lens[l->n - 1] += (uint32_t)n;
        return;
    }
    if (l->n == l->alloc) {
        l->alloc = l->alloc ? l->alloc * 2 : 64;
        l->lens = sbx_xrealloc(l->lens, l->alloc * sizeof(*l->lens));
    }
    l->lens[l->n++] = (uint32_t)n;
}

/* The chunks as an array of strings; the storage is freed as it goes (the
 * reply is being built: do not hold the text twice). */
static void
logacc_encode(sbx_enc *e, struct logacc *l)
{
    sbx_enc_array(e);
    size_t off = 0;
    for (size_t i = 0; i < l->n; i++) {
        sbx_enc_strn(e, l->text.p + off, l->lens[i]);
        off += l->lens[i];
    }
    sbx_enc_end(e);
    sbx_buf_free(&l->text);
}

/*
 * Back-pressure of a streamed run, as for exec streams: when its lossless
 * stream holds its cap of unread events, the driver's pipes are not read
 * (the cell blocks on its next write) until the reader catches up (resume).
 * A run that timed out or whose stream was cancelled is `released`: its
 * pipes are read again, so the interrupt lands and the context survives a
 * reader that went away, and its events past the cap are dropped (counted
 * in execution_complete's droppedEvents) — the agent's memory stays bounded
 * either way.
 */
static bool
stream_blocks(struct driver *d)
{
    struct run *r = d->ctx ? d->ctx->cur : NULL;
    if (!r || !r->stream || r->released || !stream_full(r->stream))
        return false;
    r->stream->paused = true;
    d->paused = true;
    sbx_watch *ws[] = {d->w_ev, d->w_out, d->w_err};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ws); i++)
        if (ws[i])
            sbx_loop_modify(d->a->loop, ws[i], 0);
    return true;
}

/* Read the driver's pipes again (a pipe at EOF turns itself off again). */
static void
driver_unpause(struct driver *d)
{
    if (!d || !d->paused)
        return;
    d->paused = false;
    sbx_watch *ws[] = {d->w_ev, d->w_out, d->w_err};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ws); i++)
        if (ws[i])
            sbx_loop_modify(d->a->loop, ws[i], EPOLLIN);
}

/* Whether a streamed run may add an event: not when it was released and
 * its stream is full (the event is counted as dropped). */
static bool
stream_room(struct run *r)
{
    if (r->released && stream_full(r->stream)) {
        r->dropped++;
        return false;
    }
    return true;
}

/* One piece of stdout or stderr text (valid UTF-8) for the running cell:
 * an event of the stream, or kept for the reply. */
static void
run_log(struct run *r, bool isout, const char *p, size_t n)
{
    if (!n)
        return;
    if (r->stream) {
        if (!stream_room(r))
            return;
        sbx_enc *e = stream_begin(r->stream, isout ? "stdout" : "stderr");
        sbx_enc_kstrn(e, "text", p, n);
        stream_commit(r->stream, false);
    } else {
        logacc_add(&r->logs[isout ? 0 : 1], p, n);
    }
}

/* fd-level bytes p[0..n) of one pipe, after what the last read left over:
 * the complete characters go to the cell (invalid bytes as U+FFFD), an
 * incomplete last one waits for the next read; with `flush` (the cell is
 * over) it goes too, as one U+FFFD (as a decoder reports a truncated
 * sequence). */
static void
fdout_text(struct driver *d, struct run *r, int which, const char *p, size_t n, bool flush)
{
    char buf[4 + 65536];
    size_t len = d->ncarry[which];
    memcpy(buf, d->carry[which], len);
    memcpy(buf + len, p, n);
    len += n;
    size_t keep = sbx_utf8_complete_prefix(buf, len);
    d->ncarry[which] = flush || !r ? 0 : len - keep; /* idle: output between cells is dropped */
    memcpy(d->carry[which], buf + keep, d->ncarry[which]);
    if (!r)
        return;
    size_t sl;
    char *s = sbx_utf8_sanitize(buf, keep, &sl);
    run_log(r, which == 0, s, sl);
    free(s);
    if (flush && keep < len)
        run_log(r, which == 0, "\xef\xbf\xbd", 3);
}

/* fd-level output of the driver (subprocesses, C extensions): logs of the
 * running cell, or dropped when idle. */
static void
fdout_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct driver *d = arg;
    char buf[65536];
    (void)ev;
    while (!stream_blocks(d)) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) {
            struct context *c = d->ctx;
            struct run *r = c && c->cur && !c->cur->is_init ? c->cur : NULL;
            fdout_text(d, r, fd == d->out_fd ? 0 : 1, buf, (size_t)n, false);
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n == 0 || (n < 0 && errno != EAGAIN)) {
            sbx_watch **w = fd == d->out_fd ? &d->w_out : &d->w_err;
            sbx_loop_modify(l, *w, 0);
        }
        return;
    }
}

/* At the end of a cell: what the pipes hold now belongs to it, and so does
 * an unfinished character. */
static void
drain_fdout(struct driver *d)
{
    if (d->out_fd >= 0)
        fdout_cb(d->a->loop, d->out_fd, EPOLLIN, d);
    if (d->err_fd >= 0)
        fdout_cb(d->a->loop, d->err_fd, EPOLLIN, d);
    struct context *c = d->ctx;
    struct run *r = c && c->cur && !c->cur->is_init ? c->cur : NULL;
    for (int i = 0; i < 2; i++)
        if (d->ncarry[i])
            fdout_text(d, r, i, "", 0, true);
}

/* ------------------------------------------------------------------------------ */
/* Results in the SDK's shape. */

static const struct {
    const char *mime, *field;
} mime_fields[] = {
    {"text/plain", "text"},        {"text/html", "html"},       {"image/png", "png"},
    {"image/jpeg", "jpeg"},        {"image/svg+xml", "svg"},    {"text/latex", "latex"},
    {"text/markdown", "markdown"}, {"application/javascript", "javascript"},
    {"application/json", "json"},
};

/* Whether a JSON value may go into a reply (JSON_MAX_DEPTH levels,
 * JSON_MAX_VALUES values); *count grows by its values. */
static bool
json_fits(const json_t *v, int depth, size_t *count)
{
    if (depth > JSON_MAX_DEPTH || ++*count > JSON_MAX_VALUES)
        return false;
    if (json_is_real(v) && !isfinite(json_real_value(v)))
        return false; /* msgpack has them, JSON clients do not */
    size_t i;
    const char *k;
    json_t *x;
    if (json_is_array(v)) {
        json_array_foreach(v, i, x)
            if (!json_fits(x, depth + 1, count))
                return false;
    } else if (json_is_object(v)) {
        json_object_foreach((json_t *)v, k, x) {
            ++*count; /* the key */
            if (!json_fits(x, depth + 1, count))
                return false;
        }
    }
    return true;
}

/* A JSON object's string member, or its {text} member's (Plotly and Vega
 * titles are either). */
static json_t *
title_of(json_t *v)
{
    if (json_is_object(v))
        v = json_object_get(v, "text");
    return json_is_string(v) ? v : NULL;
}

/*
 * The SDK's ChartData from a bundle's chart format, as the Cloudflare
 * container derives it: Plotly (application/vnd.plotly.v1+json) →
 * {type from the first trace, title, data: traces, layout, config, library:
 * "plotly"}; Vega-Lite (v4, v5) → {type from the mark, title, data: the
 * spec, library: "altair"}.  A new reference, or NULL.  (matplotlib figures
 * get theirs from the Python driver, which has the figure itself.)
 */
static json_t *
chart_from_bundle(json_t *data)
{
    json_t *chart = NULL, *v;
    const char *type = "unknown";
    if ((v = json_object_get(data, "application/vnd.plotly.v1+json")) && json_is_object(v)) {
        json_t *traces = json_object_get(v, "data"), *layout = json_object_get(v, "layout");
        json_t *t0 = json_array_get(traces, 0);
        if (json_is_object(t0)) {
            /* Plotly's defaults: a trace without type is a scatter, one
             * without mode draws lines. */
            const char *tt = json_string_value(json_object_get(t0, "type"));
            const char *mode = json_string_value(json_object_get(t0, "mode"));
            tt = tt ? tt : "scatter";
            if (!strcmp(tt, "scatter") || !strcmp(tt, "scattergl"))
                type = !mode || strstr(mode, "lines") ? "line" : "scatter";
            else if (!strcmp(tt, "bar") || !strcmp(tt, "pie") || !strcmp(tt, "histogram") ||
                     !strcmp(tt, "heatmap"))
                type = tt;
        }
        chart = json_pack("{s:s, s:o, s:o, s:s}", "type", type, "data",
                          traces ? json_incref(traces) : json_null(), "layout",
                          json_is_object(layout) ? json_incref(layout) : json_object(), "library",
                          "plotly");
        json_t *title = title_of(json_object_get(layout, "title"));
        if (chart && title)
            json_object_set(chart, "title", title);
        if (chart && (v = json_object_get(v, "config")))
            json_object_set(chart, "config", v);
        return chart;
    }
    static const char *const vl[] = {"application/vnd.vegalite.v5+json",
                                     "application/vnd.vegalite.v4+json"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(vl) && !chart; i++) {
        if (!(v = json_object_get(data, vl[i])) || !json_is_object(v))
            continue;
        json_t *mark = json_object_get(v, "mark");
        const char *m = json_string_value(json_is_object(mark) ? json_object_get(mark, "type") : mark);
        static const struct {
            const char *mark, *type;
        } marks[] = {{"line", "line"},       {"bar", "bar"},   {"point", "scatter"},
                     {"circle", "scatter"},  {"square", "scatter"}, {"arc", "pie"},
                     {"rect", "heatmap"}};
        for (size_t k = 0; m && k < SBX_ARRAY_LEN(marks); k++)
            if (!strcmp(m, marks[k].mark))
                type = marks[k].type;
        chart = json_pack("{s:s, s:O, s:s}", "type", type, "data", v, "library", "altair");
        json_t *title = title_of(json_object_get(v, "title"));
        if (chart && title)
            json_object_set(chart, "title", title);
    }
    return chart;
}

/*
 * Encode one result map from a Jupyter data bundle (and the driver's chart,
 * if any, else one derived from the bundle); returns the msgpack objects
 * written.  A JSON value that does not
 * fit a reply is left out and the result marked `truncated`.  A `standin`
 * carries only the first STANDIN_TEXT bytes of its text, its formats and
 * `truncated: true`: what is left of a result the run had no room for.
 */
static size_t
encode_result(sbx_enc *e, json_t *data, json_t *chart, bool main_result, bool standin)
{
    size_t objs = 1;
    bool cut = standin;
    const char *k;
    json_t *v;
    sbx_enc_map(e);
    for (size_t i = 0; i < SBX_ARRAY_LEN(mime_fields); i++) {
        v = json_object_get(data, mime_fields[i].mime);
        if (!v || (standin && i > 0))
            continue;
        size_t n = 0;
        if (json_is_string(v)) {
            size_t len = json_string_length(v);
            if (standin && len > STANDIN_TEXT)
                len = sbx_utf8_complete_prefix(json_string_value(v), STANDIN_TEXT);
            sbx_enc_kstrn(e, mime_fields[i].field, json_string_value(v), len);
            n = 1;
        } else if (json_fits(v, 0, &n)) {
            sbx_enc_str(e, mime_fields[i].field);
            sbx_json_to_msgpack(v, e); /* cannot fail: json_fits checked */
        } else {
            cut = true;
            continue;
        }
        objs += 1 + n;
    }
    size_t n = 0;
    json_t *derived = chart || standin ? NULL : chart_from_bundle(data);
    chart = chart ? chart : derived;
    if (chart && !standin) {
        if (json_is_object(chart) && json_fits(chart, 0, &n)) {
            sbx_enc_str(e, "chart");
            sbx_json_to_msgpack(chart, e);
            objs += 1 + n;
        } else {
            cut = true;
        }
    }
    json_decref(derived);
    sbx_enc_karray(e, "formats");
    json_object_foreach(data, k, v) {
        sbx_enc_str(e, k);
        objs++;
    }
    sbx_enc_end(e);
    sbx_enc_kbool(e, "isMainResult", main_result);
    objs += 4;
    if (cut) {
        sbx_enc_kbool(e, "truncated", true);
        objs += 2;
    }
    sbx_enc_end(e);
    return objs;
}

/* A result of a non-streamed run, within the run's budgets. */
static void
run_add_result(struct run *r, json_t *data, json_t *chart, bool main_result)
{
    size_t room = RUN_RESULTS_CAP - SBX_MIN(r->results.len, RUN_RESULTS_CAP);
    if (!main_result)
        room = room > RUN_MAIN_RESERVE ? room - RUN_MAIN_RESERVE : 0;
    size_t oroom = RUN_OBJECTS_CAP - SBX_MIN(r->res_objects, RUN_OBJECTS_CAP);
    sbx_enc one;
    size_t objs = 0;
    bool ok = false;
    for (int standin = 0; standin < 2 && !ok; standin++) {
        if (standin)
            r->res_truncated = true;
        if (r->nresults >= RUN_RESULTS_MAX)
            break;
        sbx_enc_init(&one);
        objs = encode_result(&one, data, chart, main_result, standin);
        ok = !one.bad && one.len <= room && objs <= oroom;
        if (!ok)
            sbx_enc_free(&one);
    }
    if (!ok)
        return;
    char *b;
    size_t bl;
    if (sbx_enc_finish(&one, &b, &bl) == 0) {
        sbx_enc_raw(&r->results, b, bl);
        free(b);
        r->nresults++;
        r->res_objects += objs;
    }
}

/* The error fields {name, value, traceback} into the open map e, each cut
 * to its cap (a traceback is cut at whole lines, the last one saying so). */
static void
encode_error_fields(sbx_enc *e, const char *name, json_t *value, json_t *tb)
{
    sbx_enc_kstr(e, "name", name && *name ? name : "Error");
    const char *vs = json_string_value(value);
    size_t vl = vs ? json_string_length(value) : 0;
    if (vl > ERROR_VALUE_CAP)
        vl = sbx_utf8_complete_prefix(vs, ERROR_VALUE_CAP);
    sbx_enc_kstrn(e, "value", vs ? vs : "", vl);
    sbx_enc_karray(e, "traceback");
    size_t i, used = 0, lines = 0, n = json_array_size(tb);
    json_t *line;
    json_array_foreach(tb, i, line) {
        if (!json_is_string(line))
            continue;
        size_t ll = json_string_length(line);
        if (lines == ERROR_TB_LINES || used + ll > ERROR_TB_CAP) {
            char note[80];
            snprintf(note, sizeof(note), "[sbx: %zu more traceback lines not kept]", n - i);
            sbx_enc_str(e, note);
            break;
        }
        sbx_enc_strn(e, json_string_value(line), ll);
        used += ll;
        lines++;
    }
    sbx_enc_end(e);
}

static void
run_free(struct run *r)
{
    sbx_enc_free(&r->results);
    logacc_free(&r->logs[0]);
    logacc_free(&r->logs[1]);
    sbx_enc_free(&r->error);
    free(r->payload);
    free(r);
}

/* One event line from the driver. */
static void
on_event(struct driver *d, json_t *ev)
{
    const char *type = json_string_value(json_object_get(ev, "type"));
    if (!type)
        return;
    if (!strcmp(type, "ready")) {
        if (d->ready)
            return; /* only the driver's first line: a cell could write more */
        if (d->pid <= 0) {
            /* A fork: its pid is known from here on (it cannot have run
             * user code yet).  Never one of ours to signal by mistake. */
            json_t *pid = json_object_get(ev, "pid");
            pid_t p = json_is_integer(pid) ? (pid_t)json_integer_value(pid) : 0;
            if (p <= 1 || p == getpid()) {
                driver_died(d, "its ready line named no valid pid");
                return;
            }
            d->pid = p;
        }
        d->ready = true;
        const char *mode = json_string_value(json_object_get(ev, "mode"));
        snprintf(d->mode, sizeof(d->mode), "%s", mode ? mode : "");
        sbx_loop_cancel(d->a->loop, d->ready_timer);
        d->ready_timer = 0;
        if (d->ctx)
            run_next(d->ctx);
        return;
    }
    struct context *c = d->ctx;
    struct run *r = c ? c->cur : NULL;
    const char *id = json_string_value(json_object_get(ev, "id"));
    if (!r || !id || strcmp(id, r->rid))
        return; /* stale (a cell we gave up on) */
    if (!strcmp(type, "done")) {
        json_t *ec = json_object_get(ev, "execution_count");
        if (json_is_integer(ec))
            r->exec_count = (int)json_integer_value(ec);
        const char *st = json_string_value(json_object_get(ev, "status"));
        drain_fdout(d);
        run_finish(c, st ? st : "ok");
        return;
    }
    if (r->is_init) {
        if (!strcmp(type, "error")) {
            r->has_error = true;
            sbx_enc_init(&r->error);
            sbx_enc_map(&r->error);
            const char *ev2 = json_string_value(json_object_get(ev, "evalue"));
            sbx_enc_kstr(&r->error, "value", ev2 ? ev2 : "");
        }
        return;
    }
    if (!strcmp(type, "stream")) {
        const char *name = json_string_value(json_object_get(ev, "name"));
        json_t *t = json_object_get(ev, "text");
        if (json_is_string(t))
            run_log(r, !name || strcmp(name, "stderr") != 0, json_string_value(t),
                    json_string_length(t));
        return;
    }
    if (!strcmp(type, "display_data") || !strcmp(type, "execute_result")) {
        json_t *data = json_object_get(ev, "data");
        if (!json_is_object(data))
            return;
        json_t *chart = json_object_get(ev, "chart");
        bool main_result = !strcmp(type, "execute_result");
        if (r->stream) {
            if (!stream_room(r))
                return;
            sbx_enc *e = stream_begin(r->stream, "result");
            sbx_enc_str(e, "result");
            encode_result(e, data, chart, main_result, false);
            stream_commit(r->stream, false);
        } else {
            run_add_result(r, data, chart, main_result);
        }
        return;
    }
    if (!strcmp(type, "error")) {
        const char *ename = json_string_value(json_object_get(ev, "ename"));
        json_t *evalue = json_object_get(ev, "evalue"), *tb = json_object_get(ev, "traceback");
        sbx_enc *e;
        if (r->stream) {
            if (!stream_room(r))
                return;
            e = stream_begin(r->stream, "error");
        } else {
            if (r->has_error)
                sbx_enc_free(&r->error);
            r->has_error = true;
            sbx_enc_init(&r->error);
            sbx_enc_map(&r->error);
            e = &r->error;
        }
        encode_error_fields(e, ename, evalue, tb);
        if (r->stream)
            stream_commit(r->stream, false);
    }
}

/* The event pipe closed EOF_GRACE_MS ago and the driver has not been
 * reaped: it lives on without a way to talk; kill it. */
static void
eof_grace(sbx_loop *l, void *arg)
{
    struct driver *d = arg;
    (void)l;
    d->eof_timer = 0;
    driver_kill(d);
    driver_died(d, "it closed its event pipe");
}

static void
ev_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct driver *d = arg;
    char buf[65536];
    (void)l;
    (void)ev;
    while (!stream_blocks(d)) {
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n > 0) {
            sbx_buf_append(&d->evbuf, buf, (size_t)n);
            char *nl;
            while (d->evbuf.len && (nl = memchr(d->evbuf.p, '\n', d->evbuf.len)) != NULL) {
                size_t len = (size_t)(nl - d->evbuf.p);
                json_error_t je;
                json_t *j = json_loadb(d->evbuf.p, len, 0, &je);
                sbx_buf_consume(&d->evbuf, len + 1);
                if (j) {
                    on_event(d, j);
                    json_decref(j);
                    if (d->dead)
                        return;
                }
            }
            if (d->evbuf.len > EVENT_LINE_MAX) {
                driver_died(d, "it sent an event line over 64 MiB");
                return;
            }
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        /* The driver is exiting, most likely: its exit status tells the
         * user more than the pipe does, so wait a little for the reap. */
        sbx_loop_modify(d->a->loop, d->w_ev, 0);
        if (d->pid > 0) {
            if (!d->eof_timer)
                d->eof_timer = sbx_loop_timer(d->a->loop, EOF_GRACE_MS, eof_grace, d);
            return;
        }
        driver_died(d, "its event pipe closed");
        return;
    }
}

/* ------------------------------------------------------------------------------ */
/* Drivers. */

static void
driver_close_child(struct driver *d)
{
    for (int i = 0; i < 4; i++) {
        if (d->child[i] >= 0)
            close(d->child[i]);
        d->child[i] = -1;
    }
}

static void
driver_close(struct driver *d)
{
    struct agent *a = d->a;
    sbx_watch **ws[] = {&d->w_req, &d->w_ev, &d->w_out, &d->w_err};
    int *fds[] = {&d->req_fd, &d->ev_fd, &d->out_fd, &d->err_fd};
    for (size_t i = 0; i < 4; i++) {
        if (*ws[i])
            sbx_loop_unwatch(a->loop, *ws[i]);
        *ws[i] = NULL;
        if (*fds[i] >= 0)
            close(*fds[i]);
        *fds[i] = -1;
    }
    driver_close_child(d);
    d->pending = false;
    sbx_loop_cancel(a->loop, d->ready_timer);
    sbx_loop_cancel(a->loop, d->eof_timer);
    d->ready_timer = d->eof_timer = 0;
}

static void
driver_free(struct driver *d)
{
    struct interp *in = IS(d->a);
    for (struct driver **pp = &in->drivers; *pp; pp = &(*pp)->next) {
        if (*pp == d) {
            *pp = d->next;
            break;
        }
    }
    driver_close(d);
    sbx_buf_free(&d->evbuf);
    sbx_buf_free(&d->reqq);
    free(d);
}

/* Kill the driver and what it started.  A fork whose `ready` has not come
 * has no pid yet: closing its pipes (driver_close) ends it (EOF on fd 3). */
static void
driver_kill(struct driver *d)
{
    if (d->pid > 0 && !d->dead)
        agent_kill_tree(d->pid, false, NULL, 0);
}

static void
ready_timeout(sbx_loop *l, void *arg)
{
    struct driver *d = arg;
    (void)l;
    d->ready_timer = 0;
    driver_kill(d);
    driver_died(d, "it did not start within 30 s");
}

/* Seed matplotlib's cache directory with the font list built at install
 * time (tools/install-interp.sh): the first `import matplotlib` in a sandbox
 * then takes 0.5 s instead of 1.1 s. */
static void
seed_mpl_cache(void)
{
    static const char src[] = INTERP_DIR "/mplcache/fontlist-v330.json";
    static const char dst[] = "/tmp/.sbx-matplotlib/fontlist-v330.json";
    char *buf = NULL;
    size_t n;
    if (access(dst, F_OK) == 0 || sbx_fs_read(src, 16u << 20, &buf, &n) != 0)
        return;
    mkdir("/tmp/.sbx-matplotlib", 0755);
    int fd = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd >= 0) {
        sbx_write_full(fd, buf, n);
        close(fd);
    }
    free(buf);
}

/* FNV-1a of the sandbox environment: what a warm driver or the fork server
 * started with, compared when it is about to serve a context. */
static uint64_t
env_hash(char *const *env)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (char *const *p = env; p && *p; p++)
        for (const unsigned char *c = (const unsigned char *)*p;; c++) {
            h = (h ^ *c) * 0x100000001b3ull;
            if (!*c)
                break;
        }
    return h;
}

/* Whether a context's envVars must be in the interpreter's environment at
 * its start (read once by the interpreter, the dynamic loader or libc):
 * such a context gets a driver of its own, started with them, instead of a
 * warm one that `init` could only tell afterwards. */
static bool
env_needs_start(int kind, const msgpack_object *env)
{
    static const char *const any[] = {"LD_", "MALLOC_", "GLIBC_TUNABLES"};
    static const char *const py[] = {"PYTHON", "SBX_PY_"};
    static const char *const node[] = {"NODE_", "UV_"};
    /* Start-time settings a driver has no use for (it runs -u, writes no
     * bytecode and has its own stdout): set by `init` for its children. */
    static const char *const idle[] = {"PYTHONUNBUFFERED", "PYTHONIOENCODING",
                                       "PYTHONDONTWRITEBYTECODE"};
    for (uint32_t i = 0; env && i < env->via.map.size; i++) {
        sbx_str k;
        bool skip = false;
        if (sbx_wire_obj_str(&env->via.map.ptr[i].key, &k) != 0)
            continue;
        for (size_t j = 0; j < SBX_ARRAY_LEN(idle); j++)
            skip = skip || sbx_str_eq(k, idle[j]);
        if (skip)
            continue;
        const char *const *sets[] = {any, kind == K_PY ? py : node};
        size_t lens[] = {SBX_ARRAY_LEN(any), kind == K_PY ? SBX_ARRAY_LEN(py) : SBX_ARRAY_LEN(node)};
        for (size_t s = 0; s < 2; s++)
            for (size_t j = 0; j < lens[s]; j++) {
                size_t pl = strlen(sets[s][j]);
                if (k.n >= pl && !memcmp(k.p, sets[s][j], pl))
                    return true;
            }
    }
    return false;
}

/* The interpreter and driver of a kind, or why not (the host lacks them). */
static int
driver_paths(int kind, const char **bin, const char **script, char *why, size_t whylen)
{
    static const char *const nodes[] = {"/usr/bin/node", "/usr/local/bin/node", "/usr/bin/nodejs"};
    struct stat st;
    *script = kind == K_PY ? INTERP_DIR "/driver.py" : INTERP_DIR "/driver.js";
    *bin = NULL;
    if (stat(*script, &st) < 0) {
        snprintf(why, whylen, "the interpreter driver %s is not installed", *script);
        return -1;
    }
    if (kind == K_PY) {
        if (access("/usr/bin/python3", X_OK) == 0)
            *bin = "/usr/bin/python3";
    } else {
        for (size_t i = 0; i < SBX_ARRAY_LEN(nodes) && !*bin; i++)
            if (access(nodes[i], X_OK) == 0)
                *bin = nodes[i];
    }
    if (!*bin) {
        snprintf(why, whylen, "%s is not installed on the host", kind == K_PY ? "python3" : "node");
        return -1;
    }
    return 0;
}

/* The environment of an interpreter: the sandbox's, the context's own
 * overrides (NULL for a pooled driver), and defaults they do not set. */
static char **
driver_env(struct agent *a, const msgpack_object *over)
{
    static const char *const extra[] = {"NODE_NO_WARNINGS=1", "PYTHONDONTWRITEBYTECODE=1",
                                        "MPLCONFIGDIR=/tmp/.sbx-matplotlib"};
    char **env = agent_env_merge(a->env, over);
    size_t n = 0;
    while (env[n])
        n++;
    env = sbx_xrealloc(env, (n + SBX_ARRAY_LEN(extra) + 1) * sizeof(char *));
    for (size_t i = 0; i < SBX_ARRAY_LEN(extra); i++) {
        size_t kl = (size_t)(strchr(extra[i], '=') - extra[i]);
        bool have = false;
        for (size_t k = 0; k < n && !have; k++)
            have = !strncmp(env[k], extra[i], kl + 1);
        if (!have)
            env[n++] = sbx_xstrdup(extra[i]);
    }
    env[n] = NULL;
    return env;
}

/* A driver with its pipes, not started: our ends are watched, its ends wait
 * in d->child for driver_exec or the fork server. */
static struct driver *
driver_new(struct agent *a, int kind, int lang, char *why, size_t whylen)
{
    int p[4][2];
    int n = 0;
    for (; n < 4; n++)
        if (pipe2(p[n], O_CLOEXEC) < 0)
            break;
    if (n < 4) {
        snprintf(why, whylen, "pipe: %s", strerror(errno));
        for (int i = 0; i < n; i++) {
            close(p[i][0]);
            close(p[i][1]);
        }
        return NULL;
    }
    struct driver *d = sbx_xcalloc(1, sizeof(*d));
    d->a = a;
    d->kind = kind;
    d->lang = lang;
    d->spawned_ms = sbx_mono_ms();
    /* requests: we write; events, stdout, stderr: we read */
    d->req_fd = p[0][1];
    d->child[0] = p[0][0];
    d->ev_fd = p[1][0];
    d->child[1] = p[1][1];
    d->out_fd = p[2][0];
    d->child[2] = p[2][1];
    d->err_fd = p[3][0];
    d->child[3] = p[3][1];
    int fds[] = {d->req_fd, d->ev_fd, d->out_fd, d->err_fd};
    for (size_t i = 0; i < 4; i++)
        sbx_set_nonblock(fds[i], true);
    sbx_buf_init(&d->evbuf);
    sbx_buf_init(&d->reqq);
    d->w_req = sbx_loop_watch(a->loop, d->req_fd, 0, req_cb, d);
    d->w_ev = sbx_loop_watch(a->loop, d->ev_fd, EPOLLIN, ev_cb, d);
    d->w_out = sbx_loop_watch(a->loop, d->out_fd, EPOLLIN, fdout_cb, d);
    d->w_err = sbx_loop_watch(a->loop, d->err_fd, EPOLLIN, fdout_cb, d);
    d->ready_timer = sbx_loop_timer(a->loop, READY_TIMEOUT_MS, ready_timeout, d);
    struct interp *in = IS(a);
    d->next = in->drivers;
    in->drivers = d;
    return d;
}

/* Start d as a process of its own (execve), with the context's overrides. */
static int
driver_exec(struct driver *d, const msgpack_object *over, char *why, size_t whylen)
{
    const char *bin, *script;
    if (driver_paths(d->kind, &bin, &script, why, whylen) != 0)
        return -1;
    int nul = open("/dev/null", O_RDONLY | O_CLOEXEC);
    if (nul < 0) {
        snprintf(why, whylen, "/dev/null: %s", strerror(errno));
        return -1;
    }
    const char *argv_py[] = {bin, "-u", script, NULL};
    const char *argv_js[] = {bin, script, d->lang == L_TS ? "typescript" : "javascript", NULL};
    char **env = driver_env(d->a, over);
    int keep[] = {d->child[0], d->child[1]};
    struct spawn_opts so = {
        .in_fd = nul,
        .out_fd = d->child[2],
        .err_fd = d->child[3],
        .keep_fds = keep,
        .nkeep = 2,
        .cwd = "/workspace",
        .env = env,
        .argv = d->kind == K_PY ? argv_py : argv_js,
        .subreaper = true,
        .new_session = true,
    };
    pid_t pid = agent_spawn(d->a, &so);
    agent_env_free(env);
    close(nul);
    driver_close_child(d);
    if (pid < 0) {
        snprintf(why, whylen, "could not start the interpreter: %s", strerror((int)-pid));
        return -1;
    }
    d->pid = pid;
    return 0;
}

/* ---- the Python fork server ---- */

static void
zygote_ready_timeout(sbx_loop *l, void *arg)
{
    struct agent *a = arg;
    (void)l;
    IS(a)->zyg->ready_timer = 0;
    zygote_gone(a, true);
}

/* Hand the waiting Python drivers to the fork server: one message each,
 * their four ends attached.  A full socket waits for EPOLLOUT. */
static void
zygote_flush(struct agent *a)
{
    struct interp *in = IS(a);
    struct zygote *z = in->zyg;
    if (!z || !z->ready)
        return;
    for (struct driver *d = in->drivers; d; d = d->next) {
        if (!d->pending)
            continue;
        char msg[] = "{\"type\":\"fork\"}";
        union {
            char buf[CMSG_SPACE(4 * sizeof(int))];
            struct cmsghdr align;
        } u;
        struct iovec iov = {msg, sizeof(msg) - 1};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
                            .msg_controllen = sizeof(u.buf)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(4 * sizeof(int));
        memcpy(CMSG_DATA(cm), d->child, 4 * sizeof(int));
        if (sendmsg(z->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL) < 0) {
            if (errno == EAGAIN || errno == EINTR) {
                sbx_loop_modify(a->loop, z->w, EPOLLIN | EPOLLOUT);
                return;
            }
            zygote_gone(a, false);
            return;
        }
        d->pending = false;
        driver_close_child(d);
    }
    sbx_loop_modify(a->loop, z->w, EPOLLIN);
}

static void driver_exited(struct agent *a, pid_t pid, int status);

/* Messages of the fork server: ready, error, and the exit status of the
 * drivers it forked (they are its children). */
static void
zygote_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct agent *a = arg;
    struct interp *in = IS(a);
    (void)l;
    if (ev & EPOLLOUT)
        zygote_flush(a);
    while (in->zyg) {
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof(buf) - 1, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return;
        if (n <= 0) {
            zygote_gone(a, !in->zyg->ready);
            return;
        }
        json_error_t je;
        json_t *j = json_loadb(buf, (size_t)n, 0, &je);
        const char *type = json_string_value(json_object_get(j, "type"));
        json_t *pid = json_object_get(j, "pid"), *st = json_object_get(j, "status");
        if (type && !strcmp(type, "ready") && !in->zyg->ready) {
            in->zyg->ready = true;
            sbx_loop_cancel(a->loop, in->zyg->ready_timer);
            in->zyg->ready_timer = 0;
            json_decref(j);
            zygote_flush(a);
        } else if (type && !strcmp(type, "exit") && json_is_integer(pid) && json_is_integer(st)) {
            driver_exited(a, (pid_t)json_integer_value(pid), (int)json_integer_value(st));
            json_decref(j);
        } else if (type && !strcmp(type, "error")) {
            json_decref(j);
            zygote_gone(a, true);
            return;
        } else {
            json_decref(j);
        }
    }
}

/* Start the fork server with the current sandbox environment. */
static void
zygote_start(struct agent *a)
{
    struct interp *in = IS(a);
    const char *bin, *script;
    char why[200];
    int sv[2] = {-1, -1}, nul = -1;
    if (driver_paths(K_PY, &bin, &script, why, sizeof(why)) != 0 ||
        socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) < 0 ||
        (nul = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0) {
        in->zyg_broken = true;
    } else {
        const char *argv[] = {bin, "-u", script, "--fork-server", NULL};
        char **env = driver_env(a, NULL);
        int keep[] = {sv[1]};
        struct spawn_opts so = {
            .in_fd = nul, .out_fd = nul, .err_fd = nul, .keep_fds = keep, .nkeep = 1,
            .cwd = "/workspace", .env = env, .argv = argv, .new_session = true,
        };
        pid_t pid = agent_spawn(a, &so);
        agent_env_free(env);
        if (pid < 0) {
            in->zyg_broken = true;
        } else {
            struct zygote *z = sbx_xcalloc(1, sizeof(*z));
            z->pid = pid;
            z->fd = sv[0];
            sv[0] = -1;
            z->env_hash = env_hash(a->env);
            sbx_set_nonblock(z->fd, true);
            z->w = sbx_loop_watch(a->loop, z->fd, EPOLLIN, zygote_cb, a);
            z->ready_timer = sbx_loop_timer(a->loop, READY_TIMEOUT_MS, zygote_ready_timeout, a);
            in->zyg = z;
        }
    }
    int all[] = {sv[0], sv[1], nul};
    for (size_t i = 0; i < SBX_ARRAY_LEN(all); i++)
        if (all[i] >= 0)
            close(all[i]);
}

/*
 * The fork server is gone or unwanted: kill it (only it: the drivers it
 * forked are its children but belong to contexts; they are reparented to
 * us).  Drivers still waiting for a fork are started directly.  `broken`
 * (it failed before it was ready): this sandbox starts Python drivers
 * directly from now on.
 */
static void
zygote_gone(struct agent *a, bool broken)
{
    struct interp *in = IS(a);
    struct zygote *z = in->zyg;
    if (!z)
        return;
    in->zyg = NULL;
    if (broken)
        in->zyg_broken = true;
    kill(z->pid, SIGKILL);
    sbx_loop_unwatch(a->loop, z->w);
    close(z->fd);
    sbx_loop_cancel(a->loop, z->ready_timer);
    free(z);
    for (struct driver *d = in->drivers, *next; d; d = next) {
        next = d->next;
        char why[200];
        if (!d->pending)
            continue;
        d->pending = false;
        if (driver_exec(d, NULL, why, sizeof(why)) != 0)
            driver_died(d, why);
    }
}

/* ---- starting drivers ---- */

/* A new driver for a context or the pool: a fork of the fork server for a
 * pooled Python driver (the server is started, or replaced when the sandbox
 * environment changed, as needed), else a process of its own with the
 * context's start-time envVars `over`. */
static struct driver *
driver_spawn(struct agent *a, int lang, const msgpack_object *over, char *why, size_t whylen)
{
    struct interp *in = IS(a);
    int kind = KIND(lang);
    const char *bin, *script;
    if (driver_paths(kind, &bin, &script, why, whylen) != 0)
        return NULL;
    if (kind == K_PY)
        seed_mpl_cache();
    struct driver *d = driver_new(a, kind, lang, why, whylen);
    if (!d)
        return NULL;
    uint64_t h = env_hash(a->env);
    d->custom = over != NULL;
    d->env_hash = h;
    if (kind == K_PY && !over && !in->zyg_broken) {
        if (in->zyg && in->zyg->env_hash != h)
            zygote_gone(a, false);
        if (!in->zyg)
            zygote_start(a);
        if (in->zyg) {
            d->pending = true;
            zygote_flush(a);
            return d;
        }
    }
    if (driver_exec(d, over, why, whylen) != 0) {
        driver_free(d);
        return NULL;
    }
    return d;
}

/* Whether d may serve a new context of `kind` now. */
static bool
warm_usable(const struct driver *d, int kind, uint64_t h)
{
    return !d->ctx && !d->dead && !d->custom && d->kind == kind && d->env_hash == h;
}

/* Drop warm drivers of `kind` whose environment is stale. */
static void
pool_prune(struct agent *a, int kind, uint64_t h)
{
    for (struct driver *d = IS(a)->drivers, *next; d; d = next) {
        next = d->next;
        if (!d->ctx && !d->dead && d->kind == kind && d->env_hash != h) {
            driver_kill(d);
            d->dead = true;
            driver_free(d);
        }
    }
}

/* The best warm driver for `lang`: ready before starting, warmed for the
 * same language before another, older before younger. */
static struct driver *
pool_take(struct agent *a, int lang)
{
    int kind = KIND(lang);
    uint64_t h = env_hash(a->env);
    pool_prune(a, kind, h);
    struct driver *best = NULL;
    for (struct driver *d = IS(a)->drivers; d; d = d->next) {
        if (!warm_usable(d, kind, h))
            continue;
        if (!best || (d->ready != best->ready ? d->ready
                      : (d->lang == lang) != (best->lang == lang) ? d->lang == lang
                                                                  : d->spawned_ms < best->spawned_ms))
            best = d;
    }
    return best;
}

/* Start warm drivers until `lang`'s kind has POOL_SIZE of them. */
static void
pool_fill(struct agent *a, int lang)
{
    int kind = KIND(lang), n = 0;
    uint64_t h = env_hash(a->env);
    pool_prune(a, kind, h);
    for (struct driver *d = IS(a)->drivers; d; d = d->next)
        n += warm_usable(d, kind, h);
    char why[200];
    while (n++ < POOL_SIZE[kind])
        if (!driver_spawn(a, lang, NULL, why, sizeof(why)))
            break;
}

static void
refill_cb(sbx_loop *l, void *arg)
{
    struct refill *rf = arg;
    (void)l;
    rf->timer = 0;
    pool_fill(rf->a, rf->lang);
}

/*
 * Refill `lang`'s pool after a driver left it: at once when it is empty (a
 * burst of creations waits for this), else REFILL_DELAY_MS later, so that
 * the start (a fork of a 40 MiB process and its warm-up, or a Node start)
 * does not compete for the CPU with the new context's first cells.
 */
static void
pool_refill(struct agent *a, int lang)
{
    struct interp *in = IS(a);
    int kind = KIND(lang), n = 0;
    uint64_t h = env_hash(a->env);
    for (struct driver *d = in->drivers; d; d = d->next)
        n += warm_usable(d, kind, h) && d->ready;
    struct refill *rf = &in->refill[kind];
    if (n == 0) {
        sbx_loop_cancel(a->loop, rf->timer);
        rf->timer = 0;
        pool_fill(a, lang);
    } else if (!rf->timer) {
        rf->a = a;
        rf->lang = lang;
        rf->timer = sbx_loop_timer(a->loop, REFILL_DELAY_MS, refill_cb, rf);
    }
}

static void
driver_died(struct driver *d, const char *why)
{
    if (d->dead)
        return;
    d->dead = true;
    struct context *c = d->ctx;
    driver_close(d);
    if (!c) {
        driver_free(d);
        return;
    }
    c->dead = true;
    snprintf(c->dead_why, sizeof(c->dead_why),
             "the context's interpreter exited (%s); delete the context and create a new one", why);
    run_finish(c, "dead");
    c->drv = NULL;
    driver_free(d);
    /* Everything queued behind fails the same way. */
    while (c->q_head) {
        struct run *r = c->q_head;
        c->q_head = r->next;
        c->cur = r;
        run_finish(c, "dead");
    }
    c->q_tail = NULL;
}

/* A driver process ended: reaped by us, or by the fork server that forked
 * it (which sends the status). */
static void
driver_exited(struct agent *a, pid_t pid, int status)
{
    for (struct driver *d = IS(a)->drivers; d; d = d->next) {
        if (d->pid != pid)
            continue;
        /* Events already in the pipe come first. */
        if (d->ev_fd >= 0)
            ev_cb(a->loop, d->ev_fd, EPOLLIN, d);
        if (!d->dead) {
            char why[64];
            snprintf(why, sizeof(why), WIFEXITED(status) ? "exit status %d" : "signal %d",
                     WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            driver_died(d, why);
        }
        return;
    }
}

bool
agent_interp_reaped(struct agent *a, pid_t pid, int status)
{
    if (!a->interp || pid <= 0)
        return false;
    struct interp *in = IS(a);
    if (in->zyg && in->zyg->pid == pid) {
        zygote_gone(a, !in->zyg->ready);
        return true;
    }
    for (struct driver *d = in->drivers; d; d = d->next)
        if (d->pid == pid) {
            driver_exited(a, pid, status);
            return true;
        }
    return false;
}

/* ------------------------------------------------------------------------------ */
/* Runs. */

static void
interrupt_grace(sbx_loop *l, void *arg)
{
    struct context *c = arg;
    (void)l;
    if (c->cur)
        c->cur->kill_timer = 0;
    if (c->drv) {
        /* The cell ignored SIGINT (C code, a busy event loop): the state
         * cannot be saved. */
        driver_kill(c->drv);
        driver_died(c->drv, "it did not stop within 2 s of an interrupt and was killed");
    }
}

/* Interrupt the running cell (SIGINT; killed if it has not stopped after
 * INTERRUPT_GRACE_MS) and release its stream's back-pressure. */
static void
run_interrupt(struct context *c, struct run *r)
{
    r->released = true;
    if (c->drv) {
        if (c->drv->pid > 0)
            kill(c->drv->pid, SIGINT);
        driver_unpause(c->drv);
    }
    if (!r->kill_timer)
        r->kill_timer = sbx_loop_timer(c->a->loop, INTERRUPT_GRACE_MS, interrupt_grace, c);
}

static void
run_timeout(sbx_loop *l, void *arg)
{
    struct context *c = arg;
    struct run *r = c->cur;
    if (!r)
        return;
    r->timer = 0;
    r->interrupted = true;
    run_interrupt(c, r);
}

static void
run_next(struct context *c)
{
    if (c->cur || !c->q_head || !c->drv || !c->drv->ready || c->dead)
        return;
    struct run *r = c->q_head;
    c->q_head = r->next;
    if (!c->q_head)
        c->q_tail = NULL;
    r->next = NULL;
    c->cur = r;
    c->a->work_starts++; /* agent_work_alone */
    r->start_us = sbx_mono_us();
    c->last_ms = sbx_wall_ms();
    sbx_buf_append(&c->drv->reqq, r->payload, strlen(r->payload));
    req_pump(c->drv);
    r->sent = true;
    if (r->stream) {
        sbx_enc *e = stream_begin(r->stream, "start");
        sbx_enc_kstr(e, "contextId", c->id);
        stream_commit(r->stream, false);
    }
    if (r->timeout_ms > 0)
        r->timer = sbx_loop_timer(c->a->loop, r->timeout_ms, run_timeout, c);
}

static void
encode_context(struct context *c, sbx_enc *e)
{
    char t[40];
    sbx_enc_map(e);
    sbx_enc_kstr(e, "id", c->id);
    sbx_enc_kstr(e, "language", lang_names[c->lang]);
    sbx_enc_kstr(e, "cwd", c->cwd);
    sbx_iso8601(c->created_ms, t, sizeof(t));
    sbx_enc_kstr(e, "createdAt", t);
    sbx_iso8601(c->last_ms, t, sizeof(t));
    sbx_enc_kstr(e, "lastUsed", t);
    if (c->drv && c->drv->mode[0])
        sbx_enc_kstr(e, "mode", c->drv->mode);
    if (c->dead)
        sbx_enc_kstr(e, "state", "dead");
    sbx_enc_end(e);
}

/* A run the context's death ended, or one sent to a dead context:
 * CODE_EXECUTION_ERROR (the driver failed, not the code), with the reason
 * and what to do in the message, the context and its state in the error's
 * context.  A dead context stays dead until deleted (docs/protocol.md §3.7). */
static void
reply_dead(struct context *c, struct agent_req *req)
{
    sbx_werr w;
    sbx_werr_init(&w, SBX_E_CODE, "%s", c->dead_why);
    sbx_enc_kstr(sbx_werr_ctx(&w), "contextId", c->id);
    sbx_enc_kstr(sbx_werr_ctx(&w), "state", "dead");
    agent_reply_werr(c->a, req, &w);
    sbx_werr_free(&w);
}

static void
run_finish(struct context *c, const char *status)
{
    struct run *r = c->cur;
    struct agent *a = c->a;
    if (!r)
        return;
    c->cur = NULL;
    sbx_loop_cancel(a->loop, r->timer);
    sbx_loop_cancel(a->loop, r->kill_timer);
    bool dead = !strcmp(status, "dead");
    if (r->is_init) {
        if (dead || r->has_error) {
            char why[300];
            snprintf(why, sizeof(why), "the %s context could not be set up: %s",
                     lang_names[c->lang], dead ? c->dead_why : "its cwd does not exist");
            if (r->init_req)
                agent_reply_err(a, r->init_req,
                                dead ? SBX_E_INTERPRETER_NOT_READY : SBX_E_VALIDATION, "%s", why);
            if (!dead)
                snprintf(c->dead_why, sizeof(c->dead_why), "%s", why);
            c->dead = true;
        } else if (r->init_req) {
            sbx_enc e;
            sbx_enc_init(&e);
            sbx_enc_map(&e);
            sbx_enc_kbool(&e, "success", true);
            sbx_enc_kstr(&e, "contextId", c->id);
            sbx_enc_str(&e, "context");
            encode_context(c, &e);
            agent_reply_ok(a, r->init_req, &e);
        }
        run_free(r);
        if (!dead) {
            run_next(c);
            pool_refill(a, c->lang);
        }
        return;
    }
    if (dead) {
        if (r->stream) {
            sbx_enc *e = stream_begin(r->stream, "error");
            sbx_enc_kstr(e, "name", "ContextDead");
            sbx_enc_kstr(e, "value", c->dead_why);
            sbx_enc_karray(e, "traceback");
            sbx_enc_end(e);
            stream_commit(r->stream, true);
            r->stream->ops = NULL;
            stream_unref(r->stream);
        } else if (r->req) {
            reply_dead(c, r->req);
        }
        run_free(r);
        return;
    }
    int64_t dur = (sbx_mono_us() - r->start_us) / 1000;
    if (r->stream) {
        sbx_enc *e = stream_begin(r->stream, "execution_complete");
        sbx_enc_kint(e, "executionCount", r->exec_count);
        sbx_enc_kstr(e, "status", status);
        sbx_enc_kbool(e, "timedOut", r->interrupted);
        sbx_enc_kint(e, "duration", dur);
        if (r->dropped)
            sbx_enc_kint(e, "droppedEvents", (int64_t)r->dropped);
        stream_commit(r->stream, true);
        r->stream->ops = NULL;
        stream_unref(r->stream);
    } else if (r->req) {
        /* Each part is freed as soon as it is in the reply: the sandbox's
         * memory should hold the reply's bytes twice at most. */
        sbx_enc e;
        char *b;
        size_t bl;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "contextId", c->id);
        sbx_enc_kstr(&e, "language", lang_names[c->lang]);
        sbx_enc_kint(&e, "executionCount", r->exec_count);
        sbx_enc_str(&e, "results");
        sbx_enc_end(&r->results);
        if (sbx_enc_finish(&r->results, &b, &bl) == 0) {
            sbx_enc_raw(&e, b, bl);
            free(b);
        } else {
            sbx_enc_array(&e);
            sbx_enc_end(&e);
        }
        sbx_enc_kmap(&e, "logs");
        sbx_enc_str(&e, "stdout");
        logacc_encode(&e, &r->logs[0]);
        sbx_enc_str(&e, "stderr");
        logacc_encode(&e, &r->logs[1]);
        sbx_enc_end(&e);
        if (r->has_error) {
            sbx_enc_str(&e, "error");
            sbx_enc_end(&r->error);
            if (sbx_enc_finish(&r->error, &b, &bl) == 0) {
                sbx_enc_raw(&e, b, bl);
                free(b);
            } else {
                sbx_enc_nil(&e);
            }
        }
        sbx_enc_kbool(&e, "stdoutTruncated", r->logs[0].truncated);
        sbx_enc_kbool(&e, "stderrTruncated", r->logs[1].truncated);
        sbx_enc_kint(&e, "stdoutBytes", (int64_t)r->logs[0].total);
        sbx_enc_kint(&e, "stderrBytes", (int64_t)r->logs[1].total);
        sbx_enc_kbool(&e, "resultsTruncated", r->res_truncated);
        sbx_enc_kbool(&e, "timedOut", r->interrupted);
        sbx_enc_kint(&e, "duration", dur);
        agent_reply_ok(a, r->req, &e);
    }
    run_free(r);
    run_next(c);
}

static struct run *
run_new(struct context *c, const char *type, const char *code)
{
    struct interp *in = IS(c->a);
    struct run *r = sbx_xcalloc(1, sizeof(*r));
    r->ctx = c;
    snprintf(r->rid, sizeof(r->rid), "r%llu", (unsigned long long)++in->ctr);
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string(type));
    json_object_set_new(j, "id", json_string(r->rid));
    if (code)
        json_object_set_new(j, "code", json_string(code));
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(j);
    size_t n = strlen(s);
    r->payload = sbx_xmalloc(n + 2);
    memcpy(r->payload, s, n);
    r->payload[n] = '\n';
    r->payload[n + 1] = '\0';
    free(s);
    sbx_enc_init(&r->results);
    sbx_enc_array(&r->results);
    size_t cap = (size_t)SBX_MIN(c->a->cfg.output_cap ? c->a->cfg.output_cap : RUN_LOG_CAP,
                                 (uint64_t)RUN_LOG_CAP);
    logacc_init(&r->logs[0], cap);
    logacc_init(&r->logs[1], cap);
    return r;
}

static void
enqueue(struct context *c, struct run *r)
{
    if (c->q_tail)
        c->q_tail->next = r;
    else
        c->q_head = r;
    c->q_tail = r;
    run_next(c);
}

/* ------------------------------------------------------------------------------ */
/* Operations. */

static struct context *
ctx_find(struct agent *a, const char *id)
{
    for (struct context *c = IS(a)->contexts; c; c = c->next)
        if (!strcmp(c->id, id))
            return c;
    return NULL;
}

/* Create a context (the caller replies through init_req, or NULL for an
 * implicit default context). */
static struct context *
ctx_create(struct agent *a, int lang, const char *id, const char *cwd, const msgpack_object *env,
           struct agent_req *init_req, char *why, size_t whylen)
{
    struct interp *in = IS(a);
    /* A warm driver unless the envVars must be there at start; a pool that
     * gave a ready one is refilled now (pool_refill), otherwise once this
     * context's driver is up (the starts would compete with it). */
    bool own = env_needs_start(KIND(lang), env);
    struct driver *d = own ? NULL : pool_take(a, lang);
    bool refill = d && d->ready;
    if (!d && !(d = driver_spawn(a, lang, own ? env : NULL, why, whylen)))
        return NULL;
    struct context *c = sbx_xcalloc(1, sizeof(*c));
    c->a = a;
    c->lang = lang;
    snprintf(c->id, sizeof(c->id), "%s", id);
    snprintf(c->cwd, sizeof(c->cwd), "%s", cwd ? cwd : "/workspace");
    c->created_ms = c->last_ms = sbx_wall_ms();
    c->drv = d;
    d->ctx = c;
    c->next = in->contexts;
    in->contexts = c;
    /* The init request gives the driver its cwd and environment. */
    struct run *r = run_new(c, "init", NULL);
    json_t *j = json_object();
    json_object_set_new(j, "type", json_string("init"));
    json_object_set_new(j, "id", json_string(r->rid));
    json_object_set_new(j, "cwd", json_string(c->cwd));
    if (d->kind == K_NODE)
        json_object_set_new(j, "language", json_string(lang_names[lang]));
    json_t *je = json_object();
    if (env) {
        for (uint32_t i = 0; i < env->via.map.size; i++) {
            /* Checked by agent_env_check: string names, string or nil values
             * (JSON null: the driver unsets the variable). */
            sbx_str k, v;
            const msgpack_object *val = &env->via.map.ptr[i].val;
            if (sbx_wire_obj_str(&env->via.map.ptr[i].key, &k) != 0)
                continue;
            char *ks = sbx_str_dup(k);
            json_object_set_new(je, ks,
                                sbx_wire_obj_str(val, &v) == 0 ? json_stringn(v.p, v.n) : json_null());
            free(ks);
        }
    }
    json_object_set_new(j, "env", je);
    free(r->payload);
    char *s = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(j);
    size_t n = strlen(s);
    r->payload = sbx_xmalloc(n + 2);
    memcpy(r->payload, s, n);
    memcpy(r->payload + n, "\n", 2);
    free(s);
    r->is_init = true;
    r->init_req = init_req;
    enqueue(c, r);
    if (refill)
        pool_refill(a, lang);
    return c;
}

void
agent_op_context_create(struct agent *a, struct agent_req *r)
{
    sbx_str lang = SBX_STR("python"), cwd = {0};
    const msgpack_object *env = NULL;
    char why[300];
    if (sbx_wire_get_str(r->args, "language", &lang) == SBX_E_VALIDATION ||
        sbx_wire_get_str(r->args, "cwd", &cwd) == SBX_E_VALIDATION ||
        (sbx_wire_get_map(r->args, "envVars", &env) == SBX_E_VALIDATION)) {
        agent_reply_err(a, r, SBX_E_VALIDATION,
                        "'language' and 'cwd' must be strings, 'envVars' a map of strings");
        return;
    }
    int l = lang_of(lang);
    if (l < 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION,
                        "unknown language '%.*s' (python, javascript or typescript)",
                        (int)SBX_MIN(lang.n, (size_t)40), lang.p);
        return;
    }
    /* As exec's env: names without '=' or NUL, values strings without NUL
     * or nil (unset); anything else is refused, not silently dropped. */
    if (agent_env_check(env, false, why, sizeof(why)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "envVars: %s", why);
        return;
    }
    char cwds[1024] = "/workspace";
    if (cwd.n && sbx_str_copy(cwd, cwds, sizeof(cwds)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'cwd' is too long");
        return;
    }
    struct stat st;
    if (stat(cwds, &st) < 0 || !S_ISDIR(st.st_mode)) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "cwd '%s' is not a directory in the sandbox", cwds);
        return;
    }
    char id[64];
    snprintf(id, sizeof(id), "ctx-%llu", (unsigned long long)++IS(a)->ctr);
    if (!ctx_create(a, l, id, cwds, env, r, why, sizeof(why)))
        agent_reply_err(a, r, l == L_PY ? SBX_E_PYTHON_NA : SBX_E_JAVASCRIPT_NA, "%s", why);
}

/* The reader of a streamed run caught up: read the driver again. */
static void
run_stream_resume(struct stream *st, void *arg)
{
    struct run *r = arg;
    (void)st;
    if (r->ctx->cur == r)
        driver_unpause(r->ctx->drv);
}

/* stream.cancel of a streamed run: a queued run is dropped, a running one
 * interrupted (as by its timeout); either way its stream ends at once. */
static void
run_stream_cancel(struct stream *st, void *arg)
{
    struct run *r = arg;
    struct context *c = r->ctx;
    (void)st;
    if (c->cur == r) {
        run_interrupt(c, r);
        return;
    }
    struct run **pp = &c->q_head;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (!*pp)
        return;
    *pp = r->next;
    if (c->q_tail == r) {
        c->q_tail = NULL;
        for (struct run *q = c->q_head; q; q = q->next)
            c->q_tail = q;
    }
    sbx_enc *e = stream_begin(r->stream, "execution_complete");
    sbx_enc_kstr(e, "status", "cancelled");
    stream_commit(r->stream, true);
    r->stream->ops = NULL;
    stream_unref(r->stream);
    run_free(r);
}

static const struct stream_ops run_stream_ops = {run_stream_resume, run_stream_cancel};

static void
run_common(struct agent *a, struct agent_req *req, bool stream)
{
    sbx_str code, cid = {0}, lang = {0};
    int64_t tmo = 60000; /* the SDK's runCode default */
    char why[300];
    if (sbx_wire_get_str(req->args, "code", &code) != 0) {
        agent_reply_err(a, req, SBX_E_VALIDATION, "'code' (a string) is required");
        return;
    }
    if (memchr(code.p, '\0', code.n)) {
        agent_reply_err(a, req, SBX_E_VALIDATION, "'code' must not contain NUL bytes");
        return;
    }
    sbx_wire_get_str(req->args, "context", &cid);
    if (!cid.n)
        sbx_wire_get_str(req->args, "contextId", &cid);
    sbx_wire_get_str(req->args, "language", &lang);
    if (sbx_wire_get_i64(req->args, "timeout", &tmo) == SBX_E_VALIDATION || tmo < 0) {
        agent_reply_err(a, req, SBX_E_VALIDATION, "'timeout' must be a number of ms");
        return;
    }
    struct context *c = NULL;
    if (cid.n) {
        char id[64];
        if (sbx_str_copy(cid, id, sizeof(id)) != 0 || !(c = ctx_find(a, id))) {
            agent_reply_err(a, req, SBX_E_CONTEXT_NOT_FOUND, "code context '%.*s' not found",
                            (int)SBX_MIN(cid.n, (size_t)64), cid.p);
            return;
        }
    } else {
        /* Without a context: the language's default context (the SDK's). */
        int l = lang.n ? lang_of(lang) : L_PY;
        if (l < 0) {
            agent_reply_err(a, req, SBX_E_VALIDATION,
                            "unknown language '%.*s' (python, javascript or typescript)",
                            (int)SBX_MIN(lang.n, (size_t)40), lang.p);
            return;
        }
        char id[64];
        snprintf(id, sizeof(id), "default-%s", lang_names[l]);
        c = ctx_find(a, id);
        if (c && c->dead) {
            /* A dead default context is replaced transparently (the dead
             * one goes: one context per ID). */
            ctx_destroy(c);
            c = NULL;
        }
        if (!c && !(c = ctx_create(a, l, id, "/workspace", NULL, NULL, why, sizeof(why)))) {
            agent_reply_err(a, req, l == L_PY ? SBX_E_PYTHON_NA : SBX_E_JAVASCRIPT_NA, "%s", why);
            return;
        }
    }
    if (c->dead) {
        reply_dead(c, req);
        return;
    }
    char *codez = sbx_str_dup(code);
    struct run *r = run_new(c, "execute", codez);
    free(codez);
    r->timeout_ms = tmo;
    if (stream) {
        char sid[72];
        snprintf(sid, sizeof(sid), "code-%llu", (unsigned long long)++a->stream_ctr);
        r->stream = stream_new(a, sid, true, STREAM_CAP, &run_stream_ops, r);
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "streamId", sid);
        sbx_enc_kstr(&e, "contextId", c->id);
        agent_reply_ok(a, req, &e);
    } else {
        r->req = req;
    }
    enqueue(c, r);
}

void
agent_op_context_run(struct agent *a, struct agent_req *r)
{
    run_common(a, r, false);
}

void
agent_op_context_run_stream(struct agent *a, struct agent_req *r)
{
    run_common(a, r, true);
}

void
agent_op_context_list(struct agent *a, struct agent_req *r)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_karray(&e, "contexts");
    for (struct context *c = IS(a)->contexts; c; c = c->next)
        encode_context(c, &e);
    sbx_enc_end(&e);
    agent_reply_ok(a, r, &e);
}

static void
ctx_destroy(struct context *c)
{
    struct agent *a = c->a;
    struct interp *in = IS(a);
    for (struct context **pp = &in->contexts; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    if (c->drv) {
        struct driver *d = c->drv;
        d->ctx = NULL;
        c->drv = NULL;
        driver_kill(d);
        d->dead = true;
        driver_free(d);
    }
    snprintf(c->dead_why, sizeof(c->dead_why), "the context was deleted");
    c->dead = true;
    if (c->cur)
        run_finish(c, "dead");
    while (c->q_head) {
        struct run *r = c->q_head;
        c->q_head = r->next;
        c->cur = r;
        run_finish(c, "dead");
    }
    free(c);
}

void
agent_op_context_delete(struct agent *a, struct agent_req *r)
{
    sbx_str id;
    char ids[64];
    if ((sbx_wire_get_str(r->args, "contextId", &id) != 0 &&
         sbx_wire_get_str(r->args, "id", &id) != 0) ||
        sbx_str_copy(id, ids, sizeof(ids)) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'contextId' is required");
        return;
    }
    struct context *c = ctx_find(a, ids);
    if (!c) {
        agent_reply_err(a, r, SBX_E_CONTEXT_NOT_FOUND, "code context '%s' not found", ids);
        return;
    }
    ctx_destroy(c);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "contextId", ids);
    agent_reply_ok(a, r, &e);
}

bool
agent_interp_busy(struct agent *a)
{
    if (!a->interp)
        return false;
    for (struct context *c = IS(a)->contexts; c; c = c->next)
        if (c->cur)
            return true;
    return false;
}

void
agent_interp_free(struct agent *a)
{
    if (!a->interp)
        return;
    struct interp *in = IS(a);
    while (in->contexts)
        ctx_destroy(in->contexts);
    while (in->drivers) {
        struct driver *d = in->drivers;
        driver_kill(d);
        d->dead = true;
        driver_free(d);
    }
    zygote_gone(a, false);
    for (int k = 0; k < K_N; k++)
        sbx_loop_cancel(a->loop, in->refill[k].timer);
    free(in);
    a->interp = NULL;
}
