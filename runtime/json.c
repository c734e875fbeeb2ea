/* json.c — see json.h. */
#include "json.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "util.h"

size_t
sbx_utf8_seq(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    unsigned char c = p[0];
    if (c < 0x80)
        return 1;
    size_t len;
    unsigned min;
    unsigned cp;
    if ((c & 0xe0) == 0xc0) { len = 2; cp = c & 0x1f; min = 0x80; }
    else if ((c & 0xf0) == 0xe0) { len = 3; cp = c & 0x0f; min = 0x800; }
    else if ((c & 0xf8) == 0xf0) { len = 4; cp = c & 0x07; min = 0x10000; }
    else return 0;
    if (len > n)
        return 0;
    for (size_t i = 1; i < len; i++) {
        if ((p[i] & 0xc0) != 0x80)
            return 0;
        cp = (cp << 6) | (p[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return len;
}

size_t
sbx_utf8_valid(const char *p, size_t n, size_t *incomplete)
{
    const unsigned char *u = (const unsigned char *)p;
    size_t i = 0;
    if (incomplete)
        *incomplete = 0;
    while (i < n) {
        size_t k = sbx_utf8_seq(p + i, n - i);
        if (k == 0) {
            /* At the very end, a sequence cut short is incomplete, not wrong. */
            unsigned char c = u[i];
            size_t want = (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
            bool cut = want > n - i;
            for (size_t j = i + 1; cut && j < n; j++)
                cut = (u[j] & 0xc0) == 0x80;
            if (cut && incomplete)
                *incomplete = n - i;
            return i;
        }
        i += k;
    }
    return i;
}

char *
sbx_utf8_sanitize(const char *p, size_t n, size_t *outlen)
{
    sbx_buf b;
    sbx_buf_init(&b);
    sbx_buf_reserve(&b, n);
    size_t i = 0;
    while (i < n) {
        size_t k = sbx_utf8_seq(p + i, n - i);
        if (k == 0) {
            sbx_buf_append(&b, "\xef\xbf\xbd", 3);
            i++;
        } else {
            sbx_buf_append(&b, p + i, k);
            i += k;
        }
    }
    b.p[b.len] = '\0'; /* nothing was appended when n == 0 */
    return sbx_buf_steal(&b, outlen);
}

static json_t *
str_json(const char *p, size_t n)
{
    size_t len;
    char *s = sbx_utf8_sanitize(p, n, &len);
    json_t *j = json_stringn(s, len);
    free(s);
    return j;
}

static json_t *
from_msgpack(const msgpack_object *o, bool b64_bins)
{
    switch (o->type) {
    case MSGPACK_OBJECT_NIL: return json_null();
    case MSGPACK_OBJECT_BOOLEAN: return json_boolean(o->via.boolean);
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
        return o->via.u64 > (uint64_t)INT64_MAX ? json_real((double)o->via.u64)
                                                 : json_integer((json_int_t)o->via.u64);
    case MSGPACK_OBJECT_NEGATIVE_INTEGER: return json_integer((json_int_t)o->via.i64);
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64: return json_real(o->via.f64);
    case MSGPACK_OBJECT_STR: return str_json(o->via.str.ptr, o->via.str.size);
    case MSGPACK_OBJECT_BIN:
        if (b64_bins) {
            size_t l;
            char *enc = sbx_base64_encode(o->via.bin.ptr, o->via.bin.size, &l);
            json_t *j = json_stringn(enc, l);
            free(enc);
            return j;
        }
        return str_json(o->via.bin.ptr, o->via.bin.size);
    case MSGPACK_OBJECT_ARRAY: {
        json_t *a = json_array();
        for (uint32_t i = 0; i < o->via.array.size; i++) {
            json_t *v = from_msgpack(&o->via.array.ptr[i], b64_bins);
            if (!v) {
                json_decref(a);
                return NULL;
            }
            json_array_append_new(a, v);
        }
        return a;
    }
    case MSGPACK_OBJECT_MAP: {
        json_t *m = json_object();
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            const msgpack_object_kv *kv = &o->via.map.ptr[i];
            if (kv->key.type != MSGPACK_OBJECT_STR) {
                json_decref(m);
                return NULL;
            }
            json_t *v = from_msgpack(&kv->val, b64_bins);
            if (!v) {
                json_decref(m);
                return NULL;
            }
            size_t kl;
            char *k = sbx_utf8_sanitize(kv->key.via.str.ptr, kv->key.via.str.size, &kl);
            json_object_setn_new(m, k, kl, v);
            free(k);
        }
        return m;
    }
    default: return NULL;
    }
}

json_t *
sbx_json_from_msgpack(const msgpack_object *o)
{
    return from_msgpack(o, false);
}

json_t *
sbx_json_from_msgpack_b64(const msgpack_object *o)
{
    return from_msgpack(o, true);
}

static int
to_msgpack(const json_t *j, sbx_enc *e, int depth)
{
    if (depth > 24)
        return SBX_E_VALIDATION;
    switch (json_typeof(j)) {
    case JSON_NULL: sbx_enc_nil(e); return 0;
    case JSON_TRUE: sbx_enc_bool(e, true); return 0;
    case JSON_FALSE: sbx_enc_bool(e, false); return 0;
    case JSON_INTEGER: sbx_enc_int(e, json_integer_value(j)); return 0;
    case JSON_REAL: {
        double d = json_real_value(j);
        if (!isfinite(d))
            return SBX_E_VALIDATION;
        sbx_enc_double(e, d);
        return 0;
    }
    case JSON_STRING: sbx_enc_strn(e, json_string_value(j), json_string_length(j)); return 0;
    case JSON_ARRAY: {
        sbx_enc_array(e);
        for (size_t i = 0; i < json_array_size(j); i++) {
            int rc = to_msgpack(json_array_get(j, i), e, depth + 1);
            if (rc)
                return rc;
        }
        sbx_enc_end(e);
        return 0;
    }
    case JSON_OBJECT: {
        const char *k;
        json_t *v;
        sbx_enc_map(e);
        json_object_foreach((json_t *)j, k, v) {
            sbx_enc_str(e, k);
            int rc = to_msgpack(v, e, depth + 1);
            if (rc)
                return rc;
        }
        sbx_enc_end(e);
        return 0;
    }
    }
    return SBX_E_VALIDATION;
}

int
sbx_json_to_msgpack(const json_t *j, sbx_enc *e)
{
    return to_msgpack(j, e, 0);
}

char *
sbx_json_dump(const msgpack_object *o, bool pretty)
{
    json_t *j = sbx_json_from_msgpack(o);
    if (!j)
        return NULL;
    char *s = json_dumps(j, (pretty ? JSON_INDENT(2) : JSON_COMPACT) | JSON_ENCODE_ANY |
                                JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
    json_decref(j);
    return s;
}

size_t
sbx_utf8_complete_prefix(const char *s, size_t n)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t i = n;
    for (int back = 0; back < 3 && i > 0; back++) {
        unsigned char b = p[i - 1];
        if ((b & 0xC0) == 0x80) {
            i--;
            continue;
        }
        /* 0xF8-0xFF lead nothing (RFC 3629): not held back */
        size_t need = b >= 0xF8 ? 1 : b >= 0xF0 ? 4 : b >= 0xE0 ? 3 : b >= 0xC0 ? 2 : 1;
        size_t have = n - (i - 1);
        return have < need ? i - 1 : n;
    }
    return n;
}
