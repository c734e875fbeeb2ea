/*
 * fuzz_etcd.c — etcd's answers as sbx reads them: the JSON gateway client
 * (runtime/etcd.c) and the cluster view built from them (runtime/cview.c),
 * both linked as they are and reached through runtime/etcd_int.h and
 * runtime/cview_int.h.
 *
 * The transport is scripted: libcurl's easy API is wrapped at link time by
 * fakes here that hand the real write callbacks a sequence of answers (an
 * HTTP status and a body, or a transport failure), a watch's body cut into
 * the chunks the input says.  Everything above curl runs for real: call(),
 * the kvs/header/succeeded/ID/TTL readers, watch_data's incremental parse,
 * sbx_cview_resync() and apply() on a view with no thread of its own.
 * jansson's json_loadb is counted (the bytes it is handed), and so are the
 * bytes the write callbacks take.
 *
 * Input: byte 0 picks the flow, byte 1 is a flag; then answers separated
 * by 0x1e, each a header byte (bit 0: transport failure; bits 1-2: status
 * 200, 200, 404, 500) and a body whose chunks are separated by 0x1f.
 *  - flow 0: the view: a range of c/, a watch from its revision, then (if
 *    answers are left) a second range, as after the watch ended;
 *  - flow 1: put, lease grant, keep-alive, txn, range, delete, revoke, each
 *    with the next answers;
 *  - flow 2: a watch's body parsed in the given chunks, in one piece and
 *    byte by byte (bodies up to 64 KiB: the reader is linear).
 *
 * Properties:
 *  - a call succeeds exactly when the first answer that is not a transport
 *    failure (two endpoints: at most two tries) has status 200 and a JSON
 *    object or array as body; a lease grant also needs a non-zero ID;
 *    ranges return, in order, exactly the kvs whose key (and value, if any)
 *    decode as base64 and whose key holds no NUL (refused, never cut), each
 *    NUL-terminated at its length;
 *  - a watch delivers the same events and ends the same way however its
 *    body is cut into chunks (as scripted, in one piece, byte by byte), and
 *    that is what a reference reading the whole body with jansson says:
 *    the events of the objects before the first one that does not parse,
 *    does not start with '{', holds an event that does not decode (a key
 *    with a NUL), is an {"error"} or a canceled or compacted result; then
 *    SBX_E_STORAGE (re-sync), or SBX_E_SHARD_UNAVAILABLE when the stream
 *    just ends (either when it ends inside an object jansson fails on within
 *    its last 3 bytes: cut short or broken there); a status other than 200
 *    is SBX_E_STORAGE with no event;
 *  - the watch's cost is linear: jansson parses at most 4 bytes per body
 *    byte however it is cut; and read byte by byte, a watch stops reading
 *    within twice the distance from a malformed object's start to where
 *    jansson fails in it (it does not buffer the rest of the stream);
 *  - the view, against a model that reads the keys by cview.h's rules
 *    (partition keys exactly 4 digits below 4096, shard names 1-63 of
 *    [A-Za-z0-9._-] from a letter or digit, anything else ignored): at most
 *    SBX_CVIEW_MAX_MEMBERS slots; a used slot holds a shard name, once, with
 *    a gen of its own, and is referenced — by a members/ key or a partition
 *    (stale and garbage names do not stay); every partition's owner is -1
 *    or a slot index (the gateway and shards index members[] with it) and,
 *    with its epoch, is what the last put or delete of its canonical key
 *    says (-1 at the key's epoch for a value that is not a shard name or
 *    holds a NUL; -1 for a good name only once more names than slots were
 *    referenced); every live member has a slot unless more than
 *    SBX_CVIEW_MAX_MEMBERS were live at once; live, draining and the
 *    address (whole or none, never cut) are the model's; the revision is
 *    the range's or a later event's;
 *  - a second re-sync (flow 0 with answers left) becomes that range, and
 *    every name that had a slot and still has one keeps its index and gen
 *    (gateways keep a socket per slot) unless the range references more
 *    names than slots.
 */
#include <ctype.h>
#include <curl/curl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../runtime/cview_int.h"
#include "../../runtime/err.h"
#include "../../runtime/etcd_int.h"
#include "../../runtime/util.h"

/* The calls of etcd.o and cview.o to libcurl's easy API and to jansson's
 * json_loadb come here (-Wl,--wrap=…, see the Makefile); this file's own
 * parses call the real json_loadb. */
CURL *__wrap_curl_easy_init(void);
CURLcode __wrap_curl_easy_setopt(CURL *h, CURLoption o, ...);
CURLcode __wrap_curl_easy_perform(CURL *h);
CURLcode __wrap_curl_easy_getinfo(CURL *h, CURLINFO i, ...);
void __wrap_curl_easy_cleanup(CURL *h);
json_t *__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);
json_t *__real_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error);

/* jansson's parser is counted: a watch must parse each byte O(1) times. */
static size_t fuzz_parsed;

json_t *
__wrap_json_loadb(const char *buffer, size_t buflen, size_t flags, json_error_t *error)
{
    fuzz_parsed += buflen;
    return __real_json_loadb(buffer, buflen, flags, error);
}

/* An int64 field of an answer as etcd's JSON gateway writes it (a string,
 * or a number), 0 when absent: the reference's reader. */
static int64_t
jint(json_t *o, const char *k)
{
    json_t *v = json_object_get(o, k);
    if (json_is_string(v))
        return strtoll(json_string_value(v), NULL, 10);
    return json_is_integer(v) ? json_integer_value(v) : 0;
}

#include "fuzz.h"

/* ------------------------------------------------------------------------------ */
/* The scripted transport. */

#define SEP_ANSWER 0x1e
#define SEP_CHUNK 0x1f

struct answer {
    const uint8_t *p; /* header byte, then the body */
    size_t n;
};

static struct {
    struct answer a[64];
    size_t n, next;
    int chunking;    /* 0 as scripted, 1 one piece, 2 byte by byte */
    size_t accepted; /* body bytes the write callbacks took */
} S;

struct fake {
    curl_write_callback wfn;
    void *wdata;
    curl_xferinfo_callback pfn;
    void *pdata;
    long status;
};

CURL *
__wrap_curl_easy_init(void)
{
    return (CURL *)sbx_xcalloc(1, sizeof(struct fake));
}

CURLcode
__wrap_curl_easy_setopt(CURL *h, CURLoption o, ...)
{
    struct fake *f = (struct fake *)h;
    va_list ap;
    va_start(ap, o);
    switch (o) {
    case CURLOPT_WRITEFUNCTION: f->wfn = va_arg(ap, curl_write_callback); break;
    case CURLOPT_WRITEDATA: f->wdata = va_arg(ap, void *); break;
    case CURLOPT_XFERINFOFUNCTION: f->pfn = va_arg(ap, curl_xferinfo_callback); break;
    case CURLOPT_XFERINFODATA: f->pdata = va_arg(ap, void *); break;
    default: break; /* the rest only shapes the request */
    }
    va_end(ap);
    return CURLE_OK;
}

/* One piece of a body to the write callback, as curl does it. */
static CURLcode
deliver(struct fake *f, const uint8_t *p, size_t n)
{
    if (!n)
        return CURLE_OK; /* curl never writes nothing */
    if (f->pfn && f->pfn(f->pdata, 0, 0, 0, 0))
        return CURLE_ABORTED_BY_CALLBACK;
    char *copy = fuzz_copy(p, n);
    size_t w = f->wfn(copy, 1, n, f->wdata);
    free(copy);
    if (w == n)
        S.accepted += n;
    return w == n ? CURLE_OK : CURLE_WRITE_ERROR;
}

CURLcode
__wrap_curl_easy_perform(CURL *h)
{
    struct fake *f = (struct fake *)h;
    if (S.next >= S.n)
        return CURLE_COULDNT_CONNECT;
    struct answer a = S.a[S.next++];
    if (!a.n || (a.p[0] & 1))
        return CURLE_COULDNT_CONNECT;
    static const long status[] = {200, 200, 404, 500};
    f->status = status[(a.p[0] >> 1) & 3];
    const uint8_t *b = a.p + 1;
    size_t bn = a.n - 1;
    if (S.chunking == 2) {
        for (size_t i = 0; i < bn; i++) {
            if (b[i] == SEP_CHUNK)
                continue;
            CURLcode rc = deliver(f, b + i, 1);
            if (rc)
                return rc;
        }
        return CURLE_OK;
    }
    uint8_t *whole = NULL;
    size_t wl = 0;
    if (S.chunking == 1) {
        whole = sbx_xmalloc(bn + 1);
        for (size_t i = 0; i < bn; i++)
            if (b[i] != SEP_CHUNK)
                whole[wl++] = b[i];
        CURLcode rc = deliver(f, whole, wl);
        free(whole);
        return rc;
    }
    for (size_t i = 0; i <= bn;) {
        const uint8_t *e = memchr(b + i, SEP_CHUNK, bn - i);
        size_t cl = e ? (size_t)(e - (b + i)) : bn - i;
        CURLcode rc = deliver(f, b + i, cl);
        if (rc)
            return rc;
        i += cl + 1;
    }
    return CURLE_OK;
}

CURLcode
__wrap_curl_easy_getinfo(CURL *h, CURLINFO i, ...)
{
    struct fake *f = (struct fake *)h;
    va_list ap;
    va_start(ap, i);
    if (i == CURLINFO_RESPONSE_CODE)
        *va_arg(ap, long *) = f->status;
    va_end(ap);
    return CURLE_OK;
}

void
__wrap_curl_easy_cleanup(CURL *h)
{
    free(h);
}

static void
script(const uint8_t *d, size_t n)
{
    S.n = S.next = 0;
    S.chunking = 0;
    for (size_t i = 0; i <= n && S.n < SBX_ARRAY_LEN(S.a);) {
        const uint8_t *e = memchr(d + i, SEP_ANSWER, n - i);
        size_t l = e ? (size_t)(e - (d + i)) : n - i;
        S.a[S.n].p = d + i;
        S.a[S.n++].n = l;
        i += l + 1;
    }
}

/* The answer a call will take, and whether it succeeds: the first answer
 * that is not a transport failure among the next two (two endpoints). */
static json_t *
expect_call(bool *ok, bool *answered)
{
    *ok = *answered = false;
    for (size_t k = 0; k < 2 && S.next + k < S.n; k++) {
        struct answer a = S.a[S.next + k];
        if (!a.n || (a.p[0] & 1))
            continue;
        *answered = true;
        sbx_buf b;
        sbx_buf_init(&b);
        for (size_t i = 1; i < a.n; i++)
            if (a.p[i] != SEP_CHUNK)
                sbx_buf_append(&b, &a.p[i], 1);
        json_error_t je;
        json_t *j = __real_json_loadb(b.p ? b.p : "", b.len, 0, &je);
        sbx_buf_free(&b);
        *ok = j && ((a.p[0] >> 1) & 3) < 2;
        if (!*ok) {
            json_decref(j);
            j = NULL;
        }
        return j;
    }
    return NULL;
}

static void
check_rc(int rc, bool ok, bool answered, const char *what)
{
    if (ok)
        FUZZ_CHECK(rc == 0, "%s failed: %d", what, rc);
    else
        FUZZ_CHECK(rc == (answered ? SBX_E_STORAGE : SBX_E_SHARD_UNAVAILABLE), "%s: %d", what, rc);
}

/* ------------------------------------------------------------------------------ */
/* Flow 1: the calls. */

/* The kvs a range must return for answer j: those whose key (and value)
 * decode. */
static void
check_kvs(json_t *j, const struct sbx_etcd_kv *kvs, size_t n)
{
    json_t *arr = json_object_get(j, "kvs");
    size_t k = 0;
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *o = json_array_get(arr, i);
        const char *ks = json_string_value(json_object_get(o, "key"));
        json_t *vj = json_object_get(o, "value");
        const char *vs = json_string_value(vj);
        char *key = NULL, *val = NULL;
        size_t kl = 0, vl = 0;
        /* a key with a NUL is refused, not cut at it */
        bool good = ks && sbx_base64_decode(ks, strlen(ks), &key, &kl) == 0 &&
                    !memchr(key, 0, kl) &&
                    (!vs || sbx_base64_decode(vs, strlen(vs), &val, &vl) == 0);
        if (good) {
            FUZZ_CHECK(k < n, "kv %zu missing", i);
            const struct sbx_etcd_kv *kv = &kvs[k++];
            FUZZ_CHECK(!memcmp(kv->key, key, kl) && kv->key[kl] == 0, "kv %zu: key", i);
            FUZZ_CHECK(kv->vlen == vl && (!vl || !memcmp(kv->value, val, vl)) &&
                           kv->value[vl] == 0,
                       "kv %zu: value", i);
        }
        free(key);
        free(val);
    }
    FUZZ_CHECK(k == n, "%zu kvs returned, %zu decode", n, k);
}

static void
flow_calls(sbx_etcd *e)
{
    bool ok, answered;
    int64_t rev = 0, id = 0, ttl = 0;
    json_t *j;

    j = expect_call(&ok, &answered);
    check_rc(sbx_etcd_put(e, "/sbx/t/c/parts/0001", "s1", 2, 7, &rev), ok, answered, "put");
    json_decref(j);

    j = expect_call(&ok, &answered);
    int rc = sbx_etcd_lease_grant(e, 10, &id);
    bool granted = ok && jint(j, "ID") != 0 && !json_is_string(json_object_get(j, "error"));
    if (granted)
        FUZZ_CHECK(rc == 0 && id != 0, "lease grant: %d, ID %lld", rc, (long long)id);
    else
        FUZZ_CHECK(rc != 0, "lease grant succeeded with ID %lld", (long long)id);
    json_decref(j);

    j = expect_call(&ok, &answered);
    check_rc(sbx_etcd_lease_keepalive(e, 42, &ttl), ok, answered, "keepalive");
    if (ok)
        FUZZ_CHECK(ttl == (json_object_get(j, "result") ? jint(json_object_get(j, "result"), "TTL")
                                                        : 0),
                   "TTL %lld", (long long)ttl);
    json_decref(j);

    sbx_etcd_txn *t = sbx_etcd_txn_new();
    sbx_etcd_txn_cmp_mod(t, "/sbx/t/c/parts/0001", 3);
    sbx_etcd_txn_put(t, "/sbx/t/c/parts/0001", "s2", 2, 0);
    sbx_etcd_txn_del(t, "/sbx/t/c/drain/s2");
    bool succeeded = false;
    j = expect_call(&ok, &answered);
    check_rc(sbx_etcd_txn_run(e, t, &succeeded, &rev), ok, answered, "txn");
    if (ok)
        FUZZ_CHECK(succeeded == json_is_true(json_object_get(j, "succeeded")), "txn succeeded");
    json_decref(j);

    struct sbx_etcd_kv *kvs;
    size_t n;
    j = expect_call(&ok, &answered);
    check_rc(sbx_etcd_range(e, "/sbx/t/r/", "/sbx/t/r0", &kvs, &n, &rev), ok, answered, "range");
    if (ok)
        check_kvs(j, kvs, n);
    else
        FUZZ_CHECK(!kvs && !n, "kvs from a failed range");
    sbx_etcd_kvs_free(kvs, n);
    json_decref(j);

    j = expect_call(&ok, &answered);
    check_rc(sbx_etcd_delete(e, "/sbx/t/c/drain/s1", NULL), ok, answered, "delete");
    json_decref(j);
    j = expect_call(&ok, &answered);
    check_rc(sbx_etcd_lease_revoke(e, 42), ok, answered, "revoke");
    json_decref(j);
}

/* ------------------------------------------------------------------------------ */
/* Flow 2: a watch, however its body is cut. */

struct rec {
    sbx_buf b;   /* the events, serialized */
    int count, stop_after;
};

static int
rec_cb(void *arg, bool put, const struct sbx_etcd_kv *kv, int64_t revision)
{
    struct rec *r = arg;
    FUZZ_CHECK(kv->key && kv->value && kv->value[kv->vlen] == 0, "an unterminated kv");
    sbx_buf_appendf(&r->b, "%c%zu:", put ? 'P' : 'D', strlen(kv->key));
    sbx_buf_append(&r->b, kv->key, strlen(kv->key));
    sbx_buf_appendf(&r->b, "%zu:", kv->vlen);
    sbx_buf_append(&r->b, kv->value, kv->vlen);
    sbx_buf_appendf(&r->b, "@%lld/%lld/%lld\n", (long long)revision,
                    (long long)kv->create_revision, (long long)kv->version);
    return ++r->count == r->stop_after;
}

static int
watch_as(sbx_etcd *e, int chunking, int stop_after, struct rec *r)
{
    static atomic_bool stop;
    S.next = 0;
    S.chunking = chunking;
    S.accepted = 0;
    fuzz_parsed = 0;
    sbx_buf_init(&r->b);
    r->count = 0;
    r->stop_after = stop_after;
    return sbx_etcd_watch(e, "/sbx/t/c/", "/sbx/t/c0", 5, rec_cb, r, &stop);
}

/* The reference for one complete object of a watch's body, written from
 * etcd's API rather than from etcd.c's reader: 0 go on, 1 the callback
 * stopped, -1 the watch must end for a re-sync. */
static int
ref_object(json_t *j, struct rec *r)
{
    json_t *res = json_object_get(j, "result");
    json_t *evs = json_object_get(res, "events");
    if (json_object_get(j, "error") ||
        (json_is_object(res) && (json_is_true(json_object_get(res, "canceled")) ||
                                 json_object_get(res, "compact_revision") ||
                                 (evs && !json_is_array(evs)))))
        return -1;
    if (!json_is_object(res))
        return 0;
    int64_t hrev = jint(json_object_get(res, "header"), "revision");
    for (size_t i = 0; i < json_array_size(evs); i++) {
        json_t *ev = json_array_get(evs, i), *type = json_object_get(ev, "type");
        json_t *kj = json_object_get(ev, "kv");
        const char *ts = json_string_value(type);
        const char *ks = json_string_value(json_object_get(kj, "key"));
        const char *vs = json_string_value(json_object_get(kj, "value"));
        int kind = !type ? 0 : ts ? (!strcmp(ts, "PUT") ? 0 : !strcmp(ts, "DELETE") ? 1 : -1)
                         : json_is_integer(type) && json_integer_value(type) >= 0 &&
                                   json_integer_value(type) <= 1
                               ? (int)json_integer_value(type)
                               : -1;
        struct sbx_etcd_kv kv = {0};
        size_t kl = 0;
        bool good = kind >= 0 && ks && sbx_base64_decode(ks, strlen(ks), &kv.key, &kl) == 0 &&
                    !memchr(kv.key, 0, kl) &&
                    (!vs || sbx_base64_decode(vs, strlen(vs), &kv.value, &kv.vlen) == 0);
        int out = -1;
        if (good) {
            if (!kv.value)
                kv.value = fuzz_cstr("", 0);
            kv.create_revision = jint(kj, "create_revision");
            kv.mod_revision = jint(kj, "mod_revision");
            kv.version = jint(kj, "version");
            out = rec_cb(r, kind == 0, &kv, kv.mod_revision ? kv.mod_revision : hrev) ? 1 : 0;
        }
        free(kv.key);
        free(kv.value);
        if (out)
            return out;
    }
    return 0;
}

/* What the watch of answer 0 must do: its events in *r, its code in *rc
 * (*ambiguous: the body ends inside an object that might have been cut
 * short, or broken near its end — SBX_E_STORAGE and SBX_E_SHARD_UNAVAILABLE
 * both do); *bad_obj and *bad_at: where the first malformed object starts and
 * where in it jansson stops (SIZE_MAX: none); *len the body's length. */
static void
ref_watch(int stop_after, struct rec *r, int *rc, bool *ambiguous, size_t *bad_obj,
          size_t *bad_at, size_t *len)
{
    sbx_buf_init(&r->b);
    r->count = 0;
    r->stop_after = stop_after;
    *ambiguous = false;
    *bad_obj = *bad_at = SIZE_MAX;
    *len = 0;
    *rc = SBX_E_SHARD_UNAVAILABLE;
    if (!S.n || !S.a[0].n || (S.a[0].p[0] & 1))
        return; /* no connection */
    sbx_buf body;
    sbx_buf_init(&body);
    for (size_t i = 1; i < S.a[0].n; i++)
        if (S.a[0].p[i] != SEP_CHUNK)
            sbx_buf_append(&body, &S.a[0].p[i], 1);
    *len = body.len;
    bool refused = ((S.a[0].p[0] >> 1) & 3) >= 2; /* 404 or 500: not a stream of events */
    if (refused)
        *rc = SBX_E_STORAGE;
    for (size_t off = 0; !refused;) {
        while (off < body.len && strchr(" \t\r\n", body.p[off]) && body.p[off])
            off++;
        if (off == body.len)
            break; /* the stream ended between objects */
        if (body.p[off] != '{') {
            *rc = SBX_E_STORAGE;
            *bad_obj = off;
            *bad_at = 0;
            break;
        }
        json_error_t je;
        json_t *j = __real_json_loadb(body.p + off, body.len - off, JSON_DISABLE_EOF_CHECK, &je);
        if (!j) {
            *rc = SBX_E_STORAGE;
            if (json_error_code(&je) == json_error_premature_end_of_input ||
                (size_t)je.position + 3 >= body.len - off) {
                *ambiguous = true;
            } else {
                *bad_obj = off;
                *bad_at = (size_t)je.position;
            }
            break;
        }
        int out = ref_object(j, r);
        json_decref(j);
        off += (size_t)je.position;
        if (out) {
            *rc = out > 0 ? 0 : SBX_E_STORAGE;
            break;
        }
    }
    sbx_buf_free(&body);
}

static void
flow_watch(sbx_etcd *e, int stop_after)
{
    struct rec a, b, c, want;
    int rwant;
    bool ambiguous;
    size_t bad_obj, bad_at, len;
    ref_watch(stop_after, &want, &rwant, &ambiguous, &bad_obj, &bad_at, &len);
    int ra = watch_as(e, 0, stop_after, &a);
    /* linear: each byte parsed at most 4 times (once whole, twice in trials
     * of an object not ended, once more when the stream ends inside one) */
    FUZZ_CHECK(fuzz_parsed <= 4 * len + 4, "%zu bytes parsed for a body of %zu", fuzz_parsed, len);
    int rb = watch_as(e, 1, stop_after, &b);
    FUZZ_CHECK(fuzz_parsed <= 4 * len + 4, "%zu bytes parsed for a body of %zu", fuzz_parsed, len);
    FUZZ_CHECK(ra == rb && a.b.len == b.b.len && (!a.b.len || !memcmp(a.b.p, b.b.p, a.b.len)),
               "chunks changed the watch: %d events (%d) vs %d in one piece (%d)", a.count, ra,
               b.count, rb);
    FUZZ_CHECK(b.b.len == want.b.len && (!want.b.len || !memcmp(b.b.p, want.b.p, want.b.len)),
               "the watch delivered %d event(s), the reference %d", b.count, want.count);
    if (ambiguous)
        FUZZ_CHECK(rb == SBX_E_STORAGE || rb == SBX_E_SHARD_UNAVAILABLE, "watch: %d", rb);
    else
        FUZZ_CHECK(rb == rwant, "watch: %d, want %d", rb, rwant);
    if (S.n && S.a[0].n <= (64u << 10)) {
        int rc = watch_as(e, 2, stop_after, &c);
        FUZZ_CHECK(rc == rb && c.b.len == b.b.len && (!c.b.len || !memcmp(c.b.p, b.b.p, c.b.len)),
                   "byte by byte changed the watch: %d events (%d) vs %d (%d)", c.count, rc,
                   b.count, rb);
        FUZZ_CHECK(fuzz_parsed <= 4 * len + 4, "%zu bytes parsed byte by byte for a body of %zu",
                   fuzz_parsed, len);
        /* Malformed: the watch stops reading within twice the distance from
         * the object's start to the point jansson fails at (trials as the
         * object doubles), instead of buffering the rest of the stream. */
        if (bad_obj != SIZE_MAX && rc == SBX_E_STORAGE)
            FUZZ_CHECK(S.accepted <= bad_obj + 2 * (bad_at + 4),
                       "%zu bytes read past an object malformed at %zu+%zu", S.accepted,
                       bad_obj, bad_at);
        sbx_buf_free(&c.b);
    }
    sbx_buf_free(&a.b);
    sbx_buf_free(&b.b);
    sbx_buf_free(&want.b);
}

/* ------------------------------------------------------------------------------ */
/* Flow 0: the view. */

#define CPREFIX "/sbx/t/c/"
#define MNAMES 16384

/* The model: what the last put or delete of each key says, read by the
 * rules of cview.h written again here: partition keys are exactly 4
 * digits below 4096, shard names 1-63 of [A-Za-z0-9._-] starting with a
 * letter or digit. */
struct mname {
    char name[64];
    char url[256], relay[256]; /* from its members/ value: whole, or "" (never cut) */
    bool live, draining;
    int parts; /* partitions whose key names it */
};

struct mstate {
    char owner[SBX_PARTITIONS][64]; /* the key's value if it is a shard name, else "" */
    bool has[SBX_PARTITIONS];       /* the key exists */
    int64_t epoch[SBX_PARTITIONS];
    struct mname m[MNAMES];
    int nm;
    bool lost;      /* more names than the model holds: nothing to check */
    int nlive, nref;
    bool saturated; /* more than SBX_CVIEW_MAX_MEMBERS names referenced (live or owning) at
                       some point: a partition's owner may have no slot */
    bool crowded;   /* more than SBX_CVIEW_MAX_MEMBERS live members at some point */
    int64_t rev;
};

static bool
mname_ok(const char *s, size_t n)
{
    if (n < 1 || n > 63 || !isalnum((unsigned char)s[0]))
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)s[i]) || strchr("._-", s[i])) || !s[i] || (s[i] & 0x80))
            return false;
    return true;
}

static int
mpart(const char *k)
{
    if (strlen(k) != 4 || !isdigit((unsigned char)k[0]) || !isdigit((unsigned char)k[1]) ||
        !isdigit((unsigned char)k[2]) || !isdigit((unsigned char)k[3]))
        return -1;
    int p = atoi(k);
    return p < SBX_PARTITIONS ? p : -1;
}

static int
mfind(struct mstate *s, const char *name, bool add)
{
    for (int i = 0; i < s->nm; i++)
        if (!strcmp(s->m[i].name, name))
            return i;
    if (!add)
        return -1;
    if (s->nm == MNAMES) {
        s->lost = true;
        return -1;
    }
    memset(&s->m[s->nm], 0, sizeof(s->m[0]));
    snprintf(s->m[s->nm].name, 64, "%s", name);
    return s->nm++;
}

/* Change name i's live flag and partition count by dlive, dparts. */
static void
mref(struct mstate *s, int i, int live, int dparts)
{
    struct mname *m = &s->m[i];
    bool was = m->live || m->parts;
    s->nlive -= m->live;
    if (live >= 0)
        m->live = live;
    m->parts += dparts;
    s->nlive += m->live;
    s->nref += (m->live || m->parts) - was;
    s->saturated |= s->nref > SBX_CVIEW_MAX_MEMBERS;
    s->crowded |= s->nlive > SBX_CVIEW_MAX_MEMBERS;
}

/* The address in a members/ value: the JSON object's "url" and "relay" if
 * the value has no NUL and they fit whole, else none. */
static void
maddr(struct mname *m, const struct sbx_etcd_kv *kv)
{
    json_error_t je;
    json_t *j = __real_json_loadb(kv->value, kv->vlen, 0, &je);
    const char *url = json_string_value(json_object_get(j, "url"));
    const char *relay = json_string_value(json_object_get(j, "relay"));
    bool fits = !memchr(kv->value, 0, kv->vlen) && url && strlen(url) < 256 &&
                (!relay || strlen(relay) < 256);
    snprintf(m->url, sizeof(m->url), "%s", fits ? url : "");
    snprintf(m->relay, sizeof(m->relay), "%s", fits && relay ? relay : "");
    json_decref(j);
}

static void
mapply(struct mstate *s, bool put, const struct sbx_etcd_kv *kv)
{
    if (strncmp(kv->key, CPREFIX, strlen(CPREFIX)))
        return;
    const char *k = kv->key + strlen(CPREFIX);
    int i, p;
    if (!strncmp(k, "members/", 8) && mname_ok(k + 8, strlen(k + 8))) {
        if ((i = mfind(s, k + 8, true)) >= 0) {
            mref(s, i, put, 0);
            if (put)
                maddr(&s->m[i], kv);
        }
    } else if (!strncmp(k, "drain/", 6) && mname_ok(k + 6, strlen(k + 6))) {
        if ((i = mfind(s, k + 6, true)) >= 0)
            s->m[i].draining = put;
    } else if (!strncmp(k, "parts/", 6) && (p = mpart(k + 6)) >= 0) {
        if (s->owner[p][0] && (i = mfind(s, s->owner[p], false)) >= 0)
            mref(s, i, -1, -1);
        s->has[p] = put;
        s->epoch[p] = put ? kv->mod_revision : 0;
        bool named = put && mname_ok(kv->value, kv->vlen);
        snprintf(s->owner[p], 64, "%s", named ? kv->value : "");
        if (named && (i = mfind(s, kv->value, true)) >= 0)
            mref(s, i, -1, +1);
    }
}

static int
model_cb(void *arg, bool put, const struct sbx_etcd_kv *kv, int64_t revision)
{
    struct mstate *s = arg;
    mapply(s, put, kv);
    if (revision > s->rev)
        s->rev = revision;
    return 0;
}

/* The model of a range's answer (the next one or two): false if the range
 * fails (resync fails the same way). */
static bool
mrange(sbx_etcd *e, struct mstate *s)
{
    struct sbx_etcd_kv *kvs;
    size_t n;
    int64_t rev = 0;
    char end[200];
    sbx_etcd_prefix_end(CPREFIX, end, sizeof(end));
    memset(s, 0, sizeof(*s));
    if (sbx_etcd_range(e, CPREFIX, end, &kvs, &n, &rev) != 0)
        return false;
    for (size_t i = 0; i < n; i++)
        mapply(s, true, &kvs[i]);
    s->rev = rev;
    sbx_etcd_kvs_free(kvs, n);
    return true;
}

static void
check_view(sbx_cview *v, struct mstate *s)
{
    if (s->lost)
        return;
    FUZZ_CHECK(v->nmembers >= 0 && v->nmembers <= SBX_CVIEW_MAX_MEMBERS, "%d members",
               v->nmembers);
    int refs[SBX_CVIEW_MAX_MEMBERS] = {0};
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        int o = v->parts[p].owner;
        FUZZ_CHECK(o >= -1 && o < v->nmembers, "partition %d: owner %d of %d members", p, o,
                   v->nmembers);
        if (o >= 0)
            refs[o]++;
    }
    for (int i = 0; i < v->nmembers; i++) {
        const struct sbx_cmember *m = &v->members[i];
        FUZZ_CHECK(memchr(m->name, 0, sizeof(m->name)) && memchr(m->url, 0, sizeof(m->url)) &&
                       memchr(m->relay, 0, sizeof(m->relay)),
                   "member %d unterminated", i);
        if (!m->name[0]) {
            FUZZ_CHECK(!m->live && !m->draining && !refs[i], "free slot %d in use", i);
            continue;
        }
        FUZZ_CHECK(mname_ok(m->name, strlen(m->name)), "slot %d holds '%s', not a shard name", i,
                   m->name);
        for (int k = 0; k < i; k++)
            FUZZ_CHECK(strcmp(v->members[k].name, m->name), "member '%s' twice", m->name);
        FUZZ_CHECK(m->gen != 0, "member '%s' without a gen", m->name);
        for (int k = 0; k < i; k++)
            FUZZ_CHECK(!v->members[k].name[0] || v->members[k].gen != m->gen, "gen %llu twice",
                       (unsigned long long)m->gen);
        int mi = mfind(s, m->name, false);
        FUZZ_CHECK(mi >= 0, "member '%s' out of the model", m->name);
        FUZZ_CHECK(m->live == s->m[mi].live && m->draining == s->m[mi].draining,
                   "member '%s' live %d draining %d, want %d %d", m->name, m->live, m->draining,
                   s->m[mi].live, s->m[mi].draining);
        if (m->live)
            FUZZ_CHECK(!strcmp(m->url, s->m[mi].url) && !strcmp(m->relay, s->m[mi].relay),
                       "member '%s' at '%s' '%s', want '%s' '%s'", m->name, m->url, m->relay,
                       s->m[mi].url, s->m[mi].relay);
        /* the table keeps only names a member key or a partition references */
        FUZZ_CHECK(m->live || refs[i] > 0,
                   "slot %d holds '%s', which no member key and no partition references", i,
                   m->name);
    }
    /* every live member has a slot, whatever stale or garbage names came and went */
    for (int i = 0; i < s->nm && !s->crowded; i++)
        if (s->m[i].live) {
            int k = 0;
            while (k < v->nmembers && strcmp(v->members[k].name, s->m[i].name))
                k++;
            FUZZ_CHECK(k < v->nmembers && v->members[k].live, "live member '%s' has no slot",
                       s->m[i].name);
        }
    for (int p = 0; p < SBX_PARTITIONS; p++) {
        int o = v->parts[p].owner;
        FUZZ_CHECK(v->parts[p].epoch == s->epoch[p], "partition %d: epoch %lld, want %lld", p,
                   (long long)v->parts[p].epoch, (long long)s->epoch[p]);
        if (!s->owner[p][0]) {
            FUZZ_CHECK(o == -1, "partition %d owned by '%s' (%s)", p, v->members[o].name,
                       s->has[p] ? "its value is not a shard name" : "its key went");
        } else if (o >= 0) {
            FUZZ_CHECK(!strcmp(v->members[o].name, s->owner[p]), "partition %d: '%s', want '%s'",
                       p, v->members[o].name, s->owner[p]);
        } else {
            /* No slot for the owner: only when more names than slots were referenced. */
            FUZZ_CHECK(s->saturated, "partition %d lost owner '%s' (%d names referenced)", p,
                       s->owner[p], s->nref);
        }
    }
    FUZZ_CHECK(v->rev == s->rev, "revision %lld, want %lld", (long long)v->rev,
               (long long)s->rev);
}

static void
flow_view(sbx_etcd *e)
{
    /* The model, from what the client decodes (its own properties are
     * checked in the other flows): the range, then the watch. */
    static struct mstate s;
    char end[200];
    sbx_etcd_prefix_end(CPREFIX, end, sizeof(end));
    S.next = 0;
    if (!mrange(e, &s))
        return; /* resync fails the same way: nothing to compare */
    size_t after_range = S.next;
    static atomic_bool stop;
    sbx_etcd_watch(e, CPREFIX, end, sbx_cview_rev_after(s.rev), model_cb, &s, &stop);
    size_t after_watch = S.next;

    /* The view, replaying the same answers. */
    static sbx_cview *v;
    if (!v) {
        v = sbx_xcalloc(1, sizeof(*v));
        pthread_mutex_init(&v->mu, NULL);
    }
    v->etcd = e;
    snprintf(v->prefix, sizeof(v->prefix), "/sbx/t/");
    snprintf(v->cprefix, sizeof(v->cprefix), CPREFIX);
    sbx_cview_reset(v);
    S.next = 0;
    e->cur = 0;
    FUZZ_CHECK(sbx_cview_resync(v) == 0 && v->synced, "resync failed where the range did not");
    FUZZ_CHECK(S.next == after_range, "resync took other answers");
    e->cur = 0;
    sbx_etcd_watch(e, v->cprefix, end, sbx_cview_rev_after(v->rev), sbx_cview_watch_cb, v,
                   &v->stop);
    FUZZ_CHECK(S.next == after_watch, "the view's watch took other answers");
    /* The model interned names in its own order, and keeps those the full
     * view could not: check by name. */
    check_view(v, &s);

    /* A re-sync from the answers left: the view becomes that range, and
     * every name it still references keeps its slot and gen (gateways keep
     * a socket per slot) unless more names than slots are referenced. */
    if (S.next >= S.n)
        return;
    char names[SBX_CVIEW_MAX_MEMBERS][64];
    uint64_t gens[SBX_CVIEW_MAX_MEMBERS];
    int before = v->nmembers;
    for (int i = 0; i < before; i++) {
        memcpy(names[i], v->members[i].name, 64);
        gens[i] = v->members[i].gen;
    }
    e->cur = 0;
    if (!mrange(e, &s))
        return;
    size_t after_second = S.next;
    S.next = after_watch;
    e->cur = 0;
    FUZZ_CHECK(sbx_cview_resync(v) == 0, "the second resync failed where the range did not");
    FUZZ_CHECK(S.next == after_second, "the second resync took other answers");
    check_view(v, &s);
    for (int i = 0; i < before && !s.saturated; i++)
        for (int k = 0; names[i][0] && k < v->nmembers; k++)
            if (!strcmp(v->members[k].name, names[i]))
                FUZZ_CHECK(k == i && v->members[k].gen == gens[i],
                           "a re-sync moved '%s' from slot %d (gen %llu) to %d (gen %llu)",
                           names[i], i, (unsigned long long)gens[i], k,
                           (unsigned long long)v->members[k].gen);
}

/* ------------------------------------------------------------------------------ */

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > (256u << 10))
        return 0;
    static sbx_etcd *e;
    if (!e && sbx_etcd_open(&e, "http://etcd-a:2379,http://etcd-b:2379/", 1000) != 0)
        abort();
    e->cur = 0;
    script(data + 2, size - 2);
    switch (data[0] % 3) {
    case 0: flow_view(e); break;
    case 1: flow_calls(e); break;
    default: flow_watch(e, data[1] % 8); break;
    }
    return 0;
}
