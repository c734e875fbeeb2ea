/*
 * proc_int.h — internals shared by the background-process files of
 * sbx-agent (the rest of the agent uses agent.h):
 *
 *   proc.c       the process table: start, output into the log ring, end,
 *                kill, list/get/logs, and the process.* operations that do
 *                not wait;
 *   proc_wait.c  waiters: process.waitExit, process.waitLog (lines matched
 *                as they arrive and in the retained history) and
 *                process.waitPort (TCP or HTTP polling).
 *
 * Everything runs on the agent's one loop thread.  Processes are owned by
 * a->procs (freed by agent_procs_free); a waiter by its process's waiter
 * list (proc_waiter_free unlinks and frees it).
 */
#ifndef SBX_AGENT_PROC_INT_H
#define SBX_AGENT_PROC_INT_H
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <regex.h>
#include <stdarg.h>
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
#include "../../runtime/id.h"
#include "../../runtime/log.h"
#include "agent.h"
#include "stream.h"

#define LOG_RING_BYTES (2u << 20)
#define KILL_GRACE_MS 5000
#define MAX_FINISHED 256
#define LINE_MAX_BYTES (64u << 10)

enum wkind { W_EXIT, W_LOG, W_PORT, W_KILL };

struct killall {
    struct agent_req *req;
    int remaining, count;
};

struct waiter {
    struct waiter *next;
    struct proc *p;
    enum wkind kind;
    struct agent_req *req;
    uint64_t timer;
    int64_t timeout_ms;
    struct killall *ka;
    bool by_deadline;      /* its timer is the request's deadline, not its timeout */
    /* W_LOG */
    char *pattern;
    size_t plen;
    bool is_regex;
    regex_t re;
    /* W_PORT */
    int port;
    bool http;
    char *path;
    int smin, smax;
    int64_t interval;
    uint64_t poll_timer;
    int sock;
    sbx_watch *w;
    sbx_buf resp;
    bool sent;
};

struct proc {
    struct proc *next;
    struct agent *a;
    char id[128];
    char *command;         /* as shown (agent_command_shown) */
    bool command_cut;      /* `command` is the start of a longer one */
    size_t command_bytes;  /* of the whole command */
    char session[128];
    pid_t pid;
    int fds[3];
    sbx_watch *w[3];
    struct stream *log;
    char status[12];
    char cause[16];
    int exit_code, sig;
    bool exited, finished, kill_req, timed_out;
    int64_t start_ms, end_ms;
    uint64_t kill_timer, timeout_timer, grace_timer;
    int64_t timeout_ms;
    sbx_buf line[2];
    struct waiter *waiters;
    struct exec_args ea;   /* kept until the process starts (session query) */
    struct agent_req *start_req;
    /* Its cause (agent_refine_cause): the start request's cgroup counters,
     * what else ran, and while `refining` the end waits for the shard's. */
    bool have_cg, refining;
    struct agent_counters cg;
    struct work_mark wmark;
};

/* Shared between the files above; each is documented at its definition. */

/* proc.c */
struct waiter *proc_add_waiter(struct proc *p, enum wkind kind, struct agent_req *r);
struct proc *proc_arg(struct agent *a, struct agent_req *r);

/* proc_wait.c */
void proc_waiter_unlink(struct waiter *w);
void proc_waiter_free(struct agent *a, struct waiter *w);
void proc_waiter_fail(struct waiter *w, int code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void proc_waiter_ok(struct waiter *w, sbx_enc *res);
void proc_on_line(struct proc *p, const char *line, size_t n);
void proc_feed_lines(struct proc *p, int i, const char *data, size_t n);

#endif
