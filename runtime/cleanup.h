/*
 * cleanup.h — scope-bound cleanup (GCC/Clang `__attribute__((cleanup))`),
 * as crun's utils.h and bubblewrap's utils.h: a variable declared with one
 * of these is released when it goes out of scope, on every return path, so
 * a function needs no `goto fail` ladder for memory, descriptors and
 * buffers.  `goto` stays where cleanup is transactional (abort an LMDB
 * transaction, undo a half-registered actor).  docs/errors.md has the
 * convention.
 *
 *     _cleanup_free_ char *buf = malloc(n);
 *     _cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
 *     if (fd < 0)
 *         return sbx_err_make(err, -errno, "open `%s`", path);   // buf freed
 *     …
 *     *out = sbx_steal_pointer(&buf);                               // not freed
 *     return 0;                                                     // fd closed
 *
 * Every variable must be initialised where it is declared (NULL, -1, or
 * the value), since the cleanup runs even on a return before any
 * assignment.
 */
#ifndef SBX_CLEANUP_H
#define SBX_CLEANUP_H

#include <errno.h>
#include <msgpack.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void
sbx_cleanup_free_(void *p)
{
    free(*(void **)p);
}

static inline void
sbx_cleanup_close_(int *fd)
{
    if (*fd >= 0) {
        int saved = errno; /* close must not clobber the errno being reported */
        close(*fd);
        errno = saved;
    }
}

static inline void
sbx_cleanup_fclose_(FILE **f)
{
    if (*f)
        fclose(*f);
}

static inline void
sbx_cleanup_msgpack_sbuffer_(msgpack_sbuffer *b)
{
    msgpack_sbuffer_destroy(b);
}

static inline void
sbx_cleanup_strv_(char ***v)
{
    if (*v)
        for (char **p = *v; *p; p++)
            free(*p);
    free(*v);
}

/* free() a heap pointer. */
#define _cleanup_free_ __attribute__((cleanup(sbx_cleanup_free_)))
/* close() a descriptor unless it is negative (errno kept). */
#define _cleanup_close_ __attribute__((cleanup(sbx_cleanup_close_)))
/* fclose() a FILE * unless it is NULL. */
#define _cleanup_fclose_ __attribute__((cleanup(sbx_cleanup_fclose_)))
/* msgpack_sbuffer_destroy() a msgpack_sbuffer (initialised at declaration:
 * `_cleanup_msgpack_sbuffer_ msgpack_sbuffer b = {0};` is a valid empty one). */
#define _cleanup_msgpack_sbuffer_ __attribute__((cleanup(sbx_cleanup_msgpack_sbuffer_)))
/* free a NULL-terminated array of heap strings and the array. */
#define _cleanup_strv_ __attribute__((cleanup(sbx_cleanup_strv_)))

/* sbx_steal_pointer — return *pp and set it to NULL, so the cleanup of the
 * variable does not free what is handed on (ownership moves to the caller). */
static inline void *
sbx_steal_pointer(void *pp)
{
    void **p = pp;
    void *v = *p;
    *p = NULL;
    return v;
}

/* sbx_steal_fd — the same for a descriptor (the variable becomes -1). */
static inline int
sbx_steal_fd(int *fd)
{
    int v = *fd;
    *fd = -1;
    return v;
}

#endif
