"""Handles the sandbox API returns: :class:`Process` (a background process,
the Cloudflare SDK's ``Process``: status, logs, waits) and
:class:`FileStream` (a file read in chunks).  Both act through the
sandbox or session that made them (``owner``, a ``sandbox._Ops``); the
operations they call are those of docs/protocol.md.  Re-exported by
:mod:`sbx_sandbox.sandbox`."""

from __future__ import annotations

import base64
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Pattern, Union

from . import errors
from .models import LogMatch, PortReady, ProcessExit
from .streams import EventStream

if TYPE_CHECKING:
    from .sandbox import _Ops

__all__ = ["Process", "FileStream"]


class Process:
    """A background process (the SDK's ``Process``).

    Attributes (a snapshot; :meth:`refresh` / :meth:`get_status` update it):
        id: process ID; pid: its pid inside the sandbox.
        command: the command.
        status: ``running``, ``completed`` (exit 0), ``failed`` (exit != 0),
            ``killed``, ``error`` (could not start).
        start_time, end_time: ISO 8601.
        exit_code, cause, signal: once it ended.
        session_id: the session it was started in, if any.
    """

    def __init__(self, owner: _Ops, info: Dict[str, Any]) -> None:
        self._owner = owner
        self.id: str = info.get("id", "")
        self._update(info)

    def _update(self, info: Dict[str, Any]) -> None:
        self.raw = info
        self.pid: Optional[int] = info.get("pid")
        self.command: str = info.get("command", "")
        self.status: str = info.get("status", "running")
        self.start_time: Optional[str] = info.get("startTime")
        self.end_time: Optional[str] = info.get("endTime")
        self.exit_code: Optional[int] = info.get("exitCode")
        self.cause: Optional[str] = info.get("cause")
        self.signal: Optional[int] = info.get("signal")
        self.session_id: Optional[str] = info.get("sessionId")

    def __repr__(self) -> str:
        return (f"Process(id={self.id!r}, pid={self.pid}, status={self.status!r}, "
                f"exit_code={self.exit_code!r})")

    def refresh(self) -> "Process":
        """Re-read the process's state.  Raises errors.ProcessNotFound."""
        r = self._owner._call("process.get", {"processId": self.id})
        self._update(r.get("process") or {})
        return self

    def get_status(self) -> str:
        """The current status (``"error"`` if the process is unknown)."""
        try:
            return self.refresh().status
        except errors.ProcessNotFound:
            return "error"

    def kill(self) -> Dict[str, Any]:
        """SIGTERM the tree, SIGKILL after 5 s; returns when it ended:
        ``{"processId", "exitCode" (143 or 137), "status": "killed"}``."""
        r = self._owner.kill_process(self.id)
        self.status = r.get("status", "killed")
        self.exit_code = r.get("exitCode", self.exit_code)
        return r

    def get_logs(self) -> Dict[str, Any]:
        """``{"stdout", "stderr", "truncated", "status"}``: retained output."""
        return self._owner.get_process_logs(self.id)

    def stream_logs(self, after: int = 0) -> EventStream:
        """See :meth:`Sandbox.stream_process_logs`."""
        return self._owner.stream_process_logs(self.id, after)

    def wait_for_log(self, pattern: Union[str, Pattern[str]], timeout: Optional[int] = None
                     ) -> LogMatch:
        """Wait for the first stdout/stderr line (already printed or to come)
        that matches.

        Args:
            pattern: a substring (matched by the server), or a compiled
                :class:`re.Pattern` (Python syntax, ``search`` semantics,
                matched here against each line of the log stream).
            timeout: ms (``None``: wait as long as the process runs).

        Returns:
            :class:`LogMatch` (``line``; ``match`` = ``[whole, groups...]``
            for a regex).

        Raises:
            errors.ProcessReadyTimeout (also a ``TimeoutError``),
            errors.ProcessExitedBeforeReady, errors.ProcessNotFound.
        """
        if isinstance(pattern, str):
            r = self._owner._call("process.waitForLog", {"processId": self.id,
                                                         "pattern": pattern,
                                                         "timeout": timeout},
                                  timeout_ms=timeout)
            return LogMatch(r.get("line", ""), r.get("match"))
        return self._wait_for_regex(pattern, timeout)

    def _wait_for_regex(self, pattern: Pattern[str], timeout: Optional[int]) -> LogMatch:
        deadline = None if timeout is None else time.monotonic() + timeout / 1000.0
        what = f"log line matching /{pattern.pattern}/"
        partial = {"stdout": "", "stderr": ""}

        def check(line: str) -> Optional[LogMatch]:
            m = pattern.search(line)
            if m:
                return LogMatch(line, [m.group(0), *m.groups()], m)
            return None

        try:
            st = self._owner.stream_process_logs(self.id)
        except errors.StreamNotFound as e:
            raise errors.make("PROCESS_NOT_FOUND", f"process '{self.id}' not found",
                              operation="process.waitForLog") from e
        with st:
            st.set_deadline(deadline)
            try:
                for ev in st:
                    t = ev.get("type")
                    if t in ("stdout", "stderr"):
                        buf = partial[t] + (ev.get("data") or "")
                        lines = buf.split("\n")
                        partial[t] = lines.pop()
                        for line in lines:
                            found = check(line.rstrip("\r"))
                            if found:
                                return found
                    elif t == "exit":
                        for rest in partial.values():
                            if rest:
                                found = check(rest)
                                if found:
                                    return found
                        raise errors.make(
                            "PROCESS_EXITED_BEFORE_READY",
                            f"Process exited with code {ev.get('exitCode')} before becoming "
                            f"ready. Waiting for: {what}",
                            {"processId": self.id, "exitCode": ev.get("exitCode")},
                            operation="process.waitForLog")
                    if deadline is not None and time.monotonic() >= deadline:
                        break
            except errors.RequestTimeout:
                pass
        raise errors.make("PROCESS_READY_TIMEOUT",
                          f"Process did not become ready within {timeout}ms. Waiting for: {what}",
                          {"processId": self.id}, operation="process.waitForLog")

    def wait_for_port(self, port: int, mode: str = "http", path: str = "/",
                      timeout: Optional[int] = None, status: Union[int, tuple, None] = None,
                      interval: Optional[int] = None) -> PortReady:
        """Wait until ``port`` answers inside the sandbox: ``mode="http"``
        (GET ``path``, status 200-399 or ``status`` -- an int or a
        ``(min, max)`` tuple) or ``"tcp"`` (a connect succeeds).  Polls
        every ``interval`` ms (500); ``timeout`` in ms.

        Raises errors.ProcessReadyTimeout, errors.ProcessExitedBeforeReady."""
        args: Dict[str, Any] = {"processId": self.id, "port": int(port), "mode": mode,
                                "path": path, "timeout": timeout, "interval": interval}
        if isinstance(status, tuple):
            args["statusMin"], args["statusMax"] = status
        elif status is not None:
            args["status"] = status
        r = self._owner._call("process.waitForPort", args, timeout_ms=timeout)
        return PortReady(bool(r.get("ready", True)), int(r.get("port", port)),
                         r.get("statusCode"))

    def wait_for_exit(self, timeout: Optional[int] = None) -> ProcessExit:
        """Wait for the process to end (``timeout`` in ms).  Returns
        :class:`ProcessExit` (``exit_code``, ``status``) and updates this
        object.  Raises errors.RequestTimeout (a ``TimeoutError``)."""
        r = self._owner._call("process.waitForExit", {"processId": self.id,
                                                      "timeout": timeout},
                              timeout_ms=timeout)
        self.exit_code = r.get("exitCode")
        self.status = r.get("status", self.status)
        return ProcessExit(self.exit_code, self.status)


class FileStream:
    """Chunks of a file, from :meth:`Sandbox.read_file_stream`.

    Iterate for ``bytes`` chunks; ``metadata`` is ``{"mimeType", "size",
    "isBinary", "encoding", "path"}`` (available right after the call);
    ``bytes_read`` counts what was yielded.  :meth:`read` returns the whole
    content.

    The bytes are exact.  The server's ``file.readStream`` events carry
    chunks as JSON strings, where bytes that are not UTF-8 -- including a
    multi-byte character split by a chunk boundary -- become U+FFFD, so
    only the metadata comes from there.  The data comes from the raw file
    route (``GET /v1/sandboxes/{id}/files/{path}``) for files up to 32 MiB,
    and for larger files from ``exec`` reading 4 MiB at a time (``dd |
    base64``; needs ``sh``, ``dd`` and ``base64`` in the sandbox).  The
    metadata and the data are read separately, so a file changing meanwhile
    may not match ``size``.
    """

    RAW_LIMIT = 32 << 20
    EXEC_CHUNK = 4 << 20
    PIECE = 64 << 10

    def __init__(self, owner: _Ops, events: EventStream) -> None:
        self._owner = owner
        self._events = events
        self.metadata: Dict[str, Any] = {}
        self.bytes_read = 0
        for ev in events:
            self._check(ev)
            if ev.get("type") == "metadata":
                self.metadata = ev
            break
        size = int(self.metadata.get("size") or 0)
        self._mode = "raw" if size <= self.RAW_LIMIT else "exec"
        self._stop_events()

    def __enter__(self) -> "FileStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stop reading."""
        self._stop_events()

    def _stop_events(self) -> None:
        if not self._events.done:
            try:
                self._events.cancel()
            except errors.SandboxError:
                self._events.close()

    def __iter__(self) -> Iterator[bytes]:
        gen = self._raw if self._mode == "raw" else self._exec
        for chunk in gen():
            self.bytes_read += len(chunk)
            yield chunk

    @staticmethod
    def _check(ev: Dict[str, Any]) -> None:
        if ev.get("type") == "error":
            e = ev.get("error")
            raise errors.from_body(e if isinstance(e, dict) else
                                   {"code": "FILESYSTEM_ERROR", "message": str(e)},
                                   operation="file.readStream")

    def _raw(self) -> Iterator[bytes]:
        t = self._owner._t
        path = self.metadata.get("path") or ""
        conn, resp = t.send("GET", t.path("v1", "sandboxes", self._owner.sandbox_id, "files",
                                          raw_tail=path), stream=True,
                            operation="file.readStream")
        try:
            while True:
                chunk = resp.read(65536)
                if not chunk:
                    break
                yield chunk
        finally:
            conn.close()

    def _exec(self) -> Iterator[bytes]:
        path = self.metadata.get("path") or ""
        size = int(self.metadata.get("size") or 0)
        script = ('dd if="$1" bs=%d skip="$2" count=1 status=none | base64 -w0'
                  % self.EXEC_CHUNK)
        for i in range((size + self.EXEC_CHUNK - 1) // self.EXEC_CHUNK):
            r = self._owner.exec(["sh", "-c", script, "sh", path, str(i)], sessionless=True)
            if r.exit_code != 0:
                raise errors.make("FILESYSTEM_ERROR", f"reading {path}: {r.stderr.strip()}",
                                  {"path": path}, operation="file.readStream")
            chunk = base64.b64decode(r.stdout)
            if not chunk:
                break
            for off in range(0, len(chunk), self.PIECE):
                yield chunk[off:off + self.PIECE]

    def read(self) -> bytes:
        """The whole content."""
        return b"".join(self)
