"""Server-Sent Event streams (``docs/http.md`` "Server-Sent Events").

:class:`EventStream` is what ``exec_stream``, ``read_file_stream`` (events),
``watch``, ``stream_process_logs`` and ``run_code_stream`` return: an
iterator of event dicts, in order, each as the server sent it::

    {"seq": 2, "type": "stdout", "timestamp": 1795310787266, "data": "line 1\\n"}

``timestamp`` is milliseconds since the Unix epoch.  Output bytes arrive as
``str`` (bytes that are not UTF-8 become U+FFFD on the server).

When the connection drops (network error, the server closing it before the
stream's last event, or no data -- not even the 15 s heartbeat -- for
``idle_timeout`` seconds) the stream reconnects with ``Last-Event-ID`` =
the last ``seq`` it handed out, so the caller sees every event once.  If
the server can no longer replay some events the iterator yields a
``{"type": "gap", "missed": N}`` event in their place (the server sends
those itself for process-log rings; the client synthesises one when it
notices a jump in ``seq`` after a reconnect).
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from . import errors
from ._http import Transport, new_key

#: Event types that end a stream, per kind of stream.
FINAL_TYPES = {
    "exec": ("complete", "error"),
    "file": ("complete", "error"),
    "watch": ("stopped", "error"),
    "process": ("exit", "error"),
    "code": ("execution_complete",),
    "terminal": ("exit", "error"),
}

_TRANSIENT = ("SHARD_UNAVAILABLE", "GATEWAY_UNAVAILABLE", "REQUEST_TIMEOUT")


def parse_sse(readline: Callable[[], bytes]) -> Iterator[Tuple[Optional[str], str, Optional[str]]]:
    """Parse an SSE byte stream (WHATWG HTML 9.2).

    ``readline`` returns one line (with its terminator) or ``b""`` at the
    end.  Yields ``(event_type, data, id)`` per dispatched event; comments
    (``: ping``) and ``retry:`` lines are skipped.
    """
    ev_type: Optional[str] = None
    data: list = []
    ev_id: Optional[str] = None
    while True:
        raw = readline()
        if not raw:
            return
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if line == "":
            if data:
                yield ev_type, "\n".join(data), ev_id
            ev_type, data, ev_id = None, [], None
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if field == "event":
            ev_type = value
        elif field == "data":
            data.append(value)
        elif field == "id":
            ev_id = value


class EventStream:
    """An iterator of a stream's events (dicts), resumable.

    Attributes:
        stream_id: the server's stream ID (``exec-3``, ``proc:web``...), once
            known.
        last_seq: ``seq`` of the last event handed out (0 before any).
        done: whether the stream's last event has been handed out.

    Use as a context manager or call :meth:`close` when abandoning a stream
    early; :meth:`cancel` also stops what produces it (kills an
    ``exec_stream`` command with exit code 130, stops a watch).

    Errors: :class:`errors.StreamNotFound` when resuming a stream the server
    no longer has; :class:`errors.GatewayUnavailable` when reconnecting
    failed ``retries`` times in a row; the start request's own errors
    (e.g. :class:`errors.FileNotFound` for ``read_file_stream``).
    """

    def __init__(self, transport: Transport, sandbox_id: str, kind: str,
                 start: Optional[Tuple[str, Dict[str, Any]]] = None,
                 stream_id: Optional[str] = None, after: int = 0,
                 idle_timeout: float = 45.0) -> None:
        self._t = transport
        self._sandbox = sandbox_id
        self._kind = kind
        self._final = FINAL_TYPES.get(kind, ("complete", "error"))
        self._start = start
        self._start_key = None
        self.stream_id = stream_id
        self.last_seq = after
        self.done = False
        self.idle_timeout = idle_timeout
        self._conn: Optional[http.client.HTTPConnection] = None
        self._resp: Optional[http.client.HTTPResponse] = None
        self._events: Optional[Iterator] = None
        self._failures = 0
        self._resumed = False
        self._deadline: Optional[float] = None
        self._queue: List[Dict[str, Any]] = []

    # -- public --------------------------------------------------------------------

    def __iter__(self) -> "EventStream":
        return self

    def __enter__(self) -> "EventStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self._drop()
        except Exception:
            pass

    def set_deadline(self, deadline: Optional[float]) -> None:
        """Make :meth:`__next__` raise :class:`errors.RequestTimeout` once
        ``time.monotonic()`` passes ``deadline`` without an event."""
        self._deadline = deadline

    def close(self) -> None:
        """Close the connection.  The stream stays on the server (it can be
        resumed with ``Sandbox.resume_stream``) until read to its end, cancelled,
        or 5 minutes pass."""
        self._drop()
        self.done = True

    def cancel(self) -> Dict[str, Any]:
        """Stop what produces the stream (``DELETE .../streams/{id}``) and
        close it.  Returns ``{streamId, cancelled}``."""
        self._drop()
        self.done = True
        if not self.stream_id:
            return {"streamId": None, "cancelled": False}
        return self._t.call_json("DELETE", self._t.path("v1", "sandboxes", self._sandbox,
                                                        "streams", self.stream_id),
                                 operation="stream.cancel")

    def __next__(self) -> Dict[str, Any]:
        while True:
            if self._queue:
                ev = self._queue.pop(0)
                if ev["type"] in self._final or (ev["type"] == "error" and
                                                 isinstance(ev.get("error"), dict)):
                    self.done = True
                return ev
            if self.done:
                self._drop()
                raise StopIteration
            if self._events is None:
                self._connect()
            elif self._conn is not None and self._conn.sock is not None:
                self._conn.sock.settimeout(self._read_timeout())
            try:
                item = next(self._events)  # type: ignore[arg-type]
            except StopIteration:
                item = None
            except socket.timeout as e:
                self._drop()
                if self._deadline is not None and time.monotonic() >= self._deadline:
                    raise errors.make("REQUEST_TIMEOUT", "no event before the deadline") from e
                self._lost(e)
                continue
            except (OSError, http.client.HTTPException, ValueError) as e:
                self._drop()
                self._lost(e)
                continue
            if item is None:
                # The response ended before the stream's last event.
                self._drop()
                self._lost(None)
                continue
            self._accept(*item)

    def _accept(self, ev_type: Optional[str], data: str, ev_id: Optional[str]) -> None:
        """Queue one received SSE event (plus a gap marker if needed)."""
        try:
            ev = json.loads(data)
        except ValueError:
            ev = {"type": ev_type or "message", "data": data}
        if not isinstance(ev, dict):
            ev = {"type": ev_type or "message", "data": ev}
        ev.setdefault("type", ev_type or "message")
        if ev["type"] == "error" and isinstance(ev.get("error"), dict) and \
                ev["error"].get("code") in _TRANSIENT:
            # The server could not read the stream for us right now: resume.
            self._drop()
            self._lost(None)
            return
        seq = ev.get("seq")
        if not isinstance(seq, int) and ev_id and ev_id.isdigit():
            seq = int(ev_id)
        if isinstance(seq, int):
            if seq <= self.last_seq:
                return  # replayed after a reconnect: already handed out
            gap = seq - self.last_seq - 1
            if gap > 0 and self._resumed:
                self._queue.append({"type": "gap", "missed": gap, "synthetic": True})
            self.last_seq = seq
            self._failures = 0
        self._resumed = False
        self._queue.append(ev)

    # -- internals --------------------------------------------------------------------

    def _connect(self) -> None:
        if self.stream_id is None:
            assert self._start is not None
            op, args = self._start
            if self._start_key is None:
                self._start_key = new_key()
            path = self._t.path("v1", "sandboxes", self._sandbox, op)
            body = json.dumps(args, separators=(",", ":")).encode("utf-8")
            conn, resp = self._t.send("POST", path, body,
                                      headers={"Accept": "text/event-stream"},
                                      timeout=self._read_timeout(), stream=True,
                                      operation=op, key=self._start_key)
            sid = resp.headers.get("X-Sbx-Stream-Id")
            if sid:
                self.stream_id = sid
        else:
            path = self._t.path("v1", "sandboxes", self._sandbox, "streams", self.stream_id)
            conn, resp = self._t.send("GET", path, None,
                                      headers={"Accept": "text/event-stream",
                                               "Last-Event-ID": str(self.last_seq)},
                                      timeout=self._read_timeout(), stream=True,
                                      operation="stream.events")
            self._resumed = True
        ctype = resp.headers.get("Content-Type", "")
        if not ctype.startswith("text/event-stream"):
            data = resp.read()
            conn.close()
            raise errors.make("INVALID_RESPONSE",
                              f"expected an event stream, got {ctype!r}: {data[:200]!r}")
        self._conn, self._resp = conn, resp
        self._events = parse_sse(resp.readline)

    def _read_timeout(self) -> float:
        t = self.idle_timeout
        if self._deadline is not None:
            t = max(0.05, min(t, self._deadline - time.monotonic()))
        return t

    def _lost(self, exc: Optional[BaseException]) -> None:
        """The connection ended early: back off, then reconnect (or give up)."""
        # Without a stream ID yet, _connect re-sends the start request with the
        # same idempotency key: the operation runs once, events replay from 1.
        self._failures += 1
        if self._failures > self._t.retries:
            raise errors.make("GATEWAY_UNAVAILABLE",
                              f"stream {self.stream_id} kept dropping: {exc}") from exc
        if self._failures > 1:
            self._t.sleep_backoff(self._failures - 1)

    def _drop(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except Exception:
                pass
        self._conn = self._resp = None
        self._events = None
