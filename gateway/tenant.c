/*
 * tenant.c — the tenant registry of a gateway: keys → principals, sandbox
 * namespaces, quotas, reply rewriting and the admin ops (gateway/tenant.h;
 * the model is docs/security.md §6).
 */
#include <errno.h>
#include <stdarg.h>
#include <nettle/sha2.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/id.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/ops.h"
#include "../runtime/util.h"
#include "keyfile.h"
#include "tenant_int.h"

/* ------------------------------------------------------------------------------ */
/* Hashes and names. */

void
tenant_sha256(const void *p, size_t n, uint8_t out[SHA256_DIGEST_SIZE])
{
    struct sha256_ctx c;
    sha256_init(&c);
    sha256_update(&c, n, p);
    sha256_digest(&c, SHA256_DIGEST_SIZE, out);
}

void
tenant_hex(const uint8_t *p, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[p[i] >> 4];
        out[2 * i + 1] = d[p[i] & 15];
    }
    out[2 * n] = '\0';
}

/* A tenant name: 1-16 of [a-z0-9], not "sbx". */
bool
tenant_name_ok(sbx_str s)
{
    if (s.n < 1 || s.n > SBX_TENANT_MAX || (s.n == 3 && !memcmp(s.p, "sbx", 3)))
        return false;
    for (size_t i = 0; i < s.n; i++)
        if (!((s.p[i] >= 'a' && s.p[i] <= 'z') || (s.p[i] >= '0' && s.p[i] <= '9')))
            return false;
    return true;
}

static bool
has_dashdash(const char *p, size_t n)
{
    for (size_t i = 0; i + 1 < n; i++)
        if (p[i] == '-' && p[i + 1] == '-')
            return true;
    return false;
}

int
sbx_tenants_map_id(const struct sbx_principal *p, sbx_str id, char out[64], char *why,
                   size_t whylen)
{
    if (p->scope == SBX_SCOPE_SYSTEM || !p->tenant[0]) {
        if (p->scope != SBX_SCOPE_SYSTEM && has_dashdash(id.p, id.n)) {
            snprintf(why, whylen,
                     "sandbox IDs holding '--' are reserved for tenants' namespaces; choose "
                     "another ID");
            return SBX_E_VALIDATION;
        }
        snprintf(out, 64, "%.*s", (int)SBX_MIN(id.n, 63), id.p);
        return 0;
    }
    size_t tl = strlen(p->tenant);
    if (tl + 2 + id.n > 63) {
        snprintf(why, whylen, "a sandbox ID of tenant %s is at most %zu characters", p->tenant,
                 61 - tl);
        return SBX_E_VALIDATION;
    }
    snprintf(out, 64, "%s--%.*s", p->tenant, (int)id.n, id.p);
    return 0;
}

bool
sbx_tenants_owns(const struct sbx_principal *p, sbx_str id)
{
    if (p->scope == SBX_SCOPE_SYSTEM)
        return true;
    if (!p->tenant[0])
        return !has_dashdash(id.p, id.n);
    size_t tl = strlen(p->tenant);
    return id.n > tl + 2 && !memcmp(id.p, p->tenant, tl) && id.p[tl] == '-' &&
           id.p[tl + 1] == '-';
}

/* ------------------------------------------------------------------------------ */
/* Calls to the gateway with the system token (refresh thread, admin ops). */


int
tenant_sys_open(sbx_tenants *t, struct sys_conn *c)
{
    int rv = nng_req0_open(&c->s);
    if (rv)
        return sbx_nng_code(rv);
    c->open = true;
    nng_socket_set_size(c->s, NNG_OPT_RECVMAXSZ, SBX_WIRE_MAX_FRAME);
    nng_socket_set_ms(c->s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    nng_socket_set_ms(c->s, NNG_OPT_RECVTIMEO, CALL_TIMEOUT_MS);
    nng_socket_set_ms(c->s, NNG_OPT_SENDTIMEO, CALL_TIMEOUT_MS);
    if ((rv = nng_dial(c->s, t->upstream, NULL, 0)) != 0)
        return sbx_nng_code(rv);
    return 0;
}

void
tenant_sys_close(struct sys_conn *c)
{
    if (c->open)
        nng_close(c->s);
    c->open = false;
}

/*
 * One call: op on sandbox (may be NULL) with args (map bytes, may be NULL).
 * 0 with *buf (the reply's bytes, caller frees) decoded in *m (caller frees
 * with sbx_wire_msg_free, before *buf) and its result in *res; or a negative
 * code (an error reply's code) with msg[] set.  for_key (may be NULL): the
 * admin it is made for (the envelope's "for": the audit log's key id).
 */
int
tenant_sys_call(sbx_tenants *t, struct sys_conn *c, const char *for_key, const char *op,
             const char *sandbox, const char *args, size_t alen, char **buf, sbx_msg *m,
             const msgpack_object **res, char *msg, size_t msglen)
{
    char rid[37];
    sbx_request_id(rid);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "v", SBX_WIRE_VERSION);
    sbx_enc_kstr(&e, "id", rid);
    sbx_enc_kstr(&e, "op", op);
    if (sandbox)
        sbx_enc_kstr(&e, "sandbox", sandbox);
    sbx_enc_kint(&e, "timeoutMs", CALL_TIMEOUT_MS - 500);
    sbx_enc_kstr(&e, "key", t->sys_key);
    if (for_key && *for_key)
        sbx_enc_kstr(&e, "for", for_key);
    if (args && alen) {
        sbx_enc_str(&e, "args");
        sbx_enc_raw(&e, args, alen);
    }
    sbx_enc_end(&e);
    _cleanup_free_ char *req = NULL;
    size_t len;
    if (sbx_enc_finish(&e, &req, &len) != 0)
        return SBX_E_INTERNAL;
    int rv = nng_send(c->s, req, len, 0);
    size_t rlen = 0;
    char *rbuf = NULL;
    if (rv == 0)
        rv = nng_recv(c->s, &rbuf, &rlen, NNG_FLAG_ALLOC);
    if (rv) {
        snprintf(msg, msglen, "the gateway did not answer: %s", nng_strerror(rv));
        return sbx_nng_code(rv);
    }
    *buf = sbx_xmalloc(rlen ? rlen : 1);
    memcpy(*buf, rbuf, rlen);
    nng_free(rbuf, rlen);
    if (sbx_wire_decode(m, *buf, rlen, &sbx_wire_limits_reply) != 0) {
        free(*buf);
        *buf = NULL;
        snprintf(msg, msglen, "the gateway's reply is not msgpack");
        return SBX_E_INTERNAL;
    }
    bool ok = false;
    sbx_wire_get_bool(m->root, "ok", &ok);
    if (ok && sbx_wire_get_map(m->root, "result", res) == 0)
        return 0;
    const msgpack_object *eo;
    sbx_str code = {"INTERNAL_ERROR", 14}, text = {"", 0};
    if (sbx_wire_get_map(m->root, "error", &eo) == 0) {
        sbx_wire_get_str(eo, "code", &code);
        sbx_wire_get_str(eo, "message", &text);
    }
    snprintf(msg, msglen, "%.*s", (int)text.n, text.p);
    int rc = sbx_err_from_name(code.p, code.n);
    sbx_wire_msg_free(m);
    free(*buf);
    *buf = NULL;
    return rc ? rc : SBX_E_INTERNAL;
}

/* ------------------------------------------------------------------------------ */
/* Snapshots. */

static int
cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

void
tenant_free_ids(char **ids, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(ids[i]);
    free(ids);
}

/* Parse "sbx--t-<name>-<max>-<rate>" into x; false if it is no tenant record. */
bool
tenant_parse_record(const char *id, struct tten *x)
{
    if (strncmp(id, SYS_PREFIX "t-", 7))
        return false;
    char name[SBX_TENANT_MAX + 2];
    long long max, rate;
    int used = 0;
    if (sscanf(id + 7, "%17[a-z0-9]-%lld-%lld%n", name, &max, &rate, &used) != 3 ||
        id[7 + used] != '\0' || !tenant_name_ok((sbx_str){name, strlen(name)}))
        return false;
    memset(x, 0, sizeof(*x));
    snprintf(x->name, sizeof(x->name), "%s", name);
    x->max_sandboxes = max;
    x->rate = rate > 0 ? rate : 1;
    return true;
}

bool
tenant_parse_res(const char *id, char name[SBX_TENANT_MAX + 1], struct tten *x)
{
    if (strncmp(id, SYS_PREFIX "r-", 7))
        return false;
    char nm[SBX_TENANT_MAX + 2];
    long long mem, cpu, disk, streams;
    int used = 0;
    if (sscanf(id + 7, "%17[a-z0-9]-%lld-%lld-%lld-%lld%n", nm, &mem, &cpu, &disk, &streams,
               &used) != 5 ||
        id[7 + used] != '\0' || !tenant_name_ok((sbx_str){nm, strlen(nm)}) || mem < 0 ||
        cpu < 0 || disk < 0 || streams < 0 || mem > (1LL << 40) || disk > (1LL << 40))
        return false;
    snprintf(name, SBX_TENANT_MAX + 1, "%s", nm);
    x->max = (struct tres){mem << 20, cpu, disk << 20};
    x->max_streams = streams;
    return true;
}

/* A limit as the resource quotas count it: 0 (unlimited) counts as more than any. */
static int64_t
res_count(int64_t v)
{
    return v > 0 ? v : RES_UNLIMITED;
}

static void
res_add(struct tres *to, const struct tres *r)
{
    to->memory = SBX_MIN(to->memory + r->memory, RES_UNLIMITED);
    to->cpu = SBX_MIN(to->cpu + r->cpu, RES_UNLIMITED);
    to->disk = SBX_MIN(to->disk + r->disk, RES_UNLIMITED);
}

static void
free_sbs(struct tsb *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(v[i].id);
    free(v);
}

/* Parse "sbx--k<32 hex>-<tenant>-<a|t>" into k. */
bool
tenant_parse_key(const char *id, struct tkey *k)
{
    if (strncmp(id, SYS_PREFIX "k", 6) || strlen(id) < 6 + KEYID_HEX + 4)
        return false;
    const char *p = id + 6;
    for (int i = 0; i < KEYID_HEX; i++)
        if (!((p[i] >= '0' && p[i] <= '9') || (p[i] >= 'a' && p[i] <= 'f')))
            return false;
    if (p[KEYID_HEX] != '-')
        return false;
    const char *tn = p + KEYID_HEX + 1, *dash = strrchr(tn, '-');
    if (!dash || dash[1] == '\0' || dash[2] != '\0' || (dash[1] != 'a' && dash[1] != 't') ||
        !tenant_name_ok((sbx_str){tn, (size_t)(dash - tn)}))
        return false;
    memcpy(k->id, p, KEYID_HEX);
    k->id[KEYID_HEX] = '\0';
    snprintf(k->tenant, sizeof(k->tenant), "%.*s", (int)(dash - tn), tn);
    k->scope = dash[1] == 'a' ? SBX_SCOPE_ADMIN : SBX_SCOPE_TENANT;
    return true;
}

/* Take a snapshot: one `list`, then swap it in.  0 or a negative code. */
int
tenant_refresh(sbx_tenants *t, struct sys_conn *c)
{
    pthread_mutex_lock(&t->refresh_mu);
    char *buf = NULL, msg[256];
    sbx_msg m;
    const msgpack_object *res, *arr;
    int64_t started = sbx_mono_ms(); /* creations admitted since may be missing from it */
    static const char ids_only[] = "\x81\xa7idsOnly\xc3"; /* {idsOnly: true}: keys only */
    int rc =
        tenant_sys_call(t, c, NULL, "list", NULL, ids_only, sizeof(ids_only) - 1, &buf, &m, &res,
                        msg, sizeof(msg));
    if (rc) {
        pthread_mutex_unlock(&t->refresh_mu);
        sbx_log_debug("tenants: cannot list the registry: %s", msg);
        return rc;
    }
    struct tsb *ids = NULL;
    size_t nids = 0;
    struct tres defs = {0, 0, 0};
    struct tkey *keys = NULL;
    size_t nkeys = 0;
    struct tten *tens = NULL;
    size_t ntens = 0;
    const msgpack_object *dm;
    if (sbx_wire_get_map(res, "defaults", &dm) == 0) {
        sbx_wire_get_i64(dm, "memory", &defs.memory);
        sbx_wire_get_i64(dm, "cpu", &defs.cpu);
        sbx_wire_get_i64(dm, "disk", &defs.disk);
    }
    if (sbx_wire_get_array(res, "sandboxes", &arr) == 0) {
        ids = sbx_xcalloc(arr->via.array.size + 1, sizeof(*ids));
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            const msgpack_object *it = &arr->via.array.ptr[i];
            sbx_str s;
            if (it->type != MSGPACK_OBJECT_MAP || sbx_wire_get_str(it, "id", &s) || !s.n)
                continue;
            char *id = sbx_str_dup(s);
            struct tten x;
            struct tkey k;
            if (tenant_parse_record(id, &x)) {
                tens = sbx_xrealloc(tens, (ntens + 1) * sizeof(*tens));
                tens[ntens++] = x;
            } else if (tenant_parse_key(id, &k)) {
                keys = sbx_xrealloc(keys, (nkeys + 1) * sizeof(*keys));
                keys[nkeys++] = k;
            }
            struct tres r = {0, 0, 0}; /* unknown (a shard before resource quotas): unlimited */
            sbx_wire_get_i64(it, "memory", &r.memory);
            sbx_wire_get_i64(it, "cpu", &r.cpu);
            sbx_wire_get_i64(it, "disk", &r.disk);
            ids[nids++] = (struct tsb){id, {res_count(r.memory), res_count(r.cpu),
                                            res_count(r.disk)}};
        }
    }
    sbx_wire_msg_free(&m);
    free(buf);
    qsort(ids, nids, sizeof(*ids), cmp_str);
    /* Each tenant's resource quotas (its "sbx--r-" record); its sandboxes
     * counted with their limits; keep each bucket's state. */
    for (size_t i = 0; i < nids; i++) {
        char rname[SBX_TENANT_MAX + 1];
        struct tten q;
        if (!tenant_parse_res(ids[i].id, rname, &q))
            continue;
        for (size_t j = 0; j < ntens; j++)
            if (!strcmp(tens[j].name, rname)) {
                tens[j].max = q.max;
                tens[j].max_streams = q.max_streams;
            }
    }
    for (size_t i = 0; i < nids; i++) {
        const char *dd = strstr(ids[i].id, "--");
        if (!dd || !strncmp(ids[i].id, SYS_PREFIX, 5))
            continue;
        for (size_t j = 0; j < ntens; j++)
            if (strlen(tens[j].name) == (size_t)(dd - ids[i].id) &&
                !memcmp(tens[j].name, ids[i].id, (size_t)(dd - ids[i].id))) {
                tens[j].sandboxes++;
                res_add(&tens[j].used, &ids[i].res);
            }
    }
    pthread_mutex_lock(&t->mu);
    for (size_t j = 0; j < ntens; j++) {
        tens[j].tokens = 2.0 * (double)tens[j].rate;
        tens[j].bucket_ms = sbx_mono_ms();
        for (size_t o = 0; o < t->ntens; o++)
            if (!strcmp(t->tens[o].name, tens[j].name)) {
                tens[j].tokens = SBX_MIN(t->tens[o].tokens, 2.0 * (double)tens[j].rate);
                tens[j].bucket_ms = t->tens[o].bucket_ms;
            }
    }
    free_sbs(t->ids, t->nids);
    free(t->keys);
    free(t->tens);
    t->ids = ids;
    t->nids = nids;
    t->defaults = defs;
    t->keys = keys;
    t->nkeys = nkeys;
    t->tens = tens;
    t->ntens = ntens;
    /* Keep the creations the list does not hold yet, and count them: those
     * admitted after it started, and those admitted before whose record the
     * shard had not written when the list asked it (a creation is admitted
     * here before the shard creates it: with only "after it started" kept,
     * one admitted just before a refresh counted nowhere, and a tenant at
     * maxSandboxes 2 got a third — test_tenants, revocation_and_quotas).
     * Those go RECENT_GRACE_MS (a refresh and a half) after their
     * admission: a creation that failed or was destroyed since counts that
     * long (a refusal errs that way). */
    size_t kept = 0;
    int64_t now = sbx_mono_ms();
    for (size_t i = 0; i < t->nrecent; i++) {
        const char *key = t->recent[i].id;
        if (bsearch(&key, ids, nids, sizeof(*ids), cmp_str) ||
            (t->recent[i].at < started && now - t->recent[i].at > RECENT_GRACE_MS))
            continue;
        struct tten *x = tenant_find(t, t->recent[i].tenant);
        if (x) {
            x->sandboxes++;
            res_add(&x->used, &t->recent[i].res);
        }
        t->recent[kept++] = t->recent[i];
    }
    t->nrecent = kept;
    t->loaded = true;
    pthread_mutex_unlock(&t->mu);
    pthread_mutex_unlock(&t->refresh_mu);
    return 0;
}

static void *
refresh_main(void *arg)
{
    sbx_tenants *t = arg;
    struct sys_conn c = {0};
    if (tenant_sys_open(t, &c) != 0)
        sbx_log_warn("tenants: cannot dial the gateway at %s", t->upstream);
    pthread_mutex_lock(&t->mu);
    while (!t->stopping) {
        pthread_mutex_unlock(&t->mu);
        if (c.open)
            tenant_refresh(t, &c);
        pthread_mutex_lock(&t->mu);
        if (t->stopping)
            break;
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        int64_t ns = ts.tv_nsec + (int64_t)REFRESH_MS * 1000000;
        ts.tv_sec += ns / 1000000000;
        ts.tv_nsec = ns % 1000000000;
        pthread_cond_timedwait(&t->cv, &t->mu, &ts);
    }
    pthread_mutex_unlock(&t->mu);
    tenant_sys_close(&c);
    return NULL;
}

/* ------------------------------------------------------------------------------ */
/* Lifecycle. */

int
sbx_tenants_start(sbx_tenants **out, const char *key_file, const char *upstream,
                  sbx_err_t *err)
{
    char **keys = NULL;
    int rc = sbx_keyfile_load(key_file, &keys, err);
    if (rc)
        return rc;
    sbx_tenants *t = sbx_xcalloc(1, sizeof(*t));
    pthread_mutex_init(&t->mu, NULL);
    pthread_mutex_init(&t->refresh_mu, NULL);
    pthread_cond_init(&t->cv, NULL);
    t->upstream = upstream;
    t->recent = sbx_xcalloc(RECENT_MAX, sizeof(*t->recent));
    t->streams = sbx_xcalloc(STREAMS_MAX, sizeof(*t->streams));
    for (char **k = keys; *k; k++) {
        t->admin = sbx_xrealloc(t->admin, (t->nadmin + 1) * sizeof(*t->admin));
        tenant_sha256(*k, strlen(*k), t->admin[t->nadmin++]);
    }
    sbx_keyfile_free(keys);
    uint8_t r[32];
    if ((rc = sbx_random(r, sizeof(r))) != 0) {
        sbx_tenants_stop(t);
        return sbx_err_make(err, rc, "cannot draw the gateway's system token");
    }
    memcpy(t->sys_key, "sbx_", 4);
    tenant_hex(r, sizeof(r), t->sys_key + 4);
    tenant_sha256(t->sys_key, strlen(t->sys_key), t->sys_hash);
    if (pthread_create(&t->thread, NULL, refresh_main, t) != 0) {
        sbx_tenants_stop(t);
        return sbx_err_make(err, -ENOMEM, "cannot start the tenant registry's thread");
    }
    t->thread_started = true;
    *out = t;
    return 0;
}

void
sbx_tenants_stop(sbx_tenants *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->mu);
    t->stopping = true;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    if (t->thread_started)
        pthread_join(t->thread, NULL);
    pthread_mutex_lock(&t->mu);
    while (t->jobs > 0)
        pthread_cond_wait(&t->cv, &t->mu);
    pthread_mutex_unlock(&t->mu);
    free_sbs(t->ids, t->nids);
    free(t->keys);
    free(t->tens);
    free(t->admin);
    free(t->recent);
    free(t->streams);
    pthread_cond_destroy(&t->cv);
    pthread_mutex_destroy(&t->refresh_mu);
    pthread_mutex_destroy(&t->mu);
    free(t);
}

const char *
sbx_tenants_system_key(const sbx_tenants *t)
{
    return t->sys_key;
}

/* ------------------------------------------------------------------------------ */
/* Requests. */

struct tten *
tenant_find(sbx_tenants *t, const char *name)
{
    for (size_t i = 0; i < t->ntens; i++)
        if (!strcmp(t->tens[i].name, name))
            return &t->tens[i];
    return NULL;
}

int
sbx_tenants_resolve(sbx_tenants *t, sbx_str key, struct sbx_principal *p)
{
    memset(p, 0, sizeof(*p));
    if (key.n == 0 || key.n > 256)
        return SBX_E_UNAUTHORIZED;
    uint8_t h[SHA256_DIGEST_SIZE];
    tenant_sha256(key.p, key.n, h);
    if (!memcmp(h, t->sys_hash, sizeof(h))) {
        p->scope = SBX_SCOPE_SYSTEM;
        snprintf(p->key_id, sizeof(p->key_id), "system");
        return 0;
    }
    char id[KEYID_HEX + 1];
    tenant_hex(h, KEYID_HEX / 2, id);
    snprintf(p->key_id, sizeof(p->key_id), "%s", id);
    for (size_t i = 0; i < t->nadmin; i++)
        if (!memcmp(h, t->admin[i], sizeof(h))) {
            p->scope = SBX_SCOPE_ADMIN;
            return 0;
        }
    int rc = SBX_E_UNAUTHORIZED;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nkeys; i++)
        if (!strcmp(t->keys[i].id, id) && tenant_find(t, t->keys[i].tenant)) {
            p->scope = t->keys[i].scope;
            snprintf(p->tenant, sizeof(p->tenant), "%s", t->keys[i].tenant);
            rc = 0;
            break;
        }
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void
sbx_tenants_metrics(sbx_tenants *t, sbx_prom *p)
{
    sbx_prom_family(p, "sbx_tenant_sandboxes", "gauge",
                    "sandboxes of a tenant (the registry's snapshot plus this gateway's "
                    "creations since)");
    sbx_prom_family(p, "sbx_tenant_max_sandboxes", "gauge", "a tenant's maxSandboxes quota");
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->ntens; i++) {
        char l[160];
        sbx_prom_labels(l, sizeof(l), "tenant", t->tens[i].name, NULL);
        sbx_prom_add(p, "sbx_tenant_sandboxes", "", l, (double)t->tens[i].sandboxes);
        sbx_prom_add(p, "sbx_tenant_max_sandboxes", "", l, (double)t->tens[i].max_sandboxes);
    }
    pthread_mutex_unlock(&t->mu);
}

/* The limits a creation of x's tenant would count, under t->mu. */
static struct tres
ask_res(sbx_tenants *t, const struct sbx_tenant_ask *ask)
{
    if (ask && ask->like) {
        const char *key = ask->like;
        const struct tsb *sb = bsearch(&key, t->ids, t->nids, sizeof(*t->ids), cmp_str);
        if (sb)
            return sb->res;
        for (size_t i = 0; i < t->nrecent; i++)
            if (!strcmp(t->recent[i].id, ask->like))
                return t->recent[i].res;
    }
    struct tres r = {ask && ask->memory > 0 ? ask->memory : t->defaults.memory,
                     ask && ask->cpu > 0 ? ask->cpu : t->defaults.cpu,
                     ask && ask->disk > 0 ? ask->disk : t->defaults.disk};
    return (struct tres){res_count(r.memory), res_count(r.cpu), res_count(r.disk)};
}

/* Whether x's quota `limit` (0: none) of a resource refuses `used` + `ask`;
 * then *miss and why[] are set. */
static bool
res_refused(const struct tten *x, const char *quota, const char *what, int64_t used,
            int64_t ask, int64_t limit, struct sbx_quota_miss *miss, char *why, size_t whylen)
{
    if (limit <= 0 || (ask < RES_UNLIMITED && used <= limit - ask))
        return false;
    int64_t shown = used >= RES_UNLIMITED ? -1 : used; /* -1: one of them is unlimited */
    *miss = (struct sbx_quota_miss){quota, shown, limit, 0};
    if (ask >= RES_UNLIMITED)
        snprintf(why, whylen,
                 "tenant %s has a quota of %s (%s %lld) and the new sandbox's %s is unlimited: "
                 "give it a limit",
                 x->name, what, quota, (long long)limit, what);
    else
        snprintf(why, whylen,
                 "tenant %s's sandboxes have %lld of %s (their limits), the new one asks %lld: "
                 "over its quota %s %lld; destroy one or ask less",
                 x->name, (long long)shown, what, (long long)ask, quota, (long long)limit);
    return true;
}

int
sbx_tenants_admit(sbx_tenants *t, const struct sbx_principal *p, const char *id, bool creates,
                  const struct sbx_tenant_ask *ask, struct sbx_quota_miss *miss, char *why,
                  size_t whylen)
{
    if (!creates || p->scope == SBX_SCOPE_SYSTEM || !p->tenant[0])
        return 0;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    const char *key = id;
    bool known = bsearch(&key, t->ids, t->nids, sizeof(*t->ids), cmp_str) != NULL;
    for (size_t i = 0; !known && i < t->nrecent; i++)
        known = !strcmp(t->recent[i].id, id);
    struct tten *x = tenant_find(t, p->tenant);
    if (known || !x)
        goto out;
    int64_t now = sbx_mono_ms();
    x->tokens = SBX_MIN(2.0 * (double)x->rate,
                        x->tokens + (double)(now - x->bucket_ms) * (double)x->rate / 1000.0);
    x->bucket_ms = now;
    if (x->sandboxes >= x->max_sandboxes) {
        *miss = (struct sbx_quota_miss){"maxSandboxes", x->sandboxes, x->max_sandboxes, 1000};
        snprintf(why, whylen,
                 "tenant %s has %lld sandboxes, its quota (maxSandboxes); destroy one first",
                 x->name, (long long)x->max_sandboxes);
        rc = SBX_E_QUOTA_EXCEEDED;
        goto out;
    }
    struct tres r = ask_res(t, ask);
    if (res_refused(x, "maxMemoryBytes", "memory", x->used.memory, r.memory, x->max.memory, miss,
                    why, whylen) ||
        res_refused(x, "maxCpus", "millicpus", x->used.cpu, r.cpu, x->max.cpu, miss, why,
                    whylen) ||
        res_refused(x, "maxDiskBytes", "disk bytes", x->used.disk, r.disk, x->max.disk, miss,
                    why, whylen)) {
        rc = SBX_E_QUOTA_EXCEEDED;
        goto out;
    }
    if (x->tokens < 1.0) {
        *miss = (struct sbx_quota_miss){"createsPerSecond", 0, x->rate,
                                        (int64_t)((1.0 - x->tokens) * 1000.0 / (double)x->rate) +
                                            1};
        snprintf(why, whylen,
                 "tenant %s creates sandboxes faster than its quota of %lld per second",
                 x->name, (long long)x->rate);
        rc = SBX_E_QUOTA_EXCEEDED;
        goto out;
    }
    x->tokens -= 1.0;
    x->sandboxes++;
    res_add(&x->used, &r);
    if (t->nrecent < RECENT_MAX) {
        struct trecent *rr = &t->recent[t->nrecent++];
        snprintf(rr->id, sizeof(rr->id), "%s", id);
        snprintf(rr->tenant, sizeof(rr->tenant), "%s", x->name);
        rr->at = now;
        rr->res = r;
    }
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* Streams (maxStreams). */

int
sbx_tenants_stream_enter(sbx_tenants *t, const struct sbx_principal *p, const char *key,
                         bool *counted, struct sbx_quota_miss *miss, char *why, size_t whylen)
{
    *counted = false;
    if (p->scope == SBX_SCOPE_SYSTEM || !p->tenant[0])
        return 0;
    int rc = 0;
    pthread_mutex_lock(&t->mu);
    struct tten *x = tenant_find(t, p->tenant);
    if (!x || x->max_streams <= 0)
        goto out;
    /* Forget the streams read last more than STREAM_LINGER_MS ago; count
     * the tenant's; find this one. */
    int64_t now = sbx_mono_ms(), mine = 0;
    struct tstream *hit = NULL;
    size_t kept = 0;
    for (size_t i = 0; i < t->nstreams; i++) {
        struct tstream *s = &t->streams[i];
        if (s->inflight == 0 && now - s->last_ms > STREAM_LINGER_MS)
            continue;
        t->streams[kept] = *s;
        s = &t->streams[kept++];
        if (!strcmp(s->tenant, x->name)) {
            mine++;
            if (key && !strcmp(s->key, key))
                hit = s;
        }
    }
    t->nstreams = kept;
    if (!hit && mine >= x->max_streams) {
        *miss = (struct sbx_quota_miss){"maxStreams", mine, x->max_streams, STREAM_LINGER_MS};
        snprintf(why, whylen,
                 "tenant %s reads %lld streams through this gateway, its quota (maxStreams); "
                 "close one first",
                 x->name, (long long)mine);
        rc = SBX_E_QUOTA_EXCEEDED;
        goto out;
    }
    if (!key)
        goto out;
    if (!hit) {
        if (t->nstreams >= STREAMS_MAX)
            goto out; /* the table is full: not counted (it bounds the memory) */
        hit = &t->streams[t->nstreams++];
        memset(hit, 0, sizeof(*hit));
        snprintf(hit->key, sizeof(hit->key), "%s", key);
        snprintf(hit->tenant, sizeof(hit->tenant), "%s", x->name);
    }
    hit->inflight++;
    hit->last_ms = now;
    *counted = true;
out:
    pthread_mutex_unlock(&t->mu);
    return rc;
}

void
sbx_tenants_stream_leave(sbx_tenants *t, const char *key)
{
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nstreams; i++)
        if (!strcmp(t->streams[i].key, key)) {
            if (t->streams[i].inflight > 0)
                t->streams[i].inflight--;
            t->streams[i].last_ms = sbx_mono_ms();
            break;
        }
    pthread_mutex_unlock(&t->mu);
}

/* ------------------------------------------------------------------------------ */
/* Reply rewriting. */

struct rw {
    const struct sbx_principal *p;
    const char *internal, *external;
    size_t tl; /* strlen(p->tenant) */
};

static bool
key_is(const msgpack_object *k, const char *s)
{
    sbx_str ks;
    return k && sbx_wire_obj_str(k, &ks) == 0 && sbx_str_eq(ks, s);
}

/* A message with every occurrence of r->internal replaced. */
static void
enc_message(sbx_enc *e, sbx_str v, const struct rw *r)
{
    size_t il = r->internal ? strlen(r->internal) : 0;
    if (!il) {
        sbx_enc_strn(e, v.p, v.n);
        return;
    }
    sbx_buf b;
    sbx_buf_init(&b);
    for (size_t i = 0; i < v.n;) {
        if (i + il <= v.n && !memcmp(v.p + i, r->internal, il)) {
            sbx_buf_append(&b, r->external, strlen(r->external));
            i += il;
        } else {
            sbx_buf_append(&b, v.p + i, 1);
            i++;
        }
    }
    sbx_enc_strn(e, b.p ? b.p : "", b.len);
    sbx_buf_free(&b);
}

static void
enc_rw(sbx_enc *e, const msgpack_object *o, const msgpack_object *key, const struct rw *r)
{
    sbx_str v;
    if (o->type == MSGPACK_OBJECT_STR && sbx_wire_obj_str(o, &v) == 0) {
        if ((key_is(key, "sandboxId") || key_is(key, "sandbox") || key_is(key, "id") ||
             key_is(key, "from") || key_is(key, "ids")) &&
            r->tl && v.n > r->tl + 2 && sbx_tenants_owns(r->p, v)) {
            sbx_enc_strn(e, v.p + r->tl + 2, v.n - r->tl - 2);
            return;
        }
        if (key_is(key, "message")) {
            enc_message(e, v, r);
            return;
        }
        sbx_enc_obj(e, o);
        return;
    }
    if (o->type == MSGPACK_OBJECT_MAP) {
        sbx_enc_map(e);
        for (uint32_t i = 0; i < o->via.map.size; i++) {
            sbx_enc_obj(e, &o->via.map.ptr[i].key);
            enc_rw(e, &o->via.map.ptr[i].val, &o->via.map.ptr[i].key, r);
        }
        sbx_enc_end(e);
        return;
    }
    if (o->type == MSGPACK_OBJECT_ARRAY) {
        /* The items of `ids` (sandbox.fork's reply) are sandbox IDs too. */
        const msgpack_object *ik = key_is(key, "ids") ? key : NULL;
        sbx_enc_array(e);
        for (uint32_t i = 0; i < o->via.array.size; i++)
            enc_rw(e, &o->via.array.ptr[i], ik, r);
        sbx_enc_end(e);
        return;
    }
    sbx_enc_obj(e, o);
}

void
sbx_tenants_enc_obj(sbx_enc *e, const struct sbx_principal *p, const msgpack_object *o)
{
    struct rw r = {p, NULL, NULL, p->scope == SBX_SCOPE_SYSTEM ? 0 : strlen(p->tenant)};
    enc_rw(e, o, NULL, &r);
}

int
sbx_tenants_rewrite(const struct sbx_principal *p, const void *reply, size_t len,
                    const char *internal, const char *external, char **out, size_t *outlen)
{
    sbx_msg m;
    if (sbx_wire_decode(&m, reply, len, &sbx_wire_limits_reply) != 0)
        return SBX_E_MALFORMED;
    struct rw r = {p, internal, external, p->scope == SBX_SCOPE_SYSTEM ? 0 : strlen(p->tenant)};
    sbx_enc e;
    sbx_enc_init(&e);
    enc_rw(&e, m.root, NULL, &r);
    sbx_wire_msg_free(&m);
    return sbx_enc_finish(&e, out, outlen) ? -ENOMEM : 0;
}

/* args with each string of its `ids` array mapped into p's namespace (the
 * new sandboxes of sandbox.fork); 0 or SBX_E_VALIDATION (why[]). */
static int
enc_args_ids(sbx_enc *e, const msgpack_object *args, const struct sbx_principal *p, char *why,
             size_t whylen)
{
    sbx_enc_map(e);
    for (uint32_t i = 0; i < args->via.map.size; i++) {
        const msgpack_object_kv *kv = &args->via.map.ptr[i];
        sbx_enc_obj(e, &kv->key);
        if (!key_is(&kv->key, "ids") || kv->val.type != MSGPACK_OBJECT_ARRAY) {
            sbx_enc_obj(e, &kv->val);
            continue;
        }
        sbx_enc_array(e);
        for (uint32_t j = 0; j < kv->val.via.array.size; j++) {
            const msgpack_object *it = &kv->val.via.array.ptr[j];
            sbx_str id;
            char mapped[64];
            if (sbx_wire_obj_str(it, &id) != 0) {
                sbx_enc_obj(e, it); /* the shard's schema check answers it */
                continue;
            }
            if (sbx_id_check(id.p, id.n, why, whylen) != 0 ||
                sbx_tenants_map_id(p, id, mapped, why, whylen) != 0)
                return SBX_E_VALIDATION;
            sbx_enc_str(e, mapped);
        }
        sbx_enc_end(e);
    }
    sbx_enc_end(e);
    return 0;
}

int
sbx_tenants_reencode_ids(const msgpack_object *root, const struct sbx_principal *p,
                         const char *sandbox, char **out, size_t *outlen, char *why, size_t whylen)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object_kv *kv = &root->via.map.ptr[i];
        if (key_is(&kv->key, "key") || (sandbox && key_is(&kv->key, "sandbox")))
            continue;
        sbx_enc_obj(&e, &kv->key);
        if (key_is(&kv->key, "args") && kv->val.type == MSGPACK_OBJECT_MAP) {
            int rc = enc_args_ids(&e, &kv->val, p, why, whylen);
            if (rc) {
                char *junk;
                size_t jl;
                if (sbx_enc_finish(&e, &junk, &jl) == 0)
                    free(junk);
                return rc;
            }
            continue;
        }
        sbx_enc_obj(&e, &kv->val);
    }
    if (sandbox)
        sbx_enc_kstr(&e, "sandbox", sandbox);
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, out, outlen) ? -ENOMEM : 0;
}

int
sbx_tenants_reencode(const msgpack_object *root, const char *sandbox, char **out,
                     size_t *outlen)
{
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    for (uint32_t i = 0; i < root->via.map.size; i++) {
        const msgpack_object_kv *kv = &root->via.map.ptr[i];
        if (key_is(&kv->key, "key") || (sandbox && key_is(&kv->key, "sandbox")))
            continue;
        sbx_enc_obj(&e, &kv->key);
        sbx_enc_obj(&e, &kv->val);
    }
    if (sandbox)
        sbx_enc_kstr(&e, "sandbox", sandbox);
    sbx_enc_end(&e);
    return sbx_enc_finish(&e, out, outlen) ? -ENOMEM : 0;
}
