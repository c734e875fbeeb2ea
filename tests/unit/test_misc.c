/*
 * test_misc.c — unit tests for the small runtime modules.
 *
 *  - runtime/id.h: sandbox IDs per the contract (1-63 chars of [a-z0-9-], no
 *    leading/trailing '-'), boundaries 63/64, upper case, '_', '.', UTF-8
 *    bytes, empty, bytes past n ignored; session-style names; the UUID v4
 *    format of sbx_request_id.
 *  - runtime/err.h: every code has a distinct wire name that
 *    sbx_err_from_name inverts; -errno mapping (ENOENT → FILE_NOT_FOUND);
 *    unknown codes.
 *  - runtime/util.h: sbx_parse_size, sbx_parse_duration_ms (valid and invalid
 *    input), sbx_buf operations, base64, sbx_iso8601, file helpers in a temp dir.
 *  - runtime/json.h: msgpack → JSON → msgpack round trip, invalid UTF-8
 *    replaced by U+FFFD with the JSON staying valid, non-string keys → NULL,
 *    the nesting limit of sbx_json_to_msgpack.
 *  - runtime/config.h: file < environment < argv precedence, list options
 *    appending across sources, positional arguments and "--", errors for
 *    unknown options and bad values.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/config.h"
#include "runtime/err.h"
#include "runtime/id.h"
#include "runtime/json.h"
#include "runtime/util.h"
#include "runtime/wire.h"

/* ---------------------------------------------------------------------------------
 * id.h */

/* Check an ID from a heap buffer of exactly n bytes (no NUL after it). */
static int
id_check_exact(const char *s, size_t n, char *why, size_t whylen)
{
    char *p = sbx_xmalloc(n);
    if (n)
        memcpy(p, s, n);
    int rc = sbx_id_check(p, n, why, whylen);
    free(p);
    return rc;
}

Test(id, valid_sandbox_ids)
{
    static const char *ok[] = {"a", "0", "user-42", "a-b-c", "9lives", "a--b", "abc123xyz",
                               "0-0", "z9"};
    char why[256];
    for (size_t i = 0; i < SBX_ARRAY_LEN(ok); i++) {
        why[0] = '\0';
        cr_expect_eq(id_check_exact(ok[i], strlen(ok[i]), why, sizeof(why)), 0,
                     "'%s' rejected: %s", ok[i], why);
    }
    char id[SBX_ID_MAX + 2];
    memset(id, 'a', sizeof(id));
    cr_expect_eq(SBX_ID_MAX, 63);
    cr_expect_eq(id_check_exact(id, 63, why, sizeof(why)), 0, "63 chars: %s", why);
    id[0] = '1';
    id[62] = '9';
    cr_expect_eq(id_check_exact(id, 63, why, sizeof(why)), 0, "63 chars with digits: %s", why);
    /* Only n bytes count: what follows is not part of the ID. */
    cr_expect_eq(sbx_id_check("abc-", 3, why, sizeof(why)), 0);
    cr_expect_eq(sbx_id_check("abc_DEF", 3, why, sizeof(why)), 0);
}

Test(id, invalid_sandbox_ids)
{
    static const struct {
        const char *s;
        size_t n;
        const char *what;
    } bad[] = {
        {"", 0, "empty"},
        {"-abc", 4, "leading '-'"},
        {"abc-", 4, "trailing '-'"},
        {"-", 1, "a lone '-'"},
        {"User", 4, "upper case"},
        {"userA", 5, "upper case at the end"},
        {"a_b", 3, "underscore"},
        {"a.b", 3, "dot"},
        {"a b", 3, "space"},
        {"a/b", 3, "slash"},
        {"caf\xc3\xa9", 5, "UTF-8 é"},
        {"\xe2\x82\xac", 3, "UTF-8 €"},
        {"a\0b", 3, "NUL inside"},
        {"a\n", 2, "newline"},
        {"\xff", 1, "byte 0xff"},
    };
    char why[256];
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        why[0] = '\0';
        cr_expect_eq(id_check_exact(bad[i].s, bad[i].n, why, sizeof(why)), SBX_E_VALIDATION,
                     "%s accepted", bad[i].what);
        cr_expect_neq(why[0], '\0', "%s: no reason", bad[i].what);
    }
    char id[SBX_ID_MAX + 1];
    memset(id, 'a', sizeof(id));
    cr_expect_eq(id_check_exact(id, 64, why, sizeof(why)), SBX_E_VALIDATION, "64 chars accepted");
    cr_expect(strstr(why, "64") != NULL, "the reason names the length: %s", why);
}

Test(id, names_of_sessions_and_processes)
{
    char why[256];
    cr_expect_eq(sbx_id_check_name("session", "My_Session.1-x", 14, 120, why, sizeof(why)), 0,
                 "%s", why);
    cr_expect_eq(sbx_id_check_name("session", ".hidden", 7, 120, why, sizeof(why)),
                 SBX_E_VALIDATION, "leading '.'");
    cr_expect(strstr(why, "session") != NULL, "reason names the kind: %s", why);
    cr_expect_eq(sbx_id_check_name("session", "a b", 3, 120, why, sizeof(why)), SBX_E_VALIDATION);
    cr_expect_eq(sbx_id_check_name("session", "a/b", 3, 120, why, sizeof(why)), SBX_E_VALIDATION);
    cr_expect_eq(sbx_id_check_name("session", "", 0, 120, why, sizeof(why)), SBX_E_VALIDATION);
    cr_expect_eq(sbx_id_check_name("session", "abcd", 4, 4, why, sizeof(why)), 0);
    cr_expect_eq(sbx_id_check_name("session", "abcde", 5, 4, why, sizeof(why)), SBX_E_VALIDATION);
}

static bool
is_lower_hex(char c)
{
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
}

static int
cmp_ids(const void *a, const void *b)
{
    return strcmp(a, b);
}

Test(id, request_ids_are_uuid_v4)
{
    enum { N = 2000 };
    static char ids[N][37];
    for (int k = 0; k < N; k++) {
        char *id = ids[k];
        memset(id, 'X', 37);
        sbx_request_id(id);
        cr_assert_eq(strlen(id), 36u, "'%s' is not 36 chars", id);
        for (int i = 0; i < 36; i++) {
            if (i == 8 || i == 13 || i == 18 || i == 23)
                cr_assert_eq(id[i], '-', "'%s': no '-' at %d", id, i);
            else
                cr_assert(is_lower_hex(id[i]), "'%s': byte %d is not lower-case hex", id, i);
        }
        cr_assert_eq(id[14], '4', "'%s' is not version 4", id);
        cr_assert(strchr("89ab", id[19]) != NULL, "'%s' has variant %c", id, id[19]);
        /* It doubles as the wire request id, so it must fit SBX_WIRE_MAX_ID. */
        cr_assert_leq(strlen(id), (size_t)SBX_WIRE_MAX_ID);
    }
    qsort(ids, N, sizeof(ids[0]), cmp_ids);
    for (int k = 1; k < N; k++)
        cr_assert_str_neq(ids[k], ids[k - 1], "duplicate request id %s", ids[k]);
}

/* ---------------------------------------------------------------------------------
 * err.h */

Test(err, every_code_has_a_distinct_name_that_round_trips)
{
    int n = SBX_E__LAST - SBX_E__FIRST - 1;
    cr_assert_gt(n, 40, "the table has %d codes", n);
    for (int c = SBX_E__FIRST + 1; c < SBX_E__LAST; c++) {
        const char *name = sbx_err_name(c);
        cr_assert_not_null(name);
        cr_assert_gt(strlen(name), 0u, "code %d has an empty name", c);
        for (const char *p = name; *p; p++)
            cr_assert((*p >= 'A' && *p <= 'Z') || *p == '_', "name '%s' is not UPPER_SNAKE", name);
        if (c != SBX_E_INTERNAL)
            cr_expect_str_neq(name, "INTERNAL_ERROR", "code %d falls back to INTERNAL_ERROR", c);
        for (int d = SBX_E__FIRST + 1; d < c; d++)
            cr_assert_str_neq(name, sbx_err_name(d), "codes %d and %d share the name %s", c, d,
                              name);
        cr_expect_eq(sbx_err_from_name(name, strlen(name)), c, "from_name(%s) != %d", name, c);
        /* The name need not be NUL-terminated. */
        char buf[64];
        snprintf(buf, sizeof(buf), "%sTRAILING", name);
        cr_expect_eq(sbx_err_from_name(buf, strlen(name)), c, "from_name of a prefix view");
        int http = sbx_err_http(c);
        cr_expect(http >= 400 && http <= 599, "%s has HTTP status %d", name, http);
        cr_expect_gt(strlen(sbx_err_message(c)), 0u, "%s has no message", name);
    }
    cr_expect_str_eq(sbx_err_name(SBX_E_VALIDATION), "VALIDATION_FAILED");
    cr_expect_str_eq(sbx_err_name(SBX_E_NOT_FOUND), "SANDBOX_NOT_FOUND");
    cr_expect_eq(sbx_err_http(SBX_E_NOT_FOUND), 404);
    cr_expect_eq(sbx_err_http(SBX_E_TOO_LARGE), 413);
}

Test(err, unknown_names_and_codes)
{
    cr_expect_eq(sbx_err_from_name("NO_SUCH_CODE", 12), SBX_E_INTERNAL);
    cr_expect_eq(sbx_err_from_name("", 0), SBX_E_INTERNAL);
    cr_expect_eq(sbx_err_from_name("FILE_NOT", 8), SBX_E_INTERNAL, "a prefix is not a name");
    cr_expect_eq(sbx_err_from_name("file_not_found", 14), SBX_E_INTERNAL, "names are exact");
    static const int unknown[] = {0, 1, 4096, -5000, SBX_E__FIRST, SBX_E__LAST, SBX_E__LAST + 7,
                                  SBX_ERR_BASE - 1000};
    for (size_t i = 0; i < SBX_ARRAY_LEN(unknown); i++) {
        cr_expect_str_eq(sbx_err_name(unknown[i]), "INTERNAL_ERROR", "code %d", unknown[i]);
        cr_expect_eq(sbx_err_http(unknown[i]), 500, "code %d", unknown[i]);
        cr_expect_not_null(sbx_err_message(unknown[i]));
    }
}

Test(err, errno_codes_map_to_sdk_names)
{
    static const struct {
        int e;
        const char *name;
        int http;
    } m[] = {
        {ENOENT, "FILE_NOT_FOUND", 404},   {EEXIST, "FILE_EXISTS", 409},
        {EISDIR, "IS_DIRECTORY", 400},     {ENOTDIR, "NOT_DIRECTORY", 400},
        {EACCES, "PERMISSION_DENIED", 403}, {EPERM, "PERMISSION_DENIED", 403},
        {EROFS, "READ_ONLY", 403},         {ENOSPC, "DISK_FULL", 507},
        {ENAMETOOLONG, "NAME_TOO_LONG", 400}, {EINVAL, "VALIDATION_FAILED", 400},
        {ETIMEDOUT, "REQUEST_TIMEOUT", 504}, {EFBIG, "FILE_TOO_LARGE", 413},
        {EBUSY, "RESOURCE_BUSY", 409},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(m); i++) {
        cr_expect_str_eq(sbx_err_name(-m[i].e), m[i].name, "-%s", strerror(m[i].e));
        cr_expect_eq(sbx_err_http(-m[i].e), m[i].http, "-%s", strerror(m[i].e));
        cr_expect_str_eq(sbx_err_message(-m[i].e), strerror(m[i].e));
    }
}

/* ---------------------------------------------------------------------------------
 * util.h: parsers */

Test(util, parse_size)
{
    static const struct {
        const char *s;
        uint64_t v;
    } ok[] = {
        {"0", 0},
        {"4096", 4096},
        {"2k", 2048},
        {"2K", 2048},
        {"64M", 64ull << 20},
        {"64m", 64ull << 20},
        {"1g", 1ull << 30},
        {"3G", 3ull << 30},
        {"1KiB", 1024},
        {"1kb", 1024},
        {"5MiB", 5ull << 20},
        {"2Gi", 2ull << 30},
        {"18446744073709551615", UINT64_MAX},
        {"17179869183G", 17179869183ull << 30},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(ok); i++) {
        uint64_t v = 12345;
        cr_expect_eq(sbx_parse_size(ok[i].s, &v), 0, "'%s' rejected", ok[i].s);
        cr_expect_eq(v, ok[i].v, "'%s' gave %llu, want %llu", ok[i].s, (unsigned long long)v,
                     (unsigned long long)ok[i].v);
    }
    static const char *bad[] = {
        "", "abc", "M", "12x", "1T", "1.5M", "1 M", "1Mx", "1MiBx", "1b", "0x10",
        "18446744073709551616", /* 2^64 */
        "17179869184G",         /* 2^64 bytes */
        "-1", "-5", "-1M",      /* negative sizes must not wrap to 2^64 - n */
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        uint64_t v = 777;
        cr_expect_eq(sbx_parse_size(bad[i], &v), -EINVAL, "'%s' accepted as %llu", bad[i],
                     (unsigned long long)v);
        cr_expect_eq(v, 777u, "'%s': output written on error", bad[i]);
    }
}

Test(util, parse_duration_ms)
{
    static const struct {
        const char *s;
        int64_t v;
    } ok[] = {
        {"0", 0},
        {"250", 250000}, /* a bare number is seconds */
        {"30s", 30000},
        {"10m", 600000},
        {"1h", 3600000},
        {"500ms", 500},
        {"0ms", 0},
        {"9223372036854775807ms", INT64_MAX},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(ok); i++) {
        int64_t v = 12345;
        cr_expect_eq(sbx_parse_duration_ms(ok[i].s, &v), 0, "'%s' rejected", ok[i].s);
        cr_expect_eq(v, ok[i].v, "'%s' gave %lld, want %lld", ok[i].s, (long long)v,
                     (long long)ok[i].v);
    }
    static const char *bad[] = {
        "", "abc", "s", "ms", "-1", "-5s", "1.5s", "10x", "5 s", "5sec", "1d", "10M", "3H",
        "9223372036854775807s", "9223372036854775807", "99999999999999999999ms",
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        int64_t v = 777;
        cr_expect_eq(sbx_parse_duration_ms(bad[i], &v), -EINVAL, "'%s' accepted as %lld", bad[i],
                     (long long)v);
        cr_expect_eq(v, 777, "'%s': output written on error", bad[i]);
    }
}

/* ---------------------------------------------------------------------------------
 * util.h: sbx_buf */

Test(util, buf_operations)
{
    sbx_buf b;
    sbx_buf_init(&b);
    cr_expect_null(b.p);
    cr_expect_eq(b.len, 0u);

    sbx_buf_append(&b, "hello", 5);
    cr_assert_eq(b.len, 5u);
    cr_expect_str_eq(b.p, "hello", "append keeps a NUL after the data");
    sbx_buf_append(&b, "", 0);
    cr_expect_eq(b.len, 5u);
    sbx_buf_appendf(&b, " %d-%s", 42, "x");
    cr_assert_eq(b.len, 10u);
    cr_expect_str_eq(b.p, "hello 42-x");

    /* Binary data with NULs, and growth well past the first allocation. */
    char big[100000];
    for (size_t i = 0; i < sizeof(big); i++)
        big[i] = (char)(i * 31);
    sbx_buf_append(&b, big, sizeof(big));
    cr_assert_eq(b.len, 10u + sizeof(big));
    cr_expect_geq(b.cap, b.len + 1);
    cr_expect_arr_eq(b.p + 10, big, sizeof(big));
    cr_expect_arr_eq(b.p, "hello 42-x", 10, "growth kept the old bytes");

    sbx_buf_consume(&b, 6);
    cr_assert_eq(b.len, 4u + sizeof(big));
    cr_expect_arr_eq(b.p, "42-x", 4);
    cr_expect_arr_eq(b.p + 4, big, sizeof(big));

    sbx_buf_consume(&b, 0);
    cr_expect_eq(b.len, 4u + sizeof(big));

    size_t cap = b.cap;
    sbx_buf_reserve(&b, 10);
    cr_expect_eq(b.cap, cap, "reserve within capacity does not reallocate");
    sbx_buf_reserve(&b, cap);
    cr_expect_geq(b.cap, b.len + cap + 1);
    cr_expect_arr_eq(b.p, "42-x", 4, "reserve kept the bytes");

    sbx_buf_consume(&b, b.len + 5); /* more than there is: empties the buffer */
    cr_expect_eq(b.len, 0u);
    sbx_buf_append(&b, "abc", 3);
    cr_expect_str_eq(b.p, "abc");

    size_t len = 0;
    char *s = sbx_buf_steal(&b, &len);
    cr_expect_eq(len, 3u);
    cr_expect_str_eq(s, "abc");
    cr_expect_null(b.p, "steal resets the buffer");
    cr_expect_eq(b.len, 0u);
    cr_expect_eq(b.cap, 0u);
    free(s);

    s = sbx_buf_steal(&b, &len);
    cr_assert_not_null(s, "stealing an empty buffer gives an empty string");
    cr_expect_eq(len, 0u);
    cr_expect_str_eq(s, "");
    free(s);

    sbx_buf_appendf(&b, "%s", "");
    cr_expect_eq(b.len, 0u);
    sbx_buf_free(&b);
    cr_expect_null(b.p);
    sbx_buf_free(&b); /* twice is fine */
}

Test(util, base64)
{
    /* RFC 4648 §10 test vectors. */
    static const char *plain[] = {"", "f", "fo", "foo", "foob", "fooba", "foobar"};
    static const char *enc[] = {"", "Zg==", "Zm8=", "Zm9v", "Zm9vYg==", "Zm9vYmE=", "Zm9vYmFy"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(plain); i++) {
        size_t n = 999;
        char *e = sbx_base64_encode(plain[i], strlen(plain[i]), &n);
        cr_expect_str_eq(e, enc[i], "encode('%s')", plain[i]);
        cr_expect_eq(n, strlen(enc[i]));
        free(e);
        char *d = NULL;
        size_t dn = 999;
        cr_assert_eq(sbx_base64_decode(enc[i], strlen(enc[i]), &d, &dn), 0, "decode('%s')",
                     enc[i]);
        cr_expect_eq(dn, strlen(plain[i]));
        cr_expect_str_eq(d, plain[i], "decode('%s') is NUL-terminated and right", enc[i]);
        free(d);
    }
    /* Every byte value survives a round trip. */
    unsigned char all[256];
    for (int i = 0; i < 256; i++)
        all[i] = (unsigned char)i;
    size_t n;
    char *e = sbx_base64_encode(all, sizeof(all), &n);
    char *d = NULL;
    size_t dn = 0;
    cr_assert_eq(sbx_base64_decode(e, n, &d, &dn), 0);
    cr_expect_eq(dn, sizeof(all));
    cr_expect_arr_eq(d, all, sizeof(all));
    free(d);
    free(e);
    /* Invalid input. */
    static const char *bad[] = {"Zg=", "Zg", "Z===", "Zm9v!A==", "Zm 9v", "Zg==Zg==", "=Zg=",
                                "Zm9-", "Zg=a"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        d = NULL;
        cr_expect_eq(sbx_base64_decode(bad[i], strlen(bad[i]), &d, &dn), -EINVAL,
                     "'%s' decoded", bad[i]);
        if (d)
            free(d);
    }
}

Test(util, iso8601)
{
    char out[32];
    sbx_iso8601(0, out, sizeof(out));
    cr_expect_str_eq(out, "1970-01-01T00:00:00.000Z");
    sbx_iso8601(1700000000123LL, out, sizeof(out));
    cr_expect_str_eq(out, "2023-11-14T22:13:20.123Z");
    sbx_iso8601(951782400007LL, out, sizeof(out)); /* 2000-02-29, a leap day */
    cr_expect_str_eq(out, "2000-02-29T00:00:00.007Z");
}

Test(util, files_and_directories)
{
    char dir[64] = "/tmp/sbx-test-misc-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    char path[160], file[200];
    snprintf(path, sizeof(path), "%s/a/b/c", dir);
    cr_assert_eq(sbx_mkdir_p(path, 0700), 0);
    cr_expect_eq(sbx_mkdir_p(path, 0700), 0, "mkdir -p of an existing dir succeeds");
    struct stat sb;
    cr_assert_eq(stat(path, &sb), 0);
    cr_expect(S_ISDIR(sb.st_mode));

    snprintf(file, sizeof(file), "%s/f.txt", path);
    cr_expect_eq(sbx_fs_write(file, "x"), -ENOENT, "sbx_fs_write does not create files");
    FILE *f = fopen(file, "w");
    cr_assert_not_null(f);
    fclose(f);
    cr_assert_eq(sbx_fs_write(file, "0123456789"), 0);
    char *s = NULL;
    size_t n = 0;
    cr_assert_eq(sbx_fs_read(file, 10, &s, &n), 0, "a file of exactly max bytes is fine");
    cr_expect_eq(n, 10u);
    cr_expect_str_eq(s, "0123456789");
    free(s);
    s = NULL;
    cr_expect_eq(sbx_fs_read(file, 9, &s, &n), -EFBIG);
    cr_expect_null(s, "nothing returned on -EFBIG");
    snprintf(file, sizeof(file), "%s/missing", path);
    cr_expect_eq(sbx_fs_read(file, 100, &s, &n), -ENOENT);

    cr_assert_eq(sbx_rm_rf(dir), 0);
    cr_expect_neq(stat(dir, &sb), 0, "%s still exists", dir);
    cr_expect_eq(sbx_rm_rf(dir), 0, "removing a missing tree is not an error");
}

/* ---------------------------------------------------------------------------------
 * json.h */

static void
decode_enc(sbx_enc *e, char **buf, size_t *len, sbx_msg *m)
{
    cr_assert_eq(sbx_enc_finish(e, buf, len), 0);
    cr_assert_eq(sbx_wire_decode(m, *buf, *len, &sbx_wire_limits_reply), 0);
}

Test(json, msgpack_json_msgpack_round_trip)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "s", "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80");
    sbx_enc_kstr(&e, "empty", "");
    sbx_enc_kstr(&e, "quote", "a\"b\\c\n\t\x01");
    sbx_enc_kint(&e, "neg", -42);
    sbx_enc_kint(&e, "big", 5000000000LL);
    sbx_enc_kint(&e, "min", INT64_MIN);
    sbx_enc_kint(&e, "zero", 0);
    sbx_enc_str(&e, "f");
    sbx_enc_double(&e, 1.5);
    sbx_enc_str(&e, "g");
    sbx_enc_double(&e, -0.1);
    sbx_enc_kbool(&e, "t", true);
    sbx_enc_kbool(&e, "fa", false);
    sbx_enc_str(&e, "n");
    sbx_enc_nil(&e);
    sbx_enc_karray(&e, "a");
    sbx_enc_int(&e, 1);
    sbx_enc_str(&e, "x");
    sbx_enc_map(&e);
    sbx_enc_end(&e);
    sbx_enc_array(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_kmap(&e, "m");
    sbx_enc_karray(&e, "k");
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    char *buf;
    size_t len;
    sbx_msg m;
    decode_enc(&e, &buf, &len, &m);

    json_t *j = sbx_json_from_msgpack(m.root);
    cr_assert_not_null(j);
    cr_assert(json_is_object(j));
    cr_expect_eq(json_object_size(j), 14u);
    cr_expect_str_eq(json_string_value(json_object_get(j, "s")),
                     "h\xc3\xa9llo \xe2\x82\xac \xf0\x9f\x98\x80", "valid UTF-8 is kept as is");
    cr_expect_eq(json_integer_value(json_object_get(j, "neg")), -42);
    cr_expect_eq(json_integer_value(json_object_get(j, "big")), 5000000000LL);
    cr_expect_eq(json_integer_value(json_object_get(j, "min")), INT64_MIN);
    cr_expect(json_is_real(json_object_get(j, "f")));
    cr_expect_eq(json_real_value(json_object_get(j, "f")), 1.5);
    cr_expect(json_is_true(json_object_get(j, "t")));
    cr_expect(json_is_false(json_object_get(j, "fa")));
    cr_expect(json_is_null(json_object_get(j, "n")));
    cr_expect_eq(json_array_size(json_object_get(j, "a")), 4u);

    sbx_enc e2;
    sbx_enc_init(&e2);
    cr_assert_eq(sbx_json_to_msgpack(j, &e2), 0);
    char *buf2;
    size_t len2;
    sbx_msg m2;
    decode_enc(&e2, &buf2, &len2, &m2);
    cr_expect(msgpack_object_equal(*m.root, *m2.root), "msgpack → JSON → msgpack changed it");

    /* And through JSON text: dump, parse with jansson, convert back. */
    char *text = sbx_json_dump(m.root, false);
    cr_assert_not_null(text);
    json_error_t jerr;
    json_t *j2 = json_loads(text, 0, &jerr);
    cr_assert_not_null(j2, "dump is not valid JSON: %s (%s)", jerr.text, text);
    cr_expect(json_equal(j, j2), "JSON text round trip changed the value: %s", text);
    char *pretty = sbx_json_dump(m.root, true);
    cr_assert_not_null(pretty);
    cr_expect(strstr(pretty, "\n  \"s\": ") != NULL, "pretty output is indented by 2: %s", pretty);

    free(pretty);
    free(text);
    json_decref(j2);
    json_decref(j);
    sbx_wire_msg_free(&m2);
    free(buf2);
    sbx_wire_msg_free(&m);
    free(buf);
}

Test(json, compact_dump_and_special_values)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "a", 1);
    sbx_enc_karray(&e, "b");
    sbx_enc_bool(&e, true);
    sbx_enc_nil(&e);
    sbx_enc_end(&e);
    sbx_enc_kstr(&e, "c", "x");
    sbx_enc_str(&e, "u");
    sbx_enc_uint(&e, UINT64_MAX); /* beyond int64: becomes a real */
    sbx_enc_kbin(&e, "bin", "ok", 2);
    sbx_enc_end(&e);
    char *buf;
    size_t len;
    sbx_msg m;
    decode_enc(&e, &buf, &len, &m);
    char *text = sbx_json_dump(m.root, false);
    cr_assert_not_null(text);
    /* Keys in order, no spaces; the real's exact spelling is jansson's business. */
    static const char head[] = "{\"a\":1,\"b\":[true,null],\"c\":\"x\",\"u\":";
    static const char tail[] = ",\"bin\":\"ok\"}";
    cr_assert_eq(strncmp(text, head, strlen(head)), 0, "compact dump: %s", text);
    char *end;
    double u = strtod(text + strlen(head), &end);
    cr_expect_eq(u, 18446744073709551615.0, "a uint64 beyond int64 becomes a real: %s", text);
    cr_expect_str_eq(end, tail, "compact dump: %s", text);
    free(text);
    sbx_wire_msg_free(&m);
    free(buf);
}

Test(json, utf8_sanitize)
{
    static const struct {
        const char *in;
        size_t n;
        const char *out;
        size_t outn; /* 0: strlen(out) */
    } cases[] = {
        {"abc", 3, "abc", 0},
        {"", 0, "", 0},
        {"\xe2\x82\xac", 3, "\xe2\x82\xac", 0},                    /* € */
        {"\xf0\x9f\x98\x80", 4, "\xf0\x9f\x98\x80", 0},            /* U+1F600 */
        {"a\xff" "b", 3, "a\xef\xbf\xbd" "b", 0},                  /* invalid byte */
        {"\xc0\xaf", 2, "\xef\xbf\xbd\xef\xbf\xbd", 0},            /* overlong '/' */
        {"\xed\xa0\x80", 3, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0}, /* surrogate */
        {"\xf4\x90\x80\x80", 4,
         "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd", 0},  /* > U+10FFFF */
        {"x\xe2\x82", 3, "x\xef\xbf\xbd\xef\xbf\xbd", 0},          /* truncated at the end */
        {"\x80", 1, "\xef\xbf\xbd", 0},                            /* lone continuation */
        {"a\0b", 3, "a\0b", 3},                                    /* NUL is valid UTF-8 */
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(cases); i++) {
        /* Exact-size input so ASan catches a read past n. */
        char *in = sbx_xmalloc(cases[i].n);
        if (cases[i].n)
            memcpy(in, cases[i].in, cases[i].n);
        size_t outlen = 999;
        char *out = sbx_utf8_sanitize(in, cases[i].n, &outlen);
        size_t want = cases[i].outn ? cases[i].outn : strlen(cases[i].out);
        cr_expect_eq(outlen, want, "case %zu: length %zu, want %zu", i, outlen, want);
        if (outlen == want)
            cr_expect_arr_eq(out, cases[i].out, want, "case %zu: wrong bytes", i);
        cr_expect_eq(out[outlen], '\0', "case %zu: not NUL-terminated", i);
        free(out);
        free(in);
    }
}

Test(json, invalid_utf8_becomes_replacement_and_json_stays_valid)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstrn(&e, "s", "a\xff" "b\xc3", 4);
    sbx_enc_str(&e, "k\xfe");
    sbx_enc_str(&e, "v");
    sbx_enc_kbin(&e, "bin", "\x00\x80\xff", 3);
    sbx_enc_end(&e);
    char *buf;
    size_t len;
    sbx_msg m;
    decode_enc(&e, &buf, &len, &m);

    json_t *j = sbx_json_from_msgpack(m.root);
    cr_assert_not_null(j);
    json_t *s = json_object_get(j, "s");
    cr_assert_not_null(s);
    cr_expect_eq(json_string_length(s), 8u);
    cr_expect_arr_eq(json_string_value(s), "a\xef\xbf\xbd" "b\xef\xbf\xbd", 8);
    cr_expect_not_null(json_object_get(j, "k\xef\xbf\xbd"), "keys are sanitized too");
    json_t *bin = json_object_get(j, "bin");
    cr_assert_not_null(bin);
    cr_expect_eq(json_string_length(bin), 7u);
    cr_expect_arr_eq(json_string_value(bin), "\0\xef\xbf\xbd\xef\xbf\xbd", 7);
    json_decref(j);

    char *text = sbx_json_dump(m.root, false);
    cr_assert_not_null(text, "dump failed on invalid UTF-8");
    json_error_t jerr;
    json_t *back = json_loads(text, JSON_ALLOW_NUL, &jerr);
    cr_assert_not_null(back, "dump is not valid JSON: %s", jerr.text);
    cr_expect_str_eq(json_string_value(json_object_get(back, "s")), "a\xef\xbf\xbd" "b\xef\xbf\xbd");
    json_decref(back);
    free(text);
    sbx_wire_msg_free(&m);
    free(buf);
}

Test(json, non_string_keys_give_null)
{
    static const uint8_t int_key[] = {0x81, 0x01, 0xa1, 'x'};
    static const uint8_t nil_key[] = {0x81, 0xc0, 0x01};
    static const uint8_t bin_key[] = {0x81, 0xc4, 0x01, 'k', 0x01};
    /* Deep inside: {"a": [1, {"b": {2: 3}}]} */
    static const uint8_t deep[] = {0x81, 0xa1, 'a', 0x92, 0x01, 0x81, 0xa1, 'b', 0x81, 0x02, 0x03};
    const struct {
        const uint8_t *p;
        size_t n;
        const char *what;
    } cases[] = {{int_key, sizeof(int_key), "integer key"},
                 {nil_key, sizeof(nil_key), "nil key"},
                 {bin_key, sizeof(bin_key), "bin key"},
                 {deep, sizeof(deep), "integer key nested in an array"}};
    for (size_t i = 0; i < SBX_ARRAY_LEN(cases); i++) {
        sbx_msg m;
        cr_assert_eq(sbx_wire_decode(&m, cases[i].p, cases[i].n, &sbx_wire_limits_reply), 0);
        json_t *j = sbx_json_from_msgpack(m.root);
        cr_expect_null(j, "%s converted to JSON", cases[i].what);
        json_decref(j);
        cr_expect_null(sbx_json_dump(m.root, false), "%s dumped", cases[i].what);
        sbx_wire_msg_free(&m);
    }
}

static json_t *
nested_json_arrays(int depth)
{
    json_t *j = json_array();
    json_t *cur = j;
    for (int i = 1; i < depth; i++) {
        json_t *inner = json_array();
        json_array_append_new(cur, inner);
        cur = inner;
    }
    json_array_append_new(cur, json_integer(1));
    return j;
}

Test(json, to_msgpack_limits_nesting)
{
    json_t *ok = nested_json_arrays(16);
    sbx_enc e;
    sbx_enc_init(&e);
    cr_expect_eq(sbx_json_to_msgpack(ok, &e), 0, "16 levels");
    char *buf;
    size_t len;
    cr_assert_eq(sbx_enc_finish(&e, &buf, &len), 0);
    cr_expect_eq(sbx_wire_check(buf, len, &sbx_wire_limits_reply), 0);
    free(buf);
    json_decref(ok);

    json_t *deep = nested_json_arrays(40);
    sbx_enc_init(&e);
    cr_expect_eq(sbx_json_to_msgpack(deep, &e), SBX_E_VALIDATION, "40 levels accepted");
    sbx_enc_free(&e);
    json_decref(deep);
}

/* ---------------------------------------------------------------------------------
 * config.h */

struct conf {
    char *name;
    int64_t count;
    uint64_t mem;
    int64_t wait;
    bool flag;
    char **tags;
    int64_t setup_timeout;
};

static void
conf_free(struct conf *c)
{
    free(c->name);
    sbx_strv_free(c->tags);
    memset(c, 0, sizeof(*c));
}

#define CONF_OPTS(c)                                                                   \
    {                                                                                  \
        {"name", SBX_OPT_STR, &(c)->name, "a name"},                                   \
        {"count", SBX_OPT_INT, &(c)->count, "a count"},                                \
        {"mem", SBX_OPT_SIZE, &(c)->mem, "a size"},                                    \
        {"wait", SBX_OPT_MS, &(c)->wait, "a duration"},                                \
        {"flag", SBX_OPT_BOOL, &(c)->flag, "a flag"},                                  \
        {"tags", SBX_OPT_LIST, &(c)->tags, "a list"},                                  \
        {"setup-timeout", SBX_OPT_MS, &(c)->setup_timeout, "dashed name"},             \
        {NULL, 0, NULL, NULL},                                                         \
    }

static char cfgdir[64];

static void
cfg_setup(void)
{
    snprintf(cfgdir, sizeof(cfgdir), "/tmp/sbx-test-config-XXXXXX");
    cr_assert_not_null(mkdtemp(cfgdir));
    static const char *vars[] = {"SBX_NAME", "SBX_COUNT", "SBX_MEM", "SBX_WAIT", "SBX_FLAG",
                                 "SBX_TAGS", "SBX_SETUP_TIMEOUT"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(vars); i++)
        unsetenv(vars[i]);
}

static void
cfg_teardown(void)
{
    cr_expect_eq(sbx_rm_rf(cfgdir), 0);
}

static const char *
write_cfg(const char *name, const char *text)
{
    static char path[128];
    snprintf(path, sizeof(path), "%s/%s", cfgdir, name);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

TestSuite(config, .init = cfg_setup, .fini = cfg_teardown);

Test(config, file_env_argv_precedence)
{
    const char *path = write_cfg("a.conf", "# a comment line\n"
                                           "name = from-file\n"
                                           "count = 5\n"
                                           "mem=1M\n"
                                           "   \n"
                                           "wait = 2s   # trailing comment\n"
                                           "tags = a, b ,c\n"
                                           "flag = yes\n");
    setenv("SBX_COUNT", "7", 1);
    setenv("SBX_TAGS", "d", 1);
    setenv("SBX_SETUP_TIMEOUT", "3m", 1);
    setenv("SBX_MEM", "", 1); /* empty: ignored */

    struct conf c = {.name = sbx_xstrdup("default"), .count = 1, .wait = 99};
    struct sbx_opt opts[] = CONF_OPTS(&c);
    char cfgarg[160];
    snprintf(cfgarg, sizeof(cfgarg), "--config=%s", path);
    char *argv[] = {"sbxd", "shard", "--name=cli", "pos1", cfgarg, "--mem", "2M", "--tags", "e",
                    "--", "--not-an-option", "pos2"};
    char **rest = NULL, why[256] = "";
    int rc = sbx_config_parse(opts, (int)SBX_ARRAY_LEN(argv), argv, 2, &rest, why, sizeof(why));
    cr_assert_eq(rc, 0, "parse failed: %s", why);

    cr_expect_str_eq(c.name, "cli", "argv beats the file");
    cr_expect_eq(c.count, 7, "the environment beats the file");
    cr_expect_eq(c.mem, 2ull << 20, "argv beats the file (empty env ignored)");
    cr_expect_eq(c.wait, 2000, "the file beats the default");
    cr_expect(c.flag, "flag = yes");
    cr_expect_eq(c.setup_timeout, 180000, "SBX_SETUP_TIMEOUT for setup-timeout");

    static const char *want_tags[] = {"a", "b", "c", "d", "e"};
    cr_assert_not_null(c.tags);
    size_t n = 0;
    while (c.tags[n])
        n++;
    cr_expect_eq(n, SBX_ARRAY_LEN(want_tags), "%zu tags", n);
    for (size_t i = 0; i < n && i < SBX_ARRAY_LEN(want_tags); i++)
        cr_expect_str_eq(c.tags[i], want_tags[i], "tag %zu", i);

    cr_assert_not_null(rest);
    cr_expect_str_eq(rest[0], "pos1");
    cr_expect_str_eq(rest[1], "--not-an-option", "everything after -- is positional");
    cr_expect_str_eq(rest[2], "pos2");
    cr_expect_null(rest[3]);
    free(rest);
    conf_free(&c);
}

Test(config, flag_forms_and_repeated_lists)
{
    const char *path = write_cfg("b.conf", "name = file\nflag = on\n");
    struct conf c = {0};
    struct sbx_opt opts[] = CONF_OPTS(&c);
    char *argv[] = {"x", "--config", (char *)path, "--tags", "one", "--tags=two", "--flag=false",
                    "--count", "-3", "--wait=500ms", "--name", "n1", "--name", "n2"};
    char **rest = NULL, why[256] = "";
    int rc = sbx_config_parse(opts, (int)SBX_ARRAY_LEN(argv), argv, 1, &rest, why, sizeof(why));
    cr_assert_eq(rc, 0, "parse failed: %s", why);
    cr_expect(!c.flag, "--flag=false overrides the file's on");
    cr_expect_eq(c.count, -3);
    cr_expect_eq(c.wait, 500);
    cr_expect_str_eq(c.name, "n2", "the last flag wins");
    cr_assert_not_null(c.tags);
    cr_expect_str_eq(c.tags[0], "one");
    cr_expect_str_eq(c.tags[1], "two", "repeated list flags append");
    cr_expect_null(c.tags[2]);
    cr_assert_not_null(rest);
    cr_expect_null(rest[0], "no positional arguments (the config path is consumed)");
    free(rest);
    conf_free(&c);

    /* A bare boolean flag means true. */
    char *argv2[] = {"x", "--flag"};
    rc = sbx_config_parse(opts, 2, argv2, 1, &rest, why, sizeof(why));
    cr_assert_eq(rc, 0, "%s", why);
    cr_expect(c.flag);
    free(rest);
    conf_free(&c);
}

/* want: the exact code, or 0 for "any negative code". */
static void
expect_parse_error_rc(struct conf *c, int argc, char **argv, const char *needle, int want)
{
    struct sbx_opt opts[] = CONF_OPTS(c);
    char **rest = (char **)0x1, why[256] = "";
    int rc = sbx_config_parse(opts, argc, argv, 1, &rest, why, sizeof(why));
    if (want)
        cr_expect_eq(rc, want, "'%s': rc %d, want %d", argv[argc - 1], rc, want);
    else
        cr_expect_lt(rc, 0, "'%s' parsed (rc %d)", argv[argc - 1], rc);
    cr_expect(strstr(why, needle) != NULL, "reason '%s' lacks '%s'", why, needle);
    cr_expect_eq(rest, (char **)0x1, "rest written on error");
    conf_free(c);
}

static void
expect_parse_error(struct conf *c, int argc, char **argv, const char *needle)
{
    expect_parse_error_rc(c, argc, argv, needle, -EINVAL);
}

Test(config, errors)
{
    struct conf c = {0};
    char *a1[] = {"x", "--no-such-option"};
    expect_parse_error(&c, 2, a1, "no-such-option");
    char *a2[] = {"x", "--nam=typo"};
    expect_parse_error(&c, 2, a2, "nam");
    char *a3[] = {"x", "--count=abc"};
    expect_parse_error(&c, 2, a3, "count");
    char *a4[] = {"x", "--count", "12x"};
    expect_parse_error(&c, 3, a4, "count");
    char *a5[] = {"x", "--mem=lots"};
    expect_parse_error(&c, 2, a5, "mem");
    char *a6[] = {"x", "--wait=1.5s"};
    expect_parse_error(&c, 2, a6, "wait");
    char *a7[] = {"x", "--flag=maybe"};
    expect_parse_error(&c, 2, a7, "flag");
    char *a8[] = {"x", "--name"};
    expect_parse_error(&c, 2, a8, "needs a value");

    const char *bad1 = write_cfg("unknown.conf", "name = a\nbogus = 1\n");
    char *a9[] = {"x", "--config", (char *)bad1};
    expect_parse_error(&c, 3, a9, ":2: unknown option 'bogus'");
    const char *bad2 = write_cfg("noeq.conf", "# ok\nname\n");
    char *a10[] = {"x", "--config", (char *)bad2};
    expect_parse_error(&c, 3, a10, ":2:");
    const char *bad3 = write_cfg("badval.conf", "count = many\n");
    char *a11[] = {"x", "--config", (char *)bad3};
    expect_parse_error(&c, 3, a11, "count");
    char missing[128];
    snprintf(missing, sizeof(missing), "%s/missing.conf", cfgdir);
    char *a12[] = {"x", "--config", missing};
    /* config.h documents -EINVAL, but an unreadable file gives the read's
     * -errno (-ENOENT); callers only test for non-zero, so require an error. */
    expect_parse_error_rc(&c, 3, a12, "missing.conf", 0);

    setenv("SBX_COUNT", "seven", 1);
    char *a13[] = {"x"};
    expect_parse_error(&c, 1, a13, "count");
}

/* docs/protocol.md §4 lists every code of err.h with the HTTP status the
 * code maps to: the table cannot drift from SBX_ERRCODES unnoticed. */
Test(err, protocol_doc_lists_every_code_with_its_status)
{
    char *doc = NULL;
    size_t n = 0;
    cr_assert_eq(sbx_fs_read("docs/protocol.md", 1 << 22, &doc, &n), 0,
                 "docs/protocol.md (tests run from the repository root)");
    const char *sec = strstr(doc, "## 4. Error codes");
    cr_assert_not_null(sec, "no §4 in docs/protocol.md");
    const char *end = strstr(sec, "\n## 5.");
    size_t seclen = end ? (size_t)(end - sec) : strlen(sec);
    for (int c = SBX_E__FIRST + 1; c < SBX_E__LAST; c++) {
        char row[128];
        snprintf(row, sizeof(row), "| `%s` | %d |", sbx_err_name(c), sbx_err_http(c));
        cr_expect(memmem(sec, seclen, row, strlen(row)) != NULL,
                  "docs/protocol.md §4 has no row \"%s\"", row);
    }
    free(doc);
}

/* sbx_utf8_complete_prefix holds back only an unfinished sequence at the
 * end (what the next read or event will complete), never more than 3 bytes,
 * and leaves invalid bytes for the sanitizer. */
Test(json, utf8_complete_prefix_holds_back_only_an_unfinished_tail)
{
    static const struct {
        const char *s;
        size_t n, want;
    } cases[] = {
        {"abc", 3, 3},
        {"", 0, 0},
        {"a\xc3", 2, 1},             /* é cut after its lead byte */
        {"a\xc3\xa9", 3, 3},         /* é whole */
        {"\xe2\x82", 2, 0},          /* € cut after two of three */
        {"\xe2\x82\xac", 3, 3},      /* € whole */
        {"x\xf0\x9f\x98", 4, 1},     /* 😀 cut after three of four */
        {"x\xf0\x9f\x98\x80", 5, 5}, /* 😀 whole */
        {"a\x80", 2, 2},             /* a stray continuation byte: the sanitizer's */
        {"\xff", 1, 1},              /* not a lead byte: the sanitizer's */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        cr_expect_eq(sbx_utf8_complete_prefix(cases[i].s, cases[i].n), cases[i].want,
                     "case %zu: %zu", i, sbx_utf8_complete_prefix(cases[i].s, cases[i].n));
    /* Any split of a valid text: prefix + carry reassembles it exactly. */
    const char *text = "héllo € 😀 wörld";
    size_t n = strlen(text);
    for (size_t cut = 0; cut <= n; cut++) {
        size_t keep = sbx_utf8_complete_prefix(text, cut);
        cr_expect(keep <= cut && cut - keep <= 3, "cut %zu kept %zu", cut, keep);
        cr_expect_eq(sbx_utf8_valid(text, keep, NULL), keep, "cut %zu: prefix not valid", cut);
    }
}
