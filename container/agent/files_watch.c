/*
 * files_watch.c — file.watch: inotify(7) events of a directory (recursive
 * on request, with include/exclude globs) as a lossless stream; and
 * file.checkChanges: the same watch kept without a stream, whose count of
 * events is the version a poller compares.  Called by main.c's dispatch on
 * the loop thread; a watch (struct watch, files_int.h) is on a->watches,
 * owned there, and ends when its stream is cancelled, when (checkChanges)
 * it was not asked about for CHANGES_TTL_MS, or when the agent frees it
 * (agent_watches_free).
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
    if (w->fd >= 0)
        close(w->fd);
    for (size_t i = 0; i < w->ndirs; i++)
        free(w->dirs[i].path);
    free(w->dirs);
    agent_env_free(w->include);
    agent_env_free(w->exclude);
    free(w->key);
    free(w);
}

static void
watch_stop(struct watch *w, const char *reason)
{
    if (!w->st) {
        /* A change state: dropped; the next checkChanges makes a new one
         * (and answers resync, reason expired). */
        watch_free(w);
        return;
    }
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
        if (w->st && stream_full(w->st)) {
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
            if ((ie->mask & IN_Q_OVERFLOW) && !w->st) {
                w->cursor++; /* events were lost: something changed */
                continue;
            }
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
            if (type && !w->st) {
                w->cursor++;
            } else if (type) {
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

/*
 * watch_new — a watch of the directory `path` with the request's options
 * (recursive, include, exclude), not yet in place (watch_arm does that) and
 * not on a->watches; *dfdp is the checked directory fd to arm it on.  NULL
 * after replying the error.
 */
static struct watch *
watch_new(struct agent *a, struct agent_req *r, const char *path, int *dfdp)
{
    bool recursive = true;
    if (files_bool_arg(a, r, r->args, "recursive", &recursive) != 0)
        return NULL;
    int dfd = files_safe_open(path, O_RDONLY | O_DIRECTORY, 0, true);
    if (dfd < 0) {
        files_reply_path_err(a, r, dfd, "watch", path);
        return NULL;
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
        return NULL;
    }
    if (bad) {
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w);
        close(dfd);
        agent_reply_err(a, r, SBX_E_VALIDATION, "'include' and 'exclude' are arrays of glob strings");
        return NULL;
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
    w->fd = -1;
    *dfdp = dfd;
    return w;
}

/* watch_arm — put the watch made by watch_new in place on the checked fd
 * `dfd` (taken over) and on a->watches; -1 after replying the error (the
 * watch is freed). */
static int
watch_arm(struct agent *a, struct agent_req *r, struct watch *w, int dfd)
{
    w->fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    if (w->fd < 0) {
        agent_reply_err(a, r, SBX_E_WATCH_START, "inotify_init1: %s", strerror(errno));
        agent_env_free(w->include);
        agent_env_free(w->exclude);
        free(w->key);
        free(w);
        close(dfd);
        return -1;
    }
    add_dir_fd(w, dfd, w->root, 0); /* the checked fd, not the path again */
    w->w = sbx_loop_watch(a->loop, w->fd, EPOLLIN, watch_cb, w);
    w->next = a->watches;
    a->watches = w;
    return 0;
}

void
agent_op_file_watch(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES], sid[72];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    int dfd = -1;
    struct watch *w = watch_new(a, r, path, &dfd);
    if (!w)
        return;
    if (watch_arm(a, r, w, dfd) != 0)
        return;
    /* watch_cb runs on this thread, after we return: no event is lost. */
    snprintf(sid, sizeof(sid), "watch-%llu", (unsigned long long)++a->stream_ctr);
    w->st = stream_new(a, sid, true, 1u << 20, &watch_ops, w);
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
        if (w->st) {
            w->st->ops = NULL;
            stream_unref(w->st);
        }
        watch_free(w);
    }
}

/* ------------------------------------------------------------------------------ */
/* file.checkChanges: polling instead of a stream (the Cloudflare SDK's
 * checkChanges, cloudflare-sandbox-sdk.md §1.3; its watch-service.ts). */

#define CHANGES_TTL_MS (10 * 60 * 1000) /* a state not asked about this long is dropped (SDK) */
#define CHANGES_MAX 64                  /* states per container; past it the least recently
                                         * asked about is dropped (its pollers resync) */

/* The key a call matches a state on: root and options, as the SDK's. */
static char *
changes_key(const struct watch *w)
{
    sbx_buf b;
    sbx_buf_init(&b);
    sbx_buf_append(&b, w->root, strlen(w->root) + 1); /* NULs separate the parts */
    sbx_buf_append(&b, w->recursive ? "r" : "-", 1);
    for (char **p = w->include; p && *p; p++) {
        sbx_buf_append(&b, "\0i", 2);
        sbx_buf_append(&b, *p, strlen(*p));
    }
    for (char **p = w->exclude; p && *p; p++) {
        sbx_buf_append(&b, "\0e", 2);
        sbx_buf_append(&b, *p, strlen(*p));
    }
    /* Hex-encoded, so the key is one C string. */
    char *k = sbx_xmalloc(b.len * 2 + 1);
    for (size_t i = 0; i < b.len; i++)
        snprintf(k + 2 * i, 3, "%02x", (unsigned char)b.p[i]);
    k[b.len * 2] = 0;
    sbx_buf_free(&b);
    return k;
}

/* Drop the states not asked about for CHANGES_TTL_MS; if `room`, also the
 * least recently asked about ones past CHANGES_MAX - 1. */
static void
changes_sweep(struct agent *a, bool room)
{
    int64_t now = sbx_mono_ms();
    size_t n = 0;
    for (struct watch *w = a->watches, *next; w; w = next) {
        next = w->next;
        if (!w->key)
            continue;
        if (now - w->used_ms >= CHANGES_TTL_MS)
            watch_free(w);
        else
            n++;
    }
    while (room && n >= CHANGES_MAX) {
        struct watch *old = NULL;
        for (struct watch *w = a->watches; w; w = w->next)
            if (w->key && (!old || w->used_ms < old->used_ms))
                old = w;
        watch_free(old);
        n--;
    }
}

/*
 * A version is "<id>:<cursor>", id "watch-<n>-<instance>" (the SDK's look):
 * parse `since` into its id and cursor; -1 when it has no ':' or the cursor
 * is not a decimal number (VALIDATION_FAILED, as the SDK).
 */
static int
parse_version(sbx_str since, sbx_str *id, uint64_t *cursor)
{
    size_t colon = since.n;
    for (size_t i = since.n; i-- > 0;)
        if (since.p[i] == ':') {
            colon = i;
            break;
        }
    if (colon == since.n || colon == 0 || colon + 1 == since.n || since.n - colon - 1 > 19)
        return -1;
    uint64_t v = 0;
    for (size_t i = colon + 1; i < since.n; i++) {
        if (since.p[i] < '0' || since.p[i] > '9')
            return -1;
        v = v * 10 + (uint64_t)(since.p[i] - '0');
    }
    *id = (sbx_str){since.p, colon};
    *cursor = v;
    return 0;
}

/* Whether a state id was made by this container: "watch-<n>-<our instance>". */
static bool
made_here(const struct agent *a, sbx_str id)
{
    char tail[32];
    int tn = snprintf(tail, sizeof(tail), "-%llu", (unsigned long long)a->instance);
    return id.n > 6 + (size_t)tn && !memcmp(id.p, "watch-", 6) &&
           !memcmp(id.p + id.n - (size_t)tn, tail, (size_t)tn);
}

void
agent_op_file_check_changes(struct agent *a, struct agent_req *r)
{
    char path[PATH_MAX_BYTES];
    if (files_path_arg(a, r, "path", path) != 0)
        return;
    sbx_str since = {NULL, 0}, sid = {NULL, 0};
    uint64_t scur = 0;
    int src = sbx_wire_get_str(r->args, "since", &since);
    if (src == SBX_E_VALIDATION || (src == 0 && parse_version(since, &sid, &scur) != 0)) {
        agent_reply_err(a, r, SBX_E_VALIDATION,
                        "since must be a version returned by checkChanges() (\"<id>:<n>\")");
        return;
    }
    int dfd = -1;
    struct watch *w = watch_new(a, r, path, &dfd);
    if (!w)
        return;
    w->key = changes_key(w);
    changes_sweep(a, false);
    struct watch *cur = NULL;
    for (struct watch *x = a->watches; x && !cur; x = x->next)
        if (x->key && !strcmp(x->key, w->key))
            cur = x;
    if (cur) {
        watch_free(w); /* not armed, not listed */
        close(dfd);
    } else {
        changes_sweep(a, true);
        if (!a->instance) {
            while (a->instance == 0 && sbx_random(&a->instance, sizeof(a->instance)) == 0)
                a->instance &= (1ull << 53) - 1; /* an exact JSON number */
            if (!a->instance)
                a->instance = (uint64_t)sbx_wall_ms();
        }
        snprintf(w->id, sizeof(w->id), "watch-%llu-%llu", (unsigned long long)++a->changes_ctr,
                 (unsigned long long)a->instance);
        if (watch_arm(a, r, w, dfd) != 0)
            return;
        cur = w;
    }
    cur->used_ms = sbx_mono_ms();
    /* Events already queued by the kernel count before we answer (a write
     * the caller made just before asking is seen).  That may end the state
     * (its root was deleted: watch_stop freed it). */
    watch_cb(a->loop, cur->fd, EPOLLIN, cur);
    bool alive = false;
    for (struct watch *x = a->watches; x && !alive; x = x->next)
        alive = x == cur;
    if (!alive) {
        agent_reply_err(a, r, SBX_E_FILE_NOT_FOUND, "'%s' was deleted", path);
        return;
    }
    const char *status = "unchanged", *reason = NULL;
    if (sid.p) {
        bool ours = sid.n == strlen(cur->id) && !memcmp(sid.p, cur->id, sid.n);
        if (ours && scur > cur->cursor) {
            agent_reply_err(a, r, SBX_E_VALIDATION,
                            "since refers to a newer version than the current state (%s:%llu)",
                            cur->id, (unsigned long long)cur->cursor);
            return;
        }
        if (ours)
            status = scur == cur->cursor ? "unchanged" : "changed";
        else {
            status = "resync";
            reason = made_here(a, sid) ? "expired" : "restarted";
        }
    }
    char version[96], ts[40];
    snprintf(version, sizeof(version), "%s:%llu", cur->id, (unsigned long long)cur->cursor);
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc res;
    sbx_enc_init(&res);
    sbx_enc_map(&res);
    sbx_enc_kbool(&res, "success", true);
    sbx_enc_kstr(&res, "status", status);
    if (reason)
        sbx_enc_kstr(&res, "reason", reason);
    sbx_enc_kstr(&res, "version", version);
    sbx_enc_kstr(&res, "timestamp", ts);
    agent_reply_ok(a, r, &res);
}
