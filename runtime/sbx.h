/*
 * sbx.h — the C client library of sbx (libsbx.a).
 *
 * Talks to an sbx gateway over nng (REQ, msgpack frames; docs/protocol.md).
 * A client is thread-safe: calls from many threads run concurrently, each on
 * its own nng context.  Link with: -lsbx -lnng -lmsgpackc -luuid -ljansson
 * -lpthread -lm.
 *
 *     sbx_client *c;
 *     sbx_error err;
 *     sbx_exec_result r;
 *     if (sbx_client_open(&c, NULL) != 0) …             // $SBX_GATEWAY or tcp://127.0.0.1:7700
 *     sbx_exec_opts o = { .command = "python3 -c 'print(6*7)'" };
 *     if (sbx_exec(c, "user-42", &o, &r, &err) == 0)
 *         printf("%d %.*s", r.exit_code, (int)r.stdout_len, r.stdout_data);
 *     else
 *         fprintf(stderr, "%s: %s\n", err.code, err.message);
 *     sbx_exec_result_free(&r);
 *     sbx_client_close(c);
 *
 * Errors.  Every call returns 0 or a negative code and, when given an
 * sbx_error, fills it: `code` is the stable wire name (VALIDATION_FAILED,
 * SANDBOX_NOT_FOUND, SHARD_UNAVAILABLE, …; the Cloudflare Sandbox SDK's
 * names where one applies), `message` a human sentence, `context` the
 * error's context map as JSON.  A client-side failure uses the same names:
 * GATEWAY_UNAVAILABLE when the gateway cannot be reached, REQUEST_TIMEOUT
 * when the deadline passes, INVALID_RESPONSE when the reply is not a valid
 * frame.  A command that exits non-zero is not an error: its exit code is
 * in the result, as in the SDK.
 *
 * Deadlines.  Every call has one (its timeout_ms, else the client's
 * default; sbx_exec: its timeout + 30 s) and returns by it plus
 * SBX_DEADLINE_SLACK_MS, whatever the gateway does — stopped, killed, its
 * socket removed, half a frame written, never answering: each nng send and
 * receive waits only for the time left.  A shard that does not answer is
 * SHARD_UNAVAILABLE from the gateway just before the deadline; a gateway
 * that does not is REQUEST_TIMEOUT at it.  Streams: see sbx_stream_next.
 * The rule for every layer is docs/protocol.md §2 (Deadlines).
 *
 * Coverage.  Every operation of docs/protocol.md (sessions, processes and
 * their waits, files, watch, git, env, configure, status, list, the code
 * interpreter, ports, cluster) is reached through the generic calls below:
 * sbx_call with msgpack arguments, or sbx_call_json with a JSON object, and
 * the result read with the sbx_wire_get_* accessors (runtime/wire.h) or as
 * JSON.  Streams (exec, logs, readStream, watch, runStream) are read with
 * sbx_stream_*.  The typed helpers at the end wrap the most common calls;
 * they are conveniences, not the whole API (the sbx CLI, tools/cli_sdk.c,
 * drives every operation this way).
 *
 * Ownership.  Results own heap memory released by their *_free function;
 * strings passed in are copied before the call returns.
 */
#ifndef SBX_CLIENT_H
#define SBX_CLIENT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SBX_DEFAULT_GATEWAY "tcp://127.0.0.1:7700"
/* How late past its deadline a call may return, in ms (scheduling only). */
#define SBX_DEADLINE_SLACK_MS 1000

typedef struct sbx_client sbx_client;

typedef struct sbx_error {
    char code[48];       /* "" when there was no error */
    char message[512];
    char *context_json;  /* heap JSON object or NULL; freed by sbx_error_free */
} sbx_error;

/* sbx_error_free — release context_json (the struct itself is the caller's). */
void sbx_error_free(sbx_error *err);

/*
 * sbx_client_open — connect to a gateway.  url NULL means $SBX_GATEWAY, else
 * SBX_DEFAULT_GATEWAY.  Fails at once (GATEWAY_UNAVAILABLE) when nothing
 * listens there.  On success the caller owns *out.
 */
int sbx_client_open(sbx_client **out, const char *url, sbx_error *err);
void sbx_client_close(sbx_client *c);

/* sbx_client_set_timeout — deadline in ms of calls that have no timeout of
 * their own (default 300000; $SBX_TIMEOUT_MS overrides at open); a call
 * returns by it + SBX_DEADLINE_SLACK_MS (see Deadlines above). */
void sbx_client_set_timeout(sbx_client *c, int64_t ms);

/* ---------------------------------------------------------------------------
 * Generic calls: any operation of docs/protocol.md. */

typedef struct sbx_reply sbx_reply;

/*
 * sbx_call — send `op` for `sandbox` (NULL for deployment-wide ops) with
 * `args` (one encoded msgpack map, or NULL) and wait at most timeout_ms (0:
 * the client default).  On success *out holds the reply (free with
 * sbx_reply_free).  `request_id` may be NULL (a fresh UUID is used) or the id
 * of an earlier attempt, to retry idempotently.
 */
int sbx_call(sbx_client *c, const char *op, const char *sandbox, const void *args,
             size_t args_len, int64_t timeout_ms, const char *request_id, sbx_reply **out,
             sbx_error *err);
/* sbx_call_json — the same with arguments as a JSON object text. */
int sbx_call_json(sbx_client *c, const char *op, const char *sandbox, const char *args_json,
                  int64_t timeout_ms, sbx_reply **out, sbx_error *err);
/* sbx_reply_result — the "result" map (valid until sbx_reply_free). */
const msgpack_object *sbx_reply_result(const sbx_reply *r);
/* sbx_reply_json — the result as JSON text (heap; pretty-printed or compact). */
char *sbx_reply_json(const sbx_reply *r, bool pretty);
void sbx_reply_free(sbx_reply *r);

/* ---------------------------------------------------------------------------
 * exec: the SDK's exec(command, {cwd, env, timeout}) plus argv and stdin. */

typedef struct sbx_exec_opts {
    const char *command;          /* shell string, run with /bin/sh -c (bash in a session) */
    const char *const *argv;      /* or an argv (NULL-terminated); exactly one of the two */
    const char *cwd;              /* NULL: the session's cwd (/workspace) */
    const char *const *env;       /* "K=V" entries for this call only, NULL-terminated */
    int64_t timeout_ms;           /* 0: none; on expiry the process tree is killed, exit 124 */
    const char *session_id;       /* NULL: the default session */
    bool sessionless;             /* run as a fresh process, not in a session */
    const void *stdin_data;       /* bytes for the command's stdin (else /dev/null) */
    size_t stdin_len;
    bool has_stdin;
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
int sbx_exec(sbx_client *c, const char *sandbox, const sbx_exec_opts *o, sbx_exec_result *res,
             sbx_error *err);
void sbx_exec_result_free(sbx_exec_result *r);

/* sbx_destroy — stop the sandbox and delete it (idempotent); *destroyed
 * tells whether it existed. */
int sbx_destroy(sbx_client *c, const char *sandbox, bool *destroyed, sbx_error *err);
/* sbx_ping — start the sandbox if needed and check its agent answers. */
int sbx_ping(sbx_client *c, const char *sandbox, sbx_error *err);

/* ---------------------------------------------------------------------------
 * Streams (docs/protocol.md §streams): exec output, process logs, file
 * chunks, watch events — sequenced events pulled with long polls.  A stream
 * survives lost replies, gateway restarts and shard hiccups: every read
 * names the last sequence number seen, so nothing is lost or repeated.
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
    const msgpack_object *obj;   /* the whole event map (valid until the next call) */
} sbx_event;

/* sbx_exec_stream — start a command whose output arrives as events
 * (start, stdout, stderr, complete | error).  Free with sbx_stream_close. */
int sbx_exec_stream(sbx_client *c, const char *sandbox, const sbx_exec_opts *o, sbx_stream **out,
                    sbx_error *err);
/* sbx_stream_open — attach to an existing stream by ID (e.g. "proc:<processId>"
 * for a process's logs) from after sequence number `after` (0: the start). */
int sbx_stream_open(sbx_client *c, const char *sandbox, const char *stream_id, uint64_t after,
                    sbx_stream **out, sbx_error *err);
/* sbx_stream_next — the next event: 1 with *ev filled, 0 at the end of the
 * stream, or a negative code.  Transient failures (SHARD_UNAVAILABLE,
 * REQUEST_TIMEOUT, GATEWAY_UNAVAILABLE) are retried for up to 30 s,
 * resuming after the last event seen.  It waits as long as the stream is
 * quiet and its reads are answered; reads that fail or go unanswered end it
 * with their error within 40 s (+ SBX_DEADLINE_SLACK_MS), retries included. */
int sbx_stream_next(sbx_stream *s, sbx_event *ev, sbx_error *err);
/* sbx_stream_id / sbx_stream_last — the stream's ID and the last sequence seen. */
const char *sbx_stream_id(const sbx_stream *s);
uint64_t sbx_stream_last(const sbx_stream *s);
/* sbx_stream_cancel — stop what produces the stream (a command is killed). */
int sbx_stream_cancel(sbx_stream *s, sbx_error *err);
void sbx_stream_close(sbx_stream *s);

/* ---------------------------------------------------------------------------
 * Typed helpers for common operations (everything else: sbx_call). */

/* sbx_write_file — write len bytes to path (parents created). */
int sbx_write_file(sbx_client *c, const char *sandbox, const char *path, const void *data,
                   size_t len, sbx_error *err);
/* sbx_read_file — read a file; *data (heap, NUL-terminated, caller frees)
 * holds its bytes whatever the encoding on the wire; mime may be NULL. */
int sbx_read_file(sbx_client *c, const char *sandbox, const char *path, char **data, size_t *len,
                  char mime[64], sbx_error *err);
/* sbx_set_env — set ("K=V") and unset ("K") sandbox environment variables. */
int sbx_set_env(sbx_client *c, const char *sandbox, const char *const *vars, sbx_error *err);
/* sbx_process_start — start a background process; its ID in id[128]. */
int sbx_process_start(sbx_client *c, const char *sandbox, const sbx_exec_opts *o,
                      const char *process_id, char id[128], sbx_error *err);
/* sbx_process_kill — SIGTERM its tree, SIGKILL after 5 s; *exit_code may be NULL. */
int sbx_process_kill(sbx_client *c, const char *sandbox, const char *process_id, int *exit_code,
                     sbx_error *err);

#endif
