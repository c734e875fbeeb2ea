/*
 * keyfile.h — the API key file of `sbxd --api-keys` (docs/http.md, "API
 * keys"): one key per line, at least 16 characters; blank lines and lines
 * starting with `#` are skipped; spaces, tabs and a CR around a key are
 * not part of it.  Read by the HTTP front (whether keys are on) and by the
 * tenant registry (the file's keys are admin keys, gateway/tenant.h).
 */
#ifndef SBX_GW_KEYFILE_H
#define SBX_GW_KEYFILE_H
#include "../runtime/err.h"
#include "../runtime/error.h"

#define SBX_KEYFILE_MIN 16 /* characters of a key */

/*
 * sbx_keyfile_load — the keys of the file at path (at most 1 MiB) into
 * *keys: a NULL-terminated heap array of heap strings, at least one (free
 * with sbx_keyfile_free).  0; or an error with err set: the read's
 * (-ENOENT, -EACCES, …), SBX_E_VALIDATION for a key shorter than
 * SBX_KEYFILE_MIN or a file with no key.  *keys is untouched on error.
 */
int sbx_keyfile_load(const char *path, char ***keys, sbx_err_t *err);
/* sbx_keyfile_free — free what sbx_keyfile_load returned (NULL is fine). */
void sbx_keyfile_free(char **keys);
#endif
