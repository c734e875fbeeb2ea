/*
 * ops.c — lookup in the table of operations (generated: runtime/ops_gen.c from
 * runtime/ops.yaml) and the one intake check of a request; see ops.h and
 * docs/schema.md.
 */
#include "ops.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "err.h"
#include "util.h"
#include "wire.h"

const struct sbx_op_def *
sbx_op_find(const char *name, size_t n)
{
    for (const struct sbx_op_def *d = sbx_ops; d->name; d++) {
        if (strlen(d->name) == n && memcmp(d->name, name, n) == 0)
            return d;
    }
    return NULL;
}

/* kind_of — the enum sbx_arg_kind bit of a msgpack value (0 for nil / ext). */
static unsigned
kind_of(const msgpack_object *v)
{
    switch (v->type) {
    case MSGPACK_OBJECT_STR:
        return SBX_ARG_STR;
    case MSGPACK_OBJECT_BIN:
        return SBX_ARG_BIN;
    case MSGPACK_OBJECT_POSITIVE_INTEGER:
    case MSGPACK_OBJECT_NEGATIVE_INTEGER:
        return SBX_ARG_INT;
    case MSGPACK_OBJECT_FLOAT32:
    case MSGPACK_OBJECT_FLOAT64:
        return SBX_ARG_FLOAT;
    case MSGPACK_OBJECT_BOOLEAN:
        return SBX_ARG_BOOL;
    case MSGPACK_OBJECT_MAP:
        return SBX_ARG_MAP;
    case MSGPACK_OBJECT_ARRAY:
        return SBX_ARG_ARRAY;
    default:
        return 0;
    }
}

/* bound_text — "from 1 to 10", "of at least 1", "of at most 10" (+ unit). */
static void
bound_text(const struct sbx_arg *a, char *buf, size_t len)
{
    const char *u = a->unit ? a->unit : "";
    const char *sp = a->unit ? " " : "";
    if (a->has_min && a->has_max)
        snprintf(buf, len, " from %.17g to %.17g%s%s", a->min, a->max, sp, u);
    else if (a->has_min)
        snprintf(buf, len, " of at least %.17g%s%s", a->min, sp, u);
    else if (a->has_max)
        snprintf(buf, len, " of at most %.17g%s%s", a->max, sp, u);
    else
        buf[0] = '\0';
}

static int
check_arg(const struct sbx_arg *a, const msgpack_object *v, char *why, size_t whylen)
{
    int fail = a->code ? a->code : SBX_E_VALIDATION;
    unsigned k = kind_of(v);
    bool integral_float = k == SBX_ARG_FLOAT && isfinite(v->via.f64) && v->via.f64 == floor(v->via.f64);
    if (!(k & a->kinds) && !(integral_float && (a->kinds & SBX_ARG_INT))) {
        snprintf(why, whylen, "'%s' must be %s", a->name, a->type);
        return fail;
    }
    if ((a->has_min || a->has_max) && (k == SBX_ARG_INT || k == SBX_ARG_FLOAT)) {
        double x = v->type == MSGPACK_OBJECT_POSITIVE_INTEGER   ? (double)v->via.u64
                   : v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? (double)v->via.i64
                                                                : v->via.f64;
        if ((a->has_min && !(x >= a->min)) || (a->has_max && !(x <= a->max))) {
            char b[96];
            bound_text(a, b, sizeof(b));
            snprintf(why, whylen, "'%s' must be %s%s", a->name, a->type, b);
            return fail;
        }
    }
    if (a->max_len) {
        uint32_t n = k == SBX_ARG_STR     ? v->via.str.size
                     : k == SBX_ARG_BIN   ? v->via.bin.size
                     : k == SBX_ARG_ARRAY ? v->via.array.size
                     : k == SBX_ARG_MAP   ? v->via.map.size
                                          : 0;
        if (n > a->max_len) {
            const char *what = k == SBX_ARG_ARRAY ? "items" : k == SBX_ARG_MAP ? "entries" : "bytes";
            snprintf(why, whylen, "'%s' has %u %s, more than the limit of %u", a->name, n, what,
                     a->max_len);
            return fail;
        }
    }
    if (a->enums && k == SBX_ARG_STR) {
        for (const char *const *e = a->enums; *e; e++) {
            if (strlen(*e) == v->via.str.size && memcmp(*e, v->via.str.ptr, v->via.str.size) == 0)
                return 0;
        }
        char list[256];
        size_t o = 0;
        list[0] = '\0';
        for (const char *const *e = a->enums; *e && o < sizeof(list); e++)
            o += (size_t)snprintf(list + o, sizeof(list) - o, "%s\"%s\"", o ? ", " : "", *e);
        snprintf(why, whylen, "'%s' must be one of %s", a->name, list);
        return fail;
    }
    return 0;
}

int
sbx_op_check_args(const struct sbx_op_def *def, const msgpack_object *args, char *why,
                  size_t whylen)
{
    for (unsigned i = 0; i < def->nargs; i++) {
        const struct sbx_arg *a = &def->args[i];
        const msgpack_object *v = args ? sbx_wire_get(args, a->name) : NULL;
        if (!v || v->type == MSGPACK_OBJECT_NIL) {
            if (a->required) {
                snprintf(why, whylen, "%s needs '%s' (%s)", def->name, a->name, a->type);
                return SBX_E_VALIDATION;
            }
            continue;
        }
        int rc = check_arg(a, v, why, whylen);
        if (rc)
            return rc;
    }
    return 0;
}

/*
 * check_durations — the envelope's deadline and the duration arguments every
 * operation shares are within range (runtime/wire.h SBX_WIRE_MAX_DURATION_MS):
 * so no layer behind the intake (nng timers, the shard, the agent's deadline
 * arithmetic) sees a value that wraps.
 */
static int
check_durations(const struct sbx_req *req, char *why, size_t whylen)
{
    static const char *const keys[] = {"timeout", "commandTimeoutMs", "cloneTimeoutMs",
                                       "interval"};
    if (req->timeout_ms > SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS) {
        snprintf(why, whylen, "timeoutMs %lld is over the limit of %lld ms",
                 (long long)req->timeout_ms,
                 SBX_WIRE_MAX_DURATION_MS + SBX_WIRE_DEADLINE_SLACK_MS);
        return SBX_E_VALIDATION;
    }
    for (size_t i = 0; req->args && i < SBX_ARRAY_LEN(keys); i++) {
        const msgpack_object *v = sbx_wire_get(req->args, keys[i]);
        if (!v || v->type == MSGPACK_OBJECT_NIL)
            continue;
        if (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 <= SBX_WIRE_MAX_DURATION_MS)
            continue;
        if (v->type == MSGPACK_OBJECT_FLOAT64 && v->via.f64 >= 0 &&
            v->via.f64 <= (double)SBX_WIRE_MAX_DURATION_MS)
            continue;
        snprintf(why, whylen, "'%s' must be a number of milliseconds from 0 to %lld (24 h)",
                 keys[i], SBX_WIRE_MAX_DURATION_MS);
        return SBX_E_VALIDATION;
    }
    return 0;
}

int
sbx_op_intake(const struct sbx_req *req, bool from_client, const struct sbx_op_def **def,
              char *why, size_t whylen)
{
    const struct sbx_op_def *d = sbx_op_find(req->op.p, req->op.n);
    *def = NULL;
    if (!d || (from_client && (d->flags & SBX_OP_INTERNAL))) {
        snprintf(why, whylen, "unknown operation '%.*s'", (int)SBX_MIN(req->op.n, 64),
                 req->op.p);
        return SBX_E_UNKNOWN_OP;
    }
    *def = d;
    if ((d->flags & SBX_OP_SANDBOX) && req->sandbox.n == 0) {
        snprintf(why, whylen, "operation '%s' needs a 'sandbox' ID", d->name);
        return SBX_E_VALIDATION;
    }
    int rc = check_durations(req, why, whylen);
    if (rc)
        return rc;
    return sbx_op_check_args(d, req->args, why, whylen);
}
