/*
 * backups.c — backup.create / restore / list / delete
 * (runtime/ops/backups.yaml; docs/persistence.md, "Backups").
 *
 * create and restore are actor ops: the sandbox's container is started if
 * it is not running (its agent's namespaces are where the archive is made
 * or extracted: container/backup.c), then the archive is made or checked
 * and extracted on a thread of its own (struct bk_job) while the actor's
 * input gate stays closed.  list and delete are node ops on the store,
 * answered on the loop thread (a directory scan of small index files).
 *
 * With an S3 store (sh->s3, container/backup_s3.h) the archive is still
 * made in, or downloaded to, a file of the local directory's tmp/, and
 * every call to the store runs off the loop thread: restore looks the
 * backup up on its job's thread (after the container is started), list
 * and delete run on a thread of their own (struct bk_node_job).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../container/backup.h"
#include "../container/backup_s3.h"
#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "../runtime/wire.h"
#include "shard_int.h"

/* A directory argument: absolute, no ".." component, no NUL, ≤ 4095 bytes.
 * The sandbox's root bounds it anyway; this makes the intent an error. */
static int
get_dir(struct sop *op, char *out, size_t outlen)
{
    sbx_str d;
    if (sbx_wire_get_str(op->req.args, "dir", &d) != 0 || d.n == 0 || d.n >= outlen ||
        d.p[0] != '/' || memchr(d.p, '\0', d.n)) {
        shard_reply_err(op, SBX_E_VALIDATION, "'dir' must be an absolute path in the sandbox");
        return -1;
    }
    memcpy(out, d.p, d.n);
    out[d.n] = '\0';
    for (char *s = out; (s = strstr(s, "..")); s += 2)
        if (s[-1] == '/' && (s[2] == '/' || s[2] == '\0')) {
            shard_reply_err(op, SBX_E_VALIDATION, "'dir' must not have a '..' component");
            return -1;
        }
    return 0;
}

static void
reply_error(struct sop *op, int code, sbx_err_t err)
{
    shard_reply_err(op, code, "%s", sbx_err_msg(err));
}

/* A create or restore running on a thread of its own (bk_thread), with the
 * actor's input gate closed on op (so its container is neither stopped for
 * idleness nor handed off meanwhile: actor_container.c, actor_handoff.c).
 * Owned by the thread, then by bk_done on the loop thread, which frees it. */
struct bk_job {
    struct actor *a;
    struct sop *op;
    bool restore;
    struct sbx_backup_ns ns;
    char dir[4096];
    char **pats;                 /* create: excludes, NULL-terminated (owned) */
    size_t nex;
    bool gitignore;              /* create: leave out what git's ignore files name */
    int fd;                      /* create: the new archive; restore: the blob */
    char tmp[4200];              /* create: the new archive's path in the store's tmp/ */
    int64_t ttl;                 /* create: seconds */
    struct sbx_backup_info info; /* create: filled; restore: the store's entry */
    int code;                    /* 0 or the error's code */
    char *msg;                   /* the error's message (owned) */
    int64_t ms;                  /* how long the archive took */
    char sandbox[80];            /* restore: the target sandbox's ID (its note in restoring/) */
    char tenant[20];             /* restore from S3: the caller's tenant (sop.tenant) … */
    bool tenant_set;             /* … if stamped: another tenant's backup is unknown */
};

static bool tenant_of(const char *sandbox, sbx_str owner);

static void
job_free(struct bk_job *j)
{
    sbx_backup_ns_close(&j->ns);
    if (j->fd >= 0)
        close(j->fd);
    sbx_cleanup_strv_(&j->pats);
    free(j->msg);
    free(j);
}

static void
job_fail(struct bk_job *j, int code, sbx_err_t err)
{
    j->code = code;
    j->msg = sbx_xstrdup(sbx_err_msg(err));
}

static void
bk_create(struct bk_job *j)
{
    _cleanup_err_ sbx_err_t err = NULL;
    struct shard *sh = j->a->sh;
    int rc = sbx_backup_pack(&j->ns, j->dir, j->pats, j->nex, j->gitignore, j->fd,
                             (int64_t)sh->conf.backup_max, &err);
    if (rc == 0 &&
        (rc = sbx_backup_digest(j->fd, j->info.digest, sizeof(j->info.digest), &j->info.size)))
        rc = sbx_err_make(&err, SBX_E_STORAGE, "hash the archive: %s", strerror(-rc));
    if (rc == 0) {
        j->info.created_ms = sbx_wall_ms();
        j->info.expires_ms = j->info.created_ms + j->ttl * 1000;
        if (sh->s3) {
            rc = sbx_s3_store_add(sh->s3, j->fd, &j->info, &err);
            unlink(j->tmp);
        } else {
            rc = sbx_backup_store_add(sh->backups, j->tmp, &j->info, &err);
        }
    }
    if (rc) {
        unlink(j->tmp);
        job_fail(j, rc, err);
    }
}

/* Extract j's archive into j->dir, noted in the store while it runs: a
 * restore whose shard is killed leaves its note, and the sandbox's next
 * restore sweeps its leftovers (container/backup.h). */
static int
bk_unpack(struct bk_job *j, sbx_err_t *err)
{
    const char *root = j->a->sh->backups;
    char prev[4096];
    int rc = sbx_backup_restore_begin(root, j->sandbox, j->dir, prev, sizeof(prev));
    if (rc != 0)
        sbx_log_warn("sandbox %s: note of the restore into %s: %s (a kill now would leave "
                     "its directory unswept)", j->sandbox, j->dir, strerror(-rc));
    if (prev[0])
        sbx_log_info("sandbox %s: a restore into %s never ended; its leftovers are swept",
                     j->sandbox, prev);
    rc = sbx_backup_unpack(&j->ns, j->fd, j->dir, prev, err);
    sbx_backup_restore_end(root, j->sandbox);
    return rc;
}

static void
bk_restore(struct bk_job *j)
{
    _cleanup_err_ sbx_err_t err = NULL;
    struct sbx_s3 *s3 = j->a->sh->s3;
    int rc;
    if (s3) {
        /* Looked up (another tenant's is unknown, as in actor_op_backup_restore),
         * then downloaded into j->fd and checked as it arrives. */
        rc = sbx_s3_store_lookup(s3, j->info.id, &j->info, &err);
        if (rc == 0 && j->tenant_set &&
            !tenant_of(j->info.sandbox, (sbx_str){j->tenant, strlen(j->tenant)}))
            rc = sbx_err_make(&err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", j->info.id);
        if (rc != 0 || (rc = sbx_s3_store_fetch(s3, &j->info, j->fd, &err)) != 0 ||
            (lseek(j->fd, 0, SEEK_SET) != 0 &&
             (rc = sbx_err_make(&err, -errno, "backup '%s': its download", j->info.id)))) {
            job_fail(j, rc, err);
            return;
        }
        if ((rc = bk_unpack(j, &err)) != 0)
            job_fail(j, rc, err);
        return;
    }
    /* The digest first: nothing is written from an archive that is not
     * the one stored. */
    char digest[80];
    int64_t size;
    rc = sbx_backup_digest(j->fd, digest, sizeof(digest), &size);
    if (rc) {
        sbx_err_make(&err, SBX_E_STORAGE, "backup '%s': read its archive: %s", j->info.id,
                     strerror(-rc));
        job_fail(j, SBX_E_STORAGE, err);
        return;
    }
    if (strcmp(digest, j->info.digest) != 0) {
        sbx_log_error("backup %s: archive digest %s, expected %s: refused", j->info.id, digest,
                      j->info.digest);
        sbx_err_make(&err, SBX_E_STORAGE,
                     "backup '%s' is corrupt: its archive's digest is %s, not %s; nothing was "
                     "restored", j->info.id, digest, j->info.digest);
        job_fail(j, SBX_E_STORAGE, err);
        return;
    }
    if ((rc = bk_unpack(j, &err)) != 0)
        job_fail(j, rc, err);
}

/* On the loop thread: answer, open the gate, free j. */
static void
bk_done(sbx_loop *l, void *arg)
{
    (void)l;
    struct bk_job *j = arg;
    struct actor *a = j->a;
    struct sop *op = j->op;
    a->gate = NULL;
    if (j->code) {
        shard_reply_err(op, j->code, "%s", j->msg);
    } else if (j->restore) {
        sbx_log_info("sandbox %s: backup %s restored into %s in %lld ms", a->id, j->info.id,
                     j->dir, (long long)j->ms);
        sbx_enc e;
        shard_reply_begin(op, &e);
        sbx_enc_kbool(&e, "success", true);
        sbx_enc_kstr(&e, "id", j->info.id);
        sbx_enc_kstr(&e, "dir", j->dir);
        shard_reply_end(op, &e, a->last_seq);
    } else {
        sbx_log_info("sandbox %s: backup %s of %s: %lld bytes in %lld ms", a->id, j->info.id,
                     j->dir, (long long)j->info.size, (long long)j->ms);
        sbx_enc e;
        shard_reply_begin(op, &e);
        sbx_enc_kstr(&e, "id", j->info.id);
        sbx_enc_kint(&e, "size", j->info.size);
        sbx_enc_kstr(&e, "digest", j->info.digest);
        shard_reply_end(op, &e, a->last_seq);
    }
    job_free(j);
    actor_pump(a);
}

static void *
bk_thread(void *arg)
{
    struct bk_job *j = arg;
    struct shard *sh = j->a->sh;
    int64_t t0 = sbx_mono_ms();
    if (j->restore)
        bk_restore(j);
    else
        bk_create(j);
    j->ms = sbx_mono_ms() - t0;
    /* j is bk_done's once posted; the shard's stop waits for img_jobs,
     * then runs what was posted (shard.c). */
    sbx_loop_post(sh->loop, bk_done, j);
    atomic_fetch_sub(&sh->img_jobs, 1);
    return NULL;
}

/* Enter the running sandbox of a and start j on its thread (j is consumed). */
static void
bk_start(struct actor *a, struct bk_job *j)
{
    struct shard *sh = a->sh;
    _cleanup_err_ sbx_err_t err = NULL;
    j->a = a;
    int rc = sbx_backup_ns_open(a->c.pid, sh->cgroups, &a->c.cg, &j->ns, &err);
    if (rc) {
        shard_reply_err(j->op, rc, "%s", sbx_err_msg(err));
        job_free(j);
        return;
    }
    a->gate = j->op;
    if (shard_job_start(sh, bk_thread, j) != 0) {
        a->gate = NULL;
        shard_reply_err(j->op, SBX_E_INTERNAL, "cannot start a thread for the backup");
        if (!j->restore)
            unlink(j->tmp);
        job_free(j);
    }
}

void
actor_op_backup_create(struct actor *a, struct sop *op)
{
    char dir[4096];
    if (!a->sh->backups[0]) {
        shard_reply_err(op, SBX_E_STORAGE, "this node has no backup store");
        return;
    }
    if (get_dir(op, dir, sizeof(dir)) != 0)
        return;
    sbx_str name = {0};
    if (sbx_wire_get_str(op->req.args, "name", &name) == SBX_E_VALIDATION || name.n > 255 ||
        (name.n && memchr(name.p, '\0', name.n))) {
        shard_reply_err(op, SBX_E_VALIDATION, "'name' must be a string of at most 255 bytes");
        return;
    }
    int64_t ttl = 259200;
    if (sbx_wire_get_i64(op->req.args, "ttl", &ttl) == SBX_E_VALIDATION || ttl < 1 ||
        ttl > 31536000) {
        shard_reply_err(op, SBX_E_VALIDATION, "'ttl' must be 1-31536000 seconds");
        return;
    }
    const msgpack_object *ex = NULL;
    if (sbx_wire_get_array(op->req.args, "excludes", &ex) == SBX_E_VALIDATION ||
        (ex && ex->via.array.size > 256)) {
        shard_reply_err(op, SBX_E_VALIDATION, "'excludes' must be a list of at most 256 strings");
        return;
    }
    size_t nex = ex ? ex->via.array.size : 0;
    for (size_t i = 0; i < nex; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&ex->via.array.ptr[i], &s) != 0 || s.n == 0 ||
            memchr(s.p, '\0', s.n)) {
            shard_reply_err(op, SBX_E_VALIDATION, "'excludes' item %zu must be a non-empty string",
                            i);
            return;
        }
    }
    bool gitignore = false;
    if (sbx_wire_get_bool(op->req.args, "gitignore", &gitignore) == SBX_E_VALIDATION) {
        shard_reply_err(op, SBX_E_VALIDATION, "'gitignore' must be true or false");
        return;
    }
    actor_ensure_record(a, NULL);
    if (a->cs != C_RUNNING) {
        actor_start_container(a, op);
        return;
    }
    struct bk_job *j = sbx_xcalloc(1, sizeof(*j));
    j->op = op;
    j->ns = (struct sbx_backup_ns){.userns = -1, .mntns = -1, .rootfd = -1};
    j->ttl = ttl;
    j->gitignore = gitignore;
    j->nex = nex;
    j->pats = sbx_xcalloc(nex + 1, sizeof(char *));
    for (size_t i = 0; i < nex; i++) {
        sbx_str s;
        sbx_wire_obj_str(&ex->via.array.ptr[i], &s);
        j->pats[i] = sbx_str_dup(s);
    }
    if (name.n)
        memcpy(j->info.name, name.p, name.n);
    snprintf(j->info.sandbox, sizeof(j->info.sandbox), "%s", a->id);
    snprintf(j->info.dir, sizeof(j->info.dir), "%s", dir);
    snprintf(j->dir, sizeof(j->dir), "%s", dir);
    snprintf(j->tmp, sizeof(j->tmp), "%s/tmp/archive-XXXXXX", a->sh->backups);
    j->fd = mkostemp(j->tmp, O_CLOEXEC);
    if (j->fd < 0) {
        shard_reply_err(op, SBX_E_STORAGE, "backup store: %s", strerror(errno));
        job_free(j);
        return;
    }
    bk_start(a, j);
}

/* Whether internal sandbox ID `sandbox` is in tenant `owner`'s namespace
 * ("<owner>--<id>"; owner "" = the default tenant, IDs without "--"):
 * a backup belongs to the tenant of the sandbox it was made of
 * (docs/security.md §6). */
static bool
tenant_of(const char *sandbox, sbx_str owner)
{
    const char *dd = strstr(sandbox, "--");
    if (!owner.n)
        return dd == NULL;
    return dd && (size_t)(dd - sandbox) == owner.n && !memcmp(sandbox, owner.p, owner.n);
}

void
actor_op_backup_restore(struct actor *a, struct sop *op)
{
    char dir[4096], id[64];
    if (!a->sh->backups[0]) {
        shard_reply_err(op, SBX_E_STORAGE, "this node has no backup store");
        return;
    }
    sbx_str ids;
    if (sbx_wire_get_str(op->req.args, "id", &ids) != 0 || ids.n == 0 || ids.n >= sizeof(id)) {
        shard_reply_err(op, SBX_E_VALIDATION, "'id' must be a backup's ID");
        return;
    }
    memcpy(id, ids.p, ids.n);
    id[ids.n] = '\0';
    if (get_dir(op, dir, sizeof(dir)) != 0)
        return;
    if (strspn(dir, "/") == strlen(dir)) {
        shard_reply_err(op, SBX_E_VALIDATION, "'dir' must not be the sandbox's root");
        return;
    }
    struct bk_job *j = sbx_xcalloc(1, sizeof(*j));
    j->op = op;
    j->restore = true;
    j->fd = -1;
    j->ns = (struct sbx_backup_ns){.userns = -1, .mntns = -1, .rootfd = -1};
    snprintf(j->dir, sizeof(j->dir), "%s", dir);
    snprintf(j->sandbox, sizeof(j->sandbox), "%s", a->id);
    _cleanup_err_ sbx_err_t err = NULL;
    int rc;
    if (a->sh->s3) {
        /* Looked up on the job's thread (with the tenant's check below);
         * downloaded into an unnamed file of the local tmp/ (gone with its
         * descriptor). */
        char tmpd[4200];
        snprintf(j->info.id, sizeof(j->info.id), "%.27s", id);
        snprintf(j->tenant, sizeof(j->tenant), "%s", op->tenant);
        j->tenant_set = op->tenant_set;
        snprintf(tmpd, sizeof(tmpd), "%s/tmp", a->sh->backups);
        j->fd = open(tmpd, O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
        rc = j->fd < 0 ? sbx_err_make(&err, SBX_E_STORAGE, "backup store's tmp/: %s",
                                      strerror(errno))
             : sbx_backup_id_valid(id) ? 0
                                       : sbx_err_make(&err, SBX_E_BACKUP_NOT_FOUND,
                                                      "no backup '%s'", id);
    } else {
        /* Known and not expired before a container is started for it. */
        rc = sbx_backup_store_open(a->sh->backups, id, &j->info, &j->fd, &err);
    }
    if (rc == 0 && !a->sh->s3 && op->tenant_set &&
        !tenant_of(j->info.sandbox, (sbx_str){op->tenant, strlen(op->tenant)})) {
        /* With API keys (the gateway stamped the caller's tenant), another
         * tenant's backup is answered as an unknown ID, word for word;
         * keyless, every sandbox is the one implicit tenant's. */
        sbx_err_release(&err);
        rc = sbx_err_make(&err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
    }
    if (rc != 0) {
        shard_reply_err(op, rc, "%s", sbx_err_msg(err));
        job_free(j);
        return;
    }
    actor_ensure_record(a, NULL);
    if (a->cs != C_RUNNING) {
        job_free(j);
        actor_start_container(a, op);
        return;
    }
    bk_start(a, j);
}

/* Answer backup.list with v (n entries; borrowed). */
static void
reply_list(struct sop *op, const struct sbx_backup_info *v, size_t n)
{
    /* owner (set by the gateway from a tenant's key): that tenant's only. */
    sbx_str owner;
    bool scoped = sbx_wire_get_str(op->req.args, "owner", &owner) == 0;
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_str(&e, "backups");
    sbx_enc_array(&e);
    for (size_t i = 0; i < n; i++) {
        char ts[40];
        if (scoped && !tenant_of(v[i].sandbox, owner))
            continue;
        sbx_enc_map(&e);
        sbx_enc_kstr(&e, "id", v[i].id);
        sbx_enc_kstr(&e, "name", v[i].name);
        sbx_enc_kstr(&e, "sandbox", v[i].sandbox);
        sbx_enc_kstr(&e, "dir", v[i].dir);
        sbx_enc_kstr(&e, "digest", v[i].digest);
        sbx_enc_kint(&e, "size", v[i].size);
        sbx_iso8601(v[i].created_ms, ts, sizeof(ts));
        sbx_enc_kstr(&e, "created", ts);
        sbx_iso8601(v[i].expires_ms, ts, sizeof(ts));
        sbx_enc_kstr(&e, "expires", ts);
        sbx_enc_end(&e);
    }
    sbx_enc_end(&e);
    shard_reply_end(op, &e, 0);
}

static void
reply_deleted(struct sop *op)
{
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    shard_reply_end(op, &e, 0);
}

/* backup.list or backup.delete on an S3 store, on a thread of its own
 * (network calls: seconds at worst, bounded by --s3-timeout per call).
 * Owned by the thread, then by bk_node_done on the loop thread. */
struct bk_node_job {
    struct shard *sh;
    struct sop *op;
    char id[64];                 /* delete's; "" for list */
    bool scoped;                 /* delete: only a backup of tenant `owner` (the gateway's) */
    char owner[64];
    struct sbx_backup_info *v;   /* list's answer (heap) */
    size_t n;
    int code;
    char *msg;                   /* heap */
};

static void
bk_node_done(sbx_loop *l, void *arg)
{
    (void)l;
    struct bk_node_job *j = arg;
    if (j->code)
        shard_reply_err(j->op, j->code, "%s", j->msg);
    else if (j->id[0])
        reply_deleted(j->op);
    else
        reply_list(j->op, j->v, j->n);
    free(j->v);
    free(j->msg);
    free(j);
}

static void *
bk_node_thread(void *arg)
{
    struct bk_node_job *j = arg;
    struct shard *sh = j->sh;
    _cleanup_err_ sbx_err_t err = NULL;
    int rc = 0;
    struct sbx_backup_info info;
    if (j->id[0] && j->scoped) {
        /* A tenant deletes its own backups: another's is an unknown ID
         * (errors of the lookup answered as the local store's path does). */
        rc = sbx_s3_store_lookup(sh->s3, j->id, &info, &err);
        if (rc == 0 && !tenant_of(info.sandbox, (sbx_str){j->owner, strlen(j->owner)}))
            rc = sbx_err_make(&err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", j->id);
    }
    if (rc == 0)
        rc = j->id[0] ? sbx_s3_store_delete(sh->s3, j->id, &err)
                      : sbx_s3_store_list(sh->s3, &j->v, &j->n, &err);
    if (rc) {
        j->code = rc;
        j->msg = sbx_xstrdup(sbx_err_msg(err));
    }
    sbx_loop_post(sh->loop, bk_node_done, j); /* j is bk_node_done's */
    atomic_fetch_sub(&sh->img_jobs, 1);
    return NULL;
}

/* owner: delete's tenant scope (NULL: none). */
static void
bk_node_start(struct sop *op, const char *id, const sbx_str *owner)
{
    struct shard *sh = op->sh;
    struct bk_node_job *j = sbx_xcalloc(1, sizeof(*j));
    j->sh = sh;
    j->op = op;
    snprintf(j->id, sizeof(j->id), "%s", id ? id : "");
    if (owner && owner->n >= sizeof(j->owner)) { /* no tenant has so long a name */
        shard_reply_err(op, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", j->id);
        free(j);
        return;
    }
    if (owner) {
        j->scoped = true;
        memcpy(j->owner, owner->p, owner->n);
    }
    if (shard_job_start(sh, bk_node_thread, j) != 0) {
        shard_reply_err(op, SBX_E_INTERNAL, "cannot start a thread for the backup store");
        free(j);
    }
}

void
shard_op_backup_list(struct sop *op)
{
    struct shard *sh = op->sh;
    _cleanup_err_ sbx_err_t err = NULL;
    struct sbx_backup_info *v = NULL;
    size_t n = 0;
    if (!sh->backups[0]) {
        shard_reply_err(op, SBX_E_STORAGE, "this node has no backup store");
        return;
    }
    if (sh->s3) {
        bk_node_start(op, NULL, NULL); /* reply_list scopes the answer */
        return;
    }
    int rc = sbx_backup_store_list(sh->backups, &v, &n, &err);
    if (rc != 0) {
        reply_error(op, rc, err);
        return;
    }
    reply_list(op, v, n);
    free(v);
}

void
shard_op_backup_delete(struct sop *op)
{
    struct shard *sh = op->sh;
    _cleanup_err_ sbx_err_t err = NULL;
    sbx_str ids;
    char id[64];
    if (sbx_wire_get_str(op->req.args, "id", &ids) != 0 || ids.n == 0 || ids.n >= sizeof(id)) {
        shard_reply_err(op, SBX_E_VALIDATION, "'id' must be a backup's ID");
        return;
    }
    memcpy(id, ids.p, ids.n);
    id[ids.n] = '\0';
    if (!sh->backups[0]) {
        shard_reply_err(op, SBX_E_STORAGE, "this node has no backup store");
        return;
    }
    sbx_str owner;
    bool scoped = sbx_wire_get_str(op->req.args, "owner", &owner) == 0;
    if (sh->s3) {
        bk_node_start(op, id, scoped ? &owner : NULL);
        return;
    }
    if (scoped) {
        /* A tenant deletes its own backups: another's is an unknown ID. */
        struct sbx_backup_info info;
        int fd = -1;
        int orc = sbx_backup_store_open(sh->backups, id, &info, &fd, &err);
        if (fd >= 0)
            close(fd);
        if (orc == 0 && !tenant_of(info.sandbox, owner)) {
            shard_reply_err(op, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
            return;
        }
        if (orc != 0) {
            reply_error(op, orc, err);
            return;
        }
    }
    int rc = sbx_backup_store_delete(sh->backups, id, &err);
    if (rc != 0) {
        reply_error(op, rc, err);
        return;
    }
    reply_deleted(op);
}
