/*
 * mount_attr.c — set a mount's attributes (read-only, nosuid, nodev,
 * noexec), alone or with every mount below it.
 *
 * mount_setattr(2) (Linux ≥ 5.12) does it in one call, AT_RECURSIVE for a
 * whole tree: the set-up leans on that to make a directory of binds
 * read-only at once (setup.c: /etc, /dev).  Older kernels get the same
 * result from remounts (mount(2) MS_REMOUNT | MS_BIND, which changes one
 * mount), one for path and, when recursive, one for each mount below it,
 * found in /proc/self/mountinfo (proc(5): the fifth field is the mount
 * point, with space, tab, newline and backslash written as \ooo).
 */
#include <errno.h>
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

/* Every mount strictly below path (mountinfo order: parents first), each
 * remounted with attr.  0 or the first failure's -errno. */
static int
remount_below(const char *path, uint64_t attr)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f)
        return -errno;
    size_t plen = strlen(path);
    char *line = NULL;
    size_t cap = 0;
    int rc = 0;
    while (rc == 0 && getline(&line, &cap, f) > 0) {
        /* id parent major:minor root mount-point ... */
        char *save = NULL, *mp = strtok_r(line, " ", &save);
        for (int i = 0; mp && i < 4; i++)
            mp = strtok_r(NULL, " ", &save);
        if (!mp)
            continue;
        unescape(mp);
        if (strncmp(mp, path, plen) == 0 && mp[plen] == '/')
            rc = remount_one(mp, attr);
    }
    free(line);
    fclose(f);
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
