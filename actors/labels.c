/*
 * labels.c — sandbox.labels: read or replace a sandbox's labels (the
 * Cloudflare SDK's setLabels); runtime/ops.yaml declares the op and its
 * shapes, docs/protocol.md §3.6 documents it.
 *
 * Labels live in the sandbox record's config map under "labels" (beside
 * sleepAfter and keepAlive), so a replacement is committed before its reply
 * (the op is "mutates": the output gate), replicated with the record, and
 * kept across container and shard restarts.  The intake already checked that
 * `labels` is a map of at most 64 entries (the schema's Labels type); the
 * rules on each entry are here.
 */
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/wire.h"
#include "ops_gen.h"
#include "shard_int.h"

#define LABEL_KEY_MAX 63    /* bytes of a key: [A-Za-z0-9._-], 1..63 */
#define LABEL_VALUE_MAX 255 /* bytes of a value: any UTF-8 but NUL */

/* check_labels — each key a name, each value a string, no key twice; 0 or
 * SBX_E_VALIDATION with *err set (docs/errors.md). */
static int
check_labels(const msgpack_object *l, sbx_err_t *err)
{
    for (uint32_t i = 0; i < l->via.map.size; i++) {
        const msgpack_object_kv *kv = &l->via.map.ptr[i];
        sbx_str k, v;
        bool name_ok = sbx_wire_obj_str(&kv->key, &k) == 0 && k.n >= 1 && k.n <= LABEL_KEY_MAX;
        for (size_t j = 0; name_ok && j < k.n; j++) {
            char c = k.p[j];
            name_ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '_' || c == '-';
        }
        if (!name_ok)
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "a label key must be 1-%d bytes of [A-Za-z0-9._-]", LABEL_KEY_MAX);
        if (kv->val.type != MSGPACK_OBJECT_STR || sbx_wire_obj_str(&kv->val, &v) != 0 ||
            v.n > LABEL_VALUE_MAX || memchr(v.p, '\0', v.n))
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "label '%.*s' must have a string value of at most %d bytes "
                                "without NUL",
                                (int)k.n, k.p, LABEL_VALUE_MAX);
        for (uint32_t j = 0; j < i; j++) {
            sbx_str k2;
            if (sbx_wire_obj_str(&l->via.map.ptr[j].key, &k2) == 0 && k2.n == k.n &&
                !memcmp(k2.p, k.p, k.n))
                return sbx_err_make(err, SBX_E_VALIDATION, "label '%.*s' is given twice",
                                    (int)k.n, k.p);
        }
    }
    return 0;
}

/* store_labels — replace the "labels" entry of a's config map with `l`. */
static void
store_labels(struct actor *a, const msgpack_object *l)
{
    sbx_enc c;
    char *cb;
    size_t cl;
    sbx_enc_init(&c);
    sbx_enc_map(&c);
    sbx_enc_kmap(&c, "labels");
    for (uint32_t i = 0; i < l->via.map.size; i++) {
        sbx_enc_obj(&c, &l->via.map.ptr[i].key);
        sbx_enc_obj(&c, &l->via.map.ptr[i].val);
    }
    sbx_enc_end(&c);
    sbx_enc_end(&c);
    if (sbx_enc_finish(&c, &cb, &cl) != 0)
        return;
    sbx_msg m;
    if (sbx_wire_decode(&m, cb, cl, &sbx_wire_limits_request) == 0) {
        actor_merge_map_blob(&a->rec.config, &a->rec.config_len, m.root);
        sbx_wire_msg_free(&m);
    }
    free(cb);
}

/* encode_labels — "labels": the map in a's config (empty when none). */
static void
encode_labels(struct actor *a, sbx_enc *e)
{
    sbx_msg m;
    const msgpack_object *l = NULL;
    bool have = a->rec.config &&
                sbx_wire_decode(&m, a->rec.config, a->rec.config_len, &sbx_wire_limits_request) == 0;
    sbx_enc_kmap(e, "labels");
    if (have && sbx_wire_get_map(m.root, "labels", &l) == 0) {
        for (uint32_t i = 0; i < l->via.map.size; i++) {
            sbx_enc_obj(e, &l->via.map.ptr[i].key);
            sbx_enc_obj(e, &l->via.map.ptr[i].val);
        }
    }
    sbx_enc_end(e);
    if (have)
        sbx_wire_msg_free(&m);
}

/*
 * sandbox.labels {labels?} → {labels}.  With `labels`, they replace the
 * sandbox's labels (creating the sandbox, as env.set does); without, the
 * current ones are read (SANDBOX_NOT_FOUND for an unknown sandbox).  The
 * reply leaves once the record write before it is committed.
 */
void
actor_op_labels(struct actor *a, struct sop *op)
{
    const msgpack_object *l = NULL;
    _cleanup_err_ sbx_err_t err = NULL;
    if (sbx_wire_get_map(op->req.args, "labels", &l) == 0) {
        if (check_labels(l, &err) != 0) {
            shard_reply_err(op, SBX_E_VALIDATION, "%s", sbx_err_msg(err));
            return;
        }
        actor_ensure_record(a, NULL);
        store_labels(a, l);
        actor_save_record(a);
    } else if (!a->exists) {
        shard_reply_err(op, SBX_E_NOT_FOUND, "sandbox '%s' does not exist", a->id);
        return;
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    encode_labels(a, &e);
    shard_reply_end(op, &e, a->last_seq);
}
