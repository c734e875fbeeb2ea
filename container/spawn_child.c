/* spawn_child.c — the child of a container's clone; see spawn_child.h. */
#include "spawn_child.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <poll.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif

/*
 * Containers are cloned from the shard with CLONE_VM where the architecture
 * allows it (x86-64 here; clone3_vm below): the child shares the shard's
 * memory until its exec instead of getting a copy of it.  A fork-like clone
 * copies the caller's page tables under its mmap lock for writing (the
 * shard's other threads wait at their next page fault) and the exec throws
 * the copy away; both grow with the shard, which holds every sandbox's
 * actor, so container starts slowed as sandboxes accumulated
 * (docs/benchmarks.md, "Density": `copy_page_range` in the profile).  The
 * child of a CLONE_VM clone may touch nothing the shard's threads write:
 * its own stack (mmap'd per start, freed once the child has exec'd or been
 * reaped), and read-only its struct spawn_child.  Not even errno, which lives
 * in the calling thread's TLS: its system calls go through CSYS, raw (the
 * result or -errno, no errno).  Every other architecture keeps the
 * fork-like clone, where CSYS is syscall(2).  This is what glibc's
 * posix_spawn does (sysdeps/unix/sysv/linux/spawni.c: CLONE_VM|CLONE_VFORK
 * on a stack of its own, signals blocked, handlers reset in the child); a
 * container's child cannot be a vfork, as the shard writes its uid map
 * between the clone and the exec.
 */
#if SPAWN_VM
static inline long
raw_sys6(long n, long a, long b, long c, long d, long e, long f)
{
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    return ret;
}
#define CSYS_(n, a, b, c, d, e, f, ...)                                                          \
    raw_sys6((long)(n), (long)(a), (long)(b), (long)(c), (long)(d), (long)(e), (long)(f))
#define CSYS(...) CSYS_(__VA_ARGS__, 0, 0, 0, 0, 0, 0, 0)

/*
 * clone3(2) with a stack for the child (ca->stack, ca->stack_size): the
 * child starts on it at the instruction after the syscall, so it cannot
 * return into C; it calls fn(arg) and exits with its value.  Returns the
 * child's pid or -errno, in the parent.
 */
static long
clone3_vm(struct clone_args *ca, int (*fn)(void *), void *arg)
{
    register long r12 __asm__("r12") = (long)fn;
    register long r13 __asm__("r13") = (long)arg;
    long ret;
    __asm__ volatile("syscall\n\t"
                     "test %%rax, %%rax\n\t"
                     "jnz 1f\n\t"
                     "xor %%ebp, %%ebp\n\t"
                     "mov %%r13, %%rdi\n\t"
                     "call *%%r12\n\t"
                     "mov %%eax, %%edi\n\t"
                     "mov %[exit], %%eax\n\t"
                     "syscall\n\t"
                     "hlt\n"
                     "1:"
                     : "=a"(ret)
                     : "0"((long)SYS_clone3), "D"(ca), "S"(sizeof(*ca)), "r"(r12), "r"(r13),
                       [exit] "i"(SYS_exit_group)
                     : "rcx", "r11", "memory");
    return ret;
}
#else
#define CSYS(...) syscall(__VA_ARGS__)
#endif

/* The child's code runs on a stack and in a thread the sanitizer runtime
 * knows nothing of (its fake stacks are the calling thread's): no
 * instrumentation there. */
#if defined(__SANITIZE_ADDRESS__)
#define SPAWN_NO_ASAN __attribute__((no_sanitize_address))
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SPAWN_NO_ASAN __attribute__((no_sanitize_address))
#endif
#endif
#ifndef SPAWN_NO_ASAN
#define SPAWN_NO_ASAN
#endif



/* The kernel's struct sigaction (x86-64, generic: the handler first). */
struct child_ksa {
    unsigned long handler, flags, restorer, mask;
};

/*
 * Before the exec of a child cloned with every signal blocked: every
 * signal the shard handles goes back to its default action (a handler of
 * the shard's would run on memory the shard shares with us), then the mask
 * the shard's thread had (`restore`; its first 64 bits, the kernel's
 * sigset) is restored.  Ignored signals stay ignored across exec, as after
 * a fork.
 */
static void SPAWN_NO_ASAN
child_signals_reset(const sigset_t *restore)
{
    for (long sig = 1; sig <= 64; sig++) {
        struct child_ksa ka = {0}, dfl = {0};
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        if (CSYS(SYS_rt_sigaction, sig, NULL, &ka, 8) == 0 &&
            ka.handler != (unsigned long)(uintptr_t)SIG_DFL &&
            ka.handler != (unsigned long)(uintptr_t)SIG_IGN)
            CSYS(SYS_rt_sigaction, sig, &dfl, NULL, 8);
    }
    CSYS(SYS_rt_sigprocmask, SIG_SETMASK, restore, NULL, 8);
}

/*
 * The child between clone3 (or clone) and execveat.  It has (a copy of, or
 * with CLONE_VM a share in) the parent's memory, and other threads may have
 * held glibc locks at the moment of the clone: only raw system calls from
 * here on.
 *
 * Until its exec this child holds a copy of the shard's descriptors (with
 * a->shared_files, of those below SPAWN_FD_HIGH): the LMDB files, the host
 * locks in /run/sbx, and the shard's end of the channel of every container
 * being started at that moment.  So it must
 * never outlive the shard, not even while it waits for the go-ahead:
 *  1. PR_SET_PDEATHSIG before anything that can block (prctl(2));
 *  2. close our copy of the shard's end of our channel (`parent_end`), so
 *     the read in 3 sees end-of-file once the shard is gone, even if the
 *     shard died before 1 took effect (then no death signal comes);
 *  2b. on cgroup v1, join the sandbox's cgroup by writing "0" to each
 *     hierarchy's `tasks` file, opened for us by the shard (`tasks`,
 *     sbx_cgroup_open_tasks): a thread moving itself skips the kernel's
 *     global threadgroup lock that the shard writing our pid would take;
 *  3. wait for the go-ahead at most `wait_ms` (ppoll(2)), so a sibling
 *     child that still holds a copy of our channel cannot keep us blocked;
 *  4. PR_SET_PDEATHSIG again after setresuid: any change of the effective
 *     uid or gid clears the parent-death signal (prctl(2), "the
 *     parent-death signal is cleared … on credential changes"; kernel
 *     commit_creds()), and the agent keeps it across execve (not set-uid).
 * A shard that is SIGKILLed therefore takes its agents and half-started
 * children with it (tests/integration/test_shard_kill.c).
 *
 * Started by clone3_vm (above) the child also shares the shard's memory until
 * its exec, runs on its own small stack with every signal blocked, and
 * a->restore is the mask to exec the agent with (child_signals_reset).
 * With a->shared_files it starts in the shard's descriptor table too
 * (CLONE_FILES) and first takes a copy of its low part (SPAWN_FD_HIGH).
 */
void SPAWN_NO_ASAN
spawn_child_main(const struct spawn_child *a, bool vm)
{
    const int chan = a->chan, tree = a->tree;
    const char *const *argv = a->argv, *const *envp = a->envp;
    char go = 0;
    if (CSYS(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        CSYS(SYS_exit_group, 1);
    if (a->shared_files) {
        /* A table of our own with the shard's descriptors below
         * SPAWN_FD_HIGH only (close_range(2) CLOSE_RANGE_UNSHARE, Linux
         * 5.9: the ones closed are never copied); then tell the shard,
         * which keeps what we need open until then. */
        if ((CSYS(SYS_close_range, SPAWN_FD_HIGH, ~0U, CLOSE_RANGE_UNSHARE) != 0 &&
             CSYS(SYS_unshare, CLONE_FILES) != 0) ||
            CSYS(SYS_write, chan, "U", 1) != 1)
            CSYS(SYS_exit_group, 1);
    }
    CSYS(SYS_close, a->parent_end);
    for (int i = 0; i < a->ntasks; i++)
        if (CSYS(SYS_write, a->tasks[i], "0", 1) != 1)
            CSYS(SYS_exit_group, 4);
    struct pollfd pfd = {.fd = chan, .events = POLLIN};
    struct timespec ts = {a->wait_ms / 1000, (long)(a->wait_ms % 1000) * 1000000L};
    if (CSYS(SYS_ppoll, &pfd, 1, &ts, NULL, 0) != 1 ||
        CSYS(SYS_read, chan, &go, 1) != 1 || go != 'G')
        CSYS(SYS_exit_group, 1);
    /* Become 0:0 of our user namespace: without it the child is the
     * overflow uid and execve would drop every capability. */
    if (CSYS(SYS_setgroups, 0, NULL) < 0 || CSYS(SYS_setresgid, 0, 0, 0) < 0 ||
        CSYS(SYS_setresuid, 0, 0, 0) < 0)
        CSYS(SYS_exit_group, 2);
    /* Die with the thread that created us (4 above): a crashed shard
     * leaves no sandbox behind. */
    if (CSYS(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        CSYS(SYS_exit_group, 2);
    /* fd 3 = channel, 4 = the interpreter drivers' detached tree (when there
     * is one), 0/1 = /dev/null, 2 = the shard's stderr (agent logs).
     * Lift every fd we need above the small numbers first, so no dup3 below
     * can overwrite one we still need. */
    long afd = CSYS(SYS_fcntl, a->agent_fd, F_DUPFD_CLOEXEC, 16);
    long nfd = CSYS(SYS_fcntl, a->devnull, F_DUPFD_CLOEXEC, 16);
    long cfd = CSYS(SYS_fcntl, chan, F_DUPFD_CLOEXEC, 16);
    long tfd = tree >= 0 ? CSYS(SYS_fcntl, tree, F_DUPFD_CLOEXEC, 16) : 0;
    if (afd < 0 || nfd < 0 || cfd < 0 || tfd < 0 || CSYS(SYS_dup3, cfd, 3, 0) < 0 ||
        CSYS(SYS_dup3, nfd, 0, 0) < 0 || CSYS(SYS_dup3, nfd, 1, 0) < 0 ||
        (tree >= 0 && CSYS(SYS_dup3, tfd, SPAWN_INTERP_FD, 0) < 0))
        CSYS(SYS_exit_group, 3);
    /* Nothing else the shard holds crosses the exec: its LMDB file, etcd
     * and client sockets, pipes inherited from whatever started sbxd.  Every
     * fd above the ones handed over (3, and SPAWN_INTERP_FD, which the agent
     * closes once it is bound) becomes close-on-exec (close_range(2), Linux
     * 5.11); on an older kernel, one fcntl per possible fd up to
     * RLIMIT_NOFILE. */
    unsigned first = tree >= 0 ? SPAWN_INTERP_FD + 1 : SPAWN_INTERP_FD;
    if (CSYS(SYS_close_range, first, ~0U, CLOSE_RANGE_CLOEXEC) != 0) {
        struct rlimit rl;
        if (CSYS(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl) != 0)
            CSYS(SYS_exit_group, 3);
        for (unsigned long fd = first; fd < rl.rlim_cur; fd++)
            CSYS(SYS_fcntl, (int)fd, F_SETFD, FD_CLOEXEC);
    }
    if (vm)
        child_signals_reset(&a->restore);
    CSYS(SYS_execveat, afd, "", argv, envp, AT_EMPTY_PATH);
    /* Where execveat is missing (ENOSYS) or cannot take an empty path
     * (valgrind 3.19 resolves it by name: ENOENT for a memfd), exec the
     * memfd by its /proc path, as fexecve(3) does without execveat.  The
     * path is built by hand: no snprintf here. */
    char path[32] = "/proc/self/fd/";
    char digits[12];
    int nd = 0;
    for (long v = afd; nd == 0 || v > 0; v /= 10)
        digits[nd++] = (char)('0' + v % 10);
    size_t at = 14; /* strlen("/proc/self/fd/") */
    while (nd > 0)
        path[at++] = digits[--nd];
    path[at] = '\0';
    CSYS(SYS_execve, path, argv, envp);
    CSYS(SYS_exit_group, 127);
    __builtin_unreachable();
}



#if SPAWN_VM
static int SPAWN_NO_ASAN
child_entry(void *arg)
{
    spawn_child_main(arg, true);
}

long
spawn_child_clone_vm(struct clone_args *ca, struct spawn_child *a)
{
    sigset_t all;
    sigfillset(&all);
    ca->flags |= CLONE_VM;
    /* Raw: glibc's pthread_sigmask leaves its own two signals open. */
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &a->restore, 8);
    long r = clone3_vm(ca, child_entry, a);
    syscall(SYS_rt_sigprocmask, SIG_SETMASK, &a->restore, NULL, 8);
    return r;
}
#else
long
spawn_child_clone_vm(struct clone_args *ca, struct spawn_child *a)
{
    (void)ca;
    (void)a;
    return -ENOSYS;
}
#endif
