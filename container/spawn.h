/*
 * spawn.h — start and stop sandbox containers (the host side).
 *
 * sbx_container_start() runs on one of the shard's worker threads and
 * blocks for the container's whole set-up (about 2 ms here):
 *
 *   1. socketpair(2) for the channel; a cgroup with the sandbox's limits;
 *   2. clone3(2) with CLONE_NEWUSER|NEWNS|NEWPID|NEWNET|NEWUTS|NEWIPC and
 *      CLONE_PIDFD (on cgroup v2 also CLONE_INTO_CGROUP|CLONE_NEWCGROUP, so
 *      the child is born inside its cgroup); where clone3 is ENOSYS (kernels
 *      before 5.3, Docker's default seccomp profile, valgrind) clone(2) with
 *      the same namespaces, the child then being attached to its cgroup in
 *      step 4 and making its cgroup namespace in the agent, as on v1;
 *   3. the child (container/spawn_child.c) — on x86-64 cloned with CLONE_VM
 *      and CLONE_FILES on a small stack of its own, sharing this
 *      multi-threaded process's memory until its exec (elsewhere a
 *      fork-like copy), so it makes raw system calls only, no malloc, no
 *      glibc set*id broadcast, not even errno — takes a copy of the low part
 *      of the descriptor table (the sandboxes' own descriptors live above
 *      SPAWN_FD_HIGH and are not copied) and says "U", on cgroup v1 joins
 *      its cgroups itself (writes "0" to the `tasks` files the parent
 *      opened for it: sbx_cgroup_open_tasks says why), then waits on the
 *      channel for "go";
 *   4. the parent writes /proc/PID/{uid,gid}_map ("0 <host id> 1": one
 *      unprivileged host id per sandbox, nothing else mapped), on cgroup v2
 *      after clone(2) attaches the pid to its cgroup, waits for "U" and
 *      says "go";
 *   5. the child sets PR_SET_PDEATHSIG, becomes uid/gid 0 of its namespace
 *      (setresuid/setresgid, setgroups(0)) and execs sbx-agent from a
 *      sealed memfd copy (F_SEAL_WRITE|SHRINK|GROW|SEAL): /proc/1/exe inside
 *      is that memfd, never a host file (runc CVE-2019-5736);
 *   6. the parent sends the agent's configuration and waits for "ready",
 *      then sets the agent's oom_score_adj 0 (floor 0) and the legacy
 *      oom_adj -16 (-941, floor unmoved) so the OOM killer prefers tenant
 *      processes to the agent while no tenant process can go below 0
 *      (spawn.c says why, and why only after the exec).
 *
 * Everything the agent then does to build the sandbox is in
 * container/agent/setup.c.  sbx_container_stop() kills PID 1 through its
 * pidfd (the kernel then kills the rest of the pid namespace), reaps it and
 * removes the cgroup; nothing of the container stays on the host: its
 * mounts lived in its own mount namespace.  (One that cannot be reaped in
 * 10 s is released later: sbx_container_stop.)
 */
#ifndef SBX_SPAWN_H
#define SBX_SPAWN_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "cgroup.h"

typedef struct sbx_spawner sbx_spawner;

struct sbx_spawn_conf {
    const char *agent_path;     /* the sbx-agent binary (copied into a memfd at start) */
    sbx_cgroups *cgroups;       /* borrowed; must outlive the spawner */
    uint32_t uid_base;          /* host uids uid_base … uid_base+uid_count-1 are used */
    uint32_t uid_count;         /* at most this many live containers */
    uint64_t rw_size;           /* bytes for /workspace + /tmp + /home */
    uint64_t rw_inodes;
    uint64_t shm_size;          /* bytes */
    uint64_t output_cap;        /* bytes kept per output stream of an exec */
    uint32_t nofile, nproc;
    const char *const *etc;     /* /etc entries bound read-only (NULL-terminated) */
    const char *const *env;     /* base environment "K=V" (NULL-terminated) */
    const char *interp_dir;     /* interpreter drivers (bound at /opt/sbx), or NULL */
    int setup_timeout_ms;
};

/* sbx_spawner_new — prepare: memfd of the agent, seccomp programs, the
 * agent's configuration frame.  0 or a negative code (reason in why). */
int sbx_spawner_new(sbx_spawner **out, const struct sbx_spawn_conf *conf, char *why,
                    size_t whylen);
void sbx_spawner_free(sbx_spawner *sp);

struct sbx_container {
    uint64_t serial;    /* unique in this process */
    pid_t pid;          /* host pid of the agent */
    int pidfd;
    int chan;           /* our end of the channel (blocking, CLOEXEC) */
    sbx_cgroup cg;
    uint32_t uid;       /* host uid mapped to 0 inside */
    uint32_t uid2;      /* an image with a non-root User: the host id mapped to its uid
                         * and gid inside (one more slot of the range); 0: none */
    uint32_t gid_in[8]; /* … and its supplementary groups (struct sbx_image_root groups,
                         * but 0 and its gid): gid gid_in[i] inside is host id */
    uint32_t gid_host[8]; /* gid_host[i] (one more slot of the range each) */
    int ngid;
    int64_t start_us;   /* time the set-up took */
    bool image;         /* started from an image (sbx_container_start_image): */
    int use_fd;         /* … then its image's use lock (image_store.h), closed by stop */
    bool ws;            /* with a persistent workspace (sbx_container_start_ws): */
    int ws_fd;          /* … its mount (for fstatfs), closed by stop */
};

/*
 * sbx_container_start — create a container with the given limits and wait
 * until its agent is ready (at most setup_timeout_ms).  Thread-safe; must be
 * called from a thread that lives as long as the container (PR_SET_PDEATHSIG
 * follows the creating thread).  On success *c is filled and owned by the
 * caller, who must call sbx_container_stop.  0 or a negative code.
 */
int sbx_container_start(sbx_spawner *sp, const struct sbx_limits *lim, struct sbx_container *c,
                        char *why, size_t whylen);

struct sbx_image_root;
/*
 * sbx_container_start_image — sbx_container_start for a sandbox of an image
 * (docs/images.md): after writing the uid/gid maps, the shard makes for
 * each layer directory of img a detached, read-only, idmapped copy of its
 * mount (open_tree(2) OPEN_TREE_CLONE, then mount_setattr(2)
 * MOUNT_ATTR_IDMAP with the child's user namespace: a file of host uid 0
 * shows as the sandbox's root, Linux 5.12), and hands them to the agent
 * after its configuration: an "image" frame {layers, env, workdir, user}
 * and one byte carrying the descriptors (SCM_RIGHTS), bottom layer first.
 * The agent stacks them as an overlayfs (container/agent/setup.c).  An
 * image whose User is not root (img->run_uid/run_gid) gets one more host id
 * of the shard's range, mapped to that uid and gid inside ("0 <uid> 1" plus
 * "<run_uid> <uid2> 1"), and the agent runs everything as it (docs/images.md,
 * "User").  On
 * success c->image is set and c->use_fd holds a duplicate of img->use_fd
 * (the image's use lock) until sbx_container_stop.  img is borrowed.
 */
int sbx_container_start_image(sbx_spawner *sp, const struct sbx_limits *lim,
                              const struct sbx_image_root *img, struct sbx_container *c,
                              char *why, size_t whylen);

/*
 * sbx_container_start_ws — sbx_container_start (img NULL) or
 * sbx_container_start_image with a persistent workspace (container/
 * workspace.h): ws_fd is a detached mount of the workspace's file system
 * (sbx_ws_mount), consumed: on success kept in c->ws_fd (c->ws set) until
 * sbx_container_stop, closed on failure.  After the uid/gid maps the shard
 * idmaps it to the child's user namespace (MOUNT_ATTR_IDMAP: the file
 * system's uid 0 is the sandbox's root, whatever host uid the container
 * gets) and sends it after the configuration (and the image's layers) as
 * one byte 'W' carrying the descriptor; argv has "--workspace".  The agent
 * puts /workspace, /tmp and /home — for an image, the overlay's upper and
 * work dirs — on it instead of a tmpfs (container/agent/setup.c).
 */
int sbx_container_start_ws(sbx_spawner *sp, const struct sbx_limits *lim,
                           const struct sbx_image_root *img, int ws_fd, struct sbx_container *c,
                           char *why, size_t whylen);

/*
 * sbx_container_stop — SIGKILL the container, reap it, remove its cgroup,
 * close its fds and release its uid.  Blocks until done (milliseconds), at
 * most 10 s for the reaping: a container with a process in uninterruptible
 * sleep (a hung disk) cannot be reaped until it wakes, and is then kept by
 * the spawner — its uids, cgroup, image lock and workspace mount reserved,
 * logged — and released by a later stop once it has ended; *c is left
 * holding nothing either way.  Thread-safe.  Idempotent on a
 * zeroed/stopped container.
 */
void sbx_container_stop(sbx_spawner *sp, struct sbx_container *c);

/*
 * sbx_container_kill — SIGKILL the container's PID 1 (so the kernel kills
 * the rest of its pid namespace) without waiting: a shard that stops many
 * lets them all die at once, then reaps each with sbx_container_stop.
 * Does not block; harmless on a stopped or already dead container.
 */
void sbx_container_kill(const struct sbx_container *c);

/* sbx_container_stats — the cgroup counters of a live container. */
int sbx_container_stats(sbx_spawner *sp, struct sbx_container *c, struct sbx_cgroup_stats *st);
/* sbx_container_limit_hits — its OOM kills and refused forks only
 * (sbx_cgroup_limit_hits: the cheap read, per exec). */
int sbx_container_limit_hits(sbx_spawner *sp, struct sbx_container *c,
                             struct sbx_cgroup_stats *st);

/* sbx_container_set_limits — change the limits of a live container. */
int sbx_container_set_limits(sbx_spawner *sp, struct sbx_container *c,
                             const struct sbx_limits *lim);

#endif
