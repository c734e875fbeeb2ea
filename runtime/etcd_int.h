/*
 * etcd_int.h — the etcd client's handle (etcd.c), for its tests
 * (tests/fuzz/fuzz_etcd.c resets the endpoint it tries first).  Everything
 * else uses etcd.h.
 */
#ifndef SBX_ETCD_INT_H
#define SBX_ETCD_INT_H

#include <stdint.h>

#include "etcd.h"

#define SBX_ETCD_MAX_ENDPOINTS 8

/* A client of one etcd cluster (sbx_etcd_open / sbx_etcd_close; owns the
 * endpoint strings).  Shared by threads: only cur changes after open. */
struct sbx_etcd {
    char *ep[SBX_ETCD_MAX_ENDPOINTS]; /* base URLs, without a trailing '/' */
    int nep;
    _Atomic int cur;      /* the endpoint that answered last (tried first) */
    int64_t timeout_ms;   /* per call */
    char *ca, *cert, *key;/* PEM paths for https:// endpoints (heap or NULL): the CA
                           * etcd's certificate must chain to (NULL: the system's)
                           * and this client's certificate and key (etcd's
                           * --client-cert-auth); set by sbx_etcd_set_tls */
};

#endif
