/*
 * hostlock.c — host-wide locks of sbxd processes (hostlock.h), moved out of
 * tools/sbxd.c unchanged but for the uid ranges (issue 16 item 10).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "../runtime/log.h"
#include "../runtime/util.h"
#include "hostlock.h"

/* ------------------------------------------------------------------------------ */
/*
 * Host locks: one live deployment per name, one live shard per cgroup subtree
 * and per host uid (uid_range_lock, below).
 *
 * A shard sweeps its cgroup subtree at start-up, killing every process left
 * in it (container/cgroup.c).  So a second deployment of the same name
 * on one host would kill the first one's sandboxes.  Before touching a
 * cgroup or a uid each process takes, in
 * LOCK_DIR (root's, 0700, files 0600 so no other user can hold one):
 *   deploy.<name>.lock       exclusively, by `sbxd dev`;
 *   cgroup.<a>.lock, cgroup.<a/b>.lock, …  shared, by a shard with cgroup
 *   subtree a/b/…/z for every ancestor, and cgroup.<a/b/…/z>.lock
 *   exclusively: a subtree nested in a live shard's (whose sweep would
 *   empty it) is refused as well as the same one.
 * flock(2) without waiting; a lock dies with the last descriptor of its open
 * file, so the lock of a crashed or SIGKILLed process never blocks (its file
 * remains and is reused).  Descriptors are close-on-exec: neither shards nor
 * sandboxes inherit them.  A refusal names a holder from /proc/locks.  The
 * exclusive holder writes its pid into the file (for people) and unlinks
 * the file when it stops, before closing it (so while still holding it);
 * an ancestor's file is unlinked only by a shard whose own subtree it is.
 * Whoever locks a file checks that it is still the one at the path, and
 * tries again if it was unlinked meanwhile.
 */
#define LOCK_DIR "/run/sbx"

/* LOCK_DIR exists, is a directory and only its owner (root) writes to it. */
static int
lock_dir_check(char *why, size_t whylen)
{
    struct stat st;
    int rc = 0;
    if (mkdir(LOCK_DIR, 0700) != 0 && errno != EEXIST)
        rc = -errno;
    else if (lstat(LOCK_DIR, &st) != 0)
        rc = -errno;
    else if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022))
        rc = -EPERM;
    if (rc)
        snprintf(why, whylen, "%s must be a directory of uid %d writable by it alone (%s)",
                 LOCK_DIR, (int)geteuid(), strerror(-rc));
    return rc;
}

/* LOCK_DIR/<kind>.<key[0..n)>.lock, bytes of the key other than
 * [A-Za-z0-9_.-] as %XX ('/' is %2F): one file per key, always inside
 * LOCK_DIR.  0 or -ENAMETOOLONG. */
static int
lock_path(char *out, size_t outlen, const char *kind, const char *key, size_t n)
{
    char name[NAME_MAX + 1];
    size_t k = (size_t)snprintf(name, sizeof(name), "%s.", kind);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        unsigned char ch = (unsigned char)key[i];
        bool plain = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '_' || ch == '.' || ch == '-';
        if (k + 3 + 5 >= sizeof(name))
            rc = -ENAMETOOLONG;
        else if (plain)
            name[k++] = (char)ch;
        else
            k += (size_t)snprintf(name + k, sizeof(name) - k, "%%%02X", ch);
    }
    if (!rc && k + 5 >= sizeof(name))
        rc = -ENAMETOOLONG;
    if (!rc) {
        memcpy(name + k, ".lock", 6);
        if ((size_t)snprintf(out, outlen, "%s/%s", LOCK_DIR, name) >= outlen)
            rc = -ENAMETOOLONG;
    }
    return rc;
}

/* lock_holder — a process other than us that holds a flock on fd's file,
 * from /proc/locks ("1: FLOCK ADVISORY WRITE <pid> <maj>:<min>:<ino> 0 EOF",
 * the device in hex; waiters, "1: -> FLOCK …", skipped), or 0. */
static pid_t
lock_holder(int fd)
{
    struct stat st;
    char *text = NULL;
    size_t n;
    pid_t pid = 0;
    if (fstat(fd, &st) != 0 || sbx_fs_read("/proc/locks", 1 << 20, &text, &n) != 0)
        text = NULL;
    for (char *line = text; line && *line && !pid;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        char kind[16];
        int p;
        unsigned maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*s %15s %*s %*s %d %x:%x:%llu", kind, &p, &maj, &min, &ino) == 5 &&
            !strcmp(kind, "FLOCK") && maj == major(st.st_dev) && min == minor(st.st_dev) &&
            ino == (unsigned long long)st.st_ino && p > 0 && p != getpid())
            pid = p;
        line = nl ? nl + 1 : NULL;
    }
    free(text);
    return pid;
}

/*
 * lock_take — flock `path` (created if missing) shared or exclusive without
 * waiting.  0 with *fd; -EBUSY when a live process holds it, with *holder
 * one such process (0 when /proc/locks does not tell); or -errno.
 */
int
lock_take(const char *path, bool excl, int *fd, pid_t *holder)
{
    int rc = -EAGAIN;
    *holder = 0;
    /* A retry only when a holder unlinked the file between our open and flock. */
    for (int attempt = 0; attempt < 16 && rc == -EAGAIN; attempt++) {
        int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
        struct stat a, b;
        if (f < 0) {
            rc = -errno;
        } else if (flock(f, (excl ? LOCK_EX : LOCK_SH) | LOCK_NB) != 0) {
            rc = errno == EWOULDBLOCK ? -EBUSY : -errno;
            *holder = rc == -EBUSY ? lock_holder(f) : 0;
            close(f);
        } else if (fstat(f, &a) != 0 || stat(path, &b) != 0 || a.st_ino != b.st_ino ||
                   a.st_dev != b.st_dev) {
            close(f); /* unlinked by its last holder: lock the file now at the path */
        } else {
            if (excl) {
                char buf[32];
                int len = snprintf(buf, sizeof(buf), "%d\n", (int)getpid());
                if (ftruncate(f, 0) != 0 || pwrite(f, buf, (size_t)len, 0) != len)
                    sbx_log_warn("cannot record our pid in %s: %s", path, strerror(errno));
            }
            *fd = f;
            rc = 0;
        }
    }
    return rc == -EAGAIN ? -EBUSY : rc;
}

/* hostlock_release — unlink the exclusive lock's file while still holding
 * it, then close every descriptor (no-op on an empty lock). */
void
hostlock_release(struct hostlock *hl)
{
    if (hl->n > 0 && hl->path[0])
        unlink(hl->path);
    while (hl->n > 0)
        close(hl->fds[--hl->n]);
    hl->path[0] = '\0';
}

/*
 * hostlock_take — take the locks of `kind` key `key`: for a path-like key
 * (`nested`: components separated by '/', as a cgroup subtree), every
 * ancestor shared and the key exclusive; otherwise the key alone.  `what`
 * names a held key in messages ("the cgroup subtree of a live shard").  0;
 * -EBUSY with the reason (naming the holder's pid when it is known) in why;
 * or another -errno with the reason.
 */
int
hostlock_take(struct hostlock *hl, const char *kind, const char *key, bool nested,
              const char *what, char *why, size_t whylen)
{
    size_t len = strlen(key);
    memset(hl, 0, sizeof(*hl));
    int rc = len ? lock_dir_check(why, whylen) : -EINVAL;
    if (!len)
        snprintf(why, whylen, "an empty %s name cannot be locked", kind);
    for (size_t end = 0; !rc && end < len; end++) {
        /* The next prefix that ends a component: an ancestor, or the key itself. */
        while (nested && end + 1 < len && key[end + 1] != '/')
            end++;
        if (!nested)
            end = len - 1;
        bool excl = end + 1 == len;
        char path[PATH_MAX];
        pid_t holder = 0;
        if (hl->n == LOCK_DEPTH) {
            rc = -ENAMETOOLONG;
            snprintf(why, whylen, "'%s' has more than %d levels", key, LOCK_DEPTH);
        } else if ((rc = lock_path(path, sizeof(path), kind, key, end + 1)) != 0) {
            snprintf(why, whylen, "'%s' is too long for a lock file name", key);
        } else if ((rc = lock_take(path, excl, &hl->fds[hl->n], &holder)) == 0) {
            hl->n++;
            if (excl)
                snprintf(hl->path, sizeof(hl->path), "%s", path);
        } else if (rc == -EBUSY) {
            char pid[48] = "";
            if (holder > 0)
                snprintf(pid, sizeof(pid), " (pid %d)", (int)holder);
            if (excl)
                snprintf(why, whylen, "'%s' is %s%s%s", key, what, pid,
                         nested ? ", or contains one" : "");
            else
                snprintf(why, whylen, "'%s' lies inside '%.*s', %s%s", key, (int)(end + 1), key,
                         what, pid);
        } else {
            snprintf(why, whylen, "cannot lock %s: %s", path, strerror(-rc));
        }
    }
    if (rc)
        hostlock_release(hl);
    return rc;
}

/*
 * uid_range_lock — hold host uids [*base, *base + count) for this shard
 * until hostlock_release(hl) (issue 16 item 10): two shards of one host on
 * overlapping ranges would run two tenants as one host uid, sharing per-uid
 * kernel accounting (RLIMIT_NPROC, SIGPENDING, inotify, mqueue bytes) and
 * the uid as a line of defence.  Ranges are files LOCK_DIR/uids.<first>-
 * <last>.lock, each held exclusively by its shard; LOCK_DIR/uids.lock,
 * held (waiting) only while one shard looks, makes look-and-take atomic.
 * A range file nobody holds is a dead shard's: removed.  With `pick`
 * (no --uid-base given) *base becomes the lowest UID_AUTO_BASE + k × count
 * overlapping no live range; otherwise an overlap refuses (-EBUSY, why
 * names the holder).  0 or -errno with why.
 */
#define UID_AUTO_BASE 1000000000ll
#define UID_LAST 4294967294ll /* (uid_t)-1 is "no uid" */

int
uid_range_lock(struct hostlock *hl, int64_t *base, int64_t count, bool pick, char *why,
               size_t whylen)
{
    memset(hl, 0, sizeof(*hl));
    int rc = lock_dir_check(why, whylen), gfd = -1;
    long long (*live)[2] = NULL;
    size_t nlive = 0;
    pid_t holder = 0;
    DIR *d = NULL;
    if (rc)
        goto out;
    if (count < 1 || (!pick && (*base < 1 || *base + count - 1 > UID_LAST))) {
        rc = -EINVAL;
        snprintf(why, whylen, "host uids %lld + %lld are not a range of valid uids",
                 (long long)*base, (long long)count);
        goto out;
    }
    gfd = open(LOCK_DIR "/uids.lock", O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (gfd < 0 || flock(gfd, LOCK_EX) != 0 || !(d = opendir(LOCK_DIR))) {
        rc = -errno;
        snprintf(why, whylen, "cannot lock the host's uid ranges in %s: %s", LOCK_DIR,
                 strerror(errno));
        goto out;
    }
    for (struct dirent *e; (e = readdir(d));) {
        long long lo, hi;
        int used = 0;
        if (sscanf(e->d_name, "uids.%lld-%lld.lock%n", &lo, &hi, &used) != 2 ||
            e->d_name[used] != '\0')
            continue;
        char path[PATH_MAX];
        snprintf(path, sizeof(path), "%s/%s", LOCK_DIR, e->d_name);
        int f = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (f < 0)
            continue;
        if (flock(f, LOCK_SH | LOCK_NB) == 0) {
            unlink(path); /* its shard is gone */
        } else if (errno == EWOULDBLOCK) {
            bool clash = !pick && lo <= *base + count - 1 && *base <= hi;
            if (clash && !rc) {
                holder = lock_holder(f);
                rc = -EBUSY;
                snprintf(why, whylen,
                         "host uids %lld-%lld overlap %lld-%lld of a live shard on this host "
                         "(pid %d)",
                         (long long)*base, (long long)(*base + count - 1), lo, hi, (int)holder);
            }
            live = sbx_xrealloc(live, (nlive + 1) * sizeof(*live));
            live[nlive][0] = lo;
            live[nlive++][1] = hi;
        }
        close(f);
    }
    for (int64_t k = 0; pick && !rc; k++) {
        int64_t b = UID_AUTO_BASE + k * count;
        if (b + count - 1 > UID_LAST) {
            rc = -ENOSPC;
            snprintf(why, whylen, "no free range of %lld host uids from %lld", (long long)count,
                     UID_AUTO_BASE);
            break;
        }
        bool free_range = true;
        for (size_t i = 0; i < nlive && free_range; i++)
            free_range = !(live[i][0] <= b + count - 1 && b <= live[i][1]);
        if (free_range) {
            *base = b;
            break;
        }
    }
    if (!rc) {
        char key[48];
        snprintf(key, sizeof(key), "%lld-%lld", (long long)*base, (long long)(*base + count - 1));
        if ((rc = lock_path(hl->path, sizeof(hl->path), "uids", key, strlen(key))) == 0 &&
            (rc = lock_take(hl->path, true, &hl->fds[0], &holder)) == 0)
            hl->n = 1;
        else
            snprintf(why, whylen, "cannot lock host uids %s: %s", key, strerror(-rc));
    }
out:
    if (d)
        closedir(d);
    if (gfd >= 0)
        close(gfd);
    free(live);
    if (rc)
        hl->path[0] = '\0';
    return rc;
}
