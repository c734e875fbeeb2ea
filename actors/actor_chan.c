/*
 * actor_chan.c — the channel between an actor and its container's agent: a
 * socketpair of length-prefixed msgpack frames (runtime/frame.h).  Requests
 * go out tagged (actor_dispatch, actor_agent_send); replies come back by
 * tag to the ops in flight (a->inflight), and the agent's own events
 * (tag 0) are answered here.  What the agent sends is untrusted (tenant
 * code shares the sandbox): a malformed or oversized frame ends the
 * container (actor_container_died).
 *
 * Runs on the shard's loop thread: actor_on_chan is the loop's watcher of
 * the channel.  Frames queued in a->wr belong to the actor; a frame read is
 * decoded and its reply handed to shard_reply_* (which consume the op).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "ops_gen.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* Requests to the agent. */

/*
 * Send {t: tag, op, a: args (a decoded map) or args_enc (an open map
 * encoder, consumed) or {}} to the agent, with what only the shard knows
 * when `op` is given: "cg", the sandbox's cgroup counters when the request
 * left (op->pre, for the agent to tell why a command or process ended,
 * docs/protocol.md §6), and "rid"/"sb", the client's request id and the
 * sandbox, for the agent's log lines about it.
 */
int
actor_agent_send(struct actor *a, const char *op, const msgpack_object *args, sbx_enc *args_enc,
           uint64_t tag, const struct sop *sop)
{
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "t");
    sbx_enc_uint(&e, tag);
    sbx_enc_kstr(&e, "op", op);
    if (sop && sop->req.id.n) {
        /* For the agent's log lines about it (docs/operations.md "Logs"). */
        sbx_enc_str(&e, "rid");
        sbx_enc_strn(&e, sop->req.id.p, sop->req.id.n);
        sbx_enc_kstr(&e, "sb", a->id);
    }
    int64_t dl = sop ? shard_op_deadline(sop) : 0;
    if (dl) {
        /* How long the agent has: it answers before the shard does. */
        int64_t d = dl - shard_agent_margin(sop->req.timeout_ms) - sbx_mono_ms();
        sbx_enc_kint(&e, "d", SBX_MAX(d, 1));
    }
    if (sop && sop->have_pre) {
        sbx_enc_kmap(&e, "cg");
        sbx_enc_kint(&e, "oom", (int64_t)sop->pre.oom_kills);
        sbx_enc_kint(&e, "pids", (int64_t)sop->pre.pids_max_hits);
        sbx_enc_end(&e);
    }
    sbx_enc_str(&e, "a");
    if (args)
        sbx_enc_obj(&e, args);
    else if (args_enc) {
        char *ab;
        size_t al;
        sbx_enc_end(args_enc);
        if (sbx_enc_finish(args_enc, &ab, &al) == 0) {
            sbx_enc_raw(&e, ab, al);
            free(ab);
        } else {
            sbx_enc_map(&e);
            sbx_enc_end(&e);
        }
    } else {
        sbx_enc_map(&e);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, &buf, &len) != 0)
        return SBX_E_INTERNAL;
    sbx_frame_queue(&a->wr, buf, len);
    free(buf);
    int rc = sbx_frame_flush(&a->wr, a->c.chan);
    if (rc < 0)
        return SBX_E_CONTAINER;
    sbx_loop_modify(a->sh->loop, a->w, EPOLLIN | (rc == 0 ? EPOLLOUT : 0));
    return 0;
}

void
actor_dispatch(struct actor *a, struct sop *op)
{
    /* Its deadline is (nearly) there — it waited for a container start, or
     * behind one — and the agent would have no time to use: it does not
     * run (a retry of the request id will). */
    int64_t dl = shard_op_deadline(op);
    if (dl && dl - shard_agent_margin(op->req.timeout_ms) <= sbx_mono_ms()) {
        shard_reply_err(op, SBX_E_TIMEOUT,
                        "the request's deadline (timeoutMs %lld) came before the operation "
                        "could start; it did not run",
                        (long long)op->req.timeout_ms);
        return;
    }
    /* Its request id is recorded as begun before the agent gets it, and the
     * input gate waits for that commit (actor_commit_continue): a retry after
     * a crash mid-run finds it and does not run it twice (idem.c). */
    uint64_t intent = idem_intent(op);
    if (intent) {
        a->gate = op;
        a->cw_seq = intent;
        shard_commit_wait(a);
        return;
    }
    /* No committed record and none queued (its creating write failed): one
     * is written, and the reply waits for it — else an acknowledged op on a
     * sandbox a restart or a failed destroy loses (issue 11's fill fault:
     * exec answered OK, then status SANDBOX_NOT_FOUND). */
    if (!a->durable && !actor_queued_write(a->sh, a->id))
        actor_ensure_record(a, NULL);
    op->tag = ++a->next_tag;
    op->wseq = a->last_seq; /* its reply fails if this write does (output gate) */
    /* What started now may end by the sandbox's limits: the counters before. */
    if (op->def->id == SBX_OPID_EXEC || op->def->id == SBX_OPID_EXEC_STREAM ||
        op->def->id == SBX_OPID_PROCESS_START) {
        op->have_pre = sbx_container_limit_hits(a->sh->spawner, &a->c, &op->pre) == 0;
    }
    op->sent = true; /* from here it may run (a partly written frame counts) */
    int rc = actor_agent_send(a, op->def->name, op->req.args, NULL, op->tag, op);
    if (rc) {
        shard_reply_err(op, rc, "could not reach the sandbox's agent");
        actor_container_died(a, "its channel broke");
        return;
    }
    op->next = a->inflight;
    a->inflight = op;
    shard_deadline_arm(op);
}

/* ------------------------------------------------------------------------------ */
/* Replies from the agent (untrusted: tenant code shares the sandbox). */

static struct sop *
take_inflight(struct actor *a, uint64_t tag)
{
    for (struct sop **pp = &a->inflight; *pp; pp = &(*pp)->next) {
        if ((*pp)->tag == tag) {
            struct sop *op = *pp;
            *pp = op->next;
            op->next = NULL;
            return op;
        }
    }
    return NULL;
}

/*
 * A frame the agent sends on its own (tag 0 with "ev").  "counters": it
 * asks for the sandbox's cgroup counters, which only the host can read (a
 * command or process ended and may have met a limit); the answer is the
 * internal request counters {oomKills, pidsLimitHits}.  Anything else is
 * ignored.  Costs two small cgroup file reads, at most one question in
 * flight per agent (agent_counters_ask).
 */
static void
agent_event(struct actor *a, sbx_str ev)
{
    if (!sbx_str_eq(ev, "counters") || a->cs != C_RUNNING)
        return;
    struct sbx_cgroup_stats st;
    if (sbx_container_limit_hits(a->sh->spawner, &a->c, &st) != 0)
        return; /* the agent gives up after a while and keeps the plain cause */
    sbx_enc args;
    sbx_enc_init(&args);
    sbx_enc_map(&args);
    sbx_enc_kint(&args, "oomKills", (int64_t)st.oom_kills);
    sbx_enc_kint(&args, "pidsLimitHits", (int64_t)st.pids_max_hits);
    if (actor_agent_send(a, "counters", NULL, &args, 0, NULL) != 0)
        actor_container_died(a, "its channel broke");
}

static void
agent_reply(struct actor *a, const msgpack_object *root)
{
    int64_t tag = 0;
    bool ok = false;
    if (sbx_wire_get_i64(root, "t", &tag) != 0)
        return;
    sbx_wire_get_bool(root, "ok", &ok);
    if (tag == 0) {
        sbx_str ev;
        if (sbx_wire_get_str(root, "ev", &ev) == 0) {
            agent_event(a, ev);
            return;
        }
        if (!ok)
            sbx_log_warn("sandbox %s: the agent refused an internal request", a->id);
        return;
    }
    struct sop *op = take_inflight(a, (uint64_t)tag);
    if (!op)
        return; /* a reply to nothing we sent: ignore */
    if (!(op->def->flags & SBX_OP_OBSERVE))
        a->last_active_ms = sbx_wall_ms();
    sbx_enc e;
    const msgpack_object *r = NULL;
    if (ok && sbx_wire_get_map(root, "r", &r) == 0) {
        /* Causes (OOM_KILLED, PIDS_LIMIT) come refined by the agent, from
         * the counters of "cg" and agent_event. */
        shard_reply_begin(op, &e);
        for (uint32_t i = 0; i < r->via.map.size; i++) {
            const msgpack_object_kv *kv = &r->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR)
                continue;
            sbx_enc_obj(&e, &kv->key);
            sbx_enc_obj(&e, &kv->val);
        }
        if (op->container_restarted)
            sbx_enc_kbool(&e, "containerRestarted", true);
        shard_reply_end(op, &e, a->last_seq);
        return;
    }
    /* An error: keep its code only if it is one of ours. */
    const msgpack_object *eo = NULL;
    sbx_str code = {0}, msg = {0};
    if (sbx_wire_get_map(root, "e", &eo) == 0) {
        sbx_wire_get_str(eo, "code", &code);
        sbx_wire_get_str(eo, "message", &msg);
    }
    int c = code.n ? sbx_err_from_name(code.p, code.n) : SBX_E_INTERNAL;
    sbx_werr w;
    sbx_werr_init(&w, c, "%.*s", (int)SBX_MIN(msg.n, 400), msg.p ? msg.p : "");
    const msgpack_object *ctx = eo ? sbx_wire_get(eo, "context") : NULL;
    if (ctx && ctx->type == MSGPACK_OBJECT_MAP) {
        for (uint32_t i = 0; i < ctx->via.map.size; i++) {
            sbx_enc_obj(sbx_werr_ctx(&w), &ctx->via.map.ptr[i].key);
            sbx_enc_obj(sbx_werr_ctx(&w), &ctx->via.map.ptr[i].val);
        }
    }
    sbx_enc_kstr(sbx_werr_ctx(&w), "sandboxId", a->id);
    /* The agent's RESOURCE_BUSY (a process ID in use, a terminal not
     * reading) says the operation did not run: its intent goes and a retry
     * runs it (idem_done), instead of OPERATION_INTERRUPTED ("may have
     * run") — the Python SDK's retry after a lost reply got that. */
    if (c == SBX_E_BUSY)
        op->sent = false;
    shard_reply_werr(op, &w);
    sbx_werr_free(&w);
}

void
actor_on_chan(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct actor *a = arg;
    (void)l;
    if (ev & EPOLLOUT) {
        int rc = sbx_frame_flush(&a->wr, fd);
        if (rc < 0) {
            actor_container_died(a, "its channel broke");
            return;
        }
        if (rc == 1)
            sbx_loop_modify(a->sh->loop, a->w, EPOLLIN);
    }
    if (!(ev & (EPOLLIN | EPOLLHUP | EPOLLERR)))
        return;
    ssize_t got = sbx_frame_read(&a->rd, fd);
    const char *p;
    size_t n;
    int k;
    while ((k = sbx_frame_next(&a->rd, &p, &n)) == 1) {
        sbx_msg m;
        if (sbx_wire_decode(&m, p, n, &sbx_wire_limits_reply) != 0) {
            actor_container_died(a, "it sent a malformed frame");
            return;
        }
        agent_reply(a, m.root);
        sbx_wire_msg_free(&m);
        if (a->cs != C_RUNNING)
            return;
    }
    if (k < 0) {
        actor_container_died(a, "it sent an oversized frame");
        return;
    }
    if (got == 0 || (got < 0 && got != -EAGAIN))
        actor_container_died(a, "its agent exited");
}
