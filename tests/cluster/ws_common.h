/*
 * ws_common.h — what the workspace cluster tests (test_cluster_ws.c,
 * test_cluster_ws_snap.c) share: static helpers that assert (Criterion).
 * Each node i keeps its workspaces under <cluster dir>/s<i>/workspaces/<id>/
 * (container/workspace.h, container/ws_xfer.h).
 */
#ifndef SBX_TEST_CLUSTER_WS_COMMON_H
#define SBX_TEST_CLUSTER_WS_COMMON_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cluster.h"
#include "cluster_util.h"

/* A sandbox ID unique to the run whose partition node owns now. */
__attribute__((unused)) static void
id_on(const char *kind, int node, char id[64])
{
    struct cl_state st;
    cr_assert_eq(cl_read_state(&st), 0);
    for (int k = 0;; k++) {
        cr_assert_lt(k, 100000, "no sandbox ID on node %d", node);
        sb_id(id, 64, kind, k);
        if (owner_of(&st, id) == node)
            return;
    }
}

/* The node of 0-2 other than a that owns id's partition once a leaves
 * (rendezvous hashing over the other two, runtime/place.h). */
__attribute__((unused)) static int
successor(const char *id, int a)
{
    const char *names[2];
    char n[2][64];
    int idx[2], k = 0;
    for (int i = 0; i < 3; i++)
        if (i != a)
            idx[k++] = i;
    for (int i = 0; i < 2; i++) {
        cl_node_name(idx[i], n[i], sizeof(n[i]));
        names[i] = n[i];
    }
    return idx[sbx_place_owner(names, 2, sbx_place_partition(id, strlen(id)))];
}

__attribute__((unused)) static void
create_persistent(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call_json(c, "create", id, "{\"workspace\":\"persistent\"}", 30000, &r, &err);
    cr_assert_eq(rc, 0, "create %s {workspace: persistent}: %s %s", id, rc ? err.code : "",
                 rc ? err.message : "");
    sbx_reply_free(r);
}

/* <cluster dir>/s<i>/workspaces/<id>/<file> */
__attribute__((unused)) static void
ws_path(int i, const char *id, const char *file, char *out, size_t n)
{
    snprintf(out, n, "%s/s%d/workspaces/%s/%s", cl_env()->dir, i, id, file);
}

__attribute__((unused)) static bool
exists(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0;
}

/* Wait until node a has handed every partition away (a drain's end). */
__attribute__((unused)) static void
wait_drained(int a, struct cl_state *st)
{
    double until = cl_now_ms() + CONVERGE_MS;
    for (;;) {
        cr_assert_eq(cl_read_state(st), 0);
        if (st->count[a] == 0)
            return;
        cr_assert_lt(cl_now_ms(), until, "node %d never gave up its partitions", a);
        cl_sleep_ms(200);
    }
}

/* status of id as JSON text (heap). */
__attribute__((unused)) static char *
status_json(sbx_client *c, const char *id)
{
    sbx_reply *r = NULL;
    sbx_error err;
    int rc = sbx_call_json(c, "status", id, NULL, 20000, &r, &err);
    cr_assert_eq(rc, 0, "status %s: %s %s", id, rc ? err.code : "", rc ? err.message : "");
    char *j = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return j;
}

/* The integer after "key": in JSON text j, or -1. */
__attribute__((unused)) static long long
json_int(const char *j, const char *key)
{
    char k[80];
    snprintf(k, sizeof(k), "\"%s\":", key);
    const char *p = j ? strstr(j, k) : NULL;
    return p ? atoll(p + strlen(k)) : -1;
}

#endif
