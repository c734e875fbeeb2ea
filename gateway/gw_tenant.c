/*
 * gw_tenant.c — the gateway's tenancy step (gateway_int.h gw_tenant_gate;
 * gateway/tenant.h has the registry; docs/security.md §6): which ops need
 * an admin key, the namespace of a request's sandbox and of a fork's new
 * IDs, and the quota answers.
 */
#include <errno.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/ops.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "gateway_int.h"
#include "tenant.h"


bool
gw_is_admin_op(int id)
{
    return id == SBX_OPID_TENANT_CREATE || id == SBX_OPID_TENANT_LIST ||
           id == SBX_OPID_TENANT_DELETE || id == SBX_OPID_KEY_CREATE ||
           id == SBX_OPID_KEY_LIST || id == SBX_OPID_KEY_REVOKE;
}

/* An admin op's reply, from its thread. */
static void
admin_done(void *arg, const char *reply, size_t len)
{
    gw_client_send_bytes(arg, reply, len);
}

/* Answer g QUOTA_EXCEEDED for `sandbox` (the ID as the tenant named it):
 * context operation, sandboxId, quota, used, limit and, when waiting can
 * help (createsPerSecond, maxSandboxes, maxStreams), retryAfterMs (HTTP:
 * Retry-After). */
static void
quota_refused(struct gctx *g, const struct sbx_op_def *def, const char *sandbox,
              const struct sbx_quota_miss *miss, const char *why)
{
    char *buf;
    size_t len;
    sbx_werr w;
    sbx_werr_init(&w, SBX_E_QUOTA_EXCEEDED, "%s", why);
    sbx_enc_kstr(sbx_werr_ctx(&w), "operation", def->name);
    sbx_enc_kstr(sbx_werr_ctx(&w), "sandboxId", sandbox);
    sbx_enc_kstr(sbx_werr_ctx(&w), "quota", miss->quota);
    sbx_enc_kint(sbx_werr_ctx(&w), "used", miss->used);
    sbx_enc_kint(sbx_werr_ctx(&w), "limit", miss->limit);
    if (miss->retry_ms > 0)
        sbx_enc_kint(sbx_werr_ctx(&w), "retryAfterMs", miss->retry_ms);
    atomic_fetch_add(&g->gw->n_errors, 1);
    if (sbx_wire_reply_err((sbx_str){g->id, strlen(g->id)}, &w, &buf, &len) == 0) {
        gw_client_send_bytes(g, buf, len);
        free(buf);
    } else {
        gw_client_errf(g, SBX_E_QUOTA_EXCEEDED, "%s", why);
    }
    sbx_werr_free(&w);
}

/* Request map `root` again without its "key", with args.owner = tenant
 * (any owner the client gave dropped).  0 with *out (caller frees), or -ENOMEM. */
static int
reencode_owner(const msgpack_object *root, const char *tenant, char **out, size_t *outlen)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    bool had_args = false;
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object_kv *kv = &root->via.map.ptr[i];
        sbx_str k;
        if (sbx_wire_obj_str(&kv->key, &k) != 0 || sbx_str_eq(k, "key"))
            continue;
        sbx_enc_obj(&e, &kv->key);
        if (!sbx_str_eq(k, "args")) {
            sbx_enc_obj(&e, &kv->val);
            continue;
        }
        had_args = true;
        sbx_enc_map(&e); /* args that are no map become {owner} */
        for (uint32_t j = 0; kv->val.type == MSGPACK_OBJECT_MAP && j < kv->val.via.map.size;
             j++) {
            const msgpack_object_kv *a = &kv->val.via.map.ptr[j];
            sbx_str ak;
            if (sbx_wire_obj_str(&a->key, &ak) == 0 && sbx_str_eq(ak, "owner"))
                continue;
            sbx_enc_obj(&e, &a->key);
            sbx_enc_obj(&e, &a->val);
        }
        sbx_enc_kstr(&e, "owner", tenant);
        sbx_enc_end(&e);
    }
    if (!had_args) {
        sbx_enc_kmap(&e, "args");
        sbx_enc_kstr(&e, "owner", tenant);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, out, outlen) ? -ENOMEM : 0;
}

/*
 * The intake's tenancy step (only with API keys): resolve the request's key
 * to g->who, refuse what its scope may not do, put its sandbox into its
 * tenant's namespace (g->ext_id → g->int_id) and check the quotas.  0: go on
 * with *body (the request re-encoded without its key, with the internal ID;
 * caller frees); 1: g was answered.
 */
int
gw_tenant_gate(struct gctx *g, const struct sbx_req *req, const msgpack_object *root,
            const struct sbx_op_def *def, char **body, size_t *blen)
{
    struct sbx_gateway *gw = g->gw;
    char why[256];
    sbx_str key = {NULL, 0};
    sbx_wire_get_str(root, "key", &key);
    if (sbx_tenants_resolve(gw->tenants, key, &g->who) != 0) {
        gw_client_errf(g, SBX_E_UNAUTHORIZED,
                   "a valid API key is required: the request's 'key' field (SBX_API_KEY for "
                   "the sbx CLI and the C library; over HTTP Authorization: Bearer <key>)");
        return 1;
    }
    g->tenanted = true;
    sbx_str for_key;
    if (g->who.scope == SBX_SCOPE_SYSTEM && sbx_wire_get_str(root, "for", &for_key) == 0 &&
        for_key.n && for_key.n < sizeof(g->who.key_id))
        sbx_str_copy(for_key, g->who.key_id, sizeof(g->who.key_id)); /* an admin op's writes */
    bool global = def->flags & SBX_OP_GLOBAL, node = def->flags & SBX_OP_NODE;
    /* backup.list / backup.delete see only the caller's tenant's backups
     * (the shard filters by the `owner` set below), so a tenant key may. */
    bool backup_node = def->id == SBX_OPID_BACKUP_LIST || def->id == SBX_OPID_BACKUP_DELETE;
    bool needs_admin = gw_is_admin_op((int)def->id) || (global && def->id != SBX_OPID_LIST) ||
                       (node && (def->flags & SBX_OP_MUTATES) && !backup_node);
    if (needs_admin && g->who.scope < SBX_SCOPE_ADMIN) {
        gw_client_errf(g, SBX_E_PERMISSION, "%s needs an admin key", def->name);
        return 1;
    }
    if (gw_is_admin_op((int)def->id)) {
        sbx_enc e;
        _cleanup_free_ char *args = NULL;
        size_t alen;
        sbx_enc_init(&e);
        sbx_enc_obj(&e, req->args);
        if (sbx_enc_finish(&e, &args, &alen) != 0 ||
            sbx_tenants_admin(gw->tenants, (int)def->id, g->id, g->who.key_id, args, alen,
                              admin_done, g) != 0)
            gw_client_errf(g, SBX_E_INTERNAL, "cannot start %s", def->name);
        return 1;
    }
    const char *sandbox = NULL;
    if (!global && !node && sbx_id_check(req->sandbox.p, req->sandbox.n, why, sizeof(why)) == 0) {
        if (sbx_tenants_map_id(&g->who, req->sandbox, g->int_id, why, sizeof(why)) != 0) {
            gw_client_errf(g, SBX_E_VALIDATION, "%s", why);
            return 1;
        }
        sbx_str_copy(req->sandbox, g->ext_id, sizeof(g->ext_id));
        struct sbx_quota_miss miss = {0};
        struct sbx_tenant_ask ask = {0, 0, 0, NULL};
        if (def->id == SBX_OPID_CREATE) { /* the limits it asks (else the defaults) */
            const msgpack_object *lim;
            if (sbx_wire_get_map(req->args, "limits", &lim) == 0) {
                sbx_wire_get_i64(lim, "memory", &ask.memory);
                sbx_wire_get_i64(lim, "cpu", &ask.cpu);
            }
            sbx_wire_get_i64(req->args, "disk", &ask.disk);
        }
        if (sbx_tenants_admit(gw->tenants, &g->who, g->int_id, !(def->flags & SBX_OP_NOCREATE),
                              &ask, &miss, why, sizeof(why)) != 0) {
            quota_refused(g, def, g->ext_id, &miss, why);
            return 1;
        }
        /* Streams: a stream.read counts its stream, an op that starts one
         * is refused at the quota (maxStreams). */
        bool counted = false;
        sbx_str sid;
        if (def->id == SBX_OPID_STREAM_READ &&
            sbx_wire_get_str(req->args, "streamId", &sid) == 0 && sid.n && sid.n < 64)
            snprintf(g->stream_key, sizeof(g->stream_key), "%s/%.*s", g->int_id, (int)sid.n,
                     sid.p);
        if ((def->id == SBX_OPID_STREAM_READ && g->stream_key[0]) || (def->flags & SBX_OP_STREAM)) {
            if (sbx_tenants_stream_enter(gw->tenants, &g->who,
                                         g->stream_key[0] ? g->stream_key : NULL, &counted,
                                         &miss, why, sizeof(why)) != 0) {
                g->stream_key[0] = '\0';
                quota_refused(g, def, g->ext_id, &miss, why);
                return 1;
            }
            if (!counted)
                g->stream_key[0] = '\0';
        }
        /* A fork creates each of its `ids`: they count against the quotas
         * like any creation (a fork is no way around maxSandboxes).  Those
         * admitted before one is refused stay counted until a snapshot of
         * the registry started RECENT_GRACE_MS after them (1.5-2.5 s) shows
         * they were never made. */
        const msgpack_object *fids = NULL;
        if (def->id == SBX_OPID_SANDBOX_FORK &&
            sbx_wire_get_array(req->args, "ids", &fids) == 0) {
            for (uint32_t i = 0; i < fids->via.array.size; i++) {
                sbx_str fid;
                char fint[64];
                if (sbx_wire_obj_str(&fids->via.array.ptr[i], &fid) != 0 ||
                    sbx_id_check(fid.p, fid.n, why, sizeof(why)) != 0 ||
                    sbx_tenants_map_id(&g->who, fid, fint, why, sizeof(why)) != 0)
                    continue; /* refused below, with the request's other errors */
                /* a fork's sandbox has its source's limits */
                struct sbx_tenant_ask like = {0, 0, 0, g->int_id};
                if (sbx_tenants_admit(gw->tenants, &g->who, fint, true, &like, &miss, why,
                                      sizeof(why)) != 0) {
                    char ext[SBX_ID_MAX + 1];
                    sbx_str_copy(fid, ext, sizeof(ext));
                    quota_refused(g, def, ext, &miss, why);
                    return 1;
                }
            }
        }
        sandbox = g->int_id;
    }
    if (def->id == SBX_OPID_SANDBOX_FORK) {
        int rc = sbx_tenants_reencode_ids(root, &g->who, sandbox, body, blen, why, sizeof(why));
        if (rc) {
            gw_client_errf(g, rc == SBX_E_VALIDATION ? rc : SBX_E_INTERNAL, "%s",
                       rc == SBX_E_VALIDATION ? why : "cannot encode the request");
            return 1;
        }
        return 0;
    }
    if (backup_node && g->who.scope != SBX_SCOPE_SYSTEM && g->who.tenant[0]) {
        /* A tenant's backups: its own only; the client's `owner` is replaced. */
        if (reencode_owner(root, g->who.tenant, body, blen) != 0) {
            gw_client_errf(g, SBX_E_INTERNAL, "cannot encode the request");
            return 1;
        }
        return 0;
    }
    if (sbx_tenants_reencode(root, sandbox, body, blen) != 0) {
        gw_client_errf(g, SBX_E_INTERNAL, "cannot encode the request");
        return 1;
    }
    return 0;
}
