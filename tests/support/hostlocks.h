/*
 * hostlocks.h — what a test's deployment leaves in /run/sbx after a SIGKILL.
 *
 * sbxd's host locks (tools/hostlock.c) are files in /run/sbx that their
 * holder unlinks when it stops; a process killed with SIGKILL (as the
 * crash tests do to shards and daemons) leaves its file behind, held by
 * nobody, for the next holder of the name to reuse.  A test that kills and
 * does not restart must remove them itself: the suite's end check
 * (tools/leftovers.sh) counts them as left behind.
 */
#ifndef SBX_TEST_HOSTLOCKS_H
#define SBX_TEST_HOSTLOCKS_H

/* Unlink every lock file of /run/sbx (a name ending in ".lock") whose
 * name contains name (non-empty, e.g. a deployment's or shard's name) and
 * that no process holds: each is taken with flock(LOCK_EX|LOCK_NB) first
 * and unlinked while held, so a live sbxd's lock is never touched (sbxd
 * re-checks, after locking, that its file is still the one at the path).
 * Returns how many were removed, or -errno if /run/sbx cannot be read
 * (-ENOENT when it does not exist). */
int test_hostlocks_sweep(const char *name);

#endif
