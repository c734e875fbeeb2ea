/*
 * test_smoke.c — the one end-to-end test of `make check`: a private
 * `sbxd dev` (tests/support/itest_main.c) and one sandbox's life through the
 * C client — create, exec, a file written and read back (through the file
 * operations and through a command), status, destroy, and the sandbox gone
 * afterwards.  Everything else is in the longer binaries `make test` runs;
 * this one answers "does the whole stack still start and serve?" in seconds.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/harness.h"

/* call — op on id with JSON args; returns the result as compact JSON text
 * (heap) or NULL with the error's code in code[64]. */
static char *
call(sbx_client *c, const char *op, const char *id, const char *args, char code[64])
{
    sbx_reply *r = NULL;
    sbx_error err;
    code[0] = 0;
    if (sbx_call_json(c, op, id, args, 30000, &r, &err) != 0) {
        snprintf(code, 64, "%s", err.code);
        sbx_error_free(&err);
        return NULL;
    }
    char *j = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return j;
}

Test(smoke, create_exec_file_write_read_destroy)
{
    sbx_client *c = test_client();
    char *id = test_id("smoke");
    char code[64];

    char *res = call(c, "create", id, "{}", code);
    cr_assert(res, "create: %s", code);
    free(res);

    sbx_exec_opts o = {.command = "echo hello-$((6 * 7)); echo oops >&2; (exit 3)"};
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(c, id, &o, &r, &err);
    cr_assert_eq(rc, 0, "exec: %s", rc ? err.message : "");
    cr_expect_eq(r.exit_code, 3);
    cr_expect_not(r.success);
    cr_expect_str_eq(r.stdout_data, "hello-42\n");
    cr_expect_str_eq(r.stderr_data, "oops\n");
    sbx_exec_result_free(&r);

    static const char text[] = "smoke test\nline two\n";
    rc = sbx_write_file(c, id, "/workspace/smoke/note.txt", text, strlen(text), &err);
    cr_assert_eq(rc, 0, "file.write: %s", rc ? err.message : "");
    char *data = NULL;
    size_t len = 0;
    rc = sbx_read_file(c, id, "/workspace/smoke/note.txt", &data, &len, NULL, &err);
    cr_assert_eq(rc, 0, "file.read: %s", rc ? err.message : "");
    cr_expect(len == strlen(text) && !memcmp(data, text, len), "read back: %.*s", (int)len, data);
    free(data);
    /* The sandbox's programs see the same file. */
    o = (sbx_exec_opts){.command = "wc -l < /workspace/smoke/note.txt"};
    rc = sbx_exec(c, id, &o, &r, &err);
    cr_assert_eq(rc, 0, "exec: %s", rc ? err.message : "");
    cr_expect_str_eq(r.stdout_data, "2\n");
    sbx_exec_result_free(&r);

    res = call(c, "status", id, "{}", code);
    cr_assert(res, "status: %s", code);
    cr_expect(strstr(res, "\"running\""), "status of a sandbox that just ran a command: %s", res);
    free(res);

    bool destroyed = false;
    rc = sbx_destroy(c, id, &destroyed, &err);
    cr_assert_eq(rc, 0, "destroy: %s", rc ? err.message : "");
    cr_expect(destroyed, "destroy did not find the sandbox it created");
    res = call(c, "status", id, "{}", code);
    cr_expect_null(res, "status after destroy answered %s", res ? res : "");
    cr_expect_str_eq(code, "SANDBOX_NOT_FOUND");
    free(res);
    free(id);
    sbx_client_close(c);
}
