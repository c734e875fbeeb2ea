"""A TCP proxy in front of one etcd member (its HTTP/JSON gateway) that, while
faults are on, delays, drops and duplicates requests and drops replies.

It understands just enough HTTP/1.1 to cut the client's byte stream into
requests (headers, then Content-Length bytes of body); replies are relayed
as bytes (watch streams are long chunked replies).  Per request, with the
probabilities given to :meth:`Proxy.set_faults`:

* delay        sleep up to ``delay`` seconds before forwarding it;
* drop_request close the client's connection without forwarding it;
* drop_reply   forward it, then close the client's connection: the request
               may have been applied, the client never learns (an unknown
               outcome for the shard);
* duplicate    forward it, and send the same bytes again 0.2-2 s later on a
               connection of its own whose reply is thrown away (a late
               duplicate transaction).

Threads: one acceptor, two per connection; :meth:`close` ends them all.
"""

from __future__ import annotations

import random
import socket
import threading
import time
from typing import Optional


class Proxy:
    def __init__(self, host: str, upstream_port: int) -> None:
        self.up = (host, upstream_port)
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.lock = threading.Lock()
        self.f = {"delay": 0.0, "drop_request": 0.0, "drop_reply": 0.0, "duplicate": 0.0}
        self.rng = random.Random()
        self.closed = threading.Event()
        self.conns: list = []
        self.counts = {"requests": 0, "delayed": 0, "dropped_requests": 0,
                       "dropped_replies": 0, "duplicated": 0}

    def set_faults(self, delay: float = 0.0, drop_request: float = 0.0,
                   drop_reply: float = 0.0, duplicate: float = 0.0) -> None:
        """Fault probabilities (0..1) per request; ``delay`` is the longest
        delay in seconds (each request waits uniform(0, delay)).  No
        arguments: faults off."""
        with self.lock:
            self.f = {"delay": delay, "drop_request": drop_request,
                      "drop_reply": drop_reply, "duplicate": duplicate}

    def start(self) -> None:
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            conns, self.conns = self.conns, []
        for c in conns:
            try:
                c.close()
            except OSError:
                pass

    def _track(self, s: socket.socket) -> None:
        with self.lock:
            self.conns.append(s)

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self._track(c)
            threading.Thread(target=self._serve, args=(c,), daemon=True).start()

    @staticmethod
    def _read_request(c: socket.socket, buf: bytearray) -> Optional[bytes]:
        """One whole request from ``c`` (bytes beyond it stay in ``buf``)."""
        while b"\r\n\r\n" not in buf:
            d = c.recv(65536)
            if not d:
                return None
            buf += d
        end = buf.index(b"\r\n\r\n") + 4
        length = 0
        for line in bytes(buf[:end]).split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        while len(buf) < end + length:
            d = c.recv(65536)
            if not d:
                return None
            buf += d
        req = bytes(buf[:end + length])
        del buf[:end + length]
        return req

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                d = src.recv(65536)
                if not d:
                    break
                dst.sendall(d)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _duplicate(self, req: bytes) -> None:
        time.sleep(self.rng.uniform(0.2, 2.0))
        try:
            with socket.create_connection(self.up, timeout=5) as u:
                u.sendall(req)
                u.recv(65536)
        except OSError:
            pass

    def _serve(self, c: socket.socket) -> None:
        try:
            u = socket.create_connection(self.up, timeout=5)
            u.settimeout(None)
        except OSError:
            c.close()
            return
        self._track(u)
        threading.Thread(target=self._pump, args=(u, c), daemon=True).start()
        buf = bytearray()
        try:
            while not self.closed.is_set():
                req = self._read_request(c, buf)
                if req is None:
                    break
                with self.lock:
                    f = dict(self.f)
                    self.counts["requests"] += 1
                r = self.rng.random
                if f["delay"] and r() < 0.5:
                    self.counts["delayed"] += 1
                    time.sleep(self.rng.uniform(0, f["delay"]))
                if r() < f["drop_request"]:
                    self.counts["dropped_requests"] += 1
                    break
                u.sendall(req)
                if r() < f["duplicate"]:
                    self.counts["duplicated"] += 1
                    threading.Thread(target=self._duplicate, args=(req,), daemon=True).start()
                if r() < f["drop_reply"]:
                    self.counts["dropped_replies"] += 1
                    break
        except OSError:
            pass
        for s in (c, u):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
