/*
 * bench_workspace.c — sbx-bench's wake-up phase (--workspace-wake N,
 * docs/persistence.md): one sandbox with a persistent workspace holding
 * 100 MB (random bytes, so nothing compresses or dedups), sleepAfter 1 s;
 * N times: wait until its container has stopped for idleness (status shows
 * "stopped"), then time the first `exec true` (the wake-up: loop device,
 * ext4 mount, container start, exec).  The same for an ephemeral sandbox
 * with an empty workspace, alternated, for comparison.  Needs a deployment
 * whose --disk exceeds 100 MB (sbxd's default is 1 GiB).  Both sandboxes
 * are destroyed before it returns.
 *
 * The fork phase (--fork N): a running sandbox with a persistent workspace
 * holding 100 MB of random bytes; N times, sandbox.fork into one new ID
 * (in a cluster an ID of another shard, FORK_CROSS_SHARD, is replaced by the next one),
 * timed from the client, and the shard's own copyMs; each fork destroyed.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "stats.h"

static int
call(sbx_client *c, const char *op, const char *id, const char *args, sbx_error *err)
{
    sbx_reply *r = NULL;
    if (sbx_call_json(c, op, id, args, 120000, &r, err) != 0)
        return -1;
    sbx_reply_free(r);
    return 0;
}

/* Wait (≤ 30 s) until id's container has stopped; 0 or -1. */
static int
wait_stopped(sbx_client *c, const char *id, sbx_error *err)
{
    for (int i = 0; i < 300; i++) {
        sbx_reply *r = NULL;
        if (sbx_call_json(c, "status", id, "{}", 60000, &r, err) != 0)
            return -1;
        char *j = sbx_reply_json(r, false);
        sbx_reply_free(r);
        bool stopped = j && strstr(j, "\"state\":\"stopped\"");
        free(j);
        if (stopped)
            return 0;
        usleep(100 * 1000);
    }
    memset(err, 0, sizeof(*err));
    snprintf(err->code, sizeof(err->code), "TIMEOUT");
    snprintf(err->message, sizeof(err->message), "the sandbox did not stop in 30 s");
    return -1;
}

size_t
bench_workspace_run(sbx_client *c, long n, const char *tag, FILE *out,
                    volatile sig_atomic_t *interrupted)
{
    size_t failures = 0;
    sbx_error err;
    char ids[2][128];
    static const char *const modes[2] = {"persistent", "ephemeral"};
    fprintf(out, "\nworkspace wake-up: %ld wake-ups each of a sandbox with a persistent "
                 "100 MB workspace and of an ephemeral one (empty), alternated; each from a "
                 "stopped container (sleepAfter) to the result of the first exec true\n", n);
    for (int k = 0; k < 2; k++) {
        char args[128];
        snprintf(ids[k], sizeof(ids[k]), "%s-wake%c", tag, modes[k][0]);
        snprintf(args, sizeof(args), "{\"workspace\":\"%s\"}", modes[k]);
        sbx_exec_result r;
        const char *fill = k == 0 ? "head -c 100000000 /dev/urandom > /workspace/data && sync"
                                  : "true";
        sbx_exec_opts o = {.command = fill, .timeout_ms = 120000};
        if (call(c, "create", ids[k], args, &err) != 0 ||
            call(c, "sandbox.configure", ids[k], "{\"sleepAfter\":\"1s\"}", &err) != 0 ||
            sbx_exec(c, ids[k], &o, &r, &err) != 0) {
            fprintf(out, "  set-up of %s: %s: %s\n", ids[k], err.code, err.message);
            sbx_error_free(&err);
            failures++;
            goto out;
        }
        sbx_exec_result_free(&r);
    }
    double *v[2] = {calloc((size_t)n + 1, sizeof(double)), calloc((size_t)n + 1, sizeof(double))};
    size_t nv[2] = {0, 0};
    for (long i = 0; i < n && !*interrupted; i++) {
        for (int k = 0; k < 2; k++) {
            double ms;
            if (wait_stopped(c, ids[k], &err) != 0 ||
                bench_exec_true(c, ids[k], true, &ms, &err) != 0) {
                if (failures++ < 5)
                    fprintf(out, "  %s: %s: %s\n", ids[k], err.code, err.message);
                sbx_error_free(&err);
                continue;
            }
            v[k][nv[k]++] = ms;
        }
    }
    for (int k = 0; k < 2; k++) {
        struct sbx_summary s = sbx_stats_summary(v[k], nv[k]);
        fprintf(out, "  %-10s n=%zu  p50 %.2f  p90 %.2f  max %.2f ms\n", modes[k], s.n, s.p50,
                s.p90, s.max);
        free(v[k]);
    }
out:
    for (int k = 0; k < 2; k++)
        if (sbx_destroy(c, ids[k], NULL, &err) != 0)
            sbx_error_free(&err);
    return failures;
}

size_t
bench_fork_run(sbx_client *c, long n, const char *tag, FILE *out,
               volatile sig_atomic_t *interrupted)
{
    size_t failures = 0;
    sbx_error err;
    char src[128];
    snprintf(src, sizeof(src), "%s-forksrc", tag);
    fprintf(out, "\nfork: %ld forks, one at a time, of a running sandbox with a persistent "
                 "100 MB workspace (random bytes): the client's round trip of sandbox.fork, "
                 "and the shard's copy (copyMs)\n", n);
    sbx_exec_result r;
    sbx_exec_opts o = {.command = "head -c 100000000 /dev/urandom > /workspace/data && sync",
                       .timeout_ms = 120000};
    if (call(c, "create", src, "{\"workspace\":\"persistent\"}", &err) != 0 ||
        sbx_exec(c, src, &o, &r, &err) != 0) {
        fprintf(out, "  set-up of %s: %s: %s\n", src, err.code, err.message);
        sbx_error_free(&err);
        failures++;
        goto out;
    }
    sbx_exec_result_free(&r);
    double *rt = calloc((size_t)n + 1, sizeof(double));
    double *cp = calloc((size_t)n + 1, sizeof(double));
    size_t nv = 0;
    long seq = 0;
    for (long i = 0; i < n && !*interrupted; i++) {
        char id[160], args[256];
        sbx_reply *rep = NULL;
        double t0 = 0;
        int rc = -1;
        for (int tries = 0; tries < 64; tries++) {
            snprintf(id, sizeof(id), "%s-fork%ld", tag, seq++);
            snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", id);
            t0 = sbx_stats_now_ms();
            rc = sbx_call_json(c, "sandbox.fork", src, args, 120000, &rep, &err);
            if (rc == 0 || strcmp(err.code, "FORK_CROSS_SHARD"))
                break;
            sbx_error_free(&err);
        }
        double ms = sbx_stats_now_ms() - t0;
        if (rc != 0) {
            if (failures++ < 5)
                fprintf(out, "  fork %s: %s: %s\n", id, err.code, err.message);
            sbx_error_free(&err);
            continue;
        }
        char *j = sbx_reply_json(rep, false);
        sbx_reply_free(rep);
        const char *k = j ? strstr(j, "\"copyMs\":") : NULL;
        rt[nv] = ms;
        cp[nv++] = k ? strtod(k + 9, NULL) : 0;
        free(j);
        if (sbx_destroy(c, id, NULL, &err) != 0)
            sbx_error_free(&err);
    }
    struct sbx_summary s = sbx_stats_summary(rt, nv), sc = sbx_stats_summary(cp, nv);
    fprintf(out, "  round trip  n=%zu  p50 %.2f  p90 %.2f  max %.2f ms\n", s.n, s.p50, s.p90,
            s.max);
    fprintf(out, "  copyMs      n=%zu  p50 %.2f  p90 %.2f  max %.2f ms\n", sc.n, sc.p50, sc.p90,
            sc.max);
    free(rt);
    free(cp);
out:
    if (sbx_destroy(c, src, NULL, &err) != 0)
        sbx_error_free(&err);
    return failures;
}
