/* harness.c — see harness.h. */
#include "harness.h"
#include "hostlocks.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../../runtime/wire.h"

double
test_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1000.0 + (double)ts.tv_nsec / 1e6;
}

static const char *
bindir(void)
{
    const char *b = getenv("SBX_BIN");
    return b && *b ? b : "build/asan/bin";
}

int
testd_wait_ready(const char *url, int timeout_ms)
{
    double until = test_now_ms() + timeout_ms;
    while (test_now_ms() < until) {
        sbx_client *c = NULL;
        sbx_error err;
        if (sbx_client_open(&c, url, &err) == 0) {
            sbx_reply *r = NULL;
            if (sbx_call(c, "cluster.status", NULL, NULL, 0, 2000, NULL, &r, &err) == 0) {
                const msgpack_object *arr;
                bool all = true;
                if (sbx_wire_get_array(sbx_reply_result(r), "shards", &arr) == 0) {
                    for (uint32_t i = 0; i < arr->via.array.size; i++) {
                        sbx_str h = {"", 0};
                        sbx_wire_get_str(&arr->via.array.ptr[i], "health", &h);
                        if (!sbx_str_eq(h, "ok"))
                            all = false;
                    }
                }
                sbx_reply_free(r);
                sbx_client_close(c);
                if (all)
                    return 0;
            } else {
                sbx_error_free(&err);
                sbx_client_close(c);
            }
        }
        usleep(50 * 1000);
    }
    return -1;
}

static int
spawn(struct testd *d, int shards, const char *const *extra)
{
    char sbxd[512], nsh[16];
    snprintf(sbxd, sizeof(sbxd), "%s/sbxd", bindir());
    snprintf(nsh, sizeof(nsh), "%d", shards);
    const char *argv[64];
    int n = 0;
    argv[n++] = sbxd;
    argv[n++] = "dev";
    argv[n++] = "--data";
    argv[n++] = d->dir;
    argv[n++] = "--listen";
    argv[n++] = d->url;
    argv[n++] = "--name";
    argv[n++] = d->name;
    argv[n++] = "--shards";
    argv[n++] = nsh;
    /* The HTTP front on a port of the kernel's choosing (http.addr says which). */
    argv[n++] = "--http";
    argv[n++] = "127.0.0.1:0";
    for (int i = 0; extra && extra[i] && n < 62; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int fd = open(d->log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        setpgid(0, 0);
        /* A test binary that dies (crash, timeout kill) takes its daemon with it. */
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        if (getppid() == 1)
            _exit(127);
        execv(sbxd, (char *const *)argv);
        _exit(127);
    }
    d->pid = pid;
    return 0;
}

static void
print_log(const struct testd *d)
{
    char *buf = NULL;
    size_t n;
    if (sbx_fs_read(d->log, 1 << 20, &buf, &n) == 0) {
        fprintf(stderr, "---- sbxd log (%s) ----\n%s\n---- end ----\n", d->log, buf);
        free(buf);
    }
}

int
testd_start(struct testd *d, int shards, const char *const *extra)
{
    memset(d, 0, sizeof(*d));
    snprintf(d->dir, sizeof(d->dir), "/tmp/sbx-test-%sXXXXXX", test_prefix());
    if (!mkdtemp(d->dir))
        return -1;
    /* Shard and cgroup names derive from this: unique per test binary run. */
    snprintf(d->name, sizeof(d->name), "t%s", strrchr(d->dir, '-') + 1);
    for (char *p = d->name; *p; p++)
        if (*p >= 'A' && *p <= 'Z')
            *p = (char)(*p - 'A' + 'a');
        else if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9')))
            *p = 'x';
    snprintf(d->url, sizeof(d->url), "ipc://%s/gw.sock", d->dir);
    snprintf(d->log, sizeof(d->log), "%s/sbxd.log", d->dir);
    if (spawn(d, shards, extra) != 0)
        return -1;
    if (testd_wait_ready(d->url, 30000) != 0) {
        print_log(d);
        testd_stop(d); /* by pid; a daemon that never became ready is no one's to keep */
        return -1;
    }
    return 0;
}

static void
stop_pid(struct testd *d)
{
    if (d->pid <= 0)
        return;
    kill(d->pid, SIGTERM);
    double until = test_now_ms() + 20000;
    int st;
    while (waitpid(d->pid, &st, WNOHANG) == 0) {
        if (test_now_ms() > until) {
            fprintf(stderr, "harness: sbxd %d did not stop in 20 s; killing it\n", (int)d->pid);
            kill(d->pid, SIGKILL);
            waitpid(d->pid, &st, 0);
            break;
        }
        usleep(10 * 1000);
    }
    if (WIFEXITED(st) && WEXITSTATUS(st) != 0)
        print_log(d);
    d->pid = 0;
}

void
testd_stop(struct testd *d)
{
    stop_pid(d);
    /* A daemon or shard the test SIGKILLed left its host-lock files. */
    if (d->name[0])
        test_hostlocks_sweep(d->name);
    if (d->dir[0] && !getenv("SBX_KEEP_TEST_DATA"))
        sbx_rm_rf(d->dir);
}

int
testd_restart(struct testd *d, int shards, const char *const *extra)
{
    stop_pid(d);
    if (spawn(d, shards, extra) != 0)
        return -1;
    if (testd_wait_ready(d->url, 30000) != 0) {
        print_log(d);
        testd_stop(d); /* by pid; a daemon that never became ready is no one's to keep */
        return -1;
    }
    return 0;
}

const char *
test_url(void)
{
    const char *u = getenv("SBX_TEST_URL");
    return u ? u : "tcp://127.0.0.1:7700";
}

const char *
test_prefix(void)
{
    const char *p = getenv("SBX_TEST_PREFIX");
    if (!p || strlen(p) > 8)
        return "";
    for (const char *c = p; *c; c++)
        if (!((*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9')))
            return "";
    return p;
}

const char *
test_http_url(void)
{
    static char url[128];
    if (url[0])
        return url;
    const char *dir = getenv("SBX_TEST_DIR");
    char path[512], *text = NULL;
    size_t n;
    snprintf(path, sizeof(path), "%s/http.addr", dir ? dir : "/nonexistent");
    if (sbx_fs_read(path, 256, &text, &n) != 0) {
        fprintf(stderr, "harness: no HTTP address in %s\n", path);
        abort();
    }
    text[strcspn(text, "\n")] = 0;
    snprintf(url, sizeof(url), "http://%s", text);
    free(text);
    return url;
}

sbx_client *
test_client(void)
{
    sbx_client *c = NULL;
    sbx_error err;
    if (sbx_client_open(&c, test_url(), &err) != 0) {
        fprintf(stderr, "harness: cannot connect to %s: %s %s\n", test_url(), err.code, err.message);
        abort();
    }
    return c;
}

char *
test_id(const char *prefix)
{
    static atomic_uint counter;
    char buf[64];
    snprintf(buf, sizeof(buf), "%s-%d-%u", prefix, (int)getpid(), atomic_fetch_add(&counter, 1));
    return sbx_xstrdup(buf);
}

int
test_sh(sbx_client *c, const char *sandbox, const char *cmd, int64_t timeout_ms,
        sbx_exec_result *r, sbx_error *err)
{
    sbx_exec_opts o = {.command = cmd, .timeout_ms = timeout_ms};
    return sbx_exec(c, sandbox, &o, r, err);
}

char *
test_sh_out(sbx_client *c, const char *sandbox, const char *cmd, int64_t timeout_ms, int *code,
            char *why, size_t whylen)
{
    sbx_exec_result r;
    sbx_error err;
    for (int i = 0; i < 300; i++) {
        if (test_sh(c, sandbox, cmd, timeout_ms, &r, &err) == 0) {
            char *out = strdup(r.stdout_data ? r.stdout_data : "");
            if (code)
                *code = r.exit_code;
            sbx_exec_result_free(&r);
            return out;
        }
        bool away = !strcmp(err.code, "SHARD_UNAVAILABLE") || !strcmp(err.code, "UNAVAILABLE") ||
                    !strcmp(err.code, "INTERRUPTED") || !strcmp(err.code, "TIMEOUT");
        snprintf(why, whylen, "exec '%s' in %s: %s %s", cmd, sandbox, err.code, err.message);
        sbx_error_free(&err);
        if (!away)
            break;
        usleep(200 * 1000);
    }
    return NULL;
}

int64_t
test_memory_bytes(sbx_client *c, const char *sandbox)
{
    sbx_reply *r = NULL;
    sbx_error err;
    int64_t v = -1;
    if (sbx_call_json(c, "status", sandbox, "{}", 30000, &r, &err) != 0) {
        sbx_error_free(&err);
        return -1;
    }
    const msgpack_object *sb, *ct;
    if (sbx_wire_get_map(sbx_reply_result(r), "sandbox", &sb) == 0 &&
        sbx_wire_get_map(sb, "container", &ct) == 0)
        sbx_wire_get_i64(ct, "memoryBytes", &v);
    sbx_reply_free(r);
    return v;
}

int
test_tmpfs_mount(char *dir, size_t n, const char *tag, const char *size)
{
    char opts[64];
    snprintf(dir, n, "/tmp/sbx-%s-%sXXXXXX", tag, test_prefix());
    snprintf(opts, sizeof(opts), "size=%s,mode=0700", size);
    if (!mkdtemp(dir))
        return -1;
    if (mount("tmpfs", dir, "tmpfs", MS_NOSUID | MS_NODEV, opts) != 0) {
        int e = errno;
        rmdir(dir);
        errno = e;
        return -1;
    }
    return 0;
}

void
test_tmpfs_remove(const char *dir)
{
    if (!dir[0])
        return;
    umount2(dir, MNT_DETACH);
    rmdir(dir);
}

pid_t
test_ppid(pid_t pid)
{
    char path[64], *buf = NULL;
    size_t n;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)pid);
    if (sbx_fs_read(path, 1 << 16, &buf, &n) != 0)
        return -1;
    const char *p = strstr(buf, "\nPPid:");
    pid_t pp = p ? (pid_t)atoi(p + 6) : -1;
    free(buf);
    return pp;
}

long long
test_json_int(const char *json, const char *key)
{
    char k[64];
    snprintf(k, sizeof(k), "\"%s\":", key);
    const char *p = strstr(json, k);
    return p ? strtoll(p + strlen(k), NULL, 10) : -1;
}

pid_t
test_child_of(pid_t parent, pid_t not)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    pid_t found = -1;
    while (d && (de = readdir(d)) != NULL) {
        pid_t p = (pid_t)atoi(de->d_name);
        if (p > 0 && p != not && test_ppid(p) == parent) {
            found = p;
            break;
        }
    }
    if (d)
        closedir(d);
    return found;
}
