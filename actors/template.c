/*
 * template.c — template.build (runtime/ops/images.yaml; docs/images.md,
 * "Templates"): an image plus build steps run in a container of it, whose
 * writable layer becomes the new image's top layer.
 *
 * Runs on an image job's thread (images.c), blocking: it starts a container
 * of the base image with the shard's spawner (not an actor: the build
 * sandbox has no ID, no record, no client), talks to its agent over the
 * channel with blocking frames, reads the overlay's upper dir through the
 * agent's AGENT_UPPER_FD (/proc/<pid>/fd/N: the shard is root on the host;
 * the agent is non-dumpable, so tenant processes cannot), writes it as a
 * gzip tar with OCI whiteouts (container/image_layer.c), stops the
 * container, and adds the image (sbx_image_add_layer).  The container is
 * started and stopped on this thread, as sbx_container_start requires.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "../container/agent/agent.h"
#include "../container/image_store.h"
#include "../container/spawn.h"
#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/frame.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "shard_int.h"

/* Bytes of a failing step's stdout and stderr quoted in the error. */
#define TPL_OUTPUT_QUOTE 4096

/* A decoded reply and the frame it points into. */
struct tpl_reply {
    sbx_msg m;
    char *frame;
};

static void
reply_free(struct tpl_reply *r)
{
    sbx_wire_msg_free(&r->m);
    free(r->frame);
}

/*
 * Send {t: tag, op, a: args} to the agent and wait for the reply of that
 * tag (events, tag 0, are skipped).  *out is the caller's (reply_free) when
 * 0 is returned; a reply {ok: false} becomes its code and message.
 */
static int
agent_call(struct shard *sh, int chan, uint64_t tag, const char *op, sbx_enc *args,
           struct tpl_reply *out, sbx_err_t *err)
{
    sbx_enc e;
    char *buf = NULL, *ab = NULL;
    size_t len, al;
    int rc;
    sbx_enc_end(args);
    if (sbx_enc_finish(args, &ab, &al) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode %s", op);
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "t");
    sbx_enc_uint(&e, tag);
    sbx_enc_kstr(&e, "op", op);
    sbx_enc_str(&e, "a");
    sbx_enc_raw(&e, ab, al);
    sbx_enc_end(&e);
    free(ab);
    if (sbx_enc_finish(&e, &buf, &len) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode %s", op);
    rc = sbx_frame_send_blocking(chan, buf, len);
    free(buf);
    if (rc)
        return sbx_err_make(err, SBX_E_CONTAINER, "send %s to the build container: %s", op,
                            strerror(-rc));
    for (;;) {
        char *f = NULL;
        size_t n = 0;
        /* A second at a time, so a stopping shard does not wait for a
         * long step (shard_images_stop). */
        struct pollfd pfd = {.fd = chan, .events = POLLIN};
        int pr = poll(&pfd, 1, 1000);
        if (atomic_load(&sh->img_stop))
            return sbx_err_make(err, SBX_E_CONTAINER, "the shard is stopping: build abandoned");
        if (pr == 0 || (pr < 0 && errno == EINTR))
            continue;
        rc = sbx_frame_recv_blocking(chan, SBX_WIRE_MAX_FRAME, &f, &n);
        if (rc)
            return sbx_err_make(err, SBX_E_CONTAINER,
                                "the build container did not answer %s: %s", op,
                                rc == -EAGAIN ? "timed out" : strerror(-rc));
        sbx_msg m;
        rc = sbx_wire_decode(&m, f, n, &sbx_wire_limits_reply);
        if (rc) {
            free(f);
            return sbx_err_make(err, SBX_E_CONTAINER, "a malformed frame from the build container");
        }
        int64_t t = -1;
        sbx_wire_get_i64(m.root, "t", &t);
        if (t != (int64_t)tag) {
            sbx_wire_msg_free(&m);
            free(f);
            continue;
        }
        bool ok = false;
        sbx_wire_get_bool(m.root, "ok", &ok);
        if (!ok) {
            const msgpack_object *eo = NULL;
            sbx_str code = {0}, msg = {0};
            sbx_wire_get_map(m.root, "e", &eo);
            if (eo) {
                sbx_wire_get_str(eo, "code", &code);
                sbx_wire_get_str(eo, "message", &msg);
            }
            rc = sbx_err_make(err, code.n ? sbx_err_from_name(code.p, code.n) : SBX_E_COMMAND,
                              "%s in the build container: %.*s", op, (int)msg.n,
                              msg.p ? msg.p : "");
            sbx_wire_msg_free(&m);
            free(f);
            return rc;
        }
        out->m = m;
        out->frame = f;
        return 0;
    }
}

/* Run step i (a shell string) to its end; a non-zero exit is
 * SBX_E_TEMPLATE_BUILD with the step's output. */
static int
run_step(struct shard *sh, int chan, int i, int n, const char *cmd, int64_t step_ms,
         sbx_err_t *err)
{
    sbx_enc a;
    struct tpl_reply m;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "command", cmd);
    sbx_enc_kbool(&a, "sessionless", true);
    sbx_enc_kint(&a, "timeout", step_ms);
    int rc = agent_call(sh, chan, (uint64_t)i + 2, "exec", &a, &m, err);
    if (rc)
        return rc;
    const msgpack_object *r = NULL;
    int64_t code = -1;
    sbx_str out = {0}, errs = {0};
    sbx_wire_get_map(m.m.root, "r", &r);
    if (r) {
        sbx_wire_get_i64(r, "exitCode", &code);
        sbx_wire_get_bin(r, "stdout", &out);
        sbx_wire_get_bin(r, "stderr", &errs);
    }
    if (code != 0) {
        /* The ends of the output: where a failing build says why. */
        size_t on = SBX_MIN(out.n, (size_t)TPL_OUTPUT_QUOTE);
        size_t en = SBX_MIN(errs.n, (size_t)TPL_OUTPUT_QUOTE);
        rc = sbx_err_make(err, SBX_E_TEMPLATE_BUILD,
                          "template step %d of %d (%s) exited with %lld%s\n--- stdout ---\n%.*s"
                          "\n--- stderr ---\n%.*s",
                          i + 1, n, cmd, (long long)code, code == 124 ? " (timed out)" : "",
                          (int)on, out.p ? out.p + (out.n - on) : "", (int)en,
                          errs.p ? errs.p + (errs.n - en) : "");
    } else {
        sbx_log_info("template step %d of %d done: %s", i + 1, n, cmd);
    }
    reply_free(&m);
    return rc;
}

int
shard_template_build(struct shard *sh, const char *name, const char *from, char *const *run,
                     int nrun, int64_t step_ms, char digest[SBX_IMAGE_DIGEST_LEN], sbx_err_t *err)
{
    sbx_image_store *st = sh->images;
    char base[SBX_IMAGE_DIGEST_LEN], why[256] = "", tmp[4200] = "", blob[4300];
    struct sbx_image_root root;
    struct sbx_container c;
    bool started = false;
    char *created_by = NULL;
    int rc;
    memset(&c, 0, sizeof(c));
    memset(&root, 0, sizeof(root));
    root.use_fd = -1;
    if (!sbx_image_name_valid(name))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "template name '%s': 1-255 bytes of [A-Za-z0-9._/:@-], not sha256:…",
                            name);
    if ((rc = sbx_image_resolve(st, from, base, err)) != 0)
        return rc;
    if ((rc = sbx_image_open_root(st, base, &root, err)) != 0)
        return rc;
    rc = sbx_container_start_image(sh->spawner, &sh->limits, &root, &c, why, sizeof(why));
    if (rc) {
        rc = sbx_err_make(err, rc, "start a container of %s: %s", base, why);
        goto out;
    }
    started = true;
    /* No read of a frame waits forever: the agent ends each step at
     * step_ms, and a frame begun is whole within a minute. */
    struct timeval tv = {.tv_sec = 60};
    setsockopt(c.chan, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    sbx_enc a;
    struct tpl_reply m;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "sandbox", "template-build");
    if ((rc = agent_call(sh, c.chan, 1, "bind", &a, &m, err)) != 0)
        goto out;
    reply_free(&m);
    for (int i = 0; i < nrun; i++)
        if ((rc = run_step(sh, c.chan, i, nrun, run[i], step_ms, err)) != 0)
            goto out;

    /* The writable layer, while the container (and its tmpfs) lives. */
    snprintf(tmp, sizeof(tmp), "%s/tmp/template-XXXXXX", sbx_image_store_dir(st));
    if (!mkdtemp(tmp)) {
        rc = sbx_err_make(err, SBX_E_STORAGE, "mkdtemp %s: %s", tmp, strerror(errno));
        tmp[0] = '\0';
        goto out;
    }
    snprintf(blob, sizeof(blob), "%s/layer.tar.gz", tmp);
    char up[64];
    snprintf(up, sizeof(up), "/proc/%d/fd/%d", (int)c.pid, AGENT_UPPER_FD);
    {
        _cleanup_close_ int ufd = open(up, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (ufd < 0) {
            rc = sbx_err_make(err, SBX_E_CONTAINER, "open the build container's upper dir (%s): %s",
                              up, strerror(errno));
            goto out;
        }
        struct sbx_layer_ids ids = {.host_root = c.uid, .host_user = c.uid2,
                                    .user_uid = root.run_uid, .user_gid = root.run_gid};
        if ((rc = sbx_image_layer_write(ufd, &ids, blob, err)) != 0)
            goto out;
    }
    sbx_container_stop(sh->spawner, &c);
    started = false;
    /* history's created_by: the steps, as Docker writes a RUN line. */
    size_t cap = 64;
    for (int i = 0; i < nrun; i++)
        cap += strlen(run[i]) + 4;
    created_by = sbx_xmalloc(cap);
    size_t o = (size_t)snprintf(created_by, cap, "sbx template build");
    for (int i = 0; i < nrun; i++)
        o += (size_t)snprintf(created_by + o, cap - o, "%s %s", i ? " &&" : " --run", run[i]);
    rc = sbx_image_add_layer(st, base, blob, name, created_by, digest, err);
out:
    if (started)
        sbx_container_stop(sh->spawner, &c);
    sbx_image_root_free(&root);
    if (tmp[0])
        sbx_rm_rf(tmp);
    free(created_by);
    return rc;
}
