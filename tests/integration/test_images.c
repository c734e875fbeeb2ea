/*
 * test_images.c — sandboxes from OCI images, end to end (docs/images.md):
 * an image built in the test, offline (tests/support/imgbuild.h: the host's
 * bash and its libraries plus busybox-static, in two layers, the second
 * with a whiteout and an opaque directory), imported through the gateway
 * (image.import, a path of this machine), then sandboxes created from it.
 *
 * Checks what a user would: `cat /etc/os-release` shows the image's; the
 * image's Env reaches commands, which start in its WorkingDir; whiteouts hide the first layer's files and
 * the opaque directory shows only the second layer's; /usr is owned by the
 * sandbox's root and writable (copy-on-write), and a file written under
 * /usr in one sandbox is not seen by another of the same image; the
 * sandbox's status names its image; an unknown image is IMAGE_NOT_FOUND; a
 * tampered layer is IMAGE_INVALID and leaves no layer in the store; a
 * `docker save`-style tarball (made by skopeo from the layout) imports and
 * runs; image.list / inspect / rm, and rm of an image a running sandbox
 * uses keeps it until the sandbox is gone; a sandbox keeps its image (by
 * digest) across a restart of its deployment, after its name moved to
 * another image; with --image-pool, the next sandbox of an image takes a
 * ready container of its image's pool; template.build bakes its steps into
 * a new layer a sandbox of the template sees and one of the base does not,
 * and a failing step leaves nothing; an image's User runs the commands.
 *
 * The layouts live in /tmp/sbx-img-<prefix>XXXXXX, removed by the suite's
 * fini; the store is in the test daemon's data directory (removed with it).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/imgbuild.h"

static char work[128];
static struct testd *live; /* a test's own daemon, stopped by the fini */

static void
cleanup(void)
{
    if (live) {
        testd_stop(live);
        live = NULL;
    }
    if (work[0]) {
        sbx_rm_rf(work);
        work[0] = '\0';
    }
}

/* One test of this file at a time (Criterion runs them in parallel with
 * --jobs): they share the daemon's image store, and one counts the store's
 * layers before its import and after its removal — another test's import
 * in between made it fail (a merged-main run).  The lock is the test
 * process's until it exits. */
static void
serialize(void)
{
    char p[512];
    const char *dir = getenv("SBX_TEST_DIR"); /* the suite's daemon's, removed with it */
    cr_assert_not_null(dir, "no SBX_TEST_DIR");
    snprintf(p, sizeof(p), "%s/images-tests.lock", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "open %s: %s", p, strerror(errno));
    cr_assert_eq(flock(fd, LOCK_EX), 0, "flock %s: %s", p, strerror(errno));
}

TestSuite(images, .init = serialize, .fini = cleanup);

/* call — op with JSON args (sandbox NULL for a node op); the result as JSON
 * text (heap), or NULL with the error's code in code[64] and message in msg. */
static char *
call(sbx_client *c, const char *op, const char *id, const char *args, char code[64],
     char msg[512])
{
    sbx_reply *r = NULL;
    sbx_error err;
    code[0] = 0;
    if (msg)
        msg[0] = 0;
    if (sbx_call_json(c, op, id, args, 60000, &r, &err) != 0) {
        snprintf(code, 64, "%s", err.code);
        if (msg)
            snprintf(msg, 512, "%s", err.message);
        sbx_error_free(&err);
        return NULL;
    }
    char *j = sbx_reply_json(r, false);
    sbx_reply_free(r);
    return j;
}

/* sh — run cmd in id; its stdout (heap), exit code in *code. */
static char *
sh(sbx_client *c, const char *id, const char *cmd, int *code)
{
    sbx_exec_result r;
    sbx_error err;
    int rc = test_sh(c, id, cmd, 30000, &r, &err);
    cr_assert_eq(rc, 0, "exec '%s' in %s: %s %s", cmd, id, rc ? err.code : "",
                 rc ? err.message : "");
    char *out = strdup(r.stdout_data ? r.stdout_data : "");
    if (code)
        *code = r.exit_code;
    sbx_exec_result_free(&r);
    return out;
}

/* Build the test image's layout at work/<name> (gzip layers), its
 * os-release ID=<osid>; with empties, an empty layer above each of the two
 * (the same layer twice, as Docker makes for ENV or WORKDIR); *digest. */
static void
build_image_x(const char *name, const char *osid, bool empties, char digest[72])
{
    size_t nb = 0;
    struct imgb_entry *base = imgb_base_entries(&nb);
    cr_assert(base, "busybox-static is not installed (tools/deps.sh)");
    base = realloc(base, (nb + 11) * sizeof(*base));
    struct imgb_entry more[] = {
        {'f', "etc/os-release", "ID=base\n", 0},
        {'d', "gone", NULL, 0},
        {'f', "gone/f", "x\n", 0},
        {'f', "rmme", "y\n", 0},
        {'d', "opq", NULL, 0},
        {'f', "opq/old", "old\n", 0},
        {'d', "usr/share", NULL, 0},
        {'f', "usr/share/base-file", "base\n", 0},
        /* What a rootfs tarball (mmdebstrap, debootstrap) has in /dev: the
         * sandbox's /dev must be its own all the same. */
        {'d', "dev", NULL, 0},
        {'l', "dev/fd", "/proc/self/fd", 0},
        {'c', "dev/console", NULL, 0},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(more); i++)
        base[nb++] = (struct imgb_entry){more[i].type, strdup(more[i].path),
                                         more[i].data ? strdup(more[i].data) : NULL,
                                         more[i].mode};
    static const struct imgb_entry top[] = {
        {'d', "etc", NULL, 0},
        {'f', "etc/os-release", NULL, 0},
        {'f', ".wh.gone", NULL, 0},
        {'f', ".wh.rmme", NULL, 0},
        {'d', "opq", NULL, 0},
        {'f', "opq/.wh..wh..opq", NULL, 0},
        {'f', "opq/new", "new\n", 0},
    };
    char osr[128];
    snprintf(osr, sizeof(osr), "ID=%s\nNAME=\"sbx test image\"\n", osid);
    struct imgb_entry topv[SBX_ARRAY_LEN(top)];
    memcpy(topv, top, sizeof(top));
    topv[1].data = osr;
    char l0[256], l1[256], le[256], dir[256], d0[72], d1[72], de[72];
    snprintf(l0, sizeof(l0), "%s/%s-0.tar.gz", work, name);
    snprintf(l1, sizeof(l1), "%s/%s-1.tar.gz", work, name);
    cr_assert_eq(imgb_layer(l0, base, nb, true, d0), 0);
    cr_assert_eq(imgb_layer(l1, topv, SBX_ARRAY_LEN(topv), true, d1), 0);
    imgb_entries_free(base, nb);
    snprintf(le, sizeof(le), "%s/%s-e.tar.gz", work, name);
    cr_assert_eq(imgb_layer(le, NULL, 0, true, de), 0);
    char *layers[] = {l0, le, l1, le};
    const char *diffs[] = {d0, de, d1, de};
    char *plain[] = {l0, l1};
    const char *pdiffs[] = {d0, d1};
    snprintf(dir, sizeof(dir), "%s/%s", work, name);
    cr_assert_eq(imgb_layout(dir, empties ? layers : plain, empties ? diffs : pdiffs,
                             empties ? 4 : 2, true,
                             "\"Env\":[\"PATH=/usr/bin:/bin\",\"IMGVAR=from-image\"],"
                             "\"WorkingDir\":\"/srv/app\"",
                             digest),
                 0);
}

static void
build_image_as(const char *name, const char *osid, char digest[72])
{
    build_image_x(name, osid, false, digest);
}

static void
build_image(const char *name, char digest[72])
{
    build_image_as(name, "sbxtest", digest);
}

/* How many layers of the test daemon's store hold rel (with exactly the
 * content want, when not NULL). */
static int
store_file_count(const char *rel, const char *want)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/images/layers", getenv("SBX_TEST_DIR") ? getenv("SBX_TEST_DIR")
                                                                        : "/nonexistent");
    DIR *d = opendir(p);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char f[1024], buf[64] = {0};
        snprintf(f, sizeof(f), "%s/%s/%s", p, de->d_name, rel);
        FILE *fp = fopen(f, "r");
        if (!fp)
            continue;
        size_t got = fread(buf, 1, sizeof(buf) - 1, fp);
        fclose(fp);
        n += !want || (got == strlen(want) && !memcmp(buf, want, got));
    }
    closedir(d);
    return n;
}

static int
count_layers(void)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/images/layers", getenv("SBX_TEST_DIR") ? getenv("SBX_TEST_DIR")
                                                                        : "/nonexistent");
    DIR *d = opendir(p);
    if (!d)
        return -1;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

Test(images, sandbox_from_an_imported_image, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024];
    build_image("img", digest);
    sbx_client *c = test_client();
    /* Another test's image may share these very layers (the same build). */
    int layers0 = count_layers();

    snprintf(args, sizeof(args), "{\"path\":\"%s/img\",\"name\":\"sbxtest/img:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "image.import: %s %s", code, msg);
    cr_assert(strstr(res, digest), "the import answers the manifest's digest: %s", res);
    free(res);

    char *a = test_id("img-a"), *b = test_id("img-b");
    res = call(c, "create", a, "{\"image\":\"sbxtest/img:1\"}", code, msg);
    cr_assert(res, "create from the image: %s %s", code, msg);
    cr_expect(strstr(res, digest), "the status names the image's digest: %s", res);
    free(res);

    int ec = -1;
    char *out = sh(c, a, "cat /etc/os-release", &ec);
    cr_expect_eq(ec, 0);
    cr_expect(strstr(out, "ID=sbxtest") && strstr(out, "sbx test image"),
              "the image's os-release, from its top layer: %s", out);
    free(out);
    out = sh(c, a, "echo \"$IMGVAR\"", &ec);
    cr_expect_str_eq(out, "from-image\n", "the image's Env");
    free(out);
    out = sh(c, a, "test -c /dev/null && test ! -e /dev/console && readlink /dev/fd", &ec);
    cr_expect_str_eq(out, "/proc/self/fd\n", "the sandbox's own /dev: %s", out);
    free(out);
    out = sh(c, a, "pwd", &ec);
    cr_expect_str_eq(out, "/srv/app\n", "commands start in the image's WorkingDir: %s", out);
    free(out);
    /* /run and /dev/shm: one file system, the writable layer's tmpfs (one
     * superblock less each, issue 18), not the overlay: what is written
     * there never lands in the layer. */
    out = sh(c, a, "stat -c %d / /run /dev/shm", &ec);
    unsigned long long d_root = 0, d_run = 0, d_shm = 0;
    cr_expect_eq(sscanf(out, "%llu %llu %llu", &d_root, &d_run, &d_shm), 3, "%s", out);
    cr_expect(d_run == d_shm && d_run != d_root, "devices of /, /run, /dev/shm: %s", out);
    free(out);
    /* Whiteouts and the opaque directory of the second layer. */
    out = sh(c, a, "ls -A /gone /rmme 2>&1; echo rc=$?; ls -A /opq; cat /usr/share/base-file",
             &ec);
    cr_expect(strstr(out, "rc=1") || strstr(out, "rc=2"), "whited-out files are gone: %s", out);
    cr_expect(strstr(out, "new\n") && !strstr(out, "old"), "the opaque dir shows only new: %s",
              out);
    cr_expect(strstr(out, "base\n"), "the first layer's other files stay: %s", out);
    free(out);
    /* Owners: the image's root-owned files are the sandbox root's. */
    out = sh(c, a, "id -u; stat -c %u:%g /usr /usr/share/base-file /bin/busybox", &ec);
    cr_expect_str_eq(out, "0\n0:0\n0:0\n0:0\n", "uid 0 and root-owned image files: %s", out);
    free(out);
    /* /usr is writable, copy-on-write per sandbox. */
    out = sh(c, a,
             "echo mine > /usr/bin/mine && cat /usr/bin/mine && echo more >> "
             "/usr/share/base-file && cat /usr/share/base-file",
             &ec);
    cr_expect_eq(ec, 0);
    cr_expect_str_eq(out, "mine\nbase\nmore\n", "writes under /usr: %s", out);
    free(out);
    /* The store's copy is untouched (the write went to a's upper layer). */
    cr_expect_eq(store_file_count("usr/share/base-file", "base\n"), 1,
                 "the layer's file on the host is the image's");
    cr_expect_eq(store_file_count("usr/bin/mine", NULL), 0, "nothing new in the layers");
    res = call(c, "create", b, "{\"image\":\"sbxtest/img:1\"}", code, msg);
    cr_assert(res, "create b: %s %s", code, msg);
    free(res);
    out = sh(c, b, "test -e /usr/bin/mine && echo seen; cat /usr/share/base-file", &ec);
    cr_expect_str_eq(out, "base\n", "b sees the image, not a's writes: %s", out);
    free(out);
    /* A sandbox without an image still runs the host's /usr. */
    char *h = test_id("img-host");
    out = sh(c, h, "grep -c sbxtest /etc/os-release; test -e /usr/bin/mine || echo host", &ec);
    cr_expect_str_eq(out, "0\nhost\n", "a host-/usr sandbox is unchanged: %s", out);
    free(out);

    /* An unknown image. */
    char *u = test_id("img-unknown");
    res = call(c, "create", u, "{\"image\":\"no/such:image\"}", code, msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    free(res);
    res = call(c, "status", u, "{}", code, msg);
    cr_expect_null(res, "no sandbox was created for an unknown image");
    free(res);

    /* list, inspect, rm while in use. */
    res = call(c, "image.list", NULL, "{}", code, msg);
    cr_assert(res, "image.list: %s", msg);
    cr_expect(strstr(res, "sbxtest/img:1") && strstr(res, digest), "%s", res);
    free(res);
    res = call(c, "image.inspect", NULL, "{\"image\":\"sbxtest/img:1\"}", code, msg);
    cr_assert(res, "image.inspect: %s", msg);
    cr_expect(strstr(res, "/srv/app") && strstr(res, "IMGVAR=from-image"), "%s", res);
    free(res);
    res = call(c, "image.rm", NULL, "{\"image\":\"sbxtest/img:1\"}", code, msg);
    cr_assert(res, "image.rm: %s", msg);
    cr_expect(strstr(res, "\"removed\":0"), "in use by a and b: kept: %s", res);
    free(res);
    cr_expect_geq(count_layers(), 2, "both layers are kept while sandboxes use them");
    out = sh(c, a, "cat /etc/os-release", &ec);
    cr_expect(strstr(out, "ID=sbxtest"), "a still runs: %s", out);
    free(out);
    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, a, &destroyed, &err), 0);
    cr_expect_eq(sbx_destroy(c, b, &destroyed, &err), 0);
    cr_expect_eq(sbx_destroy(c, h, &destroyed, &err), 0);
    /* The next GC finds the image unused. */
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", digest);
    res = call(c, "image.rm", NULL, args, code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    cr_expect_eq(count_layers(), layers0, "no layer of this image is left");
    free(a);
    free(b);
    free(h);
    free(u);
    sbx_client_close(c);
}

Test(images, tampered_layer_refused_and_nothing_left, .timeout = 120)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024];
    build_image("bad", digest);
    /* One byte of the largest blob (the base layer) changed. */
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "f=$(ls -S %s/bad/blobs/sha256/* | head -1); printf 'Z' | dd of=$f bs=1 seek=4000 "
             "conv=notrunc status=none",
             work);
    cr_assert_eq(system(cmd), 0);
    sbx_client *c = test_client();
    int before = count_layers();
    snprintf(args, sizeof(args), "{\"path\":\"%s/bad\",\"name\":\"sbxtest/bad:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "IMAGE_INVALID", "%s", msg);
    cr_expect(strstr(msg, "tampered"), "%s", msg);
    cr_expect_eq(count_layers(), before, "nothing half-imported");
    res = call(c, "image.inspect", NULL, "{\"image\":\"sbxtest/bad:1\"}", code, msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND");
    res = call(c, "image.import", NULL, "{\"path\":\"/nonexistent/sbx-image\"}", code, msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    sbx_client_close(c);
}

Test(images, docker_archive_import_through_skopeo, .timeout = 240)
{
    if (access("/usr/bin/skopeo", X_OK) != 0)
        cr_skip_test("skopeo is not installed (tools/deps.sh)");
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024], cmd[1024];
    build_image("arch", digest);
    /* What `docker save` writes, made offline from the layout. */
    snprintf(cmd, sizeof(cmd),
             "skopeo copy --quiet oci:%s/arch docker-archive:%s/arch.tar:sbxtest/arch:1 "
             ">%s/skopeo.log 2>&1",
             work, work, work);
    cr_assert_eq(system(cmd), 0, "skopeo could not write a docker-archive");
    sbx_client *c = test_client();
    snprintf(args, sizeof(args), "{\"path\":\"%s/arch.tar\",\"name\":\"sbxtest/arch:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "import of a docker-archive: %s %s", code, msg);
    free(res);
    char *id = test_id("img-arch");
    res = call(c, "create", id, "{\"image\":\"sbxtest/arch:1\"}", code, msg);
    cr_assert(res, "create: %s %s", code, msg);
    free(res);
    int ec;
    char *out = sh(c, id, "cat /etc/os-release; ls /opq", &ec);
    cr_expect(strstr(out, "ID=sbxtest") && strstr(out, "new") && !strstr(out, "old"), "%s",
              out);
    free(out);
    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, id, &destroyed, &err), 0);
    res = call(c, "image.rm", NULL, "{\"image\":\"sbxtest/arch:1\"}", code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    free(id);
    sbx_client_close(c);
}

/* The record keeps the digest: after a restart of the deployment, and after
 * its name moved to another image, a sandbox still runs the image it was
 * created from. */
Test(images, a_sandbox_keeps_its_image_across_a_restart, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char d1[72], d2[72], code[64], msg[512], args[1024];
    build_image_as("one", "first", d1);
    build_image_as("two", "second", d2);
    static struct testd d;
    const char *const extra[] = {TESTD_SMALL, NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0);
    live = &d;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    snprintf(args, sizeof(args), "{\"path\":\"%s/one\",\"name\":\"sbxtest/k:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "import one: %s", msg);
    free(res);
    char *id = test_id("img-keep");
    res = call(c, "create", id, "{\"image\":\"sbxtest/k:1\"}", code, msg);
    cr_assert(res, "create: %s", msg);
    free(res);
    int ec;
    char *out = sh(c, id, "cat /etc/os-release | head -1", &ec);
    cr_expect_str_eq(out, "ID=first\n");
    free(out);
    /* The name moves to another image. */
    snprintf(args, sizeof(args), "{\"path\":\"%s/two\",\"name\":\"sbxtest/k:1\"}", work);
    res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "import two: %s", msg);
    free(res);
    sbx_client_close(c);
    cr_assert_eq(testd_restart(&d, 1, extra), 0);
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    out = sh(c, id, "cat /etc/os-release | head -1", &ec);
    cr_expect_str_eq(out, "ID=first\n", "a new container of the same image after the restart");
    free(out);
    res = call(c, "status", id, "{}", code, msg);
    cr_expect(res && strstr(res, d1), "status names the first image: %s", res ? res : msg);
    free(res);
    char *id2 = test_id("img-keep2");
    res = call(c, "create", id2, "{\"image\":\"sbxtest/k:1\"}", code, msg);
    cr_assert(res, "create: %s", msg);
    free(res);
    out = sh(c, id2, "cat /etc/os-release | head -1", &ec);
    cr_expect_str_eq(out, "ID=second\n", "the name now means the second image");
    free(out);
    free(id);
    free(id2);
    sbx_client_close(c);
    testd_stop(&d);
    live = NULL;
}

/* Docker images repeat their empty layer (ENV, WORKDIR …): the layer is
 * unpacked once, and the overlay gets it once. */
Test(images, an_image_that_repeats_a_layer, .timeout = 120)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024];
    build_image_x("rep", "repeated", true, digest);
    sbx_client *c = test_client();
    snprintf(args, sizeof(args), "{\"path\":\"%s/rep\",\"name\":\"sbxtest/rep:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "import: %s %s", code, msg);
    cr_expect(strstr(res, "\"layers\":4"), "four layers in the manifest: %s", res);
    free(res);
    char *id = test_id("img-rep");
    res = call(c, "create", id, "{\"image\":\"sbxtest/rep:1\"}", code, msg);
    cr_assert(res, "create: %s", msg);
    free(res);
    int ec;
    char *out = sh(c, id, "head -1 /etc/os-release; ls -A /opq", &ec);
    cr_expect_str_eq(out, "ID=repeated\nnew\n", "%s", out);
    free(out);
    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, id, &destroyed, &err), 0);
    res = call(c, "image.rm", NULL, "{\"image\":\"sbxtest/rep:1\"}", code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    free(id);
    sbx_client_close(c);
}

/* Pools per image (sbxd --image-pool N, docs/images.md): the first sandbox
 * of an image starts its own container and makes the image's pool, which
 * then holds a ready container of it; the next sandbox takes that one (a
 * pool hit) and runs the image. */
static int64_t
shard_stat(sbx_client *c, const char *key)
{
    char code[64], msg[512];
    char *res = call(c, "cluster.status", NULL, "{}", code, msg);
    int64_t v = -1;
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":", key);
    const char *p = res ? strstr(res, pat) : NULL;
    if (p)
        v = atoll(p + strlen(pat));
    free(res);
    return v;
}

Test(images, a_pool_per_image, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024];
    build_image_as("pool", "pooled", digest);
    static struct testd d;
    const char *const extra[] = {TESTD_SMALL, "--image-pool", "1", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0);
    live = &d;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    snprintf(args, sizeof(args), "{\"path\":\"%s/pool\",\"name\":\"sbxtest/pool:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "import: %s", msg);
    free(res);
    char *ids[3];
    int ec;
    for (int i = 0; i < 3; i++) {
        /* Wait for the image's pool to hold a ready container (after the first). */
        for (int k = 0; i > 0 && k < 200 && shard_stat(c, "imagePool") < 1; k++)
            usleep(50 * 1000);
        if (i > 0)
            cr_assert_geq(shard_stat(c, "imagePool"), 1, "the image's pool holds a container");
        int64_t hits = shard_stat(c, "poolHits");
        ids[i] = test_id("img-pool");
        res = call(c, "create", ids[i], "{\"image\":\"sbxtest/pool:1\"}", code, msg);
        cr_assert(res, "create: %s", msg);
        free(res);
        char *out = sh(c, ids[i], "head -1 /etc/os-release", &ec);
        cr_expect_str_eq(out, "ID=pooled\n", "sandbox %d runs the image", i);
        free(out);
        if (i > 0)
            cr_expect_eq(shard_stat(c, "poolHits"), hits + 1, "sandbox %d took a pooled container",
                         i);
    }
    /* A host-/usr sandbox never gets an image's container. */
    char *h = test_id("img-pool-host");
    char *out = sh(c, h, "grep -c pooled /etc/os-release", &ec);
    cr_expect_str_eq(out, "0\n");
    free(out);
    for (int i = 0; i < 3; i++)
        free(ids[i]);
    free(h);
    sbx_client_close(c);
    testd_stop(&d);
    live = NULL;
}

struct burst_create {
    const char *url;
    char id[80];
    bool ok;
};

static void *
burst_create(void *arg)
{
    struct burst_create *b = arg;
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, b->url, &err) != 0) {
        sbx_error_free(&err);
        return NULL;
    }
    char code[64], msg[512];
    char *res = call(c, "create", b->id, "{\"image\":\"sbxtest/burst:1\"}", code, msg);
    free(res);
    /* Its container starts with its first command. */
    sbx_exec_result r;
    if (res && test_sh(c, b->id, "true", 60000, &r, &err) == 0) {
        b->ok = r.exit_code == 0;
        sbx_exec_result_free(&r);
    } else if (res) {
        sbx_error_free(&err);
    }
    sbx_client_close(c);
    return NULL;
}

/* The pool per image adapts to the rate of creates (docs/images.md, "Pools
 * per image"): with --image-pool 1, after a burst of 8 concurrent creates
 * (each with its first command, which starts its container) of an image its
 * pool's target follows the burst (8 in its busiest second,
 * within the budget) and the pool fills towards it once the burst is over. */
Test(images, a_pool_per_image_grows_with_a_burst, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024];
    build_image_as("burst", "burst", digest);
    static struct testd d;
    const char *const extra[] = {TESTD_SMALL, "--image-pool", "1", NULL};
    cr_assert_eq(testd_start(&d, 1, extra), 0);
    live = &d;
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, d.url, &err), 0);
    snprintf(args, sizeof(args), "{\"path\":\"%s/burst\",\"name\":\"sbxtest/burst:1\"}", work);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "import: %s", msg);
    free(res);
    enum { N = 8 };
    struct burst_create b[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        b[i].url = d.url;
        b[i].ok = false;
        char *id = test_id("img-burst");
        snprintf(b[i].id, sizeof(b[i].id), "%s", id);
        free(id);
        cr_assert_eq(pthread_create(&th[i], NULL, burst_create, &b[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    int ok = 0;
    for (int i = 0; i < N; i++)
        ok += b[i].ok;
    cr_assert_eq(ok, N, "%d of %d concurrent creates (and first commands) of the image succeeded",
                 ok, N);
    int64_t target = shard_stat(c, "imagePoolTarget");
    cr_expect_gt(target, 1, "the pool's target did not grow past --image-pool 1 after a burst of "
                            "%d (target %lld)", N, (long long)target);
    /* It fills towards the target once the burst is over (30 s at most). */
    int64_t ready = 0;
    for (int k = 0; k < 300 && ready < 2; k++) {
        ready = shard_stat(c, "imagePool");
        if (ready < 2)
            usleep(100 * 1000);
    }
    cr_expect_geq(ready, 2, "the image's pool holds %lld ready containers after the burst (target "
                            "%lld)", (long long)ready, (long long)shard_stat(c, "imagePoolTarget"));
    sbx_client_close(c);
    testd_stop(&d);
    live = NULL;
}

/* Entries of the store's tmp/ (imports and builds in progress). */
static int
count_store_tmp(void)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/images/tmp", getenv("SBX_TEST_DIR") ? getenv("SBX_TEST_DIR")
                                                                     : "/nonexistent");
    DIR *d = opendir(p);
    if (!d)
        return 0;
    int n = 0;
    struct dirent *de;
    while ((de = readdir(d)))
        n += de->d_name[0] != '.';
    closedir(d);
    return n;
}

/* template.build (docs/images.md, "Templates"): the steps' writes, removals
 * and a replaced directory become a new top layer; a sandbox of the
 * template sees them, one of the base does not; a failing step fails the
 * build with its output and leaves no image, layer or temporary file. */
Test(images, a_template_bakes_its_steps_into_a_new_layer, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[2048], base[128], tpl[128], bad[128];
    build_image("tplbase", digest);
    snprintf(base, sizeof(base), "sbxtest/%s-tplbase:%d", test_prefix(), (int)getpid());
    snprintf(tpl, sizeof(tpl), "sbxtest/%s-tpl:%d", test_prefix(), (int)getpid());
    snprintf(bad, sizeof(bad), "sbxtest/%s-tplbad:%d", test_prefix(), (int)getpid());
    sbx_client *c = test_client();
    int layers0 = count_layers(), tmp0 = count_store_tmp();
    snprintf(args, sizeof(args), "{\"path\":\"%s/tplbase\",\"name\":\"%s\"}", work, base);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "image.import: %s %s", code, msg);
    free(res);
    int layers1 = count_layers();

    snprintf(args, sizeof(args),
             "{\"name\":\"%s\",\"from\":\"%s\",\"run\":["
             "\"echo baked > /usr/share/baked && rm /usr/share/base-file\","
             "\"rm -rf /opq && mkdir /opq && echo n2 > /opq/n2\","
             "\"echo \\\"$IMGVAR\\\" > /usr/share/env-at-build\"]}",
             tpl, base);
    res = call(c, "template.build", NULL, args, code, msg);
    cr_assert(res, "template.build: %s %s", code, msg);
    cr_expect(strstr(res, "\"digest\":\"sha256:") && strncmp(res + 11, digest, 71) != 0 &&
                  strstr(res, "\"layers\":3"),
              "a new image, not the base: %s", res);
    free(res);
    cr_expect_eq(count_layers(), layers1 + 1, "one new layer, the base's shared");
    cr_expect_eq(count_store_tmp(), tmp0, "the build left nothing in the store's tmp/");

    char *t = test_id("tpl-t"), *b = test_id("tpl-b");
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", tpl);
    res = call(c, "create", t, args, code, msg);
    cr_assert(res, "create from the template: %s %s", code, msg);
    free(res);
    int ec = -1;
    char *out = sh(c, t,
                   "cat /usr/share/baked /usr/share/env-at-build; test -e /usr/share/base-file "
                   "&& echo base-file-still-there; ls -A /opq; head -1 /etc/os-release; pwd",
                   &ec);
    cr_expect_str_eq(out, "baked\nfrom-image\nn2\nID=sbxtest\n/srv/app\n",
                     "the template's sandbox sees the steps' changes over the base: %s", out);
    free(out);
    out = sh(c, t, "stat -c %u /usr/share/baked; echo again > /usr/share/baked && cat "
                   "/usr/share/baked", &ec);
    cr_expect_str_eq(out, "0\nagain\n", "the baked file is root's and writable: %s", out);
    free(out);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", base);
    res = call(c, "create", b, args, code, msg);
    cr_assert(res, "create from the base: %s %s", code, msg);
    free(res);
    out = sh(c, b, "test -e /usr/share/baked && echo baked; cat /usr/share/base-file; ls -A /opq",
             &ec);
    cr_expect_str_eq(out, "base\nnew\n", "the base image is unchanged: %s", out);
    free(out);

    /* A failing step: its output in the error, nothing added. */
    int layers2 = count_layers();
    snprintf(args, sizeof(args),
             "{\"name\":\"%s\",\"from\":\"%s\",\"run\":[\"echo partial > /usr/share/partial\","
             "\"echo step-out; echo step-err >&2; exit 3\",\"echo never\"]}",
             bad, base);
    res = call(c, "template.build", NULL, args, code, msg);
    cr_expect_null(res, "a failing step fails the build");
    cr_expect_str_eq(code, "TEMPLATE_BUILD_FAILED", "%s", msg);
    cr_expect(strstr(msg, "step 2 of 3") && strstr(msg, "exited with 3") &&
                  strstr(msg, "step-out") && strstr(msg, "step-err"),
              "the error says which step and shows its output: %s", msg);
    free(res);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", bad);
    res = call(c, "image.inspect", NULL, args, code, msg);
    cr_expect_null(res, "no image of a failed build");
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    free(res);
    cr_expect_eq(count_layers(), layers2, "no layer of a failed build");
    cr_expect_eq(count_store_tmp(), tmp0, "no temporary file of a failed build");
    /* A bad name is refused before anything runs. */
    snprintf(args, sizeof(args), "{\"name\":\"bad name\",\"from\":\"%s\",\"run\":[\"true\"]}",
             base);
    res = call(c, "template.build", NULL, args, code, msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "VALIDATION_FAILED", "%s", msg);
    free(res);
    /* An unknown base. */
    res = call(c, "template.build", NULL,
               "{\"name\":\"sbxtest/x:1\",\"from\":\"no/such:image\",\"run\":[\"true\"]}", code,
               msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    free(res);

    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, t, &destroyed, &err), 0);
    cr_expect_eq(sbx_destroy(c, b, &destroyed, &err), 0);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", tpl);
    res = call(c, "image.rm", NULL, args, code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", base);
    res = call(c, "image.rm", NULL, args, code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    cr_expect_eq(count_layers(), layers0, "no layer of the base or the template is left");
    free(t);
    free(b);
    sbx_client_close(c);
}

/* An image whose config names a User (image-spec config.md): commands run
 * as that uid, with its primary group from the image's /etc/passwd; root's
 * files are not theirs to change; /workspace is theirs. */
Test(images, an_image_user_runs_the_commands, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024], name[128], l0[256], d0[72], dir[256];
    size_t nb = 0;
    struct imgb_entry *e = imgb_base_entries(&nb);
    cr_assert(e, "busybox-static is not installed (tools/deps.sh)");
    e = realloc(e, (nb + 4) * sizeof(*e));
    e[nb++] = (struct imgb_entry){'f', strdup("etc/passwd"),
                                  strdup("root:x:0:0:root:/root:/bin/sh\n"
                                         "app:x:1000:1001:app:/home/app:/bin/sh\n"),
                                  0};
    e[nb++] = (struct imgb_entry){'f', strdup("etc/group"), strdup("root:x:0:\napp:x:1001:\n"), 0};
    e[nb++] = (struct imgb_entry){'f', strdup("etc/root-only"), strdup("root\n"), 0644};
    snprintf(l0, sizeof(l0), "%s/user-0.tar.gz", work);
    cr_assert_eq(imgb_layer(l0, e, nb, true, d0), 0);
    imgb_entries_free(e, nb);
    char *layers[] = {l0};
    const char *diffs[] = {d0};
    snprintf(dir, sizeof(dir), "%s/user", work);
    cr_assert_eq(imgb_layout(dir, layers, diffs, 1, true, "\"User\":\"1000\"", digest), 0);

    sbx_client *c = test_client();
    snprintf(name, sizeof(name), "sbxtest/%s-user:%d", test_prefix(), (int)getpid());
    snprintf(args, sizeof(args), "{\"path\":\"%s\",\"name\":\"%s\"}", dir, name);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "image.import: %s %s", code, msg);
    free(res);
    char *id = test_id("img-user");
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    res = call(c, "create", id, args, code, msg);
    cr_assert(res, "create: %s %s", code, msg);
    free(res);
    int ec = -1;
    char *out = sh(c, id, "id -u; id -g; stat -c %u:%g /etc/root-only", &ec);
    cr_expect_str_eq(out, "1000\n1001\n0:0\n",
                     "the image's User (1000, primary group 1001 from its passwd): %s", out);
    free(out);
    out = sh(c, id, "echo x >> /etc/root-only; echo rc=$?; cat /etc/root-only", &ec);
    cr_expect(strstr(out, "rc=1") && strstr(out, "root\n") && !strstr(out, "x\n"),
              "a root-owned file is not the User's to write: %s", out);
    free(out);
    out = sh(c, id, "echo mine > /workspace/f && stat -c %u /workspace/f && cat /workspace/f",
             &ec);
    cr_expect_str_eq(out, "1000\nmine\n", "/workspace is the User's: %s", out);
    free(out);
    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, id, &destroyed, &err), 0);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    res = call(c, "image.rm", NULL, args, code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    free(id);
    sbx_client_close(c);
}

/* An image User's HOME comes from the image's /etc/passwd and its
 * supplementary groups from its /etc/group, each mapped into the sandbox
 * (docs/images.md, "User"): `id -G` lists them (setgroups would fail on an
 * unmapped one), $HOME is the passwd line's, a group that does not list
 * the user is not among them. */
Test(images, an_image_user_gets_its_home_and_groups, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024], name[128], l0[256], d0[72], dir[256];
    size_t nb = 0;
    struct imgb_entry *e = imgb_base_entries(&nb);
    cr_assert(e, "busybox-static is not installed (tools/deps.sh)");
    e = realloc(e, (nb + 5) * sizeof(*e));
    e[nb++] = (struct imgb_entry){'f', strdup("etc/passwd"),
                                  strdup("root:x:0:0:root:/root:/bin/sh\n"
                                         "app:x:1000:1001:app:/home/app:/bin/sh\n"),
                                  0};
    e[nb++] = (struct imgb_entry){'f', strdup("etc/group"),
                                  strdup("root:x:0:\napp:x:1001:\ndev:x:2000:app\n"
                                         "other:x:2002:someone\nops:x:2001:someone,app\n"),
                                  0};
    e[nb++] = (struct imgb_entry){'d', strdup("home"), NULL, 0};
    e[nb++] = (struct imgb_entry){'d', strdup("home/app"), NULL, 0};
    snprintf(l0, sizeof(l0), "%s/groups-0.tar.gz", work);
    cr_assert_eq(imgb_layer(l0, e, nb, true, d0), 0);
    imgb_entries_free(e, nb);
    char *layers[] = {l0};
    const char *diffs[] = {d0};
    snprintf(dir, sizeof(dir), "%s/groups", work);
    cr_assert_eq(imgb_layout(dir, layers, diffs, 1, true, "\"User\":\"app\"", digest), 0);

    sbx_client *c = test_client();
    snprintf(name, sizeof(name), "sbxtest/%s-groups:%d", test_prefix(), (int)getpid());
    snprintf(args, sizeof(args), "{\"path\":\"%s\",\"name\":\"%s\"}", dir, name);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "image.import: %s %s", code, msg);
    free(res);
    char *id = test_id("img-groups");
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    res = call(c, "create", id, args, code, msg);
    cr_assert(res, "create: %s %s", code, msg);
    free(res);
    int ec = -1;
    char *out = sh(c, id, "id -u; id -g; id -G; echo $HOME", &ec);
    cr_expect_str_eq(out, "1000\n1001\n1001 2000 2001\n/home/app\n",
                     "the User app: uid 1000, gid 1001, groups dev (2000) and ops (2001) of "
                     "its /etc/group, HOME /home/app of its /etc/passwd: %s",
                     out);
    free(out);
    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, id, &destroyed, &err), 0);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    res = call(c, "image.rm", NULL, args, code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    free(id);
    sbx_client_close(c);
}

/* Entrypoint + Cmd as an optional start command, and ExposedPorts as hints
 * in status (docs/images.md, "Start command and ports"). */
Test(images, start_command_and_port_hints, .timeout = 240)
{
    snprintf(work, sizeof(work), "/tmp/sbx-img-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work));
    chmod(work, 0755);
    char digest[72], code[64], msg[512], args[1024], name[128], l0[256], d0[72], dir[256];
    size_t nb = 0;
    struct imgb_entry *e = imgb_base_entries(&nb);
    cr_assert(e, "busybox-static is not installed (tools/deps.sh)");
    snprintf(l0, sizeof(l0), "%s/start-0.tar.gz", work);
    cr_assert_eq(imgb_layer(l0, e, nb, true, d0), 0);
    imgb_entries_free(e, nb);
    char *layers[] = {l0};
    const char *diffs[] = {d0};
    snprintf(dir, sizeof(dir), "%s/start", work);
    cr_assert_eq(imgb_layout(dir, layers, diffs, 1, true,
                             "\"Entrypoint\":[\"/bin/sh\",\"-c\"],"
                             "\"Cmd\":[\"echo started-$0 > /tmp/started; exec sleep 600\"],"
                             "\"ExposedPorts\":{\"8080/tcp\":{}}",
                             digest),
                 0);
    sbx_client *c = test_client();
    snprintf(name, sizeof(name), "sbxtest/%s-start:%d", test_prefix(), (int)getpid());
    snprintf(args, sizeof(args), "{\"path\":\"%s\",\"name\":\"%s\"}", dir, name);
    char *res = call(c, "image.import", NULL, args, code, msg);
    cr_assert(res, "image.import: %s %s", code, msg);
    free(res);

    char *s = test_id("img-start"), *n = test_id("img-nostart");
    snprintf(args, sizeof(args), "{\"image\":\"%s\",\"start\":true}", name);
    res = call(c, "create", s, args, code, msg);
    cr_assert(res, "create with start: %s %s", code, msg);
    cr_expect(strstr(res, "\"imagePorts\":[\"8080/tcp\"]"), "the image's ports as hints: %s", res);
    cr_expect(strstr(res, "\"startCommand\":[\"/bin/sh\",\"-c\",\"echo started-$0"),
              "the start command: %s", res);
    free(res);
    int ec = -1;
    /* The process starts with the container (the create started it). */
    char *out = NULL;
    for (int i = 0; i < 100; i++) {
        free(out);
        out = sh(c, s, "cat /tmp/started 2>/dev/null", &ec);
        if (out[0])
            break;
        usleep(50000);
    }
    cr_expect_str_eq(out, "started-/bin/sh\n", "Entrypoint + Cmd ran: %s", out);
    free(out);
    res = call(c, "process.get", s, "{\"processId\":\"image-start\"}", code, msg);
    cr_expect(res && strstr(res, "\"running\""), "it runs as the process image-start: %s %s",
              res ? res : code, msg);
    free(res);

    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    res = call(c, "create", n, args, code, msg);
    cr_assert(res, "create without start: %s %s", code, msg);
    cr_expect(strstr(res, "\"imagePorts\":[\"8080/tcp\"]") && !strstr(res, "startCommand"),
              "ports as hints, no start command: %s", res);
    free(res);
    out = sh(c, n, "test -e /tmp/started && echo started; echo done", &ec);
    cr_expect_str_eq(out, "done\n", "nothing is started without 'start': %s", out);
    free(out);
    char *bad = test_id("img-badstart");
    res = call(c, "create", bad, "{\"start\":true}", code, msg);
    cr_expect_null(res);
    cr_expect_str_eq(code, "VALIDATION_FAILED", "start without an image: %s", msg);
    free(res);
    free(bad);

    bool destroyed;
    sbx_error err;
    cr_expect_eq(sbx_destroy(c, s, &destroyed, &err), 0);
    cr_expect_eq(sbx_destroy(c, n, &destroyed, &err), 0);
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", name);
    res = call(c, "image.rm", NULL, args, code, msg);
    cr_expect(res && strstr(res, "\"removed\":1"), "%s %s", res ? res : code, msg);
    free(res);
    free(s);
    free(n);
    sbx_client_close(c);
}
