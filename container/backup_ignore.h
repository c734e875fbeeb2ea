/*
 * backup_ignore.h — git's ignore rules for backup.create's `gitignore: true`
 * (docs/persistence.md, "Backups"; gitignore(5) is the source of the rules).
 *
 * A reimplementation, not git: the backup's child runs in the sandbox's
 * user and mount namespaces but outside its pid and network namespaces and
 * seccomp filter, so it must not run a program of the sandbox (its `git`,
 * or the commands a repository's config may name, e.g. core.fsmonitor).
 *
 * What is read, as git reads it (later sources win over earlier ones):
 *   1. `<top>/.git/info/exclude`, where <top> is the nearest directory at or
 *      above the walk's root that holds a `.git` directory (a repository's
 *      work tree; if none, the walk's root is <top>);
 *   2. the `.gitignore` of every directory from <top> down to the walked
 *      path's parent, deeper ones winning; within one file the last
 *      matching line wins.
 * Not read: core.excludesFile / $XDG_CONFIG_HOME/git/ignore (a user's
 * global setting, not the tree's), `.git` files (gitlinks of worktrees and
 * submodules: their info/exclude is elsewhere), the index (a tracked file
 * that matches a pattern is still left out, where git would keep tracking
 * it).  `.gitignore` files that are symbolic links are not followed (git
 * ≥ 2.32 does the same).  Paths with a `.git` component are never ignored.
 * An ignored directory is not entered, so nothing under it can be
 * re-included (gitignore(5): "It is not possible to re-include a file if a
 * parent directory of that file is excluded"); likewise if the walk's root,
 * or a directory between it and <top>, is ignored, so is everything in it.
 */
#ifndef SBX_CONTAINER_BACKUP_IGNORE_H
#define SBX_CONTAINER_BACKUP_IGNORE_H

#include <stdbool.h>

typedef struct sbx_gi sbx_gi;

/*
 * sbx_gi_open — rules for a walk of the current working directory, whose
 * absolute path is `root` (used only to find <top> above it).  *out is the
 * caller's (sbx_gi_free).  Returns 0 or -ENOMEM; unreadable ignore files
 * are skipped as git skips them.
 */
int sbx_gi_open(const char *root, sbx_gi **out);

/*
 * sbx_gi_ignored — whether git would ignore `rel` (a path relative to the
 * walk's root, no leading "./", no trailing '/'; is_dir: it is a directory,
 * not a link to one).  Loads the `.gitignore` files of rel's parents
 * (relative to the working directory) as it meets them; any walk order
 * works, a depth-first one reads each file once.
 */
bool sbx_gi_ignored(sbx_gi *g, const char *rel, bool is_dir);

void sbx_gi_free(sbx_gi *g);

/*
 * sbx_gi_wildmatch — git's wildmatch with WM_PATHNAME: `*`, `?` and
 * `[...]` (ranges, `!`/`^` negation, [:class:]) never match '/'; `**`
 * between slashes (or at the start or end) matches any number of
 * directories; `\` quotes the next character.  pat and path are
 * NUL-terminated; exported for tests/unit/test_backup_ignore.c.
 */
bool sbx_gi_wildmatch(const char *pat, const char *path);

#endif
