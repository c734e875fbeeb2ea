/*
 * actor_handoff.c — what a partition handoff (actors/cluster_handoff.c) asks
 * of the actors: quiesce the partitions that move (stop idle containers;
 * with force, interrupt in-flight and queued ops) and then forget their
 * actors.  Runs on the shard's loop thread; the actors stay owned by the
 * shard's table and are freed there once idle (actor_maybe_free).
 */
#include <stdio.h>
#include <string.h>

#include "../runtime/err.h"
#include "shard_int.h"

bool
actor_partition_quiesce(struct shard *sh, const uint8_t *set, bool force, uint64_t *max_seq)
{
    bool quiet = true;
    *max_seq = 0;
    for (size_t b = 0; b < sh->actors.nbuckets; b++) {
        for (struct actor *a = sh->actors.buckets[b]; a; a = a->hnext) {
            if (!set[a->part])
                continue;
            if (force) {
                actor_fail_inflight(a, SBX_E_INTERRUPTED,
                              "the sandbox's partition moved to another shard; retry");
                actor_fail_list(&a->mb_head, SBX_E_WRONG_OWNER,
                          "the sandbox's partition moved to another shard; retry");
                a->mb_tail = NULL;
            }
            if (a->cs == C_RUNNING && !a->inflight && !a->mb_head && !a->gate) {
                /* Like an idle sleep: the sandbox starts again on its new owner. */
                snprintf(a->rec.state, sizeof(a->rec.state), "stopped");
                actor_save_record(a);
                actor_stop_container(a, false);
            }
            if (a->last_seq > *max_seq)
                *max_seq = a->last_seq;
            if (a->cs != C_NONE || a->inflight || a->mb_head || a->gate || a->destroying)
                quiet = false;
        }
    }
    /* Writes of actors already freed: a destroy's delete above all. */
    for (int p = 0; p < SBX_PARTITIONS; p++)
        if (set[p] && sh->part_seq[p] > *max_seq)
            *max_seq = sh->part_seq[p];
    return quiet;
}

void
actor_partition_drop(struct shard *sh, const uint8_t *set)
{
    for (size_t b = 0; b < sh->actors.nbuckets; b++) {
        struct actor *a = sh->actors.buckets[b];
        while (a) {
            struct actor *next = a->hnext;
            if (set[a->part]) {
                actor_fail_inflight(a, SBX_E_WRONG_OWNER, "the sandbox's partition moved; retry");
                actor_fail_list(&a->mb_head, SBX_E_WRONG_OWNER, "the sandbox's partition moved; retry");
                a->mb_tail = NULL;
                /* The record is not ours any more (or is reloaded from etcd):
                 * the actor goes when idle.  Until then it is stale: it writes
                 * nothing, and the next operation on the sandbox gets a new
                 * actor made from the records now in the store — not this
                 * one, whose state (no record, an undone write's image,
                 * failed ranges) is the earlier incarnation's (the fault
                 * test found sandboxes answered as missing, and values older
                 * than acknowledged ones written back, after a fence). */
                a->exists = false;
                a->stale = true;
                sbx_record_free(&a->rec);
                memset(&a->rec, 0, sizeof(a->rec));
                if (a->cs == C_RUNNING)
                    actor_stop_container(a, false);
                actor_maybe_free(a);
            }
            a = next;
        }
    }
}
