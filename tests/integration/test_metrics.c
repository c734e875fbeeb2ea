/*
 * test_metrics.c — GET /metrics (issue 17; docs/operations.md "Metrics") on
 * the test's private `sbxd dev`, checked as a user of Prometheus would:
 *
 *  - the front answers 200 with the 0.0.4 Content-Type, and the text holds
 *    the exec operations this test ran (op="exec", code="OK") and an error
 *    by its code, with no sandbox ID anywhere (bounded labels);
 *  - `promtool check metrics` (Debian's prometheus package) accepts it;
 *  - a real Prometheus, started here on a free loopback port with a temp
 *    config and storage (stopped by pid, its directory removed), scrapes the
 *    front, and PromQL over its HTTP API answers what the test did: every
 *    shard up, at least the execs run.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/harness.h"
#include "../support/httpc.h"

#define EXECS 3

/* A free loopback TCP port (bound then released). */
static int
free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof(a);
    cr_assert(fd >= 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

/* Run EXECS successful execs and one failing op in a fresh sandbox. */
static char *
traffic(void)
{
    sbx_client *c = test_client();
    char *id = test_id("metrics");
    for (int i = 0; i < EXECS; i++) {
        sbx_exec_result r;
        sbx_error err;
        cr_assert_eq(test_sh(c, id, "echo m", 30000, &r, &err), 0, "exec");
        cr_assert_str_eq(r.stdout_data, "m\n");
        sbx_exec_result_free(&r);
    }
    sbx_reply *rep = NULL;
    sbx_error err;
    cr_assert_neq(sbx_call_json(c, "file.read", id, "{\"path\":\"/nonexistent/x\"}", 30000, &rep,
                                &err),
                  0);
    sbx_error_free(&err);
    sbx_client_close(c);
    return id;
}

static char *
scrape(void)
{
    struct hresp r;
    char *url = hfmt("%s/metrics", test_http_url());
    long st = http_req("GET", url, NULL, &r);
    free(url);
    cr_assert_eq(st, 200, "GET /metrics: %ld %s", st, r.err);
    char *ct = hresp_header(&r, "Content-Type");
    cr_assert(ct && !strcmp(ct, "text/plain; version=0.0.4; charset=utf-8"), "Content-Type %s",
              ct ? ct : "(none)");
    free(ct);
    char *text = strndup(r.body ? r.body : "", r.len);
    hresp_free(&r);
    return text;
}

Test(metrics, text_has_the_operations_run_and_passes_promtool)
{
    char *id = traffic();
    char *text = scrape();
    cr_expect(strstr(text, "# TYPE sbx_operation_duration_seconds histogram\n"));
    cr_expect(strstr(text, "op=\"exec\",code=\"OK\",le=\"+Inf\"}"), "no exec OK histogram");
    cr_expect(strstr(text, "op=\"file.read\",code=\"FILE_NOT_FOUND\""), "no error by code");
    cr_expect(strstr(text, "sbx_container_start_seconds_count{shard="));
    cr_expect(strstr(text, "sbx_lmdb_commit_seconds_bucket{shard="));
    cr_expect(strstr(text, "sbx_sandboxes{shard="));
    cr_expect_null(strstr(text, id), "a sandbox ID is a label value");
    /* The execs one after another: each one's intent went through the
     * store's redo log (runtime/store.h sbx_store_put_logged). */
    double logged = 0;
    for (const char *m = text; (m = strstr(m, "\nsbx_lmdb_log_commits_total{shard=")); m++) {
        const char *v = strstr(m, "} ");
        logged += v ? strtod(v + 2, NULL) : 0;
    }
    cr_expect_gt(logged, 0, "no batch was committed through the redo log");

    char path[] = "/tmp/sbx-metrics-XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char *cmd = hfmt("promtool check metrics < %s 2>&1", path);
    FILE *p = popen(cmd, "r");
    char out[4096] = "";
    size_t n = p ? fread(out, 1, sizeof(out) - 1, p) : 0;
    out[n] = 0;
    int rc = p ? pclose(p) : -1;
    unlink(path);
    free(cmd);
    cr_assert_eq(rc, 0, "promtool check metrics (from Debian's prometheus package) refused "
                        "the text:\n%s",
                 out);
    free(text);
    free(id);
}

/* query percent-encoded for a URL (heap). */
static char *
urlq(const char *q)
{
    char *o = malloc(strlen(q) * 3 + 1), *w = o;
    for (const unsigned char *c = (const unsigned char *)q; *c; c++) {
        if ((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9'))
            *w++ = (char)*c;
        else
            w += sprintf(w, "%%%02X", *c);
    }
    *w = 0;
    return o;
}

/* The value of an instant PromQL query's single answer, or -1. */
static double
promql(int port, const char *query)
{
    char *q = urlq(query);
    char *url = hfmt("http://127.0.0.1:%d/api/v1/query?query=%s", port, q);
    free(q);
    struct hresp r;
    double v = -1;
    if (http_req("GET", url, NULL, &r) == 200 && r.json) {
        json_t *res = json_object_get(json_object_get(r.json, "data"), "result");
        json_t *val = json_array_get(json_object_get(json_array_get(res, 0), "value"), 1);
        if (json_is_string(val))
            v = strtod(json_string_value(val), NULL);
    }
    hresp_free(&r);
    free(url);
    return v;
}

Test(metrics, a_real_prometheus_scrapes_and_promql_answers)
{
    char *id = traffic();
    char dir[] = "/tmp/sbx-prom-XXXXXX";
    cr_assert(mkdtemp(dir));
    const char *http = test_http_url() + strlen("http://");
    char *conf = hfmt("%s/prometheus.yml", dir);
    FILE *f = fopen(conf, "w");
    cr_assert(f);
    fprintf(f,
            "global: {scrape_interval: 1s, scrape_timeout: 1s}\n"
            "scrape_configs:\n"
            "  - job_name: sbx\n"
            "    static_configs: [{targets: ['%s']}]\n",
            http);
    fclose(f);
    int port = free_port();
    char *listen = hfmt("--web.listen-address=127.0.0.1:%d", port);
    char *cfarg = hfmt("--config.file=%s", conf);
    char *stor = hfmt("--storage.tsdb.path=%s/data", dir);
    char *log = hfmt("%s/prometheus.log", dir);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (lfd >= 0) {
            dup2(lfd, 1);
            dup2(lfd, 2);
        }
        execlp("prometheus", "prometheus", cfarg, stor, listen, "--web.enable-lifecycle",
               (char *)NULL);
        _exit(127);
    }
    /* Up to 40 s for Prometheus to start and scrape twice. */
    double shards_up = -1, execs = -1;
    for (int i = 0; i < 80; i++) {
        usleep(500 * 1000);
        shards_up = promql(port, "count(sbx_shard_up == 1)");
        execs = promql(port, "sum(sbx_operation_duration_seconds_count{op=\"exec\",code=\"OK\"})");
        if (shards_up >= 1 && execs >= EXECS)
            break;
        if (waitpid(pid, NULL, WNOHANG) == pid) {
            pid = -1;
            break;
        }
    }
    if (pid > 0) {
        kill(pid, SIGTERM);
        waitpid(pid, NULL, 0);
    }
    char *rm = hfmt("rm -rf '%s'", dir);
    cr_expect_eq(system(rm), 0);
    cr_assert(pid > 0, "prometheus exited early (is Debian's prometheus package installed?)");
    /* The test daemon runs 2 shards (tests/support/itest_main.c). */
    cr_expect_eq(shards_up, 2, "PromQL count(sbx_shard_up == 1) = %g", shards_up);
    cr_expect_geq(execs, EXECS, "PromQL sum of exec OK counts = %g", execs);
    free(rm);
    free(listen);
    free(cfarg);
    free(stor);
    free(log);
    free(conf);
    free(id);
}
