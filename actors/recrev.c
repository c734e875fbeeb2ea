/*
 * recrev.c — see recrev.h.  Open addressing with linear probing over a
 * power-of-two table kept at most half full; entries are never removed
 * one by one (a deleted record is kept at revision 0).
 */
#include "recrev.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "../runtime/util.h"

struct rent {
    char id[64];   /* "" : free slot */
    int64_t epoch;
    int64_t mod;
};

struct recrev {
    struct rent *t;
    size_t cap; /* power of two */
    size_t n;
};

recrev *
recrev_new(void)
{
    recrev *r = sbx_xcalloc(1, sizeof(*r));
    r->cap = 1024;
    r->t = sbx_xcalloc(r->cap, sizeof(*r->t));
    return r;
}

void
recrev_free(recrev *r)
{
    if (!r)
        return;
    free(r->t);
    free(r);
}

/* The slot of id: its entry, or the free slot it would take. */
static struct rent *
slot(const struct rent *t, size_t cap, const char *id)
{
    size_t i = (size_t)XXH64(id, strlen(id), 0) & (cap - 1);
    while (t[i].id[0] && strcmp(t[i].id, id))
        i = (i + 1) & (cap - 1);
    return (struct rent *)&t[i];
}

int
recrev_get(const recrev *r, const char *id, int64_t epoch, int64_t *mod)
{
    const struct rent *e = slot(r->t, r->cap, id);
    if (!e->id[0] || e->epoch != epoch)
        return -ENOENT;
    *mod = e->mod;
    return 0;
}

void
recrev_set(recrev *r, const char *id, int64_t epoch, int64_t mod)
{
    if (!id[0] || strlen(id) >= sizeof(r->t[0].id))
        return;
    struct rent *e = slot(r->t, r->cap, id);
    if (!e->id[0]) {
        if (r->n + 1 > RECREV_MAX) {
            memset(r->t, 0, r->cap * sizeof(*r->t));
            r->n = 0;
            e = slot(r->t, r->cap, id);
        } else if (2 * (r->n + 1) > r->cap) {
            size_t ncap = r->cap * 2;
            struct rent *nt = sbx_xcalloc(ncap, sizeof(*nt));
            for (size_t i = 0; i < r->cap; i++)
                if (r->t[i].id[0])
                    *slot(nt, ncap, r->t[i].id) = r->t[i];
            free(r->t);
            r->t = nt;
            r->cap = ncap;
            e = slot(r->t, r->cap, id);
        }
        snprintf(e->id, sizeof(e->id), "%s", id);
        r->n++;
    }
    e->epoch = epoch;
    e->mod = mod;
}
