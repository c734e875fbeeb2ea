/*
 * place.h — placement: sandbox ID → partition → owner shard.
 *
 * Two levels, as ../shared/reference/actors-cluster.md §1d recommends:
 *   partition = XXH64(id, seed 0) mod SBX_PARTITIONS   (fixed for the life of a cluster)
 *   owner     = argmax over shards s of XXH64(s.name ‖ be32(partition))
 * The second level is rendezvous (highest-random-weight) hashing
 * (Thaler & Ravishankar, "Using name-based mappings to increase hit rates",
 * IEEE/ACM ToN 1998): adding or removing a shard moves only the partitions
 * that shard wins or held, never a partition between two other shards.
 * The hash covers partitions, not requests: a table of SBX_PARTITIONS owners
 * is computed once per membership change and the request path is a lookup.
 */
#ifndef SBX_PLACE_H
#define SBX_PLACE_H

#include <stddef.h>
#include <stdint.h>

#define SBX_PARTITIONS 4096

/* sbx_place_partition — the partition of a sandbox ID (n bytes). */
uint32_t sbx_place_partition(const char *id, size_t n);

/* sbx_place_weight — the HRW weight of shard `name` for `partition`. */
uint64_t sbx_place_weight(const char *name, uint32_t partition);

/*
 * sbx_place_owner — index into names[0..n) of the partition's owner, or -1
 * if n == 0.  Ties (astronomically unlikely) go to the lower name.
 */
int sbx_place_owner(const char *const *names, size_t n, uint32_t partition);

/*
 * sbx_place_table — fill table[SBX_PARTITIONS] with owner indexes for the
 * shard set names[0..n); n must be ≥ 1.
 */
void sbx_place_table(const char *const *names, size_t n, int16_t *table);

#endif
