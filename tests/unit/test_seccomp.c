/*
 * test_seccomp.c — unit tests for container/seccomp.h, the two filters every
 * sandbox runs under.
 *
 * The programs sbx_seccomp_build() exports are classic BPF over struct
 * seccomp_data (seccomp(2)).  This file runs them through a small evaluator of
 * that instruction set, so a verdict can be asked for any (arch, nr, args) —
 * including the i386 `int 0x80` and x32 entries, which a kernel built or
 * booted without IA32 emulation (CONFIG_IA32_EMULATION=n, ia32_emulation=0)
 * refuses before any filter runs, so that the in-sandbox test
 * (tests/security/test_escape.c) cannot reach the filter's arch check there.
 * The evaluator is checked against the kernel itself: the same programs are
 * loaded in a forked child and each native verdict the evaluator gives is
 * compared with what the kernel does.
 *
 * The combined verdict follows seccomp(2) "Filter return values": with several
 * filters, the action of highest precedence wins (KILL_PROCESS > KILL_THREAD
 * > TRAP > ERRNO > USER_NOTIF > TRACE > LOG > ALLOW).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdbool.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "container/seccomp.h"
#include "runtime/util.h"

#define X32_BIT 0x40000000u

/*
 * Evaluate one classic-BPF seccomp program on `d`; the 32-bit return value,
 * or UINT32_MAX for an instruction this evaluator does not know (the test
 * then fails: it must not guess).  Instruction semantics: linux
 * Documentation/networking/filter.rst; seccomp loads are native-endian 32-bit
 * words of struct seccomp_data.
 */
static uint32_t
bpf_run(const struct sbx_bpf *p, const struct seccomp_data *d)
{
    const struct sock_filter *f = p->prog;
    size_t n = p->len / sizeof(*f);
    uint32_t A = 0, X = 0, M[BPF_MEMWORDS] = {0};
    for (size_t pc = 0; pc < n; pc++) {
        const struct sock_filter *i = &f[pc];
        uint32_t k = i->k;
        switch (i->code) {
        case BPF_LD | BPF_W | BPF_ABS:
            if (k % 4 || k + 4 > sizeof(*d))
                return UINT32_MAX;
            memcpy(&A, (const char *)d + k, 4);
            break;
        case BPF_LD | BPF_IMM: A = k; break;
        case BPF_LDX | BPF_IMM: X = k; break;
        case BPF_LD | BPF_MEM: A = M[k % BPF_MEMWORDS]; break;
        case BPF_LDX | BPF_MEM: X = M[k % BPF_MEMWORDS]; break;
        case BPF_ST: M[k % BPF_MEMWORDS] = A; break;
        case BPF_STX: M[k % BPF_MEMWORDS] = X; break;
        case BPF_MISC | BPF_TAX: X = A; break;
        case BPF_MISC | BPF_TXA: A = X; break;
        case BPF_ALU | BPF_AND | BPF_K: A &= k; break;
        case BPF_ALU | BPF_OR | BPF_K: A |= k; break;
        case BPF_ALU | BPF_AND | BPF_X: A &= X; break;
        case BPF_JMP | BPF_JA: pc += k; break;
        case BPF_JMP | BPF_JEQ | BPF_K: pc += A == k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGT | BPF_K: pc += A > k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGE | BPF_K: pc += A >= k ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JSET | BPF_K: pc += (A & k) ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JEQ | BPF_X: pc += A == X ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGT | BPF_X: pc += A > X ? i->jt : i->jf; break;
        case BPF_JMP | BPF_JGE | BPF_X: pc += A >= X ? i->jt : i->jf; break;
        case BPF_RET | BPF_K: return k;
        case BPF_RET | BPF_A: return A;
        default: return UINT32_MAX;
        }
    }
    return UINT32_MAX; /* fell off the end: the kernel's checker refuses such programs */
}

/* Precedence of a seccomp action (higher wins), seccomp(2). */
static int
precedence(uint32_t ret)
{
    switch (ret & SECCOMP_RET_ACTION_FULL) {
    case SECCOMP_RET_KILL_PROCESS: return 7;
    case SECCOMP_RET_KILL_THREAD: return 6;
    case SECCOMP_RET_TRAP: return 5;
    case SECCOMP_RET_ERRNO: return 4;
    case SECCOMP_RET_USER_NOTIF: return 3;
    case SECCOMP_RET_TRACE: return 2;
    case SECCOMP_RET_LOG: return 1;
    default: return 0;
    }
}

struct filters {
    struct sbx_bpf p[2];
};

static struct filters F;

static void
build(void)
{
    cr_assert_eq(sbx_seccomp_build(F.p), 0, "sbx_seccomp_build");
    cr_assert_gt(F.p[0].len, 0);
    cr_assert_gt(F.p[1].len, 0);
}

static void
release(void)
{
    free(F.p[0].prog);
    free(F.p[1].prog);
    memset(&F, 0, sizeof(F));
}

/* The verdict of both programs together on (arch, nr, args), seccomp(2). */
static uint32_t
verdict(uint32_t arch, uint32_t nr, const uint64_t args[6])
{
    struct seccomp_data d = {.nr = (int)nr, .arch = arch};
    if (args)
        memcpy(d.args, args, sizeof(d.args));
    uint32_t best = 0;
    int bestp = -1;
    /* The agent loads out[0] then out[1] (container/agent/setup.c); on equal
     * precedence the data of the filter installed last is returned. */
    for (int i = 0; i < 2; i++) {
        uint32_t r = bpf_run(&F.p[i], &d);
        cr_assert_neq(r, UINT32_MAX, "program %d: an instruction the evaluator does not know", i);
        if (precedence(r) >= bestp) {
            best = r;
            bestp = precedence(r);
        }
    }
    return best;
}

#define ERRNO_OF(e) (SECCOMP_RET_ERRNO | (uint32_t)(e))

TestSuite(seccomp, .init = build, .fini = release);

Test(seccomp, foreign_abis_kill_the_process)
{
    /* i386 getpid (20) and mount (21) through int 0x80. */
    cr_expect_eq(verdict(AUDIT_ARCH_I386, 20, NULL), SECCOMP_RET_KILL_PROCESS, "i386 getpid");
    cr_expect_eq(verdict(AUDIT_ARCH_I386, 21, NULL), SECCOMP_RET_KILL_PROCESS, "i386 mount");
    /* x32: native arch with the x32 bit in the number. */
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, X32_BIT | SYS_getpid, NULL), SECCOMP_RET_KILL_PROCESS,
                 "x32 getpid");
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, X32_BIT | SYS_mount, NULL), SECCOMP_RET_KILL_PROCESS,
                 "x32 mount");
    /* An architecture sbx never runs on. */
    cr_expect_eq(verdict(AUDIT_ARCH_AARCH64, SYS_getpid, NULL), SECCOMP_RET_KILL_PROCESS,
                 "aarch64 getpid");
}

Test(seccomp, native_verdicts)
{
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_getpid, NULL), SECCOMP_RET_ALLOW, "getpid");
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_mount, NULL), ERRNO_OF(EPERM), "mount");
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_unshare, NULL), ERRNO_OF(EPERM), "unshare");
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_bpf, NULL), ERRNO_OF(EPERM), "bpf");
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_clone3, NULL), ERRNO_OF(ENOSYS), "clone3");
    /* clone: a plain fork is allowed, any namespace flag is not. */
    uint64_t fork_args[6] = {SIGCHLD};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_clone, fork_args), SECCOMP_RET_ALLOW, "fork");
    uint64_t ns_args[6] = {SIGCHLD | 0x10000000 /* CLONE_NEWUSER */};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_clone, ns_args), ERRNO_OF(EPERM), "clone(NEWUSER)");
    /* TIOCSTI with garbage in the upper 32 bits (CVE-2019-10063). */
    uint64_t sti[6] = {0, 0xdead000000005412ull};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_ioctl, sti), ERRNO_OF(EPERM), "TIOCSTI");
    /* Arguments the kernel reads as 32-bit ints, with garbage above. */
    uint64_t vsock[6] = {(1ull << 32) | 40 /* AF_VSOCK */, 1};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_socket, vsock), ERRNO_OF(EAFNOSUPPORT),
                 "socket(AF_VSOCK | 1 << 32)");
    uint64_t inet[6] = {2 /* AF_INET */, 1};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_socket, inet), SECCOMP_RET_ALLOW, "AF_INET");
    /* personality: Docker's allowed values only. */
    static const uint64_t pers_ok[] = {0, 0x8, 0x20000, 0x20008, 0xffffffff};
    for (size_t i = 0; i < SBX_ARRAY_LEN(pers_ok); i++) {
        uint64_t a[6] = {pers_ok[i]};
        cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_personality, a), SECCOMP_RET_ALLOW,
                     "personality(%#llx)", (unsigned long long)pers_ok[i]);
    }
    static const uint64_t pers_bad[] = {0x0040000,  0x0400000,  0x80040000, 0x80000000,
                                        0xfffffffe, 0x7fffffff, 0x0040008,  0x1,
                                        0x0800000};
    for (size_t i = 0; i < SBX_ARRAY_LEN(pers_bad); i++) {
        uint64_t a[6] = {pers_bad[i]};
        cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_personality, a), ERRNO_OF(EPERM),
                     "personality(%#llx)", (unsigned long long)pers_bad[i]);
    }
    /* A syscall number past every table: ENOSYS from the allow list. */
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, 1000, NULL), ERRNO_OF(ENOSYS), "nr 1000");
}

/*
 * The allow list sbx_seccomp_build exports on x86_64 is a few range checks
 * of its own (container/seccomp.c build_allow_compact); libseccomp's
 * program for the same list is one comparison per known number.  They must
 * give the same verdict for every input the kernel can hand a filter: each
 * number 0..2047, the same with the x32 bit, the edges of the 32-bit range,
 * and 20,000 pseudo-random numbers, under the native architecture, i386,
 * aarch64 and two values no architecture has.  And the compact one must be
 * what is exported here (so this test cannot pass by comparing libseccomp's
 * program with itself).
 */
Test(seccomp, compact_allow_list_equals_libseccomps)
{
    struct sbx_bpf ref = {0};
    cr_assert_eq(sbx_seccomp_build_allow_reference(&ref), 0);
#if defined(__x86_64__)
    cr_assert_lt(F.p[1].len / sizeof(struct sock_filter), 40,
                 "the exported allow list has %zu instructions: not the compact one",
                 F.p[1].len / sizeof(struct sock_filter));
    cr_assert_gt(ref.len / sizeof(struct sock_filter), 200, "libseccomp's allow list: %zu",
                 ref.len / sizeof(struct sock_filter));
#endif
    static const uint32_t arches[] = {AUDIT_ARCH_X86_64, AUDIT_ARCH_I386, AUDIT_ARCH_AARCH64, 0,
                                      0xffffffffu};
    static const uint32_t edges[] = {0x3fffffffu, 0x40000000u, 0x7fffffffu, 0x80000000u,
                                     0xbfffffffu, 0xfffffffeu, 0xffffffffu};
    uint32_t rnd = 0x2545f491u; /* xorshift32 */
    size_t checked = 0, allowed = 0, enosys = 0, killed = 0;
    for (size_t a = 0; a < SBX_ARRAY_LEN(arches); a++) {
        for (uint32_t i = 0; i < 2 * 2048 + SBX_ARRAY_LEN(edges) + 20000; i++) {
            uint32_t nr;
            if (i < 2048)
                nr = i;
            else if (i < 4096)
                nr = X32_BIT | (i - 2048);
            else if (i < 4096 + SBX_ARRAY_LEN(edges))
                nr = edges[i - 4096];
            else {
                rnd ^= rnd << 13, rnd ^= rnd >> 17, rnd ^= rnd << 5;
                nr = rnd;
            }
            struct seccomp_data d = {.nr = (int)nr, .arch = arches[a]};
            uint32_t want = bpf_run(&ref, &d), got = bpf_run(&F.p[1], &d);
            cr_assert_neq(want, UINT32_MAX, "libseccomp's program: unknown instruction");
            cr_assert_eq(got, want, "arch %#x nr %#x: compact %#x, libseccomp %#x", arches[a], nr,
                         got, want);
            checked++;
            allowed += got == SECCOMP_RET_ALLOW;
            enosys += got == (SECCOMP_RET_ERRNO | ENOSYS);
            killed += got == SECCOMP_RET_KILL_PROCESS;
        }
    }
    /* Each verdict occurs, so the comparison covered all three paths. */
    cr_expect_gt(allowed, 300, "allowed %zu of %zu", allowed, checked);
    cr_expect_gt(enosys, 1000, "ENOSYS %zu of %zu", enosys, checked);
    cr_expect_gt(killed, 1000, "killed %zu of %zu", killed, checked);
    free(ref.prog);
}

/*
 * Socket families by allow-list (issue 16 item 9): for socket and socketpair
 * every family but AF_UNIX, AF_INET, AF_INET6, AF_NETLINK is EAFNOSUPPORT,
 * whatever the upper 32 bits hold; netlink only for ROUTE and SOCK_DIAG;
 * TIOCSETD refused.  Before the allow-list only AF_ALG, AF_VSOCK and
 * AF_PACKET were refused: TIPC (30), RDS (21), CAN (29), … passed.
 */
Test(seccomp, socket_families_are_an_allow_list)
{
    const long sys[] = {SYS_socket, SYS_socketpair};
    for (size_t k = 0; k < 2; k++) {
        for (uint64_t fam = 0; fam < 80; fam++) {
            bool ok = fam == 1 || fam == 2 || fam == 10 || fam == 16;
            for (uint64_t hi = 0; hi < 2; hi++) {
                uint64_t a[6] = {fam | (hi ? 0xdead00000000ull : 0), 1, 0};
                cr_expect_eq(verdict(AUDIT_ARCH_X86_64, sys[k], a),
                             ok ? SECCOMP_RET_ALLOW : ERRNO_OF(EAFNOSUPPORT),
                             "%s(family %llu, high bits %llu)", k ? "socketpair" : "socket",
                             (unsigned long long)fam, (unsigned long long)hi);
            }
        }
        for (uint64_t big = 32; big; big <<= 1) {
            uint64_t a[6] = {big > 0xffffffffull ? big | 2 : big, 1, 0};
            uint32_t want = big > 0xffffffffull ? SECCOMP_RET_ALLOW : ERRNO_OF(EAFNOSUPPORT);
            cr_expect_eq(verdict(AUDIT_ARCH_X86_64, sys[k], a), want, "family %#llx",
                         (unsigned long long)a[0]);
        }
        for (uint64_t proto = 0; proto < 40; proto++) {
            uint64_t a[6] = {16 /* AF_NETLINK */, 3, proto};
            bool ok = proto == 0 || proto == 4;
            cr_expect_eq(verdict(AUDIT_ARCH_X86_64, sys[k], a),
                         ok ? SECCOMP_RET_ALLOW : ERRNO_OF(EPROTONOSUPPORT),
                         "netlink protocol %llu", (unsigned long long)proto);
            /* The protocol of another family is that family's business. */
            uint64_t b[6] = {2 /* AF_INET */, 1, proto};
            cr_expect_eq(verdict(AUDIT_ARCH_X86_64, sys[k], b), SECCOMP_RET_ALLOW,
                         "AF_INET protocol %llu", (unsigned long long)proto);
        }
    }
    uint64_t setd[6] = {0, 0x5423 /* TIOCSETD */};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_ioctl, setd), ERRNO_OF(EPERM), "TIOCSETD");
    uint64_t setd_hi[6] = {0, 0xbeef00005423ull};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_ioctl, setd_hi), ERRNO_OF(EPERM),
                 "TIOCSETD, high bits");
    uint64_t getd[6] = {0, 0x5424 /* TIOCGETD */};
    cr_expect_eq(verdict(AUDIT_ARCH_X86_64, SYS_ioctl, getd), SECCOMP_RET_ALLOW, "TIOCGETD");
}

/*
 * The evaluator against the kernel: in a child, load both programs and make
 * each call whose native verdict was asserted above with invalid arguments
 * (no side effect whatever the verdict); the errno must be what the
 * evaluator predicts for an ERRNO verdict, and anything but that errno for
 * ALLOW.  Exit status: 0 when all agree, else the index of the first
 * disagreement.
 */
Test(seccomp, evaluator_agrees_with_the_kernel)
{
    struct probe {
        long nr;
        uint64_t a[6];
    } probes[] = {
        {SYS_mount, {0, 0, 0, 0, 0, 0}},
        {SYS_unshare, {0x80000000ull, 0, 0, 0, 0, 0}},
        {SYS_bpf, {~0ull, 0, 0, 0, 0, 0}},
        {SYS_clone3, {0, 0, 0, 0, 0, 0}},
        {SYS_ioctl, {~0ull, 0xdead000000005412ull, 0, 0, 0, 0}},
        {SYS_ioctl, {~0ull, 0x5413 /* TIOCGWINSZ */, 0, 0, 0, 0}},
        {1000, {0, 0, 0, 0, 0, 0}},
        {SYS_getppid, {0, 0, 0, 0, 0, 0}},
        {SYS_socket, {(1ull << 32) | 40, 1, 0, 0, 0, 0}},
        {SYS_personality, {0x80040000, 0, 0, 0, 0, 0}},
        {SYS_personality, {0xffffffff, 0, 0, 0, 0, 0}},
    };
    uint32_t expect[SBX_ARRAY_LEN(probes)];
    for (size_t i = 0; i < SBX_ARRAY_LEN(probes); i++)
        expect[i] = verdict(AUDIT_ARCH_X86_64, (uint32_t)probes[i].nr, probes[i].a);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
            _exit(100);
        for (int i = 0; i < 2; i++) {
            struct sock_fprog fp = {.len = (unsigned short)(F.p[i].len / sizeof(struct sock_filter)),
                                    .filter = F.p[i].prog};
            if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &fp) != 0)
                _exit(101);
        }
        for (size_t i = 0; i < SBX_ARRAY_LEN(probes); i++) {
            errno = 0;
            long r = syscall(probes[i].nr, probes[i].a[0], probes[i].a[1], probes[i].a[2],
                             probes[i].a[3], probes[i].a[4], probes[i].a[5]);
            int e = r == -1 ? errno : 0;
            uint32_t v = expect[i];
            if ((v & SECCOMP_RET_ACTION_FULL) == SECCOMP_RET_ERRNO) {
                if (e != (int)(v & SECCOMP_RET_DATA))
                    _exit(1 + (int)i);
            } else if (v == SECCOMP_RET_ALLOW) {
                /* The kernel saw it: getppid and the personality query
                 * succeed; the ioctl on a bad fd is EBADF. */
                if (probes[i].nr == SYS_ioctl ? e != EBADF : r < 0)
                    _exit(1 + (int)i);
            } else {
                _exit(99);
            }
        }
        _exit(0);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "the probe child died of signal %d", WTERMSIG(st));
    cr_assert_eq(WEXITSTATUS(st), 0,
                 "probe %d: the kernel's verdict differs from the evaluator's (100/101: the "
                 "filter could not be loaded)",
                 WEXITSTATUS(st) - 1);
}
