/* record.c — sandbox record codec; see record.h. */
#include "record.h"

#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/util.h"

void
sbx_record_set_blob(char **field, size_t *flen, const void *p, size_t n)
{
    free(*field);
    *field = NULL;
    *flen = 0;
    if (p && n) {
        *field = sbx_xmalloc(n);
        memcpy(*field, p, n);
        *flen = n;
    }
}

int
sbx_record_encode(const struct sbx_record *r, char **out, size_t *len)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "id", r->id);
    sbx_enc_kint(&e, "createdAt", r->created_ms);
    sbx_enc_kint(&e, "updatedAt", r->updated_ms);
    sbx_enc_kstr(&e, "state", r->state);
    sbx_enc_kint(&e, "generation", (int64_t)r->generation);
    sbx_enc_kint(&e, "restarts", (int64_t)r->restarts);
    sbx_enc_kmap(&e, "limits");
    sbx_enc_kint(&e, "memory", (int64_t)r->limits.memory);
    sbx_enc_kint(&e, "pids", r->limits.pids);
    sbx_enc_kint(&e, "cpu", r->limits.cpu_milli);
    sbx_enc_end(&e);
    if (r->env) {
        sbx_enc_str(&e, "env");
        sbx_enc_raw(&e, r->env, r->env_len);
    }
    if (r->config) {
        sbx_enc_str(&e, "config");
        sbx_enc_raw(&e, r->config, r->config_len);
    }
    if (r->ports) {
        sbx_enc_str(&e, "ports");
        sbx_enc_raw(&e, r->ports, r->ports_len);
    }
    if (r->image[0])
        sbx_enc_kstr(&e, "image", r->image);
    if (r->persistent)
        sbx_enc_kstr(&e, "workspace", "persistent");
    if (r->ws_made)
        sbx_enc_kbool(&e, "wsMade", true);
    if (r->disk)
        sbx_enc_kint(&e, "disk", (int64_t)r->disk);
    if (r->imgcfg) {
        sbx_enc_str(&e, "imageConfig");
        sbx_enc_raw(&e, r->imgcfg, r->imgcfg_len);
    }
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, out, len);
}

static void
blob_of(const msgpack_object *root, const char *key, char **field, size_t *flen)
{
    const msgpack_object *o = NULL;
    if (sbx_wire_get_map(root, key, &o) != 0)
        return;
    sbx_enc e;
    char *b;
    size_t n;
    sbx_enc_init(&e);
    sbx_enc_obj(&e, o);
    if (sbx_enc_finish(&e, &b, &n) == 0) {
        *field = b;
        *flen = n;
    }
}

int
sbx_record_decode(const void *buf, size_t len, struct sbx_record *r)
{
    sbx_msg m;
    sbx_str s;
    int64_t v;
    const msgpack_object *lim;

    memset(r, 0, sizeof(*r));
    if (sbx_wire_decode(&m, buf, len, &sbx_wire_limits_request) != 0)
        return SBX_E_STORAGE;
    int rc = SBX_E_STORAGE;
    if (sbx_wire_get_str(m.root, "id", &s) != 0 || sbx_str_copy(s, r->id, sizeof(r->id)) != 0)
        goto out;
    if (sbx_wire_get_i64(m.root, "createdAt", &r->created_ms) != 0)
        goto out;
    sbx_wire_get_i64(m.root, "updatedAt", &r->updated_ms);
    if (sbx_wire_get_str(m.root, "state", &s) == 0)
        sbx_str_copy(s, r->state, sizeof(r->state));
    if (sbx_wire_get_i64(m.root, "generation", &v) == 0 && v >= 0)
        r->generation = (uint64_t)v;
    if (sbx_wire_get_i64(m.root, "restarts", &v) == 0 && v >= 0)
        r->restarts = (uint64_t)v;
    if (sbx_wire_get_map(m.root, "limits", &lim) == 0) {
        if (sbx_wire_get_i64(lim, "memory", &v) == 0 && v >= 0)
            r->limits.memory = (uint64_t)v;
        if (sbx_wire_get_i64(lim, "pids", &v) == 0 && v >= 0 && v <= UINT32_MAX)
            r->limits.pids = (uint32_t)v;
        if (sbx_wire_get_i64(lim, "cpu", &v) == 0 && v >= 0 && v <= UINT32_MAX)
            r->limits.cpu_milli = (uint32_t)v;
    }
    blob_of(m.root, "env", &r->env, &r->env_len);
    blob_of(m.root, "config", &r->config, &r->config_len);
    blob_of(m.root, "ports", &r->ports, &r->ports_len);
    if (sbx_wire_get_str(m.root, "image", &s) == 0 && s.n < sizeof(r->image))
        sbx_str_copy(s, r->image, sizeof(r->image));
    r->persistent = sbx_wire_get_str(m.root, "workspace", &s) == 0 && s.n == 10 &&
                    !memcmp(s.p, "persistent", 10);
    if (sbx_wire_get_i64(m.root, "disk", &v) == 0 && v > 0)
        r->disk = (uint64_t)v;
    bool made = false;
    r->ws_made = sbx_wire_get_bool(m.root, "wsMade", &made) == 0 && made;
    blob_of(m.root, "imageConfig", &r->imgcfg, &r->imgcfg_len);
    rc = 0;
out:
    sbx_wire_msg_free(&m);
    return rc;
}

void
sbx_record_free(struct sbx_record *r)
{
    free(r->env);
    free(r->config);
    free(r->ports);
    free(r->imgcfg);
    r->env = r->config = r->ports = r->imgcfg = NULL;
    r->env_len = r->config_len = r->ports_len = r->imgcfg_len = 0;
}
