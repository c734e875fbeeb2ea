from sbx_sandbox import Terminal


def test_terminal_echo_and_exit(sandbox):
    sandbox.create_session(id="tty")
    try:
        with sandbox.terminal(session_id="tty", cols=100, rows=30) as t:
            assert isinstance(t, Terminal) and t.session_id == "tty"
            t.write("echo $((6*7))\r")
            out = t.expect("42\r\n", timeout=15)
            assert "42" in out
            t.resize(120, 40)
            t.write("stty size\r")
            assert "40 120" in t.expect("40 120", timeout=10)
            t.write("exit 3\r")
            assert t.wait(timeout=15) == 3
            assert t.exit_code == 3
    finally:
        sandbox.delete_session("tty")


def test_terminal_reconnect_sees_backlog(sandbox):
    with sandbox.terminal() as t:  # the default session's terminal
        t.write("echo marker-$((1+1))\r")
        t.expect("marker-2", timeout=15)
    with sandbox.terminal() as t2:  # same terminal, replayed output first
        assert b"marker-2" in t2.backlog
        t2.write("exit\r")
        assert t2.wait(timeout=15) == 0


def test_terminal_needs_websocket(client, sandbox):
    import http.client
    from urllib.parse import urlsplit
    u = urlsplit(client.url)
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=10)
    c.request("GET", f"/v1/sandboxes/{sandbox.id}/terminal")
    assert c.getresponse().status == 426
    c.close()
