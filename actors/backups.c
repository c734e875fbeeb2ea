/*
 * backups.c — backup.create / restore / list / delete
 * (runtime/ops/backups.yaml; docs/persistence.md, "Backups").
 *
 * create and restore are actor ops: the sandbox's container is started if
 * it is not running (its agent's namespaces are where the archive is made
 * or extracted: container/backup.c), then the work runs on the loop thread,
 * blocking it for the archive's time (a few MB: tens of ms; see "Not done"
 * in docs/persistence.md).  list and delete are node ops on the store.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../container/backup.h"
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
    struct sbx_backup_info info = {0};
    sbx_str name = {0};
    if (sbx_wire_get_str(op->req.args, "name", &name) == SBX_E_VALIDATION ||
        name.n >= sizeof(info.name) || (name.n && memchr(name.p, '\0', name.n))) {
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
    actor_ensure_record(a, NULL);
    if (a->cs != C_RUNNING) {
        actor_start_container(a, op);
        return;
    }
    size_t nex = ex ? ex->via.array.size : 0;
    _cleanup_strv_ char **pats = sbx_xcalloc(nex + 1, sizeof(char *));
    for (size_t i = 0; i < nex; i++) {
        sbx_str s;
        if (sbx_wire_obj_str(&ex->via.array.ptr[i], &s) != 0 || s.n == 0 ||
            memchr(s.p, '\0', s.n)) {
            shard_reply_err(op, SBX_E_VALIDATION, "'excludes' item %zu must be a non-empty string",
                            i);
            return;
        }
        pats[i] = sbx_str_dup(s);
    }
    char tmp[4200];
    snprintf(tmp, sizeof(tmp), "%s/tmp/archive-XXXXXX", a->sh->backups);
    _cleanup_close_ int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd < 0) {
        shard_reply_err(op, SBX_E_STORAGE, "backup store: %s", strerror(errno));
        return;
    }
    _cleanup_err_ sbx_err_t err = NULL;
    int64_t t0 = sbx_mono_ms();
    int rc = sbx_backup_pack(a->c.pid, dir, pats, nex, fd, SBX_BACKUP_MAX_BYTES, &err);
    if (rc == 0 && (rc = sbx_backup_digest(fd, info.digest, sizeof(info.digest), &info.size)) != 0)
        sbx_err_make(&err, SBX_E_STORAGE, "hash the archive: %s", strerror(-rc));
    if (rc != 0) {
        unlink(tmp);
        reply_error(op, rc, err);
        return;
    }
    if (name.n)
        memcpy(info.name, name.p, name.n);
    snprintf(info.sandbox, sizeof(info.sandbox), "%s", a->id);
    snprintf(info.dir, sizeof(info.dir), "%s", dir);
    info.created_ms = sbx_wall_ms();
    info.expires_ms = info.created_ms + ttl * 1000;
    if ((rc = sbx_backup_store_add(a->sh->backups, tmp, &info, &err)) != 0) {
        unlink(tmp);
        reply_error(op, rc, err);
        return;
    }
    sbx_log_info("sandbox %s: backup %s of %s: %lld bytes in %lld ms", a->id, info.id, dir,
                 (long long)info.size, (long long)(sbx_mono_ms() - t0));
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kstr(&e, "id", info.id);
    sbx_enc_kint(&e, "size", info.size);
    sbx_enc_kstr(&e, "digest", info.digest);
    shard_reply_end(op, &e, a->last_seq);
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
    struct sbx_backup_info info;
    _cleanup_close_ int fd = -1;
    _cleanup_err_ sbx_err_t err = NULL;
    /* Known and not expired before a container is started for it. */
    int rc = sbx_backup_store_open(a->sh->backups, id, &info, &fd, &err);
    if (rc != 0) {
        reply_error(op, rc, err);
        return;
    }
    actor_ensure_record(a, NULL);
    if (a->cs != C_RUNNING) {
        actor_start_container(a, op);
        return;
    }
    /* The digest first: nothing is written from an archive that is not
     * the one stored. */
    char digest[80];
    int64_t size;
    if ((rc = sbx_backup_digest(fd, digest, sizeof(digest), &size)) != 0) {
        shard_reply_err(op, SBX_E_STORAGE, "backup '%s': read its archive: %s", id, strerror(-rc));
        return;
    }
    if (strcmp(digest, info.digest) != 0) {
        sbx_log_error("backup %s: archive digest %s, expected %s: refused", id, digest,
                      info.digest);
        shard_reply_err(op, SBX_E_STORAGE,
                        "backup '%s' is corrupt: its archive's digest is %s, not %s; nothing "
                        "was restored", id, digest, info.digest);
        return;
    }
    int64_t t0 = sbx_mono_ms();
    if ((rc = sbx_backup_unpack(a->c.pid, fd, dir, &err)) != 0) {
        reply_error(op, rc, err);
        return;
    }
    sbx_log_info("sandbox %s: backup %s restored into %s in %lld ms", a->id, id, dir,
                 (long long)(sbx_mono_ms() - t0));
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "id", id);
    sbx_enc_kstr(&e, "dir", dir);
    shard_reply_end(op, &e, a->last_seq);
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
    int rc = sbx_backup_store_list(sh->backups, &v, &n, &err);
    if (rc != 0) {
        reply_error(op, rc, err);
        return;
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_str(&e, "backups");
    sbx_enc_array(&e);
    for (size_t i = 0; i < n; i++) {
        char ts[40];
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
    free(v);
    shard_reply_end(op, &e, 0);
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
    int rc = sbx_backup_store_delete(sh->backups, id, &err);
    if (rc != 0) {
        reply_error(op, rc, err);
        return;
    }
    sbx_enc e;
    shard_reply_begin(op, &e);
    sbx_enc_kbool(&e, "success", true);
    shard_reply_end(op, &e, 0);
}
