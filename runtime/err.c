/* err.c — error code table; see err.h. */
#include "err.h"

#include <errno.h>
#include <string.h>

struct errent {
    const char *name;
    int http;
    const char *msg;
};

static const struct errent errtab[] = {
#define SBX_ERR_TAB_(e, n, h, m) {n, h, m},
    SBX_ERRCODES(SBX_ERR_TAB_)
#undef SBX_ERR_TAB_
};

#define NERR ((int)(sizeof(errtab) / sizeof(errtab[0])))

static const struct errent *
lookup(int code)
{
    if (code > SBX_E__FIRST && code < SBX_E__LAST)
        return &errtab[code - SBX_E__FIRST - 1];
    return NULL;
}

/* -errno → the SDK name a user of its file and command API would expect. */
static int
from_errno(int e)
{
    switch (e) {
    case ENOENT: return SBX_E_FILE_NOT_FOUND;
    case EEXIST: return SBX_E_FILE_EXISTS;
    case EISDIR: return SBX_E_IS_DIRECTORY;
    case ENOTDIR: return SBX_E_NOT_DIRECTORY;
    case EACCES:
    case EPERM: return SBX_E_PERMISSION;
    case EROFS: return SBX_E_READ_ONLY;
    case ENOSPC:
    case EDQUOT: return SBX_E_DISK_FULL;
    case ENAMETOOLONG: return SBX_E_NAME_TOO_LONG;
    case EINVAL: return SBX_E_VALIDATION;
    case ETIMEDOUT: return SBX_E_TIMEOUT;
    case EFBIG: return SBX_E_FILE_TOO_LARGE;
    case EBUSY: return SBX_E_BUSY;
    case ELOOP:
    case EXDEV: return SBX_E_PERMISSION;
    default: return SBX_E_FILESYSTEM;
    }
}

const char *
sbx_err_name(int code)
{
    const struct errent *e = lookup(code);
    if (e)
        return e->name;
    if (code < 0 && code > -4096)
        return sbx_err_name(from_errno(-code));
    return "INTERNAL_ERROR";
}

int
sbx_err_http(int code)
{
    const struct errent *e = lookup(code);
    if (e)
        return e->http;
    if (code < 0 && code > -4096)
        return sbx_err_http(from_errno(-code));
    return 500;
}

const char *
sbx_err_message(int code)
{
    const struct errent *e = lookup(code);
    if (e)
        return e->msg;
    if (code < 0 && code > -4096)
        return strerror(-code);
    return "internal error";
}

int
sbx_err_from_name(const char *name, size_t n)
{
    for (int i = 0; i < NERR; i++) {
        if (strlen(errtab[i].name) == n && memcmp(errtab[i].name, name, n) == 0)
            return SBX_E__FIRST + 1 + i;
    }
    return SBX_E_INTERNAL;
}
