/*
 * test_image_pull.c — images pulled from a registry (docs/images.md, "Pull"
 * and "Pull on demand"), against a real registry: Debian's docker-registry
 * (the CNCF distribution registry), started by each test on a free loopback
 * port with its storage in the test's temp directory, and the test image
 * (tests/support/imgbuild.h) pushed to it by skopeo.  A loopback registry
 * is plain HTTP, as Docker allows for 127.0.0.0/8 by default.
 *
 * Checks what a user would:
 *  - `create {image: "127.0.0.1:PORT/sbxtest/pulled:1"}` of an image no node
 *    has pulls it and the sandbox runs it (its /etc/os-release), and the
 *    image is listed under that name;
 *  - six concurrent creates of one new image pull it once: the registry
 *    served its layer blob once (its access log);
 *  - an image the registry does not have, and a registry nobody listens
 *    on, are IMAGE_NOT_FOUND with the registry's reason, answered before the
 *    call's deadline, and leave no sandbox; a short name ("nosuch:1") is
 *    not guessed into a registry: IMAGE_NOT_FOUND with a hint;
 *  - `image.pull` of the name pulls it again (a moved tag is followed).
 *
 * Each test's registry is stopped by pid and its directory removed by the
 * suite's fini.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/cleanup.h"
#include "../../runtime/util.h"
#include "../support/harness.h"
#include "../support/imgbuild.h"

static char work[128];
static pid_t reg_pid;
static int reg_port;

static void
cleanup(void)
{
    if (reg_pid > 0) {
        kill(reg_pid, SIGTERM);
        waitpid(reg_pid, NULL, 0);
        reg_pid = 0;
    }
    if (work[0]) {
        sbx_rm_rf(work);
        work[0] = '\0';
    }
}

TestSuite(pull, .fini = cleanup);

/* A free loopback TCP port (bound then released). */
static int
free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t n = sizeof(a);
    cr_assert(fd >= 0);
    cr_assert_eq(bind(fd, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&a, &n), 0);
    close(fd);
    return ntohs(a.sin_port);
}

static bool
port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

/* Start a registry on a free loopback port, its storage and access log
 * (registry.log) under work/. */
static void
start_registry(void)
{
    snprintf(work, sizeof(work), "/tmp/sbx-pull-%s-XXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(work), "mkdtemp: %s", strerror(errno));
    reg_port = free_port();
    char conf[256];
    snprintf(conf, sizeof(conf), "%s/registry.yml", work);
    FILE *f = fopen(conf, "w");
    cr_assert_not_null(f);
    fprintf(f,
            "version: 0.1\n"
            "log:\n  level: info\n  accesslog:\n    disabled: false\n"
            "storage:\n  filesystem:\n    rootdirectory: %s/registry\n  delete:\n    enabled: true\n"
            "http:\n  addr: 127.0.0.1:%d\n",
            work, reg_port);
    fclose(f);
    char log[256];
    snprintf(log, sizeof(log), "%s/registry.log", work);
    reg_pid = fork();
    cr_assert(reg_pid >= 0);
    if (reg_pid == 0) {
        int lfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
        if (lfd >= 0) {
            dup2(lfd, 1);
            dup2(lfd, 2);
        }
        execlp("docker-registry", "docker-registry", "serve", conf, (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 200 && !port_open(reg_port); i++) {
        cr_assert_eq(waitpid(reg_pid, NULL, WNOHANG), 0,
                     "docker-registry exited at start (tools/deps.sh installs it); see %s", log);
        usleep(25 * 1000);
    }
    cr_assert(port_open(reg_port), "docker-registry did not listen on 127.0.0.1:%d", reg_port);
}

/* Build the test image (its os-release ID=osid) and push it to the
 * registry as repo:tag. */
static void
push_image(const char *osid, const char *repo_tag)
{
    size_t nb = 0;
    struct imgb_entry *base = imgb_base_entries(&nb);
    cr_assert(base, "busybox-static is not installed (tools/deps.sh)");
    base = realloc(base, (nb + 2) * sizeof(*base));
    char osr[96];
    snprintf(osr, sizeof(osr), "ID=%s\n", osid);
    base[nb++] = (struct imgb_entry){'d', strdup("etc"), NULL, 0};
    base[nb++] = (struct imgb_entry){'f', strdup("etc/os-release"), strdup(osr), 0};
    char l0[256], d0[72], dir[256], digest[72];
    snprintf(l0, sizeof(l0), "%s/%s-0.tar.gz", work, osid);
    cr_assert_eq(imgb_layer(l0, base, nb, true, d0), 0);
    imgb_entries_free(base, nb);
    char *layers[] = {l0};
    const char *diffs[] = {d0};
    snprintf(dir, sizeof(dir), "%s/%s", work, osid);
    cr_assert_eq(imgb_layout(dir, layers, diffs, 1, true, "\"Env\":[\"PATH=/usr/bin:/bin\"]",
                             digest),
                 0);
    char cmd[1024];
    snprintf(cmd, sizeof(cmd),
             "skopeo copy --quiet --dest-tls-verify=false oci:%s docker://127.0.0.1:%d/%s "
             ">>%s/skopeo.log 2>&1",
             dir, reg_port, repo_tag, work);
    cr_assert_eq(system(cmd), 0, "skopeo could not push to the test registry (%s/skopeo.log)",
                 work);
}

/* op with JSON args; the result (heap) or NULL with the code in code[64]. */
static char *
call(const char *op, const char *id, const char *args, int64_t timeout_ms, char code[64],
     char msg[512])
{
    sbx_client *c = test_client();
    sbx_reply *r = NULL;
    sbx_error err;
    code[0] = 0;
    msg[0] = 0;
    char *j = NULL;
    if (sbx_call_json(c, op, id, args, timeout_ms, &r, &err) != 0) {
        snprintf(code, 64, "%s", err.code);
        snprintf(msg, 512, "%s", err.message);
        sbx_error_free(&err);
    } else {
        j = sbx_reply_json(r, false);
        sbx_reply_free(r);
    }
    sbx_client_close(c);
    return j;
}

static char *
sh(const char *id, const char *cmd)
{
    sbx_client *c = test_client();
    sbx_exec_result r;
    sbx_error err;
    int rc = test_sh(c, id, cmd, 30000, &r, &err);
    cr_assert_eq(rc, 0, "exec '%s' in %s: %s %s", cmd, id, rc ? err.code : "",
                 rc ? err.message : "");
    char *out = strdup(r.stdout_data ? r.stdout_data : "");
    sbx_exec_result_free(&r);
    sbx_client_close(c);
    return out;
}

/* How many lines of the registry's log hold both a and b. */
static int
log_count(const char *a, const char *b)
{
    char p[256], line[8192];
    snprintf(p, sizeof(p), "%s/registry.log", work);
    FILE *f = fopen(p, "r");
    cr_assert_not_null(f);
    int n = 0;
    while (fgets(line, sizeof(line), f))
        n += strstr(line, a) && strstr(line, b);
    fclose(f);
    return n;
}

Test(pull, a_create_pulls_an_image_by_its_registry_name_on_demand, .timeout = 240)
{
    start_registry();
    push_image("pulled", "sbxtest/pulled:1");
    char ref[128], args[256], code[64], msg[512];
    snprintf(ref, sizeof(ref), "127.0.0.1:%d/sbxtest/pulled:1", reg_port);
    _cleanup_free_ char *id = test_id("pull");
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", ref);
    _cleanup_free_ char *res = call("create", id, args, 120000, code, msg);
    cr_assert_not_null(res, "create of a registry image no node has: %s %s", code, msg);
    _cleanup_free_ char *os = sh(id, "cat /etc/os-release");
    cr_expect_str_eq(os, "ID=pulled\n", "the sandbox does not run the pulled image");
    _cleanup_free_ char *list = call("image.list", NULL, "{}", 30000, code, msg);
    cr_assert_not_null(list, "image.list: %s %s", code, msg);
    cr_expect(strstr(list, ref), "the pulled image is not listed under its name: %s", list);
    /* A second sandbox of it does not pull again: its manifest was asked
     * for by the one pull only. */
    int before = log_count("GET /v2/sbxtest/pulled/manifests/1", "HTTP/1.1\" 200");
    _cleanup_free_ char *id2 = test_id("pull");
    _cleanup_free_ char *res2 = call("create", id2, args, 60000, code, msg);
    cr_assert_not_null(res2, "second create: %s %s", code, msg);
    cr_expect_eq(log_count("GET /v2/sbxtest/pulled/manifests/1", "HTTP/1.1\" 200"), before,
                 "a create of an image the node has asked the registry again");
    free(call("destroy", id, "{}", 30000, code, msg));
    free(call("destroy", id2, "{}", 30000, code, msg));
}

struct creator {
    char id[80];
    char args[256];
    char code[64];
    char msg[512];
    bool ok;
};

static void *
create_thread(void *arg)
{
    struct creator *c = arg;
    char *res = call("create", c->id, c->args, 120000, c->code, c->msg);
    c->ok = res != NULL;
    free(res);
    return NULL;
}

Test(pull, concurrent_creates_of_a_new_image_pull_it_once, .timeout = 240)
{
    start_registry();
    push_image("burst", "sbxtest/burst:1");
    enum { N = 6 };
    struct creator cs[N];
    pthread_t th[N];
    for (int i = 0; i < N; i++) {
        memset(&cs[i], 0, sizeof(cs[i]));
        char *id = test_id("burst");
        snprintf(cs[i].id, sizeof(cs[i].id), "%s", id);
        free(id);
        snprintf(cs[i].args, sizeof(cs[i].args),
                 "{\"image\":\"127.0.0.1:%d/sbxtest/burst:1\"}", reg_port);
        cr_assert_eq(pthread_create(&th[i], NULL, create_thread, &cs[i]), 0);
    }
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < N; i++) {
        cr_expect(cs[i].ok, "create %d: %s %s", i, cs[i].code, cs[i].msg);
        if (cs[i].ok) {
            _cleanup_free_ char *os = sh(cs[i].id, "cat /etc/os-release");
            cr_expect_str_eq(os, "ID=burst\n");
        }
    }
    /* The layer's blob: one GET, whatever the number of creates (the test
     * daemon's two shards share the node's store and its pull locks). */
    int blobs = log_count("GET /v2/sbxtest/burst/blobs/sha256:", "HTTP/1.1\" 200");
    cr_expect_gt(blobs, 0, "no blob was served (is the access log on?)");
    cr_expect_leq(blobs, 2, "%d blob GETs for %d creates of one image of 1 layer (and a "
                            "config): it was pulled more than once",
                  blobs, N);
    char code[64], msg[512];
    for (int i = 0; i < N; i++)
        free(call("destroy", cs[i].id, "{}", 30000, code, msg));
}

Test(pull, what_cannot_be_pulled_is_image_not_found_in_time_and_leaves_no_sandbox,
     .timeout = 240)
{
    start_registry();
    char args[256], code[64], msg[512];
    /* Not in the registry. */
    _cleanup_free_ char *id = test_id("nopull");
    snprintf(args, sizeof(args), "{\"image\":\"127.0.0.1:%d/sbxtest/none:1\"}", reg_port);
    double t0 = test_now_ms();
    _cleanup_free_ char *r1 = call("create", id, args, 60000, code, msg);
    cr_assert_null(r1, "a create of an image the registry lacks succeeded");
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    cr_expect(strstr(msg, "sbxtest/none"), "the message does not name the image: %s", msg);
    cr_expect_lt(test_now_ms() - t0, 61000.0, "answered after the call's deadline");
    _cleanup_free_ char *st = call("status", id, "{}", 30000, code, msg);
    cr_expect(!st || strstr(st, "\"exists\":false"),
              "a failed create left a sandbox: %s", st ? st : "");
    /* Nobody listens there. */
    _cleanup_free_ char *id2 = test_id("nopull");
    snprintf(args, sizeof(args), "{\"image\":\"127.0.0.1:%d/sbxtest/none:1\"}", free_port());
    _cleanup_free_ char *r2 = call("create", id2, args, 60000, code, msg);
    cr_assert_null(r2, "a create from a registry nobody runs succeeded");
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    /* A short name is not guessed into a registry. */
    _cleanup_free_ char *id3 = test_id("nopull");
    _cleanup_free_ char *r3 = call("create", id3, "{\"image\":\"nosuch:1\"}", 30000, code, msg);
    cr_assert_null(r3);
    cr_expect_str_eq(code, "IMAGE_NOT_FOUND", "%s", msg);
    cr_expect_eq(log_count("nosuch", ""), 0, "a short name reached the registry");
}

Test(pull, an_explicit_pull_follows_a_moved_tag, .timeout = 240)
{
    start_registry();
    push_image("first", "sbxtest/moving:1");
    char ref[128], args[256], code[64], msg[512];
    snprintf(ref, sizeof(ref), "127.0.0.1:%d/sbxtest/moving:1", reg_port);
    snprintf(args, sizeof(args), "{\"ref\":\"%s\"}", ref);
    _cleanup_free_ char *p1 = call("image.pull", NULL, args, 120000, code, msg);
    cr_assert_not_null(p1, "image.pull: %s %s", code, msg);
    push_image("second", "sbxtest/moving:1");
    _cleanup_free_ char *p2 = call("image.pull", NULL, args, 120000, code, msg);
    cr_assert_not_null(p2, "image.pull again: %s %s", code, msg);
    _cleanup_free_ char *id = test_id("moved");
    snprintf(args, sizeof(args), "{\"image\":\"%s\"}", ref);
    _cleanup_free_ char *res = call("create", id, args, 60000, code, msg);
    cr_assert_not_null(res, "create: %s %s", code, msg);
    _cleanup_free_ char *os = sh(id, "cat /etc/os-release");
    cr_expect_str_eq(os, "ID=second\n", "the name does not follow the moved tag");
    free(call("destroy", id, "{}", 30000, code, msg));
}
