/*
 * gw_metrics.h — the gateway's part of `metrics` (GET /metrics; docs/operations.md,
 * "Metrics"): its own families, and the merge of the families each shard
 * answers (actors/metrics.c) into one exposition (runtime/prom.h).  Used by
 * gateway.c when a fanned-out `metrics` request has every shard's answer;
 * runs on that request's thread and touches nothing shared.
 */
#ifndef SBX_GW_METRICS_H
#define SBX_GW_METRICS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../runtime/prom.h"

/* The gateway's counters at the time of the scrape. */
struct gw_counters {
    const char *gateway;     /* its name (label gateway="…") */
    uint64_t requests, errors, retries;
    double uptime_s;
    bool http;               /* an HTTP front runs: the two below are its counters */
    uint64_t http_requests, http_errors;
    bool clustered;          /* partitions come from etcd (the shards report theirs) */
};

/* gw_metrics_gateway — declare the gateway's families in p and add its own
 * samples (sbx_gateway_*, sbx_http_*); sbx_shard_up and, standalone,
 * sbx_partitions_owned are declared for gw_metrics_shard. */
void gw_metrics_gateway(sbx_prom *p, const struct gw_counters *c);

/*
 * gw_metrics_shard — one shard of the scrape: sbx_shard_up{shard} (up: the
 * gateway is connected and the shard answered), sbx_partitions_owned{shard}
 * when partitions >= 0 (standalone: the gateway's table), then the
 * families of its reply (reply[0..len), a reply frame of `metrics`; NULL:
 * none) merged into p.  A family that does not merge (a type that differs
 * from the gateway's, a malformed body) is left out with a warning.
 */
void gw_metrics_shard(sbx_prom *p, const char *shard, bool up, int partitions, const void *reply,
                      size_t len);

#endif
