/*
 * fuzz_config.c — sbxd's option parser (runtime/config.c): a `--config`
 * file of `name = value` lines, and command-line flags.
 *
 * Input: the config file text, optionally followed by the separator
 * "\0--\0" and newline-separated command-line arguments.  The file is
 * handed over as /proc/self/fd/N of a memfd.  The option table has one
 * option of every type.
 *
 * Properties: a failure comes with a reason and leaves no allocation
 * behind (LeakSanitizer runs on every input); a success leaves strings and
 * lists well formed (lists NULL-terminated), positional arguments are argv
 * pointers, booleans are 0/1 and durations are never negative.
 */
#include <errno.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <unistd.h>

#include "../../runtime/config.h"
#include "../../runtime/util.h"
#include "fuzz.h"

static const char *const names[] = {"name", "count", "memory", "sleep-after", "verbose", "etc",
                                    NULL};

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool once;
    if (!once) {
        /* The environment is the third source: keep it out of the way. */
        for (int i = 0; names[i]; i++) {
            char env[64] = "SBX_";
            size_t k = 4;
            for (const char *p = names[i]; *p; p++)
                env[k++] = *p == '-' ? '_' : (char)(*p - 32 * (*p >= 'a' && *p <= 'z'));
            env[k] = '\0';
            unsetenv(env);
        }
        once = true;
    }
    if (size > (64u << 10))
        return 0;
    size_t flen = fuzz_split(data, size, "\0--\0");
    int fd = memfd_create("fuzz-config", MFD_CLOEXEC);
    FUZZ_CHECK(fd >= 0, "memfd_create failed");
    FUZZ_CHECK(write(fd, data, flen) == (ssize_t)flen, "memfd write failed");

    char *argstr =
        flen + 4 <= size ? fuzz_cstr(data + flen + 4, size - flen - 4) : fuzz_cstr("", 0);
    char *argv[130];
    int argc = 0;
    char cfg[64];
    snprintf(cfg, sizeof(cfg), "--config=/proc/self/fd/%d", fd);
    argv[argc++] = "sbxd";
    argv[argc++] = cfg;
    char *save = NULL;
    for (char *t = strtok_r(argstr, "\n", &save); t && argc < 128;
         t = strtok_r(NULL, "\n", &save)) {
        /* Only the memfd may be read as a config file (no /dev/stdin, no blocking). */
        if (strstr(t, "config"))
            continue;
        argv[argc++] = t;
    }
    argv[argc] = NULL;

    char *name = NULL, **etc = NULL, **rest = NULL;
    int64_t count = -1, sleep_after = -1;
    uint64_t memory = 12345;
    bool verbose = false;
    struct sbx_opt opts[] = {
        {"name", SBX_OPT_STR, &name, ""},
        {"count", SBX_OPT_INT, &count, ""},
        {"memory", SBX_OPT_SIZE, &memory, ""},
        {"sleep-after", SBX_OPT_MS, &sleep_after, ""},
        {"verbose", SBX_OPT_BOOL, &verbose, ""},
        {"etc", SBX_OPT_LIST, &etc, ""},
        {NULL, 0, NULL, NULL},
    };
    char why[256] = "";
    int rc = sbx_config_parse(opts, argc, argv, 1, &rest, why, sizeof(why));
    if (rc) {
        FUZZ_CHECK(rc == -EINVAL || rc < 0, "failure code %d", rc);
        FUZZ_CHECK(why[0] != '\0', "failure without a reason");
    } else {
        FUZZ_CHECK(rest != NULL, "no positional array");
        for (char **r = rest; *r; r++) {
            bool mine = false;
            for (int i = 1; i < argc; i++)
                mine |= *r == argv[i];
            FUZZ_CHECK(mine, "positional argument is not an argv element");
        }
        FUZZ_CHECK(*(unsigned char *)&verbose <= 1, "bool holds %d", *(unsigned char *)&verbose);
        if (name)
            FUZZ_CHECK(strlen(name) < (64u << 10), "name longer than the input");
        size_t items = 0;
        for (char **e = etc; e && *e; e++)
            items++;
        FUZZ_CHECK(items <= size + 128, "%zu list items from %zu bytes", items, size);
        FUZZ_CHECK(sleep_after == -1 || sleep_after >= 0, "negative duration %lld",
                   (long long)sleep_after);
    }
    sbx_strv_free(etc);
    free(name);
    free(rest);
    free(argstr);
    close(fd);
    return 0;
}
