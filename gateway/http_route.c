/*
 * http_route.c — the HTTP front's route table and request arguments (see
 * http_int.h, http.h, docs/http.md).
 *
 * The routes are built once at start from the table of operations
 * (runtime/ops.h) into h->routes (owned by h, freed by http_routes_free) and
 * are read-only afterwards, so MHD's threads match against them without a
 * lock.  Matching splits the URL as sent (MHD unescapes nothing: see
 * http_unescape_none) and percent-decodes each segment.  An operation's
 * arguments are merged from query, JSON body and path (http_build_args), on
 * the MHD thread that serves the request.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../runtime/err.h"
#include "../runtime/json.h"
#include "../runtime/ops.h"
#include "http_int.h"

static int
route_add(struct sbx_http *h, const char *method, const char *path, int kind,
          const struct sbx_op_def *op, bool canonical)
{
    h->routes = sbx_xrealloc(h->routes, (h->nroutes + 1) * sizeof(*h->routes));
    struct route *r = &h->routes[h->nroutes];
    memset(r, 0, sizeof(*r));
    r->method = method;
    r->kind = kind;
    r->op = op;
    r->canonical = canonical;
    r->path = sbx_xstrdup(path);
    char *copy = sbx_xstrdup(path), *save = NULL;
    for (char *s = strtok_r(copy, "/", &save); s; s = strtok_r(NULL, "/", &save)) {
        if (r->nseg == MAX_SEGS) {
            free(copy);
            return -EINVAL;
        }
        r->seg[r->nseg++] = sbx_xstrdup(s);
    }
    free(copy);
    h->nroutes++;
    return 0;
}

void
http_routes_free(struct sbx_http *h)
{
    for (size_t i = 0; i < h->nroutes; i++) {
        for (int j = 0; j < h->routes[i].nseg; j++)
            free(h->routes[i].seg[j]);
        free(h->routes[i].path);
    }
    free(h->routes);
}

/* Build the route list: own routes first, then every op's canonical route
 * and its aliases. */
int
http_routes_build(struct sbx_http *h)
{
    int rc = 0;
    rc |= route_add(h, "GET", "/v1/health", R_HEALTH, NULL, false);
    rc |= route_add(h, "GET", "/v1/openapi.json", R_OPENAPI, NULL, false);
    rc |= route_add(h, "GET", "/metrics", R_METRICS, NULL, false);
    rc |= route_add(h, "GET", "/v1/sandboxes/{sandbox}/streams/{streamId}", R_STREAM, NULL, false);
    rc |= route_add(h, "GET", "/v1/sandboxes/{sandbox}/files/{path*}", R_FILE_GET, NULL, false);
    rc |= route_add(h, "PUT", "/v1/sandboxes/{sandbox}/files/{path*}", R_FILE_PUT, NULL, false);
    rc |= route_add(h, "GET", "/v1/sandboxes/{sandbox}/terminal", R_TERMINAL, NULL, false);
    rc |= route_add(h, "POST", "/v1/sandboxes/{sandbox}/url-token", R_URL_TOKEN, NULL, false);
    for (const struct sbx_op_def *d = sbx_ops; d->name; d++) {
        char path[160];
        /* Shard-to-shard operations and the front's own helpers are not
         * routes (nor in /v1/openapi.json, which lists the routes). */
        if (d->flags & (SBX_OP_INTERNAL | SBX_OP_FRONT))
            continue;
        if (d->flags & (SBX_OP_GLOBAL | SBX_OP_NODE))
            snprintf(path, sizeof(path), "/v1/%s", d->name);
        else
            snprintf(path, sizeof(path), "/v1/sandboxes/{sandbox}/%s", d->name);
        rc |= route_add(h, "POST", path, R_OP, d, true);
        if (!d->http)
            continue;
        char *aliases = sbx_xstrdup(d->http), *save = NULL;
        for (char *a = strtok_r(aliases, "|", &save); a; a = strtok_r(NULL, "|", &save)) {
            char *sp = strchr(a, ' ');
            if (!sp) {
                rc = -EINVAL;
                continue;
            }
            *sp = 0;
            const char *m = !strcmp(a, "GET")      ? "GET"
                            : !strcmp(a, "PUT")    ? "PUT"
                            : !strcmp(a, "DELETE") ? "DELETE"
                            : !strcmp(a, "POST")   ? "POST"
                                                   : NULL;
            if (!m) {
                rc = -EINVAL;
                continue;
            }
            rc |= route_add(h, m, sp + 1, R_OP, d, false);
        }
        free(aliases);
    }
    return rc ? -EINVAL : 0;
}

static int
hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* Percent-decode s in place (RFC 3986 §2.1); with plus, '+' is a space
 * (query strings, HTML form encoding).  Returns false on a malformed escape
 * (anything but '%' and two hex digits) or a decoded NUL. */
bool
http_pct_decode(char *s, bool plus)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '%') {
            int hi = hex_digit(r[1]);
            int lo = hi >= 0 ? hex_digit(r[2]) : -1; /* r[2] exists: r[1] is not NUL */
            if (hi < 0 || lo < 0 || (hi == 0 && lo == 0))
                return false;
            *w++ = (char)(hi * 16 + lo);
            r += 2;
        } else {
            *w++ = plus && *r == '+' ? ' ' : *r;
        }
    }
    *w = 0;
    return true;
}

/* MHD's unescaper: none.  URLs reach the handler as sent, so a preview URL
 * is forwarded byte for byte and API paths are split before decoding (an
 * encoded '/' stays inside its segment). */
size_t
http_unescape_none(void *cls, struct MHD_Connection *c, char *s)
{
    (void)cls;
    (void)c;
    return strlen(s);
}

/* Match method + path; fill params (a JSON object of path arguments) and
 * the sandbox ID.  Returns the route, NULL (no path matches: 404), or
 * &http_method_mismatch when the path exists with other methods (405).
 * *bad_param: 1 an {int} parameter is not one, 2 a malformed escape, an
 * escaped NUL, or a parameter that is not UTF-8 (JSON cannot carry it, and
 * a dropped path parameter would let a body or query argument of the same
 * name stand in for it). */
const struct route http_method_mismatch = {0};

/* http_route_match also fills allow[] ("GET, POST", for a 405's Allow header)
 * with the methods the path is served for.  HEAD matches a GET route
 * (RFC 9110 §9.3.2: the same answer without its body; MHD drops it). */
const struct route *
http_route_match(struct sbx_http *h, const char *method, const char *url, json_t *params,
                 char *sandbox, size_t sblen, int *bad_param, char *allow, size_t allowlen)
{
    *bad_param = 0;
    allow[0] = '\0';
    if (!strcmp(method, "HEAD"))
        method = "GET";
    char *copy = sbx_xstrdup(url), *save = NULL;
    char *segs[MAX_SEGS + 1];
    int n = 0;
    char *rest_at[MAX_SEGS + 1];
    for (char *s = strtok_r(copy, "/", &save); s && n <= MAX_SEGS; s = strtok_r(NULL, "/", &save)) {
        rest_at[n] = (char *)url + (s - copy);
        segs[n++] = s;
    }
    for (int i = 0; i < n; i++)
        if (!http_pct_decode(segs[i], false))
            *bad_param = 2;
    const struct route *found = NULL;
    bool path_exists = false;
    for (size_t i = 0; i < h->nroutes && !found; i++) {
        const struct route *r = &h->routes[i];
        bool rest = r->nseg > 0 && strstr(r->seg[r->nseg - 1], "*}") != NULL;
        if (rest ? n < r->nseg : n != r->nseg)
            continue;
        bool ok = true;
        for (int j = 0; j < r->nseg && ok; j++)
            if (r->seg[j][0] != '{' && strcmp(r->seg[j], segs[j]))
                ok = false;
        if (!ok)
            continue;
        path_exists = true;
        if (strcmp(r->method, method)) {
            if (!strstr(allow, r->method)) {
                size_t al = strlen(allow);
                snprintf(allow + al, allowlen - al, "%s%s", al ? ", " : "", r->method);
            }
            continue;
        }
        found = r;
        for (int j = 0; j < r->nseg; j++) {
            if (r->seg[j][0] != '{')
                continue;
            char name[64];
            snprintf(name, sizeof(name), "%s", r->seg[j] + 1);
            char *end = strchr(name, '}');
            if (end)
                *end = 0;
            char *colon = strchr(name, ':');
            char *star = strchr(name, '*');
            if (star) {
                *star = 0;
                /* The rest of the URL, slashes included, as an absolute path
                 * (whole: the agent judges its length). */
                char *path = sbx_xmalloc(strlen(rest_at[j]) + 2);
                path[0] = '/';
                strcpy(path + 1, rest_at[j]);
                json_t *v = http_pct_decode(path, false) ? json_string(path) : NULL;
                if (!v)
                    *bad_param = 2;
                json_object_set_new(params, name, v);
                free(path);
                break;
            }
            if (colon) {
                *colon = 0;
                char *e;
                errno = 0;
                long long v = strtoll(segs[j], &e, 10);
                if ((*e || errno) && !*bad_param)
                    *bad_param = 1; /* a malformed escape (2) is the first thing to say */
                json_object_set_new(params, name, json_integer(v));
            } else if (!strcmp(name, "sandbox")) {
                snprintf(sandbox, sblen, "%s", segs[j]);
            } else {
                json_t *v = json_string(segs[j]);
                if (!v)
                    *bad_param = 2;
                json_object_set_new(params, name, v);
            }
        }
    }
    free(copy);
    if (!found && path_exists)
        return &http_method_mismatch;
    return found;
}

/* ------------------------------------------------------------------------------ */
/* Arguments: query, body and path into the operation's arguments. */

static bool
json_utf8_ok(const char *v)
{
    json_t *j = json_string(v);
    bool ok = j != NULL;
    json_decref(j);
    return ok;
}

enum MHD_Result
http_query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    json_t *params = cls;
    (void)kind;
    char *k = sbx_xstrdup(key), *v = sbx_xstrdup(value ? value : "");
    if (http_pct_decode(k, true) && http_pct_decode(v, true) && strcmp(k, "access_token") &&
        !json_object_get(params, k) && json_utf8_ok(v))
        json_object_set_new(params, k, json_string(v));
    free(k);
    free(v);
    return MHD_YES;
}

/* The op's arguments: query arguments, then the JSON body object over them,
 * then path arguments over both (the route the client chose). */
int
http_build_args(struct hreq *hr, char **args, size_t *alen, sbx_err_t *err)
{
    json_t *obj;
    if (hr->body.len) {
        json_error_t je;
        obj = json_loadb(hr->body.p, hr->body.len, JSON_REJECT_DUPLICATES, &je);
        if (!obj)
            return sbx_err_make(err, SBX_E_MALFORMED,
                                "the body is not valid JSON: %s (line %d, column %d)", je.text,
                                je.line, je.column);
        if (!json_is_object(obj)) {
            json_decref(obj);
            return sbx_err_make(err, SBX_E_MALFORMED,
                                "the body must be a JSON object of the operation's arguments");
        }
    } else {
        obj = json_object();
    }
    json_object_update_missing(obj, hr->query);
    json_object_update(obj, hr->params);
    sbx_enc e;
    sbx_enc_init(&e);
    int rc = sbx_json_to_msgpack(obj, &e);
    /* A command's own timeout extends the request's deadline (capped: the
     * gateway refuses a timeout past SBX_WIRE_MAX_DURATION_MS anyway, and
     * the sum must not overflow). */
    json_t *t = json_object_get(obj, "timeout");
    if (json_is_integer(t) && json_integer_value(t) > 0)
        hr->timeout_ms = SBX_MAX(
            hr->timeout_ms, SBX_MIN(json_integer_value(t), SBX_WIRE_MAX_DURATION_MS) + 30000);
    json_decref(obj);
    if (rc) {
        sbx_enc_free(&e);
        return sbx_err_make(err, rc, "the body holds a value the protocol cannot carry");
    }
    if (sbx_enc_finish(&e, args, alen) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "cannot encode the arguments");
    return 0;
}
