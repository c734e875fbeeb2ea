// The SDK's protocol code against scripted fake servers (no daemon): SSE
// resume with Last-Event-ID, duplicate suppression and gap events; the
// WebSocket client's framing (masking, fragmentation, ping/pong, lengths,
// close handshake).
import assert from 'node:assert/strict';
import { createHash } from 'node:crypto';
import http from 'node:http';
import { describe, it } from 'node:test';

import { getSandbox, SbxClient, SSEParser, StreamNotFoundError, WebSocketClient } from '../dist/index.js';

function listen(server) {
  return new Promise((r) => server.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${server.address().port}`)));
}

const sse = (seq, type, extra = {}) =>
  `id: ${seq}\nevent: ${type}\ndata: ${JSON.stringify({ seq, type, timestamp: 0, ...extra })}\n\n`;

describe('SSE parsing', () => {
  it('handles CRLF, CR, split chunks, multi-line data, comments and retry', () => {
    const p = new SSEParser();
    const msgs = [
      ...p.feed('retry: 500\r\n: ping\r\nid: 1\r\nevent: a\r\ndata: x\r'),
      ...p.feed('\ndata: y\r\n\r\nid'),
      ...p.feed(': 2\ndata: {"k":1}\n\n\n'),
      ...p.feed('data: no id\rid: 3\r\r'),
    ];
    assert.deepEqual(msgs, [
      { id: '1', event: 'a', data: 'x\ny', retry: 500 },
      { id: '2', event: 'message', data: '{"k":1}' },
      { id: '3', event: 'message', data: 'no id' },
    ]);
  });
});

describe('stream resume (scripted server)', () => {
  it('reconnects with Last-Event-ID, drops duplicates and reports gaps', async () => {
    const requests = [];
    const server = http.createServer((req, res) => {
      requests.push({ method: req.method, url: req.url, lastEventId: req.headers['last-event-id'], accept: req.headers.accept });
      req.resume();
      const n = requests.length;
      if (n === 1) {
        // The exec.stream POST: three events, then the connection breaks.
        res.writeHead(200, { 'content-type': 'text/event-stream', 'x-sbx-stream-id': 'exec-9' });
        res.write('retry: 10\n\n' + sse(1, 'start', { command: 'x' }) + sse(2, 'stdout', { data: 'a\n' }) + sse(3, 'stdout', { data: 'b\n' }));
        setTimeout(() => res.socket.destroy(), 50);
      } else if (n === 2) {
        // Resume: replays 3 (a duplicate), then 4; breaks again.
        res.writeHead(200, { 'content-type': 'text/event-stream', 'x-sbx-stream-id': 'exec-9' });
        res.write(sse(3, 'stdout', { data: 'b\n' }) + sse(4, 'stdout', { data: 'c\n' }));
        setTimeout(() => res.socket.destroy(), 50);
      } else if (n === 3) {
        // Resume after 4: events 5 and 6 were lost; 7 is the end.
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(sse(7, 'complete', { exitCode: 0, success: true }));
      } else if (req.headers['last-event-id'] === '2') {
        // A resumeStream(…, 2) whose first events were lost.
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(sse(5, 'stdout', { data: 'e\n' }) + sse(6, 'complete', { exitCode: 0, success: true }));
      } else {
        res.writeHead(404, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ code: 'STREAM_NOT_FOUND', message: 'gone', context: {}, httpStatus: 404 }));
      }
    });
    const url = await listen(server);
    const client = new SbxClient({ url, retry: { retries: 3, minDelayMs: 5, maxDelayMs: 20 } });
    try {
      const sb = getSandbox(client, 'fake');
      const stream = await sb.execStream('x');
      const events = await stream.toArray();
      assert.deepEqual(
        events.map((e) => (e.type === 'gap' ? `gap:${e.missed}` : `${e.seq}:${e.type}`)),
        ['1:start', '2:stdout', '3:stdout', '4:stdout', 'gap:2', '7:complete'],
      );
      assert.equal(stream.reconnects, 2);
      assert.equal(stream.lastEventId, 7);
      assert.deepEqual(
        requests.map((r) => [r.method, r.url, r.lastEventId]),
        [
          ['POST', '/v1/sandboxes/fake/exec.stream', undefined],
          ['GET', '/v1/sandboxes/fake/streams/exec-9', '3'],
          ['GET', '/v1/sandboxes/fake/streams/exec-9', '4'],
        ],
      );
      assert.equal(requests[0].accept, 'text/event-stream');
      // resumeStream continues after the given event, and reports what it cannot replay.
      const resumed = await (await sb.resumeStream('exec-9', 2)).toArray();
      assert.deepEqual(resumed.map((e) => (e.type === 'gap' ? `gap:${e.missed}` : `${e.seq}:${e.type}`)), ['gap:2', '5:stdout', '6:complete']);
      // A stream that is gone is an error, not an endless retry.
      await assert.rejects(sb.resumeStream('exec-9', 7), StreamNotFoundError);
    } finally {
      client.close();
      server.close();
    }
  });
});

/** A scripted WebSocket server: `script(socket, frames)` after the handshake. */
async function wsServer(script) {
  const server = http.createServer((req, res) => {
    res.writeHead(426);
    res.end();
  });
  server.on('upgrade', (req, socket) => {
    const accept = createHash('sha1').update(req.headers['sec-websocket-key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
    socket.write(`HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
    const frames = [];
    let buf = Buffer.alloc(0);
    const waiters = [];
    socket.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      for (;;) {
        if (buf.length < 2) break;
        let len = buf[1] & 0x7f;
        let off = 2;
        if (len === 126) (len = buf.readUInt16BE(2)), (off = 4);
        else if (len === 127) (len = Number(buf.readBigUInt64BE(2))), (off = 10);
        const masked = (buf[1] & 0x80) !== 0;
        const need = off + (masked ? 4 : 0) + len;
        if (buf.length < need) break;
        const mask = masked ? buf.subarray(off, off + 4) : null;
        const payload = Buffer.from(buf.subarray(off + (masked ? 4 : 0), need));
        if (mask) for (let i = 0; i < payload.length; i++) payload[i] ^= mask[i & 3];
        frames.push({ fin: (buf[0] & 0x80) !== 0, opcode: buf[0] & 0x0f, masked, payload });
        buf = buf.subarray(need);
        waiters.splice(0).forEach((w) => w());
      }
    });
    const nextFrame = async (i) => {
      while (frames.length <= i) await new Promise((r) => waiters.push(r));
      return frames[i];
    };
    script(socket, nextFrame);
  });
  return { url: await listen(server), close: () => server.close() };
}

/** An unmasked server frame. */
function frame(opcode, payload, fin = true) {
  const p = Buffer.from(payload);
  let h;
  if (p.length < 126) h = Buffer.from([(fin ? 0x80 : 0) | opcode, p.length]);
  else if (p.length < 65536) {
    h = Buffer.alloc(4);
    h[0] = (fin ? 0x80 : 0) | opcode;
    h[1] = 126;
    h.writeUInt16BE(p.length, 2);
  } else {
    h = Buffer.alloc(10);
    h[0] = (fin ? 0x80 : 0) | opcode;
    h[1] = 127;
    h.writeBigUInt64BE(BigInt(p.length), 2);
  }
  return Buffer.concat([h, p]);
}

describe('WebSocket client (scripted server)', () => {
  it('masks its frames, reassembles fragments, answers pings and closes cleanly', async () => {
    const big = Buffer.alloc(70_000, 7);
    const mid = Buffer.alloc(300, 3);
    let serverSaw;
    const srv = await wsServer(async (socket, nextFrame) => {
      // Fragmented text, a ping between the fragments, 16- and 64-bit lengths.
      socket.write(Buffer.concat([frame(1, 'hel', false), frame(9, 'p1'), frame(0, 'lo', false), frame(0, '!', true)]));
      socket.write(Buffer.concat([frame(2, mid), frame(2, big)]));
      const pong = await nextFrame(0);
      const text = await nextFrame(1);
      const bin = await nextFrame(2);
      const close = await nextFrame(3);
      serverSaw = { pong, text, bin, close };
      socket.end(frame(8, Buffer.from([0x03, 0xe8])));
    });
    try {
      const ws = await WebSocketClient.connect(new URL(srv.url + '/x'));
      const messages = [];
      ws.on('message', (data, isBinary) => messages.push({ data, isBinary }));
      while (messages.length < 3) await new Promise((r) => setTimeout(r, 10));
      assert.deepEqual(messages[0], { data: Buffer.from('hello!'), isBinary: false });
      assert.deepEqual(messages[1].data, mid);
      assert.equal(messages[1].isBinary, true);
      assert.deepEqual(messages[2].data, big);
      ws.sendText('{"type":"resize","cols":1,"rows":2}');
      ws.sendBinary(Buffer.alloc(200, 1));
      const closed = new Promise((r) => ws.once('close', (code) => r(code)));
      ws.close(1000);
      assert.equal(await closed, 1000);
      assert.equal(serverSaw.pong.opcode, 0xa);
      assert.equal(serverSaw.pong.payload.toString(), 'p1');
      for (const f of Object.values(serverSaw)) assert.equal(f.masked, true, 'client frames are masked');
      assert.equal(serverSaw.text.opcode, 1);
      assert.equal(serverSaw.text.payload.toString(), '{"type":"resize","cols":1,"rows":2}');
      assert.equal(serverSaw.bin.opcode, 2);
      assert.deepEqual(serverSaw.bin.payload, Buffer.alloc(200, 1));
      assert.equal(serverSaw.close.opcode, 8);
      assert.equal(serverSaw.close.payload.readUInt16BE(0), 1000);
    } finally {
      srv.close();
    }
  });

  it('throws the server error when the upgrade is refused', async () => {
    const server = http.createServer((req, res) => {
      res.writeHead(401, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ code: 'UNAUTHORIZED', message: 'missing or invalid API key', context: {}, httpStatus: 401 }));
    });
    const url = await listen(server);
    try {
      await assert.rejects(WebSocketClient.connect(new URL(url + '/t')), (err) => {
        assert.equal(err.name, 'UnauthorizedError');
        assert.equal(err.httpStatus, 401);
        return true;
      });
    } finally {
      server.close();
    }
  });
});
