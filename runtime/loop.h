/*
 * loop.h — a small single-threaded event loop: epoll for fds, a binary heap
 * of timers (CLOCK_MONOTONIC, ms), and a thread-safe post queue woken through
 * an eventfd.  The shard's actor loop and the in-sandbox agent both run on
 * one; all callbacks of a loop run on the thread that called sbx_loop_run.
 *
 * Other threads (nng completion callbacks, the LMDB writer, the container
 * spawner) talk to a loop only through sbx_loop_post(); everything else in
 * this API must be called from the loop's own thread.
 */
#ifndef SBX_LOOP_H
#define SBX_LOOP_H

#include <stdbool.h>
#include <stdint.h>

typedef struct sbx_loop sbx_loop;
typedef struct sbx_watch sbx_watch;

/* events: EPOLLIN/EPOLLOUT/EPOLLERR/EPOLLHUP as in <sys/epoll.h>. */
typedef void (*sbx_fd_cb)(sbx_loop *l, int fd, uint32_t events, void *arg);
typedef void (*sbx_timer_cb)(sbx_loop *l, void *arg);
typedef void (*sbx_post_cb)(sbx_loop *l, void *arg);

/* sbx_loop_new — allocate a loop; 0 or -errno.  Free with sbx_loop_free. */
int sbx_loop_new(sbx_loop **out);
/* sbx_loop_free — frees the loop; watches and timers still registered are dropped
 * (their args are not touched); posted callbacks never run. */
void sbx_loop_free(sbx_loop *l);

/* sbx_loop_run — dispatch until sbx_loop_stop; returns 0 or -errno.  It may be
 * called again afterwards (a stop only ends the current run). */
int sbx_loop_run(sbx_loop *l);
/* sbx_loop_stop — make sbx_loop_run return after the current callback (any thread). */
void sbx_loop_stop(sbx_loop *l);

/*
 * sbx_loop_watch — call cb(l, fd, events, arg) when fd is ready for `events`
 * (level-triggered).  Returns a handle (never NULL) the caller owns until it
 * passes it to sbx_loop_unwatch; the fd stays owned by the caller.
 */
sbx_watch *sbx_loop_watch(sbx_loop *l, int fd, uint32_t events, sbx_fd_cb cb, void *arg);
/* sbx_loop_modify — change the event mask; 0 or -errno. */
int sbx_loop_modify(sbx_loop *l, sbx_watch *w, uint32_t events);
/* sbx_loop_unwatch — stop watching and free the handle (safe inside its own callback). */
void sbx_loop_unwatch(sbx_loop *l, sbx_watch *w);

/*
 * sbx_loop_timer — call cb once, `delay_ms` from now.  Returns an id > 0 to
 * cancel it with; ids are never reused within a loop's life.
 */
uint64_t sbx_loop_timer(sbx_loop *l, int64_t delay_ms, sbx_timer_cb cb, void *arg);
/* sbx_loop_cancel — cancel a pending timer (no-op if it fired or id is 0). */
void sbx_loop_cancel(sbx_loop *l, uint64_t id);

/*
 * sbx_loop_post — run cb(l, arg) on the loop thread soon.  Thread-safe and
 * async-signal-unsafe.  Callbacks run in posting order.
 */
void sbx_loop_post(sbx_loop *l, sbx_post_cb cb, void *arg);

/* sbx_loop_now — the loop's cached monotonic time in ms (refreshed every iteration). */
int64_t sbx_loop_now(sbx_loop *l);

#endif
