/*
 * test_files.c — the file operations (docs/protocol.md §3.4) through the C
 * client against a private sbxd: write/read round trips in utf-8 and base64
 * (every byte value, 1 MiB), Unicode names and created parents, paths
 * relative to a session's cwd, MIME type and isBinary, FILE_NOT_FOUND and
 * FILE_TOO_LARGE, mkdir, delete, rename and move (across mounts), list with
 * FileInfo fields, exists, readStream chunks, bad base64; and the security
 * rules: tenant-planted symlinks into procfs or to devices are refused with
 * PERMISSION_DENIED, other symlinks and `..` stay inside the sandbox.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

/* fcall — a file.* op with {path} plus extra fields (JSON object, stolen). */
static tcall
fcall(sbx_client *c, const char *id, const char *op, const char *path, json_t *extra)
{
    json_t *a = extra ? extra : json_object();
    if (path)
        json_object_set_new(a, "path", json_string(path));
    return tc_call(c, op, id, a, 0);
}

/* exists — file.exists of path. */
static bool
exists(sbx_client *c, const char *id, const char *path)
{
    tcall t = fcall(c, id, "file.exists", path, NULL);
    tc_ok(t, "file.exists");
    int e = jbool(t.res, "exists");
    cr_expect(e >= 0, "file.exists has no boolean `exists`");
    tc_free(&t);
    return e == 1;
}

/* read_back — file.read decoded to bytes (heap) whatever the encoding. */
static char *
read_back(sbx_client *c, const char *id, const char *path, size_t *len)
{
    char *data = NULL;
    sbx_error err;
    int rc = sbx_read_file(c, id, path, &data, len, NULL, &err);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s %s", err.code, err.message);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "file.read %s: %s", path, msg);
    return data;
}

Test(files, utf8_write_and_read_round_trip)
{
    sbx_client *c = test_client();
    char *id = test_id("file-utf8");
    const char *text = "héllo wörld — ünïcödé ✓ 文件\nsecond line\n";
    tcall t = fcall(c, id, "file.write", "/workspace/hello.txt",
                    json_pack("{s:s}", "content", text));
    tc_ok(t, "file.write");
    cr_expect_eq(jbool(t.res, "success"), 1);
    cr_expect_eq(jint(t.res, "bytesWritten"), (long long)strlen(text));
    cr_expect_str_eq(jstr(t.res, "path"), "/workspace/hello.txt");
    cr_expect(jint(t.res, "timestamp") > 0 || strlen(jstr(t.res, "timestamp")) >= 20,
              "no timestamp");
    tc_free(&t);
    t = fcall(c, id, "file.read", "/workspace/hello.txt", NULL);
    tc_ok(t, "file.read");
    cr_expect_str_eq(jstr(t.res, "content"), text);
    cr_expect_str_eq(jstr(t.res, "encoding"), "utf-8");
    cr_expect_eq(jbool(t.res, "isBinary"), 0);
    cr_expect_str_eq(jstr(t.res, "mimeType"), "text/plain");
    cr_expect_eq(jint(t.res, "size"), (long long)strlen(text));
    tc_free(&t);
    /* What the sandbox's programs see. */
    char *out = tsh_out(c, id, "cat /workspace/hello.txt");
    cr_expect_str_eq(out, text);
    free(out);
    /* Forcing base64 on a text file. */
    t = fcall(c, id, "file.read", "/workspace/hello.txt", json_pack("{s:s}", "encoding", "base64"));
    tc_ok(t, "file.read base64");
    cr_expect_str_eq(jstr(t.res, "encoding"), "base64");
    size_t n = 0;
    char *dec = NULL;
    const char *b64 = jstr(t.res, "content");
    cr_assert_eq(sbx_base64_decode(b64, strlen(b64), &dec, &n), 0, "not base64: %s", b64);
    cr_expect(n == strlen(text) && !memcmp(dec, text, n), "decoded: %.*s", (int)n, dec);
    free(dec);
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, base64_round_trip_of_every_byte_value)
{
    sbx_client *c = test_client();
    char *id = test_id("file-b64");
    unsigned char bytes[512];
    for (int i = 0; i < 512; i++)
        bytes[i] = (unsigned char)(i & 255);
    size_t blen = 0;
    char *b64 = sbx_base64_encode(bytes, sizeof(bytes), &blen);
    tcall t = fcall(c, id, "file.write", "/workspace/all.bin",
                    json_pack("{s:s, s:s}", "content", b64, "encoding", "base64"));
    free(b64);
    tc_ok(t, "file.write base64");
    cr_expect_eq(jint(t.res, "bytesWritten"), 512);
    tc_free(&t);
    t = fcall(c, id, "file.read", "/workspace/all.bin", NULL);
    tc_ok(t, "file.read");
    cr_expect_str_eq(jstr(t.res, "encoding"), "base64");
    cr_expect_eq(jbool(t.res, "isBinary"), 1);
    cr_expect_eq(jint(t.res, "size"), 512);
    const char *content = jstr(t.res, "content");
    char *dec = NULL;
    size_t n = 0;
    cr_assert_eq(sbx_base64_decode(content, strlen(content), &dec, &n), 0);
    cr_expect(n == 512 && !memcmp(dec, bytes, 512), "the bytes came back different (%zu)", n);
    free(dec);
    tc_free(&t);
    char *out = tsh_out(c, id, "od -An -tx1 -v /workspace/all.bin | tr -d ' \\n' | head -c 64");
    cr_expect_str_eq(out, "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f");
    free(out);
    /* The same through the typed helpers (bin content on the wire). */
    cr_assert_eq(sbx_write_file(c, id, "/workspace/all2.bin", bytes, 256, NULL), 0);
    size_t len = 0;
    char *back = read_back(c, id, "/workspace/all2.bin", &len);
    cr_expect(len == 256 && !memcmp(back, bytes, 256), "typed round trip differs (%zu)", len);
    free(back);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, one_mebibyte_round_trip, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("file-1m");
    size_t size = 1u << 20;
    unsigned char *data = malloc(size);
    uint32_t x = 12345;
    for (size_t i = 0; i < size; i++) {
        x = x * 1103515245u + 12345u;
        data[i] = (unsigned char)(x >> 16);
    }
    sbx_error err;
    cr_assert_eq(sbx_write_file(c, id, "/workspace/big/one.mib", data, size, &err), 0, "%s",
                 err.message);
    char *out = tsh_out(c, id, "wc -c < /workspace/big/one.mib");
    cr_expect_eq(atol(out), (long)size, "the file has %s bytes", out);
    free(out);
    size_t len = 0;
    char *back = read_back(c, id, "/workspace/big/one.mib", &len);
    cr_expect(len == size && !memcmp(back, data, size), "1 MiB came back different (%zu)", len);
    free(back);
    /* 1 MiB of text, utf-8 both ways. */
    for (size_t i = 0; i < size; i++)
        data[i] = (unsigned char)('a' + i % 26);
    data[size - 1] = '\n';
    cr_assert_eq(sbx_write_file(c, id, "/workspace/big/one.txt", data, size, NULL), 0);
    tcall t = fcall(c, id, "file.read", "/workspace/big/one.txt", NULL);
    tc_ok(t, "file.read 1 MiB text");
    sbx_str content = tc_bin(&t, "content");
    cr_expect(content.n == size && !memcmp(content.p, data, size), "text came back with %zu bytes",
              content.n);
    cr_expect_str_eq(jstr(t.res, "encoding"), "utf-8");
    tc_free(&t);
    free(data);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, unicode_names_and_created_parents)
{
    sbx_client *c = test_client();
    char *id = test_id("file-names");
    const char *path = "/workspace/dir with space/ünï 文件.txt";
    tcall t = fcall(c, id, "file.write", path, json_pack("{s:s}", "content", "named\n"));
    tc_ok(t, "file.write");
    tc_free(&t);
    char *out = tsh_out(c, id, "cat '/workspace/dir with space/ünï 文件.txt'; "
                               "ls '/workspace/dir with space'");
    cr_expect_str_eq(out, "named\nünï 文件.txt\n");
    free(out);
    cr_expect(exists(c, id, path));
    t = fcall(c, id, "file.list", "/workspace/dir with space", NULL);
    tc_ok(t, "file.list");
    cr_expect_str_eq(jstr(t.res, "files.0.name"), "ünï 文件.txt");
    cr_expect_str_eq(jstr(t.res, "files.0.absolutePath"), path);
    tc_free(&t);
    /* Several missing levels at once. */
    t = fcall(c, id, "file.write", "/workspace/a/b/c/d/e.txt", json_pack("{s:s}", "content", "deep"));
    tc_ok(t, "file.write deep");
    tc_free(&t);
    out = tsh_out(c, id, "cat /workspace/a/b/c/d/e.txt");
    cr_expect_str_eq(out, "deep");
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, relative_paths_resolve_against_the_session_cwd)
{
    sbx_client *c = test_client();
    char *id = test_id("file-rel");
    sbx_exec_result r = tsh_in(c, id, "rel", "cd /tmp", 0);
    sbx_exec_result_free(&r);
    tcall t = fcall(c, id, "file.write", "rel.txt",
                    json_pack("{s:s, s:s}", "content", "in tmp", "sessionId", "rel"));
    tc_ok(t, "file.write rel.txt in session rel");
    cr_expect_str_eq(jstr(t.res, "path"), "/tmp/rel.txt", "reported path %s",
                     jstr(t.res, "path"));
    tc_free(&t);
    char *out = tsh_out(c, id, "cat /tmp/rel.txt 2>&1; test -e /workspace/rel.txt && echo WRONG");
    cr_expect_str_eq(out, "in tmp", "session-relative write landed elsewhere: %s", out);
    free(out);
    /* Without a session: the default session's cwd, /workspace. */
    t = fcall(c, id, "file.write", "sub/rel2.txt", json_pack("{s:s}", "content", "in ws"));
    tc_ok(t, "file.write sub/rel2.txt");
    tc_free(&t);
    out = tsh_out(c, id, "cat /workspace/sub/rel2.txt");
    cr_expect_str_eq(out, "in ws");
    free(out);
    /* Reads resolve the same way. */
    t = fcall(c, id, "file.read", "rel.txt", json_pack("{s:s}", "sessionId", "rel"));
    tc_ok(t, "file.read rel.txt in session rel");
    cr_expect_str_eq(jstr(t.res, "content"), "in tmp");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, mime_type_and_is_binary)
{
    sbx_client *c = test_client();
    char *id = test_id("file-mime");
    tcall t = fcall(c, id, "file.write", "/workspace/data.json",
                    json_pack("{s:s}", "content", "{\"a\": [1, 2, 3]}\n"));
    tc_ok(t, "file.write json");
    tc_free(&t);
    t = fcall(c, id, "file.read", "/workspace/data.json", NULL);
    tc_ok(t, "file.read json");
    cr_expect_str_eq(jstr(t.res, "mimeType"), "application/json");
    cr_expect_eq(jbool(t.res, "isBinary"), 0);
    cr_expect_str_eq(jstr(t.res, "encoding"), "utf-8");
    tc_free(&t);
    /* A PNG recognised by its first bytes, whatever its name. */
    static const unsigned char png[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n', 0, 0, 0, 13,
                                        'I',  'H', 'D', 'R', 0,    0,    0,    1,    0, 0, 0, 1,
                                        8,    6,   0,   0,   0,    0x1f, 0x15, 0xc4, 0x89};
    cr_assert_eq(sbx_write_file(c, id, "/workspace/picture.dat", png, sizeof(png), NULL), 0);
    t = fcall(c, id, "file.read", "/workspace/picture.dat", NULL);
    tc_ok(t, "file.read png");
    cr_expect_str_eq(jstr(t.res, "mimeType"), "image/png");
    cr_expect_eq(jbool(t.res, "isBinary"), 1);
    cr_expect_str_eq(jstr(t.res, "encoding"), "base64");
    tc_free(&t);
    /* Valid UTF-8 with a NUL is binary. */
    cr_assert_eq(sbx_write_file(c, id, "/workspace/nul.txt", "ab\0cd", 5, NULL), 0);
    t = fcall(c, id, "file.read", "/workspace/nul.txt", NULL);
    tc_ok(t, "file.read nul");
    cr_expect_eq(jbool(t.res, "isBinary"), 1, "a file with a NUL is not binary");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, not_found_and_too_large, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("file-errs");
    tcall t = fcall(c, id, "file.read", "/workspace/no-such-file", NULL);
    tc_fails_with(t, "file.read of a missing file", "FILE_NOT_FOUND");
    tc_free(&t);
    t = fcall(c, id, "file.read", "/workspace/no-such-dir/f", NULL);
    tc_fails_with(t, "file.read in a missing dir", "FILE_NOT_FOUND");
    tc_free(&t);
    cr_expect(!exists(c, id, "/workspace/no-such-file"));
    t = fcall(c, id, "file.read", "/workspace", NULL);
    tc_fails_with(t, "file.read of a directory", "IS_DIRECTORY");
    tc_free(&t);
    sbx_exec_result r = tsh(c, id, "head -c 34603008 /dev/zero > /workspace/big33", 0);
    cr_assert_eq(r.exit_code, 0, "making a 33 MiB file: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    t = fcall(c, id, "file.read", "/workspace/big33", NULL);
    tc_fails_with(t, "file.read of 33 MiB", "FILE_TOO_LARGE");
    tc_free(&t);
    /* The sandbox is fine afterwards. */
    r = tsh(c, id, "echo ok", 0);
    cr_expect_str_eq(r.stdout_data, "ok\n");
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, mkdir_delete_and_exists)
{
    sbx_client *c = test_client();
    char *id = test_id("file-mkdir");
    tcall t = fcall(c, id, "file.mkdir", "/workspace/x/y/z", json_pack("{s:b}", "recursive", 1));
    tc_ok(t, "file.mkdir recursive");
    cr_expect_eq(jbool(t.res, "success"), 1);
    tc_free(&t);
    cr_expect(exists(c, id, "/workspace/x/y/z"));
    char *out = tsh_out(c, id, "test -d /workspace/x/y/z && echo dir");
    cr_expect_str_eq(out, "dir\n");
    free(out);
    t = fcall(c, id, "file.mkdir", "/workspace/p/q", NULL);
    cr_expect_neq(t.rc, 0, "mkdir without recursive created missing parents");
    tc_free(&t);
    cr_expect(!exists(c, id, "/workspace/p"));
    /* delete: a directory is refused, a file deleted. */
    t = fcall(c, id, "file.delete", "/workspace/x/y", NULL);
    tc_fails_with(t, "file.delete of a directory", "IS_DIRECTORY");
    tc_free(&t);
    cr_expect(exists(c, id, "/workspace/x/y/z"), "the refused delete removed something");
    cr_assert_eq(sbx_write_file(c, id, "/workspace/x/f.txt", "x", 1, NULL), 0);
    t = fcall(c, id, "file.delete", "/workspace/x/f.txt", NULL);
    tc_ok(t, "file.delete");
    cr_expect_eq(jbool(t.res, "success"), 1);
    tc_free(&t);
    cr_expect(!exists(c, id, "/workspace/x/f.txt"), "the file is still there");
    t = fcall(c, id, "file.delete", "/workspace/x/f.txt", NULL);
    tc_fails_with(t, "file.delete of a missing file", "FILE_NOT_FOUND");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, rename_and_move_including_across_mounts)
{
    sbx_client *c = test_client();
    char *id = test_id("file-mv");
    cr_assert_eq(sbx_write_file(c, id, "/workspace/a.txt", "A", 1, NULL), 0);
    tcall t = tc_call(c, "file.rename", id,
                      json_pack("{s:s, s:s}", "oldPath", "/workspace/a.txt", "newPath",
                                "/workspace/b.txt"),
                      0);
    tc_ok(t, "file.rename");
    cr_expect_eq(jbool(t.res, "success"), 1);
    tc_free(&t);
    cr_expect(!exists(c, id, "/workspace/a.txt") && exists(c, id, "/workspace/b.txt"));
    /* Into an existing directory: the name is kept. */
    t = fcall(c, id, "file.mkdir", "/workspace/into", NULL);
    tc_ok(t, "file.mkdir");
    tc_free(&t);
    t = tc_call(c, "file.move", id,
                json_pack("{s:s, s:s}", "sourcePath", "/workspace/b.txt", "destinationPath",
                          "/workspace/into"),
                0);
    tc_ok(t, "file.move into a directory");
    tc_free(&t);
    cr_expect(exists(c, id, "/workspace/into/b.txt"), "move into a dir did not keep the name");
    /* /tmp and /workspace are different mounts: a move copies. */
    char *out = tsh_out(c, id, "mkdir -p /tmp/mvdir/sub && echo deep > /tmp/mvdir/sub/f && "
                               "echo tmpfile > /tmp/m.txt && "
                               "awk '$5 == \"/tmp\" || $5 == \"/workspace\"' "
                               "/proc/self/mountinfo | wc -l");
    cr_expect_str_eq(out, "2\n", "/tmp and /workspace are not two mounts: %s", out);
    free(out);
    t = tc_call(c, "file.move", id,
                json_pack("{s:s, s:s}", "sourcePath", "/tmp/m.txt", "destinationPath",
                          "/workspace/m.txt"),
                0);
    tc_ok(t, "file.move /tmp → /workspace");
    tc_free(&t);
    t = tc_call(c, "file.move", id,
                json_pack("{s:s, s:s}", "sourcePath", "/tmp/mvdir", "destinationPath",
                          "/workspace/mvdir"),
                0);
    tc_ok(t, "file.move of a directory /tmp → /workspace");
    tc_free(&t);
    out = tsh_out(c, id, "cat /workspace/m.txt /workspace/mvdir/sub/f; "
                         "ls /tmp/m.txt /tmp/mvdir 2>&1 | grep -c 'No such'");
    cr_expect_str_eq(out, "tmpfile\ndeep\n2\n", "after the cross-mount moves: %s", out);
    free(out);
    /* Missing source. */
    t = tc_call(c, "file.rename", id,
                json_pack("{s:s, s:s}", "oldPath", "/workspace/nope", "newPath", "/workspace/n2"),
                0);
    tc_fails_with(t, "file.rename of a missing file", "FILE_NOT_FOUND");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

static json_t *
find_entry(json_t *files, const char *rel)
{
    for (size_t i = 0; i < json_array_size(files); i++)
        if (!strcmp(jstr(json_array_get(files, i), "relativePath"), rel))
            return json_array_get(files, i);
    return NULL;
}

Test(files, list_recursive_hidden_and_fileinfo)
{
    sbx_client *c = test_client();
    char *id = test_id("file-list");
    sbx_exec_result r = tsh(c, id, "mkdir -p /workspace/l/sub && printf 12345 > /workspace/l/a.txt "
                                   "&& touch /workspace/l/.hidden /workspace/l/sub/c.txt "
                                   "&& chmod 755 /workspace/l/a.txt "
                                   "&& ln -s a.txt /workspace/l/link",
                            0);
    cr_assert_eq(r.exit_code, 0, "%s", r.stderr_data);
    sbx_exec_result_free(&r);
    tcall t = fcall(c, id, "file.list", "/workspace/l", NULL);
    tc_ok(t, "file.list");
    json_t *files = jget(t.res, "files");
    cr_assert(json_is_array(files));
    cr_expect_eq(jint(t.res, "count"), (long long)json_array_size(files));
    cr_expect_eq(json_array_size(files), 3, "plain list has %zu entries (a.txt, link, sub)",
                 json_array_size(files));
    cr_expect(find_entry(files, ".hidden") == NULL, "hidden file listed without includeHidden");
    cr_expect(find_entry(files, "sub/c.txt") == NULL, "non-recursive list descended");
    json_t *a = find_entry(files, "a.txt");
    cr_assert(a != NULL, "a.txt not listed");
    cr_expect_str_eq(jstr(a, "name"), "a.txt");
    cr_expect_str_eq(jstr(a, "absolutePath"), "/workspace/l/a.txt");
    cr_expect_str_eq(jstr(a, "type"), "file");
    cr_expect_eq(jint(a, "size"), 5);
    cr_expect_str_eq(jstr(a, "mode"), "rwxr-xr-x");
    cr_expect(strlen(jstr(a, "modifiedAt")) >= 20, "modifiedAt '%s'", jstr(a, "modifiedAt"));
    cr_expect(jbool(a, "permissions.readable") == 1 && jbool(a, "permissions.writable") == 1 &&
                  jbool(a, "permissions.executable") == 1,
              "permissions of a.txt");
    json_t *sub = find_entry(files, "sub");
    cr_expect(sub && !strcmp(jstr(sub, "type"), "directory"), "sub is not a directory");
    json_t *ln = find_entry(files, "link");
    cr_expect(ln && !strcmp(jstr(ln, "type"), "symlink"), "link is not a symlink (%s)",
              ln ? jstr(ln, "type") : "missing");
    tc_free(&t);
    t = fcall(c, id, "file.list", "/workspace/l",
              json_pack("{s:b, s:b}", "recursive", 1, "includeHidden", 1));
    tc_ok(t, "file.list recursive includeHidden");
    files = jget(t.res, "files");
    cr_expect(find_entry(files, ".hidden") != NULL, ".hidden missing with includeHidden");
    json_t *cc = find_entry(files, "sub/c.txt");
    cr_expect(cc != NULL, "sub/c.txt missing from the recursive list");
    if (cc) {
        cr_expect_str_eq(jstr(cc, "name"), "c.txt");
        cr_expect_str_eq(jstr(cc, "absolutePath"), "/workspace/l/sub/c.txt");
        cr_expect_eq(jint(cc, "size"), 0);
    }
    cr_expect_eq(jint(t.res, "count"), 5, "recursive count %lld", jint(t.res, "count"));
    tc_free(&t);
    /* The options may also come inside `options`. */
    t = fcall(c, id, "file.list", "/workspace/l",
              json_pack("{s:{s:b}}", "options", "includeHidden", 1));
    tc_ok(t, "file.list options.includeHidden");
    cr_expect(find_entry(jget(t.res, "files"), ".hidden") != NULL, "options.includeHidden ignored");
    tc_free(&t);
    t = fcall(c, id, "file.list", "/workspace/none", NULL);
    tc_fails_with(t, "file.list of a missing dir", "FILE_NOT_FOUND");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, read_stream_chunks_concatenate_to_the_file, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("file-rs");
    size_t size = 300000;
    char *data = malloc(size);
    for (size_t i = 0; i < size; i++)
        data[i] = (char)(i * 7 + i / 251);
    cr_assert_eq(sbx_write_file(c, id, "/workspace/stream.bin", data, size, NULL), 0);
    tcall t = fcall(c, id, "file.readStream", "/workspace/stream.bin", NULL);
    tc_ok(t, "file.readStream");
    char sid[80];
    snprintf(sid, sizeof(sid), "%s", jstr(t.res, "streamId"));
    tc_free(&t);
    cr_assert(sid[0], "no streamId");
    sbx_stream *s = NULL;
    cr_assert_eq(sbx_stream_open(c, id, sid, 0, &s, NULL), 0);
    sbx_event ev;
    sbx_error err;
    sbx_buf got;
    sbx_buf_init(&got);
    int rc, chunks = 0;
    bool meta = false, complete = false, oversize = false;
    int64_t bytes_read = -1, msize = -1;
    while ((rc = sbx_stream_next(s, &ev, &err)) == 1) {
        if (!strcmp(ev.type, "metadata")) {
            meta = chunks == 0;
            bool bin = false;
            sbx_wire_get_bool(ev.obj, "isBinary", &bin);
            sbx_wire_get_i64(ev.obj, "size", &msize);
            cr_expect(bin, "metadata says the file is not binary");
        } else if (!strcmp(ev.type, "chunk")) {
            /* data is a string: UTF-8 text, or base64 of the bytes (per chunk). */
            sbx_str enc = SBX_STR("utf-8");
            sbx_wire_get_str(ev.obj, "encoding", &enc);
            char *raw = NULL;
            size_t rawlen = ev.data_len;
            if (sbx_str_eq(enc, "base64")) {
                cr_assert_eq(sbx_base64_decode(ev.data, ev.data_len, &raw, &rawlen), 0,
                             "a base64 chunk does not decode");
                sbx_buf_append(&got, raw, rawlen);
                free(raw);
            } else {
                sbx_buf_append(&got, ev.data, ev.data_len);
            }
            chunks++;
            oversize |= rawlen > 65536;
        } else if (!strcmp(ev.type, "complete")) {
            complete = true;
            sbx_wire_get_i64(ev.obj, "bytesRead", &bytes_read);
        }
    }
    cr_expect_eq(rc, 0, "stream error %s %s", err.code, err.message);
    cr_expect(meta, "no metadata event first");
    cr_expect_eq(msize, (int64_t)size);
    cr_expect(!oversize, "a chunk exceeds 64 KiB");
    cr_expect_geq(chunks, 5, "%d chunks for %zu bytes", chunks, size);
    cr_expect(complete, "no complete event");
    cr_expect_eq(bytes_read, (int64_t)size);
    cr_expect(got.len == size && !memcmp(got.p, data, size), "chunks concatenate to %zu bytes",
              got.len);
    sbx_buf_free(&got);
    sbx_stream_close(s);
    free(data);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, bad_base64_is_validation_failed)
{
    sbx_client *c = test_client();
    char *id = test_id("file-bad64");
    tcall t = fcall(c, id, "file.write", "/workspace/bad.bin",
                    json_pack("{s:s, s:s}", "content", "not base64 at all!!", "encoding", "base64"));
    tc_fails_with(t, "file.write with bad base64", "VALIDATION_FAILED");
    tc_free(&t);
    cr_expect(!exists(c, id, "/workspace/bad.bin"), "a file was created from bad base64");
    t = fcall(c, id, "file.write", "/workspace/x.txt",
              json_pack("{s:s, s:s}", "content", "x", "encoding", "utf-16"));
    tc_fails_with(t, "file.write with an unknown encoding", "VALIDATION_FAILED");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, symlinks_to_procfs_and_devices_are_refused, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("file-sym");
    sbx_exec_result r = tsh(c, id, "ln -s /proc/1/mem /workspace/m && "
                                   "ln -s /proc/1/fd/3 /workspace/c && "
                                   "ln -s /proc/1/environ /workspace/e && "
                                   "ln -s /dev/zero /workspace/d && "
                                   "ln -s /proc/self/root/etc/hostname /workspace/r",
                            0);
    cr_assert_eq(r.exit_code, 0, "planting symlinks: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    const char *links[] = {"/workspace/m", "/workspace/c", "/workspace/e", "/workspace/d",
                           "/workspace/r", "/proc/1/environ", "/dev/zero"};
    for (size_t i = 0; i < sizeof(links) / sizeof(links[0]); i++) {
        tcall t = fcall(c, id, "file.read", links[i], NULL);
        tc_fails_with(t, links[i], "PERMISSION_DENIED");
        tc_free(&t);
        t = fcall(c, id, "file.write", links[i], json_pack("{s:s}", "content", "PWNED"));
        tc_fails_with(t, links[i], "PERMISSION_DENIED");
        tc_free(&t);
        t = fcall(c, id, "file.readStream", links[i], NULL);
        tc_fails_with(t, links[i], "PERMISSION_DENIED");
        tc_free(&t);
    }
    /* The sandbox keeps working: same container, agent answering, files fine. */
    r = tsh(c, id, "echo alive", 0);
    cr_expect_str_eq(r.stdout_data, "alive\n");
    sbx_exec_result_free(&r);
    cr_expect_eq(sbx_write_file(c, id, "/workspace/after.txt", "fine", 4, NULL), 0);
    size_t len;
    char *back = read_back(c, id, "/workspace/after.txt", &len);
    cr_expect(len == 4 && !memcmp(back, "fine", 4));
    free(back);
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "restarts"), 0, "the container died (lastExit: %s)", jstr(sb, "lastExit"));
    cr_expect_eq(jint(sb, "generation"), 1, "the container was replaced");
    json_decref(sb);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, fifos_are_refused_with_permission_denied, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("file-fifo");
    sbx_exec_result r = tsh(c, id, "mkfifo /workspace/fifo /workspace/fifo2", 0);
    cr_assert_eq(r.exit_code, 0, "mkfifo: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    /* Nobody has the FIFO open. */
    tcall t = fcall(c, id, "file.read", "/workspace/fifo", NULL);
    tc_fails_with(t, "file.read of a FIFO", "PERMISSION_DENIED");
    tc_free(&t);
    t = fcall(c, id, "file.write", "/workspace/fifo", json_pack("{s:s}", "content", "x"));
    tc_fails_with(t, "file.write of a FIFO without a reader", "PERMISSION_DENIED");
    tc_free(&t);
    /* A process of the sandbox reads from it: still refused, nothing arrives. */
    char pid[128];
    sbx_exec_opts o = {.command = "cat /workspace/fifo2 > /workspace/got"};
    cr_assert_eq(sbx_process_start(c, id, &o, NULL, pid, NULL), 0);
    tsleep_ms(300);
    t = fcall(c, id, "file.write", "/workspace/fifo2", json_pack("{s:s}", "content", "PWNED"));
    tc_fails_with(t, "file.write of a FIFO with a reader", "PERMISSION_DENIED");
    tc_free(&t);
    sbx_process_kill(c, id, pid, NULL, NULL);
    char *out = tsh_out(c, id, "cat /workspace/got");
    cr_expect_str_eq(out, "", "the FIFO's reader got: %s", out);
    free(out);
    tdone(c, id);
    sbx_client_close(c);
}

Test(files, symlinks_and_dotdot_stay_inside_the_sandbox)
{
    sbx_client *c = test_client();
    char *id = test_id("file-esc");
    sbx_exec_result r = tsh(c, id, "ln -s /etc/passwd /workspace/pw && ln -s / /workspace/root", 0);
    cr_assert_eq(r.exit_code, 0, "%s", r.stderr_data);
    sbx_exec_result_free(&r);
    size_t len = 0;
    char *via_link = read_back(c, id, "/workspace/pw", &len);
    char *inside = tsh_out(c, id, "cat /etc/passwd");
    cr_expect_str_eq(via_link, inside, "the symlink read something else than the sandbox's "
                                       "/etc/passwd");
    /* The host has users the sandbox does not list. */
    char *host = NULL;
    size_t hlen = 0;
    cr_assert_eq(sbx_fs_read("/etc/passwd", 1 << 20, &host, &hlen), 0);
    int missing = 0, total = 0;
    char *save = NULL;
    for (char *line = strtok_r(host, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *colon = strchr(line, ':');
        if (!colon)
            continue;
        char needle[300];
        snprintf(needle, sizeof(needle), "\n%.*s:", (int)(colon - line), line);
        total++;
        bool in = strstr(via_link, needle) != NULL ||
                  !strncmp(via_link, needle + 1, strlen(needle + 1));
        if (!in)
            missing++;
    }
    cr_expect_gt(missing, 0, "all %d host users appear in the file read through the symlink",
                 total);
    free(host);
    free(via_link);
    free(inside);
    /* `..` and a symlink to / do not leave the sandbox: it has no /etc/shadow. */
    cr_assert_eq(access("/etc/shadow", F_OK), 0, "the host has no /etc/shadow to compare with");
    char *none = tsh_out(c, id, "test -e /etc/shadow && echo has-shadow || echo none");
    cr_expect_str_eq(none, "none\n");
    free(none);
    const char *paths[] = {"/workspace/../../../etc/shadow", "../../../etc/shadow",
                           "../../../../../../../../etc/shadow", "/workspace/root/etc/shadow",
                           "/workspace/root/../../etc/shadow"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        tcall t = fcall(c, id, "file.read", paths[i], NULL);
        tc_fails_with(t, paths[i], "FILE_NOT_FOUND");
        tc_free(&t);
        t = fcall(c, id, "file.exists", paths[i], NULL);
        tc_ok(t, "file.exists");
        cr_expect_eq(jbool(t.res, "exists"), 0, "%s exists", paths[i]);
        tc_free(&t);
    }
    tdone(c, id);
    sbx_client_close(c);
}

/* restarts — the sandbox's count of containers that ended unexpectedly. */
static long long
restarts(sbx_client *c, const char *id)
{
    json_t *sb = ts_status(c, id);
    long long n = jint(sb, "restarts");
    json_decref(sb);
    return n;
}

/* A recursive listing larger than one reply can carry — 12 000 files under a
 * 3.4 KB path, ~7 KB of FileInfo each — comes back cut, with `truncated`,
 * instead of a reply frame the shard takes for an attack: it used to replace
 * the container, and /workspace with it. */
Test(files, a_listing_too_large_for_one_reply_is_truncated, .timeout = 180)
{
    sbx_client *c = test_client();
    char *id = test_id("file-biglist");
    sbx_exec_result r =
        tsh(c, id,
            "echo keep > /workspace/marker && d=$(printf 'd%.0s' $(seq 200)) && "
            "p=/workspace/big && for i in $(seq 17); do p=$p/$d; done && mkdir -p $p && "
            "cd $p && seq -f f%05g 1 12000 | xargs touch && ls | wc -l",
            120000);
    cr_assert_eq(r.exit_code, 0, "set-up: %s", r.stderr_data);
    cr_assert_str_eq(r.stdout_data, "12000\n");
    sbx_exec_result_free(&r);
    tcall t = fcall(c, id, "file.list", "/workspace", json_pack("{s:b}", "recursive", 1));
    tc_ok(t, "file.list of the big tree");
    cr_expect_eq(jbool(t.res, "truncated"), 1, "the listing of %lld entries is not truncated",
                 jint(t.res, "count"));
    long long n = jint(t.res, "count");
    cr_expect(n > 1000 && n < 12000, "count %lld", n);
    cr_expect_eq((long long)json_array_size(jget(t.res, "files")), n);
    tc_free(&t);
    /* Same container, same files. */
    cr_expect_eq(restarts(c, id), 0, "the container was replaced");
    r = tsh(c, id, "cat /workspace/marker", 0);
    cr_expect_str_eq(r.stdout_data, "keep\n", "/workspace lost its files: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    tdone(c, id);
    sbx_client_close(c);
}

/* Entries deeper than PATH_MAX keep their whole paths (they were cut at
 * 4095 bytes, naming a file that does not exist). */
Test(files, a_listing_reports_paths_longer_than_path_max_whole, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("file-deep");
    /* 20 levels of 250-byte names: mkdir and cd one level at a time, as no
     * single path that long can be passed to the kernel. */
    const char *mk = "mkdir -p /workspace/deep && cd /workspace/deep && "
                     "d=$(printf 'n%.0s' $(seq 250)) && for i in $(seq 20); do "
                     "mkdir -p $d && cd $d || exit 1; done && echo x > leaf.txt";
    const char *bash[] = {"bash", "-c", mk, NULL}; /* dash cannot cd past PATH_MAX */
    sbx_exec_opts o = {.argv = bash, .sessionless = true, .timeout_ms = 60000};
    sbx_exec_result r = tsh_opts(c, id, &o);
    cr_assert_eq(r.exit_code, 0, "set-up: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    char name[251];
    memset(name, 'n', 250);
    name[250] = '\0';
    sbx_buf want;
    sbx_buf_init(&want);
    for (int i = 0; i < 20; i++)
        sbx_buf_appendf(&want, "%s%s", i ? "/" : "", name);
    sbx_buf_appendf(&want, "/leaf.txt");
    sbx_buf_append(&want, "", 1);
    tcall t = fcall(c, id, "file.list", "/workspace/deep", json_pack("{s:b}", "recursive", 1));
    tc_ok(t, "file.list of the deep tree");
    json_t *leaf = find_entry(jget(t.res, "files"), want.p);
    cr_assert(leaf != NULL, "no entry with the relative path of leaf.txt (%zu bytes) in %lld "
                            "entries",
              strlen(want.p), jint(t.res, "count"));
    cr_expect_str_eq(jstr(leaf, "name"), "leaf.txt");
    cr_expect_eq(strlen(jstr(leaf, "absolutePath")), strlen("/workspace/deep/") + strlen(want.p));
    cr_expect(!strncmp(jstr(leaf, "absolutePath"), "/workspace/deep/", 16) &&
                  !strcmp(jstr(leaf, "absolutePath") + 16, want.p),
              "absolutePath is not the leaf's");
    cr_expect_eq(jint(t.res, "count"), 21);
    cr_expect_neq(jbool(t.res, "truncated"), 1);
    tc_free(&t);
    sbx_buf_free(&want);
    /* A session can go down there too: its command completes (the cwd rides
     * on a line that used to be dropped as too long, hanging the command
     * until its timeout), and a relative path against that cwd is refused,
     * not cut. */
    r = tsh(c, id, mk, 20000);
    cr_expect_eq(r.exit_code, 0, "cd down in the session: exit %d, %s", r.exit_code,
                 r.stderr_data);
    sbx_exec_result_free(&r);
    r = tsh(c, id, "pwd | wc -c", 20000);
    cr_expect_eq(r.exit_code, 0);
    cr_expect_str_eq(r.stdout_data, "5036\n", "pwd: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    t = fcall(c, id, "file.write", "rel.txt", json_pack("{s:s}", "content", "x"));
    tc_fails_with(t, "file.write of a relative path under a deep cwd", "NAME_TOO_LONG");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}
