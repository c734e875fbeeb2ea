/*
 * test_error.c — the error object (runtime/error.h) and the cleanup
 * attributes (runtime/cleanup.h): what a caller relies on when it reports
 * a failure and when a scope ends.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/cleanup.h"
#include "../../runtime/error.h"
#include "../../runtime/nngx.h"

static int
open_missing(const char *path, sbx_err_t *err)
{
    _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return sbx_err_make(err, -errno, "open `%s`", path);
    return 0;
}

Test(error, make_returns_the_code_and_says_what_failed)
{
    sbx_err_t err = NULL;
    int rc = open_missing("/nonexistent/sbx-test", &err);
    cr_assert_eq(rc, -ENOENT);
    cr_assert_not_null(err);
    cr_expect_eq(sbx_err_code(err), -ENOENT);
    /* -errno: strerror is appended, as crun does. */
    cr_expect_str_eq(sbx_err_msg(err), "open `/nonexistent/sbx-test`: No such file or directory");
    cr_expect_eq(sbx_err_release(&err), -ENOENT);
    cr_expect_null(err);
    cr_expect_eq(sbx_err_release(&err), 0, "releasing twice is harmless");
}

Test(error, sbx_codes_keep_the_message_and_prefix_adds_context)
{
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_err_make(&err, SBX_E_VALIDATION, "port %d out of range", 70000),
                 SBX_E_VALIDATION);
    cr_expect_eq(sbx_err_prefix(&err, "sandbox %s", "u-1"), SBX_E_VALIDATION);
    cr_expect_str_eq(sbx_err_msg(err), "sandbox u-1: port 70000 out of range");
    cr_expect_str_eq(sbx_err_name(sbx_err_code(err)), "VALIDATION_FAILED");
    /* A second make replaces (and frees) the first: no leak under ASan. */
    sbx_err_make(&err, SBX_E_NOT_FOUND, "no sandbox %s", "u-2");
    cr_expect_str_eq(sbx_err_msg(err), "no sandbox u-2");
    sbx_err_release(&err);
}

Test(error, null_err_and_non_negative_codes)
{
    cr_expect_eq(sbx_err_make(NULL, -EIO, "x"), -EIO, "err NULL: only the code");
    sbx_err_t err = NULL;
    cr_expect_eq(sbx_err_make(&err, 0, "not an error"), SBX_E_INTERNAL,
                 "0 is not a failure code: INTERNAL_ERROR");
    sbx_err_release(&err);
    cr_expect_eq(sbx_err_prefix(&err, "nothing to prefix"), SBX_E_INTERNAL);
    cr_expect_null(err);
    cr_expect_eq(sbx_err_code(NULL), 0);
    cr_expect_str_eq(sbx_err_msg(NULL), "");
}

Test(error, cleanup_err_releases_at_scope_end)
{
    /* Under ASan's leak check this test fails if the object is not freed. */
    _cleanup_err_ sbx_err_t err = NULL;
    sbx_err_make(&err, SBX_E_STORAGE, "commit: %s", "map full");
    cr_expect_str_eq(sbx_err_msg(err), "commit: map full");
}

/* The nng helpers: negative codes (err.h), never nng's positive ones, and a
 * message naming the URL. */
Test(error, nng_helpers_return_negative_codes_with_the_url)
{
    nng_socket s;
    sbx_err_t err = NULL;
    int rc = sbx_nng_rep_listen(&s, "tcp://256.0.0.1:1", NULL, &err);
    cr_assert_lt(rc, 0, "listen on an invalid address: %d", rc);
    cr_expect_eq(sbx_err_code(err), rc);
    cr_expect(strstr(sbx_err_msg(err), "tcp://256.0.0.1:1") != NULL, "%s", sbx_err_msg(err));
    sbx_err_release(&err);
    rc = sbx_nng_req_dial(&s, "nosuchscheme://x", NULL, &err);
    cr_assert_lt(rc, 0, "dial with an unknown scheme: %d", rc);
    cr_expect(strstr(sbx_err_msg(err), "nosuchscheme://x") != NULL, "%s", sbx_err_msg(err));
    sbx_err_release(&err);
    cr_expect_lt(sbx_nng_rep_listen(&s, "nosuchscheme://y", NULL, NULL), 0);
}

static char *
make_owned(bool hand_on)
{
    _cleanup_free_ char *p = strdup("owned");
    cr_assert_not_null(p);
    if (!hand_on)
        return NULL; /* p is freed here */
    return sbx_steal_pointer(&p);
}

Test(cleanup, steal_pointer_hands_on_and_the_rest_is_freed)
{
    char *p = make_owned(true);
    cr_assert_not_null(p);
    cr_expect_str_eq(p, "owned");
    free(p);
    cr_expect_null(make_owned(false)); /* no leak under ASan */
}

Test(cleanup, close_and_steal_fd)
{
    int kept;
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    {
        _cleanup_close_ int a = fds[0];
        _cleanup_close_ int b = fds[1];
        kept = sbx_steal_fd(&b);
        cr_expect_eq(b, -1);
        (void)a;
    }
    /* fds[0] was closed by the scope; the stolen write end is still open. */
    cr_expect_eq(fcntl(fds[0], F_GETFD), -1);
    cr_expect_eq(errno, EBADF);
    cr_expect_geq(fcntl(kept, F_GETFD), 0);
    close(kept);
}

Test(cleanup, close_keeps_errno)
{
    errno = 0;
    {
        _cleanup_close_ int fd = open("/nonexistent/sbx-test", O_RDONLY);
        cr_assert_lt(fd, 0);
        errno = ENOENT;
        _cleanup_close_ int other = open("/dev/null", O_RDONLY);
        errno = ENOENT;
        (void)other;
    }
    cr_expect_eq(errno, ENOENT, "the cleanup of a descriptor changed errno to %d", errno);
}
