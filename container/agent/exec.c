/*
 * exec.c — commands run as fresh processes, and what sessions share with
 * them: argument parsing, spawning, bounded output capture, the process-tree
 * kill and the result shape.
 *
 * A fresh command (the SDK's "sessionless" mode) is `/bin/sh -c CMD` or an
 * argv, started by fork+exec from this single-threaded PID 1 with stdout and
 * stderr on two pipes.  The child is made a child subreaper
 * (prctl(2) PR_SET_CHILD_SUBREAPER) and the leader of a new session, so
 * every process it starts stays in its subtree even when a middle process
 * exits: a timeout can then kill the whole tree by walking /proc, as the
 * SDK's process kill does, without missing double-forked children.
 *
 * The reply is sent when the command's own process has exited and its
 * output has been drained.  Background children that keep the pipes open
 * (`server &`) do not delay it: after a short grace the pipes are handed to
 * a drainer that discards what they write until they close, so such
 * children never block on a full pipe nor die of SIGPIPE.
 */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define DRAIN_GRACE_MS 20

void
outcap_init(struct outcap *o, uint64_t cap)
{
    sbx_buf_init(&o->data);
    o->total = 0;
    o->cap = cap;
    o->truncated = false;
}

void
outcap_add(struct outcap *o, const char *p, size_t n)
{
    o->total += n;
    if (o->data.len >= o->cap) {
        if (n)
            o->truncated = true;
        return;
    }
    size_t room = (size_t)(o->cap - o->data.len);
    if (n > room) {
        o->truncated = true;
        n = room;
    }
    sbx_buf_append(&o->data, p, n);
}

void
outcap_free(struct outcap *o)
{
    sbx_buf_free(&o->data);
}

/* ------------------------------------------------------------------------------ */
/* Arguments. */

void
exec_args_free(struct exec_args *ea)
{
    free(ea->cmd);
    if (ea->argv) {
        for (char **p = ea->argv; *p; p++)
            free(*p);
        free(ea->argv);
    }
    free(ea->cwd);
    free(ea->stdin_data);
    memset(ea, 0, sizeof(*ea));
}

int
exec_args_parse(const msgpack_object *args, struct exec_args *ea, char *why, size_t whylen)
{
    sbx_str s;
    const msgpack_object *arr;
    int rc;

    memset(ea, 0, sizeof(*ea));
    rc = sbx_wire_get_array(args, "argv", &arr);
    if (rc == 0) {
        if (arr->via.array.size == 0 || arr->via.array.size > 4096) {
            snprintf(why, whylen, "argv must have 1-4096 elements");
            return SBX_E_VALIDATION;
        }
        ea->argv = sbx_xcalloc(arr->via.array.size + 1, sizeof(char *));
        for (uint32_t i = 0; i < arr->via.array.size; i++) {
            if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) != 0 || memchr(s.p, '\0', s.n)) {
                snprintf(why, whylen, "argv[%u] must be a string without NUL bytes", i);
                exec_args_free(ea);
                return SBX_E_VALIDATION;
            }
            ea->argv[i] = sbx_str_dup(s);
        }
        if (ea->argv[0][0] == '\0') {
            snprintf(why, whylen, "argv[0] must not be empty");
            exec_args_free(ea);
            return SBX_E_VALIDATION;
        }
    } else if (rc == -ENOENT) {
        rc = sbx_wire_get_str(args, "command", &s);
        if (rc != 0 || s.n == 0) {
            snprintf(why, whylen, "'command' (a non-empty string) or 'argv' is required");
            return SBX_E_VALIDATION;
        }
        if (memchr(s.p, '\0', s.n)) {
            snprintf(why, whylen, "'command' must not contain NUL bytes");
            return SBX_E_VALIDATION;
        }
        ea->cmd = sbx_str_dup(s);
    } else {
        snprintf(why, whylen, "'argv' must be an array of strings");
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_str(args, "cwd", &s);
    if (rc == 0) {
        if (s.n == 0 || s.n > 4096 || memchr(s.p, '\0', s.n)) {
            snprintf(why, whylen, "'cwd' must be a path of 1-4096 bytes");
            exec_args_free(ea);
            return SBX_E_VALIDATION;
        }
        ea->cwd = sbx_str_dup(s);
    } else if (rc != -ENOENT) {
        snprintf(why, whylen, "'cwd' must be a string");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_map(args, "env", &ea->env);
    if (rc == SBX_E_VALIDATION) {
        snprintf(why, whylen, "'env' must be a map of strings");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    if (agent_env_check(ea->env, false, why, whylen) != 0) {
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_i64(args, "timeout", &ea->timeout_ms);
    if (rc == SBX_E_VALIDATION || ea->timeout_ms < 0) {
        snprintf(why, whylen, "'timeout' must be a non-negative number of milliseconds");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    rc = sbx_wire_get_bin(args, "stdin", &s);
    sbx_str enc = SBX_STR("");
    sbx_wire_get_str(args, "stdinEncoding", &enc);
    if (rc == 0 && sbx_str_eq(enc, "base64")) {
        /* JSON clients (the HTTP API) send bytes that are not UTF-8 this way. */
        if (sbx_base64_decode(s.p, s.n, &ea->stdin_data, &ea->stdin_len) != 0) {
            snprintf(why, whylen, "'stdin' is not valid base64 (stdinEncoding: base64)");
            exec_args_free(ea);
            return SBX_E_VALIDATION;
        }
        ea->has_stdin = true;
    } else if (rc == 0) {
        ea->has_stdin = true;
        ea->stdin_data = sbx_xstrndup(s.p, s.n);
        ea->stdin_len = s.n;
    } else if (rc != -ENOENT) {
        snprintf(why, whylen, "'stdin' must be bytes or a string");
        exec_args_free(ea);
        return SBX_E_VALIDATION;
    }
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Spawning. */

static void __attribute__((noreturn))
child_fail(const char *what, const char *arg, int err)
{
    char msg[512];
    int n = snprintf(msg, sizeof(msg), "sbx: %s%s%s: %s\n", what, arg ? " " : "", arg ? arg : "",
                     strerror(err));
    ssize_t w = write(STDERR_FILENO, msg, (size_t)n);
    (void)w;
    _exit(err == ENOENT ? 127 : 126);
}

pid_t
agent_spawn(struct agent *a, const struct spawn_opts *o)
{
    pid_t pid = fork();
    if (pid < 0)
        return -errno;
    if (pid > 0) {
        a->work_starts++; /* agent_work_alone */
        return pid;
    }

    /* Child: a copy of the (single-threaded) agent; everything here runs
     * before the tenant's program and with the agent's empty privileges. */
    sigset_t all;
    sigemptyset(&all);
    sigprocmask(SIG_SETMASK, &all, NULL);
    for (int s = 1; s < NSIG; s++)
        signal(s, SIG_DFL);
    if (o->new_session)
        setsid();
    if (o->subreaper)
        prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
    /* The agent asks for oom_score_adj -998 (the shard sets it; a host root
     * without CAP_SYS_RESOURCE cannot lower it, and then the agent stays at
     * 0).  What it starts goes to +500, which needs no privilege, so that
     * either way the OOM killer of the sandbox's memory cgroup picks tenant
     * processes before the agent (proc(5) oom_score_adj). */
    int fd = open("/proc/self/oom_score_adj", O_WRONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t w = write(fd, "500", 3);
        (void)w;
        close(fd);
    }
    /* stdio, then the kept fds at 3, 4, … (move them above the range first so
     * dup2 never clobbers one we still need). */
    int hi[8];
    for (int i = 0; i < o->nkeep && i < 8; i++)
        hi[i] = fcntl(o->keep_fds[i], F_DUPFD_CLOEXEC, 64);
    int in = fcntl(o->in_fd, F_DUPFD_CLOEXEC, 64);
    int out = fcntl(o->out_fd, F_DUPFD_CLOEXEC, 64);
    int err = fcntl(o->err_fd, F_DUPFD_CLOEXEC, 64);
    if (in < 0 || out < 0 || err < 0 || dup2(in, 0) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
        _exit(126);
    for (int i = 0; i < o->nkeep && i < 8; i++) {
        if (hi[i] < 0 || dup2(hi[i], 3 + i) < 0)
            _exit(126);
    }
    if (o->ctty && ioctl(0, TIOCSCTTY, 0) < 0)
        _exit(126);
    /* Everything else closes at exec: the channel, pipes of other jobs. */
    close_range((unsigned)(3 + o->nkeep), ~0U, CLOSE_RANGE_CLOEXEC);
    struct rlimit rl = {a->cfg.nofile, a->cfg.nofile};
    setrlimit(RLIMIT_NOFILE, &rl);
    if (o->cwd && chdir(o->cwd) < 0)
        child_fail("cannot change directory to", o->cwd, errno);
    execvpe(o->argv[0], (char *const *)o->argv, o->env);
    child_fail(o->argv[0], NULL, errno);
}

int
agent_openpty(int *master, int *slave)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
    if (m < 0)
        return -errno;
    char name[64];
    if (grantpt(m) < 0 || unlockpt(m) < 0 || ptsname_r(m, name, sizeof(name)) != 0) {
        int e = -errno;
        close(m);
        return e;
    }
    int sl = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (sl < 0) {
        int e = -errno;
        close(m);
        return e;
    }
    *master = m;
    *slave = sl;
    return 0;
}

/* ------------------------------------------------------------------------------ */
/* Process trees. */

struct pinfo {
    pid_t pid, ppid;
    unsigned long long start; /* clock ticks since boot, proc(5) field 22 */
};

static size_t
list_procs(struct pinfo **out)
{
    size_t n = 0, cap = 64;
    struct pinfo *v = sbx_xmalloc(cap * sizeof(*v));
    DIR *d = opendir("/proc");
    if (!d) {
        *out = v;
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char *end;
        long pid = strtol(de->d_name, &end, 10);
        if (*end || pid <= 0)
            continue;
        char path[64], buf[512];
        snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        ssize_t r = read(fd, buf, sizeof(buf) - 1);
        close(fd);
        if (r <= 0)
            continue;
        buf[r] = '\0';
        /* pid (comm) state ppid …; comm may hold spaces and ')' itself. */
        char *rp = strrchr(buf, ')');
        if (!rp)
            continue;
        char state;
        int ppid;
        unsigned long long start = 0;
        if (sscanf(rp + 1,
                   " %c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d %*d %llu",
                   &state, &ppid, &start) != 3)
            continue;
        if (n == cap) {
            cap *= 2;
            v = sbx_xrealloc(v, cap * sizeof(*v));
        }
        v[n].pid = (pid_t)pid;
        v[n].ppid = ppid;
        v[n].start = start;
        n++;
    }
    closedir(d);
    *out = v;
    return n;
}

static bool
in_list(const pid_t *v, size_t n, pid_t p)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == p)
            return true;
    return false;
}

/* Descendants of root (not root itself), skipping the subtrees rooted at
 * the `spare` pids and at processes that started before tick `since`. */
static size_t
descendants(pid_t root, const pid_t *spare, size_t nspare, unsigned long long since, pid_t **out)
{
    struct pinfo *ps;
    size_t np = list_procs(&ps);
    pid_t *res = sbx_xmalloc((np + 1) * sizeof(pid_t));
    size_t nr = 0;
    /* Breadth-first over the parent links. */
    pid_t *queue = sbx_xmalloc((np + 1) * sizeof(pid_t));
    size_t qh = 0, qt = 0;
    queue[qt++] = root;
    while (qh < qt) {
        pid_t p = queue[qh++];
        for (size_t i = 0; i < np; i++) {
            if (ps[i].ppid != p || ps[i].pid == 1)
                continue;
            if (in_list(spare, nspare, ps[i].pid) || ps[i].start < since)
                continue;
            res[nr++] = ps[i].pid;
            queue[qt++] = ps[i].pid;
        }
    }
    free(queue);
    free(ps);
    *out = res;
    return nr;
}

int
agent_kill_tree(pid_t root, bool skip_root, const pid_t *spare, size_t nspare)
{
    return agent_kill_tree_since(root, skip_root, spare, nspare, 0);
}

unsigned long long
agent_boot_ticks(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_BOOTTIME, &ts);
    long hz = sysconf(_SC_CLK_TCK);
    if (hz <= 0)
        hz = 100;
    return (unsigned long long)ts.tv_sec * (unsigned long long)hz +
           (unsigned long long)ts.tv_nsec / (1000000000ull / (unsigned long long)hz);
}

int
agent_signal_tree(pid_t root, int sig, bool include_root)
{
    pid_t *d;
    size_t n = descendants(root, NULL, 0, 0, &d);
    int count = 0;
    for (size_t i = 0; i < n; i++)
        if (kill(d[i], sig) == 0)
            count++;
    free(d);
    if (include_root && kill(root, sig) == 0)
        count++;
    return count;
}

int
agent_kill_tree_since(pid_t root, bool skip_root, const pid_t *spare, size_t nspare,
                      unsigned long long since)
{
    int killed = 0;
    /* Kill the descendants first, round after round: a killed process's
     * children are re-parented to the subreaper `root` and show up in the
     * next walk; a fork bomb is bounded by the pids cgroup. */
    for (int round = 0; round < 200; round++) {
        pid_t *d;
        size_t n = descendants(root, spare, nspare, since, &d);
        for (size_t i = 0; i < n; i++) {
            if (kill(d[i], SIGKILL) == 0)
                killed++;
        }
        free(d);
        if (n == 0)
            break;
    }
    if (!skip_root && kill(root, SIGKILL) == 0)
        killed++;
    return killed;
}

/* ------------------------------------------------------------------------------ */
/* Results. */

void
exec_encode_result(sbx_enc *e, int exit_code, int sig, bool timed_out, int64_t timeout_ms,
                   int64_t duration_ms, struct outcap *out, struct outcap *err, const char *cause,
                   bool by_deadline)
{
    if (timed_out) {
        char note[128];
        int n = snprintf(note, sizeof(note), "%sCommand timed out after %lldms%s\n",
                         (err->data.len && err->data.p[err->data.len - 1] != '\n') ? "\n" : "",
                         (long long)timeout_ms, by_deadline ? " (the request's deadline)" : "");
        /* The note is always kept, even past the cap. */
        sbx_buf_append(&err->data, note, (size_t)n);
    }
    sbx_enc_kbool(e, "success", exit_code == 0 && !timed_out);
    sbx_enc_kint(e, "exitCode", exit_code);
    sbx_enc_kbin(e, "stdout", out->data.p ? out->data.p : "", out->data.len);
    sbx_enc_kbin(e, "stderr", err->data.p ? err->data.p : "", err->data.len);
    sbx_enc_kbool(e, "stdoutTruncated", out->truncated);
    sbx_enc_kbool(e, "stderrTruncated", err->truncated);
    sbx_enc_kint(e, "stdoutBytes", (int64_t)out->total);
    sbx_enc_kint(e, "stderrBytes", (int64_t)err->total);
    sbx_enc_kint(e, "duration", duration_ms);
    sbx_enc_kbool(e, "timedOut", timed_out);
    if (timed_out && by_deadline)
        sbx_enc_kbool(e, "deadlineExceeded", true);
    if (sig)
        sbx_enc_kint(e, "signal", sig);
    sbx_enc_kstr(e, "cause", cause ? cause : timed_out ? "TIMEOUT" : sig ? "KILLED" : "EXITED");
}

int64_t
agent_bound_timeout(const struct agent_req *r, int64_t timeout_ms, bool *by_deadline)
{
    *by_deadline = false;
    if (!r || !r->deadline_ms)
        return timeout_ms;
    int64_t left = SBX_MAX(r->deadline_ms - sbx_mono_ms(), (int64_t)1);
    if (timeout_ms && timeout_ms <= left)
        return timeout_ms;
    *by_deadline = true;
    return left;
}

/* ------------------------------------------------------------------------------ */
/* Why a command ended. */

void
agent_work_mark(struct agent *a, const void *self, struct work_mark *m)
{
    m->starts = ++a->work_starts;
    m->others = agent_others_running(a, self);
}

bool
agent_work_alone(struct agent *a, const void *self, const struct work_mark *m)
{
    return !m->others && a->work_starts == m->starts && !agent_others_running(a, self);
}

/* Case-insensitive search of needle (lower case) in n bytes of p. */
static bool
icase_has(const char *p, size_t n, const char *needle)
{
    size_t k = strlen(needle);
    for (size_t i = 0; p && i + k <= n; i++) {
        size_t j = 0;
        while (j < k && (char)tolower((unsigned char)p[i + j]) == needle[j])
            j++;
        if (j == k)
            return true;
    }
    return false;
}

bool
agent_fork_refused_in(const char *p, size_t n)
{
    /* bash "fork: retry: Resource temporarily unavailable", dash "Cannot
     * fork", Python's BlockingIOError, Go's "resource temporarily
     * unavailable", Node's "spawn EAGAIN". */
    static const char *const says[] = {"resource temporarily unavailable", "cannot fork",
                                       "can't fork", "eagain"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(says); i++)
        if (icase_has(p, n, says[i]))
            return true;
    return false;
}

const char *
agent_refine_cause(const char *cause, int exit_code, int sig, const struct agent_counters *before,
                   const struct agent_counters *after, bool blame_pids)
{
    bool oom = after->oom_kills > before->oom_kills;
    /* SIGKILL with the OOM killer at work; a shell reports its child's
     * SIGKILL as exit 137 (128 + 9). */
    if (!strcmp(cause, "KILLED") && sig == SIGKILL && oom)
        return "OOM_KILLED";
    if (!strcmp(cause, "EXITED") && exit_code == 137 && oom)
        return "OOM_KILLED";
    if (!strcmp(cause, "EXITED") && exit_code != 0 && after->pids_hits > before->pids_hits &&
        blame_pids)
        return "PIDS_LIMIT";
    return cause;
}

/* ------------------------------------------------------------------------------ */
/* Fresh-process jobs: plain exec, exec streams, internal jobs. */

struct job {
    struct job *next;
    struct agent *a;
    struct agent_req *req;   /* answered at the end (plain exec), or NULL */
    struct stream *stream;   /* exec stream: output as events, or NULL */
    job_done_fn done;        /* internal job: called at the end, or NULL */
    void *done_arg;
    pid_t pid;
    int fds[3];              /* our ends: stdin (write), stdout, stderr (read); -1 when closed */
    sbx_watch *w[3];
    struct outcap out, err;
    char *in_data;
    size_t in_len, in_off;
    char *command;           /* for the stream's start event (agent_command_shown) */
    bool command_cut;
    int64_t start_us, timeout_ms;
    uint64_t timer, grace;
    bool exited, timed_out, cancelled, paused;
    int status;
    /* Its cause: the request's cgroup counters and what else ran
     * (agent_refine_cause); the end waits for the shard's counters. */
    bool have_cg, asked, answered;
    struct agent_counters cg;
    struct work_mark mark;
    const char *cause;       /* refined, or NULL */
    bool by_deadline;        /* its timeout is the request's deadline */
};

bool
agent_others_running(struct agent *a, const void *self)
{
    for (struct job *j = a->jobs; j; j = j->next)
        if ((const void *)j != self && !j->exited)
            return true;
    return agent_procs_running(a, self) || agent_sessions_busy(a, self) ||
           agent_interp_busy(a) || agent_terms_open(a);
}

/* Pipes handed over after the end: read and discard until EOF. */
struct drain {
    int fd;
    sbx_watch *w;
};

static void
drain_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct drain *d = arg;
    char buf[65536];
    (void)ev;
    for (;;) {
        ssize_t r = read(fd, buf, sizeof(buf));
        if (r > 0)
            continue;
        if (r < 0 && (errno == EINTR))
            continue;
        if (r < 0 && errno == EAGAIN)
            return;
        break; /* EOF or error */
    }
    sbx_loop_unwatch(l, d->w);
    close(d->fd);
    free(d);
}

void
agent_hand_to_drainer(struct agent *a, int fd)
{
    struct drain *d = sbx_xmalloc(sizeof(*d));
    d->fd = fd;
    d->w = sbx_loop_watch(a->loop, fd, EPOLLIN, drain_cb, d);
}

static void
job_close_fd(struct job *j, int i, bool drain)
{
    if (j->fds[i] < 0)
        return;
    sbx_loop_unwatch(j->a->loop, j->w[i]);
    j->w[i] = NULL;
    if (drain)
        agent_hand_to_drainer(j->a, j->fds[i]);
    else
        close(j->fds[i]);
    j->fds[i] = -1;
}

/* Read what a pipe has now; returns true at EOF.  A stream that is full
 * stops the reading (back-pressure) unless `force`. */
static bool
job_read(struct job *j, int i, bool force)
{
    char buf[65536];
    for (;;) {
        if (j->stream && !force && stream_full(j->stream)) {
            j->stream->paused = true;
            j->paused = true;
            for (int k = 1; k <= 2; k++)
                if (j->w[k])
                    sbx_loop_modify(j->a->loop, j->w[k], 0);
            return false;
        }
        ssize_t r = read(j->fds[i], buf, sizeof(buf));
        if (r > 0) {
            if (j->stream)
                stream_data(j->stream, i == 1 ? "stdout" : "stderr", buf, (size_t)r, NULL, NULL);
            else
                outcap_add(i == 1 ? &j->out : &j->err, buf, (size_t)r);
            continue;
        }
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == EAGAIN)
            return false;
        return true;
    }
}

static void job_finish(struct job *j);

static void
job_maybe_finish(struct job *j)
{
    if (j->exited && j->fds[1] < 0 && j->fds[2] < 0)
        job_finish(j);
}

static void
job_io_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct job *j = arg;
    (void)l;
    (void)ev;
    int i = (fd == j->fds[1]) ? 1 : 2;
    if (job_read(j, i, false)) {
        job_close_fd(j, i, false);
        job_maybe_finish(j);
    }
}

static void
job_stream_resume(struct stream *st, void *arg)
{
    struct job *j = arg;
    (void)st;
    j->paused = false;
    for (int k = 1; k <= 2; k++)
        if (j->w[k])
            sbx_loop_modify(j->a->loop, j->w[k], EPOLLIN);
}

static void
job_kill(struct job *j)
{
    agent_kill_tree(j->pid, false, NULL, 0);
}

static void
job_stream_cancel(struct stream *st, void *arg)
{
    struct job *j = arg;
    (void)st;
    if (j->exited)
        return;
    j->cancelled = true;
    job_kill(j);
}

static const struct stream_ops job_stream_ops = {job_stream_resume, job_stream_cancel};

static void
job_stdin_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct job *j = arg;
    (void)l;
    (void)ev;
    while (j->in_off < j->in_len) {
        ssize_t w = write(fd, j->in_data + j->in_off, j->in_len - j->in_off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN)
                return;
            break; /* EPIPE: the command does not read its stdin */
        }
        j->in_off += (size_t)w;
    }
    job_close_fd(j, 0, false);
}

static void
job_timeout_cb(sbx_loop *l, void *arg)
{
    struct job *j = arg;
    (void)l;
    j->timer = 0;
    if (j->exited)
        return;
    j->timed_out = true;
    job_kill(j);
}

static void
job_grace_cb(sbx_loop *l, void *arg)
{
    struct job *j = arg;
    (void)l;
    j->grace = 0;
    for (int i = 1; i <= 2; i++) {
        if (j->fds[i] >= 0) {
            bool eof = job_read(j, i, true);
            job_close_fd(j, i, !eof);
        }
    }
    job_maybe_finish(j);
}

static void
job_unlink(struct agent *a, struct job *j)
{
    for (struct job **pp = &a->jobs; *pp; pp = &(*pp)->next) {
        if (*pp == j) {
            *pp = j->next;
            return;
        }
    }
}

void
exec_encode_complete(sbx_enc *e, int exit_code, int sig, bool timed_out, bool cancelled,
                     int64_t timeout_ms, int64_t duration_ms, const char *cause)
{
    sbx_enc_kint(e, "exitCode", exit_code);
    sbx_enc_kbool(e, "success", exit_code == 0 && !timed_out && !cancelled);
    sbx_enc_kint(e, "duration", duration_ms);
    sbx_enc_kbool(e, "timedOut", timed_out);
    if (timed_out)
        sbx_enc_kint(e, "timeout", timeout_ms);
    if (cancelled)
        sbx_enc_kbool(e, "cancelled", true);
    if (sig)
        sbx_enc_kint(e, "signal", sig);
    sbx_enc_kstr(e, "cause", cause                ? cause
                             : timed_out          ? "TIMEOUT"
                             : (sig || cancelled) ? "KILLED"
                                                  : "EXITED");
}

static void
job_free(struct job *j)
{
    agent_counters_cancel(j->a, j);
    outcap_free(&j->out);
    outcap_free(&j->err);
    free(j->in_data);
    free(j->command);
    free(j);
}

static void job_finish(struct job *j);

/* The shard's counters for a job that ended: its cause, then its end. */
static void
job_counters(struct agent *a, void *arg, bool ok, const struct agent_counters *now)
{
    struct job *j = arg;
    int sig = WIFEXITED(j->status) ? 0 : WTERMSIG(j->status);
    int code = sig ? 128 + sig : WEXITSTATUS(j->status);
    (void)a;
    j->answered = true;
    if (ok) {
        bool blame = agent_work_alone(j->a, j, &j->mark) ||
                     agent_fork_refused_in(j->out.data.p, j->out.data.len) ||
                     agent_fork_refused_in(j->err.data.p, j->err.data.len);
        const char *c = agent_refine_cause(sig ? "KILLED" : "EXITED", code, sig, &j->cg, now, blame);
        if (strcmp(c, sig ? "KILLED" : "EXITED"))
            j->cause = c;
    }
    job_finish(j);
}

static void
job_finish(struct job *j)
{
    struct agent *a = j->a;
    int code, sig = 0;
    if (WIFEXITED(j->status)) {
        code = WEXITSTATUS(j->status);
    } else {
        sig = WTERMSIG(j->status);
        code = 128 + sig;
    }
    /* A command that failed or was SIGKILLed on its own may have met the
     * sandbox's memory or pids limit: only the shard sees those counters.
     * The end waits for them (the job stays in the list, exited, until). */
    if (j->asked && !j->answered)
        return;
    if (!j->asked && j->have_cg && (j->req || j->stream) && !j->timed_out && !j->cancelled &&
        (sig == SIGKILL || (!sig && code != 0))) {
        j->asked = true;
        agent_counters_ask(a, job_counters, j);
        return;
    }
    if (j->timed_out)
        code = 124;
    int64_t dur = (sbx_mono_us() - j->start_us) / 1000;
    sbx_loop_cancel(a->loop, j->timer);
    sbx_loop_cancel(a->loop, j->grace);
    job_close_fd(j, 0, false);
    job_unlink(a, j);
    if (j->stream) {
        if (j->timed_out) {
            char note[96];
            int n = snprintf(note, sizeof(note), "Command timed out after %lldms\n",
                             (long long)j->timeout_ms);
            stream_data(j->stream, "stderr", note, (size_t)n, NULL, NULL);
        }
        sbx_enc *e = stream_begin(j->stream, "complete");
        exec_encode_complete(e, code, j->timed_out ? 0 : sig, j->timed_out, j->cancelled,
                             j->timeout_ms, dur, j->cause);
        stream_commit(j->stream, true);
        j->stream->ops = NULL;
        stream_unref(j->stream);
    } else if (j->done) {
        j->done(a, j->done_arg, code, j->timed_out, &j->out, &j->err);
    } else if (j->req) {
        sbx_enc e;
        sbx_enc_init(&e);
        sbx_enc_map(&e);
        exec_encode_result(&e, code, j->timed_out ? 0 : sig, j->timed_out, j->timeout_ms, dur,
                           &j->out, &j->err, j->cause, j->by_deadline);
        agent_reply_ok(a, j->req, &e);
    }
    job_free(j);
}

void
agent_job_reaped(struct agent *a, pid_t pid, int status)
{
    for (struct job *j = a->jobs; j; j = j->next) {
        if (j->pid != pid || j->exited)
            continue;
        j->exited = true;
        j->status = status;
        /* What the process wrote is in the pipes already; take it now (past
         * a stream's cap: the process is gone, nothing more will come), and
         * give its children a moment to close their copies. */
        for (int i = 1; i <= 2; i++) {
            if (j->fds[i] >= 0 && job_read(j, i, true))
                job_close_fd(j, i, false);
        }
        if (j->fds[1] >= 0 || j->fds[2] >= 0)
            j->grace = sbx_loop_timer(a->loop, DRAIN_GRACE_MS, job_grace_cb, j);
        job_maybe_finish(j);
        return;
    }
}

/* Start a job for args; on success the job owns req and is running. */
static int
job_start(struct agent *a, struct exec_args *ea, struct job **out, char *why, size_t whylen)
{
    int p_in[2] = {-1, -1}, p_out[2] = {-1, -1}, p_err[2] = {-1, -1};
    int devnull = -1, rc = 0;
    char **env = NULL;
    struct job *j = NULL;

    const char *cwd = ea->cwd ? ea->cwd : "/workspace";
    struct stat st;
    if (stat(cwd, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(why, whylen, "cwd '%s' is not a directory in the sandbox", cwd);
        return SBX_E_VALIDATION;
    }
    if (pipe2(p_out, O_CLOEXEC) < 0 || pipe2(p_err, O_CLOEXEC) < 0 ||
        (ea->has_stdin && pipe2(p_in, O_CLOEXEC) < 0) ||
        (!ea->has_stdin && (devnull = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)) {
        rc = -errno;
        snprintf(why, whylen, "could not start the command: %s", strerror(errno));
        goto out;
    }
    env = agent_env_merge(a->env, ea->env);
    const char *sh_argv[] = {"/bin/sh", "-c", ea->cmd, NULL};
    struct spawn_opts so = {
        .in_fd = ea->has_stdin ? p_in[0] : devnull,
        .out_fd = p_out[1],
        .err_fd = p_err[1],
        .cwd = cwd,
        .env = env,
        .argv = ea->argv ? (const char *const *)ea->argv : sh_argv,
        .subreaper = true,
        .new_session = true,
    };
    j = sbx_xcalloc(1, sizeof(*j));
    j->start_us = sbx_mono_us();
    pid_t pid = agent_spawn(a, &so);
    if (pid < 0) {
        rc = (int)pid;
        snprintf(why, whylen, "could not start the command: %s", strerror(-rc));
        free(j);
        j = NULL;
        goto out;
    }
    j->a = a;
    j->pid = pid;
    agent_work_mark(a, j, &j->mark);
    j->timeout_ms = ea->timeout_ms;
    const char *shown = ea->cmd ? ea->cmd : (ea->argv ? ea->argv[0] : "");
    j->command = agent_command_shown(shown, strlen(shown), &j->command_cut);
    outcap_init(&j->out, a->cfg.output_cap);
    outcap_init(&j->err, a->cfg.output_cap);
    j->fds[0] = -1;
    j->fds[1] = p_out[0];
    j->fds[2] = p_err[0];
    p_out[0] = p_err[0] = -1;
    sbx_set_nonblock(j->fds[1], true);
    sbx_set_nonblock(j->fds[2], true);
    j->w[1] = sbx_loop_watch(a->loop, j->fds[1], EPOLLIN, job_io_cb, j);
    j->w[2] = sbx_loop_watch(a->loop, j->fds[2], EPOLLIN, job_io_cb, j);
    if (ea->has_stdin) {
        j->fds[0] = p_in[1];
        p_in[1] = -1;
        j->in_data = ea->stdin_data;
        j->in_len = ea->stdin_len;
        ea->stdin_data = NULL;
        sbx_set_nonblock(j->fds[0], true);
        j->w[0] = sbx_loop_watch(a->loop, j->fds[0], EPOLLOUT, job_stdin_cb, j);
    }
    if (ea->timeout_ms > 0)
        j->timer = sbx_loop_timer(a->loop, ea->timeout_ms, job_timeout_cb, j);
    j->next = a->jobs;
    a->jobs = j;
    *out = j;
out:
    for (int i = 0; i < 2; i++) {
        if (p_in[i] >= 0) close(p_in[i]);
        if (p_out[i] >= 0) close(p_out[i]);
        if (p_err[i] >= 0) close(p_err[i]);
    }
    if (devnull >= 0)
        close(devnull);
    agent_env_free(env);
    return rc ? rc : 0;
}

void
agent_exec_fresh(struct agent *a, struct agent_req *r)
{
    struct exec_args ea;
    char why[256];
    struct job *j;
    bool by_deadline = false;
    int rc = exec_args_parse(r->args, &ea, why, sizeof(why));
    /* Killed as by a timeout at the request's deadline at the latest: the
     * caller hears what it printed, and nothing runs on unheard. */
    if (rc == 0)
        ea.timeout_ms = agent_bound_timeout(r, ea.timeout_ms, &by_deadline);
    if (rc == 0)
        rc = job_start(a, &ea, &j, why, sizeof(why));
    if (rc) {
        agent_reply_err(a, r, rc == SBX_E_VALIDATION ? rc : SBX_E_COMMAND, "%s", why);
    } else {
        j->req = r;
        j->have_cg = r->have_cg;
        j->cg = r->cg;
        j->by_deadline = by_deadline;
    }
    exec_args_free(&ea);
}

void
agent_exec_fresh_stream(struct agent *a, struct agent_req *r)
{
    struct exec_args ea;
    char why[256], sid[72];
    struct job *j;
    int rc = exec_args_parse(r->args, &ea, why, sizeof(why));
    if (rc == 0)
        rc = job_start(a, &ea, &j, why, sizeof(why));
    if (rc) {
        agent_reply_err(a, r, rc == SBX_E_VALIDATION ? rc : SBX_E_COMMAND, "%s", why);
        exec_args_free(&ea);
        return;
    }
    snprintf(sid, sizeof(sid), "exec-%llu", (unsigned long long)++a->stream_ctr);
    j->have_cg = r->have_cg;
    j->cg = r->cg;
    j->stream = stream_new(a, sid, true, 1u << 20, &job_stream_ops, j);
    sbx_enc *e = stream_begin(j->stream, "start");
    sbx_enc_kstr(e, "command", j->command);
    if (j->command_cut)
        sbx_enc_kbool(e, "commandTruncated", true);
    sbx_enc_kint(e, "pid", j->pid);
    stream_commit(j->stream, false);
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kstr(&res, "streamId", sid);
    agent_reply_ok(a, r, &res);
    exec_args_free(&ea);
}

int
agent_run_internal(struct agent *a, const char *const *argv, const char *cwd, int64_t timeout_ms,
                   job_done_fn done, void *arg)
{
    struct exec_args ea;
    char why[256];
    struct job *j;
    memset(&ea, 0, sizeof(ea));
    size_t n = 0;
    while (argv[n])
        n++;
    ea.argv = sbx_xcalloc(n + 1, sizeof(char *));
    for (size_t i = 0; i < n; i++)
        ea.argv[i] = sbx_xstrdup(argv[i]);
    ea.cwd = cwd ? sbx_xstrdup(cwd) : NULL;
    ea.timeout_ms = timeout_ms;
    int rc = job_start(a, &ea, &j, why, sizeof(why));
    if (rc == 0) {
        j->done = done;
        j->done_arg = arg;
    }
    exec_args_free(&ea);
    return rc;
}
