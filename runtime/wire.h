/*
 * wire.h — the msgpack wire codec shared by client, gateway, shard and agent.
 *
 * Every frame is one msgpack map (docs/protocol.md has the full list of ops
 * and fields).  A request:
 *
 *   { "v": 1,                       protocol version (uint)
 *     "id": "0b6f…",                request id, 1–64 bytes; doubles as the
 *                                   idempotency key (a retry reuses it)
 *     "op": "exec",                 operation name
 *     "sandbox": "user-42",         sandbox ID (absent for cluster-wide ops)
 *     "timeoutMs": 30000,           optional: the caller's deadline (ms)
 *     "retry": true,                optional: an earlier attempt of this id had
 *                                   an unknown outcome (it may have run;
 *                                   docs/protocol.md §2 "Idempotency")
 *     "args": { … } }               op-specific arguments (map, optional)
 *
 * A reply:  { "v": 1, "id": "0b6f…", "ok": true,  "result": { … } }
 *       or  { "v": 1, "id": "0b6f…", "ok": false,
 *             "error": { "code": "VALIDATION_FAILED", "message": "…",
 *                        "context": { … } } }
 *
 * Hostile input.  msgpack-c has no limits of its own: a 5-byte array header
 * can claim 2^32 elements and make it reserve gigabytes, and nesting beyond
 * 32 levels is reported as NOMEM (../shared/reference/actors-cluster.md §1h).
 * So every frame goes through sbx_wire_check() first: it walks the bytes
 * without allocating, rejects any container whose element count exceeds the
 * bytes left, any nesting deeper than the limit, more objects than the
 * limit, ext types, the reserved byte 0xc1 and trailing bytes.  Only then is
 * msgpack_unpack_next() called, and a NOMEM from it is a bad request, never
 * an out-of-memory condition of ours.
 *
 * Frame sizes.  SBX_WIRE_MAX_FRAME is set as NNG_OPT_RECVMAXSZ on every nng
 * socket (nng drops the connection of a peer that sends more); requests
 * between SBX_WIRE_MAX_REQUEST and that cap are answered REQUEST_TOO_LARGE.
 */
#ifndef SBX_WIRE_H
#define SBX_WIRE_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_WIRE_VERSION 1
#define SBX_WIRE_MAX_FRAME (72u << 20)   /* bytes: transport cap, every socket */
#define SBX_WIRE_MAX_REQUEST (40u << 20) /* bytes: larger requests get REQUEST_TOO_LARGE */
#define SBX_WIRE_MAX_ID 64               /* bytes in a request id */
/* Longest duration an argument may ask for (`timeout`, `commandTimeoutMs`,
 * `cloneTimeoutMs`, `interval`): 24 h, ms.  The envelope's `timeoutMs` may
 * exceed it by SBX_WIRE_DEADLINE_SLACK_MS (the client library and the HTTP
 * front add up to that much to a command's own timeout).  Larger values
 * are refused rather than wrapped: nng durations are 32-bit. */
#define SBX_WIRE_MAX_DURATION_MS (24LL * 3600 * 1000)
#define SBX_WIRE_DEADLINE_SLACK_MS (3600LL * 1000)

/* A view of bytes inside a decoded frame: not NUL-terminated, lives as long
 * as the frame buffer it points into. */
typedef struct sbx_str {
    const char *p;
    size_t n;
} sbx_str;

#define SBX_STR(s) ((sbx_str){(s), sizeof(s) - 1})

/* sbx_str_eq — whether the view equals the C string s. */
bool sbx_str_eq(sbx_str a, const char *s);
/* sbx_str_dup — heap copy with a NUL (caller frees). */
char *sbx_str_dup(sbx_str s);
/* sbx_str_copy — copy into out[outlen] with a NUL; -ENAMETOOLONG if it does not fit. */
int sbx_str_copy(sbx_str s, char *out, size_t outlen);

struct sbx_wire_limits {
    unsigned max_depth;  /* nesting levels, ≤ 30 (msgpack-c's own stack is 32) */
    size_t max_objects;  /* msgpack objects in the frame (each costs 24 bytes decoded) */
};

/* Limits for frames that come from clients, peers and agents (untrusted). */
extern const struct sbx_wire_limits sbx_wire_limits_request;
/* Limits for replies a client decodes (listings can be large). */
extern const struct sbx_wire_limits sbx_wire_limits_reply;

/*
 * sbx_wire_check — validate a frame without allocating (see the header
 * comment).  Returns 0, or SBX_E_MALFORMED.  Pure function; fuzzed by
 * tests/fuzz/fuzz_wire.c.
 */
int sbx_wire_check(const void *buf, size_t len, const struct sbx_wire_limits *lim);

/*
 * A decoded frame.  `root` points into the zone owned by `u`; string and bin
 * objects point into the caller's buffer, which must outlive the message.
 */
typedef struct sbx_msg {
    msgpack_unpacked u;
    const msgpack_object *root;
} sbx_msg;

/*
 * sbx_wire_decode — check then unpack one frame whose root must be a map.
 * On success *m must be released with sbx_wire_msg_free.  Returns 0 or
 * SBX_E_MALFORMED (nothing to free then).
 */
int sbx_wire_decode(sbx_msg *m, const void *buf, size_t len, const struct sbx_wire_limits *lim);
void sbx_wire_msg_free(sbx_msg *m);

/*
 * Typed access to map fields.  Each returns 0 when the key is present with
 * the right type, -ENOENT when it is absent (or nil), SBX_E_VALIDATION when
 * present with another type.  Output views point into the frame.
 */
const msgpack_object *sbx_wire_get(const msgpack_object *map, const char *key);
int sbx_wire_get_str(const msgpack_object *map, const char *key, sbx_str *out);
int sbx_wire_get_bin(const msgpack_object *map, const char *key, sbx_str *out); /* bin or str */
int sbx_wire_get_i64(const msgpack_object *map, const char *key, int64_t *out);
int sbx_wire_get_bool(const msgpack_object *map, const char *key, bool *out);
int sbx_wire_get_map(const msgpack_object *map, const char *key, const msgpack_object **out);
int sbx_wire_get_array(const msgpack_object *map, const char *key, const msgpack_object **out);
/* sbx_wire_obj_str — view of a str object (or bin); SBX_E_VALIDATION otherwise. */
int sbx_wire_obj_str(const msgpack_object *o, sbx_str *out);

/* A parsed request envelope (views into the frame). */
struct sbx_req {
    uint32_t v;
    sbx_str id;
    sbx_str op;
    sbx_str sandbox;              /* .n == 0 when absent */
    int64_t timeout_ms;           /* 0 when absent */
    bool retry;                   /* "retry": an earlier attempt may have run (false if absent) */
    const msgpack_object *args;   /* a map; never NULL (an empty map when absent) */
};

/*
 * sbx_wire_parse_req — validate the envelope fields of a decoded request.
 * Returns 0, SBX_E_VERSION, or SBX_E_MALFORMED with a reason in why[whylen].
 */
int sbx_wire_parse_req(const msgpack_object *root, struct sbx_req *r, char *why, size_t whylen);

/* ---------------------------------------------------------------------------------
 * Encoder.  Writes msgpack with msgpack-c's packer into a growable buffer.
 * Maps and arrays are opened and closed; their element counts are patched on
 * close, so optional fields need no counting up front.  Misuse (unbalanced
 * close, > 32 levels) sets `bad` and is reported by sbx_enc_finish.
 */
typedef struct sbx_enc {
    char *p;
    size_t len, cap;
    msgpack_packer pk;
    int depth;
    bool bad;
    struct {
        size_t off;     /* offset of the 5-byte map32/array32 header */
        uint32_t items; /* values written at this level (keys count too in maps) */
        bool map;
    } st[32];
} sbx_enc;

void sbx_enc_init(sbx_enc *e);
void sbx_enc_free(sbx_enc *e);
/* sbx_enc_finish — hand the bytes to the caller (free()); -EINVAL if misused. */
int sbx_enc_finish(sbx_enc *e, char **out, size_t *len);

void sbx_enc_map(sbx_enc *e);
void sbx_enc_array(sbx_enc *e);
void sbx_enc_end(sbx_enc *e);
void sbx_enc_str(sbx_enc *e, const char *s);
void sbx_enc_strn(sbx_enc *e, const char *s, size_t n);
void sbx_enc_bin(sbx_enc *e, const void *p, size_t n);
void sbx_enc_int(sbx_enc *e, int64_t v);
void sbx_enc_uint(sbx_enc *e, uint64_t v);
void sbx_enc_double(sbx_enc *e, double v);
void sbx_enc_bool(sbx_enc *e, bool v);
void sbx_enc_nil(sbx_enc *e);
/* sbx_enc_obj — copy a decoded object (deep). */
void sbx_enc_obj(sbx_enc *e, const msgpack_object *o);
/* sbx_enc_raw — append one already-encoded msgpack object (trusted bytes). */
void sbx_enc_raw(sbx_enc *e, const void *p, size_t n);

/* Key/value shorthands for the current map. */
void sbx_enc_kstr(sbx_enc *e, const char *k, const char *v);
void sbx_enc_kstrn(sbx_enc *e, const char *k, const char *v, size_t n);
void sbx_enc_kint(sbx_enc *e, const char *k, int64_t v);
void sbx_enc_kbool(sbx_enc *e, const char *k, bool v);
void sbx_enc_kbin(sbx_enc *e, const char *k, const void *p, size_t n);
void sbx_enc_kmap(sbx_enc *e, const char *k);   /* key, then opens a map */
void sbx_enc_karray(sbx_enc *e, const char *k); /* key, then opens an array */

/* ---------------------------------------------------------------------------------
 * Errors carried on the wire: {code, message, context}.
 */
typedef struct sbx_werr {
    int code;           /* an sbx code (err.h) */
    char message[512];
    sbx_enc ctx;        /* an open map; add context entries with sbx_enc_k*() */
    bool ctx_used;
} sbx_werr;

/* sbx_werr_init — code + printf message; the context map starts empty. */
void sbx_werr_init(sbx_werr *w, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* sbx_werr_ctx — the context map encoder, to add fields. */
sbx_enc *sbx_werr_ctx(sbx_werr *w);
void sbx_werr_free(sbx_werr *w);
/* sbx_enc_werr — write {code, message, context} as the current value. */
void sbx_enc_werr(sbx_enc *e, sbx_werr *w);

/*
 * Reply envelopes.  sbx_enc_reply_ok opens {v, id, ok:true, result:{ … and
 * leaves the result map open for the caller; sbx_enc_end twice closes it.
 * sbx_wire_reply_err builds a complete error reply.
 */
void sbx_enc_reply_ok(sbx_enc *e, sbx_str id);
int sbx_wire_reply_err(sbx_str id, sbx_werr *w, char **out, size_t *len);
/* sbx_wire_reply_errf — error reply without context; message printf-style. */
int sbx_wire_reply_errf(sbx_str id, int code, char **out, size_t *len, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

#endif
