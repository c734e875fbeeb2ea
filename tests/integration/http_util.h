/*
 * http_util.h — what the HTTP front's test binaries (test_http.c,
 * test_http_sse.c) share.  Both assert (Criterion) instead of returning an
 * error.
 */
#ifndef SBX_TEST_HTTP_UTIL_H
#define SBX_TEST_HTTP_UTIL_H

/* A JSON body from a jansson pack format (heap, caller frees). */
char *body(const char *fmt, ...);

/* exec over HTTP on sandbox `id`: the stdout of a shell string (heap, caller
 * frees; asserts exit 0). */
char *hsh(const char *id, const char *cmd);

#endif
