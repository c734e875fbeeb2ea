/*
 * files_int.h — internals shared by the file-API files of sbx-agent (the
 * rest of the agent uses agent.h; the fuzz target tests/fuzz/fuzz_path.c
 * reaches the pure parts through this header):
 *
 *   files.c        path safety: arguments made absolute, openat2 without
 *                  magic links, the file-system and type checks;
 *   files_mime.c   the MIME type and text/binary decision of file.read;
 *   files_rw.c     file.write, file.read, file.readStream, mkdir, delete,
 *                  rename, exists, list;
 *   files_watch.c  file.watch: inotify events as a lossless stream;
 *   files_git.c    git.checkout.
 *
 * Everything runs on the agent's one loop thread.  Watches are owned by
 * a->watches (freed by agent_watches_free); every other operation holds
 * its state only while it runs.
 */
#ifndef SBX_AGENT_FILES_INT_H
#define SBX_AGENT_FILES_INT_H
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/json.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define READ_CAP (32u << 20) /* readFile limit, as the SDK's */
#define CHUNK (64u << 10)    /* readFileStream chunk */
#define LIST_MAX 100000
#define LIST_MAX_BYTES (32u << 20) /* encoded FileInfo entries in one listing */
#define LIST_MAX_DEPTH 64          /* directory levels a recursive listing enters */
#define PATH_MAX_BYTES 4096

struct wdir {
    int wd;
    char *path;
};

/* A watch: file.watch's (st: its stream) or file.checkChanges's retained
 * change state (st NULL: events only advance `cursor`). */
struct watch {
    struct watch *next;
    struct agent *a;
    struct stream *st;        /* file.watch's stream (a reference), or NULL */
    char *key;                /* checkChanges: root + options, what a call matches on */
    char id[64];              /* checkChanges: "watch-<n>-<instance>" (the version's prefix) */
    uint64_t cursor;          /* checkChanges: events seen so far */
    int64_t used_ms;          /* checkChanges: last call (monotonic), for the idle TTL */
    int fd;
    sbx_watch *w;
    bool recursive;
    char **include, **exclude;
    struct wdir *dirs;
    size_t ndirs, capdirs;
    char root[PATH_MAX_BYTES];
};


/* files.c */
int files_bool_arg(struct agent *a, struct agent_req *r, const msgpack_object *map, const char *key,
                   bool *out);
int files_path_arg(struct agent *a, struct agent_req *r, const char *key, char *out);
bool files_forbidden_fs(int fd);
int files_openat2_nomagic(const char *path, int flags, mode_t mode);
int files_safe_open(const char *path, int flags, mode_t mode, bool want_dir);
void files_reply_path_err(struct agent *a, struct agent_req *r, int rc, const char *op,
                          const char *path);
int files_make_parents(const char *path);

/* files_mime.c */
const char *files_mime_of(const char *path, const unsigned char *head, size_t n, bool *binary);

/* files_watch.c */
char **files_patterns(const msgpack_object *args, const char *key, bool *bad);
bool files_matches_any(char **pats, const char *rel);
bool files_wanted(struct watch *w, const char *full);

#endif
