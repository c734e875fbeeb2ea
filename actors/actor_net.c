/*
 * actor_net.c — a sandbox's network settings (docs/network.md): checked
 * from create/configure arguments, kept in the record's config map under
 * "network" ({mode, allow: [..], deny: [..]}), turned into the policy a
 * container start attaches (container/net.h), and shown by status.
 * Runs on the shard's loop thread.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "shard_int.h"

/* parse_rule — one rule's text: a host name (into *nm, *is_name set) or a
 * CIDR (into *r).  0 or SBX_E_VALIDATION (why names the rule). */
static int
parse_rule(struct shard *sh, const char *text, bool deny, struct sbx_net_rule *r,
           struct sbx_net_name *nm, bool *is_name, char *why, size_t whylen)
{
    int rc = sbx_net_name_parse(text, deny, nm, why, whylen);
    *is_name = rc == 0;
    if (rc != 1)
        return rc;
    return sbx_net_rule_parse(text, sh->conf.network_range, r, why, whylen);
}

/* Check one rule list (array of strings); on success encode it as key. */
static int
check_rules(struct shard *sh, const msgpack_object *net, const char *key, sbx_enc *e,
            sbx_err_t *err)
{
    const msgpack_object *arr;
    int rc = sbx_wire_get_array(net, key, &arr);
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return sbx_err_make(err, SBX_E_VALIDATION, "network.%s must be an array of strings", key);
    if (arr->via.array.size > SBX_NET_MAX_RULES)
        return sbx_err_make(err, SBX_E_VALIDATION, "network.%s: at most %d rules (the policy is "
                            "too large)", key, SBX_NET_MAX_RULES);
    sbx_enc_karray(e, key);
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        sbx_str s;
        char text[SBX_NET_NAME_MAX + 8], why[512];
        struct sbx_net_rule r;
        struct sbx_net_name nm;
        bool is_name;
        if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) != 0 || s.n >= sizeof(text))
            return sbx_err_make(err, SBX_E_VALIDATION, "network.%s[%u] must be a string of at "
                                "most 259 bytes, CIDR[:PORT] or NAME[:PORT]", key, i);
        sbx_str_copy(s, text, sizeof(text));
        if (parse_rule(sh, text, !strcmp(key, "deny"), &r, &nm, &is_name, why, sizeof(why)))
            return sbx_err_make(err, SBX_E_VALIDATION, "network.%s[%u]: %s", key, i, why);
        sbx_enc_str(e, text);
    }
    sbx_enc_end(e);
    return 0;
}

int
actor_net_check_args(struct shard *sh, const msgpack_object *args, char **blob, size_t *len,
                     sbx_err_t *err)
{
    const msgpack_object *net;
    *blob = NULL;
    *len = 0;
    int rc = sbx_wire_get_map(args, "network", &net);
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return sbx_err_make(err, SBX_E_VALIDATION, "'network' must be a map {mode, allow, deny}");
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kmap(&e, "network");
    sbx_str mode = {NULL, 0};
    rc = sbx_wire_get_str(net, "mode", &mode);
    if (rc == 0) {
        if (!sbx_str_eq(mode, "none") && !sbx_str_eq(mode, "egress")) {
            sbx_enc_free(&e);
            return sbx_err_make(err, SBX_E_VALIDATION, "network.mode must be none or egress");
        }
        sbx_enc_kstrn(&e, "mode", mode.p, mode.n);
    } else if (rc != -ENOENT) {
        sbx_enc_free(&e);
        return sbx_err_make(err, SBX_E_VALIDATION, "network.mode must be none or egress");
    }
    int64_t mc;
    rc = sbx_wire_get_i64(net, "maxConnections", &mc);
    if (rc == 0 && (mc < 1 || mc > 65536)) {
        sbx_enc_free(&e);
        return sbx_err_make(err, SBX_E_VALIDATION, "network.maxConnections must be 1..65536");
    }
    if (rc == 0)
        sbx_enc_kint(&e, "maxConnections", mc);
    else if (rc != -ENOENT) {
        sbx_enc_free(&e);
        return sbx_err_make(err, SBX_E_VALIDATION, "network.maxConnections must be an integer");
    }
    int64_t bw;
    rc = sbx_wire_get_i64(net, "bandwidth", &bw);
    if ((rc == 0 && (bw < 1 || bw > SBX_NET_BW_MAX)) || (rc != 0 && rc != -ENOENT)) {
        sbx_enc_free(&e);
        return sbx_err_make(err, SBX_E_VALIDATION, "network.bandwidth must be an integer of "
                            "Mbit/s, 1..%d", SBX_NET_BW_MAX);
    }
    if (rc == 0)
        sbx_enc_kint(&e, "bandwidth", bw);
    if ((rc = check_rules(sh, net, "allow", &e, err)) != 0 ||
        (rc = check_rules(sh, net, "deny", &e, err)) != 0) {
        sbx_enc_free(&e);
        return rc;
    }
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    if (sbx_enc_finish(&e, blob, len) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "encoding the network settings");
    return 0;
}

/* The "network" map of the record's config, or NULL (m holds it). */
static const msgpack_object *
stored(struct actor *a, sbx_msg *m, bool *have)
{
    const msgpack_object *net = NULL;
    *have = false;
    if (!a->rec.config ||
        sbx_wire_decode(m, a->rec.config, a->rec.config_len, &sbx_wire_limits_request) != 0)
        return NULL;
    *have = true;
    if (sbx_wire_get_map(m->root, "network", &net) != 0)
        return NULL;
    return net;
}

bool
actor_net_egress(struct actor *a)
{
    sbx_msg m;
    bool have;
    const msgpack_object *net = stored(a, &m, &have);
    sbx_str mode = {NULL, 0};
    bool egress = net && sbx_wire_get_str(net, "mode", &mode) == 0
                      ? sbx_str_eq(mode, "egress")
                      : a->sh->conf.network_default &&
                            !strcmp(a->sh->conf.network_default, "egress");
    if (have)
        sbx_wire_msg_free(&m);
    return egress;
}

static int
load_rules(struct shard *sh, const msgpack_object *net, const char *key, struct sbx_net_rule *out,
           int *n, struct sbx_net_name *names, int *nn, char *why, size_t whylen)
{
    const msgpack_object *arr;
    *n = *nn = 0;
    if (!net || sbx_wire_get_array(net, key, &arr) != 0)
        return 0;
    for (uint32_t i = 0; i < arr->via.array.size && i < SBX_NET_MAX_RULES; i++) {
        sbx_str s;
        char text[SBX_NET_NAME_MAX + 8];
        bool is_name;
        if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) != 0)
            continue;
        sbx_str_copy(s, text, sizeof(text));
        /* Checked at create; a rule refused now (the host took that
         * address since) fails the start: never a wider policy. */
        if (parse_rule(sh, text, !strcmp(key, "deny"), &out[*n], &names[*nn], &is_name, why,
                       whylen) != 0)
            return SBX_E_CONTAINER;
        if (is_name)
            (*nn)++;
        else
            (*n)++;
    }
    return 0;
}

int
actor_net_policy(struct actor *a, struct sbx_net_policy *p, char *why, size_t whylen)
{
    sbx_msg m;
    bool have;
    const msgpack_object *net = stored(a, &m, &have);
    memset(p, 0, sizeof(*p));
    int64_t mc;
    if (net && sbx_wire_get_i64(net, "maxConnections", &mc) == 0 && mc > 0 && mc <= 65536)
        p->max_conns = (uint32_t)mc;
    int64_t bw;
    if (net && sbx_wire_get_i64(net, "bandwidth", &bw) == 0 && bw > 0 && bw <= SBX_NET_BW_MAX)
        p->bandwidth = (uint32_t)bw;
    int rc = load_rules(a->sh, net, "allow", p->allow, &p->nallow, p->allow_names,
                        &p->nallow_names, why, whylen);
    if (rc == 0)
        rc = load_rules(a->sh, net, "deny", p->deny, &p->ndeny, p->deny_names, &p->ndeny_names,
                        why, whylen);
    if (have)
        sbx_wire_msg_free(&m);
    return rc;
}

void
actor_net_apply(struct actor *a)
{
    if (a->cs != C_RUNNING || !a->net_att.slot || !actor_net_egress(a))
        return;
    struct sbx_net_policy *p = sbx_xcalloc(1, sizeof(*p));
    char why[256] = "";
    int rc = actor_net_policy(a, p, why, sizeof(why));
    if (rc == 0)
        rc = sbx_net_update(a->sh->net, a->net_att.slot, a->net_att.addr, p, why, sizeof(why));
    if (rc) {
        /* Fail closed: the old rules cannot stay, as they may allow what the
         * new ones do not.  Its next operation starts a fresh container. */
        sbx_log_warn("sandbox %s: new network policy not applied (%s): stopping its container",
                     a->id, why);
        actor_stop_container(a, false);
    }
    free(p);
}

void
actor_net_encode_status(struct actor *a, sbx_enc *e)
{
    sbx_msg m;
    bool have;
    const msgpack_object *net = stored(a, &m, &have);
    bool egress = actor_net_egress(a);
    sbx_enc_kmap(e, "network");
    sbx_enc_kstr(e, "mode", egress ? "egress" : "none");
    const char *keys[] = {"allow", "deny"};
    for (int k = 0; k < 2; k++) {
        const msgpack_object *arr;
        sbx_enc_karray(e, keys[k]);
        if (net && sbx_wire_get_array(net, keys[k], &arr) == 0)
            for (uint32_t i = 0; i < arr->via.array.size; i++)
                sbx_enc_obj(e, &arr->via.array.ptr[i]);
        sbx_enc_end(e);
    }
    int64_t mc;
    if (net && sbx_wire_get_i64(net, "maxConnections", &mc) == 0)
        sbx_enc_kint(e, "maxConnections", mc);
    int64_t bw;
    if (net && sbx_wire_get_i64(net, "bandwidth", &bw) == 0)
        sbx_enc_kint(e, "bandwidth", bw);
    if (have)
        sbx_wire_msg_free(&m);
    if (a->cs == C_RUNNING && a->net_att.slot) {
        char addr[32];
        uint32_t v = a->net_att.addr;
        snprintf(addr, sizeof(addr), "%u.%u.%u.%u", v >> 24, (v >> 16) & 255, (v >> 8) & 255,
                 v & 255);
        sbx_enc_kstr(e, "address", addr);
        sbx_enc_kint(e, "attachUs", a->net_att.attach_us);
        struct sbx_net_stats st;
        if (sbx_net_stats(a->sh->net, a->net_att.slot, &st) == 0) {
            sbx_enc_kint(e, "bytesOut", (int64_t)st.bytes_out);
            sbx_enc_kint(e, "bytesIn", (int64_t)st.bytes_in);
            sbx_enc_kint(e, "connections", (int64_t)st.connections);
        }
        /* The names its resolver answered lately, and the pinned addresses. */
        struct sbx_net_pin pins[16];
        int np = sbx_net_pins(a->sh->net, a->net_att.slot, pins, 16);
        int64_t now = sbx_wall_ms();
        sbx_enc_karray(e, "resolved");
        for (int i = 0; i < np; i++) {
            uint32_t v2 = pins[i].addr;
            snprintf(addr, sizeof(addr), "%u.%u.%u.%u", v2 >> 24, (v2 >> 16) & 255,
                     (v2 >> 8) & 255, v2 & 255);
            sbx_enc_map(e);
            sbx_enc_kstr(e, "name", pins[i].name);
            sbx_enc_kstr(e, "address", addr);
            sbx_enc_kint(e, "expiresInMs", pins[i].expires_ms - now);
            sbx_enc_end(e);
        }
        sbx_enc_end(e);
    }
    sbx_enc_end(e);
}
