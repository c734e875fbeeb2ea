/*
 * cluster_int.h — what the files of the cluster harness (cluster.c: main()'s
 * side and the tests' control calls; cluster_sup.c: the supervisor process;
 * cluster_state.c: state, convergence, logs) share beyond cluster.h.  Not for
 * the tests.
 */
#ifndef SBX_TEST_CLUSTER_INT_H
#define SBX_TEST_CLUSTER_INT_H

#include <stddef.h>

#include "cluster.h"

/* The shards' ports on their node address (cluster.h). */
#define NODE_PORT 7701
#define RELAY_PORT 7790
/* Host uids of the shards: above the ranges `sbxd dev` picks for itself
 * (1000000000 + (hash % 4096) * 4 * 65536, up to 2073741824), so clusters and
 * dev daemons side by side never share host uids; 256 slots of 4 nodes,
 * all below 2^31. */
#define UID_BASE 2080000000u

/* The supervisor's life (cluster_sup.c): build the cluster described by o,
 * report "ok VAR=value…" or "fail why" on to_main, serve, tear down when
 * from_main closes (or on SIGINT/SIGTERM), report "done N", exit.  Called in
 * the child cl_setup forks; never returns. */
void sup_main(const struct cl_opts *o, int to_main, int from_main) __attribute__((noreturn));

/* The sanitizer reports (ASan, LSan, UBSan, TSan) in the daemons' logs under
 * dir (*.log but setup.log and etcd.log): how many; the first one's line
 * onwards into out (out may be NULL; otherwise it is written only when a
 * report is found). */
int scan_dir_reports(const char *dir, char *out, size_t outlen);

/* Print the last `lines` lines of every log under dir to stderr. */
void tails_of_dir(const char *dir, int lines);

#endif
