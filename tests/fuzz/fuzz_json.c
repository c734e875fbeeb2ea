/*
 * fuzz_json.c — msgpack ↔ JSON (runtime/json.c): the CLI's --json output
 * and `sbx call` arguments, the HTTP front.
 *
 * Input: byte 0 picks the direction, the rest is the document.
 *  - msgpack → JSON: any frame the reply pre-scan accepts is rendered
 *    (compact and pretty); whatever is rendered must be valid JSON that
 *    jansson reads back, and converting that back to msgpack works.
 *  - JSON → msgpack: text jansson accepts is converted; what the
 *    converter accepts must pass the wire pre-scan and convert back to a
 *    JSON value equal to the original.
 *  - sbx_utf8_sanitize: the output is valid UTF-8, at most 3 bytes per
 *    input byte, and valid input comes back unchanged.
 */
#include <jansson.h>
#include <msgpack.h>

#include "../../runtime/err.h"
#include "../../runtime/json.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "fuzz.h"

static const struct sbx_wire_limits deep = {.max_depth = 30, .max_objects = 1u << 23};

static void
msgpack_to_json(const char *buf, size_t n)
{
    if (sbx_wire_check(buf, n, &sbx_wire_limits_reply) != 0)
        return;
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, buf, n, &off) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&u);
        return;
    }
    for (int pretty = 0; pretty < 2; pretty++) {
        char *s = sbx_json_dump(&u.data, pretty);
        if (!s)
            continue;
        json_error_t je;
        json_t *j = json_loads(s, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
        if (!j && strstr(je.text, "NUL byte in object key")) {
            /* Valid JSON (RFC 8259 allows \u0000 in keys) that jansson
             * cannot load back; a limitation of the checker, not output. */
            free(s);
            continue;
        }
        FUZZ_CHECK(j != NULL, "rendered JSON does not parse: %s (%s)", je.text, s);
        sbx_enc e;
        char *out;
        size_t len;
        sbx_enc_init(&e);
        if (sbx_json_to_msgpack(j, &e) == 0) {
            FUZZ_CHECK(sbx_enc_finish(&e, &out, &len) == 0, "encoder misuse");
            FUZZ_CHECK(sbx_wire_check(out, len, &deep) == 0, "converted back, rejected");
            free(out);
        } else {
            sbx_enc_free(&e);
        }
        json_decref(j);
        free(s);
    }
    msgpack_unpacked_destroy(&u);
}

static void
json_to_msgpack(const char *buf, size_t n)
{
    json_error_t je;
    json_t *j = json_loadb(buf, n, JSON_DECODE_ANY | JSON_ALLOW_NUL, &je);
    if (!j)
        return;
    sbx_enc e;
    char *out;
    size_t len;
    sbx_enc_init(&e);
    if (sbx_json_to_msgpack(j, &e) != 0) {
        sbx_enc_free(&e);
        json_decref(j);
        return;
    }
    FUZZ_CHECK(sbx_enc_finish(&e, &out, &len) == 0, "encoder misuse");
    FUZZ_CHECK(sbx_wire_check(out, len, &deep) == 0, "converted JSON fails the pre-scan");
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    FUZZ_CHECK(msgpack_unpack_next(&u, out, len, &off) == MSGPACK_UNPACK_SUCCESS && off == len,
               "converted JSON does not decode");
    json_t *back = sbx_json_from_msgpack(&u.data);
    FUZZ_CHECK(back != NULL, "converted JSON does not convert back");
    FUZZ_CHECK(json_equal(j, back), "JSON → msgpack → JSON changed the value");
    json_decref(back);
    msgpack_unpacked_destroy(&u);
    free(out);
    json_decref(j);
}

static void
sanitize(const char *buf, size_t n)
{
    size_t len;
    char *s = sbx_utf8_sanitize(buf, n, &len);
    FUZZ_CHECK(len <= 3 * n && s[len] == '\0', "sanitized length %zu for %zu bytes", len, n);
    json_t *j = json_stringn(s, len); /* jansson validates UTF-8 */
    FUZZ_CHECK(j != NULL, "sanitized output is not valid UTF-8");
    json_decref(j);
    j = json_stringn(buf, n);
    if (j) {
        FUZZ_CHECK(len == n && memcmp(s, buf, n) == 0, "valid UTF-8 was changed");
        json_decref(j);
    }
    free(s);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > (256u << 10))
        return 0;
    char *buf = fuzz_copy(data + 1, size - 1);
    switch (data[0] % 3) {
    case 0: msgpack_to_json(buf, size - 1); break;
    case 1: json_to_msgpack(buf, size - 1); break;
    default: sanitize(buf, size - 1); break;
    }
    free(buf);
    return 0;
}
