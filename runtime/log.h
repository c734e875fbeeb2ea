/*
 * log.h — levelled logging to stderr, as text or as JSON lines.
 *
 * Text (the default), one line per call:
 *   "2026-11-22T10:00:00.123Z sbxd[1234] shard s0 W: text"
 * and, for a line about one request (sbx_log_req):
 *   "2026-11-22T10:00:00.123Z sbxd[1234] shard s0 D: [rid=R sandbox=S op=O] text"
 * JSON (`sbxd --log-format json`, docs/operations.md "Logs"), one object per line:
 *   {"time":"2026-11-22T10:00:00.123Z","level":"warn","component":"sbxd shard s0",
 *    "pid":1234,"sandbox":"S","op":"O","requestId":"R","message":"text"}
 * where sandbox, op and requestId are present only on lines about a request.
 * Strings are escaped per RFC 8259: `"` and `\`, control characters as
 * \uXXXX (\n, \t, … as their short forms) and invalid UTF-8 bytes as
 * U+FFFD, so every line parses.  One write() per line: lines of the
 * gateway, the shards and their threads do not interleave.  A line is at
 * most 4 KiB; a longer message is cut.
 *
 * The level, format and process tag are set once by main() (sbx_log_init,
 * sbx_log_set_format) before any thread starts; they are the only
 * process-wide settings in sbx and are never written again, so reading them
 * needs no lock.
 */
#ifndef SBX_LOG_H
#define SBX_LOG_H

#include <stddef.h>

enum sbx_log_level { SBX_LOG_ERROR = 0, SBX_LOG_WARN, SBX_LOG_INFO, SBX_LOG_DEBUG };

/*
 * sbx_log_init — set the tag printed on every line (copied, ≤ 31 bytes; the
 * JSON "component") and the level; the level comes from $SBX_LOG ("error",
 * "warn", "info", "debug") when `level` is negative.  Call once from main().
 */
void sbx_log_init(const char *tag, int level);

/*
 * sbx_log_set_format — "text" or "json"; NULL or "" reads $SBX_LOG_FORMAT
 * (text when unset).  Returns 0, or -EINVAL for another name (the format is
 * then unchanged).  Call from main() before threads start.
 */
int sbx_log_set_format(const char *format);

/*
 * sbx_log_env — the two environment entries ("SBX_LOG=<level>",
 * "SBX_LOG_FORMAT=<text|json>") that make a child's sbx_log_init(tag, -1)
 * and sbx_log_set_format(NULL) log like this process; static strings, for
 * an envp built before a clone (container/spawn.c: the sandbox's agent).
 */
void sbx_log_env(const char **level, const char **format);
/* sbx_log_enabled — whether a message at `level` would be printed. */
int sbx_log_enabled(int level);

void sbx_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* What a line about one request names; each a (pointer, length) pair, not
 * NUL-terminated (wire strings), length 0 for absent.  Borrowed for the call. */
struct sbx_log_req {
    const char *rid;
    size_t rid_n;
    const char *sandbox;
    size_t sandbox_n;
    const char *op;
    size_t op_n;
};

/* sbx_log_req — a line about request r (r may be NULL: as sbx_log). */
void sbx_log_req(int level, const struct sbx_log_req *r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/*
 * sbx_log_format_line — the line sbx_log_req would write, into out[cap]
 * (NUL-terminated, ending in '\n'); returns its length.  `wall_ms` is the
 * time (ms since the epoch), `json` the format.  For tests and for callers
 * that write elsewhere than stderr.
 */
size_t sbx_log_format_line(char *out, size_t cap, int json, long long wall_ms, int level,
                           const char *tag, int pid, const struct sbx_log_req *r,
                           const char *msg);

/* One macro per level; sbx_log_debug evaluates its arguments only when
 * debug logging is on.  (Named sbx_log_*: sbx_error is the client
 * library's error type, include/sbx/sbx.h.) */
#define sbx_log_error(...) sbx_log(SBX_LOG_ERROR, __VA_ARGS__)
#define sbx_log_warn(...) sbx_log(SBX_LOG_WARN, __VA_ARGS__)
#define sbx_log_info(...) sbx_log(SBX_LOG_INFO, __VA_ARGS__)
#define sbx_log_debug(...)                                                               \
    do {                                                                                 \
        if (sbx_log_enabled(SBX_LOG_DEBUG))                                              \
            sbx_log(SBX_LOG_DEBUG, __VA_ARGS__);                                         \
    } while (0)
#define sbx_log_req_debug(r, ...)                                                        \
    do {                                                                                 \
        if (sbx_log_enabled(SBX_LOG_DEBUG))                                              \
            sbx_log_req(SBX_LOG_DEBUG, (r), __VA_ARGS__);                                \
    } while (0)

#endif
