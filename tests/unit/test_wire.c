/*
 * test_wire.c — unit tests for runtime/wire.h, the msgpack wire codec.
 *
 * Covers: an encode → decode round trip of a request with every value type
 * and typed access to each field; envelope validation by sbx_wire_parse_req;
 * rejection of every truncated prefix of a valid frame; hostile frames
 * (lying container counts, oversized strings, deep nesting, too many objects,
 * ext types, 0xc1, trailing bytes, non-map roots); a fixed-seed random-bytes
 * loop checking that sbx_wire_check never accepts what msgpack-c cannot
 * parse; the reply helpers; and encoder misuse reported by sbx_enc_finish.
 *
 * Frames under test are copied into heap buffers of exactly their length so
 * that ASan reports any read past the end.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/err.h"
#include "runtime/util.h"
#include "runtime/wire.h"

/* ---------------------------------------------------------------------------------
 * Helpers. */

/* A heap copy of n bytes with nothing after them (ASan catches overreads). */
static uint8_t *
exact_copy(const void *p, size_t n)
{
    uint8_t *q = sbx_xmalloc(n);
    if (n)
        memcpy(q, p, n);
    return q;
}

static int
check_bytes(const void *p, size_t n, const struct sbx_wire_limits *lim)
{
    uint8_t *q = exact_copy(p, n);
    int rc = sbx_wire_check(q, n, lim);
    free(q);
    return rc;
}

/* sbx_wire_decode on an exact copy; frees the message when it succeeded. */
static int
decode_bytes(const void *p, size_t n, const struct sbx_wire_limits *lim)
{
    uint8_t *q = exact_copy(p, n);
    sbx_msg m;
    int rc = sbx_wire_decode(&m, q, n, lim);
    if (rc == 0)
        sbx_wire_msg_free(&m);
    free(q);
    return rc;
}

static void
finish(sbx_enc *e, char **out, size_t *len)
{
    int rc = sbx_enc_finish(e, out, len);
    cr_assert_eq(rc, 0, "sbx_enc_finish failed: %d", rc);
}

static const uint8_t BIN[] = {0x00, 0x01, 0xff, 0xc1, 0x80, 0x00, 0x7f};

/* The request used by the round trip and truncation tests. */
static void
encode_full_request(char **out, size_t *len)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstr(&e, "id", "req-0001");
    sbx_enc_kstr(&e, "op", "exec");
    sbx_enc_kstr(&e, "sandbox", "user-42");
    sbx_enc_kint(&e, "timeoutMs", 30000);
    sbx_enc_kmap(&e, "args");
    sbx_enc_kstr(&e, "command", "echo hi");
    sbx_enc_kstr(&e, "empty", "");
    sbx_enc_kbin(&e, "blob", BIN, sizeof(BIN));
    sbx_enc_kint(&e, "small", 7);
    sbx_enc_kint(&e, "neg", -5);
    sbx_enc_kint(&e, "negbig", -5000000000LL);
    sbx_enc_kint(&e, "big", 5000000000LL);
    sbx_enc_kint(&e, "min", INT64_MIN);
    sbx_enc_kint(&e, "max", INT64_MAX);
    sbx_enc_str(&e, "huge");
    sbx_enc_uint(&e, UINT64_MAX);
    sbx_enc_kbool(&e, "yes", true);
    sbx_enc_kbool(&e, "no", false);
    sbx_enc_str(&e, "nothing");
    sbx_enc_nil(&e);
    sbx_enc_str(&e, "pi");
    sbx_enc_double(&e, 3.25);
    sbx_enc_str(&e, "tiny");
    sbx_enc_double(&e, -1.5e-300);
    sbx_enc_karray(&e, "argv");
    sbx_enc_str(&e, "sh");
    sbx_enc_str(&e, "-c");
    sbx_enc_array(&e); /* a nested array with a map inside */
    sbx_enc_int(&e, 1);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "deep", true);
    sbx_enc_kmap(&e, "deeper");
    sbx_enc_kstr(&e, "x", "y");
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e); /* argv */
    sbx_enc_kmap(&e, "emptymap");
    sbx_enc_end(&e);
    sbx_enc_karray(&e, "emptyarr");
    sbx_enc_end(&e);
    sbx_enc_end(&e); /* args */
    sbx_enc_end(&e); /* root */
    finish(&e, out, len);
}

/* ---------------------------------------------------------------------------------
 * Round trip and typed access. */

Test(wire, round_trip_every_type)
{
    char *buf;
    size_t len;
    encode_full_request(&buf, &len);

    sbx_msg m;
    cr_assert_eq(sbx_wire_decode(&m, buf, len, &sbx_wire_limits_request), 0,
                 "a frame we encoded must decode");
    cr_assert_eq(m.root->type, MSGPACK_OBJECT_MAP);

    struct sbx_req r;
    char why[256] = "";
    cr_assert_eq(sbx_wire_parse_req(m.root, &r, why, sizeof(why)), 0, "parse_req: %s", why);
    cr_expect_eq(r.v, 1u);
    cr_expect(sbx_str_eq(r.id, "req-0001"), "id is '%.*s'", (int)r.id.n, r.id.p);
    cr_expect(sbx_str_eq(r.op, "exec"));
    cr_expect(sbx_str_eq(r.sandbox, "user-42"));
    cr_expect_eq(r.timeout_ms, 30000);
    cr_assert_eq(r.args->type, MSGPACK_OBJECT_MAP);

    const msgpack_object *a = r.args;
    sbx_str s;
    int64_t i;
    bool b;
    const msgpack_object *o;

    cr_assert_eq(sbx_wire_get_str(a, "command", &s), 0);
    cr_expect(sbx_str_eq(s, "echo hi"));
    cr_assert_eq(sbx_wire_get_str(a, "empty", &s), 0);
    cr_expect_eq(s.n, 0u);
    cr_assert_eq(sbx_wire_get_bin(a, "blob", &s), 0);
    cr_assert_eq(s.n, sizeof(BIN));
    cr_expect_arr_eq(s.p, BIN, sizeof(BIN), "bin bytes changed in the round trip");
    cr_expect_eq(sbx_wire_get_str(a, "blob", &s), SBX_E_VALIDATION, "bin is not a str");
    cr_assert_eq(sbx_wire_get_bin(a, "command", &s), 0, "get_bin accepts a str too");
    cr_expect(sbx_str_eq(s, "echo hi"));

    static const struct {
        const char *key;
        int64_t want;
    } ints[] = {{"small", 7},
                {"neg", -5},
                {"negbig", -5000000000LL},
                {"big", 5000000000LL},
                {"min", INT64_MIN},
                {"max", INT64_MAX}};
    for (size_t k = 0; k < SBX_ARRAY_LEN(ints); k++) {
        i = 12345;
        cr_assert_eq(sbx_wire_get_i64(a, ints[k].key, &i), 0, "get_i64(%s)", ints[k].key);
        cr_expect_eq(i, ints[k].want, "%s: got %lld, want %lld", ints[k].key, (long long)i,
                     (long long)ints[k].want);
    }
    o = sbx_wire_get(a, "huge");
    cr_assert_not_null(o);
    cr_expect_eq(o->type, MSGPACK_OBJECT_POSITIVE_INTEGER);
    cr_expect_eq(o->via.u64, UINT64_MAX);
    cr_expect_eq(sbx_wire_get_i64(a, "huge", &i), SBX_E_VALIDATION,
                 "a uint64 above INT64_MAX does not fit an int64");

    cr_assert_eq(sbx_wire_get_bool(a, "yes", &b), 0);
    cr_expect(b);
    cr_assert_eq(sbx_wire_get_bool(a, "no", &b), 0);
    cr_expect(!b);

    cr_expect_null(sbx_wire_get(a, "nothing"), "nil reads as absent");
    cr_expect_eq(sbx_wire_get_str(a, "nothing", &s), -ENOENT);
    cr_expect_eq(sbx_wire_get_i64(a, "no-such-key", &i), -ENOENT);

    o = sbx_wire_get(a, "pi");
    cr_assert_not_null(o);
    cr_expect_eq(o->type, MSGPACK_OBJECT_FLOAT64);
    cr_expect_eq(o->via.f64, 3.25);
    o = sbx_wire_get(a, "tiny");
    cr_assert_not_null(o);
    cr_expect_eq(o->via.f64, -1.5e-300);

    /* Wrong types are SBX_E_VALIDATION, not -ENOENT. */
    cr_expect_eq(sbx_wire_get_i64(a, "command", &i), SBX_E_VALIDATION);
    cr_expect_eq(sbx_wire_get_bool(a, "small", &b), SBX_E_VALIDATION);
    cr_expect_eq(sbx_wire_get_i64(a, "pi", &i), SBX_E_VALIDATION);
    cr_expect_eq(sbx_wire_get_map(a, "argv", &o), SBX_E_VALIDATION);
    cr_expect_eq(sbx_wire_get_array(a, "emptymap", &o), SBX_E_VALIDATION);
    cr_expect_eq(sbx_wire_get_str(a, "small", &s), SBX_E_VALIDATION);

    const msgpack_object *argv;
    cr_assert_eq(sbx_wire_get_array(a, "argv", &argv), 0);
    cr_assert_eq(argv->via.array.size, 3u);
    cr_assert_eq(sbx_wire_obj_str(&argv->via.array.ptr[0], &s), 0);
    cr_expect(sbx_str_eq(s, "sh"));
    cr_assert_eq(sbx_wire_obj_str(&argv->via.array.ptr[1], &s), 0);
    cr_expect(sbx_str_eq(s, "-c"));
    const msgpack_object *nested = &argv->via.array.ptr[2];
    cr_assert_eq(nested->type, MSGPACK_OBJECT_ARRAY);
    cr_assert_eq(nested->via.array.size, 2u);
    cr_expect_eq(sbx_wire_obj_str(&nested->via.array.ptr[0], &s), SBX_E_VALIDATION);
    cr_expect_eq(nested->via.array.ptr[0].via.u64, 1u);
    const msgpack_object *inner = &nested->via.array.ptr[1];
    cr_assert_eq(sbx_wire_get_bool(inner, "deep", &b), 0);
    cr_expect(b);
    const msgpack_object *deeper;
    cr_assert_eq(sbx_wire_get_map(inner, "deeper", &deeper), 0);
    cr_assert_eq(sbx_wire_get_str(deeper, "x", &s), 0);
    cr_expect(sbx_str_eq(s, "y"));

    cr_assert_eq(sbx_wire_get_map(a, "emptymap", &o), 0);
    cr_expect_eq(o->via.map.size, 0u);
    cr_assert_eq(sbx_wire_get_array(a, "emptyarr", &o), 0);
    cr_expect_eq(o->via.array.size, 0u);

    /* sbx_wire_get on something that is not a map finds nothing. */
    cr_expect_null(sbx_wire_get(argv, "sh"));
    cr_expect_null(sbx_wire_get(NULL, "v"));

    /* sbx_enc_obj copies a decoded object deeply: re-encoding gives an equal object. */
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_obj(&e, m.root);
    char *buf2;
    size_t len2;
    finish(&e, &buf2, &len2);
    sbx_msg m2;
    cr_assert_eq(sbx_wire_decode(&m2, buf2, len2, &sbx_wire_limits_request), 0);
    cr_expect(msgpack_object_equal(*m.root, *m2.root), "sbx_enc_obj changed the object");
    sbx_wire_msg_free(&m2);
    free(buf2);

    sbx_wire_msg_free(&m);
    free(buf);
}

Test(wire, str_helpers)
{
    sbx_str s = SBX_STR("hello");
    cr_expect(sbx_str_eq(s, "hello"));
    cr_expect(!sbx_str_eq(s, "hell"));
    cr_expect(!sbx_str_eq(s, "hello!"));
    cr_expect(sbx_str_eq((sbx_str){NULL, 0}, ""));

    char *d = sbx_str_dup((sbx_str){"abcdef", 3});
    cr_expect_str_eq(d, "abc");
    free(d);
    d = sbx_str_dup((sbx_str){NULL, 0});
    cr_expect_str_eq(d, "");
    free(d);

    char out[6];
    cr_expect_eq(sbx_str_copy(SBX_STR("12345"), out, sizeof(out)), 0);
    cr_expect_str_eq(out, "12345");
    cr_expect_eq(sbx_str_copy(SBX_STR("123456"), out, sizeof(out)), -ENAMETOOLONG,
                 "6 bytes + NUL do not fit in 6");
}

/* ---------------------------------------------------------------------------------
 * sbx_wire_parse_req. */

enum args_kind { ARGS_OMIT, ARGS_MAP, ARGS_ARRAY, ARGS_NIL, ARGS_STR };

struct envelope {
    bool omit_v;
    bool v_as_str;
    int64_t v;
    const char *id; /* NULL: omitted */
    bool id_as_bin;
    const char *op; /* NULL: omitted */
    const char *sandbox;
    bool sandbox_as_int;
    bool has_timeout;
    int64_t timeout;
    enum args_kind args;
};

static const struct envelope GOOD = {.v = 1, .id = "r1", .op = "ping", .args = ARGS_MAP};

/* What survives of a parsed envelope once its frame is freed. */
struct parsed {
    size_t sandbox_n;
    int64_t timeout_ms;
    bool args_is_map;
    uint32_t args_size;
};

/* Encode the envelope, decode it and run sbx_wire_parse_req; returns its rc. */
static int
parse_envelope(const struct envelope *env, char *why, size_t whylen, struct parsed *out)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    if (!env->omit_v) {
        if (env->v_as_str)
            sbx_enc_kstr(&e, "v", "1");
        else
            sbx_enc_kint(&e, "v", env->v);
    }
    if (env->id) {
        if (env->id_as_bin)
            sbx_enc_kbin(&e, "id", env->id, strlen(env->id));
        else
            sbx_enc_kstr(&e, "id", env->id);
    }
    if (env->op)
        sbx_enc_kstr(&e, "op", env->op);
    if (env->sandbox_as_int)
        sbx_enc_kint(&e, "sandbox", 42);
    else if (env->sandbox)
        sbx_enc_kstr(&e, "sandbox", env->sandbox);
    if (env->has_timeout)
        sbx_enc_kint(&e, "timeoutMs", env->timeout);
    switch (env->args) {
    case ARGS_OMIT: break;
    case ARGS_MAP:
        sbx_enc_kmap(&e, "args");
        sbx_enc_kint(&e, "n", 1);
        sbx_enc_end(&e);
        break;
    case ARGS_ARRAY:
        sbx_enc_karray(&e, "args");
        sbx_enc_int(&e, 1);
        sbx_enc_end(&e);
        break;
    case ARGS_NIL:
        sbx_enc_str(&e, "args");
        sbx_enc_nil(&e);
        break;
    case ARGS_STR: sbx_enc_kstr(&e, "args", "x"); break;
    }
    sbx_enc_end(&e);
    char *buf;
    size_t len;
    finish(&e, &buf, &len);
    sbx_msg m;
    cr_assert_eq(sbx_wire_decode(&m, buf, len, &sbx_wire_limits_request), 0);
    why[0] = '\0';
    struct sbx_req r;
    int rc = sbx_wire_parse_req(m.root, &r, why, whylen);
    if (out && rc == 0) {
        out->sandbox_n = r.sandbox.n;
        out->timeout_ms = r.timeout_ms;
        out->args_is_map = r.args != NULL && r.args->type == MSGPACK_OBJECT_MAP;
        out->args_size = out->args_is_map ? r.args->via.map.size : 0;
    }
    sbx_wire_msg_free(&m);
    free(buf);
    return rc;
}

static void
expect_rejected(const struct envelope *env, int want, const char *what)
{
    char why[256];
    int rc = parse_envelope(env, why, sizeof(why), NULL);
    cr_expect_eq(rc, want, "%s: got %d (%s), want %d", what, rc, sbx_err_name(rc), want);
    cr_expect_neq(why[0], '\0', "%s: no reason given", what);
}

Test(wire, parse_req_accepts_valid_envelopes)
{
    char why[256];
    struct parsed r;
    struct envelope env = GOOD;
    cr_assert_eq(parse_envelope(&env, why, sizeof(why), &r), 0, "minimal: %s", why);
    cr_expect_eq(r.sandbox_n, 0u, "absent sandbox has length 0");
    cr_expect_eq(r.timeout_ms, 0, "absent timeoutMs is 0");
    cr_expect(r.args_is_map && r.args_size == 1, "args given as a one-entry map");

    env.args = ARGS_OMIT;
    r.args_is_map = false;
    cr_assert_eq(parse_envelope(&env, why, sizeof(why), &r), 0, "no args: %s", why);
    cr_expect(r.args_is_map && r.args_size == 0, "absent args must read as an empty map");

    env.args = ARGS_NIL;
    r.args_is_map = false;
    cr_assert_eq(parse_envelope(&env, why, sizeof(why), &r), 0, "nil args: %s", why);
    cr_expect(r.args_is_map && r.args_size == 0, "nil args must read as an empty map");

    env = GOOD;
    env.sandbox = "user-42";
    cr_assert_eq(parse_envelope(&env, why, sizeof(why), &r), 0, "with sandbox: %s", why);
    cr_expect_eq(r.sandbox_n, 7u);

    env = GOOD;
    env.has_timeout = true;
    env.timeout = 0;
    cr_expect_eq(parse_envelope(&env, why, sizeof(why), &r), 0, "timeoutMs 0: %s", why);
    env.timeout = 123456;
    cr_assert_eq(parse_envelope(&env, why, sizeof(why), &r), 0);
    cr_expect_eq(r.timeout_ms, 123456);

    /* An id of exactly SBX_WIRE_MAX_ID bytes is fine. */
    char id64[SBX_WIRE_MAX_ID + 1];
    memset(id64, 'a', SBX_WIRE_MAX_ID);
    id64[SBX_WIRE_MAX_ID] = '\0';
    env = GOOD;
    env.id = id64;
    cr_expect_eq(parse_envelope(&env, why, sizeof(why), NULL), 0, "64-byte id: %s", why);
}

Test(wire, parse_req_rejects_bad_envelopes)
{
    struct envelope env;

    env = GOOD;
    env.omit_v = true;
    expect_rejected(&env, SBX_E_MALFORMED, "missing v");
    env = GOOD;
    env.v_as_str = true;
    expect_rejected(&env, SBX_E_MALFORMED, "v as a string");
    env = GOOD;
    env.v = 2;
    expect_rejected(&env, SBX_E_VERSION, "version 2");
    env.v = 0;
    expect_rejected(&env, SBX_E_VERSION, "version 0");
    env.v = (1LL << 32) | 1; /* must not be truncated to 1 */
    expect_rejected(&env, SBX_E_VERSION, "version 2^32+1");

    env = GOOD;
    env.id = NULL;
    expect_rejected(&env, SBX_E_MALFORMED, "missing id");
    env.id = "";
    expect_rejected(&env, SBX_E_MALFORMED, "empty id");
    char id65[SBX_WIRE_MAX_ID + 2];
    memset(id65, 'a', SBX_WIRE_MAX_ID + 1);
    id65[SBX_WIRE_MAX_ID + 1] = '\0';
    env.id = id65;
    expect_rejected(&env, SBX_E_MALFORMED, "65-byte id");
    env.id = "r1";
    env.id_as_bin = true;
    expect_rejected(&env, SBX_E_MALFORMED, "id as bin");

    env = GOOD;
    env.op = NULL;
    expect_rejected(&env, SBX_E_MALFORMED, "missing op");
    env.op = "";
    expect_rejected(&env, SBX_E_MALFORMED, "empty op");

    env = GOOD;
    env.args = ARGS_ARRAY;
    expect_rejected(&env, SBX_E_MALFORMED, "args as an array");
    env.args = ARGS_STR;
    expect_rejected(&env, SBX_E_MALFORMED, "args as a string");

    env = GOOD;
    env.has_timeout = true;
    env.timeout = -1;
    expect_rejected(&env, SBX_E_MALFORMED, "negative timeoutMs");
    env.timeout = INT64_MIN;
    expect_rejected(&env, SBX_E_MALFORMED, "INT64_MIN timeoutMs");

    env = GOOD;
    env.sandbox_as_int = true;
    expect_rejected(&env, SBX_E_MALFORMED, "sandbox as an integer");
}

/* ---------------------------------------------------------------------------------
 * Truncation. */

Test(wire, every_truncation_is_rejected)
{
    char *buf;
    size_t len;
    encode_full_request(&buf, &len);
    cr_assert_gt(len, 100u);
    cr_assert_eq(check_bytes(buf, len, &sbx_wire_limits_request), 0, "the full frame is valid");
    for (size_t n = 0; n < len; n++) {
        cr_assert_eq(check_bytes(buf, n, &sbx_wire_limits_request), SBX_E_MALFORMED,
                     "check accepted a %zu-byte prefix of a %zu-byte frame", n, len);
        cr_assert_eq(decode_bytes(buf, n, &sbx_wire_limits_request), SBX_E_MALFORMED,
                     "decode accepted a %zu-byte prefix of a %zu-byte frame", n, len);
    }
    free(buf);
}

/* ---------------------------------------------------------------------------------
 * Hostile frames. */

static void
expect_hostile(const uint8_t *p, size_t n, const char *what)
{
    cr_expect_eq(check_bytes(p, n, &sbx_wire_limits_request), SBX_E_MALFORMED,
                 "check accepted %s", what);
    cr_expect_eq(check_bytes(p, n, &sbx_wire_limits_reply), SBX_E_MALFORMED,
                 "check (reply limits) accepted %s", what);
    cr_expect_eq(decode_bytes(p, n, &sbx_wire_limits_request), SBX_E_MALFORMED,
                 "decode accepted %s", what);
}

Test(wire, lying_container_counts_are_rejected)
{
    static const uint8_t arr26[] = {0xdd, 0x04, 0x00, 0x00, 0x00};
    static const uint8_t arrmax[] = {0xdd, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t map26[] = {0xdf, 0x04, 0x00, 0x00, 0x00};
    static const uint8_t mapmax[] = {0xdf, 0xff, 0xff, 0xff, 0xff};
    static const uint8_t arr16[] = {0xdc, 0xff, 0xff, 0xc0, 0xc0};
    static const uint8_t map16[] = {0xde, 0x00, 0x03, 0xc0, 0xc0, 0xc0, 0xc0};
    static const uint8_t fixarr[] = {0x9f, 0x01, 0x02};
    static const uint8_t fixmap[] = {0x82, 0xa1, 'a', 0x01};
    /* Inside a valid-looking map, so the root type is right. */
    static const uint8_t nested[] = {0x81, 0xa1, 'a', 0xdd, 0xff, 0xff, 0xff, 0xff};
    expect_hostile(arr26, sizeof(arr26), "array32 of 2^26");
    expect_hostile(arrmax, sizeof(arrmax), "array32 of 2^32-1");
    expect_hostile(map26, sizeof(map26), "map32 of 2^26");
    expect_hostile(mapmax, sizeof(mapmax), "map32 of 2^32-1");
    expect_hostile(arr16, sizeof(arr16), "array16 of 65535 with 2 bytes");
    expect_hostile(map16, sizeof(map16), "map16 of 3 pairs with 4 bytes");
    expect_hostile(fixarr, sizeof(fixarr), "fixarray of 15 with 2 bytes");
    expect_hostile(fixmap, sizeof(fixmap), "fixmap of 2 pairs with 1 pair");
    expect_hostile(nested, sizeof(nested), "map holding an array32 of 2^32-1");
    /* A map32 whose pair count only fits if counted as elements, not pairs. */
    static const uint8_t halfmap[] = {0xdf, 0x00, 0x00, 0x00, 0x02, 0x01, 0x02};
    expect_hostile(halfmap, sizeof(halfmap), "map32 of 2 pairs with 2 bytes");
}

Test(wire, oversized_strings_are_rejected)
{
    static const uint8_t str32[] = {0xdb, 0x00, 0x00, 0x01, 0x00, 'a', 'b'};
    static const uint8_t str32max[] = {0xdb, 0xff, 0xff, 0xff, 0xff, 'a'};
    static const uint8_t str16[] = {0xda, 0x00, 0x10, 'a'};
    static const uint8_t str8[] = {0xd9, 0x05, 'a', 'b'};
    static const uint8_t fixstr[] = {0xa5, 'a', 'b'};
    static const uint8_t bin32[] = {0xc6, 0x7f, 0xff, 0xff, 0xff, 0x00};
    static const uint8_t bin8[] = {0xc4, 0x02, 0x00};
    static const uint8_t inmap[] = {0x81, 0xa1, 'k', 0xdb, 0x00, 0x00, 0x00, 0x09, 'x'};
    expect_hostile(str32, sizeof(str32), "str32 of 256 bytes with 2");
    expect_hostile(str32max, sizeof(str32max), "str32 of 2^32-1 bytes");
    expect_hostile(str16, sizeof(str16), "str16 of 16 bytes with 1");
    expect_hostile(str8, sizeof(str8), "str8 of 5 bytes with 2");
    expect_hostile(fixstr, sizeof(fixstr), "fixstr of 5 bytes with 2");
    expect_hostile(bin32, sizeof(bin32), "bin32 of 2^31-1 bytes");
    expect_hostile(bin8, sizeof(bin8), "bin8 of 2 bytes with 1");
    expect_hostile(inmap, sizeof(inmap), "map holding a str32 of 9 bytes with 1");
}

/* `depth` nested one-element arrays around nil: 0x91 0x91 … 0xc0. */
static size_t
nested_arrays(uint8_t *out, unsigned depth)
{
    memset(out, 0x91, depth);
    out[depth] = 0xc0;
    return depth + 1;
}

Test(wire, deep_nesting_is_rejected)
{
    uint8_t buf[64];
    size_t n = nested_arrays(buf, 40);
    expect_hostile(buf, n, "40 nested fixarrays");
    /* Also as nested maps {"a":{"a":…}} under a map root. */
    uint8_t mbuf[200];
    size_t k = 0;
    for (int d = 0; d < 40; d++) {
        mbuf[k++] = 0x81;
        mbuf[k++] = 0xa1;
        mbuf[k++] = 'a';
    }
    mbuf[k++] = 0xc0;
    expect_hostile(mbuf, k, "40 nested fixmaps");

    /* A modest depth is fine, and the limit is a sharp boundary near max_depth:
     * all depths up to some d0 pass, all deeper fail, and d0 is max_depth or
     * max_depth - 1 (whether the leaf counts as a level). */
    const struct sbx_wire_limits *lims[] = {&sbx_wire_limits_request, &sbx_wire_limits_reply};
    for (size_t li = 0; li < 2; li++) {
        unsigned maxd = lims[li]->max_depth;
        unsigned d0 = 0;
        for (unsigned d = 1; d <= 40; d++) {
            n = nested_arrays(buf, d);
            int rc = check_bytes(buf, n, lims[li]);
            if (rc == 0) {
                cr_assert_eq(d0, d - 1, "depth %u accepted after a shallower one was rejected", d);
                d0 = d;
            }
        }
        cr_expect(d0 == maxd || d0 + 1 == maxd,
                  "limits %zu (max_depth %u): deepest accepted nesting is %u", li, maxd, d0);
        cr_expect_geq(d0, 8u, "at least 8 levels must be usable");
    }

    /* A custom low limit is honoured, and msgpack-c agrees with what is accepted. */
    struct sbx_wire_limits lim = {.max_depth = 4, .max_objects = 1000};
    n = nested_arrays(buf, 2);
    cr_expect_eq(check_bytes(buf, n, &lim), 0, "2 levels under max_depth 4");
    n = nested_arrays(buf, 5);
    cr_expect_eq(check_bytes(buf, n, &lim), SBX_E_MALFORMED, "5 levels under max_depth 4");
}

Test(wire, too_many_objects_are_rejected)
{
    struct sbx_wire_limits lim = {.max_depth = 16, .max_objects = 10};
    uint8_t buf[32];
    /* fixarray of 9 nils: 10 objects — exactly the limit. */
    buf[0] = 0x99;
    memset(buf + 1, 0xc0, 9);
    cr_expect_eq(check_bytes(buf, 10, &lim), 0, "10 objects with max_objects 10");
    /* fixarray of 10 nils: 11 objects. */
    buf[0] = 0x9a;
    memset(buf + 1, 0xc0, 10);
    cr_expect_eq(check_bytes(buf, 11, &lim), SBX_E_MALFORMED, "11 objects with max_objects 10");

    /* A map of 5 pairs is 11 objects: decode must reject it too. */
    size_t k = 0;
    buf[k++] = 0x85;
    for (int i = 0; i < 5; i++) {
        buf[k++] = 0xa1;
        buf[k++] = (uint8_t)('a' + i);
        buf[k++] = (uint8_t)i;
    }
    cr_expect_eq(decode_bytes(buf, k, &lim), SBX_E_MALFORMED, "decode: 11 objects");
    buf[0] = 0x84; /* 4 pairs: 9 objects, but now 3 bytes trail */
    cr_expect_eq(decode_bytes(buf, k - 3, &lim), 0, "decode: 9 objects");
    /* The default request limit allows far more. */
    cr_expect_eq(decode_bytes(buf, k - 3, &sbx_wire_limits_request), 0);
}

Test(wire, ext_types_and_reserved_byte_are_rejected)
{
    static const struct {
        uint8_t bytes[24];
        size_t n;
        const char *what;
    } cases[] = {
        {{0xd4, 0x01, 0xaa}, 3, "fixext1"},
        {{0xd5, 0x01, 0xaa, 0xbb}, 4, "fixext2"},
        {{0xd6, 0x01, 1, 2, 3, 4}, 6, "fixext4"},
        {{0xd7, 0x01, 1, 2, 3, 4, 5, 6, 7, 8}, 10, "fixext8"},
        {{0xd8, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 18, "fixext16"},
        {{0xc7, 0x02, 0x01, 0xaa, 0xbb}, 5, "ext8"},
        {{0xc8, 0x00, 0x02, 0x01, 0xaa, 0xbb}, 6, "ext16"},
        {{0xc9, 0x00, 0x00, 0x00, 0x02, 0x01, 0xaa, 0xbb}, 8, "ext32"},
        /* The timestamp extension (type -1) is an ext too. */
        {{0xd6, 0xff, 0x00, 0x00, 0x00, 0x01}, 6, "timestamp32"},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(cases); i++) {
        /* msgpack-c itself parses these: the rejection is ours, by design. */
        msgpack_unpacked u;
        size_t off = 0;
        msgpack_unpacked_init(&u);
        msgpack_unpack_return r =
            msgpack_unpack_next(&u, (const char *)cases[i].bytes, cases[i].n, &off);
        cr_assert_eq(r, MSGPACK_UNPACK_SUCCESS, "test bug: %s is not a valid ext", cases[i].what);
        cr_assert_eq(off, cases[i].n);
        msgpack_unpacked_destroy(&u);
        expect_hostile(cases[i].bytes, cases[i].n, cases[i].what);

        /* And as a value in a map. */
        uint8_t m[32] = {0x81, 0xa1, 'e'};
        memcpy(m + 3, cases[i].bytes, cases[i].n);
        expect_hostile(m, 3 + cases[i].n, cases[i].what);
    }
    static const uint8_t c1[] = {0xc1};
    static const uint8_t c1inmap[] = {0x81, 0xa1, 'k', 0xc1};
    static const uint8_t c1key[] = {0x81, 0xc1, 0x01};
    expect_hostile(c1, sizeof(c1), "the reserved byte 0xc1");
    expect_hostile(c1inmap, sizeof(c1inmap), "0xc1 as a map value");
    expect_hostile(c1key, sizeof(c1key), "0xc1 as a map key");
}

Test(wire, trailing_bytes_are_rejected)
{
    char *buf;
    size_t len;
    encode_full_request(&buf, &len);
    uint8_t *longer = sbx_xmalloc(len + 1);
    memcpy(longer, buf, len);
    static const uint8_t trail[] = {0xc0, 0x00, 0x80, 0xff};
    for (size_t i = 0; i < sizeof(trail); i++) {
        longer[len] = trail[i];
        cr_expect_eq(check_bytes(longer, len + 1, &sbx_wire_limits_request), SBX_E_MALFORMED,
                     "check accepted a frame with a trailing 0x%02x", trail[i]);
        cr_expect_eq(decode_bytes(longer, len + 1, &sbx_wire_limits_request), SBX_E_MALFORMED,
                     "decode accepted a frame with a trailing 0x%02x", trail[i]);
    }
    static const uint8_t two_maps[] = {0x80, 0x80};
    expect_hostile(two_maps, sizeof(two_maps), "two empty maps");
    free(longer);
    free(buf);
}

Test(wire, non_map_root_is_rejected_by_decode_only)
{
    static const struct {
        uint8_t bytes[12];
        size_t n;
        const char *what;
    } cases[] = {
        {{0x05}, 1, "positive fixint"},
        {{0xe0}, 1, "negative fixint"},
        {{0xc0}, 1, "nil"},
        {{0xc3}, 1, "true"},
        {{0xa3, 'a', 'b', 'c'}, 4, "fixstr"},
        {{0x93, 0x01, 0x02, 0x03}, 4, "fixarray"},
        {{0x90}, 1, "empty array"},
        {{0xc4, 0x01, 0xff}, 3, "bin8"},
        {{0xcb, 0x40, 0x09, 0x21, 0xfb, 0x54, 0x44, 0x2d, 0x18}, 9, "float64"},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(cases); i++) {
        cr_expect_eq(check_bytes(cases[i].bytes, cases[i].n, &sbx_wire_limits_request), 0,
                     "check must accept any single object: %s", cases[i].what);
        cr_expect_eq(decode_bytes(cases[i].bytes, cases[i].n, &sbx_wire_limits_request),
                     SBX_E_MALFORMED, "decode must reject a %s root", cases[i].what);
    }
    static const uint8_t empty_map[] = {0x80};
    cr_expect_eq(decode_bytes(empty_map, 1, &sbx_wire_limits_request), 0,
                 "an empty map is a valid frame");
}

/* ---------------------------------------------------------------------------------
 * Random bytes. */

static uint64_t
xorshift(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/*
 * Write a random valid msgpack object of at most cap bytes (no ext types);
 * returns its length, or 0 when it did not fit.  Containers hold 0-3 items
 * and nest at most `depth` more levels.
 */
static size_t
gen_obj(uint64_t *s, uint8_t *out, size_t cap, int depth)
{
    uint64_t r = xorshift(s);
    unsigned kind = (unsigned)(r % 10);
    if (depth <= 0 && kind >= 7)
        kind = r % 7;
    size_t n = 0;
    switch (kind) {
    case 0: /* fixints, nil, bools */
        if (cap < 1) return 0;
        static const uint8_t one[] = {0x00, 0x7f, 0xe0, 0xff, 0xc0, 0xc2, 0xc3};
        out[0] = one[(r >> 8) % sizeof(one)];
        return 1;
    case 1: { /* uint8/16/32/64, int8/16/32/64, float32/64 */
        static const uint8_t t[] = {0xcc, 0xcd, 0xce, 0xcf, 0xd0, 0xd1, 0xd2, 0xd3, 0xca, 0xcb};
        static const uint8_t w[] = {1, 2, 4, 8, 1, 2, 4, 8, 4, 8};
        unsigned k = (unsigned)((r >> 8) % sizeof(t));
        if (cap < 1u + w[k]) return 0;
        out[n++] = t[k];
        for (unsigned i = 0; i < w[k]; i++)
            out[n++] = (uint8_t)(xorshift(s) >> 16);
        return n;
    }
    case 2: case 3: case 4: { /* fixstr, str8, bin8, str16 */
        size_t len = (r >> 8) % 6;
        static const uint8_t hdr[] = {0xa0, 0xd9, 0xc4, 0xda};
        unsigned h = (unsigned)((r >> 16) % 4);
        size_t hl = h == 0 ? 1 : h == 3 ? 3 : 2;
        if (cap < hl + len) return 0;
        if (h == 0) {
            out[n++] = (uint8_t)(0xa0 | len);
        } else {
            out[n++] = hdr[h];
            if (h == 3)
                out[n++] = 0;
            out[n++] = (uint8_t)len;
        }
        for (size_t i = 0; i < len; i++)
            out[n++] = (uint8_t)('a' + xorshift(s) % 26);
        return n;
    }
    case 5: case 6: { /* empty containers in every width */
        static const uint8_t e[][5] = {{0x80}, {0x90}, {0xdc, 0, 0}, {0xde, 0, 0},
                                       {0xdd, 0, 0, 0, 0}, {0xdf, 0, 0, 0, 0}};
        static const uint8_t el[] = {1, 1, 3, 3, 5, 5};
        unsigned k = (unsigned)((r >> 8) % 6);
        if (cap < el[k]) return 0;
        memcpy(out, e[k], el[k]);
        return el[k];
    }
    default: { /* arrays and maps of 1-3 items, fix or 16/32-bit headers */
        bool map = (r >> 8) & 1;
        unsigned items = 1 + (unsigned)((r >> 9) % 3);
        unsigned width = (unsigned)((r >> 12) % 3); /* fix, 16, 32 */
        size_t hl = width == 0 ? 1 : width == 1 ? 3 : 5;
        if (cap < hl) return 0;
        if (width == 0) {
            out[n++] = (uint8_t)((map ? 0x80 : 0x90) | items);
        } else {
            out[n++] = map ? (width == 1 ? 0xde : 0xdf) : (width == 1 ? 0xdc : 0xdd);
            if (width == 2) {
                out[n++] = 0;
                out[n++] = 0;
            }
            out[n++] = 0;
            out[n++] = (uint8_t)items;
        }
        for (unsigned i = 0; i < items * (map ? 2u : 1u); i++) {
            size_t k = gen_obj(s, out + n, cap - n, depth - 1);
            if (k == 0) return 0;
            n += k;
        }
        return n;
    }
    }
}

/* A frame for the random loop: either pure noise, or a random valid object
 * that is then damaged a little (a byte changed, cut short or extended). */
static size_t
random_frame(uint64_t *s, uint8_t *out, bool structured)
{
    size_t n = (size_t)(xorshift(s) % 65);
    if (!structured) {
        for (size_t i = 0; i < n; i++)
            out[i] = (uint8_t)xorshift(s);
        return n;
    }
    size_t k;
    do
        k = gen_obj(s, out, 64, 3 + (int)(xorshift(s) % 4));
    while (k == 0);
    uint64_t r = xorshift(s);
    switch (r % 4) {
    case 0: break; /* intact */
    case 1: out[(r >> 8) % k] = (uint8_t)(r >> 16); break;
    case 2: k = (r >> 8) % (k + 1); break;
    case 3:
        while (k < 64 && (xorshift(s) & 1))
            out[k++] = (uint8_t)xorshift(s);
        break;
    }
    return k;
}

Test(wire, random_bytes_never_crash_and_check_implies_parse, .timeout = 200)
{
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    unsigned accepted = 0, accepted_multi = 0, accepted_containers = 0, decoded = 0;
    for (unsigned it = 0; it < 200000; it++) {
        uint8_t frame[64];
        size_t n = random_frame(&seed, frame, it % 2);
        uint8_t *buf = exact_copy(frame, n);

        int rc = sbx_wire_check(buf, n, &sbx_wire_limits_request);
        cr_assert(rc == 0 || rc == SBX_E_MALFORMED, "iteration %u: check returned %d", it, rc);
        sbx_msg m;
        int drc = sbx_wire_decode(&m, buf, n, &sbx_wire_limits_request);
        if (rc == 0) {
            accepted++;
            if (n > 1)
                accepted_multi++;
            msgpack_unpacked u;
            size_t off = 0;
            msgpack_unpacked_init(&u);
            msgpack_unpack_return r = msgpack_unpack_next(&u, (const char *)buf, n, &off);
            cr_assert_eq(r, MSGPACK_UNPACK_SUCCESS,
                         "iteration %u: check accepted %zu bytes msgpack-c cannot parse (%d)", it,
                         n, (int)r);
            cr_assert_eq(off, n, "iteration %u: msgpack-c parsed %zu of %zu accepted bytes", it,
                         off, n);
            bool is_map = u.data.type == MSGPACK_OBJECT_MAP;
            if (u.data.type == MSGPACK_OBJECT_MAP || u.data.type == MSGPACK_OBJECT_ARRAY)
                accepted_containers++;
            msgpack_unpacked_destroy(&u);
            cr_assert_eq(drc, is_map ? 0 : SBX_E_MALFORMED,
                         "iteration %u: decode returned %d for an accepted %s", it, drc,
                         is_map ? "map" : "non-map");
        } else {
            cr_assert_eq(drc, SBX_E_MALFORMED, "iteration %u: decode accepted what check rejected",
                         it);
        }
        if (drc == 0) {
            decoded++;
            sbx_wire_msg_free(&m);
        }
        free(buf);
    }
    /* The property above must actually have been exercised. */
    cr_expect_gt(accepted_multi, 1000u, "only %u multi-byte frames accepted", accepted_multi);
    cr_expect_gt(accepted_containers, 1000u, "only %u container frames accepted",
                 accepted_containers);
    cr_expect_gt(decoded, 100u, "only %u frames decoded as maps", decoded);
    cr_log_info("random: %u accepted (%u multi-byte, %u containers), %u decoded", accepted,
                accepted_multi, accepted_containers, decoded);
}

/* ---------------------------------------------------------------------------------
 * Replies. */

/* Decode a reply frame and check the envelope; returns the decoded message. */
static void
decode_reply(sbx_msg *m, const char *buf, size_t len, const char *want_id, bool want_ok)
{
    cr_assert_eq(sbx_wire_decode(m, buf, len, &sbx_wire_limits_reply), 0, "reply does not decode");
    int64_t v = 0;
    sbx_str id;
    bool ok = !want_ok;
    cr_assert_eq(sbx_wire_get_i64(m->root, "v", &v), 0);
    cr_expect_eq(v, SBX_WIRE_VERSION);
    cr_assert_eq(sbx_wire_get_str(m->root, "id", &id), 0);
    cr_expect(sbx_str_eq(id, want_id), "reply id '%.*s', want '%s'", (int)id.n, id.p, want_id);
    cr_assert_eq(sbx_wire_get_bool(m->root, "ok", &ok), 0);
    cr_expect_eq(ok, want_ok);
}

static const msgpack_object *
reply_error(const sbx_msg *m, const char *code, const char *message)
{
    const msgpack_object *err;
    sbx_str s;
    cr_assert_eq(sbx_wire_get_map(m->root, "error", &err), 0, "no error map");
    cr_expect_null(sbx_wire_get(m->root, "result"), "an error reply has no result");
    cr_assert_eq(sbx_wire_get_str(err, "code", &s), 0);
    cr_expect(sbx_str_eq(s, code), "error code '%.*s', want '%s'", (int)s.n, s.p, code);
    cr_assert_eq(sbx_wire_get_str(err, "message", &s), 0);
    cr_expect(sbx_str_eq(s, message), "error message '%.*s', want '%s'", (int)s.n, s.p, message);
    const msgpack_object *ctx;
    cr_assert_eq(sbx_wire_get_map(err, "context", &ctx), 0, "no context map");
    cr_expect_eq(err->via.map.size, 3u, "error has exactly code, message, context");
    return ctx;
}

Test(wire, reply_errf_builds_an_error_reply)
{
    char *buf;
    size_t len;
    cr_assert_eq(sbx_wire_reply_errf(SBX_STR("req-9"), SBX_E_NOT_FOUND, &buf, &len,
                                     "sandbox %s does not exist", "user-1"),
                 0);
    sbx_msg m;
    decode_reply(&m, buf, len, "req-9", false);
    const msgpack_object *ctx = reply_error(&m, "SANDBOX_NOT_FOUND", "sandbox user-1 does not exist");
    cr_expect_eq(ctx->via.map.size, 0u, "errf has an empty context");
    cr_expect_eq(m.root->via.map.size, 4u, "reply has exactly v, id, ok, error");
    sbx_wire_msg_free(&m);
    free(buf);

    /* Every sbx code and an -errno code carry their err.h names. */
    for (int code = SBX_E__FIRST + 1; code < SBX_E__LAST; code++) {
        cr_assert_eq(sbx_wire_reply_errf(SBX_STR("r"), code, &buf, &len, "m%d", code), 0);
        char msg[32];
        snprintf(msg, sizeof(msg), "m%d", code);
        decode_reply(&m, buf, len, "r", false);
        reply_error(&m, sbx_err_name(code), msg);
        sbx_wire_msg_free(&m);
        free(buf);
    }
    cr_assert_eq(sbx_wire_reply_errf(SBX_STR("r"), -ENOENT, &buf, &len, "no file"), 0);
    decode_reply(&m, buf, len, "r", false);
    reply_error(&m, "FILE_NOT_FOUND", "no file");
    sbx_wire_msg_free(&m);
    free(buf);
}

Test(wire, reply_err_carries_context)
{
    sbx_werr w;
    sbx_werr_init(&w, SBX_E_VALIDATION, "memory %d is too large", 99);
    sbx_enc_kstr(sbx_werr_ctx(&w), "field", "memory");
    sbx_enc_kint(sbx_werr_ctx(&w), "max", 42);
    sbx_enc_karray(sbx_werr_ctx(&w), "allowed");
    sbx_enc_str(sbx_werr_ctx(&w), "a");
    sbx_enc_end(sbx_werr_ctx(&w));
    char *buf;
    size_t len;
    cr_assert_eq(sbx_wire_reply_err(SBX_STR("abc"), &w, &buf, &len), 0);
    sbx_werr_free(&w);

    sbx_msg m;
    decode_reply(&m, buf, len, "abc", false);
    const msgpack_object *ctx = reply_error(&m, "VALIDATION_FAILED", "memory 99 is too large");
    cr_expect_eq(ctx->via.map.size, 3u);
    sbx_str s;
    int64_t i;
    const msgpack_object *arr;
    cr_assert_eq(sbx_wire_get_str(ctx, "field", &s), 0);
    cr_expect(sbx_str_eq(s, "memory"));
    cr_assert_eq(sbx_wire_get_i64(ctx, "max", &i), 0);
    cr_expect_eq(i, 42);
    cr_assert_eq(sbx_wire_get_array(ctx, "allowed", &arr), 0);
    cr_expect_eq(arr->via.array.size, 1u);
    sbx_wire_msg_free(&m);
    free(buf);
}

Test(wire, reply_ok_leaves_result_open)
{
    sbx_enc e;
    char *buf;
    size_t len;

    /* Fields written after sbx_enc_reply_ok land in result; two ends close it. */
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, SBX_STR("id-7"));
    sbx_enc_kstr(&e, "status", "running");
    sbx_enc_kint(&e, "pid", 1234);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    finish(&e, &buf, &len);
    sbx_msg m;
    decode_reply(&m, buf, len, "id-7", true);
    const msgpack_object *res;
    cr_assert_eq(sbx_wire_get_map(m.root, "result", &res), 0);
    cr_expect_null(sbx_wire_get(m.root, "error"));
    cr_expect_eq(res->via.map.size, 2u);
    sbx_str s;
    int64_t pid;
    cr_assert_eq(sbx_wire_get_str(res, "status", &s), 0);
    cr_expect(sbx_str_eq(s, "running"));
    cr_assert_eq(sbx_wire_get_i64(res, "pid", &pid), 0);
    cr_expect_eq(pid, 1234);
    sbx_wire_msg_free(&m);
    free(buf);

    /* An empty result. */
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, SBX_STR("x"));
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    finish(&e, &buf, &len);
    decode_reply(&m, buf, len, "x", true);
    cr_assert_eq(sbx_wire_get_map(m.root, "result", &res), 0);
    cr_expect_eq(res->via.map.size, 0u);
    sbx_wire_msg_free(&m);
    free(buf);

    /* Closing only once leaves the envelope open: that is a misuse. */
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, SBX_STR("x"));
    sbx_enc_end(&e);
    cr_expect_eq(sbx_enc_finish(&e, &buf, &len), -EINVAL,
                 "reply_ok must leave two levels open (result and the envelope)");
}

/* ---------------------------------------------------------------------------------
 * Encoder misuse. */

Test(wire, encoder_misuse_is_reported)
{
    sbx_enc e;
    char *buf = NULL;
    size_t len = 0;

    sbx_enc_init(&e);
    sbx_enc_end(&e);
    cr_expect_eq(sbx_enc_finish(&e, &buf, &len), -EINVAL, "end without an open container");

    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    cr_expect_eq(sbx_enc_finish(&e, &buf, &len), -EINVAL, "one end too many");

    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "a", 1);
    cr_expect_eq(sbx_enc_finish(&e, &buf, &len), -EINVAL, "map never closed");

    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, "key-without-value");
    sbx_enc_end(&e);
    cr_expect_eq(sbx_enc_finish(&e, &buf, &len), -EINVAL, "map with an odd number of items");

    sbx_enc_init(&e);
    for (int i = 0; i < 40; i++)
        sbx_enc_array(&e);
    for (int i = 0; i < 40; i++)
        sbx_enc_end(&e);
    cr_expect_eq(sbx_enc_finish(&e, &buf, &len), -EINVAL, "40 levels exceed the encoder's 32");

    /* Correct use still works after all that, with a fresh encoder. */
    sbx_enc_init(&e);
    sbx_enc_array(&e);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &buf, &len), 0);
    cr_expect_eq(len, 5u, "an empty array32 header is 5 bytes");
    cr_expect_eq(check_bytes(buf, len, &sbx_wire_limits_request), 0);
    free(buf);

    /* Nothing encoded at all is not misuse: an empty buffer. */
    sbx_enc_init(&e);
    cr_assert_eq(sbx_enc_finish(&e, &buf, &len), 0);
    cr_expect_eq(len, 0u);
    free(buf);
}

Test(wire, encoder_counts_many_items)
{
    /* Counts are patched on close: check a container larger than fix/16-bit sizes. */
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_karray(&e, "a");
    for (int i = 0; i < 70000; i++)
        sbx_enc_int(&e, i);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    char *buf;
    size_t len;
    finish(&e, &buf, &len);
    sbx_msg m;
    cr_assert_eq(sbx_wire_decode(&m, buf, len, &sbx_wire_limits_request), 0);
    const msgpack_object *a;
    cr_assert_eq(sbx_wire_get_array(m.root, "a", &a), 0);
    cr_assert_eq(a->via.array.size, 70000u);
    for (uint32_t i = 0; i < a->via.array.size; i++)
        cr_assert_eq(a->via.array.ptr[i].via.u64, i);
    sbx_wire_msg_free(&m);
    free(buf);
}

Test(wire, reencoding_empty_strings_decoded_first_in_a_frame)
{
    /* {1: ""}: msgpack-c decodes an empty str that is the frame's first
     * variable-length object with a NULL pointer; copying it with
     * sbx_enc_obj used to call memcpy(dst, NULL, 0), which UBSan aborts on
     * (tests/fuzz/corpus/fuzz_wire/regress-empty-str-null-ptr). */
    static const uint8_t frame[] = {0x81, 0x01, 0xa0};
    uint8_t *q = exact_copy(frame, sizeof(frame));
    sbx_msg m;
    cr_assert_eq(sbx_wire_decode(&m, q, sizeof(frame), &sbx_wire_limits_request), 0);
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_enc_init(&e);
    sbx_enc_obj(&e, m.root);
    cr_assert_eq(sbx_enc_finish(&e, &buf, &len), 0);
    cr_expect_eq(len, sizeof(frame));
    cr_expect(memcmp(buf, frame, sizeof(frame)) == 0, "re-encoded bytes differ");
    free(buf);
    sbx_wire_msg_free(&m);
    free(q);
}
