/*
 * sbx-soak — many sandboxes doing mixed work for a while; every error is a
 * failure, and the latency of each kind of operation is reported.
 *
 *   sbx-soak [--seconds 300] [--sandboxes 200] [--url URL] [--shards 2]
 *            [--seed N] [--quiet]
 *
 * Without --url it starts a private `sbxd dev` from $SBX_BIN (default bin/,
 * the release build; tests/support/harness.c) and stops it at the end.
 * One thread per sandbox, each with its own client, loops until the time
 * is up over a mix of operations, checking each result:
 *
 *   exec          a shell command in the default session; output checked
 *   exec.session  a command in a named session that keeps state (cd, vars)
 *   exec.fresh    a sessionless command with argv and stdin
 *   exec.stream   a streamed command read to its `complete` event
 *   file.rw       write a file, read it back, compare bytes
 *   file.list     list /workspace, find the file written
 *   env           env.set then read the variable back in a fresh process
 *   process       start a background process, wait for its exit, read its logs
 *   status        the sandbox's status
 *   code          a Python cell in the default context (only in one sandbox of 25:
 *                 an interpreter is big and slow to start)
 *   recreate      destroy the sandbox and let the next operation create it (1 in 100)
 *
 * At the end: per operation count, errors, p50, p99 and max latency (ms),
 * and the total; exit status 1 if any operation failed (the first errors
 * are printed as they happen).  `make soak` runs it; tools/valgrind.sh runs
 * a short one under valgrind as the client of a valgrind'ed daemon.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "../runtime/json.h"
#include "../include/sbx/sbx.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "../tests/support/harness.h"
#include "stats.h"

enum op {
    OP_EXEC,
    OP_EXEC_SESSION,
    OP_EXEC_FRESH,
    OP_EXEC_STREAM,
    OP_FILE_RW,
    OP_FILE_LIST,
    OP_ENV,
    OP_PROCESS,
    OP_STATUS,
    OP_CODE,
    OP_RECREATE,
    OP__N
};

static const char *const op_names[OP__N] = {
    "exec", "exec.session", "exec.fresh", "exec.stream", "file.rw", "file.list",
    "env", "process", "status", "code", "recreate"};

/* Relative weights of the mix (out of 1000). */
static const int op_weight[OP__N] = {220, 130, 80, 70, 140, 60, 70, 70, 110, 20, 10};

/* The latencies of one operation (ms) and how many of them failed. */
struct op_samples {
    struct sbx_samples lat;
    uint64_t errors;
};

struct worker {
    pthread_t th;
    int idx;
    char id[64];
    const char *url;
    int64_t until_ms;
    unsigned seed;
    struct op_samples s[OP__N];
    bool session_made;
    int counter;
};

static atomic_int errors_printed;
static atomic_bool stop_now;

static void
fail(struct worker *w, enum op op, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void
fail(struct worker *w, enum op op, const char *fmt, ...)
{
    w->s[op].errors++;
    if (atomic_fetch_add(&errors_printed, 1) < 20) {
        char msg[700];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof(msg), fmt, ap);
        va_end(ap);
        fprintf(stderr, "soak: %s %s: %s\n", w->id, op_names[op], msg);
    }
}

/* One generic call with JSON arguments; 0 or the error (err filled). */
static int
call(sbx_client *c, const char *op, const char *id, const char *json, sbx_reply **r,
     sbx_error *err)
{
    *r = NULL;
    return sbx_call_json(c, op, id, json, 60000, r, err);
}

static bool
exec_expect(struct worker *w, sbx_client *c, enum op op, const sbx_exec_opts *o, const char *want)
{
    sbx_exec_result r;
    sbx_error err;
    int rc = sbx_exec(c, w->id, o, &r, &err);
    const char *out = rc == 0 && r.stdout_data ? r.stdout_data : "";
    bool ok = rc == 0 && r.exit_code == 0 && !strcmp(out, want);
    if (rc)
        fail(w, op, "%s %s", err.code, err.message);
    else if (!ok)
        fail(w, op, "exit %d, stdout '%.200s', expected '%s', stderr '%.200s'", r.exit_code, out,
             want, r.stderr_data ? r.stderr_data : "");
    if (rc)
        sbx_error_free(&err);
    sbx_exec_result_free(&r);
    return ok;
}

static void
do_op(struct worker *w, sbx_client *c, enum op op)
{
    char cmd[256], want[128], path[128], json[512];
    sbx_reply *r = NULL;
    sbx_error err;
    int n = ++w->counter;
    switch (op) {
    case OP_EXEC: {
        snprintf(cmd, sizeof(cmd), "echo $((%d * 7))", n);
        snprintf(want, sizeof(want), "%d\n", n * 7);
        sbx_exec_opts o = {.command = cmd, .timeout_ms = 30000};
        exec_expect(w, c, op, &o, want);
        break;
    }
    case OP_EXEC_SESSION: {
        /* State carries over: the variable set by the previous call is read back. */
        if (!w->session_made) {
            if (call(c, "session.create", w->id, "{\"id\":\"soak\"}", &r, &err) != 0 &&
                strcmp(err.code, "SESSION_ALREADY_EXISTS") != 0) {
                fail(w, op, "session.create: %s %s", err.code, err.message);
                sbx_error_free(&err);
                return;
            }
            sbx_reply_free(r);
            w->session_made = true;
            sbx_exec_opts o0 = {.command = "V=0; cd /tmp", .session_id = "soak"};
            exec_expect(w, c, op, &o0, "");
        }
        snprintf(cmd, sizeof(cmd), "V=$((V + 1)); echo \"$V $PWD\"");
        sbx_exec_opts o = {.command = cmd, .session_id = "soak", .timeout_ms = 30000};
        sbx_exec_result res;
        if (sbx_exec(c, w->id, &o, &res, &err) != 0) {
            fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
        } else if (res.exit_code != 0 || !res.stdout_data || !strstr(res.stdout_data, " /tmp\n")) {
            fail(w, op, "session state lost: '%.200s'", res.stdout_data ? res.stdout_data : "");
        }
        sbx_exec_result_free(&res);
        break;
    }
    case OP_EXEC_FRESH: {
        static const char *const argv[] = {"/usr/bin/tr", "a-z", "A-Z", NULL};
        snprintf(cmd, sizeof(cmd), "soak %d", n);
        snprintf(want, sizeof(want), "SOAK %d", n);
        sbx_exec_opts o = {.argv = argv, .sessionless = true, .stdin_data = cmd,
                           .stdin_len = strlen(cmd), .has_stdin = true, .timeout_ms = 30000};
        exec_expect(w, c, op, &o, want);
        break;
    }
    case OP_EXEC_STREAM: {
        sbx_exec_opts o = {.command = "for i in 1 2 3; do echo line$i; done", .timeout_ms = 30000};
        sbx_stream *st = NULL;
        if (sbx_exec_stream(c, w->id, &o, &st, &err) != 0) {
            fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        sbx_event ev;
        sbx_buf out;
        sbx_buf_init(&out);
        int k, code = -1;
        while ((k = sbx_stream_next(st, &ev, &err)) == 1) {
            if (!strcmp(ev.type, "stdout"))
                sbx_buf_append(&out, ev.data, ev.data_len);
            if (ev.has_exit_code)
                code = ev.exit_code;
        }
        sbx_buf_append(&out, "", 1);
        if (k < 0) {
            fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
        } else if (code != 0 || strcmp(out.p, "line1\nline2\nline3\n")) {
            fail(w, op, "exit %d, output '%.100s'", code, out.p);
        }
        sbx_buf_free(&out);
        sbx_stream_close(st);
        break;
    }
    case OP_FILE_RW: {
        char data[2048];
        size_t len = 64 + (size_t)(rand_r(&w->seed) % 1900);
        for (size_t i = 0; i < len; i++)
            data[i] = (char)(rand_r(&w->seed) & 0xff);
        snprintf(path, sizeof(path), "/workspace/f%d.bin", n % 8);
        char *back = NULL;
        size_t blen = 0;
        if (sbx_write_file(c, w->id, path, data, len, &err) != 0) {
            fail(w, op, "write: %s %s", err.code, err.message);
            sbx_error_free(&err);
        } else if (sbx_read_file(c, w->id, path, &back, &blen, NULL, &err) != 0) {
            fail(w, op, "read: %s %s", err.code, err.message);
            sbx_error_free(&err);
        } else if (blen != len || memcmp(back, data, len)) {
            fail(w, op, "read back %zu bytes, wrote %zu (or different bytes)", blen, len);
        }
        free(back);
        break;
    }
    case OP_FILE_LIST: {
        if (sbx_write_file(c, w->id, "/workspace/listed.txt", "x", 1, &err) != 0) {
            fail(w, op, "write: %s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        if (call(c, "file.list", w->id, "{\"path\":\"/workspace\"}", &r, &err) != 0) {
            fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        char *js = sbx_reply_json(r, false);
        if (!js || !strstr(js, "\"listed.txt\""))
            fail(w, op, "listed.txt not listed");
        free(js);
        sbx_reply_free(r);
        break;
    }
    case OP_ENV: {
        snprintf(json, sizeof(json), "SOAK_%d", n % 4);
        char kv[64];
        snprintf(kv, sizeof(kv), "%s=v%d", json, n);
        const char *vars[] = {kv, NULL};
        if (sbx_set_env(c, w->id, vars, &err) != 0) {
            fail(w, op, "env.set: %s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        snprintf(cmd, sizeof(cmd), "printenv %s", json);
        snprintf(want, sizeof(want), "v%d\n", n);
        sbx_exec_opts o = {.command = cmd, .sessionless = true, .timeout_ms = 30000};
        exec_expect(w, c, op, &o, want);
        break;
    }
    case OP_PROCESS: {
        char pid[128], pname[64];
        snprintf(pname, sizeof(pname), "p%d", n);
        snprintf(cmd, sizeof(cmd), "sleep 0.1; echo out%d", n);
        sbx_exec_opts o = {.command = cmd};
        if (sbx_process_start(c, w->id, &o, pname, pid, &err) != 0) {
            fail(w, op, "start: %s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        snprintf(json, sizeof(json), "{\"processId\":\"%s\",\"timeout\":30000}", pid);
        if (call(c, "process.waitForExit", w->id, json, &r, &err) != 0) {
            fail(w, op, "waitForExit: %s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        sbx_reply_free(r);
        snprintf(json, sizeof(json), "{\"processId\":\"%s\"}", pid);
        if (call(c, "process.logs", w->id, json, &r, &err) != 0) {
            fail(w, op, "logs: %s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        sbx_str so = {"", 0};
        sbx_wire_get_bin(sbx_reply_result(r), "stdout", &so);
        snprintf(want, sizeof(want), "out%d\n", n);
        if (so.n != strlen(want) || memcmp(so.p, want, so.n))
            fail(w, op, "logs '%.*s', expected '%s'", (int)SBX_MIN(so.n, (size_t)100), so.p,
                 want);
        sbx_reply_free(r);
        break;
    }
    case OP_STATUS:
        if (call(c, "status", w->id, NULL, &r, &err) != 0) {
            /* Right after a recreate the sandbox may not exist yet. */
            if (strcmp(err.code, "SANDBOX_NOT_FOUND") != 0)
                fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        sbx_reply_free(r);
        break;
    case OP_CODE: {
        snprintf(json, sizeof(json), "{\"language\":\"python\",\"code\":\"%d * 6\"}", n);
        if (call(c, "context.run", w->id, json, &r, &err) != 0) {
            fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
            break;
        }
        char *js = sbx_reply_json(r, false);
        snprintf(want, sizeof(want), "\"text\":\"%d\"", n * 6);
        if (!js || !strstr(js, want))
            fail(w, op, "result without %s: %.300s", want, js ? js : "");
        free(js);
        sbx_reply_free(r);
        break;
    }
    case OP_RECREATE: {
        bool destroyed;
        if (sbx_destroy(c, w->id, &destroyed, &err) != 0) {
            fail(w, op, "%s %s", err.code, err.message);
            sbx_error_free(&err);
        }
        w->session_made = false;
        break;
    }
    case OP__N:
        break;
    }
}

static enum op
pick(struct worker *w)
{
    for (;;) {
        int x = rand_r(&w->seed) % 1000, i;
        for (i = 0; i < OP__N - 1 && x >= op_weight[i]; i++)
            x -= op_weight[i];
        /* An interpreter is a process of ~60 MiB that takes seconds to start on
         * a loaded host: only one sandbox in 25 runs code. */
        if (i == OP_CODE && w->idx % 25 != 0)
            continue;
        return (enum op)i;
    }
}

static void *
worker_main(void *arg)
{
    struct worker *w = arg;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, w->url, &err) != 0) {
        fail(w, OP_STATUS, "client: %s %s", err.code, err.message);
        return NULL;
    }
    /* Start staggered so that 200 containers do not all start in the same instant. */
    usleep((useconds_t)(rand_r(&w->seed) % 2000) * 1000);
    while (!atomic_load(&stop_now) && sbx_mono_ms() < w->until_ms) {
        enum op op = pick(w);
        double t0 = sbx_stats_now_ms();
        do_op(w, c, op);
        sbx_samples_add(&w->s[op].lat, sbx_stats_now_ms() - t0);
    }
    sbx_destroy(c, w->id, NULL, NULL);
    sbx_client_close(c);
    return NULL;
}

static void
on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop_now, true);
}

static void
usage(void)
{
    fprintf(stderr, "usage: sbx-soak [--seconds N] [--sandboxes N] [--url URL] [--shards N] "
                    "[--seed N] [--quiet]\n");
}

int
main(int argc, char **argv)
{
    int seconds = 300, nsb = 200, shards = 2;
    const char *url = NULL;
    unsigned seed = (unsigned)time(NULL);
    bool quiet = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--seconds") && v)
            seconds = atoi(argv[++i]);
        else if (!strcmp(a, "--sandboxes") && v)
            nsb = atoi(argv[++i]);
        else if (!strcmp(a, "--url") && v)
            url = argv[++i];
        else if (!strcmp(a, "--shards") && v)
            shards = atoi(argv[++i]);
        else if (!strcmp(a, "--seed") && v)
            seed = (unsigned)strtoul(argv[++i], NULL, 10);
        else if (!strcmp(a, "--quiet"))
            quiet = true;
        else {
            usage();
            return 2;
        }
    }
    if (seconds < 1 || nsb < 1 || nsb > 4096 || shards < 1) {
        usage();
        return 2;
    }
    signal(SIGPIPE, SIG_IGN);
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);

    struct testd d;
    bool own = !url;
    if (own) {
        if (!getenv("SBX_BIN"))
            setenv("SBX_BIN", "bin", 1);
        /* Small sandboxes, a warm pool, and room for all of them. */
        static const char *const extra[] = {"--pool", "4", "--memory", "128M", "--pids", "128",
                                            "--disk", "64M", "--workers", "4", NULL};
        if (testd_start(&d, shards, extra) != 0) {
            fprintf(stderr, "soak: could not start sbxd dev from %s\n", getenv("SBX_BIN"));
            return 1;
        }
        url = d.url;
    }
    printf("soak: %d sandboxes, %d s, gateway %s, seed %u\n", nsb, seconds, url, seed);
    fflush(stdout);

    struct worker *ws = sbx_xcalloc((size_t)nsb, sizeof(*ws));
    int64_t t0 = sbx_mono_ms(), until = t0 + (int64_t)seconds * 1000;
    for (int i = 0; i < nsb; i++) {
        ws[i].idx = i;
        ws[i].url = url;
        ws[i].until_ms = until;
        ws[i].seed = seed * 2654435761u + (unsigned)i;
        snprintf(ws[i].id, sizeof(ws[i].id), "soak-%d-%d", (int)getpid(), i);
        pthread_attr_t at;
        pthread_attr_init(&at);
        pthread_attr_setstacksize(&at, 256 << 10);
        pthread_create(&ws[i].th, &at, worker_main, &ws[i]);
        pthread_attr_destroy(&at);
    }
    for (int i = 0; i < nsb; i++)
        pthread_join(ws[i].th, NULL);
    double wall = (double)(sbx_mono_ms() - t0) / 1000.0;

    uint64_t total = 0, errs = 0;
    printf("\n%-13s %8s %7s %9s %9s %9s\n", "operation", "count", "errors", "p50 ms", "p99 ms",
           "max ms");
    for (int op = 0; op < OP__N; op++) {
        struct sbx_samples all = {0};
        uint64_t nerr = 0;
        for (int i = 0; i < nsb; i++) {
            for (size_t k = 0; k < ws[i].s[op].lat.n; k++)
                sbx_samples_add(&all, ws[i].s[op].lat.v[k]);
            nerr += ws[i].s[op].errors;
        }
        struct sbx_summary st = sbx_stats_summary(all.v, all.n);
        printf("%-13s %8zu %7" PRIu64 " %9.1f %9.1f %9.1f\n", op_names[op], all.n, nerr,
               all.n ? st.p50 : 0.0, all.n ? st.p99 : 0.0, all.n ? st.max : 0.0);
        total += all.n;
        errs += nerr;
        sbx_samples_free(&all);
    }
    printf("%-13s %8" PRIu64 " %7" PRIu64 "   (%.1f operations/s over %.0f s)\n", "total", total,
           errs, (double)total / wall, wall);
    if (!quiet && own)
        printf("daemon log: %s (removed)\n", d.log);
    for (int i = 0; i < nsb; i++)
        for (int op = 0; op < OP__N; op++)
            sbx_samples_free(&ws[i].s[op].lat);
    free(ws);
    if (own)
        testd_stop(&d);
    /* nng frees closed sockets' endpoints and pipes on its reaper thread,
     * after nng_close returns: wait for that, so what is still allocated at
     * exit (valgrind's leak check, tools/valgrind.sh) is a real leak. */
    nng_fini();
    return errs ? 1 : 0;
}
