/*
 * image_user.c — an image config's User as the ids its commands run as
 * (docs/images.md, "User").
 *
 * image-spec config.md, `User`: "user, uid, user:group, uid:gid, uid:group,
 * user:gid"; a name is looked up in the container's /etc/passwd or
 * /etc/group, and "if group/gid is not specified, the default group … of
 * the given user/uid in /etc/passwd … are applied" (gid 0 for a uid that has
 * no entry, as Docker and runc do).  sbx_image_user_extras adds what runc
 * adds (libcontainer/user GetExecUser): the user's HOME from its passwd
 * line, and when User names no group, the supplementary groups of
 * /etc/group that list the user by name.
 *
 * The files are read from the image's layers on the host, top layer first:
 * the first layer that has etc/<file> (a regular file, reached without
 * following any symbolic link) or a whiteout of it decides.  A symbolic
 * link there counts as no file: nothing of a layer is followed on the host.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/util.h"
#include "image_store.h"

/* The most bytes of /etc/passwd or /etc/group read. */
#define USER_FILE_MAX (1 << 20)

/* The top layer's etc/<name> as a heap string, or NULL (none, or not a
 * regular file). */
static char *
layer_etc_file(char *const *layers, int nlayers, const char *name)
{
    for (int i = nlayers - 1; i >= 0; i--) {
        _cleanup_close_ int etc = open(layers[i], O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (etc < 0)
            continue;
        _cleanup_close_ int d = openat(etc, "etc", O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (d < 0)
            continue;
        struct stat st;
        if (fstatat(d, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue;
        if (!S_ISREG(st.st_mode))
            return NULL; /* a whiteout (0/0 character device), a link, … */
        _cleanup_close_ int f = openat(d, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        if (f < 0)
            return NULL;
        char *buf = sbx_xmalloc(USER_FILE_MAX + 1);
        size_t n = 0;
        ssize_t k;
        while (n < USER_FILE_MAX && (k = read(f, buf + n, USER_FILE_MAX - n)) > 0)
            n += (size_t)k;
        buf[n] = '\0';
        return buf;
    }
    return NULL;
}

/* A decimal id (no sign, no blanks, below 2^32 - 1). */
static bool
parse_id(const char *s, uint32_t *out)
{
    if (!*s || strspn(s, "0123456789") != strlen(s) || strlen(s) > 10)
        return false;
    unsigned long long v = strtoull(s, NULL, 10);
    if (v >= 0xffffffffULL)
        return false;
    *out = (uint32_t)v;
    return true;
}

/* Find the line of file whose field 0 is name (by_name) or field 2 is the
 * id; *id and, for passwd, *gid from it.  True when found. */
static bool
lookup(const char *file, const char *name, uint32_t want, bool by_name, uint32_t *id,
       uint32_t *gid)
{
    if (!file)
        return false;
    const char *p = file;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (len < sizeof(line)) {
            memcpy(line, p, len);
            line[len] = '\0';
            char *f[4] = {NULL};
            char *s = line;
            /* name:passwd:id:gid… (strsep keeps empty fields). */
            for (int k = 0; k < 4; k++)
                f[k] = strsep(&s, ":");
            uint32_t v, g = 0;
            if (f[0] && f[2] && parse_id(f[2], &v) &&
                (by_name ? !strcmp(f[0], name) : v == want)) {
                *id = v;
                if (gid)
                    *gid = f[3] && parse_id(f[3], &g) ? g : 0;
                return true;
            }
        }
        p += len + (eol ? 1 : 0);
    }
    return false;
}

int
sbx_image_user_resolve(char *const *layers, int nlayers, const char *user, uint32_t *uid,
                       uint32_t *gid, sbx_err_t *err)
{
    *uid = *gid = 0;
    if (!user || !user[0])
        return 0;
    char u[256];
    if (strlen(user) >= sizeof(u))
        return sbx_err_make(err, SBX_E_IMAGE_INVALID, "the image's User is too long");
    snprintf(u, sizeof(u), "%s", user);
    char *grp = strchr(u, ':');
    if (grp)
        *grp++ = '\0';
    _cleanup_free_ char *passwd = layer_etc_file(layers, nlayers, "passwd");
    uint32_t pgid = 0;
    if (parse_id(u, uid)) {
        lookup(passwd, NULL, *uid, false, uid, &pgid); /* its primary group, if listed */
    } else if (!lookup(passwd, u, 0, true, uid, &pgid)) {
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "the image's User '%s': no user '%s' in its /etc/passwd", user, u);
    }
    if (!grp || !grp[0]) {
        *gid = pgid;
        return 0;
    }
    if (parse_id(grp, gid))
        return 0;
    _cleanup_free_ char *group = layer_etc_file(layers, nlayers, "group");
    if (!lookup(group, grp, 0, true, gid, NULL))
        return sbx_err_make(err, SBX_E_IMAGE_INVALID,
                            "the image's User '%s': no group '%s' in its /etc/group", user, grp);
    return 0;
}

/* The passwd line of uid: its name and home into name[nl] and home[hl]
 * (""  when it has none).  True when found. */
static bool
passwd_of(const char *file, uint32_t uid, char *name, size_t nl, char *home, size_t hl)
{
    for (const char *p = file; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[1024];
        if (len < sizeof(line)) {
            memcpy(line, p, len);
            line[len] = '\0';
            char *f[7] = {NULL};
            char *s = line;
            for (int k = 0; k < 7; k++)
                f[k] = strsep(&s, ":");
            uint32_t v;
            if (f[0] && f[2] && parse_id(f[2], &v) && v == uid) {
                snprintf(name, nl, "%s", f[0]);
                snprintf(home, hl, "%s", f[5] ? f[5] : "");
                return true;
            }
        }
        p += len + (eol ? 1 : 0);
    }
    return false;
}

int
sbx_image_user_extras(char *const *layers, int nlayers, const char *user, uint32_t uid,
                      uint32_t gid, char **home, uint32_t *groups, int *ngroups)
{
    *home = NULL;
    *ngroups = 0;
    if (!user || !user[0])
        return 0;
    _cleanup_free_ char *passwd = layer_etc_file(layers, nlayers, "passwd");
    char name[256] = "", dir[512] = "";
    if (!passwd_of(passwd, uid, name, sizeof(name), dir, sizeof(dir)))
        return 0; /* a uid the image does not list: no home, no groups (runc: the same) */
    if (dir[0] == '/')
        *home = sbx_xstrdup(dir);
    if (strchr(user, ':'))
        return 0; /* an explicit group: that one only (runc) */
    _cleanup_free_ char *group = layer_etc_file(layers, nlayers, "group");
    int skipped = 0;
    for (const char *p = group; p && *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) : strlen(p);
        char line[4096];
        if (len < sizeof(line)) {
            memcpy(line, p, len);
            line[len] = '\0';
            char *f[4] = {NULL};
            char *s = line;
            for (int k = 0; k < 4; k++)
                f[k] = strsep(&s, ":");
            uint32_t g;
            bool member = false;
            for (char *m = f[3], *tok; m && (tok = strsep(&m, ","));)
                member |= !strcmp(tok, name);
            bool dup = false;
            if (member && f[2] && parse_id(f[2], &g) && g != gid) {
                for (int k = 0; k < *ngroups; k++)
                    dup |= groups[k] == g;
                if (!dup && *ngroups < SBX_IMAGE_MAX_GROUPS)
                    groups[(*ngroups)++] = g;
                else if (!dup)
                    skipped++;
            }
        }
        p += len + (eol ? 1 : 0);
    }
    return skipped;
}
