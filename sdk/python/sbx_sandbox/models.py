"""Result types.

They mirror the Cloudflare SDK's shapes with Python (snake_case) names,
built by ``from_json`` from the server's JSON, whose shapes (the TypedDicts
of ``_ops``, generated from runtime/ops.yaml) are the annotations of ``d``.
Every one keeps the server's JSON in ``raw`` so fields added by later server
versions stay reachable.  Units: durations and timeouts in milliseconds,
sizes in bytes, ``*_at``/timestamps as the server sends them (ISO 8601
strings for files, processes and contexts; ms since the epoch in events and
``status()``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Union

from . import _ops  # the wire shapes, generated from runtime/ops.yaml

__all__ = [
    "ExecResult", "FileInfo", "ListFilesResult", "ReadFileResult", "SessionInfo",
    "CodeContext", "Result", "Logs", "ExecutionError", "Execution", "ExposedPort",
    "LogMatch", "PortReady", "ProcessExit",
]


@dataclass
class ExecResult:
    """Outcome of :meth:`Sandbox.exec` (the SDK's ``ExecResult``).

    A non-zero exit code is **not** an exception: check ``success`` /
    ``exit_code``.

    Attributes:
        success: ``exit_code == 0`` and not timed out.
        exit_code: exit status; 124 after a timeout; 128+N when killed by
            signal N; 130 when an ``exec_stream`` was cancelled.
        stdout, stderr: the output as text (the server turns bytes that are
            not UTF-8 into U+FFFD; each keeps at most 32 MiB by default).
        command: the command as given.
        duration: run time in ms, measured in the sandbox.
        timed_out: the ``timeout`` fired (stderr then ends with
            ``Command timed out after Nms``).
        session_id: the session it ran in (``None`` when sessionless).
        stdout_truncated, stderr_truncated: output beyond the cap was dropped.
        stdout_bytes, stderr_bytes: bytes produced, kept or not.
        cause: ``EXITED``, ``TIMEOUT``, ``KILLED``, ``OOM_KILLED``,
            ``PIDS_LIMIT`` (or ``None``).
        signal: the signal that ended the command, if any.
        container_restarted: the previous container had ended unexpectedly
            (state such as files and sessions was lost).
        raw: the server's JSON.
    """

    success: bool
    exit_code: int
    stdout: str = ""
    stderr: str = ""
    command: str = ""
    duration: int = 0
    timed_out: bool = False
    session_id: Optional[str] = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_bytes: int = 0
    stderr_bytes: int = 0
    cause: Optional[str] = None
    signal: Optional[int] = None
    container_restarted: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    #: stopped at the request's deadline rather than its own ``timeout`` (exit 124)
    deadline_exceeded: bool = False

    @classmethod
    def from_json(cls, d: "_ops.ExecResult", command: str = "") -> "ExecResult":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(
            success=bool(d.get("success", d.get("exitCode") == 0)),
            exit_code=int(d.get("exitCode", -1)),
            stdout=_text(d.get("stdout")),
            stderr=_text(d.get("stderr")),
            command=command,
            duration=int(d.get("duration") or 0),
            timed_out=bool(d.get("timedOut", False)),
            session_id=d.get("sessionId"),
            stdout_truncated=bool(d.get("stdoutTruncated", False)),
            stderr_truncated=bool(d.get("stderrTruncated", False)),
            stdout_bytes=int(d.get("stdoutBytes") or 0),
            stderr_bytes=int(d.get("stderrBytes") or 0),
            cause=d.get("cause"),
            signal=d.get("signal"),
            container_restarted=bool(d.get("containerRestarted", False)),
            raw=d,
            deadline_exceeded=bool(d.get("deadlineExceeded", False)),
        )


def _text(v: Any) -> str:
    if v is None:
        return ""
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return str(v)


@dataclass
class FileInfo:
    """One entry of :meth:`Sandbox.list_files`.

    Attributes:
        name: base name.
        absolute_path, relative_path: the path, absolute and relative to the
            listed directory.
        type: ``file``, ``directory``, ``symlink`` or ``other``.
        size: bytes.
        modified_at: ISO 8601.
        mode: ``"rw-r--r--"``.
        permissions: ``{"readable": bool, "writable": bool, "executable": bool}``.
    """

    name: str
    absolute_path: str
    relative_path: str
    type: str
    size: int
    modified_at: str
    mode: str
    permissions: Dict[str, bool]
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def is_file(self) -> bool:
        """``type == "file"``."""
        return self.type == "file"

    @property
    def is_directory(self) -> bool:
        """``type == "directory"``."""
        return self.type == "directory"

    @classmethod
    def from_json(cls, d: "_ops.FileInfo") -> "FileInfo":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(d.get("name", ""), d.get("absolutePath", ""), d.get("relativePath", ""),
                   d.get("type", "other"), int(d.get("size") or 0), d.get("modifiedAt", ""),
                   d.get("mode", ""), dict(d.get("permissions") or {}), d)


@dataclass
class ListFilesResult:
    """Result of :meth:`Sandbox.list_files`: iterable over its ``files``.

    Attributes:
        path: the listed directory (absolute).
        files: list of :class:`FileInfo`.
        count: number of entries.
        truncated: the listing stopped at the server's 100 000-entry limit.
    """

    path: str
    files: List[FileInfo]
    count: int
    truncated: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def __iter__(self) -> Iterator[FileInfo]:
        return iter(self.files)

    def __len__(self) -> int:
        return len(self.files)

    def names(self) -> List[str]:
        """The entries' names."""
        return [f.name for f in self.files]

    @classmethod
    def from_json(cls, d: "_ops.FileListResult") -> "ListFilesResult":
        """Build from the server\'s JSON (camelCase keys)."""
        files = [FileInfo.from_json(f) for f in d.get("files") or []]
        return cls(d.get("path", ""), files, int(d.get("count", len(files))),
                   bool(d.get("truncated", False)), d)


@dataclass
class ReadFileResult:
    """Result of :meth:`Sandbox.read_file_info`.

    Attributes:
        path: absolute path.
        content: ``str`` for text (``encoding == "utf-8"``), ``bytes`` for
            binary (``encoding == "base64"`` on the wire, decoded here).
        encoding: ``utf-8`` or ``base64`` (how the server sent it).
        is_binary: the first 8 KiB are not UTF-8 or contain NUL.
        mime_type: detected from the first bytes or the extension.
        size: bytes.
    """

    path: str
    content: Union[str, bytes]
    encoding: str
    is_binary: bool
    mime_type: str
    size: int
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: "_ops.FileReadResult") -> "ReadFileResult":
        """Build from the server\'s JSON (camelCase keys)."""
        enc = d.get("encoding", "utf-8")
        content: Union[str, bytes] = d.get("content", "")
        if enc == "base64":
            content = base64.b64decode(content)
        return cls(d.get("path", ""), content, enc, bool(d.get("isBinary", False)),
                   d.get("mimeType", ""), int(d.get("size") or 0), d)


@dataclass
class SessionInfo:
    """State of a session (:meth:`ExecutionSession.info`).

    Attributes:
        id: session ID.
        cwd: its shell's current directory.
        shell_running: whether its bash is alive.
        busy: a command is running; queued: commands waiting behind it.
        command_timeout_ms: default timeout of its commands (ms) or ``None``.
    """

    id: str
    cwd: str
    shell_running: bool
    busy: bool
    queued: int
    command_timeout_ms: Optional[int] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: "_ops.SessionInfo") -> "SessionInfo":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(d.get("id", ""), d.get("cwd", ""), bool(d.get("shellRunning", False)),
                   bool(d.get("busy", False)), int(d.get("queued") or 0),
                   d.get("commandTimeoutMs"), d)


@dataclass
class CodeContext:
    """A code-interpreter context: one interpreter process whose state
    persists across :meth:`Sandbox.run_code` calls.

    Attributes:
        id: context ID (``ctx-7``, or ``default-python`` for a language's
            default context).
        language: ``python``, ``javascript`` or ``typescript``.
        cwd: its working directory.
        created_at, last_used: ISO 8601.
        mode: the driver (``ipython``, ``stdlib``, ``node``).
    """

    id: str
    language: str
    cwd: str = "/workspace"
    created_at: Optional[str] = None
    last_used: Optional[str] = None
    mode: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def from_json(cls, d: "_ops.ContextInfo") -> "CodeContext":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(d.get("id", ""), d.get("language", ""), d.get("cwd", "/workspace"),
                   d.get("createdAt"), d.get("lastUsed"), d.get("mode"), d)


@dataclass
class Result:
    """One rich output of a cell (the SDK's ``Result``): a MIME bundle.

    Attributes:
        text: ``text/plain``.
        html, svg, latex, markdown, javascript: the matching MIME types.
        png, jpeg: base64 strings (see :meth:`png_bytes`).
        json: a decoded JSON value (``application/json``).
        chart: the SDK's ChartData (a dict: type, title, data, layout,
            library) for a matplotlib figure, a Plotly or a Vega-Lite
            bundle (docs/protocol.md §3.7); None otherwise.
        formats: MIME types present in the bundle.
        is_main_result: the cell's value, as opposed to a ``display()``
            output or a figure.
    """

    text: Optional[str] = None
    html: Optional[str] = None
    png: Optional[str] = None
    jpeg: Optional[str] = None
    svg: Optional[str] = None
    latex: Optional[str] = None
    markdown: Optional[str] = None
    javascript: Optional[str] = None
    json: Any = None
    chart: Any = None
    data: Any = None
    formats: List[str] = field(default_factory=list)
    is_main_result: bool = False
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    def png_bytes(self) -> Optional[bytes]:
        """The PNG image decoded, or ``None``."""
        return base64.b64decode(self.png) if self.png else None

    def jpeg_bytes(self) -> Optional[bytes]:
        """The JPEG image decoded, or ``None``."""
        return base64.b64decode(self.jpeg) if self.jpeg else None

    @classmethod
    def from_json(cls, d: "_ops.RichResult") -> "Result":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(d.get("text"), d.get("html"), d.get("png"), d.get("jpeg"), d.get("svg"),
                   d.get("latex"), d.get("markdown"), d.get("javascript"), d.get("json"),
                   d.get("chart"), d.get("data"), list(d.get("formats") or []),
                   bool(d.get("isMainResult", False)), d)


@dataclass
class Logs:
    """Output a cell printed: lists of chunks as written (join them for the
    whole text)."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """An exception raised by the user's code.

    Attributes:
        name: exception class (``ZeroDivisionError``, ``ReferenceError``).
        value: its message (``message`` is an alias, the SDK's name).
        traceback: list of lines/blocks.
    """

    name: str
    value: str
    traceback: List[str] = field(default_factory=list)

    @property
    def message(self) -> str:
        """Alias of ``value`` (the Cloudflare SDK's name)."""
        return self.value

    @classmethod
    def from_json(cls, d: Dict[str, Any]) -> "ExecutionError":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(d.get("name", ""), d.get("value", d.get("message", "")),
                   list(d.get("traceback") or []))


@dataclass
class Execution:
    """Outcome of :meth:`Sandbox.run_code`.  An exception in the user's code
    is in ``error``; it is not raised.

    Attributes:
        results: list of :class:`Result` (figures, ``display()`` outputs and
            the cell's value, in order).
        logs: :class:`Logs` (stdout/stderr chunks).
        error: :class:`ExecutionError` or ``None``.
        execution_count: the context's cell counter.
        context_id, language: where it ran.
        timed_out: the ``timeout`` interrupted the cell (``error`` is then a
            ``KeyboardInterrupt`` or similar; the context keeps its state).
        duration: ms.
    """

    results: List[Result] = field(default_factory=list)
    logs: Logs = field(default_factory=Logs)
    error: Optional[ExecutionError] = None
    execution_count: Optional[int] = None
    context_id: Optional[str] = None
    language: Optional[str] = None
    timed_out: bool = False
    duration: int = 0
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)
    #: printed output or results beyond the server's caps were dropped
    #: (docs/protocol.md §3.7); ``raw`` has the byte counts
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    results_truncated: bool = False

    @property
    def text(self) -> Optional[str]:
        """``text/plain`` of the main result (the cell's value), or ``None``."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @classmethod
    def from_json(cls, d: "_ops.ContextRunResult") -> "Execution":
        """Build from the server\'s JSON (camelCase keys)."""
        logs = d.get("logs") or {}
        err = d.get("error")
        return cls([Result.from_json(r) for r in d.get("results") or []],
                   Logs(list(logs.get("stdout") or []), list(logs.get("stderr") or [])),
                   ExecutionError.from_json(err) if isinstance(err, dict) else None,
                   d.get("executionCount"), d.get("contextId"), d.get("language"),
                   bool(d.get("timedOut", False)), int(d.get("duration") or 0), d,
                   stdout_truncated=bool(d.get("stdoutTruncated", False)),
                   stderr_truncated=bool(d.get("stderrTruncated", False)),
                   results_truncated=bool(d.get("resultsTruncated", False)))


@dataclass
class ExposedPort:
    """A preview URL (:meth:`Sandbox.expose_port`).

    Attributes:
        url: ``http://{port}-{sandbox}-{token}.{hostname}/``.
        port: the port inside the sandbox.
        token: the URL's token (its credential; ``None`` in
            :meth:`Sandbox.get_exposed_ports`, which the server omits).
        name: optional label.
        status: ``active`` (from :meth:`Sandbox.get_exposed_ports`).
    """

    url: str
    port: int
    token: Optional[str] = None
    name: Optional[str] = None
    status: Optional[str] = None
    raw: Dict[str, Any] = field(default_factory=dict, repr=False)

    @property
    def host(self) -> str:
        """The URL's ``host[:port]`` (what a proxy matches in ``Host``)."""
        from urllib.parse import urlsplit
        return urlsplit(self.url).netloc

    @classmethod
    def from_json(cls, d: "_ops.PortExposeResult") -> "ExposedPort":
        """Build from the server\'s JSON (camelCase keys)."""
        return cls(d.get("url", ""), int(d.get("port") or 0), d.get("token"), d.get("name"),
                   d.get("status"), d)


@dataclass
class LogMatch:
    """A log line found by :meth:`Process.wait_for_log`.

    Attributes:
        line: the whole matching line (without its newline).
        match: ``[whole match, group 1, ...]`` for a regex, else ``None``.
        re_match: the :class:`re.Match` when a compiled Python pattern was
            given (matched on the client side), else ``None``.
    """

    line: str
    match: Optional[List[Optional[str]]] = None
    re_match: Any = None


@dataclass
class PortReady:
    """Result of :meth:`Process.wait_for_port`: ``ready`` is always true
    (failures raise); ``status_code`` is the HTTP status in ``http`` mode."""

    ready: bool
    port: int
    status_code: Optional[int] = None


@dataclass
class ProcessExit:
    """Result of :meth:`Process.wait_for_exit`.

    Attributes:
        exit_code: the exit status (143/137 after a kill).
        status: ``completed``, ``failed``, ``killed`` or ``error``.
    """

    exit_code: Optional[int]
    status: str
