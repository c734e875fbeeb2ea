/*
 * main.c — sbx-agent: PID 1 of a sandbox.  Not a user command; container/
 * spawn.c starts it (see agent.h for its life).
 *
 * Channel protocol (fd 3, length-prefixed frames, runtime/frame.h):
 *   shard → agent   { "t": <uint tag>, "op": "exec", "a": { …args… } }
 *   agent → shard   { "t": tag, "ok": true,  "r": { …result… } }
 *                   { "t": tag, "ok": false, "e": { code, message, context } }
 * Tags are chosen by the shard and echoed; requests are read and started in
 * arrival order, and may complete in any order (a session serializes its
 * own commands; different sessions and fresh commands run in parallel).
 * The first frame is the configuration (setup.c); the agent answers it with
 * { "ready": true } or { "ready": false, "step": "…", "errno": N }.
 *
 * Frames from the shard are trusted but still decoded with the hostile-input
 * checks of runtime/wire.h; the shard in turn treats everything the agent
 * sends as untrusted, since tenant code shares the sandbox with it.
 */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/id.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "ops_gen.h"
#include "stream.h"

#define AGENT_MAX_FRAME SBX_WIRE_MAX_FRAME
#define AGENT_MAX_BACKLOG (256u << 20) /* bytes queued to a shard that stopped reading */

/* ------------------------------------------------------------------------------ */
/* Environment arrays. */

static bool
env_key_eq(const char *entry, const char *key, size_t kn)
{
    return strncmp(entry, key, kn) == 0 && entry[kn] == '=';
}

const char *
agent_env_get(char *const *env, const char *key)
{
    size_t kn = strlen(key);
    for (char *const *p = env; p && *p; p++)
        if (env_key_eq(*p, key, kn))
            return *p + kn + 1;
    return NULL;
}

char **
agent_env_merge(char *const *base, const msgpack_object *ov)
{
    size_t n = 0;
    for (char *const *p = base; p && *p; p++)
        n++;
    size_t extra = ov ? ov->via.map.size : 0;
    char **env = sbx_xcalloc(n + extra + 1, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        env[k++] = sbx_xstrdup(base[i]);
    for (size_t i = 0; i < extra; i++) {
        const msgpack_object_kv *kv = &ov->via.map.ptr[i];
        sbx_str key, val;
        /* Not every caller validates its map (session.create does not): a
         * name with '=' would make a second entry for another name, one
         * with a NUL would let strncmp below match a shorter entry and read
         * past its end (found by tests/fuzz/fuzz_agent.c). */
        if (sbx_wire_obj_str(&kv->key, &key) != 0 || key.n == 0 || memchr(key.p, '=', key.n) ||
            memchr(key.p, '\0', key.n))
            continue;
        /* Remove an existing entry of this name. */
        for (size_t j = 0; j < k; j++) {
            if (strncmp(env[j], key.p, key.n) == 0 && env[j][key.n] == '=') {
                free(env[j]);
                env[j] = env[--k];
                env[k] = NULL;
                break;
            }
        }
        if (kv->val.type == MSGPACK_OBJECT_NIL || sbx_wire_obj_str(&kv->val, &val) != 0)
            continue; /* nil unsets */
        char *e = sbx_xmalloc(key.n + val.n + 2);
        memcpy(e, key.p, key.n);
        e[key.n] = '=';
        memcpy(e + key.n + 1, val.p, val.n);
        e[key.n + 1 + val.n] = '\0';
        env[k++] = e;
    }
    env[k] = NULL;
    return env;
}

int
agent_env_check(const msgpack_object *env, bool shell_names, sbx_err_t *err)
{
    int rc = 0;
    for (uint32_t i = 0; env && rc == 0 && i < env->via.map.size; i++) {
        const msgpack_object_kv *kv = &env->via.map.ptr[i];
        sbx_str k;
        if (sbx_wire_obj_str(&kv->key, &k) != 0 || k.n == 0 || k.n > 256 ||
            memchr(k.p, '=', k.n) || memchr(k.p, '\0', k.n)) {
            sbx_err_make(err, SBX_E_VALIDATION,
                         "'env' names must be 1-256 bytes without '=' or NUL");
            rc = SBX_E_VALIDATION;
            break;
        }
        int kn = (int)SBX_MIN(k.n, (size_t)64);
        bool name_ok = !(k.p[0] >= '0' && k.p[0] <= '9');
        for (size_t j = 0; j < k.n; j++) {
            char ch = k.p[j];
            if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                  (ch >= '0' && ch <= '9') || ch == '_'))
                name_ok = false;
        }
        if (shell_names && !name_ok) {
            sbx_err_make(err, SBX_E_VALIDATION,
                         "'env' variable '%.*s' is not a shell identifier ([A-Za-z_][A-Za-z0-9_]*), "
                         "which a session's shell cannot set; use a sessionless exec for it",
                         kn, k.p);
            rc = SBX_E_VALIDATION;
        } else if (kv->val.type != MSGPACK_OBJECT_NIL && kv->val.type != MSGPACK_OBJECT_STR) {
            sbx_err_make(err, SBX_E_VALIDATION,
                         "'env' variable '%.*s' must be a string (or nil to unset)", kn,
                         k.p);
            rc = SBX_E_VALIDATION;
        } else if (kv->val.type == MSGPACK_OBJECT_STR &&
                   memchr(kv->val.via.str.ptr, '\0', kv->val.via.str.size)) {
            sbx_err_make(err, SBX_E_VALIDATION,
                         "'env' variable '%.*s' must not contain NUL bytes", kn, k.p);
            rc = SBX_E_VALIDATION;
        }
    }
    return rc;
}

void
agent_env_free(char **env)
{
    if (!env)
        return;
    for (char **p = env; *p; p++)
        free(*p);
    free(env);
}

/* ------------------------------------------------------------------------------ */
/* Commands shown back. */

char *
agent_command_shown(const char *cmd, size_t n, bool *cut)
{
    *cut = n > AGENT_COMMAND_SHOWN;
    if (*cut) {
        /* Not inside a UTF-8 character: when the first byte left out is a
         * continuation byte, the cut goes back to that character's lead
         * byte (at most 3 bytes back; not UTF-8 at all, it stays). */
        size_t k = AGENT_COMMAND_SHOWN;
        while (k > AGENT_COMMAND_SHOWN - 4 && ((unsigned char)cmd[k] & 0xc0) == 0x80)
            k--;
        n = ((unsigned char)cmd[k] & 0xc0) == 0x80 ? AGENT_COMMAND_SHOWN : k;
    }
    return sbx_xstrndup(cmd, n);
}

/* ------------------------------------------------------------------------------ */
/* Replies. */

void
agent_req_free(struct agent_req *r)
{
    if (!r)
        return;
    sbx_wire_msg_free(&r->msg);
    free(r->frame);
    free(r);
}

static void chan_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);

/* What a log line about r names (docs/operations.md "Logs"): the client's
 * request id and sandbox the shard passed on ("rid", "sb"), and the op. */
static struct sbx_log_req
req_names(const struct agent_req *r)
{
    return (struct sbx_log_req){.rid = r->rid.p, .rid_n = r->rid.n, .sandbox = r->sandbox.p,
                                .sandbox_n = r->sandbox.n, .op = r->op, .op_n = strlen(r->op)};
}

/* The debug line every answered client request gets, with its outcome. */
static void
log_answer(const struct agent_req *r, const char *code)
{
    if (!r->rid.n || !sbx_log_enabled(SBX_LOG_DEBUG))
        return;
    struct sbx_log_req lr = req_names(r);
    sbx_log_req(SBX_LOG_DEBUG, &lr, "agent answered %s in %.3f ms", code,
                (double)(sbx_mono_us() - r->t0_us) / 1000.0);
}

static void
send_frame(struct agent *a, char *buf, size_t len)
{
    sbx_frame_queue(&a->wr, buf, len);
    free(buf);
    int rc = sbx_frame_flush(&a->wr, a->chan);
    if (rc < 0) {
        /* The shard is gone: nothing left to serve.  PID 1 exiting takes the
         * whole sandbox with it. */
        _exit(0);
    }
    if (sbx_frame_pending(&a->wr) > AGENT_MAX_BACKLOG)
        _exit(0);
    sbx_loop_modify(a->loop, a->chan_w, EPOLLIN | (rc == 0 ? EPOLLOUT : 0));
}

/*
 * Every reply leaves through reply_fits: the shard reads agent frames up to
 * SBX_WIRE_MAX_FRAME and checks them with sbx_wire_limits_reply, and it
 * treats a frame over either as hostile — it closes the channel and replaces
 * the container, and /workspace with it.  A result that large is not an
 * attack but an honest answer to a large question (a recursive listing of a
 * big tree, a list of processes with huge commands), so it is turned into a
 * RESULT_TOO_LARGE error here, before it is sent.  AGENT_MAX_REPLY leaves
 * room for what the shard adds when it wraps the result for the client
 * (request id, containerRestarted, sandboxId), so the client-facing reply
 * stays under the transport cap of the gateway's and client's sockets too.
 */
#define AGENT_MAX_REPLY (SBX_WIRE_MAX_FRAME - (64u << 10))

static bool
reply_fits(const char *buf, size_t len)
{
    return len <= AGENT_MAX_REPLY && sbx_wire_check(buf, len, &sbx_wire_limits_reply) == 0;
}

/* The reply to r (not yet freed) is too large: say so instead. */
static void
reply_too_large(struct agent *a, struct agent_req *r, size_t bytes)
{
    sbx_werr w;
    sbx_werr_init(&w, SBX_E_RESULT_TOO_LARGE,
                  "the result of %s (%zu bytes, or too many values) exceeds what one reply "
                  "can carry (%u bytes); ask for less",
                  r->op, bytes, AGENT_MAX_REPLY);
    sbx_enc_kstr(sbx_werr_ctx(&w), "operation", r->op);
    sbx_enc_kint(sbx_werr_ctx(&w), "bytes", (int64_t)bytes);
    sbx_enc_kint(sbx_werr_ctx(&w), "limit", AGENT_MAX_REPLY);
    struct sbx_log_req lr = req_names(r);
    sbx_log_req(SBX_LOG_WARN, &lr, "agent: the result of %s is too large to send (%zu bytes)",
                r->op, bytes);
    agent_reply_werr(a, r, &w);
    sbx_werr_free(&w);
}

void
agent_reply_ok(struct agent *a, struct agent_req *r, sbx_enc *result)
{
    sbx_enc e;
    char *buf = NULL, *rbuf = NULL;
    size_t len = 0, rlen = 0;
    if (result) {
        sbx_enc_end(result);
        if (sbx_enc_finish(result, &rbuf, &rlen) != 0)
            rbuf = NULL;
        /* Checked before it is copied into the frame: at that size a second
         * copy could take the agent past the sandbox's memory limit. */
        if (rbuf && rlen > AGENT_MAX_REPLY) {
            free(rbuf);
            reply_too_large(a, r, rlen);
            return;
        }
    }
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "t");
    sbx_enc_uint(&e, r->tag);
    sbx_enc_kbool(&e, "ok", true);
    sbx_enc_str(&e, "r");
    if (rbuf) {
        sbx_enc_raw(&e, rbuf, rlen);
        free(rbuf);
    } else {
        sbx_enc_map(&e);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) != 0) {
        agent_req_free(r);
        return;
    }
    if (!reply_fits(buf, len)) {
        free(buf);
        reply_too_large(a, r, len);
        return;
    }
    log_answer(r, "OK");
    send_frame(a, buf, len);
    agent_req_free(r);
}

/* The error frame for tag: {t, ok:false, e:{code, message, context}}, the
 * context left out when with_ctx is false. */
static int
encode_err(uint64_t tag, sbx_werr *w, bool with_ctx, char **buf, size_t *len)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "t");
    sbx_enc_uint(&e, tag);
    sbx_enc_kbool(&e, "ok", false);
    sbx_enc_str(&e, "e");
    if (with_ctx) {
        sbx_enc_werr(&e, w);
    } else {
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "code", sbx_err_name(w->code));
        sbx_enc_kstr(&e, "message", w->message);
        sbx_enc_kmap(&e, "context");
        sbx_enc_kbool(&e, "contextDropped", true);
        sbx_enc_end(&e);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, buf, len);
}

void
agent_reply_werr(struct agent *a, struct agent_req *r, sbx_werr *w)
{
    char *buf;
    size_t len;
    if (encode_err(r->tag, w, true, &buf, &len) == 0) {
        /* A context can be large (SESSION_TERMINATED carries the output
         * printed before): past the limit the error goes without it. */
        if (!reply_fits(buf, len)) {
            free(buf);
            if (encode_err(r->tag, w, false, &buf, &len) != 0)
                buf = NULL;
        }
        log_answer(r, sbx_err_name(w->code));
        if (buf)
            send_frame(a, buf, len);
    }
    agent_req_free(r);
}

void
agent_reply_err(struct agent *a, struct agent_req *r, int code, const char *fmt, ...)
{
    sbx_werr w;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sbx_werr_init(&w, code, "%s", msg);
    agent_reply_werr(a, r, &w);
    sbx_werr_free(&w);
}

/* ------------------------------------------------------------------------------ */
/* Cgroup counters, asked from the shard. */

struct counters_wait {
    struct counters_wait *next;
    counters_fn fn;
    void *arg;
};

/* Answer every waiting call (in the order they asked). */
static void
counters_deliver(struct agent *a, bool ok, const struct agent_counters *now)
{
    sbx_loop_cancel(a->loop, a->cwait.timer);
    a->cwait.timer = 0;
    struct counters_wait *w = a->cwait.list;
    a->cwait.list = NULL;
    while (w) {
        struct counters_wait *n = w->next;
        w->fn(a, w->arg, ok, now);
        free(w);
        w = n;
    }
}

static void
counters_timeout(sbx_loop *l, void *arg)
{
    struct agent *a = arg;
    static const struct agent_counters none;
    (void)l;
    a->cwait.timer = 0;
    sbx_log_warn("agent: the shard did not answer a question for the cgroup counters");
    counters_deliver(a, false, &none);
}

void
agent_counters_ask(struct agent *a, counters_fn fn, void *arg)
{
    struct counters_wait *w = sbx_xcalloc(1, sizeof(*w)), **pp = &a->cwait.list;
    bool asked = a->cwait.list != NULL;
    w->fn = fn;
    w->arg = arg;
    while (*pp)
        pp = &(*pp)->next;
    *pp = w;
    if (asked)
        return;
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "t");
    sbx_enc_uint(&e, 0);
    sbx_enc_kstr(&e, "ev", "counters");
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) == 0)
        send_frame(a, buf, len);
    a->cwait.timer = sbx_loop_timer(a->loop, AGENT_COUNTERS_WAIT_MS, counters_timeout, a);
}

void
agent_counters_cancel(struct agent *a, void *arg)
{
    struct counters_wait **pp = &a->cwait.list;
    while (*pp) {
        if ((*pp)->arg == arg) {
            struct counters_wait *w = *pp;
            *pp = w->next;
            free(w);
        } else {
            pp = &(*pp)->next;
        }
    }
    /* The question stays out; its answer then finds nobody. */
}

/* counters {oomKills, pidsLimitHits}: the shard's answer (tag 0, no reply). */
void
agent_op_counters(struct agent *a, struct agent_req *r)
{
    struct agent_counters now = {0, 0};
    int64_t v;
    bool ok = sbx_wire_get_i64(r->args, "oomKills", &v) == 0 && v >= 0;
    if (ok)
        now.oom_kills = (uint64_t)v;
    ok = ok && sbx_wire_get_i64(r->args, "pidsLimitHits", &v) == 0 && v >= 0;
    if (ok)
        now.pids_hits = (uint64_t)v;
    agent_req_free(r);
    counters_deliver(a, ok, &now);
}

/* ------------------------------------------------------------------------------ */
/* Operations. */

void
agent_op_ping(struct agent *a, struct agent_req *r)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "pid", getpid());
    sbx_enc_kbool(&e, "bound", a->bound);
    agent_reply_ok(a, r, &e);
}

/* bind: a pooled sandbox is given its identity and environment. */
void
agent_op_bind(struct agent *a, struct agent_req *r)
{
    sbx_str id;
    const msgpack_object *env = NULL;
    if (sbx_wire_get_str(r->args, "sandbox", &id) != 0 || id.n == 0 ||
        id.n >= sizeof(a->sandbox)) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "bind needs 'sandbox'");
        return;
    }
    if (sbx_wire_get_map(r->args, "env", &env) == SBX_E_VALIDATION) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'env' must be a map");
        return;
    }
    sbx_str_copy(id, a->sandbox, sizeof(a->sandbox));
    if (env) {
        char **n = agent_env_merge(a->env, env);
        agent_env_free(a->env);
        a->env = n;
        /* The default session's shell started before bind: give it the env. */
        agent_session_apply_env(a, env);
    }
    a->bound = true;
    a->bound_ms = sbx_mono_ms();
    agent_reply_ok(a, r, NULL);
}

static void
exec_common(struct agent *a, struct agent_req *r, bool stream)
{
    sbx_str sid = {0};
    bool fresh = false;
    char why[160];
    sbx_wire_get_bool(r->args, "sessionless", &fresh);
    int rc = sbx_wire_get_str(r->args, "sessionId", &sid);
    if (rc == SBX_E_VALIDATION ||
        (rc == 0 && sbx_id_check_name("the session ID", sid.p, sid.n, 120, why, sizeof(why)))) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'sessionId' must be 1-120 characters of "
                                                "[A-Za-z0-9._-]");
        return;
    }
    if (fresh) {
        if (stream)
            agent_exec_fresh_stream(a, r);
        else
            agent_exec_fresh(a, r);
        return;
    }
    char id[128];
    if (sid.n)
        sbx_str_copy(sid, id, sizeof(id));
    else
        snprintf(id, sizeof(id), "default");
    agent_exec_session(a, r, id, stream);
}

void
agent_op_exec(struct agent *a, struct agent_req *r)
{
    exec_common(a, r, false);
}

void
agent_op_exec_stream(struct agent *a, struct agent_req *r)
{
    exec_common(a, r, true);
}

/* env.set {vars: {K: "v" | nil}}: the sandbox environment of sessions and
 * processes started later, and exported/unset in the default session now
 * (the SDK's setEnvVars). */
void
agent_op_env_set(struct agent *a, struct agent_req *r)
{
    const msgpack_object *vars;
    if (sbx_wire_get_map(r->args, "vars", &vars) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'vars' (a map of strings or nil) is required");
        return;
    }
    for (uint32_t i = 0; i < vars->via.map.size; i++) {
        sbx_str k;
        const msgpack_object *v = &vars->via.map.ptr[i].val;
        if (sbx_wire_obj_str(&vars->via.map.ptr[i].key, &k) != 0 || k.n == 0 ||
            memchr(k.p, '=', k.n) || memchr(k.p, '\0', k.n) ||
            (v->type != MSGPACK_OBJECT_NIL && v->type != MSGPACK_OBJECT_STR)) {
            agent_reply_err(a, r, SBX_E_VALIDATION,
                            "'vars' keys must be names without '=' and values strings or nil");
            return;
        }
    }
    char **n = agent_env_merge(a->env, vars);
    agent_env_free(a->env);
    a->env = n;
    agent_session_apply_env(a, vars);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    agent_reply_ok(a, r, &e);
}

static void
dispatch(struct agent *a, const char *p, size_t n)
{
    struct agent_req *r = sbx_xcalloc(1, sizeof(*r));
    r->frame = sbx_xmalloc(n ? n : 1);
    memcpy(r->frame, p, n);
    if (sbx_wire_decode(&r->msg, r->frame, n, &sbx_wire_limits_request) != 0) {
        free(r->frame);
        free(r);
        sbx_log_error("agent: malformed frame from the shard");
        return;
    }
    int64_t tag = 0;
    sbx_str op;
    static const msgpack_object empty = {.type = MSGPACK_OBJECT_MAP};
    if (sbx_wire_get_i64(r->msg.root, "t", &tag) != 0 || sbx_wire_get_str(r->msg.root, "op", &op) != 0) {
        agent_req_free(r);
        sbx_log_error("agent: frame without tag or op");
        return;
    }
    r->tag = (uint64_t)tag;
    r->t0_us = sbx_mono_us();
    /* Point into r->frame, which lives as long as r. */
    if (sbx_wire_get_str(r->msg.root, "rid", &r->rid) != 0)
        r->rid = (sbx_str){0};
    if (sbx_wire_get_str(r->msg.root, "sb", &r->sandbox) != 0)
        r->sandbox = (sbx_str){0};
    if (sbx_wire_get_map(r->msg.root, "a", &r->args) != 0)
        r->args = &empty;
    /* What the shard adds to a request (docs/protocol.md §6): the time it
     * still waits for the reply, and the cgroup counters when it sent it. */
    int64_t d = 0, oom = -1, pids = -1;
    const msgpack_object *cg = NULL;
    if (sbx_wire_get_i64(r->msg.root, "d", &d) == 0 && d > 0)
        r->deadline_ms = sbx_mono_ms() + d;
    if (sbx_wire_get_map(r->msg.root, "cg", &cg) == 0 && sbx_wire_get_i64(cg, "oom", &oom) == 0 &&
        sbx_wire_get_i64(cg, "pids", &pids) == 0 && oom >= 0 && pids >= 0) {
        r->have_cg = true;
        r->cg.oom_kills = (uint64_t)oom;
        r->cg.pids_hits = (uint64_t)pids;
    }
    sbx_str_copy(op, r->op, sizeof(r->op));
    for (const struct agent_op *o = agent_ops; o->name; o++) {
        if (sbx_str_eq(op, o->name)) {
            o->fn(a, r);
            return;
        }
    }
    agent_reply_err(a, r, SBX_E_UNKNOWN_OP, "the agent does not know operation '%.*s'",
                    (int)op.n, op.p);
}

static void
chan_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct agent *a = arg;
    (void)l;
    if (ev & EPOLLOUT) {
        int rc = sbx_frame_flush(&a->wr, fd);
        if (rc < 0)
            _exit(0);
        if (rc == 1)
            sbx_loop_modify(a->loop, a->chan_w, EPOLLIN);
    }
    if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    ssize_t got = sbx_frame_read(&a->rd, fd);
    if (got == 0 || (got < 0 && got != -EAGAIN))
        _exit(0); /* the shard closed the channel: stop the sandbox */
    const char *p;
    size_t n;
    int k;
    while ((k = sbx_frame_next(&a->rd, &p, &n)) == 1)
        dispatch(a, p, n);
    if (k < 0)
        _exit(0);
}

static void
sig_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct agent *a = arg;
    struct signalfd_siginfo si;
    (void)l;
    (void)ev;
    while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
        ;
    /* PID 1 reaps every orphan; ours are matched to their job or session. */
    for (;;) {
        int st;
        pid_t pid = waitpid(-1, &st, WNOHANG);
        if (pid <= 0)
            break;
        agent_job_reaped(a, pid, st);
        agent_sessions_reaped(a, pid, st);
        agent_procs_reaped(a, pid, st);
        agent_interp_reaped(a, pid, st);
        agent_terms_reaped(a, pid, st);
    }
}

/* ------------------------------------------------------------------------------ */

static void
gc_cb(sbx_loop *l, void *arg)
{
    agent_streams_gc(arg);
    agent_sessions_trim(arg);
    sbx_loop_timer(l, 10000, gc_cb, arg);
}

static void
report_setup(int fd, int rc, const char *why)
{
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "ready", rc == 0);
    if (rc) {
        sbx_enc_kstr(&e, "step", why);
        sbx_enc_kint(&e, "errno", -rc);
        sbx_enc_kstr(&e, "message", rc < 0 && rc > -4096 ? strerror(-rc) : sbx_err_message(rc));
    }
    sbx_enc_kint(&e, "pid", getpid());
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) == 0) {
        sbx_frame_send_blocking(fd, buf, len);
        free(buf);
    }
}

#if defined(__SANITIZE_ADDRESS__)
/* The ASan build of the agent lives inside the sandbox's memory limit: a
 * small quarantine (the default 256 MiB would be most of it), no leak check at
 * exit (PID 1 exits by being killed).  Read by the ASan runtime at start-up
 * (sanitizer_common's documented hook); ASAN_OPTIONS still overrides. */
const char *__asan_default_options(void);
const char *
__asan_default_options(void)
{
    /* handle_*=0: the tenant (same uid) may send PID 1 any signal; ASan's
     * handlers would turn kill -SEGV 1 into an agent crash that the release
     * build (which ignores those signals) does not have. */
    return "detect_leaks=0:abort_on_error=0:quarantine_size_mb=8:malloc_context_size=10:"
           "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_abort=0";
}
#endif

int
main(int argc, char **argv)
{
    struct agent a;
    char *cfgbuf = NULL;
    size_t cfglen = 0;
    sbx_msg msg;
    _cleanup_err_ sbx_err_t err = NULL;
    char step[256];
    int rc;

    memset(&a, 0, sizeof(a));
    /* Level and format from the shard (container/spawn.c passes its own). */
    sbx_log_init("sbx-agent", -1);
    sbx_log_set_format(NULL);
    /* Exec'd from a memfd, our comm would be the fd number. */
    prctl(PR_SET_NAME, "sbx-agent", 0, 0, 0);
    signal(SIGPIPE, SIG_IGN);
    a.chan = AGENT_CHAN_FD;

    rc = sbx_frame_recv_blocking(a.chan, 1u << 20, &cfgbuf, &cfglen);
    if (rc) {
        sbx_log_error("agent: no configuration: %s", strerror(-rc));
        return 1;
    }
    rc = sbx_wire_decode(&msg, cfgbuf, cfglen, &sbx_wire_limits_request);
    if (rc == 0) {
        rc = agent_cfg_parse(&a.cfg, msg.root);
        sbx_wire_msg_free(&msg);
    }
    /* container/spawn.c: the drivers' tree at AGENT_INTERP_TREE_FD */
    a.cfg.interp_tree = argc > 1 && !strcmp(argv[1], "--interp-tree");
    free(cfgbuf);
    /* container/spawn.c sbx_container_start_image: the image's layers follow. */
    if (rc == 0 && argc > 1 && !strcmp(argv[argc - 1], "--image")) {
        rc = agent_image_recv(&a.cfg, a.chan);
        if (rc) {
            report_setup(a.chan, rc, "receive the image's layers");
            return 1;
        }
    }
    /* container/spawn.c sbx_container_start_ws: then the workspace's mount. */
    for (int i = 1; rc == 0 && i < argc; i++) {
        if (strcmp(argv[i], "--workspace"))
            continue;
        rc = agent_ws_recv(&a.cfg, a.chan);
        if (rc) {
            report_setup(a.chan, rc, "receive the workspace");
            return 1;
        }
    }
    if (rc) {
        report_setup(a.chan, rc, "parse the configuration");
        return 1;
    }
    rc = agent_setup(&a.cfg, &err);
    if (rc) {
        agent_setup_step(err, step, sizeof(step));
        sbx_log_error("agent: set-up failed at '%s': %s", step, strerror(-rc));
        report_setup(a.chan, rc, step);
        return 1;
    }
    a.env = agent_env_merge(a.cfg.env, NULL);

    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    a.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (a.sigfd < 0 || sbx_loop_new(&a.loop) != 0 || sbx_set_nonblock(a.chan, true) != 0 ||
        sbx_set_cloexec(a.chan, true) != 0) {
        report_setup(a.chan, -errno, "event loop");
        return 1;
    }
    sbx_frame_reader_init(&a.rd, AGENT_MAX_FRAME);
    sbx_frame_writer_init(&a.wr);
    report_setup(a.chan, 0, NULL);
    agent_session_prestart(&a);
    a.chan_w = sbx_loop_watch(a.loop, a.chan, EPOLLIN, chan_cb, &a);
    sbx_loop_watch(a.loop, a.sigfd, EPOLLIN, sig_cb, &a);
    sbx_loop_timer(a.loop, 10000, gc_cb, &a);
    rc = sbx_loop_run(a.loop);
    agent_sessions_free(&a);
    agent_procs_free(&a);
    agent_interp_free(&a);
    agent_terms_free(&a);
    agent_watches_free(&a);
    agent_streams_free(&a);
    while (a.cwait.list) {
        struct counters_wait *w = a.cwait.list;
        a.cwait.list = w->next;
        free(w);
    }
    return rc ? 1 : 0;
}
