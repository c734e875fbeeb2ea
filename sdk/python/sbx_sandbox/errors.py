"""Exceptions raised by the sbx client.

Every failure the server reports is a :class:`SandboxError` carrying the
server's error body (``docs/http.md`` "Errors")::

    {"code": "FILE_NOT_FOUND", "message": "...", "context": {"path": "/x"},
     "httpStatus": 404, "operation": "file.read"}

Naming scheme
-------------
There is one class per error code, in this module, named after the code in
CamelCase **without** an ``Error`` suffix (so nothing shadows a built-in such
as ``FileNotFoundError``):

* ``CODE_NAME`` -> ``errors.CodeName`` (the code's words, no suffix added), e.g.
  ``FILE_NOT_FOUND`` -> ``errors.FileNotFound``,
  ``SESSION_ALREADY_EXISTS`` -> ``errors.SessionAlreadyExists``,
  ``PROCESS_READY_TIMEOUT`` -> ``errors.ProcessReadyTimeout``,
  ``GIT_CLONE_FAILED`` -> ``errors.GitCloneFailed``,
  ``INTERNAL_ERROR`` -> ``errors.InternalError``;
* every one of them subclasses :class:`SandboxError` (catch-all), and some
  subclass a family base as well (:class:`FilesystemError`,
  :class:`GitError`, :class:`ProcessError`, :class:`PortError`,
  :class:`SessionError`, :class:`CodeError`, :class:`TransientError`);
* where a built-in exception has the same meaning it is a base too, so
  ``except FileNotFoundError`` (built-in) also catches
  ``errors.FileNotFound``: ``FileNotFound`` -> ``FileNotFoundError``,
  ``FileExists`` -> ``FileExistsError``, ``IsDirectory`` ->
  ``IsADirectoryError``, ``NotDirectory`` -> ``NotADirectoryError``,
  ``PermissionDenied``/``ReadOnly`` -> ``PermissionError``, the timeouts ->
  ``TimeoutError``, ``GatewayUnavailable`` -> ``ConnectionError``;
* codes this version does not know become a plain :class:`SandboxError`
  (check ``err.code``).

Use :func:`error_class` to look a class up by code.

Usage::

    from sbx_sandbox import errors
    try:
        sandbox.read_file("/nope")
    except errors.FileNotFound as e:
        print(e.code, e.http_status, e.context["path"])
"""

from __future__ import annotations

import builtins
from typing import Any, Dict, Optional, Type

__all__ = ["SandboxError", "error_class", "from_body"]


class SandboxError(Exception):
    """Base class of every error the client raises.

    Attributes:
        code: the wire error code (``"FILE_NOT_FOUND"``), or a client-side
            code (``GATEWAY_UNAVAILABLE``, ``REQUEST_TIMEOUT``,
            ``INVALID_RESPONSE``).
        message: human-readable text from the server.
        http_status: the HTTP status of the response (``None`` for
            client-side errors).
        context: dict of details (``path``, ``sandboxId``, ``exitCode``, ...);
            always a dict, possibly empty.
        operation: the operation that failed (``"file.read"``), if known.
    """

    def __new__(cls, code: str = "", message: str = "", *args: Any, **kwargs: Any):
        # Built-in bases such as OSError interpret extra positional arguments
        # (errno, strerror, filename); give them the message only.
        return super().__new__(cls, message)

    def __init__(
        self,
        code: str,
        message: str = "",
        http_status: Optional[int] = None,
        context: Optional[Dict[str, Any]] = None,
        operation: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.http_status = http_status
        self.context: Dict[str, Any] = dict(context or {})
        self.operation = operation or self.context.get("operation")

    def __str__(self) -> str:
        where = f" ({self.operation})" if self.operation else ""
        return f"{self.code}{where}: {self.message}"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(code={self.code!r}, message={self.message!r}, "
            f"http_status={self.http_status!r}, operation={self.operation!r})"
        )

    def __reduce__(self):
        return (_rebuild, (self.code, self.message, self.http_status, self.context, self.operation))

    def to_dict(self) -> Dict[str, Any]:
        """The error as the server's JSON body shape."""
        return {
            "code": self.code,
            "message": self.message,
            "context": self.context,
            "httpStatus": self.http_status,
            "operation": self.operation,
        }


def _rebuild(code, message, http_status, context, operation):
    return from_body({"code": code, "message": message, "httpStatus": http_status,
                      "context": context, "operation": operation})


# -- families -----------------------------------------------------------------


class TransientError(SandboxError):
    """The deployment could not serve the request right now; retrying later
    may succeed (``SHARD_UNAVAILABLE``, ``CONTAINER_UNAVAILABLE``,
    ``INTERPRETER_NOT_READY``, ``GATEWAY_UNAVAILABLE``)."""


class FilesystemError(SandboxError):
    """A file operation failed: base of every file/path code, and the class
    of ``FILESYSTEM_ERROR`` itself (HTTP 500)."""


class SessionError(SandboxError):
    """A session operation failed."""


class ProcessError(SandboxError):
    """A background-process operation failed: base of the ``PROCESS_*``
    codes, and the class of ``PROCESS_ERROR`` itself (HTTP 500)."""


class PortError(SandboxError):
    """Exposing or reaching a port failed."""


class GitError(SandboxError):
    """``git_checkout`` failed."""


class CodeError(SandboxError):
    """The code interpreter failed (not an exception *inside* the user's
    code: those come back in ``Execution.error``)."""


class StreamError(SandboxError):
    """A stream could not be read."""


# -- one class per code ------------------------------------------------------------

# code: (class name, bases, HTTP status, doc)
_SPEC = [
    # request / deployment
    ("VALIDATION_FAILED", "ValidationFailed", (), 400, "An argument is invalid (bad sandbox ID, missing field, a cwd that is not a directory)."),
    ("MALFORMED_REQUEST", "MalformedRequest", (), 400, "The request body or frame is not valid."),
    ("UNKNOWN_OPERATION", "UnknownOperation", (), 400, "The operation does not exist on this server."),
    ("UNSUPPORTED_VERSION", "UnsupportedVersion", (), 400, "Protocol version mismatch."),
    ("REQUEST_TOO_LARGE", "RequestTooLarge", (), 413, "The request body exceeds the server's limit (32 MiB over HTTP)."),
    ("SANDBOX_NOT_FOUND", "SandboxNotFound", (), 404, "A non-creating operation named an unknown sandbox."),
    ("SHARD_UNAVAILABLE", "ShardUnavailable", (TransientError,), 503, "The owning shard is unreachable (retried automatically first)."),
    ("WRONG_OWNER", "WrongOwner", (TransientError,), 421, "The shard does not own the sandbox's partition."),
    ("REQUEST_TIMEOUT", "RequestTimeout", (builtins.TimeoutError,), 504, "The deadline passed without a reply (also ``process.waitForExit``)."),
    ("CONTAINER_UNAVAILABLE", "ContainerUnavailable", (TransientError,), 503, "The container could not start, or ended while the operation ran."),
    ("STORAGE_ERROR", "StorageError", (), 500, "A metadata write could not be committed."),
    ("INTERNAL_ERROR", "InternalError", (), 500, "A server bug; the message says where."),
    ("OPERATION_INTERRUPTED", "OperationInterrupted", (), 409, "The sandbox was destroyed or the shard stopped during the operation."),
    ("RESOURCE_BUSY", "ResourceBusy", (), 409, "The resource is in use (e.g. a process ID that already exists)."),
    ("UNAUTHORIZED", "Unauthorized", (builtins.PermissionError,), 401, "Missing or wrong API key."),
    ("ROUTE_NOT_FOUND", "RouteNotFound", (), 404, "The HTTP route does not exist (server older than the client?)."),
    # files
    ("FILE_NOT_FOUND", "FileNotFound", (FilesystemError, builtins.FileNotFoundError), 404, "The path does not exist."),
    ("FILE_EXISTS", "FileExists", (FilesystemError, builtins.FileExistsError), 409, "The path already exists."),
    ("IS_DIRECTORY", "IsDirectory", (FilesystemError, builtins.IsADirectoryError), 400, "The path is a directory (e.g. ``delete_file`` on a directory)."),
    ("NOT_DIRECTORY", "NotDirectory", (FilesystemError, builtins.NotADirectoryError), 400, "A path component is not a directory."),
    ("FILE_TOO_LARGE", "FileTooLarge", (FilesystemError,), 413, "The file is over the 32 MiB read limit; use ``read_file_stream``."),
    ("PERMISSION_DENIED", "PermissionDenied", (FilesystemError, builtins.PermissionError), 403, "Access refused (also procfs/sysfs/devices)."),
    ("READ_ONLY", "ReadOnly", (FilesystemError, builtins.PermissionError), 403, "Read-only file system."),
    ("NO_SPACE", "NoSpace", (FilesystemError,), 500, "No space left in the sandbox."),
    ("NAME_TOO_LONG", "NameTooLong", (FilesystemError,), 400, "A path or name is too long."),
    ("FILESYSTEM_ERROR", "FilesystemError", (), 500, None),
    ("WATCH_NOT_FOUND", "WatchNotFound", (FilesystemError,), 404, "The watch does not exist."),
    ("WATCH_START_ERROR", "WatchStartError", (FilesystemError,), 500, "The watch could not be set up."),
    # commands / sessions
    ("COMMAND_NOT_FOUND", "CommandNotFound", (), 404, "The command does not exist."),
    ("COMMAND_EXECUTION_ERROR", "CommandExecutionError", (), 500, "The command could not be started (e.g. pids limit exhausted)."),
    ("SESSION_ALREADY_EXISTS", "SessionAlreadyExists", (SessionError,), 409, "``create_session`` with an ID in use."),
    ("SESSION_NOT_FOUND", "SessionNotFound", (SessionError,), 404, "The session does not exist (or died with its container)."),
    ("SESSION_TERMINATED", "SessionTerminated", (SessionError,), 410, "The command ended its session's shell (``exit N``); ``context`` holds ``exitCode``, ``stdout``, ``stderr``. The next command gets a fresh shell."),
    ("SESSION_DESTROYED", "SessionDestroyed", (SessionError,), 410, "The session was destroyed."),
    # processes
    ("PROCESS_NOT_FOUND", "ProcessNotFound", (ProcessError,), 404, "The process ID is unknown."),
    ("PROCESS_ERROR", "ProcessError", (), 500, None),
    ("PROCESS_READY_TIMEOUT", "ProcessReadyTimeout", (ProcessError, builtins.TimeoutError), 408, "``wait_for_log``/``wait_for_port`` timed out."),
    ("PROCESS_EXITED_BEFORE_READY", "ProcessExitedBeforeReady", (ProcessError,), 500, "The process exited before the log line / port appeared."),
    # streams
    ("STREAM_NOT_FOUND", "StreamNotFound", (StreamError,), 404, "The stream is gone (fully read, expired, or its container ended)."),
    # code interpreter
    ("CONTEXT_NOT_FOUND", "ContextNotFound", (CodeError,), 404, "The code context does not exist."),
    ("CODE_EXECUTION_ERROR", "CodeExecutionError", (CodeError,), 500, "The interpreter failed (e.g. the context is dead: delete and recreate it)."),
    ("INTERPRETER_NOT_READY", "InterpreterNotReady", (CodeError, TransientError), 503, "The interpreter is still starting."),
    ("PYTHON_NOT_AVAILABLE", "PythonNotAvailable", (CodeError,), 501, "No Python in the sandbox image."),
    ("JAVASCRIPT_NOT_AVAILABLE", "JavascriptNotAvailable", (CodeError,), 501, "No Node in the sandbox image."),
    # ports / preview
    ("INVALID_PORT_NUMBER", "InvalidPortNumber", (PortError,), 400, "Ports must be 1024-65535."),
    ("INVALID_PORT", "InvalidPort", (PortError,), 400, "Invalid port."),
    ("PORT_NOT_EXPOSED", "PortNotExposed", (PortError,), 404, "The port is not exposed."),
    ("PORT_ALREADY_EXPOSED", "PortAlreadyExposed", (PortError,), 409, "A custom token is used by another port."),
    ("PORT_IN_USE", "PortInUse", (PortError,), 409, "The port is in use."),
    ("INVALID_TOKEN", "InvalidToken", (PortError,), 404, "Unknown sandbox, port or token in a preview URL."),
    ("STALE_PREVIEW_URL", "StalePreviewUrl", (PortError,), 410, "The preview URL's container is gone; call ``expose_port`` again."),
    ("SERVICE_NOT_RESPONDING", "ServiceNotResponding", (PortError,), 502, "Nothing listens on the port yet."),
    ("CUSTOM_DOMAIN_REQUIRED", "CustomDomainRequired", (PortError,), 400, "The hostname cannot serve preview URLs."),
    # git
    ("INVALID_GIT_URL", "InvalidGitUrl", (GitError,), 400, "Not a git URL (https, http, git, ssh, file or user@host:path)."),
    ("GIT_REPOSITORY_NOT_FOUND", "GitRepositoryNotFound", (GitError,), 404, "The repository does not exist."),
    ("GIT_BRANCH_NOT_FOUND", "GitBranchNotFound", (GitError,), 404, "The branch does not exist."),
    ("GIT_AUTH_FAILED", "GitAuthFailed", (GitError,), 401, "Authentication failed."),
    ("GIT_NETWORK_ERROR", "GitNetworkError", (GitError,), 502, "Network failure while cloning."),
    ("GIT_CLONE_FAILED", "GitCloneFailed", (GitError,), 500, "``git clone`` failed (context: ``repoUrl``, ``exitCode``)."),
    ("GIT_CHECKOUT_FAILED", "GitCheckoutFailed", (GitError,), 500, "Checkout failed."),
    # client side
    ("GATEWAY_UNAVAILABLE", "GatewayUnavailable", (TransientError, builtins.ConnectionError), None, "(client side) the server could not be reached after the retries."),
    ("INVALID_RESPONSE", "InvalidResponse", (), None, "(client side) the server's answer could not be understood."),
    ("WEBSOCKET_ERROR", "WebSocketError", (), None, "(client side) the terminal WebSocket failed (handshake or framing)."),
    # images (docs/images.md)
    ("IMAGE_NOT_FOUND", "ImageNotFound", (), 404, "No such image in the node's store (or no such path to import)."),
    ("IMAGE_INVALID", "ImageInvalid", (), 400, "The image is corrupt, tampered with, unsafe, or has no /bin/sh."),
    ("TEMPLATE_BUILD_FAILED", "TemplateBuildFailed", (), 400, "A step of ``template.build`` exited non-zero; the message quotes its output."),
    # backups (docs/persistence.md)
    ("BACKUP_NOT_FOUND", "BackupNotFound", (), 404, "No such backup in the node's store."),
    ("BACKUP_EXPIRED", "BackupExpired", (), 410, "The backup's ttl has passed."),
    ("BACKUP_TOO_LARGE", "BackupTooLarge", (), 413, "The backup's archive exceeds the store's limit per backup."),
    # disk and fork (docs/persistence.md)
    ("DISK_FULL", "DiskFull", (FilesystemError,), 507, "A write, mkdir or backup restore ran out of the sandbox's disk; the message names its limit."),
    ("SANDBOX_EXISTS", "SandboxExists", (), 409, "``fork`` into an ID that is a sandbox already."),
    ("FORK_CROSS_SHARD", "ForkCrossShard", (), 409, "In a cluster, a fork's ID is owned by another shard than its source's: choose another ID."),
    # tenants (docs/security.md §6)
    ("QUOTA_EXCEEDED", "QuotaExceeded", (), 429, "A quota of the caller's tenant is used up; ``context['retryAfterMs']`` says when to try again."),
    # backups in S3 (docs/persistence.md, "The S3 store")
    ("BACKUP_STORE_UNAVAILABLE", "BackupStoreUnavailable", (), 503, "The deployment's S3 backup store did not answer by the call's deadline, or refused the request (the message says which); nothing was changed in the sandbox."),
]

_BY_CODE: Dict[str, Type[SandboxError]] = {}
#: code -> default HTTP status, for errors synthesised on the client side.
HTTP_STATUS: Dict[str, Optional[int]] = {}

for _code, _name, _bases, _status, _doc in _SPEC:
    if _doc is None:  # the code's class is a family base defined above
        _cls = globals()[_name]
        _cls.CODE = _code
        _BY_CODE[_code] = _cls
        HTTP_STATUS[_code] = _status
        continue
    if not any(isinstance(b, type) and issubclass(b, SandboxError) for b in _bases):
        _bases = (SandboxError,) + tuple(_bases)
    _cls = type(_name, tuple(_bases), {"__doc__": f"``{_code}`` (HTTP {_status}). {_doc}",
                                       "__module__": __name__, "CODE": _code})
    globals()[_name] = _cls
    __all__.append(_name)
    _BY_CODE[_code] = _cls
    HTTP_STATUS[_code] = _status

__all__ += ["TransientError", "FilesystemError", "SessionError", "ProcessError", "PortError",
            "GitError", "CodeError", "StreamError", "HTTP_STATUS", "make"]

del _code, _name, _bases, _status, _doc, _cls


def error_class(code: str) -> Type[SandboxError]:
    """The class for an error code (``SandboxError`` for unknown codes)."""
    return _BY_CODE.get(code, SandboxError)


def from_body(body: Dict[str, Any], http_status: Optional[int] = None,
              operation: Optional[str] = None) -> SandboxError:
    """Build the exception for a server error body
    ``{code, message, context, httpStatus, operation}``."""
    code = str(body.get("code") or "UNKNOWN_ERROR")
    ctx = body.get("context")
    if not isinstance(ctx, dict):
        ctx = {}
    status = body.get("httpStatus", http_status)
    if status is None:
        status = http_status
    return error_class(code)(code, str(body.get("message", "")), status, ctx,
                             body.get("operation") or operation)


def make(code: str, message: str, context: Optional[Dict[str, Any]] = None,
         operation: Optional[str] = None) -> SandboxError:
    """Build a client-side error of the given code."""
    return error_class(code)(code, message, HTTP_STATUS.get(code), context, operation)
