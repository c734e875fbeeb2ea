/* gw_metrics.c — see gw_metrics.h. */
#include "gw_metrics.h"

#include <stdlib.h>

#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"

void
gw_metrics_gateway(sbx_prom *p, const struct gw_counters *c)
{
    char l[320];
    sbx_prom_labels(l, sizeof(l), "gateway", c->gateway ? c->gateway : "", NULL);
    sbx_prom_family(p, "sbx_gateway_requests_total", "counter", "requests the gateway took");
    sbx_prom_add(p, "sbx_gateway_requests_total", "", l, (double)c->requests);
    sbx_prom_family(p, "sbx_gateway_errors_total", "counter",
                    "requests the gateway answered with an error itself");
    sbx_prom_add(p, "sbx_gateway_errors_total", "", l, (double)c->errors);
    sbx_prom_family(p, "sbx_gateway_retries_total", "counter", "requests re-sent to a shard");
    sbx_prom_add(p, "sbx_gateway_retries_total", "", l, (double)c->retries);
    sbx_prom_family(p, "sbx_gateway_uptime_seconds", "gauge", "time since the gateway started");
    sbx_prom_add(p, "sbx_gateway_uptime_seconds", "", l, c->uptime_s);
    if (c->http) {
        sbx_prom_family(p, "sbx_http_requests_total", "counter", "requests the HTTP front served");
        sbx_prom_add(p, "sbx_http_requests_total", "", l, (double)c->http_requests);
        sbx_prom_family(p, "sbx_http_errors_total", "counter",
                        "HTTP requests answered with an error");
        sbx_prom_add(p, "sbx_http_errors_total", "", l, (double)c->http_errors);
    }
    sbx_prom_family(p, "sbx_shard_up", "gauge",
                    "1 when the gateway is connected to the shard and it answered the scrape");
    if (!c->clustered)
        sbx_prom_family(p, "sbx_partitions_owned", "gauge", "partitions a shard owns");
}

void
gw_metrics_shard(sbx_prom *p, const char *shard, bool up, int partitions, const void *reply,
                 size_t len)
{
    char l[320];
    sbx_prom_labels(l, sizeof(l), "shard", shard, NULL);
    sbx_prom_add(p, "sbx_shard_up", "", l, up ? 1 : 0);
    if (partitions >= 0)
        sbx_prom_add(p, "sbx_partitions_owned", "", l, partitions);
    sbx_msg m;
    const msgpack_object *r, *arr;
    if (!reply || sbx_wire_decode(&m, reply, len, &sbx_wire_limits_reply) != 0)
        return;
    if (sbx_wire_get_map(m.root, "result", &r) == 0 &&
        sbx_wire_get_array(r, "families", &arr) == 0) {
        for (uint32_t k = 0; k < arr->via.array.size; k++) {
            const msgpack_object *f = &arr->via.array.ptr[k];
            if (f->type != MSGPACK_OBJECT_ARRAY || f->via.array.size != 4)
                continue;
            /* [name, type, help, sample lines], each a string */
            char *v[4];
            size_t blen = 0;
            for (int i = 0; i < 4; i++) {
                const msgpack_object *o = &f->via.array.ptr[i];
                bool str = o->type == MSGPACK_OBJECT_STR;
                v[i] = sbx_xstrndup(str ? o->via.str.ptr : "", str ? o->via.str.size : 0);
                if (i == 3)
                    blen = str ? o->via.str.size : 0;
            }
            if (sbx_prom_add_raw(p, v[0], v[1], v[2], v[3], blen) != 0)
                sbx_log_warn("metrics: shard %s: its family %s was left out", shard, v[0]);
            for (int i = 0; i < 4; i++)
                free(v[i]);
        }
    }
    sbx_wire_msg_free(&m);
}
