/*
 * harness.h — helpers for the integration tests: a private `sbxd dev` per
 * test binary, unique sandbox IDs, small exec wrappers.
 *
 * Each test binary starts its own daemon in a fresh temporary directory
 * with its gateway on an ipc:// socket there, so test binaries can run side
 * by side on one host without sharing ports, data or cgroups (the shards
 * are named after the directory).  testd_stop() stops it by pid, waits for
 * it and removes the directory.  Binaries come from $SBX_BIN (default
 * build/asan/bin).
 */
#ifndef SBX_TEST_HARNESS_H
#define SBX_TEST_HARNESS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "shell.h"
#include "../../include/sbx/sbx.h"

struct testd {
    pid_t pid;
    char dir[256];      /* data directory (removed by testd_stop) */
    char url[320];      /* gateway URL */
    char name[64];      /* deployment name: shard names are <name>-s<i> */
    char log[320];      /* the daemon's log file */
};

/* TESTD_SMALL — the extra `sbxd dev` arguments (for testd_start) of a small
 * private daemon: no warm pool, 256 MiB of memory, 128 pids and 64 MiB of
 * disk per sandbox.  Use as {TESTD_SMALL, more..., NULL}. */
#define TESTD_SMALL "--pool", "0", "--memory", "256M", "--pids", "128", "--disk", "64M"

/*
 * testd_start — start `sbxd dev --shards N` with extra arguments (NULL-
 * terminated, may be NULL) and wait until the gateway answers (30 s).
 * Returns 0 or -1 (the log is printed on failure).
 */
int testd_start(struct testd *d, int shards, const char *const *extra);
/* testd_stop — SIGTERM, wait up to 20 s, SIGKILL; remove the directory. */
void testd_stop(struct testd *d);
/* testd_restart — stop the daemon process (keeping its data) and start it again. */
int testd_restart(struct testd *d, int shards, const char *const *extra);
/* testd_wait_ready — wait until the gateway answers cluster.status with every shard healthy. */
int testd_wait_ready(const char *url, int timeout_ms);

/* The URL tests use: the daemon started by the test binary's main. */
const char *test_url(void);
/* test_prefix — $SBX_TEST_PREFIX if it is 1-8 lower-case letters and
 * digits, else "" (never NULL; the environment owns it).  tools/run-tests.sh
 * sets it, unique per run: tests put it in the names of what they create on
 * the host (deployment names, and with them shard cgroups and /run/sbx
 * locks; /tmp/sbx-* directories and the mounts under them), so that
 * tools/leftovers.sh can tell this run's leftovers from other runs'. */
const char *test_prefix(void);
/* test_http_url — "http://127.0.0.1:PORT" of the test daemon's HTTP front
 * (from http.addr in $SBX_TEST_DIR); static storage. */
const char *test_http_url(void);
/* test_client — a fresh client for test_url() (aborts the test on failure). */
sbx_client *test_client(void);
/* test_id — a sandbox ID unique to this process: "<prefix>-<pid>-<n>" (static buffer per call is NOT used: caller frees). */
char *test_id(const char *prefix);

/* Run a shell string; returns the result (caller frees with sbx_exec_result_free). */
int test_sh(sbx_client *c, const char *sandbox, const char *cmd, int64_t timeout_ms,
            sbx_exec_result *r, sbx_error *err);

/* test_sh_out — test_sh, tried again every 200 ms for up to 60 s while the
 * answer says the shard is away (SHARD_UNAVAILABLE, UNAVAILABLE,
 * INTERRUPTED, TIMEOUT: after a kill or a restart).  Its stdout (heap,
 * caller frees; "" when none) and exit code (*code, if not NULL), or NULL
 * with the error in why. */
char *test_sh_out(sbx_client *c, const char *sandbox, const char *cmd, int64_t timeout_ms,
                  int *code, char *why, size_t whylen);

/* test_memory_bytes — the sandbox's container.memoryBytes from `status`
 * (its cgroup's usage), or -1. */
int64_t test_memory_bytes(sbx_client *c, const char *sandbox);

/* Elapsed monotonic milliseconds. */
double test_now_ms(void);

/* test_json_int — the integer after the first "key": in the JSON text json
 * (a flat search: the first member of that name at any depth), or -1 when
 * there is none.  For reading one figure of a status reply in a test. */
long long test_json_int(const char *json, const char *key);

/* test_ppid — the parent pid of pid (the PPid line of /proc/<pid>/status),
 * or -1 when pid is gone.  Tests check it before they signal a pid they
 * found, so that they signal only their own daemon's children. */
pid_t test_ppid(pid_t pid);

/* test_child_of — a child of parent other than not (-1: any), the first
 * /proc lists (e.g. a shard of the `sbxd dev` whose pid is parent), or -1. */
pid_t test_child_of(pid_t parent, pid_t not);

/* test_tmpfs_mount — a fresh directory /tmp/sbx-<tag>-<test_prefix()>XXXXXX
 * (into dir, n ≥ 64 bytes) with a tmpfs of `size` (mount(8) syntax, e.g.
 * "8m"; nosuid, nodev, mode 0700) mounted on it, for a data directory that
 * fills up.  0, or -1 with errno (nothing left behind).  The caller removes
 * it with test_tmpfs_remove (also from its .fini, so a failed test leaves no
 * mount). */
int test_tmpfs_mount(char *dir, size_t n, const char *tag, const char *size);
/* test_tmpfs_remove — unmount (lazily) and remove what test_tmpfs_mount
 * made; "" or a directory that is not mounted is harmless. */
void test_tmpfs_remove(const char *dir);

#endif
