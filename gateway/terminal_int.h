/*
 * terminal_int.h — a terminal WebSocket's state and the parsers of client
 * input (terminal.c).  Internal to the HTTP front and its tests
 * (tests/fuzz/fuzz_terminal.c); the front reaches terminals through
 * terminal_access / terminal_completed / terminal_cancel_all (http_int.h).
 */
#ifndef SBX_TERMINAL_INT_H
#define SBX_TERMINAL_INT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <wslay/wslay.h>

#include "../runtime/id.h"
#include "http_int.h"

/* A message waiting for the WebSocket thread (a frame to send).  Owned by
 * the queue of its terminal_state. */
struct terminal_outmsg {
    struct terminal_outmsg *next;
    uint8_t opcode;           /* WSLAY_TEXT_FRAME or WSLAY_BINARY_FRAME */
    size_t len;               /* bytes of data */
    char data[];
};

/* One terminal connection.  Reference-counted (refs; under mu): the MHD
 * connection, the WebSocket thread and the reader thread each hold one;
 * the last drop frees it.  Listed in h->terminals (under h->mu). */
struct terminal_state {
    int kind; /* HS_TERMINAL */
    struct sbx_http *h;       /* borrowed: the front outlives its terminals */
    struct MHD_Connection *c; /* borrowed, until the upgrade */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int refs;                 /* connection, WebSocket thread, reader thread */
    bool suspended, cancelled, queued;
    char sandbox[SBX_ID_MAX + 2];
    char key[SBX_HTTP_KEY_MAX + 1]; /* the caller's API key, for its calls ("" keyless) */
    char session[128];        /* decoded; 1-127 bytes */
    char shell[128];          /* decoded; 0-127 bytes ("": the sandbox's default) */
    int cols, rows;           /* 1-1000 */
    char accept[64];          /* Sec-WebSocket-Accept */
    /* set by the opener */
    bool opened;
    int err_status;
    char err_code[64], err_msg[256];
    char stream_id[160];
    /* after the upgrade */
    bool upgraded;
    int sock;                 /* the upgraded socket, or -1; owned */
    int64_t rx_ms;            /* sbx_mono_ms of the last sign of the client's end: bytes
                               * from it, or bytes of ours its TCP acknowledged (a viewer
                               * reading a flood slowly may answer a ping late); WebSocket
                               * thread only */
    struct MHD_UpgradeResponseHandle *urh;
    int evfd;                 /* the reader's wake-up eventfd, or -1; owned */
    struct terminal_outmsg *q_head, *q_tail; /* owned; under mu */
    size_t q_bytes;           /* payload bytes in q_head… (back-pressure) */
    bool reader_done;
    bool stop;
    struct terminal_state *next; /* h->terminals */
};

/*
 * terminal_args — the query arguments as sent (the front's unescaper is the
 * identity; NULL: absent) into t: session ("default"), shell (""), cols
 * (80) and rows (24).  0, or -1 with why[whylen] naming the argument: a
 * session or shell that does not decode or fit is refused, not cut (a cut
 * name is another session, a cut path another program).  Borrows all.
 */
int terminal_args(struct terminal_state *t, const char *session, const char *shell,
                  const char *cols, const char *rows, char *why, size_t whylen);

/*
 * terminal_ws_msg — wslay's on_msg_recv callback (ud: the terminal_state),
 * on the WebSocket thread: a binary frame is keystrokes (one
 * terminal.write of its bytes), a text frame a JSON control message
 * ({"type":"resize","cols":N,"rows":N}: one terminal.resize, cols and rows
 * 1-1000); a malformed control message or a failed call queues one
 * {"type":"error","message":…} text frame on ctx.  Other opcodes are
 * ignored.  Borrows arg's bytes.
 */
void terminal_ws_msg(wslay_event_context_ptr ctx, const struct wslay_event_on_msg_recv_arg *arg,
                     void *ud);

#endif
