/*
 * test_place.c — unit tests for runtime/place.h (two-level rendezvous placement).
 *
 * Covers what place.h promises: the partition function is deterministic, in
 * range and spreads IDs evenly; rendezvous ownership balances partitions (and
 * the sandbox IDs mapped through them) across shards; adding a shard moves
 * only partitions to the new shard (about 1/n of them), removing one moves
 * only the partitions it owned; sbx_place_owner(n == 0) is -1 and
 * sbx_place_table agrees with sbx_place_owner.
 */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "runtime/place.h"

#define NIDS 100000

static void
make_id(char *buf, size_t len, unsigned i)
{
    /* IDs shaped like the ones users pick: a prefix and a counter. */
    snprintf(buf, len, "user-%u", i);
}

Test(place, partition_is_deterministic_and_in_range)
{
    char id[32];
    for (unsigned i = 0; i < NIDS; i++) {
        make_id(id, sizeof(id), i);
        uint32_t p1 = sbx_place_partition(id, strlen(id));
        uint32_t p2 = sbx_place_partition(id, strlen(id));
        cr_assert_lt(p1, SBX_PARTITIONS, "partition of %s out of range: %u", id, p1);
        cr_assert_eq(p1, p2, "partition of %s not deterministic (%u then %u)", id, p1, p2);
    }
    /* Only the n bytes count, not what follows them. */
    cr_assert_eq(sbx_place_partition("abcXYZ", 3), sbx_place_partition("abc", 3),
                 "partition must depend on the first n bytes only");
    /* The empty ID is still in range (no crash on n == 0). */
    cr_assert_lt(sbx_place_partition("", 0), SBX_PARTITIONS);
}

Test(place, partitions_spread_evenly)
{
    static unsigned count[SBX_PARTITIONS];
    char id[32];
    memset(count, 0, sizeof(count));
    for (unsigned i = 0; i < NIDS; i++) {
        make_id(id, sizeof(id), i);
        count[sbx_place_partition(id, strlen(id))]++;
    }
    double mean = (double)NIDS / SBX_PARTITIONS; /* ≈ 24.4 */
    double chi2 = 0;
    unsigned max = 0, empty = 0;
    for (unsigned p = 0; p < SBX_PARTITIONS; p++) {
        chi2 += (count[p] - mean) * (count[p] - mean) / mean;
        if (count[p] > max)
            max = count[p];
        if (count[p] == 0)
            empty++;
    }
    /* 4095 degrees of freedom: mean 4095, sd ≈ 90.5.  A good hash lands within
     * a few sd; 4095 ± 5 sd ≈ [3640, 4550]. */
    cr_expect(chi2 > 3640 && chi2 < 4550, "chi-square %.1f outside [3640, 4550] (4095 dof)", chi2);
    /* Poisson(24.4): P(X ≥ 60) per partition is ~1e-9; P(X = 0) ~ 2.5e-11. */
    cr_expect_lt(max, 60u, "fullest partition has %u IDs (mean %.1f)", max, mean);
    cr_expect_eq(empty, 0u, "%u partitions received no ID out of %d", empty, NIDS);
}

/* Number of partitions each shard of names[0..n) owns. */
static void
owner_counts(size_t n, const int16_t *table, unsigned *counts)
{
    memset(counts, 0, n * sizeof(*counts));
    for (unsigned p = 0; p < SBX_PARTITIONS; p++) {
        cr_assert(table[p] >= 0 && (size_t)table[p] < n, "partition %u has owner %d", p, table[p]);
        counts[table[p]]++;
    }
}

Test(place, three_shards_balance_partitions)
{
    const char *names[] = {"s0", "s1", "s2"};
    static int16_t table[SBX_PARTITIONS];
    unsigned counts[3];
    sbx_place_table(names, 3, table);
    owner_counts(3, table, counts);
    double mean = SBX_PARTITIONS / 3.0;
    for (int s = 0; s < 3; s++)
        cr_expect(fabs(counts[s] - mean) <= 0.05 * mean,
                  "shard %s owns %u partitions, more than 5%% from the mean %.1f", names[s],
                  counts[s], mean);
}

Test(place, three_shards_balance_sandbox_ids)
{
    const char *names[] = {"s0", "s1", "s2"};
    static int16_t table[SBX_PARTITIONS];
    unsigned counts[3] = {0, 0, 0};
    char id[32];
    sbx_place_table(names, 3, table);
    for (unsigned i = 0; i < NIDS; i++) {
        make_id(id, sizeof(id), i);
        counts[table[sbx_place_partition(id, strlen(id))]]++;
    }
    double mean = NIDS / 3.0;
    for (int s = 0; s < 3; s++)
        cr_expect(fabs(counts[s] - mean) <= 0.05 * mean,
                  "shard %s gets %u sandbox IDs, more than 5%% from the mean %.1f", names[s],
                  counts[s], mean);
}

Test(place, adding_a_shard_moves_partitions_only_to_it)
{
    const char *three[] = {"s0", "s1", "s2"};
    const char *four[] = {"s0", "s1", "s2", "s3"};
    static int16_t before[SBX_PARTITIONS], after[SBX_PARTITIONS];
    sbx_place_table(three, 3, before);
    sbx_place_table(four, 4, after);
    unsigned moved = 0;
    for (unsigned p = 0; p < SBX_PARTITIONS; p++) {
        if (before[p] == after[p])
            continue;
        moved++;
        /* Same index means same name: the first three names are shared. */
        cr_assert_eq(after[p], 3,
                     "partition %u moved from %s to %s, not to the new shard s3", p,
                     three[before[p]], four[after[p]]);
    }
    unsigned limit = (unsigned)(SBX_PARTITIONS * (0.25 + 0.02));
    cr_expect_leq(moved, limit, "adding a 4th shard moved %u of %d partitions (limit %u)", moved,
                  SBX_PARTITIONS, limit);
    /* The new shard must actually take a share (this is not a no-op). */
    cr_expect_geq(moved, (unsigned)(SBX_PARTITIONS * (0.25 - 0.02)),
                  "adding a 4th shard moved only %u partitions", moved);
}

Test(place, removing_a_shard_moves_only_its_partitions)
{
    const char *four[] = {"s0", "s1", "s2", "s3"};
    /* Remove s1: the remaining shards keep their names, at new indexes. */
    const char *three[] = {"s0", "s2", "s3"};
    static int16_t before[SBX_PARTITIONS], after[SBX_PARTITIONS];
    sbx_place_table(four, 4, before);
    sbx_place_table(three, 3, after);
    unsigned moved = 0, owned_by_removed = 0;
    for (unsigned p = 0; p < SBX_PARTITIONS; p++) {
        const char *was = four[before[p]], *now = three[after[p]];
        if (strcmp(was, "s1") == 0) {
            owned_by_removed++;
            moved++;
            continue;
        }
        cr_assert_str_eq(now, was, "partition %u moved from %s to %s though %s was not removed",
                         p, was, now, was);
    }
    cr_expect_eq(moved, owned_by_removed);
    cr_expect_gt(owned_by_removed, 0u, "the removed shard owned no partition");
}

Test(place, owner_of_empty_set_is_minus_one)
{
    cr_assert_eq(sbx_place_owner(NULL, 0, 0), -1);
    const char *names[] = {"s0"};
    cr_assert_eq(sbx_place_owner(names, 0, 17), -1, "n == 0 must ignore the array");
    cr_assert_eq(sbx_place_owner(names, 1, 17), 0, "a single shard owns everything");
}

Test(place, table_equals_owner)
{
    const char *names[] = {"alpha", "beta", "gamma", "delta", "epsilon"};
    static int16_t table[SBX_PARTITIONS];
    for (size_t n = 1; n <= 5; n++) {
        memset(table, 0x7f, sizeof(table));
        sbx_place_table(names, n, table);
        for (uint32_t p = 0; p < SBX_PARTITIONS; p++)
            cr_assert_eq(table[p], sbx_place_owner(names, n, p),
                         "n=%zu partition %u: table says %d, owner says %d", n, p, table[p],
                         sbx_place_owner(names, n, p));
    }
}

Test(place, owner_is_the_highest_weight)
{
    /* The owner is the argmax of sbx_place_weight, and does not depend on the
     * order the names are listed in. */
    const char *fwd[] = {"s0", "s1", "s2"};
    const char *rev[] = {"s2", "s1", "s0"};
    for (uint32_t p = 0; p < SBX_PARTITIONS; p++) {
        int o = sbx_place_owner(fwd, 3, p);
        for (int s = 0; s < 3; s++)
            cr_assert_geq(sbx_place_weight(fwd[o], p), sbx_place_weight(fwd[s], p),
                          "partition %u: owner %s is not the highest weight", p, fwd[o]);
        int r = sbx_place_owner(rev, 3, p);
        cr_assert_str_eq(rev[r], fwd[o], "partition %u: owner depends on list order", p);
    }
}
