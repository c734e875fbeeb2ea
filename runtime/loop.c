/* loop.c — see loop.h. */
#include "loop.h"

#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "util.h"

struct sbx_watch {
    int fd;
    uint32_t events;
    sbx_fd_cb cb;
    void *arg;
    bool dead;
    sbx_watch *next_dead;
};

struct timer {
    int64_t when;
    uint64_t id;
    sbx_timer_cb cb;
    void *arg;
};

struct post {
    sbx_post_cb cb;
    void *arg;
    struct post *next;
};

struct sbx_loop {
    int ep;
    int evfd;
    volatile bool stop;
    int64_t now;
    /* timers: binary min-heap on (when, id) */
    struct timer *heap;
    size_t nheap, capheap;
    uint64_t next_id;
    /* posts */
    pthread_mutex_t mu;
    struct post *phead, *ptail;
    /* watches freed at the end of an iteration (a callback may unwatch itself) */
    sbx_watch *dead;
};

int
sbx_loop_new(sbx_loop **out)
{
    sbx_loop *l = sbx_xcalloc(1, sizeof(*l));
    l->ep = epoll_create1(EPOLL_CLOEXEC);
    if (l->ep < 0)
        goto fail;
    l->evfd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (l->evfd < 0)
        goto fail;
    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = NULL};
    if (epoll_ctl(l->ep, EPOLL_CTL_ADD, l->evfd, &ev) < 0)
        goto fail;
    pthread_mutex_init(&l->mu, NULL);
    l->next_id = 1;
    l->now = sbx_mono_ms();
    *out = l;
    return 0;
fail: {
    int e = -errno;
    if (l->ep >= 0)
        close(l->ep);
    if (l->evfd > 0)
        close(l->evfd);
    free(l);
    return e;
}
}

static void
free_dead(sbx_loop *l)
{
    while (l->dead) {
        sbx_watch *w = l->dead;
        l->dead = w->next_dead;
        free(w);
    }
}

void
sbx_loop_free(sbx_loop *l)
{
    if (!l)
        return;
    free_dead(l);
    close(l->ep);
    close(l->evfd);
    struct post *p = l->phead;
    while (p) {
        struct post *n = p->next;
        free(p);
        p = n;
    }
    pthread_mutex_destroy(&l->mu);
    free(l->heap);
    free(l);
}

int64_t
sbx_loop_now(sbx_loop *l)
{
    return l->now;
}

void
sbx_loop_stop(sbx_loop *l)
{
    l->stop = true;
    uint64_t one = 1;
    ssize_t w = write(l->evfd, &one, sizeof(one));
    (void)w;
}

sbx_watch *
sbx_loop_watch(sbx_loop *l, int fd, uint32_t events, sbx_fd_cb cb, void *arg)
{
    sbx_watch *w = sbx_xcalloc(1, sizeof(*w));
    w->fd = fd;
    w->events = events;
    w->cb = cb;
    w->arg = arg;
    struct epoll_event ev = {.events = events, .data.ptr = w};
    if (epoll_ctl(l->ep, EPOLL_CTL_ADD, fd, &ev) < 0) {
        /* Only a programming error gets here (bad fd); keep the handle valid
         * but inert so the caller's unwatch stays correct. */
        w->dead = true;
    }
    return w;
}

int
sbx_loop_modify(sbx_loop *l, sbx_watch *w, uint32_t events)
{
    if (w->dead)
        return -EBADF;
    if (w->events == events)
        return 0;
    struct epoll_event ev = {.events = events, .data.ptr = w};
    if (epoll_ctl(l->ep, EPOLL_CTL_MOD, w->fd, &ev) < 0)
        return -errno;
    w->events = events;
    return 0;
}

void
sbx_loop_unwatch(sbx_loop *l, sbx_watch *w)
{
    if (!w)
        return;
    if (!w->dead)
        epoll_ctl(l->ep, EPOLL_CTL_DEL, w->fd, NULL);
    w->dead = true;
    w->next_dead = l->dead;
    l->dead = w;
}

static bool
tless(const struct timer *a, const struct timer *b)
{
    return a->when < b->when || (a->when == b->when && a->id < b->id);
}

static void
heap_up(sbx_loop *l, size_t i)
{
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!tless(&l->heap[i], &l->heap[p]))
            break;
        struct timer t = l->heap[i];
        l->heap[i] = l->heap[p];
        l->heap[p] = t;
        i = p;
    }
}

static void
heap_down(sbx_loop *l, size_t i)
{
    for (;;) {
        size_t a = 2 * i + 1, b = a + 1, m = i;
        if (a < l->nheap && tless(&l->heap[a], &l->heap[m]))
            m = a;
        if (b < l->nheap && tless(&l->heap[b], &l->heap[m]))
            m = b;
        if (m == i)
            break;
        struct timer t = l->heap[i];
        l->heap[i] = l->heap[m];
        l->heap[m] = t;
        i = m;
    }
}

uint64_t
sbx_loop_timer(sbx_loop *l, int64_t delay_ms, sbx_timer_cb cb, void *arg)
{
    if (l->nheap == l->capheap) {
        l->capheap = l->capheap ? l->capheap * 2 : 64;
        l->heap = sbx_xrealloc(l->heap, l->capheap * sizeof(*l->heap));
    }
    struct timer *t = &l->heap[l->nheap++];
    t->when = sbx_mono_ms() + (delay_ms > 0 ? delay_ms : 0);
    t->id = l->next_id++;
    t->cb = cb;
    t->arg = arg;
    uint64_t id = t->id;
    heap_up(l, l->nheap - 1);
    return id;
}

void
sbx_loop_cancel(sbx_loop *l, uint64_t id)
{
    if (id == 0)
        return;
    /* Remove eagerly: find it in the heap (timers per loop are few hundred at
     * most) and replace it with the last element. */
    for (size_t i = 0; i < l->nheap; i++) {
        if (l->heap[i].id != id)
            continue;
        l->heap[i] = l->heap[--l->nheap];
        if (i < l->nheap) {
            heap_down(l, i);
            heap_up(l, i);
        }
        return;
    }
}

void
sbx_loop_post(sbx_loop *l, sbx_post_cb cb, void *arg)
{
    struct post *p = sbx_xmalloc(sizeof(*p));
    p->cb = cb;
    p->arg = arg;
    p->next = NULL;
    pthread_mutex_lock(&l->mu);
    bool was_empty = (l->phead == NULL);
    if (l->ptail)
        l->ptail->next = p;
    else
        l->phead = p;
    l->ptail = p;
    pthread_mutex_unlock(&l->mu);
    if (was_empty) {
        uint64_t one = 1;
        ssize_t w = write(l->evfd, &one, sizeof(one));
        (void)w;
    }
}

static void
run_posts(sbx_loop *l)
{
    uint64_t v;
    ssize_t r = read(l->evfd, &v, sizeof(v));
    (void)r;
    pthread_mutex_lock(&l->mu);
    struct post *p = l->phead;
    l->phead = l->ptail = NULL;
    pthread_mutex_unlock(&l->mu);
    while (p) {
        struct post *n = p->next;
        p->cb(l, p->arg);
        free(p);
        p = n;
    }
}

static void
run_timers(sbx_loop *l)
{
    l->now = sbx_mono_ms();
    while (l->nheap && l->heap[0].when <= l->now) {
        struct timer t = l->heap[0];
        l->heap[0] = l->heap[--l->nheap];
        if (l->nheap)
            heap_down(l, 0);
        t.cb(l, t.arg);
    }
}

int
sbx_loop_run(sbx_loop *l)
{
    struct epoll_event evs[64];
    l->stop = false;
    while (!l->stop) {
        int timeout = -1;
        l->now = sbx_mono_ms();
        if (l->nheap) {
            int64_t d = l->heap[0].when - l->now;
            timeout = d < 0 ? 0 : (d > 60000 ? 60000 : (int)d);
        }
        int n = epoll_wait(l->ep, evs, (int)SBX_ARRAY_LEN(evs), timeout);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        l->now = sbx_mono_ms();
        for (int i = 0; i < n && !l->stop; i++) {
            sbx_watch *w = evs[i].data.ptr;
            if (!w) {
                run_posts(l);
                continue;
            }
            if (w->dead)
                continue;
            w->cb(l, w->fd, evs[i].events, w->arg);
        }
        free_dead(l);
        run_timers(l);
        free_dead(l);
    }
    return 0;
}
