/*
 * test_log.c — unit tests of runtime/log.h's JSON lines (sbxd --log-format
 * json; docs/operations.md "Logs"): every line parses as one JSON object
 * (jansson) with time, level, component, pid, sandbox, op, requestId and
 * message; quotes, backslashes, control characters and invalid UTF-8 in any
 * field come back as the parser reads them; a message too long for a line
 * is cut and the line still parses; lines written through sbx_log_req to
 * stderr are one object each.  The text format keeps its shape and names
 * the request.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/log.h"

static json_t *
parse_line(const char *line, size_t n)
{
    cr_assert(n > 0 && line[n - 1] == '\n', "a line ends with a newline");
    cr_assert_null(memchr(line, '\n', n - 1), "one line only: %s", line);
    json_error_t e;
    json_t *j = json_loadb(line, n - 1, JSON_REJECT_DUPLICATES, &e);
    cr_assert(j, "not JSON (%s): %s", e.text, line);
    cr_assert(json_is_object(j));
    return j;
}

static const char *
str(json_t *j, const char *k)
{
    const char *v = json_string_value(json_object_get(j, k));
    cr_assert(v, "no string member %s", k);
    return v;
}

Test(log, json_fields_and_escaping)
{
    char line[4096];
    static const char rid[] = "rid-\"1\"";
    static const char sb[] = "box-1";
    struct sbx_log_req r = {rid, strlen(rid), sb, strlen(sb), "exec", 4};
    /* 2026-11-22T10:00:00.123Z */
    long long t = 1795341600123LL;
    const char *msg = "quote \" back \\ nl \n tab \t bell \a del \x7f bad \xff\xfe end \xc3\xa9";
    size_t n = sbx_log_format_line(line, sizeof(line), 1, t, SBX_LOG_WARN, "sbxd shard s0", 42, &r,
                                   msg);
    json_t *j = parse_line(line, n);
    cr_expect_str_eq(str(j, "time"), "2026-11-22T10:00:00.123Z");
    cr_expect_str_eq(str(j, "level"), "warn");
    cr_expect_str_eq(str(j, "component"), "sbxd shard s0");
    cr_expect_eq(json_integer_value(json_object_get(j, "pid")), 42);
    cr_expect_str_eq(str(j, "sandbox"), "box-1");
    cr_expect_str_eq(str(j, "op"), "exec");
    cr_expect_str_eq(str(j, "requestId"), "rid-\"1\"");
    /* Every byte comes back except the invalid ones, each now U+FFFD. */
    cr_expect_str_eq(str(j, "message"), "quote \" back \\ nl \n tab \t bell \a del \x7f bad "
                                        "\xef\xbf\xbd\xef\xbf\xbd end \xc3\xa9");
    /* Control characters never appear raw. */
    for (size_t i = 0; i + 1 < n; i++)
        cr_expect((unsigned char)line[i] >= 0x20, "raw control byte 0x%02x at %zu",
                  (unsigned char)line[i], i);
    json_decref(j);
}

Test(log, json_without_a_request_has_no_request_fields)
{
    char line[512];
    size_t n = sbx_log_format_line(line, sizeof(line), 1, 0, SBX_LOG_INFO, "sbxd dev", 1, NULL,
                                   "ready");
    json_t *j = parse_line(line, n);
    cr_expect_str_eq(str(j, "level"), "info");
    cr_expect_str_eq(str(j, "time"), "1970-01-01T00:00:00.000Z");
    cr_expect_null(json_object_get(j, "requestId"));
    cr_expect_null(json_object_get(j, "sandbox"));
    cr_expect_str_eq(str(j, "message"), "ready");
    json_decref(j);
}

Test(log, a_long_message_is_cut_and_still_parses)
{
    char line[300];
    char msg[2000];
    /* escapes and multi-byte characters right where the cut falls */
    for (size_t i = 0; i + 3 < sizeof(msg); i += 3) {
        msg[i] = '\x01';
        msg[i + 1] = '\xc3';
        msg[i + 2] = '\xa9';
    }
    msg[sizeof(msg) - 1] = 0;
    for (size_t cap = 120; cap <= sizeof(line); cap += 7) {
        size_t n = sbx_log_format_line(line, cap, 1, 0, SBX_LOG_ERROR, "t", 1, NULL, msg);
        cr_assert_lt(n, cap);
        json_t *j = parse_line(line, n);
        cr_expect_str_eq(str(j, "level"), "error");
        json_decref(j);
    }
}

Test(log, text_format_names_the_request)
{
    char line[512];
    struct sbx_log_req r = {"r1", 2, "box", 3, "exec", 4};
    sbx_log_format_line(line, sizeof(line), 0, 1795341600123LL, SBX_LOG_DEBUG, "sbxd gateway", 7,
                        &r, "routed");
    cr_expect_str_eq(line, "2026-11-22T10:00:00.123Z sbxd gateway[7] D: [rid=r1 sandbox=box "
                           "op=exec] routed\n");
}

Test(log, set_format_and_stderr_lines)
{
    char path[] = "/tmp/sbx-log-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(sbx_log_set_format("yaml"), -EINVAL);
    cr_assert_eq(sbx_log_set_format("json"), 0);
    sbx_log_init("sbxd test", SBX_LOG_DEBUG);
    int saved = dup(STDERR_FILENO);
    dup2(fd, STDERR_FILENO);
    struct sbx_log_req r = {"abc", 3, NULL, 0, "list", 4};
    sbx_log_req(SBX_LOG_DEBUG, &r, "line %d", 1);
    sbx_log_info("line %d with \"quotes\"", 2);
    dup2(saved, STDERR_FILENO);
    close(saved);
    sbx_log_set_format("text");
    char buf[4096];
    ssize_t n = pread(fd, buf, sizeof(buf) - 1, 0);
    close(fd);
    unlink(path);
    cr_assert_gt(n, 0);
    buf[n] = 0;
    char *nl = strchr(buf, '\n');
    cr_assert(nl);
    json_t *a = parse_line(buf, (size_t)(nl - buf) + 1);
    json_t *b = parse_line(nl + 1, strlen(nl + 1));
    cr_expect_str_eq(str(a, "requestId"), "abc");
    cr_expect_str_eq(str(a, "op"), "list");
    cr_expect_str_eq(str(a, "message"), "line 1");
    cr_expect_str_eq(str(b, "message"), "line 2 with \"quotes\"");
    cr_expect_str_eq(str(b, "component"), "sbxd test");
    json_decref(a);
    json_decref(b);
}
