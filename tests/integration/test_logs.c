/*
 * test_logs.c — `sbxd dev --log-format json` (issue 17; docs/operations.md
 * "Logs"): a second private daemon, started by this test with
 * SBX_LOG=debug, writes its log as JSON lines; every line of the log parses
 * as one JSON object with time, level, component and message, and the
 * request id the client chose appears in lines of the gateway and of a shard
 * about that request (with its sandbox and operation) — and, for an agent
 * operation, in the line of the sandbox's agent (PID 1 of the container,
 * which logs to the shard's stderr in the shard's format).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"

Test(logs, json_lines_carry_the_request_id_through_gateway_shard_and_agent)
{
    struct testd d = {0};
    const char *extra[] = {TESTD_SMALL, "--log-format", "json", NULL};
    setenv("SBX_LOG", "debug", 1);
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev --log-format json did not start");
    unsetenv("SBX_LOG");
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    char *id = test_id("logs");
    char rid[80];
    snprintf(rid, sizeof(rid), "log-test-%d", (int)getpid());
    sbx_reply *r = NULL;
    int rc = sbx_call_json(c, "exec", id, "{\"command\":\"echo hi\"}", 60000, &r, &err);
    cr_assert_eq(rc, 0, "exec: %s", rc ? err.message : "");
    sbx_reply_free(r);
    /* The request whose id we choose. */
    rc = sbx_call(c, "status", id, NULL, 0, 60000, rid, &r, &err);
    cr_assert_eq(rc, 0, "status: %s", rc ? err.message : "");
    sbx_reply_free(r);
    /* An agent operation whose id we choose: it reaches the agent. */
    char xrid[96];
    snprintf(xrid, sizeof(xrid), "log-test-exec-%d", (int)getpid());
    static const char xargs[] = "\x81\xa7" "command" "\xa4" "true"; /* {command: "true"} */
    rc = sbx_call(c, "exec", id, xargs, sizeof(xargs) - 1, 60000, xrid, &r, &err);
    cr_assert_eq(rc, 0, "exec: %s", rc ? err.message : "");
    sbx_reply_free(r);
    sbx_client_close(c);

    char *log = NULL;
    size_t n = 0;
    cr_assert_eq(sbx_fs_read(d.log, 16 << 20, &log, &n), 0);
    int lines = 0, gw_lines = 0, shard_lines = 0, agent_lines = 0;
    for (char *p = log, *nl; (nl = memchr(p, '\n', n - (size_t)(p - log))) != NULL; p = nl + 1) {
        json_error_t je;
        json_t *j = json_loadb(p, (size_t)(nl - p), 0, &je);
        cr_assert(j && json_is_object(j), "log line %d is not a JSON object (%s): %.*s",
                  lines + 1, j ? "not an object" : je.text, (int)(nl - p), p);
        lines++;
        for (const char *const *k = (const char *const[]){"time", "level", "component",
                                                           "message", NULL};
             *k; k++)
            cr_assert(json_is_string(json_object_get(j, *k)), "line %d has no %s", lines, *k);
        const char *r_id = json_string_value(json_object_get(j, "requestId"));
        const char *comp = json_string_value(json_object_get(j, "component"));
        if (r_id && !strcmp(r_id, rid)) {
            cr_expect_str_eq(json_string_value(json_object_get(j, "sandbox")), id);
            cr_expect_str_eq(json_string_value(json_object_get(j, "op")), "status");
            if (strstr(comp, "shard"))
                shard_lines++;
            else
                gw_lines++;
        }
        if (r_id && !strcmp(r_id, xrid) && !strcmp(comp, "sbx-agent")) {
            cr_expect_str_eq(json_string_value(json_object_get(j, "sandbox")), id);
            cr_expect_str_eq(json_string_value(json_object_get(j, "op")), "exec");
            cr_expect(strstr(json_string_value(json_object_get(j, "message")), "answered OK"),
                      "agent line: %s", json_string_value(json_object_get(j, "message")));
            agent_lines++;
        }
        json_decref(j);
    }
    testd_stop(&d);
    cr_expect_gt(lines, 3, "the log has %d lines", lines);
    cr_expect_gt(gw_lines, 0, "no gateway line names request %s", rid);
    cr_expect_gt(shard_lines, 0, "no shard line names request %s", rid);
    cr_expect_gt(agent_lines, 0, "no line of the sandbox's agent names request %s", xrid);
    free(log);
    free(id);
}
