/*
 * bench_image.c — sbx-bench's image phase (--image PATH, docs/images.md):
 * the time to import PATH (an OCI layout or a docker/podman save tarball on
 * this machine) into the deployment's store, then N cold starts of sandboxes
 * of that image side by side with N of host-/usr sandboxes, alternated so
 * both see the same machine: each timed from `create` (with or without the
 * image) to the result of the first `exec true`; then a template of the
 * image is built (template.build) and N sandboxes of it are started the
 * same way.  The host-/usr sandboxes may
 * take a container from the warm pool, image sandboxes from their image's
 * pool when the deployment runs with --image-pool (a private daemon of
 * sbx-bench does not: use --gateway); the printed pool hits count both.
 * Everything it creates is destroyed, and the image removed, before it
 * returns.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "stats.h"

static int
create_exec(sbx_client *c, const char *id, const char *image, double *ms, sbx_error *err)
{
    char args[512];
    sbx_reply *r = NULL;
    snprintf(args, sizeof(args), image ? "{\"image\":\"%s\"}" : "{}", image);
    double t0 = sbx_stats_now_ms(), ex;
    if (sbx_call_json(c, "create", id, args, 60000, &r, err) != 0)
        return -1;
    sbx_reply_free(r);
    if (bench_exec_true(c, id, false, &ex, err) != 0)
        return -1;
    *ms = sbx_stats_now_ms() - t0;
    return 0;
}

/* A template of the image (template.build, one step writing under /usr):
 * the build's time, then n cold starts of sandboxes of the template, timed
 * as the image's.  The template is removed after. */
static size_t
bench_template(sbx_client *c, const char *base, long n, const char *tag, FILE *out,
               volatile sig_atomic_t *interrupted)
{
    size_t failures = 0;
    sbx_error err;
    sbx_reply *r = NULL;
    char args[600], name[96], id[128];
    snprintf(name, sizeof(name), "sbx-bench/%s-tpl:1", tag);
    snprintf(args, sizeof(args),
             "{\"name\":\"%s\",\"from\":\"%s\",\"run\":[\"mkdir -p /usr/share/baked && "
             "echo baked > /usr/share/baked/f\"]}",
             name, base);
    double t0 = sbx_stats_now_ms();
    if (sbx_call_json(c, "template.build", NULL, args, 600000, &r, &err) != 0) {
        fprintf(out, "  template.build: %s: %s\n", err.code, err.message);
        sbx_error_free(&err);
        return 1;
    }
    sbx_reply_free(r);
    fprintf(out, "  template.build %.1f ms (container of the image, one step, its upper dir "
                 "as a new layer)\n",
            sbx_stats_now_ms() - t0);
    double *vt = calloc((size_t)n + 1, sizeof(double));
    size_t nt = 0;
    for (long i = 0; i < n && !*interrupted; i++) {
        double ms;
        snprintf(id, sizeof(id), "%s-it%ld", tag, i);
        if (create_exec(c, id, name, &ms, &err) == 0) {
            vt[nt++] = ms;
        } else {
            if (failures++ < 5)
                fprintf(out, "  %s: %s: %s\n", id, err.code, err.message);
            sbx_error_free(&err);
        }
        if (sbx_destroy(c, id, NULL, &err) != 0)
            sbx_error_free(&err);
    }
    struct sbx_summary st = sbx_stats_summary(vt, nt);
    fprintf(out, "  template sandbox n=%zu  p50 %.2f  p90 %.2f  max %.2f ms\n", st.n, st.p50,
            st.p90, st.max);
    free(vt);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    if (sbx_call_json(c, "image.rm", NULL, args, 60000, &r, &err) == 0)
        sbx_reply_free(r);
    else
        sbx_error_free(&err);
    return failures;
}

size_t
bench_image_run(sbx_client *c, const char *path, long n, const char *tag, FILE *out,
                volatile sig_atomic_t *interrupted, const struct bench_burst_conf *bursts)
{
    size_t failures = 0;
    sbx_error err;
    sbx_reply *r = NULL;
    char args[1200], name[96], id[128];
    snprintf(name, sizeof(name), "sbx-bench/%s:1", tag);
    if (strchr(path, '"') || strchr(path, '\\')) {
        fprintf(out, "image: path %s cannot be sent as JSON here\n", path);
        return 1;
    }
    snprintf(args, sizeof(args), "{\"path\":\"%s\",\"name\":\"%s\"}", path, name);
    fprintf(out, "\nimage: import %s, then %ld cold starts each of image and host-/usr "
                 "sandboxes (create + first exec true), alternated\n", path, n);
    double t0 = sbx_stats_now_ms();
    if (sbx_call_json(c, "image.import", NULL, args, 600000, &r, &err) != 0) {
        fprintf(out, "  image.import: %s: %s\n", err.code, err.message);
        sbx_error_free(&err);
        return 1;
    }
    sbx_reply_free(r);
    fprintf(out, "  image.import %.1f ms (digests checked, layers unpacked)\n",
            sbx_stats_now_ms() - t0);
    struct bench_totals before, after;
    bool totals = bench_cluster_totals(c, &before, &err) == 0;
    if (!totals)
        sbx_error_free(&err);
    double *vi = calloc((size_t)n + 1, sizeof(double)), *vh = calloc((size_t)n + 1, sizeof(double));
    size_t ni = 0, nh = 0;
    for (long i = 0; i < n && !*interrupted; i++) {
        double ms;
        for (int k = 0; k < 2; k++) {
            snprintf(id, sizeof(id), "%s-%s%ld", tag, k ? "ih" : "ii", i);
            if (create_exec(c, id, k ? NULL : name, &ms, &err) == 0) {
                if (k)
                    vh[nh++] = ms;
                else
                    vi[ni++] = ms;
            } else {
                if (failures++ < 5)
                    fprintf(out, "  %s: %s: %s\n", id, err.code, err.message);
                sbx_error_free(&err);
            }
            if (sbx_destroy(c, id, NULL, &err) != 0)
                sbx_error_free(&err);
        }
    }
    if (totals && bench_cluster_totals(c, &after, &err) == 0)
        fprintf(out, "  shard side: %lld pool hits (warm pool, and image pools under "
                     "--image-pool), %lld containers started\n",
                (long long)(after.pool_hits - before.pool_hits),
                (long long)(after.started - before.started));
    else if (totals)
        sbx_error_free(&err);
    struct sbx_summary si = sbx_stats_summary(vi, ni), sh = sbx_stats_summary(vh, nh);
    fprintf(out, "  image sandbox    n=%zu  p50 %.2f  p90 %.2f  max %.2f ms\n", si.n, si.p50,
            si.p90, si.max);
    fprintf(out, "  host-/usr        n=%zu  p50 %.2f  p90 %.2f  max %.2f ms\n", sh.n, sh.p50,
            sh.p90, sh.max);
    if (sh.p50 > 0)
        fprintf(out, "  image / host-/usr p50: %.2fx\n", si.p50 / sh.p50);
    free(vi);
    free(vh);
    if (bursts && !*interrupted) {
        struct bench_burst_conf ib = *bursts;
        json_t *j = NULL;
        ib.image = name;
        ib.idle = 0;
        failures += bench_burst_run(c, &ib, &j);
        json_decref(j);
    }
    failures += bench_template(c, name, n, tag, out, interrupted);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    if (sbx_call_json(c, "image.rm", NULL, args, 60000, &r, &err) == 0)
        sbx_reply_free(r);
    else
        sbx_error_free(&err);
    return failures;
}
