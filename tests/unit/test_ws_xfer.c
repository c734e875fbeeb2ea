/*
 * test_ws_xfer.c — a workspace image sent and received in chunks
 * (container/ws_xfer.h): the copy is byte-identical and as sparse as the
 * source; a corrupt chunk, a chunk past the image, and a missing or
 * repeated chunk are refused and leave no image; a snapshot lands as
 * snap.img with its time and is dropped with its directory.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "../../container/ws_xfer.h"
#include "../../runtime/util.h"

#define MiB (1u << 20)
#define CHUNK (4u * MiB)

static char top[64], src[128], dst[128];

static void
setup(void)
{
    snprintf(top, sizeof(top), "/tmp/sbx-wsx-XXXXXX");
    cr_assert_not_null(mkdtemp(top));
    snprintf(src, sizeof(src), "%s/src", top);
    snprintf(dst, sizeof(dst), "%s/dst", top);
    cr_assert_eq(mkdir(src, 0700), 0);
}

static void
teardown(void)
{
    sbx_rm_rf(top);
}

TestSuite(ws_xfer, .init = setup, .fini = teardown);

/* A sparse 64 MiB image with data at 0 (10 KB), 10 MiB (5 MiB: two
 * chunks) and 60 MiB (1 byte); the bytes are a function of the offset. */
static void
make_image(void)
{
    char p[200];
    snprintf(p, sizeof(p), "%s/disk.img", src);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, 64 * MiB), 0);
    struct { off_t off; size_t len; } parts[] = {{0, 10000}, {10 * MiB, 5 * MiB}, {60 * MiB, 1}};
    for (size_t i = 0; i < 3; i++) {
        char *b = malloc(parts[i].len);
        for (size_t k = 0; k < parts[i].len; k++)
            b[k] = (char)((parts[i].off + (off_t)k) * 131 % 251 + 1);
        cr_assert_eq(pwrite(fd, b, parts[i].len, parts[i].off), (ssize_t)parts[i].len);
        free(b);
    }
    close(fd);
}

/* Every chunk of src into dst (kind k); skip: index of a chunk not sent
 * (-1 none), dup: one sent twice (-1 none), flip: one whose byte 0 is
 * changed after its sha256 (-1 none).  Returns the first error, the
 * transfer's digest in d. */
static int
send_all(enum sbx_ws_kind k, int skip, int dup, int flip, uint8_t d[SBX_WS_XFER_SHA],
         uint64_t *sent)
{
    struct sbx_ws_src s;
    char why[512];
    cr_assert_eq(sbx_ws_src_open(src, &s, why, sizeof(why)), 0, "%s", why);
    cr_assert_eq(sbx_ws_recv_begin(dst, k, s.size, why, sizeof(why)), 0, "%s", why);
    char *buf = malloc(CHUNK);
    int rc = 0;
    for (int i = 0; rc == 0; i++) {
        uint64_t off;
        size_t len;
        uint8_t sha[SBX_WS_XFER_SHA];
        cr_assert_eq(sbx_ws_src_next(&s, buf, CHUNK, &off, &len, sha, why, sizeof(why)), 0);
        if (len == 0)
            break;
        if (i == skip)
            continue;
        if (i == flip)
            buf[0] ^= 1;
        rc = sbx_ws_recv_chunk(dst, k, off, buf, len, sha, why, sizeof(why));
        if (rc == 0 && i == dup)
            rc = sbx_ws_recv_chunk(dst, k, off, buf, len, sha, why, sizeof(why));
    }
    sbx_ws_src_digest(&s, d);
    *sent = s.sent;
    free(buf);
    sbx_ws_src_close(&s);
    return rc;
}

static bool
same_file(const char *a, const char *b)
{
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    cr_assert(fa && fb, "%s %s", a, b);
    bool same = true;
    int ca, cb;
    do {
        ca = getc(fa);
        cb = getc(fb);
        same = ca == cb;
    } while (same && ca != EOF);
    fclose(fa);
    fclose(fb);
    return same;
}

Test(ws_xfer, copy_is_identical_and_sparse)
{
    make_image();
    uint8_t d[SBX_WS_XFER_SHA];
    uint64_t sent;
    char why[512], a[200], b[200];
    cr_assert_eq(send_all(SBX_WS_MOVE, -1, -1, -1, d, &sent), 0);
    /* Only the data extents travel (the file system may round them to its
     * blocks): not the 64 MiB. */
    cr_assert(sent >= 5 * MiB + 10001 && sent < 8 * MiB, "sent %llu", (unsigned long long)sent);
    cr_assert_eq(sbx_ws_recv_commit(dst, SBX_WS_MOVE, d, 0, why, sizeof(why)), 0, "%s", why);
    snprintf(a, sizeof(a), "%s/disk.img", src);
    snprintf(b, sizeof(b), "%s/disk.img", dst);
    cr_assert(same_file(a, b));
    struct stat st;
    cr_assert_eq(stat(b, &st), 0);
    cr_assert_eq(st.st_size, 64 * MiB);
    cr_assert_lt(st.st_blocks * 512, 8 * MiB, "the copy is not sparse");
    snprintf(b, sizeof(b), "%s/disk.img.in", dst);
    cr_assert_neq(access(b, F_OK), 0, "the transfer's file was left");
}

Test(ws_xfer, corrupt_chunk_is_refused)
{
    make_image();
    uint8_t d[SBX_WS_XFER_SHA];
    uint64_t sent;
    cr_assert_eq(send_all(SBX_WS_MOVE, -1, -1, 1, d, &sent), -EBADMSG);
}

Test(ws_xfer, missing_or_repeated_chunk_fails_the_commit)
{
    make_image();
    uint8_t d[SBX_WS_XFER_SHA];
    uint64_t sent;
    char why[512], p[200];
    snprintf(p, sizeof(p), "%s/disk.img", dst);
    cr_assert_eq(send_all(SBX_WS_MOVE, 1, -1, -1, d, &sent), 0);
    cr_assert_eq(sbx_ws_recv_commit(dst, SBX_WS_MOVE, d, 0, why, sizeof(why)), -EBADMSG);
    cr_assert_neq(access(p, F_OK), 0, "an incomplete image was installed");
    cr_assert_eq(send_all(SBX_WS_MOVE, -1, 2, -1, d, &sent), 0);
    cr_assert_eq(sbx_ws_recv_commit(dst, SBX_WS_MOVE, d, 0, why, sizeof(why)), -EBADMSG);
    cr_assert_neq(access(p, F_OK), 0, "an image with a repeated chunk was installed");
    sbx_ws_recv_abort(dst, SBX_WS_MOVE);
    snprintf(p, sizeof(p), "%s/disk.img.in", dst);
    cr_assert_neq(access(p, F_OK), 0, "abort left the transfer's file");
}

Test(ws_xfer, chunk_past_the_image_and_chunk_without_begin)
{
    char why[512];
    uint8_t sha[SBX_WS_XFER_SHA] = {0};
    cr_assert_eq(sbx_ws_recv_chunk(dst, SBX_WS_MOVE, 0, "x", 1, sha, why, sizeof(why)), -ENOENT);
    cr_assert_eq(sbx_ws_recv_begin(dst, SBX_WS_MOVE, 4096, why, sizeof(why)), 0);
    cr_assert_eq(sbx_ws_recv_chunk(dst, SBX_WS_MOVE, 4096, "x", 1, sha, why, sizeof(why)),
                 -ERANGE);
}

Test(ws_xfer, snapshot_lands_beside_and_is_dropped)
{
    make_image();
    uint8_t d[SBX_WS_XFER_SHA];
    uint64_t sent;
    char why[512], p[200];
    cr_assert_eq(send_all(SBX_WS_SNAP, -1, -1, -1, d, &sent), 0);
    cr_assert_eq(sbx_ws_recv_commit(dst, SBX_WS_SNAP, d, 1234567, why, sizeof(why)), 0, "%s",
                 why);
    snprintf(p, sizeof(p), "%s/disk.img", dst);
    cr_assert_neq(access(p, F_OK), 0, "a snapshot became the workspace");
    snprintf(p, sizeof(p), "%s/snap.time", dst);
    FILE *f = fopen(p, "r");
    cr_assert_not_null(f);
    long long t = 0;
    cr_assert_eq(fscanf(f, "%lld", &t), 1);
    fclose(f);
    cr_assert_eq(t, 1234567);
    sbx_ws_snap_drop(dst);
    cr_assert_neq(access(dst, F_OK), 0, "drop left the directory");
}
