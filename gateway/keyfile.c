/* keyfile.c — the API key file (keyfile.h). */
#include "keyfile.h"

#include <stdlib.h>
#include <string.h>

#include "../runtime/cleanup.h"
#include "../runtime/util.h"

void
sbx_keyfile_free(char **keys)
{
    for (char **k = keys; k && *k; k++)
        free(*k);
    free(keys);
}

int
sbx_keyfile_load(const char *path, char ***keys, sbx_err_t *err)
{
    _cleanup_free_ char *text = NULL;
    size_t n, count = 0;
    int rc = sbx_fs_read(path, 1 << 20, &text, &n);
    if (rc)
        return sbx_err_make(err, rc, "cannot read the API key file %s", path);
    char **out = sbx_xcalloc(1, sizeof(*out));
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        while (*line == ' ' || *line == '\t')
            line++;
        size_t l = strlen(line);
        while (l && (line[l - 1] == ' ' || line[l - 1] == '\t' || line[l - 1] == '\r'))
            line[--l] = 0;
        if (!l || line[0] == '#')
            continue;
        if (l < SBX_KEYFILE_MIN) {
            sbx_keyfile_free(out);
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "API keys must be at least %d characters (%s)", SBX_KEYFILE_MIN,
                                path);
        }
        out = sbx_xrealloc(out, (count + 2) * sizeof(*out));
        out[count++] = sbx_xstrdup(line);
        out[count] = NULL;
    }
    if (!count) {
        sbx_keyfile_free(out);
        return sbx_err_make(err, SBX_E_VALIDATION, "the API key file %s holds no key", path);
    }
    *keys = out;
    return 0;
}
