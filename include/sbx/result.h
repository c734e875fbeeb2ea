/*
 * sbx/result.h — reading results, events and error contexts: the maps of
 * docs/protocol.md as msgpack objects (msgpack-c's msgpack_object, a view
 * into the reply; its own fields may be read directly too).  Included by
 * <sbx/sbx.h>.
 *
 *     sbx_view id;
 *     int64_t gen;
 *     const msgpack_object *arr;
 *     if (sbx_get_array(sbx_reply_result(r), "sandboxes", &arr) == 0)
 *         for (uint32_t i = 0; i < arr->via.array.size; i++)
 *             if (sbx_get_str(&arr->via.array.ptr[i], "id", &id) == 0 &&
 *                 sbx_get_i64(&arr->via.array.ptr[i], "generation", &gen) == 0)
 *                 printf("%.*s %lld\n", (int)id.n, id.p, (long long)gen);
 *
 * Every sbx_get_* looks `key` up in `map` and returns 0 with *out set,
 * -ENOENT when the key is absent or nil (or map is NULL or not a map), or
 * VALIDATION_FAILED's code when the value has another type; *out is left
 * alone on failure, so a default set before the call survives.  What they
 * hand out points into the map's reply (or event): valid until it is freed.
 * Thread safety: as the reply.
 */
#ifndef SBX_RESULT_H
#define SBX_RESULT_H

#include <errno.h> /* ENOENT, which the sbx_get_* return negated */
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifndef SBX_API
#if defined(__GNUC__)
#define SBX_API __attribute__((visibility("default")))
#else
#define SBX_API
#endif
#endif

/* sbx_view — n bytes at p, not NUL-terminated (print with "%.*s"). */
typedef struct sbx_view {
    const char *p;
    size_t n;
} sbx_view;

/* sbx_get — the value of key in map, or NULL (absent or nil). */
SBX_API const msgpack_object *sbx_get(const msgpack_object *map, const char *key);
/* sbx_get_str — a string value. */
SBX_API int sbx_get_str(const msgpack_object *map, const char *key, sbx_view *out);
/* sbx_get_bytes — a bytes value (bin) or a string: output, file content. */
SBX_API int sbx_get_bytes(const msgpack_object *map, const char *key, sbx_view *out);
/* sbx_get_i64 — an integer that fits int64_t. */
SBX_API int sbx_get_i64(const msgpack_object *map, const char *key, int64_t *out);
/* sbx_get_bool — true or false. */
SBX_API int sbx_get_bool(const msgpack_object *map, const char *key, bool *out);
/* sbx_get_map / sbx_get_array — a nested map or array (read its elements
 * through ->via.array.ptr[0 .. ->via.array.size)). */
SBX_API int sbx_get_map(const msgpack_object *map, const char *key, const msgpack_object **out);
SBX_API int sbx_get_array(const msgpack_object *map, const char *key,
                          const msgpack_object **out);
/* sbx_value_str — o itself as a string (an element of an array of
 * strings): 0, or VALIDATION_FAILED's code when o is not a string. */
SBX_API int sbx_value_str(const msgpack_object *o, sbx_view *out);
/* sbx_view_eq — whether v holds exactly the NUL-terminated s. */
SBX_API bool sbx_view_eq(sbx_view v, const char *s);
/* sbx_value_json — o as JSON text (heap, caller frees; pretty: 2-space
 * indentation, else compact); bytes become strings (invalid UTF-8 as
 * U+FFFD).  NULL when o has a non-string map key or out of memory. */
SBX_API char *sbx_value_json(const msgpack_object *o, bool pretty);
/* sbx_base64_to_bytes — decode base64 text (a file read with encoding
 * "base64") into heap bytes (caller frees; NUL-terminated, *len without it).
 * 0, or VALIDATION_FAILED's code when the text is not base64. */
SBX_API int sbx_base64_to_bytes(const char *text, size_t n, char **out, size_t *len);

#endif
