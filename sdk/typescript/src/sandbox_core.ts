/**
 * The base of `SandboxOperations` (sandbox.ts): the sandbox's state and
 * plumbing, and commands (exec, exec streams). Internal: the SDK exports
 * `SandboxOperations`, whose methods these are.
 *
 * @module
 */

import type http from 'node:http';
import { isNetworkError, sleep, type SbxClient } from './client.js';
import {
  createErrorFromResponse,
  SandboxError,
  ValidationFailedError,
} from './errors.js';
import { EventStream, openOperationStream, openStreamResponse } from './stream.js';
import type {
  CodeContext,
  ExecEvent,
  ExecOptions,
  ExecResult,
  ExecutionError,
  SandboxOptions,
  StreamEventBase,
  StreamOptions,
} from './types.js';

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
export interface SandboxState {
  client: SbxClient;
  id: string;
  options: SandboxOptions;
  configured?: Promise<void>;
}

export function sessionOf(arg: SessionArg): string | undefined {
  return typeof arg === 'string' ? arg : arg?.sessionId;
}

export function stdinArg(stdin: string | Uint8Array | undefined): string | undefined {
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

export function toDateContext(c: Record<string, unknown>): CodeContext {
  return {
    id: String(c.id),
    language: String(c.language),
    cwd: String(c.cwd ?? '/workspace'),
    createdAt: new Date((c.createdAt as string) ?? Date.now()),
    lastUsed: new Date((c.lastUsed as string) ?? Date.now()),
    mode: c.mode as string | undefined,
  };
}

export function toExecutionError(e: Record<string, unknown> | undefined): ExecutionError | undefined {
  if (!e) return undefined;
  const value = String(e.value ?? e.message ?? '');
  return { name: String(e.name ?? 'Error'), value, message: value, traceback: (e.traceback as string[]) ?? [] };
}

/** Single-quote a string for a POSIX shell. */
export function shq(s: string): string {
  return `'${s.replace(/'/g, `'\\''`)}'`;
}

/** The first link of {@link SandboxOperations}: state, plumbing, commands (not exported by the package). */
export class SandboxCore {
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

  /**
   * @internal Before the first operation, once: `create` with the image when
   * options name one, then `sandbox.configure` when options ask for it.
   */
  protected ensureConfigured(): Promise<void> {
    const o = this.state.options;
    const configure = o.sleepAfter !== undefined || o.keepAlive !== undefined;
    if (!configure && o.image === undefined) return Promise.resolve();
    if (!this.state.configured) {
      const args: Record<string, unknown> = {};
      if (o.sleepAfter !== undefined) args.sleepAfter = o.sleepAfter;
      if (o.keepAlive !== undefined) args.keepAlive = o.keepAlive;
      const client = this.state.client;
      const id = this.state.id;
      const created: Promise<unknown> =
        o.image !== undefined
          ? client.call(id, 'create', o.startImage ? { image: o.image, start: true } : { image: o.image })
          : Promise.resolve();
      this.state.configured = created
        .then(() => (configure ? client.call(id, 'sandbox.configure', args) : undefined))
        .then(
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

}
