/*
 * fuzz_id.c — the small validators and parsers of outside text: sandbox IDs
 * and session/process/context names (runtime/id.c), sizes and durations
 * (runtime/util.c: option values, sleepAfter), base64 (file contents),
 * error names (client replies).
 *
 * Input: byte 0 picks the parser, the rest is the text (not NUL-terminated
 * for the ID checks, which take a length; NUL-terminated for the others).
 *
 * Properties: the ID checks agree with a reference written from the
 * contract in id.h; a rejection always carries a reason; sizes agree with
 * the grammar digits[k|m|g[i][b]] (no sign, no overflow); an accepted
 * duration is ≥ 0 and its value printed as "<n>ms" parses to itself;
 * base64 decode(encode(x)) == x and a decodable text re-encodes to the
 * same length; error names round-trip.
 */
#include <errno.h>
#include <inttypes.h>

#include "../../runtime/err.h"
#include "../../runtime/id.h"
#include "../../runtime/util.h"
#include "fuzz.h"

static bool
ref_id(const char *s, size_t n)
{
    if (n == 0 || n > SBX_ID_MAX || s[0] == '-' || s[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-'))
            return false;
    return true;
}

static bool
ref_name(const char *s, size_t n, size_t max)
{
    if (n == 0 || n > max || s[0] == '.')
        return false;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.'))
            return false;
    }
    return true;
}

/* digits, then optionally one of k/m/g, an i and a b (any case). */
static bool
ref_size(const char *s, uint64_t *out)
{
    uint64_t v = 0, mul = 1;
    size_t i = 0;
    if (!(s[0] >= '0' && s[0] <= '9'))
        return false;
    for (; s[i] >= '0' && s[i] <= '9'; i++) {
        if (v > (UINT64_MAX - (uint64_t)(s[i] - '0')) / 10)
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    switch (s[i]) {
    case '\0': break;
    case 'k': case 'K': mul = 1ull << 10; i++; break;
    case 'm': case 'M': mul = 1ull << 20; i++; break;
    case 'g': case 'G': mul = 1ull << 30; i++; break;
    default: return false;
    }
    if (mul > 1 && (s[i] == 'i' || s[i] == 'I'))
        i++;
    if (mul > 1 && (s[i] == 'b' || s[i] == 'B'))
        i++;
    if (s[i] || v > UINT64_MAX / mul)
        return false;
    *out = v * mul;
    return true;
}

static void
ids(const char *p, size_t n)
{
    char why[256] = "";
    char *q = fuzz_copy(p, n);
    int rc = sbx_id_check(q, n, why, sizeof(why));
    FUZZ_CHECK((rc == 0) == ref_id(q, n), "sandbox ID check says %d", rc);
    FUZZ_CHECK(rc == 0 || (rc == SBX_E_VALIDATION && why[0]), "rejection without a reason");
    size_t max = n ? (size_t)(unsigned char)q[0] : 0;
    why[0] = '\0';
    rc = sbx_id_check_name("the name", q, n, max, why, sizeof(why));
    FUZZ_CHECK((rc == 0) == ref_name(q, n, max), "name check says %d", rc);
    FUZZ_CHECK(rc == 0 || (rc == SBX_E_VALIDATION && why[0]), "rejection without a reason");
    free(q);
}

static void
sizes(const char *s)
{
    uint64_t v = 0, r = 0;
    int rc = sbx_parse_size(s, &v);
    bool ok = ref_size(s, &r);
    FUZZ_CHECK((rc == 0) == ok, "sbx_parse_size(\"%s\") = %d, reference %d", s, rc, ok);
    FUZZ_CHECK(rc != 0 || v == r, "sbx_parse_size(\"%s\") = %" PRIu64 ", reference %" PRIu64, s,
               v, r);
    FUZZ_CHECK(rc == 0 || rc == -EINVAL, "error %d", rc);
}

static void
durations(const char *s)
{
    int64_t v = -1, w = -1;
    int rc = sbx_parse_duration_ms(s, &v);
    FUZZ_CHECK(rc == 0 || rc == -EINVAL, "error %d", rc);
    if (rc)
        return;
    FUZZ_CHECK(v >= 0, "sbx_parse_duration_ms(\"%s\") = %" PRId64, s, v);
    char buf[32];
    snprintf(buf, sizeof(buf), "%" PRId64 "ms", v);
    FUZZ_CHECK(sbx_parse_duration_ms(buf, &w) == 0 && w == v, "\"%s\" does not parse to itself",
               buf);
}

static void
base64(const char *p, size_t n)
{
    size_t el, dl;
    char *enc = sbx_base64_encode(p, n, &el);
    char *dec = NULL;
    FUZZ_CHECK(el == strlen(enc) && el == 4 * ((n + 2) / 3), "encoded length %zu", el);
    FUZZ_CHECK(sbx_base64_decode(enc, el, &dec, &dl) == 0, "own encoding does not decode");
    FUZZ_CHECK(dl == n && memcmp(dec, p, n) == 0, "decode(encode(x)) != x");
    free(enc);
    free(dec);
    /* The input as base64 text. */
    if (sbx_base64_decode(p, n, &dec, &dl) == 0) {
        enc = sbx_base64_encode(dec, dl, &el);
        FUZZ_CHECK(el == n, "decoded %zu bytes re-encode to %zu, not %zu", dl, el, n);
        free(enc);
        free(dec);
    }
}

static void
errnames(const char *p, size_t n)
{
    int code = sbx_err_from_name(p, n);
    const char *name = sbx_err_name(code);
    FUZZ_CHECK(name != NULL, "no name");
    FUZZ_CHECK(sbx_err_from_name(name, strlen(name)) == code, "%s does not round-trip", name);
    FUZZ_CHECK(sbx_err_message(code) != NULL && sbx_err_http(code) >= 400, "code %d", code);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    char *s = fuzz_cstr(p, n);
    switch (data[0] % 5) {
    case 0: ids(p, n); break;
    case 1: sizes(s); break;
    case 2: durations(s); break;
    case 3: base64(p, n); break;
    default: errnames(p, n); break;
    }
    free(s);
    return 0;
}
