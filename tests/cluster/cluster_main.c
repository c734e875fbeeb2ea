/*
 * cluster_main.c — main() of the tests/cluster binaries: build a multi-host
 * cluster on this machine (tests/cluster/cluster.h), run the tests one at a
 * time (they kill, stop and restart nodes: never in parallel, whatever
 * --jobs says), tear the cluster down.  The exit status also fails when a
 * daemon's log holds a sanitizer report (leaks show up at exit, after the
 * last test).
 *
 * SBX_BIN selects the binaries (default build/asan/bin); SBX_KEEP_TEST_DATA
 * keeps the logs (they are kept anyway when a test failed or a sanitizer
 * reported; the path is printed).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "cluster.h"

/* More `sbxd shard` arguments of every node: none, unless the test binary
 * defines its own cl_shard_extra (cluster.h). */
__attribute__((weak)) const char *const cl_shard_extra[] = {NULL};

int
main(int argc, char *argv[])
{
    struct criterion_test_set *tests = criterion_initialize();
    if (!criterion_handle_args(argc, argv, true)) {
        criterion_finalize(tests);
        return 0;
    }
    criterion_options.jobs = 1;
    struct cl_opts o = {.nodes = 3, .gateways = 2, .pool = 1, .shard_extra = cl_shard_extra};
    double t0 = cl_now_ms();
    if (cl_setup(&o) != 0) {
        fprintf(stderr, "cluster tests: could not build the cluster\n");
        criterion_finalize(tests);
        return 1;
    }
    fprintf(stderr, "cluster tests: cluster up in %.1f s\n", (cl_now_ms() - t0) / 1000);
    int result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    int reports = cl_teardown(result != 0);
    if (reports) {
        fprintf(stderr, "cluster tests: %d sanitizer report(s) in the daemons' logs\n", reports);
        result = 1;
    }
    return result;
}
