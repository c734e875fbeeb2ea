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
#include "spawn_child.h"

#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif

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
    struct limbo *limbo;   /* stopped containers not reaped yet (sbx_container_stop); under mu */
};

/* A container whose PID 1 was not reaped within STOP_REAP_MS of its
 * SIGKILL: what it holds (uids, cgroup, descriptors) stays reserved until
 * it is (limbo_reap).  Owned by the spawner's list. */
struct limbo {
    struct sbx_container c;
    int64_t since_ms;
    struct limbo *next;
};

/* How long, in ms, sbx_container_stop waits for PID 1 to be reaped after
 * its SIGKILL.  The kernel reaps it once every process of its pid
 * namespace has died; one in uninterruptible sleep (a hung disk, a frozen
 * file system) holds it, and the thread that stops it — one of a shard's
 * few workers — would wait with it. */
#define STOP_REAP_MS 10000

static void limbo_reap(sbx_spawner *sp);

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
    limbo_reap(sp);
    while (sp->limbo) { /* not reaped: its processes outlive us, logged at its stop */
        struct limbo *l = sp->limbo;
        sp->limbo = l->next;
        int fds[] = {l->c.pidfd, l->c.image ? l->c.use_fd : -1, l->c.ws ? l->c.ws_fd : -1,
                     l->c.cg.v2_fd};
        for (size_t i = 0; i < SBX_ARRAY_LEN(fds); i++)
            if (fds[i] >= 0)
                close(fds[i]);
        free(l);
    }
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

/* fd, or a duplicate of it at SPAWN_FD_HIGH or above (close-on-exec) that
 * replaces it (fd closed).  Owns fd; returns the descriptor to keep. */
static int
fd_high(int fd)
{
    if (fd < 0 || fd >= SPAWN_FD_HIGH)
        return fd;
    int h = fcntl(fd, F_DUPFD_CLOEXEC, SPAWN_FD_HIGH);
    if (h < 0)
        return fd;
    close(fd);
    return h;
}

/* Close what only the child needed (the drivers' tree, the cgroup's tasks
 * files, its end of the channel) and mark them closed. */
static void
close_child_fds(int *tree, int *tasks, int *ntasks, int *chan)
{
    if (*tree >= 0)
        close(*tree);
    *tree = -1;
    while (*ntasks > 0)
        close(tasks[--*ntasks]);
    close(*chan);
    *chan = -1;
}

/* Wait for the child's "U" (it has its own descriptor table now), at most
 * timeout_ms; -EPIPE if it died first.  The shard holds the child's end of
 * the channel until then, so its death shows on the pidfd, not as EOF. */
static int
wait_unshared(int chan, int pidfd, int timeout_ms)
{
    struct pollfd pfd[2] = {{.fd = chan, .events = POLLIN}, {.fd = pidfd, .events = POLLIN}};
    int64_t until = sbx_mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = until - sbx_mono_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        int r = poll(pfd, 2, (int)left);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            return -errno;
        if (pfd[0].revents) {
            char u = 0;
            ssize_t n;
            while ((n = read(chan, &u, 1)) < 0 && errno == EINTR)
                ;
            return n == 1 && u == 'U' ? 0 : -EPIPE;
        }
        if (pfd[1].revents)
            return -EPIPE;
    }
}

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
    c->ws_fd = fd_high(ws_fd);
    if (img) {
        c->image = true;
        c->use_fd = img->use_fd >= 0 ? fd_high(fcntl(img->use_fd, F_DUPFD_CLOEXEC, 3)) : -1;
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
        c->use_fd = img->use_fd >= 0 ? fd_high(fcntl(img->use_fd, F_DUPFD_CLOEXEC, 3)) : -1;
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
    bool shared_files = false; /* the child starts in our descriptor table (CLONE_FILES) */

    memset(c, 0, sizeof(*c));
    c->pidfd = c->chan = -1;
    c->cg.v2_fd = -1;
    int64_t t0 = sbx_mono_us();
    /* What an unreaped container held goes back first, if it has ended
     * (a shard that stops nothing more would otherwise keep it). */
    limbo_reap(sp);
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
    struct spawn_child child = {.agent_fd = sp->agent_fd, .devnull = sp->devnull,
                                .chan = sv[1], .parent_end = sv[0], .tree = tree,
                                .tasks = tasks, .ntasks = ntasks,
                                .wait_ms = sp->conf.setup_timeout_ms,
                                .argv = (const char *const *)argv, .envp = envp};
    if (SPAWN_VM && !sp->no_clone3) {
        /* Shares the shard's memory until its exec (spawn_child.c says
         * why), on a stack of its own above a guard page. */
        stack = mmap(NULL, SPAWN_STACK, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
        if (stack == MAP_FAILED || mprotect(stack, 4096, PROT_NONE) != 0) {
            rc = -errno;
            snprintf(why, whylen, "the child's stack: %s", strerror(errno));
            goto fail;
        }
        ca.stack = (uint64_t)(uintptr_t)stack;
        ca.stack_size = SPAWN_STACK;
        /* Its descriptor table too, when all it needs lies in the low part
         * (SPAWN_FD_HIGH): it copies only that part. */
        bool low = sp->agent_fd < SPAWN_FD_HIGH && sp->devnull < SPAWN_FD_HIGH &&
                   sv[0] < SPAWN_FD_HIGH && sv[1] < SPAWN_FD_HIGH && tree < SPAWN_FD_HIGH;
        for (int i = 0; i < ntasks; i++)
            low = low && tasks[i] < SPAWN_FD_HIGH;
        if (low)
            ca.flags |= CLONE_FILES;
        shared_files = child.shared_files = low;
        long r = spawn_child_clone_vm(&ca, &child);
        if (r < 0)
            errno = (int)-r;
        pid = r < 0 ? -1 : (pid_t)r;
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
        spawn_child_main(&child, false);
    /* What only the child needs: closed here, or once it has a table of its
     * own (shared_files, below). */
    if (!shared_files)
        close_child_fds(&tree, tasks, &ntasks, &sv[1]);
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
    if (shared_files) {
        if ((rc = wait_unshared(sv[0], pidfd, sp->conf.setup_timeout_ms)) != 0) {
            snprintf(why, whylen, "the child did not take its descriptors: %s",
                     rc == -EPIPE ? "it exited" : strerror(-rc));
            goto fail;
        }
        close_child_fds(&tree, tasks, &ntasks, &sv[1]);
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
    c->chan = fd_high(sv[0]);
    c->pidfd = fd_high(c->pidfd);
    c->cg.v2_fd = fd_high(c->cg.v2_fd);
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

static void release(sbx_spawner *sp, struct sbx_container *c);

/* Release the containers of the limbo whose PID 1 has been reaped since. */
static void
limbo_reap(sbx_spawner *sp)
{
    struct limbo *done = NULL;
    pthread_mutex_lock(&sp->mu);
    for (struct limbo **pp = &sp->limbo; *pp;) {
        struct limbo *l = *pp;
        siginfo_t si = {0};
        if (waitid((idtype_t)P_PIDFD, (id_t)l->c.pidfd, &si, WEXITED | WNOHANG) == 0 &&
            si.si_pid == 0) {
            pp = &l->next; /* still there */
            continue;
        }
        *pp = l->next;
        l->next = done;
        done = l;
    }
    pthread_mutex_unlock(&sp->mu);
    while (done) {
        struct limbo *l = done;
        done = l->next;
        sbx_log_info("container %llu: PID 1 reaped %lld ms after its stop; its uids and cgroup "
                     "are released",
                     (unsigned long long)l->c.serial, (long long)(sbx_mono_ms() - l->since_ms));
        close(l->c.pidfd);
        l->c.pidfd = -1;
        release(sp, &l->c);
        free(l);
    }
}

void
sbx_container_stop(sbx_spawner *sp, struct sbx_container *c)
{
    limbo_reap(sp);
    if (c->chan >= 0) {
        close(c->chan);
        c->chan = -1;
    }
    if (c->pidfd >= 0) {
        /* PID 1 dies; the kernel kills the rest of its pid namespace and
         * waits for them before PID 1 can be reaped (its pidfd readable). */
        syscall(SYS_pidfd_send_signal, c->pidfd, SIGKILL, NULL, 0);
        int64_t until = sbx_mono_ms() + STOP_REAP_MS;
        struct pollfd p = {c->pidfd, POLLIN, 0};
        int pr;
        while ((pr = poll(&p, 1, (int)SBX_MAX(until - sbx_mono_ms(), (int64_t)0))) < 0 &&
               errno == EINTR)
            ;
        if (pr <= 0) {
            /* Not reaped in time: the caller goes on, what the container
             * holds stays reserved until its PID 1 is reaped (at a later
             * stop).  A new container never reuses its uids or cgroup. */
            sbx_log_warn("container %llu (pid %d): not ended %d ms after SIGKILL (a process "
                         "of it in uninterruptible sleep?); its uids and cgroup %s stay "
                         "reserved until it ends",
                         (unsigned long long)c->serial, (int)c->pid, STOP_REAP_MS, c->cg.name);
            struct limbo *l = sbx_xcalloc(1, sizeof(*l));
            l->c = *c;
            l->since_ms = sbx_mono_ms();
            pthread_mutex_lock(&sp->mu);
            l->next = sp->limbo;
            sp->limbo = l;
            pthread_mutex_unlock(&sp->mu);
            /* The caller's copy holds nothing any more. */
            c->pidfd = -1;
            c->cg.created = false;
            c->cg.v2_fd = -1;
            c->uid = c->uid2 = 0;
            c->ngid = 0;
            c->image = c->ws = false;
            c->use_fd = c->ws_fd = -1;
            c->pid = 0;
            return;
        }
        siginfo_t si;
        while (waitid((idtype_t)P_PIDFD, (id_t)c->pidfd, &si, WEXITED) < 0 && errno == EINTR)
            ;
        close(c->pidfd);
        c->pidfd = -1;
    }
    release(sp, c);
}

/* What a container whose PID 1 has been reaped holds: its cgroup, uids,
 * image use lock and workspace mount. */
static void
release(sbx_spawner *sp, struct sbx_container *c)
{
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
sbx_container_limit_hits(sbx_spawner *sp, struct sbx_container *c, struct sbx_cgroup_stats *st)
{
    return sbx_cgroup_limit_hits(sp->conf.cgroups, &c->cg, st);
}

int
sbx_container_set_limits(sbx_spawner *sp, struct sbx_container *c, const struct sbx_limits *lim)
{
    return sbx_cgroup_set_limits(sp->conf.cgroups, &c->cg, lim);
}
