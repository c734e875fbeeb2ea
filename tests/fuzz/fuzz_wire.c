/*
 * fuzz_wire.c — the msgpack wire codec (runtime/wire.c) on arbitrary bytes,
 * the way each hop uses it:
 *
 *  - shard/agent intake: sbx_wire_check + sbx_wire_decode with the request
 *    limits, the gateway wrapper ({req: bin}) unwrapped and decoded again,
 *    sbx_wire_parse_req and typed access to every argument;
 *  - client side: the reply envelope (ok, result, error {code, message,
 *    context}) with the reply limits, context rendered as JSON;
 *  - op lookup (sbx_op_find) with the op name of the frame, and the intake
 *    check of gateways and shards (sbx_op_intake: envelope rules and every
 *    argument against the schema's specs) as a client's and as a peer's.
 *
 * Properties:
 *  1. the pre-scan never accepts what msgpack-c cannot decode in full
 *     (sbx_wire_check == 0 ⇒ msgpack_unpack_next SUCCESS and off == len);
 *  2. the pre-scan is monotone in its limits (accepted under the request
 *     limits ⇒ accepted under the looser reply limits);
 *  3. a decoded frame re-encoded by sbx_enc_obj passes the same check and
 *     re-encoding is a fixed point (encode(decode(encode(decode(x)))) ==
 *     encode(decode(x)));
 *  4. a parsed envelope respects its documented bounds (id 1–64 bytes, op
 *     1–64 bytes, timeoutMs ≥ 0, args a map).
 */
#include <msgpack.h>

#include "../../runtime/err.h"
#include "../../runtime/json.h"
#include "../../runtime/ops.h"
#include "../../runtime/wire.h"
#include "fuzz.h"

/* Re-encode a decoded object; heap bytes (caller frees). */
static char *
reencode(const msgpack_object *o, size_t *len)
{
    sbx_enc e;
    char *out;
    sbx_enc_init(&e);
    sbx_enc_obj(&e, o);
    FUZZ_CHECK(sbx_enc_finish(&e, &out, len) == 0, "encoder misuse on a decoded object");
    return out;
}

static void
check_roundtrip(const msgpack_object *root, const struct sbx_wire_limits *lim)
{
    size_t n1, n2;
    char *b1 = reencode(root, &n1);
    FUZZ_CHECK(sbx_wire_check(b1, n1, lim) == 0, "re-encoded frame (%zu bytes) rejected", n1);
    sbx_msg m;
    FUZZ_CHECK(sbx_wire_decode(&m, b1, n1, lim) == 0, "re-encoded frame does not decode");
    char *b2 = reencode(m.root, &n2);
    FUZZ_CHECK(n1 == n2 && memcmp(b1, b2, n1) == 0, "re-encoding is not a fixed point");
    sbx_wire_msg_free(&m);
    free(b1);
    free(b2);
}

/* Touch every argument the way op handlers do: typed getters on each key. */
static void
walk_args(const msgpack_object *args)
{
    for (uint32_t i = 0; i < args->via.map.size; i++) {
        const msgpack_object *k = &args->via.map.ptr[i].key;
        sbx_str ks, v;
        int64_t n;
        bool b;
        const msgpack_object *o;
        if (sbx_wire_obj_str(k, &ks) != 0 || ks.n > 64)
            continue;
        char key[65];
        sbx_str_copy(ks, key, sizeof(key));
        sbx_wire_get_str(args, key, &v);
        sbx_wire_get_bin(args, key, &v);
        sbx_wire_get_i64(args, key, &n);
        sbx_wire_get_bool(args, key, &b);
        sbx_wire_get_map(args, key, &o);
        sbx_wire_get_array(args, key, &o);
    }
}

static void
request_side(const char *buf, size_t len)
{
    const struct sbx_wire_limits *lim = &sbx_wire_limits_request;
    sbx_msg m;
    if (sbx_wire_decode(&m, buf, len, lim) != 0)
        return;
    check_roundtrip(m.root, lim);
    /* The shard's unwrapping of a gateway-forwarded request. */
    sbx_str inner;
    if (sbx_wire_get_bin(m.root, "req", &inner) == 0) {
        char *ib = fuzz_copy(inner.p, inner.n);
        sbx_msg im;
        if (sbx_wire_decode(&im, ib, inner.n, lim) == 0) {
            check_roundtrip(im.root, lim);
            sbx_wire_msg_free(&im);
        }
        free(ib);
    }
    struct sbx_req r;
    char why[256];
    if (sbx_wire_parse_req(m.root, &r, why, sizeof(why)) == 0) {
        FUZZ_CHECK(r.id.n >= 1 && r.id.n <= SBX_WIRE_MAX_ID, "id of %zu bytes accepted", r.id.n);
        FUZZ_CHECK(r.op.n >= 1 && r.op.n <= 64, "op of %zu bytes accepted", r.op.n);
        FUZZ_CHECK(r.timeout_ms >= 0, "negative timeoutMs accepted");
        FUZZ_CHECK(r.args && r.args->type == MSGPACK_OBJECT_MAP, "args is not a map");
        FUZZ_CHECK(r.v == SBX_WIRE_VERSION, "version %u accepted", r.v);
        char id[SBX_WIRE_MAX_ID + 1];
        FUZZ_CHECK(sbx_str_copy(r.id, id, sizeof(id)) == 0, "id does not fit");
        sbx_op_find(r.op.p, r.op.n);
        /* The one intake check of gateways and shards (runtime/ops.h), from a
         * client and from a peer: a refusal has a code and a reason, and an
         * accepted op is one the table knows. */
        for (int peer = 0; peer < 2; peer++) {
            const struct sbx_op_def *def = NULL;
            why[0] = '\0';
            int rc = sbx_op_intake(&r, !peer, &def, why, sizeof(why));
            FUZZ_CHECK(rc <= 0, "intake returned %d", rc);
            FUZZ_CHECK(rc == 0 || why[0], "intake refused without a reason");
            FUZZ_CHECK(rc != 0 || (def && sbx_op_find(def->name, strlen(def->name)) == def),
                       "intake accepted an op the table does not know");
        }
        walk_args(r.args);
    }
    sbx_wire_msg_free(&m);
}

static void
reply_side(const char *buf, size_t len)
{
    sbx_msg m;
    if (sbx_wire_decode(&m, buf, len, &sbx_wire_limits_reply) != 0)
        return;
    bool ok = false;
    sbx_wire_get_bool(m.root, "ok", &ok);
    const msgpack_object *eo = NULL, *res = NULL;
    if (!ok && sbx_wire_get_map(m.root, "error", &eo) == 0) {
        sbx_str code = {"INTERNAL_ERROR", 14}, msg = {"", 0};
        sbx_wire_get_str(eo, "code", &code);
        sbx_wire_get_str(eo, "message", &msg);
        int rc = sbx_err_from_name(code.p, code.n);
        FUZZ_CHECK(rc < 0, "error name maps to a non-negative code");
        const msgpack_object *ctx = sbx_wire_get(eo, "context");
        free(ctx ? sbx_json_dump(ctx, false) : NULL);
    }
    if (ok && sbx_wire_get_map(m.root, "result", &res) == 0)
        free(sbx_json_dump(res, true));
    sbx_wire_msg_free(&m);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    char *buf = fuzz_copy(data, size);

    int creq = sbx_wire_check(buf, size, &sbx_wire_limits_request);
    int crep = sbx_wire_check(buf, size, &sbx_wire_limits_reply);
    FUZZ_CHECK(creq == 0 || creq == SBX_E_MALFORMED, "unexpected check result %d", creq);
    FUZZ_CHECK(creq != 0 || crep == 0, "accepted with request limits, rejected with reply limits");
    if (crep == 0) {
        msgpack_unpacked u;
        size_t off = 0;
        msgpack_unpacked_init(&u);
        msgpack_unpack_return r = msgpack_unpack_next(&u, buf, size, &off);
        FUZZ_CHECK(r == MSGPACK_UNPACK_SUCCESS && off == size,
                   "pre-scan accepted %zu bytes msgpack-c cannot decode (rc %d, off %zu)", size,
                   (int)r, off);
        msgpack_unpacked_destroy(&u);
    }
    request_side(buf, size);
    reply_side(buf, size);
    free(buf);
    return 0;
}
