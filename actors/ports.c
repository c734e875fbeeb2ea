/*
 * ports.c — preview URLs of a sandbox: its exposed ports, their tokens and
 * hosts (the SDK's exposePort / unexposePort / getExposedPorts, and the
 * gateway's preview.resolve), kept in the actor's record.  Split from
 * actor.c; like it, everything here runs on the shard's loop thread
 * (shard.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "shard_int.h"

/* Preview URLs: exposed ports (the SDK's exposePort / unexposePort /
 * getExposedPorts, cloudflare-sandbox-sdk.md §1.3 and §3.3). */

#define PORT_MIN 1024 /* below: privileged ports, reserved */
#define TOKEN_MAX 16  /* custom tokens: 1-16 of [a-z0-9_], as the SDK */
/* Exposed ports per sandbox.  The SDK sets no limit; ours keeps the record
 * small (each entry ~170 bytes; in a cluster the record travels to etcd in
 * one request) and is far above what a sandbox serves. */
#define PORTS_MAX 256

/* The entry of port in the record's ports map, or NULL; *m must be freed
 * with sbx_wire_msg_free when it returns non-NULL. */
static const msgpack_object *
port_entry(struct actor *a, int port, sbx_msg *m)
{
    if (!a->rec.ports ||
        sbx_wire_decode(m, a->rec.ports, a->rec.ports_len, &sbx_wire_limits_request) != 0)
        return NULL;
    char key[16];
    snprintf(key, sizeof(key), "%d", port);
    const msgpack_object *e = NULL;
    if (sbx_wire_get_map(m->root, key, &e) != 0) {
        sbx_wire_msg_free(m);
        return NULL;
    }
    return e;
}

bool
actor_port_exposed(struct actor *a, int port)
{
    sbx_msg m;
    const msgpack_object *e = port_entry(a, port, &m);
    if (!e)
        return false;
    int64_t gen = -1;
    sbx_wire_get_i64(e, "generation", &gen);
    sbx_wire_msg_free(&m);
    return a->cs == C_RUNNING && gen == (int64_t)a->rec.generation;
}

static bool
token_eq(sbx_str a, sbx_str b)
{
    /* Constant time in the stored token's length. */
    unsigned char diff = (unsigned char)(a.n != b.n);
    for (size_t i = 0; i < a.n; i++)
        diff |= (unsigned char)(a.p[i] ^ (i < b.n ? b.p[i] : 0));
    return diff == 0;
}

/* A sandbox ID usable as part of a DNS label: [a-z0-9-], no '-' at either end. */
static bool
dns_safe_id(const char *id)
{
    size_t n = strlen(id);
    if (!n || id[0] == '-' || id[n - 1] == '-')
        return false;
    for (size_t i = 0; i < n; i++)
        if (!((id[i] >= 'a' && id[i] <= 'z') || (id[i] >= '0' && id[i] <= '9') || id[i] == '-'))
            return false;
    return true;
}

static int
port_arg(struct sop *op, int *port)
{
    int64_t v;
    if (sbx_wire_get_i64(op->req.args, "port", &v) != 0) {
        shard_reply_err(op, SBX_E_INVALID_PORT, "'port' (an integer) is required");
        return -1;
    }
    if (v < PORT_MIN || v > 65535) {
        shard_reply_err(op, SBX_E_INVALID_PORT,
                        "Invalid port number: %lld (exposable ports are %d-65535; lower ports "
                        "are reserved)",
                        (long long)v, PORT_MIN);
        return -1;
    }
    *port = (int)v;
    return 0;
}

/* The preview host from the args or the shard's default, lower-cased;
 * -1 after replying VALIDATION_FAILED. */
static int
host_arg(struct sop *op, char *host, size_t hostlen)
{
    sbx_str h = {op->actor->sh->conf.preview_domain, 0};
    h.n = strlen(h.p);
    int rc = sbx_wire_get_str(op->req.args, "hostname", &h);
    if (rc == SBX_E_VALIDATION || h.n == 0 || h.n >= hostlen) {
        shard_reply_err(op, SBX_E_VALIDATION, "'hostname' must be a host name (and :port)");
        return -1;
    }
    for (size_t i = 0; i < h.n; i++) {
        char c = h.p[i];
        if (c >= 'A' && c <= 'Z')
            c = (char)(c - 'A' + 'a');
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' || c == '-' ||
              c == ':')) {
            shard_reply_err(op, SBX_E_VALIDATION,
                            "'hostname' may hold letters, digits, '.', '-' and ':port' only");
            return -1;
        }
        host[i] = c;
    }
    host[h.n] = 0;
    return 0;
}

/*
 * custom_domain_arg — CUSTOM_DOMAIN_REQUIRED when `host` (lower-case, maybe
 * with ":port") is one of the shard's --no-preview-host suffixes or ends in
 * ".<suffix>": no wildcard DNS/certificate serves {port}-{id}-{token}.<host>
 * there (the SDK's rule for *.workers.dev).  -1 after replying.
 */
static int
custom_domain_arg(struct sop *op, const char *host)
{
    size_t hn = strcspn(host, ":");
    for (char **p = op->actor->sh->conf.no_preview_host; p && *p; p++) {
        size_t sn = strlen(*p);
        if (!sn || sn > hn || strncasecmp(host + hn - sn, *p, sn) != 0)
            continue;
        if (sn < hn && host[hn - sn - 1] != '.')
            continue;
        shard_reply_err(op, SBX_E_CUSTOM_DOMAIN,
                        "'%.*s' cannot carry preview URLs ({port}-{id}-{token}.%.*s): %s hosts "
                        "have no wildcard certificate; expose the port with a hostname of a "
                        "custom domain",
                        (int)hn, host, (int)hn, host, *p);
        return -1;
    }
    return 0;
}

static void
encode_port(sbx_enc *e, struct actor *a, int port, const char *token, sbx_str name,
            const char *host)
{
    char url[512];
    snprintf(url, sizeof(url), "%s://%d-%s-%s.%s/", a->sh->conf.preview_scheme, port, a->id,
             token, host);
    sbx_enc_map(e);
    sbx_enc_kstr(e, "url", url);
    sbx_enc_kint(e, "port", port);
    if (name.n)
        sbx_enc_kstrn(e, "name", name.p, name.n);
    sbx_enc_kstr(e, "token", token);
    sbx_enc_kstr(e, "status", "active");
    sbx_enc_end(e);
}

/* Replace the ports map with one where `port` maps to entry (or is removed
 * when entry is NULL). */
static void
ports_set(struct actor *a, int port, const char *entry, size_t entry_len)
{
    char key[16];
    snprintf(key, sizeof(key), "%d", port);
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_str(&e, key);
    if (entry)
        sbx_enc_raw(&e, entry, entry_len);
    else
        sbx_enc_nil(&e);
    sbx_enc_end(&e);
    char *b;
    size_t n;
    if (sbx_enc_finish(&e, &b, &n) != 0)
        return;
    sbx_msg m;
    if (sbx_wire_decode(&m, b, n, &sbx_wire_limits_request) == 0) {
        actor_merge_map_blob(&a->rec.ports, &a->rec.ports_len, m.root);
        sbx_wire_msg_free(&m);
    }
    free(b);
}

void
actor_op_port_expose(struct actor *a, struct sop *op)
{
    int port;
    char host[256];
    if (port_arg(op, &port) || host_arg(op, host, sizeof(host)) || custom_domain_arg(op, host))
        return;
    if (!dns_safe_id(a->id) || strlen(a->id) + 7 + TOKEN_MAX > 63) {
        shard_reply_err(op, SBX_E_VALIDATION,
                        "preview URLs need a sandbox ID of lower-case letters, digits and '-' "
                        "(not at either end) of at most %d characters: '%s' cannot be part of a "
                        "host name",
                        63 - 7 - TOKEN_MAX, a->id);
        return;
    }
    sbx_str want = {"", 0}, name = {"", 0};
    int rc = sbx_wire_get_str(op->req.args, "token", &want);
    bool custom = rc == 0;
    if (rc == SBX_E_VALIDATION || (custom && (want.n == 0 || want.n > TOKEN_MAX))) {
        shard_reply_err(op, SBX_E_VALIDATION, "'token' must be 1-%d characters of [a-z0-9_]",
                        TOKEN_MAX);
        return;
    }
    for (size_t i = 0; i < want.n; i++) {
        char c = want.p[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) {
            shard_reply_err(op, SBX_E_VALIDATION, "'token' must be 1-%d characters of [a-z0-9_]",
                            TOKEN_MAX);
            return;
        }
    }
    if (sbx_wire_get_str(op->req.args, "name", &name) == SBX_E_VALIDATION || name.n > 128) {
        shard_reply_err(op, SBX_E_VALIDATION, "'name' must be a string of at most 128 bytes");
        return;
    }
    actor_ensure_record(a, NULL);
    /* The URL is bound to a running container (its generation): start one. */
    if (a->cs != C_RUNNING) {
        actor_start_container(a, op);
        return;
    }
    char token[TOKEN_MAX + 1] = "";
    sbx_msg m;
    bool have_m = false, known = false;
    uint32_t nports = 0;
    if (a->rec.ports &&
        sbx_wire_decode(&m, a->rec.ports, a->rec.ports_len, &sbx_wire_limits_request) == 0) {
        have_m = true;
        nports = m.root->via.map.size;
        for (uint32_t i = 0; i < m.root->via.map.size; i++) {
            const msgpack_object_kv *kv = &m.root->via.map.ptr[i];
            sbx_str k, t;
            if (sbx_wire_obj_str(&kv->key, &k) != 0 || sbx_wire_get_str(&kv->val, "token", &t))
                continue;
            char kb[16];
            snprintf(kb, sizeof(kb), "%d", port);
            bool same_port = sbx_str_eq(k, kb);
            known |= same_port;
            if (custom && !same_port && token_eq(t, want)) {
                sbx_wire_msg_free(&m);
                shard_reply_err(op, SBX_E_PORT_EXPOSED,
                                "token '%.*s' is already used by port %.*s", (int)want.n, want.p,
                                (int)k.n, k.p);
                return;
            }
            if (same_port && !custom && t.n <= TOKEN_MAX)
                snprintf(token, sizeof(token), "%.*s", (int)t.n, t.p); /* re-expose: same URL */
        }
    }
    if (have_m)
        sbx_wire_msg_free(&m);
    if (!known && nports >= PORTS_MAX) {
        shard_reply_err(op, SBX_E_VALIDATION,
                        "at most %d ports can be exposed at once; unexpose one first",
                        PORTS_MAX);
        return;
    }
    if (custom) {
        snprintf(token, sizeof(token), "%.*s", (int)want.n, want.p);
    } else if (!token[0]) {
        /* 12 random bytes, base64 with +/ → _, no padding, lower-cased: 16
         * characters of [a-z0-9_] (the SDK's generator). */
        unsigned char rnd[12];
        if (sbx_random(rnd, sizeof(rnd)) != 0) {
            shard_reply_err(op, SBX_E_INTERNAL, "no randomness for a token");
            return;
        }
        size_t bl;
        char *b64 = sbx_base64_encode(rnd, sizeof(rnd), &bl);
        for (size_t i = 0; i < bl && i < TOKEN_MAX; i++) {
            char c = b64[i];
            token[i] = c == '+' || c == '/' ? '_' : (c >= 'A' && c <= 'Z') ? (char)(c + 32) : c;
        }
        token[SBX_MIN(bl, (size_t)TOKEN_MAX)] = 0;
        free(b64);
    }
    sbx_enc ent;
    sbx_enc_init(&ent);
    sbx_enc_map(&ent);
    sbx_enc_kstr(&ent, "token", token);
    if (name.n)
        sbx_enc_kstrn(&ent, "name", name.p, name.n);
    sbx_enc_kint(&ent, "generation", (int64_t)a->rec.generation);
    sbx_enc_end(&ent);
    char *eb;
    size_t el;
    if (sbx_enc_finish(&ent, &eb, &el) != 0) {
        shard_reply_err(op, SBX_E_INTERNAL, "cannot encode the port entry");
        return;
    }
    ports_set(a, port, eb, el);
    free(eb);
    actor_save_record(a);
    sbx_enc e;
    char url[512];
    snprintf(url, sizeof(url), "%s://%d-%s-%s.%s/", a->sh->conf.preview_scheme, port, a->id,
             token, host);
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "url", url);
    sbx_enc_kint(&e, "port", port);
    if (name.n)
        sbx_enc_kstrn(&e, "name", name.p, name.n);
    sbx_enc_kstr(&e, "token", token);
    shard_reply_end(op, &e, a->last_seq);
}

void
actor_op_port_unexpose(struct actor *a, struct sop *op)
{
    int port;
    if (port_arg(op, &port))
        return;
    sbx_msg m;
    const msgpack_object *ent = a->exists ? port_entry(a, port, &m) : NULL;
    bool was = ent != NULL;
    if (ent) {
        sbx_wire_msg_free(&m);
        ports_set(a, port, NULL, 0);
        actor_save_record(a);
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kint(&e, "port", port);
    sbx_enc_kbool(&e, "wasExposed", was);
    shard_reply_end(op, &e, a->last_seq);
}

void
actor_op_port_list(struct actor *a, struct sop *op)
{
    char host[256];
    if (host_arg(op, host, sizeof(host)))
        return;
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_karray(&e, "ports");
    sbx_msg m;
    if (a->exists && a->cs == C_RUNNING && a->rec.ports &&
        sbx_wire_decode(&m, a->rec.ports, a->rec.ports_len, &sbx_wire_limits_request) == 0) {
        for (uint32_t i = 0; i < m.root->via.map.size; i++) {
            const msgpack_object_kv *kv = &m.root->via.map.ptr[i];
            sbx_str k, t, name = {"", 0};
            int64_t gen = -1;
            if (sbx_wire_obj_str(&kv->key, &k) != 0 || sbx_wire_get_str(&kv->val, "token", &t))
                continue;
            sbx_wire_get_i64(&kv->val, "generation", &gen);
            if (gen != (int64_t)a->rec.generation)
                continue; /* exposed for a container that is gone: not active */
            sbx_wire_get_str(&kv->val, "name", &name);
            char tok[TOKEN_MAX + 1];
            snprintf(tok, sizeof(tok), "%.*s", (int)t.n, t.p);
            encode_port(&e, a, atoi(k.n < 8 ? k.p : "0"), tok, name, host);
        }
        sbx_wire_msg_free(&m);
    }
    sbx_enc_end(&e);
    shard_reply_end(op, &e, a->last_seq);
}

/* preview.resolve {port, token}: the HTTP front's check of a preview URL.
 * Never starts a container: a URL of a container that is gone is stale. */
void
actor_op_preview_resolve(struct actor *a, struct sop *op)
{
    int64_t port = 0;
    sbx_str tok = {"", 0};
    sbx_wire_get_i64(op->req.args, "port", &port);
    sbx_wire_get_str(op->req.args, "token", &tok);
    sbx_msg m;
    const msgpack_object *ent =
        a->exists && port > 0 && port <= 65535 ? port_entry(a, (int)port, &m) : NULL;
    sbx_str t = {"", 0};
    int64_t gen = -1;
    if (ent) {
        sbx_wire_get_str(ent, "token", &t);
        sbx_wire_get_i64(ent, "generation", &gen);
    }
    bool ok = ent && token_eq(t, tok);
    if (ent)
        sbx_wire_msg_free(&m);
    if (!ok) {
        shard_reply_err(op, SBX_E_INVALID_TOKEN, "Access denied: Invalid token or port not exposed");
        return;
    }
    if (a->cs != C_RUNNING || gen != (int64_t)a->rec.generation) {
        shard_reply_err(op, SBX_E_STALE_PREVIEW,
                        "Preview URL is stale because the sandbox runtime is not active "
                        "(expose the port again after a restart)");
        return;
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kint(&e, "generation", (int64_t)a->rec.generation);
    sbx_enc_kstr(&e, "relay", a->sh->conf.relay ? a->sh->conf.relay : "");
    sbx_enc_kstr(&e, "shard", a->sh->conf.name);
    shard_reply_end(op, &e, 0);
}

