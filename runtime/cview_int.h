/*
 * cview_int.h — the cluster view's inside (cview.c): its state and the steps
 * its thread takes, for its tests (tests/fuzz/fuzz_etcd.c runs them on a
 * view with no thread of its own).  Everything else uses cview.h.
 */
#ifndef SBX_CVIEW_INT_H
#define SBX_CVIEW_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cview.h"
#include "etcd.h"

/* A view of the cluster keys under prefix (cview.h).  Owned by whoever
 * started it (sbx_cview_start / sbx_cview_stop); its thread reads etcd and
 * writes the fields under mu. */
struct sbx_cview {
    sbx_etcd *etcd;      /* borrowed: outlives the view */
    char prefix[160];
    char cprefix[176];   /* prefix + "c/" */
    sbx_cview_fn fn;     /* called after each change, without mu; or NULL */
    void *arg;
    pthread_mutex_t mu;
    /* Under mu: */
    struct sbx_cmember members[SBX_CVIEW_MAX_MEMBERS];
    int nmembers;        /* slots ever used (free ones among them have name "") */
    int refs[SBX_CVIEW_MAX_MEMBERS];              /* partitions each slot owns */
    char prev[SBX_CVIEW_MAX_MEMBERS][64];         /* a free slot's last name */
    uint64_t freed[SBX_CVIEW_MAX_MEMBERS];        /* when it was freed (nfreed then) */
    uint64_t nfreed;     /* slots freed so far */
    uint64_t gen;        /* the last gen handed out */
    char (*drains)[64];  /* names with a drain/ key (no slot of their own); heap */
    size_t ndrains, capdrains;
    struct sbx_cpart parts[SBX_PARTITIONS];
    bool synced;
    int64_t rev;
    uint64_t nevents;    /* events applied (the watch's progress) */
    pthread_t thread;
    atomic_bool stop;
};

/* An empty view (no member, no owner, not synced), under mu or before the
 * thread starts; keeps etcd, prefixes, callback and the drain set's
 * memory. */
void sbx_cview_reset(sbx_cview *v);

/* A full read of c/ (sbx_etcd_range, on the calling thread; takes mu to
 * replace the view, then calls v->fn).  0, or sbx_etcd_range's error with
 * the view unchanged. */
int sbx_cview_resync(sbx_cview *v);

/* The watch's callback (arg: the view; an sbx_etcd_watch_fn, on the thread
 * that runs the watch): applies one put or delete under mu, then calls
 * v->fn.  Always 0 (the watch stops through v->stop). */
int sbx_cview_watch_cb(void *arg, bool put, const struct sbx_etcd_kv *kv, int64_t revision);

/* The revision a watch starts from after revision r (etcd's revisions are
 * int64: a garbage INT64_MAX must not overflow). */
int64_t sbx_cview_rev_after(int64_t r);

#endif
