/*
 * cli.h — what the verbs of the `sbx` CLI share (tools/sbx.c and
 * tools/cli_util.c implement it).  The CLI uses the public client API
 * (include/sbx/sbx.h), jansson and libc, nothing else of the tree.
 */
#ifndef SBX_CLI_H
#define SBX_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../include/sbx/sbx.h"

#define EXIT_SBX 125
#define EXIT_USAGE 2
#define CLI_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CLI_MAX(a, b) ((a) > (b) ? (a) : (b))

struct gopts {
    const char *gateway;
    bool json;
    int64_t timeout_ms;
    sbx_tls_files tls; /* --tls-ca/--tls-cert/--tls-key (argv strings), NULL each when not given */
};

/* print "sbx: CODE: message" on stderr. */
void cli_print_err(const sbx_error *err);
/* connect to the gateway, or print why and set *rc (EXIT_SBX). */
sbx_client *cli_connect(struct gopts *g, int *rc);
/* the TLS identity to connect with: each of g's flags, else its
 * $SBX_TLS_CA / $SBX_TLS_CERT / $SBX_TLS_KEY (strings borrowed). */
sbx_tls_files cli_tls(const struct gopts *g);
/* call op with JSON args; print the result as JSON (--json or no human
 * printer) or through human(); 0, or 1 after printing the error. */
int cli_call(struct gopts *g, const char *op, const char *sandbox, const char *args_json,
             void (*human)(const msgpack_object *res));
/* call op with the arguments of a (freed here); same output. */
int cli_call_enc(struct gopts *g, const char *op, const char *sandbox, sbx_args *a,
                 void (*human)(const msgpack_object *res));
/* cli_call_enc, then the exit status is status(result) (NULL: 0) when the
 * call succeeded — for ops whose result can report a failure of their own
 * (context.run's `error`). */
int cli_call_enc_check(struct gopts *g, const char *op, const char *sandbox, sbx_args *a,
                       void (*human)(const msgpack_object *res),
                       int (*status)(const msgpack_object *res));
/* "30s", "5m", "2h", "1500ms", "1500" (ms) → ms; -1 if invalid. */
int64_t cli_parse_ms(const char *s);
/* "256M", "1GiB", "4096" → bytes in *out; 0 or -EINVAL. */
int cli_parse_size(const char *s, uint64_t *out);
/* calloc/strdup that exit(EXIT_SBX) with a message when out of memory. */
void *cli_xcalloc(size_t n, size_t sz);
char *cli_xstrdup(const char *s);
/* write all n bytes (EINTR retried); 0 or -errno. */
int cli_write_full(int fd, const void *buf, size_t n);
/* read fd to its end into *out (heap, NUL-terminated; caller frees), *len
 * bytes; 0 or -errno. */
int cli_read_all(int fd, char **out, size_t *len);
/* print a reply's result as pretty JSON. */
void cli_print_json(const msgpack_object *res);

/* Verbs of tools/cli_sdk.c. */
int v_session(struct gopts *g, int argc, char **argv);
int v_ps(struct gopts *g, int argc, char **argv);
int v_start(struct gopts *g, int argc, char **argv);
int v_kill(struct gopts *g, int argc, char **argv);
int v_logs(struct gopts *g, int argc, char **argv);
int v_wait(struct gopts *g, int argc, char **argv);
int v_write(struct gopts *g, int argc, char **argv);
int v_read(struct gopts *g, int argc, char **argv);
int v_ls(struct gopts *g, int argc, char **argv);
int v_mkdir(struct gopts *g, int argc, char **argv);
int v_rm(struct gopts *g, int argc, char **argv);
int v_changes(struct gopts *g, int argc, char **argv);
int v_mv(struct gopts *g, int argc, char **argv);
int v_watch(struct gopts *g, int argc, char **argv);
int v_git_checkout(struct gopts *g, int argc, char **argv);
int v_env(struct gopts *g, int argc, char **argv);
int v_configure(struct gopts *g, int argc, char **argv);
int v_code(struct gopts *g, int argc, char **argv);
int v_contexts(struct gopts *g, int argc, char **argv);
int v_context(struct gopts *g, int argc, char **argv);
/* Of tools/cli_mcp.c: `sbx mcp`, an MCP server on stdio (docs/mcp.md). */
int v_mcp(struct gopts *g, int argc, char **argv);
/* Of tools/cli_schema.c (the schema's part of the CLI; see cli_ops_gen.h). */
struct cli_op;
/* the op named name / run by the CLI verb verb ("ps", "session get"), or NULL. */
const struct cli_op *cli_op_find(const char *name);
const struct cli_op *cli_op_of_verb(const char *verb);
/* check a `sbx call` before sending it, by the gateway's intake rules
 * (runtime/ops.c sbx_op_check_args): the op exists and is not internal, has
 * the sandbox ID it needs, and args_json (NULL or "": none) is a JSON object
 * whose shared durations (timeout, interval, ...) are within 24 h and whose members of the op's spec have their type, bounds, length and enum
 * value (unknown members are ignored).  0, or -EINVAL with *code the wire
 * code (static) and the reason, naming the field, in why. */
int cli_check_call(const char *op, const char *sandbox, const char *args_json,
                   const char **code, char *why, size_t whylen);
/* print the list of operations with their summaries (part of `sbx help`). */
void cli_help_ops(void);
/* print an op's (by name, or by its CLI verb) usage and arguments with their
 * types, units, bounds and defaults, or for a verb of several ops ("wait",
 * "session") the list of them; 0, or -ENOENT when there is no such op. */
int cli_help_op(const char *name);

/* print a stream's events as they come (exec --stream, logs -f, watch);
 * returns the exit code of a complete/exit event, 0 otherwise, or EXIT_SBX. */
int cli_follow(struct gopts *g, sbx_client *c, sbx_stream *s, bool raw_output);

#endif
