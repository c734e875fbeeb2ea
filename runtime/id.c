/* id.c — see id.h. */
#include "id.h"

#include <stdio.h>
#include <uuid/uuid.h>

#include "err.h"

int
sbx_id_check(const char *id, size_t n, char *why, size_t whylen)
{
    if (n == 0 || n > SBX_ID_MAX) {
        snprintf(why, whylen, "sandbox ID must be 1-%d characters long (got %zu)", SBX_ID_MAX, n);
        return SBX_E_VALIDATION;
    }
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) {
            snprintf(why, whylen,
                     "sandbox ID may only contain lower-case letters, digits and '-' "
                     "(byte %zu is 0x%02x)", i, (unsigned char)c);
            return SBX_E_VALIDATION;
        }
    }
    if (id[0] == '-' || id[n - 1] == '-') {
        snprintf(why, whylen, "sandbox ID must not start or end with '-'");
        return SBX_E_VALIDATION;
    }
    return 0;
}

int
sbx_id_check_name(const char *what, const char *id, size_t n, size_t max, char *why, size_t whylen)
{
    if (n == 0 || n > max) {
        snprintf(why, whylen, "%s must be 1-%zu characters long", what, max);
        return SBX_E_VALIDATION;
    }
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.')) {
            snprintf(why, whylen, "%s may only contain letters, digits, '-', '_' and '.'", what);
            return SBX_E_VALIDATION;
        }
    }
    if (id[0] == '.') {
        snprintf(why, whylen, "%s must not start with '.'", what);
        return SBX_E_VALIDATION;
    }
    return 0;
}

void
sbx_request_id(char out[37])
{
    uuid_t u;
    uuid_generate_random(u);
    uuid_unparse_lower(u, out);
}
