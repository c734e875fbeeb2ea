/*
 * relay.h — byte relays between the gateway and a port inside a sandbox.
 *
 * A preview URL's request reaches the sandbox in two hops: the gateway's HTTP
 * front connects to the preview relay of the shard that hosts the sandbox
 * (actors/relay.c), and the shard connects to 127.0.0.1:<port> inside the
 * sandbox's network namespace and relays bytes both ways.
 *
 * The relay speaks SOCKS5 (RFC 1928), so the gateway's HTTP client (libcurl)
 * uses it as an ordinary proxy: the CONNECT request's destination is the
 * domain name "<generation>.<sandbox>" and the port, the generation being
 * the container's the URL was issued for (a relay never reaches a newer
 * container through an old URL).  Username/password authentication (RFC
 * 1929) carries the relay secret of a cluster: user "sbx", password the
 * secret.  Reply codes: 0 connected, 2 not allowed (secret), 4 host
 * unreachable (the container is not that generation: the URL is stale),
 * 5 connection refused (nothing listens on the port), 1 other failures.
 *
 * A relay address is "unix:/path" (one host: the socket file is root-only)
 * or "tcp:host:port" (a cluster: the secret must match; compared in
 * constant time).
 */
#ifndef SBX_RELAY_H
#define SBX_RELAY_H

#include <stddef.h>
#include <stdint.h>


/*
 * sbx_relay_connect — connect to the relay at addr and ask for port of
 * sandbox at generation (the SOCKS5 exchange above).  Returns the connected
 * fd (blocking, CLOEXEC) whose next bytes are the upstream's, or a negative
 * code with its wire name in code[64] and a sentence in msg[msglen]:
 * STALE_PREVIEW_URL, SERVICE_NOT_RESPONDING (nothing listens),
 * SHARD_UNAVAILABLE.  timeout_ms bounds the connect and the handshake.
 */
int sbx_relay_connect(const char *addr, const char *secret, const char *sandbox, int port,
                      uint64_t generation, int timeout_ms, char code[64], char *msg,
                      size_t msglen);

/* sbx_relay_proxy_url — the relay as a libcurl CURLOPT_PROXY value
 * ("socks5h://localhost/path" or "socks5h://host:port") into out[outlen]. */
void sbx_relay_proxy_url(const char *addr, char *out, size_t outlen);

/* SOCKS5 reply codes the relay uses (RFC 1928 §6). */
enum {
    SBX_SOCKS_OK = 0,
    SBX_SOCKS_FAIL = 1,
    SBX_SOCKS_NOT_ALLOWED = 2,
    SBX_SOCKS_HOST_UNREACHABLE = 4,
    SBX_SOCKS_REFUSED = 5,
};

/*
 * sbx_relay_listen — a listening socket for addr ("unix:/path" — an old
 * socket file is replaced, mode 0600 — or "tcp:host:port"); the fd, or a
 * negative errno.
 */
int sbx_relay_listen(const char *addr);

/*
 * sbx_relay_pump — copy bytes both ways between a and b until both
 * directions have ended (EOF is passed on as shutdown(SHUT_WR)), an error,
 * or idle_ms without traffic (0: no idle limit).  `pre` (npre bytes, may be
 * 0) is written to b first: bytes already read from a.  Blocks the calling
 * thread, never in a write: a side that stops reading stalls its direction
 * only, and idle_ms still ends the pump (-ETIMEDOUT).  Closes neither fd.
 * Returns 0 or a negative errno.
 */
int sbx_relay_pump(int a, int b, const char *pre, size_t npre, int64_t idle_ms);

#endif
