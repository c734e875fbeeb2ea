/*
 * test_cluster_edges.c — a multi-host cluster (tests/cluster/cluster.h: shard
 * nodes in network namespaces, etcd, two gateways) at its edges: two gateways
 * serve the same sandboxes, a preview URL reaches a sandbox's web server
 * through either gateway's HTTP front (the shard's tcp relay, with the relay
 * secret), etcd goes away and comes back, the largest environments replicate,
 * a node is drained while a long command runs on it (it keeps its lease), a
 * replication that reaches etcd late, after its partition left and came back,
 * is not applied, and garbage written to etcd (partition keys in other
 * spellings or with a NUL, more drain keys of ghosts than the views have
 * member slots, partitions owned by names no shard has) disturbs neither the
 * views, a gateway that starts, nor a node that joins, and a sandbox reaches
 * no member of its cluster nor etcd (t25).  test_cluster_churn.c
 * has t1-t5 (joins, drains, kills, restarts, fencing); cluster_util.h what
 * both share.
 *
 * The tests run one at a time (cluster_main.c forces --jobs 1), in the order
 * of their names; each starts from the converged three-node cluster and
 * leaves it converged again (it restores what it changed).  Figures (moves,
 * convergence and failover times, client errors) go to cr_log_info.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/etcd.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "cluster.h"
#include "eproxy.h"
#include "../support/shell.h"
#include "cluster_util.h"

/* ------------------------------------------------------------------------------ */

Test(cluster, t6_any_gateway_serves_any_sandbox, .timeout = 120)
{
    restore_base();
    sbx_client *g[2] = {gw_client(0), gw_client(1)};
    enum { N = 16 };
    char ids[N][64], v[64], got[64];
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    int per_node[CL_MAX_NODES] = {0};
    for (int k = 0; k < N; k++) {
        sb_id(ids[k], sizeof(ids[k]), "w", k);
        per_node[owner_of(&st, ids[k])]++;
        snprintf(v, sizeof(v), "a%d", k);
        set_var(g[0], ids[k], "X", v);
        get_var(g[1], ids[k], "X", got, sizeof(got));
        cr_expect_str_eq(got, v, "%s: gateway 1 reads what gateway 0 wrote", ids[k]);
        snprintf(v, sizeof(v), "b%d", k);
        set_var(g[1], ids[k], "X", v);
        get_var(g[0], ids[k], "X", got, sizeof(got));
        cr_expect_str_eq(got, v, "%s: gateway 0 reads what gateway 1 wrote", ids[k]);
        /* status through both: the same shard */
        char shard[2][64];
        for (int j = 0; j < 2; j++) {
            sbx_reply *r = NULL;
            sbx_error err;
            int rc = sbx_call_json(g[j], "status", ids[k], NULL, 10000, &r, &err);
            cr_assert_eq(rc, 0, "status via gateway %d: %s", j, err.code);
            const msgpack_object *sb;
            sbx_str s = {"", 0};
            if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0)
                sbx_wire_get_str(sb, "shard", &s);
            snprintf(shard[j], sizeof(shard[j]), "%.*s", (int)s.n, s.p);
            sbx_reply_free(r);
        }
        char want[64];
        cl_node_name(owner_of(&st, ids[k]), want, sizeof(want));
        cr_expect_str_eq(shard[0], shard[1], "%s: the gateways disagree", ids[k]);
        cr_expect_str_eq(shard[0], want, "%s: served by %s, etcd says %s", ids[k], shard[0], want);
    }
    cr_log_info("two gateways: %d sandboxes (%d/%d/%d on nodes 0/1/2) read back through the other "
                "gateway",
                N, per_node[0], per_node[1], per_node[2]);
    destroy_all(g[0], ids, N);
    sbx_client_close(g[0]);
    sbx_client_close(g[1]);
    no_sanitizer_reports();
}

static size_t
body_cb(char *p, size_t size, size_t nmemb, void *arg)
{
    char *buf = arg;
    size_t have = strlen(buf), n = size * nmemb;
    size_t room = 255 - have;
    memcpy(buf + have, p, n < room ? n : room);
    buf[have + (n < room ? n : room)] = '\0';
    return n;
}

/* GET path through gateway j's HTTP front with Host: host; status, body (≤ 255 bytes). */
static long
preview_get(int j, const char *host, const char *path, char body[256])
{
    char url[128], hdr[320];
    snprintf(url, sizeof(url), "http://127.0.0.1:%d%s", cl_env()->gw_http[j], path);
    snprintf(hdr, sizeof(hdr), "Host: %s", host);
    body[0] = '\0';
    CURL *h = curl_easy_init();
    struct curl_slist *hl = curl_slist_append(NULL, hdr);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hl);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_cb);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, body);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 20000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    long status = 0;
    if (curl_easy_perform(h) == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(hl);
    curl_easy_cleanup(h);
    return status;
}

Test(cluster, t7_preview_url_through_either_gateway, .timeout = 120)
{
    restore_base();
    sbx_client *c = gw_client(0);
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    char id[64], cmd[200], pid[128], host[200], body[256];
    sb_id(id, sizeof(id), "p", 0);
    int node = owner_of(&st, id);
    snprintf(cmd, sizeof(cmd), "mkdir -p /workspace/www && printf 'hello %s' > /workspace/www/hello.txt",
             id);
    sbx_exec_opts o = {.command = cmd, .timeout_ms = 20000};
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(sbx_exec(c, id, &o, &r, &err), 0, "exec: %s %s", err.code, err.message);
    sbx_exec_result_free(&r);
    sbx_exec_opts web = {.command = "cd /workspace/www && exec python3 -m http.server 8080 "
                                    "--bind 127.0.0.1"};
    cr_assert_eq(sbx_process_start(c, id, &web, "web", pid, &err), 0, "process.start: %s %s",
                 err.code, err.message);
    sbx_reply *rep = NULL;
    int rc = sbx_call_json(c, "process.waitForPort", id,
                           "{\"processId\":\"web\",\"port\":8080,\"timeout\":30000}", 40000, &rep,
                           &err);
    cr_assert_eq(rc, 0, "waitForPort: %s %s", err.code, err.message);
    sbx_reply_free(rep);
    rc = sbx_call_json(c, "port.expose", id, "{\"port\":8080}", 20000, &rep, &err);
    cr_assert_eq(rc, 0, "port.expose: %s %s", err.code, err.message);
    sbx_str tok = {"", 0};
    sbx_wire_get_str(sbx_reply_result(rep), "token", &tok);
    snprintf(host, sizeof(host), "8080-%s-%.*s.localhost", id, (int)tok.n, tok.p);
    sbx_reply_free(rep);
    cr_assert_gt(tok.n, 0, "port.expose gave no token");
    char want[128];
    snprintf(want, sizeof(want), "hello %s", id);
    for (int j = 0; j < 2; j++) {
        long status = preview_get(j, host, "/hello.txt", body);
        cr_expect_eq(status, 200, "GET through gateway %d's HTTP front: %ld (%s)", j, status, body);
        cr_expect_str_eq(body, want, "GET through gateway %d", j);
    }
    /* a wrong token is refused */
    snprintf(host, sizeof(host), "8080-%s-nottheright_token.localhost", id);
    long bad = preview_get(0, host, "/hello.txt", body);
    cr_expect(bad >= 400, "a wrong token got %ld", bad);
    cr_log_info("preview: a web server in a sandbox on node %d answered through both gateways' "
                "HTTP fronts (relay tcp:%s.%d:7790, secret)",
                node, cl_env()->net, 11 + node);
    sbx_process_kill(c, id, "web", NULL, NULL);
    sbx_destroy(c, id, NULL, NULL);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* etcd stops answering for longer than the lease: every shard fences itself
 * (it cannot renew its lease), writes in flight are refused rather than
 * acknowledged, and once etcd is back the shards re-join, reload what they
 * own from etcd and serve again with nothing acknowledged lost. */
struct outage_op {
    sbx_client *c;
    const char *id;
    bool destroy;
    int rc;
    char code[48];
};

static void *
outage_op_main(void *arg)
{
    struct outage_op *o = arg;
    sbx_error err;
    if (o->destroy) {
        o->rc = sbx_destroy(o->c, o->id, NULL, &err);
    } else {
        sbx_reply *r = NULL;
        o->rc = sbx_call_json(o->c, "env.set", o->id, "{\"vars\":{\"E\":\"during\"}}", 15000, &r,
                              &err);
        sbx_reply_free(r);
    }
    snprintf(o->code, sizeof(o->code), "%s", o->rc ? err.code : "OK");
    if (o->rc)
        sbx_error_free(&err);
    return NULL;
}

Test(cluster, t8_etcd_outage_refuses_writes_and_recovers, .timeout = 200)
{
    restore_base();
    sbx_client *c = gw_client(0);
    char keep[64], gone[64], got[64];
    sb_id(keep, sizeof(keep), "e", 0);
    sb_id(gone, sizeof(gone), "e", 1);
    set_var(c, keep, "E", "before");
    set_var(c, gone, "E", "before");
    get_var(c, gone, "E", got, sizeof(got)); /* a running container to stop */
    cr_assert_eq(cl_signal("etcd", 0, SIGSTOP), 0);
    double t0 = cl_now_ms();
    /* A write and a destroy while etcd is away, before the shards notice:
     * neither may be acknowledged. */
    struct outage_op w = {c, keep, false, 0, ""}, d = {c, gone, true, 0, ""};
    pthread_t tw, td;
    pthread_create(&td, NULL, outage_op_main, &d);
    pthread_create(&tw, NULL, outage_op_main, &w);
    pthread_join(td, NULL);
    pthread_join(tw, NULL);
    double answered = cl_now_ms() - t0;
    while (cl_now_ms() - t0 < 5000)
        cl_sleep_ms(100);
    cr_assert_eq(cl_signal("etcd", 0, SIGCONT), 0);
    double r0 = cl_now_ms();
    converge(BASE, 3, 0, "recovery after the etcd outage");
    cr_log_info("etcd stopped for 5 s: the write answered %s, the destroy %s (both within %.0f "
                "ms); converged %.0f ms after etcd came back",
                w.code, d.code, answered, cl_now_ms() - r0);
    cr_expect(w.rc != 0, "a write was acknowledged while etcd was stopped");
    cr_expect(d.rc != 0, "a destroy was acknowledged while etcd was stopped");
    /* Unacknowledged means unknown, not undone: a transaction etcd read
     * before it stopped is applied when it resumes (as with etcd's own
     * request timeouts).  What must hold is one outcome or the other, the
     * same through either gateway and on a second look (the shard reloads
     * from etcd instead of serving a local state etcd lacks). */
    sbx_client *c1 = gw_client(1);
    char got1[64], again[64];
    get_var(c, keep, "E", got, sizeof(got));
    cr_expect(!strcmp(got, "before") || !strcmp(got, "during"),
              "the write's sandbox has E=%s, neither before nor during it", got);
    get_var(c1, keep, "E", got1, sizeof(got1));
    cr_expect_str_eq(got1, got, "the gateways disagree on the write: %s vs %s", got, got1);
    get_var(c, gone, "E", got, sizeof(got));
    cr_expect(!strcmp(got, "before") || !strcmp(got, ""),
              "the destroyed sandbox has E=%s, neither before nor after the destroy", got);
    cl_sleep_ms(1000);
    get_var(c1, gone, "E", again, sizeof(again));
    cr_expect_str_eq(again, got, "the destroy's outcome changed: %s then %s", got, again);
    cr_log_info("outcomes: the write %s, the destroy %s", !strcmp(got1, "during") ? "applied" : "not applied",
                got[0] ? "not applied" : "applied");
    sbx_client_close(c1);
    sbx_destroy(c, keep, NULL, NULL);
    sbx_destroy(c, gone, NULL, NULL);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* t9: the largest environments a sandbox may hold, written at once by
 * sandboxes of one node, replicate to etcd — and nothing a tenant writes
 * through the API disturbs the node's other sandboxes (a write etcd refused
 * would make the node fence itself and stop every container it runs). */
struct big_env {
    sbx_client *c;
    char id[64];
    int rc;
    char code[48];
};

enum { BIG_VARS = 7, BIG_LEN = 131072 }; /* 7 values of the largest size env.set takes */

static void *
big_env_main(void *arg)
{
    struct big_env *b = arg;
    size_t cap = (size_t)BIG_VARS * (BIG_LEN + 32) + 64;
    char *json = malloc(cap);
    size_t off = (size_t)snprintf(json, cap, "{\"vars\":{");
    for (int k = 0; k < BIG_VARS; k++) {
        off += (size_t)snprintf(json + off, cap - off, "%s\"BIG%d\":\"", k ? "," : "", k);
        memset(json + off, 'a' + k, BIG_LEN);
        off += BIG_LEN;
        json[off++] = '"';
    }
    snprintf(json + off, cap - off, "}}");
    sbx_reply *r = NULL;
    sbx_error err;
    b->rc = sbx_call_json(b->c, "env.set", b->id, json, 60000, &r, &err);
    snprintf(b->code, sizeof(b->code), "%s", b->rc ? err.code : "OK");
    if (b->rc)
        sbx_error_free(&err);
    sbx_reply_free(r);
    free(json);
    return NULL;
}

Test(cluster, t9_largest_environments_replicate_without_disturbing_the_node, .timeout = 150)
{
    restore_base();
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    const int node = 0;
    enum { N = 4 };
    static struct big_env b[N];
    char bystander[64];
    int found = 0;
    for (int k = 0; found <= N && k < 1000; k++) {
        char id[64];
        sb_id(id, sizeof(id), "b", k);
        if (owner_of(&st, id) != node)
            continue;
        if (found < N)
            snprintf(b[found].id, sizeof(b[found].id), "%s", id);
        else
            snprintf(bystander, sizeof(bystander), "%s", id);
        found++;
    }
    cr_assert_eq(found, N + 1, "not enough sandbox IDs on node %d", node);
    sbx_client *c = gw_client(0);
    /* The bystander's container holds a file: it is lost if the node stops
     * its containers. */
    sbx_exec_opts o = {.command = "echo here > /workspace/mark", .timeout_ms = 20000};
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(sbx_exec(c, bystander, &o, &r, &err), 0, "exec: %s", err.code);
    sbx_exec_result_free(&r);
    pthread_t th[N];
    for (int k = 0; k < N; k++) {
        b[k].c = c;
        pthread_create(&th[k], NULL, big_env_main, &b[k]);
    }
    for (int k = 0; k < N; k++)
        pthread_join(th[k], NULL);
    for (int k = 0; k < N; k++)
        cr_expect_eq(b[k].rc, 0, "env.set of %d x %d bytes on %s: %s", BIG_VARS, BIG_LEN, b[k].id,
                     b[k].code);
    /* Read back through the other gateway, from a fresh process. */
    sbx_client *c1 = gw_client(1);
    for (int k = 0; k < N; k++) {
        char got[64];
        get_var(c1, b[k].id, "BIG6", got, sizeof(got));
        cr_expect_eq(strlen(got), sizeof(got) - 1, "%s: BIG6 is not there", b[k].id);
        cr_expect_eq(got[0], 'g', "%s: BIG6 starts with %c", b[k].id, got[0]);
    }
    o.command = "cat /workspace/mark";
    cr_assert_eq(sbx_exec(c, bystander, &o, &r, &err), 0, "exec: %s", err.code);
    cr_expect(r.stdout_data && !strcmp(r.stdout_data, "here\n"),
              "the bystander's container was restarted (its file is gone)");
    sbx_exec_result_free(&r);
    cr_log_info("largest environments: %d sandboxes of node %d set %d x %d bytes at once: %s %s "
                "%s %s",
                N, node, BIG_VARS, BIG_LEN, b[0].code, b[1].code, b[2].code, b[3].code);
    for (int k = 0; k < N; k++)
        sbx_destroy(c, b[k].id, NULL, NULL);
    sbx_destroy(c, bystander, NULL, NULL);
    sbx_client_close(c1);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* t10: a node is drained while a long command runs on it.  The handoff of
 * the command's partition waits for it (up to 10 s, HANDOFF_GRACE_MS in
 * actors/cluster_handoff.c), far longer than the lease lives (TTL 2 s here): the
 * node must keep renewing its lease meanwhile, or it fences itself in the
 * middle of an orderly drain — every request refused, every container
 * stopped, the command interrupted, a new lease once it re-joins. */
struct long_exec {
    sbx_client *c;
    const char *id;
    int rc;
    char code[48];
    char out[64];
    int exit_code;
    double ms;
};

static void *
long_exec_main(void *arg)
{
    struct long_exec *x = arg;
    sbx_exec_opts o = {.command = "sleep 8; echo done", .timeout_ms = 40000};
    sbx_exec_result r;
    sbx_error err;
    double t0 = cl_now_ms();
    x->rc = sbx_exec(x->c, x->id, &o, &r, &err);
    x->ms = cl_now_ms() - t0;
    if (x->rc == 0) {
        snprintf(x->out, sizeof(x->out), "%.*s", (int)r.stdout_len,
                 r.stdout_data ? r.stdout_data : "");
        x->exit_code = r.exit_code;
        snprintf(x->code, sizeof(x->code), "OK");
    } else {
        snprintf(x->code, sizeof(x->code), "%s", err.code);
        sbx_error_free(&err);
    }
    sbx_exec_result_free(&r);
    return NULL;
}

Test(cluster, t10_drain_during_a_long_exec_keeps_the_lease, .timeout = 200)
{
    restore_base();
    sbx_client *c = gw_client(0);
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    const int v = 0;
    int64_t lease0 = st.lease[v];
    cr_assert_neq(lease0, 0, "node %d has no lease", v);
    /* The command's sandbox: the lowest partition node v owns, so that it
     * is in one of the first batches the drain hands off (256 partitions per
     * target, in partition order), while the command still runs. */
    char lid[64] = "";
    uint32_t best = SBX_PARTITIONS;
    for (int k = 0; k < 3000; k++) {
        char id[64];
        sb_id(id, sizeof(id), "x", k);
        uint32_t p = sbx_place_partition(id, strlen(id));
        if (st.owner[p] == v && p < best) {
            best = p;
            snprintf(lid, sizeof(lid), "%s", id);
        }
    }
    cr_assert_lt(best, SBX_PARTITIONS, "no sandbox ID on node %d", v);
    char got[64];
    exec_out(c, lid, "true", got, sizeof(got)); /* its container runs before the drain */
    /* Writes to other sandboxes of node v all along: they keep being
     * served (by v, then by their new owners) with no error. */
    static struct load l;
    load_start(&l, c, "xb", 12, 3, v);
    cl_sleep_ms(500);

    static struct long_exec x;
    memset(&x, 0, sizeof(x));
    x.c = c;
    x.id = lid;
    pthread_t th;
    pthread_create(&th, NULL, long_exec_main, &x);
    cl_sleep_ms(1000);
    double t0 = cl_now_ms();
    drain(c, v, true);
    const int rest[2] = {1, 2};
    converge(rest, 2, 0, "node 0 drained during a long exec");
    double drain_ms = cl_now_ms() - t0;
    pthread_join(th, NULL);
    cl_sleep_ms(500);
    load_stop(&l);
    char errs[512];
    load_errors(&l, errs, sizeof(errs));
    cr_assert_eq(cl_read_state(&st), 0);
    cr_log_info("drain during a 'sleep 8' exec on partition %u: node %d drained in %.0f ms; the "
                "exec answered %s after %.0f ms; lease %lld before, %lld after; %ld writes to the "
                "node's other sandboxes acknowledged, client errors: %s",
                best, v, drain_ms, x.code, x.ms, (long long)lease0, (long long)st.lease[v],
                atomic_load(&l.oks), errs);
    cr_expect_eq(st.lease[v], lease0,
                 "node %d fenced itself during the drain: it re-joined under lease %lld (was "
                 "%lld)",
                 v, (long long)st.lease[v], (long long)lease0);
    /* The command completes (8 s < the 10 s grace), or at most is
     * interrupted with a code that says retry. */
    if (x.rc == 0) {
        cr_expect_eq(x.exit_code, 0, "the long exec exited %d", x.exit_code);
        cr_expect_str_eq(x.out, "done\n", "the long exec's output");
    } else {
        cr_expect_str_eq(x.code, "OPERATION_INTERRUPTED", "the long exec failed with %s", x.code);
    }
    cr_expect_eq(l.ncodes, 0, "writes to node %d's other sandboxes failed during the drain: %s", v,
                 errs);
    load_verify(&l, c, NULL);

    drain(c, v, false);
    converge(BASE, 3, 0, "node 0 undrained");
    sbx_destroy(c, lid, NULL, NULL);
    destroy_all(c, l.ids, l.n);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* ------------------------------------------------------------------------------ */
/* t11's etcd proxy (eproxy.h): node Y is started with it as its first etcd
 * endpoint; it holds the first transaction that writes a given key,
 * unanswered, until the test releases it to etcd (a request that reaches
 * etcd late, as after a long network stall).  Y's etcd client gives up on
 * it after its 3 s timeout, sends the same transaction to etcd itself, its
 * second endpoint (runtime/etcd.c), and goes on talking to etcd directly. */

/* t11: a replication transaction that reaches etcd late — after the
 * sandbox's partition went to another node and came back to the same one —
 * must not be applied: it compares the partition's epoch as well as its
 * owner.  Comparing the owner alone lets it overwrite a write acknowledged
 * since, which the next failover would then lose. */
Test(cluster, t11_a_late_replication_does_not_land_after_the_partition_came_back, .timeout = 200)
{
    restore_base();
    const int y = 2;
    static struct eproxy px;
    ep_start(&px);
    cr_assert_eq(cl_signal("shard", y, SIGTERM), 0);
    cr_assert_eq(cl_wait_exit("shard", y, 30000), 0, "node %d did not stop", y);
    cr_assert_gt(cl_start_via(y, px.url), 0, "cannot start node %d via %s", y, px.url);
    converge(BASE, 3, 0, "node 2 re-joined through the proxy");
    sbx_client *c = gw_client(0);
    static struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    char id[64], got[64];
    for (int k = 0;; k++) {
        sb_id(id, sizeof(id), "late", k);
        if (owner_of(&st, id) == y)
            break;
        cr_assert_lt(k, 1000);
    }
    uint32_t part = sbx_place_partition(id, strlen(id));
    int64_t e1 = st.epoch[part];
    set_var(c, id, "H", "first");

    /* The write at epoch e1: Y's first attempt stays in the proxy; its
     * second, straight to etcd, is applied and the write acknowledged. */
    char key[256];
    snprintf(key, sizeof(key), "/sbx/%s/r/%04u/%s", cl_env()->cluster, part, id);
    ep_hold(&px, key);
    double t0 = cl_now_ms();
    set_var(c, id, "H", "held");
    double held_ms = cl_now_ms() - t0;
    cr_assert(ep_holds(&px), "node %d's transaction did not go through the proxy", y);

    /* The partition leaves Y and comes back: a new epoch, the same owner. */
    drain(c, y, true);
    const int rest[2] = {0, 1};
    converge(rest, 2, 0, "node 2 drained");
    drain(c, y, false);
    converge(BASE, 3, 0, "node 2 undrained");
    cr_assert_eq(cl_read_state(&st), 0);
    cr_assert_eq(st.owner[part], y, "partition %u is on node %d", part, st.owner[part]);
    cr_assert_gt(st.epoch[part], e1, "partition %u kept its epoch %lld", part, (long long)e1);
    set_var(c, id, "H", "later");

    bool applied = true;
    cr_assert_eq(ep_release(&px, &applied), 0, "etcd did not answer the late transaction");
    cr_log_info("late replication: held %.0f ms (the write was acknowledged through etcd "
                "directly); partition %u went from epoch %lld to %lld on node %d; the late "
                "transaction %s",
                held_ms, part, (long long)e1, (long long)st.epoch[part], y,
                applied ? "was APPLIED" : "failed its compare");
    cr_expect(!applied,
              "a transaction of epoch %lld was applied at epoch %lld (same owner, node %d)",
              (long long)e1, (long long)st.epoch[part], y);
    /* etcd keeps the last acknowledged write: what a failover would load. */
    sbx_etcd *etcd;
    cr_assert_eq(sbx_etcd_open(&etcd, cl_env()->etcd, 5000), 0);
    struct sbx_etcd_kv *kvs = NULL;
    size_t n = 0;
    cr_assert_eq(sbx_etcd_range(etcd, key, NULL, &kvs, &n, NULL), 0);
    sbx_etcd_close(etcd);
    cr_assert_eq(n, 1, "no record of %s in etcd", id);
    cr_expect(memmem(kvs[0].value, kvs[0].vlen, "later", 5) != NULL,
              "etcd's record of %s lost the last acknowledged write (H=later)%s", id,
              memmem(kvs[0].value, kvs[0].vlen, "held", 4) ? ": the late one replaced it" : "");
    sbx_etcd_kvs_free(kvs, n);
    get_var(c, id, "H", got, sizeof(got));
    cr_expect_str_eq(got, "later");

    /* Y without the proxy again. */
    ep_stop(&px);
    cr_assert_eq(cl_signal("shard", y, SIGTERM), 0);
    cr_assert_eq(cl_wait_exit("shard", y, 30000), 0, "node %d did not stop", y);
    cr_assert_gt(cl_start("shard", y), 0);
    converge(BASE, 3, 0, "node 2 re-joined without the proxy");
    sbx_destroy(c, id, NULL, NULL);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* ------------------------------------------------------------------------------ */
/* Garbage in etcd: keys the shards never write, written straight to etcd. */

/* Put (val not NULL) or delete the key <prefix>c/<key[0..klen)> through etcd's
 * JSON API: the key may hold a NUL, which sbx_etcd_put cannot send. */
static void
etcd_raw(const char *key, size_t klen, const char *val)
{
    char full[512];
    int pl = snprintf(full, sizeof(full), "/sbx/%s/c/", cl_env()->cluster);
    cr_assert(pl > 0 && (size_t)pl + klen < sizeof(full));
    memcpy(full + pl, key, klen);
    size_t n;
    char *kb = sbx_base64_encode(full, (size_t)pl + klen, &n);
    char *vb = val ? sbx_base64_encode(val, strlen(val), &n) : NULL;
    char body[1024], url[256];
    snprintf(body, sizeof(body), "{\"key\":\"%s\"%s%s%s}", kb, vb ? ",\"value\":\"" : "",
             vb ? vb : "", vb ? "\"" : "");
    snprintf(url, sizeof(url), "%s/v3/kv/%s", cl_env()->etcd, val ? "put" : "deleterange");
    free(kb);
    free(vb);
    CURL *cu = curl_easy_init();
    cr_assert_not_null(cu);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    FILE *devnull = fopen("/dev/null", "w");
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cu, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, devnull);
    CURLcode rc = curl_easy_perform(cu);
    long status = 0;
    curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(cu);
    fclose(devnull);
    cr_assert(rc == CURLE_OK && status == 200, "etcd %s %s: curl %d, HTTP %ld", url, body, rc,
              status);
}

/* Put n keys <prefix>c/<keys[i]> = vals[i] in one etcd transaction: a
 * watch delivers them in one answer. */
static void
etcd_raw_puts(char (*keys)[32], char (*vals)[32], int n)
{
    sbx_buf b;
    sbx_buf_init(&b);
    sbx_buf_appendf(&b, "{\"success\":[");
    for (int i = 0; i < n; i++) {
        char full[128];
        size_t l;
        snprintf(full, sizeof(full), "/sbx/%s/c/%s", cl_env()->cluster, keys[i]);
        char *kb = sbx_base64_encode(full, strlen(full), &l);
        char *vb = sbx_base64_encode(vals[i], strlen(vals[i]), &l);
        sbx_buf_appendf(&b, "%s{\"request_put\":{\"key\":\"%s\",\"value\":\"%s\"}}", i ? "," : "",
                        kb, vb);
        free(kb);
        free(vb);
    }
    sbx_buf_appendf(&b, "]}");
    sbx_buf_append(&b, "", 1);
    char url[256];
    snprintf(url, sizeof(url), "%s/v3/kv/txn", cl_env()->etcd);
    CURL *cu = curl_easy_init();
    cr_assert_not_null(cu);
    struct curl_slist *h = curl_slist_append(NULL, "Content-Type: application/json");
    FILE *devnull = fopen("/dev/null", "w");
    curl_easy_setopt(cu, CURLOPT_URL, url);
    curl_easy_setopt(cu, CURLOPT_POSTFIELDS, b.p);
    curl_easy_setopt(cu, CURLOPT_HTTPHEADER, h);
    curl_easy_setopt(cu, CURLOPT_TIMEOUT_MS, 5000L);
    curl_easy_setopt(cu, CURLOPT_WRITEDATA, devnull);
    CURLcode rc = curl_easy_perform(cu);
    long status = 0;
    curl_easy_getinfo(cu, CURLINFO_RESPONSE_CODE, &status);
    curl_slist_free_all(h);
    curl_easy_cleanup(cu);
    fclose(devnull);
    sbx_buf_free(&b);
    cr_assert(rc == CURLE_OK && status == 200, "etcd txn of %d puts: curl %d, HTTP %ld", n, rc,
              status);
}

/* Whether gateway j's view has `live` live members and a live owner for
 * every partition, within ms; why says what it saw last. */
static bool
gw_view_whole(int j, int live, int ms, char *why, size_t wl)
{
    double until = cl_now_ms() + ms;
    snprintf(why, wl, "gateway %d does not answer", j);
    do {
        sbx_client *c = NULL;
        sbx_error err;
        sbx_reply *r = NULL;
        if (sbx_client_open(&c, cl_env()->gw[j], &err) != 0) {
            sbx_error_free(&err);
        } else if (sbx_call(c, "cluster.status", NULL, NULL, 0, 3000, NULL, &r, &err) != 0) {
            sbx_error_free(&err);
        } else {
            char *js = sbx_reply_json(r, false);
            json_error_t je;
            json_t *jr = js ? json_loads(js, 0, &je) : NULL;
            json_t *cs = json_object_get(jr, "cluster"), *m;
            long unowned = (long)json_integer_value(json_object_get(cs, "partitionsWithoutLiveOwner"));
            int nl = 0;
            size_t k;
            json_array_foreach(json_object_get(cs, "members"), k, m)
                nl += json_is_true(json_object_get(m, "live"));
            bool ok = jr && json_is_true(json_object_get(cs, "synced")) && unowned == 0 && nl == live;
            snprintf(why, wl, "gateway %d: synced %d, %ld partition(s) without a live owner, %d live "
                     "member(s) (want 0 and %d)",
                     j, json_is_true(json_object_get(cs, "synced")), unowned, nl, live);
            json_decref(jr);
            free(js);
            sbx_reply_free(r);
            sbx_client_close(c);
            if (ok)
                return true;
            c = NULL;
        }
        sbx_client_close(c);
        cl_sleep_ms(200);
    } while (cl_now_ms() < until);
    return false;
}

Test(cluster, t12_garbage_in_etcd_leaves_the_views_alone, .timeout = 240)
{
    restore_base();
    sbx_client *c = gw_client(0);
    char id[64], got[64], why[512], k[96];
    sb_id(id, sizeof(id), "e", 0);
    set_var(c, id, "G", "kept");
    unsigned part = sbx_place_partition(id, strlen(id));

    /* Partition keys the shards never write (they write exactly 4 digits),
     * one with a NUL after the real key's name, naming a shard that does not
     * exist; then deleted.  Read leniently, each was partition `part`: its
     * owner became "nobody", then no one, in every view, for good (the
     * shards' claims of it compare a key that has not changed). */
    const char *spellings[] = {"parts/+%u", "parts/ %u", "parts/0%04u", "parts/%04u "};
    size_t kl[5];
    char keys[5][96];
    for (int i = 0; i < 4; i++) {
        kl[i] = (size_t)snprintf(keys[i], sizeof(keys[i]), spellings[i], part);
        etcd_raw(keys[i], kl[i], "nobody");
    }
    kl[4] = (size_t)snprintf(keys[4], sizeof(keys[4]), "parts/%04u", part) + 2;
    keys[4][kl[4] - 1] = 'x'; /* "parts/PPPP\0x" */
    etcd_raw(keys[4], kl[4], "nobody");
    /* Names that never join: 70 drain keys (more than the 64 slots of a
     * view's member table), and one no shard can have. */
    enum { GHOSTS = 70 };
    for (int i = 0; i < GHOSTS; i++) {
        snprintf(k, sizeof(k), "drain/ghost-%d", i);
        etcd_raw(k, strlen(k), "1");
    }
    etcd_raw("drain/no such shard", 19, "1");
    cl_sleep_ms(300);
    for (int i = 0; i < 5; i++)
        etcd_raw(keys[i], kl[i], NULL);

    for (int j = 0; j < 2; j++)
        if (!gw_view_whole(j, 3, 10000, why, sizeof(why)))
            fail_with_logs("the views after garbage partition keys came and went", why);
    get_var(c, id, "G", got, sizeof(got));
    cr_expect_str_eq(got, "kept", "sandbox %s (partition %u) after the garbage", id, part);

    /* A gateway that starts now reads the ghosts' drain keys before the
     * members' (drain/ sorts first): drain keys take no slot of its view. */
    cr_assert_eq(cl_signal("gw", 1, SIGTERM), 0);
    cr_assert_eq(cl_wait_exit("gw", 1, 15000), 0, "gateway 1 did not stop");
    cr_assert_gt(cl_start("gw", 1), 0, "cannot restart gateway 1");
    if (!gw_view_whole(1, 3, 20000, why, sizeof(why)))
        fail_with_logs("a gateway started with 70 drain keys of ghosts in etcd", why);
    sbx_client *c1 = gw_client(1);
    get_var(c1, id, "G", got, sizeof(got));
    cr_expect_str_eq(got, "kept", "sandbox %s through the restarted gateway", id);

    /* 64 partitions owned, in etcd, by names no shard has (a stale or
     * hostile owner): the views give them the slots left (3 + 61: full) and
     * none to the last 3, whose partitions are ownerless at their epoch; the
     * shards take all 64 back (claims compare the owner's name and epoch, or
     * the epoch alone) with their records from etcd, and the names' slots are
     * freed. */
    enum { OWNERS = 64 };
    static char okeys[OWNERS][32], ovals[OWNERS][32];
    for (int i = 0, p = 0; i < OWNERS; p++) {
        if ((unsigned)p == part)
            continue;
        snprintf(okeys[i], sizeof(okeys[i]), "parts/%04d", p);
        snprintf(ovals[i], sizeof(ovals[i]), "owner-%d", i);
        i++;
    }
    etcd_raw_puts(okeys, ovals, OWNERS); /* at once: every view holds 67 names */
    converge(BASE, 3, 0, "partitions of 64 ghost owners taken back");

    /* Node 3's name first shows up at an address nothing listens on (a
     * member key without a lease, draining, so the shards place nothing on
     * it): each gateway opens a socket for its slot; then the key goes and
     * the slot is freed.  When node 3 really joins, the views give it that
     * slot again under a new gen, and each gateway must re-dial the slot's
     * socket to node 3's real address. */
    char n3[64], mk[96], dk[96];
    cl_node_name(3, n3, sizeof(n3));
    snprintf(mk, sizeof(mk), "members/%s", n3);
    snprintf(dk, sizeof(dk), "drain/%s", n3);
    etcd_raw(dk, strlen(dk), "1");
    etcd_raw(mk, strlen(mk), "{\"url\":\"tcp://127.0.0.1:9\",\"relay\":\"\"}");
    for (int j = 0; j < 2; j++)
        if (!gw_view_whole(j, 4, 10000, why, sizeof(why)))
            fail_with_logs("node 3's name at a stale address", why);
    etcd_raw(mk, strlen(mk), NULL);
    etcd_raw(dk, strlen(dk), NULL);
    for (int j = 0; j < 2; j++)
        if (!gw_view_whole(j, 3, 10000, why, sizeof(why)))
            fail_with_logs("node 3's stale name gone", why);

    /* Node 3 joins: its own view and every other has a slot for it, so it
     * takes its partitions, and answers through both gateways. */
    double t0 = cl_now_ms();
    cr_assert_gt(cl_start("shard", 3), 0, "cannot start node 3");
    const int four[4] = {0, 1, 2, 3};
    converge(four, 4, 1, "node 3 joined with 70 drain keys of ghosts in etcd");
    converge(four, 4, 0, "node 3 through gateway 0");
    cr_log_info("garbage: node 3 joined past %d ghost names in %.0f ms", GHOSTS, cl_now_ms() - t0);

    /* Restore: node 3 leaves, the ghosts go. */
    drain(c, 3, true);
    converge(BASE, 3, 0, "node 3 drained");
    cr_assert_eq(cl_signal("shard", 3, SIGTERM), 0);
    cr_assert_eq(cl_wait_exit("shard", 3, 30000), 0, "node 3 did not stop");
    drain(c, 3, false);
    for (int i = 0; i < GHOSTS; i++) {
        snprintf(k, sizeof(k), "drain/ghost-%d", i);
        etcd_raw(k, strlen(k), NULL);
    }
    etcd_raw("drain/no such shard", 19, NULL);
    converge(BASE, 3, 0, "back to three nodes");
    get_var(c, id, "G", got, sizeof(got));
    cr_expect_str_eq(got, "kept");
    sbx_destroy(c, id, NULL, NULL);
    sbx_client_close(c1);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* sandbox.fork in a cluster (docs/persistence.md, "Fork"): a fork owned by
 * the source's node and one owned by another node (its copy sent there,
 * test_cluster_ws.c has the details) are both made, with the source's
 * files. */
Test(cluster, t24_fork_within_a_node_and_across_nodes, .timeout = 150)
{
    restore_base();
    sbx_client *c = gw_client(0);
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    char ids[3][64], out[128];
    sb_id(ids[0], sizeof(ids[0]), "fsrc", 0);
    int src = owner_of(&st, ids[0]);
    bool same = false, other = false;
    for (int k = 1; k < 400 && !(same && other); k++) {
        char id[64];
        sb_id(id, sizeof(id), "fk", k);
        if (!same && owner_of(&st, id) == src) {
            snprintf(ids[1], sizeof(ids[1]), "%s", id);
            same = true;
        } else if (!other && owner_of(&st, id) != src) {
            snprintf(ids[2], sizeof(ids[2]), "%s", id);
            other = true;
        }
    }
    cr_assert(same && other, "no IDs on the wanted nodes");
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call_json(c, "create", ids[0], "{\"workspace\":\"persistent\"}", 30000, &r,
                               &err), 0, "create: %s %s", err.code, err.message);
    sbx_reply_free(r);
    exec_out(c, ids[0], "echo from-source > /workspace/f && echo ok", out, sizeof(out));
    cr_assert_str_eq(out, "ok\n");
    char args[160];
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", ids[2]);
    int rc = sbx_call_json(c, "sandbox.fork", ids[0], args, 60000, &r, &err);
    cr_assert_eq(rc, 0, "fork to another node: %s %s", rc ? err.code : "",
                 rc ? err.message : "");
    sbx_reply_free(r);
    exec_out(c, ids[2], "cat /workspace/f", out, sizeof(out));
    cr_assert_str_eq(out, "from-source\n", "the other node's fork's file");
    snprintf(args, sizeof(args), "{\"ids\":[\"%s\"]}", ids[1]);
    rc = sbx_call_json(c, "sandbox.fork", ids[0], args, 60000, &r, &err);
    cr_assert_eq(rc, 0, "fork on the source's node: %s %s", rc ? err.code : "",
                 rc ? err.message : "");
    sbx_reply_free(r);
    exec_out(c, ids[1], "cat /workspace/f", out, sizeof(out));
    cr_assert_str_eq(out, "from-source\n", "the fork's file");
    destroy_all(c, ids, 3);
    sbx_client_close(c);
    no_sanitizer_reports();
}

/* ------------------------------------------------------------------------------ */
/* t25: a sandbox reaches no member of its cluster (issue 14, always denied). */

#define CD_HOST 201 /* the test host's last byte on the cluster's /24 (nodes are .11-.14) */

/* What t25 made, removed by cd_cleanup (also after a failed assertion). */
static struct {
    pid_t pid[2];    /* the listeners: on the test host, on the bridge's address */
    char ns[64];     /* the test host's netns, "" when none */
    char veth[16];   /* its veth's bridge end */
} cd = {{-1, -1}, "", ""};


static void
cd_cleanup(void)
{
    for (int i = 0; i < 2; i++)
        if (cd.pid[i] > 0) {
            kill(cd.pid[i], SIGKILL);
            waitpid(cd.pid[i], NULL, 0);
            cd.pid[i] = -1;
        }
    if (cd.ns[0])
        test_shf("ip netns delete %s 2>/dev/null; ip link delete %s 2>/dev/null; true", cd.ns,
              cd.veth);
    cd.ns[0] = '\0';
}

/* A child that listens on addr:<a port of the kernel's choosing> in netns ns
 * (NULL: ours) and writes body to each connection; its pid (the port in
 * *port), or -1.  It dies with the test's process. */
static pid_t
cd_listen(const char *ns, const char *addr, const char *body, int *port)
{
    int pp[2];
    if (pipe(pp) < 0)
        return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pp[0]);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char path[128];
        snprintf(path, sizeof(path), "/run/netns/%s", ns ? ns : "");
        int nfd = ns ? open(path, O_RDONLY | O_CLOEXEC) : -1;
        if (ns && (nfd < 0 || setns(nfd, CLONE_NEWNET) < 0))
            _exit(1);
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        struct sockaddr_in sa = {.sin_family = AF_INET};
        socklen_t sl = sizeof(sa);
        if (fd < 0 || inet_pton(AF_INET, addr, &sa.sin_addr) != 1 ||
            bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 16) < 0 ||
            getsockname(fd, (struct sockaddr *)&sa, &sl) < 0)
            _exit(1);
        int p = ntohs(sa.sin_port);
        (void)!write(pp[1], &p, sizeof(p));
        close(pp[1]);
        for (;;) {
            int c = accept(fd, NULL, NULL);
            if (c < 0)
                continue;
            (void)!write(c, body, strlen(body));
            shutdown(c, SHUT_WR);
            close(c);
        }
    }
    close(pp[1]);
    ssize_t n = pid > 0 ? read(pp[0], port, sizeof(*port)) : -1;
    close(pp[0]);
    if (n != (ssize_t)sizeof(*port)) {
        if (pid > 0) {
            kill(pid, SIGKILL);
            waitpid(pid, NULL, 0);
        }
        return -1;
    }
    return pid;
}

/* The line of out that starts with "<target> ", copied to line ("" if none). */
static void
cd_line(const char *out, const char *target, char *line, size_t n)
{
    size_t tl = strlen(target);
    line[0] = '\0';
    for (const char *p = out; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
        if (!strncmp(p, target, tl) && p[tl] == ' ') {
            snprintf(line, n, "%.*s", (int)strcspn(p, "\n"), p);
            return;
        }
}

/* Connect from sandbox id to each "ip:port" of t[0..n) (bash's /dev/tcp,
 * one exec): per target, a line "<ip:port> CONNECTED <what it sent>" or
 * "<ip:port> FAILED <bash's message>", into out. */
static void
cd_probe(sbx_client *c, const char *id, char (*t)[40], int n, char *out, size_t ol)
{
    char cmd[2048];
    int o = snprintf(cmd, sizeof(cmd), "for t in");
    for (int i = 0; i < n; i++)
        o += snprintf(cmd + o, sizeof(cmd) - (size_t)o, " %s", t[i]);
    snprintf(cmd + o, sizeof(cmd) - (size_t)o,
             "; do m=$(timeout 5 bash -c \"exec 3<>/dev/tcp/${t%%:*}/${t#*:} && echo CONNECTED "
             "&& timeout 1 head -c 64 <&3\" 2>&1 | tr '\\n' ' '); case \"$m\" in CONNECTED*) "
             "echo \"$t $m\";; *) echo \"$t FAILED $m\";; esac; done");
    exec_out(c, id, cmd, out, ol);
}

/* Whether out's line of target says the connection was refused. */
static bool
cd_refused(const char *out, const char *target, char *line, size_t n)
{
    cd_line(out, target, line, n);
    return strstr(line, " FAILED ") && strstr(line, "Connection refused");
}

/* Issue 14, always denied (docs/network.md): the cluster's members and
 * etcd are unreachable from a sandbox whatever its policy.  An `egress`
 * sandbox on node 0 whose policy allows the cluster's own /24 (the private
 * range opened by a rule inside it) connects from inside (bash's /dev/tcp)
 * to
 *   - a test host on that /24: a netns of the test's own on the cluster's
 *     bridge (.201) with a listener on a port of the kernel's choosing —
 *     the positive control: it is reached and its banner read, so the
 *     route from a node's sandboxes to the bridge exists and what follows
 *     is refused by the policy, not for want of a route (the bridge's own
 *     address .1 cannot serve: it is etcd's, so always denied);
 *   - every other member's node and relay ports (.(11+j):7701 and :7790;
 *     actors/cluster.c deny_members), the node's own (its --listen and
 *     --relay), etcd's client and peer ports on the bridge's address .1,
 *     and a listener the test opens on .1 (etcd's address: the whole
 *     address is denied, not its port): each is refused (ECONNREFUSED, the
 *     router's reset), although something listens there.
 * Then node 3 joins while the sandbox runs (its router is up): within 5 s
 * of the cluster's convergence, node 3's ports are refused too (the deny
 * thread adds a member to running routers; between its join and that, a
 * sandbox could reach it), the control still reached; node 3 leaves again.
 * The sandbox's partition stays on node 0 throughout (cl_pick_id).
 * The gateways listen on 127.0.0.1 of the root namespace, which no sandbox
 * can route to (127.0.0.0/8 of a sandbox is its own loopback, and always
 * denied at the router too): there is nothing of theirs to probe.  With
 * deny_members disabled this test fails: the other members' ports connect. */
Test(cluster, t25_a_sandbox_reaches_no_member_of_its_cluster, .timeout = 150,
     .fini = cd_cleanup)
{
    restore_base();
    const struct cl_env *e = cl_env();
    char host[32], bridge_ip[32], mark[32], body[40];
    snprintf(host, sizeof(host), "%s.%d", e->net, CD_HOST);
    snprintf(bridge_ip, sizeof(bridge_ip), "%s.1", e->net);
    snprintf(mark, sizeof(mark), "cdeny-%d", (int)getpid());
    snprintf(body, sizeof(body), "%s\n", mark);
    /* Names with the run's tag, as cluster_sup.c names its own (the cluster
     * name is "c<tag>", the bridge "sbxb<tag>", the shard prefix "k<run><tag>"). */
    const char *tag = e->cluster + 1;
    snprintf(cd.veth, sizeof(cd.veth), "sx%scd", tag);
    snprintf(cd.ns, sizeof(cd.ns), "sbx%scd", e->prefix + 1);
    cr_assert_eq(test_shf("ip netns add %s && ip link add %s type veth peer name eth0 netns %s && "
                       "ip link set %s master sbxb%s up && ip -n %s addr add %s/24 dev eth0 && "
                       "ip -n %s link set eth0 up && ip -n %s link set lo up",
                       cd.ns, cd.veth, cd.ns, cd.veth, tag, cd.ns, host, cd.ns, cd.ns),
                 0, "could not make the test host %s on bridge sbxb%s", cd.ns, tag);
    int hport = 0, bport = 0;
    cd.pid[0] = cd_listen(cd.ns, host, body, &hport);
    cr_assert_gt(cd.pid[0], 0, "listener on the test host %s", host);
    cd.pid[1] = cd_listen(NULL, bridge_ip, body, &bport);
    cr_assert_gt(cd.pid[1], 0, "listener on the bridge's address %s", bridge_ip);
    int eport = 0;
    const char *ep = strrchr(e->etcd, ':');
    cr_assert(ep && (eport = atoi(ep + 1)) > 0, "etcd's URL %s", e->etcd);

    sbx_client *c = gw_client(0);
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    const int self = 0, all[4] = {0, 1, 2, 3};
    char id[64];
    cr_assert_geq(cl_pick_id(&st, "cdeny", self, all, 4, self, id, sizeof(id)), 0,
                  "no sandbox ID that node 0 owns with and without node 3");
    char args[256];
    snprintf(args, sizeof(args), "{\"network\":{\"mode\":\"egress\",\"allow\":[\"%s.0/24\"]}}",
             e->net);
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call_json(c, "create", id, args, 60000, &r, &err), 0, "create %s %s: %s %s",
                 id, args, err.code, err.message);
    sbx_reply_free(r);

    /* The targets: [0] the control, then what must be refused; node 3's
     * ports last (probed after it joined). */
    char t[16][40], why[16][48], out[4096], line[512];
    int nt = 0;
    snprintf(t[nt], sizeof(t[nt]), "%s:%d", host, hport);
    snprintf(why[nt++], sizeof(why[0]), "the test host (control)");
    snprintf(t[nt], sizeof(t[nt]), "%s:%d", bridge_ip, eport);
    snprintf(why[nt++], sizeof(why[0]), "etcd's client port");
    snprintf(t[nt], sizeof(t[nt]), "%s:%d", bridge_ip, eport + 1); /* cluster_sup.c start_etcd */
    snprintf(why[nt++], sizeof(why[0]), "etcd's peer port");
    snprintf(t[nt], sizeof(t[nt]), "%s:%d", bridge_ip, bport);
    snprintf(why[nt++], sizeof(why[0]), "a listener on etcd's address");
    for (int j = 0; j < 4; j++) {
        const int ports[2] = {7701, 7790}; /* cluster_int.h NODE_PORT, RELAY_PORT */
        for (int k = 0; k < 2; k++) {
            snprintf(t[nt], sizeof(t[nt]), "%s.%d:%d", e->net, 11 + j, ports[k]);
            snprintf(why[nt++], sizeof(why[0]), "%s node %d's %s port",
                     j == self ? "its own" : "member", j, k ? "relay" : "node");
        }
    }
    const int n3 = nt - 2; /* node 3's two */
    cd_probe(c, id, t, n3, out, sizeof(out));
    cd_line(out, t[0], line, sizeof(line));
    cr_assert(strstr(line, "CONNECTED") && strstr(line, mark),
              "the control: %s (%s) was not reached from %s on node %d: '%s'\n%s", t[0], why[0],
              id, self, line, out);
    int refused = 0;
    for (int i = 1; i < n3; i++) {
        bool ok = cd_refused(out, t[i], line, sizeof(line));
        refused += ok;
        cr_expect(ok, "%s (%s) from %s on node %d: '%s' (want refused)", t[i], why[i], id, self,
                  line);
    }
    cr_log_info("always denied: from node %d, the test host %s reached; %d of %d members' and "
                "etcd's addresses refused", self, t[0], refused, n3 - 1);

    /* Node 3 joins while the sandbox's router is up. */
    cr_assert_gt(cl_start("shard", 3), 0, "cannot start node 3");
    converge(all, 4, 0, "node 3 joined");
    double t0 = cl_now_ms(), waited = -1;
    bool denied = false;
    while (!denied) {
        cd_probe(c, id, t, nt, out, sizeof(out));
        denied = cd_refused(out, t[n3], line, sizeof(line)) &&
                 cd_refused(out, t[n3 + 1], line, sizeof(line));
        waited = cl_now_ms() - t0;
        if (!denied && waited > 5000)
            break;
        if (!denied)
            cl_sleep_ms(200);
    }
    cr_expect(denied, "node 3 joined, and 5 s after the convergence the sandbox on node %d still "
              "reaches it: '%s'\n%s", self, line, out);
    cd_line(out, t[0], line, sizeof(line));
    cr_expect(strstr(line, "CONNECTED") && strstr(line, mark), "the control after node 3 "
              "joined: '%s'", line);
    for (int i = 1; i < n3; i++)
        cr_expect(cd_refused(out, t[i], line, sizeof(line)), "after node 3 joined, %s (%s): '%s' "
                  "(want refused)", t[i], why[i], line);
    cr_log_info("always denied: node 3 joined; its ports %s %.0f ms after the convergence",
                denied ? "refused" : "still reached", waited);
    sbx_destroy(c, id, NULL, NULL);
    sbx_client_close(c);
    cd_cleanup();
    cr_assert_eq(cl_signal("shard", 3, SIGTERM), 0);
    cr_assert_eq(cl_wait_exit("shard", 3, 30000), 0, "node 3 did not stop");
    converge(BASE, 3, 0, "node 3 left");
    no_sanitizer_reports();
}
