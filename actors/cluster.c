/*
 * cluster.c — a shard in a cluster (cluster.h; docs/cluster.md): the lease
 * and fencing, the view and admission, reconcile and claims, start and
 * stop, cluster.status.  Replication is in cluster_repl.c, handoffs in
 * cluster_handoff.c, load-then-serve in cluster_load.c; what they share is
 * cluster_int.h.
 *
 * Lease thread: registers the shard (a lease, the member key under it) and
 * keeps the lease alive every third of the TTL — and does nothing else, so
 * that no handoff, claim or etcd stall elsewhere delays a renewal.  It
 * notes when the lease could expire at the earliest (the send time of the
 * last successful keep-alive plus the TTL it reported); that minus a third
 * of the TTL is fence_at.  The loop enforces fence_at with a timer of its
 * own (fence_check): when it passes, the shard admits nothing, interrupts
 * what is in flight and stops its containers, whatever the other threads
 * are doing.  Only then does the lease thread revoke the lease and register
 * again, and the control thread reloads from etcd what the shard still owns.
 *
 * Control thread, every second or at once when the view changed —
 * reconcile: desired(p) = rendezvous hash over the live, non-draining
 * members; partitions this shard owns but another should are handed off
 * (batches of HANDOFF_BATCH per target: cluster_handoff.c); partitions it
 * should own whose owner is dead, or that have no owner, are claimed with a
 * compare-and-swap, and their records are loaded from etcd first
 * (cluster_load.c).
 */
#include "cluster.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/cview.h"
#include "../runtime/err.h"
#include "../runtime/etcd.h"
#include "../runtime/log.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster_int.h"
#include "recrev.h"
#include "shard_int.h"

#define HANDOFF_BATCH 256
#define STALE_IMPORT_MS 60000

/* A partition to claim from its (dead or absent) owner, as last seen. */
struct claim {
    uint32_t part;
    char owner[64];
    int64_t epoch;
};

bool
cluster_on(const struct shard *sh)
{
    return sh->cluster != NULL;
}

/* ------------------------------------------------------------------------------ */
/* Loop thread: the view, admission. */

struct vupdate {
    struct cluster *c;
    struct sbx_cpart parts[SBX_PARTITIONS];
    char names[SBX_CVIEW_MAX_MEMBERS][64];
    int nmembers;
    int me;
};

static void
view_apply(sbx_loop *l, void *arg)
{
    struct vupdate *u = arg;
    struct cluster *c = u->c;
    struct shard *sh = c->sh;
    (void)l;
    /* A slot the view gave to another name since the last view (cview.h):
     * an import from its former holder is from no member the view names. */
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        int16_t f = c->lp[p].imported_from;
        if (c->lp[p].imported_ms && f >= 0 && strcmp(c->member_names[f], u->names[f]))
            c->lp[p].imported_from = -1;
    }
    memcpy(c->member_names, u->names, sizeof(u->names));
    c->me = u->me;
    uint8_t stale[SBX_PARTITIONS];
    bool any_stale = false, any_load = false;
    memset(stale, 0, sizeof(stale));
    int64_t *load = sbx_xcalloc(SBX_PARTITIONS, sizeof(int64_t));
    int64_t now = sbx_wall_ms();
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        struct lpart *x = &c->lp[p];
        bool mine = u->me >= 0 && u->parts[p].owner == u->me;
        /* Owned since before this process, or claimed by us: loaded from
         * etcd below (a crash between a claim and its load leaves the local
         * store short; what it holds is not trusted). */
        if (mine && !x->mine && x->imported_ms)
            x->ready = true; /* handed to us: the import is committed */
        if (!mine) {
            x->ready = false;
            x->load_epoch = 0;
            if (x->imported_ms &&
                (u->parts[p].owner != x->imported_from || now - x->imported_ms > STALE_IMPORT_MS)) {
                /* An import whose switch never happened: its records are stale. */
                stale[p] = 1;
                any_stale = true;
                x->imported_ms = 0;
            }
        } else {
            x->imported_ms = 0;
        }
        if (!c->first_view && u->me >= 0 && !mine &&
            (u->parts[p].owner >= 0 || u->parts[p].epoch > 0)) {
            /* Owned by another shard when we start (or by a name the view does
             * not hold: cview.h): what we hold of it is stale. */
            stale[p] = 1;
            any_stale = true;
        }
        x->mine = mine;
        x->owner = u->parts[p].owner;
        x->epoch = u->parts[p].epoch;
        if (mine && !x->ready && !x->moving && x->load_epoch != x->epoch && !cluster_fenced(c) &&
            !atomic_load(&c->rebump)) {
            /* Load-then-serve: not admitted until its records came from etcd. */
            x->load_epoch = x->epoch;
            load[p] = x->epoch;
            any_load = true;
        }
    }
    if (any_load) {
        pthread_mutex_lock(&c->mu);
        for (int p = 0; p < SBX_PARTITIONS; p++)
            if (load[p])
                c->want_load[p] = load[p];
        c->loads = true;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
    }
    if (u->me >= 0) {
        c->first_view = true;
        if (any_stale)
            cluster_purge_partitions(sh, stale);
    }
    free(load);
    free(u);
}

int
cluster_admit(struct shard *sh, uint32_t part, int64_t epoch, sbx_werr *w)
{
    struct cluster *c = cluster_of(sh);
    if (!c)
        return 0;
    if (cluster_fenced(c)) {
        sbx_werr_init(w, SBX_E_SHARD_UNAVAILABLE,
                      "shard %s is not serving: it is not a live member of the cluster (its "
                      "lease is not held)",
                      sh->conf.name);
        return SBX_E_SHARD_UNAVAILABLE;
    }
    struct lpart *x = &c->lp[part % SBX_PARTITIONS];
    const char *why = NULL;
    if (!x->mine)
        why = "is not owned by this shard";
    else if (x->moving)
        why = "is being handed off";
    else if (!x->ready)
        why = "is being loaded";
    else if (epoch && epoch != x->epoch)
        why = "was routed at another epoch";
    if (!why)
        return 0;
    sbx_werr_init(w, SBX_E_WRONG_OWNER, "partition %u %s (shard %s, epoch %lld)", part, why,
                  sh->conf.name, (long long)x->epoch);
    sbx_enc *e = sbx_werr_ctx(w);
    sbx_enc_kint(e, "partition", part);
    sbx_enc_kint(e, "epoch", x->epoch);
    if (x->owner >= 0)
        sbx_enc_kstr(e, "owner", c->member_names[x->owner]);
    sbx_enc_kbool(e, "retry", x->mine);
    return SBX_E_WRONG_OWNER;
}

bool
cluster_listable(struct shard *sh, uint32_t part)
{
    struct cluster *c = cluster_of(sh);
    return !c || (c->lp[part % SBX_PARTITIONS].mine && c->lp[part % SBX_PARTITIONS].ready);
}

/* ------------------------------------------------------------------------------ */
/* Fencing. */

/* Any thread: wake the lease thread (a fence to act on, or stop). */
static void
lease_wake(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    c->lwake = true;
    pthread_cond_broadcast(&c->lcv);
    pthread_mutex_unlock(&c->mu);
}

/* Loop thread: stop serving. */
static void
fence_apply(struct cluster *c)
{
    struct shard *sh = c->sh;
    uint8_t all[SBX_PARTITIONS];
    memset(all, 1, sizeof(all));
    uint64_t max_seq;
    /* Everything in flight is interrupted; containers stop (their
     * partitions belong to other shards now or soon). */
    actor_partition_quiesce(sh, all, true, &max_seq);
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        c->lp[p].ready = false;
        c->lp[p].mine = false;
        c->lp[p].load_epoch = 0;
    }
    /* After re-joining, what we still own is reloaded from etcd (the
     * control thread's reload_owned): local state is not trusted. */
    c->first_view = true;
}

static void fence_timer_cb(sbx_loop *l, void *arg);

/*
 * Loop thread: enforce fence_at.  Before it, a timer waits for it; once it
 * passed (or is 0), the fence is applied, once per fenced spell, and the
 * lease thread told.  Runs from that timer — so the deadline holds whatever
 * the control and lease threads are blocked on — and whenever another
 * thread registered or fenced (fence_posted).
 */
static void
fence_check(struct cluster *c)
{
    struct shard *sh = c->sh;
    if (c->fence_timer)
        sbx_loop_cancel(sh->loop, c->fence_timer);
    c->fence_timer = 0;
    if (atomic_load(&c->stop))
        return;
    int64_t f = atomic_load(&c->fence_at);
    for (;;) {
        int64_t now = sbx_mono_ms();
        if (f != 0 && now < f) {
            /* A keep-alive moves f on without telling us: the timer then finds
             * it later and waits again.  +1: a timer never fires early. */
            c->fence_timer = sbx_loop_timer(sh->loop, f - now + 1, fence_timer_cb, c);
            return;
        }
        /* Passed: make it stay passed (a keep-alive answered after the
         * deadline must not revive it).  A lost race: the lease thread
         * renewed in time just now, or someone set 0; look again. */
        if (f == 0 || atomic_compare_exchange_strong(&c->fence_at, &f, 0))
            break;
    }
    if (atomic_load(&c->fence_done))
        return;
    sbx_log_warn("shard %s: fenced: not serving until it holds a lease again", sh->conf.name);
    fence_apply(c);
    atomic_store(&c->fence_done, true);
    lease_wake(c);
}

static void
fence_timer_cb(sbx_loop *l, void *arg)
{
    struct cluster *c = arg;
    (void)l;
    c->fence_timer = 0;
    fence_check(c);
}

static void
fence_posted(sbx_loop *l, void *arg)
{
    (void)l;
    fence_check(arg);
}

/* Any thread: fence at once (etcd says the lease is gone, or etcd may lack
 * writes we hold): the loop stops serving, the lease thread re-registers. */
void
cluster_fence_now(struct cluster *c)
{
    atomic_store(&c->fence_at, 0);
    sbx_loop_post(c->sh->loop, fence_posted, c);
    lease_wake(c);
}

/* ------------------------------------------------------------------------------ */
/* Control thread. */

static void
view_changed(void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->mu);
    c->dirty = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

static int
register_member(struct cluster *c)
{
    struct shard *sh = c->sh;
    int64_t lease;
    int64_t t0 = sbx_mono_ms();
    int rc = sbx_etcd_lease_grant(c->etcd, (c->ttl_ms + 999) / 1000, &lease);
    if (rc)
        return rc;
    json_t *j = json_pack("{s:s,s:s,s:I,s:i}", "url",
                          sh->conf.advertise ? sh->conf.advertise : sh->conf.listen, "relay",
                          sh->conf.relay ? sh->conf.relay : "", "startedMs",
                          (json_int_t)sh->started_ms, "pid", (int)getpid());
    char *v = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    char key[320];
    snprintf(key, sizeof(key), "%sc/members/%s", c->prefix, sh->conf.name);
    rc = sbx_etcd_put(c->etcd, key, v, strlen(v), lease, NULL);
    free(v);
    if (rc) {
        sbx_etcd_lease_revoke(c->etcd, lease);
        return rc;
    }
    c->lease = lease;
    /* A new spell of serving: its fence is still to be applied; the loop arms
     * its timer for the deadline. */
    atomic_store(&c->fence_done, false);
    atomic_store(&c->fence_at, t0 + c->ttl_ms - c->ttl_ms / 3);
    sbx_loop_post(sh->loop, fence_posted, c);
    sbx_log_info("shard %s: joined cluster %s (lease %lld, TTL %lld ms)", sh->conf.name,
             sh->conf.cluster, (long long)lease, (long long)c->ttl_ms);
    return 0;
}

/* Post the view to the loop. */
static void
post_view(struct cluster *c)
{
    struct vupdate *u = sbx_xcalloc(1, sizeof(*u));
    u->c = c;
    sbx_cview_lock(c->view);
    int n;
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    memcpy(u->parts, sbx_cview_parts(c->view), sizeof(u->parts));
    u->me = -1;
    for (int i = 0; i < n; i++) {
        snprintf(u->names[i], sizeof(u->names[i]), "%s", m[i].name);
        if (!strcmp(m[i].name, c->sh->conf.name))
            u->me = i;
    }
    u->nmembers = n;
    sbx_cview_unlock(c->view);
    /* A partition we switched away at a revision the view has not reached
     * (its watch lags, or our switch's answer was lost and read back) is not
     * ours: a view that still says so must not have it loaded and served. */
    for (int p = 0; p < SBX_PARTITIONS && u->me >= 0; p++)
        if (u->parts[p].owner == u->me && u->parts[p].epoch < c->handed_rev[p]) {
            u->parts[p].owner = -1;
            u->parts[p].epoch = c->handed_rev[p];
        }
    sbx_loop_post(c->sh->loop, view_apply, u);
}


/* A claim: ours once the transaction is applied.  The view (which follows
 * etcd) then shows it, and the loop asks for the partitions' records
 * (view_apply, cluster_load_wanted): they are served only once loaded.  A claim
 * whose answer is lost (a timeout, a broken connection) but that etcd
 * applied is found the same way, and so is one made by an earlier process
 * that crashed before loading. */
/* Control thread: partition p comes to us other than by a handoff (before
 * the claim is sent: one etcd applies but does not answer counts too). */
static void
doubt(struct cluster *c, uint32_t p)
{
    atomic_store(&c->doubt_until[p % SBX_PARTITIONS], sbx_wall_ms() + idem_ttl_ms(c->sh));
}

bool
cluster_in_doubt(struct shard *sh, uint32_t part)
{
    struct cluster *c = cluster_of(sh);
    return c && atomic_load(&c->doubt_until[part % SBX_PARTITIONS]) > sbx_wall_ms();
}

static void
claim_batch(struct cluster *c, struct claim *cl, size_t n)
{
    struct shard *sh = c->sh;
    sbx_etcd_txn *t = sbx_etcd_txn_new();
    char key[320];
    for (size_t i = 0; i < n; i++) {
        /* An owner before us (dead, or a name the view does not hold) may
         * have run requests whose ids we never see. */
        if (cl[i].owner[0] || cl[i].epoch)
            doubt(c, cl[i].part);
        sbx_cview_part_key(c->prefix, cl[i].part, key, sizeof(key));
        if (cl[i].owner[0]) {
            sbx_etcd_txn_cmp_value(t, key, cl[i].owner, strlen(cl[i].owner));
            sbx_etcd_txn_cmp_mod(t, key, cl[i].epoch);
        } else if (cl[i].epoch) {
            /* the key names no member the view holds (cview.h: not a shard
             * name, or no slot left): unchanged since we saw it */
            sbx_etcd_txn_cmp_mod(t, key, cl[i].epoch);
        } else {
            sbx_etcd_txn_cmp_create(t, key, 0);
        }
        sbx_etcd_txn_put(t, key, sh->conf.name, strlen(sh->conf.name), 0);
    }
    bool ok = false;
    int rc = sbx_etcd_txn_run(c->etcd, t, &ok, NULL);
    if (rc == 0 && ok)
        sbx_log_info("shard %s: claimed %zu partition(s); loading their records from etcd",
                 sh->conf.name, n);
    else if (rc)
        sbx_log_warn("shard %s: claim of %zu partition(s): %s (the view tells whether it was "
                 "applied)",
                 sh->conf.name, n, sbx_err_message(rc));
}

/*
 * Control thread, after a start or a fence: move every partition the view
 * shows ours to a new epoch — the claim transaction again, with ourselves
 * as the owner compared — before any of them is loaded and served.  A
 * replication transaction of the earlier process or lease (compares the
 * old epoch) that reaches etcd late — etcd stalled, it was re-sent, or an
 * etcd proxy sent a copy — then fails instead of changing a record after
 * the partition's records were read back (the fault test found values
 * older than acknowledged ones, and acknowledged ones gone, after a fence
 * or a kill -9).  A compare that fails (the partition is someone else's
 * now) is fine: the view tells.  0, or the error of a transaction etcd did
 * not answer (tried again at the next reconcile).
 */
static int
rebump(struct cluster *c, struct claim *cl, size_t n)
{
    struct shard *sh = c->sh;
    int rc = 0;
    for (size_t i = 0; i < n && rc == 0; i += TXN_PARTS / 2) {
        size_t m = SBX_MIN((size_t)TXN_PARTS / 2, n - i);
        sbx_etcd_txn *t = sbx_etcd_txn_new();
        char key[320];
        for (size_t k = i; k < i + m; k++) {
            /* What an earlier process claimed from a dead owner was in doubt,
             * and that did not survive the restart (nor what a fence let
             * others run meanwhile): in doubt again. */
            doubt(c, cl[k].part);
            sbx_cview_part_key(c->prefix, cl[k].part, key, sizeof(key));
            sbx_etcd_txn_cmp_value(t, key, sh->conf.name, strlen(sh->conf.name));
            sbx_etcd_txn_cmp_mod(t, key, cl[k].epoch);
            sbx_etcd_txn_put(t, key, sh->conf.name, strlen(sh->conf.name), 0);
        }
        bool ok = false;
        rc = sbx_etcd_txn_run(c->etcd, t, &ok, NULL);
    }
    if (rc)
        sbx_log_warn("shard %s: cannot move its %zu partition(s) to a new epoch (%s); they are "
                 "not served until it can",
                 sh->conf.name, n, sbx_err_message(rc));
    else if (n)
        sbx_log_info("shard %s: %zu partition(s) it owns moved to a new epoch; loading their "
                 "records from etcd",
                 sh->conf.name, n);
    return rc;
}

/* Compare the view with what rendezvous hashing proposes; act on it. */
static void
reconcile(struct cluster *c)
{
    struct shard *sh = c->sh;
    if (cluster_fenced(c))
        return;
    sbx_cview_lock(c->view);
    if (!sbx_cview_synced(c->view)) {
        sbx_cview_unlock(c->view);
        return;
    }
    int n;
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    const struct sbx_cpart *parts = sbx_cview_parts(c->view);
    const char *names[SBX_CVIEW_MAX_MEMBERS];
    int idx[SBX_CVIEW_MAX_MEMBERS], nl = 0, me = -1;
    for (int i = 0; i < n; i++) {
        if (!strcmp(m[i].name, sh->conf.name))
            me = i;
        if (m[i].live && !m[i].draining) {
            names[nl] = m[i].name;
            idx[nl++] = i;
        }
    }
    if (me < 0 || !m[me].live || nl == 0) {
        sbx_cview_unlock(c->view);
        return;
    }
    int16_t table[SBX_PARTITIONS];
    sbx_place_table(names, (size_t)nl, table);
    if (atomic_load(&c->rebump)) {
        size_t nb = 0;
        for (int p = 0; p < SBX_PARTITIONS; p++)
            if (parts[p].owner == me && parts[p].epoch >= c->handed_rev[p]) {
                c->claims[nb].part = (uint32_t)p;
                c->claims[nb].epoch = parts[p].epoch;
                nb++;
            }
        sbx_cview_unlock(c->view);
        if (rebump(c, c->claims, nb) == 0 && !cluster_fenced(c)) {
            /* Let the view (etcd's watch) show the new epochs first, so the
             * loop loads and serves at them (≤ 2 s; else the loads follow
             * when it does). */
            for (int w = 0; w < 100 && !atomic_load(&c->stop); w++) {
                bool seen = true;
                sbx_cview_lock(c->view);
                const struct sbx_cpart *now = sbx_cview_parts(c->view);
                for (size_t i = 0; i < nb && seen; i++)
                    seen = now[c->claims[i].part].epoch != c->claims[i].epoch;
                sbx_cview_unlock(c->view);
                if (seen)
                    break;
                cluster_nap_ms(20);
            }
            atomic_store(&c->rebump, false);
            atomic_store(&c->reload_owned, false);
            post_view(c); /* the loop asks for the loads (view_apply) */
        }
        return;
    }
    if (atomic_exchange(&c->reload_owned, false)) {
        /* Re-joined after a fence: the loop dropped what it served; the
         * view has it ask for what etcd still says we own, loaded from etcd
         * (our local state may hold writes that never replicated). */
        sbx_cview_unlock(c->view);
        post_view(c);
        return;
    }
    struct claim *claims = c->claims;
    size_t nclaims = 0;
    /* one handoff target per round: the one with the most partitions due */
    int due[SBX_CVIEW_MAX_MEMBERS] = {0};
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        if (c->busy[p])
            continue;
        int want = idx[table[p]];
        int own = parts[p].owner;
        /* Handed off by us at a revision the view has not reached yet: a
         * second handoff would send the target our (now empty) copy, which
         * replaces the records it just imported. */
        if (own == me && parts[p].epoch < c->handed_rev[p])
            continue;
        if (own == me && want != me) {
            due[want]++;
        } else if (want == me && own != me) {
            if (own < 0 || !m[own].live) {
                claims[nclaims].part = (uint32_t)p;
                snprintf(claims[nclaims].owner, sizeof(claims[0].owner), "%s",
                         own < 0 ? "" : m[own].name);
                claims[nclaims].epoch = parts[p].epoch;
                nclaims++;
            }
        }
    }
    int target = -1;
    for (int i = 0; i < n; i++)
        if (due[i] && (target < 0 || due[i] > due[target]))
            target = i;
    uint32_t hparts[HANDOFF_BATCH];
    int64_t hepochs[HANDOFF_BATCH];
    size_t nh = 0;
    char tname[64] = "", turl[256] = "";
    if (target >= 0) {
        snprintf(tname, sizeof(tname), "%s", m[target].name);
        snprintf(turl, sizeof(turl), "%s", m[target].url);
        for (int p = 0; p < SBX_PARTITIONS && nh < HANDOFF_BATCH; p++) {
            if (!c->busy[p] && parts[p].owner == me && idx[table[p]] == target &&
                parts[p].epoch >= c->handed_rev[p]) {
                hparts[nh] = (uint32_t)p;
                hepochs[nh++] = parts[p].epoch;
            }
        }
    }
    sbx_cview_unlock(c->view);

    if (nclaims)
        sbx_log_info("shard %s: claiming %zu partition(s) without a live owner", sh->conf.name,
                 nclaims);
    for (size_t i = 0; i < nclaims; i += TXN_PARTS / 2)
        claim_batch(c, claims + i, SBX_MIN((size_t)TXN_PARTS / 2, nclaims - i));
    if (nh) {
        for (size_t i = 0; i < nh; i++)
            c->busy[hparts[i]] = 1;
        cluster_handoff(c, target, tname, turl, hparts, nh, hepochs);
        for (size_t i = 0; i < nh; i++)
            c->busy[hparts[i]] = 0;
    }
}

/* Lease thread: wait up to ms, or until lease_wake. */
static void
lease_nap(struct cluster *c, int64_t ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ms = SBX_MAX(ms, 1);
    ts.tv_nsec += (ms % 1000) * 1000000L;
    ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000L;
    ts.tv_nsec %= 1000000000L;
    pthread_mutex_lock(&c->mu);
    while (!c->lwake && !atomic_load(&c->stop))
        if (pthread_cond_timedwait(&c->lcv, &c->mu, &ts) != 0)
            break;
    c->lwake = false;
    pthread_mutex_unlock(&c->mu);
}

static void *
lease_main(void *arg)
{
    struct cluster *c = arg;
    struct shard *sh = c->sh;
    int64_t next = 0; /* the next keep-alive (monotonic ms) */
    while (!atomic_load(&c->stop)) {
        if (cluster_fenced(c)) {
            if (c->lease) {
                /* The deadline passed, or another thread fenced: make the
                 * fence hold, have the loop apply it now if its timer has not
                 * yet, and give the lease up. */
                cluster_fence_now(c);
                sbx_etcd_lease_revoke(c->etcd, c->lease);
                c->lease = 0;
                atomic_store(&c->rebump, true);
                atomic_store(&c->reload_owned, true);
            }
            /* Register again only once the loop stopped serving: until then it
             * may hold partitions as ready whose records, after a fence, must
             * come from etcd. */
            if (!atomic_load(&c->fence_done)) {
                lease_nap(c, 20);
                continue;
            }
            if (register_member(c) != 0) {
                lease_nap(c, 500);
                continue;
            }
            next = sbx_mono_ms() + c->ttl_ms / 3;
            continue;
        }
        int64_t now = sbx_mono_ms();
        if (now < next) {
            lease_nap(c, next - now);
            continue;
        }
        int64_t left = 0;
        int rc = sbx_etcd_lease_keepalive(c->etcd, c->lease, &left);
        if (rc == 0 && left > 0) {
            /* Only a deadline still in force moves: one that passed while the
             * keep-alive was under way is a fence already (the loop's timer
             * applies it; this thread sees it at the top), and 0 is one. */
            int64_t f = atomic_load(&c->fence_at);
            if (f != 0 && sbx_mono_ms() < f)
                atomic_compare_exchange_strong(&c->fence_at, &f,
                                               now + left * 1000 - c->ttl_ms / 3);
            next = now + c->ttl_ms / 3;
        } else if (rc == 0) {
            /* The lease is gone: another shard may own our partitions. */
            sbx_log_warn("shard %s: lost its lease; fencing and re-joining", sh->conf.name);
            cluster_fence_now(c);
        } else {
            next = now + 200; /* etcd unreachable: try again soon */
        }
    }
    return NULL;
}

/* The cluster's members' addresses join the sandboxes' always-denied set
 * (issue 14; docs/network.md, always denied): a sandbox reaches no node of
 * its deployment, whatever its policy.  Names resolve outside the view's
 * lock, on the deny thread (deny_main), not on the control thread whose
 * claims and handoffs a slow resolver would hold up; sbx_net_deny_add skips
 * what it holds already. */
static void
deny_members(struct cluster *c)
{
    if (!c->sh->net)
        return;
    int n = 0;
    sbx_cview_lock(c->view);
    const struct sbx_cmember *m = sbx_cview_members(c->view, &n);
    struct sbx_cmember *copy = n > 0 ? sbx_xcalloc((size_t)n, sizeof(*copy)) : NULL;
    for (int i = 0; i < n; i++)
        copy[i] = m[i];
    sbx_cview_unlock(c->view);
    if (n > c->ndenied) { /* each member's addresses once (a name resolves here) */
        c->denied = sbx_xrealloc(c->denied, (size_t)n * sizeof(*c->denied));
        memset(c->denied + c->ndenied, 0, (size_t)(n - c->ndenied) * sizeof(*c->denied));
        c->ndenied = n;
    }
    for (int i = 0; i < n; i++) {
        if (!copy[i].name[0])
            continue;
        if (copy[i].url[0] && strcmp(c->denied[i][0], copy[i].url) != 0) {
            if (sbx_net_deny_add(c->sh->net, copy[i].url) != 0)
                sbx_log_warn("cluster: member %s's address (%s) could not join the sandboxes' "
                             "always-denied set", copy[i].name, copy[i].url);
            snprintf(c->denied[i][0], sizeof(c->denied[i][0]), "%s", copy[i].url);
        }
        if (copy[i].relay[0] && strcmp(c->denied[i][1], copy[i].relay) != 0) {
            (void)sbx_net_deny_add(c->sh->net, copy[i].relay);
            snprintf(c->denied[i][1], sizeof(c->denied[i][1]), "%s", copy[i].relay);
        }
    }
    free(copy);
}

/* Deny thread: deny_members each time the control thread saw the view
 * change (c->dwake), until stop. */
static void *
deny_main(void *arg)
{
    struct cluster *c = arg;
    pthread_mutex_lock(&c->mu);
    while (!atomic_load(&c->stop)) {
        if (!c->dwake) {
            pthread_cond_wait(&c->dcv, &c->mu);
            continue;
        }
        c->dwake = false;
        pthread_mutex_unlock(&c->mu);
        deny_members(c);
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

/* Control thread: follow the view, reconcile. */
static void *
ctl_main(void *arg)
{
    struct cluster *c = arg;
    while (!atomic_load(&c->stop)) {
        bool dirty;
        pthread_mutex_lock(&c->mu);
        dirty = c->dirty;
        c->dirty = false;
        pthread_mutex_unlock(&c->mu);
        if (dirty) {
            post_view(c);
            if (c->deny_thread) { /* names resolve there, not here */
                pthread_mutex_lock(&c->mu);
                c->dwake = true;
                pthread_cond_signal(&c->dcv);
                pthread_mutex_unlock(&c->mu);
            } else {
                deny_members(c);
            }
        }
        reconcile(c);
        cluster_load_wanted(c);
        pthread_mutex_lock(&c->mu);
        int64_t wait_ms = 1000; /* less when a load is due sooner */
        if (c->loads && !cluster_fenced(c))
            wait_ms = SBX_MIN(SBX_MAX(c->load_next_ms - sbx_mono_ms(), 0), wait_ms);
        if (!c->dirty && !atomic_load(&c->stop) && wait_ms > 0) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += (wait_ms % 1000) * 1000000L;
            ts.tv_sec += wait_ms / 1000 + ts.tv_nsec / 1000000000L;
            ts.tv_nsec %= 1000000000L;
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        pthread_mutex_unlock(&c->mu);
    }
    return NULL;
}

/* ------------------------------------------------------------------------------ */

/* Wake every thread of the cluster (to see stop). */
static void
wake_threads(struct cluster *c)
{
    pthread_mutex_lock(&c->mu);
    c->lwake = true;
    pthread_cond_broadcast(&c->cv);
    pthread_cond_broadcast(&c->lcv);
    pthread_cond_broadcast(&c->dcv);
    pthread_mutex_unlock(&c->mu);
    pthread_mutex_lock(&c->rmu);
    pthread_cond_broadcast(&c->rcv);
    pthread_mutex_unlock(&c->rmu);
}

int
cluster_start(struct shard *sh)
{
    if (!sh->conf.etcd || !*sh->conf.etcd)
        return 0;
    if (!sbx_cview_name_ok(sh->conf.name, strlen(sh->conf.name))) {
        /* the view of every node would ignore its member key (cview.h) */
        sbx_log_error("shard '%s': a cluster shard's name is 1-63 of [A-Za-z0-9._-], starting "
                  "with a letter or digit",
                  sh->conf.name);
        return SBX_E_VALIDATION;
    }
    struct cluster *c = sbx_xcalloc(1, sizeof(*c));
    c->sh = sh;
    c->ttl_ms = sh->conf.lease_ttl > 0 ? sh->conf.lease_ttl : 10000;
    c->claims = sbx_xcalloc(SBX_PARTITIONS, sizeof(struct claim));
    c->revs = recrev_new();
    c->me = -1;
    for (int p = 0; p < SBX_PARTITIONS; p++)
        c->lp[p].owner = -1;
    snprintf(c->prefix, sizeof(c->prefix), "/sbx/%s/",
             sh->conf.cluster && *sh->conf.cluster ? sh->conf.cluster : "default");
    atomic_store(&c->fence_done, true); /* nothing to fence before the first lease */
    atomic_store(&c->rebump, true);      /* what an earlier process owned: new epochs first */
    pthread_mutex_init(&c->mu, NULL);
    pthread_cond_init(&c->cv, NULL);
    pthread_cond_init(&c->lcv, NULL);
    pthread_cond_init(&c->dcv, NULL);
    pthread_mutex_init(&c->rmu, NULL);
    pthread_cond_init(&c->rcv, NULL);
    int rc = sbx_etcd_open(&c->etcd, sh->conf.etcd, 3000);
    if (rc) {
        sbx_log_error("shard %s: bad --etcd '%s'", sh->conf.name, sh->conf.etcd);
        free(c->claims);
        recrev_free(c->revs);
        free(c);
        return rc;
    }
    sbx_etcd_set_tls(c->etcd, sh->conf.etcd_ca, sh->conf.etcd_cert, sh->conf.etcd_key);
    char plain[256];
    if (sbx_etcd_insecure_endpoint(sh->conf.etcd, plain, sizeof(plain)))
        sbx_log_warn("shard %s: etcd at %s is plain HTTP off loopback: whoever reaches it can "
                     "change membership and partition ownership (use https:// with "
                     "--etcd-ca/--etcd-cert/--etcd-key; docs/security.md, Transports)",
                     sh->conf.name, plain);
    sh->cluster = c;
    if ((rc = sbx_cview_start(&c->view, c->etcd, c->prefix, view_changed, c)) != 0) {
        sbx_log_error("shard %s: cannot start the cluster view", sh->conf.name);
        return rc;
    }
    /* Before the control thread, which reads deny_thread: without it that
     * thread resolves members' names itself (logged). */
    c->deny_thread = pthread_create(&c->deny, NULL, deny_main, c) == 0;
    if (!c->deny_thread)
        sbx_log_warn("shard %s: no deny thread: members' names resolve on the control thread",
                     sh->conf.name);
    pthread_t *th[] = {&c->repl, &c->lth, &c->ctl};
    void *(*fn[])(void *) = {cluster_repl_main, lease_main, ctl_main};
    size_t started = 0;
    while (started < 3 && pthread_create(th[started], NULL, fn[started], c) == 0)
        started++;
    if (started < 3) {
        /* cluster_stop (the caller's stop path) revokes a lease taken meanwhile */
        atomic_store(&c->stop, true);
        wake_threads(c);
        for (size_t i = 0; i < started; i++)
            pthread_join(*th[i], NULL);
        if (c->deny_thread)
            pthread_join(c->deny, NULL);
        c->deny_thread = false;
        return -EAGAIN;
    }
    c->threads = true;
    /* Snapshots of persistent workspaces for a failover (ws_snap.c); without
     * the thread there are none (logged). */
    if (sh->conf.snapshot_interval > 0) {
        c->ws_snap_thread = pthread_create(&c->ws_snap, NULL, ws_snap_main, c) == 0;
        if (!c->ws_snap_thread)
            sbx_log_warn("shard %s: no workspace snapshot thread", sh->conf.name);
    }
    return 0;
}

void
cluster_stop(struct shard *sh)
{
    struct cluster *c = cluster_of(sh);
    if (!c || c->stopped)
        return;
    c->stopped = true;
    atomic_store(&c->stop, true);
    wake_threads(c);
    if (c->threads) {
        pthread_join(c->ctl, NULL);
        pthread_join(c->lth, NULL);
        pthread_join(c->repl, NULL);
    }
    if (c->deny_thread)
        pthread_join(c->deny, NULL);
    if (c->ws_snap_thread)
        pthread_join(c->ws_snap, NULL);
    /* What the threads posted finds stop set; the deadline's timer goes. */
    sbx_loop_cancel(sh->loop, c->fence_timer);
    c->fence_timer = 0;
    /* Leave at once: revoking the lease deletes our member key, so the
     * others claim our partitions now instead of after the TTL. */
    if (c->lease)
        sbx_etcd_lease_revoke(c->etcd, c->lease);
    c->lease = 0;
    atomic_store(&c->fence_at, 0);
    sbx_cview_stop(c->view);
    c->view = NULL;
}

void
cluster_free(struct shard *sh)
{
    struct cluster *c = cluster_of(sh);
    if (!c)
        return;
    cluster_stop(sh);
    sbx_etcd_close(c->etcd);
    cluster_ws_snap_free(c);
    while (c->rq_head) {
        struct ritem *it = c->rq_head;
        c->rq_head = it->next;
        free(it->rec);
        free(it);
    }
    free(c->outstanding);
    free(c->claims);
    free(c->denied);
    recrev_free(c->revs);
    pthread_mutex_destroy(&c->mu);
    pthread_cond_destroy(&c->cv);
    pthread_cond_destroy(&c->lcv);
    pthread_cond_destroy(&c->dcv);
    pthread_mutex_destroy(&c->rmu);
    pthread_cond_destroy(&c->rcv);
    free(c);
    sh->cluster = NULL;
}

void
cluster_encode_status(struct shard *sh, sbx_enc *e)
{
    struct cluster *c = cluster_of(sh);
    sbx_enc_map(e);
    if (!c) {
        sbx_enc_kbool(e, "enabled", false);
        sbx_enc_end(e);
        return;
    }
    int owned = 0, ready = 0, moving = 0;
    int64_t maxep = 0, minep = 0;
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        if (!c->lp[p].mine)
            continue;
        owned++;
        ready += c->lp[p].ready;
        moving += c->lp[p].moving;
        if (c->lp[p].epoch > maxep)
            maxep = c->lp[p].epoch;
        if (!minep || c->lp[p].epoch < minep)
            minep = c->lp[p].epoch;
    }
    int64_t f = atomic_load(&c->fence_at);
    sbx_enc_kbool(e, "enabled", true);
    sbx_enc_kstr(e, "cluster", sh->conf.cluster ? sh->conf.cluster : "default");
    sbx_enc_kbool(e, "fenced", cluster_fenced(c));
    sbx_enc_kint(e, "leaseMsLeft", f ? f - sbx_mono_ms() : 0);
    sbx_enc_kint(e, "partitionsOwned", owned);
    sbx_enc_kint(e, "partitionsReady", ready);
    sbx_enc_kint(e, "partitionsMoving", moving);
    sbx_enc_kint(e, "minEpoch", minep);
    sbx_enc_kint(e, "maxEpoch", maxep);
    sbx_enc_kint(e, "replicationPending", (int64_t)(c->nout - c->outhead));
    sbx_enc_end(e);
}

void
cluster_metrics(struct shard *sh, struct sbx_prom *p)
{
    struct cluster *c = cluster_of(sh);
    char l[160];
    if (!c || sbx_prom_labels(l, sizeof(l), "shard", sh->conf.name, NULL) != 0)
        return;
    int owned = 0, moving = 0;
    for (int i = 0; i < SBX_PARTITIONS; i++) {
        owned += c->lp[i].mine;
        moving += c->lp[i].mine && c->lp[i].moving;
    }
    int64_t f = atomic_load(&c->fence_at);
    int64_t left = f ? f - sbx_mono_ms() : 0;
    sbx_prom_family(p, "sbx_partitions_owned", "gauge", "partitions a shard owns");
    sbx_prom_add(p, "sbx_partitions_owned", "", l, owned);
    sbx_prom_family(p, "sbx_partitions_moving", "gauge", "owned partitions being handed off");
    sbx_prom_add(p, "sbx_partitions_moving", "", l, moving);
    sbx_prom_family(p, "sbx_etcd_lease_held", "gauge",
                    "1 while the shard holds its etcd lease (serves), 0 when fenced");
    sbx_prom_add(p, "sbx_etcd_lease_held", "", l, cluster_fenced(c) ? 0 : 1);
    sbx_prom_family(p, "sbx_etcd_lease_seconds_left", "gauge",
                    "time before the shard fences itself unless the lease is renewed");
    sbx_prom_add(p, "sbx_etcd_lease_seconds_left", "", l, left > 0 ? (double)left / 1000 : 0);
}
