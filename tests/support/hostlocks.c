/*
 * hostlocks.c — remove the unheld host-lock files of a test's deployment
 * (hostlocks.h).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "hostlocks.h"

#define HOSTLOCK_DIR "/run/sbx"

int
test_hostlocks_sweep(const char *name)
{
    if (!name || !name[0])
        return -EINVAL;
    DIR *d = opendir(HOSTLOCK_DIR);
    if (!d)
        return -errno;
    int removed = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        size_t n = strlen(de->d_name);
        if (n < 6 || strcmp(de->d_name + n - 5, ".lock") != 0 || !strstr(de->d_name, name))
            continue;
        char path[sizeof(HOSTLOCK_DIR) + 256 + 2];
        snprintf(path, sizeof(path), "%s/%s", HOSTLOCK_DIR, de->d_name);
        int fd = open(path, O_RDWR | O_CLOEXEC | O_NOFOLLOW);
        if (fd < 0)
            continue;
        if (flock(fd, LOCK_EX | LOCK_NB) == 0 && unlink(path) == 0)
            removed++;
        close(fd); /* the lock goes with it */
    }
    closedir(d);
    return removed;
}
