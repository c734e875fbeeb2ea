/*
 * test_tenants.c — tenants that cannot reach each other (issue 16, the
 * Tenants bullet; the model is docs/security.md §6).
 *
 * Each test starts its own `sbxd dev` with an API key file (the shared
 * daemon of itest_main is keyless), makes tenants a and b with the admin
 * key, and gives each a key.  Tenant b keeps a secret in its sandbox
 * "victim"; tenant a then tries to reach it over nng (the C library), over
 * HTTP (routes, SSE) and with a randomized client, and each test checks
 * what a user would: b's file and state are unchanged, no reply to a holds
 * b's secret or b's sandbox, and a's refusals look exactly like those for
 * an ID nobody has.  On the code before tenants, a's key does not exist
 * (or, over nng, no key is needed) and a reads b's file: every test fails.
 */
#include <criterion/criterion.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/id.h"
#include "../../runtime/ops.h"
#include "../../runtime/util.h"
#include "../support/httpc.h"
#include "../support/wsclient.h"
#include "../support/sdk.h"

#define B_SECRET "B-SECRET-7f3a91"
#define A_SECRET "A-SECRET-c0de42"

struct tenv {
    struct testd d;
    char keyfile[64];
    char admin[80];
    char ka[80], kb[80];
    char *http; /* http://host:port */
};

/* A client whose requests carry `key` (the library reads $SBX_API_KEY at open). */
static sbx_client *
keyed(const struct tenv *e, const char *key)
{
    if (key)
        setenv("SBX_API_KEY", key, 1);
    else
        unsetenv("SBX_API_KEY");
    sbx_client *c = tc_client(e->d.url, 60000);
    unsetenv("SBX_API_KEY");
    return c;
}

static void
make_key(sbx_client *admin, const char *tenant, char out[80])
{
    tcall t = tc_call(admin, "key.create", NULL, json_pack("{s:s}", "tenant", tenant), 0);
    tc_ok(t, "key.create");
    const char *k = jstr(t.res, "key");
    cr_assert(k && strlen(k) < 80 && !strncmp(k, "sbx_", 4), "key.create gave %s",
              k ? k : "-");
    snprintf(out, 80, "%s", k);
    tc_free(&t);
}

/* What a test started, for the suite's fini when an assertion ends the
 * test before it stops it (a copy: the test's own struct is on a stack that
 * is gone by then). */
static struct tenv live_env;
static bool live_on;

/* Start a keyed daemon, tenants a and b (a's quotas as given), one key each. */
static void
tenv_start(struct tenv *e, int64_t a_max, int64_t a_rate)
{
    memset(e, 0, sizeof(*e));
    snprintf(e->keyfile, sizeof(e->keyfile), "/tmp/sbx-tenkeys-XXXXXX");
    int fd = mkstemp(e->keyfile);
    cr_assert(fd >= 0);
    char rid[37];
    sbx_request_id(rid);
    snprintf(e->admin, sizeof(e->admin), "admin-%s", rid);
    cr_assert(dprintf(fd, "# test admin key\n%s\n", e->admin) > 0);
    close(fd);
    const char *const extra[] = {"--api-keys", e->keyfile, TESTD_SMALL, NULL};
    setenv("SBX_API_KEY", e->admin, 1); /* testd_start's readiness check calls the gateway */
    int rc = testd_start(&e->d, 2, extra);
    unsetenv("SBX_API_KEY");
    if (rc == 0) {
        live_env = *e;
        live_on = true;
    } else {
        unlink(e->keyfile);
    }
    cr_assert_eq(rc, 0, "cannot start sbxd with --api-keys");
    char path[512], *text = NULL;
    size_t n;
    snprintf(path, sizeof(path), "%s/http.addr", e->d.dir);
    cr_assert_eq(sbx_fs_read(path, 256, &text, &n), 0, "no %s", path);
    text[strcspn(text, "\n")] = 0;
    e->http = hfmt("http://%s", text);
    free(text);
    sbx_client *admin = keyed(e, e->admin);
    tcall t = tc_call(admin, "tenant.create", NULL,
                      json_pack("{s:s,s:I,s:I}", "tenant", "a", "maxSandboxes", (json_int_t)a_max,
                                "createsPerSecond", (json_int_t)a_rate),
                      0);
    tc_ok(t, "tenant.create a");
    tc_free(&t);
    t = tc_call(admin, "tenant.create", NULL, json_pack("{s:s}", "tenant", "b"), 0);
    tc_ok(t, "tenant.create b");
    tc_free(&t);
    make_key(admin, "a", e->ka);
    make_key(admin, "b", e->kb);
    sbx_client_close(admin);
}

static void
tenv_stop(struct tenv *e)
{
    testd_stop(&e->d);
    unlink(e->keyfile);
    free(e->http);
    live_on = false;
}

/* The suite's fini: stops what a test that failed before its *_stop left
 * (its daemon by pid, its key file, a second gateway). */
static void
fini(void)
{
    if (live_on) {
        testd_stop(&live_env.d);
        unlink(live_env.keyfile);
        live_on = false;
    }
}

TestSuite(tenants, .fini = fini);

/* b's victim: a secret file and labels; returns b's client. */
static sbx_client *
plant_victim(struct tenv *e)
{
    sbx_client *b = keyed(e, e->kb);
    cr_assert_str_eq(tsh_out(b, "victim", "printf " B_SECRET " > /workspace/secret && "
                                          "cat /workspace/secret"),
                     B_SECRET);
    tcall t = tc_call(b, "sandbox.labels", "victim",
                      json_pack("{s:{s:s}}", "labels", "owner", "b"), 0);
    tc_ok(t, "sandbox.labels");
    tc_free(&t);
    return b;
}

/* b's victim is as planted: same file, labels, generation `gen` (-1: any). */
static long long
check_victim(sbx_client *b, long long gen)
{
    tcall t = tc_call(b, "file.read", "victim", json_pack("{s:s}", "path", "/workspace/secret"),
                      0);
    tc_ok(t, "file.read by b");
    cr_assert_str_eq(jstr(t.res, "content"), B_SECRET, "b's file changed");
    tc_free(&t);
    t = tc_call(b, "sandbox.labels", "victim", NULL, 0);
    tc_ok(t, "sandbox.labels read by b");
    cr_assert_str_eq(jstr(t.res, "labels.owner"), "b", "b's labels changed");
    cr_assert_eq(json_object_size(jget(t.res, "labels")), 1, "b's labels changed");
    tc_free(&t);
    t = tc_call(b, "status", "victim", NULL, 0);
    tc_ok(t, "status by b");
    long long g = jint(t.res, "sandbox.generation");
    if (gen >= 0)
        cr_assert_eq(g, gen, "b's sandbox was restarted or replaced (generation %lld → %lld)",
                     gen, g);
    tc_free(&t);
    return g;
}

/* The IDs of `list` for c. */
static char *
list_ids(sbx_client *c)
{
    tcall t = tc_call(c, "list", NULL, NULL, 0);
    tc_ok(t, "list");
    sbx_buf b;
    sbx_buf_init(&b);
    json_t *arr = jget(t.res, "sandboxes");
    cr_assert(json_is_array(arr));
    cr_assert_eq((long long)json_array_size(arr), jint(t.res, "count"), "count");
    size_t i;
    json_t *it;
    json_array_foreach(arr, i, it) {
        sbx_buf_appendf(&b, "%s,", json_string_value(json_object_get(it, "id")));
    }
    sbx_buf_append(&b, "", 1);
    tc_free(&t);
    return b.p;
}

/* An error's message with every `id` replaced by "ID" (to compare two refusals). */
static char *
generic(const char *msg, const char *id)
{
    sbx_buf b;
    sbx_buf_init(&b);
    size_t il = strlen(id);
    for (const char *p = msg; *p;) {
        if (!strncmp(p, id, il)) {
            sbx_buf_append(&b, "ID", 2);
            p += il;
        } else {
            sbx_buf_append(&b, p++, 1);
        }
    }
    sbx_buf_append(&b, "", 1);
    return b.p;
}

/* A raw request (msgpack map built by the caller) to `url`; the reply's bytes
 * (caller frees) or NULL. */
static char *
raw_call(const char *url, const char *req, size_t len, size_t *rlen)
{
    nng_socket s;
    cr_assert_eq(nng_req0_open(&s), 0);
    nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 30000);
    nng_socket_set_ms(s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE);
    cr_assert_eq(nng_dial(s, url, NULL, 0), 0, "dial %s", url);
    char *out = NULL;
    if (nng_send(s, (void *)req, len, 0) == 0) {
        char *buf;
        if (nng_recv(s, &buf, rlen, NNG_FLAG_ALLOC) == 0) {
            out = sbx_xmalloc(*rlen + 1);
            memcpy(out, buf, *rlen);
            out[*rlen] = 0;
            nng_free(buf, *rlen);
        }
    }
    nng_close(s);
    return out;
}

/* The error code of a reply ("" for a success). */
static void
reply_code(const char *rep, size_t len, char code[64])
{
    sbx_msg m;
    code[0] = 0;
    cr_assert_eq(sbx_wire_decode(&m, rep, len, &sbx_wire_limits_reply), 0);
    const msgpack_object *eo;
    sbx_str c;
    if (sbx_wire_get_map(m.root, "error", &eo) == 0 && sbx_wire_get_str(eo, "code", &c) == 0)
        sbx_str_copy(c, code, 64);
    sbx_wire_msg_free(&m);
}

/* Whether bytes [p, p+n) contain s. */
static bool
holds(const char *p, size_t n, const char *s)
{
    return p && memmem(p, n, s, strlen(s)) != NULL;
}

/* ---------------------------------------------------------------------------------- */

Test(tenants, nng_tenants_are_namespaces, .timeout = 240)
{
    struct tenv e;
    tenv_start(&e, 100, 100);
    sbx_client *b = plant_victim(&e);
    long long gen = check_victim(b, -1);
    sbx_client *a = keyed(&e, e.ka);

    /* The same ID in a is another sandbox: a's own, empty. */
    char *out = tsh_out(a, "victim", "cat /workspace/secret 2>&1; printf " A_SECRET
                                     " > /workspace/secret");
    cr_assert(!strstr(out, B_SECRET), "a read b's file: %s", out);
    free(out);
    out = tsh_out(a, "victim", "cat /workspace/secret");
    cr_assert_str_eq(out, A_SECRET);
    free(out);
    check_victim(b, gen);

    /* list: each tenant sees its own sandboxes only, under its own IDs; the
     * admin key (the default tenant) sees neither. */
    char *la = list_ids(a), *lb = list_ids(b);
    cr_assert_str_eq(la, "victim,", "a's list: %s", la);
    cr_assert_str_eq(lb, "victim,", "b's list: %s", lb);
    sbx_client *adm = keyed(&e, e.admin);
    char *lx = list_ids(adm);
    cr_assert(!strstr(lx, "victim"), "the default tenant's list: %s", lx);
    free(la);
    free(lb);
    free(lx);

    /* b's sandbox under any spelling is NOT_FOUND for a, answered exactly as
     * an ID that no tenant has; nothing of it is created in b. */
    const char *tricks[] = {"b--victim", "sbx--victim", "a--b--victim", NULL};
    tcall none = tc_call(a, "status", "zz-nobody-has-it", NULL, 0);
    cr_assert_str_eq(none.err.code, "SANDBOX_NOT_FOUND");
    char *none_msg = generic(none.err.message, "zz-nobody-has-it");
    char *none_ctx = generic(none.err.context_json, "zz-nobody-has-it");
    for (int i = 0; tricks[i]; i++) {
        tcall t = tc_call(a, "status", tricks[i], NULL, 0);
        cr_assert_str_eq(t.err.code, "SANDBOX_NOT_FOUND", "status %s: %s", tricks[i],
                         t.err.code);
        char *msg = generic(t.err.message, tricks[i]);
        cr_assert_str_eq(msg, none_msg, "a hint in the refusal for %s", tricks[i]);
        char *ctx = generic(t.err.context_json, tricks[i]);
        cr_assert_str_eq(ctx, none_ctx, "a hint in the context for %s", tricks[i]);
        free(ctx);
        free(msg);
        tc_free(&t);
        t = tc_call(a, "file.read", tricks[i], json_pack("{s:s}", "path", "/workspace/secret"),
                    0);
        cr_assert(t.rc != 0 || !strstr(jstr(t.res, "content"), B_SECRET), "file.read %s",
                  tricks[i]);
        tc_free(&t);
    }
    free(none_msg);
    free(none_ctx);
    tc_free(&none);

    /* An envelope that names a tenant or a route itself changes nothing:
     * the tenant is the key's. */
    sbx_enc en;
    char *req;
    size_t rlen;
    sbx_enc_init(&en);
    sbx_enc_map(&en);
    sbx_enc_kint(&en, "v", 1);
    sbx_enc_kstr(&en, "id", "trick-1");
    sbx_enc_kstr(&en, "op", "file.read");
    sbx_enc_kstr(&en, "sandbox", "victim");
    sbx_enc_kstr(&en, "key", e.ka);
    sbx_enc_kstr(&en, "tenant", "b");
    sbx_enc_kmap(&en, "route");
    sbx_enc_kstr(&en, "tenant", "b");
    sbx_enc_end(&en);
    sbx_enc_kmap(&en, "args");
    sbx_enc_kstr(&en, "path", "/workspace/secret");
    sbx_enc_end(&en);
    sbx_enc_end(&en);
    cr_assert_eq(sbx_enc_finish(&en, &req, &rlen), 0);
    size_t n;
    char *rep = raw_call(e.d.url, req, rlen, &n);
    cr_assert(rep, "no reply");
    cr_assert(holds(rep, n, A_SECRET) && !holds(rep, n, B_SECRET), "the envelope chose b");
    free(rep);
    free(req);

    /* Defence in depth: a shard refuses a request stamped with tenant a for
     * b's sandbox even when a gateway forwards it (sent straight to each
     * shard); stamped b (the control), its owner answers. */
    int owners = 0;
    for (int s = 0; s < 2; s++) {
        for (int who = 0; who < 2; who++) {
            sbx_enc in, out2;
            char *ib, *ob;
            size_t il, ol;
            sbx_enc_init(&in);
            sbx_enc_map(&in);
            sbx_enc_kint(&in, "v", 1);
            sbx_enc_kstr(&in, "id", who ? "defence-b" : "defence-a");
            sbx_enc_kstr(&in, "op", "status");
            sbx_enc_kstr(&in, "sandbox", "b--victim");
            sbx_enc_end(&in);
            cr_assert_eq(sbx_enc_finish(&in, &ib, &il), 0);
            sbx_enc_init(&out2);
            sbx_enc_map(&out2);
            sbx_enc_kint(&out2, "v", 1);
            sbx_enc_kmap(&out2, "route");
            sbx_enc_kint(&out2, "partition", 0);
            sbx_enc_kint(&out2, "epoch", 0);
            sbx_enc_kstr(&out2, "gateway", "test");
            sbx_enc_kstr(&out2, "tenant", who ? "b" : "a");
            sbx_enc_end(&out2);
            sbx_enc_kbin(&out2, "req", ib, il);
            sbx_enc_end(&out2);
            cr_assert_eq(sbx_enc_finish(&out2, &ob, &ol), 0);
            char url[600], code[64];
            snprintf(url, sizeof(url), "ipc://%s/s%d.sock", e.d.dir, s);
            rep = raw_call(url, ob, ol, &n);
            cr_assert(rep, "shard %d did not answer", s);
            reply_code(rep, n, code);
            if (!who) {
                cr_assert_str_eq(code, "SANDBOX_NOT_FOUND", "shard %d answered tenant a %s", s,
                                 code);
                cr_assert(!holds(rep, n, B_SECRET));
            } else {
                owners += code[0] == 0;
            }
            free(rep);
            free(ib);
            free(ob);
        }
    }
    cr_assert_eq(owners, 1, "the control (tenant b) found b's sandbox on %d shards", owners);

    /* No key, a wrong key: UNAUTHORIZED; a tenant key cannot administer. */
    sbx_client *nokey = keyed(&e, NULL);
    tcall t = tc_call(nokey, "status", "victim", NULL, 0);
    cr_assert_str_eq(t.err.code, "UNAUTHORIZED");
    tc_free(&t);
    sbx_client_close(nokey);
    sbx_client *wrong = keyed(&e, "sbx_0000000000000000000000000000000000000000000000000000");
    t = tc_call(wrong, "status", "victim", NULL, 0);
    cr_assert_str_eq(t.err.code, "UNAUTHORIZED");
    tc_free(&t);
    sbx_client_close(wrong);
    /* (backup.list is a tenant's own backups: test_tenant_limits.c) */
    const char *admin_ops[] = {"tenant.list", "key.list", "cluster.status", "metrics", NULL};
    for (int i = 0; admin_ops[i]; i++) {
        t = tc_call(a, admin_ops[i], NULL, NULL, 0);
        cr_assert_str_eq(t.err.code, "PERMISSION_DENIED", "%s by a tenant key: %s", admin_ops[i],
                         t.rc ? t.err.code : "ok");
        tc_free(&t);
    }
    check_victim(b, gen);
    sbx_client_close(a);
    sbx_client_close(b);
    sbx_client_close(adm);
    tenv_stop(&e);
}

/* ---------------------------------------------------------------------------------- */

struct sse_acc {
    sbx_buf all;
};

static bool
sse_collect(const struct sse_ev *ev, void *arg)
{
    struct sse_acc *s = arg;
    if (ev->data)
        sbx_buf_append(&s->all, ev->data, strlen(ev->data));
    return true;
}

/* The terminal WebSocket of `id` as a browser opens it with key: a URL
 * token minted with the key in the header (docs/http.md, "Tokens in URLs"),
 * then ?access_token=<token>; types `cmd`, reads until `until` is in the
 * output (or 30 s); the output (heap) or NULL when the upgrade is refused
 * (*status then holds the answer's status). */
static char *
terminal_run(const char *http, const char *id, const char *key, const char *cmd,
             const char *until, int *status)
{
    int port = atoi(strrchr(http, ':') + 1);
    char host[64], err[256];
    snprintf(host, sizeof(host), "127.0.0.1:%d", port);
    char *mint = hfmt("%s/v1/sandboxes/%s/url-token?purpose=terminal", http, id);
    char *auth = hfmt("Authorization: Bearer %s", key);
    const char *hdrs[] = {auth, NULL};
    struct hopts mo = {.headers = hdrs};
    struct hresp mr;
    http_req("POST", mint, &mo, &mr);
    cr_assert_eq(mr.status, 200, "url-token: %ld %.200s", mr.status, mr.body ? mr.body : "");
    char *path = hfmt("/v1/sandboxes/%s/terminal?access_token=%s", id, jstr(mr.json, "token"));
    hresp_free(&mr);
    free(mint);
    free(auth);
    wsc w;
    *status = wsc_connect(&w, port, host, path, NULL, 60000, err, sizeof(err));
    free(path);
    if (*status != 101) {
        wsc_close(&w);
        return NULL;
    }
    sbx_buf out;
    sbx_buf_init(&out);
    bool ready = false, typed = false;
    double until_ms = test_now_ms() + 30000;
    while (test_now_ms() < until_ms) {
        char *d;
        size_t n;
        int op = wsc_recv(&w, &d, &n, 1000);
        if (op == WS_BINARY)
            sbx_buf_append(&out, d, n);
        else if (op == WS_TEXT && strstr(d, "\"ready\""))
            ready = true;
        if (op >= 0)
            free(d);
        if (op == WS_CLOSE || op == -2)
            break;
        if (ready && !typed) {
            cr_assert_eq(wsc_send(&w, WS_BINARY, cmd, strlen(cmd)), 0);
            typed = true;
        }
        sbx_buf_append(&out, "", 1);
        out.len--;
        if (typed && out.p && strstr(out.p, until))
            break;
    }
    wsc_send_close(&w);
    wsc_close(&w);
    sbx_buf_append(&out, "", 1);
    return out.p;
}

Test(tenants, http_routes_and_streams_stay_in_the_tenant, .timeout = 240)
{
    struct tenv e;
    tenv_start(&e, 100, 100);
    sbx_client *b = plant_victim(&e);
    long long gen = check_victim(b, -1);
    char ha[160], hb[160], hadm[160];
    snprintf(ha, sizeof(ha), "Authorization: Bearer %s", e.ka);
    snprintf(hb, sizeof(hb), "Authorization: Bearer %s", e.kb);
    snprintf(hadm, sizeof(hadm), "Authorization: Bearer %s", e.admin);
    const char *ah[] = {ha, NULL}, *adh[] = {hadm, NULL};
    struct hopts oa = {.headers = ah}, oadm = {.headers = adh};
    struct hresp r;

    /* b's file, by its own route, from a: a's own (absent) file. */
    char *u = hfmt("%s/v1/sandboxes/victim/files/workspace/secret", e.http);
    http_req("GET", u, &oa, &r);
    cr_assert_eq(r.status, 404, "a got %ld: %.200s", r.status, r.body);
    cr_assert(!holds(r.body, r.len, B_SECRET));
    hresp_free(&r);
    free(u);
    /* b's own key reads it (the control). */
    const char *bh[] = {hb, NULL};
    struct hopts ob = {.headers = bh};
    u = hfmt("%s/v1/sandboxes/victim/files/workspace/secret", e.http);
    http_req("GET", u, &ob, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(holds(r.body, r.len, B_SECRET));
    hresp_free(&r);
    free(u);

    /* A NOT_FOUND for b's internal ID reads as one for an ID nobody has. */
    u = hfmt("%s/v1/sandboxes/b--victim", e.http);
    http_req("GET", u, &oa, &r);
    cr_assert_eq(r.status, 404);
    char *m1 = generic(r.body, "b--victim");
    hresp_free(&r);
    free(u);
    u = hfmt("%s/v1/sandboxes/zz-nobody-has-it", e.http);
    http_req("GET", u, &oa, &r);
    cr_assert_eq(r.status, 404);
    char *m2 = generic(r.body, "zz-nobody-has-it");
    hresp_free(&r);
    free(u);
    cr_assert_str_eq(m1, m2, "a hint in the HTTP refusal");
    free(m1);
    free(m2);

    /* The list route: a's sandboxes only (a has none yet but the one the
     * file read created: its own victim). */
    u = hfmt("%s/v1/sandboxes", e.http);
    http_req("GET", u, &oa, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(!holds(r.body, r.len, "b--"), "%.300s", r.body);
    cr_assert_eq(jint(r.json, "count"), 1, "%.300s", r.body);
    hresp_free(&r);
    free(u);

    /* An SSE stream (exec.stream, a POST: the key goes in its header; keys
     * never travel in URLs, docs/http.md): a's sandbox, never b's bytes. */
    u = hfmt("%s/v1/sandboxes/victim/exec.stream", e.http);
    const char *body = "{\"command\":\"cat /workspace/secret; echo stream-done\"}";
    char *sse_auth = hfmt("Authorization: Bearer %s", e.ka);
    const char *sse_hdrs[] = {sse_auth, NULL};
    struct hopts os = {.headers = sse_hdrs, .body = body, .body_len = strlen(body)};
    struct sse_acc acc;
    sbx_buf_init(&acc.all);
    long st = sse_req("POST", u, &os, sse_collect, &acc, &r);
    cr_assert_eq(st, 200, "exec.stream: %ld %.200s", st, r.body ? r.body : "");
    cr_assert(holds(acc.all.p, acc.all.len, "stream-done"), "the stream ran");
    cr_assert(!holds(acc.all.p, acc.all.len, B_SECRET), "b's secret in a's stream");
    sbx_buf_free(&acc.all);
    hresp_free(&r);
    free(u);
    free(sse_auth);

    /* The terminal WebSocket with a's key: a's sandbox (a's own file), not b's;
     * with a wrong key the upgrade is refused. */
    int st2;
    char *term = terminal_run(e.http, "victim", e.ka,
                              "printf " A_SECRET " > /workspace/secret; cat /workspace/secret; "
                              "echo; echo term-$((40+2))\n",
                              "term-42", &st2);
    cr_assert(term, "terminal upgrade refused: %d", st2);
    cr_assert(strstr(term, "term-42"), "the terminal ran nothing: %s", term);
    cr_assert(strstr(term, A_SECRET) && !strstr(term, B_SECRET), "terminal output: %s", term);
    free(term);
    term = terminal_run(e.http, "victim", "sbx_00000000000000000000000000000000", "true\n", "x",
                        &st2);
    cr_assert(!term && st2 != 101, "a terminal with a wrong key was opened");

    /* Admin routes: the admin key may, a tenant's key may not, no key is 401. */
    u = hfmt("%s/v1/tenants", e.http);
    http_req("GET", u, &oadm, &r);
    cr_assert_eq(r.status, 200, "%.200s", r.body);
    cr_assert_eq(json_array_size(jget(r.json, "tenants")), 2, "%.300s", r.body);
    hresp_free(&r);
    http_req("GET", u, &oa, &r);
    cr_assert_eq(r.status, 403, "%.200s", r.body);
    hresp_free(&r);
    http_req("GET", u, NULL, &r);
    cr_assert_eq(r.status, 401, "%.200s", r.body);
    hresp_free(&r);
    free(u);
    u = hfmt("%s/v1/keys", e.http);
    http_req("GET", u, &oadm, &r);
    cr_assert_eq(r.status, 200);
    cr_assert(!holds(r.body, r.len, e.ka) && !holds(r.body, r.len, e.kb), "key.list shows keys");
    hresp_free(&r);
    free(u);
    check_victim(b, gen);
    sbx_client_close(b);
    tenv_stop(&e);
}

/* ---------------------------------------------------------------------------------- */

Test(tenants, revocation_and_quotas, .timeout = 240)
{
    struct tenv e;
    tenv_start(&e, 2, 100);
    sbx_client *adm = keyed(&e, e.admin);

    /* A second key of a works, then is revoked: the gateway that revoked it
     * refuses it from the next request on (others within 2 s). */
    tcall t = tc_call(adm, "key.create", NULL, json_pack("{s:s}", "tenant", "a"), 0);
    tc_ok(t, "key.create");
    char k2[80], kid[40];
    snprintf(k2, sizeof(k2), "%s", jstr(t.res, "key"));
    snprintf(kid, sizeof(kid), "%s", jstr(t.res, "keyId"));
    tc_free(&t);
    sbx_client *a2 = keyed(&e, k2);
    t = tc_call(a2, "sandbox.labels", "q1", json_pack("{s:{}}", "labels"), 0);
    tc_ok(t, "a's second key");
    tc_free(&t);
    t = tc_call(adm, "key.list", NULL, json_pack("{s:s}", "tenant", "a"), 0);
    tc_ok(t, "key.list");
    cr_assert_eq(json_array_size(jget(t.res, "keys")), 2);
    tc_free(&t);
    t = tc_call(adm, "key.revoke", NULL, json_pack("{s:s}", "keyId", kid), 0);
    tc_ok(t, "key.revoke");
    cr_assert(jbool(t.res, "revoked"));
    tc_free(&t);
    t = tc_call(a2, "status", "q1", NULL, 0);
    cr_assert_str_eq(t.err.code, "UNAUTHORIZED", "a revoked key still works: %s",
                     t.rc ? t.err.code : "ok");
    tc_free(&t);
    sbx_client_close(a2);

    /* maxSandboxes 2: a third sandbox is QUOTA_EXCEEDED (over nng with
     * retryAfterMs, over HTTP 429 with Retry-After); one destroyed, it fits. */
    sbx_client *a = keyed(&e, e.ka);
    t = tc_call(a, "sandbox.labels", "q2", json_pack("{s:{}}", "labels"), 0);
    tc_ok(t, "second sandbox");
    tc_free(&t);
    t = tc_call(a, "sandbox.labels", "q3", json_pack("{s:{}}", "labels"), 0);
    cr_assert_str_eq(t.err.code, "QUOTA_EXCEEDED", "third sandbox: %s", t.rc ? t.err.code : "ok");
    cr_assert(jint(t.ctx, "retryAfterMs") > 0, "context %s", t.err.context_json);
    cr_assert_str_eq(jstr(t.ctx, "sandboxId"), "q3");
    tc_free(&t);
    char ha[160];
    snprintf(ha, sizeof(ha), "Authorization: Bearer %s", e.ka);
    const char *ah[] = {ha, NULL};
    struct hopts oa = {.headers = ah};
    struct hresp r;
    char *u = hfmt("%s/v1/sandboxes/q3", e.http);
    http_req("PUT", u, &oa, &r);
    cr_assert_eq(r.status, 429, "%.200s", r.body);
    cr_assert_str_eq(jstr(r.json, "code"), "QUOTA_EXCEEDED");
    char *ra = hresp_header(&r, "Retry-After");
    cr_assert(ra && atoi(ra) >= 1, "Retry-After %s", ra ? ra : "-");
    free(ra);
    hresp_free(&r);
    free(u);
    /* The existing ones still answer (no quota on use). */
    t = tc_call(a, "sandbox.labels", "q1", NULL, 0);
    tc_ok(t, "an existing sandbox");
    tc_free(&t);
    /* b is not held by a's quota. */
    sbx_client *b = keyed(&e, e.kb);
    t = tc_call(b, "sandbox.labels", "q3", json_pack("{s:{}}", "labels"), 0);
    tc_ok(t, "b's sandbox");
    tc_free(&t);
    t = tc_call(a, "destroy", "q1", NULL, 0);
    tc_ok(t, "destroy");
    tc_free(&t);
    bool fitted = false;
    for (int i = 0; i < 100 && !fitted; i++) {
        t = tc_call(a, "sandbox.labels", "q3", json_pack("{s:{}}", "labels"), 0);
        fitted = t.rc == 0;
        if (!fitted)
            cr_assert_str_eq(t.err.code, "QUOTA_EXCEEDED");
        tc_free(&t);
        if (!fitted)
            tsleep_ms(100);
    }
    cr_assert(fitted, "after a destroy the quota did not free up within 10 s");

    /* The audit log: a's creations under a's key id and internal IDs, the
     * revocation under the admin's key id; a tenant key may not read it. */
    char kida[65], kidadm[65];
    sha256_hex(e.ka, strlen(e.ka), kida);
    kida[32] = 0;
    sha256_hex(e.admin, strlen(e.admin), kidadm);
    kidadm[32] = 0;
    t = tc_call(adm, "audit.list", NULL, json_pack("{s:s,s:i}", "tenant", "a", "limit", 1000), 0);
    tc_ok(t, "audit.list");
    bool saw_create = false, saw_other = false;
    size_t ai;
    json_t *it;
    json_array_foreach(jget(t.res, "entries"), ai, it) {
        const char *op = jstr(it, "op"), *sb = jstr(it, "sandbox"), *res = jstr(it, "result");
        if (!strcmp(op, "sandbox.labels") && !strcmp(sb, "a--q2") && !strcmp(res, "ok") &&
            !strcmp(jstr(it, "keyId"), kida) && jint(it, "at") > 0)
            saw_create = true;
        saw_other |= strcmp(jstr(it, "tenant"), "a") != 0;
    }
    cr_assert(saw_create, "a's creation of q2 is not in the audit log: %s",
              json_dumps(t.res, JSON_COMPACT));
    cr_assert(!saw_other, "the tenant filter let another tenant's entries through");
    tc_free(&t);
    t = tc_call(adm, "audit.list", NULL, json_pack("{s:i}", "limit", 1000), 0);
    tc_ok(t, "audit.list");
    bool saw_revoke = false;
    char revoked[80];
    snprintf(revoked, sizeof(revoked), "sbx--k%s-a-t", kid);
    json_array_foreach(jget(t.res, "entries"), ai, it) {
        saw_revoke |= !strcmp(jstr(it, "op"), "destroy") && !strcmp(jstr(it, "sandbox"), revoked) &&
                      !strcmp(jstr(it, "keyId"), kidadm);
    }
    cr_assert(saw_revoke, "the revocation is not in the audit log under the admin's key id");
    tc_free(&t);
    t = tc_call(a, "audit.list", NULL, NULL, 0);
    cr_assert_str_eq(t.err.code, "PERMISSION_DENIED");
    tc_free(&t);

    /* A tenant with sandboxes cannot be deleted; without, it goes with its keys. */
    t = tc_call(adm, "tenant.delete", NULL, json_pack("{s:s}", "tenant", "a"), 0);
    cr_assert_str_eq(t.err.code, "VALIDATION_FAILED", "%s", t.rc ? t.err.code : "ok");
    tc_free(&t);
    const char *ids[] = {"q2", "q3", NULL};
    for (int i = 0; ids[i]; i++) {
        t = tc_call(a, "destroy", ids[i], NULL, 0);
        tc_ok(t, "destroy");
        tc_free(&t);
    }
    bool deleted = false;
    for (int i = 0; i < 100 && !deleted; i++) {
        t = tc_call(adm, "tenant.delete", NULL, json_pack("{s:s}", "tenant", "a"), 0);
        deleted = t.rc == 0;
        tc_free(&t);
        if (!deleted)
            tsleep_ms(100);
    }
    cr_assert(deleted, "tenant.delete");
    t = tc_call(a, "list", NULL, NULL, 0);
    cr_assert_str_eq(t.err.code, "UNAUTHORIZED", "a deleted tenant's key: %s",
                     t.rc ? t.err.code : "ok");
    tc_free(&t);
    sbx_client_close(a);
    sbx_client_close(b);
    sbx_client_close(adm);
    tenv_stop(&e);
}

/* ---------------------------------------------------------------------------------- */

/* A random string argument: paths and IDs meant to leave a's namespace. */
static const char *
pick(unsigned *seed, const char *const *set, size_t n)
{
    return set[rand_r(seed) % n];
}

Test(tenants, randomized_client_never_crosses, .timeout = 900)
{
    struct tenv e;
    tenv_start(&e, 4, 1000);
    sbx_client *b = plant_victim(&e);
    long long gen = check_victim(b, -1);
    sbx_client *a = keyed(&e, e.ka);
    unsigned seed = (unsigned)getpid() ^ (unsigned)time(NULL);
    fprintf(stderr, "randomized_client_never_crosses: seed %u\n", seed);
    static const char *const ids[] = {
        "victim",     "b--victim",  "B--victim",   "b-victim",      "sbx--victim",
        "a--victim",  "-victim",    "victim-",     "victim/../b",   "..",
        "b--victim/", "%62--victim", "victim b",    "a--b--victim", "vIctim",
        "x",          "mine",       "b",           "sbx--t-b-100-10", "",
    };
    static const char *const strs[] = {
        "/workspace/secret", "../../b--victim/workspace/secret", "/proc/1/root/workspace/secret",
        "cat /workspace/secret", "b--victim", "victim", "/", "..", "", "*",
        "/workspace/../../../../workspace/secret", "b", "owner",
    };
    size_t nops = 0;
    while (sbx_ops[nops].name)
        nops++;
    long crossed = 0, replies = 0, succeeded = 0;
    json_t *codes = json_object(); /* error code → count, printed */
    for (int i = 0; i < 10000; i++) {
        const struct sbx_op_def *def = &sbx_ops[rand_r(&seed) % nops];
        const char *sb = pick(&seed, ids, SBX_ARRAY_LEN(ids));
        json_t *args = json_object();
        /* Two requests in three have arguments of the declared kinds (so that
         * they reach the sandbox), the third any kind. */
        bool typed = rand_r(&seed) % 3 != 0;
        for (size_t f = 0; f < def->nargs; f++) {
            const struct sbx_arg *ad = &def->args[f];
            if (typed) {
                if (!ad->required && rand_r(&seed) % 2)
                    continue;
                json_t *v;
                if ((ad->kinds & SBX_ARG_STR) && ad->enums) {
                    size_t ne = 0;
                    while (ad->enums[ne])
                        ne++;
                    v = json_string(ad->enums[rand_r(&seed) % ne]);
                } else if (ad->kinds & (SBX_ARG_STR | SBX_ARG_BIN)) {
                    v = json_string(pick(&seed, strs, SBX_ARRAY_LEN(strs)));
                } else if (ad->kinds & (SBX_ARG_INT | SBX_ARG_FLOAT)) {
                    double lo = ad->has_min ? ad->min : 0, hi = ad->has_max ? ad->max : lo + 5000;
                    v = json_integer((json_int_t)(lo + (double)(rand_r(&seed) % 1000) *
                                                           (hi - lo) / 1000.0));
                } else if (ad->kinds & SBX_ARG_BOOL) {
                    v = json_boolean(rand_r(&seed) % 2);
                } else if (ad->kinds & SBX_ARG_MAP) {
                    v = json_pack("{s:s}", "owner", "a");
                } else if (ad->kinds & SBX_ARG_ARRAY) {
                    v = json_pack("[s]", pick(&seed, strs, SBX_ARRAY_LEN(strs)));
                } else {
                    continue;
                }
                json_object_set_new(args, ad->name, v);
                continue;
            }
            if (rand_r(&seed) % 3 == 0)
                continue;
            const char *name = ad->name;
            switch (rand_r(&seed) % 4) {
            case 0:
                json_object_set_new(args, name, json_string(pick(&seed, strs, SBX_ARRAY_LEN(strs))));
                break;
            case 1:
                json_object_set_new(args, name, json_integer(rand_r(&seed) % 5000));
                break;
            case 2:
                json_object_set_new(args, name, json_pack("{s:s}", "owner", "a"));
                break;
            default:
                json_object_set_new(args, name, json_true());
            }
        }
        /* Stay quick: no command runs longer than the request's deadline. */
        tcall t = tc_call(a, def->name, *sb ? sb : NULL, args, 3000);
        replies++;
        succeeded += t.rc == 0;
        if (t.rc) {
            json_t *cnt = json_object_get(codes, t.err.code);
            json_object_set_new(codes, t.err.code,
                                json_integer(cnt ? json_integer_value(cnt) + 1 : 1));
        }
        const char *text = t.rc == 0 ? NULL : t.err.message;
        char *js = t.rc == 0 ? json_dumps(t.res, JSON_COMPACT) : NULL;
        if ((js && strstr(js, B_SECRET)) || (text && strstr(text, B_SECRET)) ||
            (t.err.context_json && strstr(t.err.context_json, B_SECRET))) {
            crossed++;
            fprintf(stderr, "request %d (%s on %s) read b's secret\n", i, def->name, sb);
        }
        free(js);
        tc_free(&t);
    }
    fprintf(stderr, "randomized_client_never_crosses: %ld requests, %ld succeeded, %ld crossed\n",
            replies, succeeded, crossed);
    char *hist = json_dumps(codes, JSON_COMPACT | JSON_SORT_KEYS);
    fprintf(stderr, "randomized_client_never_crosses: errors %s\n", hist);
    free(hist);
    json_decref(codes);
    cr_assert(succeeded > 0, "no request of a succeeded: the run tried nothing");
    cr_assert_eq(crossed, 0, "%ld replies to a held b's data", crossed);
    /* b's sandbox is untouched, still b's only. */
    check_victim(b, gen);
    char *lb = list_ids(b);
    cr_assert_str_eq(lb, "victim,", "b's list: %s", lb);
    free(lb);
    sbx_client_close(a);
    sbx_client_close(b);
    tenv_stop(&e);
}

/* sandbox.fork names new sandboxes in its args (`ids`), not only in the
 * envelope: the gateway puts them into the caller's tenant like the source
 * (gateway/tenant.c sbx_tenants_reencode_ids).  a forks its source into six
 * IDs — over the deployment's two shards, so most runs cross shards (the
 * gateway's gw_fork.c path) — and one of them is "victim", which b has: a
 * gets its own "victim", b's is untouched; the reply names the forks as a
 * named them; b cannot fork a's source (NOT_FOUND in b's namespace). */
Test(tenants, forks_stay_in_the_tenant, .timeout = 240)
{
    struct tenv e;
    tenv_start(&e, 100, 100);
    sbx_client *b = plant_victim(&e);
    long long gen = check_victim(b, -1);
    sbx_client *a = keyed(&e, e.ka);
    tcall t = tc_call(a, "create", "src", json_pack("{s:s}", "workspace", "persistent"), 0);
    tc_ok(t, "create src (persistent)");
    tc_free(&t);
    char *out = tsh_out(a, "src", "printf " A_SECRET " > /workspace/f && cat /workspace/f");
    cr_assert_str_eq(out, A_SECRET);
    free(out);

    const char *ids[] = {"fk0", "fk1", "fk2", "fk3", "victim", "fk5"};
    json_t *arr = json_array();
    for (size_t i = 0; i < 6; i++)
        json_array_append_new(arr, json_string(ids[i]));
    t = tc_call(a, "sandbox.fork", "src", json_pack("{s:o}", "ids", arr), 120000);
    tc_ok(t, "sandbox.fork by a");
    cr_assert_str_eq(jstr(t.res, "from"), "src", "the reply's source");
    json_t *got = jget(t.res, "ids");
    cr_assert(json_is_array(got) && json_array_size(got) == 6, "ids in the reply");
    for (size_t i = 0; i < 6; i++)
        cr_assert_str_eq(json_string_value(json_array_get(got, i)), ids[i],
                         "the reply names fork %zu in a's words", i);
    tc_free(&t);
    for (size_t i = 0; i < 6; i++) {
        out = tsh_out(a, ids[i], "cat /workspace/f");
        cr_assert_str_eq(out, A_SECRET, "a's fork %s does not hold the source's file", ids[i]);
        free(out);
    }
    /* b's victim is b's still; a's "victim" is a's fork. */
    check_victim(b, gen);
    char *la = list_ids(a);
    cr_assert(strstr(la, "src,") && strstr(la, "fk0,") && strstr(la, "victim,") &&
                  !strstr(la, "--"),
              "a's list: %s", la);
    free(la);
    char *lb = list_ids(b);
    cr_assert_str_eq(lb, "victim,", "b's list: %s", lb);
    free(lb);

    /* b forking "src" forks b's own (absent) src: NOT_FOUND, nothing made. */
    t = tc_call(b, "sandbox.fork", "src", json_pack("{s:[s]}", "ids", "stolen"), 60000);
    cr_assert_str_eq(t.err.code, "SANDBOX_NOT_FOUND", "b forked a's sandbox: %s",
                     t.err.code[0] ? t.err.code : "ok");
    tc_free(&t);
    lb = list_ids(b);
    cr_assert_str_eq(lb, "victim,", "b's list after its fork: %s", lb);
    free(lb);

    /* Forks count against the quota like creates: with maxSandboxes 8 and
     * 7 sandboxes, a fork into two more is QUOTA_EXCEEDED, naming the one
     * past the quota; /metrics (admin) shows each tenant's count and quota. */
    sbx_client *adm = keyed(&e, e.admin);
    t = tc_call(adm, "tenant.create", NULL,
                json_pack("{s:s,s:I,s:I}", "tenant", "a", "maxSandboxes", (json_int_t)8,
                          "createsPerSecond", (json_int_t)100),
                0);
    tc_ok(t, "tenant.create a (quota 8)");
    tc_free(&t);
    usleep(2500 * 1000); /* the gateway's registry refresh (≤ 2 s) */
    t = tc_call(a, "sandbox.fork", "src", json_pack("{s:[s,s]}", "ids", "fk6", "fk7"), 60000);
    cr_assert_str_eq(t.err.code, "QUOTA_EXCEEDED", "a fork past the quota: %s",
                     t.err.code[0] ? t.err.code : "ok");
    cr_assert_str_eq(jstr(t.ctx, "sandboxId"), "fk7", "the ID past the quota");
    tc_free(&t);
    t = tc_call(adm, "metrics", NULL, NULL, 0);
    tc_ok(t, "metrics (admin)");
    const char *text = jstr(t.res, "text");
    cr_assert(text && strstr(text, "sbx_tenant_max_sandboxes{tenant=\"a\"} 8"),
              "no quota of a in /metrics");
    cr_assert(strstr(text, "sbx_tenant_sandboxes{tenant=\"a\"} ") &&
                  strstr(text, "sbx_tenant_sandboxes{tenant=\"b\"} 1"),
              "no sandbox counts per tenant in /metrics");
    tc_free(&t);
    t = tc_call(a, "metrics", NULL, NULL, 0);
    cr_assert_str_eq(t.err.code, "PERMISSION_DENIED", "a tenant key read /metrics (every tenant)");
    tc_free(&t);
    sbx_client_close(adm);

    sbx_client_close(a);
    sbx_client_close(b);
    tenv_stop(&e);
}
