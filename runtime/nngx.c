/* nngx.c — see nngx.h. */
#include "nngx.h"

#include <errno.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>

#include "err.h"
#include "wire.h"

static int
common(nng_socket s)
{
    int rv;
    if ((rv = nng_socket_set_size(s, NNG_OPT_RECVMAXSZ, SBX_WIRE_MAX_FRAME)) != 0)
        return rv;
    if ((rv = nng_socket_set_ms(s, NNG_OPT_RECONNMINT, 10)) != 0)
        return rv;
    return nng_socket_set_ms(s, NNG_OPT_RECONNMAXT, 500);
}

/* fail — the error of a failed step on url (rv: nng's positive code). */
static int
fail(sbx_err_t *err, const char *what, const char *url, int rv)
{
    int code = sbx_nng_code(rv);
    if (code > -4096) /* -errno: sbx_err_make appends strerror */
        return sbx_err_make(err, code, "%s %s", what, url);
    return sbx_err_make(err, code, "%s %s: %s", what, url, nng_strerror(rv));
}

int
sbx_nng_rep_listen(nng_socket *s, const char *url, sbx_err_t *err)
{
    int rv;
    if ((rv = nng_rep0_open(s)) != 0)
        return fail(err, "open a REP socket for", url, rv);
    if ((rv = common(*s)) != 0 || (rv = nng_listen(*s, url, NULL, 0)) != 0) {
        nng_close(*s);
        return fail(err, "listen on", url, rv);
    }
    return 0;
}

int
sbx_nng_req_dial(nng_socket *s, const char *url, sbx_err_t *err)
{
    int rv;
    if ((rv = nng_req0_open(s)) != 0)
        return fail(err, "open a REQ socket for", url, rv);
    if ((rv = common(*s)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_dial(*s, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(*s);
        return fail(err, "dial", url, rv);
    }
    return 0;
}

int
sbx_nng_req_dial_notify(nng_socket *s, nng_dialer *d, const char *url, nng_pipe_cb cb, void *arg,
                        sbx_err_t *err)
{
    int rv;
    if ((rv = nng_req0_open(s)) != 0)
        return fail(err, "open a REQ socket for", url, rv);
    if ((rv = common(*s)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_pipe_notify(*s, NNG_PIPE_EV_ADD_PRE, cb, arg)) != 0 ||
        (rv = nng_pipe_notify(*s, NNG_PIPE_EV_REM_POST, cb, arg)) != 0 ||
        (rv = nng_dial(*s, url, d, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(*s);
        return fail(err, "dial", url, rv);
    }
    return 0;
}

int
sbx_nng_code(int rv)
{
    switch (rv) {
    case 0: return 0;
    case NNG_ETIMEDOUT: return SBX_E_TIMEOUT;
    case NNG_ECONNREFUSED:
    case NNG_ECONNRESET:
    case NNG_ECONNABORTED:
    case NNG_ECLOSED:
    case NNG_EUNREACHABLE:
    case NNG_EADDRINVAL:
    case NNG_ENOENT:
    case NNG_EPEERAUTH:
    case NNG_ECRYPTO: return SBX_E_SHARD_UNAVAILABLE;
    case NNG_EMSGSIZE: return SBX_E_TOO_LARGE;
    case NNG_ECANCELED: return SBX_E_INTERRUPTED;
    case NNG_ENOMEM: return -ENOMEM;
    case NNG_EADDRINUSE: return -EADDRINUSE;
    default: return SBX_E_INTERNAL;
    }
}
