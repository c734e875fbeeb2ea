/*
 * ws_snap.c — snapshots of persistent workspaces for a failover
 * (docs/persistence.md, "Across the cluster"): every --snapshot-interval a
 * thread of the cluster module (ws_snap_main) copies each persistent
 * workspace this shard owns whose image changed since its last snapshot —
 * consistent as of one instant: frozen (FIFREEZE) while it is copied
 * locally if its container runs, under the mount's lock if not
 * (sbx_ws_fork) — and pushes the copy to the partition's successor, the
 * shard a failover would give the partition to (workspace.put, kind
 * snapshot).  There it waits as <workspaces>/<id>/snap.img with its time
 * (snap.time); a start that finds the image gone restores it
 * (shard_work.c).  The owner notes each snapshot sent in <dir>/snap.sent
 * ("<taken ms> <image mtime s> <ns> <peer>"), which `status` reports as the
 * recovery point.  A destroy asks the successor to drop its snapshot.
 *
 * Threads: ws_snap_main runs beside the control thread (started and joined
 * with it, cluster.c); the loop fills in what only it knows (ownership,
 * successor, the running container's mount) through a posted round.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <nng/nng.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../container/workspace.h"
#include "../container/ws_xfer.h"
#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/place.h"
#include "../runtime/util.h"
#include "cluster.h"
#include "cluster_int.h"
#include "shard_int.h"

/* The most one snapshot's push may take. */
#define WS_SNAP_MS 300000

struct snap_item {
    char id[64];
    bool mine;              /* loop: the shard serves its partition */
    bool has_succ;
    struct shard_peer succ; /* loop: the partition's successor */
    int mnt;                /* loop: a dup of its running container's mount, or -1 (the
                               thread closes it) */
};

/* One round's question to the loop: made by the thread, filled by the loop
 * (round_fill); freed by the thread once done, or by the loop if the
 * thread abandoned it (stopping). */
struct snap_round {
    struct cluster *c;
    struct snap_item *it;
    size_t n;
    bool done, abandoned; /* under c->mu */
};

struct ws_drop {
    struct ws_drop *next;
    char id[64];
    struct shard_peer to;
};

static void
round_free(struct snap_round *r)
{
    for (size_t i = 0; i < r->n; i++)
        if (r->it[i].mnt >= 0)
            close(r->it[i].mnt);
    free(r->it);
    free(r);
}

static void
round_fill(sbx_loop *l, void *arg)
{
    struct snap_round *r = arg;
    struct cluster *c = r->c;
    struct shard *sh = c->sh;
    (void)l;
    for (size_t i = 0; i < r->n && !atomic_load(&c->stop); i++) {
        struct snap_item *it = &r->it[i];
        uint32_t p = sbx_place_partition(it->id, strlen(it->id));
        it->mine = c->lp[p].mine && c->lp[p].ready && !c->lp[p].moving;
        it->has_succ = it->mine && shard_successor(sh, p, &it->succ) == 0;
        struct actor *a = it->has_succ ? actor_get(sh, it->id, false) : NULL;
        if (a && a->cs == C_RUNNING && a->c.ws && a->c.ws_fd >= 0)
            it->mnt = fcntl(a->c.ws_fd, F_DUPFD_CLOEXEC, 0);
    }
    pthread_mutex_lock(&c->mu);
    bool gone = r->abandoned;
    r->done = true;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    if (gone)
        round_free(r);
}

/* The image's mtime, or -1. */
static int
img_mtime(const char *dir, struct timespec *ts)
{
    char img[1100];
    struct stat st;
    snprintf(img, sizeof(img), "%s/disk.img", dir);
    if (stat(img, &st) < 0)
        return -1;
    *ts = st.st_mtim;
    return 0;
}

/* Snapshot one workspace to its successor if its image changed since the
 * last one sent there. */
static void
snap_one(struct cluster *c, struct snap_item *it)
{
    struct shard *sh = c->sh;
    char dir[1024], sent[1100], tmp[1100], tmpsent[1100], why[512] = "";
    if (sbx_ws_dir(sh->conf.data, it->id, dir, sizeof(dir)) != 0)
        return;
    if (it->mnt >= 0)
        syncfs(it->mnt); /* written back to the image: its mtime tells */
    struct timespec m0;
    if (img_mtime(dir, &m0) != 0)
        return;
    snprintf(sent, sizeof(sent), "%s/snap.sent", dir);
    FILE *f = fopen(sent, "re");
    if (f) {
        long long t = 0, s = 0, ns = 0;
        char peer[64] = "";
        int k = fscanf(f, "%lld %lld %lld %63s", &t, &s, &ns, peer);
        fclose(f);
        if (k == 4 && s == (long long)m0.tv_sec && ns == (long long)m0.tv_nsec &&
            !strcmp(peer, it->succ.name))
            return; /* unchanged since the snapshot that peer holds */
    }
    snprintf(tmp, sizeof(tmp), "%s/snapshots/%s", sh->conf.data, it->id);
    sbx_rm_rf(tmp);
    int64_t taken = sbx_wall_ms(), copied = 0, frozen = 0;
    const char *dst[1] = {tmp};
    int rc = sbx_ws_fork(dir, it->mnt, dst, 1, &copied, &frozen, why, sizeof(why));
    if (it->mnt >= 0)
        close(it->mnt); /* at once: it keeps the mount (and the image's lock) alive */
    it->mnt = -1;
    struct timespec m1;
    if (rc == 0 && img_mtime(dir, &m1) != 0)
        rc = -ENOENT; /* destroyed meanwhile */
    if (rc) {
        sbx_log_warn("shard %s: snapshot of the workspace of %s: %s", sh->conf.name, it->id,
                     why[0] ? why : strerror(-rc));
        sbx_rm_rf(tmp);
        return;
    }
    nng_socket s;
    _cleanup_err_ sbx_err_t err = NULL;
    if (sbx_nng_req_dial(&s, it->succ.url, sh->conf.sec, NULL) != 0) {
        rc = sbx_err_make(&err, SBX_E_SHARD_UNAVAILABLE, "dial %s", it->succ.url);
    } else {
        bool pushed = false;
        rc = cluster_ws_push(sh, s, it->succ.name, it->id, tmp, SBX_WS_SNAP, taken,
                             sbx_mono_ms() + WS_SNAP_MS, NULL, 0, &pushed, &err);
        nng_close(s);
        if (rc == 0 && !pushed)
            rc = sbx_err_make(&err, SBX_E_STORAGE, "the copy %s has no image", tmp);
    }
    sbx_rm_rf(tmp);
    if (rc) {
        sbx_log_warn("shard %s: snapshot of the workspace of %s to %s: %s", sh->conf.name,
                     it->id, it->succ.name, sbx_err_msg(err));
        return;
    }
    /* Noted with the image's mtime after the copy (the freeze writes too). */
    snprintf(tmpsent, sizeof(tmpsent), "%s.new", sent);
    f = fopen(tmpsent, "we");
    if (f) {
        fprintf(f, "%lld %lld %lld %s\n", (long long)taken, (long long)m1.tv_sec,
                (long long)m1.tv_nsec, it->succ.name);
        if (fclose(f) != 0 || rename(tmpsent, sent) != 0)
            unlink(tmpsent);
    }
    sbx_log_info("shard %s: workspace of %s snapshotted to %s (%lld bytes copied, frozen %lld ms)",
                 sh->conf.name, it->id, it->succ.name, (long long)copied, (long long)frozen);
}

static void
snap_round(struct cluster *c)
{
    struct shard *sh = c->sh;
    char top[1100];
    snprintf(top, sizeof(top), "%s/workspaces", sh->conf.data);
    DIR *d = opendir(top);
    if (!d)
        return;
    struct snap_round *r = sbx_xcalloc(1, sizeof(*r));
    r->c = c;
    size_t cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char dir[1024], img[1100];
        if (de->d_name[0] == '.' || strlen(de->d_name) >= sizeof(r->it[0].id) ||
            sbx_ws_dir(sh->conf.data, de->d_name, dir, sizeof(dir)) != 0)
            continue;
        snprintf(img, sizeof(img), "%s/disk.img", dir);
        if (access(img, F_OK) != 0)
            continue; /* a snapshot kept for another node, or nothing */
        if (r->n == cap) {
            cap = cap ? 2 * cap : 16;
            r->it = sbx_xrealloc(r->it, cap * sizeof(*r->it));
        }
        struct snap_item *it = &r->it[r->n++];
        memset(it, 0, sizeof(*it));
        snprintf(it->id, sizeof(it->id), "%s", de->d_name);
        it->mnt = -1;
    }
    closedir(d);
    if (r->n == 0) {
        round_free(r);
        return;
    }
    sbx_loop_post(sh->loop, round_fill, r);
    pthread_mutex_lock(&c->mu);
    while (!r->done && !atomic_load(&c->stop))
        pthread_cond_wait(&c->cv, &c->mu);
    bool done = r->done;
    if (!done)
        r->abandoned = true; /* the loop frees it */
    pthread_mutex_unlock(&c->mu);
    if (!done)
        return;
    for (size_t i = 0; i < r->n && !atomic_load(&c->stop); i++)
        if (r->it[i].has_succ)
            snap_one(c, &r->it[i]);
    round_free(r);
}

static void
send_drop(struct cluster *c, const struct ws_drop *dr)
{
    struct shard *sh = c->sh;
    nng_socket s;
    if (sbx_nng_req_dial(&s, dr->to.url, sh->conf.sec, NULL) != 0)
        return;
    sbx_enc a;
    sbx_enc_init(&a);
    sbx_enc_map(&a);
    sbx_enc_kstr(&a, "id", dr->id);
    sbx_enc_kstr(&a, "phase", "drop");
    sbx_enc_kstr(&a, "kind", "snapshot");
    sbx_enc_end(&a);
    char *args, *buf = NULL;
    size_t al, bl;
    if (sbx_enc_finish(&a, &args, &al) == 0) {
        sbx_msg m;
        if (shard_peer_call(s, "workspace.put", args, al, 10000, &buf, &bl, &m, NULL) == 0) {
            sbx_wire_msg_free(&m);
            free(buf);
        }
        free(args);
    }
    nng_close(s);
}

void *
ws_snap_main(void *arg)
{
    struct cluster *c = arg;
    struct shard *sh = c->sh;
    int64_t next = sbx_mono_ms() + sh->conf.snapshot_interval;
    char tmp[1100];
    snprintf(tmp, sizeof(tmp), "%s/snapshots", sh->conf.data);
    sbx_rm_rf(tmp); /* copies a killed process left */
    for (;;) {
        pthread_mutex_lock(&c->mu);
        while (!atomic_load(&c->stop) && !c->ws_drops && sbx_mono_ms() < next) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            int64_t left = SBX_MIN(next - sbx_mono_ms(), 1000);
            ts.tv_sec += left / 1000;
            ts.tv_nsec += (left % 1000) * 1000000;
            if (ts.tv_nsec >= 1000000000) {
                ts.tv_sec++;
                ts.tv_nsec -= 1000000000;
            }
            pthread_cond_timedwait(&c->cv, &c->mu, &ts);
        }
        struct ws_drop *drops = c->ws_drops;
        c->ws_drops = NULL;
        pthread_mutex_unlock(&c->mu);
        while (drops) {
            struct ws_drop *dr = drops;
            drops = dr->next;
            if (!atomic_load(&c->stop))
                send_drop(c, dr);
            free(dr);
        }
        if (atomic_load(&c->stop))
            break;
        if (sbx_mono_ms() >= next) {
            snap_round(c);
            next = sbx_mono_ms() + sh->conf.snapshot_interval;
        }
    }
    return NULL;
}

void
cluster_ws_snap_forget(struct shard *sh, const char *id)
{
    struct cluster *c = cluster_of(sh);
    if (!c || sh->conf.snapshot_interval <= 0)
        return;
    struct ws_drop *dr = sbx_xcalloc(1, sizeof(*dr));
    snprintf(dr->id, sizeof(dr->id), "%s", id);
    if (shard_successor(sh, sbx_place_partition(id, strlen(id)), &dr->to) != 0) {
        free(dr);
        return;
    }
    pthread_mutex_lock(&c->mu);
    dr->next = c->ws_drops;
    c->ws_drops = dr;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
}

void
cluster_ws_snap_free(struct cluster *c)
{
    while (c->ws_drops) {
        struct ws_drop *dr = c->ws_drops;
        c->ws_drops = dr->next;
        free(dr);
    }
}

void
cluster_ws_status(struct shard *sh, const char *id, sbx_enc *e)
{
    char dir[1024], p[1100];
    if (sbx_ws_dir(sh->conf.data, id, dir, sizeof(dir)) != 0)
        return;
    int64_t now = sbx_wall_ms();
    long long t = 0, at = 0, s, ns;
    char peer[64] = "";
    snprintf(p, sizeof(p), "%s/snap.sent", dir);
    FILE *f = fopen(p, "re");
    if (f) {
        if (fscanf(f, "%lld %lld %lld %63s", &t, &s, &ns, peer) == 4 && t > 0) {
            sbx_enc_kint(e, "snapshotTakenMs", t);
            sbx_enc_kint(e, "snapshotAgeMs", now - t);
            sbx_enc_kstr(e, "snapshotOn", peer);
        }
        fclose(f);
    }
    snprintf(p, sizeof(p), "%s/restored.time", dir);
    if ((f = fopen(p, "re")) != NULL) {
        if (fscanf(f, "%lld %lld", &t, &at) == 2 && t > 0) {
            sbx_enc_kmap(e, "restoredFromSnapshot");
            sbx_enc_kint(e, "takenMs", t);
            sbx_enc_kint(e, "restoredMs", at);
            sbx_enc_kint(e, "ageMs", at - t);
            sbx_enc_end(e);
        }
        fclose(f);
    }
}
