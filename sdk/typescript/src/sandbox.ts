/**
 * `Sandbox` and `ExecutionSession`: the `@cloudflare/sandbox` API over sbx.
 *
 * @module
 */

import type http from 'node:http';

import { readBody, parseError, isNetworkError, sleep, type SbxClient } from './client.js';
import {
  createErrorFromResponse,
  ProcessExitedBeforeReadyError,
  ProcessNotFoundError,
  ProcessReadyTimeoutError,
  SandboxError,
  ValidationFailedError,
} from './errors.js';
import { Process } from './process.js';
import { parseSSEStream } from './sse.js';
import { EventStream, openOperationStream, openStreamResponse } from './stream.js';
import { Terminal } from './terminal.js';
import type {
  CodeContext,
  CodeEvent,
  CreateContextOptions,
  ExecEvent,
  ExecOptions,
  ExecResult,
  Execution,
  ExecutionError,
  ExposedPort,
  ExposePortOptions,
  FileEncoding,
  FileMetadata,
  FileStreamEvent,
  FileWatchEvent,
  GitCheckoutOptions,
  GitCheckoutResult,
  ListFilesResult,
  LogEvent,
  ProcessInfo,
  ProcessLogs,
  ProcessOptions,
  ReadFileResult,
  Result,
  RunCodeOptions,
  SandboxLimits,
  SandboxOptions,
  SandboxStatus,
  SessionInfo,
  SessionOptions,
  StreamEventBase,
  StreamOptions,
  TerminalOptions,
  WaitForExitResult,
  WaitForLogResult,
  WaitForPortOptions,
  WaitForPortResult,
  WatchOptions,
  WriteFileResult,
} from './types.js';
import { WebSocketClient } from './websocket.js';

/** A session ID, or options carrying one (the trailing argument of several file methods). */
export type SessionArg = string | { sessionId?: string } | undefined;

/**
 * A one-pass async iterable of already parsed events (what
 * `readFileStream` returns). Works with `parseSSEStream`, `streamFile`
 * and `collectFile`.
 */
export class EventIterable<T> implements AsyncIterable<T> {
  /** @internal Marks parsed-event sources for `parseSSEStream`. */
  readonly __sbxEventStream = true;
  private used = false;
  /** @internal */
  constructor(private readonly gen: () => AsyncGenerator<T, void, undefined>) {}
  /** Iterate (once). */
  [Symbol.asyncIterator](): AsyncIterator<T> {
    if (this.used) throw new Error('EventIterable: can be iterated only once');
    this.used = true;
    return this.gen();
  }
  /** Collect every event into an array. */
  async toArray(): Promise<T[]> {
    const out: T[] = [];
    for await (const ev of this) out.push(ev);
    return out;
  }
}

/** @internal Shared state of a Sandbox and the sessions made from it. */
interface SandboxState {
  client: SbxClient;
  id: string;
  options: SandboxOptions;
  configured?: Promise<void>;
}

function sessionOf(arg: SessionArg): string | undefined {
  return typeof arg === 'string' ? arg : arg?.sessionId;
}

function stdinArg(stdin: string | Uint8Array | undefined): string | undefined {
  if (stdin === undefined || typeof stdin === 'string') return stdin;
  try {
    return new TextDecoder('utf-8', { fatal: true }).decode(stdin);
  } catch {
    throw new ValidationFailedError({
      code: 'VALIDATION_FAILED',
      message: 'stdin: the HTTP API carries text only; these bytes are not valid UTF-8',
      operation: 'exec',
    });
  }
}

function toDateContext(c: Record<string, unknown>): CodeContext {
  return {
    id: String(c.id),
    language: String(c.language),
    cwd: String(c.cwd ?? '/workspace'),
    createdAt: new Date((c.createdAt as string) ?? Date.now()),
    lastUsed: new Date((c.lastUsed as string) ?? Date.now()),
    mode: c.mode as string | undefined,
  };
}

function toExecutionError(e: Record<string, unknown> | undefined): ExecutionError | undefined {
  if (!e) return undefined;
  const value = String(e.value ?? e.message ?? '');
  return { name: String(e.name ?? 'Error'), value, message: value, traceback: (e.traceback as string[]) ?? [] };
}

/** Single-quote a string for a POSIX shell. */
function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/**
 * The operations of a sandbox, optionally bound to one session. Both
 * {@link Sandbox} (the default session) and {@link ExecutionSession}
 * (a named one) are this; every method that runs in a session uses the
 * bound session unless its options name another.
 */
export class SandboxOperations {
  /** @internal */
  protected readonly state: SandboxState;
  /** @internal The bound session (undefined: the default session). */
  protected readonly boundSession: string | undefined;

  /** @internal */
  constructor(state: SandboxState, sessionId?: string) {
    this.state = state;
    this.boundSession = sessionId;
  }

  /** The sandbox ID. */
  get sandboxId(): string {
    return this.state.id;
  }

  /** The client this sandbox talks through. */
  get client(): SbxClient {
    return this.state.client;
  }

  // -------------------------------------------------------------------------
  // Plumbing

  /** @internal Send `sandbox.configure` once, before the first operation, when options ask for it. */
  protected ensureConfigured(): Promise<void> {
    const o = this.state.options;
    if (o.sleepAfter === undefined && o.keepAlive === undefined) return Promise.resolve();
    if (!this.state.configured) {
      const args: Record<string, unknown> = {};
      if (o.sleepAfter !== undefined) args.sleepAfter = o.sleepAfter;
      if (o.keepAlive !== undefined) args.keepAlive = o.keepAlive;
      this.state.configured = this.state.client.call(this.state.id, 'sandbox.configure', args).then(
        () => undefined,
        (err) => {
          this.state.configured = undefined; // try again next time
          throw err;
        },
      );
    }
    return this.state.configured;
  }

  /**
   * Call any sandbox operation of docs/protocol.md by name (the low-level
   * door; the other methods are built on it).
   *
   * @param op - e.g. `file.read`, `session.list`.
   * @param args - its arguments.
   * @throws {@link SandboxError} (the subclass of the code).
   */
  async call<T = Record<string, unknown>>(op: string, args: Record<string, unknown> = {}, options: { signal?: AbortSignal } = {}): Promise<T> {
    await this.ensureConfigured();
    return this.state.client.call<T>(this.state.id, op, args, options);
  }

  /** @internal The session for a call: explicit, else the bound one. */
  protected session(explicit?: string): string | undefined {
    return explicit ?? this.boundSession;
  }

  /** @internal Arguments shared by exec, exec.stream and process.start. */
  protected commandArgs(
    command: string | string[],
    o: { cwd?: string; env?: Record<string, string | undefined>; timeout?: number; sessionId?: string; sessionless?: boolean },
  ): Record<string, unknown> {
    const args: Record<string, unknown> = Array.isArray(command) ? { argv: command } : { command };
    if (o.cwd !== undefined) args.cwd = o.cwd;
    if (o.env !== undefined) {
      const env: Record<string, string> = {};
      for (const [k, v] of Object.entries(o.env)) if (v !== undefined && v !== null) env[k] = String(v);
      args.env = env;
    }
    if (o.timeout !== undefined) args.timeout = o.timeout;
    const sid = o.sessionless ? undefined : this.session(o.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    else if (o.sessionless || this.state.options.enableDefaultSession === false) args.sessionless = true;
    return args;
  }

  /** @internal Open a stream operation as an EventStream. */
  protected async openStream<T extends StreamEventBase>(
    op: string,
    args: Record<string, unknown>,
    options: { signal?: AbortSignal; cancelOnReturn?: boolean } = {},
  ): Promise<EventStream<T>> {
    await this.ensureConfigured();
    const response = await openOperationStream(this.state.client, this.state.id, op, args, options.signal);
    return new EventStream<T>({
      client: this.state.client,
      sandboxId: this.state.id,
      operation: op,
      response,
      cancelOnReturn: options.cancelOnReturn ?? true,
      signal: options.signal,
    });
  }

  // -------------------------------------------------------------------------
  // Commands

  /**
   * Run a command and return its output. A non-zero exit code is a result
   * (`success: false`), not an exception.
   *
   * @param command - a shell string (run by the session's bash, or `/bin/sh -c`
   *   when sessionless), or an argv array run without a shell.
   * @param options - `timeout` (ms; exit code 124 when it fires), `env`,
   *   `cwd`, `sessionId`, `stdin`; `stream`/`onOutput` to receive output as
   *   it comes; `onComplete`, `onError`; `signal`.
   * @returns {@link ExecResult}.
   * @throws {@link SessionTerminatedError} when the command ends its session's
   *   shell (`exit 3`); {@link ValidationFailedError} for a bad `cwd`; transport errors.
   */
  async exec(command: string | string[], options: ExecOptions = {}): Promise<ExecResult> {
    const text = Array.isArray(command) ? command.join(' ') : command;
    try {
      let result: ExecResult;
      if (options.stream || options.onOutput) {
        result = await this.execStreaming(command, options);
      } else {
        const args = this.commandArgs(command, options);
        const stdin = stdinArg(options.stdin);
        if (stdin !== undefined) args.stdin = stdin;
        const r = await this.call<Record<string, unknown>>('exec', args, { signal: options.signal });
        result = {
          ...(r as object),
          success: Boolean(r.success),
          exitCode: Number(r.exitCode),
          stdout: String(r.stdout ?? ''),
          stderr: String(r.stderr ?? ''),
          command: text,
          duration: Number(r.duration ?? 0),
          timestamp: new Date().toISOString(),
        } as ExecResult;
      }
      options.onComplete?.(result);
      return result;
    } catch (err) {
      options.onError?.(err as Error);
      throw err;
    }
  }

  private async execStreaming(command: string | string[], options: ExecOptions): Promise<ExecResult> {
    const stream = await this.execStream(command, options);
    let stdout = '';
    let stderr = '';
    try {
      for await (const ev of stream) {
        if (ev.type === 'stdout' || ev.type === 'stderr') {
          if (ev.type === 'stdout') stdout += ev.data;
          else stderr += ev.data;
          options.onOutput?.(ev.type, ev.data);
        } else if (ev.type === 'complete') {
          return {
            success: ev.success,
            exitCode: ev.exitCode,
            stdout,
            stderr,
            command: Array.isArray(command) ? command.join(' ') : command,
            duration: ev.duration,
            timestamp: new Date().toISOString(),
            sessionId: ev.sessionId,
            timedOut: ev.timedOut,
            cause: ev.cause,
            ...(ev.signal !== undefined ? { signal: ev.signal } : {}),
          };
        } else if (ev.type === 'error') {
          throw createErrorFromResponse({ ...ev.error, operation: 'exec.stream' });
        }
      }
    } catch (err) {
      if (options.signal?.aborted) await stream.cancel();
      throw err;
    }
    throw new SandboxError({ code: 'STREAM_ENDED', message: 'exec: the output stream ended without a result', operation: 'exec.stream' });
  }

  /**
   * Run a command and stream its events: `start`, `stdout`/`stderr` as
   * produced, then `complete` (or `error`). See {@link EventStream} for
   * resuming and cancelling.
   *
   * @param command - shell string or argv array.
   * @param options - as {@link ExecOptions} (`timeout`, `env`, `cwd`, `sessionId`, `stdin`, `signal`).
   * @returns an {@link EventStream} of {@link ExecEvent}s (awaiting it means the command was accepted).
   * @throws {@link ValidationFailedError} and the like when the command is refused.
   */
  async execStream(command: string | string[], options: StreamOptions = {}): Promise<EventStream<ExecEvent>> {
    const args = this.commandArgs(command, options);
    const stdin = stdinArg(options.stdin);
    if (stdin !== undefined) args.stdin = stdin;
    return this.openStream<ExecEvent>('exec.stream', args, { signal: options.signal });
  }

  /**
   * Continue reading a stream by its ID after the event `lastEventId`
   * (e.g. after `close()`, an aborted `signal`, or from another process).
   *
   * @param streamId - {@link EventStream.streamId}, e.g. `exec-3`.
   * @param lastEventId - the `seq` of the last event you have (0: from the start).
   * @throws {@link StreamNotFoundError} when the stream is gone.
   */
  async resumeStream<T extends StreamEventBase = StreamEventBase>(
    streamId: string,
    lastEventId = 0,
    options: { signal?: AbortSignal } = {},
  ): Promise<EventStream<T>> {
    const response = await this.openStreamWithRetry(streamId, lastEventId, options.signal);
    const s = new EventStream<T>({
      client: this.state.client,
      sandboxId: this.state.id,
      operation: 'stream.read',
      response,
      streamId,
      after: lastEventId,
      cancelOnReturn: !streamId.startsWith('proc:'),
      signal: options.signal,
    });
    return s;
  }

  /** @internal GET a stream, retrying network errors. */
  protected async openStreamWithRetry(streamId: string, after: number, signal?: AbortSignal): Promise<http.IncomingMessage> {
    const client = this.state.client;
    for (let attempt = 0; ; attempt++) {
      try {
        return await openStreamResponse(client, this.state.id, streamId, after, signal);
      } catch (err) {
        if (!isNetworkError(err) || attempt >= client.retryPolicy.retries || signal?.aborted)
          throw client.wrapTransportError(err, { operation: 'stream.read', signal });
        await sleep(client.backoff(attempt), signal);
      }
    }
  }

  // -------------------------------------------------------------------------
  // Background processes

  /**
   * Start a background process. Resolves once it started.
   *
   * @param command - shell string or argv array.
   * @param options - `processId`, `sessionId`, `timeout` (ms), `env`, `cwd`;
   *   callbacks `onStart`, `onOutput`, `onExit`, `onError` (fed by a
   *   background subscription to its logs).
   * @returns a {@link Process}.
   * @throws {@link ResourceBusyError} when `processId` is in use.
   */
  async startProcess(command: string | string[], options: ProcessOptions = {}): Promise<Process> {
    const args = this.commandArgs(command, options);
    if (options.processId !== undefined) args.processId = options.processId;
    const r = await this.call<{ process: ProcessInfo; processId: string; pid?: number; command: string }>('process.start', args);
    const info: ProcessInfo = r.process ?? {
      id: r.processId,
      pid: r.pid,
      command: r.command,
      status: 'running',
      startTime: new Date().toISOString(),
    };
    const proc = new Process(this, info);
    options.onStart?.(proc);
    if (options.onOutput || options.onExit) void this.followProcess(proc, options);
    return proc;
  }

  private async followProcess(proc: Process, options: ProcessOptions): Promise<void> {
    try {
      const stream = await this.streamProcessLogs(proc.id);
      for await (const ev of stream) {
        if (ev.type === 'stdout' || ev.type === 'stderr') options.onOutput?.(ev.type, ev.data);
        else if (ev.type === 'exit') {
          proc.apply({ ...proc.toJSON(), status: ev.status, exitCode: ev.exitCode });
          options.onExit?.(typeof ev.exitCode === 'number' ? ev.exitCode : null);
          return;
        }
      }
      options.onExit?.(null);
    } catch (err) {
      options.onError?.(err as Error);
    }
  }

  /** Every background process of the sandbox (running, and the last 256 finished ones). */
  async listProcesses(): Promise<Process[]> {
    const r = await this.call<{ processes: ProcessInfo[] }>('process.list');
    return (r.processes ?? []).map((p) => new Process(this, p));
  }

  /** One process, or `null` when no process has that ID. */
  async getProcess(processId: string): Promise<Process | null> {
    try {
      const r = await this.call<{ process: ProcessInfo }>('process.get', { processId });
      return new Process(this, r.process);
    } catch (err) {
      if (err instanceof ProcessNotFoundError) return null;
      throw err;
    }
  }

  /**
   * Kill a process (SIGTERM to its tree, SIGKILL after 5 s); resolves when it ended.
   *
   * @param signal - accepted for Cloudflare compatibility; ignored.
   * @returns `{processId, exitCode (143 or 137), status: 'killed'}`.
   * @throws {@link ProcessNotFoundError}
   */
  killProcess(processId: string, signal?: string | number): Promise<{ processId: string; exitCode?: number; status?: string }> {
    void signal;
    return this.call('process.kill', { processId });
  }

  /** Kill every process; resolves with how many were killed. */
  async killAllProcesses(): Promise<number> {
    const r = await this.call<{ killedCount?: number; cleanedCount?: number }>('process.killAll');
    return r.killedCount ?? r.cleanedCount ?? 0;
  }

  /** Kept for Cloudflare compatibility (finished processes are pruned by the server): resolves with 0. */
  async cleanupCompletedProcesses(): Promise<number> {
    return 0;
  }

  /** A process's output so far (newest 2 MiB). @throws {@link ProcessNotFoundError} */
  async getProcessLogs(processId: string): Promise<ProcessLogs> {
    const r = await this.call<Record<string, unknown>>('process.logs', { processId });
    return {
      processId,
      stdout: String(r.stdout ?? ''),
      stderr: String(r.stderr ?? ''),
      truncated: r.truncated as boolean | undefined,
      status: r.status as ProcessLogs['status'],
    };
  }

  /**
   * A process's log events: `process_info`, the buffered output, live output,
   * and `exit` last. Any number of readers may follow one process; leaving
   * the loop early does not affect the process.
   *
   * @throws {@link StreamNotFoundError} / {@link ProcessNotFoundError} for an unknown process.
   */
  async streamProcessLogs(processId: string, options: { signal?: AbortSignal } = {}): Promise<EventStream<LogEvent>> {
    await this.ensureConfigured();
    const streamId = `proc:${processId}`;
    const response = await this.openStreamWithRetry(streamId, 0, options.signal);
    return new EventStream<LogEvent>({
      client: this.state.client,
      sandboxId: this.state.id,
      operation: 'process.logs',
      response,
      streamId,
      cancelOnReturn: false,
      signal: options.signal,
    });
  }

  /** See {@link Process.waitForLog}. */
  async waitForLog(processId: string, pattern: string | RegExp, timeout?: number): Promise<WaitForLogResult> {
    if (typeof pattern === 'string') {
      const args: Record<string, unknown> = { processId, pattern };
      if (timeout !== undefined) args.timeout = timeout;
      return this.call<WaitForLogResult>('process.waitForLog', args);
    }
    return this.waitForLogRegExp(processId, pattern, timeout);
  }

  private async waitForLogRegExp(processId: string, pattern: RegExp, timeout?: number): Promise<WaitForLogResult> {
    const re = new RegExp(pattern.source, pattern.flags.replace(/[gy]/g, ''));
    const ac = new AbortController();
    const timer = timeout !== undefined ? setTimeout(() => ac.abort(new Error('timeout')), timeout) : undefined;
    const condition = `pattern ${String(pattern)}`;
    const timeoutError = (): SandboxError =>
      new ProcessReadyTimeoutError({
        code: 'PROCESS_READY_TIMEOUT',
        message: `Process did not become ready within ${timeout}ms. Waiting for: ${condition}`,
        httpStatus: 408,
        context: { processId, timeout, condition },
        operation: 'process.waitForLog',
      });
    const check = (line: string): WaitForLogResult | undefined => {
      const m = re.exec(line);
      return m ? { line, match: Array.from(m, (x) => x ?? '') } : undefined;
    };
    try {
      const stream = await this.streamProcessLogs(processId, { signal: ac.signal });
      const partial: Record<string, string> = { stdout: '', stderr: '' };
      for await (const ev of stream) {
        if (ev.type === 'stdout' || ev.type === 'stderr') {
          const text = partial[ev.type] + ev.data;
          const lines = text.split('\n');
          partial[ev.type] = lines.pop() ?? '';
          for (const line of lines) {
            const hit = check(line.replace(/\r$/, ''));
            if (hit) return hit;
          }
        } else if (ev.type === 'exit') {
          for (const rest of [partial.stdout!, partial.stderr!]) {
            const hit = rest ? check(rest) : undefined;
            if (hit) return hit;
          }
          throw new ProcessExitedBeforeReadyError({
            code: 'PROCESS_EXITED_BEFORE_READY',
            message: `Process exited with code ${ev.exitCode} before becoming ready. Waiting for: ${condition}`,
            httpStatus: 500,
            context: { processId, exitCode: ev.exitCode, condition },
            operation: 'process.waitForLog',
          });
        }
      }
      throw new ProcessExitedBeforeReadyError({
        code: 'PROCESS_EXITED_BEFORE_READY',
        message: `Process log ended before becoming ready. Waiting for: ${condition}`,
        httpStatus: 500,
        context: { processId, condition },
        operation: 'process.waitForLog',
      });
    } catch (err) {
      if (ac.signal.aborted) throw timeoutError();
      throw err;
    } finally {
      if (timer) clearTimeout(timer);
      ac.abort();
    }
  }

  /** See {@link Process.waitForPort}. */
  waitForPort(processId: string, port: number, options: WaitForPortOptions = {}): Promise<WaitForPortResult> {
    const args: Record<string, unknown> = { processId, port };
    if (options.mode) args.mode = options.mode;
    if (options.path) args.path = options.path;
    if (typeof options.status === 'number') args.status = options.status;
    else if (options.status) {
      args.statusMin = options.status.min;
      args.statusMax = options.status.max;
    }
    if (options.interval !== undefined) args.interval = options.interval;
    if (options.timeout !== undefined) args.timeout = options.timeout;
    return this.call<WaitForPortResult>('process.waitForPort', args);
  }

  /** See {@link Process.waitForExit}. */
  waitForExit(processId: string, timeout?: number): Promise<WaitForExitResult> {
    const args: Record<string, unknown> = { processId };
    if (timeout !== undefined) args.timeout = timeout;
    return this.call<WaitForExitResult>('process.waitForExit', args);
  }

  // -------------------------------------------------------------------------
  // Files

  /**
   * Write a file (parents are created).
   *
   * @param path - absolute, or relative to the session's cwd.
   * @param content - text, or bytes (`Uint8Array`/`ArrayBuffer`, sent base64).
   * @param options - `encoding: 'base64'` when `content` is base64 text; `sessionId`.
   * @returns `{success, path, bytesWritten, timestamp}`.
   * @throws {@link ValidationFailedError} for bad base64; {@link PermissionDeniedError}.
   */
  writeFile(
    path: string,
    content: string | Uint8Array | ArrayBuffer,
    options: { encoding?: FileEncoding; sessionId?: string } = {},
  ): Promise<WriteFileResult> {
    const args: Record<string, unknown> = { path };
    if (typeof content === 'string') {
      args.content = content;
      args.encoding = options.encoding === 'base64' ? 'base64' : 'utf-8';
    } else {
      const bytes = content instanceof ArrayBuffer ? new Uint8Array(content) : content;
      args.content = Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString('base64');
      args.encoding = 'base64';
    }
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.call<WriteFileResult>('file.write', args);
  }

  /**
   * Read a file (≤ 32 MiB). Text comes back as UTF-8, binary as base64
   * (see `encoding` and `isBinary` in the result), unless `encoding` forces one.
   *
   * @throws {@link FileNotFoundError}; {@link FileTooLargeError} over 32 MiB;
   *   {@link FileSystemError} (`IS_DIRECTORY`) for a directory.
   */
  readFile(path: string, options: { encoding?: FileEncoding; sessionId?: string } = {}): Promise<ReadFileResult> {
    const args: Record<string, unknown> = { path };
    if (options.encoding) args.encoding = options.encoding === 'base64' ? 'base64' : 'utf-8';
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.call<ReadFileResult>('file.read', args);
  }

  /**
   * Read a file as a stream of events: `metadata`, `chunk`s (text, or base64
   * for binary files, as in Cloudflare's SDK), `complete`. Use
   * {@link streamFile} or {@link collectFile} to get bytes back.
   *
   * Binary files are read through the raw file route (≤ 32 MiB), because the
   * server's SSE form of `file.readStream` cannot carry non-UTF-8 bytes.
   *
   * @throws {@link FileNotFoundError}.
   */
  async readFileStream(path: string, options: { sessionId?: string; signal?: AbortSignal } = {}): Promise<EventIterable<FileStreamEvent>> {
    const args: Record<string, unknown> = { path };
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    const stream = await this.openStream<FileStreamEvent>('file.readStream', args, { signal: options.signal });
    const self = this;
    return new EventIterable<FileStreamEvent>(async function* () {
      const it = stream[Symbol.asyncIterator]();
      try {
        const first = await it.next();
        if (first.done) return;
        const meta = first.value;
        if (meta.type === 'metadata' && meta.isBinary) {
          await stream.cancel();
          yield { ...meta, encoding: 'base64' };
          yield* self.rawFileChunks(meta.path ?? path, options.signal);
          return;
        }
        yield meta;
        for (;;) {
          const n = await it.next();
          if (n.done) return;
          yield n.value;
        }
      } finally {
        await it.return?.();
      }
    });
  }

  private async *rawFileChunks(absPath: string, signal?: AbortSignal): AsyncGenerator<FileStreamEvent> {
    const res = await this.state.client.sendWithRetry({
      method: 'GET',
      path: `/v1/sandboxes/${encodeURIComponent(this.state.id)}/files${absPath.split('/').map(encodeURIComponent).join('/')}`,
      signal,
      stream: true,
      operation: 'file.read',
    });
    if (res.statusCode !== 200) {
      const status = res.statusCode ?? 0;
      throw createErrorFromResponse(parseError(await readBody(res), status), status);
    }
    // A body that stalls ends the read, as an SSE stream's idle timeout does.
    res.setTimeout(45_000, () => {
      const e = new Error('file.read: no data for 45000 ms') as Error & { code: string };
      e.code = 'ESBXIDLE';
      res.destroy(e);
    });
    let bytesRead = 0;
    let pending = Buffer.alloc(0);
    const CHUNK = 65535;
    for await (const c of res) {
      pending = Buffer.concat([pending, c as Buffer]);
      while (pending.length >= CHUNK) {
        bytesRead += CHUNK;
        yield { type: 'chunk', data: pending.subarray(0, CHUNK).toString('base64') };
        pending = pending.subarray(CHUNK);
      }
    }
    if (pending.length) {
      bytesRead += pending.length;
      yield { type: 'chunk', data: pending.toString('base64') };
    }
    yield { type: 'complete', bytesRead };
  }

  /**
   * Create a directory.
   *
   * @param options - `recursive`: create parents, no error if it exists.
   * @throws {@link FileExistsError} when it exists (without `recursive`).
   */
  mkdir(path: string, options: { recursive?: boolean; sessionId?: string } = {}): Promise<{ success: boolean; path: string; recursive?: boolean; timestamp: string }> {
    const args: Record<string, unknown> = { path };
    if (options.recursive !== undefined) args.recursive = options.recursive;
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.call('file.mkdir', args);
  }

  /**
   * Delete a file (not a directory: use `exec('rm -rf …')`).
   *
   * @throws {@link FileNotFoundError}; {@link FileSystemError} (`IS_DIRECTORY`).
   */
  deleteFile(path: string, session?: SessionArg): Promise<{ success: boolean; path: string; timestamp?: string }> {
    const args: Record<string, unknown> = { path };
    const sid = this.session(sessionOf(session));
    if (sid !== undefined) args.sessionId = sid;
    return this.call('file.delete', args);
  }

  /** Rename a file or directory. @throws {@link FileNotFoundError} */
  renameFile(oldPath: string, newPath: string, session?: SessionArg): Promise<{ success: boolean; path: string; newPath: string; timestamp?: string }> {
    const args: Record<string, unknown> = { oldPath, newPath };
    const sid = this.session(sessionOf(session));
    if (sid !== undefined) args.sessionId = sid;
    return this.call('file.rename', args);
  }

  /**
   * Move a file or directory; into an existing directory keeps its name.
   * @throws {@link FileNotFoundError}
   */
  moveFile(sourcePath: string, destinationPath: string, session?: SessionArg): Promise<{ success: boolean; path: string; newPath: string; timestamp?: string }> {
    const args: Record<string, unknown> = { sourcePath, destinationPath };
    const sid = this.session(sessionOf(session));
    if (sid !== undefined) args.sessionId = sid;
    return this.call('file.move', args);
  }

  /**
   * List a directory.
   *
   * @param options - `recursive` (default false), `includeHidden` (default false).
   * @throws {@link FileNotFoundError}; {@link FileSystemError} (`NOT_DIRECTORY`).
   */
  listFiles(path: string, options: { recursive?: boolean; includeHidden?: boolean; sessionId?: string } = {}): Promise<ListFilesResult> {
    const args: Record<string, unknown> = { path };
    if (options.recursive !== undefined) args.recursive = options.recursive;
    if (options.includeHidden !== undefined) args.includeHidden = options.includeHidden;
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.call<ListFilesResult>('file.list', args);
  }

  /** Does the path exist? → `{success, path, exists, timestamp}`. */
  exists(path: string, session?: SessionArg): Promise<{ success: boolean; path: string; exists: boolean; timestamp?: string }> {
    const args: Record<string, unknown> = { path };
    const sid = this.session(sessionOf(session));
    if (sid !== undefined) args.sessionId = sid;
    return this.call('file.exists', args);
  }

  /**
   * Watch a path for changes (inotify). Resolves once the watch is in
   * place; events: `watching`, then `event`s
   * (`create`/`modify`/`delete`/`move_from`/`move_to`/`attrib`), `stopped`.
   * Leaving the loop or `cancel()` stops the watch.
   *
   * @throws {@link FileNotFoundError}; {@link WatchStartError}.
   */
  watch(path: string, options: WatchOptions = {}): Promise<EventStream<FileWatchEvent>> {
    const args: Record<string, unknown> = { path };
    if (options.recursive !== undefined) args.recursive = options.recursive;
    if (options.include) args.include = options.include;
    if (options.exclude) args.exclude = options.exclude;
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.openStream<FileWatchEvent>('file.watch', args, { signal: options.signal });
  }

  // -------------------------------------------------------------------------
  // Git, environment

  /**
   * Clone a repository (`git clone`, in a fresh process).
   *
   * @param repoUrl - https, http, git, ssh, file or `user@host:path`.
   * @param options - `branch`, `targetDir` (default `/workspace/<repo>`), `depth`, `cloneTimeoutMs` (default 600 000).
   * @throws {@link GitRepositoryNotFoundError}, {@link GitBranchNotFoundError},
   *   {@link GitAuthenticationError}, {@link GitNetworkError}, {@link GitCloneError}, {@link InvalidGitUrlError}.
   */
  gitCheckout(repoUrl: string, options: GitCheckoutOptions = {}): Promise<GitCheckoutResult> {
    const args: Record<string, unknown> = { repoUrl };
    for (const k of ['branch', 'targetDir', 'depth', 'cloneTimeoutMs'] as const) if (options[k] !== undefined) args[k] = options[k];
    const sid = this.session(options.sessionId);
    if (sid !== undefined) args.sessionId = sid;
    return this.call<GitCheckoutResult>('git.checkout', args);
  }

  /**
   * Set (string) or unset (`undefined`/`null`) environment variables.
   * On a {@link Sandbox}: sandbox-wide and durable (kept across container
   * restarts), exported in the default session now and inherited by
   * sessions and processes started later. On an {@link ExecutionSession}:
   * exported in that session's shell only.
   */
  async setEnvVars(vars: Record<string, string | undefined | null>): Promise<void> {
    if (this.boundSession !== undefined) {
      const lines: string[] = [];
      for (const [k, v] of Object.entries(vars)) {
        if (!/^[A-Za-z_][A-Za-z0-9_]*$/.test(k))
          throw new ValidationFailedError({ code: 'VALIDATION_FAILED', message: `invalid variable name '${k}'`, operation: 'env.set' });
        lines.push(v === undefined || v === null ? `unset ${k}` : `export ${k}=${shq(String(v))}`);
      }
      if (!lines.length) return;
      const r = await this.exec(lines.join('\n'));
      if (!r.success)
        throw new SandboxError({ code: 'COMMAND_EXECUTION_ERROR', message: `setEnvVars failed: ${r.stderr}`, operation: 'env.set' });
      return;
    }
    const out: Record<string, string | null> = {};
    for (const [k, v] of Object.entries(vars)) out[k] = v === undefined || v === null ? null : String(v);
    await this.call('env.set', { vars: out });
  }

  // -------------------------------------------------------------------------
  // Code interpreter

  /**
   * Create a code context: an interpreter process (Python, JavaScript or
   * TypeScript) whose state persists across runs.
   *
   * @throws {@link ValidationFailedError} for an unknown language; {@link InterpreterNotAvailableError}.
   */
  async createCodeContext(options: CreateContextOptions = {}): Promise<CodeContext> {
    const args: Record<string, unknown> = {};
    if (options.language) args.language = options.language;
    if (options.cwd) args.cwd = options.cwd;
    if (options.envVars) args.envVars = options.envVars;
    const r = await this.call<{ contextId: string; context: Record<string, unknown> }>('context.create', args);
    return toDateContext(r.context ?? { id: r.contextId, language: options.language ?? 'python' });
  }

  /** @internal Arguments of context.run / context.runStream. */
  private runArgs(code: string, options: RunCodeOptions): Record<string, unknown> {
    const args: Record<string, unknown> = { code };
    if (options.context !== undefined) args.context = typeof options.context === 'string' ? options.context : options.context.id;
    else if (options.language) args.language = options.language;
    if (options.timeout !== undefined) args.timeout = options.timeout;
    return args;
  }

  /**
   * Run code in a context (default: the language's default context,
   * `python` unless `language` says otherwise). An exception raised by the
   * code is returned in `error`, not thrown. With `onStdout`/`onStderr`/
   * `onResult`/`onError`, output is delivered as the cell produces it.
   *
   * @returns {@link Execution}: `results` (rich outputs: `text`, `png`, `html`, …), `logs`, `error?`.
   * @throws {@link ContextNotFoundError}; {@link CodeExecutionError} when the interpreter died.
   */
  async runCode(code: string, options: RunCodeOptions = {}): Promise<Execution> {
    if (options.onStdout || options.onStderr || options.onResult || options.onError) {
      const stream = await this.runCodeStream(code, options);
      const exec: Execution = { code, results: [], logs: { stdout: [], stderr: [] } };
      for await (const ev of stream) {
        switch (ev.type) {
          case 'start':
            exec.contextId = ev.contextId;
            break;
          case 'stdout':
            exec.logs.stdout.push(ev.text);
            options.onStdout?.({ text: ev.text, timestamp: ev.timestamp });
            break;
          case 'stderr':
            exec.logs.stderr.push(ev.text);
            options.onStderr?.({ text: ev.text, timestamp: ev.timestamp });
            break;
          case 'result':
            exec.results.push(ev.result);
            await options.onResult?.(ev.result);
            break;
          case 'error': {
            const e = (ev as { error?: { code?: string; message?: string } }).error;
            if (e?.code) throw createErrorFromResponse({ code: e.code, message: e.message ?? e.code, operation: 'context.runStream' });
            exec.error = toExecutionError(ev as unknown as Record<string, unknown>);
            options.onError?.(exec.error!);
            break;
          }
          case 'execution_complete':
            exec.executionCount = ev.executionCount;
            exec.timedOut = ev.timedOut;
            exec.duration = ev.duration;
            break;
          default:
            break;
        }
      }
      return exec;
    }
    const r = await this.call<Record<string, unknown>>('context.run', this.runArgs(code, options), { signal: options.signal });
    return {
      code,
      contextId: r.contextId as string | undefined,
      language: r.language as string | undefined,
      executionCount: r.executionCount as number | undefined,
      results: (r.results as Result[]) ?? [],
      logs: (r.logs as Execution['logs']) ?? { stdout: [], stderr: [] },
      error: toExecutionError(r.error as Record<string, unknown> | undefined),
      timedOut: r.timedOut as boolean | undefined,
      duration: r.duration as number | undefined,
    };
  }

  /**
   * Run code and stream its events as the cell produces them: `start`,
   * `stdout`/`stderr` `{text}`, `result` `{result}`, `error`
   * `{name, value, traceback}`, then `execution_complete`.
   */
  runCodeStream(code: string, options: RunCodeOptions = {}): Promise<EventStream<CodeEvent>> {
    return this.openStream<CodeEvent>('context.runStream', this.runArgs(code, options), { signal: options.signal });
  }

  /** Every code context of the sandbox. */
  async listCodeContexts(): Promise<CodeContext[]> {
    const r = await this.call<{ contexts: Record<string, unknown>[] }>('context.list');
    return (r.contexts ?? []).map(toDateContext);
  }

  /** Delete a code context (its interpreter process ends). @throws {@link ContextNotFoundError} */
  async deleteCodeContext(context: string | CodeContext): Promise<void> {
    await this.call('context.delete', { contextId: typeof context === 'string' ? context : context.id });
  }

  // -------------------------------------------------------------------------
  // Ports

  /**
   * Expose a port of the sandbox at a preview URL
   * `http://{port}-{sandbox}-{token}.{hostname}/`. Starts the container if
   * needed; re-exposing a port keeps its token.
   *
   * @param port - 1024–65535.
   * @param options - `hostname` (default: the deployment's preview domain), `token`, `name`.
   * @throws {@link InvalidPortError}; {@link PortAlreadyExposedError} when a custom token is taken;
   *   {@link ValidationFailedError} when the sandbox ID does not fit a DNS label.
   */
  async exposePort(port: number, options: ExposePortOptions = {}): Promise<ExposedPort> {
    const args: Record<string, unknown> = { port };
    if (options.hostname) args.hostname = options.hostname;
    if (options.token) args.token = options.token;
    if (options.name) args.name = options.name;
    const r = await this.call<ExposedPort & { success?: boolean }>('port.expose', args);
    const out: ExposedPort = { url: r.url, port: r.port };
    if (r.token !== undefined) out.token = r.token;
    if (r.name !== undefined) out.name = r.name;
    return out;
  }

  /** Withdraw a port's preview URL (at once). */
  async unexposePort(port: number): Promise<void> {
    await this.call('port.unexpose', { port });
  }

  /**
   * The preview URLs active for the running container: `[{url, port, status}]`.
   *
   * @param hostname - accepted for Cloudflare compatibility (URLs use the hostname they were exposed with).
   */
  async getExposedPorts(hostname?: string): Promise<ExposedPort[]> {
    void hostname;
    const r = await this.call<{ ports: ExposedPort[] }>('port.list');
    return r.ports ?? [];
  }

  // -------------------------------------------------------------------------
  // Terminal

  /**
   * Open the terminal of a session over WebSocket.
   *
   * @param sessionId - the session (default: the bound session, else `default`).
   * @param options - `cols`, `rows` (default 80×24), `shell` (default `bash`).
   * @returns a connected {@link Terminal}; `await term.ready` before typing.
   */
  async terminal(sessionId?: string, options: TerminalOptions = {}): Promise<Terminal> {
    await this.ensureConfigured();
    const sid = this.session(sessionId) ?? 'default';
    const url = this.terminalUrl(sid, options, false);
    const ws = await WebSocketClient.connect(new URL(url), {
      headers: this.state.client.authHeaders(),
      timeoutMs: options.timeoutMs,
      signal: options.signal,
    });
    return new Terminal(ws, sid);
  }

  /**
   * The `ws://` / `wss://` URL of a session's terminal, for clients that
   * connect themselves (a browser's `WebSocket`, xterm.js). The API key, if
   * any, is put in `?access_token=` unless `withToken` is false.
   */
  terminalUrl(sessionId?: string, options: Pick<TerminalOptions, 'cols' | 'rows' | 'shell'> = {}, withToken = true): string {
    const u = this.state.client.resolve(`/v1/sandboxes/${encodeURIComponent(this.state.id)}/terminal`);
    u.searchParams.set('session', this.session(sessionId) ?? 'default');
    if (options.cols !== undefined) u.searchParams.set('cols', String(options.cols));
    if (options.rows !== undefined) u.searchParams.set('rows', String(options.rows));
    if (options.shell !== undefined) u.searchParams.set('shell', options.shell);
    const key = this.state.client.key;
    if (withToken && key) u.searchParams.set('access_token', key);
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    return u.toString();
  }
}

/**
 * A session of a sandbox: a persistent shell whose cwd, variables and
 * functions carry from one command to the next. Has every method of
 * {@link SandboxOperations}, bound to the session.
 */
export class ExecutionSession extends SandboxOperations {
  /** The session ID. */
  readonly id: string;

  /** @internal Use `sandbox.createSession()` / `getSession()`. */
  constructor(state: SandboxState, id: string) {
    super(state, id);
    this.id = id;
  }

  /** The session's state: `{id, cwd, shellRunning, busy, queued}`. @throws {@link SessionNotFoundError} */
  async info(): Promise<SessionInfo> {
    const r = await this.call<{ session: SessionInfo }>('session.get', { id: this.id });
    return r.session;
  }

  /** Open this session's terminal (see {@link SandboxOperations.terminal}). */
  override terminal(sessionOrOptions?: string | TerminalOptions, options: TerminalOptions = {}): Promise<Terminal> {
    if (typeof sessionOrOptions === 'object') return super.terminal(this.id, sessionOrOptions);
    return super.terminal(sessionOrOptions ?? this.id, options);
  }
}

/**
 * A sandbox: an isolated Linux container with its files, sessions,
 * processes, interpreters and preview URLs. Made by {@link getSandbox};
 * nothing is created on the server until the first operation.
 */
export class Sandbox extends SandboxOperations {
  /** The sandbox ID. */
  readonly id: string;

  /** @internal Use `getSandbox()`. */
  constructor(client: SbxClient, id: string, options: SandboxOptions = {}) {
    super({ client, id, options: { ...options } });
    this.id = id;
  }

  /**
   * The sandbox's state, limits and usage (`state`, `generation`,
   * `limits`, `container.memoryBytes`, …).
   *
   * @throws {@link SandboxNotFoundError} when it does not exist (yet).
   */
  async status(): Promise<SandboxStatus> {
    const r = await this.state.client.call<{ sandbox: SandboxStatus }>(this.id, 'status');
    return r.sandbox;
  }

  /**
   * Create the sandbox now (otherwise the first operation does), optionally
   * with resource limits. `created: false` when it existed (its limits are
   * then unchanged).
   */
  async create(limits?: SandboxLimits): Promise<{ created: boolean; sandbox: SandboxStatus }> {
    return this.call('create', limits ? { limits } : {});
  }

  /** Start the container if needed and check that its agent answers. */
  ping(): Promise<{ pid: number; bound?: boolean }> {
    return this.call('ping');
  }

  /**
   * Stop the container and delete the sandbox (files, sessions, processes,
   * preview URLs). Idempotent. Later operations create a new sandbox.
   *
   * @returns `destroyed`: whether it existed.
   */
  async destroy(): Promise<{ success: boolean; destroyed: boolean; id?: string }> {
    const r = await this.state.client.call<{ success: boolean; destroyed: boolean; id?: string }>(this.id, 'destroy');
    this.state.configured = undefined; // a new sandbox would need its options again
    return r;
  }

  /**
   * Set `sleepAfter` / `keepAlive` now (`sandbox.configure`).
   *
   * @returns the values in force; `sleepAfter` in ms.
   */
  async configure(config: { sleepAfter?: string | number; keepAlive?: boolean }): Promise<{ sleepAfter: number; keepAlive: boolean }> {
    if (config.sleepAfter !== undefined) this.state.options.sleepAfter = config.sleepAfter;
    if (config.keepAlive !== undefined) this.state.options.keepAlive = config.keepAlive;
    const r = await this.state.client.call<{ sleepAfter: number; keepAlive: boolean }>(this.id, 'sandbox.configure', config);
    this.state.configured = Promise.resolve();
    return r;
  }

  /** Set the idle time before the container stops (`"30s"`, `"10m"`, seconds as a number). */
  async setSleepAfter(sleepAfter: string | number): Promise<void> {
    await this.configure({ sleepAfter });
  }

  /** Keep the container running regardless of idleness (`true`), or not. */
  async setKeepAlive(keepAlive: boolean): Promise<void> {
    await this.configure({ keepAlive });
  }

  /**
   * Create a session (a persistent shell).
   *
   * @param options - `id` (default `session-<ms>`), `env`, `cwd`, `commandTimeoutMs`.
   * @throws {@link SessionAlreadyExistsError} when the ID is taken.
   */
  async createSession(options: SessionOptions = {}): Promise<ExecutionSession> {
    const args: Record<string, unknown> = {};
    if (options.id !== undefined) args.id = options.id;
    if (options.env) args.env = options.env;
    if (options.cwd) args.cwd = options.cwd;
    if (options.commandTimeoutMs !== undefined) args.commandTimeoutMs = options.commandTimeoutMs;
    const r = await this.call<{ sessionId: string }>('session.create', args);
    return new ExecutionSession(this.state, r.sessionId ?? options.id);
  }

  /**
   * A handle on a session, without checking anything (as Cloudflare's SDK):
   * the first command creates the session if it does not exist. Use
   * `session.info()` to check.
   */
  async getSession(sessionId: string): Promise<ExecutionSession> {
    return new ExecutionSession(this.state, sessionId);
  }

  /**
   * Delete a session: kills its shell, everything it started and its
   * background processes.
   *
   * @throws {@link SessionNotFoundError}; {@link ValidationFailedError} for the default session.
   */
  async deleteSession(sessionId: string): Promise<{ success: boolean; sessionId: string; timestamp: string }> {
    const r = await this.call<{ success: boolean; sessionId: string }>('session.delete', { id: sessionId });
    return { ...r, timestamp: new Date().toISOString() };
  }

  /** Every session of the sandbox. */
  async listSessions(): Promise<SessionInfo[]> {
    const r = await this.call<{ sessions: SessionInfo[] }>('session.list');
    return r.sessions ?? [];
  }
}

/**
 * Get the sandbox named `id` (the Cloudflare SDK's `getSandbox`). Nothing
 * is sent until the first operation, which creates the sandbox if needed;
 * `sleepAfter` / `keepAlive` are sent (`sandbox.configure`) right before it.
 *
 * @param client - the {@link SbxClient} (where Cloudflare's takes the Durable Object namespace).
 * @param id - sandbox ID: 1–63 of `[a-z0-9-]`, no leading/trailing `-`
 *   (preview URLs need ≤ 40 characters).
 * @param options - {@link SandboxOptions}.
 */
export function getSandbox(client: SbxClient, id: string, options: SandboxOptions = {}): Sandbox {
  return new Sandbox(client, options.normalizeId ? id.toLowerCase() : id, options);
}

/**
 * Read a file stream (from `readFileStream`, or a raw SSE byte stream) as
 * content chunks: strings for text files, `Uint8Array`s for binary ones.
 * The generator's return value is the file's metadata.
 *
 * @throws the stream's `error` event as a {@link SandboxError}.
 */
export async function* streamFile(
  stream: AsyncIterable<FileStreamEvent> | ReadableStream<Uint8Array>,
): AsyncGenerator<string | Uint8Array, FileMetadata | undefined, undefined> {
  let meta: FileMetadata | undefined;
  for await (const ev of parseSSEStream<FileStreamEvent>(stream as AsyncIterable<FileStreamEvent>)) {
    if (ev.type === 'metadata') meta = { mimeType: ev.mimeType, size: ev.size, isBinary: ev.isBinary, encoding: ev.encoding };
    else if (ev.type === 'chunk') yield meta?.encoding === 'base64' ? new Uint8Array(Buffer.from(ev.data, 'base64')) : ev.data;
    else if (ev.type === 'error') throw createErrorFromResponse({ ...ev.error, operation: 'file.readStream' });
  }
  return meta;
}


/**
 * Read a whole file stream into memory: `content` is a string for text
 * files and a `Uint8Array` for binary ones.
 */
export async function collectFile(
  stream: AsyncIterable<FileStreamEvent> | ReadableStream<Uint8Array>,
): Promise<{ content: string | Uint8Array; metadata: FileMetadata }> {
  const parts: (string | Uint8Array)[] = [];
  const gen = streamFile(stream);
  let r = await gen.next();
  while (!r.done) {
    parts.push(r.value);
    r = await gen.next();
  }
  const metadata = r.value ?? { mimeType: 'application/octet-stream', size: 0, isBinary: false, encoding: 'utf-8' as const };
  if (metadata.isBinary || metadata.encoding === 'base64') {
    return { content: new Uint8Array(Buffer.concat(parts.map((p) => (typeof p === 'string' ? Buffer.from(p) : p)))), metadata };
  }
  return { content: parts.join(''), metadata };
}
