/*
 * files_watch.c — file.watch: inotify(7) events of a directory (recursive
 * on request, with include/exclude globs) as a lossless stream.  Called by
 * main.c's dispatch on the loop thread; a watch (struct watch, files_int.h)
 * is on a->watches, owned there, and ends when its stream is cancelled or
 * the agent frees it (agent_watches_free).
 */
#include "files_int.h"
/* ------------------------------------------------------------------------------ */
/* watch: inotify(7) events as a lossless stream. */
char **
files_patterns(const msgpack_object *args, const char *key, bool *bad)
{
    const msgpack_object *arr = NULL;
    int rc = sbx_wire_get_array(args, key, &arr);
    if (rc == -ENOENT)
        return NULL;
    if (rc || arr->via.array.size > 256) {
        *bad = true;
        return NULL;
    }
    char **v = sbx_xcalloc(arr->via.array.size + 1, sizeof(char *));
    for (uint32_t i = 0; i < arr->via.array.size; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&arr->via.array.ptr[i], &s) != 0 || s.n == 0 || s.n > 512) {
            *bad = true;
            v[i] = NULL;
            agent_env_free(v);
            return NULL;
        }
        v[i] = sbx_str_dup(s);
    }
    return v;
}

/* A pattern matches a path if it matches the whole relative path or any
 * of its components (fnmatch(3) globs: "*.log", ".git", "src/x.c"). */
bool
files_matches_any(char **pats, const char *rel)
{
    bool hit = false;
    for (char **p = pats; p && *p && !hit; p++) {
        if (fnmatch(*p, rel, 0) == 0) {
            hit = true;
            break;
        }
        char *tmp = sbx_xstrdup(rel); /* whole: a path may be deeper than PATH_MAX */
        char *save, *tok;
        for (tok = strtok_r(tmp, "/", &save); tok && !hit; tok = strtok_r(NULL, "/", &save))
            hit = fnmatch(*p, tok, 0) == 0;
        free(tmp);
    }
    return hit;
}

/* rel_path — `full` (a path under the watch's root) relative to the root,
 * without a leading '/': "" for the root itself.  Works for root "/" too. */
static const char *
rel_path(const struct watch *w, const char *full)
{
    const char *rel = full + strlen(w->root);
    while (*rel == '/')
        rel++;
    return rel;
}

bool
files_wanted(struct watch *w, const char *full)
{
    const char *rel = rel_path(w, full);
    if (!*rel)
        return true;
    if (w->exclude && files_matches_any(w->exclude, rel))
        return false;
    if (w->include && !files_matches_any(w->include, rel))
        return false;
    return true;
}

/*
 * Watch the directory open at `dfd` (taken over: closed here), whose path is
 * `path`, and with `recursive` its subdirectories.  As list_dir: the watch
 * is put on the checked fd itself (inotify_add_watch follows our own
 * /proc/self/fd/N to that directory) and subdirectories are opened relative
 * to it with O_NOFOLLOW and skipped on forbidden file systems, so a tenant
 * swapping a directory for a symlink mid-walk cannot make the agent watch
 * procfs (tests/security/test_escape.c file_api_survives_a_symlink_swap_race).
 */
static void
add_dir_fd(struct watch *w, int dfd, const char *path, int depth)
{
    char self[64];
    snprintf(self, sizeof(self), "/proc/self/fd/%d", dfd);
    int wd = inotify_add_watch(w->fd, self,
                               IN_CREATE | IN_MODIFY | IN_CLOSE_WRITE | IN_DELETE | IN_MOVED_FROM |
                                   IN_MOVED_TO | IN_ATTRIB | IN_DELETE_SELF | IN_ONLYDIR);
    if (wd < 0) {
        close(dfd);
        return;
    }
    if (w->ndirs == w->capdirs) {
        w->capdirs = w->capdirs ? w->capdirs * 2 : 16;
        w->dirs = sbx_xrealloc(w->dirs, w->capdirs * sizeof(*w->dirs));
    }
    w->dirs[w->ndirs].wd = wd;
    w->dirs[w->ndirs].path = sbx_xstrdup(path);
    w->ndirs++;
    if (!w->recursive || depth > 32) {
        close(dfd);
        return;
    }
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (de->d_type != DT_DIR || !strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        /* On the heap: a tree deeper than PATH_MAX keeps whole paths. */
        sbx_buf sub;
        sbx_buf_init(&sub);
        sbx_buf_appendf(&sub, "%s/%s", strcmp(path, "/") ? path : "", de->d_name);
        if (w->exclude && files_matches_any(w->exclude, rel_path(w, sub.p))) {
            sbx_buf_free(&sub);
            continue;
        }
        int sfd = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sfd >= 0 && files_forbidden_fs(sfd))
            close(sfd);
        else if (sfd >= 0)
            add_dir_fd(w, sfd, sub.p, depth + 1);
        sbx_buf_free(&sub);
    }
    closedir(d);
}

/* A directory that appeared under the watch, resolved like any path. */
static void
add_dir(struct watch *w, const char *path, int depth)
{
    int dfd = files_safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (dfd >= 0)
        add_dir_fd(w, dfd, path, depth);
}

static const char *
dir_of(struct watch *w, int wd)
{
    for (size_t i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd)
            return w->dirs[i].path;
    return NULL;
}

static void
watch_free(struct watch *w)
{
    struct agent *a = w->a;
    for (struct watch **pp = &a->watches; *pp; pp = &(*pp)->next) {
        if (*pp == w) {
            *pp = w->next;
            break;
        }
    }
    if (w->w)
        sbx_loop_unwatch(a->loop, w->w);
    close(w->fd);
    for (size_t i = 0; i < w->ndirs; i++)
        free(w->dirs[i].path);
    free(w->dirs);
    agent_env_free(w->include);
    agent_env_free(w->exclude);
    free(w);
}

static void
watch_stop(struct watch *w, const char *reason)
{
    sbx_enc *e = stream_begin(w->st, "stopped");
    sbx_enc_kstr(e, "reason", reason);
    stream_commit(w->st, true);
    w->st->ops = NULL;
    stream_unref(w->st);
    watch_free(w);
}

static void
watch_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    struct watch *w = arg;
    char buf[16384] __attribute__((aligned(__alignof__(struct inotify_event))));
    (void)l;
    (void)ev;
    for (;;) {
        if (stream_full(w->st)) {
            /* The reader is behind: leave events in the kernel's queue. */
            w->st->paused = true;
            sbx_loop_modify(w->a->loop, w->w, 0);
            return;
        }
        ssize_t n = read(fd, buf, sizeof(buf));
        if (n <= 0)
            return;
        for (char *p = buf; p < buf + n;) {
            struct inotify_event *ie = (struct inotify_event *)p;
            p += sizeof(*ie) + ie->len;
            if (ie->mask & IN_Q_OVERFLOW) {
                sbx_enc *e = stream_begin(w->st, "error");
                sbx_enc_kstr(e, "error", "inotify queue overflow: events were lost");
                stream_commit(w->st, false);
                continue;
            }
            const char *dir = dir_of(w, ie->wd);
            if (!dir)
                continue;
            if ((ie->mask & IN_DELETE_SELF) && !strcmp(dir, w->root)) {
                watch_stop(w, "the watched path was deleted");
                return;
            }
            if (!ie->len)
                continue;
            /* On the heap: events deeper than PATH_MAX keep whole paths
             * (add_dir cannot open such a directory by path: the kernel
             * refuses it, so it is not watched). */
            sbx_buf fb;
            sbx_buf_init(&fb);
            sbx_buf_appendf(&fb, "%s/%s", strcmp(dir, "/") ? dir : "", ie->name);
            const char *full = fb.p;
            bool isdir = ie->mask & IN_ISDIR;
            if (isdir && (ie->mask & (IN_CREATE | IN_MOVED_TO)) && w->recursive)
                add_dir(w, full, 1);
            if (!files_wanted(w, full)) {
                sbx_buf_free(&fb);
                continue;
            }
            const char *type = (ie->mask & IN_CREATE)        ? "create"
                               : (ie->mask & IN_DELETE)      ? "delete"
                               : (ie->mask & IN_MOVED_FROM)  ? "move_from"
                               : (ie->mask & IN_MOVED_TO)    ? "move_to"
                               : (ie->mask & IN_ATTRIB)      ? "attrib"
                               : (ie->mask & IN_CLOSE_WRITE) ? "modify"
                               : (ie->mask & IN_MODIFY)      ? "modify"
                                                             : NULL;
            if (type) {
                sbx_enc *e = stream_begin(w->st, "event");
                sbx_enc_kstr(e, "eventType", type);
                sbx_enc_kstr(e, "path", full);
                sbx_enc_kbool(e, "isDirectory", isdir);
                stream_commit(w->st, false);
            }
            sbx_buf_free(&fb);
        }
    }
}

static void
watch_resume(struct stream *st, void *arg)
{
    struct watch *w = arg;
    (void)st;
    sbx_loop_modify(w->a->loop, w->w, EPOLLIN);
}

static void
watch_cancel(struct stream *st, void *arg)
{
    (void)st;
    watch_stop(arg, "cancelled");
}

static const struct stream_ops watch_ops = {watch_resume, watch_cancel};

void
agent_op_file_watch(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES], sid[72];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    bool recursive = true;
    if (files_bool_arg(a, r, r->args, "recursive", &recursive) != 0)
        return;
    int dfd = files_safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (dfd < 0) {
        files_reply_path_err(a, r, dfd, "watch", path);
        return;
    }
    bool bad = false;
    struct watch *w = sbx_xcalloc(1, sizeof(*w));
    w->a = a;
    w->recursive = recursive;
    w->include = files_patterns(r->args, "include", &bad);
    w->exclude = files_patterns(r->args, "exclude", &bad);
    if (!bad && w->include && w->exclude) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_VALIDATION, "'include' and 'exclude' cannot be combined");
        return;
    }
    if (bad) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_VALIDATION, "'include' and 'exclude' are arrays of glob strings");
        return;
    }
    if (!w->include && !w->exclude && !sbx_wire_get(r->args, "exclude")) {
        static const char *const defaults[] = {".git", "node_modules", ".DS_Store", NULL};
        w->exclude = sbx_xcalloc(4, sizeof(char *));
        for (int i = 0; defaults[i]; i++)
            w->exclude[i] = sbx_xstrdup(defaults[i]);
    }
    snprintf(w->root, sizeof(w->root), "%s", path);
    size_t rl = strlen(w->root);
    while (rl > 1 && w->root[rl - 1] == '/')
        w->root[--rl] = '\0';
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_WATCH_START, "inotify_init1: %s", strerror(errno));
        return;
    }
    add_dir_fd(w, dfd, w->root, 0); /* the checked fd, not the path again */
    snprintf(sid, sizeof(sid), "watch-%llu", (unsigned long long)++a->stream_ctr);
    w->st = stream_new(a, sid, true, 1u << 20, &watch_ops, w);
    w->w = sbx_loop_watch(a->loop, w->fd, EPOLLIN, watch_cb, w);
    w->next = a->watches;
    a->watches = w;
    sbx_enc *e = stream_begin(w->st, "watching");
    sbx_enc_kstr(e, "path", w->root);
    sbx_enc_kstr(e, "watchId", sid);
    stream_commit(w->st, false);
    /* Answer after the watch is in place: no event after this is missed. */
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kstr(&res, "streamId", sid);
    sbx_enc_kstr(&res, "watchId", sid);
    sbx_enc_kstr(&res, "path", w->root);
    sbx_enc_kint(&res, "directories", (int64_t)w->ndirs);
    agent_reply_ok(a, r, &res);
}

void
agent_watches_free(struct agent *a)
{
    while (a->watches) {
        struct watch *w = a->watches;
        w->st->ops = NULL;
        stream_unref(w->st);
        watch_free(w);
    }
}
