import http.client
from urllib.parse import urlsplit

import pytest

from sbx_sandbox import ExposedPort, errors


def fetch(url, path="/"):
    """GET a preview URL: connect to the front, preview host in `Host`
    (`*.localhost` does not resolve through glibc here)."""
    u = urlsplit(url)
    conn = http.client.HTTPConnection("127.0.0.1", u.port or 80, timeout=20)
    try:
        conn.request("GET", path, headers={"Host": u.netloc})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def test_expose_and_fetch(sandbox):
    sandbox.write_file("/tmp/site/hello.txt", "hello from the sandbox\n")
    p = sandbox.start_process("cd /tmp/site && exec python3 -m http.server 8080",
                              process_id="site")
    try:
        p.wait_for_port(8080, timeout=15000)
        ep = sandbox.expose_port(8080, name="site")
        assert isinstance(ep, ExposedPort) and ep.port == 8080 and ep.token
        assert ep.url.startswith(f"http://8080-{sandbox.id}-{ep.token}.")
        status, body = fetch(ep.url, "/hello.txt")
        assert status == 200 and body == b"hello from the sandbox\n"

        again = sandbox.expose_port(8080)
        assert again.url == ep.url  # re-exposing keeps the token
        assert [x.url for x in sandbox.get_exposed_ports()] == [ep.url]

        # a wrong token is refused
        u = urlsplit(ep.url)
        bad = ep.url.replace(ep.token, "wrongtoken000000")
        assert fetch(bad)[0] == 404
        assert u.netloc in ep.host

        r = sandbox.unexpose_port(8080)
        assert r["success"]
        assert fetch(ep.url)[0] == 404
        assert sandbox.get_exposed_ports() == []
    finally:
        p.kill()


def test_invalid_port(sandbox):
    with pytest.raises(errors.InvalidPortNumber):
        sandbox.expose_port(80)
