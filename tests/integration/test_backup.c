/*
 * test_backup.c — backup.create / restore / list / delete
 * (docs/persistence.md, "Backups"; issue 15).
 *
 * Checks what a user would: a tree with files, symbolic links (relative and
 * absolute, kept as links), an empty file and a few MB of random bytes,
 * backed up in one sandbox and restored into another (on another shard of
 * the same node: one store), is identical there (types, link targets and
 * the sha256sum of every file, computed inside each sandbox) and replaces
 * what the target dir held; backup.list shows it; delete removes it.  An
 * archive tampered with in the store is refused by its digest and the
 * target dir is untouched; a backup whose ttl passed is BACKUP_EXPIRED, and
 * list collects it (its archive is gone from the store); an unknown id is
 * BACKUP_NOT_FOUND; a dir outside the sandbox's paths (`../..`, `/a/../..`)
 * is VALIDATION_FAILED and a missing one FILE_NOT_FOUND.  A hostile archive
 * put in the store with a matching digest (an entry `../../x`, or a symlink
 * to / followed by an entry through it) is refused, writes nothing outside
 * the target, and leaves the target as it was (no half restore).  An
 * archive over `sbxd --backup-max` is BACKUP_TOO_LARGE and nothing is
 * stored; `excludes` leave out what they match; a file of the store's tmp/
 * two hours old (a create cut short) is collected by list, a fresh one not.
 * With `gitignore: true` what git lists as ignored in a repository (nested
 * .gitignore files, negations, a directory pattern, .git/info/exclude) is
 * left out and the rest (the .gitignore files and .git included) restores
 * identical; without it everything is kept; a non-boolean is
 * VALIDATION_FAILED.  The leftovers of a restore whose shard was killed
 * are swept by the sandbox's next restore.  A backup acknowledged just
 * before both shards are killed (-9) restores after their restart.
 *
 * Each test starts its own small daemon (two shards), stopped by the fini.
 */
#include <archive.h>
#include <archive_entry.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/harness.h"

static struct testd *live;

static void
cleanup(void)
{
    if (live) {
        testd_stop(live);
        free(live);
        live = NULL;
    }
}

TestSuite(backup, .fini = cleanup, .timeout = 240);

static sbx_client *
start_with(const char *const *extra)
{
    live = calloc(1, sizeof(*live));
    cr_assert_eq(testd_start(live, 2, extra), 0, "the daemon did not start");
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

/* The error code of a call that must fail. */
static void
fails(sbx_client *c, const char *op, const char *id, const char *args, const char *want)
{
    char code[64];
    char *j = call(c, op, id, args, code);
    cr_assert_null(j, "%s %s %s succeeded: %s", op, id ? id : "", args, j);
    cr_assert_str_eq(code, want, "%s %s %s", op, id ? id : "", args);
}

/* Run cmd (must exit 0); its stdout (heap). */
static char *
sh(sbx_client *c, const char *id, const char *cmd)
{
    sbx_exec_result r;
    sbx_error err;
    int rc = test_sh(c, id, cmd, 60000, &r, &err);
    cr_assert_eq(rc, 0, "exec '%s' in %s: %s %s", cmd, id, rc ? err.code : "",
                 rc ? err.message : "");
    cr_assert_eq(r.exit_code, 0, "'%s' in %s exited %d: %s", cmd, id, r.exit_code,
                 r.stderr_data ? r.stderr_data : "");
    char *out = strdup(r.stdout_data ? r.stdout_data : "");
    sbx_exec_result_free(&r);
    return out;
}

/* A string field of a JSON object (first occurrence), into out. */
static void
field(const char *json, const char *key, char *out, size_t outlen)
{
    char pat[64];
    snprintf(pat, sizeof(pat), "\"%s\":\"", key);
    const char *p = strstr(json, pat);
    cr_assert(p, "no %s in %s", key, json);
    p += strlen(pat);
    size_t n = strcspn(p, "\"");
    cr_assert_lt(n, outlen);
    memcpy(out, p, n);
    out[n] = '\0';
}

/* backup.create of dir in sandbox id; its id (and digest if wanted). */
static void
backup(sbx_client *c, const char *sb, const char *args, char bid[64], char digest[80])
{
    char code[64];
    char *j = call(c, "backup.create", sb, args, code);
    cr_assert(j, "backup.create %s %s: %s", sb, args, code);
    field(j, "id", bid, 64);
    char d[80];
    field(j, "digest", d, sizeof(d));
    cr_assert_eq(strncmp(d, "sha256:", 7), 0, "digest %s", d);
    cr_assert_eq(strlen(d), 71, "digest %s", d);
    const char *s = strstr(j, "\"size\":");
    cr_assert(s && strtoll(s + 7, NULL, 10) > 0, "size in %s", j);
    if (digest)
        snprintf(digest, 80, "%s", d);
    free(j);
}

/* What a tree is: every entry's type, path and link target, and the
 * sha256sum of every regular file, computed in the sandbox. */
#define TREE_CMD(dir)                                                                       \
    "cd " dir " && find . -printf '%y %p %l %s\\n' | sort && "                              \
    "find . -type f -print0 | sort -z | xargs -0 sha256sum"

#define MAKE_TREE                                                                           \
    "set -e; mkdir -p /workspace/proj/src/deep/er /workspace/proj/empty && "                \
    "cd /workspace/proj && echo 'print(1)' > src/main.py && printf 'x%.0s' $(seq 1 5000) > " \
    "src/deep/er/many && : > zero && head -c 3000000 /dev/urandom > blob.bin && "           \
    "ln -s src/main.py rel-link && ln -s /etc/hostname abs-link && ln -s nowhere dangling && " \
    "chmod 750 src/deep && chmod 600 zero"

Test(backup, restore_into_another_sandbox_is_identical)
{
    sbx_client *c = start();
    char pre[8];
    snprintf(pre, sizeof(pre), "%s", test_prefix());
    char a[64], b[64];
    snprintf(a, sizeof(a), "%sbk-src", pre);
    snprintf(b, sizeof(b), "%sbk-dst", pre);
    free(sh(c, a, MAKE_TREE));
    char *want = sh(c, a, TREE_CMD("/workspace/proj"));
    cr_assert(strstr(want, "l ./abs-link /etc/hostname"), "the tree: %s", want);

    char bid[64], digest[80];
    backup(c, a, "{\"dir\":\"/workspace/proj\",\"name\":\"proj\",\"ttl\":600}", bid, digest);

    /* The target holds something else first: it is replaced. */
    free(sh(c, b, "mkdir -p /workspace/dst && echo old > /workspace/dst/stale"));
    char args[256], code[64];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/dst\"}", bid);
    char *j = call(c, "backup.restore", b, args, code);
    cr_assert(j, "backup.restore: %s", code);
    free(j);
    char *got = sh(c, b, TREE_CMD("/workspace/dst"));
    cr_assert_str_eq(got, want, "restored tree differs");
    /* Owned by the sandbox's root, and writable by it. */
    char *own = sh(c, b, "stat -c '%u:%g' /workspace/dst/blob.bin && echo more >> /workspace/dst/src/main.py");
    cr_assert_str_eq(own, "0:0\n");
    free(own);

    /* Into a new dir of the same sandbox too. */
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/tmp/again/x\"}", bid);
    j = call(c, "backup.restore", a, args, code);
    cr_assert(j, "backup.restore into a new dir: %s", code);
    free(j);
    char *again = sh(c, a, TREE_CMD("/tmp/again/x"));
    cr_assert_str_eq(again, want);
    free(again);

    /* Listed, with what it is. */
    j = call(c, "backup.list", NULL, "{}", code);
    cr_assert(j, "backup.list: %s", code);
    cr_assert(strstr(j, bid), "%s not in %s", bid, j);
    cr_assert(strstr(j, digest) && strstr(j, "\"name\":\"proj\"") && strstr(j, a), "%s", j);
    free(j);

    /* Deleted: gone, and restoring it is BACKUP_NOT_FOUND. */
    snprintf(args, sizeof(args), "{\"id\":\"%s\"}", bid);
    j = call(c, "backup.delete", NULL, args, code);
    cr_assert(j, "backup.delete: %s", code);
    free(j);
    fails(c, "backup.delete", NULL, args, "BACKUP_NOT_FOUND");
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/dst\"}", bid);
    fails(c, "backup.restore", b, args, "BACKUP_NOT_FOUND");
    char blob[512];
    snprintf(blob, sizeof(blob), "%s/backups/blobs/%s.tar.zst", live->dir, digest + 7);
    cr_assert_neq(access(blob, F_OK), 0, "%s is left after delete", blob);
    free(want);
    free(got);
    sbx_client_close(c);
}

Test(backup, tampered_archive_is_refused_and_target_untouched)
{
    sbx_client *c = start();
    char a[64];
    snprintf(a, sizeof(a), "%sbk-tamper", test_prefix());
    free(sh(c, a, MAKE_TREE));
    char bid[64], digest[80];
    backup(c, a, "{\"dir\":\"/workspace/proj\"}", bid, digest);
    char blob[512];
    snprintf(blob, sizeof(blob), "%s/backups/blobs/%s.tar.zst", live->dir, digest + 7);
    int fd = open(blob, O_RDWR);
    cr_assert_geq(fd, 0, "the archive is not in the store at %s", blob);
    /* One byte changed in the middle. */
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    unsigned char x;
    cr_assert_eq(pread(fd, &x, 1, st.st_size / 2), 1);
    x ^= 0x55;
    cr_assert_eq(pwrite(fd, &x, 1, st.st_size / 2), 1);
    close(fd);

    free(sh(c, a, "mkdir -p /workspace/keep && echo mine > /workspace/keep/f"));
    char args[256], code[64];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/keep\"}", bid);
    char *j = call(c, "backup.restore", a, args, code);
    cr_assert_null(j, "a tampered archive was restored: %s", j);
    cr_assert_str_eq(code, "STORAGE_ERROR");
    char *ls = sh(c, a, "cd /workspace/keep && find . | sort && cat f");
    cr_assert_str_eq(ls, ".\n./f\nmine\n", "the target changed: %s", ls);
    free(ls);

    /* Truncated: refused the same way. */
    cr_assert_eq(truncate(blob, st.st_size / 3), 0);
    fails(c, "backup.restore", a, args, "STORAGE_ERROR");
    ls = sh(c, a, "cat /workspace/keep/f");
    cr_assert_str_eq(ls, "mine\n");
    free(ls);
    sbx_client_close(c);
}

Test(backup, expired_backup_is_refused_and_collected)
{
    sbx_client *c = start();
    char a[64];
    snprintf(a, sizeof(a), "%sbk-ttl", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/t && echo 1 > /workspace/t/one"));
    char bid[64], digest[80];
    backup(c, a, "{\"dir\":\"/workspace/t\",\"ttl\":1}", bid, digest);
    char blob[512];
    snprintf(blob, sizeof(blob), "%s/backups/blobs/%s.tar.zst", live->dir, digest + 7);
    cr_assert_eq(access(blob, F_OK), 0, "no archive at %s", blob);
    usleep(1500 * 1000);
    char args[256], code[64];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/t2\"}", bid);
    fails(c, "backup.restore", a, args, "BACKUP_EXPIRED");
    char *j = call(c, "backup.list", NULL, "{}", code);
    cr_assert(j, "backup.list: %s", code);
    cr_assert_null(strstr(j, bid), "expired %s still listed: %s", bid, j);
    free(j);
    cr_assert_neq(access(blob, F_OK), 0, "the expired archive %s is left", blob);
    fails(c, "backup.restore", a, args, "BACKUP_NOT_FOUND");
    sbx_client_close(c);
}

Test(backup, bad_ids_and_dirs_are_refused)
{
    sbx_client *c = start();
    char a[64];
    snprintf(a, sizeof(a), "%sbk-bad", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/w && echo 1 > /workspace/w/f && echo x > /workspace/file"));
    fails(c, "backup.restore", a, "{\"id\":\"bk_000000000000000000000000\",\"dir\":\"/workspace/w\"}",
          "BACKUP_NOT_FOUND");
    fails(c, "backup.restore", a, "{\"id\":\"../../etc\",\"dir\":\"/workspace/w\"}",
          "BACKUP_NOT_FOUND");
    fails(c, "backup.delete", NULL, "{\"id\":\"bk_000000000000000000000000\"}", "BACKUP_NOT_FOUND");
    fails(c, "backup.create", a, "{\"dir\":\"../..\"}", "VALIDATION_FAILED");
    fails(c, "backup.create", a, "{\"dir\":\"/workspace/../..\"}", "VALIDATION_FAILED");
    fails(c, "backup.create", a, "{\"dir\":\"/workspace/nope\"}", "FILE_NOT_FOUND");
    fails(c, "backup.create", a, "{\"dir\":\"/workspace/file\"}", "NOT_DIRECTORY");
    char bid[64];
    backup(c, a, "{\"dir\":\"/workspace/w\"}", bid, NULL);
    char args[256];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"../..\"}", bid);
    fails(c, "backup.restore", a, args, "VALIDATION_FAILED");
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/w/../../..\"}", bid);
    fails(c, "backup.restore", a, args, "VALIDATION_FAILED");
    /* The sandbox's / is its own: a backup of / holds its files, not the host's. */
    char *f = sh(c, a, "cat /workspace/w/f");
    cr_assert_str_eq(f, "1\n");
    free(f);
    sbx_client_close(c);
}

/* Put a zstd tar of the given entries in the store as backup bid (its index
 * entry written as the store does: docs/persistence.md, "Backups"). */
struct hentry {
    const char *path;
    const char *link; /* a symlink to this, or NULL: a file holding path */
};

static void
plant(const char *store, const char *bid, const struct hentry *es, size_t n)
{
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s/tmp/hostile.tar.zst", store);
    struct archive *a = archive_write_new();
    archive_write_set_format_pax_restricted(a);
    cr_assert_eq(archive_write_add_filter_zstd(a), ARCHIVE_OK);
    cr_assert_eq(archive_write_open_filename(a, tmp), ARCHIVE_OK);
    for (size_t i = 0; i < n; i++) {
        struct archive_entry *e = archive_entry_new();
        archive_entry_set_pathname(e, es[i].path);
        archive_entry_set_mtime(e, 1700000000, 0);
        if (es[i].link) {
            archive_entry_set_filetype(e, AE_IFLNK);
            archive_entry_set_perm(e, 0777);
            archive_entry_set_symlink(e, es[i].link);
            cr_assert_eq(archive_write_header(a, e), ARCHIVE_OK);
        } else {
            archive_entry_set_filetype(e, AE_IFREG);
            archive_entry_set_perm(e, 0644);
            archive_entry_set_size(e, (la_int64_t)strlen(es[i].path));
            cr_assert_eq(archive_write_header(a, e), ARCHIVE_OK);
            archive_write_data(a, es[i].path, strlen(es[i].path));
        }
        archive_entry_free(e);
    }
    cr_assert_eq(archive_write_close(a), ARCHIVE_OK);
    archive_write_free(a);
    /* Its digest, as the store names it. */
    FILE *f = fopen(tmp, "rb");
    cr_assert(f);
    struct sha256_ctx h;
    sha256_init(&h);
    unsigned char buf[4096];
    size_t r;
    long size = 0;
    while ((r = fread(buf, 1, sizeof(buf), f)) > 0) {
        sha256_update(&h, r, buf);
        size += (long)r;
    }
    fclose(f);
    uint8_t d[SHA256_DIGEST_SIZE];
    sha256_digest(&h, sizeof(d), d);
    char hex[65];
    for (int i = 0; i < 32; i++)
        snprintf(hex + 2 * i, 3, "%02x", d[i]);
    char blob[512], idx[512];
    snprintf(blob, sizeof(blob), "%s/blobs/%s.tar.zst", store, hex);
    cr_assert_eq(rename(tmp, blob), 0);
    snprintf(idx, sizeof(idx), "%s/index/%s.json", store, bid);
    f = fopen(idx, "w");
    cr_assert(f);
    fprintf(f,
            "{\"id\":\"%s\",\"name\":\"\",\"sandbox\":\"x\",\"dir\":\"/x\","
            "\"digest\":\"sha256:%s\",\"size\":%ld,\"created\":%lld,\"expires\":%lld}",
            bid, hex, size, (long long)sbx_wall_ms(), (long long)sbx_wall_ms() + 3600000);
    fclose(f);
}

Test(backup, hostile_archive_cannot_escape_and_leaves_target_as_it_was)
{
    sbx_client *c = start();
    char a[64], store[320];
    snprintf(a, sizeof(a), "%sbk-hostile", test_prefix());
    snprintf(store, sizeof(store), "%s/backups", live->dir);
    free(sh(c, a, "mkdir -p /workspace/t/sub && echo mine > /workspace/t/f"));

    const struct hentry dotdot[] = {{"good.txt", NULL}, {"../../escaped.txt", NULL}};
    plant(store, "bk_0000000000000000000000d1", dotdot, 2);
    const struct hentry via_link[] = {{"good.txt", NULL}, {"up", "/"}, {"up/tmp/escaped2.txt", NULL}};
    plant(store, "bk_0000000000000000000000d2", via_link, 3);
    const struct hentry absolute[] = {{"/tmp/escaped3.txt", NULL}};
    plant(store, "bk_0000000000000000000000d3", absolute, 1);

    const char *ids[] = {"bk_0000000000000000000000d1", "bk_0000000000000000000000d2",
                         "bk_0000000000000000000000d3"};
    for (int i = 0; i < 3; i++) {
        char args[256], code[64];
        snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/t/sub\"}", ids[i]);
        char *j = call(c, "backup.restore", a, args, code);
        cr_assert_null(j, "hostile archive %s was restored: %s", ids[i], j);
        cr_assert(code[0], "no error code for %s", ids[i]);
        char *ls = sh(c, a, "cd /workspace && find . | sort && cat t/f && "
                            "ls /tmp/escaped2.txt /tmp/escaped3.txt /escaped.txt 2>&1 | grep -c 'No such'");
        cr_assert_str_eq(ls, ".\n./t\n./t/f\n./t/sub\nmine\n3\n", "after %s: %s", ids[i], ls);
        free(ls);
    }
    sbx_client_close(c);
}

/* A sandbox that swaps its files for FIFOs while they are being backed up
 * cannot hang the backup (and its own input gate, closed behind it): the
 * packer reads what the walk saw as a regular file, and a FIFO renamed over
 * it in between blocked its open until someone wrote to the FIFO (never).
 * Four processes in the sandbox flip 40 files between regular file and FIFO
 * (rename(2): no moment without either) while 12 backups run; each must be
 * answered (ok, or a clean error) by its 60 s deadline, and the sandbox must
 * answer an exec afterwards. */
#define FLIPPER                                                                             \
    "python3 -c '\n"                                                                        \
    "import os, sys\n"                                                                      \
    "k = int(sys.argv[1])\n"                                                                \
    "names = [\"/workspace/r/f%d\" % i for i in range(k, 40, 4)]\n"                         \
    "while True:\n"                                                                         \
    "    for n in names:\n"                                                                 \
    "        os.mkfifo(n + \".p\"); os.rename(n + \".p\", n)\n"                             \
    "    for n in names:\n"                                                                 \
    "        with open(n + \".r\", \"w\") as f: f.write(\"x\" * 100)\n"                     \
    "        os.rename(n + \".r\", n)\n"                                                    \
    "' "
Test(backup, files_flipped_to_fifos_during_a_backup_do_not_hang_it)
{
    sbx_client *c = start();
    const char *a = "fifoflip";
    char *out = sh(c, a,
                   "mkdir -p /workspace/r && for i in $(seq 0 39); do echo $i > /workspace/r/f$i; "
                   "done && for k in 0 1 2 3; do (" FLIPPER "$k >/dev/null 2>&1 &) ; done; "
                   "sleep 0.5; pgrep -fc \"os[.]mkfifo\"");
    cr_assert_str_eq(out, "4\n", "the four flippers are not running");
    free(out);
    int ok = 0, failed = 0;
    for (int i = 0; i < 12; i++) {
        char code[64];
        double t0 = test_now_ms();
        char *j = call(c, "backup.create", a, "{\"dir\":\"/workspace/r\"}", code);
        double took = test_now_ms() - t0;
        cr_assert(j || (code[0] && strcmp(code, "REQUEST_TIMEOUT") != 0 &&
                        strcmp(code, "SHARD_UNAVAILABLE") != 0),
                  "backup %d: no answer within its deadline (%s after %.0f ms)", i, code, took);
        if (j)
            ok++;
        else
            failed++;
        free(j);
    }
    out = sh(c, a, "pgrep -fc \"os[.]mkfifo\"; pkill -f \"os[.]mkfifo\"; echo alive");
    cr_assert_str_eq(out, "4\nalive\n", "the flippers did not run through the backups");
    free(out);
    cr_log_info("fifo flips: %d backups answered ok, %d with an error", ok, failed);
}

Test(backup, too_large_is_refused_and_excludes_leave_out)
{
    const char *const extra[] = {TESTD_SMALL, "--backup-max", "256K", NULL};
    sbx_client *c = start_with(extra);
    char a[64], code[64];
    snprintf(a, sizeof(a), "%sbk-large", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/big/node_modules/m /workspace/big/src && "
                  "head -c 1000000 /dev/urandom > /workspace/big/node_modules/m/blob && "
                  "echo keep > /workspace/big/src/main.c && echo log > /workspace/big/src/x.log"));
    fails(c, "backup.create", a, "{\"dir\":\"/workspace/big\"}", "BACKUP_TOO_LARGE");
    char *j = call(c, "backup.list", NULL, "{}", code);
    cr_assert(j, "backup.list: %s", code);
    cr_assert_null(strstr(j, "bk_"), "a backup was stored: %s", j);
    free(j);
    char tmp[512];
    snprintf(tmp, sizeof(tmp), "%s/backups/tmp", live->dir);
    DIR *d = opendir(tmp);
    cr_assert(d);
    struct dirent *de;
    int left = 0;
    while ((de = readdir(d)))
        left += de->d_name[0] != '.';
    closedir(d);
    cr_assert_eq(left, 0, "%d files left in %s", left, tmp);

    /* What a shard killed mid-create left in tmp/ two hours ago is collected
     * by the next list; a fresh file (a create under way) is not. */
    char stale[600], fresh[600];
    snprintf(stale, sizeof(stale), "%s/archive-stale", tmp);
    snprintf(fresh, sizeof(fresh), "%s/archive-fresh", tmp);
    FILE *f = fopen(stale, "w");
    cr_assert(f);
    fclose(f);
    f = fopen(fresh, "w");
    cr_assert(f);
    fclose(f);
    struct timeval tv[2] = {{time(NULL) - 7200, 0}, {time(NULL) - 7200, 0}};
    cr_assert_eq(utimes(stale, tv), 0);
    free(call(c, "backup.list", NULL, "{}", code));
    cr_assert_neq(access(stale, F_OK), 0, "%s was not collected", stale);
    cr_assert_eq(access(fresh, F_OK), 0, "%s was collected", fresh);
    unlink(fresh);

    /* Without the big dir (and the logs) it fits, and restores without them. */
    char bid[64];
    backup(c, a, "{\"dir\":\"/workspace/big\",\"excludes\":[\"node_modules\",\"*.log\"]}",
           bid, NULL);
    char args[256];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/small\"}", bid);
    j = call(c, "backup.restore", a, args, code);
    cr_assert(j, "backup.restore: %s", code);
    free(j);
    char *ls = sh(c, a, "cd /workspace/small && find . | sort");
    cr_assert_str_eq(ls, ".\n./src\n./src/main.c\n", "restored: %s", ls);
    free(ls);
    sbx_client_close(c);
}

/* A repository whose .gitignore files (nested, with `*.log`, a directory
 * `node_modules/`, negations) and .git/info/exclude name what to leave out. */
#define GI_TREE                                                                             \
    "set -e; mkdir -p /workspace/gi && cd /workspace/gi && git init -q . && "               \
    "mkdir -p src/deep node_modules/m src/node_modules/n && "                               \
    "printf '*.log\\n!keep.log\\nnode_modules/\\n' > .gitignore && "                        \
    "printf '*.o\\n!special.log\\n' > src/.gitignore && printf '*.tmp\\n' >> .git/info/exclude && " \
    "echo a > a.log && echo k > keep.log && echo t > t.tmp && echo o > x.o && "             \
    "echo m > node_modules/m/index.js && echo c > src/main.c && echo b > src/b.log && "     \
    "echo s > src/special.log && echo o > src/x.o && echo y > src/deep/y.o && "             \
    "echo z > src/deep/z.c && echo n > src/node_modules/n/n.js && "                         \
    "git add . && git -c user.email=t@example.com -c user.name=t commit -qm init"

Test(backup, gitignore_leaves_out_what_git_ignores)
{
    sbx_client *c = start();
    char a[64], code[64], args[256];
    snprintf(a, sizeof(a), "%sbk-gi", test_prefix());
    free(sh(c, a, GI_TREE));
    /* What a user expects: the tree less what git itself lists as ignored. */
    free(sh(c, a, "cp -a /workspace/gi /workspace/gi-want && cd /workspace/gi-want && "
                  "git ls-files -z --others --ignored --exclude-standard --directory | "
                  "xargs -0 rm -rf"));
    char *want = sh(c, a, TREE_CMD("/workspace/gi-want"));
    char *all = sh(c, a, TREE_CMD("/workspace/gi"));
    cr_assert_str_neq(want, all, "git ignores nothing in the test's tree");

    char bid[64];
    backup(c, a, "{\"dir\":\"/workspace/gi\",\"gitignore\":true}", bid, NULL);
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/gi-got\"}", bid);
    char *j = call(c, "backup.restore", a, args, code);
    cr_assert(j, "backup.restore: %s", code);
    free(j);
    char *got = sh(c, a, TREE_CMD("/workspace/gi-got"));
    cr_assert_str_eq(got, want, "restored with gitignore");
    /* And by name, whatever git's listing said. */
    free(sh(c, a, "cd /workspace/gi-got && test -f keep.log && test -f src/special.log && "
                  "test -f .gitignore && test -f src/.gitignore && test -f x.o && "
                  "test -f src/main.c && test -f src/deep/z.c && test -f .git/HEAD && "
                  "git log --oneline | grep -q init && "
                  "! test -e a.log && ! test -e src/b.log && ! test -e node_modules && "
                  "! test -e src/node_modules && ! test -e src/x.o && ! test -e src/deep/y.o && "
                  "! test -e t.tmp"));

    /* The CLI's --gitignore is the same. */
    char cmd[1024], out[512] = "";
    const char *bin = getenv("SBX_BIN") && *getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin";
    snprintf(cmd, sizeof(cmd), "%s/sbx --gateway '%s' --json backup create %s /workspace/gi "
             "--gitignore --name cli 2>&1", bin, live->url, a);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "%s", cmd);
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    cr_assert_eq(pclose(p), 0, "%s: %s", cmd, out);
    const char *cid = strstr(out, "\"bk_");
    cr_assert(cid, "no backup ID in %s", out);
    snprintf(args, sizeof(args), "{\"id\":\"%.27s\",\"dir\":\"/workspace/gi-cli\"}", cid + 1);
    j = call(c, "backup.restore", a, args, code);
    cr_assert(j, "backup.restore: %s", code);
    free(j);
    char *cli = sh(c, a, TREE_CMD("/workspace/gi-cli"));
    cr_assert_str_eq(cli, want, "restored from the CLI's backup with --gitignore");
    free(cli);

    /* Without it everything is kept. */
    backup(c, a, "{\"dir\":\"/workspace/gi\",\"gitignore\":false}", bid, NULL);
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/gi-all\"}", bid);
    j = call(c, "backup.restore", a, args, code);
    cr_assert(j, "backup.restore: %s", code);
    free(j);
    char *kept = sh(c, a, TREE_CMD("/workspace/gi-all"));
    cr_assert_str_eq(kept, all, "restored without gitignore");

    fails(c, "backup.create", a, "{\"dir\":\"/workspace/gi\",\"gitignore\":\"yes\"}",
          "VALIDATION_FAILED");
    fails(c, "backup.create", a, "{\"dir\":\"/workspace/gi\",\"gitignore\":1}",
          "VALIDATION_FAILED");
    free(want);
    free(all);
    free(got);
    free(kept);
    sbx_client_close(c);
}

/* A restore whose shard was killed leaves its extraction directory
 * (`.sbx-restore-XXXXXX` in its target) and its note in the store's
 * restoring/: made here by hand as such a restore leaves them.  The
 * sandbox's next restore, into another directory, removes that directory
 * and the note, and nothing else of the old target. */
Test(backup, next_restore_sweeps_what_a_killed_restore_left)
{
    sbx_client *c = start();
    char a[64], code[64], args[256];
    snprintf(a, sizeof(a), "%sbk-sweep", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/src && echo new > /workspace/src/f && "
                  "mkdir -p /workspace/old/.sbx-restore-Xy12Zq/sub /workspace/old/.sbx-restore-mine && "
                  "echo half > /workspace/old/.sbx-restore-Xy12Zq/sub/f && "
                  "echo mine > /workspace/old/notes && echo m > /workspace/old/.sbx-restore-mine/k && "
                  "echo m > /workspace/old/.sbx-restore-abcdef.txt && "
                  "echo m > /workspace/old/.sbx-restore-FILE01"));
    char note[600];
    snprintf(note, sizeof(note), "%s/backups/restoring/%s", live->dir, a);
    FILE *f = fopen(note, "w");
    cr_assert(f, "%s", note);
    fputs("/workspace/old", f);
    fclose(f);

    char bid[64];
    backup(c, a, "{\"dir\":\"/workspace/src\"}", bid, NULL);
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/new\"}", bid);
    char *j = call(c, "backup.restore", a, args, code);
    cr_assert(j, "backup.restore: %s", code);
    free(j);
    char *ls = sh(c, a, "cat /workspace/new/f && cd /workspace/old && find . | LC_ALL=C sort");
    cr_assert_str_eq(ls,
                     "new\n.\n./.sbx-restore-FILE01\n./.sbx-restore-abcdef.txt\n"
                     "./.sbx-restore-mine\n./.sbx-restore-mine/k\n./notes\n",
                     "after the restore: %s", ls);
    free(ls);
    cr_assert_neq(access(note, F_OK), 0, "the note %s is left after the restore", note);
    sbx_client_close(c);
}

/* An acknowledged create is in the store when the shards are killed (-9)
 * at once after its answer: the restarted shards restore it, identical.
 * This shows the answer comes after the blob and entry are in place; it
 * cannot show they would survive a power cut (a killed process's writes
 * are in the page cache either way): that rests on the fsyncs of
 * sbx_backup_store_add (docs/persistence.md, "The store"). */
Test(backup, acknowledged_backup_survives_a_shard_kill)
{
    sbx_client *c = start();
    char a[64], b[64], code[64], args[256];
    snprintf(a, sizeof(a), "%sbk-k9a", test_prefix());
    snprintf(b, sizeof(b), "%sbk-k9b", test_prefix());
    free(sh(c, a, MAKE_TREE));
    char *want = sh(c, a, TREE_CMD("/workspace/proj"));
    char bid[64];
    backup(c, a, "{\"dir\":\"/workspace/proj\"}", bid, NULL);
    pid_t s0 = test_child_of(live->pid, -1), s1 = test_child_of(live->pid, s0);
    cr_assert(s0 > 0 && s1 > 0, "no shard processes");
    cr_assert_eq(kill(s0, SIGKILL), 0);
    cr_assert_eq(kill(s1, SIGKILL), 0);
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/dst\"}", bid);
    char *j = NULL;
    /* The gateway answers SHARD_UNAVAILABLE (or the like) until the
     * supervisor has restarted the shards. */
    for (int i = 0; i < 300 && !(j = call(c, "backup.restore", b, args, code)); i++) {
        cr_assert_neq(strcmp(code, "BACKUP_NOT_FOUND"), 0, "the acknowledged backup is gone");
        usleep(100 * 1000);
    }
    cr_assert(j, "backup.restore after the kill: %s", code);
    free(j);
    char *got = sh(c, b, TREE_CMD("/workspace/dst"));
    cr_assert_str_eq(got, want, "restored after the kill");
    free(got);
    free(want);
    sbx_client_close(c);
}
