/*
 * id.h — sandbox IDs and request IDs.
 *
 * Sandbox IDs follow the product contract (../shared/README.md): 1–63
 * characters of [a-z0-9-], no leading or trailing '-'.  That is a DNS label
 * (RFC 1035 §2.3.1, relaxed to allow a leading digit as RFC 1123 §2.1 does),
 * so `{port}-{id}-{token}.{host}` preview URLs stay valid hostnames.
 */
#ifndef SBX_ID_H
#define SBX_ID_H

#include <stdbool.h>
#include <stddef.h>

#define SBX_ID_MAX 63

/*
 * sbx_id_check — 0 if `id` (n bytes, need not be NUL-terminated) is a valid
 * sandbox ID, else SBX_E_VALIDATION with the reason in why[whylen].
 */
int sbx_id_check(const char *id, size_t n, char *why, size_t whylen);

/* sbx_id_check_name — the same rule for session, process and context IDs,
 * which may also use '_' and '.' and be up to `max` bytes. */
int sbx_id_check_name(const char *what, const char *id, size_t n, size_t max, char *why,
                      size_t whylen);

/* sbx_request_id — a fresh random request id (UUID v4, lower-case, 36 chars + NUL). */
void sbx_request_id(char out[37]);

#endif
