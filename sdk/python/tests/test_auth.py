"""API keys: a second daemon with --api-keys."""

import pytest

from sbx_sandbox import SbxClient, errors, get_sandbox

from conftest import Daemon, new_id

KEY = "sbx-py-test-key-0123456789"


@pytest.fixture(scope="module")
def keyed_url():
    import os
    if os.environ.get("SBX_TEST_URL"):
        pytest.skip("needs its own daemon")
    d = Daemon(api_key=KEY)
    try:
        yield d.url
    finally:
        d.stop()


def test_api_key(keyed_url):
    sid = new_id("k")
    with pytest.raises(errors.Unauthorized) as ei:
        get_sandbox(SbxClient(keyed_url), sid).exec("true")
    assert ei.value.http_status == 401 and isinstance(ei.value, PermissionError)
    with pytest.raises(errors.Unauthorized):
        get_sandbox(SbxClient(keyed_url, api_key="wrong-key-0123456789"), sid).terminal()

    sb = get_sandbox(SbxClient(keyed_url, api_key=KEY), sid)
    try:
        assert sb.exec("echo ok").stdout == "ok\n"
        assert [e["type"] for e in sb.exec_stream("echo s")][-1] == "complete"
        with sb.terminal() as t:
            t.write("echo $((6*7))\r")
            t.expect("42", timeout=15)
    finally:
        sb.destroy()


def test_keyless_mutating_calls_need_x_sbx_client(daemon_url, client):
    """Without API keys the server refuses a POST lacking X-Sbx-Client (a web
    page cannot send that header cross-origin); the SDK sends it."""
    import json
    import urllib.error
    import urllib.request
    sid = new_id("hdr")
    req = urllib.request.Request(f"{daemon_url}/v1/sandboxes/{sid}/exec", method="POST",
                                 data=b'{"command":"true"}')
    with pytest.raises(urllib.error.HTTPError) as ei:
        urllib.request.build_opener(urllib.request.ProxyHandler({})).open(req, timeout=60)
    assert ei.value.code == 403
    assert json.loads(ei.value.read())["code"] == "PERMISSION_DENIED"
    sb = get_sandbox(client, sid)
    try:
        assert sb.exec("echo ok").stdout == "ok\n"
    finally:
        sb.destroy()
