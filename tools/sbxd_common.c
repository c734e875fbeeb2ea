/*
 * sbxd_common.c — the helpers sbxd's commands share (declared, with their
 * contracts, in tools/sbxd_cmd.h).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "sbxd_cmd.h"

/* sbxd_raise_nofile — the soft RLIMIT_NOFILE raised to the hard limit, once at
 * start-up.  A shard keeps 2 descriptors per running sandbox (channel,
 * pidfd) and more for image and workspace sandboxes, at 4096 and above
 * (container/spawn.c, fd_high); a gateway one per client connection (the
 * HTTP front takes up to 4096).  The usual soft limit, 1024, would stop a
 * shard near 500 sandboxes with EMFILE; 10,000 idle sandboxes per node
 * (docs/benchmarks.md, "Density") need about 4096 + 2 per sandbox in each
 * shard.  The hard limit is the administrator's (systemd LimitNOFILE=); it
 * is only read here, and a warning names it when it is below 4096 + 2 *
 * 10,000 / 2.  Nothing here uses select(2) (the HTTP front polls with
 * epoll), and every child process the daemon starts sets its own limits
 * (container/spawn_child.c). */
void
sbxd_raise_nofile(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t was = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0) {
            sbx_log_warn("RLIMIT_NOFILE not raised from %llu: %s", (unsigned long long)was,
                         strerror(errno));
            return;
        }
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 4096 + 10000)
        sbx_log_warn("RLIMIT_NOFILE is %llu (hard limit): a shard needs about 4096 + 2 "
                     "per running sandbox",
                     (unsigned long long)rl.rlim_cur);
}

/* --relay-secret-file: the secret from a file (not on the command line,
 * where every local user can read it in ps).  0, or 1 after printing why. */
int
sbxd_load_secret(const char *file, char **secret, const char *who)
{
    if (!file || !*file)
        return 0;
    char *text;
    size_t n;
    int rc = sbx_fs_read(file, 4096, &text, &n);
    if (rc) {
        fprintf(stderr, "%s: cannot read %s: %s\n", who, file, strerror(-rc));
        return 1;
    }
    while (n && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' '))
        text[--n] = 0;
    if (n < 16) {
        fprintf(stderr, "%s: the relay secret in %s must be at least 16 characters\n", who,
                file);
        free(text);
        return 1;
    }
    free(*secret);
    *secret = text;
    return 0;
}

void
sbxd_tls_opts_free(struct tls_opts *t)
{
    free(t->ca);
    free(t->cert);
    free(t->key);
    free(t->crl);
}

/* sbxd_tls_open — load t into *sec (sbx_nng_sec_close it) and check that listen
 * may be served with it; 0, or 2 with the reason logged (*sec then holds
 * nothing).  Its first nng call starts nng's threads: the caller blocks the
 * signals it waits for before (a SIGTERM that such a thread takes kills
 * the process; a SIGCHLD it takes is lost). */
int
sbxd_tls_open(const struct tls_opts *t, sbx_nng_sec *sec, const char *listen)
{
    sbx_err_t err = NULL;
    int rc = sbx_nng_sec_open(sec, t->ca, t->cert, t->key, t->insecure, &err);
    if (!rc && t->crl && *t->crl && (rc = sbx_nng_sec_add_crl(sec, t->ca, t->crl, &err)) != 0)
        sbx_nng_sec_close(sec);
    if (!rc && (rc = sbx_nng_listen_check(listen, sec, &err)) != 0)
        sbx_nng_sec_close(sec);
    if (rc) {
        sbx_log_error("%s", sbx_err_msg(err));
        sbx_err_release(&err);
        return 2;
    }
    return 0;
}

/* Apply --log-format; 0, or 2 with the reason printed. */
int
sbxd_set_log_format(const char *log_format, const char *cmd)
{
    if (sbx_log_set_format(log_format) == 0)
        return 0;
    fprintf(stderr, "%s: --log-format must be text or json, not '%s'\n", cmd, log_format);
    return 2;
}

int
sbxd_wait_signal(const sigset_t *set)
{
    for (;;) {
        int sig = sigwaitinfo(set, NULL);
        if (sig > 0)
            return sig;
        if (errno != EINTR)
            return -errno;
    }
}

/* sbxd_wait_signal_until — like sbxd_wait_signal, for at most timeout_ms (< 0: no
 * bound): the signal, 0 when the time ran out, or -errno. */
int
sbxd_wait_signal_until(const sigset_t *set, int64_t timeout_ms)
{
    if (timeout_ms < 0)
        return sbxd_wait_signal(set);
    int64_t until = sbx_mono_ms() + timeout_ms;
    for (;;) {
        int64_t left = until - sbx_mono_ms();
        if (left < 0)
            left = 0;
        struct timespec ts = {left / 1000, (long)(left % 1000) * 1000000L};
        int sig = sigtimedwait(set, NULL, &ts);
        if (sig > 0)
            return sig;
        if (errno == EAGAIN)
            return 0;
        if (errno != EINTR)
            return -errno;
    }
}
