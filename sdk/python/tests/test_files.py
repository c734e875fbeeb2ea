import time

import pytest

from sbx_sandbox import FileInfo, errors

BINARY = bytes(range(256)) * 64 + b"\x00\xff\xfe tail"


def test_text_round_trip(sandbox):
    text = "héllo wörld ✓\nline 2\n"
    r = sandbox.write_file("/workspace/files/a.txt", text)
    assert r["success"] and r["path"] == "/workspace/files/a.txt"
    assert r["bytesWritten"] == len(text.encode())
    assert sandbox.read_file("/workspace/files/a.txt") == text
    info = sandbox.read_file_info("/workspace/files/a.txt")
    assert info.mime_type == "text/plain" and not info.is_binary
    assert info.size == len(text.encode())
    # relative paths resolve against the session's cwd (/workspace)
    assert sandbox.read_file("files/a.txt") == text


def test_binary_round_trip(sandbox):
    sandbox.write_file("/workspace/files/b.bin", BINARY)  # raw PUT
    got = sandbox.read_file("/workspace/files/b.bin")
    assert isinstance(got, bytes) and got == BINARY
    sandbox.write_file("files/c.bin", BINARY)  # relative: base64 JSON
    assert sandbox.read_file("/workspace/files/c.bin") == BINARY
    assert sandbox.read_file_bytes("files/c.bin") == BINARY
    # odd characters survive the raw routes' percent-encoding
    odd = "/workspace/files/sp ace/ü#?%20x.bin"
    sandbox.write_file(odd, BINARY)
    assert sandbox.list_files("/workspace/files/sp ace").names() == ["ü#?%20x.bin"]
    assert sandbox.read_file_stream(odd).read() == BINARY
    # forcing an encoding
    sandbox.write_file("/workspace/files/t2.txt", "abc")
    assert sandbox.read_file("/workspace/files/t2.txt", encoding="base64") == b"abc"
    # base64 text written as such
    sandbox.write_file("/workspace/files/d.bin", "AAEC/w==", encoding="base64")
    assert sandbox.read_file("/workspace/files/d.bin") == b"\x00\x01\x02\xff"


def test_read_file_stream(sandbox):
    big_text = "".join(f"line {i:06d} ✓\n" for i in range(20000))  # ~300 KB, several chunks
    sandbox.write_file("/workspace/files/big.txt", big_text)
    with sandbox.read_file_stream("/workspace/files/big.txt") as fs:
        assert fs.metadata["size"] == len(big_text.encode())
        chunks = list(fs)
    assert len(chunks) > 1
    assert b"".join(chunks).decode() == big_text

    sandbox.write_file("/workspace/files/s.bin", BINARY)
    fs = sandbox.read_file_stream("/workspace/files/s.bin")
    assert fs.metadata["isBinary"] is True
    assert fs.read() == BINARY


def test_list_exists_mkdir_rename_move_delete(sandbox):
    base = "/workspace/tree"
    sandbox.mkdir(f"{base}/x/y", recursive=True)
    sandbox.write_file(f"{base}/one.txt", "1")
    sandbox.write_file(f"{base}/.hidden", "h")
    sandbox.write_file(f"{base}/x/y/deep.txt", "d")

    lst = sandbox.list_files(base)
    assert sorted(lst.names()) == ["one.txt", "x"]
    assert lst.count == 2 and len(lst) == 2
    one = next(f for f in lst if f.name == "one.txt")
    assert isinstance(one, FileInfo) and one.is_file and one.size == 1
    assert one.absolute_path == f"{base}/one.txt" and one.mode == "rw-r--r--"
    assert next(f for f in lst if f.name == "x").is_directory
    assert ".hidden" in sandbox.list_files(base, include_hidden=True).names()
    rec = {f.relative_path for f in sandbox.list_files(base, recursive=True)}
    assert {"x/y", "x/y/deep.txt"} <= rec

    assert sandbox.exists(f"{base}/one.txt") and not sandbox.exists(f"{base}/nope")

    sandbox.rename_file(f"{base}/one.txt", f"{base}/two.txt")
    assert not sandbox.exists(f"{base}/one.txt") and sandbox.exists(f"{base}/two.txt")
    r = sandbox.move_file(f"{base}/two.txt", f"{base}/x")
    assert r["newPath"] == f"{base}/x/two.txt"
    sandbox.delete_file(f"{base}/x/two.txt")
    assert not sandbox.exists(f"{base}/x/two.txt")

    with pytest.raises(errors.IsDirectory):
        sandbox.delete_file(f"{base}/x")
    with pytest.raises(errors.NotDirectory):
        sandbox.list_files(f"{base}/x/y/deep.txt")
    with pytest.raises(errors.FileNotFound):
        sandbox.mkdir(f"{base}/no/parent")


def test_not_found_error_class(sandbox):
    with pytest.raises(errors.FileNotFound) as ei:
        sandbox.read_file("/workspace/definitely/missing.txt")
    e = ei.value
    assert isinstance(e, errors.FilesystemError) and isinstance(e, errors.SandboxError)
    assert isinstance(e, FileNotFoundError)  # the built-in, too
    assert e.code == "FILE_NOT_FOUND" and e.http_status == 404
    assert e.operation == "file.read"
    assert e.context["path"] == "/workspace/definitely/missing.txt"
    with pytest.raises(FileNotFoundError):
        sandbox.delete_file("/workspace/definitely/missing.txt")
    with pytest.raises(errors.FileNotFound):
        sandbox.read_file_stream("/workspace/definitely/missing.txt")


def test_watch(sandbox):
    d = "/workspace/watched"
    sandbox.mkdir(d, recursive=True)
    st = sandbox.watch(d)
    try:
        sandbox.write_file(f"{d}/new.txt", "x")
        created = None
        deadline = time.monotonic() + 10
        for ev in st:
            if ev["type"] == "event" and ev["path"] == f"{d}/new.txt":
                created = ev
                break
            assert time.monotonic() < deadline
        assert created["eventType"] in ("create", "modify")
    finally:
        st.cancel()


def test_read_file_stream_large_path(sandbox, monkeypatch):
    """Files over the raw route's limit are read through exec in chunks
    (limits shrunk here so the test stays small)."""
    from sbx_sandbox import FileStream
    monkeypatch.setattr(FileStream, "RAW_LIMIT", 100_000)
    monkeypatch.setattr(FileStream, "EXEC_CHUNK", 64 << 10)
    r = sandbox.exec("head -c 150000 /dev/urandom > /workspace/files/l.bin && "
                     "yes 'ünïcødé ✓' | head -c 150001 > /workspace/files/l.txt && "
                     "sha256sum /workspace/files/l.bin /workspace/files/l.txt", sessionless=True)
    import hashlib
    want = [line.split()[0] for line in r.stdout.splitlines()]
    for name, digest in zip(("l.bin", "l.txt"), want):
        fs = sandbox.read_file_stream(f"/workspace/files/{name}")
        assert fs.metadata["size"] in (150000, 150001)
        h = hashlib.sha256()
        n = 0
        for chunk in fs:
            h.update(chunk)
            n += 1
        assert n >= 3 and fs.bytes_read == fs.metadata["size"]
        assert h.hexdigest() == digest
