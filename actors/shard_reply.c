/*
 * shard_reply.c — answering requests: replies (success, error), held at the
 * output gate until the writes they depend on are decided (gate.c releases
 * them), delivered to every context waiting on the request id and kept for
 * its retries (idem.c); and the request deadlines (docs/protocol.md §2).
 *
 * Runs on the shard's loop thread.  The reply functions consume the op (it
 * is freed once delivered, or owned by the held list until then) and the
 * reply buffer they are given.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* Replies and the output gate. */

void
sop_free(struct sop *op)
{
    if (!op)
        return;
    if (op->dl_timer)
        sbx_loop_cancel(op->sh->loop, op->dl_timer);
    if (op->dec.root)
        sbx_wire_msg_free(&op->dec);
    if (op->msg)
        nng_msg_free(op->msg);
    free(op);
}

static void
deliver(struct sop *op, char *buf, size_t len)
{
    int rc = idem_gate_check(op);
    if (rc) {
        /* The reply's own record committed, the operation's write did not
         * (an earlier batch failed): answered as the output gate does
         * (gate.c; op->idem_need is cleared, so this does not recur). */
        free(buf);
        shard_deliver_error(op, rc == SBX_E_STORAGE_FULL ? rc : SBX_E_STORAGE);
        return;
    }
    idem_confirm(op, buf, len); /* the write it recorded is replicated now */
    shard_metrics_reply(op);
    shard_audit_reply(op);
    for (int i = 0; i < op->nctx; i++)
        shard_sctx_send(op->ctx[i], buf, len);
    free(idem_done(op, buf, len));
    sop_free(op);
}

void
shard_deliver(struct sop *op, char *buf, size_t len)
{
    deliver(op, buf, len);
}

void
shard_reply(struct sop *op, char *buf, size_t len, uint64_t need_seq)
{
    struct shard *sh = op->sh;
    uint64_t dep = need_seq; /* the actor's write it depends on (need_seq may become later) */
    if (op->actor && (actor_write_failed(op->actor, dep) ||
                      actor_write_failed(op->actor, op->wseq))) {
        /* A write it depends on failed (and its failure is known). */
        int code = actor_write_failed(op->actor, dep) ? actor_failed_code(op->actor, dep)
                                                      : actor_failed_code(op->actor, op->wseq);
        free(buf);
        shard_deliver_error(op, code);
        return;
    }
    need_seq = idem_persist(op, buf, len, need_seq);
    if (need_seq > sh->decided || !cluster_gate_open(sh, need_seq)) {
        struct held *h = sbx_xmalloc(sizeof(*h));
        h->op = op;
        h->buf = buf;
        h->len = len;
        h->need = need_seq;
        h->dep = dep;
        h->own = op->wseq;
        h->sandbox[0] = '\0';
        if (op->actor)
            snprintf(h->sandbox, sizeof(h->sandbox), "%s", op->actor->id);
        op->actor = NULL;
        h->next = sh->held;
        sh->held = h;
        return;
    }
    deliver(op, buf, len);
}

void
shard_reply_begin(struct sop *op, sbx_enc *e)
{
    sbx_enc_init(e);
    sbx_enc_reply_ok(e, op->req.id);
}

void
shard_reply_end(struct sop *op, sbx_enc *e, uint64_t need_seq)
{
    char *buf;
    size_t len;
    sbx_enc_end(e);
    sbx_enc_end(e);
    if (sbx_enc_finish(e, &buf, &len) != 0) {
        shard_reply_err(op, SBX_E_INTERNAL, "reply to %.*s could not be encoded",
                        (int)op->req.op.n, op->req.op.p);
        return;
    }
    shard_reply(op, buf, len, need_seq);
}

void
shard_reply_werr(struct sop *op, sbx_werr *w)
{
    op->code = w->code;
    switch (w->code) {
    case SBX_E_SHARD_UNAVAILABLE:
    case SBX_E_CONTAINER:
    case SBX_E_INTERRUPTED:
    case SBX_E_WRONG_OWNER:
    case SBX_E_TIMEOUT:
    case SBX_E_STORAGE:
    case SBX_E_STORAGE_FULL:
    case SBX_E_BUSY:
        op->transient = true;
        break;
    default:
        break;
    }
    char *buf;
    size_t len;
    if (sbx_wire_reply_err(op->req.id, w, &buf, &len) != 0)
        return;
    /* Errors carry no state change of their own; they still respect the
     * gate of earlier writes of the actor (ordering). */
    shard_reply(op, buf, len, op->actor ? op->actor->last_seq : 0);
}

void
shard_reply_err(struct sop *op, int code, const char *fmt, ...)
{
    sbx_werr w;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sbx_werr_init(&w, code, "%s", msg);
    if (op->req.sandbox.n)
        sbx_enc_kstrn(sbx_werr_ctx(&w), "sandboxId", op->req.sandbox.p, op->req.sandbox.n);
    if (op->req.op.n)
        sbx_enc_kstrn(sbx_werr_ctx(&w), "operation", op->req.op.p, op->req.op.n);
    shard_reply_werr(op, &w);
    sbx_werr_free(&w);
}

/* ------------------------------------------------------------------------------ */
/* Deadlines (shard_int.h). */

int64_t
shard_deadline(int64_t timeout_ms)
{
    /* The gateway answers at T - 100 ms (T > 1 s), or 0.9 T: gateway.c. */
    return timeout_ms > 1500 ? timeout_ms - 300 : timeout_ms * 4 / 5;
}

int64_t
shard_agent_margin(int64_t timeout_ms)
{
    /* A session's timed-out command takes a moment to be stopped. */
    return timeout_ms > 5000 ? 500 : timeout_ms > 2000 ? 200 : timeout_ms / 10;
}

int64_t
shard_op_deadline(const struct sop *op)
{
    int64_t latest = 0;
    for (int i = 0; i < op->nctx; i++) {
        if (!op->ctx_deadline[i])
            return 0;
        latest = SBX_MAX(latest, op->ctx_deadline[i]);
    }
    return latest;
}

static void deadline_cb(sbx_loop *l, void *arg);

void
shard_deadline_arm(struct sop *op)
{
    struct shard *sh = op->sh;
    int64_t first = 0;
    if (op->dl_timer)
        sbx_loop_cancel(sh->loop, op->dl_timer);
    op->dl_timer = 0;
    for (int i = 0; i < op->nctx; i++) {
        if (op->ctx_deadline[i] && (!first || op->ctx_deadline[i] < first))
            first = op->ctx_deadline[i];
    }
    if (first)
        op->dl_timer = sbx_loop_timer(sh->loop, SBX_MAX(first - sbx_mono_ms(), 0), deadline_cb, op);
}

/*
 * The earliest deadline of op's waiters came.  If op is in flight at its
 * agent, those waiters get REQUEST_TIMEOUT now, before the gateway would
 * call the shard unavailable; the operation goes on (the agent bounds what
 * waits on the deadline itself, "d"), and its reply, when it comes, is kept
 * for retries of the same request id (deliver) like any other.  Anything
 * else — waiting in the mailbox or at the input gate for a container start
 * or stop, or at the output gate for a commit — is the shard's own doing:
 * the gateway's SHARD_UNAVAILABLE stays the answer for that, and dispatch
 * drops an operation whose deadline passed before it could start.
 */
static void
deadline_cb(sbx_loop *l, void *arg)
{
    struct sop *op = arg;
    int64_t now = sbx_mono_ms();
    (void)l;
    op->dl_timer = 0;
    if (!actor_inflight(op))
        return; /* dispatch arms it again */
    int expired = 0;
    for (int i = 0; i < op->nctx; i++)
        expired += op->ctx_deadline[i] && op->ctx_deadline[i] <= now;
    if (expired == 0) {
        shard_deadline_arm(op);
        return;
    }
    sbx_werr w;
    sbx_werr_init(&w, SBX_E_TIMEOUT,
                  "the request's deadline (timeoutMs %lld) came before the sandbox answered; "
                  "the operation goes on, and a retry with the same request id gets its result",
                  (long long)op->req.timeout_ms);
    if (op->req.sandbox.n)
        sbx_enc_kstrn(sbx_werr_ctx(&w), "sandboxId", op->req.sandbox.p, op->req.sandbox.n);
    sbx_enc_kstrn(sbx_werr_ctx(&w), "operation", op->req.op.p, op->req.op.n);
    sbx_enc_kint(sbx_werr_ctx(&w), "timeoutMs", op->req.timeout_ms);
    char *buf;
    size_t len;
    int rc = sbx_wire_reply_err(op->req.id, &w, &buf, &len);
    sbx_werr_free(&w);
    int k = 0;
    for (int i = 0; i < op->nctx; i++) {
        if (op->ctx_deadline[i] && op->ctx_deadline[i] <= now) {
            if (rc == 0)
                shard_sctx_send(op->ctx[i], buf, len);
            continue;
        }
        op->ctx[k] = op->ctx[i];
        op->ctx_deadline[k] = op->ctx_deadline[i];
        k++;
    }
    op->nctx = k;
    if (rc == 0)
        free(buf);
    shard_deadline_arm(op);
}
