#!/usr/bin/env python3
"""tests/fuzz/seeds.py — (re)generate the hand-written seed inputs of the
fuzz targets in tests/fuzz/corpus/<target>/seed-*.  Inputs saved from
failures (crash-*, regress-*) are kept as they are.  A tiny msgpack encoder
is included (python3-msgpack is not a dependency)."""
import os, struct, sys

def mp(o):
    if o is None: return b'\xc0'
    if o is True: return b'\xc3'
    if o is False: return b'\xc2'
    if isinstance(o, int):
        if 0 <= o < 128: return bytes([o])
        if -32 <= o < 0: return struct.pack('b', o)
        if 0 <= o < 2**32: return b'\xce' + struct.pack('>I', o)
        if 0 <= o: return b'\xcf' + struct.pack('>Q', o)
        return b'\xd3' + struct.pack('>q', o)
    if isinstance(o, float): return b'\xcb' + struct.pack('>d', o)
    if isinstance(o, str):
        b = o.encode('utf-8', 'surrogateescape')
        if len(b) < 32: return bytes([0xa0 | len(b)]) + b
        if len(b) < 256: return b'\xd9' + bytes([len(b)]) + b
        return b'\xda' + struct.pack('>H', len(b)) + b
    if isinstance(o, (bytes, bytearray)):
        if len(o) < 256: return b'\xc4' + bytes([len(o)]) + bytes(o)
        return b'\xc5' + struct.pack('>H', len(o)) + bytes(o)
    if isinstance(o, list):
        h = bytes([0x90 | len(o)]) if len(o) < 16 else b'\xdc' + struct.pack('>H', len(o))
        return h + b''.join(mp(x) for x in o)
    if isinstance(o, dict):
        h = bytes([0x80 | len(o)]) if len(o) < 16 else b'\xde' + struct.pack('>H', len(o))
        return h + b''.join(mp(k) + mp(v) for k, v in o.items())
    raise TypeError(o)

def frame(b): return struct.pack('>I', len(b)) + b

req = {"v": 1, "id": "5f0e-1", "op": "exec", "sandbox": "user-42", "timeoutMs": 30000,
       "args": {"command": "echo hi", "cwd": "/workspace", "env": {"A": "1"}, "timeout": 1000,
                "sessionId": "s1", "stdin": b"abc", "argv": ["ls", "-l"]}}
rep_ok = {"v": 1, "id": "5f0e-1", "ok": True,
          "result": {"success": True, "exitCode": 0, "stdout": b"hi\n", "stderr": b"",
                     "duration": 3, "cause": "EXITED", "nested": [1, -5, 2.5, None, {"k": [True]}]}}
rep_err = {"v": 1, "id": "x", "ok": False,
           "error": {"code": "VALIDATION_FAILED", "message": "bad", "context": {"sandboxId": "a", "n": 1}}}
wrapped = {"v": 1, "route": {"partition": 12, "epoch": 0, "gateway": "dev"}, "req": mp(req)}
record = {"id": "user-42", "createdAt": 1700000000000, "updatedAt": 1700000000001, "state": "running",
          "generation": 3, "restarts": 1, "limits": {"memory": 536870912, "pids": 512, "cpu": 1000},
          "env": {"A": "1", "PATH": "/bin"}, "config": {"sleepAfter": 600000, "keepAlive": True}}
cfg = {"hostname": "sandbox", "unshare_cgroupns": True, "rw_size": 1 << 30, "rw_inodes": 262144,
       "shm_size": 64 << 20, "nofile": 4096, "nproc": 1024, "output_cap": 32 << 20,
       "interp_dir": "/opt/x", "etc": ["ssl", "passwd"], "env": ["PATH=/bin", "HOME=/root"],
       "seccomp": [b"\x06\x00\x00\x00\x00\x00\xff\x7f"]}

seeds = {
  "fuzz_wire": {"req": mp(req), "rep-ok": mp(rep_ok), "rep-err": mp(rep_err), "wrapped": mp(wrapped),
                "liar-array32": b'\xdd\x04\x00\x00\x00', "liar-map32": b'\xdf\xff\xff\xff\xff',
                "deep": b'\x91' * 40 + b'\xc0', "ext": b'\x81\xa1a\xd4\x01\x02',
                "trailing": mp({"a": 1}) + b'\xc0', "c1": b'\xc1',
                "float32": b'\x81\xa1f\xca\x7f\xc0\x00\x00', "u64": b'\x81\xa1n\xcf' + b'\xff' * 8},
  "fuzz_frame": {"two": b'\x05' + bytes(range(1, 17)) + frame(mp(req)) + frame(b''),
                 "split": b'\x0c' + bytes([0] * 16) + frame(b'x' * 300) + frame(b'yz')[:3],
                 "oversize": b'\x04' + bytes([200] * 16) + frame(b'abc') + b'\xff\xff\xff\xff',
                 "big": b'\x0f' + bytes([255] * 16) + frame(b'q' * 70000)},
  "fuzz_json": {"mp-map": b'\x00' + mp(rep_ok), "mp-bin": b'\x00' + mp({"b": b'\xff\xfe\x00'}),
                "mp-nan": b'\x00' + mp({"x": float('nan')}), "mp-intkey": b'\x00' + b'\x81\x01\x02',
                "mp-nul-key": b'\x00' + mp({"std\x00r": "", "ok": True}),
                "json": b'\x01{"command":"echo hi","env":{"A":"\\u00e9"},"n":[1,2.5,true,null,-3]}',
                "json-deep": b'\x01' + b'[' * 30 + b']' * 30, "json-nul": b'\x01{"a\\u0000b":"c\\u0000"}',
                "json-big": b'\x01[18446744073709551615, 1e308, -9223372036854775808]',
                "utf8": b'\x02' + "héllo ✓ \U0001F600".encode() + b'\xed\xa0\x80\xc0\xaf\xf4\x90\x80\x80'},
  "fuzz_config": {"file": b"# comment\nname = shard-1\ncount=42\nmemory = 512M\n"
                          b"sleep-after = 10m\nverbose = yes\netc = ssl, passwd ,, hosts\n",
                  "argv": b"name=x\n\x00--\x00--memory\n1g\n--verbose\n--etc=a\npos\n--\n--name\n",
                  "bad": b"name\n", "unknown": b"nope = 1\n", "eq": b" = x\n=\n"},
  "fuzz_id": {"id": b'\x00user-42', "id-bad": b'\x00-a', "name": b'\x00' + b'\x05sess.1',
              "size": b'\x0164MiB', "size-big": b'\x0118446744073709551615', "size-ovf": b'\x0117179869184G',
              "dur": b'\x0230s', "dur-ms": b'\x02500ms', "dur-h": b'\x029223372036854775807h',
              "b64": b'\x03aGVsbG8=', "b64-bad": b'\x03a===', "err": b'\x04VALIDATION_FAILED',
              "err-unknown": b'\x04NOPE'},
  "fuzz_record": {"record": mp(record), "minimal": mp({"id": "a", "createdAt": 1}),
                  "bad-env": mp({"id": "a", "createdAt": 1, "env": [1, 2]}),
                  "long-state": mp({"id": "a", "createdAt": 1, "state": "x" * 40})},
  "fuzz_path": {"rel": mp({"path": "src/main.c", "content": b"int main(void){}\n",
                           "include": ["*.c"], "exclude": [".git", "node_modules"], "rel": "src/.git/x"}),
                "abs": mp({"path": "/workspace/a.png", "content": b"\x89PNG\r\n\x1a\n\x00\x00",
                           "rel": "a/b"}),
                "nul": mp({"path": "a\x00b"}), "long": mp({"path": "x" * 3900}),
                "utf8": mp({"path": "t.txt", "content": "é✓".encode() + b'\xe2\x9c'}),
                "session": mp({"path": "x", "sessionId": "s1"})},
  "fuzz_agent": {"env": b'\x00' + mp({"env": {"A": "2", "B": None, "C": "3"}}),
                 "env-nul": b'\x00' + mp({"env": {"HOME=/root\x00" + "x" * 40: "v"}}),
                 "env-eq": b'\x00' + mp({"env": {"B": "1", "B=C": "2"}}),
                 "exec": b'\x01' + mp(req["args"]), "exec-cmd": b'\x01' + mp({"command": "ls", "timeout": -1}),
                 "cfg": b'\x02' + mp(cfg),
                 "quote": b'\x03' + b"echo 'a\\b' \n\x01\xff$x",
                 "marker": b'\x04\x07' + b"out\x01SB\x01SBX0123456789abcdef\x02after",
                 "marker-partial": b'\x04\x03' + b"out\x01SBX0123456789abc",
                 "ctl": b'\x05' + b"abc\n0123456789abcdef 3 /tmp/x y\nzz",
                 "ctl-big": b'\x05' + b"\n0123456789abcdef\n0123456789abcdef 99999999999 /a\n"},
  "fuzz_http": {"dec": b'\x00\x00/v1/sandboxes/user-42/files/a%20b%2Fc%e2%9c%93',
                "dec-plus": b'\x00\x01a+b%3D%2b', "dec-at": b'\x00\x00x%@0y', "dec-cut": b'\x00\x00ab%2',
                "dec-nul": b'\x00\x00a%00b',
                "route-file": b'\x01\x00/v1/sandboxes/user-42/files/workspace//a%20b/../c.txt',
                "route-put": b'\x01\x02/v1/sandboxes/user-42/files/x.bin',
                "route-kill": b'\x01\x03/v1/sandboxes/user-42/processes/p-1',
                "route-port": b'\x01\x03/v1/sandboxes/user-42/ports/8080',
                "route-port-bad": b'\x01\x03/v1/sandboxes/user-42/ports/80x',
                "route-exec": b'\x01\x01/v1/sandboxes/user-42/%65xec', "route-health": b'\x01\x00/v1/health',
                "route-405": b'\x01\x02/v1/health',
                "route-stream": b'\x01\x00/v1/sandboxes/user-42/streams/s-1',
                "route-utf8": b'\x01\x03/v1/sandboxes/user-42/sessions/%ff',
                "route-long": b'\x01\x00/v1/sandboxes/x/files/' + b'%41' * 1500 + b'/tail',
                "route-long-plain": b'\x01\x02/v1/sandboxes/x/files/' + b'a' * 4300 + b'.bak',
                "route-deep": b'\x01\x00/v1/sandboxes/x/files' + b'/a' * 20,
                "query": b'\x02\x00session=a+b%21\ncols=80\naccess_token=k\nsession=second\n%zz=1\nflag\n=v\n',
                "key": b'\x03\x000123456789abcdef\nfedcba9876543210\n\nfedcba9876543210',
                "key-prefix": b'\x03\x000123456789abcdef\n\n0123456789abcde',
                "sse": b'\x04\x00' + mp([{"events": [{"seq": 1, "type": "stdout", "data": b"h\xc3"},
                                                    {"seq": 2, "type": "stdout", "data": b"\xa9llo \xff"},
                                                    {"seq": 3, "type": "stderr", "data": b"err\n\xe2\x9c"},
                                                    {"seq": 4, "type": "exit", "exitCode": 0}],
                                         "next": 4, "done": False},
                                        {"missed": 3, "events": [], "done": False},
                                        {"events": [{"seq": 5, "type": "output", "data": "\u2713"}],
                                         "done": True}]),
                "sse-b64": b'\x04\x01' + mp([{"events": [{"seq": 1, "type": "stdout", "data": b"\x00\xff"}]}]),
                "sse-type": b'\x04\x00' + mp([{"events": [{"seq": 1, "type": "x\nid: 9\r", "data": "d"},
                                                         {"seq": 2, "type": "std\u0000out", "data": b"z"}]}])},
  "fuzz_preview": {"host": b'\x00\x008080-user-42-abcdef0123456789.localhost:7780',
                   "host-domain": b'\x00\x018080-user-42-abcdef0123456789.localhost:7780',
                   "host-domain-port": b'\x00\x0208080-User-42-tok_1.SBX.example.com:443',
                   "host-port-big": b'\x00\x0070000-a-b.x', "host-bad-id": b'\x00\x008080-a_b-tok.x',
                   "host-dash-id": b'\x00\x008080--a-tok.x', "host-other-domain": b'\x00\x018080-user-42-tok.evil.com',
                   "url": b'\x01\x1f\x00\x05/index.html?a=b&c', "url-at": b'\x01\x1f\x00\x05@5.victim:8080/x',
                   "url-absolute": b'\x01\x1f\x00\x05http://evil/', "url-star": b'\x01\x1f\x00\x05*',
                   "url-slashes": b'\x01\x1f\x00\x05//evil.com/x', "url-long": b'\x01\x1f\x00\x05/' + b'a' * 9000,
                   "req": b'\x02\x00Host: 8080-a-t.localhost\nAccept: */*\nConnection: keep-alive, X-Hop\n'
                          b'X-Hop: 1\nX-Forwarded-For: 1.2.3.4\nX-Sbx-Internal: y\nCookie: a=b\nTE: trailers\n',
                   "req-ws": b'\x02\x01Upgrade: websocket\nConnection: Upgrade\n'
                             b'Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\nSec-WebSocket-Version: 13\n',
                   "req-tab": b'\x02\x00Connection: close,\tX-Tab\nX-Tab: 1\n',
                   "resp": b'\x03\x00HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Type: text/html\r\n'
                           b'Content-Length: 5\r\nConnection: keep-alive, X-Internal\r\nX-Internal: 1\r\n'
                           b'Set-Cookie: a=b\r\nTransfer-Encoding: chunked\r\n\r\n',
                   "resp-short-line": b'\x03\x00HTTP/1.1 200 OK\r\nA\nSet-Cookie: s=1\r\n\r\n',
                   "resp-cookie-domain": b'\x03\x00HTTP/1.1 200 OK\r\nSet-Cookie: a=1; Domain=x; path=/ '
                                         b';DOMAIN = y;HttpOnly\r\nset-cookie: b;domain\r\n\r\n',
                   "resp-status": b'\x03\x00HTTP/1.1 99999999999 X\r\n\r\nHTTP/1.1 2000\r\n\n',
                   "resp-long": b'\x03\x00HTTP/1.1 204\r\nX-Long: ' + b'v' * 9000 + b'\r\n\r\n',
                   "ws-101": b'\x04\x00HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n'
                             b'Connection: Upgrade\r\nSec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n\x81\x05hello',
                   "ws-refused": b'\x04\x00HTTP/1.1 403 Forbidden\r\nContent-Length: 3\r\n'
                                 b'Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5\r\n\r\nno!',
                   "ws-no-end": b'\x04\x00HTTP/1.1 200 OK\r\nX: y\r\n',
                   "ws-big": b'\x04\x00HTTP/1.1 101 x\r\nX-Big: ' + b'a' * 70000 + b'\r\n\r\n',
                   "ws-empty": b'\x04\x00\r\n\r\n'},
  "fuzz_terminal": {"args": b'\x00\x00session=main\ncols=80\nrows=24\n',
                    "args-id": b'\x00\x00sessionId=s%201\nshell=%2Fbin%2Fsh\nsession=second\n',
                    "args-long": b'\x00\x00session=' + b'a' * 200, "args-bad": b'\x00\x00session=a%zz\n',
                    "args-nul": b'\x00\x00session=%00\n', "args-empty": b'\x00\x00session=\n',
                    "args-dims": b'\x00\x00cols=80abc\nrows=0\n', "args-dims-big": b'\x00\x00cols=99999999999\n',
                    "args-shell-long": b'\x00\x00shell=' + b'%41' * 130,
                    "resize": b'\x01\x00{"type":"resize","cols":120,"rows":40}',
                    "resize-zero": b'\x01\x00{"type":"resize","cols":0,"rows":40}',
                    "resize-real": b'\x01\x00{"type":"resize","cols":80.0,"rows":24}',
                    "status": b'\x01\x00{"type":"status"}', "text": b'\x01\x00not json',
                    "keys": b'\x01\x01ls -la\r', "keys-fail": b'\x01\x05\x1b[A',
                    "resize-fail": b'\x01\x04{"type":"resize","cols":80,"rows":24}',
                    "fail-utf8-cut": b'\x01\x05' + "\u00e9".encode() * 200,
                    "ping": b'\x01\x06\xff\xfe ping'},
}

def socks(secret, password, dom, port=8080, cmd=1, atyp=3, user=b"sbx"):
    req = bytes([5, cmd, 0, atyp]) + (bytes([len(dom)]) + dom if atyp == 3 else dom) + struct.pack('>H', port)
    return (bytes([1 if secret else 0]) + b'\x05\x02\x00\x02' + b'\x01' + bytes([len(user)]) + user +
            bytes([len(password)]) + password + req)

KEY = b"s3cret-relay-key"
seeds["fuzz_relay"] = {
    "ok": socks(True, KEY, b"7.user-42"), "open": socks(False, b"-", b"12.a"),
    "wrong": socks(True, b"nope", b"7.user-42"), "nul-suffix": socks(True, KEY + b"\x00junk", b"7.user-42"),
    "empty-pw": socks(True, b"", b"7.user-42"), "no-method": b'\x01\x05\x01\x00',
    "bind": socks(True, KEY, b"7.user-42", cmd=2), "ipv4": socks(True, KEY, b"\x7f\x00\x00\x01", atyp=1),
    "gen-alpha": socks(True, KEY, b"x.user-42"), "bad-id": socks(True, KEY, b"7.User_42"),
    "no-id": socks(True, KEY, b"7."), "gen-sign": socks(True, KEY, b"-5.user-42"),
    "gen-space": socks(True, KEY, b" 5.user-42"), "id-nul": socks(True, KEY, b"7.user-42\x00zz"),
    "gen-big": socks(True, KEY, b"99999999999999999999999.user-42"), "port0": socks(True, KEY, b"7.user-42", port=0),
    "cut": socks(True, KEY, b"7.user-42")[:30], "ver4": b'\x00\x04\x01\x00\x1f\x90',
}

# fuzz_etcd: answers separated by 0x1e (a header byte: bit 0 transport failure, bits 1-2
# status 200/200/404/500), a watch's chunks by 0x1f.
import base64, json
def b64(x): return base64.b64encode(x if isinstance(x, bytes) else x.encode()).decode()
def kv(key, value=None, mod=5, **kw):
    d = {"key": b64(key), "mod_revision": str(mod), "create_revision": "3", "version": "1"}
    if value is not None: d["value"] = b64(value)
    d.update(kw)
    return d
def ans(body, hdr=0): return bytes([hdr]) + (body if isinstance(body, bytes) else json.dumps(body).encode())
def answers(*a): return b'\x1e'.join(a)
C = "/sbx/t/c/"
member = json.dumps({"url": "tcp://10.0.0.1:7701", "relay": "tcp:10.0.0.1:7702", "startedMs": 1})
rng = {"header": {"revision": "100"}, "count": "5",
       "kvs": [kv(C + "members/s1", member), kv(C + "members/s2", member), kv(C + "parts/0000", "s1", 7),
               kv(C + "parts/0001", "s2", 8), kv(C + "drain/s2", "1")]}
ev1 = {"result": {"header": {"revision": "102"}, "events": [
        {"kv": kv(C + "parts/0000", "s2", 102)}, {"type": "DELETE", "kv": kv(C + "members/s1", None, 102)},
        {"type": "DELETE", "kv": kv(C + "drain/s2", None, 102)}, {"kv": kv(C + "members/s3", "{}", 102)}]}}
w = (json.dumps({"result": {"header": {"revision": "101"}, "created": True}}) + "\n" + json.dumps(ev1)).encode()
odd = {"header": {"revision": "9"}, "kvs": [kv(C + "parts/+12", "s1"), kv(C + "parts/ 7", "s1"), kv(C + "parts/4096", "s1"),
       kv(C + "parts/-1", "s1"), kv(C + "members/", "{}"), kv(C + "parts/0002", "s\x00x"), kv(C + "parts/0003", "x" * 64),
       kv(C + "members/s1", "not json"), kv("/sbx/other/c/parts/0004", "s1"), {"key": "!!!"}, {"value": b64("v")}]}
full = {"header": {"revision": "3"}, "kvs": [kv(C + "members/m%02d" % i, "{}") for i in range(70)] +
        [kv(C + "parts/0005", "m69"), kv(C + "parts/0006", "m01")]}
seeds["fuzz_etcd"] = {
    "view": b'\x00\x00' + answers(ans(rng), ans(w[:40] + b'\x1f' + w[40:97] + b'\x1f' + w[97:])),
    "view-compacted": b'\x00\x00' + answers(ans(rng), ans({"result": {"canceled": True, "compact_revision": "50"}})),
    "view-odd": b'\x00\x00' + answers(ans(b"", 1), ans(odd), ans(b'{"result":{"events":[{"kv":{"key":"' + b64(C + "parts/0002").encode() + b'"}}]}}')),
    "view-full": b'\x00\x00' + answers(ans(full), ans({"result": {"events": [{"kv": kv(C + "parts/0007", "new", 4)}]}})),
    "calls": b'\x01\x00' + answers(ans({"header": {"revision": "12"}}), ans({"header": {}, "ID": "7587", "TTL": "10"}),
                                      ans({"result": {"ID": "7587", "TTL": "9"}}), ans({"header": {"revision": "13"}, "succeeded": True}),
                                      ans({"kvs": [kv("/sbx/t/r/0001/user-42", b"\x82\xa2id\xa1a"), {"key": "!!bad"}, kv("x"),
                                                   {"key": b64("y"), "value": "not base64!"}]}),
                                      ans({"deleted": "1"}), ans({})),
    "calls-failing": b'\x01\x00' + answers(ans(b"", 1), ans(b"", 1), ans({"ID": "0"}), ans({"ID": 5, "error": "lease"}),
                                              ans(b"{", 0), ans({"kvs": []}, 6), ans([1, 2]), ans(b'"str"'), ans({"ID": "-1"}, 4)),
    "watch": b'\x02\x00' + ans(w[:10] + b'\x1f' + w[10:120] + b'\x1f\x1f' + w[120:]),
    "watch-stop": b'\x02\x02' + ans(w),
    "watch-many": b'\x02\x00' + ans(b' \r\n'.join([json.dumps(ev1).encode()] * 4) + b'\x1f{"result":'),
    "watch-bad": b'\x02\x00' + ans(b'{"result":{"events":[{"kv":{"key":"@@"}},{"kv":5},{"type":"DELETE"}]}}}{"result":{}}'),
    "watch-404": b'\x02\x00' + ans({"error": "grpc: the client connection is closing", "code": 1}, 4),
}

root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
for target, files in seeds.items():
    d = os.path.join(root, target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(d, "seed-" + name), "wb") as f:
            f.write(data)
print("seeds written under", root, file=sys.stderr)
