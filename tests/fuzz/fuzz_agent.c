/*
 * fuzz_agent.c — the agent's decoding of what reaches it (container/agent/
 * main.c, exec.c and setup.c through agent.h; the session's shell protocol,
 * session_shell.c, through session_int.h):
 *
 *  0. agent_env_merge: a base environment with the `env` map of a request
 *     (exec, session.create, process.start, bind) applied;
 *  1. exec_args_parse: the arguments of exec / process.start / session
 *     commands;
 *  2. agent_cfg_parse: the configuration frame;
 *  3. session_quote_ansi_c: how command text, env values and cwd travel to a
 *     session's bash as $'…' on one line;
 *  4. session_attribute: how a session's stdout is split at the end-of-command
 *     marker "\001SBX<nonce>\002" — tenant output, fed in random pieces;
 *  5. session_ctl_cb: the session's control pipe, lines "<nonce> <status> <cwd>"
 *     that end a command (written by bash, or by tenant code that opens
 *     the shell's fd 3 through /proc).
 *
 * Input: byte 0 picks the part; for 0–2 the rest is a msgpack map, for 3
 * and 5 raw text, for 4 one byte of chunking seed then the output bytes.
 *
 * Properties: (0) every entry of a merged environment is "K=V" with a
 * non-empty K, no name appears twice, entries of the base that were not
 * overridden survive; (1) parsed arguments satisfy what the parser
 * promises (command or argv, never both; no NUL; timeout ≥ 0); (3) the
 * quoted text is printable ASCII only (it is one line of bash input) and
 * unquotes to the input; (4) the bytes attributed to the command are
 * exactly the output before the first real marker, and nothing after it;
 * (5) the command ends exactly when a complete line starts with its nonce
 * and a number, with that status and the cwd that follows it, and no
 * complete line is left unparsed.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <unistd.h>

#include "../../container/agent/session_int.h"

#include "fake_agent.h"

static char *const base_env[] = {"PATH=/usr/bin:/bin", "HOME=/root", "A=1", "LANG=C.UTF-8", NULL};

static size_t
key_len(const char *e)
{
    const char *eq = strchr(e, '=');
    return eq ? (size_t)(eq - e) : strlen(e);
}

static void
env_merge(const msgpack_object *args)
{
    const msgpack_object *ov = NULL;
    if (sbx_wire_get_map(args, "env", &ov) != 0)
        ov = NULL;
    char **env = agent_env_merge(base_env, ov);
    size_t n = 0;
    for (char **p = env; *p; p++, n++) {
        size_t kl = key_len(*p);
        FUZZ_CHECK(kl > 0 && (*p)[kl] == '=', "entry '%s' is not K=V", *p);
        for (char **q = env; q < p; q++)
            FUZZ_CHECK(key_len(*q) != kl || strncmp(*q, *p, kl), "'%.*s' twice", (int)kl, *p);
    }
    /* A base entry survives unless the map names its key. */
    for (char *const *b = base_env; *b; b++) {
        size_t kl = key_len(*b);
        bool named = false;
        for (uint32_t i = 0; ov && i < ov->via.map.size; i++) {
            sbx_str k;
            if (sbx_wire_obj_str(&ov->via.map.ptr[i].key, &k) == 0 && k.n == kl &&
                !memcmp(k.p, *b, kl))
                named = true;
        }
        if (named)
            continue;
        bool found = false;
        for (char **p = env; *p; p++)
            found |= !strcmp(*p, *b);
        FUZZ_CHECK(found, "base entry '%s' lost", *b);
    }
    agent_env_free(env);
}

static void
exec_args(const msgpack_object *args)
{
    struct exec_args ea;
    _cleanup_err_ sbx_err_t err = NULL;
    int rc = exec_args_parse(args, &ea, &err);
    if (rc) {
        FUZZ_CHECK(rc == SBX_E_VALIDATION && sbx_err_code(err) == rc && sbx_err_msg(err)[0],
                   "rejection %d without reason", rc);
        return;
    }
    FUZZ_CHECK((ea.cmd != NULL) != (ea.argv != NULL), "command and argv: %p %p", (void *)ea.cmd,
               (void *)ea.argv);
    FUZZ_CHECK(!ea.argv || ea.argv[0][0], "empty argv[0]");
    FUZZ_CHECK(!ea.cmd || ea.cmd[0], "empty command");
    FUZZ_CHECK(ea.timeout_ms >= 0, "negative timeout");
    FUZZ_CHECK(!ea.cwd || (ea.cwd[0] && strlen(ea.cwd) <= 4096), "bad cwd");
    exec_args_free(&ea);
}

static void
cfg(const msgpack_object *root)
{
    struct agent_cfg c;
    int rc = agent_cfg_parse(&c, root);
    if (rc == 0) {
        FUZZ_CHECK(c.nbpf >= 1 && c.nbpf <= 4, "%d filters", c.nbpf);
        for (int k = 0; k < c.nbpf; k++)
            FUZZ_CHECK(c.bpf[k].n && c.bpf[k].n % 8 == 0, "filter %d of %zu bytes", k, c.bpf[k].n);
        FUZZ_CHECK(memchr(c.hostname, '\0', sizeof(c.hostname)), "hostname unterminated");
    }
    agent_cfg_free(&c);
}

static int
hexval(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

static void
quoting(const char *p, size_t n)
{
    sbx_buf b;
    sbx_buf_init(&b);
    session_quote_ansi_c(&b, p, n);
    FUZZ_CHECK(b.len >= 3 && !memcmp(b.p, "$'", 2) && b.p[b.len - 1] == '\'', "not $'…'");
    /* Unquote as bash does for the escapes the quoter emits. */
    char *out = sbx_xmalloc(b.len);
    size_t o = 0;
    for (size_t i = 2; i < b.len - 1; i++) {
        unsigned char c = (unsigned char)b.p[i];
        FUZZ_CHECK(c >= 0x20 && c < 0x7f, "byte 0x%02x in a bash input line", c);
        FUZZ_CHECK(c != '\'', "unescaped quote at %zu", i);
        if (c != '\\') {
            out[o++] = (char)c;
            continue;
        }
        FUZZ_CHECK(i + 1 < b.len - 1, "dangling backslash");
        char e = b.p[++i];
        if (e == '\\' || e == '\'') {
            out[o++] = e;
        } else {
            FUZZ_CHECK(e == 'x' && i + 2 < b.len - 1 && hexval(b.p[i + 1]) >= 0 &&
                           hexval(b.p[i + 2]) >= 0,
                       "escape \\%c", e);
            out[o++] = (char)(hexval(b.p[i + 1]) * 16 + hexval(b.p[i + 2]));
            i += 2;
        }
    }
    FUZZ_CHECK(o == n && !memcmp(out, p, n), "unquoting does not give the input back");
    free(out);
    sbx_buf_free(&b);
}

static void
markers(uint8_t seed, const char *p, size_t n)
{
    static const char nonce[] = "0123456789abcdef";
    struct session s;
    struct scmd cmd;
    memset(&s, 0, sizeof(s));
    memset(&cmd, 0, sizeof(cmd));
    s.a = fake_agent();
    s.cur = &cmd;
    memcpy(s.nonce, nonce, 17);
    sbx_buf_init(&s.pend[0]);
    outcap_init(&s.out[0], 1ull << 30);
    /* Feed the output in pieces as the pipe would deliver it. */
    uint32_t x = seed * 2654435761u + 1;
    for (size_t off = 0; off < n;) {
        x = x * 1103515245u + 12345u;
        size_t k = SBX_MIN(n - off, (size_t)(1 + (x >> 16) % 64));
        sbx_buf_append(&s.pend[0], p + off, k);
        session_attribute(&s, 0);
        off += k;
    }
    char mark[MARK_LEN + 1];
    snprintf(mark, sizeof(mark), "\001SBX%s\002", nonce);
    const char *m = memmem(p, n, mark, MARK_LEN);
    size_t before = m ? (size_t)(m - p) : n;
    FUZZ_CHECK(s.mark[0] == (m != NULL), "marker seen %d, present %d", s.mark[0], m != NULL);
    if (m) {
        FUZZ_CHECK(s.out[0].data.len == before && (!before || !memcmp(s.out[0].data.p, p, before)),
                   "%zu bytes attributed, %zu precede the marker", s.out[0].data.len, before);
    } else {
        /* Without a marker, what is not attributed yet waits in pend, in order. */
        FUZZ_CHECK(s.out[0].data.len + s.pend[0].len == n, "bytes lost or invented");
        FUZZ_CHECK(!memcmp(s.out[0].data.p ? s.out[0].data.p : "", p, s.out[0].data.len) &&
                       !memcmp(s.pend[0].p ? s.pend[0].p : "", p + s.out[0].data.len,
                               s.pend[0].len),
                       "bytes reordered");
        FUZZ_CHECK(s.pend[0].len <= MARK_LEN, "%zu bytes held back", s.pend[0].len);
    }
    outcap_free(&s.out[0]);
    sbx_buf_free(&s.pend[0]);
}

static void
noop_cb(sbx_loop *l, int fd, uint32_t ev, void *arg)
{
    (void)l;
    (void)fd;
    (void)ev;
    (void)arg;
}

/* The control pipe: "<nonce> <status> <cwd>" lines written by the session's
 * bash (and by anything that gets at its fd 3). */
static void
control(const char *p, size_t n)
{
    static const char nonce[] = "0123456789abcdef";
    struct session s;
    struct scmd cmd;
    int fds[2];
    memset(&s, 0, sizeof(s));
    memset(&cmd, 0, sizeof(cmd));
    FUZZ_CHECK(pipe2(fds, O_NONBLOCK | O_CLOEXEC) == 0, "pipe");
    n = SBX_MIN(n, (size_t)60000); /* what a default pipe (64 KiB) holds */
    FUZZ_CHECK(write(fds[1], p, n) == (ssize_t)n, "pipe write");
    close(fds[1]);
    s.a = fake_agent();
    s.cur = &cmd;
    memcpy(s.nonce, nonce, 17);
    s.fd[0] = s.fd[1] = -1;
    s.ctl_fd = fds[0];
    sbx_buf_init(&s.ctl);
    s.w_ctl = sbx_loop_watch(s.a->loop, fds[0], 0, noop_cb, &s);
    session_ctl_cb(s.a->loop, fds[0], EPOLLIN, &s);
    /* The reference: the first complete line "<nonce> <int>…". */
    bool want = false;
    int status = 0;
    const char *pwd = NULL;
    size_t pwdlen = 0;
    for (size_t off = 0; off < n && !want;) {
        const char *nl = memchr(p + off, '\n', n - off);
        if (!nl)
            break;
        char *line = fuzz_cstr(p + off, (size_t)(nl - p - off));
        char nc[17] = {0};
        int st = 0, used = 0;
        if (sscanf(line, "%16s %d %n", nc, &st, &used) == 2 && !strcmp(nc, nonce)) {
            want = true;
            status = st;
            if (used > 0 && line[used] == '/') {
                pwd = p + off + used;
                pwdlen = strlen(line + used);
            }
        }
        free(line);
        off = (size_t)(nl - p) + 1;
    }
    FUZZ_CHECK(s.got_rc == want, "status line seen %d, expected %d", s.got_rc, want);
    FUZZ_CHECK(!want || s.rc == status, "status %d, expected %d", s.rc, status);
    if (pwd)
        FUZZ_CHECK(s.pwd && strlen(s.pwd) == pwdlen && !memcmp(s.pwd, pwd, pwdlen),
                   "cwd '%s' differs", s.pwd ? s.pwd : "(none)");
    else
        FUZZ_CHECK(!s.pwd, "cwd '%s' from nowhere", s.pwd);
    FUZZ_CHECK(!memchr(s.ctl.p ? s.ctl.p : "", '\n', s.ctl.len), "a complete line was kept");
    sbx_loop_cancel(s.a->loop, s.fallback);
    sbx_loop_unwatch(s.a->loop, s.w_ctl);
    fake_loop_turn(s.a->loop);
    free(s.pwd);
    sbx_buf_free(&s.ctl);
    close(fds[0]);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 2 || size > (256u << 10))
        return 0;
    const char *p = (const char *)data + 1;
    size_t n = size - 1;
    int which = data[0] % 6;
    if (which <= 2) {
        char *buf = fuzz_copy(p, n);
        sbx_msg m;
        if (sbx_wire_decode(&m, buf, n, &sbx_wire_limits_request) == 0) {
            if (which == 0)
                env_merge(m.root);
            else if (which == 1)
                exec_args(m.root);
            else
                cfg(m.root);
            sbx_wire_msg_free(&m);
        }
        free(buf);
    } else if (which == 3) {
        quoting(p, n);
    } else if (which == 4) {
        markers(data[1], p + 1, n - 1);
    } else {
        control(p, n);
    }
    return 0;
}
