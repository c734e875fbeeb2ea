/*
 * mount_attr.c — set a mount's attributes (read-only, nosuid, nodev,
 * noexec), alone or with every mount below it.
 *
 * mount_setattr(2) (Linux ≥ 5.12) does it in one call, AT_RECURSIVE for a
 * whole tree: the set-up leans on that to make a directory of binds
 * read-only at once (setup.c: /etc, /dev).  Older kernels get the same
 * result from remounts (mount(2) MS_REMOUNT | MS_BIND, which changes one
 * mount), one for path and, when recursive, one for each mount below it,
 * found in /proc/self/mountinfo by parent id (proc(5): fields 1 and 2 are
 * the mount's and its parent's ids, the fifth its mount point, with space,
 * tab, newline and backslash written as \ooo).
 */
#include <errno.h>
#include <stdbool.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"

/* A remount of path alone with attr's flags added to those it has (a
 * remount sets the mount's flags to exactly those given; statvfs(3)'s
 * f_flag says which it has, as runc's remount does).  0 or -errno. */
static int
remount_one(const char *path, uint64_t attr)
{
    struct statvfs sv;
    if (statvfs(path, &sv) < 0)
        return -errno;
    static const struct {
        unsigned long st, ms;
    } keep[] = {{ST_RDONLY, MS_RDONLY},   {ST_NOSUID, MS_NOSUID},         {ST_NODEV, MS_NODEV},
                {ST_NOEXEC, MS_NOEXEC},   {ST_NOATIME, MS_NOATIME},       {ST_NODIRATIME, MS_NODIRATIME},
                {ST_RELATIME, MS_RELATIME}};
    unsigned long fl = MS_REMOUNT | MS_BIND;
    for (size_t i = 0; i < sizeof(keep) / sizeof(keep[0]); i++)
        if (sv.f_flag & keep[i].st)
            fl |= keep[i].ms;
    if (attr & MOUNT_ATTR_RDONLY) fl |= MS_RDONLY;
    if (attr & MOUNT_ATTR_NOSUID) fl |= MS_NOSUID;
    if (attr & MOUNT_ATTR_NODEV) fl |= MS_NODEV;
    if (attr & MOUNT_ATTR_NOEXEC) fl |= MS_NOEXEC;
    return mount(NULL, path, NULL, fl, NULL) == 0 ? 0 : -errno;
}

/* s with proc(5)'s \ooo escapes undone, in place. */
static void
unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (r[0] == '\\' && r[1] >= '0' && r[1] <= '3' && r[2] >= '0' && r[2] <= '7' &&
            r[3] >= '0' && r[3] <= '7') {
            *w++ = (char)(((r[1] - '0') << 6) | ((r[2] - '0') << 3) | (r[3] - '0'));
            r += 3;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* One line of /proc/self/mountinfo: its mount id, its parent's, and its
 * mount point (unescaped; owned). */
struct mnt {
    int id, parent;
    char *mp;
};

static void
mnts_free(struct mnt *m, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(m[i].mp);
    free(m);
}

/* This namespace's mounts, in mountinfo's order (a mount over another comes
 * after it).  *out owned by the caller (mnts_free).  The count or -errno. */
static ssize_t
mnts_read(struct mnt **out)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    struct mnt *m = NULL;
    size_t n = 0, cap = 0, lcap = 0;
    char *line = NULL;
    ssize_t rc = 0;
    while (getline(&line, &lcap, f) > 0) {
        /* id parent major:minor root mount-point ... */
        char *save = NULL, *fld[5] = {0};
        char *t = strtok_r(line, " ", &save);
        for (int i = 0; t && i < 5; i++, t = strtok_r(NULL, " ", &save))
            fld[i] = t;
        if (!fld[4])
            continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct mnt *g = realloc(m, cap * sizeof(*m));
            if (!g) {
                rc = -ENOMEM;
                break;
            }
            m = g;
        }
        unescape(fld[4]);
        m[n] = (struct mnt){.id = atoi(fld[0]), .parent = atoi(fld[1]), .mp = strdup(fld[4])};
        if (!m[n].mp) {
            rc = -ENOMEM;
            break;
        }
        n++;
    }
    if (rc == 0 && ferror(f))
        rc = -EIO;
    free(line);
    fclose(f);
    if (rc < 0) {
        mnts_free(m, n);
        return rc;
    }
    *out = m;
    return (ssize_t)n;
}

/* The mount a lookup of mp finds: the last at that mount point. */
static bool
mnt_on_top(const struct mnt *m, size_t n, size_t i)
{
    for (size_t j = i + 1; j < n; j++)
        if (!strcmp(m[j].mp, m[i].mp))
            return false;
    return true;
}

/* Every mount below the one at path — its descendants by parent id, as
 * AT_RECURSIVE takes them, not every mount point whose name starts with
 * path (a mount path's own mount hides is not one of them) — each that a
 * lookup of its mount point reaches remounted with attr.  0 or the first
 * failure's -errno. */
static int
remount_below(const char *path, uint64_t attr)
{
    struct mnt *m = NULL;
    ssize_t n = mnts_read(&m);
    if (n < 0)
        return (int)n;
    int rc = 0;
    bool *in = calloc((size_t)n + 1, sizeof(*in));
    ssize_t top = -1;
    for (ssize_t i = 0; i < n; i++)
        if (!strcmp(m[i].mp, path))
            top = i;
    if (!in || top < 0) {
        rc = !in ? -ENOMEM : -EINVAL;
        goto out;
    }
    in[top] = true;
    for (bool grew = true; grew;) {
        grew = false;
        for (ssize_t i = 0; i < n; i++)
            for (ssize_t j = 0; !in[i] && j < n; j++)
                if (in[j] && m[i].parent == m[j].id && m[i].id != m[j].id)
                    in[i] = grew = true;
    }
    for (ssize_t i = 0; rc == 0 && i < n; i++)
        if (in[i] && i != top && mnt_on_top(m, (size_t)n, (size_t)i))
            rc = remount_one(m[i].mp, attr);
out:
    free(in);
    mnts_free(m, (size_t)n);
    return rc;
}

int
agent_remount_attr(const char *path, uint64_t attr, bool recursive)
{
    int rc = remount_one(path, attr);
    return rc == 0 && recursive ? remount_below(path, attr) : rc;
}

int
agent_mount_attr(const char *path, uint64_t attr, bool recursive)
{
    struct mount_attr ma = {.attr_set = attr};
    if (syscall(SYS_mount_setattr, AT_FDCWD, path, recursive ? AT_RECURSIVE : 0, &ma,
                sizeof(ma)) == 0)
        return 0;
    return errno == ENOSYS ? agent_remount_attr(path, attr, recursive) : -errno;
}
