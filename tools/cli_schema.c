/*
 * cli_schema.c — what the CLI derives from the schema (runtime/ops.yaml,
 * through its generated copy tools/cli_ops_gen.c): the operations part of
 * `sbx help`, `sbx help OP`, and the check of `sbx call` arguments before
 * anything is sent.  The check follows runtime/ops.c sbx_op_intake (the
 * intake every gateway and shard runs: the op, the sandbox ID, the shared
 * durations, then sbx_op_check_args) rule for rule and message for message,
 * on the JSON the user typed instead of msgpack; unknown members are ignored.
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cli_ops_gen.h"

const struct cli_op *
cli_op_find(const char *name)
{
    for (const struct cli_op *o = cli_ops; o->name; o++)
        if (!strcmp(o->name, name))
            return o;
    return NULL;
}

const struct cli_op *
cli_op_of_verb(const char *verb)
{
    for (const struct cli_op *o = cli_ops; o->name; o++)
        if (o->verb && !strcmp(o->verb, verb))
            return o;
    return NULL;
}

/* kind_of — the enum cli_kind bit of a JSON value (0 for null). */
static unsigned
kind_of(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_STRING:
        return CLI_K_STR;
    case JSON_INTEGER:
        return CLI_K_INT;
    case JSON_REAL:
        return CLI_K_REAL;
    case JSON_TRUE:
    case JSON_FALSE:
        return CLI_K_BOOL;
    case JSON_OBJECT:
        return CLI_K_OBJECT;
    case JSON_ARRAY:
        return CLI_K_ARRAY;
    default:
        return 0;
    }
}

/* bound_text — " from 1 to 10", " of at least 1", " of at most 10" (+ unit). */
static void
bound_text(const struct cli_arg *a, char *buf, size_t len)
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
check_arg(const struct cli_arg *a, const json_t *v, const char **code, char *why, size_t whylen)
{
    unsigned k = kind_of(v);
    *code = a->code;
    bool integral_real = k == CLI_K_REAL && isfinite(json_real_value(v)) &&
                         json_real_value(v) == floor(json_real_value(v));
    if (!(k & a->kinds) && !(integral_real && (a->kinds & CLI_K_INT))) {
        snprintf(why, whylen, "'%s' must be %s", a->name, a->type);
        return -EINVAL;
    }
    if ((a->has_min || a->has_max) && (k == CLI_K_INT || k == CLI_K_REAL)) {
        double x = json_number_value(v);
        if ((a->has_min && !(x >= a->min)) || (a->has_max && !(x <= a->max))) {
            char b[96];
            bound_text(a, b, sizeof(b));
            snprintf(why, whylen, "'%s' must be %s%s", a->name, a->type, b);
            return -EINVAL;
        }
    }
    if (a->max_len) {
        size_t n = k == CLI_K_STR      ? json_string_length(v)
                   : k == CLI_K_ARRAY  ? json_array_size(v)
                   : k == CLI_K_OBJECT ? json_object_size(v)
                                       : 0;
        if (n > a->max_len) {
            const char *what = k == CLI_K_ARRAY ? "items" : k == CLI_K_OBJECT ? "entries" : "bytes";
            snprintf(why, whylen, "'%s' has %zu %s, more than the limit of %u", a->name, n, what,
                     a->max_len);
            return -EINVAL;
        }
    }
    if (a->enums && k == CLI_K_STR) {
        for (const char *const *e = a->enums; *e; e++)
            if (!strcmp(*e, json_string_value(v)))
                return 0;
        char list[256];
        size_t o = 0;
        list[0] = '\0';
        for (const char *const *e = a->enums; *e && o < sizeof(list); e++)
            o += (size_t)snprintf(list + o, sizeof(list) - o, "%s\"%s\"", o ? ", " : "", *e);
        snprintf(why, whylen, "'%s' must be one of %s", a->name, list);
        return -EINVAL;
    }
    return 0;
}

/*
 * check_durations — the duration arguments every op shares are numbers of
 * milliseconds within CLI_MAX_DURATION_MS; the same keys, order and message
 * as runtime/ops.c check_durations, which runs before the op's own specs.
 */
static int
check_durations(const json_t *args, char *why, size_t whylen)
{
    static const char *const keys[] = {"timeout", "commandTimeoutMs", "cloneTimeoutMs",
                                       "interval"};
    for (size_t i = 0; args && i < sizeof(keys) / sizeof(keys[0]); i++) {
        const json_t *v = json_object_get(args, keys[i]);
        if (!v || json_is_null(v))
            continue;
        if (json_is_integer(v) && json_integer_value(v) >= 0 &&
            json_integer_value(v) <= CLI_MAX_DURATION_MS)
            continue;
        if (json_is_real(v) && json_real_value(v) >= 0 &&
            json_real_value(v) <= (double)CLI_MAX_DURATION_MS)
            continue;
        snprintf(why, whylen, "'%s' must be a number of milliseconds from 0 to %lld (24 h)",
                 keys[i], CLI_MAX_DURATION_MS);
        return -EINVAL;
    }
    return 0;
}

int
cli_check_call(const char *op_name, const char *sandbox, const char *args_json,
               const char **code, char *why, size_t whylen)
{
    const struct cli_op *op = cli_op_find(op_name);
    json_t *args = NULL;
    int rc = 0;
    *code = "VALIDATION_FAILED";
    if (!op) {
        *code = "UNKNOWN_OPERATION";
        snprintf(why, whylen, "unknown operation '%.64s'", op_name);
        return -EINVAL;
    }
    if (op->sandbox && !(sandbox && *sandbox)) {
        snprintf(why, whylen, "operation '%s' needs a 'sandbox' ID", op->name);
        return -EINVAL;
    }
    if (args_json && *args_json) {
        json_error_t je;
        args = json_loads(args_json, JSON_DECODE_ANY, &je);
        if (!args || !json_is_object(args)) {
            snprintf(why, whylen, "arguments must be a JSON object: %s",
                     args ? "not an object" : je.text);
            rc = -EINVAL;
            goto out;
        }
    }
    if ((rc = check_durations(args, why, whylen)) != 0)
        goto out;
    for (unsigned i = 0; i < op->nargs; i++) {
        const struct cli_arg *a = &op->args[i];
        const json_t *v = args ? json_object_get(args, a->name) : NULL;
        if (!v || json_is_null(v)) {
            if (a->required) {
                *code = "VALIDATION_FAILED";
                snprintf(why, whylen, "%s needs '%s' (%s)", op->name, a->name, a->type);
                rc = -EINVAL;
                goto out;
            }
            continue;
        }
        if ((rc = check_arg(a, v, code, why, whylen)) != 0)
            goto out;
    }
out:
    json_decref(args);
    return rc;
}

void
cli_help_ops(void)
{
    printf("\noperations (sbx call OP [ID|-] [JSON]; `sbx help OP` lists an op's arguments):\n");
    for (const struct cli_op *o = cli_ops; o->name; o++)
        printf("  %-20s %s\n", o->name, o->summary);
}

int
cli_help_op(const char *name)
{
    const struct cli_op *op = cli_op_find(name);
    if (!op)
        op = cli_op_of_verb(name);
    if (!op) {
        /* A verb of several ops ("wait" runs "wait --log", ...): list them. */
        size_t n = strlen(name);
        int found = 0;
        for (const struct cli_op *o = cli_ops; o->name; o++) {
            if (!o->verb || strncmp(o->verb, name, n) || o->verb[n] != ' ')
                continue;
            if (!found++)
                printf("operations (`sbx help OP` for one's arguments):\n");
            printf("  sbx %-16s %-20s %s\n", o->verb, o->name, o->summary);
        }
        return found ? 0 : -ENOENT;
    }
    printf("%s — %s\n", op->name, op->summary);
    printf("  sbx call %s %s '{JSON arguments}'\n", op->name, op->sandbox ? "ID" : "-");
    if (op->verb)
        printf("  sbx %s%s%s\n", op->verb, op->positionals[0] ? " " : "", op->positionals);
    if (!op->nargs) {
        printf("arguments: none\n");
        return 0;
    }
    printf("arguments (a JSON object; unknown members are ignored):\n");
    for (unsigned i = 0; i < op->nargs; i++) {
        const struct cli_arg *a = &op->args[i];
        char b[96];
        bound_text(a, b, sizeof(b));
        printf("  %-18s %s%s%s", a->name, a->type, b[0] ? "," : "", b);
        if (!b[0] && a->unit)
            printf(", %s", a->unit);
        if (a->max_len)
            printf(", at most %u %s", a->max_len,
                   (a->kinds & CLI_K_ARRAY) ? "items" : (a->kinds & CLI_K_OBJECT) ? "entries"
                                                                                  : "bytes");
        if (a->enums) {
            printf(", one of");
            for (const char *const *e = a->enums; *e; e++)
                printf("%s \"%s\"", e == a->enums ? "" : ",", *e);
        }
        printf("%s", a->required ? ", required" : "");
        if (a->def)
            printf(", default %s", a->def);
        printf("\n  %-18s %s\n", "", a->doc);
    }
    return 0;
}
