import time

import pytest

from sbx_sandbox import ExecResult, errors


def test_exit_codes(sandbox):
    r = sandbox.exec("echo hello; echo oops >&2")
    assert isinstance(r, ExecResult)
    assert r.success and r.exit_code == 0
    assert r.stdout == "hello\n" and r.stderr == "oops\n"
    assert r.session_id == "default" and r.duration >= 0

    r = sandbox.exec("sh -c 'exit 3'")
    assert not r.success and r.exit_code == 3

    r = sandbox.exec(["sh", "-c", "echo $0 $1; exit 7", "a b", "c"])
    assert r.exit_code == 7 and r.stdout == "a b c\n"

    r = sandbox.exec("exit 5", sessionless=True)
    assert r.exit_code == 5 and r.session_id is None


def test_exit_in_session_terminates_it(sandbox):
    s = sandbox.get_session("term-test")
    with pytest.raises(errors.SessionTerminated) as ei:
        s.exec("echo before; exit 9")
    e = ei.value
    assert e.http_status == 410 and e.code == "SESSION_TERMINATED"
    assert e.context["exitCode"] == 9 and e.context["stdout"] == "before\n"
    assert s.exec("echo again").stdout == "again\n"  # a fresh shell


def test_env(sandbox):
    assert sandbox.exec("echo $FOO", env={"FOO": "bar baz"}).stdout == "bar baz\n"
    assert sandbox.exec("echo ${FOO:-unset}").stdout == "unset\n"  # per call only
    r = sandbox.exec("sh -c 'echo $FOO'", env={"FOO": "child"}, sessionless=True)
    assert r.stdout == "child\n"


def test_env_in_session_reaches_children_and_later_commands(sandbox):
    r = sandbox.exec("pwd >/dev/null; echo $FOO; sh -c 'echo $FOO'", env={"FOO": "x"})
    assert r.stdout == "x\nx\n"


def test_cwd(sandbox):
    assert sandbox.exec("pwd", cwd="/tmp").stdout == "/tmp\n"
    assert sandbox.exec("pwd").stdout == "/workspace\n"  # per call only
    with pytest.raises(errors.ValidationFailed):
        sandbox.exec("pwd", cwd="/does/not/exist")


def test_timeout(sandbox):
    t0 = time.monotonic()
    r = sandbox.exec("echo started; sleep 20", timeout=500)
    assert time.monotonic() - t0 < 10
    assert r.exit_code == 124 and r.timed_out and not r.success
    assert r.stdout == "started\n"
    assert "timed out after 500ms" in r.stderr
    # the session survives the timeout
    assert sandbox.exec("echo ok").stdout == "ok\n"


def test_stdin(sandbox):
    assert sandbox.exec("tr a-z A-Z", stdin="shout\n").stdout == "SHOUT\n"
    assert sandbox.exec("wc -c", stdin=b"12345", sessionless=True).stdout.strip() == "5"


def test_exec_on_output(sandbox):
    seen = []
    r = sandbox.exec("echo a; echo b >&2; echo c", on_output=lambda s, d: seen.append((s, d)))
    assert r.exit_code == 0 and r.stdout == "a\nc\n" and r.stderr == "b\n"
    assert "".join(d for s, d in seen if s == "stdout") == "a\nc\n"


def test_exec_stream_ordered(sandbox):
    with sandbox.exec_stream("for i in 1 2 3; do echo line $i; sleep 0.05; done; "
                             "echo fin >&2") as st:
        events = list(st)
    assert st.stream_id
    types = [e["type"] for e in events]
    assert types[0] == "start" and types[-1] == "complete"
    seqs = [e["seq"] for e in events]
    assert seqs == sorted(seqs) == list(range(1, len(seqs) + 1))
    out = "".join(e["data"] for e in events if e["type"] == "stdout")
    assert out == "line 1\nline 2\nline 3\n"
    assert [e["data"] for e in events if e["type"] == "stderr"] == ["fin\n"]
    assert events[-1]["exitCode"] == 0 and events[-1]["success"] is True


def _drop_midway(sandbox, cmd, drop_after_seq):
    """Read a stream, kill its connection after event `drop_after_seq`, go on."""
    events = []
    with sandbox.exec_stream(cmd) as st:
        for ev in st:
            events.append(ev)
            if ev.get("seq") == drop_after_seq:
                st._drop()  # the connection dies; the iterator must resume by itself
                time.sleep(0.4)
    return events


CMD = "for i in 1 2 3 4 5 6; do echo line $i; sleep 0.2; done"


def test_exec_stream_resumes_after_drop(sandbox):
    events = _drop_midway(sandbox, CMD, 2)
    real = [e for e in events if "seq" in e]
    seqs = [e["seq"] for e in real]
    assert seqs == sorted(set(seqs)), "events repeated or out of order after the resume"
    assert real[-1]["type"] == "complete" and real[-1]["exitCode"] == 0
    # Whatever the server could not replay is reported as a gap, never silently lost.
    missing = set(range(1, seqs[-1] + 1)) - set(seqs)
    gaps = sum(e["missed"] for e in events if e["type"] == "gap")
    assert gaps == len(missing)


def test_exec_stream_resume_is_lossless(sandbox):
    events = _drop_midway(sandbox, CMD, 2)
    out = "".join(e.get("data", "") for e in events if e["type"] == "stdout")
    assert out == "".join(f"line {i}\n" for i in range(1, 7))


def test_exec_stream_resume_by_id(sandbox):
    st = sandbox.exec_stream("echo one; sleep 1; echo two")
    seen = []
    for ev in st:
        seen.append(ev)
        if ev["type"] == "stdout":
            break
    sid, last = st.stream_id, st.last_seq
    st.close()  # abandon this reader (e.g. the process crashed) ...
    again = sandbox.resume_stream(sid, after=last)  # ... and pick the stream up again
    rest = list(again)
    assert rest[0]["seq"] == last + 1
    assert rest[-1]["type"] == "complete"
    out = "".join(e["data"] for e in seen + rest if e["type"] == "stdout")
    assert out == "one\ntwo\n"


def test_exec_stream_cancel(sandbox):
    st = sandbox.exec_stream("echo go; sleep 30")
    for ev in st:
        if ev["type"] == "stdout":
            break
    st.cancel()
    # the session is usable at once: the command was killed
    assert sandbox.exec("echo after-cancel", timeout=10000).stdout == "after-cancel\n"
