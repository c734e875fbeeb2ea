/**
 * Background processes.
 *
 * @module
 */

import type { SandboxProcesses } from './sandbox_processes.js';
import type {
  ProcessInfo,
  ProcessLogs,
  ProcessStatus,
  WaitForExitResult,
  WaitForLogResult,
  WaitForPortOptions,
  WaitForPortResult,
  LogEvent,
} from './types.js';
import type { EventStream } from './stream.js';

/**
 * A background process started with `startProcess()` (or found with
 * `getProcess()` / `listProcesses()`).
 *
 * The fields are a snapshot from when the object was made; call
 * {@link Process.getStatus} or {@link Process.refresh} for the current state.
 */
export class Process {
  /** The process ID (`processId`). */
  readonly id: string;
  /** Its pid inside the sandbox. */
  pid?: number;
  /** The command line. */
  readonly command: string;
  /** `running`, `completed` (exit 0), `failed` (exit ≠ 0), `killed` or `error`. */
  status: ProcessStatus;
  /** When it started. */
  startTime: Date;
  /** When it ended. */
  endTime?: Date;
  /** Its exit code, once ended. */
  exitCode?: number;
  /** Why it ended (`EXITED`, `KILLED`, `TIMEOUT`, …). */
  cause?: string;
  /** The session it was started in. */
  sessionId?: string;
  /** Its log stream's ID (`proc:<id>`). */
  readonly streamId: string;

  private readonly ops: SandboxProcesses;

  /** @internal Made by the Sandbox methods. */
  constructor(ops: SandboxProcesses, info: ProcessInfo) {
    this.ops = ops;
    this.id = info.id;
    this.command = info.command;
    this.status = info.status;
    this.startTime = new Date(info.startTime ?? Date.now());
    this.streamId = `proc:${info.id}`;
    this.apply(info);
  }

  /** @internal */
  apply(info: ProcessInfo): this {
    this.pid = info.pid ?? this.pid;
    this.status = info.status ?? this.status;
    if (info.startTime) this.startTime = new Date(info.startTime);
    this.endTime = info.endTime ? new Date(info.endTime) : this.endTime;
    this.exitCode = info.exitCode ?? this.exitCode;
    this.cause = info.cause ?? this.cause;
    this.sessionId = info.sessionId ?? this.sessionId;
    return this;
  }

  /**
   * Kill the process: SIGTERM to its whole tree, SIGKILL 5 s later. Resolves
   * when it ended (exit code 143 or 137, status `killed`).
   *
   * @param signal - accepted for Cloudflare compatibility; ignored (always TERM then KILL).
   * @throws {@link ProcessNotFoundError}
   */
  async kill(signal?: string | number): Promise<void> {
    const r = await this.ops.killProcess(this.id, signal);
    this.status = 'killed';
    if (typeof r.exitCode === 'number') this.exitCode = r.exitCode;
  }

  /** The current status; `'error'` if the process is no longer known. */
  async getStatus(): Promise<ProcessStatus> {
    const p = await this.ops.getProcess(this.id);
    if (!p) return 'error';
    this.apply(p.toJSON());
    return this.status;
  }

  /** Reload every field from the server. @throws {@link ProcessNotFoundError} */
  async refresh(): Promise<this> {
    const p = await this.ops.getProcess(this.id);
    if (!p) return this;
    return this.apply(p.toJSON());
  }

  /** Its output so far (the newest 2 MiB of the log ring). */
  getLogs(): Promise<ProcessLogs> {
    return this.ops.getProcessLogs(this.id);
  }

  /** Its log events: the buffered output first, then live output, ending with `exit`. */
  streamLogs(options: { signal?: AbortSignal } = {}): Promise<EventStream<LogEvent>> {
    return this.ops.streamProcessLogs(this.id, options);
  }

  /**
   * Wait for the first line of stdout or stderr — already printed or to
   * come — that contains `pattern` (a string) or matches it (a RegExp,
   * evaluated by the SDK with JavaScript semantics).
   *
   * @param pattern - substring or regular expression.
   * @param timeout - give up after this many ms (default: no limit).
   * @returns `{line, match?}`; `match` is the RegExp match (whole, then groups).
   * @throws {@link ProcessReadyTimeoutError} after `timeout`;
   *   {@link ProcessExitedBeforeReadyError} if the process ends first.
   */
  waitForLog(pattern: string | RegExp, timeout?: number): Promise<WaitForLogResult> {
    return this.ops.waitForLog(this.id, pattern, timeout);
  }

  /**
   * Wait until `port` answers: HTTP (`mode: 'http'`, default: a GET of
   * `path` with a status in `status`, default 200–399) or TCP (`mode: 'tcp'`).
   *
   * @throws {@link ProcessReadyTimeoutError} after `options.timeout` ms;
   *   {@link ProcessExitedBeforeReadyError} if the process ends first.
   */
  waitForPort(port: number, options: WaitForPortOptions = {}): Promise<WaitForPortResult> {
    return this.ops.waitForPort(this.id, port, options);
  }

  /**
   * Wait until the process ends.
   *
   * @param timeout - give up after this many ms (`RequestTimeoutError`); default: no limit.
   * @returns its exit code and final status.
   */
  async waitForExit(timeout?: number): Promise<WaitForExitResult> {
    const r = await this.ops.waitForExit(this.id, timeout);
    this.exitCode = r.exitCode;
    if (r.status) this.status = r.status;
    return r;
  }

  /** The process as a plain {@link ProcessInfo}. */
  toJSON(): ProcessInfo {
    const o: ProcessInfo = {
      id: this.id,
      command: this.command,
      status: this.status,
      startTime: this.startTime.toISOString(),
    };
    if (this.pid !== undefined) o.pid = this.pid;
    if (this.endTime) o.endTime = this.endTime.toISOString();
    if (this.exitCode !== undefined) o.exitCode = this.exitCode;
    if (this.cause !== undefined) o.cause = this.cause;
    if (this.sessionId !== undefined) o.sessionId = this.sessionId;
    return o;
  }
}
