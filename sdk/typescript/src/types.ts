/**
 * Shapes of the arguments, results and stream events (docs/protocol.md;
 * field names are the Cloudflare Sandbox SDK's).
 *
 * Units: durations and timeouts are milliseconds; sizes are bytes; `…At`
 * fields and `startTime`/`endTime` are ISO 8601 strings unless stated;
 * stream event `timestamp`s are milliseconds since the Unix epoch.
 *
 * The shapes that are the server's as they are (`SandboxLimits`,
 * `SessionInfo`, `FileInfo`, `ExposedPort`, `WaitForLogResult`,
 * `WaitForPortResult`) derive
 * from the generated
 * `./generated/ops.ts` (runtime/ops.yaml); the others are the SDK's own
 * (Cloudflare's names, `Date`s, callbacks, computed fields).
 *
 * @module
 */

import type * as Wire from './generated/ops.js';

// ---------------------------------------------------------------------------
// Sandboxes

/** Options of `getSandbox()`. */
export interface SandboxOptions {
  /**
   * Idle time before the container is stopped: `"30s"`, `"10m"`, `"1h"`, or
   * a number of seconds (1 s … 365 days). Sent with `sandbox.configure`
   * before the first operation. Default: the server's (10 minutes).
   */
  sleepAfter?: string | number;
  /** `true`: never stop the container for idleness (call `destroy()` yourself). Sent with `sandbox.configure`. */
  keepAlive?: boolean;
  /**
   * An image of the node's store (a name such as `"myorg/py:3.12"`, or a
   * digest; docs/images.md) to run instead of the host's `/usr`. Sent with
   * `create` before the first operation; a sandbox that already exists keeps
   * the image it was created with.
   */
  image?: string;
  /**
   * With `image`: start the image's Entrypoint + Cmd as the background
   * process `image-start` of every container the sandbox gets (`create
   * {image, start: true}`, docs/images.md). Default `false`.
   */
  startImage?: boolean;
  /** Lower-case the sandbox ID (preview URLs need lower-case IDs). Default `false`. */
  normalizeId?: boolean;
  /**
   * `false`: commands without an explicit `sessionId` run as fresh processes
   * (`sessionless`), not in the shared default shell. Default `true`.
   */
  enableDefaultSession?: boolean;
}

/** Resource limits of a sandbox (`create`'s `limits`: bytes, tasks, millicpus; runtime/ops.yaml). */
export interface SandboxLimits extends NonNullable<Wire.CreateArgs['limits']> {}

/** A sandbox's network (`create`/`configure`'s `network`; docs/network.md):
 * `mode` none | egress, `allow` / `deny` rules "CIDR[:PORT]". */
export interface NetworkSettings extends Wire.NetworkSettings {}

/** The `sandbox` object of `status()` (docs/protocol.md "status"). */
export interface SandboxStatus {
  /** The sandbox ID. */
  id: string;
  /** `running`, `starting`, `stopping`, `stopped` or `destroying`. */
  state: string;
  /** Creation time, ms since the epoch. */
  createdAt: number;
  /** Containers started so far. */
  generation: number;
  /** Containers that ended unexpectedly. */
  restarts: number;
  /** Name of the shard that owns the sandbox. */
  shard: string;
  /** Last operation, ms since the epoch. */
  lastActivityAt: number;
  /** Resource limits in force (bytes, tasks, millicpus). */
  limits: Required<SandboxLimits>;
  /** Idle time before the container stops, ms. */
  sleepAfter?: number;
  /** `true`: never stopped for idleness. */
  keepAlive?: boolean;
  /** Network mode and rules; while running its address and counters (docs/network.md). */
  network?: NonNullable<Wire.SandboxStatus['network']>;
  /** Why the last container ended, if unexpectedly. */
  lastExit?: Record<string, unknown>;
  /** While running: host pid, memory (bytes), CPU usage (µs), … */
  container?: {
    pid: number;
    uid: number;
    startUs: number;
    memoryBytes: number;
    memoryPeakBytes: number;
    pids: number;
    cpuUsageUs: number;
    oomKills: number;
    pidsLimitHits: number;
  };
  [key: string]: unknown;
}

// ---------------------------------------------------------------------------
// Commands

/** Options of `exec()`. */
export interface ExecOptions {
  /** Kill the command's whole process tree after this many ms; the result then has exit code 124 and `timedOut: true`. */
  timeout?: number;
  /** Environment for this command only. `undefined` values are left out. */
  env?: Record<string, string | undefined>;
  /** Working directory for this command only (must exist, else `ValidationFailedError`). */
  cwd?: string;
  /** Session to run in (created on first use). Default: the default session. */
  sessionId?: string;
  /** Run as a fresh process instead of in a session's shell (concurrently with anything else). */
  sessionless?: boolean;
  /** Bytes for the command's stdin (text, or UTF-8 bytes: the HTTP API carries strings). Default: `/dev/null`. */
  stdin?: string | Uint8Array;
  /** Run over the streaming route and report output as it comes (`onOutput`). Implied by `onOutput`. */
  stream?: boolean;
  /** Called with each chunk of output (streaming mode). */
  onOutput?: (stream: 'stdout' | 'stderr', data: string) => void;
  /** Called with the result when the command ends. */
  onComplete?: (result: ExecResult) => void;
  /** Called with the error when the command fails (before the promise rejects). */
  onError?: (error: Error) => void;
  /** Abort the call (the connection is closed; in streaming mode the command is cancelled). */
  signal?: AbortSignal;
}

/** Result of `exec()`. A non-zero exit code is a result, not an exception. */
export interface ExecResult {
  /** `exitCode === 0` and not timed out. */
  success: boolean;
  /** Exit status; 124 after a timeout, 128+N when killed by signal N. */
  exitCode: number;
  /** Standard output (UTF-8; invalid bytes become U+FFFD). */
  stdout: string;
  /** Standard error. */
  stderr: string;
  /** The command as given. */
  command: string;
  /** Run time measured in the sandbox, ms. */
  duration: number;
  /** When the result was received, ISO 8601. */
  timestamp: string;
  /** The session it ran in (absent when sessionless). */
  sessionId?: string;
  /** The timeout fired. */
  timedOut?: boolean;
  /** It was stopped at the request's deadline rather than its own `timeout` (exit 124). */
  deadlineExceeded?: boolean;
  /** Why it ended: `EXITED`, `TIMEOUT`, `KILLED`, `OOM_KILLED`, `PIDS_LIMIT`. */
  cause?: string;
  /** The signal that ended it, if any. */
  signal?: number;
  /** Output beyond the server's cap (32 MiB per stream) was dropped. */
  stdoutTruncated?: boolean;
  /** Standard error beyond the cap was dropped. */
  stderrTruncated?: boolean;
  /** Bytes produced, kept or not. */
  stdoutBytes?: number;
  /** Bytes of standard error produced, kept or not. */
  stderrBytes?: number;
  /** Present on the first operation after the previous container ended unexpectedly. */
  containerRestarted?: boolean;
}

/** Options of `execStream()`. */
export interface StreamOptions {
  /** Kill the command after this many ms (its `complete` event then has exit code 124, `timedOut: true`). */
  timeout?: number;
  /** Environment for this command only. */
  env?: Record<string, string | undefined>;
  /** Working directory for this command only (must exist). */
  cwd?: string;
  /** Session to run in. Default: the default session. */
  sessionId?: string;
  /** Run as a fresh process instead of in a session. */
  sessionless?: boolean;
  /** Text for the command's stdin (default `/dev/null`). */
  stdin?: string | Uint8Array;
  /**
   * Closes the connection when aborted; iteration then throws the signal's
   * reason. The stream stays on the server for `resumeStream()` (unlike
   * `cancel()` or leaving a `for await` early, which stop the command).
   */
  signal?: AbortSignal;
  /** Accepted for Cloudflare compatibility; unused. */
  bufferSize?: number;
}

/** Fields every stream event has. */
export interface StreamEventBase {
  /** Event type. */
  type: string;
  /** Sequence number (1, 2, 3, …), also the SSE `id:`. Absent on synthetic `gap` events. */
  seq?: number;
  /** When the event was produced, ms since the epoch. */
  timestamp?: number;
}

/**
 * Events were lost between two connections of a stream (a process-log ring
 * that overwrote them, or a resume that could not replay them): `missed`
 * events are not delivered.
 */
export interface GapEvent extends StreamEventBase {
  type: 'gap';
  /** Number of events not delivered. */
  missed: number;
}

/** A stream ended with an error instead of its normal last event. */
export interface StreamErrorEvent extends StreamEventBase {
  type: 'error';
  /** The error: `code` (see the error classes), `message`, `context`. */
  error: { code: string; message: string; context?: Record<string, unknown> };
}

/** Events of `execStream()`: `start`, then `stdout`/`stderr`, then `complete` (or `error`). */
export type ExecEvent =
  | (StreamEventBase & { type: 'start'; command: string; sessionId?: string; pid?: number })
  | (StreamEventBase & { type: 'stdout' | 'stderr'; data: string })
  | (StreamEventBase & {
      type: 'complete';
      exitCode: number;
      success: boolean;
      duration: number;
      timedOut: boolean;
      timeout?: number;
      cancelled?: boolean;
      signal?: number;
      cause?: string;
      sessionId?: string;
    })
  | StreamErrorEvent
  | GapEvent;

// ---------------------------------------------------------------------------
// Sessions

/** Options of `createSession()`. */
export interface SessionOptions {
  /** Session ID. Default `session-<ms>`. */
  id?: string;
  /** Accepted for Cloudflare compatibility; sbx sessions have only an ID. */
  name?: string;
  /** Environment variables of the session (added to the sandbox's). */
  env?: Record<string, string>;
  /** Initial working directory (default `/workspace`). */
  cwd?: string;
  /** Default `timeout` of the session's commands, ms. */
  commandTimeoutMs?: number;
  /** Accepted for Cloudflare compatibility; ignored. */
  isolation?: boolean;
}

/** A session as `session.get` describes it (runtime/ops.yaml `SessionInfo`). */
export interface SessionInfo extends Wire.SessionInfo {}

// ---------------------------------------------------------------------------
// Processes

/** Status of a background process. */
export type ProcessStatus = 'starting' | 'running' | 'completed' | 'failed' | 'killed' | 'error';

/**
 * A background process as the server describes it: runtime/ops.yaml's
 * `ProcessInfo`, but `status` is the SDK's {@link ProcessStatus} (with
 * Cloudflare's `error`), so it is not derived from the generated type.
 */
export interface ProcessInfo {
  /** The process ID. */
  id: string;
  /** Its pid inside the sandbox. */
  pid?: number;
  /** The command line (its first 4 KiB when `commandTruncated`). */
  command: string;
  /** The command was longer than what is kept; `commandBytes` is its whole length. */
  commandTruncated?: boolean;
  /** Bytes of the whole command, when shortened. */
  commandBytes?: number;
  /** Its status. */
  status: ProcessStatus;
  /** ISO 8601. */
  startTime: string;
  /** ISO 8601, once ended. */
  endTime?: string;
  /** Exit code, once ended (143/137 when killed). */
  exitCode?: number;
  /** Why it ended: `EXITED`, `KILLED`, `TIMEOUT`, `OOM_KILLED`, …. */
  cause?: string;
  /** The signal that ended it, if any. */
  signal?: number;
  /** The session it was started in. */
  sessionId?: string;
}

/** Options of `startProcess()`. */
export interface ProcessOptions {
  /** Process ID (1–120 of `[A-Za-z0-9._-]`); default `proc-<n>`. An ID in use is `ResourceBusyError`. */
  processId?: string;
  /** Start in this session's cwd and environment (killed when the session is deleted). */
  sessionId?: string;
  /** Start outside any session. */
  sessionless?: boolean;
  /** Kill the process after this many ms (status `killed`). */
  timeout?: number;
  /** Extra environment variables. */
  env?: Record<string, string | undefined>;
  /** Working directory (must exist). */
  cwd?: string;
  /** Accepted for Cloudflare compatibility; output is text. */
  encoding?: string;
  /** Accepted for Cloudflare compatibility; ignored. */
  autoCleanup?: boolean;
  /** Called once the process started. */
  onStart?: (process: import('./process.js').Process) => void;
  /** Called with each chunk of output (a background subscription to its log stream). */
  onOutput?: (stream: 'stdout' | 'stderr', data: string) => void;
  /** Called with the exit code when the process ends (`null` if unknown). */
  onExit?: (exitCode: number | null) => void;
  /** Called when the background log subscription fails. */
  onError?: (error: Error) => void;
}

/** Result of `getLogs()` / `getProcessLogs()`. */
export interface ProcessLogs {
  /** The process ID. */
  processId: string;
  /** The newest stdout kept (the log ring holds 2 MiB). */
  stdout: string;
  /** The newest stderr kept. */
  stderr: string;
  /** Older output was dropped from the ring. */
  truncated?: boolean;
  /** The process status when the logs were read. */
  status?: ProcessStatus;
}

/** Events of `streamProcessLogs()`. */
export type LogEvent =
  | (StreamEventBase & { type: 'process_info'; processId: string; command: string; status: ProcessStatus; pid?: number })
  | (StreamEventBase & { type: 'stdout' | 'stderr'; data: string; processId: string })
  | (StreamEventBase & { type: 'exit'; processId: string; exitCode: number; status: ProcessStatus; cause?: string; data?: string })
  | StreamErrorEvent
  | GapEvent;

/** Result of `waitForLog()` (runtime/ops.yaml `process.waitForLog`). */
export interface WaitForLogResult extends Wire.ProcessWaitForLogResult {}

/** Options of `waitForPort()`. */
export interface WaitForPortOptions {
  /** `http` (default): GET `path` until the status is accepted; `tcp`: until a connection succeeds. */
  mode?: 'http' | 'tcp';
  /** HTTP path (default `/`). */
  path?: string;
  /** Accepted status: one code, or a range (default 200–399). */
  status?: number | { min: number; max: number };
  /** Give up after this many ms (`ProcessReadyTimeoutError`). */
  timeout?: number;
  /** Interval between checks, ms (default 500). */
  interval?: number;
}

/** Result of `waitForPort()` (runtime/ops.yaml `process.waitForPort`). */
export interface WaitForPortResult extends Wire.ProcessWaitForPortResult {}

/** Result of `waitForExit()`. */
export interface WaitForExitResult {
  /** The exit code. */
  exitCode: number;
  /** The final status (`completed`, `failed`, `killed`). */
  status?: ProcessStatus;
}

// ---------------------------------------------------------------------------
// Files

/** Text encodings of file contents. */
export type FileEncoding = 'utf-8' | 'utf8' | 'base64';

/** Result of `writeFile()`. */
export interface WriteFileResult {
  /** Always `true` (failures throw). */
  success: boolean;
  /** Absolute path written. */
  path: string;
  /** Bytes written. */
  bytesWritten?: number;
  /** ISO 8601. */
  timestamp: string;
}

/** Result of `readFile()`. */
export interface ReadFileResult {
  /** Always `true` (failures throw). */
  success: boolean;
  /** Absolute path. */
  path: string;
  /** The content: text for `utf-8`, base64 for `base64`. */
  content: string;
  /** How `content` is encoded. */
  encoding: 'utf-8' | 'base64';
  /** The first 8 KiB are not valid UTF-8 or contain NUL. */
  isBinary: boolean;
  /** MIME type from the first bytes or the extension. */
  mimeType: string;
  /** Size in bytes. */
  size: number;
  /** ISO 8601. */
  timestamp: string;
}

/** Events of `readFileStream()`: `metadata`, `chunk`s, then `complete` (or `error`). */
export type FileStreamEvent =
  | (StreamEventBase & { type: 'metadata'; path?: string; mimeType: string; size: number; isBinary: boolean; encoding: 'utf-8' | 'base64' })
  /** `data` is text, or base64 when the file is binary (as in Cloudflare's SDK). */
  | (StreamEventBase & { type: 'chunk'; data: string })
  | (StreamEventBase & { type: 'complete'; bytesRead: number })
  | StreamErrorEvent
  | GapEvent;

/** Metadata of a streamed file. */
export interface FileMetadata {
  /** MIME type. */
  mimeType: string;
  /** Size in bytes. */
  size: number;
  /** The file is binary. */
  isBinary: boolean;
  /** Encoding of the `chunk` events' data. */
  encoding: 'utf-8' | 'base64';
}

/** One entry of `listFiles()` (runtime/ops.yaml `FileInfo`). */
export interface FileInfo extends Wire.FileInfo {}

/** Result of `listFiles()`. */
export interface ListFilesResult {
  /** Always `true` (failures throw). */
  success: boolean;
  /** The listed directory (absolute). */
  path: string;
  /** The entries. */
  files: FileInfo[];
  /** Number of entries. */
  count: number;
  /** More than 100 000 entries: the list was cut. */
  truncated?: boolean;
  /** ISO 8601. */
  timestamp?: string;
}

/** Options of `watch()`. */
export interface WatchOptions {
  /** Watch subdirectories too (default `true`). */
  recursive?: boolean;
  /** Only report paths matching one of these fnmatch(3) globs. */
  include?: string[];
  /** Do not report paths matching these globs (default `.git`, `node_modules`, `.DS_Store`). */
  exclude?: string[];
  /** Resolve a relative path against this session's cwd. */
  sessionId?: string;
  /** Disconnects when aborted (the watch stays until `cancel()` or 5 minutes unread). */
  signal?: AbortSignal;
}

/** Options of `checkChanges()`: those of `watch()` plus `since`. */
export interface CheckChangesOptions extends Omit<WatchOptions, 'signal'> {
  /** A `version` an earlier `checkChanges()` returned (absent: the first call). */
  since?: string;
}

/**
 * Result of `checkChanges()` (the Cloudflare SDK's CheckChangesResult):
 * `unchanged` / `changed` compared with `since`, with the current
 * `version`; or `resync` when the state `since` names is gone, `reason`
 * `expired` (dropped in this container: idle 10 min, its directory deleted)
 * or `restarted` (the sandbox's container was restarted since).
 */
export interface CheckChangesResult extends Wire.FileCheckChangesResult {
  status: 'unchanged' | 'changed' | 'resync';
  version: string;
}

/** Events of `watch()`. */
export type FileWatchEvent =
  | (StreamEventBase & { type: 'watching'; path: string; watchId: string })
  | (StreamEventBase & {
      type: 'event';
      eventType: 'create' | 'modify' | 'delete' | 'move_from' | 'move_to' | 'attrib';
      path: string;
      isDirectory: boolean;
    })
  | (StreamEventBase & { type: 'stopped'; reason?: string })
  | StreamErrorEvent
  | GapEvent;

// ---------------------------------------------------------------------------
// Git

/** Options of `gitCheckout()`. */
export interface GitCheckoutOptions {
  /** Branch to check out (default: the remote's default). */
  branch?: string;
  /** Default `/workspace/<repository name>`. */
  targetDir?: string;
  /** Resolve a relative `targetDir` against this session's cwd. */
  sessionId?: string;
  /** Shallow clone depth. */
  depth?: number;
  /** Clone timeout, ms (default 600 000). */
  cloneTimeoutMs?: number;
}

/** Result of `gitCheckout()`. */
export interface GitCheckoutResult {
  /** Always `true` (failures throw). */
  success: boolean;
  /** The repository URL. */
  repoUrl: string;
  /** The branch actually checked out. */
  branch: string;
  /** Where it was cloned. */
  targetDir: string;
  /** ISO 8601. */
  timestamp: string;
}

// ---------------------------------------------------------------------------
// Ports

/** Options of `exposePort()`. */
export interface ExposePortOptions {
  /** Preview domain (default: the deployment's, `localhost:<port>` for `sbxd dev`). */
  hostname?: string;
  /** Custom token, 1–16 of `[a-z0-9_]` (default: a random one; re-exposing keeps it). */
  token?: string;
  /** A label for the port. */
  name?: string;
}

/** Result of `exposePort()`: `url` is `http://{port}-{sandbox}-{token}.{hostname}/` (runtime/ops.yaml `ExposedPort`). */
export interface ExposedPort extends Wire.ExposedPort {}

// ---------------------------------------------------------------------------
// Code interpreter

/** Interpreter languages (aliases `python3`, `js`, `node`, `ts` are accepted too). */
export type CodeLanguage = 'python' | 'javascript' | 'typescript';

/** Options of `createCodeContext()`. */
export interface CreateContextOptions {
  /** Interpreter (default `python`). */
  language?: CodeLanguage | 'python3' | 'js' | 'node' | 'ts';
  /** Working directory (default `/workspace`). */
  cwd?: string;
  /** Environment variables of the interpreter process. */
  envVars?: Record<string, string>;
  /** Accepted for Cloudflare compatibility; unused. */
  timeout?: number;
}

/** A code context: one interpreter process whose state persists across runs. */
export interface CodeContext {
  /** Context ID (for `runCode({context})`). */
  id: string;
  /** Its language. */
  language: string;
  /** Its working directory. */
  cwd: string;
  /** When it was created. */
  createdAt: Date;
  /** When it last ran code. */
  lastUsed: Date;
  /** `ipython`, `stdlib` or `node`. */
  mode?: string;
}

/** One rich output of a cell (the SDK's `Result`). Images are base64. */
export interface Result {
  /** text/plain representation. */
  text?: string;
  /** text/html. */
  html?: string;
  /** image/png, base64. */
  png?: string;
  /** image/jpeg, base64. */
  jpeg?: string;
  /** image/svg+xml. */
  svg?: string;
  /** text/latex. */
  latex?: string;
  /** text/markdown. */
  markdown?: string;
  /** application/javascript. */
  javascript?: string;
  /** application/json, as a value. */
  json?: unknown;
  /** The SDK's ChartData `{type, title?, data, layout?, config?, library}`: for a matplotlib figure
   * (Python), a Plotly or a Vega-Lite bundle (docs/protocol.md §3.7); absent otherwise. */
  chart?: unknown;
  /** Other data of the bundle. */
  data?: unknown;
  /** MIME types of the bundle. */
  formats?: string[];
  /** The cell's value (as opposed to a `display()` output). */
  isMainResult?: boolean;
  [key: string]: unknown;
}

/** An exception raised by the code. */
export interface ExecutionError {
  /** Exception class name (`ValueError`, `TypeError`, …). */
  name: string;
  /** The exception's message. */
  value: string;
  /** Alias of `value`. */
  message: string;
  /** Traceback lines. */
  traceback: string[];
}

/** Result of `runCode()`. A raised exception is in `error`, not thrown. */
export interface Execution {
  /** The code that ran. */
  code: string;
  /** The context it ran in. */
  contextId?: string;
  /** The context's language. */
  language?: string;
  /** Runs of the context so far. */
  executionCount?: number;
  /** Rich outputs: the cell's value and `display()`ed data. */
  results: Result[];
  /** Printed output, in chunks. */
  logs: { stdout: string[]; stderr: string[] };
  /** The exception raised by the code, if any. */
  error?: ExecutionError;
  /** The cell was interrupted at its timeout. */
  timedOut?: boolean;
  /** ms. */
  duration?: number;
  /** Printed output beyond the cap (16 MiB per stream) was dropped. */
  stdoutTruncated?: boolean;
  /** Standard error beyond the cap was dropped. */
  stderrTruncated?: boolean;
  /** Bytes the cell printed, kept or not. */
  stdoutBytes?: number;
  /** Bytes of standard error the cell printed, kept or not. */
  stderrBytes?: number;
  /** Results beyond the cap were left out (stand-ins keep the start of their text). */
  resultsTruncated?: boolean;
}

/** Options of `runCode()` / `runCodeStream()`. */
export interface RunCodeOptions {
  /** The context (object or ID). Default: the language's default context. */
  context?: CodeContext | string;
  /** Language of the default context to use (when `context` is not given). */
  language?: CodeLanguage | 'python3' | 'js' | 'node' | 'ts';
  /** Interrupt the cell after this many ms (default 60 000). */
  timeout?: number;
  /** Accepted for Cloudflare compatibility; set variables with `createCodeContext({envVars})`. */
  envVars?: Record<string, string>;
  /** Aborts the request. */
  signal?: AbortSignal;
  /** Called with printed output as it comes. */
  onStdout?: (output: { text: string; timestamp?: number }) => void;
  /** Called with stderr output as it comes. */
  onStderr?: (output: { text: string; timestamp?: number }) => void;
  /** Called with each rich result. */
  onResult?: (result: Result) => void | Promise<void>;
  /** Called with the exception raised by the code. */
  onError?: (error: ExecutionError) => void;
}

/** Events of `runCodeStream()`. */
export type CodeEvent =
  | (StreamEventBase & { type: 'start'; contextId?: string })
  | (StreamEventBase & { type: 'stdout' | 'stderr'; text: string })
  | (StreamEventBase & { type: 'result'; result: Result })
  | (StreamEventBase & { type: 'error'; name: string; value: string; traceback: string[] })
  | (StreamEventBase & { type: 'execution_complete'; executionCount: number; status?: string; timedOut?: boolean; duration?: number })
  | GapEvent;

// ---------------------------------------------------------------------------
// Terminal

/** Options of `terminal()`. */
export interface TerminalOptions {
  /** Columns (default 80). */
  cols?: number;
  /** Rows (default 24). */
  rows?: number;
  /** Shell to start (default `bash`). */
  shell?: string;
  /** Give up connecting after this many ms (default 30 000). */
  timeoutMs?: number;
  /** Aborts the connection attempt. */
  signal?: AbortSignal;
}
