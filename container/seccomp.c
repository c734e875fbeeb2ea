/* seccomp.c — build the sandbox's seccomp programs; see seccomp.h. */
#include "seccomp.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/sched.h>
#include <linux/seccomp.h>
#include <seccomp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"

const char *const sbx_seccomp_denied[] = {
    /* mount family, old and new API, and root changes */
    "mount", "umount", "umount2", "pivot_root", "chroot", "fsopen", "fsconfig", "fsmount",
    "fspick", "move_mount", "open_tree", "mount_setattr",
    /* namespaces */
    "unshare", "setns",
    /* kernel attack surface */
    "bpf", "perf_event_open", "userfaultfd", "io_uring_setup", "io_uring_enter",
    "io_uring_register", "keyctl", "add_key", "request_key",
    /* other processes */
    "ptrace", "process_vm_readv", "process_vm_writev", "kcmp", "pidfd_getfd", "process_madvise",
    /* host administration */
    "init_module", "finit_module", "delete_module", "create_module", "query_module",
    "get_kernel_syms", "kexec_load", "kexec_file_load", "reboot", "swapon", "swapoff", "acct",
    "quotactl", "quotactl_fd", "settimeofday", "clock_settime", "stime", "iopl", "ioperm",
    "syslog", "sethostname", "setdomainname", "vhangup", "fanotify_init", "open_by_handle_at",
    "lookup_dcookie", "nfsservctl", "uselib", "ustat", "sysfs", "_sysctl", "modify_ldt",
    "mbind", "set_mempolicy", "get_mempolicy", "set_mempolicy_home_node", "move_pages",
    "migrate_pages", "afs_syscall", "tuxcall", "security", "vserver", "getpmsg", "putpmsg",
    "vm86", "vm86old", "lsm_get_self_attr", "lsm_set_self_attr", "lsm_list_modules",
    NULL,
};

static int
export_bpf(scmp_filter_ctx ctx, struct sbx_bpf *out)
{
    int rc = 0;
    char *p = NULL;
    size_t n = 0;
    int fd = memfd_create("sbx-bpf", MFD_CLOEXEC);
    if (fd < 0)
        return -errno;
    rc = seccomp_export_bpf(ctx, fd);
    if (rc < 0)
        goto out;
    off_t end = lseek(fd, 0, SEEK_END);
    if (end <= 0) {
        rc = -EIO;
        goto out;
    }
    n = (size_t)end;
    p = sbx_xmalloc(n);
    if (pread(fd, p, n, 0) != (ssize_t)n) {
        rc = -EIO;
        free(p);
        goto out;
    }
    out->prog = p;
    out->len = n;
out:
    close(fd);
    return rc;
}

#define RULE(ctx, act, sys, ...)                                                         \
    do {                                                                                 \
        int r_ = seccomp_rule_add((ctx), (act), (sys), __VA_ARGS__);                     \
        if (r_ < 0) {                                                                    \
            sbx_log_error("seccomp: rule for %s: %s", #sys, strerror(-r_));                 \
            rc = r_;                                                                     \
            goto out;                                                                    \
        }                                                                                \
    } while (0)

/*
 * Syscalls sorted into a binary tree (libseccomp 2.5, SCMP_FLTATR_CTL_OPTIMIZE
 * = 2) instead of one comparison after another.  Loading is what it buys:
 * the kernel walks each filter once per syscall number at load time to find
 * the ones it always allows (the seccomp action cache, Linux 5.11), a walk
 * that is O(n) in a linear program.  Loading both programs in a child took
 * 0.50 ms linear and 0.21 ms as trees (100 loads each, three runs,
 * docs/benchmarks.md "Bursts"); a syscall with argument rules (clone,
 * ioctl, socket, …) is also decided in O(log n) afterwards.  The verdicts
 * are the same (tests/unit/test_seccomp.c runs the exported programs).  An
 * older libseccomp refuses the attribute: the programs stay linear.
 */
static void
set_binary_tree(scmp_filter_ctx ctx)
{
    if (seccomp_attr_set(ctx, SCMP_FLTATR_CTL_OPTIMIZE, 2) < 0)
        sbx_log_debug("seccomp: no binary-tree optimisation in this libseccomp");
}

/*
 * deny_int_outside — rules making syscall `sys` fail with errno `err` when
 * the low 32 bits of its argument `arg` are not one of ok[0..n) (each in
 * 0..31), and, when `cond_arg` >= 0, its argument `cond_arg` has the low 32
 * bits `cond_val` too.  libseccomp ANDs the conditions of one rule and
 * takes one comparison per argument, so "not in the set" is a union: one
 * rule per value in 0..31 that is not allowed, and one per bit 5..31 (any
 * value from 32 up).  Returns 0 or libseccomp's negative code.
 */
static int
deny_int_outside(scmp_filter_ctx ctx, int sys, unsigned arg, const int *ok, size_t n, int err,
                 int cond_arg, uint32_t cond_val)
{
    int rc = 0;
    struct scmp_arg_cmp cond = {(unsigned)(cond_arg < 0 ? 0 : cond_arg), SCMP_CMP_MASKED_EQ,
                                0xFFFFFFFFu, cond_val};
    unsigned ncond = cond_arg < 0 ? 1 : 2;
    for (uint32_t v = 0; v < 64 && rc == 0; v++) {
        struct scmp_arg_cmp c[2];
        if (v < 32) {
            bool allowed = false;
            for (size_t i = 0; i < n; i++)
                allowed |= (uint32_t)ok[i] == v;
            if (allowed)
                continue;
            c[0] = (struct scmp_arg_cmp){arg, SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, v};
        } else if (v >= 32 + 5) {
            uint32_t bit = 1u << (v - 32);
            c[0] = (struct scmp_arg_cmp){arg, SCMP_CMP_MASKED_EQ, bit, bit};
        } else {
            continue;
        }
        c[1] = cond;
        rc = seccomp_rule_add_array(ctx, SCMP_ACT_ERRNO((unsigned)err), sys, ncond, c);
    }
    if (rc < 0)
        sbx_log_error("seccomp: argument rule for syscall %d: %s", sys, strerror(-rc));
    return rc;
}

static int
build_deny(struct sbx_bpf *out)
{
    int rc = 0;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (!ctx)
        return -ENOMEM;
    if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) < 0)
        goto out;
    set_binary_tree(ctx);
    for (const char *const *n = sbx_seccomp_denied; *n; n++) {
        int nr = seccomp_syscall_resolve_name(*n);
        if (nr == __NR_SCMP_ERROR || nr < 0)
            continue; /* not a syscall of this architecture (vm86 on x86_64, …) */
        RULE(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
    }
    RULE(ctx, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(clone3), 0);
    /* clone: any namespace flag.  One rule per flag: conditions within a rule
     * are ANDed, and "some bit of the mask" needs an OR. */
    static const unsigned long nsflags[] = {CLONE_NEWNS,  CLONE_NEWCGROUP, CLONE_NEWUTS,
                                            CLONE_NEWIPC, CLONE_NEWUSER,   CLONE_NEWPID,
                                            CLONE_NEWNET, 0x00000080 /* CLONE_NEWTIME */};
    for (size_t i = 0; i < SBX_ARRAY_LEN(nsflags); i++)
        RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
             SCMP_A0(SCMP_CMP_MASKED_EQ, nsflags[i], nsflags[i]));
    /* Terminal input injection, compared on the low 32 bits only. */
    RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, (unsigned)TIOCSTI));
    RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, (unsigned)TIOCLINUX));
    /* personality(2): only the values Docker's default profile allows —
     * PER_LINUX (0), PER_LINUX32 (0x8), UNAME26 (0x20000), both (0x20008)
     * and the query 0xffffffff.  Anything else can weaken the address
     * space (ADDR_NO_RANDOMIZE, READ_IMPLIES_EXEC, MMAP_PAGE_ZERO, …), and
     * the kernel takes a value with bit 31 set as a persona too.
     * libseccomp accepts one comparison per argument in a rule, so "not in
     * that set" is a union of single-mask rules on the low 32 bits (the
     * kernel's argument is an unsigned int):
     *   bit 31 clear and a bit other than 0x8 / 0x20000 set, or
     *   bit 31 set and some bit of 0..30 clear (0xffffffff is the only
     *   allowed value with bit 31). */
    for (unsigned b = 0; b < 31; b++) {
        uint32_t bit = 1u << b;
        if (bit != 0x8 && bit != 0x20000)
            RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
                 SCMP_A0(SCMP_CMP_MASKED_EQ, bit | 0x80000000u, bit));
        RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(personality), 1,
             SCMP_A0(SCMP_CMP_MASKED_EQ, bit | 0x80000000u, 0x80000000u));
    }
    /* Socket families by allow-list (issue 16 item 9): every family but
     * AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK fails with EAFNOSUPPORT, for
     * socket and socketpair alike (both create a socket of the family, and
     * creating one autoloads its module: TIPC, RDS, CAN, X25, AX25, …).
     * AF_INET/AF_INET6 stay for loopback and egress networking; netlink is
     * kept for NETLINK_ROUTE (ip, getaddrinfo's AI_ADDRCONFIG) and
     * NETLINK_SOCK_DIAG (ss), its other protocols fail with
     * EPROTONOSUPPORT.  The kernel reads family and protocol as ints:
     * compared on the low 32 bits, or garbage in the upper half would pass. */
    static const int fams_ok[] = {AF_UNIX, AF_INET, AF_INET6, AF_NETLINK};
    static const int nl_ok[] = {0 /* NETLINK_ROUTE */, 4 /* NETLINK_SOCK_DIAG */};
    const int socksys[] = {SCMP_SYS(socket), SCMP_SYS(socketpair)};
    for (size_t k = 0; k < SBX_ARRAY_LEN(socksys); k++) {
        if ((rc = deny_int_outside(ctx, socksys[k], 0, fams_ok, SBX_ARRAY_LEN(fams_ok),
                                   EAFNOSUPPORT, -1, 0)) < 0)
            goto out;
        if ((rc = deny_int_outside(ctx, socksys[k], 2, nl_ok, SBX_ARRAY_LEN(nl_ok),
                                   EPROTONOSUPPORT, 0, AF_NETLINK)) < 0)
            goto out;
    }
    /* Line disciplines (n_gsm, n_hdlc, … each a history of CVEs): TIOCSETD
     * refused like TIOCSTI. */
    RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
         SCMP_A1(SCMP_CMP_MASKED_EQ, 0xFFFFFFFFu, (unsigned)TIOCSETD));
    /* Limits of other processes (the agent's among them). */
    RULE(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(prlimit64), 1, SCMP_A0(SCMP_CMP_NE, 0));
    rc = export_bpf(ctx, out);
out:
    seccomp_release(ctx);
    return rc;
}

/* Whether libseccomp knows system call nr of arch: the allow list, in both
 * of its forms below. */
static bool
syscall_known(uint32_t arch, uint32_t nr)
{
    char *name = seccomp_syscall_resolve_num_arch(arch, (int)nr);
    bool known = name != NULL;
    free(name);
    return known;
}

int
sbx_seccomp_build_allow_reference(struct sbx_bpf *out)
{
    int rc = 0;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ERRNO(ENOSYS));
    if (!ctx)
        return -ENOMEM;
    if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) < 0)
        goto out;
    set_binary_tree(ctx);
    uint32_t arch = seccomp_arch_native();
    for (int nr = 0; nr < 1024; nr++)
        if (syscall_known(arch, (uint32_t)nr))
            RULE(ctx, SCMP_ACT_ALLOW, nr, 0);
    rc = export_bpf(ctx, out);
out:
    seccomp_release(ctx);
    return rc;
}

/*
 * The allow list as a program of a few instructions: the numbers libseccomp
 * knows for x86_64 (seccomp_syscall_resolve_num_arch, 0..1023) form a few
 * runs [lo, hi], and the program checks the runs instead of each number,
 * as runc's patchbpf prepends a few comparisons of its own for numbers
 * newer than the newest it knows (runc libcontainer/seccomp/patchbpf).  Its verdicts equal those of
 * libseccomp's program for the same list (sbx_seccomp_build_allow_reference)
 * for every number and architecture (tests/unit/test_seccomp.c
 * compact_allow_list_equals_libseccomps).  Why: the kernel converts, checks
 * and JITs each filter at every sandbox's start and walks it once per
 * system-call number for its action cache; libseccomp's program is one
 * comparison per known number (472 instructions as a tree here), this one
 * 2 per run (docs/benchmarks.md, "the sequential build").
 *
 *   ld arch;  jeq AUDIT_ARCH_X86_64 ? next : kill     (i386 int 0x80, others)
 *   ld nr;    jeq -1 ? enosys : next                  (as libseccomp: -1 is no call)
 *             jge X32 bit ? kill : next               (x32 shares the arch)
 *   per run:  jge lo ? next : enosys;  jgt hi ? next : allow
 *   enosys:   ret ERRNO(ENOSYS);  allow: ret ALLOW;  kill: ret KILL_PROCESS
 *
 * Other architectures keep libseccomp's program.  Returns 0, 1 when not
 * built here (another architecture; too many runs for 8-bit jumps), or a
 * negative code.
 */
#define ALLOW_MAX_RUNS 60

static int
build_allow_compact(struct sbx_bpf *out)
{
    uint32_t arch = seccomp_arch_native();
    if (arch != SCMP_ARCH_X86_64)
        return 1;
    uint32_t lo[ALLOW_MAX_RUNS], hi[ALLOW_MAX_RUNS];
    size_t runs = 0;
    bool in = false;
    for (uint32_t nr = 0; nr < 1024; nr++) {
        bool known = syscall_known(arch, nr);
        if (known && !in) {
            if (runs == ALLOW_MAX_RUNS)
                return 1;
            lo[runs] = nr;
            runs++;
        }
        if (known)
            hi[runs - 1] = nr;
        in = known;
    }
    if (runs == 0)
        return 1;
    size_t n = 5 + 2 * runs + 3;
    struct sock_filter *f = sbx_xmalloc(n * sizeof(*f));
    size_t pc = 0;
    const size_t enosys = n - 3, allow = n - 2, kill = n - 1;
    /* Jump offsets count from the next instruction. */
#define OFF(to) ((uint8_t)((to) - pc - 1))
    f[pc] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS,
                                         offsetof(struct seccomp_data, arch));
    pc++;
    f[pc] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 0, OFF(kill));
    pc++;
    f[pc] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    pc++;
    f[pc] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 0xffffffffu, OFF(enosys), 0);
    pc++;
    f[pc] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, OFF(kill), 0);
    pc++;
    for (size_t i = 0; i < runs; i++) {
        f[pc] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, lo[i], 0, OFF(enosys));
        pc++;
        f[pc] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JGT | BPF_K, hi[i], 0, OFF(allow));
        pc++;
    }
#undef OFF
    f[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS);
    f[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    f[pc++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS);
    out->prog = f;
    out->len = n * sizeof(*f);
    return 0;
}

/*
 * libseccomp judges what the kernel supports by calling seccomp(2) from this
 * process (seccomp_api_get(3)).  The programs are exported here and loaded
 * by the agent in the sandbox, so this process's own view does not matter —
 * and it can be wrong: valgrind does not implement seccomp(2), and a
 * container runtime's profile may hide it; libseccomp then reports API
 * level 1 and refuses SCMP_ACT_KILL_PROCESS (level 3).  The kernel lists the
 * actions it has in /proc/sys/kernel/seccomp/actions_avail (seccomp(2)): if
 * kill_process is there, level 3 is true of it.
 */
static void
api_level_from_kernel(void)
{
    if (seccomp_api_get() >= 3)
        return;
    char *avail = NULL;
    size_t n = 0;
    if (sbx_fs_read("/proc/sys/kernel/seccomp/actions_avail", 4096, &avail, &n) == 0 && avail &&
        strstr(avail, "kill_process")) {
        sbx_log_info("seccomp: libseccomp sees API level %u from this process; the kernel has "
                 "kill_process (actions_avail): building for level 3",
                 seccomp_api_get());
        seccomp_api_set(3);
    }
    free(avail);
}

int
sbx_seccomp_build(struct sbx_bpf out[2])
{
    memset(out, 0, 2 * sizeof(*out));
    api_level_from_kernel();
    int rc = build_deny(&out[0]);
    if (rc == 0 && (rc = build_allow_compact(&out[1])) == 1)
        rc = sbx_seccomp_build_allow_reference(&out[1]);
    if (rc) {
        free(out[0].prog);
        free(out[1].prog);
        memset(out, 0, 2 * sizeof(*out));
        return rc < 0 ? rc : SBX_E_INTERNAL;
    }
    return 0;
}
