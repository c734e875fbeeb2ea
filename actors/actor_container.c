/*
 * actor_container.c — an actor's container lifecycle: start (from the
 * shard's pool or a worker thread), ready (the channel watched, the agent
 * bound), stop (sleep, destroy, handoff, shutdown), unexpected death, and
 * the idle sweep (sleepAfter).
 *
 * Runs on the shard's loop thread (shard.h).  Starts and stops run on the
 * shard's worker threads as struct work (shard_work_submit; the work is
 * owned by the worker until it comes back through actor_work_done, which
 * frees it).  While a start or stop is under way the actor's input gate is
 * closed (a->cs C_STARTING / C_STOPPING, a->gate): actor_pump moves nothing.
 * The container handle (a->c) is the actor's while it runs and the work's
 * while it stops.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* The container and its channel. */

void
actor_fail_list(struct sop **list, int code, const char *msg)
{
    while (*list) {
        struct sop *op = *list;
        *list = op->next;
        op->next = NULL;
        shard_reply_err(op, code, "%s", msg);
    }
}

void
actor_fail_inflight(struct actor *a, int code, const char *msg)
{
    actor_fail_list(&a->inflight, code, msg);
}

static void
detach_channel(struct actor *a)
{
    if (a->w) {
        sbx_loop_unwatch(a->sh->loop, a->w);
        a->w = NULL;
    }
    sbx_frame_reader_free(&a->rd);
    sbx_frame_writer_free(&a->wr);
    sbx_frame_reader_init(&a->rd, SBX_WIRE_MAX_FRAME);
    sbx_frame_writer_init(&a->wr);
}

void
actor_stop_container(struct actor *a, bool for_destroy)
{
    detach_channel(a);
    struct work *w = sbx_xcalloc(1, sizeof(*w));
    w->kind = W_STOP;
    w->actor = a;
    w->c = a->c;
    w->att = a->net_att;
    w->for_destroy = for_destroy;
    memset(&a->c, 0, sizeof(a->c));
    memset(&a->net_att, 0, sizeof(a->net_att));
    a->c.chan = a->c.pidfd = -1;
    a->cs = C_STOPPING;
    shard_work_submit(a->sh, w);
}

/* The agent went away without being asked to: it was killed (OOM, a bug,
 * tenant code that got at it) or crashed.  Its operations fail now; the next
 * one starts a fresh container. */
void
actor_container_died(struct actor *a, const char *why)
{
    struct shard *sh = a->sh;
    sh->n_died++;
    /* The agent is exempt from nothing: a memory cgroup at its limit may pick
     * it.  Say so, from the cgroup's own counter, before the cgroup goes. */
    struct sbx_cgroup_stats st;
    if (sbx_container_stats(sh->spawner, &a->c, &st) == 0 && st.oom_kills > 0)
        why = "the out-of-memory killer ended it at the sandbox's memory limit";
    snprintf(a->last_exit, sizeof(a->last_exit), "%s", why);
    a->died = true;
    sbx_log_warn("sandbox %s: container %llu ended unexpectedly: %s", a->id,
             (unsigned long long)a->c.serial, why);
    char msg[256];
    snprintf(msg, sizeof(msg),
             "the sandbox's container stopped unexpectedly (%s); the next operation starts a "
             "fresh one", why);
    actor_fail_inflight(a, SBX_E_CONTAINER, msg);
    a->rec.restarts++;
    snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
    actor_save_record(a);
    actor_stop_container(a, false);
}

static void
container_ready(struct actor *a, struct sbx_container *c, bool pooled)
{
    struct shard *sh = a->sh;
    a->c = *c;
    a->cs = C_RUNNING;
    sbx_set_nonblock(a->c.chan, true);
    a->w = sbx_loop_watch(sh->loop, a->c.chan, EPOLLIN, actor_on_chan, a);
    if (pooled && memcmp(&a->rec.limits, &sh->limits, sizeof(sh->limits)) != 0)
        sbx_container_set_limits(sh->spawner, &a->c, &a->rec.limits);
    /* Identity and environment first: frames reach the agent in order. */
    sbx_enc args;
    sbx_enc_init(&args);
    sbx_enc_map(&args);
    sbx_enc_kstr(&args, "sandbox", a->id);
    if (a->rec.env) {
        sbx_enc_str(&args, "env");
        sbx_enc_raw(&args, a->rec.env, a->rec.env_len);
    }
    if (actor_agent_send(a, "bind", NULL, &args, 0, NULL) != 0) {
        actor_container_died(a, "the bind frame could not be sent");
        return;
    }
    actor_image_start(a);
    a->rec.generation++;
    if (a->rec.persistent)
        a->rec.ws_made = true; /* its image exists from now on (a later start needs it) */
    snprintf(a->rec.state, sizeof(a->rec.state), "running");
    actor_save_record(a);
}

/* A sandbox created with {image, start: true} (docs/images.md, "Start
 * command and ports"): its image's Entrypoint + Cmd, a background process
 * "image-start" of every container it gets, started right after bind (the
 * agent answers with tag 0; a refusal is logged by agent_reply). */
void
actor_image_start(struct actor *a)
{
    sbx_msg m;
    const msgpack_object *argv = NULL;
    if (!a->rec.imgcfg ||
        sbx_wire_decode(&m, a->rec.imgcfg, a->rec.imgcfg_len, &sbx_wire_limits_request) != 0)
        return;
    if (sbx_wire_get_array(m.root, "start", &argv) == 0 && argv && argv->via.array.size) {
        sbx_enc args;
        sbx_enc_init(&args);
        sbx_enc_map(&args);
        sbx_enc_str(&args, "argv");
        sbx_enc_obj(&args, argv);
        sbx_enc_kstr(&args, "processId", "image-start");
        if (actor_agent_send(a, "process.start", NULL, &args, 0, NULL) != 0)
            sbx_log_warn("sandbox %s: its image's start command could not be sent", a->id);
    }
    sbx_wire_msg_free(&m);
}

/* The op that started the container goes on: to the agent, or back through
 * actor_handle() for the actor's own ops that need a running container. */
static void
after_start(struct actor *a, struct sop *op)
{
    if (op->def->flags & SBX_OP_AGENT)
        actor_dispatch(a, op);
    else
        actor_handle(a, op);
}

void
actor_start_container(struct actor *a, struct sop *op)
{
    struct shard *sh = a->sh;
    a->gate = op;
    a->cs = C_STARTING;
    /* A start is activity, even for an `observe` op: the new container gets a
     * whole sleepAfter (else a poll could start it only to see it stopped). */
    a->last_active_ms = sbx_wall_ms();
    op->container_restarted = a->died;
    struct sbx_container c;
    /* An egress sandbox needs its network attached on a worker: not from the
     * pool (docs/network.md: the pool holds no network-ready containers yet). */
    bool egress = actor_net_egress(a);
    struct work *nw = NULL;
    if (egress) {
        nw = sbx_xcalloc(1, sizeof(*nw));
        nw->net = true;
        char why[256];
        if (actor_net_policy(a, &nw->pol, why, sizeof(why)) != 0) {
            free(nw);
            a->gate = NULL;
            a->cs = C_NONE;
            shard_reply_err(op, SBX_E_CONTAINER, "the sandbox's network policy: %s", why);
            return;
        }
    }
    /* The warm pool's containers run the host's /usr; an image sandbox
     * takes one of its image's pool (image_pool.c), if any.  A persistent
     * workspace is mounted at the container's start, an egress sandbox's
     * network attached: no pooled one has them. */
    /* An ephemeral workspace of its own size is a tmpfs made at the start. */
    bool ws_tmpfs = !a->rec.persistent && a->rec.disk && a->rec.disk != sh->conf.disk;
    if (!egress && !a->rec.persistent && !ws_tmpfs &&
        (a->rec.image[0] ? shard_img_pool_take(sh, a->rec.image, &c) : shard_pool_take(sh, &c))) {
        a->gate = NULL;
        container_ready(a, &c, true);
        if (a->cs == C_RUNNING)
            after_start(a, op);
        else
            shard_reply_err(op, SBX_E_CONTAINER, "the sandbox's container could not start");
        return;
    }
    struct work *w = nw ? nw : sbx_xcalloc(1, sizeof(*w));
    w->kind = W_START;
    w->actor = a;
    w->lim = a->rec.limits;
    snprintf(w->image, sizeof(w->image), "%s", a->rec.image);
    w->disk = a->rec.disk ? a->rec.disk : sh->conf.disk;
    w->ws_must = a->rec.ws_made;
    w->ws_tmpfs = ws_tmpfs;
    if (a->rec.persistent && sbx_ws_dir(sh->conf.data, a->id, w->ws_dir, sizeof(w->ws_dir)) != 0) {
        free(w);
        a->gate = NULL;
        a->cs = C_NONE;
        shard_reply_err(op, SBX_E_CONTAINER, "the workspace's path is too long");
        return;
    }
    char have[SBX_IMAGE_DIGEST_LEN];
    if (a->rec.image[0] && sh->images && cluster_on(sh) &&
        sbx_image_resolve(sh->images, a->rec.image, have, NULL) != 0) {
        /* Not on this node: the worker fetches it from a peer (image_fetch.c). */
        w->peers = shard_peers_snapshot(sh, NULL);
        a->img_fetch = 1;
        a->img_from[0] = a->img_why[0] = '\0';
        a->img_bytes = 0;
        a->img_work = w;
    }
    shard_work_submit(sh, w);
}

void
actor_finish_destroy(struct actor *a, struct sop *op)
{
    struct shard *sh = a->sh;
    bool existed = a->exists;
    if (existed) {
        a->last_seq = shard_store_delete(sh, a->id); /* also the partition's tombstone seq */
    }
    /* Its persistent workspace goes with it (its container is stopped: the
     * image is no longer mounted).  A failure here is swept at the shard's
     * next start (sbx_ws_sweep). */
    char wsdir[1024];
    if (existed && a->rec.persistent &&
        sbx_ws_dir(sh->conf.data, a->id, wsdir, sizeof(wsdir)) == 0) {
        int rc = sbx_ws_remove(wsdir);
        if (rc)
            sbx_log_warn("sandbox %s: workspace %s not removed: %s", a->id, wsdir, strerror(-rc));
        sbx_wspool_trim_soon(sh->wspool); /* the pool file gives the host its space back */
        cluster_ws_snap_forget(sh, a->id); /* and its snapshot on another node */
    }
    a->exists = false;
    a->died = false;
    sbx_record_free(&a->rec);
    memset(&a->rec, 0, sizeof(a->rec));
    /* The lifecycle settings cached from the record go with it: a sandbox
     * created again under this ID starts from the deployment's defaults
     * (tests/faults found sleepAfter coming back after a destroy). */
    actor_load_config(a);
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kbool(&e, "destroyed", existed);
    sbx_enc_kstr(&e, "id", a->id);
    shard_reply_end(op, &e, a->last_seq);
}

void
actor_work_done(struct shard *sh, struct work *w)
{
    struct actor *a = w->actor;
    if (w->kind == W_START) {
        struct sop *op = a->gate;
        a->gate = NULL;
        if (a->img_fetch == 1 && a->img_work == w) {
            a->img_work = NULL;
            a->img_bytes = atomic_load(&w->fetch_bytes);
            a->img_fetch = w->fetched_from[0] ? 2 : 3;
            snprintf(a->img_from, sizeof(a->img_from), "%s", w->fetched_from);
            snprintf(a->img_why, sizeof(a->img_why), "%s", w->rc ? w->why : "");
        }
        if (w->rc != 0) {
            a->cs = C_NONE;
            bool img = w->rc == SBX_E_IMAGE_NOT_FOUND || w->rc == SBX_E_IMAGE_INVALID ||
                       w->rc == SBX_E_TIMEOUT || w->rc == SBX_E_DISK_FULL;
            if (op)
                shard_reply_err(op, img ? w->rc : SBX_E_CONTAINER,
                                "the sandbox's container could not start: %s", w->why);
            free(w);
            actor_pump(a);
            actor_maybe_free(a);
            return;
        }
        if (sh->stopping || !op) {
            w->kind = W_STOP;
            w->actor = NULL;
            shard_work_submit(sh, w);
            a->cs = C_NONE;
            if (op)
                shard_reply_err(op, SBX_E_INTERRUPTED, "the shard is stopping");
            return;
        }
        a->net_att = w->att;
        container_ready(a, &w->c, false);
        free(w);
        if (a->cs == C_RUNNING)
            after_start(a, op);
        else
            shard_reply_err(op, SBX_E_CONTAINER, "the sandbox's container could not start");
        actor_pump(a);
        return;
    }
    /* W_STOP done: the container is reaped and its cgroup removed. */
    a->cs = C_NONE;
    if (w->for_destroy) {
        struct sop *op = a->gate;
        a->gate = NULL;
        a->destroying = false;
        if (op)
            actor_finish_destroy(a, op);
    }
    free(w);
    actor_pump(a);
    actor_maybe_free(a);
}

/* ------------------------------------------------------------------------------ */
/* Sleep (sleepAfter). */

void
actor_sleep_sweep(struct shard *sh)
{
    int64_t now = sbx_wall_ms();
    for (size_t b = 0; b < sh->actors.nbuckets; b++) {
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext) {
            if (a->cs != C_RUNNING || a->inflight || a->mb_head || a->gate || a->keep_alive ||
                a->relays > 0)
                continue;
            if (now - a->last_active_ms < actor_sleep_after(a))
                continue;
            sbx_log_info("sandbox %s: idle for %llds, stopping its container (sleepAfter)", a->id,
                     (long long)((now - a->last_active_ms) / 1000));
            snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
            actor_save_record(a);
            actor_stop_container(a, false);
        }
    }
}
