/* etcd.c — see etcd.h.  The JSON gateway of etcd 3.4 (etcd's
 * Documentation/dev-guide/api_grpc_gateway.md): POST /v3/<service>/<method>
 * with the protobuf message as JSON; bytes fields are base64; int64 fields
 * come back as strings. */
#include "etcd.h"
#include "etcd_int.h"

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

#define MAX_REPLY (256u << 20)

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
    for (char *p = strtok_r(copy, ",", &save); p && e->nep < SBX_ETCD_MAX_ENDPOINTS;
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
    free(e->ca);
    free(e->cert);
    free(e->key);
    free(e);
}

void
sbx_etcd_set_tls(sbx_etcd *e, const char *ca, const char *cert, const char *key)
{
    free(e->ca);
    free(e->cert);
    free(e->key);
    e->ca = ca && *ca ? sbx_xstrdup(ca) : NULL;
    e->cert = cert && *cert ? sbx_xstrdup(cert) : NULL;
    e->key = key && *key ? sbx_xstrdup(key) : NULL;
}

bool
sbx_etcd_insecure_endpoint(const char *endpoints, char *out, size_t n)
{
    char *copy = sbx_xstrdup(endpoints ? endpoints : ""), *save = NULL;
    bool found = false;
    for (char *p = strtok_r(copy, ",", &save); p && !found; p = strtok_r(NULL, ",", &save)) {
        if (strncmp(p, "http://", 7) != 0)
            continue;
        const char *h = p + 7;
        found = !(!strncmp(h, "127.", 4) || !strncmp(h, "localhost", 9) ||
                  !strncmp(h, "[::1]", 5));
        if (found)
            snprintf(out, n, "%s", p);
    }
    free(copy);
    return found;
}

/* The TLS settings of e on a curl handle (https:// endpoints). */
static void
tls_setopts(const sbx_etcd *e, CURL *cu)
{
    if (e->ca)
        curl_easy_setopt(cu, CURLOPT_CAINFO, e->ca);
    if (e->cert && e->key) {
        curl_easy_setopt(cu, CURLOPT_SSLCERT, e->cert);
        curl_easy_setopt(cu, CURLOPT_SSLKEY, e->key);
    }
}

/* A transport failure that is TLS's (a certificate refused either way):
 * worth a warning, unlike an etcd that is down, which the caller reports. */
static void
tls_warn(const char *url, CURLcode cr)
{
    switch (cr) {
    case CURLE_SSL_CONNECT_ERROR:
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CERTPROBLEM:
    case CURLE_SSL_CACERT_BADFILE:
    case CURLE_SSL_CIPHER:
    case CURLE_SSL_ISSUER_ERROR:
    case CURLE_SSL_CLIENTCERT:
        sbx_log_warn("etcd %s: TLS: %s", url, curl_easy_strerror(cr));
        break;
    default:
        break;
    }
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

/* One kv of an answer.  The key must decode and hold no NUL (keys are
 * handed out as C strings: one with a NUL would be silently cut, and
 * "c/parts/0012\0x" read as partition 12); the value may hold NULs (records
 * are msgpack) and is NUL-terminated at vlen.  0, or SBX_E_STORAGE with *kv
 * untouched (nothing to free). */
static int
kv_from_json(json_t *j, struct sbx_etcd_kv *kv)
{
    const char *k = json_string_value(json_object_get(j, "key"));
    const char *v = json_string_value(json_object_get(j, "value"));
    char *key = NULL, *val = NULL;
    size_t kl = 0, vl = 0;
    int rc = SBX_E_STORAGE;
    if (k && sbx_base64_decode(k, strlen(k), &key, &kl) == 0 && !memchr(key, 0, kl) &&
        (!v || sbx_base64_decode(v, strlen(v), &val, &vl) == 0)) {
        /* sbx_base64_decode NUL-terminates what it returns */
        memset(kv, 0, sizeof(*kv));
        kv->key = key;
        kv->value = val ? val : sbx_xcalloc(1, 1);
        kv->vlen = vl;
        kv->create_revision = jint(j, "create_revision");
        kv->mod_revision = jint(j, "mod_revision");
        kv->version = jint(j, "version");
        kv->lease = jint(j, "lease");
        key = val = NULL;
        rc = 0;
    }
    free(key);
    free(val);
    return rc;
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
        tls_setopts(e, cu);
        CURLcode cr = curl_easy_perform(cu);
        long status = 0;
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        curl_easy_cleanup(cu);
        if (cr != CURLE_OK) {
            tls_warn(e->ep[i], cr);
            sbx_buf_free(&bd.b);
            continue; /* next endpoint */
        }
        e->cur = i;
        json_error_t je;
        json_t *j = json_loadb(bd.b.p ? bd.b.p : "", bd.b.len, 0, &je);
        sbx_buf_free(&bd.b);
        if (!j || status != 200) {
            const char *msg = j ? json_string_value(json_object_get(j, "error")) : NULL;
            sbx_log_warn("etcd %s: HTTP %ld %s", path, status, msg ? msg : "");
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
    return sbx_etcd_range_page(e, key, false, range_end, 0, 0, kvs, n, NULL, revision);
}

int
sbx_etcd_range_page(sbx_etcd *e, const char *key, bool after, const char *range_end,
                    int64_t limit, int64_t at, struct sbx_etcd_kv **kvs, size_t *n, bool *more,
                    int64_t *revision)
{
    /* after: the key followed by a NUL byte, the first key etcd orders after it
     * (the string's terminator is that byte) */
    json_t *req = json_pack("{s:o}", "key", jb64(key, strlen(key) + (after ? 1 : 0)));
    if (range_end)
        json_object_set_new(req, "range_end", jb64(range_end, strlen(range_end) ? strlen(range_end) : 1));
    if (limit > 0)
        json_object_set_new(req, "limit", json_integer(limit));
    if (at > 0)
        json_object_set_new(req, "revision", json_integer(at));
    json_t *resp;
    int rc = call(e, "/v3/kv/range", req, &resp);
    *kvs = NULL;
    *n = 0;
    if (more)
        *more = false;
    if (rc)
        return rc;
    if (revision)
        *revision = jint(json_object_get(resp, "header"), "revision");
    if (more)
        *more = json_is_true(json_object_get(resp, "more"));
    json_t *arr = json_object_get(resp, "kvs");
    size_t cnt = json_array_size(arr);
    if (cnt) {
        *kvs = sbx_xcalloc(cnt, sizeof(**kvs));
        for (size_t i = 0; i < cnt; i++) {
            if (kv_from_json(json_array_get(arr, i), &(*kvs)[*n]) == 0)
                (*n)++;
        }
        if (*n < cnt) /* the others are what they were: one bad key is no reason to fail */
            sbx_log_warn("etcd range: %zu of %zu key(s) skipped (not base64, or a key with a NUL)",
                     cnt - *n, cnt);
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
/* Watches: a streaming POST whose body is a sequence of JSON objects, one per
 * WatchResponse, back to back.
 *
 * The body is read in time linear in its length, however curl cuts it:
 *  - a scanner walks each byte once (nesting depth, inside a string, after a
 *    backslash), so it knows where each top-level object ends; jansson then
 *    parses exactly that object, once, and the offset of the next one is
 *    kept (the buffer is compacted only when the dead prefix is at least
 *    half of it);
 *  - an object that has not ended yet is trial-parsed each time it has
 *    doubled since its last trial (at most twice its length in all).  If
 *    jansson stops for the end of the input, or within the last 3 bytes
 *    (where a literal, number or escape cut short is reported, and a UTF-8
 *    character cut after its first byte), the object may just be incomplete:
 *    wait for more.  If it stops before, no continuation can repair it.
 * An object that does not parse, a byte between objects that cannot start
 * one, an event that does not decode (bad base64, a key with a NUL), an
 * {"error": …} object, a canceled or compacted watch and an HTTP status
 * other than 200 all end the watch with SBX_E_STORAGE: the caller re-syncs
 * from a fresh range, as after a compaction, instead of waiting on a stream
 * it can no longer follow. */

#define WATCH_CUT_SLACK 3 /* bytes before the end where a cut-short object can fail */

enum wend {
    W_ON = 0,  /* following */
    W_STOPPED, /* the callback asked to stop */
    W_RESYNC,  /* malformed, refused, canceled or compacted: SBX_E_STORAGE */
};

struct wctx {
    CURL *cu;             /* the transfer (its HTTP status) */
    sbx_buf b;            /* bytes received and not dropped yet */
    size_t obj;           /* offset in b of the pending object (past the last complete one) */
    size_t scan;          /* bytes of b the scanner has walked */
    size_t tried;         /* length of the pending object at its last trial parse (0: none) */
    int depth;            /* nesting of the pending object at scan (0: between objects) */
    bool in_str, esc;     /* the scanner is inside a string / after its backslash */
    bool status_checked;  /* the HTTP status was 200 when the body began */
    sbx_etcd_watch_fn fn;
    void *arg;
    const atomic_bool *stop;
    enum wend end;
};

/* Whether jansson's failure on n bytes may be the end of the input cutting
 * a valid object short (see above) rather than bytes no continuation
 * repairs. */
static bool
json_cut_short(const json_error_t *je, size_t n)
{
    return json_error_code(je) == json_error_premature_end_of_input ||
           (je->position >= 0 && (size_t)je->position + WATCH_CUT_SLACK >= n);
}

static void
watch_resync(struct wctx *w, const char *why, const char *detail)
{
    sbx_log_warn("etcd watch: %s%s%s; re-syncing", why, detail ? ": " : "", detail ? detail : "");
    w->end = W_RESYNC;
}

/* One complete object of the stream (owned by the caller): deliver its
 * events in order, or end the watch. */
static void
watch_object(struct wctx *w, json_t *j)
{
    json_t *err = json_object_get(j, "error");
    if (err) {
        const char *msg = json_string_value(json_object_get(err, "message"));
        watch_resync(w, "etcd ended the stream with an error", msg ? msg : "(no message)");
        return;
    }
    json_t *r = json_object_get(j, "result");
    if (!json_is_object(r))
        return; /* not a WatchResponse: nothing for us */
    if (json_is_true(json_object_get(r, "canceled")) || json_object_get(r, "compact_revision")) {
        w->end = W_RESYNC; /* compacted or canceled: an ordinary re-sync, no log line */
        return;
    }
    int64_t rev = jint(json_object_get(r, "header"), "revision");
    json_t *evs = json_object_get(r, "events");
    if (evs && !json_is_array(evs)) {
        watch_resync(w, "malformed answer", "'events' is not an array");
        return;
    }
    for (size_t i = 0; i < json_array_size(evs) && w->end == W_ON; i++) {
        json_t *ev = json_array_get(evs, i);
        json_t *type = json_object_get(ev, "type");
        const char *ts = json_string_value(type);
        /* grpc-gateway leaves out PUT (enum 0) and spells DELETE */
        bool put = !type || (ts && !strcmp(ts, "PUT")) ||
                   (json_is_integer(type) && json_integer_value(type) == 0);
        bool del = (ts && !strcmp(ts, "DELETE")) ||
                   (json_is_integer(type) && json_integer_value(type) == 1);
        struct sbx_etcd_kv kv;
        if ((!put && !del) || kv_from_json(json_object_get(ev, "kv"), &kv) != 0) {
            watch_resync(w, "malformed event", "an unknown type, or a kv that does not decode");
            return;
        }
        if (w->fn(w->arg, put, &kv, kv.mod_revision ? kv.mod_revision : rev) != 0)
            w->end = W_STOPPED;
        free(kv.key);
        free(kv.value);
    }
}

/* Trial-parse the pending (unended) object: end the watch if it is already
 * malformed; else remember its length. */
static void
watch_try_pending(struct wctx *w)
{
    size_t len = w->b.len - w->obj;
    json_error_t je;
    json_t *j = json_loadb(w->b.p + w->obj, len, JSON_DISABLE_EOF_CHECK, &je);
    if (j) {
        json_decref(j); /* cannot happen for an object the scanner saw open; it decides */
    } else if (!json_cut_short(&je, len)) {
        char d[JSON_ERROR_TEXT_LENGTH + 48];
        snprintf(d, sizeof(d), "%s (byte %d of an object)", je.text, je.position);
        watch_resync(w, "malformed answer", d);
    }
    w->tried = len;
}

/* Walk the bytes received since the last call; handle each object that
 * ends. */
static void
watch_scan(struct wctx *w)
{
    const unsigned char *p = (const unsigned char *)w->b.p;
    for (; w->scan < w->b.len && w->end == W_ON; w->scan++) {
        unsigned char c = p[w->scan];
        if (w->depth == 0) {
            if (c == ' ' || c == '\n' || c == '\r' || c == '\t') {
                w->obj = w->scan + 1;
            } else if (c == '{') {
                w->obj = w->scan;
                w->depth = 1;
                w->tried = 0;
            } else {
                char d[48];
                snprintf(d, sizeof(d), "byte 0x%02x between objects", c);
                watch_resync(w, "malformed answer", d);
            }
        } else if (w->in_str) {
            if (w->esc)
                w->esc = false;
            else if (c == '\\')
                w->esc = true;
            else if (c == '"')
                w->in_str = false;
        } else if (c == '"') {
            w->in_str = true;
        } else if (c == '{' || c == '[') {
            w->depth++; /* jansson refuses depths past 2048: such an object fails below */
        } else if ((c == '}' || c == ']') && --w->depth == 0) {
            json_error_t je;
            size_t len = w->scan + 1 - w->obj;
            json_t *j = json_loadb(w->b.p + w->obj, len, 0, &je);
            if (!j) {
                char d[JSON_ERROR_TEXT_LENGTH + 48];
                snprintf(d, sizeof(d), "%s (byte %d of an object)", je.text, je.position);
                watch_resync(w, "malformed answer", d);
            } else {
                watch_object(w, j);
                json_decref(j);
            }
            w->obj = w->scan + 1;
            w->tried = 0;
        }
    }
}

static size_t
watch_data(char *p, size_t size, size_t nmemb, void *arg)
{
    struct wctx *w = arg;
    size_t n = size * nmemb;
    if (!w->status_checked) {
        /* The status is known once the body begins: an error answer is not
         * a stream of events. */
        long status = 0;
        curl_easy_getinfo(w->cu, CURLINFO_RESPONSE_CODE, &status);
        if (status != 200) {
            char d[32];
            snprintf(d, sizeof(d), "HTTP %ld", status);
            watch_resync(w, "etcd refused the watch", d);
            return 0;
        }
        w->status_checked = true;
    }
    if (w->b.len - w->obj + n > MAX_REPLY) {
        watch_resync(w, "an answer over the size limit", NULL);
        return 0;
    }
    sbx_buf_append(&w->b, p, n);
    watch_scan(w);
    size_t pending = w->b.len - w->obj;
    if (w->end == W_ON && w->depth > 0 && pending >= 2 * w->tried)
        watch_try_pending(w);
    if (w->obj > 0 && w->obj >= w->b.len / 2) {
        /* drop what was handled: at most as many bytes move as were dropped */
        sbx_buf_consume(&w->b, w->obj);
        w->scan -= w->obj;
        w->obj = 0;
    }
    return w->end == W_ON ? n : 0;
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
    struct wctx w = {.fn = fn, .arg = arg, .stop = stop, .end = W_ON};
    sbx_buf_init(&w.b);
    int rc = SBX_E_INTERNAL;
    CURL *cu = text ? curl_easy_init() : NULL;
    if (cu) {
        w.cu = cu;
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
        tls_setopts(e, cu);
        CURLcode cc = curl_easy_perform(cu);
        long status = 0;
        curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(h);
        curl_easy_cleanup(cu);
        if (w.end == W_ON && cc == CURLE_OK && status != 200) {
            /* an error answer with no body at all */
            char d[32];
            snprintf(d, sizeof(d), "HTTP %ld", status);
            watch_resync(&w, "etcd refused the watch", d);
        }
        if (w.end == W_ON && w.depth > 0 && !atomic_load(stop))
            watch_try_pending(&w); /* the stream ended inside an object: cut, or malformed? */
        if (atomic_load(stop) || w.end == W_STOPPED) {
            rc = 0;
        } else if (w.end == W_RESYNC) {
            rc = SBX_E_STORAGE;
        } else {
            /* The stream ended or broke: the next call tries another endpoint
             * if this one failed. */
            if (cc != CURLE_OK)
                e->cur = (e->cur + 1) % e->nep;
            rc = SBX_E_SHARD_UNAVAILABLE;
        }
    }
    free(text);
    sbx_buf_free(&w.b);
    return rc;
}
