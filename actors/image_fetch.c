/*
 * image_fetch.c — a shard fetching an image by digest from its peers
 * (docs/images.md, "Images in a cluster"; docs/cluster.md, "Images").
 *
 * The peers are the cluster's live members other than this shard, read from
 * the view on the loop thread (shard_peers_snapshot) and handed to the
 * thread that fetches — a worker starting the sandbox's container
 * (shard_work.c), or an image job (images.c, image.fetch) — which asks them
 * in turn with `image.blob` over nng (shard_image_fetch): a peer that lacks
 * the image answers IMAGE_NOT_FOUND for its manifest and the next one is
 * asked; a peer whose blob does not match its digest is refused
 * (container/image_fetch.c checks it) and the next one is asked too.  One
 * REQ socket per peer asked, closed before the next.
 */
#include <nng/nng.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cview.h"
#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "cluster_int.h"
#include "shard_int.h"

/* Bytes per image.blob answer: far below the frame cap (SBX_WIRE_MAX_FRAME). */
#define FETCH_CHUNK (4u << 20)
/* How long one image.blob request may take. */
#define BLOB_TIMEOUT_MS 30000

struct shard_peers *
shard_peers_snapshot(struct shard *sh, const char *first)
{
    if (!cluster_on(sh))
        return NULL;
    struct cluster *c = sh->cluster;
    struct shard_peers *ps = sbx_xcalloc(1, sizeof(*ps));
    sbx_cview_lock(c->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    for (int i = 0; i < n && ps->n < SBX_CVIEW_MAX_MEMBERS; i++) {
        if (!m[i].name[0] || !m[i].live || !m[i].url[0] || !strcmp(m[i].name, sh->conf.name))
            continue;
        struct shard_peer *p = &ps->p[ps->n++];
        snprintf(p->name, sizeof(p->name), "%s", m[i].name);
        snprintf(p->url, sizeof(p->url), "%s", m[i].url);
        /* The one named first goes first (it has the image: it asked). */
        if (first && !strcmp(m[i].name, first) && ps->n > 1) {
            struct shard_peer t = ps->p[0];
            ps->p[0] = *p;
            *p = t;
        }
    }
    sbx_cview_unlock(c->view);
    return ps;
}

int
shard_successor(struct shard *sh, uint32_t part, struct shard_peer *out)
{
    if (!cluster_on(sh))
        return -1;
    struct cluster *c = sh->cluster;
    const char *names[SBX_CVIEW_MAX_MEMBERS];
    const char *urls[SBX_CVIEW_MAX_MEMBERS];
    size_t k = 0;
    int rc = -1;
    sbx_cview_lock(c->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    for (int i = 0; i < n; i++) {
        if (!m[i].name[0] || !m[i].live || m[i].draining || !m[i].url[0] ||
            !strcmp(m[i].name, sh->conf.name))
            continue;
        names[k] = m[i].name;
        urls[k++] = m[i].url;
    }
    int o = k ? sbx_place_owner(names, k, part) : -1;
    if (o >= 0) {
        snprintf(out->name, sizeof(out->name), "%s", names[o]);
        snprintf(out->url, sizeof(out->url), "%s", urls[o]);
        rc = 0;
    }
    sbx_cview_unlock(c->view);
    return rc;
}

int
shard_peer_roundtrip(nng_socket s, const char *op, const char *args, size_t args_len,
                     int64_t timeout_ms, nng_msg **reply, sbx_err_t *err)
{
    sbx_enc e;
    char id[37];
    sbx_request_id(id);
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstr(&e, "id", id);
    sbx_enc_kstr(&e, "op", op);
    sbx_enc_kint(&e, "timeoutMs", timeout_ms);
    sbx_enc_str(&e, "args");
    sbx_enc_raw(&e, args, args_len);
    sbx_enc_end(&e);
    char *req;
    size_t rl;
    if (sbx_enc_finish(&e, &req, &rl) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode %s", op);
    nng_aio *aio = NULL;
    nng_msg *m = NULL;
    int rc = 0;
    if (nng_aio_alloc(&aio, NULL, NULL) != 0 || nng_msg_alloc(&m, rl) != 0) {
        rc = sbx_err_make(err, SBX_E_INTERNAL, "nng: out of memory");
        goto out;
    }
    memcpy(nng_msg_body(m), req, rl);
    nng_aio_set_timeout(aio, (nng_duration)timeout_ms);
    nng_aio_set_msg(aio, m);
    nng_send_aio(s, aio);
    nng_aio_wait(aio);
    if (nng_aio_result(aio) != 0) {
        nng_msg_free(m);
        rc = sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "send %s: %s", op,
                          nng_strerror(nng_aio_result(aio)));
        goto out;
    }
    nng_recv_aio(s, aio);
    nng_aio_wait(aio);
    if (nng_aio_result(aio) != 0) {
        rc = sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "%s: no answer: %s", op,
                          nng_strerror(nng_aio_result(aio)));
        goto out;
    }
    *reply = nng_aio_get_msg(aio);
out:
    if (aio)
        nng_aio_free(aio);
    free(req);
    return rc;
}

int
shard_peer_call(nng_socket s, const char *op, const char *args, size_t args_len,
                int64_t timeout_ms, char **buf, size_t *len, sbx_msg *out, sbx_err_t *err)
{
    nng_msg *m = NULL;
    int rc = shard_peer_roundtrip(s, op, args, args_len, timeout_ms, &m, err);
    if (rc)
        return rc;
    *len = nng_msg_len(m);
    *buf = sbx_xmalloc(*len ? *len : 1);
    memcpy(*buf, nng_msg_body(m), *len);
    nng_msg_free(m);
    if (sbx_wire_decode(out, *buf, *len, &sbx_wire_limits_reply) != 0) {
        free(*buf);
        *buf = NULL;
        return sbx_err_make(err, SBX_E_INTERNAL, "%s: an answer that is not msgpack", op);
    }
    bool ok = false;
    sbx_wire_get_bool(out->root, "ok", &ok);
    if (!ok) {
        const msgpack_object *eo = NULL;
        sbx_str code = {0}, msg = {0};
        sbx_wire_get_map(out->root, "error", &eo);
        if (eo) {
            sbx_wire_get_str(eo, "code", &code);
            sbx_wire_get_str(eo, "message", &msg);
        }
        int c = code.n ? sbx_err_from_name(code.p, code.n) : 0;
        rc = sbx_err_make(err, c ? c : SBX_E_INTERNAL, "%.*s", (int)msg.n, msg.p ? msg.p : "");
        sbx_wire_msg_free(out);
        free(*buf);
        *buf = NULL;
    }
    return rc;
}

/* The transport of one fetch: image.blob to one peer. */
struct peer_src {
    struct shard *sh;
    nng_socket s;
    const char *name;
    _Atomic uint64_t *bytes; /* progress, or NULL */
};

static int
peer_get(void *arg, const char *digest, uint64_t offset, size_t max, char **data, size_t *len,
         uint64_t *size, sbx_err_t *err)
{
    struct peer_src *ps = arg;
    if (atomic_load(&ps->sh->img_stop))
        return sbx_err_make(err, SBX_E_SHARD_UNAVAILABLE, "the shard is stopping");
    sbx_enc a;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "digest", digest);
    sbx_enc_kint(&a, "offset", (int64_t)offset);
    sbx_enc_kint(&a, "max", (int64_t)max);
    sbx_enc_end(&a);
    char *args, *buf = NULL;
    size_t al, bl;
    if (sbx_enc_finish(&a, &args, &al) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encode image.blob");
    sbx_msg m;
    int rc = shard_peer_call(ps->s, "image.blob", args, al, BLOB_TIMEOUT_MS, &buf, &bl, &m, err);
    free(args);
    if (rc)
        return rc;
    const msgpack_object *res = NULL;
    sbx_str d = {0};
    int64_t sz = -1;
    sbx_wire_get_map(m.root, "result", &res);
    if (!res || sbx_wire_get_bin(res, "data", &d) != 0 || sbx_wire_get_i64(res, "size", &sz) != 0 ||
        sz < 0 || d.n > max) {
        rc = sbx_err_make(err, SBX_E_IMAGE_INVALID, "peer %s: a malformed image.blob answer",
                          ps->name);
    } else {
        *data = sbx_xmalloc(d.n ? d.n : 1);
        memcpy(*data, d.p, d.n);
        *len = d.n;
        *size = (uint64_t)sz;
        if (ps->bytes)
            atomic_fetch_add(ps->bytes, d.n);
    }
    sbx_wire_msg_free(&m);
    free(buf);
    return rc;
}

int
shard_image_fetch(struct shard *sh, const struct shard_peers *peers, const char *digest,
                  int64_t deadline_ms, char from[64], _Atomic uint64_t *bytes,
                  sbx_err_t *err)
{
    from[0] = '\0';
    if (!sh->images)
        return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND, "shard %s has no image store",
                            sh->conf.name);
    char asked[512] = "";
    int last = 0;
    _cleanup_err_ sbx_err_t why = NULL; /* the last peer's error other than "not found" */
    for (int i = 0; peers && i < peers->n; i++) {
        const struct shard_peer *p = &peers->p[i];
        struct peer_src src = {.sh = sh, .name = p->name, .bytes = bytes};
        if (sbx_nng_req_dial(&src.s, p->url, sh->conf.sec, NULL) != 0)
            continue;
        _cleanup_err_ sbx_err_t e = NULL;
        int64_t t0 = sbx_mono_ms();
        uint64_t got = 0;
        char source[96];
        snprintf(source, sizeof(source), "peer %s", p->name);
        int rc = sbx_image_fetch(sh->images, digest, peer_get, &src, FETCH_CHUNK, deadline_ms,
                                 source, &got, &e);
        nng_close(src.s);
        size_t al = strlen(asked);
        snprintf(asked + al, sizeof(asked) - al, "%s%s", al ? ", " : "", p->name);
        if (rc == 0) {
            snprintf(from, 64, "%s", p->name);
            sbx_log_info("image %s fetched from %s: %llu bytes in %lld ms", digest, p->name,
                         (unsigned long long)got, (long long)(sbx_mono_ms() - t0));
            return 0;
        }
        if (rc != SBX_E_IMAGE_NOT_FOUND) {
            sbx_log_warn("image %s: fetch from %s failed: %s", digest, p->name, sbx_err_msg(e));
            sbx_err_release(&why);
            why = e;
            e = NULL;
            last = rc;
        }
        if (rc == SBX_E_TIMEOUT || atomic_load(&sh->img_stop))
            break;
    }
    if (last == SBX_E_TIMEOUT)
        return sbx_err_make(err, last, "%s", sbx_err_msg(why));
    if (last == SBX_E_IMAGE_INVALID)
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "image %s: no peer served it intact: %s (asked: %s)", digest,
                            sbx_err_msg(why), asked);
    return sbx_err_make(err, SBX_E_IMAGE_NOT_FOUND,
                        "no node of the cluster has image %s (this one lacks it; asked: %s)%s%s",
                        digest, asked[0] ? asked : "no live peer", why ? ": " : "",
                        why ? sbx_err_msg(why) : "");
}
