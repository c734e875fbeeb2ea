/*
 * itest_main.c — main() of every integration test binary: start a private
 * `sbxd dev`, point the tests at it through $SBX_TEST_URL, run Criterion,
 * stop the daemon.  Criterion runs each test in its own process; those
 * processes inherit the environment set here.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#include "harness.h"

int
main(int argc, char *argv[])
{
    struct testd d;
    /* --pool-memory 32M: the shared daemon's pools stay as small as they
     * were before the default followed the node's memory (about 20 ready
     * containers a shard after a burst, not 35): two test binaries run at
     * once on 2 CPUs.  tests/integration/test_pool.c checks the default. */
    static const char *const extra[] = {"--pool",   "2",    "--pool-memory", "32M",
                                        "--memory", "256M", "--pids",        "128",
                                        "--disk",   "256M", NULL};
    struct criterion_test_set *tests = criterion_initialize();
    int result = 0;
    if (!criterion_handle_args(argc, argv, true)) {
        criterion_finalize(tests);
        return 0;
    }
    if (testd_start(&d, 2, extra) != 0) {
        fprintf(stderr, "itest: could not start sbxd\n");
        criterion_finalize(tests);
        return 1;
    }
    setenv("SBX_TEST_URL", d.url, 1);
    setenv("SBX_TEST_DIR", d.dir, 1);
    result = !criterion_run_all_tests(tests);
    criterion_finalize(tests);
    testd_stop(&d);
    return result;
}
