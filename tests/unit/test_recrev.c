/*
 * test_recrev.c — the replication's table of record revisions
 * (actors/recrev.h): what a later compare in etcd depends on.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>

#include "../../actors/recrev.h"

Test(recrev, a_revision_is_known_only_at_the_epoch_it_was_seen_at)
{
    recrev *r = recrev_new();
    int64_t m = -1;
    cr_assert_eq(recrev_get(r, "sb-1", 7, &m), -ENOENT, "an empty table knows nothing");
    recrev_set(r, "sb-1", 7, 1234);
    cr_assert_eq(recrev_get(r, "sb-1", 7, &m), 0);
    cr_assert_eq(m, 1234);
    cr_assert_eq(recrev_get(r, "sb-1", 8, &m), -ENOENT,
                 "at another epoch the partition moved: the revision must be read again");
    recrev_set(r, "sb-1", 8, 0); /* deleted at epoch 8 */
    cr_assert_eq(recrev_get(r, "sb-1", 8, &m), 0);
    cr_assert_eq(m, 0);
    cr_assert_eq(recrev_get(r, "sb-1", 7, &m), -ENOENT, "one entry per record: the latest");
    recrev_free(r);
}

Test(recrev, many_records_keep_their_own_revisions)
{
    recrev *r = recrev_new();
    char id[64];
    for (int i = 0; i < 20000; i++) {
        snprintf(id, sizeof(id), "sandbox-%d", i);
        recrev_set(r, id, 3, 100000 + i);
    }
    for (int i = 0; i < 20000; i++) {
        int64_t m = -1;
        snprintf(id, sizeof(id), "sandbox-%d", i);
        cr_assert_eq(recrev_get(r, id, 3, &m), 0, "%s lost", id);
        cr_assert_eq(m, 100000 + i, "%s has another record's revision", id);
    }
    int64_t m;
    cr_assert_eq(recrev_get(r, "sandbox-20000", 3, &m), -ENOENT);
    recrev_set(r, "", 3, 1); /* not a sandbox ID: ignored */
    cr_assert_eq(recrev_get(r, "", 3, &m), -ENOENT);
    recrev_free(r);
}
