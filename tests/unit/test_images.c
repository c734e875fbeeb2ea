/*
 * test_images.c — unit tests for the image store and the layer unpacker
 * (container/image_store.h, container/image_unpack.c), on layouts built in
 * the test (tests/support/imgbuild.h): no registry, no container.
 *
 * Covers: an import of a two-layer layout (gzip) whose layers land in
 * layers/<diff_id> with the second layer's whiteout as a 0/0 character
 * device and its opaque directory marked user.overlay.opaque=y; names,
 * list, inspect (config Env/WorkingDir/User); a layer shared by two images
 * unpacked once; a tampered layer refused by digest (IMAGE_INVALID) leaving
 * nothing in the store; malicious tars (`../../x`, an absolute path, a file
 * written through an absolute symlink, a hard link out of the layer)
 * refused without a byte written outside the layer; a device node left
 * out; an image without /bin/sh refused; unknown names IMAGE_NOT_FOUND; rm
 * and GC, a layer kept while another image or a running user (the use
 * lock) still needs it; a pull from a registry that does not answer; two
 * imports of one image at once through two store handles; an overlay upper
 * dir written as a layer (image_layer.c) and unpacked back unchanged
 * (whiteout, opaque directory, a symlink not followed, owners mapped); an
 * image's User resolved against its passwd and group (image_user.c).
 *
 * Every test works in its own mkdtemp directory under /tmp, removed by the
 * fixture's fini even when an assertion fails.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "container/image_store.h"
#include "runtime/err.h"
#include "runtime/util.h"
#include "tests/support/imgbuild.h"

static char tmpdir[64];
static char storedir[128];
static sbx_image_store *st;

static void
setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sbx-test-images-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    snprintf(storedir, sizeof(storedir), "%s/store", tmpdir);
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_image_store_open(storedir, &st, &err), 0, "%s", sbx_err_msg(err));
}

static void
teardown(void)
{
    sbx_image_store_close(st);
    st = NULL;
    sbx_rm_rf(tmpdir);
}

TestSuite(images, .init = setup, .fini = teardown);

static const struct imgb_entry base_min[] = {
    {'d', "bin", NULL, 0},
    {'f', "bin/sh", "#!fake shell\n", 0755},
    {'d', "etc", NULL, 0},
    {'f', "etc/os-release", "ID=base\n", 0},
    {'d', "gone", NULL, 0},
    {'f', "gone/f", "x", 0},
    {'f', "rmme", "y", 0},
    {'d', "opq", NULL, 0},
    {'f', "opq/old", "old", 0},
    {'d', "usr", NULL, 0},
    {'f', "usr/suid", "s", 04755},
};

/* A layout of the given layers (each an entry list) at tmpdir/<name>. */
static void
make_layout(const char *name, const struct imgb_entry *const *layers, const size_t *counts, int n,
            bool gz, const char *extra, char digest[72], char diffs[][72])
{
    char *paths[8];
    const char *dids[8];
    for (int i = 0; i < n; i++) {
        paths[i] = malloc(256);
        snprintf(paths[i], 256, "%s/%s-layer%d.tar", tmpdir, name, i);
        cr_assert_eq(imgb_layer(paths[i], layers[i], counts[i], gz, diffs[i]), 0);
        dids[i] = diffs[i];
    }
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    cr_assert_eq(imgb_layout(dir, paths, dids, n, gz, extra, digest), 0);
    for (int i = 0; i < n; i++)
        free(paths[i]);
}

static int
import(const char *name, const char *as, char digest[72], sbx_err_t *err)
{
    char dir[256];
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    return sbx_image_import(st, dir, as, digest, err);
}

static int
count_dir(const char *sub)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "ls -A '%s/%s' | grep -v '^lock$' | wc -l", storedir, sub);
    FILE *p = popen(cmd, "r");
    int n = -1;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

Test(images, two_layers_with_whiteout_and_opaque_dir)
{
    static const struct imgb_entry top[] = {
        {'d', "etc", NULL, 0},
        {'f', "etc/os-release", "ID=sbxtest\n", 0},
        {'f', ".wh.gone", NULL, 0},
        {'f', ".wh.rmme", NULL, 0},
        {'d', "opq", NULL, 0},
        {'f', "opq/.wh..wh..opq", NULL, 0},
        {'f', "opq/new", "new", 0},
    };
    const struct imgb_entry *layers[] = {base_min, top};
    size_t counts[] = {SBX_ARRAY_LEN(base_min), SBX_ARRAY_LEN(top)};
    char digest[72], diffs[2][72], got[SBX_IMAGE_DIGEST_LEN];
    make_layout("two", layers, counts, 2, true,
                "\"Env\":[\"PATH=/bin\",\"IMG=1\"],\"WorkingDir\":\"/srv\",\"User\":\"0\"", digest,
                diffs);
    sbx_err_t err = NULL;
    cr_assert_eq(import("two", "test/two:1", got, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_str_eq(got, digest);

    char p[512];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/layers/%s/gone", storedir, diffs[1] + 7);
    cr_assert_eq(lstat(p, &sb), 0, "the whiteout of 'gone' is in the top layer");
    cr_assert(S_ISCHR(sb.st_mode) && sb.st_rdev == makedev(0, 0), "a 0/0 character device");
    snprintf(p, sizeof(p), "%s/layers/%s/.wh.gone", storedir, diffs[1] + 7);
    cr_assert_neq(lstat(p, &sb), 0, "no .wh. file is left as such");
    char v[8] = {0};
    snprintf(p, sizeof(p), "%s/layers/%s/opq", storedir, diffs[1] + 7);
    cr_assert_eq(getxattr(p, "user.overlay.opaque", v, sizeof(v)), 1);
    cr_assert_eq(v[0], 'y');
    snprintf(p, sizeof(p), "%s/layers/%s/usr/suid", storedir, diffs[0] + 7);
    cr_assert_eq(stat(p, &sb), 0);
    cr_assert_eq(sb.st_mode & 07777, 04755, "set-uid bits kept (docs/images.md)");

    char d2[SBX_IMAGE_DIGEST_LEN];
    cr_assert_eq(sbx_image_resolve(st, "test/two:1", d2, &err), 0);
    cr_assert_str_eq(d2, digest);
    cr_assert_eq(sbx_image_resolve(st, digest + 7 + 0, d2, NULL), SBX_E_IMAGE_NOT_FOUND,
                 "a full hex without sha256: is not a prefix form (64 digits)");
    char prefix[20];
    snprintf(prefix, sizeof(prefix), "%.12s", digest + 7);
    cr_assert_eq(sbx_image_resolve(st, prefix, d2, &err), 0, "a 12-digit prefix");
    cr_assert_str_eq(d2, digest);

    json_t *j = NULL;
    cr_assert_eq(sbx_image_inspect(st, "test/two:1", &j, &err), 0);
    json_t *cfg = json_object_get(j, "config");
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "workingDir")), "/srv");
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(cfg, "env"), 1)), "IMG=1");
    cr_assert_eq(json_array_size(json_object_get(j, "diffIds")), 2);
    json_decref(j);
    cr_assert_eq(sbx_image_list(st, &j, &err), 0);
    cr_assert_eq(json_array_size(j), 1);
    cr_assert_str_eq(json_string_value(json_array_get(json_object_get(json_array_get(j, 0),
                                                                      "names"), 0)),
                     "test/two:1");
    json_decref(j);
    sbx_err_release(&err);
}

Test(images, shared_layer_unpacked_once_and_gc)
{
    static const struct imgb_entry top_a[] = {{'f', "a", "a", 0}};
    static const struct imgb_entry top_b[] = {{'f', "b", "b", 0}};
    const struct imgb_entry *la[] = {base_min, top_a}, *lb[] = {base_min, top_b};
    size_t counts[] = {SBX_ARRAY_LEN(base_min), 1};
    char da[72], db[72], diffa[2][72], diffb[2][72], got[SBX_IMAGE_DIGEST_LEN];
    make_layout("a", la, counts, 2, false, NULL, da, diffa);
    make_layout("b", lb, counts, 2, true, NULL, db, diffb);
    cr_assert_str_eq(diffa[0], diffb[0], "the same base layer");
    sbx_err_t err = NULL;
    cr_assert_eq(import("a", "a:1", got, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_eq(import("b", "b:1", got, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_eq(count_dir("layers"), 3, "base once, and each top layer");

    /* A running sandbox of b holds its use lock: rm takes the name, not b. */
    char dbs[SBX_IMAGE_DIGEST_LEN];
    cr_assert_eq(sbx_image_resolve(st, "b:1", dbs, &err), 0);
    struct sbx_image_root root;
    cr_assert_eq(sbx_image_open_root(st, dbs, &root, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_eq(root.nlayers, 2);
    int removed = -1;
    cr_assert_eq(sbx_image_rm(st, "b:1", &removed, &err), 0);
    cr_assert_eq(removed, 0, "in use: kept");
    cr_assert_eq(sbx_image_resolve(st, "b:1", got, NULL), SBX_E_IMAGE_NOT_FOUND);
    cr_assert_eq(count_dir("layers"), 3);
    sbx_image_root_free(&root);
    /* The next GC (an rm of a) removes both; the shared layer goes last. */
    cr_assert_eq(sbx_image_rm(st, "a:1", &removed, &err), 0);
    cr_assert_eq(removed, 2);
    cr_assert_eq(count_dir("layers"), 0);
    cr_assert_eq(count_dir("images"), 0);
    cr_assert_eq(sbx_image_rm(st, "a:1", &removed, &err), SBX_E_IMAGE_NOT_FOUND);
    sbx_err_release(&err);
}

Test(images, tampered_layer_refused_and_nothing_left)
{
    const struct imgb_entry *layers[] = {base_min};
    size_t counts[] = {SBX_ARRAY_LEN(base_min)};
    char digest[72], diffs[1][72], got[SBX_IMAGE_DIGEST_LEN];
    make_layout("t", layers, counts, 1, false, NULL, digest, diffs);
    /* Flip a byte of the layer blob (its name is its digest: find it by size). */
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "f=$(ls -S %s/t/blobs/sha256/* | head -1); printf 'Z' | dd of=$f bs=1 seek=600 "
             "conv=notrunc status=none",
             tmpdir);
    cr_assert_eq(system(cmd), 0);
    sbx_err_t err = NULL;
    cr_assert_eq(import("t", "t:1", got, &err), SBX_E_IMAGE_INVALID);
    cr_assert(strstr(sbx_err_msg(err), "tampered"), "%s", sbx_err_msg(err));
    cr_assert_eq(count_dir("layers"), 0);
    cr_assert_eq(count_dir("images"), 0);
    cr_assert_eq(count_dir("tmp"), 0);
    cr_assert_eq(sbx_image_resolve(st, "t:1", got, NULL), SBX_E_IMAGE_NOT_FOUND);
    sbx_err_release(&err);
}

/* Each malicious layer is refused and writes nothing outside the store's
 * tmp/ (which is emptied). */
Test(images, malicious_tars_change_nothing_outside)
{
    char victim[256], target[300];
    snprintf(victim, sizeof(victim), "%s/victim", tmpdir);
    cr_assert_eq(mkdir(victim, 0755), 0);
    snprintf(target, sizeof(target), "%s/x", victim);
    /* Paths relative to a layer dir (store/tmp/layer-XXXXXX): ../../../x is tmpdir/x. */
    char dotdot[64] = "../../../victim/x";
    const struct imgb_entry evil1[] = {{'d', "bin", NULL, 0}, {'f', "bin/sh", "s", 0755},
                                       {'f', dotdot, "pwned", 0}};
    const struct imgb_entry evil2[] = {{'d', "bin", NULL, 0}, {'f', "bin/sh", "s", 0755},
                                       {'l', "esc", victim, 0}, {'f', "esc/x", "pwned", 0}};
    char abs[300];
    snprintf(abs, sizeof(abs), "%s/x", victim);
    const struct imgb_entry evil3[] = {{'d', "bin", NULL, 0}, {'f', "bin/sh", "s", 0755},
                                       {'f', abs, "pwned", 0}};
    const struct imgb_entry evil4[] = {{'d', "bin", NULL, 0}, {'f', "bin/sh", "s", 0755},
                                       {'l', "up", "../../..", 0}, {'f', "up/victim/x", "p", 0}};
    const struct imgb_entry evil5[] = {{'d', "bin", NULL, 0}, {'f', "bin/sh", "s", 0755},
                                       {'h', "hl", abs, 0}};
    const struct imgb_entry *all[] = {evil1, evil2, evil3, evil4, evil5};
    size_t counts[] = {3, 4, 3, 4, 3};
    for (int i = 0; i < 5; i++) {
        char name[16], digest[72], diffs[1][72], got[SBX_IMAGE_DIGEST_LEN];
        snprintf(name, sizeof(name), "evil%d", i + 1);
        const struct imgb_entry *l[] = {all[i]};
        make_layout(name, l, &counts[i], 1, false, NULL, digest, diffs);
        sbx_err_t err = NULL;
        int rc = import(name, NULL, got, &err);
        cr_assert_eq(rc, SBX_E_IMAGE_INVALID, "%s: %d %s", name, rc, sbx_err_msg(err));
        struct stat sb;
        cr_assert_neq(stat(target, &sb), 0, "%s wrote outside its layer", name);
        cr_assert_eq(count_dir("layers"), 0);
        cr_assert_eq(count_dir("tmp"), 0);
        sbx_err_release(&err);
    }
}

Test(images, device_nodes_left_out_and_no_shell_refused)
{
    static const struct imgb_entry dev[] = {{'d', "bin", NULL, 0}, {'f', "bin/sh", "s", 0755},
                                            {'d', "dev", NULL, 0}, {'c', "dev/mem", NULL, 0}};
    const struct imgb_entry *l[] = {dev};
    size_t c = 4;
    char digest[72], diffs[1][72], got[SBX_IMAGE_DIGEST_LEN];
    make_layout("dev", l, &c, 1, false, NULL, digest, diffs);
    sbx_err_t err = NULL;
    cr_assert_eq(import("dev", "dev:1", got, &err), 0, "%s", sbx_err_msg(err));
    char p[512];
    struct stat sb;
    snprintf(p, sizeof(p), "%s/layers/%s/dev/mem", storedir, diffs[0] + 7);
    cr_assert_neq(lstat(p, &sb), 0, "the device node is not created");

    static const struct imgb_entry nosh[] = {{'d', "etc", NULL, 0}, {'f', "etc/a", "a", 0}};
    const struct imgb_entry *l2[] = {nosh};
    size_t c2 = 2;
    make_layout("nosh", l2, &c2, 1, false, NULL, digest, diffs);
    cr_assert_eq(import("nosh", "nosh:1", got, &err), SBX_E_IMAGE_INVALID);
    cr_assert(strstr(sbx_err_msg(err), "/bin/sh"), "%s", sbx_err_msg(err));
    cr_assert_eq(count_dir("layers"), 1, "only dev:1's layer");
    cr_assert_eq(sbx_image_resolve(st, "nope:1", got, &err), SBX_E_IMAGE_NOT_FOUND);
    char missing[256];
    snprintf(missing, sizeof(missing), "%s/missing", tmpdir);
    cr_assert_eq(sbx_image_import(st, missing, NULL, got, &err), SBX_E_IMAGE_NOT_FOUND);
    cr_assert_eq(sbx_image_import(st, "relative", NULL, got, &err), SBX_E_VALIDATION);
    cr_assert_eq(sbx_image_import(st, "/", "bad name!", got, &err), SBX_E_VALIDATION);
    sbx_err_release(&err);
}

/* A pull goes through skopeo; a registry that does not answer (nothing
 * listens on 127.0.0.1:1) is IMAGE_NOT_FOUND with skopeo's reason, and leaves
 * nothing behind. */
Test(images, pull_from_an_unreachable_registry)
{
    if (access("/usr/bin/skopeo", X_OK) != 0)
        cr_skip_test("skopeo is not installed (tools/deps.sh)");
    char got[SBX_IMAGE_DIGEST_LEN];
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_image_pull(st, "127.0.0.1:1/none:1", NULL, 0, 0, NULL, got, &err), SBX_E_IMAGE_NOT_FOUND,
                 "%s", sbx_err_msg(err));
    cr_assert(strstr(sbx_err_msg(err), "skopeo") && strstr(sbx_err_msg(err), "127.0.0.1:1"), "%s",
              sbx_err_msg(err));
    cr_assert_eq(count_dir("tmp"), 0);
    cr_assert_eq(sbx_image_pull(st, "--help", NULL, 0, 0, NULL, got, &err), SBX_E_VALIDATION,
                 "an option is not a reference");
    sbx_err_release(&err);
}

/* A registry that accepts and then never answers (a listener on loopback
 * that reads nothing: a stalled registry, CDN or proxy).  skopeo has no read
 * timeout of its own; the pull's deadline stops it (REQUEST_TIMEOUT within
 * the deadline, not skopeo's own ~10 s or ever), a second pull of the same
 * reference waiting for the first gives up at its own deadline, and a
 * cancelled pull (the shard stopping) ends at once — nothing left in tmp/. */
struct stalled_pull {
    char ref[64];
    int64_t deadline;
    _Atomic bool cancel;
    int rc;
    double took_ms;
};

static void *
stalled_pull_thread(void *arg)
{
    struct stalled_pull *p = arg;
    char got[SBX_IMAGE_DIGEST_LEN];
    sbx_err_t err = NULL;
    int64_t t0 = sbx_mono_ms();
    p->rc = sbx_image_pull(st, p->ref, NULL, 0, p->deadline, &p->cancel, got, &err);
    p->took_ms = (double)(sbx_mono_ms() - t0);
    sbx_err_release(&err);
    return NULL;
}

Test(images, a_stalled_registry_is_given_up_at_the_deadline, .timeout = 60)
{
    if (access("/usr/bin/skopeo", X_OK) != 0)
        cr_skip_test("skopeo is not installed (tools/deps.sh)");
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t al = sizeof(a);
    cr_assert_eq(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(ls, 64), 0); /* the kernel accepts; nobody ever reads or answers */
    cr_assert_eq(getsockname(ls, (struct sockaddr *)&a, &al), 0);
    char ref[64], got[SBX_IMAGE_DIGEST_LEN];
    snprintf(ref, sizeof(ref), "127.0.0.1:%d/stalled:1", ntohs(a.sin_port));

    sbx_err_t err = NULL;
    int64_t t0 = sbx_mono_ms();
    int rc = sbx_image_pull(st, ref, NULL, 0, t0 + 1500, NULL, got, &err);
    double took = (double)(sbx_mono_ms() - t0);
    cr_expect_eq(rc, SBX_E_TIMEOUT, "%d: %s", rc, sbx_err_msg(err));
    cr_expect(took >= 1400 && took < 4000, "the pull ended after %.0f ms, its deadline 1500",
              took);

    /* One pull of the reference at a time: a second one waits for the first,
     * until its own deadline; the first ends when cancelled. */
    struct stalled_pull first = {.deadline = sbx_mono_ms() + 30000};
    snprintf(first.ref, sizeof(first.ref), "%s", ref);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, stalled_pull_thread, &first), 0);
    usleep(500 * 1000); /* the first holds the reference's pull lock by now */
    t0 = sbx_mono_ms();
    rc = sbx_image_pull(st, ref, NULL, 0, t0 + 1000, NULL, got, &err);
    took = (double)(sbx_mono_ms() - t0);
    cr_expect_eq(rc, SBX_E_TIMEOUT, "%d: %s", rc, sbx_err_msg(err));
    cr_expect(strstr(sbx_err_msg(err), "another pull"), "%s", sbx_err_msg(err));
    cr_expect(took >= 900 && took < 3000, "the waiting pull ended after %.0f ms", took);
    atomic_store(&first.cancel, true);
    pthread_join(th, NULL);
    cr_expect_eq(first.rc, SBX_E_SHARD_UNAVAILABLE, "the cancelled pull: %d", first.rc);
    cr_expect_lt(first.took_ms, 5000, "the cancelled pull ended after %.0f ms", first.took_ms);
    close(ls);
    cr_assert_eq(count_dir("tmp"), 0);
    sbx_err_release(&err);
}

/* Two shards of a node share the store: imports of the same image at once
 * (two store handles, as two processes have, each on its own thread) both
 * succeed, serialised by the store's flock, and leave one copy of each
 * layer and nothing in tmp/. */
struct imp_arg {
    sbx_image_store *st;
    const char *path, *name;
    int rc;
    char digest[SBX_IMAGE_DIGEST_LEN];
};

static void *
imp_thread(void *p)
{
    struct imp_arg *a = p;
    a->rc = sbx_image_import(a->st, a->path, a->name, a->digest, NULL);
    return NULL;
}

Test(images, concurrent_imports_of_one_image)
{
    static const struct imgb_entry top[] = {{'f', "x", "x", 0}};
    const struct imgb_entry *l[] = {base_min, top};
    size_t counts[] = {SBX_ARRAY_LEN(base_min), 1};
    char digest[72], diffs[2][72], path[256];
    make_layout("conc", l, counts, 2, true, NULL, digest, diffs);
    snprintf(path, sizeof(path), "%s/conc", tmpdir);
    sbx_image_store *st2 = NULL;
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_image_store_open(storedir, &st2, &err), 0);
    struct imp_arg a = {st, path, "conc:a", -1, ""}, b = {st2, path, "conc:b", -1, ""};
    pthread_t ta, tb;
    pthread_create(&ta, NULL, imp_thread, &a);
    pthread_create(&tb, NULL, imp_thread, &b);
    pthread_join(ta, NULL);
    pthread_join(tb, NULL);
    sbx_image_store_close(st2);
    cr_assert_eq(a.rc, 0);
    cr_assert_eq(b.rc, 0);
    cr_assert_str_eq(a.digest, digest);
    cr_assert_str_eq(b.digest, digest);
    cr_assert_eq(count_dir("layers"), 2);
    cr_assert_eq(count_dir("images"), 1);
    cr_assert_eq(count_dir("tmp"), 0);
    char got[SBX_IMAGE_DIGEST_LEN];
    cr_assert_eq(sbx_image_resolve(st, "conc:a", got, &err), 0);
    cr_assert_eq(sbx_image_resolve(st, "conc:b", got, &err), 0);
    sbx_err_release(&err);
}

/* A new file at path holding s. */
static int
put_file(const char *path, const char *s)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return -1;
    fputs(s, f);
    return fclose(f);
}

/* image_layer.c: an upper dir with an overlay whiteout, an opaque directory
 * and a symlink, written as a layer and unpacked again with the import's
 * rules, comes back the same: the whiteout a 0/0 character device, the
 * opaque directory marked, the link not followed; owners of the sandbox's
 * host ids become the ids inside. */
Test(images, upper_dir_written_as_a_layer_round_trips)
{
    char up[128], out[128], blob[160], p[256];
    snprintf(up, sizeof(up), "%s/upper", tmpdir);
    snprintf(out, sizeof(out), "%s/out", tmpdir);
    snprintf(blob, sizeof(blob), "%s/layer.tar.gz", tmpdir);
    cr_assert_eq(mkdir(up, 0755), 0);
    cr_assert_eq(mkdir(out, 0755), 0);
    snprintf(p, sizeof(p), "%s/usr", up);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/usr/new", up);
    cr_assert_eq(put_file(p, "new\n"), 0);
    cr_assert_eq(chown(p, 4000000, 4000000), 0);
    snprintf(p, sizeof(p), "%s/usr/mine", up);
    cr_assert_eq(put_file(p, "mine\n"), 0);
    cr_assert_eq(chown(p, 4000001, 4000001), 0);
    snprintf(p, sizeof(p), "%s/gone", up);
    cr_assert_eq(mknod(p, S_IFCHR | 0000, makedev(0, 0)), 0, "mknod: %s", strerror(errno));
    snprintf(p, sizeof(p), "%s/opq", up);
    cr_assert_eq(mkdir(p, 0755), 0);
    cr_assert_eq(setxattr(p, "user.overlay.opaque", "y", 1, 0), 0, "%s", strerror(errno));
    snprintf(p, sizeof(p), "%s/opq/n2", up);
    cr_assert_eq(put_file(p, "n2\n"), 0);
    snprintf(p, sizeof(p), "%s/escape", up);
    cr_assert_eq(symlink("/etc", p), 0);

    int dfd = open(up, O_RDONLY | O_DIRECTORY);
    cr_assert_geq(dfd, 0);
    struct sbx_layer_ids ids = {.host_root = 4000000, .host_user = 4000001, .user_uid = 1000,
                                .user_gid = 1001};
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_image_layer_write(dfd, &ids, blob, &err), 0, "%s", sbx_err_msg(err));
    close(dfd);
    /* The tar has the OCI forms. */
    char cmd[512], list[2048] = {0};
    snprintf(cmd, sizeof(cmd), "tar -tvzf '%s' --numeric-owner | awk '{print $2, $6}' | sort",
             blob);
    FILE *f = popen(cmd, "r");
    size_t got = fread(list, 1, sizeof(list) - 1, f);
    pclose(f);
    cr_assert_gt(got, 0);
    cr_expect(strstr(list, "0/0 .wh.gone\n"), "the whiteout as .wh.gone: %s", list);
    cr_expect(strstr(list, "0/0 opq/.wh..wh..opq\n"), "the opaque marker: %s", list);
    cr_expect(strstr(list, "0/0 usr/new\n"), "the sandbox root's file as 0:0: %s", list);
    cr_expect(strstr(list, "1000/1001 usr/mine\n"), "the User's file as its ids: %s", list);
    cr_expect(strstr(list, " escape\n"), "the link itself: %s", list);
    cr_expect(!strstr(list, "escape/"), "the link is not followed: %s", list);

    int ofd = open(out, O_PATH | O_DIRECTORY);
    int skipped = 0;
    cr_assert_eq(sbx_image_unpack(blob, ofd, &skipped, &err), 0, "%s", sbx_err_msg(err));
    close(ofd);
    struct stat sb;
    snprintf(p, sizeof(p), "%s/gone", out);
    cr_expect(lstat(p, &sb) == 0 && S_ISCHR(sb.st_mode) && sb.st_rdev == makedev(0, 0),
              "the whiteout comes back as a 0/0 character device");
    char v[4] = {0};
    snprintf(p, sizeof(p), "%s/opq", out);
    cr_expect_eq(getxattr(p, "user.overlay.opaque", v, sizeof(v)), 1);
    cr_expect_eq(v[0], 'y', "the opaque directory comes back marked");
    snprintf(p, sizeof(p), "%s/usr/new", out);
    cr_expect(lstat(p, &sb) == 0 && sb.st_uid == 0 && sb.st_size == 4);
    sbx_err_release(&err);
}

/* image_user.c: the config's User against the image's passwd and group. */
Test(images, image_user_resolved_against_its_passwd)
{
    char l0[128], l1[128], p[256];
    snprintf(l0, sizeof(l0), "%s/l0", tmpdir);
    snprintf(l1, sizeof(l1), "%s/l1", tmpdir);
    snprintf(p, sizeof(p), "%s/etc", l0);
    cr_assert_eq(sbx_mkdir_p(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/etc", l1);
    cr_assert_eq(sbx_mkdir_p(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/etc/passwd", l0);
    cr_assert_eq(put_file(p, "root:x:0:0::/root:/bin/sh\nold:x:5:5::/:/bin/sh\n"), 0);
    /* The top layer's passwd decides. */
    snprintf(p, sizeof(p), "%s/etc/passwd", l1);
    cr_assert_eq(put_file(p, "root:x:0:0::/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n"),
                 0);
    snprintf(p, sizeof(p), "%s/etc/group", l1);
    cr_assert_eq(put_file(p, "root:x:0:\nstaff:x:50:\n"), 0);
    char *layers[] = {l0, l1};
    uint32_t uid = 9, gid = 9;
    sbx_err_t err = NULL;
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "app", &uid, &gid, &err), 0);
    cr_expect(uid == 1000 && gid == 1001, "app: %u:%u", uid, gid);
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "1000", &uid, &gid, &err), 0);
    cr_expect(uid == 1000 && gid == 1001, "1000: its primary group: %u:%u", uid, gid);
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "2000", &uid, &gid, &err), 0);
    cr_expect(uid == 2000 && gid == 0, "an unlisted uid: gid 0: %u:%u", uid, gid);
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "app:staff", &uid, &gid, &err), 0);
    cr_expect(uid == 1000 && gid == 50, "app:staff: %u:%u", uid, gid);
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "1000:7", &uid, &gid, &err), 0);
    cr_expect(uid == 1000 && gid == 7, "1000:7: %u:%u", uid, gid);
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "", &uid, &gid, &err), 0);
    cr_expect(uid == 0 && gid == 0, "none: root");
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "old", &uid, &gid, &err), SBX_E_IMAGE_INVALID,
                 "a user of a lower layer's passwd only");
    sbx_err_release(&err);
    cr_expect_eq(sbx_image_user_resolve(layers, 2, "app:nogroup", &uid, &gid, &err),
                 SBX_E_IMAGE_INVALID);
    cr_expect(strstr(sbx_err_msg(err), "nogroup"), "%s", sbx_err_msg(err));
    sbx_err_release(&err);
}

/* ---- fetching an image by digest from another store (image_fetch.c) ---- */

/* A source of blobs for sbx_image_fetch: a second store's kept blobs, with
 * one byte of the blob `corrupt` (NULL: none) flipped as it is served. */
struct src {
    sbx_image_store *from;
    const char *corrupt;
    int calls;
};

static int
src_get(void *arg, const char *digest, uint64_t offset, size_t max, char **data, size_t *len,
        uint64_t *size, sbx_err_t *err)
{
    struct src *s = arg;
    s->calls++;
    int rc = sbx_image_blob_read(s->from, digest, offset, max, data, len, size, err);
    if (rc == 0 && s->corrupt && !strcmp(digest, s->corrupt) && *len)
        (*data)[*len - 1] ^= 0x20;
    return rc;
}

/* A peer store that imported the image (a, with name) and its digest. */
static sbx_image_store *
peer_with(const char *name, char digest[72], char diffs[][72])
{
    static const struct imgb_entry top[] = {{'f', "etc/os-release", "ID=fetched\n", 0}};
    const struct imgb_entry *layers[] = {base_min, top};
    size_t counts[] = {SBX_ARRAY_LEN(base_min), 1};
    make_layout(name, layers, counts, 2, true, "\"WorkingDir\":\"/srv\"", digest, diffs);
    char pdir[256], dir[256], got[SBX_IMAGE_DIGEST_LEN];
    snprintf(pdir, sizeof(pdir), "%s/peer-%s", tmpdir, name);
    snprintf(dir, sizeof(dir), "%s/%s", tmpdir, name);
    sbx_image_store *p = NULL;
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_image_store_open(pdir, &p, &err), 0, "%s", sbx_err_msg(err));
    sbx_image_store_keep_blobs(p, true);
    cr_assert_eq(sbx_image_import(p, dir, "img:1", got, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_str_eq(got, digest);
    return p;
}

/* Fetched in small chunks (many calls), verified, imported: the same
 * image (digest, layers, config) as the peer's, servable in turn. */
Test(images, fetch_by_digest_from_a_peer_store)
{
    char digest[72], diffs[2][72], got[SBX_IMAGE_DIGEST_LEN];
    sbx_image_store *peer = peer_with("f", digest, diffs);
    struct src s = {.from = peer};
    sbx_err_t err = NULL;
    uint64_t bytes = 0;
    sbx_image_store_keep_blobs(st, true); /* to serve it in turn */
    cr_assert_eq(sbx_image_fetch(st, digest, src_get, &s, 97, 0, "peer test", &bytes, &err), 0,
                 "%s", sbx_err_msg(err));
    cr_assert_gt(s.calls, 10, "97-byte chunks: many calls (%d)", s.calls);
    cr_assert_gt(bytes, 0);
    cr_assert_eq(sbx_image_resolve(st, digest, got, &err), 0);
    cr_assert_eq(count_dir("layers"), 2);
    cr_assert_eq(count_dir("tmp"), 0);
    json_t *cfg = NULL;
    cr_assert_eq(sbx_image_config(st, digest, &cfg, &err), 0);
    cr_assert_str_eq(json_string_value(json_object_get(cfg, "workingDir")), "/srv");
    json_decref(cfg);
    /* This store serves it now: its manifest blob is the same bytes. */
    char *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    uint64_t sa = 0, sb = 0;
    cr_assert_eq(sbx_image_blob_read(st, digest, 0, 1 << 20, &a, &la, &sa, &err), 0);
    cr_assert_eq(sbx_image_blob_read(peer, digest, 0, 1 << 20, &b, &lb, &sb, &err), 0);
    cr_assert(la == lb && sa == sb && !memcmp(a, b, la));
    free(a);
    free(b);
    sbx_image_store_close(peer);
}

/* A store that keeps no blobs (a single node's, the default) serves none. */
Test(images, a_store_keeps_no_blobs_by_default)
{
    static const struct imgb_entry top[] = {{'f', "x", "x", 0}};
    const struct imgb_entry *layers[] = {base_min, top};
    size_t counts[] = {SBX_ARRAY_LEN(base_min), 1};
    char digest[72], diffs[2][72], got[SBX_IMAGE_DIGEST_LEN];
    make_layout("nb", layers, counts, 2, true, NULL, digest, diffs);
    sbx_err_t err = NULL;
    cr_assert_eq(import("nb", "nb:1", got, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_eq(count_dir("blobs"), 0);
    char *d = NULL;
    size_t l = 0;
    uint64_t sz = 0;
    cr_assert_eq(sbx_image_blob_read(st, digest, 0, 100, &d, &l, &sz, &err),
                 SBX_E_IMAGE_NOT_FOUND);
    sbx_err_release(&err);
}

/* A corrupt blob is refused by digest and nothing of the fetch is left; a
 * source without the image is IMAGE_NOT_FOUND; a bad digest VALIDATION. */
Test(images, fetch_refuses_a_corrupt_blob_and_leaves_nothing)
{
    char digest[72], diffs[2][72], got[SBX_IMAGE_DIGEST_LEN];
    sbx_image_store *peer = peer_with("c", digest, diffs);
    /* The top layer's blob: the manifest's second layer. */
    char *m = NULL;
    size_t ml = 0;
    uint64_t ms = 0;
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_image_blob_read(peer, digest, 0, 1 << 20, &m, &ml, &ms, &err), 0);
    json_t *man = json_loadb(m, ml, 0, NULL);
    free(m);
    const char *ldig = json_string_value(
        json_object_get(json_array_get(json_object_get(man, "layers"), 1), "digest"));
    cr_assert_not_null(ldig);
    sbx_image_store_keep_blobs(st, true);
    struct src s = {.from = peer, .corrupt = ldig};
    cr_assert_eq(sbx_image_fetch(st, digest, src_get, &s, 0, 0, "peer test", NULL, &err),
                 SBX_E_IMAGE_INVALID);
    cr_assert(strstr(sbx_err_msg(err), "tampered or corrupt"), "%s", sbx_err_msg(err));
    sbx_err_release(&err);
    cr_assert_eq(sbx_image_resolve(st, digest, got, NULL), SBX_E_IMAGE_NOT_FOUND);
    cr_assert_eq(count_dir("layers"), 0);
    cr_assert_eq(count_dir("images"), 0);
    cr_assert_eq(count_dir("blobs"), 0);
    cr_assert_eq(count_dir("tmp"), 0);
    json_decref(man);

    sbx_image_store *empty = NULL;
    char edir[256];
    snprintf(edir, sizeof(edir), "%s/empty", tmpdir);
    cr_assert_eq(sbx_image_store_open(edir, &empty, &err), 0);
    struct src e = {.from = empty};
    cr_assert_eq(sbx_image_fetch(st, digest, src_get, &e, 0, 0, "peer test", NULL, &err),
                 SBX_E_IMAGE_NOT_FOUND);
    sbx_err_release(&err);
    cr_assert_eq(count_dir("tmp"), 0);
    cr_assert_eq(sbx_image_fetch(st, "sha256:xyz", src_get, &e, 0, 0, "peer test", NULL, &err),
                 SBX_E_VALIDATION);
    sbx_err_release(&err);
    sbx_image_store_close(empty);
    sbx_image_store_close(peer);
}

/* The HOME and supplementary groups of an image's User (image_user.c): from
 * /etc/passwd and /etc/group; the image's Env HOME wins; with an explicit
 * group, no supplementary groups (runc's rules). */
static void
user_root(const char *name, const char *cfg, struct sbx_image_root *root)
{
    static const struct imgb_entry files[] = {
        {'d', "etc", NULL, 0},
        {'f', "etc/passwd", "root:x:0:0:root:/root:/bin/sh\napp:x:1000:1001::/home/app:/bin/sh\n",
         0},
        {'f', "etc/group",
         "root:x:0:\napp:x:1001:\ndev:x:2000:app\nother:x:2002:bob\nops:x:2001:bob,app\n"
         "wheel:x:0:app\n",
         0},
    };
    const struct imgb_entry *layers[] = {base_min, files};
    size_t counts[] = {SBX_ARRAY_LEN(base_min), SBX_ARRAY_LEN(files)};
    char digest[72], diffs[2][72], got[SBX_IMAGE_DIGEST_LEN];
    make_layout(name, layers, counts, 2, false, cfg, digest, diffs);
    sbx_err_t err = NULL;
    cr_assert_eq(import(name, NULL, got, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_eq(sbx_image_open_root(st, got, root, &err), 0, "%s", sbx_err_msg(err));
}

static const char *
env_of(char **env, const char *k, int *count)
{
    const char *v = NULL;
    *count = 0;
    for (char **e = env; e && *e; e++)
        if (!strncmp(*e, k, strlen(k)) && (*e)[strlen(k)] == '=') {
            v = *e + strlen(k) + 1;
            (*count)++;
        }
    return v;
}

Test(images, image_user_home_and_supplementary_groups)
{
    struct sbx_image_root r;
    int n;
    user_root("u1", "\"User\":\"app\"", &r);
    cr_assert_eq(r.run_uid, 1000);
    cr_assert_eq(r.run_gid, 1001);
    cr_assert_eq(r.ngroups, 3, "dev, ops and wheel list app: %d", r.ngroups);
    cr_assert(r.groups[0] == 2000 && r.groups[1] == 2001 && r.groups[2] == 0);
    cr_assert_str_eq(env_of(r.env, "HOME", &n), "/home/app");
    cr_assert_eq(n, 1);
    sbx_image_root_free(&r);

    user_root("u2", "\"User\":\"1000\",\"Env\":[\"HOME=/srv\"]", &r);
    cr_assert_eq(r.ngroups, 3, "a numeric User is its passwd name's groups too");
    cr_assert_str_eq(env_of(r.env, "HOME", &n), "/srv", "the image's Env wins");
    cr_assert_eq(n, 1);
    sbx_image_root_free(&r);

    user_root("u3", "\"User\":\"app:dev\"", &r);
    cr_assert_eq(r.run_gid, 2000);
    cr_assert_eq(r.ngroups, 0, "an explicit group: that one only");
    cr_assert_str_eq(env_of(r.env, "HOME", &n), "/home/app");
    sbx_image_root_free(&r);

    user_root("u4", "\"User\":\"4242\"", &r);
    cr_assert_eq(r.run_uid, 4242);
    cr_assert_eq(r.ngroups, 0);
    cr_assert_null(env_of(r.env, "HOME", &n), "a uid /etc/passwd does not list has no HOME");
    sbx_image_root_free(&r);
}
