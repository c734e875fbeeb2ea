/*
 * util.h — small helpers shared by every layer: growable byte buffers,
 * clocks, allocation that aborts on exhaustion, whole-buffer I/O.
 *
 * Allocation rule (redis zmalloc, crun xmalloc): sizes computed by sbx itself
 * go through sbx_xmalloc & co., which abort on OOM so callers stay readable;
 * any size that came from outside (a frame, a file, a client) is checked
 * against a limit *before* it reaches an allocator.
 */
#ifndef SBX_UTIL_H
#define SBX_UTIL_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define SBX_ARRAY_LEN(a) (sizeof(a) / sizeof((a)[0]))
#define SBX_MIN(a, b) ((a) < (b) ? (a) : (b))
#define SBX_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Allocation that aborts the process on exhaustion; never returns NULL. */
void *sbx_xmalloc(size_t n);
void *sbx_xcalloc(size_t n, size_t sz);
void *sbx_xrealloc(void *p, size_t n);
char *sbx_xstrdup(const char *s);
/* sbx_xstrndup — copy n bytes of s (need not be NUL-terminated) plus a NUL. */
char *sbx_xstrndup(const char *s, size_t n);

/* Growable byte buffer.  Owns `p`; free with sbx_buf_free. */
typedef struct sbx_buf {
    char *p;
    size_t len;
    size_t cap;
} sbx_buf;

void sbx_buf_init(sbx_buf *b);
void sbx_buf_free(sbx_buf *b);
void sbx_buf_reserve(sbx_buf *b, size_t extra);
void sbx_buf_append(sbx_buf *b, const void *data, size_t n);
void sbx_buf_appendf(sbx_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* sbx_buf_consume — drop the first n bytes (n ≤ len). */
void sbx_buf_consume(sbx_buf *b, size_t n);
/* sbx_buf_steal — hand the bytes to the caller (free() them); b is reset. */
char *sbx_buf_steal(sbx_buf *b, size_t *len);

/* Clocks, in milliseconds / microseconds. */
int64_t sbx_mono_ms(void);  /* CLOCK_MONOTONIC */
int64_t sbx_mono_us(void);
int64_t sbx_wall_ms(void);  /* CLOCK_REALTIME, ms since the Unix epoch */
/* sbx_cond_wait_ms — pthread_cond_timedwait(3p) for at most `ms` ms (the
 * condition's default clock, CLOCK_REALTIME).  `mu` is held on entry and on
 * return; the caller re-checks its predicate (wake-ups may be spurious). */
void sbx_cond_wait_ms(pthread_cond_t *cv, pthread_mutex_t *mu, int64_t ms);
/* sbx_iso8601 — format wall-clock ms as "2026-11-22T10:00:00.123Z" (out ≥ 32 bytes). */
void sbx_iso8601(int64_t wall_ms, char *out, size_t outlen);

/*
 * Whole-buffer fd I/O that retries EINTR and short transfers.
 * Return 0 or -errno; sbx_read_full returns -EPIPE on EOF before n bytes.
 */
int sbx_write_full(int fd, const void *buf, size_t n);
int sbx_read_full(int fd, void *buf, size_t n);

/* sbx_fs_write — write a small string to a path (O_WRONLY|O_CLOEXEC); 0 or -errno. */
int sbx_fs_write(const char *path, const char *s);
/*
 * sbx_fs_read — read at most max bytes of a file into a NUL-terminated heap
 * string owned by the caller (*out); 0 or -errno (-EFBIG if larger than max).
 */
int sbx_fs_read(const char *path, size_t max, char **out, size_t *len);

/* sbx_set_nonblock / sbx_set_cloexec — 0 or -errno. */
int sbx_set_nonblock(int fd, bool on);
int sbx_set_cloexec(int fd, bool on);

/* sbx_mkdir_p — mkdir -p with mode; 0 or -errno. */
int sbx_mkdir_p(const char *path, mode_t mode);
/* sbx_rm_rf — remove a tree (does not follow symlinks, stays on one fs); 0 or -errno. */
int sbx_rm_rf(const char *path);

/* sbx_random — fill buf from getrandom(2); 0 or -errno. */
int sbx_random(void *buf, size_t n);

/* sbx_parse_size — "64M", "1g", "4096" → bytes; 0 or -EINVAL. */
int sbx_parse_size(const char *s, uint64_t *out);
/* sbx_parse_duration_ms — "30s", "10m", "1h", "500ms", "250" (seconds) → ms. */
int sbx_parse_duration_ms(const char *s, int64_t *out);



/* Base64 (RFC 4648 §4, with padding).  sbx_base64_encode returns a heap
 * NUL-terminated string (caller frees).  sbx_base64_decode accepts only the
 * standard alphabet, padding and no whitespace; returns 0 with a heap
 * buffer in *out and *outlen (caller frees), or -EINVAL. */
char *sbx_base64_encode(const void *p, size_t n, size_t *outlen);
int sbx_base64_decode(const char *s, size_t n, char **out, size_t *outlen);

#endif
