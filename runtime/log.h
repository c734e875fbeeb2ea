/*
 * log.h — levelled logging to stderr.
 *
 * One line per call: "2026-11-22T10:00:00.123Z sbxd[1234] shard s0 W: text".
 * The level and the process tag are set once by main() (sbx_log_init) before
 * any thread starts; they are the only process-wide settings in sbx and are
 * never written again, so reading them needs no lock.
 */
#ifndef SBX_LOG_H
#define SBX_LOG_H

enum sbx_log_level { SBX_LOG_ERROR = 0, SBX_LOG_WARN, SBX_LOG_INFO, SBX_LOG_DEBUG };

/*
 * sbx_log_init — set the tag printed on every line (copied, ≤ 31 bytes) and
 * the level; the level comes from $SBX_LOG ("error", "warn", "info",
 * "debug") when `level` is negative.  Call once from main().
 */
void sbx_log_init(const char *tag, int level);

/* sbx_log_enabled — whether a message at `level` would be printed. */
int sbx_log_enabled(int level);

void sbx_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

#endif
