/*
 * mcp_http.c — MCP over streamable HTTP on the gateway's HTTP front (issue
 * 17; docs/mcp.md): the tools of `sbx mcp` (runtime/mcp.h) at one endpoint,
 * /mcp, for agents that connect by URL instead of starting a process.
 *
 * Transport (MCP 2025-06-18, "Transports", Streamable HTTP; also served to
 * clients of 2025-03-26):
 *   POST /mcp   one JSON-RPC message.  A notification or a response: 202
 *               with no body.  A request: its answer as application/json,
 *               except a tools/call carrying _meta.progressToken whose client
 *               accepts text/event-stream: an SSE stream of its progress
 *               notifications, then its answer (then the stream ends).
 *               Batches (2025-03-26) are refused: -32600.
 *   GET /mcp    405 (no server-initiated stream: the server never asks the
 *               client anything), with Allow.
 *   DELETE /mcp ends the session named by Mcp-Session-Id (204; 404 unknown),
 *               stopping its running execs.
 * Sessions: `initialize` opens one and answers its ID in Mcp-Session-Id (128
 * random bits, hex); every later request must carry it (400 without, 404
 * for an unknown or ended one: the client then initializes again).  A
 * session is bound to the API key that opened it.  At most MCP_MAX_SESSIONS;
 * beyond that the least recently used idle one is dropped.
 * Security: with API keys, every request needs `Authorization: Bearer <key>`
 * (401 without); initialize checks the key with the gateway (a `list` of IDs
 * only) and answers 401 for a key it refuses; tool calls act with that key,
 * so a tenant's key reaches its tenant's sandboxes only (docs/security.md
 * §6).  Keyless (loopback only), the Host and Origin checks of the rest of
 * the front apply (DNS rebinding, the spec's "MUST validate the Origin
 * header"; http_browser_guard) and a POST must be Content-Type:
 * application/json, which no page can send cross-origin without a CORS
 * pre-flight the keyless front never grants (the role X-Sbx-Client has
 * elsewhere: MCP clients do not send that header).
 *
 * Threads: the access handler (MHD's threads) answers initialize, ping,
 * tools/list and notifications itself; each tools/call runs on a worker
 * thread of its own (http_worker_enter; at most MCP_MAX_CALLS at once,
 * beyond that a RESOURCE_BUSY tool error) with synchronous calls through
 * the gateway (http_call_sync).  Its answer travels in a response whose
 * content reader (MHD's thread) hands out what the worker queued in the
 * call's buffer; with nothing to hand out it suspends the connection, and
 * the worker resumes it when it queues more or ends (the suspension rule of
 * http.c: `suspended` is set and cleared under the call's mutex, resumed
 * once).  A call is referenced by its worker and by the response (released
 * by the response's free callback), freed by the last.
 * exec runs as exec.stream + stream.read, so that notifications/cancelled
 * naming it stops its command (stream.cancel kills its process tree) and the
 * request gets no answer (MCP "Cancellation"; its response then ends
 * empty); other tools are single operations whose cancelled answer is
 * dropped.
 */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/json.h"
#include "../runtime/log.h"
#include "../runtime/mcp.h"
#include "http_int.h"

#define MCP_MAX_SESSIONS 1024
#define MCP_MAX_CALLS 64
#define MCP_READ_WAIT_MS 15000 /* one stream.read long poll */
#define MCP_SID_LEN 32         /* hex digits of a session ID */

struct mcp_session {
    struct mcp_session *next;
    char id[MCP_SID_LEN + 1];
    char key[SBX_HTTP_KEY_MAX + 1];
    int64_t used_ms; /* last request (sbx_mono_ms), for eviction */
};

/* One tools/call (see the header comment for its life). */
struct mcp_call {
    struct mcp_call *next; /* in front->calls, under front->mu, while it runs */
    struct sbx_http *h;
    struct MHD_Connection *c;
    char sid[MCP_SID_LEN + 1];
    char key[SBX_HTTP_KEY_MAX + 1];
    json_t *id;     /* owned */
    json_t *params; /* owned */
    char sandbox[SBX_ID_MAX + 2];
    bool sse;
    pthread_mutex_t mu; /* everything below */
    int refs;
    char stream[128];   /* exec's stream once started */
    bool cancelled, done, suspended, conn_gone;
    sbx_buf out;        /* bytes for the response */
    size_t off;
};

struct mcp_front {
    pthread_mutex_t mu;
    struct mcp_session *sessions;
    int nsessions;
    struct mcp_call *calls;
    int ncalls;
    json_t *tools; /* the tools/list result (owned) */
};

/* One POST/DELETE's state behind con_cls (kind HS_MCP). */
struct mcp_req {
    int kind;
    struct sbx_http *h;
    sbx_buf body;
    bool too_large;
    bool answered;
    char key[SBX_HTTP_KEY_MAX + 1];
};

/* ------------------------------------------------------------------------------ */
/* Input schemas from the OpenAPI document (generated from runtime/ops.yaml,
 * like the CLI's copy the stdio server uses). */

/* A deep copy of schema with every {"$ref": "#/components/schemas/X", …}
 * replaced by X (inlined, its own keys kept over X's), depth-bounded. */
static json_t *
inline_refs(const json_t *schema, const json_t *comps, int depth)
{
    if (json_is_array(schema)) {
        json_t *a = json_array();
        size_t i;
        json_t *v;
        json_array_foreach(schema, i, v) json_array_append_new(a, inline_refs(v, comps, depth));
        return a;
    }
    if (!json_is_object(schema))
        return json_deep_copy(schema);
    json_t *o = json_object();
    const char *ref = json_string_value(json_object_get(schema, "$ref"));
    static const char pfx[] = "#/components/schemas/";
    if (ref && !strncmp(ref, pfx, sizeof(pfx) - 1) && depth < 8) {
        json_t *t = inline_refs(json_object_get(comps, ref + sizeof(pfx) - 1), comps, depth + 1);
        if (json_is_object(t))
            json_object_update(o, t);
        json_decref(t);
    }
    const char *k;
    json_t *v;
    json_object_foreach((json_t *)schema, k, v) {
        if (strcmp(k, "$ref"))
            json_object_set_new(o, k, inline_refs(v, comps, depth));
    }
    return o;
}

/* The input schema of op: its Args schema (the request body of the route
 * whose operationId is op), plus `sandbox` for a sandbox op. */
static json_t *
input_schema(const json_t *doc, const char *op)
{
    const json_t *comps = json_object_get(json_object_get(doc, "components"), "schemas");
    json_t *body = NULL;
    const char *p, *m;
    json_t *item, *o;
    json_object_foreach(json_object_get(doc, "paths"), p, item) {
        json_object_foreach(item, m, o) {
            const char *oid = json_string_value(json_object_get(o, "operationId"));
            if (!body && oid && !strcmp(oid, op))
                body = json_object_get(json_object_get(
                    json_object_get(json_object_get(o, "requestBody"), "content"),
                    "application/json"), "schema");
        }
    }
    json_t *s = body ? inline_refs(body, comps, 0) : json_object();
    json_object_set_new(s, "type", json_string("object"));
    if (!json_is_object(json_object_get(s, "properties")))
        json_object_set_new(s, "properties", json_object());
    const struct sbx_op_def *def = sbx_op_find(op, strlen(op));
    if (def && (def->flags & SBX_OP_SANDBOX)) {
        json_object_set_new(json_object_get(s, "properties"), "sandbox", sbx_mcp_sandbox_schema());
        json_t *req = json_object_get(s, "required");
        if (!json_is_array(req)) {
            req = json_array();
            json_object_set_new(s, "required", req);
        }
        json_array_insert_new(req, 0, json_string("sandbox"));
    }
    return s;
}

int
mcp_front_new(struct sbx_http *h)
{
    json_t *doc = json_loadb(h->openapi, h->openapi_len, 0, NULL);
    if (!doc)
        return SBX_E_INTERNAL;
    struct mcp_front *f = sbx_xcalloc(1, sizeof(*f));
    pthread_mutex_init(&f->mu, NULL);
    json_t *arr = json_array();
    for (size_t i = 0; i < sbx_mcp_ntools; i++)
        if (sbx_op_find(sbx_mcp_tools[i].op, strlen(sbx_mcp_tools[i].op)))
            json_array_append_new(arr, sbx_mcp_tool_entry(&sbx_mcp_tools[i],
                                                          input_schema(doc, sbx_mcp_tools[i].op)));
    json_decref(doc);
    f->tools = json_pack("{s:o}", "tools", arr);
    h->mcp = f;
    return 0;
}

void
mcp_front_free(struct sbx_http *h)
{
    struct mcp_front *f = h->mcp;
    if (!f)
        return;
    while (f->sessions) {
        struct mcp_session *s = f->sessions;
        f->sessions = s->next;
        free(s);
    }
    json_decref(f->tools);
    pthread_mutex_destroy(&f->mu);
    free(f);
    h->mcp = NULL;
}

/* ------------------------------------------------------------------------------ */
/* Responses. */

static enum MHD_Result
queue_text(struct sbx_http *h, struct MHD_Connection *c, int status, const char *ctype, char *text,
           const char *sid)
{
    size_t n = text ? strlen(text) : 0;
    struct MHD_Response *r = MHD_create_response_from_buffer(n, text ? text : (char *)"",
                                                             text ? MHD_RESPMEM_MUST_FREE
                                                                  : MHD_RESPMEM_PERSISTENT);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    if (ctype)
        MHD_add_response_header(r, "Content-Type", ctype);
    if (sid)
        MHD_add_response_header(r, "Mcp-Session-Id", sid);
    if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, "Allow", "POST, DELETE");
    if (status == MHD_HTTP_UNAUTHORIZED)
        MHD_add_response_header(r, "WWW-Authenticate", "Bearer");
    http_add_common_headers(r, h->keys != NULL);
    if (status >= 400)
        atomic_fetch_add(&h->n_errors, 1);
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ret;
}

/* A JSON-RPC message (taken) as the application/json answer. */
static enum MHD_Result
queue_msg(struct sbx_http *h, struct MHD_Connection *c, int status, json_t *msg, const char *sid)
{
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (!text)
        return MHD_NO;
    return queue_text(h, c, status, "application/json", text, sid);
}

/* ------------------------------------------------------------------------------ */
/* Sessions (under f->mu). */

static struct mcp_session *
session_find(struct mcp_front *f, const char *sid)
{
    for (struct mcp_session *s = f->sessions; sid && s; s = s->next)
        if (!strcmp(s->id, sid))
            return s;
    return NULL;
}

static bool
session_busy(struct mcp_front *f, const char *sid)
{
    for (struct mcp_call *k = f->calls; k; k = k->next)
        if (!strcmp(k->sid, sid))
            return true;
    return false;
}

/* A new session for key; NULL when every one of MCP_MAX_SESSIONS runs a call. */
static struct mcp_session *
session_new(struct mcp_front *f, const char *key)
{
    if (f->nsessions >= MCP_MAX_SESSIONS) {
        struct mcp_session **lru = NULL;
        for (struct mcp_session **p = &f->sessions; *p; p = &(*p)->next)
            if (!session_busy(f, (*p)->id) && (!lru || (*p)->used_ms < (*lru)->used_ms))
                lru = p;
        if (!lru)
            return NULL;
        struct mcp_session *old = *lru;
        *lru = old->next;
        free(old);
        f->nsessions--;
    }
    struct mcp_session *s = sbx_xcalloc(1, sizeof(*s));
    uint8_t rnd[MCP_SID_LEN / 2];
    if (sbx_random(rnd, sizeof(rnd)) != 0) {
        free(s);
        return NULL;
    }
    for (size_t i = 0; i < sizeof(rnd); i++)
        snprintf(s->id + 2 * i, 3, "%02x", rnd[i]);
    snprintf(s->key, sizeof(s->key), "%s", key);
    s->used_ms = sbx_mono_ms();
    s->next = f->sessions;
    f->sessions = s;
    f->nsessions++;
    return s;
}

/* ------------------------------------------------------------------------------ */
/* Calls. */

static void
call_unref(struct mcp_call *k)
{
    pthread_mutex_lock(&k->mu);
    bool last = --k->refs == 0;
    pthread_mutex_unlock(&k->mu);
    if (!last)
        return;
    json_decref(k->id);
    json_decref(k->params);
    sbx_buf_free(&k->out);
    pthread_mutex_destroy(&k->mu);
    free(k);
}

/* Resume the connection if its reader waits (k->mu held). */
static void
wake(struct mcp_call *k)
{
    if (k->suspended && !k->conn_gone) {
        k->suspended = false;
        MHD_resume_connection(k->c);
    }
}

/* Queue a message (taken) for the response: an SSE event, or the JSON body. */
static void
call_send(struct mcp_call *k, json_t *msg)
{
    char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
    json_decref(msg);
    if (!text)
        return;
    pthread_mutex_lock(&k->mu);
    if (k->sse)
        sbx_buf_appendf(&k->out, "event: message\ndata: %s\n\n", text);
    else
        sbx_buf_append(&k->out, text, strlen(text));
    wake(k);
    pthread_mutex_unlock(&k->mu);
    free(text);
}

/* stream.cancel of k's exec, if it has started one. */
static void
cancel_stream(struct sbx_http *h, const char *key, const char *sandbox, const char *stream)
{
    if (!stream[0])
        return;
    sbx_enc e;
    char *args, code[64], msg[256];
    size_t alen;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "streamId", stream);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &args, &alen) != 0)
        return;
    struct hreply rep;
    if (http_call_sync(h, key, "stream.cancel", sandbox, args, alen, 10000, &rep, code, msg,
                       sizeof(msg)) == 0)
        hreply_free(&rep);
    free(args);
}

/* A tool error from a failed call's code and message. */
static json_t *
call_error(const char *code, const char *msg)
{
    return sbx_mcp_tool_error(code[0] ? code : "INTERNAL_ERROR", msg);
}

/* exec as exec.stream + stream.read (cancellable; progress with a token). */
static json_t *
run_exec(struct mcp_call *k, const char *args, size_t alen)
{
    struct sbx_http *h = k->h;
    json_t *token = json_object_get(json_object_get(k->params, "_meta"), "progressToken");
    char code[64] = "", msg[1024] = "";
    struct hreply rep;
    if (http_call_sync(h, k->key, "exec.stream", k->sandbox, args, alen, h->conf.timeout, &rep,
                       code, msg, sizeof(msg)) != 0)
        return call_error(code, msg);
    sbx_str sid = SBX_STR("");
    sbx_wire_get_str(rep.result, "streamId", &sid);
    pthread_mutex_lock(&k->mu);
    snprintf(k->stream, sizeof(k->stream), "%.*s", (int)sid.n, sid.p);
    bool cancelled = k->cancelled;
    pthread_mutex_unlock(&k->mu);
    hreply_free(&rep);
    if (cancelled) { /* named before its stream was known: stop it here */
        cancel_stream(h, k->key, k->sandbox, k->stream);
        return NULL;
    }
    sbx_buf out[2];
    sbx_buf_init(&out[0]);
    sbx_buf_init(&out[1]);
    int exit_code = -1;
    long progress = 0;
    int64_t after = 0;
    json_t *res = NULL;
    bool done = false;
    while (!done && !res && !atomic_load(&h->stopping)) {
        sbx_enc e;
        char *ra;
        size_t rl;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "streamId", k->stream);
        sbx_enc_kint(&e, "after", after);
        sbx_enc_kint(&e, "waitMs", MCP_READ_WAIT_MS);
        sbx_enc_end(&e);
        if (sbx_enc_finish(&e, &ra, &rl) != 0) {
            res = sbx_mcp_tool_error("INTERNAL_ERROR", "cannot encode stream.read");
            break;
        }
        int rc = http_call_sync(h, k->key, "stream.read", k->sandbox, ra, rl,
                                MCP_READ_WAIT_MS + 10000, &rep, code, msg, sizeof(msg));
        free(ra);
        if (rc != 0) {
            res = call_error(code, msg);
            break;
        }
        const msgpack_object *evs = NULL;
        sbx_wire_get_bool(rep.result, "done", &done);
        int64_t next = 0;
        if (sbx_wire_get_i64(rep.result, "next", &next) == 0 && next > after)
            after = next;
        if (sbx_wire_get_array(rep.result, "events", &evs) == 0) {
            for (uint32_t i = 0; i < evs->via.array.size; i++) {
                const msgpack_object *ev = &evs->via.array.ptr[i];
                sbx_str type = SBX_STR(""), data;
                int64_t v;
                sbx_wire_get_str(ev, "type", &type);
                if (sbx_wire_get_i64(ev, "seq", &v) == 0 && v > after)
                    after = v;
                int which = sbx_str_eq(type, "stdout") ? 0 : sbx_str_eq(type, "stderr") ? 1 : -1;
                if (which >= 0 && sbx_wire_get_bin(ev, "data", &data) == 0) {
                    sbx_buf_append(&out[which], data.p, data.n);
                    if (token)
                        call_send(k, sbx_mcp_progress(token, ++progress, data.p, data.n));
                }
                if (sbx_wire_get_i64(ev, "exitCode", &v) == 0)
                    exit_code = (int)v;
                const msgpack_object *eo = NULL, *ctx = NULL;
                if (sbx_str_eq(type, "error") && sbx_wire_get_map(ev, "error", &eo) == 0) {
                    sbx_str cd = SBX_STR("INTERNAL_ERROR"), t = SBX_STR("");
                    sbx_wire_get_str(eo, "code", &cd);
                    sbx_wire_get_str(eo, "message", &t);
                    /* `exit N` in the session: the command's exit code, as a plain exec */
                    if (sbx_str_eq(cd, "SESSION_TERMINATED") &&
                        sbx_wire_get_map(eo, "context", &ctx) == 0 &&
                        sbx_wire_get_i64(ctx, "exitCode", &v) == 0) {
                        exit_code = (int)v;
                    } else if (!res) {
                        snprintf(code, sizeof(code), "%.*s", (int)cd.n, cd.p);
                        snprintf(msg, sizeof(msg), "%.*s", (int)t.n, t.p);
                        res = call_error(code, msg);
                    }
                }
            }
        }
        hreply_free(&rep);
        pthread_mutex_lock(&k->mu);
        cancelled = k->cancelled;
        pthread_mutex_unlock(&k->mu);
        if (cancelled)
            break;
    }
    if (!res && !done)
        res = sbx_mcp_tool_error("SHARD_UNAVAILABLE", "the gateway is shutting down");
    if (!res) {
        size_t l0, l1;
        char *s0 = sbx_utf8_sanitize(out[0].p ? out[0].p : "", out[0].len, &l0);
        char *s1 = sbx_utf8_sanitize(out[1].p ? out[1].p : "", out[1].len, &l1);
        res = sbx_mcp_tool_ok(sbx_mcp_exec_result(exit_code, s0, l0, s1, l1));
        free(s0);
        free(s1);
    }
    sbx_buf_free(&out[0]);
    sbx_buf_free(&out[1]);
    return res;
}

/* The tool's result, or NULL with a JSON-RPC error in *rpc (unknown tool). */
static json_t *
run_tool(struct mcp_call *k, int *rpc)
{
    const char *name = json_string_value(json_object_get(k->params, "name"));
    const struct sbx_mcp_tool *t = sbx_mcp_tool_find(name);
    const struct sbx_op_def *op = t ? sbx_op_find(t->op, strlen(t->op)) : NULL;
    if (!op) {
        *rpc = -32602;
        return NULL;
    }
    json_t *in = json_object_get(k->params, "arguments");
    if (in && !json_is_object(in))
        return sbx_mcp_tool_error("VALIDATION_FAILED", "arguments must be an object");
    const char *sandbox = NULL;
    if (op->flags & SBX_OP_SANDBOX) {
        json_t *sb = json_object_get(in, "sandbox");
        char why[160];
        if (!json_is_string(sb) || json_string_length(sb) >= sizeof(k->sandbox))
            return sbx_mcp_tool_error("VALIDATION_FAILED", "'sandbox' (a sandbox ID) is required");
        snprintf(k->sandbox, sizeof(k->sandbox), "%s", json_string_value(sb));
        if (sbx_id_check(k->sandbox, strlen(k->sandbox), why, sizeof(why)) != 0)
            return sbx_mcp_tool_error("VALIDATION_FAILED", why);
        sandbox = k->sandbox;
    }
    json_t *args = in ? json_deep_copy(in) : json_object();
    json_object_del(args, "sandbox");
    sbx_enc e;
    char *ab = NULL;
    size_t alen = 0;
    sbx_enc_init(&e);
    int rc = sbx_json_to_msgpack(args, &e);
    json_decref(args);
    if (sbx_enc_finish(&e, &ab, &alen) != 0 || rc != 0) {
        free(ab);
        return sbx_mcp_tool_error("VALIDATION_FAILED", "the arguments cannot be encoded");
    }
    json_t *out;
    if (op->id == SBX_OPID_EXEC) {
        out = run_exec(k, ab, alen);
    } else {
        char code[64] = "", msg[1024] = "";
        struct hreply rep;
        if (http_call_sync(k->h, k->key, op->name, sandbox, ab, alen, k->h->conf.timeout, &rep,
                           code, msg, sizeof(msg)) != 0) {
            out = call_error(code, msg);
        } else {
            json_t *res = sbx_json_from_msgpack(rep.result);
            hreply_free(&rep);
            if (!json_is_object(res)) {
                json_decref(res);
                res = json_object();
            }
            out = sbx_mcp_tool_ok(res);
        }
    }
    free(ab);
    return out;
}

static void *
call_main(void *arg)
{
    struct mcp_call *k = arg;
    struct mcp_front *f = k->h->mcp;
    int rpc = 0;
    json_t *res = run_tool(k, &rpc);
    pthread_mutex_lock(&f->mu);
    for (struct mcp_call **p = &f->calls; *p; p = &(*p)->next)
        if (*p == k) {
            *p = k->next;
            break;
        }
    f->ncalls--;
    pthread_mutex_unlock(&f->mu);
    pthread_mutex_lock(&k->mu);
    bool cancelled = k->cancelled;
    pthread_mutex_unlock(&k->mu);
    /* A cancelled request gets no answer (MCP "Cancellation"). */
    if (cancelled)
        json_decref(res);
    else if (res)
        call_send(k, sbx_mcp_result(k->id, res));
    else
        call_send(k, sbx_mcp_error(k->id, rpc, "Unknown tool"));
    pthread_mutex_lock(&k->mu);
    k->done = true;
    wake(k);
    pthread_mutex_unlock(&k->mu);
    struct sbx_http *h = k->h;
    call_unref(k);
    http_worker_leave(h);
    return NULL;
}

static ssize_t
call_reader(void *cls, uint64_t pos, char *buf, size_t max)
{
    struct mcp_call *k = cls;
    (void)pos;
    pthread_mutex_lock(&k->mu);
    ssize_t n = 0;
    if (k->off < k->out.len) {
        n = (ssize_t)SBX_MIN(max, k->out.len - k->off);
        memcpy(buf, k->out.p + k->off, (size_t)n);
        k->off += (size_t)n;
        if (k->off == k->out.len)
            k->out.len = k->off = 0;
    } else if (k->done) {
        n = MHD_CONTENT_READER_END_OF_STREAM;
    } else {
        k->suspended = true;
        MHD_suspend_connection(k->c);
    }
    pthread_mutex_unlock(&k->mu);
    return n;
}

static void
call_response_free(void *cls)
{
    struct mcp_call *k = cls;
    pthread_mutex_lock(&k->mu);
    k->conn_gone = true;
    pthread_mutex_unlock(&k->mu);
    call_unref(k);
}

static enum MHD_Result
start_call(struct sbx_http *h, struct MHD_Connection *c, const char *sid, const char *key,
           json_t *id, json_t *params)
{
    struct mcp_front *f = h->mcp;
    pthread_mutex_lock(&f->mu);
    bool full = f->ncalls >= MCP_MAX_CALLS;
    pthread_mutex_unlock(&f->mu);
    if (full)
        return queue_msg(h, c, MHD_HTTP_OK,
                         sbx_mcp_result(id, sbx_mcp_tool_error(
                                                "RESOURCE_BUSY",
                                                "too many tool calls run at once; try again")),
                         NULL);
    struct mcp_call *k = sbx_xcalloc(1, sizeof(*k));
    k->h = h;
    k->c = c;
    snprintf(k->sid, sizeof(k->sid), "%s", sid);
    snprintf(k->key, sizeof(k->key), "%s", key);
    k->id = json_deep_copy(id);
    k->params = json_is_object(params) ? json_deep_copy(params) : json_object();
    const char *acc = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Accept");
    k->sse = json_object_get(json_object_get(k->params, "_meta"), "progressToken") && acc &&
             strstr(acc, "text/event-stream");
    pthread_mutex_init(&k->mu, NULL);
    sbx_buf_init(&k->out);
    k->refs = 2; /* the worker's and the response's */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 64 * 1024,
                                                               call_reader, k, call_response_free);
    if (!r) {
        k->refs = 1;
        call_unref(k);
        return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type",
                            k->sse ? "text/event-stream; charset=utf-8" : "application/json");
    if (k->sse) {
        MHD_add_response_header(r, "Cache-Control", "no-cache");
        MHD_add_response_header(r, "X-Accel-Buffering", "no");
    }
    http_add_common_headers(r, h->keys != NULL);
    pthread_mutex_lock(&f->mu);
    k->next = f->calls;
    f->calls = k;
    f->ncalls++;
    pthread_mutex_unlock(&f->mu);
    http_worker_enter(h);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    if (pthread_create(&th, &at, call_main, k) != 0)
        call_main(k); /* no thread: run it here (it answers before the reader runs) */
    pthread_attr_destroy(&at);
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ret;
}

/* notifications/cancelled: mark the named call of the session; stop its
 * command if it runs one (else run_exec stops it once started). */
static void
cancel(struct sbx_http *h, const char *sid, const json_t *params)
{
    struct mcp_front *f = h->mcp;
    json_t *rid = json_object_get(params, "requestId");
    char stream[128] = "", sandbox[SBX_ID_MAX + 2] = "", key[SBX_HTTP_KEY_MAX + 1] = "";
    pthread_mutex_lock(&f->mu);
    for (struct mcp_call *k = f->calls; rid && k; k = k->next) {
        if (strcmp(k->sid, sid) || !json_equal(k->id, rid))
            continue;
        pthread_mutex_lock(&k->mu);
        k->cancelled = true;
        snprintf(stream, sizeof(stream), "%s", k->stream);
        pthread_mutex_unlock(&k->mu);
        snprintf(sandbox, sizeof(sandbox), "%s", k->sandbox);
        snprintf(key, sizeof(key), "%s", k->key);
    }
    pthread_mutex_unlock(&f->mu);
    cancel_stream(h, key, sandbox, stream);
}

/* DELETE: end the session and stop its execs. */
static enum MHD_Result
end_session(struct sbx_http *h, struct MHD_Connection *c, const char *sid, const char *key)
{
    struct mcp_front *f = h->mcp;
    pthread_mutex_lock(&f->mu);
    struct mcp_session **p = &f->sessions;
    while (*p && strcmp((*p)->id, sid))
        p = &(*p)->next;
    bool found = *p && !strcmp((*p)->key, key);
    if (found) {
        struct mcp_session *s = *p;
        *p = s->next;
        free(s);
        f->nsessions--;
    }
    pthread_mutex_unlock(&f->mu);
    if (!found)
        return queue_text(h, c, MHD_HTTP_NOT_FOUND, NULL, NULL, NULL);
    /* Cancel its calls one at a time (each stream.cancel is a call). */
    for (;;) {
        json_t *rid = NULL;
        pthread_mutex_lock(&f->mu);
        for (struct mcp_call *k = f->calls; k && !rid; k = k->next) {
            pthread_mutex_lock(&k->mu);
            if (!strcmp(k->sid, sid) && !k->cancelled)
                rid = json_incref(k->id);
            pthread_mutex_unlock(&k->mu);
        }
        pthread_mutex_unlock(&f->mu);
        if (!rid)
            break;
        json_t *params = json_pack("{s:o}", "requestId", rid);
        cancel(h, sid, params);
        json_decref(params);
    }
    return queue_text(h, c, MHD_HTTP_NO_CONTENT, NULL, NULL, NULL);
}

/* ------------------------------------------------------------------------------ */
/* The endpoint. */

bool
mcp_match(const char *url)
{
    return !strcmp(url, "/mcp") || !strcmp(url, "/mcp/");
}

/* Whether the gateway accepts key (keys on): a `list` of IDs only. */
static bool
key_accepted(struct sbx_http *h, const char *key)
{
    static const char args[] = "\x81\xa7idsOnly\xc3"; /* {idsOnly: true} */
    char code[64], msg[256];
    struct hreply rep;
    if (http_call_sync(h, key, "list", NULL, args, sizeof(args) - 1, 10000, &rep, code, msg,
                       sizeof(msg)) == 0) {
        hreply_free(&rep);
        return true;
    }
    return strcmp(code, "UNAUTHORIZED") && strcmp(code, "PERMISSION_DENIED");
}

/* One whole POSTed message. */
static enum MHD_Result
handle_post(struct mcp_req *q, struct MHD_Connection *c)
{
    struct sbx_http *h = q->h;
    struct mcp_front *f = h->mcp;
    if (q->too_large)
        return queue_msg(h, c, MHD_HTTP_CONTENT_TOO_LARGE,
                         sbx_mcp_error(NULL, -32600, "the message is too large"), NULL);
    json_error_t je;
    json_t *msg = json_loadb(q->body.p ? q->body.p : "", q->body.len, 0, &je);
    if (!msg)
        return queue_msg(h, c, MHD_HTTP_BAD_REQUEST, sbx_mcp_error(NULL, -32700, "Parse error"),
                         NULL);
    json_t *id = json_object_get(msg, "id");
    const char *method = json_string_value(json_object_get(msg, "method"));
    const char *ver = json_string_value(json_object_get(msg, "jsonrpc"));
    json_t *params = json_object_get(msg, "params");
    const char *sid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Session-Id");
    enum MHD_Result ret;
    if (json_is_array(msg)) {
        ret = queue_msg(h, c, MHD_HTTP_BAD_REQUEST,
                        sbx_mcp_error(NULL, -32600, "batches are not supported"), NULL);
    } else if (!json_is_object(msg) || !ver || strcmp(ver, "2.0") ||
               (id && !json_is_string(id) && !json_is_integer(id))) {
        ret = queue_msg(h, c, MHD_HTTP_BAD_REQUEST,
                        sbx_mcp_error(json_is_object(msg) ? id : NULL, -32600, "Invalid Request"),
                        NULL);
    } else if (method && id && !strcmp(method, "initialize")) {
        if (h->keys && !key_accepted(h, q->key)) {
            ret = queue_msg(h, c, MHD_HTTP_UNAUTHORIZED,
                            sbx_mcp_error(id, -32001, "UNAUTHORIZED: the API key is not valid"),
                            NULL);
        } else {
            char nsid[MCP_SID_LEN + 1] = "";
            pthread_mutex_lock(&f->mu);
            struct mcp_session *s = session_new(f, q->key);
            if (s)
                snprintf(nsid, sizeof(nsid), "%s", s->id);
            pthread_mutex_unlock(&f->mu);
            ret = s ? queue_msg(h, c, MHD_HTTP_OK, sbx_mcp_result(id, sbx_mcp_initialize(params)),
                                nsid)
                    : queue_msg(h, c, MHD_HTTP_SERVICE_UNAVAILABLE,
                                sbx_mcp_error(id, -32000, "too many MCP sessions"), NULL);
        }
    } else if (!sid) {
        ret = queue_msg(h, c, MHD_HTTP_BAD_REQUEST,
                        sbx_mcp_error(id, -32600,
                                      "an Mcp-Session-Id header is required (initialize first)"),
                        NULL);
    } else {
        pthread_mutex_lock(&f->mu);
        struct mcp_session *s = session_find(f, sid);
        bool ok = s && !strcmp(s->key, q->key);
        if (ok)
            s->used_ms = sbx_mono_ms();
        pthread_mutex_unlock(&f->mu);
        if (!ok)
            ret = queue_msg(h, c, MHD_HTTP_NOT_FOUND,
                            sbx_mcp_error(id, -32001, "no such session (initialize again)"), NULL);
        else if (!method || !id) { /* a response or a notification */
            if (method && !strcmp(method, "notifications/cancelled"))
                cancel(h, sid, params);
            ret = queue_text(h, c, MHD_HTTP_ACCEPTED, NULL, NULL, NULL);
        } else if (!strcmp(method, "tools/call"))
            ret = start_call(h, c, sid, q->key, id, params);
        else if (!strcmp(method, "tools/list"))
            ret = queue_msg(h, c, MHD_HTTP_OK, sbx_mcp_result(id, json_deep_copy(f->tools)), NULL);
        else if (!strcmp(method, "ping"))
            ret = queue_msg(h, c, MHD_HTTP_OK, sbx_mcp_result(id, json_object()), NULL);
        else
            ret = queue_msg(h, c, MHD_HTTP_OK, sbx_mcp_error(id, -32601, "Method not found"),
                            NULL);
    }
    json_decref(msg);
    return ret;
}

enum MHD_Result
mcp_access(struct sbx_http *h, struct MHD_Connection *c, const char *method,
           const char *upload_data, size_t *upload_data_size, void **con_cls)
{
    struct mcp_req *q = *con_cls;
    if (!q) { /* the headers */
        if (strcmp(method, "POST") && strcmp(method, "DELETE"))
            return queue_text(h, c, MHD_HTTP_METHOD_NOT_ALLOWED, NULL, NULL, NULL);
        char key[SBX_HTTP_KEY_MAX + 1];
        http_presented_key(c, key);
        if (h->keys && !key[0])
            return queue_msg(h, c, MHD_HTTP_UNAUTHORIZED,
                             sbx_mcp_error(NULL, -32001,
                                           "UNAUTHORIZED: Authorization: Bearer <key> is required"),
                             NULL);
        if (!strcmp(method, "DELETE")) {
            const char *sid = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Mcp-Session-Id");
            if (!sid)
                return queue_text(h, c, MHD_HTTP_BAD_REQUEST, NULL, NULL, NULL);
            return end_session(h, c, sid, key);
        }
        /* Keyless: only a body no page can send cross-origin without a
         * pre-flight (see the header comment). */
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Type");
        if (!ct || strncasecmp(ct, "application/json", 16))
            return queue_msg(h, c, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE,
                             sbx_mcp_error(NULL, -32600,
                                           "a POST to /mcp must be Content-Type: application/json"),
                             NULL);
        q = sbx_xcalloc(1, sizeof(*q));
        q->kind = HS_MCP;
        q->h = h;
        sbx_buf_init(&q->body);
        snprintf(q->key, sizeof(q->key), "%s", key);
        *con_cls = q;
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (q->body.len + *upload_data_size > (size_t)h->conf.max_body)
            q->too_large = true;
        else
            sbx_buf_append(&q->body, upload_data, *upload_data_size);
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (q->answered)
        return MHD_YES;
    q->answered = true;
    return handle_post(q, c);
}

void
mcp_completed(void *state)
{
    struct mcp_req *q = state;
    sbx_buf_free(&q->body);
    free(q);
}
