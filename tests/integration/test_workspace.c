/*
 * test_workspace.c — persistent workspaces (docs/persistence.md, issue 15):
 * a sandbox created with `workspace: "persistent"` keeps /workspace, /home
 * and /tmp (and an image sandbox its whole upper layer) on the shard's disk.
 *
 * Checks what a user would: a file written before the container slept
 * (sleepAfter) is there after the next operation woke it; after a kill -9
 * of the shard and its restart by the supervisor; destroy removes the
 * workspace's directory under the shard's data and a new sandbox of the
 * same ID starts empty, and a workspace left without a sandbox is swept at
 * the shard's next start; writing past the disk limit fails with ENOSPC
 * inside, the image file on the host stays within the limit, and another
 * sandbox still writes; an ephemeral sandbox's `disk` bounds its tmpfs the
 * same way (ENOSPC inside, over --disk-max refused); an image sandbox's write under /usr (its overlay's
 * upper layer) survives sleep too, and an ephemeral one's `disk` bounds
 * that layer; an ephemeral sandbox of the same deployment loses
 * its file at sleep (the default is unchanged); status shows the mode and
 * disk usage; `sbxd --workspace-default persistent` makes it the default.
 * After the daemon stops, no loop device backed by a file of
 * its data directory is left.
 *
 * Each test starts its own small daemon (one shard, --disk 64M), stopped
 * by the suite's fini.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <glob.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/imgbuild.h"

static struct testd *live;
static char work[128]; /* the image test's layout, removed by the fini */

static void
cleanup(void)
{
    if (live) {
        testd_stop(live);
        free(live);
        live = NULL;
    }
    if (work[0]) {
        sbx_rm_rf(work);
        work[0] = '\0';
    }
}

TestSuite(workspace, .fini = cleanup, .timeout = 240);

static sbx_client *
start_with(const char *const *extra)
{
    live = calloc(1, sizeof(*live));
    cr_assert_eq(testd_start(live, 1, extra), 0, "the daemon did not start");
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    return c;
}

static sbx_client *
start(void)
{
    const char *const extra[] = {TESTD_SMALL, NULL};
    return start_with(extra);
}

/* op with JSON args; the result's JSON (heap), or NULL with code[64]. */
static char *
call(sbx_client *c, const char *op, const char *id, const char *args, char code[64])
{
    sbx_reply *r = NULL;
    sbx_error err;
    code[0] = 0;
    if (sbx_call_json(c, op, id, args, 60000, &r, &err) != 0) {
        snprintf(code, 64, "%s", err.code);
        sbx_error_free(&err);
        return NULL;
    }
    char *j = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return j;
}

static void
ok(sbx_client *c, const char *op, const char *id, const char *args)
{
    char code[64];
    char *j = call(c, op, id, args, code);
    cr_assert(j, "%s %s %s: %s", op, id, args, code);
    free(j);
}

/* Run cmd; its stdout (heap), exit code in *code.  Retries while the
 * shard is away (after its kill) for up to 60 s. */
static char *
sh(sbx_client *c, const char *id, const char *cmd, int *code)
{
    char why[768];
    char *out = test_sh_out(c, id, cmd, 30000, code, why, sizeof(why));
    cr_assert(out, "%s", why);
    return out;
}

/* The generation (containers started so far) and state of a sandbox. */
static int64_t
generation(sbx_client *c, const char *id, char state[16])
{
    char code[64];
    char *j = call(c, "status", id, "{}", code);
    cr_assert(j, "status %s: %s", id, code);
    const char *g = strstr(j, "\"generation\":");
    cr_assert(g, "no generation in %s", j);
    int64_t n = strtoll(g + 13, NULL, 10);
    if (state) {
        const char *s = strstr(j, "\"state\":\"");
        cr_assert(s);
        sscanf(s + 9, "%15[^\"]", state);
    }
    free(j);
    return n;
}

/* Wait until the sandbox's container has stopped for idleness. */
static void
wait_stopped(sbx_client *c, const char *id)
{
    char state[16] = "";
    for (int i = 0; i < 200; i++) {
        generation(c, id, state);
        if (!strcmp(state, "stopped"))
            return;
        usleep(100 * 1000);
    }
    cr_assert_fail("sandbox %s did not sleep (state %s)", id, state);
}

static void
create(sbx_client *c, const char *id, const char *mode)
{
    char args[128];
    snprintf(args, sizeof(args), "{\"workspace\":\"%s\"}", mode);
    ok(c, "create", id, args);
}

/* The shard's pid: the supervisor's child. */
static pid_t
shard_pid(pid_t dev)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    pid_t found = -1;
    while (d && (de = readdir(d)) != NULL) {
        pid_t p = (pid_t)atoi(de->d_name);
        if (p > 0 && test_ppid(p) == dev) {
            found = p;
            break;
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* Loop devices whose backing file is under dir. */
static int
loops_under(const char *dir)
{
    glob_t g;
    int n = 0;
    if (glob("/sys/block/loop*/loop/backing_file", 0, NULL, &g) != 0)
        return 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        FILE *f = fopen(g.gl_pathv[i], "re");
        char line[4096] = "";
        if (f && fgets(line, sizeof(line), f) && !strncmp(line, dir, strlen(dir)))
            n++;
        if (f)
            fclose(f);
    }
    globfree(&g);
    return n;
}

Test(workspace, survives_sleep_and_shard_kill)
{
    sbx_client *c = start();
    char *id = test_id("wsp");
    char *eph = test_id("wse");
    create(c, id, "persistent");
    create(c, eph, "ephemeral");
    ok(c, "sandbox.configure", id, "{\"sleepAfter\":\"1s\"}");
    ok(c, "sandbox.configure", eph, "{\"sleepAfter\":\"1s\"}");
    int code;
    free(sh(c, id, "echo kept > /workspace/f && mkdir -p /home/u && echo h > /home/u/g", &code));
    cr_assert_eq(code, 0);
    free(sh(c, eph, "echo lost > /workspace/f", &code));
    cr_assert_eq(code, 0);
    /* Beside the kept file system, the root, /run and /dev/shm are one tmpfs
     * (issue 18: one superblock where there were three), not kept. */
    char *fs = sh(c, id, "stat -c %d / /run /dev/shm | sort -u | wc -l; "
                         "test $(stat -c %d /) != $(stat -c %d /workspace) && echo apart",
                  &code);
    cr_expect_str_eq(fs, "1\napart\n", "devices of /, /run, /dev/shm, /workspace: %s", fs);
    free(fs);

    /* Status: the mode, and the disk the workspace holds. */
    char cd[64];
    char *st = call(c, "status", id, "{}", cd);
    cr_assert(st && strstr(st, "\"mode\":\"persistent\"") && strstr(st, "\"usedBytes\":"),
              "status: %s", st ? st : cd);
    free(st);

    /* Sleep, then wake-up by the next exec. */
    int64_t g0 = generation(c, id, NULL);
    wait_stopped(c, id);
    wait_stopped(c, eph);
    char *out = sh(c, id, "cat /workspace/f /home/u/g", &code);
    cr_assert_eq(code, 0, "the files are gone after sleep");
    cr_assert_str_eq(out, "kept\nh\n");
    free(out);
    cr_assert_gt(generation(c, id, NULL), g0, "the container did not restart");
    out = sh(c, eph, "cat /workspace/f 2>/dev/null || echo none", &code);
    cr_assert_str_eq(out, "none\n", "an ephemeral workspace kept its file");
    free(out);

    /* kill -9 of the shard; the supervisor starts it again. */
    free(sh(c, id, "echo again >> /workspace/f", &code));
    pid_t sp = shard_pid(live->pid);
    cr_assert_gt(sp, 0, "no shard process");
    cr_assert_eq(kill(sp, SIGKILL), 0);
    out = sh(c, id, "cat /workspace/f", &code);
    cr_assert_eq(code, 0);
    cr_assert_str_eq(out, "kept\nagain\n", "after the shard's kill -9");
    free(out);
    cr_assert_neq(shard_pid(live->pid), sp, "the shard was not restarted");
    free(id);
    free(eph);
    sbx_client_close(c);

    /* Nothing mounted is left once the daemon is gone. */
    char data[300];
    snprintf(data, sizeof(data), "%s", live->dir);
    testd_stop(live);
    free(live);
    live = NULL;
    int left = 0;
    for (int i = 0; i < 50 && (left = loops_under(data)) > 0; i++)
        usleep(100 * 1000);
    cr_assert_eq(left, 0, "%d loop devices backed by files under %s are left", left, data);
}

Test(workspace, destroy_removes_it)
{
    sbx_client *c = start();
    char *id = test_id("wsd");
    create(c, id, "persistent");
    int code;
    free(sh(c, id, "echo x > /workspace/f", &code));
    char dir[512];
    snprintf(dir, sizeof(dir), "%s/s0/workspaces/%s/disk.img", live->dir, id);
    struct stat sb;
    cr_assert_eq(stat(dir, &sb), 0, "no workspace image at %s", dir);
    ok(c, "destroy", id, "{}");
    cr_assert_neq(stat(dir, &sb), 0, "%s is still there after destroy", dir);
    create(c, id, "persistent");
    char *out = sh(c, id, "ls -A /workspace", &code);
    cr_assert_eq(code, 0);
    cr_assert_str_eq(out, "", "a new sandbox of the same ID sees: %s", out);
    free(out);
    /* A workspace without a sandbox (a destroy cut short) is swept when the
     * shard starts; a live sandbox's is kept. */
    free(sh(c, id, "echo y > /workspace/g", &code));
    char ghost[512];
    snprintf(ghost, sizeof(ghost), "%s/s0/workspaces/ghost-%d", live->dir, (int)getpid());
    cr_assert_eq(mkdir(ghost, 0700), 0, "mkdir %s", ghost);
    sbx_client_close(c);
    const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_restart(live, 1, extra), 0, "the daemon did not restart");
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    cr_assert_neq(stat(ghost, &sb), 0, "%s was not swept", ghost);
    out = sh(c, id, "cat /workspace/g", &code);
    cr_assert_str_eq(out, "y\n", "the live sandbox's workspace after the restart");
    free(out);
    ok(c, "destroy", id, "{}");
    free(id);
    sbx_client_close(c);
}

Test(workspace, quota)
{
    sbx_client *c = start();
    char *a = test_id("wsq");
    char *b = test_id("wsr");
    create(c, a, "persistent");
    create(c, b, "persistent");
    int code;
    /* 100 MB into a 64 MiB workspace. */
    char *out = sh(c, a,
                   "dd if=/dev/zero of=/workspace/big bs=1M count=100 2>&1; echo rc=$?", &code);
    cr_assert(strstr(out, "No space left on device"), "dd said: %s", out);
    cr_assert(!strstr(out, "rc=0"), "dd succeeded: %s", out);
    free(out);
    char img[512];
    snprintf(img, sizeof(img), "%s/s0/workspaces/%s/disk.img", live->dir, a);
    struct stat sb;
    cr_assert_eq(stat(img, &sb), 0);
    cr_assert_leq((long long)sb.st_blocks * 512, 64ll << 20, "the image holds %lld bytes",
                  (long long)sb.st_blocks * 512);
    cr_assert_leq((long long)sb.st_size, 64ll << 20);
    out = sh(c, b, "echo fine > /workspace/f && cat /workspace/f", &code);
    cr_assert_eq(code, 0, "the other sandbox cannot write");
    cr_assert_str_eq(out, "fine\n");
    free(out);
    ok(c, "destroy", a, "{}");
    ok(c, "destroy", b, "{}");
    free(a);
    free(b);
    sbx_client_close(c);
}

/* An ephemeral workspace's `disk` sizes its tmpfs: writing past it fails
 * with ENOSPC inside, status reports the limit, a sandbox without `disk`
 * keeps the deployment's --disk, and more than --disk-max is refused. */
Test(workspace, ephemeral_disk)
{
    const char *const extra[] = {TESTD_SMALL, "--disk-max", "128M", NULL};
    sbx_client *c = start_with(extra);
    char *a = test_id("wse");
    char *b = test_id("wsf");
    char *x = test_id("wsx");
    ok(c, "create", a, "{\"workspace\":\"ephemeral\",\"disk\":33554432}");
    create(c, b, "ephemeral");
    int code;
    /* 48 MB into a 32 MiB workspace: refused; the same into 64 MiB fits. */
    char *out = sh(c, a,
                   "dd if=/dev/zero of=/workspace/big bs=1M count=48 2>&1; echo rc=$?", &code);
    cr_assert(strstr(out, "No space left on device"), "dd said: %s", out);
    cr_assert(!strstr(out, "rc=0"), "dd succeeded: %s", out);
    free(out);
    out = sh(c, a, "rm /workspace/big; echo ok > /tmp/t && cat /tmp/t", &code);
    cr_assert_eq(code, 0, "the workspace is not writable after the full disk");
    cr_assert_str_eq(out, "ok\n");
    free(out);
    out = sh(c, b, "dd if=/dev/zero of=/workspace/big bs=1M count=48 2>&1; echo rc=$?", &code);
    cr_assert(strstr(out, "rc=0"), "the default-sized sandbox cannot write 48 MB: %s", out);
    free(out);
    char cd[64];
    char *j = call(c, "status", a, "{}", cd);
    cr_assert(j, "status: %s", cd);
    cr_assert(strstr(j, "\"mode\":\"ephemeral\"") && strstr(j, "\"limitBytes\":33554432"),
              "status: %s", j);
    free(j);
    j = call(c, "create", x, "{\"workspace\":\"ephemeral\",\"disk\":268435456}", cd);
    cr_assert_null(j, "a disk over --disk-max was accepted");
    cr_assert_str_eq(cd, "VALIDATION_FAILED");
    ok(c, "destroy", a, "{}");
    ok(c, "destroy", b, "{}");
    free(a);
    free(b);
    free(x);
    sbx_client_close(c);
}

Test(workspace, bad_mode)
{
    sbx_client *c = start();
    char *id = test_id("wsb");
    char code[64];
    char *j = call(c, "create", id, "{\"workspace\":\"forever\"}", code);
    cr_assert_null(j);
    cr_assert_str_eq(code, "VALIDATION_FAILED");
    free(id);
    sbx_client_close(c);
}

Test(workspace, image_upper_layer)
{
    snprintf(work, sizeof(work), "/tmp/sbx-wsimg-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    size_t nb = 0;
    struct imgb_entry *base = imgb_base_entries(&nb);
    cr_assert(base, "busybox-static is not installed (tools/deps.sh)");
    char l0[256], dir[256], d0[72], digest[72];
    snprintf(l0, sizeof(l0), "%s/l0.tar.gz", work);
    cr_assert_eq(imgb_layer(l0, base, nb, true, d0), 0);
    imgb_entries_free(base, nb);
    char *layers[] = {l0};
    const char *diffs[] = {d0};
    snprintf(dir, sizeof(dir), "%s/img", work);
    cr_assert_eq(imgb_layout(dir, layers, diffs, 1, true, NULL, digest), 0);

    sbx_client *c = start();
    char args[512], code[64];
    snprintf(args, sizeof(args), "{\"path\":\"%s\",\"name\":\"wstest/img:1\"}", dir);
    char *res = call(c, "image.import", NULL, args, code);
    cr_assert(res, "image.import: %s", code);
    free(res);
    char *id = test_id("wsi");
    ok(c, "create", id, "{\"image\":\"wstest/img:1\",\"workspace\":\"persistent\"}");
    ok(c, "sandbox.configure", id, "{\"sleepAfter\":\"1s\"}");
    int ec;
    free(sh(c, id, "echo up > /usr/kept && echo w > /workspace/f", &ec));
    res = call(c, "status", id, "{}", code);
    cr_assert(res && strstr(res, "\"mode\":\"persistent\"") && strstr(res, "usedBytes"),
              "status: %s", res ? res : code);
    free(res);
    cr_assert_eq(ec, 0);
    int64_t g0 = generation(c, id, NULL);
    wait_stopped(c, id);
    char *out = sh(c, id, "cat /usr/kept /workspace/f", &ec);
    cr_assert_eq(ec, 0, "gone after sleep: %s", out);
    cr_assert_str_eq(out, "up\nw\n");
    free(out);
    cr_assert_gt(generation(c, id, NULL), g0);
    ok(c, "destroy", id, "{}");
    free(id);
    /* An ephemeral image sandbox's `disk` bounds its upper layer's tmpfs. */
    id = test_id("wsj");
    ok(c, "create", id, "{\"image\":\"wstest/img:1\",\"workspace\":\"ephemeral\","
                        "\"disk\":33554432}");
    out = sh(c, id, "busybox dd if=/dev/zero of=/usr/big bs=1M count=48 2>&1; echo rc=$?", &ec);
    cr_assert(strstr(out, "No space left on device") && !strstr(out, "rc=0"), "dd said: %s", out);
    free(out);
    ok(c, "destroy", id, "{}");
    free(id);
    sbx_client_close(c);
}

/* sbxd --workspace-default persistent: a create that names no workspace
 * gets a persistent one; one that says ephemeral does not. */
Test(workspace, deployment_default)
{
    const char *const extra[] = {TESTD_SMALL, "--workspace-default", "persistent", NULL};
    sbx_client *c = start_with(extra);
    char *p = test_id("wsdp"), *e = test_id("wsde");
    ok(c, "create", p, "{}");
    create(c, e, "ephemeral");
    char code[64];
    char *j = call(c, "status", p, "{}", code);
    cr_assert(j && strstr(j, "\"mode\":\"persistent\""), "status: %s", j ? j : code);
    free(j);
    j = call(c, "status", e, "{}", code);
    cr_assert(j && strstr(j, "\"mode\":\"ephemeral\""), "status: %s", j ? j : code);
    free(j);
    int ec;
    free(sh(c, p, "echo d > /workspace/f", &ec));
    char img[512];
    snprintf(img, sizeof(img), "%s/s0/workspaces/%s/disk.img", live->dir, p);
    struct stat sb;
    cr_assert_eq(stat(img, &sb), 0, "no image at %s", img);
    ok(c, "destroy", p, "{}");
    ok(c, "destroy", e, "{}");
    free(p);
    free(e);
    sbx_client_close(c);
}
