/**
 * `@sbx/sandbox` — the TypeScript SDK of sbx, a self-hosted code-execution
 * sandbox runtime. Its API is the shape of `@cloudflare/sandbox`: port a
 * program by changing the import and the `getSandbox` call.
 *
 * ```ts
 * import { SbxClient, getSandbox } from '@sbx/sandbox';
 *
 * const sandbox = getSandbox(new SbxClient(), 'my-sandbox');
 * const r = await sandbox.exec('echo hello');
 * console.log(r.stdout);
 * ```
 *
 * @packageDocumentation
 */

import { Process as ProcessClass } from './process.js';

export { SbxClient } from './client.js';
export type { SbxClientOptions, RetryOptions } from './client.js';
export { Sandbox, ExecutionSession, SandboxOperations, EventIterable, getSandbox, streamFile, collectFile } from './sandbox.js';
export type { SessionArg } from './sandbox.js';
export { Process } from './process.js';
export { EventStream } from './stream.js';
export { Terminal } from './terminal.js';
export type { TerminalExit } from './terminal.js';
export { WebSocketClient } from './websocket.js';
export type { WebSocketConnectOptions } from './websocket.js';
export { parseSSEStream, SSEParser } from './sse.js';
export type { SSEMessage } from './sse.js';
export * from './errors.js';
export type * from './types.js';
/** The wire shapes of every operation, generated from runtime/ops.yaml (`ops.ExecArgs`, `ops.Ops`, …). */
export type * as ops from './generated/ops.js';

/** Is this value an {@link ExecResult} (has `exitCode`, `stdout`, `stderr`, `success`)? */
export function isExecResult(value: unknown): value is import('./types.js').ExecResult {
  const v = value as Record<string, unknown> | null;
  return !!v && typeof v === 'object' && typeof v.exitCode === 'number' && typeof v.stdout === 'string' && typeof v.success === 'boolean';
}

/** Is this value a {@link Process}? */
export function isProcess(value: unknown): value is import('./process.js').Process {
  return value instanceof ProcessClass;
}

/** Is this string a {@link ProcessStatus}? */
export function isProcessStatus(value: unknown): value is import('./types.js').ProcessStatus {
  return typeof value === 'string' && ['starting', 'running', 'completed', 'failed', 'killed', 'error'].includes(value);
}
