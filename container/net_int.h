/*
 * net_int.h — internal to container/net*.c: the nft text builders of
 * net_policy.c used by net.c.
 */
#ifndef SBX_NET_INT_H
#define SBX_NET_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "net.h"

/* A growing text buffer (heap p, owned by whoever made it; free(p)). */
struct sbx_net_buf {
    char *p;
    size_t n, cap;
};

/* sbx_net_buf_add — append printf output (aborts on OOM, like sbx_xmalloc). */
void sbx_net_buf_add(struct sbx_net_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* The private ranges (NULL-terminated) and whether a rule lies inside one. */
extern const char *const sbx_net_private[];
bool sbx_net_is_private(const struct sbx_net_rule *r);

/* sbx_net_render_router — the router's table (`nft -f` text); range is the
 * deployment's sandbox range, always denied as a destination. */
void sbx_net_render_router(struct sbx_net_buf *b, const char *range);

/* sbx_net_render_slot — the commands that add slot k's counters o/i/n<k>,
 * chains so<k> (from the sandbox) and si<k> (to it) and map elements. */
void sbx_net_render_slot(struct sbx_net_buf *b, int k, uint32_t addr,
                         const struct sbx_net_policy *p);

#endif
