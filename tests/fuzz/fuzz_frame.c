/*
 * fuzz_frame.c — the length-prefixed frame reader (runtime/frame.c) as the
 * shard and the agent use it on their channel: bytes arrive on a
 * non-blocking fd in pieces of any size, sbx_frame_read takes what is there,
 * sbx_frame_next hands out complete frames.
 *
 * Input: byte 0 picks the frame limit, the next 16 bytes are chunk sizes
 * (cycled), the rest is the byte stream.  The stream is written to a
 * socketpair chunk by chunk and drained after each chunk.
 *
 * Properties: the frames handed out are exactly those of a reference parse
 * of the whole stream (same count, bytes and order); -EMSGSIZE comes exactly
 * when the reference meets a length above the limit, and nothing after it
 * is handed out; an incomplete tail yields no frame.  The frames written
 * back through sbx_frame_queue/sbx_frame_flush read back identically.
 */
#include <errno.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include "../../runtime/frame.h"
#include "../../runtime/util.h"
#include "../../runtime/wire.h"
#include "fuzz.h"

struct ref {
    size_t *off, *len; /* n/4 + 1 entries: every frame takes at least 4 bytes */
    size_t n;
    bool oversized; /* the stream announces a frame above the limit */
};

static void
reference(const uint8_t *p, size_t n, size_t max, struct ref *r)
{
    size_t o = 0;
    r->n = 0;
    r->oversized = false;
    r->off = sbx_xcalloc(n / 4 + 1, sizeof(size_t));
    r->len = sbx_xcalloc(n / 4 + 1, sizeof(size_t));
    while (n - o >= 4) {
        size_t len = ((size_t)p[o] << 24) | ((size_t)p[o + 1] << 16) | ((size_t)p[o + 2] << 8) |
                     p[o + 3];
        if (len > max) {
            r->oversized = true;
            return;
        }
        if (n - o - 4 < len)
            return;
        r->off[r->n] = o + 4;
        r->len[r->n] = len;
        r->n++;
        o += 4 + len;
    }
}

/* The channel is a SOCK_STREAM socketpair, as between shard and agent. */
static void
channel(int fds[2])
{
    int big = 1 << 20;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0, fds) < 0)
        abort();
    setsockopt(fds[1], SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
    setsockopt(fds[0], SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const size_t limits[] = {0, 1, 3, 4, 5, 16, 100, 255, 256, 4096, 65535, 65536,
                                    65537, 1u << 20, 4u << 20, SBX_WIRE_MAX_FRAME};
    if (size < 17 || size > (1u << 20))
        return 0;
    size_t max = limits[data[0] % SBX_ARRAY_LEN(limits)];
    const uint8_t *chunks = data + 1;
    const uint8_t *s = data + 17;
    size_t n = size - 17;
    struct ref ref;
    reference(s, n, max, &ref);

    int fds[2];
    channel(fds);
    sbx_frame_reader rd;
    sbx_frame_reader_init(&rd, max);
    size_t got = 0, sent = 0;
    int ci = 0, k = 0;
    bool emsg = false;
    while (sent < n && !emsg) {
        /* Chunk sizes 1..65536, skewed towards small ones. */
        uint8_t c = chunks[ci++ % 16];
        size_t want = c < 128 ? (size_t)c + 1 : c < 240 ? (size_t)(c - 127) * 64 : 65536;
        want = SBX_MIN(want, n - sent);
        ssize_t w = write(fds[1], s + sent, want);
        FUZZ_CHECK(w > 0, "channel write failed");
        sent += (size_t)w;
        for (;;) {
            ssize_t r = sbx_frame_read(&rd, fds[0]);
            if (r == -EAGAIN)
                break;
            FUZZ_CHECK(r > 0, "sbx_frame_read returned %zd", r);
            const char *p;
            size_t fn;
            while ((k = sbx_frame_next(&rd, &p, &fn)) == 1) {
                FUZZ_CHECK(got < ref.n, "frame %zu handed out; the stream has %zu", got, ref.n);
                FUZZ_CHECK(fn == ref.len[got] && memcmp(p, s + ref.off[got], fn) == 0,
                           "frame %zu differs (%zu bytes, expected %zu)", got, fn, ref.len[got]);
                got++;
            }
            if (k < 0) {
                FUZZ_CHECK(k == -EMSGSIZE, "sbx_frame_next returned %d", k);
                emsg = true;
                break;
            }
        }
    }
    if (!emsg) {
        /* Everything was delivered: ask once more, as a caller would after EOF. */
        const char *p;
        size_t fn;
        k = sbx_frame_next(&rd, &p, &fn);
        FUZZ_CHECK(k == 0 || k == -EMSGSIZE, "extra frame after the end");
        emsg = k == -EMSGSIZE;
    }
    FUZZ_CHECK(got == ref.n, "%zu frames handed out, the stream has %zu", got, ref.n);
    FUZZ_CHECK(emsg == ref.oversized, "oversized: reader %d, reference %d", emsg, ref.oversized);
    sbx_frame_reader_free(&rd);
    close(fds[0]);
    close(fds[1]);

    /* Writer → reader round trip of the reference frames. */
    if (ref.n && max >= 1) {
        int sp[2];
        channel(sp);
        sbx_frame_writer wr;
        sbx_frame_writer_init(&wr);
        sbx_frame_reader_init(&rd, max);
        size_t back = 0;
        for (size_t i = 0; i < ref.n; i++)
            sbx_frame_queue(&wr, s + ref.off[i], ref.len[i]);
        for (int guard = 0; back < ref.n && guard < 1000000; guard++) {
            int fr = sbx_frame_flush(&wr, sp[1]);
            FUZZ_CHECK(fr >= 0, "sbx_frame_flush failed: %d", fr);
            ssize_t r = sbx_frame_read(&rd, sp[0]);
            FUZZ_CHECK(r > 0 || r == -EAGAIN, "read back failed: %zd", r);
            const char *p;
            size_t fn;
            while (sbx_frame_next(&rd, &p, &fn) == 1) {
                FUZZ_CHECK(back < ref.n && fn == ref.len[back] &&
                               memcmp(p, s + ref.off[back], fn) == 0,
                           "frame %zu differs after the writer", back);
                back++;
            }
        }
        FUZZ_CHECK(back == ref.n, "%zu of %zu frames came back", back, ref.n);
        FUZZ_CHECK(sbx_frame_pending(&wr) == 0, "writer still holds bytes");
        sbx_frame_writer_free(&wr);
        sbx_frame_reader_free(&rd);
        close(sp[0]);
        close(sp[1]);
    }
    free(ref.off);
    free(ref.len);
    return 0;
}
