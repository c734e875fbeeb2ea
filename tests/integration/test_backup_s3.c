/*
 * test_backup_s3.c — the backup store in S3 (sbxd --backup-store s3://…;
 * container/backup_s3.c; docs/persistence.md, "The S3 store"; issue 15),
 * against a real S3-protocol server: s3rver (tests/s3/package.json, pinned
 * in its lock file and installed by tests/s3/install.sh), started by each
 * test on a loopback port it chooses itself (-p 0; the port read from its
 * first line) and stopped by pid in the fini.
 *
 * Checks what a user would: a git repository with history backed up in
 * one sandbox and restored into another is identical there (the sha256sum
 * of every file, `git log` and `git fsck`), and the archive and index entry
 * are objects of the bucket (seen through the S3 API), not files of the
 * node; list shows it; delete removes both objects.  An archive overwritten
 * through the S3 API (one byte changed, or cut short) is refused by its
 * digest and the target dir is untouched.  A backup whose ttl passed is
 * BACKUP_EXPIRED and list deletes its objects.  With the server stopped,
 * list, create and restore answer BACKUP_STORE_UNAVAILABLE by their
 * deadline (--s3-timeout 2s, retries included) instead of hanging, and the
 * create leaves nothing staged on the node.  A credentials file others can
 * read is refused at start.  With API keys, tenants see only their own
 * backups (docs/security.md §6), as with the local store.
 */
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/id.h"
#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/sdk.h"

#define BUCKET "sbx-backups"
#define PREFIX "node1/bk"

static struct testd *live;
static pid_t s3pid;
static char s3dir[256], s3url[128], credfile[300], keyfile[300];

static int
rm_cb(const char *p, const struct stat *st, int f, struct FTW *w)
{
    (void)st;
    (void)f;
    (void)w;
    return remove(p);
}

static void
s3_stop(void)
{
    if (s3pid > 0) {
        kill(s3pid, SIGKILL);
        waitpid(s3pid, NULL, 0);
        s3pid = 0;
    }
}

static void
cleanup(void)
{
    if (live) {
        testd_stop(live);
        free(live);
        live = NULL;
    }
    s3_stop();
    if (keyfile[0])
        unlink(keyfile);
    keyfile[0] = '\0';
    if (s3dir[0])
        nftw(s3dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    s3dir[0] = '\0';
}

TestSuite(backup_s3, .fini = cleanup, .timeout = 240);

/* The repository's tests/s3 (cwd is the repository for tools/run-tests.sh;
 * else found above $SBX_BIN). */
static void
s3_home(char *out, size_t outlen)
{
    char p[PATH_MAX];
    if (access("tests/s3/package.json", F_OK) == 0 && realpath("tests/s3", p)) {
        snprintf(out, outlen, "%s", p);
        return;
    }
    const char *b = getenv("SBX_BIN");
    cr_assert(b && realpath(b, p), "run from the repository, or set SBX_BIN");
    for (int up = 0; up < 5; up++) {
        char *s = strrchr(p, '/');
        if (!s)
            break;
        *s = '\0';
        char q[PATH_MAX + 32];
        snprintf(q, sizeof(q), "%s/tests/s3/package.json", p);
        if (access(q, F_OK) == 0) {
            snprintf(out, outlen, "%s/tests/s3", p);
            return;
        }
    }
    cr_assert_fail("no tests/s3 found from the cwd or $SBX_BIN");
}

/* Start s3rver with the bucket; s3url gets its address. */
static void
s3_start(void)
{
    char home[PATH_MAX], js[PATH_MAX + 64], cmd[PATH_MAX + 64];
    s3_home(home, sizeof(home));
    snprintf(js, sizeof(js), "%s/node_modules/s3rver/bin/s3rver.js", home);
    if (access(js, F_OK) != 0) {
        snprintf(cmd, sizeof(cmd), "%s/install.sh >&2", home);
        cr_assert_eq(system(cmd), 0, "tests/s3/install.sh failed");
    }
    snprintf(s3dir, sizeof(s3dir), "/tmp/sbx-%s-s3-XXXXXX", test_prefix());
    cr_assert(mkdtemp(s3dir), "mkdtemp");
    char data[300], log[300];
    snprintf(data, sizeof(data), "%s/data", s3dir);
    snprintf(log, sizeof(log), "%s/log", s3dir);
    cr_assert_eq(mkdir(data, 0700), 0);
    s3pid = fork();
    cr_assert_geq(s3pid, 0);
    if (s3pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        dup2(fd, 2);
        execlp("node", "node", js, "-d", data, "-a", "127.0.0.1", "-p", "0",
               "--configure-bucket", BUCKET, (char *)NULL);
        _exit(127);
    }
    /* "S3rver listening on 127.0.0.1:PORT" */
    for (int i = 0; i < 300; i++) {
        char buf[512] = "";
        FILE *f = fopen(log, "r");
        if (f) {
            size_t n = fread(buf, 1, sizeof(buf) - 1, f);
            buf[n] = '\0';
            fclose(f);
        }
        const char *p = strstr(buf, "listening on 127.0.0.1:");
        if (p && strchr(p, '\n')) {
            snprintf(s3url, sizeof(s3url), "http://127.0.0.1:%d", atoi(p + 23));
            return;
        }
        cr_assert_eq(waitpid(s3pid, NULL, WNOHANG), 0, "s3rver ended: %s", buf);
        usleep(100 * 1000);
    }
    cr_assert_fail("s3rver did not start in 30 s");
}

/* A credentials file of the given mode (s3rver's keys). */
static void
write_creds(mode_t mode)
{
    snprintf(credfile, sizeof(credfile), "%s/creds", s3dir);
    FILE *f = fopen(credfile, "w");
    cr_assert(f);
    fprintf(f, "# s3rver's default keys\nAWS_ACCESS_KEY_ID=S3RVER\nAWS_SECRET_ACCESS_KEY=S3RVER\n");
    fclose(f);
    cr_assert_eq(chmod(credfile, mode), 0);
}

/* s3rver and a daemon of 2 shards whose backup store is its bucket; with
 * admin_key, the daemon takes API keys (that one the deployment's admin). */
static void
start_keyed(const char *admin_key)
{
    s3_start();
    write_creds(0600);
    const char *extra[24] = {TESTD_SMALL, "--backup-store", "s3://" BUCKET "/" PREFIX,
                             "--s3-endpoint", s3url, "--s3-credentials", credfile,
                             "--s3-timeout", "2s"};
    if (admin_key) {
        snprintf(keyfile, sizeof(keyfile), "%s/keys", s3dir);
        FILE *f = fopen(keyfile, "w");
        cr_assert(f);
        fprintf(f, "# test admin key\n%s\n", admin_key);
        fclose(f);
        size_t n = 0;
        while (extra[n])
            n++;
        extra[n++] = "--api-keys";
        extra[n++] = keyfile;
        setenv("SBX_API_KEY", admin_key, 1); /* testd_start's readiness check */
    }
    live = calloc(1, sizeof(*live));
    int rc = testd_start(live, 2, extra);
    unsetenv("SBX_API_KEY");
    cr_assert_eq(rc, 0, "the daemon did not start");
}

static sbx_client *
start_daemon(void)
{
    start_keyed(NULL);
    sbx_client *c = NULL;
    sbx_error err;
    cr_assert_eq(sbx_client_open(&c, live->url, &err), 0, "connect: %s", err.message);
    return c;
}

/* ------------------------------------------------------------------------------ */
/* The bucket seen through the S3 API (signed by libcurl as the daemon's
 * requests are, but written here). */

struct body {
    char *p;
    size_t n;
};

static size_t
body_write(char *src, size_t size, size_t nmemb, void *arg)
{
    struct body *b = arg;
    b->p = realloc(b->p, b->n + size * nmemb + 1);
    memcpy(b->p + b->n, src, size * nmemb);
    b->n += size * nmemb;
    b->p[b->n] = '\0';
    return size * nmemb;
}

/* method on PREFIX/key; put: the body to PUT; *out: the answer's body
 * (heap) if wanted.  Returns the HTTP status. */
static long
s3(const char *method, const char *key, const struct body *put, struct body *out)
{
    CURL *h = curl_easy_init();
    cr_assert(h);
    char url[512];
    snprintf(url, sizeof(url), "%s/" BUCKET "/" PREFIX "/%s", s3url, key);
    struct curl_slist *hd = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    struct body sink = {0};
    FILE *in = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_AWS_SIGV4, "aws:amz:us-east-1:s3");
    curl_easy_setopt(h, CURLOPT_USERPWD, "S3RVER:S3RVER");
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, body_write);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out ? out : &sink);
    if (!strcmp(method, "PUT")) {
        in = fmemopen(put->p, put->n, "r");
        curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
        curl_easy_setopt(h, CURLOPT_READDATA, in);
        curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)put->n);
    } else if (!strcmp(method, "HEAD")) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    }
    CURLcode cc = curl_easy_perform(h);
    cr_assert_eq(cc, CURLE_OK, "%s %s: %s", method, url, curl_easy_strerror(cc));
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (in)
        fclose(in);
    free(sink.p);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    return status;
}

/* ------------------------------------------------------------------------------ */

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
fails(sbx_client *c, const char *op, const char *id, const char *args, const char *want)
{
    char code[64];
    char *j = call(c, op, id, args, code);
    cr_assert_null(j, "%s %s %s succeeded: %s", op, id ? id : "", args, j);
    cr_assert_str_eq(code, want, "%s %s %s", op, id ? id : "", args);
}

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

static void
backup(sbx_client *c, const char *sb, const char *args, char bid[64], char digest[80])
{
    char code[64];
    char *j = call(c, "backup.create", sb, args, code);
    cr_assert(j, "backup.create %s %s: %s", sb, args, code);
    field(j, "id", bid, 64);
    field(j, "digest", digest, 80);
    cr_assert_eq(strlen(digest), 71, "digest %s", digest);
    free(j);
}

/* The objects of backup bid / digest in the bucket. */
static void
keys(const char *bid, const char *digest, char ik[128], char bk[128])
{
    snprintf(ik, 128, "index/%s.json", bid);
    snprintf(bk, 128, "blobs/%s.tar.zst", digest + 7);
}

/* A git repository with history, and what it is (every file's checksum,
 * the log and fsck). */
#define MAKE_REPO                                                                            \
    "set -e; mkdir -p /workspace/repo && cd /workspace/repo && git init -q -b main . && "   \
    "G='git -c user.name=t -c user.email=t@example.com'; "                                  \
    "for i in 1 2 3 4 5; do mkdir -p src/m$i && seq 1 $((i*2000)) > src/m$i/data.txt && "   \
    "echo \"print($i)\" > src/m$i/main.py && $G add -A && $G commit -q -m \"step $i\"; done; " \
    "head -c 2000000 /dev/urandom > blob.bin && ln -s src/m1/main.py link && "              \
    "$G add -A && $G commit -q -m binary && echo dirty >> src/m2/main.py"
#define TREE_CMD(dir)                                                                       \
    "cd " dir " && find . -printf '%y %p %l %s\\n' | sort && "                              \
    "find . -type f -print0 | sort -z | xargs -0 sha256sum && git log --format='%H %s' && "  \
    "git fsck --full 2>&1 && git status --short"

Test(backup_s3, git_repo_round_trip_list_delete)
{
    sbx_client *c = start_daemon();
    char a[64], b[64];
    snprintf(a, sizeof(a), "%ss3-src", test_prefix());
    snprintf(b, sizeof(b), "%ss3-dst", test_prefix());
    free(sh(c, a, MAKE_REPO));
    char *want = sh(c, a, TREE_CMD("/workspace/repo"));
    cr_assert(strstr(want, " step 5\n") && strstr(want, "M src/m2/main.py"), "the repo: %s", want);

    char bid[64], digest[80], ik[128], bk[128];
    backup(c, a, "{\"dir\":\"/workspace/repo\",\"name\":\"repo\",\"ttl\":600}", bid, digest);
    keys(bid, digest, ik, bk);
    /* In the bucket, not on the node. */
    struct body entry = {0};
    cr_assert_eq(s3("GET", ik, NULL, &entry), 200, "no index entry %s in the bucket", ik);
    cr_assert(strstr(entry.p, digest), "entry %s", entry.p);
    free(entry.p);
    cr_assert_eq(s3("HEAD", bk, NULL, NULL), 200, "no archive %s in the bucket", bk);
    char local[512];
    snprintf(local, sizeof(local), "%s/backups/blobs/%s.tar.zst", live->dir, digest + 7);
    cr_assert_neq(access(local, F_OK), 0, "the archive is in the local store too: %s", local);

    /* A second backup of the same content shares the archive. */
    char bid2[64], digest2[80];
    backup(c, a, "{\"dir\":\"/workspace/repo\",\"ttl\":600}", bid2, digest2);
    cr_assert_str_eq(digest2, digest);

    /* Restored into another sandbox (the other shard: the node's store is
     * the bucket for both): identical, and replaces what was there. */
    free(sh(c, b, "mkdir -p /workspace/dst && echo old > /workspace/dst/stale"));
    char args[256], code[64];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/dst\"}", bid);
    char *j = call(c, "backup.restore", b, args, code);
    cr_assert(j, "backup.restore: %s", code);
    cr_assert(strstr(j, bid), "the answer does not name the backup: %s", j);
    free(j);
    char *got = sh(c, b, TREE_CMD("/workspace/dst"));
    cr_assert_str_eq(got, want, "the restored repository differs");
    free(got);

    j = call(c, "backup.list", NULL, "{}", code);
    cr_assert(j, "backup.list: %s", code);
    cr_assert(strstr(j, bid) && strstr(j, bid2) && strstr(j, "\"name\":\"repo\""), "%s", j);
    free(j);

    /* Deleting one keeps the shared archive; deleting both removes it. */
    snprintf(args, sizeof(args), "{\"id\":\"%s\"}", bid);
    j = call(c, "backup.delete", NULL, args, code);
    cr_assert(j, "backup.delete: %s", code);
    free(j);
    cr_assert_eq(s3("HEAD", ik, NULL, NULL), 404, "%s left after delete", ik);
    cr_assert_eq(s3("HEAD", bk, NULL, NULL), 200, "the archive %s another backup has is gone", bk);
    fails(c, "backup.delete", NULL, args, "BACKUP_NOT_FOUND");
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/dst\"}", bid);
    fails(c, "backup.restore", b, args, "BACKUP_NOT_FOUND");
    snprintf(args, sizeof(args), "{\"id\":\"%s\"}", bid2);
    j = call(c, "backup.delete", NULL, args, code);
    cr_assert(j, "backup.delete: %s", code);
    free(j);
    cr_assert_eq(s3("HEAD", bk, NULL, NULL), 404, "%s left after the last delete", bk);
    free(want);
    sbx_client_close(c);
}

Test(backup_s3, overwritten_archive_is_refused_and_target_untouched)
{
    sbx_client *c = start_daemon();
    char a[64];
    snprintf(a, sizeof(a), "%ss3-tamper", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/p && head -c 500000 /dev/urandom > /workspace/p/r && "
                  "mkdir -p /workspace/keep && echo mine > /workspace/keep/f"));
    char bid[64], digest[80], ik[128], bk[128];
    backup(c, a, "{\"dir\":\"/workspace/p\"}", bid, digest);
    keys(bid, digest, ik, bk);
    struct body arc = {0};
    cr_assert_eq(s3("GET", bk, NULL, &arc), 200);
    cr_assert_gt(arc.n, 1000);
    /* One byte changed in the middle, through the S3 API. */
    arc.p[arc.n / 2] ^= 0x55;
    cr_assert_eq(s3("PUT", bk, &arc, NULL), 200);
    char args[256];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/keep\"}", bid);
    fails(c, "backup.restore", a, args, "STORAGE_ERROR");
    char *ls = sh(c, a, "cd /workspace/keep && find . | sort && cat f");
    cr_assert_str_eq(ls, ".\n./f\nmine\n", "the target changed: %s", ls);
    free(ls);
    /* Cut short: refused the same way. */
    arc.p[arc.n / 2] ^= 0x55;
    arc.n /= 3;
    cr_assert_eq(s3("PUT", bk, &arc, NULL), 200);
    fails(c, "backup.restore", a, args, "STORAGE_ERROR");
    ls = sh(c, a, "cd /workspace/keep && find . | sort && cat f");
    cr_assert_str_eq(ls, ".\n./f\nmine\n", "the target changed: %s", ls);
    free(ls);
    free(arc.p);
    sbx_client_close(c);
}

Test(backup_s3, expired_backup_is_refused_and_collected)
{
    sbx_client *c = start_daemon();
    char a[64];
    snprintf(a, sizeof(a), "%ss3-ttl", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/t && echo 1 > /workspace/t/one"));
    char bid[64], digest[80], ik[128], bk[128];
    backup(c, a, "{\"dir\":\"/workspace/t\",\"ttl\":1}", bid, digest);
    keys(bid, digest, ik, bk);
    cr_assert_eq(s3("HEAD", bk, NULL, NULL), 200);
    usleep(1500 * 1000);
    char args[256], code[64];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/t2\"}", bid);
    fails(c, "backup.restore", a, args, "BACKUP_EXPIRED");
    char *j = call(c, "backup.list", NULL, "{}", code);
    cr_assert(j, "backup.list: %s", code);
    cr_assert_null(strstr(j, bid), "expired %s still listed: %s", bid, j);
    free(j);
    cr_assert_eq(s3("HEAD", ik, NULL, NULL), 404, "the expired entry %s is left", ik);
    cr_assert_eq(s3("HEAD", bk, NULL, NULL), 404, "the expired archive %s is left", bk);
    fails(c, "backup.restore", a, args, "BACKUP_NOT_FOUND");
    sbx_client_close(c);
}

/* Files in the node's staging dir (<data>/backups/tmp). */
static int
staged(void)
{
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "find %s/backups/tmp -type f | wc -l", live->dir);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    int n = -1;
    cr_assert_eq(fscanf(p, "%d", &n), 1);
    pclose(p);
    return n;
}

Test(backup_s3, server_gone_is_a_clear_error_by_the_deadline)
{
    sbx_client *c = start_daemon();
    char a[64];
    snprintf(a, sizeof(a), "%ss3-gone", test_prefix());
    free(sh(c, a, "mkdir -p /workspace/t && echo 1 > /workspace/t/one && "
                  "mkdir -p /workspace/keep && echo mine > /workspace/keep/f"));
    char bid[64], digest[80];
    backup(c, a, "{\"dir\":\"/workspace/t\"}", bid, digest);
    s3_stop();
    char args[256];
    snprintf(args, sizeof(args), "{\"id\":\"%s\",\"dir\":\"/workspace/keep\"}", bid);
    const char *ops[][3] = {{"backup.list", NULL, "{}"},
                            {"backup.create", a, "{\"dir\":\"/workspace/t\"}"},
                            {"backup.restore", a, args},
                            {"backup.delete", NULL, "{\"id\":\"bk_000000000000000000000001\"}"}};
    for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++) {
        double t0 = test_now_ms();
        fails(c, ops[i][0], ops[i][1], ops[i][2], "BACKUP_STORE_UNAVAILABLE");
        double ms = test_now_ms() - t0;
        /* --s3-timeout 2s per call: a restore makes 1 call, a create 1
         * (HEAD), a list 1, a delete 1 before failing; the bound is that
         * plus generous slack for a loaded machine, far below a hang. */
        cr_assert_lt(ms, 20000, "%s took %.0f ms with the store gone", ops[i][0], ms);
    }
    cr_assert_eq(staged(), 0, "a failed create left its archive staged");
    char *ls = sh(c, a, "cd /workspace/keep && find . | sort && cat f");
    cr_assert_str_eq(ls, ".\n./f\nmine\n", "the target changed: %s", ls);
    free(ls);
    sbx_client_close(c);
}

Test(backup_s3, readable_credentials_file_is_refused)
{
    s3_start();
    write_creds(0644);
    char cmd[2048];
    /* One shard in the foreground: it must refuse to start, saying why. */
    snprintf(cmd, sizeof(cmd),
             "timeout 60 %s/sbxd shard --name %ss3-bad --listen ipc://%s/s.sock --data %s/d "
             "--cgroup none --allow-unlimited --pool 0 --backup-store s3://" BUCKET
             " --s3-endpoint %s --s3-credentials %s 2>&1",
             getenv("SBX_BIN") ? getenv("SBX_BIN") : "build/asan/bin", test_prefix(), s3dir,
             s3dir, s3url, credfile);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    char out[8192] = "";
    size_t n = fread(out, 1, sizeof(out) - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 124,
              "the shard ran (status 0x%x): %s", st, out);
    cr_assert(strstr(out, "not readable by group or others"), "no reason given: %s", out);
}

/* A client whose requests carry `key` (the library reads $SBX_API_KEY). */
static sbx_client *
keyed(const char *key)
{
    setenv("SBX_API_KEY", key, 1);
    sbx_client *c = tc_client(live->url, 60000);
    unsetenv("SBX_API_KEY");
    return c;
}

static void
tenant_key(sbx_client *adm, const char *name, char key[80])
{
    tcall t = tc_call(adm, "tenant.create", NULL,
                      json_pack("{s:s,s:i}", "tenant", name, "createsPerSecond", 1000), 0);
    tc_ok(t, "tenant.create");
    tc_free(&t);
    t = tc_call(adm, "key.create", NULL, json_pack("{s:s}", "tenant", name), 0);
    tc_ok(t, "key.create");
    snprintf(key, 80, "%s", jstr(t.res, "key"));
    tc_free(&t);
}

/* Tenants (docs/security.md §6) with the S3 store: as with the local one,
 * another tenant's backup is an unknown ID to restore and delete, and is not
 * in its list. */
Test(backup_s3, tenants_see_only_their_backups)
{
    char rid[37], admin[80];
    sbx_request_id(rid);
    snprintf(admin, sizeof(admin), "admin-%s", rid);
    start_keyed(admin);
    sbx_client *adm = keyed(admin);
    char ka[80], kb[80];
    tenant_key(adm, "a", ka);
    tenant_key(adm, "b", kb);
    sbx_client *a = keyed(ka), *b = keyed(kb);
    tcall t = tc_call(a, "exec", "bk",
                      json_pack("{s:s}", "command", "mkdir -p /workspace/d && "
                                                    "printf A-BACKUP > /workspace/d/f"), 0);
    tc_ok(t, "exec");
    tc_free(&t);
    t = tc_call(a, "backup.create", "bk", json_pack("{s:s}", "dir", "/workspace/d"), 120000);
    tc_ok(t, "backup.create");
    char bid[64], want[128];
    snprintf(bid, sizeof(bid), "%s", jstr(t.res, "id"));
    tc_free(&t);
    snprintf(want, sizeof(want), "no backup '%s'", bid);

    t = tc_call(b, "backup.restore", "bb",
                json_pack("{s:s,s:s}", "id", bid, "dir", "/workspace/r"), 120000);
    cr_assert_str_eq(t.rc ? t.err.code : "ok", "BACKUP_NOT_FOUND", "B restored A's backup");
    cr_assert_str_eq(t.err.message, want);
    tc_free(&t);
    t = tc_call(b, "backup.delete", NULL, json_pack("{s:s}", "id", bid), 0);
    cr_assert_str_eq(t.rc ? t.err.code : "ok", "BACKUP_NOT_FOUND", "B deleted A's backup");
    cr_assert_str_eq(t.err.message, want);
    tc_free(&t);
    sbx_client *who[] = {b, a, adm};
    const bool sees[] = {false, true, true};
    for (int k = 0; k < 3; k++) {
        t = tc_call(who[k], "backup.list", NULL, NULL, 0);
        tc_ok(t, "backup.list");
        bool seen = false;
        size_t n;
        json_t *it;
        json_array_foreach(jget(t.res, "backups"), n, it) seen |= !strcmp(jstr(it, "id"), bid);
        cr_assert_eq(seen, sees[k], "backup.list of client %d", k);
        tc_free(&t);
    }
    /* Still there for A. */
    t = tc_call(a, "backup.restore", "bk",
                json_pack("{s:s,s:s}", "id", bid, "dir", "/workspace/r"), 120000);
    tc_ok(t, "A's restore");
    tc_free(&t);
    t = tc_call(a, "exec", "bk", json_pack("{s:s}", "command", "cat /workspace/r/f"), 0);
    tc_ok(t, "exec");
    cr_assert_str_eq(jstr(t.res, "stdout"), "A-BACKUP");
    tc_free(&t);
    sbx_client_close(a);
    sbx_client_close(b);
    sbx_client_close(adm);
}
