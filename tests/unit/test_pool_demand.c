/*
 * test_pool_demand.c — unit tests for the adaptive pools' demand
 * (actors/shard_int.h struct shard_demand): what the warm pool and each
 * image pool size themselves from, the most containers asked for within one
 * second (sliding) of the last window.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "../../actors/shard_int.h"

/* A monotonic clock far from 0, as sbx_mono_ms() is on a running host. */
#define T0 (7200ll * 1000)

/* n asks, evenly spread over [from_ms, from_ms + span_ms). */
static void
asks(struct shard_demand *d, int n, int64_t from_ms, int64_t span_ms)
{
    for (int i = 0; i < n; i++)
        shard_demand_note(d, from_ms + span_ms * i / n);
}

/* A burst of 50 over 200 ms that crosses a second's boundary is 50 asked
 * for within one second, not the larger of its two halves (it was: the
 * pool then held 21 for the next burst of 25 and 4 of them were built
 * while their callers waited). */
Test(pool_demand, a_burst_across_a_seconds_boundary_counts_whole)
{
    struct shard_demand d;
    memset(&d, 0, sizeof(d));
    asks(&d, 50, T0 + 900, 200); /* 20 before T0 + 1000, 30 after */
    cr_expect_eq(shard_demand_peak(&d, (T0 + 1100) / 1000, 60), 50);
    cr_expect_eq(shard_demand_want(&d, (T0 + 1100) / 1000, 60), 50 + 13);
}

/* A steady 10 asks a second is 10, not the 20 two adjacent seconds would
 * sum to: the window slides, it does not add seconds up. */
Test(pool_demand, a_steady_rate_is_its_rate)
{
    struct shard_demand d;
    memset(&d, 0, sizeof(d));
    asks(&d, 100, T0, 10000);
    cr_expect_eq(shard_demand_peak(&d, (T0 + 10000) / 1000, 60), 10);
}

/* What was asked for leaves the window after window_s seconds, and asks
 * older than a second do not add to a later second's count. */
Test(pool_demand, old_demand_is_forgotten)
{
    struct shard_demand d;
    memset(&d, 0, sizeof(d));
    asks(&d, 40, T0, 100);
    asks(&d, 3, T0 + 5000, 10);
    cr_expect_eq(shard_demand_peak(&d, (T0 + 5000) / 1000, 60), 40);
    cr_expect_eq(shard_demand_peak(&d, (T0 + 5000) / 1000, 3), 3, "a 3 s window");
    asks(&d, 2, T0 + 70000, 10);
    cr_expect_eq(shard_demand_peak(&d, (T0 + 70000) / 1000, 60), 2, "the burst 70 s ago");
}

/* More asks in one second than the ring holds count as the ring's size
 * (no pool holds more: POOL_HARD_MAX), and never wrap to a small number. */
Test(pool_demand, a_flood_saturates)
{
    struct shard_demand d;
    memset(&d, 0, sizeof(d));
    asks(&d, 3 * SHARD_DEMAND_RECENT, T0, 500);
    cr_expect_eq(shard_demand_peak(&d, T0 / 1000, 60), SHARD_DEMAND_RECENT);
    /* and a second later the flood is still the window's peak */
    asks(&d, 1, T0 + 1600, 1);
    cr_expect_eq(shard_demand_peak(&d, (T0 + 1600) / 1000, 60), SHARD_DEMAND_RECENT);
}
