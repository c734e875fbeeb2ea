/*
 * session_int.h — internals shared by the session files of sbx-agent (the
 * rest of the agent uses agent.h; tests/fuzz/fuzz_agent.c reaches the shell
 * protocol's parsers through this header):
 *
 *   session.c        the session table and the session.* operations, exec
 *                    in a session, env changes, reaping of shells;
 *   session_shell.c  the shell protocol: quoting for bash's input line, the
 *                    bash process and its pipes, attribution of output at
 *                    the end-of-command marker, the control pipe;
 *   session_cmd.c    commands: the line sent for each, its completion,
 *                    timeout and interrupt, streamed commands, the queue.
 *
 * Everything runs on the agent's one loop thread.  Sessions are owned by
 * a->sessions (freed by agent_sessions_free); a command (struct scmd) by its
 * session's queue, or as s->cur while it runs.  See session.c's header
 * comment for the design.
 */
#ifndef SBX_AGENT_SESSION_INT_H
#define SBX_AGENT_SESSION_INT_H
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../../runtime/err.h"
#include "../../runtime/id.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define MARK_PREFIX "\001SBX"
#define MARK_LEN (4 + 16 + 1) /* prefix + 16 hex + \002 */
#define SYNC_RETRY_MS 250
#define SYNC_GIVE_UP_MS 2000
/* Reserved in sessions: the signal whose trap aborts the running line.
 * SIGURG because its default action is to be ignored (signal(7)): one that
 * reaches bash before the line's trap is set (a cancel racing the start of
 * a command) does nothing, and the retries deliver it again once the trap
 * is there; bash's children get it at its default, ignored, too. */
#define SESSION_ABORT_SIG SIGURG
#define RECENT 8
/* A control line: nonce, status and the working directory, which can be
 * longer than PATH_MAX (a shell reaches any depth one `cd` at a time); one
 * of more than CWD_SHOWN_MAX bytes is sent as "?" (session_append_markers). */
#define CWD_SHOWN_MAX 65536
#define CTL_LINE_MAX (64 + CWD_SHOWN_MAX)

/* Append a string literal (its length computed by the compiler). */
#define LIT(b, s) sbx_buf_append((b), (s), sizeof(s) - 1)


struct scmd {
    struct scmd *next;
    struct agent_req *req;      /* answered at the end (plain exec), or NULL */
    struct stream *stream;      /* streamed exec: output as events, or NULL */
    session_done_fn done;       /* internal command: called at the end, or NULL */
    void *done_arg;
    bool cancelled;
    struct exec_args ea;
    bool have_cg;               /* the request's cgroup counters (agent_refine_cause) */
    struct agent_counters cg;
    int64_t deadline_ms;        /* the request's deadline (plain exec), 0: none */
};

struct session {
    struct session *next;
    struct agent *a;
    char id[128];
    char **env;          /* environment the shell starts with */
    char *cwd;           /* directory the shell starts in */
    char *pwd;           /* the shell's cwd after its last command (heap) */
    bool pwd_unknown;    /* that cwd was too long to be reported */
    int64_t default_timeout_ms;
    bool used;           /* a caller's command ran in it (not only internal ones) */
    /* the running shell (pid 0 when there is none) */
    pid_t pid;
    int in_fd, ctl_fd, junk_fd, fd[2];
    sbx_watch *w_in, *w_ctl, *w_junk, *w[2];
    sbx_buf inq;         /* bytes for bash's stdin not yet written */
    sbx_buf pend[2];     /* stream bytes not yet attributed (may hold a partial marker) */
    sbx_buf ctl;         /* control pipe bytes up to a newline */
    /* the queue; `cur` is running */
    struct scmd *q_head, *q_tail, *cur;
    char nonce[17];
    uint64_t serial;       /* of the running command */
    /* Sync nonces sent after a SIGINT: their markers are stripped from the
     * streams whenever they turn up; their status line only ends the command
     * they were sent for. */
    struct {
        char n[17];
        uint64_t serial;
    } recent[RECENT];
    unsigned nrecent;
    bool got_rc, mark[2];
    bool err_bol;        /* the command's stderr so far is empty or ends in a newline */
    int rc;
    struct outcap out[2];
    int64_t start_us;
    unsigned long long start_ticks;
    uint64_t timer, fallback;
    bool timed_out;
    int64_t timeout_ms, sigint_at;
    /* The running command's cause: what else ran (agent_work_mark) and the
     * shard's counters, which its end waits for when it failed. */
    struct work_mark wmark;
    bool asked, answered;
    const char *cause;
    bool by_deadline;    /* its timeout is the request's deadline */
};

/* Shared between the files above; each is documented at its definition. */

/* session_shell.c */
void session_quote_ansi_c(sbx_buf *b, const char *s, size_t n);
void session_new_nonce(struct agent *a, char out[17]);
void session_send_line(struct session *s, const sbx_buf *line);
void session_append_markers(sbx_buf *b, const char *nonce, const char *status_expr);
void session_close_shell_fds(struct session *s);
int session_start_shell(struct session *s);
void session_emit(struct session *s, int i, const char *p, size_t n);
bool session_ends_with_exit_line(const struct session *s, const sbx_buf *p);
void session_attribute(struct session *s, int i);
void session_pause_streams(struct session *s, bool pause);
void session_read_stream_x(struct session *s, int i, bool force);
void session_ctl_cb(sbx_loop *l, int fd, uint32_t ev, void *arg);

/* session_cmd.c */
void session_scmd_free(struct scmd *c);
void session_reset_cmd_state(struct session *s);
void session_cmd_complete(struct session *s);
void session_run_cmd(struct session *s, struct scmd *c);
void session_fail_cmd(struct session *s, struct scmd *c, int code, int exit_status,
                      const char *msg);
void session_start_next(struct session *s);
void session_kill_shell(struct session *s);
/* The stream callbacks of a streamed command (exec.stream in a session). */
extern const struct stream_ops session_cmd_stream_ops;

#endif
