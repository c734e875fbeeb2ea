import re

import pytest

from sbx_sandbox import Process, errors

SERVER = "cd /tmp && echo booting && exec python3 -u -m http.server {port}"


def test_process_lifecycle(sandbox):
    p = sandbox.start_process(SERVER.format(port=8765), process_id="web-a")
    try:
        assert isinstance(p, Process) and p.id == "web-a" and p.pid
        assert p.status == "running"

        m = p.wait_for_log("Serving HTTP", timeout=15000)
        assert "8765" in m.line
        m = p.wait_for_log(re.compile(r"port (\d+)"), timeout=15000)
        assert m.match[1] == "8765" and m.re_match.group(1) == "8765"

        ready = p.wait_for_port(8765, timeout=15000)
        assert ready.ready and ready.status_code == 200
        assert p.wait_for_port(8765, mode="tcp", timeout=5000).ready

        logs = p.get_logs()
        assert "booting" in logs["stdout"]
        assert p.get_status() == "running"
        assert "web-a" in [x.id for x in sandbox.list_processes()]
        assert sandbox.get_process("web-a").pid == p.pid

        with pytest.raises(errors.ResourceBusy):
            sandbox.start_process("sleep 1", process_id="web-a")
    finally:
        r = p.kill()
    assert r["status"] == "killed" and r["exitCode"] in (137, 143)
    assert p.get_status() == "killed"
    assert p.wait_for_exit(timeout=5000).exit_code in (137, 143)


def test_get_process_missing(sandbox):
    assert sandbox.get_process("no-such-process") is None
    with pytest.raises(errors.ProcessNotFound):
        sandbox.kill_process("no-such-process")


def test_exit_before_ready_and_logs_stream(sandbox):
    p = sandbox.start_process("echo one; echo two >&2; exit 3", process_id="quick")
    with pytest.raises(errors.ProcessExitedBeforeReady):
        p.wait_for_log("never printed", timeout=10000)
    with pytest.raises(errors.ProcessExitedBeforeReady):
        p.wait_for_log(re.compile("never"), timeout=10000)
    done = p.wait_for_exit(timeout=10000)
    assert done.exit_code == 3 and done.status == "failed"
    events = list(sandbox.stream_process_logs("quick"))
    assert events[0]["type"] == "process_info" and events[-1]["type"] == "exit"
    assert events[-1]["exitCode"] == 3
    assert "".join(e["data"] for e in events if e["type"] == "stdout") == "one\n"


def test_wait_for_log_timeout(sandbox):
    p = sandbox.start_process("sleep 30", process_id="silent")
    try:
        with pytest.raises(errors.ProcessReadyTimeout) as ei:
            p.wait_for_log("nothing", timeout=300)
        assert isinstance(ei.value, TimeoutError)
        with pytest.raises(errors.ProcessReadyTimeout):
            p.wait_for_log(re.compile("nothing"), timeout=300)
    finally:
        sandbox.kill_all_processes()
    assert p.get_status() == "killed"
