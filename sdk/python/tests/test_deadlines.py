"""Deadlines (issue 11): a request returns or raises by its timeout (+ 1 s of
slack) whatever the server does — never answering, a reply cut short, 503s
that would be retried past it, a server that went away, a stopped daemon.
The rule is documented on sbx_sandbox._http.Transport."""

import json
import os
import signal
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from sbx_sandbox import SbxClient, errors, get_sandbox

from conftest import Daemon

SLACK = 1.0


class Silent:
    """A loopback TCP server that accepts connections and never answers."""

    def __init__(self):
        self.lsock = socket.socket()
        self.lsock.bind(("127.0.0.1", 0))
        self.lsock.listen(16)
        self.url = "http://127.0.0.1:%d" % self.lsock.getsockname()[1]
        self.conns = []
        self.stop = False
        self.th = threading.Thread(target=self._accept, daemon=True)
        self.th.start()

    def _accept(self):
        self.lsock.settimeout(0.05)
        while not self.stop:
            try:
                c, _ = self.lsock.accept()
                self.conns.append(c)
            except OSError:
                pass

    def close(self):
        self.stop = True
        self.th.join()
        for c in self.conns:
            c.close()
        self.lsock.close()


@pytest.fixture
def silent():
    s = Silent()
    yield s
    s.close()


def serve(handler_cls):
    srv = ThreadingHTTPServer(("127.0.0.1", 0), handler_cls)
    srv.daemon_threads = True
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    return srv, "http://127.0.0.1:%d" % srv.server_address[1]


def timed(fn):
    t0 = time.monotonic()
    with pytest.raises(errors.SandboxError) as ei:
        fn()
    return ei.value, time.monotonic() - t0


def test_a_server_that_never_answers_is_a_request_timeout(silent):
    c = SbxClient(silent.url, timeout=1.0)
    err, took = timed(c.health)
    c.close()
    assert err.code == "REQUEST_TIMEOUT", err
    assert took < 1.0 + SLACK, f"raised after {took:.2f} s (deadline 1 s)"


class HalfBody(BaseHTTPRequestHandler):
    """Announces 100 bytes of body, sends 6, then holds the connection."""

    hold = threading.Event()

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"ok":')
        self.wfile.flush()
        self.hold.wait(10)


class Trickle(BaseHTTPRequestHandler):
    """Sends its body one byte every 0.3 s: each read is quick, the whole is not."""

    hold = threading.Event()

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        for _ in range(100):
            if self.hold.wait(0.3):
                return
            try:
                self.wfile.write(b" ")
                self.wfile.flush()
            except OSError:
                return


@pytest.mark.parametrize("handler", [HalfBody, Trickle], ids=["half", "trickle"])
def test_a_reply_cut_short_or_trickling_is_a_request_timeout(handler):
    handler.hold.clear()
    srv, url = serve(handler)
    try:
        c = SbxClient(url, timeout=1.0)
        err, took = timed(c.health)
        c.close()
        assert err.code == "REQUEST_TIMEOUT", err
        assert took < 1.0 + SLACK, f"raised after {took:.2f} s (deadline 1 s)"
    finally:
        handler.hold.set()
        srv.shutdown()
        srv.server_close()


class SlowUnavailable(BaseHTTPRequestHandler):
    """Answers 503 SHARD_UNAVAILABLE after 0.6 s, every time."""

    def log_message(self, *a):
        pass

    def do_GET(self):
        time.sleep(0.6)
        body = json.dumps({"code": "SHARD_UNAVAILABLE", "message": "shard s0 did not answer",
                           "context": {}, "httpStatus": 503}).encode()
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def test_503s_are_not_retried_past_the_deadline():
    srv, url = serve(SlowUnavailable)
    try:
        c = SbxClient(url, timeout=1.5, retries=5, backoff=0.05, backoff_max=0.1)
        err, took = timed(c.health)
        c.close()
        assert err.code in ("SHARD_UNAVAILABLE", "REQUEST_TIMEOUT"), err
        assert took < 1.5 + SLACK, f"raised after {took:.2f} s (deadline 1.5 s)"
    finally:
        srv.shutdown()
        srv.server_close()


def test_a_server_that_went_away_is_not_retried_past_the_deadline():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    url = "http://127.0.0.1:%d" % s.getsockname()[1]
    s.close()  # nothing listens there: every attempt is refused
    c = SbxClient(url, timeout=1.0, retries=10, backoff=0.3, backoff_max=3.0)
    err, took = timed(c.health)
    c.close()
    assert err.code in ("GATEWAY_UNAVAILABLE", "REQUEST_TIMEOUT"), err
    assert took < 1.0 + SLACK, f"raised after {took:.2f} s (deadline 1 s)"


def wait_stopped(pid, timeout=10.0):
    """Wait until every thread of pid is stopped: kill() returns before a
    running thread has taken its SIGSTOP."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        states = []
        for t in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{t}/stat") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass
        if states and all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    pytest.fail(f"process {pid} did not stop")


def test_a_stopped_daemon_is_a_request_timeout():
    if os.environ.get("SBX_TEST_URL"):
        pytest.skip("needs its own daemon")
    d = Daemon()
    stopped = False
    try:
        os.kill(d.proc.pid, signal.SIGSTOP)
        stopped = True
        wait_stopped(d.proc.pid)
        c = SbxClient(d.url, timeout=1.5)
        err, took = timed(c.health)
        c.close()
        assert err.code == "REQUEST_TIMEOUT", err
        assert took < 1.5 + SLACK, f"raised after {took:.2f} s (deadline 1.5 s)"
    finally:
        if stopped:
            os.kill(d.proc.pid, signal.SIGCONT)
        d.stop()


def test_a_stopped_shard_is_shard_unavailable():
    if os.environ.get("SBX_TEST_URL"):
        pytest.skip("needs its own daemon")
    d = Daemon()
    shard_pid = 0
    try:
        c = SbxClient(d.url, timeout=60)
        sid = f"py-{os.getpid()}-dlshard"
        c_short = SbxClient(d.url, timeout=2.0)
        sb = get_sandbox(c, sid)
        sb.exec("true")
        shard = sb.status()["shard"]
        for s in c.cluster_status()["shards"]:
            if s["name"] == shard:
                shard_pid = s["status"]["pid"]
        assert shard_pid > 0, f"no pid for shard {shard}"
        os.kill(shard_pid, signal.SIGSTOP)
        wait_stopped(shard_pid)
        err, took = timed(get_sandbox(c_short, sid).ping)
        assert err.code == "SHARD_UNAVAILABLE", err
        assert took < 2.0 + SLACK, f"raised after {took:.2f} s (deadline 2 s)"
        os.kill(shard_pid, signal.SIGCONT)
        shard_pid = 0
        sb.destroy()
        c.close()
        c_short.close()
    finally:
        if shard_pid:
            os.kill(shard_pid, signal.SIGCONT)
        d.stop()
