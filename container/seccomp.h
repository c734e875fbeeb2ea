/*
 * seccomp.h — the system-call filter every sandbox runs under.
 *
 * Two classic-BPF programs, built once per shard with libseccomp and loaded
 * by the agent on itself just before it starts serving (so every tenant
 * process inherits both; a later filter can only restrict further):
 *
 *  1. the deny list: Docker's default profile as it applies to a container
 *     without capabilities (moby profiles/seccomp/default.json, the 68
 *     syscalls listed in ../shared/reference/isolation.md §2) plus the
 *     hardening of flatpak and bubblewrap: namespace-creating clone flags,
 *     unshare, setns, the whole mount family old and new, pivot_root,
 *     chroot, bpf, perf_event_open, userfaultfd, io_uring, keyrings,
 *     ptrace and process_vm_*, pidfd_getfd, kcmp, kernel modules, kexec,
 *     reboot, swap, clock and host-name changes, open_by_handle_at,
 *     TIOCSTI/TIOCLINUX/TIOCSETD ioctls (32-bit masked compare,
 *     CVE-2019-10063), personality values outside Docker's allowed set,
 *     every socket family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK
 *     for socket and socketpair (EAFNOSUPPORT) and every netlink protocol
 *     but ROUTE and SOCK_DIAG (EPROTONOSUPPORT) — families, protocols and
 *     ioctl numbers compared on 32 bits — and prlimit64 on another process.
 *     Denied calls fail with EPERM unless said otherwise
 *     (clone3 with ENOSYS so glibc falls back to the filterable clone).
 *  2. the allow list: every system call libseccomp knows for the native
 *     architecture; anything newer than this libseccomp (a syscall the
 *     deny list could not have considered) fails with ENOSYS, as runc's
 *     patchbpf does.  On x86_64 it is exported as a dozen instructions
 *     checking the runs of known numbers (seccomp.c build_allow_compact),
 *     with the verdicts of libseccomp's one-rule-per-number program
 *     (sbx_seccomp_build_allow_reference, compared input by input in
 *     tests/unit/test_seccomp.c); the kernel converts and JITs a filter at
 *     every sandbox's start, so its length is start time.
 *
 * Both kill the whole process on a foreign architecture or ABI (i386
 * `int 0x80`, x32): SCMP_FLTATR_ACT_BADARCH = SCMP_ACT_KILL_PROCESS.
 * When several filters match, the kernel applies the most restrictive
 * action (seccomp(2) "Filter return values"), so 1 ∧ 2 is what runs.
 */
#ifndef SBX_SECCOMP_H
#define SBX_SECCOMP_H

#include <stddef.h>

struct sbx_bpf {
    void *prog;   /* struct sock_filter[] */
    size_t len;   /* bytes */
};

/*
 * sbx_seccomp_build — build both programs.  On success the caller owns
 * out[0].prog (deny list) and out[1].prog (allow list) and frees them with
 * free().  Returns 0 or a negative code.
 */
int sbx_seccomp_build(struct sbx_bpf out[2]);

/*
 * sbx_seccomp_build_allow_reference — the allow list (program 2) as
 * libseccomp builds it: one rule per known number.  On x86_64
 * sbx_seccomp_build exports a shorter program of its own with the same
 * verdicts (seccomp.c build_allow_compact); this one is what it is checked
 * against (tests/unit/test_seccomp.c), and what other architectures load.
 * On success the caller owns out->prog (free()).  0 or a negative code.
 */
int sbx_seccomp_build_allow_reference(struct sbx_bpf *out);

/* The names of the denied system calls (NULL-terminated), for tests and docs. */
extern const char *const sbx_seccomp_denied[];

#endif
