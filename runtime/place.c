/* place.c — see place.h. */
#include "place.h"

#include <string.h>
#include <xxhash.h>

uint32_t
sbx_place_partition(const char *id, size_t n)
{
    return (uint32_t)(XXH64(id, n, 0) % SBX_PARTITIONS);
}

uint64_t
sbx_place_weight(const char *name, uint32_t partition)
{
    /* XXH64 over name ‖ be32(partition); names are short (≤ 63 bytes). */
    unsigned char buf[128];
    size_t n = strlen(name);
    if (n > sizeof(buf) - 4)
        n = sizeof(buf) - 4;
    memcpy(buf, name, n);
    buf[n] = (unsigned char)(partition >> 24);
    buf[n + 1] = (unsigned char)(partition >> 16);
    buf[n + 2] = (unsigned char)(partition >> 8);
    buf[n + 3] = (unsigned char)partition;
    return XXH64(buf, n + 4, 0x5b8d);
}

int
sbx_place_owner(const char *const *names, size_t n, uint32_t partition)
{
    int best = -1;
    uint64_t bw = 0;
    for (size_t i = 0; i < n; i++) {
        uint64_t w = sbx_place_weight(names[i], partition);
        if (best < 0 || w > bw || (w == bw && strcmp(names[i], names[best]) < 0)) {
            best = (int)i;
            bw = w;
        }
    }
    return best;
}

void
sbx_place_table(const char *const *names, size_t n, int16_t *table)
{
    for (uint32_t p = 0; p < SBX_PARTITIONS; p++)
        table[p] = (int16_t)sbx_place_owner(names, n, p);
}
