/*
 * test_s3_store.c — the S3 store's client (container/backup_s3.c) against a
 * scripted HTTP server on a loopback port (a thread of this test): what a
 * real service does rarely and s3rver never (tests/integration/
 * test_backup_s3.c covers the rest): 5xx answers retried with back-off
 * until one succeeds; a 4xx refused at once as BACKUP_STORE_UNAVAILABLE
 * with S3's code; a server that accepts the connection and never answers
 * ends by the call's deadline; ListObjectsV2 pages followed by their
 * continuation token; a missing entry is BACKUP_NOT_FOUND but a missing
 * bucket is the store's error; requests are SigV4-signed.  And the
 * settings: bad URLs, endpoints and credentials are refused with the reason.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <curl/curl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../container/backup_s3.h"
#include "../../runtime/err.h"

/* The scripted server: answers the i-th request with script[i] (the last
 * one again past the end) and records the requests' heads. */
struct answer {
    int status;
    const char *body;
};

struct srv {
    int fd;
    int port;
    const struct answer *script;
    int nscript;
    int served;
    char heads[8][4096];
    pthread_t t;
};

static void *
srv_main(void *arg)
{
    struct srv *s = arg;
    for (;;) {
        int c = accept(s->fd, NULL, NULL);
        if (c < 0)
            return NULL;
        char head[4096];
        size_t n = 0;
        while (n < sizeof(head) - 1) {
            ssize_t r = read(c, head + n, sizeof(head) - 1 - n);
            if (r <= 0)
                break;
            n += (size_t)r;
            head[n] = '\0';
            if (strstr(head, "\r\n\r\n"))
                break;
        }
        head[n] = '\0';
        int i = s->served < s->nscript ? s->served : s->nscript - 1;
        if (s->served < 8)
            snprintf(s->heads[s->served], sizeof(s->heads[0]), "%s", head);
        s->served++;
        const struct answer *a = &s->script[i];
        char out[8192];
        int len = snprintf(out, sizeof(out),
                           "HTTP/1.1 %d X\r\nContent-Type: application/xml\r\n"
                           "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
                           a->status, strlen(a->body), a->body);
        ssize_t w = write(c, out, (size_t)len);
        (void)w;
        close(c);
    }
}

/* Listen on a loopback port; serve the script on a thread if script. */
static void
srv_start(struct srv *s, const struct answer *script, int nscript)
{
    memset(s, 0, sizeof(*s));
    s->fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_geq(s->fd, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(s->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    cr_assert_eq(listen(s->fd, 16), 0);
    socklen_t sl = sizeof(sa);
    getsockname(s->fd, (struct sockaddr *)&sa, &sl);
    s->port = ntohs(sa.sin_port);
    s->script = script;
    s->nscript = nscript;
    if (script)
        cr_assert_eq(pthread_create(&s->t, NULL, srv_main, s), 0);
}

static void
srv_stop(struct srv *s)
{
    shutdown(s->fd, SHUT_RDWR);
    if (s->script)
        pthread_join(s->t, NULL);
    close(s->fd);
}

static struct sbx_s3 *
client(const struct srv *s, int64_t timeout_ms)
{
    char ep[64];
    snprintf(ep, sizeof(ep), "http://127.0.0.1:%d", s->port);
    setenv("AWS_ACCESS_KEY_ID", "AKIDTEST", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
    struct sbx_s3_conf c = {.url = "s3://bkt/pre", .endpoint = ep, .timeout_ms = timeout_ms};
    struct sbx_s3 *s3 = NULL;
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_s3_new(&c, &s3, &err), 0, "%s", sbx_err_msg(err));
    return s3;
}

static void
setup(void)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

TestSuite(s3_store, .init = setup, .timeout = 60);

#define EMPTY_LIST                                                                            \
    "<?xml version=\"1.0\"?><ListBucketResult><Name>bkt</Name><KeyCount>0</KeyCount>"     \
    "<IsTruncated>false</IsTruncated></ListBucketResult>"

Test(s3_store, server_errors_are_retried_until_one_succeeds)
{
    const struct answer script[] = {{503, "<Error><Code>SlowDown</Code></Error>"},
                                    {500, "<Error><Code>InternalError</Code></Error>"},
                                    {200, EMPTY_LIST}};
    struct srv s;
    srv_start(&s, script, 3);
    struct sbx_s3 *s3 = client(&s, 10000);
    struct sbx_backup_info *v = NULL;
    size_t n = 99;
    sbx_err_t err = NULL;
    int rc = sbx_s3_store_list(s3, &v, &n, &err);
    srv_stop(&s);
    cr_assert_eq(rc, 0, "%s", sbx_err_msg(err));
    cr_assert_eq(n, 0);
    cr_assert_eq(s.served, 3, "%d requests", s.served);
    /* Path-style, signed, payload hash header. */
    cr_assert(strstr(s.heads[0], "GET /bkt?list-type=2&prefix=pre%2Findex%2F HTTP/1.1"), "%s",
              s.heads[0]);
    cr_assert(strstr(s.heads[2], "Authorization: AWS4-HMAC-SHA256 Credential=AKIDTEST/"), "%s",
              s.heads[2]);
    cr_assert(strstr(s.heads[2], "/us-east-1/s3/aws4_request"), "%s", s.heads[2]);
    cr_assert(strstr(s.heads[2], "x-amz-content-sha256: UNSIGNED-PAYLOAD"), "%s", s.heads[2]);
    free(v);
    sbx_s3_free(s3);
}

Test(s3_store, a_refusal_is_not_retried_and_says_why)
{
    const struct answer script[] = {{403, "<Error><Code>AccessDenied</Code></Error>"}};
    struct srv s;
    srv_start(&s, script, 1);
    struct sbx_s3 *s3 = client(&s, 10000);
    struct sbx_backup_info *v = NULL;
    size_t n = 0;
    sbx_err_t err = NULL;
    int rc = sbx_s3_store_list(s3, &v, &n, &err);
    srv_stop(&s);
    cr_assert_eq(rc, SBX_E_BACKUP_STORE_UNAVAILABLE);
    cr_assert(strstr(sbx_err_msg(err), "403") && strstr(sbx_err_msg(err), "AccessDenied"), "%s",
              sbx_err_msg(err));
    cr_assert_eq(s.served, 1);
    sbx_err_release(&err);
    sbx_s3_free(s3);
}

Test(s3_store, a_server_that_never_answers_ends_by_the_deadline)
{
    struct srv s;
    srv_start(&s, NULL, 0); /* listens (the kernel completes connects), never answers */
    struct sbx_s3 *s3 = client(&s, 1000);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    sbx_err_t err = NULL;
    int rc = sbx_s3_store_delete(s3, "bk_000000000000000000000001", &err);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    srv_stop(&s);
    double ms = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6;
    cr_assert_eq(rc, SBX_E_BACKUP_STORE_UNAVAILABLE, "%s", sbx_err_msg(err));
    /* The deadline is 1 s; slack for a loaded machine, far below a hang. */
    cr_assert_lt(ms, 10000, "returned after %.0f ms", ms);
    sbx_err_release(&err);
    sbx_s3_free(s3);
}

Test(s3_store, list_pages_are_followed)
{
    const struct answer script[] = {
        {200, "<ListBucketResult><Contents><Key>pre/index/x</Key></Contents>"
              "<IsTruncated>true</IsTruncated><NextContinuationToken>t/1=</NextContinuationToken>"
              "</ListBucketResult>"},
        {200, EMPTY_LIST}};
    struct srv s;
    srv_start(&s, script, 2);
    struct sbx_s3 *s3 = client(&s, 10000);
    struct sbx_backup_info *v = NULL;
    size_t n = 0;
    sbx_err_t err = NULL;
    int rc = sbx_s3_store_list(s3, &v, &n, &err);
    srv_stop(&s);
    cr_assert_eq(rc, 0, "%s", sbx_err_msg(err));
    cr_assert_eq(s.served, 2);
    cr_assert(strstr(s.heads[1], "&continuation-token=t%2F1%3D "), "%s", s.heads[1]);
    free(v);
    sbx_s3_free(s3);
}

Test(s3_store, missing_entry_and_missing_bucket_differ)
{
    const struct answer nokey[] = {{404, "<Error><Code>NoSuchKey</Code></Error>"}};
    const struct answer nobucket[] = {{404, "<Error><Code>NoSuchBucket</Code></Error>"}};
    const struct answer *scripts[] = {nokey, nobucket};
    const int want[] = {SBX_E_BACKUP_NOT_FOUND, SBX_E_BACKUP_STORE_UNAVAILABLE};
    for (int i = 0; i < 2; i++) {
        struct srv s;
        srv_start(&s, scripts[i], 1);
        struct sbx_s3 *s3 = client(&s, 10000);
        struct sbx_backup_info info;
        sbx_err_t err = NULL;
        FILE *f = tmpfile();
        cr_assert(f);
        int rc = sbx_s3_store_lookup(s3, "bk_000000000000000000000001", &info, &err);
        fclose(f);
        srv_stop(&s);
        cr_assert_eq(rc, want[i], "%d: %s", i, sbx_err_msg(err));
        cr_assert(strstr(s.heads[0], "GET /bkt/pre/index/bk_000000000000000000000001.json "),
                  "%s", s.heads[0]);
        sbx_err_release(&err);
        sbx_s3_free(s3);
    }
}

Test(s3_store, bad_settings_are_refused)
{
    setenv("AWS_ACCESS_KEY_ID", "k", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "s", 1);
    const char *bad_urls[] = {"http://bkt", "s3://", "s3://ab", "s3://bkt/a b", "s3://bkt//x",
                              "s3://bkt/../x", "s3://bkt/x?y"};
    for (size_t i = 0; i < sizeof(bad_urls) / sizeof(bad_urls[0]); i++) {
        struct sbx_s3_conf c = {.url = bad_urls[i]};
        struct sbx_s3 *s3 = NULL;
        sbx_err_t err = NULL;
        cr_assert_eq(sbx_s3_new(&c, &s3, &err), SBX_E_VALIDATION, "%s accepted", bad_urls[i]);
        cr_assert_null(s3);
        sbx_err_release(&err);
    }
    struct sbx_s3_conf c = {.url = "s3://bkt/p", .endpoint = "ftp://x"};
    struct sbx_s3 *s3 = NULL;
    sbx_err_t err = NULL;
    cr_assert_eq(sbx_s3_new(&c, &s3, &err), SBX_E_VALIDATION);
    sbx_err_release(&err);
    c.endpoint = "http://127.0.0.1:9/path";
    cr_assert_eq(sbx_s3_new(&c, &s3, &err), SBX_E_VALIDATION);
    sbx_err_release(&err);
    /* No credentials anywhere. */
    c.endpoint = NULL;
    unsetenv("AWS_SECRET_ACCESS_KEY");
    cr_assert_eq(sbx_s3_new(&c, &s3, &err), SBX_E_VALIDATION);
    cr_assert(strstr(sbx_err_msg(err), "credentials"), "%s", sbx_err_msg(err));
    sbx_err_release(&err);
    /* A file others may read, then the same file private. */
    char path[] = "/tmp/sbx-s3creds-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    const char *text = "AWS_ACCESS_KEY_ID=k\nAWS_SECRET_ACCESS_KEY=s\n";
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    chmod(path, 0640);
    c.cred_file = path;
    cr_assert_eq(sbx_s3_new(&c, &s3, &err), SBX_E_VALIDATION);
    cr_assert(strstr(sbx_err_msg(err), "not readable by group or others"), "%s",
              sbx_err_msg(err));
    sbx_err_release(&err);
    chmod(path, 0600);
    cr_assert_eq(sbx_s3_new(&c, &s3, &err), 0, "%s", sbx_err_msg(err));
    cr_assert_str_eq(sbx_s3_describe(s3), "s3://bkt/p/ at https://s3.us-east-1.amazonaws.com");
    sbx_s3_free(s3);
    unlink(path);
}
