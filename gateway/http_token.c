/*
 * http_token.c — short-lived URL tokens (issue 16; docs/http.md,
 * "Tokens in URLs").  A browser cannot put an Authorization header on a
 * WebSocket or an EventSource, and an API key in a URL ends up in logs,
 * history and Referer headers.  So a key travels in the clear only in the
 * header: a holder of one mints, for one purpose on one sandbox,
 *
 *     POST /v1/sandboxes/{sandbox}/url-token?purpose=terminal|stream|file[&ttlMs=N]
 *
 * a token "ut2.<expiresAt>.<nonce>.<sealed>" (expiresAt: ms since the
 * epoch, now + ttlMs, HTTP_URL_TOKEN_TTL_MS unless asked shorter; nonce: 12 random bytes, hex; sealed:
 * hex of the caller's API key encrypted with AES-256-GCM under h->url_key
 * and that nonce, then GCM's 16-byte tag, with "ut2" NUL purpose NUL
 * sandbox NUL expiresAt as associated data — NIST SP 800-38D), which
 * `?access_token=` carries on that sandbox's route of that purpose until it
 * expires, and on no other: R_TERMINAL (terminal), R_STREAM (stream: SSE),
 * R_FILE_GET (file: a download link).  A request that shows a good token
 * acts with the key sealed in it, which the gateway checks as if it came in
 * the header (docs/security.md §6: a revoked key's tokens die with it, and
 * a tenant's token opens only that tenant's sandbox of that name).  The
 * token says nothing about the key to whoever reads the URL.
 *
 * The key: HMAC-SHA256(relay secret, "sbx url tokens v1") when the
 * deployment has a relay secret (every gateway of a cluster has the same
 * one, so a token minted at one gateway is good at all of them), else 32
 * random bytes drawn at start (one gateway: `sbxd dev`).  Set once before
 * MHD starts, read-only afterwards.  Random 96-bit nonces keep GCM safe for
 * well over 2^32 tokens per key (SP 800-38D §8.3).
 */
#include <nettle/gcm.h>
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/util.h"
#include "http_int.h"

#define TOKEN_PREFIX "ut2"
#define NONCE_SIZE GCM_IV_SIZE /* 12 bytes */

void
http_url_key_init(struct sbx_http *h)
{
    static const char label[] = "sbx url tokens v1";
    if (h->relay_secret && *h->relay_secret) {
        struct hmac_sha256_ctx ctx;
        hmac_sha256_set_key(&ctx, strlen(h->relay_secret), (const uint8_t *)h->relay_secret);
        hmac_sha256_update(&ctx, sizeof(label) - 1, (const uint8_t *)label);
        hmac_sha256_digest(&ctx, sizeof(h->url_key), h->url_key);
        return;
    }
    if (sbx_random(h->url_key, sizeof(h->url_key)) != 0)
        abort(); /* getrandom(2) cannot fail for 32 bytes after boot */
}

const char *
http_url_purpose(int route_kind)
{
    switch (route_kind) {
    case R_TERMINAL: return "terminal";
    case R_STREAM: return "stream";
    case R_FILE_GET: return "file";
    default: return NULL;
    }
}

/* The associated data of a token: what it is for, bound by GCM's tag. */
static size_t
token_aad(const char *purpose, const char *sandbox, long long expires, char out[256])
{
    int n = snprintf(out, 256, TOKEN_PREFIX "%c%s%c%s%c%lld", 0, purpose, 0, sandbox, 0, expires);
    return n > 0 && n < 256 ? (size_t)n : 0;
}

static void
hex(const uint8_t *p, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", p[i]);
}

/* Decode 2n hex digits of s into p[n]; false if s is not exactly that. */
static bool
unhex(const char *s, size_t slen, uint8_t *p, size_t n)
{
    if (slen != 2 * n)
        return false;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1 || !isxdigit((unsigned char)s[2 * i]) ||
            !isxdigit((unsigned char)s[2 * i + 1]))
            return false;
        p[i] = (uint8_t)v;
    }
    return true;
}

json_t *
http_url_token_mint(const struct sbx_http *h, const char *sandbox, const char *purpose,
                    const char *key, int64_t ttl_ms)
{
    if (!purpose || (strcmp(purpose, "terminal") && strcmp(purpose, "stream") &&
                     strcmp(purpose, "file")))
        return NULL;
    size_t kn = strlen(key);
    if (kn > SBX_HTTP_KEY_MAX || ttl_ms < HTTP_URL_TOKEN_MIN_TTL_MS ||
        ttl_ms > HTTP_URL_TOKEN_TTL_MS)
        return NULL;
    long long expires = (long long)(sbx_wall_ms() + ttl_ms);
    uint8_t nonce[NONCE_SIZE], sealed[SBX_HTTP_KEY_MAX + GCM_DIGEST_SIZE];
    if (sbx_random(nonce, sizeof(nonce)) != 0)
        abort(); /* getrandom(2) cannot fail for 12 bytes after boot */
    char aad[256];
    struct gcm_aes256_ctx ctx;
    gcm_aes256_set_key(&ctx, h->url_key);
    gcm_aes256_set_iv(&ctx, sizeof(nonce), nonce);
    gcm_aes256_update(&ctx, token_aad(purpose, sandbox, expires, aad), (const uint8_t *)aad);
    gcm_aes256_encrypt(&ctx, kn, sealed, (const uint8_t *)key);
    gcm_aes256_digest(&ctx, GCM_DIGEST_SIZE, sealed + kn);
    char token[32 + 2 * NONCE_SIZE + 2 * sizeof(sealed)];
    int n = snprintf(token, sizeof(token), TOKEN_PREFIX ".%lld.", expires);
    hex(nonce, sizeof(nonce), token + n);
    n += 2 * NONCE_SIZE;
    token[n++] = '.';
    hex(sealed, kn + GCM_DIGEST_SIZE, token + n);
    return json_pack("{s:s,s:s,s:s,s:I,s:I}", "token", token, "purpose", purpose, "sandbox",
                     sandbox, "expiresAt", (json_int_t)expires, "ttlMs",
                     (json_int_t)ttl_ms);
}

bool
http_url_token_ok(const struct sbx_http *h, struct MHD_Connection *c, int route_kind,
                  const char *sandbox, char key_out[SBX_HTTP_KEY_MAX + 1])
{
    key_out[0] = '\0';
    const char *purpose = http_url_purpose(route_kind);
    const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token");
    if (!purpose || !sandbox || !*sandbox || !t || strncmp(t, TOKEN_PREFIX ".", 4) != 0)
        return false;
    char *end = NULL;
    long long expires = strtoll(t + 4, &end, 10);
    if (end == t + 4 || *end != '.')
        return false;
    if (expires < sbx_wall_ms()) /* (a later one than minted would fail the tag) */
        return false;
    const char *ns = end + 1, *dot = strchr(ns, '.');
    uint8_t nonce[NONCE_SIZE], sealed[SBX_HTTP_KEY_MAX + GCM_DIGEST_SIZE];
    size_t sl = dot ? strlen(dot + 1) : 0;
    if (!dot || !unhex(ns, (size_t)(dot - ns), nonce, sizeof(nonce)) || sl % 2 ||
        sl / 2 < GCM_DIGEST_SIZE || sl / 2 > sizeof(sealed) ||
        !unhex(dot + 1, sl, sealed, sl / 2))
        return false;
    size_t kn = sl / 2 - GCM_DIGEST_SIZE;
    char aad[256], plain[SBX_HTTP_KEY_MAX + 1];
    uint8_t tag[GCM_DIGEST_SIZE];
    struct gcm_aes256_ctx ctx;
    gcm_aes256_set_key(&ctx, h->url_key);
    gcm_aes256_set_iv(&ctx, sizeof(nonce), nonce);
    gcm_aes256_update(&ctx, token_aad(purpose, sandbox, expires, aad), (const uint8_t *)aad);
    gcm_aes256_decrypt(&ctx, kn, (uint8_t *)plain, sealed);
    gcm_aes256_digest(&ctx, sizeof(tag), tag);
    if (!memeql_sec(tag, sealed + kn, sizeof(tag)))
        return false;
    plain[kn] = '\0';
    if (strlen(plain) != kn) /* a key holds no NUL */
        return false;
    memcpy(key_out, plain, kn + 1);
    return true;
}
