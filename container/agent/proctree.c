/*
 * proctree.c — children and process trees: agent_spawn (fork, stdio, cwd,
 * environment and limits, exec; a failed exec is exit 127 with a message,
 * like a shell), agent_openpty, and the walks of /proc that signal or kill
 * a process with all of its descendants (agent_kill_tree, agent_signal_tree,
 * agent_kill_tree_since with agent_boot_ticks).  Declared in agent.h; used
 * by exec.c, session*.c, proc.c, interp*.c and term.c on the loop thread.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"

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
    /* The agent runs at oom_score_adj -941 with a floor of 0 (the shard
     * sets both, container/spawn.c; a host root without CAP_SYS_RESOURCE
     * cannot lower it, and then the agent stays at 0).  What it starts goes to +500, which needs no privilege, so that
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
    /* First stop them, round after round, until a walk finds none it has not
     * stopped: a stopped process forks no more, so only children born
     * before their parent's stop are new in the next walk.  Killing alone
     * raced a fork bomb — each killed process's slot in the pids cgroup went
     * to a new fork — and after the rounds below ran out the rest outlived
     * `root`, re-parented to the agent (seen: 128 processes left). */
    pid_t *stopped = NULL;
    size_t nstopped = 0, capstopped = 0;
    for (int round = 0; round < 200; round++) {
        pid_t *d;
        size_t n = descendants(root, spare, nspare, since, &d), fresh = 0;
        for (size_t i = 0; i < n; i++) {
            if (in_list(stopped, nstopped, d[i]))
                continue;
            if (nstopped == capstopped) {
                capstopped = capstopped ? 2 * capstopped : 64;
                stopped = sbx_xrealloc(stopped, capstopped * sizeof(*stopped));
            }
            stopped[nstopped++] = d[i];
            kill(d[i], SIGSTOP);
            fresh++;
        }
        free(d);
        if (fresh == 0)
            break;
    }
    free(stopped);
    /* Then kill them (SIGKILL ends a stopped process too), round after
     * round: a killed process's children are re-parented to the subreaper
     * `root` and show up in the next walk. */
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
