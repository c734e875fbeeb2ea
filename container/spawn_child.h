/*
 * spawn_child.h — the child of a container's clone, between the clone and
 * the agent's exec (container/spawn_child.c); internal to container/spawn.c,
 * which owns everything these point at.
 */
#ifndef SBX_SPAWN_CHILD_H
#define SBX_SPAWN_CHILD_H

#include <linux/sched.h>
#include <signal.h>
#include <stdbool.h>

/* 1 where containers are cloned with CLONE_VM (spawn_child_clone_vm; x86-64),
 * else 0 (a fork-like clone, spawn_child_main in the child). */
#if defined(__x86_64__)
#define SPAWN_VM 1
#else
#define SPAWN_VM 0
#endif

/* The child's stack for spawn_child_clone_vm, guard page included:
 * spawn_child_main needs well under 4 KiB. */
#define SPAWN_STACK (64 * 1024)

/* The fd number the agent inherits the interpreter drivers' detached tree
 * at (after 3, the channel), when its argv says "--interp-tree"
 * (container/agent/agent.h AGENT_INTERP_TREE_FD). */
#define SPAWN_INTERP_FD 4

/*
 * The descriptors a running container keeps in the shard (its channel and
 * pidfd, its cgroup v2 directory, workspace and image lock: 2–5 per
 * sandbox) are moved to SPAWN_FD_HIGH and above (spawn.c fd_high), the
 * ones of the shard's own and of starts under way stay below.  A child
 * cloned with CLONE_FILES then copies only the low part (`shared_files`):
 * before, every container's child got a copy of all of them and closed
 * them again at its exec, a cost that grew with the sandboxes present
 * (dup_fd, and filp_close from do_close_on_exec, in the density profile;
 * docs/benchmarks.md).  Where RLIMIT_NOFILE is too low for the high part a
 * descriptor stays where it was: only slower, as before.
 */
#define SPAWN_FD_HIGH 4096

/* What the child reads, read-only (with CLONE_VM it shares our memory):
 * on the starting thread's stack, which lives until the child has exec'd
 * or been reaped.  Descriptors are the shard's; none is owned here. */
struct spawn_child {
    int agent_fd;       /* the agent binary's sealed memfd */
    int devnull;        /* /dev/null: the agent's stdin and stdout */
    int chan;           /* the child's end of the channel: the agent's fd 3 */
    int parent_end;     /* the shard's end, which the child closes */
    int tree;           /* the interpreter drivers' tree, or -1 */
    const int *tasks;   /* cgroup v1: the `tasks` files to join, ntasks of them */
    int ntasks;
    int wait_ms;        /* how long to wait for the shard's "G" */
    const char *const *argv; /* the agent's, NULL-terminated */
    const char *const *envp;
    bool shared_files;  /* cloned with CLONE_FILES: unshare the low part, say "U" */
    sigset_t restore;   /* CLONE_VM: the starting thread's signal mask */
};

/*
 * clone3(2) with ca's flags plus CLONE_VM, on the stack ca->stack /
 * ca->stack_size (the caller's, SPAWN_STACK bytes, unmapped only once the
 * child has exec'd or been reaped), every signal of the calling thread
 * blocked around it; the child runs spawn_child_main(a) with a->restore,
 * which this fills.  Returns the child's pid, or -errno (never sets
 * errno).  Only where SPAWN_VM is 1; elsewhere -ENOSYS.
 */
long spawn_child_clone_vm(struct clone_args *ca, struct spawn_child *a);

/* The child, after a fork-like clone (vm false) or from
 * spawn_child_clone_vm (vm true): joins its cgroups, waits for "G", execs
 * the agent; never returns.  spawn_child.c says what it must guarantee. */
void spawn_child_main(const struct spawn_child *a, bool vm) __attribute__((noreturn));

#endif
