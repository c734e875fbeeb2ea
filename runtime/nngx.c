/* nngx.c — see nngx.h. */
#include "nngx.h"

#include <errno.h>
#include <nng/protocol/reqrep0/rep.h>
#include <nng/protocol/reqrep0/req.h>
#include <stdlib.h>
#include <string.h>

#include "cleanup.h"
#include "err.h"
#include "log.h"
#include "util.h"
#include "wire.h"

/* Largest PEM file read (a certificate chain or key). */
#define PEM_MAX (256 * 1024)

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

/* tls_config — a config of mode with ca, cert_pem and key_pem, peers
 * required to present a certificate the CA signed; 0 or nng's code. */
static int
tls_config(nng_tls_config **out, nng_tls_mode mode, const char *ca, const char *cert_pem,
           const char *key_pem)
{
    nng_tls_config *c;
    int rv = nng_tls_config_alloc(&c, mode);
    if (rv)
        return rv;
    if ((rv = nng_tls_config_ca_file(c, ca)) != 0 ||
        (rv = nng_tls_config_own_cert(c, cert_pem, key_pem, NULL)) != 0 ||
        (rv = nng_tls_config_auth_mode(c, NNG_TLS_AUTH_MODE_REQUIRED)) != 0 ||
        (rv = nng_tls_config_version(c, NNG_TLS_1_2, NNG_TLS_1_3)) != 0) {
        nng_tls_config_free(c);
        return rv;
    }
    *out = c;
    return 0;
}

int
sbx_nng_sec_open(sbx_nng_sec *sec, const char *ca, const char *cert, const char *key,
                 bool insecure_plaintext, sbx_err_t *err)
{
    memset(sec, 0, sizeof(*sec));
    sec->insecure_plaintext = insecure_plaintext;
    bool has_ca = ca && *ca, has_cert = cert && *cert, has_key = key && *key;
    if (!has_ca && !has_cert && !has_key)
        return 0;
    if (!has_ca || !has_cert || !has_key)
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "TLS needs all three of the CA, the certificate and the key "
                            "(--tls-ca, --tls-cert, --tls-key); %s is missing",
                            !has_ca ? "the CA" : !has_cert ? "the certificate" : "the key");
    char *cert_pem = NULL, *key_pem = NULL;
    size_t n;
    int rc = 0, rv = 0;
    if ((rc = sbx_fs_read(cert, PEM_MAX, &cert_pem, &n)) != 0)
        rc = sbx_err_make(err, SBX_E_VALIDATION, "cannot read the certificate %s: %s", cert,
                          strerror(-rc));
    else if ((rc = sbx_fs_read(key, PEM_MAX, &key_pem, &n)) != 0)
        rc = sbx_err_make(err, SBX_E_VALIDATION, "cannot read the key %s: %s", key,
                          strerror(-rc));
    else if ((rv = tls_config(&sec->server, NNG_TLS_MODE_SERVER, ca, cert_pem, key_pem)) != 0 ||
             (rv = tls_config(&sec->client, NNG_TLS_MODE_CLIENT, ca, cert_pem, key_pem)) != 0) {
        rc = sbx_err_make(err, SBX_E_VALIDATION,
                          "TLS identity refused (CA %s, certificate %s, key %s): %s", ca, cert,
                          key, nng_strerror(rv));
    }
    if (key_pem) {
        explicit_bzero(key_pem, strlen(key_pem));
        free(key_pem);
    }
    free(cert_pem);
    if (rc)
        sbx_nng_sec_close(sec);
    return rc;
}

int
sbx_nng_sec_add_crl(sbx_nng_sec *sec, const char *ca, const char *crl, sbx_err_t *err)
{
    if (!sec->server || !sec->client)
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "a revocation list (--tls-crl) needs a TLS identity (--tls-ca, "
                            "--tls-cert, --tls-key)");
    _cleanup_free_ char *ca_pem = NULL, *crl_pem = NULL;
    size_t n;
    int rc, rv;
    if ((rc = sbx_fs_read(ca, PEM_MAX, &ca_pem, &n)) != 0)
        return sbx_err_make(err, SBX_E_VALIDATION, "cannot read the CA %s: %s", ca,
                            strerror(-rc));
    if ((rc = sbx_fs_read(crl, PEM_MAX, &crl_pem, &n)) != 0)
        return sbx_err_make(err, SBX_E_VALIDATION, "cannot read the revocation list %s: %s",
                            crl, strerror(-rc));
    if (!strstr(crl_pem, "-----BEGIN X509 CRL-----"))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "%s holds no PEM revocation list (-----BEGIN X509 CRL-----)", crl);
    if ((rv = nng_tls_config_ca_chain(sec->server, ca_pem, crl_pem)) != 0 ||
        (rv = nng_tls_config_ca_chain(sec->client, ca_pem, crl_pem)) != 0)
        return sbx_err_make(err, SBX_E_VALIDATION, "revocation list %s (CA %s) refused: %s", crl,
                            ca, nng_strerror(rv));
    return 0;
}

void
sbx_nng_sec_close(sbx_nng_sec *sec)
{
    if (!sec)
        return;
    if (sec->server)
        nng_tls_config_free(sec->server);
    if (sec->client)
        nng_tls_config_free(sec->client);
    sec->server = sec->client = NULL;
}

/* scheme_is — whether url starts with one of the NULL-terminated schemes
 * followed by "://". */
static bool
scheme_is(const char *url, const char *const *schemes)
{
    for (; *schemes; schemes++) {
        size_t n = strlen(*schemes);
        if (!strncmp(url, *schemes, n) && !strncmp(url + n, "://", 3))
            return true;
    }
    return false;
}

bool
sbx_nng_url_is_tls(const char *url)
{
    static const char *const tls[] = {"tls+tcp", "tls+tcp4", "tls+tcp6", NULL};
    return url && scheme_is(url, tls);
}

/* host_is_loopback — whether the host of url (after "://": a name, an IPv4
 * address or a bracketed IPv6 one, up to ':' or '/') is a loopback
 * address.  An empty host, "*" or 0.0.0.0 (every interface) is not. */
static bool
host_is_loopback(const char *url)
{
    const char *h = strstr(url, "://");
    if (!h)
        return false;
    h += 3;
    size_t n;
    if (*h == '[') {
        h++;
        n = strcspn(h, "]");
    } else {
        n = strcspn(h, ":/");
    }
    if (n == 9 && !strncmp(h, "localhost", 9))
        return true;
    if (n == 3 && !strncmp(h, "::1", 3))
        return true;
    if (n >= 4 && n < 16 && !strncmp(h, "127.", 4)) {
        for (size_t i = 4; i < n; i++)
            if (!strchr("0123456789.", h[i]))
                return false;
        return true;
    }
    return false;
}

int
sbx_nng_listen_check(const char *url, const sbx_nng_sec *sec, sbx_err_t *err)
{
    static const char *const local[] = {"ipc", "inproc", "abstract", NULL};
    if (!url || !*url)
        return sbx_err_make(err, SBX_E_VALIDATION, "no nng URL to listen on");
    if (sbx_nng_url_is_tls(url)) {
        if (!sec || !sec->server)
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "listening on %s needs a TLS identity: --tls-ca, --tls-cert and "
                                "--tls-key (docs/security.md, Transports)",
                                url);
        return 0;
    }
    if (scheme_is(url, local) || host_is_loopback(url))
        return 0;
    if (sec && sec->insecure_plaintext) {
        sbx_log_warn("INSECURE: listening on %s in plaintext (--insecure-plaintext): anyone who "
                     "reaches this address controls every sandbox behind it",
                     url);
        return 0;
    }
    return sbx_err_make(err, SBX_E_VALIDATION,
                        "refusing to listen on %s: plaintext nng is allowed on loopback, ipc:// "
                        "and inproc:// only; use tls+tcp:// with --tls-ca, --tls-cert and "
                        "--tls-key (docs/security.md, Transports)",
                        url);
}

/* A listener of s on url (TLS with sec's server identity), started. */
static int
listen_on(nng_socket s, nng_listener *lp, const char *url, const sbx_nng_sec *sec)
{
    nng_listener l;
    int rv;
    if ((rv = nng_listener_create(&l, s, url)) != 0)
        return rv;
    if ((sbx_nng_url_is_tls(url) &&
         (rv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, sec->server)) != 0) ||
        (rv = nng_listener_start(l, 0)) != 0) {
        nng_listener_close(l);
        return rv;
    }
    if (lp)
        *lp = l;
    return 0;
}

int
sbx_nng_rep_listen_l(nng_socket *s, nng_listener *l, const char *url, const sbx_nng_sec *sec,
                     sbx_err_t *err)
{
    int rv, rc;
    if ((rc = sbx_nng_listen_check(url, sec, err)) != 0)
        return rc;
    if ((rv = nng_rep0_open(s)) != 0)
        return fail(err, "open a REP socket for", url, rv);
    if ((rv = common(*s)) != 0 || (rv = listen_on(*s, l, url, sec)) != 0) {
        nng_close(*s);
        return fail(err, "listen on", url, rv);
    }
    return 0;
}

int
sbx_nng_rep_listen(nng_socket *s, const char *url, const sbx_nng_sec *sec, sbx_err_t *err)
{
    return sbx_nng_rep_listen_l(s, NULL, url, sec, err);
}

int
sbx_nng_relisten(nng_socket s, nng_listener *l, const char *url, const sbx_nng_sec *sec,
                 sbx_err_t *err)
{
    nng_listener_close(*l);
    int rv = listen_on(s, l, url, sec);
    return rv ? fail(err, "listen again on", url, rv) : 0;
}

int
sbx_nng_dial(nng_socket s, const char *url, const sbx_nng_sec *sec, nng_dialer *dp, int flags,
             sbx_err_t *err)
{
    bool tls = sbx_nng_url_is_tls(url);
    if (tls && (!sec || !sec->client))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "dialing %s needs a TLS identity: a CA, a certificate and a key "
                            "(--tls-ca, --tls-cert, --tls-key or SBX_TLS_CA, SBX_TLS_CERT, "
                            "SBX_TLS_KEY)",
                            url);
    nng_dialer d;
    int rv;
    if ((rv = nng_dialer_create(&d, s, url)) != 0)
        return fail(err, "dial", url, rv);
    if ((tls && (rv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, sec->client)) != 0) ||
        (rv = nng_dialer_start(d, flags)) != 0) {
        nng_dialer_close(d);
        return fail(err, "dial", url, rv);
    }
    if (dp)
        *dp = d;
    return 0;
}

int
sbx_nng_req_dial(nng_socket *s, const char *url, const sbx_nng_sec *sec, sbx_err_t *err)
{
    int rv, rc;
    if ((rv = nng_req0_open(s)) != 0)
        return fail(err, "open a REQ socket for", url, rv);
    if ((rv = common(*s)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0) {
        nng_close(*s);
        return fail(err, "dial", url, rv);
    }
    if ((rc = sbx_nng_dial(*s, url, sec, NULL, NNG_FLAG_NONBLOCK, err)) != 0)
        nng_close(*s);
    return rc;
}

int
sbx_nng_req_dial_notify(nng_socket *s, nng_dialer *d, const char *url, const sbx_nng_sec *sec,
                        nng_pipe_cb cb, void *arg, sbx_err_t *err)
{
    int rv, rc;
    if ((rv = nng_req0_open(s)) != 0)
        return fail(err, "open a REQ socket for", url, rv);
    if ((rv = common(*s)) != 0 ||
        (rv = nng_socket_set_ms(*s, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE)) != 0 ||
        (rv = nng_pipe_notify(*s, NNG_PIPE_EV_ADD_PRE, cb, arg)) != 0 ||
        (rv = nng_pipe_notify(*s, NNG_PIPE_EV_REM_POST, cb, arg)) != 0) {
        nng_close(*s);
        return fail(err, "dial", url, rv);
    }
    if ((rc = sbx_nng_dial(*s, url, sec, d, NNG_FLAG_NONBLOCK, err)) != 0)
        nng_close(*s);
    return rc;
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
