/*
 * fuzz.h — what the libFuzzer targets in tests/fuzz/ share.
 *
 * Each target is one file with LLVMFuzzerTestOneInput; it feeds a parser
 * of outside input with the fuzzer's bytes and checks properties that must
 * hold for every input (a round trip, agreement between the pre-scan and
 * the decoder, no accepted value outside the documented range).  A property
 * that fails is reported with FUZZ_CHECK, which prints the reason and
 * aborts, so libFuzzer saves the input like any crash.
 *
 * Build and run: `make fuzz` (FUZZ_SECONDS per target), `make fuzz-smoke`
 * (the short run of `make test`); inputs that once failed are kept in
 * tests/fuzz/corpus/<target>/ as regression seeds.
 */
#ifndef SBX_FUZZ_H
#define SBX_FUZZ_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define FUZZ_CHECK(cond, ...)                                                                 \
    do {                                                                                      \
        if (!(cond)) {                                                                        \
            fprintf(stderr, "%s:%d: property failed: %s: ", __FILE__, __LINE__, #cond);       \
            fprintf(stderr, __VA_ARGS__);                                                     \
            fputc('\n', stderr);                                                              \
            abort();                                                                          \
        }                                                                                     \
    } while (0)

/* A heap copy of exactly n bytes (ASan sees any read past the end; libFuzzer's
 * own buffer is exact too, but the targets cut it into pieces). */
static inline char *
fuzz_copy(const void *p, size_t n)
{
    char *q = malloc(n ? n : 1);
    if (!q)
        abort();
    if (n)
        memcpy(q, p, n);
    return q;
}

/* The reference percent-decoder (RFC 3986 §2.1) the HTTP-facing targets
 * compare the gateway's decoders with: s[0..n) into out (n + 1 bytes),
 * '+' as a space when `plus` (query strings); false on a malformed escape or
 * an escaped NUL. */
static inline int
fuzz_hexv(unsigned char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

static inline bool
fuzz_ref_pct_decode(const char *s, size_t n, bool plus, char *out)
{
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] == '%') {
            int hi = i + 1 < n ? fuzz_hexv((unsigned char)s[i + 1]) : -1;
            int lo = i + 2 < n ? fuzz_hexv((unsigned char)s[i + 2]) : -1;
            if (hi < 0 || lo < 0 || (hi | lo) == 0)
                return false;
            out[w++] = (char)(hi * 16 + lo);
            i += 2;
        } else {
            out[w++] = plus && s[i] == '+' ? ' ' : s[i];
        }
    }
    out[w] = 0;
    return true;
}

/* A NUL-terminated heap copy. */
static inline char *
fuzz_cstr(const void *p, size_t n)
{
    char *q = malloc(n + 1);
    if (!q)
        abort();
    if (n)
        memcpy(q, p, n);
    q[n] = '\0';
    return q;
}

/* Split data at the first occurrence of the separator byte sequence; returns
 * the length of the first part (all of it if absent). */
static inline size_t
fuzz_split(const uint8_t *data, size_t size, const char *sep)
{
    size_t k = strlen(sep);
    for (size_t i = 0; i + k <= size; i++)
        if (!memcmp(data + i, sep, k))
            return i;
    return size;
}

#endif
