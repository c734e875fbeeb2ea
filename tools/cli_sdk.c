/*
 * cli_sdk.c — the `sbx` verbs for the SDK surface: sessions, background
 * processes, files, watch, git, environment and lifecycle settings.  Each
 * verb maps onto one operation of docs/protocol.md; `--json` prints that
 * operation's result as JSON.  Usage lines are in tools/sbx.c's verb table.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

/* getopt_long over a verb's arguments (argv[0] is the first argument). */
struct opts {
    int argc;
    char **argv;
};

static void
opts_init(struct opts *o, const char *verb, int argc, char **argv)
{
    o->argv = cli_xcalloc((size_t)argc + 2, sizeof(char *));
    o->argv[0] = (char *)verb;
    for (int i = 0; i < argc; i++)
        o->argv[i + 1] = argv[i];
    o->argc = argc + 1;
    optind = 1;
    opterr = 1;
}

static int
usage(const char *u)
{
    fprintf(stderr, "usage: sbx %s\n", u);
    return EXIT_USAGE;
}

/* ------------------------------------------------------------------------------ */
/* sessions */

static void
human_session(const msgpack_object *res)
{
    const msgpack_object *s = res, *arr;
    if (sbx_get_array(res, "sessions", &arr) == 0) {
        printf("%-24s %-8s %-6s %s\n", "SESSION", "SHELL", "QUEUED", "CWD");
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            const msgpack_object *x = &arr->via.array.ptr[i];
            sbx_view id = {"", 0}, cwd = {"", 0};
            bool run = false;
            int64_t q = 0;
            sbx_get_str(x, "id", &id);
            sbx_get_str(x, "cwd", &cwd);
            sbx_get_bool(x, "shellRunning", &run);
            sbx_get_i64(x, "queued", &q);
            printf("%-24.*s %-8s %-6lld %.*s\n", (int)id.n, id.p, run ? "running" : "-",
                   (long long)q, (int)cwd.n, cwd.p);
        }
        return;
    }
    sbx_get_map(res, "session", &s);
    sbx_view id = {"", 0}, cwd = {"", 0};
    sbx_get_str(s, "id", &id);
    if (!id.n)
        sbx_get_str(res, "sessionId", &id);
    sbx_get_str(s, "cwd", &cwd);
    printf("%.*s%s%.*s\n", (int)id.n, id.p, cwd.n ? " " : "", (int)cwd.n, cwd.p);
}

int
v_session(struct gopts *g, int argc, char **argv)
{
    const char *u = "session (create|get|list|delete) ID [SESSION] [--cwd DIR] [--env K=V]... "
                    "[--timeout D]";
    if (argc < 2)
        return usage(u);
    const char *sub = argv[0], *id = argv[1];
    struct opts o;
    opts_init(&o, "sbx session", argc - 2, argv + 2);
    static const struct option lo[] = {{"cwd", 1, 0, 'c'}, {"env", 1, 0, 'e'},
                                       {"timeout", 1, 0, 't'}, {0, 0, 0, 0}};
    sbx_args *e = sbx_args_new();
    int ch, rc = 0;
    char *cwd = NULL;
    int64_t tmo = 0;
    const char **env = cli_xcalloc((size_t)o.argc + 1, sizeof(char *));
    size_t nenv = 0;
    while ((ch = getopt_long(o.argc, o.argv, "", lo, NULL)) != -1) {
        if (ch == 'c')
            cwd = optarg;
        else if (ch == 't' && (tmo = cli_parse_ms(optarg)) >= 0)
            ;
        else if (ch == 'e' && strchr(optarg, '=') && optarg[0] != '=') {
            env[nenv++] = optarg;
        } else {
            rc = usage(u);
            goto out;
        }
    }
    const char *sid = optind < o.argc ? o.argv[optind] : NULL;
    const char *op;
    if (!strcmp(sub, "list")) {
        op = "session.list";
    } else if (!strcmp(sub, "create") || !strcmp(sub, "get") || !strcmp(sub, "delete")) {
        op = !strcmp(sub, "create") ? "session.create" : !strcmp(sub, "get") ? "session.get"
                                                                              : "session.delete";
        if (!sid && strcmp(sub, "create") != 0) {
            rc = usage(u);
            goto out;
        }
        if (sid)
            sbx_args_kstr(e, "id", sid);
        if (cwd)
            sbx_args_kstr(e, "cwd", cwd);
        if (tmo > 0)
            sbx_args_kint(e, "commandTimeoutMs", tmo);
        if (nenv) {
            sbx_args_kmap(e, "env");
            for (size_t k = 0; k < nenv; k++) {
                const char *eq = strchr(env[k], '=');
                sbx_args_strn(e, env[k], (size_t)(eq - env[k]));
                sbx_args_str(e, eq + 1);
            }
            sbx_args_end(e);
        }
    } else {
        rc = usage(u);
        goto out;
    }
    rc = cli_call_enc(g, op, id, e, human_session);
    free(o.argv);
    free(env);
    return rc;
out:
    free(o.argv);
    sbx_args_free(e);
    free(env);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* processes */

static void
human_ps(const msgpack_object *res)
{
    const msgpack_object *arr;
    if (sbx_get_array(res, "processes", &arr) != 0)
        return;
    printf("%-20s %-7s %-10s %-5s %s\n", "ID", "PID", "STATUS", "EXIT", "COMMAND");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *p = &arr->via.array.ptr[i];
        sbx_view id = {"", 0}, st = {"", 0}, cmd = {"", 0};
        int64_t pid = 0, code = -1;
        sbx_get_str(p, "id", &id);
        sbx_get_str(p, "status", &st);
        sbx_get_str(p, "command", &cmd);
        sbx_get_i64(p, "pid", &pid);
        bool has = sbx_get_i64(p, "exitCode", &code) == 0;
        char ex[16] = "-";
        if (has)
            snprintf(ex, sizeof(ex), "%lld", (long long)code);
        printf("%-20.*s %-7lld %-10.*s %-5s %.*s\n", (int)id.n, id.p, (long long)pid, (int)st.n,
               st.p, ex, (int)CLI_MIN(cmd.n, (size_t)60), cmd.p);
    }
}

int
v_ps(struct gopts *g, int argc, char **argv)
{
    if (argc < 1)
        return usage("ps ID");
    return cli_call(g, "process.list", argv[0], NULL, human_ps);
}

int
v_start(struct gopts *g, int argc, char **argv)
{
    const char *u = "start ID [--id PROCESS] [--session S] [--cwd DIR] [--env K=V]... "
                    "[--timeout D] (-- CMD ARGS... | 'shell string')";
    /* Everything after "--" is the command's argv; before it, options and
     * the positional ID (and a shell string when there is no "--"). */
    int dd = -1;
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--")) {
            dd = i;
            break;
        }
    struct opts o;
    opts_init(&o, "sbx start", dd >= 0 ? dd : argc, argv);
    static const struct option lo[] = {{"id", 1, 0, 'i'},  {"session", 1, 0, 's'},
                                       {"cwd", 1, 0, 'c'}, {"env", 1, 0, 'e'},
                                       {"timeout", 1, 0, 't'}, {0, 0, 0, 0}};
    const char *pid = NULL, *session = NULL, *cwd = NULL;
    int64_t tmo = 0;
    char **env = cli_xcalloc((size_t)argc + 1, sizeof(char *));
    size_t nenv = 0;
    int ch, rc;
    while ((ch = getopt_long(o.argc, o.argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'i': pid = optarg; break;
        case 's': session = optarg; break;
        case 'c': cwd = optarg; break;
        case 'e': env[nenv++] = optarg; break;
        case 't': tmo = cli_parse_ms(optarg); break;
        default: free(env); free(o.argv); return usage(u);
        }
    }
    int npos = o.argc - optind;
    if (tmo < 0 || npos < 1 || (dd >= 0 ? npos != 1 || dd + 1 >= argc : npos != 2)) {
        free(env);
        free(o.argv);
        return usage(u);
    }
    const char *id = o.argv[optind];
    sbx_exec_opts eo = {.cwd = cwd, .env = nenv ? (const char *const *)env : NULL,
                        .timeout_ms = tmo, .session_id = session};
    if (dd >= 0)
        eo.argv = (const char *const *)&argv[dd + 1];
    else
        eo.command = o.argv[optind + 1];
    sbx_client *c = cli_connect(g, &rc);
    if (!c) {
        free(env);
        free(o.argv);
        return rc;
    }
    char got[128];
    sbx_error err;
    rc = sbx_process_start(c, id, &eo, pid, got, &err);
    if (rc) {
        cli_print_err(&err);
        sbx_error_free(&err);
        rc = 1;
    } else if (g->json) {
        printf("{\"processId\": \"%s\"}\n", got);
    } else {
        printf("%s\n", got);
    }
    sbx_client_close(c);
    free(env);
    free(o.argv);
    return rc;
}

static void
human_killed(const msgpack_object *res)
{
    sbx_view id = {"", 0}, st = {"", 0};
    int64_t code = 0, n = -1;
    if (sbx_get_i64(res, "killedCount", &n) == 0) {
        printf("%lld process(es) killed\n", (long long)n);
        return;
    }
    sbx_get_str(res, "processId", &id);
    sbx_get_str(res, "status", &st);
    sbx_get_i64(res, "exitCode", &code);
    printf("%.*s: %.*s (exit %lld)\n", (int)id.n, id.p, (int)st.n, st.p, (long long)code);
}

int
v_kill(struct gopts *g, int argc, char **argv)
{
    if (argc < 2)
        return usage("kill ID (PROCESS | --all)");
    if (!strcmp(argv[1], "--all"))
        return cli_call(g, "process.killAll", argv[0], NULL, human_killed);
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "processId", argv[1]);
    return cli_call_enc(g, "process.kill", argv[0], e, human_killed);
}

int
v_logs(struct gopts *g, int argc, char **argv)
{
    const char *u = "logs ID PROCESS [-f|--follow]";
    bool follow = false;
    const char *pos[2] = {NULL, NULL};
    int np = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-f") || !strcmp(argv[i], "--follow"))
            follow = true;
        else if (np < 2)
            pos[np++] = argv[i];
        else
            return usage(u);
    }
    if (np != 2)
        return usage(u);
    int rc = 0;
    sbx_client *c = cli_connect(g, &rc);
    if (!c)
        return rc;
    sbx_error err;
    if (!follow) {
        sbx_reply *r = NULL;
        sbx_args *e = sbx_args_new();
        sbx_args_kstr(e, "processId", pos[1]);
        rc = sbx_call_args(c, "process.logs", pos[0], e, 0, &r, &err);
        sbx_args_free(e);
        if (rc) {
            cli_print_err(&err);
            sbx_error_free(&err);
            rc = 1;
        } else if (g->json) {
            cli_print_json(sbx_reply_result(r));
        } else {
            sbx_view out = {"", 0}, er = {"", 0};
            sbx_get_bytes(sbx_reply_result(r), "stdout", &out);
            sbx_get_bytes(sbx_reply_result(r), "stderr", &er);
            fflush(stdout);
            cli_write_full(STDOUT_FILENO, out.p, out.n);
            cli_write_full(STDERR_FILENO, er.p, er.n);
        }
        sbx_reply_free(r);
        sbx_client_close(c);
        return rc;
    }
    char sid[160];
    snprintf(sid, sizeof(sid), "proc:%s", pos[1]);
    sbx_stream *s;
    if (sbx_stream_open(c, pos[0], sid, 0, &s, &err) != 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        sbx_client_close(c);
        return 1;
    }
    rc = cli_follow(g, c, s, true);
    sbx_stream_close(s);
    sbx_client_close(c);
    return rc;
}

static void
human_wait(const msgpack_object *res)
{
    sbx_view line;
    int64_t v;
    if (sbx_get_str(res, "line", &line) == 0)
        printf("%.*s\n", (int)line.n, line.p);
    else if (sbx_get_i64(res, "statusCode", &v) == 0)
        printf("ready (HTTP %lld)\n", (long long)v);
    else if (sbx_get_i64(res, "exitCode", &v) == 0)
        printf("exited %lld\n", (long long)v);
    else
        printf("ready\n");
}

/* `sbx wait --exit` exits with the process's own code, as wait(1) in a
 * shell does (a killed process has 128+N from the agent already). */
static int
exit_status_of(const msgpack_object *res)
{
    int64_t v;
    return sbx_get_i64(res, "exitCode", &v) == 0 ? (int)(v & 255) : 0;
}

int
v_wait(struct gopts *g, int argc, char **argv)
{
    const char *u = "wait ID PROCESS (--log TEXT [--regex] | --port N [--tcp] [--path /p] "
                    "[--status N] | --exit) [--timeout D]";
    struct opts o;
    opts_init(&o, "sbx wait", argc, argv);
    static const struct option lo[] = {
        {"log", 1, 0, 'l'},  {"regex", 0, 0, 'r'},  {"port", 1, 0, 'p'}, {"tcp", 0, 0, 'T'},
        {"path", 1, 0, 'P'}, {"status", 1, 0, 's'}, {"exit", 0, 0, 'x'}, {"timeout", 1, 0, 't'},
        {0, 0, 0, 0}};
    const char *log = NULL, *path = NULL;
    bool regex = false, tcp = false, ex = false;
    long port = 0, status = 0;
    int64_t tmo = 0;
    int ch;
    while ((ch = getopt_long(o.argc, o.argv, "", lo, NULL)) != -1) {
        switch (ch) {
        case 'l': log = optarg; break;
        case 'r': regex = true; break;
        case 'p': port = atol(optarg); break;
        case 'T': tcp = true; break;
        case 'P': path = optarg; break;
        case 's': status = atol(optarg); break;
        case 'x': ex = true; break;
        case 't': tmo = cli_parse_ms(optarg); break;
        default: free(o.argv); return usage(u);
        }
    }
    if (o.argc - optind != 2 || tmo < 0 || (!!log + !!port + ex) != 1) {
        free(o.argv);
        return usage(u);
    }
    const char *id = o.argv[optind], *pid = o.argv[optind + 1];
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "processId", pid);
    if (tmo)
        sbx_args_kint(e, "timeout", tmo);
    const char *op;
    if (log) {
        op = "process.waitForLog";
        sbx_args_kstr(e, "pattern", log);
        sbx_args_kbool(e, "regex", regex);
    } else if (port) {
        op = "process.waitForPort";
        sbx_args_kint(e, "port", port);
        sbx_args_kstr(e, "mode", tcp ? "tcp" : "http");
        if (path)
            sbx_args_kstr(e, "path", path);
        if (status)
            sbx_args_kint(e, "status", status);
    } else {
        op = "process.waitForExit";
    }
    free(o.argv);
    return cli_call_enc_check(g, op, id, e, human_wait, ex ? exit_status_of : NULL);
}

/* ------------------------------------------------------------------------------ */
/* files */

static void
human_ok(const msgpack_object *res)
{
    (void)res;
}

int
v_write(struct gopts *g, int argc, char **argv)
{
    const char *u = "write ID PATH [--content TEXT] [--session S]   (without --content: stdin)";
    struct opts o;
    opts_init(&o, "sbx write", argc, argv);
    static const struct option lo[] = {{"content", 1, 0, 'c'}, {"session", 1, 0, 's'},
                                       {0, 0, 0, 0}};
    const char *content = NULL, *session = NULL;
    int ch;
    while ((ch = getopt_long(o.argc, o.argv, "", lo, NULL)) != -1) {
        if (ch == 'c')
            content = optarg;
        else if (ch == 's')
            session = optarg;
        else {
            free(o.argv);
            return usage(u);
        }
    }
    if (o.argc - optind != 2) {
        free(o.argv);
        return usage(u);
    }
    char *in = NULL;
    size_t in_len = 0;
    int rc;
    if (!content && (rc = cli_read_all(STDIN_FILENO, &in, &in_len)) != 0) {
        fprintf(stderr, "sbx write: reading stdin: %s\n", strerror(-rc));
        free(o.argv);
        return EXIT_SBX;
    }
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", o.argv[optind + 1]);
    if (content)
        sbx_args_kbin(e, "content", content, strlen(content));
    else
        sbx_args_kbin(e, "content", in, in_len);
    if (session)
        sbx_args_kstr(e, "sessionId", session);
    rc = cli_call_enc(g, "file.write", o.argv[optind], e, human_ok);
    free(in);
    free(o.argv);
    return rc;
}

static int cli_start_stream(struct gopts *g, const char *op, const char *id, sbx_args *e,
                            sbx_client **cp, sbx_stream **sp);

/* write one file.readStream chunk to stdout: `data` is the text itself
 * (encoding utf-8) or the base64 of the bytes.  0 or -1. */
static int
write_chunk(const msgpack_object *ev)
{
    sbx_view data = {"", 0}, enc = {"", 0};
    sbx_get_str(ev, "data", &data);
    sbx_get_str(ev, "encoding", &enc);
    if (!sbx_view_eq(enc, "base64"))
        return cli_write_full(STDOUT_FILENO, data.p, data.n) == 0 ? 0 : -1;
    char *raw = NULL;
    size_t n = 0;
    int rc = sbx_base64_to_bytes(data.p, data.n, &raw, &n) == 0 &&
                     cli_write_full(STDOUT_FILENO, raw, n) == 0
                 ? 0
                 : -1;
    free(raw);
    return rc;
}

/*
 * sbx read ID PATH — the file's bytes on stdout.  Read through
 * file.readStream (chunks of at most 64 KiB), so a file of any size comes
 * through in bounded memory, where file.read stops at its cap
 * (FILE_TOO_LARGE).  With --json: file.read's result (content, encoding,
 * mimeType, …).
 */
int
v_read(struct gopts *g, int argc, char **argv)
{
    if (argc != 2)
        return usage("read ID PATH   (prints the file's bytes)");
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", argv[1]);
    if (g->json)
        return cli_call_enc(g, "file.read", argv[0], e, NULL);
    sbx_client *c = NULL;
    sbx_stream *s = NULL;
    int rc = cli_start_stream(g, "file.readStream", argv[0], e, &c, &s);
    if (rc)
        return rc;
    sbx_event ev;
    sbx_error err;
    int n;
    while ((n = sbx_stream_next(s, &ev, &err)) == 1) {
        if (!strcmp(ev.type, "chunk") && write_chunk(ev.obj) != 0) {
            fprintf(stderr, "sbx: cannot write the file's bytes to stdout\n");
            rc = EXIT_SBX;
            break;
        }
        if (!strcmp(ev.type, "error")) {
            const msgpack_object *eo;
            sbx_view m = {"", 0}, cd = {"ERROR", 5};
            if (sbx_get_map(ev.obj, "error", &eo) == 0) {
                sbx_get_str(eo, "code", &cd);
                sbx_get_str(eo, "message", &m);
            }
            fprintf(stderr, "sbx: %.*s: %.*s\n", (int)cd.n, cd.p, (int)m.n, m.p);
            rc = 1;
        }
    }
    if (n < 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        rc = EXIT_SBX;
    }
    sbx_stream_close(s);
    sbx_client_close(c);
    return rc;
}

static void
human_ls(const msgpack_object *res)
{
    const msgpack_object *arr;
    if (sbx_get_array(res, "files", &arr) != 0)
        return;
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *f = &arr->via.array.ptr[i];
        sbx_view rel = {"", 0}, type = {"", 0}, mode = {"", 0};
        int64_t size = 0;
        sbx_get_str(f, "relativePath", &rel);
        sbx_get_str(f, "type", &type);
        sbx_get_str(f, "mode", &mode);
        sbx_get_i64(f, "size", &size);
        printf("%c%.*s %10lld %.*s%s\n", type.n && type.p[0] == 'd' ? 'd' : type.p[0] == 's' ? 'l' : '-',
               (int)mode.n, mode.p, (long long)size, (int)rel.n, rel.p,
               type.n && type.p[0] == 'd' ? "/" : "");
    }
}

int
v_ls(struct gopts *g, int argc, char **argv)
{
    bool rec = false, all = false;
    const char *pos[2] = {NULL, "/workspace"};
    int np = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-r") || !strcmp(argv[i], "--recursive"))
            rec = true;
        else if (!strcmp(argv[i], "-a") || !strcmp(argv[i], "--all"))
            all = true;
        else if (np < 2)
            pos[np++] = argv[i];
        else
            return usage("ls ID [PATH] [-r] [-a]");
    }
    if (np < 1)
        return usage("ls ID [PATH] [-r] [-a]");
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", pos[1]);
    sbx_args_kbool(e, "recursive", rec);
    sbx_args_kbool(e, "includeHidden", all);
    return cli_call_enc(g, "file.list", pos[0], e, human_ls);
}


int
v_mkdir(struct gopts *g, int argc, char **argv)
{
    bool p = false;
    const char *pos[2] = {NULL, NULL};
    int np = 0;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-p"))
            p = true;
        else if (np < 2)
            pos[np++] = argv[i];
        else
            return usage("mkdir ID PATH [-p]");
    }
    if (np != 2)
        return usage("mkdir ID PATH [-p]");
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", pos[1]);
    sbx_args_kbool(e, "recursive", p);
    return cli_call_enc(g, "file.mkdir", pos[0], e, human_ok);
}

int
v_rm(struct gopts *g, int argc, char **argv)
{
    if (argc != 2)
        return usage("rm ID PATH   (files only, as the SDK's deleteFile)");
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", argv[1]);
    return cli_call_enc(g, "file.delete", argv[0], e, human_ok);
}

/* "changed watch-1-…:3", or "resync (expired) watch-2-…:0". */
static void
human_changes(const msgpack_object *res)
{
    sbx_view st = {"", 0}, why = {"", 0}, ver = {"", 0};
    sbx_get_str(res, "status", &st);
    sbx_get_str(res, "reason", &why);
    sbx_get_str(res, "version", &ver);
    printf("%.*s%s%.*s%s %.*s\n", (int)st.n, st.p, why.n ? " (" : "", (int)why.n, why.p,
           why.n ? ")" : "", (int)ver.n, ver.p);
}

int
v_changes(struct gopts *g, int argc, char **argv)
{
    const char *u = "changes ID PATH [--since VERSION]";
    if (argc != 2 && !(argc == 4 && !strcmp(argv[2], "--since")))
        return usage(u);
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", argv[1]);
    if (argc == 4)
        sbx_args_kstr(e, "since", argv[3]);
    return cli_call_enc(g, "file.checkChanges", argv[0], e, human_changes);
}

int
v_mv(struct gopts *g, int argc, char **argv)
{
    if (argc != 3)
        return usage("mv ID SOURCE DESTINATION");
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "sourcePath", argv[1]);
    sbx_args_kstr(e, "destinationPath", argv[2]);
    return cli_call_enc(g, "file.move", argv[0], e, human_ok);
}

/* cli_start_stream — call `op` (a streaming op: its result carries
 * `streamId`) with the arguments map open in `e`, then open that stream.
 * Consumes `e`.  On success returns 0 with a connected client in *cp and the
 * stream in *sp (the caller closes both); otherwise prints why and returns
 * the exit code (1 for an error reply, EXIT_SBX when nothing was reached). */
static int
cli_start_stream(struct gopts *g, const char *op, const char *id, sbx_args *e,
                 sbx_client **cp, sbx_stream **sp)
{
    int rc = 0;
    sbx_client *c = NULL;
    sbx_reply *r = NULL;
    sbx_error err;
    c = cli_connect(g, &rc);
    if (!c)
        goto out;
    if (sbx_call_args(c, op, id, e, 0, &r, &err) != 0) {
        rc = 1;
        goto fail;
    }
    sbx_view sid = {"", 0};
    sbx_get_str(sbx_reply_result(r), "streamId", &sid);
    char sids[80];
    snprintf(sids, sizeof(sids), "%.*s", (int)sid.n, sid.p);
    sbx_reply_free(r);
    if (sbx_stream_open(c, id, sids, 0, sp, &err) != 0) {
        rc = EXIT_SBX;
        goto fail;
    }
    *cp = c;
    goto out;
fail:
    cli_print_err(&err);
    sbx_error_free(&err);
    sbx_client_close(c);
out:
    sbx_args_free(e);
    return rc;
}

int
v_watch(struct gopts *g, int argc, char **argv)
{
    const char *u = "watch ID PATH [--include GLOB]... | [--exclude GLOB]... [--no-recursive]";
    struct opts o;
    opts_init(&o, "sbx watch", argc, argv);
    static const struct option lo[] = {{"include", 1, 0, 'i'}, {"exclude", 1, 0, 'x'},
                                       {"no-recursive", 0, 0, 'n'}, {0, 0, 0, 0}};
    /* --include and --exclude globs, in order (at most one per argument). */
    const char **inc = cli_xcalloc((size_t)o.argc + 1, sizeof(char *));
    const char **exc = cli_xcalloc((size_t)o.argc + 1, sizeof(char *));
    int ninc = 0, nexc = 0, ch;
    bool rec = true;
    while ((ch = getopt_long(o.argc, o.argv, "", lo, NULL)) != -1) {
        if (ch == 'i') {
            inc[ninc++] = optarg;
        } else if (ch == 'x') {
            exc[nexc++] = optarg;
        } else if (ch == 'n') {
            rec = false;
        } else {
            free(inc);
            free(exc);
            free(o.argv);
            return usage(u);
        }
    }
    if (o.argc - optind != 2) {
        free(inc);
        free(exc);
        free(o.argv);
        return usage(u);
    }
    const char *id = o.argv[optind], *path = o.argv[optind + 1];
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "path", path);
    sbx_args_kbool(e, "recursive", rec);
    if (ninc) {
        sbx_args_karray(e, "include");
        for (int k = 0; k < ninc; k++)
            sbx_args_str(e, inc[k]);
        sbx_args_end(e);
    }
    if (nexc) {
        sbx_args_karray(e, "exclude");
        for (int k = 0; k < nexc; k++)
            sbx_args_str(e, exc[k]);
        sbx_args_end(e);
    }
    free(inc);
    free(exc);
    free(o.argv);
    sbx_client *c;
    sbx_stream *s;
    int rc = cli_start_stream(g, "file.watch", id, e, &c, &s);
    if (rc)
        return rc;
    rc = cli_follow(g, c, s, false);
    sbx_stream_close(s);
    sbx_client_close(c);
    return rc;
}

/* ------------------------------------------------------------------------------ */
/* git, env, configure */

static void
human_git(const msgpack_object *res)
{
    sbx_view dir = {"", 0}, br = {"", 0};
    sbx_get_str(res, "targetDir", &dir);
    sbx_get_str(res, "branch", &br);
    printf("cloned into %.*s (branch %.*s)\n", (int)dir.n, dir.p, (int)br.n, br.p);
}

int
v_git_checkout(struct gopts *g, int argc, char **argv)
{
    const char *u = "git-checkout ID URL [--branch B] [--dir DIR] [--depth N]";
    struct opts o;
    opts_init(&o, "sbx git-checkout", argc, argv);
    static const struct option lo[] = {
        {"branch", 1, 0, 'b'}, {"dir", 1, 0, 'd'}, {"depth", 1, 0, 'D'}, {0, 0, 0, 0}};
    const char *br = NULL, *dir = NULL;
    long depth = 0;
    int ch;
    while ((ch = getopt_long(o.argc, o.argv, "", lo, NULL)) != -1) {
        if (ch == 'b')
            br = optarg;
        else if (ch == 'd')
            dir = optarg;
        else if (ch == 'D')
            depth = atol(optarg);
        else {
            free(o.argv);
            return usage(u);
        }
    }
    if (o.argc - optind != 2) {
        free(o.argv);
        return usage(u);
    }
    sbx_args *e = sbx_args_new();
    sbx_args_kstr(e, "repoUrl", o.argv[optind + 1]);
    if (br)
        sbx_args_kstr(e, "branch", br);
    if (dir)
        sbx_args_kstr(e, "targetDir", dir);
    if (depth > 0)
        sbx_args_kint(e, "depth", depth);
    const char *id = o.argv[optind];
    free(o.argv);
    return cli_call_enc(g, "git.checkout", id, e, human_git);
}

int
v_env(struct gopts *g, int argc, char **argv)
{
    const char *u = "env ID K=V... [-u K]...   (set and unset sandbox environment variables)";
    if (argc < 2)
        return usage(u);
    sbx_args *e = sbx_args_new();
    sbx_args_kmap(e, "vars");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-u") && i + 1 < argc) {
            sbx_args_str(e, argv[++i]);
            sbx_args_nil(e);
            continue;
        }
        const char *eq = strchr(argv[i], '=');
        if (!eq || eq == argv[i]) {
            sbx_args_free(e);
            return usage(u);
        }
        sbx_args_strn(e, argv[i], (size_t)(eq - argv[i]));
        sbx_args_str(e, eq + 1);
    }
    sbx_args_end(e);
    return cli_call_enc(g, "env.set", argv[0], e, human_ok);
}

static void
human_configure(const msgpack_object *res)
{
    int64_t sa = 0;
    bool ka = false;
    sbx_get_i64(res, "sleepAfter", &sa);
    sbx_get_bool(res, "keepAlive", &ka);
    printf("sleepAfter %llds, keepAlive %s\n", (long long)(sa / 1000), ka ? "on" : "off");
}

int
v_configure(struct gopts *g, int argc, char **argv)
{
    const char *u = "configure ID [--sleep-after D] [--keep-alive on|off]";
    if (argc < 1)
        return usage(u);
    sbx_args *e = sbx_args_new();
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--sleep-after") && i + 1 < argc) {
            sbx_args_kstr(e, "sleepAfter", argv[++i]);
        } else if (!strcmp(argv[i], "--keep-alive") && i + 1 < argc) {
            const char *v = argv[++i];
            sbx_args_kbool(e, "keepAlive",
                           !strcmp(v, "on") || !strcmp(v, "true") || !strcmp(v, "1"));
        } else {
            sbx_args_free(e);
            return usage(u);
        }
    }
    return cli_call_enc(g, "sandbox.configure", argv[0], e, human_configure);
}

/* ------------------------------------------------------------------------------ */
/* code interpreter */

/* The exit status of `sbx code`: 1 when the code raised (result.error). */
static int
code_status(const msgpack_object *res)
{
    const msgpack_object *err;
    return sbx_get_map(res, "error", &err) == 0 ? 1 : 0;
}

static void
print_code_result(const msgpack_object *res)
{
    const msgpack_object *logs, *arr, *err;
    if (sbx_get_map(res, "logs", &logs) == 0) {
        const char *names[2] = {"stdout", "stderr"};
        for (int k = 0; k < 2; k++) {
            if (sbx_get_array(logs, names[k], &arr) != 0)
                continue;
            for (uint32_t i = 0; i < arr->via.array.size; i++) {
                sbx_view t;
                if (sbx_value_str(&arr->via.array.ptr[i], &t) == 0) {
                    fflush(stdout);
                    cli_write_full(k ? STDERR_FILENO : STDOUT_FILENO, t.p, t.n);
                }
            }
        }
    }
    if (sbx_get_array(res, "results", &arr) == 0) {
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            const msgpack_object *r = &arr->via.array.ptr[i];
            sbx_view text;
            static const char *const rich[] = {"png", "jpeg", "svg", "html", "latex", "markdown",
                                               "javascript", "json", "chart"};
            for (size_t k = 0; k < sizeof(rich) / sizeof(rich[0]); k++) {
                const msgpack_object *v = sbx_get(r, rich[k]);
                sbx_view vs;
                if (v && strcmp(rich[k], "json") && sbx_value_str(v, &vs) == 0)
                    printf("[%s: %zu bytes]\n", rich[k], vs.n);
                else if (v)
                    printf("[%s]\n", rich[k]);
            }
            if (sbx_get_str(r, "text", &text) == 0)
                printf("%.*s\n", (int)text.n, text.p);
        }
    }
    if (sbx_get_map(res, "error", &err) == 0) {
        const msgpack_object *tb;
        sbx_view name = {"Error", 5}, value = {"", 0};
        sbx_get_str(err, "name", &name);
        sbx_get_str(err, "value", &value);
        if (sbx_get_array(err, "traceback", &tb) == 0 && tb->via.array.size) {
            for (uint32_t i = 0; i < tb->via.array.size; i++) {
                sbx_view l;
                if (sbx_value_str(&tb->via.array.ptr[i], &l) == 0)
                    fprintf(stderr, "%.*s\n", (int)l.n, l.p);
            }
        } else {
            fprintf(stderr, "%.*s: %.*s\n", (int)name.n, name.p, (int)value.n, value.p);
        }
    }
}

int
v_code(struct gopts *g, int argc, char **argv)
{
    const char *u = "code ID [--lang python|javascript|typescript] [--context CTX] "
                    "[--timeout D] [--stream] ('code' | -f FILE)";
    struct opts o;
    opts_init(&o, "sbx code", argc, argv);
    static const struct option lo[] = {{"lang", 1, 0, 'l'},    {"context", 1, 0, 'c'},
                                       {"timeout", 1, 0, 't'}, {"stream", 0, 0, 's'},
                                       {"file", 1, 0, 'f'},    {0, 0, 0, 0}};
    const char *lang = NULL, *ctx = NULL, *file = NULL;
    bool stream = false;
    int64_t tmo = 0;
    int ch;
    while ((ch = getopt_long(o.argc, o.argv, "f:", lo, NULL)) != -1) {
        switch (ch) {
        case 'l': lang = optarg; break;
        case 'c': ctx = optarg; break;
        case 't': tmo = cli_parse_ms(optarg); break;
        case 's': stream = true; break;
        case 'f': file = optarg; break;
        default: free(o.argv); return usage(u);
        }
    }
    int npos = o.argc - optind;
    if (tmo < 0 || npos < 1 || npos != (file ? 1 : 2)) {
        free(o.argv);
        return usage(u);
    }
    const char *id = o.argv[optind];
    char *code = NULL;
    size_t clen = 0;
    if (file) {
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        int rrc = fd < 0 ? -errno : cli_read_all(fd, &code, &clen);
        if (fd >= 0)
            close(fd);
        if (rrc == 0 && clen > (32u << 20)) {
            free(code);
            rrc = -EFBIG;
        }
        if (rrc != 0) {
            fprintf(stderr, "sbx code: cannot read %s: %s\n", file, strerror(-rrc));
            free(o.argv);
            return EXIT_USAGE;
        }
        if (!lang) {
            const char *dot = strrchr(file, '.');
            if (dot && (!strcmp(dot, ".js") || !strcmp(dot, ".mjs")))
                lang = "javascript";
            else if (dot && !strcmp(dot, ".ts"))
                lang = "typescript";
        }
    } else {
        code = cli_xstrdup(o.argv[optind + 1]);
        clen = strlen(code);
    }
    sbx_args *e = sbx_args_new();
    sbx_args_kstrn(e, "code", code, clen);
    free(code);
    if (lang)
        sbx_args_kstr(e, "language", lang);
    if (ctx)
        sbx_args_kstr(e, "context", ctx);
    if (tmo)
        sbx_args_kint(e, "timeout", tmo);
    free(o.argv);
    if (!stream) {
        return cli_call_enc_check(g, "context.run", id, e, print_code_result, code_status);
    }
    sbx_client *c;
    sbx_stream *s;
    int rc = cli_start_stream(g, "context.runStream", id, e, &c, &s);
    if (rc)
        return rc;
    sbx_error err;
    sbx_event ev;
    bool raised = false; /* an error event: the code raised */
    while ((rc = sbx_stream_next(s, &ev, &err)) == 1) {
        if (!strcmp(ev.type, "error"))
            raised = true;
        if (g->json) {
            char *j = sbx_value_json(ev.obj, false);
            printf("%s\n", j ? j : "{}");
            free(j);
            fflush(stdout);
            continue;
        }
        sbx_view t;
        if ((!strcmp(ev.type, "stdout") || !strcmp(ev.type, "stderr")) &&
            sbx_get_str(ev.obj, "text", &t) == 0) {
            fflush(stdout);
            cli_write_full(ev.type[3] == 'o' ? STDOUT_FILENO : STDERR_FILENO, t.p, t.n);
        } else if (!strcmp(ev.type, "result")) {
            const msgpack_object *res;
            if (sbx_get_map(ev.obj, "result", &res) == 0 &&
                sbx_get_str(res, "text", &t) == 0)
                printf("%.*s\n", (int)t.n, t.p);
        } else if (!strcmp(ev.type, "error")) {
            sbx_view n = {"Error", 5}, v = {"", 0};
            sbx_get_str(ev.obj, "name", &n);
            sbx_get_str(ev.obj, "value", &v);
            fprintf(stderr, "%.*s: %.*s\n", (int)n.n, n.p, (int)v.n, v.p);
        }
    }
    if (rc < 0) {
        cli_print_err(&err);
        sbx_error_free(&err);
        rc = 1;
    } else if (raised) {
        rc = 1;
    }
    sbx_stream_close(s);
    sbx_client_close(c);
    return rc;
}

static void
human_contexts(const msgpack_object *res)
{
    const msgpack_object *arr, *one;
    if (sbx_get_map(res, "context", &one) == 0) {
        sbx_view id = {"", 0};
        sbx_get_str(one, "id", &id);
        printf("%.*s\n", (int)id.n, id.p);
        return;
    }
    if (sbx_get_array(res, "contexts", &arr) != 0)
        return;
    printf("%-20s %-11s %-8s %s\n", "CONTEXT", "LANGUAGE", "MODE", "CWD");
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *c = &arr->via.array.ptr[i];
        sbx_view id = {"", 0}, l = {"", 0}, m = {"", 0}, cwd = {"", 0};
        sbx_get_str(c, "id", &id);
        sbx_get_str(c, "language", &l);
        sbx_get_str(c, "mode", &m);
        sbx_get_str(c, "cwd", &cwd);
        printf("%-20.*s %-11.*s %-8.*s %.*s\n", (int)id.n, id.p, (int)l.n, l.p, (int)m.n, m.p,
               (int)cwd.n, cwd.p);
    }
}

int
v_contexts(struct gopts *g, int argc, char **argv)
{
    if (argc < 1)
        return usage("contexts ID");
    return cli_call(g, "context.list", argv[0], NULL, human_contexts);
}

int
v_context(struct gopts *g, int argc, char **argv)
{
    const char *u = "context (create ID [--lang L] [--cwd DIR] [--env K=V]... | delete ID CTX)";
    if (argc < 2)
        return usage(u);
    sbx_args *e = sbx_args_new();
    if (!strcmp(argv[0], "delete") && argc == 3) {
        sbx_args_kstr(e, "contextId", argv[2]);
        return cli_call_enc(g, "context.delete", argv[1], e, human_ok);
    }
    if (strcmp(argv[0], "create") != 0) {
        sbx_args_free(e);
        return usage(u);
    }
    bool env_open = false;
    for (int i = 2; i < argc; i++) {
        if (!strcmp(argv[i], "--lang") && i + 1 < argc) {
            sbx_args_kstr(e, "language", argv[++i]);
        } else if (!strcmp(argv[i], "--cwd") && i + 1 < argc) {
            sbx_args_kstr(e, "cwd", argv[++i]);
        } else if (!strcmp(argv[i], "--env") && i + 1 < argc && strchr(argv[i + 1], '=')) {
            if (!env_open) {
                sbx_args_kmap(e, "envVars");
                env_open = true;
            }
            const char *kv = argv[++i], *eq = strchr(kv, '=');
            sbx_args_strn(e, kv, (size_t)(eq - kv));
            sbx_args_str(e, eq + 1);
        } else {
            sbx_args_free(e);
            return usage(u);
        }
    }
    if (env_open)
        sbx_args_end(e);
    return cli_call_enc(g, "context.create", argv[1], e, human_contexts);
}
