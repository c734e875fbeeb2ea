/*
 * http_auth.c — who may call the HTTP front: bearer API keys (loaded once at
 * start into h->keys, owned by h, read-only afterwards) and, with no keys,
 * the browser guard (loopback Host and Origin only).  Everything here but
 * http_load_keys runs on MHD's threads, per request, and reads only headers
 * and h->keys.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>

#include "../runtime/util.h"
#include "http_int.h"
#include "keyfile.h"

bool
http_is_loopback(const struct sockaddr_storage *ss)
{
    if (ss->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)ss)->sin_addr.s_addr) >> 24) == 127;
    if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        return IN6_IS_ADDR_LOOPBACK(a) ||
               (IN6_IS_ADDR_V4MAPPED(a) && a->s6_addr[12] == 127);
    }
    return false;
}

/* Constant-time comparison of a presented key with each configured key. */
bool
http_key_ok(struct sbx_http *h, const char *presented)
{
    if (!h->keys)
        return true;
    if (!presented)
        return false;
    size_t pn = strlen(presented);
    bool ok = false;
    for (char **k = h->keys; *k; k++) {
        size_t kn = strlen(*k);
        unsigned char diff = (unsigned char)(kn != pn);
        for (size_t i = 0; i < kn; i++)
            diff |= (unsigned char)((*k)[i] ^ (i < pn ? presented[i] : 0));
        ok |= diff == 0;
    }
    return ok;
}

/*
 * Whether host[0..n) (a Host header's name, or an Origin's host, without
 * the port) names this machine's loopback: "localhost", an IPv4 address in
 * 127.0.0.0/8, or "[::1]".  A subdomain of localhost is not: preview URLs
 * live there, and their pages are tenant content.
 */
static bool
loopback_name(const char *host, size_t n)
{
    if (n == 9 && !strncasecmp(host, "localhost", 9))
        return true;
    if (n == 5 && !strncmp(host, "[::1]", 5))
        return true;
    char buf[16];
    if (n < 9 || n >= sizeof(buf))
        return false;
    memcpy(buf, host, n);
    buf[n] = '\0';
    struct in_addr a;
    return inet_pton(AF_INET, buf, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* The name part of "name[:port]" ("[v6]:port" keeps its brackets). */
static size_t
host_name_len(const char *hp)
{
    if (hp[0] == '[') {
        const char *e = strchr(hp, ']');
        return e ? (size_t)(e - hp) + 1 : strlen(hp);
    }
    const char *colon = strchr(hp, ':');
    return colon ? (size_t)(colon - hp) : strlen(hp);
}

/*
 * http_browser_guard — without API keys the front trusts whoever reaches its
 * loopback socket, and a browser on this machine reaches it for any page it
 * shows.  So, keyless only: a request whose Host is not a loopback name is
 * refused (DNS rebinding: a page of evil.example re-resolved to 127.0.0.1
 * still sends Host: evil.example), and so is one whose Origin is not a
 * loopback origin (a cross-site form or fetch; a preview page on
 * *.localhost is tenant code and counts as cross-site).  Clients that are
 * not browsers send no Origin.  And a mutating request (any method but GET,
 * HEAD, OPTIONS) must carry a non-empty X-Sbx-Client header: a custom header
 * makes a browser send a CORS pre-flight first (WHATWG Fetch, "CORS-safelisted
 * request-header"), which the keyless front never approves, so no page of
 * another origin — another loopback port included, whose Origin the check
 * above accepts — can send such a request; the SDKs send it (docs/http.md).
 * Returns NULL, or why the request is refused (a static string).
 */
const char *
http_browser_guard(struct sbx_http *h, struct MHD_Connection *c, const char *method)
{
    if (h->keys)
        return NULL;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Host");
    if (host && !loopback_name(host, host_name_len(host)))
        return "without API keys the HTTP front answers only requests addressed to a loopback "
               "name (localhost, 127.0.0.1, [::1]); configure --api-keys to serve others";
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Origin");
    if (origin) {
        const char *hp = !strncmp(origin, "http://", 7)    ? origin + 7
                         : !strncmp(origin, "https://", 8) ? origin + 8
                                                           : NULL;
        if (!hp || !loopback_name(hp, host_name_len(hp)))
            return "without API keys the HTTP front refuses cross-origin requests from "
                   "browsers; configure --api-keys to call it from a web page";
    }
    if (strcmp(method, "GET") && strcmp(method, "HEAD") && strcmp(method, "OPTIONS")) {
        const char *client = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-Sbx-Client");
        if (!client || !*client)
            return "without API keys the HTTP front needs an X-Sbx-Client header (any "
                   "non-empty value, e.g. X-Sbx-Client: curl) on every request but GET and "
                   "HEAD, so that a web page cannot send one; the SDKs send it";
    }
    return NULL;
}

/*
 * With API keys, a request must present one; which keys are valid — the key
 * file's admin keys and the tenants' keys — is the gateway's to decide (it
 * gets the key in the envelope and answers UNAUTHORIZED, 401 here, for any
 * other: gateway/tenant.h), since the tenants' keys live in its registry.
 */
bool
http_authorized(struct sbx_http *h, struct MHD_Connection *c)
{
    if (!h->keys)
        return true;
    char key[SBX_HTTP_KEY_MAX + 1];
    http_presented_key(c, key);
    return key[0] != '\0';
}

void
http_presented_key(struct MHD_Connection *c, char *out)
{
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
    out[0] = '\0';
    /* Keys travel in the header only; a URL carries a short-lived token
     * (http_token.c), checked by http_request_key, which knows the route. */
    if (auth && !strncasecmp(auth, "Bearer ", 7) && strlen(auth + 7) <= SBX_HTTP_KEY_MAX)
        snprintf(out, SBX_HTTP_KEY_MAX + 1, "%s", auth + 7);
}

bool
http_request_key(const struct sbx_http *h, struct MHD_Connection *c, int route_kind,
                 const char *sandbox, char *out)
{
    http_presented_key(c, out);
    return out[0] || http_url_token_ok(h, c, route_kind, sandbox, out);
}

int
http_load_keys(struct sbx_http *h, const char *path, sbx_err_t *err)
{
    return sbx_keyfile_load(path, &h->keys, err);
}
