/*
 * test_storage.c — the output gate when the shard's metadata store is full
 * (docs/protocol.md §4.1, `STORAGE_FULL`).
 *
 * The daemon's data directory is a private 8 MiB tmpfs that the test fills
 * with a file of its own.  env.set on a running sandbox also goes on in its
 * container: each one must be acknowledged only if its record was
 * committed, a refused one must not be applied in the container either,
 * and what is read back (the container's environment, status's
 * sleepAfter) must be the last acknowledged value — before and after
 * space is freed and the daemon restarted.
 *
 * A second test gives the store a tiny map (--map-size 512K --map-max 2M):
 * the map grows to its maximum (cluster.status's storeMapBytes), the write
 * that does not fit is STORAGE_FULL while a small write of another sandbox
 * still succeeds and reads keep working, and after a restart with a larger
 * --map-max the sandbox holds exactly its acknowledged variables.
 *
 * A third fills the disk before any record of three new sandboxes exists:
 * an env.set that would create one with a value that does not fit must not
 * create it (its bare record would fit: it went first, alone); a
 * configure that failed must not show its value once the sandbox is
 * created after all (its settings are cached beside the record), and an
 * exec whose sandbox record could not be written must not be acknowledged
 * as if the sandbox existed (a restart loses it) — issue 11's fill fault.
 *
 * Each daemon is one this test started (stopped by pid, its directory
 * removed); the mount and its directory are removed at the end, also when
 * an assertion ends the test.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"

static struct testd *live_testd;
static char live_mount[64];

static void
cleanup(void)
{
    if (live_testd && live_testd->pid > 0)
        testd_stop(live_testd);
    test_tmpfs_remove(live_mount);
    live_testd = NULL;
    live_mount[0] = '\0';
}

/* Fill the file system at mnt with <mnt>/filler (removed by the caller). */
static void
fill_fs(const char *mnt)
{
    char filler[300];
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    int fd = open(filler, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(fd >= 0, "%s: %s", filler, strerror(errno));
    static char block[65536];
    while (write(fd, block, sizeof(block)) > 0)
        ;
    while (write(fd, block, 512) > 0)
        ;
    close(fd);
}

static int
configure_sleep(sbx_client *c, const char *id, long long seconds, char code[48])
{
    tcall t = tc_call(c, "sandbox.configure", id, json_pack("{s:I}", "sleepAfter", seconds), 0);
    int rc = t.rc;
    snprintf(code, 48, "%s", rc ? t.err.code : "");
    tc_free(&t);
    return rc;
}

Test(storage, full_data_directory_with_a_running_container_acknowledges_only_commits,
     .timeout = 180, .fini = cleanup)
{
    char mnt[64];
    cr_assert_eq(test_tmpfs_mount(mnt, sizeof(mnt), "fullrun", "8m"), 0, "mount tmpfs: %s",
                 strerror(errno));
    snprintf(live_mount, sizeof(live_mount), "%s", mnt);
    static struct testd d;
    const char *const extra[] = {"--data", mnt, "--pool", "0", "--memory", "256M", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start on the tmpfs");
    live_testd = &d;
    sbx_client *c = tc_client(d.url, 30000);
    const char *id = "ffullrun";
    char code[48], key[32];
    cr_assert_eq(tc_env_fill(c, id, "BEFORE", 10, code), 0, "env.set before: %s", code);
    cr_assert_eq(configure_sleep(c, id, 600, code), 0, "configure before: %s", code);
    char *out = tsh_out(c, id, "echo up");
    cr_assert_str_eq(out, "up\n", "the container runs");
    free(out);

    fill_fs(mnt);
    /* env.set on the running sandbox goes on in the container: each one must
     * be acknowledged only if its record was committed. */
    int failed = 0, first_failed = -1;
    unsigned char acked[40] = {0};
    /* At most 12 x 60 KB: under the environment's bound (ENV_MAX_BYTES). */
    for (int i = 0; i < 12 && failed < 3; i++) {
        snprintf(key, sizeof(key), "RUN%d", i);
        if (tc_env_fill(c, id, key, 60000, code) == 0) {
            acked[i] = 1;
            continue;
        }
        cr_assert_str_eq(code, "STORAGE_FULL", "env.set on a running sandbox, full disk: %s",
                         code);
        if (first_failed < 0)
            first_failed = i;
        failed++;
    }
    cr_assert_gt(failed, 0, "no env.set on a running sandbox was refused on a full disk "
                            "(each one got OK)");
    /* A register write through configure: refused, and status keeps the last acknowledged value. */
    int rc = configure_sleep(c, id, 1200, code);
    if (rc)
        cr_expect_str_eq(code, "STORAGE_FULL", "configure on a full disk: %s", code);
    tcall t = tc_call(c, "status", id, NULL, 0);
    tc_ok(t, "status on a full disk");
    cr_expect_eq(jint(t.res, "sandbox.sleepAfter"), rc ? 600000 : 1200000,
                 "status's sleepAfter is not the last acknowledged value (configure %s)",
                 rc ? code : "OK");
    tc_free(&t);
    /* The container has exactly the acknowledged variables: a refused change
     * did not reach it. */
    out = tsh_out(c, id, "env | cut -d= -f1 | grep -E '^RUN[0-9]+$' | sort -V | tr '\\n' ' '");
    char want[512] = "";
    for (int i = 0; i < 40; i++) {
        if (acked[i]) {
            size_t n = strlen(want);
            snprintf(want + n, sizeof(want) - n, "RUN%d ", i);
        }
    }
    cr_expect_str_eq(out, want, "variables in the running container (first refused: RUN%d)",
                     first_failed);
    free(out);

    /* Space again: the refused write succeeds now, and survives a restart. */
    char filler[300];
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    cr_assert_eq(unlink(filler), 0);
    snprintf(key, sizeof(key), "RUN%d", first_failed);
    cr_assert_eq(tc_env_fill(c, id, key, 60000, code), 0, "env.set after freeing space: %s", code);
    acked[first_failed] = 1;
    cr_assert_eq(testd_restart(&d, 1, extra), 0, "restart on the tmpfs");
    sbx_client_close(c);
    c = tc_client(d.url, 30000);
    out = tsh_out(c, id,
                  "env | cut -d= -f1 | grep -E '^(BEFORE|RUN[0-9]+)$' | sort -V | tr '\\n' ' '");
    char want2[600];
    snprintf(want2, sizeof(want2), "BEFORE ");
    for (int i = 0; i < 40; i++) {
        if (acked[i]) {
            size_t n = strlen(want2);
            snprintf(want2 + n, sizeof(want2) - n, "RUN%d ", i);
        }
    }
    cr_expect_str_eq(out, want2, "variables after a restart: the acknowledged ones, only");
    free(out);
    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
    cr_expect_eq(umount2(mnt, 0), 0, "umount %s: %s", mnt, strerror(errno));
    rmdir(mnt);
    live_mount[0] = '\0';
    cr_log_info("full disk, running container: %d refused, first RUN%d", failed, first_failed);
}

Test(storage, a_tiny_map_grows_then_refuses_only_what_does_not_fit, .timeout = 180,
     .fini = cleanup)
{
    static struct testd d;
    const char *const small[] = {"--pool", "0", "--memory", "256M", "--map-size", "512K",
                                 "--map-max", "2M", NULL};
    cr_assert_eq(testd_start(&d, 1, small), 0, "sbxd dev did not start with a tiny map");
    live_testd = &d;
    sbx_client *c = tc_client(d.url, 30000);
    const char *id = "fmapbig", *other = "fmapother";
    char code[48], key[32];
    cr_expect_eq(tc_shard_status(c, "storeMapBytes"), 512 << 10,
                 "the map starts at --map-size");
    cr_assert_eq(tc_env_fill(c, other, "OTHER", 10, code), 0, "env.set of another sandbox: %s", code);

    /* Each env.set rewrites the whole record, 60 KB larger each time: the
     * record (its old and new copy in one transaction) soon needs more than
     * the largest map. */
    int failed = 0, first_failed = -1;
    unsigned char acked[16] = {0};
    for (int i = 0; i < 16 && failed < 2; i++) {
        snprintf(key, sizeof(key), "MAP%d", i);
        if (tc_env_fill(c, id, key, 60000, code) == 0) {
            acked[i] = 1;
            continue;
        }
        cr_assert_str_eq(code, "STORAGE_FULL", "env.set into a full map: %s", code);
        if (first_failed < 0)
            first_failed = i;
        failed++;
    }
    cr_assert_gt(failed, 0, "16 x 60 KB into a map of at most 2 MiB: never STORAGE_FULL");
    cr_expect_gt(first_failed, 5, "only %d writes before STORAGE_FULL: did the map grow?",
                 first_failed);
    cr_expect_eq(tc_shard_status(c, "storeMapBytes"), 2 << 20,
                 "the map grew to --map-max before writes failed");
    /* A small write of another sandbox still fits; reads keep working. */
    cr_expect_eq(tc_env_fill(c, other, "OTHER2", 10, code), 0, "a small write after: %s", code);
    tcall t = tc_call(c, "status", id, NULL, 0);
    tc_ok(t, "status with a full map");
    tc_free(&t);
    sbx_client_close(c);

    /* A larger maximum: the refused write succeeds, and exactly the
     * acknowledged variables are there. */
    const char *const large[] = {"--pool", "0", "--memory", "256M", "--map-size", "512K",
                                 "--map-max", "8M", NULL};
    cr_assert_eq(testd_restart(&d, 1, large), 0, "restart with --map-max 8M");
    c = tc_client(d.url, 30000);
    snprintf(key, sizeof(key), "MAP%d", first_failed);
    cr_assert_eq(tc_env_fill(c, id, key, 60000, code), 0, "env.set with room again: %s", code);
    acked[first_failed] = 1;
    char *out =
        tsh_out(c, id, "env | cut -d= -f1 | grep -E '^MAP[0-9]+$' | sort -V | tr '\\n' ' '");
    char want[256] = "";
    for (int i = 0; i < 16; i++) {
        if (acked[i]) {
            size_t n = strlen(want);
            snprintf(want + n, sizeof(want) - n, "MAP%d ", i);
        }
    }
    cr_expect_str_eq(out, want, "variables after the restart: the acknowledged ones, only");
    free(out);
    out = tsh_out(c, other, "printenv OTHER OTHER2 | wc -l");
    cr_expect_str_eq(out, "2\n", "the other sandbox's acknowledged writes");
    free(out);
    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
    cr_log_info("tiny map: first STORAGE_FULL at write %d", first_failed);
}

/* env.set of n variables V0.. of 60 KB each in one op: 0, or non-zero with
 * the error's code in code. */
static int
env_set_many(sbx_client *c, const char *id, int n, char code[48])
{
    static char v[60001];
    memset(v, 'x', 60000);
    json_t *vars = json_object();
    for (int i = 0; i < n; i++) {
        char k[16];
        snprintf(k, sizeof(k), "V%d", i);
        json_object_set_new(vars, k, json_string(v));
    }
    tcall t = tc_call(c, "env.set", id, json_pack("{s:o}", "vars", vars), 0);
    int rc = t.rc;
    snprintf(code, 48, "%s", rc ? t.err.code : "");
    tc_free(&t);
    return rc;
}

/* status's sleepAfter of id (ms), -1 if the sandbox does not exist. */
static long long
status_sleep(sbx_client *c, const char *id, char code[48])
{
    tcall t = tc_call(c, "status", id, NULL, 0);
    long long v = t.rc ? -1 : jint(t.res, "sandbox.sleepAfter");
    snprintf(code, 48, "%s", t.rc ? t.err.code : "");
    tc_free(&t);
    return v;
}

Test(storage, full_data_directory_failed_writes_never_show_up_later, .timeout = 180,
     .fini = cleanup)
{
    char mnt[64];
    cr_assert_eq(test_tmpfs_mount(mnt, sizeof(mnt), "fullnew", "8m"), 0, "mount tmpfs: %s",
                 strerror(errno));
    snprintf(live_mount, sizeof(live_mount), "%s", mnt);
    static struct testd d;
    const char *const extra[] = {"--data", mnt, "--pool", "0", "--memory", "256M", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0, "sbxd dev did not start on the tmpfs");
    live_testd = &d;
    sbx_client *c = tc_client(d.url, 30000);
    const char *cfg = "ffullcfg", *ex = "ffullexec", *ref = "ffullref", *big = "ffullbig";
    char code[48];

    fill_fs(mnt);
    /* configure on a sandbox with no record: it would create it; refused. */
    int rc = configure_sleep(c, cfg, 1234, code);
    cr_assert_neq(rc, 0, "configure of a new sandbox on a full disk was acknowledged");
    cr_expect_str_eq(code, "STORAGE_FULL", "configure on a full disk: %s", code);
    cr_expect_eq(status_sleep(c, cfg, code), -1, "the refused configure created the sandbox");
    cr_expect_str_eq(code, "SANDBOX_NOT_FOUND", "status after the refused configure: %s", code);
    /* exec on a sandbox with no record: its record cannot be written. */
    sbx_exec_opts o = {.command = "echo ran", .timeout_ms = 60000};
    sbx_exec_result r;
    sbx_error err;
    int exec_rc = sbx_exec(c, ex, &o, &r, &err);
    if (exec_rc) {
        cr_log_info("exec on a full disk: %s", err.code);
        sbx_error_free(&err);
    } else {
        sbx_exec_result_free(&r);
    }

    char filler[300];
    snprintf(filler, sizeof(filler), "%s/filler", mnt);
    cr_assert_eq(unlink(filler), 0);

    /* Free pages inside LMDB's file, then a full disk again: a small write
     * still fits, a large one does not. */
    cr_assert_eq(env_set_many(c, "ffullscratch", 4, code), 0, "env.set: %s", code);
    tcall t = tc_call(c, "destroy", "ffullscratch", NULL, 0);
    tc_ok(t, "destroy of the scratch sandbox");
    tc_free(&t);
    /* LMDB reuses the freed pages once later transactions have committed. */
    for (int i = 0; i < 3; i++) {
        t = tc_call(c, i % 2 ? "destroy" : "create", "ffulltick", NULL, 0);
        tc_ok(t, "create/destroy of a small sandbox");
        tc_free(&t);
    }
    fill_fs(mnt);
    /* env.set creating a sandbox with a value that does not fit: refused,
     * and the sandbox was not created either (its bare record would fit). */
    cr_assert_neq(env_set_many(c, big, 12, code), 0,
                  "env.set of 720 KB on a full disk was acknowledged");
    cr_expect_str_eq(code, "STORAGE_FULL", "env.set on a full disk: %s", code);
    cr_expect_eq(status_sleep(c, big, code), -1, "the refused env.set created the sandbox");
    cr_assert_eq(unlink(filler), 0);

    /* Created now: with the defaults, not with the refused value. */
    t = tc_call(c, "create", cfg, NULL, 0);
    tc_ok(t, "create after freeing space");
    tc_free(&t);
    t = tc_call(c, "create", ref, NULL, 0);
    tc_ok(t, "create of a reference sandbox");
    tc_free(&t);
    long long dflt = status_sleep(c, ref, code);
    cr_assert_gt(dflt, 0, "status of the reference sandbox: %s", code);
    cr_expect_eq(status_sleep(c, cfg, code), dflt,
                 "sleepAfter of a sandbox created after its configure was refused (the "
                 "refused value is 1234000 ms)");

    /* An acknowledged exec created its sandbox: it is there after a restart. */
    cr_assert_eq(testd_restart(&d, 1, extra), 0, "restart on the tmpfs");
    sbx_client_close(c);
    c = tc_client(d.url, 30000);
    long long v = status_sleep(c, ex, code);
    if (exec_rc == 0)
        cr_expect_neq(v, -1, "the sandbox of an acknowledged exec is gone after a restart (%s)",
                      code);
    cr_expect_eq(status_sleep(c, cfg, code), dflt, "sleepAfter after a restart");
    cr_expect_eq(status_sleep(c, big, code), -1, "the refused env.set's sandbox after a restart");
    sbx_client_close(c);
    testd_stop(&d);
    live_testd = NULL;
    cr_expect_eq(umount2(mnt, 0), 0, "umount %s: %s", mnt, strerror(errno));
    rmdir(mnt);
    live_mount[0] = '\0';
    cr_log_info("exec on a full disk: %s", exec_rc ? "refused" : "acknowledged");
}
