/*
 * escape_util.h — what the escape tests (test_escape_kernel.c,
 * test_escape_host.c; issue 7, parts 1–3) share: the Python probe prelude
 * and the calls that run a probe or a shell line in a sandbox and check
 * its answer.  Every function asserts (Criterion) instead of returning an
 * error.
 */
#ifndef SBX_TEST_ESCAPE_UTIL_H
#define SBX_TEST_ESCAPE_UTIL_H

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <jansson.h>
#include <stdio.h>

#include "../support/sdk.h"

/* The probe prelude (Python), defined in escape_util.c.  sc(nr, *args)
 * makes a raw system call and returns 'OK' or the errno name; in_child(fn)
 * runs fn in a forked child and returns its JSON result, or {'!signal': N}
 * if the child was killed; oracle(calls) runs each (label, nr, *args) under
 * a TRACE filter (test_escape_kernel.c's header says how it works). */
extern const char PRELUDE[];

/* py — run PRELUDE + body as a fresh python3 in sandbox `id`; it must exit 0
 * and print one JSON object, which is returned (caller json_decref's). */
json_t *py(sbx_client *c, const char *id, const char *body);

/* want — the string at `key` is `expect` (one of several: "EACCES|EROFS"). */
void want(json_t *o, const char *key, const char *expect, const char *what);

/* sh_out — run a shell string in the default session; return its stdout
 * (heap, caller frees; "" when there was none). */
char *sh_out(sbx_client *c, const char *id, const char *cmd);

/* kernel_note — say, in every run's output, what this host's kernel keeps a
 * test from exercising.  Not cr_log_warn: Criterion 2.4 turns any warning
 * into a failing exit status, and a missing kernel feature is reported,
 * not failed (each such case still asserts that the attack fails). */
#define kernel_note(...)                                                                     \
    do {                                                                                     \
        fprintf(stderr, "[NOTE] " __VA_ARGS__);                                              \
        fputc('\n', stderr);                                                                 \
    } while (0)

/* escape_create — create sandbox id with network mode `mode`: "none" (the
 * default: lo only) or "egress" under the widest policy a sandbox can ask
 * for (0.0.0.0/0 and every private range allowed), so what stays
 * unreachable does so whatever the policy (docs/network.md §Policy).  The
 * network-facing escape tests run once per mode (ESCAPE_NET_MODES). */
void escape_create(sbx_client *c, const char *id, const char *mode);
/* The parameter: a copy reaches the test's worker process, so no pointer. */
struct escape_mode {
    char name[8];
};
#define ESCAPE_NET_MODES(suite, test)                                                        \
    ParameterizedTestParameters(suite, test)                                                 \
    {                                                                                        \
        static struct escape_mode modes[] = {{"none"}, {"egress"}};                          \
        return cr_make_param_array(struct escape_mode, modes, 2);                            \
    }

/* one sandbox per test, destroyed at the end */
#define SANDBOX(prefix)                                                                      \
    sbx_client *c = test_client();                                                           \
    char *id = test_id(prefix)
#define DONE()                                                                               \
    do {                                                                                     \
        tdone(c, id);                                                                        \
        sbx_client_close(c);                                                                 \
    } while (0)

#endif
