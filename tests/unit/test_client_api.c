/*
 * test_client_api.c — the parts of the public client API (include/sbx/)
 * that need no daemon: the argument builder, the result accessors and the
 * library's own refusals, against a stand-in gateway in this process (an
 * nng REP socket on inproc://) that answers every request with
 * {op, sandbox, args} — what the library put on the wire.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../../include/sbx/sbx.h"
#include "../../runtime/wire.h"

static nng_socket rep;
static pthread_t echo_thread;
static char url[64];

/* echo — answer each request with its own op, sandbox and args. */
static void *
echo(void *arg)
{
    (void)arg;
    for (;;) {
        nng_msg *m;
        if (nng_recvmsg(rep, &m, 0) != 0)
            return NULL; /* socket closed */
        sbx_msg d;
        struct sbx_req r;
        char why[128];
        char *out = NULL;
        size_t len = 0;
        if (sbx_wire_decode(&d, nng_msg_body(m), nng_msg_len(m), &sbx_wire_limits_request) == 0) {
            if (sbx_wire_parse_req(d.root, &r, why, sizeof(why)) == 0) {
                sbx_enc e;
                sbx_enc_init(&e);
                sbx_enc_reply_ok(&e, r.id);
                sbx_enc_kstrn(&e, "op", r.op.p, r.op.n);
                sbx_enc_kstrn(&e, "sandbox", r.sandbox.p, r.sandbox.n);
                sbx_enc_str(&e, "args");
                sbx_enc_obj(&e, r.args);
                sbx_enc_end(&e);
                sbx_enc_end(&e);
                sbx_enc_finish(&e, &out, &len);
            }
            sbx_wire_msg_free(&d);
        }
        nng_msg_free(m);
        if (out) {
            nng_send(rep, out, len, 0);
            free(out);
        }
    }
}

static void
setup(void)
{
    snprintf(url, sizeof(url), "inproc://sbx-test-client-api-%d", (int)getpid());
    cr_assert_eq(nng_rep0_open(&rep), 0);
    cr_assert_eq(nng_listen(rep, url, NULL, 0), 0);
    cr_assert_eq(pthread_create(&echo_thread, NULL, echo, NULL), 0);
}

static void
teardown(void)
{
    nng_close(rep);
    pthread_join(echo_thread, NULL);
}

TestSuite(client_api, .init = setup, .fini = teardown);

static sbx_client *
client(void)
{
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, url, &err), 0, "%s: %s", err.code, err.message);
    sbx_client_set_timeout(c, 10000);
    return c;
}

Test(client_api, the_builder_puts_on_the_wire_what_was_added)
{
    sbx_client *c = client();
    sbx_args *a = sbx_args_new();
    sbx_args_kstr(a, "path", "/workspace/x");
    sbx_args_kbin(a, "content", "a\0b", 3);
    sbx_args_kint(a, "n", -42);
    sbx_args_kbool(a, "flag", true);
    sbx_args_knil(a, "gone");
    sbx_args_karray(a, "list");
    sbx_args_str(a, "one");
    sbx_args_strn(a, "twoXX", 3);
    sbx_args_end(a);
    sbx_args_kmap(a, "env");
    sbx_args_str(a, "K");
    sbx_args_str(a, "v w");
    sbx_args_end(a);
    sbx_args_kjson(a, "j", "{\"deep\":[1,2]}");
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call_args(c, "file.write", "u-1", a, 0, &r, &err), 0, "%s: %s", err.code,
                 err.message);
    const msgpack_object *res = sbx_reply_result(r), *args, *list, *env, *j, *deep;
    sbx_view v;
    int64_t n = 0;
    bool flag = false;
    cr_assert_eq(sbx_get_str(res, "op", &v), 0);
    cr_expect(sbx_view_eq(v, "file.write"));
    cr_assert_eq(sbx_get_str(res, "sandbox", &v), 0);
    cr_expect(sbx_view_eq(v, "u-1"));
    cr_assert_eq(sbx_get_map(res, "args", &args), 0);
    cr_assert_eq(sbx_get_str(args, "path", &v), 0);
    cr_expect(sbx_view_eq(v, "/workspace/x"));
    cr_expect_neq(sbx_get_str(args, "content", &v), 0, "bytes are not a string");
    cr_assert_eq(sbx_get_bytes(args, "content", &v), 0);
    cr_expect(v.n == 3 && !memcmp(v.p, "a\0b", 3));
    cr_assert_eq(sbx_get_i64(args, "n", &n), 0);
    cr_expect_eq(n, -42);
    cr_assert_eq(sbx_get_bool(args, "flag", &flag), 0);
    cr_expect(flag);
    cr_expect_null(sbx_get(args, "gone"), "nil reads as absent");
    cr_expect_eq(sbx_get_str(args, "gone", &v), -ENOENT, "nil reads as absent");
    cr_assert_eq(sbx_get_array(args, "list", &list), 0);
    cr_assert_eq(list->via.array.size, 2);
    cr_assert_eq(sbx_value_str(&list->via.array.ptr[1], &v), 0);
    cr_expect(sbx_view_eq(v, "two"));
    cr_assert_eq(sbx_get_map(args, "env", &env), 0);
    cr_assert_eq(sbx_get_str(env, "K", &v), 0);
    cr_expect(sbx_view_eq(v, "v w"));
    cr_assert_eq(sbx_get_map(args, "j", &j), 0);
    cr_assert_eq(sbx_get_array(j, "deep", &deep), 0);
    cr_expect_eq(deep->via.array.size, 2);
    /* Absent keys and wrong types: -ENOENT and VALIDATION_FAILED's code,
     * the output left alone. */
    v = (sbx_view){"default", 7};
    cr_expect_eq(sbx_get_str(args, "missing", &v), -ENOENT);
    cr_expect(sbx_view_eq(v, "default"));
    cr_expect_lt(sbx_get_i64(args, "path", &n), 0);
    cr_expect_neq(sbx_get_i64(args, "path", &n), -ENOENT);
    char *json = sbx_value_json(env, false);
    cr_expect_str_eq(json, "{\"K\":\"v w\"}");
    free(json);
    sbx_reply_free(r);
    /* Sent once: a second call with the same builder is refused. */
    r = NULL;
    cr_expect_lt(sbx_call_args(c, "file.write", "u-1", a, 0, &r, &err), 0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    cr_expect_null(r);
    sbx_args_free(a);
    sbx_client_close(c);
}

Test(client_api, a_malformed_builder_is_refused_before_anything_is_sent)
{
    sbx_client *c = client();
    sbx_reply *r = NULL;
    sbx_error err;
    sbx_args *open_map = sbx_args_new();
    sbx_args_kmap(open_map, "env"); /* never closed */
    cr_expect_lt(sbx_call_args(c, "env.set", "u-1", open_map, 0, &r, &err), 0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    sbx_args_free(open_map);
    sbx_args *extra_end = sbx_args_new();
    sbx_args_end(extra_end);
    sbx_args_end(extra_end);
    cr_expect_lt(sbx_call_args(c, "env.set", "u-1", extra_end, 0, &r, &err), 0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    sbx_args_free(extra_end);
    sbx_args *bad_json = sbx_args_new();
    sbx_args_kjson(bad_json, "x", "{not json");
    cr_expect_lt(sbx_call_args(c, "env.set", "u-1", bad_json, 0, &r, &err), 0);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED");
    sbx_args_free(bad_json);
    cr_expect_null(r);
    /* No arguments at all is fine. */
    cr_assert_eq(sbx_call_args(c, "ping", "u-1", NULL, 0, &r, &err), 0);
    sbx_reply_free(r);
    sbx_client_close(c);
}

/* exec's arguments are encoded by the library alone: what sbx_exec_reply
 * sends is what sbx_exec sends, and a bad env entry never leaves. */
Test(client_api, exec_env_entries_are_checked_and_encoded_once)
{
    sbx_client *c = client();
    sbx_reply *r = NULL;
    sbx_error err;
    sbx_exec_opts o = {.command = "echo $A",
                       .env = (const char *const[]){"A=1", "B=x=y", NULL},
                       .timeout_ms = 5000};
    cr_assert_eq(sbx_exec_reply(c, "u-1", &o, &r, &err), 0, "%s: %s", err.code, err.message);
    const msgpack_object *args, *env;
    sbx_view v;
    int64_t t = 0;
    cr_assert_eq(sbx_get_map(sbx_reply_result(r), "args", &args), 0);
    cr_assert_eq(sbx_get_map(args, "env", &env), 0);
    cr_assert_eq(sbx_get_str(env, "B", &v), 0);
    cr_expect(sbx_view_eq(v, "x=y"), "the value is everything after the first '='");
    cr_assert_eq(sbx_get_i64(args, "timeout", &t), 0);
    cr_expect_eq(t, 5000);
    sbx_reply_free(r);
    const char *bad[] = {"FOO", "=bar"};
    for (size_t i = 0; i < 2; i++) {
        o.env = (const char *const[]){"A=1", bad[i], NULL};
        r = NULL;
        cr_expect_lt(sbx_exec_reply(c, "u-1", &o, &r, &err), 0);
        cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s", bad[i]);
        cr_expect(strstr(err.message, bad[i]) != NULL, "%s", err.message);
        cr_expect_null(r);
        sbx_exec_result res;
        cr_expect_lt(sbx_exec(c, "u-1", &o, &res, &err), 0);
        cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s", bad[i]);
        sbx_exec_result_free(&res);
    }
    sbx_client_close(c);
}

Test(client_api, client_side_failures_have_their_own_names)
{
    sbx_client *c = NULL;
    sbx_error err;
    int rc = sbx_client_open(&c, "inproc://sbx-test-nobody-listens", &err);
    cr_expect_lt(rc, 0);
    cr_expect_str_eq(err.code, "GATEWAY_UNAVAILABLE");
    cr_expect(strstr(err.message, "inproc://sbx-test-nobody-listens") != NULL, "%s",
              err.message);
    cr_expect_null(c);
    char *data = NULL;
    size_t len;
    cr_expect_lt(sbx_base64_to_bytes("!!!", 3, &data, &len), 0);
    cr_assert_eq(sbx_base64_to_bytes("YQBi", 4, &data, &len), 0);
    cr_expect(len == 3 && !memcmp(data, "a\0b", 3));
    free(data);
}
