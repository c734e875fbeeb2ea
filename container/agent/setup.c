/*
 * setup.c — build the sandbox from inside, step by step, each step checked.
 *
 * The order follows ../shared/reference/isolation.md §6 (itself distilled
 * from crun's container_init_setup, bubblewrap's setup_newroot and nsjail's
 * containProc): identity → mount namespace private → new root on tmpfs →
 * binds (read-only, nosuid, nodev) → /dev → /proc and its masks →
 * pivot_root → loopback → limits → capabilities dropped → no_new_privs →
 * non-dumpable → seccomp, last.
 *
 * We are PID 1 of a new pid namespace and uid 0 of a new user namespace that
 * maps exactly one host uid, so everything here is done with the
 * capabilities of that user namespace only: nothing we do can reach the
 * host's mounts (propagation is made private first) or its devices.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "agent.h"

#ifndef SECBIT_NOROOT
#define SECBIT_NOROOT (1 << 0)
#define SECBIT_NOROOT_LOCKED (1 << 1)
#define SECBIT_NO_SETUID_FIXUP (1 << 2)
#define SECBIT_NO_SETUID_FIXUP_LOCKED (1 << 3)
#define SECBIT_KEEP_CAPS_LOCKED (1 << 5)
#define SECBIT_NO_CAP_AMBIENT_RAISE (1 << 6)
#define SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED (1 << 7)
#endif

/* Where the new root is assembled.  Any existing directory works: the mount
 * namespace is private by then, so the tmpfs only hides it from us. */
#define NEWROOT "/tmp"

/* The attributes of the sandbox's read-only mounts (agent_mount_attr): the
 * host's files bound in, and, noexec too, the /proc masks and read-only
 * /proc directories. */
#define ATTR_RO (MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)
#define ATTR_RO_NOEXEC (ATTR_RO | MOUNT_ATTR_NOEXEC)

#define STEP(cond, ...)                                                                  \
    do {                                                                                 \
        if (!(cond)) {                                                                   \
            rc = sbx_err_make(err, -errno, __VA_ARGS__);                                 \
            goto out;                                                                    \
        }                                                                                \
    } while (0)

/* ------------------------------------------------------------------------------ */
/* Configuration. */

static char **
strv_from(const msgpack_object *arr)
{
    if (!arr || arr->type != MSGPACK_OBJECT_ARRAY)
        return sbx_xcalloc(1, sizeof(char *));
    char **v = sbx_xcalloc(arr->via.array.size + 1, sizeof(char *));
    size_t k = 0;
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) == 0 && !memchr(s.p, '\0', s.n))
            v[k++] = sbx_str_dup(s);
    }
    return v;
}

int
agent_cfg_parse(struct agent_cfg *cfg, const msgpack_object *root)
{
    sbx_str s;
    int64_t i;
    const msgpack_object *o;

    memset(cfg, 0, sizeof(*cfg));
    cfg->run_fd = cfg->shm_fd = -1;
    snprintf(cfg->hostname, sizeof(cfg->hostname), "sandbox");
    if (sbx_wire_get_str(root, "hostname", &s) == 0 && s.n > 0 && s.n < sizeof(cfg->hostname))
        sbx_str_copy(s, cfg->hostname, sizeof(cfg->hostname));
    sbx_wire_get_bool(root, "unshare_cgroupns", &cfg->unshare_cgroupns);
    cfg->rw_size = 1ull << 30;
    if (sbx_wire_get_i64(root, "rw_size", &i) == 0 && i > 0)
        cfg->rw_size = (uint64_t)i;
    cfg->rw_inodes = 262144;
    if (sbx_wire_get_i64(root, "rw_inodes", &i) == 0 && i > 0)
        cfg->rw_inodes = (uint64_t)i;
    cfg->shm_size = 64ull << 20;
    if (sbx_wire_get_i64(root, "shm_size", &i) == 0 && i > 0)
        cfg->shm_size = (uint64_t)i;
    cfg->nofile = 4096;
    if (sbx_wire_get_i64(root, "nofile", &i) == 0 && i > 0)
        cfg->nofile = (uint32_t)i;
    cfg->nproc = 4096;
    if (sbx_wire_get_i64(root, "nproc", &i) == 0 && i > 0)
        cfg->nproc = (uint32_t)i;
    cfg->output_cap = 32ull << 20;
    if (sbx_wire_get_i64(root, "output_cap", &i) == 0 && i > 0)
        cfg->output_cap = (uint64_t)i;
    if (sbx_wire_get_str(root, "interp_dir", &s) == 0 && s.n && s.n < sizeof(cfg->interp_dir))
        sbx_str_copy(s, cfg->interp_dir, sizeof(cfg->interp_dir));

    o = sbx_wire_get(root, "etc");
    cfg->etc = strv_from(o);
    o = sbx_wire_get(root, "env");
    cfg->env = strv_from(o);
    /* The filters are mandatory: a sandbox without them is never started. */
    if (sbx_wire_get_array(root, "seccomp", &o) != 0 || o->via.array.size == 0 ||
        o->via.array.size > SBX_ARRAY_LEN(cfg->bpf))
        return SBX_E_MALFORMED;
    for (uint32_t k = 0; k < o->via.array.size; k++) {
        if (sbx_wire_obj_str(&o->via.array.ptr[k], &s) != 0 || s.n == 0 ||
            s.n % sizeof(struct sock_filter) || s.n / sizeof(struct sock_filter) > 65535)
            return SBX_E_MALFORMED;
        cfg->bpf[k].p = sbx_xmalloc(s.n);
        memcpy(cfg->bpf[k].p, s.p, s.n);
        cfg->bpf[k].n = s.n;
        cfg->nbpf++;
    }
    return 0;
}

static void
strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

void
agent_cfg_free(struct agent_cfg *cfg)
{
    strv_free(cfg->etc);
    strv_free(cfg->env);
    strv_free(cfg->image_env);
    for (int k = 0; k < cfg->nlayers; k++)
        if (cfg->layer_fds[k] >= 0)
            close(cfg->layer_fds[k]);
    for (int k = 0; k < cfg->nbpf; k++)
        free(cfg->bpf[k].p);
    if (cfg->ws && cfg->ws_fd >= 0)
        close(cfg->ws_fd);
    memset(cfg, 0, sizeof(*cfg));
}

int
agent_image_recv(struct agent_cfg *cfg, int chan)
{
    char *buf = NULL;
    size_t len = 0;
    sbx_msg m;
    int64_t n = 0;
    int rc = sbx_frame_recv_blocking(chan, 1u << 20, &buf, &len);
    if (rc)
        return rc;
    rc = sbx_wire_decode(&m, buf, len, &sbx_wire_limits_request);
    if (rc) {
        free(buf);
        return SBX_E_MALFORMED;
    }
    sbx_str s;
    if (sbx_wire_get_i64(m.root, "layers", &n) != 0 || n < 1 || n > AGENT_MAX_LAYERS)
        rc = SBX_E_MALFORMED;
    cfg->image_env = strv_from(sbx_wire_get(m.root, "env"));
    if (sbx_wire_get_str(m.root, "workdir", &s) == 0 && s.n && s.n < sizeof(cfg->image_workdir) &&
        s.p[0] == '/' && !memchr(s.p, '\0', s.n))
        sbx_str_copy(s, cfg->image_workdir, sizeof(cfg->image_workdir));
    int64_t id;
    if (sbx_wire_get_i64(m.root, "uid", &id) == 0 && id > 0 && id < 0xffffffffLL)
        cfg->run_uid = (uint32_t)id;
    if (sbx_wire_get_i64(m.root, "gid", &id) == 0 && id > 0 && id < 0xffffffffLL)
        cfg->run_gid = (uint32_t)id;
    const msgpack_object *gl = NULL;
    if (sbx_wire_get_array(m.root, "groups", &gl) == 0 && gl)
        for (uint32_t i = 0; i < gl->via.array.size && cfg->run_ngroups < 8; i++) {
            const msgpack_object *g = &gl->via.array.ptr[i];
            if (g->type == MSGPACK_OBJECT_POSITIVE_INTEGER && g->via.u64 < 0xffffffffULL)
                cfg->run_groups[cfg->run_ngroups++] = (uint32_t)g->via.u64;
        }
    sbx_wire_msg_free(&m);
    free(buf); /* the decoded message pointed into it */
    if (rc)
        return rc;
    /* The descriptors ride on one byte (container/spawn.c image_send). */
    char byte = 0;
    struct iovec io = {.iov_base = &byte, .iov_len = 1};
    union {
        char b[CMSG_SPACE(sizeof(int) * AGENT_MAX_LAYERS)];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b,
                        .msg_controllen = sizeof(u.b)};
    ssize_t r;
    while ((r = recvmsg(chan, &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    struct cmsghdr *cm = r == 1 ? CMSG_FIRSTHDR(&mh) : NULL;
    if (!cm || cm->cmsg_type != SCM_RIGHTS ||
        cm->cmsg_len != CMSG_LEN(sizeof(int) * (size_t)n) || byte != 'L')
        return r < 0 ? -errno : SBX_E_MALFORMED;
    memcpy(cfg->layer_fds, CMSG_DATA(cm), sizeof(int) * (size_t)n);
    cfg->nlayers = (int)n;
    /* The image's Env over the base environment, name by name. */
    for (char **p = cfg->image_env; p && *p; p++) {
        const char *eq = strchr(*p, '=');
        if (!eq || eq == *p)
            continue;
        size_t k = (size_t)(eq - *p), cnt = 0;
        for (char **q = cfg->env; q && *q; q++)
            cnt++;
        bool replaced = false;
        for (size_t i = 0; i < cnt; i++) {
            if (!strncmp(cfg->env[i], *p, k + 1)) {
                free(cfg->env[i]);
                cfg->env[i] = sbx_xstrdup(*p);
                replaced = true;
            }
        }
        if (!replaced) {
            cfg->env = sbx_xrealloc(cfg->env, (cnt + 2) * sizeof(char *));
            cfg->env[cnt] = sbx_xstrdup(*p);
            cfg->env[cnt + 1] = NULL;
        }
    }
    return 0;
}

int
agent_ws_recv(struct agent_cfg *cfg, int chan)
{
    char byte = 0;
    struct iovec io = {.iov_base = &byte, .iov_len = 1};
    union {
        char b[CMSG_SPACE(sizeof(int))];
        struct cmsghdr align;
    } u;
    struct msghdr mh = {.msg_iov = &io, .msg_iovlen = 1, .msg_control = u.b,
                        .msg_controllen = sizeof(u.b)};
    ssize_t r;
    while ((r = recvmsg(chan, &mh, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
        ;
    struct cmsghdr *cm = r == 1 ? CMSG_FIRSTHDR(&mh) : NULL;
    if (!cm || cm->cmsg_type != SCM_RIGHTS || cm->cmsg_len != CMSG_LEN(sizeof(int)) ||
        byte != 'W')
        return r < 0 ? -errno : SBX_E_MALFORMED;
    memcpy(&cfg->ws_fd, CMSG_DATA(cm), sizeof(int));
    cfg->ws = true;
    return 0;
}

const char *
agent_default_cwd(const struct agent *a)
{
    return a->cfg.image_workdir[0] ? a->cfg.image_workdir : "/workspace";
}

/* ------------------------------------------------------------------------------ */
/* Mount helpers. */

/* mkdir that accepts an existing directory (an image brings its own /dev,
 * /proc, /etc …). */
static int
mkdir_ok(const char *path, mode_t mode)
{
    struct stat st;
    if (mkdir(path, mode) == 0)
        return 0;
    if (errno != EEXIST)
        return -1;
    if (lstat(path, &st) == 0 && S_ISDIR(st.st_mode))
        return 0;
    errno = ENOTDIR;
    return -1;
}

/* Bind src (a host path, with the mounts below it) onto dst inside the new
 * root, dst created as a file or directory to match src; its attributes are
 * src's mount's until the caller sets them.  0, 1 when src is missing and
 * !must_exist (nothing done), or -errno. */
static int
bind_at(const char *src, const char *dst, bool must_exist)
{
    struct stat st;
    if (stat(src, &st) < 0)
        return must_exist ? -errno : 1;
    if (S_ISDIR(st.st_mode)) {
        if (mkdir(dst, 0755) < 0 && errno != EEXIST)
            return -errno;
    } else {
        int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
        if (fd < 0)
            return -errno;
        close(fd);
    }
    return mount(src, dst, NULL, MS_BIND | MS_REC, NULL) == 0 ? 0 : -errno;
}

/* bind_at, then read-only, nosuid, nodev, with the mounts below it. */
static int
bind_ro(const char *src, const char *dst, bool must_exist)
{
    int rc = bind_at(src, dst, must_exist);
    if (rc == 0)
        rc = agent_mount_attr(dst, ATTR_RO, true);
    return rc < 0 ? rc : 0;
}

static int
write_text(const char *path, const char *text, mode_t mode)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
    if (fd < 0)
        return -errno;
    int rc = sbx_write_full(fd, text, strlen(text));
    close(fd);
    return rc;
}

/* Mirror a top-level link of the host root (/bin → usr/bin on merged-/usr
 * systems) or bind the directory when it is not a link. */
static int
mirror_toplevel(const char *name)
{
    char host[64], dst[64], target[256];
    snprintf(host, sizeof(host), "/%s", name);
    snprintf(dst, sizeof(dst), NEWROOT "/%s", name);
    ssize_t n = readlink(host, target, sizeof(target) - 1);
    if (n >= 0) {
        target[n] = '\0';
        return symlink(target, dst) == 0 ? 0 : -errno;
    }
    if (errno == ENOENT)
        return 0;
    return bind_ro(host, dst, false);
}

/*
 * Mount at dst one of the sandbox's writable places besides /workspace,
 * /tmp and /home (/run, /dev/shm): the directory of the writable tmpfs that
 * *fd holds (an O_PATH descriptor; closed here and set to -1), bound with
 * attr (MOUNT_ATTR_*); or, when *fd < 0 (an image sandbox with a workspace
 * of its own), a tmpfs of its own with flags and opts.  A bind shares the writable
 * tmpfs's superblock and quota instead of adding one of each: every
 * superblock costs each memory cgroup on the host a slot in its shrinker
 * map (docs/benchmarks.md, "Density").  0 or -errno.
 */
static int
mount_rw_dir(int *fd, const char *dst, uint64_t attr, unsigned long flags, const char *opts)
{
    if (*fd < 0)
        return mount("tmpfs", dst, "tmpfs", flags, opts) == 0 ? 0 : -errno;
    char src[32];
    snprintf(src, sizeof(src), "/proc/self/fd/%d", *fd);
    int rc = mount(src, dst, NULL, MS_BIND, NULL) == 0 ? 0 : -errno;
    close(*fd);
    *fd = -1;
    return rc ? rc : agent_mount_attr(dst, attr, false);
}

/* An O_PATH descriptor of path, a directory made here with mode (for
 * mount_rw_dir); -1 with errno set on failure. */
static int
rw_dir_open(const char *path, mode_t mode)
{
    if (mkdir_ok(path, mode) < 0 || chmod(path, mode) < 0)
        return -1;
    return open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
}

/* ------------------------------------------------------------------------------ */

/* The resolver of an egress sandbox: an address of its shard's router
 * (SBX_NET_RESOLVER, container/net.h), the same for every sandbox; in a
 * `none` sandbox it is unreachable and lookups fail at once. */
#define RESOLV_CONF "# sbx: the shard's resolver (docs/network.md); only egress sandboxes reach it\n" \
                    "nameserver 169.254.0.53\n"

static int
setup_etc(const struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    char src[512], dst[512];

    /* /etc is a mount of its own (a directory of the root bound on itself)
     * so that one recursive mount_setattr at the end makes it and every
     * bind in it read-only, nosuid, nodev: one call instead of one per
     * bind, about 25 fewer system calls per start (docs/benchmarks.md,
     * "the sequential build"). */
    STEP(mkdir(NEWROOT "/etc", 0755) == 0, "mkdir /etc");
    STEP(mount(NEWROOT "/etc", NEWROOT "/etc", NULL, MS_BIND, NULL) == 0, "bind /etc");
    for (char **p = cfg->etc; p && *p; p++) {
        if (strchr(*p, '/') || !strcmp(*p, "..") || !strcmp(*p, "."))
            continue;
        snprintf(src, sizeof(src), "/etc/%s", *p);
        snprintf(dst, sizeof(dst), NEWROOT "/etc/%s", *p);
        struct stat st;
        if (lstat(src, &st) < 0)
            continue;
        if (S_ISLNK(st.st_mode)) {
            /* Keep links as links (/etc/localtime → /usr/share/zoneinfo/…). */
            char t[512];
            ssize_t n = readlink(src, t, sizeof(t) - 1);
            if (n > 0) {
                t[n] = '\0';
                if (symlink(t, dst) < 0 && errno != EEXIST) {
                    rc = sbx_err_make(err, -errno, "symlink /etc/%s", *p);
                    goto out;
                }
            }
            continue;
        }
        rc = bind_at(src, dst, false);
        if (rc < 0) {
            sbx_err_make(err, rc, "bind /etc/%s", *p);
            goto out;
        }
    }
    /* Generated files: no host account, host name or resolver leaks in. */
    char hosts[256];
    snprintf(hosts, sizeof(hosts), "127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n",
             cfg->hostname);
    struct {
        const char *name, *text;
    } gen[] = {
        {"passwd", "root:x:0:0:root:/root:/bin/bash\n"
                   "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"},
        {"group", "root:x:0:\nnogroup:x:65534:\n"},
        {"hosts", hosts},
        {"hostname", cfg->hostname},
        {"resolv.conf", RESOLV_CONF},
        {"nsswitch.conf", "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\n"
                          "networks: files\nprotocols: files\nservices: files\n"},
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(gen); i++) {
        snprintf(dst, sizeof(dst), NEWROOT "/etc/%s", gen[i].name);
        struct stat st;
        if (lstat(dst, &st) == 0)
            continue; /* the operator chose to bind the host's own */
        rc = write_text(dst, gen[i].text, 0644);
        if (rc) {
            sbx_err_make(err, rc, "write /etc/%s", gen[i].name);
            goto out;
        }
    }
    rc = agent_mount_attr(NEWROOT "/etc", ATTR_RO, true);
    if (rc)
        sbx_err_make(err, rc, "make /etc read-only");
out:
    return rc;
}

static int
setup_dev(struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    char opts[64];
    static const char *const nodes[] = {"null", "zero", "full", "random", "urandom", "tty"};

    /* /dev is a directory of the root tmpfs bound on itself (a mount of its
     * own, for noexec and, at the end, read-only), not a tmpfs: every
     * superblock costs each memory cgroup on the host a slot in its shrinker
     * map, so per-sandbox superblocks make the kernel's memory per sandbox
     * grow with the number of sandboxes (docs/benchmarks.md, "Density"). */
    STEP(mkdir_ok(NEWROOT "/dev", 0755) == 0, "mkdir /dev");
    STEP(mount(NEWROOT "/dev", NEWROOT "/dev", NULL, MS_BIND, NULL) == 0, "bind /dev");
    for (size_t i = 0; i < SBX_ARRAY_LEN(nodes); i++) {
        char src[32], dst[64];
        snprintf(src, sizeof(src), "/dev/%s", nodes[i]);
        snprintf(dst, sizeof(dst), NEWROOT "/dev/%s", nodes[i]);
        int fd = open(dst, O_WRONLY | O_CREAT | O_CLOEXEC, 0666);
        STEP(fd >= 0, "create /dev/%s", nodes[i]);
        close(fd);
        /* A bind of the host node keeps the device usable: mounts made in a
         * user namespace are always nodev, and mknod needs CAP_MKNOD of the
         * host (bubblewrap's --dev does the same). */
        STEP(mount(src, dst, NULL, MS_BIND, NULL) == 0, "bind /dev/%s", nodes[i]);
    }
    /* /dev and its nodes nosuid, noexec in one call (before devpts, /dev/shm
     * and mqueue, which have their own); /dev itself nodev at the end. */
    STEP(agent_mount_attr(NEWROOT "/dev", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC, true) == 0,
         "restrict /dev and its nodes");
    STEP(mkdir_ok(NEWROOT "/dev/pts", 0755) == 0, "mkdir /dev/pts");
    STEP(mount("devpts", NEWROOT "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
               "newinstance,ptmxmode=0666,mode=0620") == 0,
         "mount devpts");
    STEP(symlink("pts/ptmx", NEWROOT "/dev/ptmx") == 0, "link /dev/ptmx");
    STEP(mkdir_ok(NEWROOT "/dev/shm", 01777) == 0, "mkdir /dev/shm");
    snprintf(opts, sizeof(opts), "size=%llu,mode=1777", (unsigned long long)cfg->shm_size);
    rc = mount_rw_dir(&cfg->shm_fd, NEWROOT "/dev/shm", MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                      MS_NOSUID | MS_NODEV, opts);
    if (rc) {
        errno = -rc;
        STEP(0, "mount /dev/shm");
    }
    STEP(mkdir_ok(NEWROOT "/dev/mqueue", 0755) == 0, "mkdir /dev/mqueue");
    /* POSIX message queues of our IPC namespace (best effort: optional fs). */
    if (mount("mqueue", NEWROOT "/dev/mqueue", "mqueue", MS_NOSUID | MS_NODEV | MS_NOEXEC,
              NULL) < 0 && errno != ENODEV)
        STEP(0, "mount /dev/mqueue");
    STEP(symlink("/proc/self/fd", NEWROOT "/dev/fd") == 0, "link /dev/fd");
    STEP(symlink("/proc/self/fd/0", NEWROOT "/dev/stdin") == 0, "link /dev/stdin");
    STEP(symlink("/proc/self/fd/1", NEWROOT "/dev/stdout") == 0, "link /dev/stdout");
    STEP(symlink("/proc/self/fd/2", NEWROOT "/dev/stderr") == 0, "link /dev/stderr");
    STEP(symlink("/proc/kcore", NEWROOT "/dev/core") == 0, "link /dev/core");
    /* No new nodes, ever: /dev itself becomes read-only (and nodev: only
     * the nodes bound in it are devices). */
    STEP(agent_mount_attr(NEWROOT "/dev", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NODEV, false) == 0,
         "make /dev read-only");
out:
    return rc;
}

/*
 * Mask every /proc/<name> of names[0..n) that exists with a bind of src
 * (NEWROOT's /dev/null for files, its empty /sys for directories),
 * read-only, nosuid, nodev, noexec.  Only the first mask gets those
 * attributes set (one mount_setattr); the others are binds of the first,
 * and a bind takes its source mount's attributes (fs/namespace.c clone_mnt
 * copies mnt_flags): n + 1 calls instead of 2n.  0, or -errno with *err
 * naming the file.
 */
static int
mask_proc(const char *const *names, size_t n, const char *src, sbx_err_t *err)
{
    int rc = 0;
    char first[64] = "";
    for (size_t i = 0; i < n; i++) {
        char dst[64];
        snprintf(dst, sizeof(dst), NEWROOT "/proc/%s", names[i]);
        if (access(dst, F_OK) < 0)
            continue;
        STEP(mount(first[0] ? first : src, dst, NULL, MS_BIND, NULL) == 0, "mask /proc/%s",
             names[i]);
        if (first[0])
            continue;
        STEP(agent_mount_attr(dst, ATTR_RO_NOEXEC, false) == 0, "restrict mask /proc/%s",
             names[i]);
        snprintf(first, sizeof(first), "%s", dst);
    }
out:
    return rc;
}

static int
setup_proc(sbx_err_t *err)
{
    int rc = 0;
    /* A procfs of our own pid namespace.  It must be mounted before anything
     * is masked: the kernel refuses a new procfs in a user namespace when the
     * existing one is partly hidden (fs/namespace.c mount_too_revealing). */
    STEP(mkdir_ok(NEWROOT "/proc", 0555) == 0, "mkdir /proc");
    STEP(mount("proc", NEWROOT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) == 0,
         "mount /proc");
    /* Masked like crun's defaults (src/libcrun/spec.c): kernel memory,
     * keys, timers and scheduler internals read as empty. */
    static const char *const files[] = {"kcore", "keys", "timer_list", "sched_debug",
                                        "latency_stats", "timer_stats", "kallsyms",
                                        "sysrq-trigger"};
    if ((rc = mask_proc(files, SBX_ARRAY_LEN(files), NEWROOT "/dev/null", err)) != 0)
        goto out;
    /* Directories read as empty: read-only binds of the empty /sys of the
     * root tmpfs (which stays empty: no sysfs), rather than a tmpfs each —
     * see setup_dev on what a superblock per sandbox costs. */
    static const char *const dirs[] = {"acpi", "scsi", "asound", "driver"};
    STEP(mkdir_ok(NEWROOT "/sys", 0555) == 0, "mkdir /sys");
    if ((rc = mask_proc(dirs, SBX_ARRAY_LEN(dirs), NEWROOT "/sys", err)) != 0)
        goto out;
    static const char *const ro[] = {"sys", "irq", "bus", "fs"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(ro); i++) {
        char dst[64];
        snprintf(dst, sizeof(dst), NEWROOT "/proc/%s", ro[i]);
        if (access(dst, F_OK) < 0)
            continue;
        STEP(mount(dst, dst, NULL, MS_BIND | MS_REC, NULL) == 0, "bind /proc/%s", ro[i]);
        STEP(agent_mount_attr(dst, ATTR_RO_NOEXEC, true) == 0, "make /proc/%s read-only", ro[i]);
    }
out:
    return rc;
}

/* Attach the persistent workspace's mount (agent_ws_recv) at path. */
static int
attach_ws(struct agent_cfg *cfg, const char *path, sbx_err_t *err)
{
    int rc = 0;
    STEP(syscall(SYS_move_mount, cfg->ws_fd, "", AT_FDCWD, path, MOVE_MOUNT_F_EMPTY_PATH) == 0,
         "attach the workspace");
    close(cfg->ws_fd);
    cfg->ws_fd = -1;
    STEP(chmod(path, 0755) == 0, "chmod the workspace's root");
out:
    return rc;
}

/* /workspace, /tmp and /home: directories <from>/<name> (made with their
 * modes where missing: a persistent workspace keeps them) bound on
 * <to>/<name> (made here).  0 or the failing step's code with *err. */
static int
bind_rw_dirs(const char *from, const char *to, sbx_err_t *err)
{
    static const struct {
        const char *name;
        mode_t mode;
    } rw[] = {{"workspace", 0755}, {"tmp", 01777}, {"home", 0755}};
    int rc = 0;
    for (size_t i = 0; i < SBX_ARRAY_LEN(rw); i++) {
        char src[64], dst[64];
        snprintf(src, sizeof(src), "%s/%s", from, rw[i].name);
        snprintf(dst, sizeof(dst), "%s/%s", to, rw[i].name);
        STEP(mkdir_ok(src, rw[i].mode) == 0 && chmod(src, rw[i].mode) == 0, "mkdir %s", src);
        STEP(mkdir(dst, 0755) == 0, "mkdir /%s", rw[i].name);
        STEP(mount(src, dst, NULL, MS_BIND, NULL) == 0, "bind /%s", rw[i].name);
    }
out:
    return rc;
}

/*
 * The writable tmpfs of a host-/usr sandbox, and its root in it.  One tmpfs
 * of the sandbox's disk quota (size=, nr_inodes=) holds /workspace, /tmp,
 * /home, /run and /dev/shm (directories bound where they go: here,
 * setup_rw, setup_dev) and, in a directory of its own,
 * the root's files (the mount points, /etc's generated files, /dev's
 * nodes): one superblock instead of four (the root, the writable tmpfs,
 * /run and /dev/shm each had one), as every superblock costs each memory
 * cgroup on the host a slot in its shrinker map (docs/benchmarks.md,
 * "Density").  The root's directory is bound on itself, the binds of
 * /workspace, /tmp and /home are made in it, and it is moved onto NEWROOT,
 * where every later step builds on it; after pivot_root it is made
 * read-only, as the root tmpfs it replaces was.  The tmpfs's top level is
 * reachable from the sandbox only through those binds.
 *
 * With a workspace of the sandbox's own (cfg->ws), /workspace, /tmp and
 * /home are on it (setup_rw) and the tmpfs holds the root, /run and
 * /dev/shm only, of their former sizes together (1 MiB + 32 MiB +
 * shm_size): that file system is kept across restarts, these are not.
 */
static int
setup_rw_root(struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    char opts[96];
    uint64_t size = cfg->ws ? (33ull << 20) + cfg->shm_size : cfg->rw_size;
    snprintf(opts, sizeof(opts), "size=%llu,nr_inodes=%llu,mode=0755", (unsigned long long)size,
             (unsigned long long)cfg->rw_inodes);
    STEP(mount("tmpfs", NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0,
         "mount the writable tmpfs");
    STEP(mkdir(NEWROOT "/.root", 0755) == 0, "mkdir the root's directory");
    STEP(mount(NEWROOT "/.root", NEWROOT "/.root", NULL, MS_BIND, NULL) == 0,
         "bind the root's directory");
    if (!cfg->ws) {
        if ((rc = bind_rw_dirs(NEWROOT, NEWROOT "/.root", err)) != 0)
            goto out;
        STEP(mkdir(NEWROOT "/home/root", 0700) == 0, "mkdir /home/root");
        STEP(symlink("home/root", NEWROOT "/.root/root") == 0, "link /root");
    }
    cfg->run_fd = rw_dir_open(NEWROOT "/run", 0755);
    STEP(cfg->run_fd >= 0, "mkdir the writable tmpfs's run");
    cfg->shm_fd = rw_dir_open(NEWROOT "/shm", 01777);
    STEP(cfg->shm_fd >= 0, "mkdir the writable tmpfs's shm");
    STEP(mount(NEWROOT "/.root", NEWROOT, NULL, MS_MOVE, NULL) == 0,
         "move the root's directory onto the new root");
out:
    return rc;
}

static int
setup_rw(struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    /* One file system holds /workspace, /tmp and /home, so a sandbox has one
     * disk quota and one inode quota for all it can write: the writable
     * tmpfs (setup_rw_root made these on it), or a workspace of the
     * sandbox's own of the same quota (container/workspace.h), whose
     * directories may exist already. */
    if (!cfg->ws)
        goto run;
    STEP(mkdir(NEWROOT "/.rw", 0755) == 0, "mkdir /.rw");
    if ((rc = attach_ws(cfg, NEWROOT "/.rw", err)) != 0)
        goto out;
    if ((rc = bind_rw_dirs(NEWROOT "/.rw", NEWROOT, err)) != 0)
        goto out;
    STEP(mkdir_ok(NEWROOT "/.rw/home/root", 0700) == 0, "mkdir /home/root");
    STEP(symlink("home/root", NEWROOT "/root") == 0, "link /root");
    STEP(umount2(NEWROOT "/.rw", MNT_DETACH) == 0, "detach /.rw");
    STEP(rmdir(NEWROOT "/.rw") == 0, "rmdir /.rw");
run:
    /* /run for the agent's own small files (stdin of session commands). */
    STEP(mkdir(NEWROOT "/run", 0755) == 0, "mkdir /run");
    rc = mount_rw_dir(&cfg->run_fd, NEWROOT "/run",
                      MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                      MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=32m,nr_inodes=4096,mode=0755");
    if (rc) {
        errno = -rc;
        STEP(0, "mount /run");
    }
    STEP(mkdir(NEWROOT "/var", 0755) == 0, "mkdir /var");
    STEP(symlink("/tmp", NEWROOT "/var/tmp") == 0, "link /var/tmp");
    STEP(symlink("/run", NEWROOT "/var/run") == 0, "link /var/run");
out:
    return rc;
}

/*
 * 3'. The root of an image sandbox (docs/images.md): an overlayfs whose
 * lower dirs are the image's layers — detached mounts the shard made
 * read-only and idmapped to our user namespace (container/spawn.c), so a
 * file of host uid 0 is our root's — and whose upper dir is the sandbox's
 * writable layer, on a tmpfs of the sandbox's disk quota (size=, nr_inodes=:
 * the same quota as /workspace, /tmp and /home of a host-/usr sandbox, and
 * those live in the overlay here).  It is mounted from inside our user
 * namespace, which overlayfs allows since Linux 5.11, with `userxattr`: its
 * opaque and redirect markers are user.overlay.* xattrs
 * (Documentation/filesystems/overlayfs.rst, "User xattr"), which is how
 * container/image_unpack.c writes opaque directories.  The tmpfs is
 * mounted at NEWROOT, the overlay on a directory of it, and then moved
 * onto NEWROOT, over the tmpfs, so every later step builds on the overlay.
 */
static int
setup_image_root(struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    char opts[96], path[64];
    char *lower = NULL;
    snprintf(opts, sizeof(opts), "size=%llu,nr_inodes=%llu,mode=0755",
             (unsigned long long)cfg->rw_size, (unsigned long long)cfg->rw_inodes);
    /* A persistent workspace (container/workspace.h) in place of the tmpfs:
     * the upper layer, and so every write, is kept. */
    if (cfg->ws) {
        if ((rc = attach_ws(cfg, NEWROOT, err)) != 0)
            goto out;
    } else {
        STEP(mount("tmpfs", NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0,
             "mount the writable layer's tmpfs");
    }
    STEP(mkdir_ok(NEWROOT "/upper", 0755) == 0 && mkdir_ok(NEWROOT "/work", 0755) == 0 &&
             mkdir_ok(NEWROOT "/root", 0755) == 0,
         "mkdir the overlay's directories");
    size_t cap = (size_t)cfg->nlayers * 24 + 128, o = 0;
    lower = sbx_xmalloc(cap);
    o += (size_t)snprintf(lower, cap, "lowerdir=");
    for (int i = 0; i < cfg->nlayers; i++) {
        snprintf(path, sizeof(path), NEWROOT "/l%d", i);
        STEP(mkdir_ok(path, 0755) == 0, "mkdir %s", path);
        STEP(syscall(SYS_move_mount, cfg->layer_fds[i], "", AT_FDCWD, path,
                     MOVE_MOUNT_F_EMPTY_PATH) == 0,
             "attach image layer %d", i);
        close(cfg->layer_fds[i]);
        cfg->layer_fds[i] = -1;
    }
    {
        /* The upper dir stays reachable for a template build (AGENT_UPPER_FD),
         * placed once the layers' descriptors are closed; the number must be
         * free (dup3 would close what holds it). */
        errno = EBUSY;
        STEP(fcntl(AGENT_UPPER_FD, F_GETFD) < 0, "fd %d is in use", AGENT_UPPER_FD);
        int ufd = open(NEWROOT "/upper", O_PATH | O_DIRECTORY | O_CLOEXEC);
        STEP(ufd >= 0, "open the upper dir");
        int d = dup3(ufd, AGENT_UPPER_FD, O_CLOEXEC);
        close(ufd);
        STEP(d == AGENT_UPPER_FD, "keep the upper dir at fd %d", AGENT_UPPER_FD);
    }
    /* /run and /dev/shm: directories of the tmpfs beside the upper dir (so
     * never in the image's writable layer, which templates and snapshots
     * read), bound later (mount_rw_dir); a workspace's file system is kept,
     * so with one they are tmpfs of their own. */
    if (!cfg->ws) {
        cfg->run_fd = rw_dir_open(NEWROOT "/run", 0755);
        STEP(cfg->run_fd >= 0, "mkdir the writable tmpfs's run");
        cfg->shm_fd = rw_dir_open(NEWROOT "/shm", 01777);
        STEP(cfg->shm_fd >= 0, "mkdir the writable tmpfs's shm");
    }
    /* lowerdir lists the top layer first. */
    for (int i = cfg->nlayers - 1; i >= 0; i--)
        o += (size_t)snprintf(lower + o, cap - o, "%s" NEWROOT "/l%d",
                              i == cfg->nlayers - 1 ? "" : ":", i);
    snprintf(lower + o, cap - o, ",upperdir=" NEWROOT "/upper,workdir=" NEWROOT "/work,userxattr");
    STEP(mount("overlay", NEWROOT "/root", "overlay", MS_NOSUID | MS_NODEV, lower) == 0,
         "mount the image's overlay");
    /* The overlay holds its own references to the layers. */
    for (int i = 0; i < cfg->nlayers; i++) {
        snprintf(path, sizeof(path), NEWROOT "/l%d", i);
        umount2(path, MNT_DETACH);
    }
    /* /dev and /sys start empty whatever the image holds there (a rootfs
     * tarball carries /dev/fd, /dev/null …): empty directories of the tmpfs
     * bound over them, moved with the overlay below (setup_dev and
     * setup_proc then build on them as on the host-/usr root's). */
    static const struct {
        const char *name;
        mode_t mode;
    } fresh[] = {{"dev", 0755}, {"sys", 0555}};
    for (size_t i = 0; i < SBX_ARRAY_LEN(fresh); i++) {
        char src[64], dst[64];
        snprintf(src, sizeof(src), NEWROOT "/empty-%s", fresh[i].name);
        snprintf(dst, sizeof(dst), NEWROOT "/root/%s", fresh[i].name);
        /* On a persistent workspace they hold what the last container's
         * setup_dev made there: empty them. */
        if (cfg->ws) {
            int e = sbx_rm_rf(src);
            STEP(e == 0 || e == -ENOENT, "empty %s", src);
        }
        STEP(mkdir_ok(src, fresh[i].mode) == 0 && chmod(src, fresh[i].mode) == 0, "mkdir %s", src);
        STEP(mkdir_ok(dst, fresh[i].mode) == 0, "mkdir /%s", fresh[i].name);
        STEP(mount(src, dst, NULL, MS_BIND, NULL) == 0, "bind an empty /%s", fresh[i].name);
    }
    STEP(mount(NEWROOT "/root", NEWROOT, NULL, MS_MOVE, NULL) == 0,
         "move the overlay onto the new root");

    /* Generated files over the image's: no host name or resolver leaks in;
     * its passwd and group stay (they name its users). */
    char hosts[256];
    snprintf(hosts, sizeof(hosts), "127.0.0.1\tlocalhost %s\n::1\tlocalhost ip6-localhost\n",
             cfg->hostname);
    const char *gen[][2] = {{"hosts", hosts},
                            {"hostname", cfg->hostname},
                            {"resolv.conf", RESOLV_CONF}};
    STEP(mkdir_ok(NEWROOT "/etc", 0755) == 0, "mkdir /etc");
    for (size_t i = 0; i < SBX_ARRAY_LEN(gen); i++) {
        char dst[64];
        snprintf(dst, sizeof(dst), NEWROOT "/etc/%s", gen[i][0]);
        if (unlink(dst) < 0 && errno != ENOENT)
            STEP(0, "replace /etc/%s", gen[i][0]);
        rc = write_text(dst, gen[i][1], 0644);
        if (rc) {
            sbx_err_make(err, rc, "write /etc/%s", gen[i][0]);
            goto out;
        }
    }
    static const struct {
        const char *name;
        mode_t mode;
    } dirs[] = {{"workspace", 0755}, {"tmp", 01777}, {"home", 0755}, {"root", 0700},
                {"run", 0755}, {"opt", 0755}};
    for (size_t i = 0; i < SBX_ARRAY_LEN(dirs); i++) {
        char d[64];
        snprintf(d, sizeof(d), NEWROOT "/%s", dirs[i].name);
        STEP(mkdir_ok(d, dirs[i].mode) == 0, "mkdir /%s", dirs[i].name);
    }
    STEP(chmod(NEWROOT "/tmp", 01777) == 0, "chmod /tmp");
    rc = mount_rw_dir(&cfg->run_fd, NEWROOT "/run",
                      MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                      MS_NOSUID | MS_NODEV | MS_NOEXEC, "size=32m,nr_inodes=4096,mode=0755");
    if (rc) {
        errno = -rc;
        STEP(0, "mount /run");
    }
out:
    free(lower);
    return rc;
}

static int
drop_privileges(const struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    struct rlimit rl;

    /* Limits for everything we will start: children inherit them. */
    rl.rlim_cur = rl.rlim_max = 0;
    STEP(setrlimit(RLIMIT_CORE, &rl) == 0, "RLIMIT_CORE");
    rl.rlim_cur = rl.rlim_max = cfg->nproc;
    STEP(setrlimit(RLIMIT_NPROC, &rl) == 0, "RLIMIT_NPROC");
    rl.rlim_cur = rl.rlim_max = 65536;
    if (setrlimit(RLIMIT_NOFILE, &rl) < 0) {
        rl.rlim_cur = rl.rlim_max = cfg->nofile;
        STEP(setrlimit(RLIMIT_NOFILE, &rl) == 0, "RLIMIT_NOFILE");
    }
    /* Every other limit set here too, never inherited from whatever started
     * sbxd (issue 16 item 9; the values are docs/security.md §2 item 8's). */
    /* FSIZE: twice the larger writable tmpfs, so a full disk is always
     * ENOSPC first (never SIGXFSZ), yet no file can grow without bound. */
    uint64_t fsize = 2 * (cfg->rw_size > cfg->shm_size ? cfg->rw_size : cfg->shm_size);
    const struct {
        int res;
        rlim_t cur, max;
        const char *name;
    } lims[] = {
        {RLIMIT_RTPRIO, 0, 0, "RLIMIT_RTPRIO"},   /* no real-time scheduling */
        {RLIMIT_NICE, 0, 0, "RLIMIT_NICE"},       /* nice can go up, never below 0 */
        {RLIMIT_MEMLOCK, 8u << 20, 8u << 20, "RLIMIT_MEMLOCK"}, /* the default since 5.16 */
        {RLIMIT_SIGPENDING, 4096, 4096, "RLIMIT_SIGPENDING"},   /* queued signals of the uid */
        {RLIMIT_MSGQUEUE, 819200, 819200, "RLIMIT_MSGQUEUE"},   /* mqueue bytes (default) */
        {RLIMIT_FSIZE, fsize ? (rlim_t)fsize : RLIM_INFINITY, fsize ? (rlim_t)fsize : RLIM_INFINITY,
         "RLIMIT_FSIZE"},
        {RLIMIT_STACK, 8u << 20, RLIM_INFINITY, "RLIMIT_STACK"},
        {RLIMIT_LOCKS, 1024, 1024, "RLIMIT_LOCKS"},
        {RLIMIT_CPU, RLIM_INFINITY, RLIM_INFINITY, "RLIMIT_CPU"},   /* cpu cgroup, timeouts */
        {RLIMIT_DATA, RLIM_INFINITY, RLIM_INFINITY, "RLIMIT_DATA"}, /* the memory cgroup */
        {RLIMIT_AS, RLIM_INFINITY, RLIM_INFINITY, "RLIMIT_AS"},
        {RLIMIT_RSS, RLIM_INFINITY, RLIM_INFINITY, "RLIMIT_RSS"},
    };
    for (size_t i = 0; i < sizeof(lims) / sizeof(lims[0]); i++) {
        rl.rlim_cur = lims[i].cur;
        rl.rlim_max = lims[i].max;
        if (setrlimit(lims[i].res, &rl) == 0)
            continue;
        /* Raising a hard limit needs CAP_SYS_RESOURCE on the host: keep the
         * inherited hard limit, which is then the stricter value. */
        struct rlimit old;
        STEP(errno == EPERM && getrlimit(lims[i].res, &old) == 0, "%s", lims[i].name);
        rl.rlim_max = old.rlim_max;
        rl.rlim_cur = lims[i].cur < old.rlim_max ? lims[i].cur : old.rlim_max;
        STEP(setrlimit(lims[i].res, &rl) == 0, "%s", lims[i].name);
    }

    /* Capabilities: bounding set, ambient set, then securebits so that uid 0
     * gains nothing at execve, then the three sets emptied (crun
     * set_required_caps, isolation.md §6 step 13). */
    for (int c = 0; c <= 63; c++) {
        if (prctl(PR_CAPBSET_DROP, c, 0, 0, 0) < 0 && errno != EINVAL) {
            rc = sbx_err_make(err, -errno, "drop capability %d from the bounding set", c);
            goto out;
        }
    }
    STEP(prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) == 0, "clear ambient caps");
    STEP(prctl(PR_SET_SECUREBITS, SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                      SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
                                      SECBIT_NO_CAP_AMBIENT_RAISE |
                                      SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED,
               0, 0, 0) == 0,
         "lock securebits");
    /* An image's User (docs/images.md, "User"): become its ids, which the
     * shard mapped (container/spawn.c), while CAP_SETUID/SETGID are still
     * ours (NO_SETUID_FIXUP keeps them across the change; capset empties
     * them next).  A change of ids clears the parent-death signal: set it
     * again (container/spawn.c sets it before, for the same reason). */
    if (cfg->run_uid || cfg->run_gid) {
        gid_t g = cfg->run_gid, gs[9] = {cfg->run_gid};
        for (int i = 0; i < cfg->run_ngroups && i < 8; i++)
            gs[i + 1] = cfg->run_groups[i];
        STEP(syscall(SYS_setgroups, 1 + SBX_MIN(cfg->run_ngroups, 8), gs) == 0,
             "setgroups [%u + %d more]", cfg->run_gid, cfg->run_ngroups);
        STEP(syscall(SYS_setresgid, g, g, g) == 0, "setresgid %u", cfg->run_gid);
        STEP(syscall(SYS_setresuid, cfg->run_uid, cfg->run_uid, cfg->run_uid) == 0,
             "setresuid %u", cfg->run_uid);
        STEP(prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) == 0, "parent-death signal");
    }
    struct __user_cap_header_struct hdr = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct data[2];
    memset(data, 0, sizeof(data));
    STEP(syscall(SYS_capset, &hdr, data) == 0, "capset to the empty set");
    STEP(prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0, "no_new_privs");
    /* Non-dumpable: /proc/1/{mem,fd,environ,…} then need CAP_SYS_PTRACE,
     * which nobody in here has. */
    STEP(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) == 0, "non-dumpable");
    /* Seccomp last (bubblewrap: "should be the last thing before execve"):
     * the agent runs under the same filters as everything it starts. */
    for (int k = 0; k < cfg->nbpf; k++) {
        struct sock_fprog prog = {
            .len = (unsigned short)(cfg->bpf[k].n / sizeof(struct sock_filter)),
            .filter = (struct sock_filter *)cfg->bpf[k].p};
        STEP(syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) == 0,
             "load seccomp filter %d", k);
    }
out:
    return rc;
}

static int
loopback_up(void)
{
    int rc = 0;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return -errno;
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        rc = -errno;
        goto out;
    }
    ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
    if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
        rc = -errno;
out:
    close(s);
    return rc;
}

void
agent_setup_step(const struct sbx_err_s *err, char *step, size_t steplen)
{
    const char *m = sbx_err_msg(err);
    size_t n = strlen(m);
    int code = sbx_err_code(err);
    if (code < 0 && code > -4096) {
        const char *se = strerror(-code);
        size_t sn = strlen(se);
        if (n >= sn + 2 && !strcmp(m + n - sn, se) && !strncmp(m + n - sn - 2, ": ", 2))
            n -= sn + 2;
    }
    snprintf(step, steplen, "%.*s", (int)n, m);
}

int
agent_setup(struct agent_cfg *cfg, sbx_err_t *err)
{
    int rc = 0;
    int interp_fd = -1;

    /* 1. Identity is already uid/gid 0 of our namespace (spawn.c did
     *    setresuid before exec).  cgroup v1: the parent attached us to our
     *    cgroups before we were let go, so a cgroup namespace made now is
     *    rooted at the sandbox's own cgroup. */
    if (cfg->unshare_cgroupns)
        STEP(unshare(CLONE_NEWCGROUP) == 0, "unshare the cgroup namespace");
    STEP(sethostname(cfg->hostname, strlen(cfg->hostname)) == 0, "sethostname");
    STEP(setdomainname("", 0) == 0, "setdomainname");

    /* 2. Nothing we mount may propagate back to the host. */
    STEP(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0, "make / private");

    /* The interpreter drivers' directory.  The shard hands us a detached
     * copy of its mount at AGENT_INTERP_TREE_FD (open_tree(2) in the host's
     * namespace: the path may sit where our unprivileged host uid cannot
     * search, a build tree under /root), attached below with move_mount(2).
     * Without one, we open the path while the host's tree is still ours to
     * see (it may live under /tmp, which the new root is about to cover)
     * and bind it through that handle. */
    bool tree = cfg->interp_tree;
    interp_fd = tree                 ? AGENT_INTERP_TREE_FD
                : cfg->interp_dir[0] ? open(cfg->interp_dir, O_PATH | O_DIRECTORY | O_CLOEXEC)
                                     : -1;

    /* 3. The new root: a directory of the writable tmpfs (setup_rw_root),
     *    read-only once built; or for an image sandbox, the image's overlay
     *    (setup_image_root). */
    if (cfg->nlayers > 0) {
        if ((rc = setup_image_root(cfg, err)) != 0)
            goto out;
        goto common;
    }
    if ((rc = setup_rw_root(cfg, err)) != 0)
        goto out;
    STEP(mkdir(NEWROOT "/usr", 0755) == 0, "mkdir /usr");
    rc = bind_ro("/usr", NEWROOT "/usr", true);
    if (rc) {
        sbx_err_make(err, rc, "bind /usr read-only");
        goto out;
    }
    static const char *const top[] = {"bin", "sbin", "lib", "lib32", "lib64", "libx32"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(top); i++) {
        rc = mirror_toplevel(top[i]);
        if (rc) {
            sbx_err_make(err, rc, "mirror /%s", top[i]);
            goto out;
        }
    }
    if ((rc = setup_etc(cfg, err)) != 0)
        goto out;
    if ((rc = setup_rw(cfg, err)) != 0)
        goto out;
common:
    if ((rc = setup_dev(cfg, err)) != 0)
        goto out;
    if ((rc = setup_proc(err)) != 0)
        goto out;
    static const char *const empty[] = {"opt", "srv", "mnt", "media"}; /* and /sys (setup_proc) */
    for (size_t i = 0; i < SBX_ARRAY_LEN(empty); i++) {
        char d[64];
        snprintf(d, sizeof(d), NEWROOT "/%s", empty[i]);
        STEP(mkdir_ok(d, 0755) == 0, "mkdir /%s", empty[i]);
    }

    /* The interpreter drivers (code contexts), read-only, when installed. */
    if (interp_fd >= 0 && tree) {
        STEP(mkdir_ok(NEWROOT "/opt/sbx", 0755) == 0, "mkdir /opt/sbx");
        STEP(syscall(SYS_move_mount, interp_fd, "", AT_FDCWD, NEWROOT "/opt/sbx",
                     MOVE_MOUNT_F_EMPTY_PATH) == 0,
             "attach the interpreter drivers at /opt/sbx");
        close(interp_fd);
        interp_fd = -1;
        rc = agent_mount_attr(NEWROOT "/opt/sbx", ATTR_RO, true);
        if (rc) {
            sbx_err_make(err, rc, "make the interpreter drivers read-only");
            goto out;
        }
    } else if (interp_fd >= 0) {
        char src[64];
        snprintf(src, sizeof(src), "/proc/self/fd/%d", interp_fd);
        rc = bind_ro(src, NEWROOT "/opt/sbx", true);
        close(interp_fd);
        interp_fd = -1;
        if (rc) {
            sbx_err_make(err, rc, "bind the interpreter drivers at /opt/sbx");
            goto out;
        }
    }

    /* 4. Switch roots: pivot_root(".", ".") stacks the old root under the new
     *    one, and the detach removes it (runc rootfs_linux.go pivotRoot). */
    STEP(chdir(NEWROOT) == 0, "chdir to the new root");
    STEP(syscall(SYS_pivot_root, ".", ".") == 0, "pivot_root");
    STEP(umount2(".", MNT_DETACH) == 0, "detach the old root");
    STEP(chdir("/") == 0, "chdir /");
    /* An image's root stays writable: its upper layer is the sandbox's. */
    STEP(agent_mount_attr("/", cfg->nlayers ? MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV : ATTR_RO,
                          false) == 0,
         "make the root read-only");

    /* 5. The network namespace is empty: only lo, brought up. */
    rc = loopback_up();
    if (rc) {
        errno = -rc;
        STEP(0, "bring up lo");
    }

    /* 6. A session of our own (no controlling terminal to inject into). */
    if (getsid(0) != getpid())
        STEP(setsid() >= 0, "setsid");
    umask(022);
    /* An image's WorkingDir exists in its sandbox (Docker creates it too). */
    if (cfg->image_workdir[0])
        STEP(sbx_mkdir_p(cfg->image_workdir, 0755) == 0, "mkdir %s", cfg->image_workdir);
    /* An image's User owns the sandbox's own writable places, as root
     * would: /workspace and /run (the agent's files of stdin go there). */
    if (cfg->run_uid || cfg->run_gid) {
        STEP(chown("/workspace", cfg->run_uid, cfg->run_gid) == 0, "chown /workspace");
        STEP(chown("/run", cfg->run_uid, cfg->run_gid) == 0, "chown /run");
    }
    STEP(chdir("/workspace") == 0, "chdir /workspace");

    /* 7. Privileges, last: nothing after this needs any. */
    rc = drop_privileges(cfg, err);
out:
    if (interp_fd >= 0)
        close(interp_fd);
    if (cfg->run_fd >= 0)
        close(cfg->run_fd);
    if (cfg->shm_fd >= 0)
        close(cfg->shm_fd);
    cfg->run_fd = cfg->shm_fd = -1;
    return rc;
}
