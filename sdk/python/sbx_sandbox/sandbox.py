"""SbxClient, Sandbox, ExecutionSession and Process."""

from __future__ import annotations

import base64
import os
import ssl
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union
from urllib.parse import urlencode

from . import errors
from ._http import Transport
from .models import (CodeContext, ExecResult, Execution, ExposedPort, ListFilesResult,
                     ReadFileResult, SessionInfo)
from .streams import EventStream
from .terminal import Terminal, WebSocket
from ._handles import FileStream, Process

__all__ = ["SbxClient", "get_sandbox", "Sandbox", "ExecutionSession", "Process", "FileStream"]

DEFAULT_URL = "http://127.0.0.1:7780"

#: Operations whose arguments take ``sessionId`` (the rest ignore it).
_SESSION_OPS = frozenset([
    "exec", "exec.stream", "process.start", "file.write", "file.read", "file.readStream",
    "file.mkdir", "file.delete", "file.rename", "file.move", "file.list", "file.exists",
    "file.watch", "file.checkChanges", "git.checkout",
])

Command = Union[str, Sequence[str]]


class SbxClient:
    """Connection settings for one sbx deployment (its HTTP front).

    Args:
        url: base URL, e.g. ``http://127.0.0.1:7780`` (a path prefix is
            kept, for a front behind a reverse proxy).  Default: ``$SBX_URL``,
            else ``http://127.0.0.1:7780``.
        api_key: bearer key (``Authorization: Bearer``).  Default:
            ``$SBX_API_KEY``, else none (a loopback front without a key file).
        timeout: a request's deadline in seconds, retries, back-off and
            reading the answer included (default 660: the gateway's 600 s
            deadline plus margin; calls with a ``timeout`` argument wait
            that long plus 60 s at least).  A request returns or raises by
            it + 1 s whatever the server does (``REQUEST_TIMEOUT`` when it
            passes; a retry that would have less than 0.5 s left raises
            the failure it would retry).  Streams: their idle timeout bounds each read.
        retries: attempts after the first on network errors and ``503
            SHARD_UNAVAILABLE`` (default 6); every retry reuses the request's
            ``Idempotency-Key``, so it never runs an operation twice.
        backoff, backoff_max: first retry delay and its cap, in seconds
            (doubling, +-25% jitter; defaults 0.25 and 8).
        ssl_context: for ``https`` URLs (default: the system's trust store).

    The client is thread-safe; it keeps up to 8 idle keep-alive connections.
    """

    def __init__(self, url: Optional[str] = None, api_key: Optional[str] = None, *,
                 timeout: float = 660.0, retries: int = 6, backoff: float = 0.25,
                 backoff_max: float = 8.0, ssl_context: Optional[ssl.SSLContext] = None) -> None:
        url = url or os.environ.get("SBX_URL") or DEFAULT_URL
        if api_key is None:
            api_key = os.environ.get("SBX_API_KEY") or None
        self._t = Transport(url, api_key, timeout, retries, backoff, backoff_max, ssl_context)

    @property
    def url(self) -> str:
        """The base URL."""
        return self._t.url

    def get_sandbox(self, sandbox_id: str, sleep_after: Union[str, int, None] = None,
                    keep_alive: Optional[bool] = None, image: Optional[str] = None,
                    start_image: bool = False) -> "Sandbox":
        """A handle on sandbox ``sandbox_id`` (see :func:`get_sandbox`)."""
        sb = Sandbox(self, sandbox_id)
        if image is not None:
            sb._call("create", {"image": image, **({"start": True} if start_image else {})})
        if sleep_after is not None or keep_alive is not None:
            sb.configure(sleep_after=sleep_after, keep_alive=keep_alive)
        return sb

    def list_sandboxes(self) -> List[Dict[str, Any]]:
        """Every sandbox of the deployment: ``status()``-shaped dicts
        (``id``, ``state``, ``createdAt`` ms, ``limits``...)."""
        return self._t.call_json("GET", self._t.path("v1", "sandboxes"),
                                 operation="list").get("sandboxes", [])

    def health(self) -> Dict[str, Any]:
        """``GET /v1/health`` -> ``{"ok": true}``."""
        return self._t.call_json("GET", self._t.path("v1", "health"), operation="health")

    def _node(self, op: str, args: Dict[str, Any]) -> Dict[str, Any]:
        return self._t.call_json("POST", self._t.path("v1", op), args, operation=op)

    def import_image(self, path: str, name: Optional[str] = None) -> Dict[str, Any]:
        """``image.import`` (docs/images.md): ``path`` is on the *server's*
        machine (an OCI layout directory or a docker/podman save tarball).
        Returns ``{"digest", "image"}``; raises ImageInvalid / ImageNotFound."""
        return self._node("image.import", {"path": path, **({"name": name} if name else {})})

    def build_template(self, name: str, from_: str, run: List[str],
                       step_timeout_ms: Optional[int] = None) -> Dict[str, Any]:
        """``template.build`` (docs/images.md, "Templates"): the image ``name``
        made of ``from_`` plus the shell strings ``run``, run in order in a
        sandbox of it.  Returns ``{"digest", "image"}``; a failing step
        raises TemplateBuildFailed (its output in the message), an unknown
        base ImageNotFound."""
        args: Dict[str, Any] = {"name": name, "from": from_, "run": list(run)}
        if step_timeout_ms is not None:
            args["stepTimeout"] = step_timeout_ms
        return self._node("template.build", args)

    def pull_image(self, ref: str, name: Optional[str] = None) -> Dict[str, Any]:
        """``image.pull``: ``ref`` from a registry (skopeo on the server)."""
        return self._node("image.pull", {"ref": ref, **({"name": name} if name else {})})

    def list_images(self) -> List[Dict[str, Any]]:
        """``image.list``: ``{digest, names, layers, size, created}`` dicts."""
        return self._node("image.list", {}).get("images", [])

    def inspect_image(self, image: str) -> Dict[str, Any]:
        """``image.inspect``: ``{"digest", "image": {..., "config": {...}}}``."""
        return self._node("image.inspect", {"image": image})

    def list_backups(self) -> List[Dict[str, Any]]:
        """``backup.list``: the node's backups (docs/persistence.md)."""
        return self._node("backup.list", {}).get("backups", [])

    def delete_backup(self, backup_id: str) -> Dict[str, Any]:
        """``backup.delete``; BackupNotFound if there is none."""
        return self._node("backup.delete", {"id": backup_id})

    def remove_image(self, image: str) -> Dict[str, Any]:
        """``image.rm``: a name, or a digest for all its names; ``{"removed"}``."""
        return self._node("image.rm", {"image": image})

    def cluster_status(self) -> Dict[str, Any]:
        """Gateway and shard health (``cluster.status``, protocol.md 3)."""
        return self._t.call_json("GET", self._t.path("v1", "cluster"), operation="cluster.status")

    def close(self) -> None:
        """Close idle connections."""
        self._t.close()

    def __enter__(self) -> "SbxClient":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SbxClient({self.url!r})"


def get_sandbox(client: SbxClient, sandbox_id: str, sleep_after: Union[str, int, None] = None,
                keep_alive: Optional[bool] = None, image: Optional[str] = None,
                start_image: bool = False) -> "Sandbox":
    """A handle on sandbox ``sandbox_id`` (the SDK's ``getSandbox``).

    Nothing is sent unless an option is given: the sandbox is created by its
    first operation (``exec``, ``write_file``, ...).  IDs are 1-63 of
    ``[a-z0-9-]``, no leading or trailing ``-``; preview URLs need at most
    40 characters.

    Args:
        sleep_after: idle time before the container is stopped: ``"30s"``,
            ``"10m"``, ``"1h"`` or a number of **seconds** (default: the
            server's, 10 minutes).  Files, sessions and processes are lost
            when it stops; the next operation starts a fresh container.
        keep_alive: ``True`` disables idle stopping (call ``destroy()``).
        image: an image of the node's store (name or digest, docs/images.md)
            to run instead of the host's ``/usr``: sent with ``create`` now; a
            sandbox that exists keeps its own image.
        start_image: with ``image``, start the image's Entrypoint + Cmd as
            the background process ``image-start`` of every container.

    Raises:
        errors.ValidationFailed: a bad ID or option (only when an option is
            given; otherwise on first use).
    """
    return client.get_sandbox(sandbox_id, sleep_after=sleep_after, keep_alive=keep_alive,
                              image=image, start_image=start_image)


def _ms_timeout(timeout_ms: Optional[int], base: float) -> float:
    """Socket timeout (s) for an operation with a ``timeout`` in ms."""
    if timeout_ms is None:
        return base
    return max(base, timeout_ms / 1000.0 + 60.0)


def _command_args(command: Command) -> Dict[str, Any]:
    if isinstance(command, str):
        return {"command": command}
    argv = [str(a) for a in command]
    if not argv:
        raise ValueError("empty argv")
    return {"argv": argv}


def _stdin_arg(stdin: Union[str, bytes, None]) -> Optional[str]:
    if stdin is None or isinstance(stdin, str):
        return stdin
    try:
        return bytes(stdin).decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError("stdin must be UTF-8 over the HTTP API (JSON strings); write binary "
                         "data to a file and redirect it instead") from e


class _Ops:
    """Operations shared by :class:`Sandbox` and :class:`ExecutionSession`
    (everything but session management and lifecycle)."""

    _client: SbxClient
    _session_id: Optional[str]
    sandbox_id: str

    # -- plumbing ------------------------------------------------------------------------

    @property
    def _t(self) -> Transport:
        return self._client._t

    def _call(self, op: str, args: Optional[Dict[str, Any]] = None,
              timeout_ms: Optional[int] = None) -> Dict[str, Any]:
        a = {k: v for k, v in (args or {}).items() if v is not None}
        if self._session_id is not None and op in _SESSION_OPS and "sessionId" not in a \
                and not a.get("sessionless"):
            a["sessionId"] = self._session_id
        return self._t.call_json("POST", self._t.path("v1", "sandboxes", self.sandbox_id, op), a,
                                 timeout=_ms_timeout(timeout_ms, self._t.timeout), operation=op)

    def _stream(self, op: str, args: Dict[str, Any], kind: str) -> EventStream:
        a = {k: v for k, v in args.items() if v is not None}
        if self._session_id is not None and op in _SESSION_OPS and "sessionId" not in a \
                and not a.get("sessionless"):
            a["sessionId"] = self._session_id
        st = EventStream(self._t, self.sandbox_id, kind, start=(op, a))
        st._connect()  # start now: the command runs even before iteration
        return st

    def resume_stream(self, stream_id: str, after: int = 0, kind: str = "exec") -> EventStream:
        """Re-attach to a stream by ID (e.g. after a crash), with the events
        after ``after``.  ``kind`` (``exec``, ``file``, ``watch``,
        ``process``, ``code``) tells which events end it.  The stream must
        still exist on the server (command output is kept until read or
        for 5 minutes); else :class:`errors.StreamNotFound`."""
        st = EventStream(self._t, self.sandbox_id, kind, stream_id=stream_id, after=after)
        st._connect()
        return st

    # -- commands --------------------------------------------------------------------------

    def exec(self, command: Command, timeout: Optional[int] = None,
             env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
             session_id: Optional[str] = None, stdin: Union[str, bytes, None] = None, *,
             sessionless: bool = False,
             on_output: Optional[Callable[[str, str], None]] = None) -> ExecResult:
        """Run a command and wait for it (the SDK's ``exec``).

        Args:
            command: a shell string (run by the session's bash, or ``/bin/sh
                -c`` when sessionless) or an argv list (no shell).
            timeout: ms; the command's whole process tree is killed after it
                and the result has ``exit_code`` 124, ``timed_out`` true.
            env: variables for this call only.
            cwd: working directory for this call only (must exist).
            session_id: the session to run in (created on first use; default
                the sandbox's ``default`` session, or this object's session).
            stdin: text for the command's stdin (UTF-8; default /dev/null).
            sessionless: run as a fresh process, in parallel with anything
                else, instead of in a session's shell.
            on_output: ``f(stream, data)`` called with ``("stdout"|"stderr",
                text)`` as output arrives (uses :meth:`exec_stream`).

        Returns:
            :class:`ExecResult`; a non-zero exit is not an exception.

        Raises:
            errors.SessionTerminated: the command ended its session's shell
                (``exit N``); ``e.context`` has ``exitCode``, ``stdout``,
                ``stderr``.  Use ``sh -c 'exit N'`` or ``sessionless=True``
                to get an exit code instead.
            errors.ValidationFailed: bad arguments (e.g. ``cwd`` missing).
            errors.CommandExecutionError: the command could not start.
        """
        if on_output is not None:
            return self._exec_streaming(command, timeout, env, cwd, session_id, stdin,
                                        sessionless, on_output)
        args = _command_args(command)
        args.update(timeout=timeout, env=dict(env) if env else None, cwd=cwd,
                    sessionId=session_id, stdin=_stdin_arg(stdin),
                    sessionless=True if sessionless else None)
        r = self._call("exec", args, timeout_ms=timeout)
        return ExecResult.from_json(r, command if isinstance(command, str) else
                                    " ".join(command))

    def _exec_streaming(self, command, timeout, env, cwd, session_id, stdin, sessionless,
                        on_output) -> ExecResult:
        out: Dict[str, List[str]] = {"stdout": [], "stderr": []}
        with self.exec_stream(command, timeout=timeout, env=env, cwd=cwd,
                              session_id=session_id, stdin=stdin,
                              sessionless=sessionless) as st:
            for ev in st:
                t = ev.get("type")
                if t in ("stdout", "stderr"):
                    out[t].append(ev.get("data", ""))
                    on_output(t, ev.get("data", ""))
                elif t == "complete":
                    d = dict(ev)
                    d["stdout"], d["stderr"] = "".join(out["stdout"]), "".join(out["stderr"])
                    return ExecResult.from_json(d, command if isinstance(command, str)
                                                else " ".join(command))
                elif t == "error":
                    raise errors.from_body(ev.get("error") or {}, operation="exec.stream")
        raise errors.make("INVALID_RESPONSE", "the stream ended without a complete event",
                          operation="exec.stream")

    def exec_stream(self, command: Command, timeout: Optional[int] = None,
                    env: Optional[Mapping[str, str]] = None, cwd: Optional[str] = None,
                    session_id: Optional[str] = None, stdin: Union[str, bytes, None] = None, *,
                    sessionless: bool = False) -> EventStream:
        """Run a command; return its events as they happen (the SDK's
        ``execStream`` + ``parseSSEStream``).

        Arguments as :meth:`exec`.  The command starts before this returns.
        Events (dicts, in ``seq`` order):

        * ``{"type": "start", "command", "sessionId" | "pid"}``
        * ``{"type": "stdout" | "stderr", "data": str}`` (<= 64 KiB each)
        * ``{"type": "complete", "exitCode", "success", "duration" (ms),
          "timedOut", "cause", ...}`` -- last
        * ``{"type": "error", "error": {"code", "message", "context"}}`` --
          last, instead of ``complete`` (e.g. ``SESSION_TERMINATED``)

        A dropped connection is resumed transparently (``Last-Event-ID``).
        ``stream.cancel()`` kills the command (exit 130, ``cancelled``).
        """
        args = _command_args(command)
        args.update(timeout=timeout, env=dict(env) if env else None, cwd=cwd,
                    sessionId=session_id, stdin=_stdin_arg(stdin),
                    sessionless=True if sessionless else None)
        return self._stream("exec.stream", args, "exec")

    # -- background processes ------------------------------------------------------------------

    def start_process(self, command: Command, process_id: Optional[str] = None,
                      timeout: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                      cwd: Optional[str] = None, session_id: Optional[str] = None) -> "Process":
        """Start a background process (the SDK's ``startProcess``).

        Args:
            command: shell string or argv list.
            process_id: 1-120 of ``[A-Za-z0-9._-]`` (default ``proc-<n>``).
            timeout: ms after which it is killed (status ``killed``).
            env, cwd: as :meth:`exec`.
            session_id: start in that session's cwd and environment; the
                process dies with the session.

        Returns:
            :class:`Process` (``status`` ``running``, ``pid`` set).

        Raises:
            errors.ResourceBusy: ``process_id`` is in use.
        """
        args = _command_args(command)
        args.update(processId=process_id, timeout=timeout, env=dict(env) if env else None,
                    cwd=cwd, sessionId=session_id)
        r = self._call("process.start", args)
        info = dict(r.get("process") or {})
        info.setdefault("id", r.get("processId"))
        info.setdefault("pid", r.get("pid"))
        info.setdefault("command", r.get("command"))
        return Process(self, info)

    def list_processes(self) -> List["Process"]:
        """Every process of the sandbox (running ones and the last 256
        finished), as :class:`Process` objects."""
        r = self._call("process.list")
        return [Process(self, p) for p in r.get("processes", [])]

    def get_process(self, process_id: str) -> Optional["Process"]:
        """The process, or ``None`` if there is no such process."""
        try:
            r = self._call("process.get", {"processId": process_id})
        except errors.ProcessNotFound:
            return None
        return Process(self, r.get("process") or {})

    def kill_process(self, process_id: str) -> Dict[str, Any]:
        """SIGTERM the process tree, SIGKILL 5 s later; returns once it ended:
        ``{"processId", "exitCode" (143 or 137), "status": "killed"}``.

        Raises :class:`errors.ProcessNotFound`."""
        return self._call("process.kill", {"processId": process_id}, timeout_ms=10000)

    def kill_all_processes(self) -> int:
        """Kill every process; returns how many were cleaned up (the SDK's
        ``cleanedCount``)."""
        r = self._call("process.killAll", timeout_ms=10000)
        return int(r.get("cleanedCount", r.get("killedCount", 0)) or 0)

    def get_process_logs(self, process_id: str) -> Dict[str, Any]:
        """The retained output (newest 2 MiB): ``{"processId", "stdout": str,
        "stderr": str, "truncated": bool, "status"}``.

        Raises :class:`errors.ProcessNotFound`."""
        r = self._call("process.logs", {"processId": process_id})
        r.setdefault("processId", process_id)
        return r

    def stream_process_logs(self, process_id: str, after: int = 0) -> EventStream:
        """The process's output as events, from the oldest retained one:
        ``process_info {processId, command, status, pid}``, ``stdout`` /
        ``stderr`` ``{data, processId}``, last ``exit {exitCode, status,
        cause}``; ``gap {missed}`` if it printed faster than the 2 MiB ring
        kept.  Raises :class:`errors.StreamNotFound` for an unknown process."""
        return self.resume_stream(f"proc:{process_id}", after=after, kind="process")

    # -- files -------------------------------------------------------------------------------------

    def write_file(self, path: str, content: Union[str, bytes], encoding: Optional[str] = None
                   ) -> Dict[str, Any]:
        """Write a file, creating parent directories.

        Args:
            path: absolute, or relative to the session's cwd (``/workspace``).
            content: ``str`` (written UTF-8 encoded) or ``bytes`` (written
                as is).  With ``encoding="base64"`` a ``str`` is taken as
                base64 text and decoded by the server.
        Returns:
            ``{"success", "path" (absolute), "bytesWritten", "timestamp"}``.
        Raises:
            errors.ValidationFailed (bad base64), errors.PermissionDenied,
            errors.RequestTooLarge (over 32 MiB per request).
        """
        if isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
            if path.startswith("/"):
                # Raw upload: no base64 overhead (32 MiB per request).
                return self._t.send("PUT", self._t.path("v1", "sandboxes", self.sandbox_id,
                                                        "files", raw_tail=path),
                                    data, headers={"Content-Type": "application/octet-stream"},
                                    operation="file.write").json()
            return self._call("file.write", {"path": path, "encoding": "base64",
                                             "content": base64.b64encode(data).decode("ascii")})
        return self._call("file.write", {"path": path, "content": content,
                                         "encoding": encoding})

    def read_file_info(self, path: str, encoding: Optional[str] = None) -> ReadFileResult:
        """Read a file (<= 32 MiB) with its metadata.

        Args:
            encoding: ``None`` (auto: text -> ``str``, binary -> ``bytes``),
                ``"utf-8"`` (force text) or ``"base64"`` (force ``bytes``).
        Returns:
            :class:`ReadFileResult` (``content``, ``mime_type``, ``size``,
            ``is_binary``...).
        Raises:
            errors.FileNotFound, errors.IsDirectory, errors.FileTooLarge.
        """
        enc = {"bytes": "base64", "binary": "base64", "utf8": "utf-8"}.get(encoding or "",
                                                                           encoding)
        return ReadFileResult.from_json(self._call("file.read", {"path": path, "encoding": enc}))

    def read_file(self, path: str, encoding: Optional[str] = None) -> Union[str, bytes]:
        """A file's content (<= 32 MiB): ``str`` for text, ``bytes`` for
        binary (NUL or invalid UTF-8 in the first 8 KiB).  ``encoding``
        forces one: ``"utf-8"`` -> ``str``, ``"base64"``/``"bytes"`` ->
        ``bytes``.  Text is decoded by the server: invalid UTF-8 after the
        first 8 KiB becomes U+FFFD; :meth:`read_file_bytes` is always exact.

        Raises:
            errors.FileNotFound (also a built-in ``FileNotFoundError``),
            errors.IsDirectory, errors.FileTooLarge (use
            :meth:`read_file_stream`).
        """
        return self.read_file_info(path, encoding).content

    def read_file_bytes(self, path: str) -> bytes:
        """A file's exact bytes (<= 32 MiB).  Raises errors.FileNotFound,
        errors.IsDirectory, errors.FileTooLarge."""
        c = self.read_file_info(path, "base64").content
        return c if isinstance(c, bytes) else c.encode("utf-8")

    def read_file_stream(self, path: str) -> "FileStream":
        """Read a file of any size in chunks: a :class:`FileStream`,
        iterable over ``bytes`` chunks (<= 64 KiB), with ``metadata``
        (``mimeType``, ``size``, ``isBinary``) once started.

        Raises:
            errors.FileNotFound, errors.IsDirectory (when called).
        """
        return FileStream(self, self._stream("file.readStream", {"path": path}, "file"))

    def mkdir(self, path: str, recursive: bool = False) -> Dict[str, Any]:
        """Create a directory (``recursive``: with its parents, no error if
        it exists).  Returns ``{"success", "path", "timestamp"}``.
        Raises errors.FileNotFound (missing parent), errors.FileExists."""
        return self._call("file.mkdir", {"path": path, "recursive": recursive})

    def delete_file(self, path: str) -> Dict[str, Any]:
        """Delete a file (not a directory: :class:`errors.IsDirectory`).
        Returns ``{"success", "path"}``.  Raises errors.FileNotFound."""
        return self._call("file.delete", {"path": path})

    def rename_file(self, old_path: str, new_path: str) -> Dict[str, Any]:
        """Rename a file or directory.  Returns ``{"success", "path",
        "newPath"}``.  Raises errors.FileNotFound."""
        return self._call("file.rename", {"oldPath": old_path, "newPath": new_path})

    def move_file(self, source_path: str, destination_path: str) -> Dict[str, Any]:
        """Move a file or directory; into an existing directory keeps the
        name; across mounts copies.  Returns ``{"success", "path",
        "newPath"}``.  Raises errors.FileNotFound."""
        return self._call("file.move", {"sourcePath": source_path,
                                        "destinationPath": destination_path})

    def list_files(self, path: str = ".", recursive: bool = False,
                   include_hidden: bool = False) -> ListFilesResult:
        """List a directory: :class:`ListFilesResult` (iterable over
        :class:`FileInfo`; at most 100 000 entries).  Raises
        errors.FileNotFound, errors.NotDirectory."""
        return ListFilesResult.from_json(self._call("file.list", {
            "path": path, "recursive": recursive, "includeHidden": include_hidden}))

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        return bool(self._call("file.exists", {"path": path}).get("exists"))

    def watch(self, path: str, recursive: bool = True, include: Optional[Sequence[str]] = None,
              exclude: Optional[Sequence[str]] = None) -> EventStream:
        """Watch a directory for changes; returns once the watch is in place.

        Args:
            recursive: include subdirectories (default true).
            include / exclude: fnmatch(3) globs matched against the relative
                path and each component (not both; default exclude ``.git``,
                ``node_modules``, ``.DS_Store``).

        Events: ``watching {path, watchId}``, ``event {eventType: create |
        modify | delete | move_from | move_to | attrib, path, isDirectory}``,
        last ``stopped {reason}``.  The stream runs until cancelled:
        ``stream.cancel()`` stops the watch (``close()`` alone leaves it
        for 5 minutes).

        Raises errors.FileNotFound, errors.NotDirectory, errors.WatchStartError.
        """
        r = self._call("file.watch", {"path": path, "recursive": recursive,
                                      "include": list(include) if include else None,
                                      "exclude": list(exclude) if exclude else None})
        return self.resume_stream(r["streamId"], kind="watch")

    def check_changes(self, path: str, since: Optional[str] = None, recursive: bool = True,
                      include: Optional[Sequence[str]] = None,
                      exclude: Optional[Sequence[str]] = None) -> Dict[str, Any]:
        """Has the directory changed since ``since``? The polling alternative
        to :meth:`watch` (the Cloudflare SDK's ``checkChanges``).

        The first call keeps a change state in the container and answers
        ``{"status": "unchanged", "version"}``; pass ``version`` as
        ``since`` next time to get ``unchanged`` or ``changed`` (and the new
        version), or ``resync`` with ``reason`` ``expired`` (this container
        dropped the state) or ``restarted`` (another container made it).
        Counts as activity.

        Raises errors.ValidationFailed (a malformed ``since``, or one ahead of
        the state), errors.FileNotFound, errors.NotDirectory.
        """
        return self._call("file.checkChanges", {
            "path": path, "since": since, "recursive": recursive,
            "include": list(include) if include else None,
            "exclude": list(exclude) if exclude else None})

    # -- git / env -----------------------------------------------------------------------------

    def git_checkout(self, repo_url: str, branch: Optional[str] = None,
                     target_dir: Optional[str] = None, depth: Optional[int] = None,
                     clone_timeout_ms: Optional[int] = None) -> Dict[str, Any]:
        """``git clone`` a repository (https, http, git, ssh, file or
        ``user@host:path``) into ``target_dir`` (default
        ``/workspace/<repo name>``).  Returns ``{"success", "repoUrl",
        "branch" (checked out), "targetDir", "timestamp"}``.

        Raises errors.InvalidGitUrl, errors.GitRepositoryNotFound,
        errors.GitBranchNotFound, errors.GitAuthFailed,
        errors.GitNetworkError, errors.GitCloneFailed (all
        :class:`errors.GitError`)."""
        return self._call("git.checkout", {"repoUrl": repo_url, "branch": branch,
                                           "targetDir": target_dir, "depth": depth,
                                           "cloneTimeoutMs": clone_timeout_ms},
                          timeout_ms=clone_timeout_ms or 600000)

    def set_env_vars(self, env_vars: Mapping[str, Optional[str]]) -> Dict[str, Any]:
        """Set (``None``: unset) sandbox environment variables: stored with
        the sandbox (they survive container restarts), exported in the
        default session now and inherited by sessions and processes started
        later.  Returns ``{"success": true}``."""
        return self._call("env.set", {"vars": dict(env_vars)})

    # -- code interpreter --------------------------------------------------------------------------

    def create_code_context(self, language: str = "python", cwd: Optional[str] = None,
                            env_vars: Optional[Mapping[str, str]] = None) -> CodeContext:
        """Start an interpreter (``python``, ``javascript``, ``typescript``;
        aliases ``python3``, ``js``, ``node``, ``ts``) whose state persists
        across :meth:`run_code` calls.

        Raises errors.ValidationFailed (unknown language),
        errors.PythonNotAvailable, errors.JavascriptNotAvailable."""
        r = self._call("context.create", {"language": language, "cwd": cwd,
                                          "envVars": dict(env_vars) if env_vars else None})
        ctx = dict(r.get("context") or {})
        ctx.setdefault("id", r.get("contextId"))
        return CodeContext.from_json(ctx)

    @staticmethod
    def _ctx_id(context: Union[CodeContext, str, None]) -> Optional[str]:
        return context.id if isinstance(context, CodeContext) else context

    def run_code(self, code: str, context: Union[CodeContext, str, None] = None,
                 language: Optional[str] = None, timeout: Optional[int] = None) -> Execution:
        """Run a cell (the SDK's ``runCode``).

        Args:
            context: a :class:`CodeContext` or its ID; default: the
                language's default context (created on first use).
            language: for the default context (default ``python``).
            timeout: ms (default 60 000); the cell is interrupted, the
                context keeps its state, ``timed_out`` is set.

        Returns:
            :class:`Execution`: ``results`` (``text``, ``html``, ``png``...),
            ``logs.stdout`` / ``logs.stderr``, ``error`` (an exception in the
            code is reported there, not raised).

        Raises:
            errors.ContextNotFound, errors.CodeExecutionError (dead context).
        """
        r = self._call("context.run", {"code": code, "context": self._ctx_id(context),
                                       "language": language, "timeout": timeout},
                       timeout_ms=timeout if timeout is not None else 60000)
        return Execution.from_json(r)

    def run_code_stream(self, code: str, context: Union[CodeContext, str, None] = None,
                        language: Optional[str] = None, timeout: Optional[int] = None
                        ) -> EventStream:
        """Run a cell; its outputs as events, each as the cell produces it:
        ``start``, ``stdout {text}``, ``stderr {text}``, ``result {result}``
        (a Result dict), ``error {name, value, traceback}``, last
        ``execution_complete {executionCount, status, timedOut, duration}``."""
        return self._stream("context.runStream", {"code": code,
                                                  "context": self._ctx_id(context),
                                                  "language": language, "timeout": timeout},
                            "code")

    def list_code_contexts(self) -> List[CodeContext]:
        """The sandbox's code contexts."""
        return [CodeContext.from_json(c) for c in self._call("context.list").get("contexts", [])]

    def delete_code_context(self, context: Union[CodeContext, str]) -> Dict[str, Any]:
        """Stop a context's interpreter.  Returns ``{"success", "contextId"}``.
        Raises errors.ContextNotFound."""
        return self._call("context.delete", {"contextId": self._ctx_id(context)})

    # -- preview URLs -------------------------------------------------------------------------------

    def expose_port(self, port: int, hostname: Optional[str] = None, token: Optional[str] = None,
                    name: Optional[str] = None) -> ExposedPort:
        """Give ``port`` (1024-65535) inside the sandbox a preview URL
        ``http://{port}-{sandbox}-{token}.{hostname}/`` (default hostname:
        the deployment's preview domain).  Re-exposing keeps the token.
        Starts the container if needed.  Nothing has to listen yet.

        Args:
            token: custom token, 1-16 of ``[a-z0-9_]``.
            name: a label.

        Raises errors.InvalidPortNumber, errors.PortAlreadyExposed (token used
        by another port), errors.ValidationFailed (ID unfit for a DNS label),
        errors.CustomDomainRequired (a hostname under the deployment's
        ``--no-preview-host`` suffixes, default ``workers.dev``)."""
        return ExposedPort.from_json(self._call("port.expose", {
            "port": int(port), "hostname": hostname, "token": token, "name": name}))

    def create_backup(self, dir: str, name: Optional[str] = None, ttl: Optional[int] = None,
                      excludes: Optional[List[str]] = None,
                      gitignore: Optional[bool] = None) -> Dict[str, Any]:
        """``backup.create`` (createBackup): archive ``dir`` (absolute) into the
        node's store; ``ttl`` in seconds (default 3 days); ``excludes``
        (patterns as tar's --exclude); ``gitignore=True`` also leaves out what
        the tree's .gitignore files and .git/info/exclude ignore
        (docs/persistence.md, "Backups").  Returns ``{"id",
        "dir", "size", "digest"}``.  Raises FileNotFound, BackupTooLarge."""
        r = self._call("backup.create", {"dir": dir, "name": name, "ttl": ttl, "excludes": excludes,
                                             "gitignore": gitignore})
        return {"id": r["id"], "dir": dir, "size": r["size"], "digest": r["digest"]}

    def restore_backup(self, backup: Dict[str, Any], dir: Optional[str] = None) -> Dict[str, Any]:
        """``backup.restore``: replace ``dir`` (default ``backup["dir"]``) with
        the backup's content, after checking its digest.  Raises
        BackupNotFound, BackupExpired, StorageError (a corrupt archive)."""
        return self._call("backup.restore", {"id": backup["id"], "dir": dir or backup["dir"]})

    def fork(self, ids: List[str]) -> Dict[str, Any]:
        """``sandbox.fork``: create the sandboxes ``ids`` (1-16 new IDs; in a
        cluster, of this sandbox's shard) whose workspace starts as a copy of this one's, taken
        without stopping it (docs/persistence.md, "Fork").  This sandbox needs
        a persistent workspace.  Returns ``{"from", "ids", "copyMs",
        "copiedBytes"}``.  Raises SandboxNotFound, SandboxExists,
        ForkCrossShard, ValidationFailed."""
        return self._call("sandbox.fork", {"ids": list(ids)})

    def unexpose_port(self, port: int) -> Dict[str, Any]:
        """Withdraw a port's preview URL at once.  Returns ``{"success",
        "port", "wasExposed"}``."""
        return self._call("port.unexpose", {"port": int(port)})

    def get_exposed_ports(self, hostname: Optional[str] = None) -> List[ExposedPort]:
        """Preview URLs active for the running container (``token`` is not
        included by the server; it is part of ``url``)."""
        r = self._call("port.list", {"hostname": hostname})
        return [ExposedPort.from_json(p) for p in r.get("ports", [])]

    def is_port_exposed(self, port: int) -> bool:
        """Is ``port`` exposed for the current container?  Answered from the
        sandbox's record: it neither creates nor wakes the sandbox and is not
        activity for ``sleep_after``; false for a sandbox that does not exist
        or is stopped."""
        try:
            r = self._call("port.list")
        except errors.SandboxNotFound:
            return False
        return any(p.get("port") == int(port) for p in r.get("ports", []))

    # -- terminal -------------------------------------------------------------------------------------

    def terminal(self, session_id: Optional[str] = None, cols: int = 80, rows: int = 24,
                 shell: Optional[str] = None, timeout: float = 60.0) -> Terminal:
        """Connect to a session's terminal (a pseudo-terminal running an
        interactive shell, ``TERM=xterm-256color``, in the session's cwd)
        over WebSocket.  One terminal exists per session, shared by every
        connection; the first connection starts it with ``cols`` x ``rows``
        and ``shell`` (default bash).

        Returns a connected :class:`Terminal` (after the server's ``ready``).

        Raises:
            errors.SandboxError: the server refused (e.g. errors.Unauthorized).
            errors.WebSocketError, errors.GatewayUnavailable.
        """
        sid = session_id or self._session_id or "default"
        q = {"session": sid, "cols": int(cols), "rows": int(rows)}
        if shell:
            q["shell"] = shell
        path = self._t.path("v1", "sandboxes", self.sandbox_id, "terminal") + "?" + urlencode(q)
        hdrs = {"User-Agent": "sbx-sandbox-python/0.1"}
        if self._t.api_key:
            hdrs["Authorization"] = f"Bearer {self._t.api_key}"
        ws = WebSocket(self._t.host, self._t.port, path, hdrs,
                       ssl_context=self._t.ssl_context, timeout=timeout)
        try:
            return Terminal(ws, sid, open_timeout=timeout)
        except BaseException:
            ws.close()
            raise


class Sandbox(_Ops):
    """A sandbox (the SDK's ``Sandbox`` object).  Get one with
    :func:`get_sandbox`.

    Commands and file operations without an explicit ``session_id`` run in
    the sandbox's ``default`` session.  Everything raises
    :class:`errors.SandboxError` subclasses on failure.

    Attributes:
        sandbox_id: the ID (``id`` is an alias).
        client: the :class:`SbxClient`.
    """

    def __init__(self, client: SbxClient, sandbox_id: str) -> None:
        self._client = client
        self.sandbox_id = sandbox_id
        self._session_id = None

    @property
    def id(self) -> str:
        """The sandbox ID."""
        return self.sandbox_id

    @property
    def client(self) -> SbxClient:
        """The :class:`SbxClient` this sandbox talks through."""
        return self._client

    def __repr__(self) -> str:
        return f"Sandbox({self.sandbox_id!r})"

    # -- sessions -------------------------------------------------------------------------------

    def create_session(self, id: Optional[str] = None, cwd: Optional[str] = None,
                       env: Optional[Mapping[str, str]] = None,
                       command_timeout_ms: Optional[int] = None) -> "ExecutionSession":
        """Create a session: a persistent bash with its own cwd, variables
        and functions (default ID ``session-<ms>``).  Its environment is the
        sandbox's plus ``env``; ``command_timeout_ms`` is its commands'
        default timeout.

        Raises errors.SessionAlreadyExists (HTTP 409)."""
        r = self._call("session.create", {"id": id, "cwd": cwd,
                                          "env": dict(env) if env else None,
                                          "commandTimeoutMs": command_timeout_ms})
        return ExecutionSession(self, r.get("sessionId") or id or "")

    def get_session(self, id: str) -> "ExecutionSession":
        """A handle on session ``id``; nothing is checked: the first command
        creates it (the SDK's ``getSession``).  Use
        :meth:`ExecutionSession.info` to check that it exists."""
        return ExecutionSession(self, id)

    def delete_session(self, id: str) -> Dict[str, Any]:
        """Kill a session's shell, everything it started and its background
        processes.  Returns ``{"success", "sessionId"}``.

        Raises errors.SessionNotFound; errors.ValidationFailed for the
        default session."""
        return self._call("session.delete", {"id": id})

    def list_sessions(self) -> List[SessionInfo]:
        """Every session of the running container."""
        return [SessionInfo.from_json(s) for s in self._call("session.list").get("sessions", [])]

    # -- lifecycle -----------------------------------------------------------------------------------

    def status(self) -> Dict[str, Any]:
        """State, limits and usage: ``{"id", "state" (running, starting,
        stopping, stopped, destroying), "createdAt" (ms epoch),
        "generation", "restarts", "limits" {"memory" bytes, "pids", "cpu"
        millicpus}, "container" {...} while running, ...}``.

        Raises errors.SandboxNotFound (never created, or destroyed)."""
        return self._call("status").get("sandbox", {})

    def create(self, memory: Optional[int] = None, pids: Optional[int] = None,
               cpu: Optional[int] = None, network: Optional[str] = None,
               allow: Optional[List[str]] = None,
               deny: Optional[List[str]] = None,
               max_connections: Optional[int] = None,
               bandwidth: Optional[int] = None) -> Dict[str, Any]:
        """Create the sandbox now with limits: ``memory`` bytes (16 MiB - 1
        TiB), ``pids`` (16 - 1 048 576), ``cpu`` millicpus (1000 = one CPU);
        and its network (docs/network.md): ``network`` ``"none"`` or
        ``"egress"``, ``allow`` / ``deny`` rules ``"CIDR[:PORT]"`` or host
        names ``"NAME[:PORT]"`` / ``"*.NAME[:PORT]"`` (a rule inside an
        always-denied range, or not a name, raises errors.ValidationFailed
        naming it), ``max_connections`` open at once, ``bandwidth`` in Mbit/s
        each way.  Returns ``{"created" (false
        if it existed: limits unchanged; network settings replaced, new rules
        at once for new connections, a new mode from its next container),
        "sandbox"}``."""
        limits = {k: v for k, v in (("memory", memory), ("pids", pids), ("cpu", cpu))
                  if v is not None}
        net = {k: v for k, v in (("mode", network), ("allow", allow), ("deny", deny),
                                 ("maxConnections", max_connections),
                                 ("bandwidth", bandwidth))
               if v is not None}
        return self._call("create", {"limits": limits or None, "network": net or None})

    def ping(self) -> Dict[str, Any]:
        """Start the container if needed; ``{"pid": 1, "bound": true}``."""
        return self._call("ping")

    def configure(self, sleep_after: Union[str, int, None] = None,
                  keep_alive: Optional[bool] = None,
                  network: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Set ``sleep_after`` (``"30s"``, ``"10m"``, ``"1h"`` or seconds),
        ``keep_alive`` and ``network`` (``{"mode", "allow", "deny",
        "maxConnections", "bandwidth"}``: new rules at once for new connections, a new mode
        from the next container; docs/network.md).  Returns ``{"success",
        "sleepAfter" (ms), "keepAlive"}``."""
        return self._call("sandbox.configure", {"sleepAfter": sleep_after,
                                                "keepAlive": keep_alive,
                                                "network": network})

    def set_keep_alive(self, keep_alive: bool) -> Dict[str, Any]:
        """``configure(keep_alive=...)``."""
        return self.configure(keep_alive=keep_alive)

    def set_sleep_after(self, sleep_after: Union[str, int]) -> Dict[str, Any]:
        """``configure(sleep_after=...)``."""
        return self.configure(sleep_after=sleep_after)

    def close_terminal(self, session_id: str = "default") -> Dict[str, Any]:
        """End a session's terminal shell (every viewer sees it exit)."""
        return self._call("terminal.close", {"sessionId": session_id})

    def destroy(self) -> Dict[str, Any]:
        """Stop the container and delete the sandbox (idempotent).  Returns
        ``{"success": true, "destroyed" (whether it existed), "id"}``.
        Operations in flight fail with errors.OperationInterrupted; later
        operations create a new sandbox."""
        return self._t.call_json("DELETE", self._t.path("v1", "sandboxes", self.sandbox_id),
                                 operation="destroy")


class ExecutionSession(_Ops):
    """A session of a sandbox: a persistent bash whose cwd, variables and
    functions carry over between commands.  It has the :class:`Sandbox`
    methods for commands, processes, files, git, code and the terminal,
    bound to this session (relative paths resolve against its cwd; commands
    run in its shell, one at a time).  Code contexts and preview ports are
    sandbox-wide.

    Attributes:
        id: the session ID.
        sandbox: the :class:`Sandbox`.
    """

    def __init__(self, sandbox: Sandbox, session_id: str) -> None:
        self.sandbox = sandbox
        self._client = sandbox._client
        self.sandbox_id = sandbox.sandbox_id
        self._session_id = session_id

    @property
    def id(self) -> str:
        """The session ID."""
        return self._session_id  # type: ignore[return-value]

    def __repr__(self) -> str:
        return f"ExecutionSession({self.sandbox_id!r}, {self.id!r})"

    def info(self) -> SessionInfo:
        """The session's state.  Raises errors.SessionNotFound."""
        return SessionInfo.from_json(self._call("session.get", {"id": self.id})
                                     .get("session", {}))

    def delete(self) -> Dict[str, Any]:
        """``sandbox.delete_session(self.id)``."""
        return self.sandbox.delete_session(self.id)
