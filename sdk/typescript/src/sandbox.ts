/**
 * `Sandbox` and `ExecutionSession`: the `@cloudflare/sandbox` API over sbx.
 *
 * @module
 */

import type { SbxClient } from './client.js';
import {
  createErrorFromResponse,
  SandboxError,
  ValidationFailedError,
} from './errors.js';
import { parseSSEStream } from './sse.js';
import { EventStream } from './stream.js';
import { Terminal } from './terminal.js';
import type {
  CodeContext,
  CodeEvent,
  CreateContextOptions,
  Execution,
  ExposedPort,
  ExposePortOptions,
  FileMetadata,
  FileStreamEvent,
  Result,
  RunCodeOptions,
  NetworkSettings,
  SandboxLimits,
  SandboxOptions,
  SandboxStatus,
  SessionInfo,
  SessionOptions,
  TerminalOptions,
} from './types.js';
import { WebSocketClient } from './websocket.js';
import { SandboxFiles } from './sandbox_files.js';
import { toDateContext, toExecutionError, type SandboxState } from './sandbox_core.js';

export { EventIterable, type SessionArg } from './sandbox_core.js';

/**
 * The operations of a sandbox, optionally bound to one session. Both
 * {@link Sandbox} (the default session) and {@link ExecutionSession}
 * (a named one) are this; every method that runs in a session uses the
 * bound session unless its options name another.
 */
export class SandboxOperations extends SandboxFiles {

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
   * @param port - 1024–65535 (3000 too: sbx has no control plane in the sandbox).
   * @param options - `hostname` (default: the deployment's preview domain), `token`, `name`.
   * @throws {@link InvalidPortError}; {@link PortAlreadyExposedError} when a custom token is taken;
   *   {@link CustomDomainRequiredError} for a hostname that cannot carry wildcard preview URLs
   *   (`*.workers.dev` by default; the deployment's `--no-preview-host`);
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

  /**
   * Archive a directory of the sandbox into the node's backup store
   * (`backup.create`, docs/persistence.md "Backups"; the Cloudflare SDK's
   * createBackup). Starts the container if needed.
   *
   * @param options - `dir` (absolute in the sandbox), `name`, `ttl` (seconds, default 3 days),
   *   `excludes` (patterns as tar's --exclude), `gitignore` (true: also leave out what the tree's
   *   .gitignore files and .git/info/exclude ignore; docs/persistence.md "Backups").
   * @returns the backup: `{id, dir, size (bytes, compressed), digest}`; pass it to {@link restoreBackup}.
   * @throws FILE_NOT_FOUND / NOT_DIRECTORY for `dir`, BACKUP_TOO_LARGE, VALIDATION_FAILED (a relative dir or `..`).
   */
  async createBackup(options: { dir: string; name?: string; ttl?: number; excludes?: string[]; gitignore?: boolean }): Promise<{ id: string; dir: string; size: number; digest: string }> {
    const args: Record<string, unknown> = { dir: options.dir };
    if (options.name !== undefined) args.name = options.name;
    if (options.ttl !== undefined) args.ttl = options.ttl;
    if (options.excludes !== undefined) args.excludes = options.excludes;
    if (options.gitignore !== undefined) args.gitignore = options.gitignore;
    const r = await this.call<{ id: string; size: number; digest: string }>('backup.create', args);
    return { id: r.id, dir: options.dir, size: r.size, digest: r.digest };
  }

  /**
   * Replace a directory of this sandbox with a backup's content
   * (`backup.restore`; the Cloudflare SDK's restoreBackup): into `backup.dir`
   * unless `options.dir` names another. Any sandbox of the node may restore
   * any backup. The archive's digest is checked first: a corrupt one
   * throws STORAGE_ERROR and changes nothing.
   *
   * @throws BACKUP_NOT_FOUND, BACKUP_EXPIRED, STORAGE_ERROR.
   */
  async restoreBackup(backup: { id: string; dir?: string }, options: { dir?: string } = {}): Promise<{ success: boolean; id: string; dir: string }> {
    const dir = options.dir ?? backup.dir;
    if (!dir) throw new TypeError('restoreBackup: no dir (give backup.dir or options.dir)');
    return this.call('backup.restore', { id: backup.id, dir });
  }

  /**
   * Create new sandboxes whose workspace starts as a copy of this one's
   * (`sandbox.fork`, docs/persistence.md "Fork"), without stopping it: a
   * running sandbox's file system is frozen for the copy. Each fork gets
   * this sandbox's image, limits, disk size, environment and settings, and
   * is independent afterwards. This sandbox must have a persistent workspace.
   *
   * @param ids - 1 to 16 new sandbox IDs (in a cluster: owned by this sandbox's shard).
   * @returns `{from, ids, copyMs, copiedBytes}`.
   * @throws SANDBOX_NOT_FOUND, SANDBOX_EXISTS (an ID is taken), FORK_CROSS_SHARD,
   *   VALIDATION_FAILED (an ephemeral workspace, bad IDs).
   */
  async fork(ids: string[]): Promise<{ from: string; ids: string[]; copyMs?: number; copiedBytes?: number }> {
    return this.call('sandbox.fork', { ids });
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

  /**
   * Is `port` exposed for the current container? Answered from the
   * sandbox's record, as the SDK's: it neither creates, configures nor
   * wakes the sandbox, and does not count as activity (`port.list`, an
   * `observe` op). `false` for a sandbox that does not exist or is stopped.
   */
  async isPortExposed(port: number): Promise<boolean> {
    try {
      const r = await this.state.client.call<{ ports: ExposedPort[] }>(this.state.id, 'port.list');
      return (r.ports ?? []).some((p) => p.port === port);
    } catch (err) {
      if (err instanceof SandboxError && err.code === 'SANDBOX_NOT_FOUND') return false;
      throw err;
    }
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
    const url = this.terminalUrl(sid, options);
    const ws = await WebSocketClient.connect(new URL(url), {
      headers: this.state.client.authHeaders(),
      timeoutMs: options.timeoutMs,
      signal: options.signal,
    });
    return new Terminal(ws, sid);
  }

  /**
   * The `ws://` / `wss://` URL of a session's terminal, without credentials
   * (the API key never goes into a URL). For a browser's `WebSocket` against
   * a server with API keys, use {@link terminalUrlWithToken}.
   */
  terminalUrl(sessionId?: string, options: Pick<TerminalOptions, 'cols' | 'rows' | 'shell'> = {}): string {
    const u = this.state.client.resolve(`/v1/sandboxes/${encodeURIComponent(this.state.id)}/terminal`);
    u.searchParams.set('session', this.session(sessionId) ?? 'default');
    if (options.cols !== undefined) u.searchParams.set('cols', String(options.cols));
    if (options.rows !== undefined) u.searchParams.set('rows', String(options.rows));
    if (options.shell !== undefined) u.searchParams.set('shell', options.shell);
    u.protocol = u.protocol === 'https:' ? 'wss:' : 'ws:';
    return u.toString();
  }

  /**
   * {@link terminalUrl} with a short-lived token in `?access_token=` when the
   * client has an API key: minted by `POST /v1/sandboxes/{id}/url-token?purpose=terminal`,
   * it opens this sandbox's terminal only, for 60 s (connect within that;
   * the connection then lasts). Hand it to a browser instead of the key.
   */
  async terminalUrlWithToken(sessionId?: string, options: Pick<TerminalOptions, 'cols' | 'rows' | 'shell'> = {}): Promise<string> {
    const u = new URL(this.terminalUrl(sessionId, options));
    if (this.state.client.key) {
      const r = await this.state.client.requestJson<{ token: string }>({
        method: 'POST',
        path: `/v1/sandboxes/${encodeURIComponent(this.state.id)}/url-token?purpose=terminal`,
        idempotencyKey: false,
        operation: 'url-token',
      });
      u.searchParams.set('access_token', r.token);
    }
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
   * with resource limits and a network (docs/network.md: `{ mode: 'egress',
   * allow: ['203.0.113.0/24:443'], deny: [...] }`; a rule inside an
   * always-denied range is VALIDATION_FAILED naming it). `created: false`
   * when it existed (its limits are then unchanged; new network rules apply
   * to new connections at once, a new mode from its next container).
   */
  async create(limits?: SandboxLimits, network?: NetworkSettings): Promise<{ created: boolean; sandbox: SandboxStatus }> {
    return this.call('create', { ...(limits ? { limits } : {}), ...(network ? { network } : {}) });
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
  async configure(config: { sleepAfter?: string | number; keepAlive?: boolean; network?: NetworkSettings }): Promise<{ sleepAfter: number; keepAlive: boolean }> {
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
