/*
 * fake_agent.h — a minimal `struct agent` for fuzz targets that link the
 * agent (container/agent/, internals through its *_int.h headers): a real
 * event loop and a socketpair as the channel, so the reply helpers
 * (agent_reply_err & co.) work as in the sandbox.  Replies are read back
 * from the other end and checked the way the shard checks them: each must
 * be a frame that passes the shard's untrusted-input decode with
 * {t, ok, r | e}.
 *
 * Only pure request handling may be driven through it: nothing here runs
 * inside a sandbox, so no target calls an operation that touches files,
 * processes or mounts.
 */
#ifndef SBX_FUZZ_FAKE_AGENT_H
#define SBX_FUZZ_FAKE_AGENT_H

#include <sys/epoll.h>
#include <sys/socket.h>

#include "../../container/agent/agent.h"
#include "../../runtime/err.h"
#include "fuzz.h"

static int fake_peer = -1;

static inline void
fake_chan_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    (void)l;
    (void)fd;
    (void)ev;
    (void)arg;
}

static inline void
fake_stop_cb(sbx_loop *l, void *arg)
{
    (void)arg;
    sbx_loop_stop(l);
}

/* One turn of the loop: frees the handles unwatched since (the loop frees
 * them only at the end of an iteration; left alone, each input would look
 * like a leak to libFuzzer, which then runs LeakSanitizer after every one). */
static inline void
fake_loop_turn(sbx_loop *l)
{
    sbx_loop_timer(l, 0, fake_stop_cb, NULL);
    sbx_loop_run(l);
}

/* The agent, set up once per process. */
static inline struct agent *
fake_agent(void)
{
    static struct agent a;
    static bool ready;
    if (ready)
        return &a;
    int sv[2];
    FUZZ_CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair");
    int big = 8 << 20;
    setsockopt(sv[0], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(sv[1], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
    memset(&a, 0, sizeof(a));
    FUZZ_CHECK(sbx_loop_new(&a.loop) == 0, "loop");
    a.chan = sv[0];
    sbx_set_nonblock(a.chan, true);
    sbx_set_nonblock(sv[1], true);
    fake_peer = sv[1];
    a.chan_w = sbx_loop_watch(a.loop, a.chan, EPOLLIN, fake_chan_cb, NULL);
    sbx_frame_reader_init(&a.rd, SBX_WIRE_MAX_FRAME);
    sbx_frame_writer_init(&a.wr);
    static char *const base_env[] = {"PATH=/usr/bin:/bin", "HOME=/root", "LANG=C.UTF-8", NULL};
    a.env = agent_env_merge(base_env, NULL);
    ready = true;
    return &a;
}

/* A request whose args map is the msgpack `args` (n bytes); NULL if they do
 * not decode to a map.  The request owns a copy of the bytes. */
static inline struct agent_req *
fake_req(const void *args, size_t n, uint64_t tag)
{
    struct agent_req *r = sbx_xcalloc(1, sizeof(*r));
    r->frame = fuzz_copy(args, n);
    if (sbx_wire_decode(&r->msg, r->frame, n, &sbx_wire_limits_request) != 0) {
        free(r->frame);
        free(r);
        return NULL;
    }
    r->args = r->msg.root;
    r->tag = tag;
    snprintf(r->op, sizeof(r->op), "fuzz");
    return r;
}

/*
 * Read every reply the agent sent since the last call and check each as the
 * shard would.  Returns how many there were; *last_code gets the error code
 * of the last one (0 when it succeeded).
 */
static inline int
fake_replies(uint64_t tag, int *last_code)
{
    static sbx_frame_reader rd;
    static bool init;
    if (!init) {
        sbx_frame_reader_init(&rd, SBX_WIRE_MAX_FRAME);
        init = true;
    }
    int n = 0;
    for (;;) {
        ssize_t got = sbx_frame_read(&rd, fake_peer);
        const char *p;
        size_t len;
        while (sbx_frame_next(&rd, &p, &len) == 1) {
            sbx_msg m;
            FUZZ_CHECK(sbx_wire_decode(&m, p, len, &sbx_wire_limits_reply) == 0,
                       "the agent sent a frame the shard rejects (%zu bytes)", len);
            int64_t t = -1;
            bool ok = false;
            FUZZ_CHECK(sbx_wire_get_i64(m.root, "t", &t) == 0 && (uint64_t)t == tag,
                       "reply tag %lld, expected %llu", (long long)t, (unsigned long long)tag);
            FUZZ_CHECK(sbx_wire_get_bool(m.root, "ok", &ok) == 0, "reply without ok");
            const msgpack_object *o;
            if (ok) {
                FUZZ_CHECK(sbx_wire_get_map(m.root, "r", &o) == 0, "ok reply without r");
                *last_code = 0;
            } else {
                sbx_str code;
                FUZZ_CHECK(sbx_wire_get_map(m.root, "e", &o) == 0 &&
                               sbx_wire_get_str(o, "code", &code) == 0,
                           "error reply without e.code");
                *last_code = sbx_err_from_name(code.p, code.n);
            }
            sbx_wire_msg_free(&m);
            n++;
        }
        if (got <= 0)
            break;
    }
    return n;
}

#endif
