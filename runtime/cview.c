/* cview.c — see cview.h. */
#include "cview.h"
#include "cview_int.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "err.h"
#include "log.h"
#include "util.h"

void
sbx_cview_part_key(const char *prefix, uint32_t part, char *out, size_t outlen)
{
    snprintf(out, outlen, "%sc/parts/%04u", prefix, part);
}

void
sbx_cview_rec_key(const char *prefix, uint32_t part, const char *id, char *out, size_t outlen)
{
    snprintf(out, outlen, "%sr/%04u/%s", prefix, part, id);
}

bool
sbx_cview_name_ok(const char *name, size_t n)
{
    bool ok = n >= 1 && n <= 63;
    for (size_t i = 0; i < n && ok; i++) {
        unsigned char c = (unsigned char)name[i];
        bool alnum = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
        ok = alnum || (i > 0 && (c == '.' || c == '_' || c == '-'));
    }
    return ok;
}

/* The partition a parts/ key's suffix names: exactly the 4 digits
 * sbx_cview_part_key writes (no sign, space, other width or trailer); -1
 * for anything else. */
static int
part_of(const char *s)
{
    int p = 0;
    for (int i = 0; i < 4 && p >= 0; i++)
        p = s[i] >= '0' && s[i] <= '9' ? p * 10 + (s[i] - '0') : -1;
    return p >= 0 && !s[4] && p < SBX_PARTITIONS ? p : -1;
}

/* s (n bytes) for a log line: printable ASCII as is, the rest as \xNN, at
 * most 96 bytes of it. */
static void
shown(const char *s, size_t n, char *out, size_t outlen)
{
    size_t o = 0;
    for (size_t i = 0; i < n && i < 96 && o + 5 < outlen; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '\\')
            out[o++] = (char)c;
        else
            o += (size_t)snprintf(out + o, outlen - o, "\\x%02x", c);
    }
    snprintf(out + o, outlen - o, "%s", n > 96 ? "…" : "");
}

/* ---- the drain set (under mu) ---------------------------------------------------- */

static bool
drain_has(const sbx_cview *v, const char *name)
{
    bool has = false;
    for (size_t i = 0; i < v->ndrains && !has; i++)
        has = !strcmp(v->drains[i], name);
    return has;
}

static void
drain_set(sbx_cview *v, const char *name, bool on)
{
    size_t i = 0;
    while (i < v->ndrains && strcmp(v->drains[i], name))
        i++;
    if (on && i == v->ndrains) {
        if (v->ndrains == v->capdrains) {
            v->capdrains = v->capdrains ? 2 * v->capdrains : 16;
            v->drains = sbx_xrealloc(v->drains, v->capdrains * sizeof(*v->drains));
        }
        size_t l = SBX_MIN(strlen(name), sizeof(v->drains[0]) - 1); /* a shard name: ≤ 63 */
        memcpy(v->drains[v->ndrains], name, l);
        v->drains[v->ndrains++][l] = 0;
    } else if (!on && i < v->ndrains) {
        memmove(v->drains[i], v->drains[i + 1], (v->ndrains - i - 1) * sizeof(*v->drains));
        v->ndrains--;
    }
}

/* ---- slots (under mu) ------------------------------------------------------------ */

static int
slot_find(const sbx_cview *v, const char *name)
{
    int found = -1;
    for (int i = 0; i < v->nmembers && found < 0; i++)
        if (v->members[i].name[0] && !strcmp(v->members[i].name, name))
            found = i;
    return found;
}

static void
slot_free(sbx_cview *v, int i)
{
    memcpy(v->prev[i], v->members[i].name, sizeof(v->prev[i])); /* both char[64] */
    memset(&v->members[i], 0, sizeof(v->members[i]));
    v->refs[i] = 0;
    v->freed[i] = ++v->nfreed;
}

/* Free slot i if nothing references it any more. */
static void
slot_check(sbx_cview *v, int i)
{
    if (i >= 0 && v->members[i].name[0] && !v->members[i].live && v->refs[i] == 0)
        slot_free(v, i);
}

/* A slot for a new name (valid, not in the table): the free slot it had
 * last, else one never used, else the one freed longest ago — so indexes
 * are reused as late as possible.  With evict (a live member), a full table
 * gives up the slot of the name fewest partitions reference and no members/
 * key holds; those partitions keep their epoch, without an owner.  -1: full. */
static int
slot_new(sbx_cview *v, const char *name, bool evict)
{
    int pick = -1;
    for (int i = 0; i < v->nmembers && pick < 0; i++)
        if (!v->members[i].name[0] && !strcmp(v->prev[i], name))
            pick = i; /* its own former slot */
    if (pick < 0 && v->nmembers < SBX_CVIEW_MAX_MEMBERS)
        pick = v->nmembers++; /* one never used */
    for (int i = 0; i < v->nmembers && pick < 0; i++)
        if (!v->members[i].name[0] && (pick < 0 || v->freed[i] < v->freed[pick]))
            pick = i; /* the one freed longest ago */
    if (pick < 0 && evict) {
        int victim = -1;
        for (int i = 0; i < v->nmembers; i++)
            if (!v->members[i].live && (victim < 0 || v->refs[i] < v->refs[victim]))
                victim = i;
        if (victim >= 0) {
            sbx_log_warn("cluster view: the member table is full; shard %s takes the slot of %s "
                     "(no member; %d partition(s) left without an owner in the view)",
                     name, v->members[victim].name, v->refs[victim]);
            for (int p = 0; p < SBX_PARTITIONS; p++)
                if (v->parts[p].owner == victim)
                    v->parts[p].owner = -1;
            slot_free(v, victim);
            pick = victim;
        }
    }
    if (pick >= 0) {
        struct sbx_cmember *m = &v->members[pick];
        memset(m, 0, sizeof(*m));
        snprintf(m->name, sizeof(m->name), "%s", name);
        m->gen = ++v->gen;
        m->draining = drain_has(v, name);
        v->refs[pick] = 0;
    }
    return pick;
}

int
sbx_cview_member(sbx_cview *v, const char *name)
{
    return slot_find(v, name);
}

/* ---- applying keys (under mu) ---------------------------------------------------- */

enum kkind { K_OTHER = 0, K_MEMBER, K_PART, K_DRAIN };

/* What kv is: its kind and the name (members/, drain/: the key's; parts/: the
 * value's, "" when it is not a shard name) or partition it is about.
 * K_OTHER for keys outside c/ or not ours; `why` (when not NULL) is told
 * why a key under members/, parts/ or drain/ is ignored. */
static enum kkind
classify(const sbx_cview *v, const struct sbx_etcd_kv *kv, const char **name, int *part,
         char *why, size_t wl)
{
    size_t pl = strlen(v->cprefix);
    const char *k = kv->key + pl;
    enum kkind kind = K_OTHER;
    *name = "";
    *part = -1;
    if (why)
        why[0] = 0;
    if (strncmp(kv->key, v->cprefix, pl)) {
        kind = K_OTHER;
    } else if (!strncmp(k, "members/", 8) || !strncmp(k, "drain/", 6)) {
        const char *n = k + (k[0] == 'm' ? 8 : 6);
        if (sbx_cview_name_ok(n, strlen(n))) {
            kind = k[0] == 'm' ? K_MEMBER : K_DRAIN;
            *name = n;
        } else if (why) {
            snprintf(why, wl, "not a shard name ([A-Za-z0-9][A-Za-z0-9._-]{0,62})");
        }
    } else if (!strncmp(k, "parts/", 6)) {
        *part = part_of(k + 6);
        if (*part >= 0) {
            kind = K_PART;
            if (sbx_cview_name_ok(kv->value, kv->vlen) && !memchr(kv->value, 0, kv->vlen))
                *name = kv->value;
        } else if (why) {
            snprintf(why, wl, "not a partition key (parts/0000 to parts/4095)");
        }
    }
    return kind;
}

/* A members/ key's value into m: url and relay when the value is a JSON
 * object whose strings fit (no NUL, shorter than the fields), else "". */
static void
member_value(struct sbx_cmember *m, const struct sbx_etcd_kv *kv)
{
    json_error_t je;
    json_t *j = memchr(kv->value, 0, kv->vlen) ? NULL : json_loadb(kv->value, kv->vlen, 0, &je);
    const char *url = json_string_value(json_object_get(j, "url"));
    const char *relay = json_string_value(json_object_get(j, "relay"));
    bool fits = url && strlen(url) < sizeof(m->url) && (!relay || strlen(relay) < sizeof(m->relay));
    if (!fits) {
        char v[512];
        shown(kv->value, kv->vlen, v, sizeof(v));
        sbx_log_warn("cluster view: member %s: no usable address in '%s'", m->name, v);
    }
    snprintf(m->url, sizeof(m->url), "%s", fits ? url : "");
    snprintf(m->relay, sizeof(m->relay), "%s", fits && relay ? relay : "");
    m->started_ms = json_integer_value(json_object_get(j, "startedMs"));
    json_decref(j);
}

/* Apply one key: put or delete. */
static void
apply(sbx_cview *v, bool put, const struct sbx_etcd_kv *kv)
{
    const char *name;
    int p, i;
    char why[96];
    enum kkind kind = classify(v, kv, &name, &p, why, sizeof(why));
    if (why[0]) {
        char k[512];
        shown(kv->key, strlen(kv->key), k, sizeof(k));
        sbx_log_warn("cluster view: ignoring %s: %s", k, why);
    }
    switch (kind) {
    case K_MEMBER:
        i = slot_find(v, name);
        if (put && i < 0 && (i = slot_new(v, name, true)) < 0)
            sbx_log_warn("cluster view: no slot for shard %s: %d live members already", name,
                     SBX_CVIEW_MAX_MEMBERS);
        if (i >= 0) {
            v->members[i].live = put;
            if (put)
                member_value(&v->members[i], kv);
            slot_check(v, i);
        }
        break;
    case K_PART: {
        int old = v->parts[p].owner;
        if (put && !name[0]) {
            char val[512];
            shown(kv->value, kv->vlen, val, sizeof(val));
            sbx_log_warn("cluster view: partition %04d: owner '%s' is not a shard name", p, val);
        }
        if (!(old >= 0 && put && !strcmp(v->members[old].name, name))) {
            /* a new owner: the old one may go first and make room */
            v->parts[p].owner = -1;
            if (old >= 0) {
                v->refs[old]--;
                slot_check(v, old);
            }
            i = put && name[0] ? slot_find(v, name) : -1;
            if (put && name[0] && i < 0 && (i = slot_new(v, name, false)) < 0)
                sbx_log_warn("cluster view: partition %04d: no slot for %s (the table is full)", p,
                         name);
            if (i >= 0) {
                v->parts[p].owner = (int16_t)i;
                v->refs[i]++;
            }
        }
        v->parts[p].epoch = put ? kv->mod_revision : 0;
        break;
    }
    case K_DRAIN:
        drain_set(v, name, put);
        if ((i = slot_find(v, name)) >= 0)
            v->members[i].draining = put;
        break;
    case K_OTHER:
        break;
    }
}

int
sbx_cview_watch_cb(void *arg, bool put, const struct sbx_etcd_kv *kv, int64_t revision)
{
    sbx_cview *v = arg;
    pthread_mutex_lock(&v->mu);
    apply(v, put, kv);
    if (revision > v->rev)
        v->rev = revision;
    v->nevents++;
    pthread_mutex_unlock(&v->mu);
    if (v->fn)
        v->fn(v->arg);
    return 0;
}

/* Replace the view with kvs (a range of c/ at revision rev), under mu.
 * Names the range still references keep their slots (and gens); the others
 * are freed first, so the range's new names find room; members/ keys are
 * applied before the rest, so live shards get slots before names only
 * partitions reference. */
static void
replace(sbx_cview *v, const struct sbx_etcd_kv *kvs, size_t n, int64_t rev)
{
    /* 1: referenced by a partition, 2: by a members/ key (live: never evicted
     * for another member while the range is applied) */
    int keep[SBX_CVIEW_MAX_MEMBERS] = {0};
    for (size_t k = 0; k < n; k++) {
        const char *name;
        int p, i;
        enum kkind kind = classify(v, &kvs[k], &name, &p, NULL, 0);
        if (kind != K_DRAIN && name[0] && (i = slot_find(v, name)) >= 0)
            keep[i] = SBX_MAX(keep[i], kind == K_MEMBER ? 2 : 1);
    }
    for (int i = 0; i < v->nmembers; i++) {
        v->members[i].live = keep[i] == 2;
        v->members[i].draining = false;
        v->refs[i] = 0;
        if (v->members[i].name[0] && !keep[i])
            slot_free(v, i);
    }
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        v->parts[p].owner = -1;
        v->parts[p].epoch = 0;
    }
    v->ndrains = 0;
    for (int pass = 0; pass < 2; pass++)
        for (size_t k = 0; k < n; k++) {
            const char *name;
            int p;
            bool member = classify(v, &kvs[k], &name, &p, NULL, 0) == K_MEMBER;
            if (member == (pass == 0))
                apply(v, true, &kvs[k]);
        }
    for (int i = 0; i < v->nmembers; i++)
        slot_check(v, i);
    v->rev = rev;
    v->synced = true;
}

/* A full read of c/: replaces the view. */
int
sbx_cview_resync(sbx_cview *v)
{
    char end[200];
    sbx_etcd_prefix_end(v->cprefix, end, sizeof(end));
    struct sbx_etcd_kv *kvs;
    size_t n;
    int64_t rev;
    int rc = sbx_etcd_range(v->etcd, v->cprefix, end, &kvs, &n, &rev);
    if (rc == 0) {
        pthread_mutex_lock(&v->mu);
        replace(v, kvs, n, rev);
        pthread_mutex_unlock(&v->mu);
        sbx_etcd_kvs_free(kvs, n);
        if (v->fn)
            v->fn(v->arg);
    }
    return rc;
}

/* An empty view (no member, no owner, not synced), under mu or before the
 * thread starts; keeps etcd, prefixes, callback and the drain set's
 * memory. */
void
sbx_cview_reset(sbx_cview *v)
{
    memset(v->members, 0, sizeof(v->members));
    memset(v->refs, 0, sizeof(v->refs));
    memset(v->prev, 0, sizeof(v->prev));
    memset(v->freed, 0, sizeof(v->freed));
    v->nmembers = 0;
    v->nfreed = v->gen = v->nevents = 0;
    v->ndrains = 0;
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        v->parts[p].owner = -1;
        v->parts[p].epoch = 0;
    }
    v->synced = false;
    v->rev = 0;
}

/* The revision a watch starts from after revision r (etcd's revisions are
 * int64: a garbage INT64_MAX must not overflow). */
int64_t
sbx_cview_rev_after(int64_t r)
{
    return r < INT64_MAX ? r + 1 : r;
}

/* Sleep ms, waking early when the view is stopped. */
static void
nap(sbx_cview *v, int ms)
{
    for (int left = ms; left > 0 && !atomic_load(&v->stop); left -= 100) {
        struct timespec ts = {0, (long)SBX_MIN(left, 100) * 1000000L};
        nanosleep(&ts, NULL);
    }
}

static void *
view_main(void *arg)
{
    sbx_cview *v = arg;
    char end[200];
    sbx_etcd_prefix_end(v->cprefix, end, sizeof(end));
    /* Between a watch's end and the next range: 50 ms after a watch that
     * delivered something or lasted, doubling to 2 s while ranges fail or
     * watches end at once with nothing (etcd refuses them, answers garbage). */
    int backoff = 50;
    while (!atomic_load(&v->stop)) {
        if (sbx_cview_resync(v) != 0) {
            nap(v, backoff);
            backoff = SBX_MIN(backoff * 2, 2000);
            continue;
        }
        int64_t from;
        uint64_t seen;
        pthread_mutex_lock(&v->mu);
        from = sbx_cview_rev_after(v->rev);
        seen = v->nevents;
        pthread_mutex_unlock(&v->mu);
        int64_t t0 = sbx_mono_ms();
        int rc =
            sbx_etcd_watch(v->etcd, v->cprefix, end, from, sbx_cview_watch_cb, v, &v->stop);
        pthread_mutex_lock(&v->mu);
        bool progressed = v->nevents != seen || sbx_mono_ms() - t0 >= 10000;
        pthread_mutex_unlock(&v->mu);
        backoff = progressed ? 50 : SBX_MIN(backoff * 2, 2000);
        if (rc != 0)
            nap(v, backoff);
    }
    return NULL;
}

int
sbx_cview_start(sbx_cview **out, sbx_etcd *etcd, const char *prefix, sbx_cview_fn fn, void *arg)
{
    sbx_cview *v = sbx_xcalloc(1, sizeof(*v));
    v->etcd = etcd;
    snprintf(v->prefix, sizeof(v->prefix), "%s", prefix);
    snprintf(v->cprefix, sizeof(v->cprefix), "%sc/", prefix);
    v->fn = fn;
    v->arg = arg;
    pthread_mutex_init(&v->mu, NULL);
    sbx_cview_reset(v);
    /* Published before the thread starts: its first callback may run before
     * pthread_create returns, and callbacks reach the view through *out
     * (the gateway's view_changed locks gw->view). */
    *out = v;
    if (pthread_create(&v->thread, NULL, view_main, v) != 0) {
        *out = NULL;
        pthread_mutex_destroy(&v->mu);
        free(v);
        return -EAGAIN;
    }
    return 0;
}

void
sbx_cview_stop(sbx_cview *v)
{
    if (!v)
        return;
    atomic_store(&v->stop, true);
    pthread_join(v->thread, NULL);
    pthread_mutex_destroy(&v->mu);
    free(v->drains);
    free(v);
}

void
sbx_cview_lock(sbx_cview *v)
{
    pthread_mutex_lock(&v->mu);
}

void
sbx_cview_unlock(sbx_cview *v)
{
    pthread_mutex_unlock(&v->mu);
}

const struct sbx_cmember *
sbx_cview_members(sbx_cview *v, int *n)
{
    *n = v->nmembers;
    return v->members;
}

const struct sbx_cpart *
sbx_cview_parts(sbx_cview *v)
{
    return v->parts;
}

bool
sbx_cview_synced(sbx_cview *v)
{
    return v->synced;
}

int64_t
sbx_cview_revision(sbx_cview *v)
{
    return v->rev;
}
