/*
 * tlstest.c — the TLS tests' PKI, ClientHello capture and reset storms
 * (tlstest.h).
 */
#include "tlstest.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/util.h"

void
tlstest_sbx_cert(const char *const *args)
{
    const char *argv[16] = {"tools/sbx-cert"};
    int n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        int fd = open("/dev/null", O_WRONLY);
        dup2(fd, 1);
        execv(argv[0], (char **)argv);
        _exit(127);
    }
    int st;
    waitpid(pid, &st, 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "tools/sbx-cert %s %s failed", args[0],
              args[1] ? args[1] : "");
}

void
tlstest_pki_make(struct tlstest_pki *p, const char *tag, const char *const *nodes)
{
    snprintf(p->dir, sizeof(p->dir), "/tmp/sbx-tls-%sXXXXXX", tag);
    cr_assert_not_null(mkdtemp(p->dir));
    snprintf(p->ca, sizeof(p->ca), "%s/ca", p->dir);
    snprintf(p->other, sizeof(p->other), "%s/other", p->dir);
    tlstest_sbx_cert((const char *[]){"ca", p->ca, NULL});
    for (int i = 0; nodes[i]; i++)
        tlstest_sbx_cert((const char *[]){"node", p->ca, nodes[i], "--san", "IP:127.0.0.1", NULL});
    tlstest_sbx_cert((const char *[]){"ca", p->other, NULL});
    tlstest_sbx_cert((const char *[]){"node", p->other, "evil", NULL});
}

void
tlstest_pki_remove(struct tlstest_pki *p)
{
    if (p->dir[0])
        sbx_rm_rf(p->dir);
    p->dir[0] = '\0';
}

const char *
tlstest_pem(const char *dir, const char *name, const char *ext)
{
    static char ring[16][340];
    static int k;
    char *b = ring[k++ % 16];
    snprintf(b, sizeof(ring[0]), "%s/%s.%s", dir, name, ext);
    return b;
}

size_t
tlstest_client_hello(nng_tls_config *cfg, unsigned char *buf, size_t n)
{
    int lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    cr_assert(lfd >= 0 && bind(lfd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
              listen(lfd, 4) == 0 && getsockname(lfd, (struct sockaddr *)&a, &len) == 0);
    char url[64];
    snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", ntohs(a.sin_port));
    nng_stream_dialer *d;
    nng_aio *aio;
    cr_assert_eq(nng_stream_dialer_alloc(&d, url), 0);
    cr_assert_eq(nng_stream_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, cfg), 0);
    cr_assert_eq(nng_aio_alloc(&aio, NULL, NULL), 0);
    nng_aio_set_timeout(aio, 5000);
    nng_stream_dialer_dial(d, aio);
    int fd = accept(lfd, NULL, NULL);
    nng_aio_wait(aio);
    cr_assert(fd >= 0 && nng_aio_result(aio) == 0);
    nng_stream *st = nng_aio_get_output(aio, 0);
    char one = 0;
    nng_iov iov = {.iov_buf = &one, .iov_len = 1};
    nng_aio_set_iov(aio, 1, &iov);
    nng_stream_send(st, aio); /* starts the handshake; never completes */
    size_t got = 0, want = 5;
    while (got < want) {
        ssize_t r = read(fd, buf + got, n - got);
        cr_assert_gt(r, 0, "no ClientHello");
        got += (size_t)r;
        if (got >= 5)
            want = 5 + ((size_t)buf[3] << 8 | buf[4]);
        cr_assert_leq(want, n);
    }
    close(fd);
    close(lfd);
    nng_aio_wait(aio);
    nng_stream_free(st);
    nng_stream_dialer_free(d);
    nng_aio_free(aio);
    return want;
}

void
tlstest_reset_storm(int port, const unsigned char *hello, size_t hn, int count, unsigned *seed)
{
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    for (int i = 0; i < count; i++) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        cr_assert(fd >= 0);
        if (connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0 &&
            write(fd, hello, hn) == (ssize_t)hn && i % 3)
            usleep((useconds_t)(rand_r(seed) % 3000)); /* mid-handshake */
        struct linger lg = {.l_onoff = 1, .l_linger = 0}; /* close with a reset */
        setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
        close(fd);
    }
}
