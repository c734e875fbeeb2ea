/*
 * test_relay.c — sbx_relay_pump (runtime/relay.h), the byte pump behind
 * preview connections (gateway/preview.c) and the shard's relay into a
 * sandbox (actors/relay.c).
 *
 * A side that accepts and then stops reading — a stalled or hostile service
 * in a sandbox, a client that went silent — must stall only its direction:
 * the pump returns -ETIMEDOUT once idle_ms pass without traffic, and the
 * other direction keeps flowing meanwhile.  Until the pump's writes were
 * MSG_DONTWAIT, a send of a whole 64 KiB buffer after POLLOUT blocked until
 * all of it fitted — for ever, when the send buffer had less room than that
 * (TCP under memory pressure; here a small SO_SNDBUF) — and each such
 * connection kept one of the shard's relay threads (1,024) and one of the
 * sandbox's relay slots (128).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "runtime/relay.h"
#include "runtime/util.h"

/* A connected pair of TCP sockets on loopback (fds[0] connected, fds[1]
 * accepted): the relay's connections into sandboxes are TCP, whose POLLOUT
 * comes with room for less than a 64 KiB buffer (unix sockets' does not). */
static void
tcp_pair(int fds[2])
{
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(ls, 1), 0);
    cr_assert_eq(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    fds[0] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(fds[0], (struct sockaddr *)&a, sizeof(a)), 0);
    fds[1] = accept4(ls, NULL, NULL, SOCK_CLOEXEC);
    cr_assert_geq(fds[1], 0);
    close(ls);
}

struct pump_arg {
    int a, b;
    int64_t idle_ms;
    int rc;
    int64_t ended_ms;
};

static void *
pump_thread(void *arg)
{
    struct pump_arg *p = arg;
    p->rc = sbx_relay_pump(p->a, p->b, "GET / HTTP/1.1\r\n\r\n", 18, p->idle_ms);
    p->ended_ms = sbx_mono_ms();
    return NULL;
}

/* The pump between two TCP pairs, on a thread: client[0] is the user,
 * client[1] the pump's a; service[0] the pump's b, service[1] the service.
 * The send buffer towards the service is small, as the kernel leaves it
 * under TCP memory pressure (tcp_mem): POLLOUT then comes with room for
 * less than the pump's 64 KiB buffer, and a blocking send of it waited for
 * the rest for ever.  p->idle_ms is the caller's. */
static void
start_pump(int client[2], int service[2], struct pump_arg *p, pthread_t *th)
{
    tcp_pair(client);
    tcp_pair(service);
    int sb = 16384;
    cr_assert_eq(setsockopt(service[0], SOL_SOCKET, SO_SNDBUF, &sb, sizeof(sb)), 0);
    p->a = client[1];
    p->b = service[0];
    cr_assert_eq(pthread_create(th, NULL, pump_thread, p), 0);
}

/* Fill the client's direction until nothing more goes in for 300 ms (the
 * pump's buffer and both kernel buffers full); the time of the last byte. */
static int64_t
fill(int fd, size_t *total)
{
    static char chunk[65536];
    memset(chunk, 'x', sizeof(chunk));
    int64_t last = sbx_mono_ms();
    while (sbx_mono_ms() - last < 300) {
        ssize_t w = send(fd, chunk, sizeof(chunk), MSG_DONTWAIT | MSG_NOSIGNAL);
        if (w > 0) {
            *total += (size_t)w;
            last = sbx_mono_ms();
        } else {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    return last;
}

Test(relay, a_side_that_stops_reading_does_not_hold_the_pump_past_its_idle_limit,
     .timeout = 30)
{
    int client[2], service[2];
    struct pump_arg p = {.idle_ms = 500};
    pthread_t th;
    start_pump(client, service, &p, &th);
    size_t total = 0;
    int64_t last = fill(client[0], &total);
    cr_assert_gt(total, 65536, "only %zu bytes went in", total);
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 5;
    int jr = pthread_timedjoin_np(th, NULL, &until);
    if (jr != 0) {
        close(service[1]); /* frees a pump blocked in send (EPIPE), so the test can end */
        pthread_join(th, NULL);
        cr_assert_fail("the pump still ran 5 s after the last byte (%zu bytes in); its idle "
                       "limit is 500 ms",
                       total);
    }
    cr_expect_eq(p.rc, -ETIMEDOUT, "the pump returned %d", p.rc);
    cr_expect_lt(p.ended_ms - last, 2500, "the pump ended %lld ms after the last byte",
                 (long long)(p.ended_ms - last));
    close(client[0]);
    close(client[1]);
    close(service[0]);
    close(service[1]);
}

/* The other direction keeps flowing while one is stalled: the service
 * stops reading but still answers, and the answer reaches the user. */
Test(relay, the_other_direction_flows_while_one_is_stalled, .timeout = 30)
{
    int client[2], service[2];
    struct pump_arg p = {.idle_ms = 2000};
    pthread_t th;
    start_pump(client, service, &p, &th);
    size_t total = 0;
    fill(client[0], &total);
    const char answer[] = "HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    cr_assert_eq(send(service[1], answer, sizeof(answer) - 1, MSG_NOSIGNAL),
                 (ssize_t)sizeof(answer) - 1);
    char got[128] = "";
    struct timeval tv = {3, 0};
    setsockopt(client[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    ssize_t n = recv(client[0], got, sizeof(got) - 1, 0);
    close(service[1]); /* the service goes: the pump ends */
    pthread_join(th, NULL);
    cr_assert_eq(n, (ssize_t)sizeof(answer) - 1, "the answer did not come through (%zd)", n);
    cr_expect_eq(memcmp(got, answer, (size_t)n), 0);
    close(client[0]);
    close(client[1]);
    close(service[0]);
}
