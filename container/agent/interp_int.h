/*
 * interp_int.h — internals shared by the code-context files of sbx-agent
 * (not for the rest of the agent, whose interface is agent.h):
 *
 *   interp.c         the language table, the run queue of a context and the
 *                    context.* operations;
 *   interp_driver.c  the driver protocol: a driver process, its pipes, the
 *                    JSON event lines it writes and its fd-level output;
 *   interp_result.c  result shaping: a run's logs and rich outputs in the
 *                    SDK's shape, within the caps of one reply frame;
 *   interp_pool.c    the Python fork server and the pools of warm drivers,
 *                    and reaping of driver processes.
 *
 * Everything runs on the agent's one loop thread.  The state hangs off
 * struct agent (a->interp, created by IS() on first use, freed by
 * agent_interp_free); a driver, context or run is owned by the list it is
 * on (struct interp's drivers and contexts, a context's queue).
 */
#ifndef SBX_AGENT_INTERP_INT_H
#define SBX_AGENT_INTERP_INT_H
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/json.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define INTERP_DIR "/opt/sbx"
#define READY_TIMEOUT_MS 30000
#define INTERRUPT_GRACE_MS 2000
#define EOF_GRACE_MS 500
#define REFILL_DELAY_MS 100
#define EVENT_LINE_MAX (64u << 20)

/*
 * What one non-streamed run keeps for its reply.  The reply is one frame,
 * and a frame over SBX_WIRE_MAX_FRAME (72 MiB) or over the reply limits of
 * sbx_wire_limits_reply (8 Mi objects, 24 levels) makes the shard replace
 * the container; the agent also holds the reply two or three times while it
 * encodes it, in the sandbox's own memory.  So: each log keeps its first
 * RUN_LOG_CAP bytes (or the shard's --output-cap if smaller) in at most
 * RUN_LOG_ENTRIES chunks (later chunks are appended to the last one);
 * results keep RUN_RESULTS_CAP encoded bytes and RUN_OBJECTS_CAP objects, of
 * which display outputs may use all but RUN_MAIN_RESERVE (the cell's value
 * comes last and should survive a flood of displays); a result that does
 * not fit is replaced by a stand-in with the start of its text, or dropped
 * when even that does not fit; the error keeps ERROR_VALUE_CAP bytes of its
 * value and ERROR_TB_CAP bytes of traceback.  Worst case about 51 MiB and
 * 4.2 Mi objects.  Flags in the reply say what was cut.
 */
#define RUN_LOG_CAP (16u << 20)
#define RUN_LOG_ENTRIES 65536u
#define RUN_RESULTS_CAP (16u << 20)
#define RUN_OBJECTS_CAP (4u << 20)
#define RUN_MAIN_RESERVE (1u << 20)
#define RUN_RESULTS_MAX 4096
#define STANDIN_TEXT (64u << 10)
#define ERROR_VALUE_CAP (1u << 20)
#define ERROR_TB_CAP (2u << 20)
#define ERROR_TB_LINES 1000u
/* A JSON value (application/json, chart) deeper or larger than this is
 * left out of its result: nested in a reply (and in a stream.read reply,
 * two levels deeper) it must stay within the 24 levels of the reply limits,
 * and one value must not use up the object budget. */
/* Unread bytes a runCodeStream holds before the cell is held back. */
#define STREAM_CAP (8u << 20)
#define JSON_MAX_DEPTH 16
#define JSON_MAX_VALUES (256u << 10)

enum { L_PY = 0, L_JS, L_TS, L_N };
static const char *const lang_names[L_N] = {"python", "javascript", "typescript"};

/*
 * Driver kinds: Python, and Node for JavaScript and TypeScript (a Node
 * driver learns its language from `init`).  Each kind keeps POOL_SIZE warm
 * drivers — started, ready, owned by no context — so that creating a
 * context is an `init` round trip; the pool is refilled as soon as a driver
 * is taken (and after a context's own driver started), never when a warm
 * driver dies (no restart loop).  Python drivers are forks of one fork
 * server per sandbox environment (driver.py --fork-server: IPython imported
 * once, forks share its memory copy-on-write): a fork is ready in
 * milliseconds where a start takes a quarter of a second, and costs a few
 * MiB of its own instead of ~40 MiB.  Node cannot fork, so its warm driver
 * costs a whole process (~45 MiB, ~55 with TypeScript's sucrase loaded):
 * one is kept.  Warm drivers hold the sandbox environment of their start;
 * when env.set changes it, they (and the fork server) are replaced.
 */
enum { K_PY = 0, K_NODE, K_N };
#define KIND(lang) ((lang) == L_PY ? K_PY : K_NODE)
static const int POOL_SIZE[K_N] = {2, 2};

struct run;
struct context;

/* One log of a non-streamed run: chunks kept back to back up to a cap. */
struct logacc {
    sbx_buf text;
    uint32_t *lens;          /* length of each chunk */
    size_t n, alloc;
    size_t cap;              /* bytes kept at most */
    uint64_t total;          /* bytes the cell wrote, kept or not */
    bool truncated;
};

struct driver {
    struct driver *next;
    struct agent *a;
    int kind;                /* K_PY, K_NODE */
    int lang;                /* the language it was started or warmed for */
    pid_t pid;               /* 0 for a fork until its `ready` says */
    int req_fd, ev_fd, out_fd, err_fd;
    int child[4];            /* its ends (requests, events, stdout, stderr) until it starts */
    bool pending;            /* waiting for the fork server */
    bool paused;             /* its pipes are not read: a streamed run's reader is behind */
    bool custom;             /* started with the context's own envVars: never pooled */
    uint64_t env_hash;       /* of the sandbox environment it started with */
    sbx_watch *w_req, *w_ev, *w_out, *w_err;
    sbx_buf evbuf, reqq;
    /* fd-level output is UTF-8 decoded across reads: the bytes of a
     * character a read cut in two wait here for the next read (0 = out). */
    char carry[2][4];
    size_t ncarry[2];
    bool ready, dead;
    char mode[16];
    struct context *ctx;     /* NULL while warm */
    int64_t spawned_ms;
    uint64_t ready_timer, eof_timer;
};

struct run {
    struct run *next;
    struct context *ctx;
    struct agent_req *req;   /* runCode: answered at the end; NULL when streamed */
    struct stream *stream;   /* runCodeStream */
    struct agent_req *init_req; /* context.create waiting for init */
    bool is_init;
    char rid[32];
    char *payload;           /* the JSON request line */
    int64_t timeout_ms;
    uint64_t timer, kill_timer;
    bool interrupted, sent;
    bool released;           /* streamed: timed out or cancelled, no more back-pressure */
    uint64_t dropped;        /* streamed: events dropped after the release (stream full) */
    int64_t start_us;
    /* accumulated for runCode (the caps are above) */
    sbx_enc results;
    int nresults;
    size_t res_objects;
    bool res_truncated;
    struct logacc logs[2];   /* stdout, stderr */
    bool has_error;
    sbx_enc error;
    int exec_count;
};

struct context {
    struct context *next;
    struct agent *a;
    char id[64];
    int lang;
    char cwd[1024];
    int64_t created_ms, last_ms;
    struct driver *drv;
    struct run *q_head, *q_tail, *cur;
    bool dead;
    char dead_why[200];
};

/* The Python fork server (see driver.py fork_server()). */
struct zygote {
    pid_t pid;
    int fd;                  /* our end of its SOCK_SEQPACKET control socket */
    sbx_watch *w;
    bool ready;
    uint64_t env_hash, ready_timer;
};

/* A deferred refill of one kind's pool (see pool_refill). */
struct refill {
    struct agent *a;
    int lang;
    uint64_t timer;
};

/* Per-agent interpreter state hangs off the agent. */
struct interp {
    struct driver *drivers;  /* every driver: warm ones have no ctx */
    struct context *contexts;
    struct refill refill[K_N];
    struct zygote *zyg;
    bool zyg_broken;         /* it failed before ready: start drivers directly */
    uint64_t ctr;
};

/* The agent's interpreter state, made on first use. */
static inline struct interp *
IS(struct agent *a)
{
    if (!a->interp)
        a->interp = sbx_xcalloc(1, sizeof(struct interp));
    return a->interp;
}

/* Shared between the files above; each is documented at its definition. */

/* interp.c */
void interp_run_next(struct context *c);
void interp_run_finish(struct context *c, const char *status);

/* interp_driver.c */
void interp_req_pump(struct driver *d);
void interp_driver_unpause(struct driver *d);
void interp_ev_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);
void interp_driver_close_child(struct driver *d);
void interp_driver_close(struct driver *d);
void interp_driver_free(struct driver *d);
void interp_driver_kill(struct driver *d);
void interp_seed_mpl_cache(void);
uint64_t interp_env_hash(char *const *env);
bool interp_env_needs_start(int kind, const msgpack_object *env);
/* interp_driver_paths — the interpreter and driver script of kind (static
 * strings); SBX_E_PYTHON_NA / SBX_E_JAVASCRIPT_NA in *err when the host lacks
 * one.  interp_driver_new — a driver with its pipes, not started (owned by the
 * interp's list), or NULL with -errno in *err.  interp_driver_exec — start d
 * as a process of its own; 0 or a negative code with *err. */
int interp_driver_paths(int kind, const char **bin, const char **script, sbx_err_t *err);
char **interp_driver_env(struct agent *a, const msgpack_object *over);
struct driver *interp_driver_new(struct agent *a, int kind, int lang, sbx_err_t *err);
int interp_driver_exec(struct driver *d, const msgpack_object *over, sbx_err_t *err);

/* interp_result.c */
void interp_logacc_init(struct logacc *l, size_t cap);
void interp_logacc_add(struct logacc *l, const char *p, size_t n);
void interp_logacc_encode(sbx_enc *e, struct logacc *l);
size_t interp_encode_result(sbx_enc *e, json_t *data, json_t *chart, bool main_result,
                            bool standin);
void interp_run_add_result(struct run *r, json_t *data, json_t *chart, bool main_result);
void interp_encode_error_fields(sbx_enc *e, const char *name, json_t *value, json_t *tb);
void interp_run_free(struct run *r);

/* interp_pool.c */
void interp_zygote_gone(struct agent *a, bool broken);
/* interp_driver_spawn — a new driver for a context or the pool (owned by the
 * interp's list), or NULL with *err (as interp_driver_paths/new/exec). */
struct driver *interp_driver_spawn(struct agent *a, int lang, const msgpack_object *over,
                                   sbx_err_t *err);
struct driver *interp_pool_take(struct agent *a, int lang);
void interp_pool_refill(struct agent *a, int lang);
void interp_driver_died(struct driver *d, const char *why);

#endif
