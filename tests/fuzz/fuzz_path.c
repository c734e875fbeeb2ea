/*
 * fuzz_path.c — the pure parts of the agent's file API (container/agent/
 * files*.c, reached through files_int.h):
 *
 *  - files_path_arg: the `path` argument made absolute against the
 *    session's cwd (validation of length and NUL bytes, the join);
 *  - files_mime_of: the MIME type and text/binary decision of file.read
 *    from a file's name and first bytes;
 *  - files_patterns / files_matches_any / files_wanted: file.watch's
 *    include/exclude globs against relative paths.
 *
 * The input is an args map as the shard forwards it: {path, sessionId,
 * content (bin: a file's first bytes), include, exclude (arrays of globs),
 * rel (a path below the watched one)}.  Nothing here opens a file.
 *
 * Properties: an accepted path is absolute, shorter than PATH_MAX_BYTES,
 * and is the given absolute path or "/workspace/" + the relative one;
 * a refused one is answered VALIDATION_FAILED; content that is valid UTF-8
 * without NUL is never called binary; a path below the root that is
 * excluded by a pattern naming one of its components is not wanted.
 */
#include <jansson.h>

#include "../../container/agent/files_int.h"

#include "fake_agent.h"

static bool
strict_utf8_no_nul(const char *p, size_t n)
{
    if (memchr(p, '\0', n))
        return false;
    json_t *j = json_stringn(p, n);
    json_decref(j);
    return j != NULL;
}

static void
globs(const msgpack_object *args, const char *root)
{
    bool bad = false;
    char **inc = files_patterns(args, "include", &bad);
    char **exc = files_patterns(args, "exclude", &bad);
    sbx_str rel;
    if (!bad && sbx_wire_get_str(args, "rel", &rel) == 0 && rel.n < 1024 &&
        !memchr(rel.p, '\0', rel.n)) {
        struct watch w;
        memset(&w, 0, sizeof(w));
        snprintf(w.root, sizeof(w.root), "%s", root);
        w.include = inc;
        w.exclude = exc;
        char full[PATH_MAX_BYTES * 2];
        snprintf(full, sizeof(full), "%s/%.*s", root, (int)rel.n, rel.p);
        bool want = files_wanted(&w, full);
        char *r = sbx_str_dup(rel);
        if (exc && files_matches_any(exc, r) && r[0] != '/' && r[0] && strlen(full) < PATH_MAX_BYTES)
            FUZZ_CHECK(!want, "'%s' is excluded but wanted", r);
        free(r);
    }
    agent_env_free(inc);
    agent_env_free(exc);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > (256u << 10))
        return 0;
    struct agent *a = fake_agent();
    struct agent_req *r = fake_req(data, size, 7);
    if (!r)
        return 0;
    sbx_str content = {"", 0}, p = {"", 0};
    sbx_wire_get_bin(r->args, "content", &content);
    bool have_path = sbx_wire_get_str(r->args, "path", &p) == 0;
    char *pathc = have_path ? sbx_str_dup(p) : sbx_xstrdup("/workspace/x");

    /* file.read's decision. */
    bool binary;
    const char *mime = files_mime_of(pathc, (const unsigned char *)content.p,
                               SBX_MIN(content.n, (size_t)8192), &binary);
    FUZZ_CHECK(mime && *mime, "no MIME type");
    if (strict_utf8_no_nul(content.p, SBX_MIN(content.n, (size_t)8192)))
        FUZZ_CHECK(!binary, "valid UTF-8 called binary");

    globs(r->args, "/workspace");

    /* path_arg answers the request itself when it refuses. */
    char out[PATH_MAX_BYTES];
    int code = -1;
    int rc = files_path_arg(a, r, "path", out);
    if (rc == 0) {
        FUZZ_CHECK(out[0] == '/', "relative result '%s'", out);
        FUZZ_CHECK(strlen(out) < PATH_MAX_BYTES, "result too long");
        if (p.p[0] == '/')
            FUZZ_CHECK(!strcmp(out, pathc), "absolute path changed: '%s'", out);
        else
            FUZZ_CHECK(!strncmp(out, "/workspace/", 11) && !strcmp(out + 11, pathc),
                       "relative path joined as '%s'", out);
        FUZZ_CHECK(fake_replies(7, &code) == 0, "a reply for an accepted path");
        agent_req_free(r);
    } else {
        FUZZ_CHECK(fake_replies(7, &code) == 1 && code == SBX_E_VALIDATION,
                   "refused path answered with %d", code);
    }
    free(pathc);
    return 0;
}
