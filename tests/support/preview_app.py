#!/usr/bin/python3
"""preview_app.py PORT — the web app the preview-URL tests run inside a sandbox.

Standard library only (it runs on the sandbox's python3):
  GET  /            an HTML page whose script opens a WebSocket to /ws on its
                    own origin, sends "ping-<random>", and writes the echo into
                    the page title and #echo (what the Chromium test reads); until
                    the echo it keeps a fetch of /stream pending, which holds
                    headless Chromium's virtual time (--virtual-time-budget)
  GET  /headers     the request's headers as JSON (proxy header checks)
  GET  /redirect    302 to /target (redirects must come back unfollowed)
  GET  /stream      a chunked body written in 5 parts, 200 ms apart
  POST /upload      the SHA-256 and length of the request body (streamed uploads)
  GET  /ws          a WebSocket (RFC 6455) that echoes every message
"""
import base64
import hashlib
import http.server
import json
import socketserver
import struct
import sys
import time

PAGE = b"""<!doctype html>
<html><head><title>loading</title></head>
<body><div id="echo">waiting</div>
<script>
const token = "ping-" + Math.random().toString(36).slice(2);
const ws = new WebSocket((location.protocol === "https:" ? "wss://" : "ws://") + location.host + "/ws");
ws.onopen = () => ws.send(token);
ws.onmessage = (e) => {
  const ok = e.data === token ? "echo-ok:" + e.data : "echo-bad:" + e.data;
  document.getElementById("echo").textContent = ok;
  document.title = ok;
};
ws.onerror = () => { document.title = "ws-error"; };
// Headless Chromium's --virtual-time-budget does not wait for WebSockets,
// but it pauses while a fetch is pending: keep one pending until the echo.
let done = false;
ws.addEventListener("message", () => { done = true; });
ws.addEventListener("error", () => { done = true; });
function hold() { if (!done) fetch("/stream").then((r) => r.text()).then(hold, hold); }
hold();
</script></body></html>
"""


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _send(self, code, body, ctype="text/plain", extra=()):
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in extra:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/ws" and self.headers.get("Upgrade", "").lower() == "websocket":
            return self._websocket()
        if self.path == "/":
            return self._send(200, PAGE, "text/html; charset=utf-8")
        if self.path.startswith("/headers"):
            body = json.dumps({k.lower(): v for k, v in self.headers.items()}).encode()
            return self._send(200, body, "application/json")
        if self.path == "/cookie":
            # Cookies for the whole preview domain (test_preview.c:
            # preview_cookies_are_host_only).
            return self._send(200, b"cookies\n", extra=[
                ("Set-Cookie", "a=1; Domain=localhost; Path=/"),
                ("Set-Cookie", "b=2;path=/;  domain = .localhost ;HttpOnly"),
                ("Set-Cookie", "c=3; SameSite=Lax; DOMAIN=x.localhost")])
        if self.path == "/redirect":
            return self._send(302, b"moved\n", extra=[("Location", "/target")])
        if self.path == "/stream":
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for i in range(5):
                part = ("part %d %.3f\n" % (i, time.time())).encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                self.wfile.flush()
                time.sleep(0.2)
            self.wfile.write(b"0\r\n\r\n")
            return
        return self._send(404, b"not found\n")

    def do_POST(self):
        if self.path != "/upload":
            return self._send(404, b"not found\n")
        h = hashlib.sha256()
        n = 0
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    break
                data = self.rfile.read(size)
                self.rfile.readline()
                h.update(data)
                n += len(data)
        else:
            left = int(self.headers.get("Content-Length", "0"))
            while left:
                data = self.rfile.read(min(left, 65536))
                if not data:
                    break
                h.update(data)
                n += len(data)
                left -= len(data)
        body = json.dumps({"sha256": h.hexdigest(), "bytes": n}).encode()
        return self._send(200, body, "application/json")

    def _websocket(self):
        key = self.headers["Sec-WebSocket-Key"]
        accept = base64.b64encode(hashlib.sha1(
            (key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11").encode()).digest()).decode()
        self.send_response(101)
        self.send_header("Upgrade", "websocket")
        self.send_header("Connection", "Upgrade")
        self.send_header("Sec-WebSocket-Accept", accept)
        self.end_headers()
        self.wfile.flush()
        r, w = self.rfile, self.wfile
        while True:
            hdr = r.read(2)
            if len(hdr) < 2:
                return
            op, n = hdr[0] & 15, hdr[1] & 127
            if n == 126:
                n = struct.unpack(">H", r.read(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", r.read(8))[0]
            mask = r.read(4) if hdr[1] & 128 else b"\0\0\0\0"
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                w.write(b"\x88\x00")
                w.flush()
                return
            if op in (1, 2):
                out = bytes([0x80 | op])
                out += bytes([len(data)]) if len(data) < 126 else (
                    b"\x7e" + struct.pack(">H", len(data)) if len(data) < 65536
                    else b"\x7f" + struct.pack(">Q", len(data)))
                w.write(out + data)
                w.flush()


class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


if __name__ == "__main__":
    Server(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
