"""Fixtures: a private sbx daemon for the whole test session.

The daemon binary comes from ``$SBX_BIN`` (a directory holding ``sbxd``, or
the ``sbxd`` file itself), default ``<repo>/bin``.  Set ``SBX_TEST_URL`` to
run against an already running front instead (nothing is started then).
``SBX_TEST_STATE`` names a file that receives ``<daemon pid> <data dir>``
(used by run-tests.sh to clean up after a killed run);
``SBX_TEST_KEEP_DATA=1`` keeps the data directory (daemon logs) afterwards.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import shutil
import signal
import string
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SDK = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(SDK))
sys.path.insert(0, SDK)

from sbx_sandbox import SbxClient, get_sandbox  # noqa: E402

_ids = itertools.count(1)


def _interrupt(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_sessionstart(session):
    # SIGTERM (a cancelled CI job) and the run's time limit become
    # KeyboardInterrupt: pytest then still runs the fixture teardown below,
    # which stops the daemon and removes its data.
    signal.signal(signal.SIGTERM, _interrupt)
    limit = int(os.environ.get("SBX_TEST_TIMEOUT") or 0)
    if limit > 0:
        signal.signal(signal.SIGALRM, _interrupt)
        signal.alarm(limit)


def new_id(tag: str = "t") -> str:
    """A sandbox ID unique to this run: ``py-<pid>-<tag><n>``."""
    return f"py-{os.getpid()}-{tag}{next(_ids)}"


def _sbxd() -> str:
    b = os.environ.get("SBX_BIN") or os.path.join(REPO, "bin")
    return os.path.join(b, "sbxd") if os.path.isdir(b) else b


class Daemon:
    """A private `sbxd dev` in a temp directory (stop() ends and removes it)."""

    def __init__(self, extra_args=(), api_key=None):
        if os.geteuid() != 0:
            pytest.fail("the sbx daemon needs root")
        sbxd = _sbxd()
        if not os.access(sbxd, os.X_OK):
            pytest.fail(f"no sbxd at {sbxd} (build with `make all` or set SBX_BIN)")
        # The test run's mark (tools/run-tests.sh; tools/leftovers.sh looks for it).
        mark = os.environ.get("SBX_TEST_PREFIX", "")
        if not re.fullmatch(r"[a-z0-9]{1,8}", mark):
            mark = ""
        self.data = data = tempfile.mkdtemp(prefix="sbx-py-" + mark, dir="/tmp")
        args = list(extra_args)
        if api_key:
            with open(os.path.join(data, "keys"), "w") as f:
                f.write(api_key + "\n")
            args += ["--api-keys", os.path.join(data, "keys")]
        name = "py" + mark + "".join(random.choice(string.ascii_lowercase) for _ in range(8))
        self.log = open(os.path.join(data, "sbxd.log"), "wb")
        self.proc = subprocess.Popen(
            [sbxd, "dev", "--data", data, "--listen", f"ipc://{data}/gw.sock", "--name", name,
             "--http", "127.0.0.1:0", "--pool", "1", *args],
            stdout=self.log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            start_new_session=True)
        state = os.environ.get("SBX_TEST_STATE")
        if state:  # lets run-tests.sh clean up even if pytest itself is killed
            with open(state, "a") as f:
                f.write(f"{self.proc.pid} {data}\n")
        try:
            self.url = self._wait_ready(api_key)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, api_key):
        addr_file = os.path.join(self.data, "http.addr")
        deadline = time.monotonic() + 20
        addr = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            try:
                with open(addr_file) as f:
                    addr = f.read().strip()
            except FileNotFoundError:
                pass
            if addr:
                break
            time.sleep(0.05)
        if not addr:
            with open(os.path.join(self.data, "sbxd.log"), "rb") as f:
                tail = f.read()[-2000:].decode("utf-8", "replace")
            pytest.fail(f"sbxd did not start (exit {self.proc.poll()}):\n{tail}")
        url = f"http://{addr}"
        c = SbxClient(url, api_key=api_key)
        while time.monotonic() < deadline:
            try:
                if c.health().get("ok"):
                    break
            except Exception:
                time.sleep(0.05)
        c.close()
        return url

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the group this fixture created
                self.proc.wait(timeout=10)
        self.log.close()
        if os.environ.get("SBX_TEST_KEEP_DATA"):
            print(f"daemon data kept in {self.data}", file=sys.stderr)
        else:
            shutil.rmtree(self.data, ignore_errors=True)


@pytest.fixture(scope="session")
def daemon_url():
    url = os.environ.get("SBX_TEST_URL")
    if url:
        yield url
        return
    d = Daemon()
    try:
        yield d.url
    finally:
        d.stop()


@pytest.fixture(scope="session")
def client(daemon_url):
    c = SbxClient(daemon_url)
    yield c
    c.close()


@pytest.fixture(scope="session")
def sandbox(client):
    """One sandbox shared by most tests (containers are the slow part)."""
    sb = get_sandbox(client, new_id("s"), keep_alive=True)
    yield sb
    sb.destroy()


@pytest.fixture
def fresh_sandbox(client):
    """A sandbox of its own, destroyed afterwards."""
    sb = get_sandbox(client, new_id("f"))
    yield sb
    sb.destroy()
