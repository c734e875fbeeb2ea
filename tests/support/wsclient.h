/*
 * wsclient.h — a minimal WebSocket client (RFC 6455) for the tests of the
 * terminal and of WebSocket pass-through on preview URLs: blocking socket,
 * masked client frames, fragmented messages reassembled, pings answered.
 */
#ifndef SBX_TEST_WSCLIENT_H
#define SBX_TEST_WSCLIENT_H

#include <stdbool.h>
#include <stddef.h>

enum { WS_CONT = 0, WS_TEXT = 1, WS_BINARY = 2, WS_CLOSE = 8, WS_PING = 9, WS_PONG = 10 };

typedef struct wsc {
    int fd;
    int status;          /* the handshake answer's status */
    char *head;          /* its head, "Name: value\r\n" lines */
    char *body;          /* the body of a refused handshake (what arrived with the head) */
    char key[32];        /* our Sec-WebSocket-Key */
    char *rbuf;          /* bytes read past what was consumed */
    size_t rlen, rcap;
    int close_code;      /* from the peer's close frame, -1 before */
} wsc;

/* wsc_connect — TCP to 127.0.0.1:port, send the upgrade for `path` with
 * Host: `host` (plus extra "Name: value" headers, NULL-terminated), read the
 * answer's head.  Returns the status (101 when upgraded; then
 * wsc_accept_ok says whether Sec-WebSocket-Accept is right), or -1 when no
 * answer came (err filled).  Free with wsc_close either way. */
int wsc_connect(wsc *w, int port, const char *host, const char *path, const char *const *extra,
                int timeout_ms, char *err, size_t errlen);
/* The value of a header of the handshake answer (heap) or NULL. */
char *wsc_header(const wsc *w, const char *name);
/* Whether the answer's Sec-WebSocket-Accept = base64(SHA-1(key + GUID)). */
bool wsc_accept_ok(const wsc *w);
/* The accept value for a key (RFC 6455 §4.2.2), into out[32]. */
void ws_accept_for(const char *key, char out[32]);

/* Send one message (a single frame, masked). 0 or -1. */
int wsc_send(wsc *w, int opcode, const void *p, size_t n);
/* Receive one message (control frames other than close are handled: pings
 * answered, pongs ignored).  *data is heap, NUL-terminated.  Returns the
 * opcode (WS_TEXT, WS_BINARY, WS_CLOSE), -1 on timeout, -2 when the
 * connection ended or broke without a close frame. */
int wsc_recv(wsc *w, char **data, size_t *len, int timeout_ms);
/* Send a close frame (code 1000) without waiting. */
void wsc_send_close(wsc *w);
void wsc_close(wsc *w);

#endif
