/*
 * hostlock.h — host-wide locks of sbxd processes (hostlock.c says why and
 * how): one live deployment per name, one live shard per cgroup subtree,
 * per data directory and per host uid.  Used by tools/sbxd.c only.
 */
#ifndef SBX_HOSTLOCK_H
#define SBX_HOSTLOCK_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <limits.h>
#include <sys/types.h>

#define LOCK_DEPTH 32

/* The locks one holder took: file descriptors it owns (closed by
 * hostlock_release), and the exclusive lock's path, unlinked then. */
struct hostlock {
    int fds[LOCK_DEPTH];          /* ancestors (shared) first, the key (exclusive) last */
    int n;
    char path[PATH_MAX];          /* the exclusive lock's file */
};

/* lock_take — flock `path` (created if missing) shared or exclusive without
 * waiting.  0 with *fd (the caller's, close-on-exec); -EBUSY when a live
 * process holds it, with *holder one such process (0 when /proc/locks does
 * not tell); or -errno. */
int lock_take(const char *path, bool excl, int *fd, pid_t *holder);

/* hostlock_release — unlink the exclusive lock's file while still holding
 * it, then close every descriptor (no-op on an empty lock). */
void hostlock_release(struct hostlock *hl);

/* hostlock_take — the locks of `kind` key `key` in LOCK_DIR: for a
 * path-like key (`nested`), every ancestor shared and the key exclusive;
 * otherwise the key alone.  `what` names a held key in messages.  0; -EBUSY
 * with the reason (naming the holder's pid when known) in why; or another
 * -errno with the reason. */
int hostlock_take(struct hostlock *hl, const char *kind, const char *key, bool nested,
                  const char *what, char *why, size_t whylen);

/* uid_range_lock — hold host uids [*base, *base + count) until
 * hostlock_release(hl); with `pick`, *base becomes the first free range
 * from 1000000000.  0, -EBUSY (an overlap with a live shard's range, why
 * names it), -ENOSPC (no free range), or -errno, with why. */
int uid_range_lock(struct hostlock *hl, int64_t *base, int64_t count, bool pick, char *why,
                   size_t whylen);

#endif
