/*
 * fuzz_terminal.c — the terminal WebSocket's parsers of client input
 * (gateway/terminal.c, linked; reached through gateway/terminal_int.h):
 *
 *  - terminal_args: the upgrade request's query arguments (session or
 *    sessionId, shell, cols, rows; percent-encoded as sent);
 *  - terminal_ws_msg: a message as wslay delivers it: binary frames are keystrokes
 *    (terminal.write), text frames JSON control messages ({"type":"resize",
 *    "cols":N,"rows":N}).
 *
 * The calls to the sandbox are caught: http_call_sync is wrapped at link
 * time (-Wl,--wrap, see the Makefile) by a fake here that records the
 * operation and its arguments and answers success or an error whose
 * message holds input bytes (a message from a reply may be anything, cut
 * anywhere).  Errors go back on the WebSocket through a
 * real wslay server context (never sent).
 *
 * Input: byte 0 picks the parser; then "key=value" lines, or byte 1 (the
 * frame's opcode, whether the call fails) and the message.
 *
 * Properties:
 *  - terminal_args accepts exactly: a session (or "default") and a shell
 *    that decode strictly and fit (1-127 and 0-127 bytes), cols and rows
 *    of 1-1000 in decimal digits or absent (80 × 24); what it keeps is the
 *    decoded text, never a cut or half-decoded one;
 *  - a binary message is one terminal.write of exactly its bytes for the
 *    terminal's session; a text message is one terminal.resize with the
 *    session, cols and rows when it is a JSON object of type "resize" with
 *    integer cols and rows of 1-1000, and otherwise no call and one error
 *    message queued; a failed call queues one error message (whatever the
 *    error text holds); other opcodes do nothing.
 */
#include <jansson.h>
#include <msgpack.h>
#include <stdio.h>
#include <string.h>

#include "../../gateway/terminal_int.h"
#include "../../runtime/err.h"
#include "../../runtime/wire.h"

#include "fuzz.h"

/* ------------------------------------------------------------------------------ */
/* The faked call. */

static struct {
    int n;               /* calls made */
    char op[64];
    char sandbox[80];
    sbx_buf args;        /* the last call's arguments (msgpack map) */
    bool fail;           /* answer with an error */
    const char *errmsg;  /* its message: input bytes */
    size_t errlen;
} C;

/* terminal.o's calls to http_call_sync come here (-Wl,--wrap=http_call_sync). */
int __wrap_http_call_sync(struct sbx_http *h, const char *key, const char *op, const char *sandbox,
                          const char *args, size_t args_len, int64_t timeout_ms,
                          struct hreply *reply, char code[64], char *msg, size_t msglen);

int
__wrap_http_call_sync(struct sbx_http *h, const char *key, const char *op, const char *sandbox,
                      const char *args, size_t args_len, int64_t timeout_ms, struct hreply *reply, char code[64],
                      char *msg, size_t msglen)
{
    (void)h;
    (void)key;
    (void)timeout_ms;
    C.n++;
    snprintf(C.op, sizeof(C.op), "%s", op);
    snprintf(C.sandbox, sizeof(C.sandbox), "%s", sandbox);
    C.args.len = 0;
    sbx_buf_append(&C.args, args, args_len);
    memset(reply, 0, sizeof(*reply));
    if (!C.fail)
        return 0;
    /* As http_call_sync copies a reply's error: "%.*s" into the buffers. */
    snprintf(code, 64, "%.*s", (int)SBX_MIN(C.errlen, 63), C.errmsg);
    snprintf(msg, msglen, "%.*s", (int)C.errlen, C.errmsg);
    return SBX_E_INTERNAL;
}

/* ------------------------------------------------------------------------------ */
/* Query arguments. */


/* Strict query decoding ('+' is a space); NULL when malformed or NUL. */
static char *
ref_decode(const char *s)
{
    char *out = sbx_xmalloc(strlen(s) + 1);
    if (!fuzz_ref_pct_decode(s, strlen(s), true, out)) {
        free(out);
        return NULL;
    }
    return out;
}

static int
ref_dim(const char *v, int dflt)
{
    if (!v)
        return dflt;
    size_t n = strlen(v);
    if (!n || strspn(v, "0123456789") != n)
        return -1;
    v += strspn(v, "0"); /* leading zeros are decimal too */
    if (strlen(v) > 4)
        return -1;
    int d = atoi(v);
    return d >= 1 && d <= 1000 ? d : -1;
}

static void
fuzz_args(char *text)
{
    /* MHD_lookup_connection_value: the first occurrence of a key. */
    const char *v[5] = {NULL, NULL, NULL, NULL, NULL};
    static const char *const keys[] = {"session", "sessionId", "shell", "cols", "rows"};
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        if (!eq)
            continue;
        *eq = 0;
        for (int k = 0; k < 5; k++)
            if (!v[k] && !strcmp(line, keys[k]))
                v[k] = eq + 1;
    }
    const char *session = v[0] ? v[0] : v[1];
    struct terminal_state *t = sbx_xcalloc(1, sizeof(*t));
    char why[160] = "";
    int rc = terminal_args(t, session, v[2], v[3], v[4], why, sizeof(why));

    char *s = ref_decode(session ? session : "default"), *sh = ref_decode(v[2] ? v[2] : "");
    int cols = ref_dim(v[3], 80), rows = ref_dim(v[4], 24);
    bool want = s && sh && *s && strlen(s) < sizeof(t->session) && strlen(sh) < sizeof(t->shell) &&
                cols > 0 && rows > 0;
    FUZZ_CHECK((rc == 0) == want, "terminal_args %s (%s)", rc ? "refused" : "accepted", why);
    if (want) {
        FUZZ_CHECK(!strcmp(t->session, s), "session '%s', want '%s'", t->session, s);
        FUZZ_CHECK(!strcmp(t->shell, sh), "shell '%s', want '%s'", t->shell, sh);
        FUZZ_CHECK(t->cols == cols && t->rows == rows, "%d×%d, want %d×%d", t->cols, t->rows,
                   cols, rows);
    } else {
        FUZZ_CHECK(why[0], "refused without a reason");
    }
    free(s);
    free(sh);
    free(t);
}

/* ------------------------------------------------------------------------------ */
/* Messages. */

static ssize_t
no_io(wslay_event_context_ptr ctx, uint8_t *buf, size_t len, int flags, void *ud)
{
    (void)buf;
    (void)len;
    (void)flags;
    (void)ud;
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
}

static ssize_t
no_send(wslay_event_context_ptr ctx, const uint8_t *data, size_t len, int flags, void *ud)
{
    (void)data;
    (void)len;
    (void)flags;
    (void)ud;
    wslay_event_set_error(ctx, WSLAY_ERR_WOULDBLOCK);
    return -1;
}

static void
fuzz_msg(uint8_t how, const uint8_t *p, size_t n)
{
    static const uint8_t ops[] = {WSLAY_TEXT_FRAME, WSLAY_BINARY_FRAME, WSLAY_PING,
                                  WSLAY_CONNECTION_CLOSE};
    struct terminal_state *t = sbx_xcalloc(1, sizeof(*t));
    snprintf(t->sandbox, sizeof(t->sandbox), "user-42");
    snprintf(t->session, sizeof(t->session), "s-1");
    t->sock = t->evfd = -1;
    struct wslay_event_callbacks cb = {no_io, no_send, NULL, NULL, NULL, NULL, terminal_ws_msg};
    wslay_event_context_ptr ctx;
    if (wslay_event_context_server_init(&ctx, &cb, t) != 0)
        abort();
    C.n = 0;
    C.fail = how & 4;
    C.errmsg = (const char *)p;
    C.errlen = n;
    struct wslay_event_on_msg_recv_arg arg = {0, ops[how % 4], p, n, 0};
    terminal_ws_msg(ctx, &arg, t);
    size_t queued = wslay_event_get_queued_msg_count(ctx);

    /* What should have happened. */
    const char *want_op = NULL;
    json_int_t cols = 0, rows = 0;
    if (arg.opcode == WSLAY_BINARY_FRAME) {
        want_op = "terminal.write";
    } else if (arg.opcode == WSLAY_TEXT_FRAME) {
        json_error_t je;
        json_t *j = json_loadb((const char *)p, n, 0, &je);
        json_t *c = json_object_get(j, "cols"), *r = json_object_get(j, "rows");
        if (json_is_object(j) && json_is_string(json_object_get(j, "type")) &&
            !strcmp(json_string_value(json_object_get(j, "type")), "resize") &&
            json_is_integer(c) && json_is_integer(r) && json_integer_value(c) >= 1 &&
            json_integer_value(c) <= 1000 && json_integer_value(r) >= 1 &&
            json_integer_value(r) <= 1000) {
            want_op = "terminal.resize";
            cols = json_integer_value(c);
            rows = json_integer_value(r);
        }
        json_decref(j);
    }
    if (!want_op) {
        FUZZ_CHECK(C.n == 0, "a call (%s) for a message that asks for none", C.op);
        FUZZ_CHECK(queued == (arg.opcode == WSLAY_TEXT_FRAME), "%zu messages queued", queued);
    } else {
        FUZZ_CHECK(C.n == 1 && !strcmp(C.op, want_op), "%d calls, the last %s; want %s", C.n,
                   C.op, want_op);
        FUZZ_CHECK(!strcmp(C.sandbox, "user-42"), "called for sandbox '%s'", C.sandbox);
        FUZZ_CHECK(queued == (C.fail ? 1u : 0u), "%zu messages queued after the call", queued);
        sbx_msg m;
        FUZZ_CHECK(sbx_wire_decode(&m, C.args.p, C.args.len, &sbx_wire_limits_request) == 0,
                   "the call's arguments do not decode");
        sbx_str sid, data;
        int64_t c = 0, r = 0;
        FUZZ_CHECK(sbx_wire_get_str(m.root, "sessionId", &sid) == 0 && sbx_str_eq(sid, "s-1"),
                   "sessionId");
        if (arg.opcode == WSLAY_BINARY_FRAME) {
            FUZZ_CHECK(sbx_wire_get_bin(m.root, "data", &data) == 0 && data.n == n &&
                           (!n || !memcmp(data.p, p, n)),
                       "terminal.write of other bytes");
        } else {
            FUZZ_CHECK(sbx_wire_get_i64(m.root, "cols", &c) == 0 &&
                           sbx_wire_get_i64(m.root, "rows", &r) == 0 && c == cols && r == rows,
                       "resized to %lld×%lld, want %lld×%lld", (long long)c, (long long)r,
                       (long long)cols, (long long)rows);
        }
        sbx_wire_msg_free(&m);
    }
    wslay_event_context_free(ctx);
    free(t);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > (64u << 10))
        return 0;
    if (data[0] % 2 == 0) {
        char *s = fuzz_cstr(data + 2, size - 2);
        fuzz_args(s);
        free(s);
    } else {
        /* MAX_IN_MSG bounds what wslay hands over; the input is smaller. */
        char *p = fuzz_copy(data + 2, size - 2);
        fuzz_msg(data[1], (const uint8_t *)p, size - 2);
        free(p);
    }
    return 0;
}
