/*
 * test_deadlines.c — every call of the C client returns by its deadline
 * (+ SBX_DEADLINE_SLACK_MS, include/sbx/sbx.h) whatever the peer does: a peer
 * that never answers, one that sends half a frame or garbage, a stopped or
 * killed gateway, a stopped shard, a removed ipc socket.  Issue 11,
 * "Deadlines everywhere"; the rule is docs/protocol.md §2 (Deadlines).
 *
 * The misbehaving peers are fakes in this process: an nng REP socket that
 * never reads, and a hand-written SP-over-TCP peer on loopback (the SP TCP
 * framing: an 8-byte greeting, then frames of an 8-byte big-endian length
 * and the body, whose first 4 bytes are the REQ request id) that can stop
 * in the middle of a frame.  Gateways are standalone `sbxd gateway`
 * processes in front of such a fake shard, stopped and killed by pid.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/wire.h"
#include "../support/harness.h"

/* The slack a call may take past its deadline (include/sbx/sbx.h). */
#define SLACK_MS ((double)SBX_DEADLINE_SLACK_MS)

/* ---------------------------------------------------------------------------
 * A hand-written SP/TCP REP peer. */

enum fake_mode {
    FAKE_SILENT,  /* reads requests, never answers */
    FAKE_HALF,    /* answers the first request with half a frame, then nothing */
    FAKE_GARBAGE, /* answers every request with a frame that is not msgpack */
};

#define FAKE_MAX_CONNS 16

struct fake {
    int lfd;
    int port;
    enum fake_mode mode;
    atomic_bool stop;
    pthread_t acceptor;
    pthread_mutex_t mu;
    pthread_t conns[FAKE_MAX_CONNS];
    int fds[FAKE_MAX_CONNS];
    int nconns;
    atomic_int greeted; /* connections whose SP greeting was answered */
};

struct fake_conn {
    struct fake *f;
    int fd;
};

/* Wait until fd is readable; false when the fake stops first. */
static bool
fake_wait(struct fake *f, int fd)
{
    while (!atomic_load(&f->stop)) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int n = poll(&p, 1, 50);
        if (n > 0)
            return true;
        if (n < 0 && errno != EINTR)
            return false;
    }
    return false;
}

static int
fake_read(struct fake *f, int fd, void *buf, size_t len)
{
    char *p = buf;
    while (len) {
        if (!fake_wait(f, fd))
            return -1;
        ssize_t n = read(fd, p, len);
        if (n <= 0)
            return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void
put_be64(unsigned char *p, uint64_t v)
{
    for (int i = 7; i >= 0; i--, v >>= 8)
        p[i] = (unsigned char)v;
}

static void *
fake_conn_main(void *arg)
{
    struct fake_conn *fc = arg;
    struct fake *f = fc->f;
    int fd = fc->fd;
    free(fc);
    /* SP greeting: "\0SP\0", our protocol (REP0 = 0x31), two reserved bytes. */
    static const unsigned char hello[8] = {0, 'S', 'P', 0, 0x00, 0x31, 0, 0};
    unsigned char peer[8];
    if (fake_read(f, fd, peer, 8) != 0 || write(fd, hello, 8) != 8)
        return NULL;
    atomic_fetch_add(&f->greeted, 1);
    bool answered = false;
    for (;;) {
        unsigned char lenb[8];
        if (fake_read(f, fd, lenb, 8) != 0)
            return NULL;
        uint64_t len = 0;
        for (int i = 0; i < 8; i++)
            len = len << 8 | lenb[i];
        if (len < 4 || len > (64u << 20))
            return NULL;
        unsigned char *body = malloc(len);
        if (!body || fake_read(f, fd, body, len) != 0) {
            free(body);
            return NULL;
        }
        unsigned char out[8 + 4 + 16];
        memcpy(out + 8, body, 4); /* the request id is the reply's header */
        free(body);
        if (f->mode == FAKE_HALF && !answered) {
            /* Announce 64 bytes of body, send 10 of them, and stall. */
            put_be64(out, 4 + 64);
            memset(out + 12, 0x91, 6);
            if (write(fd, out, 8 + 4 + 6) < 0)
                return NULL;
            answered = true;
        } else if (f->mode == FAKE_GARBAGE) {
            /* 0xc1 is the one byte msgpack never uses. */
            put_be64(out, 4 + 5);
            memset(out + 12, 0xc1, 5);
            if (write(fd, out, 8 + 4 + 5) < 0)
                return NULL;
        }
    }
}

static void *
fake_accept_main(void *arg)
{
    struct fake *f = arg;
    while (fake_wait(f, f->lfd)) {
        int fd = accept(f->lfd, NULL, NULL);
        if (fd < 0)
            continue;
        pthread_mutex_lock(&f->mu);
        struct fake_conn *fc = malloc(sizeof(*fc));
        if (f->nconns == FAKE_MAX_CONNS || !fc) {
            free(fc);
            close(fd);
        } else {
            fc->f = f;
            fc->fd = fd;
            f->fds[f->nconns] = fd;
            if (pthread_create(&f->conns[f->nconns], NULL, fake_conn_main, fc) == 0)
                f->nconns++;
            else {
                free(fc);
                close(fd);
            }
        }
        pthread_mutex_unlock(&f->mu);
    }
    return NULL;
}

/* fake_start — listen on 127.0.0.1:<kernel's choice>; url gets tcp://… */
static void
fake_start(struct fake *f, enum fake_mode mode, char *url, size_t urllen)
{
    memset(f, 0, sizeof(*f));
    f->mode = mode;
    pthread_mutex_init(&f->mu, NULL);
    f->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(f->lfd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    cr_assert_eq(bind(f->lfd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(f->lfd, 16), 0);
    cr_assert_eq(getsockname(f->lfd, (struct sockaddr *)&a, &al), 0);
    f->port = ntohs(a.sin_port);
    snprintf(url, urllen, "tcp://127.0.0.1:%d", f->port);
    cr_assert_eq(pthread_create(&f->acceptor, NULL, fake_accept_main, f), 0);
}

static void
fake_stop(struct fake *f)
{
    atomic_store(&f->stop, true);
    pthread_join(f->acceptor, NULL);
    for (int i = 0; i < f->nconns; i++) {
        pthread_join(f->conns[i], NULL);
        close(f->fds[i]);
    }
    close(f->lfd);
    pthread_mutex_destroy(&f->mu);
}

/* ---------------------------------------------------------------------------
 * Helpers. */

/* One ping with a deadline; its code in err, the time it took returned. */
static double
timed_ping(sbx_client *c, const char *sandbox, int64_t deadline_ms, int *rc, sbx_error *err)
{
    sbx_reply *r = NULL;
    double t0 = test_now_ms();
    *rc = sbx_call(c, "ping", sandbox, NULL, 0, deadline_ms, NULL, &r, err);
    double took = test_now_ms() - t0;
    if (*rc == 0)
        sbx_reply_free(r);
    return took;
}

/* A ping to sandbox through c with deadline_ms must fail with `code` (NULL:
 * with any code) within the deadline plus SLACK_MS; `what` names the call in
 * the messages. */
static void
expect_ping_fails(sbx_client *c, const char *sandbox, int64_t deadline_ms, const char *code,
                  const char *what)
{
    sbx_error err;
    int rc;
    double took = timed_ping(c, sandbox, deadline_ms, &rc, &err);
    cr_expect_neq(rc, 0, "%s succeeded", what);
    if (code)
        cr_expect_str_eq(err.code, code, "%s: %s: %s", what, err.code, err.message);
    cr_expect(took < deadline_ms + SLACK_MS, "%s answered after %.0f ms (deadline %lld)", what,
              took, (long long)deadline_ms);
    sbx_error_free(&err);
}

/* A standalone gateway: its pid and URL (ipc in its own temp dir). */
struct lone_gw {
    pid_t pid;
    char dir[64];
    char url[128];
    char sock[128];
};

/* A fresh directory /tmp/sbx-dl-<test_prefix()>XXXXXX (tools/leftovers.sh
 * finds what a run left by its prefix). */
static void
dl_tmpdir(char *dir, size_t n)
{
    snprintf(dir, n, "/tmp/sbx-dl-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(dir), "mkdtemp %s", dir);
}

static void
lone_gw_start(struct lone_gw *g, struct fake *f, const char *shard_url)
{
    dl_tmpdir(g->dir, sizeof(g->dir));
    snprintf(g->sock, sizeof(g->sock), "%s/gw.sock", g->dir);
    snprintf(g->url, sizeof(g->url), "ipc://%s", g->sock);
    char shard[300], sbxd[300];
    snprintf(shard, sizeof(shard), "fake=%s", shard_url);
    const char *bin = getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bin);
    g->pid = fork();
    cr_assert_geq(g->pid, 0);
    if (g->pid == 0) {
        /* A failed assertion ends the test process: the gateway goes too. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        execl(sbxd, sbxd, "gateway", "--listen", g->url, "--shard", shard, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && access(g->sock, F_OK) != 0; i++)
        usleep(25 * 1000);
    cr_assert_eq(access(g->sock, F_OK), 0, "the gateway did not listen at %s", g->url);
    if (!f)
        return; /* a shard URL where nothing listens */
    /* Connected to the fake shard: else a call sent at once is answered
     * SHARD_UNAVAILABLE ("Connection refused") before anything the test
     * does to the gateway (a fresh-clone CI run failed so).  The gateway
     * counts the pipe once it read the greeting: a moment after. */
    for (int i = 0; i < 200 && atomic_load(&f->greeted) == 0; i++)
        usleep(25 * 1000);
    cr_assert_gt(atomic_load(&f->greeted), 0, "the gateway never connected to the fake shard");
    usleep(100 * 1000);
}

static void
lone_gw_stop(struct lone_gw *g)
{
    if (g->pid > 0) {
        kill(g->pid, SIGCONT);
        kill(g->pid, SIGKILL);
        waitpid(g->pid, NULL, 0);
        g->pid = 0;
    }
    unlink(g->sock);
    rmdir(g->dir);
}

/* wait_stopped — wait until every thread of pid is stopped: kill() returns
 * before a thread that is running has taken its SIGSTOP. */
static void
wait_stopped(pid_t pid)
{
    for (int i = 0; i < 1000; i++) {
        char path[64];
        snprintf(path, sizeof(path), "/proc/%d/task", (int)pid);
        DIR *d = opendir(path);
        cr_assert_not_null(d, "no process %d", (int)pid);
        int running = 0, seen = 0;
        struct dirent *de;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.')
                continue;
            char stat[128], buf[512];
            snprintf(stat, sizeof(stat), "%s/%s/stat", path, de->d_name);
            FILE *f = fopen(stat, "r");
            if (!f)
                continue;
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            fclose(f);
            buf[n] = '\0';
            const char *p = strrchr(buf, ')');
            seen++;
            running += !(p && (p[2] == 'T' || p[2] == 't'));
        }
        closedir(d);
        if (seen && !running)
            return;
        usleep(10 * 1000);
    }
    cr_assert_fail("process %d did not stop", (int)pid);
}

/* open_client — a client of url; a gateway just started may have made its
 * socket file before it listens, so a refusal is retried for 5 s. */
static sbx_client *
open_client(const char *url)
{
    sbx_client *c = NULL;
    sbx_error err;
    int rc = 0;
    for (int i = 0; i < 100 && (rc = sbx_client_open(&c, url, &err)) != 0; i++)
        usleep(50 * 1000);
    cr_assert_eq(rc, 0, "%s: %s", err.code, err.message);
    return c;
}

/* ---------------------------------------------------------------------------
 * The client against fake gateways. */

Test(deadlines, a_gateway_that_never_answers_is_a_request_timeout, .timeout = 60)
{
    char dir[64], url[128];
    dl_tmpdir(dir, sizeof(dir));
    snprintf(url, sizeof(url), "ipc://%s/rep.sock", dir);
    nng_socket rep;
    cr_assert_eq(nng_rep0_open(&rep), 0);
    cr_assert_eq(nng_listen(rep, url, NULL, 0), 0); /* never reads */
    sbx_client *c = open_client(url);
    expect_ping_fails(c, "silent", 1500, "REQUEST_TIMEOUT", "ping");
    sbx_client_close(c);
    nng_close(rep);
    char sock[160];
    snprintf(sock, sizeof(sock), "%s/rep.sock", dir);
    unlink(sock);
    rmdir(dir);
}

Test(deadlines, half_a_reply_frame_is_a_request_timeout, .timeout = 60)
{
    struct fake f;
    char url[64];
    fake_start(&f, FAKE_HALF, url, sizeof(url));
    sbx_client *c = open_client(url);
    expect_ping_fails(c, "half", 1500, "REQUEST_TIMEOUT", "ping");
    /* The next call on the same client is bounded as well. */
    expect_ping_fails(c, "half", 1000, NULL, "second call");
    sbx_client_close(c);
    fake_stop(&f);
}

Test(deadlines, a_garbage_reply_is_an_error_not_a_hang, .timeout = 60)
{
    struct fake f;
    char url[64];
    fake_start(&f, FAKE_GARBAGE, url, sizeof(url));
    sbx_client *c = open_client(url);
    expect_ping_fails(c, "garbage", 1500, "INVALID_RESPONSE", "ping");
    sbx_client_close(c);
    fake_stop(&f);
}

/* ---------------------------------------------------------------------------
 * A real gateway in front of a fake shard. */

/* ran_false — whether err's context says `ran: false` (docs/protocol.md
 * "Retries": the gateway delivered no attempt of the request to a shard). */
static bool
ran_false(const sbx_error *err)
{
    return err->context_json && strstr(err->context_json, "\"ran\":false");
}

Test(deadlines, a_shard_that_never_answers_is_unavailable_in_time, .timeout = 60)
{
    struct fake f;
    char url[64];
    fake_start(&f, FAKE_SILENT, url, sizeof(url));
    struct lone_gw g;
    lone_gw_start(&g, &f, url);
    sbx_client *c = open_client(g.url);
    expect_ping_fails(c, "shard-silent", 2000, "SHARD_UNAVAILABLE", "ping");
    /* The shard took it: its outcome is unknown, never marked ran: false. */
    sbx_error err;
    int rc;
    timed_ping(c, "shard-silent", 1000, &rc, &err);
    cr_expect_neq(rc, 0);
    cr_expect(!ran_false(&err), "a delivered request marked not run: %s",
              err.context_json ? err.context_json : "(no context)");
    sbx_error_free(&err);
    sbx_client_close(c);
    lone_gw_stop(&g);
    fake_stop(&f);
}

/* A request the gateway could not deliver (its shard is not connected: not
 * started yet, or restarting) is SHARD_UNAVAILABLE with context ran: false,
 * so that a client's retry of it is not one of unknown outcome (a fresh-
 * clone CI run: the TypeScript SDK reported a status call made while a
 * shard of a just-started daemon was still connecting as "outcome
 * unknown" instead of the retry's SANDBOX_NOT_FOUND). */
Test(deadlines, an_undelivered_request_says_it_did_not_run, .timeout = 60)
{
    char dir[64], shard[128];
    dl_tmpdir(dir, sizeof(dir));
    snprintf(shard, sizeof(shard), "ipc://%s/nobody.sock", dir);
    struct lone_gw g;
    lone_gw_start(&g, NULL, shard);
    sbx_client *c = open_client(g.url);
    sbx_error err;
    int rc;
    double took = timed_ping(c, "shard-absent", 2000, &rc, &err);
    cr_expect_neq(rc, 0, "a ping with no shard succeeded");
    cr_expect_str_eq(err.code, "SHARD_UNAVAILABLE", "%s: %s", err.code, err.message);
    cr_expect(ran_false(&err), "no ran: false in %s",
              err.context_json ? err.context_json : "(no context)");
    cr_expect(took < 2000 + SLACK_MS, "answered after %.0f ms", took);
    sbx_error_free(&err);
    sbx_client_close(c);
    lone_gw_stop(&g);
    rmdir(dir);
}

Test(deadlines, a_shard_that_sends_half_a_frame_is_unavailable_in_time, .timeout = 60)
{
    struct fake f;
    char url[64];
    fake_start(&f, FAKE_HALF, url, sizeof(url));
    struct lone_gw g;
    lone_gw_start(&g, &f, url);
    sbx_client *c = open_client(g.url);
    for (int i = 0; i < 2; i++) {
        char what[32];
        snprintf(what, sizeof(what), "call %d", i);
        expect_ping_fails(c, "shard-half", 2000, "SHARD_UNAVAILABLE", what);
    }
    sbx_client_close(c);
    lone_gw_stop(&g);
    fake_stop(&f);
}

Test(deadlines, a_stopped_gateway_is_a_request_timeout, .timeout = 60)
{
    struct fake f;
    char url[64];
    fake_start(&f, FAKE_SILENT, url, sizeof(url));
    struct lone_gw g;
    lone_gw_start(&g, &f, url);
    sbx_client *c = open_client(g.url);
    cr_assert_eq(kill(g.pid, SIGSTOP), 0);
    wait_stopped(g.pid);
    sbx_error err;
    int rc;
    double took = timed_ping(c, "gw-stopped", 1500, &rc, &err);
    kill(g.pid, SIGCONT);
    cr_expect_neq(rc, 0);
    cr_expect_str_eq(err.code, "REQUEST_TIMEOUT", "%s: %s", err.code, err.message);
    cr_expect(took < 1500 + SLACK_MS, "answered after %.0f ms (deadline 1500)", took);
    sbx_error_free(&err);
    sbx_client_close(c);
    lone_gw_stop(&g);
    fake_stop(&f);
}

/* A gateway killed while a call waits on it, its socket removed: the call
 * ends by its deadline, and so does the next one. */
Test(deadlines, a_killed_gateway_and_a_removed_socket_end_calls_in_time, .timeout = 60)
{
    struct fake f;
    char url[64];
    fake_start(&f, FAKE_SILENT, url, sizeof(url));
    struct lone_gw g;
    lone_gw_start(&g, &f, url);
    sbx_client *c = open_client(g.url);
    pid_t killer = fork();
    cr_assert_geq(killer, 0);
    if (killer == 0) {
        usleep(300 * 1000);
        kill(g.pid, SIGKILL);
        unlink(g.sock);
        _exit(0);
    }
    sbx_error err;
    int rc;
    double took = timed_ping(c, "gw-killed", 3000, &rc, &err);
    waitpid(killer, NULL, 0);
    cr_expect_neq(rc, 0);
    cr_expect(!strcmp(err.code, "REQUEST_TIMEOUT") || !strcmp(err.code, "GATEWAY_UNAVAILABLE"),
              "%s: %s", err.code, err.message);
    cr_expect(took < 3000 + SLACK_MS, "answered after %.0f ms (deadline 3000)", took);
    sbx_error_free(&err);
    took = timed_ping(c, "gw-killed", 1000, &rc, &err);
    cr_expect_neq(rc, 0);
    cr_expect(!strcmp(err.code, "REQUEST_TIMEOUT") || !strcmp(err.code, "GATEWAY_UNAVAILABLE"),
              "%s: %s", err.code, err.message);
    cr_expect(took < 1000 + SLACK_MS, "second call answered after %.0f ms (deadline 1000)",
              took);
    sbx_error_free(&err);
    sbx_client_close(c);
    /* A new client finds nothing at the removed socket at once. */
    sbx_client *c2 = NULL;
    cr_expect_neq(sbx_client_open(&c2, g.url, &err), 0);
    cr_expect_str_eq(err.code, "GATEWAY_UNAVAILABLE", "%s: %s", err.code, err.message);
    waitpid(g.pid, NULL, 0);
    g.pid = 0;
    lone_gw_stop(&g);
    fake_stop(&f);
}

/* ---------------------------------------------------------------------------
 * The test daemon: a stopped shard. */

static pid_t stopped_shard;

static void
cont_shard(void)
{
    if (stopped_shard > 0)
        kill(stopped_shard, SIGCONT);
}

static pid_t
shard_of(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    cr_assert_eq(sbx_call(c, "status", id, NULL, 0, 0, NULL, &r, &err), 0, "%s", err.message);
    const msgpack_object *sb, *arr;
    sbx_str shard = {"", 0};
    cr_assert_eq(sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb), 0);
    sbx_wire_get_str(sb, "shard", &shard);
    char *name = sbx_str_dup(shard);
    sbx_reply_free(r);
    cr_assert_eq(sbx_call(c, "cluster.status", NULL, NULL, 0, 0, NULL, &r, &err), 0);
    pid_t pid = 0;
    cr_assert_eq(sbx_wire_get_array(sbx_reply_result(r), "shards", &arr), 0);
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        const msgpack_object *s = &arr->via.array.ptr[i], *st;
        sbx_str n = {"", 0};
        int64_t p = 0;
        sbx_wire_get_str(s, "name", &n);
        if (sbx_str_eq(n, name) && sbx_wire_get_map(s, "status", &st) == 0 &&
            sbx_wire_get_i64(st, "pid", &p) == 0)
            pid = (pid_t)p;
    }
    sbx_reply_free(r);
    free(name);
    return pid;
}

Test(deadlines, a_stopped_shard_is_unavailable_in_time, .timeout = 120, .fini = cont_shard)
{
    sbx_client *c = test_client();
    char *id = test_id("dl-stop");
    sbx_exec_result r;
    sbx_error err;
    cr_assert_eq(test_sh(c, id, "echo hi", 0, &r, &err), 0, "%s: %s", err.code, err.message);
    sbx_exec_result_free(&r);
    pid_t pid = shard_of(c, id);
    cr_assert_gt(pid, 0);
    stopped_shard = pid;
    cr_assert_eq(kill(pid, SIGSTOP), 0);
    wait_stopped(pid);
    /* A plain call and an exec whose own timeout is shorter than its deadline. */
    expect_ping_fails(c, id, 1500, "SHARD_UNAVAILABLE", "ping");
    double t0 = test_now_ms();
    int rc = test_sh(c, id, "echo late", 500, &r, &err);
    double took = test_now_ms() - t0;
    cr_expect_neq(rc, 0);
    cr_expect_str_eq(err.code, "SHARD_UNAVAILABLE", "%s: %s", err.code, err.message);
    /* exec's deadline is its timeout + 30 s (runtime/client.c). */
    cr_expect(took < 30500 + SLACK_MS, "exec answered after %.0f ms (deadline 30500)", took);
    sbx_exec_result_free(&r);
    sbx_error_free(&err);
    kill(pid, SIGCONT);
    stopped_shard = 0;
    /* Service comes back. */
    cr_expect_eq(test_sh(c, id, "echo back", 0, &r, &err), 0, "%s: %s", err.code, err.message);
    sbx_exec_result_free(&r);
    free(id);
    sbx_error_free(&err);
    sbx_client_close(c);
}

/* ---------------------------------------------------------------------------
 * The CLI, and streams. */

Test(deadlines, the_cli_gives_up_at_its_timeout, .timeout = 60)
{
    char dir[64], url[128], sock[160], sbx[300];
    dl_tmpdir(dir, sizeof(dir));
    snprintf(sock, sizeof(sock), "%s/rep.sock", dir);
    snprintf(url, sizeof(url), "ipc://%s", sock);
    nng_socket rep;
    cr_assert_eq(nng_rep0_open(&rep), 0);
    cr_assert_eq(nng_listen(rep, url, NULL, 0), 0); /* never reads */
    const char *bin = getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    snprintf(sbx, sizeof(sbx), "%s/sbx", bin);
    int out[2];
    cr_assert_eq(pipe(out), 0);
    double t0 = test_now_ms();
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(out[1], 2);
        dup2(out[1], 1);
        execl(sbx, sbx, "--gateway", url, "--timeout", "1500", "exec", "cli-silent", "true",
              (char *)NULL);
        _exit(127);
    }
    close(out[1]);
    char buf[4096];
    size_t n = 0;
    ssize_t k;
    while (n < sizeof(buf) - 1 && (k = read(out[0], buf + n, sizeof(buf) - 1 - n)) > 0)
        n += (size_t)k;
    buf[n] = '\0';
    close(out[0]);
    int st = 0;
    waitpid(pid, &st, 0);
    double took = test_now_ms() - t0;
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) != 0, "sbx exited %d", st);
    cr_expect(strstr(buf, "REQUEST_TIMEOUT") != NULL, "sbx said: %s", buf);
    cr_expect(took < 1500 + SLACK_MS, "sbx ended after %.0f ms (--timeout 1500)", took);
    nng_close(rep);
    unlink(sock);
    rmdir(dir);
}

/* A gateway that answers SHARD_UNAVAILABLE at once for `fast_ms`, then
 * nothing: a stream read that starts just before it goes silent. */
struct flaky_gw {
    nng_socket rep;
    double until;
    atomic_bool stop;
    pthread_t th;
};

static void *
flaky_gw_main(void *arg)
{
    struct flaky_gw *g = arg;
    while (!atomic_load(&g->stop)) {
        nng_msg *m = NULL;
        if (nng_recvmsg(g->rep, &m, 0) != 0)
            continue; /* NNG_ETIMEDOUT: look at stop again */
        nng_msg_free(m);
        if (test_now_ms() >= g->until)
            continue; /* silent from now on */
        sbx_enc e;
        char *buf;
        size_t len;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        sbx_enc_kint(&e, "v", 1);
        sbx_enc_kbool(&e, "ok", false);
        sbx_enc_str(&e, "error");
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "code", "SHARD_UNAVAILABLE");
        sbx_enc_kstr(&e, "message", "the shard is restarting");
        sbx_enc_end(&e);
        sbx_enc_end(&e);
        if (sbx_enc_finish(&e, &buf, &len) != 0)
            continue;
        nng_send(g->rep, buf, len, 0);
        free(buf);
    }
    return NULL;
}

Test(deadlines, a_stream_read_gives_up_within_its_bound, .timeout = 120)
{
    char dir[64], url[128], sock[160];
    dl_tmpdir(dir, sizeof(dir));
    snprintf(sock, sizeof(sock), "%s/rep.sock", dir);
    snprintf(url, sizeof(url), "ipc://%s", sock);
    struct flaky_gw g = {.until = test_now_ms() + 29000};
    cr_assert_eq(nng_rep0_open(&g.rep), 0);
    nng_socket_set_ms(g.rep, NNG_OPT_RECVTIMEO, 100);
    cr_assert_eq(nng_listen(g.rep, url, NULL, 0), 0);
    cr_assert_eq(pthread_create(&g.th, NULL, flaky_gw_main, &g), 0);
    sbx_client *c = open_client(url);
    sbx_stream *s = NULL;
    sbx_error err;
    cr_assert_eq(sbx_stream_open(c, "stream-flaky", "proc:p1", 0, &s, &err), 0);
    sbx_event ev;
    double t0 = test_now_ms();
    int rc = sbx_stream_next(s, &ev, &err);
    double took = test_now_ms() - t0;
    cr_expect_lt(rc, 0);
    cr_expect(!strcmp(err.code, "REQUEST_TIMEOUT") || !strcmp(err.code, "SHARD_UNAVAILABLE"),
              "%s: %s", err.code, err.message);
    /* sbx.h: reads that fail or go unanswered end it within 40 s. */
    cr_expect(took < 40000 + SLACK_MS, "sbx_stream_next returned after %.0f ms (bound 40000)",
              took);
    sbx_error_free(&err);
    sbx_stream_close(s);
    sbx_client_close(c);
    atomic_store(&g.stop, true);
    pthread_join(g.th, NULL);
    nng_close(g.rep);
    unlink(sock);
    rmdir(dir);
}
