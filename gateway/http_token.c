/*
 * http_token.c — short-lived URL tokens (issue 16; docs/http.md,
 * "Tokens in URLs").  A browser cannot put an Authorization header on a
 * WebSocket or an EventSource, and an API key in a URL ends up in logs,
 * history and Referer headers.  So a key travels only in the header: a
 * holder of one mints, for one purpose on one sandbox,
 *
 *     POST /v1/sandboxes/{sandbox}/url-token?purpose=terminal|stream|file
 *
 * a token "ut1.<expiresAt>.<mac>" (expiresAt: ms since the epoch, now +
 * HTTP_URL_TOKEN_TTL_MS; mac: hex HMAC-SHA256 under h->url_key of
 * "ut1" NUL purpose NUL sandbox NUL expiresAt), which `?access_token=`
 * carries on that sandbox's route of that purpose until it expires, and on
 * no other: R_TERMINAL (terminal), R_STREAM (stream: SSE), R_FILE_GET (file:
 * a download link).
 *
 * The key: HMAC-SHA256(relay secret, "sbx url tokens v1") when the
 * deployment has a relay secret (every gateway of a cluster has the same
 * one, so a token minted at one gateway is good at all of them), else 32
 * random bytes drawn at start (one gateway: `sbxd dev`).  Set once before
 * MHD starts, read-only afterwards.
 */
#include <nettle/hmac.h>
#include <nettle/memops.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/util.h"
#include "http_int.h"

#define TOKEN_PREFIX "ut1"

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

/* mac_hex — the token's MAC for (purpose, sandbox, expires) into out[65]. */
static void
mac_hex(const struct sbx_http *h, const char *purpose, const char *sandbox, long long expires,
        char out[65])
{
    char msg[256];
    int n = snprintf(msg, sizeof(msg), TOKEN_PREFIX "%c%s%c%s%c%lld", 0, purpose, 0, sandbox, 0,
                     expires);
    uint8_t d[SHA256_DIGEST_SIZE];
    struct hmac_sha256_ctx ctx;
    hmac_sha256_set_key(&ctx, sizeof(h->url_key), h->url_key);
    hmac_sha256_update(&ctx, n > 0 && (size_t)n < sizeof(msg) ? (size_t)n : 0,
                       (const uint8_t *)msg);
    hmac_sha256_digest(&ctx, sizeof(d), d);
    for (size_t i = 0; i < sizeof(d); i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

json_t *
http_url_token_mint(const struct sbx_http *h, const char *sandbox, const char *purpose)
{
    if (!purpose || (strcmp(purpose, "terminal") && strcmp(purpose, "stream") &&
                     strcmp(purpose, "file")))
        return NULL;
    long long expires = (long long)(sbx_wall_ms() + HTTP_URL_TOKEN_TTL_MS);
    char mac[65], token[128];
    mac_hex(h, purpose, sandbox, expires, mac);
    snprintf(token, sizeof(token), TOKEN_PREFIX ".%lld.%s", expires, mac);
    return json_pack("{s:s,s:s,s:s,s:I,s:I}", "token", token, "purpose", purpose, "sandbox",
                     sandbox, "expiresAt", (json_int_t)expires, "ttlMs",
                     (json_int_t)HTTP_URL_TOKEN_TTL_MS);
}

bool
http_url_token_ok(const struct sbx_http *h, struct MHD_Connection *c, int route_kind,
                  const char *sandbox)
{
    const char *purpose = http_url_purpose(route_kind);
    const char *t = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "access_token");
    if (!purpose || !sandbox || !*sandbox || !t || strncmp(t, TOKEN_PREFIX ".", 4) != 0)
        return false;
    char *end = NULL;
    long long expires = strtoll(t + 4, &end, 10);
    if (end == t + 4 || *end != '.' || strlen(end + 1) != 64)
        return false;
    if (expires < sbx_wall_ms()) /* (a later one than minted would need the key) */
        return false;
    char mac[65];
    mac_hex(h, purpose, sandbox, expires, mac);
    return memeql_sec(mac, end + 1, 64) != 0;
}
