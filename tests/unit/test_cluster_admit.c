/*
 * test_cluster_admit.c — unit tests of cluster admission (actors/cluster.h,
 * cluster_admit and cluster_listable; the rules are docs/cluster.md's and
 * cluster.h's "Ownership rules"): whether a shard in a cluster serves a
 * request for a partition, and what it answers when it does not.
 *
 * No etcd, no threads: a shard with a cluster state set by hand (what the
 * view, the lease and the handoff code would have set), so each rule is
 * checked on its own.  The refusals are checked as the client sees them:
 * the error reply the shard would send (sbx_wire_reply_err), decoded, with
 * its code and its context {partition, epoch, owner, retry} — the gateway
 * re-routes on WRONG_OWNER with that context.
 *
 * Rules: a shard not in a cluster admits everything; a fenced shard (its
 * lease not known to be held: fence_at 0 or past) admits nothing and
 * answers SHARD_UNAVAILABLE; otherwise a partition is served only if this
 * shard owns it, no handoff of it is under way, its records are installed,
 * and the request was routed at the partition's epoch (or names none);
 * else WRONG_OWNER, retry true only when the shard owns it (it will serve
 * it soon), with the owner's name when one is known.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "actors/cluster.h"
#include "actors/cluster_int.h"
#include "runtime/err.h"
#include "runtime/util.h"
#include "runtime/wire.h"

/* A shard named "s-me" in a cluster of two members ("s-me" = 0, "s-other"
 * = 1), its lease held for the next minute, owning nothing yet.  Freed by
 * drop(). */
static struct shard *
shard_in_cluster(void)
{
    struct shard *sh = sbx_xcalloc(1, sizeof(*sh));
    sh->conf.name = "s-me";
    struct cluster *c = sbx_xcalloc(1, sizeof(*c));
    c->sh = sh;
    c->me = 0;
    snprintf(c->member_names[0], sizeof(c->member_names[0]), "s-me");
    snprintf(c->member_names[1], sizeof(c->member_names[1]), "s-other");
    atomic_store(&c->fence_at, sbx_mono_ms() + 60000);
    for (int p = 0; p < SBX_PARTITIONS; p++)
        c->lp[p].owner = -1;
    sh->cluster = c;
    return sh;
}

static void
drop(struct shard *sh)
{
    free(sh->cluster);
    free(sh);
}

/* Partition p owned by this shard at epoch, loaded, no handoff. */
static void
own(struct shard *sh, uint32_t p, int64_t epoch)
{
    struct lpart *x = &sh->cluster->lp[p];
    x->owner = 0;
    x->mine = true;
    x->ready = true;
    x->moving = false;
    x->epoch = epoch;
}

/* The refusal as the client gets it. */
struct refusal {
    char code[48];
    char message[512];
    int64_t partition, epoch;
    char owner[64];     /* "" when the context has none */
    int retry;          /* -1 when the context has none */
};

/* admit — cluster_admit for (part, epoch); 0, or the code with *out filled
 * from the decoded error reply. */
static int
admit(struct shard *sh, uint32_t part, int64_t epoch, struct refusal *out)
{
    sbx_werr w;
    memset(out, 0, sizeof(*out));
    out->retry = -1;
    int rc = cluster_admit(sh, part, epoch, &w);
    if (rc == 0)
        return 0;
    char *buf = NULL;
    size_t len = 0;
    cr_assert_eq(sbx_wire_reply_err((sbx_str){"r1", 2}, &w, &buf, &len), 0,
                 "the refusal does not encode as a reply");
    sbx_werr_free(&w);
    sbx_msg m;
    cr_assert_eq(sbx_wire_decode(&m, buf, len, &sbx_wire_limits_reply), 0);
    const msgpack_object *e, *ctx;
    sbx_str s;
    bool ok = true;
    cr_assert_eq(sbx_wire_get_bool(m.root, "ok", &ok), 0);
    cr_assert_not(ok, "a refusal sent as a success");
    cr_assert_eq(sbx_wire_get_map(m.root, "error", &e), 0, "no error map in the reply");
    cr_assert_eq(sbx_wire_get_str(e, "code", &s), 0);
    sbx_str_copy(s, out->code, sizeof(out->code));
    if (sbx_wire_get_str(e, "message", &s) == 0)
        sbx_str_copy(s, out->message, sizeof(out->message));
    if (sbx_wire_get_map(e, "context", &ctx) == 0) {
        sbx_wire_get_i64(ctx, "partition", &out->partition);
        sbx_wire_get_i64(ctx, "epoch", &out->epoch);
        if (sbx_wire_get_str(ctx, "owner", &s) == 0)
            sbx_str_copy(s, out->owner, sizeof(out->owner));
        bool r;
        if (sbx_wire_get_bool(ctx, "retry", &r) == 0)
            out->retry = r;
    }
    sbx_wire_msg_free(&m);
    free(buf);
    cr_assert_str_eq(out->code, sbx_err_name(rc), "cluster_admit returned %d, the reply says %s",
                     rc, out->code);
    return rc;
}

Test(cluster_admit, a_shard_not_in_a_cluster_admits_every_partition)
{
    struct shard sh = {.conf.name = "alone"};
    sbx_werr w;
    for (uint32_t p = 0; p < SBX_PARTITIONS; p += 37)
        cr_expect_eq(cluster_admit(&sh, p, 0, &w), 0, "partition %u refused", p);
    cr_expect_eq(cluster_admit(&sh, 5, 12345, &w), 0, "an epoch means nothing outside a cluster");
    cr_expect(cluster_listable(&sh, 5));
    cr_expect_not(cluster_on(&sh));
}

Test(cluster_admit, an_owned_loaded_partition_is_served_at_its_epoch_or_none)
{
    struct shard *sh = shard_in_cluster();
    own(sh, 7, 42);
    struct refusal r;
    cr_expect_eq(admit(sh, 7, 42, &r), 0, "refused: %s %s", r.code, r.message);
    cr_expect_eq(admit(sh, 7, 0, &r), 0, "a request routed with no epoch refused: %s", r.code);
    cr_expect(cluster_listable(sh, 7));
    cr_expect(cluster_on(sh));
    drop(sh);
}

Test(cluster_admit, a_partition_of_another_shard_is_wrong_owner_naming_the_owner)
{
    struct shard *sh = shard_in_cluster();
    struct lpart *x = &sh->cluster->lp[9];
    x->owner = 1;
    x->epoch = 17;
    struct refusal r;
    cr_assert_eq(admit(sh, 9, 0, &r), SBX_E_WRONG_OWNER);
    cr_expect_eq(r.partition, 9);
    cr_expect_eq(r.epoch, 17);
    cr_expect_str_eq(r.owner, "s-other");
    cr_expect_eq(r.retry, 0, "retry must be false: this shard will not serve it");
    cr_expect(strstr(r.message, "not owned"), "message: %s", r.message);
    cr_expect_not(cluster_listable(sh, 9), "records of another shard's partition listed");
    drop(sh);
}

Test(cluster_admit, an_owned_partition_is_refused_while_handed_off_or_loading)
{
    struct shard *sh = shard_in_cluster();
    struct refusal r;
    own(sh, 3, 5);
    sh->cluster->lp[3].moving = true;
    cr_assert_eq(admit(sh, 3, 5, &r), SBX_E_WRONG_OWNER);
    cr_expect_eq(r.retry, 1, "an owner in a handoff says retry");
    cr_expect(strstr(r.message, "handed off"), "message: %s", r.message);

    own(sh, 3, 5);
    sh->cluster->lp[3].ready = false;
    cr_assert_eq(admit(sh, 3, 5, &r), SBX_E_WRONG_OWNER);
    cr_expect_eq(r.retry, 1);
    cr_expect_str_eq(r.owner, "s-me");
    cr_expect(strstr(r.message, "loaded"), "message: %s", r.message);
    cr_expect_not(cluster_listable(sh, 3), "records of a partition still loading listed");
    drop(sh);
}

Test(cluster_admit, a_request_routed_at_another_epoch_is_wrong_owner_with_the_current_one)
{
    struct shard *sh = shard_in_cluster();
    own(sh, 11, 8);
    struct refusal r;
    cr_assert_eq(admit(sh, 11, 7, &r), SBX_E_WRONG_OWNER, "an older epoch admitted");
    cr_expect_eq(r.epoch, 8, "the reply must carry the partition's epoch for the re-route");
    cr_expect_eq(r.partition, 11);
    cr_assert_eq(admit(sh, 11, 9, &r), SBX_E_WRONG_OWNER, "a newer epoch admitted");
    cr_expect(strstr(r.message, "epoch"), "message: %s", r.message);
    drop(sh);
}

Test(cluster_admit, a_fenced_shard_admits_nothing_and_is_unavailable)
{
    struct shard *sh = shard_in_cluster();
    own(sh, 2, 4);
    struct refusal r;
    cr_assert_eq(admit(sh, 2, 4, &r), 0);
    /* The lease is lost (fenced: fence_at 0) … */
    atomic_store(&sh->cluster->fence_at, 0);
    cr_assert_eq(admit(sh, 2, 4, &r), SBX_E_SHARD_UNAVAILABLE);
    cr_expect(strstr(r.message, "s-me"), "message names no shard: %s", r.message);
    /* … or its deadline has passed without a renewal. */
    atomic_store(&sh->cluster->fence_at, sbx_mono_ms() - 1);
    cr_assert_eq(admit(sh, 2, 4, &r), SBX_E_SHARD_UNAVAILABLE);
    /* Renewed: served again. */
    atomic_store(&sh->cluster->fence_at, sbx_mono_ms() + 60000);
    cr_expect_eq(admit(sh, 2, 4, &r), 0);
    drop(sh);
}
