/**
 * Error classes of the SDK.
 *
 * Every failure the server reports arrives as a JSON body
 * `{code, message, context, httpStatus, operation}` (docs/http.md "Errors");
 * {@link createErrorFromResponse} turns it into an instance of the class
 * registered for its `code`, so callers can write
 * `err instanceof FileNotFoundError` exactly as with `@cloudflare/sandbox`.
 * Unknown codes become a plain {@link SandboxError}.
 *
 * @module
 */

/** The JSON error body the sbx HTTP API answers with (docs/http.md). */
export interface ErrorResponse {
  /** Machine-readable error code, e.g. `FILE_NOT_FOUND` (docs/protocol.md §4). */
  code: string;
  /** Human-readable message. */
  message: string;
  /** Extra fields specific to the error (`path`, `sandboxId`, `exitCode`, …). Always an object. */
  context?: Record<string, unknown>;
  /** The HTTP status the server answered with. */
  httpStatus?: number;
  /** The operation that failed, e.g. `file.read`. */
  operation?: string;
}

/**
 * Base class of every error the SDK throws for a server-side or transport
 * failure.
 *
 * @typeParam C - shape of {@link SandboxError.context}.
 */
export class SandboxError<C extends Record<string, unknown> = Record<string, unknown>> extends Error {
  /** Machine-readable error code (`FILE_NOT_FOUND`, `SESSION_TERMINATED`, …). */
  readonly code: string;
  /** HTTP status of the reply (0 when the error happened on the client side before any reply). */
  readonly httpStatus: number;
  /** Extra information from the server (e.g. `{path}` for file errors; `sandboxId` where known). */
  readonly context: C;
  /** The operation that failed (e.g. `exec`, `file.read`), when known. */
  readonly operation?: string;
  /** When the error was created on the client, ISO 8601. */
  readonly timestamp: string;

  /**
   * @param response - the server's error body (or one built by the SDK).
   * @param options - `cause`: the underlying error, if any.
   */
  constructor(response: ErrorResponse, options?: { cause?: unknown }) {
    super(response.message, options?.cause !== undefined ? { cause: options.cause } : undefined);
    this.name = new.target.name;
    this.code = response.code;
    this.httpStatus = response.httpStatus ?? 0;
    this.context = (response.context ?? {}) as C;
    this.operation = response.operation ?? (response.context?.operation as string | undefined);
    this.timestamp = new Date().toISOString();
  }

  /** A plain object with the error's fields (what `JSON.stringify` prints). */
  toJSON(): ErrorResponse & { name: string; timestamp: string } {
    return {
      name: this.name,
      code: this.code,
      message: this.message,
      httpStatus: this.httpStatus,
      context: this.context,
      operation: this.operation,
      timestamp: this.timestamp,
    };
  }
}

// ---------------------------------------------------------------------------
// Files

/** `FILE_NOT_FOUND` (404): the path does not exist. `context.path` names it. */
export class FileNotFoundError extends SandboxError<{ path?: string }> {}
/** `FILE_EXISTS` (409): the path already exists (e.g. `mkdir` without `recursive`). */
export class FileExistsError extends SandboxError<{ path?: string }> {}
/** `FILE_TOO_LARGE` (413): `readFile` of a file over 32 MiB; use `readFileStream`. */
export class FileTooLargeError extends SandboxError<{ path?: string }> {}
/** `IS_DIRECTORY`, `NOT_DIRECTORY`, `NO_SPACE`, `NAME_TOO_LONG`, `FILESYSTEM_ERROR`: other file-system failures. */
export class FileSystemError extends SandboxError<{ path?: string }> {}
/** `PERMISSION_DENIED` / `READ_ONLY` (403): the file may not be accessed (devices, procfs, a read-only mount). */
export class PermissionDeniedError extends SandboxError<{ path?: string }> {}

// ---------------------------------------------------------------------------
// Commands, sessions, processes, streams

/** `COMMAND_NOT_FOUND` (404). */
export class CommandNotFoundError extends SandboxError {}
/** `COMMAND_EXECUTION_ERROR` (500): the command could not be started (e.g. the pids limit is exhausted). */
export class CommandError extends SandboxError {}
/** `SESSION_ALREADY_EXISTS` (409): `createSession` with an ID in use. */
export class SessionAlreadyExistsError extends SandboxError {}
/** `SESSION_NOT_FOUND` (404): no session with that ID (sbx-specific). */
export class SessionNotFoundError extends SandboxError {}
/**
 * `SESSION_TERMINATED` (410): the command ended its session's shell (`exit 3`).
 * `context.exitCode`, `context.stdout` and `context.stderr` hold what it printed;
 * the next command in that session gets a fresh shell.
 */
export class SessionTerminatedError extends SandboxError<{
  sessionId?: string;
  exitCode?: number;
  stdout?: string;
  stderr?: string;
}> {}
/** `SESSION_DESTROYED` (410). */
export class SessionDestroyedError extends SandboxError {}
/** `PROCESS_NOT_FOUND` (404): no background process with that ID. */
export class ProcessNotFoundError extends SandboxError {}
/** `PROCESS_ERROR` (500). */
export class ProcessError extends SandboxError {}
/** `RESOURCE_BUSY` (409): e.g. `startProcess` with a `processId` already in use. */
export class ResourceBusyError extends SandboxError {}
/**
 * `PROCESS_READY_TIMEOUT` (408): `waitForLog` / `waitForPort` gave up after
 * their `timeout`.
 */
export class ProcessReadyTimeoutError extends SandboxError {}
/** `PROCESS_EXITED_BEFORE_READY` (500): the process ended before the awaited log line or port appeared. */
export class ProcessExitedBeforeReadyError extends SandboxError<{ exitCode?: number }> {}
/** `STREAM_NOT_FOUND` (404): the stream ended and was dropped, or its container stopped. */
export class StreamNotFoundError extends SandboxError {}
/** `WATCH_NOT_FOUND` (404). */
export class WatchNotFoundError extends SandboxError {}
/** `WATCH_START_ERROR` (500): the file watch could not be set up. */
export class WatchStartError extends SandboxError {}

// ---------------------------------------------------------------------------
// Ports and preview URLs

/** Base of the port errors. */
export class PortError extends SandboxError<{ port?: number }> {}
/** `PORT_ALREADY_EXPOSED` (409): a custom token is already used by another port. */
export class PortAlreadyExposedError extends PortError {}
/** `PORT_NOT_EXPOSED` (404). */
export class PortNotExposedError extends PortError {}
/** `INVALID_PORT_NUMBER` / `INVALID_PORT` (400): ports 1024–65535 only. */
export class InvalidPortError extends PortError {}
/** `PORT_IN_USE` (409). */
export class PortInUseError extends PortError {}
/** `SERVICE_NOT_RESPONDING` (502): nothing listens on the port yet. */
export class ServiceNotRespondingError extends PortError {}
/** `CUSTOM_DOMAIN_REQUIRED` (400). */
export class CustomDomainRequiredError extends PortError {}
/** `INVALID_TOKEN` (404): unknown sandbox, port or token behind a preview URL. */
export class InvalidTokenError extends PortError {}
/** `STALE_PREVIEW_URL` (410): the container the URL was issued for is gone; expose the port again. */
export class StalePreviewUrlError extends PortError {}

// ---------------------------------------------------------------------------
// Git

/** Base of the git errors (`GIT_*`). `context.repoUrl` and `context.exitCode` where known. */
export class GitError extends SandboxError<{ repoUrl?: string; exitCode?: number }> {}
/** `GIT_REPOSITORY_NOT_FOUND` (404). */
export class GitRepositoryNotFoundError extends GitError {}
/** `GIT_BRANCH_NOT_FOUND` (404). */
export class GitBranchNotFoundError extends GitError {}
/** `GIT_AUTH_FAILED` (401). */
export class GitAuthenticationError extends GitError {}
/** `GIT_NETWORK_ERROR` (502). */
export class GitNetworkError extends GitError {}
/** `GIT_CLONE_FAILED` (500). */
export class GitCloneError extends GitError {}
/** `GIT_CHECKOUT_FAILED` (500). */
export class GitCheckoutError extends GitError {}
/** `INVALID_GIT_URL` (400). */
export class InvalidGitUrlError extends GitError {}

// ---------------------------------------------------------------------------
// Code interpreter

/** `INTERPRETER_NOT_READY` (503). */
export class InterpreterNotReadyError extends SandboxError {}
/** `PYTHON_NOT_AVAILABLE` / `JAVASCRIPT_NOT_AVAILABLE` (501): the sandbox image has no such interpreter. */
export class InterpreterNotAvailableError extends SandboxError {}
/** `CONTEXT_NOT_FOUND` (404): no code context with that ID. */
export class ContextNotFoundError extends SandboxError {}
/** `CODE_EXECUTION_ERROR` (500): the interpreter failed (not an exception in the code: that is `Execution.error`). */
export class CodeExecutionError extends SandboxError {}

// ---------------------------------------------------------------------------
// Requests, sandboxes, the deployment

/** `VALIDATION_FAILED` (400): an argument is invalid (bad sandbox ID, missing field, a cwd that does not exist). */
export class ValidationFailedError extends SandboxError {}
/** `CONTAINER_UNAVAILABLE` (503): the container could not start or ended during the operation. */
export class ContainerUnavailableError extends SandboxError {}
/** `OPERATION_INTERRUPTED` (409): the sandbox was destroyed or the shard stopped during the operation. */
export class OperationInterruptedError extends SandboxError {}
/** `SANDBOX_NOT_FOUND` (404): an operation that does not create a sandbox named an unknown one. */
export class SandboxNotFoundError extends SandboxError {}
/** `SHARD_UNAVAILABLE` (503): the shard owning the sandbox cannot be reached (retried automatically first). */
export class ShardUnavailableError extends SandboxError {}
/**
 * `GATEWAY_UNAVAILABLE` (client side, `httpStatus` 0): the server could not be
 * reached, after the retries. `cause` holds the last network error.
 */
export class GatewayUnavailableError extends SandboxError {}
/** `REQUEST_TIMEOUT` (504, or client side): no reply within the deadline. */
export class RequestTimeoutError extends SandboxError {}
/** `REQUEST_TOO_LARGE` (413): the request body is over the server's limit (32 MiB by default). */
export class RequestTooLargeError extends SandboxError {}
/** `UNAUTHORIZED` (401): missing or wrong API key. */
export class UnauthorizedError extends SandboxError {}
/** `INTERNAL_ERROR` / `STORAGE_ERROR` (500): a server bug or a metadata write that failed. */
export class InternalError extends SandboxError {}
/** `IMAGE_NOT_FOUND` (404): no such image in the node's store (or no such path to import; docs/images.md). */
export class ImageNotFoundError extends SandboxError {}
/** `IMAGE_INVALID` (400): the image is corrupt, tampered with, unsafe, or has no /bin/sh. */
export class ImageInvalidError extends SandboxError {}
/** `TEMPLATE_BUILD_FAILED` (400): a step of `template.build` exited non-zero; the message quotes its output. */
export class TemplateBuildFailedError extends SandboxError {}
/** `BACKUP_NOT_FOUND` (404): no such backup in the node's store. */
export class BackupNotFoundError extends SandboxError {}
/** `BACKUP_EXPIRED` (410): the backup's ttl has passed. */
export class BackupExpiredError extends SandboxError {}
/** `BACKUP_TOO_LARGE` (413): the backup's archive exceeds the store's limit per backup. */
export class BackupTooLargeError extends SandboxError {}
/** `DISK_FULL` (507): a write, mkdir or backup restore ran out of the sandbox's disk (ENOSPC/EDQUOT inside); the message names its limit. */
export class DiskFullError extends FileSystemError {}
/** `SANDBOX_EXISTS` (409): `fork` into an ID that is a sandbox already. */
export class SandboxExistsError extends SandboxError {}
/** `FORK_CROSS_SHARD` (409): in a cluster, a fork's ID is owned by another shard than its source's (docs/persistence.md, "Fork"): choose another ID. */
export class ForkCrossShardError extends SandboxError {}
/** `QUOTA_EXCEEDED` (429): a quota of the caller's tenant is used up; `context.retryAfterMs` says when to try again. */
export class QuotaExceededError extends SandboxError {}
/** `BACKUP_STORE_UNAVAILABLE` (503): the deployment's S3 backup store did not answer by the call's deadline, or refused the request (the message says which); nothing was changed in the sandbox. */
export class BackupStoreUnavailableError extends SandboxError {}

type ErrorClass = new (response: ErrorResponse, options?: { cause?: unknown }) => SandboxError;

/** Error code → class. Codes not listed here produce a plain {@link SandboxError}. */
export const ERROR_CLASSES: Readonly<Record<string, ErrorClass>> = Object.freeze({
  FILE_NOT_FOUND: FileNotFoundError,
  FILE_EXISTS: FileExistsError,
  FILE_TOO_LARGE: FileTooLargeError,
  IS_DIRECTORY: FileSystemError,
  NOT_DIRECTORY: FileSystemError,
  NO_SPACE: FileSystemError,
  NAME_TOO_LONG: FileSystemError,
  TOO_MANY_FILES: FileSystemError,
  TOO_MANY_LINKS: FileSystemError,
  FILESYSTEM_ERROR: FileSystemError,
  PERMISSION_DENIED: PermissionDeniedError,
  READ_ONLY: PermissionDeniedError,
  COMMAND_NOT_FOUND: CommandNotFoundError,
  COMMAND_EXECUTION_ERROR: CommandError,
  SESSION_ALREADY_EXISTS: SessionAlreadyExistsError,
  SESSION_NOT_FOUND: SessionNotFoundError,
  SESSION_TERMINATED: SessionTerminatedError,
  SESSION_DESTROYED: SessionDestroyedError,
  PROCESS_NOT_FOUND: ProcessNotFoundError,
  PROCESS_ERROR: ProcessError,
  RESOURCE_BUSY: ResourceBusyError,
  PROCESS_READY_TIMEOUT: ProcessReadyTimeoutError,
  PROCESS_EXITED_BEFORE_READY: ProcessExitedBeforeReadyError,
  STREAM_NOT_FOUND: StreamNotFoundError,
  WATCH_NOT_FOUND: WatchNotFoundError,
  WATCH_START_ERROR: WatchStartError,
  PORT_ALREADY_EXPOSED: PortAlreadyExposedError,
  PORT_NOT_EXPOSED: PortNotExposedError,
  INVALID_PORT_NUMBER: InvalidPortError,
  INVALID_PORT: InvalidPortError,
  PORT_IN_USE: PortInUseError,
  SERVICE_NOT_RESPONDING: ServiceNotRespondingError,
  CUSTOM_DOMAIN_REQUIRED: CustomDomainRequiredError,
  INVALID_TOKEN: InvalidTokenError,
  STALE_PREVIEW_URL: StalePreviewUrlError,
  GIT_REPOSITORY_NOT_FOUND: GitRepositoryNotFoundError,
  GIT_BRANCH_NOT_FOUND: GitBranchNotFoundError,
  GIT_AUTH_FAILED: GitAuthenticationError,
  GIT_NETWORK_ERROR: GitNetworkError,
  GIT_CLONE_FAILED: GitCloneError,
  GIT_CHECKOUT_FAILED: GitCheckoutError,
  GIT_OPERATION_FAILED: GitError,
  INVALID_GIT_URL: InvalidGitUrlError,
  INTERPRETER_NOT_READY: InterpreterNotReadyError,
  PYTHON_NOT_AVAILABLE: InterpreterNotAvailableError,
  JAVASCRIPT_NOT_AVAILABLE: InterpreterNotAvailableError,
  CONTEXT_NOT_FOUND: ContextNotFoundError,
  CODE_EXECUTION_ERROR: CodeExecutionError,
  VALIDATION_FAILED: ValidationFailedError,
  CONTAINER_UNAVAILABLE: ContainerUnavailableError,
  OPERATION_INTERRUPTED: OperationInterruptedError,
  SANDBOX_NOT_FOUND: SandboxNotFoundError,
  SHARD_UNAVAILABLE: ShardUnavailableError,
  GATEWAY_UNAVAILABLE: GatewayUnavailableError,
  REQUEST_TIMEOUT: RequestTimeoutError,
  REQUEST_TOO_LARGE: RequestTooLargeError,
  UNAUTHORIZED: UnauthorizedError,
  INTERNAL_ERROR: InternalError,
  STORAGE_ERROR: InternalError,
  IMAGE_NOT_FOUND: ImageNotFoundError,
  IMAGE_INVALID: ImageInvalidError,
  TEMPLATE_BUILD_FAILED: TemplateBuildFailedError,
  BACKUP_NOT_FOUND: BackupNotFoundError,
  BACKUP_EXPIRED: BackupExpiredError,
  BACKUP_TOO_LARGE: BackupTooLargeError,
  DISK_FULL: DiskFullError,
  SANDBOX_EXISTS: SandboxExistsError,
  FORK_CROSS_SHARD: ForkCrossShardError,
  QUOTA_EXCEEDED: QuotaExceededError,
  BACKUP_STORE_UNAVAILABLE: BackupStoreUnavailableError,
});

/**
 * Build the error instance for an error body: the class registered for
 * `response.code` in {@link ERROR_CLASSES}, else {@link SandboxError}.
 *
 * @param response - the parsed error body.
 * @param httpStatus - the reply's HTTP status, used when the body has none.
 * @param options - `cause`: the underlying error, if any.
 */
export function createErrorFromResponse(
  response: ErrorResponse,
  httpStatus?: number,
  options?: { cause?: unknown },
): SandboxError {
  const Cls = ERROR_CLASSES[response.code] ?? SandboxError;
  return new Cls(
    { ...response, httpStatus: response.httpStatus ?? httpStatus ?? 0, context: response.context ?? {} },
    options,
  );
}
