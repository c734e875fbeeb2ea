/**
 * Interactive terminals (a pseudo-terminal and a shell) over WebSocket.
 *
 * @module
 */

import { EventEmitter } from 'node:events';

import { createErrorFromResponse, SandboxError } from './errors.js';
import type { WebSocketClient } from './websocket.js';

/** How a terminal's shell ended. */
export interface TerminalExit {
  /** The shell's exit code. */
  code: number;
  /** The signal that ended it, if any. */
  signal?: number;
}

/**
 * A session's terminal, connected over WebSocket
 * (`GET /v1/sandboxes/{id}/terminal`, docs/http.md "Terminal").
 *
 * One terminal exists per session and is shared by every connection; on
 * connect the server first replays its recent output (up to 256 KiB), then
 * sends `ready`.
 *
 * Read the output either as an async iterable of byte chunks
 * (`for await (const chunk of term)`) or with events:
 *
 * - `data` `(chunk: Uint8Array)` — output bytes;
 * - `ready` `()` — the replay is over, the shell is live;
 * - `exit` `(exit: TerminalExit)` — the shell ended (the connection closes next);
 * - `error` `(err: SandboxError)` — an error reported by the server;
 * - `close` `(code: number, reason: string)` — the connection closed.
 *
 * @example
 * ```ts
 * const term = await sandbox.terminal();
 * await term.ready;
 * term.write('echo $((6*7))\n');
 * for await (const chunk of term) process.stdout.write(chunk);
 * ```
 */
export class Terminal extends EventEmitter implements AsyncIterable<Uint8Array> {
  /** The session whose terminal this is. */
  readonly sessionId: string;
  /** Resolves when the server sent `ready` (rejects if the connection closed first). */
  readonly ready: Promise<void>;
  /** Resolves with the exit status when the shell ends, or `null` if the connection closed first. */
  readonly exited: Promise<TerminalExit | null>;
  /** Resolves with the close code once the connection is closed. */
  readonly closed: Promise<number>;
  /** Everything received so far, decoded as UTF-8 (handy for tests and simple automation). */
  output = '';

  private readonly ws: WebSocketClient;
  private readonly decoder = new TextDecoder('utf-8');
  private queue: Uint8Array[] = [];
  private waiters: ((r: IteratorResult<Uint8Array>) => void)[] = [];
  private ended = false;
  private isReady = false;

  /** @internal Use `sandbox.terminal()`. */
  constructor(ws: WebSocketClient, sessionId: string) {
    super();
    this.ws = ws;
    this.sessionId = sessionId;
    let readyResolve!: () => void;
    let readyReject!: (e: unknown) => void;
    this.ready = new Promise((res, rej) => {
      readyResolve = res;
      readyReject = rej;
    });
    this.ready.catch(() => undefined); // no unhandled rejection when nobody waits
    let exitResolve!: (e: TerminalExit | null) => void;
    this.exited = new Promise((res) => (exitResolve = res));
    let closeResolve!: (code: number) => void;
    this.closed = new Promise((res) => (closeResolve = res));

    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (isBinary) {
        const chunk = new Uint8Array(data.buffer, data.byteOffset, data.byteLength);
        this.output += this.decoder.decode(chunk, { stream: true });
        this.push(chunk);
        this.emit('data', chunk);
        return;
      }
      let msg: { type?: string; code?: unknown; signal?: number; message?: string };
      try {
        msg = JSON.parse(data.toString('utf8'));
      } catch {
        return;
      }
      if (msg.type === 'ready') {
        this.isReady = true;
        readyResolve();
        this.emit('ready');
      } else if (msg.type === 'exit') {
        const exit: TerminalExit = { code: Number(msg.code ?? 0) };
        if (typeof msg.signal === 'number') exit.signal = msg.signal;
        exitResolve(exit);
        this.emit('exit', exit);
      } else if (msg.type === 'error') {
        const err = createErrorFromResponse({
          code: typeof msg.code === 'string' ? msg.code : 'UNKNOWN_ERROR',
          message: msg.message ?? 'terminal error',
          operation: 'terminal',
        });
        if (this.listenerCount('error') > 0) this.emit('error', err);
      }
    });
    ws.on('error', (err: Error) => {
      if (this.listenerCount('error') > 0)
        this.emit(
          'error',
          new SandboxError({ code: 'TERMINAL_CONNECTION_ERROR', message: err.message, operation: 'terminal' }, { cause: err }),
        );
    });
    ws.on('close', (code: number, reason: string) => {
      this.ended = true;
      if (!this.isReady)
        readyReject(new SandboxError({ code: 'TERMINAL_CLOSED', message: `terminal closed before ready (${code})`, operation: 'terminal' }));
      exitResolve(null);
      for (const w of this.waiters.splice(0)) w({ value: undefined, done: true });
      closeResolve(code);
      this.emit('close', code, reason);
    });
  }

  /** Send keystrokes (a string is sent as its UTF-8 bytes). */
  write(data: string | Uint8Array): void {
    this.ws.sendBinary(typeof data === 'string' ? Buffer.from(data, 'utf8') : data);
  }

  /** Resize the terminal (1–1000 columns and rows). */
  resize(cols: number, rows: number): void {
    this.ws.sendText(JSON.stringify({ type: 'resize', cols, rows }));
  }

  /**
   * Close this connection (the terminal and its shell stay, shared with other
   * connections; `exit` in the shell ends them). Resolves when closed.
   */
  async close(): Promise<void> {
    this.ws.close(1000);
    await this.closed;
  }

  /**
   * Wait until the received output contains `pattern` (checked against
   * everything received on this connection).
   *
   * @param pattern - a substring or a RegExp.
   * @param timeoutMs - give up after this many ms (default 10 000) with an error.
   * @returns the output received so far.
   */
  waitFor(pattern: string | RegExp, timeoutMs = 10_000): Promise<string> {
    const test = (): boolean => (typeof pattern === 'string' ? this.output.includes(pattern) : pattern.test(this.output));
    if (test()) return Promise.resolve(this.output);
    return new Promise((resolve, reject) => {
      const onData = (): void => {
        if (test()) {
          cleanup();
          resolve(this.output);
        }
      };
      const onClose = (): void => {
        cleanup();
        reject(new SandboxError({ code: 'TERMINAL_CLOSED', message: `terminal closed before ${String(pattern)} appeared`, operation: 'terminal' }));
      };
      const timer = setTimeout(() => {
        cleanup();
        reject(
          new SandboxError({
            code: 'REQUEST_TIMEOUT',
            message: `terminal: ${String(pattern)} did not appear within ${timeoutMs} ms`,
            operation: 'terminal',
          }),
        );
      }, timeoutMs);
      const cleanup = (): void => {
        clearTimeout(timer);
        this.off('data', onData);
        this.off('close', onClose);
      };
      this.on('data', onData);
      this.on('close', onClose);
    });
  }

  /** Iterate the output chunks until the connection closes. */
  [Symbol.asyncIterator](): AsyncIterator<Uint8Array> {
    return {
      next: () => {
        const v = this.queue.shift();
        if (v) return Promise.resolve({ value: v, done: false });
        if (this.ended) return Promise.resolve({ value: undefined, done: true });
        return new Promise((resolve) => this.waiters.push(resolve));
      },
      return: () => {
        this.queue = [];
        return Promise.resolve({ value: undefined, done: true });
      },
    };
  }

  private push(chunk: Uint8Array): void {
    const w = this.waiters.shift();
    if (w) w({ value: chunk, done: false });
    else if (this.queue.length < 4096) this.queue.push(chunk);
  }
}
