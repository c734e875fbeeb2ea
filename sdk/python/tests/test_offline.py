"""Client behaviour that needs no daemon: retries, SSE parsing, errors."""

import io
import json
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sbx_sandbox import SbxClient, errors, get_sandbox, parse_sse


EXEC_OK = {"success": True, "exitCode": 0, "stdout": "ok\n", "stderr": "", "duration": 1,
           "timedOut": False}


def answer(handler: BaseHTTPRequestHandler, status: int, obj) -> None:
    """Send obj as a JSON response with a Content-Length (the connection
    can then be kept alive)."""
    body = json.dumps(obj).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


class FlakyFront(BaseHTTPRequestHandler):
    """Answers 503 SHARD_UNAVAILABLE `fail` times, then success."""

    fail = 2
    keys = []
    clients = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        type(self).keys.append(self.headers.get("Idempotency-Key"))
        type(self).clients.append(self.headers.get("X-Sbx-Client"))
        if len(type(self).keys) <= type(self).fail:
            answer(self, 503, {"code": "SHARD_UNAVAILABLE", "message": "shard down",
                               "context": {}, "httpStatus": 503})
        else:
            answer(self, 200, EXEC_OK)


@pytest.fixture
def flaky():
    FlakyFront.keys = []
    FlakyFront.clients = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), FlakyFront)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_retry_reuses_idempotency_key(flaky):
    c = SbxClient(f"http://127.0.0.1:{flaky.server_address[1]}", backoff=0.01)
    r = get_sandbox(c, "x").exec("echo ok")
    assert r.stdout == "ok\n"
    assert len(FlakyFront.keys) == 3 and len(set(FlakyFront.keys)) == 1
    assert len(FlakyFront.keys[0]) == 32
    # What the keyless server requires of mutating calls (docs/http.md).
    assert all(c and c.startswith("sbx-sandbox-python/") for c in FlakyFront.clients)


def test_retries_are_capped(flaky):
    FlakyFront.fail = 100
    try:
        c = SbxClient(f"http://127.0.0.1:{flaky.server_address[1]}", retries=2, backoff=0.01)
        with pytest.raises(errors.ShardUnavailable) as ei:
            get_sandbox(c, "x").exec("echo ok")
        assert isinstance(ei.value, errors.TransientError)
        assert len(FlakyFront.keys) == 3
    finally:
        FlakyFront.fail = 2


class UnknownThenRefused(BaseHTTPRequestHandler):
    """Answers 503 SHARD_UNAVAILABLE (the request may have run), then 409
    WRONG_OWNER (the retry did not run)."""

    calls = 0
    retry_marks: list = []

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        type(self).calls += 1
        type(self).retry_marks.append(self.headers.get("X-Sbx-Retry"))
        if type(self).calls == 1:
            code, status = "SHARD_UNAVAILABLE", 503
        else:
            code, status = "WRONG_OWNER", 409
        answer(self, status, {"code": code, "message": code.lower(), "context": {},
                              "httpStatus": status})


def test_a_retry_refused_after_an_unknown_attempt_stays_unknown():
    """Issue 11: the cluster fault test read back writes answered WRONG_OWNER
    — the retry's answer, while the first attempt had taken effect."""
    UnknownThenRefused.calls = 0
    UnknownThenRefused.retry_marks = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), UnknownThenRefused)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        c = SbxClient(f"http://127.0.0.1:{srv.server_address[1]}", backoff=0.01)
        with pytest.raises(errors.SandboxError) as ei:
            get_sandbox(c, "x").exec("echo ok")
        assert UnknownThenRefused.calls == 2
        # the retry says an earlier attempt may have run; the first does not
        assert UnknownThenRefused.retry_marks == [None, "1"]
        assert ei.value.code == "SHARD_UNAVAILABLE"
        assert "WRONG_OWNER" in str(ei.value)
    finally:
        srv.shutdown()
        srv.server_close()


class NotDeliveredThenMissing(BaseHTTPRequestHandler):
    """Answers 503 SHARD_UNAVAILABLE with context ran: false (the gateway
    delivered nothing: its shard was still connecting), then 404."""

    calls = 0
    retry_marks: list = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        type(self).calls += 1
        type(self).retry_marks.append(self.headers.get("X-Sbx-Retry"))
        if type(self).calls == 1:
            code, status, ctx = "SHARD_UNAVAILABLE", 503, {"ran": False}
        else:
            code, status, ctx = "SANDBOX_NOT_FOUND", 404, {}
        answer(self, status, {"code": code, "message": code.lower(), "context": ctx,
                              "httpStatus": status})

    do_POST = do_GET


def test_a_retry_after_an_undelivered_attempt_is_the_outcome():
    """A 503 with context ran: false ran nothing: the retry's answer is the
    request's own (a fresh-clone CI run got "outcome unknown" here)."""
    NotDeliveredThenMissing.calls = 0
    NotDeliveredThenMissing.retry_marks = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), NotDeliveredThenMissing)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    try:
        c = SbxClient(f"http://127.0.0.1:{srv.server_address[1]}", backoff=0.01)
        with pytest.raises(errors.SandboxError) as ei:
            get_sandbox(c, "x").status()
        assert NotDeliveredThenMissing.calls == 2
        assert NotDeliveredThenMissing.retry_marks == [None, None]
        assert ei.value.code == "SANDBOX_NOT_FOUND", str(ei.value)
    finally:
        srv.shutdown()
        srv.server_close()


class KeepAliveFront(BaseHTTPRequestHandler):
    """HTTP/1.1 with kept-alive connections, like the gateway: records each
    request (its connection by client port, key and retry mark); with ``drop_nth`` it reads
    that request and closes the connection without an answer, as a server
    that closes a kept-alive connection at the wrong moment does."""

    protocol_version = "HTTP/1.1"
    seen: list = []
    drop_nth = 0

    def log_message(self, *a):
        pass

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        self.rfile.read(n)
        cls = type(self)
        cls.seen.append((self.client_address[1], self.headers.get("Idempotency-Key"),
                         self.headers.get("X-Sbx-Retry")))
        if len(cls.seen) == cls.drop_nth:
            self.close_connection = True
            return
        if len(cls.seen) > cls.drop_nth > 0:
            answer(self, 409, {"code": "WRONG_OWNER", "message": "did not run", "context": {},
                               "httpStatus": 409})
        else:
            answer(self, 200, EXEC_OK)


@pytest.fixture
def keepalive():
    KeepAliveFront.seen = []
    KeepAliveFront.drop_nth = 0
    srv = ThreadingHTTPServer(("127.0.0.1", 0), KeepAliveFront)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def test_each_call_is_sent_once_on_a_kept_alive_connection(keepalive):
    """Issue 11: every request on a reused connection was sent twice — the
    body was read with read1(), which never closes the response, so the next
    request failed with ResponseNotReady after it had gone out and was sent
    again on a new connection.  The fault test saw the two copies of a write
    run in either order (the client told STORAGE_FULL while the other copy
    committed)."""
    c = SbxClient(f"http://127.0.0.1:{keepalive.server_address[1]}", backoff=0.01)
    sb = get_sandbox(c, "x")
    for _ in range(4):
        assert sb.exec("echo ok").stdout == "ok\n"
    seen = KeepAliveFront.seen
    assert len(seen) == 4, seen
    assert len({k for _, k, _ in seen}) == 4
    assert len({conn for conn, _, _ in seen}) == 1  # the connection was kept and reused


def test_a_request_lost_on_a_kept_alive_connection_is_resent_with_an_unknown_outcome(keepalive):
    """The server read the second request, then closed the kept-alive
    connection without an answer: the client sends it again on a new
    connection with the same key, marked as a retry, and a "did not run"
    answer to that copy is not the request's outcome (it may have run)."""
    KeepAliveFront.drop_nth = 2
    c = SbxClient(f"http://127.0.0.1:{keepalive.server_address[1]}", backoff=0.01)
    sb = get_sandbox(c, "x")
    assert sb.exec("echo ok").stdout == "ok\n"
    with pytest.raises(errors.SandboxError) as ei:
        sb.exec("echo ok")
    seen = KeepAliveFront.seen
    assert len(seen) == 3, seen
    assert seen[1][1] == seen[2][1]  # the same idempotency key
    assert seen[1][0] == seen[0][0] and seen[2][0] != seen[1][0]
    assert [r for _, _, r in seen] == [None, None, "1"]
    assert ei.value.code == "GATEWAY_UNAVAILABLE", str(ei.value)
    assert "WRONG_OWNER" in str(ei.value)


def test_parse_sse():
    raw = (b"retry: 1000\n\nid: 1\nevent: start\ndata: {\"seq\":1}\n\n: ping\n\n"
           b"id: 2\r\nevent: stdout\r\ndata: a\r\ndata: b\r\n\r\ndata: tail-without-blank\n")
    f = io.BytesIO(raw)
    evs = list(parse_sse(f.readline))
    assert evs == [("start", '{"seq":1}', "1"), ("stdout", "a\nb", "2")]


def test_error_mapping():
    e = errors.from_body({"code": "SESSION_ALREADY_EXISTS", "message": "m", "httpStatus": 409,
                          "context": {"sandboxId": "s"}, "operation": "session.create"})
    assert type(e) is errors.SessionAlreadyExists and isinstance(e, errors.SessionError)
    assert (e.code, e.http_status, e.operation, e.context) == (
        "SESSION_ALREADY_EXISTS", 409, "session.create", {"sandboxId": "s"})
    assert str(e) == "SESSION_ALREADY_EXISTS (session.create): m"
    u = errors.from_body({"code": "SOMETHING_NEW", "message": "x"}, 418)
    assert type(u) is errors.SandboxError and u.http_status == 418
    assert errors.error_class("PROCESS_ERROR") is errors.ProcessError
    assert errors.error_class("FILE_EXISTS").__mro__[1:3] == (errors.FilesystemError,
                                                              errors.SandboxError)
    p = pickle.loads(pickle.dumps(e))
    assert type(p) is errors.SessionAlreadyExists and p.context == e.context
