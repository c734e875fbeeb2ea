/*
 * fuzz_record.c — the sandbox record codec (actors/record.c).  Records
 * come back from LMDB at every actor load and at start-up (fix_one, list),
 * so a damaged or foreign value on disk must be an ordinary error.
 *
 * Properties: a record that decodes has a NUL-terminated id and state that
 * fit their arrays and blobs that are msgpack maps; encoding it and decoding
 * that gives the same fields (what a shard writes back after any update is
 * what it read), and a second encoding is byte-identical to the first.
 */
#include "../../actors/record.h"
#include "../../runtime/err.h"
#include "../../runtime/wire.h"
#include "fuzz.h"

static void
same(const struct sbx_record *a, const struct sbx_record *b)
{
    FUZZ_CHECK(!strcmp(a->id, b->id) && !strcmp(a->state, b->state), "id/state changed");
    FUZZ_CHECK(a->created_ms == b->created_ms && a->updated_ms == b->updated_ms, "times changed");
    FUZZ_CHECK(a->generation == b->generation && a->restarts == b->restarts, "counters changed");
    FUZZ_CHECK(a->limits.memory == b->limits.memory && a->limits.pids == b->limits.pids &&
                   a->limits.cpu_milli == b->limits.cpu_milli,
               "limits changed");
    FUZZ_CHECK(a->env_len == b->env_len && (!a->env_len || !memcmp(a->env, b->env, a->env_len)),
               "env blob changed");
    FUZZ_CHECK(a->config_len == b->config_len &&
                   (!a->config_len || !memcmp(a->config, b->config, a->config_len)),
               "config blob changed");
}

static void
blob_is_map(const char *p, size_t n)
{
    sbx_msg m;
    if (!p)
        return;
    FUZZ_CHECK(sbx_wire_decode(&m, p, n, &sbx_wire_limits_request) == 0, "blob is not a map");
    sbx_wire_msg_free(&m);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (1u << 20))
        return 0;
    char *buf = fuzz_copy(data, size);
    struct sbx_record r, r2, r3;
    int rc = sbx_record_decode(buf, size, &r);
    free(buf);
    if (rc != 0) {
        FUZZ_CHECK(rc == SBX_E_STORAGE, "decode error %d", rc);
        FUZZ_CHECK(!r.env && !r.config, "a failed decode left blobs behind");
        return 0;
    }
    FUZZ_CHECK(memchr(r.id, '\0', sizeof(r.id)) && memchr(r.state, '\0', sizeof(r.state)),
               "unterminated id or state");
    blob_is_map(r.env, r.env_len);
    blob_is_map(r.config, r.config_len);

    char *e1, *e2;
    size_t n1, n2;
    FUZZ_CHECK(sbx_record_encode(&r, &e1, &n1) == 0, "a decoded record does not encode");
    rc = sbx_record_decode(e1, n1, &r2);
    FUZZ_CHECK(rc == 0, "the encoding of a decoded record does not decode (%zu bytes)", n1);
    same(&r, &r2);
    FUZZ_CHECK(sbx_record_encode(&r2, &e2, &n2) == 0, "re-encode failed");
    FUZZ_CHECK(n1 == n2 && !memcmp(e1, e2, n1), "encoding is not stable");
    FUZZ_CHECK(sbx_record_decode(e2, n2, &r3) == 0, "third decode failed");
    sbx_record_free(&r3);
    sbx_record_free(&r2);
    sbx_record_free(&r);
    free(e1);
    free(e2);
    return 0;
}
