/*
 * fuzz_relay.c — the shard's preview relay handshake (actors/relay.c,
 * linked; shard_relay_conn_main through actors/relay_int.h): SOCKS5 (RFC
 * 1928) with username/password authentication (RFC 1929), from whoever can
 * connect to the relay's port.
 *
 * shard_relay_conn_main runs on one end of a socketpair holding the input
 * (then EOF), for a shard with or without a relay secret.  The loop thread
 * is not there: sbx_loop_post is wrapped (-Wl,--wrap, see the Makefile) by
 * a fake that runs the query callback at once and records what the relay
 * asked, and actor_get finds no sandbox, so a well-formed request ends with
 * "host unreachable" before any namespace is entered.
 *
 * Input: byte 0 selects the secret (none, or a fixed one), the rest is what
 * the client sends.
 *
 * Properties: the bytes the relay answers are exactly those of a strict
 * model of the exchange — the method choice (2 when offered, else 0xff and
 * the end), the authentication status (success exactly when the password's
 * bytes are the secret's, or no secret is set), then for CONNECT to a
 * domain "<decimal generation>.<sandbox ID>" with a port of 1-65535 one
 * question to the loop thread with exactly that ID, port and generation,
 * 7 for another command or address type, 1 for any other destination; an
 * ID asked about passes sbx_id_check.
 */
#include <stdio.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../actors/relay_int.h"
#include "../../actors/shard_int.h"
#include "../../runtime/relay.h"
#include "../../runtime/id.h"
#include "fuzz.h"

static const char SECRET[] = "s3cret-relay-key";

/* What the relay asked the loop thread. */
static struct {
    int n;
    char id[64];
    int port;
    uint64_t gen;
} Q;

/* relay.o's calls to sbx_loop_post come here (-Wl,--wrap=sbx_loop_post). */
void __wrap_sbx_loop_post(sbx_loop *l, sbx_post_cb cb, void *arg);

void
__wrap_sbx_loop_post(sbx_loop *l, sbx_post_cb cb, void *arg)
{
    struct shard_relay_query *q = arg;
    if (!q->end) {
        Q.n++;
        snprintf(Q.id, sizeof(Q.id), "%s", q->id);
        Q.port = q->port;
        Q.gen = q->gen;
    }
    cb(l, arg); /* the loop thread, now */
}

/* The actor table: no sandbox is running here. */
struct actor *
actor_get(struct shard *sh, const char *id, bool load)
{
    (void)sh;
    (void)id;
    (void)load;
    return NULL;
}

bool
actor_port_exposed(struct actor *a, int port)
{
    (void)a;
    (void)port;
    return false;
}

/* ------------------------------------------------------------------------------ */
/* The model. */

struct model {
    uint8_t out[16];
    size_t nout;
    bool ask;            /* a question to the loop thread */
    char id[256];
    int port;
    uint64_t gen;
};

static void
put(struct model *m, const uint8_t *b, size_t n)
{
    memcpy(m->out + m->nout, b, n);
    m->nout += n;
}

static void
model(const uint8_t *d, size_t n, const char *secret, struct model *m)
{
    memset(m, 0, sizeof(*m));
    size_t o = 0;
#define NEED(k)                                                                               \
    do {                                                                                      \
        if (n - o < (size_t)(k))                                                              \
            return;                                                                           \
    } while (0)
    /* greeting: VER NMETHODS METHODS */
    NEED(2);
    if (d[0] != 5 || d[1] == 0)
        return;
    size_t nm = d[1];
    o = 2;
    NEED(nm);
    bool up = memchr(d + o, 2, nm) != NULL;
    o += nm;
    put(m, (const uint8_t[]){5, up ? 2 : 0xff}, 2);
    if (!up)
        return;
    /* RFC 1929: VER ULEN UNAME PLEN PASSWD */
    NEED(2);
    if (d[o] != 1)
        return;
    size_t ul = d[o + 1];
    o += 2;
    NEED(ul + 1);
    o += ul;
    size_t pl = d[o++];
    NEED(pl);
    bool ok = !secret || (pl == strlen(secret) && !memcmp(d + o, secret, pl));
    o += pl;
    put(m, (const uint8_t[]){1, ok ? 0 : 1}, 2);
    if (!ok)
        return;
    /* VER CMD RSV ATYP, then for ATYP 3: LEN DOMAIN PORT */
    NEED(5);
    if (d[o] != 5)
        return;
    static const uint8_t rep[10] = {5, 0, 0, 1};
    uint8_t r[10];
    memcpy(r, rep, 10);
    if (d[o + 1] != 1 || d[o + 3] != 3) {
        r[1] = 7;
        put(m, r, 10);
        return;
    }
    size_t dl = d[o + 4];
    o += 5;
    NEED(dl + 2);
    const uint8_t *dom = d + o;
    int port = d[o + dl] << 8 | d[o + dl + 1];
    /* "<generation>.<id>": decimal digits, a dot, a sandbox ID. */
    const uint8_t *dot = memchr(dom, '.', dl);
    size_t gl = dot ? (size_t)(dot - dom) : 0;
    bool good = dot && gl >= 1 && port >= 1;
    uint64_t gen = 0;
    for (size_t i = 0; good && i < gl; i++)
        good = dom[i] >= '0' && dom[i] <= '9' && !__builtin_mul_overflow(gen, 10, &gen) &&
               !__builtin_add_overflow(gen, (uint64_t)(dom[i] - '0'), &gen);
    char why[160];
    size_t il = dot ? dl - gl - 1 : 0;
    good = good && sbx_id_check((const char *)dot + 1, il, why, sizeof(why)) == 0;
    if (!good) {
        r[1] = SBX_SOCKS_FAIL;
        put(m, r, 10);
        return;
    }
    m->ask = true;
    memcpy(m->id, dot + 1, il);
    m->id[il] = 0;
    m->port = port;
    m->gen = gen;
    r[1] = SBX_SOCKS_HOST_UNREACHABLE; /* no sandbox runs here */
    put(m, r, 10);
#undef NEED
}

/* ------------------------------------------------------------------------------ */

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1 || size > 4096)
        return 0;
    const char *secret = data[0] & 1 ? SECRET : NULL;
    const uint8_t *d = data + 1;
    size_t n = size - 1;

    static struct shard *sh;
    if (!sh) {
        sh = sbx_xcalloc(1, sizeof(*sh));
        pthread_mutex_init(&sh->relay.mu, NULL);
        pthread_cond_init(&sh->relay.cv, NULL);
    }
    sh->conf.relay_secret = (char *)secret;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        abort();
    if (sbx_write_full(sv[1], d, n) != 0)
        abort();
    shutdown(sv[1], SHUT_WR); /* the client is done: reads see EOF, not the 5 s deadline */
    struct shard_relay_conn *c = sbx_xcalloc(1, sizeof(*c));
    c->sh = sh;
    c->fd = sv[0];
    c->up = -1;
    c->next = sh->relay.conns;
    sh->relay.conns = c;
    sh->relay.nconns++;
    memset(&Q, 0, sizeof(Q));
    shard_relay_conn_main(c); /* frees c, closes sv[0] */
    FUZZ_CHECK(sh->relay.nconns == 0 && !sh->relay.conns, "the connection is still listed");

    uint8_t got[64];
    size_t ng = 0;
    ssize_t r;
    while (ng < sizeof(got) && (r = read(sv[1], got + ng, sizeof(got) - ng)) > 0)
        ng += (size_t)r;
    close(sv[1]);

    struct model m;
    model(d, n, secret, &m);
    FUZZ_CHECK(ng == m.nout && !memcmp(got, m.out, ng),
               "answered %zu bytes (%02x %02x %02x %02x …), the model %zu (%02x %02x %02x %02x …)",
               ng, got[0], got[1], got[2], got[3], m.nout, m.out[0], m.out[1], m.out[2],
               m.out[3]);
    FUZZ_CHECK(Q.n == (m.ask ? 1 : 0), "%d questions to the loop thread", Q.n);
    if (Q.n) {
        char why[160];
        FUZZ_CHECK(sbx_id_check(Q.id, strlen(Q.id), why, sizeof(why)) == 0, "asked about '%s'",
                   Q.id);
        FUZZ_CHECK(!strcmp(Q.id, m.id) && Q.port == m.port && Q.gen == m.gen,
                   "asked about %llu.%s:%d, want %llu.%s:%d", (unsigned long long)Q.gen, Q.id,
                   Q.port, (unsigned long long)m.gen, m.id, m.port);
    }
    return 0;
}
