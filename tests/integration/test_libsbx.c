/*
 * test_libsbx.c — libsbx as a user gets it: `make install-lib` (the client
 * library part of `make install`, which also installs the daemon: that is
 * tests/install/run-tests.sh) into a private
 * prefix, a small program built with `pkg-config --cflags --libs sbx`
 * against the installed header and library alone (shared, then static),
 * run against the test daemon.  Also: both libraries export only the public
 * API (include/sbx/sbx.h, result.h), and DESTDIR stages an install for
 * PREFIX.
 *
 * The tree is the current directory ($SBX_SRC overrides); `make install-lib`
 * builds the release client objects if they are missing, so the first run
 * takes a while.  Everything goes into a mkdtemp directory removed at the
 * end, whatever happens.
 */
#include <criterion/criterion.h>
#include <ftw.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../support/harness.h"

static char tmp[256];

static int
rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void
cleanup(void)
{
    if (tmp[0])
        nftw(tmp, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    tmp[0] = '\0';
}

TestSuite(libsbx, .fini = cleanup);

static const char *
src_dir(void)
{
    const char *s = getenv("SBX_SRC");
    return s && *s ? s : ".";
}

/* sh — run a shell command line; its output goes to out (heap, caller
 * frees; may be NULL to discard); returns its exit status (-1: not run). */
static int
sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int
sh(char **out, const char *fmt, ...)
{
    char *cmd = NULL;
    va_list ap;
    va_start(ap, fmt);
    int n = vasprintf(&cmd, fmt, ap);
    va_end(ap);
    cr_assert_geq(n, 0);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p, "popen %s", cmd);
    size_t len = 0, cap = 4096;
    char *buf = malloc(cap);
    cr_assert_not_null(buf);
    size_t r;
    while ((r = fread(buf + len, 1, cap - len - 1, p)) > 0) {
        len += r;
        if (cap - len < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
            cr_assert_not_null(buf);
        }
    }
    buf[len] = '\0';
    int st = pclose(p);
    free(cmd);
    if (out)
        *out = buf;
    else
        free(buf);
    return st >= 0 && WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static bool
exists(const char *dir, const char *rel)
{
    char p[512];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", dir, rel);
    return lstat(p, &st) == 0;
}

/* The program a user would write: nothing but <sbx/sbx.h>. */
static const char hello_c[] =
    "#include <sbx/sbx.h>\n"
    "#include <stdio.h>\n"
    "#include <stdlib.h>\n"
    "#include <string.h>\n"
    "int main(int argc, char **argv) {\n"
    "    sbx_client *c; sbx_error err; sbx_exec_result r; sbx_reply *rep = NULL;\n"
    "    if (argc != 3) return 2;\n"
    "    if (sbx_client_open(&c, argv[1], &err)) { fprintf(stderr, \"%s\\n\", err.message); return 1; }\n"
    "    sbx_exec_opts o = {.command = \"echo \\\"hello $WHO\\\"\",\n"
    "                       .env = (const char *const[]){\"WHO=libsbx\", NULL}};\n"
    "    if (sbx_exec(c, argv[2], &o, &r, &err)) { fprintf(stderr, \"%s: %s\\n\", err.code, err.message); return 1; }\n"
    "    printf(\"exec %d %.*s\", r.exit_code, (int)r.stdout_len, r.stdout_data);\n"
    "    sbx_exec_result_free(&r);\n"
    "    sbx_args *a = sbx_args_new();\n"
    "    sbx_args_kstr(a, \"path\", \"/workspace/x.bin\");\n"
    "    sbx_args_kbin(a, \"content\", \"a\\0b\", 3);\n"
    "    int rc = sbx_call_args(c, \"file.write\", argv[2], a, 0, &rep, &err);\n"
    "    sbx_args_free(a);\n"
    "    if (rc) { fprintf(stderr, \"%s: %s\\n\", err.code, err.message); return 1; }\n"
    "    sbx_reply_free(rep);\n"
    "    char *data; size_t len;\n"
    "    if (sbx_read_file(c, argv[2], \"/workspace/x.bin\", &data, &len, NULL, &err)) return 1;\n"
    "    printf(\"read %zu %d\\n\", len, len == 3 && !memcmp(data, \"a\\0b\", 3));\n"
    "    free(data);\n"
    "    if (sbx_call_json(c, \"status\", argv[2], NULL, 0, &rep, &err)) return 1;\n"
    "    const msgpack_object *sb; sbx_view id = {\"\", 0};\n"
    "    if (sbx_get_map(sbx_reply_result(rep), \"sandbox\", &sb) == 0) sbx_get_str(sb, \"id\", &id);\n"
    "    printf(\"status %.*s\\n\", (int)id.n, id.p);\n"
    "    sbx_reply_free(rep);\n"
    "    rc = sbx_call_json(c, \"no.such.op\", argv[2], NULL, 0, &rep, &err);\n"
    "    printf(\"error %s %d\\n\", err.code, rc < 0);\n"
    "    sbx_error_free(&err);\n"
    "    bool d = false;\n"
    "    if (sbx_destroy(c, argv[2], &d, &err)) return 1;\n"
    "    printf(\"destroyed %d\\n\", d);\n"
    "    sbx_client_close(c);\n"
    "    return 0;\n"
    "}\n";

Test(libsbx, installed_copy_builds_with_pkg_config_and_runs, .timeout = 900)
{
    char *out = NULL;
    snprintf(tmp, sizeof(tmp), "/tmp/sbx-libsbx-%sXXXXXX", test_prefix());
    cr_assert_not_null(mkdtemp(tmp), "mkdtemp");
    /* flock: tests/install/run-tests.sh builds the same lib/ files; two makes at once
     * would write them together. */
    int st = sh(&out, "mkdir -p '%s/build' && flock '%s/build/install.lock' make -s "
                      "--no-print-directory -C '%s' install-lib PREFIX='%s/usr' 2>&1",
                src_dir(), src_dir(), src_dir(), tmp);
    cr_assert_eq(st, 0, "make install failed (%d):\n%s", st, out);
    free(out);
    char usr[320];
    snprintf(usr, sizeof(usr), "%s/usr", tmp);
    const char *files[] = {"include/sbx/sbx.h", "include/sbx/result.h", "lib/libsbx.a",
                           "lib/libsbx.so", "lib/libsbx.so.0", "lib/pkgconfig/sbx.pc"};
    for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
        cr_expect(exists(usr, files[i]), "not installed: %s", files[i]);

    /* The shared library exports the public API and nothing else: every
     * defined dynamic symbol is declared SBX_API in an installed header. */
    st = sh(&out, "nm -D --defined-only '%s/lib/libsbx.so.0' | awk '{print $3}'", usr);
    cr_assert_eq(st, 0);
    int nsyms = 0;
    char *save = NULL;
    for (char *s = strtok_r(out, "\n", &save); s; s = strtok_r(NULL, "\n", &save)) {
        nsyms++;
        int found = sh(NULL, "grep -qE 'SBX_API [^(]*[ *]%s\\(' '%s/include/sbx/sbx.h' "
                             "'%s/include/sbx/result.h'", s, usr, usr);
        cr_expect_eq(found, 0, "libsbx.so exports %s, which the public headers do not declare",
                     s);
    }
    free(out);
    cr_expect_gt(nsyms, 30, "libsbx.so exports only %d symbols", nsyms);
    /* The static library, likewise: the same symbols, nothing more. */
    char *a_syms = NULL, *so_syms = NULL;
    cr_assert_eq(sh(&a_syms, "nm -g --defined-only '%s/lib/libsbx.a' | awk 'NF==3{print $3}' "
                             "| sort", usr), 0);
    cr_assert_eq(sh(&so_syms, "nm -D --defined-only '%s/lib/libsbx.so.0' | awk '{print $3}' "
                              "| sort", usr), 0);
    cr_expect_str_eq(a_syms, so_syms, "libsbx.a and libsbx.so export different symbols");
    free(a_syms);
    free(so_syms);
    st = sh(&out, "readelf -d '%s/lib/libsbx.so.0' | grep SONAME", usr);
    cr_expect(st == 0 && strstr(out, "[libsbx.so.0]"), "soname: %s", out);
    free(out);

    /* A program built from the installed copy alone. */
    char path[400];
    snprintf(path, sizeof(path), "%s/hello.c", tmp);
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs(hello_c, f);
    fclose(f);
    st = sh(&out,
            "cd '%s' && PKG_CONFIG_PATH='%s/lib/pkgconfig' cc -std=c17 -Wall -Werror -o hello "
            "hello.c $(PKG_CONFIG_PATH='%s/lib/pkgconfig' pkg-config --cflags --libs sbx) 2>&1",
            tmp, usr, usr);
    cr_assert_eq(st, 0, "building against the installed libsbx failed:\n%s", out);
    free(out);
    st = sh(&out, "PKG_CONFIG_PATH='%s/lib/pkgconfig' pkg-config --cflags sbx", usr);
    cr_expect(st == 0 && strstr(out, "/usr/include"), "cflags: %s", out);
    free(out);
    st = sh(&out, "readelf -d '%s/hello' | grep NEEDED", tmp);
    cr_expect(st == 0 && strstr(out, "[libsbx.so.0]"), "hello does not use libsbx.so.0: %s",
              out);
    free(out);
    char *id = test_id("libsbx");
    st = sh(&out, "LD_LIBRARY_PATH='%s/lib' '%s/hello' '%s' '%s' 2>&1", usr, tmp, test_url(),
            id);
    cr_expect_eq(st, 0, "hello failed (%d):\n%s", st, out);
    char want[256];
    snprintf(want, sizeof(want),
             "exec 0 hello libsbx\nread 3 1\nstatus %s\nerror UNKNOWN_OPERATION 1\n"
             "destroyed 1\n",
             id);
    cr_expect_str_eq(out, want);
    free(out);
    if (st != 0) {
        sbx_client *c = test_client();
        sbx_destroy(c, id, NULL, NULL);
        sbx_client_close(c);
    }
    free(id);

    /* The same program linked with the static library: no libsbx.so needed. */
    st = sh(&out,
            "cd '%s' && export PKG_CONFIG_PATH='%s/lib/pkgconfig' && cc -std=c17 -Wall -Werror "
            "-o hello-static hello.c $(pkg-config --cflags sbx) -L'%s/lib' -Wl,-Bstatic -lsbx "
            "-Wl,-Bdynamic $(pkg-config --static --libs-only-l sbx | sed 's/-lsbx / /') 2>&1",
            tmp, usr, usr);
    cr_assert_eq(st, 0, "static link against the installed libsbx.a failed:\n%s", out);
    free(out);
    st = sh(&out, "readelf -d '%s/hello-static' | grep NEEDED", tmp);
    cr_expect(st == 0 && !strstr(out, "libsbx"), "hello-static needs libsbx: %s", out);
    free(out);
    id = test_id("libsbx-static");
    st = sh(&out, "'%s/hello-static' '%s' '%s' 2>&1", tmp, test_url(), id);
    cr_expect_eq(st, 0, "hello-static failed (%d):\n%s", st, out);
    snprintf(want, sizeof(want),
             "exec 0 hello libsbx\nread 3 1\nstatus %s\nerror UNKNOWN_OPERATION 1\n"
             "destroyed 1\n",
             id);
    cr_expect_str_eq(out, want);
    free(out);
    if (st != 0) {
        sbx_client *c = test_client();
        sbx_destroy(c, id, NULL, NULL);
        sbx_client_close(c);
    }
    free(id);

    /* DESTDIR stages the files of an install for another PREFIX. */
    st = sh(&out, "flock '%s/build/install.lock' make -s --no-print-directory -C '%s' "
                  "install-lib DESTDIR='%s/stage' "
                  "PREFIX=/opt/sbx 2>&1", src_dir(), src_dir(), tmp);
    cr_assert_eq(st, 0, "make install DESTDIR failed:\n%s", out);
    free(out);
    char stage[320];
    snprintf(stage, sizeof(stage), "%s/stage/opt/sbx", tmp);
    cr_expect(exists(stage, "include/sbx/sbx.h") && exists(stage, "lib/libsbx.so.0"),
              "DESTDIR install is not under %s", stage);
    st = sh(&out, "grep '^prefix=' '%s/lib/pkgconfig/sbx.pc'", stage);
    cr_expect(st == 0 && !strcmp(out, "prefix=/opt/sbx\n"), "sbx.pc under DESTDIR: %s", out);
    free(out);
}
