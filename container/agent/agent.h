/*
 * agent.h — internals of sbx-agent, the PID 1 of every sandbox.
 *
 * Life of the agent (container/spawn.c starts it):
 *   1. the shard clones it into new user, mount, pid, net, UTS and IPC
 *      namespaces, maps uid/gid 0 inside to one unprivileged host id, puts it
 *      in its cgroups and execs this binary from a sealed memfd;
 *   2. the agent reads its configuration frame from fd 3 (the channel) and
 *      builds the sandbox (setup.c): root on tmpfs, read-only /usr and
 *      curated /etc, fresh /dev and masked /proc, writable /workspace /tmp
 *      /home, pivot_root, loopback, rlimits, then drops every capability,
 *      sets no_new_privs, becomes non-dumpable and loads the seccomp filter
 *      it was given;
 *   3. it answers "ready" and serves requests on the channel (main.c): exec
 *      (exec.c), sessions (session.c) and the rest, reaping every orphan.
 *
 * The channel is the only way in: an inherited socketpair end, never in
 * any file system, and the agent is non-dumpable, so tenant code (same uid,
 * no capabilities, seccomp denies ptrace and pidfd_getfd) can neither reach
 * it through /proc/1/fd nor read or write the agent's memory.
 */
#ifndef SBX_AGENT_H
#define SBX_AGENT_H

#include <msgpack.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "../../runtime/error.h"
#include "../../runtime/frame.h"
#include "../../runtime/loop.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"

#define AGENT_CHAN_FD 3
#define AGENT_INTERP_TREE_FD 4 /* container/spawn.c SPAWN_INTERP_FD */
/* An image sandbox's upper dir (O_PATH, CLOEXEC), kept by the agent for the
 * shard: a template build (actors/template.c) reads the writable layer through
 * /proc/<agent pid>/fd/AGENT_UPPER_FD, the agent being non-dumpable so tenant
 * processes cannot. */
#define AGENT_UPPER_FD 63
#define AGENT_MAX_LAYERS 253   /* image layers: one SCM_RIGHTS message (container/spawn.c) */

/* Configuration sent by the shard in the first frame (spawn.c builds it). */
struct agent_cfg {
    char hostname[64];
    bool unshare_cgroupns;   /* cgroup v1: the parent attached us, now unshare */
    uint64_t rw_size;        /* bytes: /workspace + /tmp + /home share one tmpfs */
    uint64_t rw_inodes;
    uint64_t shm_size;       /* bytes of /dev/shm, when it is a tmpfs of its own (setup.c) */
    char **etc;              /* NULL-terminated names under /etc to bind read-only */
    struct {
        char *p;             /* a seccomp program (struct sock_filter[]) */
        size_t n;            /* bytes */
    } bpf[4];
    int nbpf;                /* loaded in order (container/seccomp.h) */
    uint32_t nofile;         /* RLIMIT_NOFILE for tenant processes */
    uint32_t nproc;          /* RLIMIT_NPROC backstop (per uid; the pids cgroup is the real limit) */
    uint64_t output_cap;     /* bytes kept per stream of an exec */
    char interp_dir[512];    /* host directory of the interpreter drivers, bound at /opt/sbx */
    bool interp_tree;        /* argv "--interp-tree": a detached copy of that directory's mount
                                (open_tree(2), made by the shard) is at AGENT_INTERP_TREE_FD */
    char **env;              /* base environment "K=V", NULL-terminated */
    /* argv "--image" (container/spawn.c sbx_container_start_image): the root
     * is an overlay of the image's layers, received after the configuration
     * (agent_image_recv) as idmapped detached mounts, bottom first. */
    int nlayers;
    int layer_fds[AGENT_MAX_LAYERS];
    char **image_env;        /* the image config's Env "K=V" (over env), NULL-terminated */
    char image_workdir[512]; /* its WorkingDir ("" none): created, and the agent's cwd */
    /* argv "--workspace" (container/spawn.c sbx_container_start_ws): a
     * persistent workspace, an idmapped detached mount received after the
     * image's layers (agent_ws_recv), holds what the tmpfs would. */
    bool ws;
    int ws_fd;
    uint32_t run_uid;        /* its User, resolved by the shard (image_user.c): the agent and */
    uint32_t run_gid;        /* everything it starts run as these ids (0:0: root) */
    uint32_t run_groups[8];  /* … with these supplementary groups besides run_gid (the */
    int run_ngroups;         /* User's in the image's /etc/group, mapped by the shard) */
    /* Set-up only (setup.c, closed by agent_setup): O_PATH descriptors of
     * the directories of the writable tmpfs that become /run and /dev/shm,
     * or -1 where each is a tmpfs of its own (an image sandbox with a
     * workspace of its own: that file system is kept, these are not). */
    int run_fd;
    int shm_fd;
};

/* setup.c: build the sandbox; 0 or -errno with *err "<failing step>: <strerror>"
 * (runtime/error.h; agent_setup_step recovers the step alone). */
int agent_setup(struct agent_cfg *cfg, sbx_err_t *err);
/* setup.c: the step of a failed agent_setup into step[steplen] (cut to fit):
 * its message without the ": <strerror>" sbx_err_make appended, for the ready
 * frame's "step" field, which container/spawn.c prints beside "message". */
void agent_setup_step(const struct sbx_err_s *err, char *step, size_t steplen);
/* setup.c: with argv "--image", read the image frame {layers, env,
 * workdir, user} and the byte carrying the layers' descriptors
 * (SCM_RIGHTS) from chan into cfg (container/spawn.c image_send), and put
 * the image's Env over cfg->env.  0 or a negative code. */
int agent_image_recv(struct agent_cfg *cfg, int chan);
/* setup.c: with argv "--workspace", read the byte 'W' carrying the
 * workspace's mount (SCM_RIGHTS) into cfg->ws_fd.  0 or a negative code. */
int agent_ws_recv(struct agent_cfg *cfg, int chan);
/* setup.c: the directory commands, processes and sessions start in when
 * they name none: the image's WorkingDir in an image sandbox that has one
 * (docs/images.md), else /workspace.  Static or a's storage. */
struct agent;
const char *agent_default_cwd(const struct agent *a);
/* mount_attr.c: set attr (MOUNT_ATTR_RDONLY, _NOSUID, _NODEV, _NOEXEC; set
 * only, never cleared) on the mount at path (absolute, no trailing slash,
 * a mount's root: EINVAL otherwise) and, when recursive, on every mount
 * below it, as mount_setattr(2) with AT_RECURSIVE.  Kernels without
 * mount_setattr (before 5.12) get the same by remounts, one per mount (the
 * mounts below are path's mount's descendants by parent id in
 * /proc/self/mountinfo, each remounted where a lookup reaches it).  0 or
 * -errno; a failure part-way through a tree may leave some of it changed. */
int agent_mount_attr(const char *path, uint64_t attr, bool recursive);
/* mount_attr.c: agent_mount_attr by remounts only, each keeping the flags
 * its mount has (statvfs(3)) — the fallback, tested on kernels that have
 * mount_setattr too (tests/unit/test_mount_attr.c).  0 or -errno. */
int agent_remount_attr(const char *path, uint64_t attr, bool recursive);
/* setup.c: parse the configuration frame; 0 or SBX_E_MALFORMED. */
int agent_cfg_parse(struct agent_cfg *cfg, const msgpack_object *root);
void agent_cfg_free(struct agent_cfg *cfg);

/* ------------------------------------------------------------------------------ */

struct agent;
struct job;
struct session;
struct stream;
struct proc;
struct watch;

/* A request from the actor, waiting for its reply.  Owned by whoever runs it. */
struct agent_req {
    uint64_t tag;
    char *frame;              /* the raw frame; args point into it */
    sbx_msg msg;
    const msgpack_object *args;
    char op[32];
    sbx_str rid;              /* "rid": the client's request id, for log lines
                               * (empty for the shard's own requests) */
    sbx_str sandbox;          /* "sb": the sandbox ID, with rid */
    int64_t t0_us;            /* when it arrived (sbx_mono_us), for the log */
    int64_t deadline_ms;      /* "d": when the shard stops waiting for the reply, on
                               * sbx_mono_ms()'s clock; 0 when the request has none */
    bool have_cg;             /* "cg": the sandbox's cgroup counters when the shard
                               * sent it (exec, exec.stream, process.start) */
    struct agent_counters {
        uint64_t oom_kills;   /* OOM kills in the sandbox's memory cgroup */
        uint64_t pids_hits;   /* forks refused by its pids limit */
    } cg;
};

/*
 * The modules' own state, of which struct agent is composed.  Each is owned
 * by the module named, touched only by it, empty when zeroed (the agent
 * starts zeroed: no init is needed) and released by the module's fini,
 * which main.c calls at exit.  Modules whose state is a list hold its head
 * (jobs, procs, watches, terms); interp*.c allocates its struct interp on
 * first use.
 */
/* stream.c: the agent's streams and the event being built (stream.h);
 * fini agent_streams_free. */
struct agent_streams {
    struct stream *list;
    sbx_enc ev_enc;           /* the stream event being built */
    struct stream *ev_stream; /* ... and its stream */
    bool ev_open;
};
/* session*.c: the sessions and the counter of their marker nonces;
 * fini agent_sessions_free. */
struct agent_sessions {
    struct session *list;
    uint64_t nonce_ctr;
};
/* main.c: agent_counters_ask calls waiting for the shard's answer, and the
 * timer that gives up on it (AGENT_COUNTERS_WAIT_MS). */
struct agent_cwait {
    struct counters_wait *list;
    uint64_t timer;
};
struct interp;
struct term;

/* The agent: one per sandbox, the loop's only state. */
struct agent {
    sbx_loop *loop;
    int chan;
    sbx_watch *chan_w;
    sbx_frame_reader rd;
    sbx_frame_writer wr;
    int sigfd;                /* signalfd for SIGCHLD */
    struct agent_cfg cfg;
    char **env;               /* current sandbox env (cfg.env + setEnvVars), "K=V" */
    struct job *jobs;         /* exec.c: running commands (list) */
    struct agent_sessions sessions; /* session*.c */
    struct agent_streams streams;   /* stream.c */
    struct proc *procs;       /* proc*.c: background processes (list) */
    struct watch *watches;    /* files_watch.c: file watches (list) */
    struct interp *interp;    /* interp*.c: code contexts; NULL until used */
    struct term *terms;       /* term.c: terminals (list) */
    uint64_t stream_ctr;      /* stream ids made so far (every producer) */
    uint64_t changes_ctr;     /* files_watch.c: checkChanges states made so far */
    uint64_t instance;        /* files_watch.c: random, nonzero once used: names this
                               * container's checkChanges versions */
    struct agent_cwait cwait; /* main.c */
    uint64_t work_starts;     /* tenant work started so far (agent_work_mark) */
    bool bound;
    int64_t bound_ms;         /* when bind came (sbx_mono_ms) */
    char sandbox[64];
};

/*
 * main.c: the sandbox's cgroup counters, which only the shard can read.
 * agent_counters_ask sends it {t: 0, ev: "counters"} (one question at a
 * time; askers meanwhile share it) and calls fn(a, arg, ok, now) when the
 * answer — an internal "counters" request — arrives, or with ok false after
 * AGENT_COUNTERS_WAIT_MS without one.  agent_counters_cancel drops the
 * pending calls for arg (its owner goes away).  Used to tell why a command
 * or process ended (OOM_KILLED, PIDS_LIMIT: agent_refine_cause).
 */
#define AGENT_COUNTERS_WAIT_MS 1000
typedef void (*counters_fn)(struct agent *a, void *arg, bool ok, const struct agent_counters *now);
void agent_counters_ask(struct agent *a, counters_fn fn, void *arg);
void agent_counters_cancel(struct agent *a, void *arg);

/* main.c: reply helpers.  `r` is consumed (freed) by these. */
void agent_reply_ok(struct agent *a, struct agent_req *r, sbx_enc *result /* open map, or NULL */);
void agent_reply_err(struct agent *a, struct agent_req *r, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void agent_reply_werr(struct agent *a, struct agent_req *r, sbx_werr *w);
void agent_req_free(struct agent_req *r);

/*
 * agent_command_shown — the command as results and events show it: its
 * first AGENT_COMMAND_SHOWN bytes (cut at a UTF-8 character boundary), with
 * *cut set when that is not all of it.  A command can be up to the request
 * limit (40 MiB): echoing it whole in every listing made process.list of a
 * few such processes larger than any reply frame.  Heap copy, caller frees.
 */
#define AGENT_COMMAND_SHOWN 4096
char *agent_command_shown(const char *cmd, size_t n, bool *cut);

/* env helpers (main.c): build "K=V" arrays. */
char **agent_env_merge(char *const *base, const msgpack_object *overrides);
void agent_env_free(char **env);
/* agent_env_check — validate a map of per-call or per-session variables:
 * names of 1-256 bytes without '=' or NUL (with shell_names: shell
 * identifiers, what a session's bash can assign), values strings without
 * NUL or nil (unset).  Returns 0 or SBX_E_VALIDATION with *err naming the
 * variable (runtime/error.h).  env may be NULL. */
int agent_env_check(const msgpack_object *env, bool shell_names, sbx_err_t *err);
const char *agent_env_get(char *const *env, const char *key);

/* ------------------------------------------------------------------------------ */
/* exec.c — commands run as fresh processes ("sessionless"); exec_args.c and
 * proctree.c — the machinery sessions and processes share: output capture
 * with caps, arguments, results, exit causes; spawning, tree kill. */

/* Output of one stream: kept up to `cap` bytes, the rest counted and dropped. */
struct outcap {
    sbx_buf data;
    uint64_t total;   /* bytes seen */
    uint64_t cap;
    bool truncated;
};
void outcap_init(struct outcap *o, uint64_t cap);
void outcap_add(struct outcap *o, const char *p, size_t n);
void outcap_free(struct outcap *o);

/* exec.c: the "exec" op without a session; with `stream` the output goes to
 * that (lossless) stream as events instead of the reply, and r is answered
 * with {streamId} at once.  r may be NULL for internal jobs with `done`. */
void agent_exec_fresh(struct agent *a, struct agent_req *r);
void agent_exec_fresh_stream(struct agent *a, struct agent_req *r);
/* exec.c: run an argv as an internal job (no request); `done` gets the exit
 * status and both outputs when it ends.  Returns 0 or -errno. */
typedef void (*job_done_fn)(struct agent *a, void *arg, int exit_code, bool timed_out,
                            struct outcap *out, struct outcap *err);
int agent_run_internal(struct agent *a, const char *const *argv, const char *cwd,
                       int64_t timeout_ms, job_done_fn done, void *arg);
/* exec.c: called for every reaped child. */
void agent_job_reaped(struct agent *a, pid_t pid, int status);
/* proctree.c: kill pid and all of its descendants with SIGKILL (pid itself last
 * unless skip_root); returns how many processes were signalled. */
int agent_kill_tree(pid_t root, bool skip_root, const pid_t *spare, size_t nspare);
/* proctree.c: the same, sparing every subtree whose root started before clock
 * tick `since` (proc(5) starttime; see agent_boot_ticks). */
int agent_kill_tree_since(pid_t root, bool skip_root, const pid_t *spare, size_t nspare,
                          unsigned long long since);
/* proctree.c: now, in the clock ticks proc(5) uses for starttime. */
unsigned long long agent_boot_ticks(void);
/* exec_args.c: parse the common exec arguments (cmd/argv, cwd, env, timeout). */
struct exec_args {
    char *cmd;               /* shell string, or NULL when argv is set */
    char **argv;             /* NULL-terminated, or NULL */
    char *cwd;               /* NULL = default */
    const msgpack_object *env; /* map or NULL */
    int64_t timeout_ms;      /* 0 = none */
    char *stdin_data;
    size_t stdin_len;
    bool has_stdin;
};
/* exec_args_parse — fill *ea from args (borrowed: ea->env points into it).
 * 0, ea owning its strings (exec_args_free); or SBX_E_VALIDATION with *err
 * naming the argument (runtime/error.h) and ea left empty. */
int exec_args_parse(const msgpack_object *args, struct exec_args *ea, sbx_err_t *err);
void exec_args_free(struct exec_args *ea);
/* exec.c: the fields of a finished command in an exec stream's "complete"
 * event; cause NULL: the one the other fields imply (TIMEOUT, KILLED, EXITED). */
void exec_encode_complete(sbx_enc *e, int exit_code, int sig, bool timed_out, bool cancelled,
                          int64_t timeout_ms, int64_t duration_ms, const char *cause);
/* exec.c: read and discard what fd still delivers, then close it. */
void agent_hand_to_drainer(struct agent *a, int fd);
/* exec_args.c: encode the common exec result fields (cause as above); with
 * by_deadline the timeout was the request's deadline (deadlineExceeded). */
void exec_encode_result(sbx_enc *e, int exit_code, int sig, bool timed_out, int64_t timeout_ms,
                        int64_t duration_ms, struct outcap *out, struct outcap *err,
                        const char *cause, bool by_deadline);
/* exec_args.c: the timeout of a command answered in r's reply: timeout_ms (0:
 * none), or what is left before r's deadline if that comes first
 * (*by_deadline then).  A command the caller can no longer hear about is
 * stopped as by a timeout (docs/protocol.md §2). */
int64_t agent_bound_timeout(const struct agent_req *r, int64_t timeout_ms, bool *by_deadline);

/*
 * exec_args.c: why a command or background process ended, beyond what its exit
 * status says.  OOM_KILLED: SIGKILLed (or a shell's exit 137) while the
 * sandbox's OOM-kill counter rose since the request; PIDS_LIMIT: exited
 * non-zero while forks were refused by the pids limit since the request —
 * blamed on it only when blame_pids: it said so in its output
 * (agent_fork_refused_in), or nothing else of the tenant's ran meanwhile
 * (agent_work_alone), for the counter is the whole sandbox's and another
 * process may be the one that hit the limit.  Returns cause or the refined
 * one (static strings).
 */
const char *agent_refine_cause(const char *cause, int exit_code, int sig,
                               const struct agent_counters *before,
                               const struct agent_counters *after, bool blame_pids);
/* exec_args.c: whether output (n bytes) reports a refused fork or EAGAIN. */
bool agent_fork_refused_in(const char *p, size_t n);
/* exec_args.c (agent_others_running: exec.c): what else of the tenant's
 * runs or starts while a command runs: agent_work_mark when it starts
 * (after its own fork), agent_work_alone when it ends — true if no other
 * command, process, busy session, running code cell or open terminal
 * existed at either time and none started between.  `self` is the
 * caller's own job, session command or process. */
struct work_mark {
    uint64_t starts;          /* agent->work_starts after its own start */
    bool others;              /* something else ran at its start */
};
void agent_work_mark(struct agent *a, const void *self, struct work_mark *m);
bool agent_work_alone(struct agent *a, const void *self, const struct work_mark *m);
bool agent_others_running(struct agent *a, const void *self);
/* The parts of agent_others_running each module answers for. */
bool agent_procs_running(struct agent *a, const void *self);   /* proc.c */
bool agent_sessions_busy(struct agent *a, const void *self);   /* session.c: self a command */
bool agent_interp_busy(struct agent *a);                       /* interp.c: a cell runs */
bool agent_terms_open(struct agent *a);                        /* term.c */

/* session.c */
void agent_exec_session(struct agent *a, struct agent_req *r, const char *sid, bool stream);
/* session.c: run an internal shell command in a session (queued like any
 * command); `done` gets its status and output. */
typedef void (*session_done_fn)(struct agent *a, void *arg, int rc, int status,
                                struct outcap *out);
void agent_session_internal(struct agent *a, const char *sid, const char *cmd,
                            session_done_fn done, void *arg);
/* session.c: the cwd of a session as last reported by its shell (or NULL
 * for no such session; "" when it is too long to be reported, over 64 KiB). */
const char *agent_session_cwd(struct agent *a, const char *sid);
void agent_op_session_create(struct agent *a, struct agent_req *r);
void agent_op_session_get(struct agent *a, struct agent_req *r);
void agent_op_session_list(struct agent *a, struct agent_req *r);
void agent_op_session_delete(struct agent *a, struct agent_req *r);
/* session.c: start the default session's shell now (before bind). */
void agent_session_prestart(struct agent *a);
/* session.c: end the default session's shell when no command has run in it
 * AGENT_SHELL_UNUSED_MS after bind.  Such a shell holds nothing a fresh one
 * would not (the sandbox env, the default cwd), and an idle sandbox then
 * costs its agent alone; the next command starts a shell (session_start_next).
 * Called from the agent's periodic timer. */
#define AGENT_SHELL_UNUSED_MS 10000
void agent_sessions_trim(struct agent *a);
/* session.c: apply env changes to the default session (setEnvVars). */
void agent_session_apply_env(struct agent *a, const msgpack_object *vars);
void agent_sessions_reaped(struct agent *a, pid_t pid, int status);
void agent_sessions_free(struct agent *a);

/* proctree.c: a new pseudo-terminal pair (both O_CLOEXEC, master non-blocking);
 * 0 or -errno. */
int agent_openpty(int *master, int *slave);

/* proc.c (the waits: proc_wait.c): background processes. */
void agent_op_process_start(struct agent *a, struct agent_req *r);
void agent_op_process_list(struct agent *a, struct agent_req *r);
void agent_op_process_get(struct agent *a, struct agent_req *r);
void agent_op_process_kill(struct agent *a, struct agent_req *r);
void agent_op_process_kill_all(struct agent *a, struct agent_req *r);
void agent_op_process_logs(struct agent *a, struct agent_req *r);
void agent_op_process_wait_log(struct agent *a, struct agent_req *r);
void agent_op_process_wait_port(struct agent *a, struct agent_req *r);
void agent_op_process_wait_exit(struct agent *a, struct agent_req *r);
/* proc.c: a reaped child that may be a background process; true if it was. */
bool agent_procs_reaped(struct agent *a, pid_t pid, int status);
/* proc.c: kill every process started in session sid (session deletion). */
void agent_procs_kill_session(struct agent *a, const char *sid);
void agent_procs_free(struct agent *a);

/* files.c, files_rw.c, files_watch.c, files_git.c: the file API (files_int.h). */
void agent_op_file_write(struct agent *a, struct agent_req *r);
void agent_op_file_read(struct agent *a, struct agent_req *r);
void agent_op_file_read_stream(struct agent *a, struct agent_req *r);
void agent_op_file_mkdir(struct agent *a, struct agent_req *r);
void agent_op_file_delete(struct agent *a, struct agent_req *r);
void agent_op_file_rename(struct agent *a, struct agent_req *r);
void agent_op_file_list(struct agent *a, struct agent_req *r);
void agent_op_file_exists(struct agent *a, struct agent_req *r);
void agent_op_file_watch(struct agent *a, struct agent_req *r);
void agent_op_git_checkout(struct agent *a, struct agent_req *r);
void agent_watches_free(struct agent *a);

/* interp.c (and interp_*.c, interp_int.h): code contexts. */
void agent_op_context_create(struct agent *a, struct agent_req *r);
void agent_op_context_run(struct agent *a, struct agent_req *r);
void agent_op_context_run_stream(struct agent *a, struct agent_req *r);
void agent_op_context_list(struct agent *a, struct agent_req *r);
void agent_op_context_delete(struct agent *a, struct agent_req *r);
bool agent_interp_reaped(struct agent *a, pid_t pid, int status);
void agent_interp_free(struct agent *a);

/* term.c: terminals (a pseudo-terminal and shell per session id). */
void agent_op_terminal_open(struct agent *a, struct agent_req *r);
void agent_op_terminal_write(struct agent *a, struct agent_req *r);
void agent_op_terminal_resize(struct agent *a, struct agent_req *r);
void agent_op_terminal_close(struct agent *a, struct agent_req *r);
bool agent_terms_reaped(struct agent *a, pid_t pid, int status);
/* term.c: end the terminal of session sid, if any (session deletion). */
void agent_term_close_session(struct agent *a, const char *sid);
void agent_terms_free(struct agent *a);

/* proctree.c: send `sig` to root's descendants (all, however deep) and, if
 * include_root, to root; returns how many were signalled. */
int agent_signal_tree(pid_t root, int sig, bool include_root);

/* Spawning children (proctree.c): fork, set up stdio/cwd/env/limits, exec. */
struct spawn_opts {
    int in_fd, out_fd, err_fd;   /* become 0, 1, 2 */
    const int *keep_fds;         /* extra fds to keep open (dup'ed to 3, 4, …) */
    int nkeep;
    const char *cwd;
    char *const *env;
    const char *const *argv;
    bool subreaper;
    bool new_session;
    bool ctty;                   /* with new_session: stdin (a tty) becomes the controlling terminal */
};
/* Returns the child's pid or -errno (the child reports exec failure as exit 127
 * with a message on its stderr, like a shell). */
pid_t agent_spawn(struct agent *a, const struct spawn_opts *o);

#endif
