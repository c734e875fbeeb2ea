/*
 * shard_of.h — which shard of a test's `sbxd dev` owns a sandbox ID, as the
 * gateway places it (runtime/place.h: rendezvous hashing of the ID's
 * partition over the shards' names "<deployment>-s<i>").  For tests that
 * need an ID on a given shard (a fork across shards, say).  Link
 * runtime/place.c and -lxxhash with it.
 */
#ifndef SBX_TEST_SHARD_OF_H
#define SBX_TEST_SHARD_OF_H

/* test_shard_of — the index (0 … nshards-1) of the shard of deployment
 * `name` (struct testd's name) that owns id; nshards at most 8. */
int test_shard_of(const char *name, int nshards, const char *id);

#endif
