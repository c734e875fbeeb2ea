/*
 * sbx/sbx.h — the C client library of sbx (libsbx): the whole public API,
 * with <sbx/result.h> (reading results).  Nothing else of the tree is
 * exported from libsbx.so; a program that needs more than this header has
 * found a gap in the API, not a header to include.
 *
 * Build:   cc prog.c $(pkg-config --cflags --libs sbx)          (libsbx.so)
 *          cc prog.c $(pkg-config --cflags --libs --static sbx)  (libsbx.a)
 * Install: make install PREFIX=/usr/local [DESTDIR=…] puts this header in
 *          PREFIX/include/sbx/, the libraries in PREFIX/lib/ and sbx.pc in
 *          PREFIX/lib/pkgconfig/.
 *
 * Talks to an sbx gateway over nng (REQ, msgpack frames; docs/protocol.md).
 *
 *     sbx_client *c;
 *     sbx_error err;
 *     sbx_exec_result r;
 *     if (sbx_client_open(&c, NULL, &err) != 0) …       // $SBX_GATEWAY or tcp://127.0.0.1:7700
 *     sbx_exec_opts o = { .command = "python3 -c 'print(6*7)'" };
 *     if (sbx_exec(c, "user-42", &o, &r, &err) == 0)
 *         printf("%d %.*s", r.exit_code, (int)r.stdout_len, r.stdout_data);
 *     else
 *         fprintf(stderr, "%s: %s\n", err.code, err.message);
 *     sbx_exec_result_free(&r);
 *     sbx_error_free(&err);
 *     sbx_client_close(c);
 *
 * Errors.  Every call returns 0 (or, where said, a positive count) or a
 * negative code and, when given an sbx_error, fills it: `code` is the
 * stable wire name (VALIDATION_FAILED, SANDBOX_NOT_FOUND,
 * SHARD_UNAVAILABLE, …; the Cloudflare Sandbox SDK's names where one
 * applies; docs/protocol.md §4 lists them), `message` a human sentence,
 * `context_json` the error's context map as JSON.  The negative code is
 * sbx's number for that name (stable within a release, not across; compare
 * `code` strings).  A client-side failure uses the same names:
 * GATEWAY_UNAVAILABLE when the gateway cannot be reached, REQUEST_TIMEOUT
 * when the deadline passes, INVALID_RESPONSE when the reply is not a valid
 * frame, VALIDATION_FAILED for arguments the library refuses before
 * sending.  A command that exits non-zero is not an error: its exit code is
 * in the result, as in the SDK.  Every call clears `err` first; release it
 * with sbx_error_free after a failure (harmless after a success).
 *
 * Deadlines.  Every call has one (its timeout_ms, else the client's
 * default; sbx_exec: its timeout + 30 s) and returns by it plus
 * SBX_DEADLINE_SLACK_MS, whatever the gateway does — stopped, killed, its
 * socket removed, half a frame written, never answering: each nng send and
 * receive waits only for the time left.  A shard that does not answer is
 * SHARD_UNAVAILABLE from the gateway just before the deadline; a gateway
 * that does not is REQUEST_TIMEOUT at it.  Streams: see sbx_stream_next.
 * The rule for every layer is docs/protocol.md §2 (Deadlines).  Units: all
 * durations are milliseconds, all sizes bytes.
 *
 * Coverage.  Every operation of docs/protocol.md (sessions, processes and
 * their waits, files, watch, git, env, configure, status, list, the code
 * interpreter, ports, cluster) is reached through the generic calls below:
 * sbx_call_args with arguments built by sbx_args_*, sbx_call_json with a
 * JSON object, or sbx_call with msgpack bytes; the result is read with the
 * accessors of <sbx/result.h> or as JSON.  Streams (exec, logs,
 * readStream, watch, runStream) are read with sbx_stream_*.  The typed
 * helpers wrap the most common calls; they are conveniences, not the whole
 * API (the sbx CLI, tools/cli_sdk.c, drives every operation with this
 * header alone).
 *
 * Ownership.  Results own heap memory released by their *_free function;
 * strings and buffers passed in are only read during the call (copied
 * where kept).  Pointers into a reply (msgpack_object, sbx_view) are valid
 * until that reply is freed; into a stream event, until the next
 * sbx_stream_next or sbx_stream_close.
 *
 * Threads.  A client is thread-safe: calls from many threads run
 * concurrently, each on its own nng context.  Replies, streams and argument
 * builders belong to one thread at a time.  sbx_client_close must not race
 * with calls on the same client.  The library keeps no global state.
 */
#ifndef SBX_SBX_H
#define SBX_SBX_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* SBX_API marks what libsbx exports; everything else is built with
 * -fvisibility=hidden. */
#if defined(__GNUC__)
#define SBX_API __attribute__((visibility("default")))
#else
#define SBX_API
#endif

#define SBX_DEFAULT_GATEWAY "tcp://127.0.0.1:7700"
/* How late past its deadline a call may return, in ms (scheduling only). */
#define SBX_DEADLINE_SLACK_MS 1000

typedef struct sbx_client sbx_client;

/* sbx_error — what a failed call says (see Errors above).  The caller owns
 * the struct (usually on its stack); the library fills it. */
typedef struct sbx_error {
    char code[48];       /* stable wire name, NUL-terminated; "" when there was no error */
    char message[512];   /* human sentence, NUL-terminated (cut at 511 bytes) */
    char *context_json;  /* heap JSON object of the error's context, or NULL;
                            freed by sbx_error_free */
} sbx_error;

/* sbx_error_free — release context_json and set it to NULL (err may be NULL;
 * the struct itself is the caller's). */
SBX_API void sbx_error_free(sbx_error *err);

/*
 * sbx_client_open — connect to a gateway.  url NULL or "" means
 * $SBX_GATEWAY, else SBX_DEFAULT_GATEWAY (nng URLs: tcp://host:port,
 * ipc:///path).  Fails at once with GATEWAY_UNAVAILABLE when nothing
 * listens there.  $SBX_TIMEOUT_MS (> 0) sets the default deadline;
 * $SBX_API_KEY, when set, is sent as every request's "key" (a gateway with
 * API keys requires one: docs/security.md §6).  On
 * success the caller owns *out (sbx_client_close); on failure *out is
 * untouched.
 */
SBX_API int sbx_client_open(sbx_client **out, const char *url, sbx_error *err);

/* A client's TLS identity for tls+tcp:// gateways (docs/security.md,
 * Transports): paths of PEM files, all three or none.  The gateway's
 * certificate must chain to ca; the gateway requires the client's (cert,
 * signed by the same deployment CA). */
typedef struct sbx_tls_files {
    const char *ca;   /* the deployment CA */
    const char *cert; /* this client's certificate */
    const char *key;  /* its private key (unencrypted PEM) */
} sbx_tls_files;

/*
 * sbx_client_open_tls — sbx_client_open with a TLS identity (tls borrowed
 * for the call; NULL means $SBX_TLS_CA, $SBX_TLS_CERT and $SBX_TLS_KEY),
 * used when url is tls+tcp:// (ignored otherwise).
 * Errors beyond sbx_client_open's: VALIDATION_FAILED for an identity that
 * is incomplete or unreadable, or a tls+tcp:// url without one;
 * GATEWAY_UNAVAILABLE when the gateway refuses the handshake (no
 * certificate, one of another CA, plaintext against TLS).
 */
SBX_API int sbx_client_open_tls(sbx_client **out, const char *url, const sbx_tls_files *tls,
                                sbx_error *err);
/* sbx_client_close — close the connection and free c (NULL: nothing).  No
 * call on c may be running or start after it. */
SBX_API void sbx_client_close(sbx_client *c);

/* sbx_client_set_timeout — deadline in ms of calls that have no timeout of
 * their own (default 300000; $SBX_TIMEOUT_MS overrides at open; ms <= 0 is
 * ignored); a call returns by it + SBX_DEADLINE_SLACK_MS (see Deadlines). */
SBX_API void sbx_client_set_timeout(sbx_client *c, int64_t ms);

/* ---------------------------------------------------------------------------
 * Generic calls: any operation of docs/protocol.md. */

/* A reply: its result map, read with <sbx/result.h>.  Owned by the caller;
 * free with sbx_reply_free. */
typedef struct sbx_reply sbx_reply;

/*
 * sbx_call — send `op` for `sandbox` (NULL for deployment-wide ops) with
 * `args` (one encoded msgpack map of args_len bytes, or NULL) and wait at
 * most timeout_ms (<= 0: the client default; capped at 24 h + 1 h).  On
 * success *out holds the reply (free with sbx_reply_free); on failure *out
 * is untouched.  `request_id` may be NULL (a fresh UUID is used) or the id
 * of an earlier attempt, to retry idempotently.  REQUEST_TOO_LARGE when
 * the request exceeds 40 MiB.
 */
SBX_API int sbx_call(sbx_client *c, const char *op, const char *sandbox, const void *args,
                     size_t args_len, int64_t timeout_ms, const char *request_id,
                     sbx_reply **out, sbx_error *err);
/* sbx_call_json — the same with arguments as a JSON object text (NULL or
 * "": none); VALIDATION_FAILED when it is not one.  JSON has no bytes:
 * binary arguments go through sbx_args_kbin. */
SBX_API int sbx_call_json(sbx_client *c, const char *op, const char *sandbox,
                          const char *args_json, int64_t timeout_ms, sbx_reply **out,
                          sbx_error *err);
/* sbx_reply_result — the "result" map (an empty map when the reply has
 * none; valid until sbx_reply_free).  For a reply kept with an error
 * (sbx_exec_reply), the error map {code, message, context}. */
SBX_API const msgpack_object *sbx_reply_result(const sbx_reply *r);
/* sbx_reply_json — the result as JSON text (heap, caller frees; pretty:
 * 2-space indented, else compact); bytes become strings (invalid UTF-8 as
 * U+FFFD).  NULL when out of memory. */
SBX_API char *sbx_reply_json(const sbx_reply *r, bool pretty);
/* sbx_reply_free — free r (NULL: nothing) and everything read from it. */
SBX_API void sbx_reply_free(sbx_reply *r);

/* ---------------------------------------------------------------------------
 * Arguments: a builder of the msgpack map an operation takes, for
 * sbx_call_args.  The root map is open from sbx_args_new; k* calls add a
 * key and its value; sbx_args_kmap / sbx_args_karray open a nested map or
 * array, closed by sbx_args_end; inside an array the key-less calls add
 * elements, inside a map they add keys and values alternately.  Mistakes
 * (an sbx_args_end too many or too few, nesting deeper than 30, a JSON
 * text that does not parse) are remembered: sbx_call_args then fails with
 * VALIDATION_FAILED and sends nothing.  Strings and bytes are copied.
 *
 *     sbx_args *a = sbx_args_new();
 *     sbx_args_kstr(a, "path", "/workspace/x");
 *     sbx_args_kbin(a, "content", buf, len);
 *     rc = sbx_call_args(c, "file.write", "user-42", a, 0, &r, &err);
 *     sbx_args_free(a);
 */
typedef struct sbx_args sbx_args;

/* sbx_args_new — an empty argument map (caller frees with sbx_args_free);
 * never NULL (aborts when out of memory, as every allocation of libsbx). */
SBX_API sbx_args *sbx_args_new(void);
/* sbx_args_free — free a (NULL: nothing), sent or not. */
SBX_API void sbx_args_free(sbx_args *a);
/* Key, then a value: a NUL-terminated string; n bytes of a string (UTF-8
 * expected, not checked); an integer; a boolean; n bytes (msgpack bin:
 * file content, stdin); nil (unset, where an operation says so). */
SBX_API void sbx_args_kstr(sbx_args *a, const char *key, const char *v);
SBX_API void sbx_args_kstrn(sbx_args *a, const char *key, const char *v, size_t n);
SBX_API void sbx_args_kint(sbx_args *a, const char *key, int64_t v);
SBX_API void sbx_args_kbool(sbx_args *a, const char *key, bool v);
SBX_API void sbx_args_kbin(sbx_args *a, const char *key, const void *p, size_t n);
SBX_API void sbx_args_knil(sbx_args *a, const char *key);
/* sbx_args_kjson — key, then any JSON value (text; VALIDATION_FAILED at
 * the call when it does not parse). */
SBX_API void sbx_args_kjson(sbx_args *a, const char *key, const char *json);
/* sbx_args_kmap / sbx_args_karray — key, then open a map or an array that
 * the next values fill, up to the matching sbx_args_end. */
SBX_API void sbx_args_kmap(sbx_args *a, const char *key);
SBX_API void sbx_args_karray(sbx_args *a, const char *key);
SBX_API void sbx_args_end(sbx_args *a);
/* Key-less values: elements of an array, or keys and values of a map. */
SBX_API void sbx_args_str(sbx_args *a, const char *v);
SBX_API void sbx_args_strn(sbx_args *a, const char *v, size_t n);
SBX_API void sbx_args_int(sbx_args *a, int64_t v);
SBX_API void sbx_args_bool(sbx_args *a, bool v);
SBX_API void sbx_args_nil(sbx_args *a);

/* sbx_call_args — sbx_call with the arguments of a (NULL: none).  The
 * call closes a: it is sent once (a second call with it is
 * VALIDATION_FAILED); the caller still frees it. */
SBX_API int sbx_call_args(sbx_client *c, const char *op, const char *sandbox, sbx_args *a,
                          int64_t timeout_ms, sbx_reply **out, sbx_error *err);

/* ---------------------------------------------------------------------------
 * exec: the SDK's exec(command, {cwd, env, timeout}) plus argv and stdin. */

typedef struct sbx_exec_opts {
    const char *command;          /* shell string, run with /bin/sh -c (bash in a session) */
    const char *const *argv;      /* or an argv (NULL-terminated); exactly one of the two */
    const char *cwd;              /* NULL: the session's cwd (/workspace) */
    const char *const *env;       /* "K=V" entries for this call only, NULL-terminated; K
                                     non-empty.  An entry without '=' is VALIDATION_FAILED
                                     (the SDK's env is a map of names to values: there is
                                     no bare name; to unset, sbx_set_env) */
    int64_t timeout_ms;           /* 0: none; on expiry the process tree is killed, exit 124 */
    const char *session_id;       /* NULL: the default session */
    bool sessionless;             /* run as a fresh process, not in a session */
    const void *stdin_data;       /* bytes for the command's stdin (else /dev/null) */
    size_t stdin_len;
    bool has_stdin;               /* stdin given even when stdin_len is 0 */
} sbx_exec_opts;

typedef struct sbx_exec_result {
    bool success;                 /* exit_code == 0 */
    int exit_code;                /* 124 on timeout, 128+N when killed by signal N */
    int signal;                   /* the signal that ended it, or 0 */
    char *stdout_data, *stderr_data; /* heap, not NUL-terminated beyond _len (a NUL is added) */
    size_t stdout_len, stderr_len;
    bool stdout_truncated, stderr_truncated; /* output beyond the shard's cap was dropped */
    uint64_t stdout_bytes, stderr_bytes;     /* bytes produced, kept or not */
    int64_t duration_ms;
    bool timed_out;
    char cause[24];               /* EXITED, TIMEOUT, KILLED, OOM_KILLED, PIDS_LIMIT */
} sbx_exec_result;

/*
 * sbx_exec — run a command and wait for it.  0 with *res filled, or a
 * negative code.  SESSION_TERMINATED (the command ran `exit N` and ended its
 * session's shell, as in the SDK) also fills res->exit_code and the output
 * printed before the shell exited.  Free *res with sbx_exec_result_free in
 * every case.
 */
SBX_API int sbx_exec(sbx_client *c, const char *sandbox, const sbx_exec_opts *o,
                     sbx_exec_result *res, sbx_error *err);
/* sbx_exec_result_free — free the output buffers (the struct is the caller's). */
SBX_API void sbx_exec_result_free(sbx_exec_result *r);
/*
 * sbx_exec_reply — sbx_exec with the reply as the gateway sent it, for a
 * caller that wants every field (the CLI's --json): the same arguments,
 * encoded the same way, and the same deadline.  On success *out is the
 * reply (its result: the exec result map of docs/protocol.md); on failure
 * *out is NULL, and err (context_json) has what the error carries (for
 * SESSION_TERMINATED: exitCode, stdout, stderr).
 */
SBX_API int sbx_exec_reply(sbx_client *c, const char *sandbox, const sbx_exec_opts *o,
                           sbx_reply **out, sbx_error *err);

/* sbx_destroy — stop the sandbox and delete it (idempotent); *destroyed
 * (may be NULL) tells whether it existed. */
SBX_API int sbx_destroy(sbx_client *c, const char *sandbox, bool *destroyed, sbx_error *err);
/* sbx_ping — start the sandbox if needed and check its agent answers. */
SBX_API int sbx_ping(sbx_client *c, const char *sandbox, sbx_error *err);

/* ---------------------------------------------------------------------------
 * Streams (docs/protocol.md §streams): exec output, process logs, file
 * chunks, watch events — sequenced events pulled with long polls.  A stream
 * survives lost replies, gateway restarts and shard hiccups: every read
 * names the last sequence number seen, so nothing is lost or repeated.
 * A stream borrows its client: close the stream before the client.
 */

typedef struct sbx_stream sbx_stream;

typedef struct sbx_event {
    uint64_t seq;
    char type[32];               /* start, stdout, stderr, complete, error, process_info, exit,
                                    metadata, chunk, watching, event, stopped, … */
    const char *data;            /* stdout/stderr/chunk bytes (valid until the next call) */
    size_t data_len;
    bool has_exit_code;
    int exit_code;               /* complete and exit events */
    const msgpack_object *obj;   /* the whole event map (valid until the next call;
                                    read it with <sbx/result.h>) */
} sbx_event;

/* sbx_exec_stream — start a command whose output arrives as events
 * (start, stdout, stderr, complete | error).  Free with sbx_stream_close. */
SBX_API int sbx_exec_stream(sbx_client *c, const char *sandbox, const sbx_exec_opts *o,
                            sbx_stream **out, sbx_error *err);
/* sbx_stream_open — attach to an existing stream by ID (e.g. "proc:<processId>"
 * for a process's logs; 1-71 bytes, else VALIDATION_FAILED) from after
 * sequence number `after` (0: the start).  Sends nothing until the first
 * sbx_stream_next. */
SBX_API int sbx_stream_open(sbx_client *c, const char *sandbox, const char *stream_id,
                            uint64_t after, sbx_stream **out, sbx_error *err);
/* sbx_stream_next — the next event: 1 with *ev filled, 0 at the end of the
 * stream, or a negative code.  Transient failures (SHARD_UNAVAILABLE,
 * REQUEST_TIMEOUT, GATEWAY_UNAVAILABLE) are retried for up to 30 s,
 * resuming after the last event seen.  It waits as long as the stream is
 * quiet and its reads are answered; reads that fail or go unanswered end it
 * with their error within 40 s (+ SBX_DEADLINE_SLACK_MS), retries included. */
SBX_API int sbx_stream_next(sbx_stream *s, sbx_event *ev, sbx_error *err);
/* sbx_stream_id / sbx_stream_last — the stream's ID (valid until
 * sbx_stream_close) and the last sequence seen. */
SBX_API const char *sbx_stream_id(const sbx_stream *s);
SBX_API uint64_t sbx_stream_last(const sbx_stream *s);
/* sbx_stream_cancel — stop what produces the stream (a command is killed). */
SBX_API int sbx_stream_cancel(sbx_stream *s, sbx_error *err);
/* sbx_stream_close — free s (NULL: nothing); the producer is not stopped. */
SBX_API void sbx_stream_close(sbx_stream *s);

/* ---------------------------------------------------------------------------
 * Typed helpers for common operations (everything else: sbx_call_args). */

/* sbx_write_file — write len bytes to path (parents created). */
SBX_API int sbx_write_file(sbx_client *c, const char *sandbox, const char *path,
                           const void *data, size_t len, sbx_error *err);
/* sbx_read_file — read a file; *data (heap, NUL-terminated, caller frees)
 * holds its bytes whatever the encoding on the wire, *len their count;
 * mime (may be NULL) gets the MIME type.  On failure *data is untouched. */
SBX_API int sbx_read_file(sbx_client *c, const char *sandbox, const char *path, char **data,
                          size_t *len, char mime[64], sbx_error *err);
/* sbx_set_env — set ("K=V") and unset ("K") sandbox environment variables
 * (NULL-terminated). */
SBX_API int sbx_set_env(sbx_client *c, const char *sandbox, const char *const *vars,
                        sbx_error *err);
/* sbx_process_start — start a background process (process_id NULL: the
 * shard names it); its ID in id[128]. */
SBX_API int sbx_process_start(sbx_client *c, const char *sandbox, const sbx_exec_opts *o,
                              const char *process_id, char id[128], sbx_error *err);
/* sbx_process_kill — SIGTERM its tree, SIGKILL after 5 s; *exit_code may be NULL. */
SBX_API int sbx_process_kill(sbx_client *c, const char *sandbox, const char *process_id,
                             int *exit_code, sbx_error *err);

#include "result.h"

#endif
