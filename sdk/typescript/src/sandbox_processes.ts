/**
 * `SandboxOperations`' background processes (sandbox.ts has the class).
 *
 * @module
 */

import {
  ProcessExitedBeforeReadyError,
  ProcessNotFoundError,
  ProcessReadyTimeoutError,
  SandboxError,
} from './errors.js';
import { Process } from './process.js';
import { EventStream } from './stream.js';
import type {
  LogEvent,
  ProcessInfo,
  ProcessLogs,
  ProcessOptions,
  WaitForExitResult,
  WaitForLogResult,
  WaitForPortOptions,
  WaitForPortResult,
} from './types.js';
import { SandboxCore } from './sandbox_core.js';

/** A link of {@link SandboxOperations}: background processes (not exported by the package). */
export class SandboxProcesses extends SandboxCore {
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

}
