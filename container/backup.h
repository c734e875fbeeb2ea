/*
 * backup.h — backups of a sandbox's directory (docs/persistence.md,
 * "Backups"; runtime/ops/backups.yaml).
 *
 * Two halves:
 *  - the archive, made and extracted inside the sandbox's view:
 *    sbx_backup_pack / sbx_backup_unpack fork a child that re-executes the
 *    running binary as `sbxd backup-child` (sbx_backup_child_main; a forked
 *    copy of the many-threaded shard may not call libarchive: fork(2)),
 *    which joins the user
 *    and mount namespaces of the sandbox's agent (setns(2)), takes the
 *    agent's root as its own (chroot) and uid/gid 0 of the sandbox, so every
 *    path is the sandbox's, nothing outside its root can be named, and files
 *    are owned as the sandbox sees them.  The caller blocks until the child
 *    is done (waitpid): the shard calls them on a thread of their own.
 *  - the node's store, a directory:
 *        <root>/blobs/<hex>.tar.zst   archives, named by their sha256
 *        <root>/index/<id>.json       one per backup: {id, name, sandbox,
 *                                     dir, digest, size, created, expires}
 *        <root>/tmp/                  archives being written (a file untouched
 *                                     for an hour is collected with expired
 *                                     backups: its shard died mid-create)
 *        <root>/restoring/<sandbox>   the dir of a restore under way (its
 *                                     leftovers are swept if it never ends)
 *        <root>/lock                  flock(2): shards of one node share it
 *    Index files are written whole and renamed into place; a blob is shared
 *    by the backups of the same content and deleted with the last of them.
 */
#ifndef SBX_CONTAINER_BACKUP_H
#define SBX_CONTAINER_BACKUP_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../runtime/error.h"
#include "cgroup.h"

/*
 * The sandbox a pack or unpack runs in: its agent's user and mount
 * namespaces and root, opened by sbx_backup_ns_open while the agent is
 * known to run (the descriptors keep them valid whatever happens to the pid
 * later), closed by sbx_backup_ns_close.
 */
struct sbx_backup_ns {
    int userns, mntns, rootfd;
    int tasks[SBX_CG_MAX_HIER]; /* the sandbox's cgroup's v1 `tasks` files (ntasks of them) */
    int ntasks;
};
/* sbx_backup_ns_open — pid is the agent's host pid; cg/c its cgroup (the
 * child joins it through sbx_cgroup_open_tasks's files on cgroup v1, so its
 * CPU, memory and page cache are charged to the sandbox; elsewhere it stays
 * in the caller's). */
int sbx_backup_ns_open(pid_t pid, sbx_cgroups *cg, sbx_cgroup *c, struct sbx_backup_ns *ns,
                       sbx_err_t *err);
void sbx_backup_ns_close(struct sbx_backup_ns *ns);

/* The most `excludes` patterns a pack takes (runtime/ops/backups.yaml's
 * max_len; more is SBX_E_VALIDATION). */
#define SBX_BACKUP_MAX_EXCLUDES 256

/*
 * sbx_backup_child_main — the program of a pack's or unpack's child, run as
 * `sbxd backup-child pack PID DIR gitignore|- [EXCLUDE…]` (gitignore: the
 * pack's gitignore) or `sbxd backup-child unpack PID DIR SWEEP` (SWEEP: the
 * unpack's sweep, "" for none) by sbx_backup_pack and
 * sbx_backup_unpack only (not a command for people; PID is the shard's,
 * whose death ends the child: prctl(2) PR_SET_PDEATHSIG, armed again after
 * the child's credentials change in the sandbox): descriptors 3, 4 and 5
 * are the sandbox's user namespace, mount namespace and root, 6 the pipe
 * for its one report (a code and a message, on failure), 7 the archive
 * (written by pack, read by unpack); its cgroup and RLIMIT_FSIZE were set
 * before the exec.  Never returns: _exit(0) when done, else 1 after the
 * report (or when the report could not be written).
 */
_Noreturn void sbx_backup_child_main(int argc, char **argv);

/* The default of the largest archive a backup may have (bytes, compressed;
 * sbxd --backup-max). */
#define SBX_BACKUP_MAX_BYTES (1LL << 30)

/*
 * sbx_backup_pack — write the directory `dir` (absolute in the sandbox
 * `ns`) as a zstd-compressed pax tar to `out_fd` (the
 * caller's; written from its current offset).  Symbolic links are stored as
 * links, other mounts under dir are not entered, `excludes` (nex patterns,
 * libarchive's archive_match patterns, as tar --exclude) are left out, and
 * with `gitignore` so is what git's ignore files would ignore
 * (backup_ignore.h says which files and what is not done).
 * Errors: FILE_NOT_FOUND / NOT_DIRECTORY for dir, BACKUP_TOO_LARGE past
 * `max_bytes`, INTERNAL_ERROR otherwise (message in *err).
 */
int sbx_backup_pack(const struct sbx_backup_ns *ns, const char *dir, char *const *excludes,
                    size_t nex, bool gitignore, int out_fd, int64_t max_bytes, sbx_err_t *err);

/*
 * sbx_backup_unpack — replace the content of `dir` (absolute in the sandbox
 * `ns`; created with its parents if missing) with the archive
 * read from `in_fd` (the caller's, read from its current offset).  Entries
 * with absolute paths, `..` or a path through a symbolic link are refused
 * (ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS | _NODOTDOT | _SYMLINKS), and the
 * child's root is the sandbox's anyway.  First the directories named like
 * a restore's extraction directory (`.sbx-restore-` + 6 characters)
 * directly in `dir` and in `sweep` (absolute in the sandbox; NULL or ""
 * for none: sbx_backup_restore_begin's prev) are removed: what restores
 * cut short by their shard's death left.  Errors: NOT_DIRECTORY,
 * FILESYSTEM_ERROR (message in *err).
 */
int sbx_backup_unpack(const struct sbx_backup_ns *ns, int in_fd, const char *dir,
                      const char *sweep, sbx_err_t *err);

/*
 * sbx_backup_restore_begin — note in the store (root/restoring/<sandbox>,
 * written and fsynced) that a restore into `dir` (absolute in sandbox
 * `sandbox`) is under way; in prev (prevlen bytes, "" if none) the dir of
 * the sandbox's previous note, which only a restore that never ended (its
 * shard was killed) leaves: pass it to sbx_backup_unpack's sweep.  A
 * sandbox ID unfit for a file name notes nothing.  0 or -errno.
 * sbx_backup_restore_end removes the note (the restore ended, either way).
 */
int sbx_backup_restore_begin(const char *root, const char *sandbox, const char *dir, char *prev,
                             size_t prevlen);
void sbx_backup_restore_end(const char *root, const char *sandbox);

/* sbx_backup_digest — "sha256:<hex>" of the file at fd from offset 0 into
 * out (≥ 72 bytes) and its size in *size.  Returns 0 or -errno. */
int sbx_backup_digest(int fd, char *out, size_t outlen, int64_t *size);

/*
 * The store.  Every function takes the store's lock itself.  `root` is the
 * store's directory (created with its subdirectories by sbx_backup_store_init).
 */
int sbx_backup_store_init(const char *root, sbx_err_t *err);

/* A backup's index entry (strings owned by the struct's arrays). */
struct sbx_backup_info {
    char id[32];
    char name[256];
    char sandbox[64];
    char dir[4096];
    char digest[80];
    int64_t size;       /* bytes of the compressed archive */
    int64_t created_ms; /* wall clock */
    int64_t expires_ms; /* wall clock */
};

/*
 * sbx_backup_store_add — move the archive at tmp_path (a file of root/tmp)
 * to its blob (named by info->digest; an existing blob of the same digest
 * is kept and tmp_path removed) and write info's index entry.  info->id is
 * filled in (bk_ + 24 hex digits).  Expired backups are collected first.
 */
int sbx_backup_store_add(const char *root, const char *tmp_path, struct sbx_backup_info *info,
                         sbx_err_t *err);

/*
 * sbx_backup_store_open — look up backup `id`: its entry in *info and its
 * blob opened read-only in *fd (the caller's).  BACKUP_NOT_FOUND,
 * BACKUP_EXPIRED (the entry is kept until the next collection), or
 * STORAGE_ERROR.
 */
int sbx_backup_store_open(const char *root, const char *id, struct sbx_backup_info *info, int *fd,
                          sbx_err_t *err);

/*
 * sbx_backup_store_list — collect expired backups, then the others: *out a
 * heap array of *n entries (the caller frees it).
 */
int sbx_backup_store_list(const char *root, struct sbx_backup_info **out, size_t *n,
                          sbx_err_t *err);

/* sbx_backup_store_delete — remove backup id (and its blob if no other
 * backup has it).  BACKUP_NOT_FOUND if none. */
int sbx_backup_store_delete(const char *root, const char *id, sbx_err_t *err);

/* sbx_backup_id_valid — id is bk_ followed by 24 lowercase hex digits. */
int sbx_backup_id_valid(const char *id);

/* sbx_backup_new_id — a fresh random id into id[32] (bk_ + 24 hex digits).
 * Returns 0 or SBX_E_INTERNAL (no randomness). */
int sbx_backup_new_id(char id[32]);

/* sbx_backup_info_json — info as its index entry's JSON (compact, heap,
 * the caller frees it), or NULL (out of memory). */
char *sbx_backup_info_json(const struct sbx_backup_info *info);

/* sbx_backup_info_parse — the index entry of backup id from JSON text
 * (len bytes) into *info.  0, or STORAGE_ERROR (not an entry). */
int sbx_backup_info_parse(const char *id, const char *text, size_t len,
                          struct sbx_backup_info *info);

#endif
