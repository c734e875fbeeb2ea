/*
 * sbx — the command-line client of sbx.
 *
 *   sbx [global options] <verb> [verb options] [arguments]
 *
 * Global options (before or after the verb):
 *   --gateway URL   gateway address (default $SBX_GATEWAY, else tcp://127.0.0.1:7700)
 *   --json          machine-readable output: the operation's result as JSON
 *   --timeout D     request deadline, e.g. 30s, 5m (default 5m); every call
 *                   returns by it + 1 s (include/sbx/sbx.h, Deadlines)
 *   --tls-ca F, --tls-cert F, --tls-key F
 *                   PEM files of the deployment CA, this client's certificate
 *                   and key, for tls+tcp:// gateways (default $SBX_TLS_CA,
 *                   $SBX_TLS_CERT, $SBX_TLS_KEY; docs/security.md, Transports)
 *
 * Exit status: `sbx exec` exits with the command's own exit code (124 on
 * timeout, 128+N when killed by signal N); every other verb exits 0 on
 * success and 1 when the operation failed; 2 means a usage error; 125 means
 * sbx itself failed (gateway unreachable, invalid input, shard unavailable)
 * before a command could run.  Errors are printed as "sbx: CODE: message"
 * on stderr (CODE is the stable wire code, see docs/protocol.md).
 */
#include <errno.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../include/sbx/sbx.h"
#include "cli.h"
#include "cli_ops_gen.h"

struct verb {
    const char *name;
    int (*fn)(struct gopts *g, int argc, char **argv);
    const char *args;
    const char *help; /* NULL: the summary of the op whose CLI verb this is (the schema's) */
};

void
cli_print_err(const sbx_error *err)
{
    fprintf(stderr, "sbx: %s: %s\n", err->code[0] ? err->code : "ERROR", err->message);
    if (err->context_json && strcmp(err->context_json, "{}") != 0 && getenv("SBX_DEBUG"))
        fprintf(stderr, "sbx: context: %s\n", err->context_json);
}

sbx_tls_files
cli_tls(const struct gopts *g)
{
    sbx_tls_files t = {
        g->tls.ca ? g->tls.ca : getenv("SBX_TLS_CA"),
        g->tls.cert ? g->tls.cert : getenv("SBX_TLS_CERT"),
        g->tls.key ? g->tls.key : getenv("SBX_TLS_KEY"),
    };
    return t;
}

sbx_client *
cli_connect(struct gopts *g, int *rc)
{
    sbx_client *c = NULL;
    sbx_error err;
    sbx_tls_files tls = cli_tls(g);
    if (sbx_client_open_tls(&c, g->gateway, &tls, &err) != 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        *rc = EXIT_SBX;
        return NULL;
    }
    if (g->timeout_ms > 0)
        sbx_client_set_timeout(c, g->timeout_ms);
    return c;
}

void
cli_print_json(const msgpack_object *res)
{
    char *s = sbx_value_json(res, true);
    if (s) {
        printf("%s\n", s);
        free(s);
    }
}

static void
print_json_result(sbx_reply *r)
{
    cli_print_json(sbx_reply_result(r));
}

/* Run `op` with JSON args, print its result as JSON (--json) or via `human`. */
int
cli_call(struct gopts *g, const char *op, const char *sandbox, const char *args,
            void (*human)(const msgpack_object *res))
{
    int rc = 0;
    sbx_client *c = cli_connect(g, &rc);
    if (!c)
        return rc;
    sbx_reply *r = NULL;
    sbx_error err;
    if (sbx_call_json(c, op, sandbox, args, g->timeout_ms, &r, &err) != 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        sbx_client_close(c);
        return 1;
    }
    if (g->json || !human)
        print_json_result(r);
    else
        human(sbx_reply_result(r));
    sbx_reply_free(r);
    sbx_client_close(c);
    return 0;
}

int
cli_call_enc(struct gopts *g, const char *op, const char *sandbox, sbx_args *a,
             void (*human)(const msgpack_object *res))
{
    return cli_call_enc_check(g, op, sandbox, a, human, NULL);
}

int
cli_call_enc_check(struct gopts *g, const char *op, const char *sandbox, sbx_args *a,
                   void (*human)(const msgpack_object *res),
                   int (*status)(const msgpack_object *res))
{
    int rc = 0;
    sbx_client *c = cli_connect(g, &rc);
    if (!c) {
        sbx_args_free(a);
        return rc;
    }
    sbx_reply *r = NULL;
    sbx_error err;
    if (sbx_call_args(c, op, sandbox, a, g->timeout_ms, &r, &err) != 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        rc = 1;
    } else {
        if (g->json || !human)
            print_json_result(r);
        else
            human(sbx_reply_result(r));
        if (status)
            rc = status(sbx_reply_result(r));
        sbx_reply_free(r);
    }
    sbx_args_free(a);
    sbx_client_close(c);
    return rc;
}

int
cli_follow(struct gopts *g, sbx_client *c, sbx_stream *s, bool raw_output)
{
    sbx_event ev;
    sbx_error err;
    int rc, code = 0;
    (void)c;
    while ((rc = sbx_stream_next(s, &ev, &err)) == 1) {
        /* An error event ends the stream: SESSION_TERMINATED (the command
         * ran `exit N` in its session) carries the command's exit code, as
         * in a plain exec; any other error is sbx failing. */
        bool failed = false;
        if (!strcmp(ev.type, "error")) {
            const msgpack_object *e, *ctx;
            sbx_view cd = {"", 0};
            int64_t ec;
            failed = true;
            if (sbx_get_map(ev.obj, "error", &e) == 0 &&
                sbx_get_str(e, "code", &cd) == 0 && sbx_view_eq(cd, "SESSION_TERMINATED") &&
                sbx_get_map(e, "context", &ctx) == 0 &&
                sbx_get_i64(ctx, "exitCode", &ec) == 0) {
                failed = false;
                code = (int)(ec & 255);
            } else {
                code = EXIT_SBX;
            }
        }
        if (g->json) {
            char *j = sbx_value_json(ev.obj, false);
            if (j) {
                printf("%s\n", j);
                free(j);
            }
            fflush(stdout);
        } else if (raw_output && !strcmp(ev.type, "stdout")) {
            cli_write_full(STDOUT_FILENO, ev.data, ev.data_len);
        } else if (raw_output && !strcmp(ev.type, "stderr")) {
            cli_write_full(STDERR_FILENO, ev.data, ev.data_len);
        } else if (!raw_output && !strcmp(ev.type, "event")) {
            sbx_view t = {"", 0}, p = {"", 0};
            sbx_get_str(ev.obj, "eventType", &t);
            sbx_get_str(ev.obj, "path", &p);
            printf("%-10.*s %.*s\n", (int)t.n, t.p, (int)p.n, p.p);
            fflush(stdout);
        } else if (failed) {
            const msgpack_object *e;
            sbx_view m = {"", 0}, cd = {"ERROR", 5};
            if (sbx_get_map(ev.obj, "error", &e) == 0) {
                sbx_get_str(e, "code", &cd);
                sbx_get_str(e, "message", &m);
            }
            fprintf(stderr, "sbx: %.*s: %.*s\n", (int)cd.n, cd.p, (int)m.n, m.p);
        }
        if (ev.has_exit_code)
            code = ev.exit_code & 255;
    }
    if (rc < 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        return EXIT_SBX;
    }
    return code;
}

/* ------------------------------------------------------------------------------ */

/* print_shell_exit — for `--json exec`: when the command ended its session's
 * shell (`exit N`: SESSION_TERMINATED, whose context holds exitCode, stdout
 * and stderr), print that context as the result with `"error":
 * "SESSION_TERMINATED"` added (a script tells a shell exit from an ordinary
 * one by it) and return N & 255; -1 for any other error. */
static int
print_shell_exit(const sbx_error *err)
{
    int rc = -1;
    json_t *ctx = NULL, *ec = NULL;
    json_error_t je;
    if (!strcmp(err->code, "SESSION_TERMINATED") && err->context_json)
        ctx = json_loads(err->context_json, 0, &je);
    if (ctx)
        ec = json_object_get(ctx, "exitCode");
    if (json_is_integer(ec)) {
        json_object_set_new(ctx, "error", json_string(err->code));
        char *s = json_dumps(ctx, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
        if (s)
            printf("%s\n", s);
        free(s);
        rc = (int)(json_integer_value(ec) & 255);
    }
    json_decref(ctx);
    return rc;
}

static int
v_exec(struct gopts *g, int argc, char **argv)
{
    sbx_exec_opts o = {0};
    char **env = cli_xcalloc((size_t)argc + 1, sizeof(char *));
    size_t nenv = 0;
    bool read_stdin = false, stream = false;
    const char *sandbox = NULL;
    int i, rc = 0;
    for (i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            i++;
            break;
        }
        if (!strcmp(a, "--cwd") && i + 1 < argc)
            o.cwd = argv[++i];
        else if (!strcmp(a, "--env") && i + 1 < argc)
            env[nenv++] = argv[++i];
        else if (!strcmp(a, "--timeout") && i + 1 < argc) {
            o.timeout_ms = cli_parse_ms(argv[++i]);
            if (o.timeout_ms < 0) {
                fprintf(stderr, "sbx exec: bad --timeout '%s'\n", argv[i]);
                free(env);
                return EXIT_USAGE;
            }
        } else if (!strcmp(a, "--session") && i + 1 < argc)
            o.session_id = argv[++i];
        else if (!strcmp(a, "--sessionless"))
            o.sessionless = true;
        else if (!strcmp(a, "--stdin"))
            read_stdin = true;
        else if (!strcmp(a, "--stream"))
            stream = true;
        else if (!sandbox && a[0] != '-')
            sandbox = a;
        else if (sandbox && a[0] != '-') {
            break; /* the shell string */
        } else {
            fprintf(stderr, "sbx exec: unknown option '%s'\n", a);
            free(env);
            return EXIT_USAGE;
        }
    }
    if (!sandbox || i >= argc) {
        fprintf(stderr, "usage: sbx exec ID [options] -- CMD ARGS...\n"
                        "       sbx exec ID [options] 'shell string'\n");
        free(env);
        return EXIT_USAGE;
    }
    bool argv_mode = i > 0 && !strcmp(argv[i - 1], "--");
    if (argv_mode)
        o.argv = (const char *const *)&argv[i];
    else if (i == argc - 1)
        o.command = argv[i];
    else {
        fprintf(stderr, "sbx exec: give one shell string, or '--' followed by a command and "
                        "its arguments\n");
        free(env);
        return EXIT_USAGE;
    }
    o.env = nenv ? (const char *const *)env : NULL;
    char *in = NULL;
    size_t in_len = 0;
    if (read_stdin) {
        if ((rc = cli_read_all(STDIN_FILENO, &in, &in_len)) != 0) {
            fprintf(stderr, "sbx exec: reading stdin: %s\n", strerror(-rc));
            free(env);
            return EXIT_SBX;
        }
        o.stdin_data = in;
        o.stdin_len = in_len;
        o.has_stdin = true;
    }
    sbx_client *c = cli_connect(g, &rc);
    if (!c) {
        free(env);
        free(in);
        return rc;
    }
    sbx_exec_result res;
    sbx_error err;
    if (stream) {
        /* Live output as the command produces it. */
        sbx_stream *st;
        if (sbx_exec_stream(c, sandbox, &o, &st, &err) != 0) {
            cli_print_err(&err);
            sbx_error_free(&err);
            rc = EXIT_SBX;
        } else {
            rc = cli_follow(g, c, st, true);
            sbx_stream_close(st);
        }
    } else if (g->json) {
        /* Print the result map itself.  The arguments are the library's
         * encoding of o, as for sbx_exec: both forms accept and refuse the
         * same input (an --env entry without '=' is VALIDATION_FAILED). */
        sbx_reply *r = NULL;
        if (sbx_exec_reply(c, sandbox, &o, &r, &err) != 0) {
            if ((rc = print_shell_exit(&err)) < 0) {
                cli_print_err(&err);
                rc = EXIT_SBX;
            }
            sbx_error_free(&err);
        } else {
            print_json_result(r);
            int64_t code = 0;
            sbx_get_i64(sbx_reply_result(r), "exitCode", &code);
            rc = (int)(code & 255);
            sbx_reply_free(r);
        }
    } else if (sbx_exec(c, sandbox, &o, &res, &err) != 0) {
        if (!strcmp(err.code, "SESSION_TERMINATED") && res.stdout_data) {
            /* `exit N` ended the session's shell: that is the command's exit
             * code; the next command gets a fresh shell. */
            cli_write_full(STDOUT_FILENO, res.stdout_data, res.stdout_len);
            cli_write_full(STDERR_FILENO, res.stderr_data, res.stderr_len);
            rc = res.exit_code & 255;
        } else {
            cli_print_err(&err);
            rc = EXIT_SBX;
        }
        sbx_error_free(&err);
        sbx_exec_result_free(&res);
    } else {
        fflush(stdout);
        cli_write_full(STDOUT_FILENO, res.stdout_data, res.stdout_len);
        cli_write_full(STDERR_FILENO, res.stderr_data, res.stderr_len);
        if (res.stdout_truncated || res.stderr_truncated)
            fprintf(stderr, "sbx: output truncated (%llu stdout / %llu stderr bytes produced)\n",
                    (unsigned long long)res.stdout_bytes, (unsigned long long)res.stderr_bytes);
        if (strcmp(res.cause, "EXITED") && strcmp(res.cause, "TIMEOUT") && res.cause[0])
            fprintf(stderr, "sbx: command ended: %s\n", res.cause);
        rc = res.exit_code & 255;
        sbx_exec_result_free(&res);
    }
    sbx_client_close(c);
    free(in);
    free(env);
    return rc;
}

static int
need_id(int argc, char **argv, const char *verb, const char **id)
{
    if (argc < 1 || argv[0][0] == '-') {
        fprintf(stderr, "usage: sbx %s ID\n", verb);
        return EXIT_USAGE;
    }
    *id = argv[0];
    return 0;
}

static void
human_destroy(const msgpack_object *res)
{
    bool d = false;
    sbx_view id = {"", 0};
    sbx_get_bool(res, "destroyed", &d);
    sbx_get_str(res, "id", &id);
    printf("%.*s: %s\n", (int)id.n, id.p, d ? "destroyed" : "did not exist");
}

static int
v_destroy(struct gopts *g, int argc, char **argv)
{
    const char *id;
    int rc = need_id(argc, argv, "destroy", &id);
    return rc ? rc : cli_call(g, "destroy", id, NULL, human_destroy);
}

static void
human_ping(const msgpack_object *res)
{
    (void)res;
    printf("ok\n");
}

static int
v_ping(struct gopts *g, int argc, char **argv)
{
    const char *id;
    int rc = need_id(argc, argv, "ping", &id);
    return rc ? rc : cli_call(g, "ping", id, NULL, human_ping);
}

static void
fmt_time(int64_t ms, char *out, size_t n)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;
    localtime_r(&t, &tm);
    strftime(out, n, "%Y-%m-%d %H:%M:%S", &tm);
}

static void
human_list(const msgpack_object *res)
{
    const msgpack_object *arr;
    if (sbx_get_array(res, "sandboxes", &arr) != 0)
        return;
    printf("%-32s %-10s %-12s %-20s %s\n", "ID", "STATE", "SHARD", "CREATED", "GENERATION");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *s = &arr->via.array.ptr[i];
        sbx_view id = {"", 0}, st = {"", 0}, sh = {"", 0};
        int64_t created = 0, gen = 0;
        char when[32];
        sbx_get_str(s, "id", &id);
        sbx_get_str(s, "state", &st);
        sbx_get_str(s, "shard", &sh);
        sbx_get_i64(s, "createdAt", &created);
        sbx_get_i64(s, "generation", &gen);
        fmt_time(created, when, sizeof(when));
        printf("%-32.*s %-10.*s %-12.*s %-20s %lld\n", (int)id.n, id.p, (int)st.n, st.p,
               (int)sh.n, sh.p, when, (long long)gen);
    }
}

static int
v_list(struct gopts *g, int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return cli_call(g, "list", NULL, NULL, human_list);
}

static void
human_sandbox_status(const msgpack_object *res)
{
    const msgpack_object *s;
    if (sbx_get_map(res, "sandbox", &s) != 0)
        return;
    char *j = sbx_value_json(s, true);
    if (j) {
        printf("%s\n", j);
        free(j);
    }
}

static void
human_cluster_status(const msgpack_object *res)
{
    const msgpack_object *gw, *arr;
    if (sbx_get_map(res, "gateway", &gw) == 0) {
        sbx_view name = {"", 0}, listen = {"", 0};
        int64_t up = 0;
        sbx_get_str(gw, "name", &name);
        sbx_get_str(gw, "listen", &listen);
        sbx_get_i64(gw, "uptimeMs", &up);
        printf("gateway %.*s on %.*s, up %llds\n", (int)name.n, name.p, (int)listen.n, listen.p,
               (long long)(up / 1000));
    }
    if (sbx_get_array(res, "shards", &arr) != 0)
        return;
    printf("%-14s %-12s %-10s %-8s %-8s %-6s %s\n", "SHARD", "HEALTH", "PARTITIONS", "ACTORS",
           "RUNNING", "POOL", "URL");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *s = &arr->via.array.ptr[i], *st = NULL;
        sbx_view name = {"", 0}, health = {"", 0}, url = {"", 0};
        int64_t parts = 0, actors = 0, running = 0, pool = 0;
        sbx_get_str(s, "name", &name);
        sbx_get_str(s, "health", &health);
        sbx_get_str(s, "url", &url);
        sbx_get_i64(s, "partitions", &parts);
        if (sbx_get_map(s, "status", &st) == 0) {
            sbx_get_i64(st, "actors", &actors);
            sbx_get_i64(st, "running", &running);
            sbx_get_i64(st, "pool", &pool);
        }
        printf("%-14.*s %-12.*s %-10lld %-8lld %-8lld %-6lld %.*s\n", (int)name.n, name.p,
               (int)health.n, health.p, (long long)parts, (long long)actors, (long long)running,
               (long long)pool, (int)url.n, url.p);
    }
}

/* The cluster part of cluster.status: members, partitions, epochs. */
static void
human_cluster_members(const msgpack_object *res)
{
    const msgpack_object *cl, *arr;
    human_cluster_status(res);
    if (sbx_get_map(res, "cluster", &cl) != 0) {
        printf("\nnot a cluster: a fixed set of shards (sbxd dev, or sbxd gateway --shard …)\n");
        return;
    }
    sbx_view name = {"", 0}, etcd = {"", 0};
    int64_t rev = 0, orphan = 0;
    bool synced = false;
    sbx_get_str(cl, "name", &name);
    sbx_get_str(cl, "etcd", &etcd);
    sbx_get_i64(cl, "revision", &rev);
    sbx_get_i64(cl, "partitionsWithoutLiveOwner", &orphan);
    sbx_get_bool(cl, "synced", &synced);
    printf("\ncluster %.*s (etcd %.*s, revision %lld%s), partitions without a live owner: %lld\n",
           (int)name.n, name.p, (int)etcd.n, etcd.p, (long long)rev, synced ? "" : ", not synced",
           (long long)orphan);
    if (sbx_get_array(cl, "members", &arr) != 0)
        return;
    printf("%-14s %-6s %-9s %-10s %-10s %-10s %s\n", "NODE", "LIVE", "DRAINING", "PARTITIONS",
           "MIN EPOCH", "MAX EPOCH", "URL");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *m = &arr->via.array.ptr[i];
        sbx_view n = {"", 0}, url = {"", 0};
        bool live = false, draining = false;
        int64_t parts = 0, minep = 0, maxep = 0;
        sbx_get_str(m, "name", &n);
        sbx_get_str(m, "url", &url);
        sbx_get_bool(m, "live", &live);
        sbx_get_bool(m, "draining", &draining);
        sbx_get_i64(m, "partitions", &parts);
        sbx_get_i64(m, "minEpoch", &minep);
        sbx_get_i64(m, "maxEpoch", &maxep);
        printf("%-14.*s %-6s %-9s %-10lld %-10lld %-10lld %.*s\n", (int)n.n, n.p,
               live ? "yes" : "NO", draining ? "yes" : "no", (long long)parts, (long long)minep,
               (long long)maxep, (int)url.n, url.p);
    }
}

static void
human_drain(const msgpack_object *res)
{
    sbx_view shard = {"", 0};
    bool draining = false;
    sbx_get_str(res, "shard", &shard);
    sbx_get_bool(res, "draining", &draining);
    printf("%.*s: %s\n", (int)shard.n, shard.p,
           draining ? "draining (its partitions move to the other nodes; `sbx cluster status` "
                      "shows progress)"
                    : "no longer draining");
}

/* sbx cluster (status | drain NODE | undrain NODE) */
static int
v_cluster(struct gopts *g, int argc, char **argv)
{
    if (argc == 0 || !strcmp(argv[0], "status"))
        return cli_call(g, "cluster.status", NULL, NULL, human_cluster_members);
    if ((!strcmp(argv[0], "drain") || !strcmp(argv[0], "undrain")) && argc == 2) {
        char args[160];
        snprintf(args, sizeof(args), "{\"shard\":\"%s\",\"drain\":%s}", argv[1],
                 !strcmp(argv[0], "drain") ? "true" : "false");
        if (strchr(argv[1], '"') || strchr(argv[1], '\\')) {
            fprintf(stderr, "sbx cluster: bad node name\n");
            return 2;
        }
        return cli_call(g, "cluster.drain", NULL, args, human_drain);
    }
    fprintf(stderr, "usage: sbx cluster [status | drain NODE | undrain NODE]\n");
    return 2;
}

static int
v_status(struct gopts *g, int argc, char **argv)
{
    if (argc >= 1 && argv[0][0] != '-')
        return cli_call(g, "status", argv[0], NULL, human_sandbox_status);
    return cli_call(g, "cluster.status", NULL, NULL, human_cluster_status);
}

static void
human_create(const msgpack_object *res)
{
    bool created = false;
    sbx_get_bool(res, "created", &created);
    printf("%s\n", created ? "created" : "already existed");
}

#define CREATE_USAGE                                                                         \
    "usage: sbx create ID [--image REF [--start]] [--workspace ephemeral|persistent] [--disk 2G]\n" \
    "                     [--memory 256M] [--pids N] [--cpu MILLICPUS]\n"                     \
    "                     [--network none|egress] [--allow CIDR[:PORT]|NAME[:PORT]]...\n"   \
    "                     [--deny CIDR[:PORT]|NAME]... [--max-connections N]\n"              \
    "                     [--bandwidth MBIT_PER_S]\n"

static int
v_create(struct gopts *g, int argc, char **argv)
{
    const char *id;
    int rc = need_id(argc, argv, "create", &id);
    if (rc)
        return rc;
    /* Network options: collected first, sent as {network: {mode, allow, deny}}. */
    const char *mode = NULL;
    uint64_t maxconn = 0, bandwidth = 0;
    const char *allow[64], *deny[64];
    int nallow = 0, ndeny = 0;
    sbx_args *a = sbx_args_new();
    /* --start (no value): the image's Entrypoint + Cmd as a background process. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--start")) {
            sbx_args_kbool(a, "start", true);
            memmove(&argv[i], &argv[i + 1], (size_t)(argc - i - 1) * sizeof(char *));
            argc--;
            i--;
        }
    }
    /* --image REF (docs/images.md) and --workspace MODE (docs/persistence.md)
     * first: they are top-level arguments. */
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--image") || !strcmp(argv[i], "--workspace")) {
            sbx_args_kstr(a, argv[i] + 2, argv[i + 1]);
            argv[i] = argv[i + 1] = NULL;
        } else if (!strcmp(argv[i], "--disk")) {
            /* The workspace's size (e.g. 2G; persistent or ephemeral), in bytes. */
            uint64_t v;
            if (cli_parse_size(argv[i + 1], &v) != 0 || v > INT64_MAX) {
                fprintf(stderr, "sbx create: --disk must be a size (e.g. 2G)\n");
                sbx_args_free(a);
                return EXIT_USAGE;
            }
            sbx_args_kint(a, "disk", (int64_t)v);
            argv[i] = argv[i + 1] = NULL;
        }
    }
    sbx_args_kmap(a, "limits");
    for (int i = 1; i < argc; i += 2) {
        uint64_t v;
        if (!argv[i])
            continue; /* --image, --workspace, --disk, above */
        /* An option without its value is a usage error, not ignored. */
        const char *k = argv[i], *val = i + 1 < argc ? argv[i + 1] : "";
        if (i + 1 < argc && !strcmp(k, "--network")) {
            mode = val;
            continue;
        }
        if (!strcmp(k, "--max-connections")) {
            if (cli_parse_size(val, &maxconn) != 0 || maxconn == 0 || maxconn > 65536) {
                fprintf(stderr, "sbx create: --max-connections must be 1..65536\n");
                sbx_args_free(a);
                return EXIT_USAGE;
            }
            continue;
        }
        if (!strcmp(k, "--bandwidth")) {
            if (cli_parse_size(val, &bandwidth) != 0 || bandwidth == 0 || bandwidth > 100000) {
                fprintf(stderr, "sbx create: --bandwidth is in Mbit/s, 1..100000\n");
                sbx_args_free(a);
                return EXIT_USAGE;
            }
            continue;
        }
        if (i + 1 < argc && (!strcmp(k, "--allow") || !strcmp(k, "--deny"))) {
            bool al = !strcmp(k, "--allow");
            if ((al ? nallow : ndeny) >= 64) {
                fprintf(stderr, "sbx create: at most 64 %s rules\n", k + 2);
                sbx_args_free(a);
                return EXIT_USAGE;
            }
            if (al)
                allow[nallow++] = val;
            else
                deny[ndeny++] = val;
            continue;
        }
        if (!strcmp(k, "--memory") && cli_parse_size(val, &v) == 0)
            k = "memory";
        else if (!strcmp(k, "--pids") && cli_parse_size(val, &v) == 0)
            k = "pids";
        else if (!strcmp(k, "--cpu") && cli_parse_size(val, &v) == 0)
            k = "cpu";
        else {
            fprintf(stderr, CREATE_USAGE);
            sbx_args_free(a);
            return EXIT_USAGE;
        }
        if (v > INT64_MAX) {
            fprintf(stderr, "sbx create: %s is too large\n", argv[i]);
            sbx_args_free(a);
            return EXIT_USAGE;
        }
        sbx_args_kint(a, k, (int64_t)v);
    }
    sbx_args_end(a);
    if (mode || nallow || ndeny || maxconn || bandwidth) {
        sbx_args_kmap(a, "network");
        if (mode)
            sbx_args_kstr(a, "mode", mode);
        if (maxconn)
            sbx_args_kint(a, "maxConnections", (int64_t)maxconn);
        if (bandwidth)
            sbx_args_kint(a, "bandwidth", (int64_t)bandwidth);
        if (nallow) {
            sbx_args_karray(a, "allow");
            for (int i = 0; i < nallow; i++)
                sbx_args_str(a, allow[i]);
            sbx_args_end(a);
        }
        if (ndeny) {
            sbx_args_karray(a, "deny");
            for (int i = 0; i < ndeny; i++)
                sbx_args_str(a, deny[i]);
            sbx_args_end(a);
        }
        sbx_args_end(a);
    }
    return cli_call_enc(g, "create", id, a, human_create);
}

static void
human_images(const msgpack_object *res)
{
    const msgpack_object *arr;
    if (sbx_get_array(res, "images", &arr) != 0)
        return;
    printf("%-20s %-8s %-12s %s\n", "DIGEST", "LAYERS", "SIZE", "NAMES");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *o = &arr->via.array.ptr[i], *names = NULL;
        sbx_view d = {"", 0};
        int64_t layers = 0, size = 0;
        sbx_get_str(o, "digest", &d);
        sbx_get_i64(o, "layers", &layers);
        sbx_get_i64(o, "size", &size);
        printf("%-20.*s %-8lld %-12lld", (int)CLI_MIN(d.n, 19), d.p, (long long)layers,
               (long long)size);
        if (sbx_get_array(o, "names", &names) == 0) {
            for (uint32_t k = 0; k < names->via.array.size; k++) {
                const msgpack_object *nm = &names->via.array.ptr[k];
                if (nm->type == MSGPACK_OBJECT_STR)
                    printf("%s%.*s", k ? "," : "", (int)nm->via.str.size, nm->via.str.ptr);
            }
        }
        printf("\n");
    }
}

/* sbx image (import PATH [NAME] | pull REF [NAME] | list | inspect REF | rm REF) */
/* sbx template build NAME --from REF --run CMD [--run CMD …] [--step-timeout MS] */
static int
v_template(struct gopts *g, int argc, char **argv)
{
    const char *from = NULL;
    int nrun = 0;
    int64_t step_ms = 0;
    bool ok = argc >= 2 && !strcmp(argv[0], "build") && argv[1][0] != '-';
    for (int i = 2; ok && i < argc; i += 2) {
        if (i + 1 >= argc)
            ok = false;
        else if (!strcmp(argv[i], "--from"))
            from = argv[i + 1];
        else if (!strcmp(argv[i], "--run"))
            nrun++;
        else if (!strcmp(argv[i], "--step-timeout"))
            step_ms = strtoll(argv[i + 1], NULL, 10);
        else
            ok = false;
    }
    if (!ok || !from || nrun == 0) {
        fprintf(stderr, "usage: sbx template build NAME --from REF --run 'CMD' [--run 'CMD' …] "
                        "[--step-timeout MS]\n");
        return EXIT_USAGE;
    }
    sbx_args *a = sbx_args_new();
    sbx_args_kstr(a, "name", argv[1]);
    sbx_args_kstr(a, "from", from);
    if (step_ms > 0)
        sbx_args_kint(a, "stepTimeout", step_ms);
    sbx_args_karray(a, "run");
    for (int i = 2; i + 1 < argc; i += 2)
        if (!strcmp(argv[i], "--run"))
            sbx_args_str(a, argv[i + 1]);
    sbx_args_end(a);
    return cli_call_enc(g, "template.build", NULL, a, NULL);
}

static int
v_image(struct gopts *g, int argc, char **argv)
{
    static const struct {
        const char *verb, *op, *key;
        int min, max;
    } sub[] = {{"import", "image.import", "path", 2, 3}, {"pull", "image.pull", "ref", 2, 3},
               {"list", "image.list", NULL, 1, 1},       {"inspect", "image.inspect", "image", 2, 2},
               {"rm", "image.rm", "image", 2, 2}};
    for (size_t i = 0; argc >= 1 && i < sizeof(sub) / sizeof(sub[0]); i++) {
        if (strcmp(argv[0], sub[i].verb) != 0 || argc < sub[i].min || argc > sub[i].max)
            continue;
        sbx_args *a = sbx_args_new();
        if (sub[i].key)
            sbx_args_kstr(a, sub[i].key, argv[1]);
        if (argc == 3)
            sbx_args_kstr(a, "name", argv[2]);
        return cli_call_enc(g, sub[i].op, NULL, a, sub[i].key ? NULL : human_images);
    }
    fprintf(stderr, "usage: sbx image (import PATH [NAME] | pull REF [NAME] | list | inspect REF "
                    "| rm REF)\n");
    return EXIT_USAGE;
}

/* sbx tenant (create|set) NAME [--max-sandboxes N] [--creates-per-second N] [--max-memory SIZE]
 * [--max-cpus MILLICPUS] [--max-disk SIZE] [--max-streams N] | list | delete NAME (admin keys;
 * set is create: every quota not given is back at its default; docs/security.md §6) */
static int
v_tenant(struct gopts *g, int argc, char **argv)
{
    if (argc >= 2 && argc % 2 == 0 && (!strcmp(argv[0], "create") || !strcmp(argv[0], "set"))) {
        sbx_args *a = sbx_args_new();
        sbx_args_kstr(a, "tenant", argv[1]);
        bool ok = true;
        uint64_t sz;
        for (int i = 2; ok && i + 1 < argc; i += 2) {
            if (!strcmp(argv[i], "--max-sandboxes"))
                sbx_args_kint(a, "maxSandboxes", strtoll(argv[i + 1], NULL, 10));
            else if (!strcmp(argv[i], "--creates-per-second"))
                sbx_args_kint(a, "createsPerSecond", strtoll(argv[i + 1], NULL, 10));
            else if (!strcmp(argv[i], "--max-cpus"))
                sbx_args_kint(a, "maxCpus", strtoll(argv[i + 1], NULL, 10));
            else if (!strcmp(argv[i], "--max-streams"))
                sbx_args_kint(a, "maxStreams", strtoll(argv[i + 1], NULL, 10));
            else if ((!strcmp(argv[i], "--max-memory") || !strcmp(argv[i], "--max-disk")) &&
                     cli_parse_size(argv[i + 1], &sz) == 0)
                sbx_args_kint(a, argv[i][6] == 'm' ? "maxMemoryBytes" : "maxDiskBytes",
                              (int64_t)sz);
            else
                ok = false;
        }
        if (ok)
            return cli_call_enc(g, "tenant.create", NULL, a, NULL);
        sbx_args_free(a);
    } else if (argc == 1 && !strcmp(argv[0], "list")) {
        return cli_call_enc(g, "tenant.list", NULL, sbx_args_new(), NULL);
    } else if (argc == 2 && !strcmp(argv[0], "delete")) {
        sbx_args *a = sbx_args_new();
        sbx_args_kstr(a, "tenant", argv[1]);
        return cli_call_enc(g, "tenant.delete", NULL, a, NULL);
    }
    fprintf(stderr, "usage: sbx tenant ((create|set) NAME [--max-sandboxes N] [--creates-per-second "
                    "N] [--max-memory SIZE] [--max-cpus MILLICPUS] [--max-disk SIZE] [--max-streams "
                    "N] | list | delete NAME)\n");
    return EXIT_USAGE;
}

/* sbx key create TENANT [--admin] | list [TENANT] | revoke KEYID (admin keys; the
 * new key is printed once: only its hash is kept) */
static int
v_key(struct gopts *g, int argc, char **argv)
{
    if ((argc == 2 || (argc == 3 && !strcmp(argv[2], "--admin"))) && !strcmp(argv[0], "create")) {
        sbx_args *a = sbx_args_new();
        sbx_args_kstr(a, "tenant", argv[1]);
        sbx_args_kstr(a, "scope", argc == 3 ? "admin" : "tenant");
        return cli_call_enc(g, "key.create", NULL, a, NULL);
    } else if ((argc == 1 || argc == 2) && !strcmp(argv[0], "list")) {
        sbx_args *a = sbx_args_new();
        if (argc == 2)
            sbx_args_kstr(a, "tenant", argv[1]);
        return cli_call_enc(g, "key.list", NULL, a, NULL);
    } else if (argc == 2 && !strcmp(argv[0], "revoke")) {
        sbx_args *a = sbx_args_new();
        sbx_args_kstr(a, "keyId", argv[1]);
        return cli_call_enc(g, "key.revoke", NULL, a, NULL);
    }
    fprintf(stderr, "usage: sbx key (create TENANT [--admin] | list [TENANT] | revoke KEYID)\n");
    return EXIT_USAGE;
}

/* sbx backup create ID DIR [--name N] [--ttl SECONDS] [--exclude PATTERN]… [--gitignore] |
 * restore ID BACKUP DIR | list | delete BACKUP (docs/persistence.md, "Backups") */
static int
v_backup(struct gopts *g, int argc, char **argv)
{
    if (argc >= 3 && !strcmp(argv[0], "create")) {
        bool ok = true, gitignore = false;
        int nex = 0;
        for (int i = 3; ok && i < argc; i += 2) {
            if (!strcmp(argv[i], "--gitignore")) {
                gitignore = true;
                i--; /* a flag: no value */
            } else if (i + 1 >= argc)
                ok = false;
            else if (!strcmp(argv[i], "--exclude"))
                nex++;
            else if (strcmp(argv[i], "--name") && strcmp(argv[i], "--ttl"))
                ok = false;
        }
        if (ok) {
            sbx_args *a = sbx_args_new();
            sbx_args_kstr(a, "dir", argv[2]);
            for (int i = 3; i < argc; i += 2) {
                if (!strcmp(argv[i], "--gitignore"))
                    i--;
                else if (!strcmp(argv[i], "--name"))
                    sbx_args_kstr(a, "name", argv[i + 1]);
                else if (!strcmp(argv[i], "--ttl"))
                    sbx_args_kint(a, "ttl", strtoll(argv[i + 1], NULL, 10));
            }
            if (gitignore)
                sbx_args_kbool(a, "gitignore", true);
            if (nex) {
                sbx_args_karray(a, "excludes");
                for (int i = 3; i < argc; i += 2)
                    if (!strcmp(argv[i], "--gitignore"))
                        i--;
                    else if (!strcmp(argv[i], "--exclude"))
                        sbx_args_str(a, argv[i + 1]);
                sbx_args_end(a);
            }
            return cli_call_enc(g, "backup.create", argv[1], a, NULL);
        }
    } else if (argc == 4 && !strcmp(argv[0], "restore")) {
        sbx_args *a = sbx_args_new();
        sbx_args_kstr(a, "id", argv[2]);
        sbx_args_kstr(a, "dir", argv[3]);
        return cli_call_enc(g, "backup.restore", argv[1], a, NULL);
    } else if (argc == 1 && !strcmp(argv[0], "list")) {
        return cli_call_enc(g, "backup.list", NULL, sbx_args_new(), NULL);
    } else if (argc == 2 && !strcmp(argv[0], "delete")) {
        sbx_args *a = sbx_args_new();
        sbx_args_kstr(a, "id", argv[1]);
        return cli_call_enc(g, "backup.delete", NULL, a, NULL);
    }
    fprintf(stderr, "usage: sbx backup (create ID DIR [--name N] [--ttl SECONDS] [--exclude "
                    "PATTERN]... [--gitignore] | restore ID BACKUP DIR | list | delete BACKUP)\n");
    return EXIT_USAGE;
}

/* sbx fork FROM ID... (sandbox.fork; docs/persistence.md, "Fork") */
static int
v_fork(struct gopts *g, int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: sbx fork FROM ID...\n");
        return EXIT_USAGE;
    }
    sbx_args *a = sbx_args_new();
    sbx_args_karray(a, "ids");
    for (int i = 1; i < argc; i++)
        sbx_args_str(a, argv[i]);
    sbx_args_end(a);
    return cli_call_enc(g, "sandbox.fork", argv[0], a, NULL);
}

static int
v_call(struct gopts *g, int argc, char **argv)
{
    if (argc < 1) {
        fprintf(stderr, "usage: sbx call OP [ID|-] [JSON-ARGS]\n");
        return EXIT_USAGE;
    }
    const char *op = argv[0];
    const char *id = argc >= 2 && strcmp(argv[1], "-") ? argv[1] : NULL;
    const char *args = argc >= 3 ? argv[2] : NULL;
    /* Refused here as the gateway would refuse it (same code, same message,
     * same exit status 1), before connecting: nothing is sent. */
    const char *code;
    char why[512];
    if (cli_check_call(op, id, args, &code, why, sizeof(why)) != 0) {
        fprintf(stderr, "sbx: %s: %s\n", code, why);
        return 1;
    }
    return cli_call(g, op, id, args, NULL);
}

static int v_help(struct gopts *g, int argc, char **argv);

static const struct verb verbs[] = {
    {"exec", v_exec, "ID [--cwd DIR] [--env K=V]... [--timeout D] [--session S|--sessionless] "
                     "[--stdin] [--stream] (-- CMD ARGS... | 'shell string')", NULL},
    {"session", v_session, "(create|get|list|delete) ID [SESSION] [--cwd DIR] [--env K=V] "
                           "[--timeout D]",
     "manage sessions: persistent shells keeping cwd, variables and functions"},
    {"start", v_start, "ID [--id P] [--session S] [--cwd DIR] [--env K=V] [--timeout D] "
                       "(-- CMD ARGS... | 'shell string')", NULL},
    {"ps", v_ps, "ID", NULL},
    {"kill", v_kill, "ID (PROCESS | --all)", NULL},
    {"logs", v_logs, "ID PROCESS [-f]", NULL},
    {"wait", v_wait, "ID PROCESS (--log TEXT [--regex] | --port N [--tcp] [--path /p] | --exit) "
                     "[--timeout D]",
     "wait until a process logs a line, serves a port, or exits (--exit: exit with its code)"},
    {"write", v_write, "ID PATH [--content TEXT]", NULL},
    {"read", v_read, "ID PATH", NULL},
    {"ls", v_ls, "ID [PATH] [-r] [-a]", NULL},
    {"mkdir", v_mkdir, "ID PATH [-p]", NULL},
    {"rm", v_rm, "ID PATH", NULL},
    {"mv", v_mv, "ID SOURCE DESTINATION", NULL},
    {"watch", v_watch, "ID PATH [--include G]... [--exclude G]... [--no-recursive]", NULL},
    {"changes", v_changes, "ID PATH [--since VERSION]", NULL},
    {"git-checkout", v_git_checkout, "ID URL [--branch B] [--dir DIR] [--depth N]", NULL},
    {"env", v_env, "ID K=V... [-u K]...", NULL},
    {"code", v_code, "ID [--lang python|javascript|typescript] [--context CTX] [--timeout D] "
                     "[--stream] ('code' | -f FILE)", NULL},
    {"contexts", v_contexts, "ID", NULL},
    {"context", v_context, "(create ID [--lang L] [--cwd DIR] [--env K=V] | delete ID CTX)",
     "create or delete a code context"},
    {"configure", v_configure, "ID [--sleep-after D] [--keep-alive on|off]", NULL},
    {"create", v_create, "ID [--image REF [--start]] [--workspace ephemeral|persistent] [--disk 2G] [--memory 256M] [--pids N] [--cpu MILLICPUS] [--network none|egress] [--allow CIDR[:PORT]|NAME[:PORT]]... [--deny CIDR[:PORT]|NAME]... [--max-connections N] [--bandwidth MBIT]", NULL},
    {"destroy", v_destroy, "ID", NULL},
    {"list", v_list, "", NULL},
    {"status", v_status, "[ID]", "status of a sandbox, or of the gateway and shards"},
    {"cluster", v_cluster, "[status | drain NODE | undrain NODE]",
     "nodes, health, partitions and epochs of a cluster; drain a node (its partitions move away)"},
    {"image", v_image, "(import PATH [NAME] | pull REF [NAME] | list | inspect REF | rm REF)",
     "the node's image store (docs/images.md): PATH is on the server's machine"},
    {"template", v_template, "build NAME --from REF --run 'CMD' [--run 'CMD' …]",
     "bake build steps into a new image (docs/images.md, Templates)"},
    {"backup", v_backup, "(create ID DIR [--name N] [--ttl SECONDS] [--exclude PATTERN]... "
                         "[--gitignore] | restore ID BACKUP DIR | list | delete BACKUP)",
     "backups of a sandbox's directory in the node's store (docs/persistence.md, Backups)"},
    {"fork", v_fork, "FROM ID...", NULL},
    {"tenant", v_tenant, "((create|set) NAME [--max-sandboxes N] [--creates-per-second N] "
     "[--max-memory SIZE] [--max-cpus MILLICPUS] [--max-disk SIZE] [--max-streams N] | list | "
     "delete NAME)",
     "tenants and their quotas (admin keys; docs/security.md §6)"},
    {"key", v_key, "(create TENANT [--admin] | list [TENANT] | revoke KEYID)",
     "API keys of tenants: a created key is shown once (admin keys; docs/security.md §6)"},
    {"ping", v_ping, "ID", NULL},
    {"call", v_call, "OP [ID|-] [JSON]", "send any operation of docs/protocol.md; print the result"},
    {"mcp", v_mcp, "", "serve the Model Context Protocol on stdin/stdout: sandbox tools for AI agents "
                       "(docs/mcp.md)"},
    {"help", v_help, "[OP|VERB]", "this help; with OP or VERB: its arguments, units, bounds"},
    {NULL, NULL, NULL, NULL},
};

/* verb_help — a verb's summary: the schema's summary of the op it runs
 * (runtime/ops.yaml `cli`), or, for a verb of several ops, its own. */
static const char *
verb_help(const struct verb *v)
{
    const struct cli_op *op = v->help ? NULL : cli_op_of_verb(v->name);
    return op ? op->summary : v->help ? v->help : "";
}

/* sbx help [OP|VERB] */
static int
v_help(struct gopts *g, int argc, char **argv)
{
    (void)g;
    if (argc >= 1) {
        const struct verb *vb = NULL;
        for (const struct verb *v = verbs; v->name; v++)
            if (!strcmp(v->name, argv[0]))
                vb = v;
        if (vb)
            printf("usage: sbx %s %s\n  %s\n\n", vb->name, vb->args, verb_help(vb));
        if (cli_help_op(argv[0]) != 0 && !vb) {
            fprintf(stderr, "sbx help: no verb or operation '%s' (sbx help lists them)\n",
                    argv[0]);
            return EXIT_USAGE;
        }
        return 0;
    }
    printf("usage: sbx [--gateway URL] [--json] [--timeout D] [--tls-ca F --tls-cert F --tls-key F] "
           "<verb> [arguments]\n\nverbs:\n");
    for (const struct verb *v = verbs; v->name; v++)
        printf("  %-8s %s\n           %s\n", v->name, verb_help(v), v->args);
    cli_help_ops();
    printf("\nexit status: `exec` exits with the command's code (124 timeout, 128+N signal);\n"
           "`wait --exit` with the process's code; `code` exits 1 when the code raised an error;\n"
           "other verbs 0 = ok, 1 = the operation failed; 2 = usage; 125 = sbx failed before\n"
           "the command ran.  Errors print \"sbx: CODE: message\" (docs/protocol.md lists codes).\n");
    return 0;
}

int
main(int argc, char **argv)
{
    struct gopts g = {0};
    char **rest = cli_xcalloc((size_t)argc + 1, sizeof(char *));
    int nrest = 0;
    const struct verb *verb = NULL;
    bool done_globals = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!done_globals || !verb) {
            if (!strcmp(a, "--gateway") && i + 1 < argc) {
                g.gateway = argv[++i];
                continue;
            }
            if (!strncmp(a, "--gateway=", 10)) {
                g.gateway = a + 10;
                continue;
            }
            if (!strcmp(a, "--json")) {
                g.json = true;
                continue;
            }
            static const char *const tls_flags[] = {"--tls-ca", "--tls-cert", "--tls-key"};
            const char **tls_vals[] = {&g.tls.ca, &g.tls.cert, &g.tls.key};
            bool tls_flag = false;
            for (size_t k = 0; k < 3 && !tls_flag; k++) {
                size_t n = strlen(tls_flags[k]);
                if (!strcmp(a, tls_flags[k]) && i + 1 < argc) {
                    *tls_vals[k] = argv[++i];
                    tls_flag = true;
                } else if (!strncmp(a, tls_flags[k], n) && a[n] == '=') {
                    *tls_vals[k] = a + n + 1;
                    tls_flag = true;
                }
            }
            if (tls_flag)
                continue;
            if ((!strcmp(a, "--timeout") && !verb) && i + 1 < argc) {
                g.timeout_ms = cli_parse_ms(argv[++i]);
                continue;
            }
            if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
                if (!verb) {
                    free(rest);
                    return v_help(&g, 0, NULL);
                }
                char *name = (char *)verb->name;
                free(rest);
                return v_help(&g, 1, &name);
            }
        }
        if (!verb) {
            for (const struct verb *v = verbs; v->name; v++)
                if (!strcmp(v->name, a))
                    verb = v;
            if (!verb) {
                fprintf(stderr, "sbx: unknown verb '%s' (try sbx help)\n", a);
                free(rest);
                return EXIT_USAGE;
            }
            continue;
        }
        if (!strcmp(a, "--"))
            done_globals = true;
        rest[nrest++] = argv[i];
    }
    if (g.timeout_ms < 0) {
        fprintf(stderr, "sbx: bad --timeout (a duration: 30s, 5m, or milliseconds)\n");
        free(rest);
        return EXIT_USAGE;
    }
    if (!verb) {
        v_help(&g, 0, NULL);
        free(rest);
        return EXIT_USAGE;
    }
    int rc = verb->fn(&g, nrest, rest);
    free(rest);
    return rc;
}
