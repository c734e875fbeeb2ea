/*
 * err.h — the one error convention of sbx.
 *
 * Every function returns 0 on success or a negative code.  Codes in
 * (-4096, 0) are -errno values passed through untouched; codes at or below
 * SBX_ERR_BASE are sbx's own and each one has a stable wire name (the string
 * clients see in `error.code`).  Where the Cloudflare Sandbox SDK defines a
 * code for the same situation we use its name and HTTP status
 * (packages/shared/src/errors/{codes,status-map}.ts, see
 * ../shared/reference/cloudflare-sandbox-sdk.md §1.4); cluster faults and
 * protocol faults have names of our own.  docs/protocol.md lists them all.
 */
#ifndef SBX_ERR_H
#define SBX_ERR_H

#include <stddef.h>

#define SBX_ERR_BASE (-10000)

/* X(enum, wire name, http status, default message) */
#define SBX_ERRCODES(X)                                                                  \
    X(SBX_E_VALIDATION, "VALIDATION_FAILED", 400, "invalid argument")                    \
    X(SBX_E_MALFORMED, "MALFORMED_REQUEST", 400, "malformed request frame")              \
    X(SBX_E_UNKNOWN_OP, "UNKNOWN_OPERATION", 400, "unknown operation")                   \
    X(SBX_E_VERSION, "UNSUPPORTED_VERSION", 400, "unsupported protocol version")         \
    X(SBX_E_TOO_LARGE, "REQUEST_TOO_LARGE", 413, "request exceeds the size limit")       \
    X(SBX_E_RESULT_TOO_LARGE, "RESULT_TOO_LARGE", 413, "result exceeds the size limit")  \
    X(SBX_E_NOT_FOUND, "SANDBOX_NOT_FOUND", 404, "sandbox not found")                    \
    X(SBX_E_SHARD_UNAVAILABLE, "SHARD_UNAVAILABLE", 503, "shard unavailable")            \
    X(SBX_E_WRONG_OWNER, "WRONG_OWNER", 421, "shard does not own this partition")       \
    X(SBX_E_TIMEOUT, "REQUEST_TIMEOUT", 504, "request deadline exceeded")                \
    X(SBX_E_CONTAINER, "CONTAINER_UNAVAILABLE", 503, "container could not be started")   \
    X(SBX_E_STORAGE, "STORAGE_ERROR", 500, "metadata store error")                       \
    X(SBX_E_STORAGE_FULL, "STORAGE_FULL", 507, "metadata store full")                    \
    X(SBX_E_INTERNAL, "INTERNAL_ERROR", 500, "internal error")                            \
    X(SBX_E_INTERRUPTED, "OPERATION_INTERRUPTED", 409, "operation interrupted")          \
    X(SBX_E_BUSY, "RESOURCE_BUSY", 409, "resource busy")                                 \
    X(SBX_E_FILE_NOT_FOUND, "FILE_NOT_FOUND", 404, "file not found")                     \
    X(SBX_E_FILE_EXISTS, "FILE_EXISTS", 409, "file exists")                              \
    X(SBX_E_IS_DIRECTORY, "IS_DIRECTORY", 400, "is a directory")                         \
    X(SBX_E_NOT_DIRECTORY, "NOT_DIRECTORY", 400, "not a directory")                      \
    X(SBX_E_FILE_TOO_LARGE, "FILE_TOO_LARGE", 413, "file too large")                     \
    X(SBX_E_PERMISSION, "PERMISSION_DENIED", 403, "permission denied")                   \
    X(SBX_E_READ_ONLY, "READ_ONLY", 403, "read-only file system")                        \
    X(SBX_E_NO_SPACE, "NO_SPACE", 500, "no space left in the sandbox")                   \
    X(SBX_E_NAME_TOO_LONG, "NAME_TOO_LONG", 400, "name too long")                        \
    X(SBX_E_FILESYSTEM, "FILESYSTEM_ERROR", 500, "file system error")                    \
    X(SBX_E_COMMAND_NOT_FOUND, "COMMAND_NOT_FOUND", 404, "command not found")            \
    X(SBX_E_COMMAND, "COMMAND_EXECUTION_ERROR", 500, "command execution failed")         \
    X(SBX_E_SESSION_EXISTS, "SESSION_ALREADY_EXISTS", 409, "session already exists")     \
    X(SBX_E_SESSION_NOT_FOUND, "SESSION_NOT_FOUND", 404, "session not found")            \
    X(SBX_E_SESSION_TERMINATED, "SESSION_TERMINATED", 410, "session shell exited")       \
    X(SBX_E_PROCESS_NOT_FOUND, "PROCESS_NOT_FOUND", 404, "process not found")            \
    X(SBX_E_PROCESS, "PROCESS_ERROR", 500, "process error")                              \
    X(SBX_E_READY_TIMEOUT, "PROCESS_READY_TIMEOUT", 408, "process did not become ready") \
    X(SBX_E_EXITED_BEFORE_READY, "PROCESS_EXITED_BEFORE_READY", 500,                     \
      "process exited before becoming ready")                                            \
    X(SBX_E_STREAM_NOT_FOUND, "STREAM_NOT_FOUND", 404, "stream not found")               \
    X(SBX_E_CONTEXT_NOT_FOUND, "CONTEXT_NOT_FOUND", 404, "code context not found")       \
    X(SBX_E_CODE, "CODE_EXECUTION_ERROR", 500, "code execution failed")                  \
    X(SBX_E_INTERPRETER_NOT_READY, "INTERPRETER_NOT_READY", 503, "interpreter not ready") \
    X(SBX_E_PYTHON_NA, "PYTHON_NOT_AVAILABLE", 501, "python is not available")           \
    X(SBX_E_JAVASCRIPT_NA, "JAVASCRIPT_NOT_AVAILABLE", 501, "node is not available")     \
    X(SBX_E_INVALID_PORT, "INVALID_PORT_NUMBER", 400, "invalid port number")             \
    X(SBX_E_PORT_NOT_EXPOSED, "PORT_NOT_EXPOSED", 404, "port not exposed")               \
    X(SBX_E_PORT_EXPOSED, "PORT_ALREADY_EXPOSED", 409, "port already exposed")           \
    X(SBX_E_INVALID_TOKEN, "INVALID_TOKEN", 404, "invalid token or port not exposed")    \
    X(SBX_E_STALE_PREVIEW, "STALE_PREVIEW_URL", 410, "preview URL is stale")             \
    X(SBX_E_CUSTOM_DOMAIN, "CUSTOM_DOMAIN_REQUIRED", 400, "host cannot carry preview URLs") \
    X(SBX_E_SERVICE_NOT_RESPONDING, "SERVICE_NOT_RESPONDING", 502, "service not responding") \
    X(SBX_E_INVALID_GIT_URL, "INVALID_GIT_URL", 400, "invalid git URL")                  \
    X(SBX_E_GIT_REPO_NOT_FOUND, "GIT_REPOSITORY_NOT_FOUND", 404, "git repository not found") \
    X(SBX_E_GIT_BRANCH_NOT_FOUND, "GIT_BRANCH_NOT_FOUND", 404, "git branch not found")   \
    X(SBX_E_GIT_AUTH, "GIT_AUTH_FAILED", 401, "git authentication failed")               \
    X(SBX_E_GIT_NETWORK, "GIT_NETWORK_ERROR", 502, "git network error")                  \
    X(SBX_E_GIT_CLONE, "GIT_CLONE_FAILED", 500, "git clone failed")                      \
    X(SBX_E_WATCH_NOT_FOUND, "WATCH_NOT_FOUND", 404, "watch not found")                  \
    X(SBX_E_WATCH_START, "WATCH_START_ERROR", 500, "watch could not start")              \
    X(SBX_E_UNAUTHORIZED, "UNAUTHORIZED", 401, "missing or invalid API key")             \
    X(SBX_E_ROUTE_NOT_FOUND, "ROUTE_NOT_FOUND", 404, "no such route")                    \
    X(SBX_E_IMAGE_NOT_FOUND, "IMAGE_NOT_FOUND", 404, "no such image in the node's store")  \
    X(SBX_E_IMAGE_INVALID, "IMAGE_INVALID", 400, "the image is corrupt or unsafe")        \
    X(SBX_E_TEMPLATE_BUILD, "TEMPLATE_BUILD_FAILED", 400, "a template's build step failed")   \
    X(SBX_E_BACKUP_NOT_FOUND, "BACKUP_NOT_FOUND", 404, "no such backup in the node's store")  \
    X(SBX_E_BACKUP_EXPIRED, "BACKUP_EXPIRED", 410, "the backup's ttl has passed")             \
    X(SBX_E_BACKUP_TOO_LARGE, "BACKUP_TOO_LARGE", 413, "the backup exceeds the size limit") \
    X(SBX_E_DISK_FULL, "DISK_FULL", 507, "the sandbox's disk is full")                         \
    X(SBX_E_SANDBOX_EXISTS, "SANDBOX_EXISTS", 409, "the sandbox exists already")              \
    X(SBX_E_FORK_CROSS_SHARD, "FORK_CROSS_SHARD", 409,                                         \
      "a fork's owner cannot be reached from its source (retry)")                               \
    X(SBX_E_QUOTA_EXCEEDED, "QUOTA_EXCEEDED", 429, "a quota of the caller's tenant is used up") \
    X(SBX_E_BACKUP_STORE_UNAVAILABLE, "BACKUP_STORE_UNAVAILABLE", 503,                         \
      "the backup store did not answer, or refused the request")

enum sbx_errcode {
    SBX_E__FIRST = SBX_ERR_BASE,
#define SBX_ERR_ENUM_(e, n, h, m) e,
    SBX_ERRCODES(SBX_ERR_ENUM_)
#undef SBX_ERR_ENUM_
    SBX_E__LAST
};

/*
 * sbx_err_name — stable wire name of a code ("VALIDATION_FAILED").
 * -errno codes map to the closest SDK name (ENOENT → FILE_NOT_FOUND, …);
 * anything unknown is "INTERNAL_ERROR".  Never NULL; static storage.
 */
const char *sbx_err_name(int code);

/* sbx_err_http — HTTP status of a code (the SDK's status map); 500 if unknown. */
int sbx_err_http(int code);

/*
 * sbx_err_message — a short human description of a code (static storage);
 * for -errno codes it is strerror's text.
 */
const char *sbx_err_message(int code);

/*
 * sbx_err_from_name — inverse of sbx_err_name for sbx's own codes.
 * Returns the code, or SBX_E_INTERNAL when the name is unknown.  `n` is the
 * length of `name` (it need not be NUL-terminated).
 */
int sbx_err_from_name(const char *name, size_t n);

#endif
