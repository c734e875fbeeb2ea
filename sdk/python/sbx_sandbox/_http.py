"""HTTP transport: connection pool, idempotency keys, retries, error mapping.

Internal module; use :class:`sbx_sandbox.SbxClient`.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import ssl
import threading
import time
import uuid
from typing import Any, Dict, List, Optional, Tuple
from urllib.parse import quote, urlsplit

from . import errors

# Statuses that a proxy in front of the gateway may answer without our JSON
# body; treated like SHARD_UNAVAILABLE (retried with the same key).
_PROXY_RETRY_STATUSES = (502, 503, 504)
_RETRY_CODES = ("SHARD_UNAVAILABLE",)
# Answers after which the request may have taken effect (docs/protocol.md §4):
# a retry that then fails for another reason does not undo it.
_UNKNOWN_CODES = ("SHARD_UNAVAILABLE", "REQUEST_TIMEOUT", "GATEWAY_UNAVAILABLE",
                  "INTERNAL_ERROR", "OPERATION_INTERRUPTED")
# The least time (seconds) a retry must have left before the deadline.
_MIN_RETRY_LEFT = 0.5
# The largest X-Sbx-Timeout-Ms the server accepts (25 h, in ms).
_MAX_SERVER_TIMEOUT_MS = 90_000_000


def new_key() -> str:
    """A fresh idempotency key (uuid4, 32 hex digits)."""
    return uuid.uuid4().hex


class Response:
    """A fully read HTTP response."""

    __slots__ = ("status", "headers", "body")

    def __init__(self, status: int, headers: http.client.HTTPMessage, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    def json(self) -> Any:
        try:
            return json.loads(self.body.decode("utf-8")) if self.body else {}
        except (UnicodeDecodeError, ValueError) as e:
            raise errors.make("INVALID_RESPONSE",
                              f"the server answered HTTP {self.status} with a body that is not "
                              f"JSON: {self.body[:200]!r}") from e


class Transport:
    """Sends requests to one sbx HTTP front.

    Every logical request gets one ``Idempotency-Key`` (uuid4) that is reused
    by all of its retries, so a retry after a network error or a ``503
    SHARD_UNAVAILABLE`` is answered from the shard's reply cache instead of
    running the operation twice.  Retries back off exponentially
    (``backoff`` seconds, doubling, capped at ``backoff_max``, +-25% jitter)
    for at most ``retries`` attempts after the first.

    Deadlines: a request returns or raises by ``timeout`` seconds after it
    started (+ at most 1 s of slack), retries, back-off and reading the body
    included, whatever the server does (never answering, stopped, a reply
    cut short): every socket wait is bounded by the time left, and a retry
    that would have less than 0.5 s left after its back-off is not made —
    the last failure is raised instead.  A deadline that passes is ``REQUEST_TIMEOUT``.
    Streamed bodies (``stream=True``) are the caller's to bound once their
    headers arrived (:class:`sbx_sandbox.streams.EventStream` uses its idle
    timeout).
    """

    def __init__(self, url: str, api_key: Optional[str], timeout: float, retries: int,
                 backoff: float, backoff_max: float,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        parts = urlsplit(url if "://" in url else "http://" + url)
        if parts.scheme not in ("http", "https"):
            raise ValueError(f"unsupported URL scheme {parts.scheme!r} (http or https)")
        if not parts.hostname:
            raise ValueError(f"no host in URL {url!r}")
        self.url = url
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.prefix = parts.path.rstrip("/")
        self.api_key = api_key
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.backoff_max = backoff_max
        self.ssl_context = ssl_context or (ssl.create_default_context()
                                           if self.scheme == "https" else None)
        self._pool: List[http.client.HTTPConnection] = []
        self._lock = threading.Lock()

    # -- connections -----------------------------------------------------------

    @property
    def netloc(self) -> str:
        """``host:port`` of the server (IPv6 hosts bracketed)."""
        h = f"[{self.host}]" if ":" in self.host else self.host
        return f"{h}:{self.port}"

    def new_connection(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self.scheme == "https":
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout,
                                               context=self.ssl_context)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def _take(self, timeout: Optional[float]) -> Tuple[http.client.HTTPConnection, bool]:
        with self._lock:
            conn = self._pool.pop() if self._pool else None
        if conn is None:
            return self.new_connection(timeout), False
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        return conn, True

    def _give(self, conn: http.client.HTTPConnection) -> None:
        with self._lock:
            if len(self._pool) < 8:
                self._pool.append(conn)
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            pool, self._pool = self._pool, []
        for c in pool:
            c.close()

    def path(self, *segments: str, raw_tail: Optional[str] = None) -> str:
        """``/prefix/v1/<seg>/<seg>...``, each segment percent-encoded."""
        p = self.prefix + "/" + "/".join(quote(s, safe="") for s in segments)
        if raw_tail is not None:
            p += "/" + quote(raw_tail.lstrip("/"), safe="/")
        return p

    def headers(self, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        # X-Sbx-Client: without API keys the server refuses mutating requests
        # that lack it, which no web page can send cross-origin (docs/http.md).
        h = {"User-Agent": "sbx-sandbox-python/0.1", "Accept": "application/json",
             "X-Sbx-Client": "sbx-sandbox-python/0.1"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h

    @staticmethod
    def _left(deadline: Optional[float], operation: Optional[str]) -> Optional[float]:
        """Seconds left before ``deadline`` (None: no deadline); raises
        REQUEST_TIMEOUT when none are left."""
        if deadline is None:
            return None
        left = deadline - time.monotonic()
        if left <= 0:
            raise errors.make("REQUEST_TIMEOUT", "no answer within the request's deadline",
                              operation=operation)
        return left

    def _pause(self, attempt: int, deadline: Optional[float], last: BaseException,
               delay: Optional[float] = None) -> None:
        """Back off before retry ``attempt`` (or wait ``delay`` seconds), unless
        the retry would have less than ``_MIN_RETRY_LEFT`` seconds left before
        ``deadline`` (too little to hear the server's answer): then raise
        ``last``."""
        if delay is None:
            delay = min(self.backoff_max, self.backoff * (2 ** (attempt - 1)))
            delay *= random.uniform(0.75, 1.25)
        if deadline is not None and time.monotonic() + delay + _MIN_RETRY_LEFT > deadline:
            raise last
        time.sleep(delay)

    def sleep_backoff(self, attempt: int) -> None:
        """Sleep before retry number ``attempt`` (1-based)."""
        d = min(self.backoff_max, self.backoff * (2 ** (attempt - 1)))
        time.sleep(d * random.uniform(0.75, 1.25))

    # -- requests ----------------------------------------------------------------

    def send(self, method: str, path: str, body: Optional[bytes] = None,
             headers: Optional[Dict[str, str]] = None, timeout: Optional[float] = None,
             stream: bool = False, operation: Optional[str] = None,
             key: Optional[str] = None, retry: bool = False):
        """Send a request with retries.

        ``key`` reuses an idempotency key; ``retry=True`` says an earlier
        request with that key had an unknown outcome (it may have run).
        Attempts after one of unknown outcome say so too (``X-Sbx-Retry:
        1``, docs/http.md): a shard that took the sandbox over from a failed
        one answers them ``OPERATION_INTERRUPTED`` instead of running the
        request a second time.

        Returns a :class:`Response` (body read) or, with ``stream=True``, a
        tuple ``(connection, http.client.HTTPResponse)`` whose body the caller
        reads and whose connection the caller closes.  A response with status
        >= 400 raises the matching :class:`errors.SandboxError`.
        """
        timeout = self.timeout if timeout is None else timeout
        deadline = None if timeout is None else time.monotonic() + timeout
        hdrs = self.headers(headers)
        hdrs["Idempotency-Key"] = key or new_key()
        if body is not None:
            hdrs.setdefault("Content-Type", "application/json")
        attempt = 0
        # The first attempt whose outcome is not known (it may have taken
        # effect): if a retry then fails with an error that says "did not
        # run" (WRONG_OWNER, a validation error, ...), that is the retry's
        # outcome, not the request's — the request's is still unknown, so
        # the earlier error is raised, naming the last answer.
        unknown: Optional[errors.SandboxError] = None
        if retry and key:
            hdrs["X-Sbx-Retry"] = "1"

        def final(e: errors.SandboxError) -> errors.SandboxError:
            if unknown is None or e.code in _UNKNOWN_CODES:
                return e
            out = errors.make(unknown.code,
                              f"{unknown.message} (the request's outcome is unknown: a retry "
                              f"with the same idempotency key then answered {e.code}: "
                              f"{e.message})", operation=operation)
            out.__cause__ = e
            return out
        while True:
            if unknown is not None:
                hdrs["X-Sbx-Retry"] = "1"
            left = self._left(deadline, operation)
            if left is not None:
                # The server's deadline is ours (docs/http.md): it answers a
                # stuck shard SHARD_UNAVAILABLE while we still listen.
                hdrs["X-Sbx-Timeout-Ms"] = str(min(max(1, int(left * 1000)), _MAX_SERVER_TIMEOUT_MS))
            conn, reused = self._take(left)
            sock = None
            sent = False
            try:
                conn.request(method, path, body=body, headers=hdrs)
                sent = True
                sock = conn.sock  # kept: getresponse() may drop conn.sock
                if sock is not None:
                    sock.settimeout(self._left(deadline, operation))
                resp = conn.getresponse()
            except errors.SandboxError:
                conn.close()  # the deadline passed (_left)
                raise
            except socket.timeout as e:
                conn.close()
                raise errors.make("REQUEST_TIMEOUT",
                                  f"no answer from {self.url} within {timeout} s",
                                  operation=operation) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                if reused and not sent:
                    continue  # a kept-alive connection the server had closed: not an attempt
                last = errors.make("GATEWAY_UNAVAILABLE", f"cannot reach {self.url}: {e}",
                                   operation=operation)
                last.__cause__ = e
                if unknown is None:
                    unknown = last  # the request may have been sent
                if reused:
                    # The request went out on a kept-alive connection that
                    # then failed: most likely the server had closed it idle
                    # (RFC 9112 §9.3.1 lets a client retry then), but it may
                    # also have received and run it, so the outcome stays
                    # unknown (X-Sbx-Retry on the next attempt) and a retry's
                    # "did not run" answer is not the request's.  Not counted
                    # as an attempt: a stale connection is not the server's
                    # failure.
                    continue
                attempt += 1
                if attempt > self.retries:
                    raise last
                self._pause(attempt, deadline, last)
                continue
            if resp.status < 400 and stream:
                return conn, resp
            try:
                data = self._read_body(resp, sock, deadline, operation)
            except socket.timeout as e:
                conn.close()
                raise errors.make("REQUEST_TIMEOUT",
                                  f"the answer from {self.url} stalled for {timeout} s",
                                  operation=operation) from e
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                attempt += 1
                last = errors.make("GATEWAY_UNAVAILABLE", f"connection to {self.url} dropped: {e}",
                                   operation=operation)
                last.__cause__ = e
                if unknown is None:
                    unknown = last
                if attempt > self.retries:
                    raise last
                self._pause(attempt, deadline, last)
                continue
            if resp.will_close:
                conn.close()
            else:
                self._give(conn)
            r = Response(resp.status, resp.headers, data)
            if r.status < 400:
                return r
            err = self.error_of(r, operation)
            retryable = (err.code in _RETRY_CODES or
                         (err.code == "INVALID_RESPONSE" and r.status in _PROXY_RETRY_STATUSES))
            if retryable and attempt < self.retries:
                # context ran: false (the gateway never delivered it to a
                # shard, docs/protocol.md "Retries"): nothing ran, so the
                # outcome is known and a later answer is the request's own.
                if (unknown is None and err.code in _UNKNOWN_CODES and
                        (err.context or {}).get("ran") is not False):
                    unknown = err
                attempt += 1
                retry_after = r.headers.get("Retry-After")
                if retry_after and retry_after.isdigit():
                    self._pause(attempt, deadline, err, min(float(retry_after), self.backoff_max))
                else:
                    self._pause(attempt, deadline, err)
                continue
            raise final(err)

    def _read_body(self, resp: http.client.HTTPResponse, sock: Optional[socket.socket],
                   deadline: Optional[float], operation: Optional[str]) -> bytes:
        """The whole body, each read bounded by the time left before
        ``deadline`` (so a body that trickles in cannot outlast it);
        socket.timeout when it passes."""
        if sock is None or deadline is None:
            return resp.read()
        parts = []
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("deadline passed while reading the body")
            sock.settimeout(left)
            b = resp.read1(65536)
            if not b:
                # read1() never marks a response with a Content-Length as
                # done (it reads 0 bytes once the length is reached and
                # keeps the response open), and http.client then refuses the
                # connection's next request with ResponseNotReady: close it
                # here, as read() does, so the kept-alive connection can be
                # used again.  Before, every request on a reused connection
                # failed that way after it had been sent, and was sent a
                # second time on a new connection (the fault test saw the
                # two copies run in either order).
                resp.close()
                return b"".join(parts)
            parts.append(b)

    @staticmethod
    def error_of(r: Response, operation: Optional[str]) -> errors.SandboxError:
        """The exception for an error response."""
        try:
            body = json.loads(r.body.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            body = None
        if isinstance(body, dict) and "code" in body:
            return errors.from_body(body, r.status, operation)
        text = r.body[:300].decode("utf-8", "replace").strip()
        return errors.SandboxError("INVALID_RESPONSE", f"HTTP {r.status}: {text}", r.status, {},
                                   operation)

    def call_json(self, method: str, path: str, args: Optional[Dict[str, Any]] = None,
                  timeout: Optional[float] = None, operation: Optional[str] = None) -> Any:
        """Send ``args`` as a JSON body, return the decoded JSON answer."""
        body = None if args is None else json.dumps(args, separators=(",", ":")).encode("utf-8")
        return self.send(method, path, body, timeout=timeout, operation=operation).json()
