/*
 * test_labels.c — sandbox.labels (docs/protocol.md §3.6), the operation added
 * through runtime/ops.yaml and its handler only (docs/schema.md): labels set
 * are read back, replaced as a whole, bounded (64 labels, keys 1-63 bytes of
 * [A-Za-z0-9._-], values up to 255 bytes) with VALIDATION_FAILED and no
 * change, and kept across a restart of the shard.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../support/harness.h"

/* labels_call — sandbox.labels with args_json (NULL: a read); the result
 * as compact JSON (heap), or NULL with *err filled. */
static char *
labels_call(sbx_client *c, const char *id, const char *args_json, sbx_error *err)
{
    sbx_reply *r = NULL;
    if (sbx_call_json(c, "sandbox.labels", id, args_json ? args_json : "{}", 30000, &r, err) != 0)
        return NULL;
    char *json = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return json;
}

/* expect_labels — a read of id answers exactly {"labels": want}. */
static void
expect_labels(sbx_client *c, const char *id, const char *want)
{
    sbx_error err = {0};
    char *got = labels_call(c, id, NULL, &err);
    cr_assert_not_null(got, "read labels of %s: %s %s", id, err.code, err.message);
    char exp[4096];
    snprintf(exp, sizeof(exp), "{\"labels\":%s}", want);
    cr_expect_str_eq(got, exp);
    free(got);
    sbx_error_free(&err);
}

/* expect_refused — setting args_json answers VALIDATION_FAILED whose message
 * holds `why`. */
static void
expect_refused(sbx_client *c, const char *id, const char *args_json, const char *why)
{
    sbx_error err = {0};
    char *got = labels_call(c, id, args_json, &err);
    cr_expect_null(got, "accepted: %s -> %s", args_json, got ? got : "");
    free(got);
    cr_expect_str_eq(err.code, "VALIDATION_FAILED", "%s: %s", args_json, err.message);
    cr_expect(strstr(err.message, why) != NULL, "message '%s' lacks '%s'", err.message, why);
    sbx_error_free(&err);
}

/* destroy — remove a sandbox the test created. */
static void
destroy(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_expect_eq(sbx_call(c, "destroy", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
}

Test(labels, set_read_back_and_replace)
{
    sbx_client *c = test_client();
    char *id = test_id("labels");
    sbx_error err = {0};
    char *got = labels_call(c, id, "{\"labels\":{\"team\":\"data\",\"env\":\"prod\"}}", &err);
    cr_assert_not_null(got, "%s %s", err.code, err.message);
    cr_expect(strstr(got, "\"team\":\"data\"") && strstr(got, "\"env\":\"prod\""), "%s", got);
    free(got);
    expect_labels(c, id, "{\"team\":\"data\",\"env\":\"prod\"}");
    /* A set replaces the whole map, as setLabels does. */
    got = labels_call(c, id, "{\"labels\":{\"owner\":\"ana\"}}", &err);
    cr_assert_not_null(got, "%s %s", err.code, err.message);
    free(got);
    expect_labels(c, id, "{\"owner\":\"ana\"}");
    got = labels_call(c, id, "{\"labels\":{}}", &err);
    cr_assert_not_null(got, "%s %s", err.code, err.message);
    free(got);
    expect_labels(c, id, "{}");
    /* Labels are the sandbox's: another sandbox has none of them. */
    char *other = test_id("labels");
    got = labels_call(c, other, "{\"labels\":{\"x\":\"1\"}}", &err);
    cr_assert_not_null(got, "%s %s", err.code, err.message);
    free(got);
    expect_labels(c, id, "{}");
    expect_labels(c, other, "{\"x\":\"1\"}");
    destroy(c, id);
    destroy(c, other);
    sbx_error_free(&err);
    free(other);
    free(id);
    sbx_client_close(c);
}

Test(labels, reading_an_unknown_sandbox_is_not_found_and_creates_nothing)
{
    sbx_client *c = test_client();
    char *id = test_id("nolabels");
    sbx_error err = {0};
    char *got = labels_call(c, id, NULL, &err);
    cr_expect_null(got);
    free(got);
    cr_expect_str_eq(err.code, "SANDBOX_NOT_FOUND", "%s", err.message);
    sbx_error_free(&err);
    sbx_reply *r = NULL;
    cr_expect_neq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0);
    cr_expect_str_eq(err.code, "SANDBOX_NOT_FOUND");
    sbx_error_free(&err);
    free(id);
    sbx_client_close(c);
}

Test(labels, bounds_are_refused_and_change_nothing)
{
    sbx_client *c = test_client();
    char *id = test_id("labels");
    sbx_error err = {0};
    char *got = labels_call(c, id, "{\"labels\":{\"keep\":\"me\"}}", &err);
    cr_assert_not_null(got, "%s %s", err.code, err.message);
    free(got);

    /* 65 labels: one over the schema's bound (checked at the intake). */
    char many[4096];
    size_t o = (size_t)snprintf(many, sizeof(many), "{\"labels\":{");
    for (int i = 0; i < 65; i++)
        o += (size_t)snprintf(many + o, sizeof(many) - o, "%s\"k%d\":\"v\"", i ? "," : "", i);
    snprintf(many + o, sizeof(many) - o, "}}");
    expect_refused(c, id, many, "'labels' has 65 entries, more than the limit of 64");

    /* A key of 64 bytes, a value of 256, a key with a space, a non-string value. */
    char k64[65], v256[257], buf[1024];
    memset(k64, 'k', 64);
    k64[64] = '\0';
    memset(v256, 'v', 256);
    v256[256] = '\0';
    snprintf(buf, sizeof(buf), "{\"labels\":{\"%s\":\"x\"}}", k64);
    expect_refused(c, id, buf, "label key must be 1-63 bytes");
    snprintf(buf, sizeof(buf), "{\"labels\":{\"big\":\"%s\"}}", v256);
    expect_refused(c, id, buf, "at most 255 bytes");
    expect_refused(c, id, "{\"labels\":{\"a b\":\"x\"}}", "label key must be");
    expect_refused(c, id, "{\"labels\":{\"n\":5}}", "must have a string value");
    expect_refused(c, id, "{\"labels\":\"team=data\"}", "'labels' must be an object");

    /* The limits themselves are fine: 64 labels, a 63-byte key, a 255-byte value. */
    o = (size_t)snprintf(many, sizeof(many), "{\"labels\":{");
    for (int i = 0; i < 63; i++)
        o += (size_t)snprintf(many + o, sizeof(many) - o, "\"k%d\":\"v\",", i);
    snprintf(many + o, sizeof(many) - o, "\"%.63s\":\"%.255s\"}}", k64, v256);
    got = labels_call(c, id, many, &err);
    cr_expect_not_null(got, "64 labels at the bounds: %s %s", err.code, err.message);
    free(got);

    /* Every refused call left the labels as they were before it. */
    got = labels_call(c, id, "{\"labels\":{\"keep\":\"me\"}}", &err);
    free(got);
    expect_refused(c, id, "{\"labels\":{\"ok\":\"1\",\"bad key\":\"2\"}}", "label key");
    expect_labels(c, id, "{\"keep\":\"me\"}");
    destroy(c, id);
    sbx_error_free(&err);
    free(id);
    sbx_client_close(c);
}

Test(labels, survive_a_shard_restart, .timeout = 180)
{
    struct testd d;
    const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0);
    sbx_client *c;
    sbx_error err = {0};
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    char *got = labels_call(c, "kept-labels", "{\"labels\":{\"tier\":\"gold\"}}", &err);
    cr_assert_not_null(got, "%s %s", err.code, err.message);
    free(got);
    /* Other record changes (sandbox.configure) keep the labels. */
    sbx_reply *r = NULL;
    cr_assert_eq(sbx_call_json(c, "sandbox.configure", "kept-labels", "{\"keepAlive\":true}", 0,
                               &r, &err), 0, "%s", err.message);
    sbx_reply_free(r);
    sbx_client_close(c);
    cr_assert_eq(testd_restart(&d, 1, extra), 0);
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    expect_labels(c, "kept-labels", "{\"tier\":\"gold\"}");
    cr_assert_eq(sbx_call(c, "destroy", "kept-labels", NULL, 0, 0, NULL, &r, &err), 0);
    sbx_reply_free(r);
    sbx_error_free(&err);
    sbx_client_close(c);
    testd_stop(&d);
}
