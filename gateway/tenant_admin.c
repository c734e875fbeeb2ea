/*
 * tenant_admin.c — the admin ops of the tenant registry: tenant.create|list|
 * delete, key.create|list|revoke (gateway/tenant.h sbx_tenants_admin).  Each
 * runs on a thread of its own and changes the registry's system records with
 * the system token, on behalf of the calling admin (the audit log's key id).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/ops.h"
#include "../runtime/util.h"
#include "tenant_int.h"

/* ------------------------------------------------------------------------------ */
/* Admin ops (on a thread of their own: they call the gateway synchronously). */

struct admin_job {
    sbx_tenants *t;
    int op_id;
    char caller[40]; /* the admin's key id (audit) */
    char rid[SBX_WIRE_MAX_ID + 1];
    char *args;
    size_t alen;
    void (*done)(void *arg, const char *reply, size_t len);
    void *arg;
};

/* Create (labels {}) or destroy the system record `id`, for admin `caller`. */
static int
sys_record(sbx_tenants *t, struct sys_conn *c, const char *caller, const char *id, bool create,
           char *msg, size_t msglen)
{
    static const char empty_labels[] = "\x81\xa6labels\x80"; /* {labels: {}} */
    char *buf = NULL;
    sbx_msg m;
    const msgpack_object *res;
    int rc = create ? tenant_sys_call(t, c, caller, "sandbox.labels", id, empty_labels,
                                   sizeof(empty_labels) - 1, &buf, &m, &res, msg, msglen)
                    : tenant_sys_call(t, c, caller, "destroy", id, NULL, 0, &buf, &m, &res, msg,
                                   msglen);
    if (rc == 0) {
        sbx_wire_msg_free(&m);
        free(buf);
    }
    return rc;
}

static void
job_reply_err(struct admin_job *j, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
job_reply_err(struct admin_job *j, int code, const char *fmt, ...)
{
    char msg[512], *buf;
    size_t len;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    sbx_str id = {j->rid, strlen(j->rid)};
    if (sbx_wire_reply_errf(id, code, &buf, &len, "%s", msg) == 0) {
        j->done(j->arg, buf, len);
        free(buf);
    }
}

static void
job_reply(struct admin_job *j, sbx_enc *e)
{
    char *buf;
    size_t len;
    sbx_enc_end(e);
    sbx_enc_end(e);
    if (sbx_enc_finish(e, &buf, &len) == 0) {
        j->done(j->arg, buf, len);
        free(buf);
    } else {
        job_reply_err(j, SBX_E_INTERNAL, "could not encode the reply");
    }
}

/* The tenant argument, checked; false after answering the error. */
static bool
arg_tenant(struct admin_job *j, const msgpack_object *args, char out[SBX_TENANT_MAX + 1])
{
    sbx_str s;
    if (sbx_wire_get_str(args, "tenant", &s) != 0 || !tenant_name_ok(s)) {
        job_reply_err(j, SBX_E_VALIDATION,
                      "'tenant' must be a name of 1-%d characters of [a-z0-9], not 'sbx'",
                      SBX_TENANT_MAX);
        return false;
    }
    sbx_str_copy(s, out, SBX_TENANT_MAX + 1);
    return true;
}

static void
op_tenant_create(struct admin_job *j, struct sys_conn *c, const msgpack_object *args)
{
    sbx_tenants *t = j->t;
    char name[SBX_TENANT_MAX + 1], msg[256], id[64];
    if (!arg_tenant(j, args, name))
        return;
    int64_t max = 100, rate = 10, mem = 0, cpus = 0, disk = 0, streams = 0;
    sbx_wire_get_i64(args, "maxSandboxes", &max);
    sbx_wire_get_i64(args, "createsPerSecond", &rate);
    sbx_wire_get_i64(args, "maxMemoryBytes", &mem);
    sbx_wire_get_i64(args, "maxCpus", &cpus);
    sbx_wire_get_i64(args, "maxDiskBytes", &disk);
    sbx_wire_get_i64(args, "maxStreams", &streams);
    /* The record holds MiB (an ID is at most 63 bytes): a quota is rounded
     * up to a whole MiB, and the reply says what is kept. */
    int64_t mem_mib = (mem + (1 << 20) - 1) >> 20, disk_mib = (disk + (1 << 20) - 1) >> 20;
    char rid[64];
    snprintf(id, sizeof(id), SYS_PREFIX "t-%s-%lld-%lld", name, (long long)max, (long long)rate);
    snprintf(rid, sizeof(rid), SYS_PREFIX "r-%s-%lld-%lld-%lld-%lld", name, (long long)mem_mib,
             (long long)cpus, (long long)disk_mib, (long long)streams);
    int rc = sys_record(t, c, j->caller, id, true, msg, sizeof(msg));
    if (rc == 0)
        rc = sys_record(t, c, j->caller, rid, true, msg, sizeof(msg));
    if (rc) {
        job_reply_err(j, rc, "cannot record tenant %s: %s", name, msg);
        return;
    }
    /* The same tenant's records with other quotas go. */
    char **old = NULL;
    size_t nold = 0;
    bool existed = false;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nids; i++) {
        struct tten x;
        char rname[SBX_TENANT_MAX + 1];
        const char *sid = t->ids[i].id;
        bool mine = tenant_parse_record(sid, &x) && !strcmp(x.name, name);
        existed |= mine;
        mine |= tenant_parse_res(sid, rname, &x) && !strcmp(rname, name);
        if (mine && strcmp(sid, id) && strcmp(sid, rid)) {
            old = sbx_xrealloc(old, (nold + 1) * sizeof(char *));
            old[nold++] = sbx_xstrdup(sid);
        }
    }
    pthread_mutex_unlock(&t->mu);
    for (size_t i = 0; i < nold; i++)
        sys_record(t, c, j->caller, old[i], false, msg, sizeof(msg));
    tenant_free_ids(old, nold);
    tenant_refresh(t, c);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){j->rid, strlen(j->rid)});
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "tenant", name);
    sbx_enc_kbool(&e, "created", !existed);
    sbx_enc_kint(&e, "maxSandboxes", max);
    sbx_enc_kint(&e, "createsPerSecond", rate);
    sbx_enc_kint(&e, "maxMemoryBytes", mem_mib << 20);
    sbx_enc_kint(&e, "maxCpus", cpus);
    sbx_enc_kint(&e, "maxDiskBytes", disk_mib << 20);
    sbx_enc_kint(&e, "maxStreams", streams);
    job_reply(j, &e);
}

static void
op_tenant_list(struct admin_job *j)
{
    sbx_tenants *t = j->t;
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){j->rid, strlen(j->rid)});
    sbx_enc_karray(&e, "tenants");
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->ntens; i++) {
        const struct tten *x = &t->tens[i];
        int64_t keys = 0;
        for (size_t k = 0; k < t->nkeys; k++)
            keys += !strcmp(t->keys[k].tenant, x->name);
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "tenant", x->name);
        sbx_enc_kint(&e, "maxSandboxes", x->max_sandboxes);
        sbx_enc_kint(&e, "createsPerSecond", x->rate);
        sbx_enc_kint(&e, "sandboxes", x->sandboxes);
        sbx_enc_kint(&e, "maxMemoryBytes", x->max.memory);
        sbx_enc_kint(&e, "maxCpus", x->max.cpu);
        sbx_enc_kint(&e, "maxDiskBytes", x->max.disk);
        sbx_enc_kint(&e, "maxStreams", x->max_streams);
        /* the limits of its sandboxes (-1: one is unlimited) */
        sbx_enc_kint(&e, "memoryBytes", x->used.memory >= RES_UNLIMITED ? -1 : x->used.memory);
        sbx_enc_kint(&e, "cpus", x->used.cpu >= RES_UNLIMITED ? -1 : x->used.cpu);
        sbx_enc_kint(&e, "diskBytes", x->used.disk >= RES_UNLIMITED ? -1 : x->used.disk);
        sbx_enc_kint(&e, "keys", keys);
        sbx_enc_end(&e);
    }
    pthread_mutex_unlock(&t->mu);
    sbx_enc_end(&e);
    job_reply(j, &e);
}

/* Destroy every system record of `name` (kind 't' tenant and its resource
 * quotas, 'k' key) or of key `keyid`; the count destroyed. */
static int64_t
destroy_records(struct admin_job *j, struct sys_conn *c, const char *name, char kind,
                const char *keyid)
{
    sbx_tenants *t = j->t;
    char **ids = NULL, msg[256];
    size_t n = 0;
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nids; i++) {
        struct tten x;
        struct tkey k;
        char rname[SBX_TENANT_MAX + 1];
        const char *sid = t->ids[i].id;
        bool hit = (kind == 't' && tenant_parse_record(sid, &x) && !strcmp(x.name, name)) ||
                   (kind == 't' && tenant_parse_res(sid, rname, &x) && !strcmp(rname, name)) ||
                   (kind == 'k' && tenant_parse_key(sid, &k) &&
                    (keyid ? !strcmp(k.id, keyid) : !strcmp(k.tenant, name)));
        if (hit) {
            ids = sbx_xrealloc(ids, (n + 1) * sizeof(char *));
            ids[n++] = sbx_xstrdup(sid);
        }
    }
    pthread_mutex_unlock(&t->mu);
    int64_t done = 0;
    for (size_t i = 0; i < n; i++)
        done += sys_record(t, c, j->caller, ids[i], false, msg, sizeof(msg)) == 0;
    tenant_free_ids(ids, n);
    return done;
}

static void
op_tenant_delete(struct admin_job *j, struct sys_conn *c, const msgpack_object *args)
{
    sbx_tenants *t = j->t;
    char name[SBX_TENANT_MAX + 1];
    if (!arg_tenant(j, args, name))
        return;
    pthread_mutex_lock(&t->mu);
    struct tten *x = tenant_find(t, name);
    int64_t live = x ? x->sandboxes : 0;
    pthread_mutex_unlock(&t->mu);
    if (live > 0) {
        job_reply_err(j, SBX_E_VALIDATION,
                      "tenant %s still has %lld sandboxes: destroy them first", name,
                      (long long)live);
        return;
    }
    int64_t keys = destroy_records(j, c, name, 'k', NULL);
    int64_t recs = destroy_records(j, c, name, 't', NULL);
    tenant_refresh(t, c);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){j->rid, strlen(j->rid)});
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "tenant", name);
    sbx_enc_kbool(&e, "deleted", recs > 0);
    sbx_enc_kint(&e, "keysRevoked", keys);
    job_reply(j, &e);
}

static void
op_key_create(struct admin_job *j, struct sys_conn *c, const msgpack_object *args)
{
    sbx_tenants *t = j->t;
    char name[SBX_TENANT_MAX + 1], msg[256], id[64];
    if (!arg_tenant(j, args, name))
        return;
    sbx_str scope = {"tenant", 6};
    sbx_wire_get_str(args, "scope", &scope);
    bool admin = sbx_str_eq(scope, "admin");
    pthread_mutex_lock(&t->mu);
    bool known = tenant_find(t, name) != NULL;
    pthread_mutex_unlock(&t->mu);
    if (!known) {
        job_reply_err(j, SBX_E_VALIDATION, "there is no tenant %s (tenant.create first)", name);
        return;
    }
    uint8_t r[32], h[SHA256_DIGEST_SIZE];
    char key[2 * 32 + 5], keyid[KEYID_HEX + 1];
    int rc = sbx_random(r, sizeof(r));
    if (rc) {
        job_reply_err(j, SBX_E_INTERNAL, "cannot draw a key: %s", sbx_err_message(rc));
        return;
    }
    memcpy(key, "sbx_", 4);
    tenant_hex(r, sizeof(r), key + 4);
    tenant_sha256(key, strlen(key), h);
    tenant_hex(h, KEYID_HEX / 2, keyid);
    snprintf(id, sizeof(id), SYS_PREFIX "k%s-%s-%c", keyid, name, admin ? 'a' : 't');
    if ((rc = sys_record(t, c, j->caller, id, true, msg, sizeof(msg))) != 0) {
        job_reply_err(j, rc, "cannot record the key: %s", msg);
        return;
    }
    tenant_refresh(t, c);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){j->rid, strlen(j->rid)});
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "key", key);
    sbx_enc_kstr(&e, "keyId", keyid);
    sbx_enc_kstr(&e, "tenant", name);
    sbx_enc_kstr(&e, "scope", admin ? "admin" : "tenant");
    job_reply(j, &e);
    explicit_bzero(key, sizeof(key));
    explicit_bzero(r, sizeof(r));
}

static void
op_key_list(struct admin_job *j, const msgpack_object *args)
{
    sbx_tenants *t = j->t;
    sbx_str only = {NULL, 0};
    sbx_wire_get_str(args, "tenant", &only);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){j->rid, strlen(j->rid)});
    sbx_enc_karray(&e, "keys");
    pthread_mutex_lock(&t->mu);
    for (size_t i = 0; i < t->nkeys; i++) {
        const struct tkey *k = &t->keys[i];
        if (only.n && !sbx_str_eq(only, k->tenant))
            continue;
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "keyId", k->id);
        sbx_enc_kstr(&e, "tenant", k->tenant);
        sbx_enc_kstr(&e, "scope", k->scope == SBX_SCOPE_ADMIN ? "admin" : "tenant");
        sbx_enc_end(&e);
    }
    pthread_mutex_unlock(&t->mu);
    sbx_enc_end(&e);
    job_reply(j, &e);
}

static void
op_key_revoke(struct admin_job *j, struct sys_conn *c, const msgpack_object *args)
{
    sbx_str s;
    char keyid[KEYID_HEX + 1];
    if (sbx_wire_get_str(args, "keyId", &s) != 0 || s.n != KEYID_HEX) {
        job_reply_err(j, SBX_E_VALIDATION, "'keyId' must be a key's id (%d hex digits)",
                      KEYID_HEX);
        return;
    }
    sbx_str_copy(s, keyid, sizeof(keyid));
    int64_t n = destroy_records(j, c, NULL, 'k', keyid);
    tenant_refresh(j->t, c);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_reply_ok(&e, (sbx_str){j->rid, strlen(j->rid)});
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "keyId", keyid);
    sbx_enc_kbool(&e, "revoked", n > 0);
    job_reply(j, &e);
}

static void *
admin_main(void *arg)
{
    struct admin_job *j = arg;
    struct sys_conn c = {0};
    sbx_msg am;
    bool decoded = false;
    const msgpack_object *args = NULL;
    static const char empty[] = "\x80";
    if (j->alen && sbx_wire_decode(&am, j->args, j->alen, &sbx_wire_limits_request) == 0 &&
        am.root->type == MSGPACK_OBJECT_MAP) {
        decoded = true;
        args = am.root;
    } else if (sbx_wire_decode(&am, empty, 1, &sbx_wire_limits_request) == 0) {
        decoded = true;
        args = am.root;
    }
    char msg[256];
    int rc = tenant_sys_open(j->t, &c);
    if (rc == 0)
        rc = tenant_refresh(j->t, &c);
    if (rc || !args) {
        snprintf(msg, sizeof(msg), "%s", sbx_err_message(rc));
        job_reply_err(j, rc ? rc : SBX_E_INTERNAL, "cannot read the tenant registry: %s", msg);
    } else if (j->op_id == SBX_OPID_TENANT_CREATE) {
        op_tenant_create(j, &c, args);
    } else if (j->op_id == SBX_OPID_TENANT_LIST) {
        op_tenant_list(j);
    } else if (j->op_id == SBX_OPID_TENANT_DELETE) {
        op_tenant_delete(j, &c, args);
    } else if (j->op_id == SBX_OPID_KEY_CREATE) {
        op_key_create(j, &c, args);
    } else if (j->op_id == SBX_OPID_KEY_LIST) {
        op_key_list(j, args);
    } else if (j->op_id == SBX_OPID_KEY_REVOKE) {
        op_key_revoke(j, &c, args);
    } else {
        job_reply_err(j, SBX_E_INTERNAL, "not an admin op");
    }
    tenant_sys_close(&c);
    if (decoded)
        sbx_wire_msg_free(&am);
    sbx_tenants *t = j->t;
    free(j->args);
    free(j);
    pthread_mutex_lock(&t->mu);
    t->jobs--;
    pthread_cond_broadcast(&t->cv);
    pthread_mutex_unlock(&t->mu);
    return NULL;
}

int
sbx_tenants_admin(sbx_tenants *t, int op_id, const char *rid, const char *caller_key_id,
                  const void *args, size_t alen,
                  void (*done)(void *arg, const char *reply, size_t len), void *arg)
{
    struct admin_job *j = sbx_xcalloc(1, sizeof(*j));
    j->t = t;
    j->op_id = op_id;
    snprintf(j->caller, sizeof(j->caller), "%s", caller_key_id);
    snprintf(j->rid, sizeof(j->rid), "%s", rid);
    if (alen) {
        j->args = sbx_xmalloc(alen);
        memcpy(j->args, args, alen);
        j->alen = alen;
    }
    j->done = done;
    j->arg = arg;
    pthread_mutex_lock(&t->mu);
    t->jobs++;
    pthread_mutex_unlock(&t->mu);
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&th, &at, admin_main, j);
    pthread_attr_destroy(&at);
    if (rc) {
        free(j->args);
        free(j);
        pthread_mutex_lock(&t->mu);
        t->jobs--;
        pthread_mutex_unlock(&t->mu);
        return -ENOMEM;
    }
    return 0;
}

