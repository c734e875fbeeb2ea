"""A session's terminal over WebSocket (``docs/http.md`` "Terminal").

:class:`WebSocket` is a minimal RFC 6455 client on a raw socket (client
frames masked, fragmented messages reassembled, ping answered, close
handshake); :class:`Terminal` speaks the Cloudflare SDK's PTY protocol over
it:

* server -> client: the terminal's recent output (up to 256 KiB) as binary
  frames, then the text frame ``{"type":"ready"}``; then output as binary
  frames; ``{"type":"exit","code":N}`` when the shell exits (then a close
  frame); ``{"type":"error","code":...,"message":...}``;
* client -> server: binary frames are keystrokes; text frames are JSON
  control messages (``{"type":"resize","cols":N,"rows":N}``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import ssl
import struct
import threading
import time
from typing import Dict, Iterator, List, Optional, Pattern, Tuple, Union

from . import errors

__all__ = ["WebSocket", "Terminal"]

_GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"

OP_CONT, OP_TEXT, OP_BINARY, OP_CLOSE, OP_PING, OP_PONG = 0x0, 0x1, 0x2, 0x8, 0x9, 0xA


def _mask(payload: bytes, key: bytes) -> bytes:
    n = len(payload)
    if n == 0:
        return b""
    k = (key * (n // 4 + 1))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(k, "big")).to_bytes(n, "big")


class WebSocket:
    """A blocking WebSocket client connection (RFC 6455), text and binary
    messages.

    Args:
        host, port: the server.
        path: request target including the query string.
        headers: extra request headers (e.g. ``Authorization``).
        ssl_context: wrap the socket in TLS (``wss://``) when given.
        timeout: seconds for connecting and the handshake.
        server_hostname: TLS SNI / certificate name (default ``host``).

    Raises:
        errors.SandboxError: the server refused the upgrade (its JSON error
            body is mapped to the matching class, e.g. ``Unauthorized``).
        errors.WebSocketError: the handshake answer was not a valid 101.
        errors.GatewayUnavailable: the connection could not be made.
    """

    def __init__(self, host: str, port: int, path: str,
                 headers: Optional[Dict[str, str]] = None,
                 ssl_context: Optional[ssl.SSLContext] = None, timeout: float = 60.0,
                 server_hostname: Optional[str] = None, max_message: int = 64 << 20) -> None:
        self._buf = bytearray()
        self._send_lock = threading.Lock()
        self._frag_op: Optional[int] = None
        self._frag: List[bytes] = []
        self.closed = False
        self.close_code: Optional[int] = None
        self.close_reason = ""
        self.max_message = max_message
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise errors.make("GATEWAY_UNAVAILABLE", f"cannot connect to {host}:{port}: {e}") from e
        if ssl_context is not None:
            sock = ssl_context.wrap_socket(sock, server_hostname=server_hostname or host)
        self.sock = sock
        try:
            self._handshake(host, port, path, headers or {})
        except BaseException:
            sock.close()
            raise
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    # -- handshake -------------------------------------------------------------------

    def _handshake(self, host: str, port: int, path: str, headers: Dict[str, str]) -> None:
        key = base64.b64encode(os.urandom(16)).decode("ascii")
        hosthdr = f"[{host}]" if ":" in host else host
        lines = [f"GET {path} HTTP/1.1", f"Host: {hosthdr}:{port}", "Upgrade: websocket",
                 "Connection: Upgrade", f"Sec-WebSocket-Key: {key}",
                 "Sec-WebSocket-Version: 13"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        self.sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        while b"\r\n\r\n" not in self._buf:
            if len(self._buf) > 65536:
                raise errors.make("WEBSOCKET_ERROR", "handshake answer too long")
            chunk = self.sock.recv(4096)
            if not chunk:
                raise errors.make("WEBSOCKET_ERROR", "connection closed during the handshake")
            self._buf += chunk
        head, _, rest = bytes(self._buf).partition(b"\r\n\r\n")
        self._buf = bytearray(rest)
        status_line, *hlines = head.decode("latin-1").split("\r\n")
        parts = status_line.split(" ", 2)
        status = int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0
        hdrs = {}
        for h in hlines:
            k, _, v = h.partition(":")
            hdrs[k.strip().lower()] = v.strip()
        if status != 101:
            body = bytes(self._buf)
            n = int(hdrs.get("content-length", "0") or 0)
            self.sock.settimeout(5)
            try:
                while len(body) < n:
                    chunk = self.sock.recv(65536)
                    if not chunk:
                        break
                    body += chunk
            except OSError:
                pass
            try:
                j = json.loads(body.decode("utf-8"))
            except ValueError:
                j = None
            if isinstance(j, dict) and "code" in j:
                raise errors.from_body(j, status, "terminal")
            raise errors.SandboxError("WEBSOCKET_ERROR",
                                      f"upgrade refused: HTTP {status}: {body[:200]!r}",
                                      status, {}, "terminal")
        want = base64.b64encode(hashlib.sha1(key.encode("ascii") + _GUID).digest()).decode()
        if hdrs.get("sec-websocket-accept") != want:
            raise errors.make("WEBSOCKET_ERROR", "bad Sec-WebSocket-Accept in the handshake")

    # -- frames ----------------------------------------------------------------------

    def send(self, data: Union[bytes, str], opcode: Optional[int] = None) -> None:
        """Send one message: ``str`` as a text frame, ``bytes`` as binary."""
        if isinstance(data, str):
            payload, op = data.encode("utf-8"), OP_TEXT
        else:
            payload, op = bytes(data), OP_BINARY
        self._send_frame(opcode if opcode is not None else op, payload)

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        if self.closed and opcode != OP_CLOSE:
            raise errors.make("WEBSOCKET_ERROR", "the WebSocket is closed")
        n = len(payload)
        head = bytearray([0x80 | opcode])
        if n < 126:
            head.append(0x80 | n)
        elif n < 65536:
            head.append(0x80 | 126)
            head += struct.pack("!H", n)
        else:
            head.append(0x80 | 127)
            head += struct.pack("!Q", n)
        key = os.urandom(4)
        frame = bytes(head) + key + _mask(payload, key)
        with self._send_lock:
            try:
                self.sock.sendall(frame)
            except OSError as e:
                self.closed = True
                raise errors.make("WEBSOCKET_ERROR", f"send failed: {e}") from e

    def _need(self, n: int) -> None:
        while len(self._buf) < n:
            chunk = self.sock.recv(max(65536, n - len(self._buf)))
            if not chunk:
                raise EOFError
            self._buf += chunk

    def _frame(self) -> Tuple[bool, int, bytes]:
        """Read one frame; raises socket.timeout with the buffer intact."""
        self._need(2)
        b0, b1 = self._buf[0], self._buf[1]
        n = b1 & 0x7F
        off = 2
        if n == 126:
            self._need(4)
            n = struct.unpack_from("!H", self._buf, 2)[0]
            off = 4
        elif n == 127:
            self._need(10)
            n = struct.unpack_from("!Q", self._buf, 2)[0]
            off = 10
        if n > self.max_message:
            raise errors.make("WEBSOCKET_ERROR", f"frame of {n} bytes exceeds the limit")
        masked = bool(b1 & 0x80)
        total = off + (4 if masked else 0) + n
        self._need(total)
        payload = bytes(self._buf[off + (4 if masked else 0):total])
        if masked:
            payload = _mask(payload, bytes(self._buf[off:off + 4]))
        del self._buf[:total]
        return bool(b0 & 0x80), b0 & 0x0F, payload

    def recv(self, timeout: Optional[float] = None) -> Optional[Tuple[int, bytes]]:
        """Next message as ``(opcode, payload)`` (``OP_TEXT`` or
        ``OP_BINARY``), or ``None`` once the connection is closed.

        Raises ``TimeoutError`` (``socket.timeout``) when nothing complete
        arrives within ``timeout`` seconds (the connection stays usable).
        """
        while True:
            if self.closed and not self._buf:
                return None
            self.sock.settimeout(timeout)
            try:
                fin, op, payload = self._frame()
            except EOFError:
                self.closed = True
                self._buf.clear()
                return None
            except socket.timeout:
                raise
            except OSError:
                self.closed = True
                self._buf.clear()
                return None
            if op == OP_PING:
                try:
                    self._send_frame(OP_PONG, payload)
                except errors.SandboxError:
                    pass
                continue
            if op == OP_PONG:
                continue
            if op == OP_CLOSE:
                if len(payload) >= 2:
                    self.close_code = struct.unpack("!H", payload[:2])[0]
                    self.close_reason = payload[2:].decode("utf-8", "replace")
                if not self.closed:
                    try:
                        self._send_frame(OP_CLOSE, payload[:2])
                    except errors.SandboxError:
                        pass
                self.closed = True
                self._buf.clear()
                self._close_socket()
                return None
            if op == OP_CONT:
                if self._frag_op is None:
                    raise errors.make("WEBSOCKET_ERROR", "continuation frame without a start")
                self._frag.append(payload)
                if fin:
                    op, self._frag_op = self._frag_op, None
                    payload, self._frag = b"".join(self._frag), []
                    return op, payload
                continue
            if not fin:
                self._frag_op, self._frag = op, [payload]
                continue
            return op, payload

    def close(self, code: int = 1000, reason: str = "") -> None:
        """Send a close frame (if not closed yet) and close the socket."""
        if not self.closed:
            try:
                self._send_frame(OP_CLOSE, struct.pack("!H", code) + reason.encode("utf-8"))
            except errors.SandboxError:
                pass
            self.closed = True
            # Give the server a moment to answer the close (RFC 6455 5.5.1).
            try:
                self.sock.settimeout(1.0)
                end = time.monotonic() + 1.0
                while time.monotonic() < end:
                    if not self.sock.recv(65536):
                        break
            except OSError:
                pass
        self._close_socket()

    def _close_socket(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class Terminal:
    """An interactive terminal (pseudo-terminal + shell) of a session.

    Get one with :meth:`Sandbox.terminal`.  One terminal exists per session
    and is shared by every connection; closing this object disconnects, it
    does not end the shell (type ``exit`` for that, or call
    :meth:`Sandbox.close_terminal`).

    Attributes:
        backlog: the output the terminal had printed before this connection
            (up to 256 KiB), as received before ``ready``; also returned
            first by :meth:`read`/iteration.
        exit_code: the shell's exit status once it exited, else ``None``.
        session_id: the session it belongs to.

    Iterating yields output chunks (``bytes``) until the shell exits or the
    connection closes.
    """

    def __init__(self, ws: WebSocket, session_id: str, open_timeout: float = 60.0) -> None:
        self.ws = ws
        self.session_id = session_id
        self.exit_code: Optional[int] = None
        self.error: Optional[errors.SandboxError] = None
        self._pending: List[bytes] = []
        self._text = ""
        deadline = time.monotonic() + open_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                ws.close()
                raise errors.make("REQUEST_TIMEOUT", "the terminal did not become ready",
                                  operation="terminal")
            msg = ws.recv(timeout=left)
            if msg is None:
                raise errors.make("WEBSOCKET_ERROR",
                                  "the terminal closed before it was ready "
                                  f"({ws.close_code} {ws.close_reason})".strip(),
                                  operation="terminal")
            op, payload = msg
            if op == OP_BINARY:
                self._pending.append(payload)
                continue
            ctl = self._control(payload)
            if ctl == "error" and self.error is not None:
                err, self.error = self.error, None
                ws.close()
                raise err
            if ctl in ("ready", "exit"):
                break
        self.backlog = b"".join(self._pending)

    # -- input -----------------------------------------------------------------------

    def write(self, data: Union[bytes, str]) -> None:
        """Type ``data`` (``str`` is UTF-8 encoded) into the terminal.  Send
        ``"\\r"`` or ``"\\n"`` to press Enter, ``"\\x03"`` for Ctrl-C."""
        if isinstance(data, str):
            data = data.encode("utf-8")
        self.ws.send(bytes(data))

    def resize(self, cols: int, rows: int) -> None:
        """Set the terminal size (1-1000 each)."""
        self.ws.send(json.dumps({"type": "resize", "cols": int(cols), "rows": int(rows)}))

    # -- output ----------------------------------------------------------------------

    def _control(self, payload: bytes) -> Optional[str]:
        try:
            msg = json.loads(payload.decode("utf-8"))
        except ValueError:
            return None
        t = msg.get("type") if isinstance(msg, dict) else None
        if t == "exit":
            self.exit_code = msg.get("code")
        elif t == "error":
            self.error = errors.from_body({"code": msg.get("code") or "INTERNAL_ERROR",
                                           "message": msg.get("message", "")},
                                          operation="terminal")
        return t

    def read(self, timeout: Optional[float] = None) -> Optional[bytes]:
        """The next output chunk, or ``None`` once the shell exited / the
        connection closed.

        Raises:
            TimeoutError: nothing arrived within ``timeout`` seconds.
            errors.SandboxError: the server reported an error on the terminal.
        """
        if self._pending:
            return self._pending.pop(0)
        while True:
            if self.error is not None:
                err, self.error = self.error, None
                raise err
            msg = self.ws.recv(timeout=timeout)
            if msg is None:
                return None
            op, payload = msg
            if op == OP_BINARY:
                return payload
            self._control(payload)

    def __iter__(self) -> Iterator[bytes]:
        while True:
            chunk = self.read()
            if chunk is None:
                return
            yield chunk

    def expect(self, pattern: Union[str, Pattern[str]], timeout: float = 10.0) -> str:
        """Read until the output received since the last ``expect`` contains
        ``pattern`` (a substring, or a compiled regex searched in the output
        decoded as UTF-8).  Returns that output up to the end of the match;
        the rest is kept for the next call.

        Raises:
            TimeoutError: not seen within ``timeout`` seconds.
            EOFError: the terminal ended first.
        """
        deadline = time.monotonic() + timeout
        while True:
            if isinstance(pattern, str):
                i = self._text.find(pattern)
                end = i + len(pattern) if i >= 0 else -1
            else:
                m = pattern.search(self._text)
                end = m.end() if m else -1
            if end >= 0:
                out, self._text = self._text[:end], self._text[end:]
                return out
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"{pattern!r} not seen in the terminal within {timeout} s; "
                                   f"got {self._text[-300:]!r}")
            try:
                chunk = self.read(timeout=left)
            except socket.timeout:
                continue
            if chunk is None:
                raise EOFError(f"the terminal ended before {pattern!r}; got {self._text[-300:]!r}")
            self._text += chunk.decode("utf-8", "replace")

    def wait(self, timeout: Optional[float] = None) -> Optional[int]:
        """Read (and discard) output until the shell exits; return its exit
        code (``None`` if the connection closed without one).

        Raises ``TimeoutError`` after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"the terminal did not exit within {timeout} s")
            try:
                chunk = self.read(timeout=left)
            except socket.timeout:
                continue
            if chunk is None:
                return self.exit_code

    def close(self) -> None:
        """Disconnect (the terminal's shell keeps running)."""
        self.ws.close()

    def __enter__(self) -> "Terminal":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
