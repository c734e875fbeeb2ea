/*
 * faults_util.h — what the fault-injection test binaries (test_faults.c,
 * test_faults_outages.c) share: small process and store helpers, and a
 * cluster the test supervises itself (N `sbxd shard` + one `sbxd gateway`)
 * with the cleanup that undoes what a failed assertion left behind.  Every
 * function asserts (Criterion) instead of returning an error.
 */
#ifndef SBX_TEST_FAULTS_UTIL_H
#define SBX_TEST_FAULTS_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "../support/harness.h"

/* SBX_FAULT_SEED, or a seed of this run's own (printed, to replay it). */
unsigned seed_from_env(void);
/* $SBX_BIN or build/asan/bin. */
const char *bin_dir(void);
/* Run a shell command line of our own (mdb_stat & co.); its exit status. */
int run(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The "Entries:" of one named database, from mdb_stat; -1 on failure. */
long mdb_entries(const char *dir, const char *db);
/* Wait for our child pid to end (it was SIGKILLed or SIGTERMed). */
void reap(pid_t pid, int timeout_ms);
/* /proc/<pid>/cmdline with NULs as spaces ("" if gone). */
void cmdline_of(pid_t pid, char *out, size_t n);
/* The children of `parent` (every thread's /proc/<pid>/task/<tid>/children)
 * whose command line contains `needle`; up to max pids in out; how many. */
int children_matching(pid_t parent, const char *needle, pid_t *out, int max);
/* An error a client may see while a shard or gateway is down. */
bool outage_error(const char *code);

/* A cluster the test supervises: N `sbxd shard` + one `sbxd gateway`. */

struct node {
    pid_t pid;
    char name[64];
    char url[320];
    char data[320];
    char uid[32];
};

struct cluster {
    char dir[256];
    char name[32];
    char log[320];
    int nshards;
    struct node shard[4];
    struct node gw;
    char gw_shards[4][400];
};

/*
 * What a failed assertion would leave behind (it leaves the test function
 * at once): the cluster, a daemon, a mount.  Each test that makes one names
 * it here and `.fini = cleanup` undoes whatever is still there.
 */
extern struct cluster *live_cluster;
extern struct testd *live_testd;
extern char live_mount[64];

/* Fork and exec argv with stdout and stderr appended to log; the child's pid. */
pid_t spawn_argv(const char *log, const char *const *argv);
/* (Re)start shard i / the gateway of c. */
void shard_spawn(struct cluster *c, int i);
void gw_spawn(struct cluster *c);
/* For a failure message: c's log, and whether each process answers on its own. */
void cluster_print_log(const struct cluster *c);
void cluster_diagnose(const struct cluster *c);
/* Wait until every process of c answers (fails the test otherwise). */
void cluster_ready(struct cluster *c);
/* Start nshards shards and a gateway in a fresh directory; live_cluster = c. */
void cluster_start(struct cluster *c, int nshards);
/* SIGTERM everything (gateway first), wait, keep the data unless told. */
void cluster_stop(struct cluster *c, bool remove);
/* `.fini` of the tests: stop live_cluster, live_testd, remove live_mount. */
void cleanup(void);

#endif
