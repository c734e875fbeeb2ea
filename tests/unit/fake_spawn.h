/*
 * fake_spawn.h — a test double of container/spawn.h for unit tests of the
 * shard and its actors without root and without containers
 * (tests/unit/test_shard.c links tests/unit/fake_spawn.c instead of
 * container/spawn.c).
 *
 * sbx_container_start makes a socketpair and runs a scripted agent on the
 * other end, in a thread of this process: it speaks the agent protocol
 * (frames of runtime/frame.h; requests {t, op, a, d?, cg?}, replies
 * {t, ok, r | e}; docs/protocol.md §6) and answers
 *   - "bind" (tag 0): nothing (recorded);
 *   - "exec" {command}: by the command —
 *       "fail"   an error FILE_NOT_FOUND with context {path: "/nope"},
 *       "busy"   an error RESOURCE_BUSY (as for a process ID in use),
 *       "die"    no reply: the agent closes its end (a crashed agent),
 *       "hang"   no reply at all (the request stays in flight),
 *       "sleep:N" the usual answer after N ms (the agent answers nothing
 *                meanwhile: a command that runs that long),
 *       else     {exitCode: 0, stdout: <command>, agent: <container serial>};
 *   - any other op with a tag: {op: <op>, agent: <serial>}.
 * sbx_container_stop closes the channel and joins that agent's thread;
 * sbx_container_stats answers -ENOSYS (no cgroup); sbx_container_set_limits 0.
 *
 * What the agents saw is kept for the test: every frame's op, in order, per
 * container.  The test reaches the spawner the shard made (inside
 * sbx_shard_run) through fake_spawn_current().  Thread-safe: the shard's
 * workers start and stop containers while the test thread reads.
 */
#ifndef SBX_TEST_FAKE_SPAWN_H
#define SBX_TEST_FAKE_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "container/spawn.h"

/* fake_spawn_current — the spawner of the shard running in this process,
 * or NULL before sbx_spawner_new / after sbx_spawner_free (borrowed). */
sbx_spawner *fake_spawn_current(void);

/* Containers started and stopped so far. */
int fake_spawn_starts(sbx_spawner *sp);
int fake_spawn_stops(sbx_spawner *sp);

/* fake_spawn_ops — the ops the agent of the n-th container started (1-based)
 * received, space-separated in arrival order ("bind exec exec"), copied
 * into buf[len]; false if there is no such container. */
bool fake_spawn_ops(sbx_spawner *sp, int n, char *buf, size_t len);

#endif
