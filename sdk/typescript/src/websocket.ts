/**
 * A minimal WebSocket client (RFC 6455) on node:http's upgrade, with no
 * dependencies: client frames are masked, fragmented messages are
 * reassembled, pings are answered, and the close handshake is done.
 *
 * @module
 */

import { createHash, randomBytes } from 'node:crypto';
import { EventEmitter } from 'node:events';
import http from 'node:http';
import https from 'node:https';
import type { Duplex } from 'node:stream';

import { parseError, readBody } from './client.js';
import { createErrorFromResponse, RequestTimeoutError } from './errors.js';

const GUID = '258EAFA5-E914-47DA-95CA-C5AB0DC85B11';
const OP_CONT = 0x0;
const OP_TEXT = 0x1;
const OP_BINARY = 0x2;
const OP_CLOSE = 0x8;
const OP_PING = 0x9;
const OP_PONG = 0xa;

/** Options of {@link WebSocketClient.connect}. */
export interface WebSocketConnectOptions {
  /** Extra request headers (e.g. `Authorization`). */
  headers?: Record<string, string>;
  /** Give up after this many ms (default 30 000). */
  timeoutMs?: number;
  /** Aborts the connection attempt. */
  signal?: AbortSignal;
  /** Largest message accepted, bytes (default 64 MiB). */
  maxMessageBytes?: number;
}

/**
 * A WebSocket connection (client side).
 *
 * Events: `message` `(data: Buffer, isBinary: boolean)`, `close`
 * `(code: number, reason: string)` (once, always last), `error` `(err)`.
 */
export class WebSocketClient extends EventEmitter {
  private readonly socket: Duplex;
  private buf: Buffer = Buffer.alloc(0);
  private fragments: Buffer[] = [];
  private fragmentOpcode = 0;
  private fragmentBytes = 0;
  private closeSent = false;
  private closed = false;
  private readonly maxMessageBytes: number;
  private closeTimer: NodeJS.Timeout | undefined;

  private constructor(socket: Duplex, head: Buffer, maxMessageBytes: number) {
    super();
    this.socket = socket;
    this.maxMessageBytes = maxMessageBytes;
    // Bytes that came with the upgrade go first; nothing is parsed before
    // the caller had a chance to attach its listeners (next turn).
    socket.pause();
    this.buf = Buffer.from(head);
    socket.on('error', (err) => {
      if (!this.closed) this.emit('error', err);
    });
    socket.on('close', () => this.finish(this.closeSent ? 1000 : 1006, ''));
    setImmediate(() => {
      socket.on('data', (d: Buffer) => this.onData(d));
      this.onData(Buffer.alloc(0));
      socket.resume();
    });
  }

  /**
   * Open a WebSocket: an HTTP `GET` with `Upgrade: websocket` to `url`
   * (`http:`/`https:` or `ws:`/`wss:`), checking `Sec-WebSocket-Accept`.
   * A non-101 answer is thrown as the server's error (e.g. `426`, `404`,
   * `401 UNAUTHORIZED`).
   */
  static connect(url: URL, options: WebSocketConnectOptions = {}): Promise<WebSocketClient> {
    const target = new URL(url);
    if (target.protocol === 'ws:') target.protocol = 'http:';
    if (target.protocol === 'wss:') target.protocol = 'https:';
    const mod = target.protocol === 'https:' ? https : http;
    const key = randomBytes(16).toString('base64');
    const expected = createHash('sha1').update(key + GUID).digest('base64');
    const timeoutMs = options.timeoutMs ?? 30_000;
    return new Promise((resolve, reject) => {
      options.signal?.throwIfAborted();
      const req = mod.request(target, {
        method: 'GET',
        // Upgraded sockets must not come from (or go back to) a keep-alive pool.
        agent: false,
        headers: {
          ...(options.headers ?? {}),
          connection: 'Upgrade',
          upgrade: 'websocket',
          'sec-websocket-key': key,
          'sec-websocket-version': '13',
        },
      });
      let settled = false;
      const fail = (err: unknown): void => {
        if (settled) return;
        settled = true;
        cleanup();
        reject(err);
      };
      const timer = setTimeout(
        () =>
          req.destroy(
            new RequestTimeoutError({ code: 'REQUEST_TIMEOUT', message: `WebSocket ${target.pathname}: no upgrade within ${timeoutMs} ms` }),
          ),
        timeoutMs,
      );
      const onAbort = (): void => {
        req.destroy(options.signal!.reason instanceof Error ? options.signal!.reason : new Error('aborted'));
      };
      options.signal?.addEventListener('abort', onAbort, { once: true });
      const cleanup = (): void => {
        clearTimeout(timer);
        options.signal?.removeEventListener('abort', onAbort);
      };
      req.on('error', fail);
      req.on('response', (res) => {
        // Not upgraded: the body is the server's error.
        readBody(res)
          .then((body) => {
            const status = res.statusCode ?? 0;
            fail(createErrorFromResponse(parseError(body, status), status));
          })
          .catch(fail);
      });
      req.on('upgrade', (res, socket, head) => {
        if (settled) {
          socket.destroy();
          return;
        }
        const accept = res.headers['sec-websocket-accept'];
        if (res.statusCode !== 101 || accept !== expected) {
          socket.destroy();
          fail(new Error(`WebSocket handshake failed: status ${res.statusCode}, Sec-WebSocket-Accept ${String(accept)}`));
          return;
        }
        settled = true;
        cleanup();
        (socket as { setNoDelay?: (v: boolean) => void }).setNoDelay?.(true);
        resolve(new WebSocketClient(socket, head, options.maxMessageBytes ?? 64 << 20));
      });
      req.end();
    });
  }

  /** Is the connection open (no close frame sent or received)? */
  get isOpen(): boolean {
    return !this.closed && !this.closeSent;
  }

  /** Send a binary message. */
  sendBinary(data: Uint8Array): void {
    this.sendFrame(OP_BINARY, Buffer.from(data.buffer, data.byteOffset, data.byteLength));
  }

  /** Send a text message. */
  sendText(text: string): void {
    this.sendFrame(OP_TEXT, Buffer.from(text, 'utf8'));
  }

  /** Send a ping (the server answers with a pong). */
  ping(data: Uint8Array = Buffer.alloc(0)): void {
    this.sendFrame(OP_PING, Buffer.from(data));
  }

  /**
   * Start the close handshake (code 1000 by default); the socket is ended
   * when the server's close frame arrives, or after 2 s.
   */
  close(code = 1000, reason = ''): void {
    if (this.closed) return;
    if (!this.closeSent) {
      const r = Buffer.from(reason, 'utf8');
      const p = Buffer.alloc(2 + r.length);
      p.writeUInt16BE(code, 0);
      r.copy(p, 2);
      this.sendFrame(OP_CLOSE, p);
      this.closeSent = true;
    }
    this.closeTimer ??= setTimeout(() => this.socket.destroy(), 2000);
  }

  /** Drop the connection without the close handshake. */
  terminate(): void {
    this.socket.destroy();
  }

  private sendFrame(opcode: number, payload: Buffer): void {
    if (this.closed || this.closeSent) throw new Error('WebSocket is closed');
    const n = payload.length;
    let header: Buffer;
    if (n < 126) {
      header = Buffer.alloc(2);
      header[1] = 0x80 | n;
    } else if (n < 65536) {
      header = Buffer.alloc(4);
      header[1] = 0x80 | 126;
      header.writeUInt16BE(n, 2);
    } else {
      header = Buffer.alloc(10);
      header[1] = 0x80 | 127;
      header.writeBigUInt64BE(BigInt(n), 2);
    }
    header[0] = 0x80 | opcode; // FIN + opcode
    const mask = randomBytes(4);
    const masked = Buffer.alloc(n);
    for (let i = 0; i < n; i++) masked[i] = payload[i]! ^ mask[i & 3]!;
    this.socket.write(Buffer.concat([header, mask, masked]));
  }

  private onData(d: Buffer): void {
    this.buf = this.buf.length ? Buffer.concat([this.buf, d]) : d;
    for (;;) {
      if (this.buf.length < 2) return;
      const b0 = this.buf[0]!;
      const b1 = this.buf[1]!;
      const fin = (b0 & 0x80) !== 0;
      const opcode = b0 & 0x0f;
      const masked = (b1 & 0x80) !== 0;
      let len = b1 & 0x7f;
      let off = 2;
      if (len === 126) {
        if (this.buf.length < 4) return;
        len = this.buf.readUInt16BE(2);
        off = 4;
      } else if (len === 127) {
        if (this.buf.length < 10) return;
        const big = this.buf.readBigUInt64BE(2);
        if (big > BigInt(this.maxMessageBytes)) return this.protocolError(1009, 'message too big');
        len = Number(big);
        off = 10;
      }
      if ((b0 & 0x70) !== 0) return this.protocolError(1002, 'reserved bits set');
      if (masked) return this.protocolError(1002, 'server frames must not be masked');
      if (this.buf.length < off + len) return;
      const payload = this.buf.subarray(off, off + len);
      this.buf = this.buf.subarray(off + len);
      this.onFrame(fin, opcode, Buffer.from(payload));
      if (this.closed) return;
    }
  }

  private onFrame(fin: boolean, opcode: number, payload: Buffer): void {
    switch (opcode) {
      case OP_PING:
        if (!this.closeSent && !this.closed) this.sendFrame(OP_PONG, payload);
        return;
      case OP_PONG:
        return;
      case OP_CLOSE: {
        const code = payload.length >= 2 ? payload.readUInt16BE(0) : 1005;
        const reason = payload.length > 2 ? payload.subarray(2).toString('utf8') : '';
        if (!this.closeSent) {
          try {
            this.sendFrame(OP_CLOSE, payload.subarray(0, 2));
          } catch {
            // socket already gone
          }
          this.closeSent = true;
        }
        this.socket.end();
        this.finish(code, reason);
        return;
      }
      case OP_TEXT:
      case OP_BINARY:
        if (this.fragments.length) return this.protocolError(1002, 'new message inside a fragmented one');
        if (fin) {
          this.emit('message', payload, opcode === OP_BINARY);
          return;
        }
        this.fragmentOpcode = opcode;
        this.fragments = [payload];
        this.fragmentBytes = payload.length;
        return;
      case OP_CONT:
        if (!this.fragments.length) return this.protocolError(1002, 'continuation without a message');
        this.fragments.push(payload);
        this.fragmentBytes += payload.length;
        if (this.fragmentBytes > this.maxMessageBytes) return this.protocolError(1009, 'message too big');
        if (fin) {
          const whole = Buffer.concat(this.fragments);
          this.fragments = [];
          this.emit('message', whole, this.fragmentOpcode === OP_BINARY);
        }
        return;
      default:
        this.protocolError(1002, `unknown opcode ${opcode}`);
    }
  }

  private protocolError(code: number, reason: string): void {
    this.emit('error', new Error(`WebSocket protocol error: ${reason}`));
    try {
      this.close(code, reason);
    } catch {
      // ignore
    }
    this.socket.destroy();
  }

  private finish(code: number, reason: string): void {
    if (this.closed) return;
    this.closed = true;
    if (this.closeTimer) clearTimeout(this.closeTimer);
    this.emit('close', code, reason);
  }
}
