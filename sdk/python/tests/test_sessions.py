import pytest

from sbx_sandbox import ExecutionSession, errors


def test_session_state_persists(sandbox):
    s = sandbox.create_session(id="persist", env={"GREETING": "hi"})
    assert isinstance(s, ExecutionSession) and s.id == "persist"
    try:
        s.exec("mkdir -p /tmp/sess && cd /tmp/sess && export COUNT=41 && f() { echo fn$1; }")
        r = s.exec("echo $((COUNT+1)) $GREETING; pwd; f 7")
        assert r.stdout == "42 hi\n/tmp/sess\nfn7\n"
        assert r.session_id == "persist"
        info = s.info()
        assert info.id == "persist" and info.cwd == "/tmp/sess" and info.shell_running
        # relative paths resolve against the session's cwd
        s.write_file("rel.txt", "in session")
        assert sandbox.read_file("/tmp/sess/rel.txt") == "in session"
        assert s.list_files().names() == ["rel.txt"]
        # the default session is not affected
        r = sandbox.exec("pwd; echo ${COUNT:-none}; type f >/dev/null 2>&1 || echo nofn")
        assert r.stdout.split("\n")[1:] == ["none", "nofn", ""]
        assert r.stdout.split("\n")[0] != "/tmp/sess"
        assert "persist" in [x.id for x in sandbox.list_sessions()]
    finally:
        sandbox.delete_session("persist")
    with pytest.raises(errors.SessionNotFound):
        s.info()


def test_session_already_exists(sandbox):
    sandbox.create_session(id="dup")
    try:
        with pytest.raises(errors.SessionAlreadyExists) as ei:
            sandbox.create_session(id="dup")
        assert ei.value.http_status == 409 and isinstance(ei.value, errors.SessionError)
    finally:
        sandbox.delete_session("dup")


def test_get_session_creates_on_first_use(sandbox):
    s = sandbox.get_session("lazy")
    assert s.exec("cd /tmp && echo ok").stdout == "ok\n"
    assert s.exec("pwd").stdout == "/tmp\n"
    s.delete()


def test_default_session_cannot_be_deleted(sandbox):
    with pytest.raises(errors.ValidationFailed):
        sandbox.delete_session("default")
