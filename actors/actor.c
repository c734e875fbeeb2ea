/*
 * actor.c — one actor per sandbox ID: the table of actors, each one's
 * mailbox and input gate (actor_pump, the op-dispatch chain in
 * actor_handle), the actor's own operations (create, destroy, status,
 * env.set, sandbox.configure) and its durable record (writes, their
 * failures).  Its parts: actor_container.c (the container's lifecycle),
 * actor_chan.c (the channel to the agent), actor_handoff.c (partitions that
 * move), ports.c (exposed ports, preview URLs).
 * Everything here runs on the shard's loop thread (shard.h); the shard owns
 * the actors (sh->actors.buckets) and the table frees them (actor_maybe_free).
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <xxhash.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/place.h"
#include "cluster.h"
#include "ops_gen.h"
#include "shard_int.h"

/* ------------------------------------------------------------------------------ */
/* The table of actors. */

static size_t
ahash(struct shard *sh, const char *id)
{
    return (size_t)(XXH64(id, strlen(id), 3) % sh->actors.nbuckets);
}

static void
actor_unlink(struct shard *sh, struct actor *a)
{
    struct actor **pp = &sh->actors.buckets[ahash(sh, a->id)];
    while (*pp && *pp != a)
        pp = &(*pp)->hnext;
    if (*pp) {
        *pp = a->hnext;
        sh->actors.n--;
    }
}

static void
actor_release(struct actor *a)
{
    sbx_frame_reader_free(&a->rd);
    sbx_frame_writer_free(&a->wr);
    sbx_record_free(&a->rec);
    free(a->durable);
    if (a->restore_timer)
        sbx_loop_cancel(a->sh->loop, a->restore_timer);
    free(a);
}

/* Free an actor that holds nothing: no record, no container, no work. */
void
actor_maybe_free(struct actor *a)
{
    if (a->exists || a->cs != C_NONE || a->mb_head || a->inflight || a->gate || a->destroying ||
        a->relays > 0)
        return;
    actor_unlink(a->sh, a);
    actor_release(a);
}

/* The last store write of sandbox id not yet decided (sh->pw_head), or NULL. */
const struct pwrite *
actor_queued_write(const struct shard *sh, const char *id)
{
    const struct pwrite *last = NULL;
    for (const struct pwrite *w = sh->pw_head; w; w = w->next)
        if (!strcmp(w->id, id))
            last = w;
    return last;
}

struct actor *
actor_get(struct shard *sh, const char *id, bool load)
{
    size_t b = ahash(sh, id);
    for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext)
        if (!a->stale && !strcmp(a->id, id))
            return a;
    if (!load)
        return NULL;
    struct actor *a = sbx_xcalloc(1, sizeof(*a));
    a->sh = sh;
    snprintf(a->id, sizeof(a->id), "%s", id);
    a->c.chan = a->c.pidfd = -1;
    a->part = (uint16_t)sbx_place_partition(id, strlen(id));
    sbx_frame_reader_init(&a->rd, SBX_WIRE_MAX_FRAME);
    sbx_frame_writer_init(&a->wr);
    char *val = NULL;
    size_t vn = 0;
    int rc = sbx_store_get(sh->store, SBX_DB_SANDBOXES, id, strlen(id), &val, &vn);
    /* LMDB holds committed writes only: one of this sandbox still queued
     * (a freed actor's, above all a destroy's delete) says what the record
     * is, and a reply on it waits for that write (tests/faults found
     * destroyed sandboxes coming back from LMDB before their delete committed). */
    const struct pwrite *q = actor_queued_write(sh, id);
    if (q && q->seq <= sh->part_reset_seq[a->part])
        q = NULL; /* made before the partition's records were replaced: not the record */
    const char *img = q ? q->img : val; /* NULL: no record */
    size_t imglen = q ? q->len : vn;
    if (q)
        a->last_seq = q->seq;
    else if (cluster_on(sh))
        /* A destroy's delete committed here but not yet in etcd: its
         * replication may still fail (WRONG_OWNER), and the sandbox's next
         * owner serves what etcd holds.  The destroy freed its actor once
         * its container had stopped, so a status then answered
         * SANDBOX_NOT_FOUND while the destroy was about to fail (issue 11,
         * note 12 of docs/cluster.md; tests/cluster/test_claim.c t24): a
         * fresh actor's replies wait for such a delete and fail with it. */
        a->last_seq = shard_unreplicated_delete(sh, id);
    if (rc == 0 || rc == -ENOENT) {
        if (img && sbx_record_decode(img, imglen, &a->rec) == 0) {
            a->exists = true;
            actor_load_config(a);
            /* No container survives a shard restart, whatever was recorded. */
            snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
        } else if (img) {
            sbx_log_error("sandbox %s: unreadable record in the store; treating it as new", id);
        }
    }
    if (rc == 0) {
        a->durable = val; /* what the store holds: the output gate's fallback */
        a->durable_len = vn;
    } else if (rc != -ENOENT) {
        actor_release(a);
        return NULL;
    }
    a->hnext = sh->actors.buckets[b];
    sh->actors.buckets[b] = a;
    sh->actors.n++;
    return a;
}

void
actor_enqueue(struct actor *a, struct sop *op)
{
    op->actor = a;
    op->next = NULL;
    if (a->mb_tail)
        a->mb_tail->next = op;
    else
        a->mb_head = op;
    a->mb_tail = op;
    actor_pump(a);
}

bool
actor_inflight(const struct sop *op)
{
    for (const struct sop *q = op->actor ? op->actor->inflight : NULL; q; q = q->next)
        if (q == op)
            return true;
    return false;
}

/* ------------------------------------------------------------------------------ */
/* Records. */

/* actor_ensure_record, with save false for an operation that writes the
 * record itself right after (env.set, sandbox.configure): one write, so a
 * sandbox such an operation creates never exists without its change (the
 * fault test found one with the default settings after a configure whose
 * second write failed). */
static void
ensure_record(struct actor *a, const struct sbx_limits *lim, bool save)
{
    if (a->exists && !a->durable) {
        /* It exists in memory only (its creating write failed, or is not
         * decided yet): written again, so that a reply acknowledging it
         * waits for a committed record — else a restart loses a sandbox
         * answered as existing (issue 11; the fault test's lost_write). */
        if (save)
            actor_save_record(a);
        return;
    }
    if (a->exists)
        return;
    struct shard *sh = a->sh;
    sbx_record_free(&a->rec);
    memset(&a->rec, 0, sizeof(a->rec));
    snprintf(a->rec.id, sizeof(a->rec.id), "%s", a->id);
    a->rec.created_ms = sbx_wall_ms();
    snprintf(a->rec.state, sizeof(a->rec.state), "created");
    a->rec.limits = lim ? *lim : sh->limits;
    a->exists = true;
    if (save)
        actor_save_record(a);
}

void
actor_ensure_record(struct actor *a, const struct sbx_limits *lim)
{
    ensure_record(a, lim, true);
}

void
actor_save_record(struct actor *a)
{
    if (a->stale)
        return; /* the record is another incarnation's now (actor_partition_drop) */
    a->last_seq = shard_store_record(a->sh, &a->rec);
}

/* Lifecycle settings from the record's config map. */
void
actor_load_config(struct actor *a)
{
    a->sleep_after_ms = 0;
    a->keep_alive = false;
    if (!a->rec.config)
        return;
    sbx_msg m;
    if (sbx_wire_decode(&m, a->rec.config, a->rec.config_len, &sbx_wire_limits_request) != 0)
        return;
    int64_t v;
    if (sbx_wire_get_i64(m.root, "sleepAfter", &v) == 0 && v > 0)
        a->sleep_after_ms = v;
    sbx_wire_get_bool(m.root, "keepAlive", &a->keep_alive);
    sbx_wire_msg_free(&m);
}

int64_t
actor_sleep_after(struct actor *a)
{
    return a->sleep_after_ms > 0 ? a->sleep_after_ms : a->sh->conf.sleep_after;
}

/* ------------------------------------------------------------------------------ */
/* Status. */

void
actor_encode_status(struct actor *a, sbx_enc *e)
{
    struct shard *sh = a->sh;
    const char *state = a->destroying         ? "destroying"
                        : a->cs == C_RUNNING  ? "running"
                        : a->cs == C_STARTING ? "starting"
                        : a->cs == C_STOPPING ? "stopping"
                                              : "stopped";
    sbx_enc_map(e);
    sbx_enc_kstr(e, "id", a->id);
    sbx_enc_kstr(e, "state", state);
    sbx_enc_kint(e, "createdAt", a->rec.created_ms);
    sbx_enc_kint(e, "generation", (int64_t)a->rec.generation);
    sbx_enc_kint(e, "restarts", (int64_t)a->rec.restarts);
    sbx_enc_kstr(e, "shard", sh->conf.name);
    if (a->last_active_ms)
        sbx_enc_kint(e, "lastActivityAt", a->last_active_ms);
    sbx_enc_kmap(e, "limits");
    sbx_enc_kint(e, "memory", (int64_t)a->rec.limits.memory);
    sbx_enc_kint(e, "pids", a->rec.limits.pids);
    sbx_enc_kint(e, "cpu", a->rec.limits.cpu_milli);
    sbx_enc_end(e);
    sbx_enc_kint(e, "sleepAfter", actor_sleep_after(a));
    sbx_enc_kbool(e, "keepAlive", a->keep_alive);
    actor_net_encode_status(a, e);
    if (a->died)
        sbx_enc_kstr(e, "lastExit", a->last_exit);
    if (a->rec.image[0])
        sbx_enc_kstr(e, "image", a->rec.image);
    if (a->img_fetch) {
        /* Its image fetched from a peer for its container (docs/images.md,
         * "Images in a cluster"): only on the node that fetched it. */
        static const char *const states[] = {"", "fetching", "fetched", "failed"};
        sbx_enc_kmap(e, "imageFetch");
        sbx_enc_kstr(e, "state", states[a->img_fetch & 3]);
        if (a->img_from[0])
            sbx_enc_kstr(e, "fetchedFrom", a->img_from);
        if (a->img_why[0])
            sbx_enc_kstr(e, "error", a->img_why);
        uint64_t b = a->img_fetch == 1 && a->img_work ? atomic_load(&a->img_work->fetch_bytes)
                                                      : a->img_bytes;
        sbx_enc_kint(e, "bytes", (int64_t)b);
        sbx_enc_end(e);
    }
    sbx_enc_kmap(e, "workspace");
    sbx_enc_kstr(e, "mode", a->rec.persistent ? "persistent" : "ephemeral");
    sbx_enc_kint(e, "limitBytes", (int64_t)(a->rec.disk ? a->rec.disk : sh->conf.disk));
    if (a->rec.persistent) {
        char dir[1024];
        int64_t alloc = sbx_ws_dir(sh->conf.data, a->id, dir, sizeof(dir)) == 0
                            ? sbx_ws_allocated(dir)
                            : -1;
        sbx_enc_kint(e, "allocatedBytes", alloc > 0 ? alloc : 0);
        struct statfs sf;
        if (a->cs == C_RUNNING && a->c.ws && fstatfs(a->c.ws_fd, &sf) == 0) {
            sbx_enc_kint(e, "usedBytes", (int64_t)((sf.f_blocks - sf.f_bfree) * sf.f_bsize));
            sbx_enc_kint(e, "freeBytes", (int64_t)(sf.f_bavail * sf.f_bsize));
        }
        cluster_ws_status(sh, a->id, e); /* snapshots for a failover (ws_snap.c) */
    }
    sbx_enc_end(e);
    if (a->rec.imgcfg) {
        /* The image's ExposedPorts (hints: nothing is exposed by them) and
         * its start command, when the sandbox asked for it. */
        sbx_msg m;
        if (sbx_wire_decode(&m, a->rec.imgcfg, a->rec.imgcfg_len, &sbx_wire_limits_request) == 0) {
            const msgpack_object *o;
            if (sbx_wire_get_array(m.root, "ports", &o) == 0 && o && o->via.array.size) {
                sbx_enc_str(e, "imagePorts");
                sbx_enc_obj(e, o);
            }
            if (sbx_wire_get_array(m.root, "start", &o) == 0 && o) {
                sbx_enc_str(e, "startCommand");
                sbx_enc_obj(e, o);
            }
            sbx_wire_msg_free(&m);
        }
    }
    if (a->cs == C_RUNNING) {
        struct sbx_cgroup_stats st;
        sbx_container_stats(sh->spawner, &a->c, &st);
        sbx_enc_kmap(e, "container");
        sbx_enc_kint(e, "pid", a->c.pid);
        sbx_enc_kint(e, "uid", a->c.uid);
        sbx_enc_kint(e, "startUs", a->c.start_us);
        sbx_enc_kint(e, "memoryBytes", (int64_t)st.memory_current);
        sbx_enc_kint(e, "memoryPeakBytes", (int64_t)st.memory_peak);
        sbx_enc_kint(e, "pids", (int64_t)st.pids_current);
        sbx_enc_kint(e, "cpuUsageUs", (int64_t)st.cpu_usage_us);
        sbx_enc_kint(e, "oomKills", (int64_t)st.oom_kills);
        sbx_enc_kint(e, "pidsLimitHits", (int64_t)st.pids_max_hits);
        sbx_enc_end(e);
    }
    sbx_enc_end(e);
}

void
actor_op_status(struct actor *a, struct sop *op)
{
    if (!a->exists) {
        shard_reply_err(op, SBX_E_NOT_FOUND, "sandbox '%s' does not exist", a->id);
        return;
    }
    if (!a->durable)
        actor_save_record(a); /* it exists in memory only: see ensure_record */
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_str(&e, "sandbox");
    actor_encode_status(a, &e);
    shard_reply_end(op, &e, a->last_seq);
}

/* ------------------------------------------------------------------------------ */
/* The mailbox. */

/* The create op's limits (defaults: the shard's); 0, or SBX_E_VALIDATION with
 * *err set (docs/errors.md). */
static int
parse_limits(struct actor *a, struct sop *op, struct sbx_limits *lim, sbx_err_t *err)
{
    const msgpack_object *l = NULL;
    int64_t v;
    *lim = a->sh->limits;
    int rc = sbx_wire_get_map(op->req.args, "limits", &l);
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return sbx_err_make(err, SBX_E_VALIDATION, "'limits' must be a map");
    if (sbx_wire_get_i64(l, "memory", &v) == 0) {
        if (v < (16 << 20) || v > (1ll << 40))
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "limits.memory must be 16 MiB .. 1 TiB (bytes)");
        lim->memory = (uint64_t)v;
    }
    if (sbx_wire_get_i64(l, "pids", &v) == 0) {
        if (v < 16 || v > 1 << 20)
            return sbx_err_make(err, SBX_E_VALIDATION, "limits.pids must be 16 .. 1048576");
        lim->pids = (uint32_t)v;
    }
    if (sbx_wire_get_i64(l, "cpu", &v) == 0) {
        if (v < 10 || v > 1024000)
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "limits.cpu must be 10 .. 1024000 millicpus");
        lim->cpu_milli = (uint32_t)v;
    }
    return 0;
}

/*
 * The record's "imageConfig" of a sandbox of the image digest: {ports:
 * [its ExposedPorts]} and, when start, {start: Entrypoint + Cmd} (the argv
 * Docker runs: image-spec config.md, "Entrypoint", "Cmd").  *out is heap
 * msgpack (the caller's).  SBX_E_VALIDATION when start and the image has
 * neither; SBX_E_IMAGE_NOT_FOUND.
 */
static int
image_config_blob(sbx_image_store *st, const char *digest, bool start, char **out,
                  size_t *out_len, sbx_err_t *err)
{
    json_t *cfg = NULL;
    int rc = sbx_image_config(st, digest, &cfg, err);
    if (rc)
        return rc;
    json_t *ep = json_object_get(cfg, "entrypoint"), *cmd = json_object_get(cfg, "cmd");
    size_t nargv = json_array_size(ep) + json_array_size(cmd);
    if (start && nargv == 0) {
        json_decref(cfg);
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "'start': image %s has no Entrypoint or Cmd to start", digest);
    }
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_karray(&e, "ports");
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(cfg, "exposedPorts"), i, v) {
        if (json_is_string(v))
            sbx_enc_str(&e, json_string_value(v));
    }
    sbx_enc_end(&e);
    if (start) {
        sbx_enc_karray(&e, "start");
        json_t *parts[2] = {ep, cmd};
        for (int k = 0; k < 2; k++)
            json_array_foreach(parts[k], i, v) {
                if (json_is_string(v))
                    sbx_enc_str(&e, json_string_value(v));
            }
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    json_decref(cfg);
    if (sbx_enc_finish(&e, out, out_len) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode the image's config");
    return 0;
}

/* "sha256:" and 64 lower-case hex digits. */
static bool
image_digest_ok(const char *s)
{
    return strlen(s) == 71 && !strncmp(s, "sha256:", 7) && strspn(s + 7, "0123456789abcdef") == 64;
}

void
actor_op_create(struct actor *a, struct sop *op)
{
    _cleanup_err_ sbx_err_t err = NULL;
    struct sbx_limits lim;
    char *netcfg = NULL;
    size_t netlen = 0;
    int rc = parse_limits(a, op, &lim, &err);
    if (rc == 0)
        rc = actor_net_check_args(a->sh, op->req.args, &netcfg, &netlen, &err);
    if (rc) {
        shard_reply_err(op, rc, "%s", sbx_err_msg(err));
        return;
    }
    bool created = !a->exists;
    /* An image (docs/images.md): resolved to its digest now, kept in the
     * record.  Only for a sandbox created here: an existing one keeps its own. */
    char digest[SBX_IMAGE_DIGEST_LEN] = "";
    bool remote = false; /* digest is not in this node's store (yet) */
    sbx_str img;
    if (created && sbx_wire_get_str(op->req.args, "image", &img) == 0 && img.n > 0) {
        char ref[256];
        if (sbx_str_copy(img, ref, sizeof(ref)) != 0 || memchr(img.p, '\0', img.n)) {
            free(netcfg);
            shard_reply_err(op, SBX_E_VALIDATION, "'image' must be a name or digest of at most "
                                                  "255 bytes");
            return;
        }
        if (!a->sh->images) {
            free(netcfg);
            shard_reply_err(op, SBX_E_IMAGE_NOT_FOUND, "shard %s has no image store",
                            a->sh->conf.name);
            return;
        }
        /* A name a peer resolved (and this node fetched): its digest. */
        if (op->img_digest[0])
            snprintf(ref, sizeof(ref), "%s", op->img_digest);
        if ((rc = sbx_image_resolve(a->sh->images, ref, digest, &err)) != 0 &&
            !(rc == SBX_E_IMAGE_NOT_FOUND && cluster_on(a->sh) && image_digest_ok(ref))) {
            free(netcfg);
            shard_reply_err(op, rc, "%s", sbx_err_msg(err));
            return;
        }
        if (rc) {
            /* A digest this node lacks, in a cluster: kept as is; the first
             * container start fetches it from a peer that has it
             * (docs/images.md, "Images in a cluster"). */
            snprintf(digest, sizeof(digest), "%s", ref);
            remote = true;
        }
    }
    /* The workspace (docs/persistence.md): only when created, like the image. */
    bool persistent = a->sh->conf.workspace_default &&
                      !strcmp(a->sh->conf.workspace_default, "persistent");
    sbx_str ws;
    if (created && sbx_wire_get_str(op->req.args, "workspace", &ws) == 0) {
        if (ws.n == 10 && !memcmp(ws.p, "persistent", 10)) {
            persistent = true;
        } else if (ws.n == 9 && !memcmp(ws.p, "ephemeral", 9)) {
            persistent = false;
        } else {
            free(netcfg);
            shard_reply_err(op, SBX_E_VALIDATION,
                            "'workspace' must be \"ephemeral\" or \"persistent\"");
            return;
        }
    }
    /* Its disk size (bytes, docs/persistence.md): a persistent workspace's
     * file system, or an ephemeral one's tmpfs; only when created; at most
     * the deployment's --disk-max. */
    int64_t disk = 0;
    if (created && (rc = sbx_wire_get_i64(op->req.args, "disk", &disk)) != -ENOENT &&
        (rc != 0 || disk < (16 << 20) || (uint64_t)disk > a->sh->conf.disk_max)) {
        free(netcfg);
        shard_reply_err(op, SBX_E_VALIDATION,
                        "'disk' must be 16 MiB (16777216) to %llu bytes (this deployment's "
                        "--disk-max)", (unsigned long long)a->sh->conf.disk_max);
        return;
    }
    /* What the sandbox keeps of its image's config (actors/record.h,
     * "imageConfig"; docs/images.md, "Start command and ports"). */
    char *imgcfg = NULL;
    size_t imgcfg_len = 0;
    bool start = false;
    sbx_wire_get_bool(op->req.args, "start", &start);
    sbx_str has_img = {0};
    if (start && (sbx_wire_get_str(op->req.args, "image", &has_img) != 0 || has_img.n == 0)) {
        free(netcfg);
        shard_reply_err(op, SBX_E_VALIDATION,
                        "'start' runs an image's Entrypoint and Cmd: it needs 'image'");
        return;
    }
    if (remote && start) {
        free(netcfg);
        shard_reply_err(op, SBX_E_IMAGE_NOT_FOUND,
                        "'start' needs the image's Entrypoint and Cmd, and image %s is not on "
                        "this node: create the sandbox without 'start', or import it here",
                        digest);
        return;
    }
    if (created && digest[0] && !remote &&
        (rc = image_config_blob(a->sh->images, digest, start, &imgcfg, &imgcfg_len, &err)) != 0) {
        free(netcfg);
        shard_reply_err(op, rc, "%s", sbx_err_msg(err));
        return;
    }
    if ((created && (digest[0] || persistent || disk)) || netcfg) {
        /* One write: the record never exists without its image, its
         * workspace mode and size or its network settings. */
        ensure_record(a, &lim, false);
        if (created) {
            snprintf(a->rec.image, sizeof(a->rec.image), "%s", digest);
            a->rec.persistent = persistent;
            a->rec.disk = (uint64_t)disk;
            if (imgcfg) {
                free(a->rec.imgcfg);
                a->rec.imgcfg = imgcfg; /* the record's now */
                a->rec.imgcfg_len = imgcfg_len;
            }
        }
        bool net = netcfg != NULL;
        if (netcfg) {
            sbx_msg m;
            if (sbx_wire_decode(&m, netcfg, netlen, &sbx_wire_limits_request) == 0) {
                actor_merge_map_blob(&a->rec.config, &a->rec.config_len, m.root);
                sbx_wire_msg_free(&m);
            }
            free(netcfg);
        }
        actor_save_record(a);
        if (net && !created)
            actor_net_apply(a);
        /* The node that would take the partition over gets the image now, so
         * a failover finds it there even when this node is gone. */
        if (created && digest[0] && cluster_on(a->sh))
            shard_image_replicate(a->sh, digest, a->part);
    } else {
        actor_ensure_record(a, &lim);
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "created", created);
    sbx_enc_str(&e, "sandbox");
    actor_encode_status(a, &e);
    shard_reply_end(op, &e, a->last_seq);
}

void
actor_op_destroy(struct actor *a, struct sop *op)
{
    if (a->cs == C_RUNNING) {
        a->gate = op;
        a->destroying = true;
        actor_fail_inflight(a, SBX_E_INTERRUPTED, "the sandbox was destroyed");
        actor_stop_container(a, true);
        return;
    }
    actor_finish_destroy(a, op);
}

/* Replace blob (a msgpack map) with blob ⊕ vars: string values set, nil
 * removes.  The result is a fresh heap blob. */
void
actor_merge_map_blob(char **blob, size_t *len, const msgpack_object *vars)
{
    sbx_msg old;
    bool have_old = *blob && sbx_wire_decode(&old, *blob, *len, &sbx_wire_limits_request) == 0;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    if (have_old) {
        for (uint32_t i = 0; i < old.root->via.map.size; i++) {
            const msgpack_object_kv *kv = &old.root->via.map.ptr[i];
            bool replaced = false;
            for (uint32_t j = 0; j < vars->via.map.size; j++) {
                const msgpack_object *k2 = &vars->via.map.ptr[j].key;
                if (k2->type == MSGPACK_OBJECT_STR && kv->key.type == MSGPACK_OBJECT_STR &&
                    k2->via.str.size == kv->key.via.str.size &&
                    !memcmp(k2->via.str.ptr, kv->key.via.str.ptr, k2->via.str.size))
                    replaced = true;
            }
            if (!replaced) {
                sbx_enc_obj(&e, &kv->key);
                sbx_enc_obj(&e, &kv->val);
            }
        }
        sbx_wire_msg_free(&old);
    }
    for (uint32_t j = 0; j < vars->via.map.size; j++) {
        const msgpack_object_kv *kv = &vars->via.map.ptr[j];
        if (kv->val.type == MSGPACK_OBJECT_NIL)
            continue;
        sbx_enc_obj(&e, &kv->key);
        sbx_enc_obj(&e, &kv->val);
    }
    sbx_enc_end(&e);
    char *nb;
    size_t nl;
    if (sbx_enc_finish(&e, &nb, &nl) == 0) {
        free(*blob);
        *blob = nb;
        *len = nl;
    }
}

/*
 * The whole sandbox environment is bounded.  execve(2) fails with E2BIG when
 * argv and envp together exceed ARG_MAX (a quarter of the 8 MiB stack limit:
 * 2 MiB), so env.set calls that are each valid could add up to an
 * environment in which every command of the sandbox fails — durably, since
 * the record keeps it across container restarts (seen with 25 values of
 * 100 KB).  Half of ARG_MAX is left for the environment.
 */
#define ENV_MAX_BYTES (1u << 20)
#define ENV_MAX_VARS 4096

/* Bytes the env map blob takes in an envp ("K=V\0" and a pointer each). */
static size_t
env_bytes(const char *blob, size_t len, size_t *nvars)
{
    sbx_msg m;
    size_t total = 0;
    *nvars = 0;
    if (!blob || sbx_wire_decode(&m, blob, len, &sbx_wire_limits_request) != 0)
        return 0;
    for (uint32_t i = 0; i < m.root->via.map.size; i++) {
        sbx_str k = {"", 0}, v = {"", 0};
        sbx_wire_obj_str(&m.root->via.map.ptr[i].key, &k);
        sbx_wire_obj_str(&m.root->via.map.ptr[i].val, &v);
        total += k.n + v.n + 2 + sizeof(char *);
    }
    *nvars = m.root->via.map.size;
    sbx_wire_msg_free(&m);
    return total;
}

static void
reply_success(struct actor *a, struct sop *op)
{
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    shard_reply_end(op, &e, a->last_seq);
}

/* env.set {vars}: durable in the record (a container started later gets them
 * at bind), and applied by the agent now if the container runs. */
void
actor_op_env_set(struct actor *a, struct sop *op)
{
    const msgpack_object *vars;
    if (sbx_wire_get_map(op->req.args, "vars", &vars) != 0 || vars->via.map.size > 4096) {
        shard_reply_err(op, SBX_E_VALIDATION, "'vars' (a map of at most 4096 strings or nil) "
                                              "is required");
        return;
    }
    for (uint32_t i = 0; i < vars->via.map.size; i++) {
        const msgpack_object_kv *kv = &vars->via.map.ptr[i];
        sbx_str k;
        if (sbx_wire_obj_str(&kv->key, &k) != 0 || k.n == 0 || k.n > 256 ||
            memchr(k.p, '=', k.n) || memchr(k.p, '\0', k.n) ||
            (kv->val.type != MSGPACK_OBJECT_STR && kv->val.type != MSGPACK_OBJECT_NIL) ||
            (kv->val.type == MSGPACK_OBJECT_STR &&
             (kv->val.via.str.size > 131072 ||
              memchr(kv->val.via.str.ptr, '\0', kv->val.via.str.size)))) {
            shard_reply_err(op, SBX_E_VALIDATION,
                            "environment names must be 1-256 bytes without '=' or NUL, values "
                            "strings (nil unsets) without NUL");
            return;
        }
    }
    char *env = NULL;
    size_t env_len = 0, nvars;
    if (a->exists)
        sbx_record_set_blob(&env, &env_len, a->rec.env, a->rec.env_len);
    actor_merge_map_blob(&env, &env_len, vars);
    size_t bytes = env_bytes(env, env_len, &nvars);
    if (bytes > ENV_MAX_BYTES || nvars > ENV_MAX_VARS) {
        free(env);
        shard_reply_err(op, SBX_E_VALIDATION,
                        "the sandbox environment would hold %zu variables in %zu bytes; at most "
                        "%u variables and %u bytes (beyond that no command could start: "
                        "E2BIG); unset some with nil",
                        nvars, bytes, ENV_MAX_VARS, ENV_MAX_BYTES);
        return;
    }
    ensure_record(a, NULL, false);
    free(a->rec.env);
    a->rec.env = env;
    a->rec.env_len = env_len;
    actor_save_record(a);
    if (a->cs == C_RUNNING) {
        /* The agent gets the change only once it is committed: one the
         * store refused never reaches the container.  Later ops wait at
         * the input gate (actor_commit_continue). */
        a->gate = op;
        a->cw_seq = a->last_seq;
        shard_commit_wait(a);
        return;
    }
    reply_success(a, op);
}

void
actor_commit_continue(struct actor *a)
{
    struct sop *op = a->gate;
    uint64_t seq = a->cw_seq;
    a->cw_seq = 0;
    a->gate = NULL;
    if (!op)
        return;
    if (op->intent_seq && seq == op->intent_seq) {
        /* Its intent (dispatch) is decided. */
        int rc = sbx_store_wait(a->sh->store, seq);
        if (rc)
            shard_reply_err(op, rc == SBX_E_STORAGE_FULL ? rc : SBX_E_STORAGE,
                            "the request could not be recorded before it ran (%s); it did not "
                            "run, and a retry with the same request id runs it",
                            sbx_err_message(rc));
        else if (a->cs == C_RUNNING)
            actor_dispatch(a, op);
        else {
            /* The container went meanwhile: op goes first through actor_handle()
             * again (a start, or its error); its intent is written. */
            op->next = a->mb_head;
            a->mb_head = op;
            if (!a->mb_tail)
                a->mb_tail = op;
        }
    } else if (actor_write_failed(a, seq))
        shard_deliver_error(op, actor_failed_code(a, seq));
    else if (a->cs == C_RUNNING)
        actor_dispatch(a, op);
    else
        reply_success(a, op); /* committed: a container started later gets it at bind */
    actor_pump(a);
}

/* sandbox.configure {sleepAfter: ms | "10m", keepAlive}: durable lifecycle settings. */
void
actor_op_configure(struct actor *a, struct sop *op)
{
    const msgpack_object *args = op->req.args;
    _cleanup_err_ sbx_err_t err = NULL;
    int64_t ms = -1;
    bool ka = a->keep_alive, have_ka = false;
    const msgpack_object *sa = sbx_wire_get(args, "sleepAfter");
    if (sa) {
        sbx_str s;
        if (sbx_wire_get_i64(args, "sleepAfter", &ms) == 0) {
            /* a number: seconds, as the SDK's sleepAfter */
            ms *= 1000;
        } else if (sbx_wire_obj_str(sa, &s) == 0 && s.n < 32) {
            char tmp[32];
            sbx_str_copy(s, tmp, sizeof(tmp));
            if (sbx_parse_duration_ms(tmp, &ms) != 0)
                ms = -1;
        }
        if (ms < 1000 || ms > 365ll * 24 * 3600 * 1000) {
            shard_reply_err(op, SBX_E_VALIDATION, "'sleepAfter' must be 1s .. 365d (\"30s\", "
                                                  "\"10m\", \"1h\", or a number of seconds)");
            return;
        }
    }
    int rc = sbx_wire_get_bool(args, "keepAlive", &ka);
    if (rc == SBX_E_VALIDATION) {
        shard_reply_err(op, SBX_E_VALIDATION, "'keepAlive' must be a boolean");
        return;
    }
    have_ka = rc == 0;
    _cleanup_free_ char *netcfg = NULL;
    size_t netlen = 0;
    if ((rc = actor_net_check_args(a->sh, args, &netcfg, &netlen, &err)) != 0) {
        shard_reply_err(op, rc, "%s", sbx_err_msg(err));
        return;
    }
    ensure_record(a, NULL, false);
    if (netcfg) {
        sbx_msg nm;
        if (sbx_wire_decode(&nm, netcfg, netlen, &sbx_wire_limits_request) == 0) {
            actor_merge_map_blob(&a->rec.config, &a->rec.config_len, nm.root);
            sbx_wire_msg_free(&nm);
        }
    }
    sbx_enc c;
    char *cb;
    size_t cl;
    sbx_enc_init(&c);
    sbx_enc_map(&c);
    if (sa)
        sbx_enc_kint(&c, "sleepAfter", ms);
    if (have_ka)
        sbx_enc_kbool(&c, "keepAlive", ka);
    sbx_enc_end(&c);
    if (sbx_enc_finish(&c, &cb, &cl) == 0) {
        sbx_msg m;
        if (sbx_wire_decode(&m, cb, cl, &sbx_wire_limits_request) == 0) {
            actor_merge_map_blob(&a->rec.config, &a->rec.config_len, m.root);
            sbx_wire_msg_free(&m);
        }
        free(cb);
    }
    actor_load_config(a);
    a->last_active_ms = sbx_wall_ms();
    actor_save_record(a);
    if (netcfg)
        actor_net_apply(a);
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kint(&e, "sleepAfter", actor_sleep_after(a));
    sbx_enc_kbool(&e, "keepAlive", a->keep_alive);
    shard_reply_end(op, &e, a->last_seq);
}


void
actor_handle(struct actor *a, struct sop *op)
{
    /* Every op is activity for sleepAfter but the `observe` ones (status,
     * lists: reading state is not using the sandbox; docs/schema.md). */
    if (!(op->def->flags & SBX_OP_OBSERVE))
        a->last_active_ms = sbx_wall_ms();
    const char *name = op->def->name;
    /* The shard-layer ops of runtime/ops.yaml (generated table, actors/ops_gen.c). */
    if (actor_ops[op->def->id]) {
        actor_ops[op->def->id](a, op);
        return;
    }
    if (!(op->def->flags & SBX_OP_AGENT)) {
        shard_reply_err(op, SBX_E_UNKNOWN_OP, "operation '%s' is not served by shards", name);
        return;
    }
    if (!a->exists) {
        if (op->def->flags & SBX_OP_NOCREATE) {
            shard_reply_err(op, SBX_E_NOT_FOUND, "sandbox '%s' does not exist", a->id);
            return;
        }
        actor_ensure_record(a, NULL);
    }
    if (a->cs != C_RUNNING) {
        if ((op->def->flags & SBX_OP_NOWAKE) && op->def->idle_empty) {
            /* A list of what lives in the container: none without one. */
            sbx_enc e;
            shard_reply_begin(op, &e);
            sbx_enc_kbool(&e, "success", true);
            sbx_enc_str(&e, op->def->idle_empty);
            sbx_enc_array(&e);
            sbx_enc_end(&e);
            shard_reply_end(op, &e, 0);
            return;
        }
        if (op->def->flags & SBX_OP_NOWAKE) {
            /* What it names lived in a container that is gone. */
            shard_reply_err(op, op->def->idle_code ? op->def->idle_code : SBX_E_NOT_FOUND,
                            "not found: sandbox '%s' has no running container (it was stopped "
                            "or restarted)", a->id);
            return;
        }
        actor_start_container(a, op);
        return;
    }
    actor_dispatch(a, op);
}

void
actor_pump(struct actor *a)
{
    /* The input gate: nothing moves while a lifecycle step is under way. */
    while (!a->gate && a->cs != C_STARTING && a->cs != C_STOPPING && a->mb_head) {
        struct sop *op = a->mb_head;
        a->mb_head = op->next;
        if (!a->mb_head)
            a->mb_tail = NULL;
        op->next = NULL;
        actor_handle(a, op);
    }
}

int
actor_failed_code(const struct actor *a, uint64_t seq)
{
    if (seq == 0)
        return 0;
    if (seq >= a->bad_lo && seq <= a->bad_hi)
        return a->bad_code;
    unsigned n = SBX_MIN(a->n_old_bad, (unsigned)ACTOR_OLD_BAD);
    for (unsigned i = 0; i < n; i++)
        if (seq >= a->old_bad[i].lo && seq <= a->old_bad[i].hi)
            return a->old_bad[i].code;
    /* A range the ring no longer holds: the store remembers every write
     * that failed.  An exec's reply comes tens of ms after its record write,
     * and on a full disk every op in between (a status that writes the
     * record again, each configure) failed a range of its own: with 12 of
     * them the exec's was forgotten and the exec acknowledged over a record
     * that never committed (issue 11's fill fault, lost_write).  Only for
     * decided writes: a write being settled is judged by the ring alone.
     * Commit notes are handled in order, so with no failure among those up
     * to sh->decided the store need not be asked (its mutex, per reply). */
    if (seq <= a->sh->decided && a->sh->store_failures)
        return sbx_store_failed(a->sh->store, seq);
    return 0;
}

bool
actor_write_failed(const struct actor *a, uint64_t seq)
{
    return actor_failed_code(a, seq) != 0;
}

void
actor_mark_failed(struct actor *a, uint64_t seq, int code)
{
    if (a->bad_hi && a->bad_hi < seq) {
        unsigned k = a->n_old_bad++ % ACTOR_OLD_BAD;
        a->old_bad[k].lo = a->bad_lo;
        a->old_bad[k].hi = a->bad_hi;
        a->old_bad[k].code = a->bad_code ? a->bad_code : SBX_E_STORAGE;
    }
    a->bad_lo = a->bad_hi < seq ? seq : SBX_MIN(a->bad_lo, seq);
    a->bad_hi = SBX_MAX(a->last_seq, seq);
    a->bad_code = code ? code : SBX_E_STORAGE;
}

/* How long a rewrite of the acknowledged record waits after a failed one. */
#define RESTORE_RETRY_MS 1000

/* Write the actor's (acknowledged) record again, or its absence. */
static void
rewrite_record(struct actor *a)
{
    if (a->stale)
        return;
    if (a->exists)
        actor_save_record(a);
    else if (!a->durable)
        a->last_seq = shard_store_delete(a->sh, a->id);
}

static void
restore_cb(sbx_loop *l, void *arg)
{
    struct actor *a = arg;
    (void)l;
    a->restore_timer = 0;
    if (a->restore)
        rewrite_record(a); /* its failure comes back through actor_commit_failed */
}

void
actor_commit_failed(struct actor *a, uint64_t seq, int code)
{
    if (seq <= a->sh->part_reset_seq[a->part])
        return; /* a write of the records this actor replaced (shard_int.h) */
    if (actor_write_failed(a, seq))
        return; /* undone already, with an earlier write of its batch */
    /* A range of its own if the last one is all earlier, else one range
     * (a replication failure may have marked later writes first). */
    actor_mark_failed(a, seq, code);
    bool later = a->last_seq > seq; /* queued writes carry the failed change */
    /* Back to the last committed image — not to what LMDB holds now: a
     * later write of the actor, made on top of the failed one, may have
     * committed since (it is undone too: bad_hi). */
    struct sbx_record r;
    if (a->durable && sbx_record_decode(a->durable, a->durable_len, &r) == 0) {
        /* The live container's view (state, generation) stays as it is. */
        char state[16];
        uint64_t gen = a->rec.generation;
        snprintf(state, sizeof(state), "%s", a->rec.state);
        sbx_record_free(&a->rec);
        a->rec = r;
        if (a->cs == C_RUNNING) {
            snprintf(a->rec.state, sizeof(a->rec.state), "%s", state);
            a->rec.generation = gen;
        } else if (a->cs == C_NONE) {
            /* As at load: no container runs, whatever the image says. */
            snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
        }
        a->exists = true;
        actor_load_config(a);
    } else if (!a->durable && a->cs == C_NONE && !a->inflight) {
        /* No record ever committed (or its destroy did) and no container:
         * the sandbox does not exist, also for the ops waiting in its
         * mailbox (a create creates it; issue 11's fill fault: a create
         * after a failed configure answered "existed" and a status read
         * showed the sandbox the failed write made). */
        sbx_record_free(&a->rec);
        memset(&a->rec, 0, sizeof(a->rec));
        a->exists = false;
        actor_load_config(a); /* the failed write's settings go too (a later create
                         * showed them: sleepAfter is cached from the record) */
    } else if (!a->durable) {
        /* No record ever committed, and the sandbox stays (its container
         * runs, or ops wait): the settings of the failed writes go, as
         * they would with the record — else a value answered as failed is
         * read back (issue 11; the fault test's failed_write_visible when
         * the creating write failed on a full disk). */
        sbx_record_set_blob(&a->rec.config, &a->rec.config_len, NULL, 0);
        sbx_record_set_blob(&a->rec.env, &a->rec.env_len, NULL, 0);
        actor_load_config(a);
    }
    /* Supersede the undone writes that may still commit; with none, what
     * comes next depends on the writes before the failed ones only (all
     * decided: commit notes come in order). */
    if (later)
        rewrite_record(a);
    else
        a->last_seq = a->bad_lo - 1;
    /* One that committed stays in LMDB until a write of the actor commits:
     * try again in a while (now the store just refused one). */
    if (!later && a->restore && !a->restore_timer)
        a->restore_timer = sbx_loop_timer(a->sh->loop, RESTORE_RETRY_MS, restore_cb, a);
}

/* ------------------------------------------------------------------------------ */
/* Shutdown. */

void
actor_stop_all(struct shard *sh)
{
    /* Every container gets its SIGKILL first, so that the kernel tears them
     * down side by side; the workers then only reap them and remove their
     * cgroups.  Killed and reaped one at a time, 2,000 sandboxes took 4.3 s
     * to stop (docs/benchmarks.md, "Density"). */
    for (size_t b = 0; b < sh->actors.nbuckets; b++)
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext)
            if (a->cs == C_RUNNING)
                sbx_container_kill(&a->c);
    for (size_t b = 0; b < sh->actors.nbuckets; b++) {
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext) {
            actor_fail_inflight(a, SBX_E_INTERRUPTED, "the shard is stopping");
            actor_fail_list(&a->mb_head, SBX_E_INTERRUPTED, "the shard is stopping");
            a->mb_tail = NULL;
            if (a->cs == C_RUNNING) {
                snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
                actor_save_record(a);
                actor_stop_container(a, false);
            }
        }
    }
}

void
actor_free_all(struct shard *sh)
{
    for (size_t b = 0; b < sh->actors.nbuckets; b++) {
        while (sh->actors.buckets[b]) {
            struct actor *a = sh->actors.buckets[b];
            sh->actors.buckets[b] = a->hnext;
            while (a->mb_head) {
                struct sop *op = a->mb_head;
                a->mb_head = op->next;
                sop_free(op);
            }
            while (a->inflight) {
                struct sop *op = a->inflight;
                a->inflight = op->next;
                sop_free(op);
            }
            if (a->gate)
                sop_free(a->gate);
            actor_release(a);
        }
    }
    sh->actors.n = 0;
}
