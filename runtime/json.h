/*
 * json.h — msgpack ↔ JSON, with jansson (Debian libjansson) doing the JSON.
 *
 * Used by the CLI's --json output, `sbx call`'s JSON arguments and the
 * HTTP front.  Mapping: map ↔ object (keys must be strings), array ↔
 * array, str ↔ string, bin → string (JSON has no bytes; invalid UTF-8 is
 * replaced by U+FFFD, so binary data belongs in base64 fields), integers,
 * floats, true/false, nil ↔ null.
 */
#ifndef SBX_JSON_H
#define SBX_JSON_H

#include <jansson.h>
#include <msgpack.h>
#include <stdbool.h>

#include "wire.h"

/* sbx_json_from_msgpack — a new json_t (caller json_decref's it); NULL on a
 * non-string map key or an ext type. */
json_t *sbx_json_from_msgpack(const msgpack_object *o);

/* sbx_json_from_msgpack_b64 — the same, but bin becomes the base64 of its
 * bytes (lossless; the HTTP front's X-Sbx-Binary: base64). */
json_t *sbx_json_from_msgpack_b64(const msgpack_object *o);

/* sbx_utf8_seq — length (1-4) of the valid UTF-8 sequence at s[0..n), n ≥ 1
 * (RFC 3629: no overlong forms, no surrogates, ≤ U+10FFFF), or 0 if the bytes
 * there are not one. */
size_t sbx_utf8_seq(const char *s, size_t n);

/* sbx_utf8_valid — length of the longest prefix of p[0..n) that is valid
 * UTF-8 (RFC 3629).  *incomplete (may be NULL) gets the length of a
 * sequence cut short at the very end (then the prefix plus it is all of
 * p), or 0. */
size_t sbx_utf8_valid(const char *p, size_t n, size_t *incomplete);

/* sbx_json_to_msgpack — append j to e; 0 or SBX_E_VALIDATION (reals that
 * are not finite, nesting deeper than 24). */
int sbx_json_to_msgpack(const json_t *j, sbx_enc *e);

/* sbx_json_dump — JSON text of o (heap, caller frees), pretty with 2-space
 * indentation or compact; NULL on failure. */
char *sbx_json_dump(const msgpack_object *o, bool pretty);

/* sbx_utf8_complete_prefix — length of the longest prefix of p[0..n) that
 * does not end inside a UTF-8 sequence: a read, a cap or an event boundary
 * may cut a character in two, and the held-back tail (at most 3 bytes) is
 * carried to the next piece.  Only a lead byte whose sequence is incomplete
 * is held back; invalid bytes stay for sbx_utf8_sanitize to replace. */
size_t sbx_utf8_complete_prefix(const char *p, size_t n);

/* sbx_utf8_sanitize — copy of p[0..n) as valid UTF-8 (U+FFFD for every
 * invalid byte), NUL-terminated, heap; *outlen gets its length. */
char *sbx_utf8_sanitize(const char *p, size_t n, size_t *outlen);

#endif
