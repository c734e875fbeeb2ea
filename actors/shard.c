/*
 * shard.c — the shard process: nng server, output gate, idempotency,
 * worker threads and the warm pool.  Actor behaviour is in actor.c.
 */
#include "shard.h"

#include <errno.h>
#include <nng/nng.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>
#include <xxhash.h>

#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "ops_gen.h"
#include "shard_int.h"

static const char *const default_etc[] = {
    "alternatives", "ssl", "ca-certificates", "ca-certificates.conf", "ld.so.cache", "ld.so.conf",
    "ld.so.conf.d", "localtime", "timezone", "mime.types", "protocols", "services", "magic",
    "magic.mime", "python3", "python3.11", "matplotlibrc", "fonts", "bash.bashrc", "profile",
    "inputrc", "terminfo", "gitconfig", "os-release", "debian_version", "perl", "xdg", NULL};

static const char *const default_env[] = {
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "HOME=/root",
    "USER=root",
    "LANG=C.UTF-8",
    "LC_ALL=C.UTF-8",
    "TERM=xterm-256color",
    "SHELL=/bin/bash",
    "PYTHONUNBUFFERED=1",
    "MPLBACKEND=Agg",
    NULL};

static char **
strv_dup(const char *const *v)
{
    size_t n = 0;
    while (v[n])
        n++;
    char **r = sbx_xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        r[i] = sbx_xstrdup(v[i]);
    return r;
}

void
sbx_shard_conf_defaults(struct sbx_shard_conf *c)
{
    memset(c, 0, sizeof(*c));
    c->name = sbx_xstrdup("s0");
    c->listen = sbx_xstrdup("ipc:///var/lib/sbx/s0.sock");
    c->data = sbx_xstrdup("/var/lib/sbx/s0");
    c->agent = NULL; /* sbxd fills in the sbx-agent next to itself */
    c->cgroup = sbx_xstrdup("auto");
    c->uid_base = 1000000000;
    c->uid_count = 65536;
    c->contexts = 1024;
    c->workers = 2;
    c->pool = 2;
    c->memory = 512ull << 20;
    c->pids = 512;
    c->cpu = 1000;
    c->disk = 1ull << 30;
    c->inodes = 262144;
    c->output_cap = 32ull << 20;
    c->setup_timeout = 10000;
    c->map_size = SBX_STORE_MAP_DEFAULT;
    c->map_max = SBX_STORE_MAP_MAX_DEFAULT;
    c->sleep_after = 10 * 60 * 1000; /* the SDK's default sleepAfter: 10m */
    c->idem_ttl = 10 * 60 * 1000;
    c->preview_domain = sbx_xstrdup("localhost:7780");
    c->cluster = sbx_xstrdup("default");
    c->lease_ttl = 10000;
    c->preview_scheme = sbx_xstrdup("http");
    c->etc = strv_dup(default_etc);
    c->env = strv_dup(default_env);
}

static void
strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

void
sbx_shard_conf_free(struct sbx_shard_conf *c)
{
    free(c->name);
    free(c->listen);
    free(c->data);
    free(c->agent);
    free(c->interp);
    free(c->cgroup);
    free(c->cgroup_base);
    free(c->relay);
    free(c->relay_secret);
    free(c->preview_domain);
    free(c->preview_scheme);
    free(c->etcd);
    free(c->cluster);
    free(c->advertise);
    strv_free(c->etc);
    strv_free(c->env);
    memset(c, 0, sizeof(*c));
}

/* ------------------------------------------------------------------------------ */
/* nng contexts.  Callbacks run on nng's threads: they only move messages and
 * post to the loop (never block, never close sockets: actors-cluster.md §1f). */

static void on_request(sbx_loop *l, void *arg);

static void
sctx_cb(void *arg)
{
    struct sctx *c = arg;
    int rv = nng_aio_result(c->aio);
    if (c->state == SCTX_SEND) {
        if (rv != 0) {
            nng_msg *m = nng_aio_get_msg(c->aio);
            if (m)
                nng_msg_free(m);
        }
        if (rv == NNG_ECLOSED)
            return;
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    if (c->state != SCTX_RECV)
        return;
    if (rv != 0) {
        if (rv == NNG_ECLOSED || rv == NNG_ECANCELED)
            return;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    c->state = SCTX_WORK;
    sbx_loop_post(c->sh->loop, on_request, c);
}

static void
sctx_send(struct sctx *c, const char *buf, size_t len)
{
    nng_msg *m;
    if (c->sh->ctx_closed)
        return; /* shutting down: the socket is gone */
    if (nng_msg_alloc(&m, len) != 0) {
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    memcpy(nng_msg_body(m), buf, len);
    nng_aio_set_msg(c->aio, m);
    c->state = SCTX_SEND;
    nng_ctx_send(c->ctx, c->aio);
}

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
    for (int i = 0; i < op->nctx; i++)
        sctx_send(op->ctx[i], buf, len);
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
        int code = op->actor->bad_code;
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
                sctx_send(op->ctx[i], buf, len);
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

/* ------------------------------------------------------------------------------ */
/* Workers: container start and stop, off the loop thread. */

static void work_done_loop(sbx_loop *l, void *arg);

static void *
worker_main(void *arg)
{
    struct shard *sh = arg;
    for (;;) {
        pthread_mutex_lock(&sh->wmu);
        while (!sh->wq_head && !sh->wstop)
            pthread_cond_wait(&sh->wcv, &sh->wmu);
        if (!sh->wq_head && sh->wstop) {
            pthread_mutex_unlock(&sh->wmu);
            break;
        }
        struct work *w = sh->wq_head;
        sh->wq_head = w->next;
        if (!sh->wq_head)
            sh->wq_tail = NULL;
        pthread_mutex_unlock(&sh->wmu);
        if (w->kind == W_START) {
            w->rc = sbx_container_start(sh->spawner, &w->lim, &w->c, w->why, sizeof(w->why));
        } else {
            sbx_container_stop(sh->spawner, &w->c);
            w->rc = 0;
        }
        sbx_loop_post(sh->loop, work_done_loop, w);
    }
    return NULL;
}

void
shard_work_submit(struct shard *sh, struct work *w)
{
    w->sh = sh;
    w->next = NULL;
    sh->busy_work++;
    pthread_mutex_lock(&sh->wmu);
    if (sh->wq_tail)
        sh->wq_tail->next = w;
    else
        sh->wq_head = w;
    sh->wq_tail = w;
    pthread_cond_signal(&sh->wcv);
    pthread_mutex_unlock(&sh->wmu);
}

static void pool_fill(struct shard *sh);

static void
work_done_loop(sbx_loop *l, void *arg)
{
    struct work *w = arg;
    struct shard *sh = w->sh;
    (void)l;
    sh->busy_work--;
    if (w->kind == W_START) {
        if (w->rc == 0) {
            sh->n_started++;
            sh->start_us_total += w->c.start_us;
        } else {
            sh->n_start_failed++;
            sbx_error("container start failed: %s", w->why);
        }
    }
    if (w->kind == W_START && !w->actor) {
        /* A pool container. */
        sh->pool_inflight--;
        if (w->rc == 0) {
            if (sh->stopping) {
                w->kind = W_STOP;
                shard_work_submit(sh, w);
                return;
            }
            struct pooled *p = sbx_xmalloc(sizeof(*p));
            p->c = w->c;
            p->next = sh->pool;
            sh->pool = p;
            sh->npool++;
            free(w);
            pool_fill(sh);
        } else {
            free(w);
        }
        return;
    }
    if (w->kind == W_STOP && !w->actor) {
        free(w);
        return;
    }
    actor_work_done(sh, w);
}

static void
pool_fill(struct shard *sh)
{
    while (!sh->stopping && sh->npool + sh->pool_inflight < sh->conf.pool) {
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_START;
        w->lim = sh->limits;
        sh->pool_inflight++;
        shard_work_submit(sh, w);
    }
}

bool
shard_pool_take(struct shard *sh, struct sbx_container *out)
{
    if (!sh->pool)
        return false;
    struct pooled *p = sh->pool;
    sh->pool = p->next;
    sh->npool--;
    *out = p->c;
    free(p);
    sh->n_pool_hits++;
    pool_fill(sh);
    return true;
}

/* ------------------------------------------------------------------------------ */
/* Shard-level operations. */

struct list_ctx {
    struct shard *sh;
    sbx_enc *e;
    size_t n;
};

static int
list_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct list_ctx *lc = arg;
    char id[64];
    if (kn == 0 || kn >= sizeof(id))
        return 0;
    memcpy(id, k, kn);
    id[kn] = '\0';
    if (!cluster_listable(lc->sh, sbx_place_partition(id, kn)))
        return 0; /* a record this shard holds but does not own */
    struct actor *a = actor_get(lc->sh, id, false);
    if (a && a->exists) {
        actor_encode_status(a, lc->e);
        lc->n++;
        return 0;
    }
    struct sbx_record r;
    if (sbx_record_decode(v, vn, &r) != 0)
        return 0;
    sbx_enc_map(lc->e);
    sbx_enc_kstr(lc->e, "id", r.id);
    sbx_enc_kstr(lc->e, "state", "stopped");
    sbx_enc_kint(lc->e, "createdAt", r.created_ms);
    sbx_enc_kint(lc->e, "generation", (int64_t)r.generation);
    sbx_enc_kstr(lc->e, "shard", lc->sh->conf.name);
    sbx_enc_end(lc->e);
    sbx_record_free(&r);
    lc->n++;
    return 0;
}

static void
op_list(struct sop *op)
{
    struct shard *sh = op->sh;
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_karray(&e, "sandboxes");
    struct list_ctx lc = {sh, &e, 0};
    int rc = sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, list_one, &lc);
    sbx_enc_end(&e);
    sbx_enc_kint(&e, "count", (int64_t)lc.n);
    if (rc) {
        sbx_enc_free(&e);
        shard_reply_err(op, SBX_E_STORAGE, "cannot list sandboxes: %s", sbx_err_message(rc));
        return;
    }
    shard_reply_end(op, &e, 0);
}

static void
op_shard_status(struct sop *op)
{
    struct shard *sh = op->sh;
    sbx_enc e;
    uint64_t batches, writes, failed;
    sbx_store_stat(sh->store, &batches, &writes, &failed);
    size_t running = 0;
    for (size_t b = 0; b < sh->nbuckets; b++)
        for (struct actor *a = sh->buckets[b]; a; a = a->hnext)
            if (a->cs == C_RUNNING)
                running++;
    shard_reply_begin(op, &e);
    sbx_enc_kmap(&e, "shard");
    sbx_enc_kstr(&e, "name", sh->conf.name);
    sbx_enc_kstr(&e, "listen", sh->conf.listen);
    sbx_enc_kstr(&e, "health", "ok");
    sbx_enc_kint(&e, "pid", getpid());
    sbx_enc_kint(&e, "uptimeMs", sbx_wall_ms() - sh->started_ms);
    sbx_enc_kint(&e, "actors", (int64_t)sh->nactors);
    sbx_enc_kint(&e, "running", (int64_t)running);
    sbx_enc_kint(&e, "pool", sh->npool);
    sbx_enc_kint(&e, "requests", (int64_t)sh->n_requests);
    sbx_enc_kint(&e, "containersStarted", (int64_t)sh->n_started);
    sbx_enc_kint(&e, "containerStartFailures", (int64_t)sh->n_start_failed);
    sbx_enc_kint(&e, "containersDied", (int64_t)sh->n_died);
    sbx_enc_kint(&e, "poolHits", (int64_t)sh->n_pool_hits);
    sbx_enc_kint(&e, "meanStartUs",
                 sh->n_started ? (int64_t)(sh->start_us_total / (int64_t)sh->n_started) : 0);
    sbx_enc_kstr(&e, "cgroups", sbx_cgroups_describe(sh->cgroups));
    sbx_enc_kint(&e, "storeBatches", (int64_t)batches);
    sbx_enc_kint(&e, "storeWrites", (int64_t)writes);
    sbx_enc_kint(&e, "storeFailures", (int64_t)failed);
    sbx_enc_kint(&e, "storeMapBytes", (int64_t)sbx_store_mapsize(sh->store));
    sbx_enc_str(&e, "cluster");
    cluster_encode_status(sh, &e);
    sbx_enc_end(&e);
    shard_reply_end(op, &e, 0);
}

/* ------------------------------------------------------------------------------ */
/* Request intake. */

static void
reply_early(struct sctx *c, sbx_str id, int code, const char *fmt, ...)
{
    char msg[512], *buf;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    if (sbx_wire_reply_errf(id, code, &buf, &len, "%s", msg) == 0) {
        sctx_send(c, buf, len);
        free(buf);
    }
}

static void
on_request(sbx_loop *l, void *arg)
{
    struct sctx *c = arg;
    struct shard *sh = c->sh;
    char why[256];
    (void)l;

    nng_msg *m = nng_aio_get_msg(c->aio);
    sh->n_requests++;
    if (!m) {
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
        return;
    }
    struct sop *op = sbx_xcalloc(1, sizeof(*op));
    op->sh = sh;
    op->msg = m;
    op->ctx[op->nctx++] = c;
    op->t0_us = sbx_mono_us();
    op->frame = nng_msg_body(m);
    op->frame_len = nng_msg_len(m);
    sbx_str noid = {"", 0};

    if (op->frame_len > SBX_WIRE_MAX_REQUEST) {
        reply_early(c, noid, SBX_E_TOO_LARGE, "request of %zu bytes exceeds the %u-byte limit",
                    op->frame_len, SBX_WIRE_MAX_REQUEST);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    if (sbx_wire_decode(&op->dec, op->frame, op->frame_len, &sbx_wire_limits_request) != 0) {
        reply_early(c, noid, SBX_E_MALFORMED, "the request is not a valid msgpack map");
        op->nctx = 0;
        sop_free(op);
        return;
    }
    /* A request forwarded by a gateway is wrapped: { v, route: {…}, req: bin }. */
    sbx_str inner;
    int64_t route_epoch = 0;
    bool routed = false;
    if (sbx_wire_get_bin(op->dec.root, "req", &inner) == 0) {
        const msgpack_object *route;
        routed = true;
        if (sbx_wire_get_map(op->dec.root, "route", &route) == 0)
            sbx_wire_get_i64(route, "epoch", &route_epoch);
        /* The inner bytes live in the nng message, not in the decoded outer map. */
        sbx_wire_msg_free(&op->dec);
        if (sbx_wire_decode(&op->dec, inner.p, inner.n, &sbx_wire_limits_request) != 0) {
            reply_early(c, noid, SBX_E_MALFORMED, "the forwarded request is not a valid msgpack map");
            op->nctx = 0;
            sop_free(op);
            return;
        }
        op->frame = inner.p;
        op->frame_len = inner.n;
    }
    int rc = sbx_wire_parse_req(op->dec.root, &op->req, why, sizeof(why));
    if (rc) {
        reply_early(c, op->req.id, rc, "%s", why);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    if (op->req.timeout_ms > 0)
        op->ctx_deadline[0] = op->t0_us / 1000 + shard_deadline(op->req.timeout_ms);
    /* The one intake check, the same as the gateway's (runtime/ops.h); an
     * internal op is for peers, not for what a gateway forwards. */
    rc = sbx_op_intake(&op->req, routed, &op->def, why, sizeof(why));
    if (rc) {
        reply_early(c, op->req.id, rc, "%s", why);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    snprintf(op->id, sizeof(op->id), "%.*s\x1f%.*s\x1f%s", (int)op->req.id.n, op->req.id.p,
             (int)SBX_MIN(op->req.sandbox.n, 64), op->req.sandbox.p, op->def->name);

    /* Idempotency: a retry of a request we have seen joins it or gets its reply. */
    struct idem *e = idem_find(sh, op->id);
    if (e) {
        if (e->inflight) {
            if (e->inflight->nctx < (int)SBX_ARRAY_LEN(e->inflight->ctx)) {
                struct sop *first = e->inflight;
                first->ctx_deadline[first->nctx] = op->ctx_deadline[0];
                first->ctx[first->nctx++] = c;
                shard_deadline_arm(first); /* this attempt's deadline is its own */
                op->nctx = 0;
                sop_free(op);
                return;
            }
            /* Every reply slot is taken (a client retrying a long command
             * with a shorter deadline of its own): this attempt must not
             * fall through and run the request a second time
             * (tests/integration/test_faults.c
             * many_concurrent_retries_of_one_request_id_run_it_once). */
            reply_early(c, op->req.id, SBX_E_BUSY,
                        "request '%s' is still being handled and %d attempts already wait for "
                        "its reply; retry later with the same id",
                        op->id, e->inflight->nctx);
            op->nctx = 0;
            sop_free(op);
            return;
        } else {
            char *rbuf;
            size_t rlen;
            bool owned;
            if (idem_reply(sh, e, &rbuf, &rlen, &owned) == 0) {
                sctx_send(c, rbuf, rlen);
                if (owned)
                    free(rbuf);
                op->nctx = 0;
                sop_free(op);
                return;
            }
        }
    }

    if (shard_ops[op->def->id]) {
        shard_ops[op->def->id](op);
        return;
    }
    if (op->def->flags & SBX_OP_GLOBAL) {
        if (op->def->id == SBX_OPID_LIST)
            op_list(op);
        else
            op_shard_status(op);
        return;
    }
    if ((rc = sbx_id_check(op->req.sandbox.p, op->req.sandbox.n, why, sizeof(why))) != 0) {
        reply_early(c, op->req.id, rc, "%s", why);
        op->nctx = 0;
        sop_free(op);
        return;
    }
    if (cluster_on(sh)) {
        sbx_werr w;
        uint32_t part = sbx_place_partition(op->req.sandbox.p, op->req.sandbox.n);
        if (cluster_admit(sh, part, route_epoch, &w) != 0) {
            char *buf;
            size_t len;
            if (sbx_wire_reply_err(op->req.id, &w, &buf, &len) == 0) {
                sctx_send(c, buf, len);
                free(buf);
            }
            sbx_werr_free(&w);
            op->nctx = 0;
            sop_free(op);
            return;
        }
    }
    if (!e)
        idem_add(sh, op->id, op);
    char sid[64];
    sbx_str_copy(op->req.sandbox, sid, sizeof(sid));
    struct actor *a = actor_get(sh, sid, true);
    if (!a) {
        shard_reply_err(op, SBX_E_STORAGE, "cannot load sandbox '%s' from the store", sid);
        return;
    }
    actor_enqueue(a, op);
}

/* ------------------------------------------------------------------------------ */

static void
on_signal(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct shard *sh = arg;
    struct signalfd_siginfo si;
    (void)ev;
    while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
        if (si.ssi_signo == SIGTERM || si.ssi_signo == SIGINT) {
            sbx_info("shard %s: stopping (signal %u)", sh->conf.name, si.ssi_signo);
            sh->stopping = true;
            sbx_loop_stop(l);
        }
    }
}

/* Fix records left "running" by a shard that did not stop cleanly. */
struct fix_ctx {
    struct shard *sh;
    size_t n;
};

static int
fix_one(void *arg, const void *k, size_t kn, const void *v, size_t vn)
{
    struct fix_ctx *fc = arg;
    struct sbx_record r;
    (void)k;
    (void)kn;
    if (sbx_record_decode(v, vn, &r) != 0)
        return 0;
    if (!strcmp(r.state, "running")) {
        snprintf(r.state, sizeof(r.state), "stopped");
        shard_store_record(fc->sh, &r);
        fc->n++;
    }
    sbx_record_free(&r);
    return 0;
}

static void
stop_cb(sbx_loop *l, void *arg)
{
    (void)arg;
    sbx_loop_stop(l);
}

static void
drain_to_idle(struct shard *sh)
{
    /* Run the loop until every container is stopped. */
    while (sh->busy_work > 0 || sh->pool_inflight > 0) {
        sbx_loop_timer(sh->loop, 20, stop_cb, NULL);
        sbx_loop_run(sh->loop);
    }
}

static void
sweep_cb(sbx_loop *l, void *arg)
{
    struct shard *sh = arg;
    if (sh->stopping)
        return;
    actor_sleep_sweep(sh);
    idem_expire(sh); /* also when no new request comes to push entries out */
    sbx_loop_timer(l, 1000, sweep_cb, sh);
}

int
sbx_shard_run(const struct sbx_shard_conf *conf)
{
    struct shard *sh = sbx_xcalloc(1, sizeof(*sh));
    char why[512] = "";
    int rc = 0, rv;
    sigset_t set;
    sbx_watch *sigw = NULL;

    sh->conf = *conf;
    sh->started_ms = sbx_wall_ms();
    sh->limits.memory = conf->memory;
    sh->limits.pids = (uint32_t)conf->pids;
    sh->limits.cpu_milli = (uint32_t)conf->cpu;
    sh->nbuckets = 4096;
    sh->buckets = sbx_xcalloc(sh->nbuckets, sizeof(*sh->buckets));
    sh->nibuckets = 4096;
    sh->ibuckets = sbx_xcalloc(sh->nibuckets, sizeof(*sh->ibuckets));
    pthread_mutex_init(&sh->wmu, NULL);
    pthread_cond_init(&sh->wcv, NULL);
    pthread_mutex_init(&sh->relay_mu, NULL);
    pthread_cond_init(&sh->relay_cv, NULL);
    sh->relay_fd = sh->relay_stopfd = -1;
    sh->sigfd = -1;

    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);

    if ((rc = sbx_loop_new(&sh->loop)) != 0) {
        sbx_error("shard: event loop: %s", strerror(-rc));
        goto out;
    }
    if ((rc = sbx_store_open(&sh->store, conf->data, conf->map_size, conf->map_max,
                             shard_commit_cb, sh)) != 0) {
        sbx_error("shard %s: cannot open the store in %s: %s", conf->name, conf->data,
                  sbx_err_message(rc));
        goto out;
    }
    char base[256];
    snprintf(base, sizeof(base), "%s", conf->cgroup_base ? conf->cgroup_base : "");
    if (!base[0])
        snprintf(base, sizeof(base), "sbx/%s", conf->name);
    if ((rc = sbx_cgroups_open(&sh->cgroups, conf->cgroup, base, why, sizeof(why))) != 0) {
        sbx_error("shard %s: cgroups: %s (%s)", conf->name, why, strerror(-rc));
        goto out;
    }
    struct sbx_spawn_conf sc = {
        .agent_path = conf->agent,
        .cgroups = sh->cgroups,
        .uid_base = (uint32_t)conf->uid_base,
        .uid_count = (uint32_t)conf->uid_count,
        .rw_size = conf->disk,
        .rw_inodes = (uint64_t)conf->inodes,
        .shm_size = SBX_MIN(conf->disk, 64ull << 20),
        .output_cap = conf->output_cap,
        .nofile = 4096,
        .nproc = (uint32_t)SBX_MAX(conf->pids * 2, 64),
        .etc = (const char *const *)conf->etc,
        .env = (const char *const *)conf->env,
        .interp_dir = conf->interp,
        .setup_timeout_ms = (int)conf->setup_timeout,
    };
    if ((rc = sbx_spawner_new(&sh->spawner, &sc, why, sizeof(why))) != 0) {
        sbx_error("shard %s: %s", conf->name, why);
        goto out;
    }
    if ((rc = idem_load(sh)) != 0) {
        sbx_error("shard %s: cannot read the idempotency table: %s", conf->name,
                  sbx_err_message(rc));
        goto out;
    }
    struct fix_ctx fc = {sh, 0};
    sbx_store_foreach(sh->store, SBX_DB_SANDBOXES, fix_one, &fc);
    if (fc.n)
        sbx_info("shard %s: %zu sandboxes were running when the shard last stopped; their "
                 "containers are gone and start again on their next operation",
                 conf->name, fc.n);

    sh->nworkers = (int)SBX_MAX(conf->workers, 1);
    sh->workers = sbx_xcalloc((size_t)sh->nworkers, sizeof(pthread_t));
    for (int i = 0; i < sh->nworkers; i++)
        pthread_create(&sh->workers[i], NULL, worker_main, sh);

    sh->sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    sigw = sbx_loop_watch(sh->loop, sh->sigfd, EPOLLIN, on_signal, sh);

    if ((rv = sbx_nng_rep_listen(&sh->rep, conf->listen)) != 0) {
        sbx_error("shard %s: cannot listen on %s: %s", conf->name, conf->listen, nng_strerror(rv));
        rc = sbx_nng_code(rv);
        sh->stopping = true;
        goto stop;
    }
    sh->nctx = (int)SBX_MAX(conf->contexts, 1);
    sh->ctxs = sbx_xcalloc((size_t)sh->nctx, sizeof(*sh->ctxs));
    for (int i = 0; i < sh->nctx; i++) {
        struct sctx *c = &sh->ctxs[i];
        c->sh = sh;
        nng_aio_alloc(&c->aio, sctx_cb, c);
        nng_ctx_open(&c->ctx, sh->rep);
        c->state = SCTX_RECV;
        nng_ctx_recv(c->ctx, c->aio);
    }
    if ((rc = shard_relay_start(sh)) != 0 || (rc = cluster_start(sh)) != 0) {
        sh->stopping = true;
        goto stop;
    }
    pool_fill(sh);
    sbx_loop_timer(sh->loop, 1000, sweep_cb, sh);
    sbx_info("shard %s: serving on %s (data %s, %s, pool %lld)", conf->name, conf->listen,
             conf->data, sbx_cgroups_describe(sh->cgroups), (long long)conf->pool);
    rc = sbx_loop_run(sh->loop);

stop:
    sh->stopping = true;
    shard_relay_stop(sh);
    /* Leave the cluster first (the others take our partitions at once), then
     * run what its threads posted while the store is still open. */
    cluster_stop(sh);
    sbx_loop_timer(sh->loop, 0, stop_cb, NULL);
    sbx_loop_run(sh->loop);
    /* Stop receiving, stop every container, then commit what is queued. */
    for (int i = 0; i < sh->nctx; i++)
        nng_aio_stop(sh->ctxs[i].aio);
    sh->ctx_closed = true;
    actor_stop_all(sh);
    while (sh->pool) {
        struct pooled *p = sh->pool;
        sh->pool = p->next;
        struct work *w = sbx_xcalloc(1, sizeof(*w));
        w->kind = W_STOP;
        w->c = p->c;
        shard_work_submit(sh, w);
        free(p);
    }
    drain_to_idle(sh);
    pthread_mutex_lock(&sh->wmu);
    sh->wstop = true;
    pthread_cond_broadcast(&sh->wcv);
    pthread_mutex_unlock(&sh->wmu);
    for (int i = 0; i < sh->nworkers; i++)
        pthread_join(sh->workers[i], NULL);
    for (int i = 0; i < sh->nctx; i++) {
        nng_ctx_close(sh->ctxs[i].ctx);
        nng_aio_free(sh->ctxs[i].aio);
    }
    if (sh->nctx)
        nng_close(sh->rep);
out:
    if (sh->store)
        sbx_store_close(sh->store);
    if (sh->loop) {
        /* Deliver the last commit notes so no reply memory leaks. */
        sbx_loop_timer(sh->loop, 0, stop_cb, NULL);
        sbx_loop_run(sh->loop);
    }
    actor_free_all(sh);
    cluster_free(sh);
    while (sh->held) {
        struct held *h = sh->held;
        sh->held = h->next;
        free(h->buf);
        sop_free(h->op);
        free(h);
    }
    while (sh->pw_head) {
        struct pwrite *w = sh->pw_head;
        sh->pw_head = w->next;
        free(w->img);
        free(w);
    }
    idem_free_all(sh);
    if (sh->spawner)
        sbx_spawner_free(sh->spawner);
    if (sh->cgroups)
        sbx_cgroups_close(sh->cgroups);
    /* sbx_loop_free frees only unwatched handles: this one leaked at every
     * clean stop (LeakSanitizer in tests/integration/test_faults.c). */
    if (sh->loop)
        sbx_loop_unwatch(sh->loop, sigw);
    if (sh->sigfd >= 0)
        close(sh->sigfd);
    sbx_loop_free(sh->loop);
    free(sh->ctxs);
    free(sh->workers);
    free(sh->buckets);
    free(sh->ibuckets);
    pthread_mutex_destroy(&sh->wmu);
    pthread_cond_destroy(&sh->wcv);
    pthread_mutex_destroy(&sh->relay_mu);
    pthread_cond_destroy(&sh->relay_cv);
    free(sh);
    return rc;
}
