import json

import pytest

from sbx_sandbox import SbxClient, errors, get_sandbox
from sbx_sandbox._http import new_key

from conftest import new_id


def test_status_env_and_destroy(client):
    sb = get_sandbox(client, new_id("d"), sleep_after="5m")
    st = sb.status()
    assert st["id"] == sb.id and st["state"] in ("stopped", "starting", "running")
    sb.set_env_vars({"SBX_TEST_A": "1", "SBX_TEST_B": "2"})
    sb.set_env_vars({"SBX_TEST_B": None})
    r = sb.exec("echo ${SBX_TEST_A:-}-${SBX_TEST_B:-unset}")
    assert r.stdout == "1-unset\n"
    assert sb.status()["state"] == "running"
    assert sb.id in [s["id"] for s in client.list_sandboxes()]

    r = sb.destroy()
    assert r["success"] and r["destroyed"] is True
    assert sb.destroy()["destroyed"] is False  # idempotent
    with pytest.raises(errors.SandboxNotFound):
        sb.status()


def test_git_checkout(sandbox):
    sandbox.exec("rm -rf /tmp/origin /workspace/origin && mkdir -p /tmp/origin && cd /tmp/origin "
                 "&& git init -q -b main && echo hi > README && git add README "
                 "&& git -c user.email=a@b -c user.name=t commit -qm init", sessionless=True)
    r = sandbox.git_checkout("file:///tmp/origin", target_dir="/workspace/origin")
    assert r["success"] and r["branch"] == "main"
    assert sandbox.read_file("/workspace/origin/README") == "hi\n"
    with pytest.raises(errors.GitError):
        sandbox.git_checkout("file:///tmp/origin", branch="nope", target_dir="/workspace/o2")
    with pytest.raises(errors.InvalidGitUrl):
        sandbox.git_checkout("not a url")


def test_idempotency_key_replays(client, sandbox):
    """A retried request (same Idempotency-Key) is answered from the cache:
    the command runs once."""
    t = client._t
    path = t.path("v1", "sandboxes", sandbox.id, "exec")
    body = json.dumps({"command": "echo x >> /tmp/idem.log; wc -l < /tmp/idem.log",
                       "sessionless": True}).encode()
    key = new_key()
    a = t.send("POST", path, body, key=key).json()
    b = t.send("POST", path, body, key=key).json()
    assert a == b
    c = t.send("POST", path, body).json()  # a new key runs again
    assert int(c["stdout"]) == int(a["stdout"]) + 1


def test_errors_have_context(client):
    with pytest.raises(errors.ValidationFailed) as ei:
        get_sandbox(client, "Bad_ID").exec("true")
    assert ei.value.http_status == 400


def test_unreachable_server():
    c = SbxClient("http://127.0.0.1:1", retries=1, backoff=0.01)
    with pytest.raises(errors.GatewayUnavailable) as ei:
        c.health()
    assert isinstance(ei.value, ConnectionError)
