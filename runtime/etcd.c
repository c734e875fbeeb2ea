/* etcd.c — see etcd.h.  The JSON gateway of etcd 3.4 (etcd's
 * Documentation/dev-guide/api_grpc_gateway.md): POST /v3/<service>/<method>
 * with the protobuf message as JSON; bytes fields are base64; int64 fields
 * come back as strings. */
#include "etcd.h"

#include <curl/curl.h>
#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "err.h"
#include "log.h"
#include "util.h"

#define MAX_ENDPOINTS 8
#define MAX_REPLY (256u << 20)

struct sbx_etcd {
    char *ep[MAX_ENDPOINTS];
    int nep;
    _Atomic int cur;      /* the endpoint that answered last */
    int64_t timeout_ms;
};

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;

static void
curl_init_once(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

int
sbx_etcd_open(sbx_etcd **out, const char *endpoints, int64_t timeout_ms)
{
    pthread_once(&curl_once, curl_init_once);
    sbx_etcd *e = sbx_xcalloc(1, sizeof(*e));
    e->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
    char *copy = sbx_xstrdup(endpoints), *save = NULL;
    for (char *p = strtok_r(copy, ",", &save); p && e->nep < MAX_ENDPOINTS;
         p = strtok_r(NULL, ",", &save)) {
        size_t n = strlen(p);
        while (n && p[n - 1] == '/')
            p[--n] = 0;
        if (n)
            e->ep[e->nep++] = sbx_xstrdup(p);
    }
    free(copy);
    if (!e->nep) {
        free(e);
        return SBX_E_VALIDATION;
    }
    *out = e;
    return 0;
}

void
sbx_etcd_close(sbx_etcd *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->nep; i++)
        free(e->ep[i]);
    free(e);
}

void
sbx_etcd_kvs_free(struct sbx_etcd_kv *kvs, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        free(kvs[i].key);
        free(kvs[i].value);
    }
    free(kvs);
}

void
sbx_etcd_prefix_end(const char *p, char *out, size_t outlen)
{
    /* etcd's clientv3.GetPrefixRangeEnd: the prefix with its last byte + 1. */
    snprintf(out, outlen, "%s", p);
    size_t n = strlen(out);
    while (n > 0) {
        unsigned char c = (unsigned char)out[n - 1];
        if (c < 0xff) {
            out[n - 1] = (char)(c + 1);
            out[n] = 0;
            return;
        }
        out[--n] = 0;
    }
    snprintf(out, outlen, "%c", 0); /* every key */
}

/* ------------------------------------------------------------------------------ */

static char *
b64(const void *p, size_t n)
{
    size_t l;
    return sbx_base64_encode(p, n, &l);
}

static json_t *
jb64(const void *p, size_t n)
{
    char *s = b64(p, n);
    json_t *j = json_string(s);
    free(s);
    return j;
}

static int64_t
jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    if (json_is_integer(v))
        return json_integer_value(v);
    return 0;
}

static int
kv_from_json(json_t *j, struct sbx_etcd_kv *kv)
{
    memset(kv, 0, sizeof(*kv));
    const char *k = json_string_value(json_object_get(j, "key"));
    const char *v = json_string_value(json_object_get(j, "value"));
    size_t kl = 0;
    if (!k || sbx_base64_decode(k, strlen(k), &kv->key, &kl) != 0)
        return SBX_E_STORAGE;
    kv->key = sbx_xrealloc(kv->key, kl + 1);
    kv->key[kl] = 0;
    if (v) {
        if (sbx_base64_decode(v, strlen(v), &kv->value, &kv->vlen) != 0) {
            free(kv->key);
            return SBX_E_STORAGE;
        }
        kv->value = sbx_xrealloc(kv->value, kv->vlen + 1);
    } else {
        kv->value = sbx_xmalloc(1);
        kv->vlen = 0;
    }
    kv->value[kv->vlen] = 0;
    kv->create_revision = jint(j, "create_revision");
    kv->mod_revision = jint(j, "mod_revision");
    kv->version = jint(j, "version");
    kv->lease = jint(j, "lease");
    return 0;
}

struct body {
    sbx_buf b;
    bool too_big;
};

static size_t
collect(char *p, size_t size, size_t nmemb, void *arg)
{
    struct body *bd = arg;
    size_t n = size * nmemb;
    if (bd->b.len + n > MAX_REPLY) {
        bd->too_big = true;
        return 0;
    }
    sbx_buf_append(&bd->b, p, n);
    return n;
}

/* POST path with the JSON request (stolen) to the current endpoint, trying
 * the others on a transport failure; *resp is the parsed JSON answer. */
static int
call(sbx_etcd *e, const char *path, json_t *req, json_t **resp)
{
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    if (!text)
        return SBX_E_INTERNAL;
    int rc = SBX_E_SHARD_UNAVAILABLE;
    int start = e->cur;
    for (int k = 0; k < e->nep; k++) {
        int i = (start + k) % e->nep;
        CURL *cu = curl_easy_init();
        if (!cu)
            break;
        char url[512];
        snprintf(url, sizeof(url), "%s%s", e->ep[i], path);
        struct body bd;
        sbx_buf_init(&bd.b);
        bd.too_big = false;
        struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
        curl_easy_setopt(cu, CURLOPT_URL, url);
        curl_easy_setopt(cu, CURLOPT_POSTFIELDS, text);
        curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
        curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(cu, CURLOPT_TIMEOUT_MS, (long)e->timeout_ms);
        curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT_MS, (long)SBX_MIN(e->timeout_ms, 2000));
        curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(cu, CURLOPT_WRITEDATA, &bd);
        curl_easy_setopt(cu, CURLOPT_PROTOCOLS_STR, "http,https");
        CURLcode cr = curl_easy_perform(cu);
        long status = 0;
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        curl_easy_cleanup(cu);
        if (cr != CURLE_OK) {
            sbx_buf_free(&bd.b);
            continue; /* next endpoint */
        }
        e->cur = i;
        json_error_t je;
        json_t *j = json_loadb(bd.b.p ? bd.b.p : "", bd.b.len, 0, &je);
        sbx_buf_free(&bd.b);
        if (!j || status != 200) {
            const char *msg = j ? json_string_value(json_object_get(j, "error")) : NULL;
            sbx_warn("etcd %s: HTTP %ld %s", path, status, msg ? msg : "");
            json_decref(j);
            rc = SBX_E_STORAGE;
            break;
        }
        *resp = j;
        rc = 0;
        break;
    }
    free(text);
    return rc;
}

int
sbx_etcd_range(sbx_etcd *e, const char *key, const char *range_end, struct sbx_etcd_kv **kvs,
               size_t *n, int64_t *revision)
{
    json_t *req = json_pack("{s:o}", "key", jb64(key, strlen(key)));
    if (range_end)
        json_object_set_new(req, "range_end", jb64(range_end, strlen(range_end) ? strlen(range_end) : 1));
    json_t *resp;
    int rc = call(e, "/v3/kv/range", req, &resp);
    *kvs = NULL;
    *n = 0;
    if (rc)
        return rc;
    if (revision)
        *revision = jint(json_object_get(resp, "header"), "revision");
    json_t *arr = json_object_get(resp, "kvs");
    size_t cnt = json_array_size(arr);
    if (cnt) {
        *kvs = sbx_xcalloc(cnt, sizeof(**kvs));
        for (size_t i = 0; i < cnt; i++) {
            if (kv_from_json(json_array_get(arr, i), &(*kvs)[*n]) == 0)
                (*n)++;
        }
    }
    json_decref(resp);
    return 0;
}

int
sbx_etcd_put(sbx_etcd *e, const char *key, const void *value, size_t vlen, int64_t lease,
             int64_t *revision)
{
    json_t *req = json_pack("{s:o,s:o}", "key", jb64(key, strlen(key)), "value", jb64(value, vlen));
    if (lease) {
        char l[32];
        snprintf(l, sizeof(l), "%lld", (long long)lease);
        json_object_set_new(req, "lease", json_string(l));
    }
    json_t *resp;
    int rc = call(e, "/v3/kv/put", req, &resp);
    if (rc)
        return rc;
    if (revision)
        *revision = jint(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

int
sbx_etcd_delete(sbx_etcd *e, const char *key, const char *range_end)
{
    json_t *req = json_pack("{s:o}", "key", jb64(key, strlen(key)));
    if (range_end)
        json_object_set_new(req, "range_end", jb64(range_end, strlen(range_end) ? strlen(range_end) : 1));
    json_t *resp;
    int rc = call(e, "/v3/kv/deleterange", req, &resp);
    if (rc == 0)
        json_decref(resp);
    return rc;
}

int
sbx_etcd_lease_grant(sbx_etcd *e, int64_t ttl_s, int64_t *id)
{
    char t[32];
    snprintf(t, sizeof(t), "%lld", (long long)ttl_s);
    json_t *resp;
    int rc = call(e, "/v3/lease/grant", json_pack("{s:s}", "TTL", t), &resp);
    if (rc)
        return rc;
    *id = jint(resp, "ID");
    const char *err = json_string_value(json_object_get(resp, "error"));
    json_decref(resp);
    return *id && !err ? 0 : SBX_E_STORAGE;
}

int
sbx_etcd_lease_keepalive(sbx_etcd *e, int64_t id, int64_t *ttl_left)
{
    char s[32];
    snprintf(s, sizeof(s), "%lld", (long long)id);
    json_t *resp;
    int rc = call(e, "/v3/lease/keepalive", json_pack("{s:s}", "ID", s), &resp);
    if (rc)
        return rc;
    /* A streaming RPC: the answer is {"result": {...}}. */
    json_t *r = json_object_get(resp, "result");
    *ttl_left = r ? jint(r, "TTL") : 0;
    json_decref(resp);
    return 0;
}

int
sbx_etcd_lease_revoke(sbx_etcd *e, int64_t id)
{
    char s[32];
    snprintf(s, sizeof(s), "%lld", (long long)id);
    json_t *resp;
    int rc = call(e, "/v3/lease/revoke", json_pack("{s:s}", "ID", s), &resp);
    if (rc == 0)
        json_decref(resp);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* Transactions. */

struct sbx_etcd_txn {
    json_t *compare, *success;
};

sbx_etcd_txn *
sbx_etcd_txn_new(void)
{
    sbx_etcd_txn *t = sbx_xcalloc(1, sizeof(*t));
    t->compare = json_array();
    t->success = json_array();
    return t;
}

void
sbx_etcd_txn_cmp_value(sbx_etcd_txn *t, const char *key, const void *v, size_t vlen)
{
    json_array_append_new(t->compare,
                          json_pack("{s:o,s:s,s:s,s:o}", "key", jb64(key, strlen(key)), "target",
                                    "VALUE", "result", "EQUAL", "value", jb64(v, vlen)));
}

void
sbx_etcd_txn_cmp_mod(sbx_etcd_txn *t, const char *key, int64_t rev)
{
    char r[32];
    snprintf(r, sizeof(r), "%lld", (long long)rev);
    json_array_append_new(t->compare,
                          json_pack("{s:o,s:s,s:s,s:s}", "key", jb64(key, strlen(key)), "target",
                                    "MOD", "result", "EQUAL", "mod_revision", r));
}

void
sbx_etcd_txn_cmp_create(sbx_etcd_txn *t, const char *key, int64_t rev)
{
    char r[32];
    snprintf(r, sizeof(r), "%lld", (long long)rev);
    json_array_append_new(t->compare,
                          json_pack("{s:o,s:s,s:s,s:s}", "key", jb64(key, strlen(key)), "target",
                                    "CREATE", "result", "EQUAL", "create_revision", r));
}

void
sbx_etcd_txn_put(sbx_etcd_txn *t, const char *key, const void *v, size_t vlen, int64_t lease)
{
    json_t *p = json_pack("{s:o,s:o}", "key", jb64(key, strlen(key)), "value", jb64(v, vlen));
    if (lease) {
        char l[32];
        snprintf(l, sizeof(l), "%lld", (long long)lease);
        json_object_set_new(p, "lease", json_string(l));
    }
    json_array_append_new(t->success, json_pack("{s:o}", "request_put", p));
}

void
sbx_etcd_txn_del(sbx_etcd_txn *t, const char *key)
{
    json_array_append_new(t->success,
                          json_pack("{s:{s:o}}", "request_delete_range", "key",
                                    jb64(key, strlen(key))));
}

size_t
sbx_etcd_txn_size(const sbx_etcd_txn *t)
{
    return SBX_MAX(json_array_size(t->compare), json_array_size(t->success));
}

int
sbx_etcd_txn_run(sbx_etcd *e, sbx_etcd_txn *t, bool *succeeded, int64_t *revision)
{
    json_t *req = json_pack("{s:o,s:o}", "compare", t->compare, "success", t->success);
    free(t);
    json_t *resp;
    int rc = call(e, "/v3/kv/txn", req, &resp);
    if (rc)
        return rc;
    *succeeded = json_is_true(json_object_get(resp, "succeeded"));
    if (revision)
        *revision = jint(json_object_get(resp, "header"), "revision");
    json_decref(resp);
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Watches: a streaming POST whose body is a sequence of JSON objects. */

struct wctx {
    sbx_buf b;
    sbx_etcd_watch_fn fn;
    void *arg;
    const atomic_bool *stop;
    int rc;
    bool done;
    int64_t canceled;
};

static size_t
watch_data(char *p, size_t size, size_t nmemb, void *arg)
{
    struct wctx *w = arg;
    size_t n = size * nmemb;
    if (w->b.len + n > MAX_REPLY)
        return 0;
    sbx_buf_append(&w->b, p, n);
    for (;;) {
        /* Skip whitespace between objects; parse one object at a time. */
        size_t off = 0;
        while (off < w->b.len && (w->b.p[off] == ' ' || w->b.p[off] == '\n' ||
                                  w->b.p[off] == '\r' || w->b.p[off] == '\t'))
            off++;
        sbx_buf_consume(&w->b, off);
        if (!w->b.len)
            break;
        json_error_t je;
        json_t *j = json_loadb(w->b.p, w->b.len, JSON_DISABLE_EOF_CHECK, &je);
        if (!j)
            break; /* incomplete: wait for more */
        sbx_buf_consume(&w->b, je.position);
        json_t *r = json_object_get(j, "result");
        if (r) {
            int64_t rev = jint(json_object_get(r, "header"), "revision");
            if (json_is_true(json_object_get(r, "canceled")) ||
                json_object_get(r, "compact_revision")) {
                w->rc = SBX_E_STORAGE; /* compacted or canceled: re-sync */
                w->done = true;
            }
            json_t *evs = json_object_get(r, "events");
            for (size_t i = 0; i < json_array_size(evs) && !w->done; i++) {
                json_t *ev = json_array_get(evs, i);
                const char *type = json_string_value(json_object_get(ev, "type"));
                struct sbx_etcd_kv kv;
                if (kv_from_json(json_object_get(ev, "kv"), &kv) != 0)
                    continue;
                bool put = !type || strcmp(type, "DELETE") != 0;
                if (w->fn(w->arg, put, &kv, kv.mod_revision ? kv.mod_revision : rev) != 0)
                    w->done = true;
                free(kv.key);
                free(kv.value);
            }
        }
        json_decref(j);
        if (w->done)
            return 0;
    }
    return n;
}

static int
watch_progress(void *arg, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    struct wctx *w = arg;
    (void)a;
    (void)b;
    (void)c;
    (void)d;
    return atomic_load(w->stop) ? 1 : 0;
}

int
sbx_etcd_watch(sbx_etcd *e, const char *key, const char *range_end, int64_t start,
               sbx_etcd_watch_fn fn, void *arg, const atomic_bool *stop)
{
    json_t *cr = json_pack("{s:o}", "key", jb64(key, strlen(key)));
    if (range_end)
        json_object_set_new(cr, "range_end", jb64(range_end, strlen(range_end) ? strlen(range_end) : 1));
    if (start > 0) {
        char s[32];
        snprintf(s, sizeof(s), "%lld", (long long)start);
        json_object_set_new(cr, "start_revision", json_string(s));
    }
    json_t *req = json_pack("{s:o}", "create_request", cr);
    char *text = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    struct wctx w = {.fn = fn, .arg = arg, .stop = stop, .rc = SBX_E_SHARD_UNAVAILABLE};
    sbx_buf_init(&w.b);
    CURL *cu = curl_easy_init();
    char url[512];
    snprintf(url, sizeof(url), "%s/v3/watch", e->ep[e->cur]);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_POSTFIELDS, text);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cu, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(cu, CURLOPT_CONNECTTIMEOUT_MS, 2000L);
    curl_easy_setopt(cu, CURLOPT_WRITEFUNCTION, watch_data);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, &w);
    curl_easy_setopt(cu, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(cu, CURLOPT_XFERINFOFUNCTION, watch_progress);
    curl_easy_setopt(cu, CURLOPT_XFERINFODATA, &w);
    /* A dead etcd must not leave the watch hanging: no byte for 30 s (etcd
     * sends progress notifications only on request) means re-sync. */
    curl_easy_setopt(cu, CURLOPT_LOW_SPEED_LIMIT, 1L);
    curl_easy_setopt(cu, CURLOPT_LOW_SPEED_TIME, 30L);
    curl_easy_setopt(cu, CURLOPT_PROTOCOLS_STR, "http,https");
    CURLcode rc = curl_easy_perform(cu);
    curl_slist_free_all(h);
    curl_easy_cleanup(cu);
    free(text);
    sbx_buf_free(&w.b);
    if (atomic_load(stop))
        return 0;
    if (w.done && w.rc == SBX_E_SHARD_UNAVAILABLE)
        return 0; /* the callback asked to stop */
    if (rc != CURLE_OK && !w.done) {
        /* the next call tries another endpoint */
        e->cur = (e->cur + 1) % e->nep;
    }
    return w.done ? w.rc : SBX_E_SHARD_UNAVAILABLE;
}
