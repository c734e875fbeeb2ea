/* spawn.c — container start and stop on the host; see spawn.h. */
#include "spawn.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <linux/sched.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/frame.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "image_store.h"
#include "seccomp.h"

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

/* The fd number the agent inherits the interpreter drivers' detached tree
 * at (after 3, the channel), when its argv says "--interp-tree"
 * (container/agent/agent.h AGENT_INTERP_TREE_FD). */
#define SPAWN_INTERP_FD 4

struct sbx_spawner {
    struct sbx_spawn_conf conf;
    int agent_fd;          /* sealed memfd */
    char *cfg;             /* the agent's configuration frame */
    size_t cfg_len;
    pthread_mutex_t mu;
    uint8_t *uid_used;     /* one byte per uid slot */
    uint32_t uid_next;
    _Atomic uint64_t serial;
    int devnull;
    bool no_clone3;        /* clone3(2) is ENOSYS here: clone(2) instead (below) */
};

/* Copy the agent binary into a sealed, read-only memfd. */
static int
seal_agent(const char *path, int *out)
{
    int rc = 0, src = -1;
    int fd = memfd_create("sbx-agent", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return -errno;
    src = open(path, O_RDONLY | O_CLOEXEC);
    if (src < 0) {
        rc = -errno;
        goto out;
    }
    char buf[65536];
    for (;;) {
        ssize_t r = read(src, buf, sizeof(buf));
        if (r < 0) {
            if (errno == EINTR)
                continue;
            rc = -errno;
            goto out;
        }
        if (r == 0)
            break;
        if ((rc = sbx_write_full(fd, buf, (size_t)r)) != 0)
            goto out;
    }
    if (fchmod(fd, 0555) < 0 ||
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) < 0) {
        rc = -errno;
        goto out;
    }
out:
    if (src >= 0)
        close(src);
    if (rc) {
        close(fd);
        return rc;
    }
    *out = fd;
    return 0;
}

static void
enc_strv(sbx_enc *e, const char *key, const char *const *v)
{
    sbx_enc_karray(e, key);
    for (; v && *v; v++)
        sbx_enc_str(e, *v);
    sbx_enc_end(e);
}

int
sbx_spawner_new(sbx_spawner **out, const struct sbx_spawn_conf *conf, char *why, size_t whylen)
{
    int rc;
    struct sbx_bpf bpf[2] = {{0}};
    sbx_spawner *sp = sbx_xcalloc(1, sizeof(*sp));
    sp->conf = *conf;
    sp->agent_fd = -1;
    sp->devnull = -1;
    if (sp->conf.uid_count == 0)
        sp->conf.uid_count = 65536;
    if (sp->conf.setup_timeout_ms <= 0)
        sp->conf.setup_timeout_ms = 10000;
    if ((rc = seal_agent(conf->agent_path, &sp->agent_fd)) != 0) {
        snprintf(why, whylen, "cannot load the agent binary %s: %s", conf->agent_path,
                 strerror(-rc));
        goto fail;
    }
    if ((rc = sbx_seccomp_build(bpf)) != 0) {
        snprintf(why, whylen, "cannot build the seccomp filter: %s", sbx_err_message(rc));
        goto fail;
    }
    /* clone3(2) (Linux 5.3) can be missing: older kernels, seccomp profiles
     * that answer ENOSYS for it (Docker's default), valgrind.  clone(2) then
     * creates the same namespaces; what it cannot do is start the child in
     * its cgroup v2 (CLONE_INTO_CGROUP), so the child is attached before it
     * is let go and the agent makes the cgroup namespace, as on cgroup v1.
     * The probe's NULL arguments make a supporting kernel answer EINVAL. */
    sp->no_clone3 = syscall(SYS_clone3, NULL, 0) < 0 && errno == ENOSYS;
    if (sp->no_clone3)
        sbx_log_info("spawn: clone3(2) is not available; containers start with clone(2)");
    if (conf->interp_dir) {
        /* Say once when sandboxes will have to open the drivers' path
         * themselves (sbx_container_start: no open_tree). */
        int t = (int)syscall(SYS_open_tree, AT_FDCWD, conf->interp_dir,
                             OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        if (t >= 0)
            close(t);
        else
            sbx_log_warn("spawn: open_tree(%s): %s; sandboxes open the interpreter drivers by "
                     "path, which every directory above them must let others search",
                     conf->interp_dir, strerror(errno));
    }
    sp->devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (sp->devnull < 0) {
        rc = -errno;
        snprintf(why, whylen, "open /dev/null");
        goto fail;
    }
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kstr(&e, "hostname", "sandbox");
    sbx_enc_kbool(&e, "unshare_cgroupns",
                  sbx_cgroups_mode(conf->cgroups) != SBX_CG_V2 || sp->no_clone3);
    sbx_enc_kint(&e, "rw_size", (int64_t)conf->rw_size);
    sbx_enc_kint(&e, "rw_inodes", (int64_t)conf->rw_inodes);
    sbx_enc_kint(&e, "shm_size", (int64_t)conf->shm_size);
    sbx_enc_kint(&e, "output_cap", (int64_t)conf->output_cap);
    sbx_enc_kint(&e, "nofile", conf->nofile);
    sbx_enc_kint(&e, "nproc", conf->nproc);
    if (conf->interp_dir)
        sbx_enc_kstr(&e, "interp_dir", conf->interp_dir);
    enc_strv(&e, "etc", conf->etc);
    enc_strv(&e, "env", conf->env);
    sbx_enc_karray(&e, "seccomp");
    sbx_enc_bin(&e, bpf[0].prog, bpf[0].len);
    sbx_enc_bin(&e, bpf[1].prog, bpf[1].len);
    sbx_enc_end(&e);
    sbx_enc_end(&e);
    if ((rc = sbx_enc_finish(&e, &sp->cfg, &sp->cfg_len)) != 0)
        goto fail;
    free(bpf[0].prog);
    free(bpf[1].prog);
    sp->conf.etc = NULL; /* only needed for the frame; not owned */
    sp->conf.env = NULL;
    pthread_mutex_init(&sp->mu, NULL);
    sp->uid_used = sbx_xcalloc(sp->conf.uid_count, 1);
    *out = sp;
    return 0;
fail:
    free(bpf[0].prog);
    free(bpf[1].prog);
    if (sp->agent_fd >= 0)
        close(sp->agent_fd);
    if (sp->devnull >= 0)
        close(sp->devnull);
    free(sp);
    return rc;
}

void
sbx_spawner_free(sbx_spawner *sp)
{
    if (!sp)
        return;
    close(sp->agent_fd);
    close(sp->devnull);
    free(sp->cfg);
    free(sp->uid_used);
    pthread_mutex_destroy(&sp->mu);
    free(sp);
}

static int
uid_alloc(sbx_spawner *sp, uint32_t *uid)
{
    int rc = -EAGAIN;
    pthread_mutex_lock(&sp->mu);
    for (uint32_t i = 0; i < sp->conf.uid_count; i++) {
        uint32_t k = (sp->uid_next + i) % sp->conf.uid_count;
        if (!sp->uid_used[k]) {
            sp->uid_used[k] = 1;
            sp->uid_next = k + 1;
            *uid = sp->conf.uid_base + k;
            rc = 0;
            break;
        }
    }
    pthread_mutex_unlock(&sp->mu);
    return rc;
}

static void
uid_free(sbx_spawner *sp, uint32_t uid)
{
    pthread_mutex_lock(&sp->mu);
    if (uid >= sp->conf.uid_base && uid - sp->conf.uid_base < sp->conf.uid_count)
        sp->uid_used[uid - sp->conf.uid_base] = 0;
    pthread_mutex_unlock(&sp->mu);
}

/*
 * Containers are cloned from the shard with CLONE_VM where the architecture
 * allows it (x86-64 here; clone_vm below): the child shares the shard's
 * memory until its exec instead of getting a copy of it.  A fork-like clone
 * copies the caller's page tables under its mmap lock for writing (the
 * shard's other threads wait at their next page fault) and the exec throws
 * the copy away; both grow with the shard, which holds every sandbox's
 * actor, so container starts slowed as sandboxes accumulated
 * (docs/benchmarks.md, "Density": `copy_page_range` in the profile).  The
 * child of a CLONE_VM clone may touch nothing the shard's threads write:
 * its own stack (mmap'd per start, freed once the child has exec'd or been
 * reaped), and read-only the arguments below.  Not even errno, which lives
 * in the calling thread's TLS: its system calls go through CSYS, raw (the
 * result or -errno, no errno).  Every other architecture keeps the
 * fork-like clone, where CSYS is syscall(2).  This is what glibc's
 * posix_spawn does (sysdeps/unix/sysv/linux/spawni.c: CLONE_VM|CLONE_VFORK
 * on a stack of its own, signals blocked, handlers reset in the child); a
 * container's child cannot be a vfork, as the shard writes its uid map
 * between the clone and the exec.
 */
#if defined(__x86_64__)
#define SPAWN_VM 1
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
#define SPAWN_VM 0
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

/* The child's stack for clone_vm: child_main needs well under 4 KiB. */
#define SPAWN_STACK (64 * 1024)

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
 * The child between clone3 (or clone) and execveat.  It shares nothing with the parent
 * but a copy of its memory, and other threads may have held glibc locks at
 * the moment of the clone: only raw system calls from here on.
 *
 * Until its exec this child holds a copy of every descriptor of the shard:
 * the LMDB files, the host locks in /run/sbx, and the shard's end of the
 * channel of every container being started at that moment.  So it must
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
 * Started by clone_vm (below) the child also shares the shard's memory until
 * its exec, runs on its own small stack with every signal blocked, and
 * `restore` is the mask to exec the agent with (child_signals_reset).
 */
static void __attribute__((noreturn)) SPAWN_NO_ASAN
child_main(sbx_spawner *sp, int chan, int parent_end, int tree, const int *tasks, int ntasks,
           int wait_ms, const char *const *argv, const char *const *envp,
           const sigset_t *restore)
{
    char go = 0;
    if (CSYS(SYS_prctl, PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) != 0)
        CSYS(SYS_exit_group, 1);
    CSYS(SYS_close, parent_end);
    for (int i = 0; i < ntasks; i++)
        if (CSYS(SYS_write, tasks[i], "0", 1) != 1)
            CSYS(SYS_exit_group, 4);
    struct pollfd pfd = {.fd = chan, .events = POLLIN};
    struct timespec ts = {wait_ms / 1000, (long)(wait_ms % 1000) * 1000000L};
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
    long afd = CSYS(SYS_fcntl, sp->agent_fd, F_DUPFD_CLOEXEC, 16);
    long nfd = CSYS(SYS_fcntl, sp->devnull, F_DUPFD_CLOEXEC, 16);
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
    if (restore)
        child_signals_reset(restore);
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

/* child_main's arguments through clone3_vm: on the caller's stack, which
 * lives until the child has exec'd or been reaped (container_start). */
struct child_args {
    sbx_spawner *sp;
    int chan, parent_end, tree, ntasks, wait_ms;
    const int *tasks;
    const char *const *argv;
    const char *const *envp;
    sigset_t restore;
};

#if SPAWN_VM
static int SPAWN_NO_ASAN
child_entry(void *arg)
{
    const struct child_args *a = arg;
    child_main(a->sp, a->chan, a->parent_end, a->tree, a->tasks, a->ntasks, a->wait_ms, a->argv,
               a->envp, &a->restore);
}
#endif

/* "0 <id> 1", and "<inner2> <id2> 1" when id2 is set and inner2 is not 0
 * (an image's User, sbx_container_start_image). */
static int
write_map(pid_t pid, const char *file, uint32_t id, uint32_t inner2, uint32_t id2,
          const struct sbx_container *groups)
{
    char path[64], val[96 + 8 * 24];
    snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, file);
    if (id2 && inner2)
        snprintf(val, sizeof(val), "0 %u 1\n%u %u 1\n", id, inner2, id2);
    else
        snprintf(val, sizeof(val), "0 %u 1\n", id);
    /* gid_map: one line per supplementary group of an image's User. */
    for (int i = 0; groups && i < groups->ngid; i++) {
        size_t n = strlen(val);
        snprintf(val + n, sizeof(val) - n, "%u %u 1\n", groups->gid_in[i], groups->gid_host[i]);
    }
    return sbx_fs_write(path, val);
}

/* Free the host ids of c's supplementary groups. */
static void
gids_free(sbx_spawner *sp, struct sbx_container *c)
{
    for (int i = 0; i < c->ngid; i++)
        uid_free(sp, c->gid_host[i]);
    c->ngid = 0;
}

/* Wait for a frame with a timeout, then read it. */
static int
recv_ready(int fd, int timeout_ms, char **buf, size_t *len)
{
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, timeout_ms);
    if (r == 0)
        return -ETIMEDOUT;
    if (r < 0)
        return -errno;
    return sbx_frame_recv_blocking(fd, 1u << 16, buf, len);
}

/* The idmapped layer mounts of an image container (sbx_container_start_image):
 * one detached mount per layer, made for the child's user namespace. */
static int
image_layer_trees(pid_t pid, const struct sbx_image_root *img, int *fds, char *why,
                  size_t whylen)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0) {
        int e = errno;
        snprintf(why, whylen, "open %s: %s", path, strerror(e));
        return -e;
    }
    int rc = 0;
    for (int i = 0; i < img->nlayers; i++)
        fds[i] = -1;
    for (int i = 0; i < img->nlayers; i++) {
        fds[i] = (int)syscall(SYS_open_tree, AT_FDCWD, img->layers[i],
                              OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
        struct mount_attr ma = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY |
                                            MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                                .userns_fd = (uint64_t)ns};
        if (fds[i] < 0 || syscall(SYS_mount_setattr, fds[i], "", AT_EMPTY_PATH, &ma,
                                  sizeof(ma)) < 0) {
            rc = -errno;
            snprintf(why, whylen, "idmapped mount of layer %s: %s", img->layers[i],
                     strerror(errno));
            break;
        }
    }
    close(ns);
    return rc;
}

/* Send the image frame and the layers' descriptors (see spawn.h). */
static int
image_send(int chan, const struct sbx_image_root *img, const int *fds)
{
    sbx_enc e;
    char *buf = NULL;
    size_t len = 0;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kint(&e, "layers", img->nlayers);
    sbx_enc_karray(&e, "env");
    for (char **p = img->env; p && *p; p++)
        sbx_enc_str(&e, *p);
    sbx_enc_end(&e);
    if (img->workdir)
        sbx_enc_kstr(&e, "workdir", img->workdir);
    if (img->user)
        sbx_enc_kstr(&e, "user", img->user);
    if (img->run_uid || img->run_gid) {
        sbx_enc_kint(&e, "uid", img->run_uid);
        sbx_enc_kint(&e, "gid", img->run_gid);
        sbx_enc_karray(&e, "groups");
        for (int i = 0; i < img->ngroups && i < 8; i++)
            sbx_enc_int(&e, img->groups[i]);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    int rc = sbx_enc_finish(&e, &buf, &len);
    if (rc == 0)
        rc = sbx_frame_send_blocking(chan, buf, len);
    free(buf);
    if (rc)
        return rc;
    char byte = 'L';
    struct iovec io = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int) * 253)];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = CMSG_SPACE(sizeof(int) * (size_t)img->nlayers)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int) * (size_t)img->nlayers);
    memcpy(CMSG_DATA(cm), fds, sizeof(int) * (size_t)img->nlayers);
    ssize_t n;
    while ((n = sendmsg(chan, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    return n == 1 ? 0 : -errno;
}

/* Idmap the workspace's detached mount to the child's user namespace and
 * send it (see spawn.h sbx_container_start_ws). */
static int
ws_send(int chan, pid_t pid, int ws_fd, char *why, size_t whylen)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/ns/user", (int)pid);
    int ns = open(path, O_RDONLY | O_CLOEXEC);
    if (ns < 0) {
        int e = errno;
        snprintf(why, whylen, "open %s: %s", path, strerror(e));
        return -e;
    }
    struct mount_attr ma = {.attr_set = MOUNT_ATTR_IDMAP | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                            .userns_fd = (uint64_t)ns};
    int rc = 0;
    if (syscall(SYS_mount_setattr, ws_fd, "", AT_EMPTY_PATH, &ma, sizeof(ma)) < 0) {
        rc = -errno;
        snprintf(why, whylen, "idmapped mount of the workspace: %s", strerror(errno));
    }
    close(ns);
    if (rc)
        return rc;
    char byte = 'W';
    struct iovec io = {.iov_base = &byte, .iov_len = 1};
    union {
        char buf[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    memset(&u, 0, sizeof(u));
    struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.buf,
                        .msg_controllen = sizeof(u.buf)};
    struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &ws_fd, sizeof(int));
    ssize_t n;
    while ((n = sendmsg(chan, &mh, MSG_NOSIGNAL)) < 0 && errno == EINTR)
        ;
    if (n != 1) {
        rc = n < 0 ? -errno : -EPIPE;
        snprintf(why, whylen, "send the workspace to the agent: %s", strerror(-rc));
    }
    return rc;
}

static int container_start(sbx_spawner *sp, const struct sbx_limits *lim,
                           const struct sbx_image_root *img, int ws_fd,
                           struct sbx_container *c, char *why, size_t whylen);

int
sbx_container_start(sbx_spawner *sp, const struct sbx_limits *lim, struct sbx_container *c,
                    char *why, size_t whylen)
{
    return container_start(sp, lim, NULL, -1, c, why, whylen);
}

int
sbx_container_start_ws(sbx_spawner *sp, const struct sbx_limits *lim,
                       const struct sbx_image_root *img, int ws_fd, struct sbx_container *c,
                       char *why, size_t whylen)
{
    int rc;
    if (img && (img->nlayers < 1 || img->nlayers > 253)) {
        snprintf(why, whylen, "an image of %d layers cannot be mounted", img->nlayers);
        rc = SBX_E_CONTAINER;
    } else {
        rc = container_start(sp, lim, img, ws_fd, c, why, whylen);
    }
    if (rc) {
        close(ws_fd);
        return rc;
    }
    c->ws = true;
    c->ws_fd = ws_fd;
    if (img) {
        c->image = true;
        c->use_fd = img->use_fd >= 0 ? fcntl(img->use_fd, F_DUPFD_CLOEXEC, 3) : -1;
    }
    return 0;
}

int
sbx_container_start_image(sbx_spawner *sp, const struct sbx_limits *lim,
                          const struct sbx_image_root *img, struct sbx_container *c, char *why,
                          size_t whylen)
{
    if (!img || img->nlayers < 1 || img->nlayers > 253) {
        snprintf(why, whylen, "an image of %d layers cannot be mounted", img ? img->nlayers : 0);
        return SBX_E_CONTAINER;
    }
    int rc = container_start(sp, lim, img, -1, c, why, whylen);
    if (rc == 0) {
        c->image = true;
        c->use_fd = img->use_fd >= 0 ? fcntl(img->use_fd, F_DUPFD_CLOEXEC, 3) : -1;
    }
    return rc;
}

static int
container_start(sbx_spawner *sp, const struct sbx_limits *lim, const struct sbx_image_root *img,
                int ws_fd, struct sbx_container *c, char *why, size_t whylen)
{
    int layer_fds[253];
    int nlayer_fds = 0;
    int sv[2] = {-1, -1};
    int pidfd = -1, tree = -1;
    int tasks[SBX_CG_MAX_HIER], ntasks = 0; /* v1: the cgroup's tasks files, for the child */
    pid_t pid = -1;
    int rc = 0;
    char *ready = NULL;
    size_t ready_len = 0;
    sbx_msg msg;
    bool have_msg = false;
    char name[64];
    void *stack = MAP_FAILED;  /* the child's stack (CLONE_VM), until it exec'd or died */
    struct child_args cargs __attribute__((unused)); /* what the CLONE_VM child reads, as long */

    memset(c, 0, sizeof(*c));
    c->pidfd = c->chan = -1;
    c->cg.v2_fd = -1;
    int64_t t0 = sbx_mono_us();
    c->serial = atomic_fetch_add(&sp->serial, 1) + 1;
    if ((rc = uid_alloc(sp, &c->uid)) != 0) {
        snprintf(why, whylen, "no free sandbox uid (%u live sandboxes)", sp->conf.uid_count);
        return SBX_E_CONTAINER;
    }
    if (img && (img->run_uid || img->run_gid) && uid_alloc(sp, &c->uid2) != 0) {
        uid_free(sp, c->uid);
        c->uid = 0;
        snprintf(why, whylen, "no free sandbox uid for the image's User (%u ids in use)",
                 sp->conf.uid_count);
        return SBX_E_CONTAINER;
    }
    /* Its supplementary groups: one more host id each (docs/images.md, "User"). */
    for (int i = 0; img && c->uid2 && i < img->ngroups && i < 8; i++) {
        if (img->groups[i] == 0 || img->groups[i] == img->run_gid)
            continue; /* mapped already */
        if (uid_alloc(sp, &c->gid_host[c->ngid]) != 0) {
            gids_free(sp, c);
            uid_free(sp, c->uid2);
            uid_free(sp, c->uid);
            c->uid = c->uid2 = 0;
            snprintf(why, whylen, "no free sandbox id for the image User's groups (%u ids in use)",
                     sp->conf.uid_count);
            return SBX_E_CONTAINER;
        }
        c->gid_in[c->ngid++] = img->groups[i];
    }
    snprintf(name, sizeof(name), "c%d-%llu", (int)getpid(), (unsigned long long)c->serial);
    rc = sbx_cgroup_create(sp->conf.cgroups, name, lim, &c->cg);
    if (rc) {
        snprintf(why, whylen, "create cgroup %s: %s", name, strerror(-rc));
        goto fail;
    }
    if ((rc = sbx_cgroup_open_tasks(sp->conf.cgroups, &c->cg, tasks, &ntasks)) != 0) {
        snprintf(why, whylen, "open the tasks files of cgroup %s: %s", name, strerror(-rc));
        goto fail;
    }
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = -errno;
        snprintf(why, whylen, "socketpair");
        goto fail;
    }
    /*
     * The interpreter drivers' directory, as a detached copy of its mount
     * (open_tree(2) OPEN_TREE_CLONE, Linux 5.2) made here by the shard: the
     * agent runs as an unprivileged host uid that may not be able to search
     * the path (a checkout under /root, mode 0700), and a plain fd would
     * name a mount of the host's namespace, which cannot be bound into the
     * container's (EINVAL).  The agent attaches it with move_mount(2).
     * Without open_tree (ENOSYS; valgrind) the agent opens the path itself.
     */
    if (sp->conf.interp_dir)
        tree = (int)syscall(SYS_open_tree, AT_FDCWD, sp->conf.interp_dir,
                            OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC);
    /* argv/envp are built before the clone: the child may not allocate.
     * "--interp-tree" tells the agent the drivers' tree is at
     * SPAWN_INTERP_FD. */
    const char *argv[5] = {"sbx-agent", NULL, NULL, NULL, NULL};
    int ac = 1;
    if (tree >= 0)
        argv[ac++] = "--interp-tree";
    if (ws_fd >= 0)
        argv[ac++] = "--workspace"; /* its mount follows the image's layers */
    if (img)
        argv[ac++] = "--image"; /* the image frame and layers follow the configuration */
    /* A sanitizer build of the agent carries its own options
     * (__asan_default_options in agent/main.c).  The agent logs to the
     * shard's stderr at the shard's level and in its format (a JSON log
     * stays JSON, docs/operations.md "Logs"); its own children never see
     * this environment (each gets the sandbox's). */
    const char *log_level, *log_format;
    sbx_log_env(&log_level, &log_format);
    const char *const envp[] = {"PATH=/usr/sbin:/usr/bin:/sbin:/bin", log_level, log_format,
                                NULL};

    struct clone_args ca;
    memset(&ca, 0, sizeof(ca));
    ca.flags = CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS |
               CLONE_NEWIPC | CLONE_PIDFD;
    ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
    ca.exit_signal = SIGCHLD;
    if (sbx_cgroups_mode(sp->conf.cgroups) == SBX_CG_V2 && c->cg.v2_fd >= 0) {
        ca.flags |= CLONE_INTO_CGROUP | CLONE_NEWCGROUP;
        ca.cgroup = (uint64_t)c->cg.v2_fd;
    }
    /* The parent attaches the child only where the child cannot join by
     * itself (v2 after clone(2)); on v1 the child writes its tasks files. */
    bool attach = false;
    if (SPAWN_VM && !sp->no_clone3) {
#if SPAWN_VM
        /* Shares the shard's memory until its exec (clone3_vm, above), on a
         * stack of its own below a guard page, with every signal blocked
         * meanwhile (a handler of the shard's must not run in it). */
        stack = mmap(NULL, SPAWN_STACK, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (stack == MAP_FAILED || mprotect(stack, 4096, PROT_NONE) != 0) {
            rc = -errno;
            snprintf(why, whylen, "the child's stack: %s", strerror(errno));
            goto fail;
        }
        ca.flags |= CLONE_VM;
        ca.stack = (uint64_t)(uintptr_t)stack;
        ca.stack_size = SPAWN_STACK;
        cargs = (struct child_args){.sp = sp, .chan = sv[1], .parent_end = sv[0], .tree = tree,
                                    .ntasks = ntasks, .wait_ms = sp->conf.setup_timeout_ms,
                                    .tasks = tasks, .argv = (const char *const *)argv,
                                    .envp = envp};
        sigset_t all;
        sigfillset(&all);
        /* Raw: glibc's pthread_sigmask leaves its own two signals open. */
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &all, &cargs.restore, 8);
        long r = clone3_vm(&ca, child_entry, &cargs);
        syscall(SYS_rt_sigprocmask, SIG_SETMASK, &cargs.restore, NULL, 8);
        if (r < 0)
            errno = (int)-r;
        pid = r < 0 ? -1 : (pid_t)r;
#endif
    } else if (!sp->no_clone3) {
        pid = (pid_t)syscall(SYS_clone3, &ca, sizeof(ca));
    } else {
        /* clone(2): no stack (fork-like), the pidfd at parent_tid; the
         * cgroup is joined below, before the child runs the agent. */
        pid = (pid_t)syscall(SYS_clone, (unsigned long)(ca.flags & ~(CLONE_INTO_CGROUP |
                                                                       CLONE_NEWCGROUP)) |
                                             SIGCHLD,
                             NULL, &pidfd, NULL, NULL);
        attach = ntasks == 0;
    }
    if (pid < 0) {
        rc = -errno;
        snprintf(why, whylen, "%s with new namespaces: %s", sp->no_clone3 ? "clone" : "clone3",
                 strerror(errno));
        goto fail;
    }
    if (pid == 0)
        child_main(sp, sv[1], sv[0], tree, tasks, ntasks, sp->conf.setup_timeout_ms,
                   (const char *const *)argv, envp, NULL);
    if (tree >= 0)
        close(tree);
    tree = -1;
    while (ntasks > 0)
        close(tasks[--ntasks]);

    close(sv[1]);
    sv[1] = -1;
    c->pid = pid;
    c->pidfd = pidfd;
    if ((rc = write_map(pid, "uid_map", c->uid, img ? img->run_uid : 0, c->uid2, NULL)) != 0 ||
        (rc = write_map(pid, "gid_map", c->uid, img ? img->run_gid : 0, c->uid2, c)) != 0) {
        snprintf(why, whylen, "write uid/gid map: %s", strerror(-rc));
        goto fail;
    }
    if (attach && (rc = sbx_cgroup_attach(sp->conf.cgroups, &c->cg, pid)) != 0) {
        snprintf(why, whylen, "attach to cgroup: %s", strerror(-rc));
        goto fail;
    }
    if (img) {
        if ((rc = image_layer_trees(pid, img, layer_fds, why, whylen)) != 0) {
            nlayer_fds = img->nlayers;
            goto fail;
        }
        nlayer_fds = img->nlayers;
    }
    if ((rc = sbx_write_full(sv[0], "G", 1)) != 0 ||
        (rc = sbx_frame_send_blocking(sv[0], sp->cfg, sp->cfg_len)) != 0 ||
        (img && (rc = image_send(sv[0], img, layer_fds)) != 0)) {
        snprintf(why, whylen, "send the configuration to the agent: %s", strerror(-rc));
        goto fail;
    }
    if (ws_fd >= 0 && (rc = ws_send(sv[0], pid, ws_fd, why, whylen)) != 0)
        goto fail;
    while (nlayer_fds > 0)
        close(layer_fds[--nlayer_fds]);
    rc = recv_ready(sv[0], sp->conf.setup_timeout_ms, &ready, &ready_len);
    if (rc) {
        snprintf(why, whylen, "the agent did not report ready: %s",
                 rc == -EPIPE ? "it exited during set-up (see its log)" : strerror(-rc));
        goto fail;
    }
    if (sbx_wire_decode(&msg, ready, ready_len, &sbx_wire_limits_request) != 0) {
        rc = SBX_E_CONTAINER;
        snprintf(why, whylen, "malformed ready frame from the agent");
        goto fail;
    }
    have_msg = true;
    bool ok = false;
    sbx_wire_get_bool(msg.root, "ready", &ok);
    if (!ok) {
        sbx_str step = {"?", 1}, m = {"", 0};
        sbx_wire_get_str(msg.root, "step", &step);
        sbx_wire_get_str(msg.root, "message", &m);
        snprintf(why, whylen, "sandbox set-up failed at '%.*s': %.*s", (int)step.n, step.p,
                 (int)m.n, m.p);
        rc = SBX_E_CONTAINER;
        goto fail;
    }
    /* The agent's OOM score, without a floor for the tenant (issue 16
     * item 7).  A privileged write of oom_score_adj also sets the process's
     * oom_score_adj_min — the value below which it may not go again without
     * CAP_SYS_RESOURCE — and every process it forks inherits that floor:
     * writing -998 there let every tenant process lower itself to -998 and
     * outlive sbxd in a host-wide OOM.  So: oom_score_adj 0, which (when we
     * hold CAP_SYS_RESOURCE) also resets any floor inherited from sbxd (a
     * systemd OOMScoreAdjust=, say) to 0; then the legacy oom_adj -16
     * (= oom_score_adj -941), which lowers the agent without moving its
     * floor (proc(5); fs/proc/base.c __set_oom_adj updates the floor for
     * oom_score_adj writes only).  Tenant processes raise themselves to
     * +500 (container/agent/proctree.c) and can never go below 0.  Best
     * effort: without CAP_SYS_RESOURCE (some hosts and VMs withhold it from
     * root) the agent stays at 0 and the floor is sbxd's own.
     * Written once the agent has exec'd (its "ready"; it forks nothing
     * before): until then a CLONE_VM child shares the shard's memory, and
     * the kernel applies an oom_score_adj write to every process sharing
     * the target's memory (__set_oom_adj) — the shard itself. */
    char adj[64];
    snprintf(adj, sizeof(adj), "/proc/%d/oom_score_adj", (int)pid);
    sbx_fs_write(adj, "0");
    snprintf(adj, sizeof(adj), "/proc/%d/oom_adj", (int)pid);
    sbx_fs_write(adj, "-16");
    sbx_wire_msg_free(&msg);
    free(ready);
    if (stack != MAP_FAILED)
        munmap(stack, SPAWN_STACK); /* the agent is running: the child exec'd */
    c->chan = sv[0];
    c->start_us = sbx_mono_us() - t0;
    return 0;
fail:
    while (nlayer_fds > 0)
        if (layer_fds[--nlayer_fds] >= 0)
            close(layer_fds[nlayer_fds]);
    if (tree >= 0)
        close(tree);
    while (ntasks > 0)
        close(tasks[--ntasks]);
    if (have_msg)
        sbx_wire_msg_free(&msg);
    free(ready);
    if (sv[0] >= 0)
        close(sv[0]);
    if (sv[1] >= 0)
        close(sv[1]);
    c->chan = -1;
    if (pid > 0) {
        syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, NULL, 0);
        siginfo_t si;
        while (waitid((idtype_t)P_PIDFD, (id_t)pidfd, &si, WEXITED) < 0 && errno == EINTR)
            ;
    }
    if (pidfd >= 0)
        close(pidfd);
    if (stack != MAP_FAILED)
        munmap(stack, SPAWN_STACK); /* the child was reaped above, or never was */
    c->pidfd = -1;
    c->pid = 0;
    sbx_cgroup_destroy(sp->conf.cgroups, &c->cg, 2000);
    uid_free(sp, c->uid);
    c->uid = 0;
    if (c->uid2)
        uid_free(sp, c->uid2);
    c->uid2 = 0;
    gids_free(sp, c);
    return rc < 0 ? rc : SBX_E_CONTAINER;
}

void
sbx_container_stop(sbx_spawner *sp, struct sbx_container *c)
{
    if (c->chan >= 0) {
        close(c->chan);
        c->chan = -1;
    }
    if (c->pidfd >= 0) {
        /* PID 1 dies; the kernel kills the rest of its pid namespace and
         * waits for them before PID 1 can be reaped. */
        syscall(SYS_pidfd_send_signal, c->pidfd, SIGKILL, NULL, 0);
        siginfo_t si;
        while (waitid((idtype_t)P_PIDFD, (id_t)c->pidfd, &si, WEXITED) < 0 && errno == EINTR)
            ;
        close(c->pidfd);
        c->pidfd = -1;
    }
    if (c->cg.created) {
        int rc = sbx_cgroup_destroy(sp->conf.cgroups, &c->cg, 5000);
        if (rc)
            sbx_log_warn("container %llu: cgroup %s not removed: %s", (unsigned long long)c->serial,
                     c->cg.name, strerror(-rc));
    } else if (c->cg.v2_fd >= 0) {
        close(c->cg.v2_fd);
        c->cg.v2_fd = -1;
    }
    if (c->uid) {
        uid_free(sp, c->uid);
        c->uid = 0;
    }
    if (c->uid2) {
        uid_free(sp, c->uid2);
        c->uid2 = 0;
    }
    gids_free(sp, c);
    if (c->image) {
        if (c->use_fd >= 0)
            close(c->use_fd); /* the image's use lock: GC may take it now */
        c->image = false;
        c->use_fd = -1;
    }
    if (c->ws) {
        if (c->ws_fd >= 0)
            close(c->ws_fd); /* with the container gone, the kernel drops the mount */
        c->ws = false;
        c->ws_fd = -1;
    }
    c->pid = 0;
}

void
sbx_container_kill(const struct sbx_container *c)
{
    if (c->pidfd >= 0)
        syscall(SYS_pidfd_send_signal, c->pidfd, SIGKILL, NULL, 0);
}

int
sbx_container_stats(sbx_spawner *sp, struct sbx_container *c, struct sbx_cgroup_stats *st)
{
    return sbx_cgroup_stats(sp->conf.cgroups, &c->cg, st);
}

int
sbx_container_set_limits(sbx_spawner *sp, struct sbx_container *c, const struct sbx_limits *lim)
{
    return sbx_cgroup_set_limits(sp->conf.cgroups, &c->cg, lim);
}
