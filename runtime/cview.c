/* cview.c — see cview.h. */
#include "cview.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "err.h"
#include "log.h"
#include "util.h"

struct sbx_cview {
    sbx_etcd *etcd;
    char prefix[160];
    char cprefix[176];   /* prefix + "c/" */
    sbx_cview_fn fn;
    void *arg;
    pthread_mutex_t mu;
    struct sbx_cmember members[SBX_CVIEW_MAX_MEMBERS];
    int nmembers;
    struct sbx_cpart parts[SBX_PARTITIONS];
    bool synced;
    int64_t rev;
    pthread_t thread;
    atomic_bool stop;
};

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

/* Under mu. */
static int
member_index(sbx_cview *v, const char *name)
{
    for (int i = 0; i < v->nmembers; i++)
        if (!strcmp(v->members[i].name, name))
            return i;
    if (v->nmembers == SBX_CVIEW_MAX_MEMBERS || strlen(name) >= sizeof(v->members[0].name))
        return -1;
    struct sbx_cmember *m = &v->members[v->nmembers];
    memset(m, 0, sizeof(*m));
    snprintf(m->name, sizeof(m->name), "%s", name);
    return v->nmembers++;
}

int
sbx_cview_member(sbx_cview *v, const char *name)
{
    return member_index(v, name);
}

/* Apply one key (under mu): put or delete. */
static void
apply(sbx_cview *v, bool put, const struct sbx_etcd_kv *kv)
{
    size_t pl = strlen(v->cprefix);
    if (strncmp(kv->key, v->cprefix, pl))
        return;
    const char *k = kv->key + pl;
    if (!strncmp(k, "members/", 8)) {
        int i = member_index(v, k + 8);
        if (i < 0)
            return;
        struct sbx_cmember *m = &v->members[i];
        m->live = put;
        if (put) {
            json_error_t je;
            json_t *j = json_loadb(kv->value, kv->vlen, 0, &je);
            const char *url = json_string_value(json_object_get(j, "url"));
            const char *relay = json_string_value(json_object_get(j, "relay"));
            snprintf(m->url, sizeof(m->url), "%s", url ? url : "");
            snprintf(m->relay, sizeof(m->relay), "%s", relay ? relay : "");
            m->started_ms = json_integer_value(json_object_get(j, "startedMs"));
            json_decref(j);
        }
    } else if (!strncmp(k, "parts/", 6)) {
        char *end;
        long p = strtol(k + 6, &end, 10);
        if (*end || p < 0 || p >= SBX_PARTITIONS)
            return;
        if (put && kv->vlen > 0 && kv->vlen < 64) {
            v->parts[p].owner = (int16_t)member_index(v, kv->value);
            v->parts[p].epoch = kv->mod_revision;
        } else {
            v->parts[p].owner = -1;
            v->parts[p].epoch = 0;
        }
    } else if (!strncmp(k, "drain/", 6)) {
        int i = member_index(v, k + 6);
        if (i >= 0)
            v->members[i].draining = put;
    }
}

static int
watch_cb(void *arg, bool put, const struct sbx_etcd_kv *kv, int64_t revision)
{
    sbx_cview *v = arg;
    pthread_mutex_lock(&v->mu);
    apply(v, put, kv);
    if (revision > v->rev)
        v->rev = revision;
    pthread_mutex_unlock(&v->mu);
    if (v->fn)
        v->fn(v->arg);
    return 0;
}

/* A full read of c/: replaces the view. */
static int
resync(sbx_cview *v)
{
    char end[200];
    sbx_etcd_prefix_end(v->cprefix, end, sizeof(end));
    struct sbx_etcd_kv *kvs;
    size_t n;
    int64_t rev;
    int rc = sbx_etcd_range(v->etcd, v->cprefix, end, &kvs, &n, &rev);
    if (rc)
        return rc;
    pthread_mutex_lock(&v->mu);
    for (int i = 0; i < v->nmembers; i++) {
        v->members[i].live = false;
        v->members[i].draining = false;
    }
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        v->parts[p].owner = -1;
        v->parts[p].epoch = 0;
    }
    for (size_t i = 0; i < n; i++)
        apply(v, true, &kvs[i]);
    v->rev = rev;
    v->synced = true;
    pthread_mutex_unlock(&v->mu);
    sbx_etcd_kvs_free(kvs, n);
    if (v->fn)
        v->fn(v->arg);
    return 0;
}

static void
nap(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void *
view_main(void *arg)
{
    sbx_cview *v = arg;
    char end[200];
    sbx_etcd_prefix_end(v->cprefix, end, sizeof(end));
    int backoff = 100;
    while (!atomic_load(&v->stop)) {
        if (resync(v) != 0) {
            nap(backoff);
            backoff = SBX_MIN(backoff * 2, 2000);
            continue;
        }
        backoff = 100;
        int64_t from;
        pthread_mutex_lock(&v->mu);
        from = v->rev + 1;
        pthread_mutex_unlock(&v->mu);
        sbx_etcd_watch(v->etcd, v->cprefix, end, from, watch_cb, v, &v->stop);
        if (!atomic_load(&v->stop))
            nap(50);
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
    for (int p = 0; p < SBX_PARTITIONS; p++)
        v->parts[p].owner = -1;
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
