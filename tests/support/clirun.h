/*
 * clirun.h — header-only helpers for the tests that run the `sbx` CLI as a
 * child process (tests/integration/test_cli*.c): spawn it with a deadline,
 * feed its stdin, collect stdout and stderr, reap it, and assert on what a
 * user sees (output, exit status).  Everything is `static inline`, as in
 * sdk.h, so no Makefile change is needed.
 *
 * A test file's suite .fini calls cli_reap_all(), which kills (by pid) and
 * reaps the CLIs a failed assertion left running.  The binary is
 * $SBX_BIN/sbx (default build/asan/bin/sbx).
 */
#ifndef SBX_TEST_CLIRUN_H
#define SBX_TEST_CLIRUN_H

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "harness.h"

/* How long one CLI run may take before it counts as hung. */
#define CLI_DEADLINE_MS 60000

/* The CLIs running now (by pid; 0 = free slot), of this test process. */
static pid_t cli_kids[8];

/* kid_track — note a running CLI (replace 0) or forget a reaped one (pid 0). */
static inline void
kid_track(pid_t pid, pid_t replace)
{
    for (size_t i = 0; i < SBX_ARRAY_LEN(cli_kids); i++)
        if (cli_kids[i] == replace) {
            cli_kids[i] = pid;
            return;
        }
}

/* cli_reap_all — kill (SIGKILL, by pid) and reap the CLIs still running. */
static inline void
cli_reap_all(void)
{
    for (size_t i = 0; i < SBX_ARRAY_LEN(cli_kids); i++)
        if (cli_kids[i] > 0) {
            kill(cli_kids[i], SIGKILL);
            waitpid(cli_kids[i], NULL, 0);
            cli_kids[i] = 0;
        }
}

/* One run of the CLI. */
struct cli {
    pid_t pid;
    int in, out, err;  /* our ends of its stdin, stdout and stderr; -1 once closed */
    const char *in_data;
    size_t in_len, in_off;
    sbx_buf o, e;      /* what it printed (NUL-terminated after cli_pump) */
    int status;        /* exit status, 128+N when killed by signal N; -1 while running */
    char what[320];    /* its command line, for messages */
};

static inline const char *
sbx_path(void)
{
    static char path[512];
    const char *b = getenv("SBX_BIN");
    snprintf(path, sizeof(path), "%s/sbx", b && *b ? b : "build/asan/bin");
    return path;
}

/* cli_spawn — start `sbx [--gateway GW] ARGS...` (GW NULL: none) with
 * `in` on its stdin (NULL: stdin at EOF at once). */
static inline void
cli_spawn(struct cli *c, const char *gw, const char *in, size_t in_len, const char *const *args)
{
    const char *argv[64];
    int n = 0, pin[2], pout[2], perr[2];
    memset(c, 0, sizeof(*c));
    c->status = -1;
    sbx_buf_init(&c->o);
    sbx_buf_init(&c->e);
    argv[n++] = sbx_path();
    if (gw) {
        argv[n++] = "--gateway";
        argv[n++] = gw;
    }
    for (int i = 0; args[i] && n < 63; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    size_t w = 0;
    for (int i = 1; i < n && w < sizeof(c->what); i++)
        w += (size_t)snprintf(c->what + w, sizeof(c->what) - w, "%s'%s'", i > 1 ? " " : "sbx ",
                              argv[i]);
    /* A child that exits before reading its stdin must not kill us. */
    signal(SIGPIPE, SIG_IGN);
    cr_assert(pipe2(pin, O_CLOEXEC) == 0 && pipe2(pout, O_CLOEXEC) == 0 &&
              pipe2(perr, O_CLOEXEC) == 0, "pipe2: %s", strerror(errno));
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* A test process that dies (its own timeout) takes the CLI with it. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        signal(SIGPIPE, SIG_DFL);
        dup2(pin[0], STDIN_FILENO);
        dup2(pout[1], STDOUT_FILENO);
        dup2(perr[1], STDERR_FILENO);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    kid_track(pid, 0);
    close(pin[0]);
    close(pout[1]);
    close(perr[1]);
    c->pid = pid;
    c->in = pin[1];
    c->out = pout[0];
    c->err = perr[0];
    c->in_data = in;
    c->in_len = in_len;
    if (!in) {
        close(c->in);
        c->in = -1;
    }
    for (int fd = 0; fd < 3; fd++) {
        int f = fd == 0 ? c->in : fd == 1 ? c->out : c->err;
        if (f >= 0)
            fcntl(f, F_SETFL, fcntl(f, F_GETFL) | O_NONBLOCK);
    }
}

static inline void
close_fd(int *fd)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
}

static inline void
terminate(sbx_buf *b)
{
    sbx_buf_append(b, "", 1);
    b->len--;
}

/* cli_pump — feed its stdin and collect its output for up to ms
 * milliseconds; true once its stdout and stderr are both at EOF. */
static inline bool
cli_pump(struct cli *c, int ms)
{
    double until = test_now_ms() + ms;
    while (c->out >= 0 || c->err >= 0) {
        struct pollfd p[3];
        int *fds[3], n = 0;
        if (c->in >= 0) {
            p[n] = (struct pollfd){.fd = c->in, .events = POLLOUT};
            fds[n++] = &c->in;
        }
        if (c->out >= 0) {
            p[n] = (struct pollfd){.fd = c->out, .events = POLLIN};
            fds[n++] = &c->out;
        }
        if (c->err >= 0) {
            p[n] = (struct pollfd){.fd = c->err, .events = POLLIN};
            fds[n++] = &c->err;
        }
        int left = (int)(until - test_now_ms());
        int r = poll(p, (nfds_t)n, left > 0 ? left : 0);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (int i = 0; i < n; i++) {
            if (!p[i].revents)
                continue;
            if (fds[i] == &c->in) {
                ssize_t k = write(c->in, c->in_data + c->in_off, c->in_len - c->in_off);
                if (k > 0)
                    c->in_off += (size_t)k;
                if ((k < 0 && errno != EAGAIN) || c->in_off == c->in_len)
                    close_fd(&c->in);
                continue;
            }
            char buf[65536];
            ssize_t k = read(*fds[i], buf, sizeof(buf));
            if (k > 0)
                sbx_buf_append(fds[i] == &c->out ? &c->o : &c->e, buf, (size_t)k);
            else if (k == 0 || errno != EAGAIN)
                close_fd(fds[i]);
        }
    }
    terminate(&c->o);
    terminate(&c->e);
    return c->out < 0 && c->err < 0;
}

/* cli_finish — collect the rest of its output and reap it; a CLI still
 * running after ms milliseconds is killed and fails the test. */
static inline void
cli_finish(struct cli *c, int ms)
{
    double until = test_now_ms() + ms;
    bool hung = !cli_pump(c, ms);
    int st = 0;
    pid_t w;
    while (((w = waitpid(c->pid, &st, WNOHANG)) == 0 || (w < 0 && errno == EINTR)) && !hung) {
        if (test_now_ms() > until)
            hung = true;
        else
            usleep(5000);
    }
    if (w == 0) {
        kill(c->pid, SIGKILL);
        while (waitpid(c->pid, &st, 0) < 0 && errno == EINTR)
            ;
    }
    kid_track(0, c->pid);
    close_fd(&c->in);
    close_fd(&c->out);
    close_fd(&c->err);
    c->status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    cr_assert(!hung, "%s hung: killed after %d ms\nstdout: %s\nstderr: %s", c->what, ms, c->o.p,
              c->e.p);
}

static inline struct cli
cli_run(const char *gw, const char *in, size_t in_len, const char *const *args)
{
    struct cli c;
    cli_spawn(&c, gw, in, in_len, args);
    cli_finish(&c, CLI_DEADLINE_MS);
    return c;
}

static inline void
cli_free(struct cli *c)
{
    sbx_buf_free(&c->o);
    sbx_buf_free(&c->e);
}

/* sbx ARGS... against the test daemon; sbx_in with bytes on its stdin. */
#define sbx(...) cli_run(test_url(), NULL, 0, (const char *const[]){__VA_ARGS__, NULL})
#define sbx_in(data, len, ...)                                                                 \
    cli_run(test_url(), (data), (len), (const char *const[]){__VA_ARGS__, NULL})

/* Assertions on a run; they name the command line and show its output. */
#define expect_status(r, want)                                                                 \
    cr_expect_eq((r).status, (want), "%s: exit %d, expected %d\nstdout: %s\nstderr: %s",      \
                 (r).what, (r).status, (want), (r).o.p, (r).e.p)
#define assert_status(r, want)                                                                 \
    cr_assert_eq((r).status, (want), "%s: exit %d, expected %d\nstdout: %s\nstderr: %s",      \
                 (r).what, (r).status, (want), (r).o.p, (r).e.p)
#define expect_out(r, want)                                                                    \
    cr_expect_str_eq((r).o.p, (want), "%s: stdout '%s', expected '%s' (stderr: %s)", (r).what, \
                     (r).o.p, (want), (r).e.p)
#define expect_err(r, want)                                                                    \
    cr_expect_str_eq((r).e.p, (want), "%s: stderr '%s', expected '%s'", (r).what, (r).e.p,    \
                     (want))
#define expect_out_has(r, s)                                                                   \
    cr_expect(strstr((r).o.p, (s)) != NULL, "%s: stdout lacks '%s':\n%s\nstderr: %s",          \
              (r).what, (s), (r).o.p, (r).e.p)
#define expect_out_lacks(r, s)                                                                 \
    cr_expect(strstr((r).o.p, (s)) == NULL, "%s: stdout has '%s':\n%s", (r).what, (s), (r).o.p)
#define expect_err_has(r, s)                                                                   \
    cr_expect(strstr((r).e.p, (s)) != NULL, "%s: stderr lacks '%s':\n%s", (r).what, (s),      \
              (r).e.p)

/* expect_fails — exit 1 with "sbx: CODE: …" on stderr and nothing on stdout. */
#define expect_fails(r, code)                                                                  \
    do {                                                                                       \
        expect_status((r), 1);                                                                 \
        expect_err_has((r), "sbx: " code ": ");                                                \
        expect_out((r), "");                                                                   \
    } while (0)

/* run_ok — run, expect exit 0, free. */
#define run_ok(...)                                                                            \
    do {                                                                                       \
        struct cli r_ = sbx(__VA_ARGS__);                                                      \
        expect_status(r_, 0);                                                                  \
        cli_free(&r_);                                                                         \
    } while (0)

/* json_of — stdout parsed as one JSON document (caller json_decref's). */
static inline json_t *
json_of(const struct cli *r)
{
    json_error_t je;
    json_t *j = json_loads(r->o.p, JSON_ALLOW_NUL, &je);
    cr_assert_not_null(j, "%s: stdout is not JSON (%s, line %d):\n%s", r->what, je.text, je.line,
                       r->o.p);
    return j;
}

/* json_lines — stdout parsed as one JSON document per line, as an array. */
static inline json_t *
json_lines(const struct cli *r)
{
    json_t *arr = json_array();
    char *save = NULL, *copy = sbx_xstrdup(r->o.p);
    for (char *l = strtok_r(copy, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
        json_error_t je;
        json_t *j = json_loads(l, JSON_ALLOW_NUL, &je);
        cr_assert_not_null(j, "%s: line is not JSON (%s): %s", r->what, je.text, l);
        json_array_append_new(arr, j);
    }
    free(copy);
    return arr;
}

/* has_line — whether text holds `line` as a whole line. */
static inline bool
has_line(const char *text, const char *line)
{
    size_t n = strlen(line);
    for (const char *p = text; (p = strstr(p, line)) != NULL; p++)
        if ((p == text || p[-1] == '\n') && p[n] == '\n')
            return true;
    return false;
}

#endif
