/* wire.c — msgpack codec with hostile-input checks; see wire.h. */
#include "wire.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "util.h"

const struct sbx_wire_limits sbx_wire_limits_request = {.max_depth = 16, .max_objects = 1u << 18};
const struct sbx_wire_limits sbx_wire_limits_reply = {.max_depth = 24, .max_objects = 1u << 23};

bool
sbx_str_eq(sbx_str a, const char *s)
{
    size_t n = strlen(s);
    return a.n == n && (n == 0 || memcmp(a.p, s, n) == 0);
}

char *
sbx_str_dup(sbx_str s)
{
    return sbx_xstrndup(s.p ? s.p : "", s.n);
}

int
sbx_str_copy(sbx_str s, char *out, size_t outlen)
{
    if (s.n >= outlen)
        return -ENAMETOOLONG;
    if (s.n)
        memcpy(out, s.p, s.n);
    out[s.n] = '\0';
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Pre-scan. */

static uint64_t
be(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v = (v << 8) | p[i];
    return v;
}

int
sbx_wire_check(const void *buf, size_t len, const struct sbx_wire_limits *lim)
{
    const uint8_t *p = buf;
    size_t off = 0, objects = 0;
    uint64_t left[32]; /* items still to read at each open level */
    unsigned depth = 0, maxd = lim->max_depth < 30 ? lim->max_depth : 30;

    if (len == 0)
        return SBX_E_MALFORMED;
    left[0] = 1; /* exactly one top-level object */
    for (;;) {
        while (depth > 0 && left[depth] == 0)
            depth--;
        if (depth == 0 && left[0] == 0)
            break;
        left[depth]--;
        if (off >= len)
            return SBX_E_MALFORMED;
        if (++objects > lim->max_objects)
            return SBX_E_MALFORMED;
        uint8_t t = p[off++];
        size_t rem = len - off;
        uint64_t skip = 0, count = 0;
        bool container = false;
        if (t <= 0x7f || t >= 0xe0 || t == 0xc0 || t == 0xc2 || t == 0xc3) {
            skip = 0;
        } else if ((t & 0xe0) == 0xa0) {
            skip = t & 0x1f;
        } else if ((t & 0xf0) == 0x90) {
            container = true;
            count = t & 0x0f;
        } else if ((t & 0xf0) == 0x80) {
            container = true;
            count = (uint64_t)(t & 0x0f) * 2;
        } else {
            switch (t) {
            case 0xcc: case 0xd0: skip = 1; break;
            case 0xcd: case 0xd1: skip = 2; break;
            case 0xca: case 0xce: case 0xd2: skip = 4; break;
            case 0xcb: case 0xcf: case 0xd3: skip = 8; break;
            case 0xc4: case 0xd9:
                if (rem < 1) return SBX_E_MALFORMED;
                skip = 1 + be(p + off, 1);
                break;
            case 0xc5: case 0xda:
                if (rem < 2) return SBX_E_MALFORMED;
                skip = 2 + be(p + off, 2);
                break;
            case 0xc6: case 0xdb:
                if (rem < 4) return SBX_E_MALFORMED;
                skip = 4 + be(p + off, 4);
                break;
            case 0xdc:
                if (rem < 2) return SBX_E_MALFORMED;
                container = true;
                count = be(p + off, 2);
                off += 2;
                break;
            case 0xdd:
                if (rem < 4) return SBX_E_MALFORMED;
                container = true;
                count = be(p + off, 4);
                off += 4;
                break;
            case 0xde:
                if (rem < 2) return SBX_E_MALFORMED;
                container = true;
                count = be(p + off, 2) * 2;
                off += 2;
                break;
            case 0xdf:
                if (rem < 4) return SBX_E_MALFORMED;
                container = true;
                count = be(p + off, 4) * 2;
                off += 4;
                break;
            default:
                /* 0xc1 (never used) and every ext type (0xc7-0xc9, 0xd4-0xd8). */
                return SBX_E_MALFORMED;
            }
        }
        if (container) {
            /* Every element takes at least one byte: a count larger than what is
             * left is a lie, whatever the decoder would have reserved for it. */
            if (count > len - off)
                return SBX_E_MALFORMED;
            if (count > 0) {
                if (depth + 1 >= maxd)
                    return SBX_E_MALFORMED;
                left[++depth] = count;
            }
        } else {
            if (skip > len - off)
                return SBX_E_MALFORMED;
            off += skip;
        }
    }
    return off == len ? 0 : SBX_E_MALFORMED;
}

int
sbx_wire_decode(sbx_msg *m, const void *buf, size_t len, const struct sbx_wire_limits *lim)
{
    size_t off = 0;
    if (sbx_wire_check(buf, len, lim) != 0)
        return SBX_E_MALFORMED;
    msgpack_unpacked_init(&m->u);
    msgpack_unpack_return r = msgpack_unpack_next(&m->u, buf, len, &off);
    if (r != MSGPACK_UNPACK_SUCCESS || off != len || m->u.data.type != MSGPACK_OBJECT_MAP) {
        /* NOMEM here means a frame we should not have accepted: a bad request. */
        msgpack_unpacked_destroy(&m->u);
        return SBX_E_MALFORMED;
    }
    m->root = &m->u.data;
    return 0;
}

void
sbx_wire_msg_free(sbx_msg *m)
{
    msgpack_unpacked_destroy(&m->u);
    m->root = NULL;
}

const msgpack_object *
sbx_wire_get(const msgpack_object *map, const char *key)
{
    if (!map || map->type != MSGPACK_OBJECT_MAP)
        return NULL;
    size_t n = strlen(key);
    for (uint32_t i = 0; i < map->via.map.size; i++) {
        const msgpack_object_kv *kv = &map->via.map.ptr[i];
        if (kv->key.type == MSGPACK_OBJECT_STR && kv->key.via.str.size == n &&
            memcmp(kv->key.via.str.ptr, key, n) == 0) {
            if (kv->val.type == MSGPACK_OBJECT_NIL)
                return NULL;
            return &kv->val;
        }
    }
    return NULL;
}

int
sbx_wire_obj_str(const msgpack_object *o, sbx_str *out)
{
    if (o->type == MSGPACK_OBJECT_STR) {
        out->p = o->via.str.ptr;
        out->n = o->via.str.size;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_BIN) {
        out->p = o->via.bin.ptr;
        out->n = o->via.bin.size;
        return 0;
    }
    return SBX_E_VALIDATION;
}

int
sbx_wire_get_str(const msgpack_object *map, const char *key, sbx_str *out)
{
    const msgpack_object *o = sbx_wire_get(map, key);
    if (!o)
        return -ENOENT;
    if (o->type != MSGPACK_OBJECT_STR)
        return SBX_E_VALIDATION;
    out->p = o->via.str.ptr;
    out->n = o->via.str.size;
    return 0;
}

int
sbx_wire_get_bin(const msgpack_object *map, const char *key, sbx_str *out)
{
    const msgpack_object *o = sbx_wire_get(map, key);
    if (!o)
        return -ENOENT;
    return sbx_wire_obj_str(o, out);
}

int
sbx_wire_get_i64(const msgpack_object *map, const char *key, int64_t *out)
{
    const msgpack_object *o = sbx_wire_get(map, key);
    if (!o)
        return -ENOENT;
    if (o->type == MSGPACK_OBJECT_POSITIVE_INTEGER) {
        if (o->via.u64 > INT64_MAX)
            return SBX_E_VALIDATION;
        *out = (int64_t)o->via.u64;
        return 0;
    }
    if (o->type == MSGPACK_OBJECT_NEGATIVE_INTEGER) {
        *out = o->via.i64;
        return 0;
    }
    return SBX_E_VALIDATION;
}

int
sbx_wire_get_bool(const msgpack_object *map, const char *key, bool *out)
{
    const msgpack_object *o = sbx_wire_get(map, key);
    if (!o)
        return -ENOENT;
    if (o->type != MSGPACK_OBJECT_BOOLEAN)
        return SBX_E_VALIDATION;
    *out = o->via.boolean;
    return 0;
}

int
sbx_wire_get_map(const msgpack_object *map, const char *key, const msgpack_object **out)
{
    const msgpack_object *o = sbx_wire_get(map, key);
    if (!o)
        return -ENOENT;
    if (o->type != MSGPACK_OBJECT_MAP)
        return SBX_E_VALIDATION;
    *out = o;
    return 0;
}

int
sbx_wire_get_array(const msgpack_object *map, const char *key, const msgpack_object **out)
{
    const msgpack_object *o = sbx_wire_get(map, key);
    if (!o)
        return -ENOENT;
    if (o->type != MSGPACK_OBJECT_ARRAY)
        return SBX_E_VALIDATION;
    *out = o;
    return 0;
}

static const msgpack_object empty_map = {.type = MSGPACK_OBJECT_MAP};

int
sbx_wire_parse_req(const msgpack_object *root, struct sbx_req *r, char *why, size_t whylen)
{
    int64_t v = 0;
    int rc;

    memset(r, 0, sizeof(*r));
    r->args = &empty_map;
    if (sbx_wire_get_i64(root, "v", &v) != 0) {
        snprintf(why, whylen, "missing or invalid field 'v' (protocol version)");
        return SBX_E_MALFORMED;
    }
    if (sbx_wire_get_str(root, "id", &r->id) != 0 || r->id.n == 0 || r->id.n > SBX_WIRE_MAX_ID) {
        snprintf(why, whylen, "field 'id' must be a string of 1-%d bytes", SBX_WIRE_MAX_ID);
        return SBX_E_MALFORMED;
    }
    if (v != SBX_WIRE_VERSION) {
        snprintf(why, whylen, "protocol version %lld is not supported (this server speaks %d)",
                 (long long)v, SBX_WIRE_VERSION);
        return SBX_E_VERSION;
    }
    r->v = (uint32_t)v;
    if (sbx_wire_get_str(root, "op", &r->op) != 0 || r->op.n == 0 || r->op.n > 64) {
        snprintf(why, whylen, "field 'op' must be a string of 1-64 bytes");
        return SBX_E_MALFORMED;
    }
    rc = sbx_wire_get_str(root, "sandbox", &r->sandbox);
    if (rc == SBX_E_VALIDATION) {
        snprintf(why, whylen, "field 'sandbox' must be a string");
        return SBX_E_MALFORMED;
    }
    rc = sbx_wire_get_i64(root, "timeoutMs", &r->timeout_ms);
    if (rc == SBX_E_VALIDATION || r->timeout_ms < 0) {
        snprintf(why, whylen, "field 'timeoutMs' must be a non-negative integer");
        return SBX_E_MALFORMED;
    }
    r->retry = false;
    if (sbx_wire_get_bool(root, "retry", &r->retry) == SBX_E_VALIDATION) {
        snprintf(why, whylen, "field 'retry' must be a boolean");
        return SBX_E_MALFORMED;
    }
    const msgpack_object *a = NULL;
    rc = sbx_wire_get_map(root, "args", &a);
    if (rc == SBX_E_VALIDATION) {
        snprintf(why, whylen, "field 'args' must be a map");
        return SBX_E_MALFORMED;
    }
    if (a)
        r->args = a;
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Encoder. */

static int
enc_write(void *data, const char *buf, size_t len)
{
    sbx_enc *e = data;
    /* msgpack-c decodes an empty str/bin with a NULL pointer when nothing
     * variable-length came before it in the frame, and memcpy(dst, NULL, 0)
     * is undefined (UBSan aborts; found by tests/fuzz/fuzz_wire.c). */
    if (len == 0)
        return 0;
    if (e->len + len > e->cap) {
        size_t cap = e->cap ? e->cap : 256;
        while (cap < e->len + len)
            cap *= 2;
        e->p = sbx_xrealloc(e->p, cap);
        e->cap = cap;
    }
    memcpy(e->p + e->len, buf, len);
    e->len += len;
    return 0;
}

void
sbx_enc_init(sbx_enc *e)
{
    memset(e, 0, sizeof(*e));
    msgpack_packer_init(&e->pk, e, enc_write);
}

void
sbx_enc_free(sbx_enc *e)
{
    free(e->p);
    e->p = NULL;
    e->len = e->cap = 0;
}

int
sbx_enc_finish(sbx_enc *e, char **out, size_t *len)
{
    if (e->bad || e->depth != 0) {
        sbx_enc_free(e);
        return -EINVAL;
    }
    *out = e->p ? e->p : sbx_xcalloc(1, 1);
    *len = e->len;
    e->p = NULL;
    e->len = e->cap = 0;
    return 0;
}

static void
item(sbx_enc *e)
{
    if (e->depth > 0)
        e->st[e->depth - 1].items++;
}

static void
open_container(sbx_enc *e, bool map)
{
    item(e);
    if (e->depth >= (int)SBX_ARRAY_LEN(e->st)) {
        e->bad = true;
        return;
    }
    e->st[e->depth].off = e->len;
    e->st[e->depth].items = 0;
    e->st[e->depth].map = map;
    e->depth++;
    char hdr[5] = {(char)(map ? 0xdf : 0xdd), 0, 0, 0, 0};
    enc_write(e, hdr, sizeof(hdr));
}

void
sbx_enc_map(sbx_enc *e)
{
    open_container(e, true);
}

void
sbx_enc_array(sbx_enc *e)
{
    open_container(e, false);
}

void
sbx_enc_end(sbx_enc *e)
{
    if (e->depth <= 0) {
        e->bad = true;
        return;
    }
    e->depth--;
    uint32_t n = e->st[e->depth].items;
    if (e->st[e->depth].map) {
        if (n % 2)
            e->bad = true;
        n /= 2;
    }
    unsigned char *h = (unsigned char *)e->p + e->st[e->depth].off + 1;
    h[0] = (unsigned char)(n >> 24);
    h[1] = (unsigned char)(n >> 16);
    h[2] = (unsigned char)(n >> 8);
    h[3] = (unsigned char)n;
}

void
sbx_enc_strn(sbx_enc *e, const char *s, size_t n)
{
    item(e);
    msgpack_pack_str(&e->pk, n);
    msgpack_pack_str_body(&e->pk, s, n);
}

void
sbx_enc_str(sbx_enc *e, const char *s)
{
    sbx_enc_strn(e, s ? s : "", s ? strlen(s) : 0);
}

void
sbx_enc_bin(sbx_enc *e, const void *p, size_t n)
{
    item(e);
    msgpack_pack_bin(&e->pk, n);
    msgpack_pack_bin_body(&e->pk, p, n);
}

void
sbx_enc_int(sbx_enc *e, int64_t v)
{
    item(e);
    msgpack_pack_int64(&e->pk, v);
}

void
sbx_enc_uint(sbx_enc *e, uint64_t v)
{
    item(e);
    msgpack_pack_uint64(&e->pk, v);
}

void
sbx_enc_double(sbx_enc *e, double v)
{
    item(e);
    msgpack_pack_double(&e->pk, v);
}

void
sbx_enc_bool(sbx_enc *e, bool v)
{
    item(e);
    if (v)
        msgpack_pack_true(&e->pk);
    else
        msgpack_pack_false(&e->pk);
}

void
sbx_enc_nil(sbx_enc *e)
{
    item(e);
    msgpack_pack_nil(&e->pk);
}

void
sbx_enc_obj(sbx_enc *e, const msgpack_object *o)
{
    item(e);
    msgpack_pack_object(&e->pk, *o);
}

void
sbx_enc_raw(sbx_enc *e, const void *p, size_t n)
{
    item(e);
    enc_write(e, p, n);
}

void
sbx_enc_kstr(sbx_enc *e, const char *k, const char *v)
{
    sbx_enc_str(e, k);
    sbx_enc_str(e, v);
}

void
sbx_enc_kstrn(sbx_enc *e, const char *k, const char *v, size_t n)
{
    sbx_enc_str(e, k);
    sbx_enc_strn(e, v, n);
}

void
sbx_enc_kint(sbx_enc *e, const char *k, int64_t v)
{
    sbx_enc_str(e, k);
    sbx_enc_int(e, v);
}

void
sbx_enc_kbool(sbx_enc *e, const char *k, bool v)
{
    sbx_enc_str(e, k);
    sbx_enc_bool(e, v);
}

void
sbx_enc_kbin(sbx_enc *e, const char *k, const void *p, size_t n)
{
    sbx_enc_str(e, k);
    sbx_enc_bin(e, p, n);
}

void
sbx_enc_kmap(sbx_enc *e, const char *k)
{
    sbx_enc_str(e, k);
    sbx_enc_map(e);
}

void
sbx_enc_karray(sbx_enc *e, const char *k)
{
    sbx_enc_str(e, k);
    sbx_enc_array(e);
}

/* ------------------------------------------------------------------------------ */
/* Errors and replies. */

void
sbx_werr_init(sbx_werr *w, int code, const char *fmt, ...)
{
    va_list ap;
    w->code = code;
    w->message[0] = '\0';
    if (fmt) {
        va_start(ap, fmt);
        vsnprintf(w->message, sizeof(w->message), fmt, ap);
        va_end(ap);
    }
    if (!w->message[0])
        snprintf(w->message, sizeof(w->message), "%s", sbx_err_message(code));
    sbx_enc_init(&w->ctx);
    sbx_enc_map(&w->ctx);
    w->ctx_used = true;
}

sbx_enc *
sbx_werr_ctx(sbx_werr *w)
{
    return &w->ctx;
}

void
sbx_werr_free(sbx_werr *w)
{
    if (w->ctx_used)
        sbx_enc_free(&w->ctx);
    w->ctx_used = false;
}

void
sbx_enc_werr(sbx_enc *e, sbx_werr *w)
{
    sbx_enc_map(e);
    sbx_enc_kstr(e, "code", sbx_err_name(w->code));
    sbx_enc_kstr(e, "message", w->message);
    sbx_enc_str(e, "context");
    if (w->ctx_used && w->ctx.depth == 1) {
        /* Close a copy of the context map in place, then splice its bytes. */
        sbx_enc_end(&w->ctx);
        sbx_enc_raw(e, w->ctx.p, w->ctx.len);
        w->ctx.depth = 1; /* the bytes stay valid; reopen for further use */
    } else {
        sbx_enc_map(e);
        sbx_enc_end(e);
    }
    sbx_enc_end(e);
}

void
sbx_enc_reply_ok(sbx_enc *e, sbx_str id)
{
    sbx_enc_map(e);
    sbx_enc_kint(e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstrn(e, "id", id.p, id.n);
    sbx_enc_kbool(e, "ok", true);
    sbx_enc_kmap(e, "result");
}

int
sbx_wire_reply_err(sbx_str id, sbx_werr *w, char **out, size_t *len)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstrn(&e, "id", id.p ? id.p : "", id.n);
    sbx_enc_kbool(&e, "ok", false);
    sbx_enc_str(&e, "error");
    sbx_enc_werr(&e, w);
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, out, len);
}

int
sbx_wire_reply_errf(sbx_str id, int code, char **out, size_t *len, const char *fmt, ...)
{
    sbx_werr w;
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sbx_werr_init(&w, code, "%s", msg);
    int rc = sbx_wire_reply_err(id, &w, out, len);
    sbx_werr_free(&w);
    return rc;
}
