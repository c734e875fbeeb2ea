/* nngx.c — see nngx.h. */
#include "nngx.h"

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

int
sbx_nng_rep_listen(nng_socket *s, const char *url)
{
    int rv;
    if ((rv = nng_rep0_open(s)) != 0)
        return rv;
    if ((rv = common(*s)) != 0 || (rv = nng_listen(*s, url, NULL, 0)) != 0) {
        nng_close(*s);
        return rv;
    }
    return 0;
}

int
sbx_nng_req_dial(nng_socket *s, const char *url)
{
    int rv;
    if ((rv = nng_req0_open(s)) != 0)
        return rv;
    if ((rv = common(*s)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_dial(*s, url, NULL, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(*s);
        return rv;
    }
    return 0;
}

int
sbx_nng_req_dial_notify(nng_socket *s, nng_dialer *d, const char *url, nng_pipe_cb cb, void *arg)
{
    int rv;
    if ((rv = nng_req0_open(s)) != 0)
        return rv;
    if ((rv = common(*s)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_pipe_notify(*s, NNG_PIPE_EV_ADD_PRE, cb, arg)) != 0 ||
        (rv = nng_pipe_notify(*s, NNG_PIPE_EV_REM_POST, cb, arg)) != 0 ||
        (rv = nng_dial(*s, url, d, NNG_FLAG_NONBLOCK)) != 0) {
        nng_close(*s);
        return rv;
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
    default: return SBX_E_INTERNAL;
    }
}
