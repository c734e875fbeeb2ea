/*
 * test_ops.c — the operation table generated from runtime/ops.yaml and the
 * one intake check gateways and shards share (runtime/ops.h):
 *
 *  - the table: every op has a unique id equal to its index, the dispatch
 *    tables name a handler for every shard-layer sandbox op and none for
 *    agent ops, and the agent's private ops (bind, counters) are not in it;
 *  - sbx_op_intake on whole requests (JSON → msgpack, as the HTTP front
 *    sends them): an unknown op, an internal op from a client, a sandbox op
 *    without a sandbox, a deadline over the ceiling;
 *  - sbx_op_check_args: a missing required argument, a wrong type, a bound
 *    (min/max, max_len), an argument's own error code (port →
 *    INVALID_PORT_NUMBER), nil as absent, integral floats as integers, and
 *    unknown arguments ignored.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <string.h>

#include "actors/ops_gen.h"
#include "runtime/err.h"
#include "runtime/json.h"
#include "runtime/ops.h"
#include "runtime/wire.h"

/* A request decoded from JSON: {v, id, op, sandbox?, timeoutMs?, args?}. */
struct treq {
    sbx_msg msg;
    struct sbx_req req;
    char *buf;
};

static void
treq_make(struct treq *t, const char *json)
{
    json_error_t je;
    json_t *j = json_loads(json, 0, &je);
    cr_assert_not_null(j, "bad test JSON %s: %s", json, je.text);
    sbx_enc e;
    sbx_enc_init(&e);
    cr_assert_eq(sbx_json_to_msgpack(j, &e), 0);
    json_decref(j);
    size_t len;
    cr_assert_eq(sbx_enc_finish(&e, &t->buf, &len), 0);
    cr_assert_eq(sbx_wire_decode(&t->msg, t->buf, len, &sbx_wire_limits_request), 0);
    char why[256];
    cr_assert_eq(sbx_wire_parse_req(t->msg.root, &t->req, why, sizeof(why)), 0, "%s", why);
}

static void
treq_free(struct treq *t)
{
    sbx_wire_msg_free(&t->msg);
    free(t->buf);
}

/* intake — sbx_op_intake of a request built from json; why is filled. */
static int
intake(const char *json, bool from_client, char *why, size_t whylen)
{
    struct treq t;
    const struct sbx_op_def *def = NULL;
    treq_make(&t, json);
    why[0] = '\0';
    int rc = sbx_op_intake(&t.req, from_client, &def, why, whylen);
    if (rc != SBX_E_UNKNOWN_OP)
        cr_expect_not_null(def, "a known op is named even when refused");
    treq_free(&t);
    return rc;
}

#define REQ(op, rest) "{\"v\":1,\"id\":\"r1\",\"op\":\"" op "\"" rest "}"

Test(ops, table_ids_and_dispatch_tables_match_the_schema)
{
    size_t n = 0;
    for (const struct sbx_op_def *d = sbx_ops; d->name; d++, n++) {
        cr_expect_eq((size_t)d->id, n, "%s: id %d at index %zu", d->name, d->id, n);
        cr_expect_eq(sbx_op_find(d->name, strlen(d->name)), d);
        bool agent = d->flags & SBX_OP_AGENT;
        bool sandbox = d->flags & SBX_OP_SANDBOX;
        if (agent)
            cr_expect_null(actor_ops[d->id], "%s is the agent's", d->name);
        if (sandbox && !agent)
            cr_expect_not_null(actor_ops[d->id], "%s has no actor handler", d->name);
        for (unsigned i = 0; i < d->nargs; i++)
            cr_expect_not_null(d->args[i].name);
    }
    cr_expect_eq(n, (size_t)SBX_OPID__COUNT);
    cr_expect_null(sbx_op_find("bind", 4), "the agent's private ops are not for clients");
    cr_expect_null(sbx_op_find("counters", 8));
    cr_expect_not_null(sbx_op_find("sandbox.labels", strlen("sandbox.labels")));
}

Test(ops, intake_envelope_rules)
{
    char why[256];
    cr_expect_eq(intake(REQ("nope", ",\"sandbox\":\"s\""), true, why, sizeof(why)),
                 SBX_E_UNKNOWN_OP);
    cr_expect(strstr(why, "unknown operation 'nope'"), "%s", why);
    /* partition.import is between shards: unknown to clients, known to peers. */
    cr_expect_eq(intake(REQ("partition.import", ""), true, why, sizeof(why)), SBX_E_UNKNOWN_OP);
    cr_expect_eq(intake(REQ("partition.import", ",\"args\":{\"from\":\"s0\",\"partitions\":[1],"
                                                "\"records\":[]}"),
                        false, why, sizeof(why)),
                 0, "%s", why);
    cr_expect_eq(intake(REQ("partition.import", ""), false, why, sizeof(why)), SBX_E_VALIDATION);
    cr_expect(strstr(why, "partition.import needs 'from'"), "%s", why);
    cr_expect_eq(intake(REQ("exec", ",\"args\":{\"command\":\"true\"}"), true, why, sizeof(why)),
                 SBX_E_VALIDATION);
    cr_expect(strstr(why, "needs a 'sandbox' ID"), "%s", why);
    cr_expect_eq(intake(REQ("list", ""), true, why, sizeof(why)), 0, "%s", why);
    cr_expect_eq(intake(REQ("exec", ",\"sandbox\":\"s\",\"timeoutMs\":999999999999"), true, why,
                        sizeof(why)),
                 SBX_E_VALIDATION);
    cr_expect(strstr(why, "timeoutMs"), "%s", why);
    cr_expect_eq(intake(REQ("exec", ",\"sandbox\":\"s\",\"args\":{\"command\":\"true\"}"), true,
                        why, sizeof(why)),
                 0, "%s", why);
}

Test(ops, argument_rules_from_the_schema)
{
    char why[256];
    /* required */
    cr_expect_eq(intake(REQ("session.get", ",\"sandbox\":\"s\""), true, why, sizeof(why)),
                 SBX_E_VALIDATION);
    cr_expect(strstr(why, "session.get needs 'id'"), "%s", why);
    /* nil counts as absent */
    cr_expect_eq(intake(REQ("session.get", ",\"sandbox\":\"s\",\"args\":{\"id\":null}"), true, why,
                        sizeof(why)),
                 SBX_E_VALIDATION);
    /* type */
    cr_expect_eq(intake(REQ("exec", ",\"sandbox\":\"s\",\"args\":{\"command\":5}"), true, why,
                        sizeof(why)),
                 SBX_E_VALIDATION);
    cr_expect(strstr(why, "'command' must be a string"), "%s", why);
    cr_expect_eq(intake(REQ("exec", ",\"sandbox\":\"s\",\"args\":{\"sessionless\":\"yes\"}"), true,
                        why, sizeof(why)),
                 SBX_E_VALIDATION);
    cr_expect(strstr(why, "'sessionless' must be a boolean"), "%s", why);
    /* bounds: a duration over 24 h, a negative one */
    cr_expect_eq(intake(REQ("process.waitForExit",
                            ",\"sandbox\":\"s\",\"args\":{\"processId\":\"p\",\"timeout\":-1}"),
                        true, why, sizeof(why)),
                 SBX_E_VALIDATION);
    cr_expect_eq(intake(REQ("git.checkout", ",\"sandbox\":\"s\",\"args\":{\"repoUrl\":\"u\","
                                            "\"cloneTimeoutMs\":86400001}"),
                        true, why, sizeof(why)),
                 SBX_E_VALIDATION);
    /* max_len of a map (the Labels type: 64 entries) */
    char big[2048];
    size_t o = (size_t)snprintf(big, sizeof(big), REQ("sandbox.labels", ",\"sandbox\":\"s\","
                                                      "\"args\":{\"labels\":{"));
    o -= 1; /* drop REQ's closing brace */
    for (int i = 0; i < 65; i++)
        o += (size_t)snprintf(big + o, sizeof(big) - o, "%s\"k%d\":\"v\"", i ? "," : "", i);
    snprintf(big + o, sizeof(big) - o, "}}}");
    cr_expect_eq(intake(big, true, why, sizeof(why)), SBX_E_VALIDATION);
    cr_expect(strstr(why, "'labels' has 65 entries, more than the limit of 64"), "%s", why);
    /* an argument's own code */
    cr_expect_eq(intake(REQ("port.expose", ",\"sandbox\":\"s\",\"args\":{\"port\":\"http\"}"), true,
                        why, sizeof(why)),
                 SBX_E_INVALID_PORT);
    /* an integral float is an integer; unknown arguments are ignored */
    cr_expect_eq(intake(REQ("exec", ",\"sandbox\":\"s\",\"args\":{\"command\":\"true\","
                                    "\"timeout\":1000.0,\"futureOption\":{\"x\":1}}"),
                        true, why, sizeof(why)),
                 0, "%s", why);
    /* a union: sleepAfter is a duration string or a number of seconds */
    cr_expect_eq(intake(REQ("sandbox.configure", ",\"sandbox\":\"s\",\"args\":{\"sleepAfter\":\"30s\"}"),
                        true, why, sizeof(why)),
                 0, "%s", why);
    cr_expect_eq(intake(REQ("sandbox.configure", ",\"sandbox\":\"s\",\"args\":{\"sleepAfter\":30}"),
                        true, why, sizeof(why)),
                 0, "%s", why);
    cr_expect_eq(intake(REQ("sandbox.configure", ",\"sandbox\":\"s\",\"args\":{\"sleepAfter\":[]}"),
                        true, why, sizeof(why)),
                 SBX_E_VALIDATION);
}
