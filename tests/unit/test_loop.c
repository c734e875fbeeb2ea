/*
 * test_loop.c — unit tests for runtime/loop.h, the epoll/timer/post event loop.
 *
 * Covers: timers fire once, in deadline order (ties in creation order) and
 * not early; cancelled timers never fire (cancelled before the run or from a
 * callback); sbx_loop_post from several threads runs every callback exactly
 * once, on the loop thread, in each thread's posting order; fd watches see
 * EPOLLIN/EPOLLOUT on a pipe, are level-triggered, honour sbx_loop_modify,
 * and may be unwatched inside a callback (their own or another ready one);
 * sbx_loop_stop from a callback or another thread, and sbx_loop_run running
 * again afterwards; sbx_loop_free dropping pending posts without running them.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "runtime/loop.h"
#include "runtime/util.h"

static sbx_loop *
new_loop(void)
{
    sbx_loop *l = NULL;
    int rc = sbx_loop_new(&l);
    cr_assert_eq(rc, 0, "sbx_loop_new: %d", rc);
    cr_assert_not_null(l);
    return l;
}

/* A timer that stops the loop and records that it did. */
static void
stop_cb(sbx_loop *l, void *arg)
{
    if (arg)
        *(bool *)arg = true;
    sbx_loop_stop(l);
}

/* ---------------------------------------------------------------------------------
 * Timers. */

struct fired {
    int order[32];
    int64_t at[32];
    int n, want;
};

struct tmr {
    struct fired *f;
    int idx;
};

static void
record_cb(sbx_loop *l, void *arg)
{
    struct tmr *t = arg;
    struct fired *f = t->f;
    if (f->n < 32) {
        f->order[f->n] = t->idx;
        f->at[f->n] = sbx_mono_ms();
    }
    f->n++;
    if (f->n == f->want)
        sbx_loop_stop(l);
}

Test(loop, timers_fire_in_deadline_order, .timeout = 30)
{
    sbx_loop *l = new_loop();
    /* Deadlines 10 ms apart (creation jitter is far below that); equal delays
     * fire in creation order. */
    static const int64_t delay[] = {50, 10, 30, 0, 20, 40, 10, 0, 60, 30};
    enum { N = SBX_ARRAY_LEN(delay) };
    struct fired f = {.want = N};
    struct tmr t[N];
    uint64_t ids[N];
    int64_t start = sbx_mono_ms();
    for (int i = 0; i < N; i++) {
        t[i] = (struct tmr){&f, i};
        ids[i] = sbx_loop_timer(l, delay[i], record_cb, &t[i]);
        cr_assert_gt(ids[i], 0u, "timer ids are > 0");
        for (int j = 0; j < i; j++)
            cr_assert_neq(ids[i], ids[j], "timer ids are unique");
    }
    bool watchdog = false;
    uint64_t wd = sbx_loop_timer(l, 10000, stop_cb, &watchdog);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_assert(!watchdog, "the loop stopped only by the watchdog: %d of %d timers fired", f.n, N);
    cr_assert_eq(f.n, N, "%d timers fired, want %d", f.n, N);

    /* Expected order: stable sort of the indexes by delay. */
    int want[N];
    for (int i = 0; i < N; i++)
        want[i] = i;
    for (int i = 1; i < N; i++)
        for (int j = i; j > 0 && delay[want[j - 1]] > delay[want[j]]; j--) {
            int x = want[j];
            want[j] = want[j - 1];
            want[j - 1] = x;
        }
    for (int i = 0; i < N; i++) {
        cr_expect_eq(f.order[i], want[i], "firing %d was timer %d (delay %lld), want timer %d",
                     i, f.order[i], (long long)delay[f.order[i]], want[i]);
        cr_expect_geq(f.at[i] - start, delay[f.order[i]], "timer %d fired %lld ms early",
                      f.order[i], (long long)(delay[f.order[i]] - (f.at[i] - start)));
    }
    sbx_loop_cancel(l, wd);
    sbx_loop_free(l);
}

struct cancel_ctx {
    int fired[4];
    uint64_t id[4];
};

static void
count_a(sbx_loop *l, void *arg)
{
    struct cancel_ctx *c = arg;
    c->fired[0]++;
    sbx_loop_cancel(l, c->id[2]); /* cancel a pending timer from a callback */
    sbx_loop_cancel(l, c->id[0]); /* cancelling the timer that is firing: a no-op */
}

static void
count_b(sbx_loop *l, void *arg)
{
    (void)l;
    ((struct cancel_ctx *)arg)->fired[1]++;
}

static void
count_d(sbx_loop *l, void *arg)
{
    (void)l;
    ((struct cancel_ctx *)arg)->fired[2]++;
}

static void
count_e(sbx_loop *l, void *arg)
{
    (void)l;
    ((struct cancel_ctx *)arg)->fired[3]++;
}

Test(loop, cancelled_timers_never_fire, .timeout = 30)
{
    sbx_loop *l = new_loop();
    struct cancel_ctx c = {{0}, {0}};
    c.id[0] = sbx_loop_timer(l, 20, count_a, &c);
    c.id[1] = sbx_loop_timer(l, 10, count_b, &c); /* cancelled before the run */
    c.id[2] = sbx_loop_timer(l, 40, count_d, &c); /* cancelled by count_a */
    c.id[3] = sbx_loop_timer(l, 0, count_e, &c);  /* cancelled, then re-cancelled */
    sbx_loop_cancel(l, c.id[1]);
    sbx_loop_cancel(l, c.id[3]);
    sbx_loop_cancel(l, c.id[3]);
    sbx_loop_cancel(l, 0);         /* no-op */
    sbx_loop_cancel(l, 987654321); /* unknown id: no-op */
    sbx_loop_timer(l, 100, stop_cb, NULL);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect_eq(c.fired[0], 1, "the live timer fired %d times", c.fired[0]);
    cr_expect_eq(c.fired[1], 0, "a timer cancelled before the run fired");
    cr_expect_eq(c.fired[2], 0, "a timer cancelled from a callback fired");
    cr_expect_eq(c.fired[3], 0, "a timer cancelled twice fired");

    /* Cancelling an id that already fired is a no-op, and nothing fires late. */
    sbx_loop_cancel(l, c.id[0]);
    sbx_loop_timer(l, 60, stop_cb, NULL);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect_eq(c.fired[0], 1, "a timer fired twice");
    cr_expect_eq(c.fired[1] + c.fired[2] + c.fired[3], 0, "a cancelled timer fired late");
    sbx_loop_free(l);
}

Test(loop, many_timers_with_random_cancels, .timeout = 30)
{
    /* Heap stress: 500 timers over 0-49 ms, every third cancelled. */
    enum { N = 500 };
    sbx_loop *l = new_loop();
    static int fired[N];
    static struct fired f;
    static struct tmr t[N];
    static uint64_t ids[N];
    memset(fired, 0, sizeof(fired));
    memset(&f, 0, sizeof(f));
    f.want = -1;
    uint64_t seed = 12345;
    for (int i = 0; i < N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        t[i] = (struct tmr){&f, i};
        ids[i] = sbx_loop_timer(l, (int64_t)((seed >> 33) % 50), record_cb, &t[i]);
    }
    int cancelled = 0;
    for (int i = 0; i < N; i += 3) {
        sbx_loop_cancel(l, ids[i]);
        cancelled++;
    }
    sbx_loop_timer(l, 150, stop_cb, NULL);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect_eq(f.n, N - cancelled, "%d timers fired, want %d", f.n, N - cancelled);
    /* record_cb keeps only the first 32 indexes: none of them may be cancelled. */
    for (int i = 0; i < 32 && i < f.n; i++)
        cr_expect_neq(f.order[i] % 3, 0, "cancelled timer %d fired", f.order[i]);
    sbx_loop_free(l);
}

/* ---------------------------------------------------------------------------------
 * Posts. */

enum { POSTERS = 4, POSTS = 20000 };

struct post_ctx {
    sbx_loop *l;
    pthread_t loop_thread;
    uint32_t next[POSTERS]; /* next sequence number expected from each thread */
    long total;
    bool wrong_thread, out_of_order;
};

static struct post_ctx pc;

static void
post_cb(sbx_loop *l, void *arg)
{
    uintptr_t v = (uintptr_t)arg;
    unsigned t = (unsigned)(v >> 24), i = (unsigned)(v & 0xffffff);
    if (!pthread_equal(pthread_self(), pc.loop_thread))
        pc.wrong_thread = true;
    if (t >= POSTERS || i != pc.next[t])
        pc.out_of_order = true;
    else
        pc.next[t]++;
    if (++pc.total == (long)POSTERS * POSTS)
        sbx_loop_stop(l);
}

static void *
poster(void *arg)
{
    uintptr_t t = (uintptr_t)arg;
    for (uintptr_t i = 0; i < POSTS; i++) {
        sbx_loop_post(pc.l, post_cb, (void *)((t << 24) | i));
        if (i % 1000 == 0)
            usleep(100); /* let the loop drain sometimes: empty and non-empty queues */
    }
    return NULL;
}

Test(loop, posts_from_threads_run_once_in_order_on_the_loop_thread, .timeout = 60)
{
    memset(&pc, 0, sizeof(pc));
    pc.l = new_loop();
    pc.loop_thread = pthread_self();
    pthread_t th[POSTERS];
    for (uintptr_t t = 0; t < POSTERS; t++)
        cr_assert_eq(pthread_create(&th[t], NULL, poster, (void *)t), 0);
    bool watchdog = false;
    uint64_t wd = sbx_loop_timer(pc.l, 30000, stop_cb, &watchdog);
    cr_assert_eq(sbx_loop_run(pc.l), 0);
    for (int t = 0; t < POSTERS; t++)
        pthread_join(th[t], NULL);
    cr_assert(!watchdog, "only %ld of %d posts ran", pc.total, POSTERS * POSTS);
    cr_expect(!pc.wrong_thread, "a posted callback ran off the loop thread");
    cr_expect(!pc.out_of_order, "posts of one thread ran out of order (or twice)");
    for (int t = 0; t < POSTERS; t++)
        cr_expect_eq(pc.next[t], (uint32_t)POSTS, "thread %d: %u of %d posts ran", t, pc.next[t],
                     POSTS);
    cr_expect_eq(pc.total, (long)POSTERS * POSTS);

    /* Nothing runs twice: another short run sees no extra callbacks. */
    sbx_loop_cancel(pc.l, wd);
    sbx_loop_timer(pc.l, 30, stop_cb, NULL);
    cr_assert_eq(sbx_loop_run(pc.l), 0);
    cr_expect_eq(pc.total, (long)POSTERS * POSTS, "callbacks ran again on a second run");
    sbx_loop_free(pc.l);
}

static void
set_flag(sbx_loop *l, void *arg)
{
    (void)l;
    *(bool *)arg = true;
}

Test(loop, free_drops_pending_posts)
{
    sbx_loop *l = new_loop();
    bool ran = false;
    sbx_loop_post(l, set_flag, &ran);
    sbx_loop_timer(l, 1000, set_flag, &ran);
    sbx_loop_free(l); /* ASan/LSan check that the post and the heap are freed */
    cr_expect(!ran, "sbx_loop_free ran a pending callback");
}

/* ---------------------------------------------------------------------------------
 * fd watches. */

struct pipe_ctx {
    int rfd, wfd;
    sbx_watch *w, *w2;
    int calls, calls2;
    uint32_t events;
    int fd_seen;
    int read_until; /* level-triggered test: read nothing until this many calls */
    char got[8];
};

static void
write_byte(sbx_loop *l, void *arg)
{
    (void)l;
    struct pipe_ctx *p = arg;
    cr_assert_eq(write(p->wfd, "x", 1), 1);
}

static void
read_and_unwatch(sbx_loop *l, int fd, uint32_t events, void *arg)
{
    struct pipe_ctx *p = arg;
    p->calls++;
    p->events = events;
    p->fd_seen = fd;
    ssize_t r = read(fd, p->got, sizeof(p->got));
    cr_assert_eq(r, 1, "read %zd bytes", r);
    sbx_loop_unwatch(l, p->w); /* inside its own callback */
    p->w = NULL;
    /* A byte after the unwatch: it must not call back.  Written here, not
     * by a second timer, which a loaded machine may run in the same
     * iteration as the first (both bytes read at once). */
    cr_assert_eq(write(p->wfd, "y", 1), 1);
}

static void
make_pipe(struct pipe_ctx *p)
{
    int fds[2];
    cr_assert_eq(pipe2(fds, O_NONBLOCK | O_CLOEXEC), 0, "pipe2: %s", strerror(errno));
    p->rfd = fds[0];
    p->wfd = fds[1];
}

Test(loop, watch_sees_epollin_and_unwatch_in_callback_is_safe, .timeout = 30)
{
    sbx_loop *l = new_loop();
    struct pipe_ctx p = {0};
    make_pipe(&p);
    p.w = sbx_loop_watch(l, p.rfd, EPOLLIN, read_and_unwatch, &p);
    cr_assert_not_null(p.w);
    sbx_loop_timer(l, 10, write_byte, &p);
    sbx_loop_timer(l, 80, stop_cb, NULL);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect_eq(p.calls, 1, "callback ran %d times", p.calls);
    cr_expect(p.events & EPOLLIN, "events 0x%x lack EPOLLIN", p.events);
    cr_expect_eq(p.fd_seen, p.rfd, "callback got fd %d, want %d", p.fd_seen, p.rfd);
    cr_expect_eq(p.got[0], 'x');
    char c;
    cr_expect_eq(read(p.rfd, &c, 1), 1, "the second byte is still in the pipe");
    close(p.rfd);
    close(p.wfd);
    sbx_loop_free(l);
}

static void
count_no_read(sbx_loop *l, int fd, uint32_t events, void *arg)
{
    (void)fd;
    (void)events;
    struct pipe_ctx *p = arg;
    p->calls++;
    if (p->calls == p->read_until) {
        sbx_loop_unwatch(l, p->w);
        p->w = NULL;
        sbx_loop_stop(l);
    }
}

Test(loop, watches_are_level_triggered, .timeout = 30)
{
    sbx_loop *l = new_loop();
    struct pipe_ctx p = {.read_until = 3};
    make_pipe(&p);
    cr_assert_eq(write(p.wfd, "y", 1), 1);
    p.w = sbx_loop_watch(l, p.rfd, EPOLLIN, count_no_read, &p);
    bool watchdog = false;
    uint64_t wd = sbx_loop_timer(l, 5000, stop_cb, &watchdog);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect(!watchdog, "an unread pipe was reported only %d times", p.calls);
    cr_expect_eq(p.calls, 3);
    sbx_loop_cancel(l, wd);
    close(p.rfd);
    close(p.wfd);
    sbx_loop_free(l);
}

static void
on_writable(sbx_loop *l, int fd, uint32_t events, void *arg)
{
    (void)fd;
    struct pipe_ctx *p = arg;
    p->calls++;
    p->events = events;
    sbx_loop_stop(l);
}

static void
enable_out(sbx_loop *l, void *arg)
{
    struct pipe_ctx *p = arg;
    cr_assert_eq(sbx_loop_modify(l, p->w, EPOLLOUT), 0);
}

Test(loop, modify_changes_the_event_mask, .timeout = 30)
{
    sbx_loop *l = new_loop();
    struct pipe_ctx p = {0};
    make_pipe(&p);
    /* The write end of an empty pipe is writable but never readable. */
    p.w = sbx_loop_watch(l, p.wfd, EPOLLIN, on_writable, &p);
    /* Before the timer is armed: taken after it, the 40 ms may have begun
     * a millisecond earlier (make check saw 39). */
    int64_t start = sbx_mono_ms();
    sbx_loop_timer(l, 40, enable_out, &p);
    bool watchdog = false;
    uint64_t wd = sbx_loop_timer(l, 5000, stop_cb, &watchdog);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect(!watchdog, "EPOLLOUT never reported after sbx_loop_modify");
    cr_expect_eq(p.calls, 1);
    cr_expect(p.events & EPOLLOUT, "events 0x%x lack EPOLLOUT", p.events);
    cr_expect_geq(sbx_mono_ms() - start, 40, "called back before the mask was changed");
    cr_expect_eq(sbx_loop_modify(l, p.w, EPOLLOUT), 0, "same mask again is fine");
    sbx_loop_unwatch(l, p.w);
    sbx_loop_cancel(l, wd);
    close(p.rfd);
    close(p.wfd);
    sbx_loop_free(l);
}

/* Two pipes ready at once; whichever callback runs first unwatches both. */
static struct pipe_ctx two[2];

static void
unwatch_both(sbx_loop *l, int fd, uint32_t events, void *arg)
{
    (void)fd;
    (void)events;
    struct pipe_ctx *p = arg;
    p->calls++;
    for (int i = 0; i < 2; i++) {
        if (two[i].w) {
            sbx_loop_unwatch(l, two[i].w);
            two[i].w = NULL;
        }
    }
}

Test(loop, unwatch_of_another_ready_watch_inside_a_callback, .timeout = 30)
{
    sbx_loop *l = new_loop();
    memset(two, 0, sizeof(two));
    for (int i = 0; i < 2; i++) {
        make_pipe(&two[i]);
        cr_assert_eq(write(two[i].wfd, "z", 1), 1);
        two[i].w = sbx_loop_watch(l, two[i].rfd, EPOLLIN, unwatch_both, &two[i]);
    }
    sbx_loop_timer(l, 50, stop_cb, NULL);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect_eq(two[0].calls + two[1].calls, 1,
                 "after the first callback unwatched both, %d more ran",
                 two[0].calls + two[1].calls - 1);
    for (int i = 0; i < 2; i++) {
        close(two[i].rfd);
        close(two[i].wfd);
    }
    sbx_loop_free(l);
}

/* ---------------------------------------------------------------------------------
 * Stop and run again. */

struct stopper {
    sbx_loop *l;
    int delay_ms;
};

static void *
stop_from_thread(void *arg)
{
    struct stopper *s = arg;
    usleep((useconds_t)s->delay_ms * 1000);
    sbx_loop_stop(s->l);
    return NULL;
}

Test(loop, run_again_after_stop, .timeout = 30)
{
    sbx_loop *l = new_loop();
    bool first = false, second = false, posted = false;

    sbx_loop_timer(l, 5, stop_cb, &first);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_assert(first, "the first run did not stop through its timer");

    /* A post made while the loop is not running runs in the next run. */
    sbx_loop_post(l, set_flag, &posted);
    int64_t start = sbx_mono_ms(); /* before the timer is armed, as above */
    sbx_loop_timer(l, 20, stop_cb, &second);
    cr_assert_eq(sbx_loop_run(l), 0);
    cr_expect(second, "the second run did not run its timer");
    cr_expect(posted, "a post made between runs did not run");
    cr_expect_geq(sbx_mono_ms() - start, 20, "the second run ended early (stale stop?)");

    /* A third run, idle (no timers), stopped from another thread. */
    struct stopper s = {l, 50};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, stop_from_thread, &s), 0);
    start = sbx_mono_ms();
    cr_assert_eq(sbx_loop_run(l), 0);
    pthread_join(th, NULL);
    cr_expect_geq(sbx_mono_ms() - start, 40, "the idle run returned before the stop");

    /* sbx_loop_now is refreshed by the run. */
    int64_t now = sbx_loop_now(l);
    cr_expect_leq(now, sbx_mono_ms());
    cr_expect_geq(now, start);
    sbx_loop_free(l);
}
