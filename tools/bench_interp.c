/*
 * sbx-bench-interp — the code interpreter against Jupyter, side by side.
 *
 *   sbx-bench-interp [--gateway URL] [--contexts N] [--burst N] [--runs N]
 *
 * Starts a private `sbxd dev` (as sbx-bench does; sbxd from $SBX_BIN, else
 * next to this executable) unless --gateway is given, and measures, from the
 * client through the gateway and the shard (CLOCK_MONOTONIC, milliseconds):
 *
 *   context creation,  context.create {language: python} on a running
 *   spaced             sandbox, N times (default 20), 300 ms apart, each
 *                      deleted after: the agent's pool has refilled, so this
 *                      is the hand-over of a warm driver (the first context
 *                      of the sandbox, which starts the pool, is untimed);
 *                      and the first "1+1" in each of them
 *   context creation,  N contexts (default 10) created one after the other
 *   back-to-back       without a pause (then deleted), Python then
 *                      JavaScript: the pool drained faster than it refills;
 *                      with the memory the sandbox's cgroup gained (status
 *                      memoryBytes) for the first Python context (fork
 *                      server, pool) and per context of a burst
 *   runCode round trip context.run {code: "1+1"} on one context, N times
 *                      (default 500) after 20 warm-up runs; each followed
 *                      by an `exec true` in the same sandbox's default
 *                      session (timed too): the same gateway/shard/agent
 *                      path with a shell instead of the driver, measured
 *                      under the same load, so the difference of the two
 *                      p50s is what the driver hop costs
 *
 * then runs tools/jupyter_bench.py (Debian ipykernel + jupyter_client) for
 * kernel start-up (5 starts) and the execute_request round trip of "1+1"
 * (same N), and prints both.  Percentiles are nearest-rank.
 */
#include <errno.h>
#include <jansson.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../include/sbx/sbx.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "../tests/support/harness.h"
#include "stats.h"

static int
call(sbx_client *c, const char *op, const char *id, const char *json, sbx_reply **r)
{
    sbx_error err;
    int rc = sbx_call_json(c, op, id, json, 120000, r, &err);
    if (rc) {
        fprintf(stderr, "sbx-bench-interp: %s: %s %s\n", op, err.code, err.message);
        sbx_error_free(&err);
    }
    return rc;
}

/* n contexts of `lang` created one after the other without a pause (times
 * in ms[]), then deleted; with mem, the sandbox's memory before them and a
 * second after the last (so the pool's refill is counted: it stays). */
static int
burst_create(sbx_client *c, const char *id, const char *lang, int n, double *ms, int64_t *mem)
{
    char args[64], del[160];
    char (*ids)[80] = sbx_xcalloc((size_t)n, sizeof(*ids));
    int rc = 0, made = 0;
    sbx_reply *r;
    snprintf(args, sizeof(args), "{\"language\":\"%s\"}", lang);
    sleep(1); /* the pool is full */
    if (mem)
        mem[0] = test_memory_bytes(c, id);
    for (; made < n && rc == 0; made++) {
        double t0 = sbx_stats_now_ms();
        if ((rc = call(c, "context.create", id, args, &r)) != 0)
            break;
        ms[made] = sbx_stats_now_ms() - t0;
        sbx_str cid = {"", 0};
        sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid);
        snprintf(ids[made], sizeof(ids[made]), "%.*s", (int)cid.n, cid.p);
        sbx_reply_free(r);
    }
    if (mem) {
        sleep(1);
        mem[1] = test_memory_bytes(c, id);
    }
    for (int i = 0; i < made; i++) {
        snprintf(del, sizeof(del), "{\"contextId\":\"%s\"}", ids[i]);
        if (call(c, "context.delete", id, del, &r) == 0)
            sbx_reply_free(r);
    }
    free(ids);
    return rc;
}

int
main(int argc, char **argv)
{
    const char *gateway = NULL;
    int contexts = 20, burst = 10, runs = 500;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--gateway") && i + 1 < argc)
            gateway = argv[++i];
        else if (!strcmp(argv[i], "--contexts") && i + 1 < argc)
            contexts = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--burst") && i + 1 < argc)
            burst = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            runs = atoi(argv[++i]);
        else {
            fprintf(stderr, "usage: sbx-bench-interp [--gateway URL] [--contexts N] [--burst N] "
                            "[--runs N]\n"
                            "  --contexts N  spaced context creations (300 ms apart), default 20\n"
                            "  --burst N     back-to-back context creations, default 10\n"
                            "  --runs N      '1+1' round trips, default 500\n");
            return 2;
        }
    }
    if (contexts < 1 || burst < 1 || burst > 64 || runs < 1)
        return 2;
    char self[PATH_MAX];
    ssize_t sl = readlink("/proc/self/exe", self, sizeof(self) - 1);
    self[sl > 0 ? sl : 0] = 0;
    char bindir[PATH_MAX];
    snprintf(bindir, sizeof(bindir), "%s", dirname(self));
    if (!getenv("SBX_BIN"))
        setenv("SBX_BIN", bindir, 1);
    struct testd d;
    bool own = !gateway;
    if (own) {
        static const char *const extra[] = {"--pool", "2", NULL};
        if (testd_start(&d, 1, extra) != 0) {
            fprintf(stderr, "sbx-bench-interp: cannot start sbxd (root needed)\n");
            return 1;
        }
        gateway = d.url;
    }
    sbx_client *c;
    sbx_error err;
    int rc = 1;
    double *create = sbx_xcalloc((size_t)contexts, sizeof(double));
    double *first_rt = sbx_xcalloc((size_t)contexts, sizeof(double));
    double *b2b[2] = {sbx_xcalloc((size_t)burst, sizeof(double)),
                      sbx_xcalloc((size_t)burst, sizeof(double))};
    double *rt = sbx_xcalloc((size_t)runs, sizeof(double));
    double *ex_rt = sbx_xcalloc((size_t)runs, sizeof(double)); /* exec true, interleaved */
    int64_t mem[2] = {-1, -1}, jsmem[2] = {-1, -1}, first[2] = {-1, -1};
    if (sbx_client_open(&c, gateway, &err) != 0) {
        fprintf(stderr, "sbx-bench-interp: %s %s\n", err.code, err.message);
        goto out;
    }
    char id[64];
    snprintf(id, sizeof(id), "bench-interp-%d", (int)getpid());
    sbx_reply *r;
    if (call(c, "ping", id, "{}", &r))
        goto close;
    sbx_reply_free(r);
    /* The first context of a language also starts its pool: once untimed,
     * with what the sandbox's memory gained (fork server, context, pool). */
    sleep(1);
    first[0] = test_memory_bytes(c, id);
    if (call(c, "context.create", id, "{\"language\":\"python\"}", &r))
        goto close;
    sbx_reply_free(r);
    sleep(2);
    first[1] = test_memory_bytes(c, id);
    for (int i = 0; i < contexts; i++) {
        usleep(300 * 1000); /* let the agent refill its pool, as between real calls */
        double t0 = sbx_stats_now_ms();
        if (call(c, "context.create", id, "{\"language\":\"python\"}", &r))
            goto close;
        create[i] = sbx_stats_now_ms() - t0;
        sbx_str cid = {"", 0};
        sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid);
        char del[160], first_run[200];
        snprintf(del, sizeof(del), "{\"contextId\":\"%.*s\"}", (int)cid.n, cid.p);
        snprintf(first_run, sizeof(first_run), "{\"code\":\"1+1\",\"context\":\"%.*s\"}",
                 (int)cid.n, cid.p);
        sbx_reply_free(r);
        t0 = sbx_stats_now_ms();
        if (call(c, "context.run", id, first_run, &r))
            goto close;
        first_rt[i] = sbx_stats_now_ms() - t0;
        sbx_reply_free(r);
        if (call(c, "context.delete", id, del, &r))
            goto close;
        sbx_reply_free(r);
    }
    /* Back-to-back, Python then JavaScript (whose first context, which
     * starts its pool, is untimed too). */
    if (call(c, "context.create", id, "{\"language\":\"javascript\"}", &r))
        goto close;
    sbx_reply_free(r);
    if (burst_create(c, id, "python", burst, b2b[0], mem) != 0 ||
        burst_create(c, id, "javascript", burst, b2b[1], jsmem) != 0)
        goto close;
    if (call(c, "context.create", id, "{\"language\":\"python\"}", &r))
        goto close;
    sbx_str cid = {"", 0};
    sbx_wire_get_str(sbx_reply_result(r), "contextId", &cid);
    char run[200];
    snprintf(run, sizeof(run), "{\"code\":\"1+1\",\"context\":\"%.*s\"}", (int)cid.n, cid.p);
    sbx_reply_free(r);
    for (int i = 0; i < 20 + runs; i++) {
        double t0 = sbx_stats_now_ms();
        if (call(c, "context.run", id, run, &r))
            goto close;
        double dt = sbx_stats_now_ms() - t0;
        sbx_reply_free(r);
        if (i >= 20)
            rt[i - 20] = dt;
        sbx_exec_opts eo = {.command = "true"};
        sbx_exec_result er;
        t0 = sbx_stats_now_ms();
        if (sbx_exec(c, id, &eo, &er, &err) != 0) {
            fprintf(stderr, "sbx-bench-interp: exec true: %s %s\n", err.code, err.message);
            sbx_error_free(&err);
            goto close;
        }
        dt = sbx_stats_now_ms() - t0;
        sbx_exec_result_free(&er);
        if (i >= 20)
            ex_rt[i - 20] = dt;
    }
    sbx_destroy(c, id, NULL, NULL);

    /* Jupyter, same machine, same moment. */
    char cmd[PATH_MAX * 2];
    snprintf(cmd, sizeof(cmd), "/usr/bin/python3 %s/../tools/jupyter_bench.py --runs %d", bindir,
             runs);
    if (access("tools/jupyter_bench.py", R_OK) == 0)
        snprintf(cmd, sizeof(cmd), "/usr/bin/python3 tools/jupyter_bench.py --runs %d", runs);
    FILE *p = popen(cmd, "r");
    json_error_t je;
    json_t *jb = p ? json_loadf(p, 0, &je) : NULL;
    if (p)
        pclose(p);

    double load[3] = {0, 0, 0};
    getloadavg(load, 3);
    printf("code interpreter vs Jupyter (ipykernel), this machine, %ld CPUs, load %.2f\n\n",
           sysconf(_SC_NPROCESSORS_ONLN), load[0]);
    printf("python context creation (sbx) vs kernel start-up (Jupyter)\n");
    sbx_stats_line("sbx context.create python, spaced", create, (size_t)contexts);
    sbx_stats_line("sbx context.create python, back-to-back", b2b[0], (size_t)burst);
    sbx_stats_line("sbx context.create javascript, back-to-back", b2b[1], (size_t)burst);
    if (first[0] > 0 && first[1] > 0)
        printf("  sandbox memory: +%.1f MiB for the first python context (its driver, the fork "
               "server, the warm drivers)\n",
               (double)(first[1] - first[0]) / 1048576.0);
    if (mem[0] > 0 && mem[1] > 0)
        printf("  sandbox memory: +%.1f MiB for %d python contexts (%.1f MiB each)\n",
               (double)(mem[1] - mem[0]) / 1048576.0, burst,
               (double)(mem[1] - mem[0]) / 1048576.0 / burst);
    if (jsmem[0] > 0 && jsmem[1] > 0)
        printf("  sandbox memory: +%.1f MiB for %d javascript contexts (%.1f MiB each)\n",
               (double)(jsmem[1] - jsmem[0]) / 1048576.0, burst,
               (double)(jsmem[1] - jsmem[0]) / 1048576.0 / burst);
    size_t nk = jb ? json_array_size(json_object_get(jb, "kernel_start_ms")) : 0;
    double *ks = sbx_xcalloc(nk + 1, sizeof(double));
    for (size_t i = 0; i < nk; i++)
        ks[i] = json_real_value(json_array_get(json_object_get(jb, "kernel_start_ms"), i));
    if (nk)
        sbx_stats_line("jupyter kernel start", ks, nk);
    else
        printf("  jupyter: not measured (python3-ipykernel / jupyter-client missing?)\n");
    printf("\n'1+1' round trip\n");
    sbx_stats_line("sbx context.run (via gateway)", rt, (size_t)runs);
    sbx_stats_line("sbx exec true, same path (reference)", ex_rt, (size_t)runs);
    sbx_stats_line("sbx context.run, first in a new context", first_rt, (size_t)contexts);
    size_t ne = jb ? json_array_size(json_object_get(jb, "execute_ms")) : 0;
    double *ex = sbx_xcalloc(ne + 1, sizeof(double));
    for (size_t i = 0; i < ne; i++)
        ex[i] = json_real_value(json_array_get(json_object_get(jb, "execute_ms"), i));
    if (ne)
        sbx_stats_line("jupyter execute_request", ex, ne);
    if (ne && nk)
        printf("\nsbx: context creation %.1fx (spaced) / %.1fx (back-to-back) faster, round trip "
               "%.1fx faster (p50)\n",
               sbx_stats_pct(ks, nk, 50) / sbx_stats_pct(create, (size_t)contexts, 50),
               sbx_stats_pct(ks, nk, 50) / sbx_stats_pct(b2b[0], (size_t)burst, 50),
               sbx_stats_pct(ex, ne, 50) / sbx_stats_pct(rt, (size_t)runs, 50));
    json_decref(jb);
    free(ks);
    free(ex);
    rc = 0;
close:
    sbx_client_close(c);
out:
    free(rt);
    free(ex_rt);
    free(b2b[0]);
    free(b2b[1]);
    free(create);
    free(first_rt);
    if (own)
        testd_stop(&d);
    return rc;
}
