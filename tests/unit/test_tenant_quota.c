/*
 * test_tenant_quota.c — the tenant registry's quota arithmetic
 * (gateway/tenant.c sbx_tenants_admit, sbx_tenants_stream_enter/leave,
 * tenant_parse_res; docs/security.md §6) on a registry built by hand: the
 * cases a daemon test cannot set up cheaply — a shard default of 0
 * (unlimited) against a quota, a fork of a source the snapshot holds, the
 * record's bounds.  The end-to-end checks are tests/security/test_tenant_limits.c.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "../../gateway/tenant_int.h"
#include "../../runtime/err.h"
#include "../../runtime/util.h"

/* A registry with tenant "a" (quotas as given, maxSandboxes 100, rate 1000)
 * and, in its snapshot, a--src with limits src; owned by the caller
 * (sbx_tenants_stop). */
static sbx_tenants *
registry(struct tres max, int64_t max_streams, struct tres defaults, struct tres src)
{
    sbx_tenants *t = sbx_xcalloc(1, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->refresh_mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->recent = sbx_xcalloc(RECENT_MAX, sizeof(*t->recent));
    t->streams = sbx_xcalloc(STREAMS_MAX, sizeof(*t->streams));
    t->tens = sbx_xcalloc(1, sizeof(*t->tens));
    t->ntens = 1;
    snprintf(t->tens[0].name, sizeof(t->tens[0].name), "a");
    t->tens[0].max_sandboxes = 100;
    t->tens[0].rate = 1000;
    t->tens[0].tokens = 2000;
    t->tens[0].bucket_ms = sbx_mono_ms();
    t->tens[0].max = max;
    t->tens[0].max_streams = max_streams;
    t->tens[0].sandboxes = 1;
    t->tens[0].used = src;
    t->ids = sbx_xcalloc(1, sizeof(*t->ids));
    t->ids[0] = (struct tsb){sbx_xstrdup("a--src"), src};
    t->nids = 1;
    t->defaults = defaults;
    t->loaded = true;
    return t;
}

static const struct sbx_principal tenant_a = {SBX_SCOPE_TENANT, "a", "k"};

Test(tenant_quota, an_unlimited_default_fits_no_quota_and_an_explicit_limit_does)
{
    /* Shards without a memory limit (0): a default sandbox cannot be counted. */
    sbx_tenants *t = registry((struct tres){1 << 30, 0, 0}, 0, (struct tres){0, 1000, 1 << 26},
                              (struct tres){256 << 20, 1000, 1 << 26});
    struct sbx_quota_miss miss = {0};
    char why[256];
    int rc = sbx_tenants_admit(t, &tenant_a, "a--x", true, NULL, &miss, why, sizeof(why));
    cr_assert_eq(rc, SBX_E_QUOTA_EXCEEDED, "a sandbox of unlimited memory was admitted");
    cr_assert_str_eq(miss.quota, "maxMemoryBytes");
    cr_assert_eq(miss.retry_ms, 0, "waiting does not help: no retryAfterMs");
    cr_assert(strstr(why, "unlimited"), "%s", why);
    /* An explicit limit that fits is admitted and counted. */
    struct sbx_tenant_ask ask = {512 << 20, 0, 0, NULL};
    cr_assert_eq(sbx_tenants_admit(t, &tenant_a, "a--x", true, &ask, &miss, why, sizeof(why)), 0,
                 "%s", why);
    cr_assert_eq(t->tens[0].used.memory, 768 << 20);
    /* The same ID again is no creation (nothing more counted). */
    cr_assert_eq(sbx_tenants_admit(t, &tenant_a, "a--x", true, &ask, &miss, why, sizeof(why)), 0);
    cr_assert_eq(t->tens[0].used.memory, 768 << 20);
    /* 768 + 512 > 1024: refused, with the real sum and the limit. */
    rc = sbx_tenants_admit(t, &tenant_a, "a--y", true, &ask, &miss, why, sizeof(why));
    cr_assert_eq(rc, SBX_E_QUOTA_EXCEEDED);
    cr_assert_eq(miss.used, 768 << 20);
    cr_assert_eq(miss.limit, 1 << 30);
    /* The default tenant and nocreate ops have no quotas. */
    const struct sbx_principal dflt = {SBX_SCOPE_ADMIN, "", "k"};
    cr_assert_eq(sbx_tenants_admit(t, &dflt, "y", true, &ask, &miss, why, sizeof(why)), 0);
    cr_assert_eq(sbx_tenants_admit(t, &tenant_a, "a--y", false, &ask, &miss, why, sizeof(why)),
                 0);
    sbx_tenants_stop(t);
}

Test(tenant_quota, a_fork_counts_its_sources_limits)
{
    sbx_tenants *t = registry((struct tres){0, 3000, 0}, 0, (struct tres){256 << 20, 500, 0},
                              (struct tres){64 << 20, 1000, 1 << 26});
    struct sbx_quota_miss miss = {0};
    char why[256];
    struct sbx_tenant_ask like = {0, 0, 0, "a--src"};
    /* 1000 + 1000 + 1000 = 3000 fits; the third fork does not (the default
     * of 500 would have fitted four). */
    cr_assert_eq(sbx_tenants_admit(t, &tenant_a, "a--f1", true, &like, &miss, why, sizeof(why)),
                 0, "%s", why);
    cr_assert_eq(sbx_tenants_admit(t, &tenant_a, "a--f2", true, &like, &miss, why, sizeof(why)),
                 0, "%s", why);
    cr_assert_eq(sbx_tenants_admit(t, &tenant_a, "a--f3", true, &like, &miss, why, sizeof(why)),
                 SBX_E_QUOTA_EXCEEDED);
    cr_assert_str_eq(miss.quota, "maxCpus");
    cr_assert_eq(miss.used, 3000);
    /* A source this gateway just admitted (not yet in a snapshot) counts too. */
    struct sbx_tenant_ask like_f1 = {0, 0, 0, "a--f1"};
    cr_assert_eq(
        sbx_tenants_admit(t, &tenant_a, "a--f4", true, &like_f1, &miss, why, sizeof(why)),
        SBX_E_QUOTA_EXCEEDED);
    sbx_tenants_stop(t);
}

Test(tenant_quota, streams_count_per_stream_until_the_quota)
{
    sbx_tenants *t = registry((struct tres){0, 0, 0}, 2, (struct tres){0, 0, 0},
                              (struct tres){0, 0, 0});
    struct sbx_quota_miss miss = {0};
    char why[256];
    bool counted = false;
    cr_assert_eq(sbx_tenants_stream_enter(t, &tenant_a, "a--s/1", &counted, &miss, why,
                                          sizeof(why)),
                 0);
    cr_assert(counted);
    sbx_tenants_stream_leave(t, "a--s/1");
    /* The same stream again is the same stream (lingering after its read). */
    cr_assert_eq(sbx_tenants_stream_enter(t, &tenant_a, "a--s/1", &counted, &miss, why,
                                          sizeof(why)),
                 0);
    cr_assert_eq(sbx_tenants_stream_enter(t, &tenant_a, "a--s/2", &counted, &miss, why,
                                          sizeof(why)),
                 0);
    /* A third, and an op that starts one (key NULL), are refused. */
    cr_assert_eq(sbx_tenants_stream_enter(t, &tenant_a, "a--s/3", &counted, &miss, why,
                                          sizeof(why)),
                 SBX_E_QUOTA_EXCEEDED);
    cr_assert_str_eq(miss.quota, "maxStreams");
    cr_assert_eq(miss.used, 2);
    cr_assert(miss.retry_ms > 0);
    cr_assert_eq(sbx_tenants_stream_enter(t, &tenant_a, NULL, &counted, &miss, why, sizeof(why)),
                 SBX_E_QUOTA_EXCEEDED);
    cr_assert(!counted);
    /* Another tenant is not held by a's streams. */
    const struct sbx_principal b = {SBX_SCOPE_TENANT, "b", "k"};
    cr_assert_eq(
        sbx_tenants_stream_enter(t, &b, "b--s/3", &counted, &miss, why, sizeof(why)), 0);
    cr_assert(!counted, "b has no tenant record here: nothing to count");
    sbx_tenants_stop(t);
}

Test(tenant_quota, the_resource_record_parses_within_its_bounds)
{
    char name[SBX_TENANT_MAX + 1];
    struct tten x;
    memset(&x, 0, sizeof(x));
    cr_assert(tenant_parse_res("sbx--r-acme-1024-2000-4096-7", name, &x));
    cr_assert_str_eq(name, "acme");
    cr_assert_eq(x.max.memory, 1024LL << 20);
    cr_assert_eq(x.max.cpu, 2000);
    cr_assert_eq(x.max.disk, 4096LL << 20);
    cr_assert_eq(x.max_streams, 7);
    /* The longest record the schema allows fits an ID (63 bytes). */
    const char *longest = "sbx--r-abcdefghijklmnop-1073741824-10000000-1073741824-1000000";
    cr_assert_leq(strlen(longest), 63);
    cr_assert(tenant_parse_res(longest, name, &x));
    const char *bad[] = {"sbx--r-acme-1-2-3",        "sbx--r-acme-1-2-3-4-5", "sbx--r-sbx-1-2-3-4",
                         "sbx--r-ACME-1-2-3-4",      "sbx--r-acme--1-2-3-4",  "sbx--t-acme-1-2",
                         "sbx--r-acme-1-2-3-4junk", NULL};
    for (int i = 0; bad[i]; i++)
        cr_assert(!tenant_parse_res(bad[i], name, &x), "%s parsed", bad[i]);
}
