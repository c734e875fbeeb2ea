/*
 * test_preview_fair.c — preview fairness between tenants (issue 16 item 4;
 * docs/http.md "Preview URLs", gateway/preview_int.h): one sandbox's
 * service accepts connections and never answers, a client floods its
 * preview URL with thousands of connections from its own address, and a
 * neighbour's preview and the API still answer; the flood gets at most
 * PREVIEW_PER_SANDBOX stalled requests (the rest 503 RESOURCE_BUSY at once,
 * or refused beyond the per-client connection cap), and the stalled ones
 * end with 504 REQUEST_TIMEOUT once the upstream has sent no head for 30 s.
 *
 * Correctness with generous deadlines only; the neighbour's latencies are
 * printed as figures (a loaded 2-core host makes them noisy), never
 * asserted.  The flood comes from 127.0.0.2 (any 127/8 address is this
 * host's loopback), the neighbour and the API from 127.0.0.1.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/httpapi.h"
#include "../support/sdk.h"

#define FLOOD 4500          /* more than the front's 4096 connections */
#define PER_SANDBOX 64      /* PREVIEW_PER_SANDBOX, gateway/preview_int.h */

/* exec over HTTP; asserts exit 0. */
static void
hrun(const char *id, const char *cmd)
{
    struct hresp r;
    json_t *j = json_pack("{s:s}", "command", cmd);
    char *b = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    apif("POST", b, &r, "/v1/sandboxes/%s/exec", id);
    free(b);
    assert_status(r, 200, cmd);
    cr_assert_eq(jint(r.json, "exitCode"), 0, "%s: %s", cmd, r.body);
    hresp_free(&r);
}

/* Start the Python program prog in the background in sandbox id and wait for port. */
static void
serve(const char *id, int port, const char *prog)
{
    struct hresp r;
    json_t *j = json_pack("{s:s,s:s}", "path", "/workspace/srv.py", "content", prog);
    char *b = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    apif("POST", b, &r, "/v1/sandboxes/%s/file.write", id);
    free(b);
    assert_status(r, 200, "file.write srv.py");
    hresp_free(&r);
    apif("POST", "{\"command\":\"python3 /workspace/srv.py\",\"processId\":\"srv\"}", &r,
         "/v1/sandboxes/%s/process.start", id);
    assert_status(r, 200, "process.start");
    hresp_free(&r);
    b = hfmt("{\"processId\":\"srv\",\"port\":%d,\"mode\":\"tcp\",\"timeout\":30000}", port);
    apif("POST", b, &r, "/v1/sandboxes/%s/process.waitForPort", id);
    free(b);
    assert_status(r, 200, "waitForPort");
    hresp_free(&r);
}

/* port.expose: the preview host "{port}-{id}-{token}.localhost:{http}". */
static char *
expose_host(const char *id, int port)
{
    struct hresp r;
    char *b = hfmt("{\"port\":%d}", port);
    apif("POST", b, &r, "/v1/sandboxes/%s/port.expose", id);
    free(b);
    assert_status(r, 200, "port.expose");
    const char *u = strstr(jstr(r.json, "url"), "://");
    cr_assert(u, "url %s", jstr(r.json, "url"));
    char *host = hfmt("%.*s", (int)strcspn(u + 3, "/"), u + 3);
    hresp_free(&r);
    return host;
}

/* A connection from 127.0.0.2 to the front carrying one preview request. */
static int
flood_conn(int http_port, const char *host)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in src = {.sin_family = AF_INET}, dst = {.sin_family = AF_INET};
    inet_pton(AF_INET, "127.0.0.2", &src.sin_addr);
    inet_pton(AF_INET, "127.0.0.1", &dst.sin_addr);
    dst.sin_port = htons((uint16_t)http_port);
    cr_assert(bind(fd, (struct sockaddr *)&src, sizeof(src)) == 0, "bind 127.0.0.2: %s",
              strerror(errno));
    if (connect(fd, (struct sockaddr *)&dst, sizeof(dst)) != 0) {
        close(fd);
        return -1;
    }
    char req[512];
    int n = snprintf(req, sizeof(req), "GET / HTTP/1.1\r\nHost: %s\r\n\r\n", host);
    if (send(fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return -1;
    }
    return fd;
}

enum { F_SILENT, F_503, F_504, F_OTHER, F_CLOSED };

/* What has arrived on a flood connection (non-blocking read). */
static int
flood_state(int fd, char *buf, size_t n)
{
    ssize_t r = recv(fd, buf, n - 1, MSG_DONTWAIT | MSG_PEEK);
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
        return F_SILENT;
    if (r <= 0)
        return F_CLOSED;
    buf[r] = 0;
    if (!strncmp(buf, "HTTP/1.1 503", 12))
        return F_503;
    if (!strncmp(buf, "HTTP/1.1 504", 12))
        return F_504;
    return F_OTHER;
}

Test(preview_fair, a_stalled_service_does_not_take_previews_or_the_api_from_neighbours,
     .timeout = 300)
{
    struct rlimit rl;
    getrlimit(RLIMIT_NOFILE, &rl);
    cr_assert(rl.rlim_max >= FLOOD + 256, "RLIMIT_NOFILE hard limit %llu is too low",
              (unsigned long long)rl.rlim_max);
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);

    char *stall = test_id("fstall"), *nb = test_id("fnb");
    /* A service that accepts every connection and never answers. */
    serve(stall, 8090,
          "import socket\n"
          "s = socket.socket()\n"
          "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
          "s.bind(('127.0.0.1', 8090))\n"
          "s.listen(4096)\n"
          "held = []\n"
          "while True:\n"
          "    held.append(s.accept()[0])\n");
    serve(nb, 8091,
          "import http.server\n"
          "class H(http.server.BaseHTTPRequestHandler):\n"
          "    def do_GET(self):\n"
          "        b = b'neighbour-ok'\n"
          "        self.send_response(200)\n"
          "        self.send_header('Content-Length', str(len(b)))\n"
          "        self.end_headers()\n"
          "        self.wfile.write(b)\n"
          "    def log_message(self, *a):\n"
          "        pass\n"
          "http.server.ThreadingHTTPServer(('127.0.0.1', 8091), H).serve_forever()\n");
    char *shost = expose_host(stall, 8090), *nhost = expose_host(nb, 8091);

    /* The flood. */
    int *fds = sbx_xcalloc(FLOOD, sizeof(int));
    int opened = 0;
    double t0 = test_now_ms();
    for (int i = 0; i < FLOOD; i++) {
        fds[i] = flood_conn(http_port(), shost);
        opened += fds[i] >= 0;
    }
    fprintf(stderr, "[figure] %d of %d flood connections opened in %.0f ms\n", opened, FLOOD,
            test_now_ms() - t0);

    /* The neighbour's preview and the API, while the flood is held. */
    char *nurl = hfmt("http://%s/", nhost);
    for (int i = 0; i < 5; i++) {
        struct hresp r;
        struct hopts o = {.timeout_ms = 60000};
        http_req("GET", nurl, &o, &r);
        cr_expect_eq(r.status, 200, "the neighbour's preview: status %ld %s (%s)", r.status,
                     r.err, r.body ? r.body : "");
        cr_expect(r.body && !strcmp(r.body, "neighbour-ok"), "the neighbour's page: %s",
                  r.body ? r.body : "");
        fprintf(stderr, "[figure] neighbour preview %d: %.1f ms\n", i, r.total_ms);
        hresp_free(&r);
        double a0 = test_now_ms();
        api("GET", "/v1/health", NULL, &r);
        cr_expect_eq(r.status, 200, "GET /v1/health during the flood: %ld %s", r.status, r.err);
        hresp_free(&r);
        hrun(nb, "true");
        fprintf(stderr, "[figure] health + exec %d: %.1f ms\n", i, test_now_ms() - a0);
    }

    /* The flood itself: at most PER_SANDBOX requests stalled; the rest were
     * answered 503 or refused (closed) at once.  Generous: 60 s for the
     * answers to arrive. */
    char buf[64];
    int silent = FLOOD, busy = 0, closed = 0;
    double until = test_now_ms() + 60000;
    while (silent > PER_SANDBOX && test_now_ms() < until) {
        silent = busy = closed = 0;
        for (int i = 0; i < FLOOD; i++) {
            int st = fds[i] < 0 ? F_CLOSED : flood_state(fds[i], buf, sizeof(buf));
            silent += st == F_SILENT;
            busy += st == F_503;
            closed += st == F_CLOSED;
        }
        if (silent > PER_SANDBOX)
            usleep(200 * 1000);
    }
    fprintf(stderr, "[figure] flood: %d stalled, %d answered 503, %d refused or closed\n", silent,
            busy, closed);
    cr_expect_leq(silent, PER_SANDBOX,
                  "%d flood requests are held by the stalled service (cap %d; %d got 503, %d "
                  "closed)",
                  silent, PER_SANDBOX, busy, closed);
    cr_expect_gt(busy, 0, "no flood request was refused with 503 RESOURCE_BUSY");

    /* The stalled ones end: 504 once no head came for 30 s (generous: 120 s). */
    until = test_now_ms() + 120000;
    int still = silent, timed = 0;
    while (still > 0 && test_now_ms() < until) {
        still = timed = 0;
        for (int i = 0; i < FLOOD; i++) {
            if (fds[i] < 0)
                continue;
            int st = flood_state(fds[i], buf, sizeof(buf));
            still += st == F_SILENT;
            timed += st == F_504;
        }
        if (still)
            sleep(1);
    }
    cr_expect_eq(still, 0, "%d flood requests never ended", still);
    cr_expect_geq(timed, silent > 0 ? 1 : 0, "no stalled request ended with 504");
    for (int i = 0; i < FLOOD; i++)
        if (fds[i] >= 0)
            close(fds[i]);
    free(fds);
    free(nurl);
    free(shost);
    free(nhost);
    hdone(stall);
    hdone(nb);
}
