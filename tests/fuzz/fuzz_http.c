/*
 * fuzz_http.c — the HTTP front's parsers of request input (gateway/http_route.c,
 * http_auth.c, http_sse.c, through gateway/http_int.h), on the real route
 * table (http_routes_build over runtime/ops.c):
 *
 *  - http_pct_decode: percent-decoding of path segments, query keys and
 *    values (RFC 3986 §2.1; '+' as a space in queries);
 *  - http_route_match: method + path (MHD hands it undecoded: the front installs
 *    an identity unescaper) to a route, its path parameters and the
 *    sandbox ID;
 *  - http_query_arg: query arguments into an operation's arguments;
 *  - http_key_ok: the bearer key check;
 *  - http_sse_result: stream.read results, whose data bytes are a sandbox's
 *    output, into Server-Sent Events.
 *
 * Input: byte 0 picks the parser, byte 1 is a flag (plus / method / base64),
 * the rest is the parser's input: a string; a path; "key=value" lines; a
 * msgpack array of result maps; keys, a blank line, the presented key.
 *
 * Properties:
 *  - http_pct_decode agrees with a strict decoder: it accepts exactly the
 *    strings whose escapes are '%' and two hex digits and decode to no NUL,
 *    and yields the same bytes;
 *  - http_route_match returns a route of the table, none, or "method mismatch";
 *    a route's method is the request's, its literal segments equal the
 *    decoded path's; a malformed escape is flagged; with nothing flagged,
 *    every parameter of the route is present (none dropped), and equals its
 *    decoded segment — the sandbox ID exactly whenever it is short enough to
 *    be valid, {path*} the decoded rest of the path byte for byte (dot
 *    segments included: the agent resolves them inside the sandbox) — and
 *    no other parameter is set;
 *  - http_query_arg: the first well-formed occurrence of a key wins, keys and
 *    values are the decoded ones, access_token never becomes an argument;
 *  - http_key_ok(k) ⇔ k equals a configured key;
 *  - the SSE output is well-framed whatever the result holds: blocks of
 *    `id:`/`event:`/`data:` lines or a comment, no CR or NUL anywhere, event
 *    names of [A-Za-z0-9_.-], data lines that are JSON objects; output
 *    bytes come out as the sanitized UTF-8 of what went in, a sequence split
 *    between events kept whole (at most 3 bytes carried); with base64 they
 *    decode to the bytes.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../../gateway/http_int.h"
#include "../../runtime/json.h"
#include "../../runtime/util.h"

#include <ctype.h>
#include <msgpack.h>

#include "fuzz.h"

static struct sbx_http H;

static void
setup(void)
{
    if (H.nroutes)
        return;
    if (http_routes_build(&H) != 0)
        abort();
}

/* ------------------------------------------------------------------------------ */
/* A strict percent-decoder (the reference). */


/* The strict decoder of fuzz.h. */
static bool
ref_decode(const char *s, size_t n, bool plus, char *out)
{
    return fuzz_ref_pct_decode(s, n, plus, out);
}

static bool
utf8_ok(const char *s)
{
    json_t *j = json_string(s); /* jansson checks UTF-8 */
    json_decref(j);
    return j != NULL;
}

static void
fuzz_decode(const char *s, bool plus)
{
    size_t n = strlen(s);
    char *got = sbx_xstrdup(s), *want = sbx_xmalloc(n + 1);
    bool ok = http_pct_decode(got, plus), rok = ref_decode(s, n, plus, want);
    FUZZ_CHECK(ok == rok, "'%s' %s by the decoder, %s by the strict one", s,
               ok ? "accepted" : "refused", rok ? "accepted" : "refused");
    if (ok)
        FUZZ_CHECK(!strcmp(got, want), "'%s' decoded as '%s', want '%s'", s, got, want);
    free(got);
    free(want);
}

/* ------------------------------------------------------------------------------ */
/* Routes. */

struct rseg {
    size_t off, len; /* a non-empty segment of the raw URL */
};

static void
fuzz_route(const char *method, const char *url)
{
    size_t ul = strlen(url);
    struct rseg *sg = sbx_xcalloc(ul / 2 + 2, sizeof(*sg));
    size_t ns = 0;
    for (size_t i = 0; i < ul;) {
        if (url[i] == '/') {
            i++;
            continue;
        }
        size_t j = i;
        while (j < ul && url[j] != '/')
            j++;
        sg[ns].off = i;
        sg[ns++].len = j - i;
        i = j;
    }
    /* The strict decoding of each segment (NULL: malformed). */
    char **dec = sbx_xcalloc(ns + 1, sizeof(*dec));
    bool any_bad = false;
    for (size_t i = 0; i < ns; i++) {
        dec[i] = sbx_xmalloc(sg[i].len + 1);
        if (!ref_decode(url + sg[i].off, sg[i].len, false, dec[i])) {
            free(dec[i]);
            dec[i] = NULL;
            if (i <= MAX_SEGS) /* http_route_match looks at MAX_SEGS + 1 of them */
                any_bad = true;
        }
    }

    json_t *params = json_object();
    char sb[SBX_ID_MAX + 2] = "";
    int bad = -1;
    char allow[64];
    const struct route *rt =
        http_route_match(&H, method, url, params, sb, sizeof(sb), &bad, allow, sizeof(allow));
    FUZZ_CHECK(bad >= 0 && bad <= 2, "bad_param %d", bad);
    FUZZ_CHECK(memchr(allow, 0, sizeof(allow)), "unterminated Allow list");
    if (rt == &http_method_mismatch)
        FUZZ_CHECK(allow[0], "a method mismatch with no allowed method");
    if (any_bad)
        FUZZ_CHECK(bad == 2, "a malformed escape in '%s' not flagged (%d)", url, bad);
    FUZZ_CHECK(memchr(sb, 0, sizeof(sb)), "unterminated sandbox ID");
    if (!rt || rt == &http_method_mismatch) {
        FUZZ_CHECK(json_object_size(params) == 0, "parameters without a route");
        FUZZ_CHECK(!sb[0], "a sandbox ID without a route");
        goto out;
    }
    FUZZ_CHECK(rt >= H.routes && rt < H.routes + H.nroutes, "not a route of the table");
    /* HEAD is served by GET routes */
    FUZZ_CHECK(!strcmp(rt->method, strcmp(method, "HEAD") ? method : "GET"),
               "%s matched a %s route", method, rt->method);
    bool rest = rt->nseg > 0 && strstr(rt->seg[rt->nseg - 1], "*}");
    FUZZ_CHECK(rest ? ns >= (size_t)rt->nseg : ns == (size_t)rt->nseg,
               "%zu segments matched %s (%d)", ns, rt->path, rt->nseg);
    size_t nparams = 0;
    bool why2 = any_bad; /* a reason for bad_param 2: an escape, or a parameter not UTF-8 */
    for (int j = 0; j < rt->nseg; j++) {
        const char *tpl = rt->seg[j];
        if (tpl[0] != '{') {
            if (dec[j])
                FUZZ_CHECK(!strcmp(tpl, dec[j]), "segment '%s' matched '%s'", dec[j], tpl);
            continue;
        }
        char name[64];
        snprintf(name, sizeof(name), "%s", tpl + 1);
        name[strcspn(name, ":*}")] = 0;
        json_t *v = json_object_get(params, name);
        if (strchr(tpl, '*')) {
            /* The rest of the raw URL from this segment on, decoded. */
            const char *r = url + sg[j].off;
            size_t rl = ul - sg[j].off;
            char *want = sbx_xmalloc(rl + 2);
            want[0] = '/';
            bool ok = ref_decode(r, rl, false, want + 1);
            nparams++;
            if (!ok)
                FUZZ_CHECK(bad == 2, "a malformed escape in the rest '%s' not flagged", r);
            why2 |= !ok || !utf8_ok(want);
            if (!bad) {
                FUZZ_CHECK(json_is_string(v), "{%s} dropped from %s", name, url);
                FUZZ_CHECK(!strcmp(json_string_value(v), want),
                           "{%s} is '%.80s…' (%zu bytes), want '%.80s…' (%zu bytes)", name,
                           json_string_value(v), strlen(json_string_value(v)), want,
                           strlen(want));
            }
            free(want);
            break;
        }
        if (!strcmp(name, "sandbox")) {
            if (!bad && strlen(dec[j]) < sizeof(sb))
                FUZZ_CHECK(!strcmp(sb, dec[j]), "sandbox '%s', want '%s'", sb, dec[j]);
            continue;
        }
        nparams++;
        why2 |= !dec[j] || (!strchr(tpl, ':') && !utf8_ok(dec[j]));
        if (bad)
            continue;
        if (strchr(tpl, ':')) {
            FUZZ_CHECK(json_is_integer(v), "{%s} is not an integer", name);
            FUZZ_CHECK(json_integer_value(v) == strtoll(dec[j], NULL, 10), "{%s} changed",
                       name);
        } else {
            FUZZ_CHECK(json_is_string(v), "{%s} = '%s' dropped from %s", name, dec[j], url);
            FUZZ_CHECK(!strcmp(json_string_value(v), dec[j]), "{%s} is '%s', want '%s'", name,
                       json_string_value(v), dec[j]);
        }
    }
    if (bad == 2)
        FUZZ_CHECK(why2, "%.200s flagged malformed", url);
    if (!bad)
        FUZZ_CHECK(json_object_size(params) == nparams, "%zu parameters set, the route has %zu",
                   json_object_size(params), nparams);
out:
    json_decref(params);
    for (size_t i = 0; i < ns; i++)
        free(dec[i]);
    free(dec);
    free(sg);
}

/* ------------------------------------------------------------------------------ */
/* Query arguments: "key=value" or "key" lines. */

static void
fuzz_query(const char *text)
{
    char *copy = sbx_xstrdup(text), *save = NULL;
    json_t *params = json_object(), *want = json_object();
    for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *eq = strchr(line, '=');
        const char *value = NULL;
        if (eq) {
            *eq = 0;
            value = eq + 1;
        }
        http_query_arg(params, MHD_GET_ARGUMENT_KIND, line, value);
        size_t kl = strlen(line), vl = value ? strlen(value) : 0;
        char *k = sbx_xmalloc(kl + 1), *v = sbx_xmalloc(vl + 1);
        if (ref_decode(line, kl, true, k) && ref_decode(value ? value : "", vl, true, v) &&
            strcmp(k, "access_token") && utf8_ok(k) && utf8_ok(v) && !json_object_get(want, k))
            json_object_set_new(want, k, json_string(v));
        free(k);
        free(v);
    }
    FUZZ_CHECK(!json_object_get(params, "access_token"), "access_token became an argument");
    FUZZ_CHECK(json_equal(params, want), "query arguments differ from the strict parse");
    json_decref(params);
    json_decref(want);
    free(copy);
}

/* ------------------------------------------------------------------------------ */
/* Bearer keys: key lines, a blank line, the presented key. */

static void
fuzz_key(const char *text)
{
    const char *sep = strstr(text, "\n\n");
    if (!sep)
        return;
    char *keys = sbx_xstrndup(text, (size_t)(sep - text)), *save = NULL;
    const char *presented = sep + 2;
    char *list[9];
    int n = 0;
    bool want = false;
    for (char *k = strtok_r(keys, "\n", &save); k && n < 8; k = strtok_r(NULL, "\n", &save)) {
        list[n++] = k;
        want |= !strcmp(k, presented);
    }
    list[n] = NULL;
    if (!n) {
        free(keys);
        return;
    }
    H.keys = list;
    bool got = http_key_ok(&H, presented);
    H.keys = NULL;
    FUZZ_CHECK(got == want, "http_key_ok('%s') = %d", presented, got);
    free(keys);
}

/* ------------------------------------------------------------------------------ */
/* Server-Sent Events. */

struct ev_ref {
    int which;   /* 0 stdout/output, 1 stderr, -1 other */
    bool bin;    /* its data is str/bin: the front rewrites it */
    sbx_str data;
};

static bool
name_ok(const char *p, size_t n)
{
    if (!n || n > 64)
        return false;
    for (size_t i = 0; i < n; i++)
        if (!(isalnum((unsigned char)p[i]) || p[i] == '_' || p[i] == '.' || p[i] == '-'))
            return false;
    return true;
}

/* Check one block of the SSE output (without its blank line); returns the
 * event's JSON (NULL for a comment or a gap). */
static json_t *
sse_block(const char *b, size_t n, bool *is_event, char *name, size_t namelen)
{
    *is_event = false;
    char *s = sbx_xstrndup(b, n);
    json_t *j = NULL;
    if (!strcmp(s, ": ping")) {
        free(s);
        return NULL;
    }
    char *l1 = s, *l2 = strchr(l1, '\n');
    FUZZ_CHECK(l2, "a one-line block '%s'", s);
    *l2++ = 0;
    if (!strcmp(l1, "event: gap")) {
        static const char gap[] = "data: {\"type\":\"gap\",\"missed\":";
        FUZZ_CHECK(!strncmp(l2, gap, strlen(gap)), "gap '%s'", l2);
        free(s);
        return NULL;
    }
    char *l3 = strchr(l2, '\n');
    FUZZ_CHECK(l3, "a two-line block '%s'", b);
    *l3++ = 0;
    FUZZ_CHECK(!strchr(l3, '\n'), "more than three lines in '%s'", b);
    char *e;
    FUZZ_CHECK(!strncmp(l1, "id: ", 4), "first line '%s'", l1);
    errno = 0;
    strtoll(l1 + 4, &e, 10);
    FUZZ_CHECK(e != l1 + 4 && !*e && !errno, "id '%s'", l1);
    FUZZ_CHECK(!strncmp(l2, "event: ", 7) && name_ok(l2 + 7, strlen(l2 + 7)), "event line '%s'",
               l2);
    FUZZ_CHECK(!strncmp(l3, "data: ", 6), "third line '%s'", l3);
    json_error_t je;
    j = json_loads(l3 + 6, JSON_ALLOW_NUL, &je);
    /* RFC 8259 allows \u0000 in keys, jansson cannot load it: the event is
     * not checked further (NULL with *is_event). */
    FUZZ_CHECK(json_is_object(j) || (!j && strstr(je.text, "NUL byte in object key")),
               "data is not a JSON object: %s (%s)", je.text, l3);
    snprintf(name, namelen, "%s", l2 + 7);
    *is_event = true;
    free(s);
    return j;
}

static void
fuzz_sse(const char *buf, size_t n, bool b64)
{
    if (sbx_wire_check(buf, n, &sbx_wire_limits_reply) != 0)
        return;
    msgpack_unpacked u;
    size_t off = 0;
    msgpack_unpacked_init(&u);
    if (msgpack_unpack_next(&u, buf, n, &off) != MSGPACK_UNPACK_SUCCESS) {
        msgpack_unpacked_destroy(&u);
        return;
    }
    const msgpack_object *res = u.data.type == MSGPACK_OBJECT_ARRAY ? u.data.via.array.ptr : &u.data;
    uint32_t nres = u.data.type == MSGPACK_OBJECT_ARRAY ? u.data.via.array.size : 1;
    struct hreq *hr = hreq_new(&H, NULL);
    hr->b64 = b64;
    /* What the front must make of the events, in order. */
    struct ev_ref *refs = NULL;
    size_t nrefs = 0;
    for (uint32_t i = 0; i < nres; i++) {
        if (res[i].type != MSGPACK_OBJECT_MAP)
            continue;
        http_sse_result(hr, &res[i]);
        const msgpack_object *evs = NULL;
        if (sbx_wire_get_array(&res[i], "events", &evs) != 0)
            continue;
        for (uint32_t k = 0; k < evs->via.array.size; k++) {
            const msgpack_object *ev = &evs->via.array.ptr[k];
            json_t *j = ev->type == MSGPACK_OBJECT_MAP ? sbx_json_from_msgpack(ev) : NULL;
            if (!j)
                continue; /* not an event the front can render: dropped */
            json_decref(j);
            struct ev_ref r = {-1, false, {"", 0}};
            sbx_str type;
            if (sbx_wire_get_str(ev, "type", &type) == 0)
                r.which = sbx_str_eq(type, "stdout") || sbx_str_eq(type, "output") ? 0
                          : sbx_str_eq(type, "stderr")                            ? 1
                                                                                  : -1;
            r.bin = r.which >= 0 && sbx_wire_get_bin(ev, "data", &r.data) == 0;
            refs = sbx_xrealloc(refs, (nrefs + 1) * sizeof(*refs));
            refs[nrefs++] = r;
        }
    }
    FUZZ_CHECK(hr->ncarry[0] <= 3 && hr->ncarry[1] <= 3, "carried %zu/%zu bytes", hr->ncarry[0],
               hr->ncarry[1]);

    /* Framing. */
    const char *o = hr->out.p ? hr->out.p : "";
    size_t ol = hr->out.len;
    FUZZ_CHECK(!memchr(o, '\r', ol) && !memchr(o, '\0', ol), "CR or NUL in the SSE output");
    FUZZ_CHECK(ol == 0 || (ol >= 2 && !memcmp(o + ol - 2, "\n\n", 2)), "unterminated block");
    sbx_buf text[2];
    sbx_buf_init(&text[0]);
    sbx_buf_init(&text[1]);
    size_t ei = 0;
    bool unchecked = false; /* an event whose data the checker cannot read */
    for (size_t p = 0; p < ol;) {
        const char *end = memmem(o + p, ol - p, "\n\n", 2);
        bool is_event;
        char name[80] = "";
        json_t *j = sse_block(o + p, (size_t)(end - (o + p)), &is_event, name, sizeof(name));
        p = (size_t)(end - o) + 2;
        if (!is_event)
            continue;
        FUZZ_CHECK(ei < nrefs, "more events out than in");
        struct ev_ref *r = &refs[ei++];
        if (r->which >= 0) {
            FUZZ_CHECK(!strcmp(name, r->which ? "stderr" : "stdout") || !strcmp(name, "output"),
                       "an output event named '%s'", name);
        }
        if (!j) {
            unchecked = true;
            continue;
        }
        if (r->bin) {
            json_t *d = json_object_get(j, "data");
            FUZZ_CHECK(json_is_string(d), "output data is not a string");
            if (b64) {
                char *raw;
                size_t rl;
                FUZZ_CHECK(json_is_string(json_object_get(j, "encoding")), "no encoding");
                FUZZ_CHECK(sbx_base64_decode(json_string_value(d), json_string_length(d), &raw,
                                             &rl) == 0,
                           "base64 data does not decode");
                FUZZ_CHECK(rl == r->data.n && !memcmp(raw, r->data.p, rl),
                           "base64 data is not the bytes");
                free(raw);
            } else {
                sbx_buf_append(&text[r->which], json_string_value(d), json_string_length(d));
            }
        }
        json_decref(j);
    }
    FUZZ_CHECK(ei == nrefs, "%zu events in, %zu out", nrefs, ei);
    if (!b64 && !unchecked) {
        /* Per stream: what went out plus what is still carried is the
         * sanitized UTF-8 of every byte that came in. */
        for (int w = 0; w < 2; w++) {
            sbx_buf in;
            sbx_buf_init(&in);
            for (size_t i = 0; i < nrefs; i++)
                if (refs[i].bin && refs[i].which == w)
                    sbx_buf_append(&in, refs[i].data.p, refs[i].data.n);
            size_t wl, cl;
            char *want = sbx_utf8_sanitize(in.p ? in.p : "", in.len, &wl);
            char *carry = sbx_utf8_sanitize(hr->carry[w], hr->ncarry[w], &cl);
            sbx_buf_append(&text[w], carry, cl);
            FUZZ_CHECK(text[w].len == wl && (!wl || !memcmp(text[w].p, want, wl)),
                       "stream %d: %zu bytes out, want %zu", w, text[w].len, wl);
            free(want);
            free(carry);
            sbx_buf_free(&in);
        }
    }
    sbx_buf_free(&text[0]);
    sbx_buf_free(&text[1]);
    free(refs);
    hreq_free(hr);
    msgpack_unpacked_destroy(&u);
}

/* ------------------------------------------------------------------------------ */

static const char *const methods[] = {"GET", "POST", "PUT", "DELETE", "HEAD", "PATCH"};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > (64u << 10))
        return 0;
    setup();
    char *s = fuzz_cstr(data + 2, size - 2); /* MHD's strings end at a NUL */
    switch (data[0] % 5) {
    case 0: fuzz_decode(s, data[1] & 1); break;
    case 1: fuzz_route(methods[data[1] % SBX_ARRAY_LEN(methods)], s); break;
    case 2: fuzz_query(s); break;
    case 3: fuzz_key(s); break;
    default: {
        char *buf = fuzz_copy(data + 2, size - 2);
        fuzz_sse(buf, size - 2, data[1] & 1);
        free(buf);
        break;
    }
    }
    free(s);
    return 0;
}
