/* shard_of.c — see shard_of.h. */
#include "shard_of.h"

#include <stdio.h>
#include <string.h>

#include "../../runtime/place.h"

int
test_shard_of(const char *name, int nshards, const char *id)
{
    char names[8][96];
    const char *v[8];
    if (nshards > 8)
        nshards = 8;
    for (int i = 0; i < nshards; i++) {
        snprintf(names[i], sizeof(names[i]), "%s-s%d", name, i);
        v[i] = names[i];
    }
    return sbx_place_owner(v, nshards, sbx_place_partition(id, strlen(id)));
}
