/*
 * cluster_client.c — requests the cluster tests send through a gateway of
 * the cluster of cluster.h (declared there).  Kept apart from cluster.c,
 * which builds and supervises the cluster.  No Criterion here: the benchmark
 * (tools/bench-cluster.c) links this file too.
 */
#include "cluster.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

int
cl_gw_client(int j, sbx_client **out, char *why, size_t wl)
{
    sbx_error err;
    *out = NULL;
    if (sbx_client_open(out, cl_env()->gw[j], &err) != 0) {
        snprintf(why, wl, "cannot reach gateway %d (%s): %s %s", j, cl_env()->gw[j], err.code,
                 err.message);
        sbx_error_free(&err);
        return -1;
    }
    return 0;
}

int
cl_drain(sbx_client *c, int i, bool on, char *why, size_t wl)
{
    char name[64], args[160];
    cl_node_name(i, name, sizeof(name));
    snprintf(args, sizeof(args), "{\"shard\":\"%s\",\"drain\":%s}", name, on ? "true" : "false");
    sbx_reply *r = NULL;
    sbx_error err;
    if (sbx_call_json(c, "cluster.drain", NULL, args, 10000, &r, &err) != 0) {
        snprintf(why, wl, "cluster.drain %s: %s %s", args, err.code, err.message);
        sbx_error_free(&err);
        return -1;
    }
    sbx_reply_free(r);
    return 0;
}

void
cl_place_table(const int *set, int n, int16_t table[SBX_PARTITIONS])
{
    char names[CL_MAX_NODES][64];
    const char *np[CL_MAX_NODES];
    for (int i = 0; i < n; i++) {
        cl_node_name(set[i], names[i], sizeof(names[i]));
        np[i] = names[i];
    }
    sbx_place_table(np, (size_t)n, table);
}

int
cl_owner_among(const int *set, int n, uint32_t p)
{
    int16_t table[SBX_PARTITIONS];
    cl_place_table(set, n, table);
    return set[table[p]];
}

int
cl_pick_id(const struct cl_state *st, const char *kind, int a, const int *set, int n, int b,
           char *id, size_t il)
{
    int16_t table[SBX_PARTITIONS];
    cl_place_table(set, n, table);
    for (int k = 0; k < 5000; k++) {
        snprintf(id, il, "%s%s-%d-%d", kind, cl_env()->prefix + 1, (int)getpid() % 100000, k);
        uint32_t p = sbx_place_partition(id, strlen(id));
        if (st->owner[p] == a && set[table[p]] == b)
            return (int)p;
    }
    return -1;
}
