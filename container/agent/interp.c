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
 *
 * This file holds the language table, the runs of a context (queue,
 * interrupt, timeout, the reply of a run) and the context.* operations,
 * called by main.c's dispatch; the driver protocol is interp_driver.c,
 * result shaping interp_result.c, the fork server and pools interp_pool.c
 * (interp_int.h).  One loop thread.
 */
#include "interp_int.h"

static void ctx_destroy(struct context *c);

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
        interp_driver_kill(c->drv);
        interp_driver_died(c->drv, "it did not stop within 2 s of an interrupt and was killed");
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
        interp_driver_unpause(c->drv);
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

void
interp_run_next(struct context *c)
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
    interp_req_pump(c->drv);
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

void
interp_run_finish(struct context *c, const char *status)
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
        interp_run_free(r);
        if (!dead) {
            interp_run_next(c);
            interp_pool_refill(a, c->lang);
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
        interp_run_free(r);
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
        interp_logacc_encode(&e, &r->logs[0]);
        sbx_enc_str(&e, "stderr");
        interp_logacc_encode(&e, &r->logs[1]);
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
    interp_run_free(r);
    interp_run_next(c);
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
    interp_logacc_init(&r->logs[0], cap);
    interp_logacc_init(&r->logs[1], cap);
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
    interp_run_next(c);
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
           struct agent_req *init_req, sbx_err_t *err)
{
    struct interp *in = IS(a);
    /* A warm driver unless the envVars must be there at start; a pool that
     * gave a ready one is refilled now (interp_pool_refill), otherwise once this
     * context's driver is up (the starts would compete with it). */
    bool own = interp_env_needs_start(KIND(lang), env);
    struct driver *d = own ? NULL : interp_pool_take(a, lang);
    bool refill = d && d->ready;
    if (!d && !(d = interp_driver_spawn(a, lang, own ? env : NULL, err)))
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
        interp_pool_refill(a, lang);
    return c;
}

void
agent_op_context_create(struct agent *a, struct agent_req *r)
{
    sbx_str lang = SBX_STR("python"), cwd = {0};
    const msgpack_object *env = NULL;
    _cleanup_err_ sbx_err_t err = NULL;
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
    if (agent_env_check(env, false, &err) != 0) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "envVars: %s", sbx_err_msg(err));
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
    if (!ctx_create(a, l, id, cwds, env, r, &err))
        agent_reply_err(a, r, l == L_PY ? SBX_E_PYTHON_NA : SBX_E_JAVASCRIPT_NA, "%s",
                        sbx_err_msg(err));
}

/* The reader of a streamed run caught up: read the driver again. */
static void
run_stream_resume(struct stream *st, void *arg)
{
    struct run *r = arg;
    (void)st;
    if (r->ctx->cur == r)
        interp_driver_unpause(r->ctx->drv);
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
    interp_run_free(r);
}

static const struct stream_ops run_stream_ops = {run_stream_resume, run_stream_cancel};

static void
run_common(struct agent *a, struct agent_req *req, bool stream)
{
    sbx_str code, cid = {0}, lang = {0};
    int64_t tmo = 60000; /* the SDK's runCode default */
    _cleanup_err_ sbx_err_t err = NULL;
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
        if (!c && !(c = ctx_create(a, l, id, "/workspace", NULL, NULL, &err))) {
            agent_reply_err(a, req, l == L_PY ? SBX_E_PYTHON_NA : SBX_E_JAVASCRIPT_NA, "%s",
                            sbx_err_msg(err));
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
        interp_driver_kill(d);
        d->dead = true;
        interp_driver_free(d);
    }
    snprintf(c->dead_why, sizeof(c->dead_why), "the context was deleted");
    c->dead = true;
    if (c->cur)
        interp_run_finish(c, "dead");
    while (c->q_head) {
        struct run *r = c->q_head;
        c->q_head = r->next;
        c->cur = r;
        interp_run_finish(c, "dead");
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
        interp_driver_kill(d);
        d->dead = true;
        interp_driver_free(d);
    }
    interp_zygote_gone(a, false);
    for (int k = 0; k < K_N; k++)
        sbx_loop_cancel(a->loop, in->refill[k].timer);
    free(in);
    a->interp = NULL;
}
