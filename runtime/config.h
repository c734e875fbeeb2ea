/*
 * config.h — options for sbxd's commands, from three sources, later ones
 * winning: built-in defaults, a config file (`--config FILE`: lines of
 * `name = value`, `#` comments), environment variables (SBX_<NAME>, with
 * '-' as '_', upper-case) and command-line flags (`--name value` or
 * `--name=value`; booleans also as bare `--name`).
 *
 * A command declares a table of sbx_opt and calls sbx_config_parse; values
 * are written through the pointers in the table.  Unknown names are errors
 * (a typo must not silently fall back to a default).
 */
#ifndef SBX_CONFIG_H
#define SBX_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum sbx_opt_type {
    SBX_OPT_STR,    /* char ** (heap copy; the previous value is freed if it was set here) */
    SBX_OPT_INT,    /* int64_t * */
    SBX_OPT_SIZE,   /* uint64_t *, "64M" style */
    SBX_OPT_MS,     /* int64_t *, "30s" / "10m" / "500ms" */
    SBX_OPT_BOOL,   /* bool * */
    SBX_OPT_LIST,   /* char *** NULL-terminated; repeated flags append, a file value is
                       comma-separated */
};

struct sbx_opt {
    const char *name;
    enum sbx_opt_type type;
    void *ptr;
    const char *help;
};

/*
 * sbx_config_parse — apply file, environment and argv[first..argc) to the
 * table.  Positional arguments are returned in *rest (argv pointers, NULL
 * terminated, caller frees the array).  Returns 0, or -EINVAL with the
 * reason in why.
 */
int sbx_config_parse(const struct sbx_opt *opts, int argc, char **argv, int first, char ***rest,
                     char *why, size_t whylen);

/* sbx_config_usage — print the options with their help lines. */
void sbx_config_usage(const struct sbx_opt *opts, const char *cmd, const char *summary);

/* sbx_strv_free — free a NULL-terminated heap string array. */
void sbx_strv_free(char **v);

#endif
