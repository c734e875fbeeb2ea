/*
 * httpapi.h — calling the test daemon's HTTP API from Criterion tests
 * (tests/integration/test_http.c, test_preview.c, test_terminal.c): the
 * request helpers and the assertions on an answer that those tests share.
 */
#ifndef SBX_TEST_HTTPAPI_H
#define SBX_TEST_HTTPAPI_H

#include "httpc.h"

/* api_at — `method base+path` with the JSON body json (may be NULL); r is
 * always filled (free with hresp_free).  Returns the status (0: transport
 * failure). */
long api_at(const char *base, const char *method, const char *path, const char *json,
            struct hresp *r);
/* api — api_at on the test daemon's HTTP front (test_http_url()). */
long api(const char *method, const char *path, const char *json, struct hresp *r);
/* http_port — the TCP port of the test daemon's HTTP front. */
int http_port(void);
/* hdone — DELETE /v1/sandboxes/{id}, then free(id) (id from test_id()). */
void hdone(char *id);

/* apif — api with a printf-built path. */
#define apif(method, json, r, ...)                                                             \
    ({                                                                                         \
        char *p_ = hfmt(__VA_ARGS__);                                                          \
        long s_ = api((method), p_, (json), (r));                                             \
        free(p_);                                                                              \
        s_;                                                                                    \
    })

/* Assertions on an answer: its status and, for errors, its code (Criterion). */
#define expect_status(r, want, what)                                                          \
    cr_expect_eq((r).status, (want), "%s: status %ld, expected %d (body %.400s%s)", (what),   \
                 (r).status, (want), (r).body ? (r).body : "", (r).err)
#define assert_status(r, want, what)                                                          \
    cr_assert_eq((r).status, (want), "%s: status %ld, expected %d (body %.400s%s)", (what),   \
                 (r).status, (want), (r).body ? (r).body : "", (r).err)
#define expect_code(r, want, what)                                                            \
    cr_expect_str_eq(jstr((r).json, "code"), (want), "%s: code '%s', expected %s (body %.400s)", \
                     (what), jstr((r).json, "code"), (want), (r).body ? (r).body : "")

#endif
