/*
 * test_prom.c — unit tests of runtime/prom.h, the Prometheus text exposition
 * format 0.0.4 renderer (https://prometheus.io/docs/instrumenting/exposition_formats/):
 * the exact lines of counters, gauges and histograms (cumulative buckets,
 * +Inf, _sum, _count), escaping in HELP text and label values, malformed
 * names refused, the merge of two sources' families, and the gateway's merge of
 * a shard's `metrics` reply (gateway/gw_metrics.h).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <string.h>

#include "runtime/prom.h"

static char *
render(sbx_prom *p)
{
    sbx_buf b;
    sbx_buf_init(&b);
    sbx_prom_render(p, &b);
    sbx_buf_append(&b, "", 1);
    return b.p;
}

Test(prom, counter_and_gauge_lines)
{
    sbx_prom p;
    char l[128];
    sbx_prom_init(&p);
    cr_assert_eq(sbx_prom_family(&p, "sbx_requests_total", "counter", "requests taken"), 0);
    cr_assert_eq(sbx_prom_labels(l, sizeof(l), "op", "exec", "code", "OK", NULL), 0);
    cr_assert_eq(sbx_prom_add(&p, "sbx_requests_total", "", l, 3), 0);
    cr_assert_eq(sbx_prom_family(&p, "sbx_up", "gauge", "1"), 0);
    cr_assert_eq(sbx_prom_add(&p, "sbx_up", "", NULL, 0.5), 0);
    cr_assert_eq(sbx_prom_add(&p, "sbx_up", "", NULL, 0.1 + 0.2), 0); /* needs 17 digits */
    cr_assert_eq(sbx_prom_add(&p, "sbx_up", "", "", INFINITY), 0);
    cr_assert_eq(sbx_prom_add(&p, "sbx_up", "", "", NAN), 0);
    char *s = render(&p);
    cr_assert_str_eq(s, "# HELP sbx_requests_total requests taken\n"
                        "# TYPE sbx_requests_total counter\n"
                        "sbx_requests_total{op=\"exec\",code=\"OK\"} 3\n"
                        "# HELP sbx_up 1\n"
                        "# TYPE sbx_up gauge\n"
                        "sbx_up 0.5\n"
                        "sbx_up 0.30000000000000004\n"
                        "sbx_up +Inf\n"
                        "sbx_up NaN\n");
    free(s);
    sbx_prom_free(&p);
}

Test(prom, escaping)
{
    sbx_prom p;
    char l[128];
    sbx_prom_init(&p);
    cr_assert_eq(sbx_prom_family(&p, "m", "gauge", "a \\ b\nc \"q\""), 0);
    cr_assert_eq(sbx_prom_labels(l, sizeof(l), "v", "x\\y\"z\nw", NULL), 0);
    cr_assert_str_eq(l, "v=\"x\\\\y\\\"z\\nw\"");
    cr_assert_eq(sbx_prom_add(&p, "m", "", l, 1), 0);
    char *s = render(&p);
    /* HELP escapes backslash and newline only; quotes stay. */
    cr_assert_str_eq(s, "# HELP m a \\\\ b\\nc \"q\"\n# TYPE m gauge\nm{v=\"x\\\\y\\\"z\\nw\"} 1\n");
    free(s);
    sbx_prom_free(&p);
}

Test(prom, bad_names_and_types)
{
    sbx_prom p;
    char l[16];
    sbx_prom_init(&p);
    cr_assert_eq(sbx_prom_family(&p, "1abc", "gauge", ""), -EINVAL);
    cr_assert_eq(sbx_prom_family(&p, "a-b", "gauge", ""), -EINVAL);
    cr_assert_eq(sbx_prom_family(&p, "ok:name_1", "summaryx", ""), -EINVAL);
    cr_assert_eq(sbx_prom_family(&p, "ok:name_1", "gauge", ""), 0);
    cr_assert_eq(sbx_prom_family(&p, "ok:name_1", "counter", ""), -EEXIST);
    cr_assert_eq(sbx_prom_add(&p, "nope", "", NULL, 1), -ENOENT);
    cr_assert_eq(sbx_prom_labels(l, sizeof(l), "a:b", "x", NULL), -EINVAL);
    cr_assert_eq(sbx_prom_labels(l, sizeof(l), "a", "a value far too long", NULL), -ENOSPC);
    cr_assert_str_eq(l, "");
    sbx_prom_free(&p);
}

Test(prom, histogram_is_cumulative)
{
    static const double b[] = {0.1, 1, 10};
    struct sbx_hist h = {0};
    sbx_hist_observe(&h, b, 3, 0.05);
    sbx_hist_observe(&h, b, 3, 0.1); /* on a bound: in that bucket (le is inclusive) */
    sbx_hist_observe(&h, b, 3, 5);
    sbx_hist_observe(&h, b, 3, 100);
    sbx_prom p;
    sbx_prom_init(&p);
    cr_assert_eq(sbx_prom_family(&p, "lat_seconds", "histogram", "x"), 0);
    cr_assert_eq(sbx_prom_add_hist(&p, "lat_seconds", "op=\"a\"", b, 3, &h), 0);
    char *s = render(&p);
    cr_assert_str_eq(s, "# HELP lat_seconds x\n# TYPE lat_seconds histogram\n"
                        "lat_seconds_bucket{op=\"a\",le=\"0.1\"} 2\n"
                        "lat_seconds_bucket{op=\"a\",le=\"1\"} 2\n"
                        "lat_seconds_bucket{op=\"a\",le=\"10\"} 3\n"
                        "lat_seconds_bucket{op=\"a\",le=\"+Inf\"} 4\n"
                        "lat_seconds_sum{op=\"a\"} 105.15\n"
                        "lat_seconds_count{op=\"a\"} 4\n");
    free(s);
    sbx_prom_free(&p);
}

Test(prom, merge_keeps_families_together)
{
    sbx_prom shard, gw;
    sbx_prom_init(&shard);
    sbx_prom_init(&gw);
    cr_assert_eq(sbx_prom_family(&gw, "x", "gauge", "x help"), 0);
    cr_assert_eq(sbx_prom_add(&gw, "x", "", "shard=\"gw\"", 1), 0);
    cr_assert_eq(sbx_prom_family(&shard, "y_total", "counter", "y help"), 0);
    cr_assert_eq(sbx_prom_add(&shard, "y_total", "", "shard=\"s0\"", 2), 0);
    cr_assert_eq(sbx_prom_family(&shard, "x", "gauge", "x help"), 0);
    cr_assert_eq(sbx_prom_add(&shard, "x", "", "shard=\"s0\"", 3), 0);
    for (size_t i = 0; i < shard.n; i++) {
        const char *n, *t, *hp, *body;
        size_t len;
        sbx_prom_get(&shard, i, &n, &t, &hp, &body, &len);
        cr_assert_eq(sbx_prom_add_raw(&gw, n, t, hp, body, len), 0);
    }
    cr_assert_eq(sbx_prom_add_raw(&gw, "x", "counter", "", "", 0), -EEXIST);
    cr_assert_eq(sbx_prom_add_raw(&gw, "x", "gauge", "", "x 1", 3), -EINVAL);
    char *s = render(&gw);
    cr_assert_str_eq(s, "# HELP x x help\n# TYPE x gauge\nx{shard=\"gw\"} 1\nx{shard=\"s0\"} 3\n"
                        "# HELP y_total y help\n# TYPE y_total counter\ny_total{shard=\"s0\"} 2\n");
    free(s);
    sbx_prom_free(&shard);
    sbx_prom_free(&gw);
}

/* The gateway's merge of a shard's `metrics` reply (gateway/gw_metrics.h):
 * the shard's families join the gateway's, sbx_shard_up and the standalone
 * partition count are added, a family whose type clashes is left out. */
#include "gateway/gw_metrics.h"
#include "runtime/wire.h"

Test(prom, gateway_merges_a_shard_reply)
{
    sbx_enc e;
    char *buf;
    size_t len;
    sbx_str id = {"r1", 2};
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, id);
    sbx_enc_karray(&e, "families");
    static const char *const fam[][4] = {
        {"sbx_actors", "gauge", "in memory", "sbx_actors{shard=\"s0\"} 5\n"},
        {"sbx_gateway_requests_total", "gauge", "clash", "sbx_gateway_requests_total 9\n"},
    };
    for (int i = 0; i < 2; i++) {
        sbx_enc_array(&e);
        for (int k = 0; k < 4; k++)
            sbx_enc_str(&e, fam[i][k]);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    cr_assert_eq(sbx_enc_finish(&e, &buf, &len), 0);

    sbx_prom p;
    sbx_prom_init(&p);
    struct gw_counters c = {.gateway = "g1", .requests = 7, .uptime_s = 1.5};
    gw_metrics_gateway(&p, &c);
    gw_metrics_shard(&p, "s0", true, 2048, buf, len);
    gw_metrics_shard(&p, "s1", false, 2048, NULL, 0);
    free(buf);
    char *s = render(&p);
    cr_expect(strstr(s, "sbx_gateway_requests_total{gateway=\"g1\"} 7\n"));
    cr_expect_null(strstr(s, "sbx_gateway_requests_total 9"), "a clashing family merged");
    cr_expect(strstr(s, "# TYPE sbx_actors gauge\nsbx_actors{shard=\"s0\"} 5\n"));
    cr_expect(strstr(s, "sbx_shard_up{shard=\"s0\"} 1\nsbx_shard_up{shard=\"s1\"} 0\n"));
    cr_expect(strstr(s, "sbx_partitions_owned{shard=\"s0\"} 2048\n"));
    cr_expect_null(strstr(s, "sbx_http_requests_total"), "no HTTP front, no HTTP counters");
    free(s);
    sbx_prom_free(&p);
}
