/*
 * test_cli_schema.c — the part of the `sbx` CLI generated from the schema
 * (runtime/ops.yaml → tools/cli_ops_gen.c, used by tools/cli_schema.c): the
 * operations listed by `sbx help`, an op's arguments by `sbx help OP`, and
 * `sbx call OP ID JSON` refusing bad arguments before it sends anything.
 *
 * The rules are the gateway's: every bad call is made twice, by the CLI
 * against an address where nothing listens (so a refusal there was decided
 * before connecting: nothing was sent) and by the client library against the
 * test daemon, and the CLI must print the gateway's own code and message.
 * Good arguments (unknown members included) pass the check and run.
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../support/clirun.h"
#include "../support/sdk.h"

static char *made[4];
static int nmade;

/* new_id — a unique sandbox ID, destroyed by the suite's .fini. */
static const char *
new_id(const char *prefix)
{
    cr_assert_lt(nmade, (int)SBX_ARRAY_LEN(made));
    made[nmade] = test_id(prefix);
    return made[nmade++];
}

static void
cleanup(void)
{
    cli_reap_all();
    if (nmade == 0)
        return;
    sbx_client *c = test_client();
    for (int i = 0; i < nmade; i++) {
        sbx_destroy(c, made[i], NULL, NULL);
        free(made[i]);
    }
    nmade = 0;
    sbx_client_close(c);
}

TestSuite(cli_schema, .fini = cleanup);

/* nowhere — a gateway address where nothing listens (a socket path in a
 * directory that does not exist). */
static const char *
nowhere(void)
{
    static char gw[128];
    snprintf(gw, sizeof(gw), "ipc:///tmp/sbx-cli-schema-nowhere-%d/gw.sock", (int)getpid());
    return gw;
}

/* the line of `text` that starts with `start` (after spaces), copied into
 * out; false when there is none. */
static bool
line_starting(const char *text, const char *start, char *out, size_t n)
{
    for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *q = p;
        while (*q == ' ')
            q++;
        if (!strncmp(q, start, strlen(start))) {
            size_t len = strcspn(q, "\n");
            snprintf(out, n, "%.*s", (int)len, q);
            return true;
        }
    }
    return false;
}

Test(cli_schema, help_lists_the_operations_a_client_can_send, .timeout = 120)
{
    struct cli r = cli_run(nowhere(), NULL, 0, (const char *const[]){"help", NULL});
    expect_status(r, 0);
    expect_out_has(r, "operations");
    /* Ops of every family, by their wire names, each with a summary. */
    const char *ops[] = {"exec", "session.create", "process.start", "file.read",
                         "context.run", "sandbox.labels", "cluster.drain", "destroy"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ops); i++) {
        char want[64], line[512];
        snprintf(want, sizeof(want), "%s ", ops[i]);
        cr_expect(line_starting(r.o.p, want, line, sizeof(line)), "help lacks %s:\n%s", ops[i],
                  r.o.p);
        cr_expect_gt(strlen(line), strlen(want) + 3, "%s has no summary: '%s'", ops[i], line);
    }
    /* Not the shards' internal ops, which the gateway refuses from clients. */
    expect_out_lacks(r, "partition.import");
    /* A verb that runs one op is summed up by that op's summary. */
    char op_line[512], verb_line[512];
    cr_assert(line_starting(r.o.p, "file.list ", op_line, sizeof(op_line)));
    cr_assert(line_starting(r.o.p, "ls ", verb_line, sizeof(verb_line)));
    const char *op_sum = op_line + strlen("file.list");
    const char *verb_sum = verb_line + strlen("ls");
    op_sum += strspn(op_sum, " ");
    verb_sum += strspn(verb_sum, " ");
    cr_expect_str_eq(verb_sum, op_sum, "verb ls: '%s', op file.list: '%s'", verb_sum, op_sum);
    /* --help prints the same. */
    struct cli h = cli_run(nowhere(), NULL, 0, (const char *const[]){"--help", NULL});
    expect_status(h, 0);
    cr_expect_str_eq(h.o.p, r.o.p);
    cli_free(&h);
    cli_free(&r);
}

Test(cli_schema, help_op_lists_its_arguments_with_units_bounds_and_defaults, .timeout = 120)
{
    struct cli r = cli_run(nowhere(), NULL, 0, (const char *const[]){"help", "exec", NULL});
    expect_status(r, 0);
    expect_out_has(r, "usage: sbx exec ID");
    expect_out_has(r, "sbx call exec ID");
    char line[512];
    cr_expect(line_starting(r.o.p, "timeout ", line, sizeof(line)), "%s", r.o.p);
    cr_expect(strstr(line, "an integer") && strstr(line, "from 0 to 86400000 ms"),
              "timeout: '%s'", line);
    cr_expect(line_starting(r.o.p, "sessionless ", line, sizeof(line)), "%s", r.o.p);
    cr_expect(strstr(line, "a boolean") && strstr(line, "default false"), "sessionless: '%s'",
              line);
    cli_free(&r);
    /* `sbx VERB --help` shows the op's arguments too. */
    r = cli_run(nowhere(), NULL, 0, (const char *const[]){"exec", "--help", NULL});
    expect_status(r, 0);
    expect_out_has(r, "sessionless");
    cli_free(&r);
    /* An op by its wire name: required arguments say so. */
    r = cli_run(nowhere(), NULL, 0, (const char *const[]){"help", "file.read", NULL});
    expect_status(r, 0);
    cr_expect(line_starting(r.o.p, "path ", line, sizeof(line)), "%s", r.o.p);
    cr_expect(strstr(line, "required") != NULL, "path: '%s'", line);
    cli_free(&r);
    /* A bounded collection states its bound. */
    r = cli_run(nowhere(), NULL, 0, (const char *const[]){"help", "sandbox.labels", NULL});
    expect_status(r, 0);
    cr_expect(line_starting(r.o.p, "labels ", line, sizeof(line)), "%s", r.o.p);
    cr_expect(strstr(line, "at most 64 entries") != NULL, "labels: '%s'", line);
    cli_free(&r);
    /* A verb of several ops lists them. */
    r = cli_run(nowhere(), NULL, 0, (const char *const[]){"help", "wait", NULL});
    expect_status(r, 0);
    expect_out_has(r, "usage: sbx wait ID PROCESS");
    cr_expect(line_starting(r.o.p, "sbx wait --port ", line, sizeof(line)), "%s", r.o.p);
    cr_expect(strstr(line, "process.waitForPort") != NULL, "wait --port: '%s'", line);
    cli_free(&r);
    r = cli_run(nowhere(), NULL, 0, (const char *const[]){"help", "no.such", NULL});
    expect_status(r, 2);
    expect_err_has(r, "no.such");
    cli_free(&r);
}

/* One bad call: op, sandbox ("-": none), JSON args. */
struct bad {
    const char *op, *sandbox, *args;
    const char *field; /* what the message must name (NULL: nothing to name) */
};

Test(cli_schema, call_refuses_bad_arguments_as_the_gateway_does_before_sending, .timeout = 240)
{
    const char *id = new_id("cli-schema-bad");
    char many[2048] = "{\"labels\":{";
    for (int i = 0; i < 65; i++)
        snprintf(many + strlen(many), sizeof(many) - strlen(many), "%s\"k%d\":\"v\"",
                 i ? "," : "", i);
    strcat(many, "}}");
    const struct bad bad[] = {
        {"no.such", id, "{}", "no.such"},
        {"partition.import", id, "{}", "partition.import"},  /* internal */
        {"file.read", id, "{}", "path"},                     /* required */
        {"file.read", id, "{\"path\":null}", "path"},        /* null is absent */
        {"exec", id, "{\"command\":3}", "command"},           /* type */
        {"exec", id, "{\"command\":\"true\",\"timeout\":-1}", "timeout"},   /* durations */
        {"exec", id, "{\"command\":\"true\",\"timeout\":9e12}", "timeout"}, /* durations */
        {"exec", id, "{\"command\":\"true\",\"timeout\":1.5}", "timeout"},  /* not integral */
        {"stream.read", id, "{\"streamId\":\"s1\",\"after\":-2}", "after"},   /* min */
        {"exec", id, "{\"command\":\"true\",\"sessionless\":\"yes\"}", "sessionless"},
        {"exec", "-", "{\"command\":\"true\"}", "sandbox"},  /* needs an ID */
        {"exec", id, "[1]", NULL},                           /* not an object */
        {"exec", id, "{\"command\":", NULL},                 /* not JSON */
        {"port.expose", id, "{\"port\":\"http\"}", "port"},  /* its own code */
        {"sandbox.labels", id, many, "labels"},              /* max_len */
    };
    sbx_client *c = test_client();
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        const struct bad *b = &bad[i];
        struct cli r = cli_run(nowhere(), NULL, 0,
                               (const char *const[]){"call", b->op, b->sandbox, b->args, NULL});
        /* The gateway's answer to the same call. */
        sbx_reply *rep = NULL;
        sbx_error err = {0};
        int rc = sbx_call_json(c, b->op, strcmp(b->sandbox, "-") ? b->sandbox : NULL, b->args,
                               30000, &rep, &err);
        cr_expect_neq(rc, 0, "the gateway accepted %s %s", b->op, b->args);
        if (rc == 0) {
            sbx_reply_free(rep);
            cli_free(&r);
            continue;
        }
        char want[1024];
        snprintf(want, sizeof(want), "sbx: %s: %s\n", err.code, err.message);
        expect_status(r, 1);
        expect_err(r, want);
        expect_out(r, "");
        if (b->field)
            expect_err_has(r, b->field);
        sbx_error_free(&err);
        cli_free(&r);
    }
    /* None of them created the sandbox. */
    sbx_reply *rep = NULL;
    sbx_error err = {0};
    cr_expect_neq(sbx_call_json(c, "status", id, NULL, 30000, &rep, &err), 0);
    cr_expect_str_eq(err.code, "SANDBOX_NOT_FOUND");
    sbx_error_free(&err);
    sbx_client_close(c);
}

Test(cli_schema, call_with_good_arguments_is_sent_and_runs, .timeout = 240)
{
    const char *id = new_id("cli-schema-good");
    /* Unknown members are ignored. */
    const char *args = "{\"command\":\"echo hi\",\"timeout\":30000,\"colour\":\"blue\"}";
    /* Checked, then sent: where nothing listens, the gateway is unreachable. */
    struct cli r =
        cli_run(nowhere(), NULL, 0, (const char *const[]){"call", "exec", id, args, NULL});
    expect_status(r, 125);
    expect_err_has(r, "GATEWAY_UNAVAILABLE");
    cli_free(&r);
    r = sbx("call", "exec", id, args);
    expect_status(r, 0);
    json_t *j = json_of(&r);
    cr_expect_str_eq(jstr(j, "stdout"), "hi\n");
    cr_expect_eq(jint(j, "exitCode"), 0);
    json_decref(j);
    cli_free(&r);
    /* An op without arguments, and one with no sandbox. */
    r = sbx("call", "ping", id);
    expect_status(r, 0);
    cli_free(&r);
    r = sbx("--json", "call", "cluster.status", "-");
    expect_status(r, 0);
    j = json_of(&r);
    cr_expect(json_is_array(jget(j, "shards")), "%s", r.o.p);
    json_decref(j);
    cli_free(&r);
}
